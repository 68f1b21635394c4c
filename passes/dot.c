/* dot.c - the compiled graph as a Graphviz digraph (`kiln compile --dot`).
 *
 * One node per op and per graph input, params, state and outputs; an edge
 * per operand. What the passes decided is drawn on top:
 *   - each fused kernel (Op.group) is a cluster "kernel N", with the GEMM it
 *     carries, if any;
 *   - ops inserted by remat (OPF_RECOMPUTE) are dashed and orange;
 *   - backward and optimizer ops are filled in their own colours;
 *   - allreduce_start/_wait ops are red hexagons labelled with their bucket,
 *     and a bucket's ops share a cluster "bucket N" when they are not in a
 *     kernel;
 *   - an edge whose tensor is written to memory (materialised by the fuse
 *     pass) is solid; one that stays in registers inside a kernel is dotted;
 *   - state updates are dashed edges from the new value to the state.
 * The output is deterministic (ops in graph order, clusters by number), so
 * two compiles of one model give the same file. It is a picture of the
 * graph, not an input: nothing reads it back.
 */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

/* s as the inside of a DOT string: quotes and backslashes escaped,
 * control bytes dropped. */
static void put_escaped(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fputc('\\', f);
        if (*p >= 0x20)
            fputc(*p, f);
    }
}

static void put_op(FILE *f, const Graph *g, int i)
{
    const Op *op = &g->ops.v[i];
    const OpInfo *info = &ir_opinfo[op->code];
    char sb[160];
    fprintf(f, "    o%d [label=\"%%%d %s", i, op->out, info->name);
    if (info->attr == AK_BUCKET && op->attr.nia)
        fprintf(f, " bucket %lld", (long long)op->attr.ia[0]);
    fputs("\\n", f);
    put_escaped(f, shape_str(g, &g->t.v[op->out].s, sb, sizeof sb));
    if (op->loc.file) {
        const char *base = strrchr(op->loc.file, '/');
        fputs("\\n", f);
        put_escaped(f, base ? base + 1 : op->loc.file);
        fprintf(f, ":%d", op->loc.line);
    }
    fputc('"', f);
    if (info->cls == OC_COLLECTIVE)
        fputs(", shape=hexagon, color=red, fontcolor=red", f);
    else if (info->cls == OC_GEMM || info->cls == OC_ATTN)
        fputs(", penwidth=2", f);
    if (op->flags & OPF_RECOMPUTE)
        fputs(", style=\"dashed,filled\", color=darkorange, fillcolor=\"#fff0dd\"", f);
    else if (op->flags & OPF_OPTIM)
        fputs(", style=filled, fillcolor=\"#e8f0e0\"", f);
    else if (op->flags & OPF_BACKWARD)
        fputs(", style=filled, fillcolor=\"#e6ecf8\"", f);
    fputs("];\n", f);
}

/* The cluster of op i: its kernel group G as G; a collective outside any
 * kernel, of bucket B, as ngroups + B; -1 for none. */
static int cluster_of(const Graph *g, int i, int ngroups)
{
    const Op *op = &g->ops.v[i];
    if (op->group >= 0)
        return op->group;
    if (ir_opinfo[op->code].attr == AK_BUCKET && op->attr.nia && op->attr.ia[0] >= 0 &&
        op->attr.ia[0] < g->ops.n)
        return ngroups + (int)op->attr.ia[0];
    return -1;
}

void pass_dot_print(const Graph *g, FILE *f)
{
    bool *mat = pass_fuse_materialised(g);
    fputs("digraph kiln {\n"
          "  rankdir=TB;\n"
          "  node [shape=box, fontname=\"monospace\", fontsize=10];\n"
          "  edge [arrowsize=0.6];\n",
          f);
    char sb[160];
    /* graph inputs: params, inputs, state */
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        bool param = x->kind == TK_PARAM, state = x->kind == TK_STATE;
        fprintf(f, "  t%d [shape=%s, label=\"%s ", t, param ? "box3d" : "ellipse",
                ir_kind_name(x->kind));
        put_escaped(f, x->name);
        fputs("\\n", f);
        put_escaped(f, shape_str(g, &x->s, sb, sizeof sb));
        fprintf(f, "\"%s];\n", param ? ", style=filled, fillcolor=\"#fff8c0\""
                               : state ? ", style=filled, fillcolor=\"#eeeeee\"" : "");
    }
    /* ops, by cluster: clusters in ascending order (kernels, then buckets),
     * each one's ops in graph order; ops outside any cluster at top level.
     * A counting sort: ids are below the op count. */
    int ngroups = 0, nc = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    for (int i = 0; i < g->ops.n; i++)
        if (cluster_of(g, i, ngroups) >= nc)
            nc = cluster_of(g, i, ngroups) + 1;
    int *start = xcalloc((size_t)nc + 2, sizeof(int));
    int *member = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    for (int i = 0; i < g->ops.n; i++) {
        int c = cluster_of(g, i, ngroups);
        if (c < 0)
            put_op(f, g, i);
        else
            start[c + 2]++;
    }
    for (int c = 0; c < nc; c++)
        start[c + 2] += start[c + 1];
    for (int i = 0; i < g->ops.n; i++) {
        int c = cluster_of(g, i, ngroups);
        if (c >= 0)
            member[start[c + 1]++] = i;
    }
    /* now cluster c's ops are member[start[c] .. start[c + 1]) */
    for (int c = 0; c < nc; c++) {
        if (start[c] == start[c + 1])
            continue;
        if (c < ngroups)
            fprintf(f, "  subgraph cluster_k%d {\n    label=\"kernel %d\"; style=rounded; "
                    "color=\"#4060a0\";\n", c, c);
        else
            fprintf(f, "  subgraph cluster_b%d {\n    label=\"bucket %d\"; style=dashed; "
                    "color=red;\n", c - ngroups, c - ngroups);
        for (int j = start[c]; j < start[c + 1]; j++)
            put_op(f, g, member[j]);
        fputs("  }\n", f);
    }
    /* operand edges */
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++) {
            int t = op->in[j];
            if (t < 0 || t >= g->t.n)
                continue;
            int p = g->t.v[t].op;
            bool inside = p >= 0 && g->ops.v[p].group >= 0 && g->ops.v[p].group == op->group;
            if (p >= 0)
                fprintf(f, "  o%d -> o%d%s;\n", p, i,
                        inside && !mat[t] ? " [style=dotted]" : "");
            else
                fprintf(f, "  t%d -> o%d;\n", t, i);
        }
    }
    /* outputs and state updates */
    for (int i = 0; i < g->outs.n; i++) {
        int t = g->outs.v[i].t, p = g->t.v[t].op;
        fprintf(f, "  out%d [shape=note, label=\"output ", i);
        put_escaped(f, g->outs.v[i].name);
        fputs("\"];\n", f);
        if (p >= 0)
            fprintf(f, "  o%d -> out%d;\n", p, i);
        else
            fprintf(f, "  t%d -> out%d;\n", t, i);
    }
    for (int i = 0; i < g->upd.n; i++) {
        int v = g->upd.v[i].value, p = g->t.v[v].op;
        if (p >= 0)
            fprintf(f, "  o%d -> t%d [style=dashed, label=\"update\", constraint=false];\n", p,
                    g->upd.v[i].target);
        else
            fprintf(f, "  t%d -> t%d [style=dashed, label=\"update\", constraint=false];\n", v,
                    g->upd.v[i].target);
    }
    fputs("}\n", f);
    free(member);
    free(start);
    free(mat);
}
