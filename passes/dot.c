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
 * Ops are grouped by layer: a param's layer is its name without the last
 * part ("h.0.attn.c_attn.weight": "h.0.attn.c_attn"), nested by prefix
 * (clusters "h" > "h.0" > "h.0.attn" > ...). An op's layer is the one of
 * the param whose gradient it computes (output "grad.P"), else of a param
 * or optimizer state it reads, else of its operands (a backward op prefers
 * a forward operand, which is its own layer's activation, to the incoming
 * gradient, which comes from the layer after); a kernel cluster sits in the
 * common layer of its ops (the top level for the multi-tensor kernels that
 * update several layers' params). With a depth limit (--dot-depth N), each
 * layer of depth N (the number of parts of its name), and each shallower
 * one with no layers inside, is one node that stands for everything in it, edges between such nodes are drawn once, and
 * kernels are not drawn (each op goes with its own layer).
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

/* ---- layers ---------------------------------------------------------------- */

typedef struct {
    char *name;  /* "h.0.attn" */
    int parent;  /* the layer of its name without the last part; -1: top */
    int depth;   /* parts in its name */
} Layer;

typedef VEC(Layer) Layers;

/* The layer named by the first n bytes of name (made with its ancestors). */
static int layer_get(Layers *ls, const char *name, size_t n)
{
    for (int i = 0; i < ls->n; i++)
        if (strlen(ls->v[i].name) == n && memcmp(ls->v[i].name, name, n) == 0)
            return i;
    int parent = -1, depth = 1;
    for (size_t k = n; k-- > 0;)
        if (name[k] == '.') {
            if (k > 0)
                parent = layer_get(ls, name, k);
            break;
        }
    if (parent >= 0)
        depth = ls->v[parent].depth + 1;
    Layer l = {.name = xmalloc(n + 1), .parent = parent, .depth = depth};
    memcpy(l.name, name, n);
    l.name[n] = 0;
    vec_push(ls, l);
    return ls->n - 1;
}

/* A param's layer: its name up to the last '.', or the whole name. */
static int param_layer(Layers *ls, const char *name)
{
    const char *dot = strrchr(name, '.');
    size_t n = dot && dot > name ? (size_t)(dot - name) : strlen(name);
    return n ? layer_get(ls, name, n) : -1;
}

/* Whether layer a is b or inside it. */
static bool layer_in(const Layers *ls, int a, int b)
{
    for (; a >= 0; a = ls->v[a].parent)
        if (a == b)
            return true;
    return false;
}

/* The innermost layer holding both (-1: none). */
static int layer_common(const Layers *ls, int a, int b)
{
    for (; a >= 0; a = ls->v[a].parent)
        if (layer_in(ls, b, a))
            return a;
    return -1;
}

/* tl[t]: the layer of every tensor (the layer of its op for op results),
 * ol[i]: of every op; see the top of the file. */
static void assign_layers(const Graph *g, Layers *ls, int *tl, int *ol)
{
    for (int t = 0; t < g->t.n; t++)
        tl[t] = -1;
    for (int t = 0; t < g->t.n; t++)
        if (g->t.v[t].kind == TK_PARAM && g->t.v[t].name)
            tl[t] = param_layer(ls, g->t.v[t].name);
    /* optimizer state "adam.m.P": P's layer */
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->kind != TK_STATE || !x->name)
            continue;
        size_t n = strlen(x->name);
        for (int p = 0; p < g->t.n && tl[t] < 0; p++) {
            const Tensor *q = &g->t.v[p];
            size_t m = q->kind == TK_PARAM && q->name ? strlen(q->name) : 0;
            if (m && m < n && x->name[n - m - 1] == '.' && strcmp(x->name + n - m, q->name) == 0)
                tl[t] = tl[p];
        }
    }
    /* gradients: outputs "grad.P" */
    int *grad = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    for (int t = 0; t < g->t.n; t++)
        grad[t] = -1;
    for (int i = 0; i < g->outs.n; i++) {
        const char *name = g->outs.v[i].name;
        if (!name || strncmp(name, "grad.", 5) != 0)
            continue;
        for (int p = 0; p < g->t.n; p++)
            if (g->t.v[p].kind == TK_PARAM && g->t.v[p].name &&
                strcmp(g->t.v[p].name, name + 5) == 0)
                grad[g->outs.v[i].t] = tl[p];
    }
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        int l = op->out >= 0 && op->out < g->t.n ? grad[op->out] : -1;
        for (int j = 0; j < op->nin && l < 0; j++) { /* a param or state it reads */
            int t = op->in[j];
            if (t >= 0 && t < g->t.n && g->t.v[t].op < 0 && tl[t] >= 0)
                l = tl[t];
        }
        /* else its operands' latest layer (layers are numbered in the
         * params' order: the residual stream goes with the layer it has
         * reached); a backward op takes its forward operands' (its own
         * layer's activations) before the incoming gradient's, the
         * earliest of those (the gradient comes from the layer after). A
         * broadcast of anything but a param (a shared scalar: the lr, the
         * clipping factor) takes none here: its consumer's, below. */
        bool bwd = op->flags & OPF_BACKWARD;
        for (int pass = op->code == OP_BROADCAST ? 2 : 0; pass < 2 && l < 0; pass++)
            for (int j = 0; j < op->nin; j++) {
                int t = op->in[j];
                if (t < 0 || t >= g->t.n || tl[t] < 0)
                    continue;
                int p = g->t.v[t].op;
                bool fwd = p < 0 || !(g->ops.v[p].flags & OPF_BACKWARD);
                if (pass == 0 && (!bwd || fwd))
                    l = l < 0 || tl[t] > l ? tl[t] : l;
                else if (pass == 1)
                    l = l < 0 || tl[t] < l ? tl[t] : l;
            }
        ol[i] = l;
        if (op->out >= 0 && op->out < g->t.n)
            tl[op->out] = l;
    }
    /* an op with no layer so far (a constant, its broadcast): its
     * consumer's, latest consumer first (a chain resolves back to front) */
    for (int i = g->ops.n - 1; i >= 0; i--) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin && ol[i] >= 0; j++) {
            int t = op->in[j], p = t >= 0 && t < g->t.n ? g->t.v[t].op : -1;
            if (p >= 0 && ol[p] < 0)
                ol[p] = ol[i], tl[t] = ol[i];
        }
    }
    free(grad);
}

/* ---- printing --------------------------------------------------------------- */

typedef struct {
    const Graph *g;
    FILE *f;
    const Layers *ls;
    const int *tl, *ol;
    const int *kl;            /* kernel group -> layer */
    int ngroups, nc;
    const int *start, *member; /* cluster c's ops: member[start[c] .. start[c + 1]) */
    int depth;                /* layers of this depth are one node; 0: no limit */
} Dot;

/* The node a layer's content is drawn as: its ancestor of the depth limit,
 * or itself when it is shallower and holds no layers; -1 when it is drawn
 * in full. */
static int collapsed(const Dot *d, int l)
{
    if (d->depth <= 0 || l < 0)
        return -1;
    while (d->ls->v[l].depth > d->depth)
        l = d->ls->v[l].parent;
    if (d->ls->v[l].depth == d->depth)
        return l;
    for (int k = 0; k < d->ls->n; k++) /* a shallower layer with no layers inside */
        if (d->ls->v[k].parent == l)
            return -1;
    return l;
}

/* The layer op i is drawn in: its kernel's, a bucket's (the top level), or
 * its own (always its own with a depth limit, which draws no kernels). */
static int eff_layer(const Dot *d, int i)
{
    int c = cluster_of(d->g, i, d->ngroups);
    return c < 0 || (c < d->ngroups && d->depth > 0) ? d->ol[i] : c < d->ngroups ? d->kl[c] : -1;
}

static void put_input(const Dot *d, int t)
{
    const Tensor *x = &d->g->t.v[t];
    char sb[160];
    bool param = x->kind == TK_PARAM, state = x->kind == TK_STATE;
    fprintf(d->f, "  t%d [shape=%s, label=\"%s ", t, param ? "box3d" : "ellipse",
            ir_kind_name(x->kind));
    put_escaped(d->f, x->name);
    fputs("\\n", d->f);
    put_escaped(d->f, shape_str(d->g, &x->s, sb, sizeof sb));
    fprintf(d->f, "\"%s];\n", param ? ", style=filled, fillcolor=\"#fff8c0\""
                              : state ? ", style=filled, fillcolor=\"#eeeeee\"" : "");
}

static void put_kernel(const Dot *d, int c)
{
    if (d->start[c] == d->start[c + 1])
        return;
    if (c < d->ngroups)
        fprintf(d->f, "  subgraph cluster_k%d {\n    label=\"kernel %d\"; style=rounded; "
                "color=\"#4060a0\";\n", c, c);
    else
        fprintf(d->f, "  subgraph cluster_b%d {\n    label=\"bucket %d\"; style=dashed; "
                "color=red;\n", c - d->ngroups, c - d->ngroups);
    for (int j = d->start[c]; j < d->start[c + 1]; j++)
        put_op(d->f, d->g, d->member[j]);
    fputs("  }\n", d->f);
}

/* Everything whose layer is exactly l (-1: the top level): graph inputs,
 * kernel clusters, ops outside clusters; then the layers inside l. */
static void put_layer(const Dot *d, int l)
{
    const Graph *g = d->g;
    int cl = collapsed(d, l);
    if (cl >= 0) { /* one node for the layer and all it holds */
        int nops = 0;
        for (int i = 0; i < g->ops.n; i++)
            nops += layer_in(d->ls, eff_layer(d, i), l);
        fprintf(d->f, "  l%d [shape=folder, style=filled, fillcolor=\"#f0f0ff\", label=\"", l);
        put_escaped(d->f, d->ls->v[l].name);
        fprintf(d->f, "\\n%d op%s\"];\n", nops, nops == 1 ? "" : "s");
        return;
    }
    if (l >= 0) {
        fprintf(d->f, "  subgraph cluster_l%d {\n    label=\"", l);
        put_escaped(d->f, d->ls->v[l].name);
        fputs("\"; style=solid; color=\"#bbbbbb\"; fontcolor=\"#666666\";\n", d->f);
    }
    for (int t = 0; t < g->t.n; t++)
        if (g->t.v[t].op < 0 && d->tl[t] == l)
            put_input(d, t);
    for (int c = 0; c < d->ngroups && d->depth <= 0; c++)
        if (d->kl[c] == l)
            put_kernel(d, c);
    for (int i = 0; i < g->ops.n; i++) {
        int c = cluster_of(g, i, d->ngroups);
        if (d->ol[i] == l && (c < 0 || (c < d->ngroups && d->depth > 0)))
            put_op(d->f, g, i);
    }
    for (int k = 0; k < d->ls->n; k++)
        if (d->ls->v[k].parent == l)
            put_layer(d, k);
    if (l >= 0)
        fputs("  }\n", d->f);
}

/* The node name of op i ("o12"), or with i = -1 of graph input t ("t3"),
 * or of the collapsed layer standing for either ("l3"), into buf. */
static const char *node(const Dot *d, int i, int t, char *buf, size_t n)
{
    int c = collapsed(d, i >= 0 ? eff_layer(d, i) : d->tl[t]);
    if (c >= 0)
        snprintf(buf, n, "l%d", c);
    else if (i >= 0)
        snprintf(buf, n, "o%d", i);
    else
        snprintf(buf, n, "t%d", t);
    return buf;
}

typedef struct {
    char a[24], b[24];
} Edge;

static int cmp_edge(const void *x, const void *y)
{
    const Edge *p = x, *q = y;
    int c = strcmp(p->a, q->a);
    return c ? c : strcmp(p->b, q->b);
}

void pass_dot_print(const Graph *g, int depth, FILE *f)
{
    bool *mat = pass_fuse_materialised(g);
    fputs("digraph kiln {\n"
          "  rankdir=TB;\n"
          "  node [shape=box, fontname=\"monospace\", fontsize=10];\n"
          "  edge [arrowsize=0.6];\n",
          f);
    Layers ls = {0};
    int *tl = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    int *ol = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    assign_layers(g, &ls, tl, ol);
    /* clusters: kernels, then buckets (a counting sort: ids are below the
     * op count); each kernel in the common layer of its ops */
    int ngroups = 0, nc = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    for (int i = 0; i < g->ops.n; i++)
        if (cluster_of(g, i, ngroups) >= nc)
            nc = cluster_of(g, i, ngroups) + 1;
    int *start = xcalloc((size_t)nc + 2, sizeof(int));
    int *member = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    int *kl = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    bool *kseen = xcalloc((size_t)ngroups + 1, 1);
    for (int i = 0; i < g->ops.n; i++) {
        int c = cluster_of(g, i, ngroups);
        if (c >= 0)
            start[c + 2]++;
        if (c >= 0 && c < ngroups && ol[i] >= 0) { /* ops with no layer: anywhere */
            kl[c] = !kseen[c] ? ol[i] : kl[c] < 0 ? -1 : layer_common(&ls, kl[c], ol[i]);
            kseen[c] = true;
        } else if (c >= 0 && c < ngroups && !kseen[c]) {
            kl[c] = -1;
        }
    }
    for (int c = 0; c < nc; c++)
        start[c + 2] += start[c + 1];
    for (int i = 0; i < g->ops.n; i++) {
        int c = cluster_of(g, i, ngroups);
        if (c >= 0)
            member[start[c + 1]++] = i;
    }
    Dot d = {.g = g, .f = f, .ls = &ls, .tl = tl, .ol = ol, .kl = kl, .ngroups = ngroups,
             .nc = nc, .start = start, .member = member, .depth = depth};
    put_layer(&d, -1);
    for (int c = ngroups; c < nc; c++) /* buckets, at the top level */
        put_kernel(&d, c);
    /* operand edges (between collapsed layers: once each) */
    VEC(Edge) folded = {0};
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++) {
            int t = op->in[j];
            if (t < 0 || t >= g->t.n)
                continue;
            int p = g->t.v[t].op;
            bool inside = p >= 0 && g->ops.v[p].group >= 0 && g->ops.v[p].group == op->group;
            Edge e;
            node(&d, p, t, e.a, sizeof e.a);
            node(&d, i, -1, e.b, sizeof e.b);
            if (e.a[0] == 'l' || e.b[0] == 'l') {
                if (strcmp(e.a, e.b) != 0)
                    vec_push(&folded, e);
                continue;
            }
            fprintf(f, "  %s -> %s%s;\n", e.a, e.b, inside && !mat[t] ? " [style=dotted]" : "");
        }
    }
    if (folded.n)
        qsort(folded.v, (size_t)folded.n, sizeof *folded.v, cmp_edge);
    for (int k = 0; k < folded.n; k++)
        if (k == 0 || cmp_edge(&folded.v[k], &folded.v[k - 1]) != 0)
            fprintf(f, "  %s -> %s;\n", folded.v[k].a, folded.v[k].b);
    vec_free(&folded);
    /* outputs and state updates */
    char na[24], nb[24];
    for (int i = 0; i < g->outs.n; i++) {
        int t = g->outs.v[i].t, p = g->t.v[t].op;
        node(&d, p, t, na, sizeof na);
        const char *name = g->outs.v[i].name;
        if (na[0] == 'l' && name && strncmp(name, "grad.", 5) == 0)
            continue; /* a gradient, inside its collapsed layer */
        fprintf(f, "  out%d [shape=note, label=\"output ", i);
        put_escaped(f, name);
        fputs("\"];\n", f);
        fprintf(f, "  %s -> out%d;\n", na, i);
    }
    for (int i = 0; i < g->upd.n; i++) {
        int v = g->upd.v[i].value, p = g->t.v[v].op, tg = g->upd.v[i].target;
        node(&d, p, v, na, sizeof na);
        node(&d, -1, tg, nb, sizeof nb);
        if (strcmp(na, nb) != 0)
            fprintf(f, "  %s -> %s [style=dashed, label=\"update\", constraint=false];\n", na,
                    nb);
    }
    fputs("}\n", f);
    for (int i = 0; i < ls.n; i++)
        free(ls.v[i].name);
    vec_free(&ls);
    free(kseen);
    free(kl);
    free(tl);
    free(ol);
    free(member);
    free(start);
    free(mat);
}
