/* pp.c - pipeline parallelism on CPU ranks: each rank runs one stage of
 * the forward graph's cut (passes/stages.c) over m micro-batches in the
 * order of its schedule (gpipe, 1f1b), sending activations forward and
 * their gradients back by MPI point to point, then its own optimizer step.
 *
 * Per stage, three programs:
 *   F    the stage's forward: data and "pp.recv.K" in, "pp.send.K" out
 *        (not on the last stage);
 *   FB   the stage's forward and backward (autodiff of the backward stage
 *        graph): its param gradients and, for "pp.recv.K", the gradients
 *        sent back. A non-last stage's B recomputes its forward from the
 *        activation it received (stashed per micro-batch in flight): F and
 *        B are not yet split into F / B / W programs with the forward's
 *        tensors stashed (that is the next step; zero-bubble schedules need
 *        it). The last stage runs FB at its F slot.
 *   step the optimizer over the stage's params: inputs "pp.grad.P" (the
 *        mean over micro-batches, summed as grad_accum sums them), the
 *        global gradient norm's sum of squares "pp.sumsq" (summed over the
 *        stages, a tied param counted once) and "pp.loss" (the last
 *        micro-batch's loss, NaN when any was not finite).
 * Sends return at once (their buffers live until the step's end);
 * receives block, with the comm timeout. */
#include "dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int64_t numel;
    int bg;      /* its gradient output in the FB graph */
    int step;    /* its "pp.grad.P" input in the step graph (-1: frozen) */
    bool norm;   /* counted in the norm here (its first owning stage) */
    int *owners; /* stages reading it (tied: more than one) */
    int nown;
    float *acc;
} PpParam;

struct RtPp {
    RtComm *comm;
    int n, s, m, sched;
    Graph *fwd;     /* the forward graph the cut is of (after attention) */
    PassStageCut cut;
    Graph *fg, *bg; /* F (NULL on the last stage) and FB */
    Exec *fe, *be;
    int nrecv, nsend;
    int *recv_f, *recv_b, *recv_grad, *send_f, *seed_b; /* tensor ids per K */
    int64_t *recv_off, *send_off; /* byte offsets of K in a message; [n] = its size */
    VEC(PpParam) ps;
    int loss_b;
    PassStageAct *acts;
    char *xstash;   /* m received activations */
    char *ysend;    /* m sent activations */
    char *gsend;    /* m sent gradients */
    char *seed;     /* one received gradient */
    float *tmp;
    int64_t rows;   /* the model's batch b */
    double *losses; /* m (+1: a non-finite flag) */
    double flops;
};

bool rt_pp_check(const TrainCfg *c, const TrainOpts *o, Diag *d)
{
    const char *bad = NULL;
    if (c->tp > 1)
        bad = "--tp (tp x pp runs are not built yet)";
    else if (c->zero)
        bad = "zero = 1";
    else if (o->resume || o->checkpoint || c->checkpoint || c->checkpoint_every > 0)
        bad = "checkpoints (--checkpoint, --resume, train.checkpoint)";
    else if (o->init_from)
        bad = "--init-from";
    else if (o->log_dir)
        bad = "--log-dir";
    else if (c->sample_every > 0)
        bad = "sample_every";
    else if (o->device && strcmp(o->device, "cuda") == 0)
        bad = "--device cuda";
    else if (c->early_stop_metric)
        bad = "early_stop";
    if (bad) {
        snprintf(d->msg, sizeof d->msg,
                 "--pp %lld: pipeline stages do not run with %s yet (expected pp = 1 "
                 "with it, or a run without it)", (long long)c->pp, bad);
        return false;
    }
    if (pass_stage_schedule_parse(c->schedule) < 0) {
        snprintf(d->msg, sizeof d->msg, "schedule: expected 1f1b or gpipe, got \"%s\"",
                 c->schedule);
        return false;
    }
    return true;
}

RtPp *rt_pp_new(RtComm *comm, const TrainCfg *c)
{
    RtPp *p = xcalloc(1, sizeof *p);
    p->comm = comm;
    p->n = rt_comm_pp(comm);
    p->s = rt_comm_pp_stage(comm);
    p->m = (int)(c->micro_batches > 0 ? c->micro_batches : c->grad_accum);
    if (p->m < 1)
        p->m = 1;
    p->sched = pass_stage_schedule_parse(c->schedule);
    return p;
}

int rt_pp_micro_batches(const RtPp *p) { return p ? p->m : 1; }

void rt_pp_free(RtPp *p)
{
    if (!p)
        return;
    if (p->fe)
        rt_exec_destroy(p->fe);
    if (p->be)
        rt_exec_destroy(p->be);
    if (p->fg)
        ir_free(p->fg);
    if (p->bg)
        ir_free(p->bg);
    pass_stage_cut_free(&p->cut);
    if (p->fwd)
        ir_free(p->fwd);
    for (int i = 0; i < p->ps.n; i++) {
        free(p->ps.v[i].owners);
        free(p->ps.v[i].acc);
    }
    vec_free(&p->ps);
    free(p->recv_f);
    free(p->recv_b);
    free(p->recv_grad);
    free(p->send_f);
    free(p->seed_b);
    free(p->recv_off);
    free(p->send_off);
    free(p->acts);
    free(p->xstash);
    free(p->ysend);
    free(p->gsend);
    free(p->seed);
    free(p->tmp);
    free(p->losses);
    free(p);
}

static char *kname(const char *pre, int k)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "%s.%d", pre, k);
    return buf;
}

static bool compile_fwd(Graph *g, const PassOpts *po, Diag *d)
{
    char err[1024];
    if (!pass_simplify(g, po, d) || !pass_schedule(g, po, d))
        return false;
    if (!ir_verify(g, err, sizeof err))
        die("pipeline stage graph invalid: %s", err);
    return true;
}

/* The step graph: the optimizer over the stage's params. */
static Graph *step_graph(RtPp *p, const PassOpts *po, Diag *d)
{
    Graph *g = ir_new();
    for (int i = 0; i < p->fwd->syms.n; i++)
        ir_add_sym(g, p->fwd->syms.v[i].name, p->fwd->syms.v[i].value);
    for (int i = 0; i < p->ps.n; i++) {
        const Tensor *t = &p->fwd->t.v[ir_find_tensor(p->fwd, p->ps.v[i].name)];
        ir_add_input(g, TK_PARAM, t->name, t->s, t->init);
    }
    for (int i = 0; i < p->ps.n; i++) {
        int pt = ir_find_tensor(g, p->ps.v[i].name);
        char *gn = xasprintf("pp.grad.%s", p->ps.v[i].name);
        int gi = ir_add_input(g, TK_INPUT, intern(gn), g->t.v[pt].s, (ParamInit){0});
        free(gn);
        gn = xasprintf("grad.%s", p->ps.v[i].name);
        ir_add_output(g, intern(gn), gi);
        free(gn);
    }
    Shape sc = {.dtype = DT_F32};
    ir_add_output(g, "loss", ir_add_input(g, TK_INPUT, "pp.loss", sc, (ParamInit){0}));
    PassOpts o = *po;
    o.pp_sumsq = true;
    o.nranks = 1; /* the dp mean is taken before (rt_pp_step) */
    const Pass *list[] = {pass_find("optimizer"), pass_find("simplify"), pass_find("fuse"),
                          pass_find("schedule"), pass_find("memplan")};
    if (!pass_run(g, list, 5, &o, NULL, NULL, d)) {
        ir_free(g);
        return NULL;
    }
    return g;
}

Graph *rt_pp_build(RtPp *p, const Graph *model, const PassOpts *po, Diag *d)
{
    p->fwd = ir_clone(model);
    if (!pass_attention(p->fwd, po, d) || !pass_stage_cut(p->fwd, p->n, &p->cut, d))
        return NULL;
    int last = p->n - 1;
    /* params: owned by this stage, in the model's order */
    for (int i = 0; i < p->fwd->t.n; i++) {
        const Tensor *t = &p->fwd->t.v[i];
        if (t->kind != TK_PARAM || !pass_stage_owns(p->fwd, &p->cut, p->s, i))
            continue;
        PpParam q = {.name = t->name, .numel = shape_numel(&t->s), .bg = -1, .step = -1};
        q.owners = xmalloc(sizeof(int) * (size_t)(p->n + 1));
        for (int s = 0; s < p->n; s++)
            if (pass_stage_owns(p->fwd, &p->cut, s, i))
                q.owners[q.nown++] = s;
        q.norm = q.owners[0] == p->s;
        q.acc = xcalloc((size_t)q.numel + 1, sizeof(float));
        if (t->s.dtype != DT_F32) {
            snprintf(d->msg, sizeof d->msg,
                     "--pp: param \"%s\" is %s; pipeline stages run f32 params only", t->name,
                     dtype_name(t->s.dtype));
            return NULL;
        }
        vec_push(&p->ps, q);
    }
    int64_t maxn = 1;
    for (int i = 0; i < p->ps.n; i++)
        if (p->ps.v[i].numel > maxn)
            maxn = p->ps.v[i].numel;
    p->tmp = xmalloc(sizeof(float) * (size_t)maxn);
    /* F and FB */
    if (p->s < last) {
        p->fg = pass_stage_graph(p->fwd, &p->cut, p->s, false);
        if (!compile_fwd(p->fg, po, d))
            return NULL;
    }
    p->bg = pass_stage_graph(p->fwd, &p->cut, p->s, true);
    PassOpts bo = *po;
    bo.grad_accum = 1;
    bo.nranks = 1;
    if (!pass_autodiff(p->bg, &bo, d) || !compile_fwd(p->bg, &bo, d))
        return NULL;
    p->flops = (p->fg ? ir_graph_flops(p->fg) : 0) + ir_graph_flops(p->bg);
    p->loss_b = ir_find_output(p->bg, "loss");
    for (int i = 0; i < p->ps.n; i++) {
        char *gn = xasprintf("grad.%s", p->ps.v[i].name);
        p->ps.v[i].bg = ir_find_output(p->bg, gn);
        free(gn);
        if (p->ps.v[i].bg < 0)
            die("rt_pp_build: stage %d has no gradient of \"%s\"", p->s, p->ps.v[i].name);
    }
    /* what crosses: ids and offsets in a message */
    p->nrecv = p->s > 0 ? p->cut.ncross[p->s] : 0;
    p->nsend = p->s < last ? p->cut.ncross[p->s + 1] : 0;
    p->recv_f = xcalloc((size_t)p->nrecv + 1, sizeof(int));
    p->recv_b = xcalloc((size_t)p->nrecv + 1, sizeof(int));
    p->recv_grad = xcalloc((size_t)p->nrecv + 1, sizeof(int));
    p->recv_off = xcalloc((size_t)p->nrecv + 2, sizeof(int64_t));
    for (int k = 0; k < p->nrecv; k++) {
        p->recv_f[k] = p->fg ? ir_find_tensor(p->fg, kname("pp.recv", k)) : -1;
        p->recv_b[k] = ir_find_tensor(p->bg, kname("pp.recv", k));
        p->recv_grad[k] = ir_find_output(p->bg, kname("grad.pp.recv", k));
        if (p->recv_b[k] < 0 || p->recv_grad[k] < 0)
            die("rt_pp_build: stage %d lost pp.recv.%d", p->s, k);
        p->recv_off[k + 1] = p->recv_off[k] + shape_bytes(&p->bg->t.v[p->recv_b[k]].s);
    }
    p->send_f = xcalloc((size_t)p->nsend + 1, sizeof(int));
    p->seed_b = xcalloc((size_t)p->nsend + 1, sizeof(int));
    p->send_off = xcalloc((size_t)p->nsend + 2, sizeof(int64_t));
    for (int k = 0; k < p->nsend; k++) {
        p->send_f[k] = ir_find_output(p->fg, kname("pp.send", k));
        p->seed_b[k] = ir_find_tensor(p->bg, kname("pp.seed", k));
        if (p->send_f[k] < 0 || p->seed_b[k] < 0)
            die("rt_pp_build: stage %d lost pp.send.%d", p->s, k);
        p->send_off[k + 1] = p->send_off[k] + shape_bytes(&p->fg->t.v[p->send_f[k]].s);
    }
    int m = p->m;
    p->xstash = xmalloc((size_t)(p->recv_off[p->nrecv] * m) + 1);
    p->gsend = xmalloc((size_t)(p->recv_off[p->nrecv] * m) + 1);
    p->ysend = xmalloc((size_t)(p->send_off[p->nsend] * m) + 1);
    p->seed = xmalloc((size_t)p->send_off[p->nsend] + 1);
    p->losses = xcalloc((size_t)m + 2, sizeof(double));
    p->acts = xmalloc(sizeof(PassStageAct) * (size_t)(2 * m + 1));
    pass_stage_schedule(p->sched, p->n, m, p->s, p->acts);
    const Tensor *rt = NULL;
    int tk = ir_find_tensor(p->fwd, "tokens");
    if (tk < 0)
        tk = ir_find_tensor(p->fwd, "x");
    if (tk >= 0)
        rt = &p->fwd->t.v[tk];
    p->rows = rt ? rt->s.dim[0] : 0;
    Graph *sg = step_graph(p, po, d);
    for (int i = 0; sg && i < p->ps.n; i++) {
        char *gn = xasprintf("pp.grad.%s", p->ps.v[i].name);
        p->ps.v[i].step = ir_find_tensor(sg, gn);
        free(gn);
    }
    return sg;
}

bool rt_pp_exec(RtPp *p, const ExecOpts *eo, Diag *d)
{
    ExecOpts o = *eo;
    o.comm = NULL;
    o.tp_comm = NULL;
    o.profile = false;
    o.arena_of = NULL;
    if (p->fg && !(p->fe = rt_exec_create(p->fg, &o, d)))
        return false;
    return (p->be = rt_exec_create(p->bg, &o, d)) != NULL;
}

double rt_pp_flops(const RtPp *p) { return p ? p->flops * p->m : 0; }

/* Params from the step's executor into F and FB. */
static void copy_params(RtPp *p, Exec *te, const Graph *tg)
{
    for (int i = 0; i < p->ps.n; i++) {
        int from = ir_find_tensor(tg, p->ps.v[i].name);
        rt_exec_read(te, from, p->tmp);
        if (p->fe) {
            int to = ir_find_tensor(p->fg, p->ps.v[i].name);
            if (to >= 0)
                rt_exec_write(p->fe, to, p->tmp);
        }
        rt_exec_write(p->be, ir_find_tensor(p->bg, p->ps.v[i].name), p->tmp);
    }
}

/* Micro-batch k's gradients into the sums, as grad_accum sums them
 * (passes/comm.c): accum = accum + g for the first m-1, then the last's
 * (g + accum) x (1/m). */
static void accumulate(RtPp *p, int k)
{
    float c = (float)(1.0 / p->m);
    for (int i = 0; i < p->ps.n; i++) {
        PpParam *q = &p->ps.v[i];
        rt_exec_read(p->be, q->bg, p->tmp);
        if (p->m == 1 || k == 0) { /* 0 + g is g */
            memcpy(q->acc, p->tmp, sizeof(float) * (size_t)q->numel);
        } else if (k < p->m - 1) {
            for (int64_t j = 0; j < q->numel; j++)
                q->acc[j] = q->acc[j] + p->tmp[j];
        } else {
            for (int64_t j = 0; j < q->numel; j++) {
                float s = p->tmp[j] + q->acc[j];
                q->acc[j] = s * c;
            }
        }
    }
}

static void feed(RtPp *p, Exec *e, const Graph *g, const DataBatch *b, int64_t base, int k)
{
    rt_data_feed(e, g, b, base + (int64_t)k * p->rows);
}

/* The FB program for micro-batch k (its activation received, its seed
 * gradient written): runs, sums its gradients, keeps the gradient to send
 * back. */
static bool run_fb(RtPp *p, const DataBatch *b, int64_t base, int k, uint64_t seed,
                   int64_t step, Diag *d)
{
    feed(p, p->be, p->bg, b, base, k);
    int64_t rb = p->recv_off[p->nrecv];
    for (int j = 0; j < p->nrecv; j++)
        rt_exec_write(p->be, p->recv_b[j], p->xstash + rb * k + p->recv_off[j]);
    if (!rt_exec_run(p->be, seed, step, d))
        return false;
    accumulate(p, k);
    for (int j = 0; j < p->nrecv; j++)
        rt_exec_read(p->be, p->recv_grad[j], p->gsend + rb * k + p->recv_off[j]);
    if (p->s == p->n - 1) {
        float l;
        rt_exec_read(p->be, p->loss_b, &l);
        p->losses[k] = l;
    }
    return true;
}

bool rt_pp_step(RtPp *p, Exec *te, const Graph *tg, const DataBatch *b, int64_t dp_rank,
                uint64_t seed, int64_t step, double *micro_loss, float *last_loss, Diag *d)
{
    int m = p->m, last = p->n - 1;
    int64_t base = dp_rank * m * p->rows;
    int64_t rb = p->recv_off[p->nrecv], sb = p->send_off[p->nsend];
    copy_params(p, te, tg);
    void **reqs = xcalloc((size_t)(2 * m + 1), sizeof(void *));
    int nreq = 0;
    bool ok = true;
    for (int a = 0; a < 2 * m && ok; a++) {
        int k = p->acts[a].mb;
        if (p->acts[a].kind == 'F') {
            if (p->s > 0)
                rt_comm_pp_recv(p->comm, p->s - 1, 2 * k, p->xstash + rb * k, (size_t)rb);
            if (p->s == last) { /* forward and backward at once */
                ok = run_fb(p, b, base, k, seed, step, d);
                continue;
            }
            feed(p, p->fe, p->fg, b, base, k);
            for (int j = 0; j < p->nrecv; j++)
                rt_exec_write(p->fe, p->recv_f[j], p->xstash + rb * k + p->recv_off[j]);
            if (!(ok = rt_exec_run(p->fe, seed, step, d)))
                break;
            for (int j = 0; j < p->nsend; j++)
                rt_exec_read(p->fe, p->send_f[j], p->ysend + sb * k + p->send_off[j]);
            reqs[nreq++] = rt_comm_pp_isend(p->comm, p->s + 1, 2 * k, p->ysend + sb * k,
                                            (size_t)sb);
        } else {
            if (p->s < last) {
                rt_comm_pp_recv(p->comm, p->s + 1, 2 * k + 1, p->seed, (size_t)sb);
                for (int j = 0; j < p->nsend; j++)
                    rt_exec_write(p->be, p->seed_b[j], p->seed + p->send_off[j]);
                if (!(ok = run_fb(p, b, base, k, seed, step, d)))
                    break;
            }
            if (p->s > 0)
                reqs[nreq++] = rt_comm_pp_isend(p->comm, p->s - 1, 2 * k + 1,
                                                p->gsend + rb * k, (size_t)rb);
        }
    }
    for (int i = 0; i < nreq; i++)
        rt_comm_pp_wait(p->comm, reqs[i]);
    free(reqs);
    if (!ok)
        return false;
    /* tied params: the sum over their stages; then the mean over dp */
    int dps = rt_comm_size(p->comm);
    for (int i = 0; i < p->ps.n; i++) {
        PpParam *q = &p->ps.v[i];
        if (q->nown > 1)
            rt_comm_pp_sum_f32(p->comm, q->owners, q->nown, q->acc, q->numel);
        if (dps > 1) {
            rt_comm_dp_sum_f32(p->comm, q->acc, q->numel);
            float c = (float)(1.0 / dps);
            for (int64_t j = 0; j < q->numel; j++)
                q->acc[j] *= c;
        }
    }
    /* the global norm's sum of squares, each param once */
    double ss = 0;
    for (int i = 0; i < p->ps.n; i++)
        for (int64_t j = 0; p->ps.v[i].norm && j < p->ps.v[i].numel; j++)
            ss += (double)p->ps.v[i].acc[j] * p->ps.v[i].acc[j];
    rt_comm_pp_sum(p->comm, &ss, 1);
    /* the losses, from the last stage */
    rt_comm_pp_bcast(p->comm, last, p->losses, sizeof(double) * (size_t)m);
    double sum = 0;
    bool finite = true;
    for (int k = 0; k < m; k++) {
        finite &= isfinite(p->losses[k]) != 0;
        if (k < m - 1)
            sum += (float)p->losses[k];
    }
    *micro_loss = sum;
    *last_loss = (float)p->losses[m - 1];
    for (int i = 0; i < p->ps.n; i++)
        if (p->ps.v[i].step >= 0)
            rt_exec_write(te, p->ps.v[i].step, p->ps.v[i].acc);
    float f = (float)ss;
    int t = ir_find_tensor(tg, "pp.sumsq");
    if (t >= 0)
        rt_exec_write(te, t, &f);
    f = finite ? *last_loss : NAN;
    if ((t = ir_find_tensor(tg, "pp.loss")) >= 0)
        rt_exec_write(te, t, &f);
    return true;
}

const Graph *rt_pp_whole(RtPp *p, const Graph *tg, void *const *vals, void ***whole)
{
    /* stage 0 receives every param whose first owner is another stage */
    const Graph *g = p->fwd;
    void **w = p->s == 0 ? xcalloc((size_t)g->t.n + 1, sizeof(void *)) : NULL;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        int first = -1;
        for (int s = 0; s < p->n && first < 0; s++)
            if (pass_stage_owns(g, &p->cut, s, i))
                first = s;
        size_t nb = (size_t)shape_bytes(&t->s);
        if (p->s == 0) {
            w[i] = xmalloc(nb + 1);
            if (first == 0)
                memcpy(w[i], vals[ir_find_tensor(tg, t->name)], nb);
            else if (first > 0)
                rt_comm_pp_recv(p->comm, first, 32000, w[i], nb);
            else
                memset(w[i], 0, nb);
        } else if (first == p->s) {
            void *rq = rt_comm_pp_isend(p->comm, 0, 32000, vals[ir_find_tensor(tg, t->name)],
                                        nb);
            rt_comm_pp_wait(p->comm, rq);
        }
    }
    *whole = w;
    return p->s == 0 ? g : NULL;
}

void rt_pp_whole_free(const RtPp *p, void **whole)
{
    for (int i = 0; whole && i < p->fwd->t.n; i++)
        free(whole[i]);
    free(whole);
}

void rt_pp_print(const RtPp *p, FILE *f)
{
    pass_stage_cut_print(p->fwd, &p->cut, f);
    pass_stage_schedule_print(p->sched, p->n, p->m, f);
}
