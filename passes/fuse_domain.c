/* fuse_domain.c - the loop domain of a fuse group (FuseDomain: a full shape
 * split at an axis into outer and inner parts, ELEM, ROW or COL), whether
 * an op set fits one, and which tensors a grouping materialises. The fuse
 * pass (fuse*.c) asks these while it groups; codegen and memplan read the
 * exported ones (passes.h). */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

bool pass_fuse_is_reduce(const Op *op)
{
    return op->code == OP_REDUCE_SUM || op->code == OP_REDUCE_MAX ||
           op->code == OP_REDUCE_LOGSUMEXP;
}

/* Reduction axes pattern: FUSE_ROW with k = first axis for trailing axes,
 * FUSE_COL with k = count for leading axes; -1 for anything else. */
int pass_fuse_reduce_pattern(const Graph *g, const Op *op, int *k)
{
    int r = g->t.v[op->in[0]].s.rank, n = op->attr.nia;
    if (n == 0 || r == 0)
        return -1;
    bool trailing = op->attr.ia[n - 1] == r - 1, leading = op->attr.ia[0] == 0;
    for (int i = 1; i < n; i++)
        if (op->attr.ia[i] != op->attr.ia[i - 1] + 1)
            return -1;
    if (trailing) {
        *k = (int)op->attr.ia[0];
        return FUSE_ROW;
    }
    if (leading) {
        *k = n;
        return FUSE_COL;
    }
    return -1;
}

bool pass_fuse_op_fusable(const Graph *g, const Op *op)
{
    int k;
    switch (ir_opinfo[op->code].cls) {
    case OC_ELEMWISE:
    case OC_RANDOM: return true;
    case OC_GEMM: return true;
    case OC_REDUCE: {
        int kind = pass_fuse_reduce_pattern(g, op, &k);
        /* logsumexp over leading axes runs as its own kernel */
        return kind == FUSE_ROW || (kind == FUSE_COL && op->code != OP_REDUCE_LOGSUMEXP);
    }
    case OC_MOVE: return op->code == OP_BROADCAST;
    case OC_ATTN: return false; /* its own kernels (codegen/cattn.c) */
    default: return false;
    }
}

Shape pass_fuse_oshape(const FuseDomain *d)
{
    Shape s = d->S;
    for (int a = 0; a < s.rank; a++)
        if ((d->kind == FUSE_ROW && a >= d->k) || (d->kind == FUSE_COL && a < d->k))
            s.dim[a] = 1, s.dname[a] = NULL;
    return s;
}

bool pass_fuse_in_set(const Graph *g, const FuseMarks *m, int t)
{
    int p = g->t.v[t].op;
    if (p < 0)
        return false;
    if (m->gof)
        return m->gof[p] >= 0 && (m->gof[p] == m->ga || m->gof[p] == m->gb);
    if (m->mark)
        return m->mark[p] == m->stamp;
    return pass_fuse_find_sorted(m->sorted, m->nsorted, p) >= 0;
}

int pass_fuse_find_sorted(const int *v, int n, int x)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && v[lo] == x ? lo : -1;
}

/* Whether ops[0..n) is strictly ascending. */
static bool ascending(const int *ops, int n)
{
    for (int i = 1; i < n; i++)
        if (ops[i - 1] >= ops[i])
            return false;
    return true;
}

bool pass_fuse_domain_of(const Graph *g, const int *ops, int n, const FuseMarks *m,
                         FuseDomain *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->kind = FUSE_ELEM;
    d->k = -1;
    bool have = false;
    /* reductions fix the domain */
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[ops[i]];
        if (!pass_fuse_is_reduce(op))
            continue;
        int k, kind = pass_fuse_reduce_pattern(g, op, &k);
        const Shape *in = &g->t.v[op->in[0]].s;
        if (kind < 0) {
            snprintf(err, errlen, "op %d: %s over axes that are neither leading nor trailing",
                     ops[i], ir_opinfo[op->code].name);
            return false;
        }
        if (!have) {
            d->kind = (FuseKind)kind;
            d->S = *in;
            d->k = k;
            have = true;
        } else if (d->kind != (FuseKind)kind || d->k != k || !shape_dims_eq(&d->S, in)) {
            snprintf(err, errlen, "op %d: reduction does not match the group's other reductions",
                     ops[i]);
            return false;
        }
    }
    if (!have) {
        /* no reduction: the largest result is the domain */
        int64_t best = -1;
        for (int i = 0; i < n; i++) {
            const Op *op = &g->ops.v[ops[i]];
            if (op->code == OP_CONST)
                continue;
            const Shape *s = &g->t.v[op->out].s;
            if (shape_numel(s) > best) {
                best = shape_numel(s);
                d->S = *s;
            }
        }
        if (best < 0) { /* only consts */
            d->S = g->t.v[g->ops.v[ops[0]].out].s;
            return true;
        }
        /* a row -> full broadcast inside the group makes it a ROW domain */
        for (int i = 0; i < n; i++) {
            const Op *op = &g->ops.v[ops[i]];
            if (op->code != OP_BROADCAST || !pass_fuse_in_set(g, m, op->in[0]) ||
                g->ops.v[g->t.v[op->in[0]].op].code == OP_CONST)
                continue;
            const Shape *r = &g->t.v[op->in[0]].s;
            if (r->rank != d->S.rank)
                continue;
            int k = 0;
            while (k < r->rank && r->dim[k] == d->S.dim[k])
                k++;
            d->kind = FUSE_ROW;
            d->k = k;
            break;
        }
    }
    d->S.dtype = DT_F32; /* dims only: members may differ in dtype */
    return true;
}

bool pass_fuse_fits(const FuseDomain *d, const Shape *s, bool *row)
{
    if (shape_dims_eq(s, &d->S)) {
        *row = false;
        return true;
    }
    if (d->kind == FUSE_ELEM)
        return false;
    Shape o = pass_fuse_oshape(d); /* only when the full shape does not fit */
    if (shape_dims_eq(s, &o)) {
        *row = true;
        return true;
    }
    return false;
}

/* Checks that every member of the op set pass_fuse_fits the domain (see the header). */
bool pass_fuse_check_members(const Graph *g, const int *ops, int n, const FuseMarks *m,
                          const FuseDomain *d, char *err, size_t errlen)
{
    int gemms = 0;
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[ops[i]];
        const Shape *os = &g->t.v[op->out].s;
        bool row;
        if (!pass_fuse_op_fusable(g, op)) {
            snprintf(err, errlen, "op %d: %s cannot be fused", ops[i], ir_opinfo[op->code].name);
            return false;
        }
        if (op->code == OP_CONST)
            continue;
        if (op->code == OP_MATMUL) {
            gemms++;
            for (int j = 0; j < 2; j++)
                if (pass_fuse_in_set(g, m, op->in[j])) {
                    snprintf(err, errlen, "op %d: matmul operand computed in its own group",
                             ops[i]);
                    return false;
                }
            if (!shape_dims_eq(os, &d->S)) {
                snprintf(err, errlen, "op %d: matmul result is not the group's domain", ops[i]);
                return false;
            }
            continue;
        }
        if (pass_fuse_is_reduce(op)) {
            if (op->code != OP_REDUCE_SUM && d->kind == FUSE_COL) {
                snprintf(err, errlen, "op %d: %s over leading axes is not fused", ops[i],
                         ir_opinfo[op->code].name);
                return false;
            }
            continue; /* pass_fuse_domain_of checked the pattern */
        }
        if (!pass_fuse_fits(d, os, &row)) {
            snprintf(err, errlen, "op %d: result shape does not fit the group's domain", ops[i]);
            return false;
        }
        if (op->code == OP_BROADCAST && pass_fuse_in_set(g, m, op->in[0]) &&
            g->ops.v[g->t.v[op->in[0]].op].code != OP_CONST) {
            bool irow;
            if (row || !pass_fuse_fits(d, &g->t.v[op->in[0]].s, &irow) || !irow) {
                snprintf(err, errlen, "op %d: broadcast inside a group must go from row to full "
                                      "shape", ops[i]);
                return false;
            }
        }
        if (op->code == OP_IOTA && d->kind == FUSE_COL && row) {
            snprintf(err, errlen, "op %d: per-column iota is not fused", ops[i]);
            return false;
        }
    }
    if (gemms > 1) {
        snprintf(err, errlen, "a group may hold one matmul (got %d)", gemms);
        return false;
    }
    return true;
}

/* The root of x's tree in the forest root[], halving the path on the way
 * (amortised near-constant: a chain of n ops is no n^2 walk). */
static int find_root(int *root, int x)
{
    while (root[x] != x)
        x = root[x] = root[root[x]];
    return x;
}

/* Member ops[0..n) in program order (the groups' invariant) are found by
 * binary search: no array as large as the graph per group. */
void pass_fuse_parts(const Graph *g, const int *ops, int n, int *root)
{
    int nops = g->ops.n;
    bool asc = ascending(ops, n);
    int *pos = NULL;
    if (!asc) {
        pos = xmalloc(sizeof(int) * (size_t)(nops + 1));
        for (int i = 0; i < nops; i++)
            pos[i] = -1;
        for (int i = 0; i < n; i++)
            pos[ops[i]] = i;
    }
    for (int i = 0; i < n; i++)
        root[i] = i;
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[ops[i]];
        if (op->code == OP_MATMUL)
            continue;
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            int a = p < 0 ? -1 : asc ? pass_fuse_find_sorted(ops, n, p) : pos[p];
            if (a < 0)
                continue;
            int ra = find_root(root, a), rb = find_root(root, i);
            root[ra] = rb;
        }
    }
    for (int i = 0; i < n; i++)
        root[i] = find_root(root, i);
    free(pos);
}

bool pass_fuse_domain(const Graph *g, const int *ops, int n, FuseDomain *d, char *err,
                      size_t errlen)
{
    if (n <= 0) {
        snprintf(err, errlen, "empty group");
        return false;
    }
    FuseMarks m = {.stamp = 1, .sorted = ops, .nsorted = n};
    if (!ascending(ops, n)) {
        m.mark = xcalloc((size_t)g->ops.n + 1, sizeof(int));
        for (int i = 0; i < n; i++)
            m.mark[ops[i]] = 1;
    }
    bool ok = pass_fuse_domain_of(g, ops, n, &m, d, err, errlen) &&
              pass_fuse_check_members(g, ops, n, &m, d, err, errlen);
    free(m.mark);
    return ok;
}

bool *pass_fuse_materialised(const Graph *g)
{
    int nt = g->t.n;
    bool *mat = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int t = 0; t < nt; t++)
        if (g->t.v[t].op < 0 || g->ops.v[g->t.v[t].op].group < 0 ||
            g->ops.v[g->t.v[t].op].code == OP_MATMUL)
            mat[t] = true;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++) {
            const Tensor *x = &g->t.v[op->in[j]];
            if (x->op < 0)
                continue;
            int pg = g->ops.v[x->op].group;
            if (pg < 0 || pg != op->group || op->code == OP_MATMUL)
                mat[x->id] = true;
        }
    }
    for (int i = 0; i < g->outs.n; i++)
        mat[g->outs.v[i].t] = true;
    for (int i = 0; i < g->upd.n; i++)
        mat[g->upd.v[i].value] = true;
    return mat;
}
