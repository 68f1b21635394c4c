/*
 * dimnames.c - which declared symbol each dim of an op's result came from
 * (Shape.dname), by provenance: a dim is named only where it carries an
 * operand axis that was named, or where the op's attribute shape names it.
 * A dim whose number merely equals a symbol's value stays unnamed, and two
 * symbols of one value each name only their own axes.
 *
 * Invariants: ir_infer_names only writes r->dname (dims, dtype and rank are
 * ir_infer's); a name it leaves is declared in g with exactly that dim's
 * value, so the printer's `f32[P,D]` parses back to the same dims.
 */
#include <string.h>

#include "ir.h"

/* an operand's shape, or NULL when the operand is not a tensor of g */
static const Shape *opnd(const Graph *g, const int *in, int nin, int i)
{
    if (i >= nin || in[i] < 0 || in[i] >= g->t.n)
        return NULL;
    return &g->t.v[in[i]].s;
}

/* r's dim i takes x's dim j's name when it has none yet and the two dims
 * are the same length (a carried axis keeps its length) */
static void take(Shape *r, int i, const Shape *x, int j)
{
    if (!x || i < 0 || i >= r->rank || j < 0 || j >= x->rank)
        return;
    if (!r->dname[i] && x->dname[j] && x->dim[j] == r->dim[i])
        r->dname[i] = x->dname[j];
}

/* every dim of r from the same-index dim of x (elementwise operands) */
static void take_all(Shape *r, const Shape *x)
{
    if (!x || x->rank != r->rank)
        return;
    for (int i = 0; i < r->rank; i++)
        take(r, i, x, i);
}

static void from_attr(Shape *r, const OpAttr *a)
{
    for (int i = 0; i < r->rank && i < a->rank; i++)
        if (a->shape[i] == r->dim[i])
            r->dname[i] = a->dname[i];
}

/* reshape: an axis is carried through when every axis before it has the
 * same length in both shapes (same leading index), or every axis after it
 * does (same trailing stride); the others are split or merged axes */
static void reshape_names(Shape *r, const Shape *x)
{
    if (!x)
        return;
    for (int i = 0; i < r->rank && i < x->rank && r->dim[i] == x->dim[i]; i++)
        take(r, i, x, i);
    for (int i = r->rank - 1, j = x->rank - 1; i >= 0 && j >= 0 && r->dim[i] == x->dim[j];
         i--, j--)
        take(r, i, x, j);
}

void ir_check_names(const Graph *g, Shape *s)
{
    for (int i = 0; i < s->rank; i++) {
        if (!s->dname[i])
            continue;
        bool ok = false;
        for (int k = 0; g && k < g->syms.n && !ok; k++)
            ok = strcmp(g->syms.v[k].name, s->dname[i]) == 0 && g->syms.v[k].value == s->dim[i];
        if (!ok)
            s->dname[i] = NULL;
    }
    for (int i = s->rank; i < IR_MAX_RANK; i++)
        s->dname[i] = NULL;
}

void ir_infer_names(const Graph *g, Opcode code, const int *in, int nin, const OpAttr *a,
                    Shape *r)
{
    static const OpAttr none;
    if (!a)
        a = &none;
    for (int i = 0; i < IR_MAX_RANK; i++)
        r->dname[i] = NULL;
    const Shape *x = opnd(g, in, nin, 0), *y = opnd(g, in, nin, 1);
    const OpInfo *info = &ir_opinfo[code];
    switch (info->cls) {
    case OC_ELEMWISE:
    case OC_RANDOM:
    case OC_COLLECTIVE:
        if (code == OP_CONST || code == OP_IOTA || code == OP_RANDOM) {
            from_attr(r, a);
        } else if (code == OP_SELECT) { /* the values first, then the mask */
            take_all(r, y);
            take_all(r, opnd(g, in, nin, 2));
            take_all(r, x);
        } else if (code == OP_ALLREDUCE_WAIT) {
            take_all(r, y);
        } else {
            for (int k = 0; k < nin; k++)
                take_all(r, opnd(g, in, nin, k));
        }
        break;
    case OC_REDUCE:
        take_all(r, x); /* a reduced axis is 1 long now: take() skips it */
        for (int k = 0; k < a->nia && k < IR_MAX_RANK; k++)
            if (a->ia[k] >= 0 && a->ia[k] < r->rank)
                r->dname[a->ia[k]] = NULL;
        break;
    case OC_ATTN: {
        const Shape *q = x, *v = opnd(g, in, nin, 2);
        int rk = r->rank;
        if (code == OP_ATTENTION_DQKV)
            take_all(r, q);
        else if (ir_attn_heads(a)) { /* [B, T, ...]: B from q, T from q (k for dk, dv) */
            take(r, 0, q, 0);
            take(r, 1, code == OP_ATTENTION_DK || code == OP_ATTENTION_DV ? y : q, 1);
        } else if (code == OP_ATTENTION_DK)
            take_all(r, y);
        else if (code == OP_ATTENTION_DV)
            take_all(r, v);
        else {
            for (int i = 0; i < rk - 1; i++)
                take(r, i, q, i);
            if (code == OP_ATTENTION)
                take(r, rk - 1, v, rk - 1);
            else if (code == OP_ATTENTION_DQ)
                take(r, rk - 1, q, rk - 1);
        }
        break;
    }
    case OC_GEMM: {
        if (!x || !y || x->rank < 2 || y->rank < 2 || a->nia != 2)
            break;
        int rk = r->rank;
        for (int i = 0; i < rk - 2; i++) {
            take(r, i, x, i);
            if (y->rank == rk)
                take(r, i, y, i);
        }
        take(r, rk - 2, x, x->rank - 2 + (a->ia[0] ? 1 : 0));
        take(r, rk - 1, y, y->rank - 1 - (a->ia[1] ? 1 : 0));
        break;
    }
    case OC_MOVE:
        switch (code) {
        case OP_BROADCAST:
            from_attr(r, a);
            if (x)
                for (int j = 0; j < x->rank; j++)
                    take(r, r->rank - x->rank + j, x, j);
            break;
        case OP_RESHAPE:
            from_attr(r, a);
            reshape_names(r, x);
            break;
        case OP_PERMUTE:
            for (int i = 0; i < r->rank && i < a->nia; i++)
                take(r, i, x, (int)a->ia[i]);
            break;
        case OP_SLICE:
        case OP_PAD:
            from_attr(r, a);
            take_all(r, x); /* the axes the op leaves whole */
            break;
        case OP_CONCAT: {
            int ax = a->nia == 1 ? (int)a->ia[0] : -1;
            for (int k = 0; k < nin; k++) {
                const Shape *s = opnd(g, in, nin, k);
                if (!s || s->rank != r->rank)
                    continue;
                for (int i = 0; i < r->rank; i++)
                    if (i != ax)
                        take(r, i, s, i);
            }
            break;
        }
        case OP_GATHER: /* table [V, C...], idx [I...] -> [I..., C...] */
            if (!x || !y)
                break;
            for (int i = 0; i < y->rank; i++)
                take(r, i, y, i);
            for (int i = 1; i < x->rank; i++)
                take(r, y->rank + i - 1, x, i);
            break;
        case OP_TAKE_ALONG: /* x [I..., V], idx [I...] -> [I...] */
            take_all(r, y);
            if (x)
                for (int i = 0; i < r->rank; i++)
                    take(r, i, x, i);
            break;
        case OP_IM2COL: /* x [N, C, D...] -> [N, O..., C*K]: the batch */
            if (x)
                take(r, 0, x, 0);
            break;
        case OP_COL2IM: /* cols [N, O..., C*K] -> [N, C, D...] (attr) */
            from_attr(r, a);
            if (x)
                take(r, 0, x, 0);
            break;
        case OP_SCATTER_ADD: /* idx [I...], src [I..., C...] -> [V, C...] */
            from_attr(r, a);
            if (x && y)
                for (int i = 1; i < r->rank; i++)
                    take(r, i, y, x->rank + i - 1);
            break;
        default: break;
        }
        break;
    default: break;
    }
    ir_check_names(g, r);
}
