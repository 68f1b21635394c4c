/* test_optimizer.c - pass_optimizer against a plain C AdamW with global-norm
 * clipping: three steps through the reference interpreter, params, moments
 * and the step counter compared with relative error < 1e-12; steps whose
 * loss, gradient norm or lr is not finite leave params, moments and the step
 * counter bit-identical, and the next finite step is the reference's next.
 * SGD, Lion and Adafactor keep that guard, and a frozen param has no
 * gradient output, state or update (their update rules: test_optimizers.c). */
#include "testutil.h"

#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NP 3
#define STEPS 3

/* Params of rank 2, 1 and 0 (weight decay applies to the first only). */
static const char *pname[NP] = {"W", "b", "s"};
static const int prank[NP] = {2, 1, 0};
static const int64_t pdim[NP][2] = {{3, 4}, {4, 0}, {0, 0}};

static Shape pshape(int i) { return shape_make(DT_F32, prank[i], pdim[i]); }

static const SrcLoc noloc = {NULL, 0};

/* A graph whose gradients are graph inputs "d.P", exposed as outputs
 * "grad.P" (what autodiff produces), so each step's gradients are chosen by
 * the test; loss = x + sum(W*W) + sum(b) + s, with x an input f32[] (the
 * test makes the loss NaN or Inf through it, gradients staying finite). */
static Graph *hand_graph(void)
{
    Graph *g = ir_new();
    ParamInit none = {0};
    int loss = ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 0, NULL), none);
    for (int i = 0; i < NP; i++) {
        Shape s = pshape(i);
        int p = ir_add_input(g, TK_PARAM, pname[i], s, (ParamInit){.kind = INIT_NORMAL, .a = 1});
        char nm[32];
        snprintf(nm, sizeof nm, "d.%s", pname[i]);
        int d = ir_add_input(g, TK_INPUT, nm, s, none);
        snprintf(nm, sizeof nm, "grad.%s", pname[i]);
        ir_add_output(g, nm, d);
        int x = i == 0 ? ir_op_x(g, OP_MUL, (int[]){p, p}, 2, NULL, noloc) : p;
        if (s.rank > 0) {
            OpAttr r = {.nia = s.rank};
            for (int k = 0; k < s.rank; k++)
                r.ia[k] = k;
            x = ir_op_x(g, OP_REDUCE_SUM, &x, 1, &r, noloc);
            OpAttr sc = {.rank = 0};
            x = ir_op_x(g, OP_RESHAPE, &x, 1, &sc, noloc);
        }
        loss = ir_op_x(g, OP_ADD, (int[]){loss, x}, 2, NULL, noloc);
    }
    ir_add_output(g, "loss", loss);
    return g;
}

typedef struct {
    double *p[NP], *m[NP], *v[NP], step;
} RefState;

static int64_t numel(int i)
{
    Shape s = pshape(i);
    return shape_numel(&s);
}

/* One AdamW step in plain C, the formula of optimizer.c; returns the norm. */
static double ref_step(RefState *st, double *const *grad, const PassOpts *o, double lr)
{
    double sq = 0;
    for (int i = 0; i < NP; i++)
        for (int64_t k = 0; k < numel(i); k++)
            sq += grad[i][k] * grad[i][k];
    double norm = sqrt(sq);
    double scale = o->grad_clip > 0 ? fmin(1.0, o->grad_clip / (norm + 1e-6)) : 1.0;
    double t = st->step + 1;
    double bc1 = 1 - pow(o->beta1, t), bc2 = 1 - pow(o->beta2, t);
    for (int i = 0; i < NP; i++) {
        double wd = prank[i] >= 2 ? o->weight_decay : 0;
        for (int64_t k = 0; k < numel(i); k++) {
            double gk = grad[i][k] * scale;
            double *p = &st->p[i][k], *m = &st->m[i][k], *v = &st->v[i][k];
            *m = o->beta1 * *m + (1 - o->beta1) * gk;
            *v = o->beta2 * *v + (1 - o->beta2) * gk * gk;
            double mh = *m / bc1, vh = *v / bc2;
            *p = *p - lr * (mh / (sqrt(vh) + o->eps) + wd * *p);
        }
    }
    st->step = t;
    return norm;
}

static double *dup(const double *x, int64_t n)
{
    double *r = xmalloc(sizeof(double) * (size_t)(n ? n : 1));
    memcpy(r, x, sizeof(double) * (size_t)n);
    return r;
}

static int tensor(const Graph *g, const char *fmt, const char *p)
{
    char nm[64];
    snprintf(nm, sizeof nm, fmt, p);
    int t = ir_find_tensor(g, nm);
    if (t < 0)
        fail_msg("no tensor \"%s\" after the optimizer", nm);
    return t;
}

/* What a step of run_case feeds: finite values, or one non-finite value. */
enum { OK, LOSS_NAN, LOSS_INF, GRAD_INF, GRAD_NAN, LR_INF };

/* Runs nsteps steps (STEPS when kinds is NULL, else kinds[s] says what step
 * s feeds) of the optimized graph in the interpreter and of the C reference
 * from the same params and gradients (gradient size gscale), and compares.
 * A non-finite step must leave params, moments and adam.step bit-identical
 * and the reference skips it. Returns the largest global norm seen. */
static double run_steps(const PassOpts *o, double gscale, bool simplify, const int *kinds,
                        int nsteps)
{
    Graph *g = hand_graph();
    Diag d = {{0}};
    assert_true(pass_optimizer(g, o, &d));
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("invalid after optimizer: %s", err);
    if (simplify) {
        assert_true(pass_simplify(g, o, &d));
        if (!ir_verify(g, err, sizeof err))
            fail_msg("invalid after simplify: %s", err);
    }
    /* every op the pass added carries OPF_OPTIM */
    int optim = 0;
    for (int i = 0; i < g->ops.n; i++)
        optim += (g->ops.v[i].flags & OPF_OPTIM) != 0;
    assert_true(optim > 0);

    double **val = ir_interp_alloc(g);
    RefState st = {.step = 0};
    srand(7);
    for (int i = 0; i < NP; i++) {
        int64_t n = numel(i);
        double *p0 = xmalloc(sizeof(double) * (size_t)n);
        for (int64_t k = 0; k < n; k++)
            p0[k] = (double)rand() / RAND_MAX - 0.5;
        st.p[i] = dup(p0, n);
        st.m[i] = xcalloc((size_t)n, sizeof(double));
        st.v[i] = xcalloc((size_t)n, sizeof(double));
        val[tensor(g, "%s", pname[i])] = p0;
        val[tensor(g, "adam.m.%s", pname[i])] = xcalloc((size_t)n, sizeof(double));
        val[tensor(g, "adam.v.%s", pname[i])] = xcalloc((size_t)n, sizeof(double));
    }
    val[tensor(g, "%s", "adam.step")] = xcalloc(1, sizeof(double));
    int lr_t = tensor(g, "%s", "lr"), x_t = tensor(g, "%s", "x");
    double maxnorm = 0;
    for (int s = 0; s < nsteps; s++) {
        int kind = kinds ? kinds[s] : OK;
        double lr = kind == LR_INF ? INFINITY : 1e-2 * (s + 1);
        double *grad[NP];
        for (int i = 0; i < NP; i++) {
            int64_t n = numel(i);
            grad[i] = xmalloc(sizeof(double) * (size_t)n);
            for (int64_t k = 0; k < n; k++)
                grad[i][k] = gscale * ((double)rand() / RAND_MAX - 0.5);
            if ((kind == GRAD_INF && i == 0) || (kind == GRAD_NAN && i == 1))
                grad[i][n - 1] = kind == GRAD_INF ? -INFINITY : NAN;
            int dt = tensor(g, "d.%s", pname[i]);
            free(val[dt]);
            val[dt] = dup(grad[i], n);
        }
        free(val[lr_t]);
        val[lr_t] = dup(&lr, 1);
        double x = kind == LOSS_NAN ? NAN : kind == LOSS_INF ? INFINITY : 0.25;
        free(val[x_t]);
        val[x_t] = dup(&x, 1);

        ir_interp(g, val, &(InterpOpts){.seed = 1, .step = s});
        int gn = ir_find_output(g, "grad_norm");
        assert_true(gn >= 0);
        if (kind != OK) {
            /* a NaN loss makes the norm NaN (the poisoned gradient); an
             * infinite lr leaves it finite */
            double n = val[gn][0];
            assert_true(kind == LR_INF ? isfinite(n)
                        : kind == GRAD_INF ? isinf(n) : isnan(n));
            double *before[NP][3], step0 = val[tensor(g, "%s", "adam.step")][0];
            for (int i = 0; i < NP; i++) {
                before[i][0] = dup(val[tensor(g, "%s", pname[i])], numel(i));
                before[i][1] = dup(val[tensor(g, "adam.m.%s", pname[i])], numel(i));
                before[i][2] = dup(val[tensor(g, "adam.v.%s", pname[i])], numel(i));
            }
            ir_interp_apply_updates(g, val);
            for (int i = 0; i < NP; i++) {
                size_t nb = sizeof(double) * (size_t)numel(i);
                if (memcmp(val[tensor(g, "%s", pname[i])], before[i][0], nb) ||
                    memcmp(val[tensor(g, "adam.m.%s", pname[i])], before[i][1], nb) ||
                    memcmp(val[tensor(g, "adam.v.%s", pname[i])], before[i][2], nb))
                    fail_msg("step %d (kind %d): param %s or its moments changed", s, kind,
                             pname[i]);
                for (int k = 0; k < 3; k++)
                    free(before[i][k]);
                free(grad[i]);
            }
            assert_true(val[tensor(g, "%s", "adam.step")][0] == step0);
            continue;
        }
        double norm = ref_step(&st, grad, o, lr);
        maxnorm = fmax(maxnorm, norm);
        assert_true(rel_err(val[gn], &norm, 1) < 1e-12);
        ir_interp_apply_updates(g, val);

        for (int i = 0; i < NP; i++) {
            int64_t n = numel(i);
            double ep = rel_err(val[tensor(g, "%s", pname[i])], st.p[i], n);
            double em = rel_err(val[tensor(g, "adam.m.%s", pname[i])], st.m[i], n);
            double ev = rel_err(val[tensor(g, "adam.v.%s", pname[i])], st.v[i], n);
            if (!(ep < 1e-12 && em < 1e-12 && ev < 1e-12))
                fail_msg("step %d param %s: rel err p %g m %g v %g", s, pname[i], ep, em, ev);
            free(grad[i]);
        }
        double *step = val[tensor(g, "%s", "adam.step")];
        assert_true(step[0] == st.step);
    }
    for (int i = 0; i < NP; i++) {
        free(st.p[i]);
        free(st.m[i]);
        free(st.v[i]);
    }
    ir_interp_free(g, val);
    ir_free(g);
    return maxnorm;
}

static double run_case(const PassOpts *o, double gscale, bool simplify)
{
    return run_steps(o, gscale, simplify, NULL, STEPS);
}

static void test_clip_active(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    o.grad_clip = 0.5;
    /* gradient norms well above the clip value: clipping scales them */
    assert_true(run_case(&o, 4.0, false) > 2 * o.grad_clip);
}

static void test_clip_inactive(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    o.grad_clip = 100.0;
    assert_true(run_case(&o, 1.0, false) < o.grad_clip);
}

static void test_no_clip_other_betas(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    o.grad_clip = 0;
    o.beta1 = 0.8;
    o.beta2 = 0.99;
    o.eps = 1e-6;
    o.weight_decay = 0.3;
    run_case(&o, 10.0, false);
}

/* simplify must not change what the update computes */
static void test_after_simplify(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    o.grad_clip = 0.5;
    run_case(&o, 4.0, true);
}

/* Non-finite steps between finite ones, with and without clipping and
 * simplify: each leaves params, m, v and adam.step bit-identical (what both
 * on_nonfinite = "stop" and "skip" rely on: the graph is the same, the
 * runtime only decides whether to go on), and the finite steps around them
 * are the reference's consecutive steps (bias correction counts only the
 * steps applied). */
static void test_nonfinite_steps_change_nothing(void **state)
{
    (void)state;
    static const int kinds[] = {LOSS_NAN, OK, LOSS_INF, GRAD_INF, OK, GRAD_NAN, LR_INF, OK};
    int n = (int)(sizeof kinds / sizeof kinds[0]);
    PassOpts o;
    pass_opts_default(&o);
    o.weight_decay = 0.3;
    for (int simplify = 0; simplify < 2; simplify++) {
        o.grad_clip = 0.5;
        run_steps(&o, 4.0, simplify, kinds, n);
        o.grad_clip = 0;
        run_steps(&o, 4.0, simplify, kinds, n);
    }
}

/* The smallest param's gradient output is what the comm pass all-reduces:
 * bit for bit the gradient while the loss is finite, NaN when it is not (so
 * that a NaN loss on one rank stops the update on every rank); the other
 * gradients are untouched. */
static void test_loss_poisons_smallest_gradient(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    Graph *g = hand_graph();
    Diag d = {{0}};
    assert_true(pass_optimizer(g, &o, &d));
    assert_true(pass_simplify(g, &o, &d));
    double **val = ir_interp_alloc(g);
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].op < 0 && g->t.v[i].kind != TK_CONST) {
            int64_t n = shape_numel(&g->t.v[i].s);
            val[i] = xcalloc((size_t)n, sizeof(double));
            for (int64_t k = 0; k < n; k++)
                val[i][k] = -0.375 + 0.125 * (double)k;
        }
    val[tensor(g, "%s", "d.s")][0] = -0.0;
    for (int bad = 0; bad < 2; bad++) {
        val[tensor(g, "%s", "x")][0] = bad ? NAN : 1.5;
        ir_interp(g, val, NULL);
        for (int i = 0; i < NP; i++) {
            char nm[32];
            snprintf(nm, sizeof nm, "grad.%s", pname[i]);
            const double *out = val[ir_find_output(g, nm)];
            const double *in = val[tensor(g, "d.%s", pname[i])];
            bool smallest = i == 2; /* s: 1 element */
            for (int64_t k = 0; k < numel(i); k++)
                if (bad && smallest ? !isnan(out[k]) : memcmp(&out[k], &in[k], sizeof *out))
                    fail_msg("loss %s: grad.%s[%lld] = %g (d.%s = %g)", bad ? "nan" : "finite",
                             pname[i], (long long)k, out[k], pname[i], in[k]);
        }
    }
    ir_interp_free(g, val);
    ir_free(g);
}

static void test_state_and_flags(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    Graph *g = hand_graph();
    int nops = g->ops.n;
    Diag d = {{0}};
    assert_true(pass_optimizer(g, &o, &d));
    /* the forward ops are untouched, every new op is OPF_OPTIM */
    for (int i = 0; i < g->ops.n; i++)
        assert_int_equal((g->ops.v[i].flags & OPF_OPTIM) != 0, i >= nops);
    for (int i = 0; i < NP; i++) {
        int p = tensor(g, "%s", pname[i]);
        int m = tensor(g, "adam.m.%s", pname[i]);
        int v = tensor(g, "adam.v.%s", pname[i]);
        assert_int_equal(g->t.v[m].kind, TK_STATE);
        assert_int_equal(g->t.v[m].init.kind, INIT_ZEROS);
        assert_int_equal(g->t.v[v].init.kind, INIT_ZEROS);
        assert_true(shape_eq(&g->t.v[m].s, &g->t.v[p].s));
        assert_true(shape_eq(&g->t.v[v].s, &g->t.v[p].s));
        int found = 0;
        for (int u = 0; u < g->upd.n; u++)
            found += g->upd.v[u].target == p || g->upd.v[u].target == m ||
                     g->upd.v[u].target == v;
        assert_int_equal(found, 3);
    }
    int lr = tensor(g, "%s", "lr");
    assert_int_equal(g->t.v[lr].kind, TK_INPUT);
    assert_int_equal(g->t.v[lr].s.rank, 0);
    int st = tensor(g, "%s", "adam.step");
    assert_int_equal(g->t.v[st].kind, TK_STATE);
    assert_int_equal(g->upd.n, 3 * NP + 1);
    ir_free(g);
}

static void test_diagnostics(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    Diag d = {{0}};

    /* no loss */
    Graph *g = ir_new();
    int p = ir_add_input(g, TK_PARAM, "w", shape_make(DT_F32, 1, (int64_t[]){2}),
                         (ParamInit){0});
    ir_add_output(g, "grad.w", p);
    assert_false(pass_optimizer(g, &o, &d));
    assert_non_null(strstr(d.msg, "loss"));
    ir_free(g);

    /* no params */
    g = ir_new();
    int x = ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 0, NULL), (ParamInit){0});
    ir_add_output(g, "loss", x);
    d.msg[0] = 0;
    assert_false(pass_optimizer(g, &o, &d));
    assert_non_null(strstr(d.msg, "no parameters to train"));
    ir_free(g);

    /* a param without a gradient */
    g = hand_graph();
    g->outs.n = 1; /* drop grad.b, grad.s, ... keep grad.W only */
    ir_add_output(g, "loss", 0);
    d.msg[0] = 0;
    assert_false(pass_optimizer(g, &o, &d));
    assert_non_null(strstr(d.msg, "grad.b"));
    ir_free(g);
}

/* End to end with autodiff: the update uses the gradients autodiff computed. */
static void test_with_autodiff(void **state)
{
    (void)state;
    PassOpts o;
    pass_opts_default(&o);
    o.grad_clip = 0.01;
    Graph *g = ir_new();
    int64_t wd[2] = {3, 2}, bd[1] = {2}, xd[2] = {4, 3};
    int x = ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 2, xd), (ParamInit){0});
    int w = ir_add_input(g, TK_PARAM, "w", shape_make(DT_F32, 2, wd), (ParamInit){0});
    int b = ir_add_input(g, TK_PARAM, "b", shape_make(DT_F32, 1, bd), (ParamInit){0});
    int y = ir_op_x(g, OP_MATMUL, (int[]){x, w}, 2, &(OpAttr){.nia = 2}, noloc);
    int bb = ir_op_x(g, OP_BROADCAST, &b, 1, &(OpAttr){.rank = 2, .shape = {4, 2}}, noloc);
    y = ir_op_x(g, OP_ADD, (int[]){y, bb}, 2, NULL, noloc);
    y = ir_op_x(g, OP_MUL, (int[]){y, y}, 2, NULL, noloc);
    y = ir_op_x(g, OP_REDUCE_SUM, &y, 1, &(OpAttr){.nia = 2, .ia = {0, 1}}, noloc);
    y = ir_op_x(g, OP_RESHAPE, &y, 1, &(OpAttr){.rank = 0}, noloc);
    ir_add_output(g, "loss", y);
    Diag d = {{0}};
    if (!pass_autodiff(g, &o, &d))
        fail_msg("autodiff: %s", d.msg);
    if (ir_find_output(g, "grad.w") < 0 || ir_find_output(g, "grad.b") < 0)
        fail_msg("autodiff added no grad.w or grad.b output");
    assert_true(pass_optimizer(g, &o, &d));
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("invalid after optimizer: %s", err);

    double **val = ir_interp_alloc(g);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op >= 0)
            continue;
        int64_t n = shape_numel(&t->s);
        val[i] = xcalloc((size_t)n, sizeof(double));
        for (int64_t k = 0; k < n && t->kind != TK_STATE; k++)
            val[i][k] = 0.1 * (double)((i * 7 + k * 3) % 11) - 0.5;
    }
    val[ir_find_tensor(g, "lr")][0] = 0.05;
    int wi = ir_find_tensor(g, "w"), bi = ir_find_tensor(g, "b");
    double w0[6], b0[2];
    memcpy(w0, val[wi], sizeof w0);
    memcpy(b0, val[bi], sizeof b0);
    ir_interp(g, val, NULL);
    /* first step by hand from the interpreted gradients */
    const double *gw = val[ir_find_output(g, "grad.w")], *gb = val[ir_find_output(g, "grad.b")];
    double sq = 0;
    for (int k = 0; k < 6; k++)
        sq += gw[k] * gw[k];
    for (int k = 0; k < 2; k++)
        sq += gb[k] * gb[k];
    double norm = sqrt(sq), scale = fmin(1, o.grad_clip / (norm + 1e-6));
    assert_true(scale < 1);
    double ew[6], eb[2];
    for (int k = 0; k < 8; k++) {
        bool isw = k < 6;
        double gk = (isw ? gw[k] : gb[k - 6]) * scale, p = isw ? w0[k] : b0[k - 6];
        double m = (1 - o.beta1) * gk, v = (1 - o.beta2) * gk * gk;
        double mh = m / (1 - o.beta1), vh = v / (1 - o.beta2);
        double r = p - 0.05 * (mh / (sqrt(vh) + o.eps) + (isw ? o.weight_decay * p : 0));
        if (isw)
            ew[k] = r;
        else
            eb[k - 6] = r;
    }
    ir_interp_apply_updates(g, val);
    assert_true(rel_err(val[wi], ew, 6) < 1e-12);
    assert_true(rel_err(val[bi], eb, 2) < 1e-12);
    ir_interp_free(g, val);
    ir_free(g);
}

/* SGD (momentum), Lion and Adafactor keep the guard: a NaN loss leaves every
 * param and state tensor bit-identical; a finite one moves every param.
 * A frozen param (W) loses its "grad.W" output and gets no state or update. */
static void test_other_optimizers_guard_and_frozen(void **state)
{
    (void)state;
    const int opts[3] = {PASS_OPT_SGD, PASS_OPT_LION, PASS_OPT_ADAFACTOR};
    for (int oi = 0; oi < 3; oi++)
        for (int frozen = 0; frozen < 2; frozen++)
            for (int nan = 0; nan < 2; nan++) {
                PassOpts o;
                pass_opts_default(&o);
                o.optimizer = opts[oi];
                o.momentum = 0.9;
                PassParamOpt fz = {"W", 1.0, NAN, true};
                if (frozen) {
                    o.param_opts = &fz;
                    o.nparam_opts = 1;
                }
                Graph *g = hand_graph();
                Diag d = {{0}};
                if (!pass_optimizer(g, &o, &d))
                    fail_msg("%s: %s", pass_optimizer_name(o.optimizer), d.msg);
                char err[1024];
                if (!ir_verify(g, err, sizeof err))
                    fail_msg("invalid after optimizer: %s", err);
                int w = tensor(g, "%s", "W");
                bool wupd = false;
                for (int u = 0; u < g->upd.n; u++)
                    wupd |= g->upd.v[u].target == w;
                assert_int_equal(wupd, !frozen);
                assert_int_equal(ir_find_output(g, "grad.W") >= 0, !frozen);
                for (int i = 0; i < g->t.n; i++) {
                    const char *nm = g->t.v[i].name;
                    size_t n = nm ? strlen(nm) : 0;
                    if (frozen && g->t.v[i].kind == TK_STATE && n > 2 &&
                        strcmp(nm + n - 2, ".W") == 0)
                        fail_msg("frozen W has state %s", nm);
                }
                double **val = ir_interp_alloc(g);
                int64_t nt = g->t.n;
                for (int i = 0; i < nt; i++) {
                    const Tensor *t = &g->t.v[i];
                    if (t->op >= 0)
                        continue;
                    int64_t n = shape_numel(&t->s);
                    val[i] = xcalloc((size_t)(n ? n : 1), sizeof(double));
                    for (int64_t k = 0; k < n && t->kind != TK_STATE; k++)
                        val[i][k] = 0.1 * (double)((i * 7 + k * 3) % 11) - 0.45;
                }
                val[tensor(g, "%s", "lr")][0] = 0.01;
                val[tensor(g, "%s", "x")][0] = nan ? NAN : 0.5;
                double **before = xcalloc((size_t)nt, sizeof(double *));
                for (int i = 0; i < nt; i++)
                    if (g->t.v[i].kind == TK_PARAM || g->t.v[i].kind == TK_STATE)
                        before[i] = dup(val[i], shape_numel(&g->t.v[i].s));
                ir_interp(g, val, &(InterpOpts){.seed = 1});
                ir_interp_apply_updates(g, val);
                for (int i = 0; i < nt; i++) {
                    if (!before[i])
                        continue;
                    size_t nb = sizeof(double) * (size_t)shape_numel(&g->t.v[i].s);
                    bool same = memcmp(before[i], val[i], nb) == 0;
                    bool want = nan || (frozen && i == w) || g->t.v[i].kind == TK_STATE;
                    if (g->t.v[i].kind == TK_PARAM && same != want)
                        fail_msg("%s frozen %d nan %d: param %s %s",
                                 pass_optimizer_name(o.optimizer), frozen, nan, g->t.v[i].name,
                                 same ? "unchanged" : "changed");
                    if (g->t.v[i].kind == TK_STATE && nan && !same)
                        fail_msg("%s: state %s changed on a NaN step",
                                 pass_optimizer_name(o.optimizer), g->t.v[i].name);
                    free(before[i]);
                }
                free(before);
                ir_interp_free(g, val);
                ir_free(g);
            }
}

/* A script's own state (nn.BatchNorm's running statistics, assign) keeps
 * the optimizer's guard too: a step not applied (NaN loss) leaves it
 * bit-identical; an applied one moves it. AdamW, and zero = 1's path. */
static void test_script_state_guarded(void **state)
{
    (void)state;
    static const char script[] = "local x = input('x', {4, 3})\n"
                                 "local h = nn.BatchNorm('bn', 3)(x)\n"
                                 "minimize(nn.Linear('fc', 3, 2)(h):sum())\n";
    for (int zero = 0; zero < 2; zero++)
        for (int nan = 0; nan < 2; nan++) {
            char err[2048] = "";
            Model *m =
                fe_load_model_text("bn.lua", script, sizeof script - 1, NULL, 0, err, sizeof err);
            if (!m)
                fail_msg("%s", err);
            Graph *g = m->g;
            PassOpts o;
            pass_opts_default(&o);
            o.zero = zero;
            Diag d = {{0}};
            if (!pass_autodiff(g, &o, &d) || !pass_optimizer(g, &o, &d))
                fail_msg("zero %d: %s", zero, d.msg);
            double **val = ir_interp_alloc(g);
            for (int i = 0; i < g->t.n; i++) {
                const Tensor *t = &g->t.v[i];
                if (t->op >= 0)
                    continue;
                int64_t n = shape_numel(&t->s);
                val[i] = xcalloc((size_t)(n ? n : 1), sizeof(double));
                for (int64_t k = 0; k < n; k++)
                    val[i][k] = 0.1 * (double)((i * 7 + k * 3) % 11) - 0.45;
            }
            val[tensor(g, "%s", "lr")][0] = 0.01;
            if (nan)
                val[tensor(g, "%s", "x")][5] = NAN;
            int rm = tensor(g, "%s", "bn.running_mean"), rv = tensor(g, "%s", "bn.running_var");
            double *b0 = dup(val[rm], 3), *b1 = dup(val[rv], 3);
            ir_interp(g, val, &(InterpOpts){.seed = 1});
            ir_interp_apply_updates(g, val);
            bool same = memcmp(b0, val[rm], sizeof(double) * 3) == 0 &&
                        memcmp(b1, val[rv], sizeof(double) * 3) == 0;
            if (same != (nan != 0))
                fail_msg("zero %d, %s loss: the running statistics %s", zero,
                         nan ? "NaN" : "finite", same ? "did not move" : "changed");
            free(b0);
            free(b1);
            ir_interp_free(g, val);
            fe_model_free(m);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_script_state_guarded),
        cmocka_unit_test(test_clip_active),
        cmocka_unit_test(test_clip_inactive),
        cmocka_unit_test(test_no_clip_other_betas),
        cmocka_unit_test(test_after_simplify),
        cmocka_unit_test(test_nonfinite_steps_change_nothing),
        cmocka_unit_test(test_loss_poisons_smallest_gradient),
        cmocka_unit_test(test_state_and_flags),
        cmocka_unit_test(test_diagnostics),
        cmocka_unit_test(test_with_autodiff),
        cmocka_unit_test(test_other_optimizers_guard_and_frozen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
