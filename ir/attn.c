/* attn.c - the layouts of the attention family (ir.h, IrAttnLayout): where
 * element (b, h, i, d) of q, k, v, o, dO, the gradients, lse and delta sits
 * in its buffer, for the plain layout ([..., T, D] tensors, heads folded
 * into the batch dims) and the head layout ([B, T, H*D]-ordered tensors,
 * q/k/v read at column offsets out of wider rows; attention_dqkv writes
 * dq, dk, dv at q's, k's and v's places in one tensor of their type). ir/interp.c, the C and
 * the CUDA kernels all index through this one description, which also
 * carries the variants: grouped key/value heads (g, nhk), the window and
 * ALiBi's head count.
 * Invariant: op has been typed by ir_infer (the shapes fit the attrs). */
#include "ir.h"

#include <string.h>

bool ir_attn_same_attrs(const OpAttr *a, const OpAttr *b)
{
    return a->nia == b->nia && a->f == b->f &&
           memcmp(a->ia, b->ia, sizeof(int64_t) * (size_t)a->nia) == 0;
}

void ir_attn_set_variant(OpAttr *a, int64_t window, bool alibi, int64_t kvh, int bias)
{
    bool heads = ir_attn_heads(a);
    if (!heads || kvh == a->ia[1])
        kvh = 0;
    if (!heads)
        for (int x = 1; x < 6; x++)
            a->ia[x] = 0;
    if (!window && !alibi && !kvh && !bias) {
        a->nia = heads ? 6 : 1;
        a->ia[6] = a->ia[7] = 0;
        return;
    }
    a->nia = 8;
    a->ia[6] = window;
    a->ia[7] = (alibi ? 1 : 0) + 2 * bias + 8 * kvh;
}

bool ir_attn_bias_fits(const int64_t *lead, int nl, int64_t Tq, int64_t Tk, const Shape *b,
                       IrAttnLayout *L)
{
    int R = nl + 2;
    if (b->rank > R)
        return false;
    int64_t bd[IR_MAX_RANK + 2], want[IR_MAX_RANK + 2];
    for (int x = 0; x < nl; x++)
        want[x] = lead[x];
    want[nl] = Tq, want[nl + 1] = Tk;
    for (int x = 0; x < R; x++) {
        int y = x - (R - b->rank);
        bd[x] = y < 0 ? 1 : b->dim[y];
        if (bd[x] != 1 && bd[x] != want[x])
            return false;
    }
    /* the leading axes that are not broadcast: one run [a0, a1) (axes of
     * size 1 in the scores too may sit inside it) */
    int a0 = -1, a1 = -1;
    for (int x = 0; x < nl; x++)
        if (bd[x] != 1) {
            if (a0 < 0)
                a0 = x;
            a1 = x + 1;
        }
    for (int x = a0 < 0 ? nl : a0; x < a1; x++)
        if (bd[x] != want[x])
            return false;
    if (!L)
        return true;
    int64_t div = 1, mod = 1;
    if (a0 >= 0) {
        for (int x = a1; x < nl; x++)
            div *= want[x];
        for (int x = a0; x < a1; x++)
            mod *= want[x];
    }
    L->bdiv = div;
    L->bmod = mod;
    L->bbs = a0 >= 0 ? bd[nl] * bd[nl + 1] : 0;
    L->bis = bd[nl] == 1 ? 0 : bd[nl + 1];
    L->bjs = bd[nl + 1] == 1 ? 0 : 1;
    return true;
}

/* L's bias fields from op's bias or mask operand, for the scores
 * [lead..., Tq, Tk] (the layout's work items). */
static void set_bias(const Graph *g, const Op *op, const int64_t *lead, int nl, IrAttnLayout *L)
{
    L->bias = ir_attn_bias(&op->attr);
    L->bdiv = L->bmod = 1;
    L->bbs = L->bis = L->bjs = 0;
    if (L->bias && !ir_attn_bias_fits(lead, nl, L->Tq, L->Tk, &g->t.v[ir_attn_bias_in(op)].s, L))
        die("ir_attn_layout: %s's bias does not fit its scores (ir_infer checks it)",
            ir_opinfo[op->code].name);
}

void ir_attn_layout(const Graph *g, const Op *op, IrAttnLayout *L)
{
    L->window = ir_attn_window(&op->attr);
    const Shape *q = &g->t.v[op->in[0]].s, *k = &g->t.v[op->in[1]].s;
    const Shape *v = op->code != OP_ATTENTION_LSE ? &g->t.v[op->in[2]].s : NULL;
    int r = q->rank;
    L->Tq = q->dim[r - 2];
    L->Tk = k->dim[r - 2];
    if (!ir_attn_heads(&op->attr)) {
        L->D = q->dim[r - 1];
        L->Dv = v ? v->dim[r - 1] : L->D;
        L->nb = shape_numel(q) / (L->Tq * L->D);
        L->nh = 1;
        L->g = r >= 3 ? q->dim[r - 3] / k->dim[r - 3] : 1;
        L->nhk = 1;
        L->ah = ir_attn_alibi(&op->attr) ? (r >= 3 ? q->dim[r - 3] : 1) : 0;
        L->q = (IrAttnStride){L->Tq * L->D, 0, L->D, 0};
        L->k = (IrAttnStride){L->Tk * L->D, 0, L->D, 0};
        L->v = (IrAttnStride){L->Tk * L->Dv, 0, L->Dv, 0};
        L->o = (IrAttnStride){L->Tq * L->Dv, 0, L->Dv, 0};
        L->dq = L->q;
        L->dk = L->k;
        L->dv = L->v;
        L->st = (IrAttnStride){L->Tq, 0, 1, 0};
        set_bias(g, op, q->dim, r - 2, L);
        return;
    }
    const int64_t *a = op->attr.ia;
    int64_t H = a[1], D = a[2], W = H * D, K = ir_attn_kvh(&op->attr);
    L->nb = q->dim[0];
    L->nh = H;
    L->g = H / K;
    L->nhk = K;
    L->ah = ir_attn_alibi(&op->attr) ? H : 0;
    L->D = L->Dv = D;
    L->q = (IrAttnStride){L->Tq * q->dim[2], D, q->dim[2], a[3]};
    L->k = (IrAttnStride){L->Tk * k->dim[2], D, k->dim[2], a[4]};
    L->v = v ? (IrAttnStride){L->Tk * v->dim[2], D, v->dim[2], a[5]} : L->k;
    L->o = L->dq = (IrAttnStride){L->Tq * W, D, W, 0};
    L->dk = L->dv = (IrAttnStride){L->Tk * K * D, D, K * D, 0};
    if (op->code == OP_ATTENTION_DQKV) { /* the gradients where q, k, v sit */
        L->dq = L->q;
        L->dk = L->k;
        L->dv = L->v;
    }
    L->st = (IrAttnStride){L->Tq * H, 1, H, 0};
    set_bias(g, op, (int64_t[]){L->nb, H}, 2, L);
}
