/* files.c - files every part of the runtime writes: atomic writes whose
 * temp files carry their writer's pid, the sweep that removes those a killed
 * writer left, and the compiled-kernel cache directory (its path and its
 * size limit).
 *
 * Cache temp files (kiln-H.PID.c, kiln-H.PID.N.o, kiln-H.so.tmp.PID; the
 * CUDA module's NAME.tmp.PID): a file whose writer is gone (kill(pid, 0)
 * fails with ESRCH), or any one older than a day, is removed when the
 * directory is next pruned, never a live writer's. The kiln-* files of a
 * cache directory, and separately the CUDA module's cubins in its cuda/
 * subdirectory, are kept under KILN_CACHE_MAX bytes (default 1 GiB; 0: no
 * limit): after a compile adds an entry, the files least recently used go
 * until the total is under three quarters of the limit. A file touched in
 * the last minute stays (another process may be compiling or loading it). */
#include "runtime.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *rt_file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a regular file";
}

static bool write_all(int fd, const void *p, size_t n)
{
    const uint8_t *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        c += k;
        n -= (size_t)k;
    }
    return true;
}

bool rt_output_check(const char *path, Diag *d)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode))
        return true;
    snprintf(d->msg, sizeof d->msg, "%s: cannot write (expected a regular file, got %s)", path,
             rt_file_kind(st.st_mode));
    return false;
}

/* true when the absolute path p is root or lies under it */
static bool under(const char *p, const char *root)
{
    size_t n = strlen(root);
    return strncmp(p, root, n) == 0 && (p[n] == 0 || p[n] == '/');
}

bool rt_output_path_check(const char *flag, const char *path, bool prefix, Diag *d)
{
    const char *what = prefix ? "a prefix for PREFIX.stepN.safetensors files" : "a regular file";
    size_t n = strlen(path);
    if (n == 0 || path[n - 1] == '/') {
        snprintf(d->msg, sizeof d->msg,
                 "%s '%s': cannot write: expected %s in a writable directory, got %s", flag, path,
                 prefix ? "a file name prefix (such as ckpt/run)" : "a file name",
                 n ? "a directory name" : "an empty value");
        return false;
    }
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !(prefix && S_ISDIR(st.st_mode))) {
        snprintf(d->msg, sizeof d->msg, "%s %s: cannot write (expected %s, got %s)", flag, path,
                 what, rt_file_kind(st.st_mode));
        return false;
    }
    char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir] = 0; /* keep "/" for a file in the root */
    const char *dn = slash ? dir : ".";
    bool ok = false;
    char *real = NULL;
    if (stat(dn, &st) != 0)
        snprintf(d->msg, sizeof d->msg, "%s %s: cannot write: directory %s: %s (expected an "
                 "existing writable directory)", flag, path, dn, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        snprintf(d->msg, sizeof d->msg,
                 "%s %s: cannot write: %s is %s (expected a writable directory)", flag, path, dn,
                 S_ISREG(st.st_mode) ? "a regular file" : rt_file_kind(st.st_mode));
    else if (access(dn, W_OK | X_OK) != 0)
        snprintf(d->msg, sizeof d->msg, "%s %s: cannot write: directory %s is not writable: %s",
                 flag, path, dn, strerror(errno));
    else if ((real = realpath(dn, NULL)) &&
             ((under(real, "/dev") && !under(real, "/dev/shm")) || under(real, "/proc") ||
              under(real, "/sys")))
        snprintf(d->msg, sizeof d->msg,
                 "%s %s: cannot write: directory %s is the system's %s tree, not an ordinary "
                 "directory (expected a directory for files)", flag, path, dn,
                 under(real, "/dev") ? "device" : under(real, "/proc") ? "/proc" : "/sys");
    else
        ok = true;
    free(real);
    free(dir);
    return ok;
}

bool rt_write_atomic(const char *path, const void *const *chunk, const size_t *len, int n,
                     Diag *d)
{
    /* the rename would replace a device node, a FIFO or (through a symlink)
     * what it names with a file: refused before anything is written */
    if (!rt_output_check(path, d))
        return false;
    /* the writer's pid in the name: rt_tmp_sweep tells a dead writer's file */
    char *tmp = xasprintf("%s.tmp.%ld.XXXXXX", path, (long)getpid());
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", path, strerror(errno));
        free(tmp);
        return false;
    }
    bool ok = true;
    for (int i = 0; ok && i < n; i++)
        ok = write_all(fd, chunk[i], len[i]);
    int err = ok ? 0 : errno;
    if (ok && (fchmod(fd, 0644) != 0 || fsync(fd) != 0))
        ok = false, err = errno;
    if (close(fd) != 0 && ok)
        ok = false, err = errno;
    if (ok && rename(tmp, path) != 0)
        ok = false, err = errno;
    if (!ok) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", path, strerror(err));
        unlink(tmp);
    } else {
        /* make the rename durable */
        char *dir = xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[slash == dir] = 0; /* keep "/" for a file in the root */
        int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    free(tmp);
    return ok;
}

/* s[0..) is DIGITS then `after`; returns the rest (NULL: no match).
 * *num gets the digits' value (saturating). */
static const char *digits_then(const char *s, const char *after, long long *num)
{
    long long v = 0;
    const char *c = s;
    for (; *c >= '0' && *c <= '9'; c++)
        v = v > 100000000000LL ? v : v * 10 + (*c - '0');
    if (c == s || strncmp(c, after, strlen(after)) != 0)
        return NULL;
    if (num)
        *num = v;
    return c + strlen(after);
}

int rt_tmp_sweep(const char *head, const char *tail)
{
    char *dir = xstrdup(head);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? head + (slash - dir) + 1 : head;
    if (slash)
        slash[slash == dir] = 0; /* keep "/" for a file in the root */
    DIR *dd = opendir(slash ? dir : ".");
    int removed = 0;
    size_t bl = strlen(base);
    struct dirent *e;
    while (dd && (e = readdir(dd))) {
        const char *s = e->d_name;
        long long pid = 0;
        if (bl == 0 || strncmp(s, base, bl) != 0)
            continue;
        s += bl;
        if (tail && !(s = digits_then(s, tail, NULL)))
            continue;
        if (strncmp(s, ".tmp.", 5) != 0 || !(s = digits_then(s + 5, ".", &pid)))
            continue;
        size_t k = 0;
        while (s[k] && ((s[k] >= '0' && s[k] <= '9') || (s[k] >= 'a' && s[k] <= 'z') ||
                        (s[k] >= 'A' && s[k] <= 'Z')))
            k++;
        if (k != 6 || s[k] || pid <= 0 || pid > INT32_MAX || pid == (long long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive (or not ours to signal: alive too) */
        char *p = xasprintf("%s/%s", slash ? dir : ".", e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISREG(st.st_mode) && unlink(p) == 0)
            removed++;
        free(p);
    }
    if (dd)
        closedir(dd);
    free(dir);
    return removed;
}

bool rt_mkdir_p(const char *path)
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
    struct stat st;
    if (ok && (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))) /* a file of that name */
        ok = false, errno = ENOTDIR;
    else if (ok && access(p, W_OK | X_OK) != 0)
        ok = false;
    free(p);
    return ok;
}

char *rt_cache_path(const char *cache_dir)
{
    if (cache_dir && *cache_dir)
        return xstrdup(cache_dir);
    const char *e = getenv("KILN_CACHE_DIR");
    if (e && *e)
        return xstrdup(e);
    const char *home = getenv("HOME");
    return xasprintf("%s/.cache/kiln", home && *home ? home : "/tmp");
}

enum { CACHE_GRACE_S = 60, STALE_TMP_S = 86400 };

/* The cache limit in bytes from KILN_CACHE_MAX ("2GiB", "500MB", bytes; 0:
 * none); the default, with a warning, when it does not parse. */
static int64_t cache_max(void)
{
    const int64_t def = (int64_t)1 << 30;
    const char *e = getenv("KILN_CACHE_MAX");
    if (!e || !*e)
        return def;
    int64_t v = ir_parse_bytes(e);
    if (v < 0) {
        static bool warned;
        if (!warned)
            fprintf(stderr, "kiln: KILN_CACHE_MAX: expected a size such as 2GiB or 0 (no "
                            "limit), got '%s'; using 1GiB\n", e);
        warned = true;
        return def;
    }
    return v;
}

typedef struct {
    char *name;
    int64_t size;
    time_t mtime;
} CacheFile;

static int by_mtime(const void *a, const void *b)
{
    const CacheFile *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime ? 1 : strcmp(x->name, y->name);
}

/* The pid of the writer of temp file `name` (see the top of this file), or
 * 0 when name is no temp file. */
static long temp_writer(const char *name)
{
    const char *t = strstr(name, ".tmp");
    while (t && strstr(t + 1, ".tmp"))
        t = strstr(t + 1, ".tmp");
    if (t) { /* NAME.tmp.PID (NAME.tmpPID: cubins before the trailer) */
        const char *p = t + 4 + (t[4] == '.');
        char *end;
        long pid = strtol(p, &end, 10);
        return *p >= '0' && *p <= '9' && !*end && pid > 0 ? pid : 0;
    }
    /* kiln-<32 hex>.PID.c, .PID.N.c, .PID.N.o */
    if (strncmp(name, "kiln-", 5) != 0 || strlen(name) < 5 + 32 + 3)
        return 0;
    for (int i = 5; i < 5 + 32; i++)
        if (!strchr("0123456789abcdef", name[i]))
            return 0;
    const char *p = name + 5 + 32;
    if (*p++ != '.' || *p < '0' || *p > '9')
        return 0;
    char *end;
    long pid = strtol(p, &end, 10);
    if (*end == '.' && end[1] >= '0' && end[1] <= '9') {
        strtol(end + 1, &end, 10);
        return pid > 0 && (strcmp(end, ".c") == 0 || strcmp(end, ".o") == 0) ? pid : 0;
    }
    return pid > 0 && strcmp(end, ".c") == 0 ? pid : 0;
}

/* Whether temp file path (writer pid, modified at mtime) is left over from
 * a writer that is gone: its process no longer exists, or it is older than
 * STALE_TMP_S (a pid reused since, or a writer on another machine). */
static bool temp_stale(long pid, time_t mtime)
{
    if (time(NULL) - mtime > STALE_TMP_S)
        return true;
    return pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Removes dir's stale temp files (temp_stale), then the least recently
 * used files of dir whose names start with prefix until they total under
 * 3/4 of the limit; never `keep` (may be NULL), never a file of the last
 * minute. Recency: the later of mtime and atime. */
void rt_cache_prune(const char *dir, const char *prefix, const char *keep, bool verbose)
{
    int64_t max = cache_max();
    DIR *dp = opendir(dir);
    if (!dp)
        return;
    CacheFile *f = NULL;
    size_t n = 0, cap = 0;
    int64_t total = 0;
    int stale = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) != 0 || de->d_name[0] == '.')
            continue;
        char *path = xasprintf("%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(path);
            continue;
        }
        long pid = temp_writer(de->d_name);
        if (pid > 0 && temp_stale(pid, st.st_mtime)) {
            if (unlink(path) == 0)
                stale++;
            free(path);
            continue;
        }
        if (max <= 0) {
            free(path);
            continue;
        }
        if (n == cap)
            f = xrealloc(f, sizeof *f * (cap = cap ? 2 * cap : 64));
        time_t used = st.st_atime > st.st_mtime ? st.st_atime : st.st_mtime;
        f[n++] = (CacheFile){path, (int64_t)st.st_size, used};
        total += (int64_t)st.st_size;
    }
    closedir(dp);
    if (verbose && stale)
        fprintf(stderr, "kiln: cache %s: removed %d temp files left by writers that are gone\n",
                dir, stale);
    if (max > 0 && total > max) {
        qsort(f, n, sizeof *f, by_mtime);
        time_t now_t = time(NULL);
        int removed = 0;
        for (size_t i = 0; i < n && total > max / 4 * 3; i++) {
            if ((keep && strcmp(f[i].name, keep) == 0) || now_t - f[i].mtime < CACHE_GRACE_S)
                continue;
            if (unlink(f[i].name) == 0) {
                total -= f[i].size;
                removed++;
            }
        }
        if (verbose)
            fprintf(stderr, "kiln: cache %s over %lld bytes: removed %d least recently used "
                            "files\n", dir, (long long)max, removed);
    }
    for (size_t i = 0; i < n; i++)
        free(f[i].name);
    free(f);
}
