/* test_util.c - the helpers of ir/util.c that every layer shares: the byte
 * size parser (--memory-budget, train{memory_budget}, KILN_CACHE_MAX,
 * KILN_LUA_MEMORY), the byte size formatter (compile summary, remat report,
 * training log, frontend and executor messages), the median (training and
 * communication reports) and the monotonic clock. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static void test_parse_bytes(void **state)
{
    (void)state;
    assert_int_equal(ir_parse_bytes("512MiB"), 512LL << 20);
    assert_int_equal(ir_parse_bytes("2GiB"), 2LL << 30);
    assert_int_equal(ir_parse_bytes("1TiB"), 1LL << 40);
    assert_int_equal(ir_parse_bytes("64KiB"), 64LL << 10);
    assert_int_equal(ir_parse_bytes("1.5GB"), 1500000000LL);
    assert_int_equal(ir_parse_bytes("3K"), 3000);
    assert_int_equal(ir_parse_bytes("2 MB"), 2000000);
    assert_int_equal(ir_parse_bytes("1000"), 1000);
    assert_int_equal(ir_parse_bytes("1000B"), 1000);
    assert_int_equal(ir_parse_bytes("0"), 0);
    assert_int_equal(ir_parse_bytes("1e3"), 1000);
    static const char *bad[] = {"12 parsecs", "-1", "", "MiB", "nan", "inf", "1e30",
                                "2 GiB extra", "1mib"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (ir_parse_bytes(bad[i]) != -1)
            fail_msg("ir_parse_bytes accepted '%s' as %lld", bad[i],
                     (long long)ir_parse_bytes(bad[i]));
    assert_int_equal(ir_parse_bytes(NULL), -1);
}

static void test_fmt_bytes(void **state)
{
    (void)state;
    char b[32];
    static const struct {
        double bytes;
        int decimals;
        const char *want;
    } c[] = {
        {0, 2, "0 B"},
        {512, 2, "512 B"},
        {1023, 1, "1023 B"},
        {1024, 2, "1.00 KiB"},
        {1536, 1, "1.5 KiB"},
        {1.5 * (1 << 20), 2, "1.50 MiB"},
        {23.0 * (1 << 20) + 1000000, 2, "23.95 MiB"},
        {2.0 * (1 << 30), 2, "2.00 GiB"},
        {4.0 * 1099511627776.0, 1, "4.0 TiB"},
        {3.0 * 1125899906842624.0, 2, "3.00 PiB"},
        {4.0 * 1152921504606846976.0, 1, "4.0 EiB"},
        {4096.0 * 1152921504606846976.0, 0, "4096 EiB"}, /* no unit past EiB */
        /* decimals < 0: none for a whole number, else one */
        {8.0 * (1 << 20), -1, "8 MiB"},
        {1.5 * (1 << 30), -1, "1.5 GiB"},
        {100, -1, "100 B"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const char *s = ir_fmt_bytes(c[i].bytes, c[i].decimals, b, sizeof b);
        assert_ptr_equal(s, b);
        if (strcmp(b, c[i].want) != 0)
            fail_msg("ir_fmt_bytes(%.17g, %d) = '%s', expected '%s'", c[i].bytes,
                     c[i].decimals, b, c[i].want);
    }
    /* the parser reads a whole formatted size back */
    assert_int_equal(ir_parse_bytes(ir_fmt_bytes(3.0 * (1 << 30), 2, b, sizeof b)), 3LL << 30);
    assert_int_equal(ir_parse_bytes(ir_fmt_bytes(512, 2, b, sizeof b)), 512);
}

/* the unit that keeps the number >= 1 (us below 1 ms), fixed digits */
static void test_fmt_seconds(void **state)
{
    (void)state;
    static const struct {
        double s;
        const char *want;
    } c[] = {{12, "12.000 s"}, {1, "1.000 s"}, {0.999, "999.00 ms"}, {0.0425, "42.50 ms"},
             {1e-3, "1.00 ms"}, {2.5e-6, "2.5 us"}, {0, "0.0 us"}};
    char b[32];
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (strcmp(ir_fmt_seconds(c[i].s, b, sizeof b), c[i].want) != 0)
            fail_msg("ir_fmt_seconds(%g) = '%s', expected '%s'", c[i].s, b, c[i].want);
    /* a difference: the unit of its magnitude; ms_decimals digits in ms
     * (shard=auto's report: 3) */
    static const struct {
        double s;
        int dec;
        const char *want;
    } d[] = {{-0.0425, 2, "-42.50 ms"}, {-1.5, 3, "-1.500 s"}, {0.0123456, 3, "12.346 ms"},
             {-0.0123456, 3, "-12.346 ms"}, {-2.5e-6, 3, "-2.5 us"}, {0.5, 3, "500.000 ms"}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (strcmp(ir_fmt_seconds_ms(d[i].s, d[i].dec, b, sizeof b), d[i].want) != 0)
            fail_msg("ir_fmt_seconds_ms(%g, %d) = '%s', expected '%s'", d[i].s, d[i].dec, b,
                     d[i].want);
}

static void test_median(void **state)
{
    (void)state;
    assert_true(ir_median(NULL, 0) == 0);
    double one[] = {7};
    assert_true(ir_median(one, 1) == 7);
    double odd[] = {5, 1, 9, 3, 7};
    assert_true(ir_median(odd, 5) == 5);
    /* the input is left as it was */
    assert_true(odd[0] == 5 && odd[1] == 1 && odd[2] == 9 && odd[3] == 3 && odd[4] == 7);
    double even[] = {4, 1, 3, 2};
    assert_true(ir_median(even, 4) == 2.5);
    double same[] = {2, 2, 2, 2, 9, 2};
    assert_true(ir_median(same, 6) == 2);
}

static void test_now(void **state)
{
    (void)state;
    double a = ir_now();
    struct timespec ts = {0, 20000000}; /* 20 ms */
    nanosleep(&ts, NULL);
    double b = ir_now();
    assert_true(a > 0);
    if (!(b - a >= 0.019 && b - a < 10))
        fail_msg("ir_now advanced %.6f s over a 20 ms sleep", b - a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_bytes),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_fmt_seconds),
        cmocka_unit_test(test_median),
        cmocka_unit_test(test_now),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
