/* cluster.c - a training run at cluster scale, projected from one compiled
 * step (`kiln plan`): memory per GPU, the step's critical path, throughput
 * and the end date. Pure arithmetic on what the CLI measured of the model
 * (CgClusterModel: params, shapes, the cost model's times, the comm pass's
 * buckets); docs/plan.md gives every equation and where it comes from.
 *
 * Layout: TP innermost (inside a node when tp <= gpus per node), then DP,
 * then PP (Megatron's order). Each GPU computes 1/(tp x pp) of the model's
 * step (an ideal split), runs 1F1B over the micro-batches, all-reduces its
 * gradients over DP in the comm pass's buckets (reduce-scatter with ZeRO-1,
 * then an all-gather of the updated params that the next forward hides).
 * Collectives: ring alpha-beta, all-reduce 2(n-1) alpha + 2(n-1)/n bytes /
 * bw; reduce-scatter and all-gather half of each term, each bucket costed
 * by the kind the comm pass gave it (a step compiled with zero=1: the
 * reduce-scatters where the all-reduces would be, the norm's scalar
 * all-reduce, the all-gathers after the update). A DP bucket staged
 * through host memory (the CPU transport, runtime/dist/mpi.c) adds its
 * three copies: 6 x bytes / stage_bw. A partitioned step's TP collectives
 * are costed one by one on the TP link (the CPU's own measured figures),
 * and each one's exposed part is what the compute between it and its
 * first reader does not hide (t_tp_exposed_mb; the step counts them whole). */
#include "codegen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* seconds of a ring all-reduce of `bytes` over n ranks */
double cg_ring_allreduce(double bytes, int n, double bw, double alpha)
{
    if (n <= 1 || bytes <= 0)
        return 0;
    return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * bytes / bw;
}

/* seconds of a ring reduce-scatter (or all-gather) of `bytes` in all */
double cg_ring_half(double bytes, int n, double bw, double alpha)
{
    if (n <= 1 || bytes <= 0)
        return 0;
    return (double)(n - 1) * alpha + (double)(n - 1) / n * bytes / bw;
}

/* Bucket i's kind: the comm pass's (bucket_coll), or for a step compiled
 * without zero, all-reduce, or reduce-scatter when o->zero asks for it. */
static int bucket_kind(const CgClusterModel *m, const CgClusterOpts *o, int i)
{
    if (m->bucket_coll)
        return m->bucket_coll[i];
    return o->zero ? CG_COLL_REDUCE_SCATTER : CG_COLL_ALLREDUCE;
}

/* Seconds of one DP bucket of `bytes` (this GPU's) of kind k. */
static double bucket_s(const CgClusterOpts *o, int k, double bytes, double bw)
{
    double t = k == CG_COLL_ALLREDUCE ? cg_ring_allreduce(bytes, o->dp, bw, o->alpha_s)
                                      : cg_ring_half(bytes, o->dp, bw, o->alpha_s);
    if (o->stage_bw > 0 && o->dp > 1) /* pack, scale by 1/n, unpack: read + write each */
        t += 6.0 * bytes / o->stage_bw;
    return t;
}

/* The DP collectives of one step after the last micro-batch's backward:
 * the comm stream runs the all-reduce and reduce-scatter buckets in order,
 * each from when its gradients are ready (or all after backward without
 * overlap); exposed: how long the comm stream runs past the end of
 * backward. All-gather buckets (zero=1) are not on this path: see
 * cg_cluster_project. */
static void dp_comm(const CgClusterModel *m, const CgClusterOpts *o, double scale, double bw,
                    double *total, double *exposed)
{
    double comm = 0, busy_until = 0;
    double end = m->backward_end_s * scale;
    for (int i = 0; i < m->nbuckets; i++) {
        int k = bucket_kind(m, o, i);
        if (k == CG_COLL_ALL_GATHER)
            continue;
        double bytes = m->bucket_bytes[i] * scale;
        double t = bucket_s(o, k, bytes, bw);
        double ready = o->no_overlap ? end : m->bucket_ready_s[i] * scale;
        double start = ready > busy_until ? ready : busy_until;
        busy_until = start + t;
        comm += t;
    }
    *total = comm;
    *exposed = busy_until > end ? busy_until - end : 0;
}

/* Memory per GPU: params and gradients over tp x pp, optimizer state too
 * (and over dp with ZeRO-1 unless the step was compiled sharded), the other
 * temporaries over tp (1F1B: the first stage holds pp micro-batches of its
 * 1/pp of the layers). With several micro-batches the gradients accumulate
 * across them, so all of them are held for the whole step, beside the
 * other temporaries' peak. With one, the step's own timeline: the op where
 * gradients live / (tp pp) + other temporaries / tp is largest, split
 * there, so nothing is counted twice (with tp = pp = 1 the temporaries of
 * the memory plan's peak). */
/* What the step still has to be divided by for TP: 1 when it was compiled
 * partitioned (its figures are one TP rank's already), else tp. */
static int tp_left(const CgClusterModel *m, const CgClusterOpts *o)
{
    return m->tp_split > 1 ? 1 : o->tp;
}

const char *cg_pp_schedule_name(CgPipeSchedule s)
{
    static const char *const names[CG_PP__N] = {"1f1b", "gpipe", "zb-h1"};
    return s >= 0 && s < CG_PP__N ? names[s] : "?";
}

void cg_cluster_memory(const CgClusterModel *m, const CgClusterOpts *o, CgClusterPlan *p)
{
    int tp = tp_left(m, o);
    double split = (double)tp * o->pp;
    p->mem_params = m->param_bytes / split;
    int zdiv = o->zero && !m->opt_sharded ? o->dp : 1; /* a sharded step is one rank's */
    p->mem_opt = m->opt_bytes / split / zdiv;
    p->grads_resident = o->micro_batches > 1 || m->mem_nops == 0;
    p->mem_op = -1;
    p->mem_grads = p->grads_resident ? m->grad_bytes / split : 0;
    p->mem_act = m->mem_nops == 0 ? m->act_bytes / tp : 0;
    p->mem_saved = 0;
    /* the timeline is one micro-batch of the whole model; the first stage
     * holds its 1/pp of the saved activations for each micro-batch in
     * flight: pp of them under 1F1B and ZB-H1 (fewer when there are
     * fewer micro-batches), all of them under GPipe */
    int mb = o->micro_batches > 0 ? o->micro_batches : 1;
    p->inflight = o->pp <= 1                      ? 1
                  : o->schedule == CG_PP_GPIPE || mb < o->pp ? mb
                                                             : o->pp;
    double held = o->pp > 1 ? (double)p->inflight / o->pp : 1;
    double best = -1;
    for (int i = 0; i < m->mem_nops; i++) {
        double gr = p->grads_resident ? m->grad_bytes / split : m->mem_grad[i] / split;
        double saved = m->mem_saved[i] / tp * held;
        double act = (m->mem_act[i] - m->mem_saved[i]) / tp + saved;
        double x = gr + act;
        if (x > best) {
            best = x;
            p->mem_op = i;
            p->mem_grads = gr;
            p->mem_act = act;
            p->mem_saved = saved;
        }
    }
    p->mem_total = p->mem_params + p->mem_grads + p->mem_opt + p->mem_act;
}

/* ---- the stage cut (m->nstages > 0) ----------------------------------- */

static int pass_kind(CgPipeSchedule s)
{
    return s == CG_PP_GPIPE ? PASS_SCHED_GPIPE : s == CG_PP_ZBH1 ? PASS_SCHED_ZBH1
                                                                : PASS_SCHED_1F1B;
}

/* Seconds of program k (0 F, 1 B, 2 W) of stage st, its TP collectives
 * included: the compiled ones (a partitioned step), or for an ideal split
 * the program's compute over tp and Megatron's two all-reduces of the
 * activations per layer in F and in B. */
static double stage_prog_s(const CgClusterModel *m, const CgClusterOpts *o,
                           const CgStageModel *st, int k)
{
    double bw = o->tp <= o->gpus_per_node ? o->intra_bw : o->inter_bw;
    int tp = tp_left(m, o);
    double t = st->t[k] / tp;
    if (o->stage_bw > 0)
        t += 2.0 * st->copy_bytes[k] / tp / o->stage_bw;
    if (o->tp <= 1)
        return t;
    if (m->tp_split > 1) {
        for (int c = 0; c < 2; c++) {
            int n = st->tp_n[k][c];
            if (n == 0)
                continue;
            double one = c == 0 ? cg_ring_allreduce(st->tp_bytes[k][c], o->tp, bw, o->alpha_s)
                                : cg_ring_half(st->tp_bytes[k][c], o->tp, bw, o->alpha_s);
            t += one + (n - 1) * (c == 0 ? 2.0 : 1.0) * (o->tp - 1) * o->alpha_s;
        }
        return t;
    }
    if (k < 2) {
        double act = (double)m->micro_batch * m->seq_len * m->d_model * m->act_dtype_bytes;
        t += 2.0 * st->layers * cg_ring_allreduce(act, o->tp, bw, o->alpha_s);
    }
    return t;
}

double cg_cluster_stage_prog(const CgClusterModel *m, const CgClusterOpts *o, int s, int k)
{
    return stage_prog_s(m, o, &m->stages[s], k);
}

/* Every stage's actions under o's schedule (3 x micro-batches each), at
 * most wcap[t] W's waiting on stage t under zb-h1 (may be NULL,
 * pass_stage_schedule_capped); the caller frees them. */
static PassStageAct *stage_orders(const CgClusterModel *m, const CgClusterOpts *o,
                                  const int *wcap)
{
    int n = m->nstages, mb = o->micro_batches > 0 ? o->micro_batches : 1;
    PassStageAct *a = xmalloc(sizeof(PassStageAct) * (size_t)(n * 3 * mb + 1));
    pass_stage_schedule_all(pass_kind(o->schedule), n, mb, wcap, a);
    return a;
}

/* Over stage st's actions a (3 x micro-batches): the most micro-batches it
 * holds at once (an F run, its W not yet); into *bytes the most bytes st
 * holds at once: held_f for each micro-batch between its F and W, held_b
 * between its B and W. */
static int stage_held(const CgClusterOpts *o, const CgStageModel *st, const PassStageAct *a,
                      double *bytes)
{
    int na = 3 * (o->micro_batches > 0 ? o->micro_batches : 1);
    int nf = 0, nb = 0, most = 0;
    double top = 0;
    for (int i = 0; i < na; i++) {
        if (a[i].kind == 'F')
            nf++;
        else if (a[i].kind == 'B')
            nb++;
        else
            nf--, nb--;
        most = nf > most ? nf : most;
        double x = nf * st->held_f + nb * st->held_b;
        top = x > top ? x : top;
    }
    *bytes = top;
    return most;
}

/* Stage s's memory per GPU with its actions a (stage_orders) into p's
 * mem_ rows and inflight; returns mem_total. */
static double stage_memory(const CgClusterModel *m, const CgClusterOpts *o, int s,
                           const PassStageAct *a, CgClusterPlan *p)
{
    const CgStageModel *st = &m->stages[s];
    double held;
    p->inflight = stage_held(o, st, a, &held);
    int tp = tp_left(m, o);
    double share = m->param_bytes > 0 ? st->param_bytes / m->param_bytes : 0;
    int zdiv = o->zero && !m->opt_sharded ? o->dp : 1;
    p->mem_params = st->param_bytes / tp;
    p->mem_grads = m->grad_bytes * share / tp; /* accumulated over the micro-batches */
    p->mem_opt = m->opt_bytes * share / tp / zdiv;
    p->mem_saved = held / tp;
    p->mem_act = p->mem_saved + st->tmp_bytes / tp;
    p->grads_resident = true;
    p->mem_op = -1;
    p->mem_total = p->mem_params + p->mem_grads + p->mem_opt + p->mem_act;
    return p->mem_total;
}

/* Under zb-h1 with the stages' held bytes known: into wcap (n entries) the
 * most W's each stage keeps waiting so that none needs more than
 * CG_ZBH1_MEM x 1f1b's peak (the most over the stages; a stage already
 * over it keeps none waiting, as under 1f1b): from the unit-slot default
 * (stage t: t), the cap of each stage over it lowered by one, until none
 * is. False (wcap untouched): not zb-h1, or no bytes known. */
static bool zbh1_caps(const CgClusterModel *m, const CgClusterOpts *o, int *wcap)
{
    int n = m->nstages;
    bool known = false;
    for (int s = 0; s < n; s++)
        known |= m->stages[s].held_f > 0 || m->stages[s].held_b > 0;
    if (o->schedule != CG_PP_ZBH1 || n < 2 || !known)
        return false;
    int M3 = 3 * (o->micro_batches > 0 ? o->micro_batches : 1);
    CgClusterOpts o1 = *o;
    o1.schedule = CG_PP_1F1B;
    CgClusterPlan ps;
    double peak = 0;
    PassStageAct *a = stage_orders(m, &o1, NULL);
    for (int s = 0; s < n; s++) {
        memset(&ps, 0, sizeof ps);
        double x = stage_memory(m, &o1, s, a + s * M3, &ps);
        peak = x > peak ? x : peak;
    }
    free(a);
    double budget = CG_ZBH1_MEM * peak;
    for (int s = 0; s < n; s++)
        wcap[s] = s;
    for (bool lowered = true; lowered;) {
        lowered = false;
        a = stage_orders(m, o, wcap);
        for (int s = 0; s < n; s++) {
            memset(&ps, 0, sizeof ps);
            if (wcap[s] > 0 && stage_memory(m, o, s, a + s * M3, &ps) > budget) {
                wcap[s]--;
                lowered = true;
            }
        }
        free(a);
    }
    return true;
}

int cg_cluster_zbh1_caps(const CgClusterModel *m, const CgClusterOpts *o, int *wcap)
{
    if (!zbh1_caps(m, o, wcap))
        for (int s = 0; s < m->nstages; s++)
            wcap[s] = s;
    return m->nstages;
}

/* Every stage's actions under o's schedule, zb-h1's capped (zbh1_caps):
 * computed once per plan and shared by the stages' memory and the
 * pipeline's simulation; the caller frees them. */
static PassStageAct *plan_orders(const CgClusterModel *m, const CgClusterOpts *o)
{
    int *wcap = xmalloc(sizeof(int) * (size_t)(m->nstages + 1));
    bool capped = zbh1_caps(m, o, wcap);
    PassStageAct *a = stage_orders(m, o, capped ? wcap : NULL);
    free(wcap);
    return a;
}

/* cg_cluster_stage with the stages' actions a (plan_orders). */
static double stage_with(const CgClusterModel *m, const CgClusterOpts *o, int s,
                         const PassStageAct *a, CgClusterPlan *p)
{
    int mb = o->micro_batches > 0 ? o->micro_batches : 1;
    stage_memory(m, o, s, a + s * 3 * mb, p);
    double busy = 0;
    for (int k = 0; k < 3; k++)
        busy += stage_prog_s(m, o, &m->stages[s], k);
    return mb * busy;
}

double cg_cluster_stage(const CgClusterModel *m, const CgClusterOpts *o, int s,
                        CgClusterPlan *p)
{
    PassStageAct *a = plan_orders(m, o);
    double busy = stage_with(m, o, s, a, p);
    free(a);
    return busy;
}

void cg_cluster_stages(const CgClusterModel *m, const CgClusterOpts *o, CgClusterPlan *ps,
                       double *busy)
{
    PassStageAct *a = plan_orders(m, o);
    for (int s = 0; s < m->nstages; s++) {
        memset(&ps[s], 0, sizeof ps[s]);
        busy[s] = stage_with(m, o, s, a, &ps[s]);
    }
    free(a);
}

/* cg_cluster_pipeline with the stages' actions a (plan_orders). */
static double pipeline_with(const CgClusterModel *m, const CgClusterOpts *o,
                            const PassStageAct *a)
{
    int n = m->nstages, mb = o->micro_batches > 0 ? o->micro_batches : 1, M3 = 3 * mb;
    /* pipeline neighbours are tp x dp ranks apart (PP outermost) */
    bool inside = (int64_t)o->tp * o->dp * 2 <= o->gpus_per_node;
    double bw = inside ? o->intra_bw : o->inter_bw;
    double *fend = xmalloc(sizeof(double) * (size_t)(n * mb + 1));
    double *bend = xmalloc(sizeof(double) * (size_t)(n * mb + 1));
    double *wend = xmalloc(sizeof(double) * (size_t)(n * mb + 1));
    double *busy = xcalloc((size_t)n + 1, sizeof(double));
    double *dur = xmalloc(sizeof(double) * (size_t)(3 * n + 1));
    double *hop = xcalloc((size_t)n + 1, sizeof(double)); /* boundary s: s-1 -> s */
    int *next = xcalloc((size_t)n + 1, sizeof(int));
    for (int s = 0; s < n; s++) {
        for (int k = 0; k < 3; k++)
            dur[3 * s + k] = stage_prog_s(m, o, &m->stages[s], k);
        if (s > 0)
            hop[s] = m->stages[s - 1].send_bytes / bw + o->alpha_s;
    }
    for (int i = 0; i < n * mb; i++)
        fend[i] = bend[i] = wend[i] = -1;
    /* each stage runs its next action once what it needs has arrived: an
     * F the activation from s-1, a B its own F and the gradient from s+1
     * (sent after s+1's B under zb-h1, after its W under gpipe and 1f1b,
     * pass_stage_schedule), a W its own B; the orders are the unit-slot
     * simulation's, so every stage advances until all are done */
    bool grad_after_b = o->schedule == CG_PP_ZBH1;
    double end = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < n; s++)
            for (; next[s] < M3; next[s]++) {
                PassStageAct x = a[s * M3 + next[s]];
                int k = x.mb;
                double ready;
                if (x.kind == 'F') {
                    if (s > 0 && fend[(s - 1) * mb + k] < 0)
                        break;
                    ready = s > 0 ? fend[(s - 1) * mb + k] + hop[s] : 0;
                } else if (x.kind == 'B') {
                    const double *gend = grad_after_b ? bend : wend;
                    if (fend[s * mb + k] < 0 || (s < n - 1 && gend[(s + 1) * mb + k] < 0))
                        break;
                    ready = fend[s * mb + k];
                    if (s < n - 1 && gend[(s + 1) * mb + k] + hop[s + 1] > ready)
                        ready = gend[(s + 1) * mb + k] + hop[s + 1];
                } else {
                    if (bend[s * mb + k] < 0)
                        break;
                    ready = bend[s * mb + k];
                }
                double t0 = ready > busy[s] ? ready : busy[s];
                int pk = x.kind == 'F' ? 0 : x.kind == 'B' ? 1 : 2;
                busy[s] = t0 + dur[3 * s + pk];
                if (x.kind == 'F')
                    fend[s * mb + k] = busy[s];
                else if (x.kind == 'B')
                    bend[s * mb + k] = busy[s];
                else
                    wend[s * mb + k] = busy[s];
                end = busy[s] > end ? busy[s] : end;
                moved = true;
            }
    }
    for (int s = 0; s < n; s++)
        if (next[s] < M3)
            die("cg_cluster_pipeline: stage %d stalls at action %d of %d", s, next[s], M3);
    free(fend);
    free(bend);
    free(wend);
    free(busy);
    free(dur);
    free(hop);
    free(next);
    return end;
}

double cg_cluster_pipeline(const CgClusterModel *m, const CgClusterOpts *o)
{
    PassStageAct *a = plan_orders(m, o);
    double end = pipeline_with(m, o, a);
    free(a);
    return end;
}

bool cg_cluster_project(const CgClusterModel *m, const CgClusterOpts *o, CgClusterPlan *p,
                        char *why, size_t nwhy)
{
    memset(p, 0, sizeof *p);
    if (o->tp < 1 || o->pp < 1 || o->dp < 1 || (int64_t)o->tp * o->pp * o->dp != o->gpus) {
        snprintf(why, nwhy, "--tp %d x --pp %d x --dp %d must equal --gpus %d", o->tp, o->pp,
                 o->dp, o->gpus);
        return false;
    }
    if (o->micro_batches < 1 || m->micro_batch < 1 || m->seq_len < 1) {
        snprintf(why, nwhy, "need at least one micro-batch of at least one sequence");
        return false;
    }
    double split = (double)tp_left(m, o) * o->pp;
    p->sequences = (double)m->micro_batch * o->micro_batches * o->dp;
    p->tokens_per_step = p->sequences * (double)m->seq_len;

    cg_cluster_memory(m, o, p);
    int zdiv = o->zero && !m->opt_sharded ? o->dp : 1; /* a sharded step is one rank's */

    /* compute: one micro-batch's forward and backward per stage */
    p->t_mb = m->fwd_bwd_s / split;
    /* TP: per layer two all-reduces of the activations forward, two
     * backward (Megatron's MLP and attention), on the micro-batch */
    bool tp_inside = o->tp <= o->gpus_per_node;
    double tp_bw = !tp_inside ? o->inter_bw : o->tp_bw > 0 ? o->tp_bw : o->intra_bw;
    double tp_alpha = tp_inside && o->tp_bw > 0 ? o->tp_alpha_s : o->alpha_s;
    double act = (double)m->micro_batch * m->seq_len * m->d_model * m->act_dtype_bytes;
    p->t_tp_mb = o->tp > 1 ? 4.0 * m->layers / o->pp * cg_ring_allreduce(act, o->tp, tp_bw,
                                                                          tp_alpha)
                           : 0;
    p->t_tp_exposed_mb = p->t_tp_mb;
    if (m->tp_split > 1 && o->tp > 1) { /* the partitioned step's own collectives */
        p->t_tp_mb = p->t_tp_exposed_mb = 0;
        for (int i = 0; i < m->ntp; i++) {
            double t = m->tp_coll[i] == CG_COLL_ALLREDUCE
                           ? cg_ring_allreduce(m->tp_bytes[i], o->tp, tp_bw, tp_alpha)
                           : cg_ring_half(m->tp_bytes[i], o->tp, tp_bw, tp_alpha);
            double hide = m->tp_hide_s ? m->tp_hide_s[i] : 0; /* one stage's, 1/pp below */
            p->t_tp_mb += t;
            p->t_tp_exposed_mb += t > hide ? t - hide : 0;
        }
        p->t_tp_mb /= o->pp;
        p->t_tp_exposed_mb /= o->pp;
    }
    /* each stage runs m slots of one micro-batch's forward and backward
     * (u, its TP collectives included) and idles pp - 1 of them under
     * GPipe and 1F1B: bubble (pp - 1) / (m + pp - 1) (Megatron). ZB-H1
     * fills them with the deferred weight gradients W: each idle slot
     * shrinks to F + B - W (Qi et al. 2023), F, B and W in the shares of
     * the step's forward, input-gradient and weight-gradient times */
    double u = p->t_mb + p->t_tp_mb, idle = 1;
    if (o->schedule == CG_PP_ZBH1 && m->fwd_bwd_s > 0) {
        double f = m->forward_s / m->fwd_bwd_s, w = m->wgrad_s / m->fwd_bwd_s;
        idle = f + (1 - f - w) - w;
        idle = idle > 0 ? idle : 0;
    }
    p->t_bubble = (o->pp - 1) * u * idle;
    p->t_pipeline = o->micro_batches * u + p->t_bubble;
    p->t_opt = m->opt_s / split / zdiv;
    p->crit_stage = -1;
    p->cut = m->nstages > 1 && m->nstages == o->pp &&
             (double)o->micro_batches * o->pp * o->pp <= CG_PP_SIM_MAX;
    if (p->cut) {
        /* the compiler's cut: the simulated makespan of the stages' F, B
         * and W in the schedule's order; the most loaded stage's compute
         * per micro-batch, its share of the optimizer; memory per GPU:
         * the stage that holds the most */
        CgClusterPlan ps;
        double most = 0, opt = 0;
        p->mem_total = -1;
        PassStageAct *a = plan_orders(m, o); /* once for every stage and the simulation */
        for (int s = 0; s < m->nstages; s++) {
            memset(&ps, 0, sizeof ps);
            double busy = stage_with(m, o, s, a, &ps);
            double share = m->param_bytes > 0 ? m->stages[s].param_bytes / m->param_bytes : 0;
            if (busy > most) {
                most = busy;
                p->t_mb = 0, p->t_tp_mb = 0;
                for (int k = 0; k < 3; k++) { /* compute (cpu: and copies), TP */
                    double c = m->stages[s].t[k] / tp_left(m, o);
                    if (o->stage_bw > 0)
                        c += 2.0 * m->stages[s].copy_bytes[k] / tp_left(m, o) / o->stage_bw;
                    p->t_mb += c;
                    p->t_tp_mb += stage_prog_s(m, o, &m->stages[s], k) - c;
                }
            }
            if (m->opt_s * share / tp_left(m, o) / zdiv > opt)
                opt = m->opt_s * share / tp_left(m, o) / zdiv;
            if (ps.mem_total > p->mem_total) {
                p->mem_params = ps.mem_params, p->mem_grads = ps.mem_grads;
                p->mem_opt = ps.mem_opt, p->mem_act = ps.mem_act, p->mem_saved = ps.mem_saved;
                p->mem_total = ps.mem_total, p->grads_resident = true, p->mem_op = -1;
                p->inflight = ps.inflight, p->crit_stage = s;
            }
        }
        p->t_pipeline = pipeline_with(m, o, a);
        free(a);
        p->t_bubble = p->t_pipeline > most ? p->t_pipeline - most : 0;
        p->t_opt = opt;
    }
    p->bubble = p->t_pipeline > 0 ? p->t_bubble / p->t_pipeline : 0;

    /* DP: the last micro-batch's backward is what the buckets overlap */
    bool dp_inside = (int64_t)o->tp * o->dp <= o->gpus_per_node;
    p->dp_bw = dp_inside ? o->intra_bw : o->inter_bw;
    double scale = 1.0 / split;
    dp_comm(m, o, scale, p->dp_bw, &p->t_dp, &p->t_dp_exposed);
    if (o->zero) { /* the params' all-gather, hidden by the next forward's compute */
        double gather = 0;
        for (int i = 0; m->bucket_coll && i < m->nbuckets; i++)
            if (m->bucket_coll[i] == CG_COLL_ALL_GATHER)
                gather += bucket_s(o, CG_COLL_ALL_GATHER, m->bucket_bytes[i] * scale, p->dp_bw);
        if (!m->bucket_coll) /* compiled without zero: the params in one gather */
            gather = bucket_s(o, CG_COLL_ALL_GATHER, m->param_bytes * scale, p->dp_bw);
        double hide = m->forward_s * scale;
        p->t_dp += gather;
        p->t_dp_exposed += gather > hide ? gather - hide : 0;
    }
    p->step_predicted = p->t_pipeline + p->t_dp_exposed + p->t_opt;
    p->step = o->step_time > 0 ? o->step_time : p->step_predicted;

    /* throughput */
    p->tokens_per_s = p->tokens_per_step / p->step;
    double peak = o->peak * o->gpus;
    p->mfu = peak > 0 ? 6.0 * m->nparams * p->tokens_per_step / p->step / peak : 0;
    p->mfu_attn = peak > 0 ? (6.0 * m->nparams + 12.0 * m->layers * m->d_model * m->seq_len) *
                                 p->tokens_per_step / p->step / peak
                           : 0;

    /* end date */
    if (o->tokens > 0) {
        p->steps = (int64_t)floor(o->tokens / p->tokens_per_step);
        p->days = (double)p->steps * p->step / 86400.0;
        p->days_goodput = p->days / o->goodput;
        if (o->target_days > 0 && p->steps > 0)
            p->step_for_target = o->target_days * 86400.0 * o->goodput / (double)p->steps;
    }
    return true;
}
