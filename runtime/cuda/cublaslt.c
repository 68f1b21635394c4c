/* cublaslt.c - the CUDA module's GEMMs through cuBLASLt (cuda_module.h):
 * one handle and one workspace per backend, a cache of planned GEMMs (the
 * matmul descriptor, the three layouts and the heuristic's algorithm per
 * distinct shape, types, alignment and epilogue), and the matmul calls.
 *
 * kiln's row-major C[M,N] = op(A) op(B) is cuBLASLt's column-major
 * C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's A is kiln's B and its B kiln's A,
 * so kiln's BGRAD_B (op(B) summed over K) is cuBLASLt's BGRADA. What a GEMM
 * reads and writes, in which types, and which epilogue it applies is
 * decided before (gemm_plan.c); this file only states it to cuBLASLt.
 * Every cuBLASLt call is checked by LT(), which names the call, file and
 * line. */
#include "cuda_module.h"

#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WORKSPACE_BYTES = 32 << 20 };

typedef struct {
    /* key */
    cudaDataType_t at, bt, ct;
    cublasComputeType_t comp;
    bool ta, tb;
    int64_t batch, M, N, K, lda, ldb, ldc, sa, sb, sc;
    uint32_t align[3]; /* bytes: kiln's A, B, C pointers */
    uint32_t epi;      /* cublasLtEpilogue_t; 0: none */
    CUdeviceptr bias, aux;
    int64_t auxld;
    /* value */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (kiln's B), B (kiln's A), C */
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

struct KcLt {
    cublasLtHandle_t h;
    CUdeviceptr ws;
    bool tf32, verbose;
    GemmPlan *gemms;
    int ngemms;
};

static bool lt_fail(cublasStatus_t r, const char *call, const char *file, int line, Diag *d)
{
    if (d)
        kc_dmsg(d, "%s:%d: %s failed: cuBLAS status %d", file, line, call, (int)r);
    else
        kc_fatal("%s:%d: %s failed: cuBLAS status %d", file, line, call, (int)r);
    return false;
}

/* A checked cuBLASLt call: true on success; on failure sets d (when not
 * NULL) or stops the process, naming the call, file and line. */
#define LT(call, d) \
    ((r_lt = (call)) == CUBLAS_STATUS_SUCCESS || lt_fail(r_lt, #call, __FILE__, __LINE__, (d)))
static _Thread_local cublasStatus_t r_lt;

KcLt *kc_lt_create(bool tf32, bool verbose, Diag *d)
{
    KcLt *lt = kc_zalloc(sizeof *lt);
    lt->tf32 = tf32;
    lt->verbose = verbose;
    if (!LT(cublasLtCreate(&lt->h), d) || !CU(kc_cu.cuMemAlloc(&lt->ws, WORKSPACE_BYTES), d)) {
        kc_lt_destroy(lt);
        return NULL;
    }
    return lt;
}

void kc_lt_destroy(KcLt *lt)
{
    if (!lt)
        return;
    for (int i = 0; i < lt->ngemms; i++) {
        cublasLtMatmulDescDestroy(lt->gemms[i].op);
        cublasLtMatrixLayoutDestroy(lt->gemms[i].la);
        cublasLtMatrixLayoutDestroy(lt->gemms[i].lb);
        cublasLtMatrixLayoutDestroy(lt->gemms[i].lc);
    }
    if (lt->h)
        cublasLtDestroy(lt->h);
    if (lt->ws)
        kc_cu.cuMemFree(lt->ws);
    free(lt->gemms);
    free(lt);
}

/* Largest power of two (at most 256) dividing the address. */
static uint32_t align_of(CUdeviceptr p)
{
    uint32_t a = 256;
    while (a > 1 && p % a)
        a /= 2;
    return a;
}

/* The cuBLASLt epilogue of e (see CgEpilogue); 0 for none. */
static uint32_t lt_epilogue(CgEpilogue e)
{
    switch (e) {
    case CG_EPI_NONE:
    case CG_EPI__COUNT: return 0;
    case CG_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case CG_EPI_GELU_BIAS: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case CG_EPI_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case CG_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case CG_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case CG_EPI_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB;
    case CG_EPI_BGRAD_B: return CUBLASLT_EPILOGUE_BGRADA;
    }
    return 0;
}

int kc_lt_plan(KcLt *lt, const CgGemm *m, const KcGemmForm *f, CgEpilogue e, CUdeviceptr pa,
               CUdeviceptr pb, CUdeviceptr pc, CUdeviceptr bias, CUdeviceptr aux, Diag *d)
{
    cudaDataType_t at = f->bf16_in ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType_t ct = f->out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    GemmPlan k;
    memset(&k, 0, sizeof k);
    k.at = k.bt = at;
    k.ct = ct;
    k.comp = at == CUDA_R_16BF ? CUBLAS_COMPUTE_32F
             : lt->tf32        ? CUBLAS_COMPUTE_32F_FAST_TF32
                               : CUBLAS_COMPUTE_32F;
    k.ta = m->ta;
    k.tb = m->tb;
    k.batch = m->batch;
    k.M = m->M;
    k.N = m->N;
    k.K = m->K;
    k.lda = m->lda;
    k.ldb = m->ldb;
    k.ldc = m->ldc;
    k.sa = m->sa;
    k.sb = m->sb;
    k.sc = m->sc;
    if (m->sb == 0)
        k.batch = 1;
    k.align[0] = align_of(pa);
    k.align[1] = align_of(pb);
    k.align[2] = align_of(pc);
    if (e != CG_EPI_NONE) {
        k.epi = lt_epilogue(e);
        k.bias = bias;
        k.aux = aux;
        k.auxld = aux ? m->ldc : 0;
    }
    if (m->batch > 1) { /* every batch's matrices are as aligned as their strides allow */
        int es = at == CUDA_R_16BF ? 2 : 4, cs = ct == CUDA_R_16BF ? 2 : 4;
        uint32_t s0 = align_of((CUdeviceptr)(m->sa * es)), s1 = align_of((CUdeviceptr)(m->sb * es)),
                 s2 = align_of((CUdeviceptr)(m->sc * cs));
        k.align[0] = k.align[0] < s0 ? k.align[0] : s0;
        k.align[1] = k.align[1] < s1 ? k.align[1] : s1;
        k.align[2] = k.align[2] < s2 ? k.align[2] : s2;
    }
    size_t keyn = offsetof(GemmPlan, op);
    for (int i = 0; i < lt->ngemms; i++)
        if (memcmp(&lt->gemms[i], &k, keyn) == 0)
            return i;
    /* row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T */
    cublasOperation_t opa = m->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = m->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!LT(cublasLtMatmulDescCreate(&k.op, k.comp, CUDA_R_32F), d) ||
        !LT(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
            d) ||
        !LT(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
            d))
        return -1;
    if (k.epi) {
        /* kiln's vectors along C's last dim (N) are per-row vectors of the
         * column-major C^T[N,M] (cuBLASLt's bias has D's row count; batch
         * stride 0: one bias for all), in D's type */
        uint32_t epi = k.epi;
        int32_t bt = (int32_t)ct; /* bias and bias-gradient vectors have D's type */
        const void *bp = (const void *)k.bias, *xp = (const void *)k.aux;
        if (!LT(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                               sizeof epi),
                d))
            return -1;
        if (k.bias && (!LT(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                          &bp, sizeof bp),
                           d) ||
                       !LT(cublasLtMatmulDescSetAttribute(
                               k.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
                           d)))
            return -1;
        if (k.aux &&
            (!LT(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &xp, sizeof xp),
                 d) ||
             !LT(cublasLtMatmulDescSetAttribute(k.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &k.auxld, sizeof k.auxld),
                 d)))
            return -1;
    }
    uint64_t ar = m->tb ? (uint64_t)m->K : (uint64_t)m->N, ac = m->tb ? m->N : m->K;
    uint64_t br = m->ta ? (uint64_t)m->M : (uint64_t)m->K, bc = m->ta ? m->K : m->M;
    if (!LT(cublasLtMatrixLayoutCreate(&k.la, at, ar, ac, m->ldb), d) ||
        !LT(cublasLtMatrixLayoutCreate(&k.lb, at, br, bc, m->lda), d) ||
        !LT(cublasLtMatrixLayoutCreate(&k.lc, ct, (uint64_t)m->N, (uint64_t)m->M, m->ldc), d))
        return -1;
    if (k.batch > 1) {
        int32_t bn = (int32_t)k.batch;
        int64_t s[3] = {m->sb, m->sa, m->sc};
        cublasLtMatrixLayout_t l[3] = {k.la, k.lb, k.lc};
        for (int i = 0; i < 3; i++)
            if (!LT(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bn,
                                                     sizeof bn),
                    d) ||
                !LT(cublasLtMatrixLayoutSetAttribute(
                        l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s[i], sizeof s[i]),
                    d))
                return -1;
    }
    cublasLtMatmulPreference_t pref;
    uint64_t wsb = WORKSPACE_BYTES;
    if (!LT(cublasLtMatmulPreferenceCreate(&pref), d))
        return -1;
    /* cuBLASLt's A is kiln's B and its B kiln's A */
    if (!LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &wsb, sizeof wsb),
            d) ||
        !LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &k.align[1], sizeof k.align[1]),
            d) ||
        !LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &k.align[0], sizeof k.align[0]),
            d) ||
        !LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &k.align[2], sizeof k.align[2]),
            d) ||
        !LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                 &k.align[2], sizeof k.align[2]),
            d)) {
        cublasLtMatmulPreferenceDestroy(pref);
        return -1;
    }
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt->h, k.op, k.la, k.lb, k.lc, k.lc, pref,
                                                       1, &res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (k.epi && (hs != CUBLAS_STATUS_SUCCESS || nres < 1)) {
        /* no algorithm for this epilogue (NOT_SUPPORTED or none): the
         * caller falls back to the planned kernels */
        cublasLtMatmulDescDestroy(k.op);
        cublasLtMatrixLayoutDestroy(k.la);
        cublasLtMatrixLayoutDestroy(k.lb);
        cublasLtMatrixLayoutDestroy(k.lc);
        if (lt->verbose)
            fprintf(stderr,
                    "kiln: cuda: no cuBLASLt algorithm for epilogue %u on a %lldx%lldx%lld GEMM; "
                    "it runs without\n",
                    (unsigned)k.epi, (long long)m->M, (long long)m->N, (long long)m->K);
        return -2;
    }
    if (hs != CUBLAS_STATUS_SUCCESS) {
        lt_fail(hs, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__, d);
        return -1;
    }
    if (nres < 1) {
        kc_dmsg(d, "cuBLASLt has no algorithm for a %lldx%lldx%lld GEMM (batch %lld, ta %d, tb %d)",
                (long long)m->M, (long long)m->N, (long long)m->K, (long long)m->batch, m->ta,
                m->tb);
        return -1;
    }
    k.algo = res.algo;
    GemmPlan *ng = realloc(lt->gemms, sizeof(GemmPlan) * (size_t)(lt->ngemms + 1));
    if (!ng)
        kc_fatal("out of memory");
    lt->gemms = ng;
    lt->gemms[lt->ngemms] = k;
    return lt->ngemms++;
}

bool kc_lt_run(KcLt *lt, int plan, const CgGemm *m, CUdeviceptr a, CUdeviceptr b,
               CUdeviceptr out, CUstream s, Diag *d)
{
    const GemmPlan *k = &lt->gemms[plan];
    const float one = 1.0f, zero = 0.0f;
    /* a batch sharing B runs as one product per batch (k->batch is 1) */
    int64_t nb = k->batch == m->batch ? 1 : m->batch;
    int64_t ea = k->at == CUDA_R_16BF ? 2 : 4, ec = k->ct == CUDA_R_16BF ? 2 : 4;
    for (int64_t i = 0; i < nb; i++) {
        CUdeviceptr pa = a + (CUdeviceptr)(i * m->sa * ea);
        CUdeviceptr pc = out + (CUdeviceptr)(i * m->sc * ec);
        if (!LT(cublasLtMatmul(lt->h, k->op, &one, (const void *)b, k->la, (const void *)pa,
                               k->lb, &zero, (void *)pc, k->lc, (void *)pc, k->lc, &k->algo,
                               (void *)lt->ws, WORKSPACE_BYTES, (cudaStream_t)s),
                d))
            return false;
    }
    return true;
}
