/*
 * emu_backend.h - the CUDA backend's plan run on the emulated device, behind
 * the runtime's Backend table (see emu_backend.c for what is the same as on
 * the GPU and what replaces cuBLASLt).
 */
#ifndef KILN_EMU_BACKEND_H
#define KILN_EMU_BACKEND_H

#include "emu.h"
#include "runtime.h"

struct CgCudaProgram;

/* Negative controls of the GEMM epilogues: one computed wrong on purpose. */
typedef enum {
    EMU_EPI_EXACT,     /* as cuBLASLt defines them */
    EMU_EPI_ERF_GELU,  /* GELU epilogues use the exact erf GELU, not tanh's */
    EMU_EPI_NO_BIAS,   /* GELU epilogues drop the bias */
    EMU_EPI_BGRAD_SHORT, /* bias gradients leave out the last row */
} EmuEpiFault;

typedef struct {
    EmuOpts opts;
    /* Epilogue kinds (bits 1 << CgEpilogue) for which the emulated cuBLASLt
     * heuristic has no algorithm: those GEMMs, and their pairs, run as
     * planned (the CUDA backend's fallback). */
    unsigned refuse_epilogues;
    EmuEpiFault epi_fault;
    /* Optional: returns a malloc'd edited copy of the program's source (the
     * negative controls break a kernel this way), or NULL if the edit does
     * not apply. */
    char *(*edit)(const char *src, void *ctx);
    void *edit_ctx;
} EmuBackendCfg;

/* Settings for the next emu_backend_cuda.create (default: emu_opts_default,
 * no edit). ExecOpts.precision "bf16" selects the mixed-precision program. */
void emu_backend_configure(const EmuBackendCfg *c);
extern const Backend emu_backend_cuda;
const struct CgCudaProgram *emu_backend_program(const BackendCtx *c);
/* Number of GEMM steps that apply their epilogue (and skip the steps it
 * replaces); per_kind (CG_EPI__COUNT entries, may be NULL) gets the count of
 * each CgEpilogue. */
int emu_backend_epilogues(const BackendCtx *c, int *per_kind);

#endif
