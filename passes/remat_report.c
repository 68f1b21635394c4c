/* remat_report.c - what the remat pass says: the RematReport of a chosen
 * plan (what `kiln compile` prints), the budget sweep table
 * (`kiln compile --remat-sweep`), byte and time formatting for them and for
 * the pass's diagnostics, and the recompute FLOPs of a rewritten graph. */
#include "remat_internal.h"

#include <stdlib.h>
#include <string.h>

void pass_remat_fmt_bytes(int64_t b, char *buf, size_t n)
{
    ir_fmt_bytes((double)b, 2, buf, n);
}

/* A predicted time in s, ms or us, 4 significant digits. */
static void fmt_secs(double s, char *buf, size_t n)
{
    if (s >= 1)
        snprintf(buf, n, "%.4g s", s);
    else if (s >= 1e-3)
        snprintf(buf, n, "%.4g ms", s * 1e3);
    else
        snprintf(buf, n, "%.4g us", s * 1e6);
}

void pass_remat_report(RematReport *r, const Prob *P, const Sol *s, int asked, int chosen,
                   int64_t peak, bool exact, double gap)
{
    if (!r)
        return;
    memset(r, 0, sizeof *r);
    r->policy = asked;
    r->chosen = chosen;
    r->exact = exact;
    r->gap = gap;
    r->peak = peak;
    for (int v = 0; v < P->nv; v++) {
        if (P->saved[v]) {
            r->nsaved++;
            if (s->r[P->grp[v] * P->nv + v]) {
                r->nrecomputed++;
                r->recomputed_bytes += P->bytes[v];
            } else {
                r->nkept++;
                r->kept_bytes += P->bytes[v];
            }
        }
        for (int g = 0; g < P->ngroups; g++)
            r->nrecompute_ops += s->r[g * P->nv + v];
    }
    r->extra_flops = s->flops;
    r->extra_seconds = s->cost;
}

double pass_remat_flops(const Graph *g)
{
    double f = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].flags & OPF_RECOMPUTE)
            f += ir_op_flops(g, &g->ops.v[i]);
    return f;
}

bool pass_remat_sweep(const Graph *g, const PassOpts *o, int npoints, FILE *out,
                      RematSweepPoint *pts, Diag *d)
{
    /* without a table to print, print it nowhere */
    FILE *f = out ? out : fopen("/dev/null", "w");
    if (!f)
        die("remat sweep: cannot open /dev/null");
    Prob *P = pass_remat_prob_new(g);
    Evals E = {g, P, o, {0}, 0, 0, 0};
    const int fixed[] = {REMAT_NONE, REMAT_SELECTIVE, REMAT_FULL};
    int64_t fpeak[3];
    double fcost[3], fflops[3];
    Sol t = pass_remat_sol_new(P);
    for (int k = 0; k < 3; k++) {
        fpeak[k] = pass_remat_fixed_real(&E, fixed[k], &t);
        pass_remat_policy_keep(P, fixed[k], &t);
        fcost[k] = t.cost;
        fflops[k] = t.flops;
    }
    pass_remat_sol_free(&t);
    int64_t smallest = pass_remat_smallest_real(&E);
    if (smallest == INT64_MAX || fpeak[0] < 0) {
        snprintf(d->msg, sizeof d->msg, "remat sweep: no plan could be built");
        pass_remat_prob_free(P);
        if (!out)
            fclose(f);
        return false;
    }
    double base = pass_remat_step_seconds(g), step_flops = ir_graph_flops(g);
    char b0[32], b1[32], t0[32];
    int nsaved = 0;
    for (int v = 0; v < P->nv; v++)
        nsaved += P->saved[v];
    fmt_secs(base, t0, sizeof t0);
    fprintf(f, "remat sweep: %d activations, %d saved for backward, %d layers; cost model "
               "%.0f GFLOP/s, %.0f GB/s; predicted step without remat %s\n",
            P->nv, nsaved, P->nlayers, REMAT_FLOPS / 1e9, REMAT_BW / 1e9, t0);
    fprintf(f, "fixed policies: ");
    for (int k = 0; k < 3; k++) {
        pass_remat_fmt_bytes(fpeak[k], b0, sizeof b0);
        fprintf(f, "%s%s peak %s (+%.2f%% FLOPs)", k ? ", " : "", pass_remat_policy_name(fixed[k]),
                b0, 100 * fflops[k] / step_flops);
    }
    fprintf(f, "\n%-12s %-15s %-5s %14s %12s %16s\n", "budget", "policy", "fits", "planned peak",
            "extra FLOPs", "predicted step");
    if (npoints < 2)
        npoints = 2;
    for (int i = 0; i < npoints; i++) {
        int64_t budget = smallest + (int64_t)((double)(fpeak[0] - smallest) * i / (npoints - 1));
        Choice c;
        bool fits = pass_remat_search(&E, budget, o->remat_solver, &c);
        if (pts)
            pts[i] = (RematSweepPoint){budget, fits ? c.peak : -1, fits,
                                       fits ? c.s.flops / step_flops : 0,
                                       fits ? base + c.s.cost : 0};
        pass_remat_fmt_bytes(budget, b0, sizeof b0);
        if (fits) {
            pass_remat_fmt_bytes(c.peak, b1, sizeof b1);
            char what[32];
            snprintf(what, sizeof what, "auto%s%s", c.policy == REMAT_AUTO ? "" : "=",
                     c.policy == REMAT_AUTO ? "" : pass_remat_policy_name(c.policy));
            fmt_secs(base + c.s.cost, t0, sizeof t0);
            fprintf(f, "%-12s %-15s %-5s %14s %11.2f%% %16s\n", b0, what, "yes", b1,
                    100 * c.s.flops / step_flops, t0);
        } else {
            fprintf(f, "%-12s %-15s %-5s %14s %12s %16s\n", b0, "auto", "no", "-", "-", "-");
        }
        pass_remat_sol_free(&c.s);
        for (int k = 0; k < 3; k++) {
            bool fk = fpeak[k] >= 0 && fpeak[k] <= budget;
            pass_remat_fmt_bytes(fpeak[k], b1, sizeof b1);
            fmt_secs(base + fcost[k], t0, sizeof t0);
            if (fk)
                fprintf(f, "%-12s %-15s %-5s %14s %11.2f%% %16s\n", "",
                        pass_remat_policy_name(fixed[k]), "yes", b1,
                        100 * fflops[k] / step_flops, t0);
            else
                fprintf(f, "%-12s %-15s %-5s %14s %12s %16s\n", "",
                        pass_remat_policy_name(fixed[k]), "no", b1, "-", "-");
        }
    }
    pass_remat_prob_free(P);
    if (!out)
        fclose(f);
    return true;
}
