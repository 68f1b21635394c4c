/* cuda_attn_bwd.c - the fused attention backward (CG_CUDA_ATTN_BWD): dq,
 * dk and dv of one attention in one kernel, FlashAttention-2 style, for
 * attention_dqkv (cuda_attn.c prints the wrapper; this file holds its
 * device template and its scratch geometry).
 *
 * One block per (batch*head, key tile j) keeps K_j, V_j in shared memory
 * and walks the query tiles i it sees (causal: from its diagonal on; the
 * skipped tiles cost nothing). Per visit it recomputes S = Q_i K_j^T, P =
 * exp(S scale - lse_i) and dP = dO_i V_j^T, then dS = P (dP - delta_i), and
 * runs five products: S, dP, dV_j += P^T dO_i, dK_j += dS^T Q_i (in
 * registers, stored once at the end, as the dk/dv kernel does), and the
 * block's share of dQ_i, dS K_j (dS through shared memory, rounded to the
 * storage type like P and dS of the other products).
 *
 * dQ without float atomics, deterministic: the shares of query tile i are
 * summed in a fixed order, key tiles from the last one that keeps any of
 * i's keys (the diagonal) down to tile 0, into an f32 accumulator in the
 * partials scratch (CgCudaProgram.part_bytes, at CG_CUDA_SCRATCH_ZERO).
 * A counter per (batch*head, i) in the scratch's zeroed front says how
 * many shares are in: the block of key tile j, whose rank in i's order is
 * r = last(i) - j, waits (thread 0 spins on a volatile load) until the
 * counter is r, adds its share to the accumulator (the first, r = 0,
 * stores without reading, so the scratch needs no zeroing), fences, and
 * sets the counter to r + 1. Key tile 0 is always last: it adds, scales,
 * rounds, stores dQ_i straight into dq (attention_dqkv's q columns; no
 * convert kernel), and sets the counter back to 0, so the next launch or
 * a replayed CUDA graph finds every counter zero.
 *
 * Forward progress: a block only waits on blocks that started before it.
 * A block does not take its tile from blockIdx (the hardware may start
 * blocks in any order) but from a ticket, an atomicAdd on the scratch's
 * first word at its start (as CUB's decoupled look-back scan does):
 * ticket n works on batch*head n / nkt and key tile nkt - 1 - n % nkt,
 * the last key tile of a head first, so every block whose share precedes
 * n's in some i's order holds a smaller ticket: it started earlier, is
 * resident or done, and itself waits only on smaller tickets. The block
 * that draws the last ticket sets the word back to 0 (no block draws after
 * it). With the query tiles visited from the diagonal up, key tile j's
 * visit of i needs tile j + 1's visit of i, which is one visit earlier in
 * j + 1's walk: in the steady state no block waits long.
 *
 * The attention variants (grouped heads, windows, ALiBi) are not fused
 * here (cg_cuda_attn_bwd_fits): the dq and dk/dv kernels run them. (With
 * ALiBi's term the bf16 kernel of head size 64 spilled on sm_90: it sits
 * at 255 registers without it.)
 *
 * Under the emulator blocks run one after another, so a wait that is not
 * met at its first look never is: the kernel calls __trap() there, which
 * the emulator reports as a launch error, instead of spinning forever (the
 * GPU path spins with __nanosleep; see docs/emulator.md). */
#include "cg_cuda.h"

#include <string.h>

const char cg_cuda_attn_bwd_lib[] =
    "/* ---- fused attention backward (codegen/cuda_attn_bwd.c) ---- */\n"
    "__device__ __forceinline__ void kiln_attn_put(float *p, float v) { *p = v; }\n"
    "__device__ __forceinline__ void kiln_attn_put(kiln_bf16 *p, float v) { *p = kiln_f2bf(v); }\n"
    "/* Thread 0: returns when *c is r (written by blocks that started earlier). */\n"
    "__device__ __forceinline__ void kiln_attn_wait(const unsigned *c, unsigned r)\n"
    "{\n"
    "#ifdef KILN_CUDA_EMU_H\n"
    "    /* blocks run one after another: the wait is met now or never */\n"
    "    if (*(const volatile unsigned *)c != r)\n"
    "        __trap();\n"
    "#else\n"
    "    while (*(const volatile unsigned *)c != r)\n"
    "        __nanosleep(32);\n"
    "#endif\n"
    "    __threadfence();\n"
    "}\n"
    "/* BC = 16 * NW keys per block, BQ queries a tile; ZB: the accumulator's\n"
    " * offset in the scratch part (the counters sit at its start). */\n"
    "template <class E, int D, int DV, int NW, int BQ, bool CAUSAL, int ZB>\n"
    "__device__ __forceinline__ void kiln_attn_bwd(const E *q, const E *k, const E *v,\n"
    "                                              const E *dO, const float *lse,\n"
    "                                              const float *delta, E *dq, E *dk, E *dv,\n"
    "                                              unsigned char *part, int Tq, int Tk,\n"
    "                                              float scale, const kiln_attn_lay &L)\n"
    "{\n"
    "    enum { BC = 16 * NW, NTH = 32 * NW, DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16,\n"
    "           LDK = DP + 8, LDV = DVP + 8, LDS = BC + 8, NS = BQ / 8, NK = DP / 8,\n"
    "           NV = DVP / 8, RG = BQ / 16, CGN = NW / RG, NQC = NK / CGN };\n"
    "    static_assert(NW % RG == 0 && NK % CGN == 0, \"dQ: warps split rows, then columns\");\n"
    "    __shared__ E Ks[BC * LDK];\n"
    "    __shared__ E Vs[BC * LDV];\n"
    "    __shared__ E Qs[BQ * LDK];\n"
    "    __shared__ E Os[BQ * LDV];\n"
    "    __shared__ E Ss[BQ * LDS]; /* dS: rows the visit's queries, columns the block's keys */\n"
    "    __shared__ float Ls[BQ], Dl[BQ];\n"
    "    __shared__ int ticket;\n"
    "    unsigned *cnt = (unsigned *)part;\n"
    "    float *acc = (float *)(part + ZB);\n"
    "    const int nkt = (Tk + BC - 1) / BC, nqt = (Tq + BQ - 1) / BQ;\n"
    "    if (threadIdx.x == 0) {\n"
    "        const unsigned n = atomicAdd(cnt, 1u);\n"
    "        if (n + 1 == gridDim.x)\n"
    "            atomicExch(cnt, 0u); /* the last ticket: nobody draws after it */\n"
    "        ticket = (int)n;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    const int kt = nkt - 1 - ticket % nkt, bh = ticket / nkt;\n"
    "    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    const int rg = w % RG, cg = w / RG;\n"
    "    unsigned *qc = cnt + 1 + (long long)bh * nqt;\n"
    "    float *qa = acc + (long long)bh * nqt * BQ * DP;\n"
    "    q += kiln_attn_at(L, KILN_AQ, bh);\n"
    "    dO += kiln_attn_at(L, KILN_AO, bh);\n"
    "    k += kiln_attn_at(L, KILN_AK, bh);\n"
    "    v += kiln_attn_at(L, KILN_AV, bh);\n"
    "    kiln_attn_tile<E, BC, D, DP, LDK, NTH>(Ks, k, kt * BC, Tk, L.rs[KILN_AK]);\n"
    "    kiln_attn_tile<E, BC, DV, DVP, LDV, NTH>(Vs, v, kt * BC, Tk, L.rs[KILN_AV]);\n"
    "    lse += kiln_attn_at(L, KILN_AS, bh);\n"
    "    delta += kiln_attn_at(L, KILN_AS, bh);\n"
    "    dq += kiln_attn_at(L, KILN_ADQ, bh);\n"
    "    dk += kiln_attn_at(L, KILN_ADK, bh);\n"
    "    dv += kiln_attn_at(L, KILN_ADV, bh);\n"
    "    const int key0 = kt * BC + 16 * w + g;\n"
    "    float ak[NK][4], av[NV][4];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NK; j++)\n"
    "        ak[j][0] = ak[j][1] = ak[j][2] = ak[j][3] = 0.0f;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < NV; j++)\n"
    "        av[j][0] = av[j][1] = av[j][2] = av[j][3] = 0.0f;\n"
    "    const int qt0 = CAUSAL ? kt * BC / BQ : 0;\n"
    "    for (int qt = qt0; qt < nqt; qt++) {\n"
    "        __syncthreads();\n"
    "        kiln_attn_tile<E, BQ, D, DP, LDK, NTH>(Qs, q, qt * BQ, Tq, L.rs[KILN_AQ]);\n"
    "        kiln_attn_tile<E, BQ, DV, DVP, LDV, NTH>(Os, dO, qt * BQ, Tq, L.rs[KILN_AO]);\n"
    "        for (int i = threadIdx.x; i < BQ; i += NTH) {\n"
    "            const int r = qt * BQ + i;\n"
    "            Ls[i] = r < Tq ? lse[r * L.rs[KILN_AS]] : 0.0f;\n"
    "            Dl[i] = r < Tq ? delta[r * L.rs[KILN_AS]] : 0.0f;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        /* transposed scores: rows are this warp's keys, columns queries */\n"
    "        float s[NS][4], dp[NS][4];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++)\n"
    "                s[j][e] = dp[j][e] = 0.0f;\n"
    "        kiln_warp_mm<E, DP, NS>(s, Ks + 16 * w * LDK, LDK, Qs, LDK, 1);\n"
    "        const bool edge = (qt + 1) * BQ > Tq || (CAUSAL && qt * BQ < (kt + 1) * BC - 1);\n"
    "        kiln_attn_pt<NS, CAUSAL>(s, Ls, scale, edge, qt * BQ, Tq, key0, t, 0, 0.0f, L,\n"
    "                                 (const float *)0, 0, Tk);\n"
    "        kiln_warp_pm<E, BQ / 16, NV>(av, s, Os, 1, LDV);\n"
    "        kiln_warp_mm<E, DVP, NS>(dp, Vs + 16 * w * LDV, LDV, Os, LDV, 1);\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NS; j++)\n"
    "#pragma unroll\n"
    "            for (int e = 0; e < 4; e++) {\n"
    "                const int c = 8 * j + 2 * t + (e & 1);\n"
    "                s[j][e] *= dp[j][e] - Dl[c];\n"
    "                kiln_attn_put(&Ss[c * LDS + 16 * w + g + 8 * (e >> 1)], s[j][e]);\n"
    "            }\n"
    "        kiln_warp_pm<E, BQ / 16, NK>(ak, s, Qs, 1, LDK);\n"
    "        __syncthreads();\n"
    "        /* this block's share of dQ_i = dS K_j: warp w takes rows 16 rg.., columns\n"
    "         * 8 NQC cg.. */\n"
    "        float sq[NQC][4];\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < NQC; j++)\n"
    "            sq[j][0] = sq[j][1] = sq[j][2] = sq[j][3] = 0.0f;\n"
    "        kiln_warp_mm<E, BC, NQC>(sq, Ss + 16 * rg * LDS, LDS, Ks + 8 * NQC * cg, 1, LDK);\n"
    "        /* added in the fixed order: key tiles from last(i) down to 0 */\n"
    "        const int kl = CAUSAL ? ((qt + 1) * BQ - 1) / BC : nkt - 1;\n"
    "        const unsigned rank = (unsigned)((kl < nkt - 1 ? kl : nkt - 1) - kt);\n"
    "        if (threadIdx.x == 0)\n"
    "            kiln_attn_wait(qc + qt, rank);\n"
    "        __syncthreads();\n"
    "        volatile float *qr = qa + (long long)qt * BQ * DP;\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < 2; h++) {\n"
    "            const int r = 16 * rg + g + 8 * h, row = qt * BQ + r;\n"
    "            if (row >= Tq)\n"
    "                continue;\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < NQC; j++)\n"
    "#pragma unroll\n"
    "                for (int e = 0; e < 2; e++) {\n"
    "                    const int c = 8 * (NQC * cg + j) + 2 * t + e;\n"
    "                    if (c >= D)\n"
    "                        continue;\n"
    "                    float x = sq[j][2 * h + e];\n"
    "                    if (rank > 0)\n"
    "                        x += qr[r * DP + c];\n"
    "                    if (kt == 0)\n"
    "                        kiln_attn_st(dq, row * L.rs[KILN_ADQ] + c, x * scale);\n"
    "                    else\n"
    "                        qr[r * DP + c] = x;\n"
    "                }\n"
    "        }\n"
    "        __threadfence();\n"
    "        __syncthreads();\n"
    "        if (threadIdx.x == 0)\n"
    "            *(volatile unsigned *)(qc + qt) = kt == 0 ? 0u : rank + 1;\n"
    "    }\n"
    "    kiln_attn_st_kv<E, D, DV, NK, NV, true, true>(dk, dv, ak, av, L, key0, Tk, t, scale);\n"
    "}\n"
    "\n";

int64_t cg_cuda_attn_bwd_counters(const CgCudaAttn *a, int bt)
{
    return 1 + a->bh * ((a->tq + bt - 1) / bt);
}

int64_t cg_cuda_attn_bwd_scratch(const CgCudaAttn *a, int bt)
{
    int64_t nqt = (a->tq + bt - 1) / bt;
    return CG_CUDA_SCRATCH_ZERO + a->bh * nqt * bt * cg_pad16(a->d) * 4;
}

bool cg_cuda_attn_bwd_fits(const CgCudaAttn *a)
{
    int nw, bt;
    /* the variants take the dq and dk/dv kernels: dq's fixed order of key
     * tiles assumes every head its own keys from tile 0 on (grouped heads,
     * windows), and ALiBi's term made the kernel spill (above); a bias or
     * mask too (its reads are the dk/dv and dq kernels') */
    if (a->kind != CG_CUDA_ATTN_BWD || !(a->dt == DT_F32 || a->dt == DT_BF16) ||
        a->lay.g > 1 || a->lay.window || a->lay.ah || a->lay.bias ||
        !cg_cuda_attn_tiles(a, &nw, &bt))
        return false;
    return cg_cuda_attn_bwd_counters(a, bt) * 4 <= CG_CUDA_SCRATCH_ZERO &&
           cg_cuda_attn_blocks(a, nw) < ((int64_t)1 << 31);
}
