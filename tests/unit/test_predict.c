/* test_predict.c - the cost model (codegen/predict.c) on graphs whose
 * answer is known by hand: a large elementwise kernel is memory-bound at
 * the device's bandwidth, a full reduction is split over many blocks and
 * is memory-bound too, a one-element kernel by launch overhead (less with a CUDA graph),
 * a large GEMM by compute at the precision's peak; more bandwidth is never
 * slower; the CPU model splits what the backend splits; ptxas' registers
 * and shared memory (read from an NVRTC log) set the blocks per SM, and a
 * register-bound kernel is predicted slower; the fused attention kernels'
 * re-reads cost DRAM bytes only when the heads in flight outgrow L2;
 * memory-bound kernels run at the device's achievable bandwidth, GEMMs
 * by shape (wave quantisation, split-K, K depth, calibrated to the
 * measured 8192^3), attention from its kernels' instruction counts. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_cuda.h"
#include "codegen.h"
#include "passes.h"

typedef struct {
    Graph *g;
    CgPlan *p;
    CgCudaProgram *q;
} Compiled;

/* IR text -> simplify, fuse, schedule -> plan (and the CUDA program). */
static Compiled compile(const char *ir, bool bf16)
{
    Compiled c = {parse_or_fail(ir), NULL, NULL};
    PassOpts po;
    pass_opts_default(&po);
    Diag d = {{0}};
    if (!pass_simplify(c.g, &po, &d) || !pass_fuse(c.g, &po, &d) ||
        !pass_schedule(c.g, &po, &d))
        fail_msg("passes: %s", d.msg);
    c.p = cg_plan(c.g, &d);
    if (!c.p)
        fail_msg("cg_plan: %s", d.msg);
    c.q = cg_cuda_program(c.p, bf16);
    return c;
}

static void release(Compiled *c)
{
    cg_cuda_program_free(c->q);
    cg_plan_free(c->p);
    ir_free(c->g);
}

static const CgDevice *dev(const char *name)
{
    const CgDevice *d = cg_device_find(name);
    if (!d)
        fail_msg("device %s missing from the table", name);
    return d;
}

static void near(double got, double want, double rel, const char *what)
{
    if (!(fabs(got - want) <= rel * fabs(want)))
        fail_msg("%s: %g (expected %g within %.0f%%)", what, got, want, 100 * rel);
}

static void test_table(void **state)
{
    (void)state;
    const char *need[] = {"a100", "h100", "h200", "b200"};
    for (int i = 0; i < 4; i++) {
        const CgDevice *d = dev(need[i]);
        assert_true(d->gpu && d->units > 0 && d->bf16 > d->tf32 && d->tf32 > d->f32 &&
                    d->f32 > 0 && d->bw > 0 && d->l2 > 0 && d->launch_s > d->graph_s &&
                    d->graph_s > 0 && d->max_threads_unit >= 1024 && d->max_blocks_unit > 0);
        assert_true(d->bw_eff > 0.5 && d->bw_eff <= 1 && d->gemm_top > 0.5 && d->gemm_top < 1 &&
                    d->clock > 1e9 && d->mma_sync > 0 && d->mma_sync <= 1);
        /* the clock and 4096 FLOP a clock per SM for an m16n8k16 pair of
         * tensor cores x units give the datasheet peak within 1% (A100:
         * 2048, B200: 8192) */
        double per_clk = d->bf16 / (d->units * d->clock);
        assert_true(fabs(per_clk / 2048 - round(per_clk / 2048)) < 0.01);
    }
    /* achievable bandwidth: the copies measured on this workplace's GPUs */
    near(cg_device_bw(dev("h100")), 3.0e12, 1e-9, "h100 achievable bandwidth");
    near(cg_device_bw(dev("h200")), 4.3e12, 1e-9, "h200 achievable bandwidth");
    assert_null(cg_device_find("cpu")); /* measured, never from the table */
    assert_null(cg_device_find("h300"));
}

static const char elementwise[] = /* 16M f32: read 64 MiB, write 64 MiB */
    "kiln-ir v1\n"
    "%0:f32[4096,4096] = input \"x\"\n"
    "%1:f32[4096,4096] = neg %0\n"
    "output \"y\" %1\n";

static void test_memory_bound(void **state)
{
    (void)state;
    Compiled c = compile(elementwise, false);
    CgPredictOpts o = {0};
    const CgDevice *h200 = dev("h200"), *h100 = dev("h100");
    CgPrediction *a = cg_predict(c.p, c.q, h200, &o), *b = cg_predict(c.p, c.q, h100, &o);
    assert_int_equal(a->rows.n, 1);
    const CgPredRow *r = &a->rows.v[0];
    assert_int_equal(r->limit, CG_LIMIT_MEMORY);
    near(r->bytes, 2.0 * 4096 * 4096 * 4, 1e-9, "bytes");
    /* at the achievable bandwidth (4.3 TB/s), not the datasheet's 4.8 */
    near(r->s, r->bytes / 4.3e12 + h200->launch_s, 0.02, "h200 seconds");
    assert_true(r->cls == CG_CLASS_MEMORY);
    /* memory-bound: the time scales with 1 / bandwidth */
    near(b->rows.v[0].s - h100->launch_s, (r->s - h200->launch_s) * 4.3 / 3.0, 0.02,
         "h100 seconds");
    assert_true(b->step_s > a->step_s);
    cg_prediction_free(a);
    cg_prediction_free(b);
    release(&c);
}

static const char in_place[] = /* w <- w - g: the update computed in w's storage */
    "kiln-ir v1\n"
    "%0:f32[4096,4096] = param \"w\"\n"
    "%1:f32[4096,4096] = input \"g\"\n"
    "%2:f32[4096,4096] = sub %0, %1\n"
    "update %0 <- %2\n";

/* An update in place (AdamW's p, m and v) reads every element of its
 * buffer and writes it back: the buffer counts twice, g once. */
static void test_update_in_place(void **state)
{
    (void)state;
    Compiled c = compile(in_place, false);
    CgPredictOpts o = {0};
    CgPrediction *a = cg_predict(c.p, c.q, dev("h200"), &o);
    assert_int_equal(a->rows.n, 1);
    near(a->rows.v[0].bytes, 3.0 * 4096 * 4096 * 4, 1e-9, "bytes");
    cg_prediction_free(a);
    release(&c);
}

static const char full_sum[] = /* one scalar out of 16M: one block */
    "kiln-ir v1\n"
    "%0:f32[4096,4096] = input \"x\"\n"
    "%1:f32[1,1] = reduce_sum %0 {axes=[0,1]}\n"
    "%2:f32[] = reshape %1\n"
    "output \"y\" %2\n";

/* A full reduction runs split over many blocks in two stages (issue 16,
 * codegen/cuda_print.c): the launch that reads the 64 MiB has at least
 * twice the SMs in blocks and is memory-bound at the full bandwidth; the
 * stage that combines the partials moves almost nothing. The one-block
 * kernel it replaces would have taken its bytes at 1/132 of the bandwidth. */
static void test_full_reduction_split(void **state)
{
    (void)state;
    Compiled c = compile(full_sum, false);
    CgPredictOpts o = {0};
    const CgDevice *h200 = dev("h200");
    CgPrediction *a = cg_predict(c.p, c.q, h200, &o);
    const CgPredRow *worst = NULL;
    for (int i = 0; i < a->rows.n; i++)
        if (!worst || a->rows.v[i].s > worst->s)
            worst = &a->rows.v[i];
    assert_non_null(worst);
    assert_true(worst->blocks >= 2 * h200->units);
    assert_int_equal(worst->limit, CG_LIMIT_MEMORY);
    near(worst->bytes, 4096.0 * 4096 * 4, 1e-3, "bytes");
    near(worst->s - h200->launch_s, worst->bytes / cg_device_bw(h200), 0.05, "seconds");
    for (int i = 0; i < a->rows.n; i++)
        if (&a->rows.v[i] != worst && a->rows.v[i].bytes > 1e6)
            fail_msg("%s moves %g bytes besides the reading stage", a->rows.v[i].name,
                     a->rows.v[i].bytes);
    assert_true(a->step_s < 0.1 * worst->bytes / (h200->bw / h200->units));
    cg_prediction_free(a);
    release(&c);
}

static const char tiny[] =
    "kiln-ir v1\n"
    "%0:f32[4] = input \"x\"\n"
    "%1:f32[4] = neg %0\n"
    "output \"y\" %1\n";

static void test_launch_bound(void **state)
{
    (void)state;
    Compiled c = compile(tiny, false);
    const CgDevice *h100 = dev("h100");
    CgPredictOpts plain = {0}, graph = {.cuda_graph = true};
    CgPrediction *a = cg_predict(c.p, c.q, h100, &plain), *b = cg_predict(c.p, c.q, h100, &graph);
    assert_int_equal(a->rows.v[0].limit, CG_LIMIT_LAUNCH);
    near(a->launch_s, h100->launch_s * a->launches, 1e-9, "launch overhead");
    near(b->launch_s, h100->graph_s * b->launches, 1e-9, "graph overhead");
    assert_true(b->step_s < a->step_s);
    cg_prediction_free(a);
    cg_prediction_free(b);
    release(&c);
}

static const char gemm[] =
    "kiln-ir v1\n"
    "%0:f32[4096,4096] = input \"a\"\n"
    "%1:f32[4096,4096] = input \"b\"\n"
    "%2:f32[4096,4096] = matmul %0, %1 {ta=0,tb=0}\n"
    "output \"c\" %2\n";

static void test_gemm_compute_bound(void **state)
{
    (void)state;
    Compiled f = compile(gemm, false), h = compile(gemm, true);
    const CgDevice *h200 = dev("h200");
    CgPredictOpts f32 = {0}, tf32 = {.tf32 = true}, bf16 = {.bf16 = true};
    CgPrediction *a = cg_predict(f.p, f.q, h200, &f32), *b = cg_predict(f.p, f.q, h200, &tf32),
                 *c = cg_predict(h.p, h.q, h200, &bf16);
    double flops = 2.0 * 4096 * 4096 * 4096;
    near(a->gemm_flops, flops, 1e-12, "GEMM FLOPs");
    const CgPredRow *g = NULL;
    for (int i = 0; i < a->rows.n; i++)
        if (strcmp(a->rows.v[i].name, "gemm") == 0)
            g = &a->rows.v[i];
    assert_non_null(g);
    assert_int_equal(g->limit, CG_LIMIT_COMPUTE);
    /* the prediction is cg_gemm_cost's at the precision's peak */
    double bytes = 3.0 * 4096 * 4096 * 4;
    CgGemmCost cf, ct;
    cg_gemm_cost(h200, 1, 4096, 4096, 4096, h200->f32, bytes, &cf);
    cg_gemm_cost(h200, 1, 4096, 4096, 4096, h200->tf32, bytes, &ct);
    near(g->s - h200->launch_s, cf.s, 1e-9, "f32 GEMM");
    near(b->gemm_s - h200->launch_s, ct.s, 1e-9, "TF32 GEMM");
    assert_int_equal(g->blocks, cf.ctas);
    assert_true(g->cls == CG_CLASS_GEMM_LARGE && cf.waves >= 4);
    assert_true(c->gemm_s < b->gemm_s && b->gemm_s < a->gemm_s);
    /* bf16 from f32 inputs: the two casts are launches of their own */
    int casts = 0;
    for (int i = 0; i < c->rows.n; i++)
        casts += strcmp(c->rows.v[i].name, "cast_f32_bf16") == 0;
    assert_int_equal(casts, 2);
    /* the report names the costliest launch and its limit */
    char *text = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&text, &n);
    cg_prediction_print(a, f.p, a->flops, 0, 10, m);
    fclose(m);
    if (!strstr(text, "predicted step on h200") || !strstr(text, "compute") ||
        !strstr(text, "MFU"))
        fail_msg("report:\n%s", text);
    free(text);
    cg_prediction_free(a);
    cg_prediction_free(b);
    cg_prediction_free(c);
    release(&f);
    release(&h);
}

/* Blocks per SM by hand (64K registers in units of 256 per warp, 228 KB
 * of shared memory on an H200), and ptxas' report read into the program:
 * the elementwise kernel at 255 registers per thread keeps one block of
 * 256 threads per SM, a quarter of the 1024 threads the model wants for
 * full bandwidth, so it is predicted 4x slower; at 32 registers nothing
 * changes. Names the program lacks are ignored. */
static void test_ptxas_occupancy(void **state)
{
    (void)state;
    const CgDevice *h200 = dev("h200");
    assert_int_equal(cg_cuda_blocks_per_unit(h200, 256, 0, 0), 8);
    assert_int_equal(cg_cuda_blocks_per_unit(h200, 256, 32, 0), 8);
    assert_int_equal(cg_cuda_blocks_per_unit(h200, 256, 64, 0), 4);
    assert_int_equal(cg_cuda_blocks_per_unit(h200, 256, 65, 0), 3); /* 72 per thread */
    assert_int_equal(cg_cuda_blocks_per_unit(h200, 256, 255, 0), 1);
    assert_int_equal(cg_cuda_blocks_per_unit(h200, 128, 16, 100 * 1024), 2);
    assert_int_equal(cg_cuda_blocks_per_unit(h200, 32, 16, 0), 32); /* block limit */
    Compiled c = compile(elementwise, false);
    assert_int_equal(c.q->fn.n, 1);
    CgPredictOpts o = {0};
    CgPrediction *a = cg_predict(c.p, c.q, h200, &o);
    const char *name = c.q->fn.v[0].name;
    char log[2048];
    snprintf(log, sizeof log,
             "ptxas info    : 0 bytes gmem\n"
             "ptxas info    : Compiling entry function 'other_l0' for 'sm_90'\n"
             "ptxas info    : Function properties for other_l0\n"
             "ptxas         .     0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
             "ptxas info    : Used 7 registers, used 0 barriers\n"
             "ptxas info    : Compiling entry function '%s' for 'sm_90'\n"
             "ptxas info    : Function properties for %s\n"
             "ptxas         .     0 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
             "ptxas info    : Used 255 registers, used 1 barriers, 128 bytes smem\n"
             "ptxas info    : Compile time = 1.0 ms\n",
             name, name);
    assert_int_equal(cg_cuda_ptxas(c.q, log), 1);
    assert_int_equal(c.q->ptxas_fns, 1);
    assert_int_equal(c.q->fn.v[0].regs, 255);
    assert_int_equal(c.q->fn.v[0].smem, 128);
    assert_int_equal(c.q->fn.v[0].spill, 16);
    CgPrediction *b = cg_predict(c.p, c.q, h200, &o);
    near(b->rows.v[0].s - h200->launch_s, 4 * (a->rows.v[0].s - h200->launch_s), 0.02,
         "255 registers");
    cg_prediction_free(b);
    c.q->fn.v[0].regs = 32;
    b = cg_predict(c.p, c.q, h200, &o);
    near(b->rows.v[0].s, a->rows.v[0].s, 1e-9, "32 registers");
    cg_prediction_free(b);
    cg_prediction_free(a);
    release(&c);
}

/* The CPU model, with figures given here (no measurement): a large
 * elementwise kernel is split over the threads, so two threads take half
 * the compute time of one; a GEMM's parts run in waves over the threads. */
static void test_cpu_model(void **state)
{
    (void)state;
    Compiled c = compile(elementwise, false);
    CgDevice one = {.name = "cpu", .title = "test", .units = 1, .f32 = 1e11, .gemm = 5e10,
                    .bw = 1e13, .bw1 = 1e13, .launch_s = 1e-6, .graph_s = 1e-6, .work = 1e9,
                    .gemm1 = {1e10, 2e10, 4e10, 5e10}};
    CgDevice two = one;
    two.units = 2;
    CgPredictOpts o = {0};
    CgPrediction *a = cg_predict(c.p, NULL, &one, &o), *b = cg_predict(c.p, NULL, &two, &o);
    assert_int_equal(a->rows.n, 1);
    assert_int_equal(a->rows.v[0].limit, CG_LIMIT_COMPUTE); /* 10 TB/s: never memory */
    near(b->rows.v[0].s - two.launch_s, (a->rows.v[0].s - one.launch_s) / 2, 1e-9, "2 threads");
    cg_prediction_free(a);
    cg_prediction_free(b);
    release(&c);
    Compiled g = compile(gemm, false);
    a = cg_predict(g.p, NULL, &one, &o);
    b = cg_predict(g.p, NULL, &two, &o);
    /* 4096^3 is split into 16 bands of CG_GEMM_MIN_BAND = 256 rows (not
     * the 64 its FLOPs alone would give): 2 x 256 x 4096 x 4096 each at
     * the 256-row rate, 16 waves on one thread, 8 on two */
    assert_int_equal(cg_gemm_parts(&g.p->steps.v[0].gemm), 16);
    double part = 2.0 * 256 * 4096 * 4096 / 4e10;
    near(a->gemm_s - one.launch_s, 16 * part, 1e-9, "GEMM, 1 thread");
    near(b->gemm_s - two.launch_s, 8 * part, 1e-9, "GEMM, 2 threads");
    cg_prediction_free(a);
    cg_prediction_free(b);
    release(&g);
}

/* cg_gemm_parts / cg_gemm_part: parts cover C once; bands are at least
 * CG_GEMM_MIN_BAND wide where the longer side holds two of them (each
 * band's OpenBLAS call packs the whole other operand: gpt small's
 * 2048x1024x256 products ran at 90 GFLOP/s on 2 threads in 64 bands of
 * 32 rows, 185 in 8 of 256); batches split by whole entries. */
static void test_gemm_parts(void **state)
{
    (void)state;
    struct { int64_t batch, M, N, K; int parts; } c[] = {
        {1, 4, 4, 4, 1},          /* under CG_MIN_GEMM_FLOPS */
        {1, 2048, 1024, 256, 8},  /* 1.07 GFLOP: 64 by FLOPs, 8 bands of 256 rows */
        {1, 256, 1024, 2048, 4},  /* columns: 4 bands of 256 */
        {1, 256, 768, 2048, 2},   /* 3 bands' worth: the power of two below */
        {1, 2048, 256, 256, 8},
        {1, 300, 200, 64, 2},     /* shorter than two bands: still 2 */
        {1, 20, 2048, 4096, 8},   /* rows of 20: bands of columns */
        {1, 16, 16, 1024, 1},     /* one 16-wide unit */
        {32, 256, 256, 64, 32},   /* one batch entry a part */
        {4, 256, 256, 64, 4},     /* 4 entries: 4 parts, whole entries */
        {2, 4096, 4096, 64, 16},  /* 2 entries, bands over both */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CgGemm m = {.batch = c[i].batch, .M = c[i].M, .N = c[i].N, .K = c[i].K};
        int n = cg_gemm_parts(&m);
        if (n != c[i].parts)
            fail_msg("case %zu (%lldx%lldx%lldx%lld): %d parts (expected %d)", i,
                     (long long)m.batch, (long long)m.M, (long long)m.N, (long long)m.K, n,
                     c[i].parts);
        int64_t covered = 0;
        for (int p = 0; p < n; p++) {
            int64_t b0, b1, m0, m1, n0, n1;
            cg_gemm_part(&m, n, p, &b0, &b1, &m0, &m1, &n0, &n1);
            covered += (b1 - b0) * (m1 - m0) * (n1 - n0);
            int64_t side = m.M >= m.N ? m.M : m.N, band = m.M >= m.N ? m1 - m0 : n1 - n0;
            if (n > 1 && b1 - b0 == m.batch && side >= 2 * CG_GEMM_MIN_BAND &&
                band < CG_GEMM_MIN_BAND)
                fail_msg("case %zu part %d: a band of %lld", i, p, (long long)band);
        }
        assert_int_equal(covered, m.batch * m.M * m.N);
    }
}

/* A gpt 124M attention (192 batch*heads, head size 64, bf16, causal) of
 * `kind` at T positions, printed so that fn carries its cost. */
static CgCudaFn attn_fn(CgCudaAttnKind kind, int64_t T)
{
    CgCudaAttn a = {.kind = kind, .causal = true, .scale = 0.125, .dt = DT_BF16, .bh = 192,
                    .tq = T, .tk = T, .d = 64, .dv = 64, .want_o = true, .want_lse = true,
                    .want_dk = true, .want_dv = true};
    CgCudaFn fn = {0};
    CgBuf b = {0};
    Diag d = {{0}};
    if (!cg_print_cuda_attn(&b, &a, "attn", &fn, &d))
        fail_msg("attention: %s", d.msg);
    free(b.s);
    return fn;
}

/* The attention kernels' re-reads (cg_attn_dram_bytes): 4 blocks per SM
 * of an H200 are 528 resident blocks, 16 query tiles a head at T = 1024,
 * so 34 heads in flight, whose k and v rows (256 KiB a head) fit in L2:
 * DRAM sees each row once. With less L2 than 34 heads' rows, or T so long
 * that the two heads in flight outgrow it, every visit is a DRAM read. */
static void test_attn_l2(void **state)
{
    (void)state;
    const CgDevice *h200 = dev("h200");
    CgCudaFn f = attn_fn(CG_CUDA_ATTN_FWD, 1024);
    assert_true(f.attn && f.attn_fwd && f.attn_tiles == 16 && f.blocks == 192 * 16);
    /* q and o (bf16), lse (f32), and k, v once: the unique bytes */
    double unique = 192.0 * (2 * 1024 * 64 * 2 + 4 * 1024 + 1024 * 128 * 2);
    near(cg_attn_dram_bytes(&f, h200, 4), unique, 1e-12, "forward, L2 keeps k and v");
    assert_true(f.bytes > 4 * unique); /* a key tile is visited 8.5 times on average */
    near(f.attn_head, 1024 * 128 * 2, 1e-12, "one head's k and v");
    /* the threshold: 34 heads x 256 KiB = 8.5 MiB */
    CgDevice small = *h200;
    small.l2 = 8.4 * (1 << 20);
    near(cg_attn_dram_bytes(&f, &small, 4), f.bytes, 1e-12, "L2 under 34 heads");
    small.l2 = 8.6 * (1 << 20);
    near(cg_attn_dram_bytes(&f, &small, 4), unique, 1e-12, "L2 over 34 heads");
    /* fewer blocks per SM, fewer heads in flight: 132 blocks, 10 heads, 2.5 MiB */
    small.l2 = 2.6 * (1 << 20);
    near(cg_attn_dram_bytes(&f, &small, 4), f.bytes, 1e-12, "4 blocks per SM");
    near(cg_attn_dram_bytes(&f, &small, 1), unique, 1e-12, "1 block per SM");
    /* T varied: 2 heads of 16 MiB fit in 50 MiB, 2 of 32 MiB do not */
    for (int kind = 0; kind < 3; kind++) {
        CgCudaAttnKind k = kind == 0 ? CG_CUDA_ATTN_FWD
                           : kind == 1 ? CG_CUDA_ATTN_DQ : CG_CUDA_ATTN_DKDV;
        CgCudaFn s = attn_fn(k, 65536), l = attn_fn(k, 131072);
        assert_true(s.attn_reread > 0.9 * s.bytes && l.attn_reread > 0.9 * l.bytes);
        near(cg_attn_dram_bytes(&s, h200, 4), s.bytes - s.attn_reread, 1e-12, "T = 65536");
        near(cg_attn_dram_bytes(&l, h200, 4), l.bytes, 1e-12, "T = 131072");
    }
    /* dk/dv re-reads q, dO (bf16) and lse, delta (f32) */
    CgCudaFn kv = attn_fn(CG_CUDA_ATTN_DKDV, 1024);
    assert_false(kv.attn_fwd);
    near(kv.attn_head, 1024 * (128 * 2 + 8), 1e-12, "one head's q, dO, lse, delta");
    near(cg_attn_dram_bytes(&kv, h200, 4), kv.bytes - kv.attn_reread, 1e-12, "dk/dv");
    /* non-attention functions keep their bytes */
    CgCudaFn plain = {.bytes = 123};
    near(cg_attn_dram_bytes(&plain, h200, 4), 123, 0, "not attention");
}

/* A bias or mask operand (the kernels' last param bx): each kernel reads
 * one element of it at every cell of the tile pairs it visits, at its
 * storage size (u8 mask 1, bf16 bias 2 bytes); L2 serves every read past
 * the first of each distinct cell (a [B, 1, T, T] mask over 12 heads: each
 * of the B slices once), and a head's share of those cells joins the
 * head's working set. Without the operand nothing changes. */
static void test_attn_bias_bytes(void **state)
{
    (void)state;
    const CgDevice *h200 = dev("h200");
    const int64_t T = 1024, Bn = 16, H = 12;
    for (int kind = 0; kind < 3; kind++)
        for (int bias = 0; bias < 2; bias++) {
            CgCudaAttn a = {.kind = (CgCudaAttnKind)kind, .causal = true, .scale = 0.125,
                            .dt = DT_BF16, .bh = Bn * H, .tq = T, .tk = T, .d = 64, .dv = 64,
                            .want_o = true, .want_lse = true, .want_dk = true, .want_dv = true};
            /* the plain layout of [B, H, T, 64] */
            a.lay = (IrAttnLayout){.nb = Bn * H, .nh = 1, .Tq = T, .Tk = T, .D = 64, .Dv = 64,
                                   .g = 1, .nhk = 1};
            a.lay.q = a.lay.k = a.lay.v = a.lay.o = a.lay.dq = a.lay.dk = a.lay.dv =
                (IrAttnStride){T * 64, 0, 64, 0};
            a.lay.st = (IrAttnStride){T, 0, 1, 0};
            CgCudaFn none = {0}, with = {0};
            CgBuf b = {0};
            Diag d = {{0}};
            assert_true(cg_print_cuda_attn(&b, &a, "plain", &none, &d));
            if (bias) { /* a bf16 bias [H, T, T] */
                a.lay.bias = IR_ATTN_BIAS, a.bdt = DT_BF16;
                a.lay.bdiv = 1, a.lay.bmod = H, a.lay.bbs = T * T, a.lay.bis = T, a.lay.bjs = 1;
            } else { /* a u8 mask [B, 1, T, T] */
                a.lay.bias = IR_ATTN_MASK, a.bdt = DT_U8;
                a.lay.bdiv = H, a.lay.bmod = Bn, a.lay.bbs = T * T, a.lay.bis = T, a.lay.bjs = 1;
            }
            assert_true(cg_print_cuda_attn(&b, &a, "masked", &with, &d));
            free(b.s);
            assert_int_equal(none.attn_nw, with.attn_nw);
            assert_int_equal(none.attn_bt, with.attn_bt);
            /* the cells of the visited tile pairs, per batch*head: the
             * forward and dq visit key tiles of bt up to a query tile's
             * last row, dk/dv query tiles of bt from a key tile's first */
            int br = 16 * none.attn_nw, bt = none.attn_bt;
            double cells = 0;
            if (kind != CG_CUDA_ATTN_DKDV)
                for (int64_t q0 = 0; q0 < T; q0 += br) {
                    int64_t kend = (q0 + br + bt - 1) / bt * bt;
                    cells += (double)br * (double)(kend < T ? kend : T);
                }
            else
                for (int64_t k0 = 0; k0 < T; k0 += br)
                    cells += (double)br * (double)(T - k0 / bt * bt);
            double es = bias ? 2 : 1, slices = bias ? H : Bn;
            near(with.bytes - none.bytes, cells * es * (double)(Bn * H), 1e-12,
                 "the bias's bytes at every visited cell");
            near(with.attn_head - none.attn_head, slices * (double)(T * T) * es / (Bn * H),
                 1e-12, "one head's share of the bias");
            near(with.attn_reread - none.attn_reread,
                 cells * es * (double)(Bn * H) - slices * (double)(T * T) * es, 1e-12,
                 "the bias's visits past the first of each cell");
            /* L2 holds the heads in flight: DRAM sees each distinct cell once */
            near(cg_attn_dram_bytes(&with, h200, 1) - cg_attn_dram_bytes(&none, h200, 1),
                 slices * (double)(T * T) * es, 1e-9, "the bias's DRAM bytes");
        }
}

/* A whole prediction reads the rule: a compiled f32 attention over 16
 * heads of T = 1024 (the heads' k and v rows, 8 MiB, fit in L2) is costed
 * on the unique bytes, not on the visits. */
static const char attention[] =
    "kiln-ir v1\n"
    "%0:f32[16,1024,64] = input \"q\"\n"
    "%1:f32[16,1024,64] = attention %0, %0, %0 {causal=1,scale=0.125}\n"
    "output \"o\" %1\n";

static void test_attn_l2_predicted(void **state)
{
    (void)state;
    const CgDevice *h200 = dev("h200");
    Compiled c = compile(attention, false);
    int at = -1;
    for (int i = 0; i < c.q->fn.n; i++)
        if (c.q->fn.v[i].attn)
            at = i;
    assert_true(at >= 0);
    const CgCudaFn *fn = &c.q->fn.v[at];
    CgPredictOpts o = {0};
    CgPrediction *r = cg_predict(c.p, c.q, h200, &o);
    int per_unit = cg_cuda_blocks_per_unit(h200, fn->threads, fn->regs, fn->smem);
    double dram = cg_attn_dram_bytes(fn, h200, per_unit);
    assert_true(dram < fn->bytes / 3);
    bool seen = false;
    for (int i = 0; i < r->rows.n; i++)
        if (strcmp(r->rows.v[i].name, fn->name) == 0) {
            near(r->rows.v[i].bytes, dram, 1e-12, "the attention row's bytes");
            seen = true;
        }
    assert_true(seen);
    cg_prediction_free(r);
    release(&c);
}

/* attention_dqkv on the GPU: its dq kernel launches nothing and its dk/dv
 * step runs the fused backward (cuda_attn_bwd.c), one function that takes
 * the partials scratch (its counters and dQ accumulator counted in the
 * program's scratch). Its FLOPs are the five products of every kept tile
 * pair, counted here from the tiles: 2 x (3 D + 2 Dv) per pair; its bytes
 * are the dk/dv kernel's plus dq once plus dQ's f32 read and write on
 * every visit of a query row but its first, of which L2 serves all but
 * one write and one read of each row when the heads in flight fit. The
 * prediction has one backward row for the op. */
static const char dqkv[] =
    "kiln-ir v1\n"
    "%q:f32[2,1024,2304] = input \"qkv\"\n"
    "%g:f32[2,1024,768] = input \"g\"\n"
    "%l:f32[2,1024,12,1] = input \"l\"\n"
    "%d:f32[2,1024,2304] = attention_dqkv %q, %q, %q, %g, %l, %l "
    "{causal=1,scale=0.125,heads=12,hd=64,qoff=0,koff=768,voff=1536}\n"
    "output \"d\" %d\n";

static void test_attn_bwd_fused(void **state)
{
    (void)state;
    const CgDevice *h200 = dev("h200");
    Compiled c = compile(dqkv, false);
    int steps = 0, fns = 0, at = -1;
    for (int s = 0; s < c.p->steps.n; s++)
        if (c.p->steps.v[s].kind == CG_STEP_KERNEL &&
            c.p->kernels.v[c.p->steps.v[s].kernel]->attn.kind != CG_ATTN_NONE) {
            steps++;
            fns += c.q->step_nfn[s];
            if (c.q->step_nfn[s] == 1)
                at = c.q->step_fn[s];
        }
    assert_int_equal(steps, 2); /* the plan's dq and dk/dv kernels */
    assert_int_equal(fns, 1);   /* one launch */
    assert_true(at >= 0);
    const CgCudaFn *fn = &c.q->fn.v[at];
    CgCudaAttn a = {.kind = CG_CUDA_ATTN_BWD, .causal = true, .scale = 0.125, .dt = DT_F32,
                    .bh = 24, .tq = 1024, .tk = 1024, .d = 64, .dv = 64, .one_dkv = true};
    int nw, bt;
    assert_true(cg_cuda_attn_tiles(&a, &nw, &bt));
    assert_true(fn->attn && !fn->attn_fwd && fn->part);
    assert_int_equal(fn->part_bytes, cg_cuda_attn_bwd_scratch(&a, bt));
    assert_int_equal(fn->part_bytes,
                     CG_CUDA_SCRATCH_ZERO + 24 * ((1024 + bt - 1) / bt) * bt * 64 * 4);
    assert_true(c.q->part_bytes >= fn->part_bytes);
    assert_int_equal(fn->blocks, 24 * (1024 / (16 * nw)));
    /* kept pairs and query-row visits, key tile by key tile */
    double pairs = 0, visits = 0;
    for (int kt = 0; kt * 16 * nw < 1024; kt++) {
        int q0 = kt * 16 * nw / bt * bt;
        pairs += 16.0 * nw * (1024 - q0);
        visits += 1024 - q0;
    }
    near(fn->flops, 24 * 2 * pairs * (3 * 64 + 2 * 64), 1e-12, "five products a pair");
    double es = 4, dkdv = 24 * (1024 * 128 * es + 1024 * 128 * es + visits * (128 * es + 8));
    double bytes = dkdv + 24 * (1024 * 64 * es + 8.0 * 64 * (visits - 1024));
    near(fn->bytes, bytes, 1e-12, "the dk/dv bytes, dq, the accumulator's traffic");
    /* L2: q, dO, lse, delta past their first visit, and the accumulator's
     * visits past one write and one read of each row; a head's working set
     * holds its accumulator */
    near(fn->attn_reread, 24 * ((visits - 1024) * (128 * es + 8) + 8.0 * 64 * (visits - 2048)),
         1e-12, "the re-reads L2 serves");
    near(fn->attn_head, 1024 * (128 * es + 8) + 1024 * 64 * 4.0, 1e-12, "one head's set");
    CgPredictOpts o = {0};
    CgPrediction *r = cg_predict(c.p, c.q, h200, &o);
    int rows = 0;
    for (int i = 0; i < r->rows.n; i++)
        rows += strstr(r->rows.v[i].name, "attention_dqkv") != NULL;
    assert_int_equal(rows, 1);
    cg_prediction_free(r);
    release(&c);
}

/* TFLOP/s of a bf16 GEMM on dev: what cg_gemm_cost predicts */
static double gemm_rate(const CgDevice *d, int64_t batch, int64_t M, int64_t N, int64_t K,
                        double bytes, CgGemmCost *c)
{
    cg_gemm_cost(d, batch, M, N, K, d->bf16, bytes, c);
    return 2.0 * batch * M * N * K / c->s;
}

/* The curve's top is the measured 8192^3 bf16 matmul: 769-798 TFLOP/s on
 * this workplace's H100 and H200; the A100's and B200's are their
 * published MAMF figures (271.2 and 1745 TFLOP/s, docs/cost.md). */
static void test_gemm_calibrated(void **state)
{
    (void)state;
    CgGemmCost c;
    double bytes = 3.0 * 8192 * 8192 * 2;
    const char *names[] = {"h100", "h200"};
    for (int i = 0; i < 2; i++) {
        double r = gemm_rate(dev(names[i]), 1, 8192, 8192, 8192, bytes, &c);
        if (r < 769e12 || r > 798e12)
            fail_msg("%s 8192^3: %.1f TFLOP/s (measured 769-798)", names[i], r / 1e12);
        assert_int_equal(c.split, 1);
    }
    near(gemm_rate(dev("a100"), 1, 8192, 8192, 8192, bytes, &c), 271.2e12, 0.01, "a100");
    near(gemm_rate(dev("b200"), 1, 8192, 8192, 8192, bytes, &c), 1745e12, 0.01, "b200");
}

/* Wave quantisation on 132 SMs, compute alone (bytes 0): 132 GEMMs of
 * 128 x 128 x 8192 fill one wave of 128 x 128 tiles; 133 need a second
 * wave (or 3 waves of half tiles, the best cuBLASLt has: 1.8 waves'
 * worth), so they cost about what 264 do (2 waves) and far more than 132;
 * a 1% larger problem is not 1% slower. */
static void test_gemm_waves(void **state)
{
    (void)state;
    const CgDevice *h100 = dev("h100");
    CgGemmCost a, b, c;
    gemm_rate(h100, 132, 128, 128, 8192, 0, &a);
    gemm_rate(h100, 133, 128, 128, 8192, 0, &b);
    gemm_rate(h100, 264, 128, 128, 8192, 0, &c);
    assert_int_equal(a.waves, 1);
    assert_int_equal(a.ctas, 132);
    near(c.s, 2 * a.s, 0.01, "264 tiles: two waves");
    if (!(b.s > 1.6 * a.s && b.s > 0.85 * c.s))
        fail_msg("133 tiles: %g s against %g for 132 and %g for 264", b.s, a.s, c.s);
}

/* Split-K where cuBLASLt would use it: a 256 x 256 output with K = 65536
 * has at most 16 tiles, a few of 132 SMs; split 8 ways or more it runs at
 * over 0.3 of the calibrated peak (unsplit it could not pass 16/132). A
 * large square never splits. K depth: K = 64 reaches under 0.4 of what
 * K = 4096 does (prologue and epilogue per tile). */
static void test_gemm_splitk_depth(void **state)
{
    (void)state;
    const CgDevice *h100 = dev("h100");
    CgGemmCost c;
    double r = gemm_rate(h100, 1, 256, 256, 65536, 0, &c);
    if (c.split < 8 || r < 0.3 * h100->gemm_top * h100->bf16)
        fail_msg("256x256x65536: split %d, %.1f TFLOP/s", c.split, r / 1e12);
    gemm_rate(h100, 1, 4096, 4096, 4096, 0, &c);
    assert_int_equal(c.split, 1);
    double shallow = gemm_rate(h100, 1, 16384, 768, 64, 0, &c);
    double deep = gemm_rate(h100, 1, 16384, 768, 4096, 0, &c);
    if (!(shallow < 0.4 * deep))
        fail_msg("K = 64 at %.1f TFLOP/s, K = 4096 at %.1f", shallow / 1e12, deep / 1e12);
    /* memory-bound: the bytes at the achievable bandwidth */
    cg_gemm_cost(h100, 1, 16384, 768, 64, h100->bf16, 1e9, &c);
    assert_true(c.t_mem > c.t_comp);
    near(c.t_mem, 1e9 / 3.0e12, 1e-9, "memory term");
}

/* The fused attention forward in bf16 (gpt 124M's heads: T = 1024, head
 * size 64), costed from its instructions: under FlashAttention-2's
 * measured 0.20 of the H100 (which adds ldmatrix and cp.async to the same
 * mma.sync), and bound by its shared-memory loads, not the tensor cores:
 * a faster mma.sync changes nothing, a much slower one binds. Fewer
 * resident blocks (a register-bound kernel) hide less of the staging.
 * (q and o are temporaries: inputs and outputs keep f32 storage.) */
static const char attention_bf16[] =
    "kiln-ir v1\n"
    "%0:f32[192,1024,64] = input \"x\"\n"
    "%1:f32[192,1024,64] = neg %0\n"
    "%2:f32[192,1024,64] = attention %1, %1, %1 {causal=1,scale=0.125}\n"
    "%3:f32[192,1024,64] = neg %2\n"
    "output \"o\" %3\n";

static double attn_row_s(const Compiled *c, const CgDevice *d, const CgCudaFn *fn,
                         double *flops)
{
    CgPredictOpts o = {.bf16 = true};
    CgPrediction *r = cg_predict(c->p, c->q, d, &o);
    double s = -1;
    for (int i = 0; i < r->rows.n; i++)
        if (strcmp(r->rows.v[i].name, fn->name) == 0) {
            s = r->rows.v[i].s - d->launch_s;
            *flops = r->rows.v[i].flops;
            assert_true(r->rows.v[i].cls == CG_CLASS_ATTN);
        }
    cg_prediction_free(r);
    if (s < 0)
        fail_msg("no row for %s", fn->name);
    return s;
}

static void test_attn_design(void **state)
{
    (void)state;
    const CgDevice *h100 = dev("h100");
    Compiled c = compile(attention_bf16, true);
    CgCudaFn *fn = NULL;
    for (int i = 0; i < c.q->fn.n; i++)
        if (c.q->fn.v[i].attn)
            fn = &c.q->fn.v[i];
    assert_non_null(fn);
    assert_true(fn->mma && fn->attn_kind == CG_CUDA_ATTN_FWD && fn->attn_nw == 4 &&
                fn->attn_bt == 64);
    fn->regs = 128; /* 4 blocks of 128 threads per SM */
    double flops, s = attn_row_s(&c, h100, fn, &flops);
    double eff = flops / s / h100->bf16;
    if (!(eff > 0.05 && eff < 0.20))
        fail_msg("forward at %.3f of the peak (expected under FlashAttention-2's 0.20)", eff);
    CgDevice fast = *h100, slow = *h100;
    fast.mma_sync = 1;
    slow.mma_sync = 0.05;
    near(attn_row_s(&c, &fast, fn, &flops), s, 1e-9, "a faster mma.sync");
    assert_true(attn_row_s(&c, &slow, fn, &flops) > 1.5 * s);
    fn->regs = 255; /* 1 block per SM */
    assert_true(attn_row_s(&c, h100, fn, &flops) > 1.5 * s);
    release(&c);
}

/* bf16 copies of weights (codegen/cuda_cast.c): w is read by two GEMMs of
 * the step, so it gets a slot and only the first casts it; the prediction
 * has one cast row for w, not two. An activation (x, f32 here because it
 * is an input read once) keeps its cast into the per-GEMM scratch. */
static const char two_gemms[] =
    "kiln-ir v1\n"
    "%0:f32[256,128] = param \"w\"\n"
    "%1:f32[64,256] = input \"x\"\n"
    "%2:f32[64,128] = matmul %1, %0 {ta=0,tb=0}\n"
    "%3:f32[64,256] = matmul %2, %0 {ta=0,tb=1}\n"
    "output \"y\" %3\n";

static void test_weight_casts(void **state)
{
    (void)state;
    Compiled c = compile(two_gemms, true);
    int g[2], n = 0;
    for (int s = 0; s < c.p->steps.n; s++)
        if (c.p->steps.v[s].kind == CG_STEP_GEMM && n < 2)
            g[n++] = s;
    assert_int_equal(n, 2);
    const CgGemm *m0 = &c.p->steps.v[g[0]].gemm, *m1 = &c.p->steps.v[g[1]].gemm;
    assert_int_equal(m0->b, 0);
    assert_int_equal(m1->b, 0);
    /* w: one slot, cast by the first GEMM, read by the second */
    assert_int_equal(c.q->cast_bytes, 256 * 128 * 2);
    assert_true(c.q->cast_off[2 * g[0] + 1] == 0 && c.q->cast_off[2 * g[1] + 1] == 0);
    /* w is cast once, by a group due before the first GEMM */
    assert_int_equal(c.q->ncast_groups, 1);
    assert_int_equal(c.q->cast_group[g[0]], 0);
    assert_int_equal(c.q->cast_group[g[1]], -1);
    assert_int_equal(c.q->cast_first[1], 1);
    assert_int_equal(c.q->cast_t[0], 0);
    /* x is read by one GEMM: no slot, cast before it */
    assert_true(c.q->cast_off[2 * g[0]] == -1);
    CgPredictOpts o = {.bf16 = true};
    CgPrediction *r = cg_predict(c.p, c.q, dev("h200"), &o);
    int casts = 0, multi = 0;
    for (int i = 0; i < r->rows.n; i++) {
        casts += strcmp(r->rows.v[i].name, "cast_f32_bf16") == 0;
        multi += strcmp(r->rows.v[i].name, "cast_f32_bf16_multi") == 0;
    }
    assert_int_equal(casts, 1); /* x */
    assert_int_equal(multi, 1); /* w, not again */
    cg_prediction_free(r);
    release(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_memory_bound),
        cmocka_unit_test(test_update_in_place),
        cmocka_unit_test(test_full_reduction_split),
        cmocka_unit_test(test_launch_bound),
        cmocka_unit_test(test_gemm_compute_bound),
        cmocka_unit_test(test_cpu_model),
        cmocka_unit_test(test_gemm_parts),
        cmocka_unit_test(test_ptxas_occupancy),
        cmocka_unit_test(test_attn_l2),
        cmocka_unit_test(test_attn_bias_bytes),
        cmocka_unit_test(test_attn_l2_predicted),
        cmocka_unit_test(test_attn_bwd_fused),
        cmocka_unit_test(test_weight_casts),
        cmocka_unit_test(test_gemm_calibrated),
        cmocka_unit_test(test_gemm_waves),
        cmocka_unit_test(test_gemm_splitk_depth),
        cmocka_unit_test(test_attn_design),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
