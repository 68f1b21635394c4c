/* autodiff.c - reverse-mode differentiation of the graph output "loss".
 *
 * One vector-Jacobian rule per primitive (vjp below). Only ops on a path from
 * a param to the loss are differentiated: `live[t]` marks tensors that depend
 * on a float param through differentiable operands, and the reverse sweep in
 * program order visits only ops whose result already has a cotangent (so the
 * loss depends on it); every cotangent is complete before it is read. Cotangents of tensors used several
 * times are summed with `add`. Cost is linear in the number of ops.
 *
 * Slices are the exception (issue 13, item 14): a slice's cotangent is not
 * padded to its operand's shape and added at once. The slices of a tensor
 * wait (pending, below) until the sweep reaches the tensor's definition; then
 * the slices along one axis whose windows do not overlap are placed side by
 * side with one concat (zeros in the gaps), and only what is left (windows
 * overlapping those, slices restricting several axes) is padded and added.
 * A value sliced into T steps (an unrolled RNN) then needs cotangent memory
 * linear in T and no full-size pad and add per step; padding each step's
 * cotangent to the full tensor made the planned peak quadratic in T, because
 * fusion joins the chain of adds into one kernel that reads every padded
 * copy, so all of them are live at once. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

/* A slice's cotangent waiting to be placed into its operand's cotangent. */
typedef struct {
    int g;                      /* the cotangent, of the slice's shape */
    int64_t start[IR_MAX_RANK]; /* the slice's start per axis */
    SrcLoc loc;                 /* of the slice */
    int seq;                    /* arrival order: sorts stay deterministic */
} Piece;
typedef VEC(Piece) Pieces;

typedef struct {
    Graph *g;
    SrcLoc loc;     /* of the forward op being differentiated */
    int *grad;      /* cotangent tensor per forward tensor id, -1 when none */
    Pieces *pend;   /* per forward tensor id: its slices' pending cotangents */
    VEC(int) lse;   /* pairs (attention op, its attention_lse op): the lse op
                       moves next to the forward op at the end */
    const Op *norule; /* the first op met that has no gradient rule, or NULL */
} AD;

static int emit(AD *ad, Opcode code, const int *in, int nin, const OpAttr *a)
{
    int t = ir_op_x(ad->g, code, in, nin, a, ad->loc);
    ad->g->ops.v[ad->g->ops.n - 1].flags |= OPF_BACKWARD;
    return t;
}

static Shape shape_of(AD *ad, int t) { return ad->g->t.v[t].s; }

static int un(AD *ad, Opcode code, int x) { return emit(ad, code, &x, 1, NULL); }

static int bin(AD *ad, Opcode code, int x, int y)
{
    int in[2] = {x, y};
    return emit(ad, code, in, 2, NULL);
}

static int sel(AD *ad, int m, int x, int y)
{
    int in[3] = {m, x, y};
    return emit(ad, OP_SELECT, in, 3, NULL);
}

static OpAttr shape_attr(const Shape *s)
{
    OpAttr a = {0};
    ir_attr_set_shape(&a, s);
    return a;
}

/* A tensor of shape s filled with v: a scalar const broadcast to s. */
static int fill(AD *ad, double v, const Shape *s)
{
    OpAttr c = {.f = v, .dtype = s->dtype, .rank = 0};
    int t = emit(ad, OP_CONST, NULL, 0, &c);
    if (s->rank == 0)
        return t;
    OpAttr b = shape_attr(s);
    return emit(ad, OP_BROADCAST, &t, 1, &b);
}

static int reshape(AD *ad, int x, const Shape *s)
{
    Shape xs = shape_of(ad, x);
    if (xs.rank == s->rank && !memcmp(xs.dim, s->dim, sizeof(int64_t) * (size_t)s->rank))
        return x;
    OpAttr a = shape_attr(s);
    return emit(ad, OP_RESHAPE, &x, 1, &a);
}

static int matmul(AD *ad, int x, int y, int ta, int tb)
{
    int in[2] = {x, y};
    OpAttr a = {.nia = 2, .ia = {ta, tb}};
    return emit(ad, OP_MATMUL, in, 2, &a);
}

/* Swap the last two dims. */
static int transpose(AD *ad, int x)
{
    Shape s = shape_of(ad, x);
    OpAttr a = {.nia = s.rank};
    for (int i = 0; i < s.rank; i++)
        a.ia[i] = i;
    a.ia[s.rank - 2] = s.rank - 1;
    a.ia[s.rank - 1] = s.rank - 2;
    return emit(ad, OP_PERMUTE, &x, 1, &a);
}

/* Collapse all but the last dim: [..., R, C] -> [prod(...)*R, C]. */
static int flatten2(AD *ad, int x)
{
    Shape s = shape_of(ad, x);
    Shape f = s;
    f.rank = 2;
    f.dim[1] = s.dim[s.rank - 1];
    f.dname[1] = s.dname[s.rank - 1];
    f.dim[0] = shape_numel(&s) / f.dim[1];
    f.dname[0] = NULL; /* merged axes: no one name */
    return reshape(ad, x, &f);
}

/* Cotangents of a matmul's operands. C = op(A) op(B), dC = gy. */
static void vjp_matmul(AD *ad, const Op *op, int gy, int *ga, int *gb, bool need_a,
                       bool need_b)
{
    int A = op->in[0], B = op->in[1];
    bool ta = op->attr.ia[0] != 0, tb = op->attr.ia[1] != 0;
    Shape as = shape_of(ad, A), bs = shape_of(ad, B);
    bool shared = bs.rank == 2 && as.rank > 2;
    if (need_a) {
        if (!ta)
            *ga = tb ? matmul(ad, gy, B, 0, 0) : matmul(ad, gy, B, 0, 1);
        else if (!shared)
            *ga = tb ? matmul(ad, B, gy, 1, 1) : matmul(ad, B, gy, 0, 1);
        else /* dA^T = dC op(B)^T, computed with B as the second operand */
            *ga = transpose(ad, tb ? matmul(ad, gy, B, 0, 0) : matmul(ad, gy, B, 0, 1));
    }
    if (need_b) {
        if (!shared) {
            if (!ta)
                *gb = tb ? matmul(ad, gy, A, 1, 0) : matmul(ad, A, gy, 1, 0);
            else
                *gb = tb ? matmul(ad, gy, A, 1, 1) : matmul(ad, A, gy, 0, 0);
        } else { /* sum over A's batch: fold it into the rows */
            int a2 = flatten2(ad, ta ? transpose(ad, A) : A);
            int g2 = flatten2(ad, gy);
            *gb = tb ? matmul(ad, g2, a2, 1, 0) : matmul(ad, a2, g2, 1, 0);
        }
    }
}

static void accumulate(AD *ad, int x, int c)
{
    if (ad->grad[x] < 0)
        ad->grad[x] = c;
    else
        ad->grad[x] = bin(ad, OP_ADD, ad->grad[x], c);
}

/* ---- slice cotangents ------------------------------------------------------ */

/* The one axis on which piece p (of tensor shape xs) is narrower than xs;
 * -1 when it is narrower on none or on several. */
static int piece_axis(AD *ad, const Piece *p, const Shape *xs)
{
    Shape ps = shape_of(ad, p->g);
    int ax = -1;
    for (int i = 0; i < xs->rank; i++)
        if (ps.dim[i] != xs->dim[i]) {
            if (ax >= 0)
                return -1;
            ax = i;
        }
    return ax;
}

/* p's cotangent padded with zeros to shape xs. */
static int pad_piece(AD *ad, const Piece *p, const Shape *xs)
{
    Shape ps = shape_of(ad, p->g);
    if (shape_dims_eq(&ps, xs))
        return p->g;
    OpAttr a = shape_attr(xs);
    a.nia = xs->rank;
    memcpy(a.ia, p->start, sizeof(int64_t) * (size_t)xs->rank);
    return emit(ad, OP_PAD, &p->g, 1, &a);
}

/* concat of parts[0..n) along ax: one concat of any number of operands
 * (codegen lowers it as one kernel: codegen/lower.c, concat_tree). */
static int concat_parts(AD *ad, const int *parts, int n, int ax)
{
    if (n == 1)
        return parts[0];
    OpAttr a = {.nia = 1, .ia = {ax}};
    return emit(ad, OP_CONCAT, parts, n, &a);
}

/* One cotangent of shape xs from pieces p[0..n) that restrict axis ax and
 * do not overlap, sorted by start: the pieces side by side, zeros in the
 * gaps between them, padded with zeros outside the first and the last. */
static int place_layer(AD *ad, Piece *const *p, int n, const Shape *xs, int ax)
{
    if (n == 1)
        return pad_piece(ad, p[0], xs);
    int *parts = xmalloc(sizeof(int) * (size_t)(2 * n));
    int np = 0;
    int64_t lo = p[0]->start[ax], at = lo;
    for (int i = 0; i < n; i++) {
        if (p[i]->start[ax] > at) {
            Shape z = *xs;
            z.dim[ax] = p[i]->start[ax] - at;
            z.dname[ax] = NULL;
            parts[np++] = fill(ad, 0.0, &z);
        }
        parts[np++] = p[i]->g;
        at = p[i]->start[ax] + shape_of(ad, p[i]->g).dim[ax];
    }
    int span = concat_parts(ad, parts, np, ax);
    free(parts);
    Piece whole = {.g = span};
    whole.start[ax] = lo;
    return pad_piece(ad, &whole, xs);
}

/* ctx: the axis being sorted on (an int). */
static int cmp_piece(const void *a, const void *b, void *ctx)
{
    int sort_axis = *(const int *)ctx;
    const Piece *x = *(Piece *const *)a, *y = *(Piece *const *)b;
    if (x->start[sort_axis] != y->start[sort_axis])
        return x->start[sort_axis] < y->start[sort_axis] ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Adds x's pending slice cotangents into grad[x] (see the top of the file).
 * Per axis, the pieces sorted by start go greedily into layers of
 * non-overlapping windows (one layer when the windows are disjoint); each
 * layer becomes one tensor, and the layers are added. */
static void flush_slices(AD *ad, int x)
{
    Pieces *pv = &ad->pend[x];
    if (!pv->n)
        return;
    Shape xs = shape_of(ad, x);
    SrcLoc saved = ad->loc;
    int n = pv->n;
    Piece **axp = xmalloc(sizeof(Piece *) * (size_t)n);
    int64_t *end = xmalloc(sizeof(int64_t) * (size_t)n);
    int *layer = xmalloc(sizeof(int) * (size_t)n);
    Piece **lp = xmalloc(sizeof(Piece *) * (size_t)n);
    for (int ax = -1; ax < xs.rank; ax++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (piece_axis(ad, &pv->v[i], &xs) == ax)
                axp[m++] = &pv->v[i];
        if (!m)
            continue;
        if (ax < 0) { /* full or restricting several axes: pad each */
            for (int i = 0; i < m; i++) {
                ad->loc = axp[i]->loc;
                accumulate(ad, x, pad_piece(ad, axp[i], &xs));
            }
            continue;
        }
        qsort_r(axp, (size_t)m, sizeof(Piece *), cmp_piece, &ax);
        int nl = 0;
        for (int i = 0; i < m; i++) {
            int l = 0;
            while (l < nl && end[l] > axp[i]->start[ax])
                l++;
            if (l == nl)
                nl++;
            layer[i] = l;
            end[l] = axp[i]->start[ax] + shape_of(ad, axp[i]->g).dim[ax];
        }
        for (int l = 0; l < nl; l++) {
            int k = 0;
            for (int i = 0; i < m; i++)
                if (layer[i] == l)
                    lp[k++] = axp[i];
            ad->loc = lp[0]->loc;
            accumulate(ad, x, place_layer(ad, lp, k, &xs, ax));
        }
    }
    free(axp);
    free(end);
    free(layer);
    free(lp);
    vec_free(pv);
    ad->loc = saved;
}

/* attention(q, k, v) {causal, scale}: its sibling lse = attention_lse(q, k)
 * (same attrs) is a forward op (no OPF_BACKWARD: remat sees a small saved
 * activation, and the CPU backend writes it from the forward kernel), delta
 * = reduce_sum(f32(dO) * f32(o)) over the last axis, then one
 * attention_dq/dk/dv per operand that needs a gradient (ir.h). */
static void vjp_attention(AD *ad, const Op *op, int gy, const bool *need)
{
    int bias = ir_attn_bias_in(op);
    if (bias >= 0 && need[3]) { /* the attention pass fuses no bias that needs one */
        ad->norule = op;
        return;
    }
    if (!need[0] && !need[1] && !need[2])
        return;
    if (ir_attn_heads(&op->attr)) { /* attnlayout's form, made after autodiff: no rule */
        ad->norule = op;
        return;
    }
    int lin[3] = {op->in[0], op->in[1], bias};
    int lse = emit(ad, OP_ATTENTION_LSE, lin, bias >= 0 ? 3 : 2, &op->attr);
    ad->g->ops.v[ad->g->ops.n - 1].flags &= ~(unsigned)OPF_BACKWARD;
    vec_push(&ad->lse, ad->g->t.v[op->out].op);
    vec_push(&ad->lse, ad->g->ops.n - 1);
    Shape os = shape_of(ad, op->out);
    int go = gy, o = op->out;
    if (os.dtype != DT_F32) {
        OpAttr cf = {.dtype = DT_F32};
        go = emit(ad, OP_CAST, &go, 1, &cf);
        o = emit(ad, OP_CAST, &o, 1, &cf);
    }
    OpAttr last = {.nia = 1, .ia = {os.rank - 1}};
    int prod = bin(ad, OP_MUL, go, o);
    int delta = emit(ad, OP_REDUCE_SUM, &prod, 1, &last);
    int in[7] = {op->in[0], op->in[1], op->in[2], gy, lse, delta, bias};
    static const Opcode code[3] = {OP_ATTENTION_DQ, OP_ATTENTION_DK, OP_ATTENTION_DV};
    for (int i = 0; i < 3; i++)
        if (need[i])
            accumulate(ad, op->in[i], emit(ad, code[i], in, bias >= 0 ? 7 : 6, &op->attr));
}

/* Whether operand i of op can carry a gradient (when it is a float tensor). */
static bool diff_operand(Opcode code, int i)
{
    switch (code) {
    case OP_CONST: case OP_IOTA: case OP_RANDOM:
    case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_EQ: case OP_NE:
    case OP_ALLREDUCE_START: case OP_ALLREDUCE_WAIT: /* placed after autodiff */
    case OP_SHARD_PACK: case OP_REDUCE_SCATTER: case OP_REDUCE_SCATTER_START:
    case OP_REDUCE_SCATTER_WAIT: case OP_ALL_GATHER: case OP_ALL_GATHER_START:
    case OP_ALL_GATHER_WAIT: /* the optimizer's (zero=1), after autodiff */
    case OP_STOP_GRADIENT: /* the point of it */
        return false;
    case OP_SELECT: return i > 0;
    case OP_GATHER: return i == 0;
    case OP_TAKE_ALONG: return i == 0;
    case OP_SCATTER_ADD: return i == 1;
    default: return true;
    }
}

/* Adds the cotangent contributions of op's differentiable live operands. */
static void vjp(AD *ad, const Op *op, const bool *live)
{
    int gy = ad->grad[op->out];
    int x = op->in[0], y = op->out;
    Shape xs = shape_of(ad, x), ys = shape_of(ad, y);
    bool need[4] = {0};
    for (int i = 0; i < op->nin && i < 4; i++)
        need[i] = live[op->in[i]] && diff_operand(op->code, i);
    int c;
    switch (op->code) {
    case OP_NEG:
        accumulate(ad, x, un(ad, OP_NEG, gy));
        break;
    case OP_EXP:
        accumulate(ad, x, bin(ad, OP_MUL, gy, y));
        break;
    case OP_LOG:
        accumulate(ad, x, bin(ad, OP_DIV, gy, x));
        break;
    case OP_SIN:
        accumulate(ad, x, bin(ad, OP_MUL, gy, un(ad, OP_COS, x)));
        break;
    case OP_COS:
        accumulate(ad, x, un(ad, OP_NEG, bin(ad, OP_MUL, gy, un(ad, OP_SIN, x))));
        break;
    case OP_TANH: /* 1 - y^2 */
        c = bin(ad, OP_SUB, fill(ad, 1.0, &ys), bin(ad, OP_MUL, y, y));
        accumulate(ad, x, bin(ad, OP_MUL, gy, c));
        break;
    case OP_SQRT: /* 0.5 / y */
        c = bin(ad, OP_DIV, fill(ad, 0.5, &ys), y);
        accumulate(ad, x, bin(ad, OP_MUL, gy, c));
        break;
    case OP_RSQRT: /* -0.5 * y / x */
        c = bin(ad, OP_MUL, fill(ad, -0.5, &ys), bin(ad, OP_DIV, y, x));
        accumulate(ad, x, bin(ad, OP_MUL, gy, c));
        break;
    case OP_SIGMOID: /* y (1 - y) */
        c = bin(ad, OP_MUL, y, bin(ad, OP_SUB, fill(ad, 1.0, &ys), y));
        accumulate(ad, x, bin(ad, OP_MUL, gy, c));
        break;
    case OP_RELU: {
        int z = fill(ad, 0.0, &xs);
        accumulate(ad, x, sel(ad, bin(ad, OP_GT, x, z), gy, z));
        break;
    }
    case OP_ABS: {
        int m = bin(ad, OP_LT, x, fill(ad, 0.0, &xs));
        accumulate(ad, x, sel(ad, m, un(ad, OP_NEG, gy), gy));
        break;
    }
    case OP_ERF: /* 2/sqrt(pi) exp(-x^2) */
        c = bin(ad, OP_MUL, fill(ad, 1.1283791670955126, &xs),
                un(ad, OP_EXP, un(ad, OP_NEG, bin(ad, OP_MUL, x, x))));
        accumulate(ad, x, bin(ad, OP_MUL, gy, c));
        break;
    case OP_FLOOR: /* piecewise constant: zero almost everywhere, as for compares */
        break;
    case OP_CAST: {
        OpAttr a = {.dtype = xs.dtype};
        accumulate(ad, x, xs.dtype == ys.dtype ? gy : emit(ad, OP_CAST, &gy, 1, &a));
        break;
    }
    case OP_ADD:
    case OP_SUB:
        if (need[0])
            accumulate(ad, x, gy);
        if (need[1])
            accumulate(ad, op->in[1], op->code == OP_ADD ? gy : un(ad, OP_NEG, gy));
        break;
    case OP_MUL:
        if (need[0])
            accumulate(ad, x, bin(ad, OP_MUL, gy, op->in[1]));
        if (need[1])
            accumulate(ad, op->in[1], bin(ad, OP_MUL, gy, x));
        break;
    case OP_DIV: /* d/da = 1/b; d/db = -y/b */
        if (need[0])
            accumulate(ad, x, bin(ad, OP_DIV, gy, op->in[1]));
        if (need[1])
            accumulate(ad, op->in[1],
                       un(ad, OP_NEG, bin(ad, OP_DIV, bin(ad, OP_MUL, gy, y), op->in[1])));
        break;
    case OP_POW: { /* d/da = b a^(b-1); d/db = y log a */
        int b = op->in[1];
        if (need[0]) {
            int p = bin(ad, OP_POW, x, bin(ad, OP_SUB, b, fill(ad, 1.0, &xs)));
            accumulate(ad, x, bin(ad, OP_MUL, gy, bin(ad, OP_MUL, b, p)));
        }
        if (need[1])
            accumulate(ad, b, bin(ad, OP_MUL, gy, bin(ad, OP_MUL, y, un(ad, OP_LOG, x))));
        break;
    }
    case OP_MAX:
    case OP_MIN: { /* ties go to a */
        int m = bin(ad, op->code == OP_MAX ? OP_GE : OP_LE, x, op->in[1]);
        int z = fill(ad, 0.0, &ys);
        if (need[0])
            accumulate(ad, x, sel(ad, m, gy, z));
        if (need[1])
            accumulate(ad, op->in[1], sel(ad, m, z, gy));
        break;
    }
    case OP_SELECT: {
        int m = op->in[0], z = fill(ad, 0.0, &ys);
        if (need[1])
            accumulate(ad, op->in[1], sel(ad, m, gy, z));
        if (need[2])
            accumulate(ad, op->in[2], sel(ad, m, z, gy));
        break;
    }
    case OP_BROADCAST: { /* sum over the broadcast axes */
        OpAttr a = {0};
        int off = ys.rank - xs.rank;
        for (int i = 0; i < ys.rank; i++)
            if (i < off || (xs.dim[i - off] == 1 && ys.dim[i] != 1))
                a.ia[a.nia++] = i;
        c = a.nia ? emit(ad, OP_REDUCE_SUM, &gy, 1, &a) : gy;
        accumulate(ad, x, reshape(ad, c, &xs));
        break;
    }
    case OP_RESHAPE:
        accumulate(ad, x, reshape(ad, gy, &xs));
        break;
    case OP_PERMUTE: {
        OpAttr a = {.nia = xs.rank};
        for (int i = 0; i < xs.rank; i++)
            a.ia[op->attr.ia[i]] = i;
        accumulate(ad, x, emit(ad, OP_PERMUTE, &gy, 1, &a));
        break;
    }
    case OP_SLICE: { /* placed by flush_slices once x's uses are all seen */
        Piece p = {.g = gy, .loc = ad->loc, .seq = ad->pend[x].n};
        memcpy(p.start, op->attr.ia, sizeof(int64_t) * (size_t)xs.rank);
        vec_push(&ad->pend[x], p);
        break;
    }
    case OP_PAD: {
        OpAttr a = shape_attr(&xs);
        a.nia = xs.rank;
        memcpy(a.ia, op->attr.ia, sizeof(int64_t) * (size_t)xs.rank);
        accumulate(ad, x, emit(ad, OP_SLICE, &gy, 1, &a));
        break;
    }
    case OP_CONCAT: {
        int ax = (int)op->attr.ia[0];
        int64_t at = 0;
        for (int i = 0; i < op->nin; i++) {
            Shape si = shape_of(ad, op->in[i]);
            if (live[op->in[i]]) {
                OpAttr a = shape_attr(&si);
                a.nia = si.rank;
                a.ia[ax] = at;
                accumulate(ad, op->in[i], emit(ad, OP_SLICE, &gy, 1, &a));
            }
            at += si.dim[ax];
        }
        break;
    }
    case OP_GATHER: {
        OpAttr a = shape_attr(&xs);
        int in[2] = {op->in[1], gy};
        accumulate(ad, x, emit(ad, OP_SCATTER_ADD, in, 2, &a));
        break;
    }
    case OP_TAKE_ALONG: {
        /* the one-hot of idx along the last axis, times gy: elementwise, so
         * it fuses with the other cotangents of x (cross-entropy: softmax
         * minus one-hot in one kernel) */
        Shape is = shape_of(ad, op->in[1]), cs = is;
        cs.dname[cs.rank] = NULL;
        cs.dim[cs.rank++] = 1;
        OpAttr ia = {.nia = 1, .ia = {xs.rank - 1}, .dtype = is.dtype};
        ir_attr_set_shape(&ia, &xs);
        int io = emit(ad, OP_IOTA, NULL, 0, &ia);
        OpAttr b = shape_attr(&xs);
        int ib = reshape(ad, op->in[1], &cs);
        ib = emit(ad, OP_BROADCAST, &ib, 1, &b);
        cs.dtype = xs.dtype;
        int gb = reshape(ad, gy, &cs);
        gb = emit(ad, OP_BROADCAST, &gb, 1, &b);
        accumulate(ad, x, sel(ad, bin(ad, OP_EQ, io, ib), gb, fill(ad, 0.0, &xs)));
        break;
    }
    case OP_REDUCE_LOGSUMEXP: { /* softmax over the axes, times gy */
        OpAttr a = shape_attr(&xs);
        int yb = emit(ad, OP_BROADCAST, &y, 1, &a);
        int gb = emit(ad, OP_BROADCAST, &gy, 1, &a);
        accumulate(ad, x, bin(ad, OP_MUL, un(ad, OP_EXP, bin(ad, OP_SUB, x, yb)), gb));
        break;
    }
    case OP_IM2COL: { /* the adjoint: col2im onto x's shape */
        OpAttr a = shape_attr(&xs);
        a.nia = op->attr.nia;
        memcpy(a.ia, op->attr.ia, sizeof a.ia);
        accumulate(ad, x, emit(ad, OP_COL2IM, &gy, 1, &a));
        break;
    }
    case OP_COL2IM: {
        OpAttr a = {.nia = op->attr.nia};
        memcpy(a.ia, op->attr.ia, sizeof a.ia);
        accumulate(ad, x, emit(ad, OP_IM2COL, &gy, 1, &a));
        break;
    }
    case OP_SCATTER_ADD: {
        int in[2] = {gy, op->in[0]};
        accumulate(ad, op->in[1], emit(ad, OP_GATHER, in, 2, NULL));
        break;
    }
    case OP_REDUCE_SUM: {
        OpAttr a = shape_attr(&xs);
        accumulate(ad, x, emit(ad, OP_BROADCAST, &gy, 1, &a));
        break;
    }
    case OP_REDUCE_MAX: {
        /* split evenly over the elements equal to the max, as PyTorch's amax:
         * each of the k tied elements gets gy / k, so they sum to gy. (NaN:
         * no element equals the max, k = 0, and the select gives zeros.) */
        OpAttr a = shape_attr(&xs), cf = {.dtype = xs.dtype};
        int ym = emit(ad, OP_BROADCAST, &y, 1, &a);
        int m = bin(ad, OP_EQ, x, ym);
        int mf = emit(ad, OP_CAST, &m, 1, &cf);
        int k = emit(ad, OP_REDUCE_SUM, &mf, 1, &op->attr);
        int share = bin(ad, OP_DIV, gy, k);
        int gb = emit(ad, OP_BROADCAST, &share, 1, &a);
        accumulate(ad, x, sel(ad, m, gb, fill(ad, 0.0, &xs)));
        break;
    }
    case OP_MATMUL: {
        int ga = -1, gb = -1;
        vjp_matmul(ad, op, gy, &ga, &gb, need[0], need[1]);
        if (need[0])
            accumulate(ad, x, ga);
        if (need[1])
            accumulate(ad, op->in[1], gb);
        break;
    }
    case OP_ATTENTION:
        vjp_attention(ad, op, gy, need);
        break;
    case OP_ALLREDUCE:
    case OP_TP_ALLREDUCE: /* Megatron's g: the sum's cotangent reaches every part */
        accumulate(ad, x, gy);
        break;
    case OP_TP_COPY: /* Megatron's f: each rank's cotangent is a part of the whole */
        accumulate(ad, x, emit(ad, OP_TP_ALLREDUCE, &gy, 1, &op->attr));
        break;
    case OP_TP_REDUCE_SCATTER:
        accumulate(ad, x, emit(ad, OP_TP_ALL_GATHER, &gy, 1, &op->attr));
        break;
    case OP_TP_ALL_GATHER: { /* the gathered value is whole on every rank, and so is its
                                cotangent: this rank's part of it; or (sum=1) each
                                rank's cotangent is a part: their sum's part */
        if (op->attr.nia == 4 && op->attr.ia[3]) {
            OpAttr a = op->attr;
            a.nia = 3;
            accumulate(ad, x, emit(ad, OP_TP_REDUCE_SCATTER, &gy, 1, &a));
            break;
        }
        OpAttr a = shape_attr(&xs);
        a.nia = xs.rank;
        int ax = (int)op->attr.ia[0];
        a.ia[ax] = op->attr.ia[2] * xs.dim[ax];
        accumulate(ad, x, emit(ad, OP_SLICE, &gy, 1, &a));
        break;
    }
    case OP_STOP_GRADIENT: /* no cotangent for its operand */
        break;
    default: /* reachable from hand-written IR (kiln opt): the pass fails */
        if (!ad->norule)
            ad->norule = op;
        break;
    }
}

bool pass_autodiff(Graph *g, const PassOpts *o, Diag *d)
{
    (void)o;
    int loss = ir_find_output(g, "loss");
    if (loss < 0) {
        snprintf(d->msg, sizeof d->msg,
                 "the graph has no output named \"loss\" (expected the model to set one)");
        return false;
    }
    const Tensor *lt = &g->t.v[loss];
    if (lt->s.rank != 0 || !dtype_is_float(lt->s.dtype)) {
        char b[160];
        SrcLoc l = lt->op >= 0 ? g->ops.v[lt->op].loc : (SrcLoc){0};
        snprintf(d->msg, sizeof d->msg, "%s:%d: the loss must be a scalar float (expected f32[], got %s)",
                 l.file ? l.file : "?", l.line, shape_str(g, &lt->s, b, sizeof b));
        return false;
    }

    int nt = g->t.n, nops = g->ops.n;
    bool *live = xcalloc((size_t)nt, sizeof(bool));   /* depends on a param */
    int *grad = xmalloc(sizeof(int) * (size_t)nt);
    for (int i = 0; i < nt; i++) {
        grad[i] = -1;
        live[i] = g->t.v[i].kind == TK_PARAM && dtype_is_float(g->t.v[i].s.dtype);
    }
    for (int i = 0; i < nops; i++) {
        const Op *op = &g->ops.v[i];
        if (!dtype_is_float(g->t.v[op->out].s.dtype))
            continue;
        for (int j = 0; j < op->nin; j++)
            if (live[op->in[j]] && diff_operand(op->code, j) &&
                dtype_is_float(g->t.v[op->in[j]].s.dtype))
                live[op->out] = true;
    }

    AD ad = {.g = g, .grad = grad, .pend = xcalloc((size_t)nt, sizeof(Pieces))};
    Op bad = {0}; /* the op without a gradient rule, when ad.norule */
    if (live[loss]) {
        ad.loc = lt->op >= 0 ? g->ops.v[lt->op].loc : (SrcLoc){0};
        Shape ls = lt->s;
        grad[loss] = fill(&ad, 1.0, &ls);
        for (int i = nops - 1; i >= 0; i--) {
            Op op = g->ops.v[i]; /* copy: emitting reallocates g->ops */
            flush_slices(&ad, op.out); /* every use of op.out is behind us */
            if (grad[op.out] < 0 || !live[op.out])
                continue;
            ad.loc = op.loc;
            vjp(&ad, &op, live);
            if (ad.norule) { /* == &op, which ends with this loop's body */
                bad = op;
                break;
            }
        }
    }
    if (ad.norule) {
        const Op *op = &bad;
        snprintf(d->msg, sizeof d->msg,
                 "%s:%d: autodiff has no gradient rule for %%%d = %s%s (expected the forward "
                 "ops a model script makes)",
                 op->loc.file ? op->loc.file : "?", op->loc.line, op->out,
                 ir_opinfo[op->code].name,
                 op->code == OP_ATTENTION && ir_attn_heads(&op->attr)
                     ? " in the head layout (attnlayout's form: the pipeline runs it after "
                       "autodiff)"
                     : "");
        vec_free(&ad.lse);
        for (int i = 0; i < nt; i++)
            vec_free(&ad.pend[i]);
        free(ad.pend);
        free(live);
        free(grad);
        return false;
    }
    for (int i = 0; i < nt; i++) {
        if (g->t.v[i].kind != TK_PARAM)
            continue;
        Shape ps = g->t.v[i].s;
        flush_slices(&ad, i);
        int gt = grad[i];
        if (gt < 0) {
            ad.loc = (SrcLoc){0};
            gt = fill(&ad, 0.0, &ps);
        }
        char *name = xasprintf("grad.%s", g->t.v[i].name);
        ir_add_output(g, name, gt);
        free(name);
    }
    if (ad.lse.n) {
        /* each attention_lse right after its attention op (it reads only q
         * and k, defined before): one forward kernel writes both */
        int n = g->ops.n;
        int *after = xmalloc(sizeof(int) * (size_t)(n + 1)), *order = xmalloc(sizeof(int) * (size_t)(n + 1));
        bool *moved = xcalloc((size_t)n + 1, sizeof(bool));
        for (int i = 0; i < n; i++)
            after[i] = -1;
        for (int i = 0; i < ad.lse.n; i += 2) {
            after[ad.lse.v[i]] = ad.lse.v[i + 1];
            moved[ad.lse.v[i + 1]] = true;
        }
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (moved[i])
                continue;
            order[k++] = i;
            if (after[i] >= 0)
                order[k++] = after[i];
        }
        ir_reorder_ops(g, order, k);
        free(after);
        free(order);
        free(moved);
    }
    vec_free(&ad.lse);
    for (int i = 0; i < nt; i++)
        vec_free(&ad.pend[i]);
    free(ad.pend);
    free(live);
    free(grad);
    ir_compact(g);
    return true;
}
