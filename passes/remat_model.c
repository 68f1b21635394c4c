/* remat_model.c - the selection model of the remat pass: what the solvers
 * (remat_solve.c) see and what the rewrite (remat_rewrite.c) applies.
 *
 * Candidates (Prob): activations, tensors computed by a forward op (no
 * OPF_BACKWARD, OPF_OPTIM or OPF_RECOMPUTE flag) that are neither graph
 * outputs nor update values, in program order; *saved* when a backward or
 * optimizer op reads one. Random and collective results can only be kept;
 * reshapes are views and are never kept on their own (0 bytes).
 *
 * Solutions (Sol): a keep set K; per group (a layer, the head before the
 * layers, the tail after them) the recompute set R_g, the closure of the
 * group's saved activations not in K through operands not in K; memory at
 * backward stage g = kept bytes of groups <= g + group g's clones; cost =
 * the predicted time of every R_g op (pass_remat_derive). The fixed
 * policies are keep sets (pass_remat_policy_keep).
 *
 * Cost model (fusion-aware roofline, REMAT_FLOPS and REMAT_BW): matmuls,
 * reductions, gathers, scatters, im2col and col2im take max(flops/F,
 * bytes/BW); elementwise and data-movement ops fuse into their consumers and
 * take flops/F, plus the write of their result when a consumer cannot fuse
 * it (a matmul, gather, scatter, im2col or col2im); reshapes are free.
 *
 * Layers (for the full and selective policies) come from param names: the
 * first all-digit component of a dotted name ends the layer key ("h.3.attn.w"
 * -> "h.3", "layers.12.ffn" -> "layers.12"); keys are numbered by first use.
 * A forward tensor's layer is the largest layer of the params and tensors it
 * reads; params without a key first used after the first layer param (a
 * final norm, a head) put everything downstream of them into the tail.
 * Attention internals (the selective policy) are the activations of a layer
 * downstream of a matmul of two data-dependent operands and upstream of
 * one. */
#include "remat_internal.h"

#include <stdlib.h>
#include <string.h>

enum { L_NONE = -1, L_TAIL = 1 << 29 };

static int64_t align_up(int64_t x) { return (x + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN * MEMPLAN_ALIGN; }

bool pass_remat_is_fwd(const Op *op)
{
    return !(op->flags & (OPF_BACKWARD | OPF_OPTIM | OPF_RECOMPUTE));
}

/* Attention ops (OC_ATTN) are their own kernels, like a GEMM: they read
 * their operands from memory and cost max(FLOPs, bytes) time (their lse
 * result is small: [..., T, 1]). With fused attention there are no
 * attention internals for the selective policy: the scores and P never
 * exist. */
static bool unfusable_consumer(const Op *op)
{
    OpClass c = ir_opinfo[op->code].cls;
    return c == OC_GEMM || c == OC_ATTN || op->code == OP_GATHER ||
           op->code == OP_SCATTER_ADD || op->code == OP_IM2COL || op->code == OP_COL2IM;
}

/* Predicted time of one op (see the cost model at the top). materialized: some
 * consumer cannot fuse the result. */
static double op_time(const Graph *g, const Op *op, bool materialized)
{
    double f = ir_op_flops(g, op);
    OpClass c = ir_opinfo[op->code].cls;
    if (op->code == OP_RESHAPE)
        return 0;
    if (c == OC_GEMM || c == OC_ATTN || c == OC_REDUCE || op->code == OP_GATHER ||
        op->code == OP_SCATTER_ADD || op->code == OP_IM2COL || op->code == OP_COL2IM) {
        double a = f / REMAT_FLOPS, b = ir_op_bytes(g, op) / REMAT_BW;
        return a > b ? a : b;
    }
    double bytes = materialized ? (double)shape_bytes(&g->t.v[op->out].s) : 0;
    return f / REMAT_FLOPS + bytes / REMAT_BW;
}

/* The layer key of a param name: its length up to the first all-digit
 * component, or 0 when it has none. */
static size_t layer_key_len(const char *name)
{
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '.');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++)
            if (p[i] < '0' || p[i] > '9')
                digits = false;
        if (digits && p != name)
            return (size_t)(p - name) + n;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

static void assign_layers(Prob *P)
{
    const Graph *g = P->g;
    int nt = g->t.n, n = g->ops.n;
    int *lay = xmalloc(sizeof(int) * (size_t)(nt + 1));
    VEC(const char *) keys = {0};
    VEC(size_t) klen = {0};
    int first_layer_use = -1;
    bool *seen = xcalloc((size_t)nt + 1, sizeof(bool));
    bool *head = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int t = 0; t < nt; t++)
        lay[t] = L_NONE;
    /* params: layer ordinal by first use in program order */
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        if (!pass_remat_is_fwd(op))
            continue;
        for (int j = 0; j < op->nin; j++) {
            const Tensor *x = &g->t.v[op->in[j]];
            if (x->kind != TK_PARAM || seen[x->id])
                continue;
            seen[x->id] = true;
            size_t kl = layer_key_len(x->name);
            if (!kl) {
                head[x->id] = first_layer_use >= 0;
                continue;
            }
            int k = -1;
            for (int q = 0; q < keys.n; q++)
                if (klen.v[q] == kl && strncmp(keys.v[q], x->name, kl) == 0)
                    k = q;
            if (k < 0) {
                vec_push(&keys, x->name);
                vec_push(&klen, kl);
                k = keys.n - 1;
            }
            lay[x->id] = k;
            if (first_layer_use < 0)
                first_layer_use = i;
        }
    }
    P->nlayers = keys.n;
    for (int t = 0; t < nt; t++)
        if (head[t])
            lay[t] = L_TAIL;
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        if (!pass_remat_is_fwd(op))
            continue;
        int m = P->nlayers ? L_NONE : 0;
        for (int j = 0; j < op->nin; j++)
            if (lay[op->in[j]] > m)
                m = lay[op->in[j]];
        lay[op->out] = m;
    }
    for (int v = 0; v < P->nv; v++) {
        int l = lay[P->vt[v]];
        P->layer[v] = l == L_TAIL ? (P->nlayers ? P->nlayers : 1) : l;
    }
    if (!P->nlayers)
        P->nlayers = 1;
    free(lay);
    free(seen);
    free(head);
    vec_free(&keys);
    vec_free(&klen);
}

/* Attention internals: activations downstream of a matmul of two
 * data-dependent operands and upstream of one, within one layer. */
static void find_attention(Prob *P)
{
    const Graph *g = P->g;
    int nt = g->t.n, n = g->ops.n;
    bool *dd = xcalloc((size_t)nt + 1, sizeof(bool));
    bool *down = xcalloc((size_t)nt + 1, sizeof(bool));
    bool *up = xcalloc((size_t)nt + 1, sizeof(bool));
    bool *aa = xcalloc((size_t)n + 1, sizeof(bool));
    for (int t = 0; t < nt; t++)
        dd[t] = g->t.v[t].kind == TK_INPUT;
    int *lay = xmalloc(sizeof(int) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        lay[t] = -2;
    for (int v = 0; v < P->nv; v++)
        lay[P->vt[v]] = P->layer[v];
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        if (!pass_remat_is_fwd(op))
            continue;
        for (int j = 0; j < op->nin; j++)
            if (dd[op->in[j]])
                dd[op->out] = true;
        aa[i] = op->code == OP_MATMUL && dd[op->in[0]] && dd[op->in[1]];
        bool d = aa[i];
        for (int j = 0; j < op->nin; j++)
            if (down[op->in[j]] && lay[op->in[j]] == lay[op->out])
                d = true;
        down[op->out] = d;
    }
    for (int i = n - 1; i >= 0; i--) {
        const Op *op = &g->ops.v[i];
        if (!pass_remat_is_fwd(op))
            continue;
        for (int j = 0; j < op->nin; j++) {
            int u = op->in[j];
            if (lay[u] == lay[op->out] && (aa[i] || up[op->out]))
                up[u] = true;
        }
    }
    for (int v = 0; v < P->nv; v++) {
        int t = P->vt[v];
        P->attn[v] = down[t] && up[t] && P->layer[v] >= 0 && P->layer[v] < P->nlayers;
    }
    free(dd);
    free(down);
    free(up);
    free(aa);
    free(lay);
}

Prob *pass_remat_prob_new(const Graph *g)
{
    int nt = g->t.n, n = g->ops.n;
    Prob *P = xcalloc(1, sizeof *P);
    P->g = g;
    P->var = xmalloc(sizeof(int) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        P->var[t] = -1;
    bool *pinned = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int k = 0; k < g->outs.n; k++)
        pinned[g->outs.v[k].t] = true;
    for (int k = 0; k < g->upd.n; k++)
        pinned[g->upd.v[k].value] = true;
    P->vt = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        if (pass_remat_is_fwd(op) && !pinned[op->out]) {
            P->var[op->out] = P->nv;
            P->vt[P->nv++] = op->out;
        }
    }
    int nv = P->nv;
    P->saved = xcalloc((size_t)nv + 1, 1);
    P->can_r = xcalloc((size_t)nv + 1, 1);
    P->can_k = xcalloc((size_t)nv + 1, 1);
    P->attn = xcalloc((size_t)nv + 1, 1);
    P->bytes = xcalloc((size_t)nv + 1, sizeof(int64_t));
    P->cost = xcalloc((size_t)nv + 1, sizeof(double));
    P->flops = xcalloc((size_t)nv + 1, sizeof(double));
    P->layer = xcalloc((size_t)nv + 1, sizeof(int));
    P->in_off = xcalloc((size_t)nv + 2, sizeof(int));
    bool *mat = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++) {
            int v = P->var[op->in[j]];
            if (v < 0)
                continue;
            if (!pass_remat_is_fwd(op))
                P->saved[v] = 1;
            if (unfusable_consumer(op))
                mat[op->in[j]] = true;
        }
    }
    VEC(int) ins = {0};
    for (int v = 0; v < nv; v++) {
        int t = P->vt[v];
        const Op *op = &g->ops.v[g->t.v[t].op];
        OpClass c = ir_opinfo[op->code].cls;
        P->can_r[v] = c != OC_RANDOM && c != OC_COLLECTIVE;
        P->can_k[v] = op->code != OP_RESHAPE;
        int64_t tb = shape_bytes(&g->t.v[t].s);
        P->bytes[v] = P->can_k[v] ? align_up(tb ? tb : 1) : 0;
        P->cost[v] = op_time(g, op, mat[t]);
        P->flops[v] = ir_op_flops(g, op);
        P->in_off[v] = ins.n;
        for (int j = 0; j < op->nin; j++)
            if (P->var[op->in[j]] >= 0)
                vec_push(&ins, P->var[op->in[j]]);
    }
    P->in_off[nv] = ins.n;
    P->in_v = ins.v ? ins.v : xmalloc(sizeof(int));
    assign_layers(P);
    find_attention(P);
    P->ngroups = P->nlayers + 2;
    P->grp = xmalloc(sizeof(int) * (size_t)(nv + 1));
    for (int v = 0; v < nv; v++)
        P->grp[v] = P->layer[v] + 1;
    P->out_off = xcalloc((size_t)nv + 2, sizeof(int));
    P->out_v = xmalloc(sizeof(int) * (size_t)(ins.n + 1));
    for (int k = 0; k < ins.n; k++)
        P->out_off[P->in_v[k] + 1]++;
    for (int v = 0; v < nv; v++)
        P->out_off[v + 1] += P->out_off[v];
    int *fill = xmalloc(sizeof(int) * (size_t)(nv + 1));
    memcpy(fill, P->out_off, sizeof(int) * (size_t)(nv + 1));
    for (int w = 0; w < nv; w++)
        for (int k = P->in_off[w]; k < P->in_off[w + 1]; k++)
            P->out_v[fill[P->in_v[k]]++] = w;
    free(fill);
    free(pinned);
    free(mat);
    return P;
}

void pass_remat_prob_free(Prob *P)
{
    if (!P)
        return;
    free(P->var);
    free(P->vt);
    free(P->saved);
    free(P->can_r);
    free(P->can_k);
    free(P->attn);
    free(P->bytes);
    free(P->cost);
    free(P->flops);
    free(P->layer);
    free(P->in_off);
    free(P->in_v);
    free(P->out_off);
    free(P->out_v);
    free(P->grp);
    free(P);
}

/* ---- solutions (Sol and the stages: remat_internal.h) -------------------- */

Sol pass_remat_sol_new(const Prob *P)
{
    size_t nv = (size_t)P->nv + 1, G = (size_t)P->ngroups;
    return (Sol){xcalloc(nv, 1), xcalloc(nv * G, 1), xcalloc(G, sizeof(int64_t)), 0, 0, 0};
}
void pass_remat_sol_free(Sol *s)
{
    free(s->keep);
    free(s->r);
    free(s->memg);
    s->keep = s->r = NULL;
    s->memg = NULL;
}
void pass_remat_sol_copy(const Prob *P, Sol *dst, const Sol *src)
{
    memcpy(dst->keep, src->keep, (size_t)P->nv);
    memcpy(dst->r, src->r, (size_t)P->nv * (size_t)P->ngroups);
    memcpy(dst->memg, src->memg, sizeof(int64_t) * (size_t)P->ngroups);
    dst->mem = src->mem;
    dst->cost = src->cost;
    dst->flops = src->flops;
}

/* Stage memory and totals of a solution whose keep and r are final; set:
 * its n entries of r, each v * ngroups + g, in any order (the cost and
 * FLOPs sums run in the order a scan of v, then g, would take: per v, its
 * count of entries, so no sort). O(nv + ngroups + n). */
static void totals(const Prob *P, Sol *s, const int64_t *set, int n)
{
    int nv = P->nv, G = P->ngroups;
    memset(s->memg, 0, sizeof(int64_t) * (size_t)G);
    s->cost = s->flops = 0;
    /* a kept v weighs on every stage from its group's on: a difference
     * array over the stages, summed once */
    for (int v = 0; v < nv; v++)
        if (s->keep[v] && P->grp[v] < G)
            s->memg[P->grp[v]] += P->bytes[v];
    for (int g = 1; g < G; g++)
        s->memg[g] += s->memg[g - 1];
    int *cnt = xcalloc((size_t)nv + 1, sizeof(int)); /* entries of each v */
    for (int i = 0; i < n; i++) {
        int v = (int)(set[i] / G), g = (int)(set[i] % G);
        s->memg[g] += P->bytes[v];
        cnt[v]++;
    }
    for (int v = 0; v < nv; v++)
        for (int k = 0; k < cnt[v]; k++) {
            s->cost += P->cost[v];
            s->flops += P->flops[v];
        }
    free(cnt);
    s->mem = 0;
    for (int g = 0; g < G; g++)
        if (s->memg[g] > s->mem)
            s->mem = s->memg[g];
}

/* From s->keep: each group's recompute closure (saved activations of the
 * group not kept, through operands not kept), the activations it forces
 * to be kept (results of ops that cannot be recomputed), and the totals.
 * Kept activations neither saved nor read by a recomputation are dropped. */
void pass_remat_derive(const Prob *P, Sol *s)
{
    int nv = P->nv, G = P->ngroups;
    int *stack = xmalloc(sizeof(int) * (size_t)(nv + 1));
    VEC(int64_t) set = {0}; /* the entries of r set: v * G + g */
    uint8_t *need = xcalloc((size_t)nv + 1, 1); /* read by a recomputation */
    memset(s->r, 0, (size_t)nv * (size_t)G);
    for (int v = 0; v < nv; v++)
        if (!P->can_k[v])
            s->keep[v] = 0;
    for (int v0 = 0; v0 < nv; v0++) {
        int g = P->grp[v0];
        uint8_t *r = s->r + (size_t)g * (size_t)nv;
        if (!P->saved[v0] || s->keep[v0] || r[v0])
            continue;
        int sp = 0;
        stack[sp++] = v0;
        while (sp) {
            int v = stack[--sp];
            if (s->keep[v] || r[v])
                continue;
            if (!P->can_r[v]) {
                s->keep[v] = 1;
                continue;
            }
            r[v] = 1;
            vec_push(&set, (int64_t)v * G + g);
            for (int k = P->in_off[v]; k < P->in_off[v + 1]; k++) {
                need[P->in_v[k]] = 1;
                if (!s->keep[P->in_v[k]] && !r[P->in_v[k]])
                    stack[sp++] = P->in_v[k];
            }
        }
    }
    for (int v = 0; v < nv; v++)
        if (s->keep[v] && !P->saved[v] && !need[v])
            s->keep[v] = 0;
    totals(P, s, set.v, set.n);
    vec_free(&set);
    free(need);
    free(stack);
}

void pass_remat_policy_keep(const Prob *P, int policy, Sol *s)
{
    int nv = P->nv;
    memset(s->keep, 0, (size_t)nv);
    for (int v = 0; v < nv; v++) {
        bool in_layer = P->layer[v] >= 0 && P->layer[v] < P->nlayers;
        switch (policy) {
        case REMAT_FULL: s->keep[v] = P->saved[v] && !in_layer; break;
        case REMAT_SELECTIVE: s->keep[v] = P->saved[v] && !P->attn[v]; break;
        default: s->keep[v] = P->saved[v]; break;
        }
    }
    if (policy == REMAT_FULL) {
        /* each layer's inputs: produced before the layer, read inside it */
        for (int w = 0; w < nv; w++) {
            int lw = P->layer[w];
            if (lw < 0 || lw >= P->nlayers)
                continue;
            for (int k = P->in_off[w]; k < P->in_off[w + 1]; k++) {
                int u = P->in_v[k];
                if (P->layer[u] < lw)
                    s->keep[u] = 1;
            }
        }
    }
    pass_remat_derive(P, s);
}

/* ---- queries ---------------------------------------------------------------- */

int64_t pass_remat_saved_bytes(const Graph *g)
{
    Prob *P = pass_remat_prob_new(g);
    int64_t b = 0;
    for (int v = 0; v < P->nv; v++)
        if (P->saved[v])
            b += P->bytes[v];
    pass_remat_prob_free(P);
    return b;
}

double pass_remat_step_seconds(const Graph *g)
{
    int nt = g->t.n;
    bool *mat = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (unfusable_consumer(op))
            for (int j = 0; j < op->nin; j++)
                mat[op->in[j]] = true;
    }
    for (int k = 0; k < g->outs.n; k++)
        mat[g->outs.v[k].t] = true;
    for (int k = 0; k < g->upd.n; k++)
        mat[g->upd.v[k].value] = true;
    double s = 0;
    for (int i = 0; i < g->ops.n; i++)
        s += op_time(g, &g->ops.v[i], mat[g->ops.v[i].out]);
    free(mat);
    return s;
}
