/* schedule.c - the final op order.
 *
 * Works on units: a fuse group (every op with one Op.group, run as one
 * kernel) or a single op. Starts from program order (already topological)
 * with each unit at the place of its last member, so no op ever moves
 * earlier than it was (recomputed ops from remat stay where remat put
 * them, next to their use); then sinks each unit whose results are larger
 * than all its computed operands together to just before its first
 * consumer. Units that only feed graph outputs or updates sink to the end.
 * The members of a group come out contiguous, in program order. Sinking
 * shortens the result's live range and never lengthens a live range more
 * than the unit's own results would have been live. A unit between a
 * scalar all-reduce's start and its wait does not sink: it hides the
 * all-reduce (zero=1's global norm, passes/comm.c); nor does an optimizer
 * unit between a reduce-scatter bucket's start and its wait (zero=1's
 * params' shard_pack, which hides the last buckets). Last, each
 * attention_lse moves to right after its sibling attention op (same q, k and
 * attrs), so the backend computes both in one kernel (codegen/plan.c); that
 * lengthens only the lse's own small [..., T, 1] life. Before that, the
 * one exception to "never earlier": small ungrouped ops that read a fuse
 * group's operand after the group, and could run before it, move in front
 * of it when that makes the group the operand's last reader
 * (hoist_readers: memplan may then write a result over it). Before
 * that, the weight-gradient GEMMs that can move up to a tensor-parallel
 * collective do, to run while it is in flight (overlap_tp). */
#include "passes.h"

#include <stdlib.h>

typedef struct {
    const Graph *g;
    int *unit;      /* op -> unit */
    int *ustart, *uops; /* unit u's ops: uops[ustart[u] .. ustart[u+1]) */
    int *order;     /* emitted op indices */
    int norder;
    bool *emitted;  /* per unit */
    bool *deferred; /* per unit */
    int *stack;
    int *pos;       /* per unit: scan position in its operands */
} Sched;

/* Emits unit root after first emitting the units its members read
 * (iteratively, so long chains do not recurse). */
static void emit(Sched *s, int root)
{
    const Graph *g = s->g;
    int sp = 0;
    s->stack[sp++] = root;
    while (sp) {
        int u = s->stack[sp - 1];
        if (s->emitted[u]) {
            sp--;
            continue;
        }
        bool ready = true;
        for (int q = s->ustart[u]; q < s->ustart[u + 1] && ready; q++) {
            const Op *op = &g->ops.v[s->uops[q]];
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p >= 0 && s->unit[p] != u && !s->emitted[s->unit[p]]) {
                    s->stack[sp++] = s->unit[p];
                    ready = false;
                    break;
                }
            }
        }
        if (!ready)
            continue;
        sp--;
        s->emitted[u] = true;
        for (int q = s->ustart[u]; q < s->ustart[u + 1]; q++)
            s->order[s->norder++] = s->uops[q];
    }
}

/* Whether l is the attention_lse of attention op a: same q, k, bias or
 * mask operand and every attribute (two head-layout groups reading one qkv
 * tensor at different offsets share q, k, causal and scale; two attentions
 * may differ in their bias alone), as codegen's cg_attn_partner. */
static bool attn_siblings(const Op *a, const Op *l)
{
    return a->code == OP_ATTENTION && l->code == OP_ATTENTION_LSE && a->in[0] == l->in[0] &&
           a->in[1] == l->in[1] && ir_attn_same_attrs(&a->attr, &l->attr) &&
           ir_attn_bias_in(a) == ir_attn_bias_in(l);
}

/* Moves each attention_lse in order[0..n) to right after its sibling
 * attention op, when no op between them reads the lse. */
static void pair_attention(const Graph *g, int *order, int n)
{
    for (int pl = 0; pl < n; pl++) {
        const Op *l = &g->ops.v[order[pl]];
        if (l->code != OP_ATTENTION_LSE)
            continue;
        int pa = -1;
        for (int k = 0; k < n && pa < 0; k++)
            if (attn_siblings(&g->ops.v[order[k]], l))
                pa = k;
        if (pa < 0 || pa + 1 == pl)
            continue;
        int x = order[pl];
        if (pa < pl) { /* up: its operands q, k precede the attention op */
            for (int k = pl; k > pa + 1; k--)
                order[k] = order[k - 1];
            order[pa + 1] = x;
            continue;
        }
        bool read = false; /* down: only past ops that do not read it */
        for (int k = pl + 1; k <= pa && !read; k++)
            for (int j = 0; j < g->ops.v[order[k]].nin; j++)
                read |= g->ops.v[order[k]].in[j] == l->out;
        if (read)
            continue;
        for (int k = pl; k < pa; k++)
            order[k] = order[k + 1];
        order[pa] = x;
        pl--; /* the op now at pl is unvisited */
    }
}

/* Whether op op_i may run at position p of order, before its own: an
 * ungrouped elementwise, move or reduce op (not random, not recomputed:
 * remat put it next to its use) whose
 * operands are all defined before p, with a result smaller than bytes. */
static bool hoistable(const Graph *g, const int *pos, int p, int op_i, int64_t bytes)
{
    const Op *y = &g->ops.v[op_i];
    OpClass c = ir_opinfo[y->code].cls;
    if (y->group >= 0 || (y->flags & OPF_RECOMPUTE) ||
        (c != OC_ELEMWISE && c != OC_MOVE && c != OC_REDUCE) ||
        shape_bytes(&g->t.v[y->out].s) >= bytes)
        return false;
    for (int j = 0; j < y->nin; j++) {
        int d = g->t.v[y->in[j]].op;
        if (d >= 0 && pos[d] >= p)
            return false;
    }
    return true;
}

/* Moves the small ops that order leaves after a fuse group but that could
 * run before it (hoistable) in front of it, when they are all that reads
 * one of the group's operands after it and the group has a result of that
 * operand's shape and dtype: the group then ends the operand's life and
 * memplan may write that result over it (the cross-entropy's take_along of
 * the target logits goes before the kernel that writes dlogits over the
 * logits: one logits-sized buffer instead of two). The members of a group
 * stay contiguous; a moved op only moves earlier, past ops that define
 * none of its operands. */
static void hoist_readers(const Graph *g, int *order, int n)
{
    int nt = g->t.n;
    int *pos = xmalloc(sizeof(int) * (size_t)(n + 1));
    int *lastpos = xmalloc(sizeof(int) * (size_t)(nt + 1));
    int *tmp = xmalloc(sizeof(int) * (size_t)(n + 1));
    int *sel = xmalloc(sizeof(int) * (size_t)(n + 1));
    bool *mv = xcalloc((size_t)n + 1, sizeof(bool)); /* per op: to move */
    /* readers of each tensor (ops, in op order): readers[rstart[t] .. rstart[t+1]) */
    int *rstart = xcalloc((size_t)nt + 2, sizeof(int)), nr = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            rstart[g->ops.v[i].in[j] + 1]++, nr++;
    for (int t = 0; t < nt; t++)
        rstart[t + 1] += rstart[t];
    int *readers = xmalloc(sizeof(int) * (size_t)(nr + 1)), *fill = xcalloc((size_t)nt + 1, sizeof(int));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++) {
            int t = g->ops.v[i].in[j];
            bool dup = fill[t] && readers[rstart[t] + fill[t] - 1] == i;
            if (!dup)
                readers[rstart[t] + fill[t]++] = i;
        }
    bool fresh = false;
    for (int p = 0; p < n;) {
        if (!fresh) {
            for (int k = 0; k < n; k++)
                pos[order[k]] = k;
            for (int t = 0; t < nt; t++)
                lastpos[t] = -1;
            for (int k = 0; k < n; k++) {
                const Op *x = &g->ops.v[order[k]];
                for (int j = 0; j < x->nin; j++)
                    lastpos[x->in[j]] = k;
            }
            fresh = true;
        }
        int G = g->ops.v[order[p]].group, q = p;
        if (G < 0) {
            p++;
            continue;
        }
        while (q + 1 < n && g->ops.v[order[q + 1]].group == G)
            q++;
        int nmv = 0;
        for (int k = p; k <= q; k++) {
            const Op *x = &g->ops.v[order[k]];
            for (int j = 0; j < x->nin; j++) {
                int I = x->in[j], d = g->t.v[I].op;
                if (d < 0 || pos[d] >= p || lastpos[I] <= q)
                    continue;
                int64_t bytes = shape_bytes(&g->t.v[I].s);
                bool ok = true;
                int nsel = 0; /* I's readers after the group, in sel[0..nsel) */
                for (int e = rstart[I]; e < rstart[I] + fill[I] && ok; e++) {
                    int r = readers[e];
                    if (pos[r] <= q || mv[r])
                        continue;
                    ok = hoistable(g, pos, p, r, bytes);
                    sel[nsel++] = r;
                }
                /* and a result of I's shape and dtype */
                bool match = false;
                for (int r = p; r <= q && ok && nsel && !match; r++)
                    match = shape_eq(&g->t.v[g->ops.v[order[r]].out].s, &g->t.v[I].s);
                for (int k2 = 0; k2 < nsel && match; k2++) {
                    mv[sel[k2]] = true;
                    nmv++;
                }
            }
        }
        if (!nmv) {
            p = q + 1;
            continue;
        }
        /* order[p..n): the moved ops (in order), the group, the rest */
        int w = 0;
        for (int k = q + 1; k < n; k++)
            if (mv[order[k]])
                tmp[w++] = order[k];
        for (int k = p; k < n; k++)
            if (!mv[order[k]])
                tmp[w++] = order[k];
        for (int k = 0; k < w; k++) {
            mv[tmp[k]] = false;
            order[p + k] = tmp[k];
        }
        p += nmv + (q - p + 1);
        fresh = false;
    }
    free(pos);
    free(lastpos);
    free(tmp);
    free(sel);
    free(rstart);
    free(readers);
    free(fill);
    free(mv);
}

static bool tp_collective(Opcode c)
{
    return c == OP_TP_ALLREDUCE || c == OP_TP_ALL_GATHER || c == OP_TP_REDUCE_SCATTER;
}

/* Moves, right after each tensor-parallel collective of order[0..n), the
 * units holding a weight-gradient GEMM (ir_wgrad_matmul; with grad_accum
 * also those of its result's sum with the accumulator and of the mean,
 * which go with it) that order puts after the
 * collective's first reader but whose operands are all defined by then,
 * and those it puts before the collective (since the previous one) that
 * nothing up to the collective reads:
 * the runtime starts the collective and waits for it at its first reader
 * (runtime/exec.c), so these GEMMs run while it is in flight (Megatron's
 * overlap of the weight gradients with the input gradient's all-reduce).
 * Units move whole, earlier past ops that define none of their operands,
 * later past ops that read none of their results; a GEMM moved earlier
 * has its result (a param's gradient) live longer and its operands
 * (activations) shorter, one moved later the reverse. */
static void overlap_tp(const Graph *g, const int *unit, int *order, int n)
{
    bool any = false;
    for (int i = 0; i < n && !any; i++)
        any = tp_collective(g->ops.v[i].code);
    if (!any)
        return;
    int *pos = xmalloc(sizeof(int) * (size_t)(n + 1));
    int *tmp = xmalloc(sizeof(int) * (size_t)(n + 1));
    char *mv = xcalloc((size_t)n + 1, 1); /* per op: moves from before (1), after (2) */
    bool *wg = xcalloc((size_t)n + 1, sizeof(bool)); /* per op: in a wgrad unit */
    bool *uw = xcalloc((size_t)n + 1, sizeof(bool));  /* per unit: holds a wgrad GEMM */
    IrReaders rd;
    ir_readers_build(g, &rd);
    for (int i = 0; i < n; i++) {
        int acc[3];
        if (ir_wgrad_matmul(g, &rd, i, acc)) {
            uw[unit[i]] = true;
            for (int a = 0; a < 3; a++) /* grad_accum's sum and mean go with it */
                if (acc[a] >= 0)
                    uw[unit[acc[a]]] = true;
        }
    }
    for (int k = 0; k < n; k++)
        wg[k] = uw[unit[k]];
    ir_readers_free(&rd);
    free(uw);
    int lo = 0; /* past the last collective: what earlier ones left alone */
    for (int p = 0; p < n; p++) {
        const Op *c = &g->ops.v[order[p]];
        if (!tp_collective(c->code))
            continue;
        for (int k = 0; k < n; k++)
            pos[order[k]] = k;
        /* before it, since the last collective: the units it does not
         * wait for (nothing up to it reads them but units that move too:
         * grad_accum's sum of a GEMM's result) move after it; last first */
        int nb = 0;
        for (int e = p - 1; e >= lo;) {
            int u = unit[order[e]], k = e;
            while (k - 1 >= lo && unit[order[k - 1]] == u)
                k--;
            bool ok = wg[order[k]];
            for (int q = e + 1; q <= p && ok; q++) {
                const Op *x = &g->ops.v[order[q]];
                for (int j = 0; j < x->nin && ok && mv[order[q]] != 1; j++) {
                    int d = g->t.v[x->in[j]].op;
                    ok = d < 0 || pos[d] < k || pos[d] > e;
                }
            }
            for (int q = k; q <= e && ok; q++, nb++)
                mv[order[q]] = 1;
            e = k - 1;
        }
        int first = n; /* the collective's first reader */
        for (int k = p + 1; k < n && first == n; k++)
            for (int j = 0; j < g->ops.v[order[k]].nin; j++)
                if (g->ops.v[order[k]].in[j] == c->out)
                    first = k;
        /* after its first reader: the units whose operands are all ready */
        int na = 0;
        for (int k = first + 1; k < n;) {
            int u = unit[order[k]], e = k;
            while (e + 1 < n && unit[order[e + 1]] == u)
                e++;
            bool ok = wg[order[k]];
            for (int q = k; q <= e && ok; q++) {
                const Op *x = &g->ops.v[order[q]];
                for (int j = 0; j < x->nin && ok; j++) {
                    int d = g->t.v[x->in[j]].op;
                    ok = d < 0 || (unit[d] == u && pos[d] >= k) || pos[d] <= p || mv[d] == 2;
                }
            }
            for (int q = k; q <= e && ok; q++, na++)
                mv[order[q]] = 2;
            k = e + 1;
        }
        if (nb + na) { /* order[lo..n): the rest before it, it, the moved, the rest */
            int w = 0;
            for (int k = lo; k < p; k++)
                if (!mv[order[k]])
                    tmp[w++] = order[k];
            int at = lo + w;
            tmp[w++] = order[p];
            for (int want = 1; want <= 2; want++)
                for (int k = lo; k < n; k++)
                    if (mv[order[k]] == want)
                        tmp[w++] = order[k];
            for (int k = p + 1; k < n; k++)
                if (!mv[order[k]])
                    tmp[w++] = order[k];
            for (int k = 0; k < w; k++) {
                mv[tmp[k]] = 0;
                order[lo + k] = tmp[k];
            }
            p = at + nb + na;
        }
        lo = p + 1;
    }
    free(pos);
    free(tmp);
    free(mv);
    free(wg);
}

bool pass_schedule(Graph *g, const PassOpts *o, Diag *d)
{
    (void)o;
    (void)d;
    int n = g->ops.n;
    if (n == 0)
        return true;
    Sched s = {.g = g};
    s.unit = xmalloc(sizeof(int) * (size_t)(n + 1));
    int ngroups = 0;
    for (int i = 0; i < n; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    int *gunit = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    for (int i = 0; i < ngroups; i++)
        gunit[i] = -1;
    int nu = 0;
    for (int i = 0; i < n; i++) {
        int gr = g->ops.v[i].group;
        if (gr < 0) {
            s.unit[i] = nu++;
        } else {
            if (gunit[gr] < 0)
                gunit[gr] = nu++;
            s.unit[i] = gunit[gr];
        }
    }
    s.ustart = xcalloc((size_t)nu + 2, sizeof(int));
    s.uops = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        s.ustart[s.unit[i] + 1]++;
    for (int u = 0; u < nu; u++)
        s.ustart[u + 1] += s.ustart[u];
    int *fill = xcalloc((size_t)nu + 1, sizeof(int));
    int *last = xmalloc(sizeof(int) * (size_t)(nu + 1));
    for (int i = 0; i < n; i++) {
        int u = s.unit[i];
        s.uops[s.ustart[u] + fill[u]++] = i;
        last[u] = i;
    }
    s.order = xmalloc(sizeof(int) * (size_t)(n + 1));
    s.emitted = xcalloc((size_t)nu + 1, sizeof(bool));
    s.deferred = xcalloc((size_t)nu + 1, sizeof(bool));
    s.stack = xmalloc(sizeof(int) * (size_t)(nu + 1) * 2);
    for (int u = 0; u < nu; u++) {
        /* sinking can extend each operand's life: only worth it when the
         * results outweigh all of them */
        int64_t out = 0, freed = 0;
        for (int q = s.ustart[u]; q < s.ustart[u + 1]; q++) {
            const Op *op = &g->ops.v[s.uops[q]];
            const Tensor *r = &g->t.v[op->out];
            out = ir_add_sat(out, shape_bytes(&r->s));
            for (int j = 0; j < op->nin; j++) {
                const Tensor *x = &g->t.v[op->in[j]];
                if (x->op >= 0 && s.unit[x->op] != u)
                    freed = ir_add_sat(freed, shape_bytes(&x->s));
            }
        }
        s.deferred[u] = out > freed;
    }
    /* a unit that program order puts between a collective's start and its
     * wait stays where it is, when it is the compute that hides the
     * collective: any unit between the optimizer's scalar all-reduce
     * start and its wait (zero=1: the shard_pack that the comm pass moves
     * there; zero=0's gradient buckets keep the sinking), and an optimizer
     * unit between a reduce-scatter bucket's start and its wait (zero=1:
     * the params' shard_pack, which comm.c puts before the waits to hide
     * the last buckets) */
    for (int i = 0; i < n; i++) {
        const Op *st = &g->ops.v[i];
        bool rs = st->code == OP_REDUCE_SCATTER_START;
        int def = st->code == OP_ALLREDUCE_START && st->nin == 1 ? g->t.v[st->in[0]].op : -1;
        bool scalar = def >= 0 && (g->ops.v[def].flags & OPF_OPTIM) &&
                      shape_numel(&g->t.v[st->in[0]].s) == 1;
        if (!rs && !scalar)
            continue;
        Opcode wait = rs ? OP_REDUCE_SCATTER_WAIT : OP_ALLREDUCE_WAIT;
        for (int k = i + 1; k < n; k++) {
            const Op *w = &g->ops.v[k];
            if (w->code == wait && w->in[0] == st->out)
                break;
            if (scalar || (w->flags & OPF_OPTIM))
                s.deferred[s.unit[k]] = false;
        }
    }
    for (int i = 0; i < n; i++) {
        int u = s.unit[i];
        if (last[u] != i || s.deferred[u])
            continue;
        emit(&s, u);
    }
    for (int i = 0; i < n; i++)
        if (last[s.unit[i]] == i && !s.emitted[s.unit[i]])
            emit(&s, s.unit[i]);

    overlap_tp(g, s.unit, s.order, n);
    hoist_readers(g, s.order, n);
    pair_attention(g, s.order, n);
    ir_reorder_ops(g, s.order, n);
    free(s.order);
    free(s.emitted);
    free(s.deferred);
    free(s.stack);
    free(s.unit);
    free(s.ustart);
    free(s.uops);
    free(fill);
    free(last);
    free(gunit);
    ir_compact(g);
    return true;
}
