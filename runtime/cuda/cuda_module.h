/* cuda_module.h - inside libkiln_cuda.so only (never part of kilncore): what
 * the module's files (backend_cuda.c, cuda_nvrtc.c, cuda_nccl.c) share. The
 * module links nothing of kilncore, so it has its own small helpers
 * (cuda_module.c). */
#ifndef KILN_CUDA_MODULE_H
#define KILN_CUDA_MODULE_H

#include "cg_cuda.h"
#include "runtime.h"

#include <stddef.h>

/* Symbols device.c looks up with dlsym; everything else is hidden. */
#define KC_EXPORT __attribute__((visibility("default")))

/* An internal error: "kiln: cuda: ..." on stderr, then abort. */
_Noreturn void kc_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *kc_zalloc(size_t n); /* zeroed; kc_fatal when out of memory */
char *kc_dupstr(const char *s);
/* Formats the message of d (the module's errors). */
void kc_dmsg(Diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double kc_now(void); /* CLOCK_MONOTONIC seconds */

/* cuda_nvrtc.c: the module's NVRTC path (rt_cuda_compile in device.c). */
KC_EXPORT bool kiln_cuda_compile(const char *src, const char *arch, const char *cache_dir,
                                 bool verbose, RtCudaBinary *b, Diag *d);
KC_EXPORT void kiln_cuda_binary_free(RtCudaBinary *b);

#endif
