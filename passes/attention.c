/* attention.c - the attention pass: finds scaled-dot-product attention
 * written out in primitives and rewrites it to one `attention` op (ir.h),
 * so the backend runs it as one fused kernel in each direction (no T x T
 * tensor in memory). Runs first, before autodiff, which then derives the
 * fused backward (attention_lse, attention_dq/dk/dv). Off unless
 * o->attention (the runtime sets it for backends that have the kernels:
 * rt_pass_opts); --no-fuse-attention turns it off.
 *
 * The pattern, read backwards from the second matmul (docs/fusion.md):
 *   S0 = matmul(q, k) {ta=0, tb=1}        q, k, v of one rank (no shared k);
 *        k and v may be repeats of fewer heads, reshape(broadcast(reshape(
 *        k0))) (grouped-query attention: the op reads k0, v0)
 *   s  = S0 * c | c * S0 | S0 / c | S0    c a positive constant (broadcast)
 *   a  = s + alibi | alibi + s | s        slopes * (j - i), the slopes a
 *        function of constants and iotas evaluated here to ALiBi's
 *   b  = a + B | B + a | a                B a float tensor (through its
 *        broadcasts) that fits the scores (ir_attn_bias_fits): the op's
 *        bias operand; one that depends on a param is left unfused (the
 *        fused backward gives it no gradient), and says so in the dump
 *   x  = select(keep, b, f) | select(drop, f, b) | b, and at most two more
 *        selects around or inside it:
 *        keep / drop: an iota compare (through broadcasts) whose operands
 *        are the row index i and the column index j of the scores, meaning
 *        exactly j <= i (keep: i >= j, j <= i; drop: i < j, j > i); f a
 *        constant <= -1e4 or -inf; the other select a sliding window's,
 *        keep meaning exactly i - j < w (with the causal mask only); the
 *        third any u8 tensor M fitting the scores, select(M, b, f): the
 *        op's mask operand (not with a bias B)
 *   z  = x - [stop_gradient] broadcast(reduce_max(x, last)) | x
 *   P  = exp(z) / broadcast(reduce_sum(exp(z), last))
 *   o  = matmul(P, v) {ta=0, tb=0}        -> attention(q, k, v) {causal, scale}
 * Invariant: it rewrites only when the result is the same function: every
 * intermediate (S0, s, x, z, exp(z), the max and sum chains, P) has no user
 * outside the pattern and is no graph output or update; the mask is checked
 * structurally (iota axes, compare, operand order), never evaluated. Dropout
 * between softmax and the matmul (P is then a select of a random compare),
 * a window without the causal mask, a bias and a mask together, another
 * user of P or of the scores,
 * casts inside the pattern: no match, the graph is left as it was. The
 * matched ops that nothing reads any more are removed (the mask's iotas
 * too, when nothing else reads them). */
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const Graph *g;
    const int *uses;
    const bool *grad; /* per tensor: whether it depends on a param (needs a gradient) */
    const char *no_bias; /* why a bias or mask stays unfused on this backend; NULL: fused */
} Ctx;

static const Op *def(const Ctx *c, int t)
{
    int i = c->g->t.v[t].op;
    return i >= 0 ? &c->g->ops.v[i] : NULL;
}

static bool is(const Ctx *c, int t, Opcode code)
{
    const Op *op = def(c, t);
    return op && op->code == code;
}

/* Read by exactly one op and no output or update. */
static bool single(const Ctx *c, int t) { return c->uses[t] == 1; }

static int rank_of(const Ctx *c, int t) { return c->g->t.v[t].s.rank; }

/* Whether t (through broadcasts) is a const; sets *v. */
static bool const_value(const Ctx *c, int t, double *v)
{
    while (is(c, t, OP_BROADCAST))
        t = def(c, t)->in[0];
    if (!is(c, t, OP_CONST))
        return false;
    *v = def(c, t)->attr.f;
    return true;
}

/* Whether op reduces exactly the last axis of its operand. */
static bool reduces_last(const Ctx *c, const Op *op)
{
    return op->attr.nia == 1 && op->attr.ia[0] == rank_of(c, op->in[0]) - 1;
}

/* The iota axis t varies along, in t's own axes, following broadcasts
 * (right-aligned; an axis broadcast from size 1 does not vary); -1 when t
 * is not such an iota. Only integer or f32 iotas (exact indices). */
static int iota_axis(const Ctx *c, int t)
{
    const Op *op = def(c, t);
    if (!op)
        return -1;
    if (op->code == OP_IOTA) {
        DType dt = c->g->t.v[t].s.dtype;
        return dt == DT_I32 || dt == DT_I64 || dt == DT_F32 ? (int)op->attr.ia[0] : -1;
    }
    if (op->code != OP_BROADCAST)
        return -1;
    int a = iota_axis(c, op->in[0]);
    const Shape *in = &c->g->t.v[op->in[0]].s, *out = &c->g->t.v[t].s;
    if (a < 0 || in->dim[a] != out->dim[a + out->rank - in->rank])
        return -1;
    return a + out->rank - in->rank;
}

/* Whether select mask m (u8 of the scores' shape [..., Tq, Tk]) keeps
 * exactly the (i, j) with j <= i when `keep_true` (select(m, s, f)) or when
 * false (select(m, f, s)). */
static bool causal_mask(const Ctx *c, int m, bool keep_true)
{
    int64_t Tq = c->g->t.v[m].s.dim[rank_of(c, m) - 2];
    int64_t Tk = c->g->t.v[m].s.dim[rank_of(c, m) - 1];
    while (is(c, m, OP_BROADCAST))
        m = def(c, m)->in[0];
    const Op *cmp = def(c, m);
    int r = rank_of(c, m);
    if (!cmp || r < 2 || c->g->t.v[m].s.dim[r - 2] != Tq || c->g->t.v[m].s.dim[r - 1] != Tk)
        return false;
    Opcode code = cmp->code;
    if (code != OP_GE && code != OP_LE && code != OP_GT && code != OP_LT)
        return false;
    int a = iota_axis(c, cmp->in[0]), b = iota_axis(c, cmp->in[1]);
    int ra = rank_of(c, cmp->in[0]);
    if (ra != r || a < 0 || b < 0)
        return false;
    /* a row (i) or column (j) index each, one of each */
    bool arow = a == r - 2, brow = b == r - 2;
    if ((a != r - 2 && a != r - 1) || (b != r - 2 && b != r - 1) || arow == brow)
        return false;
    if (!arow) { /* cmp(j, i): swap to cmp'(i, j) */
        code = code == OP_GE ? OP_LE : code == OP_LE ? OP_GE : code == OP_GT ? OP_LT : OP_GT;
    }
    /* kept j <= i: i >= j selects s; i < j selects f */
    return keep_true ? code == OP_GE : code == OP_LT;
}

/* t through broadcasts and (float) casts. */
static int through_bcast(const Ctx *c, int t)
{
    while (is(c, t, OP_BROADCAST) || (is(c, t, OP_CAST) && c->g->t.v[t].s.dtype != DT_U8))
        t = def(c, t)->in[0];
    return t;
}

/* Whether select mask m (u8 of the scores' shape [..., Tq, Tk]) is a
 * sliding window: compare(sub(i, j), w) meaning exactly i - j < w (lt(i -
 * j, w), le(i - j, w - 1), gt(j - i, -w), ge(j - i, 1 - w), or the same
 * with the operands swapped), i and j iotas (through broadcasts) along the
 * row and the column axis; keep_true as for causal_mask. Sets *w >= 1. */
static bool window_mask(const Ctx *c, int m, bool keep_true, int64_t *w)
{
    if (!keep_true)
        return false;
    int r0 = rank_of(c, m);
    int64_t Tq = c->g->t.v[m].s.dim[r0 - 2], Tk = c->g->t.v[m].s.dim[r0 - 1];
    while (is(c, m, OP_BROADCAST))
        m = def(c, m)->in[0];
    const Op *cmp = def(c, m);
    int r = rank_of(c, m);
    if (!cmp || r < 2 || c->g->t.v[m].s.dim[r - 2] != Tq || c->g->t.v[m].s.dim[r - 1] != Tk)
        return false;
    Opcode code = cmp->code;
    if (code != OP_GE && code != OP_LE && code != OP_GT && code != OP_LT)
        return false;
    int d = cmp->in[0], k = cmp->in[1];
    double cv;
    if (!const_value(c, k, &cv)) { /* cmp(c, d): swap to cmp'(d, c) */
        int x = d;
        d = k, k = x;
        if (!const_value(c, k, &cv))
            return false;
        code = code == OP_GE ? OP_LE : code == OP_LE ? OP_GE : code == OP_GT ? OP_LT : OP_GT;
    }
    if (cv != floor(cv) || fabs(cv) > 1e15)
        return false;
    while (is(c, d, OP_BROADCAST))
        d = def(c, d)->in[0];
    if (!is(c, d, OP_SUB) || rank_of(c, d) != r)
        return false;
    int a = iota_axis(c, def(c, d)->in[0]), b = iota_axis(c, def(c, d)->in[1]);
    int64_t wv;
    if (a == r - 2 && b == r - 1) /* d = i - j: keep d < w */
        wv = code == OP_LT ? (int64_t)cv : code == OP_LE ? (int64_t)cv + 1 : 0;
    else if (a == r - 1 && b == r - 2) /* d = j - i: keep d > -w */
        wv = code == OP_GT ? -(int64_t)cv : code == OP_GE ? 1 - (int64_t)cv : 0;
    else
        return false;
    if (wv < 1)
        return false;
    *w = wv;
    return true;
}

/* The value at idx of t, a function of constants and iotas only
 * (elementwise ops and broadcasts); NAN when t reads anything else. */
static double const_eval(const Ctx *c, int t, const int64_t *idx, int depth)
{
    const Op *op = def(c, t);
    if (!op || depth > 64)
        return NAN;
    const Shape *s = &c->g->t.v[t].s;
    double x[3];
    if (op->code == OP_CONST)
        return op->attr.f;
    if (op->code == OP_IOTA)
        return (double)idx[op->attr.ia[0]];
    if (op->code == OP_BROADCAST) {
        const Shape *in = &c->g->t.v[op->in[0]].s;
        int64_t j[IR_MAX_RANK];
        for (int a = 0; a < in->rank; a++) {
            int oa = a + s->rank - in->rank;
            j[a] = in->dim[a] == 1 ? 0 : idx[oa];
        }
        return const_eval(c, op->in[0], j, depth + 1);
    }
    int ar = ir_opinfo[op->code].arity;
    if (ir_opinfo[op->code].cls != OC_ELEMWISE || ar < 1 || ar > 3)
        return NAN;
    for (int i = 0; i < ar; i++)
        x[i] = const_eval(c, op->in[i], idx, depth + 1);
    switch (op->code) {
    case OP_CAST: return x[0];
    case OP_NEG: return -x[0];
    case OP_EXP: return exp(x[0]);
    case OP_LOG: return log(x[0]);
    case OP_SQRT: return sqrt(x[0]);
    case OP_POW: return pow(x[0], x[1]);
    case OP_ADD: return x[0] + x[1];
    case OP_SUB: return x[0] - x[1];
    case OP_MUL: return x[0] * x[1];
    case OP_DIV: return x[0] / x[1];
    case OP_LT: return x[0] < x[1];
    case OP_LE: return x[0] <= x[1];
    case OP_GT: return x[0] > x[1];
    case OP_GE: return x[0] >= x[1];
    case OP_SELECT: return x[0] != 0 ? x[1] : x[2];
    default: return NAN;
    }
}

/* Whether t (of the scores' shape [..., H, Tq, Tk], rank R) is ALiBi's
 * bias: slopes * rel (either order, through broadcasts and casts) with rel
 * = j - i (a column iota minus a row iota) and slopes a function of
 * constants and iotas of shape [H, 1, 1] (leading 1s allowed) whose values
 * are ir_alibi_slope(H, h) to 1e-5, H the scores' axis R - 3. */
static bool alibi_bias(const Ctx *c, int t, int R)
{
    if (R < 3)
        return false;
    int64_t H = c->g->t.v[t].s.dim[R - 3];
    t = through_bcast(c, t);
    if (!is(c, t, OP_MUL))
        return false;
    for (int x = 0; x < 2; x++) {
        int rel = through_bcast(c, def(c, t)->in[x]), sl = def(c, t)->in[1 - x];
        int rr = rank_of(c, rel);
        /* the slopes under the broadcasts to [..., H, T, T] */
        while (is(c, sl, OP_BROADCAST)) {
            int in = def(c, sl)->in[0], ri = rank_of(c, in);
            if (ri < 3 || c->g->t.v[in].s.dim[ri - 3] != H)
                break;
            sl = in;
        }
        if (!is(c, rel, OP_SUB) || rr < 2 ||
            iota_axis(c, def(c, rel)->in[0]) != rr - 1 ||
            iota_axis(c, def(c, rel)->in[1]) != rr - 2)
            continue;
        const Shape *ss = &c->g->t.v[sl].s;
        int rs = ss->rank;
        if (rs < 3 || ss->dim[rs - 1] != 1 || ss->dim[rs - 2] != 1 || ss->dim[rs - 3] != H)
            continue;
        bool ok = true;
        for (int a = 0; a < rs - 3; a++)
            ok = ok && ss->dim[a] == 1;
        for (int64_t h = 0; h < H && ok; h++) {
            int64_t idx[IR_MAX_RANK] = {0};
            idx[rs - 3] = h;
            double v = const_eval(c, sl, idx, 0), want = ir_alibi_slope(H, h);
            ok = fabs(v - want) <= 1e-5 * want;
        }
        if (ok)
            return true;
    }
    return false;
}

/* k (or v) [..., H, T, D] = reshape(broadcast(reshape(k0))): k0 [..., Hk,
 * T, D] with each head repeated g = H / Hk times in place (nn.attention's
 * repeat for grouped-query attention); the one reader of each step. Sets
 * *k0; returns g (1: no such repeat). */
static int64_t repeated(const Ctx *c, int k, int *k0)
{
    *k0 = k;
    int R = rank_of(c, k);
    if (R < 3 || !is(c, k, OP_RESHAPE))
        return 1;
    int y = def(c, k)->in[0];
    if (!single(c, y) || !is(c, y, OP_BROADCAST) || rank_of(c, y) != R + 1)
        return 1;
    int z = def(c, y)->in[0];
    if (!single(c, z) || !is(c, z, OP_RESHAPE) || rank_of(c, z) != R + 1)
        return 1;
    int x = def(c, z)->in[0];
    const Shape *sk = &c->g->t.v[k].s, *sy = &c->g->t.v[y].s, *sz = &c->g->t.v[z].s,
                *sx = &c->g->t.v[x].s;
    if (sx->rank != R || sx->dtype != sk->dtype)
        return 1;
    for (int a = 0; a < R - 3; a++)
        if (sx->dim[a] != sk->dim[a] || sz->dim[a] != sk->dim[a] || sy->dim[a] != sk->dim[a])
            return 1;
    int64_t Hk = sx->dim[R - 3], g = sy->dim[R - 2];
    /* z [..., Hk, 1, T, D], y [..., Hk, g, T, D], k [..., Hk*g, T, D] */
    if (sz->dim[R - 3] != Hk || sz->dim[R - 2] != 1 || sy->dim[R - 3] != Hk ||
        sk->dim[R - 3] != Hk * g || g < 1)
        return 1;
    for (int a = R - 2; a < R; a++)
        if (sx->dim[a] != sk->dim[a] || sz->dim[a + 1] != sk->dim[a] || sy->dim[a + 1] != sk->dim[a])
            return 1;
    *k0 = x;
    return g;
}

/* A match: the attention op's operands and attrs; why: when the pattern
 * was found but is left unfused, the reason (for the dump). */
typedef struct {
    int q, k, v;
    bool causal, alibi;
    int64_t window;
    int bias, bt; /* IR_ATTN_BIAS or IR_ATTN_MASK and its tensor; 0, -1: none */
    double scale;
    const char *why;
} Match;

/* Whether t, read through broadcasts as t0, fits the scores [..., Tq, Tk]
 * (rank R, shape of s) as attention's bias or mask (ir_attn_bias_fits). */
static bool bias_operand(const Ctx *c, int t, int s, int *t0)
{
    const Shape *ss = &c->g->t.v[s].s;
    while (is(c, t, OP_BROADCAST))
        t = def(c, t)->in[0];
    *t0 = t;
    int R = ss->rank;
    return ir_attn_bias_fits(ss->dim, R - 2, ss->dim[R - 2], ss->dim[R - 1], &c->g->t.v[t].s,
                             NULL);
}

/* Per tensor of g: whether it depends on a param (autodiff would ask for
 * its gradient). */
static bool *param_deps(const Graph *g)
{
    bool *d = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int t = 0; t < g->t.n; t++)
        d[t] = g->t.v[t].kind == TK_PARAM;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code == OP_STOP_GRADIENT)
            continue;
        for (int j = 0; j < op->nin; j++)
            d[op->out] = d[op->out] || d[op->in[j]];
    }
    return d;
}

/* Whether the op at index i (a matmul) ends an attention pattern. */
static bool match(const Ctx *c, int i, Match *mt)
{
    mt->why = NULL;
    const Graph *g = c->g;
    const Op *o = &g->ops.v[i];
    if (o->code != OP_MATMUL || o->attr.ia[0] || o->attr.ia[1])
        return false;
    int P = o->in[0], v = o->in[1], R = rank_of(c, P);
    if (rank_of(c, v) != R || R < 2 || !single(c, P) || !is(c, P, OP_DIV))
        return false;
    /* P = e / broadcast(reduce_sum(e, last)) */
    const Op *dv = def(c, P);
    int e = dv->in[0], bs = dv->in[1];
    if (!single(c, bs) || !is(c, bs, OP_BROADCAST))
        return false;
    int sum = def(c, bs)->in[0];
    if (!single(c, sum) || !is(c, sum, OP_REDUCE_SUM) || def(c, sum)->in[0] != e ||
        !reduces_last(c, def(c, sum)))
        return false;
    if (c->uses[e] != 2 || !is(c, e, OP_EXP))
        return false;
    int z = def(c, e)->in[0];
    if (!single(c, z))
        return false;
    /* z = x - stop_gradient(broadcast(max)) (either order, stop_gradient
     * optional), or z = x */
    int x = z;
    if (is(c, z, OP_SUB)) {
        const Op *sb = def(c, z);
        int mb = sb->in[1];
        while (single(c, mb) && (is(c, mb, OP_BROADCAST) || is(c, mb, OP_STOP_GRADIENT)))
            mb = def(c, mb)->in[0];
        if (is(c, mb, OP_REDUCE_MAX) && single(c, mb) && def(c, mb)->in[0] == sb->in[0] &&
            reduces_last(c, def(c, mb))) {
            x = sb->in[0];
            if (c->uses[x] != 2)
                return false;
        }
    }
    if (x == z && !single(c, x))
        return false;
    /* x = select(mask, s, fill) (or the mask's complement), or x = s; up
     * to three selects, the causal mask, a sliding window's and (any other
     * u8 mask, keeping where true) the user's mask */
    int s = x;
    mt->causal = false;
    mt->alibi = false;
    mt->window = 0;
    mt->bias = 0;
    mt->bt = -1;
    mt->why = NULL;
    for (int nsel = 0; nsel < 3 && is(c, s, OP_SELECT); nsel++) {
        const Op *se = def(c, s);
        double f;
        bool keep_true;
        if (const_value(c, se->in[2], &f) && !const_value(c, se->in[1], &(double){0})) {
            keep_true = true;
            s = se->in[1];
        } else if (const_value(c, se->in[1], &f)) {
            keep_true = false;
            s = se->in[2];
        } else {
            return false;
        }
        int64_t w;
        int m0;
        if (!(f <= -1e4) || !single(c, s))
            return false;
        if (!mt->causal && causal_mask(c, se->in[0], keep_true))
            mt->causal = true;
        else if (!mt->window && window_mask(c, se->in[0], keep_true, &w))
            mt->window = w;
        else if (!mt->bias && keep_true && bias_operand(c, se->in[0], s, &m0))
            mt->bias = IR_ATTN_MASK, mt->bt = m0;
        else
            return false;
    }
    if (mt->window && !mt->causal)
        return false;
    /* s = s' + alibi, s' + bias (either order; alibi inside the bias's add,
     * as nn.attention adds them) */
    for (int nadd = 0; nadd < 2 && is(c, s, OP_ADD); nadd++) {
        const Op *ad = def(c, s);
        int next = -1;
        for (int x2 = 0; x2 < 2 && next < 0; x2++)
            if (!mt->alibi && alibi_bias(c, ad->in[1 - x2], R)) {
                next = ad->in[x2];
                mt->alibi = true;
            }
        /* the bias: the operand that is not the scores' chain (a product, a
         * quotient, a matmul or alibi's add) */
        for (int x2 = 0; x2 < 2 && next < 0 && !mt->bias; x2++) {
            int sc = ad->in[x2], b = ad->in[1 - x2], b0;
            if (!(is(c, sc, OP_MUL) || is(c, sc, OP_DIV) || is(c, sc, OP_MATMUL) ||
                  is(c, sc, OP_ADD)) ||
                !dtype_is_float(c->g->t.v[b].s.dtype) || !bias_operand(c, b, s, &b0))
                continue;
            next = sc;
            mt->bias = IR_ATTN_BIAS, mt->bt = b0;
        }
        if (next < 0 && mt->bias == IR_ATTN_MASK && single(c, ad->in[0])) {
            mt->why = "it has both a bias and a mask tensor (the fused kernels take one; "
                      "fold the mask into the bias as -inf)";
            return false;
        }
        if (next < 0 || !single(c, next))
            return false;
        s = next;
    }
    /* s = S0 * c, c * S0, S0 / c, or S0 */
    int S0 = s;
    mt->scale = 1.0;
    if (is(c, s, OP_MUL) || is(c, s, OP_DIV)) {
        const Op *sc = def(c, s);
        double cv;
        if (const_value(c, sc->in[1], &cv)) {
            S0 = sc->in[0];
            mt->scale = sc->code == OP_MUL ? cv : 1.0 / cv;
        } else if (sc->code == OP_MUL && const_value(c, sc->in[0], &cv)) {
            S0 = sc->in[1];
            mt->scale = cv;
        } else {
            return false;
        }
        if (!single(c, S0) || !(mt->scale > 0) || mt->scale > 1e30)
            return false;
    }
    if (!is(c, S0, OP_MATMUL))
        return false;
    const Op *mm = def(c, S0);
    if (mm->attr.ia[0] || !mm->attr.ia[1])
        return false;
    mt->q = mm->in[0];
    mt->k = mm->in[1];
    mt->v = v;
    if (rank_of(c, mt->k) != R || rank_of(c, mt->q) != R)
        return false;
    /* grouped-query attention: k and v repeated alike */
    int k0, v0;
    int64_t gk = repeated(c, mt->k, &k0), gv = repeated(c, mt->v, &v0);
    if (gk > 1 && gk == gv && c->g->t.v[k0].s.dim[R - 3] == c->g->t.v[v0].s.dim[R - 3])
        mt->k = k0, mt->v = v0;
    /* the attention op's own typing (float dtype, batch dims, Tq == Tk when
     * causal) */
    OpAttr a = {.nia = 1, .ia = {mt->causal}, .f = mt->scale};
    ir_attn_set_variant(&a, mt->window, mt->alibi, 0, mt->bias);
    int in[4] = {mt->q, mt->k, mt->v, mt->bt};
    Shape out;
    char err[256];
    if (!ir_infer(g, OP_ATTENTION, in, mt->bias ? 4 : 3, &a, &out, err, sizeof err) ||
        !shape_eq(&out, &g->t.v[o->out].s))
        return false;
    /* found: the cases left unfused say why (pass_attention_print) */
    if (mt->bias == IR_ATTN_BIAS && c->grad[mt->bt]) {
        mt->why = "its additive bias depends on a param, and the fused backward gives no "
                  "gradient to the bias";
        return false;
    }
    if (mt->bias && c->no_bias) {
        mt->why = c->no_bias;
        return false;
    }
    return true;
}

bool pass_attention(Graph *g, const PassOpts *o, Diag *d)
{
    (void)d;
    if (!o->attention)
        return true;
    int *uses = ir_use_counts(g);
    bool *grad = param_deps(g);
    Ctx c = {g, uses, grad, NULL};
    bool *touched = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    int nmatch = 0;
    for (int i = 0; i < g->ops.n; i++) {
        Match mt;
        if (!match(&c, i, &mt))
            continue;
        Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++) {
            uses[op->in[j]]--;
            if (g->t.v[op->in[j]].op >= 0)
                touched[g->t.v[op->in[j]].op] = true;
        }
        int nin = mt.bias ? 4 : 3;
        op->code = OP_ATTENTION;
        op->in = xrealloc(op->in, sizeof(int) * (size_t)nin);
        op->nin = nin;
        op->in[0] = mt.q;
        op->in[1] = mt.k;
        op->in[2] = mt.v;
        if (mt.bias)
            op->in[3] = mt.bt;
        for (int j = 0; j < nin; j++)
            uses[op->in[j]]++;
        memset(&op->attr, 0, sizeof op->attr);
        op->attr.nia = 1;
        op->attr.ia[0] = mt.causal;
        op->attr.f = mt.scale;
        ir_attn_set_variant(&op->attr, mt.window, mt.alibi, 0, mt.bias);
        nmatch++;
    }
    if (nmatch) {
        /* drop what the rewrites left unread: touched ops with no uses, and
         * the ops only they read, in reverse program order */
        bool *drop = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
        for (int i = g->ops.n - 1; i >= 0; i--) {
            Op *op = &g->ops.v[i];
            if (!touched[i] || uses[op->out] > 0)
                continue;
            drop[i] = true;
            for (int j = 0; j < op->nin; j++) {
                uses[op->in[j]]--;
                if (g->t.v[op->in[j]].op >= 0)
                    touched[g->t.v[op->in[j]].op] = true;
            }
        }
        ir_drop_ops(g, drop);
        ir_compact(g);
        free(drop);
    }
    free(touched);
    free(grad);
    free(uses);
    return true;
}

void pass_attention_print(const Graph *g, FILE *f)
{
    int *uses = ir_use_counts(g);
    bool *grad = param_deps(g);
    Ctx c = {g, uses, grad, NULL};
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        char at[200] = ""; /* " (FILE:LINE)" where the op has a script line */
        if (op->loc.file && op->loc.line > 0)
            snprintf(at, sizeof at, " (%s:%d)", op->loc.file, op->loc.line);
        if (op->code == OP_ATTENTION) {
            const OpAttr *a = &op->attr;
            char sb[160] = "";
            int bt = ir_attn_bias_in(op);
            if (bt >= 0)
                shape_str(g, &g->t.v[bt].s, sb, sizeof sb);
            IrAttnLayout L;
            ir_attn_layout(g, op, &L);
            fprintf(f, "# attention %%%d%s: fused, %s%s", op->out, at,
                    a->ia[0] ? "causal" : "not causal", L.g > 1 ? ", grouped heads" : "");
            if (ir_attn_window(a))
                fprintf(f, ", window %lld", (long long)ir_attn_window(a));
            if (ir_attn_alibi(a))
                fputs(", alibi", f);
            if (bt >= 0)
                fprintf(f, ", %s %%%d %s", ir_attn_bias(a) == IR_ATTN_MASK ? "mask" : "bias", bt,
                        sb);
            fputc('\n', f);
            continue;
        }
        Match mt;
        if (op->code == OP_MATMUL && !match(&c, i, &mt) && mt.why)
            fprintf(f, "# attention %%%d%s: not fused: %s\n", op->out, at, mt.why);
    }
    free(grad);
    free(uses);
}
