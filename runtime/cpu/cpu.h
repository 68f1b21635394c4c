/*
 * cpu.h - the CPU backend (runtime/cpu/): generated C compiled by the host
 * compiler and loaded with dlopen, GEMMs through OpenBLAS, work split over
 * a thread pool into parts fixed by shape alone (results do not depend on
 * the thread count).
 */
#ifndef KILN_CPU_H
#define KILN_CPU_H

#include <pthread.h>
#include <stdatomic.h>

#include "codegen.h"
#include "runtime.h"

/* ---- backend_cpu.c: generated C via the host compiler, GEMMs via OpenBLAS */
extern const Backend rt_backend_cpu;

/* ---- cc.c: the host C compiler and its on-disk cache ----------------------
 * Shared objects are cached by a hash of source, compiler version and flags
 * in cache_dir (NULL: $KILN_CACHE_DIR, else ~/.cache/kiln). With
 * KILN_CC_INJECT_ERROR=1 an invalid line is appended to the source (tests).
 * On failure d holds the compiler's message and the numbered source around
 * the error. */
typedef struct {
    int compiles;       /* compiler invocations */
    int cache_hits;
    double compile_seconds;
} RtCcStats;
RtCcStats rt_cc_stats(void);
/* Runs cmd through the shell, its stdout and stderr into a malloc'd *out;
 * returns its exit status (128 + the signal when killed; -1 when it could
 * not start, *out then says why). */
int rt_run_capture(const char *cmd, char **out);
/* Returns the malloc'd path of the shared object, or NULL with d set. A
 * compile runs up to `jobs` compiler processes side by side, on parts of
 * the source (each with the prelude), and links them. */
char *rt_cc_compile(const char *source, const char *cache_dir, int jobs, bool verbose, Diag *d);
/* A hash of the compiler's version and the kernels' flags (16 hex digits):
 * what a figure measured through compiled kernels depends on (measure.c). */
const char *rt_cc_build_id(void);

/* ---- pool.c: the backend's thread pool ----------------------------------- */
/* A job for the pool: fn(ctx, part) for part in [0, nparts), each part run
 * once, by whichever thread claims it first. claim packs the job's number
 * (bits 32..63), its part count (16..31) and the next unclaimed part
 * (0..15): a thread claims a part with one compare-and-swap, so a worker
 * that wakes late (its core busy with another process) leaves its parts to
 * the others instead of holding the step up, and a claim never lands in a
 * job other than the one whose fn/ctx the thread read (the caller replaces
 * them only after every part of the last job has finished, and a new job
 * has a new number). */
typedef void (*PoolFn)(void *ctx, int part);
typedef struct {
    pthread_t *th;
    int nth;                  /* workers */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    atomic_ullong gen;        /* bumped per job: wakes the workers */
    atomic_ullong claim;      /* job << 32 | nparts << 16 | next part */
    atomic_int finished;      /* parts of the current job done */
    _Atomic(PoolFn) fn;       /* atomic: a late worker may read them while */
    void *_Atomic ctx;        /* the caller sets up the next job */
    bool quit;
} Pool;

/* Starts nth workers (fewer when a thread cannot be created: pl->nth). */
void pool_start(Pool *pl, int nth);
void pool_stop(Pool *pl); /* joins the workers; nothing when never started */
/* Runs fn(ctx, 0..nparts-1) on the caller and whichever workers come;
 * returns when every part has finished. */
void pool_run(Pool *pl, int nparts, PoolFn fn, void *ctx);

/* ---- measure.c: this machine as a device of the cost model ---------------
 * The `cpu` CgDevice for `threads` threads: FMA peak, sgemm rate,
 * bandwidth (all threads, and one), per-step dispatch; measured once
 * (about ten seconds) and cached in the kernel cache directory, keyed by
 * the CPU's model name; remeasure: measure again. False with d set when
 * the measurement kernel cannot be compiled. */
bool rt_cpu_device(int threads, const char *cache_dir, bool remeasure, bool verbose,
                   CgDevice *dev, Diag *d);
/* rt_cpu_device for one of `ranks` ranks of `threads` threads each on this
 * machine, all computing at once (`kiln train --nproc`): every figure
 * measured with the other ranks' threads busy on the same job, the peaks
 * and bandwidth this rank's share (measure.c); cached apart, as
 * CACHE/cpu-device-T-rR.txt. ranks <= 1: rt_cpu_device. */
bool rt_cpu_device_ranks(int threads, int ranks, const char *cache_dir, bool remeasure,
                         bool verbose, CgDevice *dev, Diag *d);
/* The FMA peak of `threads` threads: measured again when `again` (a second
 * or two), at least at_least FLOP/s (a rate a training step achieved) and
 * at least the cached one; the cache entry, when there is one, keeps a
 * higher result. *f32 in FLOP/s; false with d set when the kernel cannot be
 * compiled. */
bool rt_cpu_fma_remeasure(int threads, const char *cache_dir, double at_least, bool again,
                          bool verbose, double *f32, Diag *d);
/* The CPU's model name (/proc/cpuinfo; "unknown CPU"), malloc'd: the key of
 * the cached measurements. */
char *rt_cpu_model(void);

/* ---- blas.c: OpenBLAS's kernels for this CPU ------------------------------ */
typedef enum { RT_ISA_SSE, RT_ISA_AVX, RT_ISA_AVX2, RT_ISA_AVX512 } RtIsa;
/* The widest vector ISA this CPU and OS run (AVX-512 here means F, BW, VL,
 * DQ and CD, what OpenBLAS's SkylakeX kernels use). */
RtIsa rt_cpu_isa(void);
/* The name of the kernels OpenBLAS loaded (openblas_get_corename). */
const char *rt_blas_core(void);
/* The OPENBLAS_CORETYPE to force when OpenBLAS chose `core`, a fallback
 * below AVX2, on a CPU of ISA `cpu` with AVX2 or more ("SkylakeX" or
 * "Haswell"); NULL when core is right for the CPU. */
const char *rt_blas_core_for(const char *core, RtIsa cpu);
/* rt_blas_core_for this process's core and CPU; NULL also when the user
 * set OPENBLAS_CORETYPE. */
const char *rt_blas_better_core(void);
/* OpenBLAS on one thread, its server threads stopped (kiln's pool runs the
 * GEMMs in parallel): called at startup, before any BLAS call. */
void rt_blas_one_thread(void);

#endif
