/* kc_nccl.h - what the CUDA module's NCCL files share (cuda_nccl.c: the
 * all-reduces, ZeRO buckets and TP collectives; cuda_pp.c: the pipeline
 * transfers): NCCL's functions and the driver's they use, looked up once
 * by dlopen into one table (kc_nc, nccl_open.c), and the checked-call
 * macros DRV and NC. Inside the module only (cuda_module.h's rooms). */
#ifndef KILN_KC_NCCL_H
#define KILN_KC_NCCL_H

#include "cuda_module.h"

#ifndef KILN_NO_NCCL
#include <nccl.h>
#else
/* Built without nccl.h (CMake found none; see docs/cuda.md): kc_nccl_open
 * always fails with that reason, so nothing below calls NCCL; these
 * stand-ins only let the code compile. */
typedef struct ncclComm *ncclComm_t;
typedef enum { ncclSuccess = 0, ncclInProgress = 7 } ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef enum { ncclUint8 = 1, ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclAvg = 4 } ncclRedOp_t;
typedef struct { int blocking; } ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {0}
typedef struct CUstream_st *cudaStream_t;
ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int n, ncclUniqueId id, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
const char *ncclGetErrorString(ncclResult_t r);
#endif

/* clang-format off */
#define KC_DRV_FUNCS(X)                                                        \
    X(cuGetErrorString) X(cuCtxSetCurrent) X(cuEventCreate) X(cuEventDestroy)  \
    X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime)               \
    X(cuStreamWaitEvent) X(cuStreamSynchronize) X(cuStreamQuery) X(cuEventQuery)\
    X(cuMemAlloc) X(cuMemFree) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async)        \
    X(cuStreamCreate) X(cuStreamDestroy)
#define KC_NCCL_FUNCS(X)                                                       \
    X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank)                   \
    X(ncclCommDestroy) X(ncclCommAbort) X(ncclAllReduce) X(ncclGroupStart)     \
    X(ncclGroupEnd) X(ncclGetErrorString)
/* clang-format on */

/* The functions, filled by kc_nccl_open: the KC_*_FUNCS ones always (it
 * fails without them), the others looked up apart, NULL where the library
 * lacks them (each user says what it needs). */
typedef struct {
#define X(f) __typeof__(&f) f;
    KC_DRV_FUNCS(X)
    KC_NCCL_FUNCS(X)
#undef X
    /* NCCL 2.14 and newer: a non-blocking communicator, so that its setup
     * (which waits for every peer) is bounded like the all-reduces */
    __typeof__(&ncclCommInitRankConfig) init_config;
    __typeof__(&ncclCommGetAsyncError) async_error;
    /* zero=1's collectives (every NCCL 2.10.3 has them; looked up apart so
     * that a library without them still all-reduces) */
    __typeof__(&ncclReduce) reduce;
    __typeof__(&ncclBroadcast) bcast;
    /* tensor parallelism's gathers and reduce-scatters, and their layout
     * copies (the driver's) */
    __typeof__(&ncclAllGather) allgather;
    __typeof__(&ncclReduceScatter) rscatter;
    __typeof__(&cuMemcpy2DAsync) copy2d;
    /* pipeline stages' transfers (NCCL 2.7 and newer) */
    __typeof__(&ncclSend) send;
    __typeof__(&ncclRecv) recv;
} KcNccl;
extern KcNccl kc_nc;

/* Opens libcuda.so.1's and libnccl.so.2's functions into kc_nc the first
 * time (later calls give the first answer): false, with *why the reason
 * (to follow "..., but "), when NCCL is missing, lacks a KC_NCCL_FUNCS
 * function or is older than 2.10.3 (ncclAvg), or the module was built
 * without nccl.h. */
bool kc_nccl_open(const char **why);

/* The host waits' poll (cuda_nccl.c; kc_wait_stream, kc_wait_event and
 * kc_pp_wait call it): polls stream s (or, s NULL, event e) until it has
 * finished: sleeps of 50 us doubling to 1 ms, 10 ms after the first second.
 * Past k's timeout with an all-reduce begun and unfinished and no bucket
 * event finishing: aborts the communicator and calls k->lost, which stops
 * the process; if it returns (tests), CUDA_ERROR_LAUNCH_TIMEOUT. With pp
 * (pipeline stages), the same for its transfers: past pp's timeout with a
 * send or receive queued and unfinished and none finishing (a peer that
 * never sends or never receives). k and pp may be NULL. */
CUresult kc_poll_until(KcComm *k, KcPp *pp, CUstream s, CUevent e);
/* What kc_poll_until reads of the pipeline's transfers (cuda_pp.c): a
 * signature of their progress (changes when one finishes; *pending: a
 * queued transfer has not finished; pp NULL: 0, none), the seconds a
 * transfer may wait with none finishing (0: unbounded), and the lost
 * transfer's end: its communicators aborted, the lost callback told which
 * (it stops the process; it returns in tests). */
int64_t kc_pp_progress(KcPp *p, bool *pending);
double kc_pp_timeout(const KcPp *p);
void kc_pp_lost(KcPp *p);

/* d = "FILE:LINE: call failed: the error's text"; false. */
bool kc_drv_fail(CUresult r, const char *call, const char *file, int line, Diag *d);
bool kc_nccl_fail(ncclResult_t r, const char *call, const char *file, int line, Diag *d);

/* Checked calls: true on success, else d set naming the call and line. */
extern _Thread_local CUresult kc_r_drv;
extern _Thread_local ncclResult_t kc_r_nc;
#define DRV(call, d)                                                                             \
    ((kc_r_drv = (call)) == CUDA_SUCCESS || kc_drv_fail(kc_r_drv, #call, __FILE__, __LINE__, (d)))
#define NC(call, d)                                                                              \
    ((kc_r_nc = (call)) == ncclSuccess || kc_nccl_fail(kc_r_nc, #call, __FILE__, __LINE__, (d)))

#endif
