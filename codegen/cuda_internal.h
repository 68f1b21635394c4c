/*
 * cuda_internal.h - what the CUDA C printer (cuda_print.c) lends the other
 * printers of codegen/ (cuda_multi.c: the horizontal multi-tensor
 * function). Not part of codegen's public header: the names and the
 * contracts are cuda_print.c's, documented there.
 */
#ifndef KILN_CUDA_INTERNAL_H
#define KILN_CUDA_INTERNAL_H

#include "cg_cuda.h"

typedef VEC(CgCudaFn) CgCudaFnVec;

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
/* The parameter list of f (buffers f->param, then {seed, step}). */
void cg_cuda_print_params(CgBuf *b, const CgKernel *k, const DType *storage, const CgCudaFn *f);

/* ---- cuda_multi.c: horizontal functions ---------------------------------- */

/* Whether kernel k runs all its loops as horizontal functions (docs/cuda.md,
 * Multi-tensor kernels): several independent elementwise loops. */
bool cg_cuda_horizontal(const CgKernel *k);
/* Appends k's loops as horizontal functions NAME_hI (v: k's f32 view,
 * st: storage per param) to out. */
void cg_cuda_print_horizontal(CgBuf *b, const CgKernel *k, const CgKernel *v, const char *name,
                              const DType *st, const CgCudaAlias *al, CgCudaFnVec *out);

#endif
