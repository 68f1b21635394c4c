/*
 * cg_cuda.h - codegen's CUDA half: the CUDA C printer (cuda_print.c) and the
 * CUDA program of a plan (cuda_plan.c: storage types, the device arena, the
 * GEMM epilogues the device applies, kernel variants), read by the CUDA
 * module (runtime/cuda/), the emulated device (tests/emu) and the kernel
 * dumps. codegen.h holds what the C printer, the plan and the executor
 * share; this header adds what only a CUDA target needs.
 *
 * Named cg_cuda.h, not cuda.h: codegen/ is on the CUDA module's include
 * path, where a codegen/cuda.h would hide the toolkit's <cuda.h>.
 *
 * The inline helpers at the end are inline on purpose: the CUDA module
 * links nothing of kilncore (libkiln_cuda.so is built with
 * -Wl,--no-undefined against NVRTC and cuBLASLt only), yet it must decide
 * exactly as cg_cuda_program and the emulator do.
 */
#ifndef KILN_CG_CUDA_H
#define KILN_CG_CUDA_H

#include "codegen.h"

/* ---- cuda_print.c: the CUDA C printer (NVRTC) ----------------------------
 * Each CgLoop of a kernel becomes one __global__ function NAME_lI, launched
 * in order. A loop whose inner dims are large (a reduction over many
 * elements, stores over a long row) runs one block per outer index (threads
 * share the inner dims, block-wide tree reductions, results broadcast to
 * every thread); a column loop (CgLoop.col) with long columns runs in tiles
 * of 32 columns by 8 row groups (partials meet in shared memory); any other
 * loop runs one thread per outer index with the inner dims as plain loops.
 * A block or tile loop with few outer indices (tiles) over long inner
 * extents is split: several blocks per outer index (tile), in stages
 * NAME_lI_sK; reductions write per-block partials into the partials
 * scratch, and the next stage combines them in a fixed order (no float
 * atomics: deterministic). docs/cuda.md, Kernels.
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
    int loop;         /* the kernel's loop it computes (a split loop: several
                         functions in a row, one per stage) */
    int nloops;       /* horizontal (cuda_multi.c): loops [loop, loop + nloops)
                         in one function, one block per chunk of the chunk
                         table; 0 or 1: the one loop */
    bool rows;        /* one block per outer index (split: `split` blocks) */
    bool cols;        /* column tiles: 32 outer indices x 8 row groups per block
                         (split: `split` blocks per tile, each a share of the
                         rows); neither: one thread per outer index */
    int64_t n;        /* outer iterations */
    int64_t split;    /* blocks sharing one outer index (rows) or one tile
                         (cols); 1: a whole one per block */
    int threads;      /* block size */
    int64_t blocks;   /* grid size (grid-stride loops cover n * split) */
    int nparam;       /* the function takes pointers to the buffers of kernel
                         params param[0..nparam) (ascending: the params its
                         loop reads or writes), then, when rand, the
                         {seed, step} pointer, then, when part, the partials
                         scratch */
    int *param;
    bool rand;
    bool part;        /* takes the partials scratch (unsigned char *) last */
    bool ticket;      /* split in two stages run as one launch: the last block
                         of an outer index (tile) to finish, counted by the
                         ticket at kiln_part[u] (unsigned int), combines the
                         partials and runs the second stage */
    int64_t part_bytes; /* bytes of the scratch it reads or writes, from 0 */
    /* ptxas' figures (cg_cuda_ptxas; regs 0: not known): registers per
     * thread, static shared memory per block, spill stores + loads, bytes */
    int regs, smem, spill;
    bool attn;        /* a fused attention function (cuda_attn.c), costed by: */
    double flops, bytes; /* attn: FLOPs of the tiles it visits, bytes it moves */
    bool mma;         /* attn: its products run on tensor cores (bf16) */
    bool attn_fwd;    /* attn: the forward (costed at its own efficiency) */
    double attn_reread, attn_head; /* attn: cg_cuda_attn_reuse's figures */
    int64_t attn_tiles; /* attn: blocks per batch*head (consecutive blockIdx) */
    /* attn: what predict.c's design model counts (docs/cost.md, Attention):
     * its CgCudaAttnKind, warps per block (16 rows each), the other tile's
     * length, the head sizes, and the products it computes */
    int attn_kind, attn_nw, attn_bt, attn_d, attn_dv;
    bool attn_o, attn_dk;
    /* rows kept in registers between phases (cuda_rowcache.c): kernel
     * params cached[0..ncached), each cache_trips x cache_words[i] uint4 */
    int ncached, cache_trips;
    int *cached, *cache_words;
    bool range;       /* a flat kernel's NAME_range (cg_print_cuda_range): takes
                         int64_t lo, hi after its buffers; blocks is the
                         launch's, from hi - lo */
} CgCudaFn;

/* Which params of one printed variant of a kernel share a buffer:
 * cls[i] == cls[j] when params i and j are the same buffer; `all` when some
 * buffers overlap partially (then every pair conflicts). A store phase
 * prints, before each store, every let still to come that reads a buffer
 * the store may write. */
typedef struct {
    const int *cls;
    bool all;
    const bool *a16; /* per param: its buffer starts 16-byte aligned (NULL:
                        not known; then no 16-byte accesses) */
} CgCudaAlias;

extern const char cg_cuda_prelude[];
extern const CgTarget cg_target_cuda;
/* kiln_cast_f32_bf16(const float *x, kiln_bf16 *y, int64_t n): the cast of
 * GEMM operands a bf16 program appends after the prelude (grid-stride,
 * 256 threads per block). */
extern const char cg_cuda_cast_kernel[];
/* Appends kernel k's functions (storage[i]: dtype of param i in memory;
 * NULL: the params' own); returns how many, in launch order, in *fn
 * (allocated; free with cg_cuda_fns_free). Params conflict when they name
 * the same tensor or the kernel is not noalias. */
int cg_print_cuda_kernel(CgBuf *b, const CgKernel *k, const char *name, const DType *storage,
                         CgCudaFn **fn);
/* The same for one variant whose params' buffers are known (al). */
int cg_print_cuda_variant(CgBuf *b, const CgKernel *k, const char *name, const DType *storage,
                          const CgCudaAlias *al, CgCudaFn **fn);
/* A flat kernel's (CgKernel.flat) range function NAME_range(buffers...,
 * int64_t lo, int64_t hi): its elements [lo, hi) only, the same code per
 * element as the kernel's own function, 256 threads per block, grid-stride
 * (the launch sizes the grid from hi - lo). Fills *fn (name, params,
 * threads; range set); false, printing nothing, for a kernel that is not
 * flat. */
bool cg_print_cuda_range(CgBuf *b, const CgKernel *k, const char *name, const DType *storage,
                         const CgCudaAlias *al, CgCudaFn *fn);
/* Frees the names and param lists of fn[0..n) and fn itself. */
void cg_cuda_fns_free(CgCudaFn *fn, int n);

/* ---- cuda_row.c: 16-byte accesses in row loops (the printer's) ----------
 * A phase of a row loop (one block per outer index) whose params are read
 * or written a vector of `vec` consecutive elements at a time (see
 * cuda_row.c for when a param qualifies). */
typedef struct {
    int vec;     /* elements per thread and vector: 4 (f32 only) or 8 */
    int var;     /* the phase's innermost loop var */
    int n;       /* vector params */
    int *param;  /* [n] their indices */
    bool *ld, *st; /* [n] loaded, stored by the phase */
    int *index;  /* [n] an index expression of one of its accesses: the
                    vector's first element when var is its first */
    int trips;   /* > 0: the phase runs `trips` unrolled iterations per
                    thread and cache[] says which params use the row cache */
    int *cache;  /* [n] 0, or 1: loads fill kiln_c<p>, 2: loads read it
                    (cuda_rowcache.c) */
} CgCudaVec;
/* Whether phase ph (storage: params' dtypes in memory; al: the variant's
 * buffers) has vector params; fills v (free with cg_cuda_vec_free). */
bool cg_cuda_vec_plan(const CgKernel *k, const CgPhase *ph, const DType *storage,
                      const CgCudaAlias *al, CgCudaVec *v);
void cg_cuda_vec_free(CgCudaVec *v);
/* Whether function f keeps kernel param p's row in registers between its
 * phases (cuda_rowcache.c): then it is read from memory once. */
bool cg_cuda_row_cached(const CgCudaFn *f, int p);
/* Around the phase's scalar body, inside a loop whose vars are declared at
 * the vector's first element: the loads and the element loop's head
 * (the body goes at depth + 1), then its end and the stores. */
void cg_cuda_vec_open(CgBuf *b, const CgKernel *k, const CgCudaVec *v, const DType *storage,
                      int depth);
void cg_cuda_vec_close(CgBuf *b, const CgCudaVec *v, const DType *storage, int depth);
/* x rounded up to a multiple of 16: a head size as the attention kernels
 * tiles and accumulators pad it (cuda_attn.c, cuda_attn_bwd.c) */
static inline int64_t cg_pad16(int64_t x) { return (x + 15) / 16 * 16; }

/* ---- cuda_attn.c: the fused attention kernels (OC_ATTN) -----------------
 * Flash-attention style (docs/cuda.md, Attention): a forward kernel writing o
 * and/or lse, a dq kernel, and one kernel writing dk and/or dv; no T x T
 * tensor in memory, causal tiles skipped, bf16 products on tensor cores
 * (mma.sync m16n8k16), f32 with FMAs; deterministic (no atomics). */
/* BWD (cuda_attn_bwd.c): dq, dk and dv in one kernel, one block per key
 * tile, dq summed over key tiles in a fixed order in the partials scratch. */
typedef enum { CG_CUDA_ATTN_FWD, CG_CUDA_ATTN_DQ, CG_CUDA_ATTN_DKDV, CG_CUDA_ATTN_BWD } CgCudaAttnKind;
typedef struct {
    CgCudaAttnKind kind;
    bool causal;
    double scale;
    DType dt;                /* storage of q, k, v, dO and the outputs: f32 or bf16 */
    int64_t bh, tq, tk, d, dv; /* batch*heads, lengths, head sizes */
    bool want_o, want_lse;   /* FWD: which it writes (at least one) */
    bool want_dk, want_dv;   /* DKDV: which it writes (at least one) */
    bool one_dkv;            /* DKDV writing both: dk and dv are one buffer
                                (attention_dqkv's; lay puts each at its
                                columns), one param `dkv`; BWD: dq, dk and
                                dv are one buffer, one param `dqkv` */
    IrAttnLayout lay;        /* where each tensor's (b, h, i, d) sits (bh = nb * nh);
                                lay.nh 0: the plain layout of bh, tq, tk, d, dv */
    DType bdt;               /* lay.bias: the bias or mask param's storage (f32,
                                bf16 or u8), the functions' last param `bx` */
} CgCudaAttn;
/* The device templates every attention function calls (cuda_attn_lib.c);
 * a program prints it once, after cg_cuda_prelude, before its attention
 * functions. */
extern const char cg_cuda_attn_lib[];
/* The fused backward's template (cuda_attn_bwd.c), printed after
 * cg_cuda_attn_lib. */
extern const char cg_cuda_attn_bwd_lib[];
/* The fused backward a (kind BWD) with tiles (nw 16-key warps, bt queries a
 * tile): its counters (one unsigned each at the start of the partials
 * scratch: the ticket, then one per batch*head and query tile) and the
 * scratch bytes it uses (counters in the zeroed front, then the f32 dQ
 * accumulator [bh, query tiles * bt, head size padded to 16] at
 * CG_CUDA_SCRATCH_ZERO). */
int64_t cg_cuda_attn_bwd_counters(const CgCudaAttn *a, int bt);
int64_t cg_cuda_attn_bwd_scratch(const CgCudaAttn *a, int bt);
/* Whether a (kind BWD) fits: dtype, tiles, counters within the zeroed
 * front, a 32-bit grid. Else the plan's two kernels (dq, dk/dv) run. */
bool cg_cuda_attn_bwd_fits(const CgCudaAttn *a);
/* Warps per block (nw; 16 rows each) and the other tile's length (bt: keys
 * of a forward/dq tile, queries of a dk/dv tile) for a: false when even
 * the smallest tiles do not fit 48 KiB of shared memory. */
bool cg_cuda_attn_tiles(const CgCudaAttn *a, int *nw, int *bt);
/* Grid size: batch*heads x query tiles (FWD, DQ) or key tiles (DKDV, BWD). */
int64_t cg_cuda_attn_blocks(const CgCudaAttn *a, int nw);
/* What the function of a does with tiles (nw, bt): the FLOPs of the
 * products over the tile pairs it visits (causal: the diagonal and below),
 * and the bytes it moves: its own tile once per block, the other operand's
 * tiles once per visit, a bias or mask one element per cell of a visited
 * tile pair, outputs once (storage dtypes). */
void cg_cuda_attn_cost(const CgCudaAttn *a, int nw, int bt, double *flops, double *bytes);
/* The part of cg_cuda_attn_cost's bytes that re-reads rows: *reread, the
 * other operand's visits past the first of each row (every batch*head),
 * and a bias's past the first of each cell, which L2 serves while the
 * head's rows stay cached, and *head, that operand's bytes in one
 * batch*head and its share of the distinct bias bytes (the working set
 * one head's blocks add). Predict decides from the device's L2 which of them DRAM sees. */
void cg_cuda_attn_reuse(const CgCudaAttn *a, int nw, int bt, double *reread, double *head);
/* Appends `extern "C" __global__ void NAME(...)` computing a. Parameters,
 * in this order, only those used: FWD (q, k, [v, o], [lse]); DQ (q, k, v,
 * dO, lse, delta, dq); DKDV (q, k, [v], dO, lse, [delta, dk], [dv]) (v
 * and delta only with dk; one_dkv: dk and dv as one param dkv); BWD (q,
 * k, v, dO, lse, delta, dq, dk, dv, or with one_dkv one param dqkv; then
 * the partials scratch, fn->part). Fills fn's geometry (threads, blocks; not its
 * name or params) when fn is not NULL. False with d set for an
 * unsupported dtype or head size. */
bool cg_print_cuda_attn(CgBuf *b, const CgCudaAttn *a, const char *name, CgCudaFn *fn, Diag *d);
/* A plan's attention kernel (k->attn.kind != CG_ATTN_NONE, codegen.h's
 * CgAttn) as one function: cg_print_cuda_kernel and _variant print it
 * through this (storage: each param's dtype in memory; al: its buffer
 * classes, or NULL). Returns 1 with *fn allocated (name, params, geometry,
 * cost), or 0 (nothing to launch) for attention_dqkv's dq kernel when its
 * dk/dv kernel runs as the fused backward (CG_CUDA_ATTN_BWD, which then
 * writes dq too: cg_cuda_attn_bwd_fits). Dies when its tensors do not share one storage type (lse and
 * delta f32), an output shares a buffer, or the head size does not fit. */
int cg_print_cuda_attn_kernel(CgBuf *b, const CgKernel *k, const char *name,
                              const DType *storage, const CgCudaAlias *al, CgCudaFn **fn);

/* ---- cuda_plan.c: the CUDA program of a plan ---------------------------- */

/* A copy step in the device arena's terms (CgCudaProgram.copy). */
typedef struct {
    int64_t dst, src, bytes;
} CgCudaCopy;

/* The partials scratch starts with the ticket counters of split
 * reductions (CgCudaFn.ticket): one unsigned int per outer index or tile,
 * zero when the backend allocates the scratch and set back to zero by the
 * block that finishes last, so every launch (and graph replay) finds them
 * zero. Partials follow. */
enum { CG_CUDA_TICKET_BYTES = 2048 };
/* The zeroed front of the scratch: the split tickets (its first
 * CG_CUDA_TICKET_BYTES) and the fused attention backward's counters
 * (cuda_attn_bwd.c) both start at 0 and are left zero by each launch;
 * partials follow at CG_CUDA_SCRATCH_ZERO. */
enum { CG_CUDA_SCRATCH_ZERO = 65536 };

typedef struct CgCudaProgram {
    const struct CgPlan *plan; /* borrowed */
    char *source;      /* the whole translation unit */
    VEC(CgCudaFn) fn;
    int *step_fn;      /* per plan step: first fn of a kernel step (its fns are
                          consecutive), -1 for other steps */
    int *step_nfn;     /* per plan step: number of fns */
    int *step_range;   /* per plan step: the fn (CgCudaFn.range) of a flat kernel's
                          variant that runs elements [lo, hi) (the step's CgStep.lo,
                          hi when hi > lo: zero=1's update in pieces), -1: none */
    DType *storage;    /* per tensor id: dtype of its buffer in device memory */
    /* Bytes of the partials scratch (CgCudaFn.part): one device buffer the
     * backend allocates beside the arena, shared by every function that
     * takes it (launches on one stream run one after another; a split
     * loop's stages use disjoint parts of it); 0: none needed. */
    int64_t part_bytes;
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
    int ptxas_fns;     /* functions with ptxas' figures (cg_cuda_ptxas) */
    /* bf16 copies of f32 GEMM operands kept through a step (cuda_cast.c),
     * per plan step s and operand o (0: a, 1: b) at [2 s + o]: cast_off,
     * the operand's copy in the weight-copy buffer (cast_bytes bytes, one
     * device buffer beside the arena), or -1: cast into the per-GEMM
     * scratch right before the GEMM. The copies are filled by groups of
     * casts, one launch of kiln_cast_f32_bf16_multi each: cast_group[s],
     * the group launched right before GEMM step s (-1: none); group i
     * casts tensors cast_t[j] (f32) into the buffer at cast_slot[j], for
     * j in [cast_first[i], cast_first[i + 1]). */
    int64_t *cast_off;
    int64_t cast_bytes;
    int *cast_group;
    int ncast_groups;
    int *cast_first, *cast_t;
    int64_t *cast_slot;
} CgCudaProgram;

/* Decides the storage, the arena and the epilogues, then prints every kernel
 * the plan's steps launch.
 * Epilogues the device applies (CgCudaProgram.epi): the plan's, where c, d
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
/* Per tensor id (caller frees): the dtype its buffer has in device memory,
 * as cg_cuda_program decides it for a plan of g with memory plan m (bf16:
 * mixed precision); needs no CgPlan, so kiln plan can size the activations
 * of every remat candidate as the device stores them. */
DType *cg_cuda_storage(const Graph *g, const MemPlan *m, bool bf16);
void cg_cuda_program_free(CgCudaProgram *q);

/* ---- cuda_cast.c: bf16 copies of f32 GEMM operands ---------------------- */

/* Fills q->cast_off, cast_bytes and the cast groups (q's storage, mem
 * and copy set): a tensor on persistent storage that two or more GEMM
 * steps cast gets a slot; it is cast into it once after each write to its
 * storage, by a group launched no later than its first reader, and the
 * readers read it. */
void cg_cuda_casts(CgCudaProgram *q);
/* kiln_cast_f32_bf16_multi(const kiln_cast_job *job, int njob, int64_t
 * nchunk): every job's cast in one launch (256 threads per block,
 * grid-stride over the chunks). A job is {const float *x; kiln_bf16 *y;
 * int64_t n, c0;} (32 bytes, CG_CUDA_CAST_JOB_BYTES): job j casts x[0, n)
 * into y as chunks c0 .. c0 + ceil(n / CG_CUDA_CAST_CHUNK) - 1 of the
 * launch; c0 ascends from 0 and nchunk is the total. The job table is in
 * device memory. Appended after the prelude by bf16 programs. */
extern const char cg_cuda_cast_multi_kernel[];
enum { CG_CUDA_CAST_CHUNK = 4096, CG_CUDA_CAST_JOB_BYTES = 32 };

/* ---- cuda_occupancy.c: blocks resident per SM ---------------------------- */

/* Blocks of `threads` threads resident on one SM of dev: the thread and
 * block limits, and when known (> 0) the registers per thread (64K per SM,
 * allocated per warp in units of 256) and static shared memory per block
 * (dev->smem_unit per SM, 1 KB reserved per block); at least 1. */
int cg_cuda_blocks_per_unit(const CgDevice *dev, int threads, int regs, int smem);
/* Reads ptxas' report in an NVRTC log (--ptxas-options=-v): per entry
 * function of q, its registers, shared memory and spills (CgCudaFn.regs,
 * smem, spill); sets q->ptxas_fns. Returns how many functions it newly
 * filled. */
int cg_cuda_ptxas(CgCudaProgram *q, const char *log);

/* ---- predict.c: the attention kernels' DRAM bytes ------------------------- */

/* The bytes fused attention function fn (CgCudaFn.attn) reads from and
 * writes to DRAM on dev with per_unit of its blocks resident per SM: its
 * re-reads (CgCudaFn.attn_reread) come from L2 when the heads in flight
 * keep their re-read rows (attn_head each) in dev->l2, else from DRAM
 * (docs/cost.md, Attention). fn->bytes when fn is not attention. */
double cg_attn_dram_bytes(const CgCudaFn *fn, const CgDevice *dev, int per_unit);

/* ---- inline: what the CUDA module decides as cuda_plan.c does ----------- */

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
 * moves with its storage; -1 for anything else. */
static inline int64_t cg_cuda_host_offset(const CgCudaProgram *q, int64_t off, int64_t bytes)
{
    if (off + bytes <= q->mem->persistent_bytes)
        return off;
    for (int i = 0; i < q->nouts; i++)
        if (off >= q->outs[i].src && off + bytes <= q->outs[i].src + q->outs[i].bytes)
            return q->outs[i].dst + (off - q->outs[i].src);
    return -1;
}

#endif
