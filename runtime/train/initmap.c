/* initmap.c - --init-from with a rename map (--init-map, run by the CLI
 * through the frontend: an InitMap) and partial loading (--init-partial):
 * rt_init_from (train.h). The file's tensors are renamed and transposed as
 * the map says, matched to the model's params by name and shape, and the
 * result goes through checkpoint.c's restore (padded rows, finite values,
 * all or nothing) as one file holding every param: the matched tensors and,
 * for a param left at its init, a copy of its init. */
#include "train.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOTE_NAMES 16 /* names listed per kind before "... and N more" */

/* "MAP:LINE" of entry e (or "MAP" when the line is unknown) into buf. */
static const char *where(const InitMap *map, const InitMapEntry *e, char *buf, size_t n)
{
    if (e->line > 0)
        snprintf(buf, n, "%s:%d", map->path, e->line);
    else
        snprintf(buf, n, "%s", map->path);
    return buf;
}

/* The real rows of param t when pads name it (padded_rows), else -1. */
static int64_t real_rows(const Tensor *t, const ModelRowPad *pads, int npads)
{
    for (int i = 0; i < npads; i++)
        if (strcmp(pads[i].param, t->name) == 0)
            return pads[i].rows;
    return -1;
}

/* Whether file tensor s loads into t: the same dtype and shape, or t's real
 * rows of a padded param. */
static bool fits(const StTensor *s, const Tensor *t, const ModelRowPad *pads, int npads)
{
    if (s->dtype != t->s.dtype || s->rank != t->s.rank)
        return false;
    int64_t real = real_rows(t, pads, npads);
    for (int k = 0; k < s->rank; k++)
        if (s->dim[k] != t->s.dim[k] && !(k == 0 && real >= 0 && s->dim[0] == real))
            return false;
    return true;
}

/* Swaps the last two axes of s in place: [..., R, C] becomes [..., C, R]. */
static void transpose_last2(StTensor *s)
{
    int64_t rows = s->dim[s->rank - 2], cols = s->dim[s->rank - 1];
    size_t es = (size_t)dtype_size(s->dtype), mat = (size_t)(rows * cols) * es;
    if (!mat)
        goto dims;
    char *tmp = xmalloc(mat);
    for (size_t off = 0; off + mat <= s->nbytes; off += mat) {
        char *m = (char *)s->data + off;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                memcpy(tmp + (size_t)(c * rows + r) * es, m + (size_t)(r * cols + c) * es, es);
        memcpy(m, tmp, mat);
    }
    free(tmp);
dims:
    s->dim[s->rank - 2] = cols;
    s->dim[s->rank - 1] = rows;
}

/* The param of g named name, or NULL. */
static const Tensor *param_named(const Graph *g, const char *name)
{
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].kind == TK_PARAM && g->t.v[i].name && strcmp(g->t.v[i].name, name) == 0)
            return &g->t.v[i];
    return NULL;
}

/* A growing text. */
typedef struct {
    char *s;
    size_t n, cap;
} Text;

static void text_add(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(Text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if (t->n + (size_t)k + 1 > t->cap) {
        t->cap = (t->n + (size_t)k + 1) * 2;
        t->s = xrealloc(t->s, t->cap);
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    t->n += (size_t)k;
}

/* One listed name: the first NOTE_NAMES of a kind, then a count. */
static void list_item(Text *t, int *count, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void list_item(Text *t, int *count, const char *fmt, ...)
{
    if ((*count)++ >= NOTE_NAMES)
        return;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    text_add(t, "    %s\n", buf);
}

static void list_end(Text *t, int count)
{
    if (count > NOTE_NAMES)
        text_add(t, "    ... and %d more\n", count - NOTE_NAMES);
}

bool rt_init_from(const char *path, const Graph *g, const ModelRowPad *pads, int npads,
                  const InitMap *map, bool partial, void **vals, char **note, Diag *d)
{
    if (note)
        *note = NULL;
    if (!map && !partial)
        return rt_weights_import(path, g, pads, npads, vals, d);
    StFile f;
    if (!rt_st_read(path, &f, d))
        return false;
    bool ok = false;
    int n = f.n;
    const char **to = xcalloc((size_t)n + 1, sizeof *to); /* target per file tensor */
    int *taker = xcalloc((size_t)g->t.n + 1, sizeof *taker); /* file tensor + 1 per param */
    StTensor *out = xcalloc((size_t)g->t.n + 1, sizeof *out);
    void **copies = xcalloc((size_t)g->t.n + 1, sizeof *copies);
    Text t = {0};
    char w1[1100], w2[1100], s1[128], s2[128];
    if (map && map->n != n) {
        snprintf(d->msg, sizeof d->msg, "%s: the file changed while kiln read it (it held %d "
                 "tensors when %s ran, now %d)", path, map->n, map->path, n);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const InitMapEntry *e = map ? &map->v[i] : NULL;
        if (e && strcmp(e->from, f.t[i].name) != 0) {
            snprintf(d->msg, sizeof d->msg, "%s: the file changed while kiln read it (tensor %d "
                     "was \"%.200s\" when %s ran, now \"%.200s\")", path, i, e->from, map->path,
                     f.t[i].name);
            goto done;
        }
        to[i] = e ? e->to : f.t[i].name;
        if (e && e->to && e->line != 0 && !partial && !param_named(g, e->to)) {
            snprintf(d->msg, sizeof d->msg, "%s: \"%.200s\" maps to \"%.200s\", which is not a "
                     "param of the model (expected the name of one of its params, as `kiln "
                     "compile --dump-after=frontend` lists them; --init-partial ignores it)",
                     where(map, e, w1, sizeof w1), e->from, e->to);
            goto done;
        }
        if (e && e->transpose)
            transpose_last2(&f.t[i]);
    }
    /* each param: the one tensor mapped to it */
    for (int i = 0; i < n; i++) {
        const Tensor *p = to[i] ? param_named(g, to[i]) : NULL;
        if (!p)
            continue;
        int id = (int)(p - g->t.v);
        if (taker[id]) {
            int j = taker[id] - 1;
            const InitMapEntry *a = map ? &map->v[j] : NULL, *b = map ? &map->v[i] : NULL;
            snprintf(d->msg, sizeof d->msg, "%.400s: \"%.200s\" and \"%.200s\" both map to \"%.200s\" "
                     "(expected at most one tensor of %.300s per param; the other at %.400s)",
                     b ? where(map, b, w1, sizeof w1) : path, f.t[j].name, f.t[i].name, p->name,
                     path, a ? where(map, a, w2, sizeof w2) : path);
            goto done;
        }
        taker[id] = i + 1;
    }
    int loaded = 0, params = 0, left = 0, ignored = 0;
    Text lt = {0}, it = {0};
    StFile sf = {.t = out};
    for (int id = 0; id < g->t.n; id++) {
        const Tensor *p = &g->t.v[id];
        if (p->kind != TK_PARAM)
            continue;
        params++;
        const StTensor *s = taker[id] ? &f.t[taker[id] - 1] : NULL;
        const InitMapEntry *e = s && map ? &map->v[taker[id] - 1] : NULL;
        bool renamed = e && e->line != 0;
        if (s && !fits(s, p, pads, npads)) {
            Shape fs = shape_make(s->dtype, s->rank, s->dim);
            shape_str(NULL, &fs, s1, sizeof s1);
            shape_str(NULL, &p->s, s2, sizeof s2);
            if (!partial) {
                snprintf(d->msg, sizeof d->msg, "%s: tensor \"%.200s\"%s%.200s%s%s%s has the wrong "
                         "shape (the model's \"%.200s\" is %s, the file's %s%s; --init-partial "
                         "leaves it at its init)", path, s->name, renamed ? " (mapped to \"" : "",
                         renamed ? p->name : "", renamed ? "\" by " : "",
                         renamed ? where(map, e, w1, sizeof w1) : "", renamed ? ")" : "",
                         p->name, s2, s1, e && e->transpose ? " after its transpose" : "");
                goto free_lists;
            }
            list_item(&lt, &left, "%s %s (the file's \"%s\" is %s)", p->name, s2, s->name, s1);
            list_item(&it, &ignored, "%s %s (the model's \"%s\" is %s)", s->name, s1, p->name, s2);
            s = NULL;
        } else if (!s) {
            shape_str(NULL, &p->s, s2, sizeof s2);
            if (!partial) {
                snprintf(d->msg, sizeof d->msg, "%s: missing tensor \"%.200s\" (the model expects "
                         "%s, the file has none%s%s; --init-partial leaves it at its init)", path,
                         p->name, s2, map ? " under the map " : "", map ? map->path : "");
                goto free_lists;
            }
            list_item(&lt, &left, "%s %s (not in the file)", p->name, s2);
        }
        StTensor *o = &out[sf.n++];
        o->name = (char *)p->name;
        if (s) {
            loaded++;
            o->dtype = s->dtype;
            o->rank = s->rank;
            memcpy(o->dim, s->dim, sizeof o->dim);
            o->data = s->data;
            o->nbytes = s->nbytes;
        } else { /* its init, as the file's value */
            o->dtype = p->s.dtype;
            o->rank = p->s.rank;
            memcpy(o->dim, p->s.dim, sizeof o->dim);
            o->nbytes = (size_t)shape_bytes(&p->s);
            copies[id] = xmalloc(o->nbytes + 1);
            memcpy(copies[id], vals[id], o->nbytes);
            o->data = copies[id];
        }
    }
    /* the file's tensors no param took */
    for (int i = 0; i < n; i++) {
        bool took = false;
        const Tensor *p = to[i] ? param_named(g, to[i]) : NULL;
        took = p && taker[p - g->t.v] == i + 1;
        if (took)
            continue;
        Shape fs = shape_make(f.t[i].dtype, f.t[i].rank, f.t[i].dim);
        shape_str(NULL, &fs, s1, sizeof s1);
        if (!to[i])
            list_item(&it, &ignored, "%s %s (%s says false)", f.t[i].name, s1,
                      where(map, &map->v[i], w1, sizeof w1));
        else if (!p && map && map->v[i].line != 0)
            list_item(&it, &ignored, "%s %s (%s maps it to \"%s\", not a param of the model)",
                      f.t[i].name, s1, where(map, &map->v[i], w1, sizeof w1), to[i]);
        else if (!p)
            list_item(&it, &ignored, "%s %s (no param of that name in the model)", f.t[i].name,
                      s1);
    }
    if (!rt_weights_restore(path, &sf, g, pads, npads, vals, d))
        goto free_lists;
    text_add(&t, "  loaded %d of %d params from %s%s%s\n", loaded, params, path,
             map ? " through " : "", map ? map->path : "");
    if (left) {
        text_add(&t, "  left at their init (%d):\n%s", left, lt.s ? lt.s : "");
        list_end(&t, left);
    }
    if (ignored) {
        text_add(&t, "  ignored from the file (%d):\n%s", ignored, it.s ? it.s : "");
        list_end(&t, ignored);
    }
    ok = true;
free_lists:
    free(lt.s);
    free(it.s);
done:
    for (int id = 0; id < g->t.n; id++)
        free(copies[id]);
    free(copies);
    free(out);
    free(taker);
    free(to);
    rt_st_free(&f);
    if (ok && note)
        *note = t.s;
    else
        free(t.s);
    return ok;
}
