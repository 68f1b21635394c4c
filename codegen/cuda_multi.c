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
 * horizontal functions NAME_h0, NAME_h1, ... of consecutive loops.
 *
 * Which kernels: cg_cuda_horizontal. Every loop a single store phase (no
 * reduction, no accumulating store), not a column loop, no random numbers,
 * loops independent (CgKernel.parallel), at least two loops.
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

static bool loop_ok(const CgLoop *l)
{
    if (l->col || l->ph.n != 1)
        return false;
    const CgPhase *ph = &l->ph.v[0];
    if (ph->acc >= 0 || ph->st.n == 0)
        return false;
    for (int i = 0; i < ph->st.n; i++)
        if (ph->st.v[i].accumulate)
            return false;
    return true;
}

bool cg_cuda_horizontal(const CgKernel *k)
{
    if (k->loops.n < 2 || !k->parallel || k->rand)
        return false;
    for (int i = 0; i < k->loops.n; i++)
        if (!loop_ok(&k->loops.v[i]))
            return false;
    return true;
}

static int64_t numel(const CgDim *d, int n)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= d[i].n;
    return p;
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
    const CgPhase *ph = &l->ph.v[0];
    for (int i = 0; i < ph->lets.n; i++)
        mark_loads(k, ph->lets.v[i], used);
    for (int i = 0; i < ph->st.n; i++) {
        used[ph->st.v[i].param] = true;
        mark_loads(k, ph->st.v[i].index, used);
        mark_loads(k, ph->st.v[i].value, used);
        mark_loads(k, ph->st.v[i].guard, used);
    }
}

static int count(const bool *used, int n)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += used[i];
    return c;
}

/* Entry e (loop lo + e) on chunks [c0[e], c0[e + 1]): its elements. */
static void print_entry(CgBuf *b, const CgKernel *v, int li, const int64_t *c0, int e,
                        const DType *st, const CgCudaAlias *al, int depth)
{
    const CgLoop *l = &v->loops.v[li];
    const CgPhase *ph = &l->ph.v[0];
    int64_t n = numel(l->dim, l->ndim) * numel(ph->dim, ph->ndim);
    int64_t inner = numel(ph->dim, ph->ndim);
    bool *used = xcalloc((size_t)v->nvars + 1, sizeof(bool));
    for (int i = 0; i < ph->lets.n; i++)
        cg_cuda_mark_used(v, ph->lets.v[i], used);
    for (int i = 0; i < ph->st.n; i++) {
        cg_cuda_mark_used(v, ph->st.v[i].index, used);
        cg_cuda_mark_used(v, ph->st.v[i].value, used);
        cg_cuda_mark_used(v, ph->st.v[i].guard, used);
    }
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
static void print_tree(CgBuf *b, const CgKernel *v, int l0, const int64_t *c0, int lo, int hi,
                       const DType *st, const CgCudaAlias *al, int depth)
{
    if (hi - lo == 1) {
        print_entry(b, v, l0 + lo, c0, lo, st, al, depth);
        return;
    }
    int mid = lo + (hi - lo) / 2;
    cg_indent(b, depth);
    cg_printf(b, "if (bi < %lldLL) {\n", (long long)c0[mid]);
    print_tree(b, v, l0, c0, lo, mid, st, al, depth + 1);
    cg_indent(b, depth);
    cg_puts(b, "} else {\n");
    print_tree(b, v, l0, c0, mid, hi, st, al, depth + 1);
    cg_indent(b, depth);
    cg_puts(b, "}\n");
}

/* Loops [lo, hi) of k as function number h. */
static void print_fn(CgBuf *b, const CgKernel *k, const CgKernel *v, const char *name, int h,
                     int lo, int hi, const DType *st, const CgCudaAlias *al, CgCudaFnVec *out)
{
    int ne = hi - lo;
    int64_t *c0 = xmalloc(sizeof(int64_t) * (size_t)(ne + 1));
    int64_t elems = 0;
    c0[0] = 0;
    for (int e = 0; e < ne; e++) {
        const CgLoop *l = &k->loops.v[lo + e];
        int64_t n = numel(l->dim, l->ndim) * numel(l->ph.v[0].dim, l->ph.v[0].ndim);
        elems += n;
        c0[e + 1] = c0[e] + (n + H_CHUNK - 1) / H_CHUNK;
    }
    CgCudaFn f;
    memset(&f, 0, sizeof f);
    f.name = xasprintf("%s_h%d", name, h);
    f.loop = lo;
    f.nloops = ne;
    f.split = 1;
    f.n = elems;
    f.threads = H_THREADS;
    int64_t total = c0[ne];
    f.blocks = total < 1 ? 1 : total < H_MAX_BLOCKS ? total : H_MAX_BLOCKS;
    bool *used = xcalloc((size_t)k->params.n + 1, sizeof(bool));
    for (int li = lo; li < hi; li++)
        loop_params(k, &k->loops.v[li], used);
    f.param = xmalloc(sizeof(int) * (size_t)(k->params.n + 1));
    for (int i = 0; i < k->params.n; i++)
        if (used[i])
            f.param[f.nparam++] = i;
    free(used);

    cg_printf(b, "\n/* horizontal: loops %d..%d of %s, %lld chunks of %d elements */\n", lo,
              hi - 1, k->name, (long long)total, H_CHUNK);
    cg_printf(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(", f.threads, f.name);
    cg_cuda_print_params(b, k, st, &f);
    if (!f.nparam)
        cg_puts(b, "void");
    cg_puts(b, ")\n{\n");
    if (total <= H_MAX_BLOCKS)
        cg_puts(b, "    {\n        const int64_t bi = blockIdx.x;\n");
    else
        cg_printf(b, "    for (int64_t bi = blockIdx.x; bi < %lldLL; bi += gridDim.x) {\n",
                  (long long)total);
    print_tree(b, v, lo, c0, 0, ne, st, al, 2);
    cg_puts(b, "    }\n}\n");
    vec_push(out, f);
    free(c0);
}

void cg_cuda_print_horizontal(CgBuf *b, const CgKernel *k, const CgKernel *v, const char *name,
                              const DType *st, const CgCudaAlias *al, CgCudaFnVec *out)
{
    int np = k->params.n;
    bool *cur = xcalloc((size_t)np + 1, sizeof(bool));
    bool *one = xcalloc((size_t)np + 1, sizeof(bool));
    int lo = 0, h = 0;
    for (int li = 0; li < k->loops.n; li++) {
        memset(one, 0, (size_t)np + 1);
        loop_params(k, &k->loops.v[li], one);
        for (int i = 0; i < np; i++)
            one[i] |= cur[i];
        if (li > lo && count(one, np) * 8 > H_ARG_BYTES) {
            print_fn(b, k, v, name, h++, lo, li, st, al, out);
            lo = li;
            memset(cur, 0, (size_t)np + 1);
            loop_params(k, &k->loops.v[li], cur);
        } else {
            memcpy(cur, one, (size_t)np + 1);
        }
    }
    print_fn(b, k, v, name, h, lo, k->loops.n, st, al, out);
    free(cur);
    free(one);
}
