/* test_comm_bcast.c - rt_comm_bcast across 2 MPI ranks (the NCCL unique id
 * travels this way), in order with the other collectives; and the device
 * collectives' source of statistics (rt_comm_set_source,
 * rt_comm_add_events); the step's mean (rt_comm_step_mean) counts its
 * wait as exposed time, a plain mean does not.
 *
 * The cmocka test starts this binary as 2 ranks through rt_launch (mpirun;
 * without mpirun on PATH it exits 77, which ctest reports as Skipped);
 * under mpirun the process runs rank_main instead, whose exit status is the
 * verdict. A second launch with KILN_TEST_BCAST_SKIP=1 (the ranks leave the
 * broadcast out) must fail: the checks can fail. */
#include "codegen.h"
#include "runtime.h"
#include "dist.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned char pattern(size_t i, int seed) { return (unsigned char)(i * 31u + 7u * (unsigned)seed); }

/* n bytes from rank 0: rank 0 fills the pattern, the others 0xee. */
static void one_bcast(RtComm *c, size_t n, int seed, bool skip)
{
    unsigned char *b = xmalloc(n + 1);
    for (size_t i = 0; i < n; i++)
        b[i] = rt_comm_rank(c) == 0 ? pattern(i, seed) : 0xee;
    if (!skip)
        rt_comm_bcast(c, b, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += b[i] != pattern(i, seed);
    RANK_CHECK(bad == 0, "broadcast of %zu bytes (seed %d): %zu bytes differ from rank 0's", n, seed,
          bad);
    free(b);
}

static int npull;

static void pull(void *arg, RtComm *c)
{
    (void)arg;
    npull++;
    RtCommEvent ev = {3, 64, 1.0, 1.25, 0, 0};
    rt_comm_add_events(c, &ev, 1, 0.125);
}

static int rank_main(void)
{
    Diag d = {{0}};
    RtComm *c = NULL;
    if (!rt_comm_open(20, &c, &d) || !c) {
        fprintf(stderr, "rank: rt_comm_open failed: %s\n", d.msg);
        return 1;
    }
    bool skip = getenv("KILN_TEST_BCAST_SKIP") != NULL;
    RANK_CHECK(rt_comm_size(c) == 2, "size %d", rt_comm_size(c));
    RANK_CHECK(rt_comm_local_rank(c) == rt_comm_rank(c), "local rank %d, rank %d",
          rt_comm_local_rank(c), rt_comm_rank(c));
    /* an NCCL id's size, one byte, several MiB; between them a host
     * all-reduce (the same queue keeps the order on every rank) */
    one_bcast(c, 128, 1, skip);
    double v = rt_comm_rank(c) + 1;
    rt_comm_mean(c, &v, 1);
    RANK_CHECK(v == 1.5, "mean %g", v);
    one_bcast(c, 1, 2, skip);
    one_bcast(c, (size_t)3 << 20, 3, skip);
    rt_comm_bcast(c, NULL, 0); /* nothing */
    one_bcast(c, 4096, 4, skip);

    /* the device source: pulled by rt_comm_stats, added to the step's stats */
    rt_comm_stats_reset(c);
    int other;
    rt_comm_set_source(c, pull, &npull);
    RtCommStats st;
    rt_comm_stats(c, &st);
    RANK_CHECK(npull == 1, "pulled %d times", npull);
    int found = 0;
    for (int i = 0; i < st.nev; i++)
        found += st.ev[i].bucket == 3 && st.ev[i].bytes == 64 && st.ev[i].end == 1.25;
    RANK_CHECK(found == 1, "the pulled event is in the stats %d times", found);
    RANK_CHECK(st.comm_s >= 0.25 - 1e-12 && st.exposed_s >= 0.125 - 1e-12, "comm %g exposed %g",
          st.comm_s, st.exposed_s);
    rt_comm_set_source(c, NULL, &other); /* another's: stays */
    rt_comm_stats_reset(c);
    rt_comm_stats(c, &st);
    RANK_CHECK(npull == 2 && st.nev == 1, "pulled %d times, %d events", npull, st.nev);
    rt_comm_set_source(c, NULL, &npull);
    rt_comm_stats_reset(c);
    rt_comm_stats(c, &st);
    RANK_CHECK(npull == 2 && st.nev == 0 && st.exposed_s == 0, "after removal: pulled %d, %d events",
          npull, st.nev);

    /* the mean that ends a training step: all of its wait is exposed time,
     * under the all-reduces (rank 1 comes 50 ms late, so rank 0 waits at
     * least 40); an ordinary mean's wait is not */
    for (int step = 0; step < 2; step++) {
        double one = 1;
        rt_comm_mean(c, &one, 1); /* both ranks start together */
        rt_comm_stats_reset(c);
        if (rt_comm_rank(c) == 1)
            nanosleep(&(struct timespec){0, 50000000}, NULL);
        double x = rt_comm_rank(c);
        if (step)
            rt_comm_step_mean(c, &x, 1);
        else
            rt_comm_mean(c, &x, 1);
        rt_comm_stats(c, &st);
        RANK_CHECK(x == 0.5, "mean %g", x);
        if (rt_comm_rank(c) == 0 && step)
            RANK_CHECK(st.exposed_s >= 0.04 && st.exposed_by[CG_COLL_ALLREDUCE] == st.exposed_s,
                  "the step's mean: exposed %g s, %g s under the all-reduces", st.exposed_s,
                  st.exposed_by[CG_COLL_ALLREDUCE]);
        if (!step)
            RANK_CHECK(st.exposed_s == 0, "an ordinary mean: exposed %g s", st.exposed_s);
    }

    return rank_verdict(c);
}

static void test_bcast_two_ranks(void **state)
{
    (void)state;
    unsetenv("KILN_TEST_BCAST_SKIP");
    int rc = rank_test_launch(2);
    assert_int_equal(rc, 0);
    /* without the broadcast the ranks see their own bytes: the checks fail */
    setenv("KILN_TEST_BCAST_SKIP", "1", 1);
    rc = rank_test_launch(2);
    unsetenv("KILN_TEST_BCAST_SKIP");
    assert_int_not_equal(rc, 0);
}

int main(int argc, char **argv)
{
    return rank_test_main(argc, argv, "test_comm_bcast", rank_main, test_bcast_two_ranks);
}
