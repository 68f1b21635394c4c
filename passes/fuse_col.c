/* fuse_col.c - column groups of the fuse pass (FUSE_COL: reductions over
 * the leading axes, such as bias and LayerNorm weight gradients).
 *
 * A column-order kernel walks every row of each column once and writes
 * per-column results only. Two steps keep column groups to that:
 *   split (pass_fuse_split_col): a column group whose prologue is also
 *     needed outside it keeps the prologue; its reductions and what follows
 *     them move into a new group;
 *   pull (pass_fuse_pull_col): a column group takes over the elementwise
 *     ops that only it reads, when what they read is in memory anyway, so
 *     their product is never written.
 * Both run on the Fuser (fuse_internal.h) after the first grouping and
 * leave every group's members in program order. */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

/* Whether group G (live, not multi-tensor) is one COL loop nest; its
 * domain in *d. */
static bool col_group(Fuser *f, int G, FuseDomain *d)
{
    FGroup *gr = &f->gr.v[G];
    if (gr->dead || gr->multi)
        return false;
    return pass_fuse_group_domain(f, G, d) && d->kind == FUSE_COL;
}

/* Whether group G is a COL group that would have to write a full-shape
 * tensor (a non-const member's result needed outside it): a column-order
 * kernel stores per-column results only (pass_fuse_col_stores_full). */
static bool col_stores_full(Fuser *f, int G, const bool *mat)
{
    Graph *g = f->g;
    FGroup *gr = &f->gr.v[G];
    FuseDomain d;
    if (!col_group(f, G, &d))
        return false;
    for (int i = 0; i < gr->ops.n; i++) {
        const Op *op = &g->ops.v[gr->ops.v[i]];
        if (op->code != OP_CONST && pass_fuse_col_stores_full(g, &d, op, mat))
            return true;
    }
    return false;
}

/* A COL group whose prologue is also needed elsewhere would have to write
 * full-shape tensors from a column-order kernel: split its reductions (and
 * what follows them) into a group of their own. */
void pass_fuse_split_col(Fuser *f)
{
    Graph *g = f->g;
    bool *mat = pass_fuse_cur_materialised(f);
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
                NG = pass_fuse_new_group(f, o);
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
                for (int q = f->uoff[op->out]; q < f->uoff[op->out + 1] && !mv; q++)
                    mv = f->ucons[q] >= 0 && f->gof[f->ucons[q]] == NG;
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

/* Whether tensor t is materialised under the current grouping (gof):
 * what pass_fuse_materialised says of it, from t's readers alone. keep:
 * graph outputs and update values. */
static bool mat_now(const Fuser *f, const Uses *u, const bool *keep, int t)
{
    const Graph *g = f->g;
    int p = g->t.v[t].op;
    if (p < 0 || f->gof[p] < 0 || g->ops.v[p].code == OP_MATMUL || keep[t])
        return true;
    for (int q = u->off[t]; q < u->off[t + 1]; q++) {
        int c = u->cons[q];
        if (c >= 0 && (f->gof[c] != f->gof[p] || g->ops.v[c].code == OP_MATMUL))
            return true;
    }
    return false;
}

/* A COL reduction takes over the elementwise ops that only it reads (the
 * prologue, e.g. dy * xhat of a LayerNorm weight gradient) from their
 * groups, when everything those ops read is in memory anyway: the product
 * is then never written. */
void pass_fuse_pull_col(Fuser *f)
{
    Graph *g = f->g;
    Uses u = pass_fuse_uses_build(g);
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
            /* the grouping only changes when a pull succeeds, which ends
             * this round: materialised tensors are asked of gof directly
             * (was the whole graph's set per round) */
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
                        if (p >= 0 && f->gof[p] == G && !mat_now(f, &u, keep, xo->in[a]) &&
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
                               d.kind == FUSE_COL && pass_fuse_col_ok(f, c2->ops.v, c2->ops.n);
                    if (!fit) { /* undo */
                        f->gr.v[G].dead = false;
                        move_op(f, x, G);
                        for (int q = 0; q < moved.n; q++)
                            move_op(f, moved.v[q], G);
                        pass_fuse_sort_members(f, G);
                    } else {
                        changed = true;
                    }
                    vec_free(&moved);
                    pass_fuse_sort_members(f, C);
                }
            }
        }
    }
    free(keep);
    pass_fuse_uses_free(&u);
}
