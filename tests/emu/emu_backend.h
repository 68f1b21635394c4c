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

typedef struct {
    EmuOpts opts;
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
/* Number of GEMM steps that write their bias epilogue (and skip the kernel
 * after them). */
int emu_backend_epilogues(const BackendCtx *c);

#endif
