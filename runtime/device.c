/* device.c - choosing a backend by --device, and loading the CUDA backend
 * module (libkiln_cuda.so) with dlopen. kiln links no CUDA library: the
 * module links NVRTC and cuBLASLt and opens the driver itself. */
#include "cg_cuda.h"
#include "runtime.h"
#include "cpu.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODULE_NAME "libkiln_cuda.so"

static void *module;
static char module_why[1024];
static const RtCudaHost host = {RT_CUDA_ABI, cg_cuda_program, cg_cuda_program_free};

static void *try_open(const char *path, char *why, size_t n)
{
    if (access(path, F_OK) != 0)
        return NULL;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        snprintf(why, n, "%s", dlerror());
    return h;
}

/* Directory part of path into dir ("." when none). */
static void dir_of(const char *path, char *dir, size_t n)
{
    const char *s = strrchr(path, '/');
    if (!s)
        snprintf(dir, n, ".");
    else
        snprintf(dir, n, "%.*s", (int)(s - path), path);
}

/* The module's handle, or NULL with module_why set. */
static void *open_module(void)
{
    static bool tried;
    if (tried)
        return module;
    tried = true;
    char why[768] = "", dir[PATH_MAX], path[PATH_MAX + 32];
    const char *env = getenv("KILN_CUDA_MODULE");
    if (env && *env) {
        module = try_open(env, why, sizeof why);
        if (!module)
            snprintf(module_why, sizeof module_why, "cannot load the CUDA module %s: %s", env,
                     why[0] ? why : "no such file");
        return module;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        dir_of(exe, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/%s", dir, MODULE_NAME);
        module = try_open(path, why, sizeof why);
    }
    const char *bin = getenv("KILN_BIN");
    if (!module && !why[0] && bin && *bin) {
        dir_of(bin, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/%s", dir, MODULE_NAME);
        module = try_open(path, why, sizeof why);
    }
    if (!module)
        snprintf(module_why, sizeof module_why, "%s",
                 why[0] ? why
                        : "kiln was built without the CUDA backend (" MODULE_NAME
                          " not found beside the kiln binary; set KILN_CUDA_MODULE to its path)");
    return module;
}

static void *module_sym(const char *name, Diag *d)
{
    if (!open_module()) {
        snprintf(d->msg, sizeof d->msg, "--device cuda: %s", module_why);
        return NULL;
    }
    void *s = dlsym(module, name);
    if (!s)
        snprintf(d->msg, sizeof d->msg, "--device cuda: the CUDA module lacks %s", name);
    return s;
}

bool rt_cuda_compile(const char *src, const char *arch, const char *cache_dir, bool verbose,
                     RtCudaBinary *b, Diag *d)
{
    void *s = module_sym("kiln_cuda_compile", d);
    if (!s)
        return false;
    bool (*fn)(const char *, const char *, const char *, bool, RtCudaBinary *, Diag *);
    memcpy(&fn, &s, sizeof s);
    return fn(src, arch, cache_dir, verbose, b, d);
}

void rt_cuda_binary_free(RtCudaBinary *b)
{
    Diag d;
    void *s = module_sym("kiln_cuda_binary_free", &d);
    if (!s)
        return;
    void (*fn)(RtCudaBinary *);
    memcpy(&fn, &s, sizeof s);
    fn(b);
}

static const Backend *cuda_backend(Diag *d)
{
    void *s = module_sym("kiln_cuda_device_count", d);
    void *t = s ? module_sym("kiln_cuda_backend", d) : NULL;
    if (!t)
        return NULL;
    int (*count)(char *, size_t);
    const Backend *(*table)(const RtCudaHost *);
    memcpy(&count, &s, sizeof s);
    memcpy(&table, &t, sizeof t);
    char why[512] = "";
    int n = count(why, sizeof why);
    if (n < 1) {
        snprintf(d->msg, sizeof d->msg, "--device cuda: %s (expected a machine with an NVIDIA "
                 "GPU and its driver; use --device cpu)", why);
        return NULL;
    }
    /* each local rank takes the device of its rank on the machine (unless
     * KILN_CUDA_DEVICE names one): every rank needs its own */
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"), *pick = getenv("KILN_CUDA_DEVICE");
    int local = ls && atoi(ls) > 0 ? atoi(ls) : 1;
    if (local > n && !(pick && *pick)) {
        snprintf(d->msg, sizeof d->msg,
                 "--device cuda: %d ranks on this machine need %d GPUs, the driver sees %d "
                 "(expected at most one rank per GPU: fewer --nproc, or --device cpu)",
                 local, local, n);
        return NULL;
    }
    const Backend *be = table(&host);
    if (!be)
        snprintf(d->msg, sizeof d->msg,
                 "--device cuda: the CUDA module was built for another kiln (ABI mismatch)");
    return be;
}

const Backend *rt_backend_select(const char *device, bool verbose, Diag *d)
{
    if (!device || strcmp(device, "cpu") == 0)
        return &rt_backend_cpu;
    if (strcmp(device, "cuda") == 0)
        return cuda_backend(d);
    if (strcmp(device, "auto") == 0) {
        Diag q;
        const Backend *be = cuda_backend(&q);
        if (be)
            return be;
        if (verbose)
            fprintf(stderr, "kiln: --device auto: using the CPU (%s)\n", q.msg);
        return &rt_backend_cpu;
    }
    snprintf(d->msg, sizeof d->msg, "unknown device '%s' (expected cpu, cuda or auto)", device);
    return NULL;
}
