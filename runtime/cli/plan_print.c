/* plan_print.c - what `kiln plan` prints (plan_internal.h): the table
 * of the step, memory per GPU and end date, the per-stage rows, the remat
 * choice at the device's memory, and the same as JSON (--json). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan_internal.h"

/* DP buckets per CgColl */
static void count_kinds(const CgClusterModel *m, int nk[3])
{
    nk[0] = nk[1] = nk[2] = 0;
    for (int i = 0; i < m->nbuckets; i++)
        nk[m->bucket_coll ? m->bucket_coll[i] : CG_COLL_ALLREDUCE]++;
}

static void print_remat_choice(const CgDevice *dev, const RematChoice *c)
{
    char x[32], y[32], z[32];
    ir_fmt_bytes(dev->mem, 2, x, sizeof x);
    if (dev->mem <= 0)
        return;
    if (!c->ran) {
        printf("  remat at %s: params, grads and optimizer state alone do not fit\n", x);
        return;
    }
    ir_fmt_bytes(c->budget_act, 2, y, sizeof y);
    printf("  remat at %s (room for %s of activations per GPU): ", x, y);
    if (!c->fits && c->least > 0) {
        ir_fmt_bytes(c->least, 2, z, sizeof z);
        printf("no plan fits; the least memory per GPU the remat pass found is %s\n", z);
        return;
    }
    if (!c->fits) {
        printf("no plan fits: %s\n", c->why);
        return;
    }
    const RematReport *r = &c->rr;
    ir_fmt_bytes(c->act, 2, x, sizeof x);
    ir_fmt_seconds(c->step, y, sizeof y);
    if (r->nrecomputed == 0) {
        printf("auto keeps all %d saved activations (remat none): activations %s, step %s\n",
               r->nsaved, x, y);
        return;
    }
    ir_fmt_bytes((double)r->recomputed_bytes, 2, z, sizeof z);
    printf("auto recomputes %d of %d saved activations (%s; %s): activations %s, step %s\n",
           r->nrecomputed, r->nsaved, z,
           r->chosen == REMAT_AUTO ? "its own plan"
                                   : pass_remat_policy_name(r->chosen),
           x, y);
}

void cli_plan_remat_json(cJSON *j, const CgDevice *dev, const RematChoice *c)
{
    cJSON *r = cJSON_AddObjectToObject(j, "remat_at_memory");
    cJSON_AddNumberToObject(r, "memory", dev->mem);
    cJSON_AddBoolToObject(r, "static_fits", c->ran);
    cJSON_AddBoolToObject(r, "fits", c->fits);
    cJSON_AddNumberToObject(r, "activation_budget", c->budget_act);
    if (!c->fits) {
        if (c->least > 0)
            cJSON_AddNumberToObject(r, "least_memory", c->least);
        return;
    }
    cJSON_AddStringToObject(r, "chosen", c->rr.nrecomputed == 0 ? "none"
                                         : c->rr.chosen == REMAT_AUTO
                                             ? "auto"
                                             : pass_remat_policy_name(c->rr.chosen));
    cJSON_AddNumberToObject(r, "saved", c->rr.nsaved);
    cJSON_AddNumberToObject(r, "recomputed", c->rr.nrecomputed);
    cJSON_AddNumberToObject(r, "recomputed_bytes", (double)c->rr.recomputed_bytes);
    cJSON_AddNumberToObject(r, "extra_flops", c->rr.extra_flops);
    cJSON_AddNumberToObject(r, "activations", c->act);
    cJSON_AddNumberToObject(r, "total", c->total);
    cJSON_AddNumberToObject(r, "step_s", c->step);
}

/* The cut's rows: per stage its ops and layers, params, one micro-batch's
 * F, B and W (TP collectives included), busy share of the step, the
 * micro-batches it holds and its memory per GPU. */
static void print_stages(const CgClusterOpts *o, const CgClusterModel *m, const CgClusterPlan *p)
{
    printf("    %-5s %-13s %6s %6s %10s %10s %10s %6s %5s %12s\n", "stage", "ops", "layers",
           "params", "F", "B", "W", "busy", "holds", "memory");
    CgClusterPlan *pss = xmalloc(sizeof(CgClusterPlan) * (size_t)(m->nstages + 1));
    double *busys = xmalloc(sizeof(double) * (size_t)(m->nstages + 1));
    cg_cluster_stages(m, o, pss, busys);
    for (int s = 0; s < m->nstages; s++) {
        const CgStageModel *st = &m->stages[s];
        const CgClusterPlan ps = pss[s];
        double busy = busys[s];
        double fbw[3];
        char ops[32], t[3][32], mem[32];
        snprintf(ops, sizeof ops, "%d..%d", st->first_op, st->first_op + st->nops - 1);
        for (int k = 0; k < 3; k++) {
            fbw[k] = cg_cluster_stage_prog(m, o, s, k);
            ir_fmt_seconds(fbw[k], t[k], sizeof t[k]);
        }
        ir_fmt_bytes(ps.mem_total, 2, mem, sizeof mem);
        printf("    %-5d %-13s %6d %6d %10s %10s %10s %5.1f%% %5d %12s%s\n", s, ops, st->layers,
               st->nparams, t[0], t[1], t[2],
               p->t_pipeline > 0 ? 100 * busy / p->t_pipeline : 0, ps.inflight, mem,
               s == p->crit_stage ? " <- memory per GPU" : "");
    }
    free(pss);
    free(busys);
}

void cli_plan_print(const PlanArgs *a, const CgDevice *dev, const CgClusterOpts *o,
                    const Variant *v, const CgClusterPlan *p, bool measured_link,
                    const RematChoice *rc, const char *cut_why)
{
    char x[32], y[32], z[32], w[32];
    const CgClusterModel *m = &v->m;
    printf("plan: %d x %s (%d per node), tp %d x pp %d x dp %d, zero %d, %d micro-batch%s of %lld "
           "sequence%s per rank\n", o->gpus, dev->name, o->gpus_per_node, o->tp, o->pp, o->dp,
           o->zero, o->micro_batches, o->micro_batches == 1 ? "" : "es",
           (long long)m->micro_batch, m->micro_batch == 1 ? "" : "s");
    printf("  links: %.3g GB/s inside a node, %.3g GB/s between nodes%s; alpha %.3g us per hop\n",
           o->intra_bw / 1e9, o->inter_bw / 1e9,
           a->intra_bw > 0 || a->inter_bw > 0 ? ""
           : measured_link ? " (inside: MPI between local ranks, measured)"
                           : " (the device's defaults)",
           o->alpha_s * 1e6);
    if (o->tp > 1 && o->tp_bw > 0)
        printf("  TP link inside a node: %.3g GB/s, alpha %.3g us per hop (MPI's non-blocking "
               "all-reduce on the TP group, measured)\n", o->tp_bw / 1e9, o->tp_alpha_s * 1e6);
    printf("model: %.4g params, T %lld, C %lld, L %lld\n", m->nparams, (long long)m->seq_len,
           (long long)m->d_model, (long long)m->layers);
    printf("memory per GPU:\n");
    ir_fmt_bytes(p->mem_params, 2, x, sizeof x);
    ir_fmt_bytes(p->mem_grads, 2, y, sizeof y);
    ir_fmt_bytes(p->mem_opt, 2, z, sizeof z);
    ir_fmt_bytes(p->mem_act, 2, w, sizeof w);
    printf("  params %s, grads %s, optimizer state %s, activations %s\n", x, y, z, w);
    ir_fmt_bytes(p->mem_saved, 2, x, sizeof x);
    ir_fmt_bytes(p->mem_act - p->mem_saved, 2, y, sizeof y);
    printf("  activations: %s saved for backward, %s other temporaries; grads: %s\n", x, y,
           p->grads_resident ? "all of them, accumulated over the micro-batches"
                             : "those live where the step's memory peaks");
    ir_fmt_bytes(p->mem_total, 2, x, sizeof x);
    if (dev->mem > 0) {
        ir_fmt_bytes(dev->mem, 2, y, sizeof y);
        printf("  total %s of %s: %s\n", x, y,
               p->mem_total <= dev->mem ? "fits" : "does NOT fit (see the remat rows)");
    } else {
        printf("  total %s\n", x);
    }
    print_remat_choice(dev, rc);
    if (p->cut)
        printf("    (the rows above are the stage cut's, stage %d's; the remat choice and the "
               "remat rows are the whole step's over the ideal split: kiln train --pp runs "
               "no remat yet)\n", p->crit_stage);
    printf("step (critical path per GPU):\n");
    ir_fmt_seconds(p->t_mb, x, sizeof x);
    ir_fmt_seconds(p->t_tp_mb, y, sizeof y);
    printf("  compute per micro-batch and stage %s, TP collectives %s\n", x, y);
    if (m->tp_split > 1) {
        double tb = 0;
        for (int i = 0; i < m->ntp; i++)
            tb += m->tp_bytes[i];
        ir_fmt_bytes(tb, 2, x, sizeof x);
        printf("  TP: the partitioned graph of rank 0 (docs/parallel.md): %d collectives per "
               "micro-batch, %s\n", m->ntp, x);
        ir_fmt_seconds(p->t_tp_exposed_mb, y, sizeof y);
        printf("  TP exposed %s (what the compute up to each collective's first reader does "
               "not hide; the step counts the TP collectives whole)\n", y);
    } else if (o->tp > 1) {
        printf("  TP: an ideal split of the step (the model marks no param for tensor "
               "parallelism) and 4 all-reduces per layer\n");
    }
    ir_fmt_seconds(p->t_pipeline, x, sizeof x);
    ir_fmt_seconds(p->t_bubble, y, sizeof y);
    printf("  pipeline (%s) %s, of which bubble %s (%.1f%%)\n", cg_pp_schedule_name(o->schedule),
           x, y, 100 * p->bubble);
    if (o->pp > 1 && p->cut) {
        printf("    from the compiler's stage cut (as kiln compile --pp %d cuts it) and the "
               "schedule simulated with each stage's F, B and W (passes/stages.c); the most "
               "loaded stage's busy time is the step's compute, the rest its bubble\n", o->pp);
        if (v->stage_scale != 1)
            printf("    (on a GPU the stage programs' times are scaled by %.2f to sum to the "
                   "whole step's: compiled apart, what crosses between them stays f32; see "
                   "docs/plan.md)\n", v->stage_scale);
        print_stages(o, m, p);
    } else if (o->pp > 1) {
        printf("    from the ideal split and the formulas (docs/plan.md): the stage cut could "
               "not be used: %s\n", cut_why && *cut_why ? cut_why : "?");
    }
    if (o->pp > 1) {
        double f = m->fwd_bwd_s > 0 ? m->forward_s / m->fwd_bwd_s : 0;
        double wg = m->fwd_bwd_s > 0 ? m->wgrad_s / m->fwd_bwd_s : 0;
        printf("    per micro-batch: forward %.0f%%, input gradients %.0f%%, weight gradients "
               "%.0f%% (W); ", 100 * f, 100 * (1 - f - wg), 100 * wg);
        if (p->cut)
            printf("stage %d, with the most memory, holds %d micro-batch%s of activations\n",
                   p->crit_stage, p->inflight, p->inflight == 1 ? "" : "es");
        else
            printf("the first stage holds %d micro-batch%s of activations\n", p->inflight,
                   p->inflight == 1 ? "" : "es");
    }
    ir_fmt_seconds(p->t_dp, x, sizeof x);
    ir_fmt_seconds(p->t_dp_exposed, y, sizeof y);
    printf("  DP gradient communication %s in %d buckets at %.3g GB/s, exposed %s%s\n", x,
           m->nbuckets, p->dp_bw / 1e9, y, o->no_overlap ? " (--no-overlap)" : "");
    int nk[3];
    count_kinds(m, nk);
    if (nk[CG_COLL_REDUCE_SCATTER] + nk[CG_COLL_ALL_GATHER] > 0)
        printf("    zero=1: %d reduce-scatter, %d all-reduce (the norm), %d all-gather buckets "
               "(the gathers hide behind the next forward)\n",
               nk[CG_COLL_REDUCE_SCATTER], nk[CG_COLL_ALLREDUCE], nk[CG_COLL_ALL_GATHER]);
    ir_fmt_seconds(p->t_opt, x, sizeof x);
    ir_fmt_seconds(p->step_predicted, y, sizeof y);
    printf("  optimizer %s; predicted step %s\n", x, y);
    ir_fmt_seconds(p->step, x, sizeof x);
    if (o->step_time > 0)
        printf("  step %s (--step-time; replaces the prediction)\n", x);
    printf("throughput: %.0f tokens per step, %.0f tokens/s", p->tokens_per_step,
           p->tokens_per_s);
    if (o->peak > 0)
        printf(", MFU %.1f%% (6N), %.1f%% with attention", 100 * p->mfu, 100 * p->mfu_attn);
    printf("\n");
    if (o->tokens > 0) {
        printf("end date: %lld steps to %.4g tokens; %.2f days of steps, %.2f days at goodput "
               "%.2f\n", (long long)p->steps, o->tokens, p->days, p->days_goodput, o->goodput);
        /* which count it read: B and G are both 1e9 */
        const char *text = a->tokens_text ? a->tokens_text : "";
        size_t tl = strlen(text);
        const char *unit = tl ? cli_plan_count_unit(text[tl - 1]) : NULL;
        printf("  --tokens %s read as %.4g tokens%s%s%s\n", text, o->tokens, unit ? " (" : "",
               unit ? unit : "", unit ? ")" : "");
        if (o->target_days > 0)
            printf("  to finish in %.2f days: %.2f s per step\n", o->target_days,
                   p->step_for_target);
    }
}

cJSON *cli_plan_json(const CgDevice *dev, const CgClusterOpts *o, const Variant *v,
                     const CgClusterPlan *p, const char *cut_why)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "device", dev->name);
    cJSON_AddNumberToObject(j, "gpus", o->gpus);
    cJSON_AddNumberToObject(j, "tp", o->tp);
    cJSON_AddBoolToObject(j, "tp_partitioned", v->m.tp_split > 1);
    cJSON_AddNumberToObject(j, "tp_collectives_per_microbatch", v->m.ntp);
    cJSON_AddNumberToObject(j, "pp", o->pp);
    cJSON_AddNumberToObject(j, "dp", o->dp);
    cJSON_AddNumberToObject(j, "zero", o->zero);
    cJSON_AddNumberToObject(j, "micro_batches", o->micro_batches);
    cJSON_AddStringToObject(j, "schedule", cg_pp_schedule_name(o->schedule));
    cJSON_AddNumberToObject(j, "microbatches_in_flight", p->inflight);
    cJSON_AddNumberToObject(j, "params", v->m.nparams);
    cJSON *mem = cJSON_AddObjectToObject(j, "memory_per_gpu");
    cJSON_AddNumberToObject(mem, "params", p->mem_params);
    cJSON_AddNumberToObject(mem, "grads", p->mem_grads);
    cJSON_AddNumberToObject(mem, "optimizer", p->mem_opt);
    cJSON_AddNumberToObject(mem, "activations", p->mem_act);
    cJSON_AddNumberToObject(mem, "activations_saved", p->mem_saved);
    cJSON_AddBoolToObject(mem, "grads_resident", p->grads_resident);
    cJSON_AddNumberToObject(mem, "total", p->mem_total);
    cJSON_AddNumberToObject(mem, "device", dev->mem);
    cJSON *s = cJSON_AddObjectToObject(j, "step");
    cJSON_AddNumberToObject(s, "compute_per_microbatch_s", p->t_mb);
    cJSON_AddNumberToObject(s, "tp_per_microbatch_s", p->t_tp_mb);
    cJSON_AddNumberToObject(s, "tp_exposed_per_microbatch_s", p->t_tp_exposed_mb);
    cJSON_AddNumberToObject(s, "pipeline_s", p->t_pipeline);
    cJSON_AddNumberToObject(s, "bubble_s", p->t_bubble);
    cJSON_AddNumberToObject(s, "bubble_fraction", p->bubble);
    cJSON_AddNumberToObject(s, "dp_comm_s", p->t_dp);
    cJSON_AddNumberToObject(s, "dp_exposed_s", p->t_dp_exposed);
    cJSON_AddNumberToObject(s, "dp_buckets", v->m.nbuckets);
    int nk[3];
    count_kinds(&v->m, nk);
    cJSON_AddNumberToObject(s, "dp_allreduce_buckets", nk[CG_COLL_ALLREDUCE]);
    cJSON_AddNumberToObject(s, "dp_reduce_scatter_buckets", nk[CG_COLL_REDUCE_SCATTER]);
    cJSON_AddNumberToObject(s, "dp_all_gather_buckets", nk[CG_COLL_ALL_GATHER]);
    cJSON_AddStringToObject(s, "pipeline_model", o->pp <= 1 ? "none" : p->cut ? "cut" : "formula");
    if (o->pp > 1 && !p->cut)
        cJSON_AddStringToObject(s, "cut_error", cut_why ? cut_why : "");
    if (p->cut) {
        cJSON *arr = cJSON_AddArrayToObject(s, "stages");
        CgClusterPlan *pss = xmalloc(sizeof(CgClusterPlan) * (size_t)(v->m.nstages + 1));
        double *busys = xmalloc(sizeof(double) * (size_t)(v->m.nstages + 1));
        cg_cluster_stages(&v->m, o, pss, busys);
        for (int k = 0; k < v->m.nstages; k++) {
            const CgStageModel *st = &v->m.stages[k];
            const CgClusterPlan ps = pss[k];
            double busy = busys[k];
            cJSON *r = cJSON_CreateObject();
            cJSON_AddNumberToObject(r, "first_op", st->first_op);
            cJSON_AddNumberToObject(r, "last_op", st->first_op + st->nops - 1);
            cJSON_AddNumberToObject(r, "layers", st->layers);
            cJSON_AddNumberToObject(r, "params", st->nparams);
            cJSON_AddNumberToObject(r, "forward_s", cg_cluster_stage_prog(&v->m, o, k, 0));
            cJSON_AddNumberToObject(r, "input_grad_s", cg_cluster_stage_prog(&v->m, o, k, 1));
            cJSON_AddNumberToObject(r, "weight_grad_s", cg_cluster_stage_prog(&v->m, o, k, 2));
            cJSON_AddNumberToObject(r, "busy_s", busy);
            cJSON_AddNumberToObject(r, "microbatches_held", ps.inflight);
            cJSON_AddNumberToObject(r, "memory", ps.mem_total);
            cJSON_AddItemToArray(arr, r);
        }
        free(pss);
        free(busys);
    }
    cJSON_AddNumberToObject(s, "optimizer_s", p->t_opt);
    cJSON_AddNumberToObject(s, "predicted_s", p->step_predicted);
    cJSON_AddNumberToObject(s, "step_s", p->step);
    cJSON_AddNumberToObject(j, "tokens_per_step", p->tokens_per_step);
    cJSON_AddNumberToObject(j, "tokens_per_s", p->tokens_per_s);
    cJSON_AddNumberToObject(j, "mfu", p->mfu);
    cJSON_AddNumberToObject(j, "mfu_attention", p->mfu_attn);
    if (o->tokens > 0) {
        cJSON_AddNumberToObject(j, "token_budget", o->tokens);
        cJSON_AddNumberToObject(j, "steps", (double)p->steps);
        cJSON_AddNumberToObject(j, "days", p->days);
        cJSON_AddNumberToObject(j, "days_at_goodput", p->days_goodput);
        cJSON_AddNumberToObject(j, "goodput", o->goodput);
        if (o->target_days > 0)
            cJSON_AddNumberToObject(j, "step_s_for_target_days", p->step_for_target);
    }
    return j;
}
