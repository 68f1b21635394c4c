/* cuda_plan.c - the CUDA program of a plan (cg_cuda_program, cg_cuda.h):
 * the decisions the CUDA backend and the emulated device take from codegen,
 * then the source that realises them.
 *
 * Decides, in this order: the dtype each tensor is stored as on the device
 * (bf16 for eligible activations in mixed precision, every storage of one
 * buffer alike); the device arena (the plan's when nothing changed size,
 * else the same storages and live ranges re-planned, with the persistent
 * region and graph outputs' sizes unchanged: it dies otherwise) and every
 * copy step and host access in its offsets; the GEMM epilogues the device
 * may apply (pairs both or neither); the kernel variants (one per distinct
 * storage and aliasing of a shared kernel). Then prints the prelude, the
 * bf16 cast kernel and every variant through cuda_print.c, in step order.
 * Invariant: the printed source depends only on the plan and bf16, so two
 * calls on one plan print the same bytes (the kernel cache relies on it). */
#include "cg_cuda.h"

#include <stdlib.h>
#include <string.h>

static bool is_float(DType dt) { return dt == DT_F32 || dt == DT_BF16; }

/* Per tensor: may its buffer be stored as bf16 (see cg_cuda_program). The
 * copies that tie two storages to one type are the ops cg_plan makes copy
 * steps of: ungrouped reshapes and synchronous all-reduces (a reshape shares
 * its operand's root, so only an all-reduce into another buffer ties two). */
static bool *bf16_storage(const Graph *g, const MemPlan *m)
{
    int nt = g->t.n;
    bool *elig = xcalloc((size_t)nt + 1, sizeof(bool));
    /* values computed from constants and indices only (positions, masks,
     * frequencies) keep f32: bf16 would round position 257 to 256 */
    bool *fixed = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        bool f = op->code != OP_RANDOM;
        for (int j = 0; j < op->nin && f; j++) {
            const Tensor *x = &g->t.v[op->in[j]];
            f = fixed[x->id] || x->kind == TK_CONST;
        }
        fixed[op->out] = f;
    }
    for (int t = 0; t < nt; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->kind != TK_TEMP || !is_float(x->s.dtype) || x->op < 0)
            continue;
        const Op *op = &g->ops.v[x->op];
        if ((op->flags & OPF_OPTIM) || fixed[t])
            continue;
        switch (op->code) {
        case OP_REDUCE_SUM:
        case OP_REDUCE_MAX:
        case OP_REDUCE_LOGSUMEXP:
        case OP_SCATTER_ADD:
        case OP_CONST:
        case OP_IOTA:
        case OP_RANDOM:
        case OP_ATTENTION_LSE: /* lse and delta stay f32 (the attention kernels' contract) */
            continue;
        default:
            break;
        }
        elig[t] = true;
    }
    for (int i = 0; i < g->outs.n; i++)
        elig[g->outs.v[i].t] = false;
    for (int i = 0; i < g->upd.n; i++)
        elig[g->upd.v[i].value] = false;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].flags & OPF_OPTIM)
            for (int j = 0; j < g->ops.v[i].nin; j++)
                elig[g->ops.v[i].in[j]] = false;
    /* a storage is bf16 only if every tensor living in it is eligible */
    bool *ok = xmalloc(sizeof(bool) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        ok[t] = g->t.v[m->root[t]].kind == TK_TEMP && !m->persistent[m->root[t]];
    for (int t = 0; t < nt; t++)
        if (!elig[t])
            ok[m->root[t]] = false;
    /* copies (reshape, allreduce, tp_copy) and the TP collectives move bytes:
     * both sides share one storage type */
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < g->ops.n; i++) {
            const Op *op = &g->ops.v[i];
            bool moves = op->code == OP_RESHAPE || op->code == OP_ALLREDUCE ||
                         ir_opinfo[op->code].attr == AK_TP;
            if (op->group >= 0 || !moves)
                continue;
            int a = m->root[op->in[0]], c = m->root[op->out];
            if (ok[a] != ok[c]) {
                ok[a] = ok[c] = false;
                changed = true;
            }
        }
        /* an attention op's q, k, v, dO and result share one storage type
         * (its kernels take one element type; lse and delta are f32) */
        for (int i = 0; i < g->ops.n; i++) {
            const Op *op = &g->ops.v[i];
            if (ir_opinfo[op->code].cls != OC_ATTN || op->code == OP_ATTENTION_LSE)
                continue;
            int ts[5], n = 0; /* q, k, v, dO (the first four inputs), the result */
            for (int j = 0; j < op->nin && j < 4; j++)
                ts[n++] = op->in[j];
            ts[n++] = op->out;
            bool all = true;
            for (int j = 0; j < n; j++)
                all &= ok[m->root[ts[j]]] && elig[ts[j]];
            for (int j = 0; j < n && !all; j++)
                if (ok[m->root[ts[j]]]) {
                    ok[m->root[ts[j]]] = false;
                    changed = true;
                }
        }
    }
    bool *res = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int t = 0; t < nt; t++)
        res[t] = ok[m->root[t]] && elig[t];
    free(ok);
    free(elig);
    free(fixed);
    return res;
}

DType *cg_cuda_storage(const Graph *g, const MemPlan *m, bool bf16)
{
    DType *st = xmalloc(sizeof(DType) * (size_t)(g->t.n + 1));
    bool *half = bf16 ? bf16_storage(g, m) : NULL;
    for (int t = 0; t < g->t.n; t++)
        st[t] = half && half[t] ? DT_BF16 : g->t.v[t].s.dtype;
    free(half);
    return st;
}

/* The device arena (CgCudaProgram.mem) and the copy steps in its terms.
 * Persistent storages are never bf16, so the persistent region (params,
 * state, inputs) is laid out identically in both plans. */
static void device_arena(const CgPlan *p, CgCudaProgram *q, bool resized)
{
    const Graph *g = p->g;
    q->plan = p;
    q->mem = p->mem;
    if (resized) {
        Diag d = {0};
        q->mem = pass_memplan_storage(g, q->storage, &d);
        if (q->mem->persistent_bytes != p->mem->persistent_bytes)
            die("cuda program: the persistent region changed size in the bf16 arena (%lld, "
                "was %lld)",
                (long long)q->mem->persistent_bytes, (long long)p->mem->persistent_bytes);
    }
    q->outs = xcalloc((size_t)g->outs.n + 1, sizeof(CgCudaCopy));
    for (int i = 0; i < g->outs.n; i++) {
        int t = g->outs.v[i].t;
        q->outs[q->nouts++] = (CgCudaCopy){.dst = q->mem->offset[t], .src = p->mem->offset[t],
                                           .bytes = p->mem->bytes[t]};
        if (q->mem->bytes[t] != p->mem->bytes[t])
            die("cuda program: graph output %s stored as bf16", g->outs.v[i].name);
    }
    q->copy = xcalloc((size_t)p->steps.n + 1, sizeof(CgCudaCopy));
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        if (st->kind != CG_STEP_COPY)
            continue;
        int dst = -1, src = -1;
        if (st->op >= 0) {
            dst = g->ops.v[st->op].out;
            src = g->ops.v[st->op].in[0];
        } else { /* an update copy: the update whose target is at st->dst */
            for (int u = 0; u < g->upd.n && dst < 0; u++)
                if (p->mem->offset[g->upd.v[u].target] == st->dst &&
                    p->mem->offset[g->upd.v[u].value] == st->src) {
                    dst = g->upd.v[u].target;
                    src = g->upd.v[u].value;
                }
            if (dst < 0)
                die("cuda program: copy step %d matches no update", s);
        }
        q->copy[s].dst = q->mem->offset[dst];
        q->copy[s].src = q->mem->offset[src];
        q->copy[s].bytes = q->mem->bytes[dst];
        if (q->mem->bytes[src] != q->copy[s].bytes)
            die("cuda program: copy step %d between %lld and %lld bytes", s,
                (long long)q->mem->bytes[src], (long long)q->copy[s].bytes);
    }
}

/* The epilogue GEMM step s applies on the device, before pairing (see
 * cg_cuda_program). */
static CgEpilogue device_epilogue(const CgPlan *p, const CgCudaProgram *q, int s)
{
    const CgGemm *m = &p->steps.v[s].gemm;
    CgEpilogue e = m->epilogue;
    if (e == CG_EPI_NONE)
        return e;
    DType dt = q->storage[m->d >= 0 ? m->d : m->c];
    int same[] = {m->c, m->d, m->aux};
    for (int i = 0; i < 3; i++)
        if (same[i] >= 0 && q->storage[same[i]] != dt)
            return CG_EPI_NONE;
    if ((dt != DT_F32 && dt != DT_BF16) || (m->bias >= 0 && q->storage[m->bias] != DT_F32) ||
        (m->aux >= 0 && m->ldc % 8 != 0))
        return CG_EPI_NONE;
    if (cg_epilogue_has_bgrad(e) && (dt != DT_F32 || q->storage[m->bgrad] != DT_F32)) {
        if (e != CG_EPI_DGELU_BGRAD)
            return CG_EPI_NONE;
        e = CG_EPI_DGELU;
    }
    if (q->mem != p->mem && !cg_epilogue_safe(p, q->mem, s, cg_epilogue_has_bgrad(e)))
        return CG_EPI_NONE;
    return e;
}

static void device_epilogues(const CgPlan *p, CgCudaProgram *q)
{
    q->epi = xcalloc((size_t)p->steps.n + 1, sizeof(CgEpilogue));
    for (int s = 0; s < p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_GEMM)
            q->epi[s] = device_epilogue(p, q, s);
    cg_cuda_pair_epilogues(p, q->epi);
}

typedef struct {
    int kernel;
    DType *st; /* per param */
    int *cls;  /* per param: buffer class (CgCudaAlias) */
    bool all;
    bool *a16; /* per param: buffer 16-byte aligned in the device arena */
    int fn0, nfn; /* its functions: q->fn.v[fn0 .. fn0 + nfn) */
    int range;    /* a flat kernel's range function in q->fn (after the others), -1 */
} Variant;

/* The buffer classes of step st's params (CgCudaAlias). */
static bool alias_classes(const MemPlan *m, const CgStep *st, int n, int *cls)
{
    bool all = false;
    for (int i = 0; i < n; i++) {
        int64_t a0 = m->offset[st->args[i]], a1 = a0 + m->bytes[st->args[i]];
        cls[i] = i;
        for (int j = 0; j < i; j++) {
            int64_t b0 = m->offset[st->args[j]], b1 = b0 + m->bytes[st->args[j]];
            if (a0 == b0 && a1 == b1) {
                cls[i] = cls[j];
                break;
            }
            if (a0 < b1 && b0 < a1 && a1 > a0 && b1 > b0)
                all = true;
        }
    }
    return all;
}

CgCudaProgram *cg_cuda_program(const CgPlan *p, bool bf16)
{
    const Graph *g = p->g;
    CgCudaProgram *q = xcalloc(1, sizeof *q);
    q->bf16 = bf16;
    q->storage = cg_cuda_storage(g, p->mem, bf16);
    bool any = false;
    for (int t = 0; t < g->t.n; t++)
        any |= q->storage[t] != g->t.v[t].s.dtype;
    device_arena(p, q, any);
    device_epilogues(p, q);
    q->step_fn = xmalloc(sizeof(int) * (size_t)(p->steps.n + 1));
    q->step_nfn = xcalloc((size_t)p->steps.n + 1, sizeof(int));
    q->step_range = xmalloc(sizeof(int) * (size_t)(p->steps.n + 1));
    CgBuf b = {0};
    cg_puts(&b, cg_cuda_prelude);
    if (bf16) {
        cg_puts(&b, cg_cuda_cast_kernel);
        cg_puts(&b, cg_cuda_cast_multi_kernel);
    }
    for (int i = 0; i < p->kernels.n; i++)
        if (p->kernels.v[i]->attn.kind != CG_ATTN_NONE) {
            cg_puts(&b, cg_cuda_attn_lib); /* the attention kernels' templates */
            cg_puts(&b, cg_cuda_attn_bwd_lib);
            break;
        }
    VEC(Variant) var = {0};
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        q->step_fn[s] = -1;
        q->step_range[s] = -1;
        if (st->kind != CG_STEP_KERNEL)
            continue;
        const CgKernel *k = p->kernels.v[st->kernel];
        DType *sd = xmalloc(sizeof(DType) * (size_t)(k->params.n + 1));
        for (int i = 0; i < k->params.n; i++)
            sd[i] = q->storage[st->args[i]] == DT_BF16 ? DT_BF16 : k->params.v[i].dt;
        int *cls = xmalloc(sizeof(int) * (size_t)(k->params.n + 1));
        bool all = alias_classes(q->mem, st, k->params.n, cls);
        /* the arena itself is at least 256-byte aligned (cuMemAlloc) */
        bool *a16 = xmalloc(sizeof(bool) * (size_t)(k->params.n + 1));
        for (int i = 0; i < k->params.n; i++)
            a16[i] = q->mem->offset[st->args[i]] % 16 == 0;
        int found = -1, nv = 0;
        for (int v = 0; v < var.n && found < 0; v++) {
            if (var.v[v].kernel != st->kernel)
                continue;
            nv++;
            if (memcmp(var.v[v].st, sd, sizeof(DType) * (size_t)k->params.n) == 0 &&
                memcmp(var.v[v].cls, cls, sizeof(int) * (size_t)k->params.n) == 0 &&
                memcmp(var.v[v].a16, a16, sizeof(bool) * (size_t)k->params.n) == 0 &&
                var.v[v].all == all)
                found = v;
        }
        if (found < 0) {
            char *name = nv ? xasprintf("%s_v%d", k->name, nv) : xstrdup(k->name);
            Variant nvar = {st->kernel, sd, cls, all, a16, q->fn.n, 0, -1};
            CgCudaAlias al = {cls, all, a16};
            CgCudaFn *fns = NULL;
            nvar.nfn = cg_print_cuda_variant(&b, k, name, sd, &al, &fns);
            for (int i = 0; i < nvar.nfn; i++) {
                fns[i].kernel = st->kernel;
                if (fns[i].part_bytes > q->part_bytes)
                    q->part_bytes = fns[i].part_bytes;
                vec_push(&q->fn, fns[i]);
            }
            free(fns);
            CgCudaFn rf; /* zero=1's update in pieces (runtime/pieces.c) */
            if (k->flat > 0 && cg_print_cuda_range(&b, k, name, sd, &al, &rf)) {
                rf.kernel = st->kernel;
                nvar.range = q->fn.n;
                vec_push(&q->fn, rf);
            }
            free(name);
            vec_push(&var, nvar);
            found = var.n - 1;
        } else {
            free(sd);
            free(cls);
            free(a16);
        }
        q->step_fn[s] = var.v[found].fn0;
        q->step_nfn[s] = var.v[found].nfn;
        q->step_range[s] = var.v[found].range;
    }
    for (int v = 0; v < var.n; v++) {
        free(var.v[v].st);
        free(var.v[v].cls);
        free(var.v[v].a16);
    }
    vec_free(&var);
    q->source = b.s ? b.s : xstrdup("");
    cg_cuda_casts(q);
    return q;
}

void cg_cuda_program_free(CgCudaProgram *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->fn.n; i++) {
        free(q->fn.v[i].name);
        free(q->fn.v[i].param);
        free(q->fn.v[i].cached);
        free(q->fn.v[i].cache_words);
    }
    vec_free(&q->fn);
    free(q->step_fn);
    free(q->step_nfn);
    free(q->step_range);
    free(q->storage);
    free(q->source);
    free(q->copy);
    free(q->outs);
    free(q->epi);
    free(q->cast_off);
    free(q->cast_group);
    free(q->cast_first);
    free(q->cast_t);
    free(q->cast_slot);
    if (q->mem != q->plan->mem)
        pass_memplan_free(q->mem);
    free(q);
}
