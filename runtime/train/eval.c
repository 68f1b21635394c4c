/* eval.c - evaluation over the whole of a split (train.h's contract): every
 * example once, the last batch padded and masked, exact means. kiln eval
 * and train{eval_batches = "all"} both run it. */
#include "train.h"
#include "dist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A float scalar (f32 or bf16) of e. */
static double read_scalar(Exec *e, const Tensor *t)
{
    float v;
    rt_exec_read_f32(e, t, &v);
    return v;
}

/* One run of the batch b: loss and extras into v[0], v[1..nx]. */
static bool run_once(const RtEvalSpec *sp, const DataBatch *b, double *v, Diag *d)
{
    rt_data_feed(sp->e, sp->g, b, 0);
    if (!rt_exec_run(sp->e, sp->seed, sp->step, d))
        return false;
    v[0] = read_scalar(sp->e, &sp->g->t.v[ir_find_output(sp->g, "loss")]);
    for (int i = 0; i < sp->nx; i++)
        v[1 + i] = sp->x_ids[i] >= 0 ? read_scalar(sp->e, &sp->g->t.v[sp->x_ids[i]]) : NAN;
    return true;
}

/* Accuracy over rows 0..k-1 of the batch just run: into *right, *total. */
static void count_right(const RtEvalSpec *sp, const DataBatch *b, int64_t k, float *logits,
                        double *right, double *total)
{
    const Tensor *lt = sp->logits;
    int64_t V = lt->s.dim[lt->s.rank - 1], T = sp->rowy ? 1 : sp->T;
    rt_exec_read_f32(sp->e, lt, logits);
    for (int64_t row = 0; row < k; row++) {
        bool ok = true;
        for (int64_t t = 0; t < T && ok; t++) {
            int64_t at = row * T + t;
            int32_t want = sp->rowy ? b->y[row] : b->targets[at];
            if (!sp->rowy && b->mask[at] == 0)
                continue;
            ok = rt_argmax(logits + at * V, V) == want;
        }
        *right += ok;
        *total += 1;
    }
}

bool rt_eval_whole(const RtEvalSpec *sp, RtEvalResult *out, Diag *d)
{
    int nx = sp->nx;
    int64_t N = rt_data_examples(sp->ds, sp->split, sp->masked, &out->left_out, d);
    if (N < 0)
        return false;
    if (N == 0) {
        snprintf(d->msg, sizeof d->msg, "no examples to evaluate (expected at least 1, got 0)");
        return false;
    }
    /* s: loss sum, weight, right, total, then the extras' sums */
    double *s = xcalloc((size_t)nx + 4, sizeof *s);
    double *v = xcalloc((size_t)nx + 1, sizeof *v), *v0 = xcalloc((size_t)nx + 1, sizeof *v0);
    float *logits = sp->logits ? xmalloc((size_t)shape_numel(&sp->logits->s) * sizeof *logits)
                               : NULL;
    int64_t nb = (N + sp->B - 1) / sp->B, runs = 0;
    bool ok = true;
    for (int64_t c = sp->rank; c < nb && ok; c += sp->nranks) {
        if (rt_stop_signal()) { /* SIGINT, SIGTERM: a whole split can take long */
            snprintf(d->msg, sizeof d->msg, "stopped by %s during the evaluation",
                     rt_signal_name(rt_stop_signal()));
            ok = false;
            break;
        }
        int64_t first = c * sp->B, k = N - first < sp->B ? N - first : sp->B;
        const DataBatch *b = rt_data_range(sp->ds, sp->split, first, k);
        if (!(ok = run_once(sp, b, v, d)))
            break;
        runs++;
        if (logits)
            count_right(sp, b, k, logits, &s[2], &s[3]);
        if (sp->masked) {
            double w = 0;
            for (int64_t i = 0; i < sp->B * sp->T; i++)
                w += b->mask[i];
            if (w > 0)
                for (int i = 0; i <= nx; i++)
                    s[i ? 3 + i : 0] += w * v[i];
            s[1] += w;
            continue;
        }
        double B = (double)sp->B;
        if (k < sp->B) { /* every row example `first`: its own values */
            b = rt_data_range(sp->ds, sp->split, first, 1);
            if (!(ok = run_once(sp, b, v0, d)))
                break;
            runs++;
        }
        for (int i = 0; i <= nx; i++)
            s[i ? 3 + i : 0] += k < sp->B ? B * v[i] - (B - (double)k) * v0[i] : B * v[i];
        s[1] += (double)k;
    }
    /* every rank reaches this (the same batch count), failed or not: the
     * sums' exchange is one collective for all */
    double *all = xcalloc((size_t)nx + 5, sizeof *all);
    memcpy(all, s, sizeof *s * (size_t)(nx + 4));
    all[nx + 4] = ok ? 0 : 1;
    rt_comm_mean(sp->comm, all, nx + 5);
    int n = sp->nranks > 0 ? sp->nranks : 1;
    for (int i = 0; i < nx + 5; i++)
        all[i] *= n;
    if (ok && all[nx + 4] > 0.5) {
        snprintf(d->msg, sizeof d->msg, "evaluation failed on another rank");
        ok = false;
    }
    if (ok) {
        double w = all[1];
        out->examples = N;
        out->weight = sp->masked ? w : w * (double)sp->T;
        out->loss = w > 0 ? all[0] / w : 0;
        for (int i = 0; i < nx; i++)
            out->x[i] = w > 0 ? all[4 + i] / w : 0;
        out->right = llround(all[2]);
        out->total = llround(all[3]);
        out->runs = runs;
    }
    free(all);
    free(s);
    free(v);
    free(v0);
    free(logits);
    return ok;
}
