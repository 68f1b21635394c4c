/* util.c - allocation that never returns NULL, die(), interned strings, hashing. */
#include "ir.h"

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
