/*
 * passes.h - the compiler's passes over a Graph, run in order from one flat
 * list (pipeline.c) with ir_verify() after each. The public header of passes/.
 *
 * A pass gets the graph and the options, and either succeeds or fills a
 * diagnostic. Passes that change the graph leave it compacted (ir_compact)
 * and valid for ir_verify.
 */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "ir.h"

typedef struct {
    char msg[2048];
} Diag;

typedef struct {
    /* optimizer (AdamW + global-norm clipping); defaults from pass_opts_default */
    double beta1, beta2, eps, weight_decay;
    double grad_clip;      /* <= 0: no clipping */
    /* remat */
    int64_t memory_budget; /* bytes; 0: none */
    /* comm */
    int nranks;
} PassOpts;

void pass_opts_default(PassOpts *o);

typedef bool (*PassFn)(Graph *g, const PassOpts *o, Diag *d);
typedef struct {
    const char *name;
    PassFn run;
} Pass;

/* pipeline.c */
extern const Pass pass_list[];
extern const int pass_count;
const Pass *pass_find(const char *name);
/* Called after each pass with the graph; for dumps and timing. */
typedef void (*PassHook)(const char *pass, const Graph *g, double seconds, void *ctx);
/* Runs every pass in pass_list from the first through `last` (NULL: all),
 * verifying after each. Returns false with d set on the first failure; an
 * internal verifier failure names the pass. */
bool pass_pipeline(Graph *g, const PassOpts *o, const char *last, PassHook hook,
                   void *ctx, Diag *d);

/* autodiff.c: reverse mode from the graph output "loss" (a scalar float).
 * Adds one output "grad.NAME" per param NAME (zeros when the loss does not
 * depend on it). Ops it creates carry OPF_BACKWARD and the source location of
 * the forward op they differentiate. */
bool pass_autodiff(Graph *g, const PassOpts *o, Diag *d);

/* optimizer.c: AdamW with bias correction and global-norm gradient clipping,
 * as ordinary ops. Adds graph inputs: `input "lr" f32[]`; state per param P:
 * "adam.m.P", "adam.v.P" (zeros), and one "adam.step" f32[] (zeros).
 * Adds updates: P <- new P, m/v <- new m/v, adam.step <- step + 1; and the
 * output "grad_norm" (before clipping). Weight decay applies to params of
 * rank >= 2 only. Ops carry OPF_OPTIM. */
bool pass_optimizer(Graph *g, const PassOpts *o, Diag *d);

/* simplify.c: constant folding, common-subexpression elimination and
 * dead-code elimination, to a fixed point. */
bool pass_simplify(Graph *g, const PassOpts *o, Diag *d);

/* schedule.c: final op order (a topological order that keeps live memory low). */
bool pass_schedule(Graph *g, const PassOpts *o, Diag *d);

/* memplan.c: liveness on the final schedule and offsets in one arena.
 * Storage: a tensor either owns bytes in the arena or aliases another
 * tensor's (a reshape is a view of its operand; an update value computed in
 * place lives in its target). The arena is [persistent | temps]: inputs,
 * params and state (and update values computed in place) in the persistent
 * region from offset 0; every other storage in the temp region, reused
 * between storages whose live ranges [first, last] (op indices, inclusive)
 * do not meet. Graph outputs and update values live to the end of the step
 * (last = nops). Offsets and sizes are multiples of MEMPLAN_ALIGN. */
#define MEMPLAN_ALIGN 64
typedef struct {
    int nt, nops;
    int *root;             /* per tensor: the tensor that owns its storage */
    int64_t *offset;       /* per tensor: byte offset of its data in the arena */
    int64_t *bytes;        /* per tensor: its data size (unaligned) */
    int *first, *last;     /* per owning tensor: live range; -1/-1 when persistent */
    bool *persistent;      /* per owning tensor */
    bool *inplace;         /* per update (g->upd index): value computed in its target */
    int64_t persistent_bytes; /* size of the persistent region */
    int64_t arena_bytes;   /* what the runtime allocates: persistent + temp high-water */
    int64_t *live;         /* per op: bytes live while the op runs (aligned sizes) */
    int64_t peak_live;     /* max over ops of live[] */
    int peak_op;
} MemPlan;
MemPlan *pass_memplan(const Graph *g, Diag *d);
void pass_memplan_free(MemPlan *m);
/* The per-op memory timeline: op index, opcode, result, live bytes, and the peak. */
void pass_memplan_print(const Graph *g, const MemPlan *m, FILE *f);

#endif
