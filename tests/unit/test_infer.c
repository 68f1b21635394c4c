/* test_infer.c - kiln predict (rt_predict) against the reference
 * interpreter: gpt.lua's logits for every window of a text file, written
 * by the compiled evaluation step B = 3 windows a run (the last run holds
 * 2, padded), equal ir_interp's forward of the same model at batch 1, one
 * window at a time, in double precision. */
#include "testutil.h"
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T = 16, NWIN = 5 };

static void test_predict_equals_interp(void **state)
{
    (void)state;
    char *dir = scratch_dir("infer");
    char *txt = xasprintf("%s/small.txt", dir), *w = xasprintf("%s/w.safetensors", dir);
    char *out = xasprintf("%s/p.safetensors", dir);
    /* NWIN windows of T+1 bytes starting every T, and a tail of 7 left out */
    char text[NWIN * T + 1 + 7 + 1];
    for (int i = 0; i < (int)sizeof text - 1; i++)
        text[i] = (char)(' ' + (i * 37 + i / 5) % 90);
    text[sizeof text - 1] = 0;
    write_file(txt, text);
    const char *sets3[] = {"L=1", "C=32", "H=2", "T=16", "batch=3"};
    const char *sets1[] = {"L=1", "C=32", "H=2", "T=16", "batch=1"};
    Model *m = load_model("models/gpt.lua", sets3, 5);
    Model *m1 = load_model("models/gpt.lua", sets1, 5);
    /* random params, saved as the weights predict loads */
    void **host = random_model_inputs(m->g);
    Diag d = {{0}};
    if (!rt_weights_save(w, m->g, host, &d))
        fail_msg("%s", d.msg);
    const char *outs[] = {"logits"};
    InferOpts o = {.init_from = w, .data_path = txt, .threads = 1, .quiet = true,
                   .outputs = outs, .noutputs = 1, .out = out};
    assert_int_equal(rt_predict(m, &o), 0);
    StFile f;
    if (!rt_st_read(out, &f, &d))
        fail_msg("%s", d.msg);
    const StTensor *lt = rt_st_find(&f, "logits");
    assert_non_null(lt);
    assert_int_equal(lt->dtype, DT_F32);
    assert_int_equal(lt->rank, 3);
    assert_int_equal(lt->dim[0], NWIN);
    assert_int_equal(lt->dim[1], T);
    int64_t V = lt->dim[2], per = T * V;
    /* the reference: batch 1, window by window */
    const Graph *g = m1->eval_g ? m1->eval_g : m1->g;
    int lid = ir_find_output(g, "logits");
    assert_true(lid >= 0);
    double worst = 0;
    for (int win = 0; win < NWIN; win++) {
        double **val = ir_interp_alloc(g);
        for (int t = 0; t < g->t.n; t++) {
            const Tensor *x = &g->t.v[t];
            if (x->op >= 0)
                continue;
            int64_t n = shape_numel(&x->s);
            val[t] = xcalloc((size_t)(n ? n : 1), sizeof(double));
            if (x->kind == TK_PARAM) {
                int src = ir_find_tensor(m->g, x->name);
                assert_true(src >= 0);
                for (int64_t i = 0; i < n; i++)
                    val[t][i] = ((const float *)host[src])[i];
            } else if (strcmp(x->name, "tokens") == 0 || strcmp(x->name, "targets") == 0) {
                int shift = strcmp(x->name, "targets") == 0;
                for (int64_t i = 0; i < n; i++)
                    val[t][i] = (unsigned char)text[win * T + i + shift];
            }
        }
        InterpOpts io = {.seed = m1->train.seed};
        ir_interp(g, val, &io);
        assert_int_equal(shape_numel(&g->t.v[lid].s), per);
        const float *got = (const float *)lt->data + win * per;
        double num = 0, den = 0;
        for (int64_t i = 0; i < per; i++) {
            double e = (double)got[i] - val[lid][i];
            num += e * e;
            den += val[lid][i] * val[lid][i];
        }
        double rel = sqrt(num / den);
        assert_true(isfinite(rel));
        if (rel > worst)
            worst = rel;
        ir_interp_free(g, val);
    }
    print_message("kiln predict vs ir_interp: %d windows, worst relative error %.3g\n", NWIN,
                  worst);
    assert_true(worst < 1e-5);
    rt_st_free(&f);
    for (int t = 0; t < m->g->t.n; t++)
        free(host[t]);
    free(host);
    fe_model_free(m);
    fe_model_free(m1);
    remove_tree(dir);
    free(dir);
    free(txt);
    free(w);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_predict_equals_interp)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
