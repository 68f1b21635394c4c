/* bench_remat.c - the remat pass on GPT-2 124M (shapes only: nothing runs).
 *
 *   bench_remat [MODEL.lua] [--set KEY=VALUE ...] [--sweep]
 *
 * Default: models/gpt.lua with size=124M. Prints the time of pass_remat at
 * a mid budget (halfway between the full policy's peak and the
 * no-recompute peak; goal: under 2 s on the 2-core build machine), what it
 * chose, and with --sweep the budget sweep table. Run from the source root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

static Graph *prepare(const Model *m, PassOpts *po)
{
    rt_pass_opts(&m->train, NULL, po);
    po->memory_budget = 0; /* set per measurement */
    Graph *g = ir_clone(m->g);
    Diag d = {{0}};
    if (!pass_pipeline(g, po, "simplify", NULL, NULL, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        exit(1);
    }
    pass_opts_after(po, "remat"); /* remat plans through the later passes */
    return g;
}

/* Planned arena after remat (policy, budget) and every later pass. */
static int64_t peak_with(const Graph *g0, const PassOpts *base, int policy, int64_t budget,
                         RematReport *rr, double *seconds)
{
    PassOpts po = *base;
    po.remat = policy;
    po.memory_budget = budget;
    po.remat_report = rr;
    Graph *g = ir_clone(g0);
    Diag d = {{0}};
    double t0 = ir_now();
    clock_t c0 = clock();
    if (!pass_remat(g, &po, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        exit(1);
    }
    if (seconds) {
        seconds[0] = ir_now() - t0;
        seconds[1] = (double)(clock() - c0) / CLOCKS_PER_SEC;
    }
    MemPlan *mp = NULL; /* the later passes end with memplan, which hands its plan here */
    po.memplan = &mp;
    for (int i = 0; i < po.nafter; i++)
        if (!po.after[i].run(g, &po, &d)) {
            fprintf(stderr, "%s\n", d.msg);
            exit(1);
        }
    if (!mp)
        die("bench_remat: memplan is not after remat in the pipeline");
    int64_t a = mp->arena_bytes;
    pass_memplan_free(mp);
    ir_free(g);
    return a;
}

int main(int argc, char **argv)
{
    const char *model = "models/gpt.lua";
    const char *sets[32];
    int nsets = 0;
    bool sweep = false, user_sets = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc && nsets < 31) {
            sets[nsets++] = argv[++i];
            user_sets = true;
        } else if (strcmp(argv[i], "--sweep") == 0) {
            sweep = true;
        } else {
            model = argv[i];
        }
    }
    if (!user_sets && strcmp(model, "models/gpt.lua") == 0)
        sets[nsets++] = "size=124M";
    char err[2048];
    Model *m = fe_load_model(model, sets, nsets, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    PassOpts po;
    Graph *g = prepare(m, &po);
    printf("model %s:", model);
    for (int i = 0; i < nsets; i++)
        printf(" %s", sets[i]);
    printf(" (%d ops after simplify)\n", g->ops.n);

    RematReport rr;
    int64_t none = peak_with(g, &po, REMAT_NONE, 0, &rr, NULL);
    int64_t full = peak_with(g, &po, REMAT_FULL, 0, &rr, NULL);
    int64_t mid = full + (none - full) / 2;
    double secs[2];
    int64_t got = peak_with(g, &po, REMAT_AUTO, mid, &rr, secs);
    printf("peaks: none %.3f GiB, full %.3f GiB; mid budget %.3f GiB\n",
           (double)none / (1 << 30), (double)full / (1 << 30), (double)mid / (1 << 30));
    printf("remat at the mid budget: %.3f s wall, %.3f s CPU (goal < 2 s); planned peak %.3f GiB; "
           "chose %s%s; "
           "%d of %d saved activations recomputed; extra %.3f TFLOP/step (%.2f%%)",
           secs[0], secs[1], (double)got / (1 << 30),
           rr.chosen == REMAT_AUTO ? "its own plan" : pass_remat_policy_name(rr.chosen),
           rr.chosen == REMAT_AUTO ? (rr.exact ? " (exact)" : " (heuristic)") : "",
           rr.nrecomputed, rr.nsaved, rr.extra_flops / 1e12,
           100 * rr.extra_flops / ir_graph_flops(g));
    if (rr.chosen == REMAT_AUTO && !rr.exact && rr.gap >= 0)
        printf("; within %.2f%% of the LP bound", 100 * rr.gap);
    printf("\n");
    if (sweep) {
        Diag d = {{0}};
        double t0 = ir_now();
        if (!pass_remat_sweep(g, &po, 8, stdout, NULL, &d)) {
            fprintf(stderr, "%s\n", d.msg);
            return 1;
        }
        printf("sweep: %.2f s\n", ir_now() - t0);
    }
    ir_free(g);
    fe_model_free(m);
    return 0;
}
