/* test_safetensors.c - safetensors round trip, corrupt files, atomic writes. */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime.h"
#include "train.h"

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

/* writes path with the JSON header and data, then expect_corrupt */
static void expect_bad_header(const char *path, const char *json, const void *data, size_t n,
                              const char *what)
{
    write_raw(path, json, 0, data, n);
    expect_corrupt(path, what);
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

    expect_bad_header(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], ",
                      x, sizeof x, "not a JSON object");

    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,32]}}",
                      x, sizeof x, "do not match its dtype and shape");

    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}}",
                      x, sizeof x, "out of range");

    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 0, x,
              sizeof x);
    StFile f;
    Diag d;
    assert_true(rt_st_read(p, &f, &d)); /* an offset inside the data is fine */
    assert_true(((float *)f.t[0].data)[0] == 3.0f);
    rt_st_free(&f);

    expect_bad_header(p,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      x, sizeof x, "overlap");

    expect_bad_header(p, "{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
                      x, sizeof x, "unsupported dtype");

    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
                      x, sizeof x, "bad shape");

    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", x, sizeof x, "data_offsets");

    char *missing = xasprintf("%s/none.safetensors", dir);
    expect_corrupt(missing, "cannot open");
    unlink(p);
    rmdir(dir);
    free(missing);
    free(p);
    free(dir);
}

/* a growing string for generated headers */
typedef struct {
    char *p;
    size_t n, cap;
} Buf;

static void buf_add(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_add(Buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = 2 * (b->n + (size_t)k + 1);
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* Issue 13: __metadata__ given twice (the first with many keys) wrote past
 * the second's key array; every duplicate key is now refused. */
static void test_duplicates(void **state)
{
    (void)state;
    char *dir = scratch_dir("st");
    char *p = xasprintf("%s/dup.safetensors", dir);
    float x[4] = {1, 2, 3, 4};
    const char *a = "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}";

    Buf b = {0};
    buf_add(&b, "{\"__metadata__\":{");
    for (int i = 0; i < 400; i++)
        buf_add(&b, "%s\"k%d\":\"%050d\"", i ? "," : "", i, i);
    buf_add(&b, "},\"__metadata__\":{\"a\":\"b\"},\"__metadata__\":{\"c\":\"d\"},%s}", a);
    write_raw(p, b.p, 0, x, sizeof x);
    expect_corrupt(p, "key \"__metadata__\" appears twice");
    /* the same the other way round: the short one first */
    b.n = 0;
    buf_add(&b, "{\"__metadata__\":{\"a\":\"b\"},%s,\"__metadata__\":{", a);
    for (int i = 0; i < 400; i++)
        buf_add(&b, "%s\"k%d\":\"v\"", i ? "," : "", i);
    buf_add(&b, "}}");
    write_raw(p, b.p, 0, x, sizeof x);
    expect_corrupt(p, "key \"__metadata__\" appears twice");
    free(b.p);

    char *j = xasprintf("{%s,\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},%s}", a,
                        a);
    write_raw(p, j, 0, x, sizeof x);
    expect_corrupt(p, "tensor \"a\" appears twice");
    free(j);
    j = xasprintf("{\"__metadata__\":{\"x\":\"1\",\"y\":\"2\",\"x\":\"3\"},%s}", a);
    write_raw(p, j, 0, x, sizeof x);
    expect_corrupt(p, "__metadata__ key \"x\" appears twice");
    free(j);
    /* distinct names that escape the same way are the same name */
    j = xasprintf("{%s,\"\\u0061\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", a);
    write_raw(p, j, 0, x, sizeof x);
    expect_corrupt(p, "tensor \"a\" appears twice");
    free(j);
    unlink(p);
    rmdir(dir);
    free(p);
    free(dir);
}

/* What a header can make the reader allocate is bounded: the header's size,
 * its JSON values, its tensors and metadata entries, name lengths, rank,
 * the dims product, the data offsets. */
static void test_bounds(void **state)
{
    (void)state;
    char *dir = scratch_dir("st");
    char *p = xasprintf("%s/b.safetensors", dir);
    float x[4] = {1, 2, 3, 4};
    Buf b = {0};

    /* a header length over the format's 100 MB cap, inside a (sparse) file */
    write_raw(p, "{}", 150000000, NULL, 0);
    assert_int_equal(truncate(p, 200000000), 0);
    expect_corrupt(p, "header length 150000000 is too large (expected at most 100000000");

    /* over 2^21 JSON values */
    buf_add(&b, "{\"a\":[");
    for (int i = 0; i < (1 << 21) + 1; i++)
        buf_add(&b, "%s0", i ? "," : "");
    buf_add(&b, "]}");
    write_raw(p, b.p, 0, NULL, 0);
    expect_corrupt(p, "too many JSON values");

    /* over 65536 tensors; over 65536 metadata entries */
    b.n = 0;
    buf_add(&b, "{");
    for (int i = 0; i < 65538; i++)
        buf_add(&b, "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}",
                i ? "," : "", i);
    buf_add(&b, "}");
    write_raw(p, b.p, 0, NULL, 0);
    expect_corrupt(p, "65538 entries (expected at most 65536 tensors");
    b.n = 0;
    buf_add(&b, "{\"__metadata__\":{");
    for (int i = 0; i < 65537; i++)
        buf_add(&b, "%s\"k%d\":\"\"", i ? "," : "", i);
    buf_add(&b, "}}");
    write_raw(p, b.p, 0, NULL, 0);
    expect_corrupt(p, "__metadata__ has 65537 entries (expected at most 65536)");

    /* names over 4096 bytes (a tensor's, a metadata key) */
    char *longname = xmalloc(5001);
    memset(longname, 'n', 5000);
    longname[5000] = 0;
    char *j = xasprintf("{\"%s\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
                        longname);
    write_raw(p, j, 0, NULL, 0);
    expect_corrupt(p, "is too long (expected at most 4096 bytes, got 5000)");
    free(j);
    j = xasprintf("{\"__metadata__\":{\"%s\":\"v\"}}", longname);
    write_raw(p, j, 0, NULL, 0);
    expect_corrupt(p, "__metadata__ key");
    free(j);
    free(longname);

    /* rank, the dims product, dims and offsets that are not exact integers */
    expect_bad_header(p,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                      "\"data_offsets\":[0,4]}}",
                      x, sizeof x, "too many dimensions (expected at most 8, got 9)");
    expect_bad_header(p,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                      "\"data_offsets\":[0,16]}}",
                      x, sizeof x, "expected over 2^64 bytes for F32 x over 2^64 elements");
    expect_bad_header(p,
                      "{\"a\":{\"dtype\":\"I64\",\"shape\":[4294967296,1073741824],"
                      "\"data_offsets\":[0,16]}}",
                      x, sizeof x,
                      "expected over 2^64 bytes for I64 x 4611686018427387904 elements");
    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
                      x, sizeof x, "bad shape");
    expect_bad_header(p,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[9007199254740992],"
                      "\"data_offsets\":[0,4]}}",
                      x, sizeof x, "bad shape");
    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}",
                      x, sizeof x, "bad data_offsets");
    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}",
                      x, sizeof x, "got -4)");
    expect_bad_header(p,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":"
                      "[9007199254740000,9007199254740004]}}",
                      x, sizeof x, "out of range (expected at most the data section's 16 bytes)");

    /* bytes after the JSON object (space padding is fine) */
    expect_bad_header(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}} x",
                      x, sizeof x,
                      "bytes after its JSON object (expected space padding, got byte 0x78");

    /* empty tensors take no bytes: inside another's span, and with a huge
     * dim beside a zero one */
    write_raw(p,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"z\":{\"dtype\":\"F32\",\"shape\":[0,9007199254740991],\"data_offsets\":[8,8]}}  ",
              0, x, sizeof x);
    StFile f;
    Diag d;
    if (!rt_st_read(p, &f, &d))
        fail_msg("%s", d.msg);
    assert_int_equal(f.n, 2);
    assert_int_equal(rt_st_find(&f, "z")->nbytes, 0);
    rt_st_free(&f);
    free(b.p);
    unlink(p);
    rmdir(dir);
    free(p);
    free(dir);
}

/* Issue 13 item 4: a directory, a FIFO or a device is an error, not an
 * allocation of "the file's size" (a directory's ftell) or a hang. */
static void test_not_regular(void **state)
{
    (void)state;
    char *dir = scratch_dir("st");
    expect_corrupt(dir, "expected a regular file, got a directory");
    char *fifo = xasprintf("%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    expect_corrupt(fifo, "expected a regular file, got a FIFO");
    expect_corrupt("/dev/zero", "expected a regular file, got a character device");
    unlink(fifo);
    rmdir(dir);
    free(fifo);
    free(dir);
}

static bool exists(const char *dir, const char *name)
{
    char *p = xasprintf("%s/%s", dir, name);
    bool e = access(p, F_OK) == 0;
    free(p);
    return e;
}

static void touch(const char *dir, const char *name)
{
    char *p = xasprintf("%s/%s", dir, name);
    write_bytes(p, "x", 1);
    free(p);
}

/* Issue 13 item 9: the temp files a killed writer left are removed, those
 * of a live writer and other names are kept. A pid above the kernel's
 * pid_max (at most 2^22) names no process. */
static void test_sweep(void **state)
{
    (void)state;
    char *dir = scratch_dir("st");
    char live[64], mine[64];
    snprintf(live, sizeof live, "w.safetensors.tmp.%ld.abcDEF", (long)getppid());
    snprintf(mine, sizeof mine, "w.safetensors.tmp.%ld.abcDEF", (long)getpid());
    const char *gone[] = {"w.safetensors.tmp.999999999.abcDEF", "w.safetensors.tmp.2000000000.Z9z9Z9"};
    const char *keep[] = {
        live,
        mine,
        "w.safetensors.tmp.999999999.abcDE",   /* not 6 characters */
        "w.safetensors.tmp.999999999.abcDEFG", /* nor 7 */
        "w.safetensors.tmp.abcDEF",            /* no pid (an older kiln's name) */
        "w.safetensors.tmp.99999999999999999999999.abcDEF", /* no pid either */
        "w.safetensors",
        "xw.safetensors.tmp.999999999.abcDEF",
        "w.safetensors.tmp.999999999.abc-EF",
    };
    for (size_t i = 0; i < sizeof gone / sizeof *gone; i++)
        touch(dir, gone[i]);
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        touch(dir, keep[i]);
    char *head = xasprintf("%s/w.safetensors", dir);
    assert_int_equal(rt_tmp_sweep(head, NULL), 2);
    for (size_t i = 0; i < sizeof gone / sizeof *gone; i++)
        assert_false(exists(dir, gone[i]));
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        if (!exists(dir, keep[i]))
            fail_msg("removed %s", keep[i]);
    assert_int_equal(rt_tmp_sweep(head, NULL), 0);
    free(head);

    /* HEAD<digits>TAIL: checkpoints' step numbers */
    touch(dir, "ck.step12.safetensors.tmp.999999999.qwerty");
    touch(dir, "ck.step.safetensors.tmp.999999999.qwerty");
    touch(dir, "ck.step1x.safetensors.tmp.999999999.qwerty");
    head = xasprintf("%s/ck.step", dir);
    assert_int_equal(rt_tmp_sweep(head, ".safetensors"), 1);
    assert_false(exists(dir, "ck.step12.safetensors.tmp.999999999.qwerty"));
    assert_true(exists(dir, "ck.step.safetensors.tmp.999999999.qwerty"));
    assert_true(exists(dir, "ck.step1x.safetensors.tmp.999999999.qwerty"));
    free(head);

    /* a writer killed mid-write (SIGXFSZ past a 4 KiB file size limit)
     * leaves PATH.tmp.PID.XXXXXX with its pid; the sweep removes it */
    char *p = xasprintf("%s/big.safetensors", dir);
    static float v[4096];
    StTensor t = {.name = "a", .dtype = DT_F32, .rank = 1, .dim = {4096}, .data = v,
                  .nbytes = sizeof v};
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct rlimit lim = {4096, 4096}, core = {0, 0};
        setrlimit(RLIMIT_CORE, &core);
        setrlimit(RLIMIT_FSIZE, &lim);
        Diag d;
        rt_st_write(p, &t, 1, NULL, NULL, 0, &d);
        _exit(0); /* not reached: SIGXFSZ */
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ);
    char left[128];
    snprintf(left, sizeof left, "big.safetensors.tmp.%ld.", (long)child);
    DIR *dd = opendir(dir);
    int found = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        found += strncmp(e->d_name, left, strlen(left)) == 0 && strlen(e->d_name) == strlen(left) + 6;
    closedir(dd);
    assert_int_equal(found, 1);
    assert_int_equal(rt_tmp_sweep(p, NULL), 1);
    assert_int_equal(count_entries(dir), sizeof keep / sizeof *keep + 2);
    assert_int_equal(remove_tree(dir), 0);
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
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_not_regular),
        cmocka_unit_test(test_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
