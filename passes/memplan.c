/* memplan.c - live ranges on the final schedule and one arena's offsets.
 *
 * Persistent storages (graph inputs, params, state, in-place update values)
 * are laid out first in declaration order. Temp storages are placed greedily,
 * largest first, each at the best-fitting gap among the already-placed
 * storages whose live ranges meet its own (the smallest gap that holds it,
 * the lowest of equal ones; else above them all). The gaps come from two
 * segment trees over positions that keep unions of address ranges
 * (Covers): O(log n) unions per temp instead of every temp it meets, and
 * redundant blocks (stacks of address-adjacent temps over the intersection
 * of their live ranges) that merge the unions' interleaved spans, so
 * placing is near-linear in the temps (a deep model's saved activations)
 * rather than quadratic.
 *
 * The timeline (live bytes per op) is also split: params' gradients
 * (live_grad), activations saved for backward (live_saved), the rest other
 * temporaries; kiln plan's memory rows come from that split. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

/* Sizes and offsets saturate at INT64_MAX (a plan of more than 8 EiB, which
 * the runtime refuses before allocating anything); below that they are exact. */
static int64_t align_up(int64_t x)
{
    return x > INT64_MAX - MEMPLAN_ALIGN ? INT64_MAX
                                         : (x + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN * MEMPLAN_ALIGN;
}

/* Larger storages first; ties by definition time, then id (deterministic).
 * ctx: the MemPlan. */
static int cmp_by_size(const void *a, const void *b, void *ctx)
{
    const MemPlan *m = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    int64_t sx = align_up(m->bytes[x]), sy = align_up(m->bytes[y]);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    if (m->first[x] != m->first[y])
        return m->first[x] < m->first[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* ---- where the placed temps lie in the address space over time ----
 * A temp is a rectangle: live range [first, last] by address range
 * [off, off + size). Placing temp t needs the gaps of the union of the
 * address ranges of the placed temps whose live ranges meet [a, b] = t's.
 * Those are the temps live at a (stab: a segment tree over positions, a
 * temp at the O(log n) canonical nodes of its range, so the nodes from leaf
 * a to the root hold every temp live at a) and the temps that start in
 * (a, b] (start: a segment tree over first use, a temp at leaf first and
 * every node above it, so the canonical nodes of (a, b] hold them). Each
 * node keeps only the union of its temps' address ranges (Cover), and a
 * query merges the O(log n) unions in address order, skipping at once the
 * spans of a union that lie under what is covered already, instead of
 * one step per temp that meets t (a backward temp meets every saved
 * activation; touching ones merge into one span). Temps stacked in address
 * but with different live ranges sit in different nodes and would still
 * interleave (a walk that grows with depth); the blocks below add each
 * stack once more as one span, so a query walks about 13 to 15 spans per
 * temp at any depth. The fit is the one the plain scan of every such temp
 * in address order finds (test_memplan checks that it is). */

/* A union of address ranges: disjoint, non-touching spans [s, e), sorted. */
typedef struct {
    int64_t s, e;
} Span;

typedef struct {
    Span *v;
    int n, cap;
} Cover;

/* Adds [s, e) to c, merging the spans it overlaps or touches. */
static void cover_add(Cover *c, int64_t s, int64_t e)
{
    int lo = 0, hi = c->n; /* the first span that ends at or after s */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (c->v[mid].e < s)
            lo = mid + 1;
        else
            hi = mid;
    }
    int j = lo;
    while (j < c->n && c->v[j].s <= e) {
        if (c->v[j].s < s)
            s = c->v[j].s;
        if (c->v[j].e > e)
            e = c->v[j].e;
        j++;
    }
    if (j == lo) {
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 4;
            c->v = xrealloc(c->v, sizeof(Span) * (size_t)c->cap);
        }
        memmove(c->v + lo + 1, c->v + lo, sizeof(Span) * (size_t)(c->n - lo));
        c->n++;
    } else {
        memmove(c->v + lo + 1, c->v + j, sizeof(Span) * (size_t)(c->n - j));
        c->n -= j - lo - 1;
    }
    c->v[lo] = (Span){s, e};
}

/* The spans of one union still to merge into a query: p .. end. */
typedef struct {
    const Span *p, *end;
} Run;

typedef struct {
    int leaves;          /* power of two > every position */
    Cover *stab, *start; /* 2 * leaves nodes each; node 1 the root */
    VEC(Run) q;          /* a query's unions: a heap by next span start */
    int64_t walked;      /* spans the queries consumed, in all (MemPlan.fit_spans) */
} Covers;

/* Calls body with v set to each canonical node of [a, b] (inclusive). */
#define FOR_CANON(cv, a, b, body)                                                  \
    for (int lo_ = (a) + (cv)->leaves, hi_ = (b) + (cv)->leaves + 1; lo_ < hi_;    \
         lo_ /= 2, hi_ /= 2) {                                                     \
        if (lo_ & 1) {                                                             \
            int v = lo_++;                                                         \
            body;                                                                  \
        }                                                                          \
        if (hi_ & 1) {                                                             \
            int v = --hi_;                                                         \
            body;                                                                  \
        }                                                                          \
    }

static void covers_init(Covers *cv, int n)
{
    memset(cv, 0, sizeof *cv);
    cv->leaves = 1;
    while (cv->leaves <= n + 1)
        cv->leaves *= 2;
    cv->stab = xcalloc((size_t)cv->leaves * 2, sizeof(Cover));
    cv->start = xcalloc((size_t)cv->leaves * 2, sizeof(Cover));
}

static void covers_free(Covers *cv)
{
    for (int v = 0; v < 2 * cv->leaves; v++) {
        free(cv->stab[v].v);
        free(cv->start[v].v);
    }
    free(cv->stab);
    free(cv->start);
    vec_free(&cv->q);
}

/* A placed temp: live over [a, b], at [s, e). */
static void covers_add(Covers *cv, int a, int b, int64_t s, int64_t e)
{
    FOR_CANON(cv, a, b, cover_add(&cv->stab[v], s, e));
    for (int v = cv->leaves + a; v >= 1; v /= 2)
        cover_add(&cv->start[v], s, e);
}

/* Adds c's spans to the query's heap. */
static void covers_take(Covers *cv, const Cover *c)
{
    if (!c->n)
        return;
    vec_push(&cv->q, ((Run){c->v, c->v + c->n}));
    Run *h = cv->q.v;
    for (int i = cv->q.n - 1; i > 0 && h[(i - 1) / 2].p->s > h[i].p->s; i = (i - 1) / 2) {
        Run x = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = x;
    }
}

/* Restores the heap h[0..n) below its top. */
static void runs_sift(Run *h, int n)
{
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && h[c + 1].p->s < h[c].p->s)
            c++;
        if (h[i].p->s <= h[c].p->s)
            break;
        Run x = h[i];
        h[i] = h[c];
        h[c] = x;
        i = c;
    }
}

/* The next span of the query in address order that ends above pos (the
 * ones below it are covered already and change no gap), which it consumes;
 * NULL when none is left. A union's spans under pos are skipped by one
 * binary search: where the query's union is one long stretch, each union
 * costs a search per stretch, not a step per span. */
static const Span *covers_next(Covers *cv, int64_t pos)
{
    Run *h = cv->q.v;
    while (cv->q.n) {
        Run *r = &h[0];
        if (r->p->e <= pos) {
            const Span *lo = r->p, *hi = r->end;
            while (lo < hi) {
                const Span *mid = lo + (hi - lo) / 2;
                if (mid->e <= pos)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            r->p = lo;
        } else {
            const Span *top = r->p++;
            cv->walked++;
            if (r->p == r->end)
                h[0] = h[--cv->q.n];
            runs_sift(h, cv->q.n);
            return top;
        }
        if (r->p == r->end)
            h[0] = h[--cv->q.n];
        runs_sift(h, cv->q.n);
    }
    return NULL;
}

/* The best fit for size bytes among the temps placed so far whose live
 * ranges meet [a, b]: the lowest of the smallest gaps of at least size
 * between them, else the top of them (0 when there are none). */
static int64_t covers_fit(Covers *cv, int a, int b, int64_t size)
{
    cv->q.n = 0;
    for (int v = cv->leaves + a; v >= 1; v /= 2)
        covers_take(cv, &cv->stab[v]);
    if (a < b)
        FOR_CANON(cv, a + 1, b, covers_take(cv, &cv->start[v]));
    int64_t best = -1, best_gap = INT64_MAX, pos = 0;
    for (const Span *x; (x = covers_next(cv, pos));) {
        int64_t gap = x->s - pos;
        if (gap >= size && gap < best_gap) {
            best = pos;
            best_gap = gap;
        }
        if (x->e > pos)
            pos = x->e;
    }
    return best < 0 ? pos : best;
}

/* ---- blocks: redundant rectangles that let the fit skip a stack ----
 * A block is address-adjacent placed temps [s, e) taken together over the
 * intersection [lo, hi] of their live ranges. Wherever a query's range
 * meets [lo, hi], it meets every member's, so all of [s, e) is in the
 * query's union anyway: adding the block to the Covers changes no union and
 * no fit. It only makes one span of what were many spans in different
 * unions (a deep model's saved activations of two sizes sit stacked in
 * address, alternating, each in the node of its own live range), which
 * covers_next then skips with one binary search per union instead of a
 * heap step per span.
 *
 * A placed temp joins the widest rectangle (temp or block) that ends where
 * it starts and the widest that starts where it ends, among the last
 * BLOCK_SCAN of each, whose ranges meet its own and each other's: one new
 * block per temp at most, found through hashes of start and end addresses. */
enum { BLOCK_SCAN = 8 };

typedef struct {
    int64_t s, e;
    int lo, hi;
    int next[2]; /* the previous rectangle starting at s (0) or ending at e (1) */
} Rect;

typedef struct {
    VEC(Rect) r;
    size_t cap;      /* power of two, over twice the rectangles */
    int64_t *key[2]; /* per hash (0: start, 1: end addresses): key and head */
    int *head[2];    /* (-1: empty slot) */
} Blocks;

static void blocks_init(Blocks *b, int ntemps)
{
    memset(b, 0, sizeof *b);
    b->cap = 16;
    while (b->cap < 4 * (size_t)ntemps + 16)
        b->cap *= 2;
    for (int h = 0; h < 2; h++) {
        b->key[h] = xmalloc(sizeof(int64_t) * b->cap);
        b->head[h] = xmalloc(sizeof(int) * b->cap);
        for (size_t i = 0; i < b->cap; i++)
            b->head[h][i] = -1;
    }
}

static void blocks_free(Blocks *b)
{
    vec_free(&b->r);
    for (int h = 0; h < 2; h++) {
        free(b->key[h]);
        free(b->head[h]);
    }
}

/* The slot of address x in hash h (its own, or the empty one to take). */
static size_t blocks_slot(const Blocks *b, int h, int64_t x)
{
    size_t i = (size_t)((uint64_t)x * 0x9E3779B97F4A7C15ull >> 20) & (b->cap - 1);
    while (b->head[h][i] >= 0 && b->key[h][i] != x)
        i = (i + 1) & (b->cap - 1);
    return i;
}

static void blocks_push(Blocks *b, Rect x)
{
    for (int h = 0; h < 2; h++) {
        int64_t at = h ? x.e : x.s;
        size_t i = blocks_slot(b, h, at);
        x.next[h] = b->head[h][i];
        b->key[h][i] = at;
        b->head[h][i] = b->r.n;
    }
    vec_push(&b->r, x);
}

/* Of the rectangles starting (h 0) or ending (h 1) at x whose ranges meet
 * [*lo, *hi], the one that leaves the longest intersection (the widest of
 * those), to which it narrows [*lo, *hi]; -1: none. A stack's block is
 * counted where its intersection meets a query: a long-lived block beats a
 * wide one that something short-lived narrows. */
static int blocks_join(const Blocks *b, int h, int64_t x, int *lo, int *hi)
{
    int pick = -1, best_len = -1;
    size_t i = blocks_slot(b, h, x);
    for (int r = b->head[h][i], seen = 0; r >= 0 && seen < BLOCK_SCAN;
         r = b->r.v[r].next[h], seen++) {
        const Rect *c = &b->r.v[r];
        int len = (c->hi < *hi ? c->hi : *hi) - (c->lo > *lo ? c->lo : *lo);
        if (len < 0)
            continue;
        if (pick < 0 || len > best_len ||
            (len == best_len && c->e - c->s > b->r.v[pick].e - b->r.v[pick].s)) {
            pick = r;
            best_len = len;
        }
    }
    if (pick >= 0) {
        const Rect *c = &b->r.v[pick];
        *lo = c->lo > *lo ? c->lo : *lo;
        *hi = c->hi < *hi ? c->hi : *hi;
    }
    return pick;
}

/* Records the temp just placed over [a, z] at [s, e), and the block it
 * makes (also added to cv), if any. */
static void blocks_place(Blocks *b, Covers *cv, int a, int z, int64_t s, int64_t e)
{
    int lo = a, hi = z;
    int below = blocks_join(b, 1, s, &lo, &hi);
    int above = blocks_join(b, 0, e, &lo, &hi);
    blocks_push(b, (Rect){s, e, a, z, {-1, -1}});
    if (below < 0 && above < 0)
        return;
    Rect blk = {below >= 0 ? b->r.v[below].s : s, above >= 0 ? b->r.v[above].e : e, lo, hi,
                {-1, -1}};
    covers_add(cv, blk.lo, blk.hi, blk.s, blk.e);
    blocks_push(b, blk);
}

/* True when op reads its operands at its own flat output index only. */
static bool same_index_op(const Op *op)
{
    return ir_opinfo[op->code].cls == OC_ELEMWISE && op->code != OP_CONST &&
           op->code != OP_IOTA;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Per tensor: true for the roots that hold a param's gradient: the graph
 * outputs "grad.P" of params P, and under zero=1 the gradients a
 * reduce-scatter bucket reads and the shard it writes ("grad.shard").
 * Caller frees. */
static bool *grad_roots(const Graph *g, const MemPlan *m)
{
    bool *is = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    VEC(const char *) params = {0}; /* sorted: one search per output */
    for (int t = 0; t < g->t.n; t++)
        if (g->t.v[t].kind == TK_PARAM && g->t.v[t].name)
            vec_push(&params, g->t.v[t].name);
    if (params.n)
        qsort(params.v, (size_t)params.n, sizeof(const char *), cmp_str);
    for (int k = 0; k < g->outs.n && params.n; k++) {
        const char *nm = g->outs.v[k].name;
        if (!nm || strncmp(nm, "grad.", 5) != 0)
            continue;
        const char *key = nm + 5;
        if (strcmp(key, "shard") == 0 ||
            bsearch(&key, params.v, (size_t)params.n, sizeof(const char *), cmp_str))
            is[m->root[g->outs.v[k].t]] = true;
    }
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_REDUCE_SCATTER_START)
            for (int j = 0; j < g->ops.v[i].nin; j++)
                is[m->root[g->ops.v[i].in[j]]] = true;
    vec_free(&params);
    return is;
}

/* Per tensor: true for the roots written by a forward op and read by a
 * backward or optimizer op (through any tensor sharing the storage). Caller
 * frees. */
static bool *saved_roots(const Graph *g, const MemPlan *m)
{
    const unsigned later = OPF_BACKWARD | OPF_OPTIM;
    bool *fwd = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    bool *read = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (!(op->flags & (later | OPF_RECOMPUTE)))
            fwd[m->root[op->out]] = true;
        for (int j = 0; (op->flags & later) && j < op->nin; j++)
            read[m->root[op->in[j]]] = true;
    }
    for (int t = 0; t < g->t.n; t++)
        fwd[t] = fwd[t] && read[t];
    free(read);
    return fwd;
}

/* Fills m's timeline (live, live_grad, live_saved, grad_bytes, peak_live,
 * peak_op) from the temps' live ranges and m->bytes. */
static void fill_timeline(const Graph *g, MemPlan *m, const int *temps, int ntemps)
{
    int n = m->nops;
    /* bytes live while each op runs, in all (0), in gradients (1) and in
     * saved activations (2) */
    bool *is_grad = grad_roots(g, m), *is_saved = saved_roots(g, m);
    __int128 *delta = xcalloc(3 * ((size_t)n + 2), sizeof *delta); /* sums of saturated sizes */
    __int128 grads = 0;
    for (int k = 0; k < ntemps; k++) {
        int t = temps[k];
        int64_t size = align_up(m->bytes[t] ? m->bytes[t] : 1);
        int a = m->first[t], b = m->last[t] >= n ? n - 1 : m->last[t];
        if (a < 0 || n == 0)
            continue;
        __int128 *all = delta, *part = is_grad[t]    ? delta + (n + 2)
                                       : is_saved[t] ? delta + 2 * (n + 2)
                                                     : NULL;
        all[a] += size;
        all[b + 1] -= size;
        if (part) {
            part[a] += size;
            part[b + 1] -= size;
        }
        if (is_grad[t])
            grads += size;
    }
    m->grad_bytes = grads > INT64_MAX ? INT64_MAX : (int64_t)grads;
    __int128 cur[3] = {m->persistent_bytes, 0, 0};
    int64_t *out[3] = {m->live, m->live_grad, m->live_saved};
    m->peak_live = m->persistent_bytes;
    m->peak_op = -1;
    for (int i = 0; i < n; i++) {
        for (int q = 0; q < 3; q++) {
            cur[q] += delta[q * (n + 2) + i];
            out[q][i] = cur[q] > INT64_MAX ? INT64_MAX : (int64_t)cur[q];
        }
        if (m->live[i] > m->peak_live) {
            m->peak_live = m->live[i];
            m->peak_op = i;
        }
    }
    free(delta);
    free(is_grad);
    free(is_saved);
}

static bool same_dims(const Shape *a, const Shape *b)
{
    if (a->rank != b->rank)
        return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dim[d] != b->dim[d])
            return false;
    return true;
}

/* True when op reduces its operand over trailing axes only (a row: the
 * kernel folds the whole row before any phase that uses the result). */
static bool row_reduce(const Graph *g, const Op *op)
{
    if (ir_opinfo[op->code].cls != OC_REDUCE || op->attr.nia <= 0)
        return false;
    int rank = g->t.v[op->in[0]].s.rank;
    for (int k = 0; k < op->attr.nia; k++)
        if (op->attr.ia[k] != rank - op->attr.nia + k)
            return false;
    return true;
}

typedef struct {
    int *ops, *root;
    FuseDomain *dom;
    int cap;
} LoopWs;

static bool same_domain(const FuseDomain *x, const FuseDomain *y)
{
    return x->kind == y->kind && x->k == y->k && same_dims(&x->S, &y->S);
}

/* Whether, in the kernel of the group whose ops are the members of
 * [a, z] (op o's group), every op that reads tensor I is an elementwise op
 * of I's shape or a reduction over its trailing axes, in the one row loop
 * that stores o's result: the parts (pass_fuse_parts) of all of them have
 * the domain of o's part, a row domain, and o's part reads I, so codegen
 * builds them into one loop (parts of one domain that read one tensor
 * share a loop: cg_lower_group), whose phases run every fold before any
 * store and read an element before storing at its index. */
static bool one_loop(const Graph *g, int a, int z, int o, int I, const bool *mat, LoopWs *w)
{
    int G = g->ops.v[o].group, n = 0;
    if (w->cap < z - a + 1) {
        w->cap = z - a + 1;
        w->ops = xrealloc(w->ops, sizeof(int) * (size_t)w->cap);
        w->root = xrealloc(w->root, sizeof(int) * (size_t)w->cap);
        w->dom = xrealloc(w->dom, sizeof(FuseDomain) * (size_t)w->cap);
    }
    int at = -1;
    for (int k = a; k <= z; k++)
        if (g->ops.v[k].group == G) {
            if (k == o)
                at = n;
            w->ops[n++] = k;
        }
    int bad;
    char err[256];
    if (at < 0 || !pass_fuse_lowers(g, w->ops, n, mat, w->root, w->dom, &bad, err, sizeof err))
        return false;
    const FuseDomain *d = &w->dom[w->root[at]];
    if (d->kind != FUSE_ROW)
        return false;
    bool mine = false; /* o's part reads I */
    for (int i = 0; i < n; i++) {
        const Op *y = &g->ops.v[w->ops[i]];
        bool reads = false;
        for (int q = 0; q < y->nin; q++)
            reads |= y->in[q] == I;
        if (!reads)
            continue;
        if (y->code == OP_MATMUL || !same_domain(&w->dom[w->root[i]], d) ||
            !((same_index_op(y) && same_dims(&g->t.v[y->out].s, &g->t.v[I].s)) ||
              row_reduce(g, y)))
            return false;
        mine |= w->root[i] == w->root[at];
    }
    return mine;
}

/* Kernel results in place of an operand (the cross-entropy's dlogits over
 * its logits: one logits-sized buffer instead of two). Result O of fuse
 * group G takes the storage of G's operand I when
 *  - both are materialised temps owning their storage, I with no views,
 *    O no graph output nor an update's value (last < nops), of one shape
 *    and dtype (so of one storage size in every plan: the storage type is
 *    decided per storage);
 *  - I is defined before G, or by the GEMM that heads G (it runs before
 *    G's kernel), and G is its last reader (schedule.c moves the small
 *    readers that may run before G there);
 *  - O is an elementwise result that depends on a row reduction of G
 *    (which keeps GEMM epilogue groups out: their result depends on none),
 *    and inside G only elementwise ops of I's shape and reductions over
 *    its trailing axes read I, all in O's row loop (one_loop).
 * The kernel then reads all it needs of I at an index before it stores O
 * there, as for an update in place: codegen merges the two params into
 * one (cg_merge_inplace_params) and split loops put the stores in a later
 * stage than the folds (cuda_split.c). Each storage is taken once, and not
 * one an update already shares (is_value, taken). */
static void group_inplace(const Graph *g, MemPlan *m, int ngroups, const int *gfirst,
                          const int *glast, const bool *internal, const bool *is_value,
                          const bool *taken)
{
    int nt = g->t.n, n = g->ops.n;
    bool *has_view = xcalloc((size_t)nt + 1, sizeof(bool));
    bool *used = xcalloc((size_t)nt + 1, sizeof(bool));
    bool *anc = xcalloc((size_t)n + 1, sizeof(bool)); /* ancestors of O's op in G */
    int *stack = xmalloc(sizeof(int) * (size_t)(n + 1));
    VEC(int) cand = {0}; /* G's operands that could be I */
    bool *mat = NULL;    /* !internal, made when a candidate needs it */
    LoopWs ws = {0};
    for (int t = 0; t < nt; t++) {
        if (m->root[t] != t)
            has_view[m->root[t]] = true;
        used[t] = is_value[t] || taken[t];
    }
    for (int G = 0; G < ngroups; G++) {
        int a = gfirst[G], z = glast[G];
        if (a < 0)
            continue;
        cand.n = 0;
        for (int k = a; k <= z; k++) {
            const Op *x = &g->ops.v[k];
            for (int j = 0; j < x->nin && x->group == G; j++) {
                int I = x->in[j], p = g->t.v[I].op;
                bool gemm = p >= a && p <= z && g->ops.v[p].code == OP_MATMUL; /* G's head */
                if (p < 0 || (p >= a && !gemm) || used[I] || m->root[I] != I || has_view[I] ||
                    m->persistent[I] || internal[I] || m->last[I] != z)
                    continue;
                bool dup = false;
                for (int c = 0; c < cand.n && !dup; c++)
                    dup = cand.v[c] == I;
                if (!dup)
                    vec_push(&cand, I);
            }
        }
        for (int i = a; i <= z && cand.n; i++) {
            const Op *op = &g->ops.v[i];
            int O = op->out;
            if (op->group != G || internal[O] || m->root[O] != O || m->persistent[O] ||
                used[O] || m->last[O] >= n || !same_index_op(op))
                continue;
            int I = -1;
            for (int c = 0; c < cand.n && I < 0; c++)
                if (!used[cand.v[c]] && shape_eq(&g->t.v[cand.v[c]].s, &g->t.v[O].s) &&
                    m->bytes[cand.v[c]] == m->bytes[O])
                    I = cand.v[c];
            if (I < 0)
                continue;
            if (!mat) {
                mat = xmalloc(sizeof(bool) * (size_t)(nt + 1));
                for (int t = 0; t < nt; t++)
                    mat[t] = !internal[t];
            }
            int sp = 0; /* O's ancestors inside G */
            stack[sp++] = i;
            anc[i] = true;
            while (sp) {
                const Op *x = &g->ops.v[stack[--sp]];
                for (int j = 0; j < x->nin; j++) {
                    int p = g->t.v[x->in[j]].op;
                    if (p >= a && p <= z && g->ops.v[p].group == G && !anc[p]) {
                        anc[p] = true;
                        stack[sp++] = p;
                    }
                }
            }
            /* O depends on a row reduction of G */
            bool row = false;
            for (int r = a; r <= z && !row; r++)
                row = anc[r] && g->ops.v[r].group == G && row_reduce(g, &g->ops.v[r]);
            for (int k = a; k <= z; k++)
                anc[k] = false;
            if (!row || !one_loop(g, a, z, i, I, mat, &ws))
                continue;
            m->root[O] = I;
            if (m->last[O] > m->last[I])
                m->last[I] = m->last[O];
            m->first[O] = m->last[O] = -1;
            used[I] = used[O] = true;
        }
    }
    vec_free(&cand);
    free(ws.ops);
    free(ws.root);
    free(ws.dom);
    free(mat);
    free(has_view);
    free(used);
    free(anc);
    free(stack);
}

MemPlan *pass_memplan(const Graph *g, Diag *d) { return pass_memplan_storage(g, NULL, d); }

MemPlan *pass_memplan_storage(const Graph *g, const DType *storage, Diag *d)
{
    (void)d;
    int nt = g->t.n, n = g->ops.n;
    MemPlan *m = xcalloc(1, sizeof *m);
    m->nt = nt;
    m->nops = n;
    m->root = xmalloc(sizeof(int) * (size_t)(nt + 1));
    m->offset = xcalloc((size_t)nt + 1, sizeof(int64_t));
    m->bytes = xcalloc((size_t)nt + 1, sizeof(int64_t));
    m->first = xmalloc(sizeof(int) * (size_t)(nt + 1));
    m->last = xmalloc(sizeof(int) * (size_t)(nt + 1));
    m->persistent = xcalloc((size_t)nt + 1, sizeof(bool));
    m->inplace = xcalloc((size_t)g->upd.n + 1, sizeof(bool));
    m->live = xcalloc((size_t)n + 1, sizeof(int64_t));
    m->live_grad = xcalloc((size_t)n + 1, sizeof(int64_t));
    m->live_saved = xcalloc((size_t)n + 1, sizeof(int64_t));

    for (int t = 0; t < nt; t++) {
        const Tensor *x = &g->t.v[t];
        m->root[t] = t;
        m->bytes[t] = storage ? ir_mul_sat(shape_numel(&x->s), dtype_size(storage[t]))
                              : shape_bytes(&x->s);
        m->first[t] = m->last[t] = -1;
        m->persistent[t] = x->op < 0;
    }
    /* views: a reshape shares its operand's storage */
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code == OP_RESHAPE)
            m->root[op->out] = m->root[op->in[0]];
        /* the reduced gradient is the gradient's buffer, reduced in place:
         * the buffer stays live from the start through every reader */
        if (op->code == OP_ALLREDUCE_WAIT || op->code == OP_REDUCE_SCATTER_WAIT)
            m->root[op->out] = m->root[op->in[1]];
        /* a gathered param is the param's own buffer, written in place */
        if (op->code == OP_ALL_GATHER_WAIT)
            m->root[op->out] = m->root[op->in[2]];
    }
    /* fuse groups run as one kernel over their (contiguous) op range
     * [gfirst, glast]: everything the kernel reads or writes is live over the
     * whole range, and results that never leave the group (not
     * materialised) get no storage */
    int ngroups = 0;
    for (int i = 0; i < n; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    int *gfirst = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    int *glast = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    for (int i = 0; i < ngroups; i++)
        gfirst[i] = glast[i] = -1;
    for (int i = 0; i < n; i++) {
        int gr = g->ops.v[i].group;
        if (gr < 0)
            continue;
        if (gfirst[gr] < 0)
            gfirst[gr] = i;
        glast[gr] = i;
    }
    bool *internal = pass_fuse_materialised(g);
    for (int t = 0; t < nt; t++) /* materialised -> internal */
        internal[t] = !internal[t];
    /* live ranges per root */
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        int lo = op->group >= 0 ? gfirst[op->group] : i;
        int hi = op->group >= 0 ? glast[op->group] : i;
        int r = m->root[op->out];
        if (m->first[r] < 0 || m->first[r] > lo)
            m->first[r] = lo;
        if (m->last[r] < hi)
            m->last[r] = hi;
        for (int j = 0; j < op->nin; j++) {
            int a = m->root[op->in[j]];
            if (m->last[a] < hi)
                m->last[a] = hi;
        }
    }
    for (int k = 0; k < g->outs.n; k++)
        m->last[m->root[g->outs.v[k].t]] = n;
    for (int k = 0; k < g->upd.n; k++)
        m->last[m->root[g->upd.v[k].value]] = n;

    /* updates in place: the value's op writes straight into the target when
     * nothing reads the target afterwards (the op itself may, at the same
     * index), and the target's old value is no other update's value */
    bool *is_value = xcalloc((size_t)nt + 1, sizeof(bool));
    bool *taken = xcalloc((size_t)nt + 1, sizeof(bool)); /* the value of an in-place update */
    for (int k = 0; k < g->upd.n; k++)
        is_value[m->root[g->upd.v[k].value]] = true;
    for (int k = 0; k < g->upd.n; k++) {
        int T = g->upd.v[k].target, V = g->upd.v[k].value;
        const Tensor *v = &g->t.v[V];
        if (v->op < 0 || m->root[V] != V || m->persistent[V] || is_value[T])
            continue;
        if (taken[V])
            continue;
        int def = v->op, lr = m->last[T];
        /* a fused kernel reads all it needs at an index before writing it */
        bool same = same_index_op(&g->ops.v[def]) || g->ops.v[def].group >= 0;
        if (g->ops.v[def].group >= 0)
            def = glast[g->ops.v[def].group];
        if (lr > def || (lr == def && !same))
            continue;
        bool out_of_t = false;
        for (int k2 = 0; k2 < g->outs.n; k2++)
            if (m->root[g->outs.v[k2].t] == T)
                out_of_t = true;
        if (out_of_t)
            continue;
        m->inplace[k] = true;
        taken[V] = true;
        m->root[V] = T;
        m->first[V] = m->last[V] = -1;
    }
    group_inplace(g, m, ngroups, gfirst, glast, internal, is_value, taken);
    /* views of in-place values follow their root */
    for (int t = 0; t < nt; t++)
        m->root[t] = m->root[m->root[t]];
    free(is_value);
    free(taken);

    /* persistent region */
    int64_t off = 0;
    for (int t = 0; t < nt; t++)
        if (m->root[t] == t && m->persistent[t]) {
            m->offset[t] = off;
            off = ir_add_sat(off, align_up(m->bytes[t] ? m->bytes[t] : 1));
        }
    m->persistent_bytes = off;

    /* temps: dead results still need somewhere to be written */
    int *temps = xmalloc(sizeof(int) * (size_t)(nt + 1));
    int ntemps = 0;
    for (int t = 0; t < nt; t++)
        if (m->root[t] == t && !m->persistent[t] && !internal[t]) {
            if (m->last[t] < m->first[t])
                m->last[t] = m->first[t];
            temps[ntemps++] = t;
        }
    qsort_r(temps, (size_t)ntemps, sizeof(int), cmp_by_size, m);
    Covers cv;
    covers_init(&cv, n);
    Blocks bl;
    blocks_init(&bl, ntemps);
    int64_t high = 0;
    for (int k = 0; k < ntemps; k++) {
        int t = temps[k];
        int64_t size = align_up(m->bytes[t] ? m->bytes[t] : 1);
        int64_t best = covers_fit(&cv, m->first[t], m->last[t], size);
        int64_t end = ir_add_sat(best, size);
        covers_add(&cv, m->first[t], m->last[t], best, end);
        blocks_place(&bl, &cv, m->first[t], m->last[t], best, end);
        m->offset[t] = ir_add_sat(m->persistent_bytes, best);
        if (end > high)
            high = end;
    }
    blocks_free(&bl);
    m->fit_spans = cv.walked;
    covers_free(&cv);
    m->arena_bytes = ir_add_sat(m->persistent_bytes, high);
    for (int t = 0; t < nt; t++)
        m->offset[t] = m->offset[m->root[t]];

    fill_timeline(g, m, temps, ntemps);
    free(temps);
    free(gfirst);
    free(glast);
    free(internal);
    return m;
}

MemPlan *pass_memplan_counted(const Graph *g, const MemPlan *m, const DType *storage)
{
    int nt = m->nt, n = m->nops;
    MemPlan *c = xcalloc(1, sizeof *c);
    c->nt = nt;
    c->nops = n;
    c->root = xmalloc(sizeof(int) * (size_t)(nt + 1));
    c->first = xmalloc(sizeof(int) * (size_t)(nt + 1));
    c->last = xmalloc(sizeof(int) * (size_t)(nt + 1));
    c->bytes = xcalloc((size_t)nt + 1, sizeof(int64_t));
    c->persistent = xcalloc((size_t)nt + 1, sizeof(bool));
    memcpy(c->root, m->root, sizeof(int) * (size_t)nt);
    memcpy(c->first, m->first, sizeof(int) * (size_t)nt);
    memcpy(c->last, m->last, sizeof(int) * (size_t)nt);
    memcpy(c->persistent, m->persistent, sizeof(bool) * (size_t)nt);
    c->live = xcalloc((size_t)n + 1, sizeof(int64_t));
    c->live_grad = xcalloc((size_t)n + 1, sizeof(int64_t));
    c->live_saved = xcalloc((size_t)n + 1, sizeof(int64_t));
    bool *mat = pass_fuse_materialised(g);
    int *temps = xmalloc(sizeof(int) * (size_t)(nt + 1));
    int ntemps = 0;
    for (int t = 0; t < nt; t++) {
        const Tensor *x = &g->t.v[t];
        c->bytes[t] = storage ? ir_mul_sat(shape_numel(&x->s), dtype_size(storage[t]))
                              : shape_bytes(&x->s);
        if (m->root[t] == t && !m->persistent[t] && mat[t])
            temps[ntemps++] = t;
    }
    c->persistent_bytes = 0; /* as pass_memplan_storage lays them out */
    for (int t = 0; t < nt; t++)
        if (m->root[t] == t && m->persistent[t])
            c->persistent_bytes =
                ir_add_sat(c->persistent_bytes, align_up(c->bytes[t] ? c->bytes[t] : 1));
    fill_timeline(g, c, temps, ntemps);
    free(temps);
    free(mat);
    return c;
}

void pass_memplan_free(MemPlan *m)
{
    if (!m)
        return;
    free(m->root);
    free(m->offset);
    free(m->bytes);
    free(m->first);
    free(m->last);
    free(m->persistent);
    free(m->inplace);
    free(m->live);
    free(m->live_grad);
    free(m->live_saved);
    free(m);
}

void pass_memplan_print(const Graph *g, const MemPlan *m, FILE *f)
{
    char b[160];
    fprintf(f, "memplan: persistent %lld bytes, peak live %lld bytes", (long long)m->persistent_bytes,
            (long long)m->peak_live);
    if (m->peak_op >= 0)
        fprintf(f, " at op %d (%s)", m->peak_op, ir_opinfo[g->ops.v[m->peak_op].code].name);
    fprintf(f, ", arena %lld bytes\n", (long long)m->arena_bytes);
    fprintf(f, "%6s  %-12s %-28s %14s %14s\n", "op", "opcode", "result", "offset", "live_bytes");
    for (int i = 0; i < m->nops; i++) {
        const Op *op = &g->ops.v[i];
        int t = op->out;
        char res[64];
        snprintf(res, sizeof res, "%%%d:%s", t, shape_str(g, &g->t.v[t].s, b, sizeof b));
        fprintf(f, "%6d  %-12s %-28s %14lld %14lld%s%s\n", i, ir_opinfo[op->code].name, res,
                (long long)m->offset[t], (long long)m->live[i],
                m->root[t] != t ? (g->t.v[m->root[t]].op < 0 || same_index_op(op) ? " (in place)"
                                                                          : " (view)")
                                : "",
                i == m->peak_op ? "  <- peak" : "");
    }
    fprintf(f, "peak %lld bytes\n", (long long)m->peak_live);
}

bool pass_memplan_run(Graph *g, const PassOpts *o, Diag *d)
{
    MemPlan *m = pass_memplan(g, d);
    if (!m)
        return false;
    if (o->memplan)
        *o->memplan = m;
    else
        pass_memplan_free(m);
    return true;
}
