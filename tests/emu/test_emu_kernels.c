/* test_emu_kernels.c - the emulated CUDA device on hand-written kernels
 * (tests/emu/kernels/basic.cu): results against host references, bf16/f16
 * rounding, block-wide votes, and the negative controls: a dropped barrier,
 * a shuffle over wrong lanes, divergent barriers (and votes), bad warp
 * masks, reads of shared memory nothing wrote, and out-of-bounds accesses
 * must all be caught. */
#include "emu.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static EmuModule *mod;

static unsigned long long rng_state = 12345;
static uint32_t rnd32(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 32);
}
static float rndf(void) { return (float)rnd32() / 4294967296.0f * 2.0f - 1.0f; }

static void launch_ok(const char *name, unsigned gx, unsigned gy, unsigned bx, unsigned by,
                      size_t shmem, void **args)
{
    unsigned grid[3] = {gx, gy, 1}, block[3] = {bx, by, 1};
    Diag d = {{0}};
    if (!emu_launch(mod, name, grid, block, shmem, args, &d))
        fail_msg("%s", d.msg);
}

static bool launch(const char *name, unsigned gx, unsigned bx, size_t shmem, void **args, Diag *d)
{
    unsigned grid[3] = {gx, 1, 1}, block[3] = {bx, 1, 1};
    return emu_launch(mod, name, grid, block, shmem, args, d);
}

/* ---- block reductions ----------------------------------------------------- */

enum { NB = 4, NN = 1000 };

/* Runs a reduction kernel over NB blocks of NN values; returns the relative
 * error of its sums against a double-precision reference. */
static double reduce_err(const char *kernel, unsigned threads)
{
    float *x = malloc(sizeof(float) * NB * NN), out[NB];
    double ref[NB], got[NB];
    for (int b = 0; b < NB; b++) {
        ref[b] = 0;
        for (int i = 0; i < NN; i++) {
            x[b * NN + i] = rndf() + 0.5f;
            ref[b] += x[b * NN + i];
        }
    }
    int n = NN;
    void *args[] = {&x, &(float *){out}, &n};
    launch_ok(kernel, NB, 1, threads, 1, 0, args);
    for (int b = 0; b < NB; b++)
        got[b] = out[b];
    free(x);
    return rel_err(got, ref, NB);
}

static void test_block_sum(void **state)
{
    (void)state;
    assert_true(reduce_err("block_sum", 256) < 1e-6);
    assert_true(reduce_err("block_sum", 64) < 1e-6);
    assert_true(reduce_err("tree_sum", 256) < 1e-6);
}

/* Negative controls: each buggy variant must give wrong sums. */
static void test_missing_barrier_caught(void **state)
{
    (void)state;
    for (int rep = 0; rep < 3; rep++) {
        double e1 = reduce_err("block_sum_nobarrier", 256);
        double e2 = reduce_err("tree_sum_nobarrier", 256);
        print_message("missing barrier: rel err %g (shuffle+shared), %g (tree)\n", e1, e2);
        assert_true(e1 > 1e-2);
        assert_true(e2 > 1e-2);
    }
}

static void test_wrong_lane_caught(void **state)
{
    (void)state;
    double e = reduce_err("block_sum_wronglane", 256);
    print_message("shuffle over wrong lanes: rel err %g\n", e);
    assert_true(e > 1e-2);
}

/* ---- softmax with dynamic shared memory ----------------------------------- */

/* Relative error of softmax kernel `name` over R rows of 300 columns. */
static double softmax_err(const char *name, unsigned threads, int R)
{
    enum { C = 300 };
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C);
    double *ref = malloc(sizeof(double) * R * C), *got = malloc(sizeof(double) * R * C);
    for (int i = 0; i < R * C; i++)
        x[i] = 4.0f * rndf();
    for (int r = 0; r < R; r++) {
        double m = -INFINITY, s = 0;
        for (int c = 0; c < C; c++)
            m = fmax(m, x[r * C + c]);
        for (int c = 0; c < C; c++)
            s += exp(x[r * C + c] - m);
        for (int c = 0; c < C; c++)
            ref[r * C + c] = exp(x[r * C + c] - m) / s;
    }
    int cols = C;
    void *args[] = {&x, &y, &cols};
    memset(y, 0, sizeof(float) * R * C);
    launch_ok(name, R, 1, threads, 1, sizeof(float) * C, args);
    for (int i = 0; i < R * C; i++)
        got[i] = y[i];
    double e = rel_err(got, ref, R * C);
    free(x);
    free(y);
    free(ref);
    free(got);
    return e;
}

static void test_softmax(void **state)
{
    (void)state;
    for (unsigned threads = 32; threads <= 512; threads *= 4)
        assert_true(softmax_err("softmax_rows", threads, 5) < 1e-5);
}

/* Negative control: a write-after-read hazard on shared memory (a barrier
 * missing before partial results are overwritten) is exposed by the
 * straggler thread the scheduler delays after each barrier (the hazard
 * shows when the straggler is one of the lanes that read partials: many
 * rows, so that some block draws one). */
static void test_war_hazard_caught(void **state)
{
    (void)state;
    for (int rep = 0; rep < 4; rep++) { /* each launch draws new orders */
        double e = softmax_err("softmax_rows_war", 256, 64);
        print_message("write-after-read hazard: rel err %g\n", e);
        assert_true(e > 1e-2);
    }
}

/* ---- bf16 and f16 --------------------------------------------------------- */

/* Round to nearest even on the bit pattern, written independently of
 * cuda_emu.h: compare the discarded half with the halfway point. */
static uint16_t ref_f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    uint32_t lo = u & 0xffffu, hi = u >> 16;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)))
        hi++;
    return (uint16_t)hi;
}

static void test_convert16(void **state)
{
    (void)state;
    enum { N = 70000 };
    float *x = malloc(sizeof(float) * N), *bfb = malloc(sizeof(float) * N),
          *hb = malloc(sizeof(float) * N);
    uint16_t *bf = malloc(2 * N), *h = malloc(2 * N);
    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345,
        0x3f808000, /* bf16 tie, even below: stays */
        0x3f818000, /* bf16 tie, odd below: rounds up */
        0x3f808001, 0x3f807fff, 0x7f7fffff, /* rounds to bf16 inf */
        0x477fe000, /* 65504: f16 max */
        0x477ff000, /* 65520: f16 inf */
        0x477fefff, 0x38800000, /* f16 min normal */
        0x387fc000, 0x33800000, /* 2^-24: f16 min subnormal */
        0x33000000, /* 2^-25: tie to 0 */
        0x33000001, 0x33c00000, /* 1.5 * 2^-24: tie to even (2) */
        0x3a800100, 0x3f801000, /* f16 tie, even below */
        0x3f803000, /* f16 tie, odd below */
    };
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) {
        uint32_t u = i < ns ? special[i] : rnd32();
        if (i >= ns && i % 3 == 0) /* also values in f16's range */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + rnd32() % 45) << 23);
        memcpy(&x[i], &u, 4);
    }
    int n = N;
    void *args[] = {&x, &bf, &h, &bfb, &hb, &n};
    launch_ok("convert16", (N + 255) / 256, 1, 256, 1, 0, args);
    int bad_bf = 0, bad_h = 0;
    for (int i = 0; i < N; i++) {
        if (bf[i] != ref_f2bf(x[i]) || memcmp(&bfb[i], &(float){test_bf2f(bf[i])}, 4) != 0)
            bad_bf++;
        _Float16 r = (_Float16)x[i];
        uint16_t rb;
        memcpy(&rb, &r, 2);
        if (x[i] != x[i])
            rb = 0x7fff; /* the hardware's canonical NaN */
        float back = (float)r;
        if (h[i] != rb || (x[i] == x[i] && memcmp(&hb[i], &back, 4) != 0))
            bad_h++;
    }
    assert_int_equal(bad_bf, 0);
    assert_int_equal(bad_h, 0);
    free(x);
    free(bfb);
    free(hb);
    free(bf);
    free(h);
}

static void test_gelu_bf16_grid_stride(void **state)
{
    (void)state;
    enum { N = 10007 };
    uint16_t *x = malloc(2 * N), *y = malloc(2 * N);
    for (int i = 0; i < N; i++)
        x[i] = ref_f2bf(4.0f * rndf());
    long long n = N;
    void *args[] = {&x, &y, &n};
    launch_ok("gelu_bf16", 7, 1, 128, 1, 0, args);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float v = test_bf2f(x[i]);
        float t = tanhf(0.7978845608f * (v + 0.044715f * v * v * v));
        bad += y[i] != ref_f2bf(0.5f * v * (1.0f + t));
    }
    assert_int_equal(bad, 0);
    free(x);
    free(y);
}

/* ---- 2-D blocks, votes, atomics, shuffles ---------------------------------- */

static void test_transpose(void **state)
{
    (void)state;
    enum { R = 70, C = 45 };
    float *in = malloc(sizeof(float) * R * C), *out = malloc(sizeof(float) * R * C);
    for (int i = 0; i < R * C; i++)
        in[i] = (float)i;
    int rows = R, cols = C;
    void *args[] = {&in, &out, &rows, &cols};
    launch_ok("transpose", (C + 31) / 32, (R + 31) / 32, 32, 8, 0, args);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            assert_true(out[c * R + r] == in[r * C + c]);
    free(in);
    free(out);
}

static void test_votes_atomics(void **state)
{
    (void)state;
    enum { N = 100, W = 4 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = i < 32 ? 1.0f + (float)i : (i < 64 ? -1.0f : (i % 3 ? 2.0f : -2.0f));
    unsigned ballots[W];
    int anys[W], alls[W], hist[2] = {0, 0};
    float sum = 0;
    int n = N;
    void *args[] = {&(float *){x},      &(unsigned *){ballots}, &(int *){anys}, &(int *){alls},
                    &(int *){hist},     &(float *){&sum},       &n};
    launch_ok("votes", 2, 1, 64, 1, 0, args);
    double ref_sum = 0;
    int pos = 0;
    for (int w = 0; w < W; w++) {
        unsigned b = 0;
        for (int l = 0; l < 32; l++) {
            int i = w * 32 + l;
            if (i < N && x[i] > 0)
                b |= 1u << l;
        }
        assert_int_equal(ballots[w], b);
        assert_int_equal(anys[w], b != 0);
        assert_int_equal(alls[w], b == 0xffffffffu);
    }
    for (int i = 0; i < N; i++) {
        ref_sum += x[i];
        pos += x[i] > 0;
    }
    assert_int_equal(hist[1], pos);
    assert_int_equal(hist[0], N - pos);
    assert_true(fabs(sum - ref_sum) < 1e-3);
}

/* __syncthreads_or/_and/_count: every thread of a block gets the vote of
 * all of them, consecutive votes do not mix, a loop driven by a vote runs
 * as often for every thread; the launch's statistics count the votes and
 * barriers (emu_last_stats). */
static void test_block_votes(void **state)
{
    (void)state;
    enum { NBLK = 3, NT = 96, N = NBLK * NT - 10 };
    float x[NBLK * NT];
    int lim[NBLK * NT], out[6 * NBLK * NT];
    for (int i = 0; i < NBLK * NT; i++) {
        int b = i / NT;
        /* block 0: mixed signs; block 1: all positive; block 2: all <= 0 */
        x[i] = b == 0 ? (i % 7 == 3 ? 1.0f : -1.0f) : b == 1 ? 2.0f : -2.0f;
        lim[i] = b == 0 ? (int)(rnd32() % 5) : b == 1 ? 0 : (i % NT == 77 ? 6 : 1);
    }
    int n = N;
    void *args[] = {&(float *){x}, &(int *){lim}, &(int *){out}, &n};
    launch_ok("block_votes", NBLK, 1, NT, 1, 0, args);
    unsigned long long votes = 0;
    for (int b = 0; b < NBLK; b++) {
        int cnt = 0, mx = 0;
        for (int t = 0; t < NT; t++) {
            int i = b * NT + t;
            cnt += i < N && x[i] > 0;
            mx = lim[i] > mx ? lim[i] : mx;
        }
        votes += 4 + (unsigned long long)mx + 1;
        for (int t = 0; t < NT; t++) {
            const int *o = out + 6 * (b * NT + t);
            assert_int_equal(o[0], cnt > 0);
            assert_int_equal(o[1], cnt == NT);
            assert_int_equal(o[2], cnt);
            assert_int_equal(o[3], 1);
            assert_int_equal(o[4], mx);
            assert_int_equal(o[5], 0);
        }
    }
    KilnEmuStats st;
    emu_last_stats(mod, &st);
    assert_int_equal(st.votes, votes);
    assert_int_equal(st.barriers, NBLK);
}

static void test_shuffles(void **state)
{
    (void)state;
    int x[32], up[32], idx[32], xr8[32];
    for (int i = 0; i < 32; i++)
        x[i] = 100 + i * 7;
    void *args[] = {&(int *){x}, &(int *){up}, &(int *){idx}, &(int *){xr8}};
    launch_ok("shuffles", 1, 1, 32, 1, 0, args);
    for (int l = 0; l < 32; l++) {
        int seg16 = l & ~15, seg8 = l & ~7;
        assert_int_equal(up[l], x[l - 3 < seg16 ? l : l - 3]);
        assert_int_equal(idx[l], x[seg8 + 5]);
        int s = l ^ 9;
        assert_int_equal(xr8[l], x[s >= seg8 + 8 ? l : s]);
    }
}

/* ---- execution errors ------------------------------------------------------- */

static void expect_launch_error(const char *kernel, unsigned threads, const char *needle)
{
    float buf[64] = {0};
    void *args[] = {&(float *){buf}};
    Diag d = {{0}};
    assert_false(launch(kernel, 1, threads, 0, args, &d));
    print_message("%s: %s\n", kernel, d.msg);
    assert_non_null(strstr(d.msg, needle));
}

static void test_barrier_errors(void **state)
{
    (void)state;
    expect_launch_error("early_return_barrier", 32, "returned while");
    expect_launch_error("divergent_barrier", 32, "__syncthreads() at");
    expect_launch_error("partial_mask", 32, "lane");
    expect_launch_error("divergent_vote", 32, "__syncthreads_or() at");
    expect_launch_error("deadlock", 32, "deadlock");
}

static void test_uninitialised_shared_is_nan(void **state)
{
    (void)state;
    float out[64];
    void *args[] = {&(float *){out}};
    launch_ok("uninit_shared", 1, 1, 64, 1, 0, args);
    for (int i = 0; i < 64; i++)
        assert_true(i < 32 ? out[i] == 1.0f : isnan(out[i]));
}

/* ---- thread order: per kernel -------------------------------------------- */

/* The thread order of one launch of `arrival` (256 threads) on module m. */
static void arrival_order(EmuModule *m, int *order)
{
    int cnt = 0;
    void *args[] = {&(int *){&cnt}, &order};
    unsigned grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
    Diag d = {{0}};
    if (!emu_launch(m, "arrival", grid, block, 0, args, &d))
        fail_msg("%s", d.msg);
    assert_int_equal(cnt, 256);
}

/* A kernel's n-th launch runs its threads in the same order whatever other
 * kernels were launched before it (emu.h; zero=1's update in pieces adds
 * launches of the range function, and a scatter-add's float atomics after
 * it must still sum in the one-launch run's order: tests/cudafake/zero.sh's
 * pieces case). Its next launch runs them in another order. */
static void test_thread_order_per_kernel(void **state)
{
    (void)state;
    char *src = read_file("tests/emu/kernels/basic.cu");
    assert_non_null(src);
    EmuOpts o;
    emu_opts_default(&o);
    Diag d = {{0}};
    EmuModule *a = emu_compile(src, &o, &d), *b = emu_compile(src, &o, &d);
    free(src);
    assert_non_null(a);
    assert_non_null(b);
    int first[256], other[256], second[256];
    arrival_order(a, first);
    float out[64];
    void *args[] = {&(float *){out}};
    unsigned grid[3] = {1, 1, 1}, block[3] = {64, 1, 1};
    for (int i = 0; i < 3; i++) /* other launches first on b */
        assert_true(emu_launch(b, "uninit_shared", grid, block, 0, args, &d));
    arrival_order(b, other);
    assert_memory_equal(first, other, sizeof first);
    arrival_order(a, second);
    assert_memory_not_equal(first, second, sizeof first);
    emu_free(a);
    emu_free(b);
}

/* ---- memory errors: the sanitizers end a child process ---------------------- */

/* Runs one launch in a child; returns its exit status and its stderr. */
static int child_launch(const char *kernel, unsigned threads, size_t shmem, void **args,
                        char **err)
{
    char path[] = "/tmp/kiln-emu-child-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        Diag d = {{0}};
        bool ok = launch(kernel, 1, threads, shmem, args, &d);
        fprintf(stderr, "launch returned %d: %s\n", ok, d.msg);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    close(fd);
    *err = read_file(path);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_sanitizers_catch_overflows(void **state)
{
    (void)state;
    char *err = NULL;
    float *out = malloc(sizeof(float) * 64), *x = malloc(sizeof(float) * 40);
    for (int i = 0; i < 40; i++)
        x[i] = 1.0f;
    int n = 32;
    void *a1[] = {&out, &n};
    /* 64 threads, dynamic shared memory for 32 floats */
    assert_int_not_equal(child_launch("dyn_shared_overflow", 64, 32 * sizeof(float), a1, &err),
                         0);
    assert_non_null(strstr(err, "AddressSanitizer"));
    free(err);
    /* control: enough dynamic shared memory */
    assert_int_equal(child_launch("dyn_shared_overflow", 64, 64 * sizeof(float), a1, &err), 0);
    free(err);
    int k = 1;
    void *a2[] = {&out, &k};
    assert_int_not_equal(child_launch("static_shared_overflow", 32, 0, a2, &err), 0);
    assert_non_null(strstr(err, "out of bounds"));
    free(err);
    int m = 40;
    void *a3[] = {&x, &out, &m};
    /* 41 threads: the one read past x is x[40], in its redzone whatever the
     * thread order (with 64, the first of x[40..63] to run could land in a
     * neighbouring chunk, freed or not, and the report name that) */
    assert_int_not_equal(child_launch("global_overflow", 41, 0, a3, &err), 0);
    assert_non_null(strstr(err, "heap-buffer-overflow"));
    free(err);
    free(out);
    free(x);
}

/* ---- what is not modelled does not compile ---------------------------------- */

static void expect_compile_error(const char *src, const char *needle)
{
    EmuOpts o;
    emu_opts_default(&o);
    o.sanitize = false;
    Diag d = {{0}};
    EmuModule *m = emu_compile(src, &o, &d);
    assert_null(m);
    assert_non_null(strstr(d.msg, needle));
}

static void test_unmodelled_is_compile_error(void **state)
{
    (void)state;
    expect_compile_error("extern \"C\" __global__ void k(unsigned *o) { *o = __activemask(); }",
                         "__activemask");
    expect_compile_error("__constant__ float c[4];\n"
                         "extern \"C\" __global__ void k(float *o) { *o = c[0]; }",
                         "__constant__");
    expect_compile_error("extern \"C\" __global__ void k(short *o) {\n"
                         "  *o = __shfl_sync(0xffffffffu, *o, 0); }",
                         "no overload");
    expect_compile_error("extern \"C\" __global__ void k(float *o) { *o = __fadd_rd(*o, 1.0f); }",
                         "__fadd_rd");
}

static int setup(void **state)
{
    (void)state;
    char *src = read_file("tests/emu/kernels/basic.cu");
    if (!src)
        return -1;
    EmuOpts o;
    emu_opts_default(&o);
    Diag d = {{0}};
    mod = emu_compile(src, &o, &d);
    free(src);
    if (!mod) {
        fprintf(stderr, "%s\n", d.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    emu_free(mod);
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    emu_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_sum),
        cmocka_unit_test(test_missing_barrier_caught),
        cmocka_unit_test(test_wrong_lane_caught),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_war_hazard_caught),
        cmocka_unit_test(test_convert16),
        cmocka_unit_test(test_gelu_bf16_grid_stride),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_votes_atomics),
        cmocka_unit_test(test_block_votes),
        cmocka_unit_test(test_shuffles),
        cmocka_unit_test(test_barrier_errors),
        cmocka_unit_test(test_uninitialised_shared_is_nan),
        cmocka_unit_test(test_thread_order_per_kernel),
        cmocka_unit_test(test_sanitizers_catch_overflows),
        cmocka_unit_test(test_unmodelled_is_compile_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
