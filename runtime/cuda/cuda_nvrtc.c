/* cuda_nvrtc.c - part of libkiln_cuda.so: the plan's CUDA program compiled
 * by NVRTC for one architecture, cubins cached on disk by a hash of the
 * source, the options, NVRTC's version and the architecture (the log beside
 * each cubin); a failure prints the numbered source and the log. Needs no
 * driver and no GPU. A cached cubin ends in a trailer (its size and FNV-1a
 * hash, then a magic), checked when it is read: a truncated or overwritten
 * one is compiled again. */
#include "cuda_module.h"

#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool rtc_fail(nvrtcResult r, const char *call, const char *file, int line, Diag *d)
{
    kc_dmsg(d, "%s:%d: %s failed: %s", file, line, call, nvrtcGetErrorString(r));
    return false;
}

/* Checked calls: true on success, else d set naming the call, file and line. */
#define RTC(call, d) \
    ((r_rtc = (call)) == NVRTC_SUCCESS || rtc_fail(r_rtc, #call, __FILE__, __LINE__, (d)))
static _Thread_local nvrtcResult r_rtc;

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

static char *cache_root(const char *cache_dir)
{
    const char *base = cache_dir && *cache_dir ? cache_dir : getenv("KILN_CACHE_DIR");
    char buf[4096];
    if (base && *base) {
        snprintf(buf, sizeof buf, "%s/cuda", base);
    } else {
        const char *home = getenv("HOME");
        snprintf(buf, sizeof buf, "%s/.cache/kiln/cuda", home && *home ? home : "/tmp");
    }
    for (char *s = buf + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(buf, 0777);
            *s = '/';
        }
    mkdir(buf, 0777);
    return kc_dupstr(buf);
}

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0, k;
    char *s = kc_zalloc(cap);
    while ((k = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (cap - len < 2) {
            char *t = realloc(s, cap *= 2);
            if (!t)
                kc_fatal("out of memory");
            s = t;
        }
    }
    fclose(f);
    s[len] = 0;
    *n = len;
    return s;
}

/* A cubin's trailer: its size and FNV-1a hash, then the magic. */
enum { TRAILER_BYTES = 24 };
static const char trailer_magic[8] = {'K', 'I', 'L', 'N', 'C', 'U', '0', '1'};

/* Writes atomically (temp NAME.tmp.PID + rename: the kernel cache removes
 * such files once their writer is gone); with_trailer: the cubin's trailer
 * after the bytes. A failure only costs the cache entry. */
static void write_all(const char *path, const void *p, size_t n, bool with_trailer)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    bool ok = fwrite(p, 1, n, f) == n;
    if (with_trailer) {
        uint64_t size = n, h = fnv(p, n, 0xcbf29ce484222325ull);
        ok = ok && fwrite(&size, 8, 1, f) == 1 && fwrite(&h, 8, 1, f) == 1 &&
             fwrite(trailer_magic, 8, 1, f) == 1;
    }
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0)
        unlink(tmp);
}

/* The length of the cubin before its trailer when s[0..n) is a whole
 * cached cubin; else 0 with why set. */
static size_t check_cubin(const char *s, size_t n, char *why, size_t wn)
{
    uint64_t size, h;
    if (n <= TRAILER_BYTES || memcmp(s + n - 8, trailer_magic, 8) != 0) {
        snprintf(why, wn, "%zu bytes without the size and checksum trailer: truncated or "
                 "overwritten", n);
        return 0;
    }
    memcpy(&size, s + n - TRAILER_BYTES, 8);
    memcpy(&h, s + n - 16, 8);
    if (size != n - TRAILER_BYTES) {
        snprintf(why, wn, "%zu bytes, the trailer says %llu", n - TRAILER_BYTES,
                 (unsigned long long)size);
        return 0;
    }
    if (fnv(s, size, 0xcbf29ce484222325ull) != h) {
        snprintf(why, wn, "checksum mismatch");
        return 0;
    }
    return (size_t)size;
}

/* The numbered source, then the log, to stderr. */
static void print_failure(const char *src, const char *log, const char *arch)
{
    fprintf(stderr, "kiln: NVRTC failed to compile the CUDA kernels for %s; the source:\n", arch);
    int line = 1;
    for (const char *p = src; *p; line++) {
        const char *e = strchr(p, '\n');
        int len = e ? (int)(e - p) : (int)strlen(p);
        fprintf(stderr, "%6d | %.*s\n", line, len, p);
        if (!e)
            break;
        p = e + 1;
    }
    fprintf(stderr, "kiln: NVRTC log:\n%s\n", log);
}

/* The first "error" line of an NVRTC log, for the one-line diagnostic. */
static void first_error(const char *log, char *out, size_t n)
{
    const char *e = strstr(log, "error");
    if (!e) {
        snprintf(out, n, "see the log above");
        return;
    }
    const char *s = e;
    while (s > log && s[-1] != '\n')
        s--;
    const char *t = strchr(e, '\n');
    snprintf(out, n, "%.*s", (int)(t ? t - s : (long)strlen(s)), s);
}

KC_EXPORT bool kiln_cuda_compile(const char *src, const char *arch, const char *cache_dir,
                              bool verbose, RtCudaBinary *b, Diag *d)
{
    memset(b, 0, sizeof *b);
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    const char *opts[] = {archopt, "--std=c++17", "--ptxas-options=-v", "-lineinfo",
                          "--device-as-default-execution-space"};
    int nopts = (int)(sizeof opts / sizeof opts[0]);
    if (!RTC(nvrtcVersion(&b->nvrtc_major, &b->nvrtc_minor), d))
        return false;
    uint64_t h = fnv(src, strlen(src), 0xcbf29ce484222325ull);
    for (int i = 0; i < nopts; i++)
        h = fnv(opts[i], strlen(opts[i]) + 1, h);
    int ver[2] = {b->nvrtc_major, b->nvrtc_minor};
    h = fnv(ver, sizeof ver, h);
    h = fnv(arch, strlen(arch), h);
    char *dir = cache_root(cache_dir);
    char cpath[4200], lpath[4200];
    snprintf(cpath, sizeof cpath, "%s/%016llx-%s.cubin", dir, (unsigned long long)h, arch);
    snprintf(lpath, sizeof lpath, "%s/%016llx-%s.log", dir, (unsigned long long)h, arch);
    free(dir);
    size_t n = 0, ln = 0;
    char *cub = read_all(cpath, &n), why[160];
    size_t whole = cub ? check_cubin(cub, n, why, sizeof why) : 0;
    if (cub && !whole && verbose)
        fprintf(stderr, "kiln: cuda: cached cubin %s is damaged (%s); compiling it again\n",
                cpath, why);
    if (whole) {
        char *log = read_all(lpath, &ln);
        b->cubin = cub;
        b->size = whole;
        b->log = log ? log : kc_dupstr("");
        b->cached = true;
        if (verbose)
            fprintf(stderr, "kiln: cuda: cubin cache hit %s\n", cpath);
        return true;
    }
    free(cub);

    nvrtcProgram prog;
    if (!RTC(nvrtcCreateProgram(&prog, src, "kiln.cu", 0, NULL, NULL), d))
        return false;
    nvrtcResult cr = nvrtcCompileProgram(prog, nopts, opts);
    size_t logn = 0;
    nvrtcGetProgramLogSize(prog, &logn);
    char *log = kc_zalloc(logn + 1);
    if (logn)
        nvrtcGetProgramLog(prog, log);
    if (cr != NVRTC_SUCCESS) {
        print_failure(src, log, arch);
        char first[512];
        first_error(log, first, sizeof first);
        kc_dmsg(d, "NVRTC failed to compile the CUDA kernels for %s (%s): %s", arch,
             nvrtcGetErrorString(cr), first);
        free(log);
        nvrtcDestroyProgram(&prog);
        return false;
    }
    size_t cn = 0;
    if (!RTC(nvrtcGetCUBINSize(prog, &cn), d) || cn == 0) {
        if (cn == 0)
            kc_dmsg(d, "NVRTC produced no cubin for %s", arch);
        free(log);
        nvrtcDestroyProgram(&prog);
        return false;
    }
    cub = kc_zalloc(cn);
    if (!RTC(nvrtcGetCUBIN(prog, cub), d)) {
        free(cub);
        free(log);
        nvrtcDestroyProgram(&prog);
        return false;
    }
    nvrtcDestroyProgram(&prog);
    write_all(lpath, log, strlen(log), false);
    write_all(cpath, cub, cn, true);
    if (verbose)
        fprintf(stderr, "kiln: cuda: compiled %zu-byte cubin for %s into %s\n", cn, arch, cpath);
    b->cubin = cub;
    b->size = cn;
    b->log = log;
    return true;
}

KC_EXPORT void kiln_cuda_binary_free(RtCudaBinary *b)
{
    free(b->cubin);
    free(b->log);
    memset(b, 0, sizeof *b);
}
