/* test_eval_graph.c - the evaluation graph: the model script run again with
 * nn.training = false, so dropout is the identity when kiln evaluates. */
#include "frontend.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int count_random(const Graph *g)
{
    int n = 0;
    for (int i = 0; i < g->ops.n; i++)
        n += g->ops.v[i].code == OP_RANDOM;
    return n;
}

/* The loss of forward graph g in double precision, with the deterministic
 * inputs of random_model_inputs (drawn in declaration order, so two graphs
 * declaring the same params and inputs get the same values). */
static double loss_of(const Graph *g)
{
    void **host = random_model_inputs(g);
    double **val = ir_interp_alloc(g);
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        int64_t n = shape_numel(&x->s);
        val[t] = xcalloc((size_t)(n ? n : 1), sizeof(double));
        for (int64_t i = 0; i < n; i++)
            val[t][i] = x->s.dtype == DT_F32   ? ((float *)host[t])[i]
                        : x->s.dtype == DT_I32 ? ((int32_t *)host[t])[i]
                                               : ((uint8_t *)host[t])[i];
    }
    InterpOpts o = {.seed = 7, .step = 3};
    ir_interp(g, val, &o);
    int loss = ir_find_output(g, "loss");
    assert_true(loss >= 0);
    double v = val[loss][0];
    ir_interp_free(g, val);
    for (int t = 0; t < g->t.n; t++)
        free(host[t]);
    free(host);
    return v;
}

/* With dropout, evaluation uses a graph without random numbers that computes
 * exactly what the model computes with dropout 0; training keeps dropout. */
static void test_dropout_off_in_eval(void **state)
{
    (void)state;
    const char *drop[] = {"dropout=0.1"}, *none[] = {"dropout=0"};
    Model *m = load_model("models/gpt.lua", drop, 1);
    Model *m0 = load_model("models/gpt.lua", none, 1);
    assert_non_null(m->eval_g);
    assert_true(count_random(m->g) > 0);
    assert_int_equal(count_random(m->eval_g), 0);
    /* no random numbers: the evaluation graph is the forward graph with the
     * logits output, which the training step does not have */
    assert_non_null(m0->eval_g);
    assert_int_equal(count_random(m0->eval_g), 0);
    assert_true(ir_find_output(m0->eval_g, "logits") >= 0);
    assert_true(ir_find_output(m0->g, "logits") < 0);
    double train = loss_of(m->g), eval = loss_of(m->eval_g), ref = loss_of(m0->g);
    print_message("loss: training graph with dropout %.9f, evaluation graph %.9f, "
                  "dropout 0 %.9f\n",
                  train, eval, ref);
    assert_true(eval == ref);
    assert_true(train != ref);
    fe_model_free(m);
    fe_model_free(m0);
}

/* A script whose params depend on nn.training cannot share buffers between
 * its graphs: a clear error naming the script. */
static void test_interface_mismatch(void **state)
{
    (void)state;
    char *dir = scratch_dir("evalgraph");
    char path[4096];
    snprintf(path, sizeof path, "%s/bad.lua", dir);
    write_file(path, "local x = input(\"x\", {4, 3}, \"f32\")\n"
                     "local w = param(nn.training and \"w\" or \"v\", {3, 2}, normal(0.1))\n"
                     "minimize(nn.dropout(x:matmul(w), 0.5):sum())\n");
    char err[2048] = "";
    Model *m = fe_load_model(path, NULL, 0, err, sizeof err);
    print_message("%s\n", err);
    assert_null(m);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "evaluation graph"));
    assert_non_null(strstr(err, "'w'"));
    remove(path);
    free(dir);
}

/* Interprets g with the named tensors set (x, bn.weight, bn.bias,
 * bn.running_mean, bn.running_var); returns the value table. */
static double **run_bn(const Graph *g, const double *x, const double *w, const double *b,
                       const double *rm, const double *rv)
{
    double **val = ir_interp_alloc(g);
    const char *name[5] = {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"};
    const double *src[5] = {x, w, b, rm, rv};
    for (int k = 0; k < 5; k++) {
        int t = ir_find_tensor(g, name[k]);
        assert_true(t >= 0);
        int64_t n = shape_numel(&g->t.v[t].s);
        val[t] = xmalloc(sizeof(double) * (size_t)n);
        memcpy(val[t], src[k], sizeof(double) * (size_t)n);
    }
    InterpOpts o = {0};
    ir_interp(g, val, &o);
    return val;
}

/* nn.BatchNorm on x [N=4, C=2, L=3]: the training graph normalises with the
 * batch's statistics per channel and assigns running_mean <- (1 - m) rm + m
 * mean, running_var <- (1 - m) rv + m var * n / (n - 1) (n = 12); the
 * evaluation graph normalises with the state and assigns nothing. */
static void test_batchnorm(void **state)
{
    (void)state;
    static const char script[] =
        "local x = input('x', {4, 2, 3})\n"
        "local bn = nn.BatchNorm('bn', 2, {momentum = 0.25, eps = 1e-3})\n"
        "local y = bn(x)\n"
        "minimize((y * y):sum())\n"
        "output('y', y)\n";
    char err[2048] = "";
    Model *m = fe_load_model_text("bn.lua", script, sizeof script - 1, NULL, 0, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    assert_non_null(m->eval_g);
    assert_int_equal(m->g->upd.n, 2);
    assert_int_equal(m->eval_g->upd.n, 0);
    double x[24], w[2] = {1.5, -0.5}, b[2] = {0.25, 2}, rm[2] = {0.1, -0.2}, rv[2] = {0.9, 1.7};
    for (int i = 0; i < 24; i++)
        x[i] = (double)((i * 7) % 11) * 0.3 - 1.0 + (i % 3) * 0.05;
    double mean[2] = {0, 0}, var[2] = {0, 0};
    for (int i = 0; i < 24; i++)
        mean[i / 3 % 2] += x[i] / 12;
    for (int i = 0; i < 24; i++)
        var[i / 3 % 2] += (x[i] - mean[i / 3 % 2]) * (x[i] - mean[i / 3 % 2]) / 12;
    double **val = run_bn(m->g, x, w, b, rm, rv);
    const Graph *g = m->g;
    for (int k = 0; k < 2; k++) {
        const GraphUpdate *u = &g->upd.v[k];
        int c0 = strcmp(g->t.v[u->target].name, "bn.running_mean") == 0;
        for (int c = 0; c < 2; c++) {
            double want = c0 ? 0.75 * rm[c] + 0.25 * mean[c]
                             : 0.75 * rv[c] + 0.25 * var[c] * 12.0 / 11.0;
            if (fabs(val[u->value][c] - want) > 1e-12)
                fail_msg("%s[%d] = %.17g (expected %.17g)", g->t.v[u->target].name, c,
                         val[u->value][c], want);
        }
    }
    /* training normalises with the batch's statistics: the loss sum(y^2) */
    double loss = 0;
    for (int i = 0; i < 24; i++) {
        int c = i / 3 % 2;
        double yi = (x[i] - mean[c]) / sqrt(var[c] + 1e-3) * w[c] + b[c];
        loss += yi * yi;
    }
    int lt = ir_find_output(g, "loss");
    assert_true(lt >= 0);
    if (fabs(val[lt][0] - loss) > 1e-10 * loss)
        fail_msg("training loss %.17g (expected %.17g)", val[lt][0], loss);
    ir_interp_free(g, val);
    /* evaluation: the running statistics */
    val = run_bn(m->eval_g, x, w, b, rm, rv);
    int y = ir_find_output(m->eval_g, "y");
    assert_true(y >= 0);
    for (int i = 0; i < 24; i++) {
        int c = i / 3 % 2;
        double want = (x[i] - rm[c]) / sqrt(rv[c] + 1e-3) * w[c] + b[c];
        if (fabs(val[y][i] - want) > 1e-12)
            fail_msg("eval y[%d] = %.17g (expected %.17g)", i, val[y][i], want);
    }
    ir_interp_free(m->eval_g, val);
    fe_model_free(m);
}

/* state() and assign(): misuse is an error at the script's line */
static void test_assign_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"local s = state('s', {2}, zeros())\nassign(s, x)\n", "bn.lua:2: assign: the value does"},
        {"assign(x, x)\n", "bn.lua:1: assign: the first argument must be a tensor made by state()"},
        {"local s = state('s', {4}, zeros())\nassign(s, x)\nassign(s, x)\n",
         "bn.lua:3: assign: state 's' is assigned twice"},
        {"local s = state('adam.s', {4}, zeros())\n", "reserved for the optimizer"},
        {"local s = state('s', {4}, zeros(), 'i32')\n", "state must be float"},
        {"local bn = nn.BatchNorm('bn', 4)\nlocal a = bn(x:reshape{1, 4}) + bn(x:reshape{1, 4})\n",
         "bn.lua:2: nn.BatchNorm: a BatchNorm layer may be called once per step"},
        {"nn.BatchNorm('bn', 4, {momentun = 0.1})\n", "did you mean 'momentum'?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = xasprintf("local x = input('x', {4}); %sminimize(x:sum())\n", cases[i].text);
        char err[2048] = "";
        Model *m = fe_load_model_text("bn.lua", text, strlen(text), NULL, 0, err, sizeof err);
        if (m)
            fail_msg("case %zu: loaded (expected an error with '%s')", i, cases[i].want);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: expected '%s', got: %s", i, cases[i].want, err);
        free(text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_off_in_eval),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_assign_errors),
        cmocka_unit_test(test_interface_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
