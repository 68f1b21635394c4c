/* cuda_pp.c - pipeline stages' transfers through NCCL, part of the CUDA
 * module (libkiln_cuda.so; contract in cuda_module.h, kc_pp_*).
 *
 * The activations and gradients crossing a stage boundary go by
 * ncclSend/ncclRecv, one NCCL group per tensor, over two communicators per
 * process and pipeline group (KcPp), each on a stream of its own: one
 * carries what goes to a later stage (activations), the other what goes
 * to an earlier one (gradients), so a send blocked until its peer
 * receives never holds up a transfer the other way. A transfer waits for
 * a `ready` event of the issuing executor's compute stream; that stream
 * then waits for its `done` event (a received tensor is read, and a sent
 * one overwritten, only after it). Every executor of a stage (F, B, W)
 * shares the process's KcPp of its group. The executors' host waits poll
 * the transfers (kc_pp_wait): one that stays queued, with none finishing,
 * for the group's comm_timeout aborts both communicators and stops every
 * rank naming it. */
#include "kc_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The process's transfers over one pipeline group: dir 0 to a later stage,
 * 1 to an earlier one; shared by every executor of the stage (F, B, W). */
struct KcPp {
    CUcontext ctx;
    const void *group; /* RtCommGroup.arg */
    int rank, size;
    ncclComm_t nc[2];
    CUstream st[2];
    CUevent ready, done[2];
    CUdeviceptr scratch; /* receives no program reads */
    size_t scratch_bytes;
    int refs;
    struct KcPp *next;
    /* the group's comm_timeout (0: waits unbounded) and lost callback;
     * per direction: transfers queued so far, and the last one's kind and
     * peer (for the lost callback's message) */
    double timeout;
    void (*lost)(void *arg, const char *what);
    void *lost_arg;
    int64_t nx[2];
    bool last_send[2];
    int last_peer[2];
};

int64_t kc_pp_progress(KcPp *p, bool *pending)
{
    *pending = false;
    if (!p)
        return 0;
    int64_t sig = 4 * (p->nx[0] + p->nx[1]);
    for (int i = 0; i < 2; i++) {
        bool done = p->nx[i] == 0 || kc_nc.cuEventQuery(p->done[i]) == CUDA_SUCCESS;
        *pending |= !done;
        sig += done << i;
    }
    return sig;
}

double kc_pp_timeout(const KcPp *p) { return p && p->lost ? p->timeout : 0; }

void kc_pp_lost(KcPp *p)
{
    int dir = p->nx[0] > 0 && kc_nc.cuEventQuery(p->done[0]) != CUDA_SUCCESS ? 0 : 1;
    char what[160];
    snprintf(what, sizeof what, "the NCCL %s stage %d (pipeline stages) on the GPU",
             p->last_send[dir] ? "send to" : "receive from", p->last_peer[dir]);
    for (int i = 0; i < 2; i++)
        if (p->nc[i]) {
            kc_nc.ncclCommAbort(p->nc[i]);
            p->nc[i] = NULL;
        }
    p->lost(p->lost_arg, what);
}

CUresult kc_pp_wait(KcPp *p, KcComm *k, CUstream s, CUevent e)
{
    kc_nc.cuCtxSetCurrent(p->ctx);
    return kc_poll_until(k, p, s, e);
}

static KcPp *shared_pp;

void kc_pp_close(KcPp *p)
{
    if (!p || --p->refs > 0)
        return;
    for (KcPp **q = &shared_pp; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            break;
        }
    kc_nc.cuCtxSetCurrent(p->ctx);
    for (int i = 0; i < 2; i++) {
        if (p->st[i])
            kc_nc.cuStreamSynchronize(p->st[i]);
        if (p->nc[i])
            kc_nc.ncclCommDestroy(p->nc[i]);
        if (p->st[i])
            kc_nc.cuStreamDestroy(p->st[i]);
        if (p->done[i])
            kc_nc.cuEventDestroy(p->done[i]);
    }
    if (p->ready)
        kc_nc.cuEventDestroy(p->ready);
    if (p->scratch)
        kc_nc.cuMemFree(p->scratch);
    free(p);
}

KcPp *kc_pp_open(const RtCommGroup *g, CUcontext ctx, Diag *d)
{
    for (KcPp *p = shared_pp; p; p = p->next)
        if (p->ctx == ctx && p->group == g->arg && p->rank == g->rank && p->size == g->size) {
            p->refs++;
            return p;
        }
    const char *why;
    if (!kc_nccl_open(&why)) {
        kc_dmsg(d, "--device cuda: pipeline stages send activations and gradients through "
                "NCCL, but %s", why);
        return NULL;
    }
    if (!kc_nc.send || !kc_nc.recv) {
        kc_dmsg(d, "--device cuda: pipeline stages send activations and gradients with "
                "ncclSend and ncclRecv, but libnccl.so.2 lacks them (expected NCCL 2.7 or "
                "newer)");
        return NULL;
    }
    KcPp *p = kc_zalloc(sizeof *p);
    *p = (KcPp){.ctx = ctx, .group = g->arg, .rank = g->rank, .size = g->size, .refs = 1};
    if (g->lost && g->timeout > 0) {
        p->timeout = g->timeout;
        p->lost = g->lost;
        p->lost_arg = g->arg;
    }
    if (!DRV(kc_nc.cuCtxSetCurrent(ctx), d) ||
        !DRV(kc_nc.cuEventCreate(&p->ready, CU_EVENT_DISABLE_TIMING), d))
        goto fail;
    for (int i = 0; i < 2; i++) {
        if (!DRV(kc_nc.cuStreamCreate(&p->st[i], CU_STREAM_NON_BLOCKING), d) ||
            !DRV(kc_nc.cuEventCreate(&p->done[i], CU_EVENT_DISABLE_TIMING), d))
            goto fail;
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        if (g->rank == 0 && !NC(kc_nc.ncclGetUniqueId(&id), d))
            goto fail;
        if (g->size > 1 && !(g->bcast && g->bcast(g->arg, &id, sizeof id))) {
            kc_dmsg(d, "NCCL: cannot broadcast the unique id from stage 0 of the pipeline");
            goto fail;
        }
        if (!NC(kc_nc.ncclCommInitRank(&p->nc[i], g->size, id, g->rank), d)) {
            p->nc[i] = NULL;
            goto fail;
        }
    }
    p->next = shared_pp;
    shared_pp = p;
    return p;
fail:
    kc_pp_close(p); /* not linked yet */
    return NULL;
}

bool kc_pp_xfer(KcPp *p, CUstream compute, bool send, int peer, CUdeviceptr ptr, size_t bytes,
                Diag *d)
{
    if (peer < 0 || peer >= p->size || peer == p->rank) {
        kc_dmsg(d, "pipeline transfer to stage %d from stage %d of %d", peer, p->rank, p->size);
        return false;
    }
    int dir = (send ? peer > p->rank : peer < p->rank) ? 0 : 1;
    if (!DRV(kc_nc.cuCtxSetCurrent(p->ctx), d))
        return false;
    if (!ptr) { /* a receive that no program reads */
        if (bytes > p->scratch_bytes) {
            if (p->scratch && !DRV(kc_nc.cuStreamSynchronize(p->st[1 - dir]), d))
                return false;
            if (p->scratch && !DRV(kc_nc.cuStreamSynchronize(p->st[dir]), d))
                return false;
            if (p->scratch)
                kc_nc.cuMemFree(p->scratch);
            p->scratch = 0;
            p->scratch_bytes = 0;
            if (!DRV(kc_nc.cuMemAlloc(&p->scratch, bytes), d))
                return false;
            p->scratch_bytes = bytes;
        }
        ptr = p->scratch;
    }
    bool f32 = bytes % 4 == 0;
    size_t count = f32 ? bytes / 4 : bytes;
    ncclDataType_t type = f32 ? ncclFloat32 : ncclUint8;
    cudaStream_t st = (cudaStream_t)p->st[dir];
    if (!p->nc[dir]) {
        kc_dmsg(d, "pipeline transfer after its communicator was aborted (comm_timeout)");
        return false;
    }
    p->nx[dir]++;
    p->last_send[dir] = send;
    p->last_peer[dir] = peer;
    return DRV(kc_nc.cuEventRecord(p->ready, compute), d) &&
           DRV(kc_nc.cuStreamWaitEvent(p->st[dir], p->ready, 0), d) &&
           NC(kc_nc.ncclGroupStart(), d) &&
           (send ? NC(kc_nc.send((const void *)(uintptr_t)ptr, count, type, peer, p->nc[dir], st), d)
                 : NC(kc_nc.recv((void *)(uintptr_t)ptr, count, type, peer, p->nc[dir], st), d)) &&
           NC(kc_nc.ncclGroupEnd(), d) &&
           DRV(kc_nc.cuEventRecord(p->done[dir], p->st[dir]), d) &&
           DRV(kc_nc.cuStreamWaitEvent(compute, p->done[dir], 0), d);
}
