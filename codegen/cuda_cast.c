/* cuda_cast.c - the bf16 copies of f32 GEMM operands a bf16 CUDA program
 * keeps through a step, and the launches that fill them (cg_cuda_casts).
 *
 * In a bf16 program every GEMM reads bf16 operands, so an f32 operand (a
 * weight) is cast first. A weight read by several GEMMs of one step (its
 * forward product, then the backward's dX = dY W^T) has a slot of its own
 * in the weight-copy buffer (CgCudaProgram.cast_bytes, beside the arena);
 * it is cast into the slot once after each write to its storage, and every
 * GEMM that reads it reads the slot. Other f32 operands are cast into the
 * per-GEMM scratch right before their GEMM (kiln_cast_f32_bf16), as before.
 *
 * One cast of a slotted weight may run anywhere in its window [L, R]: R is
 * its first GEMM reader since the last write, L the step after that write
 * (0: the run's start). The casts are grouped so that one launch of
 * kiln_cast_f32_bf16_multi (a chunk table, the multi-tensor-apply idea of
 * the AdamW update, cuda_multi.c) serves a whole group, right before the
 * group's GEMM step: the fewest points that meet every window (sort the
 * windows by R; the earliest R not yet served takes every window that
 * contains it). In a training step all weights go stale at the optimizer
 * (the run's end), so the whole step's casts are one launch before its
 * first GEMM. The copies persist for the step in any case (their bytes are
 * the slots), so an earlier cast costs no memory.
 *
 * Invariants: a slot belongs to one tensor whose storage root is
 * persistent in q->mem (params and optimizer state: no other tensor is
 * ever placed there) and that two or more GEMM steps cast; a copy is read
 * only after a cast with no write to that root in between: an output of a
 * kernel step with the same root, a GEMM's c, d, aux or bgrad with the
 * same root (whatever epilogue the backend ends up applying), a copy step
 * into its bytes, or any collective step (conservatively, every copy goes
 * stale). A weight that an all-gather writes (ZeRO-1) is cast at its own
 * reader R, never earlier: the executor may carry the gather's wait into
 * the next run, right before the bucket's first reader. The decisions
 * depend on the step order only, so every run of the step list casts at
 * the same steps and starts with every copy stale. */
#include "cg_cuda.h"

#include <stdlib.h>

const char cg_cuda_cast_multi_kernel[] =
    "#define KILN_PK(lo, hi) ((uint32_t)kiln_f2bf(__uint_as_float(lo)) | \\\n"
    "                        ((uint32_t)kiln_f2bf(__uint_as_float(hi)) << 16))\n"
    "struct kiln_cast_job { const float *x; kiln_bf16 *y; int64_t n, c0; };\n"
    "extern \"C\" __global__ void __launch_bounds__(256)\n"
    "kiln_cast_f32_bf16_multi(const kiln_cast_job *__restrict__ job, int njob, int64_t nchunk)\n"
    "{\n"
    "    for (int64_t c = blockIdx.x; c < nchunk; c += gridDim.x) {\n"
    "        int lo = 0, hi = njob - 1; /* the last job whose first chunk is <= c */\n"
    "        while (lo < hi) {\n"
    "            const int mid = (lo + hi + 1) >> 1;\n"
    "            if (job[mid].c0 <= c)\n"
    "                lo = mid;\n"
    "            else\n"
    "                hi = mid - 1;\n"
    "        }\n"
    "        const float *__restrict__ x = job[lo].x;\n"
    "        kiln_bf16 *__restrict__ y = job[lo].y;\n"
    "        const int64_t b = (c - job[lo].c0) * 4096;\n"
    "        const int64_t e = job[lo].n < b + 4096 ? job[lo].n : b + 4096;\n"
    "        const bool vec = ((((unsigned long long)x) | ((unsigned long long)y)) & 15) == 0;\n"
    "        for (int64_t i = b + 8 * (int64_t)threadIdx.x; i < e; i += 8 * (int64_t)blockDim.x) {\n"
    "            if (vec && i + 8 <= e) {\n"
    "                const uint4 u = *(const uint4 *)(x + i), w = *(const uint4 *)(x + i + 4);\n"
    "                *(uint4 *)(y + i) = make_uint4(KILN_PK(u.x, u.y), KILN_PK(u.z, u.w),\n"
    "                                               KILN_PK(w.x, w.y), KILN_PK(w.z, w.w));\n"
    "            } else {\n"
    "                for (int k = 0; k < 8; k++) /* no local array: no stack */\n"
    "                    if (i + k < e)\n"
    "                        y[i + k] = kiln_f2bf(x[i + k]);\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "}\n";

/* Whether operand o (0: a, 1: b) of GEMM step st is cast to bf16 (as
 * kc_gemm_form decides: bf16 inputs, the operand stored as f32). */
static bool cast_operand(const CgCudaProgram *q, const CgGemm *m, int o)
{
    DType sa = q->storage[m->a], sb = q->storage[m->b];
    bool bf16_in = q->bf16 || sa == DT_BF16 || sb == DT_BF16;
    return bf16_in && (o ? sb : sa) == DT_F32;
}

/* Which copies are current during the step walk: slotted tensor t's copy
 * is current when stamp[t] == gen; a write to a root clears the stamps of
 * its own slotted tensors (the per-root list head[r], next[t]); a
 * collective makes every copy stale at once (gen + 1). */
typedef struct {
    int *head, *next, *stamp, gen;
    int *since; /* per slotted tensor: the step after the last write to its root */
    int all;    /* the step after the last collective */
} Walk;

static void stale_root(Walk *w, int r, int s)
{
    for (int t = w->head[r]; t >= 0; t = w->next[t]) {
        w->stamp[t] = -1;
        w->since[t] = s + 1;
    }
}

/* One cast of a slotted weight: tensor t, window [lo, hi] (hi: its GEMM). */
typedef struct {
    int t, lo, hi;
} Cast;

static int by_hi(const void *a, const void *b)
{
    const Cast *x = a, *y = b;
    return x->hi != y->hi ? (x->hi > y->hi) - (x->hi < y->hi) : (x->t > y->t) - (x->t < y->t);
}

/* Groups the casts (sorted by hi) into q->cast_group and the group tables. */
static void group_casts(CgCudaProgram *q, Cast *c, int n, const int64_t *slot)
{
    q->cast_first = xmalloc(sizeof(int) * (size_t)(n + 1));
    q->cast_t = xmalloc(sizeof(int) * (size_t)(n + 1));
    q->cast_slot = xmalloc(sizeof(int64_t) * (size_t)(n + 1));
    bool *done = xcalloc((size_t)n + 1, sizeof(bool));
    int k = 0;
    q->ncast_groups = 0;
    for (int i = 0; i < n; i++) {
        if (done[i])
            continue;
        int at = c[i].hi;
        q->cast_group[at] = q->ncast_groups;
        q->cast_first[q->ncast_groups++] = k;
        for (int j = i; j < n; j++)
            if (!done[j] && c[j].lo <= at) {
                done[j] = true;
                q->cast_t[k] = c[j].t;
                q->cast_slot[k++] = slot[c[j].t];
            }
    }
    q->cast_first[q->ncast_groups] = k;
    free(done);
}

void cg_cuda_casts(CgCudaProgram *q)
{
    const CgPlan *p = q->plan;
    const Graph *g = p->g;
    const MemPlan *mem = q->mem;
    int ns = p->steps.n, nt = g->t.n;
    q->cast_off = xmalloc(sizeof(int64_t) * (size_t)(2 * ns + 1));
    q->cast_group = xmalloc(sizeof(int) * (size_t)(ns + 1));
    q->cast_bytes = 0;
    for (int i = 0; i < 2 * ns; i++)
        q->cast_off[i] = -1;
    for (int s = 0; s < ns; s++)
        q->cast_group[s] = -1;
    /* how many GEMM steps cast each persistent tensor */
    int *readers = xcalloc((size_t)nt + 1, sizeof(int));
    for (int s = 0; s < ns; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_GEMM)
            continue;
        for (int o = 0; o < 2; o++) {
            int t = o ? st->gemm.b : st->gemm.a;
            if (q->bf16 && cast_operand(q, &st->gemm, o) && mem->persistent[mem->root[t]] &&
                !(o == 1 && st->gemm.a == st->gemm.b))
                readers[t]++;
        }
    }
    int64_t *slot = xmalloc(sizeof(int64_t) * (size_t)(nt + 1));
    Walk w = {xmalloc(sizeof(int) * (size_t)(nt + 1)), xmalloc(sizeof(int) * (size_t)(nt + 1)),
              xmalloc(sizeof(int) * (size_t)(nt + 1)), 0,
              xcalloc((size_t)nt + 1, sizeof(int)), 0};
    bool *gathered = xcalloc((size_t)nt + 1, sizeof(bool)); /* per root */
    int nslot = 0;
    for (int t = 0; t < nt; t++)
        w.head[t] = -1;
    for (int t = nt - 1; t >= 0; t--) {
        w.stamp[t] = -1;
        if (readers[t] < 2)
            continue;
        w.next[t] = w.head[mem->root[t]];
        w.head[mem->root[t]] = t;
        nslot++;
    }
    for (int t = 0; t < nt; t++) {
        slot[t] = -1;
        if (readers[t] < 2)
            continue;
        slot[t] = q->cast_bytes;
        q->cast_bytes += (shape_numel(&g->t.v[t].s) * 2 + 255) / 256 * 256;
    }
    for (int s = 0; s < ns; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind == CG_STEP_ALLREDUCE_START && st->coll == CG_COLL_ALL_GATHER)
            for (int a = 0; a < st->nargs; a++)
                gathered[mem->root[st->args[a]]] = true;
    }
    /* the step walk: each GEMM that finds its operand's copy stale is the
     * end of one cast's window */
    Cast *cast = xmalloc(sizeof(Cast) * (size_t)(2 * ns + 1));
    int ncast = 0;
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
                if (w.stamp[t] != w.gen) {
                    int lo = gathered[mem->root[t]]   ? s
                             : w.since[t] > w.all ? w.since[t]
                                                  : w.all;
                    cast[ncast++] = (Cast){t, lo, s};
                    w.stamp[t] = w.gen;
                }
            }
            int wr[4] = {m->c, m->d, m->aux, m->bgrad};
            for (int i = 0; i < 4; i++)
                if (wr[i] >= 0)
                    stale_root(&w, mem->root[wr[i]], s);
            break;
        }
        case CG_STEP_KERNEL: {
            const CgKernel *k = p->kernels.v[st->kernel];
            for (int j = 0; j < k->params.n; j++)
                if (k->params.v[j].out)
                    stale_root(&w, mem->root[st->args[j]], s);
            break;
        }
        case CG_STEP_COPY: {
            const CgCudaCopy *c = &q->copy[s];
            for (int t = 0; t < nt; t++) {
                int64_t off = mem->offset[t], end = off + mem->bytes[t];
                if (slot[t] >= 0 && c->dst < end && off < c->dst + c->bytes) {
                    w.stamp[t] = -1;
                    w.since[t] = s + 1;
                }
            }
            break;
        }
        default: /* a collective: every copy stale from the next step */
            w.gen++;
            w.all = s + 1;
            break;
        }
    }
    qsort(cast, (size_t)ncast, sizeof(Cast), by_hi);
    group_casts(q, cast, ncast, slot);
    free(cast);
    free(gathered);
    free(w.head);
    free(w.next);
    free(w.stamp);
    free(w.since);
    free(slot);
    free(readers);
}
