/* ktable.c - the per-kernel table: one row per launch name of a plan's step,
 * with its calls, milliseconds, FLOPs and bytes per step, in a
 * tab-separated text file (docs/cost.md, "The per-kernel table"). `kiln
 * compile --target DEV --kernel-table F` writes the cost model's rows, `kiln
 * train --profile --kernel-table F` the measured ones; both name a row by
 * its plan step (cg_step_key), so the two files of one compile join on the
 * name, and `kiln compile --calibrate F` reads a measured one back. */
#include "codegen.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const char *cg_step_key(const CgPlan *p, int s)
{
    const CgStep *st = &p->steps.v[s];
    if (st->kind != CG_STEP_GEMM)
        return st->name;
    char b[48];
    snprintf(b, sizeof b, "gemm_op%d", st->op);
    return intern(b);
}

const char *cg_step_class(const CgPlan *p, int s)
{
    switch (p->steps.v[s].kind) {
    case CG_STEP_KERNEL: return "kernel";
    case CG_STEP_GEMM: return "gemm";
    case CG_STEP_COPY:
    case CG_STEP_SHARD_PACK: return "copy";
    case CG_STEP_ALLREDUCE_START:
    case CG_STEP_ALLREDUCE_WAIT:
    case CG_STEP_TP: return "comm";
    }
    return "kernel";
}

void cg_step_shape(const CgPlan *p, int s, char *buf, size_t n)
{
    const CgStep *st = &p->steps.v[s];
    if (st->kind != CG_STEP_GEMM) {
        snprintf(buf, n, "-");
        return;
    }
    const CgGemm *g = &st->gemm;
    if (g->batch > 1)
        snprintf(buf, n, "%lldx%lldx%lldx%lld", (long long)g->M, (long long)g->N,
                 (long long)g->K, (long long)g->batch);
    else
        snprintf(buf, n, "%lldx%lldx%lld", (long long)g->M, (long long)g->N, (long long)g->K);
}

void cg_ktable_row_init(CgKtLine *row, const CgPlan *p, int s)
{
    memset(row, 0, sizeof *row);
    row->step = s;
    row->kind = cg_step_class(p, s);
    row->name = cg_step_key(p, s);
    cg_step_shape(p, s, row->shape, sizeof row->shape);
    int op = p->steps.v[s].op;
    if (op >= 0 && op < p->g->ops.n) {
        const Op *o = &p->g->ops.v[op];
        row->op = ir_opinfo[o->code].name;
        row->file = o->loc.file;
        row->line = o->loc.line;
    }
}

int cg_ktable_from_prediction(const CgPrediction *r, const CgPlan *p, CgKtLine **out)
{
    CgKtLine *rows = xcalloc((size_t)r->rows.n + 1, sizeof *rows);
    int n = 0;
    int last_step = -1; /* a step's rows (a kernel and its casts) are adjacent */
    for (int i = 0; i < r->rows.n; i++) {
        const CgPredRow *w = &r->rows.v[i];
        const char *key = cg_step_key(p, w->step);
        int j;
        for (j = 0; j < n && rows[j].name != key; j++)
            ;
        if (j == n)
            cg_ktable_row_init(&rows[n++], p, w->step);
        if (w->step != last_step)
            rows[j].calls += 1;
        last_step = w->step;
        rows[j].ms += 1e3 * w->s;
        rows[j].flops += w->flops;
        rows[j].bytes += w->bytes;
    }
    *out = rows;
    return n;
}

/* Writes a name for the file: tabs and newlines would break its columns. */
static void put_field(FILE *f, const char *s)
{
    if (!s || !*s) {
        fputc('-', f);
        return;
    }
    for (; *s; s++)
        fputc(*s == '\t' || *s == '\n' || *s == '\r' ? ' ' : *s, f);
}

bool cg_ktable_write(const char *path, const CgKtMeta *m, const CgKtLine *rows, int n, Diag *d)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        snprintf(d->msg, sizeof d->msg, "--kernel-table: the path is too long (%zu bytes)",
                 strlen(path));
        return false;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(d->msg, sizeof d->msg, "--kernel-table: cannot write %.1900s: %s", tmp,
                 strerror(errno));
        return false;
    }
    fprintf(f, "# kiln kernel table 1\n# source\t%s\n# device\t", m->source);
    put_field(f, m->device);
    fprintf(f, "\n# steps\t%lld\n# step_ms\t%.6g\n", (long long)m->steps, m->step_ms);
    fprintf(f, "kind\tname\tshape\tcalls\tms\tflops\tbytes\top\twhere\n");
    for (int i = 0; i < n; i++) {
        const CgKtLine *w = &rows[i];
        fprintf(f, "%s\t", w->kind);
        put_field(f, w->name);
        fprintf(f, "\t%s\t%.6g\t%.6g\t%.6g\t%.6g\t", w->shape[0] ? w->shape : "-", w->calls,
                w->ms, w->flops, w->bytes);
        put_field(f, w->op);
        fputc('\t', f);
        if (w->file) {
            put_field(f, w->file);
            fprintf(f, ":%d", w->line);
        } else {
            fputc('-', f);
        }
        fputc('\n', f);
    }
    bool ok = !ferror(f);
    int e = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        remove(tmp);
        snprintf(d->msg, sizeof d->msg, "--kernel-table: cannot write %.1900s: %s", path,
                 strerror(e));
    }
    return ok;
}
