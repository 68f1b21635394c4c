/* fuse_dump.c - what a grouping of the fuse pass amounts to: bytes moved
 * per group kernel, launch counts and bytes moved per step (the summary of
 * `kiln compile`), and one comment line per group appended to the
 * --dump-after=fuse dump. Reads the grouping (Op.group) only. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>


double pass_fuse_group_bytes(const Graph *g, const int *ops, int n, const bool *mat)
{
    double b = 0;
    /* seen: the operands counted so far, an open-addressing set of tensor
     * ids (+1; 0 empty) at most half full: O(group), not O(graph) */
    size_t cap = 2;
    for (int i = 0; i < n; i++)
        cap += (size_t)g->ops.v[ops[i]].nin;
    size_t sz = 4;
    while (sz < 2 * cap)
        sz *= 2;
    int *seen = xcalloc(sz, sizeof(int));
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[ops[i]];
        if (op->code == OP_MATMUL) {
            b += ir_op_bytes(g, op);
            continue;
        }
        for (int j = 0; j < op->nin; j++) {
            int t = op->in[j], p = g->t.v[t].op;
            bool inside = p >= 0 && g->ops.v[p].group == op->group && g->ops.v[p].code != OP_MATMUL;
            if (inside)
                continue;
            size_t h = ((size_t)t * 0x9E3779B1u) & (sz - 1);
            while (seen[h] && seen[h] != t + 1)
                h = (h + 1) & (sz - 1);
            if (!seen[h]) {
                seen[h] = t + 1;
                b += (double)shape_bytes(&g->t.v[t].s);
            }
        }
        if (mat[op->out])
            b += (double)shape_bytes(&g->t.v[op->out].s);
    }
    free(seen);
    return b;
}

void pass_fuse_stats(const Graph *g, FuseStats *s)
{
    memset(s, 0, sizeof *s);
    bool *mat = pass_fuse_materialised(g);
    bool *done = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    int *mem = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (done[i])
            continue;
        if (op->code == OP_RESHAPE)
            continue; /* a view */
        if (op->group < 0) {
            s->bytes += ir_op_bytes(g, op);
            if (op->code == OP_MATMUL)
                s->gemms++;
            else
                s->kernels++;
            continue;
        }
        int n = 0;
        bool gemm = false, other = false;
        for (int j = i; j < g->ops.n; j++)
            if (g->ops.v[j].group == op->group) {
                done[j] = true;
                mem[n++] = j;
                if (g->ops.v[j].code == OP_MATMUL)
                    gemm = true;
                else
                    other = true;
            }
        s->bytes += pass_fuse_group_bytes(g, mem, n, mat);
        s->gemms += gemm;
        s->kernels += other;
    }
    free(mem);
    free(done);
    free(mat);
}

void pass_fuse_print(const Graph *g, FILE *f)
{
    bool *mat = pass_fuse_materialised(g);
    int ngroups = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    static const char *kind[] = {"elem", "row", "col"};
    int *mem = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    fprintf(f, "# kernels: %d fused groups\n", ngroups);
    for (int G = 0; G < ngroups; G++) {
        int n = 0;
        for (int i = 0; i < g->ops.n; i++)
            if (g->ops.v[i].group == G)
                mem[n++] = i;
        if (!n)
            continue;
        FuseDomain d;
        char err[256], sb[128];
        int m = 0;
        for (int i = 0; i < n; i++)
            if (g->ops.v[mem[i]].code != OP_MATMUL)
                mem[m++] = mem[i];
        bool gemm = m < n;
        fprintf(f, "# group %d:", G);
        if (gemm)
            fprintf(f, " gemm +");
        if (m && pass_fuse_domain(g, mem, m, &d, err, sizeof err))
            fprintf(f, " %s over %s (k=%d)", kind[d.kind], shape_str(g, &d.S, sb, sizeof sb),
                    d.k);
        else if (m)
            fprintf(f, " several loops");
        fprintf(f, ", %d ops, writes", n);
        int w = 0;
        for (int i = 0; i < g->ops.n; i++)
            if (g->ops.v[i].group == G && mat[g->ops.v[i].out] &&
                g->ops.v[i].code != OP_MATMUL) {
                if (w++ < 8)
                    fprintf(f, " %%%d", g->ops.v[i].out);
            }
        if (w > 8)
            fprintf(f, " ... (%d)", w);
        if (!w)
            fprintf(f, " nothing");
        fprintf(f, "\n");
    }
    free(mem);
    free(mat);
}
