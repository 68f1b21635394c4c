/* train_eval.c - the training loop's evaluations and samples (declared in
 * train_internal.h): train{eval_every}'s evaluation (a sample of batches,
 * or with eval_batches = "all" the whole validation split), and
 * train{sample_every}'s text; under pipeline stages world rank 0 runs
 * them with the whole model's forward, its params gathered from the
 * stages. */
#include "train_internal.h"
#include "dist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The training params, as they stand, into the evaluation executor. */
static void params_to_eval(Run *r)
{
    rt_train_pull_state(r);
    for (int i = 0; i < r->eg->t.n; i++) {
        const Tensor *t = &r->eg->t.v[i];
        if (t->kind != TK_PARAM && !rt_model_state(t)) /* BatchNorm's running stats too */
            continue;
        int src = ir_find_tensor(r->tg, t->name);
        if (src < 0 || !r->vals[src])
            die("evaluate: param %s missing from the training graph", t->name);
        rt_exec_write(r->ee, i, r->vals[src]);
    }
}

/* The model's evaluation source (its eval graph, dropout off; the training
 * graph where it has none). */
const Graph *rt_train_eval_source(const Model *m) { return m->eval_g ? m->eval_g : m->g; }

/* pp: every stage's params, whole, into r->pe on world rank 0 (a
 * collective of the dp rank 0 ranks: the TP group's parts made whole, then
 * stage 0 gathers the stages', as --save-weights does). True on the rank
 * holding r->pe. */
static bool pp_whole_eval(Run *r)
{
    rt_train_pull_state(r);
    void **wv = r->vals, **ppw = NULL;
    const Graph *wg = r->tpw ? rt_tp_whole(r->tpw, r->comm, r->tg, r->vals, &wv) : r->tg;
    wg = rt_pp_whole(rt_dp_pp(r->dp), wg, wv, &ppw);
    bool here = wg && r->pe;
    for (int i = 0; here && i < r->pg->t.n; i++) {
        const Tensor *t = &r->pg->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        int src = ir_find_tensor(wg, t->name);
        if (src < 0 || !ppw[src])
            die("pp_whole_eval: param %s missing from the stages' whole params", t->name);
        rt_exec_write(r->pe, i, ppw[src]);
    }
    rt_pp_whole_free(rt_dp_pp(r->dp), ppw);
    return here;
}

/* train{eval_batches = "all"} under pp: world rank 0 evaluates the whole
 * split with the whole model's forward (r->pe), alone; the result goes to
 * every rank (over its pipeline, its TP group, its dp group). */
static bool evaluate_all_pp(Run *r, RtEvalResult *res, Diag *d)
{
    int nv = 3 + r->nx;
    double *v = xcalloc((size_t)nv + 1, sizeof *v);
    bool ok = true;
    if (rt_dp_rank(r->dp) == 0 && pp_whole_eval(r)) {
        int lid = ir_find_output(r->pg, "logits");
        const Tensor *lt = lid >= 0 ? &r->pg->t.v[lid] : NULL;
        int *xid = xcalloc((size_t)r->nx + 1, sizeof(int));
        for (int i = 0; i < r->nx; i++)
            xid[i] = ir_find_output(r->pg, r->x_name[i]);
        RtEvalSpec sp = {.g = r->pg, .e = r->pe, .ds = r->ds, .split = DATA_VAL, .B = r->B,
                         .T = r->T, .masked = rt_train_input(r->pg, "mask") && !r->tensors,
                         .nx = r->nx, .x_ids = xid,
                         .logits = lt && (r->addition || r->rowy) ? lt : NULL, .rowy = r->rowy,
                         .comm = NULL, .rank = 0, .nranks = 1, .seed = r->c.seed,
                         .step = r->step};
        res->x = r->x_eval;
        ok = rt_eval_whole(&sp, res, d);
        free(xid);
        v[0] = res->loss, v[1] = (double)res->right, v[2] = (double)res->total;
        for (int i = 0; i < r->nx; i++)
            v[3 + i] = r->x_eval[i];
    }
    if (!ok) { /* the others wait in the broadcast until mpirun stops them */
        free(v);
        return false;
    }
    if (rt_dp_rank(r->dp) == 0 && rt_dp_tp_rank(r->dp) == 0)
        rt_comm_pp_bcast(r->comm, 0, v, sizeof *v * (size_t)nv);
    if (rt_dp_rank(r->dp) == 0)
        rt_comm_tp_bcast(r->comm, v, sizeof *v * (size_t)nv);
    rt_comm_bcast(r->comm, v, sizeof *v * (size_t)nv);
    res->loss = v[0], res->right = llround(v[1]), res->total = llround(v[2]);
    for (int i = 0; i < r->nx; i++)
        r->x_eval[i] = v[3 + i];
    free(v);
    return true;
}

/* train{eval_batches = "all"}: the whole validation split (eval.c), each
 * example once, whatever the batch; the same lines and log as evaluate. */
static bool evaluate_all(Run *r, Diag *d)
{
    double t_start = ir_now();
    RtEvalResult res = {.x = r->x_eval};
    bool acc;
    if (rt_dp_pp(r->dp)) {
        if (!evaluate_all_pp(r, &res, d))
            return false;
        acc = res.total > 0;
    } else {
        params_to_eval(r);
        int lid = ir_find_output(r->eg, "logits");
        const Tensor *lt = lid >= 0 ? &r->eg->t.v[lid] : NULL;
        acc = lt && (r->addition || r->rowy);
        RtEvalSpec sp = {.g = r->eg, .e = r->ee, .ds = r->ds, .split = DATA_VAL, .B = r->B,
                         .T = r->T, .masked = rt_train_input(r->eg, "mask") && !r->tensors,
                         .nx = r->nx, .x_ids = r->x_e, .logits = acc ? lt : NULL,
                         .rowy = r->rowy, .comm = r->comm, .rank = rt_dp_rank(r->dp),
                         .nranks = rt_dp_size(r->dp), .seed = r->c.seed, .step = r->step};
        if (!rt_eval_whole(&sp, &res, d))
            return false;
        acc = acc && res.total > 0;
    }
    r->last_val_loss = res.loss;
    r->have_val = true;
    if (acc) {
        r->have_acc = true;
        r->acc_right = res.right;
        r->acc_total = res.total;
        r->last_acc = (double)res.right / (double)res.total;
    }
    if (!rt_runlog_eval(r->log, r->step, r->last_val_loss, r->x_name, r->x_eval, r->nx,
                        acc ? r->last_acc : NAN, d))
        return rt_train_log_failed(r, d);
    rt_train_phase(r, PH_EVAL, t_start, ir_now());
    return true;
}

/* train{eval_batches = "all"} on a source without a whole split (blobs;
 * addition with more than 3 digits): refused before the first step. */
bool rt_train_check_eval_all(Run *r, Diag *d)
{
    int64_t left;
    const Graph *eg = r->eg ? r->eg : rt_train_eval_source(r->m);
    if (rt_data_examples(r->ds, DATA_VAL, rt_train_input(eg, "mask") && !r->tensors, &left,
                         d) >= 0)
        return true;
    char msg[sizeof d->msg];
    snprintf(msg, sizeof msg, "%s", d->msg);
    snprintf(d->msg, sizeof d->msg, "%s:%d: train{eval_batches = \"all\"}: %.1800s", r->m->path,
             r->m->train_line, msg);
    return false;
}

bool rt_train_evaluate(Run *r, Diag *d)
{
    if (r->c.eval_batches == TRAIN_EVAL_ALL)
        return evaluate_all(r, d);
    double t_start = ir_now();
    RtPp *pp = rt_dp_pp(r->dp); /* pipeline stages: the loss only, through the stages */
    if (!pp)
        params_to_eval(r);
    int lid = pp ? -1 : ir_find_output(r->eg, "logits");
    const Tensor *lt = lid >= 0 ? &r->eg->t.v[lid] : NULL;
    bool acc = lt && (r->addition || r->rowy);
    bool masked = !pp && rt_train_input(r->eg, "mask") != NULL && !r->tensors;
    int64_t V = lt ? lt->s.dim[lt->s.rank - 1] : 0;
    float *logits = acc ? xmalloc((size_t)shape_numel(&lt->s) * sizeof *logits) : NULL;
    int64_t nb = r->c.eval_batches > 0 ? r->c.eval_batches : 1;
    int64_t K = rt_dp_rows_factor(r->dp) / rt_dp_size(r->dp);
    int64_t base = (int64_t)rt_dp_rank(r->dp) * K * r->B;
    int n = rt_dp_size(r->dp);
    int64_t cn = nb < EVAL_CHUNK ? nb : EVAL_CHUNK;
    /* v: per batch of the chunk (slot j) the weighted loss sum and the
     * weight sum, then right and total; summed over ranks at its end */
    double *v = xcalloc((size_t)(2 * cn + 2), sizeof *v);
    double *xs = xcalloc((size_t)r->nx + 1, sizeof *xs); /* extra scalars' sums */
    double loss = 0;
    int64_t right = 0, total = 0;
    for (int64_t k = 0; k < nb; k++) {
        int64_t j = k % cn;
        const DataBatch *b = rt_data_batch(r->ds, DATA_VAL, k);
        for (int64_t piece = 0; piece < K; piece++) {
            int64_t row0 = base + piece * r->B;
            float pl = 0;
            if (pp ? !rt_pp_eval(pp, r->te, r->tg, b, row0, r->c.seed, r->step, &pl, d)
                   : (rt_data_feed(r->ee, r->eg, b, row0), !rt_exec_run(r->ee, r->c.seed, r->step, d))) {
                free(logits);
                free(v);
                free(xs);
                return false;
            }
            double w = (double)r->B;
            if (masked) {
                w = 0;
                for (int64_t i = 0; i < r->B * r->T; i++)
                    w += b->mask[row0 * r->T + i];
            }
            if (w > 0)
                v[2 * j] += w * (pp ? pl : rt_train_read_loss(r->ee, r->eg));
            v[2 * j + 1] += w;
            for (int i = 0; i < r->nx; i++) {
                float x = NAN;
                if (r->x_e[i] >= 0 && !pp)
                    rt_exec_read_f32(r->ee, &r->eg->t.v[r->x_e[i]], &x);
                xs[i] += x;
            }
            if (!acc)
                continue;
            rt_exec_read_f32(r->ee, lt, logits);
            for (int64_t row = 0; row < r->B; row++) {
                bool ok = true;
                for (int64_t t = 0; t < r->T && ok; t++) {
                    int64_t at = row * r->T + t, gat = row0 * r->T + at;
                    int32_t want = r->rowy ? b->y[row0 + row] : b->targets[gat];
                    if (!r->rowy && b->mask[gat] == 0)
                        continue;
                    ok = rt_argmax(logits + at * V, V) == want;
                }
                v[2 * cn] += ok;
                v[2 * cn + 1]++;
            }
        }
        if (j == cn - 1 || k == nb - 1) { /* the chunk's end */
            rt_comm_mean(r->comm, v, (int)(2 * cn + 2));
            for (int64_t i = 0; i <= j; i++)
                loss += v[2 * i + 1] > 0 ? v[2 * i] / v[2 * i + 1] : 0;
            right += llround(v[2 * cn] * n);
            total += llround(v[2 * cn + 1] * n);
            memset(v, 0, sizeof *v * (size_t)(2 * cn + 2));
        }
    }
    free(logits);
    r->last_val_loss = loss / (double)nb;
    r->have_val = true;
    if (r->nx) { /* means over batches, pieces and ranks */
        rt_comm_mean(r->comm, xs, r->nx);
        for (int i = 0; i < r->nx; i++)
            r->x_eval[i] = xs[i] / (double)(nb * K);
    }
    free(xs);
    if (acc) {
        r->have_acc = true;
        r->acc_right = right;
        r->acc_total = total;
        r->last_acc = (double)r->acc_right / (double)r->acc_total;
    }
    free(v);
    if (!rt_runlog_eval(r->log, r->step, r->last_val_loss, r->x_name, r->x_eval, r->nx,
                        acc ? r->last_acc : NAN, d))
        return rt_train_log_failed(r, d);
    rt_train_phase(r, PH_EVAL, t_start, ir_now());
    return true;
}

/* train{sample_every}: "sample STEP | TEXT" on rank 0 (sample.c); the
 * evaluation executor's inputs are fed again by the next evaluation. */
bool rt_train_sample_now(Run *r, bool tty, Diag *d)
{
    RtPp *pp = rt_dp_pp(r->dp);
    /* pp: the ranks of dp rank 0 gather the params whole on world rank 0,
     * which samples with the whole model's forward (r->pe) */
    if (rt_dp_rank(r->dp) != 0 || (r->o->quiet && !(pp ? r->o->log_dir != NULL : r->log != NULL)))
        return true;
    if (pp && !pp_whole_eval(r))
        return true;
    if (!pp)
        params_to_eval(r);
    char *text = rt_train_sample(pp ? r->pe : r->ee, pp ? r->pg : r->eg, &r->c, r->step,
                                 false, d);
    if (!text)
        return false;
    if (!r->o->quiet) {
        printf("%ssample %5lld | %s\n", tty ? "\r\033[K" : "", (long long)r->step, text);
        fflush(stdout);
    }
    rt_runlog_sample(r->log, r->step, text);
    free(text);
    return true;
}
