/* summary.c - what `kiln compile` prints about a compiled step: params, ops
 * per class, FLOPs, bytes moved, the planned peak, the recompute set and
 * the fusion counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cg_cuda.h"
#include "codegen.h"
#include "cpu.h"
#include "train.h"

void cli_print_warnings(const Model *m)
{
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (m->warnings && (!rank || strcmp(rank, "0") == 0))
        fputs(m->warnings, stderr);
}

void cli_human_count(double x, char *buf, size_t n)
{
    if (x >= 1e12)
        snprintf(buf, n, "%.3f T", x / 1e12);
    else if (x >= 1e9)
        snprintf(buf, n, "%.3f G", x / 1e9);
    else if (x >= 1e6)
        snprintf(buf, n, "%.3f M", x / 1e6);
    else if (x >= 1e3)
        snprintf(buf, n, "%.3f K", x / 1e3);
    else
        snprintf(buf, n, "%.0f", x);
}

/* "32.057 MFLOP", "237 FLOP" */
void cli_human_flops(double x, char *buf, size_t n)
{
    char c[32];
    cli_human_count(x, c, sizeof c);
    snprintf(buf, n, "%s%sFLOP", c, x >= 1e3 ? "" : " ");
}

void cli_print_remat(const RematReport *r, const Graph *g, int64_t budget)
{
    char b0[64], b1[64], b2[64];
    if (r->policy == REMAT_NONE && budget <= 0) {
        printf("remat: none (no --memory-budget)\n");
        return;
    }
    printf("remat: policy %s", pass_remat_policy_name(r->policy));
    if (r->policy == REMAT_AUTO)
        printf(" (chose %s%s)", r->chosen == REMAT_AUTO ? "its own plan" :
                                 pass_remat_policy_name(r->chosen),
               r->chosen != REMAT_AUTO ? "" : r->exact ? ", exact solver" : ", heuristic");
    if (r->chosen == REMAT_AUTO && !r->exact && r->gap >= 0)
        printf(", within %.2f%% of the LP bound", 100 * r->gap);
    if (budget > 0) {
        ir_fmt_bytes((double)budget, 2, b0, sizeof b0);
        printf(", budget %s", b0);
    }
    printf("\n");
    ir_fmt_bytes((double)r->kept_bytes, 2, b0, sizeof b0);
    ir_fmt_bytes((double)r->recomputed_bytes, 2, b1, sizeof b1);
    printf("  activations saved for backward: %d; kept %d (%s), recomputed %d (%s)\n",
           r->nsaved, r->nkept, b0, r->nrecomputed, b1);
    double step = ir_graph_flops(g);
    cli_human_flops(r->extra_flops, b2, sizeof b2);
    printf("  recompute ops: %d; extra %s per step (%.2f%% of the step's FLOPs)\n",
           r->nrecompute_ops, b2, step > 0 ? 100 * r->extra_flops / step : 0.0);
}

void cli_print_summary(const Model *m, const Graph *fwd_g, const Graph *g, const MemPlan *mp)
{
    char b0[64], b1[64], sb[256];
    int64_t nparams = 0;
    int ntensors = 0;
    printf("model %s\n", m->path);
    printf("params:\n");
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        ntensors++;
        nparams = ir_add_sat(nparams, shape_numel(&t->s));
        printf("  %-32s %s\n", t->name, shape_str(g, &t->s, sb, sizeof sb));
    }
    cli_human_count((double)nparams, b0, sizeof b0);
    printf("  %d tensors, %lld params (%s)\n", ntensors, (long long)nparams, b0);
    /* the model's own state (state(): BatchNorm's running statistics) */
    for (int i = 0, n = 0; i < g->t.n; i++)
        if (rt_model_state(&g->t.v[i]))
            printf("%s  %-32s %s\n", n++ ? "" : "state (not trained; saved with the params):\n",
                   g->t.v[i].name, shape_str(g, &g->t.v[i].s, sb, sizeof sb));

    int per_class[OC__COUNT] = {0}, fwd_ops = 0, bwd_ops = 0, opt_ops = 0, rec_ops = 0;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        per_class[ir_opinfo[op->code].cls]++;
        if (op->flags & OPF_RECOMPUTE)
            rec_ops++;
        else if (op->flags & OPF_OPTIM)
            opt_ops++;
        else if (op->flags & OPF_BACKWARD)
            bwd_ops++;
        else
            fwd_ops++;
    }
    printf("ops: %d (forward %d, backward %d, optimizer %d", g->ops.n, fwd_ops, bwd_ops,
           opt_ops);
    if (rec_ops)
        printf(", recompute %d", rec_ops);
    printf(")\n");
    for (int c = 0; c < OC__COUNT; c++)
        if (per_class[c])
            printf("  %-12s %d\n", ir_class_name((OpClass)c), per_class[c]);
    double step_flops = ir_graph_flops(g), fwd_flops = ir_graph_flops(fwd_g);
    double bytes = 0;
    for (int i = 0; i < g->ops.n; i++)
        bytes += ir_op_bytes(g, &g->ops.v[i]);
    cli_human_flops(step_flops, b0, sizeof b0);
    cli_human_flops(fwd_flops, b1, sizeof b1);
    printf("flops per step: %s (forward %s)\n", b0, b1);
    ir_fmt_bytes(bytes, 2, b0, sizeof b0);
    printf("bytes moved per step (unfused, IR counts): %s\n", b0);
    if (mp) {
        ir_fmt_bytes((double)mp->arena_bytes, 2, b0, sizeof b0);
        ir_fmt_bytes((double)mp->persistent_bytes, 2, b1, sizeof b1);
        printf("planned peak: %s (%lld bytes; persistent %s, temporaries %s)\n", b0,
               (long long)mp->arena_bytes, b1,
               ir_fmt_bytes((double)(mp->arena_bytes - mp->persistent_bytes), 2, sb, sizeof sb));
        /* zero=1: say that the figures are one rank's, with its shard */
        for (int i = 0; i < g->ops.n; i++) {
            const Op *op = &g->ops.v[i];
            if (ir_opinfo[op->code].attr != AK_SHARD)
                continue;
            int64_t S = ir_shard_size(op->attr.ia[2], op->attr.ia[3]);
            bool master = ir_find_tensor(g, "adam.master") >= 0; /* bf16 params */
            ir_fmt_bytes((master ? 3.0 : 2.0) * 4.0 * (double)S, 2, b0, sizeof b0);
            printf("zero: AdamW state sharded over %lld ranks: adam.m%s f32[%lld] "
                   "(%s) per rank; the planned peak is one rank's\n",
                   (long long)op->attr.ia[3], master ? ", adam.v and the master copy adam.master"
                                                     : " and adam.v",
                   (long long)S, b0);
            break;
        }
    }
}

/* Kernel launches and bytes moved per step, unfused (the same pipeline with
 * --no-fuse) and fused (g). */
bool cli_print_fusion(const Model *m, const Graph *g, const PassOpts *po)
{
    FuseStats after, before;
    pass_fuse_stats(g, &after);
    PassOpts nf = *po;
    nf.no_fuse = true;
    nf.remat_report = NULL;
    nf.memplan = NULL;
    /* unfused temporaries need not fit the budget: compare without it (a
     * fixed remat policy still applies) */
    nf.memory_budget = 0;
    Graph *u = ir_clone(m->g);
    Diag d = {{0}};
    if (!pass_pipeline(u, &nf, NULL, NULL, NULL, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        ir_free(u);
        return false;
    }
    pass_fuse_stats(u, &before);
    ir_free(u);
    char b0[64], b1[64];
    ir_fmt_bytes(before.bytes, 2, b0, sizeof b0);
    ir_fmt_bytes(after.bytes, 2, b1, sizeof b1);
    if (po->no_fuse) {
        printf("fusion: off (--no-fuse): %d kernels + %d GEMMs, %s moved per step\n",
               before.kernels, before.gemms, b0);
        return true;
    }
    printf("fusion: kernels %d -> %d (+ %d -> %d GEMMs), bytes moved per step %s -> %s "
           "(%.2fx less)\n",
           before.kernels, after.kernels, before.gemms, after.gemms, b0, b1,
           after.bytes > 0 ? before.bytes / after.bytes : 0.0);
    return true;
}


/* The graph input `tokens` (i32[B,T]): tokens per step; 0 without one. */
static double step_tokens(const Graph *g)
{
    int t = ir_find_tensor(g, "tokens");
    return t >= 0 && g->t.v[t].kind == TK_INPUT ? (double)shape_numel(&g->t.v[t].s) : 0;
}

CgPredictOpts cli_predict_opts(const Model *m, const CgDevice *dev)
{
    const TrainCfg *c = &m->train;
    return (CgPredictOpts){
        .bf16 = dev->gpu && c->precision && strcmp(c->precision, "bf16") == 0,
        .tf32 = dev->gpu && c->tf32 && strcmp(c->tf32, "true") == 0,
        .cuda_graph = dev->gpu && c->cuda_graph && strcmp(c->cuda_graph, "true") == 0,
    };
}

/* ptxas' registers and shared memory of every function of q, from NVRTC
 * (the kernel cache keeps the log beside the cubin: a second run compiles
 * nothing); what was used, in words, into occ. Without NVRTC the cost
 * model falls back to block sizes alone. */
static void occupancy_figures(CgCudaProgram *q, const CgDevice *dev, const char *cache_dir,
                              char *occ, size_t n)
{
    RtCudaBinary b;
    Diag d = {{0}};
    if (!dev->arch || !rt_cuda_compile(q->source, dev->arch, cache_dir, false, &b, &d)) {
        snprintf(occ, n, "from block sizes alone (no ptxas figures: %.400s)",
                 dev->arch ? d.msg : "no architecture for this device");
        return;
    }
    cg_cuda_ptxas(q, b.log);
    int regs = 0, spill = 0;
    for (int i = 0; i < q->fn.n; i++) {
        regs = q->fn.v[i].regs > regs ? q->fn.v[i].regs : regs;
        spill += q->fn.v[i].spill;
    }
    snprintf(occ, n, "ptxas figures (NVRTC %d.%d, %s%s) for %d of %d functions: at most %d "
             "registers per thread, %d bytes spilled", b.nvrtc_major, b.nvrtc_minor, dev->arch,
             b.cached ? ", cached" : "", q->ptxas_fns, q->fn.n, regs, spill);
    rt_cuda_binary_free(&b);
}

bool cli_print_prediction(const Model *m, const Graph *g, const char *target, int threads,
                          const char *cache_dir, bool remeasure, int top,
                          const CgKernelTable *cal, const char *cal_path, const char *ktable)
{
    CgDevice cpu;
    const CgDevice *dev = cg_device_find(target);
    Diag d = {{0}};
    if (!dev) { /* "cpu": checked by the caller */
        if (!rt_cpu_device(threads, cache_dir, remeasure, false, &cpu, &d)) {
            fprintf(stderr, "kiln: --target cpu: %s\n", d.msg);
            return false;
        }
        dev = &cpu;
    }
    CgPlan *p = cg_plan(g, &d);
    if (!p) {
        fprintf(stderr, "kiln: --target %s: %s\n", target, d.msg);
        return false;
    }
    CgPredictOpts o = cli_predict_opts(m, dev);
    CgCudaProgram *q = dev->gpu ? cg_cuda_program(p, o.bf16) : NULL;
    char occ[600] = "";
    if (q)
        occupancy_figures(q, dev, cache_dir, occ, sizeof occ);
    CgPrediction *r = cg_predict(p, q, dev, &o);
    double model = ir_graph_flops(g) - pass_remat_flops(g);
    if (dev->gpu)
        printf("device %s: %d SMs, %.0f / %.0f / %.1f TFLOP/s bf16 / TF32 / f32, %.2f TB/s, "
               "launch %.1f us (graph node %.1f us)%s%s%s\n", dev->name, dev->units,
               dev->bf16 / 1e12, dev->tf32 / 1e12, dev->f32 / 1e12, dev->bw / 1e12,
               dev->launch_s * 1e6, dev->graph_s * 1e6, o.bf16 ? "; precision bf16" : "",
               o.tf32 ? "; tf32" : "", o.cuda_graph ? "; cuda_graph" : "");
    else
        printf("device cpu (%s): FMA peak %.1f GFLOP/s, sgemm %.1f GFLOP/s (one thread, bands "
               "of 16/64/256/512 rows: %.1f/%.1f/%.1f/%.1f), generated code %.2f G "
               "element-ops/s per thread, bandwidth %.1f GB/s (one thread %.1f), dispatch %.1f "
               "us per step\n", dev->title, dev->f32 / 1e9, dev->gemm / 1e9,
               dev->gemm1[0] / 1e9, dev->gemm1[1] / 1e9, dev->gemm1[2] / 1e9,
               dev->gemm1[3] / 1e9, dev->work / 1e9, dev->bw / 1e9, dev->bw1 / 1e9,
               dev->launch_s * 1e6);
    if (q) {
        printf("occupancy: %s\n", occ);
        char ab[32], cb[32], pb[32];
        ir_fmt_bytes((double)q->mem->arena_bytes, 2, ab, sizeof ab);
        ir_fmt_bytes((double)q->cast_bytes, 2, cb, sizeof cb);
        ir_fmt_bytes((double)q->part_bytes, 2, pb, sizeof pb);
        printf("device memory: arena %s, bf16 weight copies %s (cast once per step), "
               "partials scratch %s\n", ab, cb, pb);
    }
    cg_prediction_print(r, p, model, step_tokens(g), top, stdout);
    bool ok = true;
    if (ktable) {
        CgKtLine *rows;
        int n = cg_ktable_from_prediction(r, p, &rows);
        CgKtMeta meta = {"predicted", dev->name, 1, 1e3 * r->step_s};
        if (!cg_ktable_write(ktable, &meta, rows, n, &d)) {
            fprintf(stderr, "kiln: %s\n", d.msg);
            ok = false;
        }
        free(rows);
    }
    if (cal)
        cg_calibrate(r, p, cal, cal_path, stdout);
    cg_prediction_free(r);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    return ok;
}

/* Tensor parallelism: this rank's share of params, gradients and optimizer
 * state against the whole model's, and the TP collectives of a step. */
void cli_print_tp(const Graph *g)
{
    int64_t mine[3] = {0, 0, 0}, whole[3] = {0, 0, 0}; /* params, grads, state */
    int tp = 0, rank = 0;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op >= 0 || (t->kind != TK_PARAM && t->kind != TK_STATE))
            continue;
        bool split = t->shard.on && t->shard.n > 1;
        if (split)
            tp = t->shard.n, rank = t->shard.rank;
        Shape ws = split ? ir_shard_whole(&t->shard, &t->s) : t->s;
        /* a param's gradient is its shape in f32 (the optimizer's input) */
        Shape gs = t->s, gws = ws;
        gs.dtype = gws.dtype = DT_F32;
        int k = t->kind == TK_PARAM ? 0 : 2;
        mine[k] = ir_add_sat(mine[k], shape_bytes(&t->s));
        whole[k] = ir_add_sat(whole[k], shape_bytes(&ws));
        if (t->kind == TK_PARAM) {
            mine[1] = ir_add_sat(mine[1], shape_bytes(&gs));
            whole[1] = ir_add_sat(whole[1], shape_bytes(&gws));
        }
    }
    if (!tp)
        return;
    char b[3][32], w[3][32], tb[32], tw[32];
    int64_t tm = 0, twh = 0;
    for (int k = 0; k < 3; k++) {
        ir_fmt_bytes((double)mine[k], 2, b[k], sizeof b[k]);
        ir_fmt_bytes((double)whole[k], 2, w[k], sizeof w[k]);
        tm = ir_add_sat(tm, mine[k]);
        twh = ir_add_sat(twh, whole[k]);
    }
    printf("tensor parallel: rank %d of tp = %d (the figures above are this rank's)\n", rank, tp);
    printf("  params %s of %s, gradients %s of %s, optimizer state %s of %s\n", b[0], w[0],
           b[1], w[1], b[2], w[2]);
    printf("  params + gradients + optimizer state: %s per rank, %s at tp = 1 (%.3f of it)\n",
           ir_fmt_bytes((double)tm, 2, tb, sizeof tb), ir_fmt_bytes((double)twh, 2, tw, sizeof tw),
           twh > 0 ? (double)tm / (double)twh : 0.0);
    int n[3] = {0, 0, 0};
    int64_t bytes[3] = {0, 0, 0};
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        int k = op->code == OP_TP_ALLREDUCE ? 0 : op->code == OP_TP_ALL_GATHER ? 1
                : op->code == OP_TP_REDUCE_SCATTER ? 2 : -1;
        if (k < 0)
            continue;
        int64_t x = shape_bytes(&g->t.v[op->in[0]].s), y = shape_bytes(&g->t.v[op->out].s);
        n[k]++;
        bytes[k] = ir_add_sat(bytes[k], x > y ? x : y);
    }
    printf("  TP collectives per step: %d all-reduce (%s), %d all-gather (%s), "
           "%d reduce-scatter (%s); --dump-after=comm lists them\n",
           n[0], ir_fmt_bytes((double)bytes[0], 2, b[0], sizeof b[0]), n[1],
           ir_fmt_bytes((double)bytes[1], 2, b[1], sizeof b[1]), n[2],
           ir_fmt_bytes((double)bytes[2], 2, b[2], sizeof b[2]));
}
