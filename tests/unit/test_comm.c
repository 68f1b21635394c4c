/* test_comm.c - the comm pass's place in the whole pipeline for a model,
 * and data-parallel equivalence: 2 ranks at batch b (through `kiln train
 * --nproc 2`) against 1 rank at batch 2b after 10 steps, with and without
 * grad_accum and --no-overlap. The comm pass on IR text (where starts and
 * waits land, buckets, --no-overlap, gradient accumulation) is
 * tests/passes/comm_*.ir. */
#include "testutil.h"

#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole pipeline on the MLP (3 layers) for 2 ranks, small buckets: in
 * the final schedule the first bucket starts before backward ends, every
 * start follows its last gradient's producer, every wait precedes the first
 * other reader of its gradient, and --no-overlap starts all after backward. */
static void pipeline_mlp(bool no_overlap, int *nbuckets, int *first_start, int *bwd_end)
{
    char err[2048];
    const char *sets[] = {"depth=3"};
    Model *m = fe_load_model("models/mlp.lua", sets, 1, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    Graph *g = ir_clone(m->g);
    PassOpts o;
    pass_opts_default(&o);
    o.nranks = 2;
    o.bucket_bytes = 1024; /* a bias and a weight of 128x128 do not share one */
    o.no_overlap = no_overlap;
    Diag d = {{0}};
    if (!pass_pipeline(g, &o, NULL, NULL, NULL, &d))
        fail_msg("%s", d.msg);
    *nbuckets = 0;
    *first_start = -1;
    *bwd_end = -1;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code == OP_ALLREDUCE_START) {
            if (*first_start < 0)
                *first_start = i;
            (*nbuckets)++;
            int last = -1;
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                assert_true(p < i);
                if (p > last)
                    last = p;
            }
            if (!no_overlap) /* nothing but other starts between */
                for (int k = last + 1; k < i; k++)
                    assert_int_equal(g->ops.v[k].code, OP_ALLREDUCE_START);
        }
        if (op->code == OP_ALLREDUCE_WAIT) {
            /* the raw gradient is read by no op after its wait except other
             * waits */
            for (int k = i + 1; k < g->ops.n; k++) {
                const Op *r = &g->ops.v[k];
                for (int j = 0; j < r->nin; j++)
                    if (r->in[j] == op->in[1])
                        assert_true(r->code == OP_ALLREDUCE_WAIT);
            }
            /* every bucket member is waited for */
            assert_int_equal(g->ops.v[g->t.v[op->in[0]].op].code, OP_ALLREDUCE_START);
        }
    }
    /* memplan: a bucket's buffers stay live from its start through its
     * wait, and no other storage live in between shares their bytes */
    MemPlan *mp = pass_memplan(g, &d);
    assert_non_null(mp);
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code != OP_ALLREDUCE_WAIT)
            continue;
        int start = g->t.v[op->in[0]].op, r = mp->root[op->in[1]];
        assert_int_equal(mp->root[op->out], r);
        assert_true(mp->first[r] <= start && mp->last[r] >= i);
        for (int t = 0; t < g->t.n; t++) {
            if (mp->root[t] != t || t == r || mp->persistent[t] || mp->first[t] < 0)
                continue;
            bool meet = mp->first[t] <= i && mp->last[t] >= start;
            bool share = mp->offset[t] < mp->offset[r] + mp->bytes[r] &&
                         mp->offset[r] < mp->offset[t] + mp->bytes[t];
            assert_false(meet && share);
        }
    }
    pass_memplan_free(mp);
    /* backward ends where the last gradient output is produced */
    for (int k = 0; k < g->outs.n; k++) {
        if (strncmp(g->outs.v[k].name, "grad.", 5) != 0)
            continue;
        const Op *w = &g->ops.v[g->t.v[g->outs.v[k].t].op];
        assert_int_equal(w->code, OP_ALLREDUCE_WAIT);
        int p = g->t.v[w->in[1]].op;
        if (p > *bwd_end)
            *bwd_end = p;
    }
    ir_free(g);
    fe_model_free(m);
}

static void test_pipeline_mlp(void **state)
{
    (void)state;
    int nb, first, end;
    pipeline_mlp(false, &nb, &first, &end);
    assert_true(nb >= 3);
    assert_true(first < end); /* the first bucket starts before backward ends */
    pipeline_mlp(true, &nb, &first, &end);
    assert_true(nb >= 3);
    assert_true(first > end);
}

/* ---- data-parallel equivalence through the kiln binary ---- */

static char *dir;

static void train(const char *args, const char *weights)
{
    const char *bin = getenv("KILN_BIN");
    if (!bin)
        fail_msg("KILN_BIN is not set (run through ctest)");
    char *cmd = xasprintf("%s train models/mlp.lua --steps 10 -q --set depth=3 "
                          "--set bucket_mb=0.01 %s --save-weights %s/%s",
                          bin, args, dir, weights);
    run_or_fail(cmd);
    free(cmd);
}

/* Largest per-tensor ||a - b|| / ||b|| between two weights files. */
static double max_rel(const char *a, const char *b)
{
    char *pa = xasprintf("%s/%s", dir, a), *pb = xasprintf("%s/%s", dir, b);
    StFile fa, fb;
    Diag d = {{0}};
    if (!rt_st_read(pa, &fa, &d) || !rt_st_read(pb, &fb, &d))
        fail_msg("%s", d.msg);
    assert_true(fa.n == fb.n && fa.n > 0);
    double worst = 0;
    for (int i = 0; i < fa.n; i++) {
        const StTensor *x = &fa.t[i], *y = rt_st_find(&fb, x->name);
        assert_non_null(y);
        assert_int_equal(x->nbytes, y->nbytes);
        double e = rel_err_f32(x->data, y->data, (int64_t)(x->nbytes / 4));
        if (!(e <= worst))
            worst = e; /* NaN and Inf stay */
    }
    rt_st_free(&fa);
    rt_st_free(&fb);
    free(pa);
    free(pb);
    return worst;
}

static void test_equivalence(void **state)
{
    (void)state;
    dir = scratch_dir("comm");
    train("--set batch=64", "one.safetensors");
    train("--set batch=32 --nproc 2", "two.safetensors");
    train("--set batch=32 --nproc 2 --no-overlap", "two_nooverlap.safetensors");
    train("--set batch=16 --nproc 2 --set grad_accum=2", "two_accum.safetensors");
    train("--set batch=32 --set grad_accum=2", "one_accum.safetensors");
    double e2 = max_rel("two.safetensors", "one.safetensors");
    double en = max_rel("two_nooverlap.safetensors", "two.safetensors");
    double ea = max_rel("two_accum.safetensors", "one.safetensors");
    double e1 = max_rel("one_accum.safetensors", "one.safetensors");
    print_message("rel diff: 2 ranks %.3g, --no-overlap vs default %.3g, 2 ranks x accum 2 "
                  "%.3g, 1 rank x accum 2 %.3g\n", e2, en, ea, e1);
    assert_true(e2 < 1e-5);
    assert_true(en == 0); /* the same buckets, the same sums: the same bits */
    assert_true(ea < 1e-5);
    assert_true(e1 < 1e-5);
    /* and the comparison can fail: 10 steps at another batch differ */
    train("--set batch=32", "half.safetensors");
    assert_true(max_rel("half.safetensors", "one.safetensors") > 1e-3);
    remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_mlp),
        cmocka_unit_test(test_equivalence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
