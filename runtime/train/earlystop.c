/* earlystop.c - train{early_stop} and train{keep_best} (train_internal.h):
 * after each evaluation, the metric against the best so far; keep_best
 * writes the checkpoint of the best evaluation to PREFIX.best.safetensors
 * (beside the latest PREFIX.stepN.safetensors); early_stop ends the run
 * when `patience` evaluations in a row brought no improvement of more than
 * min_delta. The metric is the same on every rank (evaluations average
 * over the ranks), so every rank decides alike. */
#include "train_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct RtEarlyStop {
    const char *metric;   /* "val_loss", "accuracy" or an extra scalar's name */
    int x;                /* its index in r->x_name; -1: val_loss, accuracy, or not yet
                             looked up */
    bool maximize;
    bool stop_on;         /* early_stop given (else keep_best alone) */
    int64_t patience;
    double min_delta;
    char *best_path;      /* keep_best: PREFIX.best.safetensors; NULL: none */
    double best;          /* NaN before the first finite value */
    int64_t best_step;
    int64_t bad;          /* evaluations since the last improvement */
    int64_t stopped_at;   /* the step early stopping ended the run; -1: it did not */
    int64_t last_step;    /* of the last evaluation seen; -1: none */
};

static bool cfg_error(const Run *r, Diag *d, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool cfg_error(const Run *r, Diag *d, const char *fmt, ...)
{
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->m->train_line > 0)
        snprintf(d->msg, sizeof d->msg, "%s:%d: train: %s", r->m->path, r->m->train_line, msg);
    else
        snprintf(d->msg, sizeof d->msg, "%s: train: %s", r->m->path, msg);
    return false;
}

static bool on(const char *s) { return s && strcmp(s, "true") == 0; }

bool rt_es_open(Run *r, const char *ckpt, Diag *d)
{
    const TrainCfg *c = &r->c;
    /* early_stop_metric "" (--set early_stop_metric=): off */
    bool keep = on(c->keep_best), stop = c->early_stop_metric && *c->early_stop_metric;
    if (!keep && !stop)
        return true;
    const char *metric = stop ? c->early_stop_metric : "val_loss";
    const char *what = stop ? "early_stop" : "keep_best";
    if (!rt_data_has_val(r->ds))
        return cfg_error(r, d, "%s needs a validation split to evaluate %s on (expected "
                         "val_fraction > 0 or val_path, got none)", what, metric);
    if (stop && c->eval_every <= 0)
        return cfg_error(r, d, "early_stop needs evaluations during the run (expected "
                         "eval_every > 0, got %lld)", (long long)c->eval_every);
    if (keep && !ckpt)
        return cfg_error(r, d, "keep_best needs a checkpoint prefix for PREFIX.best.safetensors "
                         "(expected --checkpoint PREFIX or train{checkpoint = PREFIX}, got none)");
    const Graph *g = r->m->g, *eg = r->m->eval_g ? r->m->eval_g : g;
    if (strcmp(metric, "accuracy") == 0) {
        if (ir_find_output(eg, "logits") < 0 || !(r->addition || r->rowy))
            return cfg_error(r, d, "early_stop: metric \"accuracy\" needs the held-out accuracy, "
                             "which this model and data do not give (an output \"logits\" with "
                             "data addition, blobs or tensors with labels y)");
    } else if (strcmp(metric, "val_loss") != 0) {
        /* the extra scalar outputs (train.c's find_extra_scalars) */
        char list[512] = "val_loss, accuracy";
        size_t k = strlen(list);
        bool found = false, in_eval = false;
        for (int i = 0; i < g->outs.n; i++) {
            const char *name = g->outs.v[i].name;
            const Shape *s = &g->t.v[g->outs.v[i].t].s;
            if (strcmp(name, "loss") == 0 || shape_numel(s) != 1 ||
                (s->dtype != DT_F32 && s->dtype != DT_BF16))
                continue;
            if (k < sizeof list)
                k += (size_t)snprintf(list + k, sizeof list - k, ", %s", name);
            if (strcmp(name, metric) == 0)
                found = true, in_eval = ir_find_output(eg, name) >= 0;
        }
        if (!found)
            return cfg_error(r, d, "early_stop: metric \"%s\" is not a scalar output of the "
                             "model (expected one of %s)", metric, list);
        if (!in_eval)
            return cfg_error(r, d, "early_stop: metric \"%s\" is not computed by the evaluation "
                             "graph (nn.training = false drops it; expected one of %s)", metric,
                             list);
    }
    RtEarlyStop *es = xcalloc(1, sizeof *es);
    es->metric = metric;
    es->x = -1;
    const char *mode = c->early_stop_mode ? c->early_stop_mode : "auto";
    es->maximize = strcmp(mode, "max") == 0 ||
                   (strcmp(mode, "auto") == 0 && strcmp(metric, "accuracy") == 0);
    es->stop_on = stop;
    es->patience = c->early_stop_patience > 0 ? c->early_stop_patience : 1;
    es->min_delta = c->early_stop_min_delta;
    es->best = NAN;
    es->best_step = -1;
    es->stopped_at = -1;
    es->last_step = -1;
    if (keep) {
        size_t n = strlen(ckpt), e = strlen(".safetensors");
        int kp = (int)(n > e && strcmp(ckpt + n - e, ".safetensors") == 0 ? n - e : n);
        es->best_path = xasprintf("%.*s.best.safetensors", kp, ckpt);
        if (rt_dp_rank(r->dp) == 0) /* what a killed write of it left */
            rt_tmp_sweep(es->best_path, NULL);
    }
    r->es = es;
    return true;
}

static double metric_value(const Run *r, RtEarlyStop *es)
{
    for (int i = 0; i < r->nx && es->x < 0; i++) /* an extra scalar: its index, once */
        if (strcmp(r->x_name[i], es->metric) == 0)
            es->x = i;
    if (es->x >= 0)
        return r->x_eval[es->x];
    if (strcmp(es->metric, "accuracy") == 0)
        return r->have_acc ? r->last_acc : NAN;
    return r->last_val_loss;
}

bool rt_es_after_eval(Run *r, bool *stop, Diag *d)
{
    *stop = false;
    RtEarlyStop *es = r->es;
    if (!es || es->last_step == r->step) /* none, or this step's evaluation again */
        return true;
    es->last_step = r->step;
    double v = metric_value(r, es);
    bool better = isfinite(v) &&
                  (isnan(es->best) || (es->maximize ? v > es->best + es->min_delta
                                                    : v < es->best - es->min_delta));
    if (!better) {
        if (es->stop_on && ++es->bad >= es->patience) {
            *stop = true;
            es->stopped_at = r->step;
            if (!r->o->quiet)
                printf("early stop at step %lld: %s has not improved by more than %g for %lld "
                       "evaluation%s (best %.6g at step %lld)\n", (long long)r->step, es->metric,
                       es->min_delta, (long long)es->bad, es->bad > 1 ? "s" : "", es->best,
                       (long long)es->best_step);
        }
        return true;
    }
    es->best = v;
    es->best_step = r->step;
    es->bad = 0;
    if (!es->best_path)
        return true;
    if (!rt_train_save_ckpt(r, es->best_path, d))
        return false;
    if (!r->o->quiet && rt_dp_rank(r->dp) == 0)
        printf("best checkpoint: %s (%s %.6g at step %lld)\n", es->best_path, es->metric, v,
               (long long)r->step);
    return true;
}

void rt_es_summary(const Run *r, FILE *f)
{
    const RtEarlyStop *es = r->es;
    if (!es || es->best_step < 0)
        return;
    fprintf(f, " | best %s %.9g at step %lld", es->metric, es->best, (long long)es->best_step);
    if (es->stopped_at >= 0)
        fprintf(f, " (stopped early at step %lld)", (long long)es->stopped_at);
}

void rt_es_free(RtEarlyStop *es)
{
    if (!es)
        return;
    free(es->best_path);
    free(es);
}
