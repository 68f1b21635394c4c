/* cuda_attn.c - CUDA C for the fused attention ops (OC_ATTN: attention,
 * attention_lse, attention_dq/dk/dv; semantics in ir/ir.h), flash-attention
 * style: the scores are computed a tile at a time in registers and never
 * stored.
 *
 * Four kernels (cg_print_cuda_attn), each a thin extern "C" wrapper around
 * one template of cg_cuda_attn_lib:
 *   forward  one block per (query tile, batch*head): the query tile's rows
 *            walk the key tiles with an online softmax (running max m, sum
 *            l, rescaled output accumulator) and write o and/or lse
 *            (= m + log l); causal key tiles past the diagonal are never
 *            visited, the diagonal tile and the ragged end (T not a multiple
 *            of the tile) are masked; with a mask tensor the block votes
 *            (kiln_attn_sync_keeps: __syncthreads_or) at each key tile and
 *            skips one the mask drops whole for its query tile;
 *   dq       one block per (query tile, batch*head): recomputes P = exp(S -
 *            lse) tile by tile, dS = P * (dO V^T - delta), dQ += scale dS K;
 *   dk, dv   one block per (key tile, batch*head): walks the query tiles
 *            (causal: from the diagonal on), P^T, dV += P^T dO, dS^T, dK +=
 *            scale dS^T Q; dq and dk/dv skip tile pairs a mask drops
 *            whole as the forward does. No atomics: every output element
 *            has one writer (deterministic, like the rest of kiln's CUDA
 *            path);
 *   backward the fused dq, dk, dv of attention_dqkv (cuda_attn_bwd.c holds
 *            its template and its contract): the dk/dv walk plus each
 *            block's share of dq, summed in a fixed order; the plan's dq
 *            kernel then prints nothing (cg_print_cuda_attn_kernel).
 * Every product is a warp-level product into the 16 x 8 C-fragment layout of
 * mma.m16n8k16: a warp owns 16 rows of its block's tile. In bf16 each 16 x 8
 * x 16 tile is the tensor-core mma.sync.m16n8k16 (inline PTX, sm_80 and
 * later, kiln_mma_t::run); under the emulator (KILN_CUDA_EMU_H, which cannot
 * run inline asm) the same fragments are reduced with warp shuffles and f32
 * FMAs (kiln_mma_shfl), so the emulator checks the layout logic the PTX path
 * relies on. In f32 each lane computes its own C elements from shared memory
 * (and from its quad's registers for P, dS): kiln_warp_mm_f32/pm_f32. Tiles sit in static shared memory
 * with the head sizes padded to a multiple of 16 (zeros), so any head size
 * works; the tile sizes are chosen so that the shared memory stays within
 * 48 KiB (attn_tiles). Accumulation and softmax are f32; bf16 operands of
 * the second product (P, dS) are rounded to bf16 as flash attention does.
 *
 * Every tensor is addressed through the op's IrAttnLayout (ir.h), printed
 * into each wrapper as a literal kiln_attn_lay (per tensor: the offset of
 * head bh's row 0 and the row stride), so the head layout reads q, k, v
 * strided out of the qkv projection and writes [B, T, H*D] rows.
 *
 * Grids are 1-D (the backend launches 1-D): block b takes tile
 * (ntiles - 1 - b % ntiles) of batch*head b / ntiles, the longest causal
 * tiles first. */
#include "cg_cuda.h"

#include <stdlib.h>
#include <string.h>

/* The device library, appended once to a program that has attention
 * kernels (after cg_cuda_prelude: uses kiln_bf16, kiln_bf2f, kiln_f2bf). */
const char cg_cuda_attn_lib[] =
    "/* ---- fused attention (codegen/cuda_attn.c) ---- */\n"
    "__device__ __forceinline__ float kiln_attn_ld(const float *p, int64_t i) { return p[i]; }\n"
    "__device__ __forceinline__ float kiln_attn_ld(const kiln_bf16 *p, int64_t i)\n"
    "{\n"
    "    return kiln_bf2f(p[i]);\n"
    "}\n"
    "__device__ __forceinline__ float kiln_attn_ld(const unsigned char *p, int64_t i)\n"
    "{\n"
    "    return (float)p[i];\n"
    "}\n"
    "__device__ __forceinline__ void kiln_attn_st(float *p, int64_t i, float v) { p[i] = v; }\n"
    "__device__ __forceinline__ void kiln_attn_st(kiln_bf16 *p, int64_t i, float v)\n"
    "{\n"
    "    p[i] = kiln_f2bf(v);\n"
    "}\n"
    "/* Shared-memory element of storage type T: the bits as stored. */\n"
    "__device__ __forceinline__ void kiln_attn_sh(float *d, const float *p, int64_t i)\n"
    "{\n"
    "    *d = p[i];\n"
    "}\n"
    "__device__ __forceinline__ void kiln_attn_sh(kiln_bf16 *d, const kiln_bf16 *p, int64_t i)\n"
    "{\n"
    "    *d = p[i];\n"
    "}\n"
    "/* The __launch_bounds__ of a 4-warp forward (cg_print_cuda_attn), by\n"
    " * architecture: left to itself ptxas spilled (f32 head size 40 on sm_90,\n"
    " * bf16 non-causal head size 64 on sm_80). 3 blocks per SM: at most 168\n"
    " * registers; 4: 128. */\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900\n"
    "#define KILN_ATTN_FWD4_BF16 128, 3\n"
    "#define KILN_ATTN_FWD4_F32 128, 3\n"
    "#else\n"
    "#define KILN_ATTN_FWD4_BF16 128\n"
    "#define KILN_ATTN_FWD4_F32 128, 4\n"
    "#endif\n"
    "/* Where element (b, h, i, d) of each tensor sits (ir.h's IrAttnLayout):\n"
    " * bh = b * nh + h; x[X] is the offset of head bh's row 0 of tensor X (q,\n"
    " * k, v, o/dO, dq, dk, dv, lse/delta), rs[X] its row stride. The wrappers\n"
    " * pass literal values, which fold once the templates are inlined. */\n"
    "struct kiln_attn_lay {\n"
    "    int nh;\n"
    "    long long bs[8], hs[8], off[8];\n"
    "    int rs[8];\n"
    "    /* the variants (ir.h): g query heads per key/value head, whose item\n"
    "     * bh / g sits at (bh / g / nhk, bh / g % nhk) of k, v, dk, dv; a causal\n"
    "     * window win (0: none); ALiBi over ah heads (0: none); bk: a bias (1)\n"
    "     * or mask (2) operand bx, element (row i, key j) of item bh at ((bh /\n"
    "     * bdiv) % bmod) * bbs + i * bis + j * bjs (0: none) */\n"
    "    int g, nhk, win, ah;\n"
    "    int bk, bis, bjs;\n"
    "    long long bdiv, bmod, bbs;\n"
    "};\n"
    "enum { KILN_AQ, KILN_AK, KILN_AV, KILN_AO, KILN_ADQ, KILN_ADK, KILN_ADV, KILN_AS };\n"
    "__device__ __forceinline__ long long kiln_attn_at(const kiln_attn_lay &L, int x, int bh)\n"
    "{\n"
    "    if (x == KILN_AK || x == KILN_AV || x == KILN_ADK || x == KILN_ADV) {\n"
    "        const int kb = bh / L.g;\n"
    "        return (long long)(kb / L.nhk) * L.bs[x] + (long long)(kb % L.nhk) * L.hs[x] + L.off[x];\n"
    "    }\n"
    "    return (long long)(bh / L.nh) * L.bs[x] + (long long)(bh % L.nh) * L.hs[x] + L.off[x];\n"
    "}\n"
    "/* ALiBi's slope of item bh (ir_alibi_slope in ir/ir.h), 0 without it */\n"
    "__device__ __forceinline__ float kiln_attn_slope(const kiln_attn_lay &L, int bh)\n"
    "{\n"
    "    if (!L.ah)\n"
    "        return 0.0f;\n"
    "    const int h = bh % L.ah;\n"
    "    int n = 1;\n"
    "    while (n * 2 <= L.ah)\n"
    "        n *= 2;\n"
    "    return exp2f(h < n ? -8.0f * (float)(h + 1) / (float)n\n"
    "                       : -4.0f * (float)(2 * (h - n) + 1) / (float)n);\n"
    "}\n"
    "/* Score x of (row, key) of item bh with the bias added or, masked out,\n"
    " * -inf (L.bk; row < Tq and key < Tk) */\n"
    "template <class BX>\n"
    "__device__ __forceinline__ float kiln_attn_bx(const kiln_attn_lay &L, const BX *bx, int bh,\n"
    "                                              int row, int key, float x)\n"
    "{\n"
    "    const float b = kiln_attn_ld(bx, (long long)(bh / L.bdiv % L.bmod) * L.bbs +\n"
    "                                         (long long)row * L.bis + (long long)key * L.bjs);\n"
    "    return L.bk == 1 ? x + b : b != 0.0f ? x : -KILN_INF;\n"
    "}\n"
    "/* Whether item bh's mask (L.bk == 2) keeps any (row, key) of rows [r0, r0 +\n"
    " * R) x keys [c0, c0 + C) (rows < Tq, keys < Tk; causal: key <= row; a\n"
    " * window: row - key < win): this thread's share of the cells (every NTH-th,\n"
    " * up to its first kept one), for the block's vote __syncthreads_or that\n"
    " * skips a tile pair the mask drops whole (every P and dS of it 0) */\n"
    "template <int R, int C, int NTH, bool CAUSAL, class BX>\n"
    "__device__ __forceinline__ int kiln_attn_keeps(const kiln_attn_lay &L, const BX *bx, int bh,\n"
    "                                               int r0, int Tq, int c0, int Tk)\n"
    "{\n"
    "    const long long b0 = (long long)(bh / L.bdiv % L.bmod) * L.bbs;\n"
    "    for (int i = threadIdx.x; i < R * C; i += NTH) {\n"
    "        const int row = r0 + i / C, key = c0 + i % C;\n"
    "        if (row < Tq && key < Tk && (!CAUSAL || key <= row) && (!L.win || row - key < L.win) &&\n"
    "            kiln_attn_ld(bx, b0 + (long long)row * L.bis + (long long)key * L.bjs) != 0.0f)\n"
    "            return 1;\n"
    "    }\n"
    "    return 0;\n"
    "}\n"
    "/* The barrier before a tile pair's loads, called by all NTH threads: with\n"
    " * a mask (L.bk == 2) the block votes (kiln_attn_keeps) and gets 0 where\n"
    " * the mask drops rows [r0, r0 + R) x keys [c0, c0 + C) whole, so the\n"
    " * caller skips the pair (every P and dS of it 0, nothing to add); else a\n"
    " * plain __syncthreads, 1 */\n"
    "template <int R, int C, int NTH, bool CAUSAL, class BX>\n"
    "__device__ __forceinline__ int kiln_attn_sync_keeps(const kiln_attn_lay &L, const BX *bx, int bh,\n"
    "                                                    int r0, int Tq, int c0, int Tk)\n"
    "{\n"
    "    if (L.bk == 2)\n"
    "        return __syncthreads_or(kiln_attn_keeps<R, C, NTH, CAUSAL>(L, bx, bh, r0, Tq, c0, Tk));\n"
    "    __syncthreads();\n"
    "    return 1;\n"
    "}\n"
    "template <class E> struct kiln_mma_t;\n"
    "/* The m16n8k16 tile product of one warp, D = A B + C, on fragments laid\n"
    " * out as the PTX ISA documents for mma.m16n8k16 (g = lane / 4, t = lane %\n"
    " * 4; a register R holds two consecutive k, the lower index in x/low half):\n"
    " *   A (16 x 16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),\n"
    " *                     a3 = (g+8, 2t+8..);\n"
    " *   B (16 x 8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g);\n"
    " *   C, D (16 x 8):    c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1).\n"
    " * This reduction reads the other lanes' fragments with shuffles and\n"
    " * computes with f32 FMAs: the bf16 path under the emulator. Called by\n"
    " * all 32 lanes. */\n"
    "template <class M>\n"
    "__device__ __forceinline__ void kiln_mma_shfl(float c[4], const typename M::R a[4],\n"
    "                                              const typename M::R b[2])\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    for (int j = 0; j < 4; j++) {\n"
    "        const int sa = g * 4 + j, se = (2 * t) * 4 + j, so = (2 * t + 1) * 4 + j;\n"
    "        const typename M::R a0 = M::shfl(a[0], sa), a1 = M::shfl(a[1], sa);\n"
    "        const typename M::R a2 = M::shfl(a[2], sa), a3 = M::shfl(a[3], sa);\n"
    "        const typename M::R e0 = M::shfl(b[0], se), e1 = M::shfl(b[1], se);\n"
    "        const typename M::R o0 = M::shfl(b[0], so), o1 = M::shfl(b[1], so);\n"
    "        c[0] += M::dot(a0, e0) + M::dot(a2, e1);\n"
    "        c[1] += M::dot(a0, o0) + M::dot(a2, o1);\n"
    "        c[2] += M::dot(a1, e0) + M::dot(a3, e1);\n"
    "        c[3] += M::dot(a1, o0) + M::dot(a3, o1);\n"
    "    }\n"
    "}\n"
    "template <> struct kiln_mma_t<kiln_bf16> {\n"
    "    typedef uint32_t R; /* two bf16, the lower k in the low half */\n"
    "    enum { DIRECT = 0 };\n"
    "    static __device__ __forceinline__ R pack(kiln_bf16 lo, kiln_bf16 hi)\n"
    "    {\n"
    "        return (uint32_t)lo | ((uint32_t)hi << 16);\n"
    "    }\n"
    "    static __device__ __forceinline__ R packf(float lo, float hi)\n"
    "    {\n"
    "        return pack(kiln_f2bf(lo), kiln_f2bf(hi));\n"
    "    }\n"
    "    static __device__ __forceinline__ R shfl(R r, int src)\n"
    "    {\n"
    "        return __shfl_sync(0xffffffffu, r, src);\n"
    "    }\n"
    "    static __device__ __forceinline__ float dot(R a, R b)\n"
    "    {\n"
    "        return kiln_bf2f((kiln_bf16)(a & 0xffffu)) * kiln_bf2f((kiln_bf16)(b & 0xffffu)) +\n"
    "               kiln_bf2f((kiln_bf16)(a >> 16)) * kiln_bf2f((kiln_bf16)(b >> 16));\n"
    "    }\n"
    "    static __device__ __forceinline__ void run(float c[4], const R a[4], const R b[2])\n"
    "    {\n"
    "#ifdef KILN_CUDA_EMU_H\n"
    "        kiln_mma_shfl<kiln_mma_t<kiln_bf16> >(c, a, b);\n"
    "#else\n"
    "        asm(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \"\n"
    "                     \"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n\"\n"
    "                     : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "                     : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), "
    "\"r\"(b[1]));\n"
    "#endif\n"
    "    }\n"
    "};\n"
    "/* f32 needs no fragments: kiln_warp_mm and kiln_warp_pm take the direct\n"
    " * path below. */\n"
    "template <> struct kiln_mma_t<float> {\n"
    "    enum { DIRECT = 1 };\n"
    "};\n"
    "/* The f32 products (kiln_mma_t<float>::DIRECT): each lane computes its own\n"
    " * C elements (rows g, g + 8; columns 2t, 2t + 1 of every 8-column tile)\n"
    " * with f32 FMAs over k in order, reading A and B straight from shared\n"
    " * memory (kiln_warp_mm_f32), or, for P in registers, fetching the rows'\n"
    " * 16 columns a k-tile from the 4 lanes of its quad (kiln_warp_pm_f32): 32\n"
    " * shuffles a k-tile instead of 64 a 16 x 8 x 16 product. Same results as\n"
    " * the fragment path up to the order of the f32 sums; ptxas compiles it in\n"
    " * a fraction of the time (sm_80 took minutes a kernel on the shuffles). */\n"
    "template <int KD, int NT>\n"
    "__device__ __forceinline__ void kiln_warp_mm_f32(float (*acc)[4], const float *A, int lda,\n"
    "                                                 const float *B, int sn, int sk)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    const float *r0 = A + g * lda, *r1 = r0 + 8 * lda, *c0 = B + 2 * t * sn;\n"
    "#pragma unroll 4\n"
    "    for (int k = 0; k < KD; k++) {\n"
    "        const float x0 = r0[k], x1 = r1[k];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NT; j++) {\n"
    "            const float b0 = c0[8 * j * sn + k * sk], b1 = c0[(8 * j + 1) * sn + k * sk];\n"
    "            acc[j][0] += x0 * b0;\n"
    "            acc[j][1] += x0 * b1;\n"
    "            acc[j][2] += x1 * b0;\n"
    "            acc[j][3] += x1 * b1;\n"
    "        }\n"
    "    }\n"
    "}\n"
    "template <int KT, int NT>\n"
    "__device__ __forceinline__ void kiln_warp_pm_f32(float (*acc)[4], const float (*p)[4],\n"
    "                                                 const float *B, int sn, int sk)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, t = lane & 3;\n"
    "    const float *c0 = B + 2 * t * sn;\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < KT; kk++)\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < 4; u++) {\n"
    "            /* lane u of the quad holds columns 2u, 2u + 1, 2u + 8, 2u + 9 */\n"
    "            const int src = (lane & ~3) | u;\n"
    "            float x0[4], x1[4]; /* rows g, g + 8 at those four columns */\n"
    "#pragma unroll\n"
    "            for (int h = 0; h < 2; h++) {\n"
    "                x0[2 * h] = __shfl_sync(0xffffffffu, p[2 * kk + h][0], src);\n"
    "                x0[2 * h + 1] = __shfl_sync(0xffffffffu, p[2 * kk + h][1], src);\n"
    "                x1[2 * h] = __shfl_sync(0xffffffffu, p[2 * kk + h][2], src);\n"
    "                x1[2 * h + 1] = __shfl_sync(0xffffffffu, p[2 * kk + h][3], src);\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                const int k = 16 * kk + 2 * u + (e & 1) + 8 * (e >> 1);\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < NT; j++) {\n"
    "                    const float b0 = c0[8 * j * sn + k * sk];\n"
    "                    const float b1 = c0[(8 * j + 1) * sn + k * sk];\n"
    "                    acc[j][0] += x0[e] * b0;\n"
    "                    acc[j][1] += x0[e] * b1;\n"
    "                    acc[j][2] += x1[e] * b0;\n"
    "                    acc[j][3] += x1[e] * b1;\n"
    "                }\n"
    "            }\n"
    "        }\n"
    "}\n"
    "/* acc[NT] (16 x 8*NT, C layout) += A B: A is 16 x KD at A[m * lda + k] (row\n"
    " * major), B is KD x 8*NT at B[n * sn + k * sk]. KD a multiple of 16. */\n"
    "template <class E, int KD, int NT>\n"
    "__device__ __forceinline__ void kiln_warp_mm_frag(float (*acc)[4], const E *A, int lda,\n"
    "                                                  const E *B, int sn, int sk)\n"
    "{\n"
    "    typedef kiln_mma_t<E> M;\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "#pragma unroll\n"
    "    for (int k0 = 0; k0 < KD; k0 += 16) {\n"
    "        typename M::R a[4];\n"
    "        const E *r0 = A + g * lda + k0 + 2 * t, *r1 = r0 + 8 * lda;\n"
    "        a[0] = M::pack(r0[0], r0[1]);\n"
    "        a[1] = M::pack(r1[0], r1[1]);\n"
    "        a[2] = M::pack(r0[8], r0[9]);\n"
    "        a[3] = M::pack(r1[8], r1[9]);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NT; j++) {\n"
    "            typename M::R b[2];\n"
    "            const E *c0 = B + (8 * j + g) * sn + (k0 + 2 * t) * sk;\n"
    "            b[0] = M::pack(c0[0], c0[sk]);\n"
    "            b[1] = M::pack(c0[8 * sk], c0[9 * sk]);\n"
    "            M::run(acc[j], a, b);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "/* acc[NT] += P B: P is 16 x 16*KT held in registers in the C layout\n"
    " * (p[2*KT]: the result of a kiln_warp_mm), rounded to E; B as above. */\n"
    "template <class E, int KT, int NT>\n"
    "__device__ __forceinline__ void kiln_warp_pm_frag(float (*acc)[4], const float (*p)[4],\n"
    "                                                  const E *B, int sn, int sk)\n"
    "{\n"
    "    typedef kiln_mma_t<E> M;\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "#pragma unroll\n"
    "    for (int kk = 0; kk < KT; kk++) {\n"
    "        typename M::R a[4];\n"
    "        a[0] = M::packf(p[2 * kk][0], p[2 * kk][1]);\n"
    "        a[1] = M::packf(p[2 * kk][2], p[2 * kk][3]);\n"
    "        a[2] = M::packf(p[2 * kk + 1][0], p[2 * kk + 1][1]);\n"
    "        a[3] = M::packf(p[2 * kk + 1][2], p[2 * kk + 1][3]);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NT; j++) {\n"
    "            typename M::R b[2];\n"
    "            const E *c0 = B + (8 * j + g) * sn + (16 * kk + 2 * t) * sk;\n"
    "            b[0] = M::pack(c0[0], c0[sk]);\n"
    "            b[1] = M::pack(c0[8 * sk], c0[9 * sk]);\n"
    "            M::run(acc[j], a, b);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "/* The products the kernels call: fragments (bf16) or the direct f32 path. */\n"
    "template <class E, int KD, int NT>\n"
    "__device__ __forceinline__ void kiln_warp_mm(float (*acc)[4], const E *A, int lda, const E *B,\n"
    "                                             int sn, int sk)\n"
    "{\n"
    "    if constexpr (kiln_mma_t<E>::DIRECT)\n"
    "        kiln_warp_mm_f32<KD, NT>(acc, A, lda, B, sn, sk);\n"
    "    else\n"
    "        kiln_warp_mm_frag<E, KD, NT>(acc, A, lda, B, sn, sk);\n"
    "}\n"
    "template <class E, int KT, int NT>\n"
    "__device__ __forceinline__ void kiln_warp_pm(float (*acc)[4], const float (*p)[4], const E *B,\n"
    "                                             int sn, int sk)\n"
    "{\n"
    "    if constexpr (kiln_mma_t<E>::DIRECT)\n"
    "        kiln_warp_pm_f32<KT, NT>(acc, p, B, sn, sk);\n"
    "    else\n"
    "        kiln_warp_pm_frag<E, KT, NT>(acc, p, B, sn, sk);\n"
    "}\n"
    "/* Rows [r0, r0 + R) of x [T, W] (row i at x + i * ld) into S [R][LD], zero\n"
    " * where r >= T or the column >= W (the padding up to LD's used width WP). */\n"
    "/* P^T of one visit, in place: s holds S^T, rows warp w's keys key0 (fragment\n"
    " * rows g) and key0 + 8, columns the query tile from q0; p = exp(s scale +\n"
    " * slope (key - query) - lse), 0 past Tq or, causal, where the key follows\n"
    " * the query or (win) lies win or more before it (looked at on edge tiles\n"
    " * only); with a bias or mask (L.bk) item bh's term, 0 where the score is\n"
    " * -inf. */\n"
    "template <int NS, bool CAUSAL, class BX>\n"
    "__device__ __forceinline__ void kiln_attn_pt(float (*s)[4], const float *Ls, float scale,\n"
    "                                             bool edge, int q0, int Tq, int key0, int t,\n"
    "                                             int win, float slope, const kiln_attn_lay &L,\n"
    "                                             const BX *bx, int bh, int Tk)\n"
    "{\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < 4; e++) {\n"
    "            const int c = 8 * j + 2 * t + (e & 1);\n"
    "            float x = s[j][e] * scale;\n"
    "            if (slope != 0.0f)\n"
    "                x += slope * (float)((e < 2 ? key0 : key0 + 8) - (q0 + c));\n"
    "            if (L.bk && q0 + c < Tq && (e < 2 ? key0 : key0 + 8) < Tk)\n"
    "                x = kiln_attn_bx(L, bx, bh, q0 + c, e < 2 ? key0 : key0 + 8, x);\n"
    "            float p = L.bk && x == -KILN_INF ? 0.0f : expf(x - Ls[c]);\n"
    "            if (edge) {\n"
    "                const int col = q0 + c, key = e < 2 ? key0 : key0 + 8;\n"
    "                if (col >= Tq || (CAUSAL && key > col) || (win && col - key >= win))\n"
    "                    p = 0.0f;\n"
    "            }\n"
    "            s[j][e] = p;\n"
    "        }\n"
    "}\n"
    "/* Stores warp w's dk (times scale) and dv rows, keys key0 and key0 + 8 (those\n"
    " * < Tk): ak [NK][4] and av [NV][4] as kiln_warp_pm accumulates them, the\n"
    " * columns past D and DV (the padding to 16) left out. WK, WV: which of the\n"
    " * two it stores (the dk/dv kernel's DK and DVW). */\n"
    "template <class E, int D, int DV, int NK, int NV, bool WK, bool WV>\n"
    "__device__ __forceinline__ void kiln_attn_st_kv(E *dk, E *dv, float (*ak)[4], float (*av)[4],\n"
    "                                                const kiln_attn_lay &L, int key0, int Tk,\n"
    "                                                int t, float scale)\n"
    "{\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < 2; h++) {\n"
    "        const int key = key0 + 8 * h;\n"
    "        if (key >= Tk)\n"
    "            continue;\n"
    "        if (WK)\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NK; j++)\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < 2; e++) {\n"
    "                    const int c = 8 * j + 2 * t + e;\n"
    "                    if (c < D)\n"
    "                        kiln_attn_st(dk, key * L.rs[KILN_ADK] + c, ak[j][2 * h + e] * scale);\n"
    "                }\n"
    "        if (WV)\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NV; j++)\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < 2; e++) {\n"
    "                    const int c = 8 * j + 2 * t + e;\n"
    "                    if (c < DV)\n"
    "                        kiln_attn_st(dv, key * L.rs[KILN_ADV] + c, av[j][2 * h + e]);\n"
    "                }\n"
    "    }\n"
    "}\n"
    "template <class E, int R, int W, int WP, int LD, int NTH>\n"
    "__device__ __forceinline__ void kiln_attn_tile(E *S, const E *x, int r0, int T, int ld)\n"
    "{\n"
    "    for (int i = threadIdx.x; i < R * WP; i += NTH) {\n"
    "        const int r = i / WP, c = i % WP;\n"
    "        E v = (E)0;\n"
    "        if (r0 + r < T && c < W)\n"
    "            kiln_attn_sh(&v, x, (r0 + r) * ld + c);\n"
    "        S[r * LD + c] = v;\n"
    "    }\n"
    "}\n"
    "/* The forward pass (see codegen/cuda_attn.c). E: storage type of q, k, v, o.\n"
    " * BR = 16 * NW query rows per block, BC keys per tile. */\n"
    "template <class E, int D, int DV, int NW, int BC, bool CAUSAL, bool O, bool LSE, class BX>\n"
    "__device__ __forceinline__ void kiln_attn_fwd(const E *q, const E *k, const E *v, E *o,\n"
    "                                              float *lse, int Tq, int Tk,\n"
    "                                              float scale, const kiln_attn_lay &L,\n"
    "                                              const BX *bx)\n"
    "{\n"
    "    enum { BR = 16 * NW, NTH = 32 * NW, DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16,\n"
    "           LDK = DP + 8, LDV = DVP + 8, NS = BC / 8, NO = DVP / 8 };\n"
    "    __shared__ E Qs[BR * LDK];\n"
    "    __shared__ E Ks[BC * LDK];\n"
    "    __shared__ E Vs[O ? BC * LDV : 1];\n"
    "    const int nqt = (Tq + BR - 1) / BR, nkt = (Tk + BC - 1) / BC;\n"
    "    const int qt = nqt - 1 - (int)blockIdx.x % nqt, bh = (int)blockIdx.x / nqt;\n"
    "    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    q += kiln_attn_at(L, KILN_AQ, bh);\n"
    "    k += kiln_attn_at(L, KILN_AK, bh);\n"
    "    if (O)\n"
    "        v += kiln_attn_at(L, KILN_AV, bh);\n"
    "    if (O)\n"
    "        o += kiln_attn_at(L, KILN_AO, bh);\n"
    "    if (LSE)\n"
    "        lse += kiln_attn_at(L, KILN_AS, bh);\n"
    "    kiln_attn_tile<E, BR, D, DP, LDK, NTH>(Qs, q, qt * BR, Tq, L.rs[KILN_AQ]);\n"
    "    const int row0 = qt * BR + 16 * w + g, row1 = row0 + 8;\n"
    "    float m[2] = {-KILN_INF, -KILN_INF}, l[2] = {0.0f, 0.0f};\n"
    "    float acc[NO][4];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NO; j++)\n"
    "        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;\n"
    "    /* causal: the last key a row of this tile keeps is its last row */\n"
    "    const int kend = CAUSAL ? ((qt + 1) * BR < Tk ? (qt + 1) * BR : Tk) : Tk;\n"
    "    const int ntiles = CAUSAL ? (kend + BC - 1) / BC : nkt;\n"
    "    /* a window: no key tile wholly before the first row's window */\n"
    "    const int kt0 = L.win && qt * BR + 1 > L.win ? (qt * BR + 1 - L.win) / BC : 0;\n"
    "    const float slope = kiln_attn_slope(L, bh);\n"
    "    for (int kt = kt0; kt < ntiles; kt++) {\n"
    "        /* a key tile a mask drops whole for this query tile is skipped (m,\n"
    "         * l, acc stay as they are) */\n"
    "        if (!kiln_attn_sync_keeps<BR, BC, NTH, CAUSAL>(L, bx, bh, qt * BR, Tq, kt * BC, Tk))\n"
    "            continue;\n"
    "        kiln_attn_tile<E, BC, D, DP, LDK, NTH>(Ks, k, kt * BC, Tk, L.rs[KILN_AK]);\n"
    "        if (O)\n"
    "            kiln_attn_tile<E, BC, DV, DVP, LDV, NTH>(Vs, v, kt * BC, Tk, L.rs[KILN_AV]);\n"
    "        __syncthreads();\n"
    "        float s[NS][4];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;\n"
    "        kiln_warp_mm<E, DP, NS>(s, Qs + 16 * w * LDK, LDK, Ks, LDK, 1);\n"
    "        /* mask only where a column can be dropped: the ragged end, the diagonal */\n"
    "        const bool edge = (kt + 1) * BC > Tk || (CAUSAL && (kt + 1) * BC - 1 > qt * BR) ||\n"
    "                          (L.win && qt * BR + BR - 1 - kt * BC >= L.win);\n"
    "        float mx[2] = {-KILN_INF, -KILN_INF};\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                float x = s[j][e] * scale;\n"
    "                if (L.ah)\n"
    "                    x += slope * (float)(kt * BC + 8 * j + 2 * t + (e & 1) - (e < 2 ? row0 : row1));\n"
    "                if (L.bk && kt * BC + 8 * j + 2 * t + (e & 1) < Tk && (e < 2 ? row0 : row1) < Tq)\n"
    "                    x = kiln_attn_bx(L, bx, bh, e < 2 ? row0 : row1,\n"
    "                                     kt * BC + 8 * j + 2 * t + (e & 1), x);\n"
    "                if (edge) {\n"
    "                    const int col = kt * BC + 8 * j + 2 * t + (e & 1);\n"
    "                    const int row = e < 2 ? row0 : row1;\n"
    "                    if (col >= Tk || (CAUSAL && col > row) || (L.win && row - col >= L.win))\n"
    "                        x = -KILN_INF;\n"
    "                }\n"
    "                s[j][e] = x;\n"
    "                mx[e >> 1] = fmaxf(mx[e >> 1], x);\n"
    "            }\n"
    "        float base[2], corr[2], sum[2] = {0.0f, 0.0f};\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < 2; h++) {\n"
    "            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));\n"
    "            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));\n"
    "            const float mn = fmaxf(m[h], mx[h]);\n"
    "            base[h] = mn == -KILN_INF ? 0.0f : mn; /* a row with nothing kept yet */\n"
    "            corr[h] = expf(m[h] - base[h]);\n"
    "            m[h] = mn;\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                const float p = expf(s[j][e] - base[e >> 1]);\n"
    "                s[j][e] = p;\n"
    "                sum[e >> 1] += p;\n"
    "            }\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < 2; h++) {\n"
    "            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);\n"
    "            sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);\n"
    "            l[h] = l[h] * corr[h] + sum[h];\n"
    "        }\n"
    "        if (O) {\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NO; j++) {\n"
    "                acc[j][0] *= corr[0];\n"
    "                acc[j][1] *= corr[0];\n"
    "                acc[j][2] *= corr[1];\n"
    "                acc[j][3] *= corr[1];\n"
    "            }\n"
    "            kiln_warp_pm<E, BC / 16, NO>(acc, s, Vs, 1, LDV);\n"
    "        }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < 2; h++) {\n"
    "        const int row = h ? row1 : row0;\n"
    "        if (row >= Tq)\n"
    "            continue;\n"
    "        if (LSE && t == 0)\n"
    "            lse[row * L.rs[KILN_AS]] = m[h] + logf(l[h]);\n"
    "        if (O) {\n"
    "            const float inv = L.bk && l[h] == 0.0f ? 0.0f : 1.0f / l[h];\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NO; j++)\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < 2; e++) {\n"
    "                    const int c = 8 * j + 2 * t + e;\n"
    "                    if (c < DV)\n"
    "                        kiln_attn_st(o, row * L.rs[KILN_AO] + c, acc[j][2 * h + e] * inv);\n"
    "                }\n"
    "        }\n"
    "    }\n"
    "}\n"
    "/* dq (see codegen/cuda_attn.c): BR = 16 * NW query rows, BC keys a tile. */\n"
    "template <class E, int D, int DV, int NW, int BC, bool CAUSAL, class BX>\n"
    "__device__ __forceinline__ void kiln_attn_dq(const E *q, const E *k, const E *v,\n"
    "                                             const E *dO, const float *lse,\n"
    "                                             const float *delta, E *dq, int Tq,\n"
    "                                             int Tk, float scale, const kiln_attn_lay &L,\n"
    "                                             const BX *bx)\n"
    "{\n"
    "    enum { BR = 16 * NW, NTH = 32 * NW, DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16,\n"
    "           LDK = DP + 8, LDV = DVP + 8, NS = BC / 8, NQ = DP / 8 };\n"
    "    __shared__ E Qs[BR * LDK];\n"
    "    __shared__ E Os[BR * LDV];\n"
    "    __shared__ E Ks[BC * LDK];\n"
    "    __shared__ E Vs[BC * LDV];\n"
    "    const int nqt = (Tq + BR - 1) / BR, nkt = (Tk + BC - 1) / BC;\n"
    "    const int qt = nqt - 1 - (int)blockIdx.x % nqt, bh = (int)blockIdx.x / nqt;\n"
    "    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    q += kiln_attn_at(L, KILN_AQ, bh);\n"
    "    dO += kiln_attn_at(L, KILN_AO, bh);\n"
    "    k += kiln_attn_at(L, KILN_AK, bh);\n"
    "    v += kiln_attn_at(L, KILN_AV, bh);\n"
    "    kiln_attn_tile<E, BR, D, DP, LDK, NTH>(Qs, q, qt * BR, Tq, L.rs[KILN_AQ]);\n"
    "    lse += kiln_attn_at(L, KILN_AS, bh);\n"
    "    delta += kiln_attn_at(L, KILN_AS, bh);\n"
    "    dq += kiln_attn_at(L, KILN_ADQ, bh);\n"
    "    kiln_attn_tile<E, BR, DV, DVP, LDV, NTH>(Os, dO, qt * BR, Tq, L.rs[KILN_AO]);\n"
    "    const int row0 = qt * BR + 16 * w + g, row1 = row0 + 8, srs = L.rs[KILN_AS];\n"
    "    const float ls[2] = {row0 < Tq ? lse[row0 * srs] : 0.0f,\n"
    "                         row1 < Tq ? lse[row1 * srs] : 0.0f};\n"
    "    const float dl[2] = {row0 < Tq ? delta[row0 * srs] : 0.0f,\n"
    "                         row1 < Tq ? delta[row1 * srs] : 0.0f};\n"
    "    float acc[NQ][4];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NQ; j++)\n"
    "        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;\n"
    "    const int kend = CAUSAL ? ((qt + 1) * BR < Tk ? (qt + 1) * BR : Tk) : Tk;\n"
    "    const int ntiles = CAUSAL ? (kend + BC - 1) / BC : nkt;\n"
    "    const int kt0 = L.win && qt * BR + 1 > L.win ? (qt * BR + 1 - L.win) / BC : 0;\n"
    "    const float slope = kiln_attn_slope(L, bh);\n"
    "    for (int kt = kt0; kt < ntiles; kt++) {\n"
    "        /* a key tile a mask drops whole adds nothing */\n"
    "        if (!kiln_attn_sync_keeps<BR, BC, NTH, CAUSAL>(L, bx, bh, qt * BR, Tq, kt * BC, Tk))\n"
    "            continue;\n"
    "        kiln_attn_tile<E, BC, D, DP, LDK, NTH>(Ks, k, kt * BC, Tk, L.rs[KILN_AK]);\n"
    "        kiln_attn_tile<E, BC, DV, DVP, LDV, NTH>(Vs, v, kt * BC, Tk, L.rs[KILN_AV]);\n"
    "        __syncthreads();\n"
    "        float s[NS][4], dp[NS][4];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++)\n"
    "                s[j][e] = dp[j][e] = 0.0f;\n"
    "        kiln_warp_mm<E, DP, NS>(s, Qs + 16 * w * LDK, LDK, Ks, LDK, 1);\n"
    "        kiln_warp_mm<E, DVP, NS>(dp, Os + 16 * w * LDV, LDV, Vs, LDV, 1);\n"
    "        const bool edge = (kt + 1) * BC > Tk || (CAUSAL && (kt + 1) * BC - 1 > qt * BR) ||\n"
    "                          (L.win && qt * BR + BR - 1 - kt * BC >= L.win);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                const int row = e < 2 ? row0 : row1;\n"
    "                float x = s[j][e] * scale;\n"
    "                if (L.ah)\n"
    "                    x += slope * (float)(kt * BC + 8 * j + 2 * t + (e & 1) - row);\n"
    "                if (L.bk && kt * BC + 8 * j + 2 * t + (e & 1) < Tk && row < Tq)\n"
    "                    x = kiln_attn_bx(L, bx, bh, row, kt * BC + 8 * j + 2 * t + (e & 1), x);\n"
    "                float p = L.bk && x == -KILN_INF ? 0.0f : expf(x - ls[e >> 1]);\n"
    "                if (edge) {\n"
    "                    const int col = kt * BC + 8 * j + 2 * t + (e & 1);\n"
    "                    if (col >= Tk || (CAUSAL && col > row) || (L.win && row - col >= L.win))\n"
    "                        p = 0.0f;\n"
    "                }\n"
    "                if (row >= Tq)\n"
    "                    p = 0.0f;\n"
    "                s[j][e] = p * (dp[j][e] - dl[e >> 1]);\n"
    "            }\n"
    "        kiln_warp_pm<E, BC / 16, NQ>(acc, s, Ks, 1, LDK);\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < 2; h++) {\n"
    "        const int row = h ? row1 : row0;\n"
    "        if (row >= Tq)\n"
    "            continue;\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NQ; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 2; e++) {\n"
    "                const int c = 8 * j + 2 * t + e;\n"
    "                if (c < D)\n"
    "                    kiln_attn_st(dq, row * L.rs[KILN_ADQ] + c, acc[j][2 * h + e] * scale);\n"
    "            }\n"
    "    }\n"
    "}\n"
    "/* dk and dv (see codegen/cuda_attn.c): BC = 16 * NW keys per block, BQ\n"
    " * queries a tile. DK, DVW: which of the two it writes. */\n"
    "template <class E, int D, int DV, int NW, int BQ, bool CAUSAL, bool DK, bool DVW, class BX>\n"
    "__device__ __forceinline__ void kiln_attn_dkdv(const E *q, const E *k, const E *v,\n"
    "                                               const E *dO, const float *lse,\n"
    "                                               const float *delta, E *dk, E *dv,\n"
    "                                               int Tq, int Tk, float scale,\n"
    "                                               const kiln_attn_lay &L, const BX *bx)\n"
    "{\n"
    "    enum { BC = 16 * NW, NTH = 32 * NW, DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16,\n"
    "           LDK = DP + 8, LDV = DVP + 8, NS = BQ / 8, NK = DP / 8, NV = DVP / 8 };\n"
    "    __shared__ E Ks[BC * LDK];\n"
    "    __shared__ E Vs[DK ? BC * LDV : 1];\n"
    "    __shared__ E Qs[BQ * LDK];\n"
    "    __shared__ E Os[BQ * LDV];\n"
    "    __shared__ float Ls[BQ], Dl[BQ];\n"
    "    const int nkt = (Tk + BC - 1) / BC, nqt = (Tq + BQ - 1) / BQ;\n"
    "    /* one block per (key tile, key/value item): bh0 is the item's first\n"
    "     * query item; grouped heads walk their L.g query items in turn */\n"
    "    const int kt = (int)blockIdx.x % nkt, bh0 = (int)blockIdx.x / nkt * L.g;\n"
    "    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    q += kiln_attn_at(L, KILN_AQ, bh0);\n"
    "    dO += kiln_attn_at(L, KILN_AO, bh0);\n"
    "    k += kiln_attn_at(L, KILN_AK, bh0);\n"
    "    if (DK)\n"
    "        v += kiln_attn_at(L, KILN_AV, bh0);\n"
    "    kiln_attn_tile<E, BC, D, DP, LDK, NTH>(Ks, k, kt * BC, Tk, L.rs[KILN_AK]);\n"
    "    if (DK)\n"
    "        kiln_attn_tile<E, BC, DV, DVP, LDV, NTH>(Vs, v, kt * BC, Tk, L.rs[KILN_AV]);\n"
    "    lse += kiln_attn_at(L, KILN_AS, bh0);\n"
    "    if (DK) {\n"
    "        delta += kiln_attn_at(L, KILN_AS, bh0);\n"
    "        dk += kiln_attn_at(L, KILN_ADK, bh0);\n"
    "    }\n"
    "    if (DVW)\n"
    "        dv += kiln_attn_at(L, KILN_ADV, bh0);\n"
    "    const int key0 = kt * BC + 16 * w + g;\n"
    "    float ak[DK ? NK : 1][4], av[DVW ? NV : 1][4];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < (DK ? NK : 1); j++)\n"
    "        ak[j][0] = ak[j][1] = ak[j][2] = ak[j][3] = 0.0f;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < (DVW ? NV : 1); j++)\n"
    "        av[j][0] = av[j][1] = av[j][2] = av[j][3] = 0.0f;\n"
    "    /* causal: queries before the tile's first key keep none of its keys; a\n"
    "     * window: nor do the queries win or more after its last key */\n"
    "    const int qt0 = CAUSAL ? kt * BC / BQ : 0;\n"
    "    const int qe = L.win && kt * BC + BC - 1 + L.win < Tq ? kt * BC + BC - 1 + L.win : Tq;\n"
    "    const int nqe = L.win ? (qe + BQ - 1) / BQ : nqt;\n"
    "    for (int u = 0; u < L.g; u++) {\n"
    "    if (u > 0) { /* the group's next query item */\n"
    "        q += kiln_attn_at(L, KILN_AQ, bh0 + u) - kiln_attn_at(L, KILN_AQ, bh0 + u - 1);\n"
    "        dO += kiln_attn_at(L, KILN_AO, bh0 + u) - kiln_attn_at(L, KILN_AO, bh0 + u - 1);\n"
    "        const long long ds = kiln_attn_at(L, KILN_AS, bh0 + u) -\n"
    "                             kiln_attn_at(L, KILN_AS, bh0 + u - 1);\n"
    "        lse += ds;\n"
    "        if (DK)\n"
    "            delta += ds;\n"
    "    }\n"
    "    const float slope = kiln_attn_slope(L, bh0 + u);\n"
    "    for (int qt = qt0; qt < nqe; qt++) {\n"
    "        /* a query tile a mask drops whole adds nothing */\n"
    "        if (!kiln_attn_sync_keeps<BQ, BC, NTH, CAUSAL>(L, bx, bh0 + u, qt * BQ, Tq, kt * BC, Tk))\n"
    "            continue;\n"
    "        kiln_attn_tile<E, BQ, D, DP, LDK, NTH>(Qs, q, qt * BQ, Tq, L.rs[KILN_AQ]);\n"
    "        kiln_attn_tile<E, BQ, DV, DVP, LDV, NTH>(Os, dO, qt * BQ, Tq, L.rs[KILN_AO]);\n"
    "        for (int i = threadIdx.x; i < BQ; i += NTH) {\n"
    "            const int r = qt * BQ + i;\n"
    "            Ls[i] = r < Tq ? lse[r * L.rs[KILN_AS]] : 0.0f;\n"
    "            Dl[i] = r < Tq && DK ? delta[r * L.rs[KILN_AS]] : 0.0f;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        /* transposed scores: rows are this warp's keys, columns queries */\n"
    "        float s[NS][4];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;\n"
    "        kiln_warp_mm<E, DP, NS>(s, Ks + 16 * w * LDK, LDK, Qs, LDK, 1);\n"
    "        const bool edge = (qt + 1) * BQ > Tq || (CAUSAL && qt * BQ < (kt + 1) * BC - 1) ||\n"
    "                          (L.win && qt * BQ + BQ - 1 - kt * BC >= L.win);\n"
    "        kiln_attn_pt<NS, CAUSAL>(s, Ls, scale, edge, qt * BQ, Tq, key0, t, L.win, slope, L, bx,\n"
    "                                 bh0 + u, Tk);\n"
    "        if (DVW)\n"
    "            kiln_warp_pm<E, BQ / 16, NV>(av, s, Os, 1, LDV);\n"
    "        if (DK) {\n"
    "            float dp[NS][4];\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NS; j++)\n"
    "                dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;\n"
    "            kiln_warp_mm<E, DVP, NS>(dp, Vs + 16 * w * LDV, LDV, Os, LDV, 1);\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < 4; e++)\n"
    "                    s[j][e] *= dp[j][e] - Dl[8 * j + 2 * t + (e & 1)];\n"
    "            kiln_warp_pm<E, BQ / 16, NK>(ak, s, Qs, 1, LDK);\n"
    "        }\n"
    "    }\n"
    "    }\n"
    "    kiln_attn_st_kv<E, D, DV, DK ? NK : 1, DVW ? NV : 1, DK, DVW>(dk, dv, ak, av, L, key0, Tk, t,\n"
    "                                                                scale);\n"
    "}\n"
    "\n";

/* Tile sizes: the largest (warps, second tile) whose static shared memory
 * fits in 48 KiB, preferring 4 warps; false when even one warp of 16 rows
 * does not fit (head sizes of several hundred). */
bool cg_cuda_attn_tiles(const CgCudaAttn *a, int *nw, int *bt)
{
    int64_t es = a->dt == DT_BF16 ? 2 : 4;
    int64_t ldk = cg_pad16(a->d) + 8, ldv = cg_pad16(a->dv) + 8;
    static const int cand[][2] = {{4, 64}, {4, 32}, {2, 32}, {2, 16}, {1, 16}};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        int64_t r = 16 * cand[i][0], c = cand[i][1], bytes;
        if (a->kind == CG_CUDA_ATTN_FWD)
            bytes = es * (r * ldk + c * ldk + (a->want_o ? c * ldv : 1));
        else if (a->kind == CG_CUDA_ATTN_DQ)
            bytes = es * (r * ldk + r * ldv + c * ldk + c * ldv);
        else if (a->kind == CG_CUDA_ATTN_DKDV)
            bytes = es * (r * ldk + (a->want_dk ? r * ldv : 1) + c * ldk + c * ldv) + 8 * c;
        else /* BWD: the dk/dv tiles and dS [queries][keys + 8] */
            bytes = es * (r * ldk + r * ldv + c * ldk + c * ldv + c * (r + 8)) + 8 * c + 4;
        /* registers: the second tile's accumulators grow with it; past
         * head size 64 a backward warp keeps its tiles at 32 columns */
        if (a->kind != CG_CUDA_ATTN_FWD && c > 32 && (a->d > 64 || a->dv > 64))
            continue;
        if (bytes <= 48 * 1024) {
            *nw = cand[i][0];
            *bt = (int)c;
            return true;
        }
    }
    return false;
}

int64_t cg_cuda_attn_blocks(const CgCudaAttn *a, int nw)
{
    int64_t rows = a->kind == CG_CUDA_ATTN_DKDV || a->kind == CG_CUDA_ATTN_BWD ? a->tk : a->tq;
    /* dk/dv: one block per key tile of each key/value item (grouped heads) */
    int64_t items = a->kind == CG_CUDA_ATTN_DKDV && a->lay.g > 1 ? a->bh / a->lay.g : a->bh;
    return items * ((rows + 16 * nw - 1) / (16 * nw));
}

/* The tile pairs a's function visits with tiles (nw, bt): *pairs, the kept
 * tile cells (query x key), and *other, the rows of the other operand it
 * reads summed over its blocks (whole tiles, the last one ragged; causal:
 * the diagonal and below), per batch*head. */
static void attn_visits(const CgCudaAttn *a, int nw, int bt, double *pairs, double *other)
{
    bool fwd = a->kind == CG_CUDA_ATTN_FWD,
         dkdv = a->kind == CG_CUDA_ATTN_DKDV || a->kind == CG_CUDA_ATTN_BWD;
    /* own: the block's tile (queries; keys for dk/dv); other: visited tiles */
    int64_t br = fwd || !dkdv ? 16 * nw : bt, bc = dkdv ? 16 * nw : bt;
    int64_t nq = (a->tq + br - 1) / br;
    *pairs = *other = 0;
    for (int64_t qt = 0; qt < nq && !dkdv; qt++) {
        int64_t r0 = qt * br, r1 = r0 + br < a->tq ? r0 + br : a->tq;
        int64_t kend = a->causal ? (r1 < a->tk ? r1 : a->tk) : a->tk;
        /* keys of the visited tiles (whole tiles, the last one ragged) */
        int64_t kv = (kend + bc - 1) / bc * bc;
        if (kv > a->tk)
            kv = a->tk;
        *pairs += (double)(r1 - r0) * (double)kv;
        *other += (double)kv;
    }
    if (dkdv) /* each key tile reads the query tiles from its diagonal on */
        for (int64_t kt = 0; kt * bc < a->tk; kt++) {
            int64_t q0 = a->causal ? kt * bc / br * br : 0;
            int64_t keys = (kt + 1) * bc < a->tk ? bc : a->tk - kt * bc;
            *other += (double)(a->tq - q0);
            *pairs += (double)keys * (double)(a->tq - q0);
        }
}

/* Bytes of one row of the operand a's blocks re-read (k [+ v] for the
 * forward; k, v for dq; q, dO, lse [, delta] for dk/dv), and its rows per
 * batch*head. */
static double attn_other_row(const CgCudaAttn *a, int64_t *rows)
{
    int64_t es = a->dt == DT_BF16 ? 2 : 4;
    switch (a->kind) {
    case CG_CUDA_ATTN_FWD: *rows = a->tk; return (double)((a->d + (a->want_o ? a->dv : 0)) * es);
    case CG_CUDA_ATTN_DQ: *rows = a->tk; return (double)((a->d + a->dv) * es);
    case CG_CUDA_ATTN_DKDV: break;
    case CG_CUDA_ATTN_BWD: break; /* as dk/dv with dk: q, dO, lse, delta */
    }
    *rows = a->tq;
    return (double)((a->d + a->dv) * es) + (a->want_dk || a->kind == CG_CUDA_ATTN_BWD ? 8.0 : 4.0);
}

/* The bias or mask operand (a->lay.bias, the wrappers' bx): the bytes of
 * one element at its storage type (0: none), and the distinct bytes one
 * batch*head reads (its [Tq, Tk] slice, less the axes it broadcasts). The
 * kernels read one element for every cell of the tile pairs they visit
 * (kiln_attn_bx); a mask's vote (kiln_attn_keeps) reads again up to each
 * thread's first kept cell, not counted. Which pairs a mask drops whole is
 * data, unknown here: every pair is counted. */
static double attn_bias_es(const CgCudaAttn *a)
{
    if (!a->lay.bias || !a->lay.nh)
        return 0;
    return a->bdt == DT_U8 ? 1.0 : a->bdt == DT_BF16 ? 2.0 : 4.0;
}
static double attn_bias_item(const CgCudaAttn *a)
{
    return attn_bias_es(a) * (double)(a->lay.bis ? a->tq : 1) * (double)(a->lay.bjs ? a->tk : 1);
}

void cg_cuda_attn_cost(const CgCudaAttn *a, int nw, int bt, double *flops, double *bytes)
{
    int64_t es = a->dt == DT_BF16 ? 2 : 4, D = a->d, DV = a->dv, orows;
    bool fwd = a->kind == CG_CUDA_ATTN_FWD, dkdv = a->kind == CG_CUDA_ATTN_DKDV;
    bool bwd = a->kind == CG_CUDA_ATTN_BWD;
    double pairs, other, orow = attn_other_row(a, &orows);
    attn_visits(a, nw, bt, &pairs, &other);
    double f = 0, b = 0;
    if (fwd) {
        f = 2.0 * pairs * (double)(D + (a->want_o ? DV : 0));
        b = (double)(a->tq * D * es) + (a->want_o ? (double)(a->tq * DV * es) : 0) +
            (a->want_lse ? 4.0 * a->tq : 0);
    } else if (bwd) { /* S, dP, dV, dK, dQ; k, v once; dq, dk, dv once */
        f = 2.0 * pairs * (double)(3 * D + 2 * DV);
        b = (double)(a->tk * (D + DV) * es) + (double)(a->tq * D * es) +
            (double)(a->tk * (D + DV) * es);
        /* dQ's f32 accumulator, read and written on every visit of a row
         * but its first (stores) and its last (writes dq); the L2 rule
         * (cg_cuda_attn_reuse) discounts all but one write and one read */
        b += 8.0 * (double)cg_pad16(D) * (other - (double)a->tq);
    } else if (!dkdv) {
        f = 2.0 * pairs * (double)(2 * D + DV);
        b = (double)(a->tq * (D + DV) * es) + 8.0 * a->tq + (double)(a->tq * D * es);
    } else {
        f = 2.0 * pairs * (double)(D + DV + (a->want_dk ? D + DV : 0));
        b = (double)(a->tk * (D + (a->want_dk ? DV : 0)) * es) +
            (double)(a->tk * ((a->want_dk ? D : 0) + (a->want_dv ? DV : 0)) * es);
    }
    b += pairs * attn_bias_es(a); /* the bias or mask at every visited cell */
    *flops = f * (double)a->bh;
    *bytes = (b + other * orow) * (double)a->bh;
}

void cg_cuda_attn_reuse(const CgCudaAttn *a, int nw, int bt, double *reread, double *head)
{
    int64_t orows;
    double pairs, other, orow = attn_other_row(a, &orows);
    attn_visits(a, nw, bt, &pairs, &other);
    double again = other - (double)orows; /* every row is visited at least once */
    *reread = (again > 0 ? again : 0) * orow * (double)a->bh;
    *head = (double)orows * orow;
    /* the bias or mask: each distinct cell once from DRAM (batch*heads
     * that share a slice, bh / bdiv % bmod, read the same one), its other
     * visits from L2 while the slices stay there; a head's share of the
     * working set is the distinct bytes over the batch*heads (a [T, T]
     * bias shared by all: 1 / bh of it each) */
    if (attn_bias_es(a) > 0) {
        int64_t bdiv = a->lay.bdiv > 0 ? a->lay.bdiv : 1, bmod = a->lay.bmod > 0 ? a->lay.bmod : 1;
        int64_t slices = (a->bh + bdiv - 1) / bdiv;
        double bvis = pairs * attn_bias_es(a) * (double)a->bh, bown = attn_bias_item(a);
        double distinct = bown * (double)(slices < bmod ? slices : bmod);
        *reread += bvis > distinct ? bvis - distinct : 0;
        *head += distinct / (double)a->bh;
    }
    if (a->kind == CG_CUDA_ATTN_BWD) {
        /* dQ's accumulator, read and written by the same head's blocks:
         * its rows join the head's working set, and when they stay in L2
         * DRAM sees each row once written back and once read (8 x D
         * padded bytes), its other visits from L2 */
        double acc = 8.0 * (double)cg_pad16(a->d), extra = again - (double)orows;
        *reread += (extra > 0 ? extra : 0) * acc * (double)a->bh;
        *head += (double)orows * acc / 2;
    }
}

/* a's layout: a->lay, or the plain one of bh, tq, tk, d, dv when a->lay.nh
 * is 0 (ir.h's IrAttnLayout). */
static IrAttnLayout attn_layout(const CgCudaAttn *a)
{
    if (a->lay.nh)
        return a->lay;
    IrAttnLayout L = {.nb = a->bh, .nh = 1, .Tq = a->tq, .Tk = a->tk, .D = a->d, .Dv = a->dv};
    L.q = L.dq = (IrAttnStride){a->tq * a->d, 0, a->d, 0};
    L.k = L.dk = (IrAttnStride){a->tk * a->d, 0, a->d, 0};
    L.v = L.dv = (IrAttnStride){a->tk * a->dv, 0, a->dv, 0};
    L.o = (IrAttnStride){a->tq * a->dv, 0, a->dv, 0};
    L.st = (IrAttnStride){a->tq, 0, 1, 0};
    return L;
}

bool cg_print_cuda_attn(CgBuf *b, const CgCudaAttn *a, const char *name, CgCudaFn *fn, Diag *d)
{
    int nw, bt;
    if (!(a->dt == DT_F32 || a->dt == DT_BF16) || !cg_cuda_attn_tiles(a, &nw, &bt)) {
        snprintf(d->msg, sizeof d->msg,
                 "attention kernel %s: head sizes %lld/%lld in %s do not fit the CUDA tiles "
                 "(expected f32 or bf16, head sizes up to about 256)",
                 name, (long long)a->d, (long long)a->dv, dtype_name(a->dt));
        return false;
    }
    /* in-head indices are 32-bit (registers), head offsets 64-bit */
    IrAttnLayout L = attn_layout(a);
    const IrAttnStride *st[8] = {&L.q, &L.k, &L.v, &L.o, &L.dq, &L.dk, &L.dv, &L.st};
    int64_t lim = (int64_t)1 << 31, span = 0;
    for (int x = 0; x < 8; x++) {
        int64_t T = x == 1 || x == 2 || x == 5 || x == 6 ? a->tk : a->tq;
        int64_t e = T * st[x]->rs;
        span = e > span ? e : span;
    }
    if (span >= lim || cg_cuda_attn_blocks(a, nw) >= lim) {
        snprintf(d->msg, sizeof d->msg,
                 "attention kernel %s: %lld x %lld positions of head size %lld do not fit the "
                 "kernels' 32-bit in-head indices",
                 name, (long long)a->bh, (long long)(a->tq > a->tk ? a->tq : a->tk),
                 (long long)a->d);
        return false;
    }
    const char *E = a->dt == DT_BF16 ? "kiln_bf16" : "float";
    const char *C = a->causal ? "true" : "false";
    long long D = a->d, DV = a->dv;
    /* the layout as a literal the inlined templates fold */
    CgBuf lay = {0};
    cg_printf(&lay, "    const kiln_attn_lay L = {%lld, {", (long long)L.nh);
    for (int f = 0; f < 4; f++)
        for (int x = 0; x < 8; x++) {
            const IrAttnStride *t = st[x];
            long long v = f == 0 ? t->bs : f == 1 ? t->hs : f == 2 ? t->off : t->rs;
            cg_printf(&lay, "%s%lldLL%s", x ? ", " : "", v, x < 7 ? "" : f < 3 ? "}, {" : "}");
        }
    /* g, nhk 0 (a layout made by hand, not by ir_attn_layout): not grouped */
    long long g = L.g > 1 ? L.g : 1, nhk = L.nhk > 0 ? L.nhk : L.nh > 0 ? L.nh : 1;
    cg_printf(&lay, ", %lld, %lld, %lld, %lld, %d, %lld, %lld, %lldLL, %lldLL, %lldLL};\n", g,
              g > 1 ? nhk : (long long)L.nh, (long long)L.window, (long long)L.ah,
              a->lay.nh ? L.bias : 0, (long long)L.bis, (long long)L.bjs,
              (long long)(L.bdiv > 0 ? L.bdiv : 1), (long long)(L.bmod > 0 ? L.bmod : 1),
              (long long)L.bbs);
    /* the bias or mask: its param, of storage type a->bdt (BX) */
    const char *BX = !L.bias ? "float"
                     : a->bdt == DT_U8 ? "unsigned char"
                     : a->bdt == DT_BF16 ? "kiln_bf16" : "float";
    char bxp[96], bxa[64];
    snprintf(bxp, sizeof bxp, L.bias ? ", const %s *__restrict__ bx" : "", BX);
    snprintf(bxa, sizeof bxa, L.bias ? "bx" : "(const float *)0");
    /* a forward of 4 warps: bounds by architecture (KILN_ATTN_FWD4_*) */
    if (a->kind == CG_CUDA_ATTN_FWD && nw == 4)
        cg_printf(b, "extern \"C\" __global__ void __launch_bounds__(KILN_ATTN_FWD4_%s) %s(",
                  a->dt == DT_BF16 ? "BF16" : "F32", name);
    else
        cg_printf(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(", 32 * nw, name);
    /* the signature: only the buffers this function reads or writes */
    switch (a->kind) {
    case CG_CUDA_ATTN_FWD:
        cg_printf(b, "const %s *__restrict__ q, const %s *__restrict__ k", E, E);
        if (a->want_o)
            cg_printf(b, ", const %s *__restrict__ v, %s *__restrict__ o", E, E);
        if (a->want_lse)
            cg_puts(b, ", float *__restrict__ lse");
        cg_printf(b, "%s)\n{\n    typedef %s kiln_attn_E;\n%s    kiln_attn_fwd<%s, %lld, %lld, %d, %d, %s, %s, %s>(q, k, %s, %s, %s, "
                     "%d, %d, %.9ef, L, %s);\n}\n",
                  bxp, E, lay.s, E, D, DV, nw, bt, C, a->want_o ? "true" : "false",
                  a->want_lse ? "true" : "false", a->want_o ? "v" : "(const kiln_attn_E *)0",
                  a->want_o ? "o" : "(kiln_attn_E *)0", a->want_lse ? "lse" : "(float *)0",
                  (int)a->tq, (int)a->tk, a->scale, bxa);
        break;
    case CG_CUDA_ATTN_DQ:
        cg_printf(b,
                  "const %s *__restrict__ q, const %s *__restrict__ k, const %s *__restrict__ v, "
                  "const %s *__restrict__ dO, const float *__restrict__ lse, const float "
                  "*__restrict__ delta, %s *__restrict__ dq%s)\n{\n%s    kiln_attn_dq<%s, %lld, "
                  "%lld, %d, %d, %s>(q, k, v, dO, lse, delta, dq, %d, %d, %.9ef, L, %s);\n}\n",
                  E, E, E, E, E, bxp, lay.s, E, D, DV, nw, bt, C, (int)a->tq, (int)a->tk,
                  a->scale, bxa);
        break;
    case CG_CUDA_ATTN_DKDV:
        cg_printf(b, "const %s *__restrict__ q, const %s *__restrict__ k, ", E, E);
        if (a->want_dk)
            cg_printf(b, "const %s *__restrict__ v, ", E);
        cg_printf(b, "const %s *__restrict__ dO, const float *__restrict__ lse", E);
        if (a->want_dk)
            cg_printf(b, ", const float *__restrict__ delta, %s *__restrict__ %s", E,
                      a->one_dkv ? "dkv" : "dk");
        if (a->want_dv && !a->one_dkv)
            cg_printf(b, ", %s *__restrict__ dv", E);
        cg_printf(b,
                  "%s)\n{\n    typedef %s kiln_attn_E;\n%s    kiln_attn_dkdv<%s, %lld, %lld, %d, %d, %s, %s, %s>(q, k, %s, dO, lse, "
                  "%s, %s, %s, %d, %d, %.9ef, L, %s);\n}\n",
                  bxp, E, lay.s, E, D, DV, nw, bt, C, a->want_dk ? "true" : "false",
                  a->want_dv ? "true" : "false", a->want_dk ? "v" : "(const kiln_attn_E *)0",
                  a->want_dk ? "delta" : "(const float *)0",
                  a->one_dkv ? "dkv" : a->want_dk ? "dk" : "(kiln_attn_E *)0",
                  a->one_dkv ? "dkv" : a->want_dv ? "dv" : "(kiln_attn_E *)0", (int)a->tq,
                  (int)a->tk, a->scale, bxa);
        break;
    case CG_CUDA_ATTN_BWD:
        if (a->one_dkv)
            cg_printf(b, "const %s *__restrict__ q, const %s *__restrict__ k, const %s "
                         "*__restrict__ v, const %s *__restrict__ dO, const float *__restrict__ "
                         "lse, const float *__restrict__ delta, %s *dqkv, unsigned char *part)"
                         "\n{\n%s    kiln_attn_bwd<%s, %lld, %lld, %d, %d, %s, %d>(q, k, v, dO, "
                         "lse, delta, dqkv, dqkv, dqkv, part, %d, %d, %.9ef, L);\n}\n",
                      E, E, E, E, E, lay.s, E, D, DV, nw, bt, C, (int)CG_CUDA_SCRATCH_ZERO,
                      (int)a->tq, (int)a->tk, a->scale);
        else
            cg_printf(b, "const %s *__restrict__ q, const %s *__restrict__ k, const %s "
                         "*__restrict__ v, const %s *__restrict__ dO, const float *__restrict__ "
                         "lse, const float *__restrict__ delta, %s *__restrict__ dq, %s "
                         "*__restrict__ dk, %s *__restrict__ dv, unsigned char *part)\n{\n%s"
                         "    kiln_attn_bwd<%s, %lld, %lld, %d, %d, %s, %d>(q, k, v, dO, lse, "
                         "delta, dq, dk, dv, part, %d, %d, %.9ef, L);\n}\n",
                      E, E, E, E, E, E, E, lay.s, E, D, DV, nw, bt, C,
                      (int)CG_CUDA_SCRATCH_ZERO, (int)a->tq, (int)a->tk, a->scale);
        break;
    }
    free(lay.s);
    if (fn) {
        fn->rows = fn->cols = false;
        fn->split = 1;
        fn->threads = 32 * nw;
        fn->blocks = cg_cuda_attn_blocks(a, nw);
        fn->n = fn->blocks;
        fn->attn = true;
        fn->mma = a->dt == DT_BF16;
        cg_cuda_attn_cost(a, nw, bt, &fn->flops, &fn->bytes);
        cg_cuda_attn_reuse(a, nw, bt, &fn->attn_reread, &fn->attn_head);
        fn->attn_tiles = fn->blocks / (a->bh > 0 ? a->bh : 1);
        fn->attn_fwd = a->kind == CG_CUDA_ATTN_FWD;
        fn->attn_kind = (int)a->kind;
        fn->attn_nw = nw;
        fn->attn_bt = bt;
        fn->attn_d = (int)a->d;
        fn->attn_dv = (int)a->dv;
        fn->attn_o = a->kind != CG_CUDA_ATTN_FWD || a->want_o;
        fn->attn_dk = a->kind != CG_CUDA_ATTN_DKDV || a->want_dk;
        fn->part = a->kind == CG_CUDA_ATTN_BWD;
        fn->part_bytes = fn->part ? cg_cuda_attn_bwd_scratch(a, bt) : 0;
    }
    return true;
}

/* The CUDA function of plan kernel k (k->attn.kind != CG_ATTN_NONE, its
 * params stored as storage[i]): maps the kernel's CgAttn onto a CgCudaAttn
 * and prints it (al: the variant's buffer classes, NULL: params alias only
 * when they name one tensor); dies when its tensors do not share one storage type (see
 * cuda_plan.c, which keeps them together) or the head size does not fit. */
int cg_print_cuda_attn_kernel(CgBuf *b, const CgKernel *k, const char *name,
                              const DType *storage, const CgCudaAlias *al, CgCudaFn **fn)
{
    const CgAttn *a = &k->attn;
    CgCudaAttn c = {.causal = a->causal, .scale = a->scale, .dt = storage[a->q], .bh = a->batch,
                    .tq = a->Tq, .tk = a->Tk, .d = a->D, .dv = a->Dv, .lay = a->lay};
    int order[9], n = 0;
    order[n++] = a->q;
    order[n++] = a->k;
    switch (a->kind) {
    case CG_ATTN_FWD:
        c.kind = CG_CUDA_ATTN_FWD;
        c.want_o = a->o >= 0;
        c.want_lse = a->lse >= 0;
        if (c.want_o) {
            order[n++] = a->v;
            order[n++] = a->o;
        }
        if (c.want_lse)
            order[n++] = a->lse;
        break;
    case CG_ATTN_DQ:
        c.kind = CG_CUDA_ATTN_BWD;
        c.one_dkv = true;
        if (a->dqkv && cg_cuda_attn_bwd_fits(&c)) { /* the dk/dv step runs it */
            *fn = NULL;
            return 0;
        }
        c.one_dkv = false;
        c.kind = CG_CUDA_ATTN_DQ;
        order[n++] = a->v;
        order[n++] = a->dO;
        order[n++] = a->lse;
        order[n++] = a->delta;
        order[n++] = a->dq;
        break;
    default:
        c.kind = CG_CUDA_ATTN_DKDV;
        c.want_dk = a->dk >= 0;
        c.want_dv = a->dv >= 0;
        if (c.want_dk)
            order[n++] = a->v;
        order[n++] = a->dO;
        order[n++] = a->lse;
        c.one_dkv = c.want_dk && c.want_dv && a->dk == a->dv; /* attention_dqkv */
        if (a->dqkv) {
            c.kind = CG_CUDA_ATTN_BWD; /* dq too, into the same buffer */
            if (!cg_cuda_attn_bwd_fits(&c))
                c.kind = CG_CUDA_ATTN_DKDV;
        }
        if (c.want_dk) {
            order[n++] = a->delta;
            order[n++] = a->dk;
        }
        if (c.want_dv && !c.one_dkv)
            order[n++] = a->dv;
        break;
    }
    if (a->bias >= 0 && a->lay.bias) { /* the last param, in its own storage type */
        c.bdt = storage[a->bias];
        if (c.bdt != DT_F32 && c.bdt != DT_BF16 && c.bdt != DT_U8)
            die("cuda: attention kernel %s: bias stored as %s (expected f32, bf16 or u8)", name,
                dtype_name(c.bdt));
        order[n++] = a->bias;
    }
    for (int i = 0; i < n; i++) {
        int p = order[i];
        bool stat = p == a->lse || p == a->delta;
        if (p == a->bias)
            continue;
        if (p < 0 || storage[p] != (stat ? DT_F32 : c.dt))
            die("cuda: attention kernel %s: param %d stored as %s (expected %s)", name, p,
                p < 0 ? "nothing" : dtype_name(storage[p]), dtype_name(stat ? DT_F32 : c.dt));
        /* the kernels read inputs of other tiles after writing their own
         * outputs: an output must not share a buffer with anything */
        for (int j = 0; j < n && k->params.v[p].out; j++)
            if (j != i && (al ? al->all || al->cls[order[j]] == al->cls[p]
                              : k->params.v[order[j]].tensor == k->params.v[p].tensor))
                die("cuda: attention kernel %s: an output shares its buffer", name);
    }
    CgCudaFn *f = xcalloc(1, sizeof *f);
    f->name = xstrdup(name);
    f->param = xmalloc(sizeof(int) * (size_t)n);
    memcpy(f->param, order, sizeof(int) * (size_t)n);
    f->nparam = n;
    Diag d = {{0}};
    if (!cg_print_cuda_attn(b, &c, name, f, &d))
        die("cuda: %s", d.msg);
    *fn = f;
    return 1;
}
