/* cattn.c - the attention kernels of the C backend (CgAttn, codegen.h):
 * flash-attention style, tiled, with no T x T tensor in memory.
 *
 * Forward (CG_ATTN_FWD), per (batch entry, tile of A_BQ query rows): the
 * query tile transposed once into qT[D][BQ]; walk the key tiles of A_BK
 * keys (causal: only tiles with a key <= the tile's last row), S^T = k q^T
 * for the tile (the key rows read in place), online softmax down its
 * columns (running max m and sum l per query row, vectorised over the
 * rows; causal keys past a row masked to 0; the accumulator rescaled by
 * exp(m_old - m_new)), accumulate P v with P^T read transposed; at the
 * end o = acc / l and lse = m + log l. Every product of tiles is
 * kiln_attn_mm, a register-blocked loop (cg_c_attn_helpers, in the C
 * prelude). No key tile is copied: transposing one per (query tile, key
 * tile) visit cost gpt small's forward and dq kernels a fifth of their
 * time.
 * Backward recomputes P_ij = exp(S_ij - lse_i) from lse: CG_ATTN_DQ per
 * (batch entry, query tile), on S^T and dP^T = v dO^T like the forward
 * (q and dO tiles transposed once), accumulates dq_i += s dS_ij k_j with
 * dS_ij = P_ij (dO_i . v_j - delta_i); CG_ATTN_DKV per (batch entry, key
 * tile; its k and v tiles transposed once) walks the query rows that keep
 * any of its keys and accumulates dv_j += P_ij dO_i and dk_j += s dS_ij q_i;
 * under a causal mask a query tile's products stop at the tile's last key
 * that its last row keeps (nke: on the diagonal the later keys have P =
 * dS = 0, terms that change no finite sum, as the forward's and dq's key
 * walks already leave them out).
 * attention_dqkv with 16 or more (batch entry, head) pairs folds the two
 * into one kernel per pair (cg_c_attn_folded, print_dqkv): the same sums in
 * the same order, five tile products a tile pair instead of seven.
 * Work items are spread over the parts round-robin (part, part + nparts,
 * ...), which balances causal tiles of unequal cost; every output element
 * is written by the one item that owns its tile, in a fixed order, so the
 * result does not depend on the number of parts. f32 only (the C backend's
 * GEMMs and kernels are f32). Every tensor is addressed through the op's
 * IrAttnLayout (ir.h): work item bb = b * nh + h starts at A_xB(bb) and
 * steps rows by A_xR, so the head layout's strided q/k/v rows and [B, T,
 * H*D] outputs need no copies.
 * The variants (ir.h): k, v, dk and dv of item bb are key/value item bb /
 * A_G's (grouped heads); the dk/dv and folded kernels take one work item
 * per key/value item, walking its A_G query items in turn into one dk and
 * dv accumulator. A window (A_WIN) starts the forward's and dq's key walk
 * at A_KSTART and ends the dk/dv query walk at A_QEND, masking inside the
 * tiles with A_KEEP; ALiBi's term is in A_SC (slopes printed as a table);
 * a bias tensor is added in A_SC and a mask tensor ands A_KEEP (A_BX reads
 * either at its own shape), A_ANY then guards the exp terms of -inf scores
 * and rows that keep nothing (o = 0). */
#include "codegen.h"

#include <stdlib.h>
#include <string.h>

enum { A_BQ = 32, A_BK = 64 };

/* The helper every attention kernel's C uses, part of the C prelude
 * (after cg_c_prelude in every C file: the backend splits a file into parts at "\nvoid ", each
 * with the prelude): kiln_attn_mm, C[m][n] += sum_k A(m, k) B[k][n] in a 4 x 16
 * register block (the block's 8 accumulators stay in vector registers; 8 x
 * 16 in AVX-512 registers where the machine has them), and the sum over k
 * in ascending order, one fused multiply-add a term, for every element, so
 * the blocks and the tails give the same bits. */
const char cg_c_attn_helpers[] =
    "#ifndef KILN_ATTN_HELPERS\n"
    "#define KILN_ATTN_HELPERS\n"
    "/* c + a * b, fused where the machine has FMA: explicit, so that the\n"
    " * vector and scalar loops round alike (-ffp-contract=off elsewhere) */\n"
    "#ifdef __AVX512F__\n"
    "#include <immintrin.h>\n"
    "#endif\n"
    "#ifdef __FMA__\n"
    "#define KILN_MADD(c, a, b) __builtin_fmaf(a, b, c)\n"
    "#else\n"
    "#define KILN_MADD(c, a, b) ((c) + (a) * (b))\n"
    "#endif\n"
    "/* P = exp(x - L) of a score x that may be -inf (an attention bias): 0 then\n"
    " * (also where the row's lse L is -inf: it keeps no key) */\n"
    "static inline float kiln_attn_pexp(float x, float L)\n"
    "{\n"
    "    return x == -KILN_INF ? 0.0f : kiln_expf(x - L);\n"
    "}\n"
    "/* rows [m0, m1), columns [n0, N) of kiln_attn_mm, one element at a time */\n"
    "static inline void kiln_attn_mm_rows(float *restrict C, int64_t ldc, const float *restrict A,\n"
    "                                     int64_t sam, int64_t sak, const float *restrict B,\n"
    "                                     int64_t ldb, int64_t m0, int64_t m1, int64_t n0,\n"
    "                                     int64_t N, int64_t K)\n"
    "{\n"
    "    for (int64_t i = m0; i < m1; i++)\n"
    "        for (int64_t k = 0; k < K; k++) {\n"
    "            float a = A[i * sam + k * sak];\n"
    "            for (int64_t j = n0; j < N; j++)\n"
    "                C[i * ldc + j] = KILN_MADD(C[i * ldc + j], a, B[k * ldb + j]);\n"
    "        }\n"
    "}\n"
    "/* C[m*ldc + n] += sum_{k<K} A[m*sam + k*sak] * B[k*ldb + n], m < M, n < N */\n"
    "static inline void kiln_attn_mm(float *restrict C, int64_t ldc, const float *restrict A,\n"
    "                                int64_t sam, int64_t sak, const float *restrict B,\n"
    "                                int64_t ldb, int64_t M, int64_t N, int64_t K)\n"
    "{\n"
    "    int64_t m = 0;\n"
    "#ifdef __AVX512F__\n"
    "    /* 8 x 16 blocks in 8 zmm accumulators: 4 x 16 leaves the FMAs' latency\n"
    "     * exposed (one layer of gpt small's attention kernels, one thread:\n"
    "     * 24.2 -> 21.0 ms); the same fmaf per element in the same order */\n"
    "    for (; m + 8 <= M; m += 8) {\n"
    "        int64_t n = 0;\n"
    "        /* 8 x 32 in 16 accumulators: each broadcast feeds two FMAs */\n"
    "        for (; n + 32 <= N; n += 32) {\n"
    "            float *c = C + m * ldc + n;\n"
    "            __m512 c0 = _mm512_loadu_ps(c), d0 = _mm512_loadu_ps(c + 16);\n"
    "            __m512 c1 = _mm512_loadu_ps(c + ldc), d1 = _mm512_loadu_ps(c + ldc + 16);\n"
    "            __m512 c2 = _mm512_loadu_ps(c + 2 * ldc), d2 = _mm512_loadu_ps(c + 2 * ldc + 16);\n"
    "            __m512 c3 = _mm512_loadu_ps(c + 3 * ldc), d3 = _mm512_loadu_ps(c + 3 * ldc + 16);\n"
    "            __m512 c4 = _mm512_loadu_ps(c + 4 * ldc), d4 = _mm512_loadu_ps(c + 4 * ldc + 16);\n"
    "            __m512 c5 = _mm512_loadu_ps(c + 5 * ldc), d5 = _mm512_loadu_ps(c + 5 * ldc + 16);\n"
    "            __m512 c6 = _mm512_loadu_ps(c + 6 * ldc), d6 = _mm512_loadu_ps(c + 6 * ldc + 16);\n"
    "            __m512 c7 = _mm512_loadu_ps(c + 7 * ldc), d7 = _mm512_loadu_ps(c + 7 * ldc + 16);\n"
    "            for (int64_t k = 0; k < K; k++) {\n"
    "                __m512 b = _mm512_loadu_ps(B + k * ldb + n);\n"
    "                __m512 e = _mm512_loadu_ps(B + k * ldb + n + 16);\n"
    "                const float *a = A + m * sam + k * sak;\n"
    "                __m512 x = _mm512_set1_ps(a[0]);\n"
    "                c0 = _mm512_fmadd_ps(x, b, c0), d0 = _mm512_fmadd_ps(x, e, d0);\n"
    "                x = _mm512_set1_ps(a[sam]);\n"
    "                c1 = _mm512_fmadd_ps(x, b, c1), d1 = _mm512_fmadd_ps(x, e, d1);\n"
    "                x = _mm512_set1_ps(a[2 * sam]);\n"
    "                c2 = _mm512_fmadd_ps(x, b, c2), d2 = _mm512_fmadd_ps(x, e, d2);\n"
    "                x = _mm512_set1_ps(a[3 * sam]);\n"
    "                c3 = _mm512_fmadd_ps(x, b, c3), d3 = _mm512_fmadd_ps(x, e, d3);\n"
    "                x = _mm512_set1_ps(a[4 * sam]);\n"
    "                c4 = _mm512_fmadd_ps(x, b, c4), d4 = _mm512_fmadd_ps(x, e, d4);\n"
    "                x = _mm512_set1_ps(a[5 * sam]);\n"
    "                c5 = _mm512_fmadd_ps(x, b, c5), d5 = _mm512_fmadd_ps(x, e, d5);\n"
    "                x = _mm512_set1_ps(a[6 * sam]);\n"
    "                c6 = _mm512_fmadd_ps(x, b, c6), d6 = _mm512_fmadd_ps(x, e, d6);\n"
    "                x = _mm512_set1_ps(a[7 * sam]);\n"
    "                c7 = _mm512_fmadd_ps(x, b, c7), d7 = _mm512_fmadd_ps(x, e, d7);\n"
    "            }\n"
    "            _mm512_storeu_ps(c, c0), _mm512_storeu_ps(c + 16, d0);\n"
    "            _mm512_storeu_ps(c + ldc, c1), _mm512_storeu_ps(c + ldc + 16, d1);\n"
    "            _mm512_storeu_ps(c + 2 * ldc, c2), _mm512_storeu_ps(c + 2 * ldc + 16, d2);\n"
    "            _mm512_storeu_ps(c + 3 * ldc, c3), _mm512_storeu_ps(c + 3 * ldc + 16, d3);\n"
    "            _mm512_storeu_ps(c + 4 * ldc, c4), _mm512_storeu_ps(c + 4 * ldc + 16, d4);\n"
    "            _mm512_storeu_ps(c + 5 * ldc, c5), _mm512_storeu_ps(c + 5 * ldc + 16, d5);\n"
    "            _mm512_storeu_ps(c + 6 * ldc, c6), _mm512_storeu_ps(c + 6 * ldc + 16, d6);\n"
    "            _mm512_storeu_ps(c + 7 * ldc, c7), _mm512_storeu_ps(c + 7 * ldc + 16, d7);\n"
    "        }\n"
    "        for (; n + 16 <= N; n += 16) {\n"
    "            float *c = C + m * ldc + n;\n"
    "            __m512 c0 = _mm512_loadu_ps(c), c1 = _mm512_loadu_ps(c + ldc);\n"
    "            __m512 c2 = _mm512_loadu_ps(c + 2 * ldc), c3 = _mm512_loadu_ps(c + 3 * ldc);\n"
    "            __m512 c4 = _mm512_loadu_ps(c + 4 * ldc), c5 = _mm512_loadu_ps(c + 5 * ldc);\n"
    "            __m512 c6 = _mm512_loadu_ps(c + 6 * ldc), c7 = _mm512_loadu_ps(c + 7 * ldc);\n"
    "            for (int64_t k = 0; k < K; k++) {\n"
    "                __m512 b = _mm512_loadu_ps(B + k * ldb + n);\n"
    "                const float *a = A + m * sam + k * sak;\n"
    "                c0 = _mm512_fmadd_ps(_mm512_set1_ps(a[0]), b, c0);\n"
    "                c1 = _mm512_fmadd_ps(_mm512_set1_ps(a[sam]), b, c1);\n"
    "                c2 = _mm512_fmadd_ps(_mm512_set1_ps(a[2 * sam]), b, c2);\n"
    "                c3 = _mm512_fmadd_ps(_mm512_set1_ps(a[3 * sam]), b, c3);\n"
    "                c4 = _mm512_fmadd_ps(_mm512_set1_ps(a[4 * sam]), b, c4);\n"
    "                c5 = _mm512_fmadd_ps(_mm512_set1_ps(a[5 * sam]), b, c5);\n"
    "                c6 = _mm512_fmadd_ps(_mm512_set1_ps(a[6 * sam]), b, c6);\n"
    "                c7 = _mm512_fmadd_ps(_mm512_set1_ps(a[7 * sam]), b, c7);\n"
    "            }\n"
    "            _mm512_storeu_ps(c, c0), _mm512_storeu_ps(c + ldc, c1);\n"
    "            _mm512_storeu_ps(c + 2 * ldc, c2), _mm512_storeu_ps(c + 3 * ldc, c3);\n"
    "            _mm512_storeu_ps(c + 4 * ldc, c4), _mm512_storeu_ps(c + 5 * ldc, c5);\n"
    "            _mm512_storeu_ps(c + 6 * ldc, c6), _mm512_storeu_ps(c + 7 * ldc, c7);\n"
    "        }\n"
    "        kiln_attn_mm_rows(C, ldc, A, sam, sak, B, ldb, m, m + 8, n, N, K);\n"
    "    }\n"
    "#endif\n"
    "    for (; m + 4 <= M; m += 4) {\n"
    "        int64_t n = 0;\n"
    "        for (; n + 16 <= N; n += 16) {\n"
    "            float c0[16], c1[16], c2[16], c3[16];\n"
    "            for (int l = 0; l < 16; l++) {\n"
    "                c0[l] = C[m * ldc + n + l];\n"
    "                c1[l] = C[(m + 1) * ldc + n + l];\n"
    "                c2[l] = C[(m + 2) * ldc + n + l];\n"
    "                c3[l] = C[(m + 3) * ldc + n + l];\n"
    "            }\n"
    "            for (int64_t k = 0; k < K; k++) {\n"
    "                const float *b = B + k * ldb + n;\n"
    "                float a0 = A[m * sam + k * sak], a1 = A[(m + 1) * sam + k * sak];\n"
    "                float a2 = A[(m + 2) * sam + k * sak], a3 = A[(m + 3) * sam + k * sak];\n"
    "                for (int l = 0; l < 16; l++) {\n"
    "                    c0[l] = KILN_MADD(c0[l], a0, b[l]);\n"
    "                    c1[l] = KILN_MADD(c1[l], a1, b[l]);\n"
    "                    c2[l] = KILN_MADD(c2[l], a2, b[l]);\n"
    "                    c3[l] = KILN_MADD(c3[l], a3, b[l]);\n"
    "                }\n"
    "            }\n"
    "            for (int l = 0; l < 16; l++) {\n"
    "                C[m * ldc + n + l] = c0[l];\n"
    "                C[(m + 1) * ldc + n + l] = c1[l];\n"
    "                C[(m + 2) * ldc + n + l] = c2[l];\n"
    "                C[(m + 3) * ldc + n + l] = c3[l];\n"
    "            }\n"
    "        }\n"
    "        kiln_attn_mm_rows(C, ldc, A, sam, sak, B, ldb, m, m + 4, n, N, K);\n"
    "    }\n"
    "    kiln_attn_mm_rows(C, ldc, A, sam, sak, B, ldb, m, M, 0, N, K);\n"
    "}\n"
    "#endif\n";

int cg_attn_partner(const Graph *g, int i)
{
    const Op *a = &g->ops.v[i];
    Opcode want;
    int nsame;
    switch (a->code) {
    case OP_ATTENTION: want = OP_ATTENTION_LSE, nsame = 2; break;
    case OP_ATTENTION_LSE: want = OP_ATTENTION, nsame = 2; break;
    case OP_ATTENTION_DK: want = OP_ATTENTION_DV, nsame = 6; break;
    case OP_ATTENTION_DV: want = OP_ATTENTION_DK, nsame = 6; break;
    default: return -1;
    }
    for (int j = 0; j < g->ops.n; j++) {
        const Op *b = &g->ops.v[j];
        if (b->code != want || !ir_attn_same_attrs(&a->attr, &b->attr))
            continue;
        bool same = ir_attn_bias_in(a) == ir_attn_bias_in(b);
        for (int x = 0; x < nsame && same; x++)
            same = a->in[x] == b->in[x];
        if (same)
            return j;
    }
    return -1;
}

static int add_param(CgKernel *k, int t, DType dt, bool out)
{
    CgParam p = {.tensor = t, .dt = dt, .out = out};
    vec_push(&k->params, p);
    return k->params.n - 1;
}

/* cg_lower_attn and cg_lower_attn_dqkv: ops[0..n) as one kernel; part -1
 * for ops of their own, 0 or 1 for the dq or the dk/dv kernel of
 * attention_dqkv ops[0] (n 1), which writes its one result. */
static bool lower(const Graph *g, const int *ops, int n, int part, CgKernel *k, Diag *d)
{
    const Op *op = &g->ops.v[ops[0]];
    const Shape *q = &g->t.v[op->in[0]].s;
    if (q->dtype != DT_F32) {
        snprintf(d->msg, sizeof d->msg,
                 "%s:%d: %s on %s is not supported by the CPU backend yet (expected f32)",
                 op->loc.file ? op->loc.file : "?", op->loc.line, ir_opinfo[op->code].name,
                 dtype_name(q->dtype));
        return false;
    }
    CgAttn *a = &k->attn;
    ir_attn_layout(g, op, &a->lay);
    a->Tq = a->lay.Tq;
    a->D = a->lay.D;
    a->Tk = a->lay.Tk;
    a->Dv = a->lay.Dv;
    a->batch = a->lay.nb * a->lay.nh;
    a->causal = op->attr.ia[0] != 0;
    a->scale = op->attr.f;
    a->dt = q->dtype;
    a->q = a->k = a->v = a->o = a->lse = a->dO = a->delta = a->dq = a->dk = a->dv = -1;
    a->bias = -1;
    a->nops = n;
    a->dqkv = part >= 0;
    bool has[OP__COUNT] = {0};
    int out[OP__COUNT];
    for (int x = 0; x < n; x++) {
        a->ops[x] = ops[x];
        has[g->ops.v[ops[x]].code] = true;
        out[g->ops.v[ops[x]].code] = g->ops.v[ops[x]].out;
    }
    if (part >= 0) { /* attention_dqkv: its dq, or its dk and dv */
        has[OP_ATTENTION_DQKV] = false;
        Opcode c0 = part ? OP_ATTENTION_DK : OP_ATTENTION_DQ, c1 = part ? OP_ATTENTION_DV : c0;
        has[c0] = has[c1] = true;
        out[c0] = out[c1] = op->out;
    }
    const int *in = op->in;
    a->q = add_param(k, in[0], a->dt, false);
    a->k = add_param(k, in[1], a->dt, false);
    if (has[OP_ATTENTION] || has[OP_ATTENTION_LSE]) {
        a->kind = CG_ATTN_FWD;
        if (has[OP_ATTENTION]) {
            a->v = add_param(k, in[2], a->dt, false);
            a->o = add_param(k, out[OP_ATTENTION], a->dt, true);
        }
        if (has[OP_ATTENTION_LSE])
            a->lse = add_param(k, out[OP_ATTENTION_LSE], DT_F32, true);
    } else {
        a->kind = has[OP_ATTENTION_DQ] ? CG_ATTN_DQ : CG_ATTN_DKV;
        bool need_v = !has[OP_ATTENTION_DV] || has[OP_ATTENTION_DK];
        if (need_v)
            a->v = add_param(k, in[2], a->dt, false);
        a->dO = add_param(k, in[3], a->dt, false);
        a->lse = add_param(k, in[4], DT_F32, false);
        if (need_v)
            a->delta = add_param(k, in[5], DT_F32, false);
        if (has[OP_ATTENTION_DQ])
            a->dq = add_param(k, out[OP_ATTENTION_DQ], a->dt, true);
        if (has[OP_ATTENTION_DK])
            a->dk = add_param(k, out[OP_ATTENTION_DK], a->dt, true);
        /* one param when dk and dv go to one tensor (attention_dqkv) */
        if (has[OP_ATTENTION_DV])
            a->dv = part >= 0 && a->dk >= 0 ? a->dk
                                            : add_param(k, out[OP_ATTENTION_DV], a->dt, true);
    }
    if (a->lay.bias) { /* read in its own dtype: f32, or u8 for a mask */
        int bt = ir_attn_bias_in(op);
        DType bdt = g->t.v[bt].s.dtype;
        if (bdt != DT_F32 && bdt != DT_U8) {
            snprintf(d->msg, sizeof d->msg,
                     "%s:%d: an attention bias of %s is not supported by the CPU backend yet "
                     "(expected f32)",
                     op->loc.file ? op->loc.file : "?", op->loc.line, dtype_name(bdt));
            return false;
        }
        a->bias = add_param(k, bt, bdt, false);
    }
    k->op = ops[0];
    k->group = -1;
    k->parallel = true;
    k->noalias = true;
    return true;
}

bool cg_lower_attn(const Graph *g, const int *ops, int n, CgKernel *k, Diag *d)
{
    return lower(g, ops, n, -1, k, d);
}

bool cg_lower_attn_dqkv(const Graph *g, int i, bool dkv, CgKernel *k, Diag *d)
{
    return lower(g, &i, 1, dkv, k, d);
}

bool cg_c_attn_folded(const CgAttn *a)
{
    const char *off = getenv("KILN_ATTN_FOLD"); /* tests: 0 keeps the two kernels */
    return a->dqkv && (a->kind == CG_ATTN_DQ || a->kind == CG_ATTN_DKV) &&
           a->batch >= CG_ATTN_FOLD_ITEMS && !(off && strcmp(off, "0") == 0);
}

int64_t cg_attn_work(const CgAttn *a)
{
    int64_t pairs = a->causal ? a->Tq * (a->Tq + 1) / 2 : a->Tq * a->Tk;
    int64_t W = a->lay.window;
    if (W > 0 && W < a->Tq) /* a causal window: rows i >= W keep W keys */
        pairs = W * (W + 1) / 2 + (a->Tq - W) * W;
    if (cg_c_attn_folded(a)) /* the dk/dv kernel's five products a pair; dq's none */
        return a->kind == CG_ATTN_DQ ? 0 : a->batch * pairs * (5 * (a->D + a->Dv) + 40);
    return a->batch * pairs * (2 * a->D + 2 * a->Dv + 20);
}

/* kt[x][jj] = k[j0 + jj][x] (and vt from v when `v`), jj < nk: the key
 * tile transposed, the B operand of S = q k^T (dP = dO v^T). */
static void print_transpose(CgBuf *b, bool v, const char *ind)
{
    cg_printf(b,
              "%sfor (int64_t jj = 0; jj < nk; jj++) {\n"
              "%s    for (int64_t x = 0; x < A_D; x++)\n"
              "%s        kt[x][jj] = kb[(j0 + jj) * A_KR + x];\n",
              ind, ind, ind);
    if (v)
        cg_printf(b,
                  "%s    for (int64_t x = 0; x < A_DV; x++)\n"
                  "%s        vt[x][jj] = vb[(j0 + jj) * A_VR + x];\n",
                  ind, ind);
    cg_printf(b, "%s}\n", ind);
}

/* rt[x][r] = rows i0 + r < i0 + nq of `src` (row stride `rs`), x < `dim`: a
 * query tile transposed once per work item, the B operand of S^T = k q^T
 * (dP^T = v dO^T). */
static void print_rows_t(CgBuf *b, const char *dst, const char *src, const char *rs,
                         const char *dim)
{
    cg_printf(b,
              "        for (int64_t r = 0; r < nq; r++)\n"
              "            for (int64_t x = 0; x < %s; x++)\n"
              "                %s[x][r] = %s[r * %s + x];\n",
              dim, dst, src, rs);
}

/* With a mask tensor: skip the tile pair (query rows i0 + r, r < nq; keys
 * j0 + jj, jj < nk) when it keeps no (i, j): every P and dS of it is 0, so
 * the sums skip only terms that change nothing (the same bits). */
static void print_skip(CgBuf *b, const CgAttn *a, const char *ind)
{
    if (a->lay.bias != IR_ATTN_MASK)
        return;
    cg_printf(b,
              "%s{ /* a tile pair the mask drops whole */\n"
              "%s    int any = 0;\n"
              "%s    for (int64_t r = 0; r < nq && !any; r++)\n"
              "%s        for (int64_t jj = 0; jj < nk && !any; jj++)\n"
              "%s            any = A_KEEP(i0 + r, j0 + jj);\n"
              "%s    if (!any)\n"
              "%s        continue;\n"
              "%s}\n",
              ind, ind, ind, ind, ind, ind, ind, ind);
}

static void print_fwd(CgBuf *b, const CgAttn *a)
{
    cg_puts(b, "    const int64_t nt = (A_TQ + A_BQ - 1) / A_BQ;\n"
               "    for (int64_t w = part; w < A_NB * nt; w += nparts) {\n"
               "        int64_t bb = w / nt, i0 = (w % nt) * A_BQ;\n"
               "        int64_t nq = A_TQ - i0 < A_BQ ? A_TQ - i0 : A_BQ;\n");
    cg_printf(b, "        const float *qb = p%d + A_QB(bb) + i0 * A_QR;\n", a->q);
    cg_printf(b, "        const float *kb = p%d + A_KB(bb);\n", a->k);
    if (a->o >= 0)
        cg_printf(b, "        const float *vb = p%d + A_VB(bb);\n"
                     "        float acc[A_BQ][A_DV] = {{0}};\n",
                  a->v);
    cg_puts(b, "        float m[A_BQ], l[A_BQ], mt[A_BQ], al[A_BQ], ls[A_BQ];\n"
               "        float ST[A_BK][A_BQ], qT[A_D][A_BQ];\n"
               "        for (int64_t r = 0; r < A_BQ; r++) {\n"
               "            m[r] = -KILN_INF;\n"
               "            l[r] = 0.0f;\n"
               "        }\n");
    print_rows_t(b, "qT", "qb", "A_QR", "A_D");
    cg_puts(b, "        int64_t kend = A_CAUSAL ? i0 + nq : A_TK;\n"
               "        for (int64_t j0 = A_KSTART(i0); j0 < kend; j0 += A_BK) {\n"
               "            int64_t nk = kend - j0 < A_BK ? kend - j0 : A_BK;\n");
    print_skip(b, a, "            ");
    cg_puts(b, "            for (int64_t jj = 0; jj < nk; jj++)\n"
               "                for (int64_t r = 0; r < nq; r++)\n"
               "                    ST[jj][r] = 0.0f;\n"
               "            kiln_attn_mm(&ST[0][0], A_BQ, kb + j0 * A_KR, A_KR, 1, &qT[0][0], A_BQ, nk, "
               "nq, A_D);\n"
               "            for (int64_t r = 0; r < nq; r++)\n"
               "                mt[r] = m[r], ls[r] = 0.0f;\n"
               "            for (int64_t jj = 0; jj < nk; jj++)\n"
               "                for (int64_t r = 0; r < nq; r++) {\n"
               "                    float s = A_SC(ST[jj][r], i0 + r, j0 + jj);\n"
               "                    s = A_KEEP(i0 + r, j0 + jj) ? s : -KILN_INF;\n"
               "                    ST[jj][r] = s;\n"
               "                    mt[r] = kiln_fmax(mt[r], s);\n"
               "                }\n"
               "            for (int64_t jj = 0; jj < nk; jj++)\n"
               "                for (int64_t r = 0; r < nq; r++) {\n"
               "                    float e = kiln_expf(ST[jj][r] - mt[r]);\n"
               /* with a bias or mask the scores A_KEEP drops are -inf already:
                * reading the mask again here made the masked forward 1.3x
                * slower (its loads in the vector loop) */
               "                    e = (A_ANY ? ST[jj][r] != -KILN_INF : A_KEEP(i0 + r, j0 + jj)) "
               "? e : 0.0f;\n"
               "                    ST[jj][r] = e;\n"
               "                    ls[r] += e;\n"
               "                }\n"
               "            for (int64_t r = 0; r < nq; r++) {\n"
               "                al[r] = (A_WIN || A_ANY) && mt[r] == -KILN_INF ? 1.0f : kiln_expf(m[r] - "
               "mt[r]);\n"
               "                l[r] = l[r] * al[r] + ls[r];\n"
               "                m[r] = mt[r];\n"
               "            }\n");
    if (a->o >= 0)
        cg_puts(b, "            for (int64_t r = 0; r < nq; r++)\n"
                   "                for (int64_t x = 0; x < A_DV; x++)\n"
                   "                    acc[r][x] *= al[r];\n"
                   "            kiln_attn_mm(&acc[0][0], A_DV, &ST[0][0], 1, A_BQ, vb + j0 * A_VR, "
                   "A_VR, nq, A_DV, nk);\n");
    cg_puts(b, "        }\n"
               "        for (int64_t r = 0; r < nq; r++) {\n");
    if (a->o >= 0)
        cg_printf(b, "            float inv = A_ANY && l[r] == 0.0f ? 0.0f : 1.0f / l[r];\n"
                     "            float *orow = p%d + A_OB(bb) + (i0 + r) * A_OR;\n"
                     "            for (int64_t x = 0; x < A_DV; x++)\n"
                     "                orow[x] = acc[r][x] * inv;\n",
                  a->o);
    if (a->lse >= 0)
        cg_printf(b, "            p%d[A_SB(bb) + (i0 + r) * A_SR] = m[r] + logf(l[r]);\n", a->lse);
    cg_puts(b, "        }\n"
               "    }\n");
}

/* For rows r < nq of a tile at query row i0 and keys jj < nk at key j0:
 * S = q k^T (kt), P = exp(scale S - lse) on kept (i, j) else 0, in S; with
 * dp, dP = dO v^T (vt) and then S = dS = P (dP - delta) scale. */
static void print_p_ds(CgBuf *b, bool ds, const char *ind)
{
    cg_printf(b,
              "%sconst int64_t nke = A_CAUSAL && i0 + nq - j0 < nk ? i0 + nq - j0 : nk;\n"
              "%sfor (int64_t r = 0; r < nq; r++)\n"
              "%s    for (int64_t jj = 0; jj < nke; jj++)\n"
              "%s        S[r][jj] = 0.0f%s;\n"
              "%skiln_attn_mm(&S[0][0], A_BK, qt, A_QR, 1, &kt[0][0], A_BK, nq, nke, A_D);\n",
              ind, ind, ind, ind, ds ? ", dP[r][jj] = 0.0f" : "", ind);
    if (ds)
        cg_printf(b, "%skiln_attn_mm(&dP[0][0], A_BK, gt, A_OR, 1, &vt[0][0], A_BK, nq, nke, A_DV);\n",
                  ind);
    cg_printf(b,
              "%sfor (int64_t r = 0; r < nq; r++) {\n"
              "%s    int64_t ne = A_CAUSAL ? i0 + r - j0 + 1 : nke;\n"
              "%s    ne = ne < 0 ? 0 : ne < nke ? ne : nke;\n"
              "%s    int64_t ns = A_WIN ? i0 + r - A_WIN + 1 - j0 : 0;\n"
              "%s    ns = ns < 0 ? 0 : ns < ne ? ns : ne;\n"
              "%s    float L = lt[r * A_SR];\n"
              "%s    for (int64_t jj = 0; jj < ns; jj++)\n"
              "%s        S[r][jj] = 0.0f;\n"
              "%s    for (int64_t jj = ns; jj < ne; jj++)\n"
              "%s        S[r][jj] = A_P(S[r][jj], i0 + r, j0 + jj, L);\n"
              "%s    for (int64_t jj = ne; jj < nke; jj++)\n"
              "%s        S[r][jj] = 0.0f;\n",
              ind, ind, ind, ind, ind, ind, ind, ind, ind, ind, ind, ind);
    if (ds)
        cg_printf(b,
                  "%s    float De = dt[r * A_SR];\n"
                  "%s    for (int64_t jj = 0; jj < nke; jj++)\n"
                  "%s        dP[r][jj] = S[r][jj] * (dP[r][jj] - De) * A_SCALE;\n",
                  ind, ind, ind);
    cg_printf(b, "%s}\n", ind);
}

static void print_dq(CgBuf *b, const CgAttn *a)
{
    cg_puts(b, "    const int64_t nt = (A_TQ + A_BQ - 1) / A_BQ;\n"
               "    for (int64_t w = part; w < A_NB * nt; w += nparts) {\n"
               "        int64_t bb = w / nt, i0 = (w % nt) * A_BQ;\n"
               "        int64_t nq = A_TQ - i0 < A_BQ ? A_TQ - i0 : A_BQ;\n");
    cg_printf(b,
              "        const float *qt = p%d + A_QB(bb) + i0 * A_QR;\n"
              "        const float *kb = p%d + A_KB(bb);\n"
              "        const float *vb = p%d + A_VB(bb);\n"
              "        const float *gt = p%d + A_OB(bb) + i0 * A_OR;\n"
              "        const float *lt = p%d + A_SB(bb) + i0 * A_SR;\n"
              "        const float *dt = p%d + A_SB(bb) + i0 * A_SR;\n",
              a->q, a->k, a->v, a->dO, a->lse, a->delta);
    cg_puts(b, "        float acc[A_BQ][A_D] = {{0}};\n"
               "        float ST[A_BK][A_BQ], dPT[A_BK][A_BQ], qT[A_D][A_BQ], gT[A_DV][A_BQ];\n"
               "        float L[A_BQ], De[A_BQ];\n"
               "        for (int64_t r = 0; r < nq; r++)\n"
               "            L[r] = lt[r * A_SR], De[r] = dt[r * A_SR];\n");
    print_rows_t(b, "qT", "qt", "A_QR", "A_D");
    print_rows_t(b, "gT", "gt", "A_OR", "A_DV");
    cg_puts(b, "        int64_t kend = A_CAUSAL ? i0 + nq : A_TK;\n"
               "        for (int64_t j0 = A_KSTART(i0); j0 < kend; j0 += A_BK) {\n"
               "            int64_t nk = kend - j0 < A_BK ? kend - j0 : A_BK;\n");
    print_skip(b, a, "            ");
    cg_puts(b, "            for (int64_t jj = 0; jj < nk; jj++)\n"
               "                for (int64_t r = 0; r < nq; r++)\n"
               "                    ST[jj][r] = 0.0f, dPT[jj][r] = 0.0f;\n"
               "            kiln_attn_mm(&ST[0][0], A_BQ, kb + j0 * A_KR, A_KR, 1, &qT[0][0], A_BQ, nk, "
               "nq, A_D);\n"
               "            kiln_attn_mm(&dPT[0][0], A_BQ, vb + j0 * A_VR, A_VR, 1, &gT[0][0], A_BQ, "
               "nk, nq, A_DV);\n"
               "            for (int64_t jj = 0; jj < nk; jj++)\n"
               "                for (int64_t r = 0; r < nq; r++) {\n"
               "                    float p = A_P(ST[jj][r], i0 + r, j0 + jj, L[r]);\n");
    if (a->lay.bias != IR_ATTN_MASK) /* a mask's A_P has applied A_KEEP */
        cg_puts(b, "                    p = A_KEEP(i0 + r, j0 + jj) ? p : 0.0f;\n");
    cg_puts(b, "                    dPT[jj][r] = p * (dPT[jj][r] - De[r]) * A_SCALE;\n"
               "                }\n"
               "            kiln_attn_mm(&acc[0][0], A_D, &dPT[0][0], 1, A_BQ, kb + j0 * A_KR, A_KR, "
               "nq, A_D, nk);\n"
               "        }\n");
    cg_printf(b,
              "        for (int64_t r = 0; r < nq; r++)\n"
              "            for (int64_t x = 0; x < A_D; x++)\n"
              "                p%d[A_DQB(bb) + (i0 + r) * A_DQR + x] = acc[r][x];\n"
              "    }\n",
              a->dq);
}

static void print_dkv(CgBuf *b, const CgAttn *a)
{
    bool dk = a->dk >= 0, dv = a->dv >= 0;
    cg_puts(b, "    const int64_t nt = (A_TK + A_BK - 1) / A_BK;\n"
               "    for (int64_t w = part; w < A_NB / A_G * nt; w += nparts) {\n"
               "        int64_t bk = w / nt * A_G, j0 = (w % nt) * A_BK;\n"
               "        int64_t nk = A_TK - j0 < A_BK ? A_TK - j0 : A_BK;\n");
    cg_printf(b, "        const float *kb = p%d + A_KB(bk);\n", a->k);
    if (dk)
        cg_printf(b,
                  "        const float *vb = p%d + A_VB(bk);\n"
                  "        float vt[A_DV][A_BK], dP[A_BQ][A_BK], adk[A_BK][A_D] = {{0}};\n",
                  a->v);
    if (dv)
        cg_puts(b, "        float adv[A_BK][A_DV] = {{0}};\n");
    cg_puts(b, "        float kt[A_D][A_BK], S[A_BQ][A_BK];\n");
    print_transpose(b, dk, "        ");
    /* the group's query items, one after the other (g = 1: bb = bk) */
    cg_printf(b,
              "        for (int64_t bb = bk; bb < bk + A_G; bb++) {\n"
              "        const float *qb = p%d + A_QB(bb);\n"
              "        const float *gb = p%d + A_OB(bb);\n"
              "        const float *lb = p%d + A_SB(bb);\n",
              a->q, a->dO, a->lse);
    if (dk)
        cg_printf(b, "        const float *db = p%d + A_SB(bb);\n", a->delta);
    cg_puts(b, "        for (int64_t i0 = A_CAUSAL ? j0 / A_BQ * A_BQ : 0; i0 < A_QEND(j0 + nk); "
               "i0 += A_BQ) {\n"
               "            int64_t nq = A_TQ - i0 < A_BQ ? A_TQ - i0 : A_BQ;\n"
               "            const float *qt = qb + i0 * A_QR, *gt = gb + i0 * A_OR;\n"
               "            const float *lt = lb + i0 * A_SR;\n");
    print_skip(b, a, "            ");
    if (dk)
        cg_puts(b, "            const float *dt = db + i0 * A_SR;\n");
    print_p_ds(b, dk, "            ");
    if (dv)
        cg_puts(b, "            kiln_attn_mm(&adv[0][0], A_DV, &S[0][0], 1, A_BK, gt, A_OR, nke, "
                   "A_DV, nq);\n");
    if (dk)
        cg_puts(b, "            kiln_attn_mm(&adk[0][0], A_D, &dP[0][0], 1, A_BK, qt, A_QR, nke, "
                   "A_D, nq);\n");
    cg_puts(b, "        }\n"
               "        }\n"
               "        for (int64_t jj = 0; jj < nk; jj++) {\n");
    if (dk)
        cg_printf(b, "            for (int64_t x = 0; x < A_D; x++)\n"
                     "                p%d[A_DKB(bk) + (j0 + jj) * A_DKR + x] = adk[jj][x];\n",
                  a->dk);
    if (dv)
        cg_printf(b, "            for (int64_t x = 0; x < A_DV; x++)\n"
                     "                p%d[A_DVB(bk) + (j0 + jj) * A_DVR + x] = adv[jj][x];\n",
                  a->dv);
    cg_puts(b, "        }\n"
               "    }\n");
}

/* attention_dqkv as one kernel (cg_c_attn_folded), per (batch entry,
 * head): dq starts at 0 in its columns of the result; for each key tile
 * (k and v transposed once), walk the query tiles that keep any of its
 * keys: P and dS as in the dk/dv kernel, dv_j += P^T dO_i, dk_j += dS^T q_i
 * and dq_i += dS k_j straight into the result. Five products a tile pair
 * where the two kernels take seven (both recompute S and dP). Every
 * element's sum runs in the order the two kernels use: dk and dv over the
 * query rows ascending, dq over the keys ascending (the keys past a row's
 * last, which the dq kernel leaves out, add dS = 0 terms, which change no
 * sum of finite values), so the bits are the same. */
static void print_dqkv(CgBuf *b, const CgAttn *a)
{
    cg_printf(b,
              "    for (int64_t bk = part * A_G; bk < A_NB; bk += nparts * A_G) {\n"
              "        const float *kb = p%d + A_KB(bk);\n"
              "        const float *vb = p%d + A_VB(bk);\n",
              a->k, a->v);
    cg_printf(b,
              "        float kt[A_D][A_BK], vt[A_DV][A_BK], S[A_BQ][A_BK], dP[A_BQ][A_BK];\n"
              "        float adk[A_BK][A_D], adv[A_BK][A_DV];\n"
              "        for (int64_t bb = bk; bb < bk + A_G; bb++)\n"
              "            for (int64_t i = 0; i < A_TQ; i++)\n"
              "                for (int64_t x = 0; x < A_D; x++)\n"
              "                    p%d[A_DQB(bb) + i * A_DQR + x] = 0.0f;\n"
              "        for (int64_t j0 = 0; j0 < A_TK; j0 += A_BK) {\n",
              a->dk);
    cg_puts(b, "            int64_t nk = A_TK - j0 < A_BK ? A_TK - j0 : A_BK;\n"
               "            for (int64_t jj = 0; jj < nk; jj++) {\n"
               "                for (int64_t x = 0; x < A_D; x++)\n"
               "                    adk[jj][x] = 0.0f;\n"
               "                for (int64_t x = 0; x < A_DV; x++)\n"
               "                    adv[jj][x] = 0.0f;\n"
               "            }\n");
    print_transpose(b, true, "            ");
    cg_printf(b,
              "            for (int64_t bb = bk; bb < bk + A_G; bb++) {\n"
              "            const float *qb = p%d + A_QB(bb);\n"
              "            const float *gb = p%d + A_OB(bb);\n"
              "            const float *lb = p%d + A_SB(bb);\n"
              "            const float *db = p%d + A_SB(bb);\n"
              "            float *dqb = p%d + A_DQB(bb);\n",
              a->q, a->dO, a->lse, a->delta, a->dk);
    cg_puts(b, "            for (int64_t i0 = A_CAUSAL ? j0 / A_BQ * A_BQ : 0; i0 < A_QEND(j0 + nk); "
               "i0 += A_BQ) {\n"
               "                int64_t nq = A_TQ - i0 < A_BQ ? A_TQ - i0 : A_BQ;\n"
               "                const float *qt = qb + i0 * A_QR, *gt = gb + i0 * A_OR;\n"
               "                const float *lt = lb + i0 * A_SR, *dt = db + i0 * A_SR;\n");
    print_skip(b, a, "                ");
    print_p_ds(b, true, "                ");
    cg_puts(b, "                kiln_attn_mm(&adv[0][0], A_DV, &S[0][0], 1, A_BK, gt, A_OR, nke, "
               "A_DV, nq);\n"
               "                kiln_attn_mm(&adk[0][0], A_D, &dP[0][0], 1, A_BK, qt, A_QR, nke, "
               "A_D, nq);\n"
               "                kiln_attn_mm(dqb + i0 * A_DQR, A_DQR, &dP[0][0], A_BK, 1, kb + j0 * "
               "A_KR, A_KR, nq, A_D, nke);\n"
               "            }\n"
               "            }\n");
    cg_printf(b,
              "            for (int64_t jj = 0; jj < nk; jj++) {\n"
              "                for (int64_t x = 0; x < A_D; x++)\n"
              "                    p%d[A_DKB(bk) + (j0 + jj) * A_DKR + x] = adk[jj][x];\n"
              "                for (int64_t x = 0; x < A_DV; x++)\n"
              "                    p%d[A_DVB(bk) + (j0 + jj) * A_DVR + x] = adv[jj][x];\n"
              "            }\n"
              "        }\n"
              "    }\n",
              a->dk, a->dv);
}

/* The layout macros' tensors, in IrAttnLayout's order (q ... dv, st). */
static const char *const lay_names[8] = {"Q", "K", "V", "O", "DQ", "DK", "DV", "S"};

void cg_print_c_attn(CgBuf *b, const CgKernel *k)
{
    const CgAttn *a = &k->attn;
    const char *restrict_ = k->noalias ? "restrict " : "";
    cg_printf(b, "void %s(", k->name);
    for (int i = 0; i < k->params.n; i++) {
        const CgParam *p = &k->params.v[i];
        cg_printf(b, "%s%s%s *%sp%d", i ? ", " : "", p->out ? "" : "const ",
                  p->dt == DT_U8 ? "unsigned char" : "float", restrict_, i);
    }
    cg_puts(b, ", int64_t part, int64_t nparts)\n{\n");
    /* the sizes as macros, defined inside the function: the backend splits
     * a file at "\nvoid ", so nothing of a kernel may come before it */
    cg_printf(b,
              "#define A_NB %lldLL\n#define A_TQ %lldLL\n#define A_TK %lldLL\n"
              "#define A_D %lldLL\n#define A_DV %lldLL\n#define A_BQ %d\n#define A_BK %d\n"
              "#define A_CAUSAL %d\n#define A_SCALE %.9ef\n",
              (long long)a->batch, (long long)a->Tq, (long long)a->Tk, (long long)a->D,
              (long long)a->Dv, A_BQ, A_BK, a->causal ? 1 : 0, a->scale);
    /* the variants (ir.h): A_G query items per key/value item; the kept
     * (i, j) (A_KEEP; A_WIN 0: no window); the first key tile of query
     * tile i0 and the end of the query rows that keep a key below j1 (the
     * tiles a window skips); the score of raw product s at (i, j) (A_SC:
     * with alibi, the slope of item bb, a table of A_AH slopes) */
    const IrAttnLayout *Lv = &a->lay;
    cg_printf(b,
              "#define A_G %lldLL\n#define A_WIN %lldLL\n"
              "#define A_KSTART(i0) (A_WIN && (i0) + 1 > A_WIN ? ((i0) + 1 - A_WIN) / A_BK * A_BK : 0)\n"
              "#define A_QEND(j1) (A_WIN && (j1) - 1 + A_WIN < A_TQ ? (j1) - 1 + A_WIN : A_TQ)\n",
              (long long)Lv->g, (long long)Lv->window);
    const char *sc = "((s) * A_SCALE)";
    if (Lv->ah) {
        cg_printf(b, "    static const float A_slope[%lld] = {", (long long)Lv->ah);
        for (int64_t h = 0; h < Lv->ah; h++)
            cg_printf(b, "%s%.9ef", h ? ", " : "", ir_alibi_slope(Lv->ah, h));
        cg_printf(b, "};\n#define A_AH %lldLL\n", (long long)Lv->ah);
        sc = "((s) * A_SCALE + A_slope[bb % A_AH] * (float)((j) - (i)))";
    }
    /* the bias or mask (ir.h): element (i, j) of item bb at A_BX(bb, i, j);
     * a bias adds to A_SC, a mask ands A_KEEP. A_ANY: a row may keep no key
     * in a tile or at all (a score of -inf), so exp terms of -inf are 0 and
     * o = 0 where the row's sum l is 0. A_P(s, i, j, L): P_ij from raw
     * product s and the row's lse L (before A_KEEP) */
    const char *keep = "((!A_CAUSAL || (j) <= (i)) && (!A_WIN || (i) - (j) < A_WIN))";
    if (Lv->bias)
        cg_printf(b,
                  "#define A_BX(bb, i, j) p%d[((bb) / %lldLL %% %lldLL) * %lldLL + (i) * %lldLL + "
                  "(j) * %lldLL]\n",
                  a->bias, (long long)Lv->bdiv, (long long)Lv->bmod, (long long)Lv->bbs,
                  (long long)Lv->bis, (long long)Lv->bjs);
    if (Lv->bias == IR_ATTN_BIAS)
        cg_printf(b, "#define A_SC(s, i, j) (%s + A_BX(bb, i, j))\n"
                     "#define A_KEEP(i, j) %s\n"
                     "#define A_P(s, i, j, L) kiln_attn_pexp(A_SC(s, i, j), L)\n",
                  sc, keep);
    else if (Lv->bias == IR_ATTN_MASK)
        cg_printf(b, "#define A_SC(s, i, j) %s\n"
                     "#define A_KEEP(i, j) (%s & (A_BX(bb, i, j) != 0))\n"
                     "#define A_P(s, i, j, L) (A_KEEP(i, j) ? kiln_expf(A_SC(s, i, j) - (L)) : "
                     "0.0f)\n",
                  sc, keep);
    else
        cg_printf(b, "#define A_SC(s, i, j) %s\n#define A_KEEP(i, j) %s\n"
                     "#define A_P(s, i, j, L) kiln_expf(A_SC(s, i, j) - (L))\n",
                  sc, keep);
    cg_printf(b, "#define A_ANY %d\n", Lv->bias ? 1 : 0);
    /* where (b, h, i, d) sits (IrAttnLayout): bb = b * A_NH + h; A_xB(bb) is
     * the offset of row 0 of head h of batch entry b, A_xR the row stride */
    const IrAttnLayout *L = &a->lay;
    const IrAttnStride *st[8] = {&L->q, &L->k, &L->v, &L->o, &L->dq, &L->dk, &L->dv, &L->st};
    cg_printf(b, "#define A_NH %lldLL\n#define A_NHK %lldLL\n", (long long)L->nh,
              (long long)L->nhk);
    for (int x = 0; x < 8; x++) {
        /* k, v, dk and dv of key/value item bb / A_G (grouped heads) */
        bool kv = x == 1 || x == 2 || x == 5 || x == 6;
        cg_printf(b,
                  kv ? "#define A_%sB(bb) (((bb) / A_G / A_NHK) * %lldLL + ((bb) / A_G %% A_NHK) * "
                       "%lldLL + %lldLL)\n#define A_%sR %lldLL\n"
                     : "#define A_%sB(bb) (((bb) / A_NH) * %lldLL + ((bb) %% A_NH) * %lldLL + "
                       "%lldLL)\n#define A_%sR %lldLL\n",
                  lay_names[x], (long long)st[x]->bs, (long long)st[x]->hs,
                  (long long)st[x]->off, lay_names[x], (long long)st[x]->rs);
    }
    switch (a->kind) {
    case CG_ATTN_FWD: print_fwd(b, a); break;
    case CG_ATTN_DQ: /* folded: the dk/dv kernel computes dq (not run) */
        if (cg_c_attn_folded(a))
            cg_puts(b, "    (void)part, (void)nparts;\n");
        else
            print_dq(b, a);
        break;
    case CG_ATTN_DKV: cg_c_attn_folded(a) ? print_dqkv(b, a) : print_dkv(b, a); break;
    default: die("cg_print_c_attn: kernel %s is no attention kernel", k->name);
    }
    cg_puts(b, "}\n"
               "#undef A_NB\n#undef A_TQ\n#undef A_TK\n#undef A_D\n#undef A_DV\n#undef A_BQ\n"
               "#undef A_BK\n#undef A_CAUSAL\n#undef A_SCALE\n#undef A_NH\n#undef A_NHK\n"
               "#undef A_G\n#undef A_WIN\n#undef A_KEEP\n#undef A_KSTART\n#undef A_QEND\n"
               "#undef A_SC\n#undef A_P\n#undef A_ANY\n");
    if (Lv->ah)
        cg_puts(b, "#undef A_AH\n");
    if (Lv->bias)
        cg_puts(b, "#undef A_BX\n");
    for (int x = 0; x < 8; x++)
        cg_printf(b, "#undef A_%sB\n#undef A_%sR\n", lay_names[x], lay_names[x]);
}
