/* backend_cuda.c - the CUDA backend, built as the shared module
 * libkiln_cuda.so and loaded by device.c with dlopen.
 *
 * Kernels: the plan's CUDA program (printed by kiln through RtCudaHost)
 * compiled by NVRTC for the device's own architecture, cubins cached on disk,
 * loaded and launched through the driver API. The driver (libcuda.so.1) is
 * itself opened with dlopen, so this module loads, and its NVRTC path works,
 * on machines without a driver. GEMMs: cuBLASLt (row-major products as
 * column-major ones with the operands swapped; algorithm from the library's
 * heuristic, cached per shape; one workspace). Memory: one device
 * allocation holds the arena (plus 16 bytes for {seed, step}); host writes
 * go through a pinned staging buffer as asynchronous copies on the compute
 * stream, so preparing the next batch overlaps the step. A second
 * (communication) stream and events exist for collectives.
 *
 * Every driver and cuBLASLt call goes through a checking macro that names
 * the call, the file and the line. NVRTC and the cubin cache are in
 * cuda_nvrtc.c; the module's shared helpers in cuda_module.c.
 *
 * This module links nothing of kilncore: what it needs from kiln comes
 * through RtCudaHost; codegen.h and runtime.h are read for types only. */
#include "codegen.h"
#include "runtime.h"
#include "cuda_module.h"
#include "cuda_nccl.h"

#include <cublasLt.h>
#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the driver API, opened with dlopen ------------------------------------ */

/* Symbols by the names cuda.h maps them to (cuMemAlloc -> cuMemAlloc_v2). */
#define STR_(x) #x
#define STR(x) STR_(x)
/* clang-format off */
#define CU_FUNCS(X)                                                            \
    X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDriverGetVersion)      \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute)                 \
    X(cuDeviceGetName) X(cuDeviceTotalMem)                                     \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent)\
    X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemFreeHost)              \
    X(cuMemsetD8Async) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)               \
    X(cuMemcpyDtoDAsync)                                                       \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                \
    X(cuStreamWaitEvent) X(cuStreamBeginCapture) X(cuStreamEndCapture)         \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)  \
    X(cuEventElapsedTime)                                                      \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)               \
    X(cuLaunchKernel)                                                          \
    X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)               \
    X(cuGraphDestroy)
/* clang-format on */

static struct {
#define X(f) __typeof__(&f) f;
    CU_FUNCS(X)
#undef X
} cu;
static void *cu_lib;
static char cu_why[512]; /* why the driver cannot be used ("" when it can) */

/* Opens libcuda.so.1 and initialises it once; false with cu_why set. */
static bool cu_open(void)
{
    static bool tried;
    if (tried)
        return cu_lib != NULL;
    tried = true;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cu_why, sizeof cu_why, "no CUDA driver on this machine (%s)", dlerror());
        return false;
    }
#define X(f)                                                                           \
    if (!(*(void **)&cu.f = dlsym(h, STR(f)))) {                                       \
        snprintf(cu_why, sizeof cu_why, "the CUDA driver lacks %s (driver too old?)", \
                 STR(f));                                                              \
        dlclose(h);                                                                    \
        return false;                                                                  \
    }
    CU_FUNCS(X)
#undef X
    CUresult r = cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        cu.cuGetErrorString(r, &s);
        snprintf(cu_why, sizeof cu_why, "the CUDA driver failed to initialise (%s)",
                 s ? s : "unknown error");
        dlclose(h);
        return false;
    }
    cu_lib = h;
    return true;
}

static bool cu_fail(CUresult r, const char *call, const char *file, int line, Diag *d)
{
    const char *name = NULL, *s = NULL;
    if (cu_lib) {
        cu.cuGetErrorName(r, &name);
        cu.cuGetErrorString(r, &s);
    }
    if (d)
        kc_dmsg(d, "%s:%d: %s failed: %s (%s)", file, line, call, name ? name : "?", s ? s : "?");
    else
        kc_fatal("%s:%d: %s failed: %s (%s)", file, line, call, name ? name : "?", s ? s : "?");
    return false;
}

static bool lt_fail(cublasStatus_t r, const char *call, const char *file, int line, Diag *d)
{
    if (d)
        kc_dmsg(d, "%s:%d: %s failed: cuBLAS status %d", file, line, call, (int)r);
    else
        kc_fatal("%s:%d: %s failed: cuBLAS status %d", file, line, call, (int)r);
    return false;
}

/* Checked calls: CU and LT evaluate to true on success; on failure they set
 * d (when not NULL) or stop the process, naming the call, file and line. */
#define CU(call, d) \
    ((r_cu = (call)) == CUDA_SUCCESS || cu_fail(r_cu, #call, __FILE__, __LINE__, (d)))
#define LT(call, d) \
    ((r_lt = (call)) == CUBLAS_STATUS_SUCCESS || lt_fail(r_lt, #call, __FILE__, __LINE__, (d)))
static _Thread_local CUresult r_cu;
static _Thread_local cublasStatus_t r_lt;

/* ---- the backend ------------------------------------------------------------ */

static const RtCudaHost *host;

enum { WORKSPACE_BYTES = 32 << 20, STAGE_BYTES = 16 << 20 };

typedef struct {
    /* key */
    cudaDataType_t at, bt, ct;
    cublasComputeType_t comp;
    bool ta, tb;
    int64_t batch, M, N, K, lda, ldb, ldc, sa, sb, sc;
    uint32_t align[3]; /* bytes: kiln's A, B, C pointers */
    uint32_t epi;      /* cublasLtEpilogue_t; 0: none (see GemmEpi) */
    CUdeviceptr bias, aux;
    int64_t auxld;
    /* value */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (kiln's B), B (kiln's A), C */
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

/* A cuBLASLt epilogue as set on the matmul descriptor: bias is the bias
 * (read) or the bias gradient (written), aux the GELU input matrix (written
 * by GELU_AUX_BIAS, read by DGELU*) with leading dimension auxld. */
typedef struct {
    uint32_t epi;
    CUdeviceptr bias, aux;
    int64_t auxld;
} GemmEpi;

typedef struct {
    CUfunction *fn;     /* the step's functions, in order */
    const CgCudaFn *geo;
    int nfn;
    void ***argv;       /* per function: &ptr[param[j]]..., [&rs] (CgCudaFn) */
    CUdeviceptr *ptr;
    int gemm;           /* GEMM steps: index in gemms */
    bool cast_a, cast_b; /* bf16: f32 operand cast into scratch first */
    cudaDataType_t at, ct; /* GEMM: operand and D types as planned */
    CUdeviceptr bias16;  /* GEMM with a bias epilogue and bf16 D: the bias's bf16 copy,
                            cast from the f32 bias right before the GEMM */
    CUdeviceptr a, b, c; /* GEMM operands as used (c: cuBLASLt's D, the epilogue's d
                            when it writes one) */
    bool epi;            /* GEMM: applies an epilogue (BackendCtx.epi) */
    bool skip;           /* kernel: computed by an applied epilogue (CgStep.by_epilogue) */
    char label[96];      /* NVTX range: the step's kernel name, or the GEMM's shape */
} CuStep;

struct BackendCtx {
    const CgPlan *p;
    struct CgCudaProgram *q;
    CUdevice dev;
    CUcontext ctx;
    bool ctx_held;
    char arch[16];
    CUstream s, comm;        /* compute, communication */
    CUevent comm_ready, rs_done;
    CUevent ev_begin, ev_end; /* around a run (timing) */
    CUevent *ev_step;        /* profile: after each plan step */
    double host_begin;       /* CLOCK_MONOTONIC when the last run began */
    bool ran;                /* ev_begin and ev_end recorded */
    struct KcComm *nccl;     /* device collectives (cuda_nccl.c) */
    CUdeviceptr arena, rs, scratch;
    int64_t scratch_half;    /* bytes of each of the two bf16 operand areas */
    CUdeviceptr bias16;      /* bf16 copies of biases (CuStep.bias16) */
    CgEpilogue *epi;         /* per step: the epilogue its GEMM applies: the
                                program's (CgCudaProgram.epi) unless cuBLASLt
                                has no algorithm for it (then its pair's too) */
    unsigned char *stage;    /* pinned host staging */
    size_t stage_cap, stage_used;
    uint64_t *rs_host;       /* pinned {seed, step} */
    CUmodule mod;
    CUfunction *fns, cast_fn;
    CuStep *st;
    cublasLtHandle_t lt;
    CUdeviceptr ws;
    GemmPlan *gemms;
    int ngemms;
    bool tf32, bf16, graph_on, capturing, replaying;
    bool warm;               /* a run has completed: the next may be captured */
    CUgraph graph;
    CUgraphExec gexec;
    bool verbose;
};

static bool create_timing(BackendCtx *c, bool profile, Diag *d);
static void destroy_timing(BackendCtx *c);
static bool run_begins(BackendCtx *c, Diag *d);
static bool step_done(BackendCtx *c, int s, Diag *d);

/* Every host wait on the device. With NCCL all-reduces in the step they poll
 * and are bounded (kc_wait_stream: a hung peer stops every rank with a
 * message); without, they block. */
static CUresult wait_stream(BackendCtx *c, CUstream s)
{
    return c->nccl ? kc_wait_stream(c->nccl, s) : cu.cuStreamSynchronize(s);
}

static CUresult wait_event(BackendCtx *c, CUevent e)
{
    return c->nccl ? kc_wait_event(c->nccl, e) : cu.cuEventSynchronize(e);
}

static void cuda_destroy(BackendCtx *c)
{
    if (!c)
        return;
    if (c->ctx_held) {
        cu.cuCtxSetCurrent(c->ctx);
        if (c->capturing) { /* a step failed inside the capture: end it first */
            CUgraph g = NULL;
            cu.cuStreamEndCapture(c->s, &g);
            if (g)
                cu.cuGraphDestroy(g);
            c->capturing = false;
        }
        if (c->s)
            wait_stream(c, c->s);
        destroy_timing(c); /* NCCL first: it waits for the communication stream */
        if (c->gexec)
            cu.cuGraphExecDestroy(c->gexec);
        if (c->graph)
            cu.cuGraphDestroy(c->graph);
        for (int i = 0; i < c->ngemms; i++) {
            cublasLtMatmulDescDestroy(c->gemms[i].op);
            cublasLtMatrixLayoutDestroy(c->gemms[i].la);
            cublasLtMatrixLayoutDestroy(c->gemms[i].lb);
            cublasLtMatrixLayoutDestroy(c->gemms[i].lc);
        }
        if (c->lt)
            cublasLtDestroy(c->lt);
        if (c->mod)
            cu.cuModuleUnload(c->mod);
        if (c->arena)
            cu.cuMemFree(c->arena);
        if (c->ws)
            cu.cuMemFree(c->ws);
        if (c->scratch)
            cu.cuMemFree(c->scratch);
        if (c->bias16)
            cu.cuMemFree(c->bias16);
        if (c->stage)
            cu.cuMemFreeHost(c->stage);
        if (c->rs_host)
            cu.cuMemFreeHost(c->rs_host);
        CUevent ev[] = {c->comm_ready, c->rs_done};
        for (int i = 0; i < 2; i++)
            if (ev[i])
                cu.cuEventDestroy(ev[i]);
        if (c->s)
            cu.cuStreamDestroy(c->s);
        if (c->comm)
            cu.cuStreamDestroy(c->comm);
        cu.cuDevicePrimaryCtxRelease(c->dev);
    }
    if (c->st)
        for (int i = 0; i < c->p->steps.n; i++) {
            free(c->st[i].fn);
            for (int f = 0; c->st[i].argv && f < c->st[i].nfn; f++)
                free(c->st[i].argv[f]);
            free(c->st[i].argv);
            free(c->st[i].ptr);
        }
    free(c->st);
    free(c->epi);
    free(c->fns);
    free(c->gemms);
    if (c->q)
        host->program_free(c->q);
    free(c);
}

static CUdeviceptr dptr(const BackendCtx *c, int tensor)
{
    return c->arena + (CUdeviceptr)c->q->mem->offset[tensor];
}

static int64_t numel(const Graph *g, int t)
{
    const Shape *s = &g->t.v[t].s;
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++)
        n *= s->dim[i];
    return n;
}

/* Sets up (or finds) the cuBLASLt plan of GEMM step s. */
/* Largest power of two (at most 256) dividing the address. */
static uint32_t align_of(CUdeviceptr p)
{
    uint32_t a = 256;
    while (a > 1 && p % a)
        a /= 2;
    return a;
}

/* Sets up (or finds) the cuBLASLt plan of a GEMM whose operands sit at
 * pa, pb, pc, with epilogue e (NULL: none). A batch sharing B (sb = 0) runs
 * as `batch` products of one (see run_gemm). Returns -2 (d untouched) when
 * the heuristic has no algorithm for an epilogue GEMM: the caller runs it
 * without its epilogue. */
static int gemm_plan(BackendCtx *c, const CgGemm *m, cudaDataType_t at, cudaDataType_t ct,
                     CUdeviceptr pa, CUdeviceptr pb, CUdeviceptr pc, const GemmEpi *e, Diag *d)
{
    GemmPlan k;
    memset(&k, 0, sizeof k);
    k.at = k.bt = at;
    k.ct = ct;
    k.comp = at == CUDA_R_16BF ? CUBLAS_COMPUTE_32F
             : c->tf32         ? CUBLAS_COMPUTE_32F_FAST_TF32
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
    if (e && e->epi) {
        k.epi = e->epi;
        k.bias = e->bias;
        k.aux = e->aux;
        k.auxld = e->auxld;
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
    for (int i = 0; i < c->ngemms; i++)
        if (memcmp(&c->gemms[i], &k, keyn) == 0)
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
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, k.op, k.la, k.lb, k.lc, k.lc, pref,
                                                       1, &res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (k.epi && (hs != CUBLAS_STATUS_SUCCESS || nres < 1)) {
        /* no algorithm for this epilogue (NOT_SUPPORTED or none): the
         * caller falls back to the planned kernels */
        cublasLtMatmulDescDestroy(k.op);
        cublasLtMatrixLayoutDestroy(k.la);
        cublasLtMatrixLayoutDestroy(k.lb);
        cublasLtMatrixLayoutDestroy(k.lc);
        if (c->verbose)
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
    GemmPlan *ng = realloc(c->gemms, sizeof(GemmPlan) * (size_t)(c->ngemms + 1));
    if (!ng)
        kc_fatal("out of memory");
    c->gemms = ng;
    c->gemms[c->ngemms] = k;
    return c->ngemms++;
}

/* The cuBLASLt form of epilogue e on GEMM step st (see CgEpilogue): kiln's
 * BGRAD_B (op(B) summed over K) is cuBLASLt's BGRADA, since cuBLASLt's A is
 * kiln's B. The bias is read from cs->bias16 when D is bf16 (cuBLASLt's bias
 * has D's type). */
static void epi_form(const BackendCtx *c, const CgStep *st, const CuStep *cs, CgEpilogue e,
                     GemmEpi *f)
{
    const CgGemm *m = &st->gemm;
    memset(f, 0, sizeof *f);
    switch (e) {
    case CG_EPI_NONE:
    case CG_EPI__COUNT: return;
    case CG_EPI_BIAS: f->epi = CUBLASLT_EPILOGUE_BIAS; break;
    case CG_EPI_GELU_BIAS: f->epi = CUBLASLT_EPILOGUE_GELU_BIAS; break;
    case CG_EPI_GELU_AUX_BIAS: f->epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
    case CG_EPI_DGELU: f->epi = CUBLASLT_EPILOGUE_DGELU; break;
    case CG_EPI_DGELU_BGRAD: f->epi = CUBLASLT_EPILOGUE_DGELU_BGRAD; break;
    case CG_EPI_BGRAD_A: f->epi = CUBLASLT_EPILOGUE_BGRADB; break;
    case CG_EPI_BGRAD_B: f->epi = CUBLASLT_EPILOGUE_BGRADA; break;
    }
    if (m->bias >= 0 && e != CG_EPI_DGELU && e != CG_EPI_DGELU_BGRAD)
        f->bias = cs->bias16 ? cs->bias16 : dptr(c, m->bias);
    if (cg_epilogue_has_bgrad(e))
        f->bias = dptr(c, m->bgrad);
    if (m->aux >= 0) {
        f->aux = dptr(c, m->aux);
        f->auxld = m->ldc;
    }
}

/* Plans GEMM step s with epilogue e (CG_EPI_NONE: plain); -2 when cuBLASLt
 * has no algorithm for the epilogue. */
static int plan_step_gemm(BackendCtx *c, int s, CgEpilogue e, Diag *d)
{
    const CgStep *st = &c->p->steps.v[s];
    const CgGemm *m = &st->gemm;
    CuStep *cs = &c->st[s];
    bool writes_d = e == CG_EPI_BIAS || e == CG_EPI_GELU_BIAS || e == CG_EPI_GELU_AUX_BIAS ||
                    e == CG_EPI_DGELU || e == CG_EPI_DGELU_BGRAD;
    cs->c = dptr(c, writes_d ? m->d : m->c);
    GemmEpi f;
    epi_form(c, st, cs, e, &f);
    return gemm_plan(c, m, cs->at, cs->ct, cs->a, cs->b, cs->c, e != CG_EPI_NONE ? &f : NULL, d);
}

static bool setup_steps(BackendCtx *c, Diag *d)
{
    const CgPlan *p = c->p;
    const struct CgCudaProgram *q = c->q;
    const Graph *g = p->g;
    c->st = kc_zalloc(sizeof(CuStep) * (size_t)(p->steps.n + 1));
    c->epi = kc_zalloc(sizeof(CgEpilogue) * (size_t)(p->steps.n + 1));
    int64_t need = 0, bias16 = 0;
    for (int s = 0; s < p->steps.n; s++) {
        const CgGemm *m = &p->steps.v[s].gemm;
        if (p->steps.v[s].kind == CG_STEP_GEMM && q->epi[s] != CG_EPI_NONE && m->bias >= 0 &&
            q->storage[m->d >= 0 ? m->d : m->c] == DT_BF16)
            bias16 += (m->N * 2 + 255) / 256 * 256;
    }
    if (bias16 > 0 && !CU(cu.cuMemAlloc(&c->bias16, (size_t)bias16), d))
        return false;
    bias16 = 0;
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        CuStep *cs = &c->st[s];
        cs->gemm = -1;
        snprintf(cs->label, sizeof cs->label, "%s", st->name ? st->name : "step");
        if (st->kind == CG_STEP_GEMM)
            snprintf(cs->label, sizeof cs->label, "gemm op%d %lldx%lldx%lld batch %lld", st->op,
                     (long long)st->gemm.M, (long long)st->gemm.N, (long long)st->gemm.K,
                     (long long)st->gemm.batch);
        if (st->kind == CG_STEP_KERNEL) {
            const CgKernel *k = p->kernels.v[st->kernel];
            cs->nfn = q->step_nfn[s];
            cs->fn = kc_zalloc(sizeof(CUfunction) * (size_t)(cs->nfn + 1));
            cs->geo = &q->fn.v[q->step_fn[s]];
            for (int f = 0; f < cs->nfn; f++)
                cs->fn[f] = c->fns[q->step_fn[s] + f];
            cs->ptr = kc_zalloc(sizeof(CUdeviceptr) * (size_t)(k->params.n + 1));
            for (int a = 0; a < k->params.n; a++)
                cs->ptr[a] = dptr(c, st->args[a]);
            cs->argv = kc_zalloc(sizeof(void **) * (size_t)(cs->nfn + 1));
            for (int f = 0; f < cs->nfn; f++) {
                const CgCudaFn *fn = &cs->geo[f];
                cs->argv[f] = kc_zalloc(sizeof(void *) * (size_t)(fn->nparam + 2));
                for (int j = 0; j < fn->nparam; j++)
                    cs->argv[f][j] = &cs->ptr[fn->param[j]];
                if (fn->rand)
                    cs->argv[f][fn->nparam] = &c->rs;
            }
        } else if (st->kind == CG_STEP_GEMM) {
            const CgGemm *m = &st->gemm;
            DType sa = q->storage[m->a], sb = q->storage[m->b], sc = q->storage[m->c];
            if ((sa != DT_F32 && sa != DT_BF16) || (sb != DT_F32 && sb != DT_BF16) ||
                (sc != DT_F32 && sc != DT_BF16)) {
                kc_dmsg(d, "gemm of op %d: only f32 and bf16 matrices are supported", st->op);
                return false;
            }
            cs->at = CUDA_R_32F;
            cs->ct = sc == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
            if (c->bf16 || sa == DT_BF16 || sb == DT_BF16) {
                cs->at = CUDA_R_16BF;
                cs->cast_a = sa != DT_BF16;
                cs->cast_b = sb != DT_BF16;
            }
            int64_t na = numel(g, m->a) * 2, nb = numel(g, m->b) * 2;
            if (cs->cast_a && na > need)
                need = na;
            if (cs->cast_b && nb > need)
                need = nb;
            cs->a = dptr(c, m->a);
            cs->b = dptr(c, m->b);
            cs->c = dptr(c, m->c);
            c->epi[s] = q->epi[s];
            if (c->epi[s] != CG_EPI_NONE) {
                /* D's type; a bias (f32) is copied to bf16 for a bf16 D */
                cs->ct = q->storage[m->d >= 0 ? m->d : m->c] == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
                if (m->bias >= 0 && cs->ct == CUDA_R_16BF) {
                    cs->bias16 = c->bias16 + (CUdeviceptr)bias16;
                    bias16 += (m->N * 2 + 255) / 256 * 256;
                }
            }
        }
    }
    /* scratch before planning: the heuristic sees the pointers it will get */
    if (need > 0) {
        c->scratch_half = (need + 255) / 256 * 256;
        if (!CU(cu.cuMemAlloc(&c->scratch, (size_t)(2 * c->scratch_half)), d))
            return false;
    }
    for (int s = 0; s < p->steps.n; s++) {
        CuStep *cs = &c->st[s];
        if (cs->cast_a)
            cs->a = c->scratch;
        if (cs->cast_b)
            cs->b = c->scratch + (CUdeviceptr)c->scratch_half;
    }
    for (int s = 0; s < p->steps.n; s++) {
        if (p->steps.v[s].kind != CG_STEP_GEMM)
            continue;
        int k = plan_step_gemm(c, s, c->epi[s], d);
        if (k == -2) { /* no algorithm for the epilogue: the planned kernels instead */
            c->epi[s] = CG_EPI_NONE;
            k = plan_step_gemm(c, s, CG_EPI_NONE, d);
        }
        if (k < 0)
            return false;
        c->st[s].gemm = k;
    }
    /* a pair whose partner fell back falls back too: planned again plain */
    CgEpilogue *before = kc_zalloc(sizeof(CgEpilogue) * (size_t)(p->steps.n + 1));
    memcpy(before, c->epi, sizeof(CgEpilogue) * (size_t)p->steps.n);
    cg_cuda_pair_epilogues(p, c->epi);
    for (int s = 0; s < p->steps.n; s++)
        if (before[s] != c->epi[s] && (c->st[s].gemm = plan_step_gemm(c, s, CG_EPI_NONE, d)) < 0) {
            free(before);
            return false;
        }
    free(before);
    for (int s = 0; s < p->steps.n; s++) {
        c->st[s].epi = c->epi[s] != CG_EPI_NONE;
        c->st[s].skip = cg_cuda_step_replaced(p, c->epi, s);
        if (!c->st[s].epi)
            c->st[s].bias16 = 0;
    }
    return true;
}

static bool load_module(BackendCtx *c, const ExecOpts *o, Diag *d)
{
    RtCudaBinary bin;
    if (!kiln_cuda_compile(c->q->source, c->arch, o->cache_dir, o->verbose, &bin, d))
        return false;
    bool ok = CU(cu.cuModuleLoadData(&c->mod, bin.cubin), d);
    kiln_cuda_binary_free(&bin);
    if (!ok)
        return false;
    c->fns = kc_zalloc(sizeof(CUfunction) * (size_t)(c->q->fn.n + 1));
    for (int i = 0; i < c->q->fn.n; i++)
        if (!CU(cu.cuModuleGetFunction(&c->fns[i], c->mod, c->q->fn.v[i].name), d))
            return false;
    if (c->q->bf16 && !CU(cu.cuModuleGetFunction(&c->cast_fn, c->mod, "kiln_cast_f32_bf16"), d))
        return false;
    return true;
}

static BackendCtx *cuda_create(const CgPlan *p, const ExecOpts *o, Diag *d)
{
    if (!cu_open()) {
        kc_dmsg(d, "--device cuda: %s", cu_why);
        return NULL;
    }
    BackendCtx *c = kc_zalloc(sizeof *c);
    c->p = p;
    c->verbose = o->verbose;
    c->tf32 = o->tf32;
    c->bf16 = o->precision && strcmp(o->precision, "bf16") == 0;
    c->graph_on = o->cuda_graph && !o->profile;
    int ndev = 0, ord = 0;
    if (!CU(cu.cuDeviceGetCount(&ndev), d))
        goto fail;
    ord = kc_device_ordinal(); /* KILN_CUDA_DEVICE, else the local rank */
    if (ndev < 1 || ord < 0 || ord >= ndev) {
        kc_dmsg(d, "--device cuda: no CUDA device %d (the driver sees %d; each rank on a machine "
                "uses the device of its local rank unless KILN_CUDA_DEVICE is set)", ord, ndev);
        goto fail;
    }
    int maj = 0, min = 0;
    if (!CU(cu.cuDeviceGet(&c->dev, ord), d) ||
        !CU(cu.cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev),
            d) ||
        !CU(cu.cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev),
            d))
        goto fail;
    snprintf(c->arch, sizeof c->arch, "sm_%d%d", maj, min);
    if (maj < 8) {
        kc_dmsg(d, "--device cuda: compute capability %d.%d is too old (expected 8.0 or newer)",
                maj, min);
        goto fail;
    }
    if (!CU(cu.cuDevicePrimaryCtxRetain(&c->ctx, c->dev), d))
        goto fail;
    c->ctx_held = true;
    if (!CU(cu.cuCtxSetCurrent(c->ctx), d) ||
        !CU(cu.cuStreamCreate(&c->s, CU_STREAM_NON_BLOCKING), d) ||
        !CU(cu.cuStreamCreate(&c->comm, CU_STREAM_NON_BLOCKING), d) ||
        !CU(cu.cuEventCreate(&c->comm_ready, CU_EVENT_DISABLE_TIMING), d) ||
        !CU(cu.cuEventCreate(&c->rs_done, CU_EVENT_DISABLE_TIMING), d) ||
        !create_timing(c, o->profile, d))
        goto fail;
    if (o->verbose) {
        char name[256] = "?";
        cu.cuDeviceGetName(name, sizeof name, c->dev);
        fprintf(stderr, "kiln: cuda: device %d: %s (%s)%s%s%s\n", ord, name, c->arch,
                c->bf16 ? ", bf16" : "", c->tf32 ? ", tf32" : "",
                c->graph_on ? ", CUDA graph" : "");
    }
    c->q = host->program(p, c->bf16);
    /* one allocation: the arena (bf16 activations at their own size), then
     * {seed, step} */
    size_t arena = (size_t)(c->q->mem->arena_bytes + 255) / 256 * 256;
    /* zeroed on the compute stream, ahead of the parameter upload there (the
     * legacy stream would not be ordered with this non-blocking stream) */
    if (!CU(cu.cuMemAlloc(&c->arena, arena + 256), d) ||
        !CU(cu.cuMemsetD8Async(c->arena, 0, arena + 256, c->s), d))
        goto fail;
    c->rs = c->arena + arena;
    c->stage_cap = STAGE_BYTES;
    if (!CU(cu.cuMemAllocHost((void **)&c->stage, c->stage_cap), d) ||
        !CU(cu.cuMemAllocHost((void **)&c->rs_host, 2 * sizeof(uint64_t)), d))
        goto fail;
    if (!load_module(c, o, d))
        goto fail;
    if (!LT(cublasLtCreate(&c->lt), d) || !CU(cu.cuMemAlloc(&c->ws, WORKSPACE_BYTES), d))
        goto fail;
    if (!setup_steps(c, d))
        goto fail;
    return c;
fail:
    cuda_destroy(c);
    return NULL;
}

/* The device offset of a host access in plan offsets (see CgCudaProgram). */
static int64_t host_offset(const BackendCtx *c, int64_t off, int64_t bytes)
{
    int64_t o = cg_cuda_host_offset(c->q, off, bytes);
    if (o < 0)
        kc_fatal("host access to [%lld, +%lld) of the plan's arena: not a param, input, state or "
              "graph output",
              (long long)off, (long long)bytes);
    return o;
}

/* Host data into the arena: copied into pinned staging, then an
 * asynchronous copy on the compute stream (after the work queued before). */

static void cuda_write(BackendCtx *c, int64_t off, const void *src, int64_t bytes)
{
    off = host_offset(c, off, bytes);
    cu.cuCtxSetCurrent(c->ctx);
    const unsigned char *s = src;
    while (bytes > 0) {
        size_t n = (size_t)bytes < c->stage_cap ? (size_t)bytes : c->stage_cap;
        if (c->stage_used + n > c->stage_cap) {
            (void)CU(wait_stream(c, c->s), NULL);
            c->stage_used = 0;
        }
        memcpy(c->stage + c->stage_used, s, n);
        (void)CU(cu.cuMemcpyHtoDAsync(c->arena + (CUdeviceptr)off, c->stage + c->stage_used, n, c->s),
           NULL);
        c->stage_used += (n + 255) / 256 * 256;
        s += n;
        off += (int64_t)n;
        bytes -= (int64_t)n;
    }
}

static void cuda_read(BackendCtx *c, int64_t off, void *dst, int64_t bytes)
{
    off = host_offset(c, off, bytes);
    cu.cuCtxSetCurrent(c->ctx);
    unsigned char *t = dst;
    (void)CU(wait_stream(c, c->s), NULL);
    c->stage_used = 0;
    while (bytes > 0) {
        size_t n = (size_t)bytes < c->stage_cap ? (size_t)bytes : c->stage_cap;
        (void)CU(cu.cuMemcpyDtoHAsync(c->stage, c->arena + (CUdeviceptr)off, n, c->s), NULL);
        (void)CU(wait_stream(c, c->s), NULL);
        memcpy(t, c->stage, n);
        t += n;
        off += (int64_t)n;
        bytes -= (int64_t)n;
    }
}

static bool launch(BackendCtx *c, CUfunction f, const CgCudaFn *g, void **argv, Diag *d)
{
    return CU(cu.cuLaunchKernel(f, (unsigned)g->blocks, 1, 1, (unsigned)g->threads, 1, 1, 0, c->s,
                                argv, NULL),
              d);
}

static bool cast_bf16(BackendCtx *c, CUdeviceptr x, CUdeviceptr y, int64_t n, Diag *d)
{
    CgCudaFn g = {.threads = 256};
    int64_t blocks = (n + 255) / 256;
    g.blocks = blocks < 1 ? 1 : blocks > (1 << 20) ? (1 << 20) : blocks;
    void *argv[] = {&x, &y, &n};
    return launch(c, c->cast_fn, &g, argv, d);
}

static bool run_gemm(BackendCtx *c, const CgStep *st, const CuStep *cs, Diag *d)
{
    const GemmPlan *k = &c->gemms[cs->gemm];
    const CgGemm *m = &st->gemm;
    if (cs->cast_a && !cast_bf16(c, dptr(c, m->a), cs->a, numel(c->p->g, m->a), d))
        return false;
    if (cs->cast_b && !cast_bf16(c, dptr(c, m->b), cs->b, numel(c->p->g, m->b), d))
        return false;
    if (cs->bias16 && !cast_bf16(c, dptr(c, m->bias), cs->bias16, m->N, d))
        return false;
    const float one = 1.0f, zero = 0.0f;
    /* a batch sharing B runs as one product per batch (k->batch is 1) */
    int64_t nb = k->batch == m->batch ? 1 : m->batch;
    int64_t ea = k->at == CUDA_R_16BF ? 2 : 4, ec = k->ct == CUDA_R_16BF ? 2 : 4;
    for (int64_t i = 0; i < nb; i++) {
        CUdeviceptr pa = cs->a + (CUdeviceptr)(i * m->sa * ea);
        CUdeviceptr pc = cs->c + (CUdeviceptr)(i * m->sc * ec);
        if (!LT(cublasLtMatmul(c->lt, k->op, &one, (const void *)cs->b, k->la, (const void *)pa,
                               k->lb, &zero, (void *)pc, k->lc, (void *)pc, k->lc, &k->algo,
                               (void *)c->ws, WORKSPACE_BYTES, (cudaStream_t)c->s),
                d))
            return false;
    }
    return true;
}

static bool enqueue(BackendCtx *c, int s, Diag *d)
{
    const CgStep *st = &c->p->steps.v[s];
    const CuStep *cs = &c->st[s];
    nvtxRangePushA(cs->label);
    bool ok = true;
    switch (st->kind) {
    case CG_STEP_KERNEL:
        for (int f = 0; f < cs->nfn && ok && !cs->skip; f++)
            ok = launch(c, cs->fn[f], &cs->geo[f], cs->argv[f], d);
        break;
    case CG_STEP_GEMM:
        ok = run_gemm(c, st, cs, d);
        break;
    case CG_STEP_COPY: {
        const CgCudaCopy *cp = &c->q->copy[s]; /* in the device arena's offsets */
        if (cp->dst != cp->src && cp->bytes > 0) {
            int64_t lo = cp->dst < cp->src ? cp->dst : cp->src;
            int64_t hi = cp->dst < cp->src ? cp->src : cp->dst;
            if (hi - lo < cp->bytes)
                kc_fatal("copy step %d: overlapping regions [%lld,+%lld) and [%lld,+%lld)", s,
                      (long long)cp->src, (long long)cp->bytes, (long long)cp->dst,
                      (long long)cp->bytes);
            ok = CU(cu.cuMemcpyDtoDAsync(c->arena + (CUdeviceptr)cp->dst,
                                         c->arena + (CUdeviceptr)cp->src, (size_t)cp->bytes, c->s),
                    d);
        }
        break;
    }
    case CG_STEP_ALLREDUCE_START:
    case CG_STEP_ALLREDUCE_WAIT:
        break; /* the executor's communication thread runs these */
    }
    nvtxRangePop();
    return ok;
}

/* Step 0 sets {seed, step} (read by random kernels from device memory);
 * with a CUDA graph the first run is a plain warm-up (first launches and
 * GEMMs outside any capture), the second is captured and every later run
 * replays it at step 0, the other steps being part of the graph. */
static bool cuda_run_step(BackendCtx *c, int s, uint64_t seed, int64_t step, Diag *d)
{
    int last = c->p->steps.n - 1;
    if (!CU(cu.cuCtxSetCurrent(c->ctx), d))
        return false;
    if (s == 0) {
        if (!CU(wait_event(c, c->rs_done), d))
            return false;
        if (!run_begins(c, d))
            return false;
        c->rs_host[0] = seed;
        c->rs_host[1] = (uint64_t)step;
        if (!CU(cu.cuMemcpyHtoDAsync(c->rs, c->rs_host, 2 * sizeof(uint64_t), c->s), d) ||
            !CU(cu.cuEventRecord(c->rs_done, c->s), d))
            return false;
        if (c->gexec) {
            nvtxRangePushA("kiln step (CUDA graph)");
            bool ok = CU(cu.cuGraphLaunch(c->gexec, c->s), d);
            nvtxRangePop();
            ok = ok && CU(cu.cuEventRecord(c->ev_end, c->s), d);
            c->ran = ok;
            c->replaying = last > 0;
            return ok;
        }
        if (c->graph_on && c->warm) {
            if (!CU(cu.cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), d))
                return false;
            c->capturing = true;
        }
    }
    if (c->replaying) {
        if (s == last)
            c->replaying = false;
        return true;
    }
    if (!enqueue(c, s, d))
        return false;
    if (s == last && c->capturing) {
        c->capturing = false;
        if (!CU(cu.cuStreamEndCapture(c->s, &c->graph), d) ||
            !CU(cu.cuGraphInstantiate(&c->gexec, c->graph, 0), d) ||
            !CU(cu.cuGraphLaunch(c->gexec, c->s), d))
            return false;
        if (c->verbose)
            fprintf(stderr, "kiln: cuda: step captured into a CUDA graph (%d plan steps)\n",
                    c->p->steps.n);
    }
    if (s == last)
        c->warm = true;
    return step_done(c, s, d);
}

static void cuda_sync(BackendCtx *c)
{
    cu.cuCtxSetCurrent(c->ctx);
    (void)CU(wait_stream(c, c->s), NULL);
}

/* ---- device timing and collectives (BackendExt) ------------------------------
 * A run records ev_begin on the compute stream before its first plan step
 * and ev_end after its last (after the graph launch when a CUDA graph
 * replays); with --profile also ev_step[s] after every plan step, outside
 * capture (a profiled run never captures). The all-reduce steps go to
 * cuda_nccl.c. */

static bool create_timing(BackendCtx *c, bool profile, Diag *d)
{
    if (!CU(cu.cuEventCreate(&c->ev_begin, CU_EVENT_DEFAULT), d) ||
        !CU(cu.cuEventCreate(&c->ev_end, CU_EVENT_DEFAULT), d))
        return false;
    if (!profile)
        return true;
    c->ev_step = kc_zalloc(sizeof(CUevent) * (size_t)(c->p->steps.n + 1));
    for (int s = 0; s < c->p->steps.n; s++)
        if (!CU(cu.cuEventCreate(&c->ev_step[s], CU_EVENT_DEFAULT), d))
            return false;
    return true;
}

/* Frees the collectives and the timing events (the context is current). */
static void destroy_timing(BackendCtx *c)
{
    kc_comm_close(c->nccl);
    c->nccl = NULL;
    for (int s = 0; c->ev_step && s < c->p->steps.n; s++)
        if (c->ev_step[s])
            cu.cuEventDestroy(c->ev_step[s]);
    free(c->ev_step);
    c->ev_step = NULL;
    if (c->ev_begin)
        cu.cuEventDestroy(c->ev_begin);
    if (c->ev_end)
        cu.cuEventDestroy(c->ev_end);
}

static bool run_begins(BackendCtx *c, Diag *d)
{
    c->ran = false;
    c->host_begin = kc_now();
    kc_comm_run_begins(c->nccl);
    return CU(cu.cuEventRecord(c->ev_begin, c->s), d);
}

/* After plan step s was enqueued (not while capturing). */
static bool step_done(BackendCtx *c, int s, Diag *d)
{
    if (c->ev_step && !c->capturing && !CU(cu.cuEventRecord(c->ev_step[s], c->s), d))
        return false;
    if (s == c->p->steps.n - 1) {
        if (!CU(cu.cuEventRecord(c->ev_end, c->s), d))
            return false;
        c->ran = true;
    }
    return true;
}

static double cuda_run_seconds(BackendCtx *c)
{
    float ms = 0;
    cu.cuCtxSetCurrent(c->ctx);
    if (!c->ran || wait_event(c, c->ev_end) != CUDA_SUCCESS ||
        cu.cuEventElapsedTime(&ms, c->ev_begin, c->ev_end) != CUDA_SUCCESS)
        return -1;
    return 1e-3 * (double)ms;
}

static bool cuda_step_times(BackendCtx *c, double *start, double *end)
{
    int n = c->p->steps.n;
    cu.cuCtxSetCurrent(c->ctx);
    if (!c->ev_step || !c->ran || n < 1 ||
        wait_event(c, c->ev_step[n - 1]) != CUDA_SUCCESS)
        return false;
    for (int s = 0; s < n; s++) {
        float ms = 0;
        if (cu.cuEventElapsedTime(&ms, c->ev_begin, c->ev_step[s]) != CUDA_SUCCESS)
            return false;
        end[s] = 1e-3 * (double)ms;
        start[s] = s ? end[s - 1] : 0;
    }
    return true;
}

/* NCCL on the communication stream. A CUDA graph is not captured with
 * collectives in the step (their events and the second stream are not part
 * of the capture). */
static bool cuda_comm_setup(BackendCtx *c, const RtCommGroup *g, Diag *d)
{
    if (!CU(cu.cuCtxSetCurrent(c->ctx), d))
        return false;
    c->nccl = kc_comm_open(g, c->p, c->q->storage, c->q->mem->offset, c->arena, c->ctx, c->s,
                           c->comm, d);
    if (!c->nccl)
        return false;
    if (c->graph_on && c->verbose)
        fprintf(stderr, "kiln: cuda: no CUDA graph: the step has NCCL all-reduces\n");
    c->graph_on = false;
    if (c->verbose)
        fprintf(stderr, "kiln: cuda: NCCL all-reduces, rank %d of %d\n", g->rank, g->size);
    return true;
}

static bool cuda_allreduce_start(BackendCtx *c, int s, Diag *d)
{
    return CU(cu.cuCtxSetCurrent(c->ctx), d) && kc_allreduce_start(c->nccl, s, d) &&
           step_done(c, s, d);
}

static bool cuda_allreduce_wait(BackendCtx *c, int s, Diag *d)
{
    return CU(cu.cuCtxSetCurrent(c->ctx), d) && kc_allreduce_wait(c->nccl, s, d) &&
           step_done(c, s, d);
}

static int cuda_comm_events(BackendCtx *c, RtCommEvent *ev, int max, double *exposed_s)
{
    *exposed_s = 0;
    return c->nccl ? kc_comm_events(c->nccl, c->ev_begin, c->host_begin, ev, max, exposed_s)
                   : 0;
}

static int64_t cuda_arena_bytes(const BackendCtx *c) { return c->q->mem->arena_bytes; }

static const BackendExt backend_cuda_ext = {
    cuda_comm_setup,  cuda_allreduce_start, cuda_allreduce_wait,
    cuda_comm_events, cuda_run_seconds,     cuda_step_times,
    cuda_arena_bytes,
};

static const Backend backend_cuda = {
    "cuda", cuda_create, cuda_destroy, cuda_write, cuda_read, cuda_run_step, cuda_sync,
    &backend_cuda_ext,
};

/* The backend table, or NULL when kiln and the module disagree on the ABI. */
KC_EXPORT const Backend *kiln_cuda_backend(const RtCudaHost *h);
KC_EXPORT const Backend *kiln_cuda_backend(const RtCudaHost *h)
{
    if (!h || h->abi != RT_CUDA_ABI)
        return NULL;
    host = h;
    return &backend_cuda;
}

/* Number of CUDA devices; -1 with why set when the driver is unusable. */
KC_EXPORT int kiln_cuda_device_count(char *why, size_t n);
KC_EXPORT int kiln_cuda_device_count(char *why, size_t n)
{
    if (!cu_open()) {
        snprintf(why, n, "%s", cu_why);
        return -1;
    }
    int k = 0;
    CUresult r = cu.cuDeviceGetCount(&k);
    if (r != CUDA_SUCCESS) {
        snprintf(why, n, "cuDeviceGetCount failed (error %d)", (int)r);
        return -1;
    }
    if (k == 0)
        snprintf(why, n, "the CUDA driver sees no device");
    return k;
}
