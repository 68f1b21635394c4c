/* test_attention.c - the fused attention ops end to end:
 *   - the interpreter's attention and attention_lse against the unfused
 *     computation (matmul, scale, causal select, softmax, matmul) they
 *     replace, f32 and bf16;
 *   - the attention pass + autodiff (attention_lse, delta, attention_dq/dk/
 *     dv) against autodiff of the unfused graph: loss and every gradient;
 *   - the CPU backend's tiled kernels (codegen/cattn.c) against the
 *     interpreter, on the training graph and on the ops alone (Tq != Tk,
 *     Dv != D), causal and not, T = 1, T not a multiple of the tiles (32
 *     query rows, 64 keys), head sizes 32, 64 and 128; one thread and two;
 *   - the plan runs attention + attention_lse as one kernel and
 *     attention_dk + attention_dv as one;
 *   - the attention layout pass on the split_heads / merge_heads chains:
 *     no permute or slice left, the head layout's interpreter values equal
 *     the plain layout's, the CPU kernels' strided reads and writes match;
 *   - gpt.lua's training step on the CPU backend: loss and every gradient
 *     with the attention pass on equal those with it off (1e-5).
 * (The CPU backend is f32 only: bf16 is checked on the interpreter.) */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

static uint64_t rng = 99;
static double urand(void) { return test_urand(&rng); }

/* The unfused attention as nn.attention writes it, q k v params [B,H,T,D]
 * of dtype dt, loss = sum(f32(o) * w) (w an f32 input). */
static Graph *unfused(int B, int H, int T, int D, bool causal, const char *dt)
{
    char text[8192];
    int n = snprintf(text, sizeof text,
                     "kiln-ir v1\n"
                     "%%q:%s[%d,%d,%d,%d] = param \"q\" zeros\n"
                     "%%k:%s[%d,%d,%d,%d] = param \"k\" zeros\n"
                     "%%v:%s[%d,%d,%d,%d] = param \"v\" zeros\n"
                     "%%w:f32[%d,%d,%d,%d] = input \"w\"\n"
                     "%%s0:%s[%d,%d,%d,%d] = matmul %%q, %%k {ta=0,tb=1}\n"
                     "%%c:%s[] = const {value=%.17g}\n"
                     "%%cb:%s[%d,%d,%d,%d] = broadcast %%c\n"
                     "%%s:%s[%d,%d,%d,%d] = mul %%s0, %%cb\n",
                     dt, B, H, T, D, dt, B, H, T, D, dt, B, H, T, D, B, H, T, D, dt, B, H, T, T,
                     dt, 1 / sqrt(D), dt, B, H, T, T, dt, B, H, T, T);
    const char *x = "%s";
    if (causal) {
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "%%i0:i32[%d,%d] = iota {axis=0}\n"
                      "%%i1:i32[%d,%d] = iota {axis=1}\n"
                      "%%m:u8[%d,%d] = ge %%i0, %%i1\n"
                      "%%mb:u8[%d,%d,%d,%d] = broadcast %%m\n"
                      "%%f:%s[] = const {value=-1e9}\n"
                      "%%fb:%s[%d,%d,%d,%d] = broadcast %%f\n"
                      "%%x:%s[%d,%d,%d,%d] = select %%mb, %%s, %%fb\n",
                      T, T, T, T, T, T, B, H, T, T, dt, dt, B, H, T, T, dt, B, H, T, T);
        x = "%x";
    }
    snprintf(text + n, sizeof text - (size_t)n,
             "%%mx:%s[%d,%d,%d,1] = reduce_max %s {axes=[3]}\n"
             "%%sg:%s[%d,%d,%d,1] = stop_gradient %%mx\n"
             "%%mxb:%s[%d,%d,%d,%d] = broadcast %%sg\n"
             "%%z:%s[%d,%d,%d,%d] = sub %s, %%mxb\n"
             "%%e:%s[%d,%d,%d,%d] = exp %%z\n"
             "%%sm:%s[%d,%d,%d,1] = reduce_sum %%e {axes=[3]}\n"
             "%%smb:%s[%d,%d,%d,%d] = broadcast %%sm\n"
             "%%p:%s[%d,%d,%d,%d] = div %%e, %%smb\n"
             "%%o:%s[%d,%d,%d,%d] = matmul %%p, %%v {ta=0,tb=0}\n"
             "%%of:f32[%d,%d,%d,%d] = cast %%o\n"
             "%%ow:f32[%d,%d,%d,%d] = mul %%of, %%w\n"
             "%%l4:f32[1,1,1,1] = reduce_sum %%ow {axes=[0,1,2,3]}\n"
             "%%l:f32[] = reshape %%l4\n"
             "output \"loss\" %%l\n"
             "output \"o\" %%o\n",
             dt, B, H, T, x, dt, B, H, T, dt, B, H, T, T, dt, B, H, T, T, x, dt, B, H, T, T, dt, B,
             H, T, dt, B, H, T, T, dt, B, H, T, T, dt, B, H, T, D, B, H, T, D, B, H, T, D);
    return parse_or_fail(text);
}

/* Random values for g's inputs into val (and host f32 copies when host):
 * params in [-2, 2) (rounded to their dtype by a cast in the interpreter's
 * sense: bf16 values are made representable), w in [-1, 1). */
static void fill_inputs(const Graph *g, double **val, float **host)
{
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        int64_t n = shape_numel(&x->s);
        val[t] = xmalloc(sizeof(double) * (size_t)n);
        if (host)
            host[t] = xmalloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            float f = (float)(x->kind == TK_PARAM ? 4 * urand() - 2 : 2 * urand() - 1);
            if (x->s.dtype == DT_BF16) { /* truncate to 8 significant bits */
                union { float f; uint32_t u; } c = {f};
                c.u &= 0xffff0000u;
                f = c.f;
            }
            val[t][i] = f;
            if (host)
                host[t][i] = f;
        }
    }
}

static double *named(const Graph *g, double **val, const char *name)
{
    int t = ir_find_output(g, name);
    assert_true(t >= 0);
    return val[t];
}

static int64_t nnamed(const Graph *g, const char *name)
{
    return shape_numel(&g->t.v[ir_find_output(g, name)].s);
}

/* g1 unfused; g2 = attention pass on g1. Both through autodiff; the
 * interpreter's loss, o and gradients agree within tol. Returns g2 (after
 * autodiff) for the backend checks. */
static Graph *fused_vs_unfused(int B, int H, int T, int D, bool causal, const char *dt,
                               double tol)
{
    Graph *g1 = unfused(B, H, T, D, causal, dt), *g2 = ir_clone(g1);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    assert_true(pass_attention(g1, &o, &d)); /* o.attention false: no change */
    assert_int_equal(count_ops(g1, OP_ATTENTION), 0);
    o.attention = true;
    assert_true(pass_attention(g2, &o, &d));
    assert_int_equal(count_ops(g2, OP_ATTENTION), 1);
    assert_int_equal(count_ops(g2, OP_MATMUL), 0);
    assert_int_equal(count_ops(g2, OP_EXP), 0);
    const Op *at = NULL;
    for (int i = 0; i < g2->ops.n; i++)
        if (g2->ops.v[i].code == OP_ATTENTION)
            at = &g2->ops.v[i];
    assert_int_equal(at->attr.ia[0], causal);
    assert_true(fabs(at->attr.f - 1 / sqrt(D)) < 1e-12);
    if (!pass_autodiff(g1, &o, &d) || !pass_autodiff(g2, &o, &d))
        fail_msg("autodiff: %s", d.msg);
    assert_int_equal(count_ops(g2, OP_ATTENTION_LSE), 1);
    assert_int_equal(count_ops(g2, OP_ATTENTION_DQ), 1);
    assert_int_equal(count_ops(g2, OP_ATTENTION_DK), 1);
    assert_int_equal(count_ops(g2, OP_ATTENTION_DV), 1);
    char err[1024];
    assert_true(ir_verify(g2, err, sizeof err));
    double **v1 = ir_interp_alloc(g1), **v2 = ir_interp_alloc(g2);
    fill_inputs(g1, v1, NULL);
    for (int t = 0; t < g1->t.n; t++) /* same inputs (inputs keep their ids) */
        if (g1->t.v[t].op < 0) {
            int64_t n = shape_numel(&g1->t.v[t].s);
            v2[t] = xmalloc(sizeof(double) * (size_t)n);
            memcpy(v2[t], v1[t], sizeof(double) * (size_t)n);
        }
    ir_interp(g1, v1, NULL);
    ir_interp(g2, v2, NULL);
    static const char *const outs[] = {"loss", "o", "grad.q", "grad.k", "grad.v"};
    for (int i = 0; i < 5; i++) {
        double re = rel_err_min1(named(g2, v2, outs[i]), named(g1, v1, outs[i]), nnamed(g1, outs[i]));
        if (!(re <= tol))
            fail_msg("%s B=%d H=%d T=%d D=%d causal=%d: %s relative error %g (tol %g)", dt, B,
                     H, T, D, causal, outs[i], re, tol);
    }
    ir_interp_free(g1, v1);
    ir_interp_free(g2, v2);
    ir_free(g1);
    return g2;
}

/* The attention kernels of the last backend_vs_interp_out's plan that the
 * C printer folds (cg_c_attn_folded: attention_dqkv's dq and dk/dv). */
static int folded_seen;

/* Runs g (after the passes after autodiff) on the CPU backend with
 * `threads` and compares every float output with the interpreter; with
 * out, *out gets the outputs' values one after the other (*nout of them). */
static void backend_vs_interp_out(Graph *g, int threads, double tol, const char *what,
                                  float **out, int64_t *nout)
{
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("verify: %s", err);
    double **val = ir_interp_alloc(g);
    float **host = xcalloc((size_t)g->t.n, sizeof(float *));
    fill_inputs(g, val, host);
    Diag d = {{0}};
    ExecOpts eo = {.threads = threads};
    Exec *e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("rt_exec_create: %s", d.msg);
    for (int t = 0; t < g->t.n; t++)
        if (host[t])
            rt_exec_write(e, t, host[t]);
    ir_interp(g, val, NULL);
    if (!rt_exec_run(e, 1, 0, &d))
        fail_msg("rt_exec_run: %s", d.msg);
    for (int k = 0; k < g->outs.n; k++) {
        const Tensor *x = &g->t.v[g->outs.v[k].t];
        if (x->s.dtype != DT_F32)
            continue;
        int64_t n = shape_numel(&x->s);
        float *buf = xmalloc(sizeof(float) * (size_t)n);
        double *got = xmalloc(sizeof(double) * (size_t)n);
        rt_exec_read(e, x->id, buf);
        for (int64_t i = 0; i < n; i++)
            got[i] = buf[i];
        double re = rel_err_min1(got, val[x->id], n);
        if (!(re <= tol))
            fail_msg("%s (%d threads): output %s relative error %g (tol %g)", what, threads,
                     g->outs.v[k].name, re, tol);
        if (out) {
            *out = xrealloc(*out, sizeof(float) * (size_t)(*nout + n));
            memcpy(*out + *nout, buf, sizeof(float) * (size_t)n);
            *nout += n;
        }
        free(buf);
        free(got);
    }
    /* the plan: one forward kernel writes o and lse, one writes dk and dv */
    const CgPlan *p = rt_exec_plan(e);
    int fwd_both = 0, dkv_both = 0, lse_alone = 0, dqkv_parts = 0;
    folded_seen = 0;
    for (int s = 0; s < p->steps.n; s++) {
        if (p->steps.v[s].kind != CG_STEP_KERNEL)
            continue;
        const CgAttn *a = &p->kernels.v[p->steps.v[s].kernel]->attn;
        folded_seen += a->kind != CG_ATTN_NONE && cg_c_attn_folded(a);
        fwd_both += a->kind == CG_ATTN_FWD && a->o >= 0 && a->lse >= 0;
        lse_alone += a->kind == CG_ATTN_FWD && a->o < 0;
        dkv_both += a->kind == CG_ATTN_DKV && a->dk >= 0 && a->dv >= 0;
        /* attention_dqkv: a dq and a dk/dv kernel, each writing its result */
        if (a->kind != CG_ATTN_NONE && g->ops.v[a->ops[0]].code == OP_ATTENTION_DQKV) {
            int res = g->ops.v[a->ops[0]].out;
            int w = a->kind == CG_ATTN_DQ ? a->dq : a->dk;
            assert_true(w >= 0 && p->kernels.v[p->steps.v[s].kernel]->params.v[w].tensor == res);
            if (a->kind == CG_ATTN_DKV)
                assert_int_equal(a->dk, a->dv);
            dqkv_parts += a->kind == CG_ATTN_DQ ? 1 : 10;
        }
    }
    assert_int_equal(dqkv_parts, 11 * count_ops(g, OP_ATTENTION_DQKV));
    if (count_ops(g, OP_ATTENTION_LSE) && count_ops(g, OP_ATTENTION)) {
        assert_int_equal(lse_alone, 0);
        assert_true(fwd_both >= 1);
    }
    if (count_ops(g, OP_ATTENTION_DK) && count_ops(g, OP_ATTENTION_DV))
        assert_true(dkv_both >= 1);
    rt_exec_destroy(e);
    for (int t = 0; t < g->t.n; t++)
        free(host[t]);
    free(host);
    ir_interp_free(g, val);
}

static void backend_vs_interp(Graph *g, int threads, double tol, const char *what)
{
    backend_vs_interp_out(g, threads, tol, what, NULL, NULL);
}

/* The passes after autodiff that the CPU backend needs (schedule). */
static void finish(Graph *g)
{
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    if (!pass_simplify(g, &o, &d) || !pass_fuse(g, &o, &d) || !pass_schedule(g, &o, &d))
        fail_msg("passes: %s", d.msg);
}

static const struct {
    int B, H, T, D;
} shapes[] = {
    {2, 2, 1, 32},  /* T = 1 */
    {1, 2, 37, 32}, /* T not a multiple of the 32-row tile */
    {1, 2, 70, 64}, /* several key tiles, the last partial */
    {1, 1, 9, 128},
    {2, 1, 33, 64},
};

static void test_interp_fused_vs_unfused_f32(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int c = 0; c < 2; c++) {
            Graph *g = fused_vs_unfused(shapes[i].B, shapes[i].H, shapes[i].T, shapes[i].D, c,
                                        "f32", 1e-9);
            ir_free(g);
        }
}

static void test_interp_fused_vs_unfused_bf16(void **state)
{
    (void)state;
    /* the unfused graph rounds the scores, P and each partial result to
     * bf16; the fused op rounds its result only: agreement to bf16's
     * precision */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int c = 0; c < 2; c++) {
            Graph *g = fused_vs_unfused(shapes[i].B, shapes[i].H, shapes[i].T, shapes[i].D, c,
                                        "bf16", 6e-2);
            ir_free(g);
        }
}

static void test_backend_training_graph(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int c = 0; c < 2; c++) {
            Graph *g = fused_vs_unfused(shapes[i].B, shapes[i].H, shapes[i].T, shapes[i].D, c,
                                        "f32", 1e-9);
            finish(g);
            char what[128];
            snprintf(what, sizeof what, "B=%d H=%d T=%d D=%d causal=%d", shapes[i].B,
                     shapes[i].H, shapes[i].T, shapes[i].D, c);
            backend_vs_interp(g, 1, 2e-5, what);
            backend_vs_interp(g, 2, 2e-5, what);
            ir_free(g);
        }
}

/* The five ops alone, inputs of any value: Tq != Tk (not causal), Dv != D. */
static void test_backend_ops(void **state)
{
    (void)state;
    static const struct {
        int Tq, Tk, D, Dv, causal;
    } c[] = {
        {5, 9, 32, 16, 0}, {70, 70, 64, 64, 1}, {1, 1, 128, 128, 1}, {3, 100, 16, 48, 0},
        {65, 65, 32, 8, 1},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char text[4096];
        int Tq = c[i].Tq, Tk = c[i].Tk, D = c[i].D, Dv = c[i].Dv;
        snprintf(text, sizeof text,
                 "kiln-ir v1\n"
                 "%%q:f32[2,%d,%d] = input \"q\"\n"
                 "%%k:f32[2,%d,%d] = input \"k\"\n"
                 "%%v:f32[2,%d,%d] = input \"v\"\n"
                 "%%g:f32[2,%d,%d] = input \"dO\"\n"
                 "%%de:f32[2,%d,1] = input \"delta\"\n"
                 "%%o:f32[2,%d,%d] = attention %%q, %%k, %%v {causal=%d,scale=0.3}\n"
                 "%%l:f32[2,%d,1] = attention_lse %%q, %%k {causal=%d,scale=0.3}\n"
                 "%%dq:f32[2,%d,%d] = attention_dq %%q, %%k, %%v, %%g, %%l, %%de "
                 "{causal=%d,scale=0.3}\n"
                 "%%dk:f32[2,%d,%d] = attention_dk %%q, %%k, %%v, %%g, %%l, %%de "
                 "{causal=%d,scale=0.3}\n"
                 "%%dv:f32[2,%d,%d] = attention_dv %%q, %%k, %%v, %%g, %%l, %%de "
                 "{causal=%d,scale=0.3}\n"
                 "output \"o\" %%o\noutput \"lse\" %%l\noutput \"dq\" %%dq\n"
                 "output \"dk\" %%dk\noutput \"dv\" %%dv\n",
                 Tq, D, Tk, D, Tk, Dv, Tq, Dv, Tq, Tq, Dv, c[i].causal, Tq, c[i].causal, Tq, D,
                 c[i].causal, Tk, D, c[i].causal, Tk, Dv, c[i].causal);
        Graph *g = parse_or_fail(text);
        char what[128];
        snprintf(what, sizeof what, "ops Tq=%d Tk=%d D=%d Dv=%d causal=%d", Tq, Tk, D, Dv,
                 c[i].causal);
        backend_vs_interp(g, 1, 2e-5, what);
        backend_vs_interp(g, 2, 2e-5, what);
        ir_free(g);
    }
}

/* nn.CausalSelfAttention's shape of attention after autodiff, written out:
 * q, k, v head splits of one [2, T, 3C] input (k first, then v, then q),
 * dO a head split of a [2, T, C] input, delta = sum(dO * o), the outputs
 * merged back and dq, dk, dv concatenated. */
/* qkv_order: the gradient concat joins dk, dv, dq (the qkv tensor's
 * order: its gradient, which attndqkv turns into attention_dqkv); else
 * dq, dk, dv (a different tensor, which it must leave alone). */
static Graph *split_heads_graph(int B, int T, int H, int D, int causal, bool qkv_order)
{
    int C = H * D, W = 3 * C;
    char text[8192], at[64];
    snprintf(at, sizeof at, "{causal=%d,scale=0.3}", causal);
    int n = snprintf(text, sizeof text,
                     "kiln-ir v1\n%%a:f32[%d,%d,%d] = input \"qkv\"\n"
                     "%%g:f32[%d,%d,%d] = input \"dO\"\n",
                     B, T, W, B, T, C);
    static const char *const nm[3] = {"k", "v", "q"};
    for (int x = 0; x < 3; x++)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "%%%ss:f32[%d,%d,%d] = slice %%a {start=[0,0,%d]}\n"
                      "%%%sr:f32[%d,%d,%d,%d] = reshape %%%ss\n"
                      "%%%s:f32[%d,%d,%d,%d] = permute %%%sr {perm=[0,2,1,3]}\n",
                      nm[x], B, T, C, x * C, nm[x], B, T, H, D, nm[x], nm[x], B, H, T, D,
                      nm[x]);
    n += snprintf(text + n, sizeof text - (size_t)n,
                  "%%o:f32[%d,%d,%d,%d] = attention %%q, %%k, %%v %s\n"
                  "%%l:f32[%d,%d,%d,1] = attention_lse %%q, %%k %s\n"
                  "%%gr:f32[%d,%d,%d,%d] = reshape %%g\n"
                  "%%gp:f32[%d,%d,%d,%d] = permute %%gr {perm=[0,2,1,3]}\n"
                  "%%m:f32[%d,%d,%d,%d] = mul %%gp, %%o\n"
                  "%%de:f32[%d,%d,%d,1] = reduce_sum %%m {axes=[3]}\n",
                  B, H, T, D, at, B, H, T, at, B, T, H, D, B, H, T, D, B, H, T, D, B, H, T);
    static const char *const gn[4] = {"o", "dq", "dk", "dv"};
    for (int x = 0; x < 4; x++) {
        if (x)
            n += snprintf(text + n, sizeof text - (size_t)n,
                          "%%%s:f32[%d,%d,%d,%d] = attention_%s %%q, %%k, %%v, %%gp, %%l, %%de "
                          "%s\n",
                          gn[x], B, H, T, D, gn[x], at);
        n += snprintf(text + n, sizeof text - (size_t)n,
                      "%%%sp:f32[%d,%d,%d,%d] = permute %%%s {perm=[0,2,1,3]}\n"
                      "%%%sm:f32[%d,%d,%d] = reshape %%%sp\n",
                      gn[x], B, T, H, D, gn[x], gn[x], B, T, C, gn[x]);
    }
    snprintf(text + n, sizeof text - (size_t)n,
             "%%dqkv:f32[%d,%d,%d] = concat %s {axis=2}\n"
             "output \"o\" %%om\noutput \"dqkv\" %%dqkv\n",
             B, T, W, qkv_order ? "%dkm, %dvm, %dqm" : "%dqm, %dkm, %dvm");
    return parse_or_fail(text);
}

/* The attention layout pass (passes/attn_layout.c) on split_heads_graph:
 * every permute and slice goes, the group is in the head layout (k at
 * column 0, v at C, q at 2C), the interpreter gives the same o and
 * gradients as before (the head layout's definition against the plain
 * one's), and the CPU kernels (strided reads and writes) match the
 * interpreter. */
static void test_head_layout(void **state)
{
    (void)state;
    static const struct {
        int T, H, D, causal;
    } c[] = {{1, 2, 32, 1}, {37, 2, 32, 1}, {70, 3, 64, 0}, {9, 1, 128, 1}, {33, 2, 64, 0}};
    size_t nc = sizeof c / sizeof c[0];
    for (size_t r = 0; r < 2 * nc; r++) {
        size_t i = r % nc;
        bool qkv = r >= nc; /* the concat is qkv's gradient */
        Graph *g1 = split_heads_graph(2, c[i].T, c[i].H, c[i].D, c[i].causal, qkv),
              *g2 = ir_clone(g1);
        PassOpts o;
        pass_opts_default(&o);
        Diag d = {{0}};
        assert_true(pass_attention_layout(g2, &o, &d)); /* o.attention false: no change */
        assert_false(ir_attn_heads(&g2->ops.v[g2->ops.n - 1].attr) &&
                     ir_opinfo[g2->ops.v[g2->ops.n - 1].code].cls == OC_ATTN);
        assert_int_equal(count_ops(g2, OP_PERMUTE), count_ops(g1, OP_PERMUTE));
        o.attention = true;
        if (!pass_attention_layout(g2, &o, &d) || !pass_simplify(g2, &o, &d) ||
            !pass_attention_dqkv(g2, &o, &d))
            fail_msg("passes: %s", d.msg);
        char err[1024];
        if (!ir_verify(g2, err, sizeof err))
            fail_msg("verify: %s", err);
        /* attndqkv: the concat becomes attention_dqkv only when it is qkv's
         * gradient (dq, dk, dv at q's, k's and v's columns) */
        assert_int_equal(count_ops(g2, OP_ATTENTION_DQKV), qkv);
        assert_int_equal(count_ops(g2, OP_CONCAT), !qkv);
        assert_int_equal(count_ops(g2, OP_ATTENTION_DQ), !qkv);
        assert_int_equal(count_ops(g2, OP_PERMUTE), 0);
        assert_int_equal(count_ops(g2, OP_SLICE), 0);
        int nattn = 0, C = c[i].H * c[i].D;
        for (int j = 0; j < g2->ops.n; j++) {
            const Op *op = &g2->ops.v[j];
            if (ir_opinfo[op->code].cls != OC_ATTN)
                continue;
            nattn++;
            assert_true(ir_attn_heads(&op->attr));
            assert_int_equal(op->attr.ia[1], c[i].H);
            assert_int_equal(op->attr.ia[2], c[i].D);
            assert_int_equal(op->attr.ia[3], 2 * C); /* q */
            assert_int_equal(op->attr.ia[4], 0);     /* k */
            assert_int_equal(op->attr.ia[5], C);     /* v */
        }
        assert_int_equal(nattn, qkv ? 3 : 5);
        double **v1 = ir_interp_alloc(g1), **v2 = ir_interp_alloc(g2);
        fill_inputs(g1, v1, NULL);
        for (int t = 0; t < g1->t.n; t++) /* same inputs (inputs keep their ids) */
            if (g1->t.v[t].op < 0) {
                int64_t n = shape_numel(&g1->t.v[t].s);
                v2[t] = xmalloc(sizeof(double) * (size_t)n);
                memcpy(v2[t], v1[t], sizeof(double) * (size_t)n);
            }
        ir_interp(g1, v1, NULL);
        ir_interp(g2, v2, NULL);
        static const char *const outs[] = {"o", "dqkv"};
        for (int x = 0; x < 2; x++) {
            double re = rel_err_min1(named(g2, v2, outs[x]), named(g1, v1, outs[x]),
                               nnamed(g1, outs[x]));
            if (!(re <= 1e-12))
                fail_msg("T=%d H=%d D=%d causal=%d: %s relative error %g", c[i].T, c[i].H,
                         c[i].D, c[i].causal, outs[x], re);
        }
        ir_interp_free(g1, v1);
        ir_interp_free(g2, v2);
        finish(g2);
        char what[128];
        snprintf(what, sizeof what, "head layout T=%d H=%d D=%d causal=%d", c[i].T, c[i].H,
                 c[i].D, c[i].causal);
        backend_vs_interp(g2, 1, 2e-5, what);
        backend_vs_interp(g2, 2, 2e-5, what);
        ir_free(g1);
        ir_free(g2);
    }
}

/* split_heads_graph in qkv order through the attention layout and attndqkv
 * passes: one attention_dqkv op, ready for the backend. */
static Graph *dqkv_graph(int B, int T, int H, int D, int causal)
{
    Graph *g = split_heads_graph(B, T, H, D, causal, true);
    PassOpts o;
    pass_opts_default(&o);
    o.attention = true;
    Diag d = {{0}};
    if (!pass_attention_layout(g, &o, &d) || !pass_simplify(g, &o, &d) ||
        !pass_attention_dqkv(g, &o, &d))
        fail_msg("passes: %s", d.msg);
    assert_int_equal(count_ops(g, OP_ATTENTION_DQKV), 1);
    finish(g);
    return g;
}

/* attention_dqkv with at least CG_ATTN_FOLD_ITEMS (batch entry, head)
 * pairs runs as one C kernel (cg_c_attn_folded: the dk/dv kernel computes
 * dq too): it matches the interpreter (T = 1, T not a multiple of the
 * tiles, several key tiles, head sizes 32, 64, 128, causal and not), and
 * its bits equal the two kernels' (KILN_ATTN_FOLD=0) on one thread and two;
 * one pair fewer keeps the two kernels. */
static void test_dqkv_folded(void **state)
{
    (void)state;
    static const struct {
        int B, T, H, D, causal;
    } c[] = {{2, 1, 8, 32, 1},  {2, 37, 8, 32, 1}, {4, 70, 4, 64, 1},
             {2, 70, 8, 64, 0}, {2, 9, 8, 128, 1}, {1, 40, 16, 32, 1}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        Graph *g = dqkv_graph(c[i].B, c[i].T, c[i].H, c[i].D, c[i].causal);
        char what[128];
        snprintf(what, sizeof what, "folded B=%d T=%d H=%d D=%d causal=%d", c[i].B, c[i].T,
                 c[i].H, c[i].D, c[i].causal);
        float *got[3] = {NULL, NULL, NULL};
        int64_t n[3] = {0, 0, 0};
        for (int r = 0; r < 3; r++) {
            if (r == 2)
                setenv("KILN_ATTN_FOLD", "0", 1);
            rng = 7;
            backend_vs_interp_out(g, r ? 2 : 1, 2e-5, what, &got[r], &n[r]);
            unsetenv("KILN_ATTN_FOLD");
            /* folded: the dq kernel and the dk/dv kernel both say so */
            assert_int_equal(folded_seen, r < 2 ? 2 : 0);
        }
        for (int r = 1; r < 3; r++) {
            assert_int_equal(n[r], n[0]);
            if (memcmp(got[r], got[0], sizeof(float) * (size_t)n[0]) != 0)
                fail_msg("%s: %s give other bits than the folded kernel on one thread", what,
                         r == 1 ? "two threads" : "the two kernels");
        }
        for (int r = 0; r < 3; r++)
            free(got[r]);
        ir_free(g);
    }
    /* 15 pairs: the two kernels */
    Graph *g = dqkv_graph(1, 40, 15, 32, 1);
    backend_vs_interp(g, 2, 2e-5, "15 pairs");
    assert_int_equal(folded_seen, 0);
    ir_free(g);
}

/* The FLOP count keeps only the kept pairs: causal is sum_i (i+1). */
static void test_cost(void **state)
{
    (void)state;
    Graph *g = parse_or_fail("kiln-ir v1\n"
                             "%q:f32[3,10,8] = input \"q\"\n"
                             "%k:f32[3,10,8] = input \"k\"\n"
                             "%v:f32[3,10,4] = input \"v\"\n"
                             "%o:f32[3,10,4] = attention %q, %k, %v {causal=1,scale=1}\n"
                             "%p:f32[3,10,4] = attention %q, %k, %v {causal=0,scale=1}\n"
                             "output \"o\" %o\noutput \"p\" %p\n");
    double per = 2 * 8 + 4 + 2 * 4;
    assert_true(fabs(ir_op_flops(g, &g->ops.v[0]) - 3 * 55 * per) < 1e-9);
    assert_true(fabs(ir_op_flops(g, &g->ops.v[1]) - 3 * 100 * per) < 1e-9);
    ir_free(g);
}

/* gpt.lua (tiny, and a longer T with D=32 heads) compiled with the attention
 * pass on and off: one CPU step from the same inputs gives the same loss
 * and gradients to f32 rounding. */
/* test_gpt_step_on_off's look at each graph: the attention ops there when
 * the pass is on, and for gpt (arg: its layer count) one attention_dqkv per
 * layer and no concat left. */
static void gpt_step_check(const Graph *g, int on, void *arg)
{
    const int *layers = arg;
    assert_int_equal(count_ops(g, OP_ATTENTION) > 0, on);
    if (*layers) {
        assert_int_equal(count_ops(g, OP_ATTENTION_DQKV), on ? *layers : 0);
        if (on)
            assert_int_equal(count_ops(g, OP_CONCAT), 0);
    }
}

static void test_gpt_step_on_off(void **state)
{
    (void)state;
    static const char *const sets[][4] = {{"T=32", "C=32", "H=2", "L=2"},
                                          {"T=70", "C=64", "H=2", "L=1"},
                                          {"digits=3", "H=4", "C=128", "L=2"}};
    static const char *const path[] = {"models/gpt.lua", "models/gpt.lua",
                                       "models/addition.lua"};
    for (int c = 0; c < 3; c++) {
        Model *m = load_model(path[c], sets[c], 4);
        int layers = c < 2 ? atoi(sets[c][3] + 2) : 0; /* gpt's; addition: unchecked */
        char what[64];
        snprintf(what, sizeof what, "gpt %s", sets[c][0]);
        assert_true(attn_on_off_compare(m, true, 1e-5, gpt_step_check, &layers, what) > 4);
        fe_model_free(m);
    }
}

/* schedule puts each attention_lse right after its own attention op (the
 * backends then run the two as one kernel), comparing every attribute: two
 * head-layout groups reading one qkv tensor at different offsets share q,
 * k, causal and scale, and must not be paired across. Both lse ops come
 * after both attention ops, the second group's lse first. */
static void test_schedule_pairs_by_layout(void **state)
{
    (void)state;
    const char *a1 = "{causal=1,scale=0.5,heads=2,hd=2,qoff=0,koff=4,voff=8}",
               *a2 = "{causal=1,scale=0.5,heads=2,hd=2,qoff=4,koff=0,voff=8}";
    char text[2048];
    snprintf(text, sizeof text,
             "kiln-ir v1\n%%a:f32[1,5,12] = input \"qkv\"\n"
             "%%o1:f32[1,5,4] = attention %%a, %%a, %%a %s\n"
             "%%o2:f32[1,5,4] = attention %%a, %%a, %%a %s\n"
             "%%l2:f32[1,5,2,1] = attention_lse %%a, %%a %s\n"
             "%%l1:f32[1,5,2,1] = attention_lse %%a, %%a %s\n"
             "output \"o1\" %%o1\noutput \"o2\" %%o2\noutput \"l1\" %%l1\n"
             "output \"l2\" %%l2\n",
             a1, a2, a2, a1);
    Graph *g = parse_or_fail(text);
    finish(g);
    int paired = 0;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *l = &g->ops.v[i];
        if (l->code != OP_ATTENTION_LSE)
            continue;
        assert_true(i > 0);
        const Op *a = &g->ops.v[i - 1];
        if (a->code != OP_ATTENTION || !ir_attn_same_attrs(&a->attr, &l->attr))
            fail_msg("attention_lse {qoff=%lld} at %d follows %s {qoff=%lld}",
                     (long long)l->attr.ia[3], i, ir_opinfo[a->code].name,
                     (long long)a->attr.ia[3]);
        paired++;
    }
    assert_int_equal(paired, 2);
    backend_vs_interp(g, 1, 2e-5, "two groups on one qkv");
    ir_free(g);
}

/* The same with two attentions that differ only in their bias operand (a
 * [5, 5] bias each, the same q, k and attributes): each attention_lse
 * follows the attention op of its own bias, the second bias's lse, which
 * comes first, not the first attention op that matches in q, k and
 * attributes; the backend then runs each pair as one kernel (no lse
 * kernel alone). */
static void test_schedule_pairs_by_bias(void **state)
{
    (void)state;
    const char *at = "{causal=1,scale=0.5,bias=1}";
    char text[2048];
    snprintf(text, sizeof text,
             "kiln-ir v1\n%%q:f32[2,5,4] = input \"q\"\n"
             "%%b1:f32[5,5] = input \"b1\"\n%%b2:f32[5,5] = input \"b2\"\n"
             "%%o1:f32[2,5,4] = attention %%q, %%q, %%q, %%b1 %s\n"
             "%%o2:f32[2,5,4] = attention %%q, %%q, %%q, %%b2 %s\n"
             "%%l2:f32[2,5,1] = attention_lse %%q, %%q, %%b2 %s\n"
             "%%l1:f32[2,5,1] = attention_lse %%q, %%q, %%b1 %s\n"
             "output \"o1\" %%o1\noutput \"o2\" %%o2\noutput \"l1\" %%l1\n"
             "output \"l2\" %%l2\n",
             at, at, at, at);
    Graph *g = parse_or_fail(text);
    finish(g);
    int paired = 0;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *l = &g->ops.v[i];
        if (l->code != OP_ATTENTION_LSE)
            continue;
        assert_true(i > 0);
        const Op *a = &g->ops.v[i - 1];
        if (a->code != OP_ATTENTION || ir_attn_bias_in(a) != ir_attn_bias_in(l))
            fail_msg("attention_lse with bias %%%d at %d follows %s with bias %%%d",
                     ir_attn_bias_in(l), i, ir_opinfo[a->code].name,
                     a->code == OP_ATTENTION ? ir_attn_bias_in(a) : -1);
        paired++;
    }
    assert_int_equal(paired, 2);
    backend_vs_interp(g, 1, 2e-5, "two biases on one q, k");
    ir_free(g);
}

/* gpt 124M (batch 16 x 1024, bf16) as the CUDA backend compiles it: the
 * gradient of each layer's [B, T, 3C] qkv projection is one attention_dqkv
 * op run as two kernels (dq, dk/dv) writing one buffer; no concat op and no
 * concat kernel is left in the step (issue 16: the 12 concats of dq, dk,
 * dv cost 0.43 ms of the predicted H200 step). */
static void test_gpt124m_no_qkv_concat(void **state)
{
    (void)state;
    const char *sets[] = {"size=124M", "batch=16", "precision=bf16"};
    Model *m = load_model("models/gpt.lua", sets, 3);
    PassOpts po;
    RtGraphFlags gf = {.memory_budget = -1};
    rt_pass_opts(&m->train, &gf, &po);
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
    assert_int_equal(count_ops(m->g, OP_CONCAT), 0);
    assert_int_equal(count_ops(m->g, OP_ATTENTION_DQKV), 12);
    assert_int_equal(count_ops(m->g, OP_ATTENTION_DQ) + count_ops(m->g, OP_ATTENTION_DK) +
                         count_ops(m->g, OP_ATTENTION_DV),
                     0);
    CgPlan *p = cg_plan(m->g, &d);
    if (!p)
        fail_msg("plan: %s", d.msg);
    int dq = 0, dkv = 0, concat = 0;
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_KERNEL)
            continue;
        const CgKernel *k = p->kernels.v[st->kernel];
        concat += m->g->ops.v[st->op].code == OP_CONCAT || strstr(st->name, "concat");
        if (m->g->ops.v[st->op].code == OP_ATTENTION_DQKV) {
            dq += k->attn.kind == CG_ATTN_DQ;
            dkv += k->attn.kind == CG_ATTN_DKV;
        }
    }
    assert_int_equal(concat, 0);
    assert_int_equal(dq, 12);
    assert_int_equal(dkv, 12);
    cg_plan_free(p);
    fe_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interp_fused_vs_unfused_f32),
        cmocka_unit_test(test_interp_fused_vs_unfused_bf16),
        cmocka_unit_test(test_backend_training_graph),
        cmocka_unit_test(test_backend_ops),
        cmocka_unit_test(test_head_layout),
        cmocka_unit_test(test_dqkv_folded),
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_gpt_step_on_off),
        cmocka_unit_test(test_schedule_pairs_by_layout),
        cmocka_unit_test(test_schedule_pairs_by_bias),
        cmocka_unit_test(test_gpt124m_no_qkv_concat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
