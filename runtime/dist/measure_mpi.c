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
 * the other rank's arrival are part of what a step pays).
 *
 * The TP link (`kiln __measure-mpi PATH tp`, cached as CACHE/cpu-mpi-tp-N.txt)
 * is the same fit for the path the TP collectives take: one TP group of
 * all N ranks, rt_comm_tp_allreduce (an MPI non-blocking all-reduce started
 * and polled by the caller, no communication thread) of 8 B to 16 MiB of
 * floats out of a separate operand buffer, as the executor's TP steps are;
 * alpha and bw are fitted together in relative error, so that the sizes a
 * step's activations have weigh as much as the largest and one slow small
 * message (a rank descheduled) does not set alpha alone. */
#include "cpu.h"
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { REPS = 15, NSIZES = 5, NTP = 7 };
static const int64_t sizes[NSIZES] = {8, 64 << 10, 1 << 20, 4 << 20, 16 << 20}; /* bytes */
static const int64_t tp_sizes[NTP] = {8,       64 << 10, 256 << 10, 1 << 20,
                                      2 << 20, 4 << 20,  16 << 20}; /* bytes */

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
        else if (sscanf(line, "alpha=%lf", &v) == 1 && v >= 0) /* TP: 0 where the fit says so */
            l->alpha_s = v, got |= 2;
        else if (sscanf(line, "bw=%lf", &v) == 1 && v > 0)
            l->bw = v, got |= 4;
    }
    fclose(f);
    return same && got == 7;
}

/* One link's cached figures: CACHE/cpu-mpi[-tp]-N.txt, measured when absent,
 * stale (another CPU) or remeasure. */
static bool link_of(int nranks, const char *cache_dir, bool remeasure, bool tp, RtMpiLink *l,
                    Diag *d)
{
    char *model = rt_cpu_model();
    char *dir = rt_cache_path(cache_dir);
    char *path = xasprintf("%s/cpu-mpi%s-%d.txt", dir, tp ? "-tp" : "", nranks);
    bool ok = !remeasure && read_cached(path, model, nranks, l);
    if (!ok) {
        fprintf(stderr, "kiln: measuring MPI%s between %d local ranks (once; cached in %s)\n",
                tp ? " (the TP collectives' path)" : "", nranks, path);
        if (!rt_mkdir_p(dir)) {
            snprintf(d->msg, sizeof d->msg, "cannot create %s", dir);
        } else {
            char self[] = "kiln", cmd[] = "__measure-mpi", tpw[] = "tp";
            char *argv[] = {self, cmd, path, tp ? tpw : NULL, NULL};
            int rc = rt_launch(nranks, tp ? 4 : 3, argv);
            ok = rc == 0 && read_cached(path, model, nranks, l);
            if (!ok)
                snprintf(d->msg, sizeof d->msg,
                         "the MPI%s measurement on %d ranks failed (exit %d)", tp ? " (TP)" : "",
                         nranks, rc);
        }
    }
    free(path);
    free(dir);
    free(model);
    return ok;
}

bool rt_mpi_link(int nranks, const char *cache_dir, bool remeasure, bool want_tp, RtMpiLink *l,
                 Diag *d)
{
    memset(l, 0, sizeof *l);
    RtMpiLink tp = {0};
    if (!link_of(nranks, cache_dir, remeasure, false, l, d) ||
        (want_tp && !link_of(nranks, cache_dir, remeasure, true, &tp, d)))
        return false;
    l->tp_alpha_s = tp.alpha_s;
    l->tp_bw = tp.bw;
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of one all-reduce of each size, every rank started
 * together: through the communication thread (rt_comm_mean of doubles), or
 * as a TP step (rt_comm_tp_allreduce of floats from a separate operand). */
static void time_sizes(RtComm *c, bool tp, const int64_t *sz, int ns, double *t)
{
    int64_t most = sz[ns - 1];
    double *buf = xcalloc((size_t)(most / 8), sizeof(double));
    float *x = tp ? xcalloc((size_t)(most / 4), sizeof(float)) : NULL;
    float *y = tp ? xcalloc((size_t)(most / 4), sizeof(float)) : NULL;
    double xs[REPS];
    for (int s = 0; s < ns; s++) {
        for (int r = -1; r < REPS; r++) { /* r = -1: warm-up, the buffers and pages */
            double t0 = 0;
            if (tp) {
                float one = 1;
                rt_comm_tp_allreduce(c, &one, 1); /* every rank starts together */
                t0 = ir_now();
                rt_comm_tp_wait(c, rt_comm_tp_start(c, 0, x, 1, sz[s] / 4, y));
            } else {
                double one = 1;
                rt_comm_mean(c, &one, 1);
                t0 = ir_now();
                rt_comm_mean(c, buf, (int)(sz[s] / 8));
            }
            if (r >= 0)
                xs[r] = ir_now() - t0;
        }
        qsort(xs, REPS, sizeof xs[0], cmp_double);
        t[s] = xs[REPS / 2];
    }
    free(buf);
    free(x);
    free(y);
}

int rt_mpi_measure_main(int argc, char **argv)
{
    bool tp = argc == 4 && strcmp(argv[3], "tp") == 0;
    if ((argc != 3 && !tp) || !getenv("OMPI_COMM_WORLD_SIZE")) {
        fprintf(stderr, "kiln __measure-mpi PATH [tp]: run by `kiln plan` under mpirun\n");
        return 2;
    }
    rt_rank_status("running %d", (int)getpid());
    RtComm *c = NULL;
    Diag d = {{0}};
    int wsize = atoi(getenv("OMPI_COMM_WORLD_SIZE"));
    if (!rt_comm_open_tp(60, tp ? wsize : 1, &c, &d) || !c) {
        fprintf(stderr, "%s\n", d.msg[0] ? d.msg : "kiln: MPI did not start");
        rt_rank_status("exit 1");
        return 1;
    }
    int n = rt_comm_world_size(c);
    const int64_t *sz = tp ? tp_sizes : sizes;
    int ns = tp ? NTP : NSIZES;
    double t[NTP];
    time_sizes(c, tp, sz, ns, t);
    int rc = 0;
    if (rt_comm_world_rank(c) == 0) {
        /* t(B) = a + k B with a = 2 (n-1) alpha and k = 2 (n-1) / (n bw).
         * DP: a = t(8 B), k by least squares over the other sizes. TP: a
         * and k together by least squares in relative error (weights
         * 1 / t^2) over every size, a >= 0 */
        double a = t[0], num = 0, den = 0, k;
        if (tp) {
            double sw = 0, sb = 0, sbb = 0, st = 0, sbt = 0;
            for (int s = 0; s < ns; s++) {
                double b = (double)sz[s], w = 1 / (t[s] * t[s]);
                sw += w, sb += w * b, sbb += w * b * b, st += w * t[s], sbt += w * b * t[s];
            }
            double det = sw * sbb - sb * sb;
            a = det > 0 ? (sbb * st - sb * sbt) / det : -1;
            k = det > 0 ? (sw * sbt - sb * st) / det : 0;
            if (a < 0) { /* through the origin */
                a = 0;
                k = sbt / sbb;
            }
            k = k > 0 ? k : 1e-12;
        } else {
            for (int s = 1; s < ns; s++) {
                double b = (double)sz[s];
                num += (t[s] - a) * b;
                den += b * b;
            }
            k = num > 0 ? num / den : 1e-12;
        }
        double alpha = a / (2.0 * (n - 1)), bw = 2.0 * (n - 1) / (n * k);
        char *model = rt_cpu_model();
        char table[400] = "";
        size_t m = 0;
        for (int s = 0; s < ns && m < sizeof table; s++)
            m += (size_t)snprintf(table + m, sizeof table - m, " %lld B: %.4g",
                                  (long long)sz[s], t[s]);
        char *text = xasprintf("model=%s\nranks=%d\nalpha=%.6g\nbw=%.6g\n"
                               "# median all-reduce seconds%s:%s\n",
                               model, n, alpha, bw, tp ? " (TP step)" : "", table);
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
