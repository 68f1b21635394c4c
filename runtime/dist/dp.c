/* dp.c - data parallelism and gradient accumulation inside the training
 * loop: which rows of a global batch each rank and micro-batch trains on,
 * the micro-batch executor, the loss averaged over ranks, and the per-step
 * communication report.
 *
 * The data source is opened with the global batch (ranks x grad_accum x the
 * model's batch b); rank r, micro-batch k reads rows [(r*K + k)*b, +b), so
 * N ranks at batch b with K micro-batches see exactly the rows one rank at
 * batch N*K*b sees. Micro-batches 0..K-2 run the micro graph (forward,
 * backward, accum.P += grad.P); the last runs the training step, which
 * starts from accum.P (pass_comm). */
#include "codegen.h"
#include "dist.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

struct RtDp {
    RtComm *comm;
    int rank, size, K;
    Graph *mg;   /* micro-batch graph (K > 1) */
    Exec *me;
    int *param_pair; /* per tg tensor: the micro graph's tensor of the same name, -1 */
    int ntg;
    /* zero=1: params whose gather the last step left in flight go into the
     * micro executor in its first run, right before their first reader
     * there (link_gathers) */
    Exec *te;        /* the training step's executor, once linked */
    const Graph *tg;
    int *gbucket;    /* per tg tensor: its deferred gather bucket in te, -1 */
    bool *copied;    /* per bucket: its params are in the micro executor this step */
    int ngb;
    void *buf;       /* staging for copies */
    size_t cap;
    double micro_loss; /* sum over this step's micro-batches */
    int nmicro;
    const char **scalar; /* the extra scalar outputs (rt_dp_set_scalars) */
    int nscalar;
    double *micro_scalar; /* their sums over this step's micro-batches */
    VEC(RtCommEvent) last_ev; /* the last step's collectives */
    VEC(double) comm_ms;
    VEC(double) exposed_ms;
    VEC(double) coll_ms[3], coll_exposed_ms[3]; /* per CgColl (zero=1) */
    VEC(double) tp_ms, tp_exposed_ms; /* per step: the TP collectives' time, exposed */
    int tp, tp_n;         /* TP group size; collectives per step (the last step's) */
    int64_t tp_bytes;     /* bytes per step (the last step's) */
    float *by_rank;       /* per rank: median and mean exposed ms per step (after the loop) */
    bool sharded;         /* a step had reduce-scatters or all-gathers */
    bool have_comm;
    char *trace_path;
    int stop; /* agreed at the last rt_dp_loss (several ranks) */
    RtPp *pp; /* pipeline stages (pp > 1; runtime/dist/pp.c) */
};

RtPp *rt_dp_pp(const RtDp *dp) { return dp ? dp->pp : NULL; }

bool rt_dp_open(const TrainCfg *c, RtDp **out, Diag *d)
{
    RtDp *dp = xcalloc(1, sizeof *dp);
    *out = dp;
    dp->K = 1;
    if (c->grad_accum < 1) {
        snprintf(d->msg, sizeof d->msg, "grad_accum must be at least 1 (got %lld)",
                 (long long)c->grad_accum);
        return false;
    }
    dp->K = (int)c->grad_accum;
    if (!(c->comm_timeout > 0)) {
        snprintf(d->msg, sizeof d->msg, "comm_timeout must be positive seconds (got %g)",
                 c->comm_timeout);
        return false;
    }
    if (!(c->bucket_mb > 0)) {
        snprintf(d->msg, sizeof d->msg, "bucket_mb must be positive (got %g)", c->bucket_mb);
        return false;
    }
    int tp = c->tp > 1 ? (int)c->tp : 1, pp = c->pp > 1 ? (int)c->pp : 1;
    if (!rt_comm_open_pp(c->comm_timeout, tp, pp, &dp->comm, d))
        return false;
    if (pp > 1 && !dp->comm) {
        snprintf(d->msg, sizeof d->msg,
                 "--pp %d needs %d ranks or a multiple (expected --nproc N with N a multiple "
                 "of %d, got one rank)", pp, pp, pp);
        return false;
    }
    if (pp > 1) { /* the micro-batches are the pipeline's, not the micro graph's */
        dp->pp = rt_pp_new(dp->comm, c);
        dp->K = rt_pp_micro_batches(dp->pp);
    }
    if (tp > 1 && !dp->comm) {
        snprintf(d->msg, sizeof d->msg,
                 "tp = %d needs %d ranks or a multiple (expected --nproc N with N a multiple "
                 "of %d, got one rank)", tp, tp, tp);
        return false;
    }
    /* rank and size: the dp group's (the data each rank reads); the TP
     * ranks of one dp group read the same rows */
    dp->rank = rt_comm_rank(dp->comm);
    dp->size = rt_comm_size(dp->comm);
    rt_rank_status("running %d", (int)getpid());
    /* rank 0 of the world prints; the others' standard output goes nowhere
     * (errors still reach standard error) */
    if (rt_comm_world_rank(dp->comm) > 0 && !freopen("/dev/null", "w", stdout))
        die("rt_dp_open: cannot reopen standard output");
    return true;
}

int rt_dp_close(RtDp *dp, int rc)
{
    if (!dp)
        return rc;
    rt_rank_status("exit %d", rc);
    /* every rank left the loop after the same step (rt_dp_loss): each
     * reaches the closing collective */
    bool agreed_stop = dp->size > 1 && dp->stop && rc == 128 + dp->stop;
    rt_pp_free(dp->pp);
    if (dp->me)
        rt_exec_destroy(dp->me);
    if (dp->mg)
        ir_free(dp->mg);
    free(dp->param_pair);
    free(dp->gbucket);
    free(dp->copied);
    free(dp->buf);
    free(dp->scalar);
    free(dp->micro_scalar);
    vec_free(&dp->last_ev);
    vec_free(&dp->comm_ms);
    vec_free(&dp->exposed_ms);
    vec_free(&dp->tp_ms);
    vec_free(&dp->tp_exposed_ms);
    for (int k = 0; k < 3; k++) {
        vec_free(&dp->coll_ms[k]);
        vec_free(&dp->coll_exposed_ms[k]);
    }
    free(dp->trace_path);
    free(dp->by_rank);
    if (rc == 0 || agreed_stop)
        rt_comm_close(dp->comm);
    free(dp);
    return agreed_stop && rt_rank_stop_requested() ? 0 : rc;
}

int rt_dp_rank(const RtDp *dp) { return dp ? dp->rank : 0; }
int rt_dp_tp_rank(const RtDp *dp) { return dp ? rt_comm_tp_rank(dp->comm) : 0; }
int rt_dp_world_rank(const RtDp *dp) { return dp ? rt_comm_world_rank(dp->comm) : 0; }
int rt_dp_size(const RtDp *dp) { return dp ? dp->size : 1; }

int64_t rt_dp_micro_arena_bytes(const RtDp *dp)
{
    return dp && dp->me ? rt_exec_arena_bytes(dp->me) : 0;
}
int64_t rt_dp_rows_factor(const RtDp *dp) { return dp ? (int64_t)dp->size * dp->K : 1; }

const char *rt_dp_trace_path(RtDp *dp, const char *path)
{
    int rank = rt_dp_world_rank(dp);
    if (!path || !dp || rank == 0)
        return path;
    free(dp->trace_path);
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash))
        dp->trace_path = xasprintf("%.*s.rank%d%s", (int)(dot - path), path, rank, dot);
    else
        dp->trace_path = xasprintf("%s.rank%d", path, rank);
    return dp->trace_path;
}

void rt_dp_exec_opts(const RtDp *dp, ExecOpts *eo)
{
    eo->comm = dp->comm;
    eo->tp_comm = rt_comm_tp(dp->comm) > 1 ? dp->comm : NULL;
    /* every rank of the job on this machine shares its cores: tp x pp x dp
     * of them, not only the dp group (a tp = 2 or pp = 2 job on 2 ranks,
     * dp = 1, gave each rank every core, twice the threads the cores have) */
    if (eo->threads <= 0 && rt_comm_world_size(dp->comm) > 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int local = rt_comm_local_size(dp->comm);
        int t = (int)(cores / (local > 0 ? local : 1));
        eo->threads = t < 1 ? 1 : t;
    }
}

bool rt_dp_build(RtDp *dp, const Graph *model, const PassOpts *po, const ExecOpts *eo,
                 const Graph *tg, Diag *d)
{
    for (int i = 0; i < tg->ops.n; i++) {
        const Op *op = &tg->ops.v[i];
        /* zero=1: shard_pack, the reduce-scatters and the all-gathers move
         * f32 elements (runtime/exec.c, mpi.c); a bf16 param's f32 master
         * copy plans (passes/optimizer.c) but does not run. (On the CPU the
         * backend refuses bf16 kernels before this.) */
        bool sh = op->code == OP_SHARD_PACK || op->code == OP_REDUCE_SCATTER_START ||
                  op->code == OP_ALL_GATHER_START;
        for (int j = op->code == OP_SHARD_PACK ? 0 : 1; sh && j < op->nin; j++) {
            const Tensor *t = &tg->t.v[op->in[j]];
            if (t->s.dtype != DT_F32 && t->kind == TK_PARAM) {
                snprintf(d->msg, sizeof d->msg,
                         "%s:%d: zero=1 with %s params does not run yet: the ranks' "
                         "reduce-scatter and all-gather move f32 only (expected param \"%s\" "
                         "to be f32, got %s; `kiln compile --set zero=1` plans it, with its "
                         "f32 master copy)",
                         op->loc.file ? op->loc.file : "?", op->loc.line,
                         dtype_name(t->s.dtype), t->name, dtype_name(t->s.dtype));
                return false;
            }
        }
        for (int j = 0; op->code == OP_ALLREDUCE_START && j < op->nin; j++) {
            DType dt = tg->t.v[op->in[j]].s.dtype;
            if (dt != DT_F32) {
                snprintf(d->msg, sizeof d->msg,
                         "%s:%d: data-parallel training averages f32 gradients only (got a "
                         "%s gradient; train with precision=f32)",
                         op->loc.file ? op->loc.file : "?", op->loc.line, dtype_name(dt));
                return false;
            }
        }
    }
    if (dp->pp)
        return rt_pp_exec(dp->pp, eo, d);
    if (dp->K <= 1)
        return true;
    dp->mg = ir_clone(model);
    if (!pass_partition(dp->mg, po, d) || !pass_autodiff(dp->mg, po, d) ||
        !pass_comm_micro(dp->mg, d) ||
        !pass_simplify(dp->mg, po, d) || !pass_schedule(dp->mg, po, d))
        return false;
    char err[1024];
    if (!ir_verify(dp->mg, err, sizeof err))
        die("micro-batch graph invalid: %s", err);
    ExecOpts mo = *eo;
    mo.comm = NULL;
    mo.profile = false;
    if (!(dp->me = rt_exec_create(dp->mg, &mo, d)))
        return false;
    dp->ntg = tg->t.n;
    dp->param_pair = xmalloc(sizeof(int) * (size_t)(tg->t.n + 1));
    for (int i = 0; i < tg->t.n; i++) {
        const Tensor *t = &tg->t.v[i];
        dp->param_pair[i] = -1;
        if (t->kind == TK_PARAM || rt_model_state(t) ||
            (t->kind == TK_STATE && strncmp(t->name, "accum.", 6) == 0))
            dp->param_pair[i] = ir_find_tensor(dp->mg, t->name);
    }
    return true;
}

static const Tensor *input_named(const Graph *g, const char *name)
{
    int id = ir_find_tensor(g, name);
    return id >= 0 && g->t.v[id].kind == TK_INPUT ? &g->t.v[id] : NULL;
}

/* Writes rows [row0, row0 + b) of the global batch into g's data inputs. */
static void feed_rows(Exec *e, const Graph *g, const DataBatch *b, int64_t row0)
{
    rt_data_feed(e, g, b, row0);
}

static int64_t model_rows(const Graph *g)
{
    const Tensor *t = input_named(g, "tokens");
    if (!t)
        t = input_named(g, "x");
    return t ? t->s.dim[0] : 0;
}

static void copy_tensor(Exec *from, int tf, Exec *to, int tt, const Graph *g, void **buf,
                        size_t *cap)
{
    const Tensor *t = &g->t.v[tf];
    size_t n = (size_t)shape_numel(&t->s) * (size_t)dtype_size(t->s.dtype);
    if (n > *cap) {
        free(*buf);
        *buf = xmalloc(n);
        *cap = n;
    }
    rt_exec_read(from, tf, *buf);
    rt_exec_write(to, tt, *buf);
}

/* rt_exec_before_read's callback in the micro executor: bucket b's params,
 * once per step, from the step's executor (waiting for their gather). */
static void copy_bucket(void *arg, int b)
{
    RtDp *dp = arg;
    if (dp->copied[b])
        return;
    dp->copied[b] = true;
    for (int i = 0; i < dp->ntg; i++)
        if (dp->gbucket[i] == b)
            copy_tensor(dp->te, i, dp->me, dp->param_pair[i], dp->tg, &dp->buf, &dp->cap);
}

/* zero=1 with grad_accum > 1, once: the step executor's deferred gathers
 * land in the first micro-batch where it first reads their params, not
 * all before it (the gathers then overlap its forward, as with
 * grad_accum 1 they overlap the step's own). */
static void link_gathers(RtDp *dp, Exec *te, const Graph *tg)
{
    dp->te = te;
    dp->tg = tg;
    dp->gbucket = xmalloc(sizeof(int) * (size_t)(tg->t.n + 1));
    for (int i = 0; i < tg->t.n; i++) {
        dp->gbucket[i] = dp->param_pair[i] >= 0 && tg->t.v[i].kind == TK_PARAM
                             ? rt_exec_gather_bucket(te, i)
                             : -1;
        if (dp->gbucket[i] + 1 > dp->ngb)
            dp->ngb = dp->gbucket[i] + 1;
    }
    dp->copied = xcalloc((size_t)dp->ngb + 1, sizeof(bool));
    int *mine = xmalloc(sizeof(int) * (size_t)(tg->t.n + 1));
    for (int b = 0; b < dp->ngb; b++) {
        int n = 0;
        for (int i = 0; i < tg->t.n; i++)
            if (dp->gbucket[i] == b)
                mine[n++] = dp->param_pair[i];
        if (n)
            rt_exec_before_read(dp->me, mine, n, copy_bucket, dp, b);
    }
    free(mine);
}

bool rt_dp_step(RtDp *dp, Exec *te, const Graph *tg, const DataBatch *global, uint64_t seed,
                int64_t step, Diag *d)
{
    int64_t b = model_rows(tg);
    int64_t base = (int64_t)dp->rank * dp->K * b;
    rt_comm_stats_reset(dp->comm);
    dp->micro_loss = 0;
    dp->nmicro = 0;
    for (int i = 0; i < dp->nscalar; i++)
        dp->micro_scalar[i] = 0;
    if (dp->pp) {
        float last;
        if (!rt_pp_step(dp->pp, te, tg, global, dp->rank, seed, step, &dp->micro_loss, &last,
                        d))
            return false;
        dp->nmicro = dp->K - 1;
        return true;
    }
    if (dp->K > 1) {
        if (!dp->gbucket)
            link_gathers(dp, te, tg);
        void *buf = NULL;
        size_t cap = 0;
        int lt = ir_find_output(dp->mg, "loss");
        /* params into the micro executor (those of a gather in flight: in
         * its first run, copy_bucket), its accumulators to zero */
        for (int k = 0; k < dp->ngb; k++)
            dp->copied[k] = false;
        for (int i = 0; i < tg->t.n; i++) {
            int m = dp->param_pair[i];
            if (m < 0)
                continue;
            const Tensor *t = &tg->t.v[i];
            if ((t->kind == TK_PARAM && dp->gbucket[i] < 0) || rt_model_state(t)) {
                /* model state (BatchNorm's) goes through the micro-batches
                 * and back (below) as one forward after another would */
                copy_tensor(te, i, dp->me, m, tg, &buf, &cap);
            } else if (t->kind != TK_PARAM) {
                size_t n = (size_t)shape_numel(&t->s) * (size_t)dtype_size(t->s.dtype);
                if (n > cap) {
                    free(buf);
                    buf = xmalloc(n);
                    cap = n;
                }
                memset(buf, 0, n);
                rt_exec_write(dp->me, m, buf);
            }
        }
        for (int k = 0; k < dp->K - 1; k++) {
            feed_rows(dp->me, dp->mg, global, base + k * b);
            if (!rt_exec_run(dp->me, seed, step, d)) {
                free(buf);
                return false;
            }
            float l;
            if (lt >= 0 && dp->mg->t.v[lt].s.dtype == DT_F32) {
                rt_exec_read(dp->me, lt, &l);
                dp->micro_loss += l;
                dp->nmicro++;
            }
            for (int i = 0; i < dp->nscalar; i++) {
                int st = ir_find_output(dp->mg, dp->scalar[i]);
                if (st >= 0 && dp->mg->t.v[st].s.dtype == DT_F32) {
                    rt_exec_read(dp->me, st, &l);
                    dp->micro_scalar[i] += l;
                }
            }
        }
        for (int k = 0; k < dp->ngb; k++) /* read by no micro-batch step */
            copy_bucket(dp, k);
        int acc = -1;
        for (int i = 0; i < tg->t.n; i++)
            if (dp->param_pair[i] >= 0 && tg->t.v[i].kind == TK_STATE) {
                copy_tensor(dp->me, dp->param_pair[i], te, i, dp->mg, &buf, &cap);
                acc = i;
            }
        /* a micro-batch whose loss is not finite: NaN in an accumulated
         * gradient (all ones bits: NaN in every float dtype), so the step's
         * gradient norm is NaN on every rank and the optimizer applies no
         * update (passes/optimizer.c) */
        if (acc >= 0 && !isfinite(dp->micro_loss)) {
            memset(buf, 0xff, cap);
            rt_exec_write(te, acc, buf);
        }
        free(buf);
    }
    feed_rows(te, tg, global, base + (int64_t)(dp->K - 1) * b);
    return true;
}

int rt_dp_last_events(const RtDp *dp, const RtCommEvent **ev)
{
    *ev = dp ? dp->last_ev.v : NULL;
    return dp ? dp->last_ev.n : 0;
}

void rt_dp_set_scalars(RtDp *dp, const char *const *names, int n)
{
    free(dp->scalar);
    free(dp->micro_scalar);
    vec_free(&dp->last_ev);
    dp->scalar = xcalloc((size_t)n + 1, sizeof *dp->scalar);
    dp->micro_scalar = xcalloc((size_t)n + 1, sizeof *dp->micro_scalar);
    for (int i = 0; i < n; i++)
        dp->scalar[i] = names[i];
    dp->nscalar = n;
}

float rt_dp_loss(RtDp *dp, float last, const float *extra_last, float *extra)
{
    int sig = rt_stop_signal(), n = dp->nscalar;
    double *v = xmalloc(sizeof(double) * (size_t)(n + 3));
    double div = (double)(dp->nmicro + 1);
    v[0] = ((double)last + dp->micro_loss) / div;
    for (int i = 0; i < n; i++)
        v[1 + i] = ((double)extra_last[i] + (dp->nmicro ? dp->micro_scalar[i] : 0)) / div;
    v[n + 1] = sig == SIGINT;
    v[n + 2] = sig != 0 && sig != SIGINT;
    rt_comm_step_mean(dp->comm, v, dp->size > 1 ? n + 3 : n + 1);
    dp->stop = v[n + 2] > 0 ? SIGTERM : v[n + 1] > 0 ? SIGINT : 0;
    float loss = (float)v[0];
    for (int i = 0; i < n; i++)
        extra[i] = (float)v[1 + i];
    free(v);
    return loss;
}

void rt_dp_start_together(RtDp *dp)
{
    if (!dp || dp->size <= 1)
        return;
    /* KILN_TEST_LATE_RANK=R:MS (tests): rank R comes MS ms late */
    const char *late = getenv("KILN_TEST_LATE_RANK");
    int lr, ms;
    if (late && sscanf(late, "%d:%d", &lr, &ms) == 2 && lr == dp->rank && ms > 0)
        usleep((useconds_t)ms * 1000);
    double v = 0;
    rt_comm_mean(dp->comm, &v, 1);
}

int rt_dp_stop(const RtDp *dp)
{
    return !dp || dp->size <= 1 ? rt_stop_signal() : dp->stop;
}

/* ev[0..n) on the trace (times from t0): tid 2 all-reduces (and host
 * collectives), 3 reduce-scatters, 4 all-gathers. */
static void trace_comm(const RtDp *dp, Trace *trace, double t0, const RtCommEvent *ev, int n)
{
    static const char *const kind[3] = {"allreduce", "reduce-scatter", "all-gather"};
    if (dp->sharded) {
        rt_trace_thread_name(trace, 3, "reduce-scatter (first steps)");
        rt_trace_thread_name(trace, 4, "all-gather (first steps)");
    }
    for (int i = 0; i < n; i++) {
        char name[48];
        int k = ev[i].bucket >= 0 && ev[i].coll > 0 && ev[i].coll < 3 ? ev[i].coll : 0;
        if (ev[i].bucket >= 0)
            snprintf(name, sizeof name, "%s bucket %d", kind[k], ev[i].bucket);
        else
            snprintf(name, sizeof name, "allreduce host");
        rt_trace_event(trace, name, "comm", 1e6 * (ev[i].start - t0),
                       1e6 * (ev[i].end - ev[i].start), 2 + k);
    }
}

/* The step's TP collectives: their time and the part that held the step
 * up (exposed), and on the trace's
 * tid 5 for the first steps. */
static void tp_after_step(RtDp *dp, Trace *trace, double t0, bool trace_events)
{
    dp->tp = rt_comm_tp(dp->comm);
    if (dp->tp <= 1)
        return;
    RtTpStats st;
    rt_comm_tp_stats(dp->comm, &st);
    vec_push(&dp->tp_ms, 1e3 * st.s);
    vec_push(&dp->tp_exposed_ms, 1e3 * st.exposed_s);
    dp->tp_n = st.n;
    dp->tp_bytes = st.bytes;
    if (!trace || !trace_events)
        return;
    static const char *const kind[3] = {"tp all-reduce", "tp reduce-scatter", "tp all-gather"};
    rt_trace_thread_name(trace, 5, "tensor parallel (first steps)");
    for (int i = 0; i < st.nev; i++)
        rt_trace_event(trace, kind[st.ev[i].coll >= 0 && st.ev[i].coll < 3 ? st.ev[i].coll : 0],
                       "comm", 1e6 * (st.ev[i].start - t0),
                       1e6 * (st.ev[i].end - st.ev[i].start), 5);
}

bool rt_dp_last_tp(const RtDp *dp, double *ms, double *exposed_ms)
{
    if (!dp || dp->tp_ms.n == 0)
        return false;
    *ms = dp->tp_ms.v[dp->tp_ms.n - 1];
    *exposed_ms = dp->tp_exposed_ms.v[dp->tp_exposed_ms.n - 1];
    return true;
}

void rt_dp_after_step(RtDp *dp, Trace *trace, double t0, bool trace_events)
{
    if (dp->pp && trace_events)
        rt_pp_trace(dp->pp, trace, t0);
    if (dp->comm)
        tp_after_step(dp, trace, t0, trace_events);
    if (!dp->comm || dp->size == 1)
        return;
    RtCommStats st;
    rt_comm_stats(dp->comm, &st);
    double ms = 0;
    for (int i = 0; i < st.nev; i++)
        if (st.ev[i].bucket >= 0)
            ms += 1e3 * (st.ev[i].end - st.ev[i].start);
    dp->have_comm = true;
    dp->last_ev.n = 0;
    for (int i = 0; i < st.nev; i++)
        if (st.ev[i].bucket >= 0)
            vec_push(&dp->last_ev, st.ev[i]);
    vec_push(&dp->comm_ms, ms);
    vec_push(&dp->exposed_ms, 1e3 * st.exposed_s);
    double by[3] = {0, 0, 0};
    for (int i = 0; i < st.nev; i++)
        if (st.ev[i].bucket >= 0 && st.ev[i].coll >= 0 && st.ev[i].coll < 3) {
            by[st.ev[i].coll] += 1e3 * (st.ev[i].end - st.ev[i].start);
            dp->sharded |= st.ev[i].coll != 0;
        }
    for (int k = 0; k < 3; k++) {
        vec_push(&dp->coll_ms[k], by[k]);
        vec_push(&dp->coll_exposed_ms[k], 1e3 * st.exposed_by[k]);
    }
    if (trace && trace_events)
        trace_comm(dp, trace, t0, st.ev, st.nev);
}

bool rt_dp_last_comm(const RtDp *dp, double *busy_ms, double *exposed_ms)
{
    if (!dp || dp->size == 1 || dp->comm_ms.n == 0)
        return false;
    *busy_ms = dp->comm_ms.v[dp->comm_ms.n - 1];
    *exposed_ms = dp->exposed_ms.v[dp->exposed_ms.n - 1];
    return true;
}

/* The mean of the steps' exposed ms (the median hides the few that stall). */
static double mean_exposed(const RtDp *dp)
{
    double mean = 0;
    for (int i = 0; i < dp->exposed_ms.n; i++)
        mean += dp->exposed_ms.v[i] / dp->exposed_ms.n;
    return mean;
}

void rt_dp_after_last_step(RtDp *dp, Trace *trace, double t0, bool trace_events)
{
    if (!dp->comm || dp->size == 1 || !dp->have_comm)
        return;
    /* every rank's exposed time for the report (rank 0 prints it): the
     * ranks wait for different buckets (zero=1: a rank waits for the
     * buckets of its own shard) */
    float mine[2] = {(float)ir_median(dp->exposed_ms.v, dp->exposed_ms.n),
                     (float)mean_exposed(dp)};
    dp->by_rank = xmalloc(sizeof(float) * 2 * (size_t)dp->size);
    rt_comm_allgather(dp->comm, mine, 2, dp->by_rank);
    rt_comm_drain(dp->comm);
    rt_comm_stats_reset(dp->comm); /* keeps the gathers landed since the step */
    RtCommStats st;
    rt_comm_stats(dp->comm, &st);
    if (st.nev == 0)
        return;
    int last = dp->comm_ms.n - 1;
    for (int i = 0; i < st.nev; i++) {
        if (st.ev[i].bucket < 0)
            continue;
        double ms = 1e3 * (st.ev[i].end - st.ev[i].start);
        dp->comm_ms.v[last] += ms;
        if (st.ev[i].coll >= 0 && st.ev[i].coll < 3)
            dp->coll_ms[st.ev[i].coll].v[last] += ms;
        vec_push(&dp->last_ev, st.ev[i]);
    }
    if (trace && trace_events)
        trace_comm(dp, trace, t0, st.ev, st.nev);
}

void rt_dp_summary(const RtDp *dp, FILE *f)
{
    if (dp && dp->pp) { /* its dp means are its own (rt_pp_summary) */
        rt_pp_summary(dp->pp, f);
        if (dp->tp > 1 && dp->tp_ms.n > 0) {
            char b[32];
            fprintf(f,
                    "tensor-parallel comm: tp = %d | per step (median of %d, this rank): %d "
                    "collectives, %s, %.2f ms, all exposed (they block the step)\n",
                    dp->tp, dp->tp_ms.n, dp->tp_n,
                    ir_fmt_bytes((double)dp->tp_bytes, 2, b, sizeof b),
                    ir_median(dp->tp_ms.v, dp->tp_ms.n));
        }
        return;
    }
    if (dp && dp->tp > 1 && dp->tp_ms.n > 0) {
        char b[32];
        fprintf(f,
                "tensor-parallel comm: tp = %d | per step (median of %d, this rank): %d "
                "collectives, %s, %.2f ms, %.2f ms exposed\n",
                dp->tp, dp->tp_ms.n, dp->tp_n, ir_fmt_bytes((double)dp->tp_bytes, 2, b, sizeof b),
                ir_median(dp->tp_ms.v, dp->tp_ms.n),
                ir_median(dp->tp_exposed_ms.v, dp->tp_exposed_ms.n));
    }
    if (!dp || dp->size == 1)
        return;
    int n = dp->comm_ms.n;
    double comm = ir_median(dp->comm_ms.v, n), exposed = ir_median(dp->exposed_ms.v, n);
    double overlap = comm > 0 ? 100.0 * (1.0 - exposed / comm) : 0;
    if (overlap < 0)
        overlap = 0;
    /* the mean as well: a median of steps that mostly wait nothing is 0
     * and hides the few that stall */
    double mean = mean_exposed(dp);
    fprintf(f,
            "comm: %d ranks x %d micro-batch%s | per step (median of %d, rank 0): "
            "communication %.2f ms | exposed %.2f ms | overlap %.1f%% | mean exposed %.2f ms\n",
            dp->size, dp->K, dp->K == 1 ? "" : "es", n, comm, exposed, overlap, mean);
    if (dp->sharded) { /* zero=1: the same per collective */
        static const char *const kind[3] = {"all-reduce", "reduce-scatter", "all-gather"};
        fprintf(f, "comm by collective (zero=1, median per step):");
        for (int k = 0; k < 3; k++)
            fprintf(f, "%s %s %.2f ms, exposed %.2f ms", k ? " |" : "", kind[k],
                    ir_median(dp->coll_ms[k].v, dp->coll_ms[k].n),
                    ir_median(dp->coll_exposed_ms[k].v, dp->coll_exposed_ms[k].n));
        fputc('\n', f);
    }
    if (dp->by_rank) {
        fprintf(f, "comm by rank (exposed per step, median / mean):");
        for (int r = 0; r < dp->size; r++)
            fprintf(f, "%s rank %d %.2f / %.2f ms", r ? " |" : "", r, dp->by_rank[2 * r],
                    dp->by_rank[2 * r + 1]);
        fputc('\n', f);
    }
}

bool rt_stdout_tty(void)
{
    const char *v = getenv("KILN_STDOUT_TTY");
    if (v && getenv("OMPI_COMM_WORLD_SIZE"))
        return strcmp(v, "1") == 0;
    return isatty(1);
}

int rt_stdout_columns(void)
{
    struct winsize ws;
    if (ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    const char *c = getenv("COLUMNS");
    int n = c ? atoi(c) : 0;
    return n > 0 && n < 10000 ? n : 80;
}
