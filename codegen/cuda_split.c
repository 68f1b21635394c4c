/* cuda_split.c - the CUDA C printer's split loops (cuda_internal.h): a loop
 * whose grid would leave most of the device idle runs with several blocks
 * per outer index or column tile, in stages. The contract of the printed
 * source is cuda_print.c's; this file decides the split and prints its
 * stages. */
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- split loops: many blocks per outer index ------------------------------
 * A row loop with few outer indices (n < SPLIT_BELOW blocks) over long
 * inner dims, and a column loop with few tiles over many rows, would leave
 * most of the device idle (a full reduction: one block). Such a loop runs
 * with `parts` blocks per outer index (rows) or per tile (cols), block c
 * taking chunk c of every phase's inner range, in stages, one __global__
 * function (NAME_lI_sK) each:
 *   - a reduction phase folds its chunk, reduces across the block and
 *     writes one partial per (outer index, chunk) into the partials scratch
 *     (its own region of it, at CgCudaSplit.off);
 *   - a phase that reads such a result (its accumulator) starts the next
 *     stage, whose blocks first combine the partials of every earlier
 *     reduction in chunk order (each block the same way: a fixed order, so
 *     the result does not depend on the run or the block), and evaluate the
 *     earlier row phases' lets again;
 *   - so does a phase that reads a buffer an earlier phase of its stage
 *     wrote, or writes one an earlier phase of its stage read (other blocks
 *     may not have got there: launches order them instead of barriers);
 *   - row-phase stores are made by chunk 0; a stage of row phases only runs
 *     one block per outer index (tile).
 * Not split (one block per outer index, as before) when a row phase's lets
 * evaluated again in a later stage would read a buffer the loop writes. */
enum {
    SPLIT_BELOW = 512,   /* split when the grid would have fewer blocks */
    SPLIT_TARGET = 1024, /* blocks a split grid aims at (devices up to ~200 SMs,
                            several blocks per SM) */
    SPLIT_MIN_ROWS = 512, /* rows mode: fewest inner elements per chunk */
    SPLIT_MIN_COLS = 64,  /* cols mode: fewest rows per chunk */
};


void cg_cuda_split_free(CgCudaSplit *sp)
{
    free(sp->st0);
    free(sp->off);
}

static bool uses_acc(const CgKernel *k, int e, const bool *pending)
{
    if (e < 0)
        return false;
    const CgExpr *x = &k->ex.v[e];
    if (x->kind == CGX_ACC)
        return pending[x->var];
    int n = x->kind == CGX_OP ? cg_opinfo[x->op].arity
            : x->kind == CGX_SELECT ? 3
            : (x->kind == CGX_LOAD || x->kind == CGX_CAST || x->kind == CGX_RAND) ? 1
                                                                                  : 0;
    for (int i = 0; i < n; i++)
        if (uses_acc(k, x->a[i], pending))
            return true;
    return false;
}

static bool phase_uses_acc(const CgKernel *k, const CgPhase *ph, const bool *pending)
{
    if (ph->acc >= 0 && uses_acc(k, ph->value, pending))
        return true;
    for (int i = 0; i < ph->lets.n; i++)
        if (uses_acc(k, ph->lets.v[i], pending))
            return true;
    for (int i = 0; i < ph->st.n; i++)
        if (uses_acc(k, ph->st.v[i].index, pending) || uses_acc(k, ph->st.v[i].value, pending) ||
            uses_acc(k, ph->st.v[i].guard, pending))
            return true;
    return false;
}

/* The params phase ph loads (lets, fold value, store operands): ld[];
 * the params it stores: st[] (either may be NULL). */
static void phase_access(const CgKernel *k, const CgPhase *ph, bool *ld, bool *st, bool *rand)
{
    bool r = false;
    if (ld) {
        if (ph->acc >= 0)
            cg_cuda_mark_loads(k, ph->value, ld, &r);
        for (int i = 0; i < ph->lets.n; i++)
            cg_cuda_mark_loads(k, ph->lets.v[i], ld, &r);
        for (int i = 0; i < ph->st.n; i++) {
            cg_cuda_mark_loads(k, ph->st.v[i].index, ld, &r);
            cg_cuda_mark_loads(k, ph->st.v[i].value, ld, &r);
            cg_cuda_mark_loads(k, ph->st.v[i].guard, ld, &r);
        }
    }
    if (st)
        for (int i = 0; i < ph->st.n; i++)
            st[ph->st.v[i].param] = true;
    if (rand)
        *rand |= r;
}

/* Whether some param marked in a conflicts with one marked in b. */
static bool any_conflict(const CgKernel *k, const CgCudaAlias *al, const bool *a, const bool *b)
{
    for (int i = 0; i < k->params.n; i++)
        for (int j = 0; a[i] && j < k->params.n; j++)
            if (b[j] && cg_cuda_conflict(k, al, i, j))
                return true;
    return false;
}

/* How loop l (geometry f: rows or cols) is split; sp->parts < 2: not. */
void cg_cuda_split_plan(const CgKernel *k, const CgLoop *l, const CgCudaAlias *al,
                       const CgCudaFn *f, CgCudaSplit *sp)
{
    memset(sp, 0, sizeof *sp);
    if (!f->rows && !f->cols)
        return;
    int64_t units = f->rows ? f->n : (f->n + 31) / 32, inner = 0;
    for (int i = 0; i < l->ph.n; i++) {
        int64_t n = cg_cuda_numel(l->ph.v[i].dim, l->ph.v[i].ndim);
        inner = n > inner ? n : inner;
    }
    int64_t min_chunk = f->rows ? SPLIT_MIN_ROWS : SPLIT_MIN_COLS;
    if (units >= SPLIT_BELOW || inner < 2 * min_chunk)
        return;
    int64_t parts = (SPLIT_TARGET + units - 1) / units, most = inner / min_chunk;
    parts = parts < most ? parts : most;
    if (parts < 2)
        return;
    int np = l->ph.n, npar = k->params.n;
    bool *pending = xcalloc((size_t)k->naccs + 1, sizeof(bool));
    bool *ld = xcalloc((size_t)npar + 1, sizeof(bool)), *st = xcalloc((size_t)npar + 1, 1);
    bool *pl = xcalloc((size_t)npar + 1, sizeof(bool)), *ps = xcalloc((size_t)npar + 1, 1);
    bool *all_st = xcalloc((size_t)npar + 1, sizeof(bool));
    sp->st0 = xmalloc(sizeof(int) * (size_t)(np + 2));
    sp->off = xcalloc((size_t)np + 1, sizeof(int64_t));
    sp->st0[sp->nst++] = 0;
    sp->bytes = CG_CUDA_SCRATCH_ZERO; /* the scratch starts with its zeroed front */
    for (int p = 0; p < np; p++) {
        const CgPhase *ph = &l->ph.v[p];
        memset(pl, 0, (size_t)npar);
        memset(ps, 0, (size_t)npar);
        phase_access(k, ph, pl, ps, NULL);
        phase_access(k, ph, NULL, all_st, NULL);
        if (p > 0 && (phase_uses_acc(k, ph, pending) || any_conflict(k, al, pl, st) ||
                      any_conflict(k, al, ps, ld))) {
            sp->st0[sp->nst++] = p;
            memset(pending, 0, (size_t)k->naccs + 1);
            memset(ld, 0, (size_t)npar);
            memset(st, 0, (size_t)npar);
        }
        for (int i = 0; i < npar; i++) {
            ld[i] |= pl[i];
            st[i] |= ps[i];
        }
        if (ph->acc >= 0 && ph->ndim > 0) {
            pending[ph->acc] = true;
            int64_t slots = f->rows ? f->n * parts : parts * f->n;
            int64_t sz = (int64_t)(ph->adt == DT_I64 || ph->rop == CG_RED_LSE ? 8 : 4);
            sp->off[p] = sp->bytes;
            sp->bytes += (slots * sz + 255) / 256 * 256;
        }
    }
    sp->st0[sp->nst] = np;
    sp->parts = parts;
    /* row phases evaluated again in later stages read no buffer the loop writes */
    for (int p = 0; p < np && sp->parts; p++) {
        const CgPhase *ph = &l->ph.v[p];
        if (ph->ndim > 0 || p >= sp->st0[sp->nst - 1])
            continue;
        memset(pl, 0, (size_t)npar);
        if (ph->acc >= 0)
            cg_cuda_mark_loads(k, ph->value, pl, &(bool){false});
        for (int i = 0; i < ph->lets.n; i++)
            cg_cuda_mark_loads(k, ph->lets.v[i], pl, &(bool){false});
        if (any_conflict(k, al, pl, all_st))
            sp->parts = 0;
    }
    if (sp->parts < 2) {
        cg_cuda_split_free(sp);
        memset(sp, 0, sizeof *sp);
    }
    free(pending);
    free(ld);
    free(st);
    free(pl);
    free(ps);
    free(all_st);
}

/* The partials of reduction phase p, as an lvalue-able array expression. */
static void print_part(CgBuf *b, const CgPhase *ph, const CgCudaSplit *sp, int p)
{
    cg_printf(b, "((%s *)(kiln_part + %lldLL))", cg_cuda_ph_acc_type(ph), (long long)sp->off[p]);
}

/* Folds the partials of phase p (an earlier stage's reduction) into a<acc>,
 * chunk by chunk in a fixed order, then across the block. */
static void print_combine(CgBuf *b, const CgKernel *k, const CgPhase *ph, const CgCudaFn *f,
                          const CgCudaSplit *sp, int p, int depth)
{
    (void)k;
    const char *t = cg_cuda_ph_acc_type(ph);
    bool max = ph->rop == CG_RED_MAX;
    cg_indent(b, depth);
    cg_printf(b, "%s a%d = ", t, ph->acc);
    cg_print_red_init(b, ph);
    cg_puts(b, ";\n");
    cg_indent(b, depth);
    if (f->rows)
        cg_printf(b, "for (int64_t q = threadIdx.x; q < %lldLL; q += blockDim.x) {\n",
                  (long long)sp->parts);
    else
        cg_printf(b, "for (int64_t q = (threadIdx.x >> 5); q < %lldLL; q += 8) {\n",
                  (long long)sp->parts);
    cg_indent(b, depth + 1);
    cg_printf(b, "const %s w = ", t);
    print_part(b, ph, sp, p);
    if (f->rows)
        cg_printf(b, "[i * %lldLL + q];\n", (long long)sp->parts);
    else
        cg_printf(b, "[q * %lldLL + i];\n", (long long)f->n);
    cg_indent(b, depth + 1);
    if (max)
        cg_printf(b, "a%d = kiln_max2<%s>(a%d, w);\n", ph->acc, t, ph->acc);
    else
        cg_printf(b, "a%d += w;\n", ph->acc);
    cg_indent(b, depth);
    cg_puts(b, "}\n");
    cg_indent(b, depth);
    if (f->rows) {
        cg_printf(b, "a%d = kiln_block_reduce<%s, %s>(a%d, ", ph->acc, t, max ? "true" : "false",
                  ph->acc);
        cg_print_red_init(b, ph);
        cg_puts(b, ");\n");
    } else {
        cg_printf(b, "a%d = kiln_col_reduce<%s, %s>(a%d);\n", ph->acc, t, max ? "true" : "false",
                  ph->acc);
    }
}

/* The used loop variables, params and randomness of stage s: its own
 * phases, and the earlier phases it evaluates again (row phases' lets and
 * folds; combined reductions read only the scratch). */
static void stage_uses(const CgKernel *k, const CgLoop *l, const CgCudaSplit *sp, int s, bool *var,
                       bool *par, bool *rand)
{
    for (int p = 0; p < sp->st0[s + 1]; p++) {
        const CgPhase *ph = &l->ph.v[p];
        bool own = p >= sp->st0[s];
        if (!own && ph->ndim > 0)
            continue;
        if (ph->acc >= 0) {
            cg_cuda_mark_used(k, ph->value, var);
            cg_cuda_mark_loads(k, ph->value, par, rand);
        }
        for (int i = 0; i < ph->lets.n; i++) {
            cg_cuda_mark_used(k, ph->lets.v[i], var);
            cg_cuda_mark_loads(k, ph->lets.v[i], par, rand);
        }
        if (!own)
            continue;
        for (int i = 0; i < ph->st.n; i++) {
            const CgStore *st = &ph->st.v[i];
            par[st->param] = true;
            cg_cuda_mark_used(k, st->index, var);
            cg_cuda_mark_used(k, st->value, var);
            cg_cuda_mark_used(k, st->guard, var);
            cg_cuda_mark_loads(k, st->index, par, rand);
            cg_cuda_mark_loads(k, st->value, par, rand);
            cg_cuda_mark_loads(k, st->guard, par, rand);
        }
    }
}

/* Whether stage s has phases with inner dims (then it runs `parts` blocks
 * per outer index or tile). */
static bool stage_chunked(const CgLoop *l, const CgCudaSplit *sp, int s)
{
    for (int p = sp->st0[s]; p < sp->st0[s + 1]; p++)
        if (l->ph.v[p].ndim > 0)
            return true;
    return false;
}

static void print_stage_phases(CgBuf *b, const CgKernel *k, const CgLoop *l, const DType *storage,
                               const CgCudaAlias *al, const CgCudaFn *f, const CgCudaSplit *sp, int s,
                               const bool *used, bool chunked);

/* Stage s of split loop l as one __global__ function (f: its geometry and
 * params, filled by the caller); with f->ticket, stage 0 and then, in the
 * last block to finish, stage 1. */
static void print_stage(CgBuf *b, const CgKernel *k, const CgLoop *l, const DType *storage,
                        const CgCudaAlias *al, const CgCudaFn *f, const CgCudaSplit *sp, int s,
                        const bool *used)
{
    bool chunked = f->split > 1;
    int64_t parts = sp->parts;
    cg_printf(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(", f->threads, f->name);
    cg_cuda_print_params(b, k, storage, f);
    if (f->part)
        cg_printf(b, "%sunsigned char *__restrict__ kiln_part",
                  f->nparam || f->rand ? ", " : "");
    if (!f->nparam && !f->rand && !f->part)
        cg_puts(b, "void");
    cg_puts(b, ")\n{\n");
    if (f->rand)
        cg_puts(b, "    const uint64_t seed = kiln_rs[0];\n"
                   "    const int64_t step = (int64_t)kiln_rs[1];\n");
    int depth = 2;
    int64_t units = f->rows ? f->n : (f->n + 31) / 32;
    /* one block per (outer index, chunk): the grid is exactly that
     * (f->blocks; a grid-stride loop here made ptxas spill on sm_80) */
    int64_t total = units * (chunked ? parts : 1);
    if (total <= CG_CUDA_MAX_BLOCKS)
        cg_puts(b, "    {\n        const int64_t bi = blockIdx.x;\n");
    else
        cg_printf(b, "    for (int64_t bi = blockIdx.x; bi < %lldLL; bi += gridDim.x) {\n",
                  (long long)total);
    if (chunked)
        cg_printf(b, "        const int64_t u = bi / %lldLL, c = bi %% %lldLL;\n",
                  (long long)parts, (long long)parts);
    else
        cg_puts(b, "        const int64_t u = bi;\n");
    if (f->rows) {
        cg_puts(b, "        const int64_t i = u;\n");
    } else {
        cg_printf(b,
                  "        const int64_t t0 = u * 32;\n"
                  "        const bool live = t0 + (threadIdx.x & 31) < %lldLL;\n"
                  "        const int64_t i = live ? t0 + (threadIdx.x & 31) : %lldLL;\n"
                  "        (void)live;\n",
                  (long long)f->n, (long long)f->n - 1);
    }
    cg_puts(b, chunked ? "        (void)i;\n        (void)c;\n" : "        (void)i;\n");
    cg_cuda_decompose(b, l->dim, l->ndim, "i", used, depth);
    print_stage_phases(b, k, l, storage, al, f, sp, s, used, chunked);
    if (f->ticket) {
        /* the last block of outer index (tile) u to finish combines: every
         * block's partials are written and fenced before it takes its
         * ticket; the last one resets the counter for the next launch (or
         * graph replay) and runs stage 1 alone */
        cg_printf(b,
                  "        __threadfence();\n"
                  "        __syncthreads();\n"
                  "        __shared__ bool kiln_last;\n"
                  "        if (threadIdx.x == 0) {\n"
                  "            unsigned int *kiln_tk = (unsigned int *)kiln_part;\n"
                  "            kiln_last = atomicAdd(&kiln_tk[u], 1u) == %lldu;\n"
                  "            if (kiln_last)\n"
                  "                kiln_tk[u] = 0u; /* reset for the next launch */\n"
                  "        }\n"
                  "        __syncthreads();\n"
                  "        if (!kiln_last)\n"
                  "            return;\n"
                  "        __threadfence();\n"
                  "        {\n",
                  (long long)(parts - 1));
        /* its own scope: stage 1 declares its accumulators again */
        print_stage_phases(b, k, l, storage, al, f, sp, 1, used, false);
        cg_puts(b, "        }\n");
    }
    cg_puts(b, "    }\n}\n");
}

/* Stage s's phases (after the block's indices): the earlier stages'
 * reductions combined and row phases evaluated again, then its own.
 * chunked: the block takes chunk c of the inner ranges. */
static void print_stage_phases(CgBuf *b, const CgKernel *k, const CgLoop *l, const DType *storage,
                               const CgCudaAlias *al, const CgCudaFn *f, const CgCudaSplit *sp, int s,
                               const bool *used, bool chunked)
{
    int depth = 2;
    int64_t parts = sp->parts;
    const char *j0 = f->rows ? "threadIdx.x" : "(threadIdx.x >> 5)";
    const char *js = f->rows ? "blockDim.x" : "8";
    const char *one = f->rows ? "threadIdx.x == 0" : "live && threadIdx.x < 32";
    /* earlier stages: combined reductions, row phases again */
    for (int p = 0; p < sp->st0[s]; p++) {
        const CgPhase *ph = &l->ph.v[p];
        if (ph->ndim > 0) {
            if (ph->acc >= 0)
                print_combine(b, k, ph, f, sp, p, depth);
            continue;
        }
        cg_cuda_row_lets(b, k, ph, depth);
        if (ph->acc >= 0) {
            cg_indent(b, depth);
            cg_printf(b, "%s a%d = ", cg_cuda_ph_acc_type(ph), ph->acc);
            cg_print_red_init(b, ph);
            cg_puts(b, ";\n");
            cg_cuda_fold(b, k, ph, depth);
        }
    }
    for (int p = sp->st0[s]; p < sp->st0[s + 1]; p++) {
        const CgPhase *ph = &l->ph.v[p];
        int64_t inner = cg_cuda_numel(ph->dim, ph->ndim);
        bool more = p + 1 < sp->st0[s + 1];
        if (ph->ndim == 0) {
            cg_cuda_row_lets(b, k, ph, depth);
            if (ph->acc >= 0)
                cg_cuda_row_acc(b, k, ph, depth);
            if (ph->st.n) {
                cg_indent(b, depth);
                cg_printf(b, "if (%s%s) {\n", chunked ? "c == 0 && " : "", one);
                for (int si = 0; si < ph->st.n; si++)
                    cg_cuda_store(b, k, &ph->st.v[si], storage, depth + 1);
                cg_indent(b, depth);
                cg_puts(b, "}\n");
                if (more) {
                    cg_indent(b, depth);
                    cg_puts(b, "__syncthreads();\n");
                }
            }
            continue;
        }
        /* chunk c of [0, inner): an offset with a constant bound (a
         * bound computed from c made ptxas spill), the last chunk cut
         * short when the chunks overshoot */
        int64_t ch = (inner + parts - 1) / parts;
        char range[320];
        int n = snprintf(range, sizeof range,
                         "for (int64_t jj = %s; jj < %lldLL; jj += %s) {\n", j0, (long long)ch,
                         js);
        n += snprintf(range + n, sizeof range - (size_t)n, "%*sconst int64_t j = c * %lldLL + jj;\n",
                      4 * (depth + 1), "", (long long)ch);
        if (ch * parts > inner)
            snprintf(range + n, sizeof range - (size_t)n, "%*sif (j >= %lldLL)\n%*sbreak;\n",
                     4 * (depth + 1), "", (long long)inner, 4 * (depth + 2), "");
        if (ph->acc >= 0) {
            cg_indent(b, depth);
            cg_printf(b, "%s a%d = ", cg_cuda_ph_acc_type(ph), ph->acc);
            cg_print_red_init(b, ph);
            cg_puts(b, ";\n");
            cg_indent(b, depth);
            cg_puts(b, range);
            cg_cuda_decompose(b, ph->dim, ph->ndim, "j", used, depth + 1);
            cg_cuda_lets(b, k, ph, depth + 1);
            cg_cuda_fold(b, k, ph, depth + 1);
            cg_indent(b, depth);
            cg_puts(b, "}\n");
            cg_indent(b, depth);
            bool max = ph->rop == CG_RED_MAX;
            if (f->rows) {
                cg_printf(b, "a%d = kiln_block_reduce<%s, %s>(a%d, ", ph->acc,
                          cg_cuda_ph_acc_type(ph), max ? "true" : "false", ph->acc);
                cg_print_red_init(b, ph);
                cg_puts(b, ");\n");
            } else {
                cg_printf(b, "a%d = kiln_col_reduce<%s, %s>(a%d);\n", ph->acc,
                          cg_cuda_ph_acc_type(ph), max ? "true" : "false", ph->acc);
            }
            cg_indent(b, depth);
            cg_printf(b, "if (%s)\n", one);
            cg_indent(b, depth + 1);
            print_part(b, ph, sp, p);
            if (f->rows)
                cg_printf(b, "[i * %lldLL + c] = a%d;\n", (long long)parts, ph->acc);
            else
                cg_printf(b, "[c * %lldLL + i] = a%d;\n", (long long)f->n, ph->acc);
            continue;
        }
        cg_indent(b, depth);
        if (f->cols) {
            cg_puts(b, "if (live)\n");
            cg_indent(b, depth);
        }
        cg_puts(b, range);
        cg_cuda_decompose(b, ph->dim, ph->ndim, "j", used, depth + 1);
        cg_cuda_store_phase(b, k, ph, storage, al, depth + 1);
        cg_indent(b, depth);
        cg_puts(b, "}\n");
        if (more) {
            cg_indent(b, depth);
            cg_puts(b, "__syncthreads();\n");
        }
    }
}

/* Appends the functions of split loop li (geometry g from geometry()). */
void cg_cuda_print_split(CgBuf *b, const CgKernel *k, const CgKernel *v, int li, const char *name,
                        const DType *storage, const CgCudaAlias *al, const CgCudaFn *g,
                        const CgCudaSplit *sp, CgCudaFnVec *out)
{
    const CgLoop *l = &k->loops.v[li];
    /* two stages, the second one block per outer index (tile: a full
     * reduction and what reads its result): one function, the second stage
     * run by the last block to finish (a ticket per outer index) */
    int64_t units0 = g->rows ? g->n : (g->n + 31) / 32;
    bool ticket = sp->nst == 2 && stage_chunked(l, sp, 0) && !stage_chunked(l, sp, 1) &&
                  units0 * sp->parts <= CG_CUDA_MAX_BLOCKS &&
                  units0 * 4 <= CG_CUDA_TICKET_BYTES;
    for (int s = 0; s < (ticket ? 1 : sp->nst); s++) {
        CgCudaFn f = *g;
        f.name = sp->nst > 1 && !ticket ? xasprintf("%s_l%d_s%d", name, li, s)
                                        : xasprintf("%s_l%d", name, li);
        f.loop = li;
        f.ticket = ticket;
        bool chunked = stage_chunked(l, sp, s);
        f.split = chunked ? sp->parts : 1;
        int64_t units = f.rows ? f.n : (f.n + 31) / 32, total = units * f.split;
        f.blocks = total < 1 ? 1 : total < CG_CUDA_MAX_BLOCKS ? total : CG_CUDA_MAX_BLOCKS;
        bool *var = xcalloc((size_t)k->nvars + 1, sizeof(bool));
        bool *par = xcalloc((size_t)k->params.n + 1, sizeof(bool));
        bool rand = false;
        stage_uses(k, l, sp, s, var, par, &rand);
        if (ticket)
            stage_uses(k, l, sp, 1, var, par, &rand);
        f.param = xmalloc(sizeof(int) * (size_t)(k->params.n + 1));
        f.nparam = 0;
        for (int i = 0; i < k->params.n; i++)
            if (par[i])
                f.param[f.nparam++] = i;
        f.rand = rand && k->rand;
        /* scratch: written by this stage's reductions, read for earlier ones */
        f.part = false;
        f.part_bytes = 0;
        for (int p = 0; p < sp->st0[ticket ? 2 : s + 1]; p++) {
            const CgPhase *ph = &l->ph.v[p];
            if (ph->acc >= 0 && ph->ndim > 0) {
                f.part = true;
                f.part_bytes = sp->bytes;
            }
        }
        cg_puts(b, "\n");
        print_stage(b, v, l, storage, al, &f, sp, s, var);
        vec_push(out, f);
        free(var);
        free(par);
    }
}
