/* cuda_nccl.c - gradient all-reduces between GPU ranks through NCCL, part
 * of the CUDA module (libkiln_cuda.so).
 *
 * NCCL (libnccl.so.2) is opened with dlopen the first time a plan with
 * allreduce steps is set up (nccl_open.c), so the module loads, and one GPU
 * trains, where NCCL is not installed. The unique id is made by rank 0 and
 * broadcast through the caller's MPI (RtCommGroup.bcast); one communicator
 * per plan, on the device of the backend's context.
 *
 * Per bucket, in stream order: a `ready` event on the compute stream after
 * the bucket's last gradient; the communication stream waits on it, records
 * `t0`, runs one NCCL group of in-place ncclAllReduce(ncclAvg) calls (one
 * per tensor, f32) and records `done`; a wait step records `w` on the
 * compute stream and makes it wait on `done`. Nothing here blocks the host
 * until the statistics are read after the run (kc_comm_events).
 *
 * zero=1 (sharded optimizer state, docs/distributed.md): a reduce-scatter
 * bucket is the same with one NCCL group of ncclReduce(ncclAvg) calls, one
 * per piece (a tensor's part in one rank's shard) to the owning rank, into
 * its shard; an all-gather bucket first copies this rank's part of the new
 * shard into a snapshot buffer (f32[S], outside the planned arena) on the
 * compute stream, then broadcasts each piece from its owner's snapshot into
 * every rank's param (ncclBroadcast). An all-gather started in one run and
 * not waited for is carried into the next (the executor's setup_defer).
 * shard_pack runs here too: copies on the compute stream.
 *
 * Tensor parallelism (kc_tp_open): a second communicator per process, over
 * its TP group (world rank w is TP rank w % tp of dp group w / tp; the id
 * broadcast over the group), for the plan's CG_STEP_TP steps. Each step
 * runs on the same communication stream as the buckets, after a `ready`
 * event of the compute stream, between a `t0` and a `done` event (with
 * its layout copies, TpOp); the compute stream waits on `done` later
 * (kc_tp_wait: records `w`, then waits), where the executor says: before
 * the first step that reads the result, or at the end of the run
 * (kc_tp_join). The collective reads the operand in place, or a copy made
 * at the step on the compute stream where a step before that wait reuses
 * the operand's bytes (kc_tp_operand_copy). The TP communicator is the
 * process's, shared by every executor's plan over the group (SharedTp).
 * One stream for both communicators keeps every rank's NCCL
 * calls in plan order, so the two communicators' kernels never wait on
 * each other across ranks; a TP step queued behind an unfinished bucket
 * waits for it.
 *
 * Pipeline stages' transfers (KcPp) are in cuda_pp.c.
 *
 * Host waits on the device (kc_wait_stream, kc_wait_event, kc_pp_wait)
 * poll instead of blocking, so that a peer that hangs (its NCCL kernel
 * never finishes here) is noticed: when an all-reduce has been running on
 * the communication stream, or a pipeline send or receive has been queued,
 * for the group's timeout with none finishing, the communicator is aborted
 * and the group's lost callback names the lost rank or transfer and stops
 * every rank (dist/mpi.c, as on the CPU).
 *
 * NCCL and the driver functions used here: kc_nc (kc_nccl.h, nccl_open.c). */
#include "kc_nccl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STR_(x) #x
#define STR(x) STR_(x) /* a driver function's versioned name */

int kc_device_ordinal(void)
{
    const char *env = getenv("KILN_CUDA_DEVICE");
    if (env && *env)
        return atoi(env);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (lr && *lr && getenv("OMPI_COMM_WORLD_SIZE"))
        return atoi(lr);
    return 0;
}

/* One NCCL call of a sharded bucket: count f32 elements whose owner is
 * rank `root`. Reduce: send (every rank's gradient piece) averaged into recv
 * (the root's shard); broadcast: send (the root's snapshot of its shard)
 * into recv (every rank's param). The pointer a rank does not use is 0. */
typedef struct {
    CUdeviceptr send, recv;
    size_t count;
    int root;
} Piece;

typedef struct {
    CgColl coll;
    int k;                   /* tensors */
    CUdeviceptr *ptr;
    size_t *count;           /* f32 elements */
    int64_t bytes;
    Piece *pc;               /* sharded buckets: one NCCL call each, in flat order */
    int npc;
    CUdeviceptr snap_src, snap_dst; /* all-gather: this rank's part of the shard, */
    size_t snap_bytes;               /* copied into the snapshot at the start */
    CUevent ready, t0, done, w;
    bool started, waited;    /* in the current run (an all-gather: since its start) */
    bool counted;            /* reported by kc_comm_events since its start */
    CUevent pt0, pdone, pw;  /* an all-gather's previous t0, done, w: waited for in the
                                run after its start, not yet reported when it restarts */
    bool prev;               /* pt0, pdone, pw await kc_comm_events */
} Bucket;

/* One TP step (CG_STEP_TP; tensor parallelism) as one NCCL call on the TP
 * group's communicator, of `count` elements per rank (f32, or bf16 where
 * both tensors are stored as bf16: precision=bf16's activations; NCCL sums
 * bf16 in float and rounds each partial sum): an all-reduce
 * (ncclSum) of the whole tensor, x to y (in place when equal); an
 * all-gather of [outer][chunk] into [outer][rank][chunk]; a reduce-scatter
 * of [outer][rank][chunk] into [outer][chunk]. NCCL's all-gather and
 * reduce-scatter move contiguous rank-major chunks, [rank][outer * chunk],
 * so with outer > 1 (the split axis is not the first: gpt's loss gathers
 * [B, T, 1] into [B, T, 2]) the call goes through the staging buffer
 * (KcComm.stage) and one 2D copy per rank (cuMemcpy2DAsync, `outer` rows of
 * chunk elements) turns [rank][outer][chunk] into [outer][rank][chunk] after
 * a gather, or the reverse before a reduce-scatter, on the communication
 * stream. */
typedef struct {
    int step;
    CgColl coll;              /* the op's: all-reduce, reduce-scatter or all-gather */
    CUdeviceptr x, y;
    size_t count;             /* per rank */
    ncclDataType_t type;      /* ncclFloat32 or ncclBfloat16 */
    int64_t es;               /* bytes per element: 4 or 2 */
    int64_t outer, chunk;     /* gathers and reduce-scatters (outer > 1: staged) */
    int64_t bytes;            /* per rank: the all-reduce's buffer, the gather's result, the
                                 reduce-scatter's operand (rt_comm_tp_stats's figure) */
    CUevent t0, done;         /* on the communication stream, around its calls */
    CUevent w;                /* on the compute stream, right before it waits on done */
    int64_t xbytes;           /* the operand's */
    int slot;                 /* kc_tp_operand_copy: the operand's copy (KcComm.slot), -1: none */
    bool started, waited, counted; /* in the current run; reported by kc_tp_events */
} TpOp;

/* A TP group's NCCL communicator, one per process and group: the KcComms
 * of every executor's plan over that group (the training step, its
 * micro-batch and evaluation executors) share it (kc_tp_open). Each
 * executor issues its calls on its own communication stream, so every
 * call first waits for the one issued before it through the communicator
 * when that came from another stream (`last`): the device runs the
 * communicator's calls one at a time, in the order every rank issued them
 * (the executors run in the same order on every rank). */
typedef struct SharedTp {
    CUcontext ctx;
    const void *group;       /* RtCommGroup.arg: the process's TP group */
    int rank, size;
    ncclComm_t nc;           /* NULL once aborted */
    bool nonblocking;
    int refs;
    CUevent last;            /* after the last call issued through nc */
    CUstream last_stream;    /* where `last` was recorded; NULL: none yet */
    struct SharedTp *next;
} SharedTp;

static SharedTp *shared_tp; /* the process's TP communicators */

struct KcComm {
    const CgPlan *p;
    CUcontext ctx;
    CUstream s, comm;
    ncclComm_t nc;
    int rank, size;
    Bucket *b;
    int nb;
    bool pending;            /* a run's buckets not collected yet */
    double timeout;          /* seconds (RtCommGroup.timeout); 0: waits are unbounded */
    void (*lost)(void *arg, const char *what);
    void *lost_arg;
    bool nonblocking;        /* the communicator is non-blocking (init_nonblocking) */
    const int64_t *offset;   /* the device arena's offsets, per tensor (borrowed) */
    CUdeviceptr arena;
    CUdeviceptr snap;        /* zero=1: the all-gathers' source, f32[S] (0: none) */
    /* the TP group's communicator (kc_tp_open): its steps, no buckets */
    TpOp *tp;
    int ntp;
    CUdeviceptr stage;       /* rank count * outer * chunk elements of the largest staged TP step */
    int *tp_of;              /* per plan step: index in tp, -1 */
    CUevent tp_ready;        /* on the compute stream before each TP step */
    struct {                 /* kc_tp_operand_copy's operand copies */
        CUdeviceptr p;
        int64_t bytes;
        int until;           /* the last user's wait comes before this plan step */
    } *slot;
    int nslot;
    bool tp_pending;         /* TP steps of a run not collected yet */
    KcComm *also;            /* another communicator of this context whose collectives the
                                host waits also watch (kc_comm_also) */
    SharedTp *sh;            /* kc_tp_open: the group's communicator (nc is its) */
};

/* nc aborted (ncclCommAbort): no KcComm of the process uses it again. */
static void forget_nc(KcComm *k)
{
    if (k->sh)
        k->sh->nc = NULL;
    k->nc = NULL;
}

/* The process's communicator over the TP group g on ctx, one more user;
 * NULL when there is none yet. */
static SharedTp *find_shared(const RtCommGroup *g, CUcontext ctx)
{
    for (SharedTp *h = shared_tp; h; h = h->next)
        if (h->ctx == ctx && h->group == g->arg && h->rank == g->rank && h->size == g->size &&
            h->nc) {
            h->refs++;
            return h;
        }
    return NULL;
}

/* k's communicator, just opened, becomes its group's shared one. */
static bool share_tp(KcComm *k, const RtCommGroup *g, Diag *d)
{
    SharedTp *h = calloc(1, sizeof *h);
    if (!h) {
        kc_dmsg(d, "out of memory");
        return false;
    }
    if (!DRV(kc_nc.cuEventCreate(&h->last, CU_EVENT_DISABLE_TIMING), d)) {
        free(h);
        return false;
    }
    *h = (SharedTp){k->ctx, g->arg, g->rank, g->size, k->nc, k->nonblocking, 1, h->last,
                    NULL, shared_tp};
    shared_tp = h;
    k->sh = h;
    return true;
}

/* One user less; the last one destroys the communicator (the caller has
 * waited for its stream). */
static void unshare_tp(SharedTp *h)
{
    if (!h || --h->refs > 0)
        return;
    for (SharedTp **pp = &shared_tp; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    if (h->nc)
        kc_nc.ncclCommDestroy(h->nc);
    kc_nc.cuEventDestroy(h->last);
    free(h);
}

static bool make_events(Bucket *b, Diag *d)
{
    return DRV(kc_nc.cuEventCreate(&b->ready, CU_EVENT_DISABLE_TIMING), d) &&
           DRV(kc_nc.cuEventCreate(&b->t0, CU_EVENT_DEFAULT), d) &&
           DRV(kc_nc.cuEventCreate(&b->done, CU_EVENT_DEFAULT), d) &&
           DRV(kc_nc.cuEventCreate(&b->w, CU_EVENT_DEFAULT), d) &&
           (b->coll != CG_COLL_ALL_GATHER ||
            (DRV(kc_nc.cuEventCreate(&b->pt0, CU_EVENT_DEFAULT), d) &&
             DRV(kc_nc.cuEventCreate(&b->pdone, CU_EVENT_DEFAULT), d) &&
             DRV(kc_nc.cuEventCreate(&b->pw, CU_EVENT_DEFAULT), d)));
}

/* A sharded bucket (zero=1; ir.h, AK_SHARD) as NCCL calls: its tensors
 * are one flat range from st->sh_start; each piece is one tensor's part
 * inside one rank's shard (ir_shard_range), in flat order, the same on
 * every rank. A reduce-scatter piece is an ncclReduce(ncclAvg) to the
 * owner, into its shard (st->sh_buf) at the piece's place; an all-gather
 * piece is an ncclBroadcast from the owner's snapshot of its shard (k->snap,
 * the same layout) into every rank's param. No padding: NCCL's
 * ReduceScatter and AllGather need equal counts per rank, and a bucket
 * that lies in one rank's shard would move nranks times its size padded. */
static bool shard_pieces(KcComm *k, const CgStep *st, Bucket *b, const DType *storage, Diag *d)
{
    const Graph *g = k->p->g;
    if (!kc_nc.reduce || !kc_nc.bcast) {
        kc_dmsg(d, "zero=1 on the GPU: libnccl.so.2 lacks ncclReduce or ncclBroadcast "
                "(expected NCCL 2.10.3 or newer)");
        return false;
    }
    if (st->sh_nranks != k->size) {
        kc_dmsg(d, "plan bucket %d is sharded over %d ranks, the NCCL group has %d", st->bucket,
                st->sh_nranks, k->size);
        return false;
    }
    if (storage[st->sh_buf] != DT_F32) {
        kc_dmsg(d, "zero=1 on the GPU: the shard %s is not stored as f32",
                g->t.v[st->sh_buf].name ? g->t.v[st->sh_buf].name : "?");
        return false;
    }
    CUdeviceptr shard = k->arena + (CUdeviceptr)k->offset[st->sh_buf];
    int64_t S = 1;
    for (int r = 0; r < g->t.v[st->sh_buf].s.rank; r++)
        S *= g->t.v[st->sh_buf].s.dim[r];
    if (st->coll == CG_COLL_ALL_GATHER && !k->snap &&
        !DRV(kc_nc.cuMemAlloc(&k->snap, (size_t)S * 4 + 4), d))
        return false;
    b->pc = calloc((size_t)(b->k + k->size) + 1, sizeof(Piece));
    if (!b->pc) {
        kc_dmsg(d, "out of memory");
        return false;
    }
    int64_t f = st->sh_start, end = f, moff, mlen;
    for (int i = 0; i < b->k; i++)
        end += (int64_t)b->count[i];
    ir_shard_range(st->sh_total, k->size, k->rank, &moff, &mlen);
    int64_t a = f > moff ? f : moff, z = end < moff + mlen ? end : moff + mlen;
    if (st->coll == CG_COLL_ALL_GATHER && a < z) {
        b->snap_src = shard + (CUdeviceptr)((a - moff) * 4);
        b->snap_dst = k->snap + (CUdeviceptr)((a - moff) * 4);
        b->snap_bytes = (size_t)(z - a) * 4;
    }
    for (int i = 0; i < b->k; f += (int64_t)b->count[i], i++)
        for (int r = 0; r < k->size; r++) {
            int64_t off, len;
            ir_shard_range(st->sh_total, k->size, r, &off, &len);
            int64_t lo = f > off ? f : off;
            int64_t hi = f + (int64_t)b->count[i] < off + len ? f + (int64_t)b->count[i] : off + len;
            if (lo >= hi)
                continue;
            if (r == k->rank && (lo - off) + (hi - lo) > S) {
                kc_dmsg(d, "plan bucket %d: rank %d's part ends past its shard", st->bucket, r);
                return false;
            }
            CUdeviceptr in_t = b->ptr[i] + (CUdeviceptr)((lo - f) * 4);
            CUdeviceptr in_s = (r == k->rank ? (st->coll == CG_COLL_REDUCE_SCATTER ? shard : k->snap)
                                             : 0);
            if (in_s)
                in_s += (CUdeviceptr)((lo - off) * 4);
            Piece *q = &b->pc[b->npc++];
            q->count = (size_t)(hi - lo);
            q->root = r;
            q->send = st->coll == CG_COLL_REDUCE_SCATTER ? in_t : in_s;
            q->recv = st->coll == CG_COLL_REDUCE_SCATTER ? in_s : in_t;
        }
    return true;
}

/* Each bucket's tensors from its start step. */
static bool setup_buckets(KcComm *k, const DType *storage, const int64_t *offset,
                          CUdeviceptr arena, Diag *d)
{
    const CgPlan *p = k->p;
    const Graph *g = p->g;
    for (int s = 0; s < p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_ALLREDUCE_START && p->steps.v[s].bucket + 1 > k->nb)
            k->nb = p->steps.v[s].bucket + 1;
    k->b = calloc((size_t)k->nb + 1, sizeof(Bucket));
    if (!k->b) {
        kc_dmsg(d, "out of memory");
        return false;
    }
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_ALLREDUCE_START)
            continue;
        Bucket *b = &k->b[st->bucket];
        if (b->ptr) {
            kc_dmsg(d, "plan step %d: bucket %d is started twice in one step", s, st->bucket);
            return false;
        }
        b->k = st->nargs;
        b->ptr = calloc((size_t)b->k + 1, sizeof(CUdeviceptr));
        b->count = calloc((size_t)b->k + 1, sizeof(size_t));
        if (!b->ptr || !b->count) {
            kc_dmsg(d, "out of memory");
            return false;
        }
        b->coll = st->coll;
        for (int i = 0; i < b->k; i++) {
            int t = st->args[i];
            const Tensor *x = &g->t.v[t];
            if (x->s.dtype != DT_F32 || storage[t] != DT_F32) {
                if (st->coll == CG_COLL_ALLREDUCE)
                    kc_dmsg(d, "NCCL: bucket %d holds %s, a %s tensor (only f32 gradients are "
                            "averaged over ranks)",
                         st->bucket, x->name ? x->name : "?",
                         storage[t] == DT_BF16 ? "bf16" : "non-f32");
                else
                    kc_dmsg(d, "zero=1 on the GPU: the %s bucket %d holds %s, a %s tensor "
                            "(expected f32: the sharded optimizer reduces f32 gradients and "
                            "gathers f32 params)",
                         st->coll == CG_COLL_REDUCE_SCATTER ? "reduce-scatter" : "all-gather",
                         st->bucket, x->name ? x->name : "?",
                         storage[t] == DT_BF16 ? "bf16" : "non-f32");
                return false;
            }
            size_t n = 1;
            for (int r = 0; r < x->s.rank; r++)
                n *= (size_t)x->s.dim[r];
            b->ptr[i] = arena + (CUdeviceptr)offset[t];
            b->count[i] = n;
            b->bytes += (int64_t)(n * 4);
        }
        if (st->coll != CG_COLL_ALLREDUCE && !shard_pieces(k, st, b, storage, d))
            return false;
        if (!make_events(b, d))
            return false;
    }
    return true;
}

/* The op's name (the module links nothing of kilncore: no ir_opinfo). */
static const char *tp_name(Opcode c)
{
    return c == OP_TP_ALLREDUCE        ? "tp_allreduce"
           : c == OP_TP_ALL_GATHER     ? "tp_all_gather"
           : c == OP_TP_REDUCE_SCATTER ? "tp_reduce_scatter"
                                       : "an op";
}

/* The plan's TP steps as NCCL calls (TpOp), their events. */
static bool setup_tp_steps(KcComm *k, const DType *storage, const int64_t *offset,
                           CUdeviceptr arena, Diag *d)
{
    const CgPlan *p = k->p;
    const Graph *g = p->g;
    k->tp_of = calloc((size_t)p->steps.n + 1, sizeof(int));
    k->tp = calloc((size_t)p->steps.n + 1, sizeof(TpOp));
    if (!k->tp_of || !k->tp) {
        kc_dmsg(d, "out of memory");
        return false;
    }
    if (!DRV(kc_nc.cuEventCreate(&k->tp_ready, CU_EVENT_DISABLE_TIMING), d))
        return false;
    int64_t stage = 0; /* bytes of the staging buffer */
    for (int s = 0; s < p->steps.n; s++) {
        k->tp_of[s] = -1;
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_TP)
            continue;
        const Op *op = &g->ops.v[st->op];
        int tx = op->in[0], ty = op->out;
        const Shape *xs = &g->t.v[tx].s, *ys = &g->t.v[ty].s;
        /* f32 or bf16 (the storage the device plan gives both: a bf16
         * activation's collective moves bf16) */
        bool f32 = storage[tx] == DT_F32 && storage[ty] == DT_F32 && xs->dtype == DT_F32,
             bf16 = storage[tx] == DT_BF16 && storage[ty] == DT_BF16;
        if (!f32 && !bf16) {
            kc_dmsg(d, "%s:%d: tensor parallelism on the GPU: a %s from a tensor stored as %s "
                    "into one stored as %s (expected both f32 or both bf16)",
                    op->loc.file ? op->loc.file : "?", op->loc.line, tp_name(op->code),
                    storage[tx] == DT_BF16 ? "bf16" : storage[tx] == DT_F32 ? "f32" : "other",
                    storage[ty] == DT_BF16 ? "bf16" : storage[ty] == DT_F32 ? "f32" : "other");
            return false;
        }
        int64_t es = f32 ? 4 : 2;
        int64_t nx = 1, ny = 1, outer = 1;
        for (int r = 0; r < xs->rank; r++)
            nx *= xs->dim[r];
        for (int r = 0; r < ys->rank; r++)
            ny *= ys->dim[r];
        for (int r = 0; r < op->attr.ia[0] && r < xs->rank; r++)
            outer *= xs->dim[r];
        TpOp *t = &k->tp[k->ntp];
        t->step = s;
        t->slot = -1;
        t->type = f32 ? ncclFloat32 : ncclBfloat16;
        t->es = es;
        t->xbytes = es * nx;
        t->x = arena + (CUdeviceptr)offset[tx];
        t->y = arena + (CUdeviceptr)offset[ty];
        int64_t n = k->size;
        switch (op->code) {
        case OP_TP_ALLREDUCE:
            t->coll = CG_COLL_ALLREDUCE;
            t->count = (size_t)ny;
            t->bytes = es * ny;
            break;
        case OP_TP_ALL_GATHER: /* [outer][chunk] -> [outer][rank][chunk] */
            t->coll = CG_COLL_ALL_GATHER;
            t->count = (size_t)nx;
            t->outer = outer;
            t->chunk = nx / outer;
            t->bytes = es * ny;
            break;
        case OP_TP_REDUCE_SCATTER: /* [outer][rank][chunk] -> [outer][chunk] */
            t->coll = CG_COLL_REDUCE_SCATTER;
            t->count = (size_t)ny;
            t->outer = outer;
            t->chunk = ny / outer;
            t->bytes = es * nx;
            break;
        default:
            kc_dmsg(d, "plan step %d: %s is not a TP collective", s, tp_name(op->code));
            return false;
        }
        bool ok = op->code == OP_TP_ALLREDUCE ? nx == ny
                                              : (op->code == OP_TP_ALL_GATHER ? nx * n == ny
                                                                              : ny * n == nx);
        if (!ok || outer < 1 || (t->coll != CG_COLL_ALLREDUCE && t->outer * t->chunk !=
                                                                     (int64_t)t->count)) {
            kc_dmsg(d, "plan step %d: %s of %lld elements into %lld over %d ranks", s,
                    tp_name(op->code), (long long)nx, (long long)ny, k->size);
            return false;
        }
        /* NCCL: an all-reduce in place or between disjoint buffers; the
         * gathers' in-place forms are not what the plan's layout needs */
        bool apart =
            t->x + (CUdeviceptr)(es * nx) <= t->y || t->y + (CUdeviceptr)(es * ny) <= t->x;
        if (!apart && !(t->coll == CG_COLL_ALLREDUCE && t->x == t->y)) {
            kc_dmsg(d, "plan step %d: %s's operand and result overlap in the arena", s,
                    tp_name(op->code));
            return false;
        }
        if (!DRV(kc_nc.cuEventCreate(&t->t0, CU_EVENT_DEFAULT), d) ||
            !DRV(kc_nc.cuEventCreate(&t->done, CU_EVENT_DEFAULT), d) ||
            !DRV(kc_nc.cuEventCreate(&t->w, CU_EVENT_DEFAULT), d))
            return false;
        if (t->outer > 1 && es * n * (int64_t)t->count > stage)
            stage = es * n * (int64_t)t->count;
        k->tp_of[s] = k->ntp++;
    }
    if (stage > 0 && !kc_nc.copy2d) {
        kc_dmsg(d, "tensor parallelism on the GPU: the CUDA driver lacks %s (driver too old?)",
                STR(cuMemcpy2DAsync));
        return false;
    }
    if (stage > 0 && !DRV(kc_nc.cuMemAlloc(&k->stage, (size_t)stage), d))
        return false;
    if (k->ntp > 0 && (!kc_nc.allgather || !kc_nc.rscatter)) {
        kc_dmsg(d, "tensor parallelism on the GPU: libnccl.so.2 lacks ncclAllGather or "
                "ncclReduceScatter (expected NCCL 2.10.3 or newer)");
        return false;
    }
    return true;
}

/* Polls the communicator until its pending NCCL work has been issued
 * (non-blocking mode: setup, or a group's connections). Past the timeout
 * with no answer, the communicator is aborted and the lost callback names
 * the lost rank; false with d set. */
static bool settle(KcComm *k, const char *what, Diag *d)
{
    double t0 = kc_now();
    long ns = 50000;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        if (!NC(kc_nc.async_error(k->nc, &st), d))
            return false;
        if (st == ncclSuccess)
            return true;
        if (st != ncclInProgress)
            return kc_nccl_fail(st, what, __FILE__, __LINE__, d);
        if (kc_now() - t0 > k->timeout) {
            kc_nc.ncclCommAbort(k->nc);
            forget_nc(k);
            k->lost(k->lost_arg, what);
            kc_dmsg(d, "%s did not finish within %g s (comm_timeout)", what, k->timeout);
            return false;
        }
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 10000000)
            ns *= 2;
    }
}

/* ncclCommInitRankConfig with blocking = 0, then settle(): a peer that never
 * joins is noticed within the timeout, as a hung all-reduce is. Every later
 * call on the communicator is non-blocking too (kc_allreduce_start settles
 * after its group). */
static bool init_nonblocking(KcComm *k, ncclUniqueId id, Diag *d)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = kc_nc.init_config(&k->nc, k->size, id, k->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        k->nc = NULL;
        return kc_nccl_fail(r, "ncclCommInitRankConfig", __FILE__, __LINE__, d);
    }
    k->nonblocking = true;
    return settle(k, "the NCCL communicator setup (ncclCommInitRankConfig)", d);
}

/* kc_comm_open (tp false: p's buckets) and kc_tp_open (tp: its TP steps). */
static KcComm *comm_open(const RtCommGroup *g, const CgPlan *p, const DType *storage,
                         const int64_t *offset, CUdeviceptr arena, CUcontext ctx,
                         CUstream compute, CUstream comm, bool tp, Diag *d)
{
    const char *why;
    if (!kc_nccl_open(&why)) {
        if (tp)
            kc_dmsg(d, "--device cuda: tensor parallelism over %d ranks runs its collectives "
                    "on the GPU through NCCL, but %s", g->size, why);
        else
            kc_dmsg(d, "--device cuda: the step averages gradients over %d rank%s on the GPU "
                    "through NCCL, but %s",
                    g->size, g->size == 1 ? "" : "s", why);
        return NULL;
    }
    KcComm *k = calloc(1, sizeof *k);
    if (!k) {
        kc_dmsg(d, "out of memory");
        return NULL;
    }
    k->p = p;
    k->ctx = ctx;
    k->s = compute;
    k->comm = comm;
    k->rank = g->rank;
    k->size = g->size;
    k->offset = offset;
    k->arena = arena;
    if (g->lost && g->timeout > 0) {
        k->timeout = g->timeout;
        k->lost = g->lost;
        k->lost_arg = g->arg;
    }
    if (!DRV(kc_nc.cuCtxSetCurrent(ctx), d) ||
        !(tp ? setup_tp_steps(k, storage, offset, arena, d)
             : setup_buckets(k, storage, offset, arena, d)))
        goto fail;
    if (tp && (k->sh = find_shared(g, ctx))) { /* every rank of the group finds it */
        k->nc = k->sh->nc;
        k->nonblocking = k->sh->nonblocking;
        return k;
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (g->rank == 0 && !NC(kc_nc.ncclGetUniqueId(&id), d)) {
        /* the other ranks wait in the broadcast: mpirun stops them when
         * this rank exits (else comm_timeout does); d says why */
        goto fail;
    }
    if (g->size > 1 && !(g->bcast && g->bcast(g->arg, &id, sizeof id))) {
        kc_dmsg(d, "NCCL: cannot broadcast the unique id from rank 0%s",
                tp ? " of the TP group" : "");
        goto fail;
    }
    if (k->lost && kc_nc.init_config && kc_nc.async_error) {
        if (!init_nonblocking(k, id, d))
            goto fail;
    } else if (!NC(kc_nc.ncclCommInitRank(&k->nc, g->size, id, g->rank), d)) {
        k->nc = NULL;
        goto fail;
    }
    if (tp && !share_tp(k, g, d))
        goto fail;
    return k;
fail:
    kc_comm_close(k);
    return NULL;
}

KcComm *kc_comm_open(const RtCommGroup *g, const CgPlan *p, const DType *storage,
                     const int64_t *offset, CUdeviceptr arena, CUcontext ctx, CUstream compute,
                     CUstream comm, Diag *d)
{
    return comm_open(g, p, storage, offset, arena, ctx, compute, comm, false, d);
}

KcComm *kc_tp_open(const RtCommGroup *g, const CgPlan *p, const DType *storage,
                   const int64_t *offset, CUdeviceptr arena, CUcontext ctx, CUstream compute,
                   CUstream comm, Diag *d)
{
    return comm_open(g, p, storage, offset, arena, ctx, compute, comm, true, d);
}

bool kc_tp_shared(const KcComm *k) { return k && k->sh && k->sh->refs > 1; }

void kc_comm_also(KcComm *k, KcComm *other)
{
    if (k && k != other)
        k->also = other;
}

void kc_comm_close(KcComm *k)
{
    if (!k)
        return;
    kc_nc.cuCtxSetCurrent(k->ctx);
    if (k->comm && k->nc)
        kc_wait_stream(k, k->comm);
    if (k->sh)
        unshare_tp(k->sh);
    else if (k->nc)
        kc_nc.ncclCommDestroy(k->nc);
    for (int i = 0; k->b && i < k->nb; i++) {
        Bucket *b = &k->b[i];
        CUevent ev[] = {b->ready, b->t0, b->done, b->w, b->pt0, b->pdone, b->pw};
        for (int e = 0; e < 7; e++)
            if (ev[e])
                kc_nc.cuEventDestroy(ev[e]);
        free(b->ptr);
        free(b->count);
        free(b->pc);
    }
    if (k->snap)
        kc_nc.cuMemFree(k->snap);
    for (int i = 0; k->tp && i < k->ntp; i++) {
        if (k->tp[i].t0)
            kc_nc.cuEventDestroy(k->tp[i].t0);
        if (k->tp[i].done)
            kc_nc.cuEventDestroy(k->tp[i].done);
        if (k->tp[i].w)
            kc_nc.cuEventDestroy(k->tp[i].w);
    }
    if (k->tp_ready)
        kc_nc.cuEventDestroy(k->tp_ready);
    if (k->stage)
        kc_nc.cuMemFree(k->stage);
    for (int i = 0; i < k->nslot; i++)
        if (k->slot[i].p)
            kc_nc.cuMemFree(k->slot[i].p);
    free(k->slot);
    free(k->tp);
    free(k->tp_of);
    free(k->b);
    free(k);
}

/* A bucket of step s, checked. */
static Bucket *bucket_of(KcComm *k, int s, CgStepKind kind, Diag *d)
{
    const CgStep *st = &k->p->steps.v[s];
    if (st->kind != kind || st->bucket < 0 || st->bucket >= k->nb || !k->b[st->bucket].ptr) {
        kc_dmsg(d, "plan step %d is not a collective step of a known bucket", s);
        return NULL;
    }
    return &k->b[st->bucket];
}

void kc_comm_run_begins(KcComm *k)
{
    if (!k)
        return;
    for (int i = 0; i < k->ntp; i++)
        k->tp[i].started = k->tp[i].waited = k->tp[i].counted = false;
    for (int i = 0; i < k->nb; i++) {
        Bucket *b = &k->b[i];
        /* an all-gather keeps its state until its next start: one started in
         * the last run may be waited for in this one (the executor's
         * setup_defer), even before this call */
        if (b->coll != CG_COLL_ALL_GATHER)
            b->started = b->waited = false;
    }
}

bool kc_shard_pack(KcComm *k, int s, Diag *d)
{
    const CgStep *st = k ? &k->p->steps.v[s] : NULL;
    if (!st || st->kind != CG_STEP_SHARD_PACK || st->op < 0 || st->sh_nranks != k->size) {
        kc_dmsg(d, "plan step %d is not a shard_pack of this process's NCCL group", s);
        return false;
    }
    const Graph *g = k->p->g;
    const Tensor *y = &g->t.v[st->sh_buf];
    int64_t S = 1;
    for (int r = 0; r < y->s.rank; r++)
        S *= y->s.dim[r];
    CUdeviceptr out = k->arena + (CUdeviceptr)k->offset[st->sh_buf];
    int64_t off, len, f = st->sh_start;
    ir_shard_range(st->sh_total, st->sh_nranks, k->rank, &off, &len);
    if (!DRV(kc_nc.cuMemsetD8Async(out, 0, (size_t)S * 4, k->s), d))
        return false;
    for (int a = 0; a < st->nargs; a++) {
        const Tensor *x = &g->t.v[st->args[a]];
        int64_t n = 1;
        for (int r = 0; r < x->s.rank; r++)
            n *= x->s.dim[r];
        int64_t lo = f > off ? f : off, hi = f + n < off + len ? f + n : off + len;
        if (lo < hi &&
            !DRV(kc_nc.cuMemcpyDtoDAsync(out + (CUdeviceptr)((lo - off) * 4),
                                      k->arena + (CUdeviceptr)k->offset[st->args[a]] +
                                          (CUdeviceptr)((lo - f) * 4),
                                      (size_t)(hi - lo) * 4, k->s),
                 d))
            return false;
        f += n;
    }
    return true;
}

bool kc_allreduce_start(KcComm *k, int s, Diag *d)
{
    Bucket *b = bucket_of(k, s, CG_STEP_ALLREDUCE_START, d);
    if (!b)
        return false;
    if (b->coll == CG_COLL_ALL_GATHER && b->started && b->waited && !b->counted) {
        CUevent t0 = b->t0, done = b->done, w = b->w; /* keep the last gather's times */
        b->t0 = b->pt0, b->done = b->pdone, b->w = b->pw;
        b->pt0 = t0, b->pdone = done, b->pw = w;
        b->prev = true;
    }
    /* an all-gather reads a snapshot of this rank's part, taken in compute
     * stream order: the shard's bytes may be reused before the gather ends */
    if (b->snap_bytes &&
        !DRV(kc_nc.cuMemcpyDtoDAsync(b->snap_dst, b->snap_src, b->snap_bytes, k->s), d))
        return false;
    if (!DRV(kc_nc.cuEventRecord(b->ready, k->s), d) ||
        !DRV(kc_nc.cuStreamWaitEvent(k->comm, b->ready, 0), d) ||
        !DRV(kc_nc.cuEventRecord(b->t0, k->comm), d) || !NC(kc_nc.ncclGroupStart(), d))
        return false;
    bool ok = true;
    cudaStream_t cs = (cudaStream_t)k->comm;
    for (int i = 0; b->coll == CG_COLL_ALLREDUCE && i < b->k && ok; i++)
        ok = NC(kc_nc.ncclAllReduce((const void *)b->ptr[i], (void *)b->ptr[i], b->count[i],
                                 ncclFloat32, ncclAvg, k->nc, cs),
                d);
    for (int i = 0; i < b->npc && ok; i++) {
        const Piece *q = &b->pc[i];
        if (b->coll == CG_COLL_REDUCE_SCATTER)
            ok = NC(kc_nc.reduce((const void *)q->send, (void *)q->recv, q->count, ncclFloat32,
                                  ncclAvg, q->root, k->nc, cs),
                    d);
        else
            ok = NC(kc_nc.bcast((const void *)q->send, (void *)q->recv, q->count,
                                     ncclFloat32, q->root, k->nc, cs),
                    d);
    }
    Diag ignored;
    ncclResult_t ge = kc_nc.ncclGroupEnd();
    if (ge == ncclInProgress && k->nonblocking && ok) {
        char what[96];
        snprintf(what, sizeof what, "issuing the NCCL %s of bucket %d",
                 b->coll == CG_COLL_REDUCE_SCATTER ? "reduce-scatter"
                 : b->coll == CG_COLL_ALL_GATHER   ? "all-gather"
                                                   : "all-reduce",
                 k->p->steps.v[s].bucket);
        if (!settle(k, what, d))
            return false;
    } else if (!NC(ge, ok ? d : &ignored) || !ok) {
        return false;
    }
    if (!DRV(kc_nc.cuEventRecord(b->done, k->comm), d))
        return false;
    b->started = true;
    b->waited = b->counted = false;
    return true;
}

bool kc_allreduce_wait(KcComm *k, int s, Diag *d)
{
    Bucket *b = bucket_of(k, s, CG_STEP_ALLREDUCE_WAIT, d);
    if (!b)
        return false;
    if (!b->started) {
        kc_dmsg(d, "plan step %d waits for bucket %d, which this run has not started", s,
             k->p->steps.v[s].bucket);
        return false;
    }
    if (b->waited) /* the bucket's first wait already ordered the compute stream */
        return true;
    if (!DRV(kc_nc.cuEventRecord(b->w, k->s), d) ||
        !DRV(kc_nc.cuStreamWaitEvent(k->s, b->done, 0), d))
        return false;
    b->waited = true;
    k->pending = true;
    return true;
}

/* On the communication stream: `rows` rows of `width` bytes from src
 * (rows `spitch` apart) to dst (`dpitch` apart). */
static bool copy_rows(KcComm *k, CUdeviceptr dst, size_t dpitch, CUdeviceptr src, size_t spitch,
                      size_t width, size_t rows, Diag *d)
{
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c.srcDevice = src;
    c.srcPitch = spitch;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = dst;
    c.dstPitch = dpitch;
    c.WidthInBytes = width;
    c.Height = rows;
    return DRV(kc_nc.copy2d(&c, k->comm), d);
}

/* A staged TP step's layout copies, one per rank: [outer][rank][chunk] at
 * whole (y of a gather, x of a reduce-scatter) to or from
 * [rank][outer][chunk] at k->stage. */
static bool tp_relayout(KcComm *k, const TpOp *t, CUdeviceptr whole, bool to_whole, Diag *d)
{
    size_t c = (size_t)(t->es * t->chunk), n = (size_t)k->size, o = (size_t)t->outer;
    for (size_t r = 0; r < n; r++) {
        CUdeviceptr w = whole + (CUdeviceptr)(r * c), st = k->stage + (CUdeviceptr)(r * o * c);
        if (!(to_whole ? copy_rows(k, w, n * c, st, c, c, o, d)
                       : copy_rows(k, st, c, w, n * c, c, o, d)))
            return false;
    }
    return true;
}

bool kc_tp_run(KcComm *k, int s, Diag *d)
{
    if (!k || !k->tp_of || s < 0 || s >= k->p->steps.n || k->tp_of[s] < 0) {
        kc_dmsg(d, "plan step %d is not a TP step of this process's TP group", s);
        return false;
    }
    TpOp *t = &k->tp[k->tp_of[s]];
    bool staged = t->outer > 1;
    SharedTp *h = k->sh;
    if (!h || !h->nc) {
        kc_dmsg(d, "plan step %d: the TP group's NCCL communicator is gone (aborted)", s);
        return false;
    }
    k->nc = h->nc;
    /* an operand copied (kc_tp_operand_copy) on the compute stream: the
     * collective reads the copy (the operand's bytes may be reused before
     * the compute stream waits for it) */
    CUdeviceptr src = t->slot >= 0 ? k->slot[t->slot].p : t->x;
    if (t->slot >= 0 && !DRV(kc_nc.cuMemcpyDtoDAsync(src, t->x, (size_t)t->xbytes, k->s), d))
        return false;
    if (!DRV(kc_nc.cuEventRecord(k->tp_ready, k->s), d) ||
        !DRV(kc_nc.cuStreamWaitEvent(k->comm, k->tp_ready, 0), d) ||
        (h->last_stream && h->last_stream != k->comm &&
         !DRV(kc_nc.cuStreamWaitEvent(k->comm, h->last, 0), d)) ||
        !DRV(kc_nc.cuEventRecord(t->t0, k->comm), d))
        return false;
    if (staged && t->coll == CG_COLL_REDUCE_SCATTER && !tp_relayout(k, t, src, false, d))
        return false;
    const void *x = (const void *)(staged && t->coll == CG_COLL_REDUCE_SCATTER ? k->stage : src);
    void *y = (void *)(staged && t->coll == CG_COLL_ALL_GATHER ? k->stage : t->y);
    cudaStream_t cs = (cudaStream_t)k->comm;
    ncclResult_t r = t->coll == CG_COLL_ALLREDUCE
                         ? kc_nc.ncclAllReduce(x, y, t->count, t->type, ncclSum, k->nc, cs)
                     : t->coll == CG_COLL_ALL_GATHER
                         ? kc_nc.allgather(x, y, t->count, t->type, k->nc, cs)
                         : kc_nc.rscatter(x, y, t->count, t->type, ncclSum, k->nc, cs);
    if (r == ncclInProgress && k->nonblocking) {
        char what[96];
        snprintf(what, sizeof what, "issuing the NCCL %s of plan step %d (tensor parallelism)",
                 t->coll == CG_COLL_REDUCE_SCATTER ? "reduce-scatter"
                 : t->coll == CG_COLL_ALL_GATHER   ? "all-gather"
                                                   : "all-reduce",
                 s);
        if (!settle(k, what, d))
            return false;
    } else if (!NC(r, d)) {
        return false;
    }
    if (staged && t->coll == CG_COLL_ALL_GATHER && !tp_relayout(k, t, t->y, true, d))
        return false;
    if (!DRV(kc_nc.cuEventRecord(t->done, k->comm), d) || !DRV(kc_nc.cuEventRecord(h->last, k->comm), d))
        return false;
    h->last_stream = k->comm;
    t->started = true;
    t->waited = t->counted = false;
    k->tp_pending = true;
    return true;
}

bool kc_tp_operand_copy(KcComm *k, int s, int until, Diag *d)
{
    if (!k || !k->tp_of || s < 0 || s >= k->p->steps.n || k->tp_of[s] < 0 || until <= s) {
        kc_dmsg(d, "plan step %d is not a TP step of this process's TP group waited for "
                "later (at step %d)", s, until);
        return false;
    }
    TpOp *t = &k->tp[k->tp_of[s]];
    /* a slot whose last user's wait comes at or before step s: the compute
     * stream has waited for that collective before this copy */
    int j = -1;
    for (int i = 0; i < k->nslot; i++)
        if (k->slot[i].until <= s && (j < 0 || k->slot[i].bytes > k->slot[j].bytes))
            j = i;
    if (j < 0) {
        void *v = realloc(k->slot, sizeof *k->slot * (size_t)(k->nslot + 1));
        if (!v) {
            kc_dmsg(d, "out of memory");
            return false;
        }
        k->slot = v;
        j = k->nslot++;
        k->slot[j].p = 0;
        k->slot[j].bytes = 0;
    }
    if (k->slot[j].bytes < t->xbytes) { /* set up before any run: nothing reads it */
        if (k->slot[j].p)
            kc_nc.cuMemFree(k->slot[j].p);
        k->slot[j].p = 0;
        k->slot[j].bytes = 0;
        if (!DRV(kc_nc.cuMemAlloc(&k->slot[j].p, (size_t)t->xbytes), d))
            return false;
        k->slot[j].bytes = t->xbytes;
    }
    k->slot[j].until = until;
    t->slot = j;
    return true;
}

bool kc_tp_wait(KcComm *k, int s, Diag *d)
{
    if (!k || !k->tp_of || s < 0 || s >= k->p->steps.n || k->tp_of[s] < 0) {
        kc_dmsg(d, "plan step %d is not a TP step of this process's TP group", s);
        return false;
    }
    TpOp *t = &k->tp[k->tp_of[s]];
    if (!t->started) {
        kc_dmsg(d, "a wait for TP step %d, which this run has not started", s);
        return false;
    }
    if (t->waited)
        return true;
    if (!DRV(kc_nc.cuEventRecord(t->w, k->s), d) || !DRV(kc_nc.cuStreamWaitEvent(k->s, t->done, 0), d))
        return false;
    t->waited = true;
    return true;
}

bool kc_tp_join(KcComm *k, Diag *d)
{
    for (int i = 0; k && i < k->ntp; i++)
        if (k->tp[i].started && !kc_tp_wait(k, k->tp[i].step, d))
            return false;
    return true;
}

/* Milliseconds from a to b, both recorded and finished; 0 when unknown. */
static double elapsed_ms(CUevent a, CUevent b)
{
    float ms = 0;
    if (kc_nc.cuEventElapsedTime(&ms, a, b) != CUDA_SUCCESS)
        return 0;
    return (double)ms;
}

int kc_comm_events(KcComm *k, CUevent begin, double host_begin, RtCommEvent *ev, int max,
                   double *exposed_s)
{
    *exposed_s = 0;
    if (!k || !k->pending)
        return 0;
    kc_nc.cuCtxSetCurrent(k->ctx);
    int n = 0;
    for (int i = 0; i < k->nb; i++) {
        Bucket *b = &k->b[i];
        for (int prev = 1; prev >= 0; prev--) {
            CUevent t0 = prev ? b->pt0 : b->t0, done = prev ? b->pdone : b->done;
            CUevent w = prev ? b->pw : b->w;
            if (prev ? !b->prev : !b->started || !b->waited || b->counted)
                continue;
            if (kc_wait_event(k, done) != CUDA_SUCCESS)
                continue;
            if (prev)
                b->prev = false;
            else
                b->counted = true;
            double x = elapsed_ms(w, done);
            x = x > 0 ? 1e-3 * x : 0;
            if (n < max) /* a carried gather began before `begin`: a negative offset */
                ev[n++] = (RtCommEvent){i, b->bytes, host_begin + 1e-3 * elapsed_ms(begin, t0),
                                        host_begin + 1e-3 * elapsed_ms(begin, done),
                                        (int)b->coll, x};
            *exposed_s += x;
        }
    }
    k->pending = false;
    return n;
}

int kc_tp_events(KcComm *k, CUevent begin, double host_begin, RtCommEvent *ev, int max)
{
    if (!k || !k->tp_pending)
        return 0;
    kc_nc.cuCtxSetCurrent(k->ctx);
    int n = 0;
    for (int i = 0; i < k->ntp; i++) {
        TpOp *t = &k->tp[i];
        if (!t->started || t->counted || kc_wait_event(k, t->done) != CUDA_SUCCESS)
            continue;
        t->counted = true;
        double x = t->waited ? elapsed_ms(t->w, t->done) : 0; /* compute stood at the wait */
        x = x > 0 ? 1e-3 * x : 0;
        if (n < max)
            ev[n++] = (RtCommEvent){-1, t->bytes, host_begin + 1e-3 * elapsed_ms(begin, t->t0),
                                    host_begin + 1e-3 * elapsed_ms(begin, t->done),
                                    (int)t->coll, x};
    }
    k->tp_pending = false;
    return n;
}

/* Counts the finished start and done events of this run's buckets and TP
 * steps on k and on k->also; *stuck, *who: the first collective that has
 * begun on the communication stream (start event finished) and not
 * finished (a bucket, or a TP step as -2 - its plan step), and its
 * communicator; -1 and NULL when none. */
static int progress(KcComm *k, int *stuck, KcComm **who)
{
    int n = 0;
    *stuck = -1;
    *who = NULL;
    for (KcComm *q = k; q; q = q == k ? k->also : NULL) {
        if (!q->nc)
            continue;
        for (int i = 0; i < q->nb + q->ntp; i++) {
            bool tp = i >= q->nb;
            if (tp ? !q->tp[i - q->nb].started : !q->b[i].started)
                continue;
            CUevent t0 = tp ? q->tp[i - q->nb].t0 : q->b[i].t0;
            CUevent done = tp ? q->tp[i - q->nb].done : q->b[i].done;
            bool began = kc_nc.cuEventQuery(t0) == CUDA_SUCCESS;
            bool fin = began && kc_nc.cuEventQuery(done) == CUDA_SUCCESS;
            n += began + fin;
            if (began && !fin && !*who) {
                *stuck = tp ? -2 - q->tp[i - q->nb].step : i;
                *who = q;
            }
        }
    }
    return n;
}

/* kc_nccl.h */
CUresult kc_poll_until(KcComm *k, KcPp *pp, CUstream s, CUevent e)
{
    double t0 = kc_now(), last = t0;
    int stuck = -1;
    KcComm *who = NULL;
    int seen = progress(k, &stuck, &who);
    bool ppend = false;
    int64_t pseen = kc_pp_progress(pp, &ppend);
    long ns = 50000;
    for (;;) {
        CUresult r = s ? kc_nc.cuStreamQuery(s) : kc_nc.cuEventQuery(e);
        if (r != CUDA_ERROR_NOT_READY)
            return r;
        double t = kc_now();
        int now_seen = progress(k, &stuck, &who);
        int64_t pnow = kc_pp_progress(pp, &ppend);
        bool wk = who && who->lost, wp = ppend && kc_pp_timeout(pp) > 0;
        if (now_seen != seen || pnow != pseen || (!wk && !wp)) {
            seen = now_seen;
            pseen = pnow;
            last = t;
        } else if (!wk && t - last > kc_pp_timeout(pp)) {
            kc_pp_lost(pp);
            return CUDA_ERROR_LAUNCH_TIMEOUT;
        } else if (wk && t - last > who->timeout) {
            char what[128];
            if (stuck >= 0)
                snprintf(what, sizeof what, "the NCCL all-reduce of bucket %d on the GPU",
                         stuck);
            else
                snprintf(what, sizeof what,
                         "the NCCL collective of plan step %d on the GPU (tensor parallelism)",
                         -2 - stuck);
            kc_nc.ncclCommAbort(who->nc);
            forget_nc(who);
            who->lost(who->lost_arg, what);
            return CUDA_ERROR_LAUNCH_TIMEOUT;
        }
        struct timespec ts = {0, t - t0 > 1 ? 10000000 : ns};
        nanosleep(&ts, NULL);
        if (ns < 1000000)
            ns *= 2;
    }
}

CUresult kc_wait_stream(KcComm *k, CUstream s)
{
    kc_nc.cuCtxSetCurrent(k->ctx);
    return kc_poll_until(k, NULL, s, NULL);
}

CUresult kc_wait_event(KcComm *k, CUevent e)
{
    kc_nc.cuCtxSetCurrent(k->ctx);
    return kc_poll_until(k, NULL, NULL, e);
}
