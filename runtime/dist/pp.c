/* pp.c - pipeline parallelism: each rank runs one stage of the forward
 * graph's cut (passes/stages.c) over m micro-batches in the order of its
 * schedule (gpipe, 1f1b, zb-h1), sending activations forward and their
 * gradients back (CPU ranks: MPI point to point through host buffers; a
 * device backend with transfers of its own, CUDA: NCCL send/recv between
 * the programs' device buffers, rt_exec_pp_xfer), then its own optimizer
 * step.
 *
 * Per stage, four programs, from the stage graph differentiated by
 * autodiff and split by pass_stage_split:
 *   F    the stage's forward: data and "pp.recv.K" in, "pp.send.K" out
 *        (the last stage: the loss);
 *   B    the backward ops the received tensors' gradients need (sent back);
 *   W    the other backward ops: the params' gradients, summed over the
 *        micro-batches as grad_accum sums them;
 *   step the optimizer over the stage's params: inputs "pp.grad.P" (the
 *        mean over micro-batches), the global gradient norm's sum of
 *        squares "pp.sumsq" (summed over the stages, a tied param counted
 *        once) and "pp.loss" (the last micro-batch's loss, NaN when any
 *        was not finite).
 * What F leaves for B and W, and B for W ("pp.stash.T"), is kept per
 * micro-batch in host buffers: what W reads until its W has run, the rest
 * until its B has; so are the received activation and gradient (on a
 * device: read back after the program that received them, where a later
 * one reads them too). The buffers hold as many micro-batches as the
 * schedule holds at once (slots taken at F, given back at B and W). The
 * gradient for the previous stage is sent after B (zb-h1) or after W
 * (gpipe, 1f1b: B and W one backward). MPI sends return at once (their
 * buffers live until the step's end); MPI receives block, with the comm
 * timeout; device transfers are ordered with the programs' work by events
 * and never block the host. With random ops (dropout) the evaluation runs
 * the evaluation graph's stage (rt_pp_build_eval). Whole tensors (weights,
 * checkpoints, --init-from) are in pp_whole.c, the print, trace and
 * summary in pp_report.c, the timed cut in pp_balance.c; the state they
 * share in pp_internal.h. */
#include "pp_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rt_pp_check(const TrainCfg *c, Diag *d)
{
    if (c->micro_batches > 0 && c->grad_accum > 1) {
        snprintf(d->msg, sizeof d->msg,
                 "--pp %lld: micro_batches = %lld and grad_accum = %lld both set (expected one: "
                 "under pp, micro_batches is the micro-batches per step, grad_accum its "
                 "other name)", (long long)c->pp, (long long)c->micro_batches,
                 (long long)c->grad_accum);
        return false;
    }
    /* the evaluation through the stages gives the loss alone: early_stop's
     * other metrics need the whole model's (eval_batches = "all": accuracy) */
    const char *es = c->early_stop_metric;
    if (es && *es && strcmp(es, "val_loss") != 0 &&
        (strcmp(es, "accuracy") != 0 || c->eval_batches != TRAIN_EVAL_ALL)) {
        snprintf(d->msg, sizeof d->msg,
                 "--pp %lld: early_stop metric \"%s\": evaluation through pipeline stages "
                 "gives the validation loss alone (expected metric \"val_loss\", or "
                 "\"accuracy\" with eval_batches = \"all\", which evaluates the whole model on "
                 "one rank)", (long long)c->pp, es);
        return false;
    }
    if (pass_stage_schedule_parse(c->schedule) < 0) {
        snprintf(d->msg, sizeof d->msg, "schedule: expected 1f1b, gpipe or zb-h1, got \"%s\"",
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
    p->gshard = -1;
    if (c->pp_balance && strcmp(c->pp_balance, "time") == 0)
        p->tstage = xcalloc((size_t)p->n + 1, sizeof(double));
    return p;
}

int rt_pp_micro_batches(const RtPp *p) { return p ? p->m : 1; }

void rt_pp_free(RtPp *p)
{
    if (!p)
        return;
    for (int i = 0; i < P__N; i++) {
        if (p->pr[i].e)
            rt_exec_destroy(p->pr[i].e);
        if (p->pr[i].g)
            ir_free(p->pr[i].g);
        vec_free(&p->pr[i].in);
        vec_free(&p->pr[i].out);
    }
    pass_stage_cut_free(&p->cut);
    free(p->tstage);
    free(p->wcap);
    if (p->fwd)
        ir_free(p->fwd);
    if (p->ee)
        rt_exec_destroy(p->ee);
    if (p->eg)
        ir_free(p->eg);
    if (p->efwd) {
        pass_stage_cut_free(&p->ecut);
        ir_free(p->efwd);
    }
    free(p->eslot);
    free(p->esend);
    free(p->eroff);
    free(p->esoff);
    free(p->ebuf);
    if (p->ug)
        ir_free(p->ug);
    if (p->wg)
        ir_free(p->wg);
    free(p->uholder);
    vec_free(&p->ev);
    vec_free(&p->busy);
    vec_free(&p->wait);
    vec_free(&p->dpms);
    vec_free(&p->idle);
    for (int h = 0; h < 2; h++) {
        free(p->slot_of[h]);
        free(p->taken[h]);
    }
    free(p->wstash);
    for (int i = 0; i < p->ps.n; i++) {
        free(p->ps.v[i].owners);
        free(p->ps.v[i].acc);
    }
    vec_free(&p->ps);
    free(p->send_f);
    free(p->grad_b);
    free(p->adst);
    free(p->gdst);
    free(p->recv_off);
    free(p->send_off);
    free(p->acts);
    free(p->stash);
    free(p->xrecv);
    free(p->grecv);
    free(p->ysend);
    free(p->gsend);
    free(p->tmp);
    free(p->losses);
    free(p->zflat);
    free(p->zsh);
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
    if (!pass_simplify(g, po, d) || !pass_fuse(g, po, d) || !pass_schedule(g, po, d))
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
        int id = ir_add_input(g, TK_PARAM, t->name, t->s, t->init);
        g->t.v[id].shard = t->shard; /* tp: this rank's part */
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
    o.grad_accum = 1;
    /* the dp mean is taken before (rt_pp_step); zero=1 shards the state
     * over the stage's dp group: the runtime reduce-scatters the gradients
     * over it and gives the graph this rank's shard ("pp.grad.shard"), the
     * graph's all-gather makes the params whole */
    o.nranks = po->zero ? rt_comm_size(p->comm) : 1;
    const Pass *list[] = {pass_find("optimizer"), pass_find("simplify"), pass_find("fuse"),
                          pass_find("comm"), pass_find("schedule"), pass_find("memplan")};
    if (!pass_run(g, list, 6, &o, NULL, NULL, d)) {
        ir_free(g);
        return NULL;
    }
    return g;
}

/* A stage's most bytes of micro-batches held at once under its actions a
 * (3m): per micro-batch the stash until B and until W, the received
 * activation and gradient until B or W; b: the stage's 6 figures as
 * zbh1_caps gathers them (rec, recw, the two messages' bytes, whether
 * each is held until W). */
static double held_peak(const double *b, const PassStageAct *a, int m)
{
    double top = 0;
    int hb = 0, hw = 0;
    for (int i = 0; i < 3 * m; i++) {
        hb += a[i].kind == 'F' ? 1 : a[i].kind == 'B' ? -1 : 0;
        hw += a[i].kind == 'F' ? 1 : a[i].kind == 'W' ? -1 : 0;
        double x = hb * b[0] + hw * b[1] + (b[4] > 0 ? hw : hb) * b[2] +
                   (b[5] > 0 ? hw : hb) * b[3];
        top = x > top ? x : top;
    }
    return top;
}

/* zb-h1: the most W's each stage keeps waiting (pass_stage_schedule_capped)
 * by kiln plan's rule (codegen/cluster.c, cg_cluster_zbh1_caps): from the
 * unit-slot default (stage s: s), each stage's cap lowered by one while it
 * would hold more than CG_ZBH1_MEM x 1f1b's peak (the most over the
 * stages), here in the bytes this runtime holds; every stage gathers the
 * stages' bytes (a collective of the pipeline), so all agree. NULL: not
 * zb-h1. */
static int *zbh1_caps(RtPp *p)
{
    int n = p->n, m = p->m, M3 = 3 * m;
    if (p->sched != PASS_SCHED_ZBH1 || n < 2)
        return NULL;
    double *b = xcalloc((size_t)(6 * n + 1), sizeof(double)), *x = b + 6 * p->s;
    double fixed = 0;
    for (int i = 0; i < p->ps.n; i++) /* params, gradient sums, AdamW's two states */
        fixed += 4.0 * sizeof(float) * (double)p->ps.v[i].numel;
    x[0] = (double)p->rec, x[1] = (double)p->recw;
    x[2] = (double)p->recv_off[p->nrecv], x[3] = (double)p->send_off[p->nsend];
    x[4] = p->xin == H_W, x[5] = p->gin == H_W;
    rt_comm_pp_sum(p->comm, b, 6 * n);
    double *fx = xcalloc((size_t)n + 1, sizeof(double));
    fx[p->s] = fixed;
    rt_comm_pp_sum(p->comm, fx, n);
    PassStageAct *a = xmalloc(sizeof(PassStageAct) * (size_t)(n * M3 + 1));
    pass_stage_schedule_all(PASS_SCHED_1F1B, n, m, NULL, a);
    double peak = 0;
    for (int s = 0; s < n; s++) {
        double v = fx[s] + held_peak(b + 6 * s, a + s * M3, m);
        peak = v > peak ? v : peak;
    }
    int *wcap = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int s = 0; s < n; s++)
        wcap[s] = s;
    for (bool lowered = true; lowered;) {
        lowered = false;
        pass_stage_schedule_all(PASS_SCHED_ZBH1, n, m, wcap, a);
        for (int s = 0; s < n; s++)
            if (wcap[s] > 0 && fx[s] + held_peak(b + 6 * s, a + s * M3, m) > CG_ZBH1_MEM * peak) {
                wcap[s]--;
                lowered = true;
            }
    }
    free(a);
    free(b);
    free(fx);
    return wcap;
}

/* Bytes of g's "pp.stash.T" outputs. */
static int64_t stash_bytes(const Graph *g)
{
    int64_t n = 0;
    for (int k = 0; k < g->outs.n; k++)
        if (strncmp(g->outs.v[k].name, "pp.stash.", 9) == 0)
            n += shape_bytes(&g->t.v[g->outs.v[k].t].s);
    return n;
}

/* zero=1: each param's start in the step graph's flat order (the one its
 * all-gathers name, as runtime/dist/zero.c reads it), this rank's range. */
static void zero_flat(RtPp *p, const Graph *sg)
{
    int nr = 1;
    for (int i = 0; i < sg->ops.n; i++) {
        const Op *op = &sg->ops.v[i];
        if (op->code != OP_ALL_GATHER_WAIT && op->code != OP_ALL_GATHER)
            continue;
        const char *nm = sg->t.v[op->in[op->nin - 1]].name;
        for (int k = 0; nm && k < p->ps.n; k++)
            if (strcmp(p->ps.v[k].name, nm) == 0)
                p->ps.v[k].zstart = op->attr.ia[1];
        p->ztotal = op->attr.ia[2];
        nr = (int)op->attr.ia[3];
    }
    if (nr != rt_comm_size(p->comm))
        die("rt_pp_build: the step is sharded over %d ranks, the dp group has %d", nr,
            rt_comm_size(p->comm));
    p->zS = shape_numel(&sg->t.v[p->gshard].s);
    ir_shard_range(p->ztotal, nr, rt_comm_rank(p->comm), &p->zoff, &p->zlen);
    p->zflat = xcalloc((size_t)p->ztotal + 1, sizeof(float));
    p->zsh = xcalloc((size_t)p->zS + 1, sizeof(float));
}

Graph *rt_pp_build(RtPp *p, const Graph *model, const PassOpts *po, Diag *d)
{
    p->fwd = ir_clone(model);
    if (!pass_attention(p->fwd, po, d) || !pass_partition(p->fwd, po, d) ||
        !(p->tstage ? rt_pp_cut_timed(p->comm, p->fwd, p->n, po, &p->cut, p->tstage, d)
                    : pass_stage_cut(p->fwd, p->n, &p->cut, d)))
        return NULL;
    int last = p->n - 1;
    /* params: owned by this stage, in the model's order */
    for (int i = 0; i < p->fwd->t.n; i++) {
        const Tensor *t = &p->fwd->t.v[i];
        if (t->kind != TK_PARAM || !pass_stage_owns(p->fwd, &p->cut, p->s, i))
            continue;
        PpParam q = {.name = t->name, .numel = shape_numel(&t->s), .out = -1, .step = -1};
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
    /* the stage graph, differentiated, split into F, B and W */
    Graph *full = pass_stage_graph(p->fwd, &p->cut, p->s, true);
    PassOpts bo = *po;
    bo.grad_accum = 1;
    bo.nranks = 1;
    if (!pass_autodiff(full, &bo, d)) {
        ir_free(full);
        return NULL;
    }
    /* remat per stage (--remat, memory_budget): on the stage's
     * differentiated graph before the split, its budget checked against
     * that graph's plan (one micro-batch's F, B and W as one program); the
     * recomputations go to B or W with the gradients that read them */
    if (po->remat != REMAT_NONE && (po->remat != REMAT_DEFAULT || po->memory_budget > 0)) {
        Graph *pf, *pb, *pw; /* the stash without remat, for the summary */
        if (!pass_simplify(full, &bo, d)) {
            ir_free(full);
            return NULL;
        }
        pass_stage_split(full, p->s == last, &pf, &pb, &pw);
        p->rec_plain = stash_bytes(pf) + stash_bytes(pb) + stash_bytes(pw);
        ir_free(pf);
        ir_free(pb);
        ir_free(pw);
        PassOpts ro = bo;
        ro.remat_report = &p->remat;
        ro.after = pass_find("fuse");
        ro.nafter = 4; /* fuse, comm (nothing here), schedule, memplan */
        ro.memplan = NULL;
        if (!pass_remat(full, &ro, d)) {
            char msg[sizeof d->msg];
            snprintf(msg, sizeof msg, "%s", d->msg);
            snprintf(d->msg, sizeof d->msg, "--pp %d, stage %d: %.1900s", p->n, p->s, msg);
            ir_free(full);
            return NULL;
        }
        p->remat_on = true;
    }
    pass_stage_split(full, p->s == last, &p->pr[P_F].g, &p->pr[P_B].g, &p->pr[P_W].g);
    ir_free(full);
    for (int i = 0; i < P__N; i++)
        if (!compile_fwd(p->pr[i].g, &bo, d))
            return NULL;
    Graph *F = p->pr[P_F].g, *B = p->pr[P_B].g;
    for (int i = 0; i < P__N; i++)
        p->flops += ir_graph_flops(p->pr[i].g);
    p->loss_f = p->s == last ? ir_find_output(F, "loss") : -1;
    for (int i = 0; i < p->ps.n; i++) {
        char *gn = xasprintf("grad.%s", p->ps.v[i].name);
        p->ps.v[i].out = -1;
        for (int k = 0; k < P__N && p->ps.v[i].out < 0; k++)
            if ((p->ps.v[i].out = ir_find_output(p->pr[k].g, gn)) >= 0)
                p->ps.v[i].prog = k;
        free(gn);
        if (p->ps.v[i].out < 0)
            die("rt_pp_build: stage %d has no gradient of \"%s\"", p->s, p->ps.v[i].name);
    }
    /* what crosses: ids and offsets in a message */
    p->nrecv = p->s > 0 ? p->cut.ncross[p->s] : 0;
    p->nsend = p->s < last ? p->cut.ncross[p->s + 1] : 0;
    p->grad_b = xcalloc((size_t)p->nrecv + 1, sizeof(int));
    p->recv_off = xcalloc((size_t)p->nrecv + 2, sizeof(int64_t));
    for (int k = 0; k < p->nrecv; k++) {
        p->grad_b[k] = ir_find_output(B, kname("grad.pp.recv", k));
        if (p->grad_b[k] < 0)
            die("rt_pp_build: stage %d lost grad.pp.recv.%d", p->s, k);
        p->recv_off[k + 1] =
            p->recv_off[k] + shape_bytes(&p->fwd->t.v[p->cut.cross[p->s][k]].s);
    }
    p->send_f = xcalloc((size_t)p->nsend + 1, sizeof(int));
    p->send_off = xcalloc((size_t)p->nsend + 2, sizeof(int64_t));
    for (int k = 0; k < p->nsend; k++) {
        p->send_f[k] = ir_find_output(F, kname("pp.send", k));
        if (p->send_f[k] < 0)
            die("rt_pp_build: stage %d lost pp.send.%d", p->s, k);
        p->send_off[k + 1] = p->send_off[k] + shape_bytes(&F->t.v[p->send_f[k]].s);
    }
    /* the stash records: F's and B's "pp.stash.T" outputs, in order; what
     * W reads in the record held until W, the rest in the one held until B */
    const Graph *W = p->pr[P_W].g;
    for (int i = 0; i < P__N; i++) {
        PpProg *q = &p->pr[i];
        for (int k = 0; k < q->g->outs.n; k++) {
            const GraphOutput *o = &q->g->outs.v[k];
            if (strncmp(o->name, "pp.stash.", 9) != 0)
                continue;
            bool w = W->ops.n > 0 && ir_find_tensor(W, o->name) >= 0;
            int64_t *at = w ? &p->recw : &p->rec;
            PpSlot sl = {o->t, w ? 3 : 0, *at, shape_bytes(&q->g->t.v[o->t].s), o->name, false, false};
            vec_push(&q->out, sl);
            *at += sl.bytes;
        }
    }
    for (int i = 0; i < P__N; i++) {
        PpProg *q = &p->pr[i];
        for (int t = 0; t < q->g->t.n; t++) {
            const Tensor *x = &q->g->t.v[t];
            if (x->op >= 0 || !x->name)
                continue;
            PpSlot sl = {t, -1, 0, shape_bytes(&x->s), NULL, false, false};
            int k;
            if (strncmp(x->name, "pp.stash.", 9) == 0) {
                for (int j = 0; j < P__N && sl.what < 0; j++)
                    for (int u = 0; u < p->pr[j].out.n && sl.what < 0; u++)
                        if (strcmp(p->pr[j].out.v[u].name, x->name) == 0)
                            sl.what = p->pr[j].out.v[u].what, sl.off = p->pr[j].out.v[u].off;
                if (sl.what < 0)
                    die("rt_pp_build: stage %d: no program makes %s", p->s, x->name);
            } else if (sscanf(x->name, "pp.recv.%d", &k) == 1) {
                sl.what = 1, sl.off = p->recv_off[k];
                p->xin |= (i == P_W && q->g->ops.n > 0) ? H_W : H_B;
            } else if (sscanf(x->name, "pp.seed.%d", &k) == 1) {
                sl.what = 2, sl.off = p->send_off[k];
                p->gin |= (i == P_W && q->g->ops.n > 0) ? H_W : H_B;
            } else {
                continue;
            }
            vec_push(&q->in, sl);
        }
    }
    int m = p->m;
    p->acts = xmalloc(sizeof(PassStageAct) * (size_t)(3 * m + 1));
    p->wcap = zbh1_caps(p);
    pass_stage_schedule_capped(p->sched, p->n, m, p->s, p->wcap, p->acts);
    for (int h = 0; h < 2; h++) {
        char ends = h == H_B ? 'B' : 'W';
        for (int a = 0, held = 0; a < 3 * m; a++) {
            held += p->acts[a].kind == 'F' ? 1 : p->acts[a].kind == ends ? -1 : 0;
            if (held > p->nslot[h])
                p->nslot[h] = held;
        }
        p->slot_of[h] = xcalloc((size_t)m + 1, sizeof(int));
        p->taken[h] = xcalloc((size_t)p->nslot[h] + 1, 1);
    }
    p->stash = xmalloc((size_t)(p->rec * p->nslot[H_B]) + 1);
    p->wstash = xmalloc((size_t)(p->recw * p->nslot[H_W]) + 1);
    p->xrecv = xmalloc((size_t)(p->recv_off[p->nrecv] * p->nslot[p->xin]) + 1);
    p->grecv = xmalloc((size_t)(p->send_off[p->nsend] * p->nslot[p->gin]) + 1);
    p->gsend = xmalloc((size_t)(p->recv_off[p->nrecv] * m) + 1);
    p->ysend = xmalloc((size_t)(p->send_off[p->nsend] * m) + 1);
    p->losses = xcalloc((size_t)m + 2, sizeof(double));
    /* the model's batch: the leading dim of its data inputs */
    for (int i = 0; i < p->fwd->t.n && !p->rows; i++) {
        const Tensor *t = &p->fwd->t.v[i];
        if (t->kind == TK_INPUT && t->op < 0 && t->s.rank > 0)
            p->rows = t->s.dim[0];
    }
    Graph *sg = step_graph(p, po, d);
    for (int i = 0; sg && po->zero && i < sg->t.n; i++) /* zero=1: the state's shard */
        if (sg->t.v[i].kind == TK_STATE && sg->t.v[i].op < 0 &&
            strcmp(sg->t.v[i].name, "adam.m") == 0)
            p->shard = shape_numel(&sg->t.v[i].s);
    for (int i = 0; sg && i < p->ps.n; i++) {
        char *gn = xasprintf("pp.grad.%s", p->ps.v[i].name);
        p->ps.v[i].step = ir_find_tensor(sg, gn);
        p->ps.v[i].zstart = -1;
        free(gn);
    }
    if (sg && (p->gshard = ir_find_tensor(sg, "pp.grad.shard")) >= 0)
        zero_flat(p, sg);
    return sg;
}

/* Transfers on the device: received tensor (what, off) goes into program
 * own's executor when own reads it (its slot dev; back where a later
 * program reads it too), else into the first program's that reads it,
 * read back into the host record at once (now), else into the scratch. */
static void route(RtPp *p, int what, int own, int64_t off, PpDst *to)
{
    *to = (PpDst){-1, -1, false};
    for (int i = own; i < P__N; i++) {
        PpProg *q = &p->pr[i];
        for (int j = 0; q->e && j < q->in.n; j++) {
            PpSlot *sl = &q->in.v[j];
            if (sl->what != what || sl->off != off)
                continue;
            if (to->prog < 0) {
                *to = (PpDst){i, sl->t, i != own};
                sl->dev = i == own;
            } else if (to->prog == own) { /* a later reader: from the host record */
                for (int u = 0; u < p->pr[own].in.n; u++)
                    if (p->pr[own].in.v[u].t == to->t)
                        p->pr[own].in.v[u].back = true;
            }
        }
    }
}

/* Two ops alike enough to be the same op of the script's two runs. */
static bool same_op(const Op *a, const Op *b)
{
    return a->code == b->code && a->nin == b->nin && a->loc.line == b->loc.line &&
           (a->loc.file == b->loc.file ||
            (a->loc.file && b->loc.file && strcmp(a->loc.file, b->loc.file) == 0));
}

bool rt_pp_build_eval(RtPp *p, const Graph *eval, const PassOpts *po, Diag *d)
{
    const Graph *f = p->fwd;
    bool rnd = false;
    for (int i = 0; i < f->ops.n && !rnd; i++)
        rnd = ir_opinfo[f->ops.v[i].code].cls == OC_RANDOM;
    if (!rnd)
        return true;
    if (!eval) {
        snprintf(d->msg, sizeof d->msg, "--pp %d: the model draws random numbers but has no "
                 "evaluation graph to evaluate with (expected one: the script run with "
                 "nn.training false)", p->n);
        return false;
    }
    /* each evaluation op is the training forward's op of the same script
     * line, in order; the training forward has more (dropout's). With the
     * attention pass, or without (dropout on the attention weights keeps
     * the training forward's attention unfused) */
    int *map = xmalloc(sizeof(int) * (size_t)(f->ops.n + 1));
    Graph *g = NULL;
    int j = 0;
    for (int fused = 1; fused >= 0; fused--) {
        if (g)
            ir_free(g);
        g = p->efwd = ir_clone(eval);
        if ((fused && !pass_attention(g, po, d)) || !pass_partition(g, po, d)) {
            free(map);
            return false;
        }
        j = 0;
        for (int i = 0; i < f->ops.n; i++)
            map[i] = j < g->ops.n && same_op(&f->ops.v[i], &g->ops.v[j]) ? j++ : -1;
        if (j == g->ops.n)
            break;
    }
    if (j < g->ops.n) {
        const Op *op = &g->ops.v[j];
        snprintf(d->msg, sizeof d->msg,
                 "%s:%d: --pp %d: the evaluation graph (dropout off) is not the training "
                 "forward without its random ops, so it cannot be cut where training is "
                 "(expected the same ops in the same order, got a %s op here that training "
                 "does not have there)", op->loc.file ? op->loc.file : "?", op->loc.line, p->n,
                 ir_opinfo[op->code].name);
        free(map);
        return false;
    }
    int n = p->n;
    PassStageCut *c = &p->ecut;
    *c = (PassStageCut){.n = n};
    c->first = xcalloc((size_t)n + 2, sizeof(int));
    c->cross = xcalloc((size_t)n + 2, sizeof(int *));
    c->ncross = xcalloc((size_t)n + 2, sizeof(int));
    c->cost = xcalloc((size_t)n + 2, sizeof(double));
    c->bytes = xcalloc((size_t)n + 2, sizeof(int64_t));
    for (int s = 1; s <= n; s++) {
        int e = g->ops.n;
        for (int i = s < n ? p->cut.first[s] : f->ops.n; i < f->ops.n && e == g->ops.n; i++)
            if (map[i] >= 0)
                e = map[i];
        c->first[s] = e;
    }
    free(map);
    /* what crosses boundary s: as stages.c has it (made before, read at or
     * after; never what constants alone make) */
    bool *st = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    int *last = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    for (int t = 0; t < g->t.n; t++)
        last[t] = -1;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        bool k = ir_opinfo[op->code].cls != OC_RANDOM;
        for (int u = 0; u < op->nin; u++) {
            k = k && st[op->in[u]];
            last[op->in[u]] = i;
        }
        st[op->out] = k;
    }
    for (int i = 0; i < g->outs.n; i++)
        if (strncmp(g->outs.v[i].name, "pp.stage.", 9) != 0)
            last[g->outs.v[i].t] = g->ops.n;
    for (int s = 1; s < n; s++) {
        c->cross[s] = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
        for (int t = 0; t < g->t.n; t++) {
            const Tensor *x = &g->t.v[t];
            if (x->op < 0 || x->op >= c->first[s] || st[t] || last[t] < c->first[s])
                continue;
            c->cross[s][c->ncross[s]++] = t;
            c->bytes[s] += shape_bytes(&x->s);
        }
    }
    free(st);
    free(last);
    p->eg = pass_stage_graph(g, c, p->s, false);
    PassOpts bo = *po;
    bo.grad_accum = 1;
    bo.nranks = 1;
    if (!compile_fwd(p->eg, &bo, d))
        return false;
    int nr = p->s > 0 ? c->ncross[p->s] : 0, ns = p->s < n - 1 ? c->ncross[p->s + 1] : 0;
    p->eslot = xcalloc((size_t)nr + 1, sizeof(int));
    p->esend = xcalloc((size_t)ns + 1, sizeof(int));
    p->eroff = xcalloc((size_t)nr + 2, sizeof(int64_t));
    p->esoff = xcalloc((size_t)ns + 2, sizeof(int64_t));
    for (int k = 0; k < nr; k++) {
        p->eslot[k] = ir_find_tensor(p->eg, kname("pp.recv", k));
        p->eroff[k + 1] = p->eroff[k] + shape_bytes(&g->t.v[c->cross[p->s][k]].s);
    }
    for (int k = 0; k < ns; k++) {
        if ((p->esend[k] = ir_find_output(p->eg, kname("pp.send", k))) < 0)
            die("rt_pp_build_eval: stage %d lost pp.send.%d", p->s, k);
        p->esoff[k + 1] = p->esoff[k] + shape_bytes(&g->t.v[c->cross[p->s + 1][k]].s);
    }
    p->ebuf = xmalloc((size_t)(p->eroff[nr] > p->esoff[ns] ? p->eroff[nr] : p->esoff[ns]) + 1);
    return true;
}

bool rt_pp_exec(RtPp *p, const ExecOpts *eo, Diag *d)
{
    ExecOpts o = *eo;
    o.comm = NULL;
    o.profile = false;
    o.arena_of = NULL;
    for (int i = 0; i < P__N; i++)
        if (p->pr[i].g->ops.n > 0 && !(p->pr[i].e = rt_exec_create(p->pr[i].g, &o, d)))
            return false;
    if (p->eg && !(p->ee = rt_exec_create(p->eg, &o, d)))
        return false;
    /* on a device with transfers of its own (CUDA: NCCL send/recv), the
     * tensors crossing a cut go by them; else by MPI through host buffers */
    for (int i = 0; i < P__N; i++) {
        int r = p->pr[i].e ? rt_exec_pp_setup(p->pr[i].e, p->comm, d) : 0;
        if (r < 0)
            return false;
        if (r > 0)
            p->dev = true;
        else if (p->dev && p->pr[i].e)
            die("rt_pp_exec: stage %d's programs are not on one device", p->s);
    }
    if (p->dev) {
        p->adst = xcalloc((size_t)p->nrecv + 1, sizeof(PpDst));
        p->gdst = xcalloc((size_t)p->nsend + 1, sizeof(PpDst));
        for (int k = 0; k < p->nrecv; k++)
            route(p, 1, P_F, p->recv_off[k], &p->adst[k]);
        for (int k = 0; k < p->nsend; k++)
            route(p, 2, P_B, p->send_off[k], &p->gdst[k]);
    }
    return true;
}

double rt_pp_flops(const RtPp *p) { return p ? p->flops * p->m : 0; }

/* Params from the step's executor into F, B and W. */
static void copy_params(RtPp *p, Exec *te, const Graph *tg)
{
    for (int i = 0; i < p->ps.n; i++) {
        rt_exec_read(te, ir_find_tensor(tg, p->ps.v[i].name), p->tmp);
        for (int k = 0; k < P__N; k++) {
            int to = p->pr[k].e ? ir_find_tensor(p->pr[k].g, p->ps.v[i].name) : -1;
            if (to >= 0)
                rt_exec_write(p->pr[k].e, to, p->tmp);
        }
    }
}

/* Micro-batch k's gradients into the sums, as grad_accum sums them
 * (passes/comm.c): accum = accum + g for the first m-1 (0 + g is g), then
 * the last's (g + accum) x (1/m). The W's run in micro-batch order. */
static void accumulate(RtPp *p, int k)
{
    float c = (float)(1.0 / p->m);
    for (int i = 0; i < p->ps.n; i++) {
        PpParam *q = &p->ps.v[i];
        rt_exec_read(p->pr[q->prog].e, q->out, p->tmp);
        if (p->m == 1 || k == 0) {
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

/* Program i for micro-batch k: its data rows, what it reads of k's
 * record, received activation and gradient (in k's slot); runs; its stash
 * into k's record. */
static bool run_prog(RtPp *p, int i, const DataBatch *b, int64_t base, int k, uint64_t seed,
                     int64_t step, Diag *d)
{
    PpProg *q = &p->pr[i];
    if (!q->e)
        return true;
    rt_data_feed(q->e, q->g, b, base + (int64_t)k * p->rows);
    char *from[4] = {p->stash + p->rec * p->slot_of[H_B][k],
                     p->xrecv + p->recv_off[p->nrecv] * p->slot_of[p->xin][k],
                     p->grecv + p->send_off[p->nsend] * p->slot_of[p->gin][k],
                     p->wstash + p->recw * p->slot_of[H_W][k]};
    for (int j = 0; j < q->in.n; j++)
        if (!q->in.v[j].dev)
            rt_exec_write(q->e, q->in.v[j].t, from[q->in.v[j].what] + q->in.v[j].off);
    if (!rt_exec_run(q->e, seed, step, d))
        return false;
    for (int j = 0; j < q->out.n; j++)
        rt_exec_read(q->e, q->out.v[j].t, from[q->out.v[j].what] + q->out.v[j].off);
            for (int j = 0; j < q->in.n; j++)
        if (q->in.v[j].back)
            rt_exec_read(q->e, q->in.v[j].t, from[q->in.v[j].what] + q->in.v[j].off);
    return true;
}

/* Transfers on the device: receives micro-batch k's activations (what 1,
 * from the stage before) or gradients (2, from the stage after). */
static bool dev_recv(RtPp *p, int what, int k, Diag *d)
{
    int n = what == 1 ? p->nrecv : p->nsend;
    const int64_t *off = what == 1 ? p->recv_off : p->send_off;
    char *rec = what == 1 ? p->xrecv + off[n] * p->slot_of[p->xin][k]
                          : p->grecv + off[n] * p->slot_of[p->gin][k];
    for (int j = 0; j < n; j++) {
        const PpDst *x = what == 1 ? &p->adst[j] : &p->gdst[j];
        Exec *e = p->pr[x->prog < 0 ? P_F : x->prog].e;
        if (!rt_exec_pp_xfer(e, false, what == 1 ? p->s - 1 : p->s + 1,
                             x->prog < 0 ? (int)-(off[j + 1] - off[j]) : x->t, d))
            return false;
        if (x->now)
            rt_exec_read(e, x->t, rec + off[j]);
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
    int nreq = 0, nextw = 0;
    bool ok = true, zb = p->sched == PASS_SCHED_ZBH1;
    p->ev.n = 0;
    double busy = 0, wait = 0, begin = ir_now();
    for (int h = 0; h < 2; h++) /* a failed step may have left slots taken */
        memset(p->taken[h], 0, (size_t)p->nslot[h]);
    for (int a = 0; a < 3 * m && ok; a++) {
        int k = p->acts[a].mb;
        double t0 = ir_now(), t1 = t0;
        /* the gradient for s-1: after B (zb-h1) or after W (B and W one
         * backward: gpipe, 1f1b) */
        bool send_grad = p->s > 0 && p->acts[a].kind == (zb ? 'B' : 'W');
        switch (p->acts[a].kind) {
        case 'F': {
            for (int h = 0; h < 2; h++) {
                int sl = 0;
                while (sl < p->nslot[h] && p->taken[h][sl])
                    sl++;
                if (sl == p->nslot[h])
                    die("rt_pp_step: stage %d holds more than %d micro-batches", p->s,
                        p->nslot[h]);
                p->taken[h][sl] = 1;
                p->slot_of[h][k] = sl;
            }
            if (p->s > 0 && p->dev) {
                if (!(ok = dev_recv(p, 1, k, d)))
                    break;
            } else if (p->s > 0) {
                rt_comm_pp_recv(p->comm, p->s - 1, 2 * k, p->xrecv + rb * p->slot_of[p->xin][k],
                                (size_t)rb);
                t1 = ir_now();
                vec_push(&p->ev, ((PpEvent){'r', k, t0, t1}));
            }
            if (!(ok = run_prog(p, P_F, b, base, k, seed, step, d)))
                break;
            if (p->s == last) {
                float l;
                rt_exec_read(p->pr[P_F].e, p->loss_f, &l);
                p->losses[k] = l;
                break;
            }
            if (p->dev) {
                for (int j = 0; j < p->nsend && ok; j++)
                    ok = rt_exec_pp_xfer(p->pr[P_F].e, true, p->s + 1, p->send_f[j], d);
                break;
            }
            for (int j = 0; j < p->nsend; j++)
                rt_exec_read(p->pr[P_F].e, p->send_f[j], p->ysend + sb * k + p->send_off[j]);
            reqs[nreq++] = rt_comm_pp_isend(p->comm, p->s + 1, 2 * k, p->ysend + sb * k,
                                            (size_t)sb);
            break;
        }
        case 'B':
            if (p->s < last && p->dev) {
                if (!(ok = dev_recv(p, 2, k, d)))
                    break;
            } else if (p->s < last) {
                rt_comm_pp_recv(p->comm, p->s + 1, 2 * k + 1,
                                p->grecv + sb * p->slot_of[p->gin][k], (size_t)sb);
                t1 = ir_now();
                vec_push(&p->ev, ((PpEvent){'r', k, t0, t1}));
            }
            if (!(ok = run_prog(p, P_B, b, base, k, seed, step, d)))
                break;
            if (!p->dev)
                for (int j = 0; j < p->nrecv; j++)
                    rt_exec_read(p->pr[P_B].e, p->grad_b[j], p->gsend + rb * k + p->recv_off[j]);
            p->taken[H_B][p->slot_of[H_B][k]] = 0;
            break;
        default: /* 'W' */
            if (k != nextw++)
                die("rt_pp_step: W%d out of micro-batch order on stage %d", k, p->s);
            if (!(ok = run_prog(p, P_W, b, base, k, seed, step, d)))
                break;
            accumulate(p, k);
            p->taken[H_W][p->slot_of[H_W][k]] = 0;
        }
        if (ok && send_grad && p->dev) /* B's tensors stay until its next run */
            for (int j = 0; j < p->nrecv && ok; j++)
                ok = rt_exec_pp_xfer(p->pr[P_B].e, true, p->s - 1, p->grad_b[j], d);
        else if (ok && send_grad)
            reqs[nreq++] = rt_comm_pp_isend(p->comm, p->s - 1, 2 * k + 1, p->gsend + rb * k,
                                            (size_t)rb);
        double t2 = ir_now();
        vec_push(&p->ev, ((PpEvent){p->acts[a].kind, k, t1, t2}));
        wait += t1 - t0;
        busy += t2 - t1;
    }
    /* on a device the last gradient send is only queued: wait for it (a
     * read of what it sends waits on B's stream, which waits for the
     * transfer) before the host's collectives below, so that a driver that
     * runs queued work only when waited on (the fakes) sends it too */
    if (ok && p->dev && p->s > 0)
        for (int j = 0; j < p->nrecv; j++)
            rt_exec_read(p->pr[P_B].e, p->grad_b[j], p->gsend + p->recv_off[j]);
    double span = ir_now() - begin;
    vec_push(&p->busy, busy);
    vec_push(&p->wait, wait);
    for (int i = 0; i < nreq; i++)
        rt_comm_pp_wait(p->comm, reqs[i]);
    free(reqs);
    if (!ok)
        return false;
    /* tied params: the sum over their stages; then the mean over dp (zero=1:
     * this rank's shard of it, by a reduce-scatter over the dp group) */
    int dps = rt_comm_size(p->comm);
    double td = 0;
    for (int i = 0; i < p->ps.n; i++) {
        PpParam *q = &p->ps.v[i];
        if (q->nown > 1)
            rt_comm_pp_sum_f32(p->comm, q->owners, q->nown, q->acc, q->numel);
        if (q->zstart >= 0)
            memcpy(p->zflat + q->zstart, q->acc, sizeof(float) * (size_t)q->numel);
        if (dps > 1 && p->gshard < 0) {
            double t0 = ir_now();
            rt_comm_dp_sum_f32(p->comm, q->acc, q->numel);
            td += ir_now() - t0;
            float c = (float)(1.0 / dps);
            for (int64_t j = 0; j < q->numel; j++)
                q->acc[j] *= c;
        }
    }
    if (p->gshard >= 0) {
        double t0 = ir_now();
        rt_comm_dp_reduce_scatter_f32(p->comm, p->zflat, p->ztotal, p->zsh);
        td += ir_now() - t0;
        float c = (float)(1.0 / dps);
        for (int64_t j = 0; dps > 1 && j < p->zlen; j++)
            p->zsh[j] *= c;
        memset(p->zsh + p->zlen, 0, sizeof(float) * (size_t)(p->zS - p->zlen));
    }
    if (dps > 1)
        vec_push(&p->dpms, 1e3 * td);
    /* the global norm's sum of squares, each param once: a param split
     * over the TP group by its parts' sums over the group (zero=1: each
     * rank's part of its shard, summed over the dp group) */
    double ss = 0, split = 0;
    for (int i = 0; i < p->ps.n; i++) {
        const PpParam *q = &p->ps.v[i];
        const Tensor *t = &p->fwd->t.v[ir_find_tensor(p->fwd, q->name)];
        double *to = t->shard.on && t->shard.n > 1 ? &split : &ss;
        const float *x = q->acc;
        int64_t lo = 0, hi = q->numel;
        if (p->gshard >= 0) { /* [lo, hi): q's elements in this rank's range */
            lo = q->zstart > p->zoff ? q->zstart : p->zoff;
            hi = q->zstart + q->numel < p->zoff + p->zlen ? q->zstart + q->numel
                                                          : p->zoff + p->zlen;
            x = p->zsh - p->zoff;
            if (q->zstart < 0)
                hi = lo;
        }
        for (int64_t j = lo; q->norm && j < hi; j++)
            *to += (double)x[j] * x[j];
    }
    if (p->gshard >= 0 && dps > 1) {
        double two[2] = {ss, split};
        rt_comm_mean(p->comm, two, 2);
        ss = two[0] * dps, split = two[1] * dps;
    }
    if (rt_comm_tp(p->comm) > 1) {
        float f2 = (float)split;
        rt_comm_tp_allreduce(p->comm, &f2, 1);
        split = f2;
    }
    ss += split;
    /* with the norm: each stage's span from its first action's start to
     * its last's end (the stages start together, released by the last
     * step's collectives); the pipeline's span is the longest, and each
     * stage idles where it runs no program within it */
    double *sv = xcalloc((size_t)p->n + 2, sizeof(double));
    sv[0] = ss;
    sv[1 + p->s] = span;
    rt_comm_pp_sum(p->comm, sv, p->n + 1);
    ss = sv[0];
    double whole = 0;
    for (int s = 0; s < p->n; s++)
        whole = sv[1 + s] > whole ? sv[1 + s] : whole;
    free(sv);
    vec_push(&p->idle, whole > 0 ? 1 - busy / whole : 0);
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
    if (p->gshard >= 0)
        rt_exec_write(te, p->gshard, p->zsh);
    for (int i = 0; i < p->ps.n && p->gshard < 0; i++)
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

/* ---- evaluation: the forward alone, through every stage ------------------ */

/* rt_pp_eval through the evaluation graph's stage (rt_pp_build_eval). */
static bool eval_apart(RtPp *p, Exec *te, const Graph *tg, const DataBatch *b, int64_t row0,
                       uint64_t seed, int64_t step, float *loss, Diag *d)
{
    int last = p->n - 1;
    int nr = p->s > 0 ? p->ecut.ncross[p->s] : 0, ns = p->s < last ? p->ecut.ncross[p->s + 1] : 0;
    for (int i = 0; i < p->ps.n; i++) {
        int to = ir_find_tensor(p->eg, p->ps.v[i].name);
        if (to >= 0) {
            rt_exec_read(te, ir_find_tensor(tg, p->ps.v[i].name), p->tmp);
            rt_exec_write(p->ee, to, p->tmp);
        }
    }
    if (p->s > 0)
        rt_comm_pp_recv(p->comm, p->s - 1, 30001, p->ebuf, (size_t)p->eroff[nr]);
    rt_data_feed(p->ee, p->eg, b, row0);
    for (int k = 0; k < nr; k++)
        if (p->eslot[k] >= 0)
            rt_exec_write(p->ee, p->eslot[k], p->ebuf + p->eroff[k]);
    if (!rt_exec_run(p->ee, seed, step, d))
        return false;
    double l = 0;
    if (p->s < last) {
        for (int k = 0; k < ns; k++)
            rt_exec_read(p->ee, p->esend[k], p->ebuf + p->esoff[k]);
        rt_comm_pp_wait(p->comm, rt_comm_pp_isend(p->comm, p->s + 1, 30001, p->ebuf,
                                                  (size_t)p->esoff[ns]));
    } else {
        float f;
        rt_exec_read(p->ee, ir_find_output(p->eg, "loss"), &f);
        l = f;
    }
    rt_comm_pp_bcast(p->comm, last, &l, sizeof l);
    *loss = (float)l;
    return true;
}

bool rt_pp_eval(RtPp *p, Exec *te, const Graph *tg, const DataBatch *b, int64_t row0,
                uint64_t seed, int64_t step, float *loss, Diag *d)
{
    copy_params(p, te, tg); /* the step's update since its micro-batches ran */
    if (p->ee)
        return eval_apart(p, te, tg, b, row0, seed, step, loss, d);
    PpProg *q = &p->pr[P_F];
    int last = p->n - 1;
    int64_t rb = p->recv_off[p->nrecv], sb = p->send_off[p->nsend];
    if (p->s > 0)
        rt_comm_pp_recv(p->comm, p->s - 1, 30000, p->xrecv, (size_t)rb);
    rt_data_feed(q->e, q->g, b, row0);
    for (int j = 0; j < q->in.n; j++)
        if (q->in.v[j].what == 1)
            rt_exec_write(q->e, q->in.v[j].t, p->xrecv + q->in.v[j].off);
    if (!rt_exec_run(q->e, seed, step, d))
        return false;
    double l = 0;
    if (p->s < last) {
        for (int j = 0; j < p->nsend; j++)
            rt_exec_read(q->e, p->send_f[j], p->ysend + p->send_off[j]);
        rt_comm_pp_wait(p->comm, rt_comm_pp_isend(p->comm, p->s + 1, 30000, p->ysend,
                                                  (size_t)sb));
    } else {
        float f;
        rt_exec_read(q->e, p->loss_f, &f);
        l = f;
    }
    rt_comm_pp_bcast(p->comm, last, &l, sizeof l);
    *loss = (float)l;
    return true;
}
