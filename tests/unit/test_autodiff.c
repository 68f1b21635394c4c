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
        cmocka_unit_test(test_slice_memory_linear),
        cmocka_unit_test(test_large_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
