/* cattn.c - the attention kernels of the C backend (CgAttn, codegen.h):
 * flash-attention style, tiled, with no T x T tensor in memory.
 *
 * Forward (CG_ATTN_FWD), per (batch entry, tile of A_BQ query rows): walk
 * the key tiles of A_BK keys (causal: only tiles with a key <= the tile's
 * last row; per row, only the kept keys), S = scale q k^T for the tile
 * (k transposed into a local [D][BK] block so the products vectorise over
 * keys), online softmax (running max m and sum l per row, the accumulator
 * rescaled by exp(m_old - m_new)), accumulate P v; at the end o = acc / l
 * and lse = m + log l.
 * Backward recomputes P_ij = exp(S_ij - lse_i) from lse: CG_ATTN_DQ per
 * (batch entry, query tile) accumulates dq_i += s dS_ij k_j with dS_ij =
 * P_ij (dO_i . v_j - delta_i); CG_ATTN_DKV per (batch entry, key tile)
 * walks the query rows that keep any of its keys and accumulates
 * dv_j += P_ij dO_i and dk_j += s dS_ij q_i.
 * Work items are spread over the parts round-robin (part, part + nparts,
 * ...), which balances causal tiles of unequal cost; every output element
 * is written by the one item that owns its tile, in a fixed order, so the
 * result does not depend on the number of parts. f32 only (the C backend's
 * GEMMs and kernels are f32). */
#include "codegen.h"

#include <string.h>

enum { A_BQ = 32, A_BK = 64 };

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
        if (b->code != want || b->attr.ia[0] != a->attr.ia[0] || b->attr.f != a->attr.f)
            continue;
        bool same = true;
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

bool cg_lower_attn(const Graph *g, const int *ops, int n, CgKernel *k, Diag *d)
{
    const Op *op = &g->ops.v[ops[0]];
    const Shape *q = &g->t.v[op->in[0]].s, *ks = &g->t.v[op->in[1]].s;
    if (q->dtype != DT_F32) {
        snprintf(d->msg, sizeof d->msg,
                 "%s:%d: %s on %s is not supported by the CPU backend yet (expected f32)",
                 op->loc.file ? op->loc.file : "?", op->loc.line, ir_opinfo[op->code].name,
                 dtype_name(q->dtype));
        return false;
    }
    CgAttn *a = &k->attn;
    int r = q->rank;
    a->Tq = q->dim[r - 2];
    a->D = q->dim[r - 1];
    a->Tk = ks->dim[r - 2];
    a->Dv = op->nin > 2 ? g->t.v[op->in[2]].s.dim[r - 1] : a->D;
    a->batch = shape_numel(q) / (a->Tq * a->D);
    a->causal = op->attr.ia[0] != 0;
    a->scale = op->attr.f;
    a->dt = q->dtype;
    a->q = a->k = a->v = a->o = a->lse = a->dO = a->delta = a->dq = a->dk = a->dv = -1;
    a->nops = n;
    bool has[OP__COUNT] = {0};
    int out[OP__COUNT];
    for (int x = 0; x < n; x++) {
        a->ops[x] = ops[x];
        has[g->ops.v[ops[x]].code] = true;
        out[g->ops.v[ops[x]].code] = g->ops.v[ops[x]].out;
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
        if (has[OP_ATTENTION_DV])
            a->dv = add_param(k, out[OP_ATTENTION_DV], a->dt, true);
    }
    k->op = ops[0];
    k->group = -1;
    k->parallel = true;
    k->noalias = true;
    return true;
}

int64_t cg_attn_work(const CgAttn *a)
{
    int64_t pairs = a->causal ? a->Tq * (a->Tq + 1) / 2 : a->Tq * a->Tk;
    return a->batch * pairs * (2 * a->D + 2 * a->Dv + 20);
}

static void print_fwd(CgBuf *b, const CgAttn *a)
{
    cg_puts(b, "    const int64_t nt = (A_TQ + A_BQ - 1) / A_BQ;\n"
               "    for (int64_t w = part; w < A_NB * nt; w += nparts) {\n"
               "        int64_t bb = w / nt, i0 = (w % nt) * A_BQ;\n"
               "        int64_t nq = A_TQ - i0 < A_BQ ? A_TQ - i0 : A_BQ;\n");
    cg_printf(b, "        const float *qb = p%d + (bb * A_TQ + i0) * A_D;\n", a->q);
    cg_printf(b, "        const float *kb = p%d + bb * A_TK * A_D;\n", a->k);
    if (a->o >= 0)
        cg_printf(b, "        const float *vb = p%d + bb * A_TK * A_DV;\n"
                     "        float acc[A_BQ][A_DV] = {{0}};\n",
                  a->v);
    cg_puts(b, "        float m[A_BQ], l[A_BQ];\n"
               "        for (int64_t r = 0; r < A_BQ; r++) {\n"
               "            m[r] = -KILN_INF;\n"
               "            l[r] = 0.0f;\n"
               "        }\n"
               "        int64_t kend = A_CAUSAL ? i0 + nq : A_TK;\n"
               "        for (int64_t j0 = 0; j0 < kend; j0 += A_BK) {\n"
               "            int64_t nk = kend - j0 < A_BK ? kend - j0 : A_BK;\n"
               "            float kt[A_D][A_BK];\n"
               "            for (int64_t jj = 0; jj < nk; jj++)\n"
               "                for (int64_t x = 0; x < A_D; x++)\n"
               "                    kt[x][jj] = kb[(j0 + jj) * A_D + x];\n"
               "            for (int64_t r = 0; r < nq; r++) {\n"
               "                int64_t ne = A_CAUSAL ? i0 + r - j0 + 1 : nk;\n"
               "                ne = ne < nk ? ne : nk;\n"
               "                if (ne <= 0)\n"
               "                    continue;\n"
               "                float s[A_BK];\n"
               "                for (int64_t jj = 0; jj < ne; jj++)\n"
               "                    s[jj] = 0.0f;\n"
               "                for (int64_t x = 0; x < A_D; x++) {\n"
               "                    float qx = qb[r * A_D + x];\n"
               "                    for (int64_t jj = 0; jj < ne; jj++)\n"
               "                        s[jj] += qx * kt[x][jj];\n"
               "                }\n"
               "                float mx = m[r];\n"
               "                for (int64_t jj = 0; jj < ne; jj++) {\n"
               "                    s[jj] *= A_SCALE;\n"
               "                    mx = kiln_fmax(mx, s[jj]);\n"
               "                }\n"
               "                for (int64_t jj = 0; jj < ne; jj++)\n"
               "                    s[jj] = kiln_expf(s[jj] - mx);\n"
               "                float sum = 0.0f;\n"
               "                for (int64_t jj = 0; jj < ne; jj++)\n"
               "                    sum += s[jj];\n"
               "                float alpha = kiln_expf(m[r] - mx);\n"
               "                l[r] = l[r] * alpha + sum;\n"
               "                m[r] = mx;\n");
    if (a->o >= 0)
        cg_puts(b, "                float *ar = acc[r];\n"
                   "                for (int64_t x = 0; x < A_DV; x++)\n"
                   "                    ar[x] *= alpha;\n"
                   "                for (int64_t jj = 0; jj < ne; jj++) {\n"
                   "                    float pj = s[jj];\n"
                   "                    const float *vr = vb + (j0 + jj) * A_DV;\n"
                   "                    for (int64_t x = 0; x < A_DV; x++)\n"
                   "                        ar[x] += pj * vr[x];\n"
                   "                }\n");
    cg_puts(b, "            }\n"
               "        }\n"
               "        for (int64_t r = 0; r < nq; r++) {\n");
    if (a->o >= 0)
        cg_printf(b, "            float inv = 1.0f / l[r];\n"
                     "            float *orow = p%d + (bb * A_TQ + i0 + r) * A_DV;\n"
                     "            for (int64_t x = 0; x < A_DV; x++)\n"
                     "                orow[x] = acc[r][x] * inv;\n",
                  a->o);
    if (a->lse >= 0)
        cg_printf(b, "            p%d[bb * A_TQ + i0 + r] = m[r] + logf(l[r]);\n", a->lse);
    cg_puts(b, "        }\n"
               "    }\n");
}

/* s[jj] = q_row . k_j and (with dp) dp[jj] = dO_row . v_j over ne keys of
 * the tile, from the transposed blocks kt and vt. */
static void print_scores(CgBuf *b, const char *qrow, const char *orow, bool dp, int ind)
{
    char pad[32];
    memset(pad, ' ', sizeof pad);
    pad[ind < 31 ? ind : 31] = 0;
    cg_printf(b,
              "%sfor (int64_t jj = 0; jj < ne; jj++)\n"
              "%s    s[jj] = 0.0f;\n"
              "%sfor (int64_t x = 0; x < A_D; x++) {\n"
              "%s    float qx = %s[x];\n"
              "%s    for (int64_t jj = 0; jj < ne; jj++)\n"
              "%s        s[jj] += qx * kt[x][jj];\n"
              "%s}\n",
              pad, pad, pad, pad, qrow, pad, pad, pad);
    if (dp)
        cg_printf(b,
                  "%sfor (int64_t jj = 0; jj < ne; jj++)\n"
                  "%s    dp[jj] = 0.0f;\n"
                  "%sfor (int64_t x = 0; x < A_DV; x++) {\n"
                  "%s    float gx = %s[x];\n"
                  "%s    for (int64_t jj = 0; jj < ne; jj++)\n"
                  "%s        dp[jj] += gx * vt[x][jj];\n"
                  "%s}\n",
                  pad, pad, pad, pad, orow, pad, pad, pad);
}

static void print_dq(CgBuf *b, const CgAttn *a)
{
    cg_puts(b, "    const int64_t nt = (A_TQ + A_BQ - 1) / A_BQ;\n"
               "    for (int64_t w = part; w < A_NB * nt; w += nparts) {\n"
               "        int64_t bb = w / nt, i0 = (w % nt) * A_BQ;\n"
               "        int64_t nq = A_TQ - i0 < A_BQ ? A_TQ - i0 : A_BQ;\n");
    cg_printf(b,
              "        const float *qb = p%d + (bb * A_TQ + i0) * A_D;\n"
              "        const float *kb = p%d + bb * A_TK * A_D;\n"
              "        const float *vb = p%d + bb * A_TK * A_DV;\n"
              "        const float *gb = p%d + (bb * A_TQ + i0) * A_DV;\n"
              "        const float *lb = p%d + bb * A_TQ + i0;\n"
              "        const float *db = p%d + bb * A_TQ + i0;\n",
              a->q, a->k, a->v, a->dO, a->lse, a->delta);
    cg_puts(b, "        float acc[A_BQ][A_D] = {{0}};\n"
               "        int64_t kend = A_CAUSAL ? i0 + nq : A_TK;\n"
               "        for (int64_t j0 = 0; j0 < kend; j0 += A_BK) {\n"
               "            int64_t nk = kend - j0 < A_BK ? kend - j0 : A_BK;\n"
               "            float kt[A_D][A_BK], vt[A_DV][A_BK];\n"
               "            for (int64_t jj = 0; jj < nk; jj++) {\n"
               "                for (int64_t x = 0; x < A_D; x++)\n"
               "                    kt[x][jj] = kb[(j0 + jj) * A_D + x];\n"
               "                for (int64_t x = 0; x < A_DV; x++)\n"
               "                    vt[x][jj] = vb[(j0 + jj) * A_DV + x];\n"
               "            }\n"
               "            for (int64_t r = 0; r < nq; r++) {\n"
               "                int64_t ne = A_CAUSAL ? i0 + r - j0 + 1 : nk;\n"
               "                ne = ne < nk ? ne : nk;\n"
               "                if (ne <= 0)\n"
               "                    continue;\n"
               "                float s[A_BK], dp[A_BK];\n");
    print_scores(b, "(qb + r * A_D)", "(gb + r * A_DV)", true, 16);
    cg_puts(b, "                float L = lb[r], De = db[r];\n"
               "                for (int64_t jj = 0; jj < ne; jj++)\n"
               "                    s[jj] = kiln_expf(s[jj] * A_SCALE - L) * (dp[jj] - De) * A_SCALE;\n"
               "                float *ar = acc[r];\n"
               "                for (int64_t jj = 0; jj < ne; jj++) {\n"
               "                    float ds = s[jj];\n"
               "                    const float *kr = kb + (j0 + jj) * A_D;\n"
               "                    for (int64_t x = 0; x < A_D; x++)\n"
               "                        ar[x] += ds * kr[x];\n"
               "                }\n"
               "            }\n"
               "        }\n");
    cg_printf(b,
              "        for (int64_t r = 0; r < nq; r++)\n"
              "            for (int64_t x = 0; x < A_D; x++)\n"
              "                p%d[(bb * A_TQ + i0 + r) * A_D + x] = acc[r][x];\n"
              "    }\n",
              a->dq);
}

static void print_dkv(CgBuf *b, const CgAttn *a)
{
    bool dk = a->dk >= 0, dv = a->dv >= 0;
    cg_puts(b, "    const int64_t nt = (A_TK + A_BK - 1) / A_BK;\n"
               "    for (int64_t w = part; w < A_NB * nt; w += nparts) {\n"
               "        int64_t bb = w / nt, j0 = (w % nt) * A_BK;\n"
               "        int64_t nk = A_TK - j0 < A_BK ? A_TK - j0 : A_BK;\n");
    cg_printf(b,
              "        const float *qb = p%d + bb * A_TQ * A_D;\n"
              "        const float *kb = p%d + bb * A_TK * A_D;\n"
              "        const float *gb = p%d + bb * A_TQ * A_DV;\n"
              "        const float *lb = p%d + bb * A_TQ;\n",
              a->q, a->k, a->dO, a->lse);
    if (dk)
        cg_printf(b,
                  "        const float *vb = p%d + bb * A_TK * A_DV;\n"
                  "        const float *db = p%d + bb * A_TQ;\n"
                  "        float vt[A_DV][A_BK], adk[A_BK][A_D] = {{0}};\n",
                  a->v, a->delta);
    if (dv)
        cg_puts(b, "        float adv[A_BK][A_DV] = {{0}};\n");
    cg_puts(b, "        float kt[A_D][A_BK];\n"
               "        for (int64_t jj = 0; jj < nk; jj++) {\n"
               "            for (int64_t x = 0; x < A_D; x++)\n"
               "                kt[x][jj] = kb[(j0 + jj) * A_D + x];\n");
    if (dk)
        cg_puts(b, "            for (int64_t x = 0; x < A_DV; x++)\n"
                   "                vt[x][jj] = vb[(j0 + jj) * A_DV + x];\n");
    cg_puts(b, "        }\n"
               "        for (int64_t i = A_CAUSAL ? j0 : 0; i < A_TQ; i++) {\n"
               "            int64_t ne = A_CAUSAL ? i - j0 + 1 : nk;\n"
               "            ne = ne < nk ? ne : nk;\n"
               "            float s[A_BK], dp[A_BK];\n"
               "            const float *qi = qb + i * A_D, *gi = gb + i * A_DV;\n");
    print_scores(b, "qi", "gi", dk, 12);
    cg_puts(b, "            float L = lb[i];\n"
               "            for (int64_t jj = 0; jj < ne; jj++)\n"
               "                s[jj] = kiln_expf(s[jj] * A_SCALE - L);\n");
    if (dv)
        cg_puts(b, "            for (int64_t jj = 0; jj < ne; jj++) {\n"
                   "                float pj = s[jj];\n"
                   "                for (int64_t x = 0; x < A_DV; x++)\n"
                   "                    adv[jj][x] += pj * gi[x];\n"
                   "            }\n");
    if (dk)
        cg_puts(b, "            float De = db[i];\n"
                   "            for (int64_t jj = 0; jj < ne; jj++) {\n"
                   "                float ds = s[jj] * (dp[jj] - De) * A_SCALE;\n"
                   "                for (int64_t x = 0; x < A_D; x++)\n"
                   "                    adk[jj][x] += ds * qi[x];\n"
                   "            }\n");
    cg_puts(b, "        }\n"
               "        for (int64_t jj = 0; jj < nk; jj++) {\n");
    if (dk)
        cg_printf(b, "            for (int64_t x = 0; x < A_D; x++)\n"
                     "                p%d[(bb * A_TK + j0 + jj) * A_D + x] = adk[jj][x];\n",
                  a->dk);
    if (dv)
        cg_printf(b, "            for (int64_t x = 0; x < A_DV; x++)\n"
                     "                p%d[(bb * A_TK + j0 + jj) * A_DV + x] = adv[jj][x];\n",
                  a->dv);
    cg_puts(b, "        }\n"
               "    }\n");
}

void cg_print_c_attn(CgBuf *b, const CgKernel *k)
{
    const CgAttn *a = &k->attn;
    cg_printf(b,
              "#define A_NB %lldLL\n#define A_TQ %lldLL\n#define A_TK %lldLL\n"
              "#define A_D %lldLL\n#define A_DV %lldLL\n#define A_BQ %d\n#define A_BK %d\n"
              "#define A_CAUSAL %d\n#define A_SCALE %.9ef\n",
              (long long)a->batch, (long long)a->Tq, (long long)a->Tk, (long long)a->D,
              (long long)a->Dv, A_BQ, A_BK, a->causal ? 1 : 0, a->scale);
    const char *restrict_ = k->noalias ? "restrict " : "";
    cg_printf(b, "void %s(", k->name);
    for (int i = 0; i < k->params.n; i++) {
        const CgParam *p = &k->params.v[i];
        cg_printf(b, "%s%sfloat *%sp%d", i ? ", " : "", p->out ? "" : "const ", restrict_, i);
    }
    cg_puts(b, ", int64_t part, int64_t nparts)\n{\n");
    switch (a->kind) {
    case CG_ATTN_FWD: print_fwd(b, a); break;
    case CG_ATTN_DQ: print_dq(b, a); break;
    case CG_ATTN_DKV: print_dkv(b, a); break;
    default: die("cg_print_c_attn: kernel %s is no attention kernel", k->name);
    }
    cg_puts(b, "}\n"
               "#undef A_NB\n#undef A_TQ\n#undef A_TK\n#undef A_D\n#undef A_DV\n#undef A_BQ\n"
               "#undef A_BK\n#undef A_CAUSAL\n#undef A_SCALE\n");
}
