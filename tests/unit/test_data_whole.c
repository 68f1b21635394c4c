/* test_data_whole.c - the whole of a split, in order (rt_data_examples,
 * rt_data_range: kiln eval, kiln predict, eval_batches = "all"): text
 * windows every T symbols with the tail as a masked partial window or left
 * out; padding rows as copies of row 0 with mask 0; every held-out addition
 * problem once, in order; blobs refused. */
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "train.h"

/* A text file of 3 windows of T = 4 and a tail of 2 targets: 15 bytes. */
static void test_text_windows(void **state)
{
    (void)state;
    char *dir = scratch_dir("datawhole");
    char *path = xasprintf("%s/t.txt", dir);
    write_file(path, "abcdefghijklmno");
    DataCfg c = {.kind = "text", .path = path, .seed = 1, .batch = 3, .seq = 4,
                 .val_fraction = 0};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    int64_t left;
    assert_int_equal(rt_data_examples(s, DATA_TRAIN, false, &left, &d), 3);
    assert_int_equal(left, 2);
    assert_int_equal(rt_data_examples(s, DATA_TRAIN, true, &left, &d), 4);
    assert_int_equal(left, 0);
    /* window 1 starts at symbol 4 */
    const DataBatch *b = rt_data_range(s, DATA_TRAIN, 1, 2);
    assert_int_equal(b->tokens[0], 'e');
    assert_int_equal(b->targets[3], 'i');
    assert_int_equal(b->tokens[4], 'i');
    /* row 2 pads: a copy of row 0, mask 0 */
    assert_memory_equal(b->tokens + 8, b->tokens, 4 * sizeof *b->tokens);
    for (int t = 0; t < 4; t++) {
        assert_true(b->mask[t] == 1.0f && b->mask[4 + t] == 1.0f);
        assert_true(b->mask[8 + t] == 0.0f);
    }
    /* the partial window: symbols 12.. with targets 'n', 'o', then masked */
    b = rt_data_range(s, DATA_TRAIN, 3, 1);
    assert_int_equal(b->tokens[0], 'm');
    assert_int_equal(b->targets[0], 'n');
    assert_int_equal(b->targets[1], 'o');
    assert_true(b->mask[0] == 1.0f && b->mask[1] == 1.0f);
    assert_true(b->mask[2] == 0.0f && b->mask[3] == 0.0f);
    for (int i = 0; i < 12; i++) /* every symbol in range */
        assert_true(b->tokens[i] >= 'a' && b->tokens[i] <= 'o' && b->targets[i] >= 'a');
    rt_data_close(s);
    remove_tree(dir);
    free(path);
    free(dir);
}

/* Every held-out problem once, (a, b) increasing; the training split the rest. */
static void test_addition_whole(void **state)
{
    (void)state;
    int n = 2;
    DataCfg c = {.kind = "addition", .seed = 1, .batch = 16, .seq = 3 * n + 3, .digits = n,
                 .val_fraction = 0.2};
    Diag d;
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    int64_t left, want = 0;
    for (int64_t a = 0; a < 100; a++)
        for (int64_t bb = 0; bb < 100; bb++)
            want += rt_addition_is_val(n, a, bb, 0.2);
    int64_t N = rt_data_examples(s, DATA_VAL, true, &left, &d);
    assert_int_equal(N, want);
    int64_t prev = -1;
    for (int64_t first = 0; first < N; first += 16) {
        int64_t k = N - first < 16 ? N - first : 16;
        const DataBatch *b = rt_data_range(s, DATA_VAL, first, k);
        for (int64_t r = 0; r < 16; r++) {
            const int32_t *tok = b->tokens + r * b->T;
            int64_t a = tok[0] * 10 + tok[1], bb = tok[3] * 10 + tok[4];
            float m = 0;
            for (int64_t t = 0; t < b->T; t++)
                m += b->mask[r * b->T + t];
            if (r >= k) { /* padding */
                assert_true(m == 0.0f);
                continue;
            }
            assert_true(m == (float)(n + 2)); /* answer digits and the end */
            assert_true(rt_addition_is_val(n, a, bb, 0.2));
            assert_true(a * 100 + bb > prev);
            prev = a * 100 + bb;
        }
    }
    int64_t ntrain = rt_data_examples(s, DATA_TRAIN, true, &left, &d);
    assert_int_equal(ntrain, 100 * 100 - want);
    rt_data_close(s);
}

static void test_blobs_refused(void **state)
{
    (void)state;
    DataCfg c = {.kind = "blobs", .seed = 1, .batch = 8, .dim = 2, .classes = 3,
                 .val_fraction = 0.1};
    Diag d = {{0}};
    DataSource *s = rt_data_open(&c, &d);
    assert_non_null(s);
    int64_t left;
    assert_int_equal(rt_data_examples(s, DATA_VAL, false, &left, &d), -1);
    assert_non_null(strstr(d.msg, "data blobs draws its points at random"));
    rt_data_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_windows),
        cmocka_unit_test(test_addition_whole),
        cmocka_unit_test(test_blobs_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
