/*
 * runtime.h - running a compiled training step: backends, the executor,
 * data, checkpoints, the training loop, reports. The public header of
 * runtime/. Sections are named after the .c file that defines them.
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include "ir.h"
#include "passes.h"

/* ---- exec.c: a compiled step on a backend -------------------------------
 * Host-side data is always in the tensor's own dtype (f32 as float, i32 as
 * int32_t, bf16 as uint16_t bit patterns, u8 as uint8_t). */
typedef struct Exec Exec;

typedef struct {
    const char *device;    /* "cpu" (default), "cuda", "auto" */
    int threads;           /* 0: one per core */
    bool profile;          /* time every plan step */
    const char *cache_dir; /* compiled-kernel cache; NULL: $KILN_CACHE_DIR or ~/.cache/kiln */
    bool verbose;
} ExecOpts;

/* Compiles the final graph (after every pass) for the device. */
Exec *rt_exec_create(const Graph *g, const ExecOpts *o, Diag *d);
void rt_exec_destroy(Exec *e);
void rt_exec_write(Exec *e, int tensor, const void *src);
void rt_exec_read(Exec *e, int tensor, void *dst);
/* One step: every op, then every update (param/state <- new value). */
bool rt_exec_run(Exec *e, uint64_t seed, int64_t step, Diag *d);
int64_t rt_exec_arena_bytes(const Exec *e);

#endif
