/* test_eval_graph.c - the evaluation graph: the model script run again with
 * nn.training = false, so dropout is the identity when kiln evaluates. */
#include "frontend.h"
#include "testutil.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_off_in_eval),
        cmocka_unit_test(test_interface_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
