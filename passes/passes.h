/*
 * passes.h - the compiler's passes over a Graph, run in order from one flat
 * list (pipeline.c) with ir_verify() after each. The public header of passes/.
 *
 * A pass gets the graph and the options, and either succeeds or fills a
 * diagnostic (Diag, ir.h). Passes that change the graph leave it compacted (ir_compact)
 * and valid for ir_verify. Every pass is deterministic: the same graph text
 * and options give the same result, so a dump after one pass, parsed back
 * and run through the next (`kiln opt`), gives the pipeline's own next dump.
 */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "ir.h"

struct MemPlan; /* memplan.c */

/* The optimizers pass_optimizer builds (PassOpts.optimizer). */
typedef enum { PASS_OPT_ADAMW, PASS_OPT_SGD, PASS_OPT_LION, PASS_OPT_ADAFACTOR } PassOptimizer;
/* "adamw", "sgd", "lion", "adafactor"; pass_optimizer_parse: -1 if unknown */
const char *pass_optimizer_name(int opt);
int pass_optimizer_parse(const char *name);

/* One param's own settings (train{param_groups, frozen}, resolved by the
 * frontend from Lua patterns to param names): its lr is lr * lr_scale and
 * its weight decay weight_decay (NAN: the default rule, o->weight_decay on
 * params of rank >= 2 and 0 on the others); a frozen param gets no
 * gradient, optimizer state or update. */
typedef struct PassParamOpt {
    const char *name;
    double lr_scale, weight_decay;
    bool frozen;
} PassParamOpt;

typedef struct {
    /* optimizer (AdamW, SGD, Lion or Adafactor + global-norm clipping);
     * defaults from pass_opts_default */
    int optimizer;         /* PassOptimizer; PASS_OPT_ADAMW by default */
    double beta1, beta2, eps, weight_decay; /* AdamW (weight_decay: all) */
    double momentum;       /* SGD: 0 none */
    bool nesterov;         /* SGD: Nesterov momentum (needs momentum > 0) */
    double lion_beta1, lion_beta2; /* Lion */
    double grad_clip;      /* <= 0: no clipping */
    /* per-param settings, by name (params not named: lr_scale 1, the
     * default weight decay, not frozen); NULL with nparam_opts 0: none */
    const PassParamOpt *param_opts;
    int nparam_opts;
    /* remat */
    int64_t memory_budget; /* bytes; 0: none */
    int remat;             /* RematPolicy; REMAT_DEFAULT: auto with a budget, else none */
    int remat_solver;      /* RematSolver; 0: exact for small graphs, else heuristic */
    struct RematReport *remat_report; /* optional out: what remat chose */
    /* remat: what a candidate's final plan (g after the later passes, m its
     * memory plan) is checked against memory_budget with; NULL: m's
     * arena_bytes. kiln plan measures memory per GPU with it. */
    int64_t (*remat_measure)(const Graph *g, const struct MemPlan *m, const void *ctx);
    const void *remat_measure_ctx;
    /* partition: tensor parallelism over tp ranks (<= 1: none), as rank
     * tp_rank of the group; sequence_parallel splits the regions between
     * the TP blocks along the sequence (passes/partition.c) */
    int tp, tp_rank;
    bool sequence_parallel;
    /* comm */
    int nranks;
    int64_t bucket_bytes;  /* bucket size cap; <= 0: PASS_COMM_BUCKET_DEFAULT */
    bool no_overlap;       /* every allreduce_start after the last backward op */
    int grad_accum;        /* micro-batches per step (<= 1: none) */
    /* optimizer + comm: 1 shards AdamW's state over the nranks ranks (ZeRO-1:
     * reduce-scatter, update the shard, all-gather; see docs/distributed.md);
     * 0 keeps every rank's full copy */
    int zero;
    /* optimizer: the global gradient norm's sum of squares is the input
     * "pp.sumsq" f32[] (pipeline stages: summed over the stages by the
     * runtime, runtime/dist/pp.c), not this graph's own gradients'; with
     * zero, the gradient's shard is the input "pp.grad.shard" f32[S] (the
     * runtime's reduce-scatter over the dp group), not a reduce_scatter */
    bool pp_sumsq;
    /* attention: rewrite attention written in primitives to the fused
     * attention op (pass_attention). false by default (pass_opts_default):
     * rt_pass_opts turns it on unless --no-fuse-attention */
    bool attention;
    /* fuse */
    bool no_fuse;          /* --no-fuse: every op its own kernel */
    /* pass_run: where an invalid graph's IR is written (NULL: nowhere) */
    const char *dump_dir;
    /* memplan: optional out: the plan of the final schedule (the caller
     * frees it with pass_memplan_free; NULL: the pass frees it) */
    struct MemPlan **memplan;
    /* Set by the driver (pass_run) before each pass: the passes that run
     * after it in the pipeline, in order. remat plans its candidates through
     * them; no pass searches pass_list itself. */
    const struct Pass *after;
    int nafter;
} PassOpts;

void pass_opts_default(PassOpts *o);

typedef bool (*PassFn)(Graph *g, const PassOpts *o, Diag *d);
typedef struct Pass {
    const char *name;
    PassFn run;
} Pass;

/* ---- pipeline.c: the pass list and its driver -----------------------------
 * The pipeline: attention, partition, autodiff, optimizer, simplify, remat, fuse, comm,
 * schedule, memplan. */
extern const Pass pass_list[];
extern const int pass_count;
const Pass *pass_find(const char *name);
/* Sets o->after / o->nafter to the passes pass_list runs after `pass` (none
 * when it is the last or not in the list). pass_run does this before each
 * pass; a caller that runs a pass by hand (pass_remat_sweep) does it first. */
void pass_opts_after(PassOpts *o, const char *pass);
/* Whether passes[0..n) may run on g in that order, judged by what g shows
 * of the passes already run on it (gradients, updates, !recompute, !group,
 * placed collectives, the attention head layout) and by the list itself: no
 * pass runs on a graph that a pass the pipeline runs after it has marked
 * (simplify after remat or fuse, autodiff after attnlayout), and autodiff,
 * optimizer, remat, fuse and comm run once. False with "what cannot run,
 * expected ..., found ..." in err. pass_run checks this before the first
 * pass; passes outside pass_list (a test's) are not judged. */
bool pass_check(const Graph *g, const Pass *const *passes, int n, char *err, size_t errlen);
/* Called after each pass with the graph; for dumps and timing. */
typedef void (*PassHook)(const char *pass, const Graph *g, double seconds, void *ctx);
/* The driver: runs passes[0..n) in order on g, verifying g first (as the
 * frontend's graph) and after each pass; each pass gets o with `after` set
 * by pass_opts_after (the pipeline's later passes, whatever n is).
 * Returns false with d set on the first failure: pass_check's refusal, a
 * pass's own error, or an internal verifier failure, which names the pass
 * and writes the IR to o->dump_dir/invalid-after-PASS.ir (none without a
 * dump directory), which `kiln opt` replays. */
bool pass_run(Graph *g, const Pass *const *passes, int n, const PassOpts *o, PassHook hook,
              void *ctx, Diag *d);
/* pass_run over pass_list from the first pass through `last` (NULL: all). */
bool pass_pipeline(Graph *g, const PassOpts *o, const char *last, PassHook hook,
                   void *ctx, Diag *d);
/* The text `kiln compile --dump-after=PASS` writes for g after `pass`: the
 * IR (ir_print), then for fuse the group lines and for comm the bucket lines
 * (comments, so the dump parses back); for memplan the memory timeline of
 * mp. `kiln opt` prints the same text. */
void pass_dump(const char *pass, const Graph *g, const struct MemPlan *mp, FILE *f);
/* The dump file's extension: "txt" for memplan, else "ir". */
const char *pass_dump_ext(const char *pass);

/* attention.c: when o->attention, rewrites scaled-dot-product attention
 * written in primitives (nn.attention's form, and hand-written variants:
 * see the file's header and docs/fusion.md) to one `attention` op, only
 * where that is exact (no other users of the intermediates, an exactly
 * causal mask or none, no dropout on the weights). Otherwise unchanged. */
bool pass_attention(Graph *g, const PassOpts *o, Diag *d);
/* attention.c: the attention pass's dump notes, as comment lines: each
 * attention op with the variant it runs (causal, grouped heads, window,
 * alibi, bias or mask and its tensor), and each attention left as primitives
 * although found, with the reason (an additive bias that needs a gradient). */
void pass_attention_print(const Graph *g, FILE *f);
/* attn_layout.c: after autodiff, puts each attention group whose q, k, v
 * are head splits of [B, T, *] tensors into the head layout (ir.h), so that
 * no copy runs around it; off unless o->attention. */
bool pass_attention_layout(Graph *g, const PassOpts *o, Diag *d);
/* attn_dqkv.c: after simplify, turns concat(dq, dk, dv) of one head-layout
 * attention group into one attention_dqkv op (ir.h) whose kernels write the
 * [B, T, 3C] gradient in place of the concat; off unless o->attention. */
bool pass_attention_dqkv(Graph *g, const PassOpts *o, Diag *d);

/* partition.c: rank o->tp_rank's part of the forward graph under tensor
 * parallelism over o->tp ranks (nothing when tp <= 1): params marked with a
 * sharding (IrShard) keep rank r's part, every tensor gets a sharding by
 * propagation, and tp_* collectives go where an op needs a tensor whole or
 * a partial sum summed. Runs before autodiff. */
bool pass_partition(Graph *g, const PassOpts *o, Diag *d);

/* shard_auto.c: shard=auto. The device figures the choice is costed with
 * (the caller takes them from the cost model's device, codegen/predict.c). */
typedef struct {
    const char *device; /* its name, for the report */
    double flops;       /* GEMM peak of the step's precision, FLOP/s */
    double mem_bw;      /* bytes/s a streaming kernel reaches */
    double link_bw;     /* between TP ranks, one direction, bytes/s */
    double alpha_s;     /* latency per ring hop, seconds */
    double mem;         /* per-rank bytes for params + grads + AdamW state (0: no limit) */
} PassShardCost;
/* Chooses, for o->tp > 1 ranks, a sharding for every param of rank >= 2 of
 * the forward graph g that the script leaves whole (whole, or split along
 * an axis the partition pass can split), by an ILP over the partition
 * pass's costs (see the file's header), and sets it on g's params
 * (Tensor.shard with n = 0, as `shard` does); the script's marks are kept.
 * *text (if text; the caller frees it): the report, the objective and its
 * terms and every candidate's choice. Nothing when o->tp <= 1. False with d
 * set where the ILP has no solution or the script's marks do not partition. */
bool pass_shard_auto(Graph *g, const PassOpts *o, const PassShardCost *c, char **text,
                     Diag *d);
/* Sets the sharding of every param of `to` to that of the param of `from`
 * with the same name (an evaluation graph gets the step graph's choice). */
void pass_shard_copy(const Graph *from, Graph *to);

/* autodiff.c: reverse mode from the graph output "loss" (a scalar float).
 * Adds one output "grad.NAME" per param NAME (zeros when the loss does not
 * depend on it). Ops it creates carry OPF_BACKWARD and the source location of
 * the forward op they differentiate. */
bool pass_autodiff(Graph *g, const PassOpts *o, Diag *d);

/* optimizer.c: o->optimizer's update with global-norm gradient clipping,
 * as ordinary ops (AdamW below; SGD, Lion and Adafactor keep their state
 * as "sgd.buf.P", "lion.m.P", "adafactor.r.P"/"adafactor.c.P" (rank 2) or
 * "adafactor.v.P" and "adafactor.step": docs/training.md). Params frozen
 * by o->param_opts lose their "grad.P" output and the backward ops only it
 * read, and get no state or update. Every optimizer adds the graph input
 * `input "lr" f32[]` and the output "grad_norm" (before clipping); ops
 * carry OPF_OPTIM. AdamW adds state per param P "adam.m.P", "adam.v.P"
 * (zeros) and one "adam.step" f32[] (zeros), and updates P <- new P, m/v
 * <- new m/v, adam.step <- step + 1. Weight decay applies by default to
 * params of rank >= 2 only (o->param_opts overrides it, and scales lr).
 * With o->zero (AdamW only: another optimizer is an error) the update runs on this rank's shard (ir.h, AK_SHARD): the
 * gradients are reduce_scatter'ed into a shard in the flat order of the
 * params by readiness, the state is "adam.m" and "adam.v" f32[S] (the
 * shard) instead of per param, the squared norm of the shard is summed
 * over ranks by one scalar allreduce (mean, times nranks), and each param
 * is updated by an all_gather of the new shard. The comm pass turns the
 * reduce_scatter, allreduce and all_gather into buckets of start/wait. */
bool pass_optimizer(Graph *g, const PassOpts *o, Diag *d);

/* simplify.c: constant folding, common-subexpression elimination and
 * dead-code elimination, to a fixed point. */
bool pass_simplify(Graph *g, const PassOpts *o, Diag *d);

/* fuse.c: groups ops into kernels (Op.group; -1: the op is its own
 * kernel). See the file's header for the kinds of groups and the steps
 * (one file each, listed in fuse_internal.h). Every tensor a group's kernel
 * writes is "materialised": read outside its group, a graph output or an
 * update value; the others never reach memory. Leaves every group == -1
 * when o->no_fuse. */
bool pass_fuse(Graph *g, const PassOpts *o, Diag *d);
/* The loop domain of a group: full shape S (dims only), split at axis k.
 * FUSE_ELEM: k = -1; FUSE_ROW: reductions over axes k..rank-1, per-row
 * values have shape S with those axes 1; FUSE_COL: reductions over axes
 * 0..k-1, per-column values have shape S with those axes 1. */
typedef enum { FUSE_ELEM, FUSE_ROW, FUSE_COL } FuseKind;
typedef struct {
    FuseKind kind;
    Shape S;
    int k;
} FuseDomain;
/* fuse_domain.c: loop domains. */
/* Connected parts of a group's members ops[0..n) by in-group edges (a
 * GEMM's consumers connect through it; it is no part's member when the
 * loops are built): root[i] is the same for members of one part, and is
 * the index of one of them (root[r] == r for that one). */
void pass_fuse_parts(const Graph *g, const int *ops, int n, int *root);
/* Domain of one loop nest made of ops[0..n) (one group, or one connected
 * part of a multi-tensor group); false with err when they do not form one. */
bool pass_fuse_domain(const Graph *g, const int *ops, int n, FuseDomain *d, char *err,
                      size_t errlen);
Shape pass_fuse_oshape(const FuseDomain *d); /* the per-row (per-column) shape */
bool pass_fuse_op_fusable(const Graph *g, const Op *op);
/* Per tensor id (caller frees): true when its value is written to memory
 * under the graph's current grouping. */
bool *pass_fuse_materialised(const Graph *g);
/* fuse_lower.c: whether group ops[0..n) (program order) lowers to one
 * kernel as codegen builds it (cg_lower_group): every connected part
 * (pass_fuse_parts; a member matmul runs first as a GEMM and is no part's
 * member) has one domain (pass_fuse_domain), and a part over a column
 * domain stores per-column results only (mat: pass_fuse_materialised). The
 * one check both the fuse pass (which leaves a group that fails unfused)
 * and codegen (which reports it) call. Fills root[0..n) as pass_fuse_parts
 * does and dom[r] for each part root r with members other than a matmul
 * (both arrays of n, the caller's). False at the first part that fails, in
 * order of root index: err says why and *bad is the op to blame. */
bool pass_fuse_lowers(const Graph *g, const int *ops, int n, const bool *mat, int *root,
                      FuseDomain *dom, int *bad, char *err, size_t errlen);
/* fuse_dump.c: statistics of a grouping and the dump's group lines. */
/* Bytes a group's kernel moves: each tensor read from outside once, each
 * materialised result written once (a member GEMM counts its own reads and
 * write). */
double pass_fuse_group_bytes(const Graph *g, const int *ops, int n, const bool *mat);
/* Launch counts and bytes moved per step under the graph's grouping (an
 * unfused graph: one kernel per op; reshapes are views and count nothing). */
typedef struct {
    int kernels;  /* generated kernels */
    int gemms;    /* library GEMM calls */
    double bytes;
} FuseStats;
void pass_fuse_stats(const Graph *g, FuseStats *s);
/* One comment line per group (kind, domain, ops, what it writes): appended
 * to the --dump-after=fuse dump. */
void pass_fuse_print(const Graph *g, FILE *f);
/* The graph as a Graphviz digraph (dot.c): ops grouped by layer (nested
 * clusters named after the params' prefixes), fused kernels as clusters,
 * recomputed ops marked, comm buckets shown (`kiln compile --dot`). depth
 * > 0: each layer of that depth is one node (`--dot-depth N`); 0: all. */
void pass_dot_print(const Graph *g, int depth, FILE *f);

/* schedule.c: final op order (a topological order that keeps live memory low). */
bool pass_schedule(Graph *g, const PassOpts *o, Diag *d);

/* memplan.c: liveness on the final schedule and offsets in one arena.
 * Storage: a tensor either owns bytes in the arena or aliases another
 * tensor's (a reshape is a view of its operand; an update value computed in
 * place lives in its target; a fuse group's row-kernel result may live in
 * an operand the group reads last, e.g. dlogits over the logits: see
 * memplan.c, group_inplace). The arena is [persistent | temps]: inputs,
 * params and state (and update values computed in place) in the persistent
 * region from offset 0; every other storage in the temp region, reused
 * between storages whose live ranges [first, last] (op indices, inclusive)
 * do not meet. Graph outputs and update values live to the end of the step
 * (last = nops). Offsets and sizes are multiples of MEMPLAN_ALIGN. */
#define MEMPLAN_ALIGN 64
typedef struct MemPlan {
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
    /* What live[i] - persistent_bytes holds, per op (aligned sizes, as live):
     * live_grad: params' gradients, the storages of the graph outputs
     * "grad.P" of params P (the comm pass reduces each in place, so a
     * gradient's storage stays live from its first write to the end of the
     * step, with or without zero); live_saved: other storages written by a
     * forward op (no OPF_BACKWARD, OPF_OPTIM or OPF_RECOMPUTE) and read by a
     * backward or optimizer op, the activations saved for backward. The rest
     * are other temporaries (recomputed activations, the intermediates of
     * backward, the optimizer and forward). */
    int64_t *live_grad, *live_saved;
    int64_t grad_bytes;    /* every gradient storage (aligned) */
    int64_t fit_spans;     /* spans the best fit's queries merged, in all (its cost) */
} MemPlan;
MemPlan *pass_memplan(const Graph *g, Diag *d);
/* The pass in the list: plans g (unchanged) and hands the plan to
 * *o->memplan, or frees it. Fails as pass_memplan does. */
bool pass_memplan_run(Graph *g, const PassOpts *o, Diag *d);
/* The same plan for buffers stored as storage[t] (per tensor id) instead of
 * each tensor's own dtype (the CUDA backend's bf16 activations). Storage
 * sharing (views, in-place updates) and live ranges do not depend on sizes:
 * only offsets and the arena change. Tensors sharing a storage must have
 * equal storage dtypes. */
MemPlan *pass_memplan_storage(const Graph *g, const DType *storage, Diag *d);
/* m's storages and live ranges counted with buffers stored as storage[t]
 * (NULL: each tensor's dtype): bytes and the timeline (live, live_grad,
 * live_saved, grad_bytes, peak_live, peak_op) equal pass_memplan_storage's,
 * but nothing is placed (offset and inplace NULL, arena_bytes 0), so it
 * costs O(ops + tensors). For counting memory, not for running. */
MemPlan *pass_memplan_counted(const Graph *g, const MemPlan *m, const DType *storage);
void pass_memplan_free(MemPlan *m);
/* The per-op memory timeline: op index, opcode, result, live bytes, and the peak. */
void pass_memplan_print(const Graph *g, const MemPlan *m, FILE *f);

/* remat.c (entry point; remat_model.c, remat_solve.c, remat_search.c,
 * remat_rewrite.c and remat_report.c define the rest of this section):
 * recomputation under a memory budget (o->memory_budget, o->remat).
 * Activations (forward results that are neither outputs nor update values)
 * read by backward or optimizer ops are kept or recomputed; recomputations
 * are clones flagged OPF_RECOMPUTE, inserted just before the first backward
 * op that reads them. Random ops and collectives are never recomputed. With a
 * budget, the plan after the later passes (o->after, set by the driver;
 * then pass_memplan's arena_bytes unless memplan is among them) is within
 * it, or the pass fails naming the smallest feasible budget found.
 * Policies: none keeps every saved activation; full keeps each layer's
 * inputs (layers from param name prefixes such as "h.3.") and recomputes the
 * rest of the layer; selective recomputes attention internals (between the
 * two activation-by-activation matmuls of a layer); auto minimises the
 * predicted recompute time within the budget. See docs/remat.md. */
typedef enum { REMAT_DEFAULT, REMAT_NONE, REMAT_FULL, REMAT_SELECTIVE, REMAT_AUTO } RematPolicy;
typedef enum { REMAT_SOLVER_AUTO, REMAT_SOLVER_HEURISTIC, REMAT_SOLVER_EXACT } RematSolver;
typedef struct RematReport {
    int policy;            /* asked for (REMAT_AUTO when a budget alone was given) */
    int chosen;            /* REMAT_AUTO, or the fixed policy auto found cheapest */
    bool exact;            /* the exact solver answered (auto) */
    double gap;            /* heuristic: (cost - LP bound) / cost; -1 unknown */
    int nsaved, nkept, nrecomputed; /* activations saved for backward */
    int nrecompute_ops;    /* clones inserted */
    int64_t kept_bytes, recomputed_bytes;
    int64_t peak;          /* planned arena bytes checked against the budget; -1: unchecked */
    double extra_flops;    /* per step */
    double extra_seconds;  /* predicted by the cost model */
} RematReport;
bool pass_remat(Graph *g, const PassOpts *o, Diag *d);
int pass_remat_parse_policy(const char *s); /* "none".."auto"; -1 if unknown */
const char *pass_remat_policy_name(int policy);
/* FLOPs of the OPF_RECOMPUTE ops of g (hardware FLOPs minus model FLOPs). */
double pass_remat_flops(const Graph *g);
/* The cost model's predicted time of one step of g, in seconds. */
double pass_remat_step_seconds(const Graph *g);
/* Bytes of the activations saved for backward (g after simplify). */
int64_t pass_remat_saved_bytes(const Graph *g);
/* The selection problem alone (no real plan): least recompute cost (s) with
 * kept activation bytes <= kept_limit, by `solver`. False when infeasible. */
bool pass_remat_solve(const Graph *g, int64_t kept_limit, int solver, double *cost,
                      int64_t *kept, bool *exact);
/* Prints the budget sweep table for g (after simplify): npoints budgets from
 * the smallest feasible to the no-recompute peak; per budget auto and each
 * fixed policy: fits, planned peak, extra FLOPs %, predicted step time.
 * Plans through o->after as pass_remat does (pass_opts_after(o, "remat")). */
/* One budget of the sweep: auto's choice there (fits false: none fits). */
typedef struct {
    int64_t budget, peak;
    bool fits;
    double extra_flops; /* share of the step's FLOPs recomputed */
    double step_seconds; /* the cost model's predicted step */
} RematSweepPoint;
/* The table on f (NULL: not printed); with pts, auto's npoints rows there. */
bool pass_remat_sweep(const Graph *g, const PassOpts *o, int npoints, FILE *f,
                      RematSweepPoint *pts, Diag *d);

/* comm.c: data-parallel gradient averaging, when o->nranks > 1 or
 * o->grad_accum > 1 (otherwise the graph is unchanged). Runs after the
 * optimizer pass (the graph has "grad.P" outputs the update reads).
 * grad_accum K > 1: per param adds state "accum.P" (zeros; the runtime puts
 * the sum of the first K-1 micro-batches' gradients there) and replaces the
 * gradient by (grad.P + accum.P) / K. nranks > 1: groups the gradients into
 * buckets in the order their producers run (program order), each closed once
 * it reaches o->bucket_bytes; inserts `allreduce_start {bucket}` over a
 * bucket's gradients right after the op producing its last gradient (with
 * o->no_overlap: after the last backward op) and one `allreduce_wait` per
 * gradient right before the first op that reads any gradient of the bucket;
 * every later reader and the "grad.P" output read the wait's result.
 * A sharded step (zero=1: the optimizer's reduce_scatter and all_gather)
 * gets reduce-scatter and all-gather buckets instead (docs/distributed.md);
 * its "grad.P" outputs are dropped (no rank holds a full mean gradient)
 * and "grad.shard" f32[S], the rank's shard of the mean gradient, added. */
#define PASS_COMM_BUCKET_DEFAULT ((int64_t)4 << 20)
bool pass_comm(Graph *g, const PassOpts *o, Diag *d);
/* The graph of one of the first K-1 micro-batches of a step, from a graph
 * after autodiff: per param "accum.P" (state, zeros) <- accum.P + grad.P;
 * no optimizer. */
bool pass_comm_micro(Graph *g, Diag *d);
/* Prints each bucket of g (after pass_comm): members, bytes, the op after
 * which it starts and the op before which it is first waited for. */
void pass_comm_print(const Graph *g, FILE *f);

/* ---- stages.c: pipeline stages (pp) --------------------------------------
 * The cut of a forward graph (after pass_attention, before autodiff) into n
 * stages, contiguous in program order: stage s runs ops [first[s],
 * first[s+1]); cross[s][0..ncross[s]) are the tensors (ids of the forward
 * graph, ascending) that cross boundary s (1 <= s < n): made in an earlier
 * stage, read in s or later. cost[s]: the stage's share of the cost model
 * (FLOPs + bytes); bytes[s]: the bytes crossing boundary s. */
typedef struct {
    int n;
    int *first;
    int **cross;
    int *ncross;
    double *cost;
    int64_t *bytes;
    int nmax; /* the most stages g can be cut into (pass_stage_max) */
} PassStageCut;
/* Cuts g into n stages (see stages.c); false with a message (more stages
 * than places between layers to cut, a pp_stage hint inside a layer,
 * state updates) otherwise. Random ops (dropout) go with their stage: a
 * random op's numbers depend on its key, the seed and the step only, so
 * each stage draws one rank's masks. */
bool pass_stage_cut(const Graph *g, int n, PassStageCut *c, Diag *d);
void pass_stage_cut_free(PassStageCut *c);
/* The finest cut: a boundary at every place pass_stage_cut may take where
 * one tensor crosses (pp_stage hints ignored, a piece may hold no param);
 * c->n pieces. For timing the pieces (pp_balance = "time"). */
bool pass_stage_pieces(const Graph *g, PassStageCut *c, Diag *d);
/* The most stages pass_stage_cut makes of g: the places between layers
 * where one tensor crosses, plus one (0: g cannot be cut at all). kiln
 * plan checks --pp against it as kiln compile does. */
int pass_stage_max(const Graph *g);
/* pass_stage_cut balancing measured time instead of the cost model's:
 * secs[j], piece j's time in a stage after the first (F, B and W apart),
 * secs0[j] in the first (no B), for the pieces of pass_stage_pieces of g,
 * each shared among the piece's ops as the cost model shares it. Without
 * pp_stage hints the boundaries minimise the slowest stage's time, at any
 * place at most twice the fewest bytes cross (inside a piece too: a
 * transformer's half-block is cut where two residual-sized tensors cross);
 * with hints, pass_stage_cut's choice with secs's weights. */
bool pass_stage_cut_timed(const Graph *g, int n, const PassStageCut *pieces,
                          const double *secs, const double *secs0, PassStageCut *c, Diag *d);
/* Whether stage s reads tensor t (a param it owns). */
bool pass_stage_owns(const Graph *g, const PassStageCut *c, int s, int t);
/* Stage s's graph from the forward graph fwd: its ops, the tensors it
 * receives as inputs "pp.recv.K" (K: their order in cross[s]), and as
 * outputs "pp.send.K" (s < n-1) or the model's outputs it makes (the last
 * stage). backward: the graph autodiff differentiates: "pp.recv.K" are
 * params (their gradients are sent back), and a non-last stage's "loss"
 * is sum_K sum(pp.send.K * pp.seed.K), inputs "pp.seed.K" holding the
 * gradients received for what it sent, and "pp.send.K" stay outputs; the
 * last stage keeps only "loss". */
Graph *pass_stage_graph(const Graph *fwd, const PassStageCut *c, int s, bool backward);
/* The differentiated stage graph g (pass_stage_graph(..., true), then
 * autodiff) split into three programs: F, the forward ops (what is sent,
 * the last stage's loss, and what B and W read); B, the backward ops the
 * received tensors' gradients ("grad.pp.recv.K") need; W, the other
 * backward ops (the params' gradients, "grad.P"). A tensor a later part
 * reads is an output "pp.stash.T" of its part and an input of that name of
 * the reader (T: its id in g), except what is made from constants and
 * params only, or by elementwise and data-movement ops from those and from
 * tensors B and W read anyway: B and W make that again. A part may have no
 * ops (stage 0 has no B). */
void pass_stage_split(const Graph *g, bool last, Graph **f, Graph **b, Graph **w);
/* Prints the cut: each stage's ops, cost share, params and what it
 * receives; the params read by several stages (tied). */
void pass_stage_cut_print(const Graph *g, const PassStageCut *c, FILE *f);
/* Schedules: each stage's order of F (forward), B (the received tensors'
 * gradients) and W (the params' gradients) of the m micro-batches; gpipe
 * and 1f1b run each W right after its B, as one backward (Megatron-LM's),
 * and send the gradient after W; zb-h1 (Qi et al.'s ZB-H1) sends it after
 * B and moves W's into the slots where 1f1b idles, holding n micro-batches
 * on every stage, 1f1b's peak (stages.c). */
enum { PASS_SCHED_1F1B, PASS_SCHED_GPIPE, PASS_SCHED_ZBH1 };
typedef struct {
    char kind; /* 'F', 'B' or 'W' */
    int mb;    /* micro-batch */
} PassStageAct;
const char *pass_stage_schedule_name(int kind);
int pass_stage_schedule_parse(const char *name); /* -1: unknown */
/* Stage s's 3m actions into out; their count (3m). Receives: an F of a
 * stage s > 0 first receives its activation from s-1, a B of s < n-1 its
 * gradient from s+1; an F of s < n-1 ends by sending its activation, a B
 * (zb-h1) or W (gpipe, 1f1b) of s > 0 by sending the received
 * activation's gradient. W's run in micro-batch order. */
int pass_stage_schedule(int kind, int n, int m, int s, PassStageAct *out);
/* pass_stage_schedule with, under zb-h1, at most wcap[t] W's waiting on
 * stage t (n entries; wcap[t] < 0 or >= t: t, the default; NULL: all
 * default), so stage t holds n - t + min(t, wcap[t]) micro-batches: the
 * cap of a caller that knows what a held micro-batch costs (kiln plan).
 * gpipe and 1f1b ignore it. */
int pass_stage_schedule_capped(int kind, int n, int m, int s, const int *wcap,
                               PassStageAct *out);
/* Every stage's actions at once: stage t's 3m into out[t * 3m ...]. */
void pass_stage_schedule_all(int kind, int n, int m, const int *wcap, PassStageAct *out);
/* The `stages` dump: the schedule as a table, stages by time slots (F, B
 * and W one slot each), the idle share next to the formulas, and each
 * stage's program with its sends and receives. */
void pass_stage_schedule_print(int kind, int n, int m, FILE *f);
/* The same with zb-h1's caps wcap (pass_stage_schedule_capped; NULL: none). */
void pass_stage_schedule_print_capped(int kind, int n, int m, const int *wcap, FILE *f);

#endif
