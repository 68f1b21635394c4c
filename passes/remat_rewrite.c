/* remat_rewrite.c - applies a remat solution to the graph: one clone per
 * recomputed activation and group (flagged OPF_RECOMPUTE, its operands
 * redirected to the group's other clones), placed depth-first just before
 * the first backward op that needs it; backward reads of a recomputed
 * activation redirected to its group's clone; forward ops left without
 * uses dropped. The graph stays in a valid program order (ir_reorder_ops)
 * and is compacted. */
#include "remat_internal.h"

#include <stdlib.h>
#include <string.h>

/* Inserts the clones of every group (flagged OPF_RECOMPUTE) just before the
 * first backward op that needs them, redirects each backward read of a
 * recomputed activation to its group's clone, drops forward ops left
 * without uses, and compacts. */
void pass_remat_apply(Graph *g, const Prob *P, const Sol *s)
{
    int n0 = g->ops.n, nt0 = g->t.n, nv = P->nv, G = P->ngroups;
    int *clone = xmalloc(sizeof(int) * (size_t)(nt0 + 1) * (size_t)G); /* [g * nt0 + t] */
    for (int i = 0; i < nt0 * G; i++)
        clone[i] = -1;
    int nclone = 0;
    for (int grp = 0; grp < G; grp++) {
        int *cl = clone + (size_t)grp * (size_t)nt0;
        for (int v = 0; v < nv; v++) { /* activations are in program order */
            if (!s->r[grp * nv + v])
                continue;
            int t = P->vt[v];
            const Op orig = g->ops.v[g->t.v[t].op];
            int in[16], *inp = orig.nin <= 16 ? in : xmalloc(sizeof(int) * (size_t)orig.nin);
            for (int j = 0; j < orig.nin; j++)
                inp[j] = orig.in[j] < nt0 && cl[orig.in[j]] >= 0 ? cl[orig.in[j]] : orig.in[j];
            int c = ir_op_x(g, orig.code, inp, orig.nin, &orig.attr, orig.loc);
            if (inp != in)
                free(inp);
            Op *cop = &g->ops.v[g->t.v[c].op];
            cop->flags = orig.flags | OPF_RECOMPUTE;
            g->t.v[c].kind = g->t.v[t].kind;
            cl[t] = c;
            nclone++;
        }
    }
    if (!nclone) {
        free(clone);
        return;
    }
    for (int i = 0; i < n0; i++) {
        Op *op = &g->ops.v[i];
        if (pass_remat_is_fwd(op))
            continue;
        for (int j = 0; j < op->nin; j++) {
            int v = P->var[op->in[j]];
            if (v >= 0 && P->saved[v] && clone[P->grp[v] * nt0 + op->in[j]] >= 0)
                op->in[j] = clone[P->grp[v] * nt0 + op->in[j]];
        }
    }
    /* new order: clones emitted depth-first before their first reader */
    int n = g->ops.n;
    int *order = xmalloc(sizeof(int) * (size_t)(n + 1));
    bool *done = xcalloc((size_t)n + 1, sizeof(bool));
    int *stack = xmalloc(sizeof(int) * (size_t)(n + 1));
    int no = 0;
    for (int i = 0; i < n0; i++) {
        const Op *op = &g->ops.v[i];
        if (!pass_remat_is_fwd(op)) {
            for (int j = 0; j < op->nin; j++) {
                int p = g->t.v[op->in[j]].op;
                if (p < n0 || done[p])
                    continue;
                int sp = 0;
                stack[sp++] = p;
                while (sp) {
                    int c = stack[sp - 1];
                    if (done[c]) {
                        sp--;
                        continue;
                    }
                    const Op *cop = &g->ops.v[c];
                    bool ready = true;
                    for (int k = 0; k < cop->nin; k++) {
                        int q = g->t.v[cop->in[k]].op;
                        if (q >= n0 && !done[q]) {
                            stack[sp++] = q;
                            ready = false;
                            break;
                        }
                    }
                    if (!ready)
                        continue;
                    sp--;
                    done[c] = true;
                    order[no++] = c;
                }
            }
        }
        done[i] = true;
        order[no++] = i;
    }
    if (no != n)
        die("remat: %d of %d ops placed", no, n);
    /* dead forward ops (their only readers were backward ops) */
    int *uses = ir_use_counts(g);
    bool *dead = xcalloc((size_t)n + 1, sizeof(bool));
    for (int k = n - 1; k >= 0; k--) {
        int i = order[k];
        Op *op = &g->ops.v[i];
        if (uses[op->out] == 0 && ir_opinfo[op->code].cls != OC_COLLECTIVE) {
            dead[i] = true;
            for (int j = 0; j < op->nin; j++)
                uses[op->in[j]]--;
        }
    }
    int m = 0;
    for (int k = 0; k < n; k++)
        if (!dead[order[k]])
            order[m++] = order[k];
    ir_reorder_ops(g, order, m); /* drops the dead ones */
    free(uses);
    free(dead);
    free(order);
    free(done);
    free(stack);
    free(clone);
    ir_compact(g);
}
