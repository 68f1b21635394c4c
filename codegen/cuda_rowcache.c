/* cuda_rowcache.c - row kernels that keep a re-read row in registers
 * (cg_cuda_row_cache, cg_cuda_row_cache_role).
 *
 * A row loop (one block per outer index) whose phases read the same
 * buffer's row twice (the cross-entropy: a logsumexp fold over the logits
 * row, then the stores of dlogits, which read it again) would read it from
 * memory twice when the rows of the resident blocks do not fit in L2 (the
 * cost model's param_bytes). When each thread's share of the row is small
 * (at most CACHE_WORDS uint4s over the cached params, 32 registers, so
 * that four blocks of 256 threads or one of 1024 stay resident: the
 * memory latency stays hidden, docs/cost.md, Occupancy; a row too long
 * for that at the loop's block size gets blocks of BIG_THREADS when they
 * hold it, the cross-entropy's 50304 bf16 logits: 7 uint4s), the first
 * phase that loads it keeps every 16-byte vector it loads in a register
 * array (kiln_c<p>[trip][word]) and the later phases read the array: the
 * row is read from memory once. The phases then run `trips` unrolled
 * iterations per thread (constant indices: the array stays in registers)
 * instead of the strided loop; iteration t of thread x is vector
 * x + t * threads, as in the strided loop.
 *
 * A param is cached when: no other param that may share its buffer is an
 * output (al; a param the kernel stores itself, an in-place result merged
 * into its operand's param, qualifies when every phase that touches it but
 * the fill reads the cache: the loads then see the values the fill read,
 * the operand's, and each store goes to a vector the thread cached, after
 * the fill's barrier), the loop is a row loop of one
 * block per row (not split), and two or more of the loop's phases load it
 * through the vector path (cuda_row.c) with the same inner dims, the same
 * vector width and the same printed index expression. Only those phases
 * use the cache (role 1: the first, which fills it; role 2: the others). */
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

enum {
    CACHE_WORDS = 8,    /* uint4s (4 registers each) per thread for cached rows */
    BIG_THREADS = 1024, /* the block size that holds a longer row */
};

/* Phase ph's vector signature for param p: its vec plan loads p; *vec and
 * the printed index (allocated) returned; false when p is not a vector
 * load of the phase, or is stored by it too and st is false. */
static bool vec_load(const CgKernel *k, const CgPhase *ph, const DType *storage,
                     const CgCudaAlias *al, int p, bool st, int *vec, char **index)
{
    CgCudaVec v;
    if (ph->ndim == 0 || !cg_cuda_vec_plan(k, ph, storage, al, &v))
        return false;
    bool found = false;
    for (int i = 0; i < v.n && !found; i++)
        if (v.param[i] == p && v.ld[i] && (st || !v.st[i])) {
            CgBuf b = {0};
            cg_print_expr(&b, k, v.index[i], &cg_target_cuda);
            *index = b.s ? b.s : xstrdup("");
            *vec = v.vec;
            found = true;
        }
    cg_cuda_vec_free(&v);
    return found;
}

static bool same_dims(const CgPhase *a, const CgPhase *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->dim[d].n != b->dim[d].n || a->dim[d].var != b->dim[d].var)
            return false;
    return true;
}

int cg_cuda_row_cache_role(const CgKernel *k, const CgLoop *l, const DType *storage,
                           const CgCudaAlias *al, int pi, int p)
{
    int fill = -1, fvec = 0, role = 0;
    char *fidx = NULL;
    for (int i = 0; i < l->ph.n && i <= pi; i++) {
        int vec;
        char *idx;
        /* the fill only loads p; a later phase may store it too (an
         * in-place param: its loads want the values the fill read) */
        if (!vec_load(k, &l->ph.v[i], storage, al, p, fill >= 0, &vec, &idx))
            continue;
        if (fill < 0) {
            fill = i, fvec = vec, fidx = idx;
            role = i == pi ? 1 : 0;
            continue;
        }
        if (i == pi && vec == fvec && strcmp(idx, fidx) == 0 &&
            same_dims(&l->ph.v[i], &l->ph.v[fill]))
            role = 2;
        free(idx);
    }
    free(fidx);
    return role;
}

static bool expr_loads(const CgKernel *k, int e, int p)
{
    if (e < 0)
        return false;
    const CgExpr *x = &k->ex.v[e];
    if (x->kind == CGX_LOAD && x->param == p)
        return true;
    int n = x->kind == CGX_OP       ? cg_opinfo[x->op].arity
            : x->kind == CGX_SELECT ? 3
            : (x->kind == CGX_LOAD || x->kind == CGX_CAST || x->kind == CGX_RAND) ? 1
                                                                                  : 0;
    for (int j = 0; j < n; j++)
        if (expr_loads(k, x->a[j], p))
            return true;
    return false;
}

static bool phase_stores(const CgPhase *ph, int p)
{
    for (int i = 0; i < ph->st.n; i++)
        if (ph->st.v[i].param == p)
            return true;
    return false;
}

/* Whether phase ph loads or stores param p. */
static bool phase_touches(const CgKernel *k, const CgPhase *ph, int p)
{
    if (phase_stores(ph, p) || (ph->acc >= 0 && expr_loads(k, ph->value, p)))
        return true;
    for (int i = 0; i < ph->lets.n; i++)
        if (expr_loads(k, ph->lets.v[i], p))
            return true;
    for (int i = 0; i < ph->st.n; i++)
        if (expr_loads(k, ph->st.v[i].value, p) || expr_loads(k, ph->st.v[i].index, p))
            return true;
    return false;
}

/* Uint4 words of one vector of param p. */
static int vec_words(int vec, DType dt) { return vec * (dt == DT_BF16 ? 2 : 4) / 16; }

static int plan_cache(const CgKernel *k, const CgLoop *l, const DType *storage,
                      const CgCudaAlias *al, CgCudaFn *f);

void cg_cuda_row_cache(const CgKernel *k, const CgLoop *l, const DType *storage,
                       const CgCudaAlias *al, CgCudaFn *f)
{
    int words = plan_cache(k, l, storage, al, f);
    if (words <= CACHE_WORDS || f->threads >= BIG_THREADS)
        return;
    /* too long a row for CACHE_WORDS registers at this block size: a
     * block of BIG_THREADS holds it if anything does */
    free(f->cached);
    free(f->cache_words);
    int threads = f->threads;
    f->threads = BIG_THREADS;
    if (plan_cache(k, l, storage, al, f) <= CACHE_WORDS && f->ncached)
        return;
    free(f->cached);
    free(f->cache_words);
    f->cached = f->cache_words = NULL;
    f->ncached = f->cache_trips = 0;
    f->threads = threads;
}

/* The cache at f->threads, with no word budget; returns its uint4 words
 * per thread. */
static int plan_cache(const CgKernel *k, const CgLoop *l, const DType *storage,
                      const CgCudaAlias *al, CgCudaFn *f)
{
    f->ncached = 0;
    f->cache_trips = 0;
    f->cached = f->cache_words = NULL;
    if (!f->rows || f->split > 1 || !al || al->all || f->threads <= 0)
        return 0;
    int np = k->params.n, words = 0;
    f->cached = xmalloc(sizeof(int) * (size_t)(np + 1));
    f->cache_words = xmalloc(sizeof(int) * (size_t)(np + 1));
    for (int p = 0; p < np; p++) {
        bool written = false, self = k->params.v[p].out;
        for (int q = 0; q < np && !written; q++)
            written = k->params.v[q].out && q != p && al->cls[q] == al->cls[p];
        if (written)
            continue;
        int fill = -1, trips = 0, w = 0;
        bool reread = false, stray = false;
        for (int i = 0; i < l->ph.n; i++) {
            int role = cg_cuda_row_cache_role(k, l, storage, al, i, p);
            /* a param the kernel writes in place (loads and stores through
             * one pointer, cg_merge_inplace_params): cached only when every
             * phase touching it but the fill reads the cache, so its stores
             * (at the vectors the thread cached) come after every load */
            stray |= self && role != 2 && (role != 1 || phase_stores(&l->ph.v[i], p)) &&
                     phase_touches(k, &l->ph.v[i], p);
            if (role == 1) {
                fill = i;
                int vec = 0;
                char *idx = NULL;
                vec_load(k, &l->ph.v[i], storage, al, p, false, &vec, &idx);
                free(idx);
                int64_t nv = cg_cuda_numel(l->ph.v[i].dim, l->ph.v[i].ndim) / vec;
                trips = (int)((nv + f->threads - 1) / f->threads);
                w = vec_words(vec, storage[p]);
            }
            reread |= role == 2;
        }
        if (fill < 0 || !reread || stray || (f->cache_trips && trips != f->cache_trips))
            continue;
        f->cache_trips = trips;
        f->cached[f->ncached] = p;
        f->cache_words[f->ncached++] = w;
        words += trips * w;
    }
    if (!f->ncached) {
        free(f->cached);
        free(f->cache_words);
        f->cached = f->cache_words = NULL;
    }
    return words;
}

bool cg_cuda_row_cached(const CgCudaFn *f, int p)
{
    for (int i = 0; i < f->ncached; i++)
        if (f->cached[i] == p)
            return true;
    return false;
}
