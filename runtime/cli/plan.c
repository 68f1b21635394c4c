/* plan.c - `kiln plan MODEL.lua [options]`: the step time, memory per GPU
 * and end date of a training run at cluster scale, from the compiled step
 * (codegen/cluster.c has the arithmetic, docs/plan.md the equations).
 *
 * The model is compiled once per variant (shapes only): as given, with the
 * comm pass's buckets for --dp ranks; then for the what-if rows with other
 * bucket sizes and each remat policy. The cost model (predict.c) times the
 * step on the device; the comm pass says where each bucket becomes ready. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "plan_internal.h"
#include "cg_cuda.h"
#include "codegen.h"
#include "cpu.h"
#include "dist.h"
#include "train.h"

static const char usage_plan[] =
    "usage: kiln plan MODEL.lua [options]\n"
    "\n"
    "Projects a training run at cluster scale from the compiled step: memory per\n"
    "GPU, the step's critical path (compute per pipeline stage, TP collectives,\n"
    "the pipeline's bubble, DP gradient communication and what of it is exposed),\n"
    "throughput, MFU and the end date. See docs/plan.md.\n"
    "\n"
    "options:\n"
    "  --set KEY=VALUE      override a config{} or train{} setting (repeatable);\n"
    "                       the model's batch is the micro-batch (sequences)\n"
    "  --device DEV         a100, h100, h200 (default), b200, or cpu (measured)\n"
    "  --gpus N             GPUs in all (default: tp x pp x dp)\n"
    "  --gpus-per-node N    default 8\n"
    "  --intra-bw GB/s      per-GPU bandwidth inside a node (default: the device's)\n"
    "  --inter-bw GB/s      per-GPU bandwidth between nodes (default: the device's)\n"
    "  --tp N, --pp N, --dp N   the parallel layout (tp x pp x dp = gpus; dp\n"
    "                       defaults to gpus / (tp x pp))\n"
    "  --zero 0|1           1: sharded optimizer state (ZeRO-1)\n"
    "  --micro-batches N    micro-batches per step and rank (default 1)\n"
    "  --schedule S         the pipeline's: 1f1b (default), gpipe, zb-h1\n"
    "  --pipeline-formulas  the ideal split and the formulas, not the stage cut\n"
    "  --global-batch N     sequences per step (sets the micro-batches)\n"
    "  --tokens N           the token budget: 10T, 300B (or 300G), 1.5e12\n"
    "  --goodput F          share of calendar time spent in steps (default 1)\n"
    "  --target-days D      the step time that finishes in D calendar days\n"
    "  --step-time S        a measured step in seconds; replaces the prediction\n"
    "  --no-overlap         every DP collective after backward\n"
    "  --memory SIZE        device memory per GPU, e.g. 80GiB (default: the device's;\n"
    "                       cpu: this machine's memory over its ranks)\n"
    "  --json               one JSON object instead of the table\n"
    "  --threads N          --device cpu: threads (default: one per core)\n"
    "  -h, --help           this text\n";

/* c's memory timeline from the memory plan mp: per op the gradients, the
 * other temporaries and the saved activations live (into *own, 3 x ops,
 * which the caller frees), all gradients, and the other temporaries' peak. */
static void timeline(const MemPlan *mp, CgClusterModel *c, double **own)
{
    int n = mp->nops;
    double *v = xcalloc(3 * (size_t)n + 1, sizeof(double));
    c->mem_nops = n;
    c->mem_grad = v;
    c->mem_act = v + n;
    c->mem_saved = v + 2 * n;
    c->grad_bytes = (double)mp->grad_bytes;
    c->act_bytes = 0;
    for (int i = 0; i < n; i++) {
        v[i] = (double)mp->live_grad[i];
        v[n + i] = (double)(mp->live[i] - mp->persistent_bytes - mp->live_grad[i]);
        v[2 * n + i] = (double)mp->live_saved[i];
        if (v[n + i] > c->act_bytes)
            c->act_bytes = v[n + i];
    }
    *own = v;
}

static int plan_error(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "kiln plan: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (see `kiln plan --help`)\n");
    return 2;
}

/* Count suffixes: K M G T P (powers of 1000), and B (billions, as papers
 * write token budgets) beside G. */
static const struct {
    char c;
    double mul;
    const char *name;
} count_units[] = {{'K', 1e3, "K: thousands, 1e3"},   {'M', 1e6, "M: millions, 1e6"},
                   {'B', 1e9, "B: billions, 1e9"},    {'G', 1e9, "G: giga, billions, 1e9"},
                   {'T', 1e12, "T: trillions, 1e12"}, {'P', 1e15, "P: quadrillions, 1e15"}};

const char *cli_plan_count_unit(char c)
{
    for (size_t i = 0; i < sizeof count_units / sizeof *count_units; i++)
        if (count_units[i].c == c)
            return count_units[i].name;
    return NULL;
}

/* "10T", "300B", "300G", "1.5e12", "2M": a positive count. */
static bool parse_count(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v <= 0)
        return false;
    double mul = 0;
    if (!*end)
        mul = 1;
    for (size_t i = 0; *end && !end[1] && i < sizeof count_units / sizeof *count_units; i++)
        if (count_units[i].c == *end)
            mul = count_units[i].mul;
    if (mul == 0)
        return false;
    *out = v * mul;
    return isfinite(*out);
}

static bool parse_pos(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static int64_t config_int(const Model *m, const char *key)
{
    const char *v = fe_config_get(m, key);
    return v ? strtoll(v, NULL, 10) : 0;
}

/* The largest cluster kiln plan projects (GPUs in all, and each of tp, pp,
 * dp), the largest micro-batch count and global batch (sequences per step),
 * and the token budget's range. */
enum { PLAN_MAX_GPUS = 1 << 20, PLAN_MAX_MICRO = 1 << 20, PLAN_MAX_GLOBAL = 1 << 24 };
#define PLAN_MAX_TOKENS 1e18

/* What the layout splits, read from the forward graph g: the attentions
 * (each one layer; heads = dim 1 of the query [B,H,T,D]) and the weight
 * matrices (2-D params a matmul reads: Megatron's column and row split cut
 * one of their dims, the q/k/v and MLP widths and the vocabulary among
 * them). */
typedef struct {
    int nattn;
    int64_t bad_heads; /* the first attention's heads that tp does not divide; 0: none */
    SrcLoc bad_heads_loc;
    int bad_param, bad_dim; /* the first weight matrix dim tp does not divide; -1: none */
} PlanSplit;

static void plan_split(const Graph *g, int tp, PlanSplit *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->bad_param = -1;
    bool *seen = xcalloc((size_t)g->t.n + 1, 1);
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        /* attention: the attention op, or the scores q x k^T written out
         * (the forward graph holds the primitives until the attention pass
         * runs): a matmul {ta=0, tb=1} of two rank-4 activations [B,H,T,D] */
        bool scores = op->code == OP_MATMUL && op->nin == 2 && !op->attr.ia[0] &&
                      op->attr.ia[1] && g->t.v[op->in[0]].s.rank == 4 &&
                      g->t.v[op->in[1]].s.rank == 4 && g->t.v[op->in[0]].kind == TK_TEMP &&
                      g->t.v[op->in[1]].kind == TK_TEMP;
        if ((op->code == OP_ATTENTION && op->nin >= 1) || scores) {
            const Shape *q = &g->t.v[op->in[0]].s;
            sp->nattn++;
            int64_t h = q->rank == 4 ? q->dim[1] : 1;
            if (h % tp != 0 && !sp->bad_heads) {
                sp->bad_heads = h;
                sp->bad_heads_loc = op->loc;
            }
        }
        if (op->code != OP_MATMUL)
            continue;
        for (int k = 0; k < op->nin; k++) {
            const Tensor *w = &g->t.v[op->in[k]];
            if (w->kind != TK_PARAM || w->s.rank != 2 || seen[w->id])
                continue;
            seen[w->id] = true;
            for (int d = 0; d < 2 && sp->bad_param < 0; d++)
                if (w->s.dim[d] % tp != 0) {
                    sp->bad_param = w->id;
                    sp->bad_dim = d;
                }
        }
    }
    free(seen);
}

/* The layout against the model m (before anything is compiled): tp divides
 * every attention's heads and every dim of every weight matrix; pp is at
 * most the layers; the micro-batches and global batch are in range. An error
 * names the flag, what was expected and what was found; returns 0 or 2. */
static int plan_check_layout(const Model *m, const PlanArgs *a, const char *model)
{
    PlanSplit sp;
    plan_split(m->g, a->tp, &sp);
    char buf[128];
    if (sp.bad_heads) {
        fprintf(stderr, "kiln plan: --tp %d does not divide the model's %lld attention heads "
                        "(%s:%d): expected a --tp that divides %lld\n",
                a->tp, (long long)sp.bad_heads,
                sp.bad_heads_loc.file ? sp.bad_heads_loc.file : model, sp.bad_heads_loc.line,
                (long long)sp.bad_heads);
        return 2;
    }
    if (sp.bad_param >= 0) {
        const Tensor *w = &m->g->t.v[sp.bad_param];
        fprintf(stderr, "kiln plan: --tp %d does not divide dim %d (%lld) of the weight "
                        "matrix \"%s\" %s: tensor parallelism splits each weight matrix "
                        "(attention and MLP widths, the vocabulary: pad it with "
                        "--set vocab_pad=N where the model has that key); expected a --tp "
                        "that divides %lld\n",
                a->tp, sp.bad_dim, (long long)w->s.dim[sp.bad_dim], w->name,
                shape_str(m->g, &w->s, buf, sizeof buf), (long long)w->s.dim[sp.bad_dim]);
        return 2;
    }
    /* as kiln compile --pp and kiln train cut (passes/stages.c) */
    int most = a->pp > 1 ? pass_stage_max(m->g) : 0;
    if (a->pp > 1 && most > 0 && a->pp > most) {
        fprintf(stderr, "kiln plan: --pp %d: more stages than layers to put in them (expected "
                        "--pp from 1 to %d: stages begin between layers, where one tensor "
                        "crosses, and each holds a param, as kiln compile --pp cuts them)\n",
                a->pp, most);
        return 2;
    }
    /* sequences per step: the model's batch (its tokens input's first dim)
     * x dp x the micro-batches */
    int ti = ir_find_tensor(m->g, "tokens");
    const Tensor *tok = ti >= 0 && m->g->t.v[ti].kind == TK_INPUT ? &m->g->t.v[ti] : NULL;
    int64_t batch = tok && tok->s.rank == 2 ? tok->s.dim[0] : 1;
    double seqs = (double)batch * a->dp * (a->micro_batches > 0 ? a->micro_batches : 1);
    if (seqs > PLAN_MAX_GLOBAL) {
        fprintf(stderr, "kiln plan: the model's batch %lld x --dp %d x --micro-batches %d is "
                        "%.4g sequences per step: expected at most %d (a smaller --set batch, "
                        "--dp or --micro-batches)\n",
                (long long)batch, a->dp, a->micro_batches > 0 ? a->micro_batches : 1, seqs,
                PLAN_MAX_GLOBAL);
        return 2;
    }
    return 0;
}

/* Per TP collective of the step outside the optimizer (plan order, as
 * measure counts them), the predicted seconds
 * of the plan steps between it and the first step that reads its result:
 * what the executor runs while it is in flight (runtime/exec.c
 * setup_tp_waits, which places the wait by storage; here by tensor). */
static double *tp_hide(const Graph *g, const CgPlan *p, const CgPrediction *r)
{
    int n = p->steps.n;
    double *at = xcalloc((size_t)n + 1, sizeof(double)); /* per step: predicted seconds */
    for (int k = 0; k < r->rows.n; k++)
        if (r->rows.v[k].step >= 0 && r->rows.v[k].step < n)
            at[r->rows.v[k].step] += r->rows.v[k].s;
    int *ostep = cg_plan_op_steps(p, g);
    double *hide = xcalloc((size_t)n + 1, sizeof(double));
    int ntp = 0;
    for (int s = 0; s < n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_TP || st->op < 0 || (g->ops.v[st->op].flags & OPF_OPTIM))
            continue;
        int out = g->ops.v[st->op].out, first = n;
        for (int i = 0; i < g->ops.n; i++)
            for (int j = 0; j < g->ops.v[i].nin; j++)
                if (g->ops.v[i].in[j] == out && ostep[i] > s && ostep[i] < first)
                    first = ostep[i];
        for (int k = s + 1; k < first; k++)
            hide[ntp] += at[k];
        ntp++;
    }
    free(at);
    free(ostep);
    return hide;
}

/* Compiles m's step with po (shapes only) and measures it on dev. */
static bool measure(const Model *m, const PassOpts *po, const CgDevice *dev, Variant *v,
                    RematReport *rr, Diag *d)
{
    memset(v, 0, sizeof *v);
    Graph *g = ir_clone(m->g);
    MemPlan *mp = NULL;
    CgPlan *p = NULL;
    CgCudaProgram *q = NULL;
    CgPrediction *r = NULL;
    PassOpts o1 = *po;
    o1.memplan = &mp; /* memplan ends the pipeline and hands its plan back */
    o1.remat_report = rr;
    bool ok = pass_pipeline(g, &o1, NULL, NULL, NULL, d) && mp && (p = cg_plan(g, d));
    if (!ok)
        goto out;
    CgPredictOpts o = cli_predict_opts(m, dev);
    q = dev->gpu ? cg_cuda_program(p, o.bf16) : NULL;
    r = cg_predict(p, q, dev, &o);
    CgClusterModel *c = &v->m;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        double bytes = (double)shape_numel(&t->s) * (double)dtype_size(t->s.dtype);
        if (t->kind == TK_PARAM) {
            Shape whole = ir_shard_whole(&t->shard, &t->s); /* MFU: the whole model's */
            c->nparams += (double)shape_numel(&whole);
            c->param_bytes += bytes;
        } else if (t->kind == TK_STATE) {
            c->opt_bytes += bytes;
        }
    }
    int ti = ir_find_tensor(g, "tokens");
    const Tensor *tok = ti >= 0 && g->t.v[ti].kind == TK_INPUT ? &g->t.v[ti] : NULL;
    c->micro_batch = tok && tok->s.rank == 2 ? tok->s.dim[0] : 1;
    c->seq_len = tok && tok->s.rank == 2 ? tok->s.dim[1] : 1;
    c->d_model = config_int(m, "C");
    PlanSplit sp;
    plan_split(m->g, 1, &sp);
    c->layers = sp.nattn > 0 ? sp.nattn : config_int(m, "L");
    c->act_dtype_bytes = o.bf16 ? 2 : 4;
    timeline(q ? q->mem : mp, c, &v->mem); /* the device's storage sizes (bf16 activations) */
    /* the times of the step's launches in order: compute, optimizer, and
     * when each bucket's all-reduce may start */
    double t = 0;
    int row = 0;
    v->bytes = xcalloc((size_t)p->steps.n + 1, sizeof(double));
    v->ready = xcalloc((size_t)p->steps.n + 1, sizeof(double));
    v->coll = xcalloc((size_t)p->steps.n + 1, sizeof(int));
    v->tpb = xcalloc((size_t)p->steps.n + 1, sizeof(double));
    v->tpk = xcalloc((size_t)p->steps.n + 1, sizeof(int));
    c->tp_split = po->tp > 1 ? po->tp : 1;
    IrReaders rd;
    ir_readers_build(g, &rd);
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        unsigned flags = st->op >= 0 ? g->ops.v[st->op].flags : OPF_OPTIM; /* update copies */
        for (; row < r->rows.n && r->rows.v[row].step == s; row++) {
            double x = r->rows.v[row].s;
            if (flags & OPF_OPTIM) {
                c->opt_s += x;
                continue;
            }
            t += x;
            c->fwd_bwd_s += x;
            if (st->kind == CG_STEP_GEMM && (flags & OPF_BACKWARD) && ir_wgrad_matmul(g, &rd, st->op, NULL))
                c->wgrad_s += x;
            if (!(flags & (OPF_BACKWARD | OPF_RECOMPUTE)))
                c->forward_s += x;
            c->backward_end_s = t;
        }
        if (st->kind == CG_STEP_TP && !(flags & OPF_OPTIM)) {
            const Op *op = &g->ops.v[st->op];
            double bi = (double)shape_bytes(&g->t.v[op->in[0]].s);
            double bo = (double)shape_bytes(&g->t.v[op->out].s);
            /* under bf16 the CUDA backend stores the activations, and so the
             * collectives' buffers, as bf16 (cg_cuda_storage) */
            double dt = o.bf16 && g->t.v[op->out].s.dtype == DT_F32 ? 0.5 : 1.0;
            v->tpb[c->ntp] = dt * (bi > bo ? bi : bo);
            v->tpk[c->ntp++] = op->code == OP_TP_ALLREDUCE       ? CG_COLL_ALLREDUCE
                               : op->code == OP_TP_REDUCE_SCATTER ? CG_COLL_REDUCE_SCATTER
                                                                  : CG_COLL_ALL_GATHER;
        }
        if (st->kind == CG_STEP_ALLREDUCE_START) {
            double b = 0;
            for (int a = 0; a < st->nargs; a++) {
                const Tensor *x = &g->t.v[st->args[a]];
                b += (double)shape_numel(&x->s) * (double)dtype_size(x->s.dtype);
            }
            v->bytes[c->nbuckets] = b;
            v->coll[c->nbuckets] = (int)st->coll;
            v->ready[c->nbuckets++] = t;
        }
    }
    c->bucket_bytes = v->bytes;
    c->bucket_ready_s = v->ready;
    c->bucket_coll = v->coll;
    c->tp_bytes = v->tpb;
    c->tp_coll = v->tpk;
    v->tph = tp_hide(g, p, r);
    /* tp_overlap=false: each waited for at once, nothing hides it */
    c->tp_hide_s = m->train.tp_overlap && strcmp(m->train.tp_overlap, "false") == 0 ? NULL : v->tph;
    ir_readers_free(&rd);
    c->opt_sharded = ir_find_tensor(g, "adam.m") >= 0;
out:
    cg_prediction_free(r);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    pass_memplan_free(mp);
    ir_free(g);
    return ok;
}

/* Compiles program g of a pipeline stage (F, B or W) as runtime/dist/pp.c
 * does (simplify, fuse, schedule) and times it on dev into st's row k:
 * compute seconds, the TP collectives (count and bytes per kind), the peak
 * of its other temporaries; adds to st->held_f (F) or held_b (B) what it
 * leaves for a later program ("pp.stash.T" outputs; F: and the received
 * activations). */
static bool time_stage_prog(const Model *m, Graph *g, const PassOpts *po, const CgDevice *dev,
                            CgStageModel *st, int k, Diag *d)
{
    if (g->ops.n == 0)
        return true;
    if (!pass_simplify(g, po, d) || !pass_fuse(g, po, d) || !pass_schedule(g, po, d))
        return false;
    char err[512];
    if (!ir_verify(g, err, sizeof err)) { /* kiln train --pp would stop here too */
        snprintf(d->msg, sizeof d->msg, "stage program %c does not compile: %.400s",
                 "FBW"[k], err);
        return false;
    }
    CgPlan *p = cg_plan(g, d);
    if (!p)
        return false;
    CgPredictOpts o = cli_predict_opts(m, dev);
    CgCudaProgram *q = dev->gpu ? cg_cuda_program(p, o.bf16) : NULL;
    CgPrediction *r = cg_predict(p, q, dev, &o);
    for (int i = 0; i < r->rows.n; i++)
        st->t[k] += r->rows.v[i].s;

    for (int i = 0; i < p->steps.n; i++) {
        const CgStep *cs = &p->steps.v[i];
        if (cs->kind != CG_STEP_TP)
            continue;
        const Op *op = &g->ops.v[cs->op];
        double bi = (double)shape_bytes(&g->t.v[op->in[0]].s);
        double bo = (double)shape_bytes(&g->t.v[op->out].s);
        double dt = o.bf16 && g->t.v[op->out].s.dtype == DT_F32 ? 0.5 : 1.0;
        int c = op->code == OP_TP_ALLREDUCE ? 0 : 1;
        st->tp_n[k][c]++;
        st->tp_bytes[k][c] += dt * (bi > bo ? bi : bo);
    }
    const MemPlan *mp = q ? q->mem : p->mem;
    double tmp = (double)(mp->peak_live - mp->persistent_bytes);
    st->tmp_bytes = tmp > st->tmp_bytes ? tmp : st->tmp_bytes;
    /* what the CPU runtime copies in and out around the program */
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op < 0 && t->name &&
            (strncmp(t->name, "pp.stash.", 9) == 0 || strncmp(t->name, "pp.recv.", 8) == 0 ||
             strncmp(t->name, "pp.seed.", 8) == 0))
            st->copy_bytes[k] += (double)shape_bytes(&t->s);
    }
    for (int i = 0; i < g->outs.n; i++) {
        const char *nm = g->outs.v[i].name;
        double b = (double)shape_bytes(&g->t.v[g->outs.v[i].t].s);
        if (strncmp(nm, "pp.stash.", 9) == 0 || strncmp(nm, "pp.send.", 8) == 0 ||
            strncmp(nm, "grad.pp.recv.", 13) == 0)
            st->copy_bytes[k] += b;
        else if (strncmp(nm, "grad.", 5) == 0) /* read out, then acc + g: 2.5 copies */
            st->copy_bytes[k] += 2.5 * b;
    }
    double *held = k == 0 ? &st->held_f : &st->held_b;
    for (int i = 0; k < 2 && i < g->outs.n; i++)
        if (strncmp(g->outs.v[i].name, "pp.stash.", 9) == 0)
            *held += (double)shape_bytes(&g->t.v[g->outs.v[i].t].s);
    for (int i = 0; k == 0 && i < g->t.n; i++)
        if (g->t.v[i].op < 0 && g->t.v[i].name && strncmp(g->t.v[i].name, "pp.recv.", 8) == 0)
            *held += (double)shape_bytes(&g->t.v[i].s);
    cg_prediction_free(r);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    return true;
}

/* The compiler's cut of m's forward graph into pp stages and each stage's
 * F, B and W programs, made and compiled as `kiln train --pp` makes them
 * (runtime/dist/pp.c: attention, partition, pass_stage_cut, the stage
 * graph, autodiff, pass_stage_split), each timed on dev: into v->stages
 * and v->m. False with d set where the cut cannot be made. */
static bool measure_stages(const Model *m, const PassOpts *po, const CgDevice *dev, int pp,
                           Variant *v, Diag *d)
{
    Graph *fwd = ir_clone(m->g);
    PassStageCut cut = {0};
    PassOpts bo = *po;
    bo.grad_accum = 1;
    bo.nranks = 1;
    bo.memplan = NULL;
    bo.remat_report = NULL;
    if (!pass_attention(fwd, po, d) || !pass_partition(fwd, po, d) ||
        !pass_stage_cut(fwd, pp, &cut, d)) {
        ir_free(fwd);
        return false;
    }
    bool bf16 = cli_predict_opts(m, dev).bf16, ok = true;
    CgStageModel *sm = xcalloc((size_t)pp, sizeof *sm);
    int *seen = xcalloc((size_t)fwd->t.n + 1, sizeof(int)); /* stage + 1 that counted it */
    for (int s = 0; s < pp && ok; s++) {
        CgStageModel *st = &sm[s];
        st->first_op = cut.first[s];
        st->nops = cut.first[s + 1] - cut.first[s];
        for (int i = cut.first[s]; i < cut.first[s + 1]; i++)
            st->layers += fwd->ops.v[i].code == OP_ATTENTION;
        /* under bf16 the activations cross as bf16 (cg_cuda_storage) */
        st->send_bytes = s < pp - 1 ? (double)cut.bytes[s + 1] * (bf16 ? 0.5 : 1.0) : 0;
        /* the params it owns: those its ops read (pass_stage_owns; the
         * constant-only ops it makes again read none) */
        for (int i = cut.first[s]; i < cut.first[s + 1]; i++) {
            const Op *op = &fwd->ops.v[i];
            for (int j = 0; j < op->nin; j++) {
                const Tensor *t = &fwd->t.v[op->in[j]];
                if (t->kind != TK_PARAM || seen[t->id] == s + 1)
                    continue;
                seen[t->id] = s + 1;
                st->nparams++;
                st->param_bytes += (double)shape_bytes(&t->s);
            }
        }
        Graph *full = pass_stage_graph(fwd, &cut, s, true);
        Graph *pr[3] = {NULL, NULL, NULL};
        ok = pass_autodiff(full, &bo, d);

        if (ok)
            pass_stage_split(full, s == pp - 1, &pr[0], &pr[1], &pr[2]);
        ir_free(full);
        for (int k = 0; k < 3 && ok; k++)
            ok = time_stage_prog(m, pr[k], &bo, dev, st, k, d);
        for (int k = 0; k < 3; k++)
            if (pr[k])
                ir_free(pr[k]);
        if (bf16)
            st->held_f *= 0.5, st->held_b *= 0.5;
    }
    free(seen);
    pass_stage_cut_free(&cut);
    ir_free(fwd);
    if (!ok) {
        free(sm);
        return false;
    }
    /* on a GPU kiln runs no stages yet, and the stage programs compiled
     * apart keep what crosses between them (stashes, sends) at f32, so
     * their attention runs at f32: their times keep the cut's balance and
     * F/B/W split, scaled to sum to the whole step's (bf16 storages, the
     * attention passes' layouts) */
    double sum = 0;
    for (int s = 0; s < pp; s++)
        sum += sm[s].t[0] + sm[s].t[1] + sm[s].t[2];
    v->stage_scale = dev->gpu && sum > 0 ? v->m.fwd_bwd_s / sum : 1;
    for (int s = 0; s < pp; s++)
        for (int k = 0; k < 3; k++)
            sm[s].t[k] *= v->stage_scale;
    v->stages = sm;
    v->m.nstages = pp;
    v->m.stages = sm;
    return true;
}

static void variant_free(Variant *v)
{
    free(v->bytes);
    free(v->ready);
    free(v->coll);
    free(v->mem);
    free(v->tpb);
    free(v->tpk);
    free(v->stages);
    free(v->tph);
}

/* What remat_measure_ctx points at: the compiled variant (params, state,
 * sharding), the layout, and whether the device stores activations as bf16
 * (mixed precision on a GPU: cg_cuda_storage sizes each candidate's). */
typedef struct {
    CgClusterModel m;
    CgClusterOpts o;
    bool bf16;
} MemCtx;

/* remat_measure: memory per GPU of a candidate's plan, in whole bytes. */
static int64_t memory_per_gpu(const Graph *g, const MemPlan *mp, const void *ctx)
{
    const MemCtx *x = ctx;
    CgClusterModel m = x->m;
    double *own;
    MemPlan *counted = NULL;
    if (x->bf16) {
        DType *st = cg_cuda_storage(g, mp, true);
        counted = pass_memplan_counted(g, mp, st);
        free(st);
    }
    timeline(counted ? counted : mp, &m, &own);
    pass_memplan_free(counted);
    CgClusterPlan p;
    cg_cluster_memory(&m, &x->o, &p);
    free(own);
    return p.mem_total < 9e18 ? (int64_t)ceil(p.mem_total) : INT64_MAX;
}

static void remat_at_memory(const Model *m, const PassOpts *po, const CgDevice *dev,
                            const CgClusterOpts *o, const Variant *v, const CgClusterPlan *p,
                            RematChoice *rc)
{
    memset(rc, 0, sizeof *rc);
    double split = (double)o->tp * o->pp;
    rc->budget_act = dev->mem - (p->mem_params + p->mem_grads + p->mem_opt);
    /* at the end of backward every gradient is live */
    if (dev->mem <= 0 || dev->mem - (p->mem_params + v->m.grad_bytes / split + p->mem_opt) <= 0)
        return;
    rc->ran = true;
    MemCtx ctx = {v->m, *o, dev->gpu && cli_predict_opts(m, dev).bf16};
    PassOpts pr = *po;
    pr.remat = REMAT_AUTO;
    pr.memory_budget = dev->mem < 9e18 ? (int64_t)dev->mem : INT64_MAX;
    pr.remat_measure = memory_per_gpu;
    pr.remat_measure_ctx = &ctx;
    Variant vc;
    Diag d = {{0}};
    if (!measure(m, &pr, dev, &vc, &rc->rr, &d)) {
        /* the pass names the least memory per GPU it found feasible (">= BYTES") */
        const char *ge = strstr(d.msg, ">= ");
        long long least = 0;
        if (ge && sscanf(ge + 3, "%lld", &least) == 1 && least > 0)
            rc->least = (double)least;
        snprintf(rc->why, sizeof rc->why, "%.200s", d.msg);
        return;
    }
    CgClusterPlan pc;
    CgClusterOpts oc = *o;
    oc.step_time = 0;
    rc->fits = cg_cluster_project(&vc.m, &oc, &pc, rc->why, sizeof rc->why);
    rc->budget_act = dev->mem - (pc.mem_params + pc.mem_grads + pc.mem_opt);
    rc->act = pc.mem_act;
    rc->total = pc.mem_total;
    rc->step = pc.step_predicted;
    variant_free(&vc);
}

int cli_plan(int argc, char **argv)
{
    PlanArgs a = {0};
    a.device = "h200";
    a.gpus_per_node = 8;
    a.tp = a.pp = 1;
    a.goodput = 1;
    const char *model = NULL;
    int rc = 2;
    for (int i = 2; i < argc; i++) {
        const char *s = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        int64_t n;
        char why[128];
#define INT_FLAG(name, field, lo, hi)                                                     \
    if (strcmp(s, name) == 0) {                                                          \
        if (!v || !fe_parse_int(v, lo, hi, &n, why, sizeof why)) {                        \
            rc = plan_error("%s: %s", name, v ? why : "expected an integer, got nothing"); \
            goto out;                                                                     \
        }                                                                                 \
        a.field = (int)n;                                                                 \
        i++;                                                                              \
        continue;                                                                         \
    }
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            fputs(usage_plan, stdout);
            rc = 0;
            goto out;
        }
        if (strcmp(s, "--set") == 0 && v) {
            vec_push(&a.sets, v);
            i++;
            continue;
        }
        if (strcmp(s, "--device") == 0 && v) {
            if (strcmp(v, "cpu") != 0 && !cg_device_find(v)) {
                rc = plan_error("--device expects cpu, a100, h100, h200 or b200, got '%s'%s", v,
                                "");
                goto out;
            }
            a.device = v;
            i++;
            continue;
        }
        INT_FLAG("--gpus", gpus, 1, PLAN_MAX_GPUS)
        INT_FLAG("--gpus-per-node", gpus_per_node, 1, 1024)
        INT_FLAG("--tp", tp, 1, PLAN_MAX_GPUS)
        INT_FLAG("--pp", pp, 1, PLAN_MAX_GPUS)
        INT_FLAG("--dp", dp, 1, PLAN_MAX_GPUS)
        INT_FLAG("--zero", zero, 0, 1)
        INT_FLAG("--micro-batches", micro_batches, 1, PLAN_MAX_MICRO)
        INT_FLAG("--threads", threads, 1, 256)
        if (strcmp(s, "--global-batch") == 0) {
            if (!v || !fe_parse_int(v, 1, PLAN_MAX_GLOBAL, &n, why, sizeof why)) {
                rc = plan_error("--global-batch (sequences per step): %s",
                                v ? why : "expected an integer, got nothing", "");
                goto out;
            }
            a.global_batch = n;
            i++;
            continue;
        }
        struct {
            const char *name;
            double *field, lo, hi, scale;
        } num[] = {
            {"--intra-bw", &a.intra_bw, 1e-3, 1e6, 1e9},
            {"--inter-bw", &a.inter_bw, 1e-3, 1e6, 1e9},
            {"--goodput", &a.goodput, 1e-3, 1, 1},
            {"--target-days", &a.target_days, 1e-3, 1e6, 1},
            {"--step-time", &a.step_time, 1e-9, 1e9, 1},
        };
        bool done = false;
        for (size_t k = 0; k < sizeof num / sizeof num[0] && !done; k++) {
            if (strcmp(s, num[k].name) != 0)
                continue;
            if (!v || !parse_pos(v, num[k].lo, num[k].hi, &d)) {
                rc = plan_error("%s expects a positive number in range, got '%s'", s,
                                v ? v : "(missing)");
                goto out;
            }
            *num[k].field = d * num[k].scale;
            i++;
            done = true;
        }
        if (done)
            continue;
        if (strcmp(s, "--memory") == 0) {
            int64_t b = v ? ir_parse_bytes(v) : -1;
            if (b <= 0) {
                rc = plan_error("--memory expects a size such as 80GiB or 141GB, got '%s'%s",
                                v ? v : "(missing)", "");
                goto out;
            }
            a.memory = (double)b;
            i++;
            continue;
        }
        if (strcmp(s, "--tokens") == 0) {
            if (!v || !parse_count(v, &a.tokens) || a.tokens < 1 || a.tokens > PLAN_MAX_TOKENS) {
                rc = plan_error("--tokens expects a count such as 10T, 300B (or 300G) or 1.5e12, "
                                "with K, M, B or G, T or P, from 1 "
                                "to 1E (1e18), got '%s'%s", v ? v : "(missing)", "");
                goto out;
            }
            a.tokens_text = v;
            i++;
            continue;
        }
        if (strcmp(s, "--no-overlap") == 0) {
            a.no_overlap = true;
            continue;
        }
        if (strcmp(s, "--pipeline-formulas") == 0) {
            a.pp_formulas = true;
            continue;
        }
        if (strcmp(s, "--schedule") == 0) {
            int k = 0;
            while (v && k < CG_PP__N && strcmp(v, cg_pp_schedule_name((CgPipeSchedule)k)) != 0)
                k++;
            if (!v || k == CG_PP__N) {
                rc = plan_error("--schedule expects 1f1b, gpipe or zb-h1, got '%s'%s",
                                v ? v : "(missing)", "");
                goto out;
            }
            a.schedule = (CgPipeSchedule)k;
            i++;
            continue;
        }
        if (strcmp(s, "--json") == 0) {
            a.json = true;
            continue;
        }
        if (s[0] == '-') {
            rc = plan_error("unknown option '%s'%s", s, "");
            goto out;
        }
        if (model) {
            rc = plan_error("more than one model given: '%s'%s", s, "");
            goto out;
        }
        model = s;
#undef INT_FLAG
    }
    if (!model) {
        rc = plan_error("missing argument: MODEL.lua%s%s", "", "");
        goto out;
    }
    if (a.dp == 0) {
        int64_t tpp = (int64_t)a.tp * a.pp;
        a.dp = a.gpus > 0 ? (int)(a.gpus / tpp) : 1;
        if (a.gpus > 0 && (a.dp < 1 || a.gpus % tpp != 0)) {
            char g[64], t[64];
            snprintf(g, sizeof g, "%d", a.gpus);
            snprintf(t, sizeof t, "%lld", (long long)tpp);
            rc = plan_error("--gpus %s is not a multiple of --tp x --pp = %s", g, t);
            goto out;
        }
    }
    int64_t ranks = (int64_t)a.tp * a.pp * a.dp;
    if (ranks > PLAN_MAX_GPUS) {
        fprintf(stderr, "kiln plan: --tp %d x --pp %d x --dp %d is %lld GPUs: expected at most "
                        "%d (see `kiln plan --help`)\n", a.tp, a.pp, a.dp, (long long)ranks,
                PLAN_MAX_GPUS);
        rc = 2;
        goto out;
    }
    if (a.gpus == 0)
        a.gpus = (int)ranks;
    if (ranks != a.gpus) {
        fprintf(stderr, "kiln plan: --tp %d x --pp %d x --dp %d must equal --gpus %d (see "
                        "`kiln plan --help`)\n", a.tp, a.pp, a.dp, a.gpus);
        rc = 2;
        goto out;
    }

    /* the model at --pp, as kiln compile --pp loads it (its pp_stage hints
     * kept for the cut) */
    char pp_set[32];
    snprintf(pp_set, sizeof pp_set, "pp=%d", a.pp);
    if (a.pp > 1 && a.pp <= 4096) /* train{pp}'s range; more is refused below */
        vec_push(&a.sets, pp_set);
    char err[2048];
    Model *m = fe_load_model(model, a.sets.v, a.sets.n, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        rc = 1;
        goto out;
    }
    cli_print_warnings(m);
    if ((rc = plan_check_layout(m, &a, model)) != 0) {
        fe_model_free(m);
        goto out;
    }
    rc = 2;
    CgDevice cpu;
    bool cpu_link = false; /* the cpu's local link was measured */
    const CgDevice *dev = cg_device_find(a.device);
    Diag d = {{0}};
    double alpha = 5e-6, tp_alpha = 0, tp_bw = 0; /* tp_*: the cpu's own TP link */
    if (!dev) {
        /* the ranks on one machine share its cores, as `kiln train --nproc`
         * shares them (rt_dp_exec_opts) */
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        int local = a.gpus < a.gpus_per_node ? a.gpus : a.gpus_per_node;
        int th = (int)((nc > 0 ? nc : 1) / (local > 0 ? local : 1));
        /* each rank's figures measured as the ranks run: all of them at once */
        if (!rt_cpu_device_ranks(a.threads > 0 ? a.threads : th > 0 ? th : 1, local, NULL,
                                 false, false, &cpu, &d)) {
            fprintf(stderr, "kiln plan: --device cpu: %s\n", d.msg);
            fe_model_free(m);
            rc = 1;
            goto out;
        }
        /* inside the machine: MPI between local ranks, measured once (the
         * ring's 2-rank figures); 10 Gb/s Ethernet between machines */
        RtMpiLink link;
        Diag ld = {{0}};
        if (local > 1 && rt_mpi_link(local, NULL, false, a.tp > 1, &link, &ld)) {
            cpu.intra_bw = link.bw;
            alpha = link.alpha_s;
            tp_alpha = link.tp_alpha_s;
            tp_bw = link.tp_bw;
            cpu_link = true;
        } else {
            if (local > 1)
                fprintf(stderr, "kiln plan: --device cpu: %s; assuming half the memory "
                                "bandwidth between local ranks\n", ld.msg);
            cpu.intra_bw = cpu.bw / 2;
        }
        cpu.inter_bw = 1.25e9;
        long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
        cpu.mem = pages > 0 && psize > 0 ? (double)pages * (double)psize / local : 0;
        dev = &cpu;
    }
    double stage_bw = cpu_link ? cpu.bw1 : 0; /* mpi.c stages buckets on one thread */
    CgDevice dv = *dev; /* the device as this plan sees it (--memory) */
    if (a.memory > 0)
        dv.mem = a.memory;
    dev = &dv;
    CgClusterOpts o = {
        .gpus = a.gpus, .gpus_per_node = a.gpus_per_node, .tp = a.tp, .pp = a.pp, .dp = a.dp,
        .zero = a.zero, .micro_batches = a.micro_batches > 0 ? a.micro_batches : 1,
        .schedule = a.schedule, .intra_bw = a.intra_bw > 0 ? a.intra_bw : dev->intra_bw,
        .inter_bw = a.inter_bw > 0 ? a.inter_bw : dev->inter_bw, .alpha_s = alpha, .stage_bw = stage_bw,
        .tp_alpha_s = a.intra_bw > 0 ? 0 : tp_alpha, .tp_bw = a.intra_bw > 0 ? 0 : tp_bw,
        .tokens = a.tokens, .goodput = a.goodput, .target_days = a.target_days,
        .step_time = a.step_time, .no_overlap = a.no_overlap,
    };
    CgPredictOpts po_dev = cli_predict_opts(m, dev);
    o.peak = !dev->gpu ? dev->f32 : po_dev.bf16 ? dev->bf16 : po_dev.tf32 ? dev->tf32 : dev->f32;
    PassOpts po;
    RtGraphFlags gf = {.memory_budget = -1, .nranks = a.dp, .no_overlap = a.no_overlap};
    rt_pass_opts(&m->train, &gf, &po);
    /* zero=1 (--zero 1 or the script's): the step compiled sharded, so the
     * comm pass's reduce-scatter and all-gather buckets are costed */
    if (a.zero && a.dp > 1)
        po.zero = 1;
    if (po.zero)
        o.zero = 1;
    /* tensor parallelism: a model that marks its splits (shard, nn's
     * parallel options) is compiled partitioned, as rank 0 of tp, and
     * costed from that graph; one that marks none gets the ideal split */
    po.tp = 1;
    po.tp_rank = 0;
    po.nranks = a.dp;
    po.sequence_parallel = m->train.sequence_parallel &&
                           strcmp(m->train.sequence_parallel, "true") == 0;
    if (a.tp > 1) { /* shard=auto: the splits chosen on this plan's device */
        PassOpts so = po;
        so.tp = a.tp;
        char *text = NULL;
        CgDevice sdv = *dev; /* the TP link, where measured apart (the cpu's) */
        if (tp_bw > 0 && a.intra_bw <= 0)
            sdv.intra_bw = tp_bw;
        if (!cli_shard_auto(m, &so, &sdv, tp_bw > 0 && a.intra_bw <= 0 ? tp_alpha : alpha,
                            &text, &d)) {
            fprintf(stderr, "kiln plan: %s\n", d.msg);
            fe_model_free(m);
            rc = 1;
            goto out;
        }
        if (text)
            fputs(text, stdout);
        free(text);
    }
    bool marked = false;
    for (int i = 0; i < m->g->t.n; i++)
        marked |= m->g->t.v[i].kind == TK_PARAM && m->g->t.v[i].shard.on;
    if (a.tp > 1 && marked)
        po.tp = a.tp;
    Variant v;
    if (!measure(m, &po, dev, &v, NULL, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        fe_model_free(m);
        rc = 1;
        goto out;
    }
    /* pp > 1: the compiler's stage cut, each stage's F, B and W timed;
     * where it cannot be made, the ideal split and formulas (said) */
    char cut_why[512] = "";
    if (a.pp > 1 && a.pp_formulas)
        snprintf(cut_why, sizeof cut_why, "--pipeline-formulas");
    else if (a.pp > 1) {
        Diag sd = {{0}};
        if (!measure_stages(m, &po, dev, a.pp, &v, &sd))
            snprintf(cut_why, sizeof cut_why, "%.500s", sd.msg);

    }
    if (a.global_batch > 0) {
        int64_t per = v.m.micro_batch * a.dp;
        if (a.global_batch % per != 0 || (a.micro_batches > 0 &&
                                          a.global_batch / per != a.micro_batches)) {
            fprintf(stderr, "kiln plan: --global-batch %lld is not --dp %d x the model's batch "
                            "%lld x --micro-batches (expected a multiple of %lld)\n",
                    (long long)a.global_batch, a.dp, (long long)v.m.micro_batch,
                    (long long)per);
            variant_free(&v);
            fe_model_free(m);
            rc = 2;
            goto out;
        }
        o.micro_batches = (int)(a.global_batch / per);
    }
    if (v.m.nstages > 0 && (double)o.micro_batches * a.pp * a.pp > CG_PP_SIM_MAX)
        snprintf(cut_why, sizeof cut_why, "%d micro-batches x %d stages squared is more than "
                 "the schedule's simulation takes (%.0f)", o.micro_batches, a.pp, CG_PP_SIM_MAX);
    CgClusterPlan p;
    char why[256];
    if (!cg_cluster_project(&v.m, &o, &p, why, sizeof why)) {
        fprintf(stderr, "kiln plan: %s\n", why);
        variant_free(&v);
        fe_model_free(m);
        rc = 2;
        goto out;
    }
    RematChoice rchoice;
    remat_at_memory(m, &po, dev, &o, &v, &p, &rchoice);
    cJSON *j = a.json ? cli_plan_json(dev, &o, &v, &p, cut_why) : NULL;
    if (j)
        cli_plan_remat_json(j, dev, &rchoice);
    if (!a.json)
        cli_plan_print(&a, dev, &o, &v, &p, cpu_link, &rchoice, cut_why);

    /* what-if rows: overlap, the other pipeline schedules, two other bucket sizes, each
     * remat policy */
    cJSON *rows = j ? cJSON_AddArrayToObject(j, "what_if") : NULL;
    if (!a.json)
        printf("what if (step; memory per GPU):\n");
    struct {
        char name[64];
        bool recompile;
        PassOpts po;
        bool no_overlap;
        CgPipeSchedule schedule;
    } w[8];
    int nw = 0;
    for (int k = 0; k < 8; k++)
        w[k].schedule = a.schedule;
    snprintf(w[nw].name, sizeof w[nw].name, "%s", a.no_overlap ? "overlap" : "no overlap");
    w[nw].recompile = false, w[nw].no_overlap = !a.no_overlap, nw++;
    for (int k = 0; k < CG_PP__N && a.pp > 1; k++) /* the other pipeline schedules */
        if (k != (int)a.schedule) {
            snprintf(w[nw].name, sizeof w[nw].name, "schedule=%s",
                     cg_pp_schedule_name((CgPipeSchedule)k));
            w[nw].recompile = false, w[nw].no_overlap = a.no_overlap;
            w[nw].schedule = (CgPipeSchedule)k, nw++;
        }
    for (int k = 0; k < 2; k++) {
        double mb = m->train.bucket_mb * (k ? 4 : 0.25);
        snprintf(w[nw].name, sizeof w[nw].name, "bucket_mb=%g", mb);
        w[nw].po = po, w[nw].po.bucket_bytes = (int64_t)(mb * 1048576.0);
        w[nw].recompile = true, w[nw].no_overlap = a.no_overlap, nw++;
    }
    const int pol[3] = {REMAT_NONE, REMAT_SELECTIVE, REMAT_FULL};
    for (int k = 0; k < 3; k++) {
        snprintf(w[nw].name, sizeof w[nw].name, "remat=%s", pass_remat_policy_name(pol[k]));
        w[nw].po = po, w[nw].po.remat = pol[k], w[nw].po.memory_budget = 0;
        w[nw].recompile = true, w[nw].no_overlap = a.no_overlap, nw++;
    }
    for (int k = 0; k < nw; k++) {
        Variant vw;
        CgClusterOpts ow = o;
        ow.no_overlap = w[k].no_overlap;
        ow.schedule = w[k].schedule;
        ow.step_time = 0; /* what-ifs are predictions */
        bool ok = w[k].recompile ? measure(m, &w[k].po, dev, &vw, NULL, &d) : true;
        /* the stage programs do not depend on the buckets; they run
         * without remat (pp), so a remat row keeps the formulas */
        if (ok && w[k].recompile && w[k].po.remat == po.remat) {
            vw.m.nstages = v.m.nstages;
            vw.m.stages = v.m.stages;
        }
        const Variant *use = w[k].recompile ? &vw : &v;
        CgClusterPlan pw;
        if (ok)
            ok = cg_cluster_project(&use->m, &ow, &pw, why, sizeof why);
        char x[32], y[32], e[32];
        if (ok) {
            ir_fmt_seconds(pw.step_predicted, x, sizeof x);
            ir_fmt_seconds(pw.t_dp_exposed, e, sizeof e);
            ir_fmt_bytes(pw.mem_total, 2, y, sizeof y);
            if (!a.json)
                printf("  %-22s step %s (exposed DP %s), %s per GPU%s\n", w[k].name, x, e, y,
                       a.pp > 1 && !pw.cut ? " (ideal split, formulas)" : "");
            else {
                cJSON *r = cJSON_CreateObject();
                cJSON_AddStringToObject(r, "name", w[k].name);
                cJSON_AddNumberToObject(r, "step_s", pw.step_predicted);
                cJSON_AddNumberToObject(r, "dp_exposed_s", pw.t_dp_exposed);
                cJSON_AddNumberToObject(r, "memory_per_gpu", pw.mem_total);
                cJSON_AddBoolToObject(r, "stage_cut", pw.cut);
                cJSON_AddItemToArray(rows, r);
            }
        } else if (!a.json) {
            printf("  %-22s cannot compile: %s\n", w[k].name, d.msg);
        }
        if (w[k].recompile && ok)
            variant_free(&vw);
    }
    if (j) {
        char *text = cJSON_Print(j);
        printf("%s\n", text);
        free(text);
        cJSON_Delete(j);
    }
    variant_free(&v);
    fe_model_free(m);
    rc = 0;
out:
    vec_free(&a.sets);
    return rc;
}
