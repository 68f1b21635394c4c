/* measure_mpi.c - the MPI link between ranks on this machine, measured once
 * with the transport kiln trains with (mpi.c's communication thread, its
 * non-blocking all-reduce and polling) and cached beside the kernel cache
 * as CACHE/cpu-mpi-N.txt for N ranks, keyed by the CPU's model name. It is
 * the `cpu` device's link for `kiln plan` (docs/plan.md).
 *
 * rt_mpi_link runs `kiln __measure-mpi PATH` on N ranks through rt_launch
 * (mpirun). Each rank all-reduces host buffers of 8 B to 16 MiB through
 * rt_comm_mean, REPS times each after a warm-up; rank 0 takes the median
 * time t(B) of each size and fits the ring's alpha-beta form for N ranks,
 *
 *     t(B) = 2 (N-1) alpha + 2 (N-1) / N x B / bw,
 *
 * alpha from the smallest buffer, bw by least squares over the others (the
 * median, not the best: on a shared machine the polling thread's naps and
 * the other rank's arrival are part of what a step pays). */
#include "cpu.h"
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { REPS = 15, NSIZES = 5 };
static const int64_t sizes[NSIZES] = {8, 64 << 10, 1 << 20, 4 << 20, 16 << 20}; /* bytes */

static bool read_cached(const char *path, const char *model, int nranks, RtMpiLink *l)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[600];
    bool same = false;
    int got = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        double v;
        if (strncmp(line, "model=", 6) == 0)
            same = strcmp(line + 6, model) == 0;
        else if (sscanf(line, "ranks=%d", &n) == 1)
            got |= n == nranks ? 1 : 0;
        else if (sscanf(line, "alpha=%lf", &v) == 1 && v > 0)
            l->alpha_s = v, got |= 2;
        else if (sscanf(line, "bw=%lf", &v) == 1 && v > 0)
            l->bw = v, got |= 4;
    }
    fclose(f);
    return same && got == 7;
}

bool rt_mpi_link(int nranks, const char *cache_dir, bool remeasure, RtMpiLink *l, Diag *d)
{
    memset(l, 0, sizeof *l);
    char *model = rt_cpu_model();
    char *dir = rt_cache_path(cache_dir);
    char *path = xasprintf("%s/cpu-mpi-%d.txt", dir, nranks);
    bool ok = !remeasure && read_cached(path, model, nranks, l);
    if (!ok) {
        fprintf(stderr, "kiln: measuring MPI between %d local ranks (once; cached in %s)\n",
                nranks, path);
        if (!rt_mkdir_p(dir)) {
            snprintf(d->msg, sizeof d->msg, "cannot create %s", dir);
        } else {
            char self[] = "kiln", cmd[] = "__measure-mpi";
            char *argv[] = {self, cmd, path, NULL};
            int rc = rt_launch(nranks, 3, argv);
            ok = rc == 0 && read_cached(path, model, nranks, l);
            if (!ok)
                snprintf(d->msg, sizeof d->msg,
                         "the MPI measurement on %d ranks failed (exit %d)", nranks, rc);
        }
    }
    free(path);
    free(dir);
    free(model);
    return ok;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int rt_mpi_measure_main(int argc, char **argv)
{
    if (argc != 3 || !getenv("OMPI_COMM_WORLD_SIZE")) {
        fprintf(stderr, "kiln __measure-mpi PATH: run by `kiln plan` under mpirun\n");
        return 2;
    }
    rt_rank_status("running %d", (int)getpid());
    RtComm *c = NULL;
    Diag d = {{0}};
    if (!rt_comm_open(60, &c, &d) || !c) {
        fprintf(stderr, "%s\n", d.msg[0] ? d.msg : "kiln: MPI did not start");
        rt_rank_status("exit 1");
        return 1;
    }
    int n = rt_comm_size(c);
    double *buf = xcalloc((size_t)(sizes[NSIZES - 1] / 8), sizeof(double));
    double t[NSIZES], x[REPS];
    for (int s = 0; s < NSIZES; s++) {
        int cnt = (int)(sizes[s] / 8);
        rt_comm_mean(c, buf, cnt); /* warm-up: the transport's buffers and pages */
        for (int r = 0; r < REPS; r++) {
            double one = 1;
            rt_comm_mean(c, &one, 1); /* every rank starts together */
            double t0 = ir_now();
            rt_comm_mean(c, buf, cnt);
            x[r] = ir_now() - t0;
        }
        qsort(x, REPS, sizeof x[0], cmp_double);
        t[s] = x[REPS / 2];
    }
    free(buf);
    int rank = rt_comm_rank(c);
    int rc = 0;
    if (rank == 0) {
        /* t(B) = a + k B with a = 2 (n-1) alpha and k = 2 (n-1) / (n bw) */
        double a = t[0], num = 0, den = 0;
        for (int s = 1; s < NSIZES; s++) {
            double b = (double)sizes[s];
            num += (t[s] - a) * b;
            den += b * b;
        }
        double k = num > 0 ? num / den : 1e-12;
        double alpha = a / (2.0 * (n - 1)), bw = 2.0 * (n - 1) / (n * k);
        char *model = rt_cpu_model();
        char *text = xasprintf("model=%s\nranks=%d\nalpha=%.6g\nbw=%.6g\n"
                               "# median all-reduce seconds at 8 B, 64 KiB, 1, 4, 16 MiB: "
                               "%.4g %.4g %.4g %.4g %.4g\n",
                               model, n, alpha, bw, t[0], t[1], t[2], t[3], t[4]);
        const void *chunk[1] = {text};
        size_t len[1] = {strlen(text)};
        if (!rt_write_atomic(argv[2], chunk, len, 1, &d)) {
            fprintf(stderr, "kiln: %s\n", d.msg);
            rc = 1;
        }
        free(text);
        free(model);
    }
    rt_comm_close(c);
    rt_rank_status("exit %d", rc);
    return rc;
}
