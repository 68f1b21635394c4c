/* cost.c - FLOP and byte counts per op, for the MFU report and cost models.
 *
 * FLOPs: elementwise and random ops count numel(result) * flops_per_elem;
 * reductions numel(input) * flops_per_elem; matmul 2*M*N*K per batch entry;
 * data movement 0, except scatter_add (one add per source element) and
 * col2im (one add per column element);
 * collectives 0 (they are communication, not compute). The attention family
 * counts only the kept (i, j) pairs (causal: sum over rows i of min(i+1, Tk),
 * per batch entry), per pair: S = q.k 2D, its softmax 4, P v 2Dv (attention);
 * S and its exp (attention_lse); the gradients recompute S and P, then
 * attention_dq/dk add dO.v 2Dv, dS 2 and dS k (or dS q) 2D, attention_dv
 * adds P dO 2Dv. Bytes: the default (each operand once, the result once).
 *
 * Bytes: what an unfused kernel for the op reads plus what it writes.
 * By default every operand is read once and the result written once.
 * Exceptions: slice reads only the selected elements; gather reads
 * numel(result) table elements plus the indices; const and iota read
 * nothing.
 */
#include "ir.h"

#include <string.h>

static double numel(const Graph *g, int t) { return (double)shape_numel(&g->t.v[t].s); }

static double bytes_of(const Graph *g, int t)
{
    return numel(g, t) * (double)dtype_size(g->t.v[t].s.dtype);
}

/* Kept (i, j) pairs of an attention op over all batch entries and heads. */
static double attention_pairs(const IrAttnLayout *L, bool causal)
{
    double Tq = (double)L->Tq, Tk = (double)L->Tk, B = (double)L->nb * (double)L->nh;
    if (!causal)
        return B * Tq * Tk;
    /* sum_{i<Tq} min(i+1, Tk) */
    double full = Tq < Tk ? Tq : Tk;
    double pairs = full * (full + 1) / 2 + (Tq - full) * Tk;
    if (L->window > 0 && (double)L->window < Tq) { /* causal Tq == Tk: rows i >= W keep W */
        double W = (double)L->window;
        pairs = W * (W + 1) / 2 + (Tq - W) * W;
    }
    return B * pairs;
}

double ir_attn_flops(const Graph *g, const Op *op, Opcode code)
{
    IrAttnLayout L;
    ir_attn_layout(g, op, &L);
    double D = (double)L.D, Dv = code == OP_ATTENTION_LSE ? 0 : (double)L.Dv;
    double per;
    switch (code) {
    case OP_ATTENTION: per = 2 * D + 4 + 2 * Dv; break;
    case OP_ATTENTION_LSE: per = 2 * D + 4; break;
    case OP_ATTENTION_DV: per = 2 * D + 4 + 2 * Dv; break;
    case OP_ATTENTION_DQKV: /* dq, dk and dv */
        per = 2 * (2 * D + 4 + 2 * Dv + 2 + 2 * D) + 2 * D + 4 + 2 * Dv;
        break;
    default: per = 2 * D + 4 + 2 * Dv + 2 + 2 * D; break; /* dq, dk */
    }
    return attention_pairs(&L, op->attr.ia[0] != 0) * per;
}

double ir_op_flops(const Graph *g, const Op *op)
{
    const OpInfo *info = &ir_opinfo[op->code];
    switch (info->cls) {
    case OC_ELEMWISE:
    case OC_RANDOM: return numel(g, op->out) * info->flops_per_elem;
    case OC_REDUCE: return numel(g, op->in[0]) * info->flops_per_elem;
    case OC_GEMM: {
        /* numel(result) = batch * M * N; K is A's contracted dim (the last,
         * or the second to last when A is transposed) */
        const Shape *A = &g->t.v[op->in[0]].s;
        double K = (double)A->dim[A->rank - 1 - (op->attr.ia[0] ? 1 : 0)];
        return 2.0 * numel(g, op->out) * K;
    }
    case OC_MOVE:
        if (op->code == OP_SCATTER_ADD)
            return numel(g, op->in[1]) * info->flops_per_elem;
        if (op->code == OP_COL2IM) /* one add per column element */
            return numel(g, op->in[0]) * info->flops_per_elem;
        return 0;
    case OC_ATTN: return ir_attn_flops(g, op, op->code);
    default: return 0;
    }
}

double ir_op_bytes(const Graph *g, const Op *op)
{
    double out = bytes_of(g, op->out);
    switch (op->code) {
    case OP_CONST:
    case OP_IOTA:
    case OP_RANDOM: return out;
    case OP_SLICE: return 2 * out;
    case OP_TAKE_ALONG: /* one element of x per row */
    case OP_GATHER: {
        const Tensor *table = &g->t.v[op->in[0]];
        double read = numel(g, op->out) * (double)dtype_size(table->s.dtype);
        return read + bytes_of(g, op->in[1]) + out;
    }
    default: {
        double rd = 0;
        for (int i = 0; i < op->nin; i++)
            rd += bytes_of(g, op->in[i]);
        if (ir_opinfo[op->code].cls == OC_ATTN && ir_attn_heads(&op->attr)) {
            /* the head layout reads its heads' columns of q, k, v only */
            int n = op->nin < 3 ? op->nin : 3;
            double es = (double)dtype_size(g->t.v[op->in[0]].s.dtype);
            rd = 0;
            for (int i = 0; i < n; i++)
                rd += (double)g->t.v[op->in[i]].s.dim[0] * (double)g->t.v[op->in[i]].s.dim[1] *
                      (double)(op->attr.ia[1] * op->attr.ia[2]) * es;
            for (int i = n; i < op->nin; i++)
                rd += bytes_of(g, op->in[i]);
        }
        return rd + out;
    }
    }
}

double ir_graph_flops(const Graph *g)
{
    double f = 0;
    for (int i = 0; i < g->ops.n; i++)
        f += ir_op_flops(g, &g->ops.v[i]);
    return f;
}

/* Whether op r, reading tensor t, is a step of grad_accum's accumulation
 * (passes/comm.c accumulate, pass_comm_micro): t + state "accum.P", or
 * (after that sum) t x a constant. */
static bool accum_step(const Graph *g, const Op *r, int t, bool summed)
{
    if (r->nin != 2 || (r->code != OP_ADD && r->code != OP_MUL))
        return false;
    int other = r->in[0] == t ? r->in[1] : r->in[0];
    const Tensor *o = &g->t.v[other];
    if (r->code == OP_ADD)
        return !summed && o->kind == TK_STATE && o->name && strncmp(o->name, "accum.", 6) == 0;
    return summed && o->op >= 0 && g->ops.v[o->op].code == OP_CONST;
}

bool ir_wgrad_matmul(const Graph *g, const IrReaders *rd, int i, int acc[3])
{
    const Op *op = &g->ops.v[i];
    int chain[3] = {-1, -1, -1}; /* the accumulator's add, the constant, the product */
    if (acc)
        acc[0] = acc[1] = acc[2] = -1;
    if (op->code != OP_MATMUL || !(op->flags & OPF_BACKWARD) || (op->flags & OPF_RECOMPUTE))
        return false;
    /* the result, then (grad_accum) its sum with the accumulator, then
     * that sum's product: at most three tensors along one chain */
    int t = op->out;
    bool summed = false;
    for (int depth = 0; depth < 3; depth++) {
        int next = -1;
        for (int e = rd->start[t]; e < rd->start[t + 1]; e++) {
            int k = rd->op[e];
            const Op *r = &g->ops.v[k];
            if (k == i || (op->group >= 0 && r->group == op->group) ||
                !(r->flags & OPF_BACKWARD) || (r->flags & OPF_OPTIM))
                continue;
            if (next >= 0 || !accum_step(g, r, t, summed))
                return false; /* the chain of input gradients, or two readers */
            next = k;
        }
        if (next < 0) {
            if (acc)
                memcpy(acc, chain, sizeof chain);
            return true;
        }
        if (summed) {
            const Op *r = &g->ops.v[next];
            int c = r->in[0] == t ? r->in[1] : r->in[0];
            chain[1] = g->t.v[c].op;
            chain[2] = next;
        } else {
            chain[0] = next;
        }
        summed = true;
        t = g->ops.v[next].out;
    }
    return false;
}

int ir_matmul_role(const Shape *s, int axis, bool trans, bool is_b)
{
    int r = s->rank;
    if (axis < r - 2)
        return 0;
    bool second = axis == r - 1;
    bool isk = is_b ? (second == trans) : (second != trans);
    return isk ? 2 : 1;
}
