/* mpi_internal.h - what the MPI files of runtime/dist share (mpi.c: the
 * ranks, the communication thread and the data-parallel collectives;
 * mpi_tp.c: the tensor-parallel collectives; mpi_pp.c: the pipeline's
 * point to point and group collectives): the communicator's state and
 * three helpers. Internal to those files; dist.h is the layer's contract. */
#ifndef KILN_MPI_INTERNAL_H
#define KILN_MPI_INTERNAL_H

#include "dist.h"

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>

enum { TAG_PING = 101, TAG_PONG = 102 };

/* Job.bucket of a non-bucket job; JOB_LOST: a device collective timed out */
enum { JOB_HOST = -1, JOB_BCAST = -2, JOB_LOST = -3, JOB_GATHER = -4 };

/* A float buffer of a bucket job and its capacity (buf_take). */
typedef struct {
    float *p;
    int64_t cap;
} Buf;

typedef struct {
    int bucket;               /* JOB_HOST: host doubles; JOB_BCAST: bytes from rank 0 */
    int k;
    int64_t *off, *bytes;     /* bucket: arena regions */
    const Backend *be;
    BackendCtx *ctx;
    double *host;             /* host collective */
    int nhost;
    void *buf;                /* bcast */
    size_t nbuf;
    bool *done;               /* host collective, bcast: set when finished */
    const char *what;         /* JOB_LOST: the collective */
    CgColl coll;              /* bucket: all-reduce, reduce-scatter or all-gather */
    int64_t sh_start, sh_total, sh_off; /* sharded: flat range start, total, shard offset */
    bool settled;             /* all-gather: the bucket is not busy on this rank (its
                                 part is the whole bucket, in the params at the start) */
} Job;

/* A sharded bucket the thread started and has not finished: it stays in
 * flight while later jobs run (the next step's collectives, a host
 * all-reduce of the loss), and lands when its requests complete (an
 * all-gather's data are in the params by then). Its bucket
 * is settled (no longer busy: its waits return) as soon as this rank has
 * what it needs, which may be before MPI is done with it: an all-gather
 * once this rank's own part is in the params, if the other ranks send it
 * nothing; a reduce-scatter once its gradients are staged, if none of the
 * bucket's range is this rank's. */
typedef struct {
    MPI_Request rq;      /* a reduce-scatter's */
    MPI_Request *rqs;    /* an all-gather's sends and receives, nrq of them */
    int nrq;
    Job j;
    Buf buf;             /* reduce-scatter: this rank's gradients staged */
    double t0, deadline;
    int64_t bytes;
    int64_t lo, mine;    /* reduce-scatter: this rank's part, mine elements from lo in its
                            shard */
    bool settled;        /* the bucket is no longer busy (settle) */
} Flying;

/* A TP collective in flight, or a free slot (rt_comm_tp_start) */
typedef struct {
    MPI_Request rq;
    int coll;              /* 0 all-reduce, 1 reduce-scatter, 2 all-gather */
    bool busy, done;       /* a slot in use; its request complete */
    float *in, *out;       /* the operand's copy; a gather's [rank][outer][chunk] */
    int64_t in_cap, out_cap;
    float *y;              /* the result (the caller's) */
    int64_t outer, chunk, bytes;
    double t0, t1, deadline;
    const char *what;
} RtTpFly;

struct RtComm {
    int rank, size, local_size, local_rank; /* rank and size: in the dp group */
    int wrank, wsize;         /* in the world: every rank of the job */
    int tp, tp_rank;          /* the tensor-parallel group: its size, this rank's index */
    double timeout;
    MPI_Comm cc, pc, gc;      /* collectives (dp group); pings (world); the gathers'
                                 messages (dp group) */
    MPI_Comm tpc;             /* the TP group's collectives (tp > 1) */
    int pp, pp_stage;         /* pipeline stages; this rank's stage (pp.c) */
    MPI_Comm ppc;             /* the stages of one pipeline (pp > 1): rank = stage */
    VEC(RtTpFly) tp_fly;      /* TP collectives: slots, busy from start to wait */
    /* the TP collectives since rt_comm_tp_stats (the calling thread's own):
     * their time from start to completion, and the time their waits blocked */
    double tp_s, tp_exposed_s;
    int tp_n;
    int64_t tp_bytes;
    VEC(RtCommEvent) tp_ev;
    RtCommEvent *tp_ev_copy;
    struct {
        void (*pull)(void *arg, RtComm *c);
        void *arg;
    } tp_src[8];              /* TP collectives run by the device (rt_comm_tp_source) */
    int ntp_src;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* jobs queued, buckets done, quit */
    int waiting;              /* calling threads blocked in a wait (FLY_IDLE_NS) */
    VEC(Job) q;               /* pending jobs, FIFO from qhead */
    int qhead;
    bool quit;
    int64_t started;          /* collectives begun by the thread */
    int *bucket_busy;         /* per bucket: held, queued or running starts */
    double *bucket_done;      /* per bucket: when its last start finished (ir_now) */
    VEC(Job) held;            /* all-gathers started, not yet queued (release_held) */
    int nbuckets;
    float *stage;
    int64_t nstage;
    VEC(Flying) fly;          /* the thread's own: sharded buckets in flight */
    VEC(Buf) spare;           /* freed bucket buffers, for reuse (under mu) */
    int64_t spare_bytes;
    int64_t staged;           /* the thread's own: bytes of their staging buffers */
    /* stats since the last reset (under mu) */
    double comm_s, exposed_s;
    double exposed_by[3];     /* exposed_s per CgColl of the bucket waited for */
    int *bucket_coll;         /* per bucket: its CgColl (zero=1 has three kinds) */
    int *bucket_open;         /* per bucket: starts MPI has not finished (the busy ones, and
                                 settled ones still in flight) */
    VEC(RtCommEvent) ev;
    int ev_taken;             /* ev.n at the last rt_comm_stats */
    RtCommEvent *ev_copy;
    /* collectives run by the device (rt_comm_set_source) */
    void (*pull)(void *arg, RtComm *c);
    void *pull_arg;
};

/* Sleeps ns nanoseconds (the polls' back-off). */
void rt_mpi_nap(long ns);
/* A collective has not finished within the timeout: finds whom this rank
 * lost, says so, and stops every rank (MPI_Abort). */
_Noreturn void rt_mpi_lost(RtComm *c, const char *what);
/* The most elements (or bytes) one MPI call moves: MPI's counts are int,
 * so larger transfers go in pieces of this size, in order (2^30;
 * KILN_MPI_CHUNK, a test hook, makes it smaller). */
int64_t rt_mpi_chunk(void);

#endif
