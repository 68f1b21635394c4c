/* calibrate.c - a per-kernel table (docs/cost.md, "The per-kernel table")
 * read back, and a measured one set against the prediction of the same
 * compile: per kernel class (CgClass), the measured / predicted ratio and
 * the device figure that would have predicted it (`kiln compile --target
 * DEVICE --calibrate FILE`; docs/cost.md, Calibration).
 *
 * The table is user input: any bytes give a table or a message naming the
 * file and line, what was expected and what was found. */
#include "cg_cuda.h"
#include "codegen.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const kt_columns[] = {"kind", "name",  "shape", "calls", "ms",
                                         "flops", "bytes", "op",    "where"};
enum { KT_NCOL = 9, KT_MAX_FIELD = 4096 };

static bool kt_fail(Diag *d, const char *path, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool kt_fail(Diag *d, const char *path, int line, const char *fmt, ...)
{
    int n = snprintf(d->msg, sizeof d->msg, "%s:%d: ", path, line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof d->msg)
        vsnprintf(d->msg + n, sizeof d->msg - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

/* s, printable for a message: at most 60 bytes, control bytes as '?' */
static const char *shown(const char *s, char *buf, size_t n)
{
    size_t i = 0;
    for (; s[i] && i + 4 < n && i < 60; i++)
        buf[i] = (unsigned char)s[i] < 32 || s[i] == 127 ? '?' : s[i];
    if (s[i])
        for (int k = 0; k < 3; k++)
            buf[i++] = '.';
    buf[i] = 0;
    return buf;
}

/* Splits line (NUL-terminated, no newline) at tabs into at most max
 * fields; returns the count (more than max: max + 1). */
static int split_tabs(char *line, char **f, int max)
{
    int n = 0;
    for (char *p = line;;) {
        if (n == max)
            return max + 1;
        f[n++] = p;
        char *t = strchr(p, '\t');
        if (!t)
            return n;
        *t = 0;
        p = t + 1;
    }
}

static bool number(const char *s, double *v)
{
    if (strcmp(s, "-") == 0) {
        *v = 0;
        return true;
    }
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(x) || x < 0)
        return false;
    *v = x;
    return true;
}

static bool count(const char *s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (!*s || *end || errno || x < 0 || *s == '-' || *s == '+')
        return false;
    *v = x;
    return true;
}

/* MxNxK or MxNxKxBATCH, positive: dims[0..3] (batch 1 when absent). */
static bool gemm_shape(const char *s, int64_t dims[4])
{
    dims[3] = 1;
    const char *p = s;
    for (int n = 0; n < 4; n++) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9')
            return false;
        long long x = strtoll(p, &end, 10);
        if (errno || x <= 0)
            return false;
        dims[n] = x;
        if (!*end)
            return n >= 2;
        if (*end != 'x')
            return false;
        p = end + 1;
    }
    return false; /* a fifth dimension */
}

CgKernelTable *cg_kernel_table_parse(const char *text, size_t len, const char *path, Diag *d)
{
    CgKernelTable *t = xcalloc(1, sizeof *t);
    char *buf = xmalloc(len + 1);
    memcpy(buf, text, len);
    buf[len] = 0;
    bool header = false, ok = true;
    int line = 0;
    char *p = buf;
    while (ok && p < buf + len) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        char *end = nl ? nl : buf + len;
        line++;
        if (memchr(p, 0, (size_t)(end - p))) {
            ok = kt_fail(d, path, line, "a NUL byte in the line (expected tab-separated text)");
            break;
        }
        *end = 0;
        if (end > p && end[-1] == '\r')
            end[-1] = 0;
        char *s = p;
        p = end + 1;
        char sb[80];
        if (line == 1) {
            if (strcmp(s, "# kiln kernel table 1") != 0)
                ok = kt_fail(d, path, 1, "expected the first line '# kiln kernel table 1', "
                             "found '%s'", shown(s, sb, sizeof sb));
            continue;
        }
        if (s[0] == '#') { /* metadata: "# key<TAB>value"; unknown keys ignored */
            if (header) {
                ok = kt_fail(d, path, line, "metadata after the header line (expected a row)");
                break;
            }
            char *f[3];
            char *key = s + 1 + (s[1] == ' ');
            if (split_tabs(key, f, 2) != 2)
                continue; /* a comment */
            if (strcmp(f[0], "source") == 0) {
                free(t->source);
                t->source = xstrdup(f[1]);
            } else if (strcmp(f[0], "device") == 0) {
                free(t->device);
                t->device = xstrdup(f[1]);
            } else if (strcmp(f[0], "steps") == 0) {
                int64_t v;
                if (!count(f[1], &v) || v < 1 || v > 1000000000)
                    ok = kt_fail(d, path, line, "steps: expected a whole number of at least 1, "
                                 "found '%s'", shown(f[1], sb, sizeof sb));
                t->steps = (int)v;
            } else if (strcmp(f[0], "step_ms") == 0) {
                if (!number(f[1], &t->step_ms))
                    ok = kt_fail(d, path, line, "step_ms: expected milliseconds, found '%s'",
                                 shown(f[1], sb, sizeof sb));
            }
            continue;
        }
        if (!*s)
            continue; /* blank lines */
        char *f[KT_NCOL + 1];
        int n = split_tabs(s, f, KT_NCOL);
        if (!header) {
            if (n > KT_NCOL)
                ok = kt_fail(d, path, line, "expected the header's %d columns, found more",
                             KT_NCOL);
            for (int i = 0; i < KT_NCOL && ok; i++)
                if (i >= n || strcmp(f[i], kt_columns[i]) != 0)
                    ok = kt_fail(d, path, line, "expected the header 'kind<TAB>name<TAB>shape"
                                 "<TAB>calls<TAB>ms<TAB>flops<TAB>bytes<TAB>op<TAB>where', found "
                                 "column %d '%s'", i + 1, i < n ? shown(f[i], sb, sizeof sb)
                                                               : "(none)");
            header = true;
            continue;
        }
        if (n < KT_NCOL) {
            ok = kt_fail(d, path, line, "expected %d tab-separated fields, found %d", KT_NCOL, n);
            break;
        }
        if (n > KT_NCOL) {
            ok = kt_fail(d, path, line, "expected %d tab-separated fields, found more", KT_NCOL);
            break;
        }
        CgKtRow r = {.line = line};
        if (strcmp(f[0], "gemm") == 0)
            r.kind = CG_KT_GEMM;
        else if (strcmp(f[0], "kernel") == 0)
            r.kind = CG_KT_KERNEL;
        else if (strcmp(f[0], "copy") == 0)
            r.kind = CG_KT_COPY;
        else {
            ok = kt_fail(d, path, line, "kind: expected gemm, kernel or copy, found '%s'",
                         shown(f[0], sb, sizeof sb));
            break;
        }
        if (!*f[1] || strlen(f[1]) > KT_MAX_FIELD) {
            ok = kt_fail(d, path, line, "name: expected a kernel name, found '%s'",
                         shown(f[1], sb, sizeof sb));
            break;
        }
        if (r.kind == CG_KT_GEMM && !gemm_shape(f[2], r.dims)) {
            ok = kt_fail(d, path, line, "shape: expected MxNxK or MxNxKxBATCH for a gemm, found "
                         "'%s'", shown(f[2], sb, sizeof sb));
            break;
        }
        if (!count(f[3], &r.calls)) {
            ok = kt_fail(d, path, line, "calls: expected a whole number, found '%s'",
                         shown(f[3], sb, sizeof sb));
            break;
        }
        const char *what[3] = {"ms", "flops", "bytes"};
        double *dst[3] = {&r.ms, &r.flops, &r.bytes};
        for (int i = 0; i < 3 && ok; i++)
            if (!number(f[4 + i], dst[i]))
                ok = kt_fail(d, path, line, "%s: expected a number of at least 0, found '%s'",
                             what[i], shown(f[4 + i], sb, sizeof sb));
        if (!ok)
            break;
        r.name = xstrdup(f[1]);
        r.op = xstrdup(f[7]);
        r.where = xstrdup(f[8]);
        vec_push(&t->rows, r);
    }
    if (ok && line == 0)
        ok = kt_fail(d, path, 1, "expected the first line '# kiln kernel table 1', found an "
                     "empty file");
    else if (ok && !header)
        ok = kt_fail(d, path, line, "expected the header line 'kind<TAB>name<TAB>...', found "
                     "the end of the file");
    free(buf);
    if (!ok) {
        cg_kernel_table_free(t);
        return NULL;
    }
    if (t->steps < 1)
        t->steps = 1;
    return t;
}

CgKernelTable *cg_kernel_table_read(const char *path, Diag *d)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot open the kernel table: %s", path,
                 strerror(errno));
        return NULL;
    }
    VEC(char) b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        for (size_t i = 0; i < n; i++)
            vec_push(&b, chunk[i]);
    bool err = ferror(f);
    fclose(f);
    if (err) {
        snprintf(d->msg, sizeof d->msg, "%s: cannot read the kernel table", path);
        vec_free(&b);
        return NULL;
    }
    CgKernelTable *t = cg_kernel_table_parse(b.v ? b.v : "", (size_t)b.n, path, d);
    vec_free(&b);
    return t;
}

void cg_kernel_table_free(CgKernelTable *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->rows.n; i++) {
        free(t->rows.v[i].name);
        free(t->rows.v[i].op);
        free(t->rows.v[i].where);
    }
    vec_free(&t->rows);
    free(t->source);
    free(t->device);
    free(t);
}

/* The name a prediction row goes by in a kernel table: gemm_op<N> for a
 * GEMM (N: its IR op index), else its own. */
static void row_name(const CgPredRow *w, const CgPlan *p, char *buf, size_t n)
{
    const CgStep *st = &p->steps.v[w->step];
    if (st->kind == CG_STEP_GEMM && strcmp(w->name, "gemm") == 0)
        snprintf(buf, n, "gemm_op%d", st->op);
    else
        snprintf(buf, n, "%s", w->name);
}

typedef struct {
    int rows;
    int64_t calls;
    double meas_s, pred_s, pred_launch_s, flops, bytes;
} ClassSum;

void cg_calibrate(const CgPrediction *r, const CgPlan *p, const CgKernelTable *t,
                  const char *path, FILE *f)
{
    const CgDevice *dev = r->dev;
    /* the predicted launches of each name, summed */
    typedef struct {
        char name[160];
        double s, launch;
        int cls, n;
        bool used;
    } Pred;
    Pred *pr = xcalloc((size_t)r->rows.n + 1, sizeof *pr);
    int np = 0;
    for (int i = 0; i < r->rows.n; i++) {
        const CgPredRow *w = &r->rows.v[i];
        char name[160];
        row_name(w, p, name, sizeof name);
        int j = 0;
        while (j < np && strcmp(pr[j].name, name) != 0)
            j++;
        if (j == np) {
            snprintf(pr[np].name, sizeof pr[np].name, "%s", name);
            pr[np++].cls = w->cls;
        }
        pr[j].s += w->s;
        pr[j].n++;
    }
    double launch_s = r->launches > 0 ? r->launch_s / r->launches : dev->launch_s;
    ClassSum cs[CG_CLASS__COUNT] = {{0}};
    int unmatched = 0;
    double unmatched_s = 0;
    for (int i = 0; i < t->rows.n; i++) {
        const CgKtRow *m = &t->rows.v[i];
        int j = 0;
        while (j < np && strcmp(pr[j].name, m->name) != 0)
            j++;
        if (j == np) {
            unmatched++;
            unmatched_s += m->ms / 1e3;
            continue;
        }
        ClassSum *c = &cs[pr[j].cls];
        if (!pr[j].used) {
            c->pred_s += pr[j].s;
            c->pred_launch_s += pr[j].n * launch_s;
            pr[j].used = true;
        }
        c->rows++;
        c->calls += m->calls;
        c->meas_s += m->ms / 1e3;
        c->flops += m->flops;
        c->bytes += m->bytes;
    }
    int unmeasured = 0;
    double unmeasured_s = 0;
    for (int j = 0; j < np; j++)
        if (!pr[j].used) {
            unmeasured++;
            unmeasured_s += pr[j].s;
        }
    char a[32], b[32];
    ir_fmt_seconds(r->step_s, a, sizeof a);
    fprintf(f, "calibration of %s against %s (%s on %s, %d step%s", dev->name, path,
            t->source ? t->source : "source not given", t->device ? t->device : "a device not "
            "given", t->steps, t->steps == 1 ? "" : "s");
    if (t->step_ms > 0)
        fprintf(f, ", step %.3f ms): predicted step %s, measured/predicted %.2f\n", t->step_ms,
                a, r->step_s > 0 ? t->step_ms / 1e3 / r->step_s : 0.0);
    else
        fprintf(f, "): predicted step %s\n", a);
    if (t->device && strcmp(t->device, dev->name) != 0 &&
        !(strncmp(t->device, "cuda:", 5) == 0 && dev->gpu))
        fprintf(f, "  note: the table was measured on %s, the prediction is for %s\n",
                t->device, dev->name);
    fprintf(f, "  %-12s %5s %7s %12s %12s %8s  %s\n", "class", "rows", "calls", "measured",
            "predicted", "meas/pred", "fitted");
    double peak = r->peak > 0 ? r->peak : dev->f32;
    for (int c = 0; c < CG_CLASS__COUNT; c++) {
        const ClassSum *x = &cs[c];
        if (!x->rows)
            continue;
        ir_fmt_seconds(x->meas_s, a, sizeof a);
        ir_fmt_seconds(x->pred_s, b, sizeof b);
        double ratio = x->pred_s > 0 ? x->meas_s / x->pred_s : 0;
        fprintf(f, "  %-12s %5d %7lld %12s %12s %8.2f  ", cg_class_name((CgClass)c), x->rows,
                (long long)x->calls, a, b, ratio);
        if (c == CG_CLASS_LAUNCH) { /* the overhead that would have predicted them */
            fprintf(f, "launch %.2f us a call (now %.2f)\n",
                    x->calls > 0 ? x->meas_s / x->calls * 1e6 : 0, launch_s * 1e6);
            continue;
        }
        /* the body of the launches, without their overhead */
        double body_m = x->meas_s - x->calls * launch_s, body_p = x->pred_s - x->pred_launch_s;
        if (body_m <= 0 || body_p <= 0 || ratio <= 0) {
            fprintf(f, "-\n");
            continue;
        }
        double scale = body_p / body_m; /* > 1: the device is faster than predicted */
        switch ((CgClass)c) {
        case CG_CLASS_GEMM_LARGE:
        case CG_CLASS_GEMM_WAVES:
        case CG_CLASS_GEMM_SPLITK:
            if (!dev->gpu) {
                fprintf(f, "%.1f GFLOP/s achieved; sgemm rates x %.2f\n",
                        x->flops / body_m / 1e9, scale);
                break;
            }
            fprintf(f, "%.1f %s achieved; gemm_top %.3f (now %.3f)\n",
                    x->flops / body_m / (dev->gpu ? 1e12 : 1e9), dev->gpu ? "TFLOP/s" : "GFLOP/s",
                    (dev->gemm_top > 0 ? dev->gemm_top : 1) * scale,
                    dev->gemm_top > 0 ? dev->gemm_top : 1);
            break;
        case CG_CLASS_ATTN:
            fprintf(f, "%.3f of the peak achieved; the design model's rates x %.2f\n",
                    x->flops / body_m / peak, scale);
            break;
        case CG_CLASS_GEMM_MEMORY:
        case CG_CLASS_MEMORY:
            if (x->bytes <= 0) {
                fprintf(f, "rate x %.2f (the table gives no bytes)\n", scale);
                break;
            }
            fprintf(f, "%.3g %s achieved; bw_eff %.3f (now %.3f)\n",
                    x->bytes / body_m / (dev->gpu ? 1e12 : 1e9), dev->gpu ? "TB/s" : "GB/s",
                    (dev->bw_eff > 0 ? dev->bw_eff : 1) * scale,
                    dev->bw_eff > 0 ? dev->bw_eff : 1);
            break;
        case CG_CLASS_COMPUTE:
            fprintf(f, "kernel rate x %.2f\n", scale);
            break;
        case CG_CLASS_LAUNCH:
        case CG_CLASS__COUNT:
            break;
        }
    }
    if (unmatched) {
        ir_fmt_seconds(unmatched_s, a, sizeof a);
        fprintf(f, "  %d measured row%s (%s) name%s no predicted launch\n", unmatched,
                unmatched == 1 ? "" : "s", a, unmatched == 1 ? "s" : "");
    }
    if (unmeasured) {
        ir_fmt_seconds(unmeasured_s, a, sizeof a);
        fprintf(f, "  %d predicted name%s (%s) not in the table\n", unmeasured,
                unmeasured == 1 ? "" : "s", a);
    }
    free(pr);
}
