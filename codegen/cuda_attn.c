/* cuda_attn.c - CUDA C for the fused attention ops (OC_ATTN: attention,
 * attention_lse, attention_dq/dk/dv; semantics in ir/ir.h), flash-attention
 * style: the scores are computed a tile at a time in registers and never
 * stored.
 *
 * Four kernels (cg_print_cuda_attn), each a thin extern "C" wrapper around
 * one template of cg_cuda_attn_lib (cuda_attn_lib.c, the device text):
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
