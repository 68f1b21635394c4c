/* test_codegen.c - kernel descriptions and the C printer: what the generated
 * source says for a few ops, that it compiles, that the expression printer
 * takes target overrides, kernel sharing, GEMM steps, unsupported dtypes, and
 * a kernel's aliasing params and in-place merges against the pairwise checks. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "codegen.h"

static const SrcLoc here = {"test.lua", 7};

static int in_f32(Graph *g, const char *name, int rank, const int64_t *dim)
{
    return ir_add_input(g, TK_INPUT, name, shape_make(DT_F32, rank, dim), (ParamInit){0});
}

static char *kernel_src(const Graph *g, int op)
{
    CgKernel *k = xcalloc(1, sizeof *k);
    Diag d = {{0}};
    if (!cg_lower_op(g, op, k, &d))
        fail_msg("%s", d.msg);
    CgBuf b = {0};
    cg_print_c_kernel(&b, k);
    cg_kernel_free(k);
    return b.s;
}

static void expect(const char *src, const char *want)
{
    if (!strstr(src, want))
        fail_msg("generated source lacks \"%s\":\n%s", want, src);
}

static void test_elementwise_source(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[2] = {4, 8};
    int x = in_f32(g, "x", 2, d), y = in_f32(g, "y", 2, d);
    ir_op_x(g, OP_ADD, (int[]){x, y}, 2, NULL, here);
    ir_op_x(g, OP_SIGMOID, &x, 1, NULL, here);
    char *s = kernel_src(g, 0);
    expect(s, "void k0_add(float *restrict p0, const float *restrict p1, const float *restrict p2, "
              "int64_t part, int64_t nparts)");
    /* each part takes its share of the outer rows */
    expect(s, "for (int64_t v0 = 32LL * part / nparts; v0 < 32LL * (part + 1) / nparts; v0++)");
    expect(s, "p0[v0] = (p1[v0] + p2[v0]);");
    free(s);
    s = kernel_src(g, 1);
    expect(s, "p0[v0] = (1.0f / (1.0f + kiln_expf(-p1[v0])));");
    free(s);
    ir_free(g);
}

/* One fused group of 50,000 chained adds lowers and prints: lowering keeps
 * no C stack frame per op (a recursive lowering overflowed an 8 MiB stack
 * here). The kernel computes x + 50000 * w: every add is in it (a few more
 * " + " are the loop bounds'). */
static void test_long_chain(void **state)
{
    (void)state;
    enum { N = 50000 };
    Graph *g = ir_new();
    int64_t d[1] = {64};
    int x = in_f32(g, "x", 1, d), w = in_f32(g, "w", 1, d), h = x;
    int *ops = xmalloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) {
        h = ir_op_x(g, OP_ADD, (int[]){h, w}, 2, NULL, here);
        ops[i] = g->t.v[h].op;
        g->ops.v[ops[i]].group = 0;
    }
    ir_add_output(g, "h", h);
    bool *mat = pass_fuse_materialised(g);
    CgKernel *k = xcalloc(1, sizeof *k);
    Diag dg = {{0}};
    if (!cg_lower_group(g, ops, N, mat, k, &dg))
        fail_msg("%s", dg.msg);
    CgBuf b = {0};
    cg_print_c_kernel(&b, k);
    int adds = 0;
    for (const char *q = b.s; (q = strstr(q, " + ")); q++)
        adds++;
    assert_true(adds >= N && adds <= N + 8); /* and the loop header's */
    free(b.s);
    cg_kernel_free(k);
    free(mat);
    free(ops);
    ir_free(g);
}

static void test_reduce_random_source(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[2] = {3, 5};
    int x = in_f32(g, "x", 2, d);
    OpAttr r = {.nia = 1, .ia = {1}};
    ir_op_x(g, OP_REDUCE_MAX, &x, 1, &r, here);
    OpAttr rnd = {.rank = 1, .shape = {10}, .nia = 1, .ia = {42}};
    ir_op_x(g, OP_RANDOM, NULL, 0, &rnd, here);
    char *s = kernel_src(g, 0);
    expect(s, "float a0 = (-KILN_INF);");
    expect(s, "for (int64_t v1 = 0; v1 < 5; v1++)");
    expect(s, "p1[((v0 * 5) + v1)]");
    free(s);
    s = kernel_src(g, 1);
    expect(s, "uint64_t seed, int64_t step, int64_t part, int64_t nparts)");
    expect(s, "kiln_rand_u01(seed, 42ull, (uint64_t)step, (uint64_t)(v0))");
    free(s);
    ir_free(g);
}

/* A second target overrides one spelling; everything else comes from the
 * shared table. */
static void test_target_override(void **state)
{
    (void)state;
    CgKernel k = {0};
    CgParam p = {0, DT_F32, false};
    vec_push(&k.params, p);
    int v = cg_var(&k, cg_new_var(&k));
    int e = cg_binop(&k, CG_ADD, cg_unop(&k, CG_RSQRT, cg_load(&k, 0, v)),
                     cg_const_f(&k, DT_F32, 1.0));
    CgBuf b = {0};
    cg_print_expr(&b, &k, e, &cg_target_c);
    assert_string_equal(b.s, "((1.0f / sqrtf(p0[v0])) + 1.0f)");
    static const char *over[CG__COUNT] = {[CG_RSQRT] = "rsqrtf($0)"};
    CgTarget cuda = {"cuda", over, NULL};
    b.n = 0;
    cg_print_expr(&b, &k, e, &cuda);
    assert_string_equal(b.s, "(rsqrtf(p0[v0]) + 1.0f)");
    /* index arithmetic folds */
    int i = cg_binop(&k, CG_ADD, cg_binop(&k, CG_MUL, v, cg_const_i(&k, DT_I64, 1)),
                     cg_const_i(&k, DT_I64, 0));
    assert_int_equal(i, v);
    free(b.s);
    vec_free(&k.params);
    vec_free(&k.ex);
}

static void test_plan_compiles(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[3] = {2, 4, 8}, w[2] = {8, 3};
    int x = in_f32(g, "x", 3, d), y = in_f32(g, "y", 3, d);
    int W = ir_add_input(g, TK_PARAM, "W", shape_make(DT_F32, 2, w), (ParamInit){0});
    int e1 = ir_op_x(g, OP_EXP, &x, 1, NULL, here);
    int e2 = ir_op_x(g, OP_EXP, &y, 1, NULL, here); /* same body as e1: shared kernel */
    int s = ir_op_x(g, OP_ADD, (int[]){e1, e2}, 2, NULL, here);
    OpAttr mm = {.nia = 2, .ia = {0, 0}};
    int z = ir_op_x(g, OP_MATMUL, (int[]){s, W}, 2, &mm, here);
    OpAttr p = {.nia = 3, .ia = {2, 0, 1}};
    ir_add_output(g, "z", ir_op_x(g, OP_PERMUTE, &z, 1, &p, here));
    Diag dg = {{0}};
    CgPlan *pl = cg_plan(g, &dg);
    if (!pl)
        fail_msg("%s", dg.msg);
    assert_int_equal(pl->kernels.n, 3); /* exp (shared), add, permute */
    assert_int_equal(pl->steps.n, 5);
    assert_int_equal(pl->steps.v[0].kernel, pl->steps.v[1].kernel);
    assert_true(pl->steps.v[0].args[1] != pl->steps.v[1].args[1]);
    const CgStep *gs = &pl->steps.v[3];
    assert_int_equal(gs->kind, CG_STEP_GEMM);
    assert_int_equal(gs->gemm.M, 8); /* batch of 2 x 4 rows folded: B is shared */
    assert_int_equal(gs->gemm.batch, 1);
    assert_int_equal(gs->gemm.N, 3);
    assert_int_equal(gs->gemm.K, 8);
    char *dir = scratch_dir("codegen");
    char *path = xasprintf("%s/k.c", dir);
    write_file(path, pl->source);
    char *cmd = xasprintf("%s -std=c11 -Wall -Werror -c -o %s/k.o %s", KILN_C_COMPILER, dir, path);
    char *outp = NULL;
    int rc = run_cmd(cmd, &outp);
    if (rc != 0)
        fail_msg("generated C does not compile:\n%s\n%s", outp, pl->source);
    free(outp);
    free(cmd);
    remove_tree(dir);
    free(path);
    free(dir);
    cg_plan_free(pl);
    ir_free(g);
}

static void test_unsupported_dtype(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[1] = {4};
    int x = in_f32(g, "x", 1, d);
    OpAttr c = {.dtype = DT_BF16};
    ir_add_output(g, "y", ir_op_x(g, OP_CAST, &x, 1, &c, here));
    Diag dg = {{0}};
    CgPlan *pl = cg_plan(g, &dg);
    assert_null(pl);
    expect(dg.msg, "test.lua:7: cast on bf16 is not supported");
    ir_free(g);
}

/* The plain pairwise definitions cg_params_alias and
 * cg_merge_inplace_params must agree with. */
static bool alias_ref(const MemPlan *m, const CgKernel *k)
{
    for (int a = 0; a < k->params.n; a++)
        for (int b = 0; b < k->params.n; b++) {
            int ta = k->params.v[a].tensor, tb = k->params.v[b].tensor;
            int64_t a0 = m->offset[ta], a1 = a0 + m->bytes[ta];
            int64_t b0 = m->offset[tb], b1 = b0 + m->bytes[tb];
            if (a != b && k->params.v[a].out && a0 < b1 && b0 < a1)
                return true;
        }
    return false;
}

/* to[a]: the param input a becomes, before renumbering (itself if none) */
static void merge_ref(const MemPlan *m, const CgKernel *k, int *to)
{
    for (int a = 0; a < k->params.n; a++) {
        to[a] = a;
        const CgParam *pa = &k->params.v[a];
        for (int b = 0; b < k->params.n && !pa->out; b++) {
            const CgParam *pb = &k->params.v[b];
            if (pb->out && pb->dt == pa->dt && m->offset[pb->tensor] == m->offset[pa->tensor] &&
                m->bytes[pb->tensor] == m->bytes[pa->tensor]) {
                to[a] = b;
                break;
            }
        }
    }
}

/* Random params over a few offsets and sizes (empty ones too, and the same
 * tensor twice): the sweep and the sorted merge give the pairwise answers. */
static void test_params_alias_merge(void **state)
{
    (void)state;
    enum { NT = 24 };
    int64_t off[NT], bytes[NT];
    MemPlan m = {.nt = NT, .offset = off, .bytes = bytes};
    srand(7);
    int hits = 0, merged = 0;
    for (int round = 0; round < 3000; round++) {
        int span = 1 + rand() % 64;
        for (int t = 0; t < NT; t++) {
            off[t] = rand() % span;
            bytes[t] = rand() % 5 == 0 ? 0 : rand() % 24;
        }
        CgKernel k = {0};
        int n = 1 + rand() % 12;
        for (int a = 0; a < n; a++) {
            CgParam p = {rand() % NT, rand() % 4 == 0 ? DT_BF16 : DT_F32, rand() % 3 == 0};
            vec_push(&k.params, p);
        }
        for (int a = 0; a < n; a++) { /* a load of each param, to check the renumbering */
            CgExpr e = {.kind = CGX_LOAD, .param = a};
            vec_push(&k.ex, e);
        }
        bool want = alias_ref(&m, &k);
        hits += want;
        assert_int_equal(cg_params_alias(&m, &k), want);
        int to[16];
        merge_ref(&m, &k, to);
        CgParam before[16];
        memcpy(before, k.params.v, sizeof(CgParam) * (size_t)n);
        cg_merge_inplace_params(&m, &k);
        for (int a = 0, w = 0; a < n; a++) { /* survivors keep their order */
            if (to[a] != a)
                continue;
            assert_true(w < k.params.n);
            assert_int_equal(k.params.v[w].tensor, before[a].tensor);
            assert_int_equal(k.params.v[w].out, before[a].out);
            w++;
        }
        for (int a = 0; a < n; a++) {
            const CgParam *p = &k.params.v[k.ex.v[a].param];
            assert_int_equal(p->tensor, before[to[a]].tensor);
            assert_int_equal(p->out, before[to[a]].out);
            merged += to[a] != a;
        }
        vec_free(&k.params);
        vec_free(&k.ex);
    }
    assert_true(hits > 300 && hits < 2700); /* both answers are exercised */
    assert_true(merged > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_source), cmocka_unit_test(test_reduce_random_source),
        cmocka_unit_test(test_long_chain),
        cmocka_unit_test(test_target_override),    cmocka_unit_test(test_plan_compiles),
        cmocka_unit_test(test_unsupported_dtype), cmocka_unit_test(test_params_alias_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
