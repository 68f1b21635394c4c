/* fake_cublaslt.c - a stand-in libcublasLt.so.13 for tests/cudafake: the
 * part of cuBLASLt kiln's CUDA module uses, computed on the host over the
 * fake driver's device memory (fake_cuda.h), in stream order.
 *
 * Semantics, as cuBLASLt documents them: column-major matrices (a layout is
 * rows x cols with leading dimension ld >= rows; ORDER other than COL is
 * refused); D = alpha op(A) op(B) + beta C with op() from TRANSA/TRANSB
 * (op(A) is m x k, op(B) k x n, C and D m x n; mismatching dims are
 * CUBLAS_STATUS_INVALID_VALUE); strided batches (BATCH_COUNT equal in A, B,
 * C and D; STRIDED_BATCH_OFFSET in elements). Compute: f32 accumulation in
 * k order; A and B both f32 (COMPUTE_32F, or COMPUTE_32F_FAST_TF32: inputs
 * rounded to TF32) or both bf16 (COMPUTE_32F); C/D f32, or bf16 with bf16
 * inputs, stored rounded to nearest even. Epilogues: BIAS, GELU_BIAS,
 * GELU_AUX_BIAS (aux = the GELU input, in D's type, at AUX_POINTER with
 * AUX_LD), DGELU and DGELU_BGRAD (D = product * gelu'(aux); the bias
 * gradient, a vector of D's rows, the sum over D's columns of D), BGRADA
 * (sum of op(A) over k: D's rows) and BGRADB (sum of op(B) over k: D's
 * columns); GELU is the tanh form. The bias vector has BIAS_DATA_TYPE
 * (default D's type) and must be D's type. The heuristic refuses
 * (NOT_SUPPORTED, with a line on stderr saying why): an epilogue with a
 * batch, an aux leading dimension that is not a multiple of 8 or smaller
 * than D's rows, a bias or aux pointer missing. It returns one algorithm
 * that remembers the problem and the alignments the preference promised
 * (MIN_ALIGNMENT_*_BYTES, 256 when not set); cublasLtMatmul refuses
 * (INVALID_VALUE) an algorithm for another problem and any pointer (every
 * batch's) less aligned than promised. Attributes it does not model stop
 * the process.
 *
 * Negative controls (environment): FAKE_CUBLASLT_FLIP_TRANSA=1 computes
 * every GEMM whose op(A) is square with TRANSA flipped;
 * FAKE_CUBLASLT_LDA_SKEW=1 reads A with lda + 1; FAKE_CUBLASLT_SYNC=1 makes
 * cublasLtMatmul synchronise its stream first (a library that does so
 * breaks graph capture); FAKE_CUBLASLT_REFUSE=E refuses epilogue E
 * (cublasLtEpilogue_t value) in the heuristic. */
#include "fake_cuda.h"

#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LT_API __attribute__((visibility("default")))

typedef struct {
    cublasComputeType_t comp;
    cudaDataType_t scale;
    int32_t ta, tb;
    uint32_t epi;
    const void *bias;
    int32_t bias_type; /* -1: D's */
    const void *aux;
    int64_t auxld;
} Desc;

typedef struct {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
} Layout;

typedef struct {
    uint64_t ws;
    uint32_t align[4]; /* A, B, C, D */
} Pref;

enum { ALGO_MAGIC = 0x6b696c6e4c54ull };

static int env_int(const char *name)
{
    const char *e = getenv(name);
    return e && *e ? atoi(e) : 0;
}

LT_API cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    static int dummy;
    *h = (cublasLtHandle_t)&dummy;
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t comp,
                                               cudaDataType_t scale)
{
    Desc *x = calloc(1, sizeof *x);
    x->comp = comp;
    x->scale = scale;
    x->epi = CUBLASLT_EPILOGUE_DEFAULT;
    x->bias_type = -1;
    *d = (cublasLtMatmulDesc_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

static void get(void *dst, size_t want, const void *buf, size_t n, const char *what)
{
    if (n != want)
        fakecu_die("cuBLASLt: %s set with %zu bytes (expected %zu)", what, n, want);
    memcpy(dst, buf, n);
}

LT_API cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                     cublasLtMatmulDescAttributes_t a,
                                                     const void *buf, size_t n)
{
    Desc *x = (Desc *)d;
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: get(&x->ta, 4, buf, n, "TRANSA"); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: get(&x->tb, 4, buf, n, "TRANSB"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: get(&x->epi, 4, buf, n, "EPILOGUE"); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: get(&x->bias, 8, buf, n, "BIAS_POINTER"); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: get(&x->bias_type, 4, buf, n, "BIAS_DATA_TYPE"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: get(&x->aux, 8, buf, n, "AUX_POINTER"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: get(&x->auxld, 8, buf, n, "AUX_LD"); break;
    default: fakecu_die("cublasLtMatmulDescSetAttribute: attribute %d is not modelled", (int)a);
    }
    if ((a == CUBLASLT_MATMUL_DESC_TRANSA || a == CUBLASLT_MATMUL_DESC_TRANSB) &&
        ((a == CUBLASLT_MATMUL_DESC_TRANSA ? x->ta : x->tb) != CUBLAS_OP_N) &&
        ((a == CUBLASLT_MATMUL_DESC_TRANSA ? x->ta : x->tb) != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld)
{
    Layout *x = calloc(1, sizeof *x);
    *x = (Layout){type, rows, cols, ld, 1, 0};
    *l = (cublasLtMatrixLayout_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                       cublasLtMatrixLayoutAttribute_t a,
                                                       const void *buf, size_t n)
{
    Layout *x = (Layout *)l;
    switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: get(&x->batch, 4, buf, n, "BATCH_COUNT"); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        get(&x->stride, 8, buf, n, "STRIDED_BATCH_OFFSET");
        break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER: {
        int32_t o;
        get(&o, 4, buf, n, "ORDER");
        if (o != CUBLASLT_ORDER_COL)
            fakecu_die("cuBLASLt: only column-major layouts are modelled");
        break;
    }
    default: fakecu_die("cublasLtMatrixLayoutSetAttribute: attribute %d is not modelled", (int)a);
    }
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    Pref *x = calloc(1, sizeof *x);
    for (int i = 0; i < 4; i++)
        x->align[i] = 256;
    *p = (cublasLtMatmulPreference_t)x;
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t a,
                                                           const void *buf, size_t n)
{
    Pref *x = (Pref *)p;
    switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: get(&x->ws, 8, buf, n, "MAX_WORKSPACE_BYTES"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: get(&x->align[0], 4, buf, n, "MIN_ALIGNMENT_A"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: get(&x->align[1], 4, buf, n, "MIN_ALIGNMENT_B"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: get(&x->align[2], 4, buf, n, "MIN_ALIGNMENT_C"); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: get(&x->align[3], 4, buf, n, "MIN_ALIGNMENT_D"); break;
    default: fakecu_die("cublasLtMatmulPreferenceSetAttribute: attribute %d is not modelled", (int)a);
    }
    return CUBLAS_STATUS_SUCCESS;
}

static int esize(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

/* The problem an algorithm is for: descriptor and layouts. */
static uint64_t problem_key(const Desc *d, const Layout *a, const Layout *b, const Layout *c,
                            const Layout *dd)
{
    uint64_t h = fnv(d, sizeof *d, 0xcbf29ce484222325ull);
    h = fnv(a, sizeof *a, h);
    h = fnv(b, sizeof *b, h);
    h = fnv(c, sizeof *c, h);
    return fnv(dd, sizeof *dd, h);
}

static bool has_bias_in(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
static bool has_bgrad(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB; }
static bool has_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }

/* CUBLAS_STATUS_SUCCESS when the problem is valid and supported; else the
 * status, with why set. */
static cublasStatus_t validate(const Desc *d, const Layout *a, const Layout *b, const Layout *c,
                               const Layout *dd, char *why, size_t wn)
{
    uint64_t m = d->ta == CUBLAS_OP_N ? a->rows : a->cols, k = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t kb = d->tb == CUBLAS_OP_N ? b->rows : b->cols, n = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    const Layout *all[4] = {a, b, c, dd};
    const char *nm[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++)
        if (all[i]->ld < (int64_t)all[i]->rows || all[i]->rows == 0 || all[i]->cols == 0) {
            snprintf(why, wn, "%s is %llux%llu with ld %lld (ld must be >= rows)", nm[i],
                     (unsigned long long)all[i]->rows, (unsigned long long)all[i]->cols,
                     (long long)all[i]->ld);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    if (k != kb || c->rows != m || c->cols != n || dd->rows != m || dd->cols != n) {
        snprintf(why, wn, "op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu do not match",
                 (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb,
                 (unsigned long long)n, (unsigned long long)c->rows, (unsigned long long)c->cols,
                 (unsigned long long)dd->rows, (unsigned long long)dd->cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a->batch != b->batch || a->batch != c->batch || a->batch != dd->batch || a->batch < 1) {
        snprintf(why, wn, "batch counts %d, %d, %d, %d differ", a->batch, b->batch, c->batch,
                 dd->batch);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a->type != b->type || (a->type != CUDA_R_32F && a->type != CUDA_R_16BF) ||
        c->type != dd->type || (c->type != CUDA_R_32F && c->type != CUDA_R_16BF) ||
        (a->type == CUDA_R_32F && c->type != CUDA_R_32F) || d->scale != CUDA_R_32F ||
        (d->comp != CUBLAS_COMPUTE_32F &&
         !(d->comp == CUBLAS_COMPUTE_32F_FAST_TF32 && a->type == CUDA_R_32F))) {
        snprintf(why, wn, "types A %d B %d C %d D %d, compute %d, scale %d are not supported",
                 a->type, b->type, c->type, dd->type, d->comp, d->scale);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    uint32_t e = d->epi;
    if (e == CUBLASLT_EPILOGUE_DEFAULT)
        return CUBLAS_STATUS_SUCCESS;
    if (!has_bias_in(e) && !has_bgrad(e) && e != CUBLASLT_EPILOGUE_DGELU) {
        snprintf(why, wn, "epilogue %u is not modelled", e);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((int)e == env_int("FAKE_CUBLASLT_REFUSE")) {
        snprintf(why, wn, "epilogue %u refused (FAKE_CUBLASLT_REFUSE)", e);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (a->batch > 1) {
        snprintf(why, wn, "epilogue %u with a batch of %d", e, a->batch);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((has_bias_in(e) || has_bgrad(e)) && !d->bias) {
        snprintf(why, wn, "epilogue %u without BIAS_POINTER", e);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    int bt = d->bias_type < 0 ? (int)dd->type : d->bias_type;
    if ((has_bias_in(e) || has_bgrad(e)) && bt != (int)dd->type) {
        snprintf(why, wn, "epilogue %u: bias type %d is not D's type %d", e, bt, dd->type);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (has_aux(e) && (!d->aux || d->auxld % 8 != 0 || d->auxld < (int64_t)dd->rows)) {
        snprintf(why, wn, "epilogue %u: aux pointer %p, ld %lld (needs a pointer, ld >= %llu, a "
                 "multiple of 8)", e, d->aux, (long long)d->auxld, (unsigned long long)dd->rows);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

LT_API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
    cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
    cublasLtMatmulPreference_t pref, int req, cublasLtMatmulHeuristicResult_t *res, int *nres)
{
    (void)h;
    const Desc *d = (const Desc *)op;
    const Pref *p = (const Pref *)pref;
    char why[256];
    *nres = 0;
    if (req < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = validate(d, (Layout *)la, (Layout *)lb, (Layout *)lc, (Layout *)ld, why,
                                 sizeof why);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "fake cuBLASLt: cublasLtMatmulAlgoGetHeuristic: %s (status %d)\n", why,
                (int)st);
        return st;
    }
    memset(&res[0], 0, sizeof res[0]);
    res[0].algo.data[0] = ALGO_MAGIC;
    res[0].algo.data[1] = problem_key(d, (Layout *)la, (Layout *)lb, (Layout *)lc, (Layout *)ld);
    for (int i = 0; i < 4; i++)
        res[0].algo.data[2 + i] = p ? p->align[i] : 256;
    res[0].workspaceSize = 0;
    res[0].state = CUBLAS_STATUS_SUCCESS;
    res[0].wavesCount = 1.0f;
    *nres = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the computation ------------------------------------------------------ */

typedef struct {
    Desc d;
    Layout a, b, c, dd;
    float alpha, beta;
    uint64_t A, B, C, D;
    bool flip;
    int64_t lda;
} Gemm;

static float tf32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000) != 0x7f800000) {
        u += 0xfff + ((u >> 13) & 1);
        u &= 0xffffe000u;
    }
    memcpy(&f, &u, 4);
    return f;
}

static float ld_el(uint64_t base, cudaDataType_t t, int64_t i)
{
    return t == CUDA_R_16BF ? fakecu_bf2f(((const uint16_t *)(uintptr_t)base)[i])
                            : ((const float *)(uintptr_t)base)[i];
}

static void st_el(uint64_t base, cudaDataType_t t, int64_t i, float v)
{
    if (t == CUDA_R_16BF)
        ((uint16_t *)(uintptr_t)base)[i] = fakecu_f2bf(v);
    else
        ((float *)(uintptr_t)base)[i] = v;
}

static double gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double dgelu(double x)
{
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

static void run(void *arg)
{
    const Gemm *g = arg;
    const Desc *d = &g->d;
    bool ta = (d->ta == CUBLAS_OP_T) != g->flip, tb = d->tb == CUBLAS_OP_T;
    int64_t m = (int64_t)g->dd.rows, n = (int64_t)g->dd.cols;
    int64_t k = (int64_t)(d->ta == CUBLAS_OP_N ? g->a.cols : g->a.rows);
    uint32_t e = d->epi;
    cudaDataType_t at = g->a.type, ct = g->dd.type;
    bool tf = d->comp == CUBLAS_COMPUTE_32F_FAST_TF32;
    float *col = malloc(sizeof(float) * (size_t)(m + 1));
    float *bg = calloc((size_t)(m > n ? m : n) + 1, sizeof(float));
    for (int32_t bi = 0; bi < g->a.batch; bi++) {
        uint64_t A = g->A + (uint64_t)(bi * g->a.stride * esize(at));
        uint64_t B = g->B + (uint64_t)(bi * g->b.stride * esize(at));
        uint64_t C = g->C + (uint64_t)(bi * g->c.stride * esize(g->c.type));
        uint64_t D = g->D + (uint64_t)(bi * g->dd.stride * esize(ct));
        for (int64_t j = 0; j < n; j++) {
            for (int64_t i = 0; i < m; i++) {
                float acc = 0;
                for (int64_t l = 0; l < k; l++) {
                    float x = ld_el(A, at, ta ? l + i * g->lda : i + l * g->lda);
                    float y = ld_el(B, at, tb ? j + l * g->b.ld : l + j * g->b.ld);
                    if (tf) {
                        x = tf32(x);
                        y = tf32(y);
                    }
                    acc += x * y;
                }
                float v = g->alpha * acc;
                if (g->beta != 0.0f)
                    v += g->beta * ld_el(C, g->c.type, i + j * g->c.ld);
                if (has_bias_in(e))
                    v += ld_el((uint64_t)(uintptr_t)d->bias, ct, i);
                if (e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) /* the GELU input, in D's type */
                    st_el((uint64_t)(uintptr_t)d->aux, ct, i + j * d->auxld, v);
                if (e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
                    v = (float)gelu(v);
                if (e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD)
                    v = (float)((double)v *
                                dgelu(ld_el((uint64_t)(uintptr_t)d->aux, ct, i + j * d->auxld)));
                col[i] = v;
            }
            for (int64_t i = 0; i < m; i++) {
                st_el(D, ct, i + j * g->dd.ld, col[i]);
                if (e == CUBLASLT_EPILOGUE_DGELU_BGRAD)
                    bg[i] += col[i];
            }
        }
        if (e == CUBLASLT_EPILOGUE_BGRADA)
            for (int64_t i = 0; i < m; i++)
                for (int64_t l = 0; l < k; l++)
                    bg[i] += ld_el(A, at, ta ? l + i * g->lda : i + l * g->lda);
        if (e == CUBLASLT_EPILOGUE_BGRADB)
            for (int64_t j = 0; j < n; j++)
                for (int64_t l = 0; l < k; l++)
                    bg[j] += ld_el(B, at, tb ? j + l * g->b.ld : l + j * g->b.ld);
    }
    if (has_bgrad(e))
        for (int64_t i = 0; i < (e == CUBLASLT_EPILOGUE_BGRADB ? n : m); i++)
            st_el((uint64_t)(uintptr_t)d->bias, ct, i, bg[i]);
    free(col);
    free(bg);
}

/* The bytes a layout covers for batch 0 at p: [p, p + extent). */
static uint64_t extent(const Layout *l, int64_t ld)
{
    return ((l->cols - 1) * (uint64_t)ld + l->rows) * (uint64_t)esize(l->type);
}

static void add_matrix(FakeRange *r, int *nr, uint64_t p, const Layout *l, int64_t ld, bool write)
{
    for (int32_t b = 0; b < l->batch && *nr < 250; b++) {
        uint64_t q = p + (uint64_t)(b * l->stride * esize(l->type));
        r[(*nr)++] = (FakeRange){q, q + extent(l, ld), write};
    }
}

static bool aligned(uint64_t p, uint64_t a) { return a <= 1 || p % a == 0; }

LT_API cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                     const void *alpha, const void *A, cublasLtMatrixLayout_t la,
                                     const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                                     const void *C, cublasLtMatrixLayout_t lc, void *D,
                                     cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo,
                                     void *ws, size_t wsn, cudaStream_t stream)
{
    (void)h;
    (void)ws;
    (void)wsn;
    const Desc *d = (const Desc *)op;
    char why[256];
    cublasStatus_t st = validate(d, (Layout *)la, (Layout *)lb, (Layout *)lc, (Layout *)ld, why,
                                 sizeof why);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "fake cuBLASLt: cublasLtMatmul: %s\n", why);
        return st;
    }
    if (!algo || algo->data[0] != ALGO_MAGIC ||
        algo->data[1] != problem_key(d, (Layout *)la, (Layout *)lb, (Layout *)lc, (Layout *)ld)) {
        fprintf(stderr, "fake cuBLASLt: cublasLtMatmul: the algorithm was not found by the "
                        "heuristic for this descriptor and these layouts\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Gemm *g = calloc(1, sizeof *g);
    g->d = *d;
    g->a = *(Layout *)la;
    g->b = *(Layout *)lb;
    g->c = *(Layout *)lc;
    g->dd = *(Layout *)ld;
    g->alpha = *(const float *)alpha;
    g->beta = *(const float *)beta;
    g->A = (uint64_t)(uintptr_t)A;
    g->B = (uint64_t)(uintptr_t)B;
    g->C = (uint64_t)(uintptr_t)C;
    g->D = (uint64_t)(uintptr_t)D;
    g->lda = g->a.ld;
    /* alignment as promised to the heuristic, for every batch */
    const uint64_t ptr[4] = {g->A, g->B, g->C, g->D};
    const Layout *lay[4] = {&g->a, &g->b, &g->c, &g->dd};
    for (int i = 0; i < 4; i++)
        for (int32_t b = 0; b < lay[i]->batch; b++) {
            uint64_t p = ptr[i] + (uint64_t)(b * lay[i]->stride * esize(lay[i]->type));
            if (!aligned(p, algo->data[2 + i])) {
                fprintf(stderr, "fake cuBLASLt: cublasLtMatmul: %c of batch %d at 0x%llx is "
                                "less aligned than the %llu bytes promised to the heuristic\n",
                        "ABCD"[i], b, (unsigned long long)p, (unsigned long long)algo->data[2 + i]);
                free(g);
                return CUBLAS_STATUS_INVALID_VALUE;
            }
        }
    if (env_int("FAKE_CUBLASLT_FLIP_TRANSA") && g->a.rows == g->a.cols) {
        static bool said;
        if (!said)
            fprintf(stderr, "fake cuBLASLt: negative control: TRANSA flipped on square A\n");
        said = true;
        g->flip = true;
    }
    if (env_int("FAKE_CUBLASLT_LDA_SKEW")) {
        static bool said;
        if (!said)
            fprintf(stderr, "fake cuBLASLt: negative control: A read with lda + 1\n");
        said = true;
        g->lda = g->a.ld + 1;
    }
    if (env_int("FAKE_CUBLASLT_SYNC") && cuStreamSynchronize((CUstream)stream) != CUDA_SUCCESS) {
        free(g);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    FakeRange r[1024];
    int nr = 0;
    uint32_t e = d->epi;
    add_matrix(r, &nr, g->A, &g->a, g->lda, false);
    add_matrix(r, &nr, g->B, &g->b, g->b.ld, false);
    if (g->beta != 0.0f)
        add_matrix(r, &nr, g->C, &g->c, g->c.ld, false);
    add_matrix(r, &nr, g->D, &g->dd, g->dd.ld, true);
    uint64_t es = (uint64_t)esize(g->dd.type);
    if (has_bias_in(e))
        r[nr++] = (FakeRange){(uint64_t)(uintptr_t)d->bias, (uint64_t)(uintptr_t)d->bias + g->dd.rows * es, false};
    if (has_bgrad(e)) {
        uint64_t len = e == CUBLASLT_EPILOGUE_BGRADB ? g->dd.cols : g->dd.rows;
        r[nr++] = (FakeRange){(uint64_t)(uintptr_t)d->bias, (uint64_t)(uintptr_t)d->bias + len * es, true};
    }
    if (has_aux(e)) {
        Layout aux = g->dd;
        r[nr++] = (FakeRange){(uint64_t)(uintptr_t)d->aux,
                              (uint64_t)(uintptr_t)d->aux + extent(&aux, d->auxld),
                              e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
    }
    char desc[160];
    snprintf(desc, sizeof desc, "cublasLtMatmul(m %llu n %llu k %llu batch %d, epilogue %u)",
             (unsigned long long)g->dd.rows, (unsigned long long)g->dd.cols,
             (unsigned long long)(d->ta == CUBLAS_OP_N ? g->a.cols : g->a.rows), g->a.batch, e);
    CUresult cr = fakecu_enqueue((CUstream)stream, desc, r, nr, run, g);
    if (cr != CUDA_SUCCESS) {
        fprintf(stderr, "fake cuBLASLt: %s: the enqueue failed (CUresult %d)\n", desc, (int)cr);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}
