/* gemm_plan.c - the CUDA backend's GEMM and epilogue decisions and its host
 * offset check (gemm_plan.h), shared with the emulated device.
 *
 * Invariants: what this file decides depends only on the program (its
 * storage types and epilogues) and on the epilogues the GEMM library
 * refused, never on device pointers, so the backend and the emulator take
 * the same decisions for one program; a GEMM with an epilogue writes D in
 * the type c, d and aux share (cg_cuda_program only keeps an epilogue where
 * they share it), so falling back to a plain product changes no type. */
#include "gemm_plan.h"

#include <stdio.h>

static bool f32_or_bf16(DType dt) { return dt == DT_F32 || dt == DT_BF16; }

bool kc_gemm_form(const CgCudaProgram *q, int s, CgEpilogue e, KcGemmForm *f, char *why,
                  size_t n)
{
    const CgStep *st = &q->plan->steps.v[s];
    const CgGemm *m = &st->gemm;
    DType sa = q->storage[m->a], sb = q->storage[m->b], sc = q->storage[m->c];
    *f = (KcGemmForm){.out = m->c, .bias = -1, .bgrad = -1, .aux = -1};
    if (!f32_or_bf16(sa) || !f32_or_bf16(sb) || !f32_or_bf16(sc)) {
        snprintf(why, n, "gemm of op %d: only f32 and bf16 matrices are supported", st->op);
        return false;
    }
    f->bf16_in = q->bf16 || sa == DT_BF16 || sb == DT_BF16;
    f->cast_a = f->bf16_in && sa != DT_BF16;
    f->cast_b = f->bf16_in && sb != DT_BF16;
    bool writes_d = e == CG_EPI_BIAS || e == CG_EPI_GELU_BIAS || e == CG_EPI_GELU_AUX_BIAS ||
                    e == CG_EPI_DGELU || e == CG_EPI_DGELU_BGRAD;
    if (writes_d)
        f->out = m->d;
    /* D's type: with an epilogue the type c, d and aux share */
    f->out_bf16 = q->storage[e != CG_EPI_NONE && m->d >= 0 ? m->d : f->out] == DT_BF16;
    if (e == CG_EPI_NONE)
        return true;
    if (m->bias >= 0 && e != CG_EPI_DGELU && e != CG_EPI_DGELU_BGRAD) {
        f->bias = m->bias;
        f->bias16 = f->out_bf16;
    }
    if (cg_epilogue_has_bgrad(e))
        f->bgrad = m->bgrad;
    f->aux = m->aux;
    return true;
}

int kc_gemm_settle(const CgPlan *p, CgEpilogue *epi, bool *skip)
{
    cg_cuda_pair_epilogues(p, epi);
    int n = 0;
    for (int s = 0; s < p->steps.n; s++) {
        skip[s] = cg_cuda_step_replaced(p, epi, s);
        n += epi[s] != CG_EPI_NONE;
    }
    return n;
}

int64_t kc_host_offset(const CgCudaProgram *q, int64_t off, int64_t bytes, char *why, size_t n)
{
    int64_t o = cg_cuda_host_offset(q, off, bytes);
    if (o < 0)
        snprintf(why, n,
                 "host access to [%lld, +%lld) of the plan's arena: not a param, input, state or "
                 "graph output",
                 (long long)off, (long long)bytes);
    return o;
}
