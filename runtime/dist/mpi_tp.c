/* mpi_tp.c - the tensor-parallel collectives between CPU ranks (dist.h,
 * rt_comm_tp_*), on the TP group's own communicator; the communicator's
 * state and the shared helpers: mpi_internal.h. */
#include "codegen.h"
#include "mpi_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- tensor-parallel collectives: on the calling thread ----------------
 * (the TP group's own communicator; MPI_THREAD_MULTIPLE lets them run
 * beside the communication thread's dp buckets). rt_comm_tp_start posts a
 * non-blocking collective and returns; the caller polls it between its
 * steps (rt_comm_tp_poll: MPI progresses it only inside MPI calls) and waits
 * for it before the first reader of its result (rt_comm_tp_wait). Every TP
 * rank starts the same collectives in the same order (program order), as
 * MPI requires of non-blocking collectives on one communicator. The
 * operand is copied into the collective's own buffer at the start, so its
 * memory may be reused at once; the result's is written until the wait.
 * A peer that does not join within the timeout stops the job as a lost
 * rank does. */


static float *fly_buf(float **p, int64_t *cap, int64_t n)
{
    if (n > *cap) {
        free(*p);
        *cap = n;
        *p = xmalloc(sizeof(float) * (size_t)n);
    }
    return *p;
}

/* Completes slot f's collective once its request is done: the gather's
 * transpose, the statistics. */
static void tp_land(RtComm *c, RtTpFly *f, double t1)
{
    f->done = true;
    f->t1 = t1;
    int n = c->tp;
    if (f->coll == 2 && f->outer > 1) /* [rank][outer][chunk] -> [outer][rank][chunk] */
        for (int r = 0; r < n; r++)
            for (int64_t o = 0; o < f->outer; o++)
                memcpy(f->y + (o * n + r) * f->chunk, f->out + ((int64_t)r * f->outer + o) * f->chunk,
                       sizeof(float) * (size_t)f->chunk);
    c->tp_s += t1 - f->t0;
    c->tp_n++;
    c->tp_bytes += f->bytes;
    RtCommEvent ev = {0};
    ev.bucket = -1;
    ev.coll = f->coll;
    ev.start = f->t0;
    ev.end = t1;
    vec_push(&c->tp_ev, ev);
}

static bool tp_test(RtComm *c, RtTpFly *f)
{
    if (!f->done) {
        int flag = 0;
        MPI_Test(&f->rq, &flag, MPI_STATUS_IGNORE);
        if (flag)
            tp_land(c, f, ir_now());
        else if (ir_now() > f->deadline)
            rt_mpi_lost(c, f->what);
    }
    return f->done;
}

int rt_comm_tp_start(RtComm *c, int coll, const float *x, int64_t outer, int64_t chunk,
                     float *y)
{
    int n = c ? c->tp : 1;
    int64_t whole = (int64_t)n * outer * chunk; /* a gather's result, a reduce-scatter's operand */
    if (n <= 1) {
        if (x != y)
            memmove(y, x, sizeof(float) * (size_t)(outer * chunk));
        return -1;
    }
    int h = 0;
    while (h < c->tp_fly.n && c->tp_fly.v[h].busy)
        h++;
    if (h == c->tp_fly.n) {
        RtTpFly z = {0};
        vec_push(&c->tp_fly, z);
    }
    RtTpFly *f = &c->tp_fly.v[h];
    f->busy = true;
    f->done = false;
    f->coll = coll;
    f->y = y;
    f->outer = outer;
    f->chunk = chunk;
    f->t0 = ir_now();
    f->deadline = f->t0 + c->timeout;
    int rc;
    MPI_Request rq = MPI_REQUEST_NULL;
    if (coll == 0) { /* all-reduce in place in y: chunk elements */
        if (x != y)
            memmove(y, x, sizeof(float) * (size_t)chunk);
        f->what = "a tensor-parallel all-reduce";
        f->bytes = 4 * chunk;
        rc = MPI_Iallreduce(MPI_IN_PLACE, y, (int)chunk, MPI_FLOAT, MPI_SUM, c->tpc, &rq);
    } else if (coll == 2) { /* x: [outer][chunk] -> y: [outer][rank][chunk] */
        float *in = fly_buf(&f->in, &f->in_cap, outer * chunk);
        memcpy(in, x, sizeof(float) * (size_t)(outer * chunk));
        float *all = outer == 1 ? y : fly_buf(&f->out, &f->out_cap, whole);
        f->what = "a tensor-parallel all-gather";
        f->bytes = 4 * whole;
        rc = MPI_Iallgather(in, (int)(outer * chunk), MPI_FLOAT, all, (int)(outer * chunk),
                            MPI_FLOAT, c->tpc, &rq);
    } else { /* x: [outer][rank][chunk] -> y: [outer][chunk], summed */
        float *in = fly_buf(&f->in, &f->in_cap, whole);
        for (int r = 0; r < n; r++) /* as [rank][outer][chunk] */
            for (int64_t o = 0; o < outer; o++)
                memcpy(in + ((int64_t)r * outer + o) * chunk, x + (o * n + r) * chunk,
                       sizeof(float) * (size_t)chunk);
        f->what = "a tensor-parallel reduce-scatter";
        f->bytes = 4 * whole;
        rc = MPI_Ireduce_scatter_block(in, y, (int)(outer * chunk), MPI_FLOAT, MPI_SUM, c->tpc,
                                       &rq);
    }
    if (rc != MPI_SUCCESS)
        rt_mpi_lost(c, f->what);
    f->rq = rq;
    return h;
}

void rt_comm_tp_poll(RtComm *c)
{
    if (!c)
        return;
    for (int h = 0; h < c->tp_fly.n; h++)
        if (c->tp_fly.v[h].busy)
            tp_test(c, &c->tp_fly.v[h]);
}

void rt_comm_tp_wait(RtComm *c, int h)
{
    if (!c || h < 0)
        return;
    if (h >= c->tp_fly.n || !c->tp_fly.v[h].busy)
        die("rt_comm_tp_wait: %d is not a collective in flight", h);
    RtTpFly *f = &c->tp_fly.v[h];
    double t0 = ir_now();
    for (int spins = 0; !tp_test(c, f); spins++) {
        if (spins > 2000)
            rt_mpi_nap(20000);
        else
            sched_yield();
    }
    c->tp_exposed_s += ir_now() - t0;
    f->busy = false;
}

void rt_comm_tp_allreduce(RtComm *c, float *x, int64_t n)
{
    rt_comm_tp_wait(c, rt_comm_tp_start(c, 0, x, 1, n, x));
}

void rt_comm_tp_all_gather(RtComm *c, const float *x, int64_t outer, int64_t chunk, float *out)
{
    rt_comm_tp_wait(c, rt_comm_tp_start(c, 2, x, outer, chunk, out));
}

void rt_comm_tp_reduce_scatter(RtComm *c, const float *x, int64_t outer, int64_t chunk,
                               float *out)
{
    rt_comm_tp_wait(c, rt_comm_tp_start(c, 1, x, outer, chunk, out));
}

void rt_comm_tp_stats(RtComm *c, RtTpStats *st)
{
    memset(st, 0, sizeof *st);
    if (!c)
        return;
    for (int i = 0; i < c->ntp_src; i++)
        c->tp_src[i].pull(c->tp_src[i].arg, c);
    st->s = c->tp_s;
    st->exposed_s = c->tp_exposed_s;
    st->n = c->tp_n;
    st->bytes = c->tp_bytes;
    free(c->tp_ev_copy);
    c->tp_ev_copy = c->tp_ev.v;
    st->ev = c->tp_ev.v;
    st->nev = c->tp_ev.n;
    c->tp_ev.v = NULL;
    c->tp_ev.n = c->tp_ev.cap = 0;
    c->tp_s = 0;
    c->tp_exposed_s = 0;
    c->tp_n = 0;
    c->tp_bytes = 0;
}

void rt_comm_tp_bcast(RtComm *c, void *buf, size_t n)
{
    if (!c || c->tp <= 1 || n == 0)
        return;
    MPI_Request rq;
    int rc = MPI_Ibcast(buf, (int)n, MPI_BYTE, 0, c->tpc, &rq);
    if (rc != MPI_SUCCESS)
        rt_mpi_lost(c, "the TP group's broadcast of the NCCL id");
    double deadline = ir_now() + c->timeout;
    for (int spins = 0;; spins++) {
        int flag = 0;
        MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
        if (flag)
            return;
        if (spins > 2000) {
            if (ir_now() > deadline)
                rt_mpi_lost(c, "the TP group's broadcast of the NCCL id");
            rt_mpi_nap(20000);
        } else {
            sched_yield();
        }
    }
}

void rt_comm_tp_source(RtComm *c, void (*pull)(void *arg, RtComm *c), void *arg)
{
    if (!c)
        return;
    if (!pull) {
        int k = 0;
        for (int i = 0; i < c->ntp_src; i++)
            if (c->tp_src[i].arg != arg)
                c->tp_src[k++] = c->tp_src[i];
        c->ntp_src = k;
        return;
    }
    if (c->ntp_src < (int)(sizeof c->tp_src / sizeof c->tp_src[0])) {
        c->tp_src[c->ntp_src].pull = pull;
        c->tp_src[c->ntp_src++].arg = arg;
    }
}

void rt_comm_tp_add_events(RtComm *c, const RtCommEvent *ev, int n)
{
    if (!c)
        return;
    for (int i = 0; i < n; i++) {
        c->tp_s += ev[i].end - ev[i].start;
        c->tp_exposed_s += ev[i].exposed; /* the compute stream stood at its wait */
        c->tp_n++;
        c->tp_bytes += ev[i].bytes;
        vec_push(&c->tp_ev, ev[i]);
    }
}
int rt_comm_size(const RtComm *c) { return c ? c->size : 1; }
int rt_comm_local_size(const RtComm *c) { return c ? c->local_size : 1; }
int rt_comm_local_rank(const RtComm *c) { return c ? c->local_rank : 0; }
