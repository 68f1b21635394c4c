/* mpi_pp.c - pipeline stages between CPU ranks (dist.h, rt_comm_pp_* and
 * the dp group's sums under pp): point to point on the pipeline's
 * communicator and its group collectives, each polled on the calling
 * thread with the comm timeout; the communicator's state and the shared
 * helpers: mpi_internal.h. */
#include "codegen.h"
#include "mpi_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- pipeline stages (pp.c): point to point and the pipeline's group ---- */

int rt_comm_pp(const RtComm *c) { return c ? c->pp : 1; }
int rt_comm_pp_stage(const RtComm *c) { return c ? c->pp_stage : 0; }

/* Waits for rq on the calling thread, polling with the comm timeout. */
static void pp_finish(RtComm *c, MPI_Request *rq, const char *what)
{
    double deadline = ir_now() + c->timeout;
    for (int spins = 0;; spins++) {
        int flag = 0;
        if (MPI_Test(rq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            rt_mpi_lost(c, what);
        if (flag)
            return;
        if ((spins & 63) == 63 && ir_now() > deadline)
            rt_mpi_lost(c, what);
        if (spins > 64)
            rt_mpi_nap(20000);
    }
}

/* A send of n bytes in mpi_chunk pieces (at least one, empty for n = 0):
 * the receive takes the same pieces, which MPI matches in order (one
 * source, tag and communicator). */
typedef struct {
    int n;
    MPI_Request rq[];
} PpSend;

static int pieces(size_t n)
{
    size_t k = (size_t)rt_mpi_chunk();
    return n == 0 ? 1 : (int)((n + k - 1) / k);
}

void *rt_comm_pp_isend(RtComm *c, int to, int tag, const void *buf, size_t n)
{
    size_t k = (size_t)rt_mpi_chunk();
    PpSend *ps = xmalloc(sizeof *ps + sizeof(MPI_Request) * (size_t)pieces(n));
    ps->n = pieces(n);
    for (int i = 0; i < ps->n; i++) {
        size_t a = (size_t)i * k;
        if (MPI_Isend((const char *)buf + a, (int)(n - a < k ? n - a : k), MPI_BYTE, to, tag,
                      c->ppc, &ps->rq[i]) != MPI_SUCCESS)
            rt_mpi_lost(c, "a pipeline send");
    }
    return ps;
}

void rt_comm_pp_wait(RtComm *c, void *req)
{
    PpSend *ps = req;
    for (int i = 0; i < ps->n; i++)
        pp_finish(c, &ps->rq[i], "a pipeline send");
    free(ps);
}

void rt_comm_pp_recv(RtComm *c, int from, int tag, void *buf, size_t n)
{
    size_t k = (size_t)rt_mpi_chunk();
    for (int i = 0, np = pieces(n); i < np; i++) {
        size_t a = (size_t)i * k;
        MPI_Request rq;
        if (MPI_Irecv((char *)buf + a, (int)(n - a < k ? n - a : k), MPI_BYTE, from, tag,
                      c->ppc, &rq) != MPI_SUCCESS)
            rt_mpi_lost(c, "a pipeline receive");
        pp_finish(c, &rq, "a pipeline receive");
    }
}

/* An all-reduce (sum) of n elements of dt in place over comm, in
 * mpi_chunk pieces. */
static void pp_coll(RtComm *c, MPI_Comm comm, void *buf, int64_t n, MPI_Datatype dt,
                    const char *what)
{
    int sz = 0;
    MPI_Type_size(dt, &sz);
    int64_t k = rt_mpi_chunk();
    for (int64_t a = 0; a == 0 || a < n; a += k) {
        MPI_Request rq;
        int len = (int)(n - a < k ? n - a : k);
        if (MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + a * sz, len, dt, MPI_SUM, comm, &rq) !=
            MPI_SUCCESS)
            rt_mpi_lost(c, what);
        pp_finish(c, &rq, what);
    }
}

void rt_comm_pp_sum(RtComm *c, double *x, int n)
{
    if (c && c->pp > 1)
        pp_coll(c, c->ppc, x, n, MPI_DOUBLE, "a pipeline all-reduce");
}

void rt_comm_pp_sum_f32(RtComm *c, const int *stages, int nst, float *x, int64_t n)
{
    if (!c || c->pp <= 1 || nst < 2)
        return;
    MPI_Group all, sub;
    MPI_Comm sc;
    MPI_Comm_group(c->ppc, &all);
    MPI_Group_incl(all, nst, stages, &sub);
    MPI_Comm_create_group(c->ppc, sub, 0, &sc);
    pp_coll(c, sc, x, n, MPI_FLOAT, "the all-reduce of a tied param's gradient");
    MPI_Comm_free(&sc);
    MPI_Group_free(&sub);
    MPI_Group_free(&all);
}

void rt_comm_dp_sum_f32(RtComm *c, float *x, int64_t n)
{
    if (c && c->size > 1)
        pp_coll(c, c->cc, x, n, MPI_FLOAT, "a data-parallel gradient all-reduce");
}

void rt_comm_dp_reduce_scatter_f32(RtComm *c, const float *x, int64_t total, float *shard)
{
    int n = c ? c->size : 1, me = c ? c->rank : 0;
    int64_t off, len;
    ir_shard_range(total, n, me, &off, &len);
    if (n == 1) {
        memcpy(shard, x, sizeof(float) * (size_t)len);
        return;
    }
    /* in rounds of at most mpi_chunk elements per rank: round j
     * reduce-scatters every rank's j-th piece of its part, gathered into
     * one buffer (x itself when one round takes every part whole) */
    int64_t k = rt_mpi_chunk(), most = 0;
    int64_t *o = xmalloc(sizeof(int64_t) * (size_t)n), *l = xmalloc(sizeof(int64_t) * (size_t)n);
    for (int r = 0; r < n; r++) {
        ir_shard_range(total, n, r, &o[r], &l[r]);
        most = l[r] > most ? l[r] : most;
    }
    int *counts = xmalloc(sizeof(int) * (size_t)n);
    float *tmp = most > k ? xmalloc(sizeof(float) * (size_t)(k * n)) : NULL;
    for (int64_t j = 0; j == 0 || j < most; j += k) {
        int64_t at = 0;
        for (int r = 0; r < n; r++) {
            int64_t part = l[r] - j < k ? l[r] - j : k;
            counts[r] = (int)(part > 0 ? part : 0);
            if (tmp && counts[r] > 0)
                memcpy(tmp + at, x + o[r] + j, sizeof(float) * (size_t)counts[r]);
            at += counts[r];
        }
        MPI_Request rq;
        if (MPI_Ireduce_scatter(tmp ? tmp : x, shard + j, counts, MPI_FLOAT, MPI_SUM, c->cc,
                                &rq) != MPI_SUCCESS)
            rt_mpi_lost(c, "a data-parallel gradient reduce-scatter");
        pp_finish(c, &rq, "a data-parallel gradient reduce-scatter");
    }
    free(tmp);
    free(counts);
    free(o);
    free(l);
}

void rt_comm_pp_bcast(RtComm *c, int root, void *buf, size_t n)
{
    if (!c || c->pp <= 1)
        return;
    size_t k = (size_t)rt_mpi_chunk();
    for (size_t a = 0; a == 0 || a < n; a += k) {
        MPI_Request rq;
        int len = (int)(n - a < k ? n - a : k);
        if (MPI_Ibcast((char *)buf + a, len, MPI_BYTE, root, c->ppc, &rq) != MPI_SUCCESS)
            rt_mpi_lost(c, "a pipeline broadcast");
        pp_finish(c, &rq, "a pipeline broadcast");
    }
}
