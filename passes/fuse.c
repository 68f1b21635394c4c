/* fuse.c - the fuse pass: group ops into kernels (Op.group, printed as
 * !group=N). The entry point and the grouping; the other steps live in the
 * files fuse_internal.h lists.
 *
 * A group is a set of ops that codegen emits as one kernel: one or more loop
 * nests over a domain (FuseDomain): a full shape S split at axis k into an
 * outer part and an inner part.
 *   ELEM  elementwise ops, broadcasts, iota, random over S;
 *   ROW   reductions over the trailing axes k.. of S plus the elementwise
 *         work before and after them, at full shape S or at the row shape
 *         (S with axes k.. set to 1): softmax, log-softmax, LayerNorm,
 *         RMSNorm, cross-entropy and their backward passes;
 *   COL   reductions over the leading axes ..k-1 of S (bias and LayerNorm
 *         weight gradients) with an elementwise prologue that is not needed
 *         anywhere else, and per-column work after them.
 * A matmul may head a group: its elementwise consumers are the GEMM's
 * epilogue (a kernel run right after the GEMM on the CPU). The AdamW update
 * of every parameter (and the squared-gradient sums of global-norm
 * clipping) become one multi-tensor group each: several loop nests, one
 * kernel.
 *
 * The steps, in order (pass_fuse):
 *   1. cheap clones (fuse_recompute.c): const, iota and broadcast ops read
 *      by several fusable ops are cloned, one per consumer, so each is
 *      recomputed inside its consumer's kernel instead of written to memory
 *      (they cost no arithmetic). Reductions and GEMMs are never duplicated.
 *   2. grouping (here): in program order, each fusable op starts a group and
 *      merges its producers' groups while the union is one domain, every
 *      member fits it and the union stays convex;
 *   3. column groups (fuse_col.c): split, then pull prologues in;
 *   4. sibling merges (here): groups that read the same tensor over the
 *      same domain become one multi-output kernel;
 *   5. multi-tensor merge (fuse_multi.c) of the optimizer's groups;
 *   6. the lowerability check (fuse_lower.c, shared with codegen): a group
 *      that would not lower to one kernel is dropped;
 *   7. dense group ids; then cheap recompute (fuse_recompute.c) of
 *      elementwise chains inside the groups that read them.
 *
 * A tensor is materialised (written to memory) exactly when something
 * outside its group reads it, or it is a graph output or update value
 * (pass_fuse_materialised). Groups are convex: no path leaves a group and
 * comes back, so each group can run as one kernel at one point of the
 * schedule (pass_schedule keeps the members of a group together).
 */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

Uses pass_fuse_uses_build(const Graph *g)
{
    Uses u;
    int nt = g->t.n;
    u.off = xcalloc((size_t)nt + 2, sizeof(int));
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            u.off[g->ops.v[i].in[j] + 1]++;
    for (int t = 0; t < nt; t++)
        u.off[t + 1] += u.off[t];
    u.cons = xmalloc(sizeof(int) * (size_t)(u.off[nt] + 1));
    int *fill = xcalloc((size_t)nt + 1, sizeof(int));
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++) {
            int t = g->ops.v[i].in[j];
            bool dup = false;
            for (int q = 0; q < j; q++)
                dup |= g->ops.v[i].in[q] == t;
            if (!dup)
                u.cons[u.off[t] + fill[t]++] = i;
        }
    /* duplicates left holes at the end of each range: shrink via a count */
    for (int t = 0; t < nt; t++)
        for (int q = u.off[t] + fill[t]; q < u.off[t + 1]; q++)
            u.cons[q] = -1;
    free(fill);
    return u;
}

void pass_fuse_uses_free(Uses *u)
{
    free(u->off);
    free(u->cons);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* Groups grow by appending another group's (sorted) members: two sorted
 * runs are merged in O(n); anything else is sorted in full. */
void pass_fuse_sort_ints(int *v, int n)
{
    int k = 1;
    while (k < n && v[k - 1] <= v[k])
        k++;
    if (k >= n)
        return;
    int e = k + 1;
    while (e < n && v[e - 1] <= v[e])
        e++;
    if (e < n) {
        qsort(v, (size_t)n, sizeof(int), cmp_int);
        return;
    }
    int *a = xmalloc(sizeof(int) * (size_t)k);
    memcpy(a, v, sizeof(int) * (size_t)k);
    int i = 0, j = k, w = 0;
    while (i < k && j < n)
        v[w++] = a[i] <= v[j] ? a[i++] : v[j++];
    while (i < k)
        v[w++] = a[i++];
    free(a);
}

void pass_fuse_sort_members(Fuser *f, int G)
{
    FGroup *gr = &f->gr.v[G];
    pass_fuse_sort_ints(gr->ops.v, gr->ops.n);
}

/* ---- the topological order of the contracted graph ----
 * Node ids: an ungrouped op is node op, group G is node nops + G. */
static int node_of(const Fuser *f, int q)
{
    return f->gof[q] >= 0 ? f->g->ops.n + f->gof[q] : q;
}

static int *ord_at(Fuser *f, int v)
{
    int n = f->g->ops.n;
    return v >= n ? &f->ord_gr[v - n] : &f->ord_op[v];
}

static int *vis_at(Fuser *f, int v)
{
    int n = f->g->ops.n;
    return v >= n ? &f->vis_gr[v - n] : &f->vis_op[v];
}

/* The ops of node v: *n of them from the returned array. */
static const int *node_ops(const Fuser *f, const int *v, int *n)
{
    int nops = f->g->ops.n;
    if (*v >= nops) {
        *n = f->gr.v[*v - nops].ops.n;
        return f->gr.v[*v - nops].ops.v;
    }
    *n = 1;
    return v;
}

void pass_fuse_order_free(Fuser *f)
{
    free(f->ord_gr);
    free(f->ord_op);
    f->ord_gr = f->ord_op = NULL;
    vec_free(&f->fwd);
    vec_free(&f->bwd);
}

void pass_fuse_order_build(Fuser *f)
{
    const Graph *g = f->g;
    int n = g->ops.n, nn = n + f->gr.n;
    f->ord_op = xcalloc((size_t)n + 1, sizeof(int));
    f->ord_gr = xcalloc((size_t)f->gr.n + 1, sizeof(int));
    int *indeg = xcalloc((size_t)nn + 1, sizeof(int));
    for (int q = 0; q < n; q++) {
        int t = g->ops.v[q].out, u = node_of(f, q);
        for (int k = f->uoff[t]; k < f->uoff[t + 1]; k++)
            if (f->ucons[k] >= 0 && node_of(f, f->ucons[k]) != u)
                indeg[node_of(f, f->ucons[k])]++;
    }
    /* Kahn's algorithm over the live nodes */
    VEC(int) ready = {0};
    int live = 0, next = 0;
    for (int v = 0; v < nn; v++) {
        bool ok = v < n ? f->gof[v] < 0 : !f->gr.v[v - n].dead && f->gr.v[v - n].ops.n > 0;
        if (!ok)
            continue;
        live++;
        if (!indeg[v])
            vec_push(&ready, v);
    }
    while (ready.n) {
        int u = ready.v[--ready.n], m;
        *ord_at(f, u) = next++;
        const int *ops = node_ops(f, &u, &m);
        for (int i = 0; i < m; i++) {
            int t = g->ops.v[ops[i]].out;
            for (int k = f->uoff[t]; k < f->uoff[t + 1]; k++) {
                int c = f->ucons[k];
                if (c < 0 || node_of(f, c) == u)
                    continue;
                if (--indeg[node_of(f, c)] == 0)
                    vec_push(&ready, node_of(f, c));
            }
        }
    }
    vec_free(&ready);
    free(indeg);
    if (next != live) /* a cycle: no order, no pruning */
        pass_fuse_order_free(f);
}

typedef struct {
    int ord, node;
} OrdNode;

static int cmp_ordnode(const void *a, const void *b)
{
    int x = ((const OrdNode *)a)->ord, y = ((const OrdNode *)b)->ord;
    return x < y ? -1 : x > y;
}

/* Pearce-Kelly: A and B become one node. With lo ordered before hi, the
 * nodes before hi that reach hi (bwd, bounded by lo's position) and the
 * nodes after lo that lo reaches (fwd, bounded by hi's position) are
 * disjoint (the union is convex). When bwd is hi alone, no predecessor of
 * hi lies between them and the merged node takes lo's position; when fwd
 * is lo alone, hi's; both without a move (and the optimizer's merges with
 * a weight gradient's GEMM, whose fwd is all of backward, need no fwd
 * search). Otherwise their positions are reassigned bwd first, then fwd,
 * and the merged node takes hi's new position: all its predecessors come
 * before it, all its successors after it. */
/* The nodes after lb that lo reaches, bounded by ub (into f->fwd, marked
 * sf), and the nodes before ub that reach hi, bounded by lb (f->bwd, sb);
 * a node in both is a path lo -> v -> hi (not convex). */
static void order_fwd(Fuser *f, int lo, int hi, int ub, int sf, int sb)
{
    const Graph *g = f->g;
    f->fwd.n = f->stack.n = 0;
    vec_push(&f->stack, lo);
    *vis_at(f, lo) = sf;
    while (f->stack.n) {
        int u = f->stack.v[--f->stack.n], m;
        vec_push(&f->fwd, u);
        const int *ops = node_ops(f, &u, &m);
        for (int i = 0; i < m; i++) {
            int t = g->ops.v[ops[i]].out;
            for (int k = f->uoff[t]; k < f->uoff[t + 1]; k++) {
                int c = f->ucons[k];
                if (c < 0)
                    continue;
                int v = node_of(f, c);
                if (v == u || v == hi || *vis_at(f, v) == sf || *ord_at(f, v) > ub)
                    continue;
                if (*vis_at(f, v) == sb)
                    die("fuse: merging groups that are not convex");
                *vis_at(f, v) = sf;
                vec_push(&f->stack, v);
            }
        }
    }
}

static void order_bwd(Fuser *f, int lo, int hi, int lb, int sf, int sb)
{
    const Graph *g = f->g;
    f->bwd.n = f->stack.n = 0;
    vec_push(&f->stack, hi);
    *vis_at(f, hi) = sb;
    while (f->stack.n) {
        int u = f->stack.v[--f->stack.n], m;
        vec_push(&f->bwd, u);
        const int *ops = node_ops(f, &u, &m);
        for (int i = 0; i < m; i++) {
            const Op *op = &g->ops.v[ops[i]];
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p < 0)
                    continue;
                int v = node_of(f, p);
                if (v == u || v == lo || *vis_at(f, v) == sb || *ord_at(f, v) < lb)
                    continue;
                if (*vis_at(f, v) == sf)
                    die("fuse: merging groups that are not convex");
                *vis_at(f, v) = sb;
                vec_push(&f->stack, v);
            }
        }
    }
}

void pass_fuse_order_merge(Fuser *f, int A, int B)
{
    int n = f->g->ops.n;
    int lo = n + A, hi = n + B;
    if (f->ord_gr[A] > f->ord_gr[B])
        lo = n + B, hi = n + A;
    int lb = *ord_at(f, lo), ub = *ord_at(f, hi);
    int sb = ++f->stamp, sf = ++f->stamp;
    /* the search from the smaller group first: the other is not needed
     * when it finds its start alone */
    bool bwd_first = f->gr.v[hi - n].ops.n <= f->gr.v[lo - n].ops.n;
    f->fwd.n = f->bwd.n = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (bwd_first == (pass == 0)) {
            order_bwd(f, lo, hi, lb, sf, sb);
            if (f->bwd.n == 1) {
                f->ord_gr[A] = f->ord_gr[B] = lb;
                return;
            }
        } else {
            order_fwd(f, lo, hi, ub, sf, sb);
            if (f->fwd.n == 1) {
                f->ord_gr[A] = f->ord_gr[B] = ub;
                return;
            }
        }
    }
    int nf = f->fwd.n, nb = f->bwd.n;
    OrdNode *w = xmalloc(sizeof(OrdNode) * (size_t)(nf + nb));
    int *pos = xmalloc(sizeof(int) * (size_t)(nf + nb));
    for (int i = 0; i < nb; i++)
        w[i] = (OrdNode){*ord_at(f, f->bwd.v[i]), f->bwd.v[i]};
    for (int i = 0; i < nf; i++)
        w[nb + i] = (OrdNode){*ord_at(f, f->fwd.v[i]), f->fwd.v[i]};
    qsort(w, (size_t)nb, sizeof(OrdNode), cmp_ordnode);
    qsort(w + nb, (size_t)nf, sizeof(OrdNode), cmp_ordnode);
    for (int i = 0; i < nf + nb; i++)
        pos[i] = w[i].ord;
    pass_fuse_sort_ints(pos, nf + nb);
    for (int i = 0; i < nf + nb; i++)
        *ord_at(f, w[i].node) = pos[i];
    /* hi is the last of bwd (the largest position there) */
    int merged = *ord_at(f, hi);
    f->ord_gr[A] = f->ord_gr[B] = merged;
    free(w);
    free(pos);
}

/* Heap of nodes in f->stack keyed by sign * position: sign 1 pops the node
 * ordered first, sign -1 the node ordered last. */
static int hkey(Fuser *f, int v, int sign) { return sign * *ord_at(f, v); }

/* Sifts h[i] up / takes h[0] out of the heap h[0..*n). */
static void heap_up(Fuser *f, int *h, int i, int sign)
{
    int v = h[i], key = hkey(f, v, sign);
    while (i > 0 && hkey(f, h[(i - 1) / 2], sign) > key) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static int heap_take(Fuser *f, int *h, int *np, int sign)
{
    int top = h[0], v = h[--*np], n = *np, i = 0;
    int key = hkey(f, v, sign);
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hkey(f, h[c + 1], sign) < hkey(f, h[c], sign))
            c++;
        if (hkey(f, h[c], sign) >= key)
            break;
        h[i] = h[c];
        i = c;
    }
    if (n)
        h[i] = v;
    return top;
}

static void heap_push(Fuser *f, int v, int sign)
{
    vec_push(&f->stack, v);
    heap_up(f, f->stack.v, f->stack.n - 1, sign);
}

static int heap_pop(Fuser *f, int sign) { return heap_take(f, f->stack.v, &f->stack.n, sign); }

/* With the order: whether a path leaves group Y through a node outside X
 * and Y and comes to X (Y ordered before X). Two searches take turns: one
 * forward from Y's readers over the nodes ordered before X, the one
 * ordered last first (in f->stack), one backward from X's operands over
 * the nodes ordered after Y, the one ordered first first (in f->bwd). A
 * node both reach, or the other group, is a path; a search that runs out
 * proves there is none. Each side costs at most twice the cheaper one:
 * a weight gradient's GEMM reaches an optimizer op through the clip scale
 * in a few steps forward, while the backward search from the clip scale
 * would walk most of backward. */
static bool path_between(Fuser *f, int Y, int X)
{
    const Graph *g = f->g;
    int n = g->ops.n, x = n + X, y = n + Y, lo = f->ord_gr[Y], hi = f->ord_gr[X];
    int sf = ++f->stamp, sb = ++f->stamp;
    f->stack.n = f->bwd.n = 0;
    /* a side much larger than the other is not searched from (seeding it
     * would cost its size: the multi-tensor group against one update) */
    int ny = f->gr.v[Y].ops.n, nx = f->gr.v[X].ops.n;
    bool use_f = ny <= 8 * nx + 64, use_b = nx <= 8 * ny + 64;
    /* seeds: the outside readers of Y, the outside producers of X's operands */
    for (int i = 0; i < (use_f ? ny : 0); i++) {
        int t = g->ops.v[f->gr.v[Y].ops.v[i]].out;
        for (int k = f->uoff[t]; k < f->uoff[t + 1]; k++) {
            int c = f->ucons[k];
            if (c < 0)
                continue;
            int v = node_of(f, c);
            if (v == x || v == y || *ord_at(f, v) > hi || *vis_at(f, v) == sf)
                continue;
            *vis_at(f, v) = sf;
            heap_push(f, v, -1);
        }
    }
    for (int i = 0; i < (use_b ? nx : 0); i++) {
        const Op *op = &g->ops.v[f->gr.v[X].ops.v[i]];
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            if (p < 0)
                continue;
            int v = node_of(f, p);
            if (v == x || v == y || *ord_at(f, v) < lo || *vis_at(f, v) == sb)
                continue;
            if (*vis_at(f, v) == sf)
                return true;
            *vis_at(f, v) = sb;
            vec_push(&f->bwd, v);
            heap_up(f, f->bwd.v, f->bwd.n - 1, 1);
        }
    }
    while ((!use_f || f->stack.n) && (!use_b || f->bwd.n)) {
        int u, m;
        const int *ops;
        if (!use_f)
            goto backward;
        u = heap_pop(f, -1);
        ops = node_ops(f, &u, &m);
        for (int i = 0; i < m; i++) {
            int t = g->ops.v[ops[i]].out;
            for (int k = f->uoff[t]; k < f->uoff[t + 1]; k++) {
                int c = f->ucons[k];
                if (c < 0)
                    continue;
                int v = node_of(f, c);
                if (v == x || *vis_at(f, v) == sb)
                    return true;
                if (v == u || *ord_at(f, v) > hi || *vis_at(f, v) == sf)
                    continue;
                *vis_at(f, v) = sf;
                heap_push(f, v, -1);
            }
        }
        if (!use_b)
            continue;
    backward:
        u = heap_take(f, f->bwd.v, &f->bwd.n, 1);
        ops = node_ops(f, &u, &m);
        for (int i = 0; i < m; i++) {
            const Op *op = &g->ops.v[ops[i]];
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p < 0)
                    continue;
                int v = node_of(f, p);
                if (v == y || *vis_at(f, v) == sf)
                    return true;
                if (v == u || *ord_at(f, v) < lo || *vis_at(f, v) == sb)
                    continue;
                *vis_at(f, v) = sb;
                vec_push(&f->bwd, v);
                heap_up(f, f->bwd.v, f->bwd.n - 1, 1);
            }
        }
    }
    return false;
}

/* reaches() with the order of the contracted graph: only nodes ordered
 * after T can depend on it, and the search takes the node ordered first
 * next, so that it walks straight down towards T. */
static bool reaches_ordered(Fuser *f, int p, int T)
{
    const Graph *g = f->g;
    int target = g->ops.n + T, lo = f->ord_gr[T];
    f->stack.n = 0;
    int v0 = node_of(f, p);
    if (v0 == target)
        return true;
    if (*ord_at(f, v0) < lo || *vis_at(f, v0) == f->stamp)
        return false;
    *vis_at(f, v0) = f->stamp;
    heap_push(f, v0, 1);
    while (f->stack.n) {
        int u = heap_pop(f, 1), m;
        const int *ops = node_ops(f, &u, &m);
        for (int i = 0; i < m; i++) {
            const Op *op = &g->ops.v[ops[i]];
            for (int j = 0; j < op->nin; j++) {
                int pp = g->t.v[op->in[j]].op;
                if (pp < 0)
                    continue;
                int v = node_of(f, pp);
                if (v == target)
                    return true;
                if (*ord_at(f, v) < lo || *vis_at(f, v) == f->stamp)
                    continue;
                *vis_at(f, v) = f->stamp;
                heap_push(f, v, 1);
            }
        }
    }
    return false;
}

/* True when op p depends on group T (through any path, where a path may
 * enter a group at one member and leave it from another: groups run as one
 * kernel). Visited marks persist within one stamp. */
static bool reaches(Fuser *f, int p, int T)
{
    Graph *g = f->g;
    if (f->ord_gr)
        return reaches_ordered(f, p, T);
    f->stack.n = 0;
    vec_push(&f->stack, p);
    while (f->stack.n) {
        int q = f->stack.v[--f->stack.n];
        if (f->vis_op[q] == f->stamp)
            continue;
        f->vis_op[q] = f->stamp;
        int G = f->gof[q];
        if (G == T)
            return true;
        if (G >= 0 && f->vis_gr[G] != f->stamp) {
            f->vis_gr[G] = f->stamp;
            for (int i = 0; i < f->gr.v[G].ops.n; i++)
                vec_push(&f->stack, f->gr.v[G].ops.v[i]);
        }
        const Op *op = &g->ops.v[q];
        for (int j = 0; j < op->nin; j++) {
            int pp = g->t.v[op->in[j]].op;
            if (pp >= 0 && f->vis_op[pp] != f->stamp)
                vec_push(&f->stack, pp);
        }
    }
    return false;
}

/* Whether anything outside groups Y and X reads a result of Y: an op
 * already visited, or one in a group. Ops not visited yet are in no group
 * and come later in program order, so they lie on no path into X. */
static bool has_dependents(Fuser *f, int Y, int X)
{
    const Graph *g = f->g;
    const FGroup *gy = &f->gr.v[Y];
    for (int i = 0; i < gy->ops.n; i++) {
        int t = g->ops.v[gy->ops.v[i]].out;
        for (int q = f->uoff[t]; q < f->uoff[t + 1]; q++) {
            int c = f->ucons[q];
            if (c < 0 || f->gof[c] == X || f->gof[c] == Y)
                continue;
            if (c < f->upto || f->gof[c] >= 0)
                return true;
        }
    }
    return false;
}

bool pass_fuse_convex_union(Fuser *f, int A, int B)
{
    Graph *g = f->g;
    for (int side = 0; side < 2; side++) {
        int X = side ? B : A, Y = side ? A : B;
        if (f->ord_gr) {
            /* a path Y -> X needs Y ordered before X */
            if (f->ord_gr[Y] < f->ord_gr[X] && path_between(f, Y, X))
                return false;
            continue;
        }
        /* a path from Y to X leaves Y through a reader of Y's results */
        if (!has_dependents(f, Y, X))
            continue;
        f->stamp++;
        FGroup *gx = &f->gr.v[X];
        for (int i = 0; i < gx->ops.n; i++) {
            const Op *op = &g->ops.v[gx->ops.v[i]];
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p < 0 || f->gof[p] == X || f->gof[p] == Y)
                    continue;
                if (reaches(f, p, Y))
                    return false;
            }
        }
    }
    return true;
}

/* COL groups: a reduction's input must not depend on another reduction of
 * the group (the kernel walks all rows once). */
bool pass_fuse_col_ok(Fuser *f, const int *ops, int n)
{
    Graph *g = f->g;
    for (int i = 0; i < n; i++) {
        const Op *r = &g->ops.v[ops[i]];
        if (!pass_fuse_is_reduce(r))
            continue;
        f->stamp++;
        f->stack.n = 0;
        vec_push(&f->stack, r->in[0]);
        while (f->stack.n) {
            int t = f->stack.v[--f->stack.n];
            if (!pass_fuse_in_set(g, &f->mk, t))
                continue;
            int p = g->t.v[t].op;
            if (f->vis_op[p] == f->stamp)
                continue;
            f->vis_op[p] = f->stamp;
            if (pass_fuse_is_reduce(&g->ops.v[p]))
                return false;
            for (int j = 0; j < g->ops.v[p].nin; j++)
                vec_push(&f->stack, g->ops.v[p].in[j]);
        }
    }
    return true;
}

bool pass_fuse_union_ok(Fuser *f, int A, int B, FuseDomain *dout)
{
    FGroup *a = &f->gr.v[A], *b = &f->gr.v[B];
    int n = a->ops.n + b->ops.n;
    int *ops = xmalloc(sizeof(int) * (size_t)n);
    memcpy(ops, a->ops.v, sizeof(int) * (size_t)a->ops.n);
    memcpy(ops + a->ops.n, b->ops.v, sizeof(int) * (size_t)b->ops.n);
    f->mk.stamp++;
    for (int i = 0; i < n; i++)
        f->mk.mark[ops[i]] = f->mk.stamp;
    FuseDomain d;
    bool ok = pass_fuse_domain_of(f->g, ops, n, &f->mk, &d, f->err, sizeof f->err) &&
              pass_fuse_check_members(f->g, ops, n, &f->mk, &d, f->err, sizeof f->err);
    if (ok && d.kind == FUSE_COL)
        ok = pass_fuse_col_ok(f, ops, n);
    free(ops);
    if (ok && dout)
        *dout = d;
    return ok;
}

void pass_fuse_do_union(Fuser *f, int A, int B)
{
    FGroup *b = &f->gr.v[B];
    for (int i = 0; i < b->ops.n; i++) {
        vec_push(&f->gr.v[A].ops, b->ops.v[i]);
        f->gof[b->ops.v[i]] = A;
    }
    b = &f->gr.v[B];
    vec_free(&b->ops);
    b->dead = true;
    f->gr.v[A].multi |= b->multi;
}

/* True when one group holds a forward op (other than const, iota and
 * broadcast, which cost nothing and are cloned per consumer) and the other
 * a recomputation (OPF_RECOMPUTE, made by remat): one kernel would run both
 * at one point and undo the recomputation (remat.c). */
static bool remat_clash(Fuser *f, int A, int B)
{
    bool fwd[2] = {false, false}, rec[2] = {false, false};
    for (int s = 0; s < 2; s++) {
        FGroup *x = &f->gr.v[s ? B : A];
        for (int i = 0; i < x->ops.n; i++) {
            const Op *op = &f->g->ops.v[x->ops.v[i]];
            unsigned fl = op->flags;
            rec[s] |= (fl & OPF_RECOMPUTE) != 0;
            fwd[s] |= !(fl & (OPF_RECOMPUTE | OPF_BACKWARD | OPF_OPTIM)) &&
                      op->code != OP_CONST && op->code != OP_IOTA && op->code != OP_BROADCAST;
        }
    }
    return (fwd[0] && rec[1]) || (rec[0] && fwd[1]);
}

bool pass_fuse_try_merge(Fuser *f, int A, int B)
{
    if (A == B || f->gr.v[A].dead || f->gr.v[B].dead || f->gr.v[A].multi || f->gr.v[B].multi)
        return false;
    if (remat_clash(f, A, B))
        return false;
    if (!pass_fuse_union_ok(f, A, B, NULL) || !pass_fuse_convex_union(f, A, B))
        return false;
    if (f->ord_gr)
        pass_fuse_order_merge(f, A, B);
    pass_fuse_do_union(f, A, B);
    return true;
}

int pass_fuse_new_group(Fuser *f, int op)
{
    FGroup gr = {0};
    vec_push(&gr.ops, op);
    vec_push(&f->gr, gr);
    f->gof[op] = f->gr.n - 1;
    if (f->ord_gr) /* the op's node becomes the group's */
        f->ord_gr[f->gr.n - 1] = f->ord_op[op];
    return f->gr.n - 1;
}

bool pass_fuse_group_domain(Fuser *f, int G, FuseDomain *d)
{
    const FGroup *gr = &f->gr.v[G];
    f->mk.stamp++;
    for (int i = 0; i < gr->ops.n; i++)
        f->mk.mark[gr->ops.v[i]] = f->mk.stamp;
    return pass_fuse_domain_of(f->g, gr->ops.v, gr->ops.n, &f->mk, d, f->err, sizeof f->err);
}

/* Materialised set of the current grouping (gof), by tensor. */
bool *pass_fuse_cur_materialised(Fuser *f)
{
    Graph *g = f->g;
    for (int i = 0; i < g->ops.n; i++)
        g->ops.v[i].group = f->gof[i];
    return pass_fuse_materialised(g);
}

/* The reader groups of one tensor in topological order, H[0..m), with
 * which of them each depends on: anc[i] has bit j when H[i] depends on
 * H[j] (a path H[j] -> H[i], direct or not), desc[j] has bit i then. When
 * some H[z] lies on a path H[x] -> H[z] -> H[y], that path runs through a
 * group other than H[x] and H[y], so their union is not convex
 * (pass_fuse_convex_union would say no). pos[G]: G's index in H, -1 for
 * other groups (reset by chain_clear). Built by one pass over the nodes
 * ordered between H[0] and H[m-1], with bit sets of m bits per node. */
typedef struct {
    VEC(int) H;
    int *pos, *inv;         /* inv[position] = node, -1 */
    int ninv, W;            /* W: 64-bit words per set */
    uint64_t *nanc, *anc, *desc, *self; /* per node; per reader (m x W each);
                                         * self: the readers merged into it */
    size_t cap_nanc, cap_hd;
    bool valid;
} Chain;

static int cmp_ord(const void *a, const void *b, void *ctx)
{
    const int *ord = ctx;
    int x = ord[*(const int *)a], y = ord[*(const int *)b];
    return x < y ? -1 : x > y;
}

static void chain_clear(Chain *c)
{
    for (int i = 0; i < c->H.n; i++)
        c->pos[c->H.v[i]] = -1;
    c->H.n = 0;
    c->valid = false;
}

static void *grow(void *p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return p;
    free(p);
    *cap = need;
    return xmalloc(need);
}

static void chain_build(Fuser *f, Chain *c, const Uses *u, int t)
{
    const Graph *g = f->g;
    int n = g->ops.n, nn = n + f->gr.n;
    chain_clear(c);
    for (int a = u->off[t]; a < u->off[t + 1]; a++) {
        int ca = u->cons[a];
        if (ca < 0 || f->gof[ca] < 0 || c->pos[f->gof[ca]] >= 0)
            continue;
        c->pos[f->gof[ca]] = 0;
        vec_push(&c->H, f->gof[ca]);
    }
    int m = c->H.n, W = (m + 63) / 64;
    c->W = W;
    c->valid = true;
    if (m == 0)
        return;
    qsort_r(c->H.v, (size_t)m, sizeof(int), cmp_ord, f->ord_gr);
    for (int i = 0; i < m; i++)
        c->pos[c->H.v[i]] = i;
    /* nodes by position */
    if (c->ninv < nn) {
        free(c->inv);
        c->inv = xmalloc(sizeof(int) * (size_t)nn);
        c->ninv = nn;
    }
    for (int v = 0; v < nn; v++)
        c->inv[v] = -1;
    for (int v = 0; v < nn; v++) {
        bool live = v < n ? f->gof[v] < 0 : !f->gr.v[v - n].dead && f->gr.v[v - n].ops.n > 0;
        if (live)
            c->inv[*ord_at(f, v)] = v;
    }
    c->nanc = grow(c->nanc, &c->cap_nanc, sizeof(uint64_t) * (size_t)nn * (size_t)W);
    c->anc = grow(c->anc, &c->cap_hd, sizeof(uint64_t) * (size_t)m * (size_t)W * 3);
    c->desc = c->anc + (size_t)m * (size_t)W;
    c->self = c->desc + (size_t)m * (size_t)W;
    int lo = f->ord_gr[c->H.v[0]], hi = f->ord_gr[c->H.v[m - 1]];
    for (int o = lo; o <= hi; o++) {
        int v = c->inv[o], k;
        if (v < 0)
            continue;
        uint64_t *av = c->nanc + (size_t)v * (size_t)W;
        memset(av, 0, sizeof(uint64_t) * (size_t)W);
        const int *ops = node_ops(f, &v, &k);
        for (int i = 0; i < k; i++) {
            const Op *op = &g->ops.v[ops[i]];
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p < 0)
                    continue;
                int w = node_of(f, p);
                if (w == v || *ord_at(f, w) < lo)
                    continue;
                const uint64_t *aw = c->nanc + (size_t)w * (size_t)W;
                for (int q = 0; q < W; q++)
                    av[q] |= aw[q];
                if (w >= n && c->pos[w - n] >= 0)
                    av[c->pos[w - n] / 64] |= 1ull << (c->pos[w - n] % 64);
            }
        }
    }
    memset(c->anc, 0, sizeof(uint64_t) * (size_t)m * (size_t)W * 3);
    for (int i = 0; i < m; i++) {
        c->self[(size_t)i * (size_t)W + (size_t)(i / 64)] |= 1ull << (i % 64);
        const uint64_t *av = c->nanc + (size_t)(n + c->H.v[i]) * (size_t)W;
        memcpy(c->anc + (size_t)i * (size_t)W, av, sizeof(uint64_t) * (size_t)W);
        for (int j = 0; j < m; j++)
            if (av[j / 64] >> (j % 64) & 1)
                c->desc[(size_t)j * (size_t)W + (size_t)(i / 64)] |= 1ull << (i % 64);
    }
}

static bool rows_meet(const Chain *c, int x, int y)
{
    const uint64_t *ay = c->anc + (size_t)y * (size_t)c->W,
                   *dx = c->desc + (size_t)x * (size_t)c->W;
    for (int q = 0; q < c->W; q++)
        if (ay[q] & dx[q])
            return true;
    return false;
}

/* True when the chain proves the union of A and B not convex: some
 * reader lies on a path between them. */
static bool chain_blocks(const Chain *c, int A, int B)
{
    int x = c->pos[A], y = c->pos[B];
    if (x < 0 || y < 0)
        return false;
    return rows_meet(c, x, y) || rows_meet(c, y, x);
}

/* After B merged into A: A's sets become the union of both without the
 * readers now inside A; everything else stays true (paths survive merges,
 * and a path through A or B now runs through the merged group, outside
 * any other pair). B leaves the chain. */
static void chain_merged(Chain *c, int A, int B)
{
    int a = c->pos[A], b = c->pos[B];
    if (a < 0 || b < 0) {
        if (a >= 0)
            c->pos[A] = -1; /* no sets for the union: checked in full */
        return;
    }
    uint64_t *sa = c->self + (size_t)a * (size_t)c->W, *sb = c->self + (size_t)b * (size_t)c->W;
    for (int q = 0; q < c->W; q++)
        sa[q] |= sb[q];
    uint64_t *r[2] = {c->anc, c->desc};
    for (int s = 0; s < 2; s++) {
        uint64_t *ra = r[s] + (size_t)a * (size_t)c->W, *rb = r[s] + (size_t)b * (size_t)c->W;
        for (int q = 0; q < c->W; q++)
            ra[q] = (ra[q] | rb[q]) & ~sa[q];
    }
    c->pos[B] = -1;
}

/* The domain of group G as pass_fuse_group_domain finds it, cached per
 * group until the group changes (dstate[G]: 0 unknown, 1 ok, 2 none). */
static bool sibling_domain(Fuser *f, FuseDomain *dom, char *dstate, int G, FuseDomain *d)
{
    if (!dstate[G])
        dstate[G] = pass_fuse_group_domain(f, G, &dom[G]) ? 1 : 2;
    *d = dom[G];
    return dstate[G] == 1;
}

/* Groups that read the same tensor and share a domain: one kernel reads
 * it once (multi-output). Every pair of readers is considered, in use
 * order; for a tensor with many readers (the rope tables, read by every
 * layer) the pairs that the Chain proves non-convex are skipped without a
 * search (the answer would be no). A try depends only on the grouping,
 * which changes only when a merge succeeds (epoch), so tries that would
 * repeat a failed one are skipped: a pair of groups already tried for the
 * same reader a, and a reader a whose group already had every later pair
 * tried without a merge (one group read n times is n tries, not n^2). */
static void merge_siblings(Fuser *f)
{
    Graph *g = f->g;
    Uses u = pass_fuse_uses_build(g);
    Chain ch = {.pos = xmalloc(sizeof(int) * (size_t)(f->gr.n + 1))};
    for (int G = 0; G < f->gr.n; G++)
        ch.pos[G] = -1;
    FuseDomain *dom = xmalloc(sizeof(FuseDomain) * (size_t)(f->gr.n + 1));
    char *dstate = xcalloc((size_t)f->gr.n + 1, 1);
    /* tried[B] == tok: (A, B) failed for this reader a in this epoch;
     * done[A] == epoch + 1: reader groups A had all their pairs fail */
    int *tried = xcalloc((size_t)f->gr.n + 1, sizeof(int));
    int *done = xcalloc((size_t)f->gr.n + 1, sizeof(int));
    int epoch = 0, tok = 0;
    for (int t = 0; t < g->t.n; t++) {
        int p = g->t.v[t].op;
        int pg = p >= 0 ? f->gof[p] : -1;
        if (shape_numel(&g->t.v[t].s) <= 1)
            continue; /* scalars (lr, clip scale) are read by every update */
        bool use_chain = f->ord_gr && u.off[t + 1] - u.off[t] >= 8;
        epoch++; /* done[] is per tensor: a later b range differs */
        for (int a = u.off[t]; a < u.off[t + 1]; a++) {
            int ca = u.cons[a];
            if (ca < 0 || f->gof[ca] < 0 || done[f->gof[ca]] == epoch)
                continue;
            int start = epoch;
            tok++;
            for (int b = a + 1; b < u.off[t + 1]; b++) {
                int cb = u.cons[b];
                if (cb < 0 || f->gof[cb] < 0)
                    continue;
                int A = f->gof[ca], B = f->gof[cb];
                if (A == B || A == pg || B == pg || tried[B] == tok)
                    continue;
                if (g->ops.v[ca].code == OP_MATMUL || g->ops.v[cb].code == OP_MATMUL)
                    continue;
                tried[B] = tok;
                if (use_chain && f->ord_gr) {
                    if (!ch.valid)
                        chain_build(f, &ch, &u, t);
                    if (chain_blocks(&ch, A, B))
                        continue;
                }
                /* the same kind of group only: COL with COL, etc. */
                FuseDomain da, db;
                if (!sibling_domain(f, dom, dstate, A, &da) ||
                    !sibling_domain(f, dom, dstate, B, &db))
                    continue;
                if (da.kind != db.kind || da.k != db.k || !shape_dims_eq(&da.S, &db.S))
                    continue;
                if (pass_fuse_try_merge(f, A, B)) {
                    pass_fuse_sort_members(f, A);
                    dstate[A] = 0;
                    epoch++;
                    tok++;
                    if (ch.valid)
                        chain_merged(&ch, A, B);
                }
            }
            /* a later reader of ca's group would try a subset of these
             * pairs against the same grouping */
            if (epoch == start && g->ops.v[ca].code != OP_MATMUL)
                done[f->gof[ca]] = epoch;
        }
        chain_clear(&ch);
    }
    free(dom);
    free(dstate);
    free(tried);
    free(done);
    vec_free(&ch.H);
    free(ch.pos);
    free(ch.inv);
    free(ch.nanc);
    free(ch.anc);
    pass_fuse_uses_free(&u);
}

void pass_fuse_fuser_init(Fuser *f, Graph *g)
{
    int n = g->ops.n;
    memset(f, 0, sizeof *f);
    f->g = g;
    Uses fu = pass_fuse_uses_build(g);
    f->uoff = fu.off;
    f->ucons = fu.cons;
    f->upto = n;
    f->gof = xmalloc(sizeof(int) * (size_t)(n + 1));
    f->vis_op = xcalloc((size_t)n + 1, sizeof(int));
    f->mk.mark = xcalloc((size_t)n + 1, sizeof(int));
    for (int i = 0; i < n; i++)
        f->gof[i] = -1;
    int grcap = 2 * n + 2; /* groups: one per op, plus splits */
    f->vis_gr = xcalloc((size_t)grcap, sizeof(int));
    /* program order is a topological order of the ops; each merge keeps
     * it one of the contracted graph, which bounds the convexity checks */
    f->ord_op = xmalloc(sizeof(int) * (size_t)(n + 1));
    f->ord_gr = xmalloc(sizeof(int) * (size_t)grcap);
    for (int i = 0; i < n; i++)
        f->ord_op[i] = i;
}

void pass_fuse_fuser_free(Fuser *f)
{
    for (int G = 0; G < f->gr.n; G++)
        vec_free(&f->gr.v[G].ops);
    vec_free(&f->gr);
    vec_free(&f->stack);
    free(f->gof);
    free(f->vis_op);
    free(f->vis_gr);
    free(f->mk.mark);
    Uses u = {(int *)f->uoff, (int *)f->ucons};
    pass_fuse_uses_free(&u);
    pass_fuse_order_free(f);
}

bool pass_fuse(Graph *g, const PassOpts *o, Diag *d)
{
    (void)d;
    for (int i = 0; i < g->ops.n; i++)
        g->ops.v[i].group = -1;
    if (o && o->no_fuse)
        return true;
    pass_fuse_clone_cheap(g, 0);
    pass_fuse_clone_cheap(g, 1);
    int n = g->ops.n;
    Fuser f;
    pass_fuse_fuser_init(&f, g);
    pass_fuse_grow(&f); /* step 2: at most one group per op */
    f.upto = n;
    pass_fuse_order_free(&f); /* split_col makes groups the order lacks */
    pass_fuse_split_col(&f);
    pass_fuse_pull_col(&f);
    if (g->ops.n != n)
        die("fuse: the op count changed during grouping");
    pass_fuse_order_build(&f);
    merge_siblings(&f);
    pass_fuse_merge_multi(&f);
    pass_fuse_order_free(&f);
    pass_fuse_drop_unlowerable(&f);

    /* dense ids in order of first member; a lone matmul is a plain GEMM */
    int *id = xmalloc(sizeof(int) * (size_t)(f.gr.n + 1));
    for (int G = 0; G < f.gr.n; G++)
        id[G] = -1;
    int next = 0;
    for (int i = 0; i < n; i++) {
        int G = f.gof[i];
        if (G < 0) {
            g->ops.v[i].group = -1;
            continue;
        }
        if (f.gr.v[G].ops.n == 1 && g->ops.v[i].code == OP_MATMUL) {
            g->ops.v[i].group = -1;
            continue;
        }
        if (id[G] < 0)
            id[G] = next++;
        g->ops.v[i].group = id[G];
    }
    free(id);
    pass_fuse_fuser_free(&f);
    pass_fuse_recompute_cheap(g);
    return true;
}
