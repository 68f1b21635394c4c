/*
 * codegen.h - from a scheduled graph and its memory plan to a Plan: buffers
 * (arena offsets), kernels (a target-neutral description plus printed
 * source) and steps (kernel launch, GEMM, copy). The public header of
 * codegen/.
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

typedef enum { CG_RED_SUM, CG_RED_MAX } CgRedOp;

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
 * (the C target does; any other prints them inline). */
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

/* ---- cprint.c: the C printer -------------------------------------------- */

/* The prelude every generated C file starts with (types, helpers, the
 * counter hash of ir_rand_u01). */
extern const char cg_c_prelude[];
/* Appends kernel k as a C function `void NAME(params..., [uint64_t seed,
 * int64_t step,] int64_t part, int64_t nparts)`: the call computes part
 * `part` of `nparts` (a share of every loop's first outer dim when
 * k->parallel; part 0 does everything otherwise). */
void cg_print_c_kernel(CgBuf *b, const CgKernel *k);

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
} CgStepKind;

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
    int nargs;     /* CG_STEP_ALLREDUCE_START: number of args */
    int group;     /* fuse group of the step's op(s); -1 for a single op */
    int by_epilogue; /* CG_STEP_KERNEL: -1, or the GEMM step whose epilogue
                        computes everything this step writes (see CgEpilogue) */
    double flops, bytes_moved; /* the IR's counts for the step (a fused
                                  kernel: its members' FLOPs, the bytes it
                                  reads and writes) */
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
void cg_plan_free(CgPlan *p);
/* Byte offset of a tensor's data in the arena. */
int64_t cg_offset(const CgPlan *p, int tensor);

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

/* ---- cuda.c: the CUDA C printer (NVRTC) --------------------------------
 * Each CgLoop of a kernel becomes one __global__ function NAME_lI, launched
 * in order. A loop whose inner dims are large (a reduction over many
 * elements, stores over a long row) runs one block per outer index (threads
 * share the inner dims, block-wide tree reductions, results broadcast to
 * every thread); a column loop (CgLoop.col) with long columns runs in tiles
 * of 32 columns by 8 row groups (partials meet in shared memory); any other
 * loop runs one thread per outer index with the inner dims as plain loops.
 * Buffers stored as bf16 are computed in f32 and rounded when stored;
 * accumulators are f32 (never bf16). Accumulating stores are atomic. Phase
 * lets are locals; in a store phase each store follows the lets it needs
 * (lets that read a buffer come before any store to it). Kernels that draw random
 * numbers take a device pointer to {seed, step} after the buffers (so a
 * captured CUDA graph sees each step's values). The source is
 * self-contained: no headers, no include path. */
typedef struct {
    char *name;       /* __global__ function */
    int kernel;       /* plan kernel index */
    bool rows;        /* one block per outer index */
    bool cols;        /* column tiles: 32 outer indices x 8 row groups per block;
                         neither: one thread per outer index */
    int64_t n;        /* outer iterations */
    int threads;      /* block size */
    int64_t blocks;   /* grid size (grid-stride loops cover n) */
    int nparam;       /* the function takes pointers to the buffers of kernel
                         params param[0..nparam) (ascending: the params its
                         loop reads or writes), then, when rand, the
                         {seed, step} pointer */
    int *param;
    bool rand;
} CgCudaFn;

/* A copy step in the device arena's terms (CgCudaProgram.copy). */
typedef struct {
    int64_t dst, src, bytes;
} CgCudaCopy;

typedef struct CgCudaProgram {
    const struct CgPlan *plan; /* borrowed */
    char *source;      /* the whole translation unit */
    VEC(CgCudaFn) fn;
    int *step_fn;      /* per plan step: first fn of a kernel step (its fns are
                          consecutive), -1 for other steps */
    int *step_nfn;     /* per plan step: number of fns */
    DType *storage;    /* per tensor id: dtype of its buffer in device memory */
    bool bf16;         /* mixed precision: eligible activations stored as bf16 */
    /* The device arena: plan->mem when every buffer keeps its dtype, else
     * (bf16) the same storages and live ranges re-planned with the storage
     * dtypes' sizes (pass_memplan_storage), so bf16 activations take half
     * the bytes. Offsets of params, state and inputs are the plan's; graph
     * outputs and other temps may move. */
    MemPlan *mem;
    CgCudaCopy *copy;  /* per plan step: a CG_STEP_COPY in mem's offsets */
    /* Host reads and writes name plan offsets (cg_offset): the graph
     * outputs' plan offsets (src) and device offsets (dst), bytes = size */
    CgCudaCopy *outs;
    int nouts;
    /* Per plan step: the epilogue the GEMM applies on the device (see
     * cg_cuda_program), CG_EPI_NONE for none and for other steps. */
    CgEpilogue *epi;
} CgCudaProgram;

/* A GELU_AUX_BIAS / DGELU* pair (CgGemm.pair) runs both epilogues or
 * neither: drops the one whose partner is dropped (epi[] per plan step,
 * CG_EPI_NONE: none). */
static inline void cg_cuda_pair_epilogues(const struct CgPlan *p, CgEpilogue *epi)
{
    for (int s = 0; s < p->steps.n; s++) {
        int pr = p->steps.v[s].kind == CG_STEP_GEMM ? p->steps.v[s].gemm.pair : -1;
        if (pr >= 0 && (epi[s] == CG_EPI_NONE || epi[pr] == CG_EPI_NONE))
            epi[s] = epi[pr] = CG_EPI_NONE;
    }
}

/* Whether plan step s is replaced by the epilogue its GEMM (by_epilogue)
 * applies, given the epilogue each GEMM step applies (epi[], as
 * CgCudaProgram.epi after a backend's own refusals): a bias-gradient
 * reduction only when the applied epilogue computes the bias gradient. */
static inline bool cg_cuda_step_replaced(const struct CgPlan *p, const CgEpilogue *epi, int s)
{
    int by = p->steps.v[s].by_epilogue;
    if (by < 0 || epi[by] == CG_EPI_NONE)
        return false;
    CgEpilogue planned = p->steps.v[by].gemm.epilogue;
    bool bgrad_step = planned == CG_EPI_BGRAD_A || planned == CG_EPI_BGRAD_B ||
                      (planned == CG_EPI_DGELU_BGRAD && s != by + 1);
    return !bgrad_step || cg_epilogue_has_bgrad(epi[by]);
}

/* The device arena offset of host access [off, off + bytes) given in the
 * plan's offsets: the persistent region is the same in both; a graph output
 * moves with its storage; -1 for anything else. Inline: the CUDA module
 * links nothing of kiln's own libraries. */
static inline int64_t cg_cuda_host_offset(const CgCudaProgram *q, int64_t off, int64_t bytes)
{
    if (off + bytes <= q->mem->persistent_bytes)
        return off;
    for (int i = 0; i < q->nouts; i++)
        if (off >= q->outs[i].src && off + bytes <= q->outs[i].src + q->outs[i].bytes)
            return q->outs[i].dst + (off - q->outs[i].src);
    return -1;
}

/* Prints every kernel the plan's steps launch, and decides the GEMM
 * epilogues the device applies (CgCudaProgram.epi): the plan's, where c, d
 * and aux share D's storage type (f32, or bf16: the backend then passes a
 * bf16 copy of the f32 bias, cuBLASLt's bias having D's type), the GELU
 * input's leading dimension is a multiple of 8, and the writes are safe in
 * the device arena (cg_epilogue_safe); a bias gradient only into an f32 D
 * (in bf16 DGELU_BGRAD becomes DGELU and the f32 reduction runs as planned,
 * so the gradient is not rounded to bf16); pairs both or neither.
 * bf16: store float temps that
 * are activations (not reduce results, scatter results, values computed
 * from constants and indices only, graph outputs, update values, optimizer
 * inputs or anything sharing storage with them) as bf16; kernels shared by
 * steps with different storage or aliasing get one variant each. Also emits
 * kiln_cast_f32_bf16(const float*, bf16*, n) for GEMM operands. */
CgCudaProgram *cg_cuda_program(const CgPlan *p, bool bf16);
void cg_cuda_program_free(CgCudaProgram *q);
/* Appends kernel k's functions (storage[i]: dtype of param i in memory;
 * NULL: the params' own), filling fn (k->loops.n entries). */
void cg_print_cuda_kernel(CgBuf *b, const CgKernel *k, const char *name, const DType *storage,
                          CgCudaFn *fn);
extern const char cg_cuda_prelude[];
extern const CgTarget cg_target_cuda;

#endif
