/* train_internal.h - what train.c shares with the other files of the
 * training loop (train_data.c). Not part of the runtime's interface. */
#ifndef KILN_TRAIN_INTERNAL_H
#define KILN_TRAIN_INTERNAL_H

#include "train.h"
#include "cpu.h"
#include "dist.h"

/* Step times for the median, in memory that does not grow with --steps: at
 * most STEP_TIMES_MAX are kept; when full, every other one is dropped and
 * from then on only every 2nd (4th, ...) step is recorded, an even sample of
 * the whole run. */
#define STEP_TIMES_MAX ((int64_t)1 << 16)
typedef struct {
    double *ms;              /* STEP_TIMES_MAX entries once a step ran; NULL before */
    int64_t n, stride, seen; /* kept; record every stride-th; steps seen */
} StepTimes;

typedef struct {
    const Model *m;
    const TrainOpts *o;
    TrainCfg c;
    Graph *tg, *eg;       /* training step; evaluation (forward) */
    Exec *te, *ee;
    /* pp with sample_every or eval_batches = "all": the whole model's
     * evaluation graph and executor on world rank 0 (stage 0, tp and dp
     * rank 0), fed the params gathered whole (pp_whole_eval); else NULL */
    Graph *pg;
    Exec *pe;
    void **vals;          /* host copies of tg's params and state, by id; on a
                             host backend te's own bytes (rt_exec_host_view) */
    bool vals_view;       /* vals are te's bytes: not freed, not copied */
    DataSource *ds;
    bool blobs, addition, tensors;
    bool rowy;            /* accuracy per row against input y i32[B] (blobs; tensors
                             with logits [B,classes]) */
    int64_t B, T;         /* T = 1 for blobs and tensors */
    int64_t tok_per_row;  /* tokens per example, for throughput: T for text,
                             tokens and addition; for tensors the positions of
                             its token input (tensors_cfg); 0 where the data has
                             no token axis (blobs): throughput in examples/s */
    int64_t steps, step;  /* total; completed */
    int64_t data_pos;
    Trace *trace;
    double t0;            /* trace time origin */
    double flops;         /* per training step */
    /* profile: time per phase */
    double ph_ms[5];
    int64_t ph_calls[5];
    double last_val_loss, last_acc;
    int64_t acc_right, acc_total;
    bool have_val, have_acc;
    RtDp *dp;             /* ranks and micro-batches (dist/dp.c) */
    RtComm *comm;         /* its ranks; NULL: one rank */
    int64_t skipped;      /* steps not applied (on_nonfinite = "skip") */
    int64_t ckpt_step;    /* the last checkpoint written (-1: none) */
    StepTimes times;      /* per step, ms */
    double peak_gflops;   /* MFU's denominator (0: unknown) */
    int peak_threads;     /* != 0: peak_gflops is the measured CPU FMA peak of
                             |peak_threads| threads; > 0: not yet measured
                             again by check_peak */
    /* the model's extra scalar outputs (an auxiliary loss, a cross-entropy
     * term): shown on the step, eval and final lines */
    int nx;
    const char **x_name;  /* output names (the model graph's strings) */
    int *x_t, *x_e;       /* tensor ids in tg and eg (-1: eg lacks it) */
    float *x_val;         /* last step's values (mean over ranks, micro-batches) */
    double *x_eval;       /* last evaluation's means */
    RunLog *log;          /* --log-dir (rank 0), else NULL */
    MemPlan *mp;          /* the step's memory plan, kept for the report */
    int grad_norm_t;      /* tg's "grad_norm" output, -1: none */
    RtZero *zero;         /* zero=1: the unsharded view for checkpoints, else NULL */
    RtTpWhole *tpw;       /* tp > 1: the whole tensors for files (dist/tp.c), else NULL */
    struct RtEarlyStop *es; /* train{early_stop, keep_best} (earlystop.c); NULL: neither */
    const bool *optional_input; /* by the model graph's tensor id: data tensors inputs
                                   that may be missing from the file (DataWant.optional;
                                   kiln predict); NULL: none */
} Run;

/* ---- train.c's helpers that train_eval.c uses ----------------------------- */
/* The step's phases, timed into Run.ph_ms. */
enum { PH_DATA, PH_STEP, PH_EVAL, PH_CKPT, PH__N };
/* Adds t_end - t_start to phase ph (Run.ph_ms). */
void rt_train_phase(Run *r, int ph, double t_start, double t_end);
/* The loss output of e's graph g. */
float rt_train_read_loss(Exec *e, const Graph *g);
/* Host copies of tg's params and state <- the training executor. */
void rt_train_pull_state(Run *r);
/* A --log-dir line could not be written (d: "PATH: cannot write: REASON"):
 * the run stops here; d gains where, and the checkpoint it keeps. False. */
bool rt_train_log_failed(const Run *r, Diag *d);

/* ---- train_eval.c: evaluations and samples --------------------------------
 * rt_train_eval_source: the model's evaluation source (its eval graph,
 * dropout off; the training graph where it has none). rt_train_evaluate:
 * train{eval_every}'s evaluation at the current step (eval_batches, or
 * the whole split), its lines, log and early-stop bookkeeping inputs.
 * rt_train_check_eval_all: eval_batches = "all" on a source without a
 * whole split, refused before the first step. rt_train_sample_now:
 * train{sample_every}'s sample at the current step. False with d set. */
const Graph *rt_train_eval_source(const Model *m);
bool rt_train_evaluate(Run *r, Diag *d);
bool rt_train_check_eval_all(Run *r, Diag *d);
bool rt_train_sample_now(Run *r, bool tty, Diag *d);

/* ---- earlystop.c: train{early_stop} and train{keep_best} -----------------
 * rt_es_open, once the data is open, before compiling: checks the
 * settings (errors at the train{} line: no validation split, eval_every 0
 * for early_stop, no checkpoint prefix for keep_best, an unknown metric)
 * and sets r->es (NULL when neither is on). rt_es_after_eval, on every
 * rank after each evaluation: a better metric is the new best (keep_best
 * writes PREFIX.best.safetensors through rt_train_save_ckpt); *stop when
 * early_stop's patience ran out. rt_es_summary: the final line's " | best
 * METRIC V at step S". */
typedef struct RtEarlyStop RtEarlyStop;
bool rt_es_open(Run *r, const char *ckpt, Diag *d);
bool rt_es_after_eval(Run *r, bool *stop, Diag *d);
void rt_es_summary(const Run *r, FILE *f);
void rt_es_free(RtEarlyStop *es);
/* Writes a checkpoint of the run's current state to path (train.c; every
 * rank calls it: zero=1 gathers the moments; rank 0 writes). */
bool rt_train_save_ckpt(Run *r, const char *path, Diag *d);

/* Largest train{eval_batches} (the settings' bound, as for steps). An
 * evaluation streams its batches and sums them over ranks EVAL_CHUNK at a
 * time, so its memory does not grow with eval_batches. */
enum { MAX_EVAL_BATCHES = 1000000000, EVAL_CHUNK = 4096 };

/* The model input NAME of g, NULL when g has no input of that name. */
const Tensor *rt_train_input(const Graph *g, const char *name);
/* Checks the train{} data settings against the model's inputs and opens
 * r->ds for this rank (errors name the train{} line). */
bool rt_train_open_data(Run *r, Diag *d);

#endif
