/* shard_auto.c - shard=auto: the compiler chooses which params split over the
 * TP group, and along which axis, with an ILP (GLPK), in the spirit of Alpa's
 * intra-operator pass. It only sets params' shardings (Tensor.shard, n = 0, as
 * the script's `shard` does); the partition pass (partition.c) then runs as
 * if the script had marked them. docs/parallel.md, "Auto-sharding".
 *
 * Candidates: every param of rank >= 2 that the script leaves whole
 * (matrices, embeddings); params the script marks stay as marked (fixed, part
 * of every costing). A candidate's choices: whole, or split along each axis
 * whose length divides by blocks x tp, for blocks 1 and for k where a GEMM
 * reading the param has its output read in k equal slices along the split
 * output axis (a fused qkv weight: 3). A rank-1 param added to a candidate's
 * GEMM output (a bias) follows the candidate where it splits that output
 * axis (nn.Linear's column rule) and is whole otherwise. Choices the
 * partition pass refuses (an uneven head split) are dropped.
 *
 * Costs: the partition pass is the oracle. cost(A) for an assignment A (one
 * choice per candidate) runs pass_partition as rank 0
 * on a copy of the graph and sums over rank 0's forward graph, in seconds:
 *   compute  per op max(FLOPs / peak, bytes / memory bandwidth), x 3 for
 *            GEMMs and attention (forward and two backward products), x 2
 *            for the other ops a gradient flows through, x 1 for the rest;
 *   comm     per TP collective the ring model (kiln plan's): an all-reduce
 *            2 (n-1) alpha + 2 (n-1)/n bytes / link, an all-gather or
 *            reduce-scatter half that; plus its VJP's collective where its
 *            operand has a gradient (tp_copy: an all-reduce backward,
 *            all-gather <-> reduce-scatter);
 *   update   AdamW over each param's part on the rank: 28 bytes per element
 *            (read p, g, m, v; write p, m, v) / memory bandwidth.
 * The ILP, in rounds around an incumbent layout s (first: every candidate
 * whole). Terms, each from partition runs: u_i(c) = cost(s with i: c) -
 * cost(s); for neighbour candidates i, j (below), w_ij(a, b) = cost(s with
 * i: a, j: b) - cost(s) - u_i(a) - u_j(b): where a column split followed by
 * a row split saves the collective that either alone needs, w is negative;
 * a pair the partition pass refuses is forbidden. Binary x_ic (one choice
 * per candidate), y_ij,ab = x_ia x_jb held by marginal rows (sum_b y_ab =
 * x_ia, sum_a y_ab = x_jb); minimise cost(s) + sum u x + sum w y, with
 * per-rank params + gradients + AdamW state (16 bytes per element) within
 * the device's memory when given; branch and bound stops after ILP_NODES
 * branchings (a count, not a time: every rank chooses alike). The ILP's
 * layout is then costed whole by partitioning it (the report's "checked"):
 * it becomes the incumbent only if that is cheaper than s. Otherwise the
 * cheapest single change (whose u is exact) is taken if it gains, else the
 * layout stands (at most MAXROUNDS rounds). The pairwise model is exact for any one or two changes
 * and only approximate for many: where a split runs on along the residual
 * stream, several pairs each claim the same saved collective, and the
 * check is what catches that. Every round's objective and check print in
 * the report.
 *
 * Neighbours: from each candidate's tensors (the param and views of it), a
 * walk along readers, at most HOPS ops deep, that stops at an op reading
 * another candidate (a neighbour); two candidates whose walks reach one op
 * with depths summing to at most HOPS / 2 are neighbours too (q, k and v meeting
 * in attention). Costs come from the graph alone: no param name is read. */
#include "passes.h"

#include <glpk.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HOPS 40       /* neighbour walk depth, ops */
#define MAXCH 12      /* choices per candidate */
#define MAXFOL 4      /* followers per candidate */
#define ILP_NODES 400 /* branch-and-bound branchings per ILP */

enum { T_COMP, T_COMM, T_UPD, NTERM };

typedef struct {
    double t[NTERM]; /* seconds */
    double mem;      /* per-rank params + grads + AdamW state, bytes */
    int ncoll;
    bool ok;
} Cost;

typedef struct {
    IrShard sh;         /* on false: whole */
    int nfol;
    IrShard fol[MAXFOL]; /* the followers' shardings under this choice */
    Cost u;             /* this round: cost with it - the incumbent's (mem: this
                           param's own, and its followers', per rank) */
    bool bad;           /* this round: the partition pass refuses it */
    int col;            /* ILP column */
} Choice;

typedef struct {
    int t;              /* the param */
    int nfol, fol[MAXFOL];
    int nch;
    Choice ch[MAXCH];   /* ch[0]: whole */
    int pick;
} Cand;

typedef struct {
    int i, a, j, b; /* candidates i < j, choices a, b */
    double w;       /* seconds */
    bool bad;       /* the partition pass refuses the pair */
    int col;
} Pair;

typedef struct {
    const Graph *base; /* after attention; the script's marks in it */
    const PassOpts *o;
    const PassShardCost *c;
    int n;
    VEC(Cand) cand;
    VEC(Pair) pair;
    int *cand_of; /* per tensor: the candidate it is (a view of), -1 */
    int runs;
    bool timed_out; /* the last ILP stopped at its branching limit */
    Cost none;    /* cost({}) */
} Auto;

/* ---- the oracle ----------------------------------------------------------- */

static double ring_all(const Auto *x, double bytes)
{
    int n = x->n;
    return 2.0 * (n - 1) * x->c->alpha_s + 2.0 * (n - 1) / n * bytes / x->c->link_bw;
}

static double ring_half(const Auto *x, double bytes)
{
    int n = x->n;
    return (n - 1) * x->c->alpha_s + (double)(n - 1) / n * bytes / x->c->link_bw;
}

/* The terms of rank 0's partitioned forward graph g. */
static Cost measure(const Auto *x, const Graph *g)
{
    Cost c = {.ok = true};
    bool *grad = xcalloc((size_t)g->t.n + 1, 1);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        grad[i] = t->kind == TK_PARAM;
        if (t->kind == TK_PARAM) {
            double b = (double)shape_bytes(&t->s);
            c.mem += 4.0 * b;                 /* param, gradient, m, v */
            c.t[T_UPD] += 7.0 * b / x->c->mem_bw;
        }
    }
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        bool gr = false;
        for (int j = 0; j < op->nin; j++)
            gr |= grad[op->in[j]];
        gr &= op->code != OP_STOP_GRADIENT && dtype_is_float(g->t.v[op->out].s.dtype);
        grad[op->out] = gr;
        OpClass cls = ir_opinfo[op->code].cls;
        if (cls == OC_COLLECTIVE) {
            double ob = (double)shape_bytes(&g->t.v[op->out].s);
            double ib = op->nin ? (double)shape_bytes(&g->t.v[op->in[0]].s) : 0;
            bool back = op->nin && grad[op->in[0]];
            switch (op->code) {
            case OP_TP_ALLREDUCE: c.t[T_COMM] += ring_all(x, ob), c.ncoll++; break;
            case OP_TP_COPY:
                if (back)
                    c.t[T_COMM] += ring_all(x, ob), c.ncoll++;
                break;
            case OP_TP_ALL_GATHER:
                c.t[T_COMM] += ring_half(x, ob) * (back ? 2 : 1), c.ncoll += back ? 2 : 1;
                break;
            case OP_TP_REDUCE_SCATTER:
                c.t[T_COMM] += ring_half(x, ib) * (back ? 2 : 1), c.ncoll += back ? 2 : 1;
                break;
            default: break;
            }
            continue;
        }
        double f = ir_op_flops(g, op), by = ir_op_bytes(g, op);
        double t = fmax(f / x->c->flops, by / x->c->mem_bw);
        double k = !gr ? 1 : (cls == OC_GEMM || cls == OC_ATTN) ? 3 : 2;
        c.t[T_COMP] += k * t;
    }
    free(grad);
    return c;
}

/* cost of the base graph with params ts[0..n) sharded as sh[0..n); ok false
 * where the partition pass refuses it. */
static Cost oracle(Auto *x, const int *ts, const IrShard *sh, int n)
{
    Graph *g = ir_clone(x->base);
    for (int k = 0; k < n; k++)
        g->t.v[ts[k]].shard = sh[k];
    PassOpts o = *x->o;
    o.tp = x->n;
    o.tp_rank = 0;
    Diag d = {{0}};
    Cost c = {.ok = false};
    x->runs++;
    if (pass_partition(g, &o, &d))
        c = measure(x, g);
    ir_free(g);
    return c;
}

/* The assignment of candidate ci's choice ch into ts/sh (appending). */
static int assign(const Auto *x, int ci, int ch, int *ts, IrShard *sh, int n)
{
    const Cand *c = &x->cand.v[ci];
    const Choice *h = &c->ch[ch];
    ts[n] = c->t, sh[n++] = h->sh;
    for (int k = 0; k < c->nfol; k++)
        ts[n] = c->fol[k], sh[n++] = h->fol[k];
    return n;
}

static double total(const Cost *c) { return c->t[T_COMP] + c->t[T_COMM] + c->t[T_UPD]; }

/* ---- candidates ---------------------------------------------------------- */

/* The tensor v a view of (through moves), or v. */
static int view_root(const Graph *g, int v)
{
    for (;;) {
        int o = g->t.v[v].op;
        if (o < 0 || ir_opinfo[g->ops.v[o].code].cls != OC_MOVE || g->ops.v[o].nin != 1)
            return v;
        v = g->ops.v[o].in[0];
    }
}

typedef struct {
    int *start, *list; /* readers of tensor t: list[start[t] .. start[t+1]) */
} Readers;

static Readers readers(const Graph *g)
{
    Readers r;
    r.start = xcalloc((size_t)g->t.n + 2, sizeof(int));
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            r.start[g->ops.v[i].in[j] + 1]++;
    for (int t = 0; t < g->t.n; t++)
        r.start[t + 1] += r.start[t];
    r.list = xmalloc(sizeof(int) * (size_t)(r.start[g->t.n] + 1));
    int *at = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    memcpy(at, r.start, sizeof(int) * (size_t)g->t.n);
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            r.list[at[g->ops.v[i].in[j]]++] = i; /* an op reading t twice: twice */
    free(at);
    return r;
}

/* Where param t's axis `axis` lands in the output of GEMM op (operand j):
 * the output axis it splits (N or M), or -1 (K or batch). */
static int gemm_out_axis(const Graph *g, const Op *op, int j, int axis)
{
    const Shape *s = &g->t.v[op->in[j]].s;
    bool tr = op->attr.ia[j] != 0;
    if (ir_matmul_role(s, axis, tr, j == 1) != 1)
        return -1;
    int orank = g->t.v[op->out].s.rank;
    return j == 1 ? orank - 1 : orank - 2;
}

/* For GEMM output y split along axis oa: the rank-1 params added to it (a
 * bias), into fol (whole params not already taken), and the block count
 * its readers slice it in (1: none). */
static int out_users(Auto *x, const Readers *rd, int y, int oa, int *fol, int *nfol)
{
    const Graph *g = x->base;
    const Shape *ys = &g->t.v[y].s;
    int ts[2] = {y, -1};
    for (int k = rd->start[y]; k < rd->start[y + 1]; k++) {
        const Op *op = &g->ops.v[rd->list[k]];
        if (op->code != OP_ADD || oa != ys->rank - 1)
            continue;
        int other = op->in[0] == y ? op->in[1] : op->in[0];
        int b = view_root(g, other);
        const Tensor *bt = &g->t.v[b];
        if (bt->kind == TK_PARAM && !bt->shard.on && bt->s.rank == 1 &&
            bt->s.dim[0] == ys->dim[oa] && x->cand_of[b] < 0 && *nfol < MAXFOL) {
            bool dup = false;
            for (int q = 0; q < *nfol; q++)
                dup |= fol[q] == b;
            if (!dup)
                fol[(*nfol)++] = b;
            ts[1] = op->out;
        }
    }
    int64_t len = 0, nsl = 0;
    bool even = true;
    for (int u = 0; u < 2; u++) {
        int t = ts[u];
        if (t < 0)
            continue;
        for (int k = rd->start[t]; k < rd->start[t + 1]; k++) {
            const Op *op = &g->ops.v[rd->list[k]];
            if (op->code != OP_SLICE)
                continue;
            int64_t l = op->attr.shape[oa];
            if (l == ys->dim[oa])
                continue;
            even &= len == 0 || l == len;
            len = l;
            nsl++;
        }
    }
    if (nsl >= 2 && even && len > 0 && ys->dim[oa] % len == 0)
        return (int)(ys->dim[oa] / len);
    return 1;
}

static void add_choice(Cand *c, IrShard sh)
{
    for (int k = 0; k < c->nch; k++)
        if (c->ch[k].sh.on == sh.on && c->ch[k].sh.axis == sh.axis &&
            c->ch[k].sh.blocks == sh.blocks)
            return;
    if (c->nch < MAXCH)
        c->ch[c->nch++] = (Choice){.sh = sh};
}

/* Candidates and their choices (followers set per choice). */
static void find_candidates(Auto *x, const Readers *rd)
{
    const Graph *g = x->base;
    for (int t = 0; t < g->t.n; t++)
        x->cand_of[t] = -1;
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *p = &g->t.v[t];
        if (p->kind != TK_PARAM || p->shard.on || p->s.rank < 2 || !dtype_is_float(p->s.dtype))
            continue;
        Cand c = {.t = t};
        c.ch[c.nch++] = (Choice){.sh = {false, 0, 1, 0, 0}};
        x->cand_of[t] = x->cand.n;
        vec_push(&x->cand, c);
    }
    for (int t = 0; t < g->t.n; t++) /* views of a candidate */
        if (x->cand_of[t] < 0 && g->t.v[t].op >= 0 && x->cand_of[view_root(g, t)] >= 0)
            x->cand_of[t] = x->cand_of[view_root(g, t)];
    for (int ci = 0; ci < x->cand.n; ci++) {
        Cand *c = &x->cand.v[ci];
        const Shape *s = &g->t.v[c->t].s;
        int fol[MAXFOL] = {0}, nfol = 0;
        int blocks[IR_MAX_RANK][4], nb[IR_MAX_RANK] = {0};
        bool folax[IR_MAX_RANK][MAXFOL] = {{false}};
        for (int a = 0; a < s->rank; a++)
            blocks[a][nb[a]++] = 1;
        /* its GEMM readers (directly): output axes, biases, slices */
        for (int k = rd->start[c->t]; k < rd->start[c->t + 1]; k++) {
            const Op *op = &g->ops.v[rd->list[k]];
            if (ir_opinfo[op->code].cls != OC_GEMM)
                continue;
            for (int j = 0; j < 2; j++) {
                if (op->in[j] != c->t)
                    continue;
                for (int a = 0; a < s->rank; a++) {
                    int oa = gemm_out_axis(g, op, j, a);
                    if (oa < 0)
                        continue;
                    int before = nfol;
                    int kb = out_users(x, rd, op->out, oa, fol, &nfol);
                    for (int q = before; q < nfol; q++)
                        folax[a][q] = true;
                    bool have = false;
                    for (int q = 0; q < nb[a]; q++)
                        have |= blocks[a][q] == kb;
                    if (!have && nb[a] < 4)
                        blocks[a][nb[a]++] = kb;
                }
            }
        }
        c->nfol = nfol;
        memcpy(c->fol, fol, sizeof fol);
        for (int a = 0; a < s->rank; a++)
            for (int q = 0; q < nb[a]; q++) {
                int64_t k = (int64_t)blocks[a][q] * x->n;
                if (s->dim[a] % k != 0)
                    continue;
                int before = c->nch;
                add_choice(c, (IrShard){true, a, blocks[a][q], 0, 0});
                if (c->nch == before)
                    continue;
                Choice *h = &c->ch[c->nch - 1];
                h->nfol = nfol;
                for (int f = 0; f < nfol; f++) {
                    const Shape *fs = &g->t.v[fol[f]].s;
                    bool on = folax[a][f] && fs->dim[0] % k == 0;
                    h->fol[f] = (IrShard){on, 0, on ? blocks[a][q] : 1, 0, 0};
                }
            }
        c->ch[0].nfol = nfol;
        for (int f = 0; f < nfol; f++)
            c->ch[0].fol[f] = (IrShard){false, 0, 1, 0, 0};
    }
}

/* ---- neighbours ---------------------------------------------------------- */

/* dep[ci * nops + op]: the walk depth at which candidate ci reaches op
 * (-1: not), and the neighbour pairs found (adj[ci * nc + cj]). */
static void walk(const Auto *x, const Readers *rd, int ci, short *dep, bool *adj)
{
    const Graph *g = x->base;
    int nc = x->cand.n, nops = g->ops.n;
    short *d = dep + (size_t)ci * (size_t)nops;
    int *q = xmalloc(sizeof(int) * 2 * (size_t)(g->t.n + 1));
    int qh = 0, qt = 0;
    for (int t = 0; t < g->t.n; t++)
        if (x->cand_of[t] == ci)
            q[qt++] = t, q[qt++] = 0;
    while (qh < qt) {
        int t = q[qh++], dt = q[qh++];
        for (int k = rd->start[t]; k < rd->start[t + 1]; k++) {
            int oi = rd->list[k];
            if (d[oi] >= 0)
                continue;
            const Op *op = &g->ops.v[oi];
            bool view = x->cand_of[op->out] == ci;
            d[oi] = (short)(view ? dt : dt + 1);
            bool stop = false;
            for (int j = 0; j < op->nin; j++) {
                int cj = x->cand_of[op->in[j]];
                if (cj >= 0 && cj != ci) {
                    adj[(size_t)ci * (size_t)nc + (size_t)cj] = true;
                    adj[(size_t)cj * (size_t)nc + (size_t)ci] = true;
                    stop = true;
                }
            }
            if (view)
                q[qt++] = op->out, q[qt++] = dt;
            else if (!stop && dt + 1 < HOPS)
                q[qt++] = op->out, q[qt++] = dt + 1;
        }
    }
    free(q);
}

static bool neighbours(const Auto *x, const Readers *rd, bool *adj)
{
    const Graph *g = x->base;
    int nc = x->cand.n, nops = g->ops.n;
    short *dep = xmalloc(sizeof(short) * (size_t)nc * (size_t)nops + 1);
    for (size_t k = 0; k < (size_t)nc * (size_t)nops; k++)
        dep[k] = -1;
    for (int ci = 0; ci < nc; ci++)
        walk(x, rd, ci, dep, adj);
    /* walks meeting at an op */
    int *who = xmalloc(sizeof(int) * (size_t)(nc + 1));
    for (int oi = 0; oi < nops; oi++) {
        int m = 0;
        for (int ci = 0; ci < nc; ci++)
            if (dep[(size_t)ci * (size_t)nops + (size_t)oi] >= 0)
                who[m++] = ci;
        for (int a = 0; a < m; a++)
            for (int b = a + 1; b < m; b++)
                if (dep[(size_t)who[a] * (size_t)nops + (size_t)oi] +
                        dep[(size_t)who[b] * (size_t)nops + (size_t)oi] <= HOPS / 2)
                    adj[(size_t)who[a] * (size_t)nc + (size_t)who[b]] =
                        adj[(size_t)who[b] * (size_t)nc + (size_t)who[a]] = true;
    }
    free(who);
    free(dep);
    return true;
}

/* ---- the ILP ------------------------------------------------------------- */

typedef struct {
    VEC(int) ia, ja;
    VEC(double) ar;
} Nz;

static void nz(Nz *z, int r, int c, double v)
{
    vec_push(&z->ia, r);
    vec_push(&z->ja, c);
    vec_push(&z->ar, v);
}

/* Stops branch and bound after ILP_NODES branchings: a count, not a time,
 * so that every rank makes the same choice. */
static void count_branches(glp_tree *T, void *info)
{
    long *n = info;
    if (glp_ios_reason(T) == GLP_IBRANCH && ++*n > ILP_NODES)
        glp_ios_terminate(T);
}

static bool solve(Auto *x, const bool *adj, double mem_left, Diag *d)
{
    glp_term_out(GLP_OFF);
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    Nz z = {0};
    nz(&z, 0, 0, 0.0); /* GLPK is 1-based */
    int col = 0, row;
    for (int ci = 0; ci < x->cand.n; ci++) {
        Cand *c = &x->cand.v[ci];
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_FX, 1, 1);
        glp_add_cols(lp, c->nch);
        for (int h = 0; h < c->nch; h++) {
            c->ch[h].col = ++col;
            glp_set_col_kind(lp, col, GLP_BV);
            if (c->ch[h].bad)
                glp_set_col_bnds(lp, col, GLP_FX, 0, 0);
            glp_set_obj_coef(lp, col, total(&c->ch[h].u) * 1e6); /* microseconds */
            nz(&z, row, col, 1.0);
        }
    }
    /* per neighbour pair (i, j), y_ab = x_ia x_jb for every a, b, held by
     * the marginal rows sum_b y_ab = x_ia and sum_a y_ab = x_jb (tighter
     * than a product's usual three rows: the LP is near-integral) */
    int nc = x->cand.n, p = 0;
    for (int i = 0; i < nc; i++)
        for (int j = i + 1; j < nc; j++) {
            if (!adj[(size_t)i * (size_t)nc + (size_t)j])
                continue;
            const Cand *ci = &x->cand.v[i], *cj = &x->cand.v[j];
            int y0 = col + 1;
            glp_add_cols(lp, ci->nch * cj->nch);
            for (int a = 0; a < ci->nch; a++)
                for (int b2 = 0; b2 < cj->nch; b2++) {
                    ++col;
                    glp_set_col_kind(lp, col, GLP_CV);
                    glp_set_col_bnds(lp, col, GLP_DB, 0, 1);
                }
            for (; p < x->pair.n && x->pair.v[p].i == i && x->pair.v[p].j == j; p++) {
                Pair *q = &x->pair.v[p];
                q->col = y0 + q->a * cj->nch + q->b;
                if (q->bad)
                    glp_set_col_bnds(lp, q->col, GLP_FX, 0, 0);
                else
                    glp_set_obj_coef(lp, q->col, q->w * 1e6);
            }
            for (int a = 0; a < ci->nch; a++) {
                row = glp_add_rows(lp, 1);
                glp_set_row_bnds(lp, row, GLP_FX, 0, 0);
                nz(&z, row, ci->ch[a].col, -1.0);
                for (int b2 = 0; b2 < cj->nch; b2++)
                    nz(&z, row, y0 + a * cj->nch + b2, 1.0);
            }
            for (int b2 = 0; b2 < cj->nch; b2++) {
                row = glp_add_rows(lp, 1);
                glp_set_row_bnds(lp, row, GLP_FX, 0, 0);
                nz(&z, row, cj->ch[b2].col, -1.0);
                for (int a = 0; a < ci->nch; a++)
                    nz(&z, row, y0 + a * cj->nch + b2, 1.0);
            }
        }
    if (p != x->pair.n)
        die("pass_shard_auto: pair terms out of order");
    if (mem_left > 0) { /* MiB */
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_UP, 0, mem_left / 1048576.0);
        for (int ci = 0; ci < x->cand.n; ci++)
            for (int h = 0; h < x->cand.v[ci].nch; h++)
                nz(&z, row, x->cand.v[ci].ch[h].col, x->cand.v[ci].ch[h].u.mem / 1048576.0);
    }
    glp_load_matrix(lp, z.ia.n - 1, z.ia.v, z.ja.v, z.ar.v);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    long branches = 0;
    parm.cb_func = count_branches;
    parm.cb_info = &branches;
    int rc = glp_intopt(lp, &parm), st = glp_mip_status(lp);
    /* stopped with a layout in hand: take it (the caller checks it) */
    bool ok = (rc == 0 || rc == GLP_ESTOP) && (st == GLP_OPT || st == GLP_FEAS);
    x->timed_out = rc == GLP_ESTOP;
    if (ok) {
        for (int ci = 0; ci < x->cand.n; ci++) {
            Cand *c = &x->cand.v[ci];
            c->pick = 0;
            for (int h = 0; h < c->nch; h++)
                if (glp_mip_col_val(lp, c->ch[h].col) > 0.5)
                    c->pick = h;
        }
    } else {
        snprintf(d->msg, sizeof d->msg,
                 "shard=auto: the sharding ILP has no solution (GLPK: %s)%s",
                 rc == GLP_ENOPFS || st == GLP_NOFEAS ? "infeasible"
                 : rc == GLP_ESTOP                     ? "branching limit"
                                                       : "failed",
                 mem_left > 0 ? "; the params, gradients and optimizer state may not fit the "
                                "device's memory even split (expected a larger tp or a "
                                "smaller model)"
                              : "");
    }
    glp_delete_prob(lp);
    vec_free(&z.ia);
    vec_free(&z.ja);
    vec_free(&z.ar);
    return ok;
}

/* ---- rounds: the ILP around an incumbent layout --------------------------- */

/* cost of one choice per candidate (pk) */
static Cost cost_picks(Auto *x, const int *pk)
{
    int nc = x->cand.n;
    int *ts = xmalloc(sizeof(int) * (size_t)(nc + 1) * (MAXFOL + 1));
    IrShard *sh = xmalloc(sizeof(IrShard) * (size_t)(nc + 1) * (MAXFOL + 1));
    int n = 0;
    for (int ci = 0; ci < nc; ci++)
        n = assign(x, ci, pk[ci], ts, sh, n);
    Cost c = oracle(x, ts, sh, n);
    free(ts);
    free(sh);
    return c;
}

static Cost diff(const Cost *a, const Cost *b)
{
    Cost c = *a;
    for (int k = 0; k < NTERM; k++)
        c.t[k] -= b->t[k];
    c.ncoll -= b->ncoll;
    return c;
}

/* The terms around incumbent s (cost cs): u of every other choice of each
 * candidate, the others as in s; w of every neighbour pair's other
 * choices; then the ILP, its choice in cand[].pick and its sum of terms in
 * *pred. */
static bool round_ilp(Auto *x, const int *s, const Cost *cs, const bool *adj, double mem_left,
                      double *pred, Diag *d)
{
    int nc = x->cand.n;
    int *pk = xmalloc(sizeof(int) * (size_t)(nc + 1));
    memcpy(pk, s, sizeof(int) * (size_t)nc);
    x->pair.n = 0;
    for (int ci = 0; ci < nc; ci++) {
        Cand *cd = &x->cand.v[ci];
        for (int h = 0; h < cd->nch; h++) {
            Choice *ch = &cd->ch[h];
            double mem = ch->u.mem;
            ch->bad = false;
            if (h == s[ci]) {
                ch->u = (Cost){.ok = true};
            } else {
                pk[ci] = h;
                Cost c = cost_picks(x, pk);
                pk[ci] = s[ci];
                ch->bad = !c.ok;
                ch->u = c.ok ? diff(&c, cs) : (Cost){0};
            }
            ch->u.mem = mem;
        }
    }
    for (int i = 0; i < nc; i++)
        for (int j = i + 1; j < nc; j++) {
            if (!adj[(size_t)i * (size_t)nc + (size_t)j])
                continue;
            const Cand *ci = &x->cand.v[i], *cj = &x->cand.v[j];
            for (int a = 0; a < ci->nch; a++)
                for (int b = 0; b < cj->nch; b++) {
                    if (a == s[i] || b == s[j] || ci->ch[a].bad || cj->ch[b].bad)
                        continue;
                    pk[i] = a, pk[j] = b;
                    Cost c = cost_picks(x, pk);
                    pk[i] = s[i], pk[j] = s[j];
                    Pair q = {i, a, j, b, 0, !c.ok, 0};
                    if (c.ok)
                        q.w = total(&c) - total(cs) - total(&ci->ch[a].u) - total(&cj->ch[b].u);
                    if (q.bad || fabs(q.w) > 1e-12 + 1e-9 * total(cs))
                        vec_push(&x->pair, q);
                }
        }
    free(pk);
    if (!solve(x, adj, mem_left, d))
        return false;
    *pred = total(cs);
    for (int ci = 0; ci < nc; ci++)
        *pred += total(&x->cand.v[ci].ch[x->cand.v[ci].pick].u);
    for (int p = 0; p < x->pair.n; p++) {
        const Pair *q = &x->pair.v[p];
        if (!q->bad && x->cand.v[q->i].pick == q->a && x->cand.v[q->j].pick == q->b)
            *pred += q->w;
    }
    return true;
}

static double mem_of(const Auto *x, const int *pk)
{
    double m = 0;
    for (int ci = 0; ci < x->cand.n; ci++)
        m += x->cand.v[ci].ch[pk[ci]].u.mem;
    return m;
}

/* ---- the report ---------------------------------------------------------- */

/* "column-parallel" etc.: what a split of param t along axis means to its
 * first reader that is a GEMM or a gather. */
static const char *role_name(const Auto *x, const Readers *rd, int t, int axis)
{
    const Graph *g = x->base;
    for (int k = rd->start[t]; k < rd->start[t + 1]; k++) {
        const Op *op = &g->ops.v[rd->list[k]];
        if (op->code == OP_GATHER && op->in[0] == t)
            return axis == 0 ? "by rows (vocabulary-parallel)" : "by columns of the table";
        if (ir_opinfo[op->code].cls == OC_GEMM)
            for (int j = 0; j < 2; j++)
                if (op->in[j] == t) {
                    int r = ir_matmul_role(&g->t.v[t].s, axis, op->attr.ia[j] != 0, j == 1);
                    return r == 2 ? "row-parallel (contraction axis)"
                           : r == 1 ? "column-parallel (output axis)"
                                    : "along a batch axis";
                }
    }
    return "";
}

typedef struct {
    char *b;
    size_t n, cap;
} Buf;

static void put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Buf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->b ? b->b + b->n : NULL, b->b ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0)
            return;
        if (b->b && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->b = xrealloc(b->b, b->cap);
    }
}

static const char *sh_str(const IrShard *s, char *b, size_t n)
{
    if (!s->on)
        snprintf(b, n, "whole");
    else if (s->blocks > 1)
        snprintf(b, n, "split axis %d in %d blocks", s->axis, s->blocks);
    else
        snprintf(b, n, "split axis %d", s->axis);
    return b;
}

static void put_cost(Buf *b, const char *what, const Cost *c)
{
    char t0[32], t1[32], t2[32], t3[32];
    put(b, "%s%s = compute %s + TP comm %s (%d collectives) + update %s\n", what,
        ir_fmt_seconds_ms(total(c), 3, t0, sizeof t0),
        ir_fmt_seconds_ms(c->t[T_COMP], 3, t1, sizeof t1),
        ir_fmt_seconds_ms(c->t[T_COMM], 3, t2, sizeof t2), c->ncoll,
        ir_fmt_seconds_ms(c->t[T_UPD], 3, t3, sizeof t3));
}

/* The header lines; the per-param lines follow (pass_shard_auto). */
static void report_head(const Auto *x, int npairs, Buf *b)
{
    const Graph *g = x->base;
    const PassShardCost *c = x->c;
    put(b, "auto-sharding (shard=auto): tp = %d, costed on %s (GEMMs %.4g TFLOP/s, memory "
           "%.4g GB/s, TP link %.4g GB/s, alpha %.3g us per hop)\n",
        x->n, c->device ? c->device : "?", c->flops / 1e12, c->mem_bw / 1e9, c->link_bw / 1e9,
        c->alpha_s * 1e6);
    int nfixed = 0;
    for (int t = 0; t < g->t.n; t++)
        nfixed += g->t.v[t].kind == TK_PARAM && g->t.v[t].shard.on;
    put(b, "  %d candidate params (rank >= 2, not marked by the script), %d params marked by "
           "the script (kept), %d neighbour pairs\n",
        x->cand.n, nfixed, npairs);
    put_cost(b, "  no candidate split: ", &x->none);
}

/* ---- the entry point ------------------------------------------------------ */

#define MAXROUNDS 8

bool pass_shard_auto(Graph *g, const PassOpts *o, const PassShardCost *c, char **text,
                     Diag *d)
{
    if (text)
        *text = NULL;
    if (o->tp <= 1)
        return true;
    if (!(c->flops > 0 && c->mem_bw > 0 && c->link_bw > 0 && c->alpha_s >= 0))
        die("pass_shard_auto: cost figures missing");
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].shard.on && g->t.v[i].shard.n) {
            snprintf(d->msg, sizeof d->msg,
                     "shard=auto: param \"%s\" is already rank %d's part (expected the whole "
                     "forward graph)", g->t.v[i].name, g->t.v[i].shard.rank);
            return false;
        }
    Graph *base = ir_clone(g);
    if (o->attention && !pass_attention(base, o, d)) {
        ir_free(base);
        return false;
    }
    Auto x = {.base = base, .o = o, .c = c, .n = o->tp};
    x.cand_of = xmalloc(sizeof(int) * (size_t)(base->t.n + 1));
    Readers rd = readers(base);
    find_candidates(&x, &rd);
    int nc = x.cand.n;
    int *s = xcalloc((size_t)nc + 1, sizeof(int)), *pk = xcalloc((size_t)nc + 1, sizeof(int));
    bool *adj = NULL;
    Buf b = {0};
    bool ok = true;
    x.none = oracle(&x, NULL, NULL, 0);
    if (!x.none.ok) {
        /* the script's own marks do not partition: say what partition says */
        Graph *t = ir_clone(base);
        PassOpts po = *o;
        po.tp_rank = 0;
        ok = pass_partition(t, &po, d);
        ir_free(t);
        if (ok)
            die("pass_shard_auto: partition failed, then passed");
        goto out;
    }
    /* drop the choices the partition pass refuses on their own; each
     * choice's memory (params + gradients + AdamW state, per rank) */
    for (int ci = 0; ci < nc; ci++) {
        Cand *cd = &x.cand.v[ci];
        int keep = 0;
        for (int h = 0; h < cd->nch; h++) {
            if (h > 0) {
                pk[ci] = h;
                Cost u = cost_picks(&x, pk);
                pk[ci] = 0;
                if (!u.ok)
                    continue;
            }
            int ts[MAXFOL + 1];
            IrShard sh[MAXFOL + 1];
            int n = assign(&x, ci, h, ts, sh, 0);
            cd->ch[h].u.mem = 0;
            for (int k = 0; k < n; k++)
                cd->ch[h].u.mem +=
                    4.0 * (double)shape_bytes(&base->t.v[ts[k]].s) / (sh[k].on ? x.n : 1);
            cd->ch[keep++] = cd->ch[h];
        }
        cd->nch = keep;
    }
    int npairs = 0;
    adj = xcalloc((size_t)nc * (size_t)nc + 1, 1);
    neighbours(&x, &rd, adj);
    for (size_t k = 0; k < (size_t)nc * (size_t)nc; k++)
        npairs += adj[k];
    npairs /= 2;
    /* memory: the device's, less the params that are not candidates */
    double mem_left = 0;
    if (c->mem > 0) {
        mem_left = c->mem - (x.none.mem - mem_of(&x, s));
        if (mem_left <= 0)
            mem_left = 1; /* infeasible: the ILP says so */
    }
    report_head(&x, npairs, &b);
    /* rounds: terms around the incumbent s, the ILP, its layout checked by
     * partitioning it whole; kept only where the check improves on s (else
     * the best single change, which the terms give exactly) */
    Cost cs = x.none;
    char t0[32], t1[32];
    for (int r = 1; r <= MAXROUNDS; r++) {
        double pred;
        int runs0 = x.runs;
        if (!(ok = round_ilp(&x, s, &cs, adj, mem_left, &pred, d)))
            goto out;
        for (int ci = 0; ci < nc; ci++)
            pk[ci] = x.cand.v[ci].pick;
        Cost cp = cost_picks(&x, pk);
        double tol = 1e-9 * total(&cs) + 1e-12;
        put(&b, "  round %d: %d partition runs, %d pair terms; ILP objective %s%s, checked %s", r,
            x.runs - runs0, x.pair.n, ir_fmt_seconds_ms(pred, 3, t0, sizeof t0),
            x.timed_out ? " (at GLPK's branching limit: its best so far)" : "",
            cp.ok ? ir_fmt_seconds_ms(total(&cp), 3, t1, sizeof t1) : "(does not partition)");
        if (cp.ok && total(&cp) < total(&cs) - tol) {
            memcpy(s, pk, sizeof(int) * (size_t)nc);
            cs = cp;
            put(&b, ": taken\n");
            continue;
        }
        int bi = -1, bh = 0;
        double best = -tol;
        for (int ci = 0; ci < nc; ci++)
            for (int h = 0; h < x.cand.v[ci].nch; h++) {
                const Choice *ch = &x.cand.v[ci].ch[h];
                double dm = ch->u.mem - x.cand.v[ci].ch[s[ci]].u.mem;
                if (h == s[ci] || ch->bad || total(&ch->u) >= best ||
                    (mem_left > 0 && mem_of(&x, s) + dm > mem_left))
                    continue;
                best = total(&ch->u), bi = ci, bh = h;
            }
        if (bi < 0) {
            put(&b, ": %s, so the layout stands\n",
                cp.ok && total(&cp) < total(&cs) + tol ? "no better" : "worse");
            break;
        }
        s[bi] = bh;
        cs = cost_picks(&x, s);
        put(&b, ": not better; the best single change instead (%s), checked %s\n",
            base->t.v[x.cand.v[bi].t].name, ir_fmt_seconds_ms(total(&cs), 3, t0, sizeof t0));
    }
    if (!cs.ok)
        die("pass_shard_auto: the incumbent layout stopped partitioning");
    put_cost(&b, "  objective (rank 0's step, predicted): ", &cs);
    {
        char m0[32], m1[32];
        put(&b, "  params + gradients + AdamW state per rank: %s (no candidate split: %s)\n",
            ir_fmt_bytes(cs.mem, 2, m0, sizeof m0), ir_fmt_bytes(x.none.mem, 2, m1, sizeof m1));
    }
    int nsplit = 0;
    for (int ci = 0; ci < nc; ci++)
        nsplit += s[ci] != 0;
    put(&b, "  %d of %d candidates split; each param's choice, and what it would cost to keep "
            "it whole instead (the others as chosen):\n",
        nsplit, nc);
    for (int ci = 0; ci < nc; ci++) {
        const Cand *cd = &x.cand.v[ci];
        const Choice *h = &cd->ch[s[ci]];
        const Tensor *t = &base->t.v[cd->t];
        char sb[64], cb[64], t2[32];
        put(&b, "  %-28s %-14s %s%s%s", t->name, shape_str(base, &t->s, sb, sizeof sb),
            sh_str(&h->sh, cb, sizeof cb), h->sh.on ? ", " : "",
            h->sh.on ? role_name(&x, &rd, cd->t, h->sh.axis) : "");
        if (h->sh.on) {
            memcpy(pk, s, sizeof(int) * (size_t)nc);
            pk[ci] = 0;
            Cost w = cost_picks(&x, pk);
            if (w.ok) {
                Cost dw = diff(&w, &cs);
                put(&b, "; whole: %s%s (compute %s%s, comm %s%s)", total(&dw) >= 0 ? "+" : "",
                    ir_fmt_seconds_ms(total(&dw), 3, t0, sizeof t0),
                    dw.t[T_COMP] >= 0 ? "+" : "", ir_fmt_seconds_ms(dw.t[T_COMP], 3, t1, sizeof t1),
                    dw.t[T_COMM] >= 0 ? "+" : "", ir_fmt_seconds_ms(dw.t[T_COMM], 3, t2, sizeof t2));
            }
        }
        put(&b, "\n");
        for (int f = 0; f < cd->nfol; f++)
            if (h->fol[f].on)
                put(&b, "  %-28s %-14s %s (follows %s)\n", base->t.v[cd->fol[f]].name,
                    shape_str(base, &base->t.v[cd->fol[f]].s, sb, sizeof sb),
                    sh_str(&h->fol[f], cb, sizeof cb), t->name);
    }
    /* the choice on g */
    {
        int *ts = xmalloc(sizeof(int) * (size_t)(nc + 1) * (MAXFOL + 1));
        IrShard *sh = xmalloc(sizeof(IrShard) * (size_t)(nc + 1) * (MAXFOL + 1));
        int n = 0;
        for (int ci = 0; ci < nc; ci++)
            n = assign(&x, ci, s[ci], ts, sh, n);
        for (int k = 0; k < n; k++)
            g->t.v[ts[k]].shard = sh[k];
        free(ts);
        free(sh);
    }
    if (text) {
        *text = b.b;
        b.b = NULL;
    }
out:
    free(b.b);
    free(adj);
    free(s);
    free(pk);
    free(rd.start);
    free(rd.list);
    free(x.cand_of);
    vec_free(&x.cand);
    vec_free(&x.pair);
    ir_free(base);
    return ok;
}

void pass_shard_copy(const Graph *from, Graph *to)
{
    for (int i = 0; i < to->t.n; i++) {
        Tensor *t = &to->t.v[i];
        if (t->kind != TK_PARAM || !t->name)
            continue;
        for (int j = 0; j < from->t.n; j++)
            if (from->t.v[j].kind == TK_PARAM && from->t.v[j].name &&
                strcmp(from->t.v[j].name, t->name) == 0) {
                t->shard = from->t.v[j].shard;
                break;
            }
    }
}
