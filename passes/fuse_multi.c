/* fuse_multi.c - the multi-tensor merge of the fuse pass: the optimizer's
 * per-parameter groups (the AdamW update chains, and the squared-gradient
 * sums of global-norm clipping) that do not read each other become one
 * group per kind, marked multi: one kernel with one loop nest per part
 * (codegen gives independent parts loops of their own). A multi group takes
 * no further merges. */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

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
    FuseDomain d;
    if (!pass_fuse_group_domain(f, G, &d))
        return -1;
    if (!red && d.kind == FUSE_ELEM && d.S.rank >= 1)
        return 0;
    if (red && d.kind == FUSE_ROW && d.k == 0)
        return 1;
    return -1;
}

/* Merges mutually independent optimizer groups into one multi-tensor group
 * per kind (several loop nests in one kernel). */
void pass_fuse_merge_multi(Fuser *f)
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
            if (!pass_fuse_convex_union(f, M, G))
                continue;
            /* independent: neither reads the other (asked of G's operands
             * and readers, not of all of M) */
            bool dep = false;
            Graph *g = f->g;
            FGroup *x = &f->gr.v[G];
            for (int i = 0; i < x->ops.n && !dep; i++) {
                const Op *op = &g->ops.v[x->ops.v[i]];
                for (int j = 0; j < op->nin; j++) {
                    int p = g->t.v[op->in[j]].op;
                    if (p >= 0 && f->gof[p] == M)
                        dep = true;
                }
                for (int k = f->uoff[op->out]; k < f->uoff[op->out + 1]; k++)
                    if (f->ucons[k] >= 0 && f->gof[f->ucons[k]] == M)
                        dep = true;
            }
            if (dep)
                continue;
            if (f->ord_gr)
                pass_fuse_order_merge(f, M, G);
            int na = f->gr.v[M].ops.n;
            pass_fuse_do_union(f, M, G);
            f->gr.v[M].multi = true;
            /* both runs are in program order: sorted unless they interleave */
            if (na && f->gr.v[M].ops.v[na - 1] > f->gr.v[M].ops.v[na])
                pass_fuse_sort_members(f, M);
        }
    }
}
