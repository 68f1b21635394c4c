/* test_comm_lost.c - rt_comm_lost (runtime/dist/mpi.c): a collective run outside
 * RtComm (a GPU's NCCL all-reduce) reports that it timed out; the rank
 * names the lost rank through RtComm's liveness pings and stops every rank.
 *
 * The test runs itself under mpirun with 2 ranks (without mpirun on PATH it
 * exits 77: ctest reports it Skipped):
 * rank 1 stops itself (SIGSTOP, a hung peer), rank 0 calls rt_comm_lost.
 * Checked: mpirun ends within the bound with a failure status, and the
 * message names rank 1, the collective and comm_timeout. */
#include "runtime.h"
#include "dist.h"
#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One rank under mpirun. */
static int rank_main(void)
{
    RtComm *c = NULL;
    Diag d = {{0}};
    if (!rt_comm_open(1.0, &c, &d) || !c) {
        fprintf(stderr, "rank: %s\n", d.msg);
        return 3;
    }
    double v = 1;
    rt_comm_mean(c, &v, 1); /* both ranks are up */
    if (rt_comm_rank(c) == 1) {
        raise(SIGSTOP);
        return 0;
    }
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
    rt_comm_lost(c, "the test's device collective");
}

static void test_lost_names_stopped_rank(void **state)
{
    (void)state;
    char *out = NULL;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = 0;
    /* as kiln's launcher does (launch.c): containers often run as root */
    const char *root = getuid() == 0 ? "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                                     : "";
    char *cmd = xasprintf("%stimeout 60 mpirun -np 2 --oversubscribe --bind-to none '%s' 2>&1",
                          root, exe);
    double t0 = ir_now();
    out = NULL;
    int rc = run_cmd(cmd, &out);
    double t = ir_now() - t0;
    const char *o = out ? out : "";
    if (rc == 0 || rc == 124)
        fail_msg("mpirun exited %d after %.1f s:\n%s", rc, t, o);
    if (!strstr(o, "rank 0: lost rank 1: no answer") ||
        !strstr(o, "the test's device collective") || !strstr(o, "comm_timeout=1"))
        fail_msg("expected rank 0 to name rank 1, the collective and the bound:\n%s", o);
    if (t > 30)
        fail_msg("took %.1f s", t);
    free(out);
    free(cmd);
}

int main(void)
{
    if (getenv("OMPI_COMM_WORLD_SIZE"))
        return rank_main();
    if (!have_command("mpirun")) {
        printf("test_comm_lost: skipped: no mpirun on PATH\n");
        return TEST_SKIPPED;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_names_stopped_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
