/* schedule.c - the final op order.
 *
 * Starts from program order (already topological) and sinks each op whose
 * result is larger than all its computed operands together to just before
 * its first consumer; ops
 * that only feed graph outputs or updates sink to the end. Sinking shortens
 * the result's live range and never lengthens a live range more than the op's
 * own result would have been live. O(n) over ops and operands. */
#include "passes.h"

#include <stdlib.h>

typedef struct {
    const Graph *g;
    int *order; /* emitted op indices */
    int norder;
    bool *emitted;
    bool *deferred;
    int *stack;
} Sched;

/* Emits op i after first emitting the deferred producers of its operands
 * (iteratively, so long deferred chains do not recurse). */
static void emit(Sched *s, int root)
{
    const Graph *g = s->g;
    int sp = 0;
    s->stack[sp++] = root;
    while (sp) {
        int i = s->stack[sp - 1];
        if (s->emitted[i]) {
            sp--;
            continue;
        }
        const Op *op = &g->ops.v[i];
        bool ready = true;
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            if (p >= 0 && !s->emitted[p]) {
                s->stack[sp++] = p; /* each op is pushed at most once per waiting consumer */
                ready = false;
                break;
            }
        }
        if (!ready)
            continue;
        sp--;
        s->emitted[i] = true;
        s->order[s->norder++] = i;
    }
}

bool pass_schedule(Graph *g, const PassOpts *o, Diag *d)
{
    (void)o;
    (void)d;
    int n = g->ops.n;
    if (n == 0)
        return true;
    Sched s = {g, xmalloc(sizeof(int) * (size_t)n), 0, xcalloc((size_t)n, sizeof(bool)),
               xcalloc((size_t)n, sizeof(bool)), xmalloc(sizeof(int) * (size_t)(n + 1))};
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        int64_t out = shape_numel(&g->t.v[op->out].s) * dtype_size(g->t.v[op->out].s.dtype);
        /* sinking can extend each operand's life: only worth it when the
         * result outweighs all of them */
        int64_t freed = 0;
        for (int j = 0; j < op->nin; j++) {
            const Tensor *x = &g->t.v[op->in[j]];
            if (x->op >= 0)
                freed += shape_numel(&x->s) * dtype_size(x->s.dtype);
        }
        s.deferred[i] = out > freed;
    }
    for (int i = 0; i < n; i++) {
        if (s.deferred[i])
            continue;
        emit(&s, i);
    }
    for (int i = 0; i < n; i++)
        if (!s.emitted[i])
            emit(&s, i);

    /* permute ops into the new order */
    Op *ops = xmalloc(sizeof(Op) * (size_t)n);
    for (int k = 0; k < n; k++)
        ops[k] = g->ops.v[s.order[k]];
    for (int k = 0; k < n; k++) {
        g->ops.v[k] = ops[k];
        g->t.v[ops[k].out].op = k;
    }
    free(ops);
    free(s.order);
    free(s.emitted);
    free(s.deferred);
    free(s.stack);
    ir_compact(g);
    return true;
}
