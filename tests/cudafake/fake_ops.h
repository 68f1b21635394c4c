/* fake_ops.h - what the fake driver (fake_cuda.c) and its race detector
 * (fake_race.c) share: the device op as the streams queue it, and the
 * device allocations; internal to libcuda.so.1 (cuda.map exports neither). */
#ifndef KILN_FAKE_OPS_H
#define KILN_FAKE_OPS_H

#include "fake_cuda.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { MAXS = 32 }; /* streams, the legacy stream S[0] included */

typedef struct {
    uint64_t lo, hi;         /* the allocation */
    uint64_t map_lo, map_hi; /* its pages (without the guard page) */
    bool live;
} Alloc;

typedef struct FModule FModule;
typedef struct FEvent FEvent;

/* A kernel of a module (cuModuleGetFunction): its parameters' sizes and
 * which are device pointers. */
typedef struct Func {
    FModule *m;
    char *name;
    int nparams;
    size_t *psize;
    bool *isptr;
} Func;

enum { OP_KERNEL, OP_HTOD, OP_DTOH, OP_DTOD, OP_MEMSET, OP_HOST, OP_MARK };

typedef struct FOp FOp;
struct FOp {
    uint64_t id;
    int stream;
    uint64_t seq;
    uint64_t vc[MAXS];
    int kind;
    char desc[200];
    /* kernel */
    Func *f;
    unsigned grid[3], block[3], shmem;
    unsigned char *argbuf; /* argument values */
    /* copies and memset */
    uint64_t dst, src, bytes;
    unsigned char *snap; /* HtoD: the source when enqueued */
    unsigned char val;
    /* host function (cuBLASLt, NCCL); gate: may it start yet
     * (fakecu_enqueue_when; NULL: always) */
    void (*fn)(void *);
    void *arg;
    bool (*gate)(void *);
    /* marker (cuEventRecord) */
    FEvent *ev;
    uint64_t gen;
    /* accesses */
    FakeRange *acc;
    int nacc, cap;
    bool shared; /* argbuf/arg belong to a graph */
    FOp *next;
};

/* ---- fake_cuda.c ---------------------------------------------------------- */

/* The allocation (live or freed) holding device address p; NULL if none. */
Alloc *fake_find_alloc(uint64_t p);
/* Adds [lo, hi) to op o's accesses (a write when write). */
void fake_add_acc(FOp *o, uint64_t lo, uint64_t hi, bool write);
/* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (and every capture invalidated)
 * when a stream is capturing: call may not run then; else CUDA_SUCCESS. */
CUresult fake_in_capture(const char *call);
/* Runs every queued op (a host synchronisation). */
void fake_drain(void);

/* ---- fake_module.c: modules and kernels ----------------------------------- */

/* Runs kernel op o (OP_KERNEL) on the emulator and adds the bytes it
 * changed to o's writes; stops the process when an argument is no longer
 * live or the emulated kernel fails. */
void fake_run_kernel(FOp *o);

/* ---- fake_race.c: the race detector ---------------------------------------- */

/* Notes p as the start of a buffer a launch, copy, memset, GEMM or
 * all-reduce was given: a kernel's read through a pointer argument reaches
 * up to the next such start. */
void fake_race_note_start(uint64_t p);
/* Stops the process (fakecu_die, naming both ops) when op o, which just
 * ran, races with an op of hist (a list through next of ops that ran
 * before): not ordered with it by its vector clock, and one writes bytes the
 * other reads or writes. */
void fake_race_check(const FOp *hist, const FOp *o);

#endif
