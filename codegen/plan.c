/* plan.c - the Plan of a scheduled graph: one step per op in schedule order
 * (views cost nothing; attention_dqkv takes two, its dq and its dk/dv
 * kernel), then the copies of updates not computed in place.
 * Ops whose kernels print to the same body share one kernel. GEMM epilogues
 * are recorded last (epilogue.c). */
#include "codegen.h"

#include <stdlib.h>
#include <string.h>

int64_t cg_offset(const CgPlan *p, int tensor) { return p->mem->offset[tensor]; }

/* GEMMs run in f32 (OpenBLAS sgemm; cuBLASLt takes bf16 only through the
 * CUDA backend's storage types); else d names the op's line. */
static bool gemm_supported(const Graph *g, const Op *op, Diag *d)
{
    DType dt = g->t.v[op->out].s.dtype;
    if (dt == DT_F32)
        return true;
    snprintf(d->msg, sizeof d->msg,
             "%s:%d: matmul on %s is not supported by the CPU backend yet (expected f32)",
             op->loc.file ? op->loc.file : "?", op->loc.line, dtype_name(dt));
    return false;
}

/* Whether attention ops a and b (partners, cg_attn_partner) may run as one
 * kernel at the later of the two: both must name each other, and no op in
 * between reads the earlier one's result. */
static bool attn_pair_ok(const Graph *g, int a, int b)
{
    if (b < 0 || cg_attn_partner(g, b) != a)
        return false;
    int lo = a < b ? a : b, hi = a < b ? b : a, t = g->ops.v[lo].out;
    for (int i = lo + 1; i < hi; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            if (g->ops.v[i].in[j] == t)
                return false;
    return true;
}

/* The step of attention op i (and its partner, run as one kernel at the
 * later of the two: *skip when i is the earlier one); for attention_dqkv
 * the step of its dq (part 0) or its dk/dv kernel (part 1). */
static bool plan_attn(const Graph *g, int i, int part, CgKernel *k, CgStep *st, bool *skip,
                      Diag *d)
{
    int ops[2] = {i, -1}, n = 1, j = cg_attn_partner(g, i);
    *skip = false;
    if (g->ops.v[i].code == OP_ATTENTION_DQKV) {
        const Op *op = &g->ops.v[i];
        if (!cg_lower_attn_dqkv(g, i, part, k, d))
            return false;
        char nb[128];
        snprintf(nb, sizeof nb, "k%d_attention_dqkv_%s", i, part ? "dkv" : "dq");
        k->name = xstrdup(nb);
        /* folded (cg_c_attn_folded: the C backend's dk/dv kernel computes dq
         * too), the dq step has no work, and the dk/dv kernel's count stays:
         * attention_dk's and _dv's (S twice, dP once) equal S, dP, dS, dv, dk
         * and dq's to within a second exp. (The CUDA printer folds the two
         * by its own test, cg_cuda_attn_bwd_fits, which these counts follow
         * only where the two agree.) */
        const CgAttn *a = &k->attn;
        bool folded = cg_c_attn_folded(a);
        st->flops = part ? ir_attn_flops(g, op, OP_ATTENTION_DK) +
                               ir_attn_flops(g, op, OP_ATTENTION_DV)
                         : folded ? 0 : ir_attn_flops(g, op, OP_ATTENTION_DQ);
        /* the heads' columns of q, k, v read; its own columns written */
        double es = (double)dtype_size(g->t.v[op->in[0]].s.dtype),
               cols = (double)(a->lay.nb * a->Tq * a->lay.nh * a->D) * es;
        if (!part && folded) {
            st->bytes_moved = 0;
            return true;
        }
        st->bytes_moved = 3 * cols + (folded ? 3 : part ? 2 : 1) * cols;
        for (int x = 3; x < op->nin; x++)
            st->bytes_moved += (double)shape_bytes(&g->t.v[op->in[x]].s);
        return true;
    }
    if (attn_pair_ok(g, i, j)) {
        if (j > i) {
            *skip = true;
            return true;
        }
        ops[0] = j;
        ops[1] = i;
        n = 2;
    }
    if (!cg_lower_attn(g, ops, n, k, d))
        return false;
    char nb[128];
    snprintf(nb, sizeof nb, "k%d_%s%s", i, ir_opinfo[g->ops.v[ops[0]].code].name,
             n == 2 ? "_pair" : "");
    k->name = xstrdup(nb);
    st->flops = 0;
    for (int x = 0; x < n; x++)
        st->flops += ir_op_flops(g, &g->ops.v[ops[x]]);
    st->bytes_moved = 0;
    const CgAttn *a = &k->attn;
    for (int x = 0; x < k->params.n; x++) {
        const Shape *s = &g->t.v[k->params.v[x].tensor].s;
        bool qkv = x == a->q || x == a->k || x == a->v;
        /* the head layout reads only its heads' columns of q, k, v */
        st->bytes_moved += qkv && a->lay.q.hs > 0
                               ? (double)(a->lay.nb * (x == a->q ? a->Tq : a->Tk) * a->lay.nh *
                                          a->D * dtype_size(s->dtype))
                               : (double)shape_bytes(s);
    }
    return true;
}

static CgGemm plan_gemm(const Graph *g, const Op *op)
{
    const Shape *A = &g->t.v[op->in[0]].s, *B = &g->t.v[op->in[1]].s,
                *C = &g->t.v[op->out].s;
    CgGemm m = {.a = op->in[0], .b = op->in[1], .c = op->out, .bias = -1, .d = -1, .aux = -1,
                .bgrad = -1, .pair = -1};
    m.ta = op->attr.ia[0] != 0;
    m.tb = op->attr.ia[1] != 0;
    m.M = C->dim[C->rank - 2];
    m.N = C->dim[C->rank - 1];
    m.K = A->dim[A->rank - (m.ta ? 2 : 1)];
    m.batch = shape_numel(C) / (m.M * m.N);
    m.lda = A->dim[A->rank - 1];
    m.ldb = B->dim[B->rank - 1];
    m.ldc = m.N;
    m.sa = A->dim[A->rank - 1] * A->dim[A->rank - 2];
    m.sb = B->rank == 2 ? 0 : B->dim[B->rank - 1] * B->dim[B->rank - 2];
    m.sc = m.M * m.N;
    if (m.sb == 0 && !m.ta && m.batch > 1) {
        /* a shared B: the batch folds into the rows of one GEMM */
        m.M *= m.batch;
        m.batch = 1;
    }
    return m;
}

typedef struct {
    uint64_t h;
    char *body;
    int kernel;
} BodyEntry;
typedef VEC(BodyEntry) BodySet;

/* Params x and y of k by where they lie: offset, then size, then dtype. */
static int param_place(const MemPlan *m, const CgKernel *k, int x, int y)
{
    int tx = k->params.v[x].tensor, ty = k->params.v[y].tensor;
    if (m->offset[tx] != m->offset[ty])
        return m->offset[tx] < m->offset[ty] ? -1 : 1;
    if (m->bytes[tx] != m->bytes[ty])
        return m->bytes[tx] < m->bytes[ty] ? -1 : 1;
    DType dx = k->params.v[x].dt, dy = k->params.v[y].dt;
    return (dx > dy) - (dx < dy);
}

typedef struct {
    const MemPlan *m;
    const CgKernel *k;
} ParamCtx;

/* By place, then index. ctx: ParamCtx. */
static int cmp_param_place(const void *a, const void *b, void *ctx)
{
    const ParamCtx *c = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    int p = param_place(c->m, c->k, x, y);
    return p ? p : (x > y) - (x < y);
}

/* An input whose buffer is exactly an output's (an update computed in place)
 * becomes that output's param: the kernel then reads and writes through one
 * pointer, and its params never overlap (restrict holds). */
void cg_merge_inplace_params(const MemPlan *m, CgKernel *k)
{
    int n = k->params.n;
    int *to = xmalloc(sizeof(int) * (size_t)(n + 1));
    /* each input maps to the first output with its dtype, offset and size:
     * the outputs sorted by place, then index, and a binary search */
    int *outs = xmalloc(sizeof(int) * (size_t)(n + 1));
    int no = 0;
    for (int b = 0; b < n; b++)
        if (k->params.v[b].out)
            outs[no++] = b;
    ParamCtx pc = {m, k};
    qsort_r(outs, (size_t)no, sizeof(int), cmp_param_place, &pc);
    for (int a = 0; a < n; a++) {
        to[a] = a;
        if (k->params.v[a].out)
            continue;
        int lo = 0, hi = no;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (param_place(m, k, outs[mid], a) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < no && param_place(m, k, outs[lo], a) == 0)
            to[a] = outs[lo];
    }
    free(outs);
    /* renumber the surviving params densely */
    int *idx = xmalloc(sizeof(int) * (size_t)(n + 1));
    int w = 0;
    for (int a = 0; a < n; a++)
        idx[a] = to[a] == a ? w++ : -1;
    for (int a = 0; a < n; a++)
        to[a] = idx[to[a]];
    if (w < n) {
        for (int e = 0; e < k->ex.n; e++)
            if (k->ex.v[e].kind == CGX_LOAD)
                k->ex.v[e].param = to[k->ex.v[e].param];
        for (int l = 0; l < k->loops.n; l++)
            for (int ph = 0; ph < k->loops.v[l].ph.n; ph++)
                for (int q = 0; q < k->loops.v[l].ph.v[ph].st.n; q++) {
                    CgStore *st = &k->loops.v[l].ph.v[ph].st.v[q];
                    st->param = to[st->param];
                }
        int r = 0;
        for (int a = 0; a < n; a++)
            if (idx[a] >= 0)
                k->params.v[r++] = k->params.v[a];
        k->params.n = r;
    }
    free(idx);
    free(to);
}

typedef struct {
    int64_t s, e;
    bool out;
} Extent;

static int cmp_extent(const void *a, const void *b)
{
    const Extent *x = a, *y = b;
    return (x->s > y->s) - (x->s < y->s);
}

/* One sweep in address order: a pair that starts at different addresses
 * overlaps when the later start lies below the earlier one's end; at one
 * address, when both are non-empty. */
bool cg_params_alias(const MemPlan *m, const CgKernel *k)
{
    int n = k->params.n;
    Extent *x = xmalloc(sizeof(Extent) * (size_t)(n + 1));
    for (int a = 0; a < n; a++) {
        int t = k->params.v[a].tensor;
        x[a] = (Extent){m->offset[t], ir_add_sat(m->offset[t], m->bytes[t]), k->params.v[a].out};
    }
    qsort(x, (size_t)n, sizeof(Extent), cmp_extent);
    bool alias = false;
    int64_t end_all = INT64_MIN, end_out = INT64_MIN; /* over starts before x[a]'s */
    for (int a = 0; a < n && !alias;) {
        int b = a, full = 0, full_out = 0;
        for (; b < n && x[b].s == x[a].s; b++) {
            if ((x[b].out && end_all > x[b].s) || end_out > x[b].s)
                alias = true;
            if (x[b].e > x[b].s) {
                full++;
                full_out += x[b].out;
            }
        }
        if (full >= 2 && full_out > 0)
            alias = true;
        for (; a < b; a++) {
            if (x[a].e > end_all)
                end_all = x[a].e;
            if (x[a].out && x[a].e > end_out)
                end_out = x[a].e;
        }
    }
    free(x);
    return alias;
}

/* Adds kernel k (owned from here) as step *st: reuses an earlier kernel with
 * the same body, else appends k to the plan and its source. */
static bool add_kernel(CgPlan *p, CgKernel *k, BodySet *seen, CgBuf *src, CgStep *st)
{
    const MemPlan *m = p->mem;
    if (k->attn.kind == CG_ATTN_NONE) /* CgAttn names its params by index */
        cg_merge_inplace_params(m, k);
    if (cg_params_alias(m, k))
        k->noalias = false;
    char *full = k->name;
    k->name = xstrdup("KNAME");
    CgBuf body = {0};
    cg_print_c_kernel(&body, k);
    uint64_t h = hash_bytes(body.s, body.n, 0);
    int found = -1;
    for (int s = 0; s < seen->n && found < 0; s++)
        if (seen->v[s].h == h && strcmp(seen->v[s].body, body.s) == 0)
            found = seen->v[s].kernel;
    st->kind = CG_STEP_KERNEL;
    st->args = xmalloc(sizeof(int) * (size_t)(k->params.n + 1));
    for (int a = 0; a < k->params.n; a++)
        st->args[a] = k->params.v[a].tensor;
    if (found >= 0) {
        free(full);
        cg_kernel_free(k);
        st->kernel = found;
    } else {
        free(k->name);
        k->name = full;
        BodyEntry e = {h, body.s, p->kernels.n};
        body.s = NULL;
        vec_push(seen, e);
        vec_push(&p->kernels, k);
        st->kernel = p->kernels.n - 1;
        cg_puts(src, "\n");
        cg_print_c_kernel(src, k);
    }
    free(body.s);
    st->name = intern(p->kernels.v[st->kernel]->name);
    vec_push(&p->steps, *st);
    return true;
}

static bool flat_tensor(const Graph *g, int t, int64_t n)
{
    const Shape *sh = &g->t.v[t].s;
    int64_t k = shape_numel(sh);
    return sh->rank <= 1 && (k == 1 || k == n);
}

/* Whether fused group kernel k (of members[0..nm)) is elementwise over n
 * elements (CgKernel.flat): every member an elementwise op (no iota) or a
 * broadcast of one element, every tensor it reads or writes of rank 1 or
 * less with 1 or n elements (so each n-element buffer is read and written
 * at the element's own index, and the rest are scalars), and the kernel one
 * loop of one store phase whose one variable longer than 1 runs over n. */
static bool flat_kernel(const Graph *g, const int *members, int nm, const CgKernel *k, int64_t n)
{
    if (n < 2 || k->rand || k->attn.kind != CG_ATTN_NONE || k->loops.n != 1 ||
        k->loops.v[0].ph.n != 1 || k->loops.v[0].col)
        return false;
    for (int q = 0; q < nm; q++) {
        const Op *op = &g->ops.v[members[q]];
        bool ew = ir_opinfo[op->code].cls == OC_ELEMWISE && op->code != OP_IOTA;
        bool bcast = op->code == OP_BROADCAST && shape_numel(&g->t.v[op->in[0]].s) == 1;
        if ((!ew && !bcast) || !flat_tensor(g, op->out, n))
            return false;
        for (int j = 0; j < op->nin; j++)
            if (!flat_tensor(g, op->in[j], n))
                return false;
    }
    const CgLoop *l = &k->loops.v[0];
    const CgPhase *ph = &l->ph.v[0];
    if (ph->acc >= 0)
        return false;
    for (int i = 0; i < ph->st.n; i++)
        if (ph->st.v[i].accumulate)
            return false;
    int64_t prod = 1;
    int longer = 0;
    for (int i = 0; i < l->ndim; i++)
        prod *= l->dim[i].n, longer += l->dim[i].n > 1;
    for (int i = 0; i < ph->ndim; i++)
        prod *= ph->dim[i].n, longer += ph->dim[i].n > 1;
    return prod == n && longer == 1;
}

CgPlan *cg_plan(const Graph *g, Diag *d)
{
    CgPlan *p = xcalloc(1, sizeof *p);
    p->g = g;
    p->mem = pass_memplan(g, d);
    p->arena_bytes = p->mem->arena_bytes;
    const MemPlan *m = p->mem;
    CgBuf src = {0};
    cg_puts(&src, cg_c_prelude);
    cg_puts(&src, cg_c_attn_helpers); /* the attention kernels' helper */
    BodySet seen = {0};
    bool *mat = pass_fuse_materialised(g);
    CgLowerWs *lws = cg_lower_ws_new(g);
    int ngroups = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].group >= ngroups)
            ngroups = g->ops.v[i].group + 1;
    bool *gdone = xcalloc((size_t)ngroups + 1, sizeof(bool));
    int *members = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    /* zero=1: the shards the all-gathers read; the kernel writing one is
     * made flat when it can be (runtime/pieces.c runs it in pieces) */
    bool *gshard = xcalloc((size_t)g->t.n + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_ALL_GATHER_START)
            gshard[m->root[g->ops.v[i].in[0]]] = true;

    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        CgStep st = {.op = i, .kernel = -1, .group = -1};
        st.flops = ir_op_flops(g, op);
        st.bytes_moved = ir_op_bytes(g, op);
        if (op->group >= 0) {
            /* a fused group: its GEMM (if any), then one kernel for the rest */
            int gid = op->group, n = 0, j = i;
            if (gdone[gid])
                die("cg_plan: the ops of group %d are not contiguous (run pass_schedule)", gid);
            gdone[gid] = true;
            for (; j < g->ops.n && g->ops.v[j].group == gid; j++)
                if (g->ops.v[j].code != OP_MATMUL)
                    members[n++] = j;
            for (int q = i; q < j; q++) {
                const Op *mo = &g->ops.v[q];
                if (mo->code != OP_MATMUL)
                    continue;
                if (!gemm_supported(g, mo, d))
                    goto fail;
                CgStep gs = {.kind = CG_STEP_GEMM, .op = q, .kernel = -1, .group = gid};
                gs.gemm = plan_gemm(g, mo);
                gs.name = intern("gemm");
                gs.flops = ir_op_flops(g, mo);
                gs.bytes_moved = ir_op_bytes(g, mo);
                vec_push(&p->steps, gs);
            }
            i = j - 1;
            if (!n)
                continue;
            CgKernel *k = xcalloc(1, sizeof *k);
            if (!cg_lower_group_ws(lws, g, members, n, mat, k, d)) {
                cg_kernel_free(k);
                goto fail;
            }
            char nb[128];
            snprintf(nb, sizeof nb, "g%d_%s", gid, ir_opinfo[g->ops.v[members[0]].code].name);
            k->name = xstrdup(nb);
            for (int a = 0; a < k->params.n; a++) {
                int t = k->params.v[a].tensor;
                if (k->params.v[a].out && gshard[m->root[t]] &&
                    flat_kernel(g, members, n, k, shape_numel(&g->t.v[t].s)))
                    k->flat = shape_numel(&g->t.v[t].s);
            }
            st.op = members[0];
            st.group = gid;
            st.flops = 0;
            for (int q = 0; q < n; q++)
                st.flops += ir_op_flops(g, &g->ops.v[members[q]]);
            st.bytes_moved = pass_fuse_group_bytes(g, members, n, mat);
            if (!add_kernel(p, k, &seen, &src, &st))
                goto fail;
            continue;
        }
        if (ir_opinfo[op->code].cls == OC_ATTN) {
            /* attention_dqkv: two kernels (dq, then dk/dv) into its buffer */
            int nparts = op->code == OP_ATTENTION_DQKV ? 2 : 1;
            for (int part = 0; part < nparts; part++) {
                CgKernel *k = xcalloc(1, sizeof *k);
                CgStep ps = st;
                bool skip;
                if (!plan_attn(g, i, part, k, &ps, &skip, d)) {
                    cg_kernel_free(k);
                    goto fail;
                }
                if (skip) {
                    cg_kernel_free(k);
                    continue;
                }
                if (!add_kernel(p, k, &seen, &src, &ps))
                    goto fail;
            }
            continue;
        }
        if ((op->code == OP_RESHAPE || op->code == OP_ALLREDUCE) &&
            m->root[op->out] == m->root[op->in[0]])
            continue;
        if (op->code == OP_REDUCE_SCATTER || op->code == OP_ALL_GATHER)
            die("cg_plan: %s at op %d (the comm pass turns it into buckets)",
                ir_opinfo[op->code].name, i);
        if (op->code == OP_SHARD_PACK || op->code == OP_REDUCE_SCATTER_START ||
            op->code == OP_REDUCE_SCATTER_WAIT || op->code == OP_ALL_GATHER_START ||
            op->code == OP_ALL_GATHER_WAIT) {
            bool pack = op->code == OP_SHARD_PACK;
            bool start = op->code == OP_REDUCE_SCATTER_START || op->code == OP_ALL_GATHER_START;
            bool rs = op->code == OP_REDUCE_SCATTER_START || op->code == OP_REDUCE_SCATTER_WAIT;
            st.kind = pack ? CG_STEP_SHARD_PACK
                           : start ? CG_STEP_ALLREDUCE_START : CG_STEP_ALLREDUCE_WAIT;
            st.coll = rs ? CG_COLL_REDUCE_SCATTER : CG_COLL_ALL_GATHER;
            st.bucket = (int)op->attr.ia[0];
            st.sh_start = op->attr.ia[1];
            st.sh_total = op->attr.ia[2];
            st.sh_nranks = (int)op->attr.ia[3];
            if (pack || start) {
                st.sh_buf = pack ? op->out : op->in[0];
                st.nargs = op->nin - !pack;
                st.args = xmalloc(sizeof(int) * (size_t)op->nin);
                for (int a = !pack; a < op->nin; a++)
                    st.args[a - !pack] = op->in[a];
            } else if (m->root[op->out] != m->root[op->in[rs ? 1 : 2]]) {
                die("cg_plan: %s result %%%d is not a view of its buffer",
                    ir_opinfo[op->code].name, op->out);
            }
            if (pack) {
                st.dst = m->offset[op->out];
                st.bytes = m->bytes[op->out];
            }
            st.name = intern(ir_opinfo[op->code].name);
            vec_push(&p->steps, st);
            continue;
        }
        if (op->code == OP_ALLREDUCE_START || op->code == OP_ALLREDUCE_WAIT) {
            bool start = op->code == OP_ALLREDUCE_START;
            st.kind = start ? CG_STEP_ALLREDUCE_START : CG_STEP_ALLREDUCE_WAIT;
            st.bucket = (int)op->attr.ia[0];
            if (start) {
                st.nargs = op->nin;
                st.args = xmalloc(sizeof(int) * (size_t)op->nin);
                for (int a = 0; a < op->nin; a++)
                    st.args[a] = op->in[a];
            } else if (m->root[op->out] != m->root[op->in[1]]) {
                die("cg_plan: allreduce_wait result %%%d is not a view of its gradient",
                    op->out);
            }
            st.name = intern(start ? "allreduce_start" : "allreduce_wait");
            vec_push(&p->steps, st);
            continue;
        }
        if (op->code == OP_MATMUL) {
            if (!gemm_supported(g, op, d))
                goto fail;
            st.kind = CG_STEP_GEMM;
            st.gemm = plan_gemm(g, op);
            st.name = intern("gemm");
            vec_push(&p->steps, st);
            continue;
        }
        if (op->code == OP_TP_ALLREDUCE || op->code == OP_TP_ALL_GATHER ||
            op->code == OP_TP_REDUCE_SCATTER) {
            st.kind = CG_STEP_TP;
            st.dst = m->offset[op->out];
            st.src = m->offset[op->in[0]];
            st.bytes = m->bytes[op->out];
            st.name = intern(ir_opinfo[op->code].name);
            vec_push(&p->steps, st);
            continue;
        }
        if (op->code == OP_ALLREDUCE || op->code == OP_RESHAPE || op->code == OP_TP_COPY) {
            st.kind = CG_STEP_COPY;
            st.dst = m->offset[op->out];
            st.src = m->offset[op->in[0]];
            st.bytes = m->bytes[op->out];
            st.name = intern("copy");
            vec_push(&p->steps, st);
            continue;
        }
        CgKernel *k = xcalloc(1, sizeof *k);
        /* a lone reduction still gets the fused lowering: vectorised row
         * folds, and column sums that walk rows contiguously */
        bool lowered = false;
        if (ir_opinfo[op->code].cls == OC_REDUCE && pass_fuse_op_fusable(g, op)) {
            Diag d2 = {{0}};
            int one = i;
            lowered = cg_lower_group_ws(lws, g, &one, 1, mat, k, &d2);
            if (lowered) {
                char nb[128];
                snprintf(nb, sizeof nb, "k%d_%s", i, ir_opinfo[op->code].name);
                k->name = xstrdup(nb);
            } else {
                cg_kernel_free(k);
                k = xcalloc(1, sizeof *k);
            }
        }
        if (!lowered && !cg_lower_op(g, i, k, d)) {
            cg_kernel_free(k);
            goto fail;
        }
        if (!add_kernel(p, k, &seen, &src, &st))
            goto fail;
    }
    /* update copies: one that reads a region goes before one that writes it */
    VEC(CgStep) cp = {0};
    for (int u = 0; u < g->upd.n; u++) {
        if (m->inplace[u])
            continue;
        int T = g->upd.v[u].target, V = g->upd.v[u].value;
        if (m->offset[T] == m->offset[V])
            continue;
        CgStep st = {.kind = CG_STEP_COPY, .op = -1, .kernel = -1, .update = true, .group = -1};
        st.dst = m->offset[T];
        st.src = m->offset[V];
        st.bytes = m->bytes[T];
        st.bytes_moved = 2.0 * (double)st.bytes;
        st.name = intern("update_copy");
        vec_push(&cp, st);
    }
    bool *done = xcalloc((size_t)cp.n + 1, sizeof(bool));
    for (int left = cp.n; left > 0;) {
        int before = left;
        for (int a = 0; a < cp.n; a++) {
            if (done[a])
                continue;
            bool blocked = false;
            for (int b = 0; b < cp.n && !blocked; b++)
                blocked = b != a && !done[b] && cp.v[b].src < cp.v[a].dst + cp.v[a].bytes &&
                          cp.v[a].dst < cp.v[b].src + cp.v[b].bytes;
            if (blocked)
                continue;
            vec_push(&p->steps, cp.v[a]);
            done[a] = true;
            left--;
        }
        if (left == before)
            die("cg_plan: update copies form a cycle (params swapped by updates)");
    }
    free(done);
    vec_free(&cp);
    cg_plan_epilogues(p, mat);
    for (int s = 0; s < seen.n; s++)
        free(seen.v[s].body);
    vec_free(&seen);
    free(mat);
    cg_lower_ws_free(lws);
    free(gdone);
    free(gshard);
    free(members);
    p->source = src.s ? src.s : xstrdup("");
    return p;
fail:
    for (int s = 0; s < seen.n; s++)
        free(seen.v[s].body);
    vec_free(&seen);
    free(mat);
    cg_lower_ws_free(lws);
    free(gdone);
    free(gshard);
    free(members);
    free(src.s);
    cg_plan_free(p);
    return NULL;
}

int *cg_plan_op_steps(const CgPlan *p, const Graph *g)
{
    int ngroups = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].group + 1 > ngroups)
            ngroups = g->ops.v[i].group + 1;
    int *gstep = xmalloc(sizeof(int) * (size_t)(ngroups + 1));
    int *ostep = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1));
    for (int k = 0; k < ngroups; k++)
        gstep[k] = -1;
    for (int i = 0; i < g->ops.n; i++)
        ostep[i] = -1;
    for (int s = 0; s < p->steps.n; s++) {
        int o = p->steps.v[s].op;
        if (o < 0)
            continue;
        if (ostep[o] < 0)
            ostep[o] = s;
        int k = g->ops.v[o].group;
        if (k >= 0 && gstep[k] < 0)
            gstep[k] = s;
    }
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].group >= 0)
            ostep[i] = gstep[g->ops.v[i].group];
    free(gstep);
    return ostep;
}

void cg_plan_free(CgPlan *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->kernels.n; i++)
        cg_kernel_free(p->kernels.v[i]);
    vec_free(&p->kernels);
    for (int i = 0; i < p->steps.n; i++)
        free(p->steps.v[i].args);
    vec_free(&p->steps);
    pass_memplan_free(p->mem);
    free(p->source);
    free(p);
}
