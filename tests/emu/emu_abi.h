/*
 * emu_abi.h - the interface between the emulator's launcher (emu.c, C11, in
 * the test executable) and its runtime (emu_runtime.cpp, compiled into every
 * emulated kernel module). Plain C, no system types beyond the builtins.
 */
#ifndef KILN_EMU_ABI_H
#define KILN_EMU_ABI_H

#ifdef __cplusplus
extern "C" {
#endif

/* Order in which the threads of a block run between two synchronisation
 * points. RANDOM draws a fresh permutation (from seed) after every barrier. */
enum { KILN_EMU_ORDER_RANDOM = 0, KILN_EMU_ORDER_FORWARD = 1, KILN_EMU_ORDER_REVERSE = 2 };

/* Largest dynamic shared memory a launch may request (the H100/H200 opt-in
 * maximum per block, 227 KiB). */
#define KILN_EMU_MAX_DYN_SMEM 232448

/* What a launch did, summed over its blocks: block-wide barriers completed
 * (__syncthreads) and votes completed (__syncthreads_or/_and/_count; each a
 * barrier too). Tests read it to see work a kernel skipped. */
typedef struct {
    unsigned long long barriers, votes;
} KilnEmuStats;

typedef struct {
    unsigned grid[3], block[3];
    unsigned long long shmem;         /* dynamic shared memory bytes */
    void (*body)(void *ctx);          /* called once per CUDA thread: runs the kernel */
    void *ctx;
    unsigned long long seed;          /* thread order (KILN_EMU_ORDER_RANDOM) */
    int order;
    KilnEmuStats *stats;              /* filled in at the end when not NULL */
} KilnEmuLaunch;

/* Runs the whole grid, one block after another. Returns 0, or -1 with a
 * message in err (deadlock, a barrier some threads never reach, a warp
 * operation over lanes that are absent or exited, a bad configuration). */
typedef int (*KilnEmuLaunchFn)(const KilnEmuLaunch *l, char *err, unsigned long errlen);

/* The dynamic shared memory of a module: defined (with the aliases named by
 * the source's `extern __shared__` declarations) in a unit the launcher
 * generates; returns the calling thread's instance. */
typedef unsigned char *(*KilnEmuDynFn)(void);

#ifdef __cplusplus
}
#endif
#endif
