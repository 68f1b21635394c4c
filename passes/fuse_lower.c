/* fuse_lower.c - whether a fuse group lowers to one kernel: the one check
 * that the fuse pass (which drops a group that fails it) and codegen's
 * cg_lower_group (which reports it) both call.
 *
 * codegen builds a group's kernel from its connected parts (in-group edges;
 * a member matmul runs first as a GEMM and belongs to no part): one loop
 * nest per part's domain, parts of one domain that read a common tensor
 * sharing a loop. So a group lowers when every part has one domain
 * (pass_fuse_domain) and a part over a column domain stores per-column
 * results only (pass_fuse_col_stores_full). */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

bool pass_fuse_col_stores_full(const Graph *g, const FuseDomain *d, const Op *op,
                               const bool *mat)
{
    bool row;
    return d->kind == FUSE_COL && op->code != OP_MATMUL && !pass_fuse_is_reduce(op) &&
           pass_fuse_fits(d, &g->t.v[op->out].s, &row) && !row && mat[op->out];
}

bool pass_fuse_lowers(const Graph *g, const int *ops, int n, const bool *mat, int *root,
                      FuseDomain *dom, int *bad, char *err, size_t errlen)
{
    int *part = xmalloc(sizeof(int) * (size_t)(n + 1));
    pass_fuse_parts(g, ops, n, root);
    /* members by part (each part in member order): start[r] .. start[r+1) */
    int *start = xcalloc((size_t)n + 2, sizeof(int)), *byp = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        if (g->ops.v[ops[i]].code != OP_MATMUL)
            start[root[i] + 1]++;
    for (int r = 0; r < n; r++)
        start[r + 1] += start[r];
    int *fill = xcalloc((size_t)n + 1, sizeof(int));
    for (int i = 0; i < n; i++)
        if (g->ops.v[ops[i]].code != OP_MATMUL)
            byp[start[root[i]] + fill[root[i]]++] = ops[i];
    free(fill);
    bool ok = true;
    for (int r = 0; r < n && ok; r++) {
        if (root[r] != r)
            continue;
        int m = start[r + 1] - start[r];
        memcpy(part, byp + start[r], sizeof(int) * (size_t)m);
        if (!m)
            continue;
        if (!pass_fuse_domain(g, part, m, &dom[r], err, errlen)) {
            *bad = part[0];
            ok = false;
            break;
        }
        for (int i = 0; i < m; i++) {
            const Op *op = &g->ops.v[part[i]];
            if (pass_fuse_col_stores_full(g, &dom[r], op, mat)) {
                snprintf(err, errlen,
                         "op %d: %s: a column-reduction kernel stores per-column results "
                         "only, and this full-shape result is needed outside it",
                         part[i], ir_opinfo[op->code].name);
                *bad = part[i];
                ok = false;
                break;
            }
        }
    }
    free(part);
    free(start);
    free(byp);
    return ok;
}

/* Whether group G lowers to one kernel (pass_fuse_lowers); dead and empty
 * groups do. */
static bool group_lowers(Fuser *f, int G, const bool *mat)
{
    FGroup *gr = &f->gr.v[G];
    int n = gr->ops.n;
    if (gr->dead || !n)
        return true;
    int *root = xmalloc(sizeof(int) * (size_t)n);
    FuseDomain *dom = xmalloc(sizeof(FuseDomain) * (size_t)n);
    int bad;
    char err[256];
    bool ok = pass_fuse_lowers(f->g, gr->ops.v, n, mat, root, dom, &bad, err, sizeof err);
    free(root);
    free(dom);
    return ok;
}

/* The last word: a group that would not lower to one kernel is not fused,
 * its ops run as kernels of their own. The grouping steps keep this from
 * happening in the models; it catches what they miss (a column group that
 * would have to write a full-shape tensor downstream of its reductions, a
 * sibling merge that leaves a column max in a part of its own). */
void pass_fuse_drop_unlowerable(Fuser *f)
{
    /* a dropped group changes what the others must write: until none drops */
    for (bool changed = true; changed;) {
        changed = false;
        bool *mat = pass_fuse_cur_materialised(f);
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
