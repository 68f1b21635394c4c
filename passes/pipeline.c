/* pipeline.c - the flat list of passes and the driver that runs them. */
#include "passes.h"

#include <string.h>
#include <time.h>

void pass_opts_default(PassOpts *o)
{
    memset(o, 0, sizeof *o);
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->grad_clip = 1.0;
    o->nranks = 1;
}

const Pass pass_list[] = {
    {"autodiff", pass_autodiff},
    {"optimizer", pass_optimizer},
    {"simplify", pass_simplify},
    {"remat", pass_remat},
    {"fuse", pass_fuse},
    {"comm", pass_comm},
    {"schedule", pass_schedule},
};
const int pass_count = (int)(sizeof pass_list / sizeof pass_list[0]);

const Pass *pass_find(const char *name)
{
    for (int i = 0; i < pass_count; i++)
        if (strcmp(pass_list[i].name, name) == 0)
            return &pass_list[i];
    return NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool pass_pipeline(Graph *g, const PassOpts *o, const char *last, PassHook hook,
                   void *ctx, Diag *d)
{
    char err[1024];
    if (!ir_verify(g, err, sizeof err)) {
        snprintf(d->msg, sizeof d->msg, "internal error: the frontend's graph is invalid: %s",
                 err);
        return false;
    }
    for (int i = 0; i < pass_count; i++) {
        double t0 = now();
        if (!pass_list[i].run(g, o, d))
            return false;
        double dt = now() - t0;
        if (!ir_verify(g, err, sizeof err)) {
            snprintf(d->msg, sizeof d->msg,
                     "internal error: the graph is invalid after pass %s: %s",
                     pass_list[i].name, err);
            return false;
        }
        if (hook)
            hook(pass_list[i].name, g, dt, ctx);
        if (last && strcmp(last, pass_list[i].name) == 0)
            break;
    }
    return true;
}
