/* fuse_grow.c - step 2 of the fuse pass, the first grouping: in program
 * order each fusable op starts a group and merges its producers' groups,
 * then the producers of the broadcasts the group pulled in, each merge
 * under pass_fuse_try_merge's rules (one loop domain every member fits,
 * forward ops apart from recomputations, convex).
 *
 * Near-linear in the ops, where merging groups one by one through
 * pass_fuse_try_merge costs the size of both groups per merge (a chain of
 * n adds is one group that every add joins: n^2/2). Here:
 *   - each group keeps a summary (GSum) of what the union checks need:
 *     its domain, whether it holds a reduction, a non-const op, matmuls,
 *     forward ops, recomputations, and one input shape of a broadcast whose
 *     input a member computes (the one that can make a ROW domain). The
 *     union's domain comes from the two summaries, and only the members
 *     whose check can change are checked: all of the smaller group, and
 *     the larger group's readers of the smaller one's results (the larger
 *     group's other members passed its own domain, and it is the union's
 *     too) and, after those, all of it when the union's domain differs
 *     (a union that fails there fails at its first member that does not
 *     fit: a group of scalars that every update reads costs one check);
 *   - a merge moves the smaller group's members (union by size), so the
 *     merged group may live at the larger one's index during the loop;
 *   - the broadcasts whose input another group computes are kept per group
 *     in the order the merge loop visits them (GSum.pend);
 *   - members are sorted once at the end, and each group is put back at
 *     the index pass_fuse_try_merge would have left it at: the group made
 *     for its last member op (canonical_ids).
 * Column domains, and a group whose summary is not known to pass, take the
 * full check (pass_fuse_union_ok). The result, by group index and members,
 * is the one pass_fuse_try_merge makes: the domain of a union that passes
 * does not depend on the order of its members, and a union that fails
 * fails under either order (test_fuse and the model dumps check this). */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    bool ok;            /* the members form domain d and each fits it */
    FuseDomain d;
    bool hasred, hasnc; /* a reduction, a non-const member */
    bool hasbc;         /* bc: the input of a member broadcast that a non-const */
    Shape bc;           /* member computes (all such inputs match when ok) */
    int nmm;            /* matmul members */
    int64_t nout, nin;  /* the members' readers (use list entries), operands */
    bool fwd, rec;      /* forward ops / recomputations (remat_clash) */
    VEC(int) pend;      /* broadcast members whose input another group computes */
} GSum;

typedef struct {
    Fuser *f;
    GSum *s;       /* per group index */
    int *born;     /* op -> the group its step made, -1 */
    VEC(int) R;    /* members to check */
} Grow;

/* Group G's summary as the group of op i alone. */
static void sum_init(Grow *w, int G, int i)
{
    Fuser *f = w->f;
    const Graph *g = f->g;
    const Op *op = &g->ops.v[i];
    GSum *s = &w->s[G];
    memset(s, 0, sizeof *s);
    FuseMarks m = {.gof = f->gof, .ga = G, .gb = G};
    s->ok = pass_fuse_domain_of(g, &i, 1, &m, &s->d, f->err, sizeof f->err) &&
            pass_fuse_check_members(g, &i, 1, &m, &s->d, f->err, sizeof f->err) &&
            s->d.kind != FUSE_COL;
    s->hasred = pass_fuse_is_reduce(op);
    s->hasnc = op->code != OP_CONST;
    s->nmm = op->code == OP_MATMUL;
    s->nout = f->uoff[op->out + 1] - f->uoff[op->out];
    s->nin = op->nin;
    s->rec = (op->flags & OPF_RECOMPUTE) != 0;
    s->fwd = !(op->flags & (OPF_RECOMPUTE | OPF_BACKWARD | OPF_OPTIM)) && op->code != OP_CONST &&
             op->code != OP_IOTA && op->code != OP_BROADCAST;
    if (op->code == OP_BROADCAST) {
        int p = g->t.v[op->in[0]].op;
        if (p >= 0 && f->gof[p] >= 0 && f->gof[p] != G)
            vec_push(&s->pend, i);
    }
}

/* Whether broadcast member o of the union of A and B reads a non-const
 * op of the union: its input shape then, else NULL. */
static const Shape *union_bc(const Fuser *f, int o, int A, int B)
{
    const Graph *g = f->g;
    const Op *op = &g->ops.v[o];
    if (op->code != OP_BROADCAST)
        return NULL;
    int p = g->t.v[op->in[0]].op;
    if (p < 0 || (f->gof[p] != A && f->gof[p] != B) || g->ops.v[p].code == OP_CONST)
        return NULL;
    return &g->t.v[op->in[0]].s;
}

static bool domain_eq(const FuseDomain *a, const FuseDomain *b)
{
    return a->kind == b->kind && a->k == b->k && a->S.dtype == b->S.dtype &&
           shape_dims_eq(&a->S, &b->S);
}

/* The union of A and B (both summaries ok) by its summaries: 1 when it is
 * one domain (*d) every member fits, 0 when not, -1 when the full check
 * must decide (a column domain). *bc: a broadcast input as GSum.bc, or
 * NULL. Leaves w->R holding the smaller group and its readers. */
static int fast_union(Grow *w, int A, int B, FuseDomain *d, const Shape **bc)
{
    Fuser *f = w->f;
    const Graph *g = f->g;
    const GSum *a = &w->s[A], *b = &w->s[B];
    int L = f->gr.v[A].ops.n >= f->gr.v[B].ops.n ? A : B, S = L == A ? B : A;
    /* R: the smaller group and the larger one's readers of its results */
    w->R.n = 0;
    f->mk.stamp++;
    const FGroup *gs = &f->gr.v[S];
    for (int i = 0; i < gs->ops.n; i++) {
        f->mk.mark[gs->ops.v[i]] = f->mk.stamp;
        vec_push(&w->R, gs->ops.v[i]);
    }
    /* from the smaller group's readers or from the larger group's
     * operands, whichever are fewer (a group holding the clip scale, which
     * every update reads, is tried against each update) */
    if (w->s[S].nout <= w->s[L].nin) {
        for (int i = 0; i < gs->ops.n; i++) {
            int t = g->ops.v[gs->ops.v[i]].out;
            for (int k = f->uoff[t]; k < f->uoff[t + 1]; k++) {
                int c = f->ucons[k];
                if (c >= 0 && f->gof[c] == L && f->mk.mark[c] != f->mk.stamp) {
                    f->mk.mark[c] = f->mk.stamp;
                    vec_push(&w->R, c);
                }
            }
        }
    } else {
        const FGroup *gl = &f->gr.v[L];
        for (int i = 0; i < gl->ops.n; i++) {
            int c = gl->ops.v[i];
            const Op *op = &g->ops.v[c];
            for (int j = 0; j < op->nin && f->mk.mark[c] != f->mk.stamp; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p >= 0 && f->gof[p] == S) {
                    f->mk.mark[c] = f->mk.stamp;
                    vec_push(&w->R, c);
                }
            }
        }
    }
    /* the domain, as pass_fuse_domain_of finds it */
    *bc = a->hasbc ? &a->bc : b->hasbc ? &b->bc : NULL;
    if (a->hasred || b->hasred) {
        if (a->hasred && b->hasred && !domain_eq(&a->d, &b->d))
            return 0;
        *d = a->hasred ? a->d : b->d;
        if (!*bc)
            for (int i = 0; i < w->R.n && !*bc; i++)
                *bc = union_bc(f, w->R.v[i], A, B);
    } else if (!a->hasnc && !b->hasnc) {
        *d = a->d;
    } else {
        const GSum *big = !b->hasnc || (a->hasnc && shape_numel(&a->d.S) >= shape_numel(&b->d.S))
                              ? a : b;
        *d = (FuseDomain){.kind = FUSE_ELEM, .S = big->d.S, .k = -1};
        /* a row -> full broadcast inside the union makes it ROW; all such
         * inputs must match (pass_fuse_check_members), so any one of the
         * right rank decides the domain of a union that passes */
        const Shape *cand[2] = {a->hasbc ? &a->bc : NULL, b->hasbc ? &b->bc : NULL};
        const Shape *r = NULL;
        for (int i = 0; i < 2 && !r; i++)
            if (cand[i] && cand[i]->rank == d->S.rank)
                r = cand[i];
        for (int i = 0; i < w->R.n && !r; i++) {
            const Shape *x = union_bc(f, w->R.v[i], A, B);
            if (x && !*bc)
                *bc = x;
            if (x && x->rank == d->S.rank)
                r = x;
        }
        if (r) {
            int k = 0;
            while (k < r->rank && r->dim[k] == d->S.dim[k])
                k++;
            d->kind = FUSE_ROW;
            d->k = k;
            *bc = r;
        }
        d->S.dtype = DT_F32;
    }
    if (d->kind == FUSE_COL)
        return -1;
    if (a->nmm + b->nmm > 1)
        return 0;
    FuseMarks m = {.gof = f->gof, .ga = A, .gb = B};
    if (!pass_fuse_check_members(g, w->R.v, w->R.n, &m, d, f->err, sizeof f->err))
        return 0;
    /* the larger group's other members fit d as they fit their own domain
     * unless d differs from it; an ELEM domain becoming ROW over the same
     * shape keeps them fitting (they are all at full shape; no broadcast of
     * theirs reads a member, or their own domain would be ROW) */
    const FuseDomain *dl = &w->s[L].d;
    if (domain_eq(d, dl) ||
        (dl->kind == FUSE_ELEM && d->kind == FUSE_ROW && shape_dims_eq(&dl->S, &d->S)))
        return 1;
    const FGroup *gl = &f->gr.v[L]; /* checking a member twice changes nothing */
    return pass_fuse_check_members(g, gl->ops.v, gl->ops.n, &m, d, f->err, sizeof f->err);
}

/* pass_fuse_try_merge of B into A by the summaries; the index of the
 * merged group (A or B), or A when they do not merge. */
static int grow_merge(Grow *w, int A, int B)
{
    Fuser *f = w->f;
    if (A == B || f->gr.v[A].dead || f->gr.v[B].dead || f->gr.v[A].multi || f->gr.v[B].multi)
        return A;
    GSum *a = &w->s[A], *b = &w->s[B];
    if ((a->fwd && b->rec) || (a->rec && b->fwd))
        return A;
    FuseDomain d;
    const Shape *bc = NULL;
    int r = a->ok && b->ok ? fast_union(w, A, B, &d, &bc) : -1;
    bool full = r < 0;
    if (full)
        r = pass_fuse_union_ok(f, A, B, &d);
    if (!r || !pass_fuse_convex_union(f, A, B))
        return A;
    Shape bcs = {0};
    if (bc)
        bcs = *bc;
    if (full) /* one broadcast input in the union, for its summary */
        for (int s = 0; s < 2 && !bc; s++) {
            const FGroup *x = &f->gr.v[s ? B : A];
            for (int i = 0; i < x->ops.n && !bc; i++)
                bc = union_bc(f, x->ops.v[i], A, B);
            if (bc)
                bcs = *bc;
        }
    pass_fuse_order_merge(f, A, B);
    /* the merged summary; pend keeps A's broadcasts before B's */
    GSum m = {.ok = d.kind != FUSE_COL,
              .d = d,
              .hasred = a->hasred || b->hasred,
              .hasnc = a->hasnc || b->hasnc,
              .hasbc = bc != NULL,
              .bc = bcs,
              .nmm = a->nmm + b->nmm,
              .nout = a->nout + b->nout,
              .nin = a->nin + b->nin,
              .fwd = a->fwd || b->fwd,
              .rec = a->rec || b->rec,
              .pend = a->pend};
    for (int i = 0; i < b->pend.n; i++)
        vec_push(&m.pend, b->pend.v[i]);
    vec_free(&b->pend);
    a->pend.v = NULL;
    /* the smaller group's members move */
    int X = f->gr.v[A].ops.n >= f->gr.v[B].ops.n ? A : B, Y = X == A ? B : A;
    FGroup *gy = &f->gr.v[Y];
    for (int i = 0; i < gy->ops.n; i++) {
        vec_push(&f->gr.v[X].ops, gy->ops.v[i]);
        f->gof[gy->ops.v[i]] = X;
    }
    gy = &f->gr.v[Y];
    vec_free(&gy->ops);
    gy->dead = true;
    w->s[Y] = (GSum){0};
    w->s[X] = m;
    return X;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* Each live group to the index of the group made for its last member (the
 * group that pass_fuse_try_merge's merges keep), members sorted. */
static void canonical_ids(Grow *w)
{
    Fuser *f = w->f;
    int ng = f->gr.n;
    FGroup *gr = xcalloc((size_t)ng + 1, sizeof(FGroup));
    int *to = xmalloc(sizeof(int) * (size_t)(ng + 1));
    for (int G = 0; G < ng; G++)
        gr[G].dead = true;
    for (int G = 0; G < ng; G++) {
        FGroup *x = &f->gr.v[G];
        to[G] = -1;
        if (x->dead || x->ops.n == 0)
            continue;
        qsort(x->ops.v, (size_t)x->ops.n, sizeof(int), cmp_int);
        to[G] = w->born[x->ops.v[x->ops.n - 1]];
        gr[to[G]] = *x;
    }
    for (int q = 0; q < f->g->ops.n; q++)
        if (f->gof[q] >= 0)
            f->gof[q] = to[f->gof[q]];
    if (ng)
        memcpy(f->gr.v, gr, sizeof(FGroup) * (size_t)ng);
    free(gr);
    free(to);
}

void pass_fuse_grow(Fuser *f)
{
    Graph *g = f->g;
    int n = g->ops.n;
    Grow w = {.f = f,
              .s = xcalloc((size_t)n + 1, sizeof(GSum)),
              .born = xmalloc(sizeof(int) * (size_t)(n + 1))};
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        w.born[i] = -1;
        f->upto = i + 1;
        if (!pass_fuse_op_fusable(g, op))
            continue;
        int G = pass_fuse_new_group(f, i);
        w.born[i] = G;
        sum_init(&w, G, i);
        /* a GEMM heads its group; consts and broadcasts wait for their
         * consumer, which pulls them (and their producers) in */
        int k;
        if (op->code == OP_MATMUL || op->code == OP_CONST || op->code == OP_BROADCAST ||
            (pass_fuse_is_reduce(op) && pass_fuse_reduce_pattern(g, op, &k) == FUSE_COL))
            continue; /* COL reductions take their prologue later (pass_fuse_pull_col) */
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            if (p >= 0 && f->gof[p] >= 0)
                G = grow_merge(&w, G, f->gof[p]);
        }
        /* producers of pulled-in broadcasts, in the order they joined */
        for (int q = 0; q < w.s[G].pend.n; q++) {
            int p = g->t.v[g->ops.v[w.s[G].pend.v[q]].in[0]].op;
            if (f->gof[p] != G)
                G = grow_merge(&w, G, f->gof[p]);
        }
        /* what stays pending, in program order (the members' order) */
        GSum *s = &w.s[G];
        int m = 0;
        for (int q = 0; q < s->pend.n; q++) {
            int b = s->pend.v[q], p = g->t.v[g->ops.v[b].in[0]].op;
            if (f->gof[p] != G)
                s->pend.v[m++] = b;
        }
        s->pend.n = m;
        if (m > 1) /* an empty list may have no array (qsort's pointer is nonnull) */
            qsort(s->pend.v, (size_t)m, sizeof(int), cmp_int);
    }
    canonical_ids(&w);
    for (int G = 0; G < f->gr.n; G++)
        vec_free(&w.s[G].pend);
    free(w.s);
    free(w.born);
    vec_free(&w.R);
}
