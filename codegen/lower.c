/* lower.c - one IR op to a target-neutral kernel description.
 *
 * Shapes are row-major and contiguous. Every op but scatter_add is one loop
 * nest over its result; scatter_add zero-fills its result, then accumulates
 * its source at the indexed rows (dropping out-of-range indices). */
#include "codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends a param for tensor (no search). */
static int push_param(CgKernel *k, const Graph *g, int tensor, bool out)
{
    CgParam p = {tensor, g->t.v[tensor].s.dtype, out};
    vec_push(&k->params, p);
    return k->params.n - 1;
}

/* The param of tensor: an input's first param when it has one, else a new
 * one. O(params) per call: a fused group's lowering uses lg_param. */
static int add_param(CgKernel *k, const Graph *g, int tensor, bool out)
{
    if (!out)
        for (int i = 0; i < k->params.n; i++)
            if (k->params.v[i].tensor == tensor && !k->params.v[i].out)
                return i;
    return push_param(k, g, tensor, out);
}

/* Flat row-major index of idx[0..rank) in shape s. */
static int flat_index(CgKernel *k, const Shape *s, const int *idx)
{
    int e = cg_const_i(k, DT_I64, 0);
    int64_t stride = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        int term = cg_binop(k, CG_MUL, idx[i], cg_const_i(k, DT_I64, stride));
        e = cg_binop(k, CG_ADD, term, e);
        stride *= s->dim[i];
    }
    return e;
}

/* A new loop nest whose outer dims run over dims[0..rank); var expressions
 * into vars[]. */
static CgLoop *new_loop(CgKernel *k, int rank, const int64_t *dims, int *vars)
{
    CgLoop l = {.ndim = rank};
    for (int i = 0; i < rank; i++) {
        l.dim[i].var = cg_new_var(k);
        l.dim[i].n = dims[i];
    }
    vec_push(&k->loops, l);
    CgLoop *lp = &k->loops.v[k->loops.n - 1];
    for (int i = 0; i < rank; i++)
        vars[i] = cg_var(k, lp->dim[i].var);
    return lp;
}

static void add_store(CgKernel *k, CgLoop *l, int param, int index, int value, bool acc,
                      int guard)
{
    CgPhase ph = {.acc = -1};
    vec_push(&l->ph, ph);
    CgStore s = {param, index, value, acc, guard};
    vec_push(&l->ph.v[l->ph.n - 1].st, s);
    (void)k;
}

static int zero_of(CgKernel *k, DType dt)
{
    return dtype_is_float(dt) ? cg_const_f(k, dt, 0.0) : cg_const_i(k, dt, 0);
}

static bool is_reduce(Opcode c)
{
    return c == OP_REDUCE_SUM || c == OP_REDUCE_MAX || c == OP_REDUCE_LOGSUMEXP;
}

static CgRedOp red_op(Opcode c)
{
    return c == OP_REDUCE_SUM ? CG_RED_SUM : c == OP_REDUCE_MAX ? CG_RED_MAX : CG_RED_LSE;
}

static int guard_and(CgKernel *k, int g, int c) { return g < 0 ? c : cg_binop(k, CG_AND, g, c); }

/* 0 <= e < n as a u8 condition */
static int in_range(CgKernel *k, int e, int64_t n)
{
    int lo = cg_binop(k, CG_GE, e, cg_const_i(k, DT_I64, 0));
    int hi = cg_binop(k, CG_LT, e, cg_const_i(k, DT_I64, n));
    return cg_binop(k, CG_AND, lo, hi);
}

static CgOp elem_op(Opcode c)
{
    switch (c) {
    case OP_NEG: return CG_NEG;
    case OP_EXP: return CG_EXP;
    case OP_LOG: return CG_LOG;
    case OP_SIN: return CG_SIN;
    case OP_COS: return CG_COS;
    case OP_TANH: return CG_TANH;
    case OP_SQRT: return CG_SQRT;
    case OP_RSQRT: return CG_RSQRT;
    case OP_SIGMOID: return CG_SIGMOID;
    case OP_RELU: return CG_RELU;
    case OP_ABS: return CG_ABS;
    case OP_ERF: return CG_ERF;
    case OP_FLOOR: return CG_FLOOR;
    case OP_ADD: return CG_ADD;
    case OP_SUB: return CG_SUB;
    case OP_MUL: return CG_MUL;
    case OP_DIV: return CG_DIV;
    case OP_POW: return CG_POW;
    case OP_MAX: return CG_MAX;
    case OP_MIN: return CG_MIN;
    case OP_LT: return CG_LT;
    case OP_LE: return CG_LE;
    case OP_GT: return CG_GT;
    case OP_GE: return CG_GE;
    case OP_EQ: return CG_EQ;
    case OP_NE: return CG_NE;
    default: die("codegen: %s is not an elementwise op", ir_opinfo[c].name);
    }
}

/* Every operand and the result of op have a C type (f32, i32, i64, u8);
 * else d names the op's line. */
static bool dtypes_supported(const Graph *g, const Op *op, Diag *d)
{
    for (int j = -1; j < op->nin; j++) {
        DType dt = g->t.v[j < 0 ? op->out : op->in[j]].s.dtype;
        if (!cg_ctype(dt)) {
            snprintf(d->msg, sizeof d->msg,
                     "%s:%d: %s on %s is not supported by the CPU backend yet (expected "
                     "f32, i32, i64 or u8)",
                     op->loc.file ? op->loc.file : "?", op->loc.line, ir_opinfo[op->code].name,
                     dtype_name(dt));
            return false;
        }
    }
    return true;
}

/* The value of operand j of a concat for the j in [lo, hi) whose window
 * [start[j], start[j+1]) holds the axis index v: ld[j] is operand j's load. */
static int concat_tree(CgKernel *k, int v, const int64_t *start, const int *ld, int lo, int hi)
{
    if (hi - lo == 1)
        return ld[lo];
    int mid = lo + (hi - lo) / 2;
    int below = cg_binop(k, CG_LT, v, cg_const_i(k, DT_I64, start[mid]));
    return cg_select(k, below, concat_tree(k, v, start, ld, lo, mid),
                     concat_tree(k, v, start, ld, mid, hi));
}

/* im2col and col2im (ir.h). The columns [N, O.., C*K] are walked as
 * their row-major view [N, O.., C, k..], so no index is divided.
 * im2col: one loop over that view, each element a guarded load of the
 * image. col2im: one loop over the image [N, C, D..] with a sum phase over
 * the kernel offsets j..: image element y gets the column of output o = (y
 * + p - j d) / s where that divides exactly and 0 <= o < O (a gather, so
 * no two iterations write one element); with dilation 1 and stride s > 1
 * the phase runs over the ceil(k / s) outputs that can reach y instead. */
static bool lower_conv(const Graph *g, const Op *op, CgKernel *k, int po)
{
    bool fwd = op->code == OP_IM2COL;
    const Shape *img = fwd ? &g->t.v[op->in[0]].s : &g->t.v[op->out].s;
    IrConv cv;
    char err[300];
    if (!ir_conv_geometry(img, &op->attr, &cv, err, sizeof err))
        die("codegen: %s: %s", ir_opinfo[op->code].name, err);
    int ns = cv.ns, pin = add_param(k, g, op->in[0], false);
    int64_t view[IR_MAX_RANK];
    Shape vs = {.dtype = g->t.v[op->out].s.dtype, .rank = 2 * ns + 2};
    vs.dim[0] = cv.n;
    for (int i = 0; i < ns; i++) {
        vs.dim[1 + i] = cv.out[i];
        vs.dim[ns + 2 + i] = cv.k[i];
    }
    vs.dim[ns + 1] = cv.c;
    memcpy(view, vs.dim, sizeof view);
    int vars[IR_MAX_RANK], idx[IR_MAX_RANK];
    if (fwd) {
        CgLoop *l = new_loop(k, vs.rank, view, vars);
        /* image index [n, c, o s - p + j d ..] */
        int guard = -1;
        idx[0] = vars[0];
        idx[1] = vars[ns + 1];
        for (int i = 0; i < ns; i++) {
            int at = cg_binop(k, CG_MUL, vars[1 + i], cg_const_i(k, DT_I64, cv.s[i]));
            at = cg_binop(k, CG_SUB, at, cg_const_i(k, DT_I64, cv.p[i]));
            at = cg_binop(k, CG_ADD, at,
                          cg_binop(k, CG_MUL, vars[ns + 2 + i], cg_const_i(k, DT_I64, cv.d[i])));
            idx[2 + i] = at;
            if (cv.p[i] > 0)
                guard = guard_and(k, guard, in_range(k, at, cv.in[i]));
        }
        int val = cg_load(k, pin, flat_index(k, img, idx));
        if (guard >= 0)
            val = cg_select(k, guard, val, zero_of(k, vs.dtype));
        add_store(k, l, po, flat_index(k, &vs, vars), val, false, -1);
        return true;
    }
    CgLoop *l = new_loop(k, img->rank, img->dim, vars);
    const Shape *os = &g->t.v[op->out].s;
    CgPhase ph = {.ndim = ns, .acc = k->naccs++, .adt = os->dtype, .rop = CG_RED_SUM};
    ph.wide = true;
    int jv[2];
    /* by output position where the stride skips kernel offsets (dilation
     * 1): only ceil(k / s) of the k offsets can reach an image element (a
     * pooling window of 32 at stride 32: 1 of 32) */
    bool by_out[2];
    for (int i = 0; i < ns; i++) {
        by_out[i] = cv.d[i] == 1 && cv.s[i] > 1;
        ph.dim[i].var = cg_new_var(k);
        ph.dim[i].n = by_out[i] ? (cv.k[i] + cv.s[i] - 1) / cv.s[i] : cv.k[i];
        jv[i] = cg_var(k, ph.dim[i].var);
    }
    /* column index [n, o.., c, j..] */
    int guard = -1;
    idx[0] = vars[0];
    idx[ns + 1] = vars[1];
    for (int i = 0; i < ns; i++) {
        if (by_out[i]) {
            /* o = (y + p) / s - t, j = y + p - o s (>= 0); kept where o >= 0,
             * o < O and j < k */
            int yp = cg_binop(k, CG_ADD, vars[2 + i], cg_const_i(k, DT_I64, cv.p[i]));
            int sv = cg_const_i(k, DT_I64, cv.s[i]);
            int o = cg_binop(k, CG_SUB, cg_binop(k, CG_IDIV, yp, sv), jv[i]);
            int j = cg_binop(k, CG_SUB, yp, cg_binop(k, CG_MUL, o, sv));
            guard = guard_and(k, guard, in_range(k, o, cv.out[i]));
            guard = guard_and(k, guard, cg_binop(k, CG_LT, j, cg_const_i(k, DT_I64, cv.k[i])));
            idx[1 + i] = o;
            idx[ns + 2 + i] = j;
            continue;
        }
        int t = cg_binop(k, CG_ADD, vars[2 + i], cg_const_i(k, DT_I64, cv.p[i]));
        t = cg_binop(k, CG_SUB, t, cg_binop(k, CG_MUL, jv[i], cg_const_i(k, DT_I64, cv.d[i])));
        int o = t;
        if (cv.s[i] > 1) {
            int sv = cg_const_i(k, DT_I64, cv.s[i]);
            int nonneg = cg_binop(k, CG_GE, t, cg_const_i(k, DT_I64, 0));
            int exact = cg_binop(k, CG_EQ, cg_binop(k, CG_IMOD, t, sv), cg_const_i(k, DT_I64, 0));
            guard = guard_and(k, guard, cg_binop(k, CG_AND, nonneg, exact));
            o = cg_binop(k, CG_IDIV, t, sv);
        }
        guard = guard_and(k, guard, in_range(k, o, cv.out[i]));
        idx[1 + i] = o;
        idx[ns + 2 + i] = jv[i];
    }
    int ld = cg_load(k, pin, flat_index(k, &vs, idx));
    ph.value = cg_select(k, guard, ld, zero_of(k, os->dtype));
    vec_push(&l->ph, ph);
    add_store(k, l, po, flat_index(k, os, vars), cg_acc(k, ph.acc, os->dtype), false, -1);
    return true;
}

bool cg_lower_op(const Graph *g, int i, CgKernel *k, Diag *d)
{
    const Op *op = &g->ops.v[i];
    const Tensor *out = &g->t.v[op->out];
    const Shape *os = &out->s;
    const char *name = ir_opinfo[op->code].name;
    char nb[128];
    snprintf(nb, sizeof nb, "k%d_%s", i, name);
    k->name = xstrdup(nb);
    k->op = i;
    k->group = -1;
    k->noalias = true;
    k->parallel = op->code != OP_SCATTER_ADD;
    if (!dtypes_supported(g, op, d))
        return false;
    int po = add_param(k, g, op->out, true);
    int vars[IR_MAX_RANK] = {0}, idx[IR_MAX_RANK] = {0};
    int64_t numel = shape_numel(os);
    const OpInfo *info = &ir_opinfo[op->code];

    if (info->cls == OC_ELEMWISE && op->code != OP_IOTA) {
        /* same flat index everywhere: one flat loop */
        CgLoop *l = new_loop(k, 1, &numel, vars);
        int v = vars[0], val;
        int in[3];
        for (int j = 0; j < op->nin; j++)
            in[j] = cg_load(k, add_param(k, g, op->in[j], false), v);
        switch (op->code) {
        case OP_CONST:
            val = dtype_is_float(os->dtype) ? cg_const_f(k, os->dtype, op->attr.f)
                                            : cg_const_i(k, os->dtype, (int64_t)op->attr.f);
            break;
        case OP_CAST:
            val = cg_cast(k, os->dtype, in[0]);
            break;
        case OP_STOP_GRADIENT: /* simplify removes it; the identity if not */
            val = in[0];
            break;
        case OP_SELECT:
            val = cg_select(k, in[0], in[1], in[2]);
            break;
        default:
            val = op->nin == 1 ? cg_unop(k, elem_op(op->code), in[0])
                               : cg_binop(k, elem_op(op->code), in[0], in[1]);
        }
        add_store(k, l, po, v, val, false, -1);
        return true;
    }
    if (op->code == OP_RANDOM) {
        CgLoop *l = new_loop(k, 1, &numel, vars);
        add_store(k, l, po, vars[0], cg_rand(k, (uint64_t)op->attr.ia[0], vars[0]), false, -1);
        return true;
    }
    if (op->code == OP_ALLREDUCE || op->code == OP_RESHAPE) {
        CgLoop *l = new_loop(k, 1, &numel, vars);
        int p = add_param(k, g, op->in[0], false);
        add_store(k, l, po, vars[0], cg_load(k, p, vars[0]), false, -1);
        return true;
    }
    if (is_reduce(op->code)) {
        const Shape *is = &g->t.v[op->in[0]].s;
        bool red[IR_MAX_RANK] = {0};
        for (int j = 0; j < op->attr.nia; j++)
            red[op->attr.ia[j]] = true;
        int64_t odims[IR_MAX_RANK] = {0}, rdims[IR_MAX_RANK] = {0};
        int no = 0, nr = 0;
        for (int a = 0; a < is->rank; a++) {
            if (red[a])
                rdims[nr++] = is->dim[a];
            else
                odims[no++] = is->dim[a];
        }
        int ov[IR_MAX_RANK];
        CgLoop *l = new_loop(k, no, odims, ov);
        CgPhase ph = {.ndim = nr, .acc = k->naccs++, .adt = os->dtype, .rop = red_op(op->code)};
        ph.wide = ph.rop == CG_RED_SUM && dtype_is_float(os->dtype);
        int rv[IR_MAX_RANK], oi[IR_MAX_RANK];
        for (int j = 0; j < nr; j++) {
            ph.dim[j].var = cg_new_var(k);
            ph.dim[j].n = rdims[j];
            rv[j] = cg_var(k, ph.dim[j].var);
        }
        int jo = 0, jr = 0;
        for (int a = 0; a < is->rank; a++) {
            if (red[a]) {
                idx[a] = rv[jr++];
                oi[a] = cg_const_i(k, DT_I64, 0);
            } else {
                idx[a] = oi[a] = ov[jo++];
            }
        }
        int p = add_param(k, g, op->in[0], false);
        ph.value = cg_load(k, p, flat_index(k, is, idx));
        vec_push(&l->ph, ph);
        add_store(k, l, po, flat_index(k, os, oi), cg_acc(k, ph.acc, os->dtype), false, -1);
        return true;
    }
    if (op->code == OP_SCATTER_ADD) {
        const Shape *ix = &g->t.v[op->in[0]].s, *ss = &g->t.v[op->in[1]].s;
        CgLoop *z = new_loop(k, 1, &numel, vars);
        add_store(k, z, po, vars[0], zero_of(k, os->dtype), false, -1);
        int sv[IR_MAX_RANK];
        CgLoop *l = new_loop(k, ss->rank, ss->dim, sv);
        int pi = add_param(k, g, op->in[0], false), ps = add_param(k, g, op->in[1], false);
        int row = cg_cast(k, DT_I64, cg_load(k, pi, flat_index(k, ix, sv)));
        int64_t rowlen = numel / os->dim[0];
        int rest = cg_const_i(k, DT_I64, 0);
        int64_t stride = 1;
        for (int a = ss->rank - 1; a >= ix->rank; a--) {
            rest = cg_binop(k, CG_ADD, cg_binop(k, CG_MUL, sv[a], cg_const_i(k, DT_I64, stride)),
                            rest);
            stride *= ss->dim[a];
        }
        int dst = cg_binop(k, CG_ADD, cg_binop(k, CG_MUL, row, cg_const_i(k, DT_I64, rowlen)),
                           rest);
        add_store(k, l, po, dst, cg_load(k, ps, flat_index(k, ss, sv)), true,
                  in_range(k, row, os->dim[0]));
        return true;
    }

    if (op->code == OP_IM2COL || op->code == OP_COL2IM)
        return lower_conv(g, op, k, po);

    /* the rest: one loop over the result's dims */
    CgLoop *l = new_loop(k, os->rank, os->dim, vars);
    int oflat = flat_index(k, os, vars);
    int val = -1;
    switch (op->code) {
    case OP_IOTA:
        val = cg_cast(k, os->dtype, vars[op->attr.ia[0]]);
        break;
    case OP_BROADCAST: {
        const Shape *is = &g->t.v[op->in[0]].s;
        int off = os->rank - is->rank;
        for (int a = 0; a < is->rank; a++)
            idx[a] = is->dim[a] == 1 ? cg_const_i(k, DT_I64, 0) : vars[off + a];
        val = cg_load(k, add_param(k, g, op->in[0], false), flat_index(k, is, idx));
        break;
    }
    case OP_PERMUTE: {
        const Shape *is = &g->t.v[op->in[0]].s;
        for (int a = 0; a < os->rank; a++)
            idx[op->attr.ia[a]] = vars[a];
        val = cg_load(k, add_param(k, g, op->in[0], false), flat_index(k, is, idx));
        break;
    }
    case OP_SLICE: {
        const Shape *is = &g->t.v[op->in[0]].s;
        for (int a = 0; a < os->rank; a++)
            idx[a] = cg_binop(k, CG_ADD, vars[a], cg_const_i(k, DT_I64, op->attr.ia[a]));
        val = cg_load(k, add_param(k, g, op->in[0], false), flat_index(k, is, idx));
        break;
    }
    case OP_PAD: {
        const Shape *is = &g->t.v[op->in[0]].s;
        int guard = -1;
        for (int a = 0; a < os->rank; a++) {
            if (is->dim[a] == os->dim[a]) {
                idx[a] = vars[a];
                continue;
            }
            idx[a] = cg_binop(k, CG_SUB, vars[a], cg_const_i(k, DT_I64, op->attr.ia[a]));
            guard = guard_and(k, guard, in_range(k, idx[a], is->dim[a]));
        }
        val = cg_load(k, add_param(k, g, op->in[0], false), flat_index(k, is, idx));
        if (guard >= 0)
            val = cg_select(k, guard, val, zero_of(k, os->dtype));
        break;
    }
    case OP_CONCAT: {
        /* any number of operands: a balanced tree of selects on the axis
         * index picks the one operand each element reads (depth log2 n, and
         * each select is a conditional, so no other operand is read) */
        int ax = (int)op->attr.ia[0];
        int n = op->nin;
        int64_t *start = xmalloc(sizeof(int64_t) * (size_t)(n + 1));
        int *ld = xmalloc(sizeof(int) * (size_t)n);
        int64_t s = 0;
        for (int j = 0; j < n; j++) {
            start[j] = s;
            s += g->t.v[op->in[j]].s.dim[ax]; /* <= the result's dim: no overflow */
        }
        start[n] = s;
        for (int j = 0; j < n; j++) {
            const Shape *is = &g->t.v[op->in[j]].s;
            for (int a = 0; a < os->rank; a++)
                idx[a] = a == ax ? cg_binop(k, CG_SUB, vars[a], cg_const_i(k, DT_I64, start[j]))
                                 : vars[a];
            ld[j] = cg_load(k, add_param(k, g, op->in[j], false), flat_index(k, is, idx));
        }
        val = concat_tree(k, vars[ax], start, ld, 0, n);
        free(start);
        free(ld);
        break;
    }
    case OP_GATHER: {
        const Shape *ts = &g->t.v[op->in[0]].s, *ix = &g->t.v[op->in[1]].s;
        int row = cg_cast(k, DT_I64, cg_load(k, add_param(k, g, op->in[1], false),
                                             flat_index(k, ix, vars)));
        idx[0] = row;
        for (int a = 1; a < ts->rank; a++)
            idx[a] = vars[ix->rank + a - 1];
        int ld = cg_load(k, add_param(k, g, op->in[0], false), flat_index(k, ts, idx));
        val = cg_select(k, in_range(k, row, ts->dim[0]), ld, zero_of(k, os->dtype));
        break;
    }
    case OP_TAKE_ALONG: {
        const Shape *xs = &g->t.v[op->in[0]].s, *ix = &g->t.v[op->in[1]].s;
        int64_t V = xs->dim[xs->rank - 1];
        int col = cg_cast(k, DT_I64, cg_load(k, add_param(k, g, op->in[1], false),
                                             flat_index(k, ix, vars)));
        int row = flat_index(k, os, vars);
        int at = cg_binop(k, CG_ADD, cg_binop(k, CG_MUL, row, cg_const_i(k, DT_I64, V)), col);
        int ld = cg_load(k, add_param(k, g, op->in[0], false), at);
        val = cg_select(k, in_range(k, col, V), ld, zero_of(k, os->dtype));
        break;
    }
    default:
        snprintf(d->msg, sizeof d->msg, "%s:%d: %s has no CPU kernel",
                 op->loc.file ? op->loc.file : "?", op->loc.line, name);
        return false;
    }
    add_store(k, l, po, oflat, val, false, -1);
    return true;
}

/* ---- fused groups ----------------------------------------------------------
 * One loop per domain (see FuseDomain). ROW and ELEM: outer var o over the
 * rows (S[0..k) flattened), inner var j over S[k..) flattened; COL: outer
 * var n over the columns S[k..), inner var m over the rows S[0..k). A value
 * is either full (indexed by both vars) or per outer iteration ("row"
 * level, shape pass_fuse_oshape). Phases: for each reduction in program
 * order a row phase (row values it needs) and its fold; then a row phase
 * storing per-row results and a store phase storing full results. Every
 * member's value and every load is a let of the phase that first needs it. */

enum { LV_FULL, LV_ROW };

typedef struct {
    const Graph *g;
    CgKernel *k;
    const bool *mat;
    Diag *d;
    bool fail;
    int *mark, stamp;   /* op -> stamp: member of this loop */
    FuseDomain dom;
    int ksplit;         /* axis split used for the vars */
    bool col;
    int64_t nouter, ninner;
    int vo, vi;         /* exprs: outer var, inner var */
    int oidx[IR_MAX_RANK], ridx[IR_MAX_RANK];
    int *lvl;           /* per op: LV_* */
    int *fcache, *fstamp, phase_id; /* per tensor: full-level expr of the current phase */
    int *rcache;        /* per tensor: row-level expr (-1 none), whole loop */
    int *accx;          /* per tensor: accumulator expr of a reduction (-1) */
    int loop;           /* index in k->loops */
    int fph, rph;       /* current full / row phase indices (-1 none) */
    bool row_in_full;   /* COL before its folds: row values live in the fold */
    VEC(int) rset;      /* tensors whose rcache is set */
    int *pin;           /* per tensor: its input param (add_param's), -1 none */
} Lg;

/* add_param(L->k, L->g, t, false) in O(1): the first input param of t. */
static int lg_param(Lg *L, int t)
{
    if (L->pin[t] < 0)
        L->pin[t] = push_param(L->k, L->g, t, false);
    return L->pin[t];
}

static bool lg_member(const Lg *L, int t)
{
    int p = L->g->t.v[t].op;
    return p >= 0 && L->mark[p] == L->stamp;
}

static CgPhase *lg_phase(Lg *L, int i) { return &L->k->loops.v[L->loop].ph.v[i]; }

static int lg_new_phase(Lg *L, bool inner)
{
    CgLoop *l = &L->k->loops.v[L->loop];
    CgPhase ph = {.acc = -1};
    if (inner) {
        ph.ndim = 1;
        ph.dim[0].var = L->k->ex.v[L->vi].var;
        ph.dim[0].n = L->ninner;
    }
    vec_push(&l->ph, ph);
    return l->ph.n - 1;
}

static int lg_bind(Lg *L, int e, int phase)
{
    CgExpr *x = &L->k->ex.v[e];
    if (x->let || x->kind == CGX_CONST || x->kind == CGX_VAR || x->kind == CGX_ACC)
        return e;
    x->let = true;
    vec_push(&lg_phase(L, phase)->lets, e);
    return e;
}

static void lg_fail(Lg *L, const char *what, int op)
{
    if (L->fail)
        return;
    L->fail = true;
    const Op *o = op >= 0 ? &L->g->ops.v[op] : NULL;
    snprintf(L->d->msg, sizeof L->d->msg, "%s:%d: fused kernel: %s (op %d%s%s)",
             o && o->loc.file ? o->loc.file : "?", o ? o->loc.line : 0, what, op,
             o ? ", " : "", o ? ir_opinfo[o->code].name : "");
}

/* Flat index of tensor shape s at multi-index idx; full and row shapes use
 * the loop vars directly (contiguous access). */
static int lg_flat(Lg *L, const Shape *s, const int *idx, int lv)
{
    CgKernel *k = L->k;
    if (lv == LV_FULL && shape_dims_eq(s, &L->dom.S))
        return cg_binop(k, CG_ADD, cg_binop(k, CG_MUL, L->col ? L->vi : L->vo,
                                            cg_const_i(k, DT_I64, L->col ? L->nouter : L->ninner)),
                        L->col ? L->vo : L->vi);
    Shape o = pass_fuse_oshape(&L->dom);
    if (lv == LV_ROW && shape_dims_eq(s, &o))
        return L->vo;
    return flat_index(k, s, idx);
}

static int lg_const(Lg *L, const Op *op)
{
    const Shape *os = &L->g->t.v[op->out].s;
    return dtype_is_float(os->dtype) ? cg_const_f(L->k, os->dtype, op->attr.f)
                                     : cg_const_i(L->k, os->dtype, (int64_t)op->attr.f);
}

/* lg_gen without recursion: a chain of fused ops as long as the group (a
 * group of 50,000 chained adds) must not grow the C stack. Each pending
 * value is a frame: lg_start does what comes before its operands (caches,
 * loads, values that need none), the operands are produced one after the
 * other in operand order by frames of their own, and lg_build and
 * lg_finish make and bind the value: the same calls, in the same order, as
 * the recursive form, so the kernels are the same. */
enum { LGK_ID, LGK_CAST, LGK_SELECT, LGK_ELEM };

typedef struct {
    int t, p, my, phase;
    bool rowc;
    int kind, need, got;
    int ct[3], clv[3], in[3];
} LgFrame;

static int lg_finish(Lg *L, const LgFrame *fr, int e)
{
    e = lg_bind(L, e, fr->phase);
    if (fr->rowc) {
        if (L->rcache[fr->t] < 0)
            vec_push(&L->rset, fr->t);
        L->rcache[fr->t] = e;
    } else {
        L->fcache[fr->t] = e;
        L->fstamp[fr->t] = L->phase_id;
    }
    return e;
}

/* The value of a frame whose operands are all in fr->in. */
static int lg_build(Lg *L, const LgFrame *fr)
{
    CgKernel *k = L->k;
    const Op *op = &L->g->ops.v[fr->p];
    switch (fr->kind) {
    case LGK_ID: return fr->in[0];
    case LGK_CAST: return cg_cast(k, L->g->t.v[fr->t].s.dtype, fr->in[0]);
    case LGK_SELECT: return cg_select(k, fr->in[0], fr->in[1], fr->in[2]);
    default:
        return op->nin == 1 ? cg_unop(k, elem_op(op->code), fr->in[0])
                            : cg_binop(k, elem_op(op->code), fr->in[0], fr->in[1]);
    }
}

/* True with *val when t's value needs no operand value; else fr holds
 * the operands to produce (fr->need >= 1). */
static bool lg_start(Lg *L, int t, int lv, LgFrame *fr, int *val)
{
    const Graph *g = L->g;
    CgKernel *k = L->k;
    if (L->fail) {
        *val = cg_const_f(k, DT_F32, 0);
        return true;
    }
    int p = g->t.v[t].op;
    bool mem = lg_member(L, t) && g->ops.v[p].code != OP_MATMUL;
    if (mem && g->ops.v[p].code == OP_CONST) {
        *val = lg_const(L, &g->ops.v[p]);
        return true;
    }
    if (mem && is_reduce(g->ops.v[p].code)) {
        if (L->accx[t] < 0)
            lg_fail(L, "reduction result used before its reduction", p);
        *val = L->accx[t] < 0 ? cg_const_f(k, DT_F32, 0) : L->accx[t];
        return true;
    }
    int my = mem ? L->lvl[p] : lv;
    bool rowc = my == LV_ROW && !L->row_in_full;
    if (rowc && L->rcache[t] >= 0) {
        *val = L->rcache[t];
        return true;
    }
    if (!rowc && L->fstamp[t] == L->phase_id) {
        *val = L->fcache[t];
        return true;
    }
    int phase = rowc ? L->rph : L->fph;
    if (phase < 0) {
        lg_fail(L, "value needed where no phase can hold it", p);
        *val = cg_const_f(k, DT_F32, 0);
        return true;
    }
    *fr = (LgFrame){.t = t, .p = p, .my = my, .phase = phase, .rowc = rowc};
    const int *idx = my == LV_ROW ? L->ridx : L->oidx;
    const Shape *ts = &g->t.v[t].s;
    int e;
    if (!mem) {
        /* from memory: must be a full or row shaped tensor */
        Shape o = pass_fuse_oshape(&L->dom);
        if (!(my == LV_FULL ? shape_dims_eq(ts, &L->dom.S) : shape_dims_eq(ts, &o))) {
            lg_fail(L, "operand read from memory does not fit the kernel's domain", p);
            *val = cg_const_f(k, DT_F32, 0);
            return true;
        }
        e = cg_load(k, lg_param(L, t), lg_flat(L, ts, idx, my));
    } else {
        const Op *op = &g->ops.v[p];
        switch (op->code) {
        case OP_IOTA:
            e = cg_cast(k, ts->dtype, idx[op->attr.ia[0]]);
            break;
        case OP_RANDOM:
            e = cg_rand(k, (uint64_t)op->attr.ia[0], lg_flat(L, ts, idx, my));
            break;
        case OP_BROADCAST: {
            int x = op->in[0];
            const Shape *is = &g->t.v[x].s;
            if (lg_member(L, x)) {
                fr->kind = LGK_ID;
                fr->need = 1;
                fr->ct[0] = x;
                fr->clv[0] = LV_ROW;
                return false;
            }
            int bi[IR_MAX_RANK];
            int off = ts->rank - is->rank;
            for (int a = 0; a < is->rank; a++)
                bi[a] = is->dim[a] == 1 ? cg_const_i(k, DT_I64, 0) : idx[off + a];
            e = cg_load(k, lg_param(L, x), flat_index(k, is, bi));
            break;
        }
        default:
            if (op->code != OP_CAST && op->code != OP_STOP_GRADIENT &&
                op->code != OP_SELECT && ir_opinfo[op->code].cls != OC_ELEMWISE) {
                lg_fail(L, "op cannot be part of a fused kernel", p);
                *val = cg_const_f(k, DT_F32, 0);
                return true;
            }
            fr->kind = op->code == OP_CAST             ? LGK_CAST
                       : op->code == OP_STOP_GRADIENT ? LGK_ID
                       : op->code == OP_SELECT        ? LGK_SELECT
                                                      : LGK_ELEM;
            fr->need = fr->kind == LGK_SELECT ? 3
                       : fr->kind == LGK_ELEM ? op->nin
                                              : 1;
            for (int j = 0; j < fr->need; j++) {
                fr->ct[j] = op->in[j];
                fr->clv[j] = my;
            }
            if (fr->need > 0)
                return false;
            e = lg_build(L, fr);
        }
    }
    *val = lg_finish(L, fr, e);
    return true;
}

/* Value of tensor t at the current point, at level lv (the consumer's). */
static int lg_gen(Lg *L, int t, int lv)
{
    LgFrame buf[16], *st = buf;
    int n = 0, cap = 16, val;
    if (lg_start(L, t, lv, &st[0], &val))
        return val;
    n = 1;
    while (n > 0) {
        LgFrame *fr = &st[n - 1];
        if (fr->got < fr->need) {
            if (n == cap) {
                LgFrame *bigger = xmalloc(sizeof(LgFrame) * (size_t)cap * 2);
                memcpy(bigger, st, sizeof(LgFrame) * (size_t)cap);
                if (st != buf)
                    free(st);
                st = bigger;
                cap *= 2;
                fr = &st[n - 1];
            }
            int ct = fr->ct[fr->got], clv = fr->clv[fr->got];
            if (lg_start(L, ct, clv, &st[n], &val))
                st[n - 1].in[st[n - 1].got++] = val;
            else
                n++;
            continue;
        }
        val = lg_finish(L, fr, lg_build(L, fr));
        if (--n > 0)
            st[n - 1].in[st[n - 1].got++] = val;
    }
    if (st != buf)
        free(st);
    return val;
}

/* Decomposes flat var v over dims S[a0..a1) into idx[a0..a1). */
static void lg_decompose(Lg *L, int v, int a0, int a1, int *idx)
{
    CgKernel *k = L->k;
    int64_t stride = 1;
    for (int a = a1 - 1; a >= a0; a--) {
        int q = cg_binop(k, CG_IDIV, v, cg_const_i(k, DT_I64, stride));
        idx[a] = a == a0 ? q : cg_binop(k, CG_IMOD, q, cg_const_i(k, DT_I64, L->dom.S.dim[a]));
        stride *= L->dom.S.dim[a];
    }
}

static bool lower_loop(const Graph *g, const int *ops, int n, const FuseDomain *dom,
                       const bool *mat, CgKernel *k, Lg *L)
{
    L->dom = *dom;
    L->stamp++;
    for (int i = 0; i < n; i++)
        L->mark[ops[i]] = L->stamp;
    const Shape *S = &dom->S;
    int r = S->rank;
    L->col = dom->kind == FUSE_COL;
    L->ksplit = dom->kind == FUSE_ELEM ? (r > 0 ? r - 1 : 0) : dom->k;
    int64_t lead = 1, trail = 1;
    for (int a = 0; a < r; a++) {
        if (a < L->ksplit)
            lead *= S->dim[a];
        else
            trail *= S->dim[a];
    }
    L->nouter = L->col ? trail : lead;
    L->ninner = L->col ? lead : trail;
    CgLoop lp = {.ndim = 1, .col = L->col};
    lp.dim[0].var = cg_new_var(k);
    lp.dim[0].n = L->nouter;
    int iv = cg_new_var(k);
    vec_push(&k->loops, lp);
    L->loop = k->loops.n - 1;
    L->vo = cg_var(k, lp.dim[0].var);
    L->vi = cg_var(k, iv);
    /* multi-indices */
    int rows = L->col ? L->vi : L->vo, cols = L->col ? L->vo : L->vi;
    lg_decompose(L, rows, 0, L->ksplit, L->oidx);
    lg_decompose(L, cols, L->ksplit, r, L->oidx);
    for (int a = 0; a < r; a++) {
        bool outer = L->col ? a >= L->ksplit : a < L->ksplit;
        L->ridx[a] = outer ? L->oidx[a] : cg_const_i(k, DT_I64, 0);
    }
    /* levels */
    Shape osh = pass_fuse_oshape(dom);
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[ops[i]];
        const Shape *s = &g->t.v[op->out].s;
        int lv = LV_FULL;
        if (is_reduce(op->code)) {
            lv = LV_ROW;
        } else if (dom->kind != FUSE_ELEM && shape_dims_eq(s, &osh)) {
            lv = LV_ROW;
            /* degenerate: row and full shapes agree (every reduced extent
             * is 1). A row loop computes everything at row level (a full
             * value would be bound inside a fold's loop, out of reach of
             * the row values that use it); a column loop keeps values full
             * unless they read a row value. */
            if (L->col && shape_dims_eq(s, S)) {
                lv = LV_FULL;
                for (int j = 0; j < op->nin; j++) {
                    int q = g->t.v[op->in[j]].op;
                    if (q >= 0 && L->mark[q] == L->stamp && L->lvl[q] == LV_ROW &&
                        g->ops.v[q].code != OP_CONST)
                        lv = LV_ROW;
                }
            }
        }
        L->lvl[ops[i]] = lv;
    }
    /* folds */
    L->rph = L->fph = -1;
    for (int i = 0; i < n && !L->fail; i++) {
        const Op *op = &g->ops.v[ops[i]];
        if (!is_reduce(op->code))
            continue;
        L->row_in_full = L->col;
        L->rph = L->col ? -1 : lg_new_phase(L, false);
        int fold = lg_new_phase(L, true);
        L->fph = fold;
        L->phase_id++;
        int v = lg_gen(L, op->in[0], LV_FULL);
        DType dt = g->t.v[op->out].s.dtype;
        CgPhase *ph = lg_phase(L, fold);
        ph->acc = k->naccs++;
        ph->rop = red_op(op->code);
        ph->adt = dt;
        ph->wide = ph->rop == CG_RED_SUM && dtype_is_float(dt);
        ph->value = v;
        L->accx[op->out] = cg_acc(k, ph->acc, dt);
    }
    /* stores */
    L->row_in_full = false;
    L->rph = lg_new_phase(L, false);
    L->fph = lg_new_phase(L, true);
    L->phase_id++;
    int rph = L->rph, fph = L->fph;
    for (int i = 0; i < n && !L->fail; i++) {
        const Op *op = &g->ops.v[ops[i]];
        int t = op->out;
        if (!mat[t] || op->code == OP_MATMUL)
            continue;
        int lv = L->lvl[ops[i]];
        const Shape *s = &g->t.v[t].s;
        if (op->code == OP_CONST && !shape_dims_eq(s, S) && !shape_dims_eq(s, &osh)) {
            lg_fail(L, "a constant needed outside its group does not fit the kernel", ops[i]);
            break;
        }
        if (op->code == OP_CONST)
            lv = shape_dims_eq(s, S) ? LV_FULL : LV_ROW;
        if (L->col && lv == LV_FULL) /* pass_fuse_lowers rejects such groups */
            die("codegen: column loop of group %d stores op %d at full shape",
                g->ops.v[ops[i]].group, ops[i]);
        int v = lg_gen(L, t, lv);
        int po = add_param(k, g, t, true);
        CgStore st = {po, lg_flat(L, s, lv == LV_ROW ? L->ridx : L->oidx, lv), v, false, -1};
        vec_push(&lg_phase(L, lv == LV_ROW ? rph : fph)->st, st);
    }
    /* drop empty trailing phases */
    CgLoop *l = &k->loops.v[L->loop];
    for (int i = l->ph.n - 1; i >= 0; i--) {
        CgPhase *ph = &l->ph.v[i];
        if (ph->acc < 0 && !ph->st.n && !ph->lets.n) {
            vec_free(&ph->st);
            vec_free(&ph->lets);
            memmove(ph, ph + 1, sizeof *ph * (size_t)(l->ph.n - i - 1));
            l->ph.n--;
        }
    }
    return !L->fail;
}

/* Per-graph scratch, left clean after every call: pos[] and readby[] back
 * at their idle values, rcache[]/accx[]/pin[] at -1 (the touched tensors
 * are listed, or are the kernel's params), mark[]/fstamp[] compared against
 * stamps that only grow. */
struct CgLowerWs {
    int nops, nt;
    int *pos, *mark, *lvl, *fcache, *fstamp, *rcache, *accx, *readby, *pin;
    int stamp, phase_id;
};

CgLowerWs *cg_lower_ws_new(const Graph *g)
{
    CgLowerWs *w = xcalloc(1, sizeof *w);
    int nt = g->t.n, nops = g->ops.n;
    w->nops = nops;
    w->nt = nt;
    w->pos = xmalloc(sizeof(int) * (size_t)(nops + 1));
    for (int i = 0; i < nops; i++)
        w->pos[i] = -1;
    w->mark = xcalloc((size_t)nops + 1, sizeof(int));
    w->lvl = xcalloc((size_t)nops + 1, sizeof(int));
    w->fcache = xmalloc(sizeof(int) * (size_t)(nt + 1));
    w->fstamp = xcalloc((size_t)nt + 1, sizeof(int));
    w->rcache = xmalloc(sizeof(int) * (size_t)(nt + 1));
    w->accx = xmalloc(sizeof(int) * (size_t)(nt + 1));
    w->readby = xcalloc((size_t)nt + 1, sizeof(int));
    w->pin = xmalloc(sizeof(int) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        w->rcache[t] = w->accx[t] = w->pin[t] = -1;
    return w;
}

void cg_lower_ws_free(CgLowerWs *w)
{
    if (!w)
        return;
    free(w->pos);
    free(w->mark);
    free(w->lvl);
    free(w->fcache);
    free(w->fstamp);
    free(w->rcache);
    free(w->accx);
    free(w->readby);
    free(w->pin);
    free(w);
}

bool cg_lower_group(const Graph *g, const int *ops, int n, const bool *mat, CgKernel *k,
                    Diag *d)
{
    CgLowerWs *w = cg_lower_ws_new(g);
    bool ok = cg_lower_group_ws(w, g, ops, n, mat, k, d);
    cg_lower_ws_free(w);
    return ok;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

typedef VEC(int) IntHeap;

/* A min-heap of ints. */
static void heap_push(IntHeap *h, int x)
{
    vec_push(h, x);
    for (int i = h->n - 1; i > 0 && h->v[(i - 1) / 2] > h->v[i]; i = (i - 1) / 2) {
        int t = h->v[i];
        h->v[i] = h->v[(i - 1) / 2];
        h->v[(i - 1) / 2] = t;
    }
}

static int heap_pop(IntHeap *h)
{
    int top = h->v[0];
    h->v[0] = h->v[--h->n];
    for (int i = 0;;) {
        int c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1] < h->v[c])
            c++;
        if (h->v[i] <= h->v[c])
            break;
        int t = h->v[i];
        h->v[i] = h->v[c];
        h->v[c] = t;
        i = c;
    }
    return top;
}

bool cg_lower_group_ws(CgLowerWs *w, const Graph *g, const int *ops, int n, const bool *mat,
                       CgKernel *k, Diag *d)
{
    if (w->nops != g->ops.n || w->nt != g->t.n)
        die("codegen: lowering workspace built for another graph");
    k->op = ops[0];
    k->group = g->ops.v[ops[0]].group;
    k->noalias = true;
    k->parallel = true;
    for (int i = 0; i < n; i++)
        if (!dtypes_supported(g, &g->ops.v[ops[i]], d))
            return false;
    /* connected parts by in-group edges and a domain per part (the fuse
     * pass's own check: pass_fuse_lowers); parts with one domain share a
     * loop. pos: member position, -1 outside */
    int *uf = xmalloc(sizeof(int) * (size_t)(n + 1));
    FuseDomain *dom = xcalloc((size_t)n + 1, sizeof(FuseDomain));
    int bad = ops[0];
    char err[256];
    bool ok = pass_fuse_lowers(g, ops, n, mat, uf, dom, &bad, err, sizeof err);
    if (!ok) {
        const Op *op = &g->ops.v[bad];
        snprintf(d->msg, sizeof d->msg, "%s:%d: group %d cannot be one kernel: %s",
                 op->loc.file ? op->loc.file : "?", op->loc.line, op->group, err);
    }
    int *pos = w->pos;
    for (int i = 0; i < n; i++)
        pos[ops[i]] = i;
    int *part = xmalloc(sizeof(int) * (size_t)(n + 1));
    Lg L = {.g = g, .k = k, .mat = mat, .d = d};
    L.mark = w->mark;
    L.stamp = w->stamp;
    L.lvl = w->lvl;
    L.fcache = w->fcache;
    L.fstamp = w->fstamp;
    L.phase_id = w->phase_id;
    L.rcache = w->rcache;
    L.accx = w->accx;
    L.pin = w->pin;
    for (int i = k->params.n - 1; i >= 0; i--) /* the first input param wins */
        if (!k->params.v[i].out)
            L.pin[k->params.v[i].tensor] = i;
    bool *done = xcalloc((size_t)n + 1, sizeof(bool));
    int *readby = w->readby; /* tensor -> loop (i + 1) reading it */
    VEC(int) rd = {0};       /* tensors readby marks */
    /* the members of each part root, in member order: mem[moff[r] ..) */
    int *moff = xcalloc((size_t)n + 2, sizeof(int));
    int *mem = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int j = 0; j < n; j++)
        moff[uf[j] + 1]++;
    for (int r = 0; r < n; r++)
        moff[r + 1] += moff[r];
    for (int j = 0, *fill = part; j < n; j++) /* part: fill counts for now */
        fill[j] = 0;
    for (int j = 0; j < n; j++)
        mem[moff[uf[j]] + part[uf[j]]++] = j;
    /* who reads what: (operand << 32 | part root) of every member, sorted */
    int nrd = 0;
    for (int j = 0; j < n; j++)
        nrd += g->ops.v[ops[j]].nin;
    int64_t *rdr = xmalloc(sizeof(int64_t) * (size_t)(nrd + 1));
    nrd = 0;
    for (int j = 0; j < n; j++)
        for (int q = 0; q < g->ops.v[ops[j]].nin; q++)
            rdr[nrd++] = (int64_t)g->ops.v[ops[j]].in[q] << 32 | uf[j];
    qsort(rdr, (size_t)nrd, sizeof(int64_t), cmp_i64);
    IntHeap heap = {0}; /* roots that read a tensor this loop reads */
    for (int i = 0; i < n && ok; i++) {
        if (uf[i] != i || done[i] || g->ops.v[ops[i]].code == OP_MATMUL)
            continue;
        /* the parts that join loop i, in root order: i, then each later
         * part with i's domain that reads a tensor an earlier joined part
         * reads (a multi-output kernel reads it once); independent parts
         * (the multi-tensor update) get loops of their own. The roots
         * come from a heap fed by the readers of each newly read tensor,
         * not from a scan of every later part */
        int m = 0, last = -1;
        heap.n = 0;
        heap_push(&heap, i);
        while (heap.n) {
            int r = heap_pop(&heap);
            if (r == last || done[r] || g->ops.v[ops[r]].code == OP_MATMUL)
                continue;
            last = r;
            const FuseDomain *a = &dom[i], *b = &dom[r];
            if (a->kind != b->kind || a->k != b->k || !shape_dims_eq(&a->S, &b->S))
                continue;
            done[r] = true;
            for (int q2 = moff[r]; q2 < moff[r + 1]; q2++) {
                int j = mem[q2];
                if (g->ops.v[ops[j]].code == OP_MATMUL)
                    continue;
                part[m++] = ops[j];
                const Op *op = &g->ops.v[ops[j]];
                for (int q = 0; q < op->nin; q++) {
                    int x = op->in[q], pp = g->t.v[x].op;
                    bool inside = pp >= 0 && pos[pp] >= 0 && g->ops.v[pp].code != OP_MATMUL;
                    if (inside || shape_numel(&g->t.v[x].s) <= 1 || readby[x] == i + 1)
                        continue;
                    if (!readby[x])
                        vec_push(&rd, x);
                    readby[x] = i + 1;
                    int64_t key = (int64_t)x << 32;
                    int lo = 0, hi = nrd;
                    while (lo < hi) {
                        int mid = lo + (hi - lo) / 2;
                        if (rdr[mid] < key)
                            lo = mid + 1;
                        else
                            hi = mid;
                    }
                    for (; lo < nrd && rdr[lo] >> 32 == x; lo++)
                        if ((int)(rdr[lo] & 0xffffffff) > r)
                            heap_push(&heap, (int)(rdr[lo] & 0xffffffff));
                }
            }
        }
        /* program order within the loop */
        qsort(part, (size_t)m, sizeof(int), cmp_int);
        ok = lower_loop(g, part, m, &dom[i], mat, k, &L);
    }
    /* leave the workspace clean */
    for (int i = 0; i < n; i++) {
        pos[ops[i]] = -1;
        int t = g->ops.v[ops[i]].out;
        w->rcache[t] = w->accx[t] = -1;
    }
    for (int i = 0; i < rd.n; i++)
        readby[rd.v[i]] = 0;
    for (int i = 0; i < L.rset.n; i++)
        w->rcache[L.rset.v[i]] = -1;
    for (int i = 0; i < k->params.n; i++)
        L.pin[k->params.v[i].tensor] = -1;
    vec_free(&L.rset);
    vec_free(&rd);
    vec_free(&heap);
    free(rdr);
    w->stamp = L.stamp;
    w->phase_id = L.phase_id;
    free(moff);
    free(mem);
    free(done);
    free(dom);
    free(part);
    free(uf);
    return ok;
}
