/* pp_whole.c - the pipeline's whole tensors (dist.h, rt_pp_whole,
 * rt_pp_ckpt_whole, rt_pp_params_view/take): every stage's params (and,
 * for checkpoints, optimizer state) gathered into one rank's layout for
 * weights files and checkpoints, and whole params given back to the
 * stages for --init-from. The pipeline's state: pp_internal.h. */
#include "pp_internal.h"

#include <stdlib.h>
#include <string.h>

/* The forward graph with whole params (tp: their whole shapes), for
 * weights files. */
static const Graph *whole_graph(RtPp *p)
{
    if (p->wg)
        return p->wg;
    p->wg = ir_clone(p->fwd);
    for (int i = 0; i < p->wg->t.n; i++) {
        Tensor *t = &p->wg->t.v[i];
        if (t->kind == TK_PARAM && t->shard.on && t->shard.n > 1) {
            t->s = ir_shard_whole(&t->shard, &t->s);
            t->shard.on = false;
        }
    }
    return p->wg;
}

const Graph *rt_pp_whole(RtPp *p, const Graph *tg, void *const *vals, void ***whole)
{
    /* stage 0 receives every param whose first owner is another stage */
    const Graph *g = whole_graph(p);
    void **w = p->s == 0 ? xcalloc((size_t)g->t.n + 1, sizeof(void *)) : NULL;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        int first = -1;
        for (int s = 0; s < p->n && first < 0; s++)
            if (pass_stage_owns(g, &p->cut, s, i))
                first = s;
        size_t nb = (size_t)shape_bytes(&t->s);
        if (p->s == 0) {
            w[i] = xmalloc(nb + 1);
            if (first == 0)
                memcpy(w[i], vals[ir_find_tensor(tg, t->name)], nb);
            else if (first > 0)
                rt_comm_pp_recv(p->comm, first, 32000, w[i], nb);
            else
                memset(w[i], 0, nb);
        } else if (first == p->s) {
            void *rq = rt_comm_pp_isend(p->comm, 0, 32000, vals[ir_find_tensor(tg, t->name)],
                                        nb);
            rt_comm_pp_wait(p->comm, rq);
        }
    }
    *whole = w;
    return p->s == 0 ? g : NULL;
}

void rt_pp_whole_free(const RtPp *p, void **whole)
{
    for (int i = 0; whole && i < p->fwd->t.n; i++)
        free(whole[i]);
    free(whole);
}

/* ---- checkpoints: whole tensors in one rank's layout --------------------- */

/* Every stage's params and state (not the accumulators) as one graph, the
 * same on every stage: each stage broadcasts its tensors' names and types
 * over the pipeline; the union keeps the first stage's copy of a name
 * (a tied param's, adam.step's), in stage order. */
static const Graph *ckpt_graph(RtPp *p, const Graph *tg)
{
    if (p->ug)
        return p->ug;
    p->ug = ir_new();
    VEC(int) hold = {0};
    for (int s = 0; s < p->n; s++) {
        VEC(char) blob = {0};
        if (s == p->s)
            for (int i = 0; i < tg->t.n; i++) {
                const Tensor *t = &tg->t.v[i];
                if ((t->kind != TK_PARAM && t->kind != TK_STATE) || t->op >= 0 ||
                    strncmp(t->name, "accum.", 6) == 0)
                    continue;
                int32_t hdr[3] = {t->kind, t->s.dtype, t->s.rank};
                for (const char *c = t->name; *c; c++)
                    vec_push(&blob, *c);
                vec_push(&blob, 0);
                for (size_t k = 0; k < sizeof hdr; k++)
                    vec_push(&blob, ((char *)hdr)[k]);
                for (int r = 0; r < t->s.rank; r++)
                    for (size_t k = 0; k < sizeof(int64_t); k++)
                        vec_push(&blob, ((char *)&t->s.dim[r])[k]);
            }
        int64_t len = blob.n;
        rt_comm_pp_bcast(p->comm, s, &len, sizeof len);
        char *b = s == p->s ? blob.v : xmalloc((size_t)len + 1);
        rt_comm_pp_bcast(p->comm, s, b, (size_t)len);
        for (int64_t at = 0; at < len;) {
            const char *name = b + at;
            at += (int64_t)strlen(name) + 1;
            int32_t hdr[3];
            memcpy(hdr, b + at, sizeof hdr);
            at += sizeof hdr;
            Shape sh = {.dtype = (DType)hdr[1], .rank = hdr[2]};
            for (int r = 0; r < sh.rank; r++, at += sizeof(int64_t))
                memcpy(&sh.dim[r], b + at, sizeof(int64_t));
            if (ir_find_tensor(p->ug, name) >= 0)
                continue;
            ir_add_input(p->ug, (TensorKind)hdr[0], intern(name), sh, (ParamInit){0});
            vec_push(&hold, s);
        }
        if (b != blob.v)
            free(b);
        vec_free(&blob);
    }
    p->uholder = hold.v;
    return p->ug;
}

const Graph *rt_pp_ckpt_whole(RtPp *p, const Graph *tg, void *const *vals, void ***whole)
{
    const Graph *g = ckpt_graph(p, tg);
    void **w = p->s == 0 ? xcalloc((size_t)g->t.n + 1, sizeof(void *)) : NULL;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        size_t nb = (size_t)shape_bytes(&t->s);
        int h = p->uholder[i];
        if (p->s == 0) {
            w[i] = xmalloc(nb + 1);
            if (h == 0)
                memcpy(w[i], vals[ir_find_tensor(tg, t->name)], nb);
            else
                rt_comm_pp_recv(p->comm, h, 32001, w[i], nb);
        } else if (h == p->s) {
            void *rq = rt_comm_pp_isend(p->comm, 0, 32001, vals[ir_find_tensor(tg, t->name)],
                                        nb);
            rt_comm_pp_wait(p->comm, rq);
        }
    }
    *whole = w;
    return p->s == 0 ? g : NULL;
}

bool rt_pp_ckpt_load(RtPp *p, const char *path, const Graph *tg, void **vals, CkptMeta *m,
                     Diag *d)
{
    const Graph *g = ckpt_graph(p, tg);
    void **w = xcalloc((size_t)g->t.n + 1, sizeof(void *));
    for (int i = 0; i < g->t.n; i++)
        w[i] = xcalloc(1, (size_t)shape_bytes(&g->t.v[i].s) + 1);
    bool ok = rt_ckpt_load(path, g, w, m, d);
    for (int i = 0; ok && i < g->t.n; i++) {
        int t = ir_find_tensor(tg, g->t.v[i].name);
        if (t >= 0)
            memcpy(vals[t], w[i], (size_t)shape_bytes(&g->t.v[i].s));
    }
    for (int i = 0; i < g->t.n; i++)
        free(w[i]);
    free(w);
    return ok;
}

void rt_pp_ckpt_free(const RtPp *p, void **whole)
{
    for (int i = 0; whole && p->ug && i < p->ug->t.n; i++)
        free(whole[i]);
    free(whole);
}

/* ---- --init-from: the model's params, whole ------------------------------- */

const Graph *rt_pp_params_view(RtPp *p, const Graph *tg, void *const *vals, void ***whole)
{
    const Graph *g = whole_graph(p);
    void **w = xcalloc((size_t)g->t.n + 1, sizeof(void *));
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        w[i] = xcalloc(1, (size_t)shape_bytes(&t->s) + 1);
        int own = ir_find_tensor(tg, t->name);
        if (own >= 0)
            memcpy(w[i], vals[own], (size_t)shape_bytes(&t->s));
    }
    *whole = w;
    return g;
}

void rt_pp_params_take(RtPp *p, const Graph *tg, void **vals, void **whole)
{
    if (!p || !whole)
        return;
    const Graph *g = p->wg;
    for (int i = 0; i < g->t.n; i++) {
        int own = whole[i] ? ir_find_tensor(tg, g->t.v[i].name) : -1;
        if (vals && own >= 0)
            memcpy(vals[own], whole[i], (size_t)shape_bytes(&g->t.v[i].s));
        free(whole[i]);
    }
    free(whole);
}
