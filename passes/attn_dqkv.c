/* attn_dqkv.c - the attention gradient pass: one [B, T, 3C] gradient of the
 * qkv projection instead of dq, dk, dv and a concat of them.
 *
 * After attnlayout and simplify, the gradient of the [B, T, 3C] tensor A
 * that q, k and v are read from is (autodiff's slice rule, docs/ir.md)
 *   %g = concat %dq, %dk, %dv {axis=2}
 * of the attention_dq/dk/dv ops of one group in the head layout. This pass
 * rewrites that concat to
 *   %g = attention_dqkv %q, %k, %v, %dO, %lse, %delta {same attrs}
 * (ir.h), whose kernels write dq, dk and dv straight into %g's buffer at
 * their column offsets, and drops the three ops: the copy of 3C columns
 * per row that the concat cost is gone.
 * Matched: a concat along axis 2 of three operands, each the result of a
 * different one of attention_dq/dk/dv with the head layout, the same six
 * operands and the same attributes, each read by nothing but the concat,
 * placed at exactly its op's qoff/koff/voff; the new op must type (ir_infer:
 * q, k, v of the concat's type, disjoint column ranges). Anything else is
 * left as it is.
 * Invariant: SSA holds without views or in-place updates: the concat's
 * result keeps its id and is now defined, whole, by attention_dqkv (every
 * column is one of the three ranges); the graph computes the same values;
 * attention_dqkv sits where the concat was, after all its operands. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

/* Whether attention ops a and b have the same operands and attributes. */
static bool same_group(const Op *a, const Op *b)
{
    if (a->nin != b->nin || !ir_attn_same_attrs(&a->attr, &b->attr))
        return false;
    for (int x = 0; x < a->nin; x++)
        if (a->in[x] != b->in[x])
            return false;
    return true;
}

/* The indices of the three gradient ops that concat op c joins, in operand
 * order, when c matches (see the top of the file); false otherwise. */
static bool match(const Graph *g, const Op *c, const int *uses, int src[3])
{
    if (c->code != OP_CONCAT || c->nin != 3 || c->attr.ia[0] != 2 ||
        g->t.v[c->out].s.rank != 3)
        return false;
    const Op *first = NULL;
    bool seen[3] = {false, false, false};
    int64_t at = 0;
    for (int x = 0; x < 3; x++) {
        int t = c->in[x];
        src[x] = g->t.v[t].op;
        if (src[x] < 0 || uses[t] != 1)
            return false;
        const Op *o = &g->ops.v[src[x]];
        int w = o->code == OP_ATTENTION_DQ ? 0 : o->code == OP_ATTENTION_DK ? 1
                : o->code == OP_ATTENTION_DV ? 2 : -1;
        if (w < 0 || seen[w] || !ir_attn_heads(&o->attr) || o->attr.ia[3 + w] != at ||
            (first && !same_group(first, o)))
            return false;
        seen[w] = true;
        first = first ? first : o;
        at += g->t.v[t].s.dim[2];
    }
    Shape s;
    char err[8];
    return ir_infer(g, OP_ATTENTION_DQKV, first->in, first->nin, &first->attr, &s, err,
                    sizeof err) &&
           shape_eq(&s, &g->t.v[c->out].s);
}

bool pass_attention_dqkv(Graph *g, const PassOpts *o, Diag *d)
{
    (void)d;
    if (!o->attention)
        return true;
    int *uses = ir_use_counts(g);
    bool *drop = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    int ndrop = 0;
    for (int i = 0; i < g->ops.n; i++) {
        int src[3];
        if (!match(g, &g->ops.v[i], uses, src))
            continue;
        const Op *dq = &g->ops.v[src[0]];
        Op *c = &g->ops.v[i];
        c->code = OP_ATTENTION_DQKV;
        c->in = xrealloc(c->in, sizeof(int) * (size_t)dq->nin);
        memcpy(c->in, dq->in, sizeof(int) * (size_t)dq->nin);
        c->nin = dq->nin;
        c->attr = dq->attr;
        c->loc = dq->loc;
        for (int x = 0; x < 3; x++)
            drop[src[x]] = true;
        ndrop += 3;
    }
    free(uses);
    if (ndrop) {
        ir_drop_ops(g, drop);
        ir_compact(g);
    }
    free(drop);
    return true;
}
