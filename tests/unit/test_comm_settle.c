/* test_comm_settle.c - a zero=1 bucket is settled (its wait returns) as
 * soon as this rank has what it needs from it, not when MPI is done with
 * it (runtime/dist/mpi.c, docs/distributed.md "Settling a bucket early"):
 *
 * - a reduce-scatter of which this rank receives nothing, once its
 *   gradients are staged;
 * - an all-gather that lies in this rank's shard, at its start; MPI is
 *   done with it (rt_comm_wait_done) only once the other rank has it.
 *
 * Two ranks run the reduce-scatter and all-gather starts of gpt's zero=1
 * plan (many small buckets) on a plain arena through RtComm, and rank 0
 * comes to them SLEEP_S late. Rank 1's waits for the buckets above must
 * return well before that; its waits for buckets that hold a part of rank
 * 0's (the control: the delay is real) must take at least most of it. The
 * reduce-scatters are checked up to the first bucket holding a part of
 * rank 1's: the communication thread finishes such a bucket before it
 * runs the next one. Both ranks then check the data: each shard holds the
 * mean of the ranks' gradients, and every param the gathered shards.
 *
 * The cmocka test starts this binary as 2 ranks through rt_launch (mpirun;
 * without mpirun on PATH it exits 77, which ctest reports as Skipped);
 * under mpirun the process runs rank_main, whose exit status is the
 * verdict. */
#include "codegen.h"
#include "dist.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "testutil.h"
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SLOW_RANK = 0, FAST_RANK = 1 };
#define SLEEP_S 1.0
#define FAST_S 0.5 /* a settled bucket's wait returns before this */

/* The arena: what mpi.c reads and writes through the backend. */
typedef struct {
    unsigned char *mem;
} Arena;

static void arena_write(BackendCtx *c, int64_t off, const void *src, int64_t bytes)
{
    memcpy(((Arena *)(void *)c)->mem + off, src, (size_t)bytes);
}

static void arena_read(BackendCtx *c, int64_t off, void *dst, int64_t bytes)
{
    memcpy(dst, ((Arena *)(void *)c)->mem + off, (size_t)bytes);
}

static void *arena_ptr(BackendCtx *c, int64_t off) { return ((Arena *)(void *)c)->mem + off; }

static float grad_value(int rank, int64_t q) { return (float)(rank + 1) * (float)(q % 97 + 1); }
static float param_value(int64_t q) { return (float)(q % 89) + 0.5f; }

static bool is_coll(const CgStep *st, CgColl coll)
{
    return st->kind == CG_STEP_ALLREDUCE_START && st->coll == coll;
}

static int64_t bucket_numel(const CgPlan *p, const CgStep *st)
{
    int64_t n = 0;
    for (int a = 0; a < st->nargs; a++)
        n += shape_numel(&p->g->t.v[st->args[a]].s);
    return n;
}

/* Elements of [st->sh_start, + n) in rank r's shard. */
static int64_t part_of(const CgStep *st, int64_t n, int r)
{
    int64_t off, len;
    ir_shard_range(st->sh_total, st->sh_nranks, r, &off, &len);
    int64_t a = st->sh_start > off ? st->sh_start : off;
    int64_t b = st->sh_start + n < off + len ? st->sh_start + n : off + len;
    return b > a ? b - a : 0;
}

/* Fills the bucket's tensors: a reduce-scatter's with this rank's
 * gradients by flat position (from st->sh_start), an all-gather's (the
 * params) with -1, which the gather must overwrite. */
static void fill_bucket(const CgPlan *p, const CgStep *st, Arena *ar, int rank, bool grads)
{
    int64_t q = st->sh_start;
    for (int a = 0; a < st->nargs; a++) {
        int64_t n = shape_numel(&p->g->t.v[st->args[a]].s);
        float *v = (float *)(void *)(ar->mem + cg_offset(p, st->args[a]));
        for (int64_t i = 0; i < n; i++, q++)
            v[i] = grads ? grad_value(rank, q) : -1.0f;
    }
}

static double since(double t0) { return ir_now() - t0; }

static void reduce_scatters(RtComm *c, const CgPlan *p, const Backend *be, Arena *ar, int rank)
{
    int64_t off, len;
    const CgStep *any = NULL;
    for (int s = 0; s < p->steps.n; s++)
        if (is_coll(&p->steps.v[s], CG_COLL_REDUCE_SCATTER)) {
            fill_bucket(p, &p->steps.v[s], ar, rank, true);
            any = &p->steps.v[s];
        }
    RANK_CHECK(any != NULL, "no reduce-scatter in the plan");
    if (!any)
        return;
    ir_shard_range(any->sh_total, 2, rank, &off, &len);
    double one = 1;
    rt_comm_mean(c, &one, 1); /* together from here */
    if (rank == SLOW_RANK)
        nanosleep(&(struct timespec){(time_t)SLEEP_S, 0}, NULL);
    double t0 = ir_now();
    for (int s = 0; s < p->steps.n; s++)
        if (is_coll(&p->steps.v[s], CG_COLL_REDUCE_SCATTER))
            rt_comm_start(c, p, s, be, (BackendCtx *)(void *)ar);
    int nfast = 0, nslow = 0;
    double fast_max = 0, slow_min = 1e9;
    bool before_own = true; /* no bucket with a part of this rank's started yet */
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (!is_coll(st, CG_COLL_REDUCE_SCATTER))
            continue;
        bool mine = part_of(st, bucket_numel(p, st), rank) > 0;
        rt_comm_wait(c, st->bucket);
        double dt = since(t0);
        if (rank != FAST_RANK)
            continue;
        before_own &= !mine;
        if (before_own) {
            RANK_CHECK(dt < FAST_S, "reduce-scatter bucket %d (none of it rank %d's): wait returned "
                  "after %.3f s", st->bucket, rank, dt);
            nfast++;
            fast_max = dt > fast_max ? dt : fast_max;
        } else if (mine) {
            RANK_CHECK(dt > 0.8 * SLEEP_S, "reduce-scatter bucket %d (part of it rank %d's): wait "
                  "returned after %.3f s, before the other rank started it", st->bucket,
                  rank, dt);
            nslow++;
            slow_min = dt < slow_min ? dt : slow_min;
        }
    }
    if (rank == FAST_RANK) {
        RANK_CHECK(nfast > 0 && nslow > 0, "%d reduce-scatter buckets settled early, %d waited for",
              nfast, nslow);
        fprintf(stderr, "rank %d, the other %.1f s late: %d reduce-scatter buckets settled "
                "after at most %.3f s, %d waited for at least %.3f s\n", rank, SLEEP_S, nfast,
                fast_max, nslow, slow_min);
    }
    rt_comm_drain(c);
    /* this rank's shard: the mean of the two ranks' gradients */
    const float *sh = (const float *)(void *)(ar->mem + cg_offset(p, any->sh_buf));
    int bad = 0;
    for (int64_t i = 0; i < len; i++) {
        float want = 0.5f * (grad_value(0, off + i) + grad_value(1, off + i));
        bad += sh[i] != want;
    }
    RANK_CHECK(bad == 0, "%d of %lld shard elements are not the mean gradient", bad, (long long)len);
}

static void all_gathers(RtComm *c, const CgPlan *p, const Backend *be, Arena *ar, int rank)
{
    const CgStep *any = NULL;
    for (int s = 0; s < p->steps.n; s++)
        if (is_coll(&p->steps.v[s], CG_COLL_ALL_GATHER)) {
            fill_bucket(p, &p->steps.v[s], ar, rank, false);
            any = &p->steps.v[s];
        }
    RANK_CHECK(any != NULL, "no all-gather in the plan");
    if (!any)
        return;
    int64_t off, len;
    ir_shard_range(any->sh_total, 2, rank, &off, &len);
    float *sh = (float *)(void *)(ar->mem + cg_offset(p, any->sh_buf));
    for (int64_t i = 0; i < len; i++)
        sh[i] = param_value(off + i);
    double one = 1;
    rt_comm_mean(c, &one, 1);
    if (rank == SLOW_RANK)
        nanosleep(&(struct timespec){(time_t)SLEEP_S, 0}, NULL);
    double t0 = ir_now();
    for (int s = 0; s < p->steps.n; s++)
        if (is_coll(&p->steps.v[s], CG_COLL_ALL_GATHER))
            rt_comm_start(c, p, s, be, (BackendCtx *)(void *)ar);
    /* the buckets in this rank's shard first: each must be settled now */
    int nfast = 0, nslow = 0, own_bucket = -1;
    double fast_max = 0, slow_min = 1e9;
    for (int pass = 0; pass < 2; pass++) {
        /* settled is not done: the sends of a bucket of this rank's shard
         * read its params until the late rank has received them */
        if (pass == 1 && rank == FAST_RANK && own_bucket >= 0) {
            rt_comm_wait_done(c, own_bucket);
            double dt = since(t0);
            RANK_CHECK(dt > 0.8 * SLEEP_S, "all-gather bucket %d: done sending after %.3f s, "
                       "before the other rank received it", own_bucket, dt);
        }
        for (int s = 0; s < p->steps.n; s++) {
            const CgStep *st = &p->steps.v[s];
            if (!is_coll(st, CG_COLL_ALL_GATHER))
                continue;
            int64_t n = bucket_numel(p, st);
            bool own = part_of(st, n, rank) == n;
            if (own != (pass == 0))
                continue;
            if (own)
                own_bucket = st->bucket;
            rt_comm_wait(c, st->bucket);
            double dt = since(t0);
            if (rank != FAST_RANK)
                continue;
            if (own) {
                RANK_CHECK(dt < FAST_S, "all-gather bucket %d (all of it rank %d's): wait returned "
                      "after %.3f s", st->bucket, rank, dt);
                nfast++;
                fast_max = dt > fast_max ? dt : fast_max;
            } else {
                RANK_CHECK(dt > 0.8 * SLEEP_S, "all-gather bucket %d (not all rank %d's): wait "
                      "returned after %.3f s, before the other rank sent its part",
                      st->bucket, rank, dt);
                nslow++;
                slow_min = dt < slow_min ? dt : slow_min;
            }
        }
    }
    if (rank == FAST_RANK) {
        RANK_CHECK(nfast > 0 && nslow > 0, "%d all-gather buckets settled at the start, %d waited for",
              nfast, nslow);
        fprintf(stderr, "rank %d, the other %.1f s late: %d all-gather buckets settled after "
                "at most %.3f s, %d waited for at least %.3f s\n", rank, SLEEP_S, nfast,
                fast_max, nslow, slow_min);
    }
    rt_comm_drain(c);
    int bad = 0;
    int64_t total = 0;
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (!is_coll(st, CG_COLL_ALL_GATHER))
            continue;
        int64_t q = st->sh_start;
        for (int a = 0; a < st->nargs; a++) {
            int64_t n = shape_numel(&p->g->t.v[st->args[a]].s);
            const float *v = (const float *)(void *)(ar->mem + cg_offset(p, st->args[a]));
            for (int64_t i = 0; i < n; i++, q++)
                bad += v[i] != param_value(q);
            total += n;
        }
    }
    RANK_CHECK(bad == 0, "%d of %lld gathered param elements are wrong", bad, (long long)total);
}

static CgPlan *zero_plan(Graph **gout)
{
    char err[2048];
    Model *m = fe_load_model("models/gpt.lua", NULL, 0, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    Graph *g = ir_clone(m->g);
    PassOpts o;
    rt_pass_opts(&m->train, NULL, &o);
    o.nranks = 2;
    o.zero = 1;
    o.bucket_bytes = 16384;
    Diag d = {{0}};
    if (!pass_pipeline(g, &o, NULL, NULL, NULL, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        exit(1);
    }
    fe_model_free(m);
    CgPlan *p = cg_plan(g, &d);
    if (!p) {
        fprintf(stderr, "%s\n", d.msg);
        exit(1);
    }
    *gout = g;
    return p;
}

static int rank_main(void)
{
    Diag d = {{0}};
    RtComm *c = NULL;
    if (!rt_comm_open(30, &c, &d) || !c) {
        fprintf(stderr, "rank: rt_comm_open failed: %s\n", d.msg);
        return 1;
    }
    int rank = rt_comm_rank(c);
    Graph *g;
    CgPlan *p = zero_plan(&g);
    Arena ar = {xcalloc((size_t)p->arena_bytes + 1, 1)};
    Backend be = {.read = arena_read, .write = arena_write, .host_ptr = arena_ptr};
    reduce_scatters(c, p, &be, &ar, rank);
    all_gathers(c, p, &be, &ar, rank);
    int rc = rank_verdict(c);
    free(ar.mem);
    cg_plan_free(p);
    ir_free(g);
    return rc;
}

static void test_settle_two_ranks(void **state)
{
    (void)state;
    assert_int_equal(rank_test_launch(2), 0);
}

int main(int argc, char **argv)
{
    return rank_test_main(argc, argv, "test_comm_settle", rank_main, test_settle_two_ranks);
}
