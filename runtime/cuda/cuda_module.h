/* cuda_module.h - the contract of runtime/cuda/, the CUDA module
 * (libkiln_cuda.so): what its files share, sectioned by the file that
 * defines each. Inside the module only, never part of kilncore: kiln loads
 * the module with dlopen (runtime/device.c) and reaches it through the
 * KC_EXPORT symbols alone (kiln_cuda_backend, kiln_cuda_device_count,
 * kiln_cuda_compile, kiln_cuda_binary_free).
 *
 * The module links nothing of kilncore (-Wl,--no-undefined against NVRTC
 * and cuBLASLt only): what it needs from kiln comes through RtCudaHost, and
 * codegen's and the runtime's headers are read for types and inline
 * helpers only. Its rooms:
 *   cuda_module.c  small helpers (errors, allocation, the clock)
 *   driver.c       the driver API: libcuda.so.1 by dlopen, one table
 *   gemm_plan.c    GEMM and epilogue decisions, host offsets (gemm_plan.h;
 *                  no CUDA header: the emulated device links it too)
 *   cublaslt.c     GEMMs through cuBLASLt: descriptors, heuristic, calls
 *   cuda_nvrtc.c   NVRTC and the cubin cache
 *   cuda_nccl.c    all-reduces and TP collectives through NCCL, bounded
 *                  host waits
 *   cuda_pp.c      pipeline stages' transfers through NCCL (send/recv)
 *   nccl_open.c    NCCL by dlopen, one table shared by the two above
 *                  (kc_nccl.h)
 *   backend_cuda.c the step: the Backend table (create, write, read, run
 *                  a plan step, sync, destroy) and its BackendExt
 */
#ifndef KILN_CUDA_MODULE_H
#define KILN_CUDA_MODULE_H

#include "cg_cuda.h"
#include "gemm_plan.h"
#include "runtime.h"

#include <cuda.h>
#include <stddef.h>

/* Symbols device.c looks up with dlsym; everything else is hidden. */
#define KC_EXPORT __attribute__((visibility("default")))

/* ---- cuda_module.c: helpers ---------------------------------------------- */

/* An internal error: "kiln: cuda: ..." on stderr, then abort. */
_Noreturn void kc_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *kc_zalloc(size_t n); /* zeroed; kc_fatal when out of memory */
char *kc_dupstr(const char *s);
/* Formats the message of d (the module's errors). */
void kc_dmsg(Diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double kc_now(void); /* CLOCK_MONOTONIC seconds */

/* ---- driver.c: the driver API -------------------------------------------- */

/* The driver entry points the module calls, by the names cuda.h maps them
 * to (cuMemAlloc -> cuMemAlloc_v2). */
/* clang-format off */
#define KC_CU_FUNCS(X)                                                         \
    X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDriverGetVersion)      \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute)                 \
    X(cuDeviceGetName) X(cuDeviceTotalMem)                                     \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent)\
    X(cuMemAlloc) X(cuMemFree) X(cuMemAllocHost) X(cuMemFreeHost)              \
    X(cuMemsetD8Async) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)               \
    X(cuMemcpyDtoDAsync)                                                       \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                \
    X(cuStreamWaitEvent) X(cuStreamBeginCapture) X(cuStreamEndCapture)         \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)  \
    X(cuEventElapsedTime)                                                      \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)               \
    X(cuLaunchKernel)                                                          \
    X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)               \
    X(cuGraphDestroy)
/* clang-format on */
typedef struct {
#define X(f) __typeof__(&f) f;
    KC_CU_FUNCS(X)
#undef X
} KcDriver;
/* The table; valid once kc_cu_open has returned true. */
extern KcDriver kc_cu;
/* Opens libcuda.so.1 and initialises it, once; false with why set (the same
 * reason on every later call) when there is no usable driver. */
bool kc_cu_open(char *why, size_t n);
/* r == CUDA_SUCCESS; otherwise sets d (when not NULL) or stops the process
 * (kc_fatal), naming the call, file and line and the driver's error. */
bool kc_cu_check(CUresult r, const char *call, const char *file, int line, Diag *d);
/* A checked driver call: true on success (kc_cu_check). */
#define CU(call, d) kc_cu_check((call), #call, __FILE__, __LINE__, (d))

/* ---- cublaslt.c: GEMMs through cuBLASLt ----------------------------------- */

typedef struct KcLt KcLt;
/* A cuBLASLt handle and its workspace in the current context. tf32: f32
 * products in TF32 (bf16 products always accumulate in f32); verbose: says
 * on stderr when an epilogue has no algorithm. NULL with d set. */
KcLt *kc_lt_create(bool tf32, bool verbose, Diag *d);
/* Frees the handle, the workspace and every plan (the context is current;
 * NULL: nothing). */
void kc_lt_destroy(KcLt *lt);
/* Plans GEMM m (kiln's row-major terms, CgGemm) in form f with epilogue e
 * (CG_EPI_NONE: plain) on operands at a, b and D at out; bias: the vector
 * the epilogue reads (f->bias) or the bias gradient it writes (f->bgrad);
 * aux: f->aux's buffer. The algorithm is the library's heuristic for the
 * operands' alignment; an identical GEMM reuses its plan. Returns the plan;
 * -2 (d untouched) when the heuristic has no algorithm for the epilogue
 * (the caller runs the GEMM without it); -1 with d set on an error. */
int kc_lt_plan(KcLt *lt, const CgGemm *m, const KcGemmForm *f, CgEpilogue e, CUdeviceptr a,
               CUdeviceptr b, CUdeviceptr out, CUdeviceptr bias, CUdeviceptr aux, Diag *d);
/* Enqueues plan `plan` on stream s with the pointers it was planned with
 * (a batch sharing B runs as one product per batch). */
bool kc_lt_run(KcLt *lt, int plan, const CgGemm *m, CUdeviceptr a, CUdeviceptr b,
               CUdeviceptr out, CUstream s, Diag *d);

/* ---- cuda_nvrtc.c: NVRTC (rt_cuda_compile in device.c) -------------------- */

KC_EXPORT bool kiln_cuda_compile(const char *src, const char *arch, const char *cache_dir,
                                 bool verbose, RtCudaBinary *b, Diag *d);
KC_EXPORT void kiln_cuda_binary_free(RtCudaBinary *b);

/* ---- cuda_nccl.c: gradient all-reduces and TP collectives through NCCL ----
 * The all-reduces of a plan (and its tensor-parallel collectives) through
 * NCCL on a communication stream gated by events, and the device this
 * process uses. */

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
/* The same over the TP group g (RtCommGroup: rank and size in the group,
 * the id broadcast over it) for p's CG_STEP_TP steps (tensor parallelism)
 * instead of its buckets: each step's operand and result f32 at arena +
 * offset[t]. A second communicator beside the data-parallel one, on the
 * same communication stream; the process's one over g (its first
 * kc_tp_open over g opens it, later ones share it until the last is
 * closed). NULL with d set (NCCL missing, a TP tensor not stored as f32:
 * precision=bf16). */
KcComm *kc_tp_open(const RtCommGroup *g, const CgPlan *p, const DType *storage,
                   const int64_t *offset, CUdeviceptr arena, CUcontext ctx, CUstream compute,
                   CUstream comm, Diag *d);
/* Whether k's TP communicator was opened by an earlier kc_tp_open over the
 * same group in this process (one NCCL communicator per process and TP
 * group, shared by every executor; cuda_nccl.c, SharedTp). */
bool kc_tp_shared(const KcComm *k);
/* Host waits through k (kc_wait_stream, kc_wait_event) also watch other's
 * collectives for a hang (the data-parallel and the TP communicator of one
 * context watch each other). */
void kc_comm_also(KcComm *k, KcComm *other);
/* Plan step s (CG_STEP_TP) of a kc_tp_open communicator: event on the
 * compute stream, the communication stream waits on it, the step's NCCL
 * call (ncclAllReduce(ncclSum), ncclAllGather or ncclReduceScatter; a
 * gather or reduce-scatter whose split axis is not the first goes through
 * a staging buffer and one 2D copy per rank: cuda_nccl.c, TpOp), a done
 * event. The compute stream does not wait for it (kc_tp_wait), and the
 * host does not wait. The collective reads the operand and writes the
 * result in place on the communication stream until then: the compute
 * work before the wait must neither read the result's bytes nor write
 * either buffer's. */
bool kc_tp_run(KcComm *k, int s, Diag *d);
/* From now on TP step s's collective reads a copy of its operand, made on
 * the compute stream at the step into a buffer (outside the arena) that
 * no other such step uses before the compute stream's wait for s, which
 * comes before plan step `until` (> s; the step count: the run's end). A
 * buffer serves steps whose spans [s, until) do not meet. Call it
 * before the first run, in plan order. */
bool kc_tp_operand_copy(KcComm *k, int s, int until, Diag *d);
/* The compute stream waits for TP step s's collective (this run's; done
 * event), after recording its `w` event (the exposed time is w..done);
 * nothing when it already waited for it in this run. */
bool kc_tp_wait(KcComm *k, int s, Diag *d);
/* The compute stream waits for every TP collective of this run it has not
 * waited for (the end of a run). */
bool kc_tp_join(KcComm *k, Diag *d);
/* The last run's TP steps not collected yet (at most max): RtCommEvent
 * with bucket -1, placed as kc_comm_events places buckets; exposed: the
 * time the compute stream stood at its wait before the collective was
 * done (w..done when positive). Waits for their done events. */
int kc_tp_events(KcComm *k, CUevent begin, double host_begin, RtCommEvent *ev, int max);
/* Waits for the communication stream and frees everything (NULL: nothing). */
void kc_comm_close(KcComm *k);
/* A run begins (before its first plan step): forgets the last run's
 * buckets, except all-gathers (one started in the last run may be waited
 * for in this one, even before this call: the executor's setup_defer). */
void kc_comm_run_begins(KcComm *k);
/* Plan step s (CG_STEP_ALLREDUCE_START): event on the compute stream, the
 * communication stream waits on it, ncclAllReduce(ncclAvg) of every tensor
 * of the bucket in place (one NCCL group), a done event. A reduce-scatter
 * or all-gather bucket (zero=1): the grouped ncclReduce / ncclBroadcast of
 * its pieces instead (cuda_nccl.c). */
bool kc_allreduce_start(KcComm *k, int s, Diag *d);
/* Plan step s (CG_STEP_SHARD_PACK) on the compute stream: the result (f32[S])
 * zeroed, then this rank's part of the args' flat range copied in. */
bool kc_shard_pack(KcComm *k, int s, Diag *d);
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

/* ---- cuda_pp.c: pipeline stages' transfers through NCCL -------------------
 * Pipeline stages (runtime/dist/pp.c): the process's two NCCL
 * communicators over the pipeline group g (rank: the stage), each with a
 * stream of its own: one for transfers to a later stage, one to an
 * earlier one. The first call over g opens them (every stage calls it, in
 * the same order), later ones share them; kc_pp_close drops one user.
 * NULL with d set (NCCL missing or without ncclSend). */
typedef struct KcPp KcPp;
KcPp *kc_pp_open(const RtCommGroup *g, CUcontext ctx, Diag *d);
void kc_pp_close(KcPp *p);
/* Queues, after the work queued on `compute` so far, an ncclSend of bytes
 * at ptr to stage peer (send) or an ncclRecv of them into ptr from peer
 * (ptr 0: into a scratch buffer), on the stream of its direction; the work
 * queued on `compute` afterwards waits for it. Transfers between two
 * stages in one direction meet in the order they are queued. */
bool kc_pp_xfer(KcPp *p, CUstream compute, bool send, int peer, CUdeviceptr ptr, size_t bytes,
                Diag *d);
/* A host wait on stream s (or, s NULL, event e) of an executor with
 * pipeline transfers (and k's collectives, k may be NULL): polls as
 * kc_wait_stream does; past the group's comm_timeout with a transfer
 * queued, unfinished and none finishing (a peer that never sends or never
 * receives), aborts the pipeline's communicators and calls the group's
 * lost callback naming the transfer (it stops every rank); if it returns
 * (tests), CUDA_ERROR_LAUNCH_TIMEOUT. */
CUresult kc_pp_wait(KcPp *p, KcComm *k, CUstream s, CUevent e);

/* ---- backend_cuda.c: the step --------------------------------------------- */

/* The backend table, or NULL when kiln and the module disagree on the ABI
 * (RtCudaHost.abi). */
KC_EXPORT const Backend *kiln_cuda_backend(const RtCudaHost *h);

#endif
