/* test_comm.c - the comm pass on IR text (where starts and waits land,
 * buckets, --no-overlap, gradient accumulation), its place in the whole
 * pipeline for a model, and data-parallel equivalence: 2 ranks at batch b
 * (through `kiln train --nproc 2`) against 1 rank at batch 2b after 10
 * steps, with and without grad_accum and --no-overlap. */
#include "testutil.h"

#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *canon(const char *text)
{
    Graph *g = parse_or_fail(text);
    char *s = ir_print_str(g);
    ir_free(g);
    return s;
}

/* b's gradient is ready first (op 0), a's last (op 2); each is read only by
 * its update. */
static const char two_grads[] =
    "kiln-ir v1\n"
    "%0:f32[4] = param \"a\" zeros\n"
    "%1:f32[4] = param \"b\" zeros\n"
    "%2:f32[4] = input \"x\"\n"
    "%3:f32[4] = mul %2, %1 !backward\n"
    "%4:f32[4] = exp %2 !backward\n"
    "%5:f32[4] = mul %4, %0 !backward\n"
    "%6:f32[4] = sub %1, %3 !optim\n"
    "%7:f32[4] = sub %0, %5 !optim\n"
    "output \"grad.b\" %3\n"
    "output \"grad.a\" %5\n"
    "update %1 <- %6\n"
    "update %0 <- %7\n";

static void check(const char *in, int nranks, int64_t bucket_bytes, bool no_overlap, int accum,
                  const char *expect)
{
    Graph *g = parse_or_fail(in);
    PassOpts o;
    pass_opts_default(&o);
    o.nranks = nranks;
    o.bucket_bytes = bucket_bytes;
    o.no_overlap = no_overlap;
    o.grad_accum = accum;
    Diag d = {{0}};
    if (!pass_comm(g, &o, &d))
        fail_msg("comm failed: %s", d.msg);
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("invalid after comm: %s", err);
    char *got = ir_print_str(g);
    char *want = canon(expect);
    if (strcmp(got, want) != 0)
        fail_msg("comm: got\n%s\nexpected\n%s", got, want);
    free(got);
    free(want);
    ir_free(g);
}

/* One gradient per bucket: b's bucket starts right after b's gradient, before
 * a's backward ops; each wait sits right before the update reading it. */
static void test_place_overlap(void **state)
{
    (void)state;
    check(two_grads, 2, 16, false, 1,
          "kiln-ir v1\n"
          "%0:f32[4] = param \"a\" zeros\n"
          "%1:f32[4] = param \"b\" zeros\n"
          "%2:f32[4] = input \"x\"\n"
          "%3:f32[4] = mul %2, %1 !backward\n"
          "%4:u8[] = allreduce_start %3 {bucket=0}\n"
          "%5:f32[4] = exp %2 !backward\n"
          "%6:f32[4] = mul %5, %0 !backward\n"
          "%7:u8[] = allreduce_start %6 {bucket=1}\n"
          "%8:f32[4] = allreduce_wait %4, %3 {bucket=0}\n"
          "%9:f32[4] = sub %1, %8 !optim\n"
          "%10:f32[4] = allreduce_wait %7, %6 {bucket=1}\n"
          "%11:f32[4] = sub %0, %10 !optim\n"
          "output \"grad.b\" %8\n"
          "output \"grad.a\" %10\n"
          "update %1 <- %9\n"
          "update %0 <- %11\n");
}

/* --no-overlap: both starts after the last backward op. */
static void test_place_no_overlap(void **state)
{
    (void)state;
    check(two_grads, 2, 16, true, 1,
          "kiln-ir v1\n"
          "%0:f32[4] = param \"a\" zeros\n"
          "%1:f32[4] = param \"b\" zeros\n"
          "%2:f32[4] = input \"x\"\n"
          "%3:f32[4] = mul %2, %1 !backward\n"
          "%4:f32[4] = exp %2 !backward\n"
          "%5:f32[4] = mul %4, %0 !backward\n"
          "%6:u8[] = allreduce_start %3 {bucket=0}\n"
          "%7:u8[] = allreduce_start %5 {bucket=1}\n"
          "%8:f32[4] = allreduce_wait %6, %3 {bucket=0}\n"
          "%9:f32[4] = sub %1, %8 !optim\n"
          "%10:f32[4] = allreduce_wait %7, %5 {bucket=1}\n"
          "%11:f32[4] = sub %0, %10 !optim\n"
          "output \"grad.b\" %8\n"
          "output \"grad.a\" %10\n"
          "update %1 <- %9\n"
          "update %0 <- %11\n");
}

/* A cap of two gradients: one bucket, in readiness order (b then a),
 * started after a's gradient, waited for before the first update. */
static void test_place_one_bucket(void **state)
{
    (void)state;
    check(two_grads, 2, 32, false, 1,
          "kiln-ir v1\n"
          "%0:f32[4] = param \"a\" zeros\n"
          "%1:f32[4] = param \"b\" zeros\n"
          "%2:f32[4] = input \"x\"\n"
          "%3:f32[4] = mul %2, %1 !backward\n"
          "%4:f32[4] = exp %2 !backward\n"
          "%5:f32[4] = mul %4, %0 !backward\n"
          "%6:u8[] = allreduce_start %3, %5 {bucket=0}\n"
          "%7:f32[4] = allreduce_wait %6, %3 {bucket=0}\n"
          "%8:f32[4] = allreduce_wait %6, %5 {bucket=0}\n"
          "%9:f32[4] = sub %1, %7 !optim\n"
          "%10:f32[4] = sub %0, %8 !optim\n"
          "output \"grad.b\" %7\n"
          "output \"grad.a\" %8\n"
          "update %1 <- %9\n"
          "update %0 <- %10\n");
}

/* grad_accum=2 on one rank: (grad + accum) / 2 right after each gradient;
 * no collective. */
static void test_accum_one_rank(void **state)
{
    (void)state;
    check(two_grads, 1, 16, false, 2,
          "kiln-ir v1\n"
          "%0:f32[4] = param \"a\" zeros\n"
          "%1:f32[4] = param \"b\" zeros\n"
          "%2:f32[4] = input \"x\"\n"
          "%3:f32[4] = state \"accum.b\" zeros\n"
          "%4:f32[4] = state \"accum.a\" zeros\n"
          "%5:f32[4] = mul %2, %1 !backward\n"
          "%6:f32[4] = add %5, %3 !backward\n"
          "%7:f32[4] = const {value=0.5} !backward\n"
          "%8:f32[4] = mul %6, %7 !backward\n"
          "%9:f32[4] = exp %2 !backward\n"
          "%10:f32[4] = mul %9, %0 !backward\n"
          "%11:f32[4] = add %10, %4 !backward\n"
          "%12:f32[4] = const {value=0.5} !backward\n"
          "%13:f32[4] = mul %11, %12 !backward\n"
          "%14:f32[4] = sub %1, %8 !optim\n"
          "%15:f32[4] = sub %0, %13 !optim\n"
          "output \"grad.b\" %8\n"
          "output \"grad.a\" %13\n"
          "update %1 <- %14\n"
          "update %0 <- %15\n");
}

/* One rank, no accumulation: nothing changes. */
static void test_one_rank_unchanged(void **state)
{
    (void)state;
    check(two_grads, 1, 16, false, 1, two_grads);
}

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
        cmocka_unit_test(test_place_overlap),
        cmocka_unit_test(test_place_no_overlap),
        cmocka_unit_test(test_place_one_bucket),
        cmocka_unit_test(test_accum_one_rank),
        cmocka_unit_test(test_one_rank_unchanged),
        cmocka_unit_test(test_pipeline_mlp),
        cmocka_unit_test(test_equivalence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
