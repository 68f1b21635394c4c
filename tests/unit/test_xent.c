/* test_xent.c - cross-entropy as nn.cross_entropy builds it (issue 16):
 *   - the loss kernel of gpt.lua reads each row of logits in one fold (the
 *     online logsumexp) and once more to store the gradient, softmax minus
 *     one-hot, in the same kernel; the target logit is one load per row;
 *     the predicted H200 time of those kernels at GPT-2 124M is printed;
 *   - one logits-sized buffer at GPT-2 124M: the loss gradient is written
 *     over the logits (issue 37), bf16 on the device;
 *   - the training step has no logits output and a lower planned peak than
 *     the same step that keeps them (output(..., {train = true}));
 *   - vocabulary padding (gpt.lua vocab_pad): the loss equals the unpadded
 *     model's with the same weights on the real rows, whatever the padded
 *     rows hold, and the padded rows' gradients are exactly zero. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_cuda.h"
#include "codegen.h"
#include "passes.h"

static void compile(Model *m, const char *last)
{
    PassOpts po;
    pass_opts_default(&po);
    po.grad_clip = m->train.grad_clip;
    po.weight_decay = m->train.weight_decay;
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, last, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
}

/* The logits: the tensor the loss's logsumexp reads, through the padded
 * classes' mask (select) if any (-1: none). */
static int find_logits(const Graph *g)
{
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_REDUCE_LOGSUMEXP) {
            int t = g->ops.v[i].in[0], o = g->t.v[t].op;
            if (o >= 0 && g->ops.v[o].code == OP_SELECT)
                t = g->ops.v[o].in[1];
            o = g->t.v[t].op;
            return o >= 0 && g->ops.v[o].code == OP_MATMUL ? t : -1;
        }
    return -1;
}

static bool reads(const CgKernel *k, int e, int param)
{
    if (e < 0)
        return false;
    const CgExpr *x = &k->ex.v[e];
    if (x->kind == CGX_LOAD && x->param == param)
        return true;
    int n = x->kind == CGX_OP       ? cg_opinfo[x->op].arity
            : x->kind == CGX_SELECT ? 3
            : x->kind == CGX_LOAD || x->kind == CGX_CAST || x->kind == CGX_RAND ? 1
                                                                                 : 0;
    for (int j = 0; j < n; j++)
        if (reads(k, x->a[j], param))
            return true;
    return false;
}

/* Whether phase ph (with inner dims) loads param p. */
static bool phase_reads(const CgKernel *k, const CgPhase *ph, int p)
{
    if (ph->acc >= 0 && reads(k, ph->value, p))
        return true;
    for (int i = 0; i < ph->lets.n; i++)
        if (reads(k, ph->lets.v[i], p))
            return true;
    for (int i = 0; i < ph->st.n; i++)
        if (reads(k, ph->st.v[i].value, p) || reads(k, ph->st.v[i].index, p))
            return true;
    return false;
}

typedef struct {
    int kernels;    /* kernel steps reading the logits */
    int lse_folds;  /* logsumexp folds over them */
    int other_folds; /* any other reduction over them */
    int passes;     /* phases with inner dims reading them, over all kernels */
    int row_loads;  /* kernel steps reading them only per row (a take_along) */
    bool in_place;  /* a kernel writes the loss gradient over them */
    bool cached;    /* bf16 CUDA: the loss kernel reads their rows from memory once */
    double h200_s;  /* predicted H200 time of those kernel steps (bf16) */
} LossKernels;

static LossKernels loss_kernels(const char *const *sets, int nsets, bool predict)
{
    Model *m = load_model("models/gpt.lua", sets, nsets);
    compile(m, NULL);
    Diag d = {{0}};
    CgPlan *p = cg_plan(m->g, &d);
    if (!p)
        fail_msg("plan: %s", d.msg);
    int lg = find_logits(m->g);
    assert_true(lg >= 0);
    LossKernels r = {0};
    bool *mine = xcalloc((size_t)p->steps.n + 1, sizeof(bool));
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_KERNEL)
            continue;
        const CgKernel *k = p->kernels.v[st->kernel];
        int param = -1;
        /* the logits' buffer: the loss gradient written over them is the
         * same param (cg_merge_inplace_params) */
        for (int j = 0; j < k->params.n; j++)
            if (p->mem->root[st->args[j]] == p->mem->root[lg])
                param = j;
        if (param < 0)
            continue;
        mine[s] = true;
        r.kernels++;
        int passes = 0;
        for (int li = 0; li < k->loops.n; li++)
            for (int pi = 0; pi < k->loops.v[li].ph.n; pi++) {
                const CgPhase *ph = &k->loops.v[li].ph.v[pi];
                if (!ph->ndim || !phase_reads(k, ph, param))
                    continue;
                passes++;
                if (ph->acc >= 0 && ph->rop == CG_RED_LSE)
                    r.lse_folds++;
                else if (ph->acc >= 0)
                    r.other_folds++;
            }
        r.passes += passes;
        r.row_loads += passes == 0;
        r.in_place |= k->params.v[param].out;
    }
    CgCudaProgram *q = cg_cuda_program(p, true);
    for (int s = 0; s < p->steps.n; s++)
        for (int f = 0; mine[s] && f < q->step_nfn[s]; f++) {
            const CgCudaFn *fn = &q->fn.v[q->step_fn[s] + f];
            for (int c = 0; c < fn->ncached; c++)
                r.cached |= p->mem->root[p->steps.v[s].args[fn->cached[c]]] == p->mem->root[lg];
        }
    if (predict) {
        CgPredictOpts po = {.bf16 = true};
        CgPrediction *pr = cg_predict(p, q, cg_device_find("h200"), &po);
        for (int i = 0; i < pr->rows.n; i++)
            if (mine[pr->rows.v[i].step])
                r.h200_s += pr->rows.v[i].s;
        cg_prediction_free(pr);
    }
    cg_cuda_program_free(q);
    free(mine);
    cg_plan_free(p);
    fe_model_free(m);
    return r;
}

/* One kernel reads the logits: a fold for the logsumexp, one for the
 * target logit (a row sum of the logits at the target class) and the
 * gradient's stores, written over the logits; in bf16 on CUDA it keeps the
 * row in registers (read from memory once): at tiny size and at GPT-2
 * 124M (batch 16, vocabulary padded to 50304). */
static void test_loss_reads_logits_once(void **state)
{
    (void)state;
    const char *big[] = {"size=124M", "batch=16"};
    for (int t = 0; t < 2; t++) {
        LossKernels r = loss_kernels(t ? big : NULL, t ? 2 : 0, t == 1);
        print_message("gpt.lua%s: %d kernels read the logits: %d logsumexp folds, %d other "
                      "folds, %d passes over rows, %d per-row loads%s%s",
                      t ? " 124M" : "", r.kernels, r.lse_folds, r.other_folds, r.passes,
                      r.row_loads, r.in_place ? ", gradient in place" : "",
                      r.cached ? ", rows cached (bf16)" : "");
        if (t)
            print_message("; predicted H200 (bf16) time of those kernels %.3f ms",
                          r.h200_s * 1e3);
        print_message("\n");
        assert_int_equal(r.kernels, 1); /* the row kernel */
        assert_int_equal(r.lse_folds, 1);
        assert_int_equal(r.other_folds, 1); /* the target logit */
        assert_int_equal(r.passes, 3);      /* the two folds and the gradient's stores */
        assert_int_equal(r.row_loads, 0);
        assert_true(r.in_place);
        assert_true(r.cached);
    }
}

/* Temp storages of at least n elements in plan m (stored as storage[t];
 * NULL: the tensors' dtypes): how many, and how many of them are f32. */
static void big_storages(const Graph *g, const MemPlan *m, const DType *storage, int64_t n,
                         int *count, int *f32)
{
    bool *mat = pass_fuse_materialised(g);
    *count = *f32 = 0;
    for (int t = 0; t < g->t.n; t++) {
        if (m->root[t] != t || m->persistent[t] || !mat[t] || shape_numel(&g->t.v[t].s) < n)
            continue;
        ++*count;
        *f32 += (storage ? storage[t] : g->t.v[t].s.dtype) == DT_F32;
    }
    free(mat);
}

/* GPT-2 124M, batch 16: one logits-sized buffer in the step, the logits
 * and the loss gradient written over them (was two: dlogits beside the
 * logits, 3.3 GB more in f32), in the f32 plan and in the bf16 device
 * arena, where it is bf16 (no f32 tensor of B*T*V elements). */
static void test_one_logits_buffer(void **state)
{
    (void)state;
    const char *sets[] = {"size=124M", "batch=16"};
    Model *m = load_model("models/gpt.lua", sets, 2);
    compile(m, NULL);
    Diag d = {{0}};
    CgPlan *p = cg_plan(m->g, &d);
    if (!p)
        fail_msg("plan: %s", d.msg);
    int lg = find_logits(m->g);
    assert_true(lg >= 0);
    int64_t n = shape_numel(&m->g->t.v[lg].s);
    assert_int_equal(n, 16LL * 1024 * 50304);
    CgCudaProgram *q = cg_cuda_program(p, true);
    int count, f32, dcount, df32;
    big_storages(m->g, p->mem, NULL, n, &count, &f32);
    big_storages(m->g, q->mem, q->storage, n, &dcount, &df32);
    print_message("gpt.lua 124M batch 16: %d storage(s) of B*T*V elements in the plan, %d in "
                  "the bf16 device arena (%d f32)\n",
                  count, dcount, df32);
    assert_int_equal(count, 1);
    assert_int_equal(dcount, 1);
    assert_int_equal(df32, 0);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    fe_model_free(m);
}

/* The training step stores no logits: no such output, and a planned peak
 * below the same step's when the script keeps them ({train = true}). */
static void test_training_step_has_no_logits(void **state)
{
    (void)state;
    char *text = read_file("models/gpt.lua");
    assert_non_null(text);
    const char *from = "output(\"logits\", wte.rows > V and logits:slice(-1, 0, V) or logits)";
    char *at = strstr(text, from);
    assert_non_null(at);
    char *kept = xasprintf("%.*soutput(\"logits\", logits, {train = true})%s",
                           (int)(at - text), text, at + strlen(from));
    int64_t peak[2];
    for (int v = 0; v < 2; v++) {
        char err[1024];
        const char *src = v ? kept : text;
        Model *m = fe_load_model_text("models/gpt.lua", src, strlen(src), NULL, 0, err,
                                      sizeof err);
        if (!m)
            fail_msg("%s", err);
        assert_true((ir_find_output(m->g, "logits") >= 0) == (v == 1));
        const Graph *eg = m->eval_g ? m->eval_g : m->g; /* evaluation has them */
        assert_true(ir_find_output(eg, "logits") >= 0);
        compile(m, NULL);
        Diag d = {{0}};
        CgPlan *p = cg_plan(m->g, &d);
        if (!p)
            fail_msg("plan: %s", d.msg);
        peak[v] = p->arena_bytes;
        cg_plan_free(p);
        fe_model_free(m);
    }
    print_message("gpt.lua planned peak: %lld bytes without the logits output, %lld with\n",
                  (long long)peak[0], (long long)peak[1]);
    assert_true(peak[0] < peak[1]);
    free(kept);
    free(text);
}

/* Forward and backward of gpt.lua (V = 200) in the interpreter, params
 * from random_model_inputs by name; wte rows at and above 200 (padding)
 * filled with `junk`. Returns the loss; *gwte: the gradient of wte
 * (malloc'd), *rows its row count. */
static double padded_step(int pad, double junk, double **gwte, int64_t *rows)
{
    char set[32];
    snprintf(set, sizeof set, "vocab_pad=%d", pad);
    const char *sets[] = {"V=200", set};
    Model *m = load_model("models/gpt.lua", sets, 2);
    compile(m, "autodiff");
    const Graph *g = m->g;
    Model *ref = load_model("models/gpt.lua", sets, 1); /* V=200 unpadded: the values */
    void **host = random_model_inputs(ref->g);
    double **val = ir_interp_alloc(g);
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        int64_t n = shape_numel(&x->s);
        val[t] = xcalloc((size_t)(n ? n : 1), sizeof(double));
        int r = x->name ? ir_find_tensor(ref->g, x->name) : -1;
        if (r < 0 || !host[r])
            continue;
        const Tensor *y = &ref->g->t.v[r];
        int64_t nr = shape_numel(&y->s);
        for (int64_t i = 0; i < n; i++) {
            double v = junk;
            if (i < nr)
                v = y->s.dtype == DT_F32   ? ((float *)host[r])[i]
                    : y->s.dtype == DT_I32 ? ((int32_t *)host[r])[i]
                                           : 0;
            val[t][i] = v;
        }
    }
    InterpOpts o = {1, 0};
    ir_interp(g, val, &o);
    double loss = val[ir_find_output(g, "loss")][0];
    int gw = ir_find_output(g, "grad.wte.weight");
    assert_true(gw >= 0);
    *rows = g->t.v[gw].s.dim[0];
    int64_t n = shape_numel(&g->t.v[gw].s);
    *gwte = xmalloc(sizeof(double) * (size_t)n);
    memcpy(*gwte, val[gw], sizeof(double) * (size_t)n);
    ir_interp_free(g, val);
    for (int t = 0; t < ref->g->t.n; t++)
        free(host[t]);
    free(host);
    fe_model_free(ref);
    fe_model_free(m);
    return loss;
}

static void test_vocab_padding(void **state)
{
    (void)state;
    double *g0, *g1, *g2;
    int64_t r0, r1, r2;
    double l0 = padded_step(1, 0, &g0, &r0);
    double l1 = padded_step(64, 0, &g1, &r1);
    double l2 = padded_step(64, 7.5, &g2, &r2); /* padding rows that would win */
    print_message("loss: unpadded %.12f, padded (zero rows) %.12f, padded (rows of 7.5) "
                  "%.12f\n",
                  l0, l1, l2);
    assert_int_equal(r0, 200);
    assert_int_equal(r1, 256);
    assert_true(fabs(l1 - l0) <= 1e-6 * fabs(l0));
    assert_true(fabs(l2 - l0) <= 1e-6 * fabs(l0));
    int64_t C = 32;
    assert_true(rel_err(g1, g0, 200 * C) <= 1e-9);
    assert_true(rel_err(g2, g0, 200 * C) <= 1e-9);
    for (int64_t i = 200 * C; i < 256 * C; i++)
        if (g1[i] != 0 || g2[i] != 0)
            fail_msg("padded row %lld of grad.wte.weight: %g, %g (expected 0)",
                     (long long)(i / C), g1[i], g2[i]);
    free(g0);
    free(g1);
    free(g2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_reads_logits_once),
        cmocka_unit_test(test_one_logits_buffer),
        cmocka_unit_test(test_training_step_has_no_logits),
        cmocka_unit_test(test_vocab_padding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
