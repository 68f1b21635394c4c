/* test_emu_attn_mask.c - the CUDA attention kernels (codegen/cuda_attn.c)
 * with a boolean mask tensor on the emulated device, against the
 * interpreter (ir/interp.c) on the same IR ops: attention, attention_lse,
 * attention_dq, attention_dk and attention_dv with a u8 mask [B, 1, T, T],
 * f32 and bf16, causal and not, T = 150 (not a multiple of any tile).
 *
 * The mask is block-diagonal per batch entry (packed documents: a row keeps
 * the keys of its own document), with documents that leave whole tile
 * pairs without a kept (row, key). The forward, dq and dk/dv kernels vote
 * at every tile pair (__syncthreads_or) and skip the pairs the mask drops
 * whole: the test counts, from the mask and the kernels' tile sizes, the
 * pairs each kernel considers and the ones it keeps, and checks the
 * emulator's count of votes (one per pair considered) and of barriers (one
 * per pair visited after the vote) against them, so the test fails if the
 * kernels stop skipping. Negative controls (each must fail): the vote
 * forced to 1 (no pair skipped: the barrier counts), and the vote looking
 * at only the first half of the cells of a pair (pairs skipped that keep
 * something: the values). */
#include "cg_cuda.h"
#include "emu.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, H = 2, T = 150 };

typedef struct {
    bool bf16, causal;
    int d;
    double scale;
} Case;

static const Case cases[] = {
    {false, false, 32, 0.17}, /* 64 x 64 tiles everywhere */
    {false, true, 64, 0.125}, /* forward and dq 64 x 32 */
    {true, true, 32, 0.17},
    {true, false, 64, 0.125},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* The documents of batch entry b: row i keeps key j when both lie in one
 * [start, next start); b = 0 drops whole 64 x 64 and 64 x 32 tile pairs,
 * b = 1 only smaller ones. */
static int doc_of(int b, int i)
{
    static const int starts[B][4] = {{0, 40, 100, 1 << 30}, {0, 20, 1 << 30, 1 << 30}};
    int d = 0;
    while (starts[b][d + 1] <= i)
        d++;
    return d;
}
static bool kept(const Case *c, int b, int i, int j)
{
    return doc_of(b, i) == doc_of(b, j) && (!c->causal || j <= i);
}

static uint64_t rs = 7;
static double rnd(void) { return 2.0 * test_urand(&rs) - 1.0; } /* [-1, 1) */

/* The IR of case c: the five ops on inputs q, k, v, dO, delta and mask m. */
static Graph *graph_of(const Case *c)
{
    char text[2048];
    const char *at = c->causal ? "{causal=1,scale=%.9g,mask=1}" : "{causal=0,scale=%.9g,mask=1}";
    char attr[64];
    snprintf(attr, sizeof attr, at, c->scale);
    int d = c->d;
    snprintf(text, sizeof text,
             "kiln-ir v1\n"
             "%%q:f32[%d,%d,%d,%d] = input \"q\"\n%%k:f32[%d,%d,%d,%d] = input \"k\"\n"
             "%%v:f32[%d,%d,%d,%d] = input \"v\"\n%%g:f32[%d,%d,%d,%d] = input \"dO\"\n"
             "%%e:f32[%d,%d,%d,1] = input \"delta\"\n%%m:u8[%d,1,%d,%d] = input \"m\"\n"
             "%%o:f32[%d,%d,%d,%d] = attention %%q, %%k, %%v, %%m %s\n"
             "%%l:f32[%d,%d,%d,1] = attention_lse %%q, %%k, %%m %s\n"
             "%%dq:f32[%d,%d,%d,%d] = attention_dq %%q, %%k, %%v, %%g, %%l, %%e, %%m %s\n"
             "%%dk:f32[%d,%d,%d,%d] = attention_dk %%q, %%k, %%v, %%g, %%l, %%e, %%m %s\n"
             "%%dv:f32[%d,%d,%d,%d] = attention_dv %%q, %%k, %%v, %%g, %%l, %%e, %%m %s\n"
             "output \"o\" %%o\noutput \"l\" %%l\noutput \"dq\" %%dq\noutput \"dk\" %%dk\n"
             "output \"dv\" %%dv\n",
             B, H, T, d, B, H, T, d, B, H, T, d, B, H, T, d, B, H, T, B, T, T, B, H, T, d, attr,
             B, H, T, attr, B, H, T, d, attr, B, H, T, d, attr, B, H, T, d, attr);
    char err[512] = "";
    Graph *g = ir_parse(text, "mask.ir", err, sizeof err);
    if (!g)
        fail_msg("%s\n%s", err, text);
    return g;
}

static const Op *op_of(const Graph *g, Opcode code)
{
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == code)
            return &g->ops.v[i];
    fail_msg("no %s op", ir_opinfo[code].name);
    return NULL;
}

static CgCudaAttn desc(const Case *c, const Graph *g, CgCudaAttnKind kind)
{
    CgCudaAttn a = {.kind = kind, .causal = c->causal, .scale = c->scale,
                    .dt = c->bf16 ? DT_BF16 : DT_F32, .bh = B * H, .tq = T, .tk = T,
                    .d = c->d, .dv = c->d, .want_o = true, .want_lse = true,
                    .want_dk = true, .want_dv = true, .bdt = DT_U8};
    ir_attn_layout(g, op_of(g, OP_ATTENTION), &a.lay);
    assert_int_equal(a.lay.bias, IR_ATTN_MASK);
    return a;
}

static const char *kname[] = {"fwd", "dq", "dkdv"};

/* The program of every case's forward, dq and dk/dv kernels, with one
 * (from, to) edit of the library when from is not NULL. */
static char *program(const char *from, const char *to)
{
    CgBuf b = {0};
    cg_puts(&b, cg_cuda_prelude);
    cg_puts(&b, cg_cuda_attn_lib);
    for (int i = 0; i < NCASES; i++) {
        Graph *g = graph_of(&cases[i]);
        for (int kd = 0; kd < 3; kd++) {
            CgCudaAttn a = desc(&cases[i], g, (CgCudaAttnKind)kd);
            char name[64];
            snprintf(name, sizeof name, "mask%d_%s", i, kname[kd]);
            Diag d = {{0}};
            if (!cg_print_cuda_attn(&b, &a, name, NULL, &d))
                fail_msg("%s", d.msg);
        }
        ir_free(g);
    }
    if (!from)
        return b.s;
    char *at = strstr(b.s, from);
    if (!at)
        fail_msg("negative control: \"%s\" is no longer in the attention library", from);
    size_t nf = strlen(from), nt = strlen(to), off = (size_t)(at - b.s);
    char *s = malloc(strlen(b.s) - nf + nt + 1);
    memcpy(s, b.s, off);
    memcpy(s + off, to, nt);
    strcpy(s + off + nt, at + nf);
    free(b.s);
    return s;
}

/* Tile pairs kernel a considers (*cand) and keeps (*vis), as its loops walk
 * them: the forward and dq a query tile of 16 nw rows against key tiles of
 * bt (causal: up to the tile's last row), dk/dv a key tile of 16 nw keys
 * against query tiles of bt (causal: from the diagonal on). */
static void pairs(const Case *c, const CgCudaAttn *a, long long *cand, long long *vis)
{
    int nw, bt;
    assert_true(cg_cuda_attn_tiles(a, &nw, &bt));
    bool kv = a->kind == CG_CUDA_ATTN_DKDV;
    int br = kv ? bt : 16 * nw, bc = kv ? 16 * nw : bt; /* query rows, keys */
    *cand = *vis = 0;
    for (int bh = 0; bh < B * H; bh++)
        for (int qt = 0; qt * br < T; qt++)
            for (int kt = 0; kt * bc < T; kt++) {
                if (c->causal && (kv ? qt < kt * bc / br : kt * bc >= (qt + 1) * br))
                    continue;
                ++*cand;
                bool any = false;
                for (int i = qt * br; i < (qt + 1) * br && i < T && !any; i++)
                    for (int j = kt * bc; j < (kt + 1) * bc && j < T && !any; j++)
                        any = kept(c, bh / H, i, j);
                *vis += any;
            }
}

/* Relative error of n stored values against the interpreter's. */
static double err_of(const void *got, bool bf16, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = bf16 ? test_bf2f(((const uint16_t *)got)[i]) : ((const float *)got)[i];
        if (g != g)
            return INFINITY;
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

/* Runs case i on m; returns the worst relative error of o, lse, dq, dk, dv
 * against the interpreter; *skips_ok: every kernel's votes and barriers
 * are the pairs it considers and keeps. */
static double run_case(EmuModule *m, int i, bool quiet, bool *skips_ok)
{
    const Case *c = &cases[i];
    Graph *g = graph_of(c);
    double **val = ir_interp_alloc(g);
    int64_t n = (int64_t)B * H * T * c->d, nr = (int64_t)B * H * T;
    int es = c->bf16 ? 2 : 4;
    const char *in[4] = {"q", "k", "v", "dO"};
    void *dev[4];
    for (int x = 0; x < 4; x++) {
        int id = ir_find_tensor(g, in[x]);
        val[id] = malloc(sizeof(double) * (size_t)n);
        dev[x] = malloc((size_t)(n * es));
        for (int64_t e = 0; e < n; e++) {
            float f = (float)rnd();
            if (c->bf16) {
                ((uint16_t *)dev[x])[e] = test_f2bf(f);
                f = test_bf2f(test_f2bf(f));
            } else {
                ((float *)dev[x])[e] = f;
            }
            val[id][e] = f;
        }
    }
    /* delta: any values (the gradient ops take it as given) */
    float *delta = malloc(sizeof(float) * (size_t)nr);
    int id = ir_find_tensor(g, "delta");
    val[id] = malloc(sizeof(double) * (size_t)nr);
    for (int64_t r = 0; r < nr; r++)
        val[id][r] = delta[r] = (float)(0.3 * rnd());
    unsigned char *mask = malloc((size_t)B * T * T);
    id = ir_find_tensor(g, "m");
    val[id] = malloc(sizeof(double) * (size_t)(B * T * T));
    for (int b = 0; b < B; b++)
        for (int r = 0; r < T; r++)
            for (int j = 0; j < T; j++) {
                /* the causal half is left to the attribute: the mask keeps it */
                int64_t e = ((int64_t)b * T + r) * T + j;
                mask[e] = doc_of(b, r) == doc_of(b, j);
                val[id][e] = mask[e];
            }
    ir_interp(g, val, NULL);
    void *o = calloc((size_t)n, (size_t)es), *dq = calloc((size_t)n, (size_t)es);
    void *dk = calloc((size_t)n, (size_t)es), *dv = calloc((size_t)n, (size_t)es);
    float *lse = calloc((size_t)nr, 4);
    void *pq = dev[0], *pk = dev[1], *pv = dev[2], *pg = dev[3], *pm = mask;
    void *args[3][10] = {{&pq, &pk, &pv, &o, &lse, &pm},
                         {&pq, &pk, &pv, &pg, &lse, &delta, &dq, &pm},
                         {&pq, &pk, &pv, &pg, &lse, &delta, &dk, &dv, &pm}};
    *skips_ok = true;
    for (int kd = 0; kd < 3; kd++) {
        CgCudaAttn a = desc(c, g, (CgCudaAttnKind)kd);
        int nw, bt;
        assert_true(cg_cuda_attn_tiles(&a, &nw, &bt));
        unsigned grid[3] = {(unsigned)cg_cuda_attn_blocks(&a, nw), 1, 1};
        unsigned block[3] = {32u * nw, 1, 1};
        char name[64];
        snprintf(name, sizeof name, "mask%d_%s", i, kname[kd]);
        Diag d = {{0}};
        if (!emu_launch(m, name, grid, block, 0, args[kd], &d))
            fail_msg("%s: %s", name, d.msg);
        KilnEmuStats st;
        emu_last_stats(m, &st);
        long long cand, vis;
        pairs(c, &a, &cand, &vis);
        if (!quiet)
            fprintf(stderr, "case %d %s (%d queries x %d keys): %lld of %lld tile pairs visited; "
                            "emulator: %llu votes, %llu barriers\n",
                    i, kname[kd], kd == 2 ? bt : 16 * nw, kd == 2 ? 16 * nw : bt, vis, cand,
                    st.votes, st.barriers);
        if (vis >= cand) /* the mask must drop some pair whole */
            fail_msg("case %d %s: the mask drops no tile pair", i, kname[kd]);
        if (st.votes != (unsigned long long)cand || st.barriers != (unsigned long long)vis)
            *skips_ok = false;
    }
    double e[5] = {err_of(o, c->bf16, val[ir_find_output(g, "o")], n),
                   err_of(lse, false, val[ir_find_output(g, "l")], nr),
                   err_of(dq, c->bf16, val[ir_find_output(g, "dq")], n),
                   err_of(dk, c->bf16, val[ir_find_output(g, "dk")], n),
                   err_of(dv, c->bf16, val[ir_find_output(g, "dv")], n)};
    double worst = 0;
    for (int j = 0; j < 5; j++)
        worst = e[j] > worst || e[j] != e[j] ? e[j] : worst;
    if (!quiet)
        fprintf(stderr,
                "case %d %s %s D=%d: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e%s\n", i,
                c->bf16 ? "bf16" : "f32 ", c->causal ? "causal" : "full  ", c->d, e[0], e[1],
                e[2], e[3], e[4], *skips_ok ? "" : " (votes/barriers not as counted)");
    for (int x = 0; x < 4; x++)
        free(dev[x]);
    free(delta);
    free(mask);
    free(o);
    free(dq);
    free(dk);
    free(dv);
    free(lse);
    ir_interp_free(g, val);
    ir_free(g);
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

static void test_mask_skips_tiles(void **state)
{
    (void)state;
    char *src = program(NULL, NULL);
    EmuModule *m = compile(src, true);
    for (int i = 0; i < NCASES; i++) {
        bool skips;
        double worst = run_case(m, i, false, &skips);
        double tol = cases[i].bf16 ? 1e-2 : 1e-5;
        if (!(worst < tol))
            fail_msg("case %d: relative error %.3e over %.0e", i, worst, tol);
        if (!skips)
            fail_msg("case %d: the kernels did not skip the tile pairs the mask drops", i);
    }
    emu_free(m);
    free(src);
}

/* The vote broken: each must fail a case, by the counts or the values. */
static void test_negative_controls(void **state)
{
    (void)state;
    static const char *const edits[][2] = {
        /* nothing skipped: the results stay right, the barriers say so */
        {"return __syncthreads_or(kiln_attn_keeps<R, C, NTH, CAUSAL>",
         "return __syncthreads_or(1 | kiln_attn_keeps<R, C, NTH, CAUSAL>"},
        /* only the first half of a pair's cells looked at: pairs that keep
         * (row, key) only in their second half are skipped */
        {"for (int i = threadIdx.x; i < R * C; i += NTH) {",
         "for (int i = threadIdx.x; i < R * C / 2; i += NTH) {"},
    };
    for (size_t x = 0; x < sizeof edits / sizeof edits[0]; x++) {
        char *src = program(edits[x][0], edits[x][1]);
        EmuModule *m = compile(src, false);
        bool caught = false;
        for (int i = 0; i < NCASES && !caught; i++) {
            bool skips;
            double worst = run_case(m, i, true, &skips);
            caught = !skips || !(worst < (cases[i].bf16 ? 1e-2 : 1e-5));
        }
        fprintf(stderr, "negative control \"%s\": %s\n", edits[x][1],
                caught ? "caught" : "NOT caught");
        if (!caught)
            fail_msg("the broken kernel \"%s\" passed", edits[x][1]);
        emu_free(m);
        free(src);
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    emu_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_skips_tiles),
        cmocka_unit_test(test_negative_controls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
