/* attention.c - the attention pass: finds scaled-dot-product attention
 * written out in primitives and rewrites it to one `attention` op (ir.h),
 * so the backend runs it as one fused kernel in each direction (no T x T
 * tensor in memory). Runs first, before autodiff, which then derives the
 * fused backward (attention_lse, attention_dq/dk/dv). Off unless
 * o->attention (the runtime sets it for backends that have the kernels:
 * rt_pass_opts); --no-fuse-attention turns it off.
 *
 * The pattern, read backwards from the second matmul (docs/fusion.md):
 *   S0 = matmul(q, k) {ta=0, tb=1}        q, k, v of one rank (no shared k)
 *   s  = S0 * c | c * S0 | S0 / c | S0    c a positive constant (broadcast)
 *   x  = select(keep, s, f) | select(drop, f, s) | s
 *        keep / drop: an iota compare (through broadcasts) whose operands
 *        are the row index i and the column index j of the scores, meaning
 *        exactly j <= i (keep: i >= j, j <= i; drop: i < j, j > i); f a
 *        constant <= -1e4 or -inf
 *   z  = x - [stop_gradient] broadcast(reduce_max(x, last)) | x
 *   P  = exp(z) / broadcast(reduce_sum(exp(z), last))
 *   o  = matmul(P, v) {ta=0, tb=0}        -> attention(q, k, v) {causal, scale}
 * Invariant: it rewrites only when the result is the same function: every
 * intermediate (S0, s, x, z, exp(z), the max and sum chains, P) has no user
 * outside the pattern and is no graph output or update; the mask is checked
 * structurally (iota axes, compare, operand order), never evaluated. Dropout
 * between softmax and the matmul (P is then a select of a random compare),
 * a sliding-window or any other mask, another user of P or of the scores,
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

/* A match: the attention op's operands and attrs. */
typedef struct {
    int q, k, v;
    bool causal;
    double scale;
} Match;

/* Whether the op at index i (a matmul) ends an attention pattern. */
static bool match(const Ctx *c, int i, Match *mt)
{
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
    /* x = select(mask, s, fill) (or the mask's complement), or x = s */
    int s = x;
    mt->causal = false;
    if (is(c, x, OP_SELECT)) {
        const Op *se = def(c, x);
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
        if (!(f <= -1e4) || !causal_mask(c, se->in[0], keep_true) || !single(c, s))
            return false;
        mt->causal = true;
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
    /* the attention op's own typing (float dtype, batch dims, Tq == Tk when
     * causal) */
    OpAttr a = {.nia = 1, .ia = {mt->causal}, .f = mt->scale};
    int in[3] = {mt->q, mt->k, mt->v};
    Shape out;
    char err[256];
    if (!ir_infer(g, OP_ATTENTION, in, 3, &a, &out, err, sizeof err) ||
        !shape_eq(&out, &g->t.v[o->out].s))
        return false;
    return true;
}

bool pass_attention(Graph *g, const PassOpts *o, Diag *d)
{
    (void)d;
    if (!o->attention)
        return true;
    int *uses = ir_use_counts(g);
    Ctx c = {g, uses};
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
        op->code = OP_ATTENTION;
        op->in = xrealloc(op->in, sizeof(int) * 3);
        op->nin = 3;
        op->in[0] = mt.q;
        op->in[1] = mt.k;
        op->in[2] = mt.v;
        for (int j = 0; j < 3; j++)
            uses[op->in[j]]++;
        memset(&op->attr, 0, sizeof op->attr);
        op->attr.nia = 1;
        op->attr.ia[0] = mt.causal;
        op->attr.f = mt.scale;
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
    free(uses);
    return true;
}
