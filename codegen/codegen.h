/*
 * codegen.h - from a scheduled graph and its memory plan to a Plan: buffers
 * (arena offsets), kernels (a target-neutral description plus printed
 * source) and steps (kernel launch, GEMM, copy). The public header of
 * codegen/; its CUDA half (the CUDA C printer and a plan's CUDA program) is
 * cg_cuda.h.
 *
 * A kernel description (CgKernel) is what every printer reads: the C printer
 * here and the CUDA C printer share the expression printer (cg_print_expr)
 * and its one table of op spellings; they differ only in the skeleton.
 *
 * Kernel structure:
 *   kernel = sequence of CgLoop nests, run one after the other;
 *   loop   = outer dims (independent iterations: threads/blocks on a GPU)
 *            + phases run in order inside one outer iteration;
 *   phase  = inner dims + either a reduction (acc = fold over the inner
 *            dims of `value`) or a list of stores (at every inner index).
 * Single-op elementwise kernels are one loop, one store phase with no inner
 * dims; a reduce op is a reduction phase then a store phase; a fused softmax
 * is max phase, sum phase, store phase over the same rows. Expressions are
 * trees of CgExpr held by index in the kernel's ex array; index arithmetic is
 * i64-typed expressions of the loop variables.
 *
 * Fused kernels (cg_lower_group, from a fuse group) use the same structure:
 *   - a phase with no inner dims runs once per outer iteration ("row
 *     phase"): per-row values (a mean, an rstd) and per-row stores;
 *   - an accumulator (CGX_ACC) is readable in every phase after its
 *     reduction phase, in the same outer iteration;
 *   - phase lets (CgPhase.lets): expressions a printer may evaluate once
 *     into locals, in the listed order, before the phase's fold or stores
 *     (a let of a row phase stays visible to every later phase of its
 *     loop). Printing them is optional: for a target without lets
 *     (cg_target_lets), cg_print_expr prints every expression inline,
 *     which is also correct.
 *     With lets, a store phase reads everything before it writes (in-place
 *     updates rely on it);
 *   - CgLoop.col: the outer dims are columns and the reduction phases run
 *     over leading (row) dims: a CPU printer walks rows outermost to keep
 *     memory access contiguous; a GPU printer may map columns to threads;
 *   - a kernel of several loops (the multi-tensor AdamW update) runs them
 *     one after the other; loops of one kernel never read each other's
 *     results unless CgKernel.parallel is false.
 */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "ir.h"
#include "passes.h"

/* ---- expr.c: expressions and the shared expression printer ------------- */

/* X(ENUM, arity, float spelling, integer spelling): $0 $1 $2 are operands.
 * A NULL integer spelling means the op is not defined on integers. */
/* clang-format off */
#define CG_OPS(X)                                                              \
    X(NEG,  1, "(-$0)",                         "(-$0)")                       \
    X(EXP,  1, "expf($0)",                      NULL)                          \
    X(LOG,  1, "logf($0)",                      NULL)                          \
    X(SIN,  1, "sinf($0)",                      NULL)                          \
    X(COS,  1, "cosf($0)",                      NULL)                          \
    X(TANH, 1, "tanhf($0)",                     NULL)                          \
    X(SQRT, 1, "sqrtf($0)",                     NULL)                          \
    X(RSQRT,1, "(1.0f / sqrtf($0))",            NULL)                          \
    X(SIGMOID,1,"(1.0f / (1.0f + expf(-$0)))",  NULL)                          \
    X(RELU, 1, "($0 > 0.0f ? $0 : 0.0f)",       "($0 > 0 ? $0 : 0)")           \
    X(ABS,  1, "fabsf($0)",                     "($0 < 0 ? -$0 : $0)")         \
    X(ERF,  1, "erff($0)",                      NULL)                          \
    X(FLOOR,1, "floorf($0)",                    "($0)")                        \
    X(ADD,  2, "($0 + $1)",                     "($0 + $1)")                   \
    X(SUB,  2, "($0 - $1)",                     "($0 - $1)")                   \
    X(MUL,  2, "($0 * $1)",                     "($0 * $1)")                   \
    X(DIV,  2, "($0 / $1)",                     "kiln_idiv($0, $1)")           \
    X(POW,  2, "powf($0, $1)",                  NULL)                          \
    X(MAX,  2, "kiln_fmax($0, $1)",             "($0 > $1 ? $0 : $1)")         \
    X(MIN,  2, "kiln_fmin($0, $1)",             "($0 < $1 ? $0 : $1)")         \
    X(LT,   2, "($0 < $1)",                     "($0 < $1)")                   \
    X(LE,   2, "($0 <= $1)",                    "($0 <= $1)")                  \
    X(GT,   2, "($0 > $1)",                     "($0 > $1)")                   \
    X(GE,   2, "($0 >= $1)",                    "($0 >= $1)")                  \
    X(EQ,   2, "($0 == $1)",                    "($0 == $1)")                  \
    X(NE,   2, "($0 != $1)",                    "($0 != $1)")                  \
    X(AND,  2, NULL,                            "($0 && $1)")                  \
    X(IDIV, 2, NULL,                            "($0 / $1)")                   \
    X(IMOD, 2, NULL,                            "($0 % $1)")
/* clang-format on */

typedef enum {
#define X(e, n, f, i) CG_##e,
    CG_OPS(X)
#undef X
    CG__COUNT
} CgOp;

typedef struct {
    const char *name;
    int arity;
    const char *fspell, *ispell;
} CgOpInfo;
extern const CgOpInfo cg_opinfo[CG__COUNT];

typedef enum {
    CGX_CONST,  /* f (float dtypes) or i (integer dtypes) */
    CGX_VAR,    /* loop variable `var` (i64) */
    CGX_ACC,    /* a reduction's accumulator `var` */
    CGX_LOAD,   /* kernel param `param` at flat element index a[0] (i64) */
    CGX_OP,     /* op applied to a[0..arity) */
    CGX_SELECT, /* a[0] ? a[1] : a[2]; only the chosen side is evaluated */
    CGX_CAST,   /* a[0] converted to dt */
    CGX_RAND,   /* ir_rand_u01(seed, key, step, a[0]) as f32 */
} CgExprKind;

typedef struct {
    CgExprKind kind;
    DType dt;     /* result type; index arithmetic is DT_I64 */
    CgOp op;
    int a[3];
    int param;    /* load */
    int var;      /* var, acc */
    double f;     /* const (float) */
    int64_t i;    /* const (integer) */
    uint64_t key; /* rand */
    bool let;     /* bound by a phase's lets: printed as x<index> when the
                     target prints lets */
} CgExpr;

typedef struct {
    int tensor;  /* graph tensor whose buffer is passed */
    DType dt;
    bool out;    /* written by the kernel */
} CgParam;

typedef struct {
    int var;     /* loop variable id */
    int64_t n;   /* extent: the variable runs over [0, n) */
} CgDim;

/* CG_RED_LSE: log(sum(exp(value))) with an online (max, sum) accumulator
 * pair, one pass over the values: fold x: m' = max(m, x), s' = s exp(m -
 * m') + exp(x - m'); merge of partials the same with s exp(m2 - m');
 * result m + log(s) (m = +-inf: m). Printers hold the pair as kiln_lse
 * (each prelude defines it, KILN_LSE_ID, kiln_lse_fold, kiln_lse_merge
 * and kiln_lse_val); reading the accumulator (CGX_ACC) gives the result. */
typedef enum { CG_RED_SUM, CG_RED_MAX, CG_RED_LSE } CgRedOp;

typedef struct {
    int param;       /* output param */
    int index;       /* i64 expression: flat element index */
    int value;       /* expression of the param's dtype */
    bool accumulate; /* += instead of = (scatter; atomic on a GPU) */
    int guard;       /* expression: store only where nonzero; -1: always */
} CgStore;

typedef struct {
    int ndim;
    CgDim dim[IR_MAX_RANK];
    int acc;         /* reduction: accumulator id; -1 for a store phase */
    CgRedOp rop;
    DType adt;       /* accumulator type */
    bool wide;       /* float sum: a printer may accumulate in double */
    int value;       /* reduction: expression folded into acc */
    VEC(CgStore) st; /* store phase */
    VEC(int) lets;   /* expressions bound to locals, in evaluation order */
} CgPhase;

typedef struct {
    int ndim;
    CgDim dim[IR_MAX_RANK];
    VEC(CgPhase) ph;
    bool col;        /* outer dims are columns; reductions run over rows */
} CgLoop;

/* An attention kernel (cattn.c): the attention op family runs as
 * hand-written tiled kernels, not as loops (CgKernel.loops is empty).
 * kind says which; the fields name the kernel params (index into
 * CgKernel.params, -1 when absent):
 *   CG_ATTN_FWD  reads q, k (and v when o is written); writes o and/or lse
 *                (an attention op and its sibling attention_lse of the
 *                same q, k and attrs, or either alone)
 *   CG_ATTN_DQ   reads q, k, v, dO, lse, delta; writes dq
 *   CG_ATTN_DKV  reads q, k, v (when dk is written), dO, lse, delta (when dk
 *                is written); writes dk and/or dv (attention_dk and
 *                attention_dv of the same operands and attrs, or one; dk ==
 *                dv, one param, for attention_dqkv, whose layout puts the
 *                two at their own columns)
 * Shapes: q [batch, Tq, D], k [batch, Tk, D], v [batch, Tk, Dv], o and dO
 * [batch, Tq, Dv], lse and delta f32 [batch, Tq] (batch: batch entries x
 * heads), each tensor where `lay` puts it (IrAttnLayout: the plain layout,
 * or the head layout's strided rows). Semantics: ir.h's attention family, in f32. Parallel over
 * (batch, query tiles) (FWD, DQ) or (batch, key tiles) (DKV): every tile
 * is computed by one part, so results do not depend on the split. */
typedef enum { CG_ATTN_NONE, CG_ATTN_FWD, CG_ATTN_DQ, CG_ATTN_DKV } CgAttnKind;
typedef struct {
    CgAttnKind kind;
    int64_t batch, Tq, Tk, D, Dv;
    bool causal;
    double scale;
    DType dt;          /* q, k, v, o, dO and the gradients' dtype */
    int q, k, v, o, lse, dO, delta, dq, dk, dv; /* params, -1: absent */
    int bias;          /* the bias or mask param (lay.bias its kind), -1: absent */
    int ops[2], nops;  /* the IR ops it computes */
    IrAttnLayout lay;  /* where each tensor's (b, h, i, d) sits; batch = nb * nh */
    bool dqkv;         /* one of attention_dqkv's two kernels (the CUDA
                          printer may fuse them: cuda_attn_bwd.c; the C
                          printer too: cg_c_attn_folded) */
} CgAttn;

typedef struct {
    char *name;
    int op;            /* IR op index it computes (first op when fused); -1 */
    VEC(CgParam) params;
    bool rand;         /* takes (uint64_t seed, int64_t step) after the buffers */
    bool noalias;      /* no output buffer overlaps another param's buffer */
    VEC(CgExpr) ex;
    VEC(CgLoop) loops;
    int nvars, naccs;
    bool parallel;     /* the first outer dim of every loop may be split
                          across threads (no accumulating stores, loops
                          independent) */
    int group;         /* fuse group it computes; -1 for a single op */
    int64_t flat;      /* > 0: elementwise over `flat` elements, every buffer of
                          that many elements read and written at the element's
                          own index (plan.c, flat_kernel): the C printer also
                          prints NAME_range(..., int64_t lo, int64_t hi, int64_t
                          part, int64_t nparts), which computes elements [lo, hi)
                          only (zero=1's shard update in pieces, runtime/pieces.c) */
    CgAttn attn;       /* attn.kind != CG_ATTN_NONE: an attention kernel */
} CgKernel;

/* Builders: each returns the new expression's index in k->ex. Integer
 * constants fold and trivial index arithmetic (x*1, x+0) simplifies. */
int cg_const_f(CgKernel *k, DType dt, double f);
int cg_const_i(CgKernel *k, DType dt, int64_t i);
int cg_var(CgKernel *k, int var);
int cg_acc(CgKernel *k, int acc, DType dt);
int cg_load(CgKernel *k, int param, int index);
int cg_unop(CgKernel *k, CgOp op, int a);
int cg_binop(CgKernel *k, CgOp op, int a, int b);
int cg_select(CgKernel *k, int c, int a, int b);
int cg_cast(CgKernel *k, DType dt, int a);
int cg_rand(CgKernel *k, uint64_t key, int index);
int cg_new_var(CgKernel *k);
void cg_kernel_free(CgKernel *k);

/* A printing target: spellings that differ from the table (indexed by
 * CgOp; NULL entries fall back to the table). The table's spellings use
 * helpers every target's prelude defines: KILN_INF, KILN_NAN, kiln_fmax,
 * kiln_fmin (NaN-propagating like the interpreter), kiln_idiv (truncating,
 * x/0 = 0) and kiln_rand_u01 (ir_rand_u01's hash). */
typedef struct {
    const char *name;
    const char *const *fover; /* CG__COUNT entries or NULL */
    const char *const *iover;
} CgTarget;
/* Whether cg_print_expr prints let-bound expressions as locals for target t
 * (the C and CUDA targets do; any other prints them inline). */
bool cg_target_lets(const CgTarget *t);
extern const CgTarget cg_target_c;
/* Appends the expression's source to *buf (a growable string). */
typedef struct {
    char *s;
    size_t n, cap;
} CgBuf;
void cg_puts(CgBuf *b, const char *s);
void cg_printf(CgBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_print_expr(CgBuf *b, const CgKernel *k, int e, const CgTarget *t);
/* Printer scaffolding shared by the C and CUDA printers: four spaces per
 * depth; `for (int64_t vN = 0; vN < n; vN++) {` per dim (depth grows);
 * the matching closing braces; a reduction's initial value. */
void cg_indent(CgBuf *b, int depth);
void cg_open_loops(CgBuf *b, const CgDim *dim, int n, int *depth);
void cg_close_loops(CgBuf *b, int n, int *depth);
void cg_print_red_init(CgBuf *b, const CgPhase *ph);
/* A flat kernel's range loop body (NAME_range, in either printer): the loop's
 * and phase's variables as `const int64_t vN`, the element f_ for the one
 * longer than 1 and 0 for the others, at depth 2. */
void cg_print_flat_vars(CgBuf *b, const CgLoop *l, const CgPhase *ph);
/* Prints let-bound expression e's definition, "TYPE x<e> = ...;" (no
 * indentation, with newline). */
void cg_print_let(CgBuf *b, const CgKernel *k, int e, const CgTarget *t);
const char *cg_ctype(DType dt); /* "float", "int32_t", ...; NULL if unsupported */

/* ---- lower.c: one IR op to a kernel description ------------------------- */

/* Describes op `i` of g as a kernel. Returns false with d set when the op's
 * dtype is not supported (bf16/f16 for now). */
bool cg_lower_op(const Graph *g, int i, CgKernel *k, Diag *d);
/* Describes the kernel of fuse group ops[0..n) (program order; a member
 * matmul runs before as a GEMM and its result is read from memory). mat:
 * pass_fuse_materialised. One loop per distinct domain among the group's
 * connected parts. Returns false with d set on a group that is not one
 * (pass_fuse_lowers: the check the fuse pass applies). */
bool cg_lower_group(const Graph *g, const int *ops, int n, const bool *mat, CgKernel *k,
                    Diag *d);
/* Scratch for lowering many groups of one graph: cg_lower_group_ws costs
 * O(group) instead of O(ops + tensors) per call. */
typedef struct CgLowerWs CgLowerWs;
CgLowerWs *cg_lower_ws_new(const Graph *g);
void cg_lower_ws_free(CgLowerWs *w);
bool cg_lower_group_ws(CgLowerWs *w, const Graph *g, const int *ops, int n, const bool *mat,
                       CgKernel *k, Diag *d);

/* ---- cprint.c: the C printer -------------------------------------------- */

/* The prelude every generated C file starts with (types, helpers, the
 * counter hash of ir_rand_u01). */
extern const char cg_c_prelude[];
/* Appends kernel k as a C function `void NAME(params..., [uint64_t seed,
 * int64_t step,] int64_t part, int64_t nparts)`: the call computes part
 * `part` of `nparts` (a share of every loop's first outer dim when
 * k->parallel; part 0 does everything otherwise). */
void cg_print_c_kernel(CgBuf *b, const CgKernel *k);

/* ---- cattn.c: the attention kernels (see CgAttn) ------------------------- */

/* The attention op partnered with op i in one kernel: attention with its
 * sibling attention_lse (same q, k and attrs), attention_dk with
 * attention_dv (same six operands and attrs); -1 when none. The first one
 * found in program order. */
int cg_attn_partner(const Graph *g, int i);
/* Describes the kernel of attention ops ops[0..n) (n 1 or 2: one op, or an
 * op and its cg_attn_partner). False with d set when the dtype is not f32
 * (the C printer's only type here). */
bool cg_lower_attn(const Graph *g, const int *ops, int n, CgKernel *k, Diag *d);
/* The same for one of the two kernels of attention_dqkv op i: its dq
 * kernel (CG_ATTN_DQ), or with dkv its dk/dv kernel (CG_ATTN_DKV, dk and dv
 * the one param of its result). Each writes only its own columns of the
 * result; the two together write all of it. */
bool cg_lower_attn_dqkv(const Graph *g, int i, bool dkv, CgKernel *k, Diag *d);
/* Whether the C backend runs attention_dqkv's two kernels as one: its
 * dk/dv kernel computes dq as well, one work item per (batch entry, head),
 * and its dq kernel does nothing (not run; no work). So when there are at
 * least CG_ATTN_FOLD_ITEMS such items, a function of the shape alone; the
 * result bits are the same either way (cattn.c). KILN_ATTN_FOLD=0 in the
 * environment keeps the two kernels (the tests compare the two). */
enum { CG_ATTN_FOLD_ITEMS = 16 };
bool cg_c_attn_folded(const CgAttn *a);
/* C the prelude carries for the attention kernels (kiln_attn_mm). */
extern const char cg_c_attn_helpers[];
/* Appends an attention kernel's C function (cg_print_c_kernel's signature). */
void cg_print_c_attn(CgBuf *b, const CgKernel *k);
/* Element-operations of one call (cg_kernel_work for an attention kernel):
 * the kept (i, j) pairs times the work per pair. */
int64_t cg_attn_work(const CgAttn *a);

/* ---- plan.c: the Plan --------------------------------------------------- */

/* CG_STEP_ALLREDUCE_START/_WAIT run on the communication stream (runtime/
 * comm.c), never on a backend's compute stream: start takes the bucket's
 * gradients (args[0..nargs)), wait blocks until the bucket is reduced. */
typedef enum {
    CG_STEP_KERNEL,
    CG_STEP_GEMM,
    CG_STEP_COPY,
    CG_STEP_ALLREDUCE_START,
    CG_STEP_ALLREDUCE_WAIT,
    CG_STEP_SHARD_PACK, /* shard_pack: run by the executor (rank-dependent) */
    CG_STEP_TP,         /* tp_allreduce, tp_all_gather, tp_reduce_scatter (op): run by
                           the executor over the TP group, src -> dst (bytes: dst's) */
} CgStepKind;

/* Which collective a CG_STEP_ALLREDUCE_START/_WAIT step runs (ZeRO-1 adds
 * the two sharded ones; every start/wait pair is one bucket either way). */
typedef enum { CG_COLL_ALLREDUCE, CG_COLL_REDUCE_SCATTER, CG_COLL_ALL_GATHER } CgColl;

/* A GEMM epilogue: work the plan gives to the GEMM step on top of
 * C = op(A) op(B), as cuBLASLt can do it. The plan itself never relies on
 * it: the steps the epilogue replaces stay in the plan, marked
 * CgStep.by_epilogue = the GEMM's step index, and a backend that ignores
 * epilogues runs every step as planned and gets the same numbers (the CPU
 * backend does). A backend that applies an epilogue writes what it says
 * below instead of c (unless stated) and skips every step marked with its
 * GEMM. Pairs (GELU_AUX_BIAS with DGELU*, CgGemm.pair) are applied both or
 * neither. All tensors named are f32; every epilogue but BIAS needs batch 1
 * (a batch sharing B is folded into M). Row-major kiln terms: rows M, cols N.
 *
 * CG_EPI_BIAS          d = c + bias[n] (bias f32[N]); c is read by nothing
 *                      else (never written).
 * CG_EPI_GELU_BIAS     d = gelu(c + bias[n]); c never written.
 * CG_EPI_GELU_AUX_BIAS d = gelu(c + bias[n]), and c's own buffer receives
 *                      aux = c + bias[n] (aux == c): the only other readers
 *                      of c are the paired DGELU group's recomputations
 *                      pre = c + broadcast(bias).
 * CG_EPI_DGELU         d = c * gelu'(aux) (aux: the pair's c buffer, holding
 *                      pre); c never written.
 * CG_EPI_DGELU_BGRAD   DGELU, and bgrad[n] = sum over rows m of d[m][n].
 * CG_EPI_BGRAD_A       C as planned, and bgrad[m] = sum over k of op(A)[m][k]
 *                      (A stored [K, M]: ta = 1) - cuBLASLt's BGRADB, since
 *                      its B is kiln's A.
 * CG_EPI_BGRAD_B       C as planned, and bgrad[n] = sum over k of op(B)[k][n]
 *                      (B stored [K, N]: tb = 0) - cuBLASLt's BGRADA.
 * gelu is the tanh form kiln's nn.gelu spells and cuBLASLt computes:
 * gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The bgrad
 * tensor is a leading-axis reduce_sum (numel N, or M) computed by a plan step
 * that does nothing else; everything that reads it runs after the GEMM. */
typedef enum {
    CG_EPI_NONE,
    CG_EPI_BIAS,
    CG_EPI_GELU_BIAS,
    CG_EPI_GELU_AUX_BIAS,
    CG_EPI_DGELU,
    CG_EPI_DGELU_BGRAD,
    CG_EPI_BGRAD_A,
    CG_EPI_BGRAD_B,
    CG_EPI__COUNT
} CgEpilogue;

typedef struct {
    int a, b, c;            /* tensors: C = op(A) x op(B) */
    CgEpilogue epilogue;
    int bias;               /* BIAS, GELU_*: the bias f32[N] read; -1 otherwise */
    int d;                  /* BIAS, GELU_*, DGELU*: the tensor written instead of c */
    int aux;                /* GELU_AUX_BIAS: c (its buffer receives c + bias);
                               DGELU*: the pair's c (read as gelu's input) */
    int bgrad;              /* DGELU_BGRAD, BGRAD_*: the bias gradient written */
    int pair;               /* GELU_AUX_BIAS, DGELU*: the partner GEMM's step */
    int64_t batch, M, N, K;
    bool ta, tb;
    int64_t lda, ldb, ldc;  /* row-major leading dimensions */
    int64_t sa, sb, sc;     /* batch strides in elements (sb = 0: B shared) */
} CgGemm;

typedef struct {
    CgStepKind kind;
    int op;        /* IR op index; -1 for update copies */
    int kernel;    /* CG_STEP_KERNEL: index in plan->kernels */
    int *args;     /* CG_STEP_KERNEL: tensor bound to each kernel param (kernels
                      are shared between ops with identical bodies) */
    CgGemm gemm;   /* CG_STEP_GEMM */
    int64_t dst, src, bytes; /* CG_STEP_COPY: arena offsets */
    bool update;   /* copy of an update value into its target */
    const char *name; /* kernel name, "gemm", "copy" (interned) */
    int bucket;    /* CG_STEP_ALLREDUCE_*: the comm pass's bucket id */
    int nargs;     /* CG_STEP_ALLREDUCE_START, SHARD_PACK: number of args */
    CgColl coll;   /* CG_STEP_ALLREDUCE_*: which collective */
    /* reduce-scatter and all-gather starts, shard_pack (ir.h, AK_SHARD): the
     * args' flat range starts at sh_start of sh_total elements, sharded
     * over sh_nranks; sh_buf is the shard tensor (reduce-scatter: written;
     * all-gather: read; shard_pack: the acc operand, and dst the result's
     * offset) */
    int64_t sh_start, sh_total;
    int sh_nranks, sh_buf;
    int group;     /* fuse group of the step's op(s); -1 for a single op */
    int by_epilogue; /* CG_STEP_KERNEL: -1, or the GEMM step whose epilogue
                        computes everything this step writes (see CgEpilogue) */
    double flops, bytes_moved; /* the IR's counts for the step (a fused
                                  kernel: its members' FLOPs, the bytes it
                                  reads and writes) */
    int64_t lo, hi; /* CG_STEP_KERNEL of a flat kernel with hi > lo: only its
                       elements [lo, hi) (NAME_range; runtime/pieces.c); 0, 0: all */
} CgStep;

typedef struct CgPlan {
    const Graph *g;         /* borrowed: outlives the plan */
    MemPlan *mem;           /* owned */
    VEC(CgKernel *) kernels;
    VEC(CgStep) steps;      /* the ops' steps in schedule order, then update copies */
    char *source;           /* the whole C translation unit */
    int64_t arena_bytes;    /* = mem->arena_bytes */
} CgPlan;

/* Plans the final graph (after pass_schedule). Fails with d set on an
 * unsupported op or dtype. */
CgPlan *cg_plan(const Graph *g, Diag *d);
/* Per op of g (the graph p was planned from): the plan step that runs it
 * (a fused group's ops: their kernel's step), -1 for none. Caller frees. */
int *cg_plan_op_steps(const CgPlan *p, const Graph *g);
void cg_plan_free(CgPlan *p);
/* Byte offset of a tensor's data in the arena. */
int64_t cg_offset(const CgPlan *p, int tensor);
/* Whether some output param of k overlaps another of its params in m
 * (bytes [offset, offset + bytes), empty ranges included: a0 < b1 &&
 * b0 < a1); O(params log params). */
bool cg_params_alias(const MemPlan *m, const CgKernel *k);
/* Makes each input param of k whose buffer is exactly an output's (same
 * offset, size and dtype; the first such output) that output's param, and
 * renumbers the params densely; O(params log params). */
void cg_merge_inplace_params(const MemPlan *m, CgKernel *k);

/* ---- epilogue.c: GEMM epilogues (see CgEpilogue) ------------------------- */

/* Whether tensor t of g computes gelu(x) as kiln's nn.gelu spells it:
 * 0.5*x * (1 + tanh(sqrt(2/pi) * (x + 0.044715*x*x*x))). Definitions are
 * followed regardless of fuse groups; add and mul match either operand
 * order, constants (const ops, or broadcasts of them) within a relative
 * 1e-6. Sets *x. Any other spelling (erf, x*sigmoid(1.702x), a product
 * associated differently) is not recognised: it runs as the planned fused
 * kernel, correct and slower. */
bool cg_match_gelu(const Graph *g, int t, int *x);
/* Whether t computes grad * gelu'(x) as autodiff and simplify derive it
 * from nn.gelu (the chain rule through tanh, the cube and the products, one
 * sum); sets *x and *grad. Same rules and limits as cg_match_gelu. */
bool cg_match_dgelu(const Graph *g, int t, int *x, int *grad);
/* Records the epilogues of p's GEMM steps (CgGemm.epilogue and its tensors)
 * and marks the steps they replace (CgStep.by_epilogue; -1 elsewhere).
 * mat: pass_fuse_materialised(p->g). */
void cg_plan_epilogues(CgPlan *p, const bool *mat);
const char *cg_epilogue_name(CgEpilogue e); /* "bias", "gelu_aux_bias", ... */
/* Whether GEMM step s may write its epilogue's d (and, with bgrad, its
 * bias gradient) at the GEMM under memory plan m (another arena of the same
 * storages and live ranges, such as a backend's bf16 one): no other storage
 * sharing those bytes is live in between. cg_plan_epilogues checks this on
 * p->mem. */
bool cg_epilogue_safe(const CgPlan *p, const MemPlan *m, int s, bool bgrad);
/* Whether an epilogue computes a bias gradient (DGELU_BGRAD, BGRAD_A/B). */
static inline bool cg_epilogue_has_bgrad(CgEpilogue e)
{
    return e == CG_EPI_DGELU_BGRAD || e == CG_EPI_BGRAD_A || e == CG_EPI_BGRAD_B;
}
/* One line "gemm epilogues: N kind, ..." (or "none"); with `each`, then one
 * line per GEMM step that carries one (step, op, shape, kind, tensors). */
void cg_plan_print_epilogues(const CgPlan *p, FILE *f, bool each);

/* ---- cpu_work.c: how the CPU backend splits a step over threads ---------- */
/* A kernel below CG_MIN_KERNEL_WORK element-operations runs on the calling
 * thread alone (32768 elements of an add: 2 loads, the add: cost 4); a
 * GEMM below CG_MIN_GEMM_FLOPS is one part. A GEMM split into bands gives
 * each band at least CG_GEMM_MIN_BAND rows (or columns) where its side
 * allows two: every band's OpenBLAS call packs the whole other operand, so
 * thin bands spend their time packing (docs/cost.md). */
enum { CG_MIN_KERNEL_WORK = 4 * 32768, CG_GEMM_MAX_PARTS = 64, CG_GEMM_MIN_BAND = 256 };
#define CG_MIN_GEMM_FLOPS 2.5e5
#define CG_GEMM_PART_FLOPS 8e6
/* Element-operations of one call of k (a rough instruction count). */
int64_t cg_kernel_work(const CgKernel *k);
/* The parts a GEMM is split into (1..CG_GEMM_MAX_PARTS; shape alone). */
int cg_gemm_parts(const CgGemm *m);
/* Part p of n: batch entries [b0, b1), rows [m0, m1), columns [n0, n1). */
void cg_gemm_part(const CgGemm *m, int n, int p, int64_t *b0, int64_t *b1, int64_t *m0,
                  int64_t *m1, int64_t *n0, int64_t *n1);

/* ---- predict.c: a cost model of a plan on a device ------------------------
 * (docs/cost.md: the equations and where the figures come from) */
typedef struct {
    const char *name;          /* "h200", ...; "cpu" for this machine */
    const char *title;
    bool gpu;
    int units;                 /* SMs, or threads on the CPU */
    double bf16, tf32, f32;    /* dense peaks, FLOP/s (f32: CUDA cores / FMA) */
    double gemm;               /* CPU: measured sgemm rate on all units, FLOP/s */
    double bw;                 /* memory bandwidth, bytes/s */
    double l2;                 /* bytes */
    double launch_s;           /* per launch (CPU: per plan step) */
    double graph_s;            /* per node of a replayed CUDA graph */
    int max_threads_unit, max_blocks_unit; /* resident per SM */
    double bw1;                /* CPU: one thread's bandwidth, bytes/s */
    double work;               /* CPU: element-operations (cg_kernel_work) per
                                  second of one thread in generated kernels */
    double gemm1[4];           /* CPU: one thread's sgemm FLOP/s for a band of
                                  16, 64, 256, 512 rows x 512 x 512 */
    double mem;                /* device memory, bytes */
    double intra_bw, inter_bw; /* per GPU, one direction, bytes/s: inside a node
                                  (NVLink), between nodes (InfiniBand) */
    int smem_unit;             /* GPU: shared memory per SM, bytes */
    const char *arch;          /* GPU: NVRTC's architecture ("sm_90") */
    /* GPU cost-model figures (docs/cost.md, Devices: each one's source, or
     * that it is a guess); --calibrate fits them from a measured run */
    double bw_eff;             /* share of bw a streaming kernel reaches (0: all of it,
                                  as on the CPU, whose bw is measured) */
    double gemm_top;           /* share of the bf16 peak cuBLASLt reaches on 8192^3 */
    double clock;              /* SM clock of the datasheet peaks, Hz */
    double mma_sync;           /* share of the bf16 peak mma.sync.m16n8k16 can reach */
} CgDevice;
extern const CgDevice cg_devices[]; /* the GPUs; the CPU's is measured */
extern const int cg_ndevices;
const CgDevice *cg_device_find(const char *name); /* NULL: not a GPU of the table */

typedef enum { CG_LIMIT_MEMORY, CG_LIMIT_COMPUTE, CG_LIMIT_BLOCKS, CG_LIMIT_LAUNCH } CgLimit;
const char *cg_limit_name(CgLimit l); /* "memory", "compute", "blocks", "launch" */

/* What a launch is, for calibration (docs/cost.md, Calibration): GEMMs by
 * shape class (large: 4 waves or more of tiles; waves: fewer, where wave
 * quantisation shows; split-K: K split to fill the SMs; memory: bytes
 * bound), fused attention, memory-bound kernels and copies, compute-bound
 * kernels, and launches whose overhead exceeds their work. */
typedef enum {
    CG_CLASS_GEMM_LARGE, CG_CLASS_GEMM_WAVES, CG_CLASS_GEMM_SPLITK, CG_CLASS_GEMM_MEMORY,
    CG_CLASS_ATTN, CG_CLASS_MEMORY, CG_CLASS_COMPUTE, CG_CLASS_LAUNCH, CG_CLASS__COUNT
} CgClass;
const char *cg_class_name(CgClass c); /* "gemm.large", ..., "launch" */

/* A GEMM on a GPU (cuBLASLt), costed by shape (docs/cost.md, GEMM): the
 * output tile and K split of the least predicted time among the tiles
 * cuBLASLt has, waves of those tiles over the SMs, and the tile's rate
 * (by tile size and K depth, normalised so that 8192^3 reaches
 * dev->gemm_top of the peak). bytes: A, B and D (and epilogue tensors). */
typedef struct {
    int tm, tn, split;  /* the tile (rows x columns of C) and the K split */
    int64_t ctas;       /* tiles x split */
    int64_t waves;      /* ceil(ctas / SMs) */
    double t_comp, t_mem; /* seconds: the tiles' waves (and split-K's reduction);
                             bytes at the achievable bandwidth */
    double s;           /* the GEMM, without the launch */
} CgGemmCost;
void cg_gemm_cost(const CgDevice *dev, int64_t batch, int64_t M, int64_t N, int64_t K,
                  double peak, double bytes, CgGemmCost *c);
/* The bandwidth a streaming kernel reaches on dev (bw x bw_eff). */
double cg_device_bw(const CgDevice *dev);

typedef struct {
    bool bf16;       /* precision bf16 (GPU) */
    bool tf32;       /* f32 GEMMs on TF32 tensor cores (GPU) */
    bool cuda_graph; /* launches replayed from a CUDA graph (GPU) */
} CgPredictOpts;

typedef struct {
    int step;         /* plan step */
    const char *name; /* CUDA function or kernel name, "gemm", "copy", "cast_f32_bf16" */
    double flops, bytes;
    double s;         /* predicted seconds, launch overhead included */
    CgLimit limit;
    int64_t blocks;   /* grid (GEMM: 128 x 128 tiles; CPU: threads used) */
    int threads;      /* block size (0: n/a) */
    int cls;          /* CgClass: what --calibrate groups it under */
} CgPredRow;

typedef struct {
    const CgDevice *dev;
    double step_s, gemm_s, kernel_s, copy_s, launch_s;
    int launches;
    double flops, gemm_flops; /* the step's (recomputation included) */
    double peak;              /* the MFU denominator, FLOP/s */
    const char *peak_name;
    VEC(CgPredRow) rows;      /* one per launch, in step order */
} CgPrediction;

/* Predicts every launch of plan p on dev: with q (cg_cuda_program) the CUDA
 * program's functions, grids and storage types; q NULL: the CPU backend's
 * kernels and GEMMs. */
struct CgCudaProgram; /* cg_cuda.h */
CgPrediction *cg_predict(const CgPlan *p, const struct CgCudaProgram *q, const CgDevice *dev,
                         const CgPredictOpts *o);
void cg_prediction_free(CgPrediction *r);
/* The step, its parts, MFU of model_flops (the step without recomputation),
 * tokens/s when tokens > 0, and the `top` costliest kernels (launches of one
 * kernel summed) with what limits each. */
void cg_prediction_print(const CgPrediction *r, const CgPlan *p, double model_flops,
                         double tokens, int top, FILE *f);

/* ---- ktable.c: the per-kernel table (docs/cost.md) ------------------------
 * One row per launch name of a step: predicted (kiln compile --target) or
 * measured (kiln train --profile), written as tab-separated text. */
typedef struct {
    int step;         /* the first plan step behind the row */
    const char *kind; /* "gemm", "kernel", "copy", "comm" */
    const char *name; /* cg_step_key */
    char shape[64];   /* GEMM: MxNxK or MxNxKxBATCH; else "-" */
    double calls, ms, flops, bytes; /* per step */
    const char *op;   /* IR opcode name of the step's op; NULL: none */
    const char *file; /* the op's script file and line; NULL: unknown */
    int line;
} CgKtLine;
typedef struct {
    const char *source; /* "predicted" or "measured" */
    const char *device; /* cost-model device, or the backend's */
    int64_t steps;      /* steps the figures are averaged over */
    double step_ms;     /* the whole step: predicted, or the measured median */
} CgKtMeta;
/* The name a plan step's launches go by in profiles and tables: the kernel's
 * (generated kernels are named by content), "gemm_op<N>" for the GEMM of IR
 * op N, "copy", ... (interned). */
const char *cg_step_key(const CgPlan *p, int s);
const char *cg_step_class(const CgPlan *p, int s); /* "gemm", "kernel", "copy", "comm" */
void cg_step_shape(const CgPlan *p, int s, char *buf, size_t n);
/* A zero row for plan step s: kind, name, shape, op and script line. */
void cg_ktable_row_init(CgKtLine *row, const CgPlan *p, int s);
/* The prediction's launches summed per name; *rows is the caller's to free. */
int cg_ktable_from_prediction(const CgPrediction *r, const CgPlan *p, CgKtLine **rows);
/* Writes the table to path (through path.tmp, renamed when whole). */
bool cg_ktable_write(const char *path, const CgKtMeta *m, const CgKtLine *rows, int n, Diag *d);

/* ---- calibrate.c: per-kernel tables, and calibration against them ------
 * (docs/cost.md: the format, and what --calibrate prints) */
typedef enum { CG_KT_GEMM, CG_KT_KERNEL, CG_KT_COPY } CgKtKind;
typedef struct {
    CgKtKind kind;
    char *name, *op, *where;
    int64_t dims[4];  /* gemm: M, N, K, batch */
    int64_t calls;    /* launches a step */
    double ms, flops, bytes; /* per step, over those launches */
    int line;         /* in the file */
} CgKtRow;
typedef struct {
    char *source, *device; /* NULL: not given */
    int steps;             /* 1 when not given */
    double step_ms;        /* 0: not given */
    VEC(CgKtRow) rows;
} CgKernelTable;
/* A table from text[0..len) (the file path for messages): NULL with d set
 * ("path:line: what was expected, what was found") on anything malformed.
 * Unknown metadata keys are ignored; the first line is required. */
CgKernelTable *cg_kernel_table_parse(const char *text, size_t len, const char *path, Diag *d);
CgKernelTable *cg_kernel_table_read(const char *path, Diag *d);
void cg_kernel_table_free(CgKernelTable *t);
/* Prints, per kernel class (CgClass) of prediction r of plan p, the
 * measured time of table t's rows whose names r's launches carry (a GEMM:
 * gemm_op<N>), the predicted time, their ratio and the device figure that
 * would have predicted the measurement; then what did not match. */
void cg_calibrate(const CgPrediction *r, const CgPlan *p, const CgKernelTable *t,
                  const char *path, FILE *f);

/* ---- cluster.c: a run at cluster scale (kiln plan) ------------------------
 * (docs/plan.md: the equations) */
typedef struct {
    double nparams;
    int64_t seq_len, d_model, layers, micro_batch; /* T, C, L, sequences */
    double act_dtype_bytes;   /* TP collectives move activations of this size */
    double param_bytes, opt_bytes; /* the whole model's */
    double grad_bytes;        /* the whole model's gradients (their storages) */
    /* The step's memory timeline on one device for one micro-batch (the
     * memory plan; docs/plan.md): per op, the bytes of gradients live
     * (mem_grad), of the other temporaries (mem_act), and of those the
     * activations saved for backward (mem_saved). mem_nops 0: no timeline,
     * act_bytes is the other temporaries' peak. */
    int mem_nops;
    const double *mem_grad, *mem_act, *mem_saved;
    double act_bytes;         /* without a timeline: the non-gradient temporaries' peak */
    double fwd_bwd_s, forward_s, opt_s; /* one device, the whole model, one micro-batch */
    double backward_end_s;    /* when the step's last gradient is ready */
    double wgrad_s;           /* of fwd_bwd_s, the weight-gradient GEMMs (ir_wgrad_matmul):
                                 a pipeline's W, which zb-h1 moves into the bubble */
    int nbuckets;
    const double *bucket_bytes, *bucket_ready_s; /* per DP bucket, step order */
    const int *bucket_coll;   /* per DP bucket: its CgColl; NULL: all all-reduces */
    bool opt_sharded;         /* the step was compiled with zero=1 for dp ranks:
                                 opt_bytes and opt_s are one DP rank's shard */
    /* tp_split > 1: the step was compiled partitioned for tp_split ranks
     * (passes/partition.c): param, state and gradient bytes, the memory
     * timeline and every time are one TP rank's, and its TP collectives are
     * the ntp of one micro-batch's step (whole bytes, CgColl kind), costed
     * instead of Megatron's four all-reduces per layer. nparams stays the
     * whole model's (MFU). */
    int tp_split, ntp;
    const double *tp_bytes;
    const int *tp_coll;
    /* nstages > 0: the compiler's cut for pp = nstages (passes/stages.c),
     * each stage's programs compiled and timed as the pipeline runs them;
     * kiln plan then takes the step from stages[] and the schedule's
     * simulation instead of the ideal split (cg_cluster_project). */
    int nstages;
    const struct CgStageModel *stages;
    /* per TP collective: seconds of the step's compute between it and its
     * first reader (what may hide it: runtime/exec.c starts it and waits
     * there); NULL: none */
    const double *tp_hide_s;
} CgClusterModel;

/* One pipeline stage of the cut, one micro-batch (docs/plan.md): its F, B
 * and W programs' compute seconds and TP collectives (per program: count
 * and bytes of all-reduces, and of reduce-scatters and all-gathers), the
 * bytes of the params it owns, the bytes it holds per micro-batch from its
 * F until its W has run (held_f: what F leaves for B and W, and the
 * received activation) and from its B until its W (held_b: what B leaves
 * for W), the peak other temporaries of its largest program, and the
 * bytes it sends to the next stage (and receives back as their gradient).
 * first_op, nops, layers: its ops of the forward graph and the attention
 * layers among them; nparams: the params it owns. */
typedef struct CgStageModel {
    double t[3];               /* F, B, W seconds */
    int tp_n[3][2];            /* [program][0: all-reduce, 1: reduce-scatter/all-gather] */
    double tp_bytes[3][2];
    double param_bytes, held_f, held_b, tmp_bytes, send_bytes;
    /* per program, the bytes the CPU runtime copies between its buffers
     * and the program each micro-batch (runtime/dist/pp.c: the stash and
     * what is received in, the stash and what is sent out, the params'
     * gradients out and summed; a copy reads and writes each byte): with
     * CgClusterOpts.stage_bw > 0, 2 x copy_bytes / stage_bw seconds more */
    double copy_bytes[3];
    int first_op, nops, layers, nparams;
} CgStageModel;

/* A pipeline's schedule (docs/plan.md): 1F1B (Megatron), GPipe (every
 * forward, then every backward), ZB-H1 (zero bubble: each backward's
 * weight gradients, W, run in the slots where 1F1B idles). */
typedef enum { CG_PP_1F1B, CG_PP_GPIPE, CG_PP_ZBH1, CG_PP__N } CgPipeSchedule;
const char *cg_pp_schedule_name(CgPipeSchedule s); /* "1f1b", "gpipe", "zb-h1" */

typedef struct {
    int gpus, gpus_per_node, tp, pp, dp, zero, micro_batches;
    CgPipeSchedule schedule;
    double intra_bw, inter_bw; /* bytes/s */
    double alpha_s;            /* latency per ring hop */
    double tp_alpha_s, tp_bw;  /* tp_bw > 0: the TP collectives' link inside a node
                                  (and its alpha), when it differs from the DP one (the
                                  CPU: measured apart, runtime/dist/measure_mpi.c);
                                  tp_bw 0: alpha_s, intra_bw */
    double stage_bw;           /* > 0: a DP bucket is staged through host memory
                                  (the CPU transport: packed, scaled, unpacked,
                                  6 x bytes moved at this bandwidth); 0: in place */
    double peak;               /* per GPU, FLOP/s (MFU) */
    double tokens, goodput, target_days; /* 0: not given */
    double step_time;          /* > 0: a measured step replaces the prediction */
    bool no_overlap;
} CgClusterOpts;

typedef struct {
    double sequences, tokens_per_step;
    double mem_params, mem_grads, mem_opt, mem_act, mem_total; /* per GPU */
    double mem_saved;         /* of mem_act, the activations saved for backward */
    bool grads_resident;      /* every gradient counted for the whole step (micro-batches
                                 accumulate into them); else those live at mem_op */
    int mem_op;               /* the timeline's op where mem_total peaks; -1: none */
    int inflight;             /* micro-batches whose activations the first stage holds */
    double t_mb, t_tp_mb, bubble, t_pipeline, t_bubble, t_opt; /* seconds */
    double t_tp_exposed_mb;   /* of t_tp_mb, what the compute up to each collective's
                                 first reader does not hide (a partitioned step with
                                 tp_hide_s; else t_tp_mb). The step counts t_tp_mb. */
    double dp_bw, t_dp, t_dp_exposed;
    double step_predicted, step;
    double tokens_per_s, mfu, mfu_attn;
    bool cut;                 /* the pipeline's times and memory come from the stage
                                 cut and the schedule's simulation (m->nstages); else
                                 the ideal split and the formulas */
    int crit_stage;           /* cut: the stage with the most memory (-1: none) */
    int64_t steps;            /* whole steps to the token budget */
    double days, days_goodput, step_for_target;
} CgClusterPlan;

/* The memory rows of p (mem_*) alone, as cg_cluster_project sets them. */
void cg_cluster_memory(const CgClusterModel *m, const CgClusterOpts *o, CgClusterPlan *p);
/* ZB-H1's memory bound: no stage of the cut holds more than this many
 * times 1f1b's peak memory per GPU (the most over its stages). */
#define CG_ZBH1_MEM 1.10
/* Into wcap (m->nstages entries) the most W's each stage keeps waiting
 * under o's schedule (pass_stage_schedule_capped): under zb-h1 with the
 * stages' held bytes known, lowered from the default (stage t: t) until
 * no stage needs more than CG_ZBH1_MEM x 1f1b's peak; otherwise the
 * default. cg_cluster_stage(s) and cg_cluster_pipeline run these. Returns
 * m->nstages. */
int cg_cluster_zbh1_caps(const CgClusterModel *m, const CgClusterOpts *o, int *wcap);
/* Stage s of m's cut (m->nstages > 0) under o: its memory per GPU into the
 * mem_* rows of p (params, grads, optimizer state, the activations it holds
 * where its schedule holds the most, mem_saved, and its largest program's
 * temporaries; p->inflight: the most micro-batches it holds at once, F run
 * and W not, under o->schedule, zb-h1's capped by cg_cluster_zbh1_caps),
 * and its busy seconds
 * per step (m x (F + B + W + its TP collectives)) as the return value. */
double cg_cluster_stage(const CgClusterModel *m, const CgClusterOpts *o, int s,
                        CgClusterPlan *p);
/* cg_cluster_stage for every stage of the cut at once, the schedule's
 * orders and zb-h1's caps computed once: ps[s] (zeroed first) and busy[s]
 * for s < m->nstages. */
void cg_cluster_stages(const CgClusterModel *m, const CgClusterOpts *o, CgClusterPlan *ps,
                       double *busy);
/* The largest micro-batches x stages^2 whose schedule cg_cluster_project
 * simulates (its time grows so); beyond, the formulas. */
#define CG_PP_SIM_MAX 4194304.0
/* Seconds of one micro-batch's program k (0 F, 1 B, 2 W) on stage s under
 * o: its compute (over tp for an ideal split) and TP collectives. */
double cg_cluster_stage_prog(const CgClusterModel *m, const CgClusterOpts *o, int s, int k);
/* The pipeline's makespan for one step under o->schedule: each stage runs
 * its actions in the order pass_stage_schedule gives them (the compiled
 * program's), each F, B and W taking the stage's time (its TP collectives
 * included), an activation or gradient crossing boundary s after
 * send_bytes / bw + alpha (bw: o's link between pipeline neighbours).
 * m->nstages > 0. */
double cg_cluster_pipeline(const CgClusterModel *m, const CgClusterOpts *o);
double cg_ring_allreduce(double bytes, int n, double bw, double alpha);
double cg_ring_half(double bytes, int n, double bw, double alpha);
/* False with why set when the layout does not add up. */
bool cg_cluster_project(const CgClusterModel *m, const CgClusterOpts *o, CgClusterPlan *p,
                        char *why, size_t nwhy);

#endif
