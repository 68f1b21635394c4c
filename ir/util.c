/* util.c - allocation that never returns NULL, die(), interned strings,
 * hashing, and the small helpers every layer shares: checked arithmetic,
 * byte sizes read and printed, a median. */
#include "ir.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

_Noreturn void die(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "kiln: internal error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

bool ir_mul_ok(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}

bool ir_add_ok(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

int64_t ir_add_sat(int64_t a, int64_t b)
{
    int64_t r;
    return ir_add_ok(a, b, &r) ? r : INT64_MAX;
}

int64_t ir_mul_sat(int64_t a, int64_t b)
{
    int64_t r;
    return ir_mul_ok(a, b, &r) ? r : INT64_MAX;
}

int64_t ir_shard_size(int64_t total, int64_t nranks)
{
    int64_t units = (total + IR_SHARD_ALIGN - 1) / IR_SHARD_ALIGN;
    return (units + nranks - 1) / nranks * IR_SHARD_ALIGN;
}

int64_t ir_parse_bytes(const char *s)
{
    if (!s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0 || !isfinite(v))
        return -1;
    while (*end == ' ')
        end++;
    static const struct {
        const char *suf;
        double mul;
    } sufs[] = {{"", 1},
                {"B", 1},
                {"K", 1e3},
                {"KB", 1e3},
                {"M", 1e6},
                {"MB", 1e6},
                {"G", 1e9},
                {"GB", 1e9},
                {"T", 1e12},
                {"TB", 1e12},
                {"KiB", 1024.0},
                {"MiB", 1024.0 * 1024},
                {"GiB", 1024.0 * 1024 * 1024},
                {"TiB", 1024.0 * 1024 * 1024 * 1024}};
    for (size_t i = 0; i < sizeof sufs / sizeof sufs[0]; i++)
        if (strcmp(end, sufs[i].suf) == 0) {
            double b = v * sufs[i].mul;
            if (b > 9.2e18)
                return -1;
            return (int64_t)llround(b);
        }
    return -1;
}

const char *ir_fmt_bytes(double b, int decimals, char *buf, size_t n)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (b >= 1024 && u < 6)
        b /= 1024, u++;
    if (u == 0 || (decimals < 0 && b == floor(b)))
        snprintf(buf, n, "%.0f %s", b, unit[u]);
    else
        snprintf(buf, n, "%.*f %s", decimals < 0 ? 1 : decimals, b, unit[u]);
    return buf;
}

const char *ir_fmt_seconds(double s, char *buf, size_t n)
{
    return ir_fmt_seconds_ms(s, 2, buf, n);
}

const char *ir_fmt_seconds_ms(double s, int ms_decimals, char *buf, size_t n)
{
    double a = fabs(s);
    if (a >= 1)
        snprintf(buf, n, "%.3f s", s);
    else if (a >= 1e-3)
        snprintf(buf, n, "%.*f ms", ms_decimals, s * 1e3);
    else
        snprintf(buf, n, "%.1f us", s * 1e6);
    return buf;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ir_median(const double *v, int64_t n)
{
    if (n <= 0)
        return 0;
    double *c = xmalloc(sizeof(double) * (size_t)n);
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

uint64_t hash_bytes(const void *p, size_t n, uint64_t seed)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Open-addressing set of strings; never shrinks. */
static struct {
    char **slot;
    size_t cap, n;
} interned;

const char *intern(const char *s)
{
    if (!s)
        return NULL;
    if (2 * (interned.n + 1) > interned.cap) {
        size_t cap = interned.cap ? 2 * interned.cap : 256;
        char **slot = xcalloc(cap, sizeof *slot);
        for (size_t i = 0; i < interned.cap; i++) {
            char *e = interned.slot[i];
            if (!e)
                continue;
            size_t j = hash_bytes(e, strlen(e), 0) & (cap - 1);
            while (slot[j])
                j = (j + 1) & (cap - 1);
            slot[j] = e;
        }
        free(interned.slot);
        interned.slot = slot;
        interned.cap = cap;
    }
    size_t j = hash_bytes(s, strlen(s), 0) & (interned.cap - 1);
    while (interned.slot[j]) {
        if (strcmp(interned.slot[j], s) == 0)
            return interned.slot[j];
        j = (j + 1) & (interned.cap - 1);
    }
    interned.slot[j] = xstrdup(s);
    interned.n++;
    return interned.slot[j];
}
