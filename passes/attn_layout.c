/* attn_layout.c - the attention layout pass: puts each attention group (an
 * `attention` op, its attention_lse and its attention_dq/dk/dv, autodiff's
 * output) into the head layout (ir.h: {heads, hd, qoff, koff, voff}) when
 * q, k and v are head splits of [B, T, *] tensors, so that the kernels read
 * q, k and v straight out of the [B, T, 3C] qkv projection and write o, dq,
 * dk and dv as [B, T, C] rows: the permute, slice and reshape copies that
 * nn.split_heads / nn.merge_heads put around attention disappear.
 * Runs after autodiff, before simplify (which then cancels the chains this
 * pass leaves: permute(permute(x)) -> x, reshape(reshape(x)) -> x, and
 * drops what nothing reads any more).
 *
 * Matched, per operand of the attention op (q, k, v, each [B, H, T, D]):
 *   permute(reshape(slice(A, [0, 0, off], [B, T, H*D])), perm=[0,2,1,3])
 *                           -> A [B, T, W] read at column offset off
 *   permute(reshape(x), perm=[0,2,1,3]), x [B, T, H*D]  -> x at offset 0
 * with one B, H, D (Dv == D) for all three, except that k and v may have
 * Hk heads (grouped-query attention: kvh=Hk; the other variants' attrs are
 * kept as they are). A group whose q, k or v is no
 * such chain keeps the plain layout, unchanged.
 * Rewrite (every step is the same function, so nothing else needs to hold):
 *   - each group op is re-made in the head layout reading A (and dO' =
 *     reshape(permute(dO)), lse' = permute(lse), delta' as below), and its
 *     old result is redefined from the new one: permute(reshape(o')) for o,
 *     dq, dk, dv; permute(lse') for lse. Readers of the old results are
 *     untouched; simplify cancels the permute pairs.
 *   - delta = reduce_sum(mul(a, b), axes=[3]) (autodiff's sum of dO * o,
 *     casts allowed on a and b) is recomputed as the sum over the last axis
 *     of mul(a', b') [B*T, H, D], a' = reshape(reshape(permute(a))) (the
 *     inner one to [B, T, H*D], through a cast), which simplify turns into
 *     backward views of dO' and o'. ([B*T, H, D], not [B, T, H, D]: CSE
 *     would merge that view with o's forward redefinition, and remat
 *     would count the forward view as a saved activation.) Any other
 *     delta is permuted.
 * Invariant: the graph computes the same values; the op order stays valid
 * (new ops are placed right before their first reader, each lse right
 * after its attention op). */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

static const int64_t PERM[4] = {0, 2, 1, 3};

typedef struct {
    Graph *g;
    SrcLoc loc;          /* of the op being rewritten: every op it adds */
    int64_t B, H, T, D;  /* q's [B, H, T, D] */
} Ctx;

static const Op *def(const Graph *g, int t)
{
    int i = g->t.v[t].op;
    return i >= 0 ? &g->ops.v[i] : NULL;
}

static bool is_perm0213(const Op *op)
{
    if (!op || op->code != OP_PERMUTE || op->attr.nia != 4)
        return false;
    for (int k = 0; k < 4; k++)
        if (op->attr.ia[k] != PERM[k])
            return false;
    return true;
}

/* Whether t [B, H, T, D] is a head split of a [B, T, W] tensor: *a and *off. */
static bool head_split(const Graph *g, int t, int64_t D, int *a, int64_t *off)
{
    const Shape *s = &g->t.v[t].s;
    if (s->rank != 4 || s->dim[3] != D)
        return false;
    const Op *p = def(g, t);
    if (!is_perm0213(p))
        return false;
    const Op *r = def(g, p->in[0]);
    if (!r || r->code != OP_RESHAPE)
        return false;
    int x = r->in[0];
    const Shape *xs = &g->t.v[x].s;
    if (xs->rank != 3 || xs->dim[0] != s->dim[0] || xs->dim[1] != s->dim[2] ||
        xs->dim[2] != s->dim[1] * D)
        return false;
    *a = x;
    *off = 0;
    const Op *sl = def(g, x);
    if (sl && sl->code == OP_SLICE && sl->attr.ia[0] == 0 && sl->attr.ia[1] == 0) {
        const Shape *as = &g->t.v[sl->in[0]].s;
        if (as->rank == 3 && as->dim[0] == xs->dim[0] && as->dim[1] == xs->dim[1]) {
            *a = sl->in[0];
            *off = sl->attr.ia[2];
        }
    }
    return true;
}

/* Appends an op (at c->loc, with flags) and returns its result. */
static int add(Ctx *c, Opcode code, const int *in, int nin, const OpAttr *a, unsigned flags)
{
    int t = ir_op_x(c->g, code, in, nin, a, c->loc);
    c->g->ops.v[c->g->ops.n - 1].flags = flags;
    return t;
}

static int permute(Ctx *c, int t, unsigned flags)
{
    OpAttr a = {.nia = 4, .ia = {0, 2, 1, 3}};
    return add(c, OP_PERMUTE, &t, 1, &a, flags);
}

static int reshape(Ctx *c, int t, int rank, const int64_t *dim, unsigned flags)
{
    OpAttr a = {0};
    Shape s = shape_make(c->g->t.v[t].s.dtype, rank, dim);
    ir_attr_set_shape(&a, &s);
    return add(c, OP_RESHAPE, &t, 1, &a, flags);
}

/* t [B, H, T, D] as [B, T, H*D]: reshape(permute(t)), through a cast
 * (cast(reshape(permute(u)))), so that simplify cancels it against a
 * head split or the redefined o and no forward view is left for the
 * backward to read. */
static int merged(Ctx *c, int t, unsigned flags)
{
    const Op *p = def(c->g, t);
    if (p && p->code == OP_CAST) {
        OpAttr a = p->attr;
        int u = merged(c, p->in[0], flags);
        return add(c, OP_CAST, &u, 1, &a, flags);
    }
    int pt = permute(c, t, flags);
    return reshape(c, pt, 3, (int64_t[]){c->B, c->T, c->H * c->D}, flags);
}

/* delta' [B, T, H, 1] for delta [B, H, T, 1]. */
static int delta_heads(Ctx *c, int delta, unsigned flags)
{
    const Op *rs = def(c->g, delta);
    if (rs && rs->code == OP_REDUCE_SUM && rs->attr.nia == 1 && rs->attr.ia[0] == 3) {
        const Op *m = def(c->g, rs->in[0]);
        if (m && m->code == OP_MUL && shape_dims_eq(&c->g->t.v[m->in[0]].s,
                                                    &c->g->t.v[m->in[1]].s)) {
            int64_t rhd[3] = {c->B * c->T, c->H, c->D};
            int x = m->in[0], y = m->in[1]; /* m moves once ops are added */
            int in[2] = {reshape(c, merged(c, x, flags), 3, rhd, flags),
                         reshape(c, merged(c, y, flags), 3, rhd, flags)};
            int prod = add(c, OP_MUL, in, 2, &(OpAttr){0}, flags);
            OpAttr ax = {.nia = 1, .ia = {2}};
            int sum = add(c, OP_REDUCE_SUM, &prod, 1, &ax, flags);
            return reshape(c, sum, 4, (int64_t[]){c->B, c->T, c->H, 1}, flags);
        }
    }
    return permute(c, delta, flags);
}

static bool same_attn(const Op *a, const Op *b)
{
    return !ir_attn_heads(&a->attr) && ir_attn_same_attrs(&a->attr, &b->attr);
}

/* Rewrites the group of the attention op at index i; false when its q, k,
 * v are not head splits (nothing changed). */
static bool rewrite(Graph *g, int i)
{
    const Op *op = &g->ops.v[i]; /* g->ops and g->t move once ops are added */
    const Shape qs = g->t.v[op->in[0]].s;
    if (qs.rank != 4 || !dtype_is_float(qs.dtype))
        return false;
    int64_t D = qs.dim[3];
    int a[3];
    int64_t off[3];
    /* k and v: H heads, or Hk (grouped-query attention) */
    int64_t Hk = g->t.v[op->in[1]].s.dim[1];
    for (int x = 0; x < 3; x++) {
        if (!head_split(g, op->in[x], D, &a[x], &off[x]) ||
            g->t.v[op->in[x]].s.dim[1] != (x ? Hk : qs.dim[1]))
            return false;
    }
    int q = op->in[0], k = op->in[1], v = op->in[2];
    OpAttr na = {.nia = 6, .ia = {op->attr.ia[0], qs.dim[1], D, off[0], off[1], off[2]},
                 .f = op->attr.f};
    ir_attn_set_variant(&na, ir_attn_window(&op->attr), ir_attn_alibi(&op->attr), Hk,
                        ir_attn_bias(&op->attr));
    int bias = ir_attn_bias_in(op); /* read in place: its shape is the scores' [B, H, T, T] */
    /* the group: same q, k (v), same attrs; its members in program order */
    int n0 = g->ops.n, nmem = 0;
    int *mem = xmalloc(sizeof(int) * (size_t)n0);
    for (int j = 0; j < n0; j++) {
        const Op *b = &g->ops.v[j];
        if (ir_opinfo[b->code].cls == OC_ATTN && b->in[0] == q && b->in[1] == k &&
            (b->code == OP_ATTENTION_LSE || b->in[2] == v) && same_attn(op, b) &&
            ir_attn_bias_in(b) == bias)
            mem[nmem++] = j;
    }
    int dO = -1, dO2 = -1, lse = -1, lse2 = -1, delta = -1, delta2 = -1;
    for (int m = 0; m < nmem; m++) {
        int j = mem[m];
        Op old = g->ops.v[j];
        Ctx c = {g, old.loc, qs.dim[0], qs.dim[1], qs.dim[2], D};
        unsigned fl = old.flags & ~(unsigned)OPF_RECOMPUTE;
        int in[7] = {a[0], a[1], a[2], -1, -1, -1, -1};
        int base = ir_attn_nbase(old.code);
        if (base == 6) {
            if (old.in[3] != dO) {
                dO = old.in[3];
                int p = permute(&c, dO, fl);
                dO2 = reshape(&c, p, 3, (int64_t[]){c.B, c.T, c.H * D}, fl);
            }
            if (old.in[4] != lse) {
                lse = old.in[4];
                lse2 = permute(&c, lse, fl);
            }
            if (old.in[5] != delta) {
                delta = old.in[5];
                delta2 = delta_heads(&c, delta, fl);
            }
            in[3] = dO2, in[4] = lse2, in[5] = delta2;
        }
        if (bias >= 0)
            in[base] = bias;
        int t = add(&c, old.code, in, base + (bias >= 0), &na, old.flags);
        /* the old op now redefines its result from t */
        int src = t;
        if (old.code != OP_ATTENTION_LSE) {
            Shape os = g->t.v[old.out].s;
            src = reshape(&c, t, 4, (int64_t[]){os.dim[0], os.dim[2], os.dim[1], os.dim[3]},
                          old.flags);
        }
        Op *o = &g->ops.v[j];
        o->code = OP_PERMUTE;
        o->in = xrealloc(o->in, sizeof(int));
        o->nin = 1;
        o->in[0] = src;
        memset(&o->attr, 0, sizeof o->attr);
        o->attr.nia = 4;
        memcpy(o->attr.ia, PERM, sizeof PERM);
    }
    free(mem);
    return true;
}

typedef struct {
    Graph *g;
    bool *done;
    int *order, n;
} Topo;

/* Emits op i after the producers of its operands (program order otherwise). */
static void visit(Topo *t, int i)
{
    if (t->done[i])
        return;
    t->done[i] = true;
    const Op *op = &t->g->ops.v[i];
    for (int x = 0; x < op->nin; x++) {
        int p = t->g->t.v[op->in[x]].op;
        if (p >= 0 && !t->done[p])
            visit(t, p);
    }
    t->order[t->n++] = i;
    /* an attention op's lse right after it (the backends pair them) */
    if (op->code == OP_ATTENTION && ir_attn_heads(&op->attr))
        for (int j = 0; j < t->g->ops.n; j++) {
            const Op *l = &t->g->ops.v[j];
            if (l->code == OP_ATTENTION_LSE && l->in[0] == op->in[0] && l->in[1] == op->in[1] &&
                ir_attn_same_attrs(&l->attr, &op->attr))
                visit(t, j);
        }
}

bool pass_attention_layout(Graph *g, const PassOpts *o, Diag *d)
{
    (void)d;
    if (!o->attention)
        return true;
    int n0 = g->ops.n, nrw = 0;
    for (int i = 0; i < n0; i++)
        if (g->ops.v[i].code == OP_ATTENTION && !ir_attn_heads(&g->ops.v[i].attr) &&
            rewrite(g, i))
            nrw++;
    if (!nrw)
        return true;
    Topo t = {g, xcalloc((size_t)g->ops.n, sizeof(bool)),
              xmalloc(sizeof(int) * (size_t)g->ops.n), 0};
    for (int i = 0; i < g->ops.n; i++)
        visit(&t, i);
    ir_reorder_ops(g, t.order, t.n);
    ir_compact(g);
    free(t.done);
    free(t.order);
    return true;
}
