/*
 * runtime.h - running a compiled training step: backends, the executor,
 * data, checkpoints, the training loop, reports. The public header of
 * runtime/. Sections are named after the .c file that defines them.
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <sys/types.h>

#include "ir.h"
#include "passes.h"

/* ---- exec.c: a compiled step on a backend -------------------------------
 * Host-side data is always in the tensor's own dtype (f32 as float, i32 as
 * int32_t, bf16 as uint16_t bit patterns, u8 as uint8_t). */
typedef struct Exec Exec;
struct CgPlan; /* codegen.h */

typedef struct RtComm RtComm; /* comm.c */

/* The ranks as a backend sees them (BackendExt.comm_setup). */
typedef struct {
    int rank, size, local_rank;
    /* Copies n bytes at buf from rank 0 to every rank (blocking); NULL when
     * size is 1. */
    bool (*bcast)(void *arg, void *buf, size_t n);
    void *arg;
    /* comm_timeout in seconds (0: none, as with one rank) */
    double timeout;
    /* A device collective has not finished within timeout: names the lost
     * rank (pings over MPI, as comm.c does for its own collectives) and stops
     * every rank; never returns. NULL when size is 1. */
    void (*lost)(void *arg, const char *what);
} RtCommGroup;

/* One collective: a gradient bucket's all-reduce or a host one. */
typedef struct {
    int bucket;        /* -1: a host collective */
    int64_t bytes;
    double start, end; /* CLOCK_MONOTONIC seconds */
} RtCommEvent;

typedef struct {
    const char *device;    /* "cpu" (default), "cuda", "auto" */
    int threads;           /* 0: one per core */
    bool profile;          /* time every plan step */
    const char *cache_dir; /* compiled-kernel cache; NULL: $KILN_CACHE_DIR or ~/.cache/kiln */
    bool verbose;
    /* cuda only (ignored on the CPU) */
    const char *precision; /* "f32" (NULL) or "bf16": bf16 activations and GEMMs */
    bool tf32;             /* f32 GEMMs on TF32 tensor cores */
    bool cuda_graph;       /* capture the step into a CUDA graph, replay it */
    RtComm *comm;          /* the ranks: runs allreduce steps (unless the backend runs
                              them on the device); NULL: one rank */
} ExecOpts;

/* Compiles the final graph (after every pass) for the device. */
Exec *rt_exec_create(const Graph *g, const ExecOpts *o, Diag *d);
void rt_exec_destroy(Exec *e);
void rt_exec_write(Exec *e, int tensor, const void *src);
void rt_exec_read(Exec *e, int tensor, void *dst);
/* One step: every op, then every update (param/state <- new value). */
bool rt_exec_run(Exec *e, uint64_t seed, int64_t step, Diag *d);
int64_t rt_exec_arena_bytes(const Exec *e);
/* Writes every kernel of g's CPU plan into DIR/kernels/NAME.c (and, where
 * the CUDA printer exists, NAME.cu); g is final (after every pass). */
bool rt_dump_kernels(const Graph *g, const char *dir, Diag *d);
/* The compiled plan (steps, kernels, memory plan); owned by the Exec. */
const struct CgPlan *rt_exec_plan(const Exec *e);
/* The backend's name: "cpu", "cuda". */
const char *rt_exec_device(const Exec *e);

/* Profile (ExecOpts.profile): time per plan step accumulated over runs,
 * one row per kernel name (kernels shared by several ops aggregate), per
 * GEMM op and per copy kind. flops and bytes are the IR's counts
 * (ir_op_flops/ir_op_bytes) summed over calls. Rows are sorted by total
 * time, largest first; they belong to the Exec. */
typedef struct {
    const char *name;
    const char *kind;   /* "kernel", "gemm", "copy" */
    int64_t calls;
    double seconds;
    double flops, bytes;
} RtProfRow;
int rt_exec_profile(Exec *e, const RtProfRow **rows);
void rt_exec_profile_reset(Exec *e);
/* Per plan step of the last run (ExecOpts.profile): start and end in seconds
 * since that run began; n = number of plan steps. */
typedef struct {
    const char *name;
    const char *kind;
    int op;             /* IR op index; -1 for update copies */
    double start, end;
} RtTraceEvent;
int rt_exec_trace(const Exec *e, const RtTraceEvent **ev);
/* Seconds the device spent on the last run, from events recorded around it
 * on the device (BackendExt.run_seconds); < 0 where the backend does not
 * measure (the CPU: time it on the host). Waits for the run to end. */
double rt_exec_device_seconds(Exec *e);

/* A backend: the executor calls only these (it never asks which backend it
 * has). create prepares a plan (compiles its kernels, allocates exactly
 * plan->arena_bytes); offsets are arena byte offsets. */
typedef struct BackendCtx BackendCtx;
typedef struct {
    const char *name;
    BackendCtx *(*create)(const struct CgPlan *p, const ExecOpts *o, Diag *d);
    void (*destroy)(BackendCtx *c);
    void (*write)(BackendCtx *c, int64_t off, const void *src, int64_t bytes);
    void (*read)(BackendCtx *c, int64_t off, void *dst, int64_t bytes);
    /* runs plan step s */
    bool (*run_step)(BackendCtx *c, int s, uint64_t seed, int64_t step, Diag *d);
    void (*sync)(BackendCtx *c); /* waits for queued work (profiling) */
    /* optional extensions (NULL: none, as on the CPU) */
    const struct BackendExt *ext;
} Backend;

/* A backend's optional extensions; each hook may be NULL. */
typedef struct BackendExt {
    /* Collectives on the device. When the plan has allreduce steps the
     * executor calls comm_setup once (collective over the ranks); on success
     * it hands every allreduce_start/allreduce_wait plan step to these hooks
     * instead of its RtComm (the CPU's communication thread). A start queues
     * the bucket's mean over ranks, in place, after the device work before
     * it; a wait puts the device work after it behind the bucket and never
     * blocks the host. */
    bool (*comm_setup)(BackendCtx *c, const RtCommGroup *g, Diag *d);
    bool (*allreduce_start)(BackendCtx *c, int s, Diag *d);
    bool (*allreduce_wait)(BackendCtx *c, int s, Diag *d);
    /* The last run's bucket all-reduces not collected yet (at most max),
     * timed on the device and placed on the CLOCK_MONOTONIC clock from the
     * host time the run began, and the time the device's compute waited for
     * them (*exposed_s); waits for the run to end. */
    int (*comm_events)(BackendCtx *c, RtCommEvent *ev, int max, double *exposed_s);
    /* Seconds the device spent on the last run (events around it); waits
     * for the run to end; < 0 when unknown. */
    double (*run_seconds)(BackendCtx *c);
    /* With ExecOpts.profile: start[s] and end[s] of every plan step of the
     * last run, seconds since the run began, from device events recorded
     * after each step (no synchronisation per step); waits for the run to
     * end. False: not measured (the executor then times on the host). */
    bool (*step_times)(BackendCtx *c, double *start, double *end);
    /* Bytes of the backend's own arena when it differs from the plan's
     * (CUDA with bf16 activations re-plans it with 2-byte buffers). */
    int64_t (*arena_bytes)(const BackendCtx *c);
} BackendExt;

/* ---- comm.c: ranks and collectives (MPI) ---------------------------------
 * One RtComm per process when it runs as one of several ranks (started by
 * mpirun, or by `kiln train --nproc N`, which runs mpirun). A communication
 * thread runs every collective, in the order they were started: buckets of
 * f32 gradients (mean over ranks, in place, read and written through the
 * backend) and host collectives. A collective that does not finish within
 * the timeout stops this rank, and through MPI_Abort every rank, with a
 * message naming the lost rank (the one that no longer answers, or the one
 * that never joined); the functions below therefore never fail. On a GPU
 * the buckets run on the device instead (BackendExt): RtComm then only
 * broadcasts the NCCL id and collects the device's statistics. */

/* *c = NULL (one rank, no MPI) unless this process was started by an MPI
 * launcher (OMPI_COMM_WORLD_SIZE in the environment); false with d set when
 * MPI cannot start. timeout_s > 0. */
bool rt_comm_open(double timeout_s, RtComm **c, Diag *d);
void rt_comm_close(RtComm *c); /* NULL: nothing */
int rt_comm_rank(const RtComm *c);       /* 0 for NULL */
int rt_comm_size(const RtComm *c);       /* 1 for NULL */
int rt_comm_local_size(const RtComm *c); /* ranks on this machine; 1 for NULL */
/* Plan step s (CG_STEP_ALLREDUCE_START) of p: queues its bucket. */
void rt_comm_start(RtComm *c, const struct CgPlan *p, int s, const Backend *be,
                   BackendCtx *ctx);
/* Blocks until the bucket's last start has finished (at once if done). */
void rt_comm_wait(RtComm *c, int bucket);
/* Mean over ranks of n host doubles, in place (blocking). */
void rt_comm_mean(RtComm *c, double *v, int n);
/* Per step: communication time (the comm thread's busy time), exposed time
 * (compute blocked in waits), and the events since the last reset. */
typedef struct {
    double comm_s, exposed_s;
    int nev;
    const RtCommEvent *ev;
} RtCommStats;
void rt_comm_stats(RtComm *c, RtCommStats *st); /* st->ev valid until the next call */
void rt_comm_stats_reset(RtComm *c);
/* Copies n bytes at buf from rank 0 to every rank (blocking; through the
 * communication thread, in order with the other collectives). */
void rt_comm_bcast(RtComm *c, void *buf, size_t n);
/* Collectives run by the device (BackendExt.comm_setup): rt_comm_stats
 * first calls pull(arg, c), which adds the device's finished collectives
 * with rt_comm_add_events. pull NULL removes the source registered with
 * arg (if it is still the current one). */
void rt_comm_set_source(RtComm *c, void (*pull)(void *arg, RtComm *c), void *arg);
void rt_comm_add_events(RtComm *c, const RtCommEvent *ev, int n, double exposed_s);
int rt_comm_local_rank(const RtComm *c); /* rank on this machine; 0 for NULL */
double rt_comm_timeout(const RtComm *c);  /* seconds; 0 for NULL */
/* A collective run outside RtComm (on the device) did not finish within the
 * timeout: finds whom we lost, says so and stops every rank (MPI_Abort), as
 * for RtComm's own collectives; `what` names the collective. */
_Noreturn void rt_comm_lost(RtComm *c, const char *what);

/* ---- launch.c: starting local ranks ---------------------------------------
 * `kiln train --nproc N ...`: runs mpirun with N copies of this binary and the
 * same arguments (without --nproc), waits, and returns the exit code. Each
 * rank records how it ended in a status directory; a rank that vanished
 * (killed or crashed) is named in the message. */
int rt_launch(int nproc, int argc, char **argv);
/* In a rank started by rt_launch: records "running" (at start), how it
 * ended, or the rank it lost; no-op otherwise. */
void rt_rank_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* SIGINT and SIGTERM then only record the signal, which rt_stop_signal
 * returns (0: none yet): the training loop stops after its current step
 * and the compile driver after its compile, with nothing half-written
 * (exit 128 + the signal). rt_launch forwards both to its ranks. */
void rt_stop_on_signals(void);
int rt_stop_signal(void);
const char *rt_signal_name(int sig); /* "SIGINT", ... */

/* ---- backend_cpu.c: generated C via the host compiler, GEMMs via OpenBLAS */
extern const Backend rt_backend_cpu;

/* ---- device.c: choosing a backend; the CUDA module ----------------------
 * The CUDA backend is a separate shared module (libkiln_cuda.so, built only
 * where the CUDA toolkit is found) loaded with dlopen on first use, so kiln
 * never links a CUDA library and starts on machines without a GPU driver.
 * The module is looked for at $KILN_CUDA_MODULE, then beside the running
 * executable, then beside $KILN_BIN. */
struct CgCudaProgram; /* codegen.h */

/* What the module needs from kiln (it links nothing of kilncore). */
#define RT_CUDA_ABI 3 /* 2: Backend.ext; 3: BackendExt.arena_bytes, CgCudaProgram.mem */
typedef struct {
    int abi; /* RT_CUDA_ABI */
    struct CgCudaProgram *(*program)(const struct CgPlan *p, bool bf16);
    void (*program_free)(struct CgCudaProgram *q);
} RtCudaHost;

/* An NVRTC compilation: the cubin and the program log (ptxas's -v report
 * included); cached on disk by a hash of source, options, NVRTC version and
 * architecture. */
typedef struct {
    void *cubin;
    size_t size;
    char *log;    /* NVRTC's program log, "" when empty */
    bool cached;  /* read from the cache */
    int nvrtc_major, nvrtc_minor;
} RtCudaBinary;

/* "cpu" (NULL), "cuda" or "auto" (the GPU when the module loads and a device
 * exists, else the CPU). NULL with d set ("--device cuda: ...") when the
 * device cannot be used. */
const Backend *rt_backend_select(const char *device, bool verbose, Diag *d);
/* The module's NVRTC path (no GPU needed): compiles src for arch ("sm_90").
 * On a compile error prints the numbered source and the log to stderr and
 * returns false with d set. Free b with rt_cuda_binary_free. */
bool rt_cuda_compile(const char *src, const char *arch, const char *cache_dir, bool verbose,
                     RtCudaBinary *b, Diag *d);
void rt_cuda_binary_free(RtCudaBinary *b);

/* ---- cc.c: the host C compiler and its on-disk cache ----------------------
 * Shared objects are cached by a hash of source, compiler version and flags
 * in cache_dir (NULL: $KILN_CACHE_DIR, else ~/.cache/kiln). With
 * KILN_CC_INJECT_ERROR=1 an invalid line is appended to the source (tests).
 * On failure d holds the compiler's message and the numbered source around
 * the error. */
typedef struct {
    int compiles;       /* compiler invocations */
    int cache_hits;
    double compile_seconds;
} RtCcStats;
RtCcStats rt_cc_stats(void);
/* Runs cmd through the shell, its stdout and stderr into a malloc'd *out;
 * returns its exit status (128 + the signal when killed; -1 when it could
 * not start, *out then says why). */
int rt_run_capture(const char *cmd, char **out);
/* The kernel cache directory (malloc'd): cache_dir, else $KILN_CACHE_DIR,
 * else ~/.cache/kiln. */
char *rt_cache_path(const char *cache_dir);
/* Keeps dir's files named prefix* under KILN_CACHE_MAX (see cc.c). */
void rt_cache_prune(const char *dir, const char *prefix, const char *keep, bool verbose);
/* Returns the malloc'd path of the shared object, or NULL with d set. A
 * compile runs up to `jobs` compiler processes side by side, on parts of
 * the source (each with the prelude), and links them. */
char *rt_cc_compile(const char *source, const char *cache_dir, int jobs, bool verbose, Diag *d);

/* ---- data.c: training data sources ---------------------------------------
 * A source fills a model's data inputs by name: tokens i32[B,T], targets
 * i32[B,T] (tokens shifted by one), mask f32[B,T] (1 where the target counts);
 * blobs: x f32[B,D], y i32[B]. A batch is a pure function of (seed, split,
 * index): the train split's next index is the data position that
 * checkpoints save; evaluation reads validation batches 0..n-1 every time.
 *
 * addition (n digits; as models/addition.lua: vocabulary 0-9 digits,
 *   10 '+', 11 '=', 12 pad, 13 end): a+b= with a, b zero-padded to n digits,
 *   then the sum's n+1 digits reversed (least significant first), then end.
 *   Length 3n+4; tokens are its first T symbols, targets the next T (pad
 *   past the end), T >= 3n+3. mask = 1 exactly where the target is an answer
 *   digit or the end token (t in 2n+1..3n+2). Held-out problems: the (a,b)
 *   pairs whose hash (independent of the seed) falls below val_fraction.
 * text: bytes of any regular file (vocab 256); the last val_fraction of the
 *   file is validation; random windows of T+1 bytes.
 * tokens: llm.c .bin (256 x int32 header: magic 20240520, version 1, count;
 *   then uint16 tokens); split like text.
 * text and tokens files are mapped, not copied; rt_data_open refuses
 *   anything but a regular file, a split (train, and validation when
 *   val_fraction > 0) shorter than one window of T+1 symbols, and a symbol
 *   at or above vocab or rows. addition: each split must hold a problem and
 *   be drawn in under 10^6 tries per row (val_fraction in [1e-6, 1-1e-6]).
 * blobs: `classes` Gaussian clusters in `dim` dimensions, centres fixed by
 *   the seed; validation points come from their own random stream. */
typedef enum { DATA_TRAIN, DATA_VAL } DataSplit;

enum { ADD_PLUS = 10, ADD_EQ = 11, ADD_PAD = 12, ADD_END = 13, ADD_VOCAB = 14 };

typedef struct {
    const char *kind;    /* "addition", "text", "tokens", "blobs" */
    const char *path;    /* text, tokens */
    uint64_t seed;
    int64_t batch, seq;  /* B, T (blobs: seq unused) */
    int digits;          /* addition: 1..9 */
    double val_fraction; /* [0, 1); addition needs > 0 */
    int vocab;           /* text, tokens, addition: every symbol must be < vocab,
                            the model's classes (0: no check) */
    int64_t rows;        /* and < rows, the rows of the table the tokens index
                            (gather; 0: no check) */
    const char *rows_name; /* that table's name, for messages */
    int dim, classes;    /* blobs */
} DataCfg;

typedef struct {
    int64_t B, T, D;
    int32_t *tokens, *targets; /* [B,T] */
    float *mask;               /* [B,T] */
    float *x;                  /* blobs: [B,D] */
    int32_t *y;                /* blobs: [B] */
} DataBatch;

typedef struct DataSource DataSource;
/* NULL with d set ("PATH: what is wrong ...") on a bad config or file. */
DataSource *rt_data_open(const DataCfg *c, Diag *d);
void rt_data_close(DataSource *s);
/* Batch `index` of `split`; the buffers belong to the source and are
 * overwritten by the next call. */
const DataBatch *rt_data_batch(DataSource *s, DataSplit split, int64_t index);
bool rt_data_has_val(const DataSource *s);
/* addition: writes the 3n+4 symbols of a+b (see above) into seq. */
void rt_addition_encode(int digits, int64_t a, int64_t b, int32_t *seq);
bool rt_addition_is_val(int digits, int64_t a, int64_t b, double val_fraction);

/* ---- safetensors.c: reading and writing safetensors files ---------------
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {"k": "v"}}, then the data (offsets relative to it). */
typedef struct {
    char *name;
    DType dtype;
    int rank;
    int64_t dim[IR_MAX_RANK];
    void *data;    /* numel * dtype_size bytes */
    size_t nbytes;
} StTensor;

typedef struct {
    StTensor *t;
    int n;
    char **key, **val; /* __metadata__ */
    int nmeta;
} StFile;

/* Reads and validates the whole file (a regular file; tensor names,
 * __metadata__ and its keys each once; shapes, offsets and spans checked
 * before anything is allocated for them); on any defect returns false with
 * "PATH: what is wrong (expected ..., got ...)" in d and *f empty. */
bool rt_st_read(const char *path, StFile *f, Diag *d);
void rt_st_free(StFile *f);
const StTensor *rt_st_find(const StFile *f, const char *name);
const char *rt_st_meta(const StFile *f, const char *key); /* NULL if absent */
/* Writes atomically (temp file beside path, fsync, rename); on failure
 * nothing is left behind. meta: nmeta key/value pairs (may be 0). */
bool rt_st_write(const char *path, const StTensor *t, int n, const char *const *key,
                 const char *const *val, int nmeta, Diag *d);
const char *rt_st_dtype_name(DType t); /* "F32", ... */
/* "a directory", "a FIFO", ...: what a path that is not a regular file is,
 * for messages (data files and safetensors files are regular files only) */
const char *rt_file_kind(mode_t m);
/* Writes the n chunks to path atomically (temp file PATH.tmp.PID.XXXXXX in
 * the same directory, fsync, rename); on failure "PATH: cannot write:
 * reason" and no file. */
bool rt_write_atomic(const char *path, const void *const *chunk, const size_t *len, int n,
                     Diag *d);
/* Removes the temp files that rt_write_atomic left (killed mid-write) for
 * the final path HEAD (tail NULL) or HEAD<digits>TAIL, but only those whose
 * writer process is gone (kill(pid, 0) fails with ESRCH); returns how many. */
int rt_tmp_sweep(const char *head, const char *tail);

/* ---- checkpoint.c: checkpoints and weights --------------------------------
 * vals[id] is host data (the tensor's dtype) for every param and state
 * tensor id of g. A checkpoint holds every param and state tensor plus
 * metadata; a weights file holds params only. */
typedef struct {
    int64_t step;     /* steps completed */
    int64_t data_pos; /* next train batch index */
    uint64_t seed;
} CkptMeta;

/* Hash of the params' names, dtypes and shapes (order-independent). */
uint64_t rt_model_fingerprint(const Graph *g);
bool rt_ckpt_save(const char *path, const Graph *g, void *const *vals, const CkptMeta *m,
                  Diag *d);
/* Restores every param and state tensor; refuses a checkpoint of another
 * model (fingerprint) or with a missing/mis-shaped tensor. Gradient
 * accumulators ("accum.*" state) are neither saved nor required: loading
 * zeroes them, so a checkpoint resumes with any grad_accum. */
bool rt_ckpt_load(const char *path, const Graph *g, void **vals, CkptMeta *m, Diag *d);
bool rt_weights_save(const char *path, const Graph *g, void *const *vals, Diag *d);
/* Loads every param of g by name from a weights or checkpoint file. Loading
 * refuses a NaN or Inf in any tensor it restores, and saving refuses to
 * write one (nothing written): "PATH: tensor "NAME" holds NaN at index K". */
bool rt_weights_load(const char *path, const Graph *g, void **vals, Diag *d);
/* Removes the temp files an interrupted write of a checkpoint of prefix
 * (PREFIX.stepN.safetensors) or of the weights file `weights` left behind,
 * when their writer is gone (either may be NULL); returns how many. */
int rt_ckpt_sweep_tmp(const char *prefix, const char *weights);

/* ---- report.c: Chrome trace and per-kernel profile table ------------------
 * The trace collects complete events ("ph":"X", microseconds) in memory and
 * writes {"traceEvents": [...]} atomically at close; chrome://tracing and
 * Perfetto open it. */
typedef struct Trace Trace;
Trace *rt_trace_open(const char *path);
/* No-op when t is NULL. */
void rt_trace_event(Trace *t, const char *name, const char *cat, double ts_us, double dur_us,
                    int tid);
void rt_trace_thread_name(Trace *t, int tid, const char *name); /* tid 0..7 */
/* Writes the file (when `write`) and frees t (NULL: nothing to do). */
bool rt_trace_close(Trace *t, bool write, Diag *d);

typedef struct {
    const char *name;
    int64_t calls;
    double ms;           /* total over all calls */
    double flops, bytes; /* total over all calls, from the IR's counts (0: unknown) */
} ProfRow;
/* Sorts rows by time and prints: name, calls, total ms, % of total_ms,
 * achieved GFLOP/s and GB/s; past max_rows (> 0) the rest share one row. */
void rt_profile_print(FILE *f, ProfRow *rows, int n, double total_ms, int max_rows);

/* ---- train.c: the training loop -------------------------------------------
 * `kiln train` maps its flags 1:1 onto TrainOpts. The loop builds the
 * training graph (pass_pipeline) and an evaluation graph (the forward graph
 * after simplify and schedule; params copied in before each evaluation),
 * initialises params from their ParamInit with a stream seeded by the train
 * seed and the param's name, then each step: data -> inputs, "lr" from the
 * schedule, one step, loss. Checkpoints go to PREFIX.stepN.safetensors
 * (PREFIX without a trailing .safetensors) every checkpoint_every steps and
 * at the end. The same seed gives bit-identical losses; N steps, then
 * --resume and the rest, equal the whole run straight. */
typedef struct Model Model;
typedef struct TrainCfg TrainCfg;

typedef struct {
    float final_loss;  /* last training step's loss */
    double val_loss;   /* NaN when no validation split */
    double accuracy;   /* exact match on held-out data; NaN when n/a */
    double median_ms;  /* per step */
} TrainResult;

typedef struct {
    int64_t steps;            /* --steps: > 0 overrides train.steps (the total) */
    const char *device;       /* --device (NULL: cpu) */
    int threads;              /* --threads (0: one per core) */
    const char *resume;       /* --resume CKPT */
    const char *init_from;    /* --init-from W */
    const char *save_weights; /* --save-weights W: params at the end */
    const char *checkpoint;   /* --checkpoint PREFIX: overrides train.checkpoint */
    bool profile;             /* --profile */
    const char *trace;        /* --trace FILE */
    double peak_gflops;       /* --peak-gflops: MFU denominator; 0: "n/a" */
    int remat;                /* --remat: RematPolicy (REMAT_DEFAULT: auto with a budget) */
    bool verbose, quiet;      /* -v, -q */
    const char *cache_dir;    /* kernel cache (NULL: executor default) */
    TrainResult *result;      /* optional out */
    bool no_overlap;          /* --no-overlap: every allreduce starts after backward */
    bool no_fuse;             /* --no-fuse: every op its own kernel */
} TrainOpts;

/* Returns the process exit code: 0, or 1 after printing the error. */
int rt_train(Model *m, const TrainOpts *o);
/* Pass options from a model's training settings: the defaults, then the
 * optimizer's (beta1, beta2, eps, weight_decay, grad_clip) and the memory
 * budget. */
void rt_pass_opts(const TrainCfg *c, PassOpts *po);
/* Learning rate after `step` steps of `steps`: linear warmup over
 * c->warmup steps to c->lr, then cosine to c->min_lr at the last step. */
double rt_lr_at(const TrainCfg *c, int64_t step, int64_t steps);

/* ---- dist.c: data parallelism and gradient accumulation in the loop -------
 * The loop opens its data with the global batch (rt_dp_rows_factor x the
 * model's batch b); rank r, micro-batch k trains on rows [(r*K + k)*b, +b).
 * With one rank and grad_accum 1 every call is an identity or no-op. */
typedef struct RtDp RtDp;
/* Opens the ranks (rt_comm_open) from train{comm_timeout}, checks
 * grad_accum and bucket_mb; ranks other than 0 print nothing on stdout.
 * *dp is set even on failure (close it). */
bool rt_dp_open(const TrainCfg *c, RtDp **dp, Diag *d);
void rt_dp_close(RtDp *dp, int rc); /* records rc as the rank's status */
int rt_dp_rank(const RtDp *dp);
int rt_dp_size(const RtDp *dp);
int64_t rt_dp_rows_factor(const RtDp *dp); /* ranks x grad_accum */
/* Rank 0: path; rank r: path with ".rankR" before its extension. */
const char *rt_dp_trace_path(RtDp *dp, const char *path);
void rt_dp_pass_opts(const RtDp *dp, const TrainCfg *c, bool no_overlap, PassOpts *po);
/* The comm handle; threads default to the cores shared among local ranks. */
void rt_dp_exec_opts(const RtDp *dp, ExecOpts *eo);
/* Checks every gradient tg reduces is f32 (a message otherwise); with
 * grad_accum > 1 builds the micro-batch graph (pass_comm_micro) and its
 * executor. */
bool rt_dp_build(RtDp *dp, const Graph *model, const PassOpts *po, const ExecOpts *eo,
                 const Graph *tg, Diag *d);
/* Before a training step: runs micro-batches 0..K-2 (params copied in from
 * te), hands their summed gradients to te's accum.P, and feeds te this
 * rank's last micro-batch of the global batch. */
bool rt_dp_step(RtDp *dp, Exec *te, const Graph *tg, const DataBatch *global, uint64_t seed,
                int64_t step, Diag *d);
/* The step's loss: mean over micro-batches and ranks (last: te's loss).
 * The same collective agrees on a stop (rt_stop_signal on any rank). */
float rt_dp_loss(RtDp *dp, float last);
/* The signal that stops the run after this step, 0: none. One rank: its
 * rt_stop_signal; several: the one any rank had at the last rt_dp_loss,
 * so that every rank stops after the same step. */
int rt_dp_stop(const RtDp *dp);
/* After a step: records its communication and exposed time; with
 * trace_events, its collectives on the trace's tid 2 (times from t0). */
void rt_dp_after_step(RtDp *dp, Trace *trace, double t0, bool trace_events);
/* "comm: ..." line: median per step of communication, exposed time, overlap. */
void rt_dp_summary(const RtDp *dp, FILE *f);
/* Whether standard output is a terminal; a rank (whose output mpirun always
 * passes through a pseudo-terminal) asks the launcher's KILN_STDOUT_TTY. */
bool rt_stdout_tty(void);

#endif
