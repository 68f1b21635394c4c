/*
 * dist.h - several ranks (runtime/dist/): MPI collectives on a
 * communication thread (mpi.c), the `--nproc` launcher (launch.c), and data
 * parallelism and gradient accumulation inside the training loop (dp.c).
 */
#ifndef KILN_DIST_H
#define KILN_DIST_H

#include "runtime.h"
#include "train.h"

/* ---- mpi.c: ranks and collectives (MPI) ---------------------------------
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
/* The same with the ranks laid out tp x dp, TP innermost: world rank w is
 * TP rank w % tp of data-parallel group w / tp. rt_comm_rank and
 * rt_comm_size, the buckets, the host means and broadcasts are the dp
 * group's (the ranks holding the same TP part); false with d set when tp
 * does not divide the ranks. */
bool rt_comm_open_tp(double timeout_s, int tp, RtComm **c, Diag *d);
/* The same with pipeline stages: TP innermost, then DP, then PP (kiln
 * plan's order, Megatron-LM's): world rank w is TP rank w % tp of dp rank
 * (w / tp) % dp in stage w / (tp dp). The dp group holds the ranks of one
 * TP rank and stage; false with d set when tp x pp does not divide the
 * ranks. */
bool rt_comm_open_pp(double timeout_s, int tp, int pp, RtComm **c, Diag *d);
/* Pipeline stages (runtime/dist/pp.c), over this rank's pipeline (the
 * ranks of its TP rank and dp rank, one per stage, addressed by stage),
 * on the calling thread, each with the comm timeout (a lost peer stops
 * the job): a send that returns at once (its buffer is the caller's until
 * rt_comm_pp_wait), a blocking receive; sums in place over the stages
 * (double), over the stages listed (f32: a tied param's gradient) and over
 * the dp group (f32); a reduce-scatter (sum) over the dp group of x[total]
 * in flat order, this rank's range of ir_shard_range into shard (its
 * len elements; the caller pads); a broadcast from stage root. */
int rt_comm_pp(const RtComm *c);       /* stages; 1 for NULL */
int rt_comm_pp_stage(const RtComm *c); /* this rank's; 0 for NULL */
void *rt_comm_pp_isend(RtComm *c, int to, int tag, const void *buf, size_t n);
void rt_comm_pp_wait(RtComm *c, void *req);
void rt_comm_pp_recv(RtComm *c, int from, int tag, void *buf, size_t n);
void rt_comm_pp_sum(RtComm *c, double *x, int n);
void rt_comm_pp_sum_f32(RtComm *c, const int *stages, int nst, float *x, int64_t n);
void rt_comm_dp_sum_f32(RtComm *c, float *x, int64_t n);
void rt_comm_dp_reduce_scatter_f32(RtComm *c, const float *x, int64_t total, float *shard);
void rt_comm_pp_bcast(RtComm *c, int root, void *buf, size_t n);

/* ---- tp.c: whole tensors under tensor parallelism ----------------------
 * Files hold whole tensors whatever the layout. A view of a graph's
 * inputs with whole shapes: rt_tp_whole gathers every split tensor's parts
 * over the TP group (a collective: every TP rank calls it) into it;
 * rt_tp_whole_view gives its buffers without gathering (to read a file
 * into), and rt_tp_split takes this rank's part of them. Unsplit tensors
 * are the caller's own buffers. */
typedef struct RtTpWhole RtTpWhole;
bool rt_tp_any(const Graph *g); /* g has a tensor split over more than one rank */
RtTpWhole *rt_tp_whole_new(void);
void rt_tp_whole_free(RtTpWhole *w); /* NULL: nothing */
const Graph *rt_tp_whole(RtTpWhole *w, RtComm *c, const Graph *g, void *const *vals,
                         void ***whole_vals);
const Graph *rt_tp_whole_view(RtTpWhole *w, const Graph *g, void *const *vals,
                              void ***whole_vals);
void rt_tp_split(RtTpWhole *w, const Graph *g, void **vals);
int rt_comm_world_rank(const RtComm *c); /* 0 for NULL */
int rt_comm_world_size(const RtComm *c); /* 1 for NULL */
int rt_comm_tp(const RtComm *c);         /* the TP group's size; 1 for NULL */
int rt_comm_tp_rank(const RtComm *c);    /* this rank's index in it; 0 for NULL */
/* Collectives over the TP group on the calling thread (f32), coll 0: the
 * sum of chunk elements (outer 1), from x into y (x == y: in place); 1:
 * the sum of [outer][rank][chunk] scattered as this rank's [outer][chunk];
 * 2: the gather of each rank's [outer][chunk] into [outer][rank][chunk].
 * rt_comm_tp_start posts it and returns a handle (x may be reused at once;
 * y is written until the wait); rt_comm_tp_poll progresses every one in
 * flight (call it between steps); rt_comm_tp_wait blocks until handle h
 * has landed in y. With one TP rank the start copies and returns -1,
 * which the wait ignores. The three blocking forms start and wait. */
int rt_comm_tp_start(RtComm *c, int coll, const float *x, int64_t outer, int64_t chunk,
                     float *y);
void rt_comm_tp_poll(RtComm *c);
void rt_comm_tp_wait(RtComm *c, int h);
void rt_comm_tp_allreduce(RtComm *c, float *x, int64_t n);
void rt_comm_tp_all_gather(RtComm *c, const float *x, int64_t outer, int64_t chunk, float *out);
void rt_comm_tp_reduce_scatter(RtComm *c, const float *x, int64_t outer, int64_t chunk,
                               float *out);
/* The TP collectives this rank ran since the last call (then zeroed): their
 * seconds from start to completion (as seen by the polls), the seconds
 * their waits blocked the step (exposed), count, bytes per rank (an
 * all-reduce's buffer, a gather's or reduce-scatter's whole tensor) and
 * events (bucket -1, coll 0 all-reduce, 1 reduce-scatter, 2 all-gather;
 * valid until the next call). */
typedef struct {
    double s, exposed_s;
    int n;
    int64_t bytes;
    int nev;
    const RtCommEvent *ev;
} RtTpStats;
void rt_comm_tp_stats(RtComm *c, RtTpStats *st);
/* TP collectives run by the device (BackendExt.tp_setup): copies n bytes
 * at buf from TP rank 0 to every rank of this rank's TP group (blocking, on
 * the calling thread; a peer that does not join within the timeout stops
 * the job as a lost rank does); nothing with one TP rank. */
void rt_comm_tp_bcast(RtComm *c, void *buf, size_t n);
/* rt_comm_tp_stats first calls every registered pull(arg, c) (each
 * executor whose TP steps run on the device registers one), which adds
 * the device's finished TP collectives with rt_comm_tp_add_events (each
 * event's end - start counts as TP time, its `exposed` as exposed). pull NULL
 * removes arg's source. At most 8 sources (the training step, its
 * micro-batch and evaluation executors). */
void rt_comm_tp_source(RtComm *c, void (*pull)(void *arg, RtComm *c), void *arg);
void rt_comm_tp_add_events(RtComm *c, const RtCommEvent *ev, int n);
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
/* The same for the mean that ends each training step (the loss, the stop
 * signals): all of its wait counts as exposed time (RtCommStats). */
void rt_comm_step_mean(RtComm *c, double *v, int n);
/* Per step: communication time (the comm thread's busy time), exposed time
 * (compute blocked in waits), and the events since the last reset. */
typedef struct {
    double comm_s, exposed_s;
    double exposed_by[3]; /* exposed_s by the CgColl waited for (device: RtCommEvent.exposed) */
    int nev;
    const RtCommEvent *ev;
} RtCommStats;
void rt_comm_stats(RtComm *c, RtCommStats *st); /* st->ev valid until the next call */
/* Zeroes the figures and drops the events, except the all-gathers that
 * landed after the last rt_comm_stats (ZeRO-1's gathers outlive their
 * step): they are the first events of the next figures. */
void rt_comm_stats_reset(RtComm *c);
/* Queues the all-gathers started and held (mpi.c) now, in their order,
 * without waiting: the executor's release point after zero=1's first
 * gather bucket (runtime/pieces.c); program order, the same on every rank. */
void rt_comm_release(RtComm *c);
/* Waits until MPI is done with bucket's bytes: a zero=1 all-gather is
 * settled on its owner at its start (rt_comm_wait returns) while its
 * sends still read the owner's params, which must not change or go away
 * before this returns. */
void rt_comm_wait_done(RtComm *c, int bucket);
/* Waits until no bucket collective is held, queued, running or in flight
 * (ZeRO-1's last all-gathers); counts no exposed time. */
void rt_comm_drain(RtComm *c);
/* Every rank's n floats at mine, in rank order, into all[size * n] on
 * every rank (blocking; through the communication thread). */
void rt_comm_allgather(RtComm *c, const float *mine, int64_t n, float *all);
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
/* In a rank started by rt_launch: true once the launcher asked every rank
 * to stop (it got SIGINT or SIGTERM); false otherwise. */
bool rt_rank_stop_requested(void);
/* In a rank started by rt_launch, which found that rank `rank` (a local
 * process) answers nothing for timeout s: kills it (SIGKILL: a stopped or
 * hung process ends too) and records "hung BY TIMEOUT" as its status, which
 * the launcher names. False (nothing done) outside rt_launch or when the
 * rank's pid is unknown. */
bool rt_rank_kill_hung(int rank, double timeout);
/* ---- dp.c: data parallelism and gradient accumulation in the loop -------
 * The loop opens its data with the global batch (rt_dp_rows_factor x the
 * model's batch b); rank r, micro-batch k trains on rows [(r*K + k)*b, +b).
 * With one rank and grad_accum 1 every call is an identity or no-op. */
typedef struct RtDp RtDp;
/* Opens the ranks (rt_comm_open) from train{comm_timeout}, checks
 * grad_accum and bucket_mb; ranks other than 0 print nothing on stdout.
 * *dp is set even on failure (close it). */
bool rt_dp_open(const TrainCfg *c, RtDp **dp, Diag *d);
/* Records rc as the rank's status and returns the process's exit status:
 * rc, except 0 for a rank that stopped on rt_launch's request after the
 * step every rank agreed on (rc 128 + rt_dp_stop): that rank finalizes MPI
 * like a finished run, so mpirun waits for every rank (a non-zero exit
 * would make it kill the others, mid-checkpoint or before rank 0's
 * summary); the launcher exits 128 + the signal itself. */
int rt_dp_close(RtDp *dp, int rc);
int rt_dp_rank(const RtDp *dp);
int rt_dp_tp_rank(const RtDp *dp); /* this rank's index in its TP group */
int rt_dp_world_rank(const RtDp *dp); /* among every rank of the job: 0 prints and writes */
int rt_dp_size(const RtDp *dp);
/* Bytes of the micro-batch executor's arena (grad_accum > 1); 0 without. */
int64_t rt_dp_micro_arena_bytes(const RtDp *dp);
int64_t rt_dp_rows_factor(const RtDp *dp); /* ranks x grad_accum */
/* Rank 0: path; rank r: path with ".rankR" before its extension. */
const char *rt_dp_trace_path(RtDp *dp, const char *path);
/* The comm handle; threads default to the cores shared among the local
 * ranks (all of the job's ranks on this machine: tp x pp x dp). */
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
/* The model's extra scalar outputs (f32; names stay owned by the caller):
 * rt_dp_step sums them over micro-batches, rt_dp_loss averages them. */
void rt_dp_set_scalars(RtDp *dp, const char *const *names, int n);
/* The step's loss: mean over micro-batches and ranks (last: te's loss);
 * extra[i] likewise for the extra scalars (extra_last: te's values). The
 * same collective agrees on a stop (rt_stop_signal on any rank). */
float rt_dp_loss(RtDp *dp, float last, const float *extra_last, float *extra);
/* The signal that stops the run after this step, 0: none. One rank: its
 * rt_stop_signal; several: the one any rank had at the last rt_dp_loss,
 * so that every rank stops after the same step. */
int rt_dp_stop(const RtDp *dp);
/* Before the first step: the ranks wait for each other, so that what one
 * did longer before the loop is not waited out in the first step's
 * collectives and counted as their exposed time. */
void rt_dp_start_together(RtDp *dp);
/* After a step: records its communication and exposed time; with
 * trace_events, its collectives on the trace's tid 2 (times from t0). */
void rt_dp_after_step(RtDp *dp, Trace *trace, double t0, bool trace_events);
/* The last step's communication (the collectives that landed in it, busy)
 * and the time the compute thread waited for them (exposed), in ms, as
 * this rank measured them; false with one rank or before any step. */
bool rt_dp_last_comm(const RtDp *dp, double *busy_ms, double *exposed_ms);
/* After the last step: waits for the collectives still in flight (ZeRO-1's
 * all-gathers) and adds those that landed after rt_dp_after_step to the
 * last step's figures, its events and (trace_events) the trace. */
void rt_dp_after_last_step(RtDp *dp, Trace *trace, double t0, bool trace_events);
/* The last step's bucket all-reduces (rank 0's view; valid until the next
 * rt_dp_after_step); their count. */
int rt_dp_last_events(const RtDp *dp, const RtCommEvent **ev);
/* "comm: ..." line: median per step of communication, exposed time, overlap. */
void rt_dp_summary(const RtDp *dp, FILE *f);
/* The last step's TP collectives' ms (start to completion) and the ms
 * they held the step up (exposed); false without TP. */
bool rt_dp_last_tp(const RtDp *dp, double *ms, double *exposed_ms);
/* Whether standard output is a terminal; a rank (whose output mpirun always
 * passes through a pseudo-terminal) asks the launcher's KILN_STDOUT_TTY. */
bool rt_stdout_tty(void);
/* The terminal's width in columns (80 when unknown). */
int rt_stdout_columns(void);

/* ---- zero.c: checkpoints of a sharded step (zero=1) ----------------------
 * The unsharded view of the step's optimizer state: a graph of inputs (the
 * params, "adam.step", and each state KIND.P shaped like each param P:
 * "adam.m.P" / "adam.v.P", "sgd.buf.P", "lion.m.P")
 * that the checkpoint writer and reader take in place of the step graph,
 * so the file is the one an unsharded run writes. */
typedef struct RtZero RtZero;
/* NULL when tg holds no sharded optimizer state ("adam.m", "adam.v",
 * "sgd.buf", "lion.m": zero = 0, or SGD without momentum). */
RtZero *rt_zero_open(const Graph *tg);
void rt_zero_close(RtZero *z);
/* Bytes z holds on the host: the full view's moments (4 bytes per param
 * element per sharded state); 0 for NULL. */
int64_t rt_zero_host_bytes(const RtZero *z);
/* The full graph and its values: params and adam.step are vals' buffers
 * (tg's, borrowed), the moments z's own (filled by rt_zero_gather or by a
 * checkpoint reader). */
const Graph *rt_zero_full(RtZero *z, void *const *vals, void ***full_vals);
/* Collective (every rank, in the same order): the ranks' shards of each
 * sharded state in vals (tg's) into the full moments. */
void rt_zero_gather(RtZero *z, RtComm *c, void *const *vals);
/* This rank's shards of each sharded state (into vals, tg's) from the
 * full moments. */
void rt_zero_scatter(RtZero *z, int rank, void **vals);
/* Collective: the full mean gradient of each param, what the output
 * "grad.P" of an unsharded step holds. A sharded step has no "grad.P"
 * outputs (passes/comm.c); its output "grad.shard" is this rank's f32[S]
 * shard of the mean gradient (`shard`: its value after a run). dst, per tg
 * tensor: where to write that param's gradient (numel floats), or NULL. */
void rt_zero_grads(RtZero *z, RtComm *c, const float *shard, float *const *dst);

/* ---- measure_mpi.c: the MPI link between local ranks, measured ----------
 * The ring alpha-beta figures of an all-reduce between nranks ranks on this
 * machine through RtComm (alpha per hop, bw in bytes/s), measured once
 * under mpirun (rt_launch) and cached as CACHE/cpu-mpi-N.txt, keyed by the
 * CPU's model name; remeasure: measure again. tp_alpha_s and tp_bw: the
 * same fit for the TP collectives' path (a TP group of all nranks, the
 * caller's non-blocking all-reduce, rt_comm_tp_start), cached as
 * CACHE/cpu-mpi-tp-N.txt, when want_tp (else 0). False with d set when
 * mpirun or MPI fails. */
typedef struct {
    double alpha_s, bw;
    double tp_alpha_s, tp_bw;
} RtMpiLink;
bool rt_mpi_link(int nranks, const char *cache_dir, bool remeasure, bool want_tp, RtMpiLink *l,
                 Diag *d);
/* `kiln __measure-mpi PATH [tp]`: one rank of that measurement (rank 0
 * writes PATH; tp: the TP link's); the exit status. */
int rt_mpi_measure_main(int argc, char **argv);

/* ---- pp.c: pipeline stages (CPU ranks, or GPUs) ---------------------------
 * Each rank runs one stage of the forward graph's cut (passes/stages.c)
 * over m micro-batches (train.micro_batches, else grad_accum) in its
 * schedule's order, then its optimizer step over the params it owns
 * (zero=1: its AdamW state sharded over the stage's dp group).
 * rt_pp_check refuses what does not run under pp yet (naming the flag or
 * key); rt_pp_build cuts the model (remat per stage when asked for) and
 * returns this stage's step graph (the optimizer, after the passes) for
 * the loop's executor; rt_pp_exec makes the stage's F, B and W executors
 * (on a device with transfers of its own, rt_exec_pp_setup, the tensors
 * crossing a cut go by them, else by MPI through host buffers);
 * rt_pp_step runs one step's micro-batches
 * and writes the step graph's inputs (mean gradients, the norm's sum of
 * squares over all stages, the last micro-batch's loss), with the sum of
 * the others' losses into *micro_loss; rt_pp_whole gathers whole params
 * onto stage 0 (a collective of the pipeline; NULL on other stages) in the
 * model's layout, as one rank writes them. */
typedef struct RtPp RtPp;
bool rt_pp_check(const TrainCfg *c, Diag *d);
RtPp *rt_pp_new(RtComm *comm, const TrainCfg *c);
void rt_pp_free(RtPp *p); /* NULL: nothing */
int rt_pp_micro_batches(const RtPp *p);
Graph *rt_pp_build(RtPp *p, const Graph *model, const PassOpts *po, Diag *d);
/* After rt_pp_build, for a training forward that draws random numbers
 * (dropout): this stage of the evaluation graph `eval` (the script's
 * second run, dropout off), cut where training is cut (its ops matched to
 * the training forward's by script line, in order), so that rt_pp_eval
 * evaluates without dropout as one rank does; nothing without random ops.
 * False with d set when eval's ops are not the forward's minus some. */
bool rt_pp_build_eval(RtPp *p, const Graph *eval, const PassOpts *po, Diag *d);
bool rt_pp_exec(RtPp *p, const ExecOpts *eo, Diag *d);
double rt_pp_flops(const RtPp *p); /* FLOPs of this stage's F and FB runs per step */
bool rt_pp_step(RtPp *p, Exec *te, const Graph *tg, const DataBatch *b, int64_t dp_rank,
                uint64_t seed, int64_t step, double *micro_loss, float *last_loss, Diag *d);
const Graph *rt_pp_whole(RtPp *p, const Graph *tg, void *const *vals, void ***whole);
void rt_pp_whole_free(const RtPp *p, void **whole);
/* Checkpoints hold every stage's params and state whole, in one file that
 * stage 0 writes (the same tensors one rank's checkpoint holds; a tied
 * param once): rt_pp_ckpt_whole gathers them onto stage 0 (a collective
 * of the pipeline; NULL on the other stages; free with rt_pp_ckpt_free);
 * rt_pp_ckpt_load reads this stage's tensors of such a file (or of one
 * rank's checkpoint), so any layout resumes any other. */
const Graph *rt_pp_ckpt_whole(RtPp *p, const Graph *tg, void *const *vals, void ***whole);
void rt_pp_ckpt_free(const RtPp *p, void **whole);
bool rt_pp_ckpt_load(RtPp *p, const char *path, const Graph *tg, void **vals, CkptMeta *m,
                     Diag *d);
/* --init-from under pp: a view of every param of the model, whole (this
 * stage's hold vals' values; the others zeros) to load a file into, and
 * this stage's params taken back from it (vals NULL: only freed). */
const Graph *rt_pp_params_view(RtPp *p, const Graph *tg, void *const *vals, void ***whole);
void rt_pp_params_take(RtPp *p, const Graph *tg, void **vals, void **whole);
/* Evaluation: the model's b rows from row0 through every stage's F (with
 * the step's params), the loss on every stage. */
bool rt_pp_eval(RtPp *p, Exec *te, const Graph *tg, const DataBatch *b, int64_t row0,
                uint64_t seed, int64_t step, float *loss, Diag *d);
/* This step's F, B, W and receives on the trace (track 6); the per-step
 * medians of each stage's time running programs and waiting in receives
 * (a collective of the pipeline; stage 0 of dp rank 0 prints). */
void rt_pp_trace(const RtPp *p, Trace *trace, double t0);
void rt_pp_summary(const RtPp *p, FILE *f);
/* The cut and the schedule (the `stages` dump). */
void rt_pp_print(const RtPp *p, FILE *f);
/* The dp layer's pipeline (NULL without pp). */
RtPp *rt_dp_pp(const RtDp *dp);

/* ---- pp_balance.c: --pp-balance time --------------------------------------
 * The cut of fwd into n stages balanced by measured time: world rank 0
 * times each piece of pass_stage_pieces (its F, B and W as one program on
 * the CPU, one thread, on zeros) and broadcasts the times; every rank then
 * cuts with them (pass_stage_cut_timed), so all agree. A collective: every
 * rank calls it. stage_s (n entries): each stage's measured seconds per
 * micro-batch. False with d set (tp > 1, a piece that does not compile or
 * run: on every rank). */
bool rt_pp_cut_timed(RtComm *comm, const Graph *fwd, int n, const PassOpts *po,
                     PassStageCut *c, double *stage_s, Diag *d);

#endif
