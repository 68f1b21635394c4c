/* simplify.c - constant folding, exact algebraic identities, common-subexpression
 * elimination and dead-code elimination, repeated to a fixed point.
 *
 * Each round is one sweep in program order that rewrites operands through a
 * tensor-id replacement map (rep), so a chain of rewrites settles in one
 * sweep; then dead code is dropped. Rewrites either redirect an op's result to
 * an existing tensor of the identical type (the op then dies), or change the
 * op in place (folded to a const, a reshape of a reshape or a permute of a
 * permute reading the inner operand); survivors keep their source locations.
 *
 * Folding:
 *   elementwise op with all-const operands -> const (evaluated in double,
 *     rounded to the result dtype; skipped where the result would not be
 *     representable or the integer semantics are not plain arithmetic)
 *   broadcast / reshape / permute / slice / reduce_max of a const -> const
 *   select with a const mask -> the chosen operand
 * Identities (only where the replacement has the op's exact type):
 *   x*1, 1*x, x/1, x+0, 0+x, x-0 -> x   (x+0 with x = -0.0 gives +0.0: the only
 *     difference, and harmless; x*0 is never folded: inf*0 and nan*0 are nan)
 *   stop_gradient(x) -> x (simplify runs after autodiff, which is the only
 *     pass it means anything to);
 *   neg(neg(x)) -> x; reshape(reshape(x)) -> reshape(x); permute(permute(x))
 *   -> one permute (the composition); reshape, broadcast
 *   to the operand's own shape -> x; permute by the identity -> x
 * CSE: same opcode, operands (either order for commutative binaries), result
 * type, attributes of the op's attribute kind and OPF_RECOMPUTE flag. Random
 * and collective ops are never merged.
 * DCE: keeps the ops that outputs and updates reach.
 */
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROUNDS 16

typedef struct {
    Graph *g;
    int *rep;      /* tensor id -> replacement tensor id (itself when none) */
    int *slot;     /* CSE hash table of op indices, -1 empty */
    size_t mask;   /* table size - 1 */
    bool changed;
} Ctx;

static int find(int *rep, int t)
{
    int r = t;
    while (rep[r] != r)
        r = rep[r];
    while (rep[t] != r) {
        int n = rep[t];
        rep[t] = r;
        t = n;
    }
    return r;
}

/* ---- values ------------------------------------------------------------ */

/* x rounded to nearest-even in a binary format with p significand bits,
 * minimum normal exponent emin and maximum exponent emax. */
static double round_fmt(double x, int p, int emin, int emax)
{
    if (!isfinite(x) || x == 0)
        return x;
    double a = fabs(x);
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    int E = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, E - (p - 1));
    double r = nearbyint(a / q) * q;
    double maxf = ldexp(2.0 - ldexp(1.0, 1 - p), emax);
    if (r > maxf)
        r = INFINITY;
    return copysign(r, x);
}

/* x rounded to dtype dt; false when dt is an integer type that cannot hold x
 * exactly (then no fold happens). */
static bool to_dtype(double x, DType dt, double *r)
{
    switch (dt) {
    case DT_F32: *r = (double)(float)x; return true;
    case DT_BF16: *r = round_fmt(x, 8, -126, 127); return true;
    case DT_F16: *r = round_fmt(x, 11, -14, 15); return true;
    case DT_I32: *r = x; return x == floor(x) && x >= -2147483648.0 && x <= 2147483647.0;
    case DT_I64: *r = x; return x == floor(x) && fabs(x) <= 9007199254740992.0;
    case DT_U8: *r = x; return x == floor(x) && x >= 0 && x <= 255;
    default: return false;
    }
}

static const Op *producer(const Graph *g, int t)
{
    int o = g->t.v[t].op;
    return o >= 0 ? &g->ops.v[o] : NULL;
}

/* The value of const tensor t, rounded to its dtype. */
static bool const_value(const Graph *g, int t, double *v)
{
    const Op *p = producer(g, t);
    if (!p || p->code != OP_CONST)
        return false;
    return to_dtype(p->attr.f, p->attr.dtype, v);
}

/* Evaluates elementwise op c on operand values x (operands of dtype idt) into
 * *r before rounding; false when the fold must not happen. */
static bool eval_elem(Opcode c, DType idt, const double *x, double *r)
{
    bool flt = dtype_is_float(idt);
    double a = x[0], b = x[1];
    switch (c) {
    case OP_NEG: *r = -a; return true;
    case OP_EXP: *r = exp(a); return flt;
    case OP_LOG: *r = log(a); return flt;
    case OP_SIN: *r = sin(a); return flt;
    case OP_COS: *r = cos(a); return flt;
    case OP_TANH: *r = tanh(a); return flt;
    case OP_SQRT: *r = sqrt(a); return flt;
    case OP_RSQRT: *r = 1.0 / sqrt(a); return flt;
    case OP_SIGMOID: *r = 1.0 / (1.0 + exp(-a)); return flt;
    case OP_RELU: *r = a > 0 ? a : 0; return true;
    case OP_ABS: *r = fabs(a); return true;
    case OP_ERF: *r = erf(a); return flt;
    case OP_FLOOR: *r = floor(a); return true;
    case OP_CAST: *r = a; return true;
    case OP_ADD: *r = a + b; return true;
    case OP_SUB: *r = a - b; return true;
    case OP_MUL: *r = a * b; return true;
    case OP_DIV: *r = a / b; return flt; /* integer division: semantics left to backends */
    case OP_POW: *r = pow(a, b); return flt;
    case OP_MAX: *r = a > b || isnan(a) ? a : b; return true; /* NaN propagates */
    case OP_MIN: *r = a < b || isnan(a) ? a : b; return true;
    case OP_LT: *r = a < b; return true;
    case OP_LE: *r = a <= b; return true;
    case OP_GT: *r = a > b; return true;
    case OP_GE: *r = a >= b; return true;
    case OP_EQ: *r = a == b; return true;
    case OP_NE: *r = a != b; return true;
    default: return false;
    }
}

/* Turns op i into `const f` of its own result type. */
static void make_const(Ctx *c, int i, double f)
{
    Op *op = &c->g->ops.v[i];
    Tensor *t = &c->g->t.v[op->out];
    op->code = OP_CONST;
    op->nin = 0;
    memset(&op->attr, 0, sizeof op->attr);
    op->attr.f = f;
    op->attr.dtype = t->s.dtype;
    ir_attr_set_shape(&op->attr, &t->s);
    t->kind = TK_CONST;
    c->changed = true;
}

/* Redirects every use of op i's result to tensor x (of the identical type). */
static void replace(Ctx *c, int i, int x)
{
    c->rep[c->g->ops.v[i].out] = x;
    c->changed = true;
}

static bool is_const_eq(const Graph *g, int t, double v)
{
    double x;
    return const_value(g, t, &x) && x == v;
}

/* Folding and identities for op i (operands already rewritten). Returns true
 * when the op's result was redirected (the op is then dead). */
static bool fold(Ctx *c, int i)
{
    Graph *g = c->g;
    Op *op = &g->ops.v[i];
    const OpInfo *info = &ir_opinfo[op->code];
    const Shape *rs = &g->t.v[op->out].s;
    int *in = op->in;

    if (info->cls == OC_ELEMWISE && op->nin > 0 && op->code != OP_SELECT) {
        double x[3] = {0, 0, 0}, r, f;
        bool all = true;
        for (int k = 0; k < op->nin && all; k++)
            all = const_value(g, in[k], &x[k]);
        if (all && eval_elem(op->code, g->t.v[in[0]].s.dtype, x, &r) &&
            to_dtype(r, rs->dtype, &f)) {
            make_const(c, i, f);
            return false;
        }
    }

    switch (op->code) {
    case OP_STOP_GRADIENT: /* autodiff has run: now the identity */
        replace(c, i, in[0]);
        return true;
    case OP_SELECT: {
        double m;
        if (const_value(g, in[0], &m)) {
            replace(c, i, m != 0 ? in[1] : in[2]);
            return true;
        }
        break;
    }
    case OP_MUL:
    case OP_ADD: {
        double unit = op->code == OP_MUL ? 1 : 0;
        for (int k = 0; k < 2; k++)
            if (is_const_eq(g, in[k], unit) && shape_eq(&g->t.v[in[1 - k]].s, rs)) {
                replace(c, i, in[1 - k]);
                return true;
            }
        break;
    }
    case OP_SUB:
    case OP_DIV:
        if (is_const_eq(g, in[1], op->code == OP_DIV ? 1 : 0) &&
            shape_eq(&g->t.v[in[0]].s, rs)) {
            replace(c, i, in[0]);
            return true;
        }
        break;
    case OP_NEG: {
        const Op *p = producer(g, in[0]);
        if (p && p->code == OP_NEG) {
            replace(c, i, p->in[0]);
            return true;
        }
        break;
    }
    case OP_RESHAPE: {
        const Op *p = producer(g, in[0]);
        if (p && p->code == OP_RESHAPE) {
            in[0] = p->in[0];
            c->changed = true;
        }
        if (shape_eq(&g->t.v[in[0]].s, rs)) {
            replace(c, i, in[0]);
            return true;
        }
        break;
    }
    case OP_BROADCAST:
        if (shape_eq(&g->t.v[in[0]].s, rs)) {
            replace(c, i, in[0]);
            return true;
        }
        break;
    case OP_PERMUTE: {
        const Op *p = producer(g, in[0]);
        if (p && p->code == OP_PERMUTE) { /* out dim k = x dim pp[perm[k]] */
            int64_t cmp[IR_MAX_RANK];
            for (int k = 0; k < op->attr.nia; k++)
                cmp[k] = p->attr.ia[op->attr.ia[k]];
            memcpy(op->attr.ia, cmp, sizeof(int64_t) * (size_t)op->attr.nia);
            in[0] = p->in[0];
            c->changed = true;
        }
        bool id = true;
        for (int k = 0; k < op->attr.nia; k++)
            id = id && op->attr.ia[k] == k;
        if (id) {
            replace(c, i, in[0]);
            return true;
        }
        break;
    }
    default:
        break;
    }

    /* moves of a splat constant are the same splat in the new shape */
    switch (op->code) {
    case OP_BROADCAST:
    case OP_RESHAPE:
    case OP_PERMUTE:
    case OP_SLICE:
    case OP_REDUCE_MAX: {
        const Op *p = producer(g, in[0]);
        if (p && p->code == OP_CONST)
            make_const(c, i, p->attr.f);
        break;
    }
    default:
        break;
    }
    return false;
}

/* ---- CSE ----------------------------------------------------------------- */

static bool commutative(Opcode c)
{
    return c == OP_ADD || c == OP_MUL || c == OP_MAX || c == OP_MIN || c == OP_EQ ||
           c == OP_NE;
}

static uint64_t mix(uint64_t h, uint64_t x) { return ir_rand_mix(h ^ x); }

static uint64_t f_bits(double f)
{
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The attribute fields that matter for op's attribute kind (result type is
 * compared separately, which covers dtype and shape attributes). */
static uint64_t attr_hash(const Op *op)
{
    const OpAttr *a = &op->attr;
    uint64_t h = 0;
    switch (ir_opinfo[op->code].attr) {
    case AK_VALUE: return mix(h, f_bits(a->f));
    case AK_AXIS:
    case AK_AXES:
    case AK_PERM:
    case AK_START:
    case AK_GEMM:
    case AK_KEY:
        h = mix(h, (uint64_t)a->nia);
        for (int k = 0; k < a->nia && k < IR_MAX_RANK; k++)
            h = mix(h, (uint64_t)a->ia[k]);
        return h;
    default: return h;
    }
}

static bool attr_eq(const Op *x, const Op *y)
{
    const OpAttr *a = &x->attr, *b = &y->attr;
    switch (ir_opinfo[x->code].attr) {
    case AK_VALUE: return f_bits(a->f) == f_bits(b->f);
    case AK_AXIS:
    case AK_AXES:
    case AK_PERM:
    case AK_START:
    case AK_GEMM:
    case AK_KEY:
    case AK_ATTN:
        if (a->nia != b->nia || f_bits(a->f) != f_bits(b->f))
            return false;
        for (int k = 0; k < a->nia && k < IR_MAX_RANK; k++)
            if (a->ia[k] != b->ia[k])
                return false;
        return true;
    default: return true;
    }
}

static uint64_t op_hash(const Graph *g, const Op *op)
{
    const Shape *s = &g->t.v[op->out].s;
    uint64_t h = mix((uint64_t)op->code, (uint64_t)op->nin);
    h = mix(h, (uint64_t)(op->flags & OPF_RECOMPUTE));
    h = mix(h, (uint64_t)s->dtype * 16 + (uint64_t)s->rank);
    for (int k = 0; k < s->rank; k++)
        h = mix(h, (uint64_t)s->dim[k]);
    if (commutative(op->code) && op->nin == 2) {
        int a = op->in[0] < op->in[1] ? op->in[0] : op->in[1];
        int b = op->in[0] < op->in[1] ? op->in[1] : op->in[0];
        h = mix(mix(h, (uint64_t)a), (uint64_t)b);
    } else {
        for (int k = 0; k < op->nin; k++)
            h = mix(h, (uint64_t)op->in[k]);
    }
    return mix(h, attr_hash(op));
}

static bool op_eq(const Graph *g, const Op *x, const Op *y)
{
    if (x->code != y->code || x->nin != y->nin ||
        (x->flags & OPF_RECOMPUTE) != (y->flags & OPF_RECOMPUTE) ||
        !shape_eq(&g->t.v[x->out].s, &g->t.v[y->out].s) || !attr_eq(x, y))
        return false;
    bool same = true;
    for (int k = 0; k < x->nin && same; k++)
        same = x->in[k] == y->in[k];
    if (!same && commutative(x->code) && x->nin == 2)
        same = x->in[0] == y->in[1] && x->in[1] == y->in[0];
    return same;
}

/* Returns the op index already in the table equal to op i, or inserts i and
 * returns -1. */
static int cse_lookup(Ctx *c, int i)
{
    const Graph *g = c->g;
    const Op *op = &g->ops.v[i];
    size_t j = (size_t)op_hash(g, op) & c->mask;
    while (c->slot[j] >= 0) {
        if (op_eq(g, &g->ops.v[c->slot[j]], op))
            return c->slot[j];
        j = (j + 1) & c->mask;
    }
    c->slot[j] = i;
    return -1;
}

/* ---- driver -------------------------------------------------------------- */

/* One sweep in program order; returns a mask of ops still alive. */
static void sweep(Ctx *c, bool *dead)
{
    Graph *g = c->g;
    size_t cap = 16;
    while (cap < 2 * (size_t)g->ops.n)
        cap *= 2;
    c->slot = xmalloc(cap * sizeof(int));
    memset(c->slot, 0xff, cap * sizeof(int));
    c->mask = cap - 1;
    for (int i = 0; i < g->ops.n; i++) {
        Op *op = &g->ops.v[i];
        for (int k = 0; k < op->nin; k++) {
            int r = find(c->rep, op->in[k]);
            if (r != op->in[k]) {
                op->in[k] = r;
                c->changed = true;
            }
        }
        if (fold(c, i)) {
            dead[i] = true;
            continue;
        }
        OpClass cls = ir_opinfo[op->code].cls;
        if (cls == OC_RANDOM || cls == OC_COLLECTIVE)
            continue;
        int j = cse_lookup(c, i);
        if (j >= 0) {
            replace(c, i, g->ops.v[j].out);
            dead[i] = true;
        }
    }
    free(c->slot);
    c->slot = NULL;
}

/* Rewrites outputs and updates through rep, drops ops nothing reaches. */
static void dce(Ctx *c, bool *dead)
{
    Graph *g = c->g;
    bool *live = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int i = 0; i < g->outs.n; i++) {
        g->outs.v[i].t = find(c->rep, g->outs.v[i].t);
        live[g->outs.v[i].t] = true;
    }
    for (int i = 0; i < g->upd.n; i++) {
        g->upd.v[i].value = find(c->rep, g->upd.v[i].value);
        live[g->upd.v[i].value] = true;
    }
    for (int i = g->ops.n - 1; i >= 0; i--) {
        Op *op = &g->ops.v[i];
        if (dead[i] || !live[op->out]) {
            dead[i] = true;
            continue;
        }
        for (int k = 0; k < op->nin; k++)
            live[op->in[k]] = true;
    }
    int *order = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    int n = 0;
    for (int i = 0; i < g->ops.n; i++) {
        if (dead[i])
            c->changed = true;
        else
            order[n++] = i;
    }
    ir_reorder_ops(g, order, n);
    free(order);
    free(live);
}

bool pass_simplify(Graph *g, const PassOpts *o, Diag *d)
{
    (void)o;
    (void)d;
    Ctx c = {.g = g};
    for (int round = 0; round < MAX_ROUNDS; round++) {
        c.changed = false;
        c.rep = xmalloc(sizeof(int) * (size_t)(g->t.n ? g->t.n : 1));
        for (int t = 0; t < g->t.n; t++)
            c.rep[t] = t;
        bool *dead = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
        sweep(&c, dead);
        dce(&c, dead);
        free(dead);
        free(c.rep);
        ir_compact(g);
        if (!c.changed)
            break;
    }
    return true;
}
