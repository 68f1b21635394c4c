/* cc.c - the host C compiler behind an on-disk cache of shared objects.
 *
 * Cache key: hash of source, `cc --version` output and flags. The object is
 * compiled to a temporary name in the cache directory and renamed into
 * place, so a reader never sees a half-written object. Each object ends in
 * a trailer (its size and FNV-1a hash, then a magic; the dynamic loader
 * ignores bytes past the ELF image): a cache hit is verified before it is
 * loaded, and an entry that is truncated, overwritten or lacks the trailer
 * is compiled again (a truncated object would SIGBUS in dlopen).
 *
 * Temp files carry their writer's pid (kiln-H.PID.c, kiln-H.PID.N.o,
 * kiln-H.so.tmp.PID): the cache's pruning (rt_cache_prune, runtime/files.c,
 * also run once at a process's first compile) removes those whose writer
 * is gone and keeps the directory under KILN_CACHE_MAX. */
#include "cpu.h"

#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KILN_C_COMPILER
#define KILN_C_COMPILER "cc"
#endif

/* -fno-math-errno and -fno-trapping-math change no value: they let loops
 * with sqrtf and conditionals vectorise. The prelude's #pragma GCC optimize
 * says the same, but GCC 12 still guards sqrtf with an errno call under it
 * (the AdamW kernel of gpt tiny ran 7x slower). -mprefer-vector-width=512
 * lets GCC use the 512-bit registers it otherwise leaves alone where the
 * machine has AVX-512 (none elsewhere): no value changes either (lanes do
 * what the scalar loop does; reductions keep their written order), and
 * the GELU kernels, which compute more than they move, take 0.57x the time
 * (gpt small's bias+GELU, one thread: 7.35 -> 4.19 ms). */
static const char cc_flags[] =
    "-std=c11 -O3 -march=native -mprefer-vector-width=512 -fPIC -shared -ffp-contract=off "
    "-fno-math-errno -fno-trapping-math -w";

static RtCcStats stats;

RtCcStats rt_cc_stats(void) { return stats; }

int rt_run_capture(const char *cmd, char **out)
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
        if (rt_run_capture(cmd, &v) != 0) {
            free(v);
            v = xstrdup("unknown");
        }
        free(cmd);
    }
    return v;
}

const char *rt_cc_build_id(void)
{
    static char id[20];
    if (!id[0]) {
        const char *ver = compiler_version();
        uint64_t h = hash_bytes(ver, strlen(ver), 1);
        h = hash_bytes(cc_flags, sizeof cc_flags, h);
        snprintf(id, sizeof id, "%016llx", (unsigned long long)h);
    }
    return id;
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

enum { MAX_PARTS = 16, MIN_FUNCS_PER_PART = 4 };

/* Splits src for `jobs` compilers: the text before the first top-level
 * function ("\nvoid " at column 0; kernel bodies are indented) is a prelude
 * every part repeats, and the functions are dealt out in order, about the
 * same number of bytes to each part. One part (src itself) when jobs <= 1
 * or there are too few functions to be worth a link. */
static int split_source(const char *src, int jobs, char **parts)
{
    const char *first = strstr(src, "\nvoid ");
    int nf = 0;
    for (const char *q = first; q; q = strstr(q + 1, "\nvoid "))
        nf++;
    int np = nf / MIN_FUNCS_PER_PART;
    np = np < jobs ? np : jobs;
    np = np < MAX_PARTS ? np : MAX_PARTS;
    if (np <= 1) {
        parts[0] = xstrdup(src);
        return 1;
    }
    size_t len = strlen(src), pre = (size_t)(first - src) + 1;
    const char *at = first + 1, *end_all = src + len;
    for (int i = 0; i < np; i++) {
        const char *end = end_all;
        if (i < np - 1) {
            const char *target = src + pre + (len - pre) * (size_t)(i + 1) / (size_t)np;
            const char *nl = strstr(target > at ? target - 1 : at, "\nvoid ");
            end = nl ? nl + 1 : end_all;
        }
        parts[i] = xasprintf("%.*s%.*s", (int)pre, src, (int)(end - at), at);
        at = end;
    }
    return np;
}

/* "kernel compilation failed ..." into d: the kept source file (kept; it
 * was compiled as cfile), the lines around the compiler's first error in
 * it, and the compiler's output. */
static void compile_failed(const char *cfile, const char *kept, const char *text, int rc,
                           const char *log, Diag *d)
{
    int line = first_error_line(log, cfile);
    snprintf(d->msg, sizeof d->msg,
             "kernel compilation failed (%s, exit status %d); source kept in %s\n",
             KILN_C_COMPILER, rc, kept);
    if (line > 0)
        add_numbered(d->msg, sizeof d->msg, text, line - 3, line + 2);
    size_t k = strlen(d->msg);
    snprintf(d->msg + k, sizeof d->msg - k, "compiler says:\n%s", log);
}

/* A stop was requested (SIGINT, SIGTERM: rt_stop_signal): d says so. */
static bool stop_requested(Diag *d)
{
    int sig = rt_stop_signal();
    if (sig)
        snprintf(d->msg, sizeof d->msg, "stopped by %s while compiling kernels",
                 sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal");
    return sig != 0;
}

static bool write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    return f && fclose(f) == 0 && ok;
}

/* Compiles src's parts (split_source) side by side, one compiler process
 * each, then links them into tmp. stem: the per-process file name prefix.
 * On failure d is set; the failing part's source is kept as `failed`,
 * nothing else (nothing at all when a stop was requested: the compilers
 * were most likely interrupted). */
static bool compile_parts(const char *src, const char *stem, const char *tmp,
                          const char *failed, int jobs, Diag *d)
{
    char *parts[MAX_PARTS];
    int np = split_source(src, jobs, parts);
    char *cfile[MAX_PARTS] = {0}, *obj[MAX_PARTS] = {0}, *log[MAX_PARTS] = {0};
    FILE *pipe[MAX_PARTS] = {0};
    int rc[MAX_PARTS];
    bool ok = true;
    for (int i = 0; i < np; i++) {
        cfile[i] = np == 1 ? xasprintf("%s.c", stem) : xasprintf("%s.%d.c", stem, i);
        obj[i] = xasprintf("%s.%d.o", stem, i);
        if (!write_text(cfile[i], parts[i])) {
            snprintf(d->msg, sizeof d->msg, "%s: cannot write kernel source: %s", cfile[i],
                     strerror(errno));
            ok = false;
            break;
        }
    }
    /* every compiler starts before any output is read: they run together */
    for (int i = 0; ok && i < np; i++) {
        char *cmd = np == 1 ? xasprintf("'%s' %s -o '%s' '%s' -lm 2>&1", KILN_C_COMPILER,
                                        cc_flags, tmp, cfile[i])
                            : xasprintf("'%s' %s -c -o '%s' '%s' 2>&1", KILN_C_COMPILER,
                                        cc_flags, obj[i], cfile[i]);
        pipe[i] = popen(cmd, "r");
        free(cmd);
    }
    for (int i = 0; ok && i < np; i++) {
        size_t n = 0, cap = 4096, k;
        char *t = xmalloc(cap);
        while (pipe[i] && (k = fread(t + n, 1, cap - n - 1, pipe[i])) > 0) {
            n += k;
            if (cap - n < 2)
                t = xrealloc(t, cap *= 2);
        }
        t[n] = 0;
        log[i] = t;
        int st = pipe[i] ? pclose(pipe[i]) : -1;
        rc[i] = st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    int bad = -1;
    for (int i = 0; ok && i < np && bad < 0; i++)
        if (rc[i] != 0)
            bad = i;
    if (ok && bad >= 0) {
        bool kept = !rt_stop_signal() && rename(cfile[bad], failed) == 0;
        compile_failed(cfile[bad], kept ? failed : "(nowhere)", parts[bad], rc[bad], log[bad],
                       d);
        ok = false;
    }
    if (ok && np > 1) {
        size_t cap = 256;
        for (int i = 0; i < np; i++)
            cap += strlen(obj[i]) + 4;
        char *objs = xcalloc(1, cap);
        for (int i = 0; i < np; i++) {
            strcat(objs, " '");
            strcat(objs, obj[i]);
            strcat(objs, "'");
        }
        char *cmd = xasprintf("'%s' %s -o '%s'%s -lm", KILN_C_COMPILER, cc_flags, tmp, objs);
        char *llog = NULL;
        int lrc = rt_run_capture(cmd, &llog);
        if (lrc != 0) {
            snprintf(d->msg, sizeof d->msg,
                     "linking the compiled kernels failed (%s, exit status %d):\n%s",
                     KILN_C_COMPILER, lrc, llog);
            ok = false;
        }
        free(llog);
        free(objs);
        free(cmd);
    }
    for (int i = 0; i < np; i++) {
        if (np > 1)
            unlink(obj[i]);
        if (cfile[i])
            unlink(cfile[i]); /* the failing part's was renamed to `failed` */
        free(cfile[i]);
        free(obj[i]);
        free(log[i]);
        free(parts[i]);
    }
    if (!ok)
        unlink(tmp);
    return ok;
}

/* The trailer of a cached object: the size and the FNV-1a hash of the
 * bytes before it (native byte order: a cache serves one machine), then
 * the magic. */
enum { TRAILER_BYTES = 24 };
static const char trailer_magic[8] = {'K', 'I', 'L', 'N', 'S', 'O', '0', '1'};

static uint64_t fnv1a(uint64_t h, const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* FNV-1a of the first n bytes of fd (from offset 0); false on a short read. */
static bool hash_fd(int fd, uint64_t n, uint64_t *h)
{
    unsigned char buf[1 << 16];
    *h = 0xcbf29ce484222325ull;
    uint64_t off = 0;
    while (off < n) {
        size_t want = n - off < sizeof buf ? (size_t)(n - off) : sizeof buf;
        ssize_t k = pread(fd, buf, want, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        *h = fnv1a(*h, buf, (size_t)k);
        off += (uint64_t)k;
    }
    return true;
}

/* Appends the trailer to the object at path; false with errno set. */
static bool add_trailer(const char *path)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return false;
    struct stat st;
    uint64_t h, size;
    bool ok = fstat(fd, &st) == 0 && hash_fd(fd, size = (uint64_t)st.st_size, &h);
    if (ok) {
        unsigned char t[TRAILER_BYTES];
        memcpy(t, &size, 8);
        memcpy(t + 8, &h, 8);
        memcpy(t + 16, trailer_magic, 8);
        ok = pwrite(fd, t, sizeof t, (off_t)size) == (ssize_t)sizeof t;
    }
    int err = errno;
    if (close(fd) != 0 && ok)
        return false;
    errno = err;
    return ok;
}

/* Whether the cached object at path is whole: 0 yes, 1 absent, 2 damaged
 * (why says how). */
static int check_object(const char *path, char *why, size_t n)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        if (errno == ENOENT)
            return 1;
        snprintf(why, n, "cannot open it: %s", strerror(errno));
        return 2;
    }
    struct stat st;
    unsigned char t[TRAILER_BYTES];
    uint64_t size = 0, want = 0, h = 0;
    int rc = 2;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        snprintf(why, n, "not a regular file");
    else if (st.st_size <= TRAILER_BYTES ||
             pread(fd, t, sizeof t, st.st_size - TRAILER_BYTES) != (ssize_t)sizeof t ||
             memcmp(t + 16, trailer_magic, 8) != 0)
        snprintf(why, n, "%lld bytes without the size and checksum trailer: truncated or "
                 "overwritten", (long long)st.st_size);
    else if (memcpy(&size, t, 8), size != (uint64_t)st.st_size - TRAILER_BYTES)
        snprintf(why, n, "%lld bytes, the trailer says %llu", (long long)st.st_size - TRAILER_BYTES,
                 (unsigned long long)size);
    else if (memcpy(&want, t + 8, 8), !hash_fd(fd, size, &h) || h != want)
        snprintf(why, n, "checksum mismatch");
    else
        rc = 0;
    close(fd);
    return rc;
}

char *rt_cc_compile(const char *source, const char *cache_dir, int jobs, bool verbose, Diag *d)
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

    char *dir = rt_cache_path(cache_dir);
    static bool swept; /* once per process: temp files left by writers that are gone */
    if (!swept) {
        swept = true;
        rt_cache_prune(dir, "kiln-", NULL, verbose);
    }
    char *so = xasprintf("%s/kiln-%016llx%016llx.so", dir, (unsigned long long)h1,
                         (unsigned long long)h2);
    char why[160];
    int have = check_object(so, why, sizeof why);
    if (have == 2) {
        if (verbose)
            fprintf(stderr, "kiln: cc: cache entry %s is damaged (%s); compiling it again\n", so,
                    why);
        unlink(so);
    }
    if (have == 0) {
        utimensat(AT_FDCWD, so, NULL, 0); /* used now: last to go (best effort) */
        stats.cache_hits++;
        if (verbose)
            fprintf(stderr, "kiln: cc: cache hit %s (%d compiles, %d hits)\n", so,
                    stats.compiles, stats.cache_hits);
        free(src);
        free(dir);
        return so;
    }
    if (!rt_mkdir_p(dir)) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot create the kernel cache directory: %s", dir,
                 strerror(errno));
        goto fail;
    }
    /* per-process names: concurrent compiles of one program never share a file */
    char *stem = xasprintf("%s/kiln-%016llx%016llx.%ld", dir, (unsigned long long)h1,
                           (unsigned long long)h2, (long)getpid());
    char *tmp = xasprintf("%s.tmp.%ld", so, (long)getpid());
    char *failed = xasprintf("%s/kiln-%016llx%016llx.failed.c", dir, (unsigned long long)h1,
                             (unsigned long long)h2);
    double t0 = ir_now();
    bool ok = !stop_requested(d) && compile_parts(src, stem, tmp, failed, jobs, d);
    free(failed);
    if (ok && !add_trailer(tmp)) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot write the compiled kernels: %s", tmp,
                 strerror(errno));
        unlink(tmp);
        ok = false;
    }
    if (stop_requested(d)) { /* the compilers may have been interrupted too */
        unlink(tmp);
        ok = false;
    }
    stats.compiles++;
    stats.compile_seconds += ir_now() - t0;
    if (verbose)
        fprintf(stderr, "kiln: cc: compiled %s in %.2fs (%d compiles, %d hits)\n", so,
                ir_now() - t0, stats.compiles, stats.cache_hits);
    free(stem);
    if (!ok) {
        free(tmp);
        goto fail;
    }
    char *keep = xasprintf("%s/kiln-%016llx%016llx.c", dir, (unsigned long long)h1,
                           (unsigned long long)h2);
    /* the source beside its object, for reading; best effort */
    char *keep_tmp = xasprintf("%s.tmp.%ld", keep, (long)getpid());
    if (!write_text(keep_tmp, src) || rename(keep_tmp, keep) != 0)
        unlink(keep_tmp);
    free(keep_tmp);
    free(keep);
    if (rename(tmp, so) != 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot move the compiled kernels into place: %s",
                 so, strerror(errno));
        unlink(tmp);
        free(tmp);
        goto fail;
    }
    free(tmp);
    free(src);
    rt_cache_prune(dir, "kiln-", so, verbose);
    free(dir);
    return so;
fail:
    free(src);
    free(dir);
    free(so);
    return NULL;
}
