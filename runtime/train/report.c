/* report.c - what a run reports beyond its step lines: a Chrome trace
 * (chrome://tracing, Perfetto) and the per-kernel profile table. */
#include "train.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *name, *cat; /* interned */
    double ts, dur;         /* microseconds */
    int tid;
} TraceEvent;

struct Trace {
    char *path;
    VEC(TraceEvent) ev;
    const char *thread[8]; /* names of tids 0..7 (interned; NULL: unnamed) */
};

void rt_trace_thread_name(Trace *t, int tid, const char *name)
{
    if (t && tid >= 0 && tid < 8)
        t->thread[tid] = intern(name);
}

Trace *rt_trace_open(const char *path)
{
    Trace *t = xcalloc(1, sizeof *t);
    t->path = xstrdup(path);
    return t;
}

void rt_trace_event(Trace *t, const char *name, const char *cat, double ts_us, double dur_us,
                    int tid)
{
    if (!t)
        return;
    TraceEvent e = {intern(name), intern(cat), ts_us, dur_us, tid};
    vec_push(&t->ev, e);
}

/* s as a JSON string literal appended to buf */
static void json_str(char **buf, size_t *n, size_t *cap, const char *s)
{
    size_t need = 6 * strlen(s) + 3;
    if (*n + need >= *cap) {
        *cap = 2 * (*cap + need);
        *buf = xrealloc(*buf, *cap);
    }
    char *o = *buf + *n;
    *o++ = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *o++ = '\\';
            *o++ = (char)*c;
        } else if (*c < 0x20) {
            o += sprintf(o, "\\u%04x", *c);
        } else {
            *o++ = (char)*c;
        }
    }
    *o++ = '"';
    *n = (size_t)(o - *buf);
}

static void append(char **buf, size_t *n, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char **buf, size_t *n, size_t *cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (*n + (size_t)k + 1 >= *cap) {
        *cap = 2 * (*cap + (size_t)k + 1);
        *buf = xrealloc(*buf, *cap);
    }
    va_start(ap, fmt);
    vsnprintf(*buf + *n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    *n += (size_t)k;
}

bool rt_trace_close(Trace *t, bool write, Diag *d)
{
    if (!t)
        return true;
    if (!write) {
        vec_free(&t->ev);
        free(t->path);
        free(t);
        return true;
    }
    size_t n = 0, cap = 4096;
    char *buf = xmalloc(cap);
    append(&buf, &n, &cap, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    append(&buf, &n, &cap,
           "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
           "\"args\":{\"name\":\"kiln train\"}}");
    for (int i = 0; i < 8; i++)
        if (t->thread[i]) {
            append(&buf, &n, &cap,
                   ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                   "\"args\":{\"name\":",
                   i);
            json_str(&buf, &n, &cap, t->thread[i]);
            append(&buf, &n, &cap, "}}");
        }
    for (int i = 0; i < t->ev.n; i++) {
        const TraceEvent *e = &t->ev.v[i];
        append(&buf, &n, &cap, ",\n{\"name\":");
        json_str(&buf, &n, &cap, e->name);
        append(&buf, &n, &cap, ",\"cat\":");
        json_str(&buf, &n, &cap, e->cat);
        append(&buf, &n, &cap, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":%d}",
               e->ts, e->dur, e->tid);
    }
    append(&buf, &n, &cap, "\n]}\n");
    const void *chunk[1] = {buf};
    bool ok;
    struct stat st;
    if (stat(t->path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        /* a device or a pipe (/dev/stdout): written in place, never
         * replaced by a file; every write checked (a directory: refused
         * by rt_write_atomic) */
        FILE *f = fopen(t->path, "w");
        int err = errno;
        ok = f && fwrite(buf, 1, n, f) == n;
        if (f) {
            err = errno;
            if (fclose(f) != 0 && ok)
                ok = false, err = errno;
        }
        if (!ok)
            snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", t->path,
                     strerror(err ? err : EIO));
    } else {
        ok = rt_write_atomic(t->path, chunk, &n, 1, d);
    }
    free(buf);
    vec_free(&t->ev);
    free(t->path);
    free(t);
    return ok;
}

static int row_cmp(const void *a, const void *b)
{
    const RtProfRow *x = a, *y = b;
    return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : strcmp(x->name, y->name);
}

void rt_profile_print(FILE *f, RtProfRow *rows, int n, double total_ms, int max_rows)
{
    qsort(rows, (size_t)n, sizeof *rows, row_cmp);
    int w = 6;
    for (int i = 0; i < n; i++)
        if ((int)strlen(rows[i].name) > w)
            w = (int)strlen(rows[i].name);
    if (w > 48)
        w = 48;
    fprintf(f, "%-*s %8s %10s %7s %10s %9s\n", w, "kernel", "calls", "total ms", "% step",
            "GFLOP/s", "GB/s");
    double sum = 0;
    RtProfRow rest = {0};
    int shown = max_rows > 0 && n > max_rows ? max_rows - 1 : n;
    for (int i = shown; i < n; i++) {
        rest.calls += rows[i].calls;
        rest.seconds += rows[i].seconds;
        rest.flops += rows[i].flops;
        rest.bytes += rows[i].bytes;
    }
    char rest_name[48];
    snprintf(rest_name, sizeof rest_name, "(%d others)", n - shown);
    rest.name = rest_name;
    for (int i = 0; i <= shown; i++) {
        if (i == shown && shown == n)
            break;
        const RtProfRow *r = i < shown ? &rows[i] : &rest;
        double s = r->seconds, ms = 1e3 * s;
        char gf[32] = "-", gb[32] = "-";
        if (s > 0 && r->flops > 0)
            snprintf(gf, sizeof gf, "%.2f", r->flops / s * 1e-9);
        if (s > 0 && r->bytes > 0)
            snprintf(gb, sizeof gb, "%.2f", r->bytes / s * 1e-9);
        fprintf(f, "%-*.*s %8lld %10.3f %6.1f%% %10s %9s\n", w, w, r->name,
                (long long)r->calls, ms, total_ms > 0 ? 100.0 * ms / total_ms : 0.0, gf, gb);
        sum += ms;
    }
    fprintf(f, "%-*s %8s %10.3f %6.1f%%\n", w, "total", "", sum,
            total_ms > 0 ? 100.0 * sum / total_ms : 0.0);
}
