/* pieces.c - zero=1 on several CPU ranks: the shard update in pieces, so
 * the gathers the next forward needs first start before the rest of the
 * update runs.
 *
 * The step graph is the same on every rank: one elementwise kernel updates
 * the rank's whole f32[S] shard (AdamW), and the all-gather starts follow
 * it in the order the next forward first reads their buckets (passes/
 * comm.c). Which part of the shard holds a bucket differs by rank (rank r
 * owns flat elements [off_r, off_r + len_r), ir_shard_range), so the graph
 * cannot split the update by bucket; the executor's plan can, once the
 * rank is known. rt_pieces_plan rewrites the plan's steps from
 *
 *     update [0, S)   start(b0) ... start(bk)
 * to
 *     update [part of b0]   start(b0)   ...   update [part of be]   start(be)
 *     update [the rest, in runs]   start(be+1) ... start(bk)
 *
 * where "part of b" is this rank's part of bucket b's flat range as shard
 * positions (no piece on a rank that holds none of it), and b0..be are the
 * early buckets: those the plan's forward reads no later than its first
 * GEMM (early_buckets). Each piece is a plan step of the same kernel with
 * CgStep.lo/hi set, run through the kernel's NAME_range (CgKernel.flat:
 * every element is computed by the same code from its own elements and
 * the scalars computed before the update, the clip scale and the
 * non-finite flag included, so the pieces give the bits of the one
 * kernel). The gathers' order is unchanged and the early count is a
 * function of the plan, so every rank issues its collectives in one order
 * and releases after the same starts; only where the update's pieces fall
 * between them differs by rank. The executor releases the early starts to
 * the communication thread at once (rt_comm_release; mpi.c otherwise holds
 * a gather until the next call into it, so that the loss's mean goes
 * first); the later ones stay held.
 *
 * The CPU runs a piece through the kernel's C NAME_range; the CUDA backend
 * through its CUDA range function (cg_print_cuda_range,
 * CgCudaProgram.step_range), one launch per piece. */
#include "codegen.h"
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

/* Whether kernel step st writes a buffer whose root is root. */
static bool writes_root(const CgPlan *p, const CgStep *st, int root)
{
    const CgKernel *k = p->kernels.v[st->kernel];
    for (int a = 0; a < k->params.n; a++)
        if (k->params.v[a].out && p->mem->root[st->args[a]] == root)
            return true;
    return false;
}

/* A copy of kernel step st (of S elements) over elements [lo, hi): its own
 * args, its share of the counts. */
static CgStep piece(const CgStep *st, int nparams, int64_t lo, int64_t hi, int64_t S)
{
    CgStep c = *st;
    c.args = xmalloc(sizeof(int) * (size_t)(nparams + 1));
    memcpy(c.args, st->args, sizeof(int) * (size_t)nparams);
    c.lo = lo;
    c.hi = hi;
    c.flops = st->flops * (double)(hi - lo) / (double)S;
    c.bytes_moved = st->bytes_moved * (double)(hi - lo) / (double)S;
    return c;
}

/* This rank's part of all-gather start st's flat range, as shard positions
 * [*lo, *hi); empty (0, 0) when it holds none of it. */
static void local_range(const CgPlan *p, const CgStep *st, int64_t off, int64_t len, int64_t *lo,
                        int64_t *hi)
{
    int64_t b0 = st->sh_start, b1 = b0;
    for (int a = 0; a < st->nargs; a++)
        b1 += shape_numel(&p->g->t.v[st->args[a]].s);
    *lo = (b0 > off ? b0 : off) - off;
    *hi = (b1 < off + len ? b1 : off + len) - off;
    if (*hi <= *lo)
        *lo = *hi = 0;
}

/* How many of the all-gather starts g0..g1-1 (in the forward's read order)
 * are read by the plan's forward no later than its first GEMM: the
 * buckets the next forward needs before it has compute of any size to
 * hide a gather behind (gpt: wte, wpe and h.0.ln_1 by the embedding and
 * ln_1 kernel, then h.0's c_attn weight by the first GEMM). At least 1.
 * A function of the plan alone, so the same on every rank. */
static int early_buckets(const CgPlan *p, int g0, int g1)
{
    const MemPlan *m = p->mem;
    int first_gemm = p->steps.n;
    for (int s = 0; s < p->steps.n && first_gemm == p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_GEMM)
            first_gemm = s;
    bool *read = xcalloc((size_t)p->g->t.n + 1, sizeof(bool)); /* per root: read by then */
    for (int s = 0; s <= first_gemm && s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind == CG_STEP_KERNEL) {
            const CgKernel *k = p->kernels.v[st->kernel];
            for (int a = 0; a < k->params.n; a++)
                if (!k->params.v[a].out)
                    read[m->root[st->args[a]]] = true;
        } else if (st->kind == CG_STEP_GEMM) {
            read[m->root[st->gemm.a]] = read[m->root[st->gemm.b]] = true;
            if (st->gemm.bias >= 0)
                read[m->root[st->gemm.bias]] = true;
        }
    }
    int n = 1;
    for (int s = g0 + 1; s < g1; s++) {
        bool any = false;
        for (int a = 0; a < p->steps.v[s].nargs; a++)
            any |= read[m->root[p->steps.v[s].args[a]]];
        if (!any)
            break;
        n++;
    }
    free(read);
    return n;
}

/* Shard positions [lo, hi). */
typedef struct {
    int64_t lo, hi;
} Range;
typedef VEC(Range) Ranges;

/* Adds [lo, hi) (not empty) to the sorted, disjoint ranges of *done;
 * dies when it overlaps one of them (a bucket's range is its own). */
static void add_range(Ranges *done, int64_t lo, int64_t hi)
{
    int at = 0;
    while (at < done->n && done->v[at].hi <= lo)
        at++;
    if (at < done->n && done->v[at].lo < hi)
        die("rt_pieces_plan: all-gather buckets overlap at shard positions [%lld, %lld)",
            (long long)(lo > done->v[at].lo ? lo : done->v[at].lo),
            (long long)(hi < done->v[at].hi ? hi : done->v[at].hi));
    vec_push(done, ((Range){lo, hi}));
    memmove(done->v + at + 1, done->v + at, sizeof(Range) * (size_t)(done->n - 1 - at));
    done->v[at] = (Range){lo, hi};
}

int rt_pieces_plan(CgPlan *p, int rank, int nranks)
{
    const char *one = getenv("KILN_ZERO_ONE_PIECE"); /* tests: the one-kernel update */
    if (nranks < 2 || (one && *one && strcmp(one, "0") != 0))
        return -1;
    int n = p->steps.n, g0 = -1, g1;
    for (int s = 0; s < n && g0 < 0; s++)
        if (p->steps.v[s].kind == CG_STEP_ALLREDUCE_START &&
            p->steps.v[s].coll == CG_COLL_ALL_GATHER)
            g0 = s;
    if (g0 < 1)
        return -1;
    const CgStep *first = &p->steps.v[g0];
    int root = p->mem->root[first->sh_buf], ku = g0 - 1;
    const CgStep *up = &p->steps.v[ku];
    if (up->kind != CG_STEP_KERNEL || up->hi > up->lo || !writes_root(p, up, root))
        return -1; /* the update is not right before the gathers: one piece */
    const CgKernel *k = p->kernels.v[up->kernel];
    int64_t S = shape_numel(&p->g->t.v[first->sh_buf].s);
    if (k->flat != S || first->sh_nranks != nranks)
        return -1;
    for (g1 = g0; g1 < n && p->steps.v[g1].kind == CG_STEP_ALLREDUCE_START &&
                  p->steps.v[g1].coll == CG_COLL_ALL_GATHER &&
                  p->mem->root[p->steps.v[g1].sh_buf] == root;
         g1++)
        ;
    int early = early_buckets(p, g0, g1);
    int64_t off, len;
    ir_shard_range(first->sh_total, nranks, rank, &off, &len);
    Ranges done = {0}; /* the early pieces, sorted by position */
    CgStep upd = *up;
    int np = k->params.n, release = -1;
    VEC(CgStep) out = {0};
    for (int s = 0; s < ku; s++)
        vec_push(&out, p->steps.v[s]);
    for (int s = g0; s < g0 + early; s++) { /* the early buckets: a piece each, then the start */
        int64_t lo, hi;
        local_range(p, &p->steps.v[s], off, len, &lo, &hi);
        if (hi > lo) {
            add_range(&done, lo, hi);
            vec_push(&out, piece(&upd, np, lo, hi, S));
        }
        vec_push(&out, p->steps.v[s]);
        release = out.n - 1;
    }
    int64_t at = 0; /* the rest of the update: the gaps between the early pieces, in order */
    for (int i = 0; i <= done.n; i++) {
        int64_t end = i < done.n ? done.v[i].lo : S;
        if (end > at)
            vec_push(&out, piece(&upd, np, at, end, S));
        if (i < done.n)
            at = done.v[i].hi;
    }
    for (int s = g0 + early; s < n; s++)
        vec_push(&out, p->steps.v[s]);
    free(done.v);
    free(upd.args); /* each piece has its own */
    free(p->steps.v);
    p->steps.v = out.v;
    p->steps.n = out.n;
    p->steps.cap = out.cap;
    return release;
}
