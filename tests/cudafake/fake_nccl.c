/* fake_nccl.c - a stand-in libnccl.so.2 for tests/cudafake: the NCCL calls
 * kiln's CUDA module makes (runtime/cuda/cuda_nccl.c), between the ranks'
 * processes on one machine, over the fake driver (fake_cuda.h).
 *
 * ncclGetUniqueId makes a name; the ranks that ncclCommInitRank with it map
 * one shared-memory file (/dev/shm/kiln-fake-nccl-NAME: a barrier counter
 * and one slot of FAKE_NCCL_SLOT bytes per rank). ncclAllReduce (f32,
 * or bf16, ncclSum or ncclAvg, in place or not) is one op on its stream (ordered and
 * race-checked by the fake driver, reading and writing the buffers' exact
 * ranges): when the stream runs it, the rank copies its buffer into its
 * slot, waits for every rank (barrier), sums the slots in rank order (then
 * divides by the rank count for ncclAvg), writes the result and waits again.
 * bf16 elements are summed in float and the sum rounded once to bf16
 * (NCCL rounds each partial sum of its ring: the same with 2 ranks).
 * ncclReduce and ncclBroadcast (f32, a root rank; zero=1's sharded
 * buckets) work the same way through the root's slot; FAKE_NCCL_DROP_BCAST=N
 * makes this process's N-th broadcast write nothing (a negative control).
 * ncclAllGather and ncclReduceScatter (f32 or bf16; ncclSum or ncclAvg; tensor
 * parallelism's collectives) too: every rank copies its send into its
 * slot; a gather copies the slots in rank order into recv, a reduce-scatter
 * sums (in rank order) the rank's chunk of every slot into recv.
 * FAKE_NCCL_DROP_ALLREDUCE=N makes this process's N-th ncclAllReduce write
 * nothing (a negative control: a skipped TP all-reduce).
 * Every rank runs its collectives in the same order, so the ops meet. A
 * barrier that waits more than 120 s stops the process (a rank that never
 * came).
 * ncclSend and ncclRecv (f32 or bytes; pipeline stages) match as NCCL's
 * do: per ordered pair of ranks, the k-th send from a to b meets the k-th
 * receive on b from a, through a channel in the shared header (sequence
 * numbers, each message's count and type) and the sender's slot (its
 * part for b, CHAN_DEPTH messages deep). A send copies its data into the
 * channel and is done (NCCL's sends of small messages finish into the
 * peer's buffers the same way); it waits only while the channel is full.
 * A receive waits for its send; one whose count or type differs from the
 * send it meets stops the process naming both, and one whose sender never
 * sends stops it after FAKE_NCCL_TIMEOUT seconds (default 120). The
 * fake driver's one worker starts a send or receive only once it can
 * finish (fakecu_enqueue_when), running the process's other streams
 * meanwhile, so a receive waiting for its peer never holds up this
 * process's own sends on another stream (NCCL's streams progress apart;
 * sends that waited for their receive would deadlock the worker the same
 * way). The sends and receives between ncclGroupStart and ncclGroupEnd are
 * one op on the stream (the stream of the last call), its sends posted
 * before its receives wait. FAKE_NCCL_DROP_RECV=N makes this process's N-th receive
 * take the data but write nothing (a negative control: a transfer lost);
 * FAKE_NCCL_DROP_SEND=N makes its N-th send never happen (a peer that hangs:
 * its receive waits, cuda_nccl.c's comm_timeout must end the run).
 * ncclCommAbort leaves the shared memory mapped (the worker may be polling
 * a channel in it when the host gives up).
 * Collectives inside a group run as they are called. The non-blocking
 * ncclCommInitRankConfig is not offered (cuda_nccl.c falls back to
 * ncclCommInitRank). */
#include "fake_cuda.h"

#include <fcntl.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NC_API __attribute__((visibility("default")))

enum { SLOT = 64 << 20, HEADER = 4096 };

typedef struct {
    _Atomic uint64_t arrived;
} Shared;

/* ncclSend / ncclRecv: the channel from rank a to rank b (HEADER holds
 * size * size of them after Shared) */
enum { CHAN_DEPTH = 4 };
typedef struct {
    _Atomic uint64_t posted, taken; /* sends posted, receives that took one */
    uint64_t count[CHAN_DEPTH];     /* message k: [k % CHAN_DEPTH] */
    int type[CHAN_DEPTH];
} Chan;

struct ncclComm {
    int rank, size;
    Shared *sh;
    unsigned char *slots;
    uint64_t barriers; /* this rank's barrier count */
    char name[96];
};

typedef struct {
    struct ncclComm *c;
    uint64_t send, recv;
    size_t count;
    bool avg, drop; /* drop: FAKE_NCCL_DROP_ALLREDUCE's all-reduce, a no-op */
    bool bf16;      /* ncclBfloat16 elements, else ncclFloat32 */
} Reduce;

/* Element i of an f32 or bf16 array, as a float; and its store. */
static float elem(const void *p, size_t i, bool bf16)
{
    return bf16 ? fakecu_bf2f(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void put(void *p, size_t i, float v, bool bf16)
{
    if (bf16)
        ((uint16_t *)p)[i] = fakecu_f2bf(v);
    else
        ((float *)p)[i] = v;
}

/* The reductions' element types: f32 and bf16 (4 or 2 bytes). */
static bool reducible(ncclDataType_t type) { return type == ncclFloat32 || type == ncclBfloat16; }

NC_API ncclResult_t ncclGetVersion(int *v)
{
    *v = 22809;
    return ncclSuccess;
}

NC_API const char *ncclGetErrorString(ncclResult_t r)
{
    (void)r;
    return "fake NCCL error";
}

NC_API ncclResult_t ncclGetUniqueId(ncclUniqueId *u)
{
    memset(u, 0, sizeof *u);
    snprintf(u->internal, sizeof u->internal, "%d-%llx", (int)getpid(),
             (unsigned long long)fakecu_random());
    return ncclSuccess;
}

NC_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int n, ncclUniqueId id, int rank)
{
    if (n < 1 || rank < 0 || rank >= n || !id.internal[0])
        return ncclInvalidArgument;
    struct ncclComm *c = calloc(1, sizeof *c);
    c->rank = rank;
    c->size = n;
    snprintf(c->name, sizeof c->name, "/kiln-fake-nccl-%.60s", id.internal);
    int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
    if (fd < 0)
        fakecu_die("ncclCommInitRank: shm_open %s failed", c->name);
    size_t bytes = HEADER + (size_t)n * SLOT;
    if (ftruncate(fd, (off_t)bytes) != 0)
        fakecu_die("ncclCommInitRank: ftruncate %s failed", c->name);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        fakecu_die("ncclCommInitRank: mmap %s failed", c->name);
    c->sh = p;
    c->slots = (unsigned char *)p + HEADER;
    *comm = c;
    return ncclSuccess;
}

static void barrier(struct ncclComm *c, const char *what)
{
    uint64_t want = ++c->barriers * (uint64_t)c->size;
    atomic_fetch_add(&c->sh->arrived, 1);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(&c->sh->arrived) < want) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 120)
            fakecu_die("fake NCCL: rank %d waited 120 s for its peers in %s", c->rank, what);
    }
}

static void reduce(void *arg)
{
    Reduce *r = arg;
    struct ncclComm *c = r->c;
    size_t bytes = r->count * (r->bf16 ? 2 : 4);
    memcpy(c->slots + (size_t)c->rank * SLOT, (void *)(uintptr_t)r->send, bytes);
    barrier(c, "ncclAllReduce");
    void *out = (void *)(uintptr_t)r->recv;
    for (size_t i = 0; i < r->count && !r->drop; i++) {
        float s = 0;
        for (int k = 0; k < c->size; k++)
            s += elem(c->slots + (size_t)k * SLOT, i, r->bf16);
        put(out, i, r->avg ? s / (float)c->size : s, r->bf16);
    }
    barrier(c, "ncclAllReduce");
}

NC_API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream)
{
    if (!reducible(type) || (op != ncclSum && op != ncclAvg))
        fakecu_die("fake NCCL: ncclAllReduce of type %d, op %d is not modelled", (int)type,
                   (int)op);
    size_t es = type == ncclBfloat16 ? 2 : 4;
    if (count * es > SLOT)
        fakecu_die("fake NCCL: ncclAllReduce of %zu elements (the fake holds %d bytes)", count,
                   (int)SLOT);
    static long nreduce;
    const char *drop = getenv("FAKE_NCCL_DROP_ALLREDUCE");
    Reduce *r = calloc(1, sizeof *r);
    *r = (Reduce){comm, (uint64_t)(uintptr_t)send, (uint64_t)(uintptr_t)recv, count,
                  op == ncclAvg, drop && ++nreduce == atol(drop), es == 2};
    FakeRange rg[2] = {{r->send, r->send + count * es, false},
                       {r->recv, r->recv + count * es, true}};
    char desc[96];
    snprintf(desc, sizeof desc, "ncclAllReduce(%zu %s, rank %d of %d)", count,
             es == 2 ? "bf16" : "floats", comm->rank, comm->size);
    return fakecu_enqueue((CUstream)stream, desc, rg, 2, reduce, r) == CUDA_SUCCESS
               ? ncclSuccess
               : ncclUnhandledCudaError;
}

/* ncclReduce and ncclBroadcast: one op on the stream, like ncclAllReduce.
 * Reduce: every rank copies its send into its slot; the root sums the slots
 * in rank order (then divides for ncclAvg) into its recv. Broadcast: the
 * root copies its send into its slot; every rank copies it into its recv. */
typedef struct {
    struct ncclComm *c;
    uint64_t send, recv;
    size_t count;
    int root;
    bool avg, bcast, drop; /* drop: FAKE_NCCL_DROP_BCAST's broadcast, a no-op */
} Rooted;

static void rooted(void *arg)
{
    Rooted *r = arg;
    struct ncclComm *c = r->c;
    size_t bytes = r->count * 4;
    const char *what = r->bcast ? "ncclBroadcast" : "ncclReduce";
    if (!r->bcast || c->rank == r->root)
        memcpy(c->slots + (size_t)c->rank * SLOT, (void *)(uintptr_t)r->send, bytes);
    barrier(c, what);
    float *out = (float *)(uintptr_t)r->recv;
    if (r->bcast && !r->drop)
        memcpy(out, c->slots + (size_t)r->root * SLOT, bytes);
    if (!r->bcast && c->rank == r->root)
        for (size_t i = 0; i < r->count; i++) {
            float s = 0;
            for (int k = 0; k < c->size; k++)
                s += ((const float *)(c->slots + (size_t)k * SLOT))[i];
            out[i] = r->avg ? s / (float)c->size : s;
        }
    barrier(c, what);
}

/* The argument checks NCCL makes (ArgsCheck): the datatype and op, root in
 * [0, nranks), and device pointers where the rank uses them: a reduce's
 * recvbuff only on the root, a broadcast's sendbuff only on the root
 * (in place on the root when they are equal). */
static ncclResult_t enqueue_rooted(const char *what, const void *send, void *recv, size_t count,
                                   ncclDataType_t type, ncclRedOp_t op, bool bcast, int root,
                                   ncclComm_t comm, cudaStream_t stream)
{
    if (!comm || root < 0 || root >= comm->size) {
        fprintf(stderr, "fake NCCL: %s: root %d outside [0, %d)\n", what, root,
                comm ? comm->size : 0);
        return ncclInvalidArgument;
    }
    if (type != ncclFloat32 || (!bcast && op != ncclSum && op != ncclAvg))
        fakecu_die("fake NCCL: %s of type %d, op %d is not modelled", what, (int)type, (int)op);
    if (count * 4 > SLOT)
        fakecu_die("fake NCCL: %s of %zu elements (the fake holds %d bytes)", what, count,
                   (int)SLOT);
    if (count == 0)
        return ncclSuccess;
    bool me = comm->rank == root, reads = !bcast || me, writes = bcast || me;
    if ((reads && !send) || (writes && !recv)) {
        fprintf(stderr, "fake NCCL: %s: a NULL %s on rank %d (root %d)\n", what,
                reads && !send ? "sendbuff" : "recvbuff", comm->rank, root);
        return ncclInvalidArgument;
    }
    static long nbcast;
    const char *drop = getenv("FAKE_NCCL_DROP_BCAST");
    Rooted *r = calloc(1, sizeof *r);
    *r = (Rooted){comm, (uint64_t)(uintptr_t)send, (uint64_t)(uintptr_t)recv, count, root,
                  op == ncclAvg, bcast, bcast && drop && ++nbcast == atol(drop)};
    FakeRange rg[2];
    int nr = 0;
    if (reads)
        rg[nr++] = (FakeRange){r->send, r->send + count * 4, false};
    if (writes && !(reads && r->send == r->recv))
        rg[nr++] = (FakeRange){r->recv, r->recv + count * 4, true};
    else if (writes)
        rg[nr - 1].write = true; /* in place */
    char desc[96];
    snprintf(desc, sizeof desc, "%s(%zu floats, root %d, rank %d of %d)", what, count, root,
             comm->rank, comm->size);
    return fakecu_enqueue((CUstream)stream, desc, rg, nr, rooted, r) == CUDA_SUCCESS
               ? ncclSuccess
               : ncclUnhandledCudaError;
}

NC_API ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue_rooted("ncclReduce", send, recv, count, type, op, false, root, comm, stream);
}

NC_API ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, int root, ncclComm_t comm,
                                  cudaStream_t stream)
{
    return enqueue_rooted("ncclBroadcast", send, recv, count, type, ncclSum, true, root, comm,
                          stream);
}

/* ncclAllGather (count elements from each rank, recv holds size * count in
 * rank order) and ncclReduceScatter (send holds size * count; recv gets
 * this rank's count, summed over the ranks): one op on the stream. */
typedef struct {
    struct ncclComm *c;
    uint64_t send, recv;
    size_t count;
    bool gather, avg, bf16;
} Spread;

static void spread(void *arg)
{
    Spread *r = arg;
    struct ncclComm *c = r->c;
    size_t n = (size_t)c->size, in = r->gather ? r->count : n * r->count;
    const char *what = r->gather ? "ncclAllGather" : "ncclReduceScatter";
    size_t es = r->bf16 ? 2 : 4;
    memcpy(c->slots + (size_t)c->rank * SLOT, (void *)(uintptr_t)r->send, in * es);
    barrier(c, what);
    unsigned char *out = (unsigned char *)(uintptr_t)r->recv;
    if (r->gather)
        for (size_t k = 0; k < n; k++)
            memcpy(out + k * r->count * es, c->slots + k * SLOT, r->count * es);
    else
        for (size_t i = 0; i < r->count; i++) {
            float s = 0;
            for (size_t k = 0; k < n; k++)
                s += elem(c->slots + k * SLOT, (size_t)c->rank * r->count + i, r->bf16);
            put(out, i, r->avg ? s / (float)c->size : s, r->bf16);
        }
    barrier(c, what);
}

static ncclResult_t enqueue_spread(bool gather, const void *send, void *recv, size_t count,
                                   ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream)
{
    const char *what = gather ? "ncclAllGather" : "ncclReduceScatter";
    if (!comm || !send || !recv) {
        fprintf(stderr, "fake NCCL: %s: a NULL communicator or buffer\n", what);
        return ncclInvalidArgument;
    }
    if (!reducible(type) || (!gather && op != ncclSum && op != ncclAvg))
        fakecu_die("fake NCCL: %s of type %d, op %d is not modelled", what, (int)type, (int)op);
    size_t n = (size_t)comm->size, in = gather ? count : n * count;
    size_t out = gather ? n * count : count;
    size_t es = type == ncclBfloat16 ? 2 : 4;
    if (in * es > SLOT)
        fakecu_die("fake NCCL: %s of %zu elements (the fake holds %d bytes)", what, in,
                   (int)SLOT);
    if (count == 0)
        return ncclSuccess;
    Spread *r = calloc(1, sizeof *r);
    *r = (Spread){comm, (uint64_t)(uintptr_t)send, (uint64_t)(uintptr_t)recv, count, gather,
                  op == ncclAvg, es == 2};
    /* NCCL's in-place forms: send at this rank's chunk of recv (a gather),
     * recv at this rank's chunk of send (a reduce-scatter); any other
     * overlap is undefined in NCCL, an error here */
    uint64_t s0 = r->send, s1 = s0 + in * es, d0 = r->recv, d1 = d0 + out * es;
    bool inplace = gather ? s0 == d0 + (uint64_t)comm->rank * count * es
                          : d0 == s0 + (uint64_t)comm->rank * count * es;
    if (!inplace && s0 < d1 && d0 < s1)
        fakecu_die("fake NCCL: %s: send [0x%llx, 0x%llx) and recv [0x%llx, 0x%llx) overlap",
                   what, (unsigned long long)s0, (unsigned long long)s1,
                   (unsigned long long)d0, (unsigned long long)d1);
    FakeRange rg[2] = {{s0, s1, false}, {d0, d1, true}};
    int nr = 2;
    if (inplace) /* one range, written (it holds the other) */
        rg[0] = (FakeRange){s0 < d0 ? s0 : d0, s1 > d1 ? s1 : d1, true}, nr = 1;
    char desc[96];
    snprintf(desc, sizeof desc, "%s(%zu %s, rank %d of %d)", what, count,
             es == 2 ? "bf16" : "floats", comm->rank, comm->size);
    return fakecu_enqueue((CUstream)stream, desc, rg, nr, spread, r) == CUDA_SUCCESS
               ? ncclSuccess
               : ncclUnhandledCudaError;
}

NC_API ncclResult_t ncclAllGather(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue_spread(true, send, recv, count, type, ncclSum, comm, stream);
}

NC_API ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count,
                                      ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream)
{
    return enqueue_spread(false, send, recv, count, type, op, comm, stream);
}

/* ---- ncclSend / ncclRecv ------------------------------------------------ */

typedef struct {
    struct ncclComm *c;
    bool send, drop; /* drop: FAKE_NCCL_DROP_RECV's receive writes nothing */
    int peer, type;
    uint64_t buf;
    size_t count;
} P2p;

typedef struct {
    P2p *op;
    int n;
    double waited; /* p2p_gate: CLOCK_MONOTONIC seconds of its first "not yet" */
} P2pGroup;

static int group_depth;
static P2pGroup pending; /* the p2p calls of the open group */
static CUstream pending_stream;

static Chan *chan(struct ncclComm *c, int from, int to)
{
    return (Chan *)((unsigned char *)c->sh + sizeof(Shared)) + (size_t)from * (size_t)c->size +
           (size_t)to;
}

static size_t type_size(int type) { return type == ncclFloat32 ? 4 : 1; }

static double fake_timeout(void)
{
    const char *e = getenv("FAKE_NCCL_TIMEOUT");
    return e && *e ? atof(e) : 120;
}

/* Spins until *v >= want; stops the process after the timeout. */
static void await(_Atomic uint64_t *v, uint64_t want, const P2p *o, const char *what)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double lim = fake_timeout();
    while (atomic_load(v) < want) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) > lim)
            fakecu_die("fake NCCL: rank %d waited %g s for rank %d %s (%s of %zu elements, "
                       "type %d)", o->c->rank, lim, o->peer, what,
                       o->send ? "ncclSend" : "ncclRecv", o->count, o->type);
    }
}

static void post(const P2p *o)
{
    struct ncclComm *c = o->c;
    Chan *ch = chan(c, c->rank, o->peer);
    uint64_t k = atomic_load(&ch->posted);
    if (k >= CHAN_DEPTH) /* the channel is full: wait for the oldest's receive */
        await(&ch->taken, k - CHAN_DEPTH + 1, o, "to take an earlier send");
    size_t part = SLOT / (size_t)c->size / CHAN_DEPTH;
    memcpy(c->slots + (size_t)c->rank * SLOT +
               ((size_t)o->peer * CHAN_DEPTH + k % CHAN_DEPTH) * part,
           (void *)(uintptr_t)o->buf, o->count * type_size(o->type));
    ch->count[k % CHAN_DEPTH] = o->count;
    ch->type[k % CHAN_DEPTH] = o->type;
    atomic_store(&ch->posted, k + 1);
}

static void take(const P2p *o)
{
    struct ncclComm *c = o->c;
    Chan *ch = chan(c, o->peer, c->rank);
    uint64_t k = atomic_load(&ch->taken);
    await(&ch->posted, k + 1, o, "to send");
    uint64_t n = ch->count[k % CHAN_DEPTH];
    int type = ch->type[k % CHAN_DEPTH];
    if (n != o->count || type != o->type)
        fakecu_die("fake NCCL: rank %d's ncclRecv of %zu elements (type %d) from rank %d met "
                   "its ncclSend of %llu elements (type %d)", c->rank, o->count, o->type,
                   o->peer, (unsigned long long)n, type);
    size_t part = SLOT / (size_t)c->size / CHAN_DEPTH;
    if (!o->drop)
        memcpy((void *)(uintptr_t)o->buf,
               c->slots + (size_t)o->peer * SLOT +
                   ((size_t)c->rank * CHAN_DEPTH + k % CHAN_DEPTH) * part,
               o->count * type_size(o->type));
    atomic_store(&ch->taken, k + 1);
}

/* Whether a group may start: each receive's message posted, each send's
 * channel with room (fakecu_enqueue_when: the worker runs the process's
 * other streams meanwhile, as a GPU would, so a receive waiting for its
 * peer never holds up this process's own sends). */
static bool p2p_gate(void *arg)
{
    P2pGroup *g = arg;
    bool ok = true;
    for (int i = 0; i < g->n && ok; i++) {
        const P2p *o = &g->op[i];
        uint64_t mine = 0; /* this group's ops on o's channel up to o */
        for (int j = 0; j <= i; j++)
            mine += g->op[j].send == o->send && g->op[j].peer == o->peer;
        if (o->send) {
            Chan *ch = chan(o->c, o->c->rank, o->peer);
            ok = atomic_load(&ch->posted) + mine - atomic_load(&ch->taken) <= CHAN_DEPTH;
        } else {
            Chan *ch = chan(o->c, o->peer, o->c->rank);
            ok = atomic_load(&ch->posted) >= atomic_load(&ch->taken) + mine;
        }
    }
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double now = (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
    if (ok || g->waited == 0) {
        g->waited = ok ? 0 : now;
        return ok;
    }
    if (now - g->waited > fake_timeout())
        fakecu_die("fake NCCL: rank %d waited %g s for rank %d (%s of %zu elements, type %d, "
                   "and the rest of its group)", g->op[0].c->rank, fake_timeout(),
                   g->op[0].peer, g->op[0].send ? "ncclSend" : "ncclRecv", g->op[0].count,
                   g->op[0].type);
    return false;
}

/* A group's sends and receives when the stream runs them: the sends
 * posted, then the receives taken. */
static void p2p_run(void *arg)
{
    P2pGroup *g = arg;
    for (int i = 0; i < g->n; i++)
        if (g->op[i].send)
            post(&g->op[i]);
    for (int i = 0; i < g->n; i++)
        if (!g->op[i].send)
            take(&g->op[i]);
}

static ncclResult_t flush_group(void)
{
    if (pending.n == 0)
        return ncclSuccess;
    P2pGroup *g = malloc(sizeof *g);
    *g = pending;
    pending = (P2pGroup){0};
    FakeRange *rg = calloc((size_t)g->n, sizeof *rg);
    char desc[128];
    int at = 0;
    for (int i = 0; i < g->n; i++) {
        const P2p *o = &g->op[i];
        rg[i] = (FakeRange){o->buf, o->buf + o->count * type_size(o->type), !o->send};
        if (at < (int)sizeof desc - 40)
            at += snprintf(desc + at, sizeof desc - (size_t)at, "%s%s(%zu, peer %d)",
                           i ? " " : "", o->send ? "ncclSend" : "ncclRecv", o->count, o->peer);
    }
    CUresult r = fakecu_enqueue_when(pending_stream, desc, rg, g->n, p2p_run, g, p2p_gate);
    free(rg);
    return r == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

static ncclResult_t p2p(bool send, uint64_t buf, size_t count, ncclDataType_t type, int peer,
                        ncclComm_t comm, cudaStream_t stream)
{
    const char *what = send ? "ncclSend" : "ncclRecv";
    if (!comm || peer < 0 || peer >= comm->size) {
        fprintf(stderr, "fake NCCL: %s: peer %d outside [0, %d)\n", what, peer,
                comm ? comm->size : 0);
        return ncclInvalidArgument;
    }
    if (type != ncclFloat32 && type != ncclUint8 && type != ncclInt8)
        fakecu_die("fake NCCL: %s of type %d is not modelled", what, (int)type);
    if ((size_t)(sizeof(Shared) + (size_t)comm->size * (size_t)comm->size * sizeof(Chan)) >
        HEADER)
        fakecu_die("fake NCCL: %s: %d ranks do not fit the header's channels", what,
                   comm->size);
    if (count * type_size(type) > SLOT / (size_t)comm->size / CHAN_DEPTH)
        fakecu_die("fake NCCL: %s of %zu elements (the fake holds %zu bytes per message)",
                   what, count, SLOT / (size_t)comm->size / CHAN_DEPTH);
    if (count == 0)
        return ncclSuccess;
    if (!buf) {
        fprintf(stderr, "fake NCCL: %s: a NULL buffer\n", what);
        return ncclInvalidArgument;
    }
    static long nrecv, nsend;
    const char *dsend = getenv("FAKE_NCCL_DROP_SEND");
    if (send && dsend && ++nsend == atol(dsend))
        return ncclSuccess; /* FAKE_NCCL_DROP_SEND: never sent (a peer that hangs) */
    const char *drop = getenv("FAKE_NCCL_DROP_RECV");
    P2p o = {comm, send, !send && drop && ++nrecv == atol(drop), peer, (int)type, buf, count};
    pending.op = realloc(pending.op, sizeof(P2p) * (size_t)(pending.n + 1));
    pending.op[pending.n++] = o;
    pending_stream = (CUstream)stream;
    return group_depth > 0 ? ncclSuccess : flush_group();
}

NC_API ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    return p2p(true, (uint64_t)(uintptr_t)send, count, type, peer, comm, stream);
}

NC_API ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    return p2p(false, (uint64_t)(uintptr_t)recv, count, type, peer, comm, stream);
}

NC_API ncclResult_t ncclGroupStart(void);
NC_API ncclResult_t ncclGroupEnd(void);

NC_API ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

NC_API ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0) {
        fprintf(stderr, "fake NCCL: ncclGroupEnd without ncclGroupStart\n");
        return ncclInvalidUsage;
    }
    return --group_depth > 0 ? ncclSuccess : flush_group();
}

NC_API ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return ncclSuccess;
    munmap(c->sh, HEADER + (size_t)c->size * SLOT);
    if (c->rank == 0)
        shm_unlink(c->name);
    free(c);
    return ncclSuccess;
}

/* The shared memory stays mapped: the stream worker may still be polling a
 * transfer's channel in it (the process is about to stop). */
NC_API ncclResult_t ncclCommAbort(ncclComm_t c)
{
    (void)c;
    return ncclSuccess;
}
