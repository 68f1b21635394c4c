/* fuse.c - group ops into kernels (Op.group, printed as !group=N).
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
 * Before grouping, const, iota and broadcast ops read by several fusable
 * ops are cloned, one per consumer, so each is recomputed inside its
 * consumer's kernel instead of written to memory (they cost no arithmetic).
 * Reductions and GEMMs are never duplicated.
 *
 * A tensor is materialised (written to memory) exactly when something
 * outside its group reads it, or it is a graph output or update value
 * (pass_fuse_materialised). Groups are convex: no path leaves a group and
 * comes back, so each group can run as one kernel at one point of the
 * schedule (pass_schedule keeps the members of a group together).
 *
 * The loop domain of a group and the materialised tensors are computed in
 * fuse_domain.c; the statistics of a grouping (launches, bytes moved) and
 * the group lines of the --dump-after=fuse dump are in fuse_dump.c.
 */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- the pass -------------------------------------------------------------- */

typedef struct {
    VEC(int) ops;
    bool dead, multi;
} FGroup;

typedef struct {
    Graph *g;
    VEC(FGroup) gr;
    int *gof;          /* op -> group index, -1: unfused */
    int *vis_op, *vis_gr, stamp;
    VEC(int) stack;
    FuseMarks mk;
    char err[256];
    const int *uoff, *ucons; /* use lists of the graph being grouped */
    int upto;               /* ops [0, upto) have been visited by the main loop */
} Fuser;

/* Use lists: consumers of tensor t are cons[off[t] .. off[t+1]). */
typedef struct {
    int *off, *cons;
} Uses;

static Uses uses_build(const Graph *g)
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

static void uses_free(Uses *u)
{
    free(u->off);
    free(u->cons);
}

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
static void clone_cheap(Graph *g, int which)
{
    Uses u = uses_build(g);
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
    uses_free(&u);
    ir_compact(g);
}

/* True when op p depends on group T (through any path, where a path may
 * enter a group at one member and leave it from another: groups run as one
 * kernel). Visited marks persist within one stamp. */
static bool reaches(Fuser *f, int p, int T)
{
    Graph *g = f->g;
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

/* No path from A to B or B to A through ops outside A and B. */
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

static bool convex_union(Fuser *f, int A, int B)
{
    Graph *g = f->g;
    for (int side = 0; side < 2; side++) {
        int X = side ? B : A, Y = side ? A : B;
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
static bool col_ok(Fuser *f, const int *ops, int n)
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

static bool union_ok(Fuser *f, int A, int B)
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
        ok = col_ok(f, ops, n);
    free(ops);
    return ok;
}

static void do_union(Fuser *f, int A, int B)
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

static bool try_merge(Fuser *f, int A, int B)
{
    if (A == B || f->gr.v[A].dead || f->gr.v[B].dead || f->gr.v[A].multi || f->gr.v[B].multi)
        return false;
    if (remat_clash(f, A, B))
        return false;
    if (!union_ok(f, A, B) || !convex_union(f, A, B))
        return false;
    do_union(f, A, B);
    return true;
}

static int new_group(Fuser *f, int op)
{
    FGroup gr = {0};
    vec_push(&gr.ops, op);
    vec_push(&f->gr, gr);
    f->gof[op] = f->gr.n - 1;
    return f->gr.n - 1;
}

/* Materialised set of the current grouping (gof), by tensor. */
static bool *cur_materialised(Fuser *f)
{
    Graph *g = f->g;
    for (int i = 0; i < g->ops.n; i++)
        g->ops.v[i].group = f->gof[i];
    return pass_fuse_materialised(g);
}

/* Whether group G (live, not multi-tensor) is one COL loop nest; its
 * domain in *d. */
static bool col_group(Fuser *f, int G, FuseDomain *d)
{
    FGroup *gr = &f->gr.v[G];
    if (gr->dead || gr->multi)
        return false;
    f->mk.stamp++;
    for (int i = 0; i < gr->ops.n; i++)
        f->mk.mark[gr->ops.v[i]] = f->mk.stamp;
    return pass_fuse_domain_of(f->g, gr->ops.v, gr->ops.n, &f->mk, d, f->err, sizeof f->err) &&
           d->kind == FUSE_COL;
}

/* Whether group G is a COL group that would have to write a full-shape
 * tensor (a non-const member's result needed outside it): a column-order
 * kernel stores per-column results only (codegen/lower.c). */
static bool col_stores_full(Fuser *f, int G, const bool *mat)
{
    Graph *g = f->g;
    FGroup *gr = &f->gr.v[G];
    FuseDomain d;
    if (!col_group(f, G, &d))
        return false;
    for (int i = 0; i < gr->ops.n; i++) {
        const Op *op = &g->ops.v[gr->ops.v[i]];
        bool row;
        if (op->code != OP_MATMUL && op->code != OP_CONST && !pass_fuse_is_reduce(op) &&
            pass_fuse_fits(&d, &g->t.v[op->out].s, &row) && !row && mat[op->out])
            return true;
    }
    return false;
}

/* A COL group whose prologue is also needed elsewhere would have to write
 * full-shape tensors from a column-order kernel: split its reductions (and
 * what follows them) into a group of their own. */
static void split_col(Fuser *f)
{
    Graph *g = f->g;
    bool *mat = cur_materialised(f);
    int ngr = f->gr.n;
    for (int G = 0; G < ngr; G++) {
        if (!col_stores_full(f, G, mat))
            continue;
        FGroup *gr = &f->gr.v[G];
        /* the reductions and everything downstream of them move out */
        bool *down = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
        for (int i = 0; i < gr->ops.n; i++) { /* members are in program order */
            int o = gr->ops.v[i];
            const Op *op = &g->ops.v[o];
            bool d2 = pass_fuse_is_reduce(op);
            for (int j = 0; j < op->nin && !d2; j++) {
                int p = g->t.v[op->in[j]].op;
                d2 = p >= 0 && f->gof[p] == G && down[p];
            }
            down[o] = d2;
        }
        int NG = -1;
        VEC(int) keep = {0};
        for (int i = 0; i < f->gr.v[G].ops.n; i++) {
            int o = f->gr.v[G].ops.v[i];
            if (!down[o]) {
                vec_push(&keep, o);
                continue;
            }
            if (NG < 0) {
                NG = new_group(f, o);
            } else {
                vec_push(&f->gr.v[NG].ops, o);
                f->gof[o] = NG;
            }
        }
        /* consts feeding moved ops move with them */
        VEC(int) keep2 = {0};
        for (int i = 0; i < keep.n; i++) {
            int o = keep.v[i];
            const Op *op = &g->ops.v[o];
            bool mv = false;
            if (op->code == OP_CONST)
                for (int q = 0; q < g->ops.n && !mv; q++)
                    for (int j = 0; j < g->ops.v[q].nin; j++)
                        if (g->ops.v[q].in[j] == op->out && f->gof[q] == NG)
                            mv = true;
            if (mv) {
                vec_push(&f->gr.v[NG].ops, o);
                f->gof[o] = NG;
            } else {
                vec_push(&keep2, o);
            }
        }
        vec_free(&f->gr.v[G].ops);
        f->gr.v[G].ops.v = keep2.v;
        f->gr.v[G].ops.n = keep2.n;
        f->gr.v[G].ops.cap = keep2.cap;
        if (!keep2.n)
            f->gr.v[G].dead = true;
        vec_free(&keep);
        free(down);
    }
    free(mat);
}


static void move_op(Fuser *f, int o, int to)
{
    FGroup *from = &f->gr.v[f->gof[o]];
    int w = 0;
    for (int i = 0; i < from->ops.n; i++)
        if (from->ops.v[i] != o)
            from->ops.v[w++] = from->ops.v[i];
    from->ops.n = w;
    if (!w)
        from->dead = true;
    vec_push(&f->gr.v[to].ops, o);
    f->gof[o] = to;
}

static void sort_members(Fuser *f, int G);

/* A COL reduction takes over the elementwise ops that only it reads (the
 * prologue, e.g. dy * xhat of a LayerNorm weight gradient) from their
 * groups, when everything those ops read is in memory anyway: the product
 * is then never written. */
static void pull_col(Fuser *f)
{
    Graph *g = f->g;
    Uses u = uses_build(g);
    bool *keep = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int i = 0; i < g->outs.n; i++)
        keep[g->outs.v[i].t] = true;
    for (int i = 0; i < g->upd.n; i++)
        keep[g->upd.v[i].value] = true;
    int ngr = f->gr.n;
    for (int C = 0; C < ngr; C++) {
        FuseDomain dc;
        if (!col_group(f, C, &dc))
            continue;
        bool changed = true;
        while (changed) {
            changed = false;
            bool *mat = cur_materialised(f);
            FGroup *cg = &f->gr.v[C];
            for (int i = 0; i < cg->ops.n && !changed; i++) {
                const Op *y = &g->ops.v[cg->ops.v[i]];
                for (int j = 0; j < y->nin && !changed; j++) {
                    int t = y->in[j], x = g->t.v[t].op;
                    if (x < 0 || f->gof[x] < 0 || f->gof[x] == C || keep[t])
                        continue;
                    const Op *xo = &g->ops.v[x];
                    if (ir_opinfo[xo->code].cls != OC_ELEMWISE || xo->code == OP_CONST ||
                        f->gr.v[f->gof[x]].multi)
                        continue;
                    bool only = true;
                    for (int q = u.off[t]; q < u.off[t + 1]; q++)
                        if (u.cons[q] >= 0 && f->gof[u.cons[q]] != C)
                            only = false;
                    if (!only)
                        continue;
                    int G = f->gof[x];
                    bool ok = true;
                    for (int a = 0; a < xo->nin && ok; a++) {
                        int p = g->t.v[xo->in[a]].op;
                        if (p >= 0 && f->gof[p] == G && !mat[xo->in[a]] &&
                            g->ops.v[p].code != OP_CONST)
                            ok = false;
                    }
                    if (!ok)
                        continue;
                    /* tentatively move x (and the consts only it reads) */
                    move_op(f, x, C);
                    VEC(int) moved = {0};
                    for (int a = 0; a < xo->nin; a++) {
                        int p = g->t.v[xo->in[a]].op;
                        if (p >= 0 && f->gof[p] == G && g->ops.v[p].code == OP_CONST) {
                            bool sole = true;
                            for (int q = u.off[xo->in[a]]; q < u.off[xo->in[a] + 1]; q++)
                                if (u.cons[q] >= 0 && u.cons[q] != x)
                                    sole = false;
                            if (sole) {
                                move_op(f, p, C);
                                vec_push(&moved, p);
                            }
                        }
                    }
                    f->mk.stamp++;
                    FGroup *c2 = &f->gr.v[C];
                    for (int q = 0; q < c2->ops.n; q++)
                        f->mk.mark[c2->ops.v[q]] = f->mk.stamp;
                    FuseDomain d;
                    bool fit = pass_fuse_domain_of(g, c2->ops.v, c2->ops.n, &f->mk, &d, f->err,
                                         sizeof f->err) &&
                               pass_fuse_check_members(g, c2->ops.v, c2->ops.n, &f->mk, &d, f->err,
                                             sizeof f->err) &&
                               d.kind == FUSE_COL && col_ok(f, c2->ops.v, c2->ops.n);
                    if (!fit) { /* undo */
                        f->gr.v[G].dead = false;
                        move_op(f, x, G);
                        for (int q = 0; q < moved.n; q++)
                            move_op(f, moved.v[q], G);
                        sort_members(f, G);
                    } else {
                        changed = true;
                    }
                    vec_free(&moved);
                    sort_members(f, C);
                }
            }
            free(mat);
        }
    }
    free(keep);
    uses_free(&u);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

static void sort_members(Fuser *f, int G)
{
    FGroup *gr = &f->gr.v[G];
    qsort(gr->ops.v, (size_t)gr->ops.n, sizeof(int), cmp_int);
}

/* Groups that read the same tensor and share a domain: one kernel reads
 * it once (multi-output). */
static void merge_siblings(Fuser *f)
{
    Graph *g = f->g;
    Uses u = uses_build(g);
    for (int t = 0; t < g->t.n; t++) {
        int p = g->t.v[t].op;
        int pg = p >= 0 ? f->gof[p] : -1;
        if (shape_numel(&g->t.v[t].s) <= 1)
            continue; /* scalars (lr, clip scale) are read by every update */
        for (int a = u.off[t]; a < u.off[t + 1]; a++) {
            int ca = u.cons[a];
            if (ca < 0 || f->gof[ca] < 0)
                continue;
            for (int b = a + 1; b < u.off[t + 1]; b++) {
                int cb = u.cons[b];
                if (cb < 0 || f->gof[cb] < 0)
                    continue;
                int A = f->gof[ca], B = f->gof[cb];
                if (A == B || A == pg || B == pg)
                    continue;
                if (g->ops.v[ca].code == OP_MATMUL || g->ops.v[cb].code == OP_MATMUL)
                    continue;
                /* the same kind of group only: COL with COL, etc. */
                FuseDomain da, db;
                f->mk.stamp++;
                for (int i = 0; i < f->gr.v[A].ops.n; i++)
                    f->mk.mark[f->gr.v[A].ops.v[i]] = f->mk.stamp;
                if (!pass_fuse_domain_of(g, f->gr.v[A].ops.v, f->gr.v[A].ops.n, &f->mk, &da, f->err,
                               sizeof f->err))
                    continue;
                f->mk.stamp++;
                for (int i = 0; i < f->gr.v[B].ops.n; i++)
                    f->mk.mark[f->gr.v[B].ops.v[i]] = f->mk.stamp;
                if (!pass_fuse_domain_of(g, f->gr.v[B].ops.v, f->gr.v[B].ops.n, &f->mk, &db, f->err,
                               sizeof f->err))
                    continue;
                if (da.kind != db.kind || da.k != db.k || !shape_dims_eq(&da.S, &db.S))
                    continue;
                if (try_merge(f, A, B))
                    sort_members(f, A);
            }
        }
    }
    uses_free(&u);
}

/* Whether group G lowers to one kernel as codegen/lower.c builds it: each
 * connected part (in-group edges; a GEMM's consumers hang off it but the
 * GEMM is no part's member) has one domain (pass_fuse_domain), and a
 * column part stores per-column results only. */
static bool group_lowers(Fuser *f, int G, const bool *mat)
{
    Graph *g = f->g;
    FGroup *gr = &f->gr.v[G];
    int n = gr->ops.n;
    if (gr->dead || !n)
        return true;
    const int *ops = gr->ops.v;
    int *uf = xmalloc(sizeof(int) * (size_t)n), *part = xmalloc(sizeof(int) * (size_t)n);
    pass_fuse_parts(g, ops, n, uf);
    bool ok = true;
    for (int r = 0; r < n && ok; r++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (uf[i] == r && g->ops.v[ops[i]].code != OP_MATMUL)
                part[m++] = ops[i];
        if (!m)
            continue;
        FuseDomain d;
        char err[256];
        if (!pass_fuse_domain(g, part, m, &d, err, sizeof err)) {
            ok = false;
            break;
        }
        for (int i = 0; i < m && d.kind == FUSE_COL; i++) {
            const Op *op = &g->ops.v[part[i]];
            bool row;
            if (!pass_fuse_is_reduce(op) && pass_fuse_fits(&d, &g->t.v[op->out].s, &row) &&
                !row && mat[op->out])
                ok = false;
        }
    }
    free(uf);
    free(part);
    return ok;
}

/* The last word: a group that would not lower to one kernel is not fused,
 * its ops run as kernels of their own. The grouping steps keep this from
 * happening in the models; it catches what they miss (a column group that
 * would have to write a full-shape tensor downstream of its reductions, a
 * sibling merge that leaves a column max in a part of its own). */
static void drop_unlowerable(Fuser *f)
{
    /* a dropped group changes what the others must write: until none drops */
    for (bool changed = true; changed;) {
        changed = false;
        bool *mat = cur_materialised(f);
        for (int G = 0; G < f->gr.n && !changed; G++) {
            if (group_lowers(f, G, mat))
                continue;
            FGroup *gr = &f->gr.v[G];
            for (int i = 0; i < gr->ops.n; i++)
                f->gof[gr->ops.v[i]] = -1;
            gr->ops.n = 0;
            gr->dead = true;
            changed = true;
        }
        free(mat);
    }
}

/* One group's ops all come from the optimizer and it writes update values
 * or feeds only the gradient norm: candidates for a multi-tensor kernel.
 * kind: 0 elementwise update chains, 1 squared-gradient sums. */
static int optim_kind(Fuser *f, int G)
{
    Graph *g = f->g;
    FGroup *gr = &f->gr.v[G];
    if (gr->dead || gr->multi)
        return -1;
    bool red = false;
    for (int i = 0; i < gr->ops.n; i++) {
        const Op *op = &g->ops.v[gr->ops.v[i]];
        if (!(op->flags & OPF_OPTIM) && op->code != OP_CONST)
            return -1;
        if (op->code == OP_MATMUL)
            return -1;
        red |= pass_fuse_is_reduce(op);
    }
    f->mk.stamp++;
    for (int i = 0; i < gr->ops.n; i++)
        f->mk.mark[gr->ops.v[i]] = f->mk.stamp;
    FuseDomain d;
    if (!pass_fuse_domain_of(g, gr->ops.v, gr->ops.n, &f->mk, &d, f->err, sizeof f->err))
        return -1;
    if (!red && d.kind == FUSE_ELEM && d.S.rank >= 1)
        return 0;
    if (red && d.kind == FUSE_ROW && d.k == 0)
        return 1;
    return -1;
}

/* Merges mutually independent optimizer groups into one multi-tensor group
 * per kind (several loop nests in one kernel). */
static void merge_multi(Fuser *f)
{
    for (int kind = 0; kind < 2; kind++) {
        int M = -1;
        for (int G = 0; G < f->gr.n; G++) {
            if (optim_kind(f, G) != kind)
                continue;
            if (M < 0) {
                M = G;
                continue;
            }
            if (!convex_union(f, M, G))
                continue;
            /* independent: neither reads the other */
            bool dep = false;
            Graph *g = f->g;
            for (int s = 0; s < 2 && !dep; s++) {
                FGroup *x = &f->gr.v[s ? M : G];
                int Y = s ? G : M;
                for (int i = 0; i < x->ops.n && !dep; i++) {
                    const Op *op = &g->ops.v[x->ops.v[i]];
                    for (int j = 0; j < op->nin; j++) {
                        int p = g->t.v[op->in[j]].op;
                        if (p >= 0 && f->gof[p] == Y)
                            dep = true;
                    }
                }
            }
            if (dep)
                continue;
            do_union(f, M, G);
            f->gr.v[M].multi = true;
            sort_members(f, M);
        }
    }
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
    bool leaf = !op || op->group != c->G || op->code == OP_MATMUL || pass_fuse_is_reduce(op) ||
                (c->pinned[t] && op->code != OP_CONST);
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
static void recompute_cheap(Graph *g)
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
    Chain c = {.g = g, .pinned = pinned, .nt0 = nt0};
    c.seen = xcalloc((size_t)nt0 + 1, sizeof(int));
    Uses u = uses_build(g);
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
        /* clone the chain into each reader's group, producers first */
        qsort(c.chain.v, (size_t)c.chain.n, sizeof(int), cmp_int);
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
    uses_free(&u);
    free(c.seen);
    vec_free(&c.chain);
    vec_free(&c.leaves);
    free(hkey_op);
    free(hkey_g);
    free(hval);
    free(pinned);
    free(mat);
    ir_compact(g);
}

bool pass_fuse(Graph *g, const PassOpts *o, Diag *d)
{
    (void)d;
    for (int i = 0; i < g->ops.n; i++)
        g->ops.v[i].group = -1;
    if (o && o->no_fuse)
        return true;
    clone_cheap(g, 0);
    clone_cheap(g, 1);
    int n = g->ops.n;
    Fuser f = {.g = g};
    Uses fu = uses_build(g);
    f.uoff = fu.off;
    f.ucons = fu.cons;
    f.upto = n;
    f.gof = xmalloc(sizeof(int) * (size_t)(n + 1));
    f.vis_op = xcalloc((size_t)n + 1, sizeof(int));
    f.mk.mark = xcalloc((size_t)n + 1, sizeof(int));
    for (int i = 0; i < n; i++)
        f.gof[i] = -1;
    int grcap = 2 * n + 2; /* groups: one per op, plus splits */
    f.vis_gr = xcalloc((size_t)grcap, sizeof(int));

    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        f.upto = i + 1;
        if (!pass_fuse_op_fusable(g, op))
            continue;
        int G = new_group(&f, i);
        if (f.gr.n >= grcap)
            die("fuse: more groups than ops");
        /* a GEMM heads its group; consts and broadcasts wait for their
         * consumer, which pulls them (and their producers) in */
        int k;
        if (op->code == OP_MATMUL || op->code == OP_CONST || op->code == OP_BROADCAST ||
            (pass_fuse_is_reduce(op) && pass_fuse_reduce_pattern(g, op, &k) == FUSE_COL))
            continue; /* COL reductions take their prologue later (pull_col) */
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            if (p >= 0 && f.gof[p] >= 0)
                try_merge(&f, G, f.gof[p]);
        }
        /* producers of pulled-in broadcasts */
        for (int q = 0; q < f.gr.v[G].ops.n; q++) {
            const Op *b = &g->ops.v[f.gr.v[G].ops.v[q]];
            if (b->code != OP_BROADCAST)
                continue;
            int p = g->t.v[b->in[0]].op;
            if (p >= 0 && f.gof[p] >= 0 && f.gof[p] != G)
                try_merge(&f, G, f.gof[p]);
        }
        sort_members(&f, G);
    }
    f.upto = n;
    split_col(&f);
    pull_col(&f);
    merge_siblings(&f);
    merge_multi(&f);
    drop_unlowerable(&f);

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
    for (int G = 0; G < f.gr.n; G++)
        vec_free(&f.gr.v[G].ops);
    vec_free(&f.gr);
    vec_free(&f.stack);
    free(f.gof);
    free(f.vis_op);
    free(f.vis_gr);
    free(f.mk.mark);
    uses_free(&fu);
    recompute_cheap(g);
    return true;
}
