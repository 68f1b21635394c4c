/* test_autodiff.c - pass_autodiff on small graphs: IR text in, expected IR
 * text out (the backward ops, their source locations and the grad outputs),
 * the pass's user errors, and the planned memory of slice backward on an
 * unrolled RNN. Numerical correctness of every VJP rule is test_gradcheck.c's
 * job. */
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

static void expect_autodiff(const char *in, const char *want)
{
    Graph *g = autodiff_or_fail(in);
    char *got = ir_print_str(g);
    if (strcmp(got, want) != 0) {
        print_error("got:\n%s\nexpected:\n%s\n", got, want);
        fail_msg("autodiff output differs");
    }
    free(got);
    ir_free(g);
}

static void expect_error(const char *in, const char *msg)
{
    Graph *g = parse_or_fail(in);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    assert_false(pass_autodiff(g, &o, &d));
    assert_string_equal(d.msg, msg);
    ir_free(g);
}

/* loss = sum(x * w): the seed 1 broadcast back over the reduction, times x. */
static void test_mul_reduce(void **state)
{
    (void)state;
    expect_autodiff(
        "kiln-ir v1\n"
        "%0:f32[4,3] = input \"x\"\n"
        "%1:f32[4,3] = param \"w\" zeros\n"
        "%2:f32[4,3] = mul %0, %1   # m.lua:3\n"
        "%3:f32[1,1] = reduce_sum %2 {axes=[0,1]}   # m.lua:4\n"
        "%4:f32[] = reshape %3   # m.lua:4\n"
        "output \"loss\" %4\n",
        "kiln-ir v1\n"
        "%0:f32[4,3] = input \"x\"\n"
        "%1:f32[4,3] = param \"w\" zeros\n"
        "%2:f32[4,3] = mul %0, %1   # m.lua:3\n"
        "%3:f32[1,1] = reduce_sum %2 {axes=[0,1]}   # m.lua:4\n"
        "%4:f32[] = reshape %3   # m.lua:4\n"
        "%5:f32[] = const {value=1} !backward   # m.lua:4\n"
        "%6:f32[1,1] = reshape %5 !backward   # m.lua:4\n"
        "%7:f32[4,3] = broadcast %6 !backward   # m.lua:4\n"
        "%8:f32[4,3] = mul %7, %0 !backward   # m.lua:3\n"
        "output \"loss\" %4\n"
        "output \"grad.w\" %8\n");
}

/* w feeds three uses (mul w,w twice and add): cotangents are summed with add.
 * exp(x) does not lead to a param: no backward ops for it. An unused param
 * gets zeros; a bf16 param's gradient is cast back to bf16. */
static void test_accumulate_unused_cast(void **state)
{
    (void)state;
    expect_autodiff(
        "kiln-ir v1\n"
        "%0:f32[3] = input \"x\"\n"
        "%1:f32[3] = param \"w\" zeros\n"
        "%2:f32[3] = param \"unused\" zeros\n"
        "%3:bf16[3] = param \"h\" zeros\n"
        "%4:f32[3] = mul %1, %1   # m.lua:1\n"
        "%5:f32[3] = exp %0   # m.lua:2\n"
        "%6:f32[3] = add %4, %5   # m.lua:3\n"
        "%7:f32[3] = add %6, %1   # m.lua:4\n"
        "%8:f32[3] = cast %3   # m.lua:5\n"
        "%9:f32[3] = mul %7, %8   # m.lua:6\n"
        "%10:f32[1] = reduce_sum %9 {axes=[0]}   # m.lua:7\n"
        "%11:f32[] = reshape %10   # m.lua:7\n"
        "output \"loss\" %11\n",
        "kiln-ir v1\n"
        "%0:f32[3] = input \"x\"\n"
        "%1:f32[3] = param \"w\" zeros\n"
        "%2:f32[3] = param \"unused\" zeros\n"
        "%3:bf16[3] = param \"h\" zeros\n"
        "%4:f32[3] = mul %1, %1   # m.lua:1\n"
        "%5:f32[3] = exp %0   # m.lua:2\n"
        "%6:f32[3] = add %4, %5   # m.lua:3\n"
        "%7:f32[3] = add %6, %1   # m.lua:4\n"
        "%8:f32[3] = cast %3   # m.lua:5\n"
        "%9:f32[3] = mul %7, %8   # m.lua:6\n"
        "%10:f32[1] = reduce_sum %9 {axes=[0]}   # m.lua:7\n"
        "%11:f32[] = reshape %10   # m.lua:7\n"
        "%12:f32[] = const {value=1} !backward   # m.lua:7\n"
        "%13:f32[1] = reshape %12 !backward   # m.lua:7\n"
        "%14:f32[3] = broadcast %13 !backward   # m.lua:7\n"
        "%15:f32[3] = mul %14, %8 !backward   # m.lua:6\n"
        "%16:f32[3] = mul %14, %7 !backward   # m.lua:6\n"
        "%17:bf16[3] = cast %16 !backward   # m.lua:5\n"
        "%18:f32[3] = mul %15, %1 !backward   # m.lua:1\n"
        "%19:f32[3] = add %15, %18 !backward   # m.lua:1\n"
        "%20:f32[3] = mul %15, %1 !backward   # m.lua:1\n"
        "%21:f32[3] = add %19, %20 !backward   # m.lua:1\n"
        "%22:f32[] = const {value=0} !backward\n"
        "%23:f32[3] = broadcast %22 !backward\n"
        "output \"loss\" %11\n"
        "output \"grad.w\" %21\n"
        "output \"grad.unused\" %23\n"
        "output \"grad.h\" %17\n");
}

/* matmul with a shared rank-2 weight: its gradient folds the batch into the
 * rows; broadcast's gradient sums over the broadcast axes; relu masks with
 * gt; reduce_max routes the cotangent to the elements equal to the max. */
static void test_matmul_bias_relu_max(void **state)
{
    (void)state;
    expect_autodiff(
        "kiln-ir v1\n"
        "%0:f32[2,4,3] = input \"x\"\n"
        "%1:f32[3,5] = param \"w\" zeros\n"
        "%2:f32[5] = param \"b\" zeros\n"
        "%3:f32[2,4,5] = matmul %0, %1 {ta=0,tb=0}   # m.lua:1\n"
        "%4:f32[2,4,5] = broadcast %2   # m.lua:2\n"
        "%5:f32[2,4,5] = add %3, %4   # m.lua:2\n"
        "%6:f32[2,4,5] = relu %5   # m.lua:3\n"
        "%7:f32[1,1,1] = reduce_max %6 {axes=[0,1,2]}   # m.lua:4\n"
        "%8:f32[] = reshape %7   # m.lua:4\n"
        "output \"loss\" %8\n",
        "kiln-ir v1\n"
        "%0:f32[2,4,3] = input \"x\"\n"
        "%1:f32[3,5] = param \"w\" zeros\n"
        "%2:f32[5] = param \"b\" zeros\n"
        "%3:f32[2,4,5] = matmul %0, %1 {ta=0,tb=0}   # m.lua:1\n"
        "%4:f32[2,4,5] = broadcast %2   # m.lua:2\n"
        "%5:f32[2,4,5] = add %3, %4   # m.lua:2\n"
        "%6:f32[2,4,5] = relu %5   # m.lua:3\n"
        "%7:f32[1,1,1] = reduce_max %6 {axes=[0,1,2]}   # m.lua:4\n"
        "%8:f32[] = reshape %7   # m.lua:4\n"
        "%9:f32[] = const {value=1} !backward   # m.lua:4\n"
        "%10:f32[1,1,1] = reshape %9 !backward   # m.lua:4\n"
        "%11:f32[2,4,5] = broadcast %7 !backward   # m.lua:4\n"
        "%12:u8[2,4,5] = eq %6, %11 !backward   # m.lua:4\n"
        "%13:f32[2,4,5] = cast %12 !backward   # m.lua:4\n"
        "%14:f32[1,1,1] = reduce_sum %13 {axes=[0,1,2]} !backward   # m.lua:4\n"
        "%15:f32[1,1,1] = div %10, %14 !backward   # m.lua:4\n"
        "%16:f32[2,4,5] = broadcast %15 !backward   # m.lua:4\n"
        "%17:f32[] = const {value=0} !backward   # m.lua:4\n"
        "%18:f32[2,4,5] = broadcast %17 !backward   # m.lua:4\n"
        "%19:f32[2,4,5] = select %12, %16, %18 !backward   # m.lua:4\n"
        "%20:f32[] = const {value=0} !backward   # m.lua:3\n"
        "%21:f32[2,4,5] = broadcast %20 !backward   # m.lua:3\n"
        "%22:u8[2,4,5] = gt %5, %21 !backward   # m.lua:3\n"
        "%23:f32[2,4,5] = select %22, %19, %21 !backward   # m.lua:3\n"
        "%24:f32[1,1,5] = reduce_sum %23 {axes=[0,1]} !backward   # m.lua:2\n"
        "%25:f32[5] = reshape %24 !backward   # m.lua:2\n"
        "%26:f32[8,3] = reshape %0 !backward   # m.lua:1\n"
        "%27:f32[8,5] = reshape %23 !backward   # m.lua:1\n"
        "%28:f32[3,5] = matmul %26, %27 {ta=1,tb=0} !backward   # m.lua:1\n"
        "output \"loss\" %8\n"
        "output \"grad.w\" %28\n"
        "output \"grad.b\" %25\n");
}

/* Two slices of x along axis 0, [2,4) and [0,1), seen last first: their
 * cotangents are not padded to x's shape and added; one concat puts them
 * side by side in window order, zeros in the gap [1,2), and a pad fills the
 * rest, [4,5). */
static void test_slices_concat(void **state)
{
    (void)state;
    expect_autodiff(
        "kiln-ir v1\n"
        "%0:f32[5,3] = param \"x\" zeros\n"
        "%1:f32[2,3] = slice %0 {start=[2,0]}   # m.lua:1\n"
        "%2:f32[1,3] = slice %0 {start=[0,0]}   # m.lua:2\n"
        "%3:f32[3,3] = concat %1, %2 {axis=0}   # m.lua:3\n"
        "%4:f32[1,1] = reduce_sum %3 {axes=[0,1]}   # m.lua:4\n"
        "%5:f32[] = reshape %4   # m.lua:4\n"
        "output \"loss\" %5\n",
        "kiln-ir v1\n"
        "%0:f32[5,3] = param \"x\" zeros\n"
        "%1:f32[2,3] = slice %0 {start=[2,0]}   # m.lua:1\n"
        "%2:f32[1,3] = slice %0 {start=[0,0]}   # m.lua:2\n"
        "%3:f32[3,3] = concat %1, %2 {axis=0}   # m.lua:3\n"
        "%4:f32[1,1] = reduce_sum %3 {axes=[0,1]}   # m.lua:4\n"
        "%5:f32[] = reshape %4   # m.lua:4\n"
        "%6:f32[] = const {value=1} !backward   # m.lua:4\n"
        "%7:f32[1,1] = reshape %6 !backward   # m.lua:4\n"
        "%8:f32[3,3] = broadcast %7 !backward   # m.lua:4\n"
        "%9:f32[2,3] = slice %8 {start=[0,0]} !backward   # m.lua:3\n"
        "%10:f32[1,3] = slice %8 {start=[2,0]} !backward   # m.lua:3\n"
        "%11:f32[] = const {value=0} !backward   # m.lua:2\n"
        "%12:f32[1,3] = broadcast %11 !backward   # m.lua:2\n"
        "%13:f32[4,3] = concat %10, %12, %9 {axis=0} !backward   # m.lua:2\n"
        "%14:f32[5,3] = pad %13 {lo=[0,0]} !backward   # m.lua:2\n"
        "output \"loss\" %5\n"
        "output \"grad.x\" %14\n");
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
    rt_pass_opts(&m->train, &po);
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

static void test_loss_errors(void **state)
{
    (void)state;
    expect_error("kiln-ir v1\n"
                 "%0:f32[2,3] = param \"w\" zeros\n"
                 "%1:f32[2,3] = exp %0   # models/m.lua:17\n"
                 "output \"loss\" %1\n",
                 "models/m.lua:17: the loss must be a scalar float (expected f32[], got "
                 "f32[2,3])");
    expect_error("kiln-ir v1\n"
                 "%0:f32[2] = param \"w\" zeros\n"
                 "%1:i32[] = const {value=3}   # models/m.lua:9\n"
                 "output \"loss\" %1\n",
                 "models/m.lua:9: the loss must be a scalar float (expected f32[], got i32[])");
    expect_error("kiln-ir v1\n"
                 "%0:f32[] = param \"w\" zeros\n"
                 "%1:f32[] = exp %0\n"
                 "output \"out\" %1\n",
                 "the graph has no output named \"loss\" (expected the model to set one)");
}

/* A param that reaches the loss only through a comparison has no gradient
 * path: its gradient is zeros and nothing is differentiated. */
static void test_no_gradient_through_compare(void **state)
{
    (void)state;
    expect_autodiff("kiln-ir v1\n"
                    "%0:f32[] = param \"w\" zeros\n"
                    "%1:f32[] = input \"x\"\n"
                    "%2:u8[] = gt %0, %1   # m.lua:1\n"
                    "%3:f32[] = select %2, %1, %1   # m.lua:2\n"
                    "output \"loss\" %3\n",
                    "kiln-ir v1\n"
                    "%0:f32[] = param \"w\" zeros\n"
                    "%1:f32[] = input \"x\"\n"
                    "%2:u8[] = gt %0, %1   # m.lua:1\n"
                    "%3:f32[] = select %2, %1, %1   # m.lua:2\n"
                    "%4:f32[] = const {value=0} !backward\n"
                    "output \"loss\" %3\n"
                    "output \"grad.w\" %4\n");
}

/* loss = w * stop_gradient(w): the gradient is stop_gradient(w) alone, the
 * term through the stop_gradient is not formed. */
static void test_stop_gradient(void **state)
{
    (void)state;
    expect_autodiff("kiln-ir v1\n"
                    "%0:f32[] = param \"w\" zeros\n"
                    "%1:f32[] = stop_gradient %0   # m.lua:1\n"
                    "%2:f32[] = mul %0, %1   # m.lua:2\n"
                    "output \"loss\" %2\n",
                    "kiln-ir v1\n"
                    "%0:f32[] = param \"w\" zeros\n"
                    "%1:f32[] = stop_gradient %0   # m.lua:1\n"
                    "%2:f32[] = mul %0, %1   # m.lua:2\n"
                    "%3:f32[] = const {value=1} !backward   # m.lua:2\n"
                    "%4:f32[] = mul %3, %1 !backward   # m.lua:2\n"
                    "output \"loss\" %2\n"
                    "output \"grad.w\" %4\n");
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
        cmocka_unit_test(test_mul_reduce),
        cmocka_unit_test(test_accumulate_unused_cast),
        cmocka_unit_test(test_matmul_bias_relu_max),
        cmocka_unit_test(test_slices_concat),
        cmocka_unit_test(test_slices_concat_many),
        cmocka_unit_test(test_slice_memory_linear),
        cmocka_unit_test(test_loss_errors),
        cmocka_unit_test(test_no_gradient_through_compare),
        cmocka_unit_test(test_stop_gradient),
        cmocka_unit_test(test_large_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
