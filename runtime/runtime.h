/*
 * runtime.h - running a compiled training step: the executor, the backend
 * table every backend fills, choosing a device, and the files and signals
 * every part of the runtime shares. The contract of runtime/; each job has
 * its own folder and header:
 *
 *   runtime/        exec.c (executor), device.c (backend choice, the CUDA
 *                   module's loader), files.c (atomic writes, kernel cache)
 *   runtime/cpu/    cpu.h: the CPU backend, its thread pool, the C compiler
 *   runtime/cuda/   cuda_module.h: libkiln_cuda.so (driver, NVRTC,
 *                   cuBLASLt, NCCL), loaded by device.c; links no kilncore
 *   runtime/dist/   dist.h: ranks (MPI), the --nproc launcher, data
 *                   parallelism in the training loop
 *   runtime/train/  train.h: the training loop, data, checkpoints,
 *                   safetensors, reports, and the training config
 *   runtime/cli/    cli.h: `kiln` (main) and the compile summary printers
 *
 * Sections are named after the .c file that defines them.
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

typedef struct RtComm RtComm; /* dist/mpi.c */

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
     * rank (pings over MPI, as dist/mpi.c does for its own collectives) and stops
     * every rank; never returns. NULL when size is 1. */
    void (*lost)(void *arg, const char *what);
} RtCommGroup;

/* A GPU as its driver describes it. */
typedef struct {
    char name[128];        /* "NVIDIA H200" */
    int cc_major, cc_minor;
    int sms;
    double clock_hz;       /* the SMs' peak clock */
} RtDeviceInfo;

/* One collective: a gradient bucket's all-reduce (zero=1: reduce-scatter
 * or all-gather) or a host one. */
typedef struct {
    int bucket;        /* -1: a host collective */
    int64_t bytes;
    double start, end; /* CLOCK_MONOTONIC seconds */
    int coll;          /* CgColl of a bucket: 0 all-reduce, 1 reduce-scatter, 2 all-gather */
    double exposed;    /* device collectives (BackendExt.comm_events): seconds the compute
                          stream stood at the bucket's wait; 0 from RtComm's own */
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
    RtComm *tp_comm;       /* its TP group: runs the tp_* steps (tensor parallelism);
                              NULL: none (a plan with tp_* steps then does not run) */
    bool tp_no_overlap;    /* wait for each TP collective at the step after its start,
                              not at its first reader (train key tp_overlap=false: the
                              collectives' whole time exposed, for measuring it) */
    /* Run inside this executor's arena instead of allocating one: in its
     * temp region (past its persistent one: memplan.h), which holds nothing
     * between its runs. For an executor run between the other's runs (the
     * evaluation step beside the training step): each run of the new one
     * first settles the other's communication still in flight (zero=1's
     * deferred all-gathers), its buffers (inputs and params too) are
     * overwritten by the other's next run, so write them before each use.
     * Host backends only (the CPU), both executors on the same one, and
     * only when the plan fits the region; else (the CUDA module) the new
     * executor allocates its own arena (rt_exec_arena_shared says which).
     * NULL: its own arena. */
    struct Exec *arena_of;
    /* Set by the executor for Backend.create, never by a caller: the host
     * memory the backend runs in (plan->arena_bytes, not owned); NULL: the
     * backend allocates its arena. */
    void *host_arena;
} ExecOpts;

/* Compiles the final graph (after every pass) for the device. */
Exec *rt_exec_create(const Graph *g, const ExecOpts *o, Diag *d);
void rt_exec_destroy(Exec *e);
void rt_exec_write(Exec *e, int tensor, const void *src);
void rt_exec_read(Exec *e, int tensor, void *dst);
/* zero=1 on several ranks: the all-gather bucket whose gather, started by
 * the last run, may still be writing `tensor` (a param) and that the next
 * run waits for before its first reader (runtime/exec.c, setup_defer); -1
 * for none. rt_exec_read and rt_exec_write wait for it themselves. */
int rt_exec_gather_bucket(const Exec *e, int tensor);
/* Calls fn(arg, id) in every run, right before the first plan step that
 * reads one of tensors[0..n) (never, when no step reads them). The
 * callback may call rt_exec_write on e for those tensors. */
void rt_exec_before_read(Exec *e, const int *tensors, int n, void (*fn)(void *arg, int id),
                         void *arg, int id);
/* ---- pieces.c: zero=1's shard update in pieces (host backends) ---- */
/* Rewrites p's steps for rank `rank` of nranks: per early all-gather
 * bucket (read by the forward up to its first GEMM) the shard update's
 * part for it and its start, then the rest of the update and the other
 * starts. Returns the new index of the last early start (the executor
 * releases the starts up to it to the communication thread at once), or
 * -1 when p is left as it was (one rank, no flat update right before the
 * gathers, or KILN_ZERO_ONE_PIECE=1 in the environment). */
int rt_pieces_plan(struct CgPlan *p, int rank, int nranks);

/* Pipeline stages (runtime/dist/pp.c) on a device backend: joins the
 * process's transfers over c's pipeline group (BackendExt.pp_setup;
 * collective over the group the first time): 1; 0 where the backend has
 * none (the CPU: MPI on the host instead) or pp < 2; -1 with d set when
 * they fail. Then rt_exec_pp_xfer queues a send of
 * `tensor` (its bytes in e's arena) to stage peer, or a receive into it
 * from peer, ordered with e's device work before and after it
 * (BackendExt.pp_xfer); tensor = -BYTES receives that many bytes into the
 * backend's scratch (a tensor no program reads). */
int rt_exec_pp_setup(Exec *e, RtComm *c, Diag *d);
bool rt_exec_pp_xfer(Exec *e, bool send, int peer, int tensor, Diag *d);

/* One step: every op, then every update (param/state <- new value). */
bool rt_exec_run(Exec *e, uint64_t seed, int64_t step, Diag *d);
int64_t rt_exec_arena_bytes(const Exec *e);
/* Whether e runs in another executor's arena (ExecOpts.arena_of): then it
 * allocated none of its own. */
bool rt_exec_arena_shared(const Exec *e);
/* A host backend's (the CPU's) own bytes of `tensor` in e's arena, valid
 * for e's life, so a caller keeps no copy of them; NULL on a device backend
 * or for an executor in another's arena. Read or write them only between
 * runs, after rt_exec_settle (which rt_exec_read and rt_exec_write do
 * themselves). */
void *rt_exec_host_view(Exec *e, int tensor);
/* Waits for everything e's last run left in flight (zero=1's deferred
 * all-gathers and their sends). */
void rt_exec_settle(Exec *e);
/* Writes every kernel of g's CPU plan into DIR/kernels/NAME.c (and, where
 * the CUDA printer exists, NAME.cu); g is final (after every pass). */
bool rt_dump_kernels(const Graph *g, const char *dir, Diag *d);
/* The compiled plan (steps, kernels, memory plan); owned by the Exec. */
const struct CgPlan *rt_exec_plan(const Exec *e);
/* The backend's name: "cpu", "cuda". */
const char *rt_exec_device(const Exec *e);
/* The GPU e runs on; false on the CPU or when the backend cannot say. */
bool rt_exec_device_info(const Exec *e, RtDeviceInfo *out);

/* Profile (ExecOpts.profile): time per plan step accumulated over runs,
 * one row per kernel name (kernels shared by several ops aggregate), per
 * GEMM op and per copy kind. flops and bytes are the IR's counts
 * (ir_op_flops/ir_op_bytes) summed over calls. Rows are sorted by total
 * time, largest first; they belong to the Exec. */
typedef struct {
    const char *name;
    const char *kind;   /* "kernel", "gemm", "copy" (the training loop's
                           report adds its phases: "phase") */
    int64_t calls;
    double seconds;
    double flops, bytes;
    int step;           /* the first plan step behind the row (-1: a phase) */
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
    /* True for a backend that runs on the host (the CPU): its arena is host
     * memory, so the executor checks the plan's arena against the machine's
     * memory before create; and it compiles and caches its kernels itself
     * (runtime/cpu/cc.c prunes that cache). False (the default of a table
     * that leaves it out: a device backend such as the CUDA module): the
     * device reports its own allocation failure, and the executor prunes
     * the device code cache (CACHE/cuda, written by the module, which links
     * nothing of kilncore) after create. */
    bool host;
    /* Optional, for a host backend: the address of arena offset off, so
     * that the executor's own copies (shard_pack) go from arena to arena
     * instead of through a staging buffer. NULL: read and write only. */
    void *(*host_ptr)(BackendCtx *c, int64_t off);
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
     * (CUDA with bf16 activations re-plans it with 2-byte buffers; its
     * bf16 weight copies, CgCudaProgram.cast_bytes, count too). */
    int64_t (*arena_bytes)(const BackendCtx *c);
    /* The device the context runs on (MFU's peak); false: unknown. */
    bool (*device_info)(BackendCtx *c, RtDeviceInfo *out);
    /* Tensor parallelism on the device. When the plan has CG_STEP_TP steps
     * the executor calls tp_setup once with the TP group (g: rank and size
     * in the group, bcast over it; collective over the group); on success
     * it hands every CG_STEP_TP step to tp_run, which queues the step's
     * collective (f32 sum over the group: all-reduce, all-gather of
     * [outer][chunk] into [outer][rank][chunk], reduce-scatter of
     * [outer][rank][chunk] into [outer][chunk], outer the product of the
     * dims before the op's axis) after the device work before it, never
     * blocking the host. Without tp_wait its result is ready for the
     * device work after it. With tp_wait the device work after it does
     * not wait for it: the executor calls tp_wait(c, s) before the first
     * later plan step that reads the result's storage or writes bytes of
     * the operand's (unless tp_operand_copy copies it; runtime/exec.c,
     * setup_tp_waits), which puts the
     * device work after that call behind the collective of TP step s;
     * the backend waits for the collectives of a run that no such call
     * named before the run's last step ends.
     * tp_events: the last run's TP collectives not collected yet (at most
     * max; bucket -1, coll 0 all-reduce, 1 reduce-scatter, 2 all-gather),
     * timed on the device and placed as comm_events places buckets, with
     * the time the device's compute waited for each (exposed); waits for
     * them. */
    bool (*tp_setup)(BackendCtx *c, const RtCommGroup *g, Diag *d);
    bool (*tp_run)(BackendCtx *c, int s, Diag *d);
    int (*tp_events)(BackendCtx *c, RtCommEvent *ev, int max);
    bool (*tp_wait)(BackendCtx *c, int s, Diag *d);
    /* Called once per TP step s whose operand's bytes a plan step before
     * `until` (the step before which tp_wait(c, s) comes; the step count:
     * at the end of the run) overwrites, after tp_setup: from then on the
     * collective of s reads a copy of its operand that the backend makes
     * at step s, after the device work before it, and keeps until that
     * wait. False with d set when it cannot (out of memory). NULL: the
     * executor puts tp_wait(c, s) before that overwriting step instead. */
    bool (*tp_operand_copy)(BackendCtx *c, int s, int until, Diag *d);
    /* Pipeline stages (runtime/dist/pp.c) on the device. pp_setup joins
     * the process's transfers over the pipeline group g (rank: the stage;
     * collective over the group the first time in the process, shared by
     * every executor of the stage after). pp_xfer queues, after the device
     * work queued so far, a send of `bytes` at plan offset off to stage
     * peer (send) or a receive of them into it from peer (off < 0: into a
     * buffer of the backend's, for a tensor no program reads); the device
     * work queued after it waits for it; the host does not. Transfers
     * between two stages in one direction meet in the order queued. */
    bool (*pp_setup)(BackendCtx *c, const RtCommGroup *g, Diag *d);
    bool (*pp_xfer)(BackendCtx *c, bool send, int peer, int64_t off, int64_t bytes, Diag *d);
} BackendExt;

/* ---- device.c: choosing a backend; the CUDA module ----------------------
 * The CUDA backend is a separate shared module (libkiln_cuda.so, built only
 * where the CUDA toolkit is found) loaded with dlopen on first use, so kiln
 * never links a CUDA library and starts on machines without a GPU driver.
 * The module is looked for at $KILN_CUDA_MODULE, then beside the running
 * executable, then beside $KILN_BIN. */
struct CgCudaProgram; /* codegen.h */

/* What the module needs from kiln (it links nothing of kilncore). */
#define RT_CUDA_ABI 13 /* 2: Backend.ext; 3: BackendExt.arena_bytes, CgCudaProgram.mem;
                         4: Backend.host; 5: RtCommEvent.exposed;
                         6: CgCudaProgram.cast_off, cast_now, cast_bytes;
                         7: cast groups (cast_group...) instead of cast_now;
                         8: CgKernel.flat, CgStep.lo and hi (the plan's layout);
                         9: CgCudaFn.range, CgCudaProgram.step_range (pieces);
                         10: Backend.host_ptr;
                         11: BackendExt.tp_setup, tp_run, tp_events;
                         12: BackendExt.tp_wait, tp_operand_copy;
                         13: BackendExt.pp_setup, pp_xfer */
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

/* ---- files.c: files the runtime writes, and the kernel cache --------------
 * (see files.c for the temp-file names and the cache's size limit) */
/* "a directory", "a FIFO", ...: what a path that is not a regular file is,
 * for messages (data files and safetensors files are regular files only) */
const char *rt_file_kind(mode_t m);
/* False with "PATH: cannot write (expected a regular file, got a
 * character device)" when path exists (after symlinks) and is not a
 * regular file; true when it is one or is missing. */
bool rt_output_check(const char *path, Diag *d);
/* An output that flag names (--checkpoint PREFIX with prefix: the files
 * PREFIX.stepN.safetensors; --save-weights FILE), checked before anything
 * is compiled or written. False with "FLAG PATH: cannot write (expected a
 * regular file, got a character device)" (or what else is wrong, and what
 * was expected) when
 * the path exists and is not a regular file (a device, FIFO, socket or
 * directory), when it ends in '/', or when its directory is missing, not a
 * directory, not writable, or inside /dev, /proc or /sys (except
 * /dev/shm); true otherwise. */
bool rt_output_path_check(const char *flag, const char *path, bool prefix, Diag *d);
/* Writes the n chunks to path atomically (temp file PATH.tmp.PID.XXXXXX in
 * the same directory, fsync, rename); on failure "PATH: cannot write:
 * reason" and no file. A path that exists and is not a regular file
 * (rt_output_check) is refused before anything is written. */
bool rt_write_atomic(const char *path, const void *const *chunk, const size_t *len, int n,
                     Diag *d);
/* Removes the temp files that rt_write_atomic left (killed mid-write) for
 * the final path HEAD (tail NULL) or HEAD<digits>TAIL, but only those whose
 * writer process is gone (kill(pid, 0) fails with ESRCH); returns how many. */
int rt_tmp_sweep(const char *head, const char *tail);

/* The kernel cache directory (malloc'd): cache_dir, else $KILN_CACHE_DIR,
 * else ~/.cache/kiln. */
char *rt_cache_path(const char *cache_dir);
/* Removes dir's temp files whose writer is gone, then keeps dir's files
 * named prefix* under KILN_CACHE_MAX (least recently used go first; never
 * `keep`, never a file of the last minute). */
void rt_cache_prune(const char *dir, const char *prefix, const char *keep, bool verbose);
/* mkdir -p; false (errno set) when path is not a writable directory after. */
bool rt_mkdir_p(const char *path);

/* ---- dist/launch.c: stopping on SIGINT and SIGTERM (process-wide) -------- */
/* SIGINT and SIGTERM then only record the signal, which rt_stop_signal
 * returns (0: none yet): the training loop stops after its current step
 * and the compile driver after its compile, with nothing half-written
 * (exit 128 + the signal). rt_launch forwards both to its ranks. */
void rt_stop_on_signals(void);
int rt_stop_signal(void);
const char *rt_signal_name(int sig); /* "SIGINT", ... */

#endif
