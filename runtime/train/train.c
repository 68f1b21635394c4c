/* train.c - the training loop: build the training and evaluation graphs,
 * initialise or restore params, feed data, set the learning rate, run steps,
 * evaluate, checkpoint and report. The data settings and source are
 * train_data.c's; the Run both share is train_internal.h's. */
#include "train_internal.h"
#include "cpu.h"
#include "dist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>


double rt_lr_at(const TrainCfg *c, int64_t step, int64_t steps)
{
    if (c->warmup > 0 && step < c->warmup)
        return c->lr * (double)(step + 1) / (double)c->warmup;
    const char *sch = c->lr_schedule ? c->lr_schedule : "cosine";
    if (strcmp(sch, "constant") == 0)
        return c->lr;
    int64_t from = c->warmup; /* where the decay starts */
    if (strcmp(sch, "wsd") == 0) {
        int64_t dec = (int64_t)ceil(c->decay_fraction * (double)steps);
        if (steps - dec > from)
            from = steps - dec;
        if (step < from)
            return c->lr;
    }
    int64_t span = steps - from;
    double p = span > 0 ? (double)(step - from) / (double)span : 1.0;
    if (p > 1)
        p = 1;
    if (strcmp(sch, "cosine") == 0)
        return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(3.14159265358979323846 * p));
    return c->lr - (c->lr - c->min_lr) * p; /* linear, wsd's decay */
}

/* ---- host values in a tensor's dtype ---- */

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static size_t tensor_bytes(const Tensor *t)
{
    return (size_t)shape_numel(&t->s) * (size_t)dtype_size(t->s.dtype);
}

/* train.h */
int64_t rt_argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t c = 1; c < n; c++)
        if (x[c] > x[best])
            best = c;
    return best;
}

/* train.h */
void rt_exec_read_f32(Exec *e, const Tensor *t, float *out)
{
    int64_t n = shape_numel(&t->s);
    if (t->s.dtype == DT_F32) {
        rt_exec_read(e, t->id, out);
        return;
    }
    if (t->s.dtype != DT_BF16)
        die("rt_exec_read_f32: tensor %d has dtype %s", t->id, dtype_name(t->s.dtype));
    uint16_t *h = xmalloc((size_t)n * 2);
    rt_exec_read(e, t->id, h);
    for (int64_t i = 0; i < n; i++)
        out[i] = bf16_to_f32(h[i]);
    free(h);
}

/* Writes n floats to a float tensor of e. */
static void write_f32(Exec *e, const Tensor *t, const float *v)
{
    int64_t n = shape_numel(&t->s);
    if (t->s.dtype == DT_F32) {
        rt_exec_write(e, t->id, v);
        return;
    }
    if (t->s.dtype != DT_BF16)
        die("write_f32: tensor %d has dtype %s", t->id, dtype_name(t->s.dtype));
    uint16_t *h = xmalloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = f32_to_bf16(v[i]);
    rt_exec_write(e, t->id, h);
    free(h);
}

/* Fills a param or state buffer from its ParamInit, from a stream that
 * depends only on the seed and the tensor's name (not on declaration order). */
static bool init_tensor(const Tensor *t, uint64_t seed, void *dst, Diag *d)
{
    if (t->shard.on && t->shard.n > 1) {
        /* rank r's part of the whole param's values: every layout starts
         * from the same weights */
        Tensor w = *t;
        w.s = ir_shard_whole(&t->shard, &t->s);
        w.shard.on = false;
        void *all = xmalloc((size_t)shape_bytes(&w.s) + 1);
        bool ok = init_tensor(&w, seed, all, d);
        if (ok)
            ir_shard_extract(&t->shard, &w.s, (size_t)dtype_size(t->s.dtype), all, dst);
        free(all);
        return ok;
    }
    int64_t n = shape_numel(&t->s);
    uint64_t s = ir_rand_mix(seed ^ hash_bytes(t->name, strlen(t->name), 0x696e6974ull));
    float *f = xmalloc((size_t)n * sizeof *f + 1);
    for (int64_t i = 0; i < n; i++) {
        double v = 0;
        switch (t->init.kind) {
        case INIT_NONE:
        case INIT_ZEROS: v = 0; break;
        case INIT_ONES: v = 1; break;
        case INIT_UNIFORM:
            v = t->init.a + (t->init.b - t->init.a) *
                                (double)(ir_rand_mix(s + 2 * (uint64_t)i) >> 11) * 0x1p-53;
            break;
        case INIT_NORMAL: {
            double u1 = (double)((ir_rand_mix(s + 2 * (uint64_t)i) >> 11) + 1) * 0x1p-53;
            double u2 = (double)(ir_rand_mix(s + 2 * (uint64_t)i + 1) >> 11) * 0x1p-53;
            v = t->init.a * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
            break;
        }
        }
        f[i] = (float)v;
    }
    bool ok = true;
    switch (t->s.dtype) {
    case DT_F32: memcpy(dst, f, (size_t)n * 4); break;
    case DT_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = f32_to_bf16(f[i]);
        break;
    default:
        if (t->init.kind == INIT_NONE || t->init.kind == INIT_ZEROS) {
            memset(dst, 0, tensor_bytes(t));
        } else {
            snprintf(d->msg, sizeof d->msg,
                     "cannot initialise %s \"%s\" of dtype %s (expected f32 or bf16)",
                     ir_kind_name(t->kind), t->name, dtype_name(t->s.dtype));
            ok = false;
        }
    }
    free(f);
    return ok;
}

/* ---- the run ---- */

static const char *ph_names[PH__N] = {"data + inputs", "step (exec)", "evaluation",
                                      "checkpoint"};

void rt_train_phase(Run *r, int ph, double t_start, double t_end)
{
    r->ph_ms[ph] += 1e3 * (t_end - t_start);
    r->ph_calls[ph]++;
    rt_trace_event(r->trace, ph_names[ph], "train", 1e6 * (t_start - r->t0),
                   1e6 * (t_end - t_start), 0);
}

float rt_train_read_loss(Exec *e, const Graph *g)
{
    int id = ir_find_output(g, "loss");
    float v;
    rt_exec_read_f32(e, &g->t.v[id], &v);
    return v;
}

/* Why the step just run left params and optimizer state as they were, into
 * why ("loss is nan", "gradient norm is inf", "lr is inf"); false for a step
 * that updated. The optimizer pass applies a step only when the loss, the
 * global gradient norm (from the all-reduced gradients; a non-finite loss on
 * any rank or micro-batch makes it NaN) and lr are finite, so every rank
 * reaches the same verdict; loss is the mean over ranks and micro-batches. */
static bool step_not_applied(Run *r, float loss, float lr, char *why, size_t n)
{
    int id = ir_find_output(r->tg, "grad_norm");
    float norm = 0;
    if (id >= 0)
        rt_exec_read_f32(r->te, &r->tg->t.v[id], &norm);
    const char *what = !isfinite(loss) ? "loss" : !isfinite(norm) ? "gradient norm" : "lr";
    float v = !isfinite(loss) ? loss : !isfinite(norm) ? norm : lr;
    if (isfinite(v))
        return false;
    snprintf(why, n, "%s is %s", what, isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    return true;
}

/* The first param or optimizer state (host copies) holding a non-finite
 * value, or NULL. */
static const char *nonfinite_state(const Run *r)
{
    for (int i = 0; i < r->tg->t.n; i++) {
        const Tensor *t = &r->tg->t.v[i];
        if (!r->vals[i] || (t->kind != TK_PARAM && t->kind != TK_STATE))
            continue;
        int64_t n = shape_numel(&t->s);
        for (int64_t k = 0; k < n; k++) {
            float f;
            if (t->s.dtype == DT_F32)
                memcpy(&f, (const char *)r->vals[i] + 4 * k, 4);
            else if (t->s.dtype == DT_BF16)
                f = bf16_to_f32(((const uint16_t *)r->vals[i])[k]);
            else
                break;
            if (!isfinite(f))
                return t->name;
        }
    }
    return NULL;
}

/* Host copies of tg's params and state <- the training executor (views of
 * its arena: only its last run settled). */
void rt_train_pull_state(Run *r)
{
    if (r->vals_view) {
        rt_exec_settle(r->te);
        return;
    }
    for (int i = 0; i < r->tg->t.n; i++)
        if (r->vals[i])
            rt_exec_read(r->te, i, r->vals[i]);
}

static void push_state(Run *r)
{
    for (int i = 0; i < r->tg->t.n && !r->vals_view; i++)
        if (r->vals[i])
            rt_exec_write(r->te, i, r->vals[i]);
}

/* Validation loss (and exact-match accuracy where the task has one) over
 * eval_batches fixed validation batches, with the current params.
 *
 * The validation batch is the global one (ranks x grad_accum x b rows, as
 * in training): rank r evaluates its rows [r*K*b, (r+1)*K*b) in K pieces of
 * b, and the ranks sum their pieces, so N ranks at batch b report what one
 * rank at batch N*K*b reports. A piece's loss is a mean over its tokens
 * (nn.cross_entropy): with a "mask" input it is weighted by its mask sum,
 * else by its rows; a batch whose weights sum to 0 has loss 0, as
 * sum(mask*nll) / max(sum(mask), 1) gives. Accuracy counts are summed.
 * Batches are read one at a time; their sums go over the ranks EVAL_CHUNK
 * batches at a time (the same values, added in the same order, as all at
 * once). */
/* The model's outputs other than "loss" that are float scalars (one
 * element, f32 or bf16), in declaration order: an auxiliary loss, the terms
 * of a total. Registered with dp so micro-batches and ranks average them. */
static void find_extra_scalars(Run *r)
{
    const Graph *g = r->m->g;
    r->x_name = xcalloc((size_t)g->outs.n + 1, sizeof *r->x_name);
    r->x_t = xcalloc((size_t)g->outs.n + 1, sizeof *r->x_t);
    r->x_e = xcalloc((size_t)g->outs.n + 1, sizeof *r->x_e);
    for (int i = 0; i < g->outs.n; i++) {
        const char *name = g->outs.v[i].name;
        const Shape *s = &g->t.v[g->outs.v[i].t].s;
        if (strcmp(name, "loss") == 0 || shape_numel(s) != 1 ||
            (s->dtype != DT_F32 && s->dtype != DT_BF16))
            continue;
        int t = ir_find_output(r->tg, name);
        if (t < 0)
            continue;
        r->x_name[r->nx] = name;
        r->x_t[r->nx] = t;
        r->x_e[r->nx] = r->eg ? ir_find_output(r->eg, name) : -1;
        r->nx++;
    }
    r->x_val = xcalloc((size_t)r->nx + 1, sizeof *r->x_val);
    r->x_eval = xcalloc((size_t)r->nx + 1, sizeof *r->x_eval);
    rt_dp_set_scalars(r->dp, r->x_name, r->nx);
}

/* " | NAME VALUE" for each extra scalar (vals: floats, or doubles when
 * dv), into buf. */
static void fmt_extras(const Run *r, const float *fv, const double *dv, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < r->nx && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, " | %s %.6f", r->x_name[i],
                              dv ? dv[i] : (double)fv[i]);
}

static char *ckpt_path(const char *prefix, int64_t step)
{
    size_t n = strlen(prefix);
    const char *ext = ".safetensors";
    int keep = (int)n;
    if (n > strlen(ext) && strcmp(prefix + n - strlen(ext), ext) == 0)
        keep = (int)(n - strlen(ext));
    return xasprintf("%.*s.step%lld.safetensors", keep, prefix, (long long)step);
}

bool rt_train_log_failed(const Run *r, Diag *d)
{
    const char *ckpt = r->o->checkpoint ? r->o->checkpoint : r->c.checkpoint;
    size_t k = strlen(d->msg);
    k += (size_t)snprintf(d->msg + k, sizeof d->msg - k, "; the run stops at step %lld",
                          (long long)r->step);
    if (ckpt && r->ckpt_step >= 0) {
        char *path = ckpt_path(ckpt, r->ckpt_step);
        snprintf(d->msg + k, sizeof d->msg - k, " (last checkpoint %s, kept)", path);
        free(path);
    } else if (ckpt && k < sizeof d->msg) {
        snprintf(d->msg + k, sizeof d->msg - k, " (no checkpoint written yet)");
    }
    return false;
}

static bool save_checkpoint(Run *r, const char *prefix, Diag *d)
{
    char *p = ckpt_path(prefix, r->step);
    bool ok = rt_train_save_ckpt(r, p, d);
    if (ok)
        r->ckpt_step = r->step;
    if (ok && !r->o->quiet && rt_dp_rank(r->dp) == 0)
        printf("checkpoint: %s\n", p);
    free(p);
    return ok;
}

bool rt_train_save_ckpt(Run *r, const char *p, Diag *d)
{
    void **vals = r->vals;
    const Graph *g = r->tg;
    if (r->zero) { /* every rank's shard of the moments, to the file's form */
        rt_train_pull_state(r);
        rt_zero_gather(r->zero, r->comm, r->vals);
        g = rt_zero_full(r->zero, r->vals, &vals);
    }
    if (rt_dp_rank(r->dp) != 0)
        return true; /* every dp group holds the same params */
    double t_start = ir_now();
    if (!r->zero)
        rt_train_pull_state(r);
    if (r->tpw) { /* the TP group's parts, whole */
        g = rt_tp_whole(r->tpw, r->comm, g, vals, &vals);
        if (rt_dp_tp_rank(r->dp) != 0)
            return true;
    }
    void **ppw = NULL;
    if (rt_dp_pp(r->dp) && !(g = rt_pp_ckpt_whole(rt_dp_pp(r->dp), g, vals, &ppw)))
        return true; /* stage 0 writes every stage's tensors */
    if (ppw)
        vals = ppw;
    const char *bad = nonfinite_state(r);
    if (bad) {
        snprintf(d->msg, sizeof d->msg,
                 "training diverged by step %lld: \"%s\" is not finite (an update "
                 "overflowed: try a lower lr); no checkpoint written",
                 (long long)r->step, bad);
        return false;
    }
    CkptMeta m = {.step = r->step, .data_pos = r->data_pos, .seed = r->c.seed};
    bool ok = rt_ckpt_save(p, g, vals, &m, d);
    rt_pp_ckpt_free(rt_dp_pp(r->dp), ppw);
    rt_train_phase(r, PH_CKPT, t_start, ir_now());
    return ok;
}

/* Fails early, before any training, when an output's directory cannot take
 * the file (the atomic writers still check everything at write time). */
static bool writable_dir(const char *path, Diag *d)
{
    if (!path)
        return true;
    char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir] = 0;
    bool ok = access(slash ? dir : ".", W_OK | X_OK) == 0;
    if (!ok)
        snprintf(d->msg, sizeof d->msg, "%s: cannot write: directory %s is missing or not "
                 "writable", path, slash ? dir : ".");
    free(dir);
    return ok;
}

/* " | ends 14:05 UTC (in 1h02m)": the projected end of the run's own
 * steps at the median step time so far (several ranks: runs are long). */
static void fmt_eta(char *buf, size_t n, double median_ms, int64_t left)
{
    double s = median_ms * 1e-3 * (double)left;
    time_t end = time(NULL) + (time_t)s;
    struct tm tm;
    char at[32] = "?";
    if (gmtime_r(&end, &tm))
        strftime(at, sizeof at, s >= 86400 ? "%Y-%m-%d %H:%M UTC" : "%H:%M UTC", &tm);
    long long m = (long long)(s / 60);
    if (m >= 60)
        snprintf(buf, n, " | ends %s (in %lldh%02lldm)", at, m / 60, m % 60);
    else
        snprintf(buf, n, " | ends %s (in %lldm%02llds)", at, m, (long long)s % 60);
}

static void step_time_add(StepTimes *t, double x)
{
    if (t->seen++ % t->stride)
        return;
    if (!t->ms)
        t->ms = xcalloc((size_t)STEP_TIMES_MAX, sizeof *t->ms);
    if (t->n == STEP_TIMES_MAX) {
        for (int64_t i = 0; i < t->n / 2; i++)
            t->ms[i] = t->ms[2 * i];
        t->n /= 2;
        t->stride *= 2;
    }
    t->ms[t->n++] = x;
}

/* Throughput's unit: tokens where the data has a token axis, else
 * examples (r->tok_per_row); per_step counts it for one step. */
static const char *tput_unit(const Run *r)
{
    return r->tok_per_row > 0 ? "tok/s" : "ex/s";
}

/* The run was stopped by sig (rt_dp_stop) after its current step: the
 * summary line into d (rank 0; empty on the others). */
static void stop_summary(Run *r, int sig, float loss, int64_t per_step, const char *ckpt,
                         Diag *d)
{
    d->msg[0] = 0;
    if (rt_dp_world_rank(r->dp) != 0)
        return;
    char *p = d->msg;
    size_t n = sizeof d->msg, k;
    k = (size_t)snprintf(p, n, "kiln: stopped by %s at step %lld/%lld", rt_signal_name(sig),
                         (long long)r->step, (long long)r->steps);
    if (r->times.n && isfinite(loss))
        k += (size_t)snprintf(p + k, n - k, ": train loss %.9g", (double)loss);
    else
        k += (size_t)snprintf(p + k, n - k, ": no step ran");
    if (r->times.n) {
        double med = ir_median(r->times.ms, r->times.n);
        k += (size_t)snprintf(p + k, n - k, " | median %.2f ms/step | %.0f %s", med,
                              (double)per_step / (med * 1e-3), tput_unit(r));
    }
    if (r->have_val)
        k += (size_t)snprintf(p + k, n - k, " | last val loss %.9g", r->last_val_loss);
    if (ckpt && r->ckpt_step >= 0) {
        char *path = ckpt_path(ckpt, r->ckpt_step);
        snprintf(p + k, n - k, " | last checkpoint %s", path);
        free(path);
    } else if (ckpt) {
        snprintf(p + k, n - k, " | no checkpoint written");
    }
}

/* A step that ran r->flops (every op, recomputations included) faster
 * than the peak: an MFU over 100% is never printed. The measured CPU peak
 * is measured again the first time (rt_cpu_fma_remeasure: the best of
 * repeated tries), and is never left below the step's rate; the cache keeps
 * the higher peak. A peak given by --peak-gflops or a GPU's table becomes
 * the step's rate. */
static void check_peak(Run *r, double step_ms)
{
    double rate = r->flops / (step_ms * 1e-3) / 1e9; /* GFLOP/s */
    if (!(r->peak_gflops > 0) || !(rate > r->peak_gflops) || !isfinite(rate))
        return;
    double old = r->peak_gflops, f32 = 0;
    Diag md = {{0}};
    bool cpu = r->peak_threads != 0, again = r->peak_threads > 0;
    int th = r->peak_threads > 0 ? r->peak_threads : -r->peak_threads;
    if (cpu && rt_cpu_fma_remeasure(th, r->o->cache_dir, rate * 1e9, again, r->o->verbose, &f32,
                                    &md))
        r->peak_gflops = f32 / 1e9;
    else
        r->peak_gflops = rate;
    if (again)
        r->peak_threads = -th;
    if (rt_dp_world_rank(r->dp) == 0 && !r->o->quiet)
        fprintf(stderr, "kiln: step %lld ran at %.1f GFLOP/s, above the peak of %.1f GFLOP/s "
                        "MFU was against; MFU is now against %.1f GFLOP/s (%s)\n",
                (long long)r->step, rate, old, r->peak_gflops,
                again && r->peak_gflops > rate ? "the FMA peak measured again: the best of "
                                                 "repeated tries, cached"
                : again ? "the FMA peak measured again was lower still: the step's own rate, "
                          "cached"
                : cpu   ? "the step's own rate, cached"
                        : "the step's own rate");
}

/* MFU counts the model's FLOPs (the step without recomputation), HFU the
 * hardware's (flops: every op of the step, recomputations included). */
static void fmt_mfu(char *buf, size_t n, double flops, const Graph *g, double ms,
                    double peak_gflops)
{
    double model = flops - pass_remat_flops(g);
    if (peak_gflops > 0 && ms > 0)
        snprintf(buf, n, "MFU %.1f%% of %.0f GFLOP/s, HFU %.1f%%",
                 100.0 * model / (ms * 1e-3) / (peak_gflops * 1e9), peak_gflops,
                 100.0 * flops / (ms * 1e-3) / (peak_gflops * 1e9));
    else
        snprintf(buf, n, "MFU n/a (no known peak: --peak-gflops), HFU n/a");
}

/* The status line on a terminal, rewritten in place (at most ten times a
 * second): step/total, loss and the extra scalars, then tokens/s, MFU and
 * the time left at the median step time so far, within the terminal's
 * width. The time left always stays: on a narrow terminal the extra
 * scalars go first, then MFU, then the throughput, then the head is cut
 * before the time left. */
static void progress(Run *r, float loss, const char *extras, int64_t per_step)
{
    char mfu[64], line[1024], left[48];
    double step_ms = ir_median(r->times.ms, r->times.n);
    fmt_mfu(mfu, sizeof mfu, r->flops, r->tg, step_ms, r->peak_gflops);
    char *paren = strstr(mfu, " of "); /* "MFU 4.1%" is enough here */
    if (paren)
        *paren = 0;
    double s = step_ms * 1e-3 * (double)(r->steps - r->step);
    long long m = (long long)(s / 60);
    if (m >= 60)
        snprintf(left, sizeof left, "%lldh%02lldm left", m / 60, m % 60);
    else
        snprintf(left, sizeof left, "%lldm%02llds left", m, (long long)s % 60);
    char head[128], tput[64];
    snprintf(head, sizeof head, "step %lld/%lld | loss %.4f", (long long)r->step,
             (long long)r->steps, (double)loss);
    snprintf(tput, sizeof tput, " | %.0f %s", (double)per_step / (step_ms * 1e-3), tput_unit(r));
    int width = rt_stdout_columns() - 1; /* the last column would wrap */
    if (width < 1)
        width = 1;
    int n = 0;
    for (int drop = 0; drop <= 3; drop++) { /* 1: extras; 2: and MFU; 3: and throughput */
        n = snprintf(line, sizeof line, "%s%s%s%s%s | %s", head, drop < 1 ? extras : "",
                     drop < 3 ? tput : "", drop < 2 ? " | " : "", drop < 2 ? mfu : "", left);
        if (n <= width)
            break;
    }
    if (n > width) { /* the head cut, the time left kept whole while it fits */
        int keep = width - (int)strlen(left) - 3;
        if (keep > 0)
            snprintf(line, sizeof line, "%.*s | %s", keep, head, left);
        else
            snprintf(line, sizeof line, "%.*s", width, left);
    }
    printf("\r\033[K%s", line);
    fflush(stdout);
}

/* Steps between two step lines in a log: log_every when set, else about
 * 30 lines per run (a 1-2-5 step: 100 for 3000 steps, 1 for 30). */
static int64_t log_interval(const TrainCfg *c, int64_t steps)
{
    if (c->log_every > 0)
        return c->log_every;
    double want = (double)steps / 30.0;
    int64_t step = 1;
    for (int64_t p = 1; p <= INT64_MAX / 10; p *= 10) {
        if ((double)p >= want) { step = p; break; }
        if ((double)(2 * p) >= want) { step = 2 * p; break; }
        if ((double)(5 * p) >= want) { step = 5 * p; break; }
    }
    return step;
}

void rt_pass_opts(const TrainCfg *c, const RtGraphFlags *f, PassOpts *po)
{
    static const RtGraphFlags none = {.memory_budget = -1};
    if (!f)
        f = &none;
    pass_opts_default(po);
    po->beta1 = c->beta1;
    po->beta2 = c->beta2;
    po->eps = c->eps;
    po->weight_decay = c->weight_decay;
    po->grad_clip = c->grad_clip;
    int opt = pass_optimizer_parse(c->optimizer ? c->optimizer : "adamw");
    po->optimizer = opt < 0 ? PASS_OPT_ADAMW : opt; /* the key table admits only known ones */
    po->momentum = c->momentum;
    po->nesterov = c->nesterov && strcmp(c->nesterov, "true") == 0;
    po->lion_beta1 = c->lion_beta1;
    po->lion_beta2 = c->lion_beta2;
    po->param_opts = c->param_opts;
    po->nparam_opts = c->nparam_opts;
    po->memory_budget = f->memory_budget >= 0 ? f->memory_budget : c->memory_budget;
    po->remat = f->remat;
    /* ranks = tp x dp: the comm pass's all-reduces run over the dp group */
    po->tp = c->tp > 1 ? (int)c->tp : 1;
    po->tp_rank = f->tp_rank;
    po->sequence_parallel = c->sequence_parallel && strcmp(c->sequence_parallel, "true") == 0;
    po->nranks = f->nranks / po->tp > 1 ? f->nranks / po->tp : 1;
    po->grad_accum = (int)c->grad_accum;
    po->bucket_bytes = (int64_t)(c->bucket_mb * 1048576.0);
    po->zero = c->zero && po->nranks > 1; /* one rank holds the whole state anyway */
    po->no_overlap = f->no_overlap;
    po->no_fuse = f->no_fuse;
    po->attention = !f->no_fuse_attention;
    /* KILN_COMM_ONE_RANK=1 (tests): buckets and all-reduces on one rank too
     * (means over that one rank), so one GPU runs the collective path */
    const char *one = getenv("KILN_COMM_ONE_RANK");
    if (po->nranks == 1 && one && strcmp(one, "1") == 0)
        po->nranks = 2;
}


/* eval_source compiled for evaluation with po (attention, partition,
 * layout, simplify, fuse, schedule); NULL with d set. */
static Graph *eval_graph(const Model *m, const PassOpts *po, Diag *d)
{
    Graph *g = ir_clone(rt_train_eval_source(m));
    if (!pass_attention(g, po, d) || !pass_partition(g, po, d) ||
        !pass_attention_layout(g, po, d) || !pass_simplify(g, po, d) || !pass_fuse(g, po, d) ||
        !pass_schedule(g, po, d)) {
        ir_free(g);
        return NULL;
    }
    return g;
}

/* MFU's peak on a GPU without --peak-gflops, FLOP/s (0: unknown), for the
 * step's precision (bf16 tensor cores; f32 with tf32: TF32 tensor cores;
 * else the CUDA cores' f32 FMA rate); what it is, into why. A GPU of the
 * cost model's table (codegen/predict.c, by the name the driver gives) uses
 * its datasheet figure; another uses the per-architecture dense rate per SM
 * and clock x SMs x the driver's peak clock. */
static double gpu_peak(const RtDeviceInfo *di, bool bf16, bool tf32, char *why, size_t n)
{
    static const struct {
        const char *key, *dev;
    } named[] = {{"H200", "h200"}, {"H100", "h100"}, {"A100", "a100"}, {"B200", "b200"}};
    const char *what = bf16 ? "bf16 dense" : tf32 ? "TF32 dense" : "f32 (CUDA cores)";
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (strstr(di->name, named[i].key)) {
            const CgDevice *dv = cg_device_find(named[i].dev);
            snprintf(why, n, "the %s peak of %s (datasheet figure of kiln's %s entry)", what,
                     di->name, dv->name);
            return bf16 ? dv->bf16 : tf32 ? dv->tf32 : dv->f32;
        }
    /* FLOP per clock per SM, dense: bf16, tf32, f32 */
    static const struct {
        int major, minor;
        double bf16, tf32, f32;
    } arch[] = {{8, 0, 2048, 1024, 128}, {8, 6, 1024, 512, 256}, {8, 7, 1024, 512, 256},
                {8, 9, 1024, 512, 256},  {9, 0, 4096, 2048, 256}, {10, 0, 8192, 4096, 256},
                {12, 0, 2048, 1024, 256}};
    for (size_t i = 0; i < sizeof arch / sizeof arch[0]; i++)
        if (arch[i].major == di->cc_major && arch[i].minor == di->cc_minor && di->sms > 0 &&
            di->clock_hz > 0) {
            double per = bf16 ? arch[i].bf16 : tf32 ? arch[i].tf32 : arch[i].f32;
            snprintf(why, n, "the %s peak of %s: %d SMs x %.0f MHz x %.0f FLOP/clock (sm_%d%d)",
                     what, di->name, di->sms, di->clock_hz / 1e6, per, di->cc_major,
                     di->cc_minor);
            return per * di->sms * di->clock_hz;
        }
    snprintf(why, n, "%s (sm_%d%d) is not in kiln's table", di->name, di->cc_major,
             di->cc_minor);
    return 0;
}

static bool build(Run *r, Diag *d)
{
    PassOpts po;
    RtGraphFlags gf = {.memory_budget = -1, .remat = r->o->remat,
                       .nranks = rt_dp_size(r->dp) * (r->c.tp > 1 ? (int)r->c.tp : 1),
                       .tp_rank = rt_dp_tp_rank(r->dp),
                       .no_overlap = r->o->no_overlap, .no_fuse = r->o->no_fuse,
                       .no_fuse_attention = r->o->no_fuse_attention};
    rt_pass_opts(&r->c, &gf, &po);
    double t_start = ir_now();
    RtPp *pp = rt_dp_pp(r->dp);
    if (pp) { /* pipeline stages: this stage's optimizer step (runtime/dist/pp.c) */
        if (!rt_pp_check(&r->c, d) || !(r->tg = rt_pp_build(pp, r->m->g, &po, d)) ||
            !rt_pp_build_eval(pp, r->m->eval_g, &po, d))
            return false;
    } else {
        r->tg = ir_clone(r->m->g);
        if (r->o->log_dir)
            po.memplan = &r->mp; /* the report's memory timeline */
        if (!pass_pipeline(r->tg, &po, NULL, NULL, NULL, d))
            return false;
    }
    if (r->o->dump_ir && rt_dp_rank(r->dp) == 0 && gf.tp_rank == 0) { /* kiln compile's */
        char *ir = ir_print_str(r->tg);
        const void *chunk = ir;
        size_t len = strlen(ir);
        bool ok = rt_write_atomic(r->o->dump_ir, &chunk, &len, 1, d);
        free(ir);
        if (!ok)
            return false;
    }
    r->eg = pp ? NULL : eval_graph(r->m, &po, d); /* dropout off */
    if (!pp && !r->eg)
        return false;
    /* pp: the whole model's forward on world rank 0 for sample_every and
     * eval_batches = "all" (one rank's graph: no tp, no collectives) */
    if (pp && (r->c.sample_every > 0 || r->c.eval_batches == TRAIN_EVAL_ALL) &&
        rt_dp_world_rank(r->dp) == 0) {
        PassOpts wo = po;
        wo.tp = 1, wo.tp_rank = 0, wo.sequence_parallel = false, wo.nranks = 1;
        if (!(r->pg = eval_graph(r->m, &wo, d)))
            return false;
    }
    char err[1024];
    if (r->eg && !ir_verify(r->eg, err, sizeof err))
        die("evaluation graph invalid after simplify/schedule: %s", err);
    if (r->pg && !ir_verify(r->pg, err, sizeof err))
        die("pp's whole evaluation graph invalid after simplify/schedule: %s", err);
    ExecOpts eo = {.device = r->o->device, .threads = r->o->threads,
                   .profile = r->o->profile || r->o->trace || r->o->log_dir,
                   .cache_dir = r->o->cache_dir,
                   .verbose = r->o->verbose, .precision = r->c.precision,
                   .tf32 = r->c.tf32 && strcmp(r->c.tf32, "true") == 0,
                   .cuda_graph = r->c.cuda_graph && strcmp(r->c.cuda_graph, "true") == 0,
                   .tp_no_overlap = r->c.tp_overlap && strcmp(r->c.tp_overlap, "false") == 0};
    rt_dp_exec_opts(r->dp, &eo);
    r->comm = eo.comm;
    if (!(r->te = rt_exec_create(r->tg, &eo, d)) ||
        !rt_dp_build(r->dp, r->m->g, &po, &eo, r->tg, d))
        return false;
    eo.profile = false;
    if (r->pg) {
        ExecOpts wo = eo;
        wo.comm = NULL;
        if (!(r->pe = rt_exec_create(r->pg, &wo, d)))
            return false;
    }
    eo.arena_of = r->te; /* the evaluation runs in the step's temporaries (host backends) */
    if (r->eg && !(r->ee = rt_exec_create(r->eg, &eo, d)))
        return false;
    /* settings only the GPU reads: say so rather than ignore them silently */
    if (strcmp(rt_exec_device(r->te), "cpu") == 0 && rt_dp_world_rank(r->dp) == 0 &&
        ((r->c.precision && strcmp(r->c.precision, "bf16") == 0) || eo.tf32 || eo.cuda_graph))
        fprintf(stderr,
                "kiln: note: precision=bf16, tf32 and cuda_graph apply to --device cuda; the "
                "CPU backend computes in f32 and runs steps one by one\n");
    /* tp > 1 on a model that marks nothing to split: every TP rank runs the
     * whole step (right, but no faster and no smaller): say so */
    if (r->c.tp > 1 && !rt_tp_any(r->tg) && rt_dp_world_rank(r->dp) == 0)
        fprintf(stderr,
                "kiln: note: tp = %lld, but %s marks no param for tensor parallelism "
                "(shard(), nn's parallel options: docs/parallel.md): each TP rank runs the "
                "whole step\n", (long long)r->c.tp, r->m->path);
    r->flops = ir_graph_flops(r->tg) + rt_pp_flops(pp);
    /* MFU's denominator: --peak-gflops, else on the CPU the measured FMA
     * peak of the threads this rank runs (runtime/cpu/measure.c, cached) */
    r->peak_gflops = r->o->peak_gflops;
    if (r->peak_gflops <= 0 && strcmp(rt_exec_device(r->te), "cpu") == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        int th = eo.threads > 0 ? eo.threads : nc > 0 ? (int)nc : 1;
        CgDevice cpu;
        Diag md = {{0}};
        if (rt_cpu_device(th, r->o->cache_dir, false, r->o->verbose, &cpu, &md)) {
            r->peak_gflops = cpu.f32 / 1e9;
            r->peak_threads = th;
            if (rt_dp_world_rank(r->dp) == 0 && !r->o->quiet)
                printf("MFU against %.0f GFLOP/s: the measured FMA peak of %d thread%s "
                       "(--peak-gflops overrides)\n", r->peak_gflops, th, th == 1 ? "" : "s");
        } else if (r->o->verbose) {
            fprintf(stderr, "kiln: no measured CPU peak for MFU: %s\n", md.msg);
        }
    }
    RtDeviceInfo di;
    if (r->peak_gflops <= 0 && rt_exec_device_info(r->te, &di)) {
        char why[320];
        bool bf16 = r->c.precision && strcmp(r->c.precision, "bf16") == 0;
        r->peak_gflops = gpu_peak(&di, bf16, eo.tf32, why, sizeof why) / 1e9;
        if (rt_dp_world_rank(r->dp) == 0 && !r->o->quiet) {
            if (r->peak_gflops > 0)
                printf("MFU against %.0f GFLOP/s: %s (--peak-gflops overrides)\n",
                       r->peak_gflops, why);
            else
                printf("MFU n/a: %s (--peak-gflops gives the peak)\n", why);
        }
    }
    rt_trace_event(r->trace, "compile", "train", 1e6 * (t_start - r->t0),
                   1e6 * (ir_now() - t_start), 0);
    if (r->o->verbose)
        printf("compiled: training step %d ops, %.3g FLOP/step; evaluation %d ops; "
               "%.1f s\n",
               r->tg->ops.n, r->flops, r->eg ? r->eg->ops.n : 0, ir_now() - t_start);
    if (pp && r->o->verbose && rt_dp_world_rank(r->dp) == 0)
        rt_pp_print(pp, stdout);
    return true;
}

static bool init_state(Run *r, Diag *d)
{
    const Graph *g = r->tg;
    r->vals = xcalloc((size_t)g->t.n, sizeof *r->vals);
    /* on the CPU the arena's own bytes: no second copy of params and state */
    r->vals_view = rt_exec_host_view(r->te, 0) != NULL;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM && t->kind != TK_STATE)
            continue;
        r->vals[i] = r->vals_view ? rt_exec_host_view(r->te, i) : xcalloc(1, tensor_bytes(t) + 1);
        if (!init_tensor(t, r->c.seed, r->vals[i], d))
            return false;
    }
    r->zero = rt_zero_open(g);
    if (rt_tp_any(g))
        r->tpw = rt_tp_whole_new();
    if (r->o->resume) {
        CkptMeta m;
        void **vals = r->vals, **wv = NULL;
        const Graph *fg = r->zero ? rt_zero_full(r->zero, r->vals, &vals) : g;
        const Graph *wg = r->tpw ? rt_tp_whole_view(r->tpw, fg, vals, &wv) : fg;
        if (rt_dp_pp(r->dp) ? !rt_pp_ckpt_load(rt_dp_pp(r->dp), r->o->resume, wg,
                                               r->tpw ? wv : vals, &m, d)
                            : !rt_ckpt_load(r->o->resume, wg, r->tpw ? wv : vals, &m, d))
            return false;
        if (r->tpw) /* this rank's part of the file's whole tensors */
            rt_tp_split(r->tpw, fg, vals);
        if (r->zero) /* this rank's shard of the file's moments */
            rt_zero_scatter(r->zero, rt_dp_rank(r->dp), r->vals);
        if (m.seed != r->c.seed && !r->o->quiet)
            printf("resume: using the checkpoint's seed %llu (the model says %llu)\n",
                   (unsigned long long)m.seed, (unsigned long long)r->c.seed);
        if (m.step > r->steps) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: the checkpoint is at step %lld, past the run's end (expected "
                     "--steps or train.steps >= %lld, got %lld)",
                     r->o->resume, (long long)m.step, (long long)m.step, (long long)r->steps);
            return false;
        }
        r->c.seed = m.seed;
        r->step = m.step;
        r->data_pos = m.data_pos;
        if (!r->o->quiet)
            printf("resumed from %s at step %lld\n", r->o->resume, (long long)r->step);
    } else if (r->o->init_from) {
        /* under tp: into whole tensors holding the whole init (what
         * --init-partial leaves), then each rank takes its part */
        void **wv = NULL;
        const Graph *wg = r->tpw ? rt_tp_whole_view(r->tpw, g, r->vals, &wv) : g;
        for (int i = 0; r->tpw && i < wg->t.n; i++) {
            const Tensor *t = &g->t.v[i];
            if (t->shard.on && t->shard.n > 1 && !init_tensor(&wg->t.v[i], r->c.seed, wv[i], d))
                return false;
        }
        char *note;
        void **mv = r->tpw ? wv : r->vals, **pv = NULL; /* pp: every stage's params */
        const Graph *lg = rt_dp_pp(r->dp) ? rt_pp_params_view(rt_dp_pp(r->dp), wg, mv, &pv) : wg;
        bool ok = rt_init_from(r->o->init_from, lg, r->m->pads, r->m->npads, r->o->init_map,
                               r->o->init_partial, pv ? pv : mv, &note, d);
        rt_pp_params_take(rt_dp_pp(r->dp), wg, ok ? mv : NULL, pv);
        if (!ok)
            return false;
        if (r->tpw)
            rt_tp_split(r->tpw, g, r->vals);
        if (!r->o->quiet)
            printf("initialised params from %s\n%s", r->o->init_from, note ? note : "");
        free(note);
    }
    push_state(r);
    return true;
}

/* The executor's per-kernel table (% of the training steps' time), then the
 * loop's phases (% of the loop's time). */
static void print_profile(Run *r, double loop_ms, int64_t nsteps)
{
    const RtProfRow *pr;
    int n = rt_exec_profile(r->te, &pr);
    RtProfRow *rows = xcalloc((size_t)n + PH__N, sizeof *rows);
    if (n)
        memcpy(rows, pr, sizeof *rows * (size_t)n);
    printf("\nprofile: per kernel over %lld training steps (%.1f ms in steps):\n",
           (long long)nsteps, r->ph_ms[PH_STEP]);
    rt_profile_print(stdout, rows, n, r->ph_ms[PH_STEP], 25);
    /* by kind: the share of the step in GEMMs versus generated kernels */
    static const char *kinds[] = {"gemm", "kernel", "copy"};
    RtProfRow by_kind[3] = {{0}};
    for (int k = 0; k < 3; k++) {
        by_kind[k].name = by_kind[k].kind = kinds[k];
        for (int i = 0; i < n; i++)
            if (pr[i].kind && strcmp(pr[i].kind, kinds[k]) == 0) {
                by_kind[k].calls += pr[i].calls;
                by_kind[k].seconds += pr[i].seconds;
                by_kind[k].flops += pr[i].flops;
                by_kind[k].bytes += pr[i].bytes;
            }
    }
    printf("\nprofile: by kind over %lld training steps:\n", (long long)nsteps);
    rt_profile_print(stdout, by_kind, 3, r->ph_ms[PH_STEP], 0);
    n = 0;
    for (int i = 0; i < PH__N; i++)
        if (r->ph_calls[i])
            rows[n++] = (RtProfRow){ph_names[i], "phase", r->ph_calls[i], 1e-3 * r->ph_ms[i],
                                    i == PH_STEP ? r->flops * (double)r->ph_calls[i] : 0, 0,
                                    -1};
    printf("\nprofile: training loop, with the final evaluation and saves (%.1f ms):\n",
           loop_ms);
    rt_profile_print(stdout, rows, n, loop_ms, 0);
    free(rows);
}

/* --kernel-table FILE: the measured per-kernel table (codegen's ktable.c),
 * per training step over the nsteps profiled, beside the median step. */
static bool write_kernel_table(Run *r, int64_t nsteps, double median_ms, Diag *d)
{
    const RtProfRow *pr;
    int n = rt_exec_profile(r->te, &pr);
    const CgPlan *p = rt_exec_plan(r->te);
    CgKtLine *rows = xcalloc((size_t)n + 1, sizeof *rows);
    int k = 0;
    double per = nsteps > 0 ? 1.0 / (double)nsteps : 0;
    for (int i = 0; i < n; i++) {
        if (pr[i].step < 0 || pr[i].step >= p->steps.n || strcmp(pr[i].kind, "comm") == 0)
            continue;
        CgKtLine *w = &rows[k++];
        cg_ktable_row_init(w, p, pr[i].step);
        w->name = pr[i].name;
        w->calls = (double)pr[i].calls * per;
        w->ms = 1e3 * pr[i].seconds * per;
        w->flops = pr[i].flops * per;
        w->bytes = pr[i].bytes * per;
    }
    char dev[160];
    RtDeviceInfo info;
    if (rt_exec_device_info(r->te, &info) && info.name[0])
        snprintf(dev, sizeof dev, "%s:%s", rt_exec_device(r->te), info.name);
    else
        snprintf(dev, sizeof dev, "%s", rt_exec_device(r->te));
    CgKtMeta meta = {"measured", dev, nsteps, median_ms};
    bool ok = cg_ktable_write(r->o->kernel_table, &meta, rows, k, d);
    free(rows);
    return ok;
}

/* Kernel-level trace events of the step that ran at t_start (thread 1);
 * recorded for the first TRACE_KERNEL_STEPS steps only, to keep the file
 * small. */
enum { TRACE_KERNEL_STEPS = 20 };
static void trace_kernels(Run *r, double t_start, int64_t nth)
{
    if (!r->trace || nth >= TRACE_KERNEL_STEPS)
        return;
    const RtTraceEvent *ev;
    int n = rt_exec_trace(r->te, &ev);
    for (int i = 0; i < n; i++)
        rt_trace_event(r->trace, ev[i].name, ev[i].kind,
                       1e6 * (t_start - r->t0 + ev[i].start), 1e6 * (ev[i].end - ev[i].start),
                       1);
}

/* Everything a run holds but its ranks (rt_dp_close, last); any part may be
 * missing (the run failed before making it). */
static void run_free(Run *r)
{
    rt_zero_close(r->zero);
    rt_tp_whole_free(r->tpw);
    rt_runlog_free(r->log);
    pass_memplan_free(r->mp);
    free(r->x_name);
    free(r->x_t);
    free(r->x_e);
    free(r->x_val);
    free(r->x_eval);
    if (r->vals) {
        for (int i = 0; i < r->tg->t.n && !r->vals_view; i++)
            free(r->vals[i]);
        free(r->vals);
    }
    if (r->ee) /* before te: it may run in te's arena */
        rt_exec_destroy(r->ee);
    if (r->pe)
        rt_exec_destroy(r->pe);
    if (r->pg)
        ir_free(r->pg);
    if (r->te)
        rt_exec_destroy(r->te);
    if (r->tg)
        ir_free(r->tg);
    if (r->eg)
        ir_free(r->eg);
    rt_data_close(r->ds);
    free(r->times.ms);
    rt_es_free(r->es);
}

/* The final line's memory: " | peak mem RSS resident (training arena A,
 * evaluation E, host copies H)", where RSS is the process's resident peak
 * (getrusage), A the training step's arena (the planned peak), E "in the
 * training arena" when the evaluation step runs in its temporaries, else
 * its own arena's bytes (after A: ", micro-batch arena M" with grad_accum
 * > 1, the micro-batch executor's), and H the host copies of params and optimizer
 * state (r->vals, none on the CPU: they are views of the arena) and, with
 * zero=1, the full moments kept for checkpoints (rt_zero_host_bytes). */
static void print_memory(const Run *r)
{
    char rss[32], a[32], e[48] = "in the training arena", h[32];
    struct rusage ru;
    double peak = getrusage(RUSAGE_SELF, &ru) == 0 ? 1024.0 * (double)ru.ru_maxrss : 0;
    int64_t host = 0;
    for (int i = 0; r->vals && !r->vals_view && i < r->tg->t.n; i++)
        if (r->vals[i])
            host += (int64_t)tensor_bytes(&r->tg->t.v[i]);
    host += rt_zero_host_bytes(r->zero);
    ir_fmt_bytes(peak, 2, rss, sizeof rss);
    ir_fmt_bytes((double)rt_exec_arena_bytes(r->te), 2, a, sizeof a);
    if (r->ee && !rt_exec_arena_shared(r->ee)) {
        ir_fmt_bytes((double)rt_exec_arena_bytes(r->ee), 2, h, sizeof h);
        snprintf(e, sizeof e, "%s", h);
    }
    char mb[64] = "";
    int64_t micro = rt_dp_micro_arena_bytes(r->dp);
    if (micro > 0) {
        ir_fmt_bytes((double)micro, 2, h, sizeof h);
        snprintf(mb, sizeof mb, ", micro-batch arena %s", h);
    }
    ir_fmt_bytes((double)host, 2, h, sizeof h);
    printf(" | peak mem %s resident (training arena %s%s, evaluation %s, host copies %s)", rss, a,
           mb, e, h);
}

/* Every failure after the ranks are open goes to `out` with d set (or a
 * stop signal recorded): the one exit, which reports, closes the trace and
 * frees the run. */
int rt_train(const Model *m, const TrainOpts *o)
{
    Run r = {.m = m, .o = o, .c = m->train, .ckpt_step = -1, .times = {.stride = 1}};
    Diag d = {{0}};
    int rc = 1;
    r.t0 = ir_now();
    if (!rt_dp_open(&m->train, &r.dp, &d))
        goto out;
    if (o->trace) {
        r.trace = rt_trace_open(rt_dp_trace_path(r.dp, o->trace));
        rt_trace_thread_name(r.trace, 0, "training loop");
        rt_trace_thread_name(r.trace, 1, "plan steps (first steps)");
        rt_trace_thread_name(r.trace, 2, "communication (first steps)");
    }
    if (o->steps > 0)
        r.c.steps = o->steps;
    r.steps = r.c.steps;
    const char *ckpt = o->checkpoint ? o->checkpoint : r.c.checkpoint;
    if (rt_dp_world_rank(r.dp) == 0) { /* the writer: sweep what a killed one left */
        int swept = rt_ckpt_sweep_tmp(ckpt, o->save_weights);
        if (swept > 0 && !o->quiet)
            printf("removed %d stale temp file%s of an interrupted write\n", swept,
                   swept > 1 ? "s" : "");
    }
    if ((o->save_weights && !rt_output_path_check("--save-weights", o->save_weights, false, &d)) ||
        (ckpt && !rt_output_path_check(o->checkpoint ? "--checkpoint" : "train.checkpoint", ckpt,
                                       true, &d)) ||
        !writable_dir(o->trace, &d) ||
        (o->log_dir && rt_dp_world_rank(r.dp) == 0 && !rt_runlog_dir(o->log_dir, &d)) ||
        !rt_train_open_data(&r, &d) || !rt_es_open(&r, ckpt, &d) || !build(&r, &d) ||
        !init_state(&r, &d))
        goto out;
    if (r.c.sample_every > 0) { /* train{sample_every}: a language model, a prompt that fits */
        char *ok = rt_train_sample(r.ee, r.eg ? r.eg : rt_train_eval_source(r.m), &r.c, 0, true, &d);
        if (!ok) {
            char msg[sizeof d.msg];
            snprintf(msg, sizeof msg, "%s", d.msg);
            snprintf(d.msg, sizeof d.msg, "%s:%d: %.1900s", m->path, m->train_line, msg);
            goto out;
        }
        free(ok);
    }
    int lr_id = ir_find_tensor(r.tg, "lr");
    const Tensor *lr_t = lr_id >= 0 ? &r.tg->t.v[lr_id] : NULL;
    bool tty = rt_stdout_tty() && !o->quiet;
    int64_t log_every = log_interval(&r.c, r.c.steps - r.step);
    double last_status = 0; /* when the status line was last rewritten (10 per s at most) */
    find_extra_scalars(&r);
    if ((r.eg || rt_dp_pp(r.dp)) && r.c.eval_batches == TRAIN_EVAL_ALL && rt_data_has_val(r.ds) &&
        !rt_train_check_eval_all(&r, &d))
        goto out;
    r.grad_norm_t = ir_find_output(r.tg, "grad_norm");
    if (o->log_dir && rt_dp_world_rank(r.dp) == 0) {
        char title[512];
        snprintf(title, sizeof title, "kiln train %s", r.m->path);
        if (!(r.log = rt_runlog_open(o->log_dir, title, true, &d)))
            goto out;
    }
    double last_b = 0, last_c = 0; /* the last step's compute interval */
    /* throughput: tokens per step where the data has a token axis, else
     * examples (tput_unit) */
    int64_t examples = r.B * rt_dp_rows_factor(r.dp), first = r.step;
    int64_t per_step = r.tok_per_row > 0 ? examples * r.tok_per_row : examples;
    float loss = NAN;
    bool skip = r.c.on_nonfinite && strcmp(r.c.on_nonfinite, "skip") == 0;
    rt_dp_start_together(r.dp);
    double loop0 = ir_now();
    int stop = 0; /* SIGINT, SIGTERM: stop after the current step (rt_dp_stop) */
    while (r.step < r.steps && !(stop = rt_dp_stop(r.dp))) {
        double t_a = ir_now();
        if (!rt_dp_step(r.dp, r.te, r.tg, rt_data_batch(r.ds, DATA_TRAIN, r.data_pos),
                        r.c.seed, r.step, &d))
            goto out;
        float lr = 0;
        if (lr_t) {
            lr = (float)rt_lr_at(&r.c, r.step, r.steps);
            write_f32(r.te, lr_t, &lr);
        }
        double t_b = ir_now();
        if (!rt_exec_run(r.te, r.c.seed, r.step, &d))
            goto out;
        for (int i = 0; i < r.nx; i++)
            rt_exec_read_f32(r.te, &r.tg->t.v[r.x_t[i]], &r.x_val[i]);
        double t_m = ir_now();
        loss = rt_dp_loss(r.dp, rt_train_read_loss(r.te, r.tg), r.x_val, r.x_val);
        double t_c = ir_now();
        if (rt_dp_size(r.dp) > 1) /* the compute thread's wait for the step's mean */
            rt_trace_event(r.trace, "mean over ranks", "comm", 1e6 * (t_m - r.t0),
                           1e6 * (t_c - t_m), 0);
        rt_dp_after_step(r.dp, r.trace, r.t0, r.step - first < TRACE_KERNEL_STEPS);
        rt_train_phase(&r, PH_DATA, t_a, t_b);
        rt_train_phase(&r, PH_STEP, t_b, t_c);
        last_b = t_b, last_c = t_c;
        trace_kernels(&r, t_b, r.step - first);
        r.data_pos++;
        r.step++;
        double step_ms = 1e3 * (t_c - t_a);
        /* a device that times itself (CUDA: events around the step): its
         * time for the step, unless micro-batches ran on another executor */
        double dev_s = rt_exec_device_seconds(r.te);
        if (dev_s >= 0 && rt_dp_rows_factor(r.dp) == rt_dp_size(r.dp))
            step_ms = 1e3 * dev_s;
        step_time_add(&r.times, step_ms);
        check_peak(&r, step_ms);
        /* a step with a non-finite loss or gradient norm changed nothing
         * (passes/optimizer.c): stop, or go on without it */
        char why[64], skipped[128] = "";
        bool bad = step_not_applied(&r, loss, lr, why, sizeof why);
        if (bad && !skip) {
            rt_train_pull_state(&r);
            const char *st = nonfinite_state(&r);
            if (st)
                snprintf(d.msg, sizeof d.msg,
                         "training diverged at step %lld: %s; \"%s\" was already not finite "
                         "(an earlier update overflowed: try a lower lr)",
                         (long long)r.step, why, st);
            else
                snprintf(d.msg, sizeof d.msg,
                         "training diverged at step %lld: %s; params are those of step %lld "
                         "(not updated; try a lower lr or grad_clip, or on_nonfinite=skip)",
                         (long long)r.step, why, (long long)r.step - 1);
            goto out;
        }
        if (bad)
            snprintf(skipped, sizeof skipped, " | skipped: %s, update not applied (%lld so far)",
                     why, (long long)++r.skipped);
        /* a terminal gets one status line (below); a log gets the first
         * and last steps, every log_every-th and every skipped one */
        bool log = !o->quiet && (!tty || o->verbose || bad) &&
                   (r.step % log_every == 0 || r.step == first + 1 || r.step == r.steps || bad);
        char extras[512];
        fmt_extras(&r, r.x_val, NULL, extras, sizeof extras);
        if (r.log) {
            float gn = NAN;
            if (r.grad_norm_t >= 0)
                rt_exec_read_f32(r.te, &r.tg->t.v[r.grad_norm_t], &gn);
            double model = r.flops - pass_remat_flops(r.tg), peak = r.peak_gflops * 1e9;
            double cbusy = NAN, cexp = NAN, tpms = NAN, tpexp = NAN;
            rt_dp_last_comm(r.dp, &cbusy, &cexp);
            rt_dp_last_tp(r.dp, &tpms, &tpexp);
            RtStepRecord rec = {
                .step = r.step, .loss = loss, .extra_name = r.x_name, .extra = r.x_val,
                .nextra = r.nx, .lr = lr_t ? rt_lr_at(&r.c, r.step - 1, r.steps) : NAN,
                .grad_norm = gn, .ms = step_ms,
                .examples_per_s = (double)examples / (step_ms * 1e-3),
                .tokens_per_s = r.tok_per_row > 0 ? (double)per_step / (step_ms * 1e-3) : NAN,
                .mfu = peak > 0 ? model / (step_ms * 1e-3) / peak : NAN,
                .hfu = peak > 0 ? r.flops / (step_ms * 1e-3) / peak : NAN,
                .mem_bytes = rt_exec_arena_bytes(r.te), .comm_ms = cbusy, .comm_exposed_ms = cexp,
                .tp_comm_ms = tpms,
                                .tp_comm_exposed_ms = tpexp};
            if (!rt_runlog_step(r.log, &rec, &d)) {
                rt_train_log_failed(&r, &d);
                goto out;
            }
        }
        if (log) {
            char mfu[64], mem[32];
            fmt_mfu(mfu, sizeof mfu, r.flops, r.tg, step_ms, r.peak_gflops);
            ir_fmt_bytes((double)rt_exec_arena_bytes(r.te), 2, mem, sizeof mem);
            char eta[96] = "";
            if (rt_dp_size(r.dp) > 1)
                fmt_eta(eta, sizeof eta, ir_median(r.times.ms, r.times.n), r.steps - r.step);
            printf("%sstep %5lld/%lld | loss %.6f%s | lr %.3e | %8.2f ms | %9.0f %s | %s | "
                   "mem %s%s%s\n",
                   tty ? "\r\033[K" : "", (long long)r.step, (long long)r.steps,
                   (double)loss, extras, lr_t ? rt_lr_at(&r.c, r.step - 1, r.steps) : 0.0,
                   step_ms, (double)per_step / (step_ms * 1e-3), tput_unit(&r), mfu, mem, eta,
                   skipped);
            fflush(stdout);
        }
        if ((r.eg || rt_dp_pp(r.dp)) && r.c.eval_every > 0 && r.step % r.c.eval_every == 0 &&
            r.step < r.steps &&
            rt_data_has_val(r.ds)) {
            if (!rt_train_evaluate(&r, &d))
                goto out;
            if (!o->quiet) {
                char ex[512];
                fmt_extras(&r, NULL, r.x_eval, ex, sizeof ex);
                printf("%seval  %5lld | val loss %.6f%s", tty ? "\r\033[K" : "",
                       (long long)r.step, r.last_val_loss, ex);
                if (r.have_acc)
                    printf(" | accuracy %.2f%% (%lld/%lld)", 100 * r.last_acc,
                           (long long)r.acc_right, (long long)r.acc_total);
                printf("\n");
                fflush(stdout);
            }
            bool es_stop;
            if (!rt_es_after_eval(&r, &es_stop, &d))
                goto out;
            if (es_stop)
                break;
        }
        if (r.c.sample_every > 0 && r.step % r.c.sample_every == 0 && !rt_train_sample_now(&r, tty, &d))
            goto out;
        if (ckpt && r.c.checkpoint_every > 0 && r.step % r.c.checkpoint_every == 0 &&
            r.step < r.steps && !save_checkpoint(&r, ckpt, &d))
            goto out;
        double now = ir_now();
        if (tty && (now - last_status >= 0.1 || r.step == r.steps)) {
            progress(&r, loss, extras, per_step);
            last_status = now;
        }
    }
    /* the last step's all-gathers (zero=1) land after its figures: into
     * them and the trace */
    if (r.step > first)
        rt_dp_after_last_step(r.dp, r.trace, r.t0, r.step - 1 - first < TRACE_KERNEL_STEPS);
    if (tty)
        printf("\r\033[K");
    if (!stop) /* a signal during the last step */
        stop = rt_dp_stop(r.dp);
    if (stop) {
        stop_summary(&r, stop, loss, per_step, ckpt, &d);
        rc = 128 + stop;
        goto out;
    }
    bool es_stop;
    if ((r.eg || rt_dp_pp(r.dp)) && rt_data_has_val(r.ds) &&
        (!rt_train_evaluate(&r, &d) || !rt_es_after_eval(&r, &es_stop, &d)))
        goto out;
    if (ckpt && !save_checkpoint(&r, ckpt, &d))
        goto out;
    if (o->save_weights && rt_dp_rank(r.dp) == 0) {
        rt_train_pull_state(&r);
        const char *bad = nonfinite_state(&r);
        if (bad)
            snprintf(d.msg, sizeof d.msg,
                     "training diverged by step %lld: \"%s\" is not finite (an update "
                     "overflowed: try a lower lr); no weights written",
                     (long long)r.step, bad);
        void **wv = r.vals, **ppw = NULL;
        const Graph *wg = r.tpw && !bad ? rt_tp_whole(r.tpw, r.comm, r.tg, r.vals, &wv) : r.tg;
        if (rt_dp_pp(r.dp) && !bad) { /* whole params on stage 0, one rank's layout */
            wg = rt_pp_whole(rt_dp_pp(r.dp), wg, wv, &ppw);
            wv = ppw;
        }
        bool wrote = !bad && wg && rt_dp_tp_rank(r.dp) == 0;
        if (bad || (wrote && !rt_weights_save(o->save_weights, wg, wv, &d))) {
            rt_pp_whole_free(rt_dp_pp(r.dp), ppw);
            goto out;
        }
        rt_pp_whole_free(rt_dp_pp(r.dp), ppw);
        if (!o->quiet && wrote)
            printf("weights: %s\n", o->save_weights);
    }
    double loop_ms = 1e3 * (ir_now() - loop0);
    double med = ir_median(r.times.ms, r.times.n);
    /* no step ran (resumed at the end): nothing to report as training loss */
    if (isnan(loss) && r.step == first)
        printf("final: step %lld | train loss n/a (no step ran)", (long long)r.step);
    else
        printf("final: step %lld | train loss %.9g", (long long)r.step, (double)loss);
    for (int i = 0; i < r.nx && r.step > first; i++)
        printf(" | %s %.9g", r.x_name[i], (double)r.x_val[i]);
    if (r.have_val)
        printf(" | val loss %.9g", r.last_val_loss);
    for (int i = 0; i < r.nx && r.have_val; i++)
        printf(" | val %s %.9g", r.x_name[i], r.x_eval[i]);
    if (r.have_acc)
        printf(" | accuracy %.2f%% (%lld/%lld held-out)", 100 * r.last_acc,
               (long long)r.acc_right, (long long)r.acc_total);
    if (med > 0) {
        char mfu[64];
        fmt_mfu(mfu, sizeof mfu, r.flops, r.tg, med, r.peak_gflops);
        printf(" | median %.2f ms/step | %.0f %s | %s", med, (double)per_step / (med * 1e-3),
               tput_unit(&r), mfu);
    }
    print_memory(&r);
    rt_es_summary(&r, stdout);
    if (r.skipped)
        printf(" | skipped %lld of %lld steps (loss or gradient norm not finite)",
               (long long)r.skipped, (long long)(r.step - first));
    printf("\n");
    rt_dp_summary(r.dp, stdout);
    if (o->profile)
        print_profile(&r, loop_ms, r.step - first);
    if (o->kernel_table && rt_dp_world_rank(r.dp) == 0 &&
        !write_kernel_table(&r, r.step - first, med, &d))
        goto out;
    if (r.log) {
        const RtProfRow *pr;
        /* under pp the step's executor runs the optimizer alone (the
         * stage's F, B and W are not profiled): no profile */
        int np = rt_dp_pp(r.dp) ? 0 : rt_exec_profile(r.te, &pr);
        rt_runlog_profile(r.log, pr, np, med, r.step - first, r.tg, rt_exec_plan(r.te));
        rt_runlog_memory(r.log, r.tg, r.mp);
        const RtCommEvent *ev;
        int nev = rt_dp_last_events(r.dp, &ev);
        rt_runlog_comm(r.log, rt_dp_size(r.dp), last_b, last_c, ev, nev);
        if (!rt_runlog_close(r.log, &d))
            goto out;
        if (!o->quiet)
            printf("report: %s/report.html, %s/metrics.jsonl, %s/eval.jsonl\n", o->log_dir,
                   o->log_dir, o->log_dir);
    }
    if (o->result) {
        o->result->final_loss = loss;
        o->result->val_loss = r.have_val ? r.last_val_loss : NAN;
        o->result->accuracy = r.have_acc ? r.last_acc : NAN;
        o->result->median_ms = med;
    }
    rc = 0;
out:
    if (rc == 1 && rt_stop_signal()) /* e.g. "stopped by SIGINT while compiling kernels" */
        rc = 128 + rt_stop_signal();
    if (rc != 0 && d.msg[0]) {
        fflush(stdout);
        fprintf(stderr, "%s\n", d.msg);
    }
    Diag td;
    if (!rt_trace_close(r.trace, rc == 0, &td)) {
        fprintf(stderr, "%s\n", td.msg);
        rc = 1;
    } else if (rc == 0 && o->trace && !o->quiet) {
        printf("trace: %s\n", o->trace);
    }
    run_free(&r);
    fflush(stdout);
    /* 0 for a rank that rt_launch stopped: the launcher gives 128 + sig */
    return rt_dp_close(r.dp, rc);
}
