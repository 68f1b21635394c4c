/* test_emu_attn.c - the fused attention kernels (codegen/cuda_attn.c) on the
 * emulated device against a double-precision naive attention computed here
 * from the same (stored) inputs: o, lse, dq, dk and dv, f32 and bf16 (the
 * bf16 tensor-core path runs its documented m16n8k16 fragment layout through
 * the emulator's shuffle implementation; f32 runs its own direct products),
 * causal and not, T = 1, T not a multiple of any tile, head sizes 32, 64,
 * 128 and odd ones (24, 40), Tq != Tk; and in the head layout (ir.h: q, k,
 * v strided out of one [B, T, 3*H*D + 7] buffer, outputs [B, T, H*D], lse
 * and delta [B, T, H]), f32 and bf16, causal and not, T = 1 and 37/70/83,
 * D 32/64/128; and attention_dqkv's layout (dq, dk, dv written into one
 * buffer of q/k/v's layout at q's, k's and v's columns, the dk/dv kernel's
 * dk and dv one param), which must leave every other column as it was.
 * The interpreter (ir/interp.c) does
 * not implement the attention ops on this branch, so the reference is this
 * file's own.
 *
 * Negative controls (each must make the comparison fail): the shuffle
 * reduction reading A's rows g and g+8 swapped (a wrong fragment mapping),
 * the f32 product of P fetching its columns from the wrong lanes,
 * the forward skipping its last key tile, the dk/dv kernel starting one
 * query tile late under the causal mask, the head layout's tiles read with
 * the plain row stride, dq stored with the plain row stride, dv stored at
 * dk's columns of the one dqkv buffer.
 *
 * The fused backward (codegen/cuda_attn_bwd.c, attn*_bwd) runs every case
 * too, on the same inputs (its dq accumulator NaN before the run, every
 * counter zero after it); the attention_dqkv cases and every fifth case
 * twice on one scratch, the second run leaving the same bits as the
 * first. Its negative controls: tiles in
 * blockIdx order (a wait on a later block: the emulator's __trap()), that
 * order with no waiting (dq written before every share is in), the first
 * share adding to the NaN accumulator, key tile 0 leaving its counter set,
 * the ticket word not set back. */
#include "cg_cuda.h"
#include "emu.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    bool bf16, causal;
    int bh, tq, tk, d, dv;
    double scale;
    int heads; /* > 0: the head layout (ir.h) with bh / heads batch entries:
                  q, k, v read out of one [B, T, 3*H*D + 7] buffer at column
                  offsets 3, 3 + H*D, 3 + 2*H*D; o, dO, the gradients [B, T,
                  H*D]; lse, delta [B, T, H] (needs tq == tk, d == dv) */
    bool dqkv; /* with heads: the gradients go to one buffer laid out like
                  q, k, v (attention_dqkv), dk and dv one param */
} Case;

static const Case cases[] = {
    {false, true, 2, 70, 70, 32, 32, 0.17, 0, false},
    {false, false, 2, 70, 70, 64, 64, 0.125, 0, false},
    {false, true, 1, 1, 1, 64, 64, 0.125, 0, false},
    {false, true, 1, 83, 83, 128, 128, 0.088, 0, false},
    {false, false, 2, 19, 45, 24, 40, 0.2, 0, false},
    {true, true, 2, 70, 70, 32, 32, 0.17, 0, false},
    {true, false, 2, 70, 70, 64, 64, 0.125, 0, false},
    {true, true, 1, 1, 1, 64, 64, 0.125, 0, false},
    {true, true, 1, 83, 83, 128, 128, 0.088, 0, false},
    {true, false, 1, 19, 45, 24, 40, 0.2, 0, false},
    {true, true, 1, 130, 130, 64, 64, 0.125, 0, false},
    /* the head layout */
    {false, true, 6, 70, 70, 32, 32, 0.17, 3, false},
    {false, false, 2, 1, 1, 128, 128, 0.088, 2, false},
    {true, true, 2, 83, 83, 64, 64, 0.125, 2, false},
    {true, false, 4, 37, 37, 128, 128, 0.088, 2, false},
    /* attention_dqkv: the gradients into one qkv-shaped buffer */
    {false, true, 4, 37, 37, 32, 32, 0.17, 2, true},
    {false, false, 2, 1, 1, 128, 128, 0.088, 2, true},
    {true, true, 2, 83, 83, 64, 64, 0.125, 2, true},
    {true, false, 3, 70, 70, 128, 128, 0.088, 3, true},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static uint64_t rs = 99;
static double rnd(void) { return 2.0 * test_urand(&rs) - 1.0; } /* [-1, 1) */

/* A tensor of n values as stored (f32 or bf16) and as the reference reads
 * them (double). */
typedef struct {
    void *p;
    double *x;
    int64_t n;
} Buf;

static Buf buf_new(int64_t n, bool bf16, bool fill)
{
    Buf b = {calloc((size_t)n, bf16 ? 2 : 4), calloc((size_t)n, sizeof(double)), n};
    for (int64_t i = 0; fill && i < n; i++) {
        float v = (float)rnd();
        if (bf16) {
            ((uint16_t *)b.p)[i] = test_f2bf(v);
            b.x[i] = test_bf2f(test_f2bf(v));
        } else {
            ((float *)b.p)[i] = v;
            b.x[i] = v;
        }
    }
    return b;
}
static double get(const Buf *b, bool bf16, int64_t i)
{
    return bf16 ? test_bf2f(((uint16_t *)b->p)[i]) : ((float *)b->p)[i];
}
static void buf_free(Buf *b)
{
    free(b->p);
    free(b->x);
}

/* Relative error of the stored result against ref (NaN never passes). */
static double err_of(const Buf *got, bool bf16, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = get(got, bf16, i), e = g - ref[i];
        if (g != g)
            return INFINITY;
        num += e * e;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

/* Naive attention in double: o, lse, and given dO the gradients (ir.h). */
static void reference(const Case *c, const double *q, const double *k, const double *v,
                      const double *dO, double *o, double *lse, double *delta, double *dq,
                      double *dk, double *dv)
{
    int Tq = c->tq, Tk = c->tk, D = c->d, DV = c->dv;
    double *P = malloc(sizeof(double) * (size_t)Tk), *dP = malloc(sizeof(double) * (size_t)Tk);
    memset(dq, 0, sizeof(double) * (size_t)(c->bh * Tq * D));
    memset(dk, 0, sizeof(double) * (size_t)(c->bh * Tk * D));
    memset(dv, 0, sizeof(double) * (size_t)(c->bh * Tk * DV));
    for (int b = 0; b < c->bh; b++)
        for (int i = 0; i < Tq; i++) {
            const double *qi = q + ((int64_t)b * Tq + i) * D;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < Tk; j++) {
                P[j] = -INFINITY;
                if (c->causal && j > i)
                    continue;
                double s = 0;
                for (int e = 0; e < D; e++)
                    s += qi[e] * k[((int64_t)b * Tk + j) * D + e];
                P[j] = s * c->scale;
                mx = fmax(mx, P[j]);
            }
            for (int j = 0; j < Tk; j++)
                sum += P[j] == -INFINITY ? 0 : exp(P[j] - mx);
            int64_t r = (int64_t)b * Tq + i;
            lse[r] = mx + log(sum);
            for (int j = 0; j < Tk; j++)
                P[j] = P[j] == -INFINITY ? 0 : exp(P[j] - lse[r]);
            double dl = 0;
            for (int e = 0; e < DV; e++) {
                double acc = 0;
                for (int j = 0; j < Tk; j++)
                    acc += P[j] * v[((int64_t)b * Tk + j) * DV + e];
                o[r * DV + e] = acc;
                dl += acc * dO[r * DV + e];
            }
            delta[r] = dl;
            for (int j = 0; j < Tk; j++) {
                double s = 0;
                for (int e = 0; e < DV; e++)
                    s += dO[r * DV + e] * v[((int64_t)b * Tk + j) * DV + e];
                dP[j] = P[j] * (s - dl); /* dS */
                for (int e = 0; e < DV; e++)
                    dv[((int64_t)b * Tk + j) * DV + e] += P[j] * dO[r * DV + e];
                for (int e = 0; e < D; e++) {
                    dq[r * D + e] += c->scale * dP[j] * k[((int64_t)b * Tk + j) * D + e];
                    dk[((int64_t)b * Tk + j) * D + e] += c->scale * dP[j] * qi[e];
                }
            }
        }
    free(P);
    free(dP);
}

/* Case c's head layout (c->heads > 0). */
static IrAttnLayout head_layout(const Case *c)
{
    int64_t H = c->heads, D = c->d, T = c->tq, W = 3 * H * D + 7;
    IrAttnLayout L = {.nb = c->bh / H, .nh = H, .Tq = T, .Tk = T, .D = D, .Dv = D};
    L.q = (IrAttnStride){T * W, D, W, 3};
    L.k = (IrAttnStride){T * W, D, W, 3 + H * D};
    L.v = (IrAttnStride){T * W, D, W, 3 + 2 * H * D};
    L.o = L.dq = L.dk = L.dv = (IrAttnStride){T * H * D, D, H * D, 0};
    L.st = (IrAttnStride){T * H, 1, H, 0};
    return L;
}

static CgCudaAttn desc(const Case *c, CgCudaAttnKind kind)
{
    CgCudaAttn a = {.kind = kind, .causal = c->causal, .scale = c->scale,
                    .dt = c->bf16 ? DT_BF16 : DT_F32, .bh = c->bh, .tq = c->tq, .tk = c->tk,
                    .d = c->d, .dv = c->dv, .want_o = true, .want_lse = true, .want_dk = true,
                    .want_dv = true};
    if (c->heads)
        a.lay = head_layout(c);
    if (c->dqkv) {
        a.lay.dq = a.lay.q;
        a.lay.dk = a.lay.k;
        a.lay.dv = a.lay.v;
        a.one_dkv = true;
    }
    return a;
}

/* Element (bh, i, d) of a [bh, T, D] tensor at its place under stride st
 * (heads H): the flat index into the laid-out buffer. */
static int64_t at(const IrAttnStride *st, int64_t H, int64_t bh, int64_t i, int64_t d)
{
    return bh / H * st->bs + bh % H * st->hs + i * st->rs + d + st->off;
}

/* Copies between the plain [bh, T, D] order and a laid-out buffer of
 * element size es: plain[...] = laid[at(...)] (to_plain) or back. */
static void relayout(void *plain, void *laid, int es, const IrAttnStride *st, int64_t H,
                     int64_t bh, int64_t T, int64_t D, bool to_plain)
{
    for (int64_t b = 0; b < bh; b++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t d = 0; d < D; d++) {
                char *p = (char *)plain + ((b * T + i) * D + d) * es;
                char *l = (char *)laid + at(st, H, b, i, d) * es;
                memcpy(to_plain ? p : l, to_plain ? l : p, (size_t)es);
            }
}

/* The program: the prelude, the libraries, four functions per case (the
 * fused backward's last) of cases which[0..nw) (which NULL: every case);
 * edits[0..2n) pairs of (from, to) applied in turn. */
static char *program_edits(const char *const *edits, int n, const int *which, int nw);
static char *program(void) { return program_edits(NULL, 0, NULL, 0); }

static char *program_edits(const char *const *edits, int n, const int *which, int nw)
{
    CgBuf b = {0};
    cg_puts(&b, cg_cuda_prelude);
    cg_puts(&b, cg_cuda_attn_lib);
    cg_puts(&b, cg_cuda_attn_bwd_lib);
    for (int j = 0; j < (which ? nw : NCASES); j++) {
        int i = which ? which[j] : j;
        static const char *kn[] = {"fwd", "dq", "dkdv", "bwd"};
        for (int kd = 0; kd < 4; kd++) {
            CgCudaAttn a = desc(&cases[i], (CgCudaAttnKind)kd);
            char name[64];
            snprintf(name, sizeof name, "attn%d_%s", i, kn[kd]);
            Diag d = {{0}};
            if (!cg_print_cuda_attn(&b, &a, name, NULL, &d))
                fail_msg("%s", d.msg);
        }
    }
    for (int x = 0; x < n; x++) {
        const char *edit_from = edits[2 * x], *edit_to = edits[2 * x + 1];
        char *at = strstr(b.s, edit_from);
        if (!at)
            fail_msg("negative control: \"%s\" is no longer in the attention library", edit_from);
        size_t nf = strlen(edit_from), nt = strlen(edit_to), off = (size_t)(at - b.s);
        char *s = malloc(strlen(b.s) - nf + nt + 1);
        memcpy(s, b.s, off);
        memcpy(s + off, edit_to, nt);
        strcpy(s + off + nt, at + nf);
        free(b.s);
        b.s = s;
    }
    return b.s;
}

/* False (printed) when the launch reports an error and `may_fail`. */
static bool launch(EmuModule *m, const char *name, const CgCudaAttn *a, void **args,
                   bool may_fail)
{
    int nw, bt;
    assert_true(cg_cuda_attn_tiles(a, &nw, &bt));
    unsigned grid[3] = {(unsigned)cg_cuda_attn_blocks(a, nw), 1, 1}, block[3] = {32u * nw, 1, 1};
    Diag d = {{0}};
    if (!emu_launch(m, name, grid, block, 0, args, &d)) {
        if (!may_fail)
            fail_msg("%s: %s", name, d.msg);
        fprintf(stderr, "%s: %s\n", name, d.msg);
        return false;
    }
    return true;
}

/* Runs case i on m; returns the worst relative error of o, lse, dq, dk, dv
 * (each printed). fused: the backward runs as the fused kernel (attn*_bwd)
 * on one scratch (its accumulator NaN before the first run, its counters
 * zero), with twice a second time, which must leave the same bits; every
 * run must leave every counter zero (else the error is infinite); a launch
 * error (the emulator's __trap() on a wait that is not met) is infinite
 * too. Otherwise the dq and dk/dv kernels. */
static double run_case(EmuModule *m, int i, bool quiet, bool fused, bool twice)
{
    const Case *c = &cases[i];
    bool h = c->bf16;
    int64_t nq = (int64_t)c->bh * c->tq, nk = (int64_t)c->bh * c->tk;
    Buf q = buf_new(nq * c->d, h, true), k = buf_new(nk * c->d, h, true),
        v = buf_new(nk * c->dv, h, true), dO = buf_new(nq * c->dv, h, true);
    Buf o = buf_new(nq * c->dv, h, false), dq = buf_new(nq * c->d, h, false),
        dk = buf_new(nk * c->d, h, false), dv = buf_new(nk * c->dv, h, false);
    float *lse = calloc((size_t)nq, 4), *delta = calloc((size_t)nq, 4);
    double *ro = malloc(sizeof(double) * (size_t)(nq * c->dv)),
           *rl = malloc(sizeof(double) * (size_t)nq), *rd = malloc(sizeof(double) * (size_t)nq),
           *rdq = malloc(sizeof(double) * (size_t)(nq * c->d)),
           *rdk = malloc(sizeof(double) * (size_t)(nk * c->d)),
           *rdv = malloc(sizeof(double) * (size_t)(nk * c->dv));
    reference(c, q.x, k.x, v.x, dO.x, ro, rl, rd, rdq, rdk, rdv);
    /* the backward takes the reference's delta (what the graph computes
     * from dO and o in f32) */
    for (int64_t r = 0; r < nq; r++)
        delta[r] = (float)rd[r];
    /* the head layout: the same values moved to their places (q, k, v in
     * one buffer with gaps), outputs moved back to the plain order below */
    IrAttnLayout L = c->heads ? head_layout(c) : (IrAttnLayout){0};
    int es = h ? 2 : 4, H = c->heads;
    void *qkv = NULL, *lo = NULL, *ldO = NULL, *ldq = NULL, *ldk = NULL, *ldv = NULL;
    float *llse = NULL, *ldelta = NULL;
    if (H) {
        int64_t W = L.q.rs, no = nq * c->d;
        qkv = calloc((size_t)(L.nb * c->tq * W), (size_t)es);
        relayout(q.p, qkv, es, &L.q, H, c->bh, c->tq, c->d, false);
        relayout(k.p, qkv, es, &L.k, H, c->bh, c->tk, c->d, false);
        relayout(v.p, qkv, es, &L.v, H, c->bh, c->tk, c->d, false);
        lo = calloc((size_t)no, (size_t)es), ldO = calloc((size_t)no, (size_t)es);
        ldq = calloc((size_t)no, (size_t)es), ldk = calloc((size_t)no, (size_t)es);
        ldv = calloc((size_t)no, (size_t)es);
        llse = calloc((size_t)nq, 4), ldelta = calloc((size_t)nq, 4);
        relayout(dO.p, ldO, es, &L.o, H, c->bh, c->tq, c->d, false);
        relayout(delta, ldelta, 4, &L.st, H, c->bh, c->tq, 1, false);
    }
    void *pq = H ? qkv : q.p, *pk = H ? qkv : k.p, *pv = H ? qkv : v.p;
    void *po = H ? lo : o.p, *pdO = H ? ldO : dO.p, *pdq = H ? ldq : dq.p;
    void *pdk = H ? ldk : dk.p, *pdv = H ? ldv : dv.p;
    float *plse = H ? llse : lse, *pdelta = H ? ldelta : delta;
    /* attention_dqkv: one gradient buffer shaped like qkv, every byte 0x7f
     * before the kernels (what they must not write stays so) */
    unsigned char *gq = NULL;
    int64_t gbytes = H ? L.nb * c->tq * L.q.rs * es : 0;
    if (c->dqkv) {
        L = desc(c, CG_CUDA_ATTN_DQ).lay;
        gq = malloc((size_t)gbytes);
        memset(gq, 0x7f, (size_t)gbytes);
        pdq = pdk = pdv = gq;
    }
    char name[64];
    CgCudaAttn a = desc(c, CG_CUDA_ATTN_FWD);
    snprintf(name, sizeof name, "attn%d_fwd", i);
    void *fa[] = {&pq, &pk, &pv, &po, &plse};
    launch(m, name, &a, fa, false);
    double gap = 0; /* dqkv: the columns no gradient owns, changed: infinite */
    bool stray = false;
    if (fused) {
        a = desc(c, CG_CUDA_ATTN_BWD);
        snprintf(name, sizeof name, "attn%d_bwd", i);
        int nw, bt;
        assert_true(cg_cuda_attn_bwd_fits(&a) && cg_cuda_attn_tiles(&a, &nw, &bt));
        int64_t pb = cg_cuda_attn_bwd_scratch(&a, bt), nc = cg_cuda_attn_bwd_counters(&a, bt);
        unsigned char *part = malloc((size_t)pb);
        memset(part, 0, CG_CUDA_SCRATCH_ZERO);
        memset(part + CG_CUDA_SCRATCH_ZERO, 0xff, (size_t)(pb - CG_CUDA_SCRATCH_ZERO));
        void *ba[] = {&pq, &pk, &pv, &pdO, &plse, &pdelta, &pdq, &pdk, &pdv, &part};
        void *bq[] = {&pq, &pk, &pv, &pdO, &plse, &pdelta, &pdq, &part};
        /* the gradients' bytes after each run */
        int64_t gb[3] = {nq * c->d * es, nk * c->d * es, nk * c->dv * es};
        void *g3[3] = {pdq, pdk, pdv};
        unsigned char *first[3] = {NULL, NULL, NULL};
        for (int run = 0; run < (twice ? 2 : 1); run++) {
            if (!launch(m, name, &a, c->dqkv ? bq : ba, true))
                gap = INFINITY;
            for (int64_t x = 0; x < nc * 4; x++)
                if (part[x])
                    gap = INFINITY;
            /* a counter left set: a second run would take tiles past the
             * grid and write outside the buffers */
            if (gap > 0)
                break;
            for (int x = 0; x < 3; x++) {
                int64_t n = c->dqkv ? gbytes : gb[x];
                if (run == 0) {
                    first[x] = malloc((size_t)n);
                    memcpy(first[x], g3[x], (size_t)n);
                } else if (memcmp(first[x], g3[x], (size_t)n) != 0) {
                    gap = INFINITY;
                }
            }
        }
        if (!quiet && gap > 0)
            fprintf(stderr, "case %d: the fused backward left a counter set, trapped, or ran "
                            "twice to different bits\n", i);
        for (int x = 0; x < 3; x++)
            free(first[x]);
        free(part);
    } else {
        a = desc(c, CG_CUDA_ATTN_DQ);
        snprintf(name, sizeof name, "attn%d_dq", i);
        void *qa[] = {&pq, &pk, &pv, &pdO, &plse, &pdelta, &pdq};
        launch(m, name, &a, qa, false);
        a = desc(c, CG_CUDA_ATTN_DKDV);
        snprintf(name, sizeof name, "attn%d_dkdv", i);
        void *ka[] = {&pq, &pk, &pv, &pdO, &plse, &pdelta, &pdk, &pdv};
        launch(m, name, &a, ka, false); /* dqkv: one param dkv, the 7th */
    }
    if (c->dqkv) {
        unsigned char *own = calloc((size_t)gbytes, 1), one = 1;
        const IrAttnStride *gs[3] = {&L.dq, &L.dk, &L.dv};
        for (int x = 0; x < 3; x++)
            for (int64_t b = 0; b < c->bh; b++)
                for (int64_t r = 0; r < c->tq; r++)
                    for (int64_t d = 0; d < c->d; d++)
                        for (int y = 0; y < es; y++)
                            own[at(gs[x], H, b, r, d) * es + y] = one;
        for (int64_t y = 0; y < gbytes; y++)
            if (!own[y] && gq[y] != 0x7f)
                gap = INFINITY, stray = true;
        free(own);
    }
    if (H) {
        relayout(o.p, lo, es, &L.o, H, c->bh, c->tq, c->d, true);
        relayout(dq.p, pdq, es, &L.dq, H, c->bh, c->tq, c->d, true);
        relayout(dk.p, pdk, es, &L.dk, H, c->bh, c->tk, c->d, true);
        relayout(dv.p, pdv, es, &L.dv, H, c->bh, c->tk, c->d, true);
        relayout(lse, llse, 4, &L.st, H, c->bh, c->tq, 1, true);
        free(qkv);
        free(lo);
        free(ldO);
        free(ldq);
        free(ldk);
        free(ldv);
        free(llse);
        free(ldelta);
        free(gq);
    }
    Buf lb = {lse, NULL, nq};
    double e[5] = {err_of(&o, h, ro, nq * c->dv), err_of(&lb, false, rl, nq),
                   err_of(&dq, h, rdq, nq * c->d), err_of(&dk, h, rdk, nk * c->d),
                   err_of(&dv, h, rdv, nk * c->dv)};
    double worst = gap;
    for (int j = 0; j < 5; j++)
        worst = e[j] > worst || e[j] != e[j] ? e[j] : worst;
    if (!quiet)
        fprintf(stderr,
                "case %2d %s %s bh=%d Tq=%d Tk=%d D=%d Dv=%d%s: o %.2e lse %.2e dq %.2e dk %.2e "
                "dv %.2e%s\n",
                i, h ? "bf16" : "f32 ", c->causal ? "causal" : "full  ", c->bh, c->tq, c->tk,
                c->d, c->dv, c->dqkv ? " dqkv" : c->heads ? " heads" : "", e[0], e[1], e[2], e[3],
                e[4], stray ? " (a column no gradient owns was written)" : "");
    buf_free(&q);
    buf_free(&k);
    buf_free(&v);
    buf_free(&dO);
    buf_free(&o);
    buf_free(&dq);
    buf_free(&dk);
    buf_free(&dv);
    free(lse);
    free(delta);
    free(ro);
    free(rl);
    free(rd);
    free(rdq);
    free(rdk);
    free(rdv);
    return worst;
}

static EmuModule *compile(const char *src, bool sanitize)
{
    EmuOpts o;
    emu_opts_default(&o);
    o.sanitize = sanitize;
    Diag d = {{0}};
    EmuModule *m = emu_compile(src, &o, &d);
    if (!m)
        fail_msg("%s", d.msg);
    return m;
}

static void test_attention(void **state)
{
    (void)state;
    char *src = program();
    EmuModule *m = compile(src, true);
    for (int i = 0; i < NCASES; i++) {
        uint64_t s0 = rs, s1 = rs; /* both runs on the same inputs */
        for (int fused = 0; fused < 2; fused++) {
            rs = s0;
            double worst = run_case(m, i, false, fused, !fused || cases[i].dqkv || i % 5 == 0);
            if (!fused)
                s1 = rs;
            /* f32: the CPU's accuracy; bf16: inputs, P and dS rounded to bf16
             * for the tensor-core products, outputs stored in bf16 */
            double tol = cases[i].bf16 ? 1e-2 : 1e-5;
            if (!(worst < tol))
                fail_msg("case %d%s: relative error %.3e over %.0e", i,
                         fused ? " (fused backward)" : "", worst, tol);
        }
        rs = s1;
    }
    emu_free(m);
    free(src);
}

/* Each broken variant must fail at least one case by far (fused: run
 * the fused backward; edits: nedit (from, to) pairs). */
static void negative_edits(const char *const *edits, int nedit, const int *which, int n,
                           bool fused)
{
    const char *from = edits[0], *to = edits[1];
    char *src = program_edits(edits, nedit, which, n);
    EmuModule *m = compile(src, false);
    double worst = 0;
    for (int j = 0; j < n; j++) {
        double e = run_case(m, which[j], true, fused, true);
        worst = e > worst || e != e ? e : worst;
    }
    fprintf(stderr, "negative control \"%s\" -> \"%s\": worst relative error %.3e\n", from, to,
            worst);
    if (worst < 0.05)
        fail_msg("the broken kernel \"%s\" passed (error %.3e)", to, worst);
    emu_free(m);
    free(src);
}

static void negative(const char *from, const char *to, const int *which, int n)
{
    const char *e[2] = {from, to};
    negative_edits(e, 1, which, n, false);
}

static void test_negative_controls(void **state)
{
    (void)state;
    /* wrong fragment mapping: rows g and g+8 of A swapped */
    static const int bfc[] = {6, 8};
    negative("const typename M::R a0 = M::shfl(a[0], sa), a1 = M::shfl(a[1], sa);",
             "const typename M::R a0 = M::shfl(a[1], sa), a1 = M::shfl(a[0], sa);", bfc, 2);
    /* f32: P's columns fetched from the wrong lanes of the quad */
    static const int f32c[] = {1, 3};
    negative("const int src = (lane & ~3) | u;", "const int src = (lane & ~3) | (3 - u);", f32c,
             2);
    /* the forward skips its last key tile */
    static const int fw[] = {1, 3};
    negative("for (int kt = kt0; kt < ntiles; kt++) {\n"
             "        /* a key tile a mask drops whole for",
             "for (int kt = kt0; kt + 1 < ntiles; kt++) {\n"
             "        /* a key tile a mask drops whole for",
             fw, 2);
    /* dk/dv starts one query tile late under the causal mask */
    static const int ca[] = {0, 10};
    negative("const int qt0 = CAUSAL ? kt * BC / BQ : 0;",
             "const int qt0 = CAUSAL ? kt * BC / BQ + 1 : 0;", ca, 2);
    /* the head layout: the tiles read with the head size as the row stride
     * (the plain layout's), dq stored with the plain stride */
    static const int hl[] = {11, 13};
    negative("kiln_attn_sh(&v, x, (r0 + r) * ld + c);", "kiln_attn_sh(&v, x, (r0 + r) * W + c);",
             hl, 2);
    negative("kiln_attn_st(dq, row * L.rs[KILN_ADQ] + c,", "kiln_attn_st(dq, row * D + c,", hl,
             2);
    /* attention_dqkv: dv stored at dk's columns of the one buffer */
    static const int dqkv[] = {15, 17};
    negative("dv += kiln_attn_at(L, KILN_ADV, bh0);", "dv += kiln_attn_at(L, KILN_ADK, bh0);",
             dqkv, 2);
}

/* The fused backward's dQ order (cuda_attn_bwd.c), broken: each must fail
 * a causal and a full case, f32 and bf16, with several key tiles. */
static void test_fused_negative_controls(void **state)
{
    (void)state;
    static const int mk[] = {0, 6, 17};
    /* tiles taken in blockIdx order, the first key tile first: a block
     * waits on one that starts after it (the emulator traps the wait) */
    const char *order[] = {"const int kt = nkt - 1 - ticket % nkt", "const int kt = ticket % nkt"};
    negative_edits(order, 1, mk, 3, true);
    /* no waiting, in that order: every block adds when it comes, and key
     * tile 0 (first now) writes dq before the others added */
    const char *nowait[] = {"const int kt = nkt - 1 - ticket % nkt", "const int kt = ticket % nkt",
                            "    if (*(const volatile unsigned *)c != r)\n        __trap();\n",
                            ""};
    negative_edits(nowait, 2, mk, 3, true);
    /* the first share adds to the accumulator it should overwrite (NaN) */
    const char *add[] = {"if (rank > 0)\n                        x += qr", "x += qr"};
    negative_edits(add, 1, mk, 3, true);
    /* key tile 0 leaves its counter set: the second run traps */
    const char *keep[] = {"kt == 0 ? 0u : rank + 1", "rank + 1"};
    negative_edits(keep, 1, mk, 3, true);
    /* the last ticket not set back */
    const char *tick[] = {"atomicExch(cnt, 0u);", "(void)0;"};
    negative_edits(tick, 1, mk, 3, true);
}

int main(int argc, char **argv)
{
    (void)argc;
    emu_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_negative_controls),
        cmocka_unit_test(test_fused_negative_controls),
    };
    /* KILN_TEST_PART=fused: the fused backward's negative controls alone */
    const struct CMUnitTest fused[] = {cmocka_unit_test(test_fused_negative_controls)};
    const char *part = getenv("KILN_TEST_PART");
    if (part && strcmp(part, "fused") == 0)
        return cmocka_run_group_tests(fused, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
