/* mpi.c - ranks and collectives between CPU processes through MPI.
 *
 * One communication thread per rank runs the collectives in the order they
 * were queued (every rank queues the same collectives in the same order, so
 * the order matches across ranks). A gradient bucket is packed from the arena
 * into one f32 buffer, summed over ranks with a non-blocking all-reduce,
 * scaled by 1/size and unpacked in place. The thread polls the request with
 * short sleeps (it must not steal a core from the compute threads) and
 * answers liveness pings meanwhile; past the timeout it pings every rank, names
 * the one that does not answer (or, when all answer, the one that has not
 * reached this collective) and stops the job with MPI_Abort. Broadcasts (the
 * NCCL id) take the same queue. A ZeRO-1 all-gather bucket is started in
 * order but not waited for: its point-to-point messages (each rank's part
 * of each tensor, from the owner's params straight into the others', on a
 * communicator of their own, posted in the same order on every rank) stay
 * in flight while the thread runs later jobs (host collectives, the next
 * step's buckets) and it lands when they complete, so the gathers overlap
 * the next forward and never hold up a host collective. An all-gather's
 * start is held on the calling thread until its next call into RtComm
 * that is not a host collective (a start, a wait, the next step's
 * rt_comm_stats_reset, the close): a host collective then goes to MPI
 * before the held gathers, so
 * the loss's mean that `kiln train` runs right after each step does not
 * wait behind the step's gathers (a small message queued behind them in
 * MPI completes only after their data, and the comm threads copying their
 * data leave its callers no core to wake on), and the gathers overlap the
 * next forward instead; the release points are the calling
 * thread's program order, the same on every rank, so every rank issues the
 * collectives in the same order (rt_comm_release is one more: the executor
 * releases zero=1's first gather bucket at once when the shard update's
 * rest runs after it, runtime/pieces.c). A wait returns once its bucket is
 * settled: once this rank has what it needs from the bucket, which for
 * zero=1 can be before MPI is done with it (an all-gather that lies in the
 * rank's own shard is settled at its start, on the calling thread, which
 * also writes the rank's own part of every gather into the params; a
 * reduce-scatter of which the rank receives nothing is settled once its
 * gradients are staged, and stays in flight like a gather). Buckets that a
 * GPU reduces itself (NCCL) are not seen here; their times come in through
 * rt_comm_set_source. The tensor-parallel collectives are in mpi_tp.c,
 * the pipeline's point to point and group collectives in mpi_pp.c; what
 * the three share (the communicator's state, nap, lost, the chunk size)
 * in mpi_internal.h. */
#include "codegen.h"
#include "mpi_internal.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

void rt_mpi_nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Answers every waiting liveness ping with the number of collectives this
 * rank has begun. */
static void answer_pings(RtComm *c)
{
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_PING, c->pc, &flag, &st);
        if (!flag)
            return;
        int64_t x;
        MPI_Recv(&x, 1, MPI_INT64_T, st.MPI_SOURCE, TAG_PING, c->pc, MPI_STATUS_IGNORE);
        int64_t mine = c->started;
        MPI_Send(&mine, 1, MPI_INT64_T, st.MPI_SOURCE, TAG_PONG, c->pc);
    }
}

/* A collective has not finished within the timeout: find whom we lost, say
 * so, and stop every rank. */
_Noreturn void rt_mpi_lost(RtComm *c, const char *what)
{
    int n = c->wsize;
    int64_t mine = c->started;
    int64_t *their = xcalloc((size_t)n, sizeof *their);
    MPI_Request *rq = xmalloc(sizeof *rq * (size_t)n), *sq = xmalloc(sizeof *sq * (size_t)n);
    int *got = xcalloc((size_t)n, sizeof *got);
    for (int r = 0; r < n; r++) {
        rq[r] = sq[r] = MPI_REQUEST_NULL;
        if (r == c->wrank)
            continue;
        MPI_Irecv(&their[r], 1, MPI_INT64_T, r, TAG_PONG, c->pc, &rq[r]);
        MPI_Isend(&mine, 1, MPI_INT64_T, r, TAG_PING, c->pc, &sq[r]);
    }
    double grace = c->timeout < 2 ? c->timeout : 2, t0 = ir_now();
    int pending = n - 1;
    while (pending > 0 && ir_now() - t0 < grace) {
        for (int r = 0; r < n; r++) {
            if (r == c->wrank || got[r])
                continue;
            int flag = 0;
            MPI_Test(&rq[r], &flag, MPI_STATUS_IGNORE);
            if (flag) {
                got[r] = 1;
                pending--;
            }
        }
        answer_pings(c);
        rt_mpi_nap(100000);
    }
    char names[256] = "";
    size_t k = 0;
    bool silent = pending > 0;
    for (int r = 0; r < n && k < sizeof names - 16; r++)
        if (r != c->wrank && (silent ? !got[r] : their[r] < mine))
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%d", k ? ", " : "", r);
    if (silent)
        fprintf(stderr,
                "kiln: rank %d: lost rank %s: no answer for %g s during %s (the bound is "
                "comm_timeout=%g s); stopping every rank\n",
                c->wrank, names, c->timeout, what, c->timeout);
    else if (k)
        fprintf(stderr,
                "kiln: rank %d: lost rank %s: it is alive but did not join %s within %g s "
                "(comm_timeout); stopping every rank\n",
                c->wrank, names, what, c->timeout);
    else
        fprintf(stderr,
                "kiln: rank %d: %s did not finish within %g s (comm_timeout) although every "
                "rank answers; stopping every rank\n",
                c->wrank, what, c->timeout);
    fflush(stderr);
    rt_rank_status("lost %s", k ? names : "?");
    /* a silent rank may be stopped (SIGSTOP) or hung: under the launcher
     * it is killed here, so that it neither lingers nor, woken by mpirun's
     * teardown, reports itself as stopped by another rank's failure */
    for (int r = 0; silent && r < n; r++)
        if (r != c->wrank && !got[r])
            rt_rank_kill_hung(r, c->timeout);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

static void poll_fly(RtComm *c);

/* Waits for rq, polling with a deadline (and the all-gathers in flight). */
static void finish(RtComm *c, MPI_Request rq, const char *what)
{
    double deadline = ir_now() + c->timeout;
    for (int spins = 0;; spins++) {
        int flag = 0;
        if (MPI_Test(&rq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            rt_mpi_lost(c, what);
        if (flag)
            return;
        poll_fly(c);
        if ((spins & 63) == 63) {
            answer_pings(c);
            if (ir_now() > deadline)
                rt_mpi_lost(c, what);
        }
        if (spins > 64)
            rt_mpi_nap(20000);
    }
}

/* Runs one all-reduce (sum) in place, polling with a deadline. */
static void allreduce(RtComm *c, void *buf, int64_t n, MPI_Datatype dt, const char *what)
{
    MPI_Request rq;
    if (MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, dt, MPI_SUM, c->cc, &rq) != MPI_SUCCESS)
        rt_mpi_lost(c, what);
    finish(c, rq, what);
}

/* The most elements (or bytes) one MPI call moves here: MPI's counts are
 * int, so a larger all-reduce, broadcast, send or reduce-scatter goes in
 * pieces of this size, in order (2^30; KILN_MPI_CHUNK, a test hook, makes
 * it smaller so that the tests run the pieces). */
int64_t rt_mpi_chunk(void)
{
    static _Atomic int64_t k;
    if (!k) {
        const char *e = getenv("KILN_MPI_CHUNK");
        long long v = e ? atoll(e) : 0;
        k = v > 0 && v < (1LL << 30) ? v : (1LL << 30);
    }
    return k;
}

/* n bytes at buf from rank 0 to every rank, polling with a deadline. */
static void bcast(RtComm *c, void *buf, size_t n, const char *what)
{
    size_t k = (size_t)rt_mpi_chunk();
    for (size_t a = 0; a == 0 || a < n; a += k) {
        MPI_Request rq;
        int len = (int)(n - a < k ? n - a : k);
        if (MPI_Ibcast((char *)buf + a, len, MPI_BYTE, 0, c->cc, &rq) != MPI_SUCCESS)
            rt_mpi_lost(c, what);
        finish(c, rq, what);
    }
}

/* Per rank: its part of the flat range [start, start + n) (counts, in
 * rank order, summing to n) and where each begins in the range (displs);
 * *lo: where this rank's part begins in its own shard. */
static void shard_counts(const RtComm *c, const Job *j, int64_t n, int *counts, int *displs,
                         int64_t *lo)
{
    int64_t at = 0;
    for (int r = 0; r < c->size; r++) {
        int64_t off, len;
        ir_shard_range(j->sh_total, c->size, r, &off, &len);
        int64_t a = j->sh_start > off ? j->sh_start : off;
        int64_t b = j->sh_start + n < off + len ? j->sh_start + n : off + len;
        counts[r] = b > a ? (int)(b - a) : 0;
        displs[r] = (int)at;
        at += counts[r];
        if (r == c->rank)
            *lo = b > a ? a - off : 0;
    }
}

static void land(RtComm *c, Flying *f);

/* Bucket buffers are kept for reuse, up to SPARE_MAX bytes: a zero=1 step
 * allocates and frees a few of a bucket's size per bucket, and glibc gives
 * blocks that large back to the kernel on free, so every step would fault
 * them in again, zeroed, on the 2 cores that also compute. */
enum { SPARE_MAX = 64 << 20 };

/* A buffer of at least n floats: the smallest spare that fits, or a new one. */
static Buf buf_take(RtComm *c, int64_t n)
{
    pthread_mutex_lock(&c->mu);
    int best = -1;
    for (int i = 0; i < c->spare.n; i++)
        if (c->spare.v[i].cap >= n && (best < 0 || c->spare.v[i].cap < c->spare.v[best].cap))
            best = i;
    Buf b = {NULL, 0};
    if (best >= 0) {
        b = c->spare.v[best];
        c->spare.v[best] = c->spare.v[--c->spare.n];
        c->spare_bytes -= b.cap * 4;
    }
    pthread_mutex_unlock(&c->mu);
    if (!b.p)
        b = (Buf){xmalloc(sizeof(float) * (size_t)(n + 1)), n + 1};
    return b;
}

static void buf_give(RtComm *c, Buf b)
{
    if (!b.p)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->spare_bytes + b.cap * 4 <= SPARE_MAX) {
        vec_push(&c->spare, b);
        c->spare_bytes += b.cap * 4;
        b.p = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(b.p);
}

/* The staging buffers of reduce-scatters in flight hold at most this many
 * bytes (and one bucket whatever its size): a rank that waits for nothing
 * from those buckets would otherwise stage every gradient of the step
 * while a slower rank is behind. */
enum { STAGED_MAX = 64 << 20 };

/* Lands buckets in flight until n more staged bytes fit under STAGED_MAX. */
static void make_room(RtComm *c, int64_t n)
{
    for (int spins = 0; c->staged > 0 && c->staged + n > STAGED_MAX; spins++) {
        poll_fly(c);
        if ((spins & 63) == 63)
            answer_pings(c);
        rt_mpi_nap(20000);
    }
}

/* Under mu: bucket b is no longer busy; its waits return. */
static void settle_locked(RtComm *c, int b, double t)
{
    c->bucket_busy[b]--;
    c->bucket_done[b] = t;
    pthread_cond_broadcast(&c->cv);
}

static void settle(RtComm *c, int b)
{
    pthread_mutex_lock(&c->mu);
    settle_locked(c, b, ir_now());
    pthread_mutex_unlock(&c->mu);
}

/* Writes [lo, hi) of the bucket's flat range, from src (src[0] is element
 * lo), into the bucket's tensors: they hold the range in order. */
static void write_range(const Job *j, const float *src, int64_t lo, int64_t hi)
{
    int64_t at = 0;
    for (int i = 0; i < j->k && at < hi; i++) {
        int64_t n = j->bytes[i] / 4, a = lo > at ? lo : at, e = hi < at + n ? hi : at + n;
        if (e > a)
            j->be->write(j->ctx, j->off[i] + (a - at) * 4, src + (a - lo), (e - a) * 4);
        at += n;
    }
}

/* Rank r's part [lo, hi) of an all-gather bucket's flat range, piece by
 * piece (a tensor's elements in it), straight between the ranks' params:
 * sent from this rank's params to every other rank if r is this rank,
 * else received into them from r. Every rank posts the same pieces in
 * the same order, so each pair's messages match in order. */
static void gather_part(RtComm *c, const Job *j, int r, int64_t lo, int64_t hi, Flying *f,
                        const char *what)
{
    int64_t at = 0;
    for (int i = 0; i < j->k && at < hi; i++) {
        int64_t n = j->bytes[i] / 4, a = lo > at ? lo : at, e = hi < at + n ? hi : at + n;
        if (e > a) {
            if (e - a > 0x7fffffff)
                die("the all-gather of bucket %d: a piece of %lld elements (at most 2^31 - 1)",
                    j->bucket, (long long)(e - a));
            float *p = j->be->host_ptr(j->ctx, j->off[i] + (a - at) * 4);
            int tag = j->bucket & 0x7fff, rc = MPI_SUCCESS;
            for (int q = 0; q < c->size; q++)
                if (r == c->rank && q != r)
                    rc |= MPI_Isend(p, (int)(e - a), MPI_FLOAT, q, tag, c->gc, &f->rqs[f->nrq++]);
            if (r != c->rank)
                rc |= MPI_Irecv(p, (int)(e - a), MPI_FLOAT, r, tag, c->gc, &f->rqs[f->nrq++]);
            if (rc != MPI_SUCCESS)
                rt_mpi_lost(c, what);
        }
        at += n;
    }
}

/* A reduce-scatter (mean) or all-gather bucket of ZeRO-1 (ir.h, AK_SHARD):
 * the bucket's tensors are one flat range; each rank's part of it lies in
 * that rank's shard. An all-gather, and a reduce-scatter of which this rank
 * receives nothing, stays in flight until poll_fly lands it; the other
 * reduce-scatters are waited for here. */
static void run_sharded(RtComm *c, Job *j, int64_t n, const char *what)
{
    int *counts = xmalloc(sizeof(int) * (size_t)c->size);
    int *displs = xmalloc(sizeof(int) * (size_t)c->size);
    int64_t lo = 0;
    shard_counts(c, j, n, counts, displs, &lo);
    int mine = counts[c->rank];
    Flying f = {.j = *j, .t0 = ir_now(), .deadline = ir_now() + c->timeout, .bytes = n * 4,
                .mine = mine, .settled = j->settled};
    if (j->coll == CG_COLL_REDUCE_SCATTER) {
        make_room(c, n * 4);
        c->staged += n * 4;
        f.buf = buf_take(c, n);
        f.lo = lo;
        /* the mean lands straight in the shard: the step reads this
         * bucket's part of it only after the wait */
        float *part = j->be->host_ptr(j->ctx, j->sh_off + lo * 4);
        int64_t at = 0;
        for (int i = 0; i < j->k; i++) {
            j->be->read(j->ctx, j->off[i], f.buf.p + at, j->bytes[i]);
            at += j->bytes[i] / 4;
        }
        /* MPI_Ireduce_scatter: on 2 ranks, what else was tried measured
         * worse in bench/zero_cpu.sh (median exposed ms per step, against
         * 0.46 and 0.50 for this): an in-place all-reduce of every bucket
         * that lies in one rank's shard 0.92, of those up to 512 KB 0.76;
         * a reduce to the owner (MPI_Ireduce) took 3 ms a bucket. */
        if (MPI_Ireduce_scatter(f.buf.p, part, counts, MPI_FLOAT, MPI_SUM, c->cc, &f.rq) !=
            MPI_SUCCESS)
            rt_mpi_lost(c, what);
        if (mine) { /* waited for here, before the thread runs later jobs */
            finish(c, f.rq, what);
            land(c, &f);
        } else { /* the gradients are staged: nothing to wait for */
            settle(c, j->bucket);
            f.settled = true;
            vec_push(&c->fly, f);
        }
    } else { /* this rank's part is in its params already (rt_comm_start) */
        f.rqs = xmalloc(sizeof(MPI_Request) * (size_t)((j->k + c->size) * c->size + 1));
        for (int r = 0; r < c->size; r++)
            gather_part(c, j, r, displs[r], displs[r] + counts[r], &f, what);
        vec_push(&c->fly, f);
    }
    free(counts);
    free(displs);
}

/* A bucket's requests have completed: a reduce-scatter's mean into this
 * rank's shard (an all-gather's data are in the params already); then
 * settled, if it was not yet. */
static void land(RtComm *c, Flying *f)
{
    if (f->j.coll == CG_COLL_REDUCE_SCATTER) {
        float s = 1.0f / (float)c->size;
        float *part = f->mine ? f->j.be->host_ptr(f->j.ctx, f->j.sh_off + f->lo * 4) : NULL;
        for (int64_t i = 0, m = f->mine; i < m; i++) /* locals: the loop vectorizes */
            part[i] *= s;
        c->staged -= f->bytes;
    }
    double t1 = ir_now();
    pthread_mutex_lock(&c->mu);
    c->comm_s += t1 - f->t0;
    RtCommEvent e = {f->j.bucket, f->bytes, f->t0, t1, (int)f->j.coll, 0};
    vec_push(&c->ev, e);
    if (!f->settled)
        settle_locked(c, f->j.bucket, t1);
    c->bucket_open[f->j.bucket]--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    free(f->rqs);
    buf_give(c, f->buf);
    free(f->j.off);
    free(f->j.bytes);
}

/* Lands the buckets in flight whose requests completed (in any order: each
 * has its own buffers); past its deadline one stops the job. */
static void poll_fly(RtComm *c)
{
    for (int i = 0; i < c->fly.n;) {
        Flying *f = &c->fly.v[i];
        const char *what = f->j.coll == CG_COLL_ALL_GATHER ? "an all-gather of updated params"
                                                           : "a reduce-scatter of gradients";
        int flag = 0;
        if ((f->rqs ? MPI_Testall(f->nrq, f->rqs, &flag, MPI_STATUSES_IGNORE)
                    : MPI_Test(&f->rq, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            rt_mpi_lost(c, what);
        if (!flag) {
            if (ir_now() > f->deadline)
                rt_mpi_lost(c, what);
            i++;
            continue;
        }
        land(c, f);
        /* in the order started: the next poll tests (and MPI progresses)
         * the gathers the next forward reads first, first */
        memmove(f, f + 1, sizeof *f * (size_t)(c->fly.n - i - 1));
        c->fly.n--;
    }
}

static void run_job(RtComm *c, Job *j)
{
    if (j->bucket == JOB_LOST)
        rt_mpi_lost(c, j->what);
    char what[64];
    double t0 = ir_now();
    int64_t bytes = 0;
    c->started++;
    if (j->bucket >= 0) {
        snprintf(what, sizeof what, "the %s of bucket %d",
                 j->coll == CG_COLL_REDUCE_SCATTER ? "reduce-scatter"
                 : j->coll == CG_COLL_ALL_GATHER   ? "all-gather"
                                                   : "all-reduce",
                 j->bucket);
        for (int i = 0; i < j->k; i++)
            bytes += j->bytes[i];
        int64_t n = bytes / 4;
        if (j->coll != CG_COLL_ALLREDUCE) { /* in flight: poll_fly lands it */
            run_sharded(c, j, n, what);
            return;
        }
        if (n > c->nstage) {
            free(c->stage);
            c->stage = xmalloc((size_t)n * sizeof(float));
            c->nstage = n;
        }
        int64_t at = 0;
        for (int i = 0; i < j->k; i++) {
            j->be->read(j->ctx, j->off[i], c->stage + at, j->bytes[i]);
            at += j->bytes[i] / 4;
        }
        allreduce(c, c->stage, n, MPI_FLOAT, what);
        float s = 1.0f / (float)c->size;
        for (int64_t i = 0; i < n; i++)
            c->stage[i] *= s;
        write_range(j, c->stage, 0, n);
    } else if (j->bucket == JOB_GATHER) {
        snprintf(what, sizeof what, "an all-gather of optimizer state");
        bytes = (int64_t)j->nbuf * 4 * c->size;
        MPI_Request rq;
        if (j->nbuf > 0x7fffffff || MPI_Iallgather(j->buf, (int)j->nbuf, MPI_FLOAT, j->host,
                                                    (int)j->nbuf, MPI_FLOAT, c->cc,
                                                    &rq) != MPI_SUCCESS)
            rt_mpi_lost(c, what);
        finish(c, rq, what);
    } else if (j->bucket == JOB_BCAST) {
        snprintf(what, sizeof what, "a broadcast from rank 0");
        bytes = (int64_t)j->nbuf;
        bcast(c, j->buf, j->nbuf, what);
    } else {
        snprintf(what, sizeof what, "a host all-reduce");
        bytes = (int64_t)j->nhost * 8;
        allreduce(c, j->host, j->nhost, MPI_DOUBLE, what);
        for (int i = 0; i < j->nhost; i++)
            j->host[i] /= c->size;
    }
    double t1 = ir_now();
    pthread_mutex_lock(&c->mu);
    c->comm_s += t1 - t0;
    RtCommEvent e = {j->bucket < 0 ? -1 : j->bucket, bytes, t0, t1,
                     j->bucket < 0 ? 0 : (int)j->coll, 0};
    vec_push(&c->ev, e);
    if (j->bucket >= 0) {
        settle_locked(c, j->bucket, t1);
        c->bucket_open[j->bucket]--;
    } else {
        *j->done = true;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    free(j->off);
    free(j->bytes);
}

/* Under mu: waits on cv for at most ns. */
static void timed_wait(RtComm *c, long ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ns;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

/* How often the thread polls the buckets in flight while no calling thread
 * waits: 200 us. A waiting caller wakes it (caller_wait), and it polls
 * every 20 us until the wait ends. Each poll wakes the thread on a core
 * the compute threads share, and polling every 20 us throughout the
 * gathers' flight (most of each zero=1 forward) slowed the rank that
 * receives the early gathers during its update: rank 1 waited for it at
 * the loss's mean every step (docs/distributed.md, "The idle polls"). */
enum { FLY_IDLE_NS = 200000 };

static void *comm_main(void *arg)
{
    RtComm *c = arg;
    /* The thread polls MPI with 20 us naps, and MPI progresses only in
     * those polls. With the kernel's default timer slack (50 us) a nap took
     * 105 us on the 2-core build machine, 58 us with 1 us of slack: each
     * round of a collective's protocol waits for a poll on both ranks. In
     * alternating runs of bench/zero_cpu.sh (docs/distributed.md, "The comm
     * thread's naps") the median exposed time per step at batch 4 went from
     * 0.86 to 0.52 ms (zero=0) and from 2.93 to 0.57 ms (zero=1). */
    prctl(PR_SET_TIMERSLACK, 1000UL);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->qhead == c->q.n && (!c->quit || c->fly.n)) {
            if (c->fly.n) { /* buckets in flight: poll them */
                pthread_mutex_unlock(&c->mu);
                poll_fly(c);
                answer_pings(c);
                pthread_mutex_lock(&c->mu);
                if (c->fly.n && c->qhead == c->q.n)
                    timed_wait(c, c->waiting ? 20000 : FLY_IDLE_NS);
                continue;
            }
            timed_wait(c, 20000000);
            pthread_mutex_unlock(&c->mu);
            answer_pings(c);
            pthread_mutex_lock(&c->mu);
        }
        if (c->qhead == c->q.n && c->quit)
            break;
        Job j = c->q.v[c->qhead++];
        if (c->qhead == c->q.n)
            c->qhead = c->q.n = 0;
        pthread_mutex_unlock(&c->mu);
        run_job(c, &j); /* the buckets in flight are polled when the queue is empty */
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Queues the held all-gathers, in the order they were started. Under mu. */
static void release_held(RtComm *c)
{
    if (c->held.n == 0)
        return;
    for (int i = 0; i < c->held.n; i++)
        vec_push(&c->q, c->held.v[i]);
    c->held.n = 0;
    pthread_cond_broadcast(&c->cv);
}

static void push_job(RtComm *c, Job j)
{
    pthread_mutex_lock(&c->mu);
    vec_push(&c->q, j);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Starts the communication thread COMM_NICE_GAP nice levels above the
 * calling thread, which runs the compute (and creates the pool's workers
 * later, which take its level). A collective advances only when the comm
 * thread polls, and when the compute threads fill every core a woken
 * thread of the same weight waits out the running one's time slice: on the
 * 2-core build machine, with two threads spinning, 1% of 20 us naps lasted
 * 1.3-1.9 ms and the longest 5 ms; with the sleeper 5 levels above them
 * the 99th percentile was 74-93 us. In bench/zero_cpu.sh at batch 1 (4
 * alternating pairs) the median exposed time per step fell from 2.69 to
 * 0.20 ms (zero=0) and from 2.87 to 1.36 ms (zero=1); docs/distributed.md,
 * "The comm thread's priority". Linux's nice is per thread and a new
 * thread takes its creator's: the caller raises itself, creates the
 * thread and steps back; where it may not raise itself (no CAP_SYS_NICE,
 * RLIMIT_NICE at 0: most users) it creates the thread and then lowers
 * itself instead. */
enum { COMM_NICE_GAP = 5 };

static void start_comm_thread(RtComm *c)
{
    errno = 0;
    int was = getpriority(PRIO_PROCESS, 0);
    bool known = errno == 0;
    if (known)
        (void)setpriority(PRIO_PROCESS, 0, was - COMM_NICE_GAP); /* refused: stays */
    int comm = known ? getpriority(PRIO_PROCESS, 0) : 0;
    if (pthread_create(&c->thr, NULL, comm_main, c) != 0)
        die("rt_comm_open: cannot start the communication thread");
    pthread_setname_np(c->thr, "kiln-comm");
    if (known) /* back where it was, or below: COMM_NICE_GAP under the comm thread */
        (void)setpriority(PRIO_PROCESS, 0, comm + COMM_NICE_GAP);
}

bool rt_comm_open(double timeout_s, RtComm **out, Diag *d)
{
    return rt_comm_open_tp(timeout_s, 1, out, d);
}

bool rt_comm_open_tp(double timeout_s, int tp, RtComm **out, Diag *d)
{
    return rt_comm_open_pp(timeout_s, tp, 1, out, d);
}

bool rt_comm_open_pp(double timeout_s, int tp, int pp, RtComm **out, Diag *d)
{
    *out = NULL;
    if (!getenv("OMPI_COMM_WORLD_SIZE"))
        return true;
    int prov = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov) != MPI_SUCCESS) {
        snprintf(d->msg, sizeof d->msg, "kiln: MPI failed to start");
        return false;
    }
    if (prov < MPI_THREAD_MULTIPLE) {
        snprintf(d->msg, sizeof d->msg,
                 "kiln: the MPI library does not support threads (expected "
                 "MPI_THREAD_MULTIPLE, got level %d)", prov);
        MPI_Finalize();
        return false;
    }
    RtComm *c = xcalloc(1, sizeof *c);
    c->timeout = timeout_s > 0 ? timeout_s : 60;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->wsize);
    if (pp > 1 && (c->wsize % (tp * pp) != 0)) {
        snprintf(d->msg, sizeof d->msg,
                 "--pp %d%s does not divide the %d ranks (expected --nproc a multiple of "
                 "tp x pp = %d: ranks = tp x pp x dp)", pp, tp > 1 ? " with --tp" : "",
                 c->wsize, tp * pp);
        free(c);
        MPI_Finalize();
        return false;
    }
    if (tp < 1 || c->wsize % tp != 0) {
        snprintf(d->msg, sizeof d->msg,
                 "--tp %d does not divide the %d ranks (expected --nproc a multiple of tp: "
                 "ranks = tp x dp)", tp, c->wsize);
        free(c);
        MPI_Finalize();
        return false;
    }
    /* ranks = tp x dp, TP innermost: world rank w is TP rank w % tp of dp
     * group w / tp; the dp group of TP rank t is every tp-th rank from t */
    /* with pp > 1: ranks = tp x dp x pp, TP innermost, then DP, then PP
     * (kiln plan's order, Megatron-LM's): w is TP rank w % tp of dp rank
     * (w / tp) % dp in stage w / (tp dp); the dp group holds the ranks of
     * one TP rank and stage */
    c->tp = tp;
    c->tp_rank = c->wrank % tp;
    c->pp = pp > 1 ? pp : 1;
    c->size = c->wsize / (tp * c->pp);
    c->pp_stage = c->wrank / (tp * c->size);
    c->rank = (c->wrank / tp) % c->size;
    int dp_color = c->tp_rank + tp * c->pp_stage;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    c->local_size = ls && atoi(ls) > 0 ? atoi(ls) : 1;
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    c->local_rank = lr && atoi(lr) > 0 ? atoi(lr) : 0;
    MPI_Comm_split(MPI_COMM_WORLD, dp_color, c->wrank, &c->cc);
    MPI_Comm_dup(MPI_COMM_WORLD, &c->pc);
    MPI_Comm_split(MPI_COMM_WORLD, dp_color, c->wrank, &c->gc);
    c->tpc = MPI_COMM_NULL;
    if (tp > 1) {
        MPI_Comm_split(MPI_COMM_WORLD, c->wrank / tp, c->wrank, &c->tpc);
        MPI_Comm_set_errhandler(c->tpc, MPI_ERRORS_RETURN);
    }
    c->ppc = MPI_COMM_NULL;
    if (c->pp > 1) {
        MPI_Comm_split(MPI_COMM_WORLD, c->tp_rank + tp * c->rank, c->pp_stage, &c->ppc);
        MPI_Comm_set_errhandler(c->ppc, MPI_ERRORS_RETURN);
    }
    MPI_Comm_set_errhandler(c->cc, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(c->pc, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(c->gc, MPI_ERRORS_RETURN);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    start_comm_thread(c);
    *out = c;
    return true;
}

void rt_comm_close(RtComm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    release_held(c);
    c->quit = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thr, NULL);
    /* every rank reaches here: a last collective so no rank leaves while
     * another still needs it */
    double one = 1;
    allreduce(c, &one, 1, MPI_DOUBLE, "the closing all-reduce");
    MPI_Comm_free(&c->cc);
    MPI_Comm_free(&c->pc);
    MPI_Comm_free(&c->gc);
    if (c->tpc != MPI_COMM_NULL)
        MPI_Comm_free(&c->tpc);
    if (c->ppc != MPI_COMM_NULL)
        MPI_Comm_free(&c->ppc);
    for (int h = 0; h < c->tp_fly.n; h++) {
        free(c->tp_fly.v[h].in);
        free(c->tp_fly.v[h].out);
    }
    vec_free(&c->tp_fly);
    vec_free(&c->tp_ev);
    free(c->tp_ev_copy);
    MPI_Finalize();
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    vec_free(&c->q);
    vec_free(&c->ev);
    free(c->ev_copy);
    free(c->bucket_busy);
    free(c->bucket_done);
    free(c->bucket_coll);
    free(c->bucket_open);
    vec_free(&c->held);
    free(c->stage);
    vec_free(&c->fly);
    for (int i = 0; i < c->spare.n; i++)
        free(c->spare.v[i].p);
    vec_free(&c->spare);
    free(c);
}

int rt_comm_rank(const RtComm *c) { return c ? c->rank : 0; }
int rt_comm_world_rank(const RtComm *c) { return c ? c->wrank : 0; }
int rt_comm_world_size(const RtComm *c) { return c ? c->wsize : 1; }
int rt_comm_tp(const RtComm *c) { return c ? c->tp : 1; }
int rt_comm_tp_rank(const RtComm *c) { return c ? c->tp_rank : 0; }

/* Under mu: the calling thread waits on cv. The first waiter wakes the
 * comm thread, which polls the buckets in flight often while one waits. */
static void caller_wait(RtComm *c)
{
    if (c->waiting++ == 0)
        pthread_cond_broadcast(&c->cv);
    pthread_cond_wait(&c->cv, &c->mu);
    c->waiting--;
}

void rt_comm_start(RtComm *c, const CgPlan *p, int s, const Backend *be, BackendCtx *ctx)
{
    if (!c || c->size == 1)
        return;
    const CgStep *st = &p->steps.v[s];
    if (st->kind != CG_STEP_ALLREDUCE_START)
        die("rt_comm_start: plan step %d is not an allreduce start", s);
    Job j = {.bucket = st->bucket, .k = st->nargs, .be = be, .ctx = ctx, .coll = st->coll};
    j.off = xmalloc(sizeof(int64_t) * (size_t)st->nargs);
    j.bytes = xmalloc(sizeof(int64_t) * (size_t)st->nargs);
    int64_t n = 0;
    for (int i = 0; i < st->nargs; i++) {
        const Tensor *t = &p->g->t.v[st->args[i]];
        if (t->s.dtype != DT_F32)
            die("rt_comm_start: bucket %d holds a %s tensor (only f32 is reduced on the CPU)",
                st->bucket, dtype_name(t->s.dtype));
        j.off[i] = cg_offset(p, st->args[i]);
        j.bytes[i] = shape_numel(&t->s) * 4;
        n += shape_numel(&t->s);
    }
    if (st->coll != CG_COLL_ALLREDUCE) {
        if (st->sh_nranks != c->size)
            die("rt_comm_start: step %d is sharded over %d ranks, the run has %d", s,
                st->sh_nranks, c->size);
        j.sh_start = st->sh_start;
        j.sh_total = st->sh_total;
        j.sh_off = cg_offset(p, st->sh_buf);
    }
    pthread_mutex_lock(&c->mu);
    if (st->bucket >= c->nbuckets) {
        int nb = st->bucket + 1;
        c->bucket_busy = xrealloc(c->bucket_busy, sizeof(int) * (size_t)nb);
        c->bucket_done = xrealloc(c->bucket_done, sizeof(double) * (size_t)nb);
        c->bucket_coll = xrealloc(c->bucket_coll, sizeof(int) * (size_t)nb);
        c->bucket_open = xrealloc(c->bucket_open, sizeof(int) * (size_t)nb);
        for (int b = c->nbuckets; b < nb; b++)
            c->bucket_busy[b] = c->bucket_coll[b] = c->bucket_open[b] = 0, c->bucket_done[b] = 0;
        c->nbuckets = nb;
    }
    if (st->coll != CG_COLL_ALLREDUCE && !be->host_ptr)
        die("rt_comm_start: the %s of bucket %d needs a host backend's arena",
            st->coll == CG_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter", st->bucket);
    if (st->coll == CG_COLL_ALL_GATHER) {
        /* this rank's part of the new params goes into the params here, on
         * the calling thread, which would otherwise wait for the comm
         * thread to come to it (a bucket that lies in this rank's shard is
         * then never busy here: docs/distributed.md, "Settling a bucket
         * early"); the sends go from there. The last gather of the bucket
         * finished sending from these bytes long before (the other ranks'
         * forward read them since), but it is waited for. */
        while (c->bucket_open[st->bucket] > 0) {
            release_held(c); /* it cannot finish held (the gathers match among themselves) */
            caller_wait(c);
        }
        pthread_mutex_unlock(&c->mu);
        int64_t lo = 0;
        int *counts = xmalloc(sizeof(int) * (size_t)c->size);
        int *displs = xmalloc(sizeof(int) * (size_t)c->size);
        shard_counts(c, &j, n, counts, displs, &lo);
        int mine = counts[c->rank];
        if (mine)
            write_range(&j, be->host_ptr(ctx, j.sh_off + lo * 4), displs[c->rank],
                        displs[c->rank] + mine);
        j.settled = mine == n;
        free(counts);
        free(displs);
        pthread_mutex_lock(&c->mu);
    }
    if (!j.settled)
        c->bucket_busy[st->bucket]++;
    c->bucket_open[st->bucket]++;
    c->bucket_coll[st->bucket] = (int)st->coll;
    if (st->coll == CG_COLL_ALL_GATHER) { /* held until the next call (top of file) */
        vec_push(&c->held, j);
    } else {
        release_held(c);
        vec_push(&c->q, j);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_wait(RtComm *c, int bucket)
{
    if (!c || c->size == 1)
        return;
    double t0 = ir_now();
    bool waited = false;
    pthread_mutex_lock(&c->mu);
    release_held(c);
    while (bucket < c->nbuckets && c->bucket_busy[bucket] > 0) {
        waited = true;
        caller_wait(c);
    }
    if (waited) {
        double dt = ir_now() - t0;
        c->exposed_s += dt;
        c->exposed_by[c->bucket_coll[bucket]] += dt;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Queues host job j ahead of the held all-gathers and waits for j; they
 * stay held until the caller's next call (the next step's
 * rt_comm_stats_reset, a start, a wait). Released with j, the comm threads
 * started them and copied their data on every core while j's callers
 * waited to be woken: the loss's mean took 2.96 ms a step in the median
 * (0.27 with zero=0; docs/distributed.md, "The held gathers after the
 * step's mean"). Until the bucket collectives already queued, running or in
 * flight when j was queued have all finished (zero=1's all-gathers outlive
 * the step), the time j takes is exposed time of those buckets: the
 * calling thread waits for them as it would in rt_comm_wait (MPI completes
 * j after the data queued before it). Counted under the all-gathers' kind
 * when one of them is among those buckets. With step_sync (the mean that
 * ends every training step) the rest of the wait is exposed time too,
 * under the all-reduces': the compute thread waits for it every step, for
 * the slower rank and for whatever the comm thread runs first. */
static void host_job(RtComm *c, Job j, bool step_sync)
{
    bool done = false;
    double t0 = ir_now();
    j.done = &done;
    pthread_mutex_lock(&c->mu);
    int *held = xcalloc((size_t)c->nbuckets + 1, sizeof(int)); /* per bucket */
    for (int i = 0; i < c->held.n; i++)
        held[c->held.v[i].bucket]++;
    VEC(int) ahead = {0}; /* the busy buckets that j queues behind */
    int kind = -1;
    for (int b = 0; b < c->nbuckets; b++)
        if (c->bucket_busy[b] > held[b]) {
            vec_push(&ahead, b);
            if (kind < 0 || c->bucket_coll[b] == CG_COLL_ALL_GATHER)
                kind = c->bucket_coll[b];
        }
    vec_push(&c->q, j);
    pthread_cond_broadcast(&c->cv);
    while (!done)
        caller_wait(c);
    double t1 = ir_now(), end = t0;
    for (int i = 0; i < ahead.n; i++) { /* the released ones of b run after j */
        int b = ahead.v[i];
        double e = c->bucket_busy[b] > held[b] ? t1 : c->bucket_done[b];
        end = e > end ? e : end;
    }
    free(held);
    end = end < t1 ? end : t1;
    if (kind >= 0 && end > t0) {
        c->exposed_s += end - t0;
        c->exposed_by[kind] += end - t0;
    } else
        end = t0;
    if (step_sync && t1 > end) {
        c->exposed_s += t1 - end;
        c->exposed_by[CG_COLL_ALLREDUCE] += t1 - end;
    }
    vec_free(&ahead);
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_mean(RtComm *c, double *v, int n)
{
    if (!c || c->size == 1)
        return;
    host_job(c, (Job){.bucket = -1, .host = v, .nhost = n}, false);
}

void rt_comm_step_mean(RtComm *c, double *v, int n)
{
    if (!c || c->size == 1)
        return;
    host_job(c, (Job){.bucket = -1, .host = v, .nhost = n}, true);
}

void rt_comm_allgather(RtComm *c, const float *mine, int64_t n, float *all)
{
    if (!c || c->size == 1) {
        memcpy(all, mine, sizeof(float) * (size_t)n);
        return;
    }
    /* host: the receive buffer (floats, not doubles: JOB_GATHER's own use) */
    host_job(c, (Job){.bucket = JOB_GATHER, .buf = (void *)mine, .nbuf = (size_t)n,
                      .host = (double *)(void *)all},
             false);
}

void rt_comm_bcast(RtComm *c, void *buf, size_t n)
{
    if (!c || c->size == 1 || n == 0)
        return;
    host_job(c, (Job){.bucket = JOB_BCAST, .buf = buf, .nbuf = n}, false);
}

double rt_comm_timeout(const RtComm *c) { return c ? c->timeout : 0; }

/* rt_mpi_lost() runs on the communication thread, the only one that answers pings
 * (two threads probing for the same ping could block each other). */
void rt_comm_lost(RtComm *c, const char *what)
{
    if (!c) {
        fprintf(stderr, "kiln: %s did not finish in time; stopping\n", what);
        _exit(1);
    }
    push_job(c, (Job){.bucket = JOB_LOST, .what = xstrdup(what)});
    /* the thread is stuck in a collective of its own: it stops the job
     * itself within its timeout; this is the last resort */
    double t0 = ir_now();
    while (ir_now() - t0 < c->timeout + 10)
        rt_mpi_nap(10000000);
    fprintf(stderr,
            "kiln: rank %d: %s did not finish within %g s (comm_timeout); stopping every "
            "rank\n",
            c->rank, what, c->timeout);
    fflush(stderr);
    rt_rank_status("lost ?");
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

void rt_comm_set_source(RtComm *c, void (*pull)(void *arg, RtComm *c), void *arg)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (pull || c->pull_arg == arg) {
        c->pull = pull;
        c->pull_arg = pull ? arg : NULL;
    }
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_add_events(RtComm *c, const RtCommEvent *ev, int n, double exposed_s)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n; i++) {
        vec_push(&c->ev, ev[i]);
        c->comm_s += ev[i].end - ev[i].start;
        if (ev[i].coll >= 0 && ev[i].coll < 3)
            c->exposed_by[ev[i].coll] += ev[i].exposed;
    }
    c->exposed_s += exposed_s;
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_stats(RtComm *c, RtCommStats *st)
{
    memset(st, 0, sizeof *st);
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    void (*pull)(void *, RtComm *) = c->pull;
    void *arg = c->pull_arg;
    pthread_mutex_unlock(&c->mu);
    if (pull)
        pull(arg, c);
    pthread_mutex_lock(&c->mu);
    st->comm_s = c->comm_s;
    st->exposed_s = c->exposed_s;
    memcpy(st->exposed_by, c->exposed_by, sizeof st->exposed_by);
    free(c->ev_copy);
    c->ev_copy = xmalloc(sizeof(RtCommEvent) * (size_t)(c->ev.n + 1));
    if (c->ev.n)
        memcpy(c->ev_copy, c->ev.v, sizeof(RtCommEvent) * (size_t)c->ev.n);
    st->nev = c->ev.n;
    st->ev = c->ev_copy;
    c->ev_taken = c->ev.n;
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_stats_reset(RtComm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->comm_s = c->exposed_s = 0;
    memset(c->exposed_by, 0, sizeof c->exposed_by);
    /* buckets that landed after the last rt_comm_stats (all-gathers outlive
     * their step; so may a reduce-scatter settled before MPI finished it)
     * are in no figures yet: they stay, for the next ones */
    int k = 0;
    for (int i = c->ev_taken < c->ev.n ? c->ev_taken : c->ev.n; i < c->ev.n; i++)
        if (c->ev.v[i].bucket >= 0) {
            c->ev.v[k++] = c->ev.v[i];
            c->comm_s += c->ev.v[i].end - c->ev.v[i].start;
        }
    c->ev.n = k;
    c->ev_taken = 0;
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_release(RtComm *c)
{
    if (!c || c->size == 1)
        return;
    pthread_mutex_lock(&c->mu);
    release_held(c);
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_wait_done(RtComm *c, int bucket)
{
    if (!c || c->size == 1)
        return;
    pthread_mutex_lock(&c->mu);
    release_held(c);
    while (bucket < c->nbuckets && c->bucket_open[bucket] > 0)
        caller_wait(c);
    pthread_mutex_unlock(&c->mu);
}

void rt_comm_drain(RtComm *c)
{
    if (!c || c->size == 1)
        return;
    pthread_mutex_lock(&c->mu);
    release_held(c);
    for (int b = 0; b < c->nbuckets; b++) /* settled or not */
        while (c->bucket_open[b] > 0)
            caller_wait(c);
    pthread_mutex_unlock(&c->mu);
}
