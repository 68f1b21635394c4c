/* cuda_multi.c - horizontal functions: the independent elementwise loops of
 * one kernel (the fuse pass's multi-tensor group, fuse_multi.c: the AdamW
 * update of every parameter) printed as ONE __global__ function over a
 * chunk table, the multi-tensor-apply idea, instead of one function (one
 * launch) per loop.
 *
 * The chunk table is compile-time: loop e (an entry: its buffers, its
 * element count N_e = outer x inner extent) takes chunks [c_e, c_{e+1}) of
 * H_CHUNK elements, c_0 = 0; the grid is one block per chunk (grid-stride
 * past MAX_BLOCKS). A block finds its entry by a binary search printed as
 * a tree of constant comparisons (no table in memory, no divergence: the
 * entry is uniform over the block), then its threads walk the chunk's
 * elements: flat element f of the loop is outer index f / inner and inner
 * index f % inner, decomposed into the loop's variables as the one-loop
 * printer does. Each element's expressions, lets and stores are the ones
 * cuda_print.c prints for the loop (cg_cuda_store_phase), so the
 * arithmetic of every element is unchanged; only which thread computes it
 * changes.
 *
 * The buffers are kernel arguments (the "table" of pointers): the function
 * takes every param its entries use. A launch's arguments are capped at
 * H_ARG_BYTES (CUDA 12.1+ on sm_70+ accepts 32764 bytes; kiln builds for
 * sm_80 and sm_90): a kernel whose entries need more is split into several
 * horizontal functions of consecutive loops.
 *
 * Full reductions (the squared-gradient sums of global-norm clipping: one
 * loop per gradient, a sum over all its elements, then the store of the
 * one result) run the same way: the blocks of entry e each fold a chunk,
 * reduce across the block and write a partial into the partials scratch
 * (at the entry's own offset); then the split loops' ticket (cuda_print.c,
 * CG_CUDA_TICKET_BYTES): thread 0 counts the block on the entry's ticket,
 * kiln_part as unsigned int [e], and the block that draws P_e - 1 (the
 * last of the entry's P_e blocks to finish) sets it back to zero, combines
 * the entry's partials in chunk order (deterministic) and runs the store
 * phase. An entry of one chunk stores at once.
 *
 * Which loops: cg_cuda_horizontal_run. In a kernel of independent loops
 * (CgKernel.parallel) without random numbers, each maximal run of two or
 * more consecutive loops that are each
 *   elementwise: one store phase (no reduction, no accumulating store), or
 *   a full reduction: one outer index, a reduction phase (sum or max, no
 *   stores), then a row phase of plain stores,
 * not column loops, becomes one function NAME_hLO (LO: its first loop); a
 * run is cut where its arguments would pass H_ARG_BYTES, its tickets
 * CG_CUDA_TICKET_BYTES or its grid MAX_BLOCKS. Other loops print as before
 * (cuda_print.c), in loop order.
 */
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

enum {
    H_THREADS = 256,
    H_CHUNK = 4096,          /* elements per block: 16 per thread */
    H_ARG_BYTES = 32000,     /* kernel argument bytes per function (8 per buffer) */
    H_MAX_BLOCKS = 1 << 24,  /* as cuda_print.c's MAX_BLOCKS */
};

static bool plain_stores(const CgPhase *ph)
{
    if (ph->acc >= 0 || ph->st.n == 0)
        return false;
    for (int i = 0; i < ph->st.n; i++)
        if (ph->st.v[i].accumulate)
            return false;
    return true;
}

/* 1: an elementwise loop; 2: a full reduction and its stores; 0: neither. */
static int loop_kind(const CgLoop *l)
{
    if (l->col)
        return 0;
    if (l->ph.n == 1)
        return plain_stores(&l->ph.v[0]) ? 1 : 0;
    const CgPhase *r = &l->ph.v[0];
    if (l->ph.n == 2 && cg_cuda_numel(l->dim, l->ndim) == 1 && r->acc >= 0 && r->ndim > 0 &&
        r->st.n == 0 && (r->rop == CG_RED_SUM || r->rop == CG_RED_MAX) &&
        l->ph.v[1].ndim == 0 && plain_stores(&l->ph.v[1]))
        return 2;
    return 0;
}

/* Elements of loop l (outer x the largest phase's inner extent). */
static int64_t loop_elems(const CgLoop *l)
{
    return cg_cuda_numel(l->dim, l->ndim) * cg_cuda_numel(l->ph.v[0].dim, l->ph.v[0].ndim);
}

/* Whether loop l may be an entry of a horizontal function: 1 elementwise,
 * 2 a full reduction (loop_kind), and at most H_MAX_BLOCKS chunks. */
static bool entry_ok(const CgLoop *l)
{
    return loop_kind(l) != 0 && (loop_elems(l) + H_CHUNK - 1) / H_CHUNK <= H_MAX_BLOCKS;
}
static void mark_loads(const CgKernel *k, int e, bool *used)
{
    if (e < 0)
        return;
    const CgExpr *x = &k->ex.v[e];
    if (x->kind == CGX_LOAD)
        used[x->param] = true;
    int n = x->kind == CGX_OP ? cg_opinfo[x->op].arity
            : x->kind == CGX_SELECT ? 3
            : (x->kind == CGX_LOAD || x->kind == CGX_CAST || x->kind == CGX_RAND) ? 1
                                                                                  : 0;
    for (int i = 0; i < n; i++)
        mark_loads(k, x->a[i], used);
}

/* Marks the params loop l reads or writes. */
static void loop_params(const CgKernel *k, const CgLoop *l, bool *used)
{
    for (int p = 0; p < l->ph.n; p++) {
        const CgPhase *ph = &l->ph.v[p];
        if (ph->acc >= 0)
            mark_loads(k, ph->value, used);
        for (int i = 0; i < ph->lets.n; i++)
            mark_loads(k, ph->lets.v[i], used);
        for (int i = 0; i < ph->st.n; i++) {
            used[ph->st.v[i].param] = true;
            mark_loads(k, ph->st.v[i].index, used);
            mark_loads(k, ph->st.v[i].value, used);
            mark_loads(k, ph->st.v[i].guard, used);
        }
    }
}

static void mark_vars(const CgKernel *v, const CgLoop *l, bool *used)
{
    for (int p = 0; p < l->ph.n; p++) {
        const CgPhase *ph = &l->ph.v[p];
        if (ph->acc >= 0)
            cg_cuda_mark_used(v, ph->value, used);
        for (int i = 0; i < ph->lets.n; i++)
            cg_cuda_mark_used(v, ph->lets.v[i], used);
        for (int i = 0; i < ph->st.n; i++) {
            cg_cuda_mark_used(v, ph->st.v[i].index, used);
            cg_cuda_mark_used(v, ph->st.v[i].value, used);
            cg_cuda_mark_used(v, ph->st.v[i].guard, used);
        }
    }
}

/* The partials of a reduction entry: off[e] bytes into the scratch (0: an
 * entry of one chunk, which has none). */
typedef struct {
    const int64_t *c0;  /* chunk table: entry e takes chunks [c0[e], c0[e + 1]) */
    const int64_t *off; /* reduction entries: partials offset, 0 for none */
} Table;

/* Entry e (a full reduction, loop li): its chunk's partial, the ticket,
 * and in the entry's last block the combine and the stores. */
static void print_red_entry(CgBuf *b, const CgKernel *v, int li, const Table *t, int e,
                            const DType *st, int depth)
{
    const CgLoop *l = &v->loops.v[li];
    const CgPhase *r = &l->ph.v[0], *w = &l->ph.v[1];
    int64_t n = cg_cuda_numel(r->dim, r->ndim), parts = t->c0[e + 1] - t->c0[e];
    const char *ty = cg_cuda_acc_type(r->adt);
    const char *mx = r->rop == CG_RED_MAX ? "true" : "false";
    bool *used = xcalloc((size_t)v->nvars + 1, sizeof(bool));
    mark_vars(v, l, used);
    cg_indent(b, depth);
    cg_printf(b, "/* loop %d: a reduction over %lld elements, chunks [%lld, %lld) */\n", li,
              (long long)n, (long long)t->c0[e], (long long)t->c0[e + 1]);
    cg_indent(b, depth);
    cg_printf(b, "const int64_t c = bi - %lldLL, i = 0;\n", (long long)t->c0[e]);
    cg_indent(b, depth);
    cg_puts(b, "(void)c;\n");
    cg_indent(b, depth);
    cg_puts(b, "(void)i;\n");
    cg_cuda_decompose(b, l->dim, l->ndim, "i", used, depth);
    cg_indent(b, depth);
    cg_printf(b, "%s a%d = ", ty, r->acc);
    cg_print_red_init(b, r);
    cg_puts(b, ";\n");
    cg_indent(b, depth);
    cg_printf(b, "for (int64_t ff = threadIdx.x; ff < %dLL; ff += blockDim.x) {\n", H_CHUNK);
    cg_indent(b, depth + 1);
    cg_printf(b, "const int64_t j = c * %dLL + ff;\n", H_CHUNK);
    if (n % H_CHUNK) {
        cg_indent(b, depth + 1);
        cg_printf(b, "if (j >= %lldLL)\n", (long long)n);
        cg_indent(b, depth + 2);
        cg_puts(b, "break;\n");
    }
    cg_cuda_decompose(b, r->dim, r->ndim, "j", used, depth + 1);
    cg_cuda_lets(b, v, r, depth + 1);
    cg_cuda_fold(b, v, r, depth + 1);
    cg_indent(b, depth);
    cg_puts(b, "}\n");
    cg_indent(b, depth);
    cg_printf(b, "a%d = kiln_block_reduce<%s, %s>(a%d, ", r->acc, ty, mx, r->acc);
    cg_print_red_init(b, r);
    cg_puts(b, ");\n");
    if (parts > 1) {
        char part[96];
        snprintf(part, sizeof part, "((%s *)(kiln_part + %lldLL))", ty, (long long)t->off[e]);
        cg_indent(b, depth);
        cg_printf(b, "if (threadIdx.x == 0)\n");
        cg_indent(b, depth + 1);
        cg_printf(b, "%s[c] = a%d;\n", part, r->acc);
        /* the ticket of entry e: the last of its blocks to finish goes on */
        const char *pad = "                                                ";
        int in = 4 * depth;
        cg_printf(b,
                  "%.*s__threadfence();\n"
                  "%.*s__syncthreads();\n"
                  "%.*sif (threadIdx.x == 0) {\n"
                  "%.*s    unsigned int *kiln_tk = (unsigned int *)kiln_part;\n"
                  "%.*s    kiln_last = atomicAdd(&kiln_tk[%d], 1u) == %lldu;\n"
                  "%.*s    if (kiln_last)\n"
                  "%.*s        kiln_tk[%d] = 0u; /* reset for the next launch */\n"
                  "%.*s}\n"
                  "%.*s__syncthreads();\n"
                  "%.*sif (!kiln_last)\n"
                  "%.*s    return;\n"
                  "%.*s__threadfence();\n",
                  in, pad, in, pad, in, pad, in, pad, in, pad, e, (long long)(parts - 1), in,
                  pad, in, pad, e, in, pad, in, pad, in, pad, in, pad, in, pad);
        cg_indent(b, depth);
        cg_printf(b, "a%d = ", r->acc);
        cg_print_red_init(b, r);
        cg_puts(b, ";\n");
        cg_indent(b, depth);
        cg_printf(b, "for (int64_t q = threadIdx.x; q < %lldLL; q += blockDim.x)\n",
                  (long long)parts);
        cg_indent(b, depth + 1);
        if (r->rop == CG_RED_MAX)
            cg_printf(b, "a%d = kiln_max2<%s>(a%d, %s[q]);\n", r->acc, ty, r->acc, part);
        else
            cg_printf(b, "a%d += %s[q];\n", r->acc, part);
        cg_indent(b, depth);
        cg_printf(b, "a%d = kiln_block_reduce<%s, %s>(a%d, ", r->acc, ty, mx, r->acc);
        cg_print_red_init(b, r);
        cg_puts(b, ");\n");
    }
    cg_cuda_lets(b, v, w, depth);
    cg_indent(b, depth);
    cg_puts(b, "if (threadIdx.x == 0) {\n");
    for (int i = 0; i < w->st.n; i++)
        cg_cuda_store(b, v, &w->st.v[i], st, depth + 1);
    cg_indent(b, depth);
    cg_puts(b, "}\n");
    free(used);
}

static int count(const bool *used, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += used[i];
    return c;
}

/* Entry e (loop li, an elementwise one) on chunks [c0[e], c0[e + 1]): its
 * elements. */
static void print_entry(CgBuf *b, const CgKernel *v, int li, const Table *t, int e,
                        const DType *st, const CgCudaAlias *al, int depth)
{
    if (loop_kind(&v->loops.v[li]) == 2) {
        print_red_entry(b, v, li, t, e, st, depth);
        return;
    }
    const int64_t *c0 = t->c0;
    const CgLoop *l = &v->loops.v[li];
    const CgPhase *ph = &l->ph.v[0];
    int64_t n = cg_cuda_numel(l->dim, l->ndim) * cg_cuda_numel(ph->dim, ph->ndim);
    int64_t inner = cg_cuda_numel(ph->dim, ph->ndim);
    bool *used = xcalloc((size_t)v->nvars + 1, sizeof(bool));
    mark_vars(v, l, used);
    cg_indent(b, depth);
    cg_printf(b, "/* loop %d: %lld elements, chunks [%lld, %lld) */\n", li, (long long)n,
              (long long)c0[e], (long long)c0[e + 1]);
    cg_indent(b, depth);
    cg_printf(b, "const int64_t f0 = (bi - %lldLL) * %dLL;\n", (long long)c0[e], H_CHUNK);
    cg_indent(b, depth);
    cg_printf(b, "for (int64_t ff = threadIdx.x; ff < %dLL; ff += blockDim.x) {\n", H_CHUNK);
    cg_indent(b, depth + 1);
    cg_puts(b, "const int64_t f = f0 + ff;\n");
    if (n % H_CHUNK) {
        cg_indent(b, depth + 1);
        cg_printf(b, "if (f >= %lldLL)\n", (long long)n);
        cg_indent(b, depth + 2);
        cg_puts(b, "break;\n");
    }
    cg_indent(b, depth + 1);
    if (inner == 1)
        cg_puts(b, "const int64_t i = f, j = 0;\n");
    else
        cg_printf(b, "const int64_t i = f / %lldLL, j = f %% %lldLL;\n", (long long)inner,
                  (long long)inner);
    cg_indent(b, depth + 1);
    cg_puts(b, "(void)i;\n");
    cg_indent(b, depth + 1);
    cg_puts(b, "(void)j;\n");
    cg_cuda_decompose(b, l->dim, l->ndim, "i", used, depth + 1);
    cg_cuda_decompose(b, ph->dim, ph->ndim, "j", used, depth + 1);
    cg_cuda_store_phase(b, v, ph, st, al, depth + 1);
    cg_indent(b, depth);
    cg_puts(b, "}\n");
    free(used);
}

/* The binary search over entries [lo, hi) as nested comparisons. */
static void print_tree(CgBuf *b, const CgKernel *v, int l0, const Table *t, int lo, int hi,
                       const DType *st, const CgCudaAlias *al, int depth)
{
    if (hi - lo == 1) {
        print_entry(b, v, l0 + lo, t, lo, st, al, depth);
        return;
    }
    int mid = lo + (hi - lo) / 2;
    cg_indent(b, depth);
    cg_printf(b, "if (bi < %lldLL) {\n", (long long)t->c0[mid]);
    print_tree(b, v, l0, t, lo, mid, st, al, depth + 1);
    cg_indent(b, depth);
    cg_puts(b, "} else {\n");
    print_tree(b, v, l0, t, mid, hi, st, al, depth + 1);
    cg_indent(b, depth);
    cg_puts(b, "}\n");
}

/* Loops [lo, hi) of k as function number h. */
static void print_fn(CgBuf *b, const CgKernel *k, const CgKernel *v, const char *name, int lo,
                     int hi, const DType *st, const CgCudaAlias *al, CgCudaFnVec *out)
{
    int ne = hi - lo;
    int64_t *c0 = xmalloc(sizeof(int64_t) * (size_t)(ne + 1));
    int64_t *off = xcalloc((size_t)ne + 1, sizeof(int64_t));
    int64_t elems = 0, part = CG_CUDA_SCRATCH_ZERO;
    bool red = loop_kind(&k->loops.v[lo]) == 2;
    c0[0] = 0;
    for (int e = 0; e < ne; e++) {
        const CgLoop *l = &k->loops.v[lo + e];
        int64_t n = loop_elems(l), p = (n + H_CHUNK - 1) / H_CHUNK;
        elems += n;
        c0[e + 1] = c0[e] + p;
        if (red && p > 1) {
            off[e] = part;
            part += (p * (l->ph.v[0].adt == DT_I64 ? 8 : 4) + 255) / 256 * 256;
        }
    }
    Table t = {c0, off};
    CgCudaFn f;
    memset(&f, 0, sizeof f);
    f.name = xasprintf("%s_h%d", name, lo);
    f.loop = lo;
    f.nloops = ne;
    f.split = 1;
    f.n = elems;
    f.threads = H_THREADS;
    int64_t total = c0[ne];
    f.blocks = total < 1 ? 1 : total;
    bool *used = xcalloc((size_t)k->params.n + 1, sizeof(bool));
    for (int li = lo; li < hi; li++)
        loop_params(k, &k->loops.v[li], used);
    f.param = xmalloc(sizeof(int) * (size_t)(k->params.n + 1));
    for (int i = 0; i < k->params.n; i++)
        if (used[i])
            f.param[f.nparam++] = i;
    free(used);
    f.part = part > CG_CUDA_SCRATCH_ZERO;
    f.part_bytes = f.part ? part : 0;

    cg_printf(b, "\n/* horizontal: loops %d..%d of %s, %lld chunks of %d elements */\n", lo,
              hi - 1, k->name, (long long)total, H_CHUNK);
    cg_printf(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(", f.threads, f.name);
    cg_cuda_print_params(b, k, st, &f);
    if (f.part)
        cg_printf(b, "%sunsigned char *__restrict__ kiln_part", f.nparam ? ", " : "");
    if (!f.nparam && !f.part)
        cg_puts(b, "void");
    cg_puts(b, ")\n{\n");
    if (f.part)
        cg_puts(b, "    __shared__ bool kiln_last;\n");
    /* one block per chunk (cg_cuda_horizontal_run: at most H_MAX_BLOCKS) */
    cg_puts(b, "    {\n        const int64_t bi = blockIdx.x;\n");
    print_tree(b, v, lo, &t, 0, ne, st, al, 2);
    cg_puts(b, "    }\n}\n");
    vec_push(out, f);
    free(c0);
    free(off);
}

int cg_cuda_horizontal_run(const CgKernel *k, int li)
{
    if (k->loops.n < 2 || !k->parallel || k->rand)
        return 0;
    int np = k->params.n, n = 0;
    int64_t chunks = 0;
    bool *used = xcalloc((size_t)np + 1, sizeof(bool));
    for (int i = li; i < k->loops.n; i++) {
        const CgLoop *l = &k->loops.v[i];
        if (!entry_ok(l))
            break;
        /* cut where the arguments, the tickets or the grid run out */
        int64_t c = (loop_elems(l) + H_CHUNK - 1) / H_CHUNK;
        loop_params(k, l, used);
        if (n > 0 && (count(used, np) * 8 > H_ARG_BYTES || (n + 1) * 4 > CG_CUDA_TICKET_BYTES ||
                      chunks + c > H_MAX_BLOCKS))
            break;
        chunks += c;
        n++;
    }
    free(used);
    return n >= 2 ? n : 0;
}

void cg_cuda_print_horizontal(CgBuf *b, const CgKernel *k, const CgKernel *v, const char *name,
                              int lo, int hi, const DType *st, const CgCudaAlias *al,
                              CgCudaFnVec *out)
{
    print_fn(b, k, v, name, lo, hi, st, al, out);
}
