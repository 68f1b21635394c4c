/* pieces.c - zero=1 on several CPU ranks: the shard update in pieces, so
 * the first all-gather bucket starts before the rest of the update runs.
 *
 * The step graph is the same on every rank: one elementwise kernel updates
 * the rank's whole f32[S] shard (AdamW), and the all-gather starts follow
 * it in the order the next forward first reads their buckets (passes/
 * comm.c). Which part of the shard holds a bucket differs by rank (rank r
 * owns flat elements [off_r, off_r + len_r), ir_shard_range), so the graph
 * cannot split the update by bucket; the executor's plan can, once the
 * rank is known. rt_pieces_plan rewrites the plan's steps from
 *
 *     update [0, S)   start(b0)   start(b1) ... start(bk)
 * to
 *     update [lo, hi)   start(b0)   update [0, lo)   update [hi, S)
 *     start(b1) ... start(bk)
 *
 * where [lo, hi) is this rank's part of the first bucket b0's flat range,
 * as shard positions (empty on a rank that holds none of b0: its update is
 * then one piece after start(b0)). Each piece is a plan step of the same
 * kernel with CgStep.lo/hi set, run through the kernel's NAME_range
 * (CgKernel.flat: every element is computed by the same code from its own
 * elements and the scalars computed before the update, the clip scale and
 * the non-finite flag included, so the pieces give the bits of the one
 * kernel). The gathers' order is unchanged, so every rank issues its
 * collectives in one order; only where the update's pieces fall between
 * them differs by rank. The executor releases start(b0) to the
 * communication thread at once (rt_comm_release; mpi.c otherwise holds a
 * gather until the next call into it), since the rest of the update runs
 * before the next such call.
 *
 * Only on a host backend (the CPU): a device backend runs the update as one
 * launch (docs/distributed.md, step 5). */
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

int rt_pieces_plan(CgPlan *p, int rank, int nranks)
{
    const char *one = getenv("KILN_ZERO_ONE_PIECE"); /* tests: the one-kernel update */
    if (nranks < 2 || (one && *one && strcmp(one, "0") != 0))
        return -1;
    int n = p->steps.n, g0 = -1;
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
    int64_t off, len, b0 = first->sh_start, b1 = b0;
    for (int a = 0; a < first->nargs; a++)
        b1 += shape_numel(&p->g->t.v[first->args[a]].s);
    ir_shard_range(first->sh_total, nranks, rank, &off, &len);
    int64_t lo = (b0 > off ? b0 : off) - off, hi = (b1 < off + len ? b1 : off + len) - off;
    if (hi <= lo) /* none of b0 here: the whole update after its start */
        lo = hi = 0;
    CgStep upd = *up, g = *first;
    int np = k->params.n;
    VEC(CgStep) out = {0};
    for (int s = 0; s < ku; s++)
        vec_push(&out, p->steps.v[s]);
    if (hi > lo)
        vec_push(&out, piece(&upd, np, lo, hi, S));
    vec_push(&out, g);
    int release = out.n - 1;
    if (lo > 0)
        vec_push(&out, piece(&upd, np, 0, lo, S));
    if (hi < S)
        vec_push(&out, piece(&upd, np, hi, S, S));
    for (int s = g0 + 1; s < n; s++)
        vec_push(&out, p->steps.v[s]);
    free(upd.args); /* each piece has its own */
    free(p->steps.v);
    p->steps.v = out.v;
    p->steps.n = out.n;
    p->steps.cap = out.cap;
    return release;
}
