/* lower.c - one IR op to a target-neutral kernel description.
 *
 * Shapes are row-major and contiguous. Every op but scatter_add is one loop
 * nest over its result; scatter_add zero-fills its result, then accumulates
 * its source at the indexed rows (dropping out-of-range indices). */
#include "codegen.h"

#include <stdio.h>
#include <string.h>

static int add_param(CgKernel *k, const Graph *g, int tensor, bool out)
{
    if (!out)
        for (int i = 0; i < k->params.n; i++)
            if (k->params.v[i].tensor == tensor && !k->params.v[i].out)
                return i;
    CgParam p = {tensor, g->t.v[tensor].s.dtype, out};
    vec_push(&k->params, p);
    return k->params.n - 1;
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
    k->noalias = true;
    for (int j = -1; j < op->nin; j++) {
        DType dt = g->t.v[j < 0 ? op->out : op->in[j]].s.dtype;
        if (!cg_ctype(dt)) {
            snprintf(d->msg, sizeof d->msg,
                     "%s:%d: %s on %s is not supported by the CPU backend yet (expected "
                     "f32, i32, i64 or u8)",
                     op->loc.file ? op->loc.file : "?", op->loc.line, name, dtype_name(dt));
            return false;
        }
    }
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
    if (op->code == OP_REDUCE_SUM || op->code == OP_REDUCE_MAX) {
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
        CgPhase ph = {.ndim = nr, .acc = k->naccs++, .adt = os->dtype,
                      .rop = op->code == OP_REDUCE_SUM ? CG_RED_SUM : CG_RED_MAX};
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
        int ax = (int)op->attr.ia[0];
        int64_t start[64];
        int64_t s = 0;
        int n = op->nin;
        if (n > 64) {
            snprintf(d->msg, sizeof d->msg, "concat of %d tensors is not supported (at most 64)", n);
            return false;
        }
        for (int j = 0; j < n; j++) {
            start[j] = s;
            s += g->t.v[op->in[j]].s.dim[ax];
        }
        for (int j = n - 1; j >= 0; j--) {
            const Shape *is = &g->t.v[op->in[j]].s;
            for (int a = 0; a < os->rank; a++)
                idx[a] = a == ax ? cg_binop(k, CG_SUB, vars[a], cg_const_i(k, DT_I64, start[j]))
                                 : vars[a];
            int ld = cg_load(k, add_param(k, g, op->in[j], false), flat_index(k, is, idx));
            val = val < 0 ? ld
                          : cg_select(k, cg_binop(k, CG_LT, vars[ax],
                                                  cg_const_i(k, DT_I64, start[j + 1])),
                                      ld, val);
        }
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
    default:
        snprintf(d->msg, sizeof d->msg, "%s:%d: %s has no CPU kernel",
                 op->loc.file ? op->loc.file : "?", op->loc.line, name);
        return false;
    }
    add_store(k, l, po, oflat, val, false, -1);
    return true;
}
