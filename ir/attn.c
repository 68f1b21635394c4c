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

void ir_attn_set_variant(OpAttr *a, int64_t window, bool alibi, int64_t kvh)
{
    bool heads = ir_attn_heads(a);
    if (!heads || kvh == a->ia[1])
        kvh = 0;
    if (!window && !alibi && !kvh) {
        a->nia = heads ? 6 : 1;
        a->ia[6] = a->ia[7] = 0;
        return;
    }
    a->nia = 8;
    a->ia[6] = window;
    a->ia[7] = (alibi ? 1 : 0) + 2 * kvh;
}

void ir_attn_layout(const Graph *g, const Op *op, IrAttnLayout *L)
{
    L->window = ir_attn_window(&op->attr);
    const Shape *q = &g->t.v[op->in[0]].s, *k = &g->t.v[op->in[1]].s;
    const Shape *v = op->nin > 2 ? &g->t.v[op->in[2]].s : NULL;
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
}
