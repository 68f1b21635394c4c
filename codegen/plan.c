/* plan.c - the Plan of a scheduled graph: one step per op in schedule order
 * (views cost nothing), then the copies of updates not computed in place.
 * Ops whose kernels print to the same body share one kernel. */
#include "codegen.h"

#include <stdlib.h>
#include <string.h>

int64_t cg_offset(const CgPlan *p, int tensor) { return p->mem->offset[tensor]; }

static bool overlap(const MemPlan *m, int a, int b)
{
    int64_t a0 = m->offset[a], a1 = a0 + m->bytes[a];
    int64_t b0 = m->offset[b], b1 = b0 + m->bytes[b];
    return a0 < b1 && b0 < a1;
}

static CgGemm plan_gemm(const Graph *g, const Op *op)
{
    const Shape *A = &g->t.v[op->in[0]].s, *B = &g->t.v[op->in[1]].s,
                *C = &g->t.v[op->out].s;
    CgGemm m = {.a = op->in[0], .b = op->in[1], .c = op->out};
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

CgPlan *cg_plan(const Graph *g, Diag *d)
{
    CgPlan *p = xcalloc(1, sizeof *p);
    p->g = g;
    p->mem = pass_memplan(g, d);
    p->arena_bytes = p->mem->arena_bytes;
    const MemPlan *m = p->mem;
    CgBuf src = {0};
    cg_puts(&src, cg_c_prelude);
    VEC(BodyEntry) seen = {0};

    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        CgStep st = {.op = i, .kernel = -1};
        if ((op->code == OP_RESHAPE || op->code == OP_ALLREDUCE) &&
            m->root[op->out] == m->root[op->in[0]])
            continue;
        if (op->code == OP_MATMUL) {
            if (g->t.v[op->out].s.dtype != DT_F32) {
                snprintf(d->msg, sizeof d->msg,
                         "%s:%d: matmul on %s is not supported by the CPU backend yet "
                         "(expected f32)",
                         op->loc.file ? op->loc.file : "?", op->loc.line,
                         dtype_name(g->t.v[op->out].s.dtype));
                goto fail;
            }
            st.kind = CG_STEP_GEMM;
            st.gemm = plan_gemm(g, op);
            st.name = intern("gemm");
            vec_push(&p->steps, st);
            continue;
        }
        if (op->code == OP_ALLREDUCE || op->code == OP_RESHAPE) {
            st.kind = CG_STEP_COPY;
            st.dst = m->offset[op->out];
            st.src = m->offset[op->in[0]];
            st.bytes = m->bytes[op->out];
            st.name = intern("copy");
            vec_push(&p->steps, st);
            continue;
        }
        CgKernel *k = xcalloc(1, sizeof *k);
        if (!cg_lower_op(g, i, k, d)) {
            cg_kernel_free(k);
            goto fail;
        }
        for (int a = 0; a < k->params.n; a++)
            for (int b = 0; b < k->params.n; b++)
                if (a != b && k->params.v[a].out &&
                    overlap(m, k->params.v[a].tensor, k->params.v[b].tensor))
                    k->noalias = false;
        char *full = k->name;
        k->name = xstrdup("KNAME");
        CgBuf body = {0};
        cg_print_c_kernel(&body, k);
        uint64_t h = hash_bytes(body.s, body.n, 0);
        int found = -1;
        for (int s = 0; s < seen.n && found < 0; s++)
            if (seen.v[s].h == h && strcmp(seen.v[s].body, body.s) == 0)
                found = seen.v[s].kernel;
        st.kind = CG_STEP_KERNEL;
        st.args = xmalloc(sizeof(int) * (size_t)(k->params.n + 1));
        for (int a = 0; a < k->params.n; a++)
            st.args[a] = k->params.v[a].tensor;
        if (found >= 0) {
            free(full);
            cg_kernel_free(k);
            st.kernel = found;
        } else {
            free(k->name);
            k->name = full;
            BodyEntry e = {h, body.s, p->kernels.n};
            body.s = NULL;
            vec_push(&seen, e);
            vec_push(&p->kernels, k);
            st.kernel = p->kernels.n - 1;
            cg_puts(&src, "\n");
            cg_print_c_kernel(&src, k);
        }
        free(body.s);
        st.name = intern(p->kernels.v[st.kernel]->name);
        vec_push(&p->steps, st);
    }
    /* update copies: one that reads a region goes before one that writes it */
    VEC(CgStep) cp = {0};
    for (int u = 0; u < g->upd.n; u++) {
        if (m->inplace[u])
            continue;
        int T = g->upd.v[u].target, V = g->upd.v[u].value;
        if (m->offset[T] == m->offset[V])
            continue;
        CgStep st = {.kind = CG_STEP_COPY, .op = -1, .kernel = -1, .update = true};
        st.dst = m->offset[T];
        st.src = m->offset[V];
        st.bytes = m->bytes[T];
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
    for (int s = 0; s < seen.n; s++)
        free(seen.v[s].body);
    vec_free(&seen);
    p->source = src.s ? src.s : xstrdup("");
    return p;
fail:
    for (int s = 0; s < seen.n; s++)
        free(seen.v[s].body);
    vec_free(&seen);
    free(src.s);
    cg_plan_free(p);
    return NULL;
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
