/* cc.c - the host C compiler behind an on-disk cache of shared objects.
 *
 * Cache key: hash of source, `cc --version` output and flags. The object is
 * compiled to a temporary name in the cache directory and renamed into
 * place, so a reader never sees a half-written object. */
#include "runtime.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KILN_C_COMPILER
#define KILN_C_COMPILER "cc"
#endif

/* -fno-math-errno and -fno-trapping-math change no value: they let loops
 * with sqrtf and conditionals vectorise. The prelude's #pragma GCC optimize
 * says the same, but GCC 12 still guards sqrtf with an errno call under it
 * (the AdamW kernel of gpt tiny ran 7x slower). */
static const char cc_flags[] =
    "-std=c11 -O3 -march=native -fPIC -shared -ffp-contract=off -fno-math-errno "
    "-fno-trapping-math -w";

static RtCcStats stats;

RtCcStats rt_cc_stats(void) { return stats; }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs cmd through the shell; stdout+stderr into a malloc'd string. */
static int run_capture(const char *cmd, char **out)
{
    char *full = xasprintf("%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    free(full);
    if (!p) {
        *out = xstrdup(strerror(errno));
        return -1;
    }
    size_t n = 0, cap = 4096;
    char *s = xmalloc(cap);
    size_t k;
    while ((k = fread(s + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (cap - n < 2)
            s = xrealloc(s, cap *= 2);
    }
    s[n] = 0;
    int st = pclose(p);
    *out = s;
    return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static const char *compiler_version(void)
{
    static char *v;
    if (!v) {
        char *cmd = xasprintf("'%s' --version", KILN_C_COMPILER);
        if (run_capture(cmd, &v) != 0) {
            free(v);
            v = xstrdup("unknown");
        }
        free(cmd);
    }
    return v;
}

static bool mkdir_p(const char *path)
{
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        mkdir(p, 0777);
        *s = '/';
    }
    bool ok = mkdir(p, 0777) == 0 || errno == EEXIST;
    free(p);
    return ok;
}

static char *cache_path(const char *cache_dir)
{
    if (cache_dir && *cache_dir)
        return xstrdup(cache_dir);
    const char *e = getenv("KILN_CACHE_DIR");
    if (e && *e)
        return xstrdup(e);
    const char *home = getenv("HOME");
    return xasprintf("%s/.cache/kiln", home && *home ? home : "/tmp");
}

/* Appends "LINE | text" for source lines [lo, hi] to the diagnostic. */
static void add_numbered(char *msg, size_t cap, const char *src, int lo, int hi)
{
    int line = 1;
    const char *p = src;
    while (*p && line <= hi) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (line >= lo) {
            size_t k = strlen(msg);
            if (k + 16 >= cap)
                return;
            snprintf(msg + k, cap - k, "%6d | %.*s\n", line, (int)(len > 160 ? 160 : len), p);
        }
        if (!e)
            break;
        p = e + 1;
        line++;
    }
}

/* First error line number the compiler names in file `cfile`, or 0. */
static int first_error_line(const char *log, const char *cfile)
{
    size_t n = strlen(cfile);
    for (const char *p = strstr(log, cfile); p; p = strstr(p + 1, cfile)) {
        if (p[n] != ':')
            continue;
        int line = atoi(p + n + 1);
        if (line > 0 && strstr(p, "error"))
            return line;
    }
    return 0;
}

char *rt_cc_compile(const char *source, const char *cache_dir, bool verbose, Diag *d)
{
    char *src = NULL;
    const char *inj = getenv("KILN_CC_INJECT_ERROR");
    if (inj && *inj && strcmp(inj, "0") != 0)
        src = xasprintf("%s\nkiln_injected_error(; /* KILN_CC_INJECT_ERROR */\n", source);
    else
        src = xstrdup(source);

    const char *ver = compiler_version();
    uint64_t h1 = hash_bytes(src, strlen(src), 1);
    h1 = hash_bytes(ver, strlen(ver), h1);
    h1 = hash_bytes(cc_flags, sizeof cc_flags, h1);
    uint64_t h2 = hash_bytes(src, strlen(src), 0x5bd1e995);
    h2 = hash_bytes(ver, strlen(ver), h2);
    h2 = hash_bytes(cc_flags, sizeof cc_flags, h2);

    char *dir = cache_path(cache_dir);
    char *so = xasprintf("%s/kiln-%016llx%016llx.so", dir, (unsigned long long)h1,
                         (unsigned long long)h2);
    if (access(so, R_OK) == 0) {
        stats.cache_hits++;
        if (verbose)
            fprintf(stderr, "kiln: cc: cache hit %s (%d compiles, %d hits)\n", so,
                    stats.compiles, stats.cache_hits);
        free(src);
        free(dir);
        return so;
    }
    if (!mkdir_p(dir)) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot create the kernel cache directory: %s", dir,
                 strerror(errno));
        goto fail;
    }
    /* per-process names: concurrent compiles of one program never share a file */
    char *cfile = xasprintf("%s/kiln-%016llx%016llx.%ld.c", dir, (unsigned long long)h1,
                            (unsigned long long)h2, (long)getpid());
    char *tmp = xasprintf("%s.tmp.%ld", so, (long)getpid());
    FILE *f = fopen(cfile, "w");
    if (!f || fputs(src, f) < 0 || fclose(f) != 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot write kernel source: %s", cfile,
                 strerror(errno));
        free(cfile);
        free(tmp);
        goto fail;
    }
    char *cmd = xasprintf("'%s' %s -o '%s' '%s' -lm", KILN_C_COMPILER, cc_flags, tmp, cfile);
    double t0 = now();
    char *log = NULL;
    int rc = run_capture(cmd, &log);
    stats.compiles++;
    stats.compile_seconds += now() - t0;
    if (verbose)
        fprintf(stderr, "kiln: cc: compiled %s in %.2fs (%d compiles, %d hits)\n", so,
                now() - t0, stats.compiles, stats.cache_hits);
    free(cmd);
    if (rc != 0) {
        unlink(tmp);
        int line = first_error_line(log, cfile);
        snprintf(d->msg, sizeof d->msg,
                 "kernel compilation failed (%s, exit status %d); source kept in %s\n",
                 KILN_C_COMPILER, rc, cfile);
        if (line > 0)
            add_numbered(d->msg, sizeof d->msg, src, line - 3, line + 2);
        size_t k = strlen(d->msg);
        snprintf(d->msg + k, sizeof d->msg - k, "compiler says:\n%s", log);
        free(log);
        free(cfile);
        free(tmp);
        goto fail;
    }
    free(log);
    char *keep = xasprintf("%s/kiln-%016llx%016llx.c", dir, (unsigned long long)h1,
                           (unsigned long long)h2);
    rename(cfile, keep); /* the source beside its object, for reading; best effort */
    free(keep);
    if (rename(tmp, so) != 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot move the compiled kernels into place: %s",
                 so, strerror(errno));
        unlink(tmp);
        free(cfile);
        free(tmp);
        goto fail;
    }
    free(cfile);
    free(tmp);
    free(src);
    free(dir);
    return so;
fail:
    free(src);
    free(dir);
    free(so);
    return NULL;
}
