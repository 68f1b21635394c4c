/* test_optimizers.c - every train{optimizer} through the real pipeline
 * (kiln train: frontend, passes, generated C kernels, runtime), against
 * the update rule of its PyTorch counterpart written out here in double.
 *
 * The model has two params, W f32[3,4] (rank 2: weight decay by default)
 * and b f32[4] (rank 1: none), and a loss whose gradient is known in closed
 * form:  loss = sum((W - T)^2 (W + 2)) + 0.5 sum(b^3),  T = iota * 0.25 - 0.3
 * so  dW = 2 (W - T)(W + 2) + (W - T)^2,  db = 1.5 b^2.  A run of 0 steps
 * gives the initial params; a run of 3 steps (cosine schedule from lr to 0,
 * no warmup, no clipping) gives the params the reference must reach from
 * them, within float32 noise (relative error < 1e-6 per tensor; about 5e-8 seen).
 *
 * The references (torch.optim.AdamW, torch.optim.SGD with momentum and
 * Nesterov, Lion as in lion-pytorch, transformers' Adafactor with
 * relative_step=False, scale_parameter=True, beta1=None):
 *   AdamW  m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *          p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
 *   SGD    d = g + wd p; buf = mu buf + d (buf = d at t = 1);
 *          d = nesterov ? d + mu buf : buf; p -= lr d
 *   Lion   p -= lr (sign(b1 m + (1-b1) g) + wd p); m = b2 m + (1-b2) g
 *   Adafactor (rank 2) r = b2t r + (1-b2t) rowmean(g^2 + 1e-30), c likewise
 *          with column means, b2t = 1 - t^-0.8; u = g / sqrt(r c / mean(r));
 *          (rank < 2) v = b2t v + (1-b2t)(g^2 + 1e-30); u = g / sqrt(v);
 *          u /= max(1, rms(u)); a = lr max(1e-3, rms(p)); p -= a (u + wd p)
 * Also: param groups (lr_scale, weight_decay, the default rule for a group
 * without weight_decay) and a frozen param, whose saved bits are its
 * initial bits; the lr schedules (rt_lr_at), the default cosine bit for
 * bit the formula kiln always had. */
#include "testutil.h"

#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NW 12
#define NB 4
#define STEPS 3
#define LR 0.05

static char *dir;

static const char *script =
    "sym{B = 4, D = 2, K = 2}\n"
    "local x = input(\"x\", {\"B\", \"D\"}, \"f32\")\n"
    "local y = input(\"y\", {\"B\"}, \"i32\")\n"
    "local W = param(\"W\", {3, 4}, normal(0.5))\n"
    "local b = param(\"b\", {4}, normal(0.5))\n"
    "local t = iota({3, 4}, 1, \"f32\") * 0.25 - 0.3\n"
    "local loss = sum((W - t) * (W - t) * (W + 2)) + sum(b * b * b) * 0.5\n"
    "  + sum(x) * 0 + sum(cast(y, \"f32\")) * 0\n"
    "minimize(loss)\n"
    "output(\"logits\", x * 0)\n"
    "train{data = \"blobs\", steps = 3, lr = 0.05, grad_clip = 0, seed = 5}\n";

typedef enum { ADAMW, SGD, LION, ADAFACTOR } Opt;

typedef struct {
    const char *name;
    Opt opt;
    const char *sets;  /* --set flags */
    const char *extra; /* a second train{} line, or NULL */
    double wd;         /* train weight_decay (the default rule: W only) */
    double mu;         /* SGD momentum */
    bool nesterov;
    double lr_scale[2], wd_of[2]; /* per param (W, b); wd_of NAN: the default */
    bool frozen_b;
    double lr;         /* peak lr */
} Case;

/* Params, in double: [0] W (12), [1] b (4). */
typedef struct {
    double p[2][NW], s1[2][NW], s2[2][NW]; /* s1/s2: first/second state */
    double r[3], c[4];                      /* Adafactor W's factors */
} Ref;

static const int64_t numel[2] = {NW, NB};

static void grads(const Ref *st, double g[2][NW])
{
    for (int k = 0; k < NW; k++) {
        double w = st->p[0][k], t = (double)(float)((float)(k % 4) * 0.25f - 0.3f);
        g[0][k] = 2 * (w - t) * (w + 2) + (w - t) * (w - t);
    }
    for (int k = 0; k < NB; k++)
        g[1][k] = 1.5 * st->p[1][k] * st->p[1][k];
}

static double rms(const double *x, int64_t n)
{
    double s = 0;
    for (int64_t k = 0; k < n; k++)
        s += x[k] * x[k];
    return sqrt(s / (double)n);
}

static void ref_step(Ref *st, const Case *c, int step)
{
    double g[2][NW];
    grads(st, g);
    double lr0 = 0.5 * c->lr * (1 + cos(M_PI * step / (double)STEPS)), t = step + 1;
    for (int i = 0; i < 2; i++) {
        if (i == 1 && c->frozen_b)
            continue;
        double lr = lr0 * c->lr_scale[i];
        double wd = isnan(c->wd_of[i]) ? (i == 0 ? c->wd : 0) : c->wd_of[i];
        double *p = st->p[i], *m = st->s1[i], *v = st->s2[i], u[NW];
        int64_t n = numel[i];
        switch (c->opt) {
        case ADAMW: {
            double b1 = 0.9, b2 = 0.95, eps = 1e-8;
            for (int64_t k = 0; k < n; k++) {
                m[k] = b1 * m[k] + (1 - b1) * g[i][k];
                v[k] = b2 * v[k] + (1 - b2) * g[i][k] * g[i][k];
                double mh = m[k] / (1 - pow(b1, t)), vh = v[k] / (1 - pow(b2, t));
                p[k] -= lr * (mh / (sqrt(vh) + eps) + wd * p[k]);
            }
            break;
        }
        case SGD:
            for (int64_t k = 0; k < n; k++) {
                double d = g[i][k] + wd * p[k];
                if (c->mu > 0) {
                    m[k] = step == 0 ? d : c->mu * m[k] + d;
                    d = c->nesterov ? d + c->mu * m[k] : m[k];
                }
                p[k] -= lr * d;
            }
            break;
        case LION: {
            double b1 = 0.9, b2 = 0.99;
            for (int64_t k = 0; k < n; k++) {
                double cm = b1 * m[k] + (1 - b1) * g[i][k];
                double sg = cm > 0 ? 1 : cm < 0 ? -1 : 0;
                p[k] -= lr * (sg + wd * p[k]);
                m[k] = b2 * m[k] + (1 - b2) * g[i][k];
            }
            break;
        }
        case ADAFACTOR: {
            double b2t = 1 - pow(t, -0.8);
            if (i == 0) {
                double rm = 0;
                for (int a = 0; a < 3; a++) {
                    double s = 0;
                    for (int k = 0; k < 4; k++)
                        s += g[0][a * 4 + k] * g[0][a * 4 + k] + 1e-30;
                    st->r[a] = b2t * st->r[a] + (1 - b2t) * s / 4;
                    rm += st->r[a] / 3;
                }
                for (int k = 0; k < 4; k++) {
                    double s = 0;
                    for (int a = 0; a < 3; a++)
                        s += g[0][a * 4 + k] * g[0][a * 4 + k] + 1e-30;
                    st->c[k] = b2t * st->c[k] + (1 - b2t) * s / 3;
                }
                for (int a = 0; a < 3; a++)
                    for (int k = 0; k < 4; k++)
                        u[a * 4 + k] = g[0][a * 4 + k] / sqrt(st->r[a] / rm * st->c[k]);
            } else
                for (int64_t k = 0; k < n; k++) {
                    v[k] = b2t * v[k] + (1 - b2t) * (g[i][k] * g[i][k] + 1e-30);
                    u[k] = g[i][k] / sqrt(v[k]);
                }
            double clip = fmax(1.0, rms(u, n));
            double a = lr * fmax(1e-3, rms(p, n));
            for (int64_t k = 0; k < n; k++)
                p[k] -= a * (u[k] / clip + wd * p[k]);
            break;
        }
        }
    }
}

/* kiln train of the script (+ extra) for `steps` steps, saving to NAME.safetensors */
static void train(const Case *c, int steps, const char *name)
{
    char *path = xasprintf("%s/%s.lua", dir, c->name);
    char *text = xasprintf("%s%s\n", script, c->extra ? c->extra : "");
    write_file(path, text);
    char *cmd = xasprintf("%s train %s --set steps=%d --set lr=%.17g %s --save-weights %s/%s.safetensors",
                          getenv("KILN_BIN"), path, steps, c->lr, c->sets, dir, name);
    run_or_fail(cmd);
    free(cmd);
    free(text);
    free(path);
}

static void read_params(const char *name, float out[2][NW])
{
    char *p = xasprintf("%s/%s.safetensors", dir, name);
    StFile f;
    Diag d = {{0}};
    if (!rt_st_read(p, &f, &d))
        fail_msg("%s", d.msg);
    const char *pn[2] = {"W", "b"};
    for (int i = 0; i < 2; i++) {
        const StTensor *t = rt_st_find(&f, pn[i]);
        if (!t || t->dtype != DT_F32 || t->nbytes != (size_t)numel[i] * 4)
            fail_msg("%s: no f32 param %s of %lld elements", p, pn[i], (long long)numel[i]);
        memcpy(out[i], t->data, t->nbytes);
    }
    rt_st_free(&f);
    free(p);
}

static void run(const Case *c)
{
    char n0[80], n1[80];
    snprintf(n0, sizeof n0, "%s.init", c->name);
    snprintf(n1, sizeof n1, "%s.final", c->name);
    train(c, 0, n0);
    train(c, STEPS, n1);
    float p0[2][NW], p1[2][NW];
    read_params(n0, p0);
    read_params(n1, p1);
    Ref st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 2; i++)
        for (int64_t k = 0; k < numel[i]; k++)
            st.p[i][k] = p0[i][k];
    for (int s = 0; s < STEPS; s++)
        ref_step(&st, c, s);
    for (int i = 0; i < 2; i++) {
        double got[NW], moved = 0;
        for (int64_t k = 0; k < numel[i]; k++) {
            got[k] = p1[i][k];
            moved = fmax(moved, fabs(got[k] - p0[i][k]));
        }
        double e = rel_err(got, st.p[i], numel[i]);
        print_message("%s: %s rel err %.2e (moved up to %.3g)\n", c->name, i ? "b" : "W", e,
                      moved);
        if (i == 1 && c->frozen_b) {
            if (memcmp(p0[1], p1[1], sizeof(float) * NB))
                fail_msg("%s: frozen b changed", c->name);
            continue;
        }
        if (!(e < 1e-6) || !(moved > 1e-4))
            fail_msg("%s: param %s: rel err %g against the reference (moved %g)", c->name,
                     i ? "b" : "W", e, moved);
    }
}

#define DEF .lr_scale = {1, 1}, .wd_of = {NAN, NAN}, .lr = LR

static void test_adamw(void **state)
{
    (void)state;
    run(&(Case){"adamw", ADAMW, "--set weight_decay=0.1", NULL, .wd = 0.1, DEF});
}

static void test_sgd(void **state)
{
    (void)state;
    run(&(Case){"sgd", SGD, "--set optimizer=sgd --set weight_decay=0.1", NULL, .wd = 0.1, DEF});
    run(&(Case){"sgd_momentum", SGD, "--set optimizer=sgd --set momentum=0.9", NULL, .mu = 0.9,
                DEF});
    run(&(Case){"sgd_nesterov", SGD, "--set optimizer=sgd --set weight_decay=0.1",
                "train{momentum = 0.8, nesterov = true}", .wd = 0.1, .mu = 0.8, .nesterov = true,
                DEF});
}

static void test_lion(void **state)
{
    (void)state;
    Case c = {"lion", LION, "--set optimizer=lion --set weight_decay=0.5", NULL, .wd = 0.5, DEF};
    c.lr = 0.01;
    run(&c);
}

static void test_adafactor(void **state)
{
    (void)state;
    run(&(Case){"adafactor", ADAFACTOR, "--set optimizer=adafactor", NULL, DEF});
    run(&(Case){"adafactor_wd", ADAFACTOR, "--set optimizer=adafactor --set weight_decay=0.3",
                NULL, .wd = 0.3, DEF});
}

/* First match wins; a group without weight_decay keeps the default rule. */
static void test_param_groups(void **state)
{
    (void)state;
    Case c = {"groups", ADAMW, "--set weight_decay=0.1",
              "train{param_groups = {{match = \"^b$\", lr_scale = 0.5, weight_decay = 0.2},"
              " {match = \".\", lr_scale = 2}, {match = \"W\", lr_scale = 7}}}",
              .wd = 0.1, .lr_scale = {2, 0.5}, .wd_of = {NAN, 0.2}, .lr = LR};
    run(&c);
    Case s = {"groups_sgd", SGD, "--set optimizer=sgd --set momentum=0.5",
              "train{param_groups = {{match = \"W\", weight_decay = 0}, {match = \"b\","
              " weight_decay = 0.05, lr_scale = 3}}}",
              .mu = 0.5, .lr_scale = {1, 3}, .wd_of = {0, 0.05}, .lr = LR};
    run(&s);
}

/* A frozen param keeps its initial bits; the others train as usual. */
static void test_frozen(void **state)
{
    (void)state;
    run(&(Case){"frozen", SGD, "--set optimizer=sgd --set momentum=0.9",
                "train{frozen = {\"^b$\"}}", .mu = 0.9, .frozen_b = true, DEF});
    run(&(Case){"frozen_adamw", ADAMW, "--set weight_decay=0.1", "train{frozen = {\"b\"}}",
                .wd = 0.1, .frozen_b = true, DEF});
}

/* The schedule kiln always had, verbatim: the default must equal it bit for bit. */
static double old_cosine(const TrainCfg *c, int64_t step, int64_t steps)
{
    if (c->warmup > 0 && step < c->warmup)
        return c->lr * (double)(step + 1) / (double)c->warmup;
    int64_t span = steps - c->warmup;
    double p = span > 0 ? (double)(step - c->warmup) / (double)span : 1.0;
    if (p > 1)
        p = 1;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(3.14159265358979323846 * p));
}

static void test_schedules(void **state)
{
    (void)state;
    TrainCfg c;
    memset(&c, 0, sizeof c);
    c.lr = 3e-4;
    c.min_lr = 3e-5;
    c.decay_fraction = 0.25;
    const int64_t steps[] = {1, 2, 7, 100, 1000};
    const int64_t warm[] = {0, 1, 5, 100, 2000};
    for (int a = 0; a < 5; a++)
        for (int w = 0; w < 5; w++) {
            c.warmup = warm[w];
            int64_t S = steps[a], W = warm[w];
            for (int64_t s = 0; s < S + 2; s++) {
                double want = old_cosine(&c, s, S);
                c.lr_schedule = NULL;
                assert_true(rt_lr_at(&c, s, S) == want);
                c.lr_schedule = "cosine";
                assert_true(rt_lr_at(&c, s, S) == want);
                double warmup = s < W ? c.lr * (double)(s + 1) / (double)W : NAN;
                c.lr_schedule = "constant";
                assert_true(rt_lr_at(&c, s, S) == (s < W ? warmup : c.lr));
                c.lr_schedule = "linear";
                double p = S > W ? fmin(1, (double)(s - W) / (double)(S - W)) : 1;
                double lin = s < W ? warmup : c.lr - (c.lr - c.min_lr) * p;
                assert_true(fabs(rt_lr_at(&c, s, S) - lin) <= 1e-15);
                c.lr_schedule = "wsd";
                int64_t D = S - (int64_t)ceil(0.25 * (double)S);
                if (D < W)
                    D = W;
                double pd = S > D ? fmin(1, (double)(s - D) / (double)(S - D)) : 1;
                double wsd = s < W ? warmup : s < D ? c.lr : c.lr - (c.lr - c.min_lr) * pd;
                if (!(fabs(rt_lr_at(&c, s, S) - wsd) <= 1e-15))
                    fail_msg("wsd S %lld W %lld s %lld: %g, expected %g", (long long)S,
                             (long long)W, (long long)s, rt_lr_at(&c, s, S), wsd);
            }
        }
    /* wsd on 10 steps, decay_fraction 0.5, no warmup: 5 stable, then down */
    c.warmup = 0;
    c.min_lr = 0;
    c.lr = 1;
    c.decay_fraction = 0.5;
    c.lr_schedule = "wsd";
    const double want[10] = {1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2};
    for (int s = 0; s < 10; s++)
        assert_true(fabs(rt_lr_at(&c, s, 10) - want[s]) < 1e-15);
}

static int setup(void **state)
{
    (void)state;
    if (!getenv("KILN_BIN"))
        return -1;
    dir = scratch_dir("optimizers");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(dir);
    free(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_lion),         cmocka_unit_test(test_adafactor),
        cmocka_unit_test(test_param_groups), cmocka_unit_test(test_frozen),
        cmocka_unit_test(test_schedules),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
