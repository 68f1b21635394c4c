/* test_simplify.c - simplify cases generated in C (identities over every
 * opcode pair, attribute variants, values computed with the C rounding),
 * values preserved on random inputs, a large graph and a training step. IR
 * text in, pass, expected IR text out: expected text is parsed and printed
 * too, so it may use named values; the comparison is on the printer's
 * canonical form. Every case also checks that a second run changes nothing
 * (the pass reached its fixed point). The fixed cases are
 * tests/passes/simplify_*.ir. */
#include "testutil.h"

#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *canon(const char *text)
{
    Graph *g = parse_or_fail(text);
    char *s = ir_print_str(g);
    ir_free(g);
    return s;
}

static void simplify_ok(Graph *g)
{
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    if (!pass_simplify(g, &o, &d))
        fail_msg("simplify failed: %s", d.msg);
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("invalid after simplify: %s", err);
}

static void check(const char *in, const char *expect)
{
    Graph *g = parse_or_fail(in);
    simplify_ok(g);
    char *got = ir_print_str(g);
    char *want = canon(expect);
    if (strcmp(got, want) != 0)
        fail_msg("simplify of\n%s\ngave\n%s\nexpected\n%s", in, got, want);
    simplify_ok(g);
    char *again = ir_print_str(g);
    if (strcmp(again, got) != 0)
        fail_msg("second simplify changed\n%s\ninto\n%s", got, again);
    free(again);
    free(got);
    free(want);
    ir_free(g);
}

/* ---- constant folding ---------------------------------------------------- */

/* values are computed in double and rounded to the result dtype */
/* f32 folding rounds each operand and the result to f32 (the value computed
 * here with C's own rounding; the bf16 case is
 * tests/passes/simplify_fold_rounds_to_dtype.ir) */
static void test_fold_rounds_to_dtype(void **state)
{
    (void)state;
    char expect[512];
    double v = (double)(float)((double)(float)0.1 + (double)(float)0.2);
    snprintf(expect, sizeof expect,
             "kiln-ir v1\n%%c:f32[] = const {value=%.17g}\noutput \"y\" %%c\n", v);
    check("kiln-ir v1\n"
          "%a:f32[] = const {value=0.1}\n"
          "%b:f32[] = const {value=0.2}\n"
          "%c:f32[] = add %a, %b\n"
          "output \"y\" %c\n",
          expect);
}

/* ---- identities ---------------------------------------------------------- */

#define X_IN "kiln-ir v1\n%x:f32[2,3] = input \"x\"\n"

static void test_identity_binary(void **state)
{
    (void)state;
    static const char *cases[] = {
        "%o:f32[2,3] = const {value=1}\n%r:f32[2,3] = mul %x, %o\n",
        "%o:f32[2,3] = const {value=1}\n%r:f32[2,3] = mul %o, %x\n",
        "%o:f32[2,3] = const {value=1}\n%r:f32[2,3] = div %x, %o\n",
        "%z:f32[2,3] = const {value=0}\n%r:f32[2,3] = add %x, %z\n",
        "%z:f32[2,3] = const {value=0}\n%r:f32[2,3] = add %z, %x\n",
        "%z:f32[2,3] = const {value=-0}\n%r:f32[2,3] = add %x, %z\n",
        "%z:f32[2,3] = const {value=0}\n%r:f32[2,3] = sub %x, %z\n",
        /* a scalar 1 broadcast first folds into a splat, then the identity */
        "%o:f32[] = const {value=1}\n%b:f32[2,3] = broadcast %o\n"
        "%r:f32[2,3] = mul %x, %b\n",
        "%r:f32[2,3] = neg %x\n%r2:f32[2,3] = neg %r\n%r3:f32[2,3] = neg %r2\n"
        "%r4:f32[2,3] = neg %r3\n",
        "%r:f32[2,3] = reshape %x\n",
        "%r:f32[2,3] = broadcast %x\n",
        "%r:f32[2,3] = stop_gradient %x\n",
        "%r:f32[2,3] = permute %x {perm=[0,1]}\n",
        "%p:f32[3,2] = permute %x {perm=[1,0]}\n%r:f32[3,2] = permute %p {perm=[0,1]}\n"
        "%q:f32[2,3] = permute %r {perm=[1,0]}\n",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char in[1024];
        /* the case's last defined value is the output */
        const char *def = cases[i] + strlen(cases[i]) - 1;
        while (def > cases[i] && def[-1] != '\n')
            def--;
        char name[16];
        sscanf(def, "%%%15[^:]", name);
        snprintf(in, sizeof in, "%s%soutput \"r\" %%%s\n", X_IN, cases[i], name);
        /* (the last case: a permute and its inverse compose to the identity) */
        check(in, X_IN "output \"r\" %x\n");
    }
    /* permute(permute(x)) is one permute by the composition */
    check("kiln-ir v1\n%x:f32[2,3,4] = input \"x\"\n"
          "%p:f32[3,4,2] = permute %x {perm=[1,2,0]}\n"
          "%q:f32[4,2,3] = permute %p {perm=[1,2,0]}\noutput \"r\" %q\n",
          "kiln-ir v1\n%x:f32[2,3,4] = input \"x\"\n"
          "%q:f32[4,2,3] = permute %x {perm=[2,0,1]}\noutput \"r\" %q\n");
}

/* x*0, 0-x, 1/x and x+1 are not identities */
static void test_not_identities(void **state)
{
    (void)state;
    static const char *cases[] = {
        "%c:f32[2,3] = const {value=0}\n%r:f32[2,3] = mul %x, %c\n",
        "%c:f32[2,3] = const {value=0}\n%r:f32[2,3] = sub %c, %x\n",
        "%c:f32[2,3] = const {value=1}\n%r:f32[2,3] = div %c, %x\n",
        "%c:f32[2,3] = const {value=1}\n%r:f32[2,3] = add %x, %c\n",
        "%c:f32[2,3] = const {value=1}\n%r:f32[2,3] = pow %x, %c\n",
        "%r:f32[2,3] = neg %x\n",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char in[1024];
        snprintf(in, sizeof in, "%s%soutput \"r\" %%r\n", X_IN, cases[i]);
        check(in, in);
    }
}

/* ---- CSE ----------------------------------------------------------------- */

static void test_cse_attributes(void **state)
{
    (void)state;
    const char *in = "kiln-ir v1\n"
                     "%x:f32[4,4] = input \"x\"\n"
                     "%a:f32[1,4] = reduce_sum %x {axes=[0]}\n"
                     "%b:f32[4,1] = reduce_sum %x {axes=[1]}\n"
                     "%c:f32[4,1] = reduce_max %x {axes=[1]}\n"
                     "%d:f32[4,4] = matmul %x, %x {ta=0,tb=0}\n"
                     "%e:f32[4,4] = matmul %x, %x {ta=1,tb=0}\n"
                     "%f:f32[4,4] = matmul %x, %x {ta=0,tb=1}\n"
                     "%g:f32[2,4] = slice %x {start=[0,0]}\n"
                     "%h:f32[2,4] = slice %x {start=[2,0]}\n"
                     "%i:f32[16] = reshape %x\n"
                     "%j:f32[2,8] = reshape %x\n"
                     "%k:bf16[4,4] = cast %x\n"
                     "%l:f16[4,4] = cast %x\n"
                     "output \"a\" %a\noutput \"b\" %b\noutput \"c\" %c\noutput \"d\" %d\n"
                     "output \"e\" %e\noutput \"f\" %f\noutput \"g\" %g\noutput \"h\" %h\n"
                     "output \"i\" %i\noutput \"j\" %j\noutput \"k\" %k\noutput \"l\" %l\n";
    check(in, in);
}

/* random and collective ops are never merged, nor a recomputation with the
 * value it recomputes */
static void test_cse_never(void **state)
{
    (void)state;
    const char *in = "kiln-ir v1\n"
                     "%x:f32[4] = input \"x\"\n"
                     "%r1:f32[4] = random {key=1}\n"
                     "%r2:f32[4] = random {key=1}\n"
                     "%r3:f32[4] = random {key=2}\n"
                     "%a1:f32[4] = allreduce %x\n"
                     "%a2:f32[4] = allreduce %x\n"
                     "%e1:f32[4] = exp %x\n"
                     "%e2:f32[4] = exp %x !recompute\n"
                     "output \"r1\" %r1\noutput \"r2\" %r2\noutput \"r3\" %r3\n"
                     "output \"a1\" %a1\noutput \"a2\" %a2\n"
                     "output \"e1\" %e1\noutput \"e2\" %e2\n";
    check(in, in);
}

/* simplify keeps the meaning: interpreter results before and after agree */
static void test_preserves_values(void **state)
{
    (void)state;
    const char *text = "kiln-ir v1\n"
                       "%x:f32[2,3] = input \"x\"\n"
                       "%one:f32[] = const {value=1}\n"
                       "%ob:f32[2,3] = broadcast %one\n"
                       "%a:f32[2,3] = mul %x, %ob\n"
                       "%b:f32[2,3] = exp %a\n"
                       "%c:f32[2,3] = exp %x\n"
                       "%d:f32[2,3] = add %b, %c\n"
                       "%e:f32[3,2] = permute %d {perm=[1,0]}\n"
                       "%f:f32[6] = reshape %e\n"
                       "%g:f32[3,2] = reshape %f\n"
                       "%h:f32[3,2] = neg %g\n"
                       "%i:f32[3,2] = neg %h\n"
                       "output \"i\" %i\n";
    Graph *g0 = parse_or_fail(text), *g1 = parse_or_fail(text);
    simplify_ok(g1);
    assert_true(g1->ops.n < g0->ops.n);
    double xs[6] = {0.5, -1, 2, 0.25, -0.75, 3};
    double r[2][6];
    Graph *gs[2] = {g0, g1};
    for (int k = 0; k < 2; k++) {
        double **val = ir_interp_alloc(gs[k]);
        int x = ir_find_tensor(gs[k], "x");
        val[x] = xmalloc(sizeof xs);
        memcpy(val[x], xs, sizeof xs);
        ir_interp(gs[k], val, NULL);
        memcpy(r[k], val[ir_find_output(gs[k], "i")], sizeof r[k]);
        ir_interp_free(gs[k], val);
    }
    assert_true(rel_err(r[1], r[0], 6) < 1e-15);
    ir_free(g0);
    ir_free(g1);
}

/* A large graph: many layers of the same small pattern, with duplicates to
 * merge and dead code to drop. Prints the time (no test asserts a time). */
static void test_large_graph(void **state)
{
    (void)state;
    const SrcLoc loc = {NULL, 0};
    Graph *g = ir_new();
    int64_t d[2] = {64, 64};
    Shape s = shape_make(DT_F32, 2, d);
    int x = ir_add_input(g, TK_INPUT, "x", s, (ParamInit){0});
    int layers = 4000;
    for (int l = 0; l < layers; l++) {
        char nm[32];
        snprintf(nm, sizeof nm, "w%d", l);
        int w = ir_add_input(g, TK_PARAM, nm, s, (ParamInit){0});
        int a = ir_op_x(g, OP_MUL, (int[]){x, w}, 2, NULL, loc);
        int b = ir_op_x(g, OP_MUL, (int[]){w, x}, 2, NULL, loc); /* duplicate of a */
        int one = ir_op_x(g, OP_CONST, NULL, 0, &(OpAttr){.f = 1, .rank = 2, .shape = {64, 64}}, loc);
        int c = ir_op_x(g, OP_MUL, (int[]){b, one}, 2, NULL, loc);
        int e = ir_op_x(g, OP_EXP, &a, 1, NULL, loc);
        int f = ir_op_x(g, OP_EXP, &c, 1, NULL, loc); /* duplicate of e after rewrites */
        ir_op_x(g, OP_TANH, &f, 1, NULL, loc);          /* dead */
        x = ir_op_x(g, OP_ADD, (int[]){e, f}, 2, NULL, loc);
    }
    ir_add_output(g, "loss", x);
    int before = g->ops.n;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    simplify_ok(g);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = 1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec);
    print_message("simplify: %d ops -> %d ops in %.1f ms\n", before, g->ops.n, ms);
    /* per layer: one mul, one exp, one add survive */
    assert_int_equal(g->ops.n, 3 * layers);
    ir_free(g);
}

/* A training step (forward, autodiff, optimizer) of a deep tanh MLP: simplify
 * must leave every output and update value unchanged; the big version is
 * timed (printed, not asserted). */
static Graph *mlp_step(int layers, int64_t n)
{
    const SrcLoc loc = {"mlp.lua", 1};
    Graph *g = ir_new();
    Shape s = shape_make(DT_F32, 2, (int64_t[]){n, n});
    Shape sb = shape_make(DT_F32, 1, (int64_t[]){n});
    int h = ir_add_input(g, TK_INPUT, "x", s, (ParamInit){0});
    for (int l = 0; l < layers; l++) {
        char nm[32];
        snprintf(nm, sizeof nm, "w%d", l);
        int w = ir_add_input(g, TK_PARAM, nm, s, (ParamInit){.kind = INIT_NORMAL, .a = 0.5});
        snprintf(nm, sizeof nm, "b%d", l);
        int b = ir_add_input(g, TK_PARAM, nm, sb, (ParamInit){.kind = INIT_ZEROS});
        int y = ir_op_x(g, OP_MATMUL, (int[]){h, w}, 2, &(OpAttr){.nia = 2}, loc);
        OpAttr bc = {.rank = 2, .shape = {n, n}};
        int bb = ir_op_x(g, OP_BROADCAST, &b, 1, &bc, loc);
        y = ir_op_x(g, OP_ADD, (int[]){y, bb}, 2, NULL, loc);
        h = ir_op_x(g, OP_TANH, &y, 1, NULL, loc);
    }
    int sq = ir_op_x(g, OP_MUL, (int[]){h, h}, 2, NULL, loc);
    int r = ir_op_x(g, OP_REDUCE_SUM, &sq, 1, &(OpAttr){.nia = 2, .ia = {0, 1}}, loc);
    int loss = ir_op_x(g, OP_RESHAPE, &r, 1, &(OpAttr){.rank = 0}, loc);
    ir_add_output(g, "loss", loss);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    if (!pass_autodiff(g, &o, &d) || !pass_optimizer(g, &o, &d))
        fail_msg("building the step: %s", d.msg);
    return g;
}

static void test_training_step(void **state)
{
    (void)state;
    Graph *g0 = mlp_step(3, 4), *g1 = ir_clone(g0);
    simplify_ok(g1);
    double **v[2] = {ir_interp_alloc(g0), ir_interp_alloc(g1)};
    Graph *gs[2] = {g0, g1};
    for (int k = 0; k < 2; k++) {
        Graph *g = gs[k];
        for (int i = 0; i < g->t.n; i++) {
            const Tensor *t = &g->t.v[i];
            if (t->op >= 0)
                continue;
            int64_t n = shape_numel(&t->s);
            v[k][i] = xcalloc((size_t)n, sizeof(double));
            uint64_t seed = hash_bytes(t->name, strlen(t->name), 0);
            for (int64_t j = 0; j < n && t->kind != TK_STATE; j++)
                v[k][i][j] = ir_rand_u01(seed, 0, 0, (uint64_t)j) - 0.5;
        }
        ir_interp(g, v[k], NULL);
    }
    assert_int_equal(g0->outs.n, g1->outs.n);
    for (int i = 0; i < g0->outs.n; i++) {
        int a = g0->outs.v[i].t, b = ir_find_output(g1, g0->outs.v[i].name);
        assert_true(b >= 0);
        int64_t n = shape_numel(&g0->t.v[a].s);
        double e = rel_err(v[1][b], v[0][a], n);
        if (!(e < 1e-12))
            fail_msg("output %s: rel err %g", g0->outs.v[i].name, e);
    }
    assert_int_equal(g0->upd.n, g1->upd.n);
    for (int i = 0; i < g0->upd.n; i++) {
        const char *nm = g0->t.v[g0->upd.v[i].target].name;
        int a = g0->upd.v[i].value, b = -1;
        for (int j = 0; j < g1->upd.n; j++)
            if (g1->t.v[g1->upd.v[j].target].name == nm)
                b = g1->upd.v[j].value;
        assert_true(b >= 0);
        double e = rel_err(v[1][b], v[0][a], shape_numel(&g0->t.v[a].s));
        if (!(e < 1e-12))
            fail_msg("update of %s: rel err %g", nm, e);
    }
    ir_interp_free(g0, v[0]);
    ir_interp_free(g1, v[1]);
    ir_free(g0);
    ir_free(g1);

    Graph *big = mlp_step(1000, 64);
    int before = big->ops.n;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    simplify_ok(big);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = 1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec);
    print_message("simplify of a training step: %d ops -> %d ops in %.1f ms\n", before,
                  big->ops.n, ms);
    ir_free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fold_rounds_to_dtype),
        cmocka_unit_test(test_identity_binary),
        cmocka_unit_test(test_not_identities),
        cmocka_unit_test(test_cse_attributes),
        cmocka_unit_test(test_cse_never),
        cmocka_unit_test(test_preserves_values),
        cmocka_unit_test(test_large_graph),
        cmocka_unit_test(test_training_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
