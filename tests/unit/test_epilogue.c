/* test_epilogue.c - the GELU matchers of codegen/epilogue.c on IR text:
 * nn.gelu and its gradient as autodiff + simplify write them (the backward
 * text is gpt.lua's c_fc group after fuse, shapes shrunk) are recognised in
 * any operand order of add and mul, and the IR they match computes gelu and
 * g * gelu' (checked with the interpreter); near misses (a wrong constant, a
 * swapped sub, a second variable, a missing term) are not. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"

static const char gelu_ir[] = "kiln-ir v1\n"
                              "%0:f32[4] = input \"x\"\n"
                              "%1:f32[4] = input \"y\"\n"
                              "%2:f32[4] = const {value=0.5}\n"
                              "%3:f32[4] = mul %2, %0\n"
                              "%4:f32[4] = const {value=0.044715}\n"
                              "%5:f32[4] = mul %4, %0\n"
                              "%6:f32[4] = mul %5, %0\n"
                              "%7:f32[4] = mul %6, %0\n"
                              "%8:f32[4] = add %0, %7\n"
                              "%9:f32[4] = const {value=0.7978845608028654}\n"
                              "%10:f32[4] = mul %9, %8\n"
                              "%11:f32[4] = tanh %10\n"
                              "%12:f32[4] = const {value=1}\n"
                              "%13:f32[4] = add %12, %11\n"
                              "%14:f32[4] = mul %3, %13\n"
                              "output \"out\" %14\n";

static const char dgelu_ir[] = "kiln-ir v1\n"
                               "%0:f32[4] = input \"x\"\n"
                               "%1:f32[4] = input \"g\"\n"
                               "%2:f32[4] = const {value=0.044715}\n"
                               "%3:f32[4] = mul %2, %0\n"
                               "%4:f32[4] = mul %3, %0\n"
                               "%5:f32[4] = mul %4, %0\n"
                               "%6:f32[4] = add %0, %5\n"
                               "%7:f32[4] = const {value=0.7978845608028654}\n"
                               "%8:f32[4] = mul %7, %6\n"
                               "%9:f32[4] = tanh %8\n"
                               "%10:f32[4] = const {value=1}\n"
                               "%11:f32[4] = add %10, %9\n"
                               "%12:f32[4] = mul %1, %11\n"
                               "%13:f32[4] = const {value=0.5}\n"
                               "%14:f32[4] = mul %13, %0\n"
                               "%15:f32[4] = mul %1, %14\n"
                               "%16:f32[4] = mul %9, %9\n"
                               "%17:f32[4] = const {value=1}\n"
                               "%18:f32[4] = sub %17, %16\n"
                               "%19:f32[4] = mul %15, %18\n"
                               "%20:f32[4] = const {value=0.7978845608028654}\n"
                               "%21:f32[4] = mul %19, %20\n"
                               "%22:f32[4] = mul %21, %0\n"
                               "%23:f32[4] = mul %21, %4\n"
                               "%24:f32[4] = add %21, %23\n"
                               "%25:f32[4] = mul %22, %0\n"
                               "%26:f32[4] = mul %22, %3\n"
                               "%27:f32[4] = add %24, %26\n"
                               "%28:f32[4] = const {value=0.044715}\n"
                               "%29:f32[4] = mul %25, %28\n"
                               "%30:f32[4] = add %27, %29\n"
                               "%31:f32[4] = const {value=0.5}\n"
                               "%32:f32[4] = mul %12, %31\n"
                               "%33:f32[4] = add %30, %32\n"
                               "output \"dx\" %33\n";

/* text with the first occurrence of `from` replaced by `to` (must exist) */
static char *edit(const char *text, const char *from, const char *to)
{
    const char *p = strstr(text, from);
    assert_non_null(p);
    return xasprintf("%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
}

static int out_tensor(const Graph *g) { return g->outs.v[0].t; }

static bool gelu_text(const char *text, int *x)
{
    Graph *g = parse_or_fail(text);
    bool ok = cg_match_gelu(g, out_tensor(g), x);
    ir_free(g);
    return ok;
}

static bool dgelu_text(const char *text, int *x, int *grad)
{
    Graph *g = parse_or_fail(text);
    bool ok = cg_match_dgelu(g, out_tensor(g), x, grad);
    ir_free(g);
    return ok;
}

static double gelu_ref(double x)
{
    return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/* The interpreter's values of the text's output at x = xs, second input ys. */
static void eval(const char *text, const double *xs, const double *ys, double *out)
{
    Graph *g = parse_or_fail(text);
    double **val = ir_interp_alloc(g);
    val[0] = xcalloc(4, sizeof(double));
    val[1] = xcalloc(4, sizeof(double));
    memcpy(val[0], xs, 4 * sizeof(double));
    memcpy(val[1], ys, 4 * sizeof(double));
    InterpOpts o = {0};
    ir_interp(g, val, &o);
    memcpy(out, val[out_tensor(g)], 4 * sizeof(double));
    ir_interp_free(g, val);
    ir_free(g);
}

static void test_gelu(void **state)
{
    (void)state;
    int x = -1;
    assert_true(gelu_text(gelu_ir, &x));
    assert_int_equal(x, 0);
    /* operand order of add and mul does not matter */
    char *t1 = edit(gelu_ir, "mul %2, %0", "mul %0, %2");
    char *t2 = edit(t1, "add %12, %11", "add %11, %12");
    char *t3 = edit(t2, "mul %3, %13", "mul %13, %3");
    assert_true(gelu_text(t3, &x));
    assert_int_equal(x, 0);
    /* what it matches is gelu */
    double xs[4] = {-2.5, -0.3, 0.7, 3.1}, ys[4] = {0}, out[4];
    eval(gelu_ir, xs, ys, out);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(out[i] - gelu_ref(xs[i])) < 1e-12);
    free(t1);
    free(t2);
    free(t3);
}

static void test_gelu_near_misses(void **state)
{
    (void)state;
    int x;
    const char *miss[][2] = {
        {"%4:f32[4] = const {value=0.044715}", "%4:f32[4] = const {value=0.0447}"},
        {"%9:f32[4] = const {value=0.7978845608028654}", "%9:f32[4] = const {value=0.8}"},
        {"%2:f32[4] = const {value=0.5}", "%2:f32[4] = const {value=1}"},
        {"%6:f32[4] = mul %5, %0", "%6:f32[4] = mul %5, %1"}, /* x and y mixed */
        {"%11:f32[4] = tanh %10", "%11:f32[4] = sigmoid %10"},
        {"%13:f32[4] = add %12, %11", "%13:f32[4] = sub %12, %11"},
    };
    for (size_t i = 0; i < sizeof miss / sizeof miss[0]; i++) {
        char *t = edit(gelu_ir, miss[i][0], miss[i][1]);
        if (gelu_text(t, &x))
            fail_msg("near miss %zu (%s) recognised as gelu", i, miss[i][1]);
        free(t);
    }
    /* 0.5 x (1 + tanh(x / sqrt 2)): no cubic term, another function */
    const char *short_ir = "kiln-ir v1\n"
                         "%0:f32[4] = input \"x\"\n"
                         "%1:f32[4] = const {value=0.5}\n"
                         "%2:f32[4] = mul %1, %0\n"
                         "%3:f32[4] = const {value=0.7071067811865476}\n"
                         "%4:f32[4] = mul %3, %0\n"
                         "%5:f32[4] = tanh %4\n"
                         "%6:f32[4] = const {value=1}\n"
                         "%7:f32[4] = add %6, %5\n"
                         "%8:f32[4] = mul %2, %7\n"
                         "output \"y\" %8\n";
    assert_false(gelu_text(short_ir, &x));
}

static void test_dgelu(void **state)
{
    (void)state;
    int x = -1, g = -1;
    assert_true(dgelu_text(dgelu_ir, &x, &g));
    assert_int_equal(x, 0);
    assert_int_equal(g, 1);
    char *t1 = edit(dgelu_ir, "add %30, %32", "add %32, %30");
    char *t2 = edit(t1, "mul %21, %0", "mul %0, %21");
    assert_true(dgelu_text(t2, &x, &g));
    assert_int_equal(x, 0);
    assert_int_equal(g, 1);
    /* what it matches is g * gelu'(x) (central differences of gelu) */
    double xs[4] = {-2.5, -0.3, 0.7, 3.1}, gs[4] = {1.0, -0.5, 2.0, 0.25}, out[4];
    eval(dgelu_ir, xs, gs, out);
    for (int i = 0; i < 4; i++) {
        double h = 1e-6;
        double d = (gelu_ref(xs[i] + h) - gelu_ref(xs[i] - h)) / (2 * h);
        assert_true(fabs(out[i] - gs[i] * d) < 1e-8);
    }
    free(t1);
    free(t2);
}

static void test_dgelu_near_misses(void **state)
{
    (void)state;
    int x, g;
    const char *miss[][2] = {
        {"sub %17, %16", "sub %16, %17"}, /* 1 - t^2 with the operands swapped */
        {"%28:f32[4] = const {value=0.044715}", "%28:f32[4] = const {value=0.04}"},
        {"%31:f32[4] = const {value=0.5}", "%31:f32[4] = const {value=0.25}"},
        {"%32:f32[4] = mul %12, %31", "%32:f32[4] = mul %11, %31"}, /* g dropped */
        {"%23:f32[4] = mul %21, %4", "%23:f32[4] = mul %21, %3"},  /* x^2 -> x */
    };
    for (size_t i = 0; i < sizeof miss / sizeof miss[0]; i++) {
        char *t = edit(dgelu_ir, miss[i][0], miss[i][1]);
        if (dgelu_text(t, &x, &g))
            fail_msg("near miss %zu (%s) recognised as dgelu", i, miss[i][1]);
        free(t);
    }
    /* the forward is not the backward, and vice versa */
    assert_false(dgelu_text(gelu_ir, &x, &g));
    assert_false(gelu_text(dgelu_ir, &x));
}

/* gpt.lua's plan (tiny config, remat policy `remat`, fused or not): the
 * epilogue counts, the plan's invariants (a replaced step is a kernel step
 * naming a GEMM step that carries an epilogue; pairs point at each other and
 * share aux), and the summary line kiln compile prints. */
static void gpt_plan(int remat, bool fuse, int *n, int *layers, char **line)
{
    Model *m = load_model("models/gpt.lua", NULL, 0);
    PassOpts po;
    pass_opts_default(&po);
    po.grad_clip = m->train.grad_clip;
    po.weight_decay = m->train.weight_decay;
    po.remat = remat;
    po.no_fuse = !fuse;
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
    CgPlan *p = cg_plan(m->g, &d);
    if (!p)
        fail_msg("plan: %s", d.msg);
    memset(n, 0, sizeof(int) * CG_EPI__COUNT);
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind == CG_STEP_GEMM) {
            const CgGemm *g = &st->gemm;
            n[g->epilogue]++;
            if (g->pair >= 0) {
                const CgGemm *q = &p->steps.v[g->pair].gemm;
                assert_int_equal(q->pair, s);
                assert_int_equal(q->aux, g->aux);
                assert_int_equal(g->aux, g->epilogue == CG_EPI_GELU_AUX_BIAS ? g->c : q->c);
            }
        }
        if (st->by_epilogue >= 0) {
            assert_int_equal(st->kind, CG_STEP_KERNEL);
            assert_int_equal(p->steps.v[st->by_epilogue].kind, CG_STEP_GEMM);
            assert_int_not_equal(p->steps.v[st->by_epilogue].gemm.epilogue, CG_EPI_NONE);
        }
    }
    *layers = 0;
    for (int t = 0; t < m->g->t.n; t++) {
        const char *nm = m->g->t.v[t].name;
        *layers += nm && strncmp(nm, "h.", 2) == 0 && strstr(nm, ".mlp.c_fc.weight") &&
                   m->g->t.v[t].kind == TK_PARAM;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cg_plan_print_epilogues(p, f, true);
    fclose(f);
    *line = buf;
    cg_plan_free(p);
    fe_model_free(m);
}

static void test_gpt_plan(void **state)
{
    (void)state;
    int n[CG_EPI__COUNT], L;
    char *out;
    gpt_plan(REMAT_NONE, true, n, &L, &out);
    assert_true(L >= 2);
    assert_int_equal(n[CG_EPI_BIAS], L);
    assert_int_equal(n[CG_EPI_GELU_AUX_BIAS], L);
    assert_int_equal(n[CG_EPI_DGELU_BGRAD], L);
    assert_int_equal(n[CG_EPI_GELU_BIAS] + n[CG_EPI_DGELU] + n[CG_EPI_BGRAD_A] +
                         n[CG_EPI_BGRAD_B],
                     0);
    char *want = xasprintf("gemm epilogues (cuBLASLt, f32): %d bias, %d gelu_aux_bias, %d "
                           "dgelu_bgrad; %d kernel steps they replace\n",
                           L, L, L, 4 * L);
    assert_true(strncmp(out, want, strlen(want)) == 0);
    assert_non_null(strstr(out, "gelu_aux_bias bias=%"));
    free(want);
    free(out);
    gpt_plan(REMAT_FULL, true, n, &L, &out);
    assert_int_equal(n[CG_EPI_BIAS], 2 * L);
    assert_int_equal(n[CG_EPI_GELU_BIAS], L);
    assert_int_equal(n[CG_EPI_GELU_AUX_BIAS], L);
    assert_int_equal(n[CG_EPI_DGELU_BGRAD], L);
    free(out);
    /* without fusion no group computes a GELU: no GELU epilogues */
    gpt_plan(REMAT_NONE, false, n, &L, &out);
    assert_int_equal(n[CG_EPI_GELU_BIAS] + n[CG_EPI_GELU_AUX_BIAS] + n[CG_EPI_DGELU] +
                         n[CG_EPI_DGELU_BGRAD],
                     0);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_gelu_near_misses),
        cmocka_unit_test(test_dgelu),
        cmocka_unit_test(test_dgelu_near_misses),
        cmocka_unit_test(test_gpt_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
