/* remat.c - recomputation under a memory budget.
 *
 * An activation is a tensor computed by a forward op (no OPF_BACKWARD,
 * OPF_OPTIM or OPF_RECOMPUTE flag) that is neither a graph output nor an
 * update value; it is *saved* when a backward or optimizer op reads it. For
 * each activation the pass decides: keep (live from forward to its last
 * backward use) or recompute (a clone of its op, flagged OPF_RECOMPUTE, is
 * inserted just before the first backward op that needs it, reading kept
 * tensors or other clones). Random and collective ops are never recomputed:
 * when a recomputation needs one's result, that result is kept. Reshapes are
 * views and are never "kept" on their own: recomputing one is free.
 *
 * The selection model (what the solvers see; see "solutions" below): keep
 * set K; per group (a layer, the head before the layers, the tail after
 * them) the recompute set R_g, the closure of the group's saved activations
 * not in K through operands not in K; memory at backward stage g = kept
 * bytes of groups <= g + group g's clones; cost = the predicted time of
 * every R_g op. Minimise cost subject to every stage's memory <= M. Exact:
 * a 0-1 integer program (GLPK) for graphs up to REMAT_EXACT_MAX
 * activations; otherwise a greedy heuristic with local search, whose gap
 * to the LP relaxation's bound is reported. The solvers live in
 * remat_solve.c; the model they share (Prob, Sol) in remat_internal.h.
 *
 * The budget is checked against the real plan: a candidate is applied to a
 * copy of the graph, every pass after remat in pass_list (fuse, comm,
 * schedule) runs on it, and pass_memplan's arena_bytes (what the runtime
 * allocates) is compared with the budget. The auto policy bisects M over
 * such real plans, and also considers the fixed policies, taking the
 * cheapest candidate that fits: its plan is exactly the final one because
 * the later passes are deterministic.
 *
 * Cost model (fusion-aware roofline, REMAT_FLOPS and REMAT_BW): matmuls,
 * reductions, gathers and scatters take max(flops/F, bytes/BW); elementwise
 * and data-movement ops fuse into their consumers and take flops/F, plus the
 * write of their result when a consumer cannot fuse it (a matmul, gather or
 * scatter); reshapes are free.
 *
 * Layers (for the full and selective policies) come from param names: the
 * first all-digit component of a dotted name ends the layer key ("h.3.attn.w"
 * -> "h.3", "layers.12.ffn" -> "layers.12"); keys are numbered by first use.
 * A forward tensor's layer is the largest layer of the params and tensors it
 * reads; params without a key first used after the first layer param (a
 * final norm, a head) put everything downstream of them into the tail. */
#include "remat_internal.h"

#include <stdlib.h>
#include <string.h>

#define REMAT_FLOPS 190e9       /* FLOP/s of the modelled machine (this CPU, 2 cores) */
#define REMAT_BW 20e9           /* bytes/s */
#define REMAT_LP_MAX 4000       /* activations up to which the LP bound (stated gap) runs */
#define REMAT_BISECT_LARGE 8    /* bisection steps on large graphs (each a real plan) */
#define REMAT_BISECT_SMALL 10   /* bisection steps where the integer program runs */

enum { L_NONE = -1, L_TAIL = 1 << 29 };


static int64_t align_up(int64_t x) { return (x + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN * MEMPLAN_ALIGN; }


static bool is_fwd(const Op *op)
{
    return !(op->flags & (OPF_BACKWARD | OPF_OPTIM | OPF_RECOMPUTE));
}

static bool unfusable_consumer(const Op *op)
{
    OpClass c = ir_opinfo[op->code].cls;
    return c == OC_GEMM || op->code == OP_GATHER || op->code == OP_SCATTER_ADD;
}

/* Predicted time of one op (see the cost model above). materialized: some
 * consumer cannot fuse the result. */
static double op_time(const Graph *g, const Op *op, bool materialized)
{
    double f = ir_op_flops(g, op);
    OpClass c = ir_opinfo[op->code].cls;
    if (op->code == OP_RESHAPE)
        return 0;
    if (c == OC_GEMM || c == OC_REDUCE || op->code == OP_GATHER || op->code == OP_SCATTER_ADD) {
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
        if (!is_fwd(op))
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
        if (!is_fwd(op))
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
        if (!is_fwd(op))
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
        if (!is_fwd(op))
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

static Prob *prob_new(const Graph *g)
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
        if (is_fwd(op) && !pinned[op->out]) {
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
            if (!is_fwd(op))
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

static void prob_free(Prob *P)
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

/* Stage memory and totals of a solution whose keep and r are final. */
static void totals(const Prob *P, Sol *s)
{
    int nv = P->nv, G = P->ngroups;
    memset(s->memg, 0, sizeof(int64_t) * (size_t)G);
    s->cost = s->flops = 0;
    for (int v = 0; v < nv; v++) {
        if (s->keep[v])
            for (int g = P->grp[v]; g < G; g++)
                s->memg[g] += P->bytes[v];
        for (int g = 0; g < G; g++)
            if (s->r[g * nv + v]) {
                s->memg[g] += P->bytes[v];
                s->cost += P->cost[v];
                s->flops += P->flops[v];
            }
    }
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
            for (int k = P->in_off[v]; k < P->in_off[v + 1]; k++)
                if (!s->keep[P->in_v[k]] && !r[P->in_v[k]])
                    stack[sp++] = P->in_v[k];
        }
    }
    uint8_t *need = xcalloc((size_t)nv + 1, 1);
    for (int g = 0; g < G; g++)
        for (int v = 0; v < nv; v++)
            if (s->r[g * nv + v])
                for (int k = P->in_off[v]; k < P->in_off[v + 1]; k++)
                    need[P->in_v[k]] = 1;
    for (int v = 0; v < nv; v++)
        if (s->keep[v] && !P->saved[v] && !need[v])
            s->keep[v] = 0;
    free(need);
    free(stack);
    totals(P, s);
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

/* ---- rewriting ------------------------------------------------------------ */

/* Inserts the clones of every group (flagged OPF_RECOMPUTE) just before the
 * first backward op that needs them, redirects each backward read of a
 * recomputed activation to its group's clone, drops forward ops left
 * without uses, and compacts. */
static void apply(Graph *g, const Prob *P, const Sol *s)
{
    int n0 = g->ops.n, nt0 = g->t.n, nv = P->nv, G = P->ngroups;
    int *clone = xmalloc(sizeof(int) * (size_t)(nt0 + 1) * (size_t)G); /* [g * nt0 + t] */
    for (int i = 0; i < nt0 * G; i++)
        clone[i] = -1;
    int nclone = 0;
    for (int grp = 0; grp < G; grp++) {
        int *cl = clone + (size_t)grp * (size_t)nt0;
        for (int v = 0; v < nv; v++) { /* activations are in program order */
            if (!s->r[grp * nv + v])
                continue;
            int t = P->vt[v];
            const Op orig = g->ops.v[g->t.v[t].op];
            int in[16], *inp = orig.nin <= 16 ? in : xmalloc(sizeof(int) * (size_t)orig.nin);
            for (int j = 0; j < orig.nin; j++)
                inp[j] = orig.in[j] < nt0 && cl[orig.in[j]] >= 0 ? cl[orig.in[j]] : orig.in[j];
            int c = ir_op_x(g, orig.code, inp, orig.nin, &orig.attr, orig.loc);
            if (inp != in)
                free(inp);
            Op *cop = &g->ops.v[g->t.v[c].op];
            cop->flags = orig.flags | OPF_RECOMPUTE;
            g->t.v[c].kind = g->t.v[t].kind;
            cl[t] = c;
            nclone++;
        }
    }
    if (!nclone) {
        free(clone);
        return;
    }
    for (int i = 0; i < n0; i++) {
        Op *op = &g->ops.v[i];
        if (is_fwd(op))
            continue;
        for (int j = 0; j < op->nin; j++) {
            int v = P->var[op->in[j]];
            if (v >= 0 && P->saved[v] && clone[P->grp[v] * nt0 + op->in[j]] >= 0)
                op->in[j] = clone[P->grp[v] * nt0 + op->in[j]];
        }
    }
    /* new order: clones emitted depth-first before their first reader */
    int n = g->ops.n;
    int *order = xmalloc(sizeof(int) * (size_t)(n + 1));
    bool *done = xcalloc((size_t)n + 1, sizeof(bool));
    int *stack = xmalloc(sizeof(int) * (size_t)(n + 1));
    int no = 0;
    for (int i = 0; i < n0; i++) {
        const Op *op = &g->ops.v[i];
        if (!is_fwd(op)) {
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p < n0 || done[p])
                    continue;
                int sp = 0;
                stack[sp++] = p;
                while (sp) {
                    int c = stack[sp - 1];
                    if (done[c]) {
                        sp--;
                        continue;
                    }
                    const Op *cop = &g->ops.v[c];
                    bool ready = true;
                    for (int k = 0; k < cop->nin; k++) {
                        int q = g->t.v[cop->in[k]].op;
                        if (q >= n0 && !done[q]) {
                            stack[sp++] = q;
                            ready = false;
                            break;
                        }
                    }
                    if (!ready)
                        continue;
                    sp--;
                    done[c] = true;
                    order[no++] = c;
                }
            }
        }
        done[i] = true;
        order[no++] = i;
    }
    if (no != n)
        die("remat: %d of %d ops placed", no, n);
    /* dead forward ops (their only readers were backward ops) */
    int *uses = ir_use_counts(g);
    bool *dead = xcalloc((size_t)n + 1, sizeof(bool));
    for (int k = n - 1; k >= 0; k--) {
        int i = order[k];
        Op *op = &g->ops.v[i];
        if (uses[op->out] == 0 && ir_opinfo[op->code].cls != OC_COLLECTIVE) {
            dead[i] = true;
            for (int j = 0; j < op->nin; j++)
                uses[op->in[j]]--;
        }
    }
    int m = 0;
    for (int k = 0; k < n; k++)
        if (!dead[order[k]])
            order[m++] = order[k];
    ir_reorder_ops(g, order, m); /* drops the dead ones */
    free(uses);
    free(dead);
    free(order);
    free(done);
    free(stack);
    free(clone);
    ir_compact(g);
}

/* ---- evaluation on the real plan -------------------------------------------- */

/* The passes that run after remat (everything after "remat" in pass_list;
 * only schedule when remat is not in the list). */
static bool run_later(Graph *g, const PassOpts *o, Diag *d)
{
    int at = -1;
    for (int i = 0; i < pass_count; i++)
        if (strcmp(pass_list[i].name, "remat") == 0)
            at = i;
    if (at < 0)
        return pass_schedule(g, o, d);
    for (int i = at + 1; i < pass_count; i++)
        if (!pass_list[i].run(g, o, d))
            return false;
    return true;
}

/* The arena the runtime would allocate with solution s: s applied to a
 * copy of g, every later pass run, then pass_memplan; -1 on failure. */
static int64_t eval_peak(const Graph *g, const Prob *P, const Sol *s, const PassOpts *o)
{
    Graph *c = ir_clone(g);
    apply(c, P, s);
    Diag d = {{0}};
    int64_t peak = -1;
    PassOpts po = *o;
    po.remat_report = NULL;
    if (run_later(c, &po, &d)) {
        MemPlan *m = pass_memplan(c, &d);
        if (m)
            peak = m->arena_bytes;
        pass_memplan_free(m);
    }
    ir_free(c);
    return peak;
}

static void fmt_bytes(int64_t b, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)b;
    int i = 0;
    while (x >= 1024 && i < 4) {
        x /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", x, u[i]);
}

/* A predicted time in s, ms or us, 4 significant digits. */
static void fmt_secs(double s, char *buf, size_t n)
{
    if (s >= 1)
        snprintf(buf, n, "%.4g s", s);
    else if (s >= 1e-3)
        snprintf(buf, n, "%.4g ms", s * 1e3);
    else
        snprintf(buf, n, "%.4g us", s * 1e6);
}

typedef struct {
    Sol s;
    int64_t peak;
    int policy;   /* the fixed policy it came from, or REMAT_AUTO */
    bool exact;
    double gap;   /* heuristic: (cost - LP bound) / cost; 0 when exact; -1 unknown */
    bool found;
} Choice;

/* Real peaks of the fixed policies, computed once per Prob on demand. */
typedef struct {
    const Graph *g;
    const Prob *P;
    const PassOpts *o;
    int64_t fixed[REMAT_AUTO + 1]; /* by policy; 0: not yet known */
    int nreal;                     /* real evaluations run */
    int64_t least, least_mem;      /* the solver's least-memory plan: real peak, model */
} Evals;

static int64_t fixed_real(Evals *E, int policy, Sol *t)
{
    if (!E->fixed[policy]) {
        pass_remat_policy_keep(E->P, policy, t);
        E->fixed[policy] = eval_peak(E->g, E->P, t, E->o);
        E->nreal++;
    }
    return E->fixed[policy];
}

static void take(Choice *best, const Prob *P, const Sol *s, int64_t peak, int policy, bool exact)
{
    pass_remat_sol_copy(P, &best->s, s);
    best->peak = peak;
    best->policy = policy;
    best->exact = exact;
    best->gap = exact || policy != REMAT_AUTO ? 0 : -1;
    best->found = true;
}

/* The least real peak among the fixed policies and the solver's
 * least-memory plan: the smallest feasible budget kiln finds. */
static int64_t smallest_real(Evals *E)
{
    Sol t = pass_remat_sol_new(E->P);
    int64_t sm = INT64_MAX;
    const int fixed[] = {REMAT_NONE, REMAT_SELECTIVE, REMAT_FULL};
    for (int k = 0; k < 3; k++) {
        int64_t pk = fixed_real(E, fixed[k], &t);
        if (pk >= 0 && pk < sm)
            sm = pk;
    }
    if (!E->least) {
        bool ex;
        pass_remat_solve_model(E->P, 0, REMAT_SOLVER_HEURISTIC, &t, &ex);
        E->least = eval_peak(E->g, E->P, &t, E->o);
        E->least_mem = t.mem;
        E->nreal++;
    }
    if (E->least >= 0 && E->least < sm)
        sm = E->least;
    pass_remat_sol_free(&t);
    return sm;
}

/* The cheapest candidate whose real peak fits `budget`: no recompute when
 * that fits; else the solver's plan for the largest kept-bytes limit M
 * whose real plan fits (bisection between the least memory the solver
 * reaches and keeping everything; each step runs the later passes and
 * memplan); a fixed policy instead when it fits and is cheaper. */
static bool search(Evals *E, int64_t budget, int solver, Choice *best)
{
    const Prob *P = E->P;
    best->found = false;
    best->s = pass_remat_sol_new(P);
    Sol t = pass_remat_sol_new(P);
    bool ex;
    int64_t pk = fixed_real(E, REMAT_NONE, &t);
    if (pk >= 0 && pk <= budget) {
        pass_remat_policy_keep(P, REMAT_NONE, &t);
        take(best, P, &t, pk, REMAT_NONE, false);
        pass_remat_sol_free(&t);
        return true;
    }
    pass_remat_policy_keep(P, REMAT_NONE, &t);
    int64_t hi = t.mem;
    smallest_real(E);
    int64_t lo = E->least_mem;
    if (E->least >= 0 && E->least <= budget) {
        pass_remat_solve_model(P, 0, REMAT_SOLVER_HEURISTIC, &t, &ex);
        take(best, P, &t, E->least, REMAT_AUTO, false);
        int iters = P->nv <= REMAT_EXACT_MAX ? REMAT_BISECT_SMALL : REMAT_BISECT_LARGE;
        /* exact answers so far: the optimum at limit M keeping s.mem bytes
         * is the optimum at every limit in [s.mem, M] too, so a later probe
         * in that range reuses it (and its real peak) instead of solving */
        enum { NMEMO = 16 };
        Sol memo[NMEMO];
        int64_t memo_m[NMEMO], memo_pk[NMEMO];
        int nmemo = 0;
        for (int it = 0; it < iters && hi - lo > MEMPLAN_ALIGN; it++) {
            int64_t mid = lo + (hi - lo) / 2;
            int hit = -1;
            for (int j = 0; j < nmemo && hit < 0; j++)
                if (memo[j].mem <= mid && mid <= memo_m[j])
                    hit = j;
            if (hit >= 0) {
                pass_remat_sol_copy(P, &t, &memo[hit]);
                ex = true;
                pk = memo_pk[hit];
            } else {
                if (!pass_remat_solve_model(P, mid, solver, &t, &ex)) {
                    lo = mid;
                    continue;
                }
                pk = eval_peak(E->g, P, &t, E->o);
                E->nreal++;
                if (ex && nmemo < NMEMO) {
                    memo[nmemo] = pass_remat_sol_new(P);
                    pass_remat_sol_copy(P, &memo[nmemo], &t);
                    memo_m[nmemo] = mid;
                    memo_pk[nmemo++] = pk;
                }
            }
            if (pk >= 0 && pk <= budget) {
                lo = mid;
                if (t.cost <= best->s.cost)
                    take(best, P, &t, pk, REMAT_AUTO, ex);
            } else {
                hi = mid;
            }
        }
        for (int j = 0; j < nmemo; j++)
            pass_remat_sol_free(&memo[j]);
    }
    /* fixed policies that could be cheaper */
    const int fixed[] = {REMAT_SELECTIVE, REMAT_FULL};
    for (int k = 0; k < 2; k++) {
        pass_remat_policy_keep(P, fixed[k], &t);
        if (best->found && t.cost >= best->s.cost)
            continue;
        pk = fixed_real(E, fixed[k], &t);
        pass_remat_policy_keep(P, fixed[k], &t);
        if (pk >= 0 && pk <= budget)
            take(best, P, &t, pk, fixed[k], false);
    }
    pass_remat_sol_free(&t);
    if (best->found && best->policy == REMAT_AUTO && !best->exact && best->s.cost > 0 &&
        P->nv <= REMAT_LP_MAX) {
        double b = pass_remat_lp_bound(P, best->s.mem);
        best->gap = b >= 0 ? (best->s.cost - b) / best->s.cost : -1;
    }
    return best->found;
}

/* ---- the pass --------------------------------------------------------------- */

static const char *const policy_names[] = {"default", "none", "full", "selective", "auto"};

int pass_remat_parse_policy(const char *s)
{
    for (int i = REMAT_NONE; i <= REMAT_AUTO; i++)
        if (strcmp(s, policy_names[i]) == 0)
            return i;
    return -1;
}

const char *pass_remat_policy_name(int policy)
{
    return policy >= 0 && policy <= REMAT_AUTO ? policy_names[policy] : "?";
}

static void report(RematReport *r, const Prob *P, const Sol *s, int asked, int chosen,
                   int64_t peak, bool exact, double gap)
{
    if (!r)
        return;
    memset(r, 0, sizeof *r);
    r->policy = asked;
    r->chosen = chosen;
    r->exact = exact;
    r->gap = gap;
    r->peak = peak;
    for (int v = 0; v < P->nv; v++) {
        if (P->saved[v]) {
            r->nsaved++;
            if (s->r[P->grp[v] * P->nv + v]) {
                r->nrecomputed++;
                r->recomputed_bytes += P->bytes[v];
            } else {
                r->nkept++;
                r->kept_bytes += P->bytes[v];
            }
        }
        for (int g = 0; g < P->ngroups; g++)
            r->nrecompute_ops += s->r[g * P->nv + v];
    }
    r->extra_flops = s->flops;
    r->extra_seconds = s->cost;
}

bool pass_remat(Graph *g, const PassOpts *o, Diag *d)
{
    int policy = o->remat;
    int64_t budget = o->memory_budget;
    if (policy == REMAT_DEFAULT)
        policy = budget > 0 ? REMAT_AUTO : REMAT_NONE;
    if (policy == REMAT_NONE && budget <= 0) {
        if (o->remat_report) {
            memset(o->remat_report, 0, sizeof *o->remat_report);
            o->remat_report->policy = o->remat_report->chosen = REMAT_NONE;
            o->remat_report->peak = -1;
        }
        return true;
    }
    Prob *P = prob_new(g);
    Sol s = pass_remat_sol_new(P);
    Evals E = {g, P, o, {0}, 0, 0, 0};
    char b0[32], b1[32], b2[32];
    bool ok = true;
    if (policy == REMAT_AUTO && budget <= 0) {
        /* auto without a budget: nothing to fit */
        pass_remat_policy_keep(P, REMAT_NONE, &s);
        report(o->remat_report, P, &s, REMAT_AUTO, REMAT_NONE, -1, false, 0);
    } else if (policy == REMAT_AUTO) {
        Choice c;
        if (search(&E, budget, o->remat_solver, &c)) {
            pass_remat_sol_copy(P, &s, &c.s);
            report(o->remat_report, P, &s, REMAT_AUTO, c.policy, c.peak, c.exact, c.gap);
        } else {
            int64_t smallest = smallest_real(&E);
            fmt_bytes(budget, b0, sizeof b0);
            fmt_bytes(smallest, b1, sizeof b1);
            snprintf(d->msg, sizeof d->msg,
                     "memory budget %s (%lld bytes) is infeasible: the smallest feasible "
                     "budget kiln found is %s (%lld bytes) (expected --memory-budget >= "
                     "%lld, got %lld)",
                     b0, (long long)budget, b1, (long long)smallest, (long long)smallest,
                     (long long)budget);
            ok = false;
        }
        pass_remat_sol_free(&c.s);
    } else {
        int64_t peak = -1;
        if (budget > 0) {
            peak = fixed_real(&E, policy, &s);
            if (peak < 0 || peak > budget) {
                Choice c;
                bool any = search(&E, budget, o->remat_solver, &c);
                pass_remat_sol_free(&c.s);
                int64_t smallest = any ? 0 : smallest_real(&E);
                fmt_bytes(budget, b0, sizeof b0);
                fmt_bytes(peak, b1, sizeof b1);
                fmt_bytes(smallest, b2, sizeof b2);
                snprintf(d->msg, sizeof d->msg,
                         "memory budget %s (%lld bytes) is infeasible with --remat=%s, whose "
                         "planned peak is %s (%lld bytes); %s%s",
                         b0, (long long)budget, pass_remat_policy_name(policy), b1,
                         (long long)peak,
                         any ? "--remat=auto fits it" : "the smallest feasible budget kiln "
                                                        "found is ",
                         any ? "" : b2);
                ok = false;
            }
        }
        pass_remat_policy_keep(P, policy, &s);
        if (ok)
            report(o->remat_report, P, &s, policy, policy, peak, false, 0);
    }
    if (ok)
        apply(g, P, &s);
    pass_remat_sol_free(&s);
    prob_free(P);
    return ok;
}

/* ---- helpers for tests, reports and the sweep -------------------------------- */

double pass_remat_flops(const Graph *g)
{
    double f = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].flags & OPF_RECOMPUTE)
            f += ir_op_flops(g, &g->ops.v[i]);
    return f;
}

int64_t pass_remat_saved_bytes(const Graph *g)
{
    Prob *P = prob_new(g);
    int64_t b = 0;
    for (int v = 0; v < P->nv; v++)
        if (P->saved[v])
            b += P->bytes[v];
    prob_free(P);
    return b;
}

bool pass_remat_solve(const Graph *g, int64_t kept_limit, int solver, double *cost,
                      int64_t *kept, bool *exact)
{
    Prob *P = prob_new(g);
    Sol s = pass_remat_sol_new(P);
    bool ok;
    *exact = false;
    if (solver == REMAT_SOLVER_EXACT) {
        int r = pass_remat_solve_exact(P, kept_limit, &s, false);
        ok = r == 1;
        *exact = ok;
        if (r == -1)
            die("remat: the exact solver did not finish on a test graph");
    } else {
        ok = pass_remat_solve_model(P, kept_limit, solver, &s, exact);
    }
    *cost = s.cost;
    *kept = s.mem;
    pass_remat_sol_free(&s);
    prob_free(P);
    return ok;
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

bool pass_remat_sweep(const Graph *g, const PassOpts *o, int npoints, FILE *f, Diag *d)
{
    Prob *P = prob_new(g);
    Evals E = {g, P, o, {0}, 0, 0, 0};
    const int fixed[] = {REMAT_NONE, REMAT_SELECTIVE, REMAT_FULL};
    int64_t fpeak[3];
    double fcost[3], fflops[3];
    Sol t = pass_remat_sol_new(P);
    for (int k = 0; k < 3; k++) {
        fpeak[k] = fixed_real(&E, fixed[k], &t);
        pass_remat_policy_keep(P, fixed[k], &t);
        fcost[k] = t.cost;
        fflops[k] = t.flops;
    }
    pass_remat_sol_free(&t);
    int64_t smallest = smallest_real(&E);
    if (smallest == INT64_MAX || fpeak[0] < 0) {
        snprintf(d->msg, sizeof d->msg, "remat sweep: no plan could be built");
        prob_free(P);
        return false;
    }
    double base = pass_remat_step_seconds(g), step_flops = ir_graph_flops(g);
    char b0[32], b1[32], t0[32];
    int nsaved = 0;
    for (int v = 0; v < P->nv; v++)
        nsaved += P->saved[v];
    fmt_secs(base, t0, sizeof t0);
    fprintf(f, "remat sweep: %d activations, %d saved for backward, %d layers; cost model "
               "%.0f GFLOP/s, %.0f GB/s; predicted step without remat %s\n",
            P->nv, nsaved, P->nlayers, REMAT_FLOPS / 1e9, REMAT_BW / 1e9, t0);
    fprintf(f, "fixed policies: ");
    for (int k = 0; k < 3; k++) {
        fmt_bytes(fpeak[k], b0, sizeof b0);
        fprintf(f, "%s%s peak %s (+%.2f%% FLOPs)", k ? ", " : "", pass_remat_policy_name(fixed[k]),
                b0, 100 * fflops[k] / step_flops);
    }
    fprintf(f, "\n%-12s %-15s %-5s %14s %12s %16s\n", "budget", "policy", "fits", "planned peak",
            "extra FLOPs", "predicted step");
    if (npoints < 2)
        npoints = 2;
    for (int i = 0; i < npoints; i++) {
        int64_t budget = smallest + (int64_t)((double)(fpeak[0] - smallest) * i / (npoints - 1));
        Choice c;
        bool fits = search(&E, budget, o->remat_solver, &c);
        fmt_bytes(budget, b0, sizeof b0);
        if (fits) {
            fmt_bytes(c.peak, b1, sizeof b1);
            char what[32];
            snprintf(what, sizeof what, "auto%s%s", c.policy == REMAT_AUTO ? "" : "=",
                     c.policy == REMAT_AUTO ? "" : pass_remat_policy_name(c.policy));
            fmt_secs(base + c.s.cost, t0, sizeof t0);
            fprintf(f, "%-12s %-15s %-5s %14s %11.2f%% %16s\n", b0, what, "yes", b1,
                    100 * c.s.flops / step_flops, t0);
        } else {
            fprintf(f, "%-12s %-15s %-5s %14s %12s %16s\n", b0, "auto", "no", "-", "-", "-");
        }
        pass_remat_sol_free(&c.s);
        for (int k = 0; k < 3; k++) {
            bool fk = fpeak[k] >= 0 && fpeak[k] <= budget;
            fmt_bytes(fpeak[k], b1, sizeof b1);
            fmt_secs(base + fcost[k], t0, sizeof t0);
            if (fk)
                fprintf(f, "%-12s %-15s %-5s %14s %11.2f%% %16s\n", "",
                        pass_remat_policy_name(fixed[k]), "yes", b1,
                        100 * fflops[k] / step_flops, t0);
            else
                fprintf(f, "%-12s %-15s %-5s %14s %12s %16s\n", "",
                        pass_remat_policy_name(fixed[k]), "no", b1, "-", "-");
        }
    }
    prob_free(P);
    return true;
}
