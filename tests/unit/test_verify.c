/* test_verify.c - ir_verify: a small valid graph passes; each test corrupts
 * exactly one invariant and checks the verifier rejects it by name. Also
 * ir_reorder_ops, the passes' one way to reorder ops, against the same
 * verifier. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* Tensor ids of the valid graph built by build(). */
enum { X, W, C, Y, B, Z, S, W2, NT };
/* Op indices. */
enum { OPC, OPY, OPB, OPZ, OPS, OPW2 };

/*  %0:f32[2,3] = input "x"
 *  %1:f32[3,4] = param "w"
 *  %2:f32[] = const {value=1}
 *  %3:f32[2,4] = matmul %0, %1 {ta=0,tb=0}
 *  %4:f32[2,4] = broadcast %2
 *  %5:f32[2,4] = add %3, %4          # v.lua:7
 *  %6:f32[1,1] = reduce_sum %5 {axes=[0,1]}
 *  %7:f32[3,4] = mul %1, %1
 *  output "loss" %6
 *  update %1 <- %7 */
static Graph *build(void)
{
    Graph *g = ir_new();
    SrcLoc nl = {NULL, 0};
    assert_int_equal(ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 2, (int64_t[]){2, 3}),
                                  (ParamInit){0}),
                     X);
    assert_int_equal(ir_add_input(g, TK_PARAM, "w", shape_make(DT_F32, 2, (int64_t[]){3, 4}),
                                  (ParamInit){INIT_NORMAL, 0.02, 0}),
                     W);
    assert_int_equal(ir_op_x(g, OP_CONST, NULL, 0, &(OpAttr){.f = 1, .dtype = DT_F32}, nl), C);
    assert_int_equal(ir_op_x(g, OP_MATMUL, (int[]){X, W}, 2, &(OpAttr){.nia = 2}, nl), Y);
    assert_int_equal(ir_op_x(g, OP_BROADCAST, (int[]){C}, 1,
                             &(OpAttr){.rank = 2, .shape = {2, 4}}, nl),
                     B);
    assert_int_equal(ir_op_x(g, OP_ADD, (int[]){Y, B}, 2, NULL,
                             (SrcLoc){intern("v.lua"), 7}),
                     Z);
    assert_int_equal(ir_op_x(g, OP_REDUCE_SUM, (int[]){Z}, 1,
                             &(OpAttr){.ia = {0, 1}, .nia = 2}, nl),
                     S);
    assert_int_equal(ir_op_x(g, OP_MUL, (int[]){W, W}, 2, NULL, nl), W2);
    ir_add_output(g, "loss", S);
    ir_add_update(g, W, W2);
    return g;
}

/* ir_verify must reject g with a message containing each of the needles. */
static void rejects(Graph *g, const char *n1, const char *n2)
{
    char err[1024] = "";
    if (ir_verify(g, err, sizeof err))
        fail_msg("verifier accepted a corrupted graph (expected \"%s\")", n1);
    if (!strstr(err, n1) || (n2 && !strstr(err, n2)))
        fail_msg("verifier message \"%s\" lacks \"%s\"%s%s", err, n1, n2 ? " / " : "",
                 n2 ? n2 : "");
    ir_free(g);
}

static void test_valid(void **state)
{
    (void)state;
    Graph *g = build();
    char err[512] = "";
    if (!ir_verify(g, err, sizeof err))
        fail_msg("valid graph rejected: %s", err);
    /* the parser's graphs and clones are valid too */
    char *p = ir_print_str(g);
    Graph *g2 = parse_or_fail(p);
    assert_true(ir_verify(g2, err, sizeof err));
    Graph *g3 = ir_clone(g);
    assert_true(ir_verify(g3, err, sizeof err));
    free(p);
    ir_free(g);
    ir_free(g2);
    ir_free(g3);
}

static void test_tensor_id(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[Z].id = 9;
    rejects(g, "tensor 5 has id 9", NULL);
}

static void test_input_kind(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[X].kind = TK_TEMP;
    rejects(g, "no producing op but kind temp", NULL);
}

static void test_input_name(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[X].name = NULL;
    rejects(g, "has no name", NULL);
}

static void test_result_producer(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[Z].op = OPY; /* names the matmul, which defines %3 */
    rejects(g, "op 3 add (v.lua:7): result %5 names op 1 as its producer (expected 3)", NULL);
}

static void test_producer_out_of_range(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[Z].op = 42;
    rejects(g, "names producing op 42", NULL);
}

static void test_orphan_tensor(void **state)
{
    (void)state;
    Graph *g = build();
    Tensor t = g->t.v[Y];
    t.id = NT;
    vec_push(&g->t, t); /* claims the matmul, which defines %3 */
    rejects(g, "tensor %8 names op 1 as its producer, but that op defines %3", NULL);
}

static void test_defined_twice(void **state)
{
    (void)state;
    Graph *g = build();
    g->ops.v[OPW2].out = Z; /* both add and mul claim %5 */
    rejects(g, "result %5 is defined more than once (also by op 3 add)", "op 5 mul");
}

static void test_op_defines_input(void **state)
{
    (void)state;
    Graph *g = build();
    g->ops.v[OPW2].out = W; /* an op redefines the param */
    rejects(g, "result %1 is defined more than once (it is the graph input param \"w\")",
            "op 5 mul");
}

static void test_use_before_def(void **state)
{
    (void)state;
    Graph *g = build();
    g->ops.v[OPZ].in[1] = S; /* the reduce_sum comes later */
    rejects(g, "operand 1 (%6) is used before it is defined", "op 3 add (v.lua:7)");
}

static void test_operand_out_of_range(void **state)
{
    (void)state;
    Graph *g = build();
    g->ops.v[OPZ].in[0] = 77;
    rejects(g, "operand 0 is not a tensor", "op 3 add");
}

static void test_result_type(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[Z].s.dtype = DT_BF16;
    rejects(g, "result %5 has type bf16[2,4], but add gives f32[2,4]", NULL);
}

static void test_result_shape(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[Y].s.dim[1] = 5;
    rejects(g, "op 1 matmul", "has type f32[2,5]");
}

static void test_attr_range(void **state)
{
    (void)state;
    Graph *g = build();
    g->ops.v[OPS].attr.ia[1] = 5;
    rejects(g, "op 4 reduce_sum", "axis out of range");
}

static void test_operand_types(void **state)
{
    (void)state;
    Graph *g = build();
    g->ops.v[OPZ].in[1] = C; /* add of f32[2,4] and f32[] */
    rejects(g, "op 3 add (v.lua:7): add: operand types differ", NULL);
}

static void test_bad_opcode(void **state)
{
    (void)state;
    Graph *g = build();
    g->ops.v[OPZ].code = (Opcode)999;
    rejects(g, "op 3: unknown opcode 999", NULL);
}

static void test_const_kind(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[C].kind = TK_TEMP;
    rejects(g, "result %2 has kind temp (expected const)", "op 0 const");
}

static void test_temp_kind(void **state)
{
    (void)state;
    Graph *g = build();
    g->t.v[Z].kind = TK_CONST;
    rejects(g, "result %5 has kind const (expected temp)", NULL);
}

static void test_output_missing(void **state)
{
    (void)state;
    Graph *g = build();
    g->outs.v[0].t = NT + 3;
    rejects(g, "output \"loss\" refers to %11", NULL);
}

static void test_output_twice(void **state)
{
    (void)state;
    Graph *g = build();
    ir_add_output(g, "loss", Z);
    rejects(g, "output \"loss\" is declared twice", NULL);
}

static void test_update_value_missing(void **state)
{
    (void)state;
    Graph *g = build();
    g->upd.v[0].value = -1;
    rejects(g, "update 0: value %-1 is not a defined tensor", NULL);
}

static void test_update_target_kind(void **state)
{
    (void)state;
    Graph *g = build();
    g->upd.v[0].target = Z;
    g->upd.v[0].value = Y;
    rejects(g, "target %5 has kind temp (expected param or state)", NULL);
}

static void test_update_type(void **state)
{
    (void)state;
    Graph *g = build();
    g->upd.v[0].value = Z;
    rejects(g, "update 0: value %5 has a different type than target %1 \"w\"",
            "expected f32[3,4], got f32[2,4]");
}

static void test_update_twice(void **state)
{
    (void)state;
    Graph *g = build();
    ir_add_update(g, W, W);
    rejects(g, "update 1: target %1 \"w\" is updated twice", NULL);
}

/* ir_reorder_ops: the new order with every back-link (Tensor.op) fixed,
 * unnamed ops dropped (ir_compact removes their results), and an order that
 * puts a reader first left for the verifier to reject. */
static void test_reorder_ops(void **state)
{
    (void)state;
    Graph *g = build();
    SrcLoc nl = {NULL, 0};
    int dead = ir_op_x(g, OP_NEG, (int[]){Z}, 1, NULL, nl); /* nothing reads it */
    /* mul w,w first; the unread neg dropped */
    int order[] = {OPW2, OPC, OPY, OPB, OPZ, OPS};
    ir_reorder_ops(g, order, 6);
    assert_int_equal(g->ops.n, 6);
    assert_int_equal(g->ops.v[0].code, OP_MUL);
    assert_int_equal(g->ops.v[5].code, OP_REDUCE_SUM);
    for (int i = 0; i < g->ops.n; i++)
        assert_int_equal(g->t.v[g->ops.v[i].out].op, i);
    assert_int_equal(g->t.v[dead].op, -1);
    int nt = g->t.n;
    ir_compact(g);
    assert_int_equal(g->t.n, nt - 1);
    char err[1024] = "";
    if (!ir_verify(g, err, sizeof err))
        fail_msg("reordered graph does not verify: %s", err);
    assert_int_equal(g->ops.v[0].code, OP_MUL);
    ir_free(g);
    /* the add before the broadcast it reads */
    g = build();
    int bad[] = {OPC, OPY, OPZ, OPB, OPS, OPW2};
    ir_reorder_ops(g, bad, 6);
    assert_int_equal(g->t.v[B].op, 3);
    assert_int_equal(g->t.v[Z].op, 2);
    rejects(g, "is used before it is defined", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_tensor_id),
        cmocka_unit_test(test_input_kind),
        cmocka_unit_test(test_input_name),
        cmocka_unit_test(test_result_producer),
        cmocka_unit_test(test_producer_out_of_range),
        cmocka_unit_test(test_orphan_tensor),
        cmocka_unit_test(test_defined_twice),
        cmocka_unit_test(test_op_defines_input),
        cmocka_unit_test(test_use_before_def),
        cmocka_unit_test(test_operand_out_of_range),
        cmocka_unit_test(test_result_type),
        cmocka_unit_test(test_result_shape),
        cmocka_unit_test(test_attr_range),
        cmocka_unit_test(test_operand_types),
        cmocka_unit_test(test_bad_opcode),
        cmocka_unit_test(test_const_kind),
        cmocka_unit_test(test_temp_kind),
        cmocka_unit_test(test_output_missing),
        cmocka_unit_test(test_output_twice),
        cmocka_unit_test(test_update_value_missing),
        cmocka_unit_test(test_update_target_kind),
        cmocka_unit_test(test_update_type),
        cmocka_unit_test(test_update_twice),
        cmocka_unit_test(test_reorder_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
