/* test_checkpoint.c - checkpoints and weights: exact round trip, model
 * fingerprint, shape and missing-tensor errors, non-finite values refused
 * both ways, stale temp files swept. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"
#include "train.h"

static Graph *model(int64_t hidden, const char *extra)
{
    Graph *g = ir_new();
    ParamInit pi = {INIT_NORMAL, 0.02, 0};
    ParamInit z = {INIT_ZEROS, 0, 0};
    ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 2, (int64_t[]){4, 3}), z);
    ir_add_input(g, TK_PARAM, "w1", shape_make(DT_F32, 2, (int64_t[]){3, hidden}), pi);
    ir_add_input(g, TK_PARAM, "b1", shape_make(DT_F32, 1, (int64_t[]){hidden}), z);
    if (extra)
        ir_add_input(g, TK_PARAM, extra, shape_make(DT_F32, 1, (int64_t[]){2}), z);
    ir_add_input(g, TK_STATE, "adam.step", shape_make(DT_F32, 0, NULL), z);
    ir_add_input(g, TK_STATE, "adam.m.w1", shape_make(DT_F32, 2, (int64_t[]){3, hidden}), z);
    return g;
}

/* host buffers for every param/state, filled from `base` */
static void **alloc_vals(const Graph *g, float base)
{
    void **v = xcalloc((size_t)g->t.n, sizeof *v);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM && t->kind != TK_STATE)
            continue;
        int64_t n = shape_numel(&t->s);
        float *p = xmalloc((size_t)n * sizeof *p);
        for (int64_t k = 0; k < n; k++)
            p[k] = base + (float)i * 0.37f + (float)k * 1e-3f;
        v[i] = p;
    }
    return v;
}

static void free_vals(const Graph *g, void **v)
{
    for (int i = 0; i < g->t.n; i++)
        free(v[i]);
    free(v);
}

static bool same_vals(const Graph *g, void **a, void **b, bool params_only)
{
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM && (params_only || t->kind != TK_STATE))
            continue;
        if (memcmp(a[i], b[i], (size_t)shape_numel(&t->s) * 4) != 0)
            return false;
    }
    return true;
}

static void test_checkpoint_round_trip(void **state)
{
    (void)state;
    char *dir = scratch_dir("ckpt");
    char *p = xasprintf("%s/c.safetensors", dir);
    Graph *g = model(5, NULL);
    void **a = alloc_vals(g, 1.0f), **b = alloc_vals(g, -7.0f);
    Diag d;
    CkptMeta m = {.step = 123, .data_pos = 456, .seed = 0xfedcba9876543210ull}, r = {0};
    assert_true(rt_ckpt_save(p, g, a, &m, &d));
    assert_false(same_vals(g, a, b, false));
    if (!rt_ckpt_load(p, g, b, &r, &d))
        fail_msg("%s", d.msg);
    assert_true(same_vals(g, a, b, false));
    assert_int_equal(r.step, 123);
    assert_int_equal(r.data_pos, 456);
    assert_true(r.seed == 0xfedcba9876543210ull);

    /* a checkpoint also initialises weights */
    void **c = alloc_vals(g, 3.0f);
    assert_true(rt_weights_load(p, g, c, &d));
    assert_true(same_vals(g, a, c, true));
    assert_false(same_vals(g, a, c, false)); /* state untouched */
    free_vals(g, c);

    unlink(p);
    free_vals(g, a);
    free_vals(g, b);
    ir_free(g);
    free(p);
    rmdir(dir);
    free(dir);
}

static void test_weights(void **state)
{
    (void)state;
    char *dir = scratch_dir("ckpt");
    char *p = xasprintf("%s/w.safetensors", dir);
    Graph *g = model(5, NULL);
    void **a = alloc_vals(g, 1.0f), **b = alloc_vals(g, 2.0f);
    Diag d;
    assert_true(rt_weights_save(p, g, a, &d));
    StFile f;
    assert_true(rt_st_read(p, &f, &d));
    assert_int_equal(f.n, 2); /* params only */
    assert_null(rt_st_find(&f, "adam.step"));
    rt_st_free(&f);
    assert_true(rt_weights_load(p, g, b, &d));
    assert_true(same_vals(g, a, b, true));

    /* a weights file is not a checkpoint */
    CkptMeta m;
    assert_false(rt_ckpt_load(p, g, b, &m, &d));
    assert_non_null(strstr(d.msg, "not a kiln checkpoint"));
    assert_non_null(strstr(d.msg, "--init-from"));

    /* wrong shape: names the tensor and both shapes; nothing is loaded */
    Graph *g2 = model(6, NULL);
    void **c = alloc_vals(g2, 9.0f), **keep = alloc_vals(g2, 9.0f);
    assert_false(rt_weights_load(p, g2, c, &d));
    if (!strstr(d.msg, "\"w1\"") || !strstr(d.msg, "f32[3,6]") || !strstr(d.msg, "f32[3,5]") ||
        !strstr(d.msg, p))
        fail_msg("unclear message: %s", d.msg);
    assert_true(same_vals(g2, c, keep, false));
    free_vals(g2, c);
    free_vals(g2, keep);
    ir_free(g2);

    /* missing tensor */
    Graph *g3 = model(5, "gamma");
    c = alloc_vals(g3, 0.0f);
    assert_false(rt_weights_load(p, g3, c, &d));
    if (!strstr(d.msg, "missing tensor \"gamma\"") || !strstr(d.msg, "f32[2]"))
        fail_msg("unclear message: %s", d.msg);
    free_vals(g3, c);
    ir_free(g3);

    unlink(p);
    free_vals(g, a);
    free_vals(g, b);
    ir_free(g);
    free(p);
    rmdir(dir);
    free(dir);
}

static void test_other_model(void **state)
{
    (void)state;
    char *dir = scratch_dir("ckpt");
    char *p = xasprintf("%s/c.safetensors", dir);
    Graph *g = model(5, NULL), *g2 = model(6, NULL), *g3 = model(5, NULL);
    assert_true(rt_model_fingerprint(g) == rt_model_fingerprint(g3));
    assert_true(rt_model_fingerprint(g) != rt_model_fingerprint(g2));
    void **a = alloc_vals(g, 1.0f), **b = alloc_vals(g2, 2.0f);
    CkptMeta m = {1, 2, 3};
    Diag d;
    assert_true(rt_ckpt_save(p, g, a, &m, &d));
    assert_false(rt_ckpt_load(p, g2, b, &m, &d));
    if (!strstr(d.msg, "different model") || !strstr(d.msg, "w1"))
        fail_msg("unclear message: %s", d.msg);

    /* a corrupt checkpoint is reported, not loaded */
    FILE *f = fopen(p, "r+b");
    uint8_t junk[8] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    fwrite(junk, 1, 8, f);
    fclose(f);
    assert_false(rt_ckpt_load(p, g, a, &m, &d));
    assert_non_null(strstr(d.msg, "corrupt"));

    unlink(p);
    free_vals(g, a);
    free_vals(g2, b);
    ir_free(g);
    ir_free(g2);
    ir_free(g3);
    free(p);
    rmdir(dir);
    free(dir);
}

/* Gradient accumulators ("accum.*" state) are not saved and loading zeroes
 * them: a checkpoint of a grad_accum=1 graph (no accumulators) loads into a
 * grad_accum=2 graph and back, everything else restored exactly. */
static void test_accumulators(void **state)
{
    (void)state;
    char *dir = scratch_dir("ckpt");
    char *p1 = xasprintf("%s/k1.safetensors", dir), *p2 = xasprintf("%s/k2.safetensors", dir);
    Graph *g1 = model(5, NULL), *g2 = model(5, NULL);
    ParamInit z = {INIT_ZEROS, 0, 0};
    ir_add_input(g2, TK_STATE, "accum.w1", shape_make(DT_F32, 2, (int64_t[]){3, 5}), z);
    ir_add_input(g2, TK_STATE, "accum.b1", shape_make(DT_F32, 1, (int64_t[]){5}), z);
    assert_true(rt_model_fingerprint(g1) == rt_model_fingerprint(g2));
    Diag d;
    CkptMeta m = {.step = 7, .data_pos = 7, .seed = 1}, r = {0};

    /* grad_accum=1 -> 2: accumulators zeroed, the rest restored */
    void **a1 = alloc_vals(g1, 1.0f), **b2 = alloc_vals(g2, -3.0f);
    assert_true(rt_ckpt_save(p1, g1, a1, &m, &d));
    if (!rt_ckpt_load(p1, g2, b2, &r, &d))
        fail_msg("%s", d.msg);
    assert_int_equal(r.step, 7);
    for (int i = 0; i < g1->t.n; i++) {
        const Tensor *t = &g1->t.v[i];
        if (t->kind == TK_PARAM || t->kind == TK_STATE)
            assert_memory_equal(a1[i], b2[ir_find_tensor(g2, t->name)],
                                (size_t)shape_numel(&t->s) * 4);
    }
    for (int i = 0; i < g2->t.n; i++) {
        const Tensor *t = &g2->t.v[i];
        if (strncmp(t->name, "accum.", 6) != 0)
            continue;
        for (int64_t k = 0; k < shape_numel(&t->s); k++)
            assert_true(((float *)b2[i])[k] == 0.0f);
    }

    /* grad_accum=2 -> 1: the checkpoint holds no accumulators */
    void **a2 = alloc_vals(g2, 2.0f), **b1 = alloc_vals(g1, 5.0f);
    assert_true(rt_ckpt_save(p2, g2, a2, &m, &d));
    StFile f;
    assert_true(rt_st_read(p2, &f, &d));
    assert_null(rt_st_find(&f, "accum.w1"));
    assert_null(rt_st_find(&f, "accum.b1"));
    assert_int_equal(f.n, 4); /* w1, b1, adam.step, adam.m.w1 */
    rt_st_free(&f);
    if (!rt_ckpt_load(p2, g1, b1, &r, &d))
        fail_msg("%s", d.msg);
    assert_true(same_vals(g1, a2, b1, false)); /* g1's ids are g2's first ids */

    /* a missing optimizer state is still refused */
    Graph *g3 = model(5, NULL);
    ir_add_input(g3, TK_STATE, "adam.v.w1", shape_make(DT_F32, 2, (int64_t[]){3, 5}), z);
    void **c3 = alloc_vals(g3, 0.0f);
    assert_false(rt_ckpt_load(p1, g3, c3, &r, &d));
    if (!strstr(d.msg, "missing tensor \"adam.v.w1\""))
        fail_msg("unclear message: %s", d.msg);
    free_vals(g3, c3);
    ir_free(g3);

    unlink(p1);
    unlink(p2);
    free_vals(g1, a1);
    free_vals(g1, b1);
    free_vals(g2, a2);
    free_vals(g2, b2);
    ir_free(g1);
    ir_free(g2);
    free(p1);
    free(p2);
    rmdir(dir);
    free(dir);
}

static int entries(const char *dir)
{
    char *cmd = xasprintf("ls -A '%s' | wc -l", dir), *out;
    assert_int_equal(run_cmd(cmd, &out), 0);
    int n = atoi(out);
    free(out);
    free(cmd);
    return n;
}

static void set_bits(void *p, int64_t k, uint32_t bits)
{
    memcpy((uint8_t *)p + 4 * k, &bits, 4);
}

/* Issue 13: a NaN or Inf is never written (nothing is, not even a temp
 * file), and a file holding one is refused by name and first index, for
 * weights and for a checkpoint's optimizer state; nothing is loaded. */
static void test_nonfinite(void **state)
{
    (void)state;
    char *dir = scratch_dir("ckpt");
    char *p = xasprintf("%s/w.safetensors", dir);
    Graph *g = model(5, NULL);
    int w1 = ir_find_tensor(g, "w1"), m1 = ir_find_tensor(g, "adam.m.w1");
    void **a = alloc_vals(g, 1.0f), **b = alloc_vals(g, 2.0f), **keep = alloc_vals(g, 2.0f);
    Diag d;
    CkptMeta m = {.step = 3, .data_pos = 3, .seed = 1}, r;

    set_bits(a[w1], 4, 0x7fc00000u); /* NaN */
    set_bits(a[w1], 6, 0x7f800000u); /* +Inf */
    assert_false(rt_weights_save(p, g, a, &d));
    if (!strstr(d.msg, p) || !strstr(d.msg, "not written: param \"w1\" holds NaN at index 4"))
        fail_msg("unclear message: %s", d.msg);
    assert_false(rt_ckpt_save(p, g, a, &m, &d));
    assert_int_equal(entries(dir), 0);
    set_bits(a[w1], 4, 0x3f800000u);
    set_bits(a[w1], 6, 0x3f800000u);
    set_bits(a[m1], 2, 0xff800000u); /* -Inf in the optimizer state */
    assert_true(rt_weights_save(p, g, a, &d)); /* params only: finite */
    unlink(p);
    assert_false(rt_ckpt_save(p, g, a, &m, &d));
    if (!strstr(d.msg, "optimizer state \"adam.m.w1\" holds -Inf at index 2"))
        fail_msg("unclear message: %s", d.msg);
    assert_int_equal(entries(dir), 0);

    /* such files (written around the guard) are refused, nothing loaded */
    StTensor ts[4];
    int n = 0;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM && t->kind != TK_STATE)
            continue;
        assert_true(n < 4);
        ts[n] = (StTensor){.name = (char *)t->name, .dtype = t->s.dtype, .rank = t->s.rank,
                           .data = a[i], .nbytes = (size_t)shape_numel(&t->s) * 4};
        memcpy(ts[n].dim, t->s.dim, sizeof ts[n].dim);
        n++;
    }
    assert_int_equal(n, 4);
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)rt_model_fingerprint(g));
    const char *k[] = {"kiln.kind", "kiln.fingerprint", "kiln.step", "kiln.data_pos",
                       "kiln.seed"};
    const char *v[] = {"checkpoint", fp, "3", "3", "1"};
    assert_true(rt_st_write(p, ts, n, k, v, 5, &d));
    assert_true(rt_weights_load(p, g, b, &d)); /* weights: params only, finite */
    assert_false(rt_ckpt_load(p, g, b, &r, &d));
    if (!strstr(d.msg, p) || !strstr(d.msg, "tensor \"adam.m.w1\" holds -Inf at index 2"))
        fail_msg("unclear message: %s", d.msg);
    free_vals(g, b);
    b = alloc_vals(g, 2.0f);
    set_bits(a[w1], 0, 0x7f800001u); /* a NaN with a low mantissa bit */
    assert_true(rt_st_write(p, ts, n, k, v, 5, &d));
    assert_false(rt_weights_load(p, g, b, &d));
    if (!strstr(d.msg, "tensor \"w1\" holds NaN at index 0 (expected finite values)"))
        fail_msg("unclear message: %s", d.msg);
    assert_true(same_vals(g, b, keep, false)); /* all or none */

    /* bf16 and f16 by their bits: the largest finite values pass */
    Graph *h = ir_new();
    ParamInit z = {INIT_ZEROS, 0, 0};
    ir_add_input(h, TK_PARAM, "hb", shape_make(DT_BF16, 1, (int64_t[]){3}), z);
    ir_add_input(h, TK_PARAM, "hf", shape_make(DT_F16, 1, (int64_t[]){3}), z);
    uint16_t hb[3] = {0x7f7f, 0xff7f, 0x0001}, hf[3] = {0x7bff, 0xfbff, 0x0001};
    void *hv[2] = {hb, hf};
    assert_true(rt_weights_save(p, h, hv, &d));
    hb[1] = 0xff80; /* bf16 -Inf */
    assert_false(rt_weights_save(p, h, hv, &d));
    assert_non_null(strstr(d.msg, "\"hb\" holds -Inf at index 1"));
    hb[1] = 0xff7f;
    hf[2] = 0x7e00; /* f16 NaN */
    assert_false(rt_weights_save(p, h, hv, &d));
    assert_non_null(strstr(d.msg, "\"hf\" holds NaN at index 2"));
    ir_free(h);

    unlink(p);
    free_vals(g, a);
    free_vals(g, b);
    free_vals(g, keep);
    ir_free(g);
    free(p);
    rmdir(dir);
    free(dir);
}

/* Issue 13 item 9: the temp files of a checkpoint of PREFIX (any step) and
 * of the weights file whose writer is gone are removed; a trailing
 * .safetensors on PREFIX is dropped, as train.c names the files. */
static void test_sweep_tmp(void **state)
{
    (void)state;
    char *dir = scratch_dir("ckpt");
    const char *gone[] = {"ck.step12.safetensors.tmp.999999999.abcdef",
                          "ck.step3.safetensors.tmp.999999998.ABCDEF",
                          "w.safetensors.tmp.999999997.a1b2c3"};
    char live[96];
    snprintf(live, sizeof live, "ck.step4.safetensors.tmp.%ld.abcdef", (long)getppid());
    const char *keep[] = {live, "ck.step12.safetensors", "ck2.step1.safetensors.tmp.999999999.abcdef"};
    for (int i = 0; i < 3; i++) {
        char *q = xasprintf("%s/%s", dir, gone[i]);
        write_file(q, "x");
        free(q);
        q = xasprintf("%s/%s", dir, keep[i]);
        write_file(q, "x");
        free(q);
    }
    char *prefix = xasprintf("%s/ck.safetensors", dir), *w = xasprintf("%s/w.safetensors", dir);
    assert_int_equal(rt_ckpt_sweep_tmp(prefix, w), 3);
    assert_int_equal(entries(dir), 3);
    assert_int_equal(rt_ckpt_sweep_tmp(prefix, NULL), 0);
    assert_int_equal(rt_ckpt_sweep_tmp(NULL, NULL), 0);
    assert_int_equal(remove_tree(dir), 0);
    free(prefix);
    free(w);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_weights),
        cmocka_unit_test(test_other_model),
        cmocka_unit_test(test_accumulators),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_sweep_tmp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
