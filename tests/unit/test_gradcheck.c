/* test_gradcheck.c - every primitive's VJP (pass_autodiff) against central
 * finite differences of the loss, evaluated in double precision by the
 * reference interpreter on random inputs.
 *
 * Each case builds a small graph from params (and fixed inputs) to a result r;
 * the harness appends loss = reshape(reduce_sum(r * W)) with W a fixed random
 * input, so the cotangent reaching r is not uniform. A final test enumerates
 * the opcode table and fails when an opcode with a VJP rule is not exercised
 * on a differentiated path by some case. */
#include "testutil.h"

#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAXIN 8

typedef enum { D_ANY, D_POS, D_EXACT } Domain; /* D_ANY: |x| in [0.1, 1] */

typedef struct {
    Graph *g;
    Domain dom;          /* for params */
    int nin;
    const char *name[MAXIN];
    double *val[MAXIN];  /* values of every named input (params included) */
    uint64_t rng;
} Ctx;

static double urand(Ctx *c)
{
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(c->rng >> 11) * (1.0 / 9007199254740992.0);
}

static double draw(Ctx *c, Domain d)
{
    double u = urand(c);
    switch (d) {
    case D_POS: return 0.5 + 1.5 * u;
    case D_EXACT: return (double)((int)(u * 32) - 16 + (u < 0.5 ? 0 : 1)) * 0.125; /* nonzero */
    default: return (urand(c) < 0.5 ? -1 : 1) * (0.1 + 0.9 * u);
    }
}

static SrcLoc here(int line) { return (SrcLoc){intern("gradcheck.lua"), line}; }

static Shape shp(DType dt, int rank, const int64_t *d) { return shape_make(dt, rank, d); }
#define S(...) (const int64_t[]){__VA_ARGS__}
#define F32(r, ...) shp(DT_F32, r, S(__VA_ARGS__)) /* F32(rank, dims...) */
#define SCALAR shp(DT_F32, 0, NULL)

static int add_named(Ctx *c, TensorKind k, const char *name, Shape s, double *v)
{
    ParamInit none = {0};
    int t = ir_add_input(c->g, k, name, s, none);
    assert_true(c->nin < MAXIN);
    c->name[c->nin] = intern(name);
    c->val[c->nin++] = v;
    return t;
}

static int param(Ctx *c, const char *name, Shape s)
{
    int64_t n = shape_numel(&s);
    double *v = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = draw(c, c->dom);
    return add_named(c, TK_PARAM, name, s, v);
}

static int param_dom(Ctx *c, const char *name, Shape s, Domain d)
{
    Domain old = c->dom;
    c->dom = d;
    int t = param(c, name, s);
    c->dom = old;
    return t;
}

static int input_vals(Ctx *c, const char *name, Shape s, const double *vals)
{
    int64_t n = shape_numel(&s);
    double *v = xmalloc(sizeof(double) * (size_t)n);
    memcpy(v, vals, sizeof(double) * (size_t)n);
    return add_named(c, TK_INPUT, name, s, v);
}

static int op1(Ctx *c, Opcode code, int x, const OpAttr *a)
{
    return ir_op_x(c->g, code, &x, 1, a, here(__LINE__));
}

static int op2(Ctx *c, Opcode code, int x, int y)
{
    int in[2] = {x, y};
    return ir_op_x(c->g, code, in, 2, NULL, here(__LINE__));
}

static OpAttr shape_attr(Shape s)
{
    OpAttr a = {.rank = s.rank, .dtype = s.dtype};
    memcpy(a.shape, s.dim, sizeof(int64_t) * (size_t)s.rank);
    return a;
}

static int bcast(Ctx *c, int x, Shape s)
{
    OpAttr a = shape_attr(s);
    return op1(c, OP_BROADCAST, x, &a);
}

static int mm(Ctx *c, int x, int y, int ta, int tb)
{
    OpAttr a = {.nia = 2, .ia = {ta, tb}};
    int in[2] = {x, y};
    return ir_op_x(c->g, OP_MATMUL, in, 2, &a, here(__LINE__));
}

/* ---- cases ------------------------------------------------------------------ */

typedef int (*BuildFn)(Ctx *c, int variant);
typedef struct {
    const char *name;
    BuildFn build;
    int nvariants;
    Domain dom;
} Case;

static Opcode unary_ops[] = {OP_NEG,     OP_EXP,  OP_LOG, OP_SIN, OP_COS,
                             OP_TANH,    OP_SQRT, OP_RSQRT, OP_SIGMOID, OP_RELU,
                             OP_ABS,     OP_ERF,  OP_ALLREDUCE};

static int b_unary(Ctx *c, int v)
{
    Opcode code = unary_ops[v];
    if (code == OP_LOG || code == OP_SQRT || code == OP_RSQRT)
        c->dom = D_POS;
    int x = param(c, "x", F32(2, 3, 4));
    return op1(c, code, x, NULL);
}

static Opcode binary_ops[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_MAX, OP_MIN};

static int b_binary(Ctx *c, int v)
{
    Opcode code = binary_ops[v % 7];
    Shape s = v < 7 ? F32(2, 3, 4) : SCALAR;
    int x = param_dom(c, "x", s, code == OP_POW ? D_POS : D_ANY);
    int y = param_dom(c, "y", s, code == OP_DIV ? D_POS : D_ANY);
    return op2(c, code, x, y);
}

/* x used twice by one op and again elsewhere: cotangents must accumulate */
static int b_reuse(Ctx *c, int v)
{
    int x = param(c, "x", F32(2, 2, 3));
    int a = op2(c, v ? OP_MUL : OP_ADD, x, x);
    return op2(c, OP_SUB, op1(c, OP_EXP, x, NULL), a);
}

static int b_cast(Ctx *c, int v)
{
    (void)v;
    int x = param_dom(c, "x", shp(DT_BF16, 2, S(3, 4)), D_EXACT);
    OpAttr a = {.dtype = DT_F32};
    return op1(c, OP_CAST, x, &a);
}

static int b_select(Ctx *c, int v)
{
    (void)v;
    double m[12] = {1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 0};
    int mask = input_vals(c, "mask", shp(DT_U8, 2, S(3, 4)), m);
    int x = param(c, "x", F32(2, 3, 4)), y = param(c, "y", F32(2, 3, 4));
    int in[3] = {mask, x, y};
    return ir_op_x(c->g, OP_SELECT, in, 3, NULL, here(__LINE__));
}

static int b_broadcast(Ctx *c, int v)
{
    switch (v) {
    case 0: /* [3,1] + [1,4] */
        return op2(c, OP_ADD, bcast(c, param(c, "x", F32(2, 3, 1)), F32(2, 3, 4)),
                   bcast(c, param(c, "y", F32(2, 1, 4)), F32(2, 3, 4)));
    case 1: return bcast(c, param(c, "x", F32(1, 4)), F32(3, 2, 3, 4));
    case 2: return bcast(c, param(c, "x", SCALAR), F32(2, 2, 3));
    case 3: return bcast(c, param(c, "x", F32(3, 2, 1, 4)), F32(3, 2, 3, 4));
    default: return bcast(c, param(c, "x", F32(2, 3, 1)), F32(3, 3, 3, 1));
    }
}

static int b_reshape(Ctx *c, int v)
{
    int x = param(c, "x", F32(3, 2, 3, 4));
    OpAttr a = shape_attr(v ? F32(1, 24) : F32(2, 4, 6));
    return op1(c, OP_RESHAPE, x, &a);
}

static int b_permute(Ctx *c, int v)
{
    int x = param(c, "x", F32(3, 2, 3, 4));
    OpAttr a = {.nia = 3, .ia = {2, 0, 1}};
    if (v)
        a.ia[0] = 1, a.ia[1] = 2, a.ia[2] = 0;
    return op1(c, OP_PERMUTE, x, &a);
}

static int b_slice(Ctx *c, int v)
{
    int x = param(c, "x", F32(3, 3, 4, 5));
    OpAttr a = shape_attr(v ? F32(3, 1, 4, 2) : F32(3, 2, 2, 3));
    a.nia = 3;
    a.ia[0] = 1, a.ia[1] = v ? 0 : 1, a.ia[2] = v ? 3 : 2;
    return op1(c, OP_SLICE, x, &a);
}

/* slice(x) on axis ax at [lo, lo + len), the other axes whole */
static int slice_ax(Ctx *c, int x, int ax, int64_t lo, int64_t len)
{
    Shape s = c->g->t.v[x].s;
    OpAttr a = shape_attr(s);
    a.nia = s.rank;
    a.ia[ax] = lo;
    a.shape[ax] = len;
    return op1(c, OP_SLICE, x, &a);
}

/* joins parts[0..n) flattened, in order: one result for the harness */
static int join_flat(Ctx *c, const int *parts, int n)
{
    int flat[128];
    assert_true(n <= 128);
    for (int i = 0; i < n; i++) {
        int64_t k = shape_numel(&c->g->t.v[parts[i]].s);
        OpAttr a = shape_attr(F32(1, k));
        flat[i] = op1(c, OP_RESHAPE, parts[i], &a);
    }
    OpAttr cat = {.nia = 1, .ia = {0}};
    return ir_op_x(c->g, OP_CONCAT, flat, n, &cat, here(__LINE__));
}

/* Many slices of one tensor, whose cotangents autodiff places side by side
 * with concat (issue 13, item 14). Variant 0: along axis 1 of x[2,12,3],
 * windows with gaps, touching, overlapping (a second layer) and out of
 * order; a slice along axis 2, one restricting two axes, and x also used
 * whole. Variant 1: 70 one-step slices, taken last step first (a tree of
 * concats, AD_CONCAT_MAX = 64), and one covering all but the ends. Variant 2:
 * slices of slices, as a GRU takes its gates out of one step's row. */
static int b_slices(Ctx *c, int v)
{
    int parts[128], n = 0;
    if (v == 0) {
        int x = param(c, "x", F32(3, 2, 12, 3));
        static const int64_t win[][2] = {{4, 3}, {0, 2}, {3, 1}, {5, 1}, {9, 3}, {5, 4}};
        for (int i = 0; i < 6; i++)
            parts[n++] = slice_ax(c, x, 1, win[i][0], win[i][1]);
        parts[n++] = slice_ax(c, x, 2, 1, 2);
        OpAttr a = shape_attr(F32(3, 1, 3, 2));
        a.nia = 3, a.ia[0] = 1, a.ia[1] = 6, a.ia[2] = 0;
        parts[n++] = op1(c, OP_SLICE, x, &a);
        parts[n++] = op1(c, OP_EXP, x, NULL);
    } else if (v == 1) {
        int x = param(c, "x", F32(3, 2, 72, 2));
        for (int t = 70; t >= 1; t--)
            parts[n++] = slice_ax(c, x, 1, t, 1);
        parts[n++] = op1(c, OP_TANH, slice_ax(c, x, 1, 1, 70), NULL);
    } else {
        int x = param(c, "x", F32(3, 2, 4, 6));
        for (int t = 0; t < 4; t++) {
            int row = slice_ax(c, x, 1, t, 1);
            for (int k = 0; k < 3; k++)
                parts[n++] = op2(c, OP_MUL, slice_ax(c, row, 2, 2 * k, 2),
                                 slice_ax(c, row, 2, 2 * ((k + 1) % 3), 2));
        }
    }
    return join_flat(c, parts, n);
}

static int b_pad(Ctx *c, int v)
{
    int x = param(c, "x", F32(2, 2, 3));
    OpAttr a = shape_attr(v ? F32(2, 2, 5) : F32(2, 4, 6));
    a.nia = 2;
    a.ia[0] = v ? 0 : 1, a.ia[1] = v ? 2 : 2;
    return op1(c, OP_PAD, x, &a);
}

static int b_concat(Ctx *c, int v)
{
    int x = param(c, "x", F32(2, 2, 3));
    int y = param(c, "y", v ? F32(2, 2, 2) : F32(2, 1, 3));
    int in[3] = {x, y, x};
    OpAttr a = {.nia = 1, .ia = {v ? 1 : 0}};
    return ir_op_x(c->g, OP_CONCAT, in, 3, &a, here(__LINE__));
}

static int b_gather(Ctx *c, int v)
{
    (void)v;
    double idx[6] = {1, 4, 1, 7, 0, -1}; /* repeated, and out of range */
    int t = param(c, "table", F32(2, 5, 3));
    int i = input_vals(c, "idx", shp(DT_I32, 2, S(2, 3)), idx);
    return op2(c, OP_GATHER, t, i);
}

static int b_scatter(Ctx *c, int v)
{
    (void)v;
    double idx[6] = {2, 0, 2, 9, 4, -3};
    int i = input_vals(c, "idx", shp(DT_I64, 2, S(2, 3)), idx);
    int src = param(c, "src", F32(3, 2, 3, 4));
    OpAttr a = shape_attr(F32(2, 5, 4));
    int in[2] = {i, src};
    return ir_op_x(c->g, OP_SCATTER_ADD, in, 2, &a, here(__LINE__));
}

static int b_reduce(Ctx *c, int v)
{
    int x = param(c, "x", F32(3, 2, 3, 4));
    OpAttr a = {.nia = v % 2 ? 2 : 1, .ia = {v % 2 ? 0 : 1, 2}};
    return op1(c, v < 2 ? OP_REDUCE_SUM : OP_REDUCE_MAX, x, &a);
}

/* variant: bits 0-1 = ta, tb; 2-3 = 0 plain 2-D, 1 batched, 2 shared rank-2 B,
 * 3 shared B with two batch dims */
static int b_matmul(Ctx *c, int v)
{
    int ta = v & 1, tb = v >> 1 & 1, kind = v >> 2;
    int64_t M = 3, K = 4, N = 2;
    int64_t ad[4], bd[4];
    int ar, br;
    int64_t batch[2] = {2, 2};
    int nb = kind == 0 ? 0 : kind == 3 ? 2 : 1;
    ar = nb + 2;
    br = kind == 1 ? 3 : 2;
    for (int i = 0; i < nb; i++)
        ad[i] = bd[i] = batch[i];
    ad[nb] = ta ? K : M, ad[nb + 1] = ta ? M : K;
    int bo = br - 2;
    bd[bo] = tb ? N : K, bd[bo + 1] = tb ? K : N;
    int x = param(c, "a", shp(DT_F32, ar, ad));
    int y = param(c, "b", shp(DT_F32, br, bd));
    return mm(c, x, y, ta, tb);
}

/* log-softmax cross-entropy over rows: reduce_max, exp, log, gather, ...
 * Variant 1 shifts by stop_gradient(max), as nn.log_softmax does: the
 * result does not depend on the shift, so finite differences still agree
 * with a backward that leaves the max out. */
static int b_xent(Ctx *c, int v)
{
    double tg[3] = {1, 3, 0};
    Shape s = F32(2, 3, 4);
    int x = param(c, "x", s);
    OpAttr ax = {.nia = 1, .ia = {1}};
    int mx = op1(c, OP_REDUCE_MAX, x, &ax);
    if (v)
        mx = op1(c, OP_STOP_GRADIENT, mx, NULL);
    int m = bcast(c, mx, s);
    int z = op2(c, OP_SUB, x, m);
    int lse = op1(c, OP_LOG, op1(c, OP_REDUCE_SUM, op1(c, OP_EXP, z, NULL), &ax), NULL);
    int lp = op2(c, OP_SUB, z, bcast(c, lse, s));
    int t = input_vals(c, "tgt", shp(DT_I32, 1, S(3)), tg);
    OpAttr flat = shape_attr(F32(2, 12, 1));
    int rows = op1(c, OP_RESHAPE, lp, &flat);
    double off[3] = {0, 4, 8};
    int o = input_vals(c, "off", shp(DT_I32, 1, S(3)), off);
    return op2(c, OP_GATHER, rows, op2(c, OP_ADD, t, o));
}

/* reduce_logsumexp: over the last axis, over two axes (v 1), and with a
 * row that has a large shift (v 2: exp would overflow without the max) */
static int b_logsumexp(Ctx *c, int v)
{
    int x = param(c, "x", F32(3, 2, 3, 4));
    if (v == 2) {
        double big[24];
        for (int i = 0; i < 24; i++)
            big[i] = 100.0 + 0.1 * i;
        x = op2(c, OP_ADD, x, input_vals(c, "shift", F32(3, 2, 3, 4), big));
    }
    OpAttr a = {.nia = v == 1 ? 2 : 1, .ia = {v == 1 ? 1 : 2, 2}};
    return op1(c, OP_REDUCE_LOGSUMEXP, x, &a);
}

/* take_along: repeated, out-of-range and negative indices (their rows get
 * no gradient) */
static int b_take_along(Ctx *c, int v)
{
    (void)v;
    double idx[6] = {1, 4, 1, 7, 0, -1};
    int x = param(c, "x", F32(3, 2, 3, 5));
    int i = input_vals(c, "idx", shp(DT_I32, 2, S(2, 3)), idx);
    return op2(c, OP_TAKE_ALONG, x, i);
}

/* cross-entropy as nn.cross_entropy spells it: logsumexp minus the target
 * logit, the mean over rows */
static int b_xent_lse(Ctx *c, int v)
{
    (void)v;
    double tg[3] = {1, 3, 0};
    int x = param(c, "x", F32(2, 3, 4));
    OpAttr ax = {.nia = 1, .ia = {1}};
    int lse = op1(c, OP_REDUCE_LOGSUMEXP, x, &ax);
    OpAttr flat = shape_attr(F32(1, 3));
    lse = op1(c, OP_RESHAPE, lse, &flat);
    int t = input_vals(c, "tgt", shp(DT_I32, 1, S(3)), tg);
    int nll = op2(c, OP_SUB, lse, op2(c, OP_TAKE_ALONG, x, t));
    OpAttr all = {.nia = 1, .ia = {0}};
    return op1(c, OP_REDUCE_SUM, nll, &all);
}

/* attention(q, k, v) {causal, scale 1/sqrt(D)} (the fused op): variant
 * -> batch B, length T (Tk for keys), head size D, value size Dv, causal.
 * T = 1; T = 37, not a multiple of the CPU kernels' tiles; D 32, 64, 128. */
static int b_attention(Ctx *c, int v)
{
    static const struct {
        int64_t B, T, Tk, D, Dv;
        int causal;
    } a[] = {{2, 5, 5, 32, 32, 1}, {2, 5, 5, 32, 32, 0}, {2, 1, 1, 32, 32, 1},
             {1, 3, 3, 64, 64, 1}, {1, 2, 2, 128, 128, 1}, {2, 3, 4, 6, 5, 0},
             {1, 37, 37, 4, 4, 1}};
    int q = param(c, "q", F32(3, a[v].B, a[v].T, a[v].D));
    int k = param(c, "k", F32(3, a[v].B, a[v].Tk, a[v].D));
    int vv = param(c, "v", F32(3, a[v].B, a[v].Tk, a[v].Dv));
    OpAttr at = {.nia = 1, .ia = {a[v].causal}, .f = 1 / sqrt((double)a[v].D)};
    int in[3] = {q, k, vv};
    return ir_op_x(c->g, OP_ATTENTION, in, 3, &at, here(__LINE__));
}

/* Self-attention as gpt.lua writes it: q, k, v head splits of one [B, T,
 * 3C] param (slice, reshape, permute), o merged back to [B, T, C]. The
 * harness also checks its gradient after attnlayout, simplify and
 * attndqkv (post_attention_passes), where qkv's gradient is one
 * attention_dqkv op (the one place that op is differentiated against
 * finite differences). */
static int b_attention_qkv(Ctx *c, int v)
{
    static const struct {
        int64_t B, T, H, D;
        int causal;
    } a[] = {{2, 5, 2, 32, 1}, {1, 1, 2, 32, 1}, {1, 37, 1, 4, 1}, {1, 3, 2, 64, 0},
             {1, 2, 1, 128, 1}};
    int64_t B = a[v].B, T = a[v].T, H = a[v].H, D = a[v].D, C = H * D;
    int qkv = param(c, "qkv", F32(3, B, T, 3 * C));
    int in[3];
    OpAttr perm = {.nia = 4, .ia = {0, 2, 1, 3}};
    for (int x = 0; x < 3; x++) {
        OpAttr r = shape_attr(F32(4, B, T, H, D));
        in[x] = op1(c, OP_PERMUTE, op1(c, OP_RESHAPE, slice_ax(c, qkv, 2, x * C, C), &r), &perm);
    }
    OpAttr at = {.nia = 1, .ia = {a[v].causal}, .f = 1 / sqrt((double)D)};
    int o = ir_op_x(c->g, OP_ATTENTION, in, 3, &at, here(__LINE__));
    OpAttr m = shape_attr(F32(3, B, T, C));
    return op1(c, OP_RESHAPE, op1(c, OP_PERMUTE, o, &perm), &m);
}

/* im2col / col2im {kernel, stride, pad, dilation}: variant -> 1d or 2d,
 * strides that skip input elements, padding, dilation, a kernel as large
 * as the padded image. col2im's operand is a param of the column shape. */
static const struct {
    int ns;
    int64_t dim[4], k[2], s[2], p[2], d[2];
} conv_v[] = {
    {2, {2, 3, 5, 4}, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {2, {1, 2, 7, 6}, {3, 2}, {2, 3}, {1, 0}, {1, 2}},
    {1, {2, 3, 9, 0}, {3, 0}, {2, 0}, {2, 0}, {2, 0}},
    {2, {1, 1, 3, 3}, {5, 4}, {1, 1}, {1, 1}, {1, 1}},
};

static OpAttr conv_attr(int v)
{
    int ns = conv_v[v].ns;
    OpAttr a = {.nia = 4 * ns};
    for (int i = 0; i < ns; i++) {
        a.ia[i] = conv_v[v].k[i];
        a.ia[ns + i] = conv_v[v].s[i];
        a.ia[2 * ns + i] = conv_v[v].p[i];
        a.ia[3 * ns + i] = conv_v[v].d[i];
    }
    return a;
}

static int b_im2col(Ctx *c, int v)
{
    OpAttr a = conv_attr(v);
    int x = param(c, "x", shp(DT_F32, conv_v[v].ns + 2, conv_v[v].dim));
    return op1(c, OP_IM2COL, x, &a);
}

static int b_col2im(Ctx *c, int v)
{
    Shape img = shp(DT_F32, conv_v[v].ns + 2, conv_v[v].dim), cols;
    OpAttr a = conv_attr(v);
    char err[300];
    assert_true(ir_infer(c->g, OP_IM2COL, (int[]){ir_add_input(c->g, TK_INPUT, "img", img,
                                                                 (ParamInit){0})},
                         1, &a, &cols, err, sizeof err));
    int x = param(c, "cols", cols);
    ir_attr_set_shape(&a, &img);
    return op1(c, OP_COL2IM, x, &a);
}

/* a convolution as nn.conv2d builds it: im2col, then a GEMM with the
 * weight [Cout, C*K] transposed */
static int b_conv(Ctx *c, int v)
{
    OpAttr a = conv_attr(v);
    int x = param(c, "x", shp(DT_F32, conv_v[v].ns + 2, conv_v[v].dim));
    int cols = op1(c, OP_IM2COL, x, &a);
    const Shape *cs = &c->g->t.v[cols].s;
    int w = param(c, "w", F32(2, 4, cs->dim[cs->rank - 1]));
    OpAttr mm = {.nia = 2, .ia = {0, 1}};
    return ir_op_x(c->g, OP_MATMUL, (int[]){cols, w}, 2, &mm, here(__LINE__));
}

/* The tensor-parallel collectives as the interpreter runs them (rank r of
 * n, the only rank: ir.h), so that finite differences check each VJP
 * against that one-rank function: tp_allreduce and tp_copy (the identity),
 * tp_all_gather (x at rank r's place, zeros at the others'; with sum=1 its
 * VJP is a reduce-scatter) and tp_reduce_scatter (rank r's part). Variant:
 * which op, as rank 1 of 2 or rank 2 of 3. */
static int b_tp(Ctx *c, int v)
{
    static const struct {
        Opcode op;
        int axis, n, rank, sum;
    } t[] = {{OP_TP_ALLREDUCE, 0, 2, 1, 0}, {OP_TP_COPY, 0, 3, 2, 0},
             {OP_TP_ALL_GATHER, 1, 2, 1, 0}, {OP_TP_ALL_GATHER, 2, 3, 2, 1},
             {OP_TP_REDUCE_SCATTER, 2, 2, 1, 0}, {OP_TP_REDUCE_SCATTER, 0, 2, 0, 0}};
    int x = param(c, "x", F32(3, 2, 3, 6));
    OpAttr a = {.nia = t[v].sum ? 4 : 3, .ia = {t[v].axis, t[v].n, t[v].rank, t[v].sum}};
    /* a nonlinear reader, so that each output element's cotangent differs */
    int y = op1(c, t[v].op, x, &a);
    return op2(c, OP_MUL, y, y);
}

static const Case cases[] = {
    {"tp", b_tp, 6, D_ANY},
    {"im2col", b_im2col, 4, D_ANY},    {"col2im", b_col2im, 4, D_ANY},
    {"conv", b_conv, 4, D_ANY},
    {"logsumexp", b_logsumexp, 3, D_ANY}, {"take_along", b_take_along, 1, D_ANY},
    {"xent_lse", b_xent_lse, 1, D_ANY},
    {"unary", b_unary, 13, D_ANY},     {"binary", b_binary, 14, D_ANY},
    {"reuse", b_reuse, 2, D_ANY},      {"cast", b_cast, 1, D_ANY},
    {"select", b_select, 1, D_ANY},    {"broadcast", b_broadcast, 5, D_ANY},
    {"reshape", b_reshape, 2, D_ANY},  {"permute", b_permute, 2, D_ANY},
    {"slice", b_slice, 2, D_ANY},      {"slices", b_slices, 3, D_ANY},
    {"pad", b_pad, 2, D_ANY},
    {"concat", b_concat, 2, D_ANY},    {"gather", b_gather, 1, D_ANY},
    {"scatter_add", b_scatter, 1, D_ANY}, {"reduce", b_reduce, 4, D_ANY},
    {"matmul", b_matmul, 16, D_ANY},   {"xent", b_xent, 2, D_ANY},
    {"attention", b_attention, 7, D_ANY},
    {"attention_qkv", b_attention_qkv, 5, D_ANY},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* Opcodes with no gradient by design. Every other opcode must be covered.
 * attention_lse and the attention gradients appear only in backward (no
 * second derivatives). */
static const Opcode no_grad_ops[] = {OP_CONST, OP_IOTA, OP_LT, OP_LE, OP_GT,
                                     OP_GE,    OP_EQ,   OP_NE, OP_RANDOM, OP_FLOOR,
                                     OP_ALLREDUCE_START, OP_ALLREDUCE_WAIT,
                                     OP_SHARD_PACK, OP_REDUCE_SCATTER,
                                     OP_REDUCE_SCATTER_START, OP_REDUCE_SCATTER_WAIT,
                                     OP_ALL_GATHER, OP_ALL_GATHER_START, OP_ALL_GATHER_WAIT,
                                     OP_ATTENTION_LSE, OP_ATTENTION_DQ,
                                     OP_ATTENTION_DK, OP_ATTENTION_DV, OP_ATTENTION_DQKV};

/* ---- harness -------------------------------------------------------------- */

static double **bind(const Graph *g, const Ctx *c)
{
    double **val = ir_interp_alloc(g);
    for (int i = 0; i < c->nin; i++) {
        int t = ir_find_tensor(g, c->name[i]);
        assert_true(t >= 0);
        size_t n = (size_t)shape_numel(&g->t.v[t].s);
        val[t] = xmalloc(sizeof(double) * (n ? n : 1));
        memcpy(val[t], c->val[i], sizeof(double) * n);
    }
    return val;
}

static double eval_loss(const Graph *g, const Ctx *c)
{
    double **val = bind(g, c);
    ir_interp(g, val, NULL);
    double l = val[ir_find_output(g, "loss")][0];
    ir_interp_free(g, val);
    return l;
}

static Ctx new_ctx(const Case *k, int variant)
{
    Ctx c = {.g = ir_new(), .dom = k->dom, .rng = 0x9E3779B97F4A7C15ull * (uint64_t)(variant + 7)};
    for (const char *p = k->name; *p; p++)
        c.rng = c.rng * 31 + (uint64_t)*p;
    return c;
}

static void free_ctx(Ctx *c)
{
    ir_free(c->g);
    for (int i = 0; i < c->nin; i++)
        free(c->val[i]);
}

/* Marks the opcodes of the case's ops that lie on a path from a param. */
static void mark_coverage(const Graph *g, bool *covered)
{
    bool *live = xcalloc((size_t)g->t.n, sizeof(bool));
    for (int i = 0; i < g->t.n; i++)
        live[i] = g->t.v[i].kind == TK_PARAM;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++)
            if (live[op->in[j]] && dtype_is_float(g->t.v[op->out].s.dtype))
                live[op->out] = true;
        if (live[op->out])
            covered[op->code] = true;
    }
    free(live);
}

/* Builds, differentiates and checks one case; false (with messages) on failure. */
static bool run_case(const Case *k, int variant)
{
    Ctx c = new_ctx(k, variant);
    int r = k->build(&c, variant);
    bool ok = true;

    /* loss = reshape(reduce_sum(r * W)) */
    Shape rs = c.g->t.v[r].s;
    int64_t n = shape_numel(&rs);
    double *w = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        w[i] = draw(&c, D_EXACT);
    int W = input_vals(&c, "W", rs, w);
    free(w);
    int prod = op2(&c, OP_MUL, r, W);
    int sum = prod;
    if (rs.rank > 0) {
        OpAttr all = {.nia = rs.rank};
        for (int i = 0; i < rs.rank; i++)
            all.ia[i] = i;
        sum = op1(&c, OP_REDUCE_SUM, prod, &all);
    }
    OpAttr scalar = {.rank = 0};
    int loss = op1(&c, OP_RESHAPE, sum, &scalar);
    ir_add_output(c.g, "loss", loss);

    char err[1024];
    if (!ir_verify(c.g, err, sizeof err))
        fail_msg("%s/%d: forward graph invalid: %s", k->name, variant, err);
    Graph *gb = ir_clone(c.g);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    if (!pass_autodiff(gb, &o, &d))
        fail_msg("%s/%d: autodiff failed: %s", k->name, variant, d.msg);
    if (!ir_verify(gb, err, sizeof err))
        fail_msg("%s/%d: graph invalid after autodiff: %s", k->name, variant, err);
    /* autodiff's ops are flagged backward, but for the forward sibling
     * attention_lse it places next to its attention op */
    int nfwd = 0;
    for (int i = 0; i < gb->ops.n; i++)
        nfwd += !(gb->ops.v[i].flags & OPF_BACKWARD) && gb->ops.v[i].code != OP_ATTENTION_LSE;
    assert_int_equal(nfwd, c.g->ops.n);

    double **val = bind(gb, &c);
    ir_interp(gb, val, NULL);
    /* with attention: also the graph after the passes that rewrite its
     * backward (the head layout, attention_dqkv) */
    Graph *gl = NULL;
    double **vall = NULL;
    bool attn = false;
    for (int i = 0; i < c.g->ops.n; i++)
        attn |= c.g->ops.v[i].code == OP_ATTENTION;
    if (attn) {
        gl = ir_clone(gb);
        PassOpts ol = o;
        ol.attention = true;
        if (!pass_attention_layout(gl, &ol, &d) || !pass_simplify(gl, &ol, &d) ||
            !pass_attention_dqkv(gl, &ol, &d))
            fail_msg("%s/%d: attention passes: %s", k->name, variant, d.msg);
        if (!ir_verify(gl, err, sizeof err))
            fail_msg("%s/%d: graph invalid after the attention passes: %s", k->name, variant,
                     err);
        int ndqkv = 0;
        for (int i = 0; i < gl->ops.n; i++)
            ndqkv += gl->ops.v[i].code == OP_ATTENTION_DQKV;
        assert_int_equal(ndqkv, strcmp(k->name, "attention_qkv") == 0);
        vall = bind(gl, &c);
        ir_interp(gl, vall, NULL);
    }
    assert_true(fabs(val[ir_find_output(gb, "loss")][0] - eval_loss(c.g, &c)) < 1e-12);
    for (int i = 0; i < c.nin; i++) {
        int t = ir_find_tensor(c.g, c.name[i]);
        if (c.g->t.v[t].kind != TK_PARAM)
            continue;
        char *gname = xasprintf("grad.%s", c.name[i]);
        int gt = ir_find_output(gb, gname);
        if (gt < 0)
            fail_msg("%s/%d: no output %s", k->name, variant, gname);
        int64_t np = shape_numel(&c.g->t.v[t].s);
        double *fd = xmalloc(sizeof(double) * (size_t)np);
        for (int64_t j = 0; j < np; j++) {
            double x0 = c.val[i][j], h = 1e-5 * (fabs(x0) > 1 ? fabs(x0) : 1);
            c.val[i][j] = x0 + h;
            double lp = eval_loss(c.g, &c);
            c.val[i][j] = x0 - h;
            double lm = eval_loss(c.g, &c);
            c.val[i][j] = x0;
            fd[j] = (lp - lm) / (2 * h);
        }
        double e = rel_err(val[gt], fd, np);
        if (gl) {
            double el = rel_err(vall[ir_find_output(gl, gname)], fd, np);
            if (!(el < 1e-6)) {
                print_error("%s/%d: %s after the attention passes: relative error %.3g "
                            "(expected < 1e-6)\n",
                            k->name, variant, gname, el);
                ok = false;
            }
        }
        if (!(e < 1e-6)) {
            for (int64_t j = 0; j < np; j++)
                print_message("  %s[%lld]: autodiff %.10g, finite differences %.10g\n", gname,
                              (long long)j, val[gt][j], fd[j]);
            print_error("%s/%d: %s relative error %.3g (expected < 1e-6)\n", k->name,
                        variant, gname, e);
            ok = false;
        }
        free(fd);
        free(gname);
    }
    ir_interp_free(gb, val);
    ir_free(gb);
    if (gl) {
        ir_interp_free(gl, vall);
        ir_free(gl);
    }
    free_ctx(&c);
    return ok;
}

static void test_cases(void **state)
{
    (void)state;
    int failed = 0, total = 0;
    for (int k = 0; k < NCASES; k++)
        for (int v = 0; v < cases[k].nvariants; v++, total++)
            failed += !run_case(&cases[k], v);
    if (failed)
        fail_msg("%d of %d gradient checks failed", failed, total);
}

static void test_every_vjp_rule_checked(void **state)
{
    (void)state;
    bool covered[OP__COUNT] = {0};
    for (int k = 0; k < NCASES; k++)
        for (int v = 0; v < cases[k].nvariants; v++) {
            Ctx c = new_ctx(&cases[k], v);
            cases[k].build(&c, v);
            mark_coverage(c.g, covered);
            free_ctx(&c);
        }
    int missing = 0;
    for (int op = 0; op < OP__COUNT; op++) {
        bool nograd = false;
        for (size_t j = 0; j < sizeof no_grad_ops / sizeof no_grad_ops[0]; j++)
            nograd |= no_grad_ops[j] == (Opcode)op;
        if (!nograd && !covered[op]) {
            print_error("opcode %s has a VJP rule but no gradient check\n",
                        ir_opinfo[op].name);
            missing++;
        }
    }
    assert_int_equal(missing, 0);
}

/* ---- ties (finite differences are not defined there) ------------------- */

/* Differentiates c's graph (its output "loss" already set) and returns the
 * interpreter's value of grad.NAME (numel n), malloc'd. */
static double *grad_of(Ctx *c, const char *name, int64_t n)
{
    Graph *gb = ir_clone(c->g);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    if (!pass_autodiff(gb, &o, &d))
        fail_msg("autodiff failed: %s", d.msg);
    char err[1024];
    if (!ir_verify(gb, err, sizeof err))
        fail_msg("graph invalid after autodiff: %s", err);
    double **val = bind(gb, c);
    ir_interp(gb, val, NULL);
    char *gname = xasprintf("grad.%s", name);
    int gt = ir_find_output(gb, gname);
    assert_true(gt >= 0);
    assert_int_equal(shape_numel(&gb->t.v[gt].s), n);
    double *r = xmalloc(sizeof(double) * (size_t)n);
    memcpy(r, val[gt], sizeof(double) * (size_t)n);
    free(gname);
    ir_interp_free(gb, val);
    ir_free(gb);
    return r;
}

static int scalar_loss(Ctx *c, int r)
{
    Shape rs = c->g->t.v[r].s;
    OpAttr all = {.nia = rs.rank};
    for (int i = 0; i < rs.rank; i++)
        all.ia[i] = i;
    int sum = rs.rank ? op1(c, OP_REDUCE_SUM, r, &all) : r;
    OpAttr scalar = {.rank = 0};
    int loss = op1(c, OP_RESHAPE, sum, &scalar);
    ir_add_output(c->g, "loss", loss);
    return loss;
}

static void expect_grad(const double *got, const double *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-12)
            fail_msg("%s: gradient[%lld] is %.10g (expected %.10g)", what, (long long)i, got[i],
                     want[i]);
}

/* max (and min, which the frontend builds as -max(-x)) over axes with tied
 * elements: the incoming gradient is split evenly over the tied elements,
 * so they sum to it (issue 13, item 12); untied and non-max elements get
 * exactly what they did before. */
static void test_max_ties(void **state)
{
    (void)state;
    /* rows of x [2,4] reduced over axis 1, weighted 2 and -3: row 0 has a
     * two-way tie, row 1 a three-way tie */
    static const double xv[8] = {1, 3, 3, 2, 5, 5, 5, 0};
    static const double wv[2] = {2, -3};
    for (int mn = 0; mn < 2; mn++) {
        Ctx c = {.g = ir_new()};
        double *x0 = xmalloc(sizeof xv);
        for (int i = 0; i < 8; i++)
            x0[i] = mn ? -xv[i] : xv[i]; /* min of -x ties where max of x does */
        int x = add_named(&c, TK_PARAM, "x", F32(2, 2, 4), x0);
        OpAttr ax = {.nia = 1, .ia = {1}};
        int r = mn ? op1(&c, OP_NEG, op1(&c, OP_REDUCE_MAX, op1(&c, OP_NEG, x, NULL), &ax), NULL)
                   : op1(&c, OP_REDUCE_MAX, x, &ax);
        int W = input_vals(&c, "W", F32(2, 2, 1), wv);
        scalar_loss(&c, op2(&c, OP_MUL, r, W));
        double *g = grad_of(&c, "x", 8);
        const double want[8] = {0, 1, 1, 0, -1, -1, -1, 0};
        expect_grad(g, want, 8, mn ? "min over axis 1" : "max over axis 1");
        assert_true(fabs(g[1] + g[2] - wv[0]) < 1e-12 && fabs(g[4] + g[5] + g[6] - wv[1]) < 1e-12);
        free(g);
        free_ctx(&c);
    }

    /* x [2,2,3] reduced over axes 0 and 2: per middle index j, the max of
     * six elements, tied twice for j = 0 and four times for j = 1 */
    {
        static const double v[12] = {7, 1, 7, 4, 4, 0, /* i = 0: j = 0, j = 1 */
                                     2, 3, 6, 4, 4, -1};
        Ctx c = {.g = ir_new()};
        double *x0 = xmalloc(sizeof v);
        memcpy(x0, v, sizeof v);
        int x = add_named(&c, TK_PARAM, "x", F32(3, 2, 2, 3), x0);
        OpAttr ax = {.nia = 2, .ia = {0, 2}};
        int r = op1(&c, OP_REDUCE_MAX, x, &ax); /* [1,2,1] */
        static const double wv2[2] = {1, 0.5};
        int W = input_vals(&c, "W", F32(3, 1, 2, 1), wv2);
        scalar_loss(&c, op2(&c, OP_MUL, r, W));
        double *g = grad_of(&c, "x", 12);
        const double want[12] = {0.5, 0, 0.5, 0.125, 0.125, 0, 0, 0, 0, 0.125, 0.125, 0};
        expect_grad(g, want, 12, "max over axes 0 and 2");
        free(g);
        free_ctx(&c);
    }

    /* the reproduction: w = 1, loss = max(concat(w, w)) - 1.5 sum(w):
     * d(loss)/dw = 0.5 + 0.5 - 1.5 = -0.5, so gradient descent raises w (the
     * old rule gave 1 + 1 - 1.5 = +0.5) */
    {
        Ctx c = {.g = ir_new()};
        double *w0 = xmalloc(sizeof(double));
        w0[0] = 1;
        int w = add_named(&c, TK_PARAM, "w", F32(1, 1), w0);
        OpAttr cat = {.nia = 1, .ia = {0}}, ax = {.nia = 1, .ia = {0}};
        int ww = ir_op_x(c.g, OP_CONCAT, (int[]){w, w}, 2, &cat, here(__LINE__));
        int mx = op1(&c, OP_REDUCE_MAX, ww, &ax);
        int k = input_vals(&c, "k", F32(1, 1), (const double[]){1.5});
        int sw = op1(&c, OP_REDUCE_SUM, w, &ax);
        scalar_loss(&c, op2(&c, OP_SUB, mx, op2(&c, OP_MUL, k, sw)));
        double *g = grad_of(&c, "w", 1);
        expect_grad(g, (const double[]){-0.5}, 1, "max(concat(w, w)) - 1.5 w");
        free(g);
        free_ctx(&c);
    }
}

/* A loss that is not a scalar float is a user error naming its source line. */
static void test_loss_must_be_scalar(void **state)
{
    (void)state;
    Graph *g = ir_new();
    ParamInit none = {0};
    int x = ir_add_input(g, TK_PARAM, "x", F32(1, 3), none);
    int y = ir_op_x(g, OP_EXP, &x, 1, NULL, (SrcLoc){intern("model.lua"), 12});
    ir_add_output(g, "loss", y);
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};
    assert_false(pass_autodiff(g, &o, &d));
    assert_string_equal(d.msg,
                        "model.lua:12: the loss must be a scalar float (expected f32[], got f32[3])");
    ir_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_every_vjp_rule_checked),
        cmocka_unit_test(test_max_ties),
        cmocka_unit_test(test_loss_must_be_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
