/*
 * cuda_internal.h - what the CUDA C printer (cuda_print.c) lends the other
 * printers of codegen/ (cuda_multi.c: the horizontal multi-tensor
 * function; cuda_split.c: loops split over many blocks per outer index). Not part of codegen's public header: the names and the
 * contracts are cuda_print.c's, documented there.
 */
#ifndef KILN_CUDA_INTERNAL_H
#define KILN_CUDA_INTERNAL_H

#include "cg_cuda.h"

typedef VEC(CgCudaFn) CgCudaFnVec;

/* cuda_rowcache.c: which params row function f (rows, threads set) keeps
 * in registers between the phases of loop l (sets f->ncached, cached,
 * cache_words, cache_trips); and the role of phase pi for param p (0:
 * none; 1: fills the cache; 2: reads it). */
void cg_cuda_row_cache(const CgKernel *k, const CgLoop *l, const DType *storage,
                       const CgCudaAlias *al, CgCudaFn *f);
int cg_cuda_row_cache_role(const CgKernel *k, const CgLoop *l, const DType *storage,
                           const CgCudaAlias *al, int pi, int p);

/* Marks in var[] the loop variables expression e reads. */
void cg_cuda_mark_used(const CgKernel *k, int e, bool *var);
/* Declares the used variables of dim[0..n) from the flat row-major index
 * named `lin`. */
void cg_cuda_decompose(CgBuf *b, const CgDim *dim, int n, const char *lin, const bool *used,
                       int depth);
/* A store phase's lets and stores (a store phase reads everything before
 * it writes). */
void cg_cuda_store_phase(CgBuf *b, const CgKernel *k, const CgPhase *ph, const DType *storage,
                         const CgCudaAlias *al, int depth);
/* A reduction phase's fold of one element into a<acc>. */
void cg_cuda_fold(CgBuf *b, const CgKernel *k, const CgPhase *ph, int depth);
/* A phase's lets as locals. */
void cg_cuda_lets(CgBuf *b, const CgKernel *k, const CgPhase *ph, int depth);
/* One store. */
void cg_cuda_store(CgBuf *b, const CgKernel *k, const CgStore *s, const DType *storage, int depth);
/* The register type of an accumulator of dtype dt. */
const char *cg_cuda_acc_type(DType dt);
/* The parameter list of f (buffers f->param, then {seed, step}). */
void cg_cuda_print_params(CgBuf *b, const CgKernel *k, const DType *storage, const CgCudaFn *f);
/* A reduction phase's accumulator type (logsumexp: the kiln_lse pair). */
const char *cg_cuda_ph_acc_type(const CgPhase *ph);
/* Whether params a and b may be the same buffer (al NULL: when they name
 * the same tensor or the kernel is not noalias). */
bool cg_cuda_conflict(const CgKernel *k, const CgCudaAlias *al, int a, int b);
/* Marks the params expression e loads (used[]) and whether it draws random
 * numbers (*rand). */
void cg_cuda_mark_loads(const CgKernel *k, int e, bool *used, bool *rand);
/* A row phase's accumulator, declared at the identity and folded. */
void cg_cuda_row_acc(CgBuf *b, const CgKernel *k, const CgPhase *ph, int depth);
/* A row phase's lets, each marked used (a split stage may not read them). */
void cg_cuda_row_lets(CgBuf *b, const CgKernel *k, const CgPhase *ph, int depth);

/* ---- cuda_multi.c: horizontal functions ---------------------------------- */

/* How many loops of k from loop li on (at least 2) run as one horizontal
 * function (docs/cuda.md, Multi-tensor kernels: independent loops, each
 * elementwise or a full reduction followed by the stores of its result);
 * 0: loop li is printed on its own. */
int cg_cuda_horizontal_run(const CgKernel *k, int li);
/* Appends loops [lo, hi) of k (a run cg_cuda_horizontal_run found) as the
 * horizontal function NAME_hLO to out (v: k's f32 view, st: storage per
 * param). */
void cg_cuda_print_horizontal(CgBuf *b, const CgKernel *k, const CgKernel *v, const char *name,
                              int lo, int hi, const DType *st, const CgCudaAlias *al,
                              CgCudaFnVec *out);

/* ---- cuda_split.c: split loops (many blocks per outer index) ------------- */

/* Blocks a grid may have (the printers clamp to it). */
enum { CG_CUDA_MAX_BLOCKS = 1 << 24 };

/* The product of the extents of dim[0..n). */
static inline int64_t cg_cuda_numel(const CgDim *d, int n)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= d[i].n;
    return p;
}

/* How a loop is split (cg_cuda_split_plan; free with cg_cuda_split_free). */
typedef struct {
    int64_t parts;  /* chunks per outer index (tile); < 2: not split */
    int nst;        /* stages */
    int *st0;       /* per stage: its first phase; st0[nst] = ph.n */
    int64_t *off;   /* per phase: byte offset of its partials (inner reductions) */
    int64_t bytes;  /* partials scratch of the loop */
} CgCudaSplit;

void cg_cuda_split_plan(const CgKernel *k, const CgLoop *l, const CgCudaAlias *al,
                        const CgCudaFn *f, CgCudaSplit *sp);
void cg_cuda_split_free(CgCudaSplit *sp);
/* Appends the functions of split loop li (geometry g, plan sp) to out. */
void cg_cuda_print_split(CgBuf *b, const CgKernel *k, const CgKernel *v, int li, const char *name,
                         const DType *storage, const CgCudaAlias *al, const CgCudaFn *g,
                         const CgCudaSplit *sp, CgCudaFnVec *out);

#endif
