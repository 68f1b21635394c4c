/* test_fuse.c - the fuse pass on IR text (one test per fusion pattern, and
 * that a tensor read outside its group stays in memory), the fused step of
 * every model in models/ against the reference interpreter with and without
 * fusion, the compile summary's counts, and that the fuse pass and codegen
 * judge a group's lowerability by one check (pass_fuse_lowers). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

/* ---- IR-text pattern tests ------------------------------------------------ */

static Graph *fused(const char *text)
{
    Graph *g = parse_or_fail(text);
    PassOpts po;
    pass_opts_default(&po);
    Diag d = {{0}};
    if (!pass_fuse(g, &po, &d))
        fail_msg("fuse: %s", d.msg);
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("verify after fuse: %s", err);
    /* the text form keeps the groups */
    char *s = ir_print_str(g);
    Graph *r = parse_or_fail(s);
    assert_int_equal(r->ops.n, g->ops.n);
    for (int i = 0; i < g->ops.n; i++)
        assert_int_equal(r->ops.v[i].group, g->ops.v[i].group);
    ir_free(r);
    free(s);
    return g;
}

/* Groups that contain at least one op of any kind (kernels + lone ops),
 * not counting reshapes (views). */
static int nkernels(const Graph *g)
{
    FuseStats s;
    pass_fuse_stats(g, &s);
    return s.kernels + s.gemms;
}

/* Number of computed tensors written to memory. */
static int nmat_temps(const Graph *g)
{
    bool *m = pass_fuse_materialised(g);
    int n = 0;
    for (int t = 0; t < g->t.n; t++)
        if (m[t] && g->t.v[t].op >= 0 && g->ops.v[g->t.v[t].op].code != OP_RESHAPE)
            n++;
    free(m);
    return n;
}

static int op_group(const Graph *g, int code, int nth)
{
    for (int i = 0; i < g->ops.n; i++)
        if ((int)g->ops.v[i].code == code && nth-- == 0)
            return g->ops.v[i].group;
    fail_msg("no op %s #%d", ir_opinfo[code].name, nth);
    return -2;
}

static void test_elementwise_chain(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 C=8\n"
                     "%0:f32[N,C] = input \"x\"\n"
                     "%1:f32[N,C] = input \"y\"\n"
                     "%2:f32[N,C] = add %0, %1\n"
                     "%3:f32[N,C] = exp %2\n"
                     "%4:f32[N,C] = const {value=2}\n"
                     "%5:f32[N,C] = mul %3, %4\n"
                     "%6:f32[N,C] = mul %5, %0\n"
                     "output \"out\" %6\n");
    assert_int_equal(nkernels(g), 1);
    assert_true(g->ops.v[0].group >= 0);
    assert_int_equal(nmat_temps(g), 1); /* only the output */
    ir_free(g);
}

/* One kernel writing two tensors that share their inputs. */
static void test_multi_output(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 C=8\n"
                     "%0:f32[N,C] = input \"x\"\n"
                     "%1:f32[N,C] = input \"y\"\n"
                     "%2:f32[N,C] = add %0, %1\n"
                     "%3:f32[N,C] = exp %2\n"
                     "%4:f32[N,C] = neg %2\n"
                     "%5:f32[N,C] = mul %0, %1\n"
                     "output \"a\" %3\n"
                     "output \"b\" %4\n"
                     "output \"c\" %5\n");
    assert_int_equal(nkernels(g), 1);
    assert_int_equal(nmat_temps(g), 3);
    ir_free(g);
}

/* Broadcasting: a bias row broadcast inside the consumer's kernel; the
 * broadcast result is never written. */
static void test_broadcast(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 C=8\n"
                     "%0:f32[N,C] = input \"x\"\n"
                     "%1:f32[C] = param \"b\" zeros\n"
                     "%2:f32[N,C] = broadcast %1\n"
                     "%3:f32[N,C] = add %0, %2\n"
                     "%4:f32[N,C] = tanh %3\n"
                     "%5:f32[N,C] = mul %0, %2\n"
                     "output \"a\" %4\n"
                     "output \"m\" %5\n");
    assert_int_equal(nkernels(g), 1);
    assert_int_equal(nmat_temps(g), 2);
    ir_free(g);
}

static const char softmax_fb[] =
    "kiln-ir v1\n"
    "sym N=4 C=8\n"
    "%0:f32[N,C] = input \"x\"\n"
    "%1:f32[N,C] = input \"dy\"\n"
    "%2:f32[N,1] = reduce_max %0 {axes=[1]}\n"
    "%3:f32[N,C] = broadcast %2\n"
    "%4:f32[N,C] = sub %0, %3\n"
    "%5:f32[N,C] = exp %4\n"
    "%6:f32[N,1] = reduce_sum %5 {axes=[1]}\n"
    "%7:f32[N,C] = broadcast %6\n"
    "%8:f32[N,C] = div %5, %7\n"
    /* backward: dx = y * (dy - sum(dy * y)) */
    "%9:f32[N,C] = mul %1, %8 !backward\n"
    "%10:f32[N,1] = reduce_sum %9 {axes=[1]} !backward\n"
    "%11:f32[N,C] = broadcast %10 !backward\n"
    "%12:f32[N,C] = sub %1, %11 !backward\n"
    "%13:f32[N,C] = mul %8, %12 !backward\n"
    "output \"y\" %8\n"
    "output \"dx\" %13\n";

/* Softmax forward and backward, max subtracted: one row kernel. */
static void test_softmax(void **state)
{
    (void)state;
    Graph *g = fused(softmax_fb);
    assert_int_equal(nkernels(g), 1);
    assert_int_equal(nmat_temps(g), 2);
    ir_free(g);
}

/* LayerNorm forward as the nn library writes it: one kernel; only the
 * output and what backward needs (here: nothing) are written. */
static void test_layernorm(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 C=8\n"
                     "%0:f32[N,C] = input \"x\"\n"
                     "%1:f32[C] = param \"w\" ones\n"
                     "%2:f32[C] = param \"b\" zeros\n"
                     "%3:f32[N,1] = reduce_sum %0 {axes=[1]}\n"
                     "%4:f32[N,1] = const {value=0.125}\n"
                     "%5:f32[N,1] = mul %3, %4\n"
                     "%6:f32[N,C] = broadcast %5\n"
                     "%7:f32[N,C] = sub %0, %6\n"
                     "%8:f32[N,C] = mul %7, %7\n"
                     "%9:f32[N,1] = reduce_sum %8 {axes=[1]}\n"
                     "%10:f32[N,1] = mul %9, %4\n"
                     "%11:f32[N,1] = const {value=1e-05}\n"
                     "%12:f32[N,1] = add %10, %11\n"
                     "%13:f32[N,1] = rsqrt %12\n"
                     "%14:f32[N,C] = broadcast %13\n"
                     "%15:f32[N,C] = mul %7, %14\n"
                     "%16:f32[N,C] = broadcast %1\n"
                     "%17:f32[N,C] = mul %15, %16\n"
                     "%18:f32[N,C] = broadcast %2\n"
                     "%19:f32[N,C] = add %17, %18\n"
                     "output \"y\" %19\n"
                     "output \"rstd\" %13\n");
    assert_int_equal(nkernels(g), 1);
    assert_int_equal(nmat_temps(g), 2); /* y and the per-row rstd */
    ir_free(g);
}

/* RMSNorm: sum of squares, rsqrt, scale. */
static void test_rmsnorm(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 C=8\n"
                     "%0:f32[N,C] = input \"x\"\n"
                     "%1:f32[C] = param \"w\" ones\n"
                     "%2:f32[N,C] = mul %0, %0\n"
                     "%3:f32[N,1] = reduce_sum %2 {axes=[1]}\n"
                     "%4:f32[N,1] = const {value=0.125}\n"
                     "%5:f32[N,1] = mul %3, %4\n"
                     "%6:f32[N,1] = const {value=1e-06}\n"
                     "%7:f32[N,1] = add %5, %6\n"
                     "%8:f32[N,1] = rsqrt %7\n"
                     "%9:f32[N,C] = broadcast %8\n"
                     "%10:f32[N,C] = mul %0, %9\n"
                     "%11:f32[N,C] = broadcast %1\n"
                     "%12:f32[N,C] = mul %10, %11\n"
                     "output \"y\" %12\n");
    assert_int_equal(nkernels(g), 1);
    assert_int_equal(nmat_temps(g), 1);
    ir_free(g);
}

/* Cross-entropy forward (log-softmax, pick the target, mean) and the
 * gradient of the logits: the per-row part is one kernel over the logits
 * (max, sum, picked value, backward sums and dlogits), the mean over rows a
 * second one. */
static void test_cross_entropy(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 V=16\n"
                     "%0:f32[N,V] = input \"logits\"\n"
                     "%1:i32[N] = input \"targets\"\n"
                     "%2:f32[N,1] = reduce_max %0 {axes=[1]}\n"
                     "%3:f32[N,V] = broadcast %2\n"
                     "%4:f32[N,V] = sub %0, %3\n"
                     "%5:f32[N,V] = exp %4\n"
                     "%6:f32[N,1] = reduce_sum %5 {axes=[1]}\n"
                     "%7:f32[N,1] = log %6\n"
                     "%8:f32[N,V] = broadcast %7\n"
                     "%9:f32[N,V] = sub %4, %8\n"
                     "%10:i32[N,V] = iota {axis=1}\n"
                     "%11:i32[N,1] = reshape %1\n"
                     "%12:i32[N,V] = broadcast %11\n"
                     "%13:u8[N,V] = eq %10, %12\n"
                     "%14:f32[N,V] = const {value=0}\n"
                     "%15:f32[N,V] = select %13, %9, %14\n"
                     "%16:f32[N,1] = reduce_sum %15 {axes=[1]}\n"
                     "%17:f32[N] = reshape %16\n"
                     "%18:f32[N] = neg %17\n"
                     "%19:f32[1] = reduce_sum %18 {axes=[0]}\n"
                     "%20:f32[1] = const {value=0.25}\n"
                     "%21:f32[1] = mul %19, %20\n"
                     "%22:f32[] = reshape %21\n"
                     /* d logits = (softmax - onehot) / N */
                     "%23:f32[N,V] = const {value=0.25} !backward\n"
                     "%25:f32[N,V] = broadcast %6 !backward\n"
                     "%26:f32[N,V] = div %5, %25 !backward\n"
                     "%27:f32[N,V] = const {value=1} !backward\n"
                     "%28:f32[N,V] = select %13, %27, %14 !backward\n"
                     "%29:f32[N,V] = sub %26, %28 !backward\n"
                     "%30:f32[N,V] = mul %29, %23 !backward\n"
                     "output \"loss\" %22\n"
                     "output \"dlogits\" %30\n");
    int row = op_group(g, OP_REDUCE_MAX, 0);
    assert_true(row >= 0);
    assert_int_equal(op_group(g, OP_SUB, 2), row); /* the backward subtraction */
    assert_int_equal(nkernels(g), 2);
    ir_free(g);
}

/* Reductions over leading axes (bias and LayerNorm weight gradients): one
 * column kernel that reads dy once and never writes dy * xhat. */
static void test_column_reductions(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym B=2 T=4 C=8\n"
                     "%0:f32[B,T,C] = input \"dy\"\n"
                     "%1:f32[B,T,C] = input \"xhat\"\n"
                     "%2:f32[1,1,C] = reduce_sum %0 {axes=[0,1]} !backward\n"
                     "%3:f32[C] = reshape %2 !backward\n"
                     "%4:f32[B,T,C] = mul %0, %1 !backward\n"
                     "%5:f32[1,1,C] = reduce_sum %4 {axes=[0,1]} !backward\n"
                     "%6:f32[C] = reshape %5 !backward\n"
                     "output \"grad.b\" %3\n"
                     "output \"grad.w\" %6\n");
    assert_int_equal(nkernels(g), 1);
    assert_int_equal(nmat_temps(g), 2); /* the two [1,1,C] sums */
    PassOpts po;
    pass_opts_default(&po);
    Diag d = {{0}};
    assert_true(pass_schedule(g, &po, &d));
    CgPlan *p = cg_plan(g, &d);
    assert_non_null(p);
    /* the C printer walks rows outermost: accumulator arrays */
    assert_non_null(strstr(p->source, "A0["));
    cg_plan_free(p);
    ir_free(g);
}

/* GEMM epilogue: bias add and GELU after the matmul, in the GEMM's group;
 * the pre-activation stays in memory because backward reads it. */
static void test_gemm_epilogue(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 C=8 F=16\n"
                     "%0:f32[N,C] = input \"x\"\n"
                     "%1:f32[C,F] = param \"w\" ones\n"
                     "%2:f32[F] = param \"b\" zeros\n"
                     "%3:f32[N,F] = input \"dy\"\n"
                     "%4:f32[N,F] = matmul %0, %1 {ta=0,tb=0}\n"
                     "%5:f32[N,F] = broadcast %2\n"
                     "%6:f32[N,F] = add %4, %5\n"
                     "%7:f32[N,F] = const {value=0.5}\n"
                     "%8:f32[N,F] = mul %7, %6\n"
                     "%9:f32[N,F] = tanh %6\n"
                     "%10:f32[N,F] = const {value=1}\n"
                     "%11:f32[N,F] = add %10, %9\n"
                     "%12:f32[N,F] = mul %8, %11\n"
                     "%13:f32[N,F] = mul %3, %6 !backward\n"
                     "%14:f32[N,C] = matmul %12, %1 {ta=0,tb=1}\n"
                     "output \"y\" %14\n"
                     "output \"d\" %13\n");
    int gm = op_group(g, OP_MATMUL, 0);
    assert_true(gm >= 0);
    assert_int_equal(op_group(g, OP_TANH, 0), gm);
    assert_int_equal(op_group(g, OP_ADD, 0), gm);
    bool *m = pass_fuse_materialised(g);
    /* the pre-activation (read by the backward mul, which fused elsewhere or
     * here) and the activation (a GEMM operand) */
    int act = -1;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_MATMUL && g->ops.v[i].attr.ia[1])
            act = g->ops.v[i].in[0];
    assert_true(act >= 0 && m[act]);
    free(m);
    ir_free(g);
}

/* A tensor read outside its group stays materialised, and an expensive op
 * is never duplicated: the reduction read by two groups exists once. */
static void test_needed_outside(void **state)
{
    (void)state;
    Graph *g = fused("kiln-ir v1\n"
                     "sym N=4 C=8\n"
                     "%0:f32[N,C] = input \"x\"\n"
                     "%1:f32[C,C] = param \"w\" ones\n"
                     "%2:f32[N,C] = exp %0\n"
                     "%3:f32[N,C] = add %2, %0\n"
                     "%4:f32[N,C] = matmul %2, %1 {ta=0,tb=0}\n"
                     "%5:f32[N,1] = reduce_sum %3 {axes=[1]}\n"
                     "%6:f32[N,C] = broadcast %5\n"
                     "%7:f32[N,C] = mul %4, %6\n"
                     "output \"a\" %7\n"
                     "output \"b\" %3\n");
    bool *m = pass_fuse_materialised(g);
    int e = -1;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_EXP)
            e = g->ops.v[i].out;
    assert_true(e >= 0 && m[e]); /* the matmul reads it */
    int nred = 0;
    for (int i = 0; i < g->ops.n; i++)
        nred += g->ops.v[i].code == OP_REDUCE_SUM;
    assert_int_equal(nred, 1);
    free(m);
    ir_free(g);
}

/* The AdamW update of every parameter: one multi-tensor group. */
static void test_adamw_multi_tensor(void **state)
{
    (void)state;
    Graph *g = parse_or_fail("kiln-ir v1\n"
                             "sym N=4 C=8\n"
                             "%0:f32[N,C] = input \"x\"\n"
                             "%1:f32[C,C] = param \"w1\" normal(0.02)\n"
                             "%2:f32[C] = param \"b1\" zeros\n"
                             "%3:f32[C,C] = param \"w2\" normal(0.02)\n"
                             "%4:f32[N,C] = matmul %0, %1 {ta=0,tb=0}\n"
                             "%5:f32[N,C] = broadcast %2\n"
                             "%6:f32[N,C] = add %4, %5\n"
                             "%7:f32[N,C] = tanh %6\n"
                             "%8:f32[N,C] = matmul %7, %3 {ta=0,tb=0}\n"
                             "%9:f32[N,C] = mul %8, %8\n"
                             "%10:f32[1,1] = reduce_sum %9 {axes=[0,1]}\n"
                             "%11:f32[] = reshape %10\n"
                             "output \"loss\" %11\n");
    PassOpts po;
    pass_opts_default(&po);
    Diag d = {{0}};
    if (!pass_autodiff(g, &po, &d) || !pass_optimizer(g, &po, &d) ||
        !pass_simplify(g, &po, &d) || !pass_fuse(g, &po, &d))
        fail_msg("%s", d.msg);
    /* every op that produces an update value is in one group */
    int gu = -2;
    for (int u = 0; u < g->upd.n; u++) {
        const Tensor *v = &g->t.v[g->upd.v[u].value];
        const Tensor *tg = &g->t.v[g->upd.v[u].target];
        if (tg->s.rank == 0)
            continue; /* the step counter */
        int gr = g->ops.v[v->op].group;
        assert_true(gr >= 0);
        if (gu == -2)
            gu = gr;
        assert_int_equal(gr, gu);
    }
    ir_free(g);
}

/* ---- models: fused and unfused steps against the interpreter ------------- */

static uint64_t rng = 777;
static double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
    const char *name;
    DType dt;
    int64_t n;
    void *host;
} NamedIn;

static Graph *build(const char *path, const char *const *sets, int nsets, bool no_fuse)
{
    Model *m = load_model(path, sets, nsets);
    PassOpts po;
    rt_pass_opts(&m->train, NULL, &po);
    po.no_fuse = no_fuse;
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("%s: pipeline: %s", path, d.msg);
    Graph *g = ir_clone(m->g);
    fe_model_free(m);
    return g;
}

static double *f32_to_double(const float *p, int64_t n)
{
    double *r = xmalloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        r[i] = p[i];
    return r;
}

/* Runs graph g (fused or not) for two steps on the CPU backend from the same
 * named inputs as the interpreter got, and compares the "loss" and "grad."
 * outputs and every float update target with the interpreter's. */
static void compare_exec(const char *path, const Graph *g, const Graph *ref, double **rval1,
                         double **rval2, NamedIn *ins, int nins, int threads)
{
    ExecOpts eo = {.threads = threads};
    Diag d = {{0}};
    Exec *e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("%s: exec: %s", path, d.msg);
    for (int i = 0; i < nins; i++) {
        int t = ir_find_tensor(g, ins[i].name);
        if (t >= 0)
            rt_exec_write(e, t, ins[i].host);
    }
    for (int step = 0; step < 2; step++) {
        if (!rt_exec_run(e, 1, step, &d))
            fail_msg("%s: run: %s", path, d.msg);
        double **rv = step ? rval2 : rval1;
        for (int k = 0; k < ref->outs.n; k++) {
            const char *on = ref->outs.v[k].name;
            if (strcmp(on, "loss") != 0 && strncmp(on, "grad.", 5) != 0)
                continue;
            int rt = ref->outs.v[k].t, t = ir_find_output(g, on);
            assert_true(t >= 0);
            int64_t n = shape_numel(&g->t.v[t].s);
            float *got = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
            rt_exec_read(e, t, got);
            double *gd = f32_to_double(got, n);
            double re = rel_err(gd, rv[rt], n);
            if (!(re < 1e-4))
                fail_msg("%s step %d output %s: relative error %g", path, step, on, re);
            free(gd);
            free(got);
        }
        for (int u = 0; u < ref->upd.n; u++) {
            const Tensor *x = &ref->t.v[ref->upd.v[u].target];
            if (x->s.dtype != DT_F32)
                continue;
            int t = ir_find_tensor(g, x->name);
            int64_t n = shape_numel(&x->s);
            float *got = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
            rt_exec_read(e, t, got);
            double *gd = f32_to_double(got, n);
            double re = rel_err(gd, rv[ref->upd.v[u].value], n);
            if (!(re < 1e-4))
                fail_msg("%s step %d update of %s: relative error %g", path, step, x->name, re);
            free(gd);
            free(got);
        }
    }
    rt_exec_destroy(e);
}

/* A model (with --set overrides) fused and not, on the CPU backend with 1
 * and 2 threads, against the interpreter over two steps. */
static void check_model(const char *path, const char *const *sets, int nsets)
{
    Graph *ref = build(path, sets, nsets, true), *fg = build(path, sets, nsets, false);
    /* fusion happened, and moved fewer bytes */
    FuseStats a, b;
    pass_fuse_stats(ref, &b);
    pass_fuse_stats(fg, &a);
    fprintf(stderr, "%s: kernels %d -> %d, bytes %.0f -> %.0f\n", path, b.kernels,
            a.kernels, b.bytes, a.bytes);
    assert_true(a.kernels < b.kernels);
    assert_true(a.bytes < b.bytes);
    /* named inputs */
    NamedIn ins[512];
    int nins = 0;
    double **val = ir_interp_alloc(ref);
    for (int t = 0; t < ref->t.n; t++) {
        const Tensor *x = &ref->t.v[t];
        if (x->op >= 0)
            continue;
        assert_true(nins < 512);
        int64_t n = shape_numel(&x->s);
        NamedIn *in = &ins[nins++];
        in->name = x->name;
        in->dt = x->s.dtype;
        in->n = n;
        in->host = xmalloc((size_t)(n ? n : 1) * (size_t)dtype_size(x->s.dtype));
        val[t] = xmalloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) {
            if (x->s.dtype == DT_F32) {
                float f = x->kind == TK_PARAM                ? (float)(0.6 * urand() - 0.3)
                          : x->kind == TK_STATE              ? 0.0f
                          : strcmp(x->name, "lr") == 0       ? 1e-3f
                                                             : (float)urand();
                ((float *)in->host)[i] = f;
                val[t][i] = f;
            } else if (x->s.dtype == DT_I32) {
                int32_t v = (int32_t)(urand() * 8);
                ((int32_t *)in->host)[i] = v;
                val[t][i] = v;
            } else {
                fail_msg("%s: input dtype %s", path, dtype_name(x->s.dtype));
            }
        }
    }
    /* the interpreter: two steps */
    InterpOpts io = {.seed = 1, .step = 0};
    ir_interp(ref, val, &io);
    double **val2 = ir_interp_alloc(ref);
    for (int t = 0; t < ref->t.n; t++)
        if (ref->t.v[t].op < 0) {
            int64_t n = shape_numel(&ref->t.v[t].s);
            val2[t] = xmalloc(sizeof(double) * (size_t)(n ? n : 1));
            memcpy(val2[t], val[t], sizeof(double) * (size_t)n);
        }
    /* the second step starts from the first step's updates */
    for (int u = 0; u < ref->upd.n; u++) {
        int T = ref->upd.v[u].target, V = ref->upd.v[u].value;
        memcpy(val2[T], val[V], sizeof(double) * (size_t)shape_numel(&ref->t.v[T].s));
    }
    io.step = 1;
    ir_interp(ref, val2, &io);
    compare_exec(path, ref, ref, val, val2, ins, nins, 2);
    compare_exec(path, fg, ref, val, val2, ins, nins, 2);
    compare_exec(path, fg, ref, val, val2, ins, nins, 1);
    for (int i = 0; i < nins; i++)
        free(ins[i].host);
    ir_interp_free(ref, val);
    ir_interp_free(ref, val2);
    ir_free(ref);
    ir_free(fg);
}

static void test_models_fused_unfused(void **state)
{
    (void)state;
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++)
        check_model(*pp, NULL, 0);
    free_model_paths(paths);
}

/* Sequences of one token: every softmax row has one element, so a row
 * kernel's row and full shapes agree (lower.c's degenerate case; its values
 * were once bound inside a fold's loop and used before it). */
static void test_models_one_token(void **state)
{
    (void)state;
    const char *one[] = {"T=1"};
    check_model("models/gpt.lua", one, 1);
    check_model("models/llama.lua", one, 1);
}

/* LayerNorm in gpt.lua's training step, its input the residual sum its
 * own kernel computes: besides its GEMM's result, the kernel writes full
 * rows of only that sum and its output (x - mean and x-hat are recomputed by the backward from the
 * sum and the per-row statistics, fuse_recompute.c), and at least one
 * such kernel writes the sum. */
static void test_layernorm_stores(void **state)
{
    (void)state;
    Model *m = load_model("models/gpt.lua", NULL, 0);
    PassOpts po;
    rt_pass_opts(&m->train, NULL, &po);
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
    Graph *g = m->g;
    bool *mat = pass_fuse_materialised(g);
    int nln = 0, with_sum = 0;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code != OP_RSQRT || op->group < 0 || (op->flags & OPF_BACKWARD))
            continue;
        int64_t row = 0;
        int full = 0;
        for (int j = 0; j < g->ops.n; j++)
            if (g->ops.v[j].group == op->group) {
                int64_t n = shape_numel(&g->t.v[g->ops.v[j].out].s);
                row = n > row ? n : row;
            }
        for (int j = 0; j < g->ops.n; j++) {
            const Op *o = &g->ops.v[j];
            if (o->group == op->group && o->code != OP_MATMUL && mat[o->out] &&
                shape_numel(&g->t.v[o->out].s) == row)
                full++; /* (the GEMM of the projection before it writes its own) */
        }
        if (full > 2)
            fail_msg("LayerNorm kernel (group %d) writes %d full tensors", op->group, full);
        with_sum += full == 2;
        nln++;
    }
    print_message("gpt.lua: %d LayerNorm forward kernels, %d of them also write the residual "
                  "sum\n", nln, with_sum);
    assert_true(nln > 0 && with_sum > 0);
    free(mat);
    fe_model_free(m);
}

/* Models whose first grouping did not lower (found with made-up models):
 * a column reduction beside values downstream of another one that other
 * kernels read (a column kernel would have had to store a full-shape
 * tensor), and a column max left in a part of its own by a sibling merge.
 * The fused step lowers and agrees with the interpreter. */
static void test_unlowerable_groups(void **state)
{
    (void)state;
    check_model("tests/data/col_store.lua", NULL, 0);
    check_model("tests/data/col_max.lua", NULL, 0);
}

/* pass_fuse_lowers, the lowerability check the fuse pass and codegen
 * share: a column group whose full-shape prologue value is needed outside
 * it (an output) does not lower, and cg_lower_group refuses it with the same
 * reason and op; without that output both accept it as one column loop. */
static void lowers(const char *extra, bool expect)
{
    char *text = xasprintf("kiln-ir v1\n"
                           "sym B=2 T=4 C=8\n"
                           "%%0:f32[B,T,C] = input \"dy\"\n"
                           "%%1:f32[B,T,C] = input \"xhat\"\n"
                           "%%2:f32[B,T,C] = mul %%0, %%1 !group=0\n"
                           "%%3:f32[1,1,C] = reduce_sum %%2 {axes=[0,1]} !group=0\n"
                           "output \"g\" %%3\n%s",
                           extra);
    Graph *g = parse_or_fail(text);
    free(text);
    bool *mat = pass_fuse_materialised(g);
    int ops[] = {0, 1}, root[2], bad = -1;
    FuseDomain dom[2];
    char err[256] = "";
    bool ok = pass_fuse_lowers(g, ops, 2, mat, root, dom, &bad, err, sizeof err);
    CgKernel *k = xcalloc(1, sizeof *k);
    Diag d = {{0}};
    bool cg = cg_lower_group(g, ops, 2, mat, k, &d);
    cg_kernel_free(k);
    assert_int_equal(ok, expect);
    assert_int_equal(cg, expect);
    if (expect) {
        assert_int_equal(root[0], root[1]);
        assert_int_equal(dom[root[0]].kind, FUSE_COL);
        assert_int_equal(dom[root[0]].k, 2);
    } else {
        assert_int_equal(bad, 0); /* the mul */
        if (!strstr(err, "column-reduction kernel") || !strstr(d.msg, err) ||
            !strstr(d.msg, "group 0 cannot be one kernel"))
            fail_msg("fuse said \"%s\", codegen \"%s\"", err, d.msg);
    }
    free(mat);
    ir_free(g);
}

static void test_lowers_shared(void **state)
{
    (void)state;
    lowers("output \"p\" %2\n", false);
    lowers("", true);
}

/* An RNN unrolled by slicing one [B,T,3H] projection per step: autodiff
 * places the slices' cotangents with concats (a tree of them past 64 steps,
 * T = 65), and the fused step agrees with the interpreter. */
static void test_sliced_rnn(void **state)
{
    (void)state;
    const char *t65[] = {"T=65"};
    check_model("tests/data/gru_slices.lua", NULL, 0);
    check_model("tests/data/gru_slices.lua", t65, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_chain),   cmocka_unit_test(test_multi_output),
        cmocka_unit_test(test_broadcast),           cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_layernorm),           cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_cross_entropy),       cmocka_unit_test(test_column_reductions),
        cmocka_unit_test(test_gemm_epilogue),       cmocka_unit_test(test_needed_outside),
        cmocka_unit_test(test_adamw_multi_tensor),  cmocka_unit_test(test_models_fused_unfused),
        cmocka_unit_test(test_models_one_token),
        cmocka_unit_test(test_unlowerable_groups),
        cmocka_unit_test(test_lowers_shared),
        cmocka_unit_test(test_sliced_rnn),
        cmocka_unit_test(test_layernorm_stores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
