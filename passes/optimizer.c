/* optimizer.c - the parameter update after autodiff, as ordinary ops
 * (OPF_OPTIM): global-norm gradient clipping, then AdamW (below), SGD with
 * momentum / Nesterov, Lion or Adafactor (update_param; their rules are in
 * docs/training.md), with per-param lr scales and weight decays and frozen
 * params (PassParamOpt: no gradient ops, state or update).
 *
 * With g_P = output "grad.P" for each param P:
 *   n      = sqrt(sum_P sum(g_P * g_P))                  output "grad_norm"
 *   scale  = min(1, clip / (n + 1e-6))                    only when clip > 0
 *   g'     = g_P * scale                                  (g_P when clip <= 0)
 *   t      = step + 1                                     adam.step <- t
 *   m'     = b1 * m + (1 - b1) * g'                       adam.m.P  <- m'
 *   v'     = b2 * v + (1 - b2) * g' * g'                  adam.v.P  <- v'
 *   mhat   = m' / (1 - b1^t),  vhat = v' / (1 - b2^t)
 *   P'     = P - lr * (mhat / (sqrt(vhat) + eps) + wd * P)      P <- P'
 * where wd = weight_decay for params of rank >= 2 and 0 otherwise (or the
 * param's group's), and lr the param's (lr * lr_scale). This is
 * PyTorch's AdamW (decoupled weight decay applied to the old P) up to the
 * order of floating-point operations. "lr" is a graph input f32[] so the
 * runtime can schedule it; the step counter is f32 state.
 *
 * Non-finite steps change nothing. Every update is conditional:
 *   ok     = (n*0 + loss*0 + lr*0 == 0)    false iff one of them is inf/NaN
 *   P <- ok ? P' : P,  m, v, adam.step likewise
 * so a step whose loss, gradient norm or lr is not finite leaves params and
 * optimizer state bit-identical (the runtime then stops or counts a skip;
 * it tells the two cases apart from the outputs "loss" and "grad_norm").
 * The sum of squares under n is non-finite iff some gradient element is (or
 * the squares overflow). So that the verdict is the same on every rank and
 * covers the loss of each rank, the gradient of the smallest param is
 * multiplied by (loss*0 + 1), exactly 1 for a finite loss and NaN otherwise,
 * before the comm pass all-reduces it: a non-finite loss on any rank makes
 * n NaN on all of them. (With grad_accum > 1 the runtime does the same for
 * the earlier micro-batches' losses through their accumulator.)
 */
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Graph *g;
    SrcLoc loc;
} B;

static int emit(B *b, Opcode c, int x, int y, const OpAttr *a)
{
    int in[2] = {x, y};
    int n = ir_opinfo[c].arity;
    int t = ir_op_x(b->g, c, in, n, a, b->loc);
    b->g->ops.v[b->g->t.v[t].op].flags |= OPF_OPTIM;
    return t;
}

static int bin(B *b, Opcode c, int x, int y) { return emit(b, c, x, y, NULL); }
static int un(B *b, Opcode c, int x) { return emit(b, c, x, -1, NULL); }

/* const of type s filled with v */
static int cst(B *b, const Shape *s, double v)
{
    OpAttr a = {.f = v, .dtype = s->dtype};
    ir_attr_set_shape(&a, s);
    return emit(b, OP_CONST, -1, -1, &a);
}

static int cst_f32(B *b, double v)
{
    Shape s = {.dtype = DT_F32};
    return cst(b, &s, v);
}

/* scalar x (any float dtype) as a tensor of type s */
static int splat(B *b, int x, const Shape *s)
{
    if (b->g->t.v[x].s.dtype != s->dtype) {
        OpAttr a = {.dtype = s->dtype};
        x = emit(b, OP_CAST, x, -1, &a);
    }
    if (s->rank == 0)
        return x;
    OpAttr a = {0};
    ir_attr_set_shape(&a, s);
    return emit(b, OP_BROADCAST, x, -1, &a);
}

/* sum of all elements of x as an f32 scalar */
static int sum_all_f32(B *b, int x)
{
    const Shape *s = &b->g->t.v[x].s;
    if (s->rank > 0) {
        OpAttr r = {.nia = s->rank};
        for (int k = 0; k < s->rank; k++)
            r.ia[k] = k;
        x = emit(b, OP_REDUCE_SUM, x, -1, &r);
        OpAttr sc = {.rank = 0};
        x = emit(b, OP_RESHAPE, x, -1, &sc);
    }
    if (b->g->t.v[x].s.dtype != DT_F32) {
        OpAttr a = {.dtype = DT_F32};
        x = emit(b, OP_CAST, x, -1, &a);
    }
    return x;
}

/* x reshaped to shape dims[0..rank) (f32) */
static int reshape_f32(B *b, int x, int rank, const int64_t *dims)
{
    Shape s = shape_make(DT_F32, rank, dims);
    OpAttr a = {0};
    ir_attr_set_shape(&a, &s);
    return emit(b, OP_RESHAPE, x, -1, &a);
}

/* rows [n, 1] of an f32[n, k] (reduce_sum over axis 1) as f32[n] */
static int row_sums(B *b, int x, int64_t n)
{
    OpAttr r = {.nia = 1, .ia = {1}};
    return reshape_f32(b, emit(b, OP_REDUCE_SUM, x, -1, &r), 1, &n);
}

/* sum(x * x) as an f32 scalar, for x f32[S] with S a multiple of
 * IR_SHARD_ALIGN (a shard), summed in blocks so that no float running sum
 * is long: a single reduce_sum over S folds S / 8 values into each of its
 * float partials (codegen/cprint.c), whose rounding error grows with S
 * (zero=1's gradient norm over a whole shard, issue 38). Here:
 *   rows of k1 = IR_SHARD_ALIGN * d elements (d the largest divisor of
 *   S / IR_SHARD_ALIGN up to 64), each row's squares summed -> f32[v];
 *   those v sums padded with zeros to a * m (m = ceil(sqrt(v))), rows of m
 *   summed -> f32[a], and the a sums summed.
 * No float partial then folds more than max(k1, m, a) / 8 values (about
 * 128 for the shards of GPT-2 124M on 2 ranks, against 7.8 million). The
 * squares are formed in the first reduction's kernel, as before; only the
 * v <= S / 16 row sums are copied (by the pad). */
static int sum_sq_blocked(B *b, int x, int w)
{
    int64_t S = shape_numel(&b->g->t.v[x].s), u = S / IR_SHARD_ALIGN, d = 1;
    for (int64_t k = 64; k > 1; k--)
        if (u % k == 0) {
            d = k;
            break;
        }
    int64_t k1 = IR_SHARD_ALIGN * d, v = S / k1;
    int rows = reshape_f32(b, x, 2, (int64_t[]){v, k1});
    int sq = bin(b, OP_MUL, rows, rows);
    if (w >= 0) /* weighted squares */
        sq = bin(b, OP_MUL, sq, reshape_f32(b, w, 2, (int64_t[]){v, k1}));
    int r1 = row_sums(b, sq, v);
    int64_t m = 1;
    while (m * m < v)
        m++;
    int64_t a = (v + m - 1) / m;
    if (a * m != v) {
        OpAttr pa = {.nia = 1, .ia = {0}};
        Shape ps = shape_make(DT_F32, 1, (int64_t[]){a * m});
        ir_attr_set_shape(&pa, &ps);
        r1 = emit(b, OP_PAD, r1, -1, &pa);
    }
    int r2 = row_sums(b, reshape_f32(b, r1, 2, (int64_t[]){a, m}), a);
    return sum_all_f32(b, r2);
}

typedef struct {
    int p, grad;
    double lr_scale, wd; /* the param's group: lr factor and weight decay */
} ParamGrad;

/* ok ? x : old, with ok a u8 scalar and x, old of one type */
static int keep_unless(B *b, int ok, int x, int old)
{
    const Shape *s = &b->g->t.v[x].s;
    int m = ok;
    if (s->rank > 0) {
        OpAttr a = {0};
        ir_attr_set_shape(&a, s);
        m = emit(b, OP_BROADCAST, ok, -1, &a);
    }
    int in[3] = {m, x, old};
    int t = ir_op_x(b->g, OP_SELECT, in, 3, NULL, b->loc);
    b->g->ops.v[b->g->t.v[t].op].flags |= OPF_OPTIM;
    return t;
}

/* Moves ops [from, ops.n) to right after op `after` (-1: to the front),
 * keeping their order; they must read nothing defined after `after`. */
static void move_ops_after(Graph *g, int from, int after)
{
    int n = g->ops.n, k = n - from;
    if (k <= 0 || after + 1 >= from)
        return;
    int *order = xmalloc(sizeof(int) * (size_t)n);
    int m = 0;
    for (int i = 0; i <= after; i++)
        order[m++] = i;
    for (int i = from; i < n; i++)
        order[m++] = i;
    for (int i = after + 1; i < from; i++)
        order[m++] = i;
    ir_reorder_ops(g, order, n);
    free(order);
}

/* The gradient of the param with the fewest elements becomes
 * grad * (loss0 + 1) (loss0: loss * 0), everywhere the pass reads it and as
 * the output "grad.P" that the comm pass all-reduces: bit for bit the
 * gradient while the loss is finite, NaN when it is not. The ops from
 * chain0 on (loss0's) and the poisoning go right after the gradient's
 * producer, so the gradient is ready for its all-reduce bucket where it was. */
static void poison_smallest(B *b, ParamGrad *ps, int n, int loss0, int chain0)
{
    Graph *g = b->g;
    int k = 0;
    for (int i = 1; i < n; i++)
        if (shape_numel(&g->t.v[ps[i].p].s) < shape_numel(&g->t.v[ps[k].p].s))
            k = i;
    int gr = ps[k].grad;
    Shape s = g->t.v[gr].s;
    int f = splat(b, bin(b, OP_ADD, loss0, cst_f32(b, 1.0)), &s);
    int pg = bin(b, OP_MUL, gr, f);
    char name[512];
    snprintf(name, sizeof name, "grad.%s", g->t.v[ps[k].p].name);
    for (int o = 0; o < g->outs.n; o++)
        if (strcmp(g->outs.v[o].name, name) == 0)
            g->outs.v[o].t = pg;
    ps[k].grad = pg;
    int after = g->t.v[gr].op, lop = g->t.v[ir_find_output(g, "loss")].op;
    move_ops_after(g, chain0, after > lop ? after : lop);
}

static int cmp_ready(const void *a, const void *b, void *ctx)
{
    const Graph *g = ctx;
    const ParamGrad *x = a, *y = b;
    int rx = g->t.v[x->grad].op, ry = g->t.v[y->grad].op;
    if (rx != ry)
        return rx < ry ? -1 : 1;
    return x->p < y->p ? -1 : x->p > y->p;
}

static int sign_of(B *b, int x);

/* AK_SHARD attributes: bucket -1 (the comm pass places buckets) */
static OpAttr shard_attr(int64_t start, int64_t total, int nranks)
{
    return (OpAttr){.ia = {-1, start, total, nranks}, .nia = 4};
}

static int emit_n(B *b, Opcode c, const int *in, int n, const OpAttr *a)
{
    int t = ir_op_x(b->g, c, in, n, a, b->loc);
    b->g->ops.v[b->g->t.v[t].op].flags |= OPF_OPTIM;
    return t;
}

/* The ZeRO-1 update (pass_optimizer with o->zero): the same AdamW, SGD or
 * Lion on this rank's shard of the flat order (params by gradient
 * readiness). Params below f32 keep an f32 master copy with AdamW only
 * (it needs adam.step to take it at step 0). Returns the step's ok flag
 * (u8[]: 1 when it is applied). */
static int optimizer_zero(B *b, const PassOpts *o, ParamGrad *ps, int n, int lr, int step,
                          int loss0, int zero)
{
    Graph *g = b->g;
    qsort_r(ps, (size_t)n, sizeof *ps, cmp_ready, g);
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += shape_numel(&g->t.v[ps[i].p].s);
    int nr = o->nranks > 1 ? o->nranks : 1;
    int64_t S = ir_shard_size(total, nr);
    Shape ss = shape_make(DT_F32, 1, (int64_t[]){S});
    ParamInit zeros = {.kind = INIT_ZEROS};
    OpAttr sa = shard_attr(0, total, nr);
    int *in = xmalloc(sizeof(int) * (size_t)(n + 1));
    bool any_wd;
    for (int i = 0; i < n; i++)
        in[i] = ps[i].grad;
    /* pipeline stages: the runtime reduce-scatters the stage's summed
     * gradients over its dp group before the step (it needs the shard for
     * the norm summed over the stages, runtime/dist/pp.c), and gives this
     * rank's shard of their mean as the input "pp.grad.shard" f32[S] */
    int gsh = o->pp_sumsq ? ir_add_input(g, TK_INPUT, "pp.grad.shard", ss, (ParamInit){0})
                          : emit_n(b, OP_REDUCE_SCATTER, in, n, &sa);
    for (int i = 0; i < n; i++)
        in[i] = ps[i].p;
    int psh = emit_n(b, OP_SHARD_PACK, in, n, &sa);
    int pwd = -1, lrs = -1;
    /* weight decay: params with wd 0 pack as 0; when every other param
     * has the same wd W (by default o->weight_decay on rank >= 2), P is
     * packed and multiplied by W, else wd * P is packed */
    double W = 0;
    bool one_w = true;
    any_wd = false;
    for (int i = 0; i < n; i++)
        if (ps[i].wd != 0) {
            one_w &= !any_wd || ps[i].wd == W;
            W = ps[i].wd;
            any_wd = true;
        }
    if (any_wd) {
        for (int i = 0; i < n; i++) {
            Shape s = g->t.v[ps[i].p].s;
            in[i] = ps[i].wd == 0 ? cst(b, &s, 0.0)
                    : one_w       ? ps[i].p
                                  : bin(b, OP_MUL, cst(b, &s, ps[i].wd), ps[i].p);
        }
        pwd = emit_n(b, OP_SHARD_PACK, in, n, &sa);
    }
    /* per-param lr scales (param groups): packed as f32 */
    for (int i = 0; i < n; i++)
        if (ps[i].lr_scale != 1)
            lrs = 0;
    if (lrs == 0) {
        for (int i = 0; i < n; i++) {
            Shape s = g->t.v[ps[i].p].s;
            s.dtype = DT_F32;
            in[i] = cst(b, &s, ps[i].lr_scale);
        }
        lrs = emit_n(b, OP_SHARD_PACK, in, n, &sa);
    }
    /* the global norm: each rank's shard squared, summed over ranks; under
     * tensor parallelism each TP rank's flat range holds its parts of the
     * split params and a copy of the whole ones, which count 1/tp each
     * before the sum over the TP group */
    IrShard tp = {0};
    for (int i = 0; i < n; i++)
        if (g->t.v[ps[i].p].shard.on && g->t.v[ps[i].p].shard.n > 1)
            tp = g->t.v[ps[i].p].shard;
    int wsq = -1;
    if (tp.n > 1) {
        for (int i = 0; i < n; i++) {
            Shape s = g->t.v[ps[i].p].s;
            s.dtype = DT_F32;
            bool sp = g->t.v[ps[i].p].shard.on && g->t.v[ps[i].p].shard.n > 1;
            in[i] = cst(b, &s, sp ? 1.0 : 1.0 / tp.n);
        }
        wsq = emit_n(b, OP_SHARD_PACK, in, n, &sa);
    }
    int total2;
    if (o->pp_sumsq) { /* pipeline stages: the runtime's, over every stage (pp.c) */
        total2 = ir_add_input(g, TK_INPUT, "pp.sumsq", (Shape){.dtype = DT_F32},
                              (ParamInit){0});
        tp.n = 1;
    } else {
        int part = sum_sq_blocked(b, gsh, wsq);
        total2 = bin(b, OP_MUL, emit(b, OP_ALLREDUCE, part, -1, NULL), cst_f32(b, (double)nr));
    }
    if (tp.n > 1) {
        OpAttr ta = {.ia = {0, tp.n, tp.rank}, .nia = 3};
        total2 = emit(b, OP_TP_ALLREDUCE, total2, -1, &ta);
    }
    int norm = un(b, OP_SQRT, total2);
    ir_add_output(g, "grad_norm", norm);
    int chk = bin(b, OP_ADD, bin(b, OP_ADD, bin(b, OP_MUL, total2, zero), loss0),
                  bin(b, OP_MUL, lr, zero));
    int ok = bin(b, OP_EQ, chk, zero);
    int gc = gsh;
    if (o->grad_clip > 0) {
        int den = bin(b, OP_ADD, norm, cst_f32(b, 1e-6));
        int q = bin(b, OP_DIV, cst_f32(b, o->grad_clip), den);
        gc = bin(b, OP_MUL, gsh, splat(b, bin(b, OP_MIN, cst_f32(b, 1.0), q), &ss));
    }
    /* the update direction u on the shard, and the moments: AdamW,
     * SGD's momentum buffer, Lion's momentum (update_param's rules on the
     * flat shard; the state f32[S] "adam.m", "adam.v", "sgd.buf", "lion.m",
     * which runtime/dist/zero.c shows whole in checkpoints) */
    int t = -1, u = -1, m = -1, v = -1, m1 = -1, v1 = -1;
    int wdp = pwd < 0 ? -1 : one_w ? bin(b, OP_MUL, cst(b, &ss, W), pwd) : pwd;
    switch (o->optimizer) {
    case PASS_OPT_ADAMW:
    default: {
        t = bin(b, OP_ADD, step, cst_f32(b, 1.0));
        int bc1 = bin(b, OP_SUB, cst_f32(b, 1.0), bin(b, OP_POW, cst_f32(b, o->beta1), t));
        int bc2 = bin(b, OP_SUB, cst_f32(b, 1.0), bin(b, OP_POW, cst_f32(b, o->beta2), t));
        m = ir_add_input(g, TK_STATE, "adam.m", ss, zeros);
        v = ir_add_input(g, TK_STATE, "adam.v", ss, zeros);
        m1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &ss, o->beta1), m),
                 bin(b, OP_MUL, cst(b, &ss, 1.0 - o->beta1), gc));
        v1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &ss, o->beta2), v),
                 bin(b, OP_MUL, cst(b, &ss, 1.0 - o->beta2), bin(b, OP_MUL, gc, gc)));
        int mhat = bin(b, OP_DIV, m1, splat(b, bc1, &ss));
        int vhat = bin(b, OP_DIV, v1, splat(b, bc2, &ss));
        int den = bin(b, OP_ADD, un(b, OP_SQRT, vhat), cst(b, &ss, o->eps));
        u = bin(b, OP_DIV, mhat, den);
        if (wdp >= 0)
            u = bin(b, OP_ADD, u, wdp);
        break;
    }
    case PASS_OPT_SGD:
        u = wdp >= 0 ? bin(b, OP_ADD, gc, wdp) : gc;
        if (o->momentum > 0) {
            m = ir_add_input(g, TK_STATE, "sgd.buf", ss, zeros);
            m1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &ss, o->momentum), m), u);
            u = o->nesterov ? bin(b, OP_ADD, u, bin(b, OP_MUL, cst(b, &ss, o->momentum), m1))
                            : m1;
        }
        break;
    case PASS_OPT_LION: {
        m = ir_add_input(g, TK_STATE, "lion.m", ss, zeros);
        int cm = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &ss, o->lion_beta1), m),
                     bin(b, OP_MUL, cst(b, &ss, 1.0 - o->lion_beta1), gc));
        u = sign_of(b, cm);
        if (wdp >= 0)
            u = bin(b, OP_ADD, u, wdp);
        m1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &ss, o->lion_beta2), m),
                 bin(b, OP_MUL, cst(b, &ss, 1.0 - o->lion_beta2), gc));
        break;
    }
    }
    if (lrs >= 0)
        u = bin(b, OP_MUL, u, lrs);
    /* params below f32 (bf16, f16): the update runs on an f32 master copy
     * of the shard, state "adam.master", taken from the params at step 0
     * (the packed params are then exact) and kept from then on; the
     * gathers round it to each param's type */
    int base = psh, master = -1;
    for (int i = 0; i < n && master < 0 && step >= 0; i++)
        if (g->t.v[ps[i].p].s.dtype != DT_F32)
            master = ir_add_input(g, TK_STATE, "adam.master", ss, zeros);
    if (master >= 0) {
        int first = bin(b, OP_EQ, step, cst_f32(b, 0.0));
        OpAttr ba = {0};
        ir_attr_set_shape(&ba, &ss);
        int in3[3] = {emit(b, OP_BROADCAST, first, -1, &ba), psh, master};
        base = emit_n(b, OP_SELECT, in3, 3, NULL);
    }
    int p1 = bin(b, OP_SUB, base, bin(b, OP_MUL, splat(b, lr, &ss), u));
    int newsh = keep_unless(b, ok, p1, base);
    if (master >= 0)
        ir_add_update(g, master, newsh);
    if (m >= 0)
        ir_add_update(g, m, keep_unless(b, ok, m1, m));
    if (v >= 0)
        ir_add_update(g, v, keep_unless(b, ok, v1, v));
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        OpAttr ga = shard_attr(at, total, nr);
        int p = ps[i].p;
        int np = emit_n(b, OP_ALL_GATHER, (int[]){newsh, p}, 2, &ga);
        ir_add_update(g, p, np);
        at += shape_numel(&g->t.v[p].s);
    }
    if (step >= 0)
        ir_add_update(g, step, keep_unless(b, ok, t, step));
    free(in);
    return ok;
}

/* The script's own state updates (assign: BatchNorm's running statistics),
 * upd[0..n), kept like the params' where the step is not applied. */
static void keep_script_state(B *b, int ok, int n)
{
    for (int k = 0; k < n; k++) {
        GraphUpdate *u = &b->g->upd.v[k];
        u->value = keep_unless(b, ok, u->value, u->target);
    }
}

/* Output indices by name, then index. ctx: the Graph. */
static int cmp_out_name(const void *a, const void *b, void *ctx)
{
    const Graph *g = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    int c = strcmp(g->outs.v[x].name, g->outs.v[y].name);
    return c ? c : (x > y) - (x < y);
}

/* ir_find_output(g, name) over byname, the outputs sorted by cmp_out_name:
 * the tensor of the first output called name, or -1. */
static int find_output(const Graph *g, const int *byname, const char *name)
{
    int lo = 0, hi = g->outs.n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(g->outs.v[byname[mid]].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g->outs.n && strcmp(g->outs.v[byname[lo]].name, name) == 0
               ? g->outs.v[byname[lo]].t
               : -1;
}

/* o's settings for the param called name, or NULL */
static const PassParamOpt *param_opt(const PassOpts *o, const char *name)
{
    for (int i = 0; i < o->nparam_opts; i++)
        if (strcmp(o->param_opts[i].name, name) == 0)
            return &o->param_opts[i];
    return NULL;
}

/* Drops the outputs with drop[k] set (frozen params' "grad.P") and then
 * every backward op (OPF_BACKWARD) that nothing left reads: the ops that
 * computed only those gradients. Forward ops stay (simplify drops what is
 * dead of them). */
static void drop_grads(Graph *g, const bool *drop)
{
    int k = 0;
    for (int i = 0; i < g->outs.n; i++)
        if (!drop[i])
            g->outs.v[k++] = g->outs.v[i];
    g->outs.n = k;
    bool *live = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    bool *dead = xcalloc((size_t)g->ops.n + 1, sizeof(bool));
    for (int i = 0; i < g->outs.n; i++)
        live[g->outs.v[i].t] = true;
    for (int i = 0; i < g->upd.n; i++)
        live[g->upd.v[i].value] = true;
    for (int i = g->ops.n - 1; i >= 0; i--) {
        const Op *op = &g->ops.v[i];
        if ((op->flags & OPF_BACKWARD) && !live[op->out]) {
            dead[i] = true;
            continue;
        }
        for (int j = 0; j < op->nin; j++)
            live[op->in[j]] = true;
    }
    ir_drop_ops(g, dead);
    free(live);
    free(dead);
}

/* Each state "PRE.P" of a param P split over the TP group, of P's shape (its
 * moments), is split as P is: checkpoints gather it whole. */
static void shard_states(Graph *g)
{
    for (int i = 0; i < g->t.n; i++) {
        Tensor *st = &g->t.v[i];
        if (st->kind != TK_STATE || !st->name)
            continue;
        size_t ls = strlen(st->name);
        for (int j = 0; j < g->t.n; j++) {
            const Tensor *p = &g->t.v[j];
            if (p->kind != TK_PARAM || !p->shard.on || !p->shard.n)
                continue;
            size_t lp = strlen(p->name);
            if (ls > lp && st->name[ls - lp - 1] == '.' &&
                strcmp(st->name + ls - lp, p->name) == 0 && shape_dims_eq(&st->s, &p->s)) {
                st->shard = p->shard;
                break;
            }
        }
    }
}

/* A zero-initialised f32-or-param-typed state tensor "PRE.P" of shape s. */
static int state(Graph *g, const char *pre, const char *pname, Shape s)
{
    char name[512];
    snprintf(name, sizeof name, "%s.%s", pre, pname);
    return ir_add_input(g, TK_STATE, name, s, (ParamInit){.kind = INIT_ZEROS});
}

/* x reshaped to dims[0..rank) in x's dtype */
static int reshape_to(B *b, int x, int rank, const int64_t *dims)
{
    Shape s = shape_make(b->g->t.v[x].s.dtype, rank, dims);
    OpAttr a = {0};
    ir_attr_set_shape(&a, &s);
    return emit(b, OP_RESHAPE, x, -1, &a);
}

/* sign(x) in x's dtype: 1, -1, or 0 for 0 (torch.sign) */
static int sign_of(B *b, int x)
{
    Shape s = b->g->t.v[x].s;
    OpAttr a = {.dtype = s.dtype};
    int z = cst(b, &s, 0.0);
    int pos = emit(b, OP_CAST, bin(b, OP_GT, x, z), -1, &a);
    int neg = emit(b, OP_CAST, bin(b, OP_LT, x, z), -1, &a);
    return bin(b, OP_SUB, pos, neg);
}

/* sqrt(sum(x * x) / numel(x)) as an f32 scalar (Adafactor's RMS) */
static int rms_f32(B *b, int x)
{
    double n = (double)shape_numel(&b->g->t.v[x].s);
    int ss = sum_all_f32(b, bin(b, OP_MUL, x, x));
    return un(b, OP_SQRT, bin(b, OP_MUL, ss, cst_f32(b, 1.0 / n)));
}

/* What every param's update reads. */
typedef struct {
    int lr, ok, scale; /* scale: the clipping factor (f32[]), -1 without */
    int t;             /* step + 1 (AdamW, Adafactor) */
    int bc1, bc2;      /* AdamW: bias corrections */
    int b2t, omb2t;    /* Adafactor: 1 - t^-0.8 and 1 - that */
} Shared;

/* Adafactor's documented defaults (Shazeer & Stern 2018; Hugging Face's
 * Adafactor with relative_step=False, scale_parameter=True, beta1=None) */
#define AF_DECAY (-0.8)  /* beta2_t = 1 - t^-0.8 */
#define AF_EPS1 1e-30    /* added to the squared gradient */
#define AF_EPS2 1e-3     /* floor of the param's RMS in the step size */
#define AF_CLIP 1.0      /* update clipping threshold d */

/* The update of param pg (not frozen): its state, and P <- P', each kept
 * when !ok. */
static void update_param(B *b, const PassOpts *o, const Shared *c, const ParamGrad *pg)
{
    Graph *g = b->g;
    int p = pg->p, gr = pg->grad;
    Shape s = g->t.v[p].s;
    const char *pname = g->t.v[p].name;
    int lr = pg->lr_scale == 1 ? c->lr : bin(b, OP_MUL, c->lr, cst_f32(b, pg->lr_scale));
    int gc = c->scale < 0 ? gr : bin(b, OP_MUL, gr, splat(b, c->scale, &s));
    int u = -1, step_size = lr;
    switch (o->optimizer) {
    case PASS_OPT_ADAMW:
    default: {
        int m = state(g, "adam.m", pname, s), v = state(g, "adam.v", pname, s);
        int m1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &s, o->beta1), m),
                     bin(b, OP_MUL, cst(b, &s, 1.0 - o->beta1), gc));
        int v1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &s, o->beta2), v),
                     bin(b, OP_MUL, cst(b, &s, 1.0 - o->beta2), bin(b, OP_MUL, gc, gc)));
        int mhat = bin(b, OP_DIV, m1, splat(b, c->bc1, &s));
        int vhat = bin(b, OP_DIV, v1, splat(b, c->bc2, &s));
        int den = bin(b, OP_ADD, un(b, OP_SQRT, vhat), cst(b, &s, o->eps));
        u = bin(b, OP_DIV, mhat, den);
        if (pg->wd != 0)
            u = bin(b, OP_ADD, u, bin(b, OP_MUL, cst(b, &s, pg->wd), p));
        int p1 = bin(b, OP_SUB, p, bin(b, OP_MUL, splat(b, lr, &s), u));
        ir_add_update(g, p, keep_unless(b, c->ok, p1, p));
        ir_add_update(g, m, keep_unless(b, c->ok, m1, m));
        ir_add_update(g, v, keep_unless(b, c->ok, v1, v));
        return;
    }
    case PASS_OPT_SGD: {
        /* torch.optim.SGD: d = g + wd * P; buf = mu * buf + d; d = buf, or
         * d + mu * buf with Nesterov; P' = P - lr * d */
        u = gc;
        if (pg->wd != 0)
            u = bin(b, OP_ADD, u, bin(b, OP_MUL, cst(b, &s, pg->wd), p));
        if (o->momentum > 0) {
            int buf = state(g, "sgd.buf", pname, s);
            int buf1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &s, o->momentum), buf), u);
            ir_add_update(g, buf, keep_unless(b, c->ok, buf1, buf));
            u = o->nesterov ? bin(b, OP_ADD, u, bin(b, OP_MUL, cst(b, &s, o->momentum), buf1))
                            : buf1;
        }
        break;
    }
    case PASS_OPT_LION: {
        /* Lion: u = sign(b1 * m + (1 - b1) * g) + wd * P; P' = P - lr * u;
         * m' = b2 * m + (1 - b2) * g */
        int m = state(g, "lion.m", pname, s);
        int cm = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &s, o->lion_beta1), m),
                     bin(b, OP_MUL, cst(b, &s, 1.0 - o->lion_beta1), gc));
        u = sign_of(b, cm);
        if (pg->wd != 0)
            u = bin(b, OP_ADD, u, bin(b, OP_MUL, cst(b, &s, pg->wd), p));
        int m1 = bin(b, OP_ADD, bin(b, OP_MUL, cst(b, &s, o->lion_beta2), m),
                     bin(b, OP_MUL, cst(b, &s, 1.0 - o->lion_beta2), gc));
        ir_add_update(g, m, keep_unless(b, c->ok, m1, m));
        break;
    }
    case PASS_OPT_ADAFACTOR: {
        /* Adafactor: second moment factored into row and column means for
         * a rank-2 P [n, k], whole otherwise; the update clipped to RMS
         * <= d; step size max(eps2, RMS(P)) * lr; decay wd * step size */
        int g2 = bin(b, OP_ADD, bin(b, OP_MUL, gc, gc), cst(b, &s, AF_EPS1));
        int vinv; /* 1 / sqrt(V), broadcast to s */
        if (s.rank == 2) {
            int64_t n = s.dim[0], k = s.dim[1];
            Shape rs = shape_make(s.dtype, 1, &n), cs = shape_make(s.dtype, 1, &k);
            int r = state(g, "adafactor.r", pname, rs), cc = state(g, "adafactor.c", pname, cs);
            OpAttr ax1 = {.nia = 1, .ia = {1}}, ax0 = {.nia = 1, .ia = {0}};
            int rmean = bin(b, OP_MUL, reshape_to(b, emit(b, OP_REDUCE_SUM, g2, -1, &ax1), 1, &n),
                            cst(b, &rs, 1.0 / (double)k));
            int cmean = bin(b, OP_MUL, reshape_to(b, emit(b, OP_REDUCE_SUM, g2, -1, &ax0), 1, &k),
                            cst(b, &cs, 1.0 / (double)n));
            int r1 = bin(b, OP_ADD, bin(b, OP_MUL, splat(b, c->b2t, &rs), r),
                         bin(b, OP_MUL, splat(b, c->omb2t, &rs), rmean));
            int c1 = bin(b, OP_ADD, bin(b, OP_MUL, splat(b, c->b2t, &cs), cc),
                         bin(b, OP_MUL, splat(b, c->omb2t, &cs), cmean));
            ir_add_update(g, r, keep_unless(b, c->ok, r1, r));
            ir_add_update(g, cc, keep_unless(b, c->ok, c1, cc));
            /* V = (R / mean(R)) outer C: rsqrt of each factor */
            int rbar = bin(b, OP_MUL, sum_all_f32(b, r1), cst_f32(b, 1.0 / (double)n));
            int rf = un(b, OP_RSQRT, bin(b, OP_DIV, r1, splat(b, rbar, &rs)));
            int cf = un(b, OP_RSQRT, c1);
            OpAttr ba = {0};
            ir_attr_set_shape(&ba, &s);
            int rfb = emit(b, OP_BROADCAST, reshape_to(b, rf, 2, (int64_t[]){n, 1}), -1, &ba);
            int cfb = emit(b, OP_BROADCAST, reshape_to(b, cf, 2, (int64_t[]){1, k}), -1, &ba);
            vinv = bin(b, OP_MUL, rfb, cfb);
        } else {
            int v = state(g, "adafactor.v", pname, s);
            int v1 = bin(b, OP_ADD, bin(b, OP_MUL, splat(b, c->b2t, &s), v),
                         bin(b, OP_MUL, splat(b, c->omb2t, &s), g2));
            ir_add_update(g, v, keep_unless(b, c->ok, v1, v));
            vinv = un(b, OP_RSQRT, v1);
        }
        u = bin(b, OP_MUL, gc, vinv);
        int clip = bin(b, OP_MAX, cst_f32(b, 1.0),
                       bin(b, OP_MUL, rms_f32(b, u), cst_f32(b, 1.0 / AF_CLIP)));
        u = bin(b, OP_DIV, u, splat(b, clip, &s));
        if (pg->wd != 0)
            u = bin(b, OP_ADD, u, bin(b, OP_MUL, cst(b, &s, pg->wd), p));
        step_size = bin(b, OP_MUL, bin(b, OP_MAX, cst_f32(b, AF_EPS2), rms_f32(b, p)), lr);
        break;
    }
    }
    int p1 = bin(b, OP_SUB, p, bin(b, OP_MUL, splat(b, step_size, &s), u));
    ir_add_update(g, p, keep_unless(b, c->ok, p1, p));
}

bool pass_optimizer(Graph *g, const PassOpts *o, Diag *d)
{
    if (ir_find_output(g, "loss") < 0) {
        snprintf(d->msg, sizeof d->msg,
                 "optimizer: the graph has no output \"loss\" (expected the model to set "
                 "one, got outputs without it)");
        return false;
    }
    if (ir_find_tensor(g, "adam.step") >= 0 || ir_find_output(g, "grad_norm") >= 0) {
        snprintf(d->msg, sizeof d->msg,
                 "optimizer: the graph already has optimizer state \"adam.step\" or output "
                 "\"grad_norm\" (expected a graph the optimizer has not run on)");
        return false;
    }
    if (o->zero && o->optimizer == PASS_OPT_ADAFACTOR) {
        snprintf(d->msg, sizeof d->msg,
                 "optimizer: zero = 1 shards the state of adamw, sgd and lion, not adafactor's "
                 "(its second moment is factored per matrix, already small; expected zero = 0 "
                 "with optimizer = \"adafactor\", got zero = 1)");
        return false;
    }
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].shard.on && g->t.v[i].shard.n > 1 && o->optimizer == PASS_OPT_ADAFACTOR) {
            snprintf(d->msg, sizeof d->msg,
                     "optimizer: adafactor's factored moments need whole params, but "
                     "\"%s\" is split over tp = %d ranks (expected optimizer = \"adamw\", "
                     "\"sgd\" or \"lion\" with tp > 1)", g->t.v[i].name, g->t.v[i].shard.n);
            return false;
        }
    VEC(ParamGrad) ps = {0};
    /* the outputs by name: each param's gradient by binary search, not a
     * scan of every output (ir_find_output) per param */
    int *byname = xmalloc(sizeof(int) * (size_t)(g->outs.n + 1));
    for (int k = 0; k < g->outs.n; k++)
        byname[k] = k;
    qsort_r(byname, (size_t)g->outs.n, sizeof(int), cmp_out_name, g);
    bool *drop = xcalloc((size_t)g->outs.n + 1, sizeof(bool));
    int nfrozen = 0;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        const PassParamOpt *po = param_opt(o, t->name);
        char name[512];
        snprintf(name, sizeof name, "grad.%s", t->name);
        int gr = find_output(g, byname, name);
        if (po && po->frozen) {
            /* no gradient: its output goes (all outputs of that name) */
            for (int k = 0; k < g->outs.n; k++)
                drop[k] |= strcmp(g->outs.v[k].name, name) == 0;
            nfrozen++;
            continue;
        }
        if (gr < 0 || !shape_eq(&g->t.v[gr].s, &t->s) || !dtype_is_float(t->s.dtype)) {
            snprintf(d->msg, sizeof d->msg,
                     "optimizer: parameter \"%s\" has no gradient output \"%s\" of its type "
                     "(expected autodiff to have run, got %s)",
                     t->name, name, gr < 0 ? "no such output" : "a different type");
            vec_free(&ps);
            free(byname);
            free(drop);
            return false;
        }
        double wd = t->s.rank >= 2 ? o->weight_decay : 0;
        if (po && !isnan(po->weight_decay))
            wd = po->weight_decay;
        ParamGrad pg = {i, gr, po ? po->lr_scale : 1.0, wd};
        vec_push(&ps, pg);
    }
    free(byname);
    if (ps.n == 0) {
        free(drop);
        if (nfrozen > 0) {
            snprintf(d->msg, sizeof d->msg,
                     "optimizer: every parameter is frozen, so there is nothing to train "
                     "(expected train{frozen} to leave at least one param, got %d frozen)",
                     nfrozen);
            return false;
        }
        /* the script line that made the loss: where the user can fix it */
        SrcLoc at = {NULL, 0};
        for (int i = 0; i < g->outs.n; i++)
            if (strcmp(g->outs.v[i].name, "loss") == 0 && g->t.v[g->outs.v[i].t].op >= 0)
                at = g->ops.v[g->t.v[g->outs.v[i].t].op].loc;
        if (at.file)
            snprintf(d->msg, sizeof d->msg,
                     "%s:%d: the loss depends on no parameter, so there is nothing to train "
                     "(expected at least one param() on the loss's path, got none)",
                     at.file, at.line);
        else
            snprintf(d->msg, sizeof d->msg,
                     "optimizer: the model has no parameters to train (expected at least one "
                     "param, got none)");
        vec_free(&ps);
        return false;
    }
    if (nfrozen > 0) {
        /* the gradient outputs' ids stay valid: drop_grads renumbers no
         * tensor (ir_compact runs at the end) */
        drop_grads(g, drop);
    }
    free(drop);

    B b = {.g = g};
    Shape scalar = {.dtype = DT_F32};
    ParamInit zeros = {.kind = INIT_ZEROS};
    int lr = ir_add_input(g, TK_INPUT, "lr", scalar, (ParamInit){0});
    int step = -1;
    if (o->optimizer == PASS_OPT_ADAMW)
        step = ir_add_input(g, TK_STATE, "adam.step", scalar, zeros);
    else if (o->optimizer == PASS_OPT_ADAFACTOR)
        step = ir_add_input(g, TK_STATE, "adafactor.step", scalar, zeros);
    int loss = ir_find_output(g, "loss"), chain0 = g->ops.n, nscript = g->upd.n;
    if (g->t.v[loss].s.dtype != DT_F32) {
        OpAttr a = {.dtype = DT_F32};
        loss = emit(&b, OP_CAST, loss, -1, &a);
    }
    int zero = cst_f32(&b, 0.0);
    int loss0 = bin(&b, OP_MUL, loss, zero); /* 0, or NaN for a non-finite loss */
    poison_smallest(&b, ps.v, ps.n, loss0, chain0);
    if (o->zero) {
        keep_script_state(&b, optimizer_zero(&b, o, ps.v, ps.n, lr, step, loss0, zero), nscript);
        vec_free(&ps);
        ir_compact(g);
        return true;
    }

    /* global gradient norm, before clipping: under tensor parallelism a
     * whole param counts once and a split one's parts once each (their
     * sums of squares summed over the TP group) */
    int total = -1, split = -1;
    IrShard tp = {0};
    if (o->pp_sumsq)
        total = ir_add_input(g, TK_INPUT, "pp.sumsq", scalar, (ParamInit){0});
    for (int i = 0; i < ps.n && !o->pp_sumsq; i++) {
        int gr = ps.v[i].grad;
        int s = sum_all_f32(&b, bin(&b, OP_MUL, gr, gr));
        const IrShard *sh = &g->t.v[ps.v[i].p].shard;
        if (sh->on && sh->n > 1) {
            tp = *sh;
            split = split < 0 ? s : bin(&b, OP_ADD, split, s);
        } else {
            total = total < 0 ? s : bin(&b, OP_ADD, total, s);
        }
    }
    if (split >= 0) {
        OpAttr ta = {.ia = {0, tp.n, tp.rank}, .nia = 3};
        split = emit(&b, OP_TP_ALLREDUCE, split, -1, &ta);
        total = total < 0 ? split : bin(&b, OP_ADD, total, split);
    }
    int norm = un(&b, OP_SQRT, total);
    ir_add_output(g, "grad_norm", norm);
    int chk = bin(&b, OP_ADD, bin(&b, OP_ADD, bin(&b, OP_MUL, total, zero), loss0),
                  bin(&b, OP_MUL, lr, zero));
    Shared c = {.lr = lr, .ok = bin(&b, OP_EQ, chk, zero), .scale = -1}; /* ok: u8[] */
    if (o->grad_clip > 0) {
        int den = bin(&b, OP_ADD, norm, cst_f32(&b, 1e-6));
        int q = bin(&b, OP_DIV, cst_f32(&b, o->grad_clip), den);
        c.scale = bin(&b, OP_MIN, cst_f32(&b, 1.0), q);
    }

    /* step and its functions */
    if (step >= 0)
        c.t = bin(&b, OP_ADD, step, cst_f32(&b, 1.0));
    if (o->optimizer == PASS_OPT_ADAMW) {
        c.bc1 = bin(&b, OP_SUB, cst_f32(&b, 1.0), bin(&b, OP_POW, cst_f32(&b, o->beta1), c.t));
        c.bc2 = bin(&b, OP_SUB, cst_f32(&b, 1.0), bin(&b, OP_POW, cst_f32(&b, o->beta2), c.t));
    } else if (o->optimizer == PASS_OPT_ADAFACTOR) {
        c.b2t = bin(&b, OP_SUB, cst_f32(&b, 1.0), bin(&b, OP_POW, c.t, cst_f32(&b, AF_DECAY)));
        c.omb2t = bin(&b, OP_SUB, cst_f32(&b, 1.0), c.b2t);
    }
    for (int i = 0; i < ps.n; i++)
        update_param(&b, o, &c, &ps.v[i]);
    if (step >= 0)
        ir_add_update(g, step, keep_unless(&b, c.ok, c.t, step));
    keep_script_state(&b, c.ok, nscript);
    vec_free(&ps);
    shard_states(g);
    ir_compact(g);
    return true;
}
