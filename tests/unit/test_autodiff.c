/* test_autodiff.c - pass_autodiff beyond IR text in and out: the planned
 * memory of slice backward on an unrolled RNN and a deep chain in linear
 * time. The IR-in, IR-out cases (backward ops, their source locations, the
 * grad outputs, the pass's user errors) are tests/passes/autodiff_*.ir;
 * numerical correctness of every VJP rule is test_gradcheck.c's job. */
#include "testutil.h"

#include "passes.h"
#include "runtime.h"
#include "train.h"

#include <stdlib.h>
#include <string.h>

/* The graph of IR text `in` after pass_autodiff, verified. */
static Graph *autodiff_or_fail(const char *in)
{
    Graph *g = parse_or_fail(in);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    if (!pass_autodiff(g, &o, &d))
        fail_msg("autodiff failed: %s", d.msg);
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("invalid after autodiff: %s", err);
    return g;
}

/* 100 one-row slices of x, read in reverse (an RNN unrolled past 64 steps):
 * their cotangents meet in one backward concat of 100 operands, which is
 * grad.x itself (no tree of concats: concat takes any count). */
static void test_slices_concat_many(void **state)
{
    (void)state;
    enum { N = 100 };
    size_t cap = 64 * (size_t)N + 256, n = 0;
    char *ir = xmalloc(cap);
    n += (size_t)snprintf(ir + n, cap - n, "kiln-ir v1\n%%0:f32[%d,3] = param \"x\" zeros\n", N);
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(ir + n, cap - n, "%%%d:f32[1,3] = slice %%0 {start=[%d,0]}\n",
                              i + 1, N - 1 - i);
    n += (size_t)snprintf(ir + n, cap - n, "%%%d:f32[%d,3] = concat", N + 1, N);
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(ir + n, cap - n, "%s %%%d", i ? "," : "", i + 1);
    snprintf(ir + n, cap - n,
             " {axis=0}\n%%%d:f32[1,1] = reduce_sum %%%d {axes=[0,1]}\n"
             "%%%d:f32[] = reshape %%%d\noutput \"loss\" %%%d\n",
             N + 2, N + 1, N + 3, N + 2, N + 3);
    Graph *g = autodiff_or_fail(ir);
    free(ir);
    int concats = 0, grad = -1;
    for (int i = 0; i < g->outs.n; i++)
        if (strcmp(g->outs.v[i].name, "grad.x") == 0)
            grad = g->outs.v[i].t;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code != OP_CONCAT || !(op->flags & OPF_BACKWARD))
            continue;
        concats++;
        assert_int_equal(op->nin, N);
        assert_int_equal(op->out, grad);
    }
    assert_int_equal(concats, 1);
    ir_free(g);
}

/* The planned peak of tests/data/gru_slices.lua (a GRU unrolled by slicing
 * one [B,T,3H] projection per step) compiled with T steps. */
static int64_t gru_peak(int T)
{
    char set[32];
    snprintf(set, sizeof set, "T=%d", T);
    const char *sets[1] = {set};
    Model *m = load_model("tests/data/gru_slices.lua", sets, 1);
    PassOpts po;
    rt_pass_opts(&m->train, NULL, &po);
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("gru_slices.lua T=%d: %s", T, d.msg);
    MemPlan *mp = pass_memplan(m->g, &d);
    assert_non_null(mp);
    int64_t peak = mp->arena_bytes;
    pass_memplan_free(mp);
    fe_model_free(m);
    return peak;
}

/* Slice backward keeps memory linear in the number of slices (issue 13, item
 * 14): 4x the steps may at most quadruple the planned peak. When every
 * step's cotangent was padded to [B,T,3H] the peak grew with T^2: 1.09 MiB
 * at T = 32, 13.0 MiB at T = 128 (12x); now 0.75 and 2.54 MiB. */
static void test_slice_memory_linear(void **state)
{
    (void)state;
    int64_t p32 = gru_peak(32), p128 = gru_peak(128);
    print_message("gru_slices.lua planned peak: T=32 %lld bytes, T=128 %lld bytes (%.2fx)\n",
                  (long long)p32, (long long)p128, (double)p128 / (double)p32);
    assert_true(p128 <= 4 * p32);
}

/* A deep chain (tens of thousands of ops) differentiates in linear time and
 * gives a valid graph with one gradient per param. */
static void test_large_graph(void **state)
{
    (void)state;
    Graph *g = ir_new();
    ParamInit none = {0};
    int64_t d2[2] = {16, 32}, dw[2] = {32, 32};
    int x = ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 2, d2), none);
    SrcLoc loc = {intern("big.lua"), 1};
    int h = x, nparam = 0;
    for (int l = 0; l < 2000; l++) {
        char name[32];
        snprintf(name, sizeof name, "w%d", l);
        int w = ir_add_input(g, TK_PARAM, name, shape_make(DT_F32, 2, dw), none);
        nparam++;
        OpAttr mm = {.nia = 2};
        int in[2] = {h, w};
        int y = ir_op_x(g, OP_MATMUL, in, 2, &mm, loc);
        int t = ir_op_x(g, OP_TANH, &y, 1, NULL, loc);
        int in2[2] = {t, h};
        int s = ir_op_x(g, OP_ADD, in2, 2, NULL, loc);
        h = ir_op_x(g, OP_RELU, &s, 1, NULL, loc);
    }
    OpAttr all = {.nia = 2, .ia = {0, 1}};
    int r = ir_op_x(g, OP_REDUCE_SUM, &h, 1, &all, loc);
    OpAttr sc = {.rank = 0};
    ir_add_output(g, "loss", ir_op_x(g, OP_RESHAPE, &r, 1, &sc, loc));
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    assert_true(pass_autodiff(g, &o, &d));
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("invalid after autodiff: %s", err);
    assert_int_equal(g->outs.n, 1 + nparam);
    assert_true(g->ops.n > 8000 * 2);
    ir_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_concat_many),
        cmocka_unit_test(test_slice_memory_linear),
        cmocka_unit_test(test_large_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
