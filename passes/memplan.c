/* memplan.c - live ranges on the final schedule and one arena's offsets.
 *
 * Persistent storages (graph inputs, params, state, in-place update values)
 * are laid out first in declaration order. Temp storages are placed greedily,
 * largest first, each at the best-fitting gap among the already-placed
 * storages whose live ranges meet its own. */
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

typedef struct {
    int t;
    int64_t off, size;
} Placed;

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

static int cmp_off(const void *a, const void *b)
{
    const Placed *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* The live ranges of all temps, for "which ranges meet [a, b]": those
 * that contain a (stab: a segment tree over positions 0..n keeps each
 * range at its O(log n) canonical nodes; the nodes from leaf a up to the
 * root list every range containing a), and those that start in (a, b]
 * (by_first, sorted by first). A query costs O(log n + answers) instead of
 * a scan of every placed temp. */
typedef struct {
    int leaves;       /* power of two > n */
    int *soff, *stab; /* node v lists stab[soff[v] .. soff[v + 1]) */
    int *by_first;
} Overlaps;

static int cmp_first(const void *a, const void *b, void *ctx)
{
    const MemPlan *m = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    if (m->first[x] != m->first[y])
        return m->first[x] < m->first[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Calls fn on the canonical nodes of [a, b] (inclusive). */
#define FOR_CANON(ov, a, b, body)                                                  \
    for (int lo_ = (a) + (ov)->leaves, hi_ = (b) + (ov)->leaves + 1; lo_ < hi_;    \
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

static Overlaps overlaps_build(const MemPlan *m, const int *temps, int ntemps, int n)
{
    Overlaps ov;
    ov.leaves = 1;
    while (ov.leaves <= n + 1)
        ov.leaves *= 2;
    int nodes = 2 * ov.leaves;
    ov.soff = xcalloc((size_t)nodes + 2, sizeof(int));
    for (int k = 0; k < ntemps; k++) {
        int t = temps[k];
        FOR_CANON(&ov, m->first[t], m->last[t], ov.soff[v + 1]++);
    }
    for (int v = 0; v <= nodes; v++)
        ov.soff[v + 1] += ov.soff[v];
    ov.stab = xmalloc(sizeof(int) * (size_t)(ov.soff[nodes] + 1));
    int *fill = xcalloc((size_t)nodes + 1, sizeof(int));
    for (int k = 0; k < ntemps; k++) {
        int t = temps[k];
        FOR_CANON(&ov, m->first[t], m->last[t], ov.stab[ov.soff[v] + fill[v]++] = t);
    }
    free(fill);
    ov.by_first = xmalloc(sizeof(int) * (size_t)(ntemps + 1));
    memcpy(ov.by_first, temps, sizeof(int) * (size_t)ntemps);
    qsort_r(ov.by_first, (size_t)ntemps, sizeof(int), cmp_first, (void *)m);
    return ov;
}

static void overlaps_free(Overlaps *ov)
{
    free(ov->soff);
    free(ov->stab);
    free(ov->by_first);
}

/* The first index of by_first whose range starts after a. */
static int first_after(const MemPlan *m, const int *by_first, int n, int a)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (m->first[by_first[mid]] <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The placed temps in offset order, as a list of sorted blocks of at most
 * 2 * OFF_BLOCK ids (insertion costs O(blocks + OFF_BLOCK), a walk in order
 * O(placed)). A temp whose live range meets many placed ones (a backward
 * temp while every saved activation is live) gets its conflicts in offset
 * order from one walk instead of a sort. */
enum { OFF_BLOCK = 256 };

typedef struct {
    int **blk;    /* blk[i][0 .. nb[i]) ascending by offset */
    int *nb, n, cap;
    int *lo, *hi; /* per block: the earliest first use, the latest last use */
    int placed;
} ByOffset;

static void byoff_bounds(ByOffset *o, const MemPlan *m, int i)
{
    o->lo[i] = INT32_MAX;
    o->hi[i] = INT32_MIN;
    for (int j = 0; j < o->nb[i]; j++) {
        int u = o->blk[i][j];
        if (m->first[u] < o->lo[i])
            o->lo[i] = m->first[u];
        if (m->last[u] > o->hi[i])
            o->hi[i] = m->last[u];
    }
}

static void byoff_insert(ByOffset *o, const MemPlan *m, const int64_t *poff, int t)
{
    if (!o->n) {
        o->cap = 16;
        o->blk = xmalloc(sizeof(int *) * (size_t)o->cap);
        o->nb = xmalloc(sizeof(int) * (size_t)o->cap);
        o->lo = xmalloc(sizeof(int) * (size_t)o->cap);
        o->hi = xmalloc(sizeof(int) * (size_t)o->cap);
        o->blk[0] = xmalloc(sizeof(int) * 2 * OFF_BLOCK);
        o->nb[0] = 0;
        o->n = 1;
    }
    int i = 0; /* the first block whose last offset is above t's, else the last */
    while (i < o->n - 1 && (o->nb[i] == 0 || poff[o->blk[i][o->nb[i] - 1]] <= poff[t]))
        i++;
    int *b = o->blk[i], lo = 0, hi = o->nb[i];
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (poff[b[mid]] <= poff[t])
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(b + lo + 1, b + lo, sizeof(int) * (size_t)(o->nb[i] - lo));
    b[lo] = t;
    o->placed++;
    if (o->nb[i] == 0 || m->first[t] < o->lo[i])
        o->lo[i] = m->first[t];
    if (o->nb[i] == 0 || m->last[t] > o->hi[i])
        o->hi[i] = m->last[t];
    if (++o->nb[i] < 2 * OFF_BLOCK)
        return;
    if (o->n == o->cap) { /* split a full block in two */
        o->cap *= 2;
        o->blk = xrealloc(o->blk, sizeof(int *) * (size_t)o->cap);
        o->nb = xrealloc(o->nb, sizeof(int) * (size_t)o->cap);
        o->lo = xrealloc(o->lo, sizeof(int) * (size_t)o->cap);
        o->hi = xrealloc(o->hi, sizeof(int) * (size_t)o->cap);
    }
    size_t tail = (size_t)(o->n - i - 1);
    memmove(o->blk + i + 2, o->blk + i + 1, sizeof(int *) * tail);
    memmove(o->nb + i + 2, o->nb + i + 1, sizeof(int) * tail);
    memmove(o->lo + i + 2, o->lo + i + 1, sizeof(int) * tail);
    memmove(o->hi + i + 2, o->hi + i + 1, sizeof(int) * tail);
    o->blk[i + 1] = xmalloc(sizeof(int) * 2 * OFF_BLOCK);
    memcpy(o->blk[i + 1], b + OFF_BLOCK, sizeof(int) * OFF_BLOCK);
    o->nb[i] = o->nb[i + 1] = OFF_BLOCK;
    o->n++;
    byoff_bounds(o, m, i);
    byoff_bounds(o, m, i + 1);
}

static void byoff_free(ByOffset *o)
{
    for (int i = 0; i < o->n; i++)
        free(o->blk[i]);
    free(o->blk);
    free(o->nb);
    free(o->lo);
    free(o->hi);
}

/* True when op reads its operands at its own flat output index only. */
static bool same_index_op(const Op *op)
{
    return ir_opinfo[op->code].cls == OC_ELEMWISE && op->code != OP_CONST &&
           op->code != OP_IOTA;
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
    for (int k = 0; k < g->upd.n; k++)
        is_value[m->root[g->upd.v[k].value]] = true;
    for (int k = 0; k < g->upd.n; k++) {
        int T = g->upd.v[k].target, V = g->upd.v[k].value;
        const Tensor *v = &g->t.v[V];
        if (v->op < 0 || m->root[V] != V || m->persistent[V] || is_value[T])
            continue;
        bool taken = false;
        for (int q = 0; q < k; q++)
            if (m->inplace[q] && g->upd.v[q].value == V)
                taken = true;
        if (taken)
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
        m->root[V] = T;
        m->first[V] = m->last[V] = -1;
    }
    /* views of in-place values follow their root */
    for (int t = 0; t < nt; t++)
        m->root[t] = m->root[m->root[t]];
    free(is_value);

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
    Placed *conf = xmalloc(sizeof(Placed) * (size_t)(ntemps + 1));
    Overlaps ov = overlaps_build(m, temps, ntemps, n);
    bool *isplaced = xcalloc((size_t)nt + 1, sizeof(bool));
    int64_t *poff = xcalloc((size_t)nt + 1, sizeof(int64_t));
    int64_t high = 0;
    ByOffset byoff = {0};
    int64_t *asize = xmalloc(sizeof(int64_t) * (size_t)(nt + 1)); /* aligned sizes */
    for (int k = 0; k < ntemps; k++)
        asize[temps[k]] = align_up(m->bytes[temps[k]] ? m->bytes[temps[k]] : 1);
    for (int k = 0; k < ntemps; k++) {
        int t = temps[k];
        int64_t size = align_up(m->bytes[t] ? m->bytes[t] : 1);
        /* the placed storages whose live ranges meet t's */
        int nc = 0, a = m->first[t], b = m->last[t];
        /* how many temps, placed or not, meet t's range: O(log n) */
        int64_t meet = 0;
        for (int v = ov.leaves + a; v >= 1; v /= 2)
            meet += ov.soff[v + 1] - ov.soff[v];
        int fa = first_after(m, ov.by_first, ntemps, a);
        meet += first_after(m, ov.by_first, ntemps, b) - fa;
        for (int v = ov.leaves + a; v >= 1 && meet * 16 < byoff.placed; v /= 2)
            for (int q = ov.soff[v]; q < ov.soff[v + 1]; q++) {
                int u = ov.stab[q];
                if (isplaced[u])
                    conf[nc++] = (Placed){u, poff[u], asize[u]};
            }
        /* in offset order: sorted when they are few, else (a sort would cost
         * more than a walk) the same set from a walk of every placed temp in
         * offset order. Equal offsets may come in any order: the scan's
         * result is the same. */
        if (meet * 16 < byoff.placed) {
            for (int q = fa; q < ntemps; q++) {
                int u = ov.by_first[q];
                if (m->first[u] > b)
                    break;
                if (isplaced[u])
                    conf[nc++] = (Placed){u, poff[u], asize[u]};
            }
            qsort(conf, (size_t)nc, sizeof(Placed), cmp_off);
        } else {
            nc = 0;
            for (int i = 0; i < byoff.n; i++)
                for (int j = byoff.lo[i] > b || byoff.hi[i] < a ? byoff.nb[i] : 0;
                     j < byoff.nb[i]; j++) {
                    int u = byoff.blk[i][j];
                    if (m->first[u] <= b && m->last[u] >= a)
                        conf[nc++] = (Placed){u, poff[u], asize[u]};
                }
        }
        int64_t best = -1, best_gap = INT64_MAX, pos = 0;
        for (int q = 0; q < nc; q++) {
            int64_t gap = conf[q].off - pos;
            if (gap >= size && gap < best_gap) {
                best = pos;
                best_gap = gap;
            }
            if (ir_add_sat(conf[q].off, conf[q].size) > pos)
                pos = ir_add_sat(conf[q].off, conf[q].size);
        }
        if (best < 0)
            best = pos;
        isplaced[t] = true;
        poff[t] = best;
        byoff_insert(&byoff, m, poff, t);
        m->offset[t] = ir_add_sat(m->persistent_bytes, best);
        if (ir_add_sat(best, size) > high)
            high = ir_add_sat(best, size);
    }
    free(isplaced);
    free(poff);
    byoff_free(&byoff);
    free(asize);
    overlaps_free(&ov);
    m->arena_bytes = ir_add_sat(m->persistent_bytes, high);
    for (int t = 0; t < nt; t++)
        m->offset[t] = m->offset[m->root[t]];

    /* timeline: bytes live while each op runs */
    __int128 *delta = xcalloc((size_t)n + 2, sizeof *delta); /* sums of saturated sizes */
    for (int k = 0; k < ntemps; k++) {
        int t = temps[k];
        int64_t size = align_up(m->bytes[t] ? m->bytes[t] : 1);
        int a = m->first[t], b = m->last[t] >= n ? n - 1 : m->last[t];
        if (a < 0 || n == 0)
            continue;
        delta[a] += size;
        delta[b + 1] -= size;
    }
    __int128 cur = m->persistent_bytes;
    m->peak_live = m->persistent_bytes;
    m->peak_op = -1;
    for (int i = 0; i < n; i++) {
        cur += delta[i];
        m->live[i] = cur > INT64_MAX ? INT64_MAX : (int64_t)cur;
        if (m->live[i] > m->peak_live) {
            m->peak_live = m->live[i];
            m->peak_op = i;
        }
    }
    free(delta);
    free(temps);
    free(conf);
    free(gfirst);
    free(glast);
    free(internal);
    return m;
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
                m->root[t] != t ? (g->t.v[m->root[t]].op < 0 ? " (in place)" : " (view)") : "",
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
