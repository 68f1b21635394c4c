/* pipeline.c - the flat list of passes, the driver that runs them with the
 * verifier between them, and the dump each pass leaves (--dump-after, kiln
 * opt). The driver tells each pass which passes follow it (o->after): remat
 * plans through them; no pass reads pass_list. */
#include "passes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void pass_opts_default(PassOpts *o)
{
    memset(o, 0, sizeof *o);
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->grad_clip = 1.0;
    o->lion_beta1 = 0.9;
    o->lion_beta2 = 0.99;
    o->nranks = 1;
}

static const char *const optimizer_names[] = {"adamw", "sgd", "lion", "adafactor"};

const char *pass_optimizer_name(int opt)
{
    return opt >= 0 && opt < 4 ? optimizer_names[opt] : "?";
}

int pass_optimizer_parse(const char *name)
{
    for (int i = 0; name && i < 4; i++)
        if (strcmp(name, optimizer_names[i]) == 0)
            return i;
    return -1;
}

const Pass pass_list[] = {
    {"attention", pass_attention},
    {"partition", pass_partition},
    {"autodiff", pass_autodiff},
    {"attnlayout", pass_attention_layout},
    {"optimizer", pass_optimizer},
    {"simplify", pass_simplify},
    {"attndqkv", pass_attention_dqkv},
    {"remat", pass_remat},
    {"fuse", pass_fuse},
    {"comm", pass_comm},
    {"schedule", pass_schedule},
    {"memplan", pass_memplan_run},
};
const int pass_count = (int)(sizeof pass_list / sizeof pass_list[0]);

const Pass *pass_find(const char *name)
{
    for (int i = 0; i < pass_count; i++)
        if (strcmp(pass_list[i].name, name) == 0)
            return &pass_list[i];
    return NULL;
}

/* ---- what a graph shows of the passes run on it ---------------------------
 * Some passes leave a mark a later pass can see; a pass may not run on a
 * graph that carries the mark of a pass the pipeline runs after it (its
 * input would be in a form it was not written for: simplify's CSE would
 * merge remat's recomputed values back, autodiff would differentiate the
 * backward), nor, where it cannot run twice, its own. */
typedef struct {
    const char *pass;   /* whose mark */
    const char *what;   /* the mark, for "found ..." */
    bool rerun;         /* may the pass run again on its own output */
} Mark;

enum { MK_AUTODIFF, MK_ATTNLAYOUT, MK_OPTIMIZER, MK_ATTNDQKV, MK_REMAT, MK_FUSE, MK_COMM, MK__N };
static const Mark marks[MK__N] = {
    [MK_AUTODIFF] = {"autodiff", "a gradient", false},
    [MK_ATTNLAYOUT] = {"attnlayout", "attention in the head layout", true},
    [MK_OPTIMIZER] = {"optimizer", "a parameter update", false},
    [MK_ATTNDQKV] = {"attndqkv", "an attention_dqkv op", true},
    [MK_REMAT] = {"remat", "a recomputed op (!recompute)", false},
    [MK_FUSE] = {"fuse", "a fusion group (!group)", false},
    [MK_COMM] = {"comm", "a placed collective", false},
};

static int pass_index(const char *name)
{
    for (int i = 0; i < pass_count; i++)
        if (strcmp(pass_list[i].name, name) == 0)
            return i;
    return -1;
}

/* The first sign of each mark in g, as text ("" when absent). */
static void graph_marks(const Graph *g, char found[MK__N][160])
{
    for (int k = 0; k < MK__N; k++)
        found[k][0] = 0;
#define SET(k, ...) (found[k][0] ? 0 : snprintf(found[k], sizeof found[k], __VA_ARGS__))
    for (int i = 0; i < g->outs.n; i++)
        if (strncmp(g->outs.v[i].name, "grad.", 5) == 0)
            SET(MK_AUTODIFF, "output \"%s\"", g->outs.v[i].name);
    for (int i = 0; i < g->upd.n; i++) {
        int t = g->upd.v[i].target; /* a script's own state (assign) is no mark */
        if (t >= 0 && t < g->t.n && g->t.v[t].kind == TK_STATE)
            continue;
        SET(MK_OPTIMIZER, "update of \"%s\"",
            t >= 0 && t < g->t.n && g->t.v[t].name ? g->t.v[t].name : "?");
    }
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if ((unsigned)op->code >= OP__COUNT)
            continue;
        const char *nm = ir_opinfo[op->code].name;
        if (op->flags & OPF_BACKWARD)
            SET(MK_AUTODIFF, "%%%d = %s !backward", op->out, nm);
        if (op->flags & OPF_OPTIM)
            SET(MK_OPTIMIZER, "%%%d = %s !optim", op->out, nm);
        if (op->flags & OPF_RECOMPUTE)
            SET(MK_REMAT, "%%%d = %s !recompute", op->out, nm);
        if (op->group >= 0)
            SET(MK_FUSE, "%%%d = %s !group=%d", op->out, nm, op->group);
        switch (op->code) {
        case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_DQ: case OP_ATTENTION_DK:
        case OP_ATTENTION_DV:
            if (ir_attn_heads(&op->attr))
                SET(MK_ATTNLAYOUT, "%%%d = %s {...,heads=%lld,...}", op->out, nm,
                    (long long)op->attr.ia[1]);
            break;
        case OP_ATTENTION_DQKV:
            SET(MK_ATTNDQKV, "%%%d = %s", op->out, nm);
            break;
        case OP_ALLREDUCE_START: case OP_ALLREDUCE_WAIT: case OP_REDUCE_SCATTER_START:
        case OP_REDUCE_SCATTER_WAIT: case OP_ALL_GATHER_START: case OP_ALL_GATHER_WAIT:
            SET(MK_COMM, "%%%d = %s", op->out, nm);
            break;
        default: break;
        }
    }
#undef SET
}

bool pass_check(const Graph *g, const Pass *const *passes, int n, char *err, size_t errlen)
{
    char found[MK__N][160];
    graph_marks(g, found);
    const char *by[MK__N] = {0}; /* a listed pass that leaves the mark before this one */
    for (int i = 0; i < n; i++) {
        int pi = pass_index(passes[i]->name);
        if (pi < 0)
            continue; /* a pass outside the pipeline (a test's own): no rule */
        /* the pass's own mark first (it ran already), then the latest pass's */
        for (int j = -1; j < MK__N; j++) {
            int k = j < 0 ? 0 : MK__N - 1 - j;
            if (j < 0) {
                while (k < MK__N && pass_index(marks[k].pass) != pi)
                    k++;
                if (k == MK__N)
                    continue;
            } else if (pass_index(marks[k].pass) == pi) {
                continue;
            }
            int mi = pass_index(marks[k].pass);
            if (mi < pi || (mi == pi && marks[k].rerun))
                continue;
            if (found[k][0]) {
                if (mi == pi)
                    snprintf(err, errlen,
                             "%s cannot run on this graph: %s has already run on it (expected "
                             "a graph %s has not run on: it runs once; found %s: %s)",
                             passes[i]->name, marks[k].pass, marks[k].pass, marks[k].what,
                             found[k]);
                else
                    snprintf(err, errlen,
                             "%s cannot run on this graph: %s has run on it (expected a graph "
                             "before %s: the pipeline runs %s first; found %s: %s)",
                             passes[i]->name, marks[k].pass, marks[k].pass, passes[i]->name,
                             marks[k].what, found[k]);
                return false;
            }
            if (by[k]) {
                snprintf(err, errlen,
                         "--passes: %s cannot run after %s (expected %s %s, as in the "
                         "pipeline: attention, autodiff, attnlayout, optimizer, simplify, "
                         "attndqkv, remat, fuse, comm, schedule, memplan)",
                         passes[i]->name, by[k], passes[i]->name,
                         mi == pi ? "to run once" : "before it");
                return false;
            }
        }
        for (int k = 0; k < MK__N; k++)
            if (!by[k] && pass_index(marks[k].pass) == pi)
                by[k] = passes[i]->name;
    }
    return true;
}

void pass_opts_after(PassOpts *o, const char *pass)
{
    o->after = NULL;
    o->nafter = 0;
    const Pass *p = pass_find(pass);
    if (p && p + 1 < pass_list + pass_count) {
        o->after = p + 1;
        o->nafter = (int)(pass_list + pass_count - (p + 1));
    }
}

const char *pass_dump_ext(const char *pass)
{
    return strcmp(pass, "memplan") == 0 ? "txt" : "ir";
}

/* After the optimizer: the params it left alone (train{frozen}: no
 * gradient, state or update), as a comment line; nothing when none. */
static void frozen_print(const Graph *g, FILE *f)
{
    bool *upd = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int i = 0; i < g->upd.n; i++)
        upd[g->upd.v[i].target] = true;
    int n = 0;
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].kind == TK_PARAM && !upd[i])
            fprintf(f, "%s%s", n++ ? ", " : "# frozen (no gradient, state or update): ",
                    g->t.v[i].name);
    if (n)
        fputc('\n', f);
    free(upd);
}

void pass_dump(const char *pass, const Graph *g, const MemPlan *mp, FILE *f)
{
    if (strcmp(pass, "memplan") == 0) {
        if (mp)
            pass_memplan_print(g, mp, f);
        return;
    }
    ir_print(g, f);
    if (strcmp(pass, "optimizer") == 0)
        frozen_print(g, f);
    if (strcmp(pass, "comm") == 0)
        pass_comm_print(g, f);
    if (strcmp(pass, "fuse") == 0)
        pass_fuse_print(g, f);
    if (strcmp(pass, "attention") == 0)
        pass_attention_print(g, f);
}

/* o as `kiln opt` flags (every setting a pass reads), into buf. */
static void opts_flags(const PassOpts *o, char *buf, size_t n)
{
    size_t k = 0;
    char v[5][40];
#define ADD(...) (k += (size_t)snprintf(buf + k, k < n ? n - k : 0, __VA_ARGS__))
    ADD("--set beta1=%s --set beta2=%s --set eps=%s --set weight_decay=%s --set grad_clip=%s "
        "--set grad_accum=%d",
        ir_fmt_double(o->beta1, v[0], sizeof v[0]), ir_fmt_double(o->beta2, v[1], sizeof v[1]),
        ir_fmt_double(o->eps, v[2], sizeof v[2]),
        ir_fmt_double(o->weight_decay, v[3], sizeof v[3]),
        ir_fmt_double(o->grad_clip, v[4], sizeof v[4]), o->grad_accum > 1 ? o->grad_accum : 1);
    if (o->optimizer != PASS_OPT_ADAMW)
        ADD(" --set optimizer=%s", pass_optimizer_name(o->optimizer));
    if (o->optimizer == PASS_OPT_SGD)
        ADD(" --set momentum=%s --set nesterov=%s", ir_fmt_double(o->momentum, v[0], sizeof v[0]),
            o->nesterov ? "true" : "false");
    if (o->optimizer == PASS_OPT_LION)
        ADD(" --set lion_beta1=%s --set lion_beta2=%s",
            ir_fmt_double(o->lion_beta1, v[0], sizeof v[0]),
            ir_fmt_double(o->lion_beta2, v[1], sizeof v[1]));
    if (o->bucket_bytes > 0)
        ADD(" --set bucket_mb=%s",
            ir_fmt_double((double)o->bucket_bytes / 1048576.0, v[0], sizeof v[0]));
    if (o->memory_budget > 0)
        ADD(" --memory-budget %lld", (long long)o->memory_budget);
    if (o->remat != REMAT_DEFAULT)
        ADD(" --remat=%s", pass_remat_policy_name(o->remat));
    if (o->nranks > 1 || o->tp > 1)
        ADD(" --nproc %d", o->nranks * (o->tp > 1 ? o->tp : 1));
    if (o->tp > 1)
        ADD(" --set tp=%d --tp-rank %d%s", o->tp, o->tp_rank,
            o->sequence_parallel ? " --set sequence_parallel=true" : "");
    if (o->zero)
        ADD(" --set zero=%d", o->zero);
    if (o->no_overlap)
        ADD(" --no-overlap");
    if (o->no_fuse)
        ADD(" --no-fuse");
    ADD(o->attention ? " --fuse-attention" : " --no-fuse-attention"); /* on in kiln opt */
#undef ADD
}

/* The verifier's complaint about g (after pass `after`, or "frontend"),
 * with g's IR written to DIR/invalid-after-PASS.ir when there is a dump
 * directory (o->dump_dir), and nowhere else: an internal error leaves no
 * file the user did not ask for. The file opens with comment lines: the
 * complaint, the pass options as `kiln opt` flags, and how to replay the
 * pass (`before`: the pass whose output it ran on). */
static void invalid_graph(const Graph *g, const char *after, const char *before,
                          const char *err, const PassOpts *o, Diag *d)
{
    char what[128];
    if (strcmp(after, "frontend") == 0)
        snprintf(what, sizeof what, "the frontend's graph is invalid");
    else
        snprintf(what, sizeof what, "the graph is invalid after pass %s", after);
    if (!o->dump_dir) {
        snprintf(d->msg, sizeof d->msg,
                 "internal error: %s: %s (its IR is kept only with a dump directory: kiln "
                 "compile or kiln opt with the same flags and --dump-dir DIR writes "
                 "DIR/invalid-after-%s.ir)",
                 what, err, after);
        return;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/invalid-after-%s.ir", o->dump_dir, after);
    FILE *f = fopen(path, "w");
    bool ok = f != NULL;
    int e = errno;
    if (f) { /* a write error (a full disk) counts: ferror, then fclose */
        char flags[1024];
        opts_flags(o, flags, sizeof flags);
        fprintf(f, "# kiln: the graph is invalid after %s: %s\n", after, err);
        fprintf(f, "# pass options: %s\n", flags);
        if (before)
            fprintf(f,
                    "# replay: kiln opt BEFORE.ir --passes=%s %s\n"
                    "#   BEFORE.ir: the IR %s ran on (kiln compile MODEL --dump-after=%s\n"
                    "#   with the same flags)\n",
                    after, flags, after, before);
        ir_print(g, f);
        ok = !ferror(f);
        ok = fclose(f) == 0 && ok;
        if (!ok) {
            e = errno ? errno : EIO;
            unlink(path); /* no half-written report */
        }
    }
    if (ok)
        snprintf(d->msg, sizeof d->msg, "internal error: %s: %s (its IR is in %s)", what, err,
                 path);
    else
        snprintf(d->msg, sizeof d->msg,
                 "internal error: %s: %s (its IR could not be written to %s: %s)", what, err,
                 path, strerror(e));
}

bool pass_run(Graph *g, const Pass *const *passes, int n, const PassOpts *o, PassHook hook,
              void *ctx, Diag *d)
{
    char err[1024];
    if (!ir_verify(g, err, sizeof err)) {
        invalid_graph(g, "frontend", NULL, err, o, d);
        return false;
    }
    if (!pass_check(g, passes, n, err, sizeof err)) {
        snprintf(d->msg, sizeof d->msg, "%s", err);
        return false;
    }
    PassOpts po = *o;
    for (int i = 0; i < n; i++) {
        pass_opts_after(&po, passes[i]->name);
        double t0 = ir_now();
        if (!passes[i]->run(g, &po, d))
            return false;
        double dt = ir_now() - t0;
        if (!ir_verify(g, err, sizeof err)) {
            invalid_graph(g, passes[i]->name, i > 0 ? passes[i - 1]->name : "frontend", err, o,
                          d);
            return false;
        }
        if (hook)
            hook(passes[i]->name, g, dt, ctx);
    }
    return true;
}

bool pass_pipeline(Graph *g, const PassOpts *o, const char *last, PassHook hook,
                   void *ctx, Diag *d)
{
    const Pass *passes[sizeof pass_list / sizeof pass_list[0]];
    int n = 0;
    for (int i = 0; i < pass_count; i++) {
        passes[n++] = &pass_list[i];
        if (last && strcmp(last, pass_list[i].name) == 0)
            break;
    }
    return pass_run(g, passes, n, o, hook, ctx, d);
}
