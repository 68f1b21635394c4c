/*
 * emu.h - the emulated CUDA device for tests: compiles a CUDA C source
 * unchanged with the host C++ compiler under cuda_emu.h (with
 * AddressSanitizer and UndefinedBehaviorSanitizer's bounds and alignment
 * checks unless told otherwise), loads it, and launches its kernels by name
 * with a grid, a block, dynamic shared memory and cuLaunchKernel-style
 * arguments. Kernels must be `extern "C" __global__`.
 */
#ifndef KILN_EMU_H
#define KILN_EMU_H

#include "emu_abi.h"
#include "passes.h" /* Diag */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    bool sanitize;      /* ASan + UBSan bounds/alignment in the kernel module */
    int order;          /* KILN_EMU_ORDER_*: thread order between barriers */
    uint64_t seed;      /* KILN_EMU_ORDER_RANDOM: first launch's seed */
    const char *cflags; /* extra compiler flags (may be NULL) */
    /* NULL-terminated names of by-value parameter types that are structs
     * holding exactly one pointer (passed like the pointer); may be NULL */
    const char *const *ptr_structs;
} EmuOpts;

typedef struct EmuModule EmuModule;

/* sanitize = true, random order, a fixed seed. */
void emu_opts_default(EmuOpts *o);

/* Call first in main(): when the process lacks the AddressSanitizer runtime
 * that sanitized kernel modules need, re-executes it with libasan preloaded
 * (ASAN_OPTIONS=detect_leaks=0 unless set); then removes LD_PRELOAD from the
 * environment so that compilers started later run without it. Exits 77
 * (skipped) when the host C++ compiler (KILN_EMU_CXX) does not run. */
void emu_init(char **argv);

/* Compiles and loads source; on failure NULL with the compiler's output in
 * d. Compiled modules are cached (by a hash of the source, the emulator's
 * own sources and the flags) under $KILN_CACHE_DIR/emu or /tmp/kiln-emu. */
EmuModule *emu_compile(const char *source, const EmuOpts *o, Diag *d);
void emu_free(EmuModule *m);

/* Runs kernel `name` over the grid; args[i] points to the value of the i-th
 * parameter (as for cuLaunchKernel). Each launch draws its own thread
 * order from the module's seed, the kernel's name and the number of earlier
 * launches of that kernel, never from other kernels' launches: two runs that
 * differ only in the launches of some kernels (zero=1's update in pieces,
 * tests/cudafake/zero.sh) run every other kernel's n-th launch in the same
 * thread order, so the float atomics of a scatter-add sum in the same
 * order. Returns false with d set on an
 * unknown kernel or an execution error the emulator detects (deadlock,
 * divergent barrier, bad warp mask, ...); sanitizer reports end the
 * process. */
bool emu_launch(EmuModule *m, const char *name, const unsigned grid[3], const unsigned block[3],
                size_t shmem, void **args, Diag *d);

/* What the module's last emu_launch did (emu_abi.h's KilnEmuStats): its
 * barriers and votes, summed over the blocks (zero before any launch). */
void emu_last_stats(const EmuModule *m, KilnEmuStats *s);

/* Number of parameters of kernel `name`, -1 if there is no such kernel. */
int emu_kernel_nparams(const EmuModule *m, const char *name);

/* Parameter i of kernel `name`: its size in bytes (0 when there is no such
 * kernel or parameter); *is_ptr: a pointer or a struct of one pointer. */
size_t emu_kernel_param(const EmuModule *m, const char *name, int i, bool *is_ptr);

#endif
