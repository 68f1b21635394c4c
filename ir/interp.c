/* interp.c - the reference interpreter: the normative semantics of every
 * opcode (see ir.h), evaluated on the host one op at a time. Every value is a
 * double; integers are exact; each op result of dtype bf16/f16 is rounded to
 * that format (round to nearest, ties to even); u8 values are 0 or 1. f32
 * results are not rounded, so gradient checks run in full double precision.
 *
 * Choices the header leaves open: an out-of-range gather index reads zeros;
 * integer division truncates toward zero (x/0 gives 0); a cast of a float to
 * an integer truncates toward zero, to u8 gives (x != 0). The attention
 * family computes in double like every op (its "f32 arithmetic" is at least
 * f32) and rounds only its result. */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rounds x to a binary float with p significant bits, minimum normal
 * exponent emin (2^emin is the smallest normal) and largest finite `max`. */
static double round_fmt(double x, int p, int emin, double max)
{
    if (x == 0 || !isfinite(x))
        return x;
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    int q = e - 1 < emin ? emin - p + 1 : e - p; /* exponent of one ulp */
    double r = ldexp(nearbyint(ldexp(x, -q)), q);
    if (fabs(r) > max)
        return copysign(INFINITY, x);
    return r;
}

static double round_to(DType t, double x)
{
    switch (t) {
    case DT_BF16:
        return round_fmt(x, 8, -126, ldexp(255.0, 120));
    case DT_F16:
        return round_fmt(x, 11, -14, 65504.0);
    case DT_U8:
        return x != 0;
    default:
        return x;
    }
}

/* Row-major strides of s. */
static void strides_of(const Shape *s, int64_t *st)
{
    int64_t k = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        st[i] = k;
        k *= s->dim[i];
    }
}

/* out[j] = in[off + sum_i idx_i * ist[i]] for every multi-index of `s`. */
static void strided_copy(double *out, const double *in, const Shape *s, const int64_t *ist,
                         int64_t off)
{
    int64_t n = shape_numel(s), idx[IR_MAX_RANK] = {0};
    int r = s->rank;
    if (r == 0) {
        if (n)
            out[0] = in[off];
        return;
    }
    int64_t inner = s->dim[r - 1], is = ist[r - 1];
    for (int64_t j = 0; j < n; j += inner) {
        const double *p = in + off;
        for (int64_t k = 0; k < inner; k++)
            out[j + k] = p[k * is];
        for (int d = r - 2; d >= 0; d--) {
            off += ist[d];
            if (++idx[d] < s->dim[d])
                break;
            off -= ist[d] * s->dim[d];
            idx[d] = 0;
        }
    }
}

static double unary(Opcode c, double x)
{
    switch (c) {
    case OP_NEG: return -x;
    case OP_EXP: return exp(x);
    case OP_LOG: return log(x);
    case OP_SIN: return sin(x);
    case OP_COS: return cos(x);
    case OP_TANH: return tanh(x);
    case OP_SQRT: return sqrt(x);
    case OP_RSQRT: return 1.0 / sqrt(x);
    case OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case OP_RELU: return x > 0 ? x : 0.0;
    case OP_ABS: return fabs(x);
    case OP_ERF: return erf(x);
    case OP_FLOOR: return floor(x);
    default: die("interp: %s is not unary", ir_opinfo[c].name);
    }
}

static double binary(Opcode c, bool isint, double a, double b)
{
    switch (c) {
    case OP_ADD: return a + b;
    case OP_SUB: return a - b;
    case OP_MUL: return a * b;
    case OP_DIV:
        if (isint)
            return b == 0 ? 0.0 : trunc(a / b);
        return a / b;
    case OP_POW: return pow(a, b);
    case OP_MAX: return a > b || isnan(a) ? a : b;
    case OP_MIN: return a < b || isnan(a) ? a : b;
    case OP_LT: return a < b;
    case OP_LE: return a <= b;
    case OP_GT: return a > b;
    case OP_GE: return a >= b;
    case OP_EQ: return a == b;
    case OP_NE: return a != b;
    default: die("interp: %s is not binary", ir_opinfo[c].name);
    }
}

/* C[M,N] = op(A) op(B) for one batch; A is [M,K] (or [K,M] if ta), B is
 * [K,N] (or [N,K] if tb). bt is scratch of K*N doubles. */
static void gemm(double *C, const double *A, const double *B, int64_t M, int64_t N,
                 int64_t K, bool ta, bool tb, double *bt)
{
    if (tb) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                bt[k * N + n] = B[n * K + k];
        B = bt;
    }
    memset(C, 0, sizeof(double) * (size_t)(M * N));
    for (int64_t m = 0; m < M; m++) {
        double *c = C + m * N;
        for (int64_t k = 0; k < K; k++) {
            double a = ta ? A[k * M + m] : A[m * K + k];
            const double *b = B + k * N;
            for (int64_t n = 0; n < N; n++)
                c[n] += a * b[n];
        }
    }
}

static int64_t index_of(double v, int64_t n)
{
    if (!(v >= 0) || v >= (double)n)
        return -1;
    return (int64_t)v;
}

/* The attention family (ir.h): per batch entry and head, S = scale * q k^T
 * (+ the alibi term) over the kept (i, j) (j <= i when causal, i - j <
 * window with one), in double; grouped heads add their dk and dv into
 * the key/value head's. attention writes
 * P v, attention_lse the row's log-sum-exp; the gradients take P from the
 * given lse (P_ij = exp(S_ij - lse_i)) and delta as given, as the kernels
 * do. Every tensor is read and written where its layout (IrAttnLayout)
 * puts element (b, h, i, d); what the layout leaves out stays 0. */
static void attention_eval(const Graph *g, const Op *op, double **val, double *r)
{
    IrAttnLayout L;
    ir_attn_layout(g, op, &L);
    int64_t Tq = L.Tq, Tk = L.Tk, D = L.D, Dv = L.Dv;
    bool causal = op->attr.ia[0] != 0;
    double sc = op->attr.f;
    const double *Q = val[op->in[0]], *K = val[op->in[1]];
    bool grad = ir_attn_nbase(op->code) == 6;
    const double *V = op->code != OP_ATTENTION_LSE ? val[op->in[2]] : NULL;
    const double *dO = grad ? val[op->in[3]] : NULL;
    const double *Lse = grad ? val[op->in[4]] : NULL;
    const double *De = grad ? val[op->in[5]] : NULL;
    const double *Bias = L.bias ? val[ir_attn_bias_in(op)] : NULL;
    int64_t n = shape_numel(&g->t.v[op->out].s);
    memset(r, 0, sizeof(double) * (size_t)n);
    double *srow = xmalloc(sizeof(double) * (size_t)(Tk + 1));
#define AT(s, b, h) ((b) * (s).bs + (h) * (s).hs + (s).off)
    for (int64_t b = 0; b < L.nb; b++)
        for (int64_t h = 0; h < L.nh; h++) {
            /* grouped: the key/value item of (b, h) and where it sits */
            int64_t kb = (b * L.nh + h) / L.g, b2 = kb / L.nhk, h2 = kb % L.nhk;
            const double *q = Q + AT(L.q, b, h), *k = K + AT(L.k, b2, h2);
            const double *v = V ? V + AT(L.v, b2, h2) : NULL;
            int64_t st = AT(L.st, b, h), qr = L.q.rs, kr = L.k.rs, vr = L.v.rs;
            double slope = L.ah ? ir_alibi_slope(L.ah, (b * L.nh + h) % L.ah) : 0;
            const double *bias =
                Bias ? Bias + ((b * L.nh + h) / L.bdiv % L.bmod) * L.bbs : NULL;
            for (int64_t i = 0; i < Tq; i++) {
                int64_t nj = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
                int64_t j0 = L.window && i + 1 > L.window ? i + 1 - L.window : 0;
                double m = -INFINITY;
                for (int64_t j = 0; j < j0; j++)
                    srow[j] = -INFINITY;
                for (int64_t j = j0; j < nj; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += q[i * qr + d] * k[j * kr + d];
                    srow[j] = sc * s + slope * (double)(j - i);
                    if (bias && L.bias == IR_ATTN_BIAS)
                        srow[j] += bias[i * L.bis + j * L.bjs];
                    else if (bias && bias[i * L.bis + j * L.bjs] == 0)
                        srow[j] = -INFINITY; /* masked */
                    if (srow[j] > m)
                        m = srow[j];
                }
                if (op->code == OP_ATTENTION || op->code == OP_ATTENTION_LSE) {
                    double sum = 0;
                    for (int64_t j = 0; j < nj && m > -INFINITY; j++)
                        sum += exp(srow[j] - m);
                    if (m == -INFINITY) /* no column kept: o = 0, lse = -inf */
                        nj = 0;
                    if (op->code == OP_ATTENTION_LSE) {
                        r[st + i * L.st.rs] = m + log(sum);
                        continue;
                    }
                    double *o = r + AT(L.o, b, h) + i * L.o.rs;
                    for (int64_t j = 0; j < nj; j++) {
                        double p = exp(srow[j] - m) / sum;
                        for (int64_t d = 0; d < Dv; d++)
                            o[d] += p * v[j * vr + d];
                    }
                    continue;
                }
                /* gradients: P from lse, dS = P (dO v^T - delta) */
                const double *go = dO + AT(L.o, b, h) + i * L.o.rs;
                double lse = Lse[st + i * L.st.rs], delta = De[st + i * L.st.rs];
                bool all = op->code == OP_ATTENTION_DQKV; /* dq, dk and dv */
                for (int64_t j = j0; j < nj; j++) {
                    double p = srow[j] == -INFINITY ? 0 : exp(srow[j] - lse);
                    if (all || op->code == OP_ATTENTION_DV) {
                        double *dv = r + AT(L.dv, b2, h2) + j * L.dv.rs;
                        for (int64_t d = 0; d < Dv; d++)
                            dv[d] += p * go[d];
                        if (!all)
                            continue;
                    }
                    double dp = 0;
                    for (int64_t d = 0; d < Dv; d++)
                        dp += go[d] * v[j * vr + d];
                    double ds = sc * p * (dp - delta);
                    if (all || op->code == OP_ATTENTION_DQ) {
                        double *dq = r + AT(L.dq, b, h) + i * L.dq.rs;
                        for (int64_t d = 0; d < D; d++)
                            dq[d] += ds * k[j * kr + d];
                    }
                    if (all || op->code == OP_ATTENTION_DK) {
                        double *dk = r + AT(L.dk, b2, h2) + j * L.dk.rs;
                        for (int64_t d = 0; d < D; d++)
                            dk[d] += ds * q[i * qr + d];
                    }
                }
            }
        }
#undef AT
    free(srow);
}

/* The AK_SHARD ops as rank 0 and the only rank (ir.h): the mean over one
 * rank is its own value, other ranks' parts are left as they are. */
static void eval_shard(const Graph *g, const Op *op, double **val, double *r)
{
    const OpAttr *a = &op->attr;
    int64_t off, len;
    ir_shard_range(a->ia[2], a->ia[3], 0, &off, &len);
    if (op->code == OP_REDUCE_SCATTER_START || op->code == OP_ALL_GATHER_START) {
        r[0] = 0;
        return;
    }
    if (op->code == OP_ALL_GATHER || op->code == OP_ALL_GATHER_WAIT) {
        int p = op->in[op->nin - 1];
        const double *sh = val[op->in[op->nin - 2]];
        int64_t n = shape_numel(&g->t.v[p].s);
        memcpy(r, val[p], sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            int64_t f = a->ia[1] + i;
            if (f >= off && f < off + len)
                r[i] = sh[f - off];
        }
        return;
    }
    /* shard_pack, reduce_scatter (from zeros), reduce_scatter_wait (from
     * acc): the rank's part replaced */
    bool own = op->code == OP_SHARD_PACK || op->code == OP_REDUCE_SCATTER;
    int64_t S = shape_numel(&g->t.v[op->out].s);
    if (own)
        memset(r, 0, sizeof(double) * (size_t)S);
    else
        memcpy(r, val[op->in[1]], sizeof(double) * (size_t)S);
    int64_t f = a->ia[1];
    for (int j = own ? 0 : 2; j < op->nin; j++) {
        const double *x = val[op->in[j]];
        int64_t n = shape_numel(&g->t.v[op->in[j]].s);
        for (int64_t i = 0; i < n; i++, f++)
            if (f >= off && f < off + len)
                r[f - off] = x[i];
    }
}

static void eval(const Graph *g, const Op *op, double **val, const InterpOpts *o)
{
    const Shape *os = &g->t.v[op->out].s;
    int64_t n = shape_numel(os);
    double *r = val[op->out];
    const OpAttr *a = &op->attr;
    const Shape *s0 = op->nin > 0 ? &g->t.v[op->in[0]].s : NULL;
    const double *x = op->nin > 0 ? val[op->in[0]] : NULL;
    const double *y = op->nin > 1 ? val[op->in[1]] : NULL;
    int64_t ist[IR_MAX_RANK], ost[IR_MAX_RANK];
    for (int i = 0; i < op->nin; i++)
        if (!val[op->in[i]])
            die("interp: operand %%%d of op %s has no value (was it set?)", op->in[i],
                ir_opinfo[op->code].name);

    switch (op->code) {
    case OP_CONST: {
        double v = dtype_is_float(os->dtype) ? a->f : trunc(a->f);
        for (int64_t i = 0; i < n; i++)
            r[i] = v;
        break;
    }
    case OP_IOTA: {
        strides_of(os, ost);
        int ax = (int)a->ia[0];
        for (int64_t i = 0; i < n; i++)
            r[i] = (double)((i / ost[ax]) % os->dim[ax]);
        break;
    }
    case OP_NEG: case OP_EXP: case OP_LOG: case OP_SIN: case OP_COS: case OP_TANH:
    case OP_SQRT: case OP_RSQRT: case OP_SIGMOID: case OP_RELU: case OP_ABS: case OP_ERF:
    case OP_FLOOR:
        for (int64_t i = 0; i < n; i++)
            r[i] = unary(op->code, x[i]);
        break;
    case OP_STOP_GRADIENT:
        memcpy(r, x, sizeof(double) * (size_t)n);
        break;
    case OP_CAST:
        if (dtype_is_float(os->dtype) || os->dtype == DT_U8)
            memcpy(r, x, sizeof(double) * (size_t)n);
        else
            for (int64_t i = 0; i < n; i++)
                r[i] = trunc(x[i]);
        break;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_POW: case OP_MAX:
    case OP_MIN: case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_EQ: case OP_NE: {
        bool isint = s0->dtype == DT_I32 || s0->dtype == DT_I64;
        for (int64_t i = 0; i < n; i++)
            r[i] = binary(op->code, isint, x[i], y[i]);
        break;
    }
    case OP_SELECT: {
        const double *z = val[op->in[2]];
        for (int64_t i = 0; i < n; i++)
            r[i] = x[i] != 0 ? y[i] : z[i];
        break;
    }
    case OP_BROADCAST: {
        int off = os->rank - s0->rank;
        strides_of(s0, ist);
        for (int i = 0; i < os->rank; i++)
            ost[i] = i < off || s0->dim[i - off] == 1 ? 0 : ist[i - off];
        strided_copy(r, x, os, ost, 0);
        break;
    }
    case OP_RESHAPE:
    case OP_ALLREDUCE:
    case OP_TP_ALLREDUCE:
    case OP_TP_COPY:
        memcpy(r, x, sizeof(double) * (size_t)n);
        break;
    case OP_TP_REDUCE_SCATTER: { /* rank r's part (the only rank's sum is its own) */
        strides_of(s0, ist);
        strided_copy(r, x, os, ist, a->ia[2] * os->dim[a->ia[0]] * ist[a->ia[0]]);
        break;
    }
    case OP_TP_ALL_GATHER: { /* x at rank r's place, zeros at the others' */
        int64_t m = shape_numel(s0), idx[IR_MAX_RANK] = {0};
        strides_of(os, ost);
        memset(r, 0, sizeof(double) * (size_t)n);
        int64_t off = a->ia[2] * s0->dim[a->ia[0]] * ost[a->ia[0]];
        for (int64_t j = 0; j < m; j++) {
            r[off] = x[j];
            for (int d = s0->rank - 1; d >= 0; d--) {
                off += ost[d];
                if (++idx[d] < s0->dim[d])
                    break;
                off -= ost[d] * s0->dim[d];
                idx[d] = 0;
            }
        }
        break;
    }
    case OP_ALLREDUCE_START:
        r[0] = 0;
        break;
    case OP_SHARD_PACK: case OP_REDUCE_SCATTER: case OP_REDUCE_SCATTER_START:
    case OP_REDUCE_SCATTER_WAIT: case OP_ALL_GATHER: case OP_ALL_GATHER_START:
    case OP_ALL_GATHER_WAIT:
        eval_shard(g, op, val, r);
        break;
    case OP_ALLREDUCE_WAIT:
        memcpy(r, val[op->in[1]], sizeof(double) * (size_t)n);
        break;
    case OP_PERMUTE:
        strides_of(s0, ist);
        for (int i = 0; i < os->rank; i++)
            ost[i] = ist[a->ia[i]];
        strided_copy(r, x, os, ost, 0);
        break;
    case OP_SLICE: {
        int64_t off = 0;
        strides_of(s0, ist);
        for (int i = 0; i < s0->rank; i++)
            off += a->ia[i] * ist[i];
        strided_copy(r, x, os, ist, off);
        break;
    }
    case OP_PAD: {
        /* walk the input; write each element at its padded position */
        int64_t m = shape_numel(s0), idx[IR_MAX_RANK] = {0}, off = 0;
        strides_of(os, ost);
        memset(r, 0, sizeof(double) * (size_t)n);
        for (int i = 0; i < os->rank; i++)
            off += a->ia[i] * ost[i];
        for (int64_t j = 0; j < m; j++) {
            r[off] = x[j];
            for (int d = s0->rank - 1; d >= 0; d--) {
                off += ost[d];
                if (++idx[d] < s0->dim[d])
                    break;
                off -= ost[d] * s0->dim[d];
                idx[d] = 0;
            }
        }
        break;
    }
    case OP_CONCAT: {
        int ax = (int)a->ia[0];
        int64_t outer = 1, inner = 1;
        for (int i = 0; i < ax; i++)
            outer *= os->dim[i];
        for (int i = ax + 1; i < os->rank; i++)
            inner *= os->dim[i];
        int64_t row = os->dim[ax] * inner, at = 0;
        for (int k = 0; k < op->nin; k++) {
            int64_t len = g->t.v[op->in[k]].s.dim[ax] * inner;
            const double *src = val[op->in[k]];
            for (int64_t b = 0; b < outer; b++)
                memcpy(r + b * row + at, src + b * len, sizeof(double) * (size_t)len);
            at += len;
        }
        break;
    }
    case OP_GATHER: {
        int64_t V = s0->dim[0], R = V ? shape_numel(s0) / V : 0;
        int64_t ni = shape_numel(&g->t.v[op->in[1]].s);
        for (int64_t i = 0; i < ni; i++) {
            int64_t v = index_of(y[i], V);
            if (v < 0)
                memset(r + i * R, 0, sizeof(double) * (size_t)R);
            else
                memcpy(r + i * R, x + v * R, sizeof(double) * (size_t)R);
        }
        break;
    }
    case OP_SCATTER_ADD: {
        int64_t V = os->dim[0], R = n / V;
        int64_t ni = shape_numel(s0);
        memset(r, 0, sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < ni; i++) {
            int64_t v = index_of(x[i], V);
            if (v < 0)
                continue;
            for (int64_t k = 0; k < R; k++)
                r[v * R + k] += y[i * R + k];
        }
        break;
    }
    case OP_IM2COL:
    case OP_COL2IM: {
        /* one walk over the columns in their order; im2col reads the image
         * element each came from, col2im adds it there */
        bool fwd = op->code == OP_IM2COL;
        IrConv cv;
        char cerr[300];
        if (!ir_conv_geometry(fwd ? s0 : os, a, &cv, cerr, sizeof cerr))
            die("interp: %s: %s", ir_opinfo[op->code].name, cerr);
        if (cv.ns == 1) { /* a second spatial dim of size 1 */
            cv.in[1] = cv.out[1] = cv.k[1] = cv.s[1] = cv.d[1] = 1;
            cv.p[1] = 0;
        }
        if (!fwd)
            memset(r, 0, sizeof(double) * (size_t)n);
        int64_t at = 0;
        for (int64_t b = 0; b < cv.n; b++)
            for (int64_t o0 = 0; o0 < cv.out[0]; o0++)
                for (int64_t o1 = 0; o1 < cv.out[1]; o1++)
                    for (int64_t c = 0; c < cv.c; c++)
                        for (int64_t j0 = 0; j0 < cv.k[0]; j0++)
                            for (int64_t j1 = 0; j1 < cv.k[1]; j1++, at++) {
                                int64_t y0 = o0 * cv.s[0] - cv.p[0] + j0 * cv.d[0];
                                int64_t y1 = o1 * cv.s[1] - cv.p[1] + j1 * cv.d[1];
                                bool in = y0 >= 0 && y0 < cv.in[0] && y1 >= 0 && y1 < cv.in[1];
                                int64_t src = ((b * cv.c + c) * cv.in[0] + y0) * cv.in[1] + y1;
                                if (fwd)
                                    r[at] = in ? x[src] : 0.0;
                                else if (in)
                                    r[src] += x[at];
                            }
        break;
    }
    case OP_REDUCE_SUM:
    case OP_REDUCE_MAX:
    case OP_REDUCE_LOGSUMEXP: {
        /* logsumexp: pass 1 the max m (as reduce_max), pass 2 the sum of
         * exp(x - m), then m + log(sum); m = +-inf is the result itself */
        bool lse = op->code == OP_REDUCE_LOGSUMEXP;
        int64_t m = shape_numel(s0), rst[IR_MAX_RANK];
        strides_of(os, ost);
        for (int i = 0; i < os->rank; i++)
            rst[i] = os->dim[i] == 1 ? 0 : ost[i];
        double *mxv = lse ? xmalloc(sizeof(double) * (size_t)n) : NULL;
        for (int pass = 0; pass < (lse ? 2 : 1); pass++) {
            bool mx = op->code == OP_REDUCE_MAX || (lse && pass == 0);
            int64_t idx[IR_MAX_RANK] = {0}, off = 0;
            for (int64_t i = 0; i < n; i++)
                r[i] = mx ? -INFINITY : 0.0;
            for (int64_t j = 0; j < m; j++) {
                if (mx) {
                    if (x[j] > r[off] || isnan(x[j]))
                        r[off] = x[j];
                } else {
                    r[off] += lse ? (isinf(mxv[off]) ? 0.0 : exp(x[j] - mxv[off])) : x[j];
                }
                for (int d = s0->rank - 1; d >= 0; d--) {
                    off += rst[d];
                    if (++idx[d] < s0->dim[d])
                        break;
                    off -= rst[d] * s0->dim[d];
                    idx[d] = 0;
                }
            }
            if (lse && pass == 0)
                memcpy(mxv, r, sizeof(double) * (size_t)n);
        }
        if (lse)
            for (int64_t i = 0; i < n; i++)
                r[i] = isinf(mxv[i]) ? mxv[i] : mxv[i] + log(r[i]);
        free(mxv);
        break;
    }
    case OP_TAKE_ALONG: {
        int64_t V = s0->dim[s0->rank - 1];
        for (int64_t i = 0; i < n; i++) {
            int64_t v = index_of(y[i], V);
            r[i] = v < 0 ? 0.0 : x[i * V + v];
        }
        break;
    }
    case OP_MATMUL: {
        const Shape *sb = &g->t.v[op->in[1]].s;
        bool ta = a->ia[0] != 0, tb = a->ia[1] != 0;
        int64_t M = os->dim[os->rank - 2], N = os->dim[os->rank - 1];
        int64_t K = s0->dim[s0->rank - (ta ? 2 : 1)];
        int64_t batch = n / (M * N);
        bool shared = sb->rank == 2;
        double *bt = tb ? xmalloc(sizeof(double) * (size_t)(K * N)) : NULL;
        for (int64_t b = 0; b < batch; b++)
            gemm(r + b * M * N, x + b * M * K, y + (shared ? 0 : b * K * N), M, N, K, ta, tb,
                 bt);
        free(bt);
        break;
    }
    case OP_RANDOM:
        for (int64_t i = 0; i < n; i++)
            r[i] = ir_rand_u01(o->seed, (uint64_t)a->ia[0], (uint64_t)o->step, (uint64_t)i);
        break;
    case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_DQ: case OP_ATTENTION_DK:
    case OP_ATTENTION_DV: case OP_ATTENTION_DQKV:
        attention_eval(g, op, val, r);
        break;
    default:
        die("interp: no rule for opcode %d", (int)op->code);
    }
    if (os->dtype == DT_BF16 || os->dtype == DT_F16 || os->dtype == DT_U8)
        for (int64_t i = 0; i < n; i++)
            r[i] = round_to(os->dtype, r[i]);
}

double **ir_interp_alloc(const Graph *g)
{
    return xcalloc((size_t)(g->t.n ? g->t.n : 1), sizeof(double *));
}

void ir_interp(const Graph *g, double **val, const InterpOpts *o)
{
    static const InterpOpts none;
    if (!o)
        o = &none;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        free(val[op->out]);
        val[op->out] = xmalloc(sizeof(double) * (size_t)shape_numel(&g->t.v[op->out].s));
        eval(g, op, val, o);
    }
}

void ir_interp_free(const Graph *g, double **val)
{
    if (!val)
        return;
    for (int i = 0; i < g->t.n; i++)
        free(val[i]);
    free(val);
}

void ir_interp_apply_updates(const Graph *g, double **val)
{
    /* snapshot every value first: a value may itself be another update's target */
    double **snap = xcalloc((size_t)(g->upd.n ? g->upd.n : 1), sizeof(double *));
    for (int i = 0; i < g->upd.n; i++) {
        size_t n = (size_t)shape_numel(&g->t.v[g->upd.v[i].value].s);
        snap[i] = xmalloc(sizeof(double) * (n ? n : 1));
        memcpy(snap[i], val[g->upd.v[i].value], sizeof(double) * n);
    }
    for (int i = 0; i < g->upd.n; i++) {
        int t = g->upd.v[i].target;
        free(val[t]);
        val[t] = snap[i];
    }
    free(snap);
}
