/* driver.c - the CUDA driver API of the CUDA module: libcuda.so.1 opened
 * with dlopen and its entry points looked up with dlsym into one table
 * (kc_cu), so that the module loads, and its NVRTC path works, on machines
 * without a driver; the checked-call helper behind CU(); and the device
 * count kiln asks for before choosing --device cuda.
 *
 * Invariant: every driver call of backend_cuda.c goes through kc_cu, whose
 * entries are all set (or kc_cu_open failed and none is used): a test can
 * stand a fake libcuda.so.1 in for the driver by loading it first.
 * nccl_open.c looks up the few driver functions the NCCL files need itself. */
#include "cuda_module.h"

#include <dlfcn.h>
#include <stdio.h>

KcDriver kc_cu;
static void *cu_lib;
static char cu_why[512]; /* why the driver cannot be used ("" when it can) */

#define STR_(x) #x
#define STR(x) STR_(x)

bool kc_cu_open(char *why, size_t n)
{
    static bool tried;
    if (tried) {
        if (!cu_lib)
            snprintf(why, n, "%s", cu_why);
        return cu_lib != NULL;
    }
    tried = true;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cu_why, sizeof cu_why, "no CUDA driver on this machine (%s)", dlerror());
        snprintf(why, n, "%s", cu_why);
        return false;
    }
#define X(f)                                                                           \
    if (!(*(void **)&kc_cu.f = dlsym(h, STR(f)))) {                                    \
        snprintf(cu_why, sizeof cu_why, "the CUDA driver lacks %s (driver too old?)", \
                 STR(f));                                                              \
        snprintf(why, n, "%s", cu_why);                                                \
        dlclose(h);                                                                    \
        return false;                                                                  \
    }
    KC_CU_FUNCS(X)
#undef X
    CUresult r = kc_cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        kc_cu.cuGetErrorString(r, &s);
        snprintf(cu_why, sizeof cu_why, "the CUDA driver failed to initialise (%s)",
                 s ? s : "unknown error");
        snprintf(why, n, "%s", cu_why);
        dlclose(h);
        return false;
    }
    cu_lib = h;
    return true;
}

bool kc_cu_check(CUresult r, const char *call, const char *file, int line, Diag *d)
{
    if (r == CUDA_SUCCESS)
        return true;
    const char *name = NULL, *s = NULL;
    if (cu_lib) {
        kc_cu.cuGetErrorName(r, &name);
        kc_cu.cuGetErrorString(r, &s);
    }
    if (d)
        kc_dmsg(d, "%s:%d: %s failed: %s (%s)", file, line, call, name ? name : "?", s ? s : "?");
    else
        kc_fatal("%s:%d: %s failed: %s (%s)", file, line, call, name ? name : "?", s ? s : "?");
    return false;
}

/* Number of CUDA devices; -1 with why set when the driver is unusable. */
KC_EXPORT int kiln_cuda_device_count(char *why, size_t n);
KC_EXPORT int kiln_cuda_device_count(char *why, size_t n)
{
    if (!kc_cu_open(why, n))
        return -1;
    int k = 0;
    CUresult r = kc_cu.cuDeviceGetCount(&k);
    if (r != CUDA_SUCCESS) {
        snprintf(why, n, "cuDeviceGetCount failed (error %d)", (int)r);
        return -1;
    }
    if (k == 0)
        snprintf(why, n, "the CUDA driver sees no device");
    return k;
}
