/* bench_compile.c - time per pass of `kiln compile` on a model (default:
 * models/gpt.lua at GPT-2 124M, shapes only, nothing allocated).
 *
 *   build/bench/bench_compile [MODEL.lua] [--set k=v ...] [--reps N] [--cpu]
 *
 * Prints the median over N repetitions (default 5) of each stage: loading
 * the Lua script, every pass of the pipeline, memplan and the plan/codegen
 * lowering, and the total. --cpu: the process's CPU time instead of wall
 * time (steadier on a machine that others load; a pass's CPU time then
 * includes the verifier run after it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"

#define MAX_STAGES 32

typedef struct {
    const char *name[MAX_STAGES];
    double t[MAX_STAGES];
    int n;
    bool cpu;    /* record CPU time: since last_cpu */
    double last_cpu;
} Stages;

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void add(Stages *s, const char *name, double t)
{
    if (s->n < MAX_STAGES) {
        s->name[s->n] = name;
        s->t[s->n++] = t;
    }
}

static void hook(const char *pass, const Graph *g, double seconds, void *ctx)
{
    (void)g;
    Stages *s = ctx;
    if (s->cpu) {
        double now = cpu_now();
        seconds = now - s->last_cpu;
        s->last_cpu = now;
    }
    add(s, pass, seconds);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *model = "models/gpt.lua";
    const char *sets[64];
    int nsets = 0, reps = 5;
    bool user_sets = false, cpu = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--set") == 0 && i + 1 < argc && nsets < 64) {
            sets[nsets++] = argv[++i];
            user_sets = true;
        } else if (strcmp(argv[i], "--cpu") == 0) {
            cpu = true;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            model = argv[i];
    }
    if (!user_sets && strcmp(model, "models/gpt.lua") == 0)
        sets[nsets++] = "size=124M";
    if (reps < 1)
        reps = 1;

    Stages *runs = calloc((size_t)reps, sizeof(Stages));
    int nops = 0, nkernels = 0;
    for (int r = 0; r < reps; r++) {
        Stages *s = &runs[r];
        char err[2048];
        Diag d;
        s->cpu = cpu;
        double (*now)(void) = cpu ? cpu_now : ir_now;
        double t0 = now();
        Model *m = fe_load_model(model, sets, nsets, err, sizeof err);
        if (!m) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        add(s, "frontend", now() - t0);
        s->last_cpu = cpu_now();
        PassOpts o;
        pass_opts_default(&o);
        o.memory_budget = m->train.memory_budget;
        MemPlan *mp = NULL; /* memplan ends the pipeline (timed by the hook) */
        o.memplan = &mp;
        Graph *g = ir_clone(m->g);
        if (!pass_pipeline(g, &o, NULL, hook, s, &d)) {
            fprintf(stderr, "%s\n", d.msg);
            return 1;
        }
        double t1 = now();
        CgPlan *p = cg_plan(g, &d);
        if (!p) {
            fprintf(stderr, "%s\n", d.msg);
            return 1;
        }
        add(s, "codegen", now() - t1);
        add(s, "total", now() - t0);
        nops = g->ops.n;
        nkernels = p->kernels.n;
        cg_plan_free(p);
        pass_memplan_free(mp);
        ir_free(g);
        fe_model_free(m);
    }
    printf("kiln compile %s", model);
    for (int i = 0; i < nsets; i++)
        printf(" --set %s", sets[i]);
    printf("\n%d ops in the final graph, %d kernels; median of %d runs (%s time)\n\n", nops,
           nkernels, reps, cpu ? "CPU" : "wall");
    printf("%-12s %10s\n", "stage", "ms");
    double col[256];
    for (int k = 0; k < runs[0].n; k++) {
        for (int r = 0; r < reps; r++)
            col[r] = runs[r].t[k];
        qsort(col, (size_t)reps, sizeof(double), cmp_double);
        printf("%-12s %10.2f\n", runs[0].name[k], 1e3 * col[reps / 2]);
    }
    free(runs);
    return 0;
}
