/* runlog.c - `--log-dir DIR`: a run's metrics as JSON lines and a report
 * page with plots.
 *
 *   DIR/metrics.jsonl  one object per training step, written as the step
 *                      ends (one write() per line: a killed run keeps every
 *                      finished step)
 *   DIR/eval.jsonl     one object per evaluation
 *
 * The JSON lines are whole or absent: a line whose write fails (a full
 * disk) is cut back off the file (ftruncate to the last whole line) and
 * the failure, "PATH: cannot write: REASON", goes to the caller, which
 * stops the run. KILN_TEST_LOG_FULL=BYTES (tests only): the two files
 * behave as if their disk had BYTES free: a write past them writes what
 * fits and fails with ENOSPC.
 *   DIR/report.html    written once at the end (atomically): one
 *                      self-contained page, no script and no network access;
 *                      every plot is an inline SVG that kiln draws here
 *
 * The page holds what the caller handed in: the loss curves (training, and
 * validation points), every extra scalar output (training curve and
 * validation points), the held-out accuracy, the learning rate and the
 * gradient norm, tokens/s over the run, the profile by kind and its ten
 * costliest kernels (each with the script lines of its ops), the memory timeline from memplan with the
 * recomputed ops marked, the remat sweep (kiln compile), and with several
 * ranks rank 0's compute and communication timeline of one step. Each plot
 * is an <svg> with a data-series attribute per series (tests read them).
 */
#include "train.h"
#include "codegen.h" /* CgPlan: the plan step behind a profile row */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef VEC(double) Doubles;

/* One JSON-lines file: its descriptor and the length of its whole lines. */
typedef struct {
    int fd; /* -1: not open */
    char *path;
    off_t len;
} LineFile;

struct RunLog {
    char *dir;
    LineFile metrics, eval;
    int64_t room; /* KILN_TEST_LOG_FULL: bytes the disk takes; -1: no limit */
    char *title;
    Doubles step, loss, tps;           /* per training step */
    bool tps_examples;                 /* tps counts examples (no token axis) */
    Doubles vstep, vloss;              /* per evaluation */
    Doubles lr, gnorm, vacc;           /* per step; per evaluation (NaN: none) */
    /* the extra scalar outputs, by name (the first step's; an evaluation's
     * names are looked up among them): nx series per step and per eval */
    int nx;
    char **xname;
    Doubles *xs, *xv;
    FILE *body;                        /* the report's sections so far */
    char *body_buf;
    size_t body_len;
};

static void json_name(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* A JSON number, or null for a value JSON cannot hold (nan, inf). */
static void json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

static void html_text(FILE *f, const char *s)
{
    for (const char *p = s; *p; p++) {
        if (*p == '<')
            fputs("&lt;", f);
        else if (*p == '>')
            fputs("&gt;", f);
        else if (*p == '&')
            fputs("&amp;", f);
        else if (*p == '"')
            fputs("&quot;", f);
        else
            fputc(*p, f);
    }
}

static bool open_log(const char *dir, const char *name, LineFile *lf, Diag *d)
{
    lf->path = xasprintf("%s/%s", dir, name);
    if (!rt_output_check(lf->path, d))
        return false;
    lf->fd = open(lf->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (lf->fd < 0)
        snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", lf->path, strerror(errno));
    return lf->fd >= 0;
}

/* Appends the whole line s[0..n) to lf, or nothing: a write that fails
 * part-way is cut back to the last whole line. False with "PATH: cannot
 * write: REASON" in d. */
static bool write_line(RunLog *l, LineFile *lf, const char *s, size_t n, Diag *d)
{
    size_t done = 0;
    int err = 0;
    while (done < n) {
        size_t want = n - done;
        if (l->room >= 0 && (int64_t)want > l->room)
            want = (size_t)l->room;
        if (want == 0) {
            err = ENOSPC;
            break;
        }
        ssize_t k = write(lf->fd, s + done, want);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            err = k < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)k;
        if (l->room >= 0)
            l->room -= k;
    }
    if (!err) {
        lf->len += (off_t)n;
        return true;
    }
    int k = snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", lf->path, strerror(err));
    if (done > 0 && (ftruncate(lf->fd, lf->len) != 0 || lseek(lf->fd, lf->len, SEEK_SET) < 0))
        snprintf(d->msg + k, sizeof d->msg - (size_t)k,
                 " (and the cut line could not be removed: %s)", strerror(errno));
    return false;
}

/* Ends a line file: its data on disk (an error a file system reports only
 * now), closed. */
static bool close_log(LineFile *lf, Diag *d)
{
    bool ok = true;
    if (lf->fd >= 0) {
        if (d && (fsync(lf->fd) != 0 && errno != EINVAL)) {
            snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", lf->path, strerror(errno));
            ok = false;
        }
        if (close(lf->fd) != 0 && d && ok) {
            snprintf(d->msg, sizeof d->msg, "%s: cannot write: %s", lf->path, strerror(errno));
            ok = false;
        }
        lf->fd = -1;
    }
    return ok;
}

bool rt_runlog_dir(const char *dir, Diag *d)
{
    struct stat st;
    if (!*dir) {
        snprintf(d->msg, sizeof d->msg, "--log-dir: expected a directory, got an empty value");
        return false;
    }
    if (rt_mkdir_p(dir))
        return true;
    int e = errno;
    /* the first part of the path that is there but is not a directory */
    char *p = xstrdup(dir);
    bool found = false;
    for (char *c = p + 1;; c++) {
        char was = *c;
        if (was && was != '/')
            continue;
        *c = 0;
        if (stat(p, &st) == 0 && !S_ISDIR(st.st_mode)) {
            found = true;
            break;
        }
        if (!was)
            break;
        *c = was;
    }
    if (found && strcmp(p, dir) == 0)
        snprintf(d->msg, sizeof d->msg, "--log-dir %s: not a directory (expected a directory, "
                 "got %s)", dir, S_ISREG(st.st_mode) ? "a regular file" : rt_file_kind(st.st_mode));
    else if (found)
        snprintf(d->msg, sizeof d->msg, "--log-dir %s: cannot create the directory: %s is %s "
                 "(expected a directory)", dir, p,
                 S_ISREG(st.st_mode) ? "a regular file" : rt_file_kind(st.st_mode));
    else
        snprintf(d->msg, sizeof d->msg, "--log-dir %s: cannot create the directory or write in "
                 "it: %s", dir, strerror(e));
    free(p);
    return false;
}

RunLog *rt_runlog_open(const char *dir, const char *title, bool training, Diag *d)
{
    if (!rt_runlog_dir(dir, d))
        return NULL;
    RunLog *l = xcalloc(1, sizeof *l);
    l->dir = xstrdup(dir);
    l->title = xstrdup(title);
    l->metrics.fd = l->eval.fd = -1;
    l->room = -1;
    const char *full = getenv("KILN_TEST_LOG_FULL");
    if (full && *full)
        l->room = strtoll(full, NULL, 10);
    if (training && (!open_log(dir, "metrics.jsonl", &l->metrics, d) ||
                     !open_log(dir, "eval.jsonl", &l->eval, d))) {
        rt_runlog_free(l);
        return NULL;
    }
    l->body = open_memstream(&l->body_buf, &l->body_len);
    if (!l->body)
        die("open_memstream: out of memory");
    return l;
}

void rt_runlog_free(RunLog *l)
{
    if (!l)
        return;
    close_log(&l->metrics, NULL);
    close_log(&l->eval, NULL);
    free(l->metrics.path);
    free(l->eval.path);
    if (l->body)
        fclose(l->body);
    free(l->body_buf);
    vec_free(&l->step);
    vec_free(&l->loss);
    vec_free(&l->tps);
    vec_free(&l->vstep);
    vec_free(&l->vloss);
    vec_free(&l->lr);
    vec_free(&l->gnorm);
    vec_free(&l->vacc);
    for (int i = 0; i < l->nx; i++) {
        free(l->xname[i]);
        vec_free(&l->xs[i]);
        vec_free(&l->xv[i]);
    }
    free(l->xname);
    free(l->xs);
    free(l->xv);
    free(l->title);
    free(l->dir);
    free(l);
}

/* A line under construction (a memory stream). */
static FILE *line_open(char **buf, size_t *len)
{
    FILE *f = open_memstream(buf, len);
    if (!f)
        die("open_memstream: out of memory");
    return f;
}

/* Ends the line of f (its buffer *buf, *len) and writes it to lf. */
static bool line_write(RunLog *l, LineFile *lf, FILE *f, char **buf, const size_t *len, Diag *d)
{
    if (fclose(f) != 0)
        die("open_memstream: out of memory");
    bool ok = write_line(l, lf, *buf, *len, d);
    free(*buf);
    return ok;
}

bool rt_runlog_step(RunLog *l, const RtStepRecord *s, Diag *d)
{
    if (!l || l->metrics.fd < 0)
        return true;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = line_open(&buf, &len);
    fprintf(f, "{\"step\":%lld,\"loss\":", (long long)s->step);
    json_num(f, s->loss);
    for (int i = 0; i < s->nextra; i++) {
        fputc(',', f);
        json_name(f, s->extra_name[i]);
        fputc(':', f);
        json_num(f, s->extra[i]);
    }
    static const char *keys[] = {"lr", "grad_norm", "ms", "examples_per_s", "tokens_per_s",
                                 "mfu", "hfu", "comm_ms", "comm_exposed_ms", "tp_comm_ms",
                                 "tp_comm_exposed_ms"};
    double v[] = {s->lr, s->grad_norm, s->ms, s->examples_per_s, s->tokens_per_s,
                  s->mfu, s->hfu, s->comm_ms, s->comm_exposed_ms, s->tp_comm_ms,
                  s->tp_comm_exposed_ms};
    for (int i = 0; i < (int)(sizeof v / sizeof v[0]); i++) {
        fprintf(f, ",\"%s\":", keys[i]);
        json_num(f, v[i]);
    }
    fprintf(f, ",\"mem_bytes\":%lld}\n", (long long)s->mem_bytes);
    if (!line_write(l, &l->metrics, f, &buf, &len, d))
        return false;
    vec_push(&l->step, (double)s->step);
    vec_push(&l->loss, s->loss);
    vec_push(&l->lr, s->lr);
    vec_push(&l->gnorm, s->grad_norm);
    if (l->step.n == 1 && s->nextra > 0) { /* the run's extra outputs */
        l->nx = s->nextra;
        l->xname = xcalloc((size_t)l->nx, sizeof *l->xname);
        l->xs = xcalloc((size_t)l->nx, sizeof *l->xs);
        l->xv = xcalloc((size_t)l->nx, sizeof *l->xv);
        for (int i = 0; i < l->nx; i++)
            l->xname[i] = xstrdup(s->extra_name[i]);
    }
    for (int i = 0; i < l->nx; i++)
        vec_push(&l->xs[i], i < s->nextra ? s->extra[i] : NAN);
    /* the report plots tokens/s where the data has tokens, else examples/s */
    l->tps_examples = isnan(s->tokens_per_s);
    vec_push(&l->tps, l->tps_examples ? s->examples_per_s : s->tokens_per_s);
    return true;
}

bool rt_runlog_eval(RunLog *l, int64_t step, double val_loss, const char *const *names,
                    const double *vals, int n, double accuracy, Diag *d)
{
    if (!l || l->eval.fd < 0)
        return true;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = line_open(&buf, &len);
    fprintf(f, "{\"step\":%lld,\"val_loss\":", (long long)step);
    json_num(f, val_loss);
    for (int i = 0; i < n; i++) {
        fputc(',', f);
        json_name(f, names[i]);
        fputc(':', f);
        json_num(f, vals[i]);
    }
    if (!isnan(accuracy)) {
        fputs(",\"accuracy\":", f);
        json_num(f, accuracy);
    }
    fputs("}\n", f);
    if (!line_write(l, &l->eval, f, &buf, &len, d))
        return false;
    vec_push(&l->vstep, (double)step);
    vec_push(&l->vloss, val_loss);
    vec_push(&l->vacc, accuracy);
    for (int k = 0; k < l->nx; k++) {
        double v = NAN;
        for (int i = 0; i < n; i++)
            if (strcmp(names[i], l->xname[k]) == 0)
                v = vals[i];
        vec_push(&l->xv[k], v);
    }
    return true;
}

/* ---- SVG ------------------------------------------------------------------ */

enum { W = 760, H = 300, ML = 70, MR = 20, MT = 30, MB = 45 };

/* A 1-2-5 tick step for the range [lo, hi] with about n ticks. */
static double nice_step(double lo, double hi, int n)
{
    double raw = (hi - lo) / n;
    if (!(raw > 0))
        return 1;
    double p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

static void fmt_tick(double v, char *b, size_t n)
{
    double a = fabs(v);
    if (a >= 1e9)
        snprintf(b, n, "%gG", v / 1e9);
    else if (a >= 1e6)
        snprintf(b, n, "%gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(b, n, "%gk", v / 1e3);
    else
        snprintf(b, n, "%g", v);
}

typedef struct {
    const char *name, *color;
    const double *x, *y;
    int n;
    bool points; /* markers instead of a line */
} Series;

static const char *palette[] = {"#3366cc", "#dc3912", "#ff9900", "#109618", "#990099"};

/* A line chart of the series over shared axes; at most ~1500 points per
 * series are drawn (evenly strided), the data-series attribute names them. */
static void svg_chart(FILE *f, const char *title, const char *xlabel, const char *ylabel,
                      const Series *s, int ns)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i]))
                continue;
            x0 = fmin(x0, s[k].x[i]), x1 = fmax(x1, s[k].x[i]);
            y0 = fmin(y0, s[k].y[i]), y1 = fmax(y1, s[k].y[i]);
        }
    fprintf(f, "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" data-series=\"", W, H, W, H);
    for (int k = 0; k < ns; k++) {
        fputs(k ? "," : "", f);
        html_text(f, s[k].name);
    }
    fputs("\">\n", f);
    fprintf(f, "<text x=\"%d\" y=\"18\" font-size=\"14\" font-weight=\"bold\">", ML);
    html_text(f, title);
    fputs("</text>\n", f);
    if (!(x0 <= x1)) {
        fprintf(f, "<text x=\"%d\" y=\"%d\">no data</text></svg></figure>\n", ML, H / 2);
        return;
    }
    if (x1 == x0)
        x1 = x0 + 1;
    if (y1 == y0)
        y1 = y0 + fmax(1e-9, fabs(y0) * 0.1);
    double ys = nice_step(y0, y1, 5), xs = nice_step(x0, x1, 8);
    y0 = floor(y0 / ys) * ys, y1 = ceil(y1 / ys) * ys;
    double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + ((v) - x0) / (x1 - x0) * pw)
#define PY(v) (MT + ph - ((v) - y0) / (y1 - y0) * ph)
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"#999\"/>\n", ML, MT, pw, ph);
    char b[32];
    for (double v = y0; v <= y1 + ys * 1e-6; v += ys) {
        fmt_tick(fabs(v) < ys * 1e-9 ? 0 : v, b, sizeof b);
        fprintf(f, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                ML, ML + pw, PY(v), PY(v), ML - 5, PY(v) + 4, b);
    }
    for (double v = ceil(x0 / xs) * xs; v <= x1 + xs * 1e-6; v += xs) {
        fmt_tick(v, b, sizeof b);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">%s"
                   "</text>\n", PX(v), MT + ph + 16, b);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">", ML + pw / 2,
            H - 8);
    html_text(f, xlabel);
    fprintf(f, "</text><text x=\"14\" y=\"%.0f\" font-size=\"12\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 14 %.0f)\">", MT + ph / 2, MT + ph / 2);
    html_text(f, ylabel);
    fputs("</text>\n", f);
    for (int k = 0; k < ns; k++) {
        const char *c = s[k].color ? s[k].color : palette[k % 5];
        int stride = s[k].n > 1500 ? (s[k].n + 1499) / 1500 : 1;
        if (s[k].points) {
            for (int i = 0; i < s[k].n; i += stride)
                if (isfinite(s[k].y[i]))
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                            PX(s[k].x[i]), PY(s[k].y[i]), c);
        } else {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c);
            for (int i = 0; i < s[k].n; i += stride)
                if (isfinite(s[k].y[i]))
                    fprintf(f, "%.1f,%.1f ", PX(s[k].x[i]), PY(s[k].y[i]));
            fputs("\"/>\n", f);
        }
        fprintf(f, "<rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                   "<text x=\"%.0f\" y=\"%d\" font-size=\"11\">", ML + pw - 150, MT + 6 + 14 * k,
                c, ML + pw - 136, MT + 15 + 14 * k);
        html_text(f, s[k].name);
        fputs("</text>\n", f);
    }
#undef PX
#undef PY
    fputs("</svg></figure>\n", f);
}

/* Horizontal bars: label, value (v[i] in unit), share of total. */
static void svg_bars(FILE *f, const char *title, const char *series, const char *const *label,
                     const double *v, int n, double total, const char *unit)
{
    int h = MT + 22 * n + 10;
    double max = 0;
    for (int i = 0; i < n; i++)
        max = fmax(max, v[i]);
    fprintf(f, "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" data-series=\"%s\">\n<text x=\"10\" y=\"18\" "
               "font-size=\"14\" font-weight=\"bold\">",
            W, h, W, h, series);
    html_text(f, title);
    fputs("</text>\n", f);
    for (int i = 0; i < n; i++) {
        double w = max > 0 ? v[i] / max * 260 : 0;
        int y = MT + 22 * i;
        fprintf(f, "<text x=\"10\" y=\"%d\" font-size=\"11\" font-family=\"monospace\">", y + 13);
        char lb[72];
        snprintf(lb, sizeof lb, "%.54s", label[i]);
        html_text(f, lb);
        fprintf(f, "</text><rect x=\"400\" y=\"%d\" width=\"%.1f\" height=\"16\" "
                   "fill=\"#3366cc\"/><text x=\"%.1f\" y=\"%d\" font-size=\"11\">%.3g %s "
                   "(%.1f%%)</text>\n",
                y, w, 405 + w, y + 13, v[i], unit, total > 0 ? 100 * v[i] / total : 0.0);
    }
    fputs("</svg></figure>\n", f);
}

/* ---- sections --------------------------------------------------------------- */

/* Appends line to the distinct lines ls (at most nl kept); whether new. */
static bool add_line(int *ls, int *nl, int max, int line)
{
    for (int i = 0; i < *nl; i++)
        if (ls[i] == line)
            return false;
    if (*nl < max)
        ls[(*nl)++] = line;
    return true;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* " (FILE:L1,L2,L3...)" for plan step `step` of p into buf: the script
 * lines of its op and, for a fused kernel, of every op of its fuse group
 * (up to 4 lines, "..." past them; FILE without its directories); "" when
 * the row has no op or no line. */
static void step_where(const Graph *g, const CgPlan *p, int step, char *buf, size_t n)
{
    buf[0] = 0;
    if (!g || !p || step < 0 || step >= p->steps.n || p->steps.v[step].op < 0 ||
        p->steps.v[step].op >= g->ops.n)
        return;
    const Op *op = &g->ops.v[p->steps.v[step].op];
    int ls[4], nl = 0, more = 0;
    const char *file = op->loc.file;
    if (op->loc.line > 0)
        add_line(ls, &nl, 4, op->loc.line);
    if (op->group >= 0)
        for (int i = 0; i < g->ops.n; i++) {
            const Op *o = &g->ops.v[i];
            if (o->group != op->group || o->loc.line <= 0 || !o->loc.file)
                continue;
            if (!file)
                file = o->loc.file;
            if (strcmp(o->loc.file, file) == 0 && add_line(ls, &nl, 4, o->loc.line) && nl == 4)
                more += o->loc.line != ls[3];
        }
    if (!nl || !file)
        return;
    qsort(ls, (size_t)nl, sizeof *ls, cmp_int);
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    size_t k = (size_t)snprintf(buf, n, " (%.60s:", base);
    for (int i = 0; i < nl && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? "," : "", ls[i]);
    if (k < n)
        snprintf(buf + k, n - k, "%s)", more ? ",..." : "");
}

void rt_runlog_profile(RunLog *l, const RtProfRow *rows, int n, double step_ms,
                       int64_t steps, const Graph *g, const struct CgPlan *plan)
{
    if (!l || n <= 0 || steps <= 0)
        return;
    FILE *f = l->body;
    /* the kinds in order of first appearance (gemm, kernel, copy, the
     * collectives' waits ...); shares are of the sum over every row */
    const char *kl[16];
    double kv[16] = {0}, total = 0;
    int nk = 0;
    for (int i = 0; i < n; i++) {
        const char *k = rows[i].kind ? rows[i].kind : "other";
        int j = 0;
        while (j < nk && strcmp(kl[j], k) != 0)
            j++;
        if (j == nk && nk < 16)
            kl[nk++] = k;
        if (j < nk)
            kv[j] += 1e3 * rows[i].seconds / (double)steps;
        total += 1e3 * rows[i].seconds / (double)steps;
    }
    fprintf(f, "<h2>Profile</h2>\n<p>Per training step, averaged over %lld steps (the median "
               "step took %.3f ms; shares are of the %.3f ms the profiled calls took).</p>\n",
            (long long)steps, step_ms, total);
    svg_bars(f, "time per step by kind", "by kind", kl, kv, nk, total, "ms");
    /* the ten costliest kernels */
    int idx[10], m = 0;
    bool *used = xcalloc((size_t)n, 1);
    for (; m < 10 && m < n; m++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!used[i] && (best < 0 || rows[i].seconds > rows[best].seconds))
                best = i;
        used[best] = true;
        idx[m] = best;
    }
    free(used);
    const char *ln[10];
    char lb[10][128];
    double lv[10];
    for (int i = 0; i < m; i++) {
        char where[96];
        step_where(g, plan, rows[idx[i]].step, where, sizeof where);
        snprintf(lb[i], sizeof lb[i], "%.30s%s", rows[idx[i]].name, where);
        ln[i] = lb[i];
        lv[i] = 1e3 * rows[idx[i]].seconds / (double)steps;
    }
    svg_bars(f, "the ten costliest kernels (script lines of their ops)", "costliest kernels", ln,
             lv, m, total, "ms");
}

void rt_runlog_memory(RunLog *l, const Graph *g, const MemPlan *mp)
{
    if (!l || !mp || mp->nops <= 0)
        return;
    FILE *f = l->body;
    int n = mp->nops;
    double *x = xmalloc(sizeof(double) * (size_t)n), *y = xmalloc(sizeof(double) * (size_t)n);
    double *rx = xmalloc(sizeof(double) * (size_t)n), *ry = xmalloc(sizeof(double) * (size_t)n);
    int nr = 0;
    for (int i = 0; i < n; i++) {
        x[i] = i;
        y[i] = (double)(mp->persistent_bytes + mp->live[i]) / 1048576.0;
        if (i < g->ops.n && (g->ops.v[i].flags & OPF_RECOMPUTE)) {
            rx[nr] = i;
            ry[nr++] = y[i];
        }
    }
    char pk[32], ps[32];
    ir_fmt_bytes((double)mp->arena_bytes, 2, pk, sizeof pk);
    ir_fmt_bytes((double)mp->persistent_bytes, 2, ps, sizeof ps);
    fprintf(f, "<h2>Memory</h2>\n<p>The memory plan of the step: bytes live while each op "
               "runs, persistent region (%s: params, state, inputs) included; the arena is %s. "
               "%d ops are recomputations (remat), marked in orange.</p>\n", ps, pk, nr);
    Series s[2] = {{"live memory", NULL, x, y, n, false},
                   {"recomputed ops", "#ff9900", rx, ry, nr, true}};
    svg_chart(f, "memory timeline (memplan)", "op in schedule order", "MiB", s, nr ? 2 : 1);
    free(x);
    free(y);
    free(rx);
    free(ry);
}

void rt_runlog_comm(RunLog *l, int nranks, double step_start, double step_end,
                    const RtCommEvent *ev, int nev)
{
    if (!l || nranks <= 1 || !(step_end > step_start))
        return;
    FILE *f = l->body;
    double span = step_end - step_start;
    for (int i = 0; i < nev; i++)
        span = fmax(span, ev[i].end - step_start);
    int h = 110;
    fprintf(f, "<h2>Compute and communication</h2>\n<p>Rank 0 of %d, one step (the last): the "
               "step on the compute stream and each gradient bucket's all-reduce on the "
               "communication thread, in milliseconds from the step's start.</p>\n", nranks);
    fprintf(f, "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" data-series=\"compute,communication\">\n",
            W, h, W, h);
    double pw = W - 120 - MR;
#define TX(t) (120 + ((t) - step_start) / span * pw)
    fprintf(f, "<text x=\"10\" y=\"34\" font-size=\"12\">compute</text><rect x=\"%.1f\" "
               "y=\"22\" width=\"%.1f\" height=\"18\" fill=\"#3366cc\"/>\n",
            TX(step_start), TX(step_end) - TX(step_start));
    fputs("<text x=\"10\" y=\"64\" font-size=\"12\">communication</text>\n", f);
    for (int i = 0; i < nev; i++)
        fprintf(f, "<rect x=\"%.1f\" y=\"52\" width=\"%.1f\" height=\"18\" fill=\"#dc3912\" "
                   "stroke=\"#fff\"><title>bucket %d: %.3f ms</title></rect>\n",
                TX(ev[i].start), fmax(1, TX(ev[i].end) - TX(ev[i].start)), ev[i].bucket,
                1e3 * (ev[i].end - ev[i].start));
    fprintf(f, "<text x=\"120\" y=\"95\" font-size=\"11\">0 ms</text><text x=\"%d\" y=\"95\" "
               "font-size=\"11\" text-anchor=\"end\">%.3f ms</text>\n",
            W - MR, 1e3 * span);
#undef TX
    fputs("</svg></figure>\n", f);
}

void rt_runlog_sweep(RunLog *l, const RematSweepPoint *p, int n)
{
    if (!l || n <= 0)
        return;
    FILE *f = l->body;
    double *x = xmalloc(sizeof(double) * (size_t)n), *pk = xmalloc(sizeof(double) * (size_t)n);
    double *st = xmalloc(sizeof(double) * (size_t)n);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!p[i].fits)
            continue;
        x[m] = (double)p[i].budget / 1048576.0;
        pk[m] = (double)p[i].peak / 1048576.0;
        st[m++] = 1e3 * p[i].step_seconds;
    }
    fputs("<h2>Recompute sweep</h2>\n<p>The remat pass's choice (auto) at memory budgets from "
          "the smallest feasible to the peak without recomputation: its planned peak and its "
          "predicted step time.</p>\n", f);
    Series a[1] = {{"planned peak", NULL, x, pk, m, false}};
    svg_chart(f, "planned peak against the budget", "budget (MiB)", "MiB", a, 1);
    Series b[1] = {{"predicted step", "#dc3912", x, st, m, false}};
    svg_chart(f, "predicted step time against the budget", "budget (MiB)", "ms", b, 1);
    free(x);
    free(pk);
    free(st);
}

void rt_runlog_sample(RunLog *l, int64_t step, const char *text)
{
    if (!l)
        return;
    fprintf(l->body, "<h2>Sample at step %lld</h2>\n<pre>", (long long)step);
    html_text(l->body, text);
    fputs("</pre>\n", l->body);
}

static bool any_finite(const Doubles *v)
{
    for (int i = 0; i < v->n; i++)
        if (isfinite(v->v[i]))
            return true;
    return false;
}

bool rt_runlog_close(RunLog *l, Diag *d)
{
    if (!l)
        return true;
    if (!close_log(&l->metrics, d) || !close_log(&l->eval, d))
        return false;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        die("open_memstream: out of memory");
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>", f);
    html_text(f, l->title);
    fputs("</title>\n<style>body{font-family:sans-serif;max-width:820px;margin:2em auto;"
          "color:#222}figure{margin:1em 0}h2{border-bottom:1px solid #ccc}</style>\n"
          "</head>\n<body>\n<h1>",
          f);
    html_text(f, l->title);
    fputs("</h1>\n", f);
    if (l->step.n) {
        fputs("<h2>Training</h2>\n", f);
        Series s[2] = {{"train loss", NULL, l->step.v, l->loss.v, l->step.n, false},
                       {"val loss", "#dc3912", l->vstep.v, l->vloss.v, l->vstep.n, true}};
        svg_chart(f, "loss", "step", "loss", s, l->vstep.n ? 2 : 1);
        for (int i = 0; i < l->nx; i++) { /* each extra scalar output */
            char tn[160], vn[160];
            snprintf(tn, sizeof tn, "train %s", l->xname[i]);
            snprintf(vn, sizeof vn, "val %s", l->xname[i]);
            Series x[2] = {{tn, NULL, l->step.v, l->xs[i].v, l->xs[i].n, false},
                           {vn, "#dc3912", l->vstep.v, l->xv[i].v, l->xv[i].n, true}};
            svg_chart(f, l->xname[i], "step", l->xname[i], x, any_finite(&l->xv[i]) ? 2 : 1);
        }
        if (any_finite(&l->vacc)) {
            Series a[1] = {{"val accuracy", "#990099", l->vstep.v, l->vacc.v, l->vacc.n, true}};
            svg_chart(f, "held-out accuracy", "step", "accuracy", a, 1);
        }
        if (any_finite(&l->lr)) {
            Series a[1] = {{"lr", "#ff9900", l->step.v, l->lr.v, l->lr.n, false}};
            svg_chart(f, "learning rate", "step", "lr", a, 1);
        }
        if (any_finite(&l->gnorm)) {
            Series a[1] = {{"grad_norm", "#3366cc", l->step.v, l->gnorm.v, l->gnorm.n, false}};
            svg_chart(f, "gradient norm (before clipping)", "step", "grad_norm", a, 1);
        }
        const char *unit = l->tps_examples ? "examples/s" : "tokens/s";
        Series t[1] = {{unit, "#109618", l->step.v, l->tps.v, l->step.n, false}};
        svg_chart(f, "throughput", "step", unit, t, 1);
    }
    fflush(l->body);
    fwrite(l->body_buf, 1, l->body_len, f);
    fputs("<p><small>Written by kiln.</small></p>\n</body>\n</html>\n", f);
    if (fclose(f) != 0)
        die("open_memstream: out of memory");
    char *path = xasprintf("%s/report.html", l->dir);
    const void *chunk[1] = {buf};
    bool ok = rt_write_atomic(path, chunk, &len, 1, d);
    free(path);
    free(buf);
    return ok;
}
