/*
 * ir.h - kiln's graph IR: tensors, ops, the opcode table, and everything that
 * reads a graph without changing its meaning (verifier, printer, parser, cost
 * counts, reference interpreter). The public header of the ir/ layer, the
 * bottom one: every other layer includes it, so it also holds what they all
 * share (Diag; util.c: allocation, byte sizes read and printed, the clock,
 * the median) and includes nothing of theirs.
 *
 * A Graph is SSA: every tensor is defined once, either as a graph input
 * (kind input/param/state: no producing op) or as the single output of one op.
 * g->ops is program order. Elementwise ops take operands of identical shape:
 * broadcasting is an explicit `broadcast` op, inserted by the frontend, so
 * every later layer sees one rule per op.
 *
 * Text form (ir_print writes it, ir_parse reads it back to the same graph):
 *
 *   kiln-ir v2
 *   sym B=4 T=8 C=32
 *   %0:f32[V,C] = param "wte" normal(0.02)
 *   %1:i32[B,T] = input "tokens"
 *   %2:f32[V,C] = state "adam.m.wte" zeros
 *   %3:f32[B,T,C] = gather %0, %1   # models/gpt.lua:28
 *   %4:f32[] = const {value=0.5}   # models/gpt.lua:30
 *   %5:f32[B,T,1] = reduce_sum %3 {axes=[2]}
 *   %6:f32[B,T,C] = broadcast %5
 *   %7:f32[4,8] = matmul %5, %6 {ta=0,tb=1}
 *   output "loss" %50
 *   update %0 <- %120
 *   end
 *
 * (v2 text ends with `end`, so a cut file is an error; v1 text, without it,
 * still parses.)
 * Dim names: a dim prints as a symbol's name only where it came from that
 * name (Shape.dname): written so in the text or the script, or carried
 * through ops by ir_infer (dimnames.c: the axis an op passes through keeps
 * its name); any other dim prints as its number, even when a symbol has
 * that value. Two symbols may share a value. Attributes print in braces in a fixed order per
 * attribute kind (see IrAttrKind). Recompute and group marks print as
 * trailing attributes (see Op.flags).
 */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define IR_MAX_RANK 8

/* ---- diagnostics -----------------------------------------------------------
 * A user-level error, filled by whichever layer found it (a pass, codegen,
 * the runtime) and printed once by whoever called it: "what is wrong
 * (expected ..., got ...)", with a file:line in front where there is one. */
typedef struct {
    char msg[2048];
} Diag;

/* ---- util.c: allocation, dying, strings, hashing, sizes, numbers ------- */

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Internal invariant failure: prints "kiln: internal error: ..." and aborts.
 * Never for user mistakes. */
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Interned string: equal contents give the same pointer; lives forever. */
const char *intern(const char *s);
uint64_t hash_bytes(const void *p, size_t n, uint64_t seed); /* FNV-1a 64 */
/* Checked int64 arithmetic: *r = a * b (a + b); false on overflow (*r is
 * then unspecified). Every product of dims, byte count and FLOP count that a
 * user's shape can make large goes through these. */
bool ir_mul_ok(int64_t a, int64_t b, int64_t *r);
bool ir_add_ok(int64_t a, int64_t b, int64_t *r);
/* a + b and a * b for a, b >= 0, saturating at INT64_MAX. */
int64_t ir_add_sat(int64_t a, int64_t b);
int64_t ir_mul_sat(int64_t a, int64_t b);
/* "512MiB", "2GiB", "1.5GB", "1000000" -> bytes; -1 if malformed (or
 * negative, or past 9.2e18). Suffixes K/M/G/T (powers of 1000, optional B)
 * and KiB/MiB/GiB/TiB (powers of 1024); spaces may come between number and
 * suffix. Every size a user gives (--memory-budget, train{memory_budget},
 * KILN_CACHE_MAX, KILN_LUA_MEMORY) is read by this one parser. */
int64_t ir_parse_bytes(const char *s);
/* A byte count for people, into buf (returned): "512 B" below 1 KiB, else
 * the largest binary unit (KiB ... EiB) that keeps the number >= 1, with
 * `decimals` digits after the point ("1.50 MiB" for 2); decimals < 0: none
 * for a whole number, else one ("8 MiB", "1.5 GiB"). */
const char *ir_fmt_bytes(double bytes, int decimals, char *buf, size_t n);
/* A duration for people, into buf (returned): "1.234 s", "12.35 ms",
 * "4.2 us" (the largest unit that keeps the number >= 1, us below 1 ms).
 * A negative one (a difference) takes the unit of its magnitude:
 * "-12.35 ms". */
const char *ir_fmt_seconds(double s, char *buf, size_t n);
/* As ir_fmt_seconds, with ms_decimals digits after the point in ms
 * (ir_fmt_seconds: 2): "12.345 ms" for 3. */
const char *ir_fmt_seconds_ms(double s, int ms_decimals, char *buf, size_t n);
/* The median of v[0..n-1] (the mean of the middle two for even n); 0 when
 * n is 0. v is left as it was. */
double ir_median(const double *v, int64_t n);
/* Seconds on the CLOCK_MONOTONIC clock: every duration kiln measures, and
 * the time base of its trace and communication events. Inline so that the
 * CUDA module, which links nothing of kilncore, reads the same clock. */
static inline double ir_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Growable array of T: `VEC(int) xs = {0}; vec_push(&xs, 3); xs.v[0]` */
#define VEC(T) struct { T *v; int n, cap; }
#define vec_push(a, x)                                                     \
    do {                                                                   \
        if ((a)->n == (a)->cap) {                                          \
            (a)->cap = (a)->cap ? 2 * (a)->cap : 8;                        \
            (a)->v = xrealloc((a)->v, (size_t)(a)->cap * sizeof *(a)->v);  \
        }                                                                  \
        (a)->v[(a)->n++] = (x);                                            \
    } while (0)
#define vec_free(a) (free((a)->v), (a)->v = NULL, (a)->n = (a)->cap = 0)

/* ---- dtypes -------------------------------------------------------------- */

typedef enum { DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64, DT_U8, DT__COUNT } DType;

const char *dtype_name(DType t);       /* "f32", "bf16", ... */
int dtype_size(DType t);               /* bytes per element */
bool dtype_is_float(DType t);
int dtype_parse(const char *s);        /* -1 if unknown */

/* ---- opcode table --------------------------------------------------------
 * X(ENUM, "text", arity, class, attr kind, flops per output element)
 * arity -1 means variadic (>= 1). Op classes drive the passes. */

typedef enum {
    OC_ELEMWISE,   /* one output element from the same-index input elements */
    OC_REDUCE,     /* reduce over axes (kept as size-1 dims) */
    OC_GEMM,       /* batched matrix product */
    OC_MOVE,       /* data movement: reshape, permute, slice, broadcast, ... */
    OC_COLLECTIVE, /* all-reduce: never recomputed */
    OC_RANDOM,     /* random numbers: never recomputed */
    OC_ATTN,       /* fused scaled-dot-product attention: one kernel of its own */
    OC__COUNT
} OpClass;

typedef enum {
    AK_NONE,
    AK_VALUE, /* const: f = value; result shape in attr.shape */
    AK_AXIS,  /* iota, concat: ia[0] = axis (iota: result shape in attr.shape) */
    AK_AXES,  /* reduce: ia[0..nia) = reduced axes, ascending */
    AK_PERM,  /* permute: ia[0..rank) = perm; out dim i = in dim perm[i] */
    AK_START, /* slice: ia = start per axis, attr.shape = lengths;
                 pad: ia = low padding per axis, attr.shape = result shape */
    AK_GEMM,  /* matmul: ia[0] = transpose A, ia[1] = transpose B */
    AK_KEY,   /* random: ia[0] = key (distinct per random op); attr.shape */
    AK_SHAPE, /* reshape, broadcast, scatter_add: result shape in attr.shape */
    AK_BUCKET, /* allreduce_start/_wait: ia[0] = bucket id (comm pass) */
    AK_ATTN,   /* attention*: ia[0] = causal (0 or 1), f = scale; nia = 1: the
                  plain layout; nia = 6: the head layout, ia[1] = heads H,
                  ia[2] = head size D, ia[3..5] = q, k, v column offsets
                  (IrAttnLayout); nia = 8: a variant (ir_attn_window,
                  ir_attn_alibi, ir_attn_kvh), ia[1..5] as for 6 or all 0
                  (plain), ia[6] = window, ia[7] = alibi + 2 * ir_attn_bias's
                  kind + 8 * kv heads (with a bias kind the op has one
                  more operand, the bias or mask) */
    AK_CONV,   /* im2col, col2im: S = nia / 4 spatial dims (1 or 2); ia[0..S)
                  kernel, ia[S..2S) stride, ia[2S..3S) padding, ia[3S..4S)
                  dilation (IrConv); col2im: result shape in attr.shape */
    AK_SHARD,  /* sharded optimizer ops: ia[0] = bucket (-1 before the comm pass
                  places them), ia[1] = start (flat index of the first operand's
                  first element), ia[2] = total (flat elements of all params),
                  ia[3] = nranks; see ir_shard_range */
    AK_TP,     /* tensor-parallel collectives: ia[0] = axis, ia[1] = n (the TP
                  group's size), ia[2] = this rank's index in it; tp_all_gather
                  may have nia 4, ia[3] = sum (1: its VJP reduce-scatters) */
    AK__COUNT
} IrAttrKind;

/* clang-format off */
#define IR_OPCODES(X)                                                    \
    X(CONST,       "const",       0, OC_ELEMWISE,   AK_VALUE, 0)         \
    X(IOTA,        "iota",        0, OC_ELEMWISE,   AK_AXIS,  0)         \
    X(NEG,         "neg",         1, OC_ELEMWISE,   AK_NONE,  1)         \
    X(EXP,         "exp",         1, OC_ELEMWISE,   AK_NONE,  4)         \
    X(LOG,         "log",         1, OC_ELEMWISE,   AK_NONE,  4)         \
    X(SIN,         "sin",         1, OC_ELEMWISE,   AK_NONE,  4)         \
    X(COS,         "cos",         1, OC_ELEMWISE,   AK_NONE,  4)         \
    X(TANH,        "tanh",        1, OC_ELEMWISE,   AK_NONE,  4)         \
    X(SQRT,        "sqrt",        1, OC_ELEMWISE,   AK_NONE,  1)         \
    X(RSQRT,       "rsqrt",       1, OC_ELEMWISE,   AK_NONE,  2)         \
    X(SIGMOID,     "sigmoid",     1, OC_ELEMWISE,   AK_NONE,  4)         \
    X(RELU,        "relu",        1, OC_ELEMWISE,   AK_NONE,  1)         \
    X(ABS,         "abs",         1, OC_ELEMWISE,   AK_NONE,  1)         \
    X(ERF,         "erf",         1, OC_ELEMWISE,   AK_NONE,  8)         \
    X(FLOOR,       "floor",       1, OC_ELEMWISE,   AK_NONE,  1)         \
    X(CAST,        "cast",        1, OC_ELEMWISE,   AK_NONE,  0)         \
    X(STOP_GRADIENT, "stop_gradient", 1, OC_ELEMWISE, AK_NONE, 0)         \
    X(ADD,         "add",         2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(SUB,         "sub",         2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(MUL,         "mul",         2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(DIV,         "div",         2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(POW,         "pow",         2, OC_ELEMWISE,   AK_NONE,  8)         \
    X(MAX,         "max",         2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(MIN,         "min",         2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(LT,          "lt",          2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(LE,          "le",          2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(GT,          "gt",          2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(GE,          "ge",          2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(EQ,          "eq",          2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(NE,          "ne",          2, OC_ELEMWISE,   AK_NONE,  1)         \
    X(SELECT,      "select",      3, OC_ELEMWISE,   AK_NONE,  1)         \
    X(BROADCAST,   "broadcast",   1, OC_MOVE,       AK_SHAPE, 0)         \
    X(RESHAPE,     "reshape",     1, OC_MOVE,       AK_SHAPE, 0)         \
    X(PERMUTE,     "permute",     1, OC_MOVE,       AK_PERM,  0)         \
    X(SLICE,       "slice",       1, OC_MOVE,       AK_START, 0)         \
    X(PAD,         "pad",         1, OC_MOVE,       AK_START, 0)         \
    X(CONCAT,      "concat",     -1, OC_MOVE,       AK_AXIS,  0)         \
    X(GATHER,      "gather",      2, OC_MOVE,       AK_NONE,  0)         \
    X(SCATTER_ADD, "scatter_add", 2, OC_MOVE,       AK_SHAPE, 1)         \
    X(TAKE_ALONG,  "take_along",  2, OC_MOVE,       AK_NONE,  0)         \
    X(IM2COL,      "im2col",      1, OC_MOVE,       AK_CONV,  0)         \
    X(COL2IM,      "col2im",      1, OC_MOVE,       AK_CONV,  1)         \
    X(REDUCE_SUM,  "reduce_sum",  1, OC_REDUCE,     AK_AXES,  1)         \
    X(REDUCE_MAX,  "reduce_max",  1, OC_REDUCE,     AK_AXES,  1)         \
    X(REDUCE_LOGSUMEXP, "reduce_logsumexp", 1, OC_REDUCE, AK_AXES, 6)     \
    X(MATMUL,      "matmul",      2, OC_GEMM,       AK_GEMM,  0)         \
    X(RANDOM,      "random",      0, OC_RANDOM,     AK_KEY,   4)         \
    X(ALLREDUCE,   "allreduce",   1, OC_COLLECTIVE, AK_NONE,  1)         \
    X(ALLREDUCE_START, "allreduce_start", -1, OC_COLLECTIVE, AK_BUCKET, 0) \
    X(ALLREDUCE_WAIT,  "allreduce_wait",   2, OC_COLLECTIVE, AK_BUCKET, 0) \
    X(SHARD_PACK,  "shard_pack",  -1, OC_COLLECTIVE, AK_SHARD, 0)        \
    X(REDUCE_SCATTER, "reduce_scatter", -1, OC_COLLECTIVE, AK_SHARD, 0)  \
    X(REDUCE_SCATTER_START, "reduce_scatter_start", -1, OC_COLLECTIVE, AK_SHARD, 0) \
    X(REDUCE_SCATTER_WAIT,  "reduce_scatter_wait",  -1, OC_COLLECTIVE, AK_SHARD, 0) \
    X(ALL_GATHER,  "all_gather",   2, OC_COLLECTIVE, AK_SHARD, 0)        \
    X(ALL_GATHER_START, "all_gather_start", -1, OC_COLLECTIVE, AK_SHARD, 0) \
    X(ALL_GATHER_WAIT,  "all_gather_wait",   3, OC_COLLECTIVE, AK_SHARD, 0) \
    X(TP_ALLREDUCE, "tp_allreduce", 1, OC_COLLECTIVE, AK_TP, 1)         \
    X(TP_COPY,     "tp_copy",     1, OC_COLLECTIVE, AK_TP,   0)         \
    X(TP_ALL_GATHER, "tp_all_gather", 1, OC_COLLECTIVE, AK_TP, 0)        \
    X(TP_REDUCE_SCATTER, "tp_reduce_scatter", 1, OC_COLLECTIVE, AK_TP, 1) \
    X(ATTENTION,     "attention",     -1, OC_ATTN,  AK_ATTN,  0)         \
    X(ATTENTION_LSE, "attention_lse", -1, OC_ATTN,  AK_ATTN,  0)         \
    X(ATTENTION_DQ,  "attention_dq",  -1, OC_ATTN,  AK_ATTN,  0)         \
    X(ATTENTION_DK,  "attention_dk",  -1, OC_ATTN,  AK_ATTN,  0)         \
    X(ATTENTION_DV,  "attention_dv",  -1, OC_ATTN,  AK_ATTN,  0)         \
    X(ATTENTION_DQKV, "attention_dqkv", -1, OC_ATTN, AK_ATTN,  0)
/* clang-format on */

typedef enum {
#define X(e, s, n, c, a, f) OP_##e,
    IR_OPCODES(X)
#undef X
    OP__COUNT
} Opcode;

typedef struct {
    const char *name;
    int arity;          /* -1: variadic */
    OpClass cls;
    IrAttrKind attr;
    int flops_per_elem; /* elementwise/reduce/random: FLOPs per output (reduce: per input) element */
} OpInfo;

extern const OpInfo ir_opinfo[OP__COUNT];
int ir_opcode_parse(const char *name); /* -1 if unknown */
const char *ir_class_name(OpClass c);

/* Semantics of each opcode (the interpreter is the normative definition):
 * const      result filled with attr.f, dtype attr.dtype, shape attr.shape
 * iota       result[i...] = index along attr axis ia[0], dtype attr.dtype
 * unary      same shape & dtype; relu(x)=max(x,0); rsqrt=1/sqrt; erf the
 *            error function; floor rounds toward -inf (identity on integers)
 * cast       result dtype attr.dtype
 * binary     same shape & dtype; pow(a,b)=a^b; max/min elementwise
 * compare    lt..ne: same shape & dtype in, u8 out (1 or 0)
 * select     select(mask:u8, a, b) = mask ? a : b, a and b same shape/dtype
 * broadcast  numpy rule: input dims aligned to the right of attr.shape;
 *            each input dim equals the result dim or is 1
 * reshape    same element count, row-major
 * permute    result dim i = input dim ia[i]
 * slice      result[i] = in[i + start]; lengths attr.shape
 * pad        result[i + lo] = in[i], zero elsewhere; result shape attr.shape
 * concat     along axis ia[0]; other dims equal
 * gather     gather(table[V, R...], idx[I...] int) -> [I..., R...]; an index
 *            outside [0, V) gives a row of zeros
 * scatter_add scatter_add(idx[I...] int, src[I..., R...]) -> [V, R...] (attr.shape)
 *            result[idx[i]] += src[i]; out-of-range indices are dropped
 * take_along take_along(x[..., V] float, idx[...] int) -> [...] (x's dtype):
 *            result[i] = x[i, idx[i]]; an index outside [0, V) gives 0. Reads
 *            one element per row (cross-entropy's target logit).
 * im2col     im2col(x[N, C, D1..DS] float) {kernel=k, stride=s, pad=p,
 *            dilation=d} -> [N, O1..OS, C*k1*..*kS], S = 1 or 2 spatial dims,
 *            Oi = (Di + 2 pi - di (ki - 1) - 1) / si + 1 >= 1: the patches of
 *            a convolution, one row per output position. The last axis is
 *            row-major over [C, k1..kS]: result[n, o.., (c, j..)] = x[n, c,
 *            o1 s1 - p1 + j1 d1, ..] (0 where that falls outside x). A
 *            convolution is this times a weight [Cout, C*k1*..*kS]^T (GEMM).
 * col2im     col2im(cols[N, O1..OS, C*k1*..*kS]) {as im2col} -> [N, C, D1..DS]
 *            (attr.shape): im2col's adjoint, the sum of every column element
 *            at the x element im2col read it from (im2col's gradient).
 * reduce_*   over axes ia[0..nia); reduced dims kept as 1
 * reduce_logsumexp  log(sum(exp(x))) over the axes, float only: m + log(sum
 *            exp(x - m)) with m the max (-inf when every element is -inf;
 *            +inf when one is +inf; NaN when one is NaN)
 * matmul     A[..., M, K] (or [..., K, M] if ta) x B[..., K, N] (or [..., N, K] if tb)
 *            -> [..., M, N]; batch dims of A and B equal, or B has rank 2
 *            (shared across A's batch)
 * random     uniform in [0, 1), f32, shape attr.shape; value at flat index i is
 *            ir_rand_u01(seed, key, step, i) (seed and step given at run time)
 * allreduce  mean over ranks (identity on one rank)
 * allreduce_start(g1, ..., gk) {bucket}  -> u8[] token (value 0): starts the
 *            mean over ranks of the bucket's gradients on the communication
 *            stream, in place in their buffers (placed by the comm pass)
 * allreduce_wait(token, gi) {bucket}  -> gi's type: the mean over ranks of gi
 *            (identity on one rank); waits for the bucket; a view of gi
 * Sharded optimizer state (ZeRO-1; the optimizer pass with PassOpts.zero,
 * placed by the comm pass). All params' elements, each param row-major, in
 * one flat order of `total` elements; rank r of `nranks` owns the
 * contiguous range [off_r, off_r + len_r) (ir_shard_range), held in shard
 * tensors f32[S], S = ir_shard_size(total, nranks), whose elements past
 * len_r are padding. {bucket=b,start=s,total=T,nranks=n} on each op; the
 * flat range of operands x1..xk is [s, s + sum numel(xi)) (their
 * concatenation, in operand order). Data operands may be any float type:
 * shards hold their elements as f32, and all_gather rounds them back to
 * p's type (the f32 master copy of bf16 params). The interpreter is rank 0
 * and the only rank: "mean over ranks" is the rank's own value, and parts of other
 * ranks are left as they are; with n = 1 the shard is the whole range.
 * shard_pack(x1..xk)             -> f32[S]: the rank's part of the flat
 *            range holds the xi's elements, every other element is 0
 * reduce_scatter(g1..gk)         -> f32[S]: the same with the mean over
 *            ranks of the gi
 * reduce_scatter_start(acc f32[S], g1..gk) -> u8[] token (value 0): starts
 *            that reduction on the communication stream, writing the rank's
 *            part into acc's buffer
 * reduce_scatter_wait(token, acc, g1..gk) -> f32[S]: acc with the rank's
 *            part of the range replaced by the mean over ranks of the gi;
 *            waits for the bucket; a view of acc (in place), so buckets
 *            chain through one shard buffer
 * all_gather(shard f32[S], p)    -> p's type: p with every rank's part of
 *            p's flat range [s, s + numel(p)) replaced by that rank's shard
 *            values (rank r's element f is its shard[f - off_r])
 * all_gather_start(shard, p1..pk) -> u8[] token: starts that gather for
 *            the params p1..pk (contiguous from s), writing into their
 *            buffers; nothing may read them after it but their waits
 * all_gather_wait(token, shard, p) {start = p's own} -> all_gather's value;
 *            waits for the bucket; a view of p (in place)
 * Tensor-parallel collectives {axis=a, n=N, rank=r} over the N ranks of
 *            a TP group, r this rank's index (passes/partition.c inserts
 *            them; the graph is rank r's). Every rank of the group runs
 *            the same op at the same point of its program. Float only.
 * tp_allreduce(x)      -> x's type: the sum over the group of each rank's x
 *            (a partial sum made whole); its VJP is the identity
 * tp_copy(x)           -> x: the identity, at the point where a tensor held
 *            whole on every rank enters computation that is split over the
 *            group; its VJP is tp_allreduce (Megatron's f)
 * tp_all_gather(x)     -> x with dim a times N: rank k's x at [k*d, (k+1)*d)
 *            along a; its VJP is rank r's slice of the cotangent, or with
 *            {..., sum=1} (a gathered value read only by split computation,
 *            so that each rank's cotangent is a part of the whole) the
 *            cotangent's tp_reduce_scatter (Megatron's sequence-parallel
 *            pair)
 * tp_reduce_scatter(x) -> x with dim a / N: rank r's part of the sum over
 *            the group; its VJP is tp_all_gather
 *            The interpreter is rank r and the only rank: tp_allreduce and
 *            tp_copy are the identity, tp_all_gather puts x at rank r's
 *            place with zeros elsewhere, tp_reduce_scatter slices r's part.
 * attention family {causal=c, scale=s}: fused scaled-dot-product attention.
 *            q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv], one float dtype,
 *            equal batch dims ("..."), except that k's and v's axis before
 *            Tk may divide q's (grouped-query attention: query head h
 *            reads key/value head h / (Hq / Hkv)); causal needs Tq == Tk.
 *            Row i of the scores S = s * q k^T (+ slope_h * (j - i) with
 *            {alibi=1}, slope_h = ir_alibi_slope(heads, h), h the index
 *            along q's axis before Tq) keeps column j when !c or j <= i,
 *            and with {window=w} (causal only) i - j < w; P = softmax over
 *            the kept columns of S (f32 arithmetic).
 *            {bias=1}: one more operand (the last), a float tensor B
 *            broadcastable to the scores [..., Tq, Tk] (ir_attn_bias_fits)
 *            added to S; {mask=1}: a u8 tensor M of such a shape, column j
 *            of row i kept only where M_ij != 0. A row that keeps no
 *            column gives o = 0 and gradients 0 (lse -inf). Every op of
 *            the family takes it (attention(q, k, v, B), attention_lse(q,
 *            k, B), attention_dq(q, k, v, dO, lse, delta, B), ...); no
 *            gradient flows to it.
 * attention(q, k, v) -> [..., Tq, Dv] (q's dtype): P v
 * attention_lse(q, k) -> f32 [..., Tq, 1]: log sum_j exp(S_ij) over kept j
 * attention_dq/dk/dv(q, k, v, dO, lse, delta) -> the gradients of q, k and v
 *            (their shapes and dtype) of attention(q, k, v) given dO [..., Tq,
 *            Dv] (q's dtype), lse = attention_lse(q, k) and delta = f32
 *            [..., Tq, 1] = sum over the last axis of dO * attention(q, k, v)
 *            (in f32): with P_ij = exp(S_ij - lse_i) on kept j (else 0),
 *            dV = P^T dO, dS = P * (dO v^T - delta), dQ = s dS k, dK = s dS^T q.
 *            attention_dv reads neither v nor delta.
 * The head layout {..., heads=H, hd=D, qoff=a, koff=b, voff=c} (attr.nia 6)
 *            reads the same function from [B, T, H*D]-ordered tensors, as
 *            a [B, T, 3C] qkv projection lays them out: q [B, Tq, Wq], k
 *            [B, Tk, Wk], v [B, Tk, Wv] (rank 3, any widths W >= offset +
 *            H*D), head h of q at q[b, i, a + h*D + d] (k at b, v at c), Dv
 *            = D. o, dO, dq, dk, dv are [B, T, H*D] (element (b, h, i, d)
 *            at [b, i, h*D + d]); lse and delta f32 [B, Tq, H, 1]. With
 *            {kvh=K} (K divides H) k and v hold K heads (k [B, Tk, Wk]
 *            with koff + K*D <= Wk), dk and dv are [B, Tk, K*D].
 * attention_dqkv(q, k, v, dO, lse, delta) {head layout only} -> q's type
 *            [B, T, W]: dq, dk and dv side by side, as one [B, T, 3C] qkv
 *            tensor's gradient: columns qoff + h*D + d hold dq (b, h, i, d),
 *            koff + ... dk, voff + ... dv. q, k and v have one type [B, T,
 *            W] with W = 3*H*D, and the three column ranges [off, off + H*D)
 *            partition [0, W), so every element is defined. The attndqkv
 *            pass makes it from concat(dq, dk, dv); it runs as the dq and
 *            the dk/dv kernels, both writing its one buffer.
 */


/* The shard geometry of AK_SHARD ops: the flat range of `total` elements
 * is cut at multiples of IR_SHARD_ALIGN elements (64 bytes of f32) into
 * nranks contiguous shards whose lengths differ by at most one alignment
 * unit (the last one may be shorter by the tail). ir_shard_size is the
 * longest, the length of every shard tensor. */
#define IR_SHARD_ALIGN 16
int64_t ir_shard_size(int64_t total, int64_t nranks);
/* inline: the CUDA module (which does not link kilncore) cuts the same
 * shards */
static inline void ir_shard_range(int64_t total, int64_t nranks, int64_t rank, int64_t *off,
                                  int64_t *len)
{
    int64_t units = (total + IR_SHARD_ALIGN - 1) / IR_SHARD_ALIGN;
    int64_t a = rank * units / nranks * IR_SHARD_ALIGN;
    int64_t b = (rank + 1) * units / nranks * IR_SHARD_ALIGN;
    *off = a < total ? a : total;
    *len = (b < total ? b : total) - *off;
}

/* Counter-based uniform random numbers: the same function is emitted into
 * generated C and CUDA C so every backend draws the same numbers. */
static inline uint64_t ir_rand_mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float ir_rand_u01(uint64_t seed, uint64_t key, uint64_t step, uint64_t i)
{
    uint64_t h = ir_rand_mix(seed ^ ir_rand_mix(key ^ ir_rand_mix(step ^ ir_rand_mix(i))));
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

/* ---- tensors, ops, graphs ------------------------------------------------ */

typedef enum { TK_TEMP, TK_INPUT, TK_PARAM, TK_STATE, TK_CONST } TensorKind;
const char *ir_kind_name(TensorKind k); /* "temp", "input", "param", "state", "const" */

typedef enum { INIT_NONE, INIT_ZEROS, INIT_ONES, INIT_NORMAL, INIT_UNIFORM } InitKind;
typedef struct {
    InitKind kind;
    double a, b; /* normal: std = a; uniform: [a, b) */
} ParamInit;

typedef struct {
    const char *file; /* interned; NULL when unknown */
    int line;
} SrcLoc;

/* A type: dtype plus static dims; rank 0 is a scalar. dname[i] is the
 * declared symbol (interned) that dim i came from, or NULL: a dim carries a
 * name by provenance, never because its number equals a symbol's value (see
 * "Dim names" above). Names are for printing only: shape_eq and every rule
 * that checks types ignore them. */
typedef struct {
    DType dtype;
    int rank;
    int64_t dim[IR_MAX_RANK];
    const char *dname[IR_MAX_RANK];
} Shape;

/* A param's split over the tensor-parallel group (passes/partition.c):
 * the whole param's axis `axis` is cut into `blocks` equal blocks, and each
 * block into n equal parts, rank r holding part r of every block, side by
 * side (blocks = 3: a fused [C, 3C] qkv weight split by heads keeps its q,
 * k and v column blocks). Set by the script (`shard`, nn's `parallel`
 * options) with n = 0; the partition pass sets n and rank and cuts the
 * param's shape to rank r's part. on false: the param is whole on every
 * rank. */
typedef struct {
    bool on;
    int axis, blocks, n, rank;
} IrShard;

/* The whole param's shape from rank r's part (t's shape) and back; the
 * whole tensor's bytes to rank r's part (extract) and rank r's part into
 * the whole tensor (insert), for elements of esize bytes. */
struct Tensor;
Shape ir_shard_whole(const IrShard *sh, const Shape *part);
void ir_shard_extract(const IrShard *sh, const Shape *whole, size_t esize, const void *w,
                      void *part);
void ir_shard_insert(const IrShard *sh, const Shape *whole, size_t esize, const void *part,
                     void *w);

typedef struct Tensor {
    int id;             /* index in g->t */
    Shape s;
    TensorKind kind;    /* const: produced by a const op */
    const char *name;   /* interned; set for input/param/state, NULL otherwise */
    int op;             /* index of the producing op in g->ops; -1 for graph inputs */
    ParamInit init;     /* params and state: how the runtime initialises them */
    IrShard shard;      /* params: the split over the TP group, if any */
} Tensor;

typedef struct {
    int64_t ia[IR_MAX_RANK];
    int nia;
    double f;
    DType dtype;        /* const, iota, cast: result dtype */
    int rank;           /* result shape for const/iota/random/broadcast/reshape/ */
    int64_t shape[IR_MAX_RANK]; /* slice/pad/scatter_add */
    const char *dname[IR_MAX_RANK]; /* shape's dim names (Shape.dname); NULL: none */
} OpAttr;

enum {
    OPF_RECOMPUTE = 1 << 0, /* inserted by remat: a recomputation */
    OPF_BACKWARD = 1 << 1,  /* created by autodiff */
    OPF_OPTIM = 1 << 2,     /* created by the optimizer pass */
};

typedef struct {
    Opcode code;
    int nin;
    int *in;            /* tensor ids */
    int out;            /* tensor id of the single result */
    OpAttr attr;
    SrcLoc loc;
    unsigned flags;     /* OPF_* */
    int group;          /* fuse: kernel group id, -1 when none */
} Op;

typedef struct {
    const char *name; /* interned */
    int64_t value;
} Sym;

typedef struct {
    const char *name; /* "loss", "grad.wte", ... */
    int t;
} GraphOutput;

typedef struct {
    int target; /* a param or state tensor */
    int value;  /* the tensor that replaces it after the step */
} GraphUpdate;

typedef struct Graph {
    VEC(Tensor) t;          /* by id */
    VEC(Op) ops;            /* program order */
    VEC(Sym) syms;
    VEC(GraphOutput) outs;
    VEC(GraphUpdate) upd;
} Graph;

/* graph.c: construction and queries */
Graph *ir_new(void);
void ir_free(Graph *g);
Graph *ir_clone(const Graph *g);
/* The largest tensor kiln accepts: at most IR_MAX_NUMEL elements and
 * IR_MAX_NUMEL bytes, so that numel, bytes and their sums over a few tensors
 * stay far from int64 overflow. Every tensor of a graph (inputs, params and
 * op results) is checked against it where it is made (frontend, parser,
 * ir_infer, ir_verify). */
#define IR_MAX_NUMEL ((int64_t)1 << 62)
/* numel and bytes saturate at INT64_MAX; for a shape that passed
 * ir_shape_check they are exact. */
int64_t shape_numel(const Shape *s);
int64_t shape_bytes(const Shape *s); /* numel x the dtype's size */
/* False, with "the shape f32[...] has more than 2^62 elements (expected ...,
 * got ...)" in err, when s has a dim < 1 or exceeds IR_MAX_NUMEL elements or
 * bytes. */
bool ir_shape_check(const Graph *g, const Shape *s, char *err, size_t errlen);
bool shape_eq(const Shape *a, const Shape *b); /* dtype and dims */
bool shape_dims_eq(const Shape *a, const Shape *b); /* dims only */
Shape shape_make(DType dt, int rank, const int64_t *dim);
/* "f32[B,8]" into buf: a dim prints as its name (Shape.dname) when g is not
 * NULL and it has one, else as its number */
const char *shape_str(const Graph *g, const Shape *s, char *buf, size_t n);
/* a's result shape (rank, shape, dname) set to s's dims and names */
void ir_attr_set_shape(OpAttr *a, const Shape *s);
int ir_add_input(Graph *g, TensorKind kind, const char *name, Shape s, ParamInit init);
/* Infer an op's result type from its operands and attributes. On a user-level
 * mismatch returns false and writes "what is wrong (expected ..., got ...)"
 * into err. The verifier and every builder use this one set of rules. */
bool ir_infer(const Graph *g, Opcode code, const int *in, int nin, const OpAttr *a,
              Shape *out, char *err, size_t errlen);
/* Where element (b, h, i, d) of each tensor of an attention-family op sits
 * (flat index into its buffer): b*bs + h*hs + i*rs + d + off, for the
 * batch entry b < nb, head h < nh (the plain layout: nh = 1, the batch dims
 * flattened into b; every hs is 0), row i and column d (0 for lse and
 * delta). The one
 * description of both layouts that the interpreter and the kernels read. */
typedef struct {
    int64_t bs, hs, rs, off;
} IrAttnStride;
typedef struct {
    int64_t nb, nh, Tq, Tk, D, Dv;
    /* grouped-query attention: work item bb = b * nh + h reads k and v of
     * key/value item kb = bb / g (g = 1: none), which sits at batch entry
     * kb / nhk, head kb % nhk of k, v, dk and dv (nb * nh / g items) */
    int64_t g, nhk;
    int64_t window; /* 0, or (causal) keep only i - j < window */
    int64_t ah;     /* alibi: item bb's slope ir_alibi_slope(ah, bb % ah); 0: none */
    /* bias or mask (ir_attn_bias: 0 none): element (i, j) of item bb at
     * ((bb / bdiv) % bmod) * bbs + i * bis + j * bjs of the last operand */
    int bias;
    int64_t bdiv, bmod, bbs, bis, bjs;
    IrAttnStride q, k, v; /* the operands */
    IrAttnStride o;       /* o and dO */
    IrAttnStride dq, dk, dv;
    IrAttnStride st;      /* lse and delta */
} IrAttnLayout;
/* attn.c: op's layout from its operand types and attributes (op typed by
 * ir_infer). */
void ir_attn_layout(const Graph *g, const Op *op, IrAttnLayout *L);
static inline bool ir_attn_heads(const OpAttr *a)
{
    return a->nia == 6 || (a->nia == 8 && a->ia[1] > 0);
}
/* the variants of an attention-family op (0: none); kvh: the head layout's
 * key/value heads (its heads when not grouped) */
static inline int64_t ir_attn_window(const OpAttr *a) { return a->nia == 8 ? a->ia[6] : 0; }
static inline bool ir_attn_alibi(const OpAttr *a) { return a->nia == 8 && (a->ia[7] & 1); }
static inline int64_t ir_attn_kvh(const OpAttr *a)
{
    return a->nia == 8 && a->ia[7] >> 3 ? a->ia[7] >> 3 : a->ia[1];
}
/* the extra operand's kind: IR_ATTN_BIAS (additive float) or IR_ATTN_MASK
 * (u8, 1: keep); 0: none */
enum { IR_ATTN_BIAS = 1, IR_ATTN_MASK = 2 };
static inline int ir_attn_bias(const OpAttr *a)
{
    return a->nia == 8 ? (int)(a->ia[7] >> 1 & 3) : 0;
}
/* The operands of attention-family op `code` before the bias or mask:
 * attention 3 (q, k, v), attention_lse 2, the gradients 6. */
static inline int ir_attn_nbase(Opcode code)
{
    return code == OP_ATTENTION ? 3 : code == OP_ATTENTION_LSE ? 2 : 6;
}
/* The bias or mask operand of attention-family op op, or -1. */
static inline int ir_attn_bias_in(const Op *op)
{
    return ir_attn_bias(&op->attr) ? op->in[ir_attn_nbase(op->code)] : -1;
}
/* attn.c: set window, alibi, (head layout) kvh and the bias kind on a (nia
 * 8, or back to 1 or 6 when all are none; kvh == heads is none) */
void ir_attn_set_variant(OpAttr *a, int64_t window, bool alibi, int64_t kvh, int bias);
/* attn.c: whether a bias or mask of shape b can serve scores [lead..., Tq,
 * Tk] (nl leading dims, flattened row-major into the work item bb): b
 * broadcastable to them (right-aligned, each dim 1 or equal; rank <= nl +
 * 2), its leading dims that are not 1 one contiguous run (so that bb finds
 * its slice as ((bb / bdiv) % bmod) * bbs). Sets the five numbers of
 * IrAttnLayout when L is not NULL. */
bool ir_attn_bias_fits(const int64_t *lead, int nl, int64_t Tq, int64_t Tk, const Shape *b,
                       IrAttnLayout *L);
/* ALiBi's slope of head h of H (Press et al.): 2^(-8(h+1)/H) for H a power
 * of two; otherwise the n = 2^floor(log2 H) slopes of n, then every other
 * slope of 2n: 2^(-4(2m+1)/n) for h = n + m */
static inline double ir_alibi_slope(int64_t H, int64_t h)
{
    int64_t n = 1;
    while (n * 2 <= H)
        n *= 2;
    double e = h < n ? -8.0 * (double)(h + 1) / (double)n
                     : -4.0 * (double)(2 * (h - n) + 1) / (double)n;
    return exp2(e);
}
/* conv.c: the geometry of an im2col/col2im op (AK_CONV), per spatial dim i < ns:
 * input (image) size in[i], output positions out[i], and the attributes;
 * n batch, c channels, kk = prod(k) (the last axis of the columns is c*kk).
 * ir_conv_geometry fills it from the op's image shape (im2col's operand,
 * col2im's result) and attributes; false, with err set, on bad attributes
 * or an image too small for the kernel. */
typedef struct {
    int ns;
    int64_t n, c, kk;
    int64_t in[2], out[2], k[2], s[2], p[2], d[2];
} IrConv;
bool ir_conv_geometry(const Shape *img, const OpAttr *a, IrConv *cv, char *err, size_t errlen);
/* attn.c: whether two attention-family ops' attributes are all equal
 * (causal, scale and, in the head layout, heads, hd and the offsets): the
 * ops of one attention group, as the passes and codegen pair them. */
bool ir_attn_same_attrs(const OpAttr *a, const OpAttr *b);
/* dimnames.c: the names of r's dims (r->dname) for an op whose dims
 * ir_infer has computed into r. A dim keeps the name of the operand axis
 * it carries through (elementwise ops, reduce's kept axes, matmul's
 * batch/M/N, permute, the matching leading and trailing axes of reshape,
 * a slice's untouched axes, broadcast's kept axes, gather's index and row
 * axes); attribute shapes (const, iota, random, broadcast, reshape, ...)
 * give their own names (OpAttr.dname). Among operands the first named one
 * wins. A name whose symbol is not declared in g or has another value is
 * dropped, so a printed name always parses back to its dim. */
void ir_infer_names(const Graph *g, Opcode code, const int *in, int nin, const OpAttr *a,
                    Shape *r);
/* s's names checked against g's symbols as ir_infer_names does: a name
 * g does not declare with s's value there is dropped. */
void ir_check_names(const Graph *g, Shape *s);
/* Append an op; infers the result; on mismatch returns -1 with err set.
 * Returns the new tensor id. */
int ir_op(Graph *g, Opcode code, const int *in, int nin, const OpAttr *a, SrcLoc loc,
          char *err, size_t errlen);
/* Like ir_op but dies on mismatch: for passes, whose inputs are verified. */
int ir_op_x(Graph *g, Opcode code, const int *in, int nin, const OpAttr *a, SrcLoc loc);
void ir_add_output(Graph *g, const char *name, int t);
int ir_find_output(const Graph *g, const char *name); /* tensor id or -1 */
int ir_find_tensor(const Graph *g, const char *name); /* named input tensor id or -1 */
void ir_add_update(Graph *g, int target, int value);
void ir_add_sym(Graph *g, const char *name, int64_t value);
/* Renumber tensors densely (graph inputs in declaration order, then op
 * results in program order), dropping tensors nothing defines or uses.
 * ops must be in a valid order. */
void ir_compact(Graph *g);
/* The same renumbering; keeps unused inputs unless drop_unused_inputs. */
void ir_renumber(Graph *g, bool drop_unused_inputs);
/* use counts per tensor id (caller frees) */
int *ir_use_counts(const Graph *g);
/* Who reads each tensor: the ops reading tensor t are op[start[t] ..
 * start[t+1]), ascending (an op reading t twice is there twice). Built in
 * one pass over the ops; valid until the graph's ops or tensors change. */
typedef struct {
    int *start; /* nt + 1 entries */
    int *op;
    int nt;
} IrReaders;
void ir_readers_build(const Graph *g, IrReaders *r);
void ir_readers_free(IrReaders *r);
/* Puts g's ops in a new order: op k becomes old op order[k], k in [0, n),
 * and each kept op's result tensor points back at its new index. Ops that
 * order does not name are dropped: their operand lists are freed and their
 * results become unused inputs, which ir_compact removes (nothing may still
 * read them). order names each op at most once (dies otherwise); it must
 * put producers before readers for the graph to verify. Tensor ids do not
 * change: passes call ir_compact afterwards. The passes' one way to reorder
 * (comm, schedule, fuse, remat, optimizer, simplify). */
void ir_reorder_ops(Graph *g, const int *order, int n);
/* Drops the ops with drop[i] set, keeping the others in their order
 * (ir_reorder_ops; passes call ir_compact afterwards). */
void ir_drop_ops(Graph *g, const bool *drop);

/* verify.c */
/* Checks SSA (each tensor defined once, by the op whose `out` it is),
 * operands defined before use, shapes and dtypes by ir_infer, attributes in
 * range, outputs/updates referring to real tensors with matching types,
 * update targets being param/state. Returns false with a message naming the
 * op (index, opcode, source location). */
bool ir_verify(const Graph *g, char *err, size_t errlen);

/* print.c / parse.c */
void ir_print(const Graph *g, FILE *f);
char *ir_print_str(const Graph *g); /* malloc'd */
/* v in the shortest form strtod reads back to the same double ("0.9",
 * "1e-08", "-0", "inf", "nan"), as the printer writes numbers; returns buf. */
const char *ir_fmt_double(double v, char *buf, size_t n);
/* Parses the text form. On error returns NULL and writes "NAME:LINE: ..." */
Graph *ir_parse(const char *text, const char *name, char *err, size_t errlen);

/* cost.c: counts per op (the MFU report and cost models use them) */
double ir_op_flops(const Graph *g, const Op *op);
/* The FLOPs of attention-family op `code` on attention op op's operands
 * and layout (code == op->code: ir_op_flops; attention_dqkv's kernels
 * count their dq or dk and dv parts with it). */
double ir_attn_flops(const Graph *g, const Op *op, Opcode code);
double ir_op_bytes(const Graph *g, const Op *op); /* bytes read + written */
double ir_graph_flops(const Graph *g);
/* Whether op i is a weight-gradient GEMM: a backward matmul (not a
 * recomputation) whose result no backward op outside its fuse group reads
 * except the optimizer's (it feeds the update, a bucket or an
 * accumulator, not the chain of input gradients: a pipeline's W, the
 * GEMMs that may run under a TP collective). grad_accum's accumulation
 * (passes/comm.c: the sum with state "accum.P", then its product with a
 * constant, 1/K) is followed to what reads its result; acc (NULL: not
 * wanted) gets those ops, the add, the constant and the product, -1 where
 * there is none. rd: g's readers (ir_readers_build), so that a pass asks
 * about every op in linear time. */
bool ir_wgrad_matmul(const Graph *g, const IrReaders *rd, int i, int acc[3]);
/* The role of axis `axis` of a matmul operand of shape s (is_b: operand
 * B, else A; trans: its ta or tb): 0 a batch axis, 1 M (of A) or N (of
 * B), 2 the contraction axis K. A is [..., M, K] ([..., K, M] with ta),
 * B [..., K, N] ([..., N, K] with tb). */
int ir_matmul_role(const Shape *s, int axis, bool trans, bool is_b);

/* interp.c: the reference interpreter. Evaluates every op in double
 * precision (integers exactly; bf16/f16 values rounded at each op result).
 * val[id] holds numel doubles per tensor; the caller sets val[] for every
 * input/param/state tensor; ir_interp allocates and fills the others. */
typedef struct {
    uint64_t seed;
    int64_t step;
} InterpOpts;
double **ir_interp_alloc(const Graph *g); /* zeroed table of nt pointers */
void ir_interp(const Graph *g, double **val, const InterpOpts *o);
void ir_interp_free(const Graph *g, double **val); /* frees every buffer and the table */
/* After ir_interp: copy each update's value into its target's buffer. */
void ir_interp_apply_updates(const Graph *g, double **val);

#endif
