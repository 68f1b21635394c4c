/* npy.c - a strict reader of NumPy .npy files (format versions 1.0, 2.0 and
 * 3.0) and of a directory of them, into the StTensor/StFile of
 * safetensors.c so the tensors data source reads both the same way.
 *
 * A file is: the magic "\x93NUMPY", major and minor version bytes, the
 * header length (u16 little-endian for 1.x, u32 for 2.x and 3.x), the header
 * (a Python dict literal {'descr': '<f4', 'fortran_order': False,
 * 'shape': (3, 4), } padded with spaces and ended by '\n'), then the data.
 *
 * Accepted: the descrs that are kiln dtypes, little-endian or
 * byte-order-free ('<f4' f32, '<f2' f16, '<i4' i32, '<i8' i64, '|u1' u8;
 * '=' read as '<' on this little-endian host), C order, rank up to
 * IR_MAX_RANK. Refused with "PATH: what (expected ..., got ...)": a bad
 * magic or version, a header that is not exactly that dict (each key once,
 * nothing else), Fortran order, big-endian, object, structured and other
 * dtypes (float64 and the rest, with a hint to convert), a shape whose
 * bytes overflow, and data shorter or longer than the shape says. Nothing
 * is allocated for the data before its size is checked against the file. */
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NPY_MAX_HEADER 65536 /* numpy's own reader refuses headers over 10000 */
#define NPY_MAX_FILES 4096

/* A byte string from the file for a message: printable ASCII, at most 40. */
static const char *show(const char *s, size_t n, char out[48])
{
    size_t k = 0;
    for (; k < n && k < 40; k++)
        out[k] = s[k] >= 0x20 && s[k] < 0x7f ? s[k] : '?';
    if (k < n)
        out[k++] = '.', out[k++] = '.', out[k++] = '.';
    out[k] = 0;
    return out;
}

typedef struct {
    const char *p, *end;
} Lex;

static void skip_ws(Lex *l)
{
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n'))
        l->p++;
}

static bool eat(Lex *l, char c)
{
    skip_ws(l);
    if (l->p < l->end && *l->p == c) {
        l->p++;
        return true;
    }
    return false;
}

/* A quoted string (no escapes: numpy writes none in the three values it
 * reads) into out[n]; false if absent or too long. */
static bool lex_str(Lex *l, char *out, size_t n)
{
    skip_ws(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
        return false;
    char q = *l->p++;
    size_t k = 0;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || k + 1 >= n)
            return false;
        out[k++] = *l->p++;
    }
    if (l->p >= l->end)
        return false;
    l->p++;
    out[k] = 0;
    return true;
}

static bool lex_word(Lex *l, const char *w)
{
    skip_ws(l);
    size_t n = strlen(w);
    if ((size_t)(l->end - l->p) >= n && memcmp(l->p, w, n) == 0) {
        l->p += n;
        return true;
    }
    return false;
}

/* The descr of a kiln dtype, or -1 with why set. */
static int descr_dtype(const char *s, char *why, size_t n)
{
    static const struct {
        const char *code;
        DType t;
    } ok[] = {{"f4", DT_F32}, {"f2", DT_F16}, {"i4", DT_I32}, {"i8", DT_I64}, {"u1", DT_U8}};
    char order = s[0];
    const char *code = s + (order == '<' || order == '>' || order == '|' || order == '=');
    if (strcmp(code, "O") == 0) {
        snprintf(why, n, "an object array (expected numbers, got descr '%s'; object arrays "
                         "hold Python objects, not data)", s);
        return -1;
    }
    bool single = strcmp(code, "u1") == 0 || strcmp(code, "i1") == 0 || strcmp(code, "b1") == 0;
    if (order == '>' && !single) {
        snprintf(why, n, "big-endian data (expected little-endian '<%s', got '%s'; save "
                         "with .astype('<%s'))", code, s, code);
        return -1;
    }
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (strcmp(code, ok[i].code) == 0)
            return (int)ok[i].t;
    const char *hint = strcmp(code, "f8") == 0   ? " (float64: save with .astype(np.float32))"
                       : strcmp(code, "i2") == 0 || strcmp(code, "u2") == 0 ||
                               strcmp(code, "i1") == 0 || strcmp(code, "b1") == 0 ||
                               strcmp(code, "u4") == 0 || strcmp(code, "u8") == 0
                           ? " (save with .astype(np.int32))"
                           : "";
    snprintf(why, n, "a dtype kiln does not have (expected <f4, <f2, <i4, <i8 or |u1, got "
                     "'%s')%s", s, hint);
    return -1;
}

/* Parses the header dict h[0..n) into t's dtype and shape. */
static bool parse_header(const char *path, const char *h, size_t n, StTensor *t, Diag *d)
{
    Lex l = {h, h + n};
    bool have[3] = {false, false, false}; /* descr, fortran_order, shape */
    char why[200], got[48];
    why[0] = 0;
    if (!eat(&l, '{'))
        goto bad;
    while (!eat(&l, '}')) {
        char key[32], val[64];
        if (!lex_str(&l, key, sizeof key) || !eat(&l, ':'))
            goto bad;
        if (strcmp(key, "descr") == 0 && !have[0]) {
            skip_ws(&l);
            if (l.p < l.end && *l.p == '[') {
                snprintf(why, sizeof why,
                         "a structured dtype (expected a plain array, got a record descr)");
                goto bad;
            }
            if (!lex_str(&l, val, sizeof val))
                goto bad;
            int dt = descr_dtype(val, why, sizeof why);
            if (dt < 0)
                goto bad;
            t->dtype = (DType)dt;
            have[0] = true;
        } else if (strcmp(key, "fortran_order") == 0 && !have[1]) {
            if (lex_word(&l, "True")) {
                snprintf(why, sizeof why,
                         "Fortran order (expected C order, fortran_order False; save "
                         "np.ascontiguousarray(a))");
                goto bad;
            }
            if (!lex_word(&l, "False"))
                goto bad;
            have[1] = true;
        } else if (strcmp(key, "shape") == 0 && !have[2]) {
            if (!eat(&l, '('))
                goto bad;
            t->rank = 0;
            while (!eat(&l, ')')) {
                skip_ws(&l);
                int64_t v = 0;
                const char *s0 = l.p;
                while (l.p < l.end && *l.p >= '0' && *l.p <= '9') {
                    if (v > (INT64_MAX - 9) / 10) {
                        snprintf(why, sizeof why, "a dimension too large (expected below "
                                                  "2^63)");
                        goto bad;
                    }
                    v = v * 10 + (*l.p++ - '0');
                }
                if (l.p == s0)
                    goto bad;
                if (t->rank >= IR_MAX_RANK) {
                    snprintf(why, sizeof why, "too many dimensions (expected at most %d)",
                             IR_MAX_RANK);
                    goto bad;
                }
                t->dim[t->rank++] = v;
                /* "(3,)" and "(3, 4)": a comma after each but a last of two or more */
                if (!eat(&l, ',')) {
                    if (!eat(&l, ')'))
                        goto bad;
                    if (t->rank == 1) /* "(3)" is an int, not a tuple */
                        goto bad;
                    break;
                }
            }
            have[2] = true;
        } else {
            goto bad;
        }
        if (!eat(&l, ',')) {
            if (!eat(&l, '}'))
                goto bad;
            break;
        }
    }
    skip_ws(&l);
    if (l.p != l.end || !have[0] || !have[1] || !have[2])
        goto bad;
    return true;
bad:
    if (why[0])
        snprintf(d->msg, sizeof d->msg, "%s: %s", path, why);
    else
        snprintf(d->msg, sizeof d->msg,
                 "%s: corrupt .npy header (expected {'descr': ..., 'fortran_order': False, "
                 "'shape': (...)}, got \"%s\")",
                 path, show(h, n, got));
    return false;
}

bool rt_npy_parse(const char *path, const uint8_t *buf, size_t n, StTensor *t, Diag *d)
{
    memset(t, 0, sizeof *t);
    if (n < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not a .npy file (expected the magic \\x93NUMPY, got %zu bytes without "
                 "it)",
                 path, n);
        return false;
    }
    int major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: unsupported .npy version (expected 1.0, 2.0 or 3.0, got %d.%d)", path,
                 major, minor);
        return false;
    }
    size_t pre = major == 1 ? 10 : 12;
    if (n < pre) {
        snprintf(d->msg, sizeof d->msg, "%s: truncated .npy file (expected a %zu-byte preamble, "
                 "got %zu bytes)", path, pre, n);
        return false;
    }
    uint64_t hlen = major == 1 ? (uint64_t)(buf[8] | buf[9] << 8)
                               : (uint64_t)buf[8] | (uint64_t)buf[9] << 8 |
                                     (uint64_t)buf[10] << 16 | (uint64_t)buf[11] << 24;
    if (hlen > NPY_MAX_HEADER || hlen > n - pre) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: %s .npy header (expected at most %d bytes within the file, got a length "
                 "of %llu in a file of %zu bytes)",
                 path, hlen > n - pre ? "truncated" : "oversized", NPY_MAX_HEADER,
                 (unsigned long long)hlen, n);
        return false;
    }
    if (!parse_header(path, (const char *)buf + pre, (size_t)hlen, t, d)) {
        memset(t, 0, sizeof *t);
        return false;
    }
    uint64_t bytes = (uint64_t)dtype_size(t->dtype), avail = n - pre - hlen;
    bool over = false;
    for (int i = 0; i < t->rank; i++)
        over |= __builtin_mul_overflow(bytes, (uint64_t)t->dim[i], &bytes);
    if (over || bytes != avail) {
        char shape[32];
        if (over)
            snprintf(shape, sizeof shape, "over 2^64");
        else
            snprintf(shape, sizeof shape, "%llu", (unsigned long long)bytes);
        snprintf(d->msg, sizeof d->msg,
                 "%s: %s .npy data (the header's %s shape of rank %d needs %s bytes, got %llu "
                 "after the header)",
                 path, over || bytes > avail ? "truncated" : "oversized",
                 dtype_name(t->dtype), t->rank, shape, (unsigned long long)avail);
        memset(t, 0, sizeof *t);
        return false;
    }
    t->nbytes = (size_t)bytes;
    t->data = xmalloc(t->nbytes ? t->nbytes : 1);
    memcpy(t->data, buf + pre + hlen, t->nbytes);
    return true;
}

/* Reads the regular file path whole into *buf (NULL when empty). Never
 * blocks on a FIFO: opened with O_NONBLOCK and checked with fstat first. */
static bool read_whole(const char *path, uint8_t **buf, size_t *n, Diag *d)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(d->msg, sizeof d->msg, "%s: not a .npy file (expected a regular file, got %s)",
                 path, rt_file_kind(st.st_mode));
        close(fd);
        return false;
    }
    *n = (size_t)st.st_size;
    *buf = *n ? malloc(*n) : NULL;
    if (*n && !*buf) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot allocate %zu bytes to read it", path, *n);
        close(fd);
        return false;
    }
    size_t got = 0;
    while (got < *n) {
        ssize_t k = read(fd, *buf + got, *n - got);
        if (k <= 0) {
            snprintf(d->msg, sizeof d->msg, "%s: cannot read: %s", path,
                     k < 0 ? strerror(errno) : "file shrank while read");
            free(*buf);
            close(fd);
            return false;
        }
        got += (size_t)k;
    }
    close(fd);
    return true;
}

bool rt_npy_read(const char *path, StTensor *t, Diag *d)
{
    uint8_t *buf;
    size_t n;
    memset(t, 0, sizeof *t);
    if (!read_whole(path, &buf, &n, d))
        return false;
    bool ok = rt_npy_parse(path, buf ? buf : (const uint8_t *)"", n, t, d);
    free(buf);
    return ok;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* true when name (NAME.npy) is one of only[0..nonly) or only is NULL */
static bool wanted(const char *name, const char *const *only, int nonly)
{
    if (!only)
        return true;
    size_t len = strlen(name) - 4;
    for (int i = 0; i < nonly; i++)
        if (strlen(only[i]) == len && strncmp(only[i], name, len) == 0)
            return true;
    return false;
}

bool rt_npy_read_dir(const char *dir, const char *const *only, int nonly, StFile *f,
                     char *skipped, size_t nskipped, Diag *d)
{
    memset(f, 0, sizeof *f);
    DIR *dh = opendir(dir);
    if (!dh) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot open directory: %s", dir, strerror(errno));
        return false;
    }
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    bool ok = true;
    while ((e = readdir(dh))) {
        size_t len = strlen(e->d_name);
        if (len <= 4 || strcmp(e->d_name + len - 4, ".npy") != 0 || e->d_name[0] == '.')
            continue;
        if (n == NPY_MAX_FILES) {
            snprintf(d->msg, sizeof d->msg, "%s: too many .npy files (expected at most %d)",
                     dir, NPY_MAX_FILES);
            ok = false;
            break;
        }
        if (n == cap)
            names = xrealloc(names, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *names);
        names[n++] = xstrdup(e->d_name);
    }
    closedir(dh);
    if (ok && n == 0) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: no arrays (expected NAME.npy files, one per model input, got none)", dir);
        ok = false;
    }
    if (ok) {
        qsort(names, (size_t)n, sizeof *names, name_cmp);
        f->t = xcalloc((size_t)n, sizeof *f->t);
    }
    size_t ks = 0;
    if (skipped && nskipped)
        skipped[0] = 0;
    for (int i = 0; ok && i < n; i++) {
        if (!wanted(names[i], only, nonly)) { /* not opened, not parsed */
            if (skipped && ks + 1 < nskipped)
                ks += (size_t)snprintf(skipped + ks, nskipped - ks, "%s%.*s", ks ? ", " : "",
                                       (int)strlen(names[i]) - 4, names[i]);
            continue;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!rt_npy_read(path, &f->t[f->n], d)) {
            ok = false;
            break;
        }
        names[i][strlen(names[i]) - 4] = 0;
        f->t[f->n++].name = names[i];
        names[i] = NULL;
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (!ok)
        rt_st_free(f);
    return ok;
}
