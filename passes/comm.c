/* comm.c - the comm pass: gradient buckets and where their all-reduces start
 * and are waited for; gradient accumulation over micro-batches; the
 * micro-batch graph.
 *
 * New ops are placed by a key (old op index, slot): slot < 0 goes before the
 * old op, slot > 0 after it, so one stable sort gives the new program order. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int at, slot, seq; /* seq: creation order, the last tie-break */
} Key;

typedef struct {
    Graph *g;
    Key *key;   /* per op index (old and new) */
    int nkey, cap;
    int nseq;
} Placer;

static void place(Placer *p, int op, int at, int slot)
{
    while (op >= p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->key = xrealloc(p->key, sizeof(Key) * (size_t)p->cap);
    }
    p->key[op] = (Key){at, slot, p->nseq++};
    if (op >= p->nkey)
        p->nkey = op + 1;
}

/* ctx: the Key array, by op index */
static int cmp_key(const void *a, const void *b, void *ctx)
{
    const Key *keys = ctx;
    const Key *x = &keys[*(const int *)a], *y = &keys[*(const int *)b];
    if (x->at != y->at)
        return x->at < y->at ? -1 : 1;
    if (x->slot != y->slot)
        return x->slot < y->slot ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Puts g's ops in key order, without the ops drop[] marks (NULL: none),
 * and compacts. */
static void reorder_drop(Placer *p, const bool *drop)
{
    Graph *g = p->g;
    int n = g->ops.n, m = 0;
    int *ord = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        if (!drop || !drop[i])
            ord[m++] = i;
    qsort_r(ord, (size_t)m, sizeof(int), cmp_key, p->key);
    ir_reorder_ops(g, ord, m);
    free(ord);
    ir_compact(g);
}

static void reorder(Placer *p) { reorder_drop(p, NULL); }

/* Appends an op and gives it a place. */
static int add_op(Placer *p, Opcode code, const int *in, int nin, const OpAttr *a,
                  SrcLoc loc, int at, int slot)
{
    int t = ir_op_x(p->g, code, in, nin, a, loc);
    place(p, p->g->ops.n - 1, at, slot);
    return t;
}

typedef struct {
    const char *name; /* param name */
    int out;          /* index in g->outs of "grad.NAME" */
    int t;            /* gradient tensor */
    int ready;        /* index of its producer (-1: a graph input) */
} Grad;

static int cmp_ready(const void *a, const void *b)
{
    const Grad *x = a, *y = b;
    if (x->ready != y->ready)
        return x->ready < y->ready ? -1 : 1;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->out < y->out ? -1 : x->out > y->out;
}

typedef struct {
    const char *name;
    int t;
} Named;

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const Named *)a)->name, ((const Named *)b)->name);
}

/* The graph's "grad.P" outputs of params, in the order they are ready, one
 * per gradient tensor: when simplify has merged two params' gradients into
 * one tensor (x + b1 + b2 gives b1 and b2 the same gradient), the first
 * output (lowest index in g->outs) stands for both. Everything the pass
 * does to that tensor (accumulate, all-reduce) reaches every output that
 * names it, since outputs are rewritten by tensor, and the merged params'
 * accumulators would hold equal values anyway. */
static int collect_grads(const Graph *g, Grad **out)
{
    VEC(Named) params = {0}; /* by name: one sort instead of a scan per output */
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].kind == TK_PARAM && g->t.v[i].name) {
            Named nm = {g->t.v[i].name, i};
            vec_push(&params, nm);
        }
    if (params.n)
        qsort(params.v, (size_t)params.n, sizeof(Named), cmp_named);
    VEC(Grad) v = {0};
    for (int k = 0; k < g->outs.n; k++) {
        const char *nm = g->outs.v[k].name;
        if (strncmp(nm, "grad.", 5) != 0 || params.n == 0)
            continue;
        Named key = {nm + 5, -1};
        if (!bsearch(&key, params.v, (size_t)params.n, sizeof(Named), cmp_named))
            continue;
        const Tensor *t = &g->t.v[g->outs.v[k].t];
        Grad gr = {nm + 5, k, t->id, t->op};
        vec_push(&v, gr);
    }
    vec_free(&params);
    if (v.n)
        qsort(v.v, (size_t)v.n, sizeof(Grad), cmp_ready);
    int n = 0;
    for (int k = 0; k < v.n; k++)
        if (n == 0 || v.v[n - 1].t != v.v[k].t)
            v.v[n++] = v.v[k];
    *out = v.v;
    return n;
}

/* Replaces, for each pair (pairs[2q], pairs[2q+1]) = (from, to), operand
 * `from` by `to` in every op except the ops with skip[i] set and the op
 * that produces `to`, and in the outputs and updates: one sweep over the
 * graph for all pairs. Each `from` appears once and no `to` is a `from`
 * (the callers replace old tensors by new ones), so the order of the pairs
 * does not matter. */
static void replace_uses(Graph *g, const int *pairs, int npairs, const bool *skip)
{
    if (npairs == 0)
        return;
    int *to = xmalloc(sizeof(int) * (size_t)g->t.n);
    for (int t = 0; t < g->t.n; t++)
        to[t] = -1;
    for (int q = 0; q < npairs; q++)
        to[pairs[2 * q]] = pairs[2 * q + 1];
    for (int i = 0; i < g->ops.n; i++) {
        Op *op = &g->ops.v[i];
        if (skip && skip[i])
            continue;
        for (int j = 0; j < op->nin; j++) {
            int r = op->in[j] >= 0 ? to[op->in[j]] : -1;
            if (r >= 0 && op->out != r)
                op->in[j] = r;
        }
    }
    for (int k = 0; k < g->outs.n; k++)
        if (to[g->outs.v[k].t] >= 0)
            g->outs.v[k].t = to[g->outs.v[k].t];
    for (int k = 0; k < g->upd.n; k++)
        if (to[g->upd.v[k].value] >= 0)
            g->upd.v[k].value = to[g->upd.v[k].value];
    free(to);
}

/* Per op (g->ops.n entries): whether its result flows into one of the
 * gradients gr[0..n) (their producers and everything before them). Such
 * an op must keep reading a gradient's local value: a gradient computed
 * from another one (the optimizer's NaN guard multiplies the smallest
 * param's gradient by (loss*0 + 1), and simplify may have merged that
 * gradient with another param's) gets its own accumulation and all-reduce,
 * and reading the other's reduced value instead would count it twice and
 * make the all-reduce wait for itself. Caller frees. */
static bool *grad_feeders(const Graph *g, const Grad *gr, int n)
{
    bool *f = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int k = 0; k < n; k++)
        if (g->t.v[gr[k].t].op >= 0)
            f[g->t.v[gr[k].t].op] = true;
    for (int i = g->ops.n - 1; i >= 0; i--) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; f[i] && j < op->nin; j++)
            if (g->t.v[op->in[j]].op >= 0)
                f[g->t.v[op->in[j]].op] = true;
    }
    return f;
}

static SrcLoc loc_of(const Graph *g, int t)
{
    int op = g->t.v[t].op;
    return op >= 0 ? g->ops.v[op].loc : (SrcLoc){NULL, 0};
}

/* The zero-initialised state accum.P that sums gradient g's micro-batches. */
static int add_accum(Graph *g, const Grad *gr)
{
    char *nm = xasprintf("accum.%s", gr->name);
    int acc = ir_add_input(g, TK_STATE, intern(nm), g->t.v[gr->t].s,
                           (ParamInit){INIT_ZEROS, 0, 0});
    free(nm);
    return acc;
}

/* grad <- (grad + accum.P) / K, right after the gradient's producer. */
static void accumulate(Graph *g, int K)
{
    Grad *gr;
    int n = collect_grads(g, &gr);
    Placer p = {g, NULL, 0, 0, 0};
    for (int i = 0; i < g->ops.n; i++)
        place(&p, i, i, 0);
    VEC(int) reps = {0}; /* pairs: gradient, its mean */
    VEC(int) mine = {0}; /* the sums and means, which read the gradients */
    bool *feeds = grad_feeders(g, gr, n);
    int nold = g->ops.n;
    for (int k = 0; k < n; k++) {
        Shape s = g->t.v[gr[k].t].s;
        int acc = add_accum(g, &gr[k]);
        SrcLoc loc = loc_of(g, gr[k].t);
        int at = gr[k].ready;
        int sum = add_op(&p, OP_ADD, (int[]){gr[k].t, acc}, 2, &(OpAttr){0}, loc, at, 1);
        OpAttr ca = {.f = 1.0 / K, .dtype = s.dtype};
        ir_attr_set_shape(&ca, &s);
        int c = add_op(&p, OP_CONST, NULL, 0, &ca, loc, at, 2);
        int mean = add_op(&p, OP_MUL, (int[]){sum, c}, 2, &(OpAttr){0}, loc, at, 3);
        for (int q = g->ops.n - 3; q < g->ops.n; q++)
            g->ops.v[q].flags |= OPF_BACKWARD;
        vec_push(&reps, gr[k].t);
        vec_push(&reps, mean);
        vec_push(&mine, g->t.v[sum].op);
        vec_push(&mine, g->t.v[mean].op);
    }
    bool *skip = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int i = 0; i < nold; i++)
        skip[i] = feeds[i];
    for (int q = 0; q < mine.n; q++)
        skip[mine.v[q]] = true;
    replace_uses(g, reps.v, reps.n / 2, skip);
    free(skip);
    free(feeds);
    vec_free(&reps);
    vec_free(&mine);
    free(gr);
    if (n)
        reorder(&p);
    free(p.key);
}

/* Readiness and first reads in fused-kernel terms: a group (fuse) is one
 * kernel, which finishes a gradient at its last op and first reads one at its
 * first op. Fills gr[].ready (sorted) and first_use[tensor]; returns a
 * group that reads a gradient and starts before the gradient is finished
 * (one holding its producer and a reader, say), or -1. */
static int analyse(const Graph *g, Grad *gr, int n, int *first_use, const bool *feeds)
{
    int nops = g->ops.n, ngroups = 0;
    for (int i = 0; i < nops; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    int *gfirst = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    int *glast = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    for (int k = 0; k < ngroups; k++)
        gfirst[k] = nops, glast[k] = -1;
    for (int i = 0; i < nops; i++) {
        int k = g->ops.v[i].group;
        if (k < 0)
            continue;
        if (i < gfirst[k])
            gfirst[k] = i;
        glast[k] = i;
    }
    for (int k = 0; k < n; k++) {
        int op = g->t.v[gr[k].t].op;
        gr[k].ready = op >= 0 && g->ops.v[op].group >= 0 ? glast[g->ops.v[op].group] : op;
    }
    if (n)
        qsort(gr, (size_t)n, sizeof(Grad), cmp_ready);
    for (int t = 0; t < g->t.n; t++)
        first_use[t] = nops;
    for (int i = nops - 1; i >= 0; i--) {
        const Op *op = &g->ops.v[i];
        int at = op->group >= 0 ? gfirst[op->group] : i;
        for (int j = 0; j < op->nin && !feeds[i]; j++)
            if (at < first_use[op->in[j]])
                first_use[op->in[j]] = at;
    }
    /* a group that reads a gradient and starts before it is finished */
    int clash = -1;
    for (int k = 0; k < n && clash < 0; k++) {
        if (first_use[gr[k].t] > gr[k].ready)
            continue;
        for (int i = 0; i < nops && clash < 0; i++) {
            const Op *op = &g->ops.v[i];
            for (int j = 0; j < op->nin && clash < 0 && !feeds[i]; j++)
                if (op->in[j] == gr[k].t && op->group >= 0 && gfirst[op->group] <= gr[k].ready)
                    clash = op->group;
        }
        if (clash < 0)
            die("comm: grad.%s is read at op %d before it is finished (op %d)", gr[k].name,
                first_use[gr[k].t], gr[k].ready);
    }
    free(gfirst);
    free(glast);
    return clash;
}

/* Splits back into single-op kernels the groups that analyse reports, one
 * at a time until none is left, exactly as calling analyse again after each
 * split would (the same groups in the same order; gr[] and first_use[] end
 * as its last call leaves them), but each split touches only the group's
 * ops, the readers of what they read and the gradients: a step that
 * accumulates micro-batches has one such group per param (the GEMM whose
 * epilogue squares the gradient's mean for the norm), and a full analyse per
 * split made the pass quadratic in depth. */
static void split_clashes(Graph *g, Grad *gr, int n, int *first_use, const bool *feeds)
{
    int clash = analyse(g, gr, n, first_use, feeds);
    if (clash < 0)
        return;
    int nops = g->ops.n, nt = g->t.n, ngroups = 0;
    for (int i = 0; i < nops; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    int *gfirst = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    int *glast = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    int *mstart = xcalloc((size_t)ngroups + 2, sizeof(int)); /* members, by group */
    int *mem = xmalloc(sizeof(int) * (size_t)(nops + 1));
    int *rstart = xcalloc((size_t)nt + 2, sizeof(int)); /* readers (not feeders), by tensor */
    int nreads = 0;
    for (int k = 0; k < ngroups; k++)
        gfirst[k] = nops, glast[k] = -1;
    for (int i = 0; i < nops; i++) {
        const Op *op = &g->ops.v[i];
        if (op->group >= 0) {
            gfirst[op->group] = i < gfirst[op->group] ? i : gfirst[op->group];
            glast[op->group] = i;
            mstart[op->group + 1]++;
        }
        for (int j = 0; j < op->nin && !feeds[i]; j++, nreads++)
            rstart[op->in[j] + 1]++;
    }
    for (int k = 0; k < ngroups; k++)
        mstart[k + 1] += mstart[k];
    for (int t = 0; t < nt; t++)
        rstart[t + 1] += rstart[t];
    int *rd = xmalloc(sizeof(int) * (size_t)(nreads + 1));
    int *mfill = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    int *rfill = xmalloc(sizeof(int) * (size_t)(nt + 1));
    memcpy(mfill, mstart, sizeof(int) * (size_t)ngroups);
    memcpy(rfill, rstart, sizeof(int) * (size_t)nt);
    for (int i = 0; i < nops; i++) {
        const Op *op = &g->ops.v[i];
        if (op->group >= 0)
            mem[mfill[op->group]++] = i;
        for (int j = 0; j < op->nin && !feeds[i]; j++)
            rd[rfill[op->in[j]]++] = i;
    }
    free(mfill);
    free(rfill);
    while (clash >= 0) {
        for (int q = mstart[clash]; q < mstart[clash + 1]; q++)
            g->ops.v[mem[q]].group = -1;
        /* the first reads of what the split ops read (analyse's first_use) */
        for (int q = mstart[clash]; q < mstart[clash + 1]; q++) {
            const Op *op = &g->ops.v[mem[q]];
            for (int j = 0; j < op->nin && !feeds[mem[q]]; j++) {
                int t = op->in[j], at = nops;
                for (int r = rstart[t]; r < rstart[t + 1]; r++) {
                    int k = g->ops.v[rd[r]].group, a = k >= 0 ? gfirst[k] : rd[r];
                    at = a < at ? a : at;
                }
                first_use[t] = at;
            }
        }
        for (int k = 0; k < n; k++) {
            int op = g->t.v[gr[k].t].op;
            gr[k].ready = op >= 0 && g->ops.v[op].group >= 0 ? glast[g->ops.v[op].group] : op;
        }
        if (n)
            qsort(gr, (size_t)n, sizeof(Grad), cmp_ready);
        /* analyse's clash: the first reading group (in op order) of the first
         * gradient read before it is finished */
        clash = -1;
        for (int k = 0; k < n && clash < 0; k++) {
            if (first_use[gr[k].t] > gr[k].ready)
                continue;
            for (int r = rstart[gr[k].t]; r < rstart[gr[k].t + 1] && clash < 0; r++) {
                int grp = g->ops.v[rd[r]].group;
                if (grp >= 0 && gfirst[grp] <= gr[k].ready)
                    clash = grp;
            }
            if (clash < 0)
                die("comm: grad.%s is read at op %d before it is finished (op %d)", gr[k].name,
                    first_use[gr[k].t], gr[k].ready);
        }
    }
    free(gfirst);
    free(glast);
    free(mstart);
    free(mem);
    free(rstart);
    free(rd);
}

/* Where op i's kernel ends: the last op of its fuse group (or i). */
static int kernel_end(const Graph *g, int i)
{
    int k = g->ops.v[i].group, last = i;
    for (int q = i + 1; k >= 0 && q < g->ops.n; q++)
        if (g->ops.v[q].group == k)
            last = q;
    return last;
}

static bool has_shard_ops(const Graph *g)
{
    for (int i = 0; i < g->ops.n; i++)
        if (ir_opinfo[g->ops.v[i].code].attr == AK_SHARD)
            return true;
    return false;
}

static int cmp_gather(const void *a, const void *b, void *ctx)
{
    const Graph *g = ctx;
    int64_t x = g->ops.v[*(const int *)a].attr.ia[1], y = g->ops.v[*(const int *)b].attr.ia[1];
    return x < y ? -1 : x > y;
}

/* An all-gather bucket: gathers [k0, k1) of the flat-sorted list; first:
 * the first op that reads one of its params (the forward's first use). */
typedef struct {
    int k0, k1, first;
} GatherBucket;

static int cmp_gather_bucket(const void *a, const void *b)
{
    const GatherBucket *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return x->k0 < y->k0 ? -1 : x->k0 > y->k0;
}

/* The outputs of a sharded step: each rank holds only its own gradients
 * (never averaged in place, as zero=0's all-reduces do), so the "grad.P"
 * outputs of params are dropped (the gradients then die at their bucket's
 * wait) and "grad.shard" = `shard` (the last reduce_scatter_wait: this
 * rank's f32[S] shard of the mean gradient, before clipping) is added; the
 * runtime assembles the full mean gradient from the ranks' shards on
 * request (rt_zero_grads). shard < 0: no reduce_scatter, nothing to do. */
static void shard_grad_outputs(Graph *g, int shard)
{
    if (shard < 0)
        return;
    int k = 0;
    for (int i = 0; i < g->outs.n; i++) {
        const char *nm = g->outs.v[i].name;
        int pid = strncmp(nm, "grad.", 5) == 0 ? ir_find_tensor(g, nm + 5) : -1;
        if (pid < 0 || g->t.v[pid].kind != TK_PARAM)
            g->outs.v[k++] = g->outs.v[i];
    }
    g->outs.n = k;
    ir_add_output(g, "grad.shard", shard);
}

/* The norm's all-reduce start is placed right after `ready` (the kernel
 * end of its operand). The ops of the old order between the
 * reduce_scatter and `ready` that the operand does not need (zero=1: the
 * shard_packs of the params and their zero consts, which the optimizer
 * emits between the reduce_scatter and the squared norm) move: a
 * shard_pack that reads params only (the params' shard) to right before
 * the reduce-scatter waits, so that it runs while the last buckets are
 * reduced (the last one starts when backward ends and is otherwise waited
 * for at once), and the rest to right after the norm's start, in their
 * order, so they run while the scalar is reduced instead of before it
 * starts (docs/distributed.md, step 3). Fused ops stay with their kernel,
 * and an op stays when a staying op reads it (found in one pass from
 * `ready` down: readers come after what they read), so every op still
 * follows what it reads; a moved op goes later, before every reader it
 * had after `ready`, or (the params' shard_pack, which reads no op of the
 * step) earlier, to where the reduce_scatter was. */
static void sink_past_start(Placer *p, int ready)
{
    Graph *g = p->g;
    int lo = ready;
    while (lo >= 0 && g->ops.v[lo].code != OP_REDUCE_SCATTER)
        lo--;
    int n = ready - lo; /* the window (lo, ready] */
    if (lo < 0 || n <= 1)
        return;
    bool *need = xcalloc((size_t)n + 1, sizeof(bool)); /* op i: need[i - lo - 1] */
    need[n - 1] = true;
    for (int i = ready; i > lo; i--) {
        const Op *op = &g->ops.v[i];
        if (op->group >= 0 ||
            (ir_opinfo[op->code].cls == OC_COLLECTIVE && op->code != OP_SHARD_PACK))
            need[i - lo - 1] = true;
        if (!need[i - lo - 1])
            continue;
        for (int j = 0; j < op->nin; j++) {
            int d = g->t.v[op->in[j]].op;
            if (d > lo && d <= ready)
                need[d - lo - 1] = true;
        }
    }
    for (int i = lo + 1; i <= ready; i++)
        if (!need[i - lo - 1]) {
            const Op *op = &g->ops.v[i];
            bool params_only = op->code == OP_SHARD_PACK;
            for (int j = 0; j < op->nin && params_only; j++)
                params_only = g->t.v[op->in[j]].op < 0;
            if (params_only) /* before the waits, which sit at the reduce_scatter's place */
                place(p, i, lo, -2000000);
            else
                place(p, i, ready, 1); /* after the start (same key, later seq) */
        }
    free(need);
}

/* ZeRO-1 (the optimizer's reduce_scatter, allreduce and all_gather, see
 * pass_optimizer): the reduce_scatter's gradients, in its (flat) order, are
 * cut into buckets of about cap bytes; each bucket's reduce_scatter_start
 * goes right after the kernel that finishes its last gradient (after
 * backward with no_overlap) and its wait, chained through the shard, right
 * before the reduce_scatter it replaces. The scalar allreduce (the shards'
 * squared norms) becomes one allreduce bucket, with the ops it does not
 * need (the shard_packs) moved between its start and wait. The all_gathers are cut into
 * buckets of consecutive params; each all_gather_start goes right after the
 * kernel that writes the new shard, and each param's wait where its
 * all_gather was. gready[t]: when gradient t is finished (kernel end). */
static void comm_zero(Graph *g, const PassOpts *o, const int *gready, int last_bwd)
{
    int nops = g->ops.n;
    int64_t cap = o->bucket_bytes > 0 ? o->bucket_bytes : PASS_COMM_BUCKET_DEFAULT;
    Placer p = {g, NULL, 0, 0, 0};
    for (int i = 0; i < nops; i++)
        place(&p, i, i, 0);
    bool *drop = xcalloc((size_t)nops + 1, sizeof(bool));
    VEC(int) reps = {0}; /* pairs: old result, its replacement */
    VEC(int) gathers = {0};
    int bucket = 0, gshard = -1;
    for (int i = 0; i < nops; i++) {
        if (g->ops.v[i].code == OP_ALL_GATHER)
            vec_push(&gathers, i);
        if (g->ops.v[i].code != OP_REDUCE_SCATTER)
            continue;
        Op R = g->ops.v[i]; /* copy: add_op grows g->ops */
        int nm = R.nin;
        const int *mem = R.in;
        int64_t start = R.attr.ia[1], total = R.attr.ia[2], nr = R.attr.ia[3];
        /* buckets: [k0, k1) of mem */
        VEC(int) cut = {0};
        for (int k0 = 0; k0 < nm;) {
            int64_t bytes = 0;
            int k1 = k0;
            while (k1 < nm && (k1 == k0 || bytes < cap))
                bytes = ir_add_sat(bytes, shape_bytes(&g->t.v[mem[k1++]].s));
            vec_push(&cut, k0);
            k0 = k1;
        }
        vec_push(&cut, nm);
        int nb = cut.n - 1;
        int *at = xmalloc(sizeof(int) * (size_t)(nb + 1));
        int first_at = i;
        for (int b = 0; b < nb; b++) {
            int ready = -1;
            for (int k = cut.v[b]; k < cut.v[b + 1]; k++)
                if (gready[mem[k]] > ready)
                    ready = gready[mem[k]];
            if (o->no_overlap && last_bwd > ready)
                ready = last_bwd;
            at[b] = ready < i ? ready : i - 1;
            if (at[b] < first_at)
                first_at = at[b];
        }
        /* the shard the buckets are reduced into: a fresh zero buffer of
         * its own (no other op may share it), before the first start */
        Shape ss = g->t.v[R.out].s;
        OpAttr ca = {.f = 0, .dtype = DT_F32, .rank = 1, .shape = {ss.dim[0]}};
        int acc = first_at >= 0 ? add_op(&p, OP_CONST, NULL, 0, &ca, R.loc, first_at, 1)
                                : add_op(&p, OP_CONST, NULL, 0, &ca, R.loc, 0, -2000000);
        g->ops.v[g->ops.n - 1].flags |= OPF_OPTIM;
        int prev = acc;
        int64_t flat = start;
        for (int b = 0; b < nb; b++) {
            int k0 = cut.v[b], k1 = cut.v[b + 1];
            OpAttr ba = {.ia = {bucket, flat, total, nr}, .nia = 4};
            int *in = xmalloc(sizeof(int) * (size_t)(k1 - k0 + 2));
            in[0] = acc;
            for (int k = k0; k < k1; k++)
                in[1 + k - k0] = mem[k];
            int tok = at[b] >= 0 ? add_op(&p, OP_REDUCE_SCATTER_START, in, k1 - k0 + 1, &ba,
                                          R.loc, at[b], 1 + bucket)
                                 : add_op(&p, OP_REDUCE_SCATTER_START, in, k1 - k0 + 1, &ba,
                                          R.loc, 0, -1000000 + bucket);
            int *win = xmalloc(sizeof(int) * (size_t)(k1 - k0 + 3));
            win[0] = tok;
            win[1] = prev;
            for (int k = k0; k < k1; k++)
                win[2 + k - k0] = mem[k];
            prev = add_op(&p, OP_REDUCE_SCATTER_WAIT, win, k1 - k0 + 2, &ba, R.loc, i,
                          -1000 + bucket);
            free(in);
            free(win);
            for (int k = k0; k < k1; k++)
                flat += shape_numel(&g->t.v[mem[k]].s);
            bucket++;
        }
        drop[i] = true;
        vec_push(&reps, R.out);
        vec_push(&reps, prev);
        gshard = prev;
        free(at);
        vec_free(&cut);
    }
    /* the norm's scalar all-reduce */
    for (int i = 0; i < nops; i++) {
        if (g->ops.v[i].code != OP_ALLREDUCE)
            continue;
        Op A = g->ops.v[i];
        int x = A.in[0], def = g->t.v[x].op;
        int ready = def >= 0 ? kernel_end(g, def) : -1;
        OpAttr ba = {.ia = {bucket}, .nia = 1};
        int tok = ready >= 0 ? add_op(&p, OP_ALLREDUCE_START, &x, 1, &ba, A.loc, ready, 1)
                             : add_op(&p, OP_ALLREDUCE_START, &x, 1, &ba, A.loc, 0, -1000000);
        int w = add_op(&p, OP_ALLREDUCE_WAIT, (int[]){tok, x}, 2, &ba, A.loc, i, -1);
        if (ready >= 0)
            sink_past_start(&p, ready);
        drop[i] = true;
        vec_push(&reps, A.out);
        vec_push(&reps, w);
        bucket++;
    }
    /* the all-gathers, by flat start */
    if (gathers.n)
        qsort_r(gathers.v, (size_t)gathers.n, sizeof(int), cmp_gather, g);
    int *last_read = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    int *first_read = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    for (int t = 0; t < g->t.n; t++)
        last_read[t] = -1, first_read[t] = nops;
    for (int i = 0; i < nops; i++)
        for (int j = 0; j < g->ops.v[i].nin && g->ops.v[i].code != OP_ALL_GATHER; j++) {
            int t = g->ops.v[i].in[j];
            last_read[t] = kernel_end(g, i);
            if (i < first_read[t])
                first_read[t] = i;
        }
    /* buckets of consecutive gathers (one shard), in flat order */
    VEC(GatherBucket) gb = {0};
    for (int k0 = 0; k0 < gathers.n;) {
        int64_t bytes = 0;
        int k1 = k0;
        int shard = g->ops.v[gathers.v[k0]].in[0];
        while (k1 < gathers.n && (k1 == k0 || bytes < cap) &&
               g->ops.v[gathers.v[k1]].in[0] == shard)
            bytes = ir_add_sat(bytes, shape_bytes(&g->t.v[g->ops.v[gathers.v[k1++]].out].s));
        GatherBucket b = {k0, k1, nops};
        for (int k = k0; k < k1; k++) {
            int f = first_read[g->ops.v[gathers.v[k]].in[1]];
            if (f < b.first)
                b.first = f;
        }
        vec_push(&gb, b);
        k0 = k1;
    }
    /* issued in the order the next step's forward first reads them (this
     * step's forward reads the params in the same order): gpt's tied wte is
     * read first and its gradient finished last, so in flat order its
     * bucket would be gathered last and the next forward's first kernel
     * would wait for every gather */
    if (gb.n)
        qsort(gb.v, (size_t)gb.n, sizeof(GatherBucket), cmp_gather_bucket);
    for (int q = 0; q < gb.n; q++) {
        int k0 = gb.v[q].k0, k1 = gb.v[q].k1;
        int shard = g->ops.v[gathers.v[k0]].in[0];
        int def = g->t.v[shard].op;
        int ready = def >= 0 ? kernel_end(g, def) : -1;
        int *in = xmalloc(sizeof(int) * (size_t)(k1 - k0 + 2));
        in[0] = shard;
        for (int k = k0; k < k1; k++) {
            const Op *G = &g->ops.v[gathers.v[k]];
            in[1 + k - k0] = G->in[1];
            if (last_read[G->in[1]] > ready)
                die("comm: param %%%d is read at op %d, after its all_gather starts (op %d)",
                    G->in[1], last_read[G->in[1]], ready);
        }
        Op G0 = g->ops.v[gathers.v[k0]];
        OpAttr ba = G0.attr;
        ba.ia[0] = bucket;
        int tok = ready >= 0
                      ? add_op(&p, OP_ALL_GATHER_START, in, k1 - k0 + 1, &ba, G0.loc, ready,
                               1 + bucket)
                      : add_op(&p, OP_ALL_GATHER_START, in, k1 - k0 + 1, &ba, G0.loc, 0,
                               -1000000 + bucket);
        free(in);
        for (int k = k0; k < k1; k++) {
            Op G = g->ops.v[gathers.v[k]];
            OpAttr wa = G.attr;
            wa.ia[0] = bucket;
            int w = add_op(&p, OP_ALL_GATHER_WAIT, (int[]){tok, shard, G.in[1]}, 3, &wa, G.loc,
                           gathers.v[k], -1);
            drop[gathers.v[k]] = true;
            vec_push(&reps, G.out);
            vec_push(&reps, w);
        }
        bucket++;
    }
    vec_free(&gb);
    free(last_read);
    free(first_read);
    bool *is_comm = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int i = nops; i < g->ops.n; i++)
        is_comm[i] = true;
    replace_uses(g, reps.v, reps.n / 2, is_comm);
    free(is_comm);
    shard_grad_outputs(g, gshard);
    vec_free(&reps);
    vec_free(&gathers);
    drop = xrealloc(drop, sizeof(bool) * (size_t)(g->ops.n + 1));
    for (int i = nops; i < g->ops.n; i++)
        drop[i] = false;
    reorder_drop(&p, drop);
    free(drop);
    free(p.key);
}

bool pass_comm(Graph *g, const PassOpts *o, Diag *d)
{
    (void)d;
    bool zero = has_shard_ops(g);
    if (o->grad_accum <= 1 && o->nranks <= 1 && !zero)
        return true;
    /* the zeros that shard_pack reads for params without weight decay are
     * optimizer ops: a kernel of backward that fuse gave one of them would
     * end only after the optimizer begins, leaving its gradient no point
     * for a start: they become kernels of their own */
    for (int i = 0; zero && i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; op->code == OP_SHARD_PACK && j < op->nin; j++) {
            int def = g->t.v[op->in[j]].op;
            if (def >= 0 && g->ops.v[def].code == OP_CONST)
                g->ops.v[def].group = -1;
        }
    }
    if (o->grad_accum > 1)
        accumulate(g, o->grad_accum);
    Grad *gr;
    int n = collect_grads(g, &gr);
    int nops = g->ops.n;
    int *first_use = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    /* a kernel that reads a gradient before it is finished (a GEMM whose
     * epilogue squares the gradient for the norm, once accumulate put the
     * mean in between) leaves no point for the all-reduce (and is no longer
     * one convex kernel): such a group is split back into single-op kernels */
    bool *feeds = grad_feeders(g, gr, n);
    split_clashes(g, gr, n, first_use, feeds);
    if (zero) {
        int *gready = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
        int last = -1;
        for (int t = 0; t < g->t.n; t++)
            gready[t] = g->t.v[t].op >= 0 ? kernel_end(g, g->t.v[t].op) : -1;
        for (int k = 0; k < n; k++)
            last = gr[k].ready > last ? gr[k].ready : last;
        comm_zero(g, o, gready, last);
        free(gready);
        free(feeds);
        free(first_use);
        free(gr);
        return true;
    }
    if (o->nranks <= 1) {
        free(feeds);
        free(first_use);
        free(gr);
        return true;
    }
    int64_t cap = o->bucket_bytes > 0 ? o->bucket_bytes : PASS_COMM_BUCKET_DEFAULT;
    /* backward ends where its last gradient is produced */
    int last_bwd = -1;
    for (int k = 0; k < n; k++)
        if (gr[k].ready > last_bwd)
            last_bwd = gr[k].ready;

    Placer p = {g, NULL, 0, 0, 0};
    for (int i = 0; i < nops; i++)
        place(&p, i, i, 0);
    VEC(int) waits = {0}; /* pairs: gradient, wait result */
    int bucket = 0;
    for (int k0 = 0; k0 < n;) {
        int64_t bytes = 0;
        int k1 = k0;
        while (k1 < n && (k1 == k0 || bytes < cap)) {
            const Tensor *t = &g->t.v[gr[k1].t];
            bytes = ir_add_sat(bytes, shape_bytes(&t->s));
            k1++;
        }
        /* members k0..k1-1 (one per tensor: collect_grads) */
        VEC(int) mem = {0};
        int ready = -1, first = nops;
        for (int k = k0; k < k1; k++) {
            vec_push(&mem, gr[k].t);
            if (gr[k].ready > ready)
                ready = gr[k].ready;
            if (first_use[gr[k].t] < first)
                first = first_use[gr[k].t];
        }
        int start_at = ready;
        if (o->no_overlap && last_bwd > start_at)
            start_at = last_bwd;
        if (start_at >= first)
            start_at = first - 1;
        OpAttr ba = {.ia = {bucket}, .nia = 1};
        SrcLoc loc = loc_of(g, gr[k1 - 1].t);
        /* a start with no op before it goes before op 0 */
        int tok = start_at >= 0
                      ? add_op(&p, OP_ALLREDUCE_START, mem.v, mem.n, &ba, loc, start_at, 1 + bucket)
                      : add_op(&p, OP_ALLREDUCE_START, mem.v, mem.n, &ba, loc, 0, -1000000 + bucket);
        for (int q = 0; q < mem.n; q++) {
            int w = add_op(&p, OP_ALLREDUCE_WAIT, (int[]){tok, mem.v[q]}, 2, &ba, loc, first,
                           -1000 + bucket);
            vec_push(&waits, mem.v[q]);
            vec_push(&waits, w);
        }
        vec_free(&mem);
        bucket++;
        k0 = k1;
    }
    bool *skip = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++)
        skip[i] = i >= nops || feeds[i]; /* the collectives, and ops before a gradient */
    replace_uses(g, waits.v, waits.n / 2, skip);
    free(skip);
    free(feeds);
    vec_free(&waits);
    free(first_use);
    free(gr);
    reorder(&p);
    free(p.key);
    return true;
}

bool pass_comm_micro(Graph *g, Diag *d)
{
    (void)d;
    Grad *gr;
    int n = collect_grads(g, &gr);
    for (int k = 0; k < n; k++) {
        int acc = add_accum(g, &gr[k]);
        int sum = ir_op_x(g, OP_ADD, (int[]){acc, gr[k].t}, 2, &(OpAttr){0},
                          loc_of(g, gr[k].t));
        ir_add_update(g, acc, sum);
    }
    free(gr);
    ir_compact(g);
    return true;
}

static bool is_start(Opcode c)
{
    return c == OP_ALLREDUCE_START || c == OP_REDUCE_SCATTER_START || c == OP_ALL_GATHER_START;
}

void pass_comm_print(const Graph *g, FILE *f)
{
    int nb = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (is_start(g->ops.v[i].code))
            nb++;
    /* backward ends with the last gradient an allreduce or reduce-scatter
     * start reads */
    int last_bwd = -1;
    bool rs = false; /* with reduce-scatters, an allreduce is the norm's */
    for (int i = 0; i < g->ops.n; i++)
        rs |= g->ops.v[i].code == OP_REDUCE_SCATTER_START;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        bool grads = op->code == (rs ? OP_REDUCE_SCATTER_START : OP_ALLREDUCE_START);
        for (int j = op->code == OP_REDUCE_SCATTER_START; grads && j < op->nin; j++)
            if (g->t.v[op->in[j]].op > last_bwd && g->t.v[op->in[j]].kind != TK_CONST)
                last_bwd = g->t.v[op->in[j]].op;
    }
    fprintf(f, "# comm: %d buckets; backward ends at op %d\n", nb, last_bwd);
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (!is_start(op->code))
            continue;
        int64_t bytes = 0;
        const char *kind = op->code == OP_ALLREDUCE_START        ? ""
                           : op->code == OP_REDUCE_SCATTER_START ? " reduce-scatter"
                                                                 : " all-gather";
        fprintf(f, "# bucket %lld%s:", (long long)op->attr.ia[0], kind);
        int64_t flat = op->attr.ia[1];
        for (int j = op->code != OP_ALLREDUCE_START; j < op->nin; j++) {
            /* flat counts elements (a bf16 param's are 2 bytes) */
            const Tensor *t = &g->t.v[op->in[j]];
            bytes = ir_add_sat(bytes, shape_bytes(&t->s));
            const char *name = op->code == OP_ALL_GATHER_START ? t->name : NULL;
            const char *pre = "";
            /* a reduce-scatter's gradient: the param gathered at its flat start */
            for (int k = 0; op->code == OP_REDUCE_SCATTER_START && !name && k < g->ops.n; k++)
                if (g->ops.v[k].code == OP_ALL_GATHER_WAIT && g->ops.v[k].attr.ia[1] == flat)
                    name = g->t.v[g->ops.v[k].in[2]].name, pre = "grad.";
            for (int k = 0; k < g->outs.n && !name; k++) {
                int w = g->outs.v[k].t;
                const Op *wo = g->t.v[w].op >= 0 ? &g->ops.v[g->t.v[w].op] : NULL;
                if (wo && wo->code == OP_ALLREDUCE_WAIT && wo->in[1] == op->in[j])
                    name = g->outs.v[k].name;
            }
            fprintf(f, " %%%d%s%s%s", op->in[j], name ? "=" : "", pre, name ? name : "");
            flat += shape_numel(&t->s);
        }
        int wait = -1;
        for (int k = i + 1; k < g->ops.n && wait < 0; k++)
            if (g->ops.v[k].nin > 0 && g->ops.v[k].in[0] == op->out)
                wait = k;
        fprintf(f, "\n#   %lld bytes", (long long)bytes);
        if (op->code != OP_ALLREDUCE_START)
            fprintf(f, " (flat [%lld, %lld) of %lld, %lld ranks)", (long long)op->attr.ia[1],
                    (long long)flat, (long long)op->attr.ia[2],
                    (long long)op->attr.ia[3]);
        fprintf(f, "; start: op %d (after op %d, %s); first wait: op %d\n", i, i - 1,
                i > 0 ? ir_opinfo[g->ops.v[i - 1].code].name : "-", wait);
    }
    /* the tensor-parallel collectives (passes/partition.c), in program order */
    int ntp = 0;
    int64_t tpbytes = 0;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code != OP_TP_ALLREDUCE && op->code != OP_TP_ALL_GATHER &&
            op->code != OP_TP_REDUCE_SCATTER)
            continue;
        if (!ntp++)
            fprintf(f, "# tensor-parallel collectives (tp = %lld, rank %lld): op, kind, "
                       "bytes per rank, where\n",
                    (long long)op->attr.ia[1], (long long)op->attr.ia[2]);
        /* the larger of operand and result: what crosses the links */
        int64_t b = shape_bytes(&g->t.v[op->in[0]].s), bo = shape_bytes(&g->t.v[op->out].s);
        if (bo > b)
            b = bo;
        tpbytes = ir_add_sat(tpbytes, b);
        char sb[128];
        fprintf(f, "#   op %d %s %s %lld bytes, %s%s:%d\n", i, ir_opinfo[op->code].name,
                shape_str(g, &g->t.v[op->out].s, sb, sizeof sb), (long long)b,
                op->flags & OPF_BACKWARD ? "backward " : op->flags & OPF_OPTIM ? "optimizer "
                                                                              : "forward ",
                op->loc.file ? op->loc.file : "?", op->loc.line);
    }
    if (ntp)
        fprintf(f, "# %d tensor-parallel collectives, %lld bytes per rank per step\n", ntp,
                (long long)tpbytes);
}
