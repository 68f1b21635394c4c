/* tp.c - whole tensors under tensor parallelism: a rank holds its part of
 * each split param (and of the param's optimizer state, IrShard); files
 * hold whole tensors, the same safetensors as one rank writes, so any
 * layout resumes any other. rt_tp_whole gathers the parts over the TP group
 * into a view with whole shapes; rt_tp_split takes this rank's part of
 * whole values read from a file. */
#include "dist.h"

#include <stdlib.h>
#include <string.h>

struct RtTpWhole {
    const Graph *of;  /* the graph the view was built for */
    Graph *g;         /* its tensors with whole shapes (graph inputs only) */
    void **vals;      /* per tensor of g: whole buffers (split ones owned) */
    bool *owned;
    float *stage;
    int64_t cap;
};

static bool split(const Tensor *t) { return t->shard.on && t->shard.n > 1; }

bool rt_tp_any(const Graph *g)
{
    for (int i = 0; i < g->t.n; i++)
        if (split(&g->t.v[i]))
            return true;
    return false;
}

static void whole_close(RtTpWhole *w)
{
    if (!w->g)
        return;
    for (int i = 0; i < w->g->t.n; i++)
        if (w->owned[i])
            free(w->vals[i]);
    free(w->vals);
    free(w->owned);
    ir_free(w->g);
    w->g = NULL;
}

/* The view of g: the same graph inputs, split ones at their whole shape. */
static void whole_build(RtTpWhole *w, const Graph *g)
{
    whole_close(w);
    w->of = g;
    w->g = ir_new();
    for (int i = 0; i < g->syms.n; i++)
        ir_add_sym(w->g, g->syms.v[i].name, g->syms.v[i].value);
    w->vals = xcalloc((size_t)g->t.n + 1, sizeof *w->vals);
    w->owned = xcalloc((size_t)g->t.n + 1, sizeof *w->owned);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        /* every tensor keeps its id: temporaries become unused inputs */
        Shape s = split(t) ? ir_shard_whole(&t->shard, &t->s) : t->s;
        int id = ir_add_input(w->g, t->op >= 0 ? TK_INPUT : t->kind,
                              t->name ? t->name : intern("?"), s, t->init);
        if (id != i)
            die("rt_tp_whole: tensor %d became %d", i, id);
        w->g->t.v[id].shard = t->shard;
        w->g->t.v[id].shard.n = 0; /* whole */
        w->g->t.v[id].shard.rank = 0;
        if (split(t)) {
            w->vals[i] = xcalloc(1, (size_t)shape_bytes(&s) + 1);
            w->owned[i] = true;
        }
    }
    /* only the graph inputs g's own readers know by name */
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].op >= 0)
            w->g->t.v[i].name = NULL;
}

RtTpWhole *rt_tp_whole_new(void) { return xcalloc(1, sizeof(RtTpWhole)); }

void rt_tp_whole_free(RtTpWhole *w)
{
    if (!w)
        return;
    whole_close(w);
    free(w->stage);
    free(w);
}

const Graph *rt_tp_whole(RtTpWhole *w, RtComm *c, const Graph *g, void *const *vals,
                         void ***whole_vals)
{
    if (w->of != g || !w->g)
        whole_build(w, g);
    int n = rt_comm_tp(c);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (!split(t)) {
            w->vals[i] = vals[i];
            continue;
        }
        if (t->shard.n != n)
            die("rt_tp_whole: %s is split over %d ranks, the TP group has %d", t->name,
                t->shard.n, n);
        if (t->s.dtype != DT_F32)
            die("rt_tp_whole: %s is %s (TP runs f32)", t->name, dtype_name(t->s.dtype));
        int64_t k = shape_numel(&t->s);
        if ((int64_t)n * k > w->cap) {
            free(w->stage);
            w->cap = (int64_t)n * k;
            w->stage = xmalloc(sizeof(float) * (size_t)w->cap);
        }
        /* every rank's part side by side, then each into its place */
        rt_comm_tp_all_gather(c, vals[i], 1, k, w->stage);
        const Shape *ws = &w->g->t.v[i].s;
        for (int r = 0; r < n; r++) {
            IrShard sh = t->shard;
            sh.rank = r;
            ir_shard_insert(&sh, ws, 4, w->stage + (int64_t)r * k, w->vals[i]);
        }
    }
    *whole_vals = w->vals;
    return w->g;
}

const Graph *rt_tp_whole_view(RtTpWhole *w, const Graph *g, void *const *vals,
                              void ***whole_vals)
{
    if (w->of != g || !w->g)
        whole_build(w, g);
    for (int i = 0; i < g->t.n; i++)
        if (!split(&g->t.v[i]))
            w->vals[i] = vals[i];
    *whole_vals = w->vals;
    return w->g;
}

void rt_tp_split(RtTpWhole *w, const Graph *g, void **vals)
{
    if (w->of != g || !w->g)
        die("rt_tp_split: no view of this graph (rt_tp_whole_view first)");
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (split(t))
            ir_shard_extract(&t->shard, &w->g->t.v[i].s, (size_t)dtype_size(t->s.dtype),
                             w->vals[i], vals[i]);
    }
}
