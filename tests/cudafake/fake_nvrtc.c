/* fake_nvrtc.c - a stand-in libnvrtc.so.13 for tests/cudafake: every call
 * goes to the real NVRTC (opened by the absolute path CMake found,
 * FAKE_REAL_NVRTC), so kiln's CUDA C is really compiled for the device's
 * architecture; only the cubin differs: after the real ELF it carries
 * "KILN-FAKE-CUDA-SOURCE:" and the program's source (NUL-terminated), from
 * which the fake driver (fake_cuda.c) builds the emulated kernels. The
 * symbols carry the version node libnvrtc.so.13 (nvrtc.map), as the real
 * library's, so that libkiln_cuda.so binds to them when this directory is
 * on LD_LIBRARY_PATH. */
#include <dlfcn.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FAKE_REAL_NVRTC
#error "FAKE_REAL_NVRTC (the real libnvrtc's path) must be defined by the build"
#endif

#define FAKE_SRC_MAGIC "KILN-FAKE-CUDA-SOURCE:"

static void *real;

static void *fn(const char *name)
{
    if (!real) {
        real = dlopen(FAKE_REAL_NVRTC, RTLD_NOW | RTLD_LOCAL);
        if (!real) {
            fprintf(stderr, "fake NVRTC: cannot open the real NVRTC %s: %s\n", FAKE_REAL_NVRTC,
                    dlerror());
            _exit(86);
        }
    }
    void *f = dlsym(real, name);
    if (!f) {
        fprintf(stderr, "fake NVRTC: the real NVRTC lacks %s\n", name);
        _exit(86);
    }
    return f;
}

#define REAL(name) ((__typeof__(&name))fn(#name))

/* the sources of live programs */
typedef struct Src {
    nvrtcProgram p;
    char *src;
    struct Src *next;
} Src;
static Src *srcs;

static const char *source_of(nvrtcProgram p)
{
    for (Src *s = srcs; s; s = s->next)
        if (s->p == p)
            return s->src;
    fprintf(stderr, "fake NVRTC: unknown program %p\n", (void *)p);
    _exit(86);
}

const char *nvrtcGetErrorString(nvrtcResult r) { return REAL(nvrtcGetErrorString)(r); }

nvrtcResult nvrtcVersion(int *major, int *minor) { return REAL(nvrtcVersion)(major, minor); }

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                               int nheaders, const char *const *headers,
                               const char *const *include_names)
{
    nvrtcResult r =
        REAL(nvrtcCreateProgram)(prog, src, name, nheaders, headers, include_names);
    if (r == NVRTC_SUCCESS) {
        Src *s = calloc(1, sizeof *s);
        s->p = *prog;
        s->src = strdup(src);
        s->next = srcs;
        srcs = s;
    }
    return r;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog)
{
    for (Src **pp = &srcs; *pp; pp = &(*pp)->next)
        if ((*pp)->p == *prog) {
            Src *s = *pp;
            *pp = s->next;
            free(s->src);
            free(s);
            break;
        }
    return REAL(nvrtcDestroyProgram)(prog);
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int n, const char *const *opts)
{
    return REAL(nvrtcCompileProgram)(prog, n, opts);
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *n)
{
    return REAL(nvrtcGetProgramLogSize)(prog, n);
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log)
{
    return REAL(nvrtcGetProgramLog)(prog, log);
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *n)
{
    nvrtcResult r = REAL(nvrtcGetCUBINSize)(prog, n);
    if (r == NVRTC_SUCCESS && *n > 0)
        *n += strlen(FAKE_SRC_MAGIC) + strlen(source_of(prog)) + 1;
    return r;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin)
{
    size_t n = 0;
    nvrtcResult r = REAL(nvrtcGetCUBINSize)(prog, &n);
    if (r != NVRTC_SUCCESS)
        return r;
    r = REAL(nvrtcGetCUBIN)(prog, cubin);
    if (r != NVRTC_SUCCESS)
        return r;
    const char *src = source_of(prog);
    memcpy(cubin + n, FAKE_SRC_MAGIC, strlen(FAKE_SRC_MAGIC));
    memcpy(cubin + n + strlen(FAKE_SRC_MAGIC), src, strlen(src) + 1);
    return r;
}

nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *n) { return REAL(nvrtcGetPTXSize)(prog, n); }

nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx) { return REAL(nvrtcGetPTX)(prog, ptx); }
