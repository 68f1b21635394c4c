/* predict.c - a cost model of a compiled step on a named device: the time
 * of every launch, the step, and what limits each launch. docs/cost.md
 * gives the equations; in short:
 *
 *   kernel (one CUDA function, or one CPU kernel step):
 *     t = max(flops / (peak_f32 * fill), bytes / (bw * bw_eff * fill)) + launch
 *     fill = min(1, blocks / units), then / wave efficiency
 *   GEMM (cg_gemm_cost): the least time over cuBLASLt's tiles and K
 *     splits of waves x tile time (tile rate by size and K depth, the
 *     curve's top calibrated to the measured 8192^3), blended with the
 *     bytes at the achievable bandwidth, + launch
 *     peak: bf16 when an operand is bf16 (or precision bf16), TF32 with tf32,
 *     else f32
 *   copy: 2 bytes / (bw * bw_eff) + launch
 *   fused attention (cuda_attn.c): as a kernel, with its own FLOPs (the
 *     tile pairs it visits) and bytes (tiles re-read per visit, or once
 *     per head when the heads in flight keep them in L2:
 *     cg_attn_dram_bytes), its compute term from the instructions its
 *     kernels issue per tile pair against the SM's pipes (attn_seconds)
 *
 * bytes: each buffer a launch reads or writes, once (twice when it reads
 * and writes it: an update in place), at its storage dtype
 * (a fused kernel's intermediates stay in registers); a buffer read only at
 * one index per outer iteration (a row's target logit) costs one 32-byte
 * sector per iteration when that is less, and one read in several passes
 * over rows too long for L2 to keep (the resident blocks' rows) costs each
 * pass (param_bytes); flops: the IR's counts
 * of the step's ops. launch: the device's per-launch overhead, the smaller
 * per-node cost with a CUDA graph. Occupancy (blocks resident per unit):
 * cg_cuda_blocks_per_unit, from ptxas' registers and shared memory where
 * the program carries them (cg_cuda_ptxas), else from the block size alone
 * (optimistic for register-bound kernels). Collectives are not costed (one device).
 *
 * A split reduction whose last block combines (CgCudaFn.ticket) and a
 * horizontal multi-tensor function (CgCudaFn.nloops, the AdamW update) are
 * one CUDA function each, so one launch each.
 *
 * On the CPU a kernel step is one "launch": its parts run on `units`
 * threads when the kernel is parallel (one otherwise), a GEMM on all of them
 * at the device's measured GEMM rate. */
#include "cg_cuda.h"
#include "codegen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Datasheet figures (dense, SXM parts) are leads, not measurements: see
 * docs/cost.md for the sources. TF32/bf16 are tensor-core peaks; f32 is
 * the CUDA cores' FMA rate, which elementwise kernels and f32 GEMMs
 * without TF32 use. Launch overhead: the gap between two dependent kernel
 * launches on one stream (a few microseconds), and about 1 us per node of
 * a replayed CUDA graph. The last four figures (bw_eff, gemm_top, clock,
 * mma_sync) are the cost model's: measured on this workplace's H100 and
 * H200 (bw_eff: device-to-device copies, 3.0 and 4.3 TB/s; gemm_top: a
 * bf16 8192^3 matmul, 769-798 TFLOP/s on both), published measurements
 * for the A100 and B200 (gemm_top: the MAMF table of stas00/ml-engineering,
 * 271.2 of 312 and 1745 of 2250 TFLOP/s), and guesses (docs/cost.md,
 * Devices, says which). */
const CgDevice cg_devices[] = {
    {"a100", "NVIDIA A100 SXM4 80GB", true, 108, 312e12, 156e12, 19.5e12, 0, 2.039e12,
     40.0 * (1 << 20), 4e-6, 1e-6, 2048, 32, 0, 0, {0}, 80e9, 300e9, 25e9, 164 * 1024, "sm_80",
     0.90, 0.869, 1.41e9, 1.0},
    {"h100", "NVIDIA H100 SXM5 80GB", true, 132, 989.4e12, 494.7e12, 66.9e12, 0, 3.35e12,
     50.0 * (1 << 20), 4e-6, 1e-6, 2048, 32, 0, 0, {0}, 80e9, 450e9, 50e9, 228 * 1024, "sm_90",
     3.0 / 3.35, 0.792, 1.83e9, 0.62},
    {"h200", "NVIDIA H200 SXM 141GB", true, 132, 989.4e12, 494.7e12, 66.9e12, 0, 4.8e12,
     50.0 * (1 << 20), 4e-6, 1e-6, 2048, 32, 0, 0, {0}, 141e9, 450e9, 50e9, 228 * 1024, "sm_90",
     4.3 / 4.8, 0.792, 1.83e9, 0.62},
    {"b200", "NVIDIA B200 (HGX, 1000 W)", true, 148, 2250e12, 1100e12, 75e12, 0, 8.0e12,
     126.0 * (1 << 20), 4e-6, 1e-6, 2048, 32, 0, 0, {0}, 192e9, 900e9, 50e9, 228 * 1024, "sm_100",
     0.90, 0.776, 1.856e9, 0.31},
};
const int cg_ndevices = (int)(sizeof cg_devices / sizeof cg_devices[0]);

const CgDevice *cg_device_find(const char *name)
{
    for (int i = 0; i < cg_ndevices; i++)
        if (strcmp(cg_devices[i].name, name) == 0)
            return &cg_devices[i];
    return NULL;
}

double cg_device_bw(const CgDevice *dev)
{
    return dev->bw * (dev->bw_eff > 0 ? dev->bw_eff : 1);
}

const char *cg_class_name(CgClass c)
{
    static const char *names[CG_CLASS__COUNT] = {
        "gemm.large", "gemm.waves", "gemm.splitk", "gemm.memory",
        "attention",  "memory",     "compute",     "launch"};
    return c >= 0 && c < CG_CLASS__COUNT ? names[c] : "?";
}

/* ---- GEMMs by shape (docs/cost.md, GEMM) ----------------------------------
 * The output tiles cuBLASLt's kernels use, each with its rate relative to
 * the largest (a smaller tile loads more operand bytes per product and
 * keeps fewer MMAs in flight). Guesses: no source gives these per tile. */
static const struct {
    int tm, tn;
    double rate;
} gemm_tiles[] = {
    {128, 256, 1.00}, {256, 128, 1.00}, {128, 128, 0.90},
    {128, 64, 0.75},  {64, 128, 0.75},  {64, 64, 0.55},
};
/* A tile's prologue (filling the copy pipeline) and epilogue (writing C)
 * cost about GEMM_K0 columns of K: a tile of depth k runs at
 * k / (k + GEMM_K0) of its rate (a guess). Split-K cuts K into at most
 * GEMM_MAX_SPLIT parts of at least GEMM_MIN_SPLIT_K each, and only when
 * the unsplit grid is under one wave (what cuBLASLt's heuristic does for
 * small M x N and long K); its partials are f32, written and read once. */
enum { GEMM_K0 = 128, GEMM_MAX_SPLIT = 16, GEMM_MIN_SPLIT_K = 256 };
/* Compute and memory terms combine as (t_c^4 + t_m^4)^(1/4): a GEMM near
 * its ridge point overlaps the two imperfectly (at most 19% over the max;
 * a guess). */
static double roof(double a, double b)
{
    double m = a > b ? a : b;
    if (m <= 0)
        return 0;
    double x = a / m, y = b / m;
    return m * pow(x * x * x * x + y * y * y * y, 0.25);
}

/* The cost at rate `top` x peak for the best tile: c filled. */
static void gemm_cost_at(const CgDevice *dev, int64_t batch, int64_t M, int64_t N, int64_t K,
                         double peak, double bytes, double top, CgGemmCost *c)
{
    double per_sm = peak / dev->units, bw = cg_device_bw(dev);
    bool found = false;
    for (size_t i = 0; i < sizeof gemm_tiles / sizeof gemm_tiles[0]; i++) {
        int64_t tm = gemm_tiles[i].tm, tn = gemm_tiles[i].tn;
        int64_t tiles = batch * ((M + tm - 1) / tm) * ((N + tn - 1) / tn);
        int maxs = tiles < dev->units ? GEMM_MAX_SPLIT : 1;
        for (int sp = 1; sp <= maxs; sp++) {
            if (sp > 1 && (K / sp < GEMM_MIN_SPLIT_K || tiles * (sp - 1) >= dev->units))
                break;
            double k = ceil((double)K / sp);
            int64_t ctas = tiles * sp;
            int64_t waves = (ctas + dev->units - 1) / dev->units;
            double tile_s = 2.0 * (double)(tm * tn) * k /
                            (per_sm * top * gemm_tiles[i].rate * (k / (k + GEMM_K0)));
            double red = sp > 1 ? 8.0 * sp * (double)(batch * M * N) / bw : 0;
            double t_comp = (double)waves * tile_s + red;
            double t_mem = (bytes + (sp > 1 ? 8.0 * sp * (double)(batch * M * N) : 0)) / bw;
            double t = roof(t_comp, t_mem);
            if (!found || t < c->s) {
                *c = (CgGemmCost){(int)tm, (int)tn, sp, ctas, waves, t_comp, t_mem, t};
                found = true;
            }
        }
    }
}

void cg_gemm_cost(const CgDevice *dev, int64_t batch, int64_t M, int64_t N, int64_t K,
                  double peak, double bytes, CgGemmCost *c)
{
    /* normalise the curve: 8192^3 in bf16 (A, B, C: 3 x 128 MiB) runs at
     * gemm_top of the bf16 peak, as measured */
    const double n = 8192;
    CgGemmCost ref;
    gemm_cost_at(dev, 1, 8192, 8192, 8192, dev->bf16, 3 * n * n * 2, 1, &ref);
    double top = dev->gemm_top > 0 ? dev->gemm_top : 0.8;
    double raw = 2 * n * n * n / ref.s / dev->bf16; /* the curve's share at top 1 */
    gemm_cost_at(dev, batch, M, N, K, peak, bytes, top / raw, c);
}

/* ---- kiln's attention kernels (docs/cost.md, Attention) -------------------
 * Costed from what the kernels of cuda_attn.c issue for each kept tile
 * pair: mma.sync (bf16) or FFMA (f32) products whose fragments come from
 * shared memory one 32-bit (k-contiguous) or two 16-bit (k-strided) loads
 * at a time (no ldmatrix), the other operand's tile staged element by
 * element through registers into shared memory (no cp.async: every tile
 * waits for its loads), and the softmax arithmetic per score. The rates
 * below are guesses (docs/cost.md says so). */
/* per SM per clock: load/store-unit warp instructions (32 lanes: shared
 * memory's 128 bytes a clock), issue slots (4 schedulers), MUFU warp
 * instructions (16 lanes), FFMA warp instructions (128 lanes) */
static const double ATTN_LSU_RATE = 1, ATTN_ISSUE = 4, ATTN_MUFU_RATE = 0.5, ATTN_FMA_RATE = 4;
/* a scheduler keeps its pipes busy with ATTN_READY_WARPS resident warps or
 * more, in proportion below. Staging a tile (no cp.async): each thread's
 * loads go out ATTN_LOADS_IN_FLIGHT at a time (the unrolled copy loop),
 * each batch waits one L2 round trip (ATTN_L2_LATENCY clocks; the tiles
 * are mostly L2 hits), then two barriers; only the other resident blocks
 * hide that wait. */
static const double ATTN_READY_WARPS = 4, ATTN_LOADS_IN_FLIGHT = 4, ATTN_L2_LATENCY = 300,
                    ATTN_BARRIERS = 100;
/* instructions per score besides the products: scale, mask, max, exp,
 * sum, rounding (forward); P, dP, dS (backward) */
static const double ATTN_ALU_FWD = 8, ATTN_ALU_BWD = 12;

typedef struct {
    double mma, lsu, alu, mufu, fma; /* warp instructions per tile pair of a block */
} AttnWork;

/* One warp's product 16 x n x k (n, k padded to 16), times `warps`: A
 * from shared memory or registers (P, dS), B k-contiguous in shared
 * memory (2 loads a fragment) or k-strided (4 loads and 2 packs). */
static void attn_product(AttnWork *w, bool mma, int warps, int n, int k, bool a_regs,
                         bool b_strided)
{
    n = (int)cg_pad16(n);
    k = (int)cg_pad16(k);
    if (mma) {
        double m = (double)(n / 8) * (k / 16);
        w->mma += warps * m;
        w->lsu += warps * ((a_regs ? 0 : 4.0 * (k / 16)) + m * (b_strided ? 4 : 2));
        w->alu += warps * ((a_regs ? 4.0 * (k / 16) : 0) + (b_strided ? 2 * m : 0));
    } else { /* each lane: 4 FMAs an 8-column tile and k; A 2 loads (or a
              * quad shuffle) a k, B 2 loads an 8-column tile and k */
        w->fma += warps * (double)n * k / 2;
        w->lsu += warps * ((a_regs ? 1.0 : 2.0) * k + (double)n * k / 4);
    }
}

/* Seconds fused attention function fn takes for its products at `fill` of
 * the device with per_unit blocks resident per SM; *eff: the share of the
 * peak that is. */
static double attn_seconds(const CgCudaFn *fn, const CgDevice *dev, int per_unit, double fill,
                           double *eff)
{
    int nw = fn->attn_nw > 0 ? fn->attn_nw : 4, bt = fn->attn_bt > 0 ? fn->attn_bt : 64;
    int D = fn->attn_d > 0 ? fn->attn_d : 64, DV = fn->attn_dv > 0 ? fn->attn_dv : D;
    bool mma = fn->mma, fwd = fn->attn_kind == CG_CUDA_ATTN_FWD;
    AttnWork w = {0};
    double rows = 16.0 * nw * bt, per_pair = 0, staged = 0; /* FLOPs, elements */
    switch (fn->attn_kind) {
    case CG_CUDA_ATTN_FWD:
        attn_product(&w, mma, nw, bt, D, false, false); /* S = Q K^T */
        per_pair = D;
        if (fn->attn_o) {
            attn_product(&w, mma, nw, DV, bt, true, true); /* O += P V */
            per_pair += DV;
        }
        staged = (double)bt * (D + (fn->attn_o ? DV : 0));
        break;
    case CG_CUDA_ATTN_DQ:
        attn_product(&w, mma, nw, bt, D, false, false);  /* S */
        attn_product(&w, mma, nw, bt, DV, false, false); /* dP = dO V^T */
        attn_product(&w, mma, nw, D, bt, true, true);    /* dQ += dS K */
        per_pair = 2.0 * D + DV;
        staged = (double)bt * (D + DV);
        break;
    default: /* DKDV, BWD: a warp's 16 keys against bt queries */
        attn_product(&w, mma, nw, bt, D, false, false); /* S^T = K Q^T */
        attn_product(&w, mma, nw, DV, bt, true, true);  /* dV += P^T dO */
        per_pair = (double)D + DV;
        if (fn->attn_dk) {
            attn_product(&w, mma, nw, bt, DV, false, false); /* dP^T = V dO^T */
            attn_product(&w, mma, nw, D, bt, true, true);    /* dK += dS^T Q */
            per_pair += (double)D + DV;
        }
        staged = (double)bt * (D + DV) + 2.0 * bt * (mma ? 2 : 1); /* q, dO; lse, delta */
        if (fn->attn_kind == CG_CUDA_ATTN_BWD) { /* dS through shared memory, dQ's share */
            int qw = bt / 16 > 0 ? bt / 16 : 1;
            w.lsu += rows / 32;
            attn_product(&w, mma, qw, D, 16 * nw, false, true);
            w.lsu += 2.0 * bt * cg_pad16(D) / 32; /* the f32 accumulator, read and written */
            per_pair += D;
        }
        break;
    }
    /* staging: one load and one store per element a thread, index math */
    w.lsu += 2 * staged / 32;
    w.alu += 6 * staged / 32;
    w.alu += rows / 32 * (fwd ? ATTN_ALU_FWD : ATTN_ALU_BWD);
    w.mufu += rows / 32;
    double mma_rate = dev->bf16 * (dev->mma_sync > 0 ? dev->mma_sync : 1) /
                      (dev->units * dev->clock * 4096.0); /* m16n8k16 a clock */
    double c = w.lsu / ATTN_LSU_RATE;
    double terms[4] = {w.mma / mma_rate, w.mufu / ATTN_MUFU_RATE, w.fma / ATTN_FMA_RATE,
                       (w.mma + w.lsu + w.alu + w.mufu + w.fma) / ATTN_ISSUE};
    for (int i = 0; i < 4; i++)
        c = terms[i] > c ? terms[i] : c;
    double ready = (double)per_unit * nw / 4 / ATTN_READY_WARPS;
    c /= ready < 1 ? ready : 1;
    double wait = ceil(staged / (32.0 * nw) / ATTN_LOADS_IN_FLIGHT) * ATTN_L2_LATENCY +
                  ATTN_BARRIERS;
    double hidden = (wait + c) / (per_unit > 0 ? per_unit : 1);
    c = hidden > c ? hidden : c;
    double pairs = fn->flops / (2.0 * rows * per_pair); /* block tile pairs */
    double t = pairs * c / ((double)dev->units * dev->clock * fill);
    double peak = mma ? dev->bf16 : dev->f32;
    *eff = t > 0 ? fn->flops / t / peak : 0;
    return t;
}

const char *cg_limit_name(CgLimit l)
{
    switch (l) {
    case CG_LIMIT_MEMORY: return "memory";
    case CG_LIMIT_COMPUTE: return "compute";
    case CG_LIMIT_BLOCKS: return "blocks";
    case CG_LIMIT_LAUNCH: return "launch";
    }
    return "?";
}

static double tensor_bytes(const Graph *g, int t, const DType *storage)
{
    DType dt = storage ? storage[t] : g->t.v[t].s.dtype;
    return (double)shape_numel(&g->t.v[t].s) * (double)dtype_size(dt);
}

/* Fraction of the device a grid of `blocks` blocks keeps busy, with
 * per_unit of them resident per unit (cg_cuda_blocks_per_unit): below one
 * block per unit the rest idle; past the resident limit the last wave runs
 * partly empty. */
static double grid_efficiency(const CgDevice *dev, int64_t blocks, int per_unit)
{
    if (blocks <= 0)
        return 1;
    if (blocks < dev->units)
        return (double)blocks / dev->units;
    double resident = (double)dev->units * per_unit;
    double waves = ceil((double)blocks / resident);
    /* a partial last wave costs as much as a full one only when a block
     * needs the whole unit; with several blocks per unit it is about the
     * share of units it occupies */
    double last = (double)blocks - (waves - 1) * resident;
    double last_units = ceil(last / per_unit);
    return (waves - 1 + last_units / dev->units) > 0
               ? (double)blocks / resident / (waves - 1 + last_units / dev->units)
               : 1;
}

/* The share of the bandwidth an SM reaches with per_unit blocks of
 * `threads` resident: full from OCC_THREADS resident threads, in
 * proportion below (fewer loads in flight hide less of the memory
 * latency; docs/cost.md, Occupancy). */
enum { OCC_THREADS = 1024 };
static double latency_share(int threads, int per_unit)
{
    double r = (double)threads * per_unit / OCC_THREADS;
    return r < 1 ? r : 1;
}

static void add_row(CgPrediction *r, int step, const char *name, double flops, double bytes,
                    double t_comp, double t_mem, double launch, int64_t blocks, int threads,
                    bool few_blocks, int cls)
{
    double body = t_comp > t_mem ? t_comp : t_mem;
    CgLimit lim = launch > body            ? CG_LIMIT_LAUNCH
                  : few_blocks             ? CG_LIMIT_BLOCKS
                  : t_comp > t_mem         ? CG_LIMIT_COMPUTE
                                           : CG_LIMIT_MEMORY;
    /* a kernel's class: memory or compute by its larger term, launch when
     * the overhead exceeds both (GEMMs and attention keep theirs) */
    if (cls < 0)
        cls = lim == CG_LIMIT_LAUNCH ? CG_CLASS_LAUNCH
              : t_comp > t_mem      ? CG_CLASS_COMPUTE
                                    : CG_CLASS_MEMORY;
    CgPredRow row = {step, name, flops, bytes, body + launch, lim, blocks, threads, cls};
    vec_push(&r->rows, row);
    r->step_s += body + launch;
    r->launch_s += launch;
    r->launches++;
}

/* One thread's sgemm rate for a block whose smallest side is s:
 * log-linear between the measured bands (16, 64, 256, 512). */
static double cpu_gemm_rate(const CgDevice *dev, double s)
{
    static const double at[4] = {16, 64, 256, 512};
    if (s <= at[0])
        return dev->gemm1[0] * s / at[0];
    for (int i = 1; i < 4; i++)
        if (s <= at[i]) {
            double f = log(s / at[i - 1]) / log(at[i] / at[i - 1]);
            return dev->gemm1[i - 1] + f * (dev->gemm1[i] - dev->gemm1[i - 1]);
        }
    return dev->gemm1[3];
}

/* A GEMM on the CPU: its parts (cg_gemm_parts), each one single-threaded
 * OpenBLAS call, in waves over the threads. */
static double cpu_gemm_seconds(const CgDevice *dev, const CgGemm *m, int64_t *parts_out)
{
    int n = cg_gemm_parts(m);
    int64_t b0, b1, m0, m1, n0, n1;
    cg_gemm_part(m, n, 0, &b0, &b1, &m0, &m1, &n0, &n1);
    double rows = (double)(m1 - m0), cols = (double)(n1 - n0), k = (double)m->K;
    double s = rows < cols ? rows : cols;
    s = s < k ? s : k;
    double part = 2.0 * (double)(b1 - b0) * rows * cols * k / cpu_gemm_rate(dev, s);
    *parts_out = n;
    return part * ceil((double)n / dev->units);
}

static void predict_gemm(CgPrediction *r, const CgPlan *p, const CgCudaProgram *q,
                         const CgDevice *dev, const CgPredictOpts *o, int s)
{
    const Graph *g = p->g;
    const CgStep *st = &p->steps.v[s];
    const CgGemm *m = &st->gemm;
    const DType *storage = q ? q->storage : NULL;
    CgEpilogue epi = q ? q->epi[s] : CG_EPI_NONE;
    double launch = o->cuda_graph ? dev->graph_s : dev->launch_s;
    bool half = dev->gpu && (o->bf16 || (storage && (storage[m->a] == DT_BF16 ||
                                                     storage[m->b] == DT_BF16)));
    /* bf16 from f32 operands: the backend casts them first (one launch
     * each), except weights with a copy kept through the step, which the
     * cast group due before this GEMM (if any) casts in one launch
     * (cg_cuda_casts): 6 bytes per element, one block per chunk */
    if (half && storage && q->cast_group && q->cast_group[s] >= 0) {
        int i = q->cast_group[s];
        double bytes = 0;
        int64_t blocks = 0;
        for (int j = q->cast_first[i]; j < q->cast_first[i + 1]; j++) {
            int64_t n = shape_numel(&g->t.v[q->cast_t[j]].s);
            bytes += 6.0 * (double)n;
            blocks += (n + CG_CUDA_CAST_CHUNK - 1) / CG_CUDA_CAST_CHUNK;
        }
        double fill = grid_efficiency(dev, blocks, cg_cuda_blocks_per_unit(dev, 256, 0, 0));
        add_row(r, s, "cast_f32_bf16_multi", 0, bytes, 0, bytes / (cg_device_bw(dev) * fill),
                launch, blocks, 256, fill < 0.5, -1);
        r->kernel_s += r->rows.v[r->rows.n - 1].s;
    }
    if (half && storage)
        for (int k = 0; k < 2; k++) {
            int t = k ? m->b : m->a;
            if (storage[t] == DT_BF16 || (q->cast_off && q->cast_off[2 * s + k] >= 0))
                continue;
            double n = (double)shape_numel(&g->t.v[t].s);
            double bytes = 6 * n;
            int64_t blocks = (int64_t)ceil(n / 256 / 4);
            double fill = grid_efficiency(dev, blocks, cg_cuda_blocks_per_unit(dev, 256, 0, 0));
            add_row(r, s, "cast_f32_bf16", 0, bytes, 0, bytes / (cg_device_bw(dev) * fill),
                    launch, blocks, 256, fill < 0.5, -1);
            r->kernel_s += r->rows.v[r->rows.n - 1].s;
        }
    double flops = 2.0 * (double)m->batch * (double)m->M * (double)m->N * (double)m->K;
    double peak = !dev->gpu ? dev->gemm : half ? dev->bf16 : o->tf32 ? dev->tf32 : dev->f32;
    int wt = m->d >= 0 ? m->d : m->c;
    double bytes = tensor_bytes(g, m->a, storage) * (half && storage && storage[m->a] != DT_BF16
                                                         ? 0.5 : 1) +
                   tensor_bytes(g, m->b, storage) * (half && storage && storage[m->b] != DT_BF16
                                                         ? 0.5 : 1) +
                   tensor_bytes(g, wt, storage);
    if (epi == CG_EPI_GELU_AUX_BIAS)
        bytes += tensor_bytes(g, m->c, storage);
    if (epi == CG_EPI_DGELU || epi == CG_EPI_DGELU_BGRAD)
        bytes += tensor_bytes(g, m->aux, storage);
    if (!dev->gpu) {
        int64_t parts;
        double t_comp = cpu_gemm_seconds(dev, m, &parts);
        add_row(r, s, "gemm", flops, bytes, t_comp, bytes / dev->bw, launch, parts, 0, false,
                CG_CLASS_GEMM_LARGE);
    } else {
        CgGemmCost c;
        cg_gemm_cost(dev, m->batch, m->M, m->N, m->K, peak, bytes, &c);
        int cls = c.t_mem > c.t_comp ? CG_CLASS_GEMM_MEMORY
                  : c.split > 1      ? CG_CLASS_GEMM_SPLITK
                  : c.waves < 4      ? CG_CLASS_GEMM_WAVES
                                     : CG_CLASS_GEMM_LARGE;
        /* the roofline's blend is in the body: t_comp carries it */
        add_row(r, s, "gemm", flops, bytes, c.t_mem > c.t_comp ? c.t_comp : c.s,
                c.t_mem > c.t_comp ? c.s : c.t_mem, launch, c.ctas, 0, c.ctas < dev->units, cls);
    }
    r->gemm_s += r->rows.v[r->rows.n - 1].s;
    r->gemm_flops += flops;
}

/* Whether expression e loads param `param` at an index that depends on a
 * variable other than the outer ones (outer[v]); *loads: whether it loads
 * the param at all. Walks the expression DAG (seen[] marks visited). */
static bool loads_inner(const CgKernel *k, int e, int param, const bool *outer, bool *seen,
                        bool *loads)
{
    if (e < 0 || seen[e])
        return false;
    seen[e] = true;
    const CgExpr *x = &k->ex.v[e];
    int n = x->kind == CGX_OP       ? cg_opinfo[x->op].arity
            : x->kind == CGX_SELECT ? 3
            : x->kind == CGX_LOAD || x->kind == CGX_CAST || x->kind == CGX_RAND ? 1
                                                                                 : 0;
    if (x->kind == CGX_LOAD && x->param == param) {
        *loads = true;
        /* the index's variables: any inner one makes the load full */
        bool *s2 = xcalloc((size_t)k->ex.n + 1, sizeof(bool));
        VEC(int) st = {0};
        bool inner = false;
        vec_push(&st, x->a[0]);
        while (st.n && !inner) {
            int i = st.v[--st.n];
            if (i < 0 || s2[i])
                continue;
            s2[i] = true;
            const CgExpr *y = &k->ex.v[i];
            if (y->kind == CGX_VAR && !outer[y->var])
                inner = true;
            if (y->kind == CGX_ACC)
                continue;
            int m = y->kind == CGX_OP       ? cg_opinfo[y->op].arity
                    : y->kind == CGX_SELECT ? 3
                    : y->kind == CGX_LOAD || y->kind == CGX_CAST || y->kind == CGX_RAND ? 1
                                                                                         : 0;
            for (int j = 0; j < m; j++)
                vec_push(&st, y->a[j]);
        }
        vec_free(&st);
        free(s2);
        if (inner)
            return true;
    }
    for (int j = 0; j < n; j++)
        if (loads_inner(k, x->a[j], param, outer, seen, loads))
            return true;
    return false;
}

/* The phases of loop l that read param j at indices varying inside an
 * outer iteration (passes over its rows); *loads: whether l reads j. */
static int param_passes(const CgKernel *k, const CgLoop *l, int j, bool *loads)
{
    bool *outer = xcalloc((size_t)k->nvars + 1, sizeof(bool));
    bool *seen = xcalloc((size_t)k->ex.n + 1, sizeof(bool));
    for (int i = 0; i < l->ndim; i++)
        outer[l->dim[i].var] = true;
    int passes = 0;
    for (int pi = 0; pi < l->ph.n; pi++) {
        const CgPhase *ph = &l->ph.v[pi];
        bool inner = false;
        memset(seen, 0, (size_t)k->ex.n + 1);
        if (ph->acc >= 0)
            inner |= loads_inner(k, ph->value, j, outer, seen, loads);
        for (int i = 0; i < ph->lets.n; i++)
            inner |= loads_inner(k, ph->lets.v[i], j, outer, seen, loads);
        for (int i = 0; i < ph->st.n; i++) {
            const CgStore *st = &ph->st.v[i];
            inner |= loads_inner(k, st->index, j, outer, seen, loads);
            inner |= loads_inner(k, st->value, j, outer, seen, loads);
            inner |= loads_inner(k, st->guard, j, outer, seen, loads);
        }
        passes += inner;
    }
    free(outer);
    free(seen);
    return passes;
}

/* Bytes function fn moves for kernel param j (whole: its buffer's bytes):
 *   - written: the whole buffer; twice when the function also loads it
 *     (an update in place reads every element and writes it back);
 *   - read only at indices fixed per outer iteration (take_along's target
 *     logit, a per-row gather): one 32-byte sector per outer iteration, if
 *     that is less than the buffer;
 *   - read in P > 1 passes over each outer iteration's slice (a fused row
 *     kernel's fold, then its stores): the later passes come from L2 when
 *     the slices of the resident blocks fit in it, else from memory again,
 *     and then cost P times the buffer; once when the function keeps the
 *     row in registers (cg_cuda_row_cached). */
static double param_bytes(const CgKernel *k, const CgCudaFn *fn, const CgDevice *dev, int j,
                          double whole)
{
    if (!k || fn->loop < 0 || fn->loop >= k->loops.n)
        return whole;
    if (k->params.v[j].out) { /* and read too (in place: AdamW's p, m, v): twice */
        int end = fn->loop + (fn->nloops > 1 ? fn->nloops : 1);
        for (int l = fn->loop; l < end && l < k->loops.n; l++) {
            bool loads = false;
            param_passes(k, &k->loops.v[l], j, &loads);
            if (loads)
                return 2 * whole;
        }
        return whole;
    }
    bool loads = false;
    int passes = param_passes(k, &k->loops.v[fn->loop], j, &loads);
    double rows = 32.0 * (double)fn->n;
    if (loads && !passes)
        return rows < whole ? rows : whole;
    if (passes > 1 && fn->rows && fn->n > 0 && !cg_cuda_row_cached(fn, j)) {
        int per_unit = dev->max_threads_unit / (fn->threads > 0 ? fn->threads : 1);
        per_unit = per_unit > dev->max_blocks_unit ? dev->max_blocks_unit : per_unit;
        double resident = (double)dev->units * (per_unit < 1 ? 1 : per_unit);
        double blocks = (double)fn->blocks < resident ? (double)fn->blocks : resident;
        if (whole / (double)fn->n * blocks > dev->l2)
            return whole * passes;
    }
    return whole;
}

/* The DRAM bytes of fused attention function fn (cg_cuda_attn_reuse):
 * block b works on batch*head b / attn_tiles, and the device runs blocks
 * in blockIdx order as resident slots free up, so the resident blocks
 * (units x per_unit, at most the grid) span about resident / attn_tiles + 1
 * heads at once. When those heads' re-read rows (attn_head each) fit in
 * L2, each row comes from DRAM once and its later visits from L2: the
 * DRAM bytes are fn->bytes less the re-reads. Otherwise every visit is a
 * DRAM read. The L2 traffic itself is not costed (docs/cost.md). */
double cg_attn_dram_bytes(const CgCudaFn *fn, const CgDevice *dev, int per_unit)
{
    if (!fn->attn || fn->attn_tiles <= 0)
        return fn->bytes;
    double resident = (double)dev->units * (per_unit < 1 ? 1 : per_unit);
    if (resident > (double)fn->blocks)
        resident = (double)fn->blocks;
    double heads = ceil(resident / (double)fn->attn_tiles) + 1;
    double all = (double)fn->blocks / (double)fn->attn_tiles;
    if (heads > all)
        heads = all;
    if (heads * fn->attn_head > dev->l2)
        return fn->bytes;
    return fn->bytes - fn->attn_reread;
}

/* A kernel step on a GPU: one row per CUDA function it launches. */
static void predict_cuda_kernel(CgPrediction *r, const CgPlan *p, const CgCudaProgram *q,
                                const CgDevice *dev, const CgPredictOpts *o, int s)
{
    const Graph *g = p->g;
    const CgStep *st = &p->steps.v[s];
    double launch = o->cuda_graph ? dev->graph_s : dev->launch_s;
    int nfn = q->step_nfn[s];
    double total_bytes = 0;
    double *fb = xcalloc((size_t)nfn + 1, sizeof *fb);
    for (int f = 0; f < nfn; f++) {
        const CgCudaFn *fn = &q->fn.v[q->step_fn[s] + f];
        const CgKernel *k = p->kernels.v[st->kernel];
        for (int j = 0; j < fn->nparam; j++)
            fb[f] += param_bytes(k, fn, dev, fn->param[j],
                                 tensor_bytes(g, st->args[fn->param[j]], q->storage));
        total_bytes += fb[f];
    }
    for (int f = 0; f < nfn; f++) {
        const CgCudaFn *fn = &q->fn.v[q->step_fn[s] + f];
        double flops = total_bytes > 0 ? st->flops * fb[f] / total_bytes : st->flops / nfn;
        int per_unit = cg_cuda_blocks_per_unit(dev, fn->threads, fn->regs, fn->smem);
        double fill = grid_efficiency(dev, fn->blocks, per_unit);
        double share = latency_share(fn->threads, per_unit);
        double bw = cg_device_bw(dev);
        double t_comp = flops / (dev->f32 * fill), t_mem = fb[f] / (bw * fill * share);
        if (fn->attn) { /* the tiles it visits, from the kernel's design */
            double eff;
            flops = fn->flops;
            fb[f] = cg_attn_dram_bytes(fn, dev, per_unit);
            t_comp = attn_seconds(fn, dev, per_unit, fill, &eff);
            t_mem = fb[f] / (bw * fill * share);
        }
        add_row(r, s, fn->name, flops, fb[f], t_comp, t_mem, launch, fn->blocks, fn->threads,
                fn->blocks < dev->units && fill < 0.67, fn->attn ? CG_CLASS_ATTN : -1);
        r->kernel_s += r->rows.v[r->rows.n - 1].s;
    }
    free(fb);
}

/* A kernel step on the CPU: its element-operations (cg_kernel_work) at
 * the measured rate of generated code, over the threads when the backend
 * splits it (parallel and at least CG_MIN_KERNEL_WORK), and its bytes at
 * the bandwidth of the threads it runs on. */
static void predict_cpu_kernel(CgPrediction *r, const CgPlan *p, const CgDevice *dev, int s)
{
    const CgStep *st = &p->steps.v[s];
    const CgKernel *k = p->kernels.v[st->kernel];
    double work = (double)cg_kernel_work(k);
    bool split = k->parallel && work >= CG_MIN_KERNEL_WORK && dev->units > 1;
    int used = split ? dev->units : 1;
    double t_comp = work / (dev->work * used);
    double t_mem = st->bytes_moved / (split ? dev->bw : dev->bw1);
    add_row(r, s, k->name, st->flops, st->bytes_moved, t_comp, t_mem, dev->launch_s, used, 0,
            false, -1);
    r->kernel_s += r->rows.v[r->rows.n - 1].s;
}

CgPrediction *cg_predict(const CgPlan *p, const CgCudaProgram *q, const CgDevice *dev,
                         const CgPredictOpts *o)
{
    CgPrediction *r = xcalloc(1, sizeof *r);
    r->dev = dev;
    r->peak = !dev->gpu ? dev->f32 : o->bf16 ? dev->bf16 : o->tf32 ? dev->tf32 : dev->f32;
    r->peak_name = !dev->gpu ? "f32 FMA peak, measured" : o->bf16 ? "dense bf16 peak"
                   : o->tf32 ? "dense TF32 peak" : "f32 peak";
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        r->flops += st->flops;
        switch (st->kind) {
        case CG_STEP_KERNEL:
            if (q && cg_cuda_step_replaced(p, q->epi, s))
                break; /* its GEMM's epilogue computes it */
            if (q)
                predict_cuda_kernel(r, p, q, dev, o, s);
            else
                predict_cpu_kernel(r, p, dev, s);
            break;
        case CG_STEP_GEMM: predict_gemm(r, p, q, dev, o, s); break;
        case CG_STEP_COPY: {
            double bytes = 2.0 * (double)st->bytes;
            double launch = !dev->gpu ? dev->launch_s : o->cuda_graph ? dev->graph_s
                                                                        : dev->launch_s;
            add_row(r, s, "copy", 0, bytes, 0, bytes / cg_device_bw(dev), launch, 0, 0, false,
                    -1);
            r->copy_s += r->rows.v[r->rows.n - 1].s;
            break;
        }
        case CG_STEP_ALLREDUCE_START:
        case CG_STEP_ALLREDUCE_WAIT:
        case CG_STEP_SHARD_PACK:
        case CG_STEP_TP: break; /* collectives: kiln plan costs them (runtime/cli/plan.c) */
        }
    }
    return r;
}

void cg_prediction_free(CgPrediction *r)
{
    if (!r)
        return;
    vec_free(&r->rows);
    free(r);
}

typedef struct {
    const char *name;
    int step;
    int launches;
    double s, flops, bytes;
    CgLimit limit;
    int64_t blocks;
    int threads;
} Agg;

static int by_time(const void *a, const void *b, void *ctx)
{
    (void)ctx;
    const Agg *x = a, *y = b;
    return x->s > y->s ? -1 : x->s < y->s ? 1 : x->step - y->step;
}

void cg_prediction_print(const CgPrediction *r, const CgPlan *p, double model_flops,
                         double tokens, int top, FILE *f)
{
    const CgDevice *dev = r->dev;
    char a[32], b[32], c[32], d[32];
    ir_fmt_seconds(r->step_s, a, sizeof a);
    fprintf(f, "predicted step on %s (%s): %s\n", dev->name, dev->title, a);
    ir_fmt_seconds(r->gemm_s, a, sizeof a);
    ir_fmt_seconds(r->kernel_s, b, sizeof b);
    ir_fmt_seconds(r->copy_s, c, sizeof c);
    ir_fmt_seconds(r->launch_s, d, sizeof d);
    fprintf(f, "  GEMMs %s, kernels %s, copies %s; %d launches, %s of launch overhead\n", a, b,
            c, r->launches, d);
    double peak = r->peak > 0 ? r->peak : dev->f32;
    if (r->step_s > 0) {
        fprintf(f, "  MFU %.1f%% of %.1f %s (%s; model FLOPs %.4g per step)",
                100.0 * model_flops / r->step_s / peak, dev->gpu ? peak / 1e12 : peak / 1e9,
                dev->gpu ? "TFLOP/s" : "GFLOP/s", r->peak_name, model_flops);
        if (tokens > 0)
            fprintf(f, "; %.4g tokens/s", tokens / r->step_s);
        fprintf(f, "\n");
    }
    /* launches of one kernel name in one step add up: a name's total */
    Agg *g = xcalloc((size_t)r->rows.n + 1, sizeof *g);
    int n = 0;
    for (int i = 0; i < r->rows.n; i++) {
        const CgPredRow *w = &r->rows.v[i];
        bool gemm = strcmp(w->name, "gemm") == 0 || strcmp(w->name, "copy") == 0;
        int j = 0;
        if (!gemm) /* kernels are named by content: one name, one kernel */
            for (j = 0; j < n && strcmp(g[j].name, w->name) != 0; j++)
                ;
        else
            j = n;
        if (j == n)
            g[n++] = (Agg){w->name, w->step, 0, 0, 0, 0, w->limit, w->blocks, w->threads};
        g[j].launches++;
        g[j].s += w->s;
        g[j].flops += w->flops;
        g[j].bytes += w->bytes;
    }
    qsort_r(g, (size_t)n, sizeof *g, by_time, NULL);
    fprintf(f, "  costliest launches (total over the step):\n");
    fprintf(f, "    %-28s %6s %10s %6s  %-8s %8s %7s  %s\n", "kernel", "calls", "time", "%",
            "limit", "blocks", "threads", "op");
    for (int i = 0; i < n && i < top; i++) {
        ir_fmt_seconds(g[i].s, a, sizeof a);
        const CgStep *st = &p->steps.v[g[i].step];
        const Op *op = st->op >= 0 ? &p->g->ops.v[st->op] : NULL;
        char where[160] = "", name[64];
        if (op && op->loc.file)
            snprintf(where, sizeof where, "%s at %s:%d", ir_opinfo[op->code].name, op->loc.file,
                     op->loc.line);
        else if (op)
            snprintf(where, sizeof where, "%s", ir_opinfo[op->code].name);
        if (st->kind == CG_STEP_GEMM && strcmp(g[i].name, "gemm") == 0)
            snprintf(name, sizeof name, "gemm %lldx%lldx%lld%s", (long long)st->gemm.M,
                     (long long)st->gemm.N, (long long)st->gemm.K,
                     st->gemm.batch > 1 ? " batched" : "");
        else
            snprintf(name, sizeof name, "%s", g[i].name);
        fprintf(f, "    %-28.28s %6d %10s %5.1f%%  %-8s %8lld %7d  %s\n", name,
                g[i].launches, a, r->step_s > 0 ? 100 * g[i].s / r->step_s : 0.0,
                cg_limit_name(g[i].limit), (long long)g[i].blocks, g[i].threads, where);
    }
    free(g);
}
