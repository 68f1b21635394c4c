/* cpu_work.c - how the CPU backend splits a step over its threads, shared
 * by the backend (runtime/cpu/backend_cpu.c) and the cost model
 * (predict.c): a kernel's work estimate, which decides whether its parts
 * run on the pool, and a GEMM's parts, a function of its shape alone. */
#include "codegen.h"

/* Rough cost of computing one element of a phase: its bound expressions,
 * a call-like one (exp, tanh, ...: about 20 vector instructions in the
 * prelude) as 16, a division or square root as 4, anything else as 1. */
static int64_t phase_cost(const CgKernel *k, const CgPhase *ph)
{
    int64_t c = 1;
    for (int i = 0; i < ph->lets.n; i++) {
        const CgExpr *e = &k->ex.v[ph->lets.v[i]];
        if (e->kind == CGX_RAND) {
            c += 16;
            continue;
        }
        if (e->kind != CGX_OP) {
            c += 1;
            continue;
        }
        switch (e->op) {
        case CG_EXP: case CG_LOG: case CG_SIN: case CG_COS: case CG_TANH: case CG_SIGMOID:
        case CG_POW: case CG_ERF:
            c += 16;
            break;
        case CG_DIV: case CG_SQRT: case CG_RSQRT:
            c += 4;
            break;
        default:
            c += 1;
        }
    }
    return c;
}

/* Element-operations of a call: per loop, its outer extent times the sum
 * over phases of inner extent x phase_cost. */
int64_t cg_kernel_work(const CgKernel *k)
{
    if (k->attn.kind != CG_ATTN_NONE)
        return cg_attn_work(&k->attn);
    int64_t w = 0;
    for (int i = 0; i < k->loops.n; i++) {
        const CgLoop *l = &k->loops.v[i];
        int64_t outer = 1, inner = 0;
        for (int d = 0; d < l->ndim; d++)
            outer *= l->dim[d].n;
        for (int p = 0; p < l->ph.n; p++) {
            int64_t x = 1;
            for (int d = 0; d < l->ph.v[p].ndim; d++)
                x *= l->ph.v[p].dim[d].n;
            inner += x * phase_cost(k, &l->ph.v[p]);
        }
        w += outer * (inner ? inner : 1);
    }
    return w;
}

/* A GEMM's parts. Part p of n is whole batch entries when there are n or
 * more of them, else a band of rows or columns (the longer side) in
 * multiples of 16; each is one single-threaded OpenBLAS call over the whole
 * K. n is a function of the shape alone, never of the thread count: the
 * threads only choose which parts they run, so every call, and every
 * result bit, is the same for any --threads. (Splitting by the thread
 * count changed results: OpenBLAS picks its kernel, and with it the order
 * of the sum over K, by the call's M, N and K; 0.3.21 on AVX-512 sums small
 * A x B^T products in another order than large ones.) n is 1 below
 * CG_MIN_GEMM_FLOPS, else the power of two at or below one part per
 * CG_GEMM_PART_FLOPS, at least 2 and at most CG_GEMM_MAX_PARTS (powers of two
 * share evenly among 2, 4, 8 .. threads). With fewer batch entries than
 * that, the parts are bands: halved until there is at most one per
 * CG_GEMM_MIN_BAND of the longer side (but 2 where it is shorter than two
 * bands) and one per 16-wide unit, and never fewer than the batch
 * entries. */
int cg_gemm_parts(const CgGemm *m)
{
    double fl = 2.0 * (double)m->batch * (double)m->M * (double)m->N * (double)m->K;
    if (fl < CG_MIN_GEMM_FLOPS)
        return 1;
    int n = 2;
    while (n < CG_GEMM_MAX_PARTS && fl >= 2.0 * n * CG_GEMM_PART_FLOPS)
        n *= 2;
    if (m->batch >= n)
        return n;
    /* bands: at most one per CG_GEMM_MIN_BAND of the longer side (at least
     * 2), and one per 16-wide unit */
    int64_t len = m->M >= m->N ? m->M : m->N, units = (len + 15) / 16;
    int64_t bands = len / CG_GEMM_MIN_BAND;
    if (bands < 2)
        bands = 2;
    if (bands > units)
        bands = units;
    while (n > 1 && n > bands && n > m->batch)
        n /= 2;
    if (n < m->batch) /* never fewer parts than batch entries allow */
        n = (int)m->batch;
    return n;
}

/* Part p of n (cg_gemm_parts): whole batch entries when there are n or
 * more of them, else a band of rows or columns (the longer side) in
 * multiples of 16. */
void cg_gemm_part(const CgGemm *m, int n, int p, int64_t *b0, int64_t *b1, int64_t *m0,
                  int64_t *m1, int64_t *n0, int64_t *n1)
{
    *b0 = 0, *b1 = m->batch, *m0 = 0, *m1 = m->M, *n0 = 0, *n1 = m->N;
    if (m->batch >= n) {
        *b0 = m->batch * p / n;
        *b1 = m->batch * (p + 1) / n;
        return;
    }
    bool rows = m->M >= m->N;
    int64_t len = rows ? m->M : m->N, units = (len + 15) / 16;
    int64_t lo = units * p / n * 16, hi = units * (p + 1) / n * 16;
    if (hi > len)
        hi = len;
    if (rows)
        *m0 = lo, *m1 = hi;
    else
        *n0 = lo, *n1 = hi;
}
