/* gemm_plan.h - how the CUDA backend runs a plan's GEMM steps and where host
 * accesses land, decided without the CUDA toolkit (gemm_plan.c), so that
 * the CUDA module (libkiln_cuda.so) and the emulated device (tests/emu)
 * link one copy of these decisions instead of restating them.
 *
 * Part of runtime/cuda/'s contract (cuda_module.h includes it). It links
 * nothing of kilncore and includes no CUDA header: it reads codegen's types
 * and cg_cuda.h's inline helpers only, and reports errors as text. */
#ifndef KILN_GEMM_PLAN_H
#define KILN_GEMM_PLAN_H

#include "cg_cuda.h"

#include <stddef.h>

/* How GEMM step s runs on the device with the epilogue e it applies
 * (kc_gemm_form). Operands are f32 or bf16 in device memory
 * (CgCudaProgram.storage); the product accumulates in f32. */
typedef struct {
    bool bf16_in;        /* A and B are read as bf16: in a bf16 program, or
                            when either is stored as bf16 */
    bool cast_a, cast_b; /* bf16_in and the operand stored as f32: cast
                            (kiln_cast_f32_bf16) into scratch first */
    int out;             /* the tensor the GEMM writes (D): the epilogue's d
                            when it writes one (BIAS, GELU_*, DGELU*), else c */
    bool out_bf16;       /* D is stored as bf16 (else f32) */
    int bias;            /* tensor read as the bias vector (BIAS, GELU_*), or
                            -1 */
    bool bias16;         /* the bias is read as bf16 (the GEMM library's bias
                            has D's type): a bf16 copy of the f32 bias,
                            rounded to nearest even */
    int bgrad;           /* tensor the bias gradient is written to (f32), or -1 */
    int aux;             /* GELU input matrix (written by GELU_AUX_BIAS, read by
                            DGELU*; leading dimension ldc, D's type), or -1 */
} KcGemmForm;

/* The form of plan step s (a CG_STEP_GEMM) of q with epilogue e
 * (CG_EPI_NONE: a plain product into c). False with why set when an
 * operand or C is stored as neither f32 nor bf16. */
bool kc_gemm_form(const CgCudaProgram *q, int s, CgEpilogue e, KcGemmForm *f, char *why,
                  size_t n);

/* Settles which epilogue each step applies. On entry epi[s] is, per GEMM
 * step, the epilogue it would apply: the program's (CgCudaProgram.epi)
 * less those the GEMM library has no algorithm for. A pair whose partner
 * was dropped is dropped (cg_cuda_pair_epilogues); skip[s] is set for every
 * step an applied epilogue replaces (cg_cuda_step_replaced) and cleared for
 * the others. Returns the number of GEMM steps that apply an epilogue. */
int kc_gemm_settle(const CgPlan *p, CgEpilogue *epi, bool *skip);

/* The device arena offset of host access [off, off + bytes) given in the
 * plan's offsets (cg_cuda_host_offset); -1 with why set when it is not a
 * param, input, state or graph output (a bug in the caller). */
int64_t kc_host_offset(const CgCudaProgram *q, int64_t off, int64_t bytes, char *why, size_t n);

#endif
