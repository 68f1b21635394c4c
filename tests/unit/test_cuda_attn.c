/* test_cuda_attn.c - the host side of the CUDA attention kernels
 * (codegen/cuda_attn.c): tile choice within 48 KiB of shared memory,
 * launch geometry, and the cost the model reads (FLOPs of the visited
 * tiles only: causal skips about half; bytes as the kernels move them),
 * against counts worked out here. The kernels' numbers are checked on the
 * emulator (tests/emu/test_emu_attn.c) and by NVRTC (test_cuda_compile). */
#include "cg_cuda.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static CgCudaAttn gpt2(CgCudaAttnKind kind, bool causal, DType dt)
{
    CgCudaAttn a = {.kind = kind, .causal = causal, .scale = 0.125, .dt = dt, .bh = 192,
                    .tq = 1024, .tk = 1024, .d = 64, .dv = 64, .want_o = true, .want_lse = true,
                    .want_dk = true, .want_dv = true};
    return a;
}

static void test_tiles(void **state)
{
    (void)state;
    int nw, bt;
    /* GPT-2, D = 64: bf16 forward 4 warps x 64 keys; f32 4 warps x 32 */
    CgCudaAttn a = gpt2(CG_CUDA_ATTN_FWD, true, DT_BF16);
    assert_true(cg_cuda_attn_tiles(&a, &nw, &bt));
    assert_int_equal(nw, 4);
    assert_int_equal(bt, 64);
    a.dt = DT_F32;
    assert_true(cg_cuda_attn_tiles(&a, &nw, &bt));
    assert_int_equal(nw, 4);
    assert_int_equal(bt, 32);
    /* every kind and head size up to 128 fits; the grid covers every tile */
    static const int ds[] = {1, 16, 24, 32, 40, 64, 100, 128};
    for (int k = 0; k < 3; k++)
        for (int dt = 0; dt < 2; dt++)
            for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
                CgCudaAttn x = gpt2((CgCudaAttnKind)k, true, dt ? DT_BF16 : DT_F32);
                x.d = x.dv = ds[i];
                assert_true(cg_cuda_attn_tiles(&x, &nw, &bt));
                int64_t es = dt ? 2 : 4, ld = (ds[i] + 15) / 16 * 16 + 8;
                int64_t rows = 16 * nw;
                /* the kernels' static shared arrays (cuda_attn.c) */
                int64_t sh = k == CG_CUDA_ATTN_FWD ? es * ld * (rows + 2 * bt)
                             : k == CG_CUDA_ATTN_DQ ? es * ld * 2 * (rows + bt)
                                                    : es * ld * 2 * (rows + bt) + 8 * bt;
                assert_true(sh <= 48 * 1024);
                int64_t len = k == CG_CUDA_ATTN_DKDV ? x.tk : x.tq;
                assert_int_equal(cg_cuda_attn_blocks(&x, nw), x.bh * ((len + rows - 1) / rows));
            }
    /* a head size nothing fits is refused, with a message */
    a.d = a.dv = 2048;
    assert_false(cg_cuda_attn_tiles(&a, &nw, &bt));
    CgBuf b = {0};
    Diag d = {{0}};
    assert_false(cg_print_cuda_attn(&b, &a, "too_big", NULL, &d));
    assert_non_null(strstr(d.msg, "2048"));
    free(b.s);
}

static void test_cost(void **state)
{
    (void)state;
    for (int dt = 0; dt < 2; dt++) {
        CgCudaAttn full = gpt2(CG_CUDA_ATTN_FWD, false, dt ? DT_BF16 : DT_F32);
        CgCudaAttn causal = gpt2(CG_CUDA_ATTN_FWD, true, dt ? DT_BF16 : DT_F32);
        int nw, bt;
        assert_true(cg_cuda_attn_tiles(&full, &nw, &bt));
        double ff, fb, cf, cb;
        cg_cuda_attn_cost(&full, nw, bt, &ff, &fb);
        cg_cuda_attn_cost(&causal, nw, bt, &cf, &cb);
        /* not causal: every pair, 2 (D + Dv) FLOPs each */
        assert_true(fabs(ff - 192.0 * 1024 * 1024 * 2 * 128) < 1);
        /* causal: the tiles on and below the diagonal, BR = 64 rows a tile */
        double pairs = 0;
        for (int qt = 0; qt < 1024 / 64; qt++) {
            int kend = (qt + 1) * 64;
            pairs += 64.0 * ((kend + bt - 1) / bt * bt);
        }
        assert_true(fabs(cf - 192.0 * pairs * 2 * 128) < 1);
        assert_true(cf < 0.6 * ff);
        /* bytes: q, o once, lse once, k and v once per visiting query tile */
        double es = dt ? 2 : 4, nq = 1024 / 64;
        double want = 192.0 * (1024 * 64 * es * 2 + 4 * 1024 + nq * 1024 * 128 * es);
        assert_true(fabs(fb - want) < 1);
        assert_true(cb < 0.6 * fb);
    }
    /* dk/dv: causal visits the query tiles from each key tile's diagonal */
    CgCudaAttn k = gpt2(CG_CUDA_ATTN_DKDV, false, DT_BF16), kc = k;
    kc.causal = true;
    int nw, bt;
    assert_true(cg_cuda_attn_tiles(&k, &nw, &bt));
    double f0, b0, f1, b1;
    cg_cuda_attn_cost(&k, nw, bt, &f0, &b0);
    cg_cuda_attn_cost(&kc, nw, bt, &f1, &b1);
    assert_true(fabs(f0 - 192.0 * 1024 * 1024 * 2 * 256) < 1);
    assert_true(f1 < 0.6 * f0 && f1 > 0.45 * f0);
    /* dv alone does half the products */
    k.want_dk = false;
    double f2, b2;
    cg_cuda_attn_cost(&k, nw, bt, &f2, &b2);
    assert_true(fabs(f2 - f0 / 2) < 1 && b2 < b0);
    /* the printer fills the function's geometry and cost */
    CgCudaFn fn = {0};
    CgBuf b = {0};
    Diag d = {{0}};
    CgCudaAttn a = gpt2(CG_CUDA_ATTN_DQ, true, DT_BF16);
    assert_true(cg_print_cuda_attn(&b, &a, "dq", &fn, &d));
    assert_true(fn.attn && fn.mma && fn.threads == 128 && fn.blocks == 192 * 16);
    assert_non_null(strstr(b.s, "extern \"C\" __global__ void __launch_bounds__(128) dq("));
    /* a 4-warp forward takes its bounds by architecture (no spill on sm_90
     * or sm_80, see cuda_attn.c) */
    CgCudaAttn fa = gpt2(CG_CUDA_ATTN_FWD, false, DT_BF16);
    assert_true(cg_print_cuda_attn(&b, &fa, "fwd", NULL, &d));
    assert_non_null(strstr(b.s, "extern \"C\" __global__ void __launch_bounds__(KILN_ATTN_FWD4_BF16) fwd("));
    assert_non_null(strstr(b.s, "kiln_attn_dq<kiln_bf16, 64, 64, 4,"));
    double fq, bq;
    assert_true(cg_cuda_attn_tiles(&a, &nw, &bt));
    cg_cuda_attn_cost(&a, nw, bt, &fq, &bq);
    assert_true(fn.flops == fq && fn.bytes == bq);
    free(b.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiles),
        cmocka_unit_test(test_cost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
