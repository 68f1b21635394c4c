/* fuse_recompute.c - cheap recompute in the fuse pass: values that cost
 * little arithmetic are computed again inside each kernel that reads them
 * instead of written to memory and read back.
 *   before grouping (pass_fuse_clone_cheap): every fusable consumer of a
 *     const, iota or broadcast gets its own copy, placed right before it;
 *   after the group ids are final (pass_fuse_recompute_cheap): a cheap
 *     elementwise chain one group computes and other fused groups read is
 *     cloned into each reader group (flags and source line kept, the
 *     reader's group id), when that reads no more bytes than writing and
 *     re-reading its result.
 * Reductions, GEMMs and random draws are never recomputed. Both leave the
 * graph in a valid program order (ir_reorder_ops) and compacted. */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

/* which: 0 broadcasts, 1 consts and iotas (after broadcasts, so that each
 * broadcast copy gets its own const) */
static bool is_clonable(const Op *op, int which)
{
    if (which == 0)
        return op->code == OP_BROADCAST;
    return op->code == OP_CONST || op->code == OP_IOTA;
}

/* Gives every fusable consumer of a const, iota or broadcast its own copy,
 * placed right before it. The original keeps unfused consumers, outputs and
 * updates; it is dropped when nothing else reads it. */
void pass_fuse_clone_cheap(Graph *g, int which)
{
    Uses u = pass_fuse_uses_build(g);
    int n0 = g->ops.n, nt0 = g->t.n;
    bool *keep = xcalloc((size_t)nt0 + 1, sizeof(bool));
    for (int i = 0; i < g->outs.n; i++)
        keep[g->outs.v[i].t] = true;
    for (int i = 0; i < g->upd.n; i++)
        keep[g->upd.v[i].value] = true;
    int *before = xmalloc(sizeof(int) * (size_t)(n0 + 1)); /* clone op -> consumer op */
    VEC(int) clones = {0};
    for (int i = 0; i < n0; i++) {
        Op *op = &g->ops.v[i];
        if (!is_clonable(op, which))
            continue;
        int t = op->out;
        int nfus = 0;
        for (int q = u.off[t]; q < u.off[t + 1]; q++) {
            int c = u.cons[q];
            if (c >= 0 && pass_fuse_op_fusable(g, &g->ops.v[c]) && g->ops.v[c].code != OP_MATMUL)
                nfus++;
        }
        if (nfus + (keep[t] ? 1 : 0) <= 1)
            continue;
        bool first = true;
        for (int q = u.off[t]; q < u.off[t + 1]; q++) {
            int c = u.cons[q];
            if (c < 0 || !pass_fuse_op_fusable(g, &g->ops.v[c]) || g->ops.v[c].code == OP_MATMUL)
                continue;
            if (first && !keep[t]) { /* the original serves the first one */
                first = false;
                continue;
            }
            Op src = g->ops.v[i];
            int nt = ir_op_x(g, src.code, src.in, src.nin, &src.attr, src.loc);
            Op *cl = &g->ops.v[g->ops.n - 1];
            cl->flags = src.flags;
            Op *cons = &g->ops.v[c];
            for (int j = 0; j < cons->nin; j++)
                if (cons->in[j] == t)
                    cons->in[j] = nt;
            vec_push(&clones, g->ops.n - 1);
            before = xrealloc(before, sizeof(int) * (size_t)(g->ops.n + 1));
            before[g->ops.n - 1] = c;
        }
    }
    /* drop originals nothing reads any more */
    int *uc = ir_use_counts(g);
    int n = g->ops.n;
    bool *drop = xcalloc((size_t)n + 1, sizeof(bool));
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        drop[i] = is_clonable(op, which) && op->out < nt0 && !uc[op->out] && !keep[op->out];
    }
    int *order = xmalloc(sizeof(int) * (size_t)(n + 1));
    int k = 0;
    if (clones.n) {
        /* clones of clonable ops read only earlier tensors, so placing each
         * right before its consumer keeps program order valid; a clone of a
         * broadcast whose operand is itself cloned later is fine because the
         * operand's producer precedes the original broadcast */
        int *cnt = xcalloc((size_t)n0 + 1, sizeof(int));
        for (int q = 0; q < clones.n; q++)
            cnt[before[clones.v[q]]]++;
        int *start = xcalloc((size_t)n0 + 2, sizeof(int));
        for (int i = 0; i < n0; i++)
            start[i + 1] = start[i] + cnt[i];
        int *byc = xmalloc(sizeof(int) * (size_t)(clones.n + 1));
        int *fill = xcalloc((size_t)n0 + 1, sizeof(int));
        for (int q = 0; q < clones.n; q++) {
            int c = before[clones.v[q]];
            byc[start[c] + fill[c]++] = clones.v[q];
        }
        for (int i = 0; i < n0; i++) {
            for (int q = start[i]; q < start[i + 1]; q++)
                order[k++] = byc[q]; /* clones are never dropped */
            if (!drop[i])
                order[k++] = i;
        }
        free(fill);
        free(byc);
        free(start);
        free(cnt);
    } else {
        for (int i = 0; i < n; i++)
            if (!drop[i])
                order[k++] = i;
    }
    ir_reorder_ops(g, order, k);
    free(order);
    free(drop);
    free(uc);
    vec_free(&clones);
    free(before);
    free(keep);
    pass_fuse_uses_free(&u);
    ir_compact(g);
}

enum { RECOMP_MAX_OPS = 16, RECOMP_MAX_FLOPS = 48 };

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ctx: the sort key, by op index */
static int cmp_key(const void *a, const void *b, void *ctx)
{
    const double *key = ctx;
    double x = key[*(const int *)a], y = key[*(const int *)b];
    return x < y ? -1 : x > y;
}

typedef struct {
    Graph *g;
    const bool *pinned;
    int G;
    VEC(int) chain;     /* ops to clone, in program order after sorting */
    VEC(int) leaves;    /* tensors read from memory */
    int *seen;
    int stamp;
    int flops;
    int nt0;            /* tensors before this pass's clones */
    int start;          /* the tensor whose chain is walked */
    const bool *kept;   /* stays in memory (decided for tensors < start) */
    bool ok;
} Chain;

/* Collects the ops of group G that compute t from tensors in memory. */
static void chain_walk(Chain *c, int t)
{
    Graph *g = c->g;
    if (t >= c->nt0) { /* a clone made by this pass: leave it alone */
        c->ok = false;
        return;
    }
    if (!c->ok || c->seen[t] == c->stamp)
        return;
    c->seen[t] = c->stamp;
    int p = g->t.v[t].op;
    const Op *op = p >= 0 ? &g->ops.v[p] : NULL;
    /* a value an earlier decision keeps in memory is read, not recomputed
     * (the LayerNorm input: its centred and normalised values are then
     * recomputed from it and the row statistics) */
    bool kept = t < c->start && c->kept[t];
    bool leaf = !op || op->group != c->G || op->code == OP_MATMUL || pass_fuse_is_reduce(op) ||
                (c->pinned[t] && op->code != OP_CONST) || kept;
    if (leaf) {
        vec_push(&c->leaves, t);
        return;
    }
    OpClass cls = ir_opinfo[op->code].cls;
    if (!(cls == OC_ELEMWISE || op->code == OP_BROADCAST)) {
        c->ok = false;
        return;
    }
    vec_push(&c->chain, p);
    c->flops += ir_opinfo[op->code].flops_per_elem;
    if (c->chain.n > RECOMP_MAX_OPS || c->flops > RECOMP_MAX_FLOPS) {
        c->ok = false;
        return;
    }
    for (int j = 0; j < op->nin; j++)
        chain_walk(c, op->in[j]);
}

/* Cheap elementwise values that a group computes and other fused groups
 * read (the GELU and LayerNorm intermediates that backward uses) are
 * recomputed inside each reader from what is in memory anyway (a GEMM
 * result, the LayerNorm input and its per-row statistics) when that reads
 * no more bytes than writing and re-reading them: then they are never
 * written. Reductions, GEMMs and random draws are never recomputed. */
void pass_fuse_recompute_cheap(Graph *g)
{
    int nt0 = g->t.n, n0 = g->ops.n;
    bool *mat = pass_fuse_materialised(g);
    bool *pinned = xcalloc((size_t)nt0 + 1, sizeof(bool));
    for (int i = 0; i < g->outs.n; i++)
        pinned[g->outs.v[i].t] = true;
    for (int i = 0; i < g->upd.n; i++)
        pinned[g->upd.v[i].value] = true;
    for (int i = 0; i < n0; i++) {
        const Op *op = &g->ops.v[i];
        if (op->group < 0 || op->code == OP_MATMUL || op->code == OP_BROADCAST)
            for (int j = 0; j < op->nin; j++)
                pinned[op->in[j]] = true;
    }
    /* per (op, group): its clone there, via a small open hash */
    int hcap = 1024;
    while (hcap < 4 * n0)
        hcap *= 2;
    int *hkey_op = xmalloc(sizeof(int) * (size_t)hcap), *hkey_g = xmalloc(sizeof(int) * (size_t)hcap);
    int *hval = xmalloc(sizeof(int) * (size_t)hcap);
    for (int i = 0; i < hcap; i++)
        hkey_op[i] = -1;
    /* kept[t]: t stays in memory; candidates are decided in id order
     * (producers first), an accepted one is no longer kept */
    bool *kept = xmalloc(sizeof(bool) * (size_t)(nt0 + 1));
    memcpy(kept, mat, sizeof(bool) * (size_t)nt0);
    Chain c = {.g = g, .pinned = pinned, .nt0 = nt0, .kept = kept};
    c.seen = xcalloc((size_t)nt0 + 1, sizeof(int));
    Uses u = pass_fuse_uses_build(g);
    VEC(int) before = {0}; /* per new op: the op it goes before */
    int *readers = xmalloc(sizeof(int) * (size_t)(n0 + 1));
    /* (group, tensor) pairs: which tensors each group reads */
    VEC(uint64_t) rd = {0};
    for (int i = 0; i < n0; i++)
        if (g->ops.v[i].group >= 0)
            for (int j = 0; j < g->ops.v[i].nin; j++)
                vec_push(&rd, (uint64_t)(uint32_t)g->ops.v[i].group << 32 |
                                  (uint32_t)g->ops.v[i].in[j]);
    if (rd.n)
        qsort(rd.v, (size_t)rd.n, sizeof(uint64_t), cmp_u64);
    for (int t = 0; t < nt0; t++) {
        int p = g->t.v[t].op;
        if (p < 0 || !mat[t] || pinned[t])
            continue;
        const Op *op = &g->ops.v[p];
        int G = op->group;
        if (G < 0 || ir_opinfo[op->code].cls != OC_ELEMWISE || op->code == OP_CONST)
            continue;
        /* outside readers: fused, elementwise or reductions */
        int nr = 0;
        bool ok = true;
        for (int q = u.off[t]; q < u.off[t + 1] && ok; q++) {
            int r = u.cons[q];
            if (r < 0 || g->ops.v[r].group == G)
                continue;
            const Op *ro = &g->ops.v[r];
            if (ro->group < 0 ||
                !(ir_opinfo[ro->code].cls == OC_ELEMWISE || pass_fuse_is_reduce(ro)))
                ok = false;
            readers[nr++] = r;
        }
        if (!ok || !nr)
            continue;
        c.stamp++;
        c.chain.n = c.leaves.n = 0;
        c.flops = 0;
        c.G = G;
        c.start = t;
        c.ok = true;
        chain_walk(&c, t);
        if (!c.ok)
            continue;
        /* bytes: full-size leaves each reader group does not read yet, vs
         * writing t once and reading it once per reader group */
        double tb = (double)shape_bytes(&g->t.v[t].s), cost = 0;
        int ngr = 0;
        for (int a = 0; a < nr; a++) {
            int H = g->ops.v[readers[a]].group;
            bool dup = false;
            for (int b = 0; b < a; b++)
                dup |= g->ops.v[readers[b]].group == H;
            if (dup)
                continue;
            ngr++;
            for (int l = 0; l < c.leaves.n; l++) {
                int x = c.leaves.v[l];
                if ((double)shape_bytes(&g->t.v[x].s) < tb / 4)
                    continue; /* per-row values and params are cheap */
                uint64_t key = (uint64_t)(uint32_t)H << 32 | (uint32_t)x;
                if (!bsearch(&key, rd.v, (size_t)rd.n, sizeof(uint64_t), cmp_u64))
                    cost += (double)shape_bytes(&g->t.v[x].s);
            }
        }
        if (cost > tb * (1 + ngr))
            continue;
        kept[t] = false;
        /* clone the chain into each reader's group, producers first */
        pass_fuse_sort_ints(c.chain.v, c.chain.n);
        for (int a = 0; a < nr; a++) {
            int r = readers[a], H = g->ops.v[r].group;
            for (int k = 0; k < c.chain.n; k++) {
                int src = c.chain.v[k];
                unsigned hh = ((unsigned)src * 2654435761u ^ (unsigned)H * 40503u) & (unsigned)(hcap - 1);
                while (hkey_op[hh] >= 0 && !(hkey_op[hh] == src && hkey_g[hh] == H))
                    hh = (hh + 1) & (unsigned)(hcap - 1);
                if (hkey_op[hh] >= 0)
                    continue; /* already cloned into H */
                Op so = g->ops.v[src];
                int in[3];
                for (int j = 0; j < so.nin; j++) {
                    in[j] = so.in[j];
                    int pp = g->t.v[in[j]].op;
                    if (pp < 0)
                        continue;
                    unsigned h2 = ((unsigned)pp * 2654435761u ^ (unsigned)H * 40503u) & (unsigned)(hcap - 1);
                    while (hkey_op[h2] >= 0 && !(hkey_op[h2] == pp && hkey_g[h2] == H))
                        h2 = (h2 + 1) & (unsigned)(hcap - 1);
                    if (hkey_op[h2] >= 0)
                        in[j] = g->ops.v[hval[h2]].out;
                }
                ir_op_x(g, so.code, in, so.nin, &so.attr, so.loc);
                Op *cl = &g->ops.v[g->ops.n - 1];
                cl->flags = so.flags;
                cl->group = H;
                if (hkey_op[hh] < 0 && (int)(g->ops.n) * 4 > hcap * 3)
                    die("fuse: recompute table full");
                hkey_op[hh] = src;
                hkey_g[hh] = H;
                hval[hh] = g->ops.n - 1;
                vec_push(&before, r);
            }
            /* the reader reads the clone of t */
            unsigned ht = ((unsigned)p * 2654435761u ^ (unsigned)H * 40503u) & (unsigned)(hcap - 1);
            while (!(hkey_op[ht] == p && hkey_g[ht] == H))
                ht = (ht + 1) & (unsigned)(hcap - 1);
            Op *ro = &g->ops.v[r];
            for (int j = 0; j < ro->nin; j++)
                if (ro->in[j] == t)
                    ro->in[j] = g->ops.v[hval[ht]].out;
        }
    }
    if (before.n) {
        /* each clone goes before the reader it was made for, but after its
         * own operands: a topological order by that preference */
        int n = g->ops.n;
        double *key = xmalloc(sizeof(double) * (size_t)(n + 1));
        for (int i = 0; i < n0; i++)
            key[i] = i;
        for (int q = 0; q < before.n; q++)
            key[n0 + q] = before.v[q] - 0.5 + 1e-6 * q / (before.n + 1.0);
        int *byk = xmalloc(sizeof(int) * (size_t)(n + 1));
        for (int i = 0; i < n; i++)
            byk[i] = i;
        qsort_r(byk, (size_t)n, sizeof(int), cmp_key, key);
        bool *done = xcalloc((size_t)n + 1, sizeof(bool));
        int *stack = xmalloc(sizeof(int) * (size_t)(2 * n + 2));
        int *order = xmalloc(sizeof(int) * (size_t)(n + 1));
        int k = 0;
        for (int q = 0; q < n; q++) {
            int sp = 0;
            stack[sp++] = byk[q];
            while (sp) {
                int i = stack[sp - 1];
                if (done[i]) {
                    sp--;
                    continue;
                }
                bool ready = true;
                for (int j = 0; j < g->ops.v[i].nin && ready; j++) {
                    int pp = g->t.v[g->ops.v[i].in[j]].op;
                    if (pp >= 0 && !done[pp]) {
                        stack[sp++] = pp;
                        ready = false;
                    }
                }
                if (!ready)
                    continue;
                sp--;
                done[i] = true;
                order[k++] = i;
            }
        }
        ir_reorder_ops(g, order, k);
        free(order);
        free(stack);
        free(done);
        free(byk);
        free(key);
    }
    vec_free(&before);
    vec_free(&rd);
    free(readers);
    pass_fuse_uses_free(&u);
    free(c.seen);
    vec_free(&c.chain);
    vec_free(&c.leaves);
    free(hkey_op);
    free(hkey_g);
    free(hval);
    free(pinned);
    free(kept);
    free(mat);
    ir_compact(g);
}
