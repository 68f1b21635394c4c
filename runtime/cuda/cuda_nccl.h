/* cuda_nccl.h - inside libkiln_cuda.so only (never part of kilncore): the
 * gradient all-reduces of a plan through NCCL on a communication stream
 * gated by events, and the device this process uses (cuda_nccl.c). */
#ifndef KILN_CUDA_NCCL_H
#define KILN_CUDA_NCCL_H

#include "cuda_module.h"

#include <cuda.h>

typedef struct KcComm KcComm;

/* The device ordinal this process uses: $KILN_CUDA_DEVICE, else the rank's
 * local rank on its machine ($OMPI_COMM_WORLD_LOCAL_RANK), else 0. */
int kc_device_ordinal(void);


/* One NCCL communicator over g's ranks on the device of ctx (every rank
 * calls it, in the same order). libnccl.so.2 is opened with dlopen here, on
 * first use. p's allreduce steps reduce f32 tensors (storage[t], the
 * device's storage type of tensor t, must be f32) at arena + offset[t] (the
 * device arena's offsets, CgCudaProgram.mem); a start waits on `compute`
 * for the work before it and runs on `comm`. NULL with d set when NCCL is
 * missing, too old, or fails. */
KcComm *kc_comm_open(const RtCommGroup *g, const CgPlan *p, const DType *storage,
                     const int64_t *offset, CUdeviceptr arena, CUcontext ctx, CUstream compute,
                     CUstream comm, Diag *d);
/* Waits for the communication stream and frees everything (NULL: nothing). */
void kc_comm_close(KcComm *k);
/* A run begins (before its first plan step): forgets the last run's
 * buckets. */
void kc_comm_run_begins(KcComm *k);
/* Plan step s (CG_STEP_ALLREDUCE_START): event on the compute stream, the
 * communication stream waits on it, ncclAllReduce(ncclAvg) of every tensor
 * of the bucket in place (one NCCL group), a done event. */
bool kc_allreduce_start(KcComm *k, int s, Diag *d);
/* Plan step s (CG_STEP_ALLREDUCE_WAIT): the compute stream waits on its
 * bucket's done event (the host does not). */
bool kc_allreduce_wait(KcComm *k, int s, Diag *d);
/* The last run's buckets not collected yet (at most max): busy interval on
 * the communication stream (from its start event to its done event), placed
 * at host_begin + the time since `begin` (the run's first event on the
 * compute stream); *exposed_s: time the compute stream stood at a wait
 * before its bucket was done. Waits for those events. */
int kc_comm_events(KcComm *k, CUevent begin, double host_begin, RtCommEvent *ev, int max,
                   double *exposed_s);
/* The host waits until stream s (or event e) of k's context has finished,
 * polling (sleeps from 50 us to 10 ms) instead of blocking. With a lost
 * callback and timeout in the group (RtCommGroup): when an all-reduce of
 * this run has begun on the communication stream and, with no bucket
 * finishing, has not finished for timeout seconds (a peer hangs or died),
 * aborts the communicator (ncclCommAbort) and calls lost(arg, what), which
 * names the lost rank and stops every rank; should it return,
 * CUDA_ERROR_LAUNCH_TIMEOUT. Long compute with no all-reduce in flight
 * never times out. */
CUresult kc_wait_stream(KcComm *k, CUstream s);
CUresult kc_wait_event(KcComm *k, CUevent e);

#endif
