/* test_cuda_nccl.c - runtime/cuda/cuda_nccl.c (the CUDA module's NCCL
 * all-reduces) against stand-ins for the CUDA driver and NCCL, so that its
 * logic runs on machines without a GPU or NCCL.
 *
 * The test compiles, with the host C compiler and the CUDA toolkit's
 * headers (skipped when there are none): a fake libcuda.so.1 (events get
 * time stamps: 1 ms per record on the compute stream; each record on the
 * communication stream comes 10 ms after the later of the last one there
 * and the compute clock), a fake libnccl.so.2 (records its calls), and
 * cuda_nccl.c itself (with the module's helpers, cuda_module.c) as a
 * shared object. Both fakes are loaded by path before cuda_nccl.c opens them
 * by soname, and write one log of every call.
 * Each case runs in a child process (cuda_nccl.c opens NCCL once).
 *
 * Checked on the plan of a 3-layer MLP for 2 ranks (several buckets): the
 * unique id (made on rank 0, broadcast, handed to ncclCommInitRank with
 * the rank and size), per bucket the stream order (ready event on the
 * compute stream, the communication stream waits on it, start stamp, one
 * NCCL group of in-place ncclAllReduce(f32, ncclAvg) over exactly the
 * bucket's tensors at arena + their device offsets, done event; the first wait of a
 * bucket records a stamp and makes the compute stream wait on done, later
 * ones add nothing), the statistics (one busy interval per bucket, 10 ms
 * each, the exposed time from the stamps), two runs, errors (a bf16
 * gradient, NCCL too old, a wait before its start).
 *
 * Bounded host waits (kc_wait_stream, kc_wait_event): the fake stream
 * finishes after a set number of cuStreamQuery calls (or never), an event
 * has finished when its stamp is at or before a set clock. An all-reduce
 * begun and never finished (a hung peer) makes a wait give up after the
 * group's timeout (0.2 s here), abort the communicator and call the group's
 * lost callback naming the bucket; a stream that finishes after a few polls,
 * or long compute with no all-reduce in flight, does not time out.
 *
 * The backend's host waits (backend_cuda.c with the module's other files,
 * a stub for NVRTC and a fake cuBLASLt, on the same fake driver): two
 * training steps through the Backend table (host writes past the staging
 * buffer, every plan step, reads of the outputs, device timing, sync,
 * destroy) make blocking waits (cuStreamSynchronize, cuEventSynchronize)
 * without all-reduces on the device, and none at all with them: every one
 * of those waits is then a bounded poll (cuStreamQuery, cuEventQuery), so a
 * hung peer cannot block the host forever.
 *
 * Without the CUDA toolkit's headers or a C compiler every case is skipped
 * and the test exits 77 (ctest: Skipped). */
#include "cg_cuda.h"
#include "frontend.h"
#include "runtime.h"
#include "testutil.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KILN_C_COMPILER
#define KILN_C_COMPILER "cc"
#endif

static const char fake_cuda[] =
    "#include <cuda.h>\n"
    "#include <stdarg.h>\n"
    "#include <stdint.h>\n"
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "#include <string.h>\n"
    "char fake_log[1 << 20];\n"
    "int fake_len;\n"
    "static double now_ms, comm_ms, stamp[4096];\n"
    "static int nev;\n"
    "void fake_say(const char *fmt, ...) {\n"
    "  va_list ap; va_start(ap, fmt);\n"
    "  fake_len += vsnprintf(fake_log + fake_len, sizeof fake_log - (size_t)fake_len, fmt, ap);\n"
    "  va_end(ap);\n"
    "}\n"
    "double fake_stamp(int e) { return stamp[e]; }\n"
    "static int id(CUevent e) { return (int)(uintptr_t)e; }\n"
    "static int sid(CUstream s) { return (int)(uintptr_t)s; }\n"
    "CUresult cuGetErrorString(CUresult r, const char **s) { (void)r; *s = \"fake\"; return CUDA_SUCCESS; }\n"
    "CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return CUDA_SUCCESS; }\n"
    "CUresult cuEventCreate(CUevent *e, unsigned int f) {\n"
    "  if (nev >= 4095) return CUDA_ERROR_OUT_OF_MEMORY;\n"
    "  *e = (CUevent)(uintptr_t)(++nev);\n"
    "  fake_say(\"create E%d%s\\n\", nev, f & CU_EVENT_DISABLE_TIMING ? \" notiming\" : \"\");\n"
    "  return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuEventDestroy(CUevent e) { fake_say(\"destroy E%d\\n\", id(e)); return CUDA_SUCCESS; }\n"
    "CUresult cuEventRecord(CUevent e, CUstream s) {\n"
    "  now_ms += 1;\n"
    "  if (sid(s) == 2) { comm_ms = (comm_ms > now_ms ? comm_ms : now_ms) + 10; stamp[id(e)] = comm_ms; }\n"
    "  else stamp[id(e)] = now_ms;\n"
    "  fake_say(\"record E%d S%d\\n\", id(e), sid(s));\n"
    "  return CUDA_SUCCESS;\n"
    "}\n"
    "int fake_blocking;\n" /* blocking host waits: cuStreamSynchronize, cuEventSynchronize */
    "CUresult cuEventSynchronize(CUevent e) { (void)e; fake_blocking++; return CUDA_SUCCESS; }\n"
    "CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {\n"
    "  *ms = (float)(stamp[id(b)] - stamp[id(a)]); return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) {\n"
    "  (void)f; fake_say(\"wait S%d E%d\\n\", sid(s), id(e)); return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuStreamSynchronize(CUstream s) {\n"
    "  fake_blocking++; fake_say(\"sync S%d\\n\", sid(s)); return CUDA_SUCCESS;\n"
    "}\n"
    "double fake_clock = 1e30;\n"
    "int fake_stream_busy, fake_queries;\n"
    "CUresult cuStreamQuery(CUstream s) {\n"
    "  fake_queries++;\n"
    "  if (fake_stream_busy != 0) { if (fake_stream_busy > 0) fake_stream_busy--; return CUDA_ERROR_NOT_READY; }\n"
    "  fake_say(\"query S%d done\\n\", sid(s)); return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuEventQuery(CUevent e) {\n"
    "  fake_queries++; return stamp[id(e)] <= fake_clock ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;\n"
    "}\n"
    "CUevent fake_begin(void) { CUevent e; cuEventCreate(&e, 0); cuEventRecord(e, (CUstream)1); return e; }\n"
    /* the rest of the driver the backend opens: one sm_90 device; device
     * memory is address space only (nothing reads it), host memory real;
     * streams alternate S1 (compute), S2 (communication) */
    "CUresult cuInit(unsigned int f) { (void)f; return CUDA_SUCCESS; }\n"
    "CUresult cuGetErrorName(CUresult r, const char **s) { (void)r; *s = \"FAKE\"; return CUDA_SUCCESS; }\n"
    "CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }\n"
    "CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }\n"
    "CUresult cuDeviceGet(CUdevice *d, int o) { *d = o; return CUDA_SUCCESS; }\n"
    "CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {\n"
    "  (void)d; *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0; return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuDeviceGetName(char *s, int n, CUdevice d) { (void)d; snprintf(s, (size_t)n, \"fake\"); return CUDA_SUCCESS; }\n"
    "CUresult cuDeviceTotalMem(size_t *b, CUdevice d) { (void)d; *b = (size_t)1 << 36; return CUDA_SUCCESS; }\n"
    "CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)9; return CUDA_SUCCESS; }\n"
    "CUresult cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return CUDA_SUCCESS; }\n"
    "static CUdeviceptr next_dev = 0x10000000ull;\n"
    "CUresult cuMemAlloc(CUdeviceptr *p, size_t n) { *p = next_dev; next_dev += (n + 4095) / 4096 * 4096; return CUDA_SUCCESS; }\n"
    "CUresult cuMemFree(CUdeviceptr p) { (void)p; return CUDA_SUCCESS; }\n"
    "CUresult cuMemAllocHost(void **p, size_t n) { *p = calloc(1, n); return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }\n"
    "CUresult cuMemFreeHost(void *p) { free(p); return CUDA_SUCCESS; }\n"
    "CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) { (void)p; (void)v; (void)n; (void)s; return CUDA_SUCCESS; }\n"
    "CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) {\n"
    "  (void)d; (void)s; (void)n; (void)st; return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) {\n"
    "  (void)s; (void)st; memset(d, 0, n); return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {\n"
    "  (void)d; (void)s; (void)n; (void)st; return CUDA_SUCCESS;\n"
    "}\n"
    "static int nstream;\n"
    "CUresult cuStreamCreate(CUstream *s, unsigned int f) { (void)f; *s = (CUstream)(uintptr_t)(1 + nstream++ % 2); return CUDA_SUCCESS; }\n"
    "CUresult cuStreamDestroy(CUstream s) { (void)s; return CUDA_SUCCESS; }\n"
    "CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode m) { (void)s; (void)m; return CUDA_ERROR_NOT_SUPPORTED; }\n"
    "CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { (void)s; (void)g; return CUDA_ERROR_NOT_SUPPORTED; }\n"
    "CUresult cuModuleLoadData(CUmodule *m, const void *img) { *m = (CUmodule)9; return img ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE; }\n"
    "CUresult cuModuleUnload(CUmodule m) { (void)m; return CUDA_SUCCESS; }\n"
    "CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *n) { (void)m; (void)n; *f = (CUfunction)9; return CUDA_SUCCESS; }\n"
    "int fake_launches;\n"
    "CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,\n"
    "                        unsigned bz, unsigned sh, CUstream s, void **args, void **extra) {\n"
    "  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)args;\n"
    "  (void)extra; fake_launches++; return CUDA_SUCCESS;\n"
    "}\n"
    "CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long f) { (void)e; (void)g; (void)f; return CUDA_ERROR_NOT_SUPPORTED; }\n"
    "CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { (void)e; (void)s; return CUDA_ERROR_NOT_SUPPORTED; }\n"
    "CUresult cuGraphExecDestroy(CUgraphExec e) { (void)e; return CUDA_SUCCESS; }\n"
    "CUresult cuGraphDestroy(CUgraph g) { (void)g; return CUDA_SUCCESS; }\n";

static const char fake_nccl[] =
    "#include <nccl.h>\n"
    "#include <stdint.h>\n"
    "#include <stdlib.h>\n"
    "#include <string.h>\n"
    "void fake_say(const char *fmt, ...);\n"
    "ncclResult_t ncclGetVersion(int *v) {\n"
    "  const char *e = getenv(\"FAKE_NCCL_VERSION\"); *v = e ? atoi(e) : 22809; return ncclSuccess;\n"
    "}\n"
    "ncclResult_t ncclGetUniqueId(ncclUniqueId *u) {\n"
    "  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) u->internal[i] = (char)(i * 3 + 1);\n"
    "  fake_say(\"uniqueid\\n\"); return ncclSuccess;\n"
    "}\n"
    "ncclResult_t ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId u, int r) {\n"
    "  *c = (ncclComm_t)(uintptr_t)0x77;\n"
    "  fake_say(\"init n=%d rank=%d id=%d,%d\\n\", n, r, u.internal[0], u.internal[127]);\n"
    "  return ncclSuccess;\n"
    "}\n"
    /* non-blocking setup (NCCL 2.14): in progress for FAKE_NCCL_SETUP_POLLS
     * polls (-1: forever, a peer that never joins) */
    "static int setup_left;\n"
    "ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId u, int r, ncclConfig_t *cf) {\n"
    "  *c = (ncclComm_t)(uintptr_t)0x77;\n"
    "  const char *e = getenv(\"FAKE_NCCL_SETUP_POLLS\"); setup_left = e ? atoi(e) : 2;\n"
    "  fake_say(\"init n=%d rank=%d id=%d,%d blocking=%d\\n\", n, r, u.internal[0], u.internal[127], cf->blocking);\n"
    "  return ncclInProgress;\n"
    "}\n"
    "ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {\n"
    "  (void)c; if (setup_left == 0) { *st = ncclSuccess; return ncclSuccess; }\n"
    "  if (setup_left > 0) setup_left--;\n"
    "  *st = ncclInProgress; return ncclSuccess;\n"
    "}\n"
    "ncclResult_t ncclCommDestroy(ncclComm_t c) { fake_say(\"commdestroy %d\\n\", (int)(uintptr_t)c); return ncclSuccess; }\n"
    "ncclResult_t ncclCommAbort(ncclComm_t c) { fake_say(\"commabort %d\\n\", (int)(uintptr_t)c); return ncclSuccess; }\n"
    "ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,\n"
    "                           ncclComm_t c, cudaStream_t st) {\n"
    "  fake_say(\"allreduce %llu %llu %zu t=%d op=%d c=%d S%d\\n\", (unsigned long long)(uintptr_t)s,\n"
    "           (unsigned long long)(uintptr_t)r, n, (int)t, (int)op, (int)(uintptr_t)c, (int)(uintptr_t)st);\n"
    "  return ncclSuccess;\n"
    "}\n"
    "ncclResult_t ncclGroupStart(void) { fake_say(\"groupstart\\n\"); return ncclSuccess; }\n"
    "ncclResult_t ncclGroupEnd(void) { fake_say(\"groupend\\n\"); return ncclSuccess; }\n"
    "const char *ncclGetErrorString(ncclResult_t r) { (void)r; return \"fake nccl error\"; }\n";

/* cuBLASLt for the backend: every call succeeds, the heuristic offers one
 * algorithm, a matmul is counted. */
static const char fake_cublaslt[] =
    "#include <cublasLt.h>\n"
    "static int obj;\n"
    "int fake_matmuls;\n"
    "cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (cublasLtHandle_t)&obj; return CUBLAS_STATUS_SUCCESS; }\n"
    "cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { (void)h; return CUBLAS_STATUS_SUCCESS; }\n"
    "cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t s) {\n"
    "  (void)c; (void)s; *d = (cublasLtMatmulDesc_t)&obj; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n"
    "cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { (void)d; return CUBLAS_STATUS_SUCCESS; }\n"
    "cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,\n"
    "                                              const void *b, size_t n) {\n"
    "  (void)d; (void)a; (void)b; (void)n; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n"
    "cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t r, uint64_t c,\n"
    "                                          int64_t ld) {\n"
    "  (void)t; (void)r; (void)c; (void)ld; *l = (cublasLtMatrixLayout_t)&obj; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n"
    "cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { (void)l; return CUBLAS_STATUS_SUCCESS; }\n"
    "cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,\n"
    "                                                const void *b, size_t n) {\n"
    "  (void)l; (void)a; (void)b; (void)n; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n"
    "cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {\n"
    "  *p = (cublasLtMatmulPreference_t)&obj; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n"
    "cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { (void)p; return CUBLAS_STATUS_SUCCESS; }\n"
    "cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,\n"
    "                                                    cublasLtMatmulPreferenceAttributes_t a, const void *b,\n"
    "                                                    size_t n) {\n"
    "  (void)p; (void)a; (void)b; (void)n; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n"
    "cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t o,\n"
    "    cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,\n"
    "    cublasLtMatmulPreference_t p, int req, cublasLtMatmulHeuristicResult_t r[], int *n) {\n"
    "  (void)h; (void)o; (void)a; (void)b; (void)c; (void)d; (void)p; (void)req;\n"
    "  r[0] = (cublasLtMatmulHeuristicResult_t){0}; *n = 1; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n"
    "cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t o, const void *al, const void *A,\n"
    "    cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *be, const void *C,\n"
    "    cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t *alg,\n"
    "    void *ws, size_t wn, cudaStream_t s) {\n"
    "  (void)h; (void)o; (void)al; (void)A; (void)ad; (void)B; (void)bd; (void)be; (void)C; (void)cd; (void)D;\n"
    "  (void)dd; (void)alg; (void)ws; (void)wn; (void)s; fake_matmuls++; return CUBLAS_STATUS_SUCCESS;\n"
    "}\n";

/* NVRTC's place in the backend (cuda_nvrtc.c's entry points): a cubin of
 * 16 bytes the fake driver loads, whatever the source. */
static const char stub_nvrtc[] =
    "#include \"cuda_module.h\"\n"
    "#include <stdlib.h>\n"
    "bool kiln_cuda_compile(const char *src, const char *arch, const char *cache_dir, bool verbose,\n"
    "                       RtCudaBinary *b, Diag *d) {\n"
    "  (void)arch; (void)cache_dir; (void)verbose; (void)d;\n"
    "  *b = (RtCudaBinary){.cubin = calloc(1, 16), .size = 16, .log = calloc(1, 1)};\n"
    "  return src && *src;\n"
    "}\n"
    "void kiln_cuda_binary_free(RtCudaBinary *b) { free(b->cubin); free(b->log); }\n";

/* cuda_nccl.c's entry points, with CUDA's handle types spelled plainly
 * (CUcontext, CUstream, CUevent are pointers; CUdeviceptr is unsigned long
 * long on 64-bit Linux). */
typedef struct KcComm KcComm;
typedef KcComm *(*OpenFn)(const RtCommGroup *, const CgPlan *, const DType *, const int64_t *,
                          unsigned long long, void *, void *, void *, Diag *);
typedef void (*CloseFn)(KcComm *);
typedef void (*BeginsFn)(KcComm *);
typedef bool (*StepFn)(KcComm *, int, Diag *);
typedef int (*EventsFn)(KcComm *, void *, double, RtCommEvent *, int, double *);
typedef int (*WaitFn)(KcComm *, void *); /* CUresult kc_wait_stream/kc_wait_event */

static char *dir, *cuda_inc;
static const unsigned long long ARENA = 0x10000000ull;

static char *find_cuda_include(void)
{
    const char *home = getenv("CUDA_HOME");
    char *c[8] = {0};
    int n = 0;
    if (home && *home)
        c[n++] = xasprintf("%s/include", home);
    c[n++] = xstrdup("/usr/local/cuda/include");
    DIR *d = opendir("/usr/local");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 7)
        if (strncmp(e->d_name, "cuda-", 5) == 0)
            c[n++] = xasprintf("/usr/local/%s/include", e->d_name);
    if (d)
        closedir(d);
    char *found = NULL;
    for (int i = 0; i < n; i++) {
        char *a = xasprintf("%s/cuda.h", c[i]), *b = xasprintf("%s/nccl.h", c[i]);
        if (!found && access(a, R_OK) == 0 && access(b, R_OK) == 0)
            found = xstrdup(c[i]);
        free(a);
        free(b);
        free(c[i]);
    }
    return found;
}

static void compile(const char *what, const char *src, const char *extra)
{
    char *path = xasprintf("%s/%s.c", dir, what);
    write_file(path, src);
    char *cmd = xasprintf("'%s' -std=c11 -D_GNU_SOURCE -Wall -Werror -fPIC -shared -I'%s' %s "
                          "-o '%s/%s' '%s' 2>&1",
                          KILN_C_COMPILER, cuda_inc, extra, dir, what, path);
    run_or_fail(cmd);
    free(cmd);
    free(path);
}

/* Whether the host C compiler runs. */
static bool have_compiler(void)
{
    char *cmd = xasprintf("'%s' --version >/dev/null 2>&1", KILN_C_COMPILER);
    int r = system(cmd);
    free(cmd);
    return r == 0;
}

static int setup(void **state)
{
    (void)state;
    if (!have_compiler())
        return 0;
    cuda_inc = find_cuda_include();
    if (!cuda_inc)
        return 0;
    dir = scratch_dir("cuda-nccl");
    compile("libcuda.so.1", fake_cuda, "-Wl,-soname,libcuda.so.1");
    char *ln = xasprintf("'%s/libcuda.so.1' -Wl,-soname,libnccl.so.2 -Wl,-rpath,'%s'", dir, dir);
    compile("libnccl.so.2", fake_nccl, ln);
    free(ln);
    char *cmd = xasprintf("'%s' -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow "
                          "-Wmissing-prototypes -Werror -fPIC -shared -Iir -Ipasses -Icodegen "
                          "-Iruntime -Iruntime/cuda -I'%s' -o '%s/kcnccl.so' runtime/cuda/cuda_nccl.c "
                          "runtime/cuda/cuda_pp.c runtime/cuda/nccl_open.c runtime/cuda/cuda_module.c "
                          "-ldl 2>&1",
                          KILN_C_COMPILER, cuda_inc, dir);
    run_or_fail(cmd);
    free(cmd);
    /* the backend: the module's files but NVRTC, against the fake cuBLASLt;
     * like libkiln_cuda.so it must link nothing of kilncore */
    compile("libfakecublaslt.so", fake_cublaslt, "-Wl,-soname,libfakecublaslt.so");
    char *stub = xasprintf("%s/stub_nvrtc.c", dir);
    write_file(stub, stub_nvrtc);
    cmd = xasprintf("'%s' -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wmissing-prototypes "
                    "-Werror -fPIC -shared -Iir -Ipasses -Icodegen -Iruntime -Iruntime/cuda "
                    "-I'%s' -o '%s/kcbackend.so' runtime/cuda/backend_cuda.c "
                    "runtime/cuda/driver.c runtime/cuda/gemm_plan.c runtime/cuda/cublaslt.c "
                    "runtime/cuda/cuda_module.c runtime/cuda/cuda_nccl.c runtime/cuda/cuda_pp.c "
                    "runtime/cuda/nccl_open.c '%s' "
                    "'%s/libfakecublaslt.so' -Wl,-rpath,'%s' -Wl,--no-undefined -ldl 2>&1",
                    KILN_C_COMPILER, cuda_inc, dir, stub, dir, dir);
    run_or_fail(cmd);
    free(cmd);
    free(stub);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (dir)
        remove_tree(dir);
    free(dir);
    free(cuda_inc);
    return 0;
}

/* ---- in the child ---------------------------------------------------------- */

static void *lib(const char *name, bool global)
{
    char *p = xasprintf("%s/%s", dir, name);
    void *h = dlopen(p, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", p, dlerror());
        _exit(3);
    }
    free(p);
    return h;
}

static void *sym(void *h, const char *name)
{
    void *s = dlsym(h, name);
    if (!s) {
        fprintf(stderr, "no %s\n", name);
        _exit(3);
    }
    return s;
}

#define EXPECT(c, ...)                                                        \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "line %d: %s: ", __LINE__, #c);                   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            _exit(1);                                                         \
        }                                                                     \
    } while (0)

static const int64_t *dev_off; /* the device offsets handed to kc_comm_open */
static char *log_text;
static int *log_len;

/* The next log line at *at (advanced); "" at the end. */
static const char *next_line(int *at, char *buf, size_t n)
{
    buf[0] = 0;
    if (*at >= *log_len)
        return buf;
    const char *s = log_text + *at, *e = strchr(s, '\n');
    size_t k = e ? (size_t)(e - s) : strlen(s);
    snprintf(buf, n, "%.*s", (int)k, s);
    *at += (int)k + 1;
    return buf;
}

static int bcast_calls;
static bool fake_bcast(void *arg, void *buf, size_t n)
{
    (void)arg;
    bcast_calls++;
    EXPECT(n == 128, "broadcast of %zu bytes (an NCCL id is 128)", n);
    for (size_t i = 0; i < n; i++)
        ((char *)buf)[i] = (char)(i * 3 + 1); /* what rank 0's id holds */
    return true;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int lost_calls;
static char lost_what[256];
static void fake_lost(void *arg, const char *what)
{
    (void)arg;
    lost_calls++;
    snprintf(lost_what, sizeof lost_what, "%s", what);
}

static int first_bucket = -1, first_t0 = -1, last_done = -1; /* of the last run_once */

static CgPlan *mlp_plan(void)
{
    char err[2048];
    const char *sets[] = {"depth=3"};
    Model *m = fe_load_model("models/mlp.lua", sets, 1, err, sizeof err);
    EXPECT(m != NULL, "%s", err);
    Graph *g = ir_clone(m->g);
    fe_model_free(m);
    PassOpts o;
    pass_opts_default(&o);
    o.nranks = 2;
    o.bucket_bytes = 1024;
    Diag d = {{0}};
    EXPECT(pass_pipeline(g, &o, NULL, NULL, NULL, &d), "%s", d.msg);
    CgPlan *p = cg_plan(g, &d);
    EXPECT(p != NULL, "%s", d.msg);
    return p;
}

/* Runs the plan's allreduce steps through kc, checking the log as it goes;
 * returns the number of buckets. */
static int run_once(void *kh, KcComm *k, const CgPlan *p, void *begin, double *exposed_want,
                    double *stamp_sum)
{
    BeginsFn begins = (BeginsFn)sym(kh, "kc_comm_run_begins");
    StepFn start = (StepFn)sym(kh, "kc_allreduce_start");
    StepFn wait = (StepFn)sym(kh, "kc_allreduce_wait");
    double (*stamp)(int) = (double (*)(int))sym(RTLD_DEFAULT, "fake_stamp");
    begins(k);
    Diag d = {{0}};
    int nb = 0;
    int done_of[256], w_of[256];
    bool waited[256] = {0};
    *exposed_want = 0;
    *stamp_sum = 0;
    char l[256];
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        int at = *log_len;
        if (st->kind == CG_STEP_ALLREDUCE_START) {
            EXPECT(st->bucket < 256, "bucket %d", st->bucket);
            EXPECT(start(k, s, &d), "start of step %d: %s", s, d.msg);
            nb++;
            int ready = -1, t0 = -1, e = -1, x = -1;
            EXPECT(sscanf(next_line(&at, l, sizeof l), "record E%d S1", &ready) == 1, "%s", l);
            EXPECT(sscanf(next_line(&at, l, sizeof l), "wait S2 E%d", &e) == 1 && e == ready,
                   "%s (expected the comm stream to wait on E%d)", l, ready);
            EXPECT(sscanf(next_line(&at, l, sizeof l), "record E%d S2", &t0) == 1, "%s", l);
            EXPECT(strcmp(next_line(&at, l, sizeof l), "groupstart") == 0, "%s", l);
            for (int i = 0; i < st->nargs; i++) {
                int t = st->args[i];
                unsigned long long sp, rp;
                size_t cnt;
                int ty, op, c, sid;
                EXPECT(sscanf(next_line(&at, l, sizeof l), "allreduce %llu %llu %zu t=%d op=%d c=%d S%d",
                              &sp, &rp, &cnt, &ty, &op, &c, &sid) == 7,
                       "%s", l);
                unsigned long long want = ARENA + (unsigned long long)dev_off[t];
                EXPECT(sp == want && rp == want, "tensor %s at %llu/%llu, expected %llu in place",
                       p->g->t.v[t].name, sp, rp, want);
                EXPECT(cnt == (size_t)shape_numel(&p->g->t.v[t].s), "count %zu", cnt);
                EXPECT(ty == 7 && op == 4 && c == 0x77 && sid == 2,
                       "type %d op %d comm %d stream %d (expected f32=7, avg=4, 0x77, S2)", ty,
                       op, c, sid);
            }
            EXPECT(strcmp(next_line(&at, l, sizeof l), "groupend") == 0, "%s", l);
            EXPECT(sscanf(next_line(&at, l, sizeof l), "record E%d S2", &x) == 1, "%s", l);
            done_of[st->bucket] = x;
            if (nb == 1) {
                first_bucket = st->bucket;
                first_t0 = t0;
            }
            last_done = x;
            *stamp_sum += stamp(x) - stamp(t0);
            waited[st->bucket] = false;
            EXPECT(at == *log_len, "more calls than expected: %s", log_text + at);
        } else if (st->kind == CG_STEP_ALLREDUCE_WAIT) {
            EXPECT(wait(k, s, &d), "wait of step %d: %s", s, d.msg);
            if (waited[st->bucket]) {
                EXPECT(at == *log_len, "a second wait of bucket %d did something: %s",
                       st->bucket, log_text + at);
                continue;
            }
            int w = -1, e = -1;
            EXPECT(sscanf(next_line(&at, l, sizeof l), "record E%d S1", &w) == 1, "%s", l);
            EXPECT(sscanf(next_line(&at, l, sizeof l), "wait S1 E%d", &e) == 1 &&
                       e == done_of[st->bucket],
                   "%s (expected the compute stream to wait on E%d)", l, done_of[st->bucket]);
            EXPECT(at == *log_len, "more calls than expected: %s", log_text + at);
            waited[st->bucket] = true;
            w_of[st->bucket] = w;
            double x = stamp(done_of[st->bucket]) - stamp(w);
            if (x > 0)
                *exposed_want += 1e-3 * x;
        }
    }
    (void)w_of;
    (void)begin;
    return nb;
}

static int child(const char *which)
{
    void *ch = lib("libcuda.so.1", true);
    void *nh = NULL;
    nh = lib("libnccl.so.2", false);
    (void)nh;
    void *kh = lib("kcnccl.so", false);
    log_text = sym(ch, "fake_log");
    log_len = sym(ch, "fake_len");
    OpenFn open = (OpenFn)sym(kh, "kc_comm_open");
    CloseFn close_ = (CloseFn)sym(kh, "kc_comm_close");
    EventsFn events = (EventsFn)sym(kh, "kc_comm_events");
    StepFn wait = (StepFn)sym(kh, "kc_allreduce_wait");
    void *(*begin_ev)(void) = (void *(*)(void))sym(ch, "fake_begin");
    CgPlan *p = mlp_plan();
    DType *storage = xmalloc(sizeof(DType) * (size_t)(p->g->t.n + 1));
    for (int i = 0; i < p->g->t.n; i++)
        storage[i] = p->g->t.v[i].s.dtype;
    /* the device arena's own offsets (CgCudaProgram.mem), unlike the plan's */
    int64_t *offset = xmalloc(sizeof(int64_t) * (size_t)(p->g->t.n + 1));
    for (int i = 0; i < p->g->t.n; i++)
        offset[i] = p->mem->offset[i] + 4096;
    dev_off = offset;
    Diag d = {{0}};
    RtCommGroup g = {.rank = 1, .size = 2, .local_rank = 1, .bcast = fake_bcast};
    if (strcmp(which, "rank0") == 0)
        g.rank = g.local_rank = 0;
    if (strcmp(which, "bf16") == 0) {
        for (int s = 0; s < p->steps.n; s++)
            if (p->steps.v[s].kind == CG_STEP_ALLREDUCE_START)
                storage[p->steps.v[s].args[0]] = DT_BF16;
        KcComm *k = open(&g, p, storage, offset, ARENA, (void *)9, (void *)1, (void *)2, &d);
        EXPECT(!k && strstr(d.msg, "only f32"), "bf16 gradient: %s", d.msg);
        return 0;
    }
    if (strcmp(which, "old") == 0) {
        KcComm *k = open(&g, p, storage, offset, ARENA, (void *)9, (void *)1, (void *)2, &d);
        EXPECT(!k && strstr(d.msg, "NCCL is too old") && strstr(d.msg, "2 ranks"),
               "old NCCL: %s", d.msg);
        return 0;
    }
    int at = *log_len;
    KcComm *k = open(&g, p, storage, offset, ARENA, (void *)9, (void *)1, (void *)2, &d);
    EXPECT(k != NULL, "kc_comm_open: %s", d.msg);
    /* the id: made on rank 0 only, broadcast, handed to ncclCommInitRank */
    bool made = strstr(log_text + at, "uniqueid\n") != NULL;
    EXPECT(made == (g.rank == 0), "rank %d %s the unique id", g.rank, made ? "made" : "did not make");
    EXPECT(bcast_calls == 1, "%d broadcasts", bcast_calls);
    char want[64];
    snprintf(want, sizeof want, "init n=2 rank=%d id=1,126\n", g.rank); /* (char)(127*3+1) */
    EXPECT(strstr(log_text + at, want), "no `%s` in:\n%s", want, log_text + at);
    /* a wait before any start is an error */
    int wstep = -1;
    for (int s = 0; s < p->steps.n && wstep < 0; s++)
        if (p->steps.v[s].kind == CG_STEP_ALLREDUCE_WAIT)
            wstep = s;
    EXPECT(wstep >= 0, "no wait step");
    EXPECT(!wait(k, wstep, &d) && strstr(d.msg, "has not started"), "early wait: %s", d.msg);
    for (int run = 0; run < 2; run++) {
        void *begin = begin_ev();
        double exposed_want, busy;
        int nb = run_once(kh, k, p, begin, &exposed_want, &busy);
        EXPECT(nb >= 3, "%d buckets (expected several)", nb);
        RtCommEvent ev[64];
        double exposed = -1;
        int n = events(k, begin, 100.0, ev, 64, &exposed);
        EXPECT(n == nb, "%d events for %d buckets", n, nb);
        double sum = 0;
        for (int i = 0; i < n; i++) {
            EXPECT(ev[i].start >= 100.0 && ev[i].end > ev[i].start, "event %d: %g..%g", i,
                   ev[i].start, ev[i].end);
            EXPECT(ev[i].end - ev[i].start > 0.0099 && ev[i].end - ev[i].start < 0.0101,
                   "bucket %d busy %g s (expected 10 ms)", ev[i].bucket,
                   ev[i].end - ev[i].start);
            EXPECT(i == 0 || ev[i].start >= ev[i - 1].end - 1e-9, "overlapping busy intervals");
            sum += ev[i].end - ev[i].start;
        }
        EXPECT(sum > 1e-3 * busy - 1e-6 && sum < 1e-3 * busy + 1e-6, "busy %g vs %g", sum,
               1e-3 * busy);
        EXPECT(exposed > exposed_want - 1e-6 && exposed < exposed_want + 1e-6 &&
                   exposed_want > 0,
               "exposed %g s, expected %g s", exposed, exposed_want);
        EXPECT(events(k, begin, 100.0, ev, 64, &exposed) == 0 && exposed == 0,
               "the same run collected twice");
    }
    at = *log_len;
    close_(k);
    EXPECT(strstr(log_text + at, "query S2 done\n") && strstr(log_text + at, "commdestroy 119\n"),
           "close: %s", log_text + at);
    return 0;
}

/* A run's all-reduces enqueued, then one bounded wait (`which`: hang_stream,
 * hang_event, slow, compute) with the group's timeout of 0.2 s. */
static int child_wait(const char *which)
{
    void *ch = lib("libcuda.so.1", true);
    lib("libnccl.so.2", false);
    void *kh = lib("kcnccl.so", false);
    log_text = sym(ch, "fake_log");
    log_len = sym(ch, "fake_len");
    double *clock = sym(ch, "fake_clock");
    int *busy = sym(ch, "fake_stream_busy"), *queries = sym(ch, "fake_queries");
    double (*stamp)(int) = (double (*)(int))sym(ch, "fake_stamp");
    OpenFn open = (OpenFn)sym(kh, "kc_comm_open");
    WaitFn wait_stream = (WaitFn)sym(kh, "kc_wait_stream");
    WaitFn wait_event = (WaitFn)sym(kh, "kc_wait_event");
    void *(*begin_ev)(void) = (void *(*)(void))sym(ch, "fake_begin");
    CgPlan *p = mlp_plan();
    DType *storage = xmalloc(sizeof(DType) * (size_t)(p->g->t.n + 1));
    int64_t *offset = xmalloc(sizeof(int64_t) * (size_t)(p->g->t.n + 1));
    for (int i = 0; i < p->g->t.n; i++) {
        storage[i] = p->g->t.v[i].s.dtype;
        offset[i] = p->mem->offset[i] + 4096;
    }
    dev_off = offset;
    Diag d = {{0}};
    RtCommGroup g = {.rank = 1, .size = 2, .local_rank = 1, .bcast = fake_bcast,
                     .timeout = 0.2, .lost = fake_lost};
    if (strcmp(which, "setup") == 0) {
        /* a peer that never joins: the non-blocking setup gives up */
        setenv("FAKE_NCCL_SETUP_POLLS", "-1", 1);
        int at0 = *log_len;
        alarm(5);
        double s0 = now_s();
        KcComm *k0 = open(&g, p, storage, offset, ARENA, (void *)9, (void *)1, (void *)2, &d);
        double t = now_s() - s0;
        EXPECT(k0 == NULL, "setup with a peer that never joins succeeded");
        EXPECT(t >= 0.2 && t < 2, "gave up after %g s (timeout 0.2 s)", t);
        EXPECT(strstr(log_text + at0, "blocking=0\n") && strstr(log_text + at0, "commabort 119\n"),
               "expected a non-blocking init, then ncclCommAbort: %s", log_text + at0);
        EXPECT(lost_calls == 1 && strstr(lost_what, "communicator setup"),
               "lost called %d times: %s", lost_calls, lost_what);
        EXPECT(strstr(d.msg, "comm_timeout"), "message: %s", d.msg);
        return 0;
    }
    int at_open = *log_len;
    KcComm *k = open(&g, p, storage, offset, ARENA, (void *)9, (void *)1, (void *)2, &d);
    EXPECT(k != NULL, "kc_comm_open: %s", d.msg);
    /* with a timeout, the communicator is set up non-blocking and settled */
    EXPECT(strstr(log_text + at_open, "blocking=0\n") && lost_calls == 0,
           "expected a non-blocking init: %s", log_text + at_open);
    double exposed, busy_ms;
    run_once(kh, k, p, begin_ev(), &exposed, &busy_ms);
    EXPECT(first_t0 > 0 && last_done > first_t0 && stamp(last_done) > stamp(first_t0) + 5,
           "stamps: t0 E%d, last done E%d", first_t0, last_done);
    int at = *log_len;
    alarm(5); /* a wait that never gives up fails the case */
    double t0 = now_s();
    int r;
    if (strcmp(which, "compute") == 0) {
        /* every all-reduce finished; the compute stream busy for 400 polls
         * (at least 1 ms apart after the first few: past the timeout) */
        int q0 = *queries;
        *busy = 400;
        r = wait_stream(k, (void *)1);
        EXPECT(r == 0 && lost_calls == 0 && !strstr(log_text + at, "commabort"),
               "long compute timed out (r %d, lost %d): %s", r, lost_calls, lost_what);
        EXPECT(now_s() - t0 > 0.3, "the wait lasted %g s (expected past the timeout)",
               now_s() - t0);
        EXPECT(*queries - q0 >= 400, "%d queries", *queries - q0);
        return 0;
    }
    /* bucket first_bucket has begun on the communication stream, none done */
    *clock = stamp(first_t0) + 5;
    if (strcmp(which, "slow") == 0) {
        *busy = 5;
        r = wait_stream(k, (void *)1);
        EXPECT(r == 0 && lost_calls == 0 && !strstr(log_text + at, "commabort"),
               "a stream done after 5 polls timed out (r %d): %s", r, lost_what);
        EXPECT(*busy == 0 && strstr(log_text + at, "query S1 done\n") &&
                   !strstr(log_text + at, "sync S1"),
               "expected polls, then done: %s", log_text + at);
        return 0;
    }
    *busy = -1;
    r = strcmp(which, "hang_event") == 0 ? wait_event(k, (void *)(uintptr_t)last_done)
                                         : wait_stream(k, (void *)1);
    double t = now_s() - t0;
    EXPECT(r == 702, "wait returned %d (expected CUDA_ERROR_LAUNCH_TIMEOUT, 702)", r);
    EXPECT(t >= 0.2 && t < 2, "gave up after %g s (timeout 0.2 s)", t);
    EXPECT(strstr(log_text + at, "commabort 119\n"), "no ncclCommAbort: %s", log_text + at);
    char want[64];
    snprintf(want, sizeof want, "bucket %d ", first_bucket);
    EXPECT(lost_calls == 1 && strstr(lost_what, want) && strstr(lost_what, "NCCL"),
           "lost called %d times: %s (expected %s)", lost_calls, lost_what, want);
    return 0;
}

/* Two training steps of p through the backend table be (with NCCL
 * all-reduces on the device when nccl), with every host entry point the
 * executor uses; *blocking and *polls: the driver's blocking waits and
 * polls (queries) meanwhile. */
static void backend_steps(const Backend *be, const CgPlan *p, bool nccl, void *ch, int *blocking,
                          int *polls)
{
    int *nblock = sym(ch, "fake_blocking"), *nquery = sym(ch, "fake_queries");
    int *nlaunch = sym(ch, "fake_launches");
    int *nmatmul = sym(RTLD_DEFAULT, "fake_matmuls");
    int b0 = *nblock, q0 = *nquery;
    const Graph *g = p->g;
    ExecOpts o = {.device = "cuda", .profile = true};
    Diag d = {{0}};
    BackendCtx *c = be->create(p, &o, &d);
    EXPECT(c != NULL, "create: %s", d.msg);
    if (nccl) {
        RtCommGroup grp = {.rank = 1, .size = 2, .local_rank = 1, .bcast = fake_bcast,
                           .timeout = 5, .lost = fake_lost};
        EXPECT(be->ext->comm_setup(c, &grp, &d), "comm_setup: %s", d.msg);
    }
    static unsigned char buf[1 << 20];
    double *t0 = xcalloc((size_t)p->steps.n + 1, sizeof(double));
    double *t1 = xcalloc((size_t)p->steps.n + 1, sizeof(double));
    for (int run = 0; run < 2; run++) {
        /* the persistent tensors, again and again: past the 16 MiB staging
         * buffer, which then waits for the copies before it */
        int64_t written = 0;
        while (written < (24 << 20))
            for (int t = 0; t < g->t.n; t++) {
                TensorKind k = g->t.v[t].kind;
                int64_t n = p->mem->bytes[t];
                if ((k != TK_PARAM && k != TK_INPUT && k != TK_STATE) || n <= 0 ||
                    n > (int64_t)sizeof buf)
                    continue;
                be->write(c, cg_offset(p, t), buf, n);
                written += (n + 255) / 256 * 256;
            }
        int l0 = *nlaunch, m0 = *nmatmul;
        for (int s = 0; s < p->steps.n; s++) {
            CgStepKind k = p->steps.v[s].kind;
            bool ok = nccl && k == CG_STEP_ALLREDUCE_START ? be->ext->allreduce_start(c, s, &d)
                      : nccl && k == CG_STEP_ALLREDUCE_WAIT ? be->ext->allreduce_wait(c, s, &d)
                                                             : be->run_step(c, s, 7, run, &d);
            EXPECT(ok, "step %d: %s", s, d.msg);
        }
        EXPECT(*nlaunch > l0 && *nmatmul > m0, "%d launches, %d GEMMs in a step",
               *nlaunch - l0, *nmatmul - m0);
        for (int i = 0; i < g->outs.n; i++) {
            int t = g->outs.v[i].t;
            EXPECT(p->mem->bytes[t] <= (int64_t)sizeof buf, "output of %lld bytes",
                   (long long)p->mem->bytes[t]);
            be->read(c, cg_offset(p, t), buf, p->mem->bytes[t]);
        }
        EXPECT(be->ext->run_seconds(c) >= 0, "no run time");
        EXPECT(be->ext->step_times(c, t0, t1), "no step times");
        if (nccl) {
            RtCommEvent ev[64];
            double exposed;
            EXPECT(be->ext->comm_events(c, ev, 64, &exposed) > 0, "no all-reduce events");
        }
    }
    be->sync(c);
    be->destroy(c);
    free(t0);
    free(t1);
    *blocking = *nblock - b0;
    *polls = *nquery - q0;
}

/* The backend's host waits (see the top of the file). */
static int child_backend(void)
{
    void *ch = lib("libcuda.so.1", true);
    lib("libnccl.so.2", false);
    lib("libfakecublaslt.so", true);
    void *bh = lib("kcbackend.so", false);
    log_text = sym(ch, "fake_log");
    log_len = sym(ch, "fake_len");
    const Backend *(*get)(const RtCudaHost *) =
        (const Backend *(*)(const RtCudaHost *))sym(bh, "kiln_cuda_backend");
    static const RtCudaHost host = {RT_CUDA_ABI, cg_cuda_program, cg_cuda_program_free};
    const Backend *be = get(&host);
    EXPECT(be && be->ext, "no backend table");
    CgPlan *p = mlp_plan();
    int plain_block, plain_poll, nccl_block, nccl_poll;
    backend_steps(be, p, false, ch, &plain_block, &plain_poll);
    /* without all-reduces: at least a staging wait per run, the {seed,
     * step} wait of the second run, a wait per read, the timing, the sync
     * and the destroy; blocking, no polls */
    EXPECT(plain_block >= 8 && plain_poll == 0,
           "without NCCL: %d blocking waits, %d polls (expected blocking waits only)",
           plain_block, plain_poll);
    backend_steps(be, p, true, ch, &nccl_block, &nccl_poll);
    EXPECT(nccl_block == 0,
           "with NCCL: %d blocking waits (every host wait must poll: a hung peer would block "
           "it forever)",
           nccl_block);
    EXPECT(nccl_poll >= plain_block, "with NCCL: %d polls for %d waits", nccl_poll, plain_block);
    cg_plan_free(p);
    return 0;
}

static void run_child(const char *which, const char *env)
{
    if (!cuda_inc)
        skip();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (env)
            putenv((char *)env);
        _exit(strcmp(which, "backend") == 0       ? child_backend()
              : strncmp(which, "wait_", 5) == 0 ? child_wait(which + 5)
                                                : child(which));
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        fail_msg("case %s failed (status %d)", which, ws);
}

/* The cases, each run in a child (child(), or child_wait() for "wait_*"),
 * with an extra environment entry. */
typedef struct {
    const char *name, *which, *env;
} ChildCase;
static const ChildCase child_cases[] = {
    /* a peer that never joins the communicator: setup stops within the
     * bound, aborts and names the lost rank through the callback */
    {"hung_setup", "wait_setup", NULL},
    {"hung_peer_stream", "wait_hang_stream", NULL},
    {"hung_peer_event", "wait_hang_event", NULL},
    {"slow_stream", "wait_slow", NULL},
    {"long_compute", "wait_compute", NULL},
    {"rank1", "rank1", NULL},
    {"rank0", "rank0", NULL},
    {"bf16_refused", "bf16", NULL},
    {"old_nccl", "old", "FAKE_NCCL_VERSION=20907"},
    /* the backend's host waits: bounded polls with NCCL on the device */
    {"backend_waits_bounded", "backend", NULL},
};
enum { NCHILD = sizeof child_cases / sizeof child_cases[0] };

static void test_child(void **state)
{
    const ChildCase *c = *state;
    run_child(c->which, c->env);
}

int main(void)
{
    struct CMUnitTest tests[NCHILD];
    for (int i = 0; i < NCHILD; i++)
        tests[i] = (struct CMUnitTest){child_cases[i].name, test_child, NULL, NULL,
                                       (void *)&child_cases[i]};
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    /* 77: ctest reports the test as skipped (no toolkit headers or no C
     * compiler), not as passed */
    return failed == 0 && !cuda_inc ? 77 : failed;
}
