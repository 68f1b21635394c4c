/* fake_cuda.c - a fake CUDA driver (libcuda.so.1) for tests: the subset of
 * the driver API that kiln's CUDA module (runtime/cuda) resolves with
 * dlsym, over host memory and the emulated device of tests/emu, so that the
 * real module runs without a GPU. Built only where the CUDA toolkit is
 * (tests/cudafake/CMakeLists.txt); found through LD_LIBRARY_PATH.
 *
 * Contracts (each violation stops the process loudly: "fake CUDA: ..." on
 * stderr naming the call, exit status 86; see fakecu_die):
 *
 * - Modules (fake_module.c): a cubin of the fake NVRTC is compiled on the
 *   emulator of tests/emu. cuLaunchKernel copies the arguments (as the
 *   driver does) and runs that kernel on the emulator with the same grid,
 *   block, dynamic shared memory and arguments when the stream gets to it.
 * - Memory. Device memory is host memory inside one reserved range of the
 *   address space (FAKE_DEV_BASE, 64 GiB): each allocation ends at a page
 *   boundary (its start 256-aligned) and is followed by an inaccessible
 *   guard page; freed memory becomes inaccessible and is never reused. Every
 *   device pointer the API is given (copies, memsets, kernel pointer
 *   arguments, what cuBLASLt and NCCL touch) must lie in one live
 *   allocation, and a copy's or memset's whole range too; a host pointer
 *   where a device pointer is expected, or the reverse, is an error. Host
 *   memory of an asynchronous copy must come from cuMemAllocHost (pinned).
 * - Streams and events are queues. Nothing runs when it is enqueued: at a
 *   host synchronisation (cuStreamSynchronize, cuEventSynchronize, the
 *   queries, cuStreamDestroy) a worker runs every queued op (a query stops
 *   when only ops waiting on another process are left, and answers
 *   CUDA_ERROR_NOT_READY while its stream or event waits on them), each time
 *   choosing at random (seeded: FAKE_CUDA_SEED) among the streams whose
 *   next op may start (stream order; cuStreamWaitEvent; the legacy stream's
 *   implicit synchronisation with blocking streams, none with streams made
 *   CU_STREAM_NON_BLOCKING).
 * - Races. Every op carries a vector clock (what it is ordered after: its
 *   stream's earlier ops, the ops before the events it waits on, the host's
 *   synchronisations before it was enqueued). When an op runs it is checked
 *   against every op that ran before and is not ordered with it; they race
 *   when one writes bytes the other reads or writes. Known exactly: the
 *   ranges of copies, memsets, cuBLASLt GEMMs and NCCL all-reduces (a 2D
 *   copy, device to device only: the bounding range of its rows). For a
 *   kernel: its writes are the bytes that changed in the allocations its
 *   pointer arguments point into (a write of the value already there is not
 *   seen); its reads reach from each pointer argument to the next buffer
 *   start the fake has been given by any call (a launch, copy, memset, GEMM
 *   or all-reduce), or the allocation's end: a buffer no call names that
 *   sits right after one the kernel reads counts as read too. The report
 *   names both ops. The detector is fake_race.c.
 * - Host races. The source of a cuMemcpyHtoDAsync is snapshotted when it is
 *   enqueued and compared when the copy runs (the host wrote pinned memory
 *   a pending copy reads); the destination of a cuMemcpyDtoHAsync is filled
 *   with 0xff (NaN) when it is enqueued, so a host read before the
 *   synchronisation sees NaN.
 * - FGraph capture. Between cuStreamBeginCapture and cuStreamEndCapture the
 *   stream's work is recorded, not queued. As the driver does, inside a
 *   capture: synchronising or querying the capturing stream returns
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, allocating or freeing memory
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, legacy-stream work (cuMemsetD8,
 *   a copy or launch on the legacy stream) CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
 *   each invalidates the capture, and cuStreamEndCapture then returns
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. cuGraphLaunch enqueues the
 *   recorded work again (kernels with the argument values of the capture,
 *   copies reading the host memory as it is when they run). Events recorded
 *   or waited on inside a capture, cross-stream capture and per-thread
 *   default streams are not modelled: they stop the process.
 * - Negative controls (environment): FAKE_CUDA_DROP_WAIT=N ignores the N-th
 *   cuStreamWaitEvent (1-based); FAKE_CUDA_LATE_WAIT=N applies the N-th
 *   only after the next op (not an event record) that its stream queues,
 *   as if the wait were placed one op later; FAKE_CUDA_HOSTPTR_LAUNCH=N replaces the
 *   first pointer argument of the N-th cuLaunchKernel by a host pointer.
 *
 * Timing: a fake clock advances 1 us per op; events read it when they run.
 * Single-threaded use only (kiln's module calls the driver from one thread
 * at a time). */
#include "fake_cuda.h"
#include "fake_ops.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { PAGE = 4096 };
static const uint64_t DEV_SPAN = 1ull << 36;

/* ---- errors ------------------------------------------------------------- */

void fakecu_die(const char *fmt, ...)
{
    /* one write(2): the two ranks of a run share mpirun's output, and a
     * report written in pieces came out interleaved with the other rank's
     * ("fake CUDA: fake CUDA: race: ..."), which the tests' greps missed */
    char line[2048];
    int n = snprintf(line, sizeof line, "fake CUDA: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    fflush(stderr);
    for (size_t at = 0; at < len;) {
        ssize_t w = write(2, line + at, len - at);
        if (w <= 0)
            break;
        at += (size_t)w;
    }
    _exit(86);
}

static const char *err_name(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    default: return "CUDA_ERROR_UNKNOWN";
    }
}

/* ---- device memory ------------------------------------------------------ */

typedef struct {
    unsigned char *p;
    size_t n;
} Pinned;

static struct {
    bool init;
    uint64_t base, next;
    Alloc *a;
    int na;
    Pinned *pin;
    int npin;
    uint64_t rng;
} M;

uint64_t fakecu_random(void)
{
    M.rng ^= M.rng << 13;
    M.rng ^= M.rng >> 7;
    M.rng ^= M.rng << 17;
    return M.rng;
}

static bool in_dev_range(uint64_t p) { return p >= M.base && p < M.base + DEV_SPAN; }

Alloc *fake_find_alloc(uint64_t p)
{
    for (int i = 0; i < M.na; i++)
        if (p >= M.a[i].lo && p < M.a[i].hi)
            return &M.a[i];
    return NULL;
}

void fakecu_check_dev(uint64_t p, uint64_t bytes, const char *call, const char *what)
{
    if (!in_dev_range(p))
        fakecu_die("%s: %s 0x%llx is not device memory (a host pointer where a device pointer "
                   "is expected)",
                   call, what, (unsigned long long)p);
    Alloc *a = fake_find_alloc(p);
    if (!a)
        fakecu_die("%s: %s 0x%llx is in no device allocation (out of bounds or never "
                   "allocated)",
                   call, what, (unsigned long long)p);
    if (!a->live)
        fakecu_die("%s: %s 0x%llx is in freed device memory", call, what, (unsigned long long)p);
    if (bytes > a->hi - p)
        fakecu_die("%s: %s [0x%llx, +%llu) runs %llu bytes past the end of its allocation "
                   "[0x%llx, +%llu)",
                   call, what, (unsigned long long)p, (unsigned long long)bytes,
                   (unsigned long long)(bytes - (a->hi - p)), (unsigned long long)a->lo,
                   (unsigned long long)(a->hi - a->lo));
}

/* A host range of an asynchronous copy: pinned memory of cuMemAllocHost. */
static void check_host(const void *h, size_t n, const char *call, const char *what)
{
    uint64_t p = (uint64_t)(uintptr_t)h;
    if (in_dev_range(p))
        fakecu_die("%s: %s 0x%llx is device memory (a device pointer where a host pointer is "
                   "expected)",
                   call, what, (unsigned long long)p);
    for (int i = 0; i < M.npin; i++)
        if ((const unsigned char *)h >= M.pin[i].p && (const unsigned char *)h < M.pin[i].p + M.pin[i].n) {
            if (n > (size_t)(M.pin[i].p + M.pin[i].n - (const unsigned char *)h))
                fakecu_die("%s: %s [%p, +%zu) runs past the end of its pinned allocation", call,
                           what, h, n);
            return;
        }
    fakecu_die("%s: %s %p is pageable host memory (an asynchronous copy needs pinned memory "
               "from cuMemAllocHost)",
               call, what, h);
}

/* ---- streams, events, ops ----------------------------------------------- */

typedef struct FGraph FGraph;

typedef struct {
    bool live;
    unsigned flags;
    FOp *head, *tail;
    uint64_t seq, done;
    uint64_t vc[MAXS];
    FGraph *cap;     /* capturing into */
    bool invalid;   /* the capture was invalidated */
} FStream;

struct FEvent {
    unsigned flags;
    bool recorded, done;
    uint64_t gen;
    uint64_t vc[MAXS];
    double t;
};

struct FGraph {
    FOp **op;
    int n;
};

typedef struct {
    FGraph *g;
} GraphExec;

static FStream S[MAXS]; /* S[0]: the legacy stream */
static uint64_t host_vc[MAXS];
static uint64_t next_id;
static double now_ms;
static FOp *hist; /* ops that ran and may still race with later ones */
static int nhist;
static int capturing; /* streams in capture */
static long wait_calls, launch_calls;
static long drop_wait = -1, late_wait = -1, hostptr_launch = -1;
static int late_stream = -1;   /* FAKE_CUDA_LATE_WAIT: the stream of the late wait, -1 */
static uint64_t late_vc[MAXS]; /* ... and what it waits for */

static int sidx(CUstream s, const char *call)
{
    if (s == NULL || s == CU_STREAM_LEGACY)
        return 0;
    if (s == CU_STREAM_PER_THREAD)
        fakecu_die("%s: the per-thread default stream is not modelled", call);
    FStream *x = (FStream *)s;
    if (x < S || x >= S + MAXS || !x->live)
        fakecu_die("%s: %p is not a live stream", call, (void *)s);
    return (int)(x - S);
}

static void vc_join(uint64_t *a, const uint64_t *b)
{
    for (int i = 0; i < MAXS; i++)
        if (b[i] > a[i])
            a[i] = b[i];
}

void fake_add_acc(FOp *o, uint64_t lo, uint64_t hi, bool write)
{
    if (hi <= lo)
        return;
    if (o->nacc == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 8;
        o->acc = realloc(o->acc, sizeof(FakeRange) * (size_t)o->cap);
        if (!o->acc)
            fakecu_die("out of memory");
    }
    o->acc[o->nacc++] = (FakeRange){lo, hi, write};
}

static FOp *new_op(int kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static FOp *new_op(int kind, const char *fmt, ...)
{
    FOp *o = calloc(1, sizeof *o);
    if (!o)
        fakecu_die("out of memory");
    o->kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->desc, sizeof o->desc, fmt, ap);
    va_end(ap);
    return o;
}

static void free_op(FOp *o)
{
    if (!o->shared) {
        free(o->argbuf);
    }
    free(o->snap);
    free(o->acc);
    free(o);
}

/* A copy of a recorded op for the graph (or of a graph's op for a replay):
 * argument buffers shared. */
static FOp *clone_op(const FOp *t)
{
    FOp *o = calloc(1, sizeof *o);
    if (!o)
        fakecu_die("out of memory");
    *o = *t;
    o->next = NULL;
    o->snap = NULL;
    o->shared = true;
    o->acc = NULL;
    o->nacc = o->cap = 0;
    for (int i = 0; i < t->nacc; i++)
        fake_add_acc(o, t->acc[i].lo, t->acc[i].hi, t->acc[i].write);
    return o;
}

static void invalidate_captures(void)
{
    for (int i = 0; i < MAXS; i++)
        if (S[i].live && S[i].cap)
            S[i].invalid = true;
}

/* Queues o on stream i (or records it into i's capture). */
static CUresult enqueue(FOp *o, int i, const char *call)
{
    FStream *x = &S[i];
    if (i == 0 && capturing) {
        fprintf(stderr, "fake CUDA: %s: legacy-stream work while a stream captures: %s\n", call,
                err_name(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT));
        invalidate_captures();
        free_op(o);
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    if (x->cap) {
        if (x->invalid) {
            free_op(o);
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        }
        o->shared = true;
        FGraph *g = x->cap;
        g->op = realloc(g->op, sizeof(FOp *) * (size_t)(g->n + 1));
        if (!g->op)
            fakecu_die("out of memory");
        g->op[g->n++] = o;
        return CUDA_SUCCESS;
    }
    o->id = ++next_id;
    o->stream = i;
    memcpy(o->vc, x->vc, sizeof o->vc);
    vc_join(o->vc, host_vc);
    if (i == 0) { /* the legacy stream waits for every blocking stream */
        for (int k = 1; k < MAXS; k++)
            if (S[k].live && !(S[k].flags & CU_STREAM_NON_BLOCKING))
                vc_join(o->vc, S[k].vc);
    } else if (!(x->flags & CU_STREAM_NON_BLOCKING)) {
        vc_join(o->vc, S[0].vc);
    }
    o->seq = ++x->seq;
    o->vc[i] = o->seq;
    memcpy(x->vc, o->vc, sizeof x->vc);
    if (late_stream == i && o->kind != OP_MARK) { /* the late wait, after this op */
        vc_join(x->vc, late_vc);
        late_stream = -1;
    }
    if (i == 0) /* ... and they wait for it */
        for (int k = 1; k < MAXS; k++)
            if (S[k].live && !(S[k].flags & CU_STREAM_NON_BLOCKING))
                vc_join(S[k].vc, o->vc);
    if (x->tail)
        x->tail->next = o;
    else
        x->head = o;
    x->tail = o;
    return CUDA_SUCCESS;
}

static bool ready(const FOp *o)
{
    for (int t = 0; t < MAXS; t++)
        if (t != o->stream && S[t].done < o->vc[t])
            return false;
    return true;
}

/* ---- the worker ------------------------------------------------------------ */

static void exec_op(FOp *o)
{
    switch (o->kind) {
    case OP_KERNEL:
        fake_run_kernel(o);
        break;
    case OP_HTOD:
        if (o->snap && memcmp(o->snap, (void *)(uintptr_t)o->src, o->bytes) != 0)
            fakecu_die("%s: the host changed the pinned source memory after the asynchronous "
                       "copy was enqueued and before the stream ran it",
                       o->desc);
        memcpy((void *)(uintptr_t)o->dst, (void *)(uintptr_t)o->src, o->bytes);
        break;
    case OP_DTOH:
    case OP_DTOD:
        memmove((void *)(uintptr_t)o->dst, (void *)(uintptr_t)o->src, o->bytes);
        break;
    case OP_MEMSET:
        memset((void *)(uintptr_t)o->dst, o->val, o->bytes);
        break;
    case OP_HOST:
        o->fn(o->arg);
        break;
    case OP_MARK:
        if (o->gen == o->ev->gen) {
            o->ev->done = true;
            o->ev->t = now_ms;
        }
        break;
    }
    now_ms += 0.001;
    fake_race_check(hist, o);
}

/* Runs every queued op, in a random order within what stream order and
 * events allow. query: a query's drain (cuStreamQuery, cuEventQuery),
 * which returns, as a GPU's query does at once, when only ops that wait on
 * another process are left (fakecu_enqueue_when: a receive whose send has
 * not come), where a synchronisation waits for them. */
static void drain_ops(bool query)
{
    for (;;) {
        int cand[MAXS], n = 0, pending = 0, gated = 0;
        for (int i = 0; i < MAXS; i++)
            if (S[i].head) {
                pending++;
                if (ready(S[i].head) && S[i].head->gate && !S[i].head->gate(S[i].head->arg))
                    gated++; /* waits on another process (fakecu_enqueue_when) */
                else if (ready(S[i].head))
                    cand[n++] = i;
            }
        if (!pending)
            break;
        if (!n && gated && query)
            break;
        if (!n && gated) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (!n) {
            char what[512] = "";
            int at = 0;
            for (int i = 0; i < MAXS && at < 400; i++)
                if (S[i].head)
                    at += snprintf(what + at, sizeof what - (size_t)at, " [stream %d: %s]", i,
                                   S[i].head->desc);
            fakecu_die("deadlock: no queued op can start:%s", what);
        }
        int i = cand[fakecu_random() % (uint64_t)n];
        FStream *x = &S[i];
        FOp *o = x->head;
        x->head = o->next;
        if (!x->head)
            x->tail = NULL;
        o->next = NULL;
        exec_op(o);
        x->done = o->seq;
        if (o->nacc) {
            o->next = hist;
            hist = o;
            nhist++;
        } else {
            free_op(o);
        }
    }
    /* ops the host has synchronised with can race no more */
    FOp **pp = &hist;
    while (*pp) {
        FOp *o = *pp;
        if (host_vc[o->stream] >= o->seq) {
            *pp = o->next;
            free_op(o);
            nhist--;
        } else {
            pp = &o->next;
        }
    }
}

void fake_drain(void) { drain_ops(false); }

/* A fault inside the device range (past an allocation's end into its guard
 * page, or in freed memory) is reported; any other fault goes to the
 * handler there was before (a sanitizer's, or the default crash). */
static struct sigaction old_segv, old_bus;

static void on_fault(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uint64_t p = (uint64_t)(uintptr_t)si->si_addr;
    if (M.init && in_dev_range(p)) {
        char msg[200];
        int n = snprintf(msg, sizeof msg,
                         "fake CUDA: access to inaccessible device memory at 0x%llx (past the "
                         "end of an allocation, freed, or never allocated)\n",
                         (unsigned long long)p);
        if (write(2, msg, (size_t)n) < 0)
            _exit(86);
        _exit(86);
    }
    sigaction(sig, sig == SIGSEGV ? &old_segv : &old_bus, NULL); /* the fault repeats there */
}

static void catch_faults(void)
{
    static char alt[1 << 16];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
}

/* ---- the driver API ---------------------------------------------------------- */

static char ctx_dummy;

CUresult cuInit(unsigned int flags)
{
    (void)flags;
    if (M.init)
        return CUDA_SUCCESS;
    void *r = mmap(NULL, DEV_SPAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        fakecu_die("cuInit: cannot reserve the device address range");
    M.base = (uint64_t)(uintptr_t)r;
    M.next = M.base;
    const char *e = getenv("FAKE_CUDA_SEED");
    M.rng = (e && *e ? strtoull(e, NULL, 0) : 0x6b696c6e) * 2654435761ull + 88172645463325252ull;
    e = getenv("FAKE_CUDA_DROP_WAIT");
    drop_wait = e && *e ? atol(e) : -1;
    e = getenv("FAKE_CUDA_LATE_WAIT");
    late_wait = e && *e ? atol(e) : -1;
    e = getenv("FAKE_CUDA_HOSTPTR_LAUNCH");
    hostptr_launch = e && *e ? atol(e) : -1;
    S[0].live = true;
    catch_faults();
    M.init = true;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char **s)
{
    *s = err_name(r);
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = err_name(r);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
    const char *e = getenv("FAKE_CUDA_DEVICES");
    *n = e && *e ? atoi(e) : 2;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ord)
{
    int n;
    cuDeviceGetCount(&n);
    if (ord < 0 || ord >= n)
        return CUDA_ERROR_INVALID_VALUE;
    *d = ord;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    (void)d;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; break; /* kHz, an H200's boost */
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    default: fakecu_die("cuDeviceGetAttribute: attribute %d is not modelled", (int)a);
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    snprintf(name, (size_t)len, "fake H200 %d (kiln tests/cudafake)", (int)d);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *b, CUdevice d)
{
    (void)d;
    *b = 141ull << 30;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    (void)d;
    *c = (CUcontext)&ctx_dummy;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    (void)d;
    fake_drain();
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c)
{
    if (c != (CUcontext)&ctx_dummy)
        fakecu_die("cuCtxSetCurrent: %p is not the primary context", (void *)c);
    return CUDA_SUCCESS;
}

CUresult fake_in_capture(const char *call)
{
    if (!capturing)
        return CUDA_SUCCESS;
    fprintf(stderr, "fake CUDA: %s during stream capture: %s\n", call,
            err_name(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
    invalidate_captures();
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult cuMemAlloc(CUdeviceptr *p, size_t n)
{
    CUresult r = fake_in_capture("cuMemAlloc");
    if (r)
        return r;
    if (n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t rounded = (n + 255) / 256 * 256, pages = (rounded + PAGE - 1) / PAGE * PAGE;
    if (M.next + pages + PAGE > M.base + DEV_SPAN)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t map = M.next;
    if (mprotect((void *)(uintptr_t)map, pages, PROT_READ | PROT_WRITE) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    M.next += pages + PAGE; /* a guard page after */
    M.a = realloc(M.a, sizeof(Alloc) * (size_t)(M.na + 1));
    if (!M.a)
        fakecu_die("out of memory");
    uint64_t lo = map + pages - rounded;
    M.a[M.na++] = (Alloc){lo, lo + n, map, map + pages, true};
    /* fresh device memory is not zero */
    memset((void *)(uintptr_t)map, 0xa5, pages);
    *p = lo;
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p)
{
    CUresult r = fake_in_capture("cuMemFree");
    if (r)
        return r;
    fake_drain(); /* cuMemFree synchronises */
    Alloc *a = fake_find_alloc(p);
    if (!a || a->lo != p || !a->live)
        fakecu_die("cuMemFree: 0x%llx is not the start of a live allocation",
                   (unsigned long long)p);
    a->live = false;
    mprotect((void *)(uintptr_t)a->map_lo, a->map_hi - a->map_lo, PROT_NONE);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(void **p, size_t n)
{
    CUresult r = fake_in_capture("cuMemAllocHost");
    if (r)
        return r;
    void *q = NULL;
    if (posix_memalign(&q, PAGE, n ? n : 1) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    M.pin = realloc(M.pin, sizeof(Pinned) * (size_t)(M.npin + 1));
    if (!M.pin)
        fakecu_die("out of memory");
    M.pin[M.npin++] = (Pinned){q, n};
    *p = q;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p)
{
    fake_drain();
    for (int i = 0; i < M.npin; i++)
        if (M.pin[i].p == p) {
            free(p);
            M.pin[i] = M.pin[--M.npin];
            return CUDA_SUCCESS;
        }
    fakecu_die("cuMemFreeHost: %p was not allocated by cuMemAllocHost", p);
}

static CUresult memset_on(CUdeviceptr p, unsigned char v, size_t n, int s, const char *call)
{
    fakecu_check_dev(p, n, call, "dstDevice");
    fake_race_note_start(p);
    FOp *o = new_op(OP_MEMSET, "%s(0x%llx, %u, %zu) on stream %d", call, (unsigned long long)p,
                   v, n, s);
    o->dst = p;
    o->bytes = n;
    o->val = v;
    fake_add_acc(o, p, p + n, true);
    return enqueue(o, s, call);
}

/* cuMemsetD8: the legacy stream (asynchronous to the host for device memory) */
CUresult cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n)
{
    return memset_on(p, v, n, 0, "cuMemsetD8");
}

CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s)
{
    return memset_on(p, v, n, sidx(s, "cuMemsetD8Async"), "cuMemsetD8Async");
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    int i = sidx(s, "cuMemcpyHtoDAsync");
    fakecu_check_dev(dst, n, "cuMemcpyHtoDAsync", "dstDevice");
    check_host(src, n, "cuMemcpyHtoDAsync", "srcHost");
    fake_race_note_start(dst);
    FOp *o = new_op(OP_HTOD, "cuMemcpyHtoDAsync(0x%llx, %p, %zu) on stream %d",
                   (unsigned long long)dst, src, n, i);
    o->dst = dst;
    o->src = (uint64_t)(uintptr_t)src;
    o->bytes = n;
    fake_add_acc(o, dst, dst + n, true);
    if (!S[i].cap) {
        o->snap = malloc(n ? n : 1);
        if (!o->snap)
            fakecu_die("out of memory");
        memcpy(o->snap, src, n);
    }
    return enqueue(o, i, "cuMemcpyHtoDAsync");
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    int i = sidx(s, "cuMemcpyDtoHAsync");
    fakecu_check_dev(src, n, "cuMemcpyDtoHAsync", "srcDevice");
    check_host(dst, n, "cuMemcpyDtoHAsync", "dstHost");
    fake_race_note_start(src);
    FOp *o = new_op(OP_DTOH, "cuMemcpyDtoHAsync(%p, 0x%llx, %zu) on stream %d", dst,
                   (unsigned long long)src, n, i);
    o->dst = (uint64_t)(uintptr_t)dst;
    o->src = src;
    o->bytes = n;
    fake_add_acc(o, src, src + n, false);
    if (!S[i].cap)
        memset(dst, 0xff, n); /* a read before the synchronisation sees NaN */
    return enqueue(o, i, "cuMemcpyDtoHAsync");
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    int i = sidx(s, "cuMemcpyDtoDAsync");
    fakecu_check_dev(dst, n, "cuMemcpyDtoDAsync", "dstDevice");
    fakecu_check_dev(src, n, "cuMemcpyDtoDAsync", "srcDevice");
    fake_race_note_start(dst);
    fake_race_note_start(src);
    FOp *o = new_op(OP_DTOD, "cuMemcpyDtoDAsync(0x%llx, 0x%llx, %zu) on stream %d",
                   (unsigned long long)dst, (unsigned long long)src, n, i);
    o->dst = dst;
    o->src = src;
    o->bytes = n;
    fake_add_acc(o, src, src + n, false);
    fake_add_acc(o, dst, dst + n, true);
    return enqueue(o, i, "cuMemcpyDtoDAsync");
}

/* cuMemcpy2DAsync: device to device only (what the module uses: tensor
 * parallelism's layout copies); Height rows of WidthInBytes, each pitch at
 * least the width. One op whose accesses are the two bounding ranges (from
 * the first row's start to the last row's end): a race with bytes between
 * the rows is over-reported, never missed. */
typedef struct {
    uint64_t src, dst;
    size_t spitch, dpitch, width, height;
} Copy2D;

static void copy2d(void *arg)
{
    const Copy2D *c = arg;
    for (size_t y = 0; y < c->height; y++)
        memmove((void *)(uintptr_t)(c->dst + y * c->dpitch),
                (const void *)(uintptr_t)(c->src + y * c->spitch), c->width);
}

CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *p, CUstream s)
{
    if (!p || p->srcMemoryType != CU_MEMORYTYPE_DEVICE ||
        p->dstMemoryType != CU_MEMORYTYPE_DEVICE)
        fakecu_die("cuMemcpy2DAsync: only device-to-device copies are modelled");
    if (p->srcPitch < p->WidthInBytes || p->dstPitch < p->WidthInBytes)
        return CUDA_ERROR_INVALID_VALUE; /* as the driver: a pitch below the width */
    if (p->WidthInBytes == 0 || p->Height == 0)
        return CUDA_SUCCESS;
    Copy2D *c = calloc(1, sizeof *c);
    if (!c)
        fakecu_die("out of memory");
    c->src = p->srcDevice + p->srcXInBytes + p->srcY * p->srcPitch;
    c->dst = p->dstDevice + p->dstXInBytes + p->dstY * p->dstPitch;
    c->spitch = p->srcPitch;
    c->dpitch = p->dstPitch;
    c->width = p->WidthInBytes;
    c->height = p->Height;
    uint64_t s1 = c->src + (c->height - 1) * c->spitch + c->width;
    uint64_t d1 = c->dst + (c->height - 1) * c->dpitch + c->width;
    if (c->src < d1 && c->dst < s1)
        fakecu_die("cuMemcpy2DAsync: source [0x%llx, 0x%llx) and destination [0x%llx, "
                   "0x%llx) overlap", (unsigned long long)c->src, (unsigned long long)s1,
                   (unsigned long long)c->dst, (unsigned long long)d1);
    FakeRange rg[2] = {{c->src, s1, false}, {c->dst, d1, true}};
    char desc[128];
    snprintf(desc, sizeof desc, "cuMemcpy2DAsync(%zu rows of %zu bytes, pitches %zu -> %zu)",
             c->height, c->width, c->spitch, c->dpitch);
    return fakecu_enqueue(s, desc, rg, 2, copy2d, c);
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    for (int i = 1; i < MAXS; i++)
        if (!S[i].live && S[i].seq == 0) {
            S[i].live = true;
            S[i].flags = flags;
            /* a new stream starts after what the host has seen */
            memcpy(S[i].vc, host_vc, sizeof S[i].vc);
            *s = (CUstream)&S[i];
            return CUDA_SUCCESS;
        }
    fakecu_die("cuStreamCreate: more than %d streams", MAXS - 1);
}

CUresult cuStreamDestroy(CUstream s)
{
    int i = sidx(s, "cuStreamDestroy");
    if (i == 0)
        return CUDA_ERROR_INVALID_HANDLE;
    fake_drain();
    S[i].live = false; /* its index is not reused (vector clocks keep it) */
    return CUDA_SUCCESS;
}

static CUresult sync_stream(CUstream s, const char *call)
{
    int i = sidx(s, call);
    if (S[i].cap || (i == 0 && capturing)) {
        fprintf(stderr, "fake CUDA: %s of a capturing stream: %s\n", call,
                err_name(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        invalidate_captures();
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    bool query = strcmp(call, "cuStreamQuery") == 0;
    drain_ops(query);
    if (query && S[i].head)
        return CUDA_ERROR_NOT_READY; /* it waits on another process */
    vc_join(host_vc, S[i].vc);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) { return sync_stream(s, "cuStreamSynchronize"); }

CUresult cuStreamQuery(CUstream s) { return sync_stream(s, "cuStreamQuery"); }

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    (void)flags;
    int i = sidx(s, "cuStreamWaitEvent");
    FEvent *ev = (FEvent *)e;
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    wait_calls++;
    if (wait_calls == drop_wait) {
        fprintf(stderr, "fake CUDA: negative control: cuStreamWaitEvent #%ld ignored\n",
                wait_calls);
        return CUDA_SUCCESS;
    }
    if (S[i].cap)
        fakecu_die("cuStreamWaitEvent on a capturing stream is not modelled");
    if (wait_calls == late_wait && ev->recorded) {
        fprintf(stderr, "fake CUDA: negative control: cuStreamWaitEvent #%ld applied after "
                "the stream's next op\n", wait_calls);
        memcpy(late_vc, ev->vc, sizeof late_vc);
        late_stream = i;
        return CUDA_SUCCESS;
    }
    if (ev->recorded)
        vc_join(S[i].vc, ev->vc);
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    FEvent *ev = calloc(1, sizeof *ev);
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ev->flags = flags;
    ev->done = true; /* a never-recorded event counts as complete */
    *e = (CUevent)ev;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent e)
{
    /* markers still queued refer to it: it stays allocated (a few bytes) */
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s)
{
    int i = sidx(s, "cuEventRecord");
    FEvent *ev = (FEvent *)e;
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    if (S[i].cap)
        fakecu_die("cuEventRecord on a capturing stream is not modelled");
    FOp *o = new_op(OP_MARK, "cuEventRecord on stream %d", i);
    o->ev = ev;
    o->gen = ++ev->gen;
    CUresult r = enqueue(o, i, "cuEventRecord");
    if (r)
        return r;
    memcpy(ev->vc, o->vc, sizeof ev->vc);
    ev->recorded = true;
    ev->done = false;
    return CUDA_SUCCESS;
}

static CUresult sync_event(CUevent e, bool query)
{
    FEvent *ev = (FEvent *)e;
    if (!ev)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ev->done)
        drain_ops(query);
    if (!ev->done && query)
        for (int i = 0; i < MAXS; i++)
            if (S[i].head)
                return CUDA_ERROR_NOT_READY; /* what it follows waits on another process */
    if (!ev->done)
        fakecu_die("an event never completed after every queued op ran");
    if (ev->recorded)
        vc_join(host_vc, ev->vc);
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent e) { return sync_event(e, false); }

CUresult cuEventQuery(CUevent e) { return sync_event(e, true); }

CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    FEvent *x = (FEvent *)a, *y = (FEvent *)b;
    if (!x || !y || !x->recorded || !y->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((x->flags | y->flags) & CU_EVENT_DISABLE_TIMING)
        fakecu_die("cuEventElapsedTime on an event created with CU_EVENT_DISABLE_TIMING "
                   "(the driver answers CUDA_ERROR_INVALID_HANDLE)");
    if (!x->done || !y->done)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)(y->t - x->t);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                        void **extra)
{
    Func *fn = (Func *)f;
    if (!fn)
        return CUDA_ERROR_INVALID_HANDLE;
    int i = sidx(s, "cuLaunchKernel");
    launch_calls++;
    char call[160];
    snprintf(call, sizeof call, "cuLaunchKernel(%s)", fn->name);
    if (extra)
        fakecu_die("%s: `extra` is not modelled", call);
    if (!params && fn->nparams)
        fakecu_die("%s: no kernelParams for %d parameters", call, fn->nparams);
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || gx > 0x7fffffffu ||
        gy > 65535 || gz > 65535 || (uint64_t)bx * by * bz > 1024 || bz > 64)
        fakecu_die("%s: grid (%u,%u,%u) block (%u,%u,%u) is invalid (CUDA_ERROR_INVALID_VALUE)",
                   call, gx, gy, gz, bx, by, bz);
    if (shmem > 48 * 1024)
        fakecu_die("%s: %u bytes of dynamic shared memory need the opt-in attribute", call,
                   shmem);
    FOp *o = new_op(OP_KERNEL, "%s grid %u block %u on stream %d", call, gx, bx, i);
    o->f = fn;
    o->grid[0] = gx, o->grid[1] = gy, o->grid[2] = gz;
    o->block[0] = bx, o->block[1] = by, o->block[2] = bz;
    o->shmem = shmem;
    o->argbuf = calloc((size_t)fn->nparams + 1, 8);
    for (int k = 0; k < fn->nparams; k++) {
        memcpy(o->argbuf + 8 * k, params[k], fn->psize[k]);
        if (!fn->isptr[k])
            continue;
        uint64_t p;
        memcpy(&p, o->argbuf + 8 * k, 8);
        if (launch_calls == hostptr_launch) {
            static double host_buf[64];
            fprintf(stderr, "fake CUDA: negative control: argument %d of launch #%ld replaced "
                            "by a host pointer\n", k, launch_calls);
            p = (uint64_t)(uintptr_t)host_buf;
            memcpy(o->argbuf + 8 * k, &p, 8);
            hostptr_launch = -1;
        }
        char what[32];
        snprintf(what, sizeof what, "argument %d", k);
        fakecu_check_dev(p, 1, call, what);
        fake_race_note_start(p);
        /* read up to the next buffer's start (read_end) */
        if (o->nacc == o->cap) {
            o->cap = o->cap ? 2 * o->cap : 8;
            o->acc = realloc(o->acc, sizeof(FakeRange) * (size_t)o->cap);
            if (!o->acc)
                fakecu_die("out of memory");
        }
        o->acc[o->nacc++] = (FakeRange){p, 0, false};
    }
    return enqueue(o, i, call);
}

/* ---- for the other fakes ------------------------------------------------------------ */

CUresult fakecu_enqueue(CUstream s, const char *desc, const FakeRange *r, int nr,
                        void (*fn)(void *), void *arg)
{
    return fakecu_enqueue_when(s, desc, r, nr, fn, arg, NULL);
}

CUresult fakecu_enqueue_when(CUstream s, const char *desc, const FakeRange *r, int nr,
                             void (*fn)(void *), void *arg, bool (*gate)(void *))
{
    int i = sidx(s, desc);
    FOp *o = new_op(OP_HOST, "%s on stream %d", desc, i);
    o->fn = fn;
    o->arg = arg;
    o->gate = gate;
    for (int k = 0; k < nr; k++) {
        fakecu_check_dev(r[k].lo, r[k].hi - r[k].lo, desc, r[k].write ? "an output" : "an input");
        fake_race_note_start(r[k].lo);
        fake_add_acc(o, r[k].lo, r[k].hi, r[k].write);
    }
    return enqueue(o, i, desc);
}

/* ---- graphs ---------------------------------------------------------------------- */

CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    (void)mode;
    int i = sidx(s, "cuStreamBeginCapture");
    if (i == 0)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    if (S[i].cap)
        return CUDA_ERROR_ILLEGAL_STATE;
    S[i].cap = calloc(1, sizeof(FGraph));
    S[i].invalid = false;
    capturing++;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    int i = sidx(s, "cuStreamEndCapture");
    if (!S[i].cap)
        return CUDA_ERROR_ILLEGAL_STATE;
    FGraph *gr = S[i].cap;
    S[i].cap = NULL;
    capturing--;
    if (S[i].invalid) {
        *g = NULL;
        fprintf(stderr, "fake CUDA: cuStreamEndCapture: %s\n",
                err_name(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *g = (CUgraph)gr;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    (void)flags;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    GraphExec *x = calloc(1, sizeof *x);
    x->g = (FGraph *)g;
    *e = (CUgraphExec)x;
    return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
    GraphExec *x = (GraphExec *)e;
    if (!x)
        return CUDA_ERROR_INVALID_HANDLE;
    int i = sidx(s, "cuGraphLaunch");
    if (S[i].cap)
        fakecu_die("cuGraphLaunch into a capturing stream is not modelled");
    for (int k = 0; k < x->g->n; k++) {
        FOp *o = clone_op(x->g->op[k]);
        char d[sizeof o->desc];
        snprintf(d, sizeof d, "%s", o->desc);
        snprintf(o->desc, sizeof o->desc, "%.170s [graph node %d]", d, k);
        CUresult r = enqueue(o, i, "cuGraphLaunch");
        if (r)
            return r;
    }
    return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec e)
{
    fake_drain();
    free((GraphExec *)e);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g)
{
    (void)g; /* its ops' argument buffers may be shared by queued replays: kept */
    return CUDA_SUCCESS;
}

/* The real NVRTC opens libcuda.so.1 too and asks for the driver's private
 * export tables (and crashes when the symbol is missing): none here. */
CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    (void)id;
    *table = NULL;
    return CUDA_ERROR_NOT_FOUND;
}
