/* test_attn_variants.c - nn.attention's variants through the fused path:
 * grouped-query heads (kv_heads; multi-query too), a causal sliding window
 * and ALiBi, alone and together, on tests/data/attn_variants.lua (q, k, v
 * params, T = 37 and 70: not a multiple of the 32-row and 64-key tiles):
 *   - the attention pass recognises each (one attention op with the
 *     variant's attrs, k and v at their own head count: no repeat left);
 *   - the interpreter's fused ops (attention, attention_lse and the
 *     gradients) against the unfused primitives nn.attention writes: loss,
 *     o and every gradient (1e-9);
 *   - the CPU backend's kernels (codegen/cattn.c) against the interpreter
 *     on the fused step graph, one thread and two, and no T x T tensor in
 *     the fused step;
 *   - nn.CausalSelfAttention's variants (tests/data/attn_csa.lua): the
 *     head layout and attention_dqkv with kvh, window and alibi, its dq and
 *     dk/dv kernels folded and apart (KILN_ATTN_FOLD=0), against the step
 *     without the attention pass;
 *   - attention written by hand the same way (tests/data/attn_handwritten
 *     .lua: its own k/v repeat, masks and slopes spelled differently) is
 *     fused too, and equals its unfused self;
 *   - the IR text of the variants' attrs round-trips, and bad ones are
 *     refused. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

static uint64_t rng = 7;
static double urand(void) { return test_urand(&rng); }

static const Op *find_op(const Graph *g, Opcode c)
{
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == c)
            return &g->ops.v[i];
    return NULL;
}

/* Random f32-representable values for g's inputs (params and w in [-1, 1)),
 * into val and host. */
static void fill_inputs(const Graph *g, double **val, float **host)
{
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        int64_t n = shape_numel(&x->s);
        val[t] = xmalloc(sizeof(double) * (size_t)n);
        host[t] = xmalloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            float f = (float)(2 * urand() - 1);
            val[t][i] = f;
            host[t][i] = f;
        }
    }
}

typedef struct {
    const char *sets[7];
    int nsets;
    int Hk, window, alibi, causal, T;
    int bias; /* IR_ATTN_BIAS / IR_ATTN_MASK (tests/data/attn_bias.lua); 0: none */
} Case;

static const Case cases[] = {
    {{"H=4", "Hk=2", "T=37"}, 3, 2, 0, 0, 1, 37, 0}, /* GQA */
    {{"H=3", "Hk=1", "T=70", "causal=0"}, 4, 1, 0, 0, 0, 70, 0}, /* MQA */
    {{"H=2", "Hk=2", "T=70", "window=5"}, 4, 2, 5, 0, 1, 70, 0}, /* window */
    {{"H=2", "Hk=2", "T=37", "window=40"}, 4, 2, 40, 0, 1, 37, 0}, /* window > T */
    {{"H=4", "Hk=4", "T=37", "alibi=1"}, 4, 4, 0, 1, 1, 37, 0}, /* ALiBi */
    {{"H=6", "Hk=6", "T=9", "alibi=1", "causal=0"}, 5, 6, 0, 1, 0, 9, 0}, /* H not 2^n */
    {{"H=6", "Hk=2", "T=70", "window=33", "alibi=1"}, 5, 2, 33, 1, 1, 70, 0}, /* all */
    {{"H=4", "Hk=2", "T=37", "B=3", "window=3"}, 5, 2, 3, 0, 1, 37, 0},
};

static void describe(const Case *c, char *buf, size_t n)
{
    int k = 0;
    for (int i = 0; i < c->nsets; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s ", c->sets[i]);
}

/* The attention pass's result for c: one attention op with c's attrs. */
static void check_fused_op(const Graph *g, const Case *c)
{
    const Op *at = find_op(g, OP_ATTENTION);
    assert_non_null(at);
    assert_int_equal(count_ops(g, OP_ATTENTION), 1);
    assert_int_equal(at->attr.ia[0], c->causal);
    assert_int_equal(ir_attn_window(&at->attr), c->window);
    assert_int_equal(ir_attn_alibi(&at->attr), c->alibi);
    assert_int_equal(g->t.v[at->in[1]].s.dim[1], c->Hk); /* k not repeated */
    assert_int_equal(g->t.v[at->in[2]].s.dim[1], c->Hk);
    assert_int_equal(count_ops(g, OP_MATMUL), 0);
    assert_int_equal(count_ops(g, OP_EXP), 0);
    assert_int_equal(ir_attn_bias(&at->attr), c->bias);
    if (c->bias) { /* read at its own shape: no broadcast to the scores */
        int bt = ir_attn_bias_in(at);
        assert_int_equal(g->t.v[bt].s.dtype, c->bias == IR_ATTN_MASK ? DT_U8 : DT_F32);
        assert_true(g->t.v[bt].op >= 0);
        assert_int_not_equal(g->ops.v[g->t.v[bt].op].code, OP_BROADCAST);
    }
}

/* The fused ops against the primitives of script `path` (with c's sets),
 * in the interpreter, after autodiff: loss, o and the gradients of q, k and
 * v; the attention pass makes one attention op with c's attrs. */
static void fused_vs_unfused(const char *path, const Case *c)
{
    char what[128];
    describe(c, what, sizeof what);
    Model *m = load_model(path, c->sets, c->nsets);
    Graph *g1 = ir_clone(m->g), *g2 = ir_clone(m->g);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    o.attention = true;
    assert_true(pass_attention(g2, &o, &d));
    check_fused_op(g2, c);
    if (!pass_autodiff(g1, &o, &d) || !pass_autodiff(g2, &o, &d))
        fail_msg("autodiff: %s", d.msg);
    char err[1024];
    if (!ir_verify(g2, err, sizeof err))
        fail_msg("%s: verify: %s", what, err);
    double **v1 = ir_interp_alloc(g1), **v2 = ir_interp_alloc(g2);
    float **h = xcalloc((size_t)g1->t.n, sizeof(float *));
    fill_inputs(g1, v1, h);
    for (int t = 0; t < g1->t.n; t++)
        if (g1->t.v[t].op < 0) {
            int u = g1->t.v[t].name ? ir_find_tensor(g2, g1->t.v[t].name) : -1;
            assert_true(u >= 0);
            int64_t n = shape_numel(&g1->t.v[t].s);
            v2[u] = xmalloc(sizeof(double) * (size_t)n);
            memcpy(v2[u], v1[t], sizeof(double) * (size_t)n);
            free(h[t]);
        }
    free(h);
    ir_interp(g1, v1, NULL);
    ir_interp(g2, v2, NULL);
    static const char *const outs[] = {"loss", "o", "grad.q", "grad.k", "grad.v"};
    for (int x = 0; x < 5; x++) {
        int t1 = ir_find_output(g1, outs[x]), t2 = ir_find_output(g2, outs[x]);
        assert_true(t1 >= 0 && t2 >= 0);
        double re = rel_err_min1(v2[t2], v1[t1], shape_numel(&g1->t.v[t1].s));
        if (!(re <= 1e-9))
            fail_msg("%s %s: %s relative error %g (fused against unfused)", path, what, outs[x],
                     re);
    }
    ir_interp_free(g1, v1);
    ir_interp_free(g2, v2);
    ir_free(g1);
    ir_free(g2);
    fe_model_free(m);
}

static void test_interp_fused_vs_unfused(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fused_vs_unfused("tests/data/attn_variants.lua", &cases[i]);
}

/* Attention written by hand (tests/data/attn_handwritten.lua): its own
 * k/v repeat, the causal mask as a drop select, the window as j - i > -w,
 * ALiBi's slopes as a power of 2. */
static void test_handwritten(void **state)
{
    (void)state;
    static const Case hw[] = {
        {{"H=4", "Hk=2", "window=6", "alibi=1"}, 4, 2, 6, 1, 1, 37, 0},
        {{"H=6", "Hk=3", "window=1", "alibi=0"}, 4, 3, 1, 0, 1, 37, 0},
        {{"H=2", "Hk=1", "window=50", "alibi=1", "T=9"}, 5, 1, 50, 1, 1, 9, 0},
    };
    for (size_t i = 0; i < sizeof hw / sizeof hw[0]; i++)
        fused_vs_unfused("tests/data/attn_handwritten.lua", &hw[i]);
}

/* loss and the gradients of q, k, v of script attn_variants.lua with sets
 * (autodiff, with the attention pass when `fuse`) in the interpreter, on
 * fixed inputs; *nattn gets the attention ops. Caller frees. */
static double *eval_sets(const char *const *sets, int nsets, bool fuse, int *nattn, int64_t *n)
{
    Model *m = load_model("tests/data/attn_variants.lua", sets, nsets);
    Graph *g = ir_clone(m->g);
    PassOpts o;
    pass_opts_default(&o);
    o.attention = fuse;
    Diag d = {{0}};
    if (!pass_attention(g, &o, &d) || !pass_autodiff(g, &o, &d))
        fail_msg("passes: %s", d.msg);
    *nattn = count_ops(g, OP_ATTENTION);
    double **val = ir_interp_alloc(g);
    float **h = xcalloc((size_t)g->t.n, sizeof(float *));
    rng = 7;
    fill_inputs(g, val, h);
    ir_interp(g, val, NULL);
    static const char *const outs[] = {"loss", "grad.q", "grad.k", "grad.v"};
    double *r = NULL;
    *n = 0;
    for (int x = 0; x < 4; x++) {
        int t = ir_find_output(g, outs[x]);
        assert_true(t >= 0);
        int64_t k = shape_numel(&g->t.v[t].s);
        r = xrealloc(r, sizeof(double) * (size_t)(*n + k));
        memcpy(r + *n, val[t], sizeof(double) * (size_t)k);
        *n += k;
    }
    for (int t = 0; t < g->t.n; t++)
        free(h[t]);
    free(h);
    ir_interp_free(g, val);
    ir_free(g);
    fe_model_free(m);
    return r;
}

/* nn.attention's bias and mask: the causal mask given as a bias of 0 /
 * -1e9 gives the causal attention's loss and gradients, unfused and fused
 * (an attention op with the bias); given as the mask tensor
 * nn.causal_mask(T) it is the causal mask itself, which the pass fuses. */
static void test_bias_mask(void **state)
{
    (void)state;
    const char *causal[] = {"T=37", "via=none"}, *bias[] = {"T=37", "via=bias"},
               *mask[] = {"T=37", "via=mask"};
    int na;
    int64_t n0, n1;
    double *r0 = eval_sets(causal, 2, false, &na, &n0);
    double *r1 = eval_sets(bias, 2, false, &na, &n1);
    assert_int_equal(n0, n1);
    double re = rel_err_min1(r1, r0, n0);
    if (!(re <= 1e-12))
        fail_msg("bias = causal mask: relative error %g against causal", re);
    free(r1);
    r1 = eval_sets(bias, 2, true, &na, &n1);
    assert_int_equal(na, 1);
    re = rel_err_min1(r1, r0, n0);
    if (!(re <= 1e-9))
        fail_msg("bias = causal mask, fused: relative error %g against causal", re);
    free(r1);
    r1 = eval_sets(mask, 2, true, &na, &n1);
    assert_int_equal(na, 1);
    re = rel_err_min1(r1, r0, n0);
    if (!(re <= 1e-9))
        fail_msg("mask = causal mask, fused: relative error %g against causal", re);
    free(r0);
    free(r1);
}

/* The whole fused step on the CPU backend against the interpreter on the
 * same graph (every f32 output: loss, o, the gradients, grad_norm), with
 * `threads`. */
static void backend_vs_interp(Graph *g, int threads, const char *what)
{
    double **val = ir_interp_alloc(g);
    float **host = xcalloc((size_t)g->t.n, sizeof(float *));
    fill_inputs(g, val, host);
    Diag d = {{0}};
    ExecOpts eo = {.threads = threads};
    Exec *e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("%s: rt_exec_create: %s", what, d.msg);
    for (int t = 0; t < g->t.n; t++)
        if (host[t])
            rt_exec_write(e, t, host[t]);
    ir_interp(g, val, NULL);
    if (!rt_exec_run(e, 1, 0, &d))
        fail_msg("%s: rt_exec_run: %s", what, d.msg);
    int checked = 0;
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
        /* the loss, a sum of terms of both signs, cancels: o and the
         * gradients carry the check, the loss only a loose one */
        double tol = strcmp(g->outs.v[k].name, "loss") == 0 ? 1e-3 : 2e-5;
        if (!(re <= tol))
            fail_msg("%s (%d threads): output %s relative error %g", what, threads,
                     g->outs.v[k].name, re);
        checked++;
        free(buf);
        free(got);
    }
    assert_true(checked >= 5);
    rt_exec_destroy(e);
    for (int t = 0; t < g->t.n; t++)
        free(host[t]);
    free(host);
    ir_interp_free(g, val);
}

/* Script `path` with c's sets through the CPU backend's whole pipeline:
 * one attention op, no T x T tensor of the scores' size (B*H*T*T: only a
 * bias input of that shape may have it), the step against the
 * interpreter on one thread and two. */
static void backend_case(const char *path, const Case *c)
{
    char what[160];
    describe(c, what, sizeof what);
    Model *m = load_model(path, c->sets, c->nsets);
    Graph *g = ir_clone(m->g);
    RtGraphFlags gf = {.memory_budget = -1};
    PassOpts po;
    rt_pass_opts(&m->train, &gf, &po);
    assert_true(po.attention);
    Diag d = {{0}};
    if (!pass_pipeline(g, &po, NULL, NULL, NULL, &d))
        fail_msg("%s: pipeline: %s", what, d.msg);
    assert_true(count_ops(g, OP_ATTENTION) == 1);
    int64_t scores = 0;
    const Op *at = find_op(g, OP_ATTENTION);
    const Shape *qs = &g->t.v[at->in[0]].s;
    scores = shape_numel(qs) / qs->dim[qs->rank - 1] * c->T;
    /* the tensors computed from q, k, v (params): none of the scores' size
     * (a bias of that size, the user's, depends on none of them) */
    bool *dep = xcalloc((size_t)g->t.n, sizeof(bool));
    for (int t = 0; t < g->t.n; t++)
        dep[t] = g->t.v[t].kind == TK_PARAM;
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            dep[g->ops.v[i].out] = dep[g->ops.v[i].out] || dep[g->ops.v[i].in[j]];
    for (int t = 0; t < g->t.n; t++) {
        const Shape *s = &g->t.v[t].s;
        if (c->bias ? dep[t] && shape_numel(s) >= scores
                    : s->rank >= 2 && s->dim[s->rank - 1] == c->T && s->dim[s->rank - 2] == c->T)
            fail_msg("%s: a T x T tensor %%%d", what, t);
    }
    free(dep);
    backend_vs_interp(g, 1, what);
    backend_vs_interp(g, 2, what);
    ir_free(g);
    fe_model_free(m);
}

static void test_backend(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        backend_case("tests/data/attn_variants.lua", &cases[i]);
}

/* nn.attention's bias and mask tensors (tests/data/attn_bias.lua), fused:
 * shapes [T,T], [H,T,T], [B,1,T,T], [B,1,1,T] (key padding) and
 * [B,H,T,T], with and without the causal mask, a window, ALiBi; T = 37,
 * 70 and 150 (not multiples of the tiles), one key tile to three; masks
 * that drop whole tiles (the C kernels skip them). */
static const Case bias_cases[] = {
    {{"kind=bias", "bshape=TT", "T=37"}, 3, 3, 0, 0, 1, 37, IR_ATTN_BIAS},
    {{"kind=bias", "bshape=HTT", "T=70", "causal=0"}, 4, 3, 0, 0, 0, 70, IR_ATTN_BIAS},
    {{"kind=bias", "bshape=B1TT", "T=70", "alibi=1"}, 4, 3, 0, 1, 1, 70, IR_ATTN_BIAS},
    {{"kind=bias", "bshape=B11T", "T=37", "causal=0"}, 4, 3, 0, 0, 0, 37, IR_ATTN_BIAS},
    {{"kind=bias", "bshape=BHTT", "T=70", "window=9"}, 4, 3, 9, 0, 1, 70, IR_ATTN_BIAS},
    {{"kind=mask", "bshape=TT", "T=70", "causal=0"}, 4, 3, 0, 0, 0, 70, IR_ATTN_MASK},
    {{"kind=mask", "bshape=HTT", "T=37"}, 3, 3, 0, 0, 1, 37, IR_ATTN_MASK},
    {{"kind=mask", "bshape=B1TT", "T=70", "window=40", "alibi=1"}, 5, 3, 40, 1, 1, 70,
     IR_ATTN_MASK},
    {{"kind=mask", "bshape=B11T", "T=70", "causal=0"}, 4, 3, 0, 0, 0, 70, IR_ATTN_MASK},
    /* key padding past key 40 of 150: the kernels skip the key tiles (and,
     * in dk/dv, the key tiles' query walks) the mask drops whole */
    {{"kind=mask", "bshape=B11T", "T=150", "causal=0", "pad=40"}, 5, 3, 0, 0, 0, 150,
     IR_ATTN_MASK},
    {{"kind=mask", "bshape=HTT", "T=150", "pad=20"}, 4, 3, 0, 0, 1, 150, IR_ATTN_MASK},
};

static void test_bias_interp(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bias_cases / sizeof bias_cases[0]; i++)
        fused_vs_unfused("tests/data/attn_bias.lua", &bias_cases[i]);
}

static void test_bias_backend(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bias_cases / sizeof bias_cases[0]; i++)
        backend_case("tests/data/attn_bias.lua", &bias_cases[i]);
}

/* A bias that needs a gradient (a param) stays unfused, and the attention
 * pass's dump says so; the step still trains it (grad.bias exists). */
static void test_bias_learned(void **state)
{
    (void)state;
    const char *sets[] = {"kind=learned", "bshape=HTT"};
    Model *m = load_model("tests/data/attn_bias.lua", sets, 2);
    Graph *g = ir_clone(m->g);
    PassOpts o;
    pass_opts_default(&o);
    o.attention = true;
    Diag d = {{0}};
    assert_true(pass_attention(g, &o, &d));
    assert_int_equal(count_ops(g, OP_ATTENTION), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    pass_dump("attention", g, NULL, f);
    fclose(f);
    if (!strstr(buf, "not fused: its additive bias depends on a param"))
        fail_msg("attention dump lacks the reason:\n%s", buf);
    free(buf);
    assert_true(pass_autodiff(g, &o, &d));
    assert_true(ir_find_output(g, "grad.bias") >= 0);
    ir_free(g);
    /* the fused ones say which variant they are */
    const char *s2[] = {"kind=mask", "bshape=B11T", "window=4"};
    fe_model_free(m);
    m = load_model("tests/data/attn_bias.lua", s2, 3);
    g = ir_clone(m->g);
    assert_true(pass_attention(g, &o, &d));
    f = open_memstream(&buf, &len);
    pass_dump("attention", g, NULL, f);
    fclose(f);
    if (!strstr(buf, "fused, causal, window 4, mask %") || !strstr(buf, "u8[2,1,1,37]") ||
        !strstr(buf, "{causal=1,scale=0.25,window=4,mask=1}"))
        fail_msg("attention dump:\n%s", buf);
    free(buf);
    ir_free(g);
    fe_model_free(m);
}

/* nn.CausalSelfAttention with the variants: the step with the attention
 * pass (head layout, attention_dqkv with kvh, folded or not) against the
 * step without it, on the CPU backend: every gradient to 1e-5; a
 * key-padding mask too (the head layout reads it as [B, 1, 1, T]). */
/* test_csa_on_off's look at each graph with the pass on: the head
 * layout's one dqkv op, the variant (arg: the case's --set values) kept. */
static void csa_check(const Graph *g, int on, void *arg)
{
    const char *const *sets = arg;
    if (!on)
        return;
    const Op *dqkv = find_op(g, OP_ATTENTION_DQKV);
    assert_non_null(dqkv);
    assert_true(ir_attn_heads(&dqkv->attr));
    assert_int_equal(ir_attn_kvh(&dqkv->attr), atoi(sets[0] + 9));
    assert_int_equal(ir_attn_window(&dqkv->attr), atoi(sets[3] + 7));
    assert_int_equal(ir_attn_alibi(&dqkv->attr), atoi(sets[4] + 6));
    assert_int_equal(ir_attn_bias(&dqkv->attr), atoi(sets[5] + 5) ? IR_ATTN_MASK : 0);
}

static void test_csa_on_off(void **state)
{
    (void)state;
    static const char *const sets[][6] = {
        {"kv_heads=2", "B=2", "T=37", "window=0", "alibi=0", "mask=0"},
        {"kv_heads=1", "B=4", "T=70", "window=9", "alibi=0", "mask=0"},
        {"kv_heads=2", "B=5", "T=37", "window=0", "alibi=1", "mask=0"},
        {"kv_heads=4", "B=1", "T=70", "window=33", "alibi=1", "mask=0"},
        {"kv_heads=2", "B=4", "T=70", "window=2", "alibi=1", "mask=0"},
        {"kv_heads=4", "B=4", "T=70", "window=0", "alibi=0", "mask=1"}, /* 16 items: folded */
        {"kv_heads=2", "B=3", "T=37", "window=5", "alibi=1", "mask=1"},
    };
    for (int fold = 1; fold >= 0; fold--) {
        if (!fold)
            setenv("KILN_ATTN_FOLD", "0", 1);
        for (size_t c = 0; c < sizeof sets / sizeof sets[0]; c++) {
            Model *m = load_model("tests/data/attn_csa.lua", sets[c], 6);
            char what[128];
            snprintf(what, sizeof what, "%s %s %s fold=%d", sets[c][0], sets[c][1], sets[c][3],
                     fold);
            /* c_attn and c_proj weight and bias */
            assert_int_equal(attn_on_off_compare(m, false, 1e-5, csa_check, (void *)sets[c], what),
                             4);
            fe_model_free(m);
        }
    }
    unsetenv("KILN_ATTN_FOLD");
}

/* The attrs' text form: printed, parsed back, printed the same; bad values
 * refused with the op's name. */
static void test_text(void **state)
{
    (void)state;
    const char *ok =
        "kiln-ir v1\n"
        "%q:f32[2,4,5,8] = input \"q\"\n"
        "%k:f32[2,2,5,8] = input \"k\"\n"
        "%v:f32[2,2,5,8] = input \"v\"\n"
        "%o:f32[2,4,5,8] = attention %q, %k, %v {causal=1,scale=0.5,window=3,alibi=1}\n"
        "%x:f32[2,5,32] = input \"x\"\n"
        "%p:f32[2,5,16] = attention %x, %x, %x "
        "{causal=1,scale=0.5,heads=2,hd=8,qoff=0,koff=16,voff=24,kvh=1,window=2}\n"
        "output \"o\" %o\noutput \"p\" %p\n";
    Graph *g = parse_or_fail(ok);
    const Op *at = find_op(g, OP_ATTENTION);
    assert_int_equal(ir_attn_window(&at->attr), 3);
    assert_true(ir_attn_alibi(&at->attr));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ir_print(g, f);
    fclose(f);
    assert_non_null(strstr(buf, "{causal=1,scale=0.5,window=3,alibi=1}"));
    assert_non_null(strstr(buf, "voff=24,kvh=1,window=2}"));
    Graph *g2 = parse_or_fail(buf);
    char *buf2 = NULL;
    f = open_memstream(&buf2, &len);
    ir_print(g2, f);
    fclose(f);
    assert_string_equal(buf, buf2);
    free(buf);
    free(buf2);
    ir_free(g);
    ir_free(g2);
    static const char *const bad[][2] = {
        {"{causal=0,scale=0.5,window=3}", "window needs causal=1"},
        {"{causal=1,scale=0.5,alibi=2}", "alibi 0 or 1"},
        {"{causal=1,scale=0.5,kvh=2}", "kvh needs the head layout"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "kiln-ir v1\n%%q:f32[2,4,5,8] = input \"q\"\n%%k:f32[2,2,5,8] = input \"k\"\n"
                 "%%o:f32[2,4,5,8] = attention %%q, %%k, %%k %s\noutput \"o\" %%o\n",
                 bad[i][0]);
        char msg[512] = "";
        Graph *gb = ir_parse(text, "bad.ir", msg, sizeof msg);
        if (gb)
            fail_msg("%s parsed", bad[i][0]);
        if (!strstr(msg, bad[i][1]))
            fail_msg("%s: message '%s' lacks '%s'", bad[i][0], msg, bad[i][1]);
    }
    /* a bias and a mask: the last operand, printed and parsed back; a
     * shape that does not fit the scores, or a mask that is not u8, refused */
    const char *bm =
        "kiln-ir v1\n"
        "%q:f32[2,4,5,8] = input \"q\"\n"
        "%b:f32[4,5,5] = input \"b\"\n"
        "%m:u8[2,1,1,5] = input \"m\"\n"
        "%o:f32[2,4,5,8] = attention %q, %q, %q, %b {causal=1,scale=0.5,bias=1}\n"
        "%l:f32[2,4,5,1] = attention_lse %q, %q, %m {causal=0,scale=0.5,window=0,mask=1}\n"
        "output \"o\" %o\noutput \"l\" %l\n";
    g = parse_or_fail(bm);
    f = open_memstream(&buf, &len);
    ir_print(g, f);
    fclose(f);
    if (!strstr(buf, "attention %q, %q, %q, %b {causal=1,scale=0.5,bias=1}") &&
        !strstr(buf, "{causal=1,scale=0.5,bias=1}"))
        fail_msg("printed:\n%s", buf);
    assert_non_null(strstr(buf, "{causal=0,scale=0.5,mask=1}"));
    g2 = parse_or_fail(buf);
    f = open_memstream(&buf2, &len);
    ir_print(g2, f);
    fclose(f);
    assert_string_equal(buf, buf2);
    free(buf);
    free(buf2);
    ir_free(g);
    ir_free(g2);
    static const char *const badb[][3] = {
        {"f32[4,5,6]", "bias=1", "broadcastable to the scores"},
        {"f32[2,4,5,5]", "mask=1", "a u8 tensor"},
        {"f32[2,1,4,1,5]", "bias=1", "broadcastable to the scores"},
        {"f32[5,5]", "bias=1,mask=1", "not both"},
    };
    for (size_t i = 0; i < sizeof badb / sizeof badb[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "kiln-ir v1\n%%q:f32[2,4,5,8] = input \"q\"\n%%b:%s = input \"b\"\n"
                 "%%o:f32[2,4,5,8] = attention %%q, %%q, %%q, %%b {causal=1,scale=0.5,%s}\n"
                 "output \"o\" %%o\n",
                 badb[i][0], badb[i][1]);
        char msg[512] = "";
        Graph *gb = ir_parse(text, "bad.ir", msg, sizeof msg);
        if (gb)
            fail_msg("%s %s parsed", badb[i][0], badb[i][1]);
        if (!strstr(msg, badb[i][2]))
            fail_msg("%s: message '%s' lacks '%s'", badb[i][0], msg, badb[i][2]);
    }
    /* k's heads must divide q's */
    char msg[512] = "";
    Graph *gb = ir_parse("kiln-ir v1\n%q:f32[2,4,5,8] = input \"q\"\n"
                         "%k:f32[2,3,5,8] = input \"k\"\n"
                         "%o:f32[2,4,5,8] = attention %q, %k, %k {causal=1,scale=0.5}\n"
                         "output \"o\" %o\n",
                         "bad.ir", msg, sizeof msg);
    assert_null(gb);
    if (!strstr(msg, "batch dimensions differ"))
        fail_msg("message '%s'", msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_interp_fused_vs_unfused),
        cmocka_unit_test(test_handwritten),
        cmocka_unit_test(test_bias_mask),
        cmocka_unit_test(test_backend),
        cmocka_unit_test(test_bias_interp),
        cmocka_unit_test(test_bias_backend),
        cmocka_unit_test(test_bias_learned),
        cmocka_unit_test(test_csa_on_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
