/* test_data_tensors.c - the tensors data source and the .npy reader: every
 * file of the fuzz seed corpus gives its array or its refusal; arrays from a
 * safetensors file and from a .npy directory give the same batches; the
 * train order is a per-epoch permutation fixed by the seed (in file order
 * with in_order), validation in order from the file's tail or val_path;
 * each mismatch with the model names the file, the array, what was
 * expected and what it got; NaN and Inf in float arrays are named (array,
 * example, position) unless allowed; in_order text reads consecutive
 * windows. */
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime.h"
#include "train.h"

/* Each corpus file: accepted (want NULL: dtype, rank, dim0) or refused with
 * a message holding want. */
static void test_npy_corpus(void **state)
{
    (void)state;
    static const struct {
        const char *file, *want;
        DType dt;
        int rank;
        int64_t dim0, nbytes;
    } cases[] = {
        {"v1-f4-2x3.npy", NULL, DT_F32, 2, 2, 24},
        {"v2-i4-6.npy", NULL, DT_I32, 1, 6, 24},
        {"v3-u1-4x6.npy", NULL, DT_U8, 2, 4, 24},
        {"v1-i8-3.npy", NULL, DT_I64, 1, 3, 24},
        {"v1-f2-12.npy", NULL, DT_F16, 1, 12, 24},
        {"v1-f4-scalar.npy", NULL, DT_F32, 0, 0, 4},
        {"v1-f4-0x4.npy", NULL, DT_F32, 2, 0, 0},
        {"bad-fortran.npy", "Fortran order (expected C order", 0, 0, 0, 0},
        {"bad-big-endian.npy", "big-endian data (expected little-endian '<f4', got '>f4'", 0,
         0, 0, 0},
        {"bad-object.npy", "an object array", 0, 0, 0, 0},
        {"bad-structured.npy", "a structured dtype", 0, 0, 0, 0},
        {"bad-f8.npy", "got '<f8') (float64: save with .astype(np.float32))", 0, 0, 0, 0},
        {"bad-header-lies.npy", "truncated .npy data (the header's f32 shape of rank 2 needs "
                                "48 bytes, got 24",
         0, 0, 0, 0},
        {"bad-huge-shape.npy", "needs over 2^64 bytes", 0, 0, 0, 0},
        {"bad-trailing.npy", "oversized .npy data", 0, 0, 0, 0},
        {"bad-truncated-header.npy", "truncated .npy header", 0, 0, 0, 0},
        {"bad-truncated-data.npy", "truncated .npy data", 0, 0, 0, 0},
        {"bad-version.npy", "unsupported .npy version (expected 1.0, 2.0 or 3.0, got 4.0)", 0,
         0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *path = xasprintf("tests/fuzz/corpus/npy/%s", cases[i].file);
        StTensor t;
        Diag d;
        bool ok = rt_npy_read(path, &t, &d);
        if (cases[i].want) {
            if (ok || !strstr(d.msg, cases[i].want) || !strstr(d.msg, path))
                fail_msg("%s: expected a refusal with \"%s\", got %s", path, cases[i].want,
                         ok ? "an array" : d.msg);
            assert_null(t.data);
        } else {
            if (!ok)
                fail_msg("%s: %s", path, d.msg);
            assert_int_equal(t.dtype, cases[i].dt);
            assert_int_equal(t.rank, cases[i].rank);
            if (t.rank)
                assert_int_equal(t.dim[0], cases[i].dim0);
            assert_int_equal(t.nbytes, cases[i].nbytes);
            free(t.data);
        }
        free(path);
    }
    /* the first values of the f32 file: 1, 2, 3 */
    StTensor t;
    Diag d;
    assert_true(rt_npy_read("tests/fuzz/corpus/npy/v1-f4-2x3.npy", &t, &d));
    float *f = t.data;
    assert_true(f[0] == 1.0f && f[1] == 2.0f && f[2] == 3.0f);
    free(t.data);
}

/* A .npy of version 1.0 holding raw[n] with header descr/shape. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *raw,
                      size_t n)
{
    char h[256];
    int len = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                       descr, shape);
    int pad = (64 - (10 + len + 1) % 64) % 64;
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint16_t hl = (uint16_t)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, fp);
    fputc(hl & 255, fp);
    fputc(hl >> 8, fp);
    fprintf(fp, "%s%*s\n", h, pad, "");
    fwrite(raw, 1, n, fp);
    fclose(fp);
}

enum { NEX = 10, D = 2 };

/* Examples i = 0..NEX-1: x = (i, 100 + i) f32[2], y = i % 3 i32; as
 * DIR/t.safetensors and as DIR/npy/{x,y}.npy. */
static void write_examples(const char *dir, int base)
{
    float x[NEX * D];
    int32_t y[NEX];
    for (int i = 0; i < NEX; i++) {
        x[i * D] = (float)(base + i);
        x[i * D + 1] = (float)(100 + base + i);
        y[i] = (base + i) % 3;
    }
    StTensor t[2] = {{.name = "x", .dtype = DT_F32, .rank = 2, .dim = {NEX, D}, .data = x,
                      .nbytes = sizeof x},
                     {.name = "y", .dtype = DT_I32, .rank = 1, .dim = {NEX}, .data = y,
                      .nbytes = sizeof y}};
    Diag d;
    char *st = xasprintf("%s/t.safetensors", dir);
    assert_true(rt_st_write(st, t, 2, NULL, NULL, 0, &d));
    char *nd = xasprintf("%s/npy", dir), *xp = xasprintf("%s/x.npy", nd),
         *yp = xasprintf("%s/y.npy", nd);
    mkdir(nd, 0755);
    write_npy(xp, "<f4", "(10, 2)", x, sizeof x);
    write_npy(yp, "<i4", "(10,)", y, sizeof y);
    free(st);
    free(nd);
    free(xp);
    free(yp);
}

static const DataWant want_xy[] = {
    {.name = "x", .dtype = DT_F32, .rank = 1, .dim = {D}},
    {.name = "y", .dtype = DT_I32, .rank = 0, .limit = 3, .limit_what = "3 classes"},
};

/* The example in row r of b (x's first feature), checking x and y agree. */
static int row_example(const DataBatch *b, int64_t r)
{
    assert_int_equal(b->narr, 2);
    const float *x = (const float *)(void *)b->arr[0].data + r * D;
    int ex = (int)x[0];
    assert_true(x[1] == (float)(100 + ex));
    assert_int_equal(b->y[r], ex % 3);
    return ex;
}

/* Train positions 0..2*NEX-1 (5 batches of 4) as example ids. */
static void train_order(DataSource *s, int out[2 * NEX])
{
    for (int k = 0; k < 5; k++) {
        const DataBatch *b = rt_data_batch(s, DATA_TRAIN, k);
        for (int r = 0; r < 4; r++)
            out[k * 4 + r] = row_example(b, r);
    }
}

static void test_tensors_order(void **state)
{
    (void)state;
    char *dir = scratch_dir("tensors");
    write_examples(dir, 0);
    char *st = xasprintf("%s/t.safetensors", dir), *nd = xasprintf("%s/npy", dir);
    DataCfg c = {.kind = "tensors", .path = st, .seed = 5, .batch = 4, .want = want_xy,
                 .nwant = 2};
    Diag d;
    int a[2 * NEX], b[2 * NEX], e[2 * NEX];

    /* in order: position p is example p mod NEX */
    c.in_order = true;
    DataSource *s = rt_data_open(&c, &d);
    if (!s)
        fail_msg("%s", d.msg);
    assert_false(rt_data_has_val(s));
    train_order(s, a);
    for (int p = 0; p < 2 * NEX; p++)
        assert_int_equal(a[p], p % NEX);
    rt_data_close(s);

    /* shuffled: each epoch a permutation, another per epoch and per seed,
     * the same for the same seed, whichever format */
    c.in_order = false;
    s = rt_data_open(&c, &d);
    assert_non_null(s);
    train_order(s, a);
    rt_data_close(s);
    for (int ep = 0; ep < 2; ep++) {
        int seen[NEX] = {0};
        for (int i = 0; i < NEX; i++)
            seen[a[ep * NEX + i]]++;
        for (int i = 0; i < NEX; i++)
            assert_int_equal(seen[i], 1);
    }
    assert_true(memcmp(a, a + NEX, sizeof(int) * NEX) != 0);
    int ident = 0;
    for (int i = 0; i < NEX; i++)
        ident += a[i] == i;
    assert_true(ident < NEX);
    c.path = nd;
    s = rt_data_open(&c, &d);
    if (!s)
        fail_msg("%s", d.msg);
    train_order(s, b);
    /* a batch is a pure function of its index: read out of order */
    const DataBatch *bb = rt_data_batch(s, DATA_TRAIN, 3);
    assert_int_equal(row_example(bb, 1), a[13]);
    bb = rt_data_batch(s, DATA_TRAIN, 0);
    assert_int_equal(row_example(bb, 2), a[2]);
    rt_data_close(s);
    assert_memory_equal(a, b, sizeof a);
    c.seed = 6;
    s = rt_data_open(&c, &d);
    assert_non_null(s);
    train_order(s, e);
    rt_data_close(s);
    assert_true(memcmp(a, e, sizeof a) != 0);

    /* validation: the tail (val_fraction 0.2: examples 8, 9), in order */
    c.val_fraction = 0.2;
    s = rt_data_open(&c, &d);
    assert_non_null(s);
    assert_true(rt_data_has_val(s));
    for (int k = 0; k < 3; k++) {
        bb = rt_data_batch(s, DATA_VAL, k);
        for (int r = 0; r < 4; r++)
            assert_int_equal(row_example(bb, r), 8 + (k * 4 + r) % 2);
    }
    train_order(s, e);
    for (int p = 0; p < 2 * NEX; p++)
        assert_true(e[p] < 8);
    rt_data_close(s);

    /* validation from val_path: examples 50..59 of another file */
    char *vdir = xasprintf("%s/val", dir), *vst = xasprintf("%s/val/t.safetensors", dir);
    mkdir(vdir, 0755);
    write_examples(vdir, 50);
    c.val_path = vst;
    s = rt_data_open(&c, &d);
    if (!s)
        fail_msg("%s", d.msg);
    bb = rt_data_batch(s, DATA_VAL, 2);
    for (int r = 0; r < 4; r++)
        assert_int_equal(row_example(bb, r), 50 + (8 + r) % NEX);
    train_order(s, e); /* all ten training examples: val_fraction unused */
    int seen[NEX] = {0};
    for (int i = 0; i < NEX; i++)
        seen[e[i]]++;
    for (int i = 0; i < NEX; i++)
        assert_int_equal(seen[i], 1);
    rt_data_close(s);
    free(vdir);
    free(vst);
    free(st);
    free(nd);
    free(dir);
}

/* Each mismatch names the file, the array, and expected/got. */
static void test_tensors_mismatch(void **state)
{
    (void)state;
    char *dir = scratch_dir("tensors");
    write_examples(dir, 0);
    char *st = xasprintf("%s/t.safetensors", dir);
    Diag d;
    DataWant w[2];
    memcpy(w, want_xy, sizeof w);
    DataCfg c = {.kind = "tensors", .path = st, .seed = 5, .batch = 4, .want = w, .nwant = 2};

    w[0].name = "feat"; /* no such array */
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "t.safetensors: no array \"feat\""));
    assert_non_null(strstr(d.msg, "got arrays: x, y"));
    w[0] = want_xy[0];
    w[0].dtype = DT_BF16;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "array \"x\" does not fit model input x"));
    assert_non_null(strstr(d.msg, "expected bf16[10,2], got f32[10,2]"));
    w[0] = want_xy[0];
    w[0].dim[0] = 3;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "expected f32[10,3], got f32[10,2]"));
    w[0] = want_xy[0];
    w[1].limit = 2; /* y holds 2 at index 2 */
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "array \"y\" holds 2 at index 2, out of range"));
    assert_non_null(strstr(d.msg, "expected 0 <= value < 2, 3 classes"));
    w[1] = want_xy[1];

    /* arrays with different example counts */
    float x[8] = {0};
    int32_t y[3] = {0};
    StTensor t[2] = {{.name = "x", .dtype = DT_F32, .rank = 2, .dim = {4, D}, .data = x,
                      .nbytes = sizeof x},
                     {.name = "y", .dtype = DT_I32, .rank = 1, .dim = {3}, .data = y,
                      .nbytes = sizeof y}};
    char *odd = xasprintf("%s/odd.safetensors", dir);
    assert_true(rt_st_write(odd, t, 2, NULL, NULL, 0, &d));
    c.path = odd;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "arrays \"x\" and \"y\" hold different numbers of examples "
                              "(expected 4 in each, got 3)"));
    /* too few to split; an empty directory */
    c.path = st;
    c.val_fraction = 0.05;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "too few examples to split"));
    c.val_fraction = 0;
    char *empty = xasprintf("%s/empty", dir);
    mkdir(empty, 0755);
    c.path = empty;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "no arrays (expected NAME.npy files"));
    c.path = NULL;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "set data_path"));
    free(empty);
    free(odd);
    free(st);
    free(dir);
}

/* NaN and Inf in f32, f16 and bf16 arrays: refused at open with the array,
 * the example and the position; allow_nonfinite takes them. */
static void test_tensors_nonfinite(void **state)
{
    (void)state;
    char *dir = scratch_dir("tensors");
    char *path = xasprintf("%s/nf.safetensors", dir);
    int32_t y[4] = {0, 1, 2, 0};
    static const struct {
        DType dt;
        int at;          /* element of x [4,3] */
        uint32_t bits;   /* f32 bits, or f16 / bf16 in the low half */
        const char *want;
    } cases[] = {
        {DT_F32, 7, 0x7fc00000u, "holds NaN at example 2, position [1] (element 7"},
        {DT_F32, 0, 0xff800000u, "holds -Inf at example 0, position [0]"},
        {DT_F16, 11, 0x7c00u, "holds Inf at example 3, position [2]"},
        {DT_F16, 4, 0xfe00u, "holds NaN at example 1, position [1]"},
        {DT_BF16, 5, 0x7f80u, "holds Inf at example 1, position [2]"},
        {DT_BF16, 3, 0x7fc1u, "holds NaN at example 1, position [0]"},
        {DT_F16, 2, 0x7bffu, NULL}, /* 65504: finite */
        {DT_BF16, 2, 0x7f7fu, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t x[4 * 3 * 4] = {0};
        int es = dtype_size(cases[i].dt);
        memcpy(x + es * cases[i].at, &cases[i].bits, (size_t)es); /* little-endian */
        StTensor t[2] = {{.name = "x", .dtype = cases[i].dt, .rank = 2, .dim = {4, 3},
                          .data = x, .nbytes = (size_t)(12 * es)},
                         {.name = "y", .dtype = DT_I32, .rank = 1, .dim = {4}, .data = y,
                          .nbytes = sizeof y}};
        Diag d;
        assert_true(rt_st_write(path, t, 2, NULL, NULL, 0, &d));
        DataWant w[2] = {{.name = "x", .dtype = cases[i].dt, .rank = 1, .dim = {3}},
                         {.name = "y", .dtype = DT_I32, .rank = 0}};
        DataCfg c = {.kind = "tensors", .path = path, .seed = 1, .batch = 2, .want = w,
                     .nwant = 2};
        DataSource *s = rt_data_open(&c, &d);
        if (cases[i].want) {
            if (s || !strstr(d.msg, cases[i].want) || !strstr(d.msg, "nf.safetensors: array \"x\""))
                fail_msg("case %zu: expected a refusal with \"%s\", got %s", i, cases[i].want,
                         s ? "the data" : d.msg);
            c.allow_nonfinite = true;
            s = rt_data_open(&c, &d);
        }
        if (!s)
            fail_msg("case %zu: refused: %s", i, d.msg);
        rt_data_close(s);
    }
    free(path);
    free(dir);
}

/* in_order text: row r of batch k is window (k*B + r) mod W at w*T. */
static void test_text_in_order(void **state)
{
    (void)state;
    char *dir = scratch_dir("tensors");
    uint8_t buf[100];
    for (int i = 0; i < 100; i++)
        buf[i] = (uint8_t)i;
    char *path = xasprintf("%s/t.bin", dir);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite(buf, 1, sizeof buf, fp);
    fclose(fp);
    enum { B = 3, T = 4 };
    DataCfg c = {.kind = "text", .path = path, .seed = 1, .batch = B, .seq = T,
                 .val_fraction = 0.1, .in_order = true};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    int64_t W = (90 - 1) / T; /* 22 windows in the 90 training bytes */
    for (int k = 0; k < 10; k++) {
        const DataBatch *b = rt_data_batch(s, DATA_TRAIN, k);
        for (int r = 0; r < B; r++)
            for (int t = 0; t < T; t++) {
                int64_t p = ((k * B + r) % W) * T + t;
                assert_int_equal(b->tokens[r * T + t], p);
                assert_int_equal(b->targets[r * T + t], p + 1);
            }
    }
    /* validation: bytes 90..99, two windows */
    const DataBatch *b = rt_data_batch(s, DATA_VAL, 1);
    for (int r = 0; r < B; r++)
        assert_int_equal(b->tokens[r * T], 90 + ((B + r) % 2) * T);
    rt_data_close(s);
    free(path);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_corpus),
        cmocka_unit_test(test_tensors_order),
        cmocka_unit_test(test_tensors_mismatch),
        cmocka_unit_test(test_tensors_nonfinite),
        cmocka_unit_test(test_text_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
