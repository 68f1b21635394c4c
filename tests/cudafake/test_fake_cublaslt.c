/* test_fake_cublaslt.c - the fake cuBLASLt (fake_cublaslt.c) against a
 * reference written here from cuBLASLt's documented definitions, without
 * kiln: column-major D = alpha op(A) op(B) + beta C with every TRANSA/TRANSB
 * combination, leading dimensions larger than the rows, strided batches,
 * bf16 inputs and output, and the epilogues (BIAS, GELU_BIAS,
 * GELU_AUX_BIAS with its aux matrix, DGELU, DGELU_BGRAD, BGRADA, BGRADB);
 * then what it must refuse: an aux leading dimension that is not a multiple
 * of 8, a pointer less aligned than the heuristic was promised, an algorithm
 * used for another problem, dimensions that do not match.
 * Run by ctest as cuda_fake_cublaslt. */
#include <cublasLt.h>
#include <cuda.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #c);       \
            failures++;                                                           \
        }                                                                         \
    } while (0)

static CUstream st;
static cublasLtHandle_t lt;

static float bf(float x) /* round to bf16 and back */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static CUdeviceptr dev(size_t n)
{
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    return p;
}

static void put(CUdeviceptr p, const void *h, size_t n)
{
    void *pin;
    CHECK(cuMemAllocHost(&pin, n) == CUDA_SUCCESS);
    memcpy(pin, h, n);
    CHECK(cuMemcpyHtoDAsync(p, pin, n, st) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(st) == CUDA_SUCCESS);
    cuMemFreeHost(pin);
}

static void get(void *h, CUdeviceptr p, size_t n)
{
    void *pin;
    CHECK(cuMemAllocHost(&pin, n) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoHAsync(pin, p, n, st) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(st) == CUDA_SUCCESS);
    memcpy(h, pin, n);
    cuMemFreeHost(pin);
}

static double gelu(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double dgelu(double x)
{
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

typedef struct {
    int m, n, k, batch;
    bool ta, tb, bf16;
    uint32_t epi;
} Case;

/* element (i, j) of a column-major matrix with leading dimension ld */
#define AT(p, i, j, ld) ((p)[(size_t)(i) + (size_t)(j) * (size_t)(ld)])

static void run_case(const Case *c)
{
    int lda = (c->ta ? c->k : c->m) + 3, ldb = (c->tb ? c->n : c->k) + 2, ldc = c->m + 1;
    int ar = c->ta ? c->k : c->m, ac = c->ta ? c->m : c->k, br = c->tb ? c->n : c->k,
        bc = c->tb ? c->k : c->n;
    int64_t sa = (int64_t)lda * ac + 5, sb = (int64_t)ldb * bc + 7, sc = (int64_t)ldc * c->n + 4;
    int ldaux = (c->m + 7) / 8 * 8;
    int es = c->bf16 ? 2 : 4;
    size_t na = (size_t)(sa * c->batch), nb = (size_t)(sb * c->batch), nc = (size_t)(sc * c->batch);
    float *A = calloc(na, 4), *B = calloc(nb, 4), *D = calloc(nc, 4), *bias = calloc(64, 4),
          *aux = calloc((size_t)ldaux * c->n, 4);
    for (size_t i = 0; i < na; i++)
        A[i] = bf((float)((int)(i * 7 % 13) - 6) / 8);
    for (size_t i = 0; i < nb; i++)
        B[i] = bf((float)((int)(i * 5 % 11) - 5) / 4);
    for (int i = 0; i < 64; i++)
        bias[i] = bf((float)(i % 5) / 4 - 0.5f);
    for (int i = 0; i < ldaux * c->n; i++)
        aux[i] = bf((float)(i % 9) / 3 - 1.5f);
    /* device copies in the type under test */
    uint16_t *h16 = calloc(na + nb + nc + (size_t)ldaux * c->n + 64, 2);
    CUdeviceptr dA = dev(na * es), dB = dev(nb * es), dD = dev(nc * es), dbias = dev(64 * 4),
                daux = dev((size_t)ldaux * c->n * es);
#define PUT(dp, hp, n)                                                                     \
    do {                                                                                   \
        if (c->bf16) {                                                                     \
            for (size_t q = 0; q < (n); q++) {                                             \
                uint32_t u;                                                                \
                memcpy(&u, &(hp)[q], 4);                                                   \
                h16[q] = (uint16_t)(u >> 16);                                              \
            }                                                                              \
            put(dp, h16, (n) * 2);                                                         \
        } else                                                                             \
            put(dp, hp, (n) * 4);                                                          \
    } while (0)
    PUT(dA, A, na);
    PUT(dB, B, nb);
    PUT(dD, D, nc);
    PUT(dbias, bias, (size_t)64);
    PUT(daux, aux, (size_t)ldaux * c->n);
    cudaDataType_t t = c->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0);
    int32_t ta = c->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, 4);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, 4);
    bool bgrad = c->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD || c->epi == CUBLASLT_EPILOGUE_BGRADA ||
                 c->epi == CUBLASLT_EPILOGUE_BGRADB;
    if (c->epi) {
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &c->epi, 4);
        void *bp = (void *)dbias;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, 8);
        int32_t btype = t;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &btype, 4);
        void *xp = (void *)daux;
        int64_t xld = ldaux;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp, 8);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &xld, 8);
    }
    cublasLtMatrixLayoutCreate(&la, t, (uint64_t)ar, (uint64_t)ac, lda);
    cublasLtMatrixLayoutCreate(&lb, t, (uint64_t)br, (uint64_t)bc, ldb);
    cublasLtMatrixLayoutCreate(&lc, t, (uint64_t)c->m, (uint64_t)c->n, ldc);
    if (c->batch > 1) {
        int32_t bn = c->batch;
        int64_t s3[3] = {sa, sb, sc};
        cublasLtMatrixLayout_t l3[3] = {la, lb, lc};
        for (int i = 0; i < 3; i++) {
            cublasLtMatrixLayoutSetAttribute(l3[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bn, 4);
            cublasLtMatrixLayoutSetAttribute(l3[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &s3[i], 8);
        }
    }
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint32_t al = (uint32_t)es; /* batch strides are odd element counts */
    for (int a = CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
         a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES; a++)
        cublasLtMatmulPreferenceSetAttribute(pref, (cublasLtMatmulPreferenceAttributes_t)a, &al, 4);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &nres) == 0 &&
          nres == 1);
    float alpha = 1.5f, beta = 0.0f;
    CHECK(cublasLtMatmul(lt, op, &alpha, (void *)dA, la, (void *)dB, lb, &beta, (void *)dD, lc,
                         (void *)dD, lc, &res.algo, NULL, 0, (cudaStream_t)st) == 0);
    /* the result, read back */
    float *got = calloc(nc, 4), *gbias = calloc(64, 4), *gaux = calloc((size_t)ldaux * c->n, 4);
#define GET(hp, dp, n)                                                                     \
    do {                                                                                   \
        if (c->bf16) {                                                                     \
            get(h16, dp, (n) * 2);                                                         \
            for (size_t q = 0; q < (n); q++) {                                             \
                uint32_t u = (uint32_t)h16[q] << 16;                                       \
                memcpy(&(hp)[q], &u, 4);                                                   \
            }                                                                              \
        } else                                                                             \
            get(hp, dp, (n) * 4);                                                          \
    } while (0)
    GET(got, dD, nc);
    GET(gbias, dbias, (size_t)64);
    GET(gaux, daux, (size_t)ldaux * c->n);
    double worst = 0, bworst = 0, xworst = 0;
    double *bg = calloc(64, sizeof(double));
    for (int b = 0; b < c->batch; b++)
        for (int j = 0; j < c->n; j++)
            for (int i = 0; i < c->m; i++) {
                double s = 0;
                for (int l = 0; l < c->k; l++) {
                    double x = c->ta ? AT(A + b * sa, l, i, lda) : AT(A + b * sa, i, l, lda);
                    double y = c->tb ? AT(B + b * sb, j, l, ldb) : AT(B + b * sb, l, j, ldb);
                    s += x * y;
                }
                double v = alpha * s;
                if (c->epi == CUBLASLT_EPILOGUE_BIAS || c->epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
                    c->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
                    v += bias[i];
                if (c->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                    double e = fabs(AT(gaux, i, j, ldaux) - v) / (fabs(v) + 1e-3);
                    xworst = e > xworst ? e : xworst;
                }
                if (c->epi == CUBLASLT_EPILOGUE_GELU_BIAS || c->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
                    v = gelu(v);
                if (c->epi == CUBLASLT_EPILOGUE_DGELU || c->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD)
                    v *= dgelu(AT(aux, i, j, ldaux));
                if (c->epi == CUBLASLT_EPILOGUE_DGELU_BGRAD)
                    bg[i] += v;
                double e = fabs(AT(got + b * sc, i, j, ldc) - v) / (fabs(v) + 1e-3);
                worst = e > worst ? e : worst;
            }
    if (c->epi == CUBLASLT_EPILOGUE_BGRADA) /* op(A) summed over k: D's rows */
        for (int i = 0; i < c->m; i++)
            for (int l = 0; l < c->k; l++)
                bg[i] += c->ta ? AT(A, l, i, lda) : AT(A, i, l, lda);
    if (c->epi == CUBLASLT_EPILOGUE_BGRADB) /* op(B) summed over k: D's columns */
        for (int j = 0; j < c->n; j++)
            for (int l = 0; l < c->k; l++)
                bg[j] += c->tb ? AT(B, j, l, ldb) : AT(B, l, j, ldb);
    if (bgrad)
        for (int i = 0; i < (c->epi == CUBLASLT_EPILOGUE_BGRADB ? c->n : c->m); i++) {
            double e = fabs(gbias[i] - bg[i]) / (fabs(bg[i]) + 1e-3);
            bworst = e > bworst ? e : bworst;
        }
    double tol = c->bf16 ? 1e-2 : 1e-5;
    printf("m %d n %d k %d batch %d ta %d tb %d %s epilogue %u: D %.1e, bias grad %.1e, aux %.1e\n",
           c->m, c->n, c->k, c->batch, c->ta, c->tb, c->bf16 ? "bf16" : "f32", c->epi, worst,
           bworst, xworst);
    CHECK(worst < tol && bworst < tol && xworst < tol);
    free(A), free(B), free(D), free(bias), free(aux), free(h16), free(got), free(gbias);
    free(gaux), free(bg);
}

/* the refusals */
static void refusals(void)
{
    CUdeviceptr p = dev(1 << 16);
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t l8, l6;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&l8, CUDA_R_32F, 8, 8, 8);
    cublasLtMatrixLayoutCreate(&l6, CUDA_R_32F, 6, 8, 8);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    /* dimensions that do not match: op(A) 8x8 against B 6x8 */
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, l8, l6, l8, l8, NULL, 1, &res, &nres) ==
          CUBLAS_STATUS_INVALID_VALUE);
    /* an algorithm for another problem */
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, l8, l8, l8, l8, NULL, 1, &res, &nres) == 0);
    float one = 1, zero = 0;
    CHECK(cublasLtMatmul(lt, op, &one, (void *)p, l6, (void *)p, l8, &zero, (void *)p, l6,
                         (void *)p, l6, &res.algo, NULL, 0, (cudaStream_t)st) ==
          CUBLAS_STATUS_INVALID_VALUE);
    /* a pointer less aligned than promised (256 by default) */
    CHECK(cublasLtMatmul(lt, op, &one, (void *)(p + 16), l8, (void *)p, l8, &zero,
                         (void *)(p + 4096), l8, (void *)(p + 4096), l8, &res.algo, NULL, 0,
                         (cudaStream_t)st) == CUBLAS_STATUS_INVALID_VALUE);
    /* an aux leading dimension that is not a multiple of 8 */
    uint32_t e = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    void *bp = (void *)p;
    int64_t ld = 12;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, 4);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, 8);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &bp, 8);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, 8);
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, l8, l8, l8, l8, NULL, 1, &res, &nres) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cuStreamSynchronize(st) == CUDA_SUCCESS);
}

int main(void)
{
    CUcontext ctx;
    CHECK(cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
          cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
          cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cublasLtCreate(&lt) == 0);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                Case c = {5, 7, 6, 3, ta, tb, bf16, 0};
                run_case(&c);
            }
    const uint32_t epis[] = {CUBLASLT_EPILOGUE_BIAS,        CUBLASLT_EPILOGUE_GELU_BIAS,
                             CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU,
                             CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,
                             CUBLASLT_EPILOGUE_BGRADB};
    for (size_t i = 0; i < sizeof epis / sizeof epis[0]; i++)
        for (int t = 0; t < 2; t++) {
            Case c = {9, 4, 5, 1, t, !t, false, epis[i]};
            run_case(&c);
        }
    refusals();
    if (failures)
        printf("%d checks failed\n", failures);
    return failures ? 1 : 0;
}
