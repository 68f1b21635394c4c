/* test_data.c - data sources: addition format and held-out split, token file
 * validation, text split, determinism; what rt_data_open refuses: splits
 * shorter than a window, files that are not regular files, symbols beyond
 * the model's table or vocabulary, batches too large to allocate. */
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"
#include "train.h"

static char *write_tmp(const char *dir, const char *name, const void *p, size_t n)
{
    char *path = xasprintf("%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
    return path;
}

static void test_addition_encode(void **state)
{
    (void)state;
    int32_t seq[3 * 3 + 4];
    rt_addition_encode(3, 57, 968, seq); /* 057+968=1025 -> reversed 5201 */
    /* the alphabet of models/addition.lua: 10 '+', 11 '=', 12 pad, 13 end */
    int32_t want[] = {0, 5, 7, 10, 9, 6, 8, 11, 5, 2, 0, 1, 13};
    assert_memory_equal(seq, want, sizeof want);
}

/* tokens, targets shifted by one, mask exactly on answer digits and end */
static void test_addition_batch(void **state)
{
    (void)state;
    int n = 2;
    int64_t T = 3 * n + 5; /* one more than needed: a pad position */
    DataCfg c = {.kind = "addition", .seed = 1, .batch = 16, .seq = T, .digits = n,
                 .val_fraction = 0.2};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    const DataBatch *b = rt_data_batch(s, DATA_TRAIN, 3);
    for (int64_t r = 0; r < b->B; r++) {
        const int32_t *tok = b->tokens + r * T, *tgt = b->targets + r * T;
        const float *m = b->mask + r * T;
        int64_t a = tok[0] * 10 + tok[1], bb = tok[3] * 10 + tok[4];
        assert_int_equal(tok[2], ADD_PLUS);
        assert_int_equal(tok[5], ADD_EQ);
        assert_false(rt_addition_is_val(n, a, bb, 0.2));
        int32_t seq[3 * 2 + 4];
        rt_addition_encode(n, a, bb, seq);
        for (int64_t t = 0; t < T; t++) {
            assert_int_equal(tok[t], t < 3 * n + 4 ? seq[t] : ADD_PAD);
            if (t + 1 < T)
                assert_int_equal(tgt[t], tok[t + 1]);
            int answer = t >= 2 * n + 1 && t <= 3 * n + 2;
            assert_true(m[t] == (answer ? 1.0f : 0.0f));
        }
        /* the answer decodes to the sum */
        int64_t sum = 0, p = 1;
        for (int k = 0; k <= n; k++, p *= 10)
            sum += tgt[2 * n + 1 + k] * p;
        assert_int_equal(sum, a + bb);
        assert_int_equal(tgt[3 * n + 2], ADD_END);
        assert_int_equal(tgt[3 * n + 3], ADD_PAD);
    }
    rt_data_close(s);
}

static void test_addition_heldout_disjoint(void **state)
{
    (void)state;
    int n = 2;
    DataCfg c = {.kind = "addition", .seed = 9, .batch = 64, .seq = 3 * n + 4, .digits = n,
                 .val_fraction = 0.1};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    char *seen = xcalloc(10000, 1); /* 1: train, 2: val */
    for (int split = 0; split < 2; split++)
        for (int64_t k = 0; k < 20; k++) {
            const DataBatch *b = rt_data_batch(s, (DataSplit)split, k);
            for (int64_t r = 0; r < b->B; r++) {
                const int32_t *t = b->tokens + r * b->T;
                int pair = ((t[0] * 10 + t[1]) * 100) + t[3] * 10 + t[4];
                seen[pair] |= (char)(1 << split);
                assert_int_not_equal(seen[pair], 3);
            }
        }
    int nval = 0, ntrain = 0;
    for (int i = 0; i < 10000; i++) {
        nval += seen[i] == 2;
        ntrain += seen[i] == 1;
    }
    assert_true(nval > 100 && ntrain > 500);
    free(seen);
    rt_data_close(s);
}

static void test_addition_deterministic(void **state)
{
    (void)state;
    DataCfg c = {.kind = "addition", .seed = 5, .batch = 8, .seq = 13, .digits = 3,
                 .val_fraction = 0.1};
    Diag d;
    DataSource *s1 = rt_data_open(&c, &d), *s2 = rt_data_open(&c, &d);
    int32_t keep[8 * 13];
    memcpy(keep, rt_data_batch(s1, DATA_TRAIN, 41)->tokens, sizeof keep);
    rt_data_batch(s2, DATA_TRAIN, 0); /* a different position in between */
    assert_memory_equal(rt_data_batch(s2, DATA_TRAIN, 41)->tokens, keep, sizeof keep);
    assert_memory_not_equal(rt_data_batch(s2, DATA_TRAIN, 42)->tokens, keep, sizeof keep);
    c.seed = 6;
    DataSource *s3 = rt_data_open(&c, &d);
    assert_memory_not_equal(rt_data_batch(s3, DATA_TRAIN, 41)->tokens, keep, sizeof keep);
    rt_data_close(s1);
    rt_data_close(s2);
    rt_data_close(s3);
}

static void test_addition_bad_cfg(void **state)
{
    (void)state;
    DataCfg c = {.kind = "addition", .seed = 5, .batch = 8, .seq = 8, .digits = 3,
                 .val_fraction = 0.1};
    Diag d;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "T >= 12"));
    c.kind = "nope";
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "nope"));
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* a token file of n tokens: token i = i % 25 in the first 90%, 25 + i % 25 after */
static uint8_t *token_file(uint32_t magic, uint32_t version, uint32_t count, int n, size_t *len)
{
    *len = 1024 + 2 * (size_t)n;
    uint8_t *p = xcalloc(*len, 1);
    put32(p, magic);
    put32(p + 4, version);
    put32(p + 8, count);
    for (int i = 0; i < n; i++) {
        p[1024 + 2 * i] = (uint8_t)(i < n * 9 / 10 ? i % 25 : 25 + i % 25);
        p[1024 + 2 * i + 1] = 0;
    }
    return p;
}

static void test_tokens(void **state)
{
    (void)state;
    char *dir = scratch_dir("data");
    size_t len;
    Diag d;
    uint8_t *p = token_file(20240520, 1, 1000, 1000, &len);
    char *good = write_tmp(dir, "good.bin", p, len);
    DataCfg c = {.kind = "tokens", .path = good, .seed = 1, .batch = 4, .seq = 16,
                 .val_fraction = 0.1, .vocab = 50};
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    for (int split = 0; split < 2; split++) {
        const DataBatch *b = rt_data_batch(s, (DataSplit)split, 2);
        /* windows stay inside their split: validation = tokens 900..999 */
        int base = split == DATA_TRAIN ? 0 : 25;
        for (int64_t i = 0; i < b->B * b->T; i++) {
            assert_true(b->tokens[i] >= base && b->tokens[i] < base + 25);
            assert_int_equal(b->targets[i], base + (b->tokens[i] - base + 1) % 25);
        }
    }
    rt_data_close(s);

    /* vocab too small for the tokens */
    c.vocab = 40;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "good.bin"));
    assert_non_null(strstr(d.msg, "out of range"));
    c.vocab = 50;

    /* truncated: header says more tokens than the file has */
    char *trunc = write_tmp(dir, "trunc.bin", p, len - 10);
    c.path = trunc;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "trunc.bin"));
    assert_non_null(strstr(d.msg, "truncated"));

    /* shorter than the header */
    char *tiny = write_tmp(dir, "tiny.bin", p, 100);
    c.path = tiny;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "tiny.bin"));
    assert_non_null(strstr(d.msg, "header"));

    /* wrong magic */
    put32(p, 12345);
    char *magic = write_tmp(dir, "magic.bin", p, len);
    c.path = magic;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "magic.bin"));
    assert_non_null(strstr(d.msg, "magic 20240520"));

    /* wrong version */
    put32(p, 20240520);
    put32(p + 4, 2);
    char *ver = write_tmp(dir, "ver.bin", p, len);
    c.path = ver;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "version"));

    /* missing file */
    char *missing = xasprintf("%s/missing.bin", dir);
    c.path = missing;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "missing.bin"));
    free(p);
    free(good);
    free(trunc);
    free(tiny);
    free(magic);
    free(ver);
    free(missing);
    free(dir);
}

/* text: windows never cross the split point; val windows come from the tail */
static void test_text_split(void **state)
{
    (void)state;
    char *dir = scratch_dir("data");
    int n = 1000;
    uint8_t *buf = xmalloc((size_t)n);
    for (int i = 0; i < n; i++)
        buf[i] = i < 800 ? 'a' + i % 26 : 'A' + i % 26;
    char *path = write_tmp(dir, "t.txt", buf, (size_t)n);
    DataCfg c = {.kind = "text", .path = path, .seed = 3, .batch = 8, .seq = 32,
                 .val_fraction = 0.2};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    for (int k = 0; k < 30; k++) {
        const DataBatch *b = rt_data_batch(s, DATA_TRAIN, k);
        for (int64_t i = 0; i < b->B * b->T; i++)
            assert_true(b->tokens[i] >= 'a' && b->targets[i] >= 'a');
        b = rt_data_batch(s, DATA_VAL, k);
        for (int64_t i = 0; i < b->B * b->T; i++)
            assert_true(b->tokens[i] <= 'Z' && b->targets[i] <= 'Z');
        for (int64_t r = 0; r < b->B; r++)
            for (int64_t t = 0; t + 1 < b->T; t++)
                assert_int_equal(b->targets[r * b->T + t], b->tokens[r * b->T + t + 1]);
    }
    rt_data_close(s);

    char *empty = write_tmp(dir, "empty.txt", buf, 0);
    c.path = empty;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "empty.txt"));
    assert_non_null(strstr(d.msg, "empty"));

    char *small = write_tmp(dir, "small.txt", buf, 30);
    c.path = small;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "small.txt"));
    free(buf);
    free(path);
    free(empty);
    free(small);
    free(dir);
}

/* A split that cannot hold one window of T+1 symbols is refused when the
 * source opens, naming the file and both split sizes: a 50-byte file with
 * val_fraction 0.01 has a validation split of 0 bytes (it used to pass and
 * crash in the final evaluation). */
static void test_split_too_small(void **state)
{
    (void)state;
    char *dir = scratch_dir("data");
    uint8_t buf[50];
    for (int i = 0; i < 50; i++)
        buf[i] = (uint8_t)('a' + i % 26);
    char *path = write_tmp(dir, "t50.txt", buf, sizeof buf);
    DataCfg c = {.kind = "text", .path = path, .seed = 1, .batch = 2, .seq = 8,
                 .val_fraction = 0.01};
    Diag d;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "t50.txt"));
    assert_non_null(strstr(d.msg, "at least 9 bytes"));
    assert_non_null(strstr(d.msg, "50 train and 0 validation"));
    /* val_fraction 0: no validation split, nothing to check there */
    c.val_fraction = 0;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    assert_false(rt_data_has_val(s));
    rt_data_close(s);
    /* 0.2: 10 validation bytes hold a window of 9 */
    c.val_fraction = 0.2;
    s = rt_data_open(&c, &d);
    assert_non_null(s);
    const DataBatch *b = rt_data_batch(s, DATA_VAL, 0);
    for (int64_t i = 0; i < b->B * b->T; i++)
        assert_true(b->tokens[i] >= 'a' + 14 && b->tokens[i] <= 'a' + 23);
    rt_data_close(s);
    /* the training split too small: 0.9 leaves 5 bytes */
    c.val_fraction = 0.9;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "5 train and 45 validation"));
    free(path);
    free(dir);
}

/* Anything but a regular file is refused before it is read: a directory
 * (used to ask for 2^63 bytes), a FIFO with no writer (used to hang), a
 * character device. */
static void test_not_regular(void **state)
{
    (void)state;
    char *dir = scratch_dir("data");
    char *fifo = xasprintf("%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *paths[] = {dir, fifo, "/dev/zero", "/dev/null"};
    const char *kinds[] = {"a directory", "a FIFO", "a character device", "a character device"};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++) {
            DataCfg c = {.kind = k ? "tokens" : "text", .path = paths[i], .seed = 1,
                         .batch = 2, .seq = 8, .val_fraction = 0.1};
            Diag d;
            assert_null(rt_data_open(&c, &d));
            assert_non_null(strstr(d.msg, paths[i]));
            assert_non_null(strstr(d.msg, "expected a regular file"));
            assert_non_null(strstr(d.msg, kinds[i]));
        }
    unlink(fifo);
    free(fifo);
    free(dir);
}

/* Every symbol is checked against the rows of the table the tokens index
 * and against the classes of the targets; the message names the file, the
 * first bad value, its position and the limit. */
static void test_symbols_in_range(void **state)
{
    (void)state;
    char *dir = scratch_dir("data");
    size_t len;
    uint8_t *p = token_file(20240520, 1, 1000, 1000, &len); /* tokens 0..49 */
    char *good = write_tmp(dir, "good.bin", p, len);
    DataCfg c = {.kind = "tokens", .path = good, .seed = 1, .batch = 4, .seq = 16,
                 .val_fraction = 0.1, .vocab = 50, .rows = 50, .rows_name = "\"wte\""};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    rt_data_close(s);
    /* the first token >= 30 is 30 = 25 + 905 % 25, at position 905 */
    c.rows = 30;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "good.bin: token 30 at position 905 is out of range"));
    assert_non_null(strstr(d.msg, "expected < 30, the rows of the embedding table \"wte\""));
    c.rows = 0;
    c.vocab = 26; /* the first >= 26 is 25 + 901 % 25, at position 901 */
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "token 26 at position 901 is out of range"));
    assert_non_null(strstr(d.msg, "expected < 26, the model's vocabulary"));
    /* 0xffff, the largest uint16 */
    p[1024 + 2 * 7] = 0xff;
    p[1024 + 2 * 7 + 1] = 0xff;
    char *big = write_tmp(dir, "big.bin", p, len);
    c.path = big;
    c.vocab = 50;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "token 65535 at position 7"));

    /* text: bytes against a vocabulary under 256 */
    char text[200];
    for (int i = 0; i < 200; i++)
        text[i] = (char)('a' + i % 26);
    text[150] = (char)0xc3;
    char *tp = write_tmp(dir, "t.txt", text, sizeof text);
    DataCfg t = {.kind = "text", .path = tp, .seed = 1, .batch = 2, .seq = 8,
                 .val_fraction = 0.1, .vocab = 128, .rows = 128};
    assert_null(rt_data_open(&t, &d));
    assert_non_null(strstr(d.msg, "t.txt: byte 195 at offset 150 is out of range"));
    text[150] = 'x';
    char *tp2 = write_tmp(dir, "t2.txt", text, sizeof text);
    t.path = tp2;
    s = rt_data_open(&t, &d); /* ASCII text fits a 128-symbol vocabulary */
    assert_non_null(s);
    rt_data_close(s);
    free(p);
    free(good);
    free(big);
    free(tp);
    free(tp2);
    free(dir);
}

/* A header that claims far more tokens than the file holds is an error
 * that allocates nothing (the count is checked against the file size). */
static void test_tokens_huge_count(void **state)
{
    (void)state;
    char *dir = scratch_dir("data");
    size_t len;
    uint8_t *p = token_file(20240520, 1, UINT32_MAX, 100, &len);
    char *path = write_tmp(dir, "huge.bin", p, len);
    DataCfg c = {.kind = "tokens", .path = path, .seed = 1, .batch = 4, .seq = 16,
                 .val_fraction = 0.1};
    Diag d;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "huge.bin: truncated token file (header says 4294967295"));
    free(p);
    free(path);
    free(dir);
}

/* addition: each split must hold a problem; 1 digit has only 100 pairs. */
static void test_addition_splits(void **state)
{
    (void)state;
    DataCfg c = {.kind = "addition", .seed = 5, .batch = 8, .seq = 6, .digits = 1,
                 .val_fraction = 0.001};
    Diag d;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "validation split holds none of the 100 problems"));
    c.val_fraction = 0.99999;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "training split holds none of the 100 problems"));
    c.digits = 5;
    c.seq = 18;
    c.val_fraction = 1e-9;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "val_fraction 1e-09 leaves the validation split"));
    c.val_fraction = 0.1;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    rt_data_close(s);
}

/* A batch larger than the machine's memory is an error before anything is
 * allocated, not an abort in xmalloc. */
static void test_batch_too_large(void **state)
{
    (void)state;
    DataCfg c = {.kind = "addition", .seed = 5, .batch = INT64_MAX / 4, .seq = 13,
                 .digits = 3, .val_fraction = 0.1};
    Diag d;
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "more than this machine's memory"));
    c.batch = (int64_t)1 << 40; /* no overflow, but 156 TiB */
    assert_null(rt_data_open(&c, &d));
    assert_non_null(strstr(d.msg, "a batch of 1099511627776 x 13 needs 1.715e+14 bytes"));
    DataCfg b = {.kind = "blobs", .seed = 3, .batch = (int64_t)1 << 50, .dim = 4,
                 .classes = 3, .val_fraction = 0.1};
    assert_null(rt_data_open(&b, &d));
    assert_non_null(strstr(d.msg, "more than this machine's memory"));
}

static void test_blobs(void **state)
{
    (void)state;
    DataCfg c = {.kind = "blobs", .seed = 3, .batch = 256, .dim = 4, .classes = 3,
                 .val_fraction = 0.1};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    const DataBatch *b = rt_data_batch(s, DATA_TRAIN, 0);
    /* per-class means are far apart relative to the unit noise */
    double mean[3][4] = {{0}};
    int cnt[3] = {0};
    for (int64_t r = 0; r < b->B; r++) {
        assert_true(b->y[r] >= 0 && b->y[r] < 3);
        cnt[b->y[r]]++;
        for (int k = 0; k < 4; k++)
            mean[b->y[r]][k] += b->x[r * 4 + k];
    }
    for (int i = 0; i < 3; i++) {
        assert_true(cnt[i] > 30);
        for (int k = 0; k < 4; k++)
            mean[i][k] /= cnt[i];
    }
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++) {
            double dist = 0;
            for (int k = 0; k < 4; k++)
                dist += (mean[i][k] - mean[j][k]) * (mean[i][k] - mean[j][k]);
            assert_true(dist > 1.0);
        }
    rt_data_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_addition_encode),
        cmocka_unit_test(test_addition_batch),
        cmocka_unit_test(test_addition_heldout_disjoint),
        cmocka_unit_test(test_addition_deterministic),
        cmocka_unit_test(test_addition_bad_cfg),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_text_split),
        cmocka_unit_test(test_blobs),
        cmocka_unit_test(test_split_too_small),
        cmocka_unit_test(test_not_regular),
        cmocka_unit_test(test_symbols_in_range),
        cmocka_unit_test(test_tokens_huge_count),
        cmocka_unit_test(test_addition_splits),
        cmocka_unit_test(test_batch_too_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
