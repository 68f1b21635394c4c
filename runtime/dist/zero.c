/* zero.c - checkpoints of a sharded step (zero=1, ZeRO-1): the unsharded
 * view of its optimizer state; and its full mean gradients, assembled from
 * the ranks' "grad.shard" outputs (rt_zero_grads).
 *
 * A sharded step holds its optimizer's moments as state f32[S], this
 * rank's shard of the flat order of all params (ir.h, AK_SHARD; the flat
 * order is the one its all_gather_wait ops name): AdamW's "adam.m" and
 * "adam.v", SGD's "sgd.buf" (with momentum), Lion's "lion.m" (KINDS). A
 * checkpoint holds what an unsharded step holds: every param, "adam.step"
 * (AdamW) and "KIND.P" ("adam.m.P", "sgd.buf.P", ...) shaped like each
 * param P, so a file written by N sharded ranks resumes on M ranks with or
 * without zero, and the reverse.
 * The full view is a graph of inputs only (the params, adam.step, and the
 * per-param moments): the checkpoint writer and reader take it as they take
 * a step graph. Invariant: its param and adam.step values are the step's own
 * buffers (borrowed), its moments are owned here. */
#include "dist.h"

#include <stdlib.h>
#include <string.h>

/* The sharded states, as passes/optimizer.c names them. */
static const char *const KINDS[] = {"adam.m", "adam.v", "sgd.buf", "lion.m"};
enum { NKINDS = 4 };

struct RtZero {
    const Graph *tg;
    int nk;              /* shard states tg holds */
    int st[NKINDS];      /* their tensor ids in tg */
    const char *kind[NKINDS]; /* their names */
    int64_t total, S;
    int nranks;
    int n;               /* params in flat order */
    int *param;          /* tg's tensor id, by flat position */
    int64_t *start;      /* flat start, by flat position */
    Graph *full;
    int *full_of;        /* per tg tensor: the full graph's id (-1) */
    int *fs[NKINDS];     /* full graph's KIND.P per state, by flat position */
    void **vals;         /* per full tensor */
};

typedef struct {
    int param;
    int64_t start;
} FlatPos;

static int cmp_start(const void *a, const void *b)
{
    const FlatPos *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

RtZero *rt_zero_open(const Graph *tg)
{
    RtZero *z = xcalloc(1, sizeof *z);
    for (int k = 0; k < NKINDS; k++) {
        int t = ir_find_tensor(tg, KINDS[k]);
        if (t >= 0 && tg->t.v[t].kind == TK_STATE) {
            z->st[z->nk] = t;
            z->kind[z->nk++] = KINDS[k];
        }
    }
    if (z->nk == 0) {
        free(z);
        return NULL;
    }
    z->tg = tg;
    z->S = shape_numel(&tg->t.v[z->st[0]].s);
    z->param = xmalloc(sizeof(int) * (size_t)(tg->t.n + 1));
    z->start = xmalloc(sizeof(int64_t) * (size_t)(tg->t.n + 1));
    FlatPos *pos = xmalloc(sizeof(FlatPos) * (size_t)(tg->ops.n + 1));
    for (int i = 0; i < tg->ops.n; i++) {
        const Op *op = &tg->ops.v[i];
        if (op->code != OP_ALL_GATHER_WAIT && op->code != OP_ALL_GATHER)
            continue;
        pos[z->n++] = (FlatPos){op->in[op->nin - 1], op->attr.ia[1]};
        z->total = op->attr.ia[2];
        z->nranks = (int)op->attr.ia[3];
    }
    qsort(pos, (size_t)z->n, sizeof *pos, cmp_start); /* flat order: by start */
    for (int k = 0; k < z->n; k++)
        z->param[k] = pos[k].param, z->start[k] = pos[k].start;
    free(pos);
    if (z->n == 0)
        die("rt_zero_open: the step has sharded state but no all_gather");
    /* the full view: params, model state and adam.step as in tg, then the
     * moments */
    z->full = ir_new();
    z->full_of = xmalloc(sizeof(int) * (size_t)(tg->t.n + 1));
    VEC(void *) vals = {0};
    for (int i = 0; i < tg->t.n; i++) {
        const Tensor *t = &tg->t.v[i];
        z->full_of[i] = -1;
        if (t->op >= 0 || !(t->kind == TK_PARAM || rt_model_state(t) ||
                            (t->kind == TK_STATE && t->name && strcmp(t->name, "adam.step") == 0)))
            continue;
        z->full_of[i] = ir_add_input(z->full, t->kind, t->name, t->s, t->init);
        z->full->t.v[z->full_of[i]].shard = t->shard;
        vec_push(&vals, NULL);
    }
    for (int w = 0; w < z->nk; w++)
        z->fs[w] = xmalloc(sizeof(int) * (size_t)z->n);
    for (int k = 0; k < z->n; k++) {
        const Tensor *p = &tg->t.v[z->param[k]];
        for (int w = 0; w < z->nk; w++) {
            char *nm = xasprintf("%s.%s", z->kind[w], p->name);
            int id = ir_add_input(z->full, TK_STATE, intern(nm), p->s,
                                  (ParamInit){INIT_ZEROS, 0, 0});
            z->full->t.v[id].shard = p->shard;
            free(nm);
            z->fs[w][k] = id;
            vec_push(&vals, xcalloc((size_t)shape_numel(&p->s) + 1, sizeof(float)));
        }
    }
    z->vals = vals.v;
    return z;
}

void rt_zero_close(RtZero *z)
{
    if (!z)
        return;
    for (int k = 0; k < z->n; k++)
        for (int w = 0; w < z->nk; w++)
            free(z->vals[z->fs[w][k]]);
    free(z->vals);
    ir_free(z->full);
    free(z->full_of);
    for (int w = 0; w < z->nk; w++)
        free(z->fs[w]);
    free(z->param);
    free(z->start);
    free(z);
}

int64_t rt_zero_host_bytes(const RtZero *z)
{
    int64_t n = 0;
    for (int k = 0; z && k < z->n; k++)
        n += (int64_t)z->nk * 4 * shape_numel(&z->tg->t.v[z->param[k]].s);
    return n;
}

const Graph *rt_zero_full(RtZero *z, void *const *vals, void ***full_vals)
{
    for (int i = 0; i < z->tg->t.n; i++)
        if (z->full_of[i] >= 0)
            z->vals[z->full_of[i]] = vals[i];
    *full_vals = z->vals;
    return z->full;
}

/* flat[0..total) <-> the full moments of flat order (dir 0: to flat) */
static void moments(RtZero *z, const int *ids, float *flat, int dir)
{
    for (int k = 0; k < z->n; k++) {
        int64_t n = shape_numel(&z->tg->t.v[z->param[k]].s);
        float *x = z->vals[ids[k]];
        if (dir == 0)
            memcpy(flat + z->start[k], x, sizeof(float) * (size_t)n);
        else
            memcpy(x, flat + z->start[k], sizeof(float) * (size_t)n);
    }
}

void rt_zero_gather(RtZero *z, RtComm *c, void *const *vals)
{
    int n = rt_comm_size(c);
    if (n != z->nranks)
        die("rt_zero_gather: the step is sharded over %d ranks, the run has %d", z->nranks, n);
    float *all = xmalloc(sizeof(float) * (size_t)(z->S * n + 1));
    float *flat = xmalloc(sizeof(float) * (size_t)(z->total + 1));
    for (int w = 0; w < z->nk; w++) {
        rt_comm_allgather(c, vals[z->st[w]], z->S, all);
        for (int r = 0; r < n; r++) {
            int64_t off, len;
            ir_shard_range(z->total, n, r, &off, &len);
            memcpy(flat + off, all + (int64_t)r * z->S, sizeof(float) * (size_t)len);
        }
        moments(z, z->fs[w], flat, 1);
    }
    free(all);
    free(flat);
}

void rt_zero_scatter(RtZero *z, int rank, void **vals)
{
    int64_t off, len;
    ir_shard_range(z->total, z->nranks, rank, &off, &len);
    float *flat = xmalloc(sizeof(float) * (size_t)(z->total + 1));
    for (int w = 0; w < z->nk; w++) {
        moments(z, z->fs[w], flat, 0);
        float *shard = vals[z->st[w]];
        memset(shard, 0, sizeof(float) * (size_t)z->S);
        memcpy(shard, flat + off, sizeof(float) * (size_t)len);
    }
    free(flat);
}

void rt_zero_grads(RtZero *z, RtComm *c, const float *shard, float *const *dst)
{
    int n = rt_comm_size(c);
    if (n != z->nranks)
        die("rt_zero_grads: the step is sharded over %d ranks, the run has %d", z->nranks, n);
    float *all = xmalloc(sizeof(float) * (size_t)(z->S * n + 1));
    rt_comm_allgather(c, shard, z->S, all);
    for (int k = 0; k < z->n; k++) {
        float *d = dst[z->param[k]];
        int64_t lo = z->start[k], hi = lo + shape_numel(&z->tg->t.v[z->param[k]].s);
        for (int r = 0; d && r < n; r++) {
            int64_t off, len;
            ir_shard_range(z->total, n, r, &off, &len);
            int64_t a = lo > off ? lo : off, b = hi < off + len ? hi : off + len;
            if (a < b)
                memcpy(d + (a - lo), all + (int64_t)r * z->S + (a - off),
                       sizeof(float) * (size_t)(b - a));
        }
    }
    free(all);
}
