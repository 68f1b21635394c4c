/* test_backend_cpu.c - the CPU backend against the reference interpreter:
 * every supported opcode on f32/i32/u8, updates, the compile cache, a forced
 * compile failure, and (when the frontend and passes are there) every model
 * in models/ after the full pipeline. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cg_cuda.h"
#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"
#include "cpu.h"

static const SrcLoc here = {"test", 1};

static uint64_t rng = 12345;
static double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static int in_t(Graph *g, TensorKind k, const char *name, DType dt, int rank, const int64_t *dim)
{
    ParamInit init = {0};
    return ir_add_input(g, k, name, shape_make(dt, rank, dim), init);
}

static int op1(Graph *g, Opcode c, int a) { return ir_op_x(g, c, &a, 1, NULL, here); }
static int op2(Graph *g, Opcode c, int a, int b)
{
    int in[2] = {a, b};
    return ir_op_x(g, c, in, 2, NULL, here);
}
static int opa(Graph *g, Opcode c, const int *in, int nin, OpAttr a)
{
    return ir_op_x(g, c, in, nin, &a, here);
}
static int cast(Graph *g, int x, DType dt)
{
    OpAttr a = {.dtype = dt};
    return opa(g, OP_CAST, &x, 1, a);
}
static int cnst(Graph *g, DType dt, double v, int rank, const int64_t *dim)
{
    OpAttr a = {.dtype = dt, .f = v, .rank = rank};
    for (int i = 0; i < rank; i++)
        a.shape[i] = dim[i];
    return opa(g, OP_CONST, NULL, 0, a);
}

/* Host values per input tensor: floats in [-1, 1); ints in [-1, 7]; u8
 * 0/1. For models: params in [-0.3, 0.3), state zero, "lr" 1e-3, float
 * data in [0, 1), ints in [0, 7]. */
static bool model_inputs;
static void **make_inputs(const Graph *g, double **val)
{
    void **host = xcalloc((size_t)g->t.n, sizeof(void *));
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        int64_t n = shape_numel(&x->s);
        val[t] = xmalloc(sizeof(double) * (size_t)(n ? n : 1));
        host[t] = xmalloc((size_t)(n ? n : 1) * (size_t)dtype_size(x->s.dtype));
        for (int64_t i = 0; i < n; i++) {
            switch (x->s.dtype) {
            case DT_F32: {
                float f = (float)(2 * urand() - 1);
                if (model_inputs)
                    f = x->kind == TK_PARAM   ? 0.3f * f
                        : x->kind == TK_STATE ? 0.0f
                        : strcmp(x->name, "lr") == 0 ? 1e-3f
                                                      : (float)urand();
                ((float *)host[t])[i] = f;
                val[t][i] = f;
                break;
            }
            case DT_I32: {
                int32_t v = (int32_t)(urand() * 9) - (model_inputs ? 0 : 1);
                if (v > 7)
                    v = 7;
                ((int32_t *)host[t])[i] = v;
                val[t][i] = v;
                break;
            }
            case DT_U8: {
                uint8_t v = urand() < 0.5;
                ((uint8_t *)host[t])[i] = v;
                val[t][i] = v;
                break;
            }
            default:
                fail_msg("test input dtype %s", dtype_name(x->s.dtype));
            }
        }
    }
    return host;
}

static double *to_double(const Tensor *x, const void *p)
{
    int64_t n = shape_numel(&x->s);
    double *r = xmalloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        switch (x->s.dtype) {
        case DT_F32: r[i] = ((const float *)p)[i]; break;
        case DT_I32: r[i] = ((const int32_t *)p)[i]; break;
        case DT_I64: r[i] = (double)((const int64_t *)p)[i]; break;
        case DT_U8: r[i] = ((const uint8_t *)p)[i]; break;
        default: fail_msg("dtype %s", dtype_name(x->s.dtype));
        }
    return r;
}

/* Runs g on the interpreter and the CPU backend (two steps, so updates
 * feed the second); checks every output and every update target. With
 * only_prefix, only outputs "loss" and those starting with it are checked. */
static void check_graph_opts(Graph *g, double tol, const char *only_prefix)
{
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("verify: %s", err);
    double **val = ir_interp_alloc(g);
    void **host = make_inputs(g, val);
    Diag d = {{0}};
    ExecOpts o = {.threads = 1};
    Exec *e = rt_exec_create(g, &o, &d);
    if (!e)
        fail_msg("rt_exec_create: %s", d.msg);
    assert_true(rt_exec_arena_bytes(e) > 0);
    for (int t = 0; t < g->t.n; t++)
        if (host[t])
            rt_exec_write(e, t, host[t]);
    for (int step = 0; step < 2; step++) {
        InterpOpts io = {.seed = 7, .step = step};
        ir_interp(g, val, &io);
        if (!rt_exec_run(e, 7, step, &d))
            fail_msg("rt_exec_run: %s", d.msg);
        for (int k = 0; k < g->outs.n; k++) {
            const Tensor *x = &g->t.v[g->outs.v[k].t];
            const char *on = g->outs.v[k].name;
            if (only_prefix && strcmp(on, "loss") != 0 &&
                strncmp(on, only_prefix, strlen(only_prefix)) != 0)
                continue;
            void *buf = xmalloc((size_t)shape_numel(&x->s) * (size_t)dtype_size(x->s.dtype) + 1);
            rt_exec_read(e, x->id, buf);
            double *got = to_double(x, buf);
            double re = rel_err(got, val[x->id], shape_numel(&x->s));
            bool exact = !dtype_is_float(x->s.dtype);
            if (exact ? re != 0 : !(re <= tol)) {
                int64_t n = shape_numel(&x->s);
                for (int64_t i = 0; i < n && i < 8; i++)
                    fprintf(stderr, "  [%lld] got %g want %g\n", (long long)i, got[i],
                            val[x->id][i]);
                fail_msg("step %d output \"%s\": relative error %g (tolerance %g)", step,
                         g->outs.v[k].name, re, exact ? 0.0 : tol);
            }
            free(got);
            free(buf);
        }
        ir_interp_apply_updates(g, val);
        for (int k = 0; k < g->upd.n; k++) {
            const Tensor *x = &g->t.v[g->upd.v[k].target];
            void *buf = xmalloc((size_t)shape_numel(&x->s) * (size_t)dtype_size(x->s.dtype) + 1);
            rt_exec_read(e, x->id, buf);
            double *got = to_double(x, buf);
            double re = rel_err(got, val[x->id], shape_numel(&x->s));
            if (!(re <= tol))
                fail_msg("step %d update of \"%s\": relative error %g", step, x->name, re);
            free(got);
            free(buf);
        }
    }
    rt_exec_destroy(e);
    for (int t = 0; t < g->t.n; t++)
        free(host[t]);
    free(host);
    ir_interp_free(g, val);
}

static void check_graph(Graph *g, double tol) { check_graph_opts(g, tol, NULL); }

static void out(Graph *g, const char *name, int t) { ir_add_output(g, name, t); }

static void test_elementwise_f32(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t dim[2] = {4, 5};
    int x = in_t(g, TK_INPUT, "x", DT_F32, 2, dim);
    int y = in_t(g, TK_INPUT, "y", DT_F32, 2, dim);
    int one = cnst(g, DT_F32, 1.0, 2, dim);
    int ax1 = op2(g, OP_ADD, op1(g, OP_ABS, x), one);
    out(g, "add", op2(g, OP_ADD, x, y));
    out(g, "sub", op2(g, OP_SUB, x, y));
    out(g, "mul", op2(g, OP_MUL, x, y));
    out(g, "div", op2(g, OP_DIV, x, ax1));
    out(g, "pow", op2(g, OP_POW, ax1, y));
    out(g, "max", op2(g, OP_MAX, x, y));
    out(g, "min", op2(g, OP_MIN, x, y));
    static const Opcode un[] = {OP_NEG, OP_EXP, OP_SIN, OP_COS, OP_TANH,
                                OP_SIGMOID, OP_RELU, OP_ABS, OP_ERF, OP_FLOOR};
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++)
        out(g, ir_opinfo[un[i]].name, op1(g, un[i], x));
    out(g, "log", op1(g, OP_LOG, ax1));
    out(g, "sqrt", op1(g, OP_SQRT, ax1));
    out(g, "rsqrt", op1(g, OP_RSQRT, ax1));
    static const Opcode cmp[] = {OP_LT, OP_LE, OP_GT, OP_GE, OP_EQ, OP_NE};
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++)
        out(g, ir_opinfo[cmp[i]].name, op2(g, cmp[i], x, i < 4 ? y : x));
    int m = op2(g, OP_LT, x, y);
    int sel[3] = {m, x, y};
    out(g, "select", ir_op_x(g, OP_SELECT, sel, 3, NULL, here));
    int big = op2(g, OP_MUL, x, cnst(g, DT_F32, 5.0, 2, dim));
    out(g, "cast_i32", cast(g, big, DT_I32));
    out(g, "cast_u8", cast(g, op1(g, OP_RELU, x), DT_U8));
    out(g, "cast_back", cast(g, cast(g, big, DT_I32), DT_F32));
    out(g, "u8_to_f32", cast(g, m, DT_F32));
    check_graph(g, 1e-6);
    ir_free(g);
}

/* The C prelude's exp and tanh (codegen/cprint.c: polynomials, not libm)
 * against the double libm over a spread of every float exponent: exp within
 * 1.5 ulp on (-87.3, 88.3) (the prelude's flush to 0 below -87.3 and inf
 * from 88.7 are its documented range), tanh within 3 ulp everywhere, odd,
 * and both right on NaN, the infinities and signed zeros. A sign slip, a
 * wrong coefficient or a lost small-|x| branch is far outside these. */
static void test_exp_tanh_ulp(void **state)
{
    (void)state;
    enum { N = 1 << 20, SPECIAL = 8 };
    Graph *g = ir_new();
    int64_t dim[1] = {N};
    int x = in_t(g, TK_INPUT, "x", DT_F32, 1, dim);
    out(g, "exp", op1(g, OP_EXP, x));
    out(g, "tanh", op1(g, OP_TANH, x));
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("verify: %s", err);
    float *in = xmalloc(sizeof(float) * N), *ex = xmalloc(sizeof(float) * N),
          *th = xmalloc(sizeof(float) * N);
    const float special[SPECIAL] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-30f, 9.0f, -40.0f};
    for (int i = 0; i < SPECIAL; i++)
        in[i] = special[i];
    /* the rest: evenly spaced finite bit patterns, each followed by its
     * negation (SPECIAL is even) */
    for (int i = SPECIAL; i < N; i++) {
        uint32_t b = (uint32_t)((uint64_t)((i - SPECIAL) / 2) * 0x7f800000u / ((N - SPECIAL) / 2));
        b |= (i & 1) ? 0x80000000u : 0;
        memcpy(&in[i], &b, 4);
    }
    Diag d = {{0}};
    ExecOpts o = {.threads = 1};
    Exec *e = rt_exec_create(g, &o, &d);
    if (!e)
        fail_msg("rt_exec_create: %s", d.msg);
    rt_exec_write(e, x, in);
    if (!rt_exec_run(e, 7, 0, &d))
        fail_msg("rt_exec_run: %s", d.msg);
    rt_exec_read(e, g->outs.v[0].t, ex);
    rt_exec_read(e, g->outs.v[1].t, th);
    assert_true(isnan(ex[0]) && isnan(th[0]));
    assert_true(ex[1] == INFINITY && th[1] == 1.0f && ex[2] == 0.0f && th[2] == -1.0f);
    assert_true(ex[3] == 1.0f && th[3] == 0.0f && !signbit(th[3]) && signbit(th[4]));
    assert_true(th[5] == 1e-30f && th[6] == 1.0f && th[7] == -1.0f && ex[7] > 0);
    double worst_e = 0, worst_t = 0;
    float at_e = 0, at_t = 0;
    for (int i = SPECIAL; i < N; i++) {
        double v = in[i], te = exp(v), tt = tanh(v);
        if (v > -87.3 && v < 88.3) {
            double u = nextafterf((float)te, INFINITY) - (float)te;
            double err_e = fabs(ex[i] - te) / u;
            if (!(err_e <= worst_e))
                worst_e = err_e, at_e = in[i];
        }
        float ft = fabsf((float)tt);
        double u = ft > 0 ? nextafterf(ft, INFINITY) - ft : 1e-45;
        double err_t = fabs(th[i] - tt) / u;
        if (!(err_t <= worst_t))
            worst_t = err_t, at_t = in[i];
        if (i & 1 && th[i] != -th[i - 1])
            fail_msg("tanh(%g) = %g but tanh(%g) = %g: not odd", in[i], th[i], in[i - 1],
                     th[i - 1]);
    }
    print_message("exp: %.2f ulp at most (at %g); tanh: %.2f ulp (at %g)\n", worst_e, at_e,
                  worst_t, at_t);
    assert_true(worst_e <= 1.5);
    assert_true(worst_t <= 3.0);
    rt_exec_destroy(e);
    free(in);
    free(ex);
    free(th);
    ir_free(g);
}

static void test_elementwise_int(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t dim[1] = {37};
    int a = in_t(g, TK_INPUT, "a", DT_I32, 1, dim);
    int b = in_t(g, TK_INPUT, "b", DT_I32, 1, dim);
    int ma = in_t(g, TK_INPUT, "ma", DT_U8, 1, dim);
    int mb = in_t(g, TK_INPUT, "mb", DT_U8, 1, dim);
    static const Opcode bin[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN,
                                 OP_LT, OP_LE, OP_GT, OP_GE, OP_EQ, OP_NE};
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++)
        out(g, ir_opinfo[bin[i]].name, op2(g, bin[i], a, b));
    out(g, "neg", op1(g, OP_NEG, a));
    out(g, "abs", op1(g, OP_ABS, a));
    out(g, "relu", op1(g, OP_RELU, a));
    static const Opcode ub[] = {OP_EQ, OP_NE, OP_MAX, OP_MIN, OP_MUL};
    for (size_t i = 0; i < sizeof ub / sizeof ub[0]; i++) {
        char n[32];
        snprintf(n, sizeof n, "u8_%s", ir_opinfo[ub[i]].name);
        out(g, n, op2(g, ub[i], ma, mb));
    }
    int sel[3] = {ma, a, b};
    out(g, "select_i32", ir_op_x(g, OP_SELECT, sel, 3, NULL, here));
    out(g, "i32_to_u8", cast(g, a, DT_U8));
    out(g, "i32_to_f32", cast(g, a, DT_F32));
    out(g, "const_i32", op2(g, OP_ADD, a, cnst(g, DT_I32, 3, 1, dim)));
    check_graph(g, 0);
    ir_free(g);
}

static void test_sources(void **state)
{
    (void)state;
    Graph *g = ir_new();
    OpAttr io = {.dtype = DT_I32, .rank = 3, .shape = {2, 3, 4}, .nia = 1, .ia = {1}};
    out(g, "iota_i32", opa(g, OP_IOTA, NULL, 0, io));
    io.dtype = DT_F32;
    io.ia[0] = 2;
    out(g, "iota_f32", opa(g, OP_IOTA, NULL, 0, io));
    int64_t d2[2] = {3, 2};
    out(g, "const_f32", cnst(g, DT_F32, -2.5, 2, d2));
    out(g, "const_scalar", cnst(g, DT_F32, 0.125, 0, NULL));
    OpAttr r = {.rank = 2, .shape = {16, 33}, .nia = 1, .ia = {42}};
    out(g, "random", opa(g, OP_RANDOM, NULL, 0, r));
    check_graph(g, 1e-7);
    ir_free(g);
}

static void test_moves(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d31[2] = {3, 1}, d4[1] = {4}, d234[3] = {2, 3, 4}, d63[2] = {6, 3},
            d24[2] = {2, 4}, d243[3] = {2, 4, 3};
    int a = in_t(g, TK_INPUT, "a", DT_F32, 2, d31);
    int v = in_t(g, TK_INPUT, "v", DT_F32, 1, d4);
    int x = in_t(g, TK_INPUT, "x", DT_F32, 3, d234);
    int tab = in_t(g, TK_INPUT, "tab", DT_F32, 2, d63);
    int idx = in_t(g, TK_INPUT, "idx", DT_I32, 2, d24);
    int src = in_t(g, TK_INPUT, "src", DT_F32, 3, d243);
    OpAttr b = {.rank = 3, .shape = {2, 3, 4}};
    out(g, "bcast_a", opa(g, OP_BROADCAST, &a, 1, b));
    out(g, "bcast_v", opa(g, OP_BROADCAST, &v, 1, b));
    OpAttr p = {.nia = 3, .ia = {2, 0, 1}};
    out(g, "permute", opa(g, OP_PERMUTE, &x, 1, p));
    OpAttr s = {.nia = 3, .ia = {1, 1, 2}, .rank = 3, .shape = {1, 2, 2}};
    out(g, "slice", opa(g, OP_SLICE, &x, 1, s));
    OpAttr pd = {.nia = 3, .ia = {0, 2, 1}, .rank = 3, .shape = {3, 6, 5}};
    out(g, "pad", opa(g, OP_PAD, &x, 1, pd));
    int c3[3] = {x, op1(g, OP_NEG, x), x};
    OpAttr ca = {.nia = 1, .ia = {1}};
    out(g, "concat", opa(g, OP_CONCAT, c3, 3, ca));
    OpAttr rs = {.rank = 2, .shape = {6, 4}};
    int rx = opa(g, OP_RESHAPE, &x, 1, rs);
    out(g, "reshape_exp", op1(g, OP_EXP, rx));
    out(g, "reshape_out", opa(g, OP_RESHAPE, &x, 1, rs));
    int gi[2] = {tab, idx};
    out(g, "gather", ir_op_x(g, OP_GATHER, gi, 2, NULL, here));
    int si[2] = {idx, src};
    OpAttr sa = {.rank = 2, .shape = {6, 3}};
    out(g, "scatter_add", opa(g, OP_SCATTER_ADD, si, 2, sa));
    /* im2col and col2im: 2d with stride, padding and dilation; 1d */
    int64_t dimg[4] = {2, 3, 7, 6}, dcol[4] = {2, 4, 2, 18}, d1[3] = {2, 3, 9};
    int img = in_t(g, TK_INPUT, "img", DT_F32, 4, dimg);
    int cols = in_t(g, TK_INPUT, "cols", DT_F32, 4, dcol);
    int x1 = in_t(g, TK_INPUT, "x1", DT_F32, 3, d1);
    OpAttr cv = {.nia = 8, .ia = {3, 2, 2, 3, 1, 0, 1, 2}};
    out(g, "im2col", opa(g, OP_IM2COL, &img, 1, cv));
    OpAttr ci = cv;
    ci.rank = 4;
    memcpy(ci.shape, dimg, sizeof dimg);
    out(g, "col2im", opa(g, OP_COL2IM, &cols, 1, ci));
    OpAttr c1 = {.nia = 4, .ia = {3, 2, 2, 1}};
    int p1 = opa(g, OP_IM2COL, &x1, 1, c1);
    out(g, "im2col_1d", p1);
    OpAttr c1b = c1;
    c1b.rank = 3;
    memcpy(c1b.shape, d1, sizeof d1);
    out(g, "col2im_1d", opa(g, OP_COL2IM, &p1, 1, c1b));
    /* kernel below the stride (image elements no window reads), padding:
     * col2im by output position */
    int64_t dimg2[4] = {1, 2, 8, 7}, dcol2[4] = {1, 3, 4, 12};
    int cols2 = in_t(g, TK_INPUT, "cols2", DT_F32, 4, dcol2);
    OpAttr c2 = {.nia = 8, .ia = {2, 3, 3, 2, 1, 1, 1, 1}, .rank = 4};
    memcpy(c2.shape, dimg2, sizeof dimg2);
    out(g, "col2im_skip", opa(g, OP_COL2IM, &cols2, 1, c2));
    check_graph(g, 1e-6);
    ir_free(g);
}

/* Out-of-range gather indices (docs/dsl.md): -1, rows, rows + 1000 and the
 * i32 extremes read zeros and never outside the table (a read at
 * INT32_MAX rows would fault); scatter_add drops them. The CPU backend and
 * the interpreter both give exactly that. */
static void test_gather_out_of_range(void **state)
{
    (void)state;
    GatherOor c;
    gather_oor_build(&c);
    Graph *g = c.g;
    double **val = ir_interp_alloc(g);
    for (int j = 0; j < 4; j++) {
        val[c.in[j]] = xmalloc(sizeof(double) * (size_t)c.len[j]);
        for (int64_t i = 0; i < c.len[j]; i++)
            val[c.in[j]][i] = j == 2 ? ((const int32_t *)c.host[j])[i]
                                     : ((const float *)c.host[j])[i];
    }
    InterpOpts io = {.seed = 7};
    ir_interp(g, val, &io);
    Diag d = {{0}};
    ExecOpts o = {.threads = 1};
    Exec *e = rt_exec_create(g, &o, &d);
    if (!e)
        fail_msg("rt_exec_create: %s", d.msg);
    for (int j = 0; j < 4; j++)
        rt_exec_write(e, c.in[j], c.host[j]);
    if (!rt_exec_run(e, 7, 0, &d))
        fail_msg("rt_exec_run: %s", d.msg);
    for (int k = 0; k < 3; k++) {
        int t = g->outs.v[k].t;
        float got[OOR_NI * OOR_R];
        assert_true(c.nwant[k] <= OOR_NI * OOR_R);
        rt_exec_read(e, t, got);
        for (int64_t i = 0; i < c.nwant[k]; i++) {
            if (got[i] != c.want[k][i] || val[t][i] != c.want[k][i])
                fail_msg("%s[%lld]: cpu %g, interpreter %g, expected %g", g->outs.v[k].name,
                         (long long)i, got[i], val[t][i], c.want[k][i]);
        }
    }
    rt_exec_destroy(e);
    ir_interp_free(g, val);
    gather_oor_free(&c);
}

/* Calls plan kernel `name` (pointer params bound to ptr[tensor id] through
 * step st's args; no random state) on the whole range. */
static void call_kernel(void *so, const CgPlan *pl, const CgStep *st, void **ptr)
{
    const CgKernel *k = pl->kernels.v[st->kernel];
    void *sym = dlsym(so, k->name);
    if (!sym)
        fail_msg("no kernel %s in the compiled plan", k->name);
    void *a[3] = {0};
    assert_true(k->params.n <= 3 && !k->rand);
    for (int i = 0; i < k->params.n; i++)
        a[i] = ptr[st->args[i]];
    if (k->params.n == 2) {
        void (*fn)(void *, void *, int64_t, int64_t);
        memcpy(&fn, &sym, sizeof fn);
        fn(a[0], a[1], 0, 1);
    } else {
        void (*fn)(void *, void *, void *, int64_t, int64_t);
        memcpy(&fn, &sym, sizeof fn);
        fn(a[0], a[1], a[2], 0, 1);
    }
}

/* Tensors of more than 2^32 elements (issue 13: the 32-bit index audit):
 * the generated C computes every index and size in int64_t. A slice and a
 * gather read 4 and 16 elements past 2^32 of two 16 GiB inputs, mapped
 * without backing (MAP_NORESERVE: only the pages written are real), so
 * an index truncated to 32 bits reads the wrong place or faults. */
static void test_index_past_2g(void **state)
{
    (void)state;
    const int64_t N = (int64_t)1 << 30, V = (int64_t)1 << 28, R = 16;
    Graph *g = ir_new();
    int64_t dx[2] = {4, N}, dt[2] = {V, R}, di[1] = {2};
    int x = in_t(g, TK_INPUT, "x", DT_F32, 2, dx);
    int tab = in_t(g, TK_INPUT, "tab", DT_F32, 2, dt);
    int idx = in_t(g, TK_INPUT, "idx", DT_I32, 1, di);
    OpAttr sa = {.rank = 2, .shape = {1, 4}, .nia = 2, .ia = {3, N - 4}};
    int sl = opa(g, OP_SLICE, &x, 1, sa);
    out(g, "slice", sl);
    int gi[2] = {tab, idx};
    int ga = ir_op_x(g, OP_GATHER, gi, 2, NULL, here);
    out(g, "gather", ga);
    Diag d = {{0}};
    CgPlan *pl = cg_plan(g, &d);
    if (!pl)
        fail_msg("cg_plan: %s", d.msg);
    /* no 32-bit index variable or cast anywhere in the kernels */
    static const char *const narrow[] = {"(int)", "int v", "int c", "int e", "int h",
                                         "int r", "int i", "int j", "unsigned "};
    for (size_t i = 0; i < sizeof narrow / sizeof *narrow; i++)
        if (strstr(pl->source, narrow[i]))
            fail_msg("generated C has \"%s\":\n%s", narrow[i], pl->source);
    /* nor in the CUDA C kernels (after its prelude, whose warp and block
     * helpers count lanes in int) */
    CgCudaProgram *cu = cg_cuda_program(pl, false);
    const char *kernels = strstr(cu->source, "extern \"C\" __global__");
    assert_non_null(kernels);
    for (size_t i = 0; i < sizeof narrow / sizeof *narrow; i++)
        if (strstr(kernels, narrow[i]))
            fail_msg("generated CUDA C has \"%s\":\n%s", narrow[i], kernels);
    cg_cuda_program_free(cu);

    size_t xb = sizeof(float) * (size_t)(4 * N), tb = sizeof(float) * (size_t)(V * R);
    float *xm = mmap(NULL, xb, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    float *tm = mmap(NULL, tb, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (xm == MAP_FAILED || tm == MAP_FAILED) {
        print_message("skipped: cannot map 2 x 16 GiB of address space\n");
        cg_plan_free(pl);
        ir_free(g);
        skip();
    }
    for (int j = 0; j < 4; j++)
        xm[3 * N + N - 4 + j] = 1.0f + (float)j;
    for (int k = 0; k < R; k++) {
        tm[(V - 1) * R + k] = 10.0f + (float)k;
        tm[5 * R + k] = 100.0f + (float)k;
    }
    int32_t ix[2] = {(int32_t)(V - 1), 5};
    float got_s[4] = {0}, got_g[2 * 16] = {0};
    void **ptr = xcalloc((size_t)g->t.n, sizeof(void *));
    ptr[x] = xm;
    ptr[tab] = tm;
    ptr[idx] = ix;
    ptr[sl] = got_s;
    ptr[ga] = got_g;

    char *dir = scratch_dir("idx2g");
    char *so = rt_cc_compile(pl->source, dir, 1, false, &d);
    if (!so)
        fail_msg("%s", d.msg);
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    int ran = 0;
    for (int s = 0; s < pl->steps.n; s++) {
        const CgStep *st = &pl->steps.v[s];
        if (st->kind == CG_STEP_KERNEL && (st->op >= 0)) {
            call_kernel(h, pl, st, ptr);
            ran++;
        }
    }
    assert_int_equal(ran, 2);
    for (int j = 0; j < 4; j++)
        if (got_s[j] != 1.0f + (float)j)
            fail_msg("slice[%d] past 2^32: got %g, expected %g", j, got_s[j], 1.0 + j);
    for (int k = 0; k < R; k++)
        if (got_g[k] != 10.0f + (float)k || got_g[R + k] != 100.0f + (float)k)
            fail_msg("gather rows %lld and 5, column %d: got %g and %g", (long long)(V - 1), k,
                     got_g[k], got_g[R + k]);
    dlclose(h);
    free(so);
    remove_tree(dir);
    free(dir);
    free(ptr);
    munmap(xm, xb);
    munmap(tm, tb);
    cg_plan_free(pl);
    ir_free(g);
}

static void test_reduce(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[3] = {3, 5, 7};
    int x = in_t(g, TK_INPUT, "x", DT_F32, 3, d);
    int xi = in_t(g, TK_INPUT, "xi", DT_I32, 3, d);
    OpAttr r1 = {.nia = 1, .ia = {1}};
    out(g, "sum1", opa(g, OP_REDUCE_SUM, &x, 1, r1));
    OpAttr r02 = {.nia = 2, .ia = {0, 2}};
    out(g, "sum02", opa(g, OP_REDUCE_SUM, &x, 1, r02));
    OpAttr r2 = {.nia = 1, .ia = {2}};
    out(g, "max2", opa(g, OP_REDUCE_MAX, &x, 1, r2));
    OpAttr all = {.nia = 3, .ia = {0, 1, 2}};
    out(g, "maxall", opa(g, OP_REDUCE_MAX, &x, 1, all));
    out(g, "isum", opa(g, OP_REDUCE_SUM, &xi, 1, r1));
    out(g, "imax", opa(g, OP_REDUCE_MAX, &xi, 1, r02));
    check_graph(g, 1e-6);
    ir_free(g);
}

/* Rows long enough for the C printer's lanes and tiles (cprint.c): 40 (five
 * chunks of 8, one tile), 300 (a tile of 256, a partial tile of 40 and a
 * tail of 4 outside the lanes) and 1000 (three tiles and a partial one);
 * sums and NaN-propagating maxima, f32 and i32. */
static void test_reduce_long(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t lens[3] = {40, 300, 1000};
    OpAttr last = {.nia = 1, .ia = {1}};
    for (int i = 0; i < 3; i++) {
        int64_t d[2] = {3, lens[i]};
        char name[32];
        snprintf(name, sizeof name, "x%lld", (long long)lens[i]);
        int x = in_t(g, TK_INPUT, name, DT_F32, 2, d);
        snprintf(name, sizeof name, "xi%lld", (long long)lens[i]);
        int xi = in_t(g, TK_INPUT, name, DT_I32, 2, d);
        snprintf(name, sizeof name, "sum%lld", (long long)lens[i]);
        out(g, name, opa(g, OP_REDUCE_SUM, &x, 1, last));
        snprintf(name, sizeof name, "max%lld", (long long)lens[i]);
        out(g, name, opa(g, OP_REDUCE_MAX, &x, 1, last));
        snprintf(name, sizeof name, "isum%lld", (long long)lens[i]);
        out(g, name, opa(g, OP_REDUCE_SUM, &xi, 1, last));
        snprintf(name, sizeof name, "imax%lld", (long long)lens[i]);
        out(g, name, opa(g, OP_REDUCE_MAX, &xi, 1, last));
    }
    check_graph(g, 1e-6);
    ir_free(g);
}

static void test_matmul(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t da[3] = {2, 3, 4}, db[3] = {2, 4, 5}, dat[3] = {2, 4, 3}, dbt[3] = {2, 5, 4},
            w[2] = {4, 5}, wt[2] = {5, 4}, d4[4] = {2, 2, 3, 4};
    int A = in_t(g, TK_INPUT, "A", DT_F32, 3, da), B = in_t(g, TK_INPUT, "B", DT_F32, 3, db);
    int At = in_t(g, TK_INPUT, "At", DT_F32, 3, dat), Bt = in_t(g, TK_INPUT, "Bt", DT_F32, 3, dbt);
    int W = in_t(g, TK_PARAM, "W", DT_F32, 2, w), Wt = in_t(g, TK_PARAM, "Wt", DT_F32, 2, wt);
    int A4 = in_t(g, TK_INPUT, "A4", DT_F32, 4, d4);
    struct { int a, b, ta, tb; const char *n; } c[] = {
        {A, B, 0, 0, "nn"}, {At, B, 1, 0, "tn"}, {A, Bt, 0, 1, "nt"}, {At, Bt, 1, 1, "tt"},
        {A, W, 0, 0, "shared"}, {A, Wt, 0, 1, "shared_t"}, {At, W, 1, 0, "shared_ta"},
        {A4, W, 0, 0, "rank4_shared"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int in[2] = {c[i].a, c[i].b};
        OpAttr m = {.nia = 2, .ia = {c[i].ta, c[i].tb}};
        out(g, c[i].n, opa(g, OP_MATMUL, in, 2, m));
    }
    check_graph(g, 1e-6);
    ir_free(g);
}

static void test_updates(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[2] = {8, 3};
    int p = in_t(g, TK_PARAM, "p", DT_F32, 2, d);
    int q = in_t(g, TK_PARAM, "q", DT_F32, 2, d);
    int s = in_t(g, TK_STATE, "s", DT_F32, 2, d);
    int x = in_t(g, TK_INPUT, "x", DT_F32, 2, d);
    /* p <- p - 0.1 x (in place); q <- x + p, read after p's update value is
     * made (needs the old p); s <- q (copy of a param's old value) */
    int np = op2(g, OP_SUB, p, op2(g, OP_MUL, cnst(g, DT_F32, 0.1, 2, d), x));
    int nq = op2(g, OP_ADD, x, p);
    ir_add_update(g, p, np);
    ir_add_update(g, q, nq);
    ir_add_update(g, s, q);
    out(g, "sum", op2(g, OP_ADD, np, nq));
    check_graph(g, 1e-6);
    ir_free(g);
}

/* A small graph for the cache, failure and profile tests. */
static Graph *small_graph(float scale)
{
    Graph *g = ir_new();
    int64_t d[2] = {8, 16}, w[2] = {16, 4};
    int x = in_t(g, TK_INPUT, "x", DT_F32, 2, d);
    int W = in_t(g, TK_PARAM, "W", DT_F32, 2, w);
    int y = op2(g, OP_MUL, x, cnst(g, DT_F32, scale, 2, d));
    int in[2] = {op1(g, OP_TANH, y), W};
    OpAttr m = {.nia = 2, .ia = {0, 0}};
    int z = opa(g, OP_MATMUL, in, 2, m);
    OpAttr r = {.nia = 1, .ia = {1}};
    out(g, "z", opa(g, OP_REDUCE_SUM, &z, 1, r));
    return g;
}

static void test_cache(void **state)
{
    (void)state;
    char *dir = scratch_dir("cache");
    Graph *g = small_graph(0.37f);
    ExecOpts o = {.threads = 1, .cache_dir = dir, .verbose = true};
    Diag d = {{0}};
    RtCcStats s0 = rt_cc_stats();
    Exec *e = rt_exec_create(g, &o, &d);
    if (!e)
        fail_msg("%s", d.msg);
    RtCcStats s1 = rt_cc_stats();
    assert_int_equal(s1.compiles, s0.compiles + 1);
    rt_exec_destroy(e);
    e = rt_exec_create(g, &o, &d);
    if (!e)
        fail_msg("%s", d.msg);
    RtCcStats s2 = rt_cc_stats();
    assert_int_equal(s2.compiles, s1.compiles); /* the second create compiles nothing */
    assert_int_equal(s2.cache_hits, s1.cache_hits + 1);
    rt_exec_destroy(e);
    /* a different program is a miss */
    Graph *g2 = small_graph(0.5f);
    e = rt_exec_create(g2, &o, &d);
    if (!e)
        fail_msg("%s", d.msg);
    assert_int_equal(rt_cc_stats().compiles, s2.compiles + 1);
    rt_exec_destroy(e);
    ir_free(g2);
    ir_free(g);
    assert_int_equal(remove_tree(dir), 0);
    free(dir);
}

/* KILN_CACHE_MAX bounds the cache: a compile that adds an entry removes
 * the least recently used kiln-* files (old mtimes here) until the total is
 * under 3/4 of the limit, and keeps what it just compiled and anything
 * touched in the last minute. */
static void test_cache_bound(void **state)
{
    (void)state;
    char *dir = scratch_dir("cachemax");
    char *blob = xcalloc(1, 100000);
    time_t now_t = time(NULL);
    for (int i = 0; i < 6; i++) {
        char *path = xasprintf("%s/kiln-%032d.so", dir, i);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(blob, 1, 100000, f), 100000);
        fclose(f);
        /* 0 is the oldest; 5 was used a moment ago */
        struct timespec ts[2] = {{now_t - 86400 + i * 600, 0}, {now_t - 86400 + i * 600, 0}};
        if (i == 5)
            ts[0].tv_sec = ts[1].tv_sec = now_t - 5;
        assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
        free(path);
    }
    free(blob);
    setenv("KILN_CACHE_MAX", "400000", 1);
    Graph *g = small_graph(0.61f);
    ExecOpts o = {.threads = 1, .cache_dir = dir};
    Diag d = {{0}};
    Exec *e = rt_exec_create(g, &o, &d);
    unsetenv("KILN_CACHE_MAX");
    if (!e)
        fail_msg("%s", d.msg);
    rt_exec_destroy(e);
    bool present[6];
    for (int i = 0; i < 6; i++) {
        char *path = xasprintf("%s/kiln-%032d.so", dir, i);
        present[i] = access(path, F_OK) == 0;
        free(path);
    }
    /* 600 kB of old entries plus the new one, limit 400 kB: the oldest go
     * until under 300 kB, the one used 5 s ago stays whatever its age */
    assert_false(present[0]);
    assert_false(present[1]);
    assert_false(present[2]);
    assert_true(present[5]);
    char *cmd = xasprintf("ls '%s' | grep -c '\\.so$'", dir);
    char *outp = NULL;
    run_cmd(cmd, &outp);
    assert_true(atoi(outp) >= 2); /* the new object and entry 5 at least */
    free(outp);
    free(cmd);
    assert_int_equal(remove_tree(dir), 0);
    free(dir);
    ir_free(g);
}

/* A source of 12 functions compiled by 3 compilers side by side (parts with
 * the prelude, then one link): every function is in the object and right;
 * no part file is left. With an error in it: the failing part's source is
 * kept and shown around the error line, and no object is made. */
/* The same bound on the CUDA module's cubin directory (every file but dot
 * files; the executor calls it after creating a CUDA backend): recency is
 * the later of mtime and atime, so a cubin read recently stays. */
static void test_cache_bound_cubins(void **state)
{
    (void)state;
    char *dir = scratch_dir("cubins");
    char *blob = xcalloc(1, 100000);
    time_t now_t = time(NULL);
    const char *names[] = {"a-sm_90.cubin", "b-sm_90.cubin", "c-sm_90.cubin", "d-sm_90.cubin",
                           ".hidden"};
    for (int i = 0; i < 5; i++) {
        char *path = xasprintf("%s/%s", dir, names[i]);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(blob, 1, 100000, f), 100000);
        fclose(f);
        /* written a day ago, a first; c read an hour ago */
        time_t w = now_t - 86400 + i * 60, a = i == 2 ? now_t - 3600 : w;
        struct timespec ts[2] = {{a, 0}, {w, 0}};
        assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
        free(path);
    }
    free(blob);
    setenv("KILN_CACHE_MAX", "250000", 1);
    rt_cache_prune(dir, "", NULL, false);
    unsetenv("KILN_CACHE_MAX");
    bool present[5];
    for (int i = 0; i < 5; i++) {
        char *path = xasprintf("%s/%s", dir, names[i]);
        present[i] = access(path, F_OK) == 0;
        free(path);
    }
    /* 400 kB counted (not the dot file), limit 250 kB: down to 187.5 kB by
     * recency a, b, d, c: a, b and d go, c (read an hour ago) stays */
    assert_false(present[0]);
    assert_false(present[1]);
    assert_true(present[2]);
    assert_false(present[3]);
    assert_true(present[4]);
    assert_int_equal(remove_tree(dir), 0);
    free(dir);
}

/* Temp files whose writer is gone (its pid no longer exists, or older than
 * a day) are removed when the cache is pruned, whatever KILN_CACHE_MAX;
 * a live writer's stay, and so do entries and kept failed sources. */
static void test_cache_stale_temps(void **state)
{
    (void)state;
    char *dir = scratch_dir("stale");
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0); /* a pid that no longer exists */
    long me = (long)getpid();
    const char *h = "0123456789abcdef0123456789abcdef";
    char *names[] = {
        xasprintf("kiln-%s.so.tmp.%ld", h, (long)dead),   /* gone */
        xasprintf("kiln-%s.%ld.c", h, (long)dead),        /* gone */
        xasprintf("kiln-%s.%ld.3.o", h, (long)dead),      /* gone */
        xasprintf("kiln-%s.%ld.3.c", h, (long)dead),      /* gone */
        xasprintf("kiln-%s.c.tmp.%ld", h, (long)dead),    /* gone */
        xasprintf("kiln-%s.so.tmp.%ld", h, me),           /* live writer */
        xasprintf("kiln-%s.%ld.c", h, me),                /* live writer */
        xasprintf("kiln-%s.so.tmp.1", h),                 /* live writer, a day old */
        xasprintf("kiln-%s.so", h),                       /* entries */
        xasprintf("kiln-%s.c", h),
        xasprintf("kiln-%s.failed.c", h),
    };
    int n = (int)(sizeof names / sizeof names[0]);
    time_t now_t = time(NULL);
    for (int i = 0; i < n; i++) {
        char *path = xasprintf("%s/%s", dir, names[i]);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("x", f);
        fclose(f);
        struct timespec ts[2] = {{now_t - 2 * 86400, 0}, {now_t - 2 * 86400, 0}};
        if (i == 7)
            assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
        free(path);
    }
    /* the CUDA module's temp names in its own directory */
    char *cu = xasprintf("%s/cuda", dir);
    mkdir(cu, 0777);
    char *cut = xasprintf("%s/0123-sm_90.cubin.tmp.%ld", cu, (long)dead);
    char *cul = xasprintf("%s/0123-sm_90.cubin.tmp.%ld", cu, me);
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(i ? cul : cut, "w");
        assert_non_null(f);
        fclose(f);
    }
    setenv("KILN_CACHE_MAX", "0", 1);
    rt_cache_prune(dir, "kiln-", NULL, false);
    rt_cache_prune(cu, "", NULL, false);
    unsetenv("KILN_CACHE_MAX");
    for (int i = 0; i < n; i++) {
        char *path = xasprintf("%s/%s", dir, names[i]);
        bool gone = i < 5 || i == 7;
        if (gone != (access(path, F_OK) != 0))
            fail_msg("%s: expected %s", names[i], gone ? "removed" : "kept");
        free(path);
        free(names[i]);
    }
    assert_int_not_equal(access(cut, F_OK), 0);
    assert_int_equal(access(cul, F_OK), 0);
    free(cut);
    free(cul);
    free(cu);
    assert_int_equal(remove_tree(dir), 0);
    free(dir);
}

static void test_parallel_compile(void **state)
{
    (void)state;
    char *dir = scratch_dir("ccpar");
    CgBuf src = {0};
    cg_puts(&src, "#include <stdint.h>\nstatic inline float twice(float x) { return 2.0f * x; }\n");
    for (int i = 0; i < 12; i++)
        cg_printf(&src, "\nvoid f%d(float *p)\n{\n    p[%d] = twice(%d.0f);\n}\n", i, i, i);
    Diag d = {{0}};
    RtCcStats before = rt_cc_stats();
    char *so = rt_cc_compile(src.s, dir, 3, false, &d);
    if (!so)
        fail_msg("%s", d.msg);
    assert_int_equal(rt_cc_stats().compiles, before.compiles + 1);
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    float out[12] = {0};
    for (int i = 0; i < 12; i++) {
        char name[8];
        snprintf(name, sizeof name, "f%d", i);
        void *sym = dlsym(h, name);
        assert_non_null(sym);
        void (*fn)(float *);
        memcpy(&fn, &sym, sizeof fn);
        fn(out);
    }
    for (int i = 0; i < 12; i++)
        assert_true(out[i] == 2.0f * (float)i);
    dlclose(h);
    free(so);
    char *cmd = xasprintf("ls '%s' | grep -c '\\.[0-9]*\\.c$\\|\\.o$'", dir);
    char *outp = NULL;
    run_cmd(cmd, &outp);
    assert_int_equal(atoi(outp), 0);
    free(outp);
    free(cmd);

    setenv("KILN_CC_INJECT_ERROR", "1", 1);
    so = rt_cc_compile(src.s, dir, 3, false, &d);
    unsetenv("KILN_CC_INJECT_ERROR");
    assert_null(so);
    assert_non_null(strstr(d.msg, "kernel compilation failed"));
    assert_non_null(strstr(d.msg, "| kiln_injected_error(;"));
    const char *kept = strstr(d.msg, "source kept in ");
    assert_non_null(kept);
    char path[1024];
    sscanf(kept + strlen("source kept in "), "%1023s", path);
    char *text = read_file(path);
    assert_non_null(text);
    assert_non_null(strstr(text, "kiln_injected_error(;"));
    assert_non_null(strstr(text, "static inline float twice")); /* the prelude too */
    free(text);
    cmd = xasprintf("ls '%s' | grep -c '\\.so$\\|\\.o$'", dir);
    run_cmd(cmd, &outp);
    assert_int_equal(atoi(outp), 1); /* the first compile's object only */
    free(outp);
    free(cmd);
    remove_tree(dir);
    free(src.s);
    free(dir);
}

static void test_compile_failure(void **state)
{
    (void)state;
    char *dir = scratch_dir("ccfail");
    Graph *g = small_graph(0.25f);
    ExecOpts o = {.threads = 1, .cache_dir = dir};
    Diag d = {{0}};
    setenv("KILN_CC_INJECT_ERROR", "1", 1);
    Exec *e = rt_exec_create(g, &o, &d);
    unsetenv("KILN_CC_INJECT_ERROR");
    assert_null(e);
    assert_non_null(strstr(d.msg, "kernel compilation failed"));
    assert_non_null(strstr(d.msg, "| kiln_injected_error(;")); /* the numbered source */
    assert_non_null(strstr(d.msg, "error"));                   /* the compiler's message */
    /* nothing half-written: no shared object in the cache */
    char *cmd = xasprintf("ls '%s' | grep -c '\\.so'", dir);
    char *outp = NULL;
    run_cmd(cmd, &outp);
    assert_int_equal(atoi(outp), 0);
    free(outp);
    free(cmd);
    remove_tree(dir);
    free(dir);
    ir_free(g);
}

static void test_profile(void **state)
{
    (void)state;
    Graph *g = small_graph(0.75f);
    ExecOpts o = {.threads = 1, .profile = true};
    Diag d = {{0}};
    Exec *e = rt_exec_create(g, &o, &d);
    if (!e)
        fail_msg("%s", d.msg);
    float x[8 * 16] = {0}, W[16 * 4] = {0};
    rt_exec_write(e, 0, x);
    rt_exec_write(e, 1, W);
    for (int i = 0; i < 3; i++)
        assert_true(rt_exec_run(e, 1, i, &d));
    const RtProfRow *rows;
    int n = rt_exec_profile(e, &rows);
    bool gemm = false;
    int64_t calls = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(rows[i].calls, 3);
        calls += rows[i].calls;
        if (strcmp(rows[i].kind, "gemm") == 0) {
            gemm = true;
            assert_true(rows[i].flops == 3 * 2.0 * 8 * 16 * 4);
        }
        if (i)
            assert_true(rows[i - 1].seconds >= rows[i].seconds);
    }
    assert_true(gemm);
    const RtTraceEvent *ev;
    int ne = rt_exec_trace(e, &ev);
    assert_int_equal(ne, rt_exec_plan(e)->steps.n);
    assert_int_equal(calls, 3 * ne);
    for (int i = 0; i < ne; i++) {
        assert_true(ev[i].start <= ev[i].end);
        if (i)
            assert_true(ev[i - 1].end <= ev[i].start);
    }
    rt_exec_destroy(e);
    ir_free(g);
}

/* Every model in models/ (default tiny configs): the full pipeline, then two
 * steps on the CPU backend against the interpreter: loss and gradients
 * within 1e-4, params and state after each update too. */
static void test_models(void **state)
{
    (void)state;
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++) {
        const char *path = *pp;
        Model *m = load_model(path, NULL, 0);
        PassOpts po;
        rt_pass_opts(&m->train, NULL, &po);
        Diag d = {{0}};
        if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
            fail_msg("%s: pipeline: %s", path, d.msg);
        fprintf(stderr, "model %s: %d ops\n", path, m->g->ops.n);
        model_inputs = true;
        check_graph_opts(m->g, 1e-4, "grad.");
        model_inputs = false;
        fe_model_free(m);
    }
    free_model_paths(paths);
}

/* A concat of 100 operands (an RNN unrolled past 64 steps; the lowering
 * once refused more than 64): the step, gradients and updates match the
 * interpreter. */
static void test_concat_many(void **state)
{
    (void)state;
    Model *m = load_model("tests/data/concat_many.lua", NULL, 0);
    int widest = 0;
    for (int i = 0; i < m->g->ops.n; i++)
        if (m->g->ops.v[i].code == OP_CONCAT && m->g->ops.v[i].nin > widest)
            widest = m->g->ops.v[i].nin;
    assert_int_equal(widest, 100);
    PassOpts po;
    rt_pass_opts(&m->train, NULL, &po);
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
    model_inputs = true;
    check_graph_opts(m->g, 1e-4, NULL);
    model_inputs = false;
    fe_model_free(m);
}

/* runtime/cpu/blas.c: which OPENBLAS_CORETYPE kiln forces. Only a fallback
 * below AVX2 on a CPU with AVX2 or more is replaced (Prescott on an
 * Emerald Rapids Xeon, which OpenBLAS 0.3.21 does not know); a core chosen
 * for the CPU, any core on an older CPU, and a core the user set stay. */
static void test_blas_core_choice(void **state)
{
    (void)state;
    static const struct {
        const char *core;
        RtIsa cpu;
        const char *want;
    } cases[] = {
        {"Prescott", RT_ISA_AVX512, "SkylakeX"}, {"Prescott", RT_ISA_AVX2, "Haswell"},
        {"Nehalem", RT_ISA_AVX512, "SkylakeX"},  {"Sandybridge", RT_ISA_AVX2, "Haswell"},
        {"Core2", RT_ISA_AVX2, "Haswell"},       {"unknown", RT_ISA_AVX512, "SkylakeX"},
        {"Prescott", RT_ISA_AVX, NULL},          {"Prescott", RT_ISA_SSE, NULL},
        {"Haswell", RT_ISA_AVX512, NULL},        {"Zen", RT_ISA_AVX512, NULL},
        {"SkylakeX", RT_ISA_AVX512, NULL},       {"cooperlake", RT_ISA_AVX512, NULL},
        {"SapphireRapids", RT_ISA_AVX512, NULL}, {"Sandybridge", RT_ISA_AVX, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *got = rt_blas_core_for(cases[i].core, cases[i].cpu);
        if (!cases[i].want != !got || (got && strcmp(got, cases[i].want) != 0))
            fail_msg("core %s on ISA %d: got %s, want %s", cases[i].core, (int)cases[i].cpu,
                     got ? got : "(none)", cases[i].want ? cases[i].want : "(none)");
    }
    const char *core = rt_blas_core();
    assert_true(core && *core);
    /* a user's OPENBLAS_CORETYPE is kept, whatever OpenBLAS loaded */
    char *user = getenv("OPENBLAS_CORETYPE") ? strdup(getenv("OPENBLAS_CORETYPE")) : NULL;
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    assert_null(rt_blas_better_core());
    if (user)
        setenv("OPENBLAS_CORETYPE", user, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    free(user);
}

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* runtime/cpu/blas.c: OpenBLAS's server threads (started when the library
 * loads, one per further core) are stopped, and stay stopped through a
 * GEMM and a second call (openblas_set_num_threads(1) would start them
 * again). Runs first, while the process has no thread of kiln's. */
static void test_blas_threads(void **state)
{
    (void)state;
    /* OpenBLAS's thread count at load is its server threads plus the caller */
    int before = thread_count(), servers = openblas_get_num_threads() - 1;
    rt_blas_one_thread();
    int after = thread_count();
    assert_int_equal(after, before - servers);
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c,
                2);
    assert_true(c[0] == 1 && c[1] == 2 && c[2] == 3 && c[3] == 4);
    rt_blas_one_thread();
    assert_int_equal(thread_count(), after);
    assert_int_equal(openblas_get_num_threads(), 1);
    print_message("threads before %d, after %d (OpenBLAS had %d server threads)\n", before, after,
                  servers);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blas_threads),
        cmocka_unit_test(test_elementwise_f32),
        cmocka_unit_test(test_exp_tanh_ulp),
        cmocka_unit_test(test_elementwise_int),
        cmocka_unit_test(test_sources),
        cmocka_unit_test(test_moves),
        cmocka_unit_test(test_gather_out_of_range),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_reduce_long),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_updates),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_cache_bound),
        cmocka_unit_test(test_cache_bound_cubins),
        cmocka_unit_test(test_cache_stale_temps),
        cmocka_unit_test(test_parallel_compile),
        cmocka_unit_test(test_compile_failure),
        cmocka_unit_test(test_profile),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_concat_many),
        cmocka_unit_test(test_index_past_2g),
        cmocka_unit_test(test_blas_core_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
