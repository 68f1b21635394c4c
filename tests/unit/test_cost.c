/* test_cost.c - FLOP and byte counts against hand-computed values. */
#include "testutil.h"

#include <stdlib.h>

static const SrcLoc nl = {NULL, 0};

#define EQ(got, want)                                                   \
    do {                                                                \
        double got_ = (got), want_ = (want);                            \
        if (got_ != want_)                                              \
            fail_msg("%s is %g (expected %g)", #got, got_, want_);      \
    } while (0)

static int in(Graph *g, DType dt, int rank, const int64_t *dim)
{
    char name[32];
    snprintf(name, sizeof name, "in%d", g->t.n);
    return ir_add_input(g, TK_INPUT, name, shape_make(dt, rank, dim), (ParamInit){0});
}

static const Op *last(const Graph *g) { return &g->ops.v[g->ops.n - 1]; }

static void test_matmul(void **state)
{
    (void)state;
    Graph *g = ir_new();
    /* batch 3, M=5, K=7, N=2: 2*3*5*2*7 = 420 FLOPs either way round */
    int a = in(g, DT_F32, 3, (int64_t[]){3, 5, 7});
    int at = in(g, DT_F32, 3, (int64_t[]){3, 7, 5});
    int b = in(g, DT_F32, 3, (int64_t[]){3, 7, 2});
    int bt2 = in(g, DT_F32, 2, (int64_t[]){2, 7});
    ir_op_x(g, OP_MATMUL, (int[]){a, b}, 2, &(OpAttr){.ia = {0, 0}, .nia = 2}, nl);
    EQ(ir_op_flops(g, last(g)), 420);
    /* read 105 + 42, write 30 floats */
    EQ(ir_op_bytes(g, last(g)), (105 + 42 + 30) * 4);
    ir_op_x(g, OP_MATMUL, (int[]){at, b}, 2, &(OpAttr){.ia = {1, 0}, .nia = 2}, nl);
    EQ(ir_op_flops(g, last(g)), 420);
    /* B shared across the batch and transposed: [N=2, K=7] */
    ir_op_x(g, OP_MATMUL, (int[]){at, bt2}, 2, &(OpAttr){.ia = {1, 1}, .nia = 2}, nl);
    EQ(ir_op_flops(g, last(g)), 420);
    EQ(ir_op_bytes(g, last(g)), (105 + 14 + 30) * 4);
    /* ta: A is stored [K=5, M=7]; B [K=5, N=3]: 2*M*N*K = 2*7*3*5 */
    int c = in(g, DT_BF16, 2, (int64_t[]){5, 7});
    int d = in(g, DT_BF16, 2, (int64_t[]){5, 3});
    ir_op_x(g, OP_MATMUL, (int[]){c, d}, 2, &(OpAttr){.ia = {1, 0}, .nia = 2}, nl);
    EQ(ir_op_flops(g, last(g)), 2 * 7 * 3 * 5);
    EQ(ir_op_bytes(g, last(g)), (35 + 15 + 21) * 2);
    EQ(ir_graph_flops(g), 3 * 420 + 210);
    ir_free(g);
}

static void test_reduce_elementwise(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int x = in(g, DT_F32, 2, (int64_t[]){4, 6});
    int r = ir_op_x(g, OP_REDUCE_SUM, (int[]){x}, 1, &(OpAttr){.ia = {1}, .nia = 1}, nl);
    assert_int_equal(shape_numel(&g->t.v[r].s), 4);
    EQ(ir_op_flops(g, last(g)), 24); /* per input element */
    EQ(ir_op_bytes(g, last(g)), 24 * 4 + 4 * 4);
    ir_op_x(g, OP_EXP, (int[]){x}, 1, NULL, nl);
    EQ(ir_op_flops(g, last(g)), 24 * 4); /* exp: 4 per element */
    EQ(ir_op_bytes(g, last(g)), 24 * 4 * 2);
    int m = ir_op_x(g, OP_LT, (int[]){x, x}, 2, NULL, nl);
    EQ(ir_op_bytes(g, last(g)), 24 * 4 * 2 + 24 * 1); /* u8 out */
    ir_op_x(g, OP_SELECT, (int[]){m, x, x}, 3, NULL, nl);
    EQ(ir_op_flops(g, last(g)), 24);
    ir_op_x(g, OP_BROADCAST, (int[]){r}, 1, &(OpAttr){.rank = 3, .shape = {5, 4, 6}}, nl);
    EQ(ir_op_flops(g, last(g)), 0);
    EQ(ir_op_bytes(g, last(g)), 4 * 4 + 120 * 4); /* reads numel(in) */
    ir_op_x(g, OP_RANDOM, NULL, 0, &(OpAttr){.ia = {1}, .nia = 1, .rank = 1, .shape = {10}}, nl);
    EQ(ir_op_flops(g, last(g)), 40);
    EQ(ir_op_bytes(g, last(g)), 40);
    ir_op_x(g, OP_ALLREDUCE, (int[]){x}, 1, NULL, nl);
    EQ(ir_op_flops(g, last(g)), 0);
    ir_free(g);
}

static void test_gather_scatter(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int table = in(g, DT_F32, 2, (int64_t[]){10, 8});
    int idx = in(g, DT_I32, 1, (int64_t[]){3});
    int src = ir_op_x(g, OP_GATHER, (int[]){table, idx}, 2, NULL, nl); /* f32[3,8] */
    EQ(ir_op_flops(g, last(g)), 0);
    /* 24 table rows read (not the whole 80), 3 indices, 24 written */
    EQ(ir_op_bytes(g, last(g)), 24 * 4 + 3 * 4 + 24 * 4);
    ir_op_x(g, OP_SCATTER_ADD, (int[]){idx, src}, 2, &(OpAttr){.rank = 2, .shape = {10, 8}},
            nl);
    EQ(ir_op_flops(g, last(g)), 24); /* one add per source element */
    EQ(ir_op_bytes(g, last(g)), 3 * 4 + 24 * 4 + 80 * 4);
    ir_op_x(g, OP_SLICE, (int[]){table}, 1,
            &(OpAttr){.ia = {2, 0}, .nia = 2, .rank = 2, .shape = {3, 8}}, nl);
    EQ(ir_op_bytes(g, last(g)), 24 * 4 * 2);
    ir_op_x(g, OP_RESHAPE, (int[]){table}, 1, &(OpAttr){.rank = 1, .shape = {80}}, nl);
    EQ(ir_op_flops(g, last(g)), 0);
    EQ(ir_op_bytes(g, last(g)), 80 * 4 * 2);
    EQ(ir_graph_flops(g), 24);
    ir_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_reduce_elementwise),
        cmocka_unit_test(test_gather_scatter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
