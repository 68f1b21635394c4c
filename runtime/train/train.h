/*
 * train.h - training (runtime/train/): the loop, its data sources,
 * checkpoints and weights in safetensors files, the trace and profile
 * reports, and what the loop trains (train_cfg.h: TrainCfg and Model, the
 * types the frontend fills).
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include <stdio.h>

#include "runtime.h"
#include "train_cfg.h"

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
 *   the seed; validation points come from their own random stream.
 * tensors (data_tensors.c): the user's arrays, one per model input, from a
 *   safetensors file or a directory of NAME.npy files; see there.
 * in_order (train{shuffle = false}): text and tokens read consecutive
 *   windows, window w = (index*B + row) mod W starting at symbol w*T of the
 *   split (W = (split length - 1) / T windows); tensors read examples in
 *   file order. */
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
    bool in_order;       /* text, tokens, tensors: no shuffle (see above) */
    const char *val_path;       /* tensors: the validation arrays (NULL: the last
                                   val_fraction of path's examples) */
    const struct DataWant *want; /* tensors: the model's inputs, nwant of them; read
                                    by rt_data_open, but their names must outlive
                                    the source (its batches name the inputs) */
    int nwant;
    bool allow_nonfinite; /* tensors: float arrays may hold NaN and Inf (else
                             refused at open, naming array, example, position) */
} DataCfg;

/* tensors: one model input, as one example of it (its shape after the batch
 * dimension), which an array of [N, dim...] of this dtype provides. */
typedef struct DataWant {
    const char *name;
    DType dtype;
    int rank;                 /* the input's rank - 1 */
    int64_t dim[IR_MAX_RANK];
    int64_t limit;            /* integer arrays: every value in [0, limit) (0: none) */
    const char *limit_what;   /* what limit is, for messages */
    bool optional;            /* may be missing from the file: its rows are then
                                 zeros (kiln predict: an input its outputs do
                                 not read, such as the labels) */
} DataWant;

/* tensors: one model input's rows of a batch, [B, row_bytes]. */
typedef struct {
    const char *name;
    int64_t row_bytes;
    uint8_t *data;
} DataArr;

typedef struct {
    int64_t B, T, D;
    int32_t *tokens, *targets; /* [B,T] */
    float *mask;               /* [B,T] */
    float *x;                  /* blobs: [B,D] */
    int32_t *y;                /* blobs, and tensors with an i32 y: [B] */
    DataArr *arr;              /* tensors: every model input's rows */
    int narr;
} DataBatch;

typedef struct DataSource DataSource;
/* NULL with d set ("PATH: what is wrong ...") on a bad config or file. */
DataSource *rt_data_open(const DataCfg *c, Diag *d);
void rt_data_close(DataSource *s);
/* Batch `index` of `split`; the buffers belong to the source and are
 * overwritten by the next call. */
const DataBatch *rt_data_batch(DataSource *s, DataSplit split, int64_t index);
bool rt_data_has_val(const DataSource *s);
/* Writes rows [row0, row0 + the input's batch) of b into g's data inputs
 * on e (those of b's source that g declares). */
void rt_data_feed(Exec *e, const Graph *g, const DataBatch *b, int64_t row0);
/* addition: writes the 3n+4 symbols of a+b (see above) into seq. */
void rt_addition_encode(int digits, int64_t a, int64_t b, int32_t *seq);
bool rt_addition_is_val(int digits, int64_t a, int64_t b, double val_fraction);

/* The whole of a split, example by example (kiln eval, kiln predict,
 * train{eval_batches = "all"}), in order: tensors: the split's examples in
 * file order; text and tokens: the consecutive windows of T+1 symbols that
 * start every T symbols (the in_order windows), each target scored once;
 * the last (len - 1) mod T targets fill no window: with `partial` they
 * form one more window whose missing end has mask 0, else they are left out
 * (*left_out: how many); addition (digits <= 3): every held-out problem,
 * (a, b) in increasing order. blobs has no end: -1 with d set, as for
 * addition with more digits. The count of examples, or -1. */
int64_t rt_data_examples(DataSource *s, DataSplit split, bool partial, int64_t *left_out,
                         Diag *d);
/* Rows 0..n-1 of the batch (1 <= n <= the source's batch): examples
 * first..first+n-1 of split (after rt_data_examples of that split); the
 * rows n..B-1 copies of row 0 with mask 0 (where the source has a mask). */
const DataBatch *rt_data_range(DataSource *s, DataSplit split, int64_t first, int64_t n);

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
/* ---- data_tensors.c: the tensors source (rt_data_open's part) -----------
 * Arrays are matched to c->want by name: each must exist with the want's
 * dtype and shape [N, dim...], every array of a file the same N >= 1, and
 * integer values within limit; "PATH: ... (expected ..., got ...)" in d
 * otherwise. Train row i of batch k is example (k*B + i) mod N of the
 * training arrays, through a permutation per epoch (seed, epoch) unless
 * in_order; validation batches are always in order. */
typedef struct TensorSource TensorSource;
TensorSource *rt_tensors_open(const DataCfg *c, DataBatch *b, Diag *d);
void rt_tensors_fill(TensorSource *s, DataBatch *b, DataSplit split, int64_t index);
bool rt_tensors_has_val(const TensorSource *s);
int64_t rt_tensors_examples(const TensorSource *s, DataSplit split);
/* Rows 0..n-1 of b: examples first..first+n-1 of split, in file order. */
void rt_tensors_range(TensorSource *s, DataBatch *b, DataSplit split, int64_t first, int64_t n);
void rt_tensors_close(TensorSource *s, DataBatch *b);

/* ---- npy.c: NumPy .npy files, into the safetensors types --------------------
 * Versions 1.0, 2.0 and 3.0; C order, little-endian f4, f2, i4, i8, u1
 * (kiln's f32, f16, i32, i64, u8). On any defect false with "PATH: what is
 * wrong (expected ..., got ...)" in d and *t empty. */
bool rt_npy_parse(const char *path, const uint8_t *buf, size_t n, StTensor *t, Diag *d);
bool rt_npy_read(const char *path, StTensor *t, Diag *d);
/* Every NAME.npy of dir (sorted by name) as tensor NAME, or with only
 * (non-NULL) those whose NAME is one of only[0..nonly): the other files are
 * neither opened nor parsed, their NAMEs listed in skipped (", "-separated,
 * may be NULL). Free with rt_st_free. No .npy file is an error. */
bool rt_npy_read_dir(const char *dir, const char *const *only, int nonly, StFile *f,
                     char *skipped, size_t nskipped, Diag *d);

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
/* Whether t is state the model script declared (state(), BatchNorm's
 * running statistics), not the optimizer's or an accumulator: weights
 * files hold it beside the params, and evaluation reads it. */
bool rt_model_state(const Tensor *t);
/* Loads every param (and model state) of g by name from a weights or
 * checkpoint file. Loading
 * refuses a NaN or Inf in any tensor it restores, and saving refuses to
 * write one (nothing written): "PATH: tensor "NAME" holds NaN at index K". */
bool rt_weights_load(const char *path, const Graph *g, void **vals, Diag *d);
/* rt_weights_load for --init-from: a param padded to more rows (pads:
 * padded_rows of the model) also loads from a tensor of exactly its real
 * rows (GPT-2's wte.weight [50257, C] into [50304, C]): the real rows are
 * copied, the padding zeroed. Saving writes the padded shape. */
bool rt_weights_import(const char *path, const Graph *g, const ModelRowPad *pads, int npads,
                       void **vals, Diag *d);
/* The same from a file already read (f), for initmap.c. */
bool rt_weights_restore(const char *path, const StFile *f, const Graph *g,
                        const ModelRowPad *pads, int npads, void **vals, Diag *d);

/* ---- initmap.c: --init-from with --init-map and --init-partial ----------
 * Loads the params of g (vals by tensor id, holding their init) from the
 * weights or checkpoint file path, each tensor of the file becoming the
 * param map says (NULL: the same name; transposed where it says). Without
 * partial every param must come from the file (rt_weights_import's rules
 * and messages); with partial, a param the file does not give, or gives in
 * another shape, keeps its init, and a tensor no param takes is ignored.
 * Either way a map entry that names a param the model lacks, and two
 * tensors mapped to one param, are errors at the map's line. All or
 * nothing: on error vals are unchanged. *note (when not NULL) gets a
 * malloc'd text for the user: how many params were loaded, which were left
 * at their init and which tensors of the file were ignored (and why); NULL
 * when neither map nor partial was given. */
bool rt_init_from(const char *path, const Graph *g, const ModelRowPad *pads, int npads,
                  const InitMap *map, bool partial, void **vals, char **note, Diag *d);
/* Removes the temp files an interrupted write of a checkpoint of prefix
 * (PREFIX.stepN.safetensors) or of the weights file `weights` left behind,
 * when their writer is gone (either may be NULL); returns how many. */
int rt_ckpt_sweep_tmp(const char *prefix, const char *weights);

/* ---- runlog.c: --log-dir: metrics.jsonl, eval.jsonl and report.html -------
 * The JSON lines are written as the run goes; report.html once, at
 * rt_runlog_close, from the series and the sections handed in before. */
typedef struct RunLog RunLog;
typedef struct {
    int64_t step;
    double loss;
    const char *const *extra_name; /* the model's extra scalar outputs */
    const float *extra;
    int nextra;
    double lr, grad_norm, ms, mfu, hfu; /* nan: unknown */
    double examples_per_s; /* examples (rows of the batch, all ranks) per second */
    double tokens_per_s;   /* nan where the data has no token axis (blobs, most tensors) */
    double comm_ms, comm_exposed_ms; /* rt_dp_last_comm; nan: one rank */
    double tp_comm_ms, tp_comm_exposed_ms; /* rt_dp_last_tp; nan: no TP */
    int64_t mem_bytes;
} RtStepRecord;
/* Creates dir and its parents if needed (mkdir -p) and checks that it is a
 * writable directory; false with "--log-dir DIR: ..." in d when not. Run
 * before compiling, so a bad --log-dir costs no compile. */
bool rt_runlog_dir(const char *dir, Diag *d);
/* rt_runlog_dir; with training, opens its metrics.jsonl and eval.jsonl.
 * NULL with d set when it cannot. */
RunLog *rt_runlog_open(const char *dir, const char *title, bool training, Diag *d);
/* One line of metrics.jsonl (eval.jsonl): written whole or not at all; false
 * with "PATH: cannot write: REASON" in d on the first failed write (a full
 * disk), the file left ending with its last whole line. */
bool rt_runlog_step(RunLog *l, const RtStepRecord *s, Diag *d);
bool rt_runlog_eval(RunLog *l, int64_t step, double val_loss, const char *const *names,
                    const double *vals, int n, double accuracy /* nan: none */, Diag *d);
/* Report sections, in the order called: the profile (rows of
 * rt_exec_profile over `steps` steps; g and plan, which may be NULL: the
 * graph the plan runs and the plan, to name each of the costliest kernels
 * with its ops' script lines), memplan's memory timeline with the
 * recomputed ops, rank 0's compute and communication in one step (several
 * ranks), the remat sweep (kiln compile). */
struct CgPlan;
void rt_runlog_profile(RunLog *l, const RtProfRow *rows, int n, double step_ms, int64_t steps,
                       const Graph *g, const struct CgPlan *plan);
void rt_runlog_memory(RunLog *l, const Graph *g, const MemPlan *mp);
void rt_runlog_comm(RunLog *l, int nranks, double step_start, double step_end,
                    const RtCommEvent *ev, int nev);
void rt_runlog_sweep(RunLog *l, const RematSweepPoint *p, int n);
/* A section "Sample at step N" holding text (train{sample_every}). */
void rt_runlog_sample(RunLog *l, int64_t step, const char *text);
/* Closes the JSON lines (fsync: an error the file system reports late) and
 * writes DIR/report.html (atomically); false with d set on a write error. */
bool rt_runlog_close(RunLog *l, Diag *d);
void rt_runlog_free(RunLog *l);

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

/* Sorts rows (the executor's RtProfRow, runtime.h: totals over all calls;
 * flops and bytes 0 where unknown) by time, then name, and prints: name,
 * calls, total ms, % of total_ms, achieved GFLOP/s and GB/s; past max_rows
 * (> 0) the rest share one row. */
void rt_profile_print(FILE *f, RtProfRow *rows, int n, double total_ms, int max_rows);

/* ---- eval.c: evaluation over the whole of a split --------------------------
 * Runs the evaluation graph g (params already written into e) over every
 * example of split (rt_data_examples), B rows a run, the last batch of k <
 * B examples padded (rt_data_range) and masked, never dropped. The loss and
 * each extra scalar output are averaged exactly over the examples (tokens
 * where the mask input counts them), under the rule the training loop's
 * evaluation already assumes: examples are independent (no statistic
 * across the batch), and a batch's scalar output is a mean over its
 * examples, or over its tokens where mask is 1 (nn.cross_entropy's masked
 * mean) when g has a mask input that the source fills. Then
 *   - masked: the padded rows have mask 0, so the batch's outputs are means
 *     over its real tokens; each batch is weighted by its mask sum;
 *   - unmasked: with every example weighing the same (a row, or its T
 *     tokens), a batch's mean times B is the sum over its rows. The last
 *     batch runs twice: rows 0..k-1 real and the rest copies of row 0 (mean
 *     m1), then every row a copy of row 0 (m0, that example's own value):
 *     the real rows sum to B*m1 - (B-k)*m0.
 * Batch c runs on rank c mod nranks; the sums go over the ranks once, at
 * the end (comm NULL: one rank). Accuracy (logits given) counts a real row
 * right when the argmax of logits matches y (rowy) or every masked target. */
typedef struct {
    const Graph *g;
    Exec *e;
    DataSource *ds;
    DataSplit split;
    int64_t B, T;       /* rows per run, tokens per row (1: not token data) */
    bool masked;        /* g's mask input is the source's (text, tokens, addition) */
    int nx;             /* extra scalar outputs: their tensor ids in g (-1: absent) */
    const int *x_ids;
    const Tensor *logits; /* accuracy from these logits; NULL: none */
    bool rowy;          /* accuracy: logits [B,classes] against y i32[B] */
    RtComm *comm;
    int rank, nranks;
    uint64_t seed;
    int64_t step;
} RtEvalSpec;

typedef struct {
    double loss;          /* the mean over examples (tokens) */
    double *x;            /* the extra outputs' means, nx (the caller's) */
    int64_t examples;     /* every example of the split, each once */
    double weight;        /* what the means are over: examples, or mask tokens */
    int64_t left_out;     /* text, tokens without a mask: tail targets in no window */
    int64_t right, total; /* accuracy counts (total 0: none) */
    int64_t runs;         /* executor runs (the last batch unmasked: 2) */
} RtEvalResult;

/* false with d set: a split it cannot go through (blobs), an empty one, a
 * failed run. */
bool rt_eval_whole(const RtEvalSpec *sp, RtEvalResult *out, Diag *d);
/* Reads float tensor t (f32, or bf16 widened) of e into out (its numel
 * floats); train.c. */
void rt_exec_read_f32(Exec *e, const Tensor *t, float *out);
/* The index of x[0..n)'s largest element (the first of ties); train.c. */
int64_t rt_argmax(const float *x, int64_t n);

/* ---- infer.c: kiln eval and kiln predict ----------------------------------
 * Both compile the model's evaluation graph (forward only: Model.eval_g,
 * dropout off) as the training loop's evaluation does, load the params from
 * init_from (rt_weights_import: every param of the model, by name and
 * shape), and go through every example of the data in order, B at a time,
 * the last batch padded (rt_data_range). The data: with data_path, every
 * example of that file or directory (the model's data kind, read as
 * training reads it with val_fraction 0); else the validation split of
 * the model's own data settings (--set ... changes them).
 * rt_eval prints the loss and the extra scalar outputs, averaged exactly
 * (rt_eval_whole), and writes them to log_dir/eval.jsonl. rt_predict
 * writes the named outputs, one row per example (the leading dimension,
 * B, of each), padding removed, to out: FILE.safetensors (rt_st_write) or
 * DIR/ (one NAME.npy per output), never half-written. Each returns the
 * exit code: 0, or 1 after printing the error (what is wrong, naming the
 * flag or file). */
typedef struct {
    const char *init_from;    /* --init-from W (required) */
    const char *data_path;    /* --data-path P; NULL: the validation split */
    const char *device;       /* --device (NULL: cpu) */
    int threads;              /* --threads (0: one per core) */
    const char *cache_dir;    /* --cache-dir */
    bool verbose, quiet;      /* -v, -q */
    bool allow_nonfinite_data; /* --allow-nonfinite-data */
    const char *log_dir;      /* eval: --log-dir DIR */
    const char *const *outputs; /* predict: --outputs NAME,... */
    int noutputs;
    const char *out;          /* predict: --out FILE.safetensors | DIR/ */
} InferOpts;
int rt_eval(const Model *m, const InferOpts *o);
int rt_predict(const Model *m, const InferOpts *o);

/* ---- sample.c: kiln sample -------------------------------------------------
 * Text from a language model (an input tokens i32[B,T], an evaluation
 * output logits f32[B,T,V]) with the weights init_from: the prompt, then
 * max_new_tokens tokens per sample, B samples a run (rows), each drawn with
 * its own stream seeded by (seed, sample index): a sample does not depend
 * on B. Two paths (printed on standard error):
 *   - KV cache: prefill_g (the decode graph of S = T: the window at
 *     position 0, filling the caches; for prompts of more than T/16
 *     tokens, else one step per prompt token) then step_g (S = 1 at
 *     position decode.pos: writes the cache there, attends to the filled
 *     part) per token; past the window (T tokens) each token reruns the
 *     prefill over the last T tokens. The first step is checked against
 *     the prefill over the same tokens (relative error of the logits <=
 *     1e-3), and a mismatch falls back to the other path.
 *   - full forward: the evaluation graph over the last min(n, T) tokens
 *     (padded) at every token; every language model takes it.
 * Tokens print as bytes (V <= 256), through tokenizer, or as ids. Returns
 * the exit code: 0, 1 after printing the error (naming the flag), or 128 +
 * the signal that stopped it. */
typedef struct {
    const char *init_from;      /* --init-from W (required) */
    const char *prompt;         /* --prompt TEXT (bytes) */
    const char *prompt_tokens;  /* --prompt-tokens FILE (ids) */
    const char *tokenizer;      /* --tokenizer FILE: llm.c's GPT-2 tokenizer file */
    int64_t max_new_tokens, num_samples, top_k; /* top_k 0: all */
    double temperature;         /* 0: greedy */
    double top_p;               /* (0, 1] */
    uint64_t seed;
    bool stream, ids;           /* --stream; --ids: print token ids */
    bool no_kv_cache;           /* --no-kv-cache: the full forward path */
    bool skip_check;            /* testing: no step-against-prefill check */
    const Graph *prefill_g, *step_g; /* the decode graphs (fe_load_decode, S = T and 1);
                                        NULL: none */
    int ncaches;                /* their cache tensors (0: no KV-cache attention) */
    const char *decode_why;     /* why there are no decode graphs (NULL: there are) */
    const char *device;         /* --device */
    int threads;
    const char *cache_dir;
    bool verbose, quiet;
} SampleOpts;
int rt_sample(const Model *m, const SampleOpts *o);
/* train{sample_every}: one sample from the evaluation graph eg (params
 * already in e), by the full forward over the window at every token:
 * c->sample_prompt (bytes for V <= 256, else token ids; NULL: a newline,
 * or token 50256 for GPT-2's vocabulary), then c->sample_tokens tokens
 * drawn at temperature 1 from a stream of (c->seed, step). Returns the
 * text (printable: other bytes as \xNN; ids for V > 256), malloc'd; NULL
 * with d set when eg is not a language model or the prompt does not fit
 * (rt_train calls it once before training to check). */
char *rt_train_sample(Exec *e, const Graph *eg, const TrainCfg *c, int64_t step, bool check,
                      Diag *d);

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
    const InitMap *init_map;  /* --init-map FILE.lua, run by the CLI (NULL: none) */
    bool init_partial;        /* --init-partial: load what matches (rt_init_from) */
    const char *save_weights; /* --save-weights W: params at the end */
    const char *checkpoint;   /* --checkpoint PREFIX: overrides train.checkpoint */
    bool profile;             /* --profile */
    const char *kernel_table; /* --kernel-table FILE (with --profile): the measured
                                 per-kernel table (docs/cost.md) */
    const char *trace;        /* --trace FILE */
    const char *log_dir;      /* --log-dir DIR: metrics, eval log, report.html */
    double peak_gflops;       /* --peak-gflops: MFU denominator; 0: the measured CPU FMA
                                 peak or the GPU's datasheet peak */
    int remat;                /* --remat: RematPolicy (REMAT_DEFAULT: auto with a budget) */
    bool verbose, quiet;      /* -v, -q */
    const char *cache_dir;    /* kernel cache (NULL: executor default) */
    TrainResult *result;      /* optional out */
    bool no_overlap;          /* --no-overlap: every allreduce starts after backward */
    bool no_fuse;             /* --no-fuse: every op its own kernel */
    bool no_fuse_attention;   /* --no-fuse-attention: no attention pass */
    bool allow_nonfinite_data; /* --allow-nonfinite-data: tensors data may hold NaN/Inf */
    const char *dump_ir;      /* --dump-ir FILE: the training step's IR after the
                                 pipeline (rank 0), as kiln compile's schedule dump */
} TrainOpts;

/* Returns the process exit code: 0, 1 after printing the error, or 128 +
 * the signal for a run stopped by SIGINT or SIGTERM (0 in a rank that
 * rt_launch stopped: rt_dp_close). */
int rt_train(const Model *m, const TrainOpts *o);
/* The command-line flags that shape the training graph: kiln compile's
 * and kiln train's --memory-budget, --remat, --nproc, --no-overlap and
 * --no-fuse (kiln opt's too). A zeroed struct with memory_budget -1 means
 * none given. */
typedef struct {
    int64_t memory_budget; /* --memory-budget; < 0: train.memory_budget */
    int remat;             /* --remat: RematPolicy; REMAT_DEFAULT: not given */
    int nranks;            /* --nproc, or the ranks running the step; <= 1: one */
    int tp_rank;           /* this rank's index in its tensor-parallel group */
    bool no_overlap;       /* --no-overlap */
    bool no_fuse;          /* --no-fuse */
    bool no_fuse_attention; /* --no-fuse-attention */
} RtGraphFlags;
/* The one map from a model's training settings and those flags to pass
 * options: the defaults, the optimizer's settings (beta1, beta2, eps,
 * weight_decay, grad_clip), the memory budget, remat policy, ranks,
 * grad_accum, bucket_mb, overlap, fusion and the attention pass (on unless
 * --no-fuse-attention, for every backend: both have the kernels,
 * codegen/cattn.c and codegen/cuda_attn.c). kiln compile, kiln train
 * (every rank) and kiln opt all build their PassOpts here, so the same model
 * and flags give the same graph. f NULL: no flags. KILN_COMM_ONE_RANK=1 (a
 * testing knob) compiles one rank as two: buckets and all-reduces on one
 * rank. */
void rt_pass_opts(const TrainCfg *c, const RtGraphFlags *f, PassOpts *po);
/* Learning rate after `step` steps of `steps`: linear warmup over
 * c->warmup steps to c->lr, then cosine to c->min_lr at the last step. */
double rt_lr_at(const TrainCfg *c, int64_t step, int64_t steps);

#endif
