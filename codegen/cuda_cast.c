/* cuda_cast.c - the bf16 copies of f32 GEMM operands a bf16 CUDA program
 * keeps through a step (cg_cuda_casts).
 *
 * In a bf16 program every GEMM reads bf16 operands, so an f32 operand (a
 * weight) is cast first (kiln_cast_f32_bf16). A weight read by several
 * GEMMs of one step (its forward product, then the backward's dX = dY W^T)
 * is cast once, by the first of them, into a slot of its own in the
 * weight-copy buffer (CgCudaProgram.cast_bytes, beside the arena), and the
 * later GEMMs read that copy, as long as no step in between writes the
 * weight's storage. Other f32 operands are cast into the per-GEMM scratch
 * right before their GEMM, as before.
 *
 * Invariants: a slot belongs to one tensor whose storage root is
 * persistent in q->mem (params and optimizer state: no other tensor is
 * ever placed there) and that two or more GEMM steps cast; a copy is read
 * only by GEMMs after its cast with no write to that root in between: an
 * output of a kernel step with the same root, a GEMM's c, d, aux or bgrad
 * with the same root (whatever epilogue the backend ends up applying), a
 * copy step into its bytes, or any collective step (conservatively, every
 * copy goes stale). The decisions depend on the step order only, so every
 * run of the step list casts at the same steps and starts with every copy
 * stale: the first reader of each run casts. */
#include "cg_cuda.h"

#include <stdlib.h>

/* Whether operand o (0: a, 1: b) of GEMM step st is cast to bf16 (as
 * kc_gemm_form decides: bf16 inputs, the operand stored as f32). */
static bool cast_operand(const CgCudaProgram *q, const CgGemm *m, int o)
{
    DType sa = q->storage[m->a], sb = q->storage[m->b];
    bool bf16_in = q->bf16 || sa == DT_BF16 || sb == DT_BF16;
    return bf16_in && (o ? sb : sa) == DT_F32;
}

/* Marks stale every slotted tensor whose storage root is r (r < 0: all). */
static void stale_root(const MemPlan *mem, const int *slotted, int n, int r, bool *valid)
{
    for (int i = 0; i < n; i++)
        if (r < 0 || mem->root[slotted[i]] == r)
            valid[slotted[i]] = false;
}

void cg_cuda_casts(CgCudaProgram *q)
{
    const CgPlan *p = q->plan;
    const Graph *g = p->g;
    const MemPlan *mem = q->mem;
    int ns = p->steps.n, nt = g->t.n;
    q->cast_off = xmalloc(sizeof(int64_t) * (size_t)(2 * ns + 1));
    q->cast_now = xmalloc(sizeof(bool) * (size_t)(2 * ns + 1));
    q->cast_bytes = 0;
    for (int i = 0; i < 2 * ns; i++) {
        q->cast_off[i] = -1;
        q->cast_now[i] = true;
    }
    /* how many GEMM steps cast each persistent tensor */
    int *readers = xcalloc((size_t)nt + 1, sizeof(int));
    for (int s = 0; s < ns; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_GEMM)
            continue;
        for (int o = 0; o < 2; o++) {
            int t = o ? st->gemm.b : st->gemm.a;
            if (cast_operand(q, &st->gemm, o) && mem->persistent[mem->root[t]] &&
                !(o == 1 && st->gemm.a == st->gemm.b))
                readers[t]++;
        }
    }
    int64_t *slot = xmalloc(sizeof(int64_t) * (size_t)(nt + 1));
    int *slotted = xmalloc(sizeof(int) * (size_t)(nt + 1));
    int nslot = 0;
    for (int t = 0; t < nt; t++) {
        slot[t] = -1;
        if (readers[t] < 2)
            continue;
        slot[t] = q->cast_bytes;
        q->cast_bytes += (shape_numel(&g->t.v[t].s) * 2 + 255) / 256 * 256;
        slotted[nslot++] = t;
    }
    /* the step walk: which GEMM finds its operand's copy stale */
    bool *valid = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int s = 0; s < ns && nslot; s++) {
        const CgStep *st = &p->steps.v[s];
        switch (st->kind) {
        case CG_STEP_GEMM: {
            const CgGemm *m = &st->gemm;
            for (int o = 0; o < 2; o++) {
                int t = o ? m->b : m->a;
                if (!cast_operand(q, m, o) || slot[t] < 0)
                    continue;
                q->cast_off[2 * s + o] = slot[t];
                q->cast_now[2 * s + o] = !valid[t];
                valid[t] = true;
            }
            int w[4] = {m->c, m->d, m->aux, m->bgrad};
            for (int i = 0; i < 4; i++)
                if (w[i] >= 0)
                    stale_root(mem, slotted, nslot, mem->root[w[i]], valid);
            break;
        }
        case CG_STEP_KERNEL: {
            const CgKernel *k = p->kernels.v[st->kernel];
            for (int j = 0; j < k->params.n; j++)
                if (k->params.v[j].out)
                    stale_root(mem, slotted, nslot, mem->root[st->args[j]], valid);
            break;
        }
        case CG_STEP_COPY: {
            const CgCudaCopy *c = &q->copy[s];
            for (int i = 0; i < nslot; i++) {
                int t = slotted[i];
                int64_t off = mem->offset[t], end = off + mem->bytes[t];
                if (c->dst < end && off < c->dst + c->bytes)
                    valid[t] = false;
            }
            break;
        }
        default: stale_root(mem, slotted, nslot, -1, valid); break;
        }
    }
    free(valid);
    free(slotted);
    free(slot);
    free(readers);
}
