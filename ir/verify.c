/* verify.c - the IR's invariants, checked between passes.
 *
 * A valid graph: tensor ids equal their index; each tensor is defined exactly
 * once (graph inputs: op == -1 and kind input/param/state, with a name; op
 * results: t.op is the index of the one op whose `out` it is); operands are
 * defined before use in program order; result types and attributes agree
 * with ir_infer; const ops produce const tensors and other ops temp ones;
 * outputs and updates name existing tensors; each update target is a
 * param/state tensor of the same type as its value, updated at most once;
 * every tensor within ir_shape_check's limits.
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

/* Writes "op I OPCODE (file:line): <msg>" into err. */
static bool op_fail(const Graph *g, int i, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static bool op_fail(const Graph *g, int i, char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return false;
    const Op *op = &g->ops.v[i];
    const char *name = (unsigned)op->code < OP__COUNT ? ir_opinfo[op->code].name : "?";
    int k;
    if (op->loc.file)
        k = snprintf(err, errlen, "op %d %s (%s:%d): ", i, name, op->loc.file, op->loc.line);
    else
        k = snprintf(err, errlen, "op %d %s: ", i, name);
    if (k < 0 || (size_t)k >= errlen)
        return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return false;
}

#define FAIL(...)                                    \
    do {                                             \
        if (err && errlen)                           \
            snprintf(err, errlen, __VA_ARGS__);      \
        ok = false;                                  \
        goto done;                                   \
    } while (0)

#define OPFAIL(...)                                          \
    do {                                                     \
        op_fail(g, i, err, errlen, __VA_ARGS__);             \
        ok = false;                                          \
        goto done;                                           \
    } while (0)

/* Output indices by name, then index; unnamed ones first. ctx: the Graph. */
static int cmp_out_name(const void *a, const void *b, void *ctx)
{
    const Graph *g = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    const char *nx = g->outs.v[x].name, *ny = g->outs.v[y].name;
    int c = !nx || !ny ? (nx != NULL) - (ny != NULL) : strcmp(nx, ny);
    return c ? c : (x > y) - (x < y);
}

/* The lowest index k of a named output whose name an output before it has,
 * or -1: sorted by name, in O(outputs log outputs). */
static int first_repeat(const Graph *g)
{
    int n = g->outs.n, dup = -1;
    int *ix = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int k = 0; k < n; k++)
        ix[k] = k;
    qsort_r(ix, (size_t)n, sizeof(int), cmp_out_name, (void *)g);
    for (int k = 1; k < n; k++) {
        const char *a = g->outs.v[ix[k - 1]].name, *b = g->outs.v[ix[k]].name;
        if (a && b && strcmp(a, b) == 0 && (dup < 0 || ix[k] < dup))
            dup = ix[k];
    }
    free(ix);
    return dup;
}

bool ir_verify(const Graph *g, char *err, size_t errlen)
{
    int nt = g->t.n;
    bool ok = true;
    bool *defined = xcalloc((size_t)(nt ? nt : 1), sizeof(bool));
    bool *updated = xcalloc((size_t)(nt ? nt : 1), sizeof(bool));
    char b0[160], b1[160];

    /* tensors: ids, definitions, kinds */
    for (int t = 0; t < nt; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->id != t)
            FAIL("tensor %d has id %d (expected its index %d)", t, x->id, t);
        if (x->s.rank < 0 || x->s.rank > IR_MAX_RANK || (unsigned)x->s.dtype >= DT__COUNT)
            FAIL("tensor %%%d has a bad type (rank %d, dtype %d)", t, x->s.rank,
                 (int)x->s.dtype);
        char serr[400];
        if (!ir_shape_check(g, &x->s, serr, sizeof serr))
            FAIL("tensor %%%d: %s", t, serr);
        if (x->op == -1) {
            if (x->kind != TK_INPUT && x->kind != TK_PARAM && x->kind != TK_STATE)
                FAIL("tensor %%%d has no producing op but kind %s (expected input, param "
                     "or state)",
                     t, ir_kind_name(x->kind));
            if (!x->name)
                FAIL("graph input %%%d (%s) has no name", t, ir_kind_name(x->kind));
            defined[t] = true;
        } else if (x->op < 0 || x->op >= g->ops.n) {
            FAIL("tensor %%%d names producing op %d (expected -1 or 0..%d)", t, x->op,
                 g->ops.n - 1);
        }
    }

    /* ops in program order */
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if ((unsigned)op->code >= OP__COUNT) {
            if (err && errlen)
                snprintf(err, errlen, "op %d: unknown opcode %d", i, (int)op->code);
            ok = false;
            goto done;
        }
        const OpInfo *info = &ir_opinfo[op->code];
        if (op->nin < 0 || (op->nin > 0 && !op->in))
            OPFAIL("bad operand list (%d operands)", op->nin);
        for (int j = 0; j < op->nin; j++) {
            int a = op->in[j];
            if (a < 0 || a >= nt)
                OPFAIL("operand %d is not a tensor (expected %%0..%%%d, got %%%d)", j, nt - 1,
                       a);
            if (!defined[a])
                OPFAIL("operand %d (%%%d) is used before it is defined%s", j, a,
                       g->t.v[a].op > i ? " (its op comes later in program order)" : "");
        }
        if (op->out < 0 || op->out >= nt)
            OPFAIL("result is not a tensor (expected %%0..%%%d, got %%%d)", nt - 1, op->out);
        const Tensor *r = &g->t.v[op->out];
        if (r->op == -1)
            OPFAIL("result %%%d is defined more than once (it is the graph input %s \"%s\")",
                   op->out, ir_kind_name(r->kind), r->name ? r->name : "?");
        if (r->op != i && g->ops.v[r->op].out == op->out)
            OPFAIL("result %%%d is defined more than once (also by op %d %s)", op->out, r->op,
                   (unsigned)g->ops.v[r->op].code < OP__COUNT
                       ? ir_opinfo[g->ops.v[r->op].code].name
                       : "?");
        if (r->op != i)
            OPFAIL("result %%%d names op %d as its producer (expected %d)", op->out, r->op, i);
        if (defined[op->out])
            OPFAIL("result %%%d is defined more than once", op->out);
        TensorKind want = op->code == OP_CONST ? TK_CONST : TK_TEMP;
        if (r->kind != want)
            OPFAIL("result %%%d has kind %s (expected %s)", op->out, ir_kind_name(r->kind),
                   ir_kind_name(want));
        if (op->group < -1)
            OPFAIL("bad fuse group %d (expected -1 or >= 0)", op->group);
        Shape s;
        char ierr[512];
        if (!ir_infer(g, op->code, op->in, op->nin, &op->attr, &s, ierr, sizeof ierr))
            OPFAIL("%s", ierr);
        if (!shape_eq(&s, &r->s))
            OPFAIL("result %%%d has type %s, but %s gives %s (expected %s, got %s)", op->out,
                   shape_str(g, &r->s, b0, sizeof b0), info->name,
                   shape_str(g, &s, b1, sizeof b1), b1, b0);
        defined[op->out] = true;
    }

    for (int t = 0; t < nt; t++)
        if (!defined[t])
            FAIL("tensor %%%d names op %d as its producer, but that op defines %%%d", t,
                 g->t.v[t].op, g->ops.v[g->t.v[t].op].out);

    int dup = first_repeat(g); /* the first output named like an earlier one */
    for (int k = 0; k < g->outs.n; k++) {
        const GraphOutput *o = &g->outs.v[k];
        if (o->t < 0 || o->t >= nt || !defined[o->t])
            FAIL("output \"%s\" refers to %%%d, which is not a defined tensor",
                 o->name ? o->name : "?", o->t);
        if (k == dup)
            FAIL("output \"%s\" is declared twice", o->name);
    }
    for (int k = 0; k < g->upd.n; k++) {
        const GraphUpdate *u = &g->upd.v[k];
        if (u->target < 0 || u->target >= nt || !defined[u->target])
            FAIL("update %d: target %%%d is not a defined tensor", k, u->target);
        if (u->value < 0 || u->value >= nt || !defined[u->value])
            FAIL("update %d: value %%%d is not a defined tensor", k, u->value);
        const Tensor *tg = &g->t.v[u->target], *v = &g->t.v[u->value];
        if (tg->kind != TK_PARAM && tg->kind != TK_STATE)
            FAIL("update %d: target %%%d has kind %s (expected param or state)", k, u->target,
                 ir_kind_name(tg->kind));
        if (!shape_eq(&tg->s, &v->s))
            FAIL("update %d: value %%%d has a different type than target %%%d \"%s\" "
                 "(expected %s, got %s)",
                 k, u->value, u->target, tg->name ? tg->name : "?",
                 shape_str(g, &tg->s, b0, sizeof b0), shape_str(g, &v->s, b1, sizeof b1));
        if (updated[u->target])
            FAIL("update %d: target %%%d \"%s\" is updated twice", k, u->target,
                 tg->name ? tg->name : "?");
        updated[u->target] = true;
    }

done:
    free(defined);
    free(updated);
    return ok;
}
