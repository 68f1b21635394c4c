/* test_safetensors.c - safetensors round trip, corrupt files, atomic writes. */
#include "testutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* a file with an explicit JSON header and `data` bytes after it */
static void write_raw(const char *path, const char *json, uint64_t hlen_override,
                      const void *data, size_t n)
{
    size_t jl = strlen(json);
    uint64_t h = hlen_override ? hlen_override : jl;
    uint8_t *buf = xmalloc(8 + jl + n);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(h >> (8 * i));
    memcpy(buf + 8, json, jl);
    if (n)
        memcpy(buf + 8 + jl, data, n);
    write_bytes(path, buf, 8 + jl + n);
    free(buf);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = scratch_dir("st");
    char *path = xasprintf("%s/w.safetensors", dir);
    float a[6] = {1, -2, 3.5f, 4, 5, 6e-7f};
    int32_t b[3] = {7, -8, 9};
    uint16_t c[2] = {0x3f80, 0xbf80};
    uint8_t u = 200;
    StTensor t[4] = {
        {.name = "layer.0.w", .dtype = DT_F32, .rank = 2, .dim = {2, 3}, .data = a, .nbytes = sizeof a},
        {.name = "idx", .dtype = DT_I32, .rank = 1, .dim = {3}, .data = b, .nbytes = sizeof b},
        {.name = "h", .dtype = DT_BF16, .rank = 1, .dim = {2}, .data = c, .nbytes = sizeof c},
        {.name = "scalar", .dtype = DT_U8, .rank = 0, .data = &u, .nbytes = 1},
    };
    const char *k[] = {"step", "format"}, *v[] = {"42", "kiln"};
    Diag d;
    assert_true(rt_st_write(path, t, 4, k, v, 2, &d));
    assert_int_equal(count_entries(dir), 1); /* no temp file left */
    StFile f;
    if (!rt_st_read(path, &f, &d))
        fail_msg("%s", d.msg);
    assert_int_equal(f.n, 4);
    for (int i = 0; i < 4; i++) {
        const StTensor *r = rt_st_find(&f, t[i].name);
        assert_non_null(r);
        assert_int_equal(r->dtype, t[i].dtype);
        assert_int_equal(r->rank, t[i].rank);
        for (int j = 0; j < r->rank; j++)
            assert_int_equal(r->dim[j], t[i].dim[j]);
        assert_int_equal(r->nbytes, t[i].nbytes);
        assert_memory_equal(r->data, t[i].data, t[i].nbytes);
    }
    assert_null(rt_st_find(&f, "nothere"));
    assert_string_equal(rt_st_meta(&f, "step"), "42");
    assert_string_equal(rt_st_meta(&f, "format"), "kiln");
    assert_null(rt_st_meta(&f, "other"));
    rt_st_free(&f);

    /* the header length is a multiple of 8 and the JSON is standard */
    char *raw = read_file(path);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--)
        h = h << 8 | (uint8_t)raw[i];
    assert_int_equal(h % 8, 0);
    assert_non_null(strstr(raw + 8, "\"data_offsets\""));
    free(raw);

    /* overwriting replaces the file */
    assert_true(rt_st_write(path, t, 1, NULL, NULL, 0, &d));
    assert_true(rt_st_read(path, &f, &d));
    assert_int_equal(f.n, 1);
    rt_st_free(&f);
    unlink(path);
    rmdir(dir);
    free(path);
    free(dir);
}

/* each corrupt file gives a clear message that names the file */
static void expect_corrupt(const char *path, const char *what)
{
    StFile f;
    Diag d;
    assert_false(rt_st_read(path, &f, &d));
    assert_int_equal(f.n, 0);
    if (!strstr(d.msg, path) || !strstr(d.msg, what))
        fail_msg("expected \"%s\" naming %s, got: %s", what, path, d.msg);
}

static void test_corrupt(void **state)
{
    (void)state;
    char *dir = scratch_dir("st");
    char *p = xasprintf("%s/bad.safetensors", dir);
    float x[4] = {1, 2, 3, 4};

    write_bytes(p, "abc", 3);
    expect_corrupt(p, "8-byte header length");

    write_raw(p, "{}", 1000000, NULL, 0);
    expect_corrupt(p, "header length 1000000 exceeds the file");

    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], ", 0, x, sizeof x);
    expect_corrupt(p, "not a JSON object");

    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,32]}}", 0, x,
              sizeof x);
    expect_corrupt(p, "do not match its dtype and shape");

    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}}", 0, x,
              sizeof x);
    expect_corrupt(p, "out of range");

    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 0, x,
              sizeof x);
    StFile f;
    Diag d;
    assert_true(rt_st_read(p, &f, &d)); /* an offset inside the data is fine */
    assert_true(((float *)f.t[0].data)[0] == 3.0f);
    rt_st_free(&f);

    write_raw(p,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              0, x, sizeof x);
    expect_corrupt(p, "overlap");

    write_raw(p, "{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 0, x,
              sizeof x);
    expect_corrupt(p, "unsupported dtype");

    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, x,
              sizeof x);
    expect_corrupt(p, "bad shape");

    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, x, sizeof x);
    expect_corrupt(p, "data_offsets");

    char *missing = xasprintf("%s/none.safetensors", dir);
    expect_corrupt(missing, "cannot open");
    unlink(p);
    rmdir(dir);
    free(missing);
    free(p);
    free(dir);
}

static void test_unwritable(void **state)
{
    (void)state;
    float x[2] = {1, 2};
    StTensor t = {.name = "a", .dtype = DT_F32, .rank = 1, .dim = {2}, .data = x,
                  .nbytes = sizeof x};
    Diag d;
    char *dir = scratch_dir("st");
    char *p = xasprintf("%s/no/such/dir/w.safetensors", dir);
    assert_false(rt_st_write(p, &t, 1, NULL, NULL, 0, &d));
    assert_non_null(strstr(d.msg, p));
    assert_non_null(strstr(d.msg, "cannot write"));
    assert_int_equal(count_entries(dir), 0);

    /* a read-only directory (root ignores permissions: skip that half then) */
    char *ro = xasprintf("%s/ro", dir);
    assert_int_equal(mkdir(ro, 0555), 0);
    char *q = xasprintf("%s/w.safetensors", ro);
    if (geteuid() != 0) {
        assert_false(rt_st_write(q, &t, 1, NULL, NULL, 0, &d));
        assert_non_null(strstr(d.msg, "cannot write"));
        assert_int_equal(count_entries(ro), 0);
    }
    /* a path that is a directory: rename fails, the temp file is removed */
    char *isdir = xasprintf("%s/sub", dir);
    assert_int_equal(mkdir(isdir, 0755), 0);
    assert_false(rt_st_write(isdir, &t, 1, NULL, NULL, 0, &d));
    assert_non_null(strstr(d.msg, isdir));
    assert_int_equal(count_entries(dir), 2); /* ro and sub only */
    unlink(q);
    rmdir(ro);
    rmdir(isdir);
    rmdir(dir);
    free(isdir);
    free(q);
    free(ro);
    free(p);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_unwritable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
