/* stages.c - pipeline stages: the cut of a forward graph into n stages,
 * each stage's own graphs, and the schedules (gpipe, 1f1b, zb-h1) as data.
 *
 * The cut: stage s runs the forward ops [first[s], first[s+1]) in program
 * order. A boundary sits between two ops; the tensors crossing it (made
 * before it, read after it) are sent forward and their gradients back.
 * Tensors made only from constants (iota, const, and ops of them: masks,
 * scales) never cross: a stage that reads one makes it again. The cut
 * takes, for each boundary, a place with the fewest bytes crossing (the
 * residual stream between blocks in a transformer) between the first and
 * the last op that reads a param, and among those the
 * one whose share of the graph's cost (ir_op_flops, plus the bytes each op
 * moves at one FLOP per byte) is nearest s/n of the total. No boundary
 * splits a layer (see Layer below); a pp_stage hint that would is an
 * error at its line. A param is
 * owned by every stage that reads it (gpt's tied wte: the first stage's
 * embedding and the last's head). */
#include "passes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *pass_stage_schedule_name(int kind)
{
    return kind == PASS_SCHED_GPIPE ? "gpipe" : kind == PASS_SCHED_ZBH1 ? "zb-h1" : "1f1b";
}

int pass_stage_schedule_parse(const char *name)
{
    if (!name || strcmp(name, "1f1b") == 0)
        return PASS_SCHED_1F1B;
    if (strcmp(name, "gpipe") == 0)
        return PASS_SCHED_GPIPE;
    if (strcmp(name, "zb-h1") == 0)
        return PASS_SCHED_ZBH1;
    return -1;
}

/* static[t]: t is made from constants only (no input, param or state). */
static bool *const_only(const Graph *g)
{
    bool *st = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        bool s = ir_opinfo[op->code].cls != OC_RANDOM;
        for (int j = 0; j < op->nin && s; j++)
            s = st[op->in[j]];
        st[op->out] = s;
    }
    return st;
}

static double op_cost(const Graph *g, const Op *op)
{
    return ir_op_flops(g, op) + ir_op_bytes(g, op);
}

void pass_stage_cut_free(PassStageCut *c)
{
    if (!c)
        return;
    free(c->first);
    free(c->cost);
    free(c->bytes);
    for (int s = 0; c->cross && s <= c->n; s++)
        free(c->cross[s]);
    free(c->cross);
    free(c->ncross);
    memset(c, 0, sizeof *c);
}

/* The tensors crossing boundary p (made by an op before p, read at or
 * after p, not made from constants only), into out (ids ascending);
 * their count; their bytes into *bytes. */
static int crossing(const Graph *g, const int *last_use, const bool *st, int p, int *out,
                    int64_t *bytes)
{
    int n = 0;
    *bytes = 0;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op < 0 || t->op >= p || st[i] || last_use[i] < p)
            continue;
        if (out)
            out[n] = i;
        n++;
        *bytes += shape_bytes(&t->s);
    }
    return n;
}

static bool is_hint(const char *name) { return strncmp(name, "pp.stage.", 9) == 0; }

/* Layers: params whose names agree up to the last dot ("h.3.attn.c_attn"
 * holds h.3.attn.c_attn.weight and .bias: one nn layer); a name without a
 * dot is a layer of its own. A boundary p splits a layer when one of its
 * params is read only before p and another only at or after p: for a
 * layer, the last reader of the param read last-earliest (lo) and the
 * first reader of the param read first-latest (hi) give the places
 * (lo, hi] that split it. A param read on both sides (gpt's tied wte)
 * splits nothing by itself. */
typedef struct {
    const char *name; /* a param of the layer (for messages) */
    const char *other;
    int lo, hi;
} Layer;

static bool same_layer(const char *a, const char *b)
{
    const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
    return da && db && da - a == db - b && strncmp(a, b, (size_t)(da - a)) == 0;
}

/* g's layers of two params or more, into *out; their count. */
static int layers(const Graph *g, Layer **out)
{
    int nt = g->t.n;
    int *first = xmalloc(sizeof(int) * (size_t)(nt + 1));
    int *last = xmalloc(sizeof(int) * (size_t)(nt + 1));
    for (int i = 0; i < nt; i++)
        first[i] = last[i] = -1;
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++) {
            int t = g->ops.v[i].in[j];
            if (first[t] < 0)
                first[t] = i;
            last[t] = i;
        }
    VEC(Layer) v = {0};
    bool *done = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int i = 0; i < nt; i++) {
        if (g->t.v[i].kind != TK_PARAM || done[i] || first[i] < 0 || !g->t.v[i].name)
            continue;
        /* the param read last-earliest, the one read first-latest */
        int lo = i, hi = i, n = 0;
        for (int j = i; j < nt; j++) {
            if (g->t.v[j].kind != TK_PARAM || first[j] < 0 || !g->t.v[j].name ||
                !same_layer(g->t.v[i].name, g->t.v[j].name))
                continue;
            done[j] = true;
            n++;
            if (last[j] < last[lo])
                lo = j;
            if (first[j] > first[hi])
                hi = j;
        }
        if (n > 1 && last[lo] < first[hi])
            vec_push(&v, ((Layer){g->t.v[lo].name, g->t.v[hi].name, last[lo], first[hi]}));
    }
    free(first);
    free(last);
    free(done);
    *out = v.v;
    return v.n;
}

/* The layer that a boundary at p splits; NULL: none. */
static const Layer *splits(const Layer *ly, int nly, int p)
{
    for (int i = 0; i < nly; i++)
        if (ly[i].lo < p && p <= ly[i].hi)
            return &ly[i];
    return NULL;
}

/* pp_stage's outputs "pp.stage.I@FILE:LINE": stage I begins right after
 * the op that makes the output's tensor; into fixed[I]. */
static bool read_hints(const Graph *g, int n, int first_real, int last_real,
                       const int *last_use, const Layer *ly, int nly, int *fixed, int *nhint,
                       Diag *d)
{
    int *line = xcalloc((size_t)n + 1, sizeof(int));
    bool ok = true;
    for (int i = 0; i < g->outs.n && ok; i++) {
        const char *nm = g->outs.v[i].name;
        int st = 0;
        if (!is_hint(nm) || sscanf(nm + 9, "%d", &st) != 1)
            continue;
        const char *at = strchr(nm, '@');
        at = at ? at + 1 : "?";
        int t = g->outs.v[i].t, p = g->t.v[t].op + 1;
        const Layer *sp = splits(ly, nly, p);
        if (st >= n) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: pp_stage: stage %d, but pp = %d (expected a stage in 1..%d)", at, st,
                     n, n - 1);
            ok = false;
        } else if (fixed[st] >= 0) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: pp_stage: stage %d already begins elsewhere (expected one pp_stage "
                     "per stage)", at, st);
            ok = false;
        } else if (sp) {
            char layer[128];
            snprintf(layer, sizeof layer, "%.*s", (int)(strrchr(sp->name, '.') - sp->name),
                     sp->name);
            snprintf(d->msg, sizeof d->msg,
                     "%s: pp_stage: stage %d would begin inside layer \"%s\": \"%s\" in stage "
                     "%d, \"%s\" in stage %d (expected a value between two layers, such as "
                     "the layer's output)", at, st, layer, sp->name, st - 1, sp->other, st);
            ok = false;
        } else if (p <= first_real || p > last_real || last_use[t] < p) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: pp_stage: stage %d would begin %s (expected a value made after the "
                     "first param is read, and read after it, before the last param's reader)",
                     at, st, last_use[t] < p ? "with a value no later op reads"
                                             : "where a stage would read no param");
            ok = false;
        } else {
            fixed[st] = p;
            line[st] = i;
            (*nhint)++;
        }
    }
    for (int s = 1, prev = 0, ps = 0; s < n && ok; s++) {
        if (fixed[s] < 0)
            continue;
        if (fixed[s] <= prev) {
            const char *at = strchr(g->outs.v[line[s]].name, '@');
            snprintf(d->msg, sizeof d->msg,
                     "%s: pp_stage: stage %d begins before stage %d (expected the stages in "
                     "program order)", at ? at + 1 : "?", s, ps);
            ok = false;
        }
        prev = fixed[s];
        ps = s;
    }
    free(line);
    return ok;
}

/* pass_stage_cut's work. opw: per op, the cost to balance (NULL: op_cost);
 * opw0 (with opw): stage 0's (measured: the first stage runs no B); then,
 * without pp_stage hints, the boundaries minimise the largest stage's
 * cost over the places at most twice the fewest bytes cross. pieces: n is ignored and the cut takes every place one tensor crosses
 * (pass_stage_pieces: pp_stage hints and stages without a param allowed). */
static bool cut(const Graph *g, int n, const double *opw, const double *opw0, bool pieces,
                PassStageCut *c, Diag *d)
{
    memset(c, 0, sizeof *c);
    double *pre0 = NULL; /* with opw0: stage 0's prefix cost */
    int nops = g->ops.n;
    if (g->upd.n > 0) {
        snprintf(d->msg, sizeof d->msg,
                 "pp = %d: the model updates state in its forward (state(), BatchNorm's "
                 "statistics), which pipeline stages do not carry yet (expected a model "
                 "without state updates, got %d)", n, g->upd.n);
        return false;
    }
    bool *st = const_only(g);
    int *last_use = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    for (int i = 0; i < g->t.n; i++)
        last_use[i] = -1;
    for (int i = 0; i < nops; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            last_use[g->ops.v[i].in[j]] = i;
    for (int i = 0; i < g->outs.n; i++)
        if (!is_hint(g->outs.v[i].name))
            last_use[g->outs.v[i].t] = nops;
    /* prefix cost; candidate boundaries p in (0, nops): some op that is not
     * constant-only on each side, something crossing */
    double *pre = xcalloc((size_t)nops + 2, sizeof(double));
    for (int i = 0; i < nops; i++)
        pre[i + 1] = pre[i] + (st[g->ops.v[i].out] ? 0 : opw ? opw[i] : op_cost(g, &g->ops.v[i]));
    int64_t *cb = xmalloc(sizeof(int64_t) * (size_t)(nops + 2));
    bool *one = xcalloc((size_t)nops + 2, sizeof(bool)); /* one tensor crosses */
    bool ok = false;
    /* every stage reads a param: no cut before the first op that reads
     * one, nor after the last (the loss's tail) */
    int first_real = nops, last_real = -1;
    for (int i = 0; i < nops; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            if (g->t.v[g->ops.v[i].in[j]].kind == TK_PARAM) {
                if (first_real == nops)
                    first_real = i;
                last_real = i;
            }
    Layer *ly = NULL;
    int nly = layers(g, &ly);
    int64_t best = -1;
    int ncand = 0; /* boundaries one tensor crosses */
    for (int p = 0; p <= nops; p++) {
        cb[p] = -1;
        if (p <= first_real || p > last_real || splits(ly, nly, p))
            continue;
        int64_t b;
        int nc = crossing(g, last_use, st, p, NULL, &b);
        if (nc == 0)
            continue;
        cb[p] = b;
        one[p] = nc == 1;
        ncand += nc == 1;
        if (best < 0 || b < best)
            best = b;
    }
    /* nmax: the most stages, each holding a param, at those boundaries
     * (cut each as soon as its stage has read one; a tail without one
     * joins the stage before) */
    int nmax = 1;
    int *gb = xmalloc(sizeof(int) * (size_t)(nops + 2)); /* those boundaries */
    bool has = false;
    for (int i = 0; i < nops; i++) {
        for (int j = 0; j < g->ops.v[i].nin; j++)
            has |= g->t.v[g->ops.v[i].in[j]].kind == TK_PARAM;
        if (has && cb[i + 1] >= 0 && one[i + 1]) {
            gb[nmax - 1] = i + 1;
            nmax++;
            has = false;
        }
    }
    if (!has && nmax > 1)
        nmax--;
    if (pieces)
        n = ncand + 1;
    int loss = ir_find_output(g, "loss");
    int *fixed = xmalloc(sizeof(int) * (size_t)(n + 1));
    int nhint = 0;
    for (int s = 0; s <= n; s++)
        fixed[s] = -1;
    if (loss >= 0 && !pieces &&
        !read_hints(g, n, first_real, last_real, last_use, ly, nly, fixed, &nhint, d))
        goto out;
    if ((nmax < n && nhint == 0 && !pieces) || loss < 0) {
        if (loss < 0)
            snprintf(d->msg, sizeof d->msg,
                     "pp = %d: the model has no output \"loss\" (expected one)", n);
        else
            snprintf(d->msg, sizeof d->msg,
                     "--pp %d: more stages than layers to put in them (expected pp <= %d: "
                     "stages begin between layers, where one tensor crosses, and each holds "
                     "a param)", n, nmax);
        goto out;
    }
    c->n = n;
    c->nmax = nmax;
    c->first = xcalloc((size_t)n + 1, sizeof(int));
    c->cost = xcalloc((size_t)n + 1, sizeof(double));
    c->bytes = xcalloc((size_t)n + 1, sizeof(int64_t));
    c->cross = xcalloc((size_t)n + 1, sizeof(int *));
    c->ncross = xcalloc((size_t)n + 1, sizeof(int));
    c->first[0] = 0;
    c->first[n] = nops;
    /* boundary s: where pp_stage puts it, else the candidate nearest s/n
     * of the cost, after boundary s-1, before the next fixed one, leaving
     * a candidate for each boundary between them */
    if (opw0) {
        pre0 = xcalloc((size_t)nops + 2, sizeof(double));
        for (int i = 0; i < nops; i++)
            pre0[i + 1] = pre0[i] + (st[g->ops.v[i].out] ? 0 : opw0[i]);
    }
    if (opw0 && nhint == 0 && !pieces) {
        /* the least T for which cutting each stage as late as its cost <=
         * T allows leaves the last stage <= T (bisection; the greedy cut
         * is optimal: a stage's cost grows with its end, falls with its
         * start) */
        int *at = xmalloc(sizeof(int) * (size_t)(nops + 2)), na = 0; /* the places */
        for (int p = 1; p < nops; p++)
            if (cb[p] >= 0 && cb[p] <= 2 * best)
                at[na++] = p;
        double lo = 0, hi = pre0[nops] + pre[nops];
        for (int it = 0; it < 100 && na >= n - 1; it++) {
            double T = it < 99 ? (lo + hi) / 2 : hi;
            int pos = 0, k = -1, s = 1;
            for (; s < n; s++) { /* boundary s at place at[k], leaving one for each after */
                int pick = -1;
                for (int j = k + 1; j < na - (n - 1 - s); j++) {
                    double cost = s == 1 ? pre0[at[j]] : pre[at[j]] - pre[pos];
                    if (cost > T)
                        break;
                    pick = j;
                }
                if (pick < 0)
                    break;
                k = pick;
                c->first[s] = pos = at[k];
            }
            if (s == n && pre[nops] - pre[pos] <= T)
                hi = T;
            else
                lo = T;
        }
        free(at);
        if (na < n - 1)
            opw0 = NULL; /* no such places: the cost-model way below, with opw */
    }
    int prev = 0;
    for (int p = 0, s = 1; pieces && p <= nops; p++)
        if (cb[p] >= 0 && one[p])
            c->first[s++] = p;
    for (int s = 1; s < n && !pieces && !(opw0 && nhint == 0); s++) {
        if (fixed[s] >= 0) {
            c->first[s] = prev = fixed[s];
            continue;
        }
        int next = s + 1, lim = nops + 1;
        while (next < n && fixed[next] < 0)
            next++;
        if (next < n)
            lim = fixed[next];
        double want = pre[nops] * s / n, win = pre[nops] / (2.0 * n);
        int pick = -1;
        /* places one tensor crosses first, then any */
        for (int any = 0; any < 2 && pick < 0; any++)
        for (double w = win; pick < 0 && w <= 2 * pre[nops] + 1; w *= 2) {
            int left = 0;
            for (int p = lim - 1; p > prev; p--) {
                if (cb[p] < 0 || (!any && !one[p]))
                    continue;
                if (left < next - 1 - s) { /* keep one for each boundary before next */
                    left++;
                    continue;
                }
                if (fabs(pre[p] - want) > w)
                    continue;
                if (pick < 0 || cb[p] < cb[pick] ||
                    (cb[p] == cb[pick] && fabs(pre[p] - want) < fabs(pre[pick] - want)))
                    pick = p;
            }
        }
        if (pick < 0) {
            snprintf(d->msg, sizeof d->msg,
                     "--pp %d: no place to cut stage %d between the stages pp_stage fixes "
                     "(expected a boundary of the fewest bytes crossing there; pp_stage(x, %d) "
                     "picks one)", n, s, s);
            goto out;
        }
        c->first[s] = prev = pick;
    }
    /* no pp_stage hint and a stage that reads no param: the boundaries
     * among nmax's instead (each of those stages reads one), each the one
     * nearest s/n of the cost */
    for (int s = 0, bad = 0; s < n && nhint == 0 && !pieces && !bad; s++) {
        for (int i = c->first[s]; i < c->first[s + 1] && !bad; i++)
            for (int j = 0; j < g->ops.v[i].nin; j++)
                bad |= g->t.v[g->ops.v[i].in[j]].kind == TK_PARAM;
        bad = !bad;
        for (int t = 1, k = -1; bad && t < n; t++) {
            double want = pre[nops] * t / n;
            int pick = k + 1;
            for (int j = k + 1; j < nmax - 1 - (n - 1 - t); j++)
                if (fabs(pre[gb[j]] - want) < fabs(pre[gb[pick]] - want))
                    pick = j;
            c->first[t] = gb[k = pick];
        }
    }
    for (int s = 0; s < n; s++)
        c->cost[s] = s == 0 && pre0 ? pre0[c->first[1]]
                                    : pre[c->first[s + 1]] - pre[c->first[s]];
    for (int s = 1; s < n; s++) {
        c->cross[s] = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
        c->ncross[s] = crossing(g, last_use, st, c->first[s], c->cross[s], &c->bytes[s]);
    }
    for (int s = 0; s < n && !pieces; s++) {
        bool any = false;
        for (int i = 0; i < g->t.n && !any; i++)
            any = g->t.v[i].kind == TK_PARAM && pass_stage_owns(g, c, s, i);
        if (!any) {
            snprintf(d->msg, sizeof d->msg,
                     "--pp %d: stage %d would hold no param (expected fewer stages, or "
                     "pp_stage(x, %d) in the script to place it)", n, s, s);
            goto out;
        }
    }
    if (g->t.v[loss].op < c->first[n - 1]) {
        snprintf(d->msg, sizeof d->msg,
                 "pp = %d: the loss is made before the last stage (internal cut error)", n);
        goto out;
    }
    ok = true;
out:
    free(st);
    free(last_use);
    free(pre);
    free(cb);
    free(one);
    free(fixed);
    free(ly);
    free(pre0);
    free(gb);
    if (!ok)
        pass_stage_cut_free(c);
    return ok;
}

bool pass_stage_cut(const Graph *g, int n, PassStageCut *c, Diag *d)
{
    return cut(g, n, NULL, NULL, false, c, d);
}

bool pass_stage_pieces(const Graph *g, PassStageCut *c, Diag *d)
{
    return cut(g, 0, NULL, NULL, true, c, d);
}

int pass_stage_max(const Graph *g)
{
    PassStageCut pc;
    Diag d = {{0}};
    if (!cut(g, 0, NULL, NULL, true, &pc, &d))
        return 0;
    int n = pc.nmax;
    pass_stage_cut_free(&pc);
    return n;
}

/* Per op of g: piece j's secs[j], shared among its ops as the cost model
 * shares the piece's cost. */
static double *op_secs(const Graph *g, const PassStageCut *pieces, const double *secs)
{
    double *w = xcalloc((size_t)g->ops.n + 1, sizeof(double));
    for (int j = 0; j < pieces->n; j++) {
        int a = pieces->first[j], b = pieces->first[j + 1];
        for (int i = a; i < b; i++)
            w[i] = pieces->cost[j] > 0 ? secs[j] * op_cost(g, &g->ops.v[i]) / pieces->cost[j]
                                       : secs[j] / (b - a);
    }
    return w;
}

bool pass_stage_cut_timed(const Graph *g, int n, const PassStageCut *pieces,
                          const double *secs, const double *secs0, PassStageCut *c, Diag *d)
{
    double *w = op_secs(g, pieces, secs), *w0 = op_secs(g, pieces, secs0);
    bool ok = cut(g, n, w, w0, false, c, d);
    free(w);
    free(w0);
    return ok;
}

/* keep[i]: op i runs in stage s (its range, and the constant-only ops
 * whose results the range reads, transitively) */
static bool *stage_ops(const Graph *g, const PassStageCut *c, int s)
{
    bool *st = const_only(g);
    bool *keep = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int i = c->first[s]; i < c->first[s + 1]; i++)
        keep[i] = true;
    for (int i = c->first[s + 1] - 1; i >= 0; i--) {
        if (!keep[i])
            continue;
        const Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            if (p >= 0 && p < c->first[s] && st[op->in[j]])
                keep[p] = true;
        }
    }
    free(st);
    return keep;
}

bool pass_stage_owns(const Graph *g, const PassStageCut *c, int s, int t)
{
    bool *keep = stage_ops(g, c, s), own = false;
    for (int i = 0; i < g->ops.n && !own; i++)
        for (int j = 0; keep[i] && j < g->ops.v[i].nin; j++)
            own |= g->ops.v[i].in[j] == t;
    free(keep);
    return own;
}

static char *pname(const char *pre, int k)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s.%d", pre, k);
    return (char *)intern(buf);
}

Graph *pass_stage_graph(const Graph *fwd, const PassStageCut *c, int s, bool backward)
{
    Graph *g = ir_clone(fwd);
    bool *keep = stage_ops(fwd, c, s);
    bool *drop = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++)
        drop[i] = !keep[i];
    int last = c->n - 1;
    /* outputs: the last stage keeps "loss" (and, forward only, the others
     * it makes); the others send what crosses their end */
    VEC(GraphOutput) outs = {0};
    for (int i = 0; s == last && i < g->outs.n; i++) {
        int t = g->outs.v[i].t;
        bool mine = g->t.v[t].op >= 0 && keep[g->t.v[t].op];
        if (mine && !is_hint(g->outs.v[i].name) &&
            (!backward || strcmp(g->outs.v[i].name, "loss") == 0))
            vec_push(&outs, g->outs.v[i]);
    }
    g->outs.n = 0;
    ir_drop_ops(g, drop);
    for (int k = 0; s > 0 && k < c->ncross[s]; k++) {
        Tensor *t = &g->t.v[c->cross[s][k]];
        t->kind = backward ? TK_PARAM : TK_INPUT;
        t->name = pname("pp.recv", k);
        t->init = (ParamInit){INIT_ZEROS, 0, 0};
    }
    for (int i = 0; i < outs.n; i++)
        ir_add_output(g, outs.v[i].name, outs.v[i].t);
    vec_free(&outs);
    if (s < last) {
        int loss = -1;
        for (int k = 0; k < c->ncross[s + 1]; k++) {
            int y = c->cross[s + 1][k];
            if (!backward) {
                ir_add_output(g, pname("pp.send", k), y);
                continue;
            }
            /* loss = sum_k sum(y_k * seed_k): d loss / d y_k = seed_k */
            Shape ys = g->t.v[y].s;
            int seed = ir_add_input(g, TK_INPUT, pname("pp.seed", k), ys, (ParamInit){0});
            /* y may pass through the stage (received, not made: a piece of
             * pass_stage_pieces that makes only constants) */
            SrcLoc loc = g->t.v[y].op >= 0 ? g->ops.v[g->t.v[y].op].loc : (SrcLoc){0};
            int m = ir_op_x(g, OP_MUL, (int[]){y, seed}, 2, &(OpAttr){0}, loc);
            if (ys.rank > 0) {
                OpAttr r = {.nia = ys.rank};
                for (int a = 0; a < ys.rank; a++)
                    r.ia[a] = a;
                m = ir_op_x(g, OP_REDUCE_SUM, &m, 1, &r, loc);
                OpAttr sc = {.rank = 0};
                m = ir_op_x(g, OP_RESHAPE, &m, 1, &sc, loc);
            }
            loss = loss < 0 ? m : ir_op_x(g, OP_ADD, (int[]){loss, m}, 2, &(OpAttr){0}, loc);
        }
        if (backward) {
            ir_add_output(g, "loss", loss);
            for (int k = 0; k < c->ncross[s + 1]; k++)
                ir_add_output(g, pname("pp.send", k), c->cross[s + 1][k]);
        }
    }
    ir_compact(g);
    free(keep);
    free(drop);
    return g;
}

/* ---- F, B and W --------------------------------------------------------- */

/* mark[t's producer] = v for every op on the path to tensor t that is
 * not yet marked and passes the filter (backward: OPF_BACKWARD ops only;
 * else any op); ops reached outside the filter go to *also (if non-NULL). */
static void reach(const Graph *g, int t, int *mark, int v, bool backward, bool *also)
{
    VEC(int) st = {0};
    vec_push(&st, t);
    while (st.n > 0) {
        int x = st.v[--st.n], p = g->t.v[x].op;
        if (p < 0)
            continue;
        /* a recomputation (remat) runs with the backward that reads it */
        bool bw = (g->ops.v[p].flags & (OPF_BACKWARD | OPF_RECOMPUTE)) != 0;
        if (backward && !bw) {
            if (also)
                also[p] = true;
            continue;
        }
        if (mark[p] >= 0)
            continue;
        mark[p] = v;
        for (int j = 0; j < g->ops.v[p].nin; j++)
            vec_push(&st, g->ops.v[p].in[j]);
    }
    vec_free(&st);
}

static const char *stash_name(int t)
{
    char buf[48];
    snprintf(buf, sizeof buf, "pp.stash.%d", t);
    return intern(buf);
}

/* The part `which` of g (ops with part[i] == which): tensors of earlier
 * parts it reads are inputs "pp.stash.T", tensors later parts read are
 * outputs of that name; g's outputs made by this part stay. */
static Graph *part_graph(const Graph *g, const int *part, int which)
{
    Graph *p = ir_clone(g);
    int nt = g->t.n;
    bool *later = xcalloc((size_t)nt + 1, sizeof(bool)), *reads = xcalloc((size_t)nt + 1, 1);
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++) {
            int t = g->ops.v[i].in[j];
            if (part[i] > which)
                later[t] = true;
            if (part[i] == which)
                reads[t] = true;
        }
    bool *drop = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++)
        drop[i] = part[i] != which;
    p->outs.n = 0;
    ir_drop_ops(p, drop);
    for (int t = 0; t < nt; t++) {
        int op = g->t.v[t].op;
        if (op < 0 || !reads[t] || part[op] == which)
            continue;
        if (part[op] < 0 || part[op] > which)
            die("part_graph: part %d reads %%%d of part %d", which, t, part[op]);
        p->t.v[t].name = stash_name(t);
    }
    for (int i = 0; i < g->outs.n; i++) {
        int op = g->t.v[g->outs.v[i].t].op;
        if (op >= 0 && part[op] == which)
            ir_add_output(p, g->outs.v[i].name, g->outs.v[i].t);
    }
    for (int t = 0; t < nt; t++) {
        int op = g->t.v[t].op;
        if (op >= 0 && part[op] == which && later[t])
            ir_add_output(p, stash_name(t), t);
    }
    ir_compact(p);
    free(later);
    free(reads);
    free(drop);
    return p;
}

/* g with each forward op whose result B or W reads and that is made from
 * constants and params only (GELU's broadcast constants, a broadcast
 * LayerNorm weight), or by an elementwise or data-movement op from such
 * results and from tensors the backward reads anyway (GELU's intermediates
 * from its input), made again for the backward: a clone flagged
 * OPF_BACKWARD before the first backward op, which the backward ops read
 * instead. The split then leaves them to B and W rather than to F's stash
 * (host copies per micro-batch, held until B or W), which only shrinks.
 * The received "pp.recv.K" are params of g but not constants: what is made
 * from them is not made again. */
static Graph *static_for_backward(const Graph *g0)
{
    Graph *g = ir_clone(g0);
    int nt = g->t.n, n0 = g->ops.n;
    bool *st = xcalloc((size_t)nt + 1, sizeof(bool)), *need = xcalloc((size_t)n0 + 1, 1);
    for (int i = 0; i < nt; i++) /* the model's params, not the received "pp.recv.K" */
        st[i] = g->t.v[i].kind == TK_PARAM && strncmp(g->t.v[i].name, "pp.recv.", 8) != 0;
    /* read: a forward tensor a backward op reads (stashed unless made
     * again) */
    bool *read = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int i = 0; i < n0; i++)
        for (int j = 0; (g->ops.v[i].flags & OPF_BACKWARD) && j < g->ops.v[i].nin; j++)
            read[g->ops.v[i].in[j]] = true;
    /* st: made from constants and params only, or an elementwise or
     * data-movement op of such tensors and of tensors backward reads (so
     * what is stashed only shrinks: GELU's intermediates from its input) */
    bool *stat = xcalloc((size_t)nt + 1, sizeof(bool)); /* constants and params only */
    for (int i = 0; i < nt; i++)
        stat[i] = st[i];
    for (int i = 0; i < n0; i++) {
        const Op *op = &g->ops.v[i];
        int cls = ir_opinfo[op->code].cls;
        bool ok = cls != OC_RANDOM && !(op->flags & OPF_BACKWARD), only = ok, s = ok;
        for (int j = 0; j < op->nin; j++) {
            only &= stat[op->in[j]];
            s &= st[op->in[j]] || read[op->in[j]];
        }
        stat[op->out] = only;
        st[op->out] = only || (s && (cls == OC_ELEMWISE || cls == OC_MOVE));
    }
    free(stat);
    /* needed: read by a backward op, or by a needed op (in reverse) */
    for (int i = n0 - 1; i >= 0; i--) {
        const Op *op = &g->ops.v[i];
        bool bw = (op->flags & OPF_BACKWARD) != 0;
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            if (p >= 0 && st[op->in[j]] && (bw || need[i]))
                need[p] = true;
        }
    }
    int *map = xmalloc(sizeof(int) * (size_t)(nt + 1)), first_bw = n0;
    for (int i = 0; i < nt; i++)
        map[i] = i;
    for (int i = 0; i < n0 && first_bw == n0; i++)
        if (g->ops.v[i].flags & OPF_BACKWARD)
            first_bw = i;
    for (int i = 0; i < n0; i++) {
        if (!need[i] || i >= first_bw)
            continue;
        Op op = g->ops.v[i]; /* a copy: ir_op_x may move g->ops */
        int *in = xmalloc(sizeof(int) * (size_t)(op.nin + 1));
        for (int j = 0; j < op.nin; j++)
            in[j] = map[op.in[j]];
        int t = ir_op_x(g, op.code, in, op.nin, &op.attr, op.loc);
        g->ops.v[g->ops.n - 1].flags = op.flags | OPF_BACKWARD;
        map[op.out] = t;
        free(in);
    }
    int nclone = g->ops.n - n0;
    for (int i = first_bw; i < n0; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            g->ops.v[i].in[j] = map[g->ops.v[i].in[j]];
    /* the clones right before the first backward op */
    int *order = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1)), k = 0;
    for (int i = 0; i < first_bw; i++)
        order[k++] = i;
    for (int i = 0; i < nclone; i++)
        order[k++] = n0 + i;
    for (int i = first_bw; i < n0; i++)
        order[k++] = i;
    ir_reorder_ops(g, order, k);
    ir_compact(g);
    free(order);
    free(map);
    free(st);
    free(need);
    free(read);
    return g;
}

void pass_stage_split(const Graph *g0, bool last, Graph **f, Graph **b, Graph **w)
{
    Graph *g = static_for_backward(g0);
    int n = g->ops.n;
    int *part = xmalloc(sizeof(int) * (size_t)(n + 1));
    bool *fwd = xcalloc((size_t)n + 1, sizeof(bool));
    for (int i = 0; i < n; i++)
        part[i] = -1;
    /* B: what the received tensors' gradients need; W: what the params'
     * need besides; F: the forward ops those read, and what is sent (the
     * last stage: the loss) */
    for (int i = 0; i < g->outs.n; i++)
        if (strncmp(g->outs.v[i].name, "grad.pp.recv.", 13) == 0)
            reach(g, g->outs.v[i].t, part, 1, true, fwd);
    for (int i = 0; i < g->outs.n; i++)
        if (strncmp(g->outs.v[i].name, "grad.", 5) == 0 &&
            strncmp(g->outs.v[i].name, "grad.pp.recv.", 13) != 0)
            reach(g, g->outs.v[i].t, part, 2, true, fwd);
    for (int i = 0; i < g->outs.n; i++)
        if (strncmp(g->outs.v[i].name, "pp.send.", 8) == 0 ||
            (last && strcmp(g->outs.v[i].name, "loss") == 0))
            reach(g, g->outs.v[i].t, part, 0, false, NULL);
    for (int i = 0; i < n; i++)
        if (fwd[i] && part[i] < 0)
            reach(g, g->ops.v[i].out, part, 0, false, NULL);
    *f = part_graph(g, part, 0);
    *b = part_graph(g, part, 1);
    *w = part_graph(g, part, 2);
    free(part);
    free(fwd);
    ir_free(g);
}

/* ---- schedules --------------------------------------------------------- */

/* Stage s's order of F and B (2m): gpipe every F then every B; 1f1b (and
 * zb-h1) n - 1 - s forwards to fill the pipe, then one forward and one
 * backward in turn, then the backwards left. */
static void fb_order(int kind, int n, int m, int s, PassStageAct *out)
{
    int k = 0, f = 0, b = 0;
    if (kind == PASS_SCHED_GPIPE) {
        for (int i = 0; i < m; i++)
            out[k++] = (PassStageAct){'F', i};
        for (int i = 0; i < m; i++)
            out[k++] = (PassStageAct){'B', i};
        return;
    }
    int warm = n - 1 - s < m ? n - 1 - s : m;
    for (; f < warm; f++)
        out[k++] = (PassStageAct){'F', f};
    while (f < m) {
        out[k++] = (PassStageAct){'F', f++};
        out[k++] = (PassStageAct){'B', b++};
    }
    while (b < m)
        out[k++] = (PassStageAct){'B', b++};
}

/* Every stage's 3m actions (acts[s*3m + i]) and the slot each starts in
 * (F, B and W one slot each), listed by simulation: a stage runs the next
 * F or B of its order once its input has arrived (an F's activation from
 * s-1, a B's gradient from s+1).
 *   gpipe, 1f1b: each W right after its B, and the gradient goes to s-1
 *     after the W (B and W are one backward, as in Megatron-LM);
 *   zb-h1 (Qi et al.): the gradient goes to s-1 right after B; stage s
 *     keeps up to s W's waiting and runs one where its next F or B cannot
 *     run yet (the bubbles). 1f1b holds n - s micro-batches (F run, W not
 *     yet) on stage s; zb-h1 holds n on every stage, 1f1b's peak (stage
 *     0's), as the paper's ZB-H1 does; with wcap (may be NULL), stage s
 *     keeps at most min(s, wcap[s]) W's waiting (wcap[s] < 0: s), and
 *     holds n - s + that many.
 * The W's run in micro-batch order. Returns the number of slots. */
static int simulate(int kind, int n, int m, const int *wcap, PassStageAct *acts, int *start)
{
    int M3 = 3 * m;
    bool zb = kind == PASS_SCHED_ZBH1;
    PassStageAct *seq = xmalloc(sizeof(PassStageAct) * (size_t)(2 * m * n + 1));
    int *fend = xmalloc(sizeof(int) * (size_t)(n * m + 1));
    int *bend = xmalloc(sizeof(int) * (size_t)(n * m + 1)); /* its gradient sent */
    int *pos = xcalloc((size_t)n + 1, sizeof(int)), *na = xcalloc((size_t)n + 1, sizeof(int));
    int *nw = xcalloc((size_t)n + 1, sizeof(int)), *nb = xcalloc((size_t)n + 1, sizeof(int));
    for (int s = 0; s < n; s++)
        fb_order(kind, n, m, s, seq + s * 2 * m);
    for (int i = 0; i < n * m; i++)
        fend[i] = bend[i] = -1;
    int t = 0;
    for (;; t++) {
        bool all = true;
        for (int s = 0; s < n; s++)
            all &= na[s] == M3;
        if (all)
            break;
        if (t > 16 * M3 * n + 16)
            die("pass_stage_schedule: the %s schedule deadlocks", pass_stage_schedule_name(kind));
        for (int s = 0; s < n; s++) {
            if (na[s] == M3 || (na[s] > 0 && start[s * M3 + na[s] - 1] + 1 > t))
                continue;
            PassStageAct x = {0, -1};
            bool wpend = nw[s] < nb[s];
            int cap = wcap && wcap[s] >= 0 && wcap[s] < s ? wcap[s] : s;
            if (zb ? nb[s] - nw[s] > cap : wpend) {
                x = (PassStageAct){'W', nw[s]};
            } else if (pos[s] < 2 * m) {
                PassStageAct y = seq[s * 2 * m + pos[s]];
                int k = y.mb;
                bool ready;
                if (y.kind == 'F')
                    ready = s == 0 || (fend[(s - 1) * m + k] >= 0 && fend[(s - 1) * m + k] <= t);
                else
                    ready = fend[s * m + k] >= 0 && fend[s * m + k] <= t &&
                            (s == n - 1 ||
                             (bend[(s + 1) * m + k] >= 0 && bend[(s + 1) * m + k] <= t));
                if (ready) {
                    x = y;
                    pos[s]++;
                }
            }
            if (x.mb < 0 && wpend)
                x = (PassStageAct){'W', nw[s]};
            if (x.mb < 0)
                continue;
            acts[s * M3 + na[s]] = x;
            start[s * M3 + na[s]] = t;
            na[s]++;
            if (x.kind == 'F')
                fend[s * m + x.mb] = t + 1;
            else if (x.kind == 'B')
                nb[s]++;
            else
                nw[s]++;
            if (x.kind == (zb ? 'B' : 'W'))
                bend[s * m + x.mb] = t + 1;
        }
    }
    free(seq);
    free(fend);
    free(bend);
    free(pos);
    free(na);
    free(nw);
    free(nb);
    return t;
}

int pass_stage_schedule(int kind, int n, int m, int s, PassStageAct *out)
{
    return pass_stage_schedule_capped(kind, n, m, s, NULL, out);
}

void pass_stage_schedule_all(int kind, int n, int m, const int *wcap, PassStageAct *out)
{
    int *start = xmalloc(sizeof(int) * (size_t)(n * 3 * m + 1));
    simulate(kind, n, m, wcap, out, start);
    free(start);
}

int pass_stage_schedule_capped(int kind, int n, int m, int s, const int *wcap,
                               PassStageAct *out)
{
    PassStageAct *a = xmalloc(sizeof(PassStageAct) * (size_t)(n * 3 * m + 1));
    int *start = xmalloc(sizeof(int) * (size_t)(n * 3 * m + 1));
    simulate(kind, n, m, wcap, a, start);
    memcpy(out, a + s * 3 * m, sizeof(PassStageAct) * (size_t)(3 * m));
    free(a);
    free(start);
    return 3 * m;
}

void pass_stage_schedule_print(int kind, int n, int m, FILE *f)
{
    pass_stage_schedule_print_capped(kind, n, m, NULL, f);
}

void pass_stage_schedule_print_capped(int kind, int n, int m, const int *wcap, FILE *f)
{
    int M3 = 3 * m;
    PassStageAct *a = xmalloc(sizeof(PassStageAct) * (size_t)(n * M3 + 1));
    int *start = xmalloc(sizeof(int) * (size_t)(n * M3 + 1));
    int T = simulate(kind, n, m, wcap, a, start);
    bool zb = kind == PASS_SCHED_ZBH1;
    fprintf(f, "# stages: pp = %d, micro-batches = %d, schedule = %s (slots: F, B, W one each; "
            "%s)\n", n, m, pass_stage_schedule_name(kind),
            zb ? "B sends its gradient, W runs later" : "B then W, one backward, then its send");
    fprintf(f, "# slot   ");
    for (int t = 0; t < T; t++)
        fprintf(f, " %3d", t);
    fputc('\n', f);
    for (int s = 0; s < n; s++) {
        fprintf(f, "stage %2d:", s);
        char *row = xmalloc((size_t)T * 4 + 8);
        for (int t = 0; t < T; t++)
            memcpy(row + 4 * t, "   .", 4);
        for (int i = 0; i < M3; i++) {
            char cell[16];
            snprintf(cell, sizeof cell, " %c%-2d", a[s * M3 + i].kind, a[s * M3 + i].mb % 100);
            memcpy(row + 4 * start[s * M3 + i], cell, 4);
        }
        int e = 4 * T;
        while (e > 0 && row[e - 1] == ' ')
            e--;
        row[e] = 0;
        fprintf(f, "%s\n", row);
        free(row);
    }
    fprintf(f, "# bubble: %.1f%% of %d stages x %d slots idle (formulas: 1f1b (p-1)/(m+p-1) = "
            "%.1f%%, zb-h1 (p-1)/(3m+p-1) = %.1f%%)\n", 100.0 * (n * T - n * M3) / (n * T), n, T,
            100.0 * (n - 1) / (m + n - 1), 100.0 * (n - 1) / (3 * m + n - 1));
    /* each stage's program, with its sends and receives */
    for (int s = 0; s < n; s++) {
        fprintf(f, "stage %d program:", s);
        for (int i = 0; i < M3; i++) {
            PassStageAct x = a[s * M3 + i];
            if (x.kind == 'F') {
                if (s > 0)
                    fprintf(f, " recv(act %d <- %d)", x.mb, s - 1);
                fprintf(f, " F%d", x.mb);
                if (s < n - 1)
                    fprintf(f, " send(act %d -> %d)", x.mb, s + 1);
            } else if (x.kind == 'B') {
                if (s < n - 1)
                    fprintf(f, " recv(grad %d <- %d)", x.mb, s + 1);
                fprintf(f, " B%d", x.mb);
            } else {
                fprintf(f, " W%d", x.mb);
            }
            if (s > 0 && x.kind == (zb ? 'B' : 'W'))
                fprintf(f, " send(grad %d -> %d)", x.mb, s - 1);
        }
        fputc('\n', f);
    }
    free(a);
    free(start);
}

void pass_stage_cut_print(const Graph *g, const PassStageCut *c, FILE *f)
{
    double total = 0;
    for (int s = 0; s < c->n; s++)
        total += c->cost[s];
    for (int s = 0; s < c->n; s++) {
        int np = 0;
        int64_t pb = 0;
        for (int i = 0; i < g->t.n; i++)
            if (g->t.v[i].kind == TK_PARAM && pass_stage_owns(g, c, s, i)) {
                np++;
                pb += shape_bytes(&g->t.v[i].s);
            }
        const Op *op = &g->ops.v[c->first[s]];
        char b[32];
        fprintf(f, "# stage %d: ops %d..%d (from %s:%d), cost %.1f%%, %d params (%s)", s,
                c->first[s], c->first[s + 1] - 1, op->loc.file ? op->loc.file : "?",
                op->loc.line, total > 0 ? 100.0 * c->cost[s] / total : 0, np,
                ir_fmt_bytes((double)pb, 2, b, sizeof b));
        if (s > 0) {
            fprintf(f, "; receives");
            for (int k = 0; k < c->ncross[s]; k++) {
                char sb[128];
                fprintf(f, " %%%d:%s", c->cross[s][k],
                        shape_str(g, &g->t.v[c->cross[s][k]].s, sb, sizeof sb));
            }
            fprintf(f, " (%s)", ir_fmt_bytes((double)c->bytes[s], 2, b, sizeof b));
        }
        fputc('\n', f);
    }
    for (int i = 0; i < g->t.n; i++) {
        if (g->t.v[i].kind != TK_PARAM)
            continue;
        int own = 0;
        for (int s = 0; s < c->n; s++)
            own += pass_stage_owns(g, c, s, i);
        if (own > 1) {
            fprintf(f, "# tied: \"%s\" is read by stages", g->t.v[i].name);
            for (int s = 0; s < c->n; s++)
                if (pass_stage_owns(g, c, s, i))
                    fprintf(f, " %d", s);
            fprintf(f, " (its gradient is summed over them before the update)\n");
        }
    }
}
