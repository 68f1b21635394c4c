/* nccl_open.c - NCCL for the CUDA module: libnccl.so.2 and the driver
 * functions the NCCL files use (libcuda.so.1 again: the backend has opened
 * it already, dlopen only counts a reference) opened with dlopen the first
 * time a plan needs a collective or a pipeline transfer, so the module
 * loads, and one GPU trains, where NCCL is not installed. Contract in
 * kc_nccl.h: one table (kc_nc), filled once; every failure is a reason,
 * never a stop. */
#include "kc_nccl.h"

#include <dlfcn.h>
#include <stdio.h>

/* NCCL_VERSION(2,10,3): ncclAvg first appeared in NCCL 2.10.3 */
enum { NCCL_MIN_VERSION = 21003 };

#define STR_(x) #x
#define STR(x) STR_(x)

KcNccl kc_nc;
_Thread_local CUresult kc_r_drv;
_Thread_local ncclResult_t kc_r_nc;
static int nccl_version;
static char nccl_why[512]; /* why NCCL cannot be used ("" when it can) */

bool kc_nccl_open(const char **why)
{
    *why = nccl_why;
#ifdef KILN_NO_NCCL
    snprintf(nccl_why, sizeof nccl_why,
             "this libkiln_cuda.so was built without NCCL (nccl.h was not found at build "
             "time; configure with -DKILN_NCCL_INCLUDE_DIR=DIR)");
    return false;
#endif
    static bool tried, ok;
    if (tried)
        return ok;
    tried = true;
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!drv) {
        snprintf(nccl_why, sizeof nccl_why, "no CUDA driver on this machine (%s)", dlerror());
        return false;
    }
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nccl_why, sizeof nccl_why,
                 "NCCL is not installed (%s) (expected libnccl.so.2, NCCL 2.10.3 or newer, "
                 "where the dynamic loader finds it, e.g. beside the CUDA libraries or on "
                 "LD_LIBRARY_PATH)",
                 dlerror());
        return false;
    }
#define X(f)                                                                               \
    if (!(*(void **)&kc_nc.f = dlsym(drv, STR(f)))) {                                         \
        snprintf(nccl_why, sizeof nccl_why, "the CUDA driver lacks %s (driver too old?)", \
                 STR(f));                                                                  \
        return false;                                                                      \
    }
    KC_DRV_FUNCS(X)
#undef X
#define X(f)                                                                            \
    if (!(*(void **)&kc_nc.f = dlsym(h, STR(f)))) {                                        \
        snprintf(nccl_why, sizeof nccl_why, "libnccl.so.2 lacks %s (expected NCCL 2.10.3 " \
                 "or newer)", STR(f));                                                  \
        return false;                                                                   \
    }
    KC_NCCL_FUNCS(X)
#undef X
    *(void **)&kc_nc.init_config = dlsym(h, "ncclCommInitRankConfig");
    *(void **)&kc_nc.async_error = dlsym(h, "ncclCommGetAsyncError");
    *(void **)&kc_nc.reduce = dlsym(h, "ncclReduce");
    *(void **)&kc_nc.bcast = dlsym(h, "ncclBroadcast");
    *(void **)&kc_nc.allgather = dlsym(h, "ncclAllGather");
    *(void **)&kc_nc.rscatter = dlsym(h, "ncclReduceScatter");
    *(void **)&kc_nc.copy2d = dlsym(drv, STR(cuMemcpy2DAsync));
    *(void **)&kc_nc.send = dlsym(h, "ncclSend");
    *(void **)&kc_nc.recv = dlsym(h, "ncclRecv");
    if (kc_nc.ncclGetVersion(&nccl_version) != ncclSuccess || nccl_version < NCCL_MIN_VERSION) {
        snprintf(nccl_why, sizeof nccl_why,
                 "NCCL is too old (version code %d; expected NCCL 2.10.3 or newer, for ncclAvg)",
                 nccl_version);
        return false;
    }
    ok = true;
    return true;
}

bool kc_drv_fail(CUresult r, const char *call, const char *file, int line, Diag *d)
{
    const char *s = NULL;
    kc_nc.cuGetErrorString(r, &s);
    kc_dmsg(d, "%s:%d: %s failed: %s", file, line, call, s ? s : "unknown CUDA error");
    return false;
}

bool kc_nccl_fail(ncclResult_t r, const char *call, const char *file, int line, Diag *d)
{
    kc_dmsg(d, "%s:%d: %s failed: %s", file, line, call, kc_nc.ncclGetErrorString(r));
    return false;
}
