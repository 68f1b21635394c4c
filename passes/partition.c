/* partition.c - tensor parallelism: rank r's part of the forward graph over a
 * TP group of n ranks (PassOpts.tp, tp_rank), before autodiff.
 *
 * Every tensor of the forward graph gets a sharding, in program order:
 *   R        whole on every rank (the same value)
 *   S(a, k)  split along axis a: the axis cut into k equal blocks and each
 *            block into n parts, rank r holding part r of each (IrShard)
 *   P        a partial sum: the whole value is the sum of the ranks' values
 * A param's sharding is its annotation (shard(), nn's `parallel`); inputs
 * are R. Each op gets the sharding its operands allow without moving data
 * (an elementwise op keeps a split, reshape and permute move its axis, a
 * matmul contracting a split axis gives P, a gather from a table split by
 * rows gives P, a reduction over a split axis gives P or gathers the ranks'
 * partial results), and where it needs an operand in another sharding the
 * pass converts it, inserting a collective only there:
 *   P -> R   tp_allreduce           R -> S   slice (no data moved)
 *   S -> R   tp_all_gather          P -> S   tp_reduce_scatter
 * A whole (R) tensor that has a gradient and enters computation that is
 * split (an operand of an op whose result is S or P) first goes through
 * tp_copy, whose VJP all-reduces the ranks' partial gradients (Megatron's
 * f; tp_allreduce is its g). Autodiff then differentiates rank r's graph
 * as any other: every collective has its VJP (ir.h), so the backward's
 * collectives follow. Conflicts (two operands split differently) keep the
 * split of the operand that is a sharded param's and gather the other.
 * R tensors made from indices alone (iota, consts, compares of them) are
 * made again at rank r's size rather than sliced, so a vocabulary-parallel
 * loss never builds a whole [B, T, V] mask.
 *
 * With sequence_parallel, a partial sum read by an elementwise op is
 * reduce-scattered along its sequence axis (rank - 2) instead of all-reduced
 * when that axis divides by n, so the norm, dropout and residual regions
 * between the TP blocks hold 1/n of the sequence on each rank.
 *
 * Graph outputs are made whole (R). Params keep their names with their
 * local shapes and IrShard {n, rank} set; the runtime splits and gathers
 * whole tensors for init, checkpoints and weights (docs/parallel.md). */
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { SH_R, SH_S, SH_P } ShKind;
typedef struct {
    ShKind k;
    int axis, blocks;
} Sh;

static const Sh R = {SH_R, 0, 1};
static const Sh Pp = {SH_P, 0, 1};

static bool sh_eq(Sh a, Sh b)
{
    return a.k == b.k && (a.k != SH_S || (a.axis == b.axis && a.blocks == b.blocks));
}

/* A converted value: old tensor t held as sh is new tensor id. */
typedef struct {
    int t;
    Sh sh;
    int id;
} Memo;

typedef struct {
    const Graph *g; /* the whole graph (read) */
    Graph *ng;      /* rank r's */
    int n, rank;
    bool seqpar;
    Sh *sh;       /* per old tensor: its sharding */
    int *cur;     /* per old tensor: its new tensor in sharding sh */
    bool *grad;   /* per old tensor: float and reached from a param (has a gradient) */
    bool *index;  /* per old tensor: computed from no input, param or random op */
    bool *sparam; /* per old tensor: a sharded param, or a view of one */
    int *uses;    /* per old tensor: its readers (ir_use_counts) */
    VEC(Memo) memo;
    SrcLoc loc;
    int ncoll;
    int64_t coll_bytes;
    Diag *d;
    bool failed;
} Part;

static const char *where(const SrcLoc *l, char *buf, size_t n)
{
    snprintf(buf, n, "%s:%d", l->file ? l->file : "?", l->line);
    return buf;
}

/* The local shape of old tensor t under sh. */
static Shape local_shape(Part *p, int t, Sh sh)
{
    Shape s = p->g->t.v[t].s;
    if (sh.k == SH_S) {
        s.dim[sh.axis] /= p->n;
        s.dname[sh.axis] = NULL;
    }
    return s;
}

static int emit(Part *p, Opcode code, const int *in, int nin, const OpAttr *a)
{
    char err[512];
    int t = ir_op(p->ng, code, in, nin, a, p->loc, err, sizeof err);
    if (t < 0) {
        if (!p->failed) {
            char w[256];
            snprintf(p->d->msg, sizeof p->d->msg,
                     "%s: partition: internal error: cannot build rank %d's %s (%s)",
                     where(&p->loc, w, sizeof w), p->rank, ir_opinfo[code].name, err);
            p->failed = true;
        }
        /* keep going on a placeholder so the caller unwinds simply */
        return in && nin ? in[0] : 0;
    }
    return t;
}

static int coll(Part *p, Opcode code, int x, int axis)
{
    OpAttr a = {.ia = {axis, p->n, p->rank}, .nia = 3};
    int t = emit(p, code, &x, 1, &a);
    if (code != OP_TP_COPY) {
        p->ncoll++;
        p->coll_bytes += shape_bytes(&p->ng->t.v[t].s);
    }
    return t;
}

static int reshape_to(Part *p, int x, const Shape *s)
{
    OpAttr a = {0};
    ir_attr_set_shape(&a, s);
    return emit(p, OP_RESHAPE, &x, 1, &a);
}

/* s with axis cut into [k, dim / k]: the view in which a split in k blocks
 * is a plain split of the axis after. */
static Shape blocked(const Shape *s, int axis, int64_t k)
{
    Shape b = *s;
    for (int i = b.rank; i > axis + 1; i--)
        b.dim[i] = b.dim[i - 1], b.dname[i] = b.dname[i - 1];
    b.rank++;
    b.dim[axis] = k;
    b.dim[axis + 1] = s->dim[axis] / k;
    b.dname[axis] = b.dname[axis + 1] = NULL;
    return b;
}

/* x (new tensor, the local value of a tensor split S(axis, blocks)) made
 * whole: gathered along the axis, block by block. */
static int gather_whole(Part *p, int x, Sh sh)
{
    if (sh.blocks == 1)
        return coll(p, OP_TP_ALL_GATHER, x, sh.axis);
    /* [.., k*m, ..] -> [.., k, m, ..] -> gather along m -> [.., k*n*m, ..] */
    Shape s = p->ng->t.v[x].s, b = blocked(&s, sh.axis, sh.blocks);
    int y = coll(p, OP_TP_ALL_GATHER, reshape_to(p, x, &b), sh.axis + 1);
    s.dim[sh.axis] *= p->n;
    s.dname[sh.axis] = NULL;
    return reshape_to(p, y, &s);
}

/* Rank r's part of whole new tensor x, split as sh: slices, no data moved
 * (in blocks: the same slice of the blocked view). */
static int slice_part(Part *p, int x, Sh sh)
{
    Shape s = p->ng->t.v[x].s;
    int64_t m = s.dim[sh.axis] / sh.blocks / p->n; /* per block, per rank */
    int ax = sh.blocks == 1 ? sh.axis : sh.axis + 1;
    Shape v = sh.blocks == 1 ? s : blocked(&s, sh.axis, sh.blocks), o = v;
    int y = sh.blocks == 1 ? x : reshape_to(p, x, &v);
    o.dim[ax] = m;
    o.dname[ax] = NULL;
    OpAttr a = {0};
    ir_attr_set_shape(&a, &o);
    a.nia = o.rank;
    a.ia[ax] = p->rank * m;
    y = emit(p, OP_SLICE, &y, 1, &a);
    if (sh.blocks == 1)
        return y;
    Shape f = s;
    f.dim[sh.axis] = m * sh.blocks;
    f.dname[sh.axis] = NULL;
    return reshape_to(p, y, &f);
}

static int get(Part *p, int t, Sh want);

/* The copy (tp_copy) of old tensor t, whole: one per tensor, so that the
 * gradients of all its split readers are summed before one all-reduce. */
static const Sh COPY = {SH_R, -1, 1};
static int copy_whole(Part *p, int t)
{
    for (int i = 0; i < p->memo.n; i++)
        if (p->memo.v[i].t == t && p->memo.v[i].sh.k == SH_R && p->memo.v[i].sh.axis == -1)
            return p->memo.v[i].id;
    int r = coll(p, OP_TP_COPY, get(p, t, R), 0);
    vec_push(&p->memo, ((Memo){t, COPY, r}));
    return r;
}

/* Old index tensor t (R) made again at rank r's size for sharding want
 * (S); -1 where its op has no such rule (the caller slices). */
static int remake_local(Part *p, int t, Sh want)
{
    const Graph *g = p->g;
    int o = g->t.v[t].op;
    if (o < 0 || want.blocks != 1)
        return -1;
    const Op *op = &g->ops.v[o];
    SrcLoc save = p->loc;
    p->loc = op->loc;
    Shape ls = local_shape(p, t, want);
    OpAttr a = op->attr;
    int r = -1;
    switch (ir_opinfo[op->code].cls) {
    case OC_ELEMWISE:
        if (op->code == OP_CONST) {
            if (op->attr.rank == 0)
                break; /* a scalar has no axis to split */
            ir_attr_set_shape(&a, &ls);
            r = emit(p, OP_CONST, NULL, 0, &a);
        } else if (op->code == OP_IOTA) {
            ir_attr_set_shape(&a, &ls);
            r = emit(p, OP_IOTA, NULL, 0, &a);
            if (a.ia[0] == want.axis && p->rank > 0) { /* + rank r's offset */
                OpAttr c = {.f = (double)(p->rank * ls.dim[want.axis]), .dtype = ls.dtype};
                int k = emit(p, OP_CONST, NULL, 0, &c);
                OpAttr b = {0};
                ir_attr_set_shape(&b, &ls);
                k = emit(p, OP_BROADCAST, &k, 1, &b);
                r = emit(p, OP_ADD, (int[]){r, k}, 2, NULL);
            }
        } else {
            int in[IR_MAX_RANK];
            for (int j = 0; j < op->nin; j++)
                in[j] = get(p, op->in[j], want);
            r = emit(p, op->code, in, op->nin, &a);
        }
        break;
    case OC_MOVE:
        if (op->code == OP_BROADCAST) {
            const Shape *xs = &g->t.v[op->in[0]].s;
            int off = ls.rank - xs->rank, xa = want.axis - off;
            bool whole = xa < 0 || xs->dim[xa] == 1;
            /* a whole operand with a gradient read by split computation: f */
            int x = whole ? (p->grad[op->in[0]] ? copy_whole(p, op->in[0])
                                                : get(p, op->in[0], R))
                          : get(p, op->in[0], (Sh){SH_S, xa, 1});
            ir_attr_set_shape(&a, &ls);
            r = emit(p, OP_BROADCAST, &x, 1, &a);
        }
        break;
    default: break;
    }
    p->loc = save;
    return r;
}

/* New tensor holding old tensor t in sharding want, converting (and
 * remembering the conversion) where t's own sharding differs. */
static int get(Part *p, int t, Sh want)
{
    Sh have = p->sh[t];
    if (sh_eq(have, want))
        return p->cur[t];
    for (int i = 0; i < p->memo.n; i++)
        if (p->memo.v[i].t == t && sh_eq(p->memo.v[i].sh, want))
            return p->memo.v[i].id;
    int r;
    if (want.k == SH_P) {
        die("partition: a conversion to a partial sum");
    } else if (want.k == SH_R) {
        r = have.k == SH_P ? coll(p, OP_TP_ALLREDUCE, p->cur[t], 0)
                           : gather_whole(p, p->cur[t], have);
    } else if (have.k == SH_P && want.blocks == 1 && !p->index[t]) {
        r = coll(p, OP_TP_REDUCE_SCATTER, p->cur[t], want.axis);
    } else {
        /* index tensors are made again at rank r's size; so are broadcasts,
         * whose operand is split (or read whole) instead of the result */
        int o = p->g->t.v[t].op;
        bool bcast = o >= 0 && p->g->ops.v[o].code == OP_BROADCAST;
        r = have.k == SH_R && (p->index[t] || bcast) ? remake_local(p, t, want) : -1;
        if (r < 0)
            r = slice_part(p, p->grad[t] ? copy_whole(p, t) : get(p, t, R), want);
    }
    vec_push(&p->memo, ((Memo){t, want, r}));
    return r;
}

/* ---- the rules: one sharding per op ------------------------------------ */

/* Whether sharding sh of old tensor t can be held: the split axis divides
 * by blocks x n. */
static bool fits(Part *p, int t, Sh sh)
{
    if (sh.k != SH_S)
        return true;
    const Shape *s = &p->g->t.v[t].s;
    return sh.axis >= 0 && sh.axis < s->rank && s->dim[sh.axis] % ((int64_t)sh.blocks * p->n) == 0;
}

/* reshape: where split axis a of x goes in the result (-1: nowhere that
 * keeps the split). The dims are matched in runs of equal products; the
 * split survives when a leads its run and the run's first result dim
 * divides by blocks x n. */
static int reshape_axis(Part *p, const Shape *x, const Shape *y, Sh sh, int *at)
{
    int i = 0, j = 0;
    while (i < x->rank && j < y->rank) {
        while (i < x->rank && x->dim[i] == 1 && i != sh.axis)
            i++;
        while (j < y->rank && y->dim[j] == 1)
            j++;
        if (i >= x->rank || j >= y->rank)
            break;
        int i0 = i, j0 = j;
        int64_t a = x->dim[i++], b = y->dim[j++];
        while (a != b) {
            if (a < b && i < x->rank)
                a *= x->dim[i++];
            else if (b < a && j < y->rank)
                b *= y->dim[j++];
            else
                return -1;
        }
        if (sh.axis >= i0 && sh.axis < i) {
            if (sh.axis != i0)
                return -1;
            *at = j0;
            if (y->dim[j0] % ((int64_t)sh.blocks * p->n) != 0)
                return -2; /* the split would cut a dim (heads) unevenly */
            return j0;
        }
    }
    return -1;
}

static int mm_axis(const Shape *s, int role, bool trans, bool is_b)
{
    int r = s->rank;
    bool kfirst = is_b ? !trans : trans; /* K on axis r-2 */
    if (role == 2)
        return kfirst ? r - 2 : r - 1;
    return kfirst ? r - 1 : r - 2;
}

/* Decides op's result sharding and the sharding each operand must have. */
static Sh decide(Part *p, const Op *op, Sh *need)
{
    const Graph *g = p->g;
    const Shape *os = &g->t.v[op->out].s;
    Sh in[IR_MAX_RANK] = {{0}};
    for (int j = 0; j < op->nin && j < IR_MAX_RANK; j++)
        in[j] = need[j] = p->sh[op->in[j]];
    OpClass cls = ir_opinfo[op->code].cls;
    if (op->nin > IR_MAX_RANK) { /* concat of many: whole */
        for (int j = 0; j < IR_MAX_RANK; j++)
            need[j] = R;
        return R;
    }
    switch (cls) {
    case OC_ELEMWISE: {
        if (op->nin == 0)
            return R;
        int s = -1;
        bool anyp = false;
        for (int j = 0; j < op->nin; j++) {
            if (in[j].k == SH_S && (s < 0 || (p->sparam[op->in[j]] && !p->sparam[op->in[s]])))
                s = j;
            anyp |= in[j].k == SH_P;
        }
        if (s >= 0) {
            for (int j = 0; j < op->nin; j++)
                need[j] = in[s];
            return in[s];
        }
        if (anyp) {
            /* linear in the partial operands: keep P, where that saves a
             * collective (a partial sum read elsewhere is summed anyway) */
            bool lin = false, once = true;
            for (int j = 0; j < op->nin; j++)
                once &= in[j].k != SH_P || p->uses[op->in[j]] == 1;
            if (op->code == OP_ADD || op->code == OP_SUB) {
                lin = in[0].k == SH_P && in[1].k == SH_P;
            } else if (op->code == OP_NEG || op->code == OP_STOP_GRADIENT ||
                       (op->code == OP_CAST && dtype_is_float(os->dtype))) {
                lin = true;
            } else if (op->code == OP_MUL) {
                lin = (in[0].k == SH_P) != (in[1].k == SH_P);
            } else if (op->code == OP_DIV) {
                lin = in[0].k == SH_P && in[1].k == SH_R;
            }
            if (lin && once)
                return Pp;
            Sh to = R;
            if (p->seqpar && os->rank >= 2) {
                Sh t = {SH_S, os->rank - 2, 1};
                if (fits(p, op->out, t))
                    to = t;
            }
            for (int j = 0; j < op->nin; j++)
                need[j] = to;
            return to;
        }
        return R;
    }
    case OC_RANDOM:
        return R;
    case OC_MOVE:
        switch (op->code) {
        case OP_BROADCAST: {
            if (in[0].k == SH_R || in[0].k == SH_P)
                return in[0];
            int off = os->rank - g->t.v[op->in[0]].s.rank;
            return (Sh){SH_S, in[0].axis + off, in[0].blocks};
        }
        case OP_RESHAPE: {
            if (in[0].k != SH_S)
                return in[0];
            int at = 0;
            int ax = reshape_axis(p, &g->t.v[op->in[0]].s, os, in[0], &at);
            if (ax >= 0)
                return (Sh){SH_S, ax, in[0].blocks};
            if (ax == -2 && !p->failed) {
                char w[256], b0[64], b1[64];
                snprintf(p->d->msg, sizeof p->d->msg,
                         "%s: tensor parallelism: this reshape of %s to %s turns axis %d, "
                         "split over tp = %d ranks, into dims whose first (axis %d, %lld) "
                         "does not divide by %lld (expected the heads, or what the split "
                         "axis becomes, to be a multiple of tp; change tp or the model's "
                         "shape)",
                         where(&op->loc, w, sizeof w),
                         shape_str(g, &g->t.v[op->in[0]].s, b0, sizeof b0),
                         shape_str(g, os, b1, sizeof b1), in[0].axis, p->n, at,
                         (long long)os->dim[at], (long long)in[0].blocks * p->n);
                p->failed = true;
            }
            need[0] = R;
            return R;
        }
        case OP_PERMUTE:
            if (in[0].k != SH_S)
                return in[0];
            for (int i = 0; i < os->rank; i++)
                if (op->attr.ia[i] == in[0].axis)
                    return (Sh){SH_S, i, in[0].blocks};
            return R;
        case OP_SLICE: {
            if (in[0].k != SH_S)
                return in[0];
            const Shape *xs = &g->t.v[op->in[0]].s;
            int a = in[0].axis;
            int64_t st = op->attr.ia[a], len = os->dim[a], bs = xs->dim[a] / in[0].blocks;
            if (st == 0 && len == xs->dim[a])
                return in[0];
            if (st % bs == 0 && len % bs == 0)
                return (Sh){SH_S, a, (int)(len / bs)};
            need[0] = R;
            return R;
        }
        case OP_PAD: {
            if (in[0].k == SH_P)
                return in[0];
            if (in[0].k == SH_S && op->attr.ia[in[0].axis] == 0 &&
                os->dim[in[0].axis] == g->t.v[op->in[0]].s.dim[in[0].axis])
                return in[0];
            need[0] = R;
            return R;
        }
        case OP_CONCAT: {
            int ax = (int)op->attr.ia[0];
            bool allp = true, alls = true;
            for (int j = 0; j < op->nin; j++) {
                allp &= in[j].k == SH_P;
                alls &= in[j].k == SH_S && in[j].axis != ax && sh_eq(in[j], in[0]);
            }
            if (allp)
                return Pp;
            if (alls)
                return in[0];
            int s = -1;
            for (int j = 0; j < op->nin; j++)
                if (in[j].k == SH_S && in[j].axis != ax && s < 0)
                    s = j;
            for (int j = 0; j < op->nin; j++)
                need[j] = s >= 0 ? in[s] : R;
            return s >= 0 ? in[s] : R;
        }
        case OP_GATHER: { /* table [V, R...], idx [I...] -> [I..., R...] */
            int ir = g->t.v[op->in[1]].s.rank;
            if (in[0].k == SH_S && in[0].axis == 0 && in[0].blocks == 1) {
                need[1] = R;
                return Pp; /* rows outside rank r's range gather zeros */
            }
            if (in[0].k == SH_S) {
                need[1] = R;
                return (Sh){SH_S, ir + in[0].axis - 1, in[0].blocks};
            }
            need[0] = R;
            if (in[1].k == SH_S)
                return in[1];
            need[1] = R;
            return R;
        }
        case OP_TAKE_ALONG: { /* x [..., V], idx [...] -> [...] */
            int xr = g->t.v[op->in[0]].s.rank;
            if (in[0].k == SH_S && in[0].axis == xr - 1 && in[0].blocks == 1) {
                need[1] = R;
                return Pp;
            }
            if (in[0].k == SH_S && in[0].axis < xr - 1) {
                need[1] = in[0];
                return in[0];
            }
            if (in[0].k != SH_S && in[1].k == SH_S) {
                need[0] = in[1];
                return in[1];
            }
            need[0] = need[1] = R;
            return R;
        }
        default:
            for (int j = 0; j < op->nin; j++)
                need[j] = R;
            return R;
        }
    case OC_REDUCE: {
        bool split = false;
        if (in[0].k == SH_S)
            for (int i = 0; i < op->attr.nia; i++)
                split |= op->attr.ia[i] == in[0].axis;
        if (in[0].k == SH_P) {
            if (op->code == OP_REDUCE_SUM)
                return Pp;
            need[0] = R;
            return R;
        }
        if (in[0].k == SH_S && !split)
            return in[0];
        if (in[0].k == SH_S && op->code == OP_REDUCE_SUM)
            return Pp;
        if (in[0].k == SH_S && in[0].blocks == 1)
            return (Sh){SH_S, in[0].axis, -1}; /* the local reduction, then combine() */
        need[0] = R;
        return R;
    }
    case OC_GEMM: {
        const Shape *as = &g->t.v[op->in[0]].s, *bs = &g->t.v[op->in[1]].s;
        bool ta = op->attr.ia[0] != 0, tb = op->attr.ia[1] != 0;
        for (int round = 0; round < 3; round++) {
            if (in[0].k == SH_P && in[1].k == SH_R)
                return Pp;
            if (in[1].k == SH_P && in[0].k == SH_R)
                return Pp;
            for (int j = 0; j < 2; j++)
                if (in[j].k == SH_P)
                    in[j] = need[j] = R;
            if (in[0].k == SH_R && in[1].k == SH_R)
                return R;
            int ra = in[0].k == SH_S ? ir_matmul_role(as, in[0].axis, ta, false) : -1;
            int rb = in[1].k == SH_S ? ir_matmul_role(bs, in[1].axis, tb, true) : -1;
            int orank = os->rank;
            if (ra >= 0 && rb < 0) {
                if (ra == 0) {
                    if (bs->rank != 2)
                        in[1] = need[1] = in[0];
                    return in[0];
                }
                if (ra == 1)
                    return (Sh){SH_S, orank - 2, in[0].blocks};
                /* K: B split along K too */
                in[1] = need[1] = (Sh){SH_S, mm_axis(bs, 2, tb, true), in[0].blocks};
                if (fits(p, op->in[1], in[1]))
                    return Pp;
                in[0] = need[0] = R;
                continue;
            }
            if (rb >= 0 && ra < 0) {
                if (rb == 0) {
                    in[0] = need[0] = in[1];
                    return in[1];
                }
                if (rb == 1)
                    return (Sh){SH_S, orank - 1, in[1].blocks};
                in[0] = need[0] = (Sh){SH_S, mm_axis(as, 2, ta, false), in[1].blocks};
                if (fits(p, op->in[0], in[0]))
                    return Pp;
                in[1] = need[1] = R;
                continue;
            }
            /* both split */
            if (ra == rb && ra == 0 && in[0].axis == in[1].axis && in[0].blocks == in[1].blocks)
                return in[0];
            if (ra == 2 && rb == 2 && in[0].blocks == in[1].blocks)
                return Pp;
            /* a conflict: keep the sharded param's split, gather the other */
            int drop = p->sparam[op->in[1]] && !p->sparam[op->in[0]] ? 0
                       : p->sparam[op->in[0]] && !p->sparam[op->in[1]]
                           ? 1
                           : (shape_bytes(as) <= shape_bytes(bs) ? 0 : 1);
            in[drop] = need[drop] = R;
        }
        need[0] = need[1] = R;
        return R;
    }
    case OC_ATTN: {
        /* q, k, v split alike along a batch axis (heads): attention per head */
        const Shape *qs = &g->t.v[op->in[0]].s;
        if (op->attr.nia == 1 && in[0].k == SH_S && in[0].axis < qs->rank - 2) {
            bool same = true;
            for (int j = 1; j < op->nin; j++)
                same &= sh_eq(in[j], in[0]);
            if (same || in[1].k != SH_S || in[2].k != SH_S) {
                for (int j = 0; j < op->nin; j++)
                    need[j] = in[0];
                return in[0];
            }
        }
        for (int j = 0; j < op->nin; j++)
            need[j] = R;
        return R;
    }
    default:
        for (int j = 0; j < op->nin; j++)
            need[j] = R;
        return R;
    }
}

/* The attributes of op for rank r's operands (local shapes). */
static OpAttr local_attr(Part *p, const Op *op, Sh out, const Sh *need)
{
    const Graph *g = p->g;
    OpAttr a = op->attr;
    Shape ls = local_shape(p, op->out, out);
    switch (op->code) {
    case OP_BROADCAST:
    case OP_RESHAPE:
    case OP_CONST:
    case OP_IOTA:
    case OP_RANDOM:
    case OP_SCATTER_ADD:
        if (a.rank == ls.rank)
            ir_attr_set_shape(&a, &ls);
        break;
    case OP_SLICE:
        ir_attr_set_shape(&a, &ls);
        if (out.k == SH_S) {
            int ax = out.axis;
            const Shape *xs = &g->t.v[op->in[0]].s;
            int64_t bs = xs->dim[ax] / need[0].blocks;
            a.ia[ax] = op->attr.ia[ax] / bs * (bs / p->n);
        }
        break;
    case OP_PAD:
        ir_attr_set_shape(&a, &ls);
        break;
    default: break;
    }
    return a;
}

/* idx - rank r's first row (of n_local rows): indices into rank r's part
 * of a table split by rows; rows outside it read as zero. */
static int shift_index(Part *p, int idx, int64_t nloc)
{
    if (p->rank == 0)
        return idx;
    const Shape *s = &p->ng->t.v[idx].s;
    OpAttr c = {.f = (double)(p->rank * nloc), .dtype = s->dtype};
    int k = emit(p, OP_CONST, NULL, 0, &c);
    if (s->rank) {
        OpAttr b = {0};
        ir_attr_set_shape(&b, s);
        k = emit(p, OP_BROADCAST, &k, 1, &b);
    }
    return emit(p, OP_SUB, (int[]){idx, k}, 2, NULL);
}

static void part_op(Part *p, int oi)
{
    const Graph *g = p->g;
    const Op *op = &g->ops.v[oi];
    p->loc = op->loc;
    if (ir_opinfo[op->code].cls == OC_COLLECTIVE) {
        char w[256];
        snprintf(p->d->msg, sizeof p->d->msg,
                 "%s: partition: the graph already has collectives (expected the forward "
                 "graph, got %s)", where(&op->loc, w, sizeof w), ir_opinfo[op->code].name);
        p->failed = true;
        return;
    }
    Sh need[IR_MAX_RANK];
    Sh out = decide(p, op, need);
    int nin = op->nin;
    int *in = xmalloc(sizeof(int) * (size_t)(nin + 1));
    for (int j = 0; j < nin; j++) {
        Sh w = j < IR_MAX_RANK ? need[j] : R;
        if (!fits(p, op->in[j], w)) {
            char b[256], sb[64];
            const Tensor *t = &g->t.v[op->in[j]];
            snprintf(p->d->msg, sizeof p->d->msg,
                     "%s: tensor parallelism: %s needs operand %d split along axis %d over "
                     "%d ranks%s, but that axis has %lld elements (expected a multiple of "
                     "%lld; %s %s)",
                     where(&op->loc, b, sizeof b), ir_opinfo[op->code].name, j, w.axis, p->n,
                     w.blocks > 1 ? " in blocks" : "", (long long)t->s.dim[w.axis],
                     (long long)w.blocks * p->n, t->name ? t->name : "the operand",
                     shape_str(g, &t->s, sb, sizeof sb));
            p->failed = true;
            free(in);
            return;
        }
        in[j] = get(p, op->in[j], w);
    }
    bool combine = out.k == SH_S && out.blocks == -1; /* reduce over a split axis */
    if (combine)
        out = R;
    /* a whole operand with a gradient entering split computation: f */
    if (out.k != SH_R || combine)
        for (int j = 0; j < nin; j++)
            if ((j >= IR_MAX_RANK || need[j].k == SH_R) && p->grad[op->in[j]] &&
                !(op->code == OP_GATHER && j == 1))
                in[j] = copy_whole(p, op->in[j]);
    Sh lo = combine ? p->sh[op->in[0]] : out;
    OpAttr a = local_attr(p, op, combine ? R : out, need);
    if (op->code == OP_GATHER && need[0].k == SH_S && need[0].axis == 0)
        in[1] = shift_index(p, in[1], p->ng->t.v[in[0]].s.dim[0]);
    if (op->code == OP_TAKE_ALONG && out.k == SH_P) {
        const Shape *xs = &p->ng->t.v[in[0]].s;
        in[1] = shift_index(p, in[1], xs->dim[xs->rank - 1]);
    }
    int r;
    if (combine) {
        /* local reduction; gather the ranks' results along the (now size-1)
         * split axis; reduce again */
        r = emit(p, op->code, in, nin, &a);
        r = coll(p, OP_TP_ALL_GATHER, r, lo.axis);
        OpAttr a2 = {.ia = {lo.axis}, .nia = 1};
        r = emit(p, op->code, &r, 1, &a2);
    } else {
        r = emit(p, op->code, in, nin, &a);
    }
    free(in);
    p->sh[op->out] = out;
    p->cur[op->out] = r;
}

/* ---- the pass --------------------------------------------------------- */

/* A gathered tensor read only through its tp_copy (sequence parallelism's
 * gather before a column-parallel matmul): the gather itself takes the
 * copy's role (sum=1: its VJP reduce-scatters the ranks' partial
 * cotangents, where the copy's all-reduce and the gather's slice would move
 * n times the bytes) and the copy goes. */
static void gather_sums(Graph *g)
{
    int *uses = ir_use_counts(g);
    int *to = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    for (int t = 0; t < g->t.n; t++)
        to[t] = t;
    bool *drop = xcalloc((size_t)g->ops.n + 1, 1);
    for (int i = 0; i < g->ops.n; i++) {
        Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++)
            op->in[j] = to[op->in[j]];
        if (op->code != OP_TP_COPY)
            continue;
        int x = op->in[0], def = g->t.v[x].op;
        if (def < 0 || g->ops.v[def].code != OP_TP_ALL_GATHER || uses[x] != 1)
            continue;
        g->ops.v[def].attr.nia = 4;
        g->ops.v[def].attr.ia[3] = 1;
        to[op->out] = x;
        drop[i] = true;
    }
    for (int k = 0; k < g->outs.n; k++)
        g->outs.v[k].t = to[g->outs.v[k].t];
    ir_drop_ops(g, drop);
    free(drop);
    free(to);
    free(uses);
}


static void mark(Part *p)
{
    const Graph *g = p->g;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        p->grad[i] = t->kind == TK_PARAM;
        p->index[i] = t->kind == TK_INPUT; /* data: whole on every rank */
        p->sparam[i] = t->kind == TK_PARAM && t->shard.on;
    }
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        bool gr = false, ix = ir_opinfo[op->code].cls != OC_RANDOM, sp = false;
        for (int j = 0; j < op->nin; j++) {
            int t = op->in[j];
            gr |= p->grad[t];
            ix &= p->index[t];
            sp |= p->sparam[t];
        }
        p->grad[op->out] = gr && op->code != OP_STOP_GRADIENT &&
                           dtype_is_float(g->t.v[op->out].s.dtype);
        p->index[op->out] = ix;
        p->sparam[op->out] = sp && ir_opinfo[op->code].cls == OC_MOVE;
    }
}

bool pass_partition(Graph *g, const PassOpts *o, Diag *d)
{
    if (o->tp <= 1)
        return true;
    if (o->tp_rank < 0 || o->tp_rank >= o->tp)
        die("pass_partition: rank %d of %d", o->tp_rank, o->tp);
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].shard.on && g->t.v[i].shard.n) {
            snprintf(d->msg, sizeof d->msg,
                     "partition: param \"%s\" is already rank %d's part of %d (expected a "
                     "whole graph)", g->t.v[i].name, g->t.v[i].shard.rank, g->t.v[i].shard.n);
            return false;
        }
    Part p = {.g = g, .n = o->tp, .rank = o->tp_rank, .seqpar = o->sequence_parallel, .d = d};
    int nt = g->t.n;
    p.sh = xcalloc((size_t)nt + 1, sizeof *p.sh);
    p.cur = xcalloc((size_t)nt + 1, sizeof *p.cur);
    p.grad = xcalloc((size_t)nt + 1, 1);
    p.index = xcalloc((size_t)nt + 1, 1);
    p.sparam = xcalloc((size_t)nt + 1, 1);
    mark(&p);
    p.uses = ir_use_counts(g);
    p.ng = ir_new();
    for (int i = 0; i < g->syms.n; i++)
        ir_add_sym(p.ng, g->syms.v[i].name, g->syms.v[i].value);
    /* graph inputs: params at rank r's size */
    for (int i = 0; i < nt && !p.failed; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op >= 0)
            continue;
        Sh sh = R;
        if (t->kind == TK_PARAM && t->shard.on) {
            sh = (Sh){SH_S, t->shard.axis, t->shard.blocks};
            if (!fits(&p, i, sh)) {
                /* the script line of its first reader */
                SrcLoc at = {NULL, 0};
                for (int k = 0; k < g->ops.n && !at.file; k++)
                    for (int j = 0; j < g->ops.v[k].nin; j++)
                        if (g->ops.v[k].in[j] == i)
                            at = g->ops.v[k].loc;
                char w[256], sb[64];
                snprintf(d->msg, sizeof d->msg,
                         "%s: tensor parallelism: param \"%s\" %s is split along axis %d "
                         "in %d block%s over tp = %d ranks, but that axis has %lld elements "
                         "(expected a multiple of %lld; change tp or the model's size)",
                         where(&at, w, sizeof w), t->name, shape_str(g, &t->s, sb, sizeof sb),
                         sh.axis, sh.blocks, sh.blocks == 1 ? "" : "s", p.n,
                         (long long)t->s.dim[sh.axis], (long long)sh.blocks * p.n);
                p.failed = true;
                break;
            }
        }
        Shape s = local_shape(&p, i, sh);
        int id = ir_add_input(p.ng, t->kind, t->name, s, t->init);
        p.ng->t.v[id].shard = t->shard;
        if (t->shard.on) {
            p.ng->t.v[id].shard.n = p.n;
            p.ng->t.v[id].shard.rank = p.rank;
        }
        p.sh[i] = sh;
        p.cur[i] = id;
    }
    for (int i = 0; i < g->ops.n && !p.failed; i++)
        part_op(&p, i);
    for (int i = 0; i < g->outs.n && !p.failed; i++) {
        p.loc = g->t.v[g->outs.v[i].t].op >= 0 ? g->ops.v[g->t.v[g->outs.v[i].t].op].loc
                                               : (SrcLoc){NULL, 0};
        ir_add_output(p.ng, g->outs.v[i].name, get(&p, g->outs.v[i].t, R));
    }
    for (int i = 0; i < g->upd.n && !p.failed; i++) {
        snprintf(d->msg, sizeof d->msg,
                 "partition: the graph already has updates (expected the forward graph)");
        p.failed = true;
    }
    bool ok = !p.failed;
    if (ok) {
        gather_sums(p.ng);
        ir_compact(p.ng);
        Graph tmp = *g;
        *g = *p.ng;
        *p.ng = tmp;
    }
    ir_free(p.ng);
    free(p.sh);
    free(p.cur);
    free(p.grad);
    free(p.index);
    free(p.sparam);
    free(p.uses);
    vec_free(&p.memo);
    return ok;
}
