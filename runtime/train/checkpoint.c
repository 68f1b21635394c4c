/* checkpoint.c - checkpoints (params, optimizer state, step, data position,
 * seed, model fingerprint) and weights files (params only), both safetensors.
 *
 * Metadata keys: kiln.kind ("checkpoint" or "weights"), kiln.fingerprint
 * (16 hex digits), and for checkpoints kiln.step, kiln.data_pos, kiln.seed.
 *
 * Gradient accumulators (state "accum.P", grad_accum > 1) are scratch of one
 * step: the runtime refills them before every step reads them, so they
 * carry nothing from one step to the next. A checkpoint does not hold them
 * and loading one zeroes them, so a run resumes with any grad_accum. */
#include "train.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

uint64_t rt_model_fingerprint(const Graph *g)
{
    uint64_t h = 0;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        uint64_t x = hash_bytes(t->name, strlen(t->name), 0x6b696c6eull);
        x = hash_bytes(&t->s.dtype, sizeof t->s.dtype, x);
        x = hash_bytes(&t->s.rank, sizeof t->s.rank, x);
        x = hash_bytes(t->s.dim, (size_t)t->s.rank * sizeof t->s.dim[0], x);
        h += ir_rand_mix(x); /* a sum: independent of declaration order */
    }
    return h;
}

static bool is_accumulator(const Tensor *t)
{
    return t->kind == TK_STATE && strncmp(t->name, "accum.", 6) == 0;
}

bool rt_model_state(const Tensor *t)
{
    static const char *opt[] = {"adam.", "sgd.", "lion.", "adafactor.", "accum."};
    if (t->kind != TK_STATE || t->op >= 0 || !t->name)
        return false;
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (strncmp(t->name, opt[i], strlen(opt[i])) == 0)
            return false;
    return true;
}

/* checkpoints: params and every state but accumulators; weights: params
 * and model state */
static bool saved_kind(const Tensor *t, bool with_state)
{
    return t->kind == TK_PARAM ||
           (t->kind == TK_STATE && (with_state ? !is_accumulator(t) : rt_model_state(t)));
}

/* Index of the first NaN or Inf among the n elements at p when dt is a
 * float dtype (F32, BF16, F16), else -1; *what is "NaN", "+Inf" or "-Inf".
 * Reads the bits: no conversion, any alignment. */
static int64_t first_nonfinite(DType dt, const void *p, int64_t n, const char **what)
{
    int sz = dtype_size(dt), mant;
    uint32_t expo;
    switch (dt) {
    case DT_F32: expo = 0xffu, mant = 23; break;
    case DT_BF16: expo = 0xffu, mant = 7; break;
    case DT_F16: expo = 0x1fu, mant = 10; break;
    default: return -1;
    }
    const uint8_t *b = p;
    for (int64_t i = 0; i < n; i++) {
        uint32_t x = 0;
        if (sz == 4) {
            uint32_t v;
            memcpy(&v, b + 4 * i, 4);
            x = v;
        } else {
            uint16_t v;
            memcpy(&v, b + 2 * i, 2);
            x = v;
        }
        if (((x >> mant) & expo) != expo)
            continue;
        *what = x & ((1u << mant) - 1) ? "NaN" : x >> (8 * sz - 1) ? "-Inf" : "+Inf";
        return i;
    }
    return -1;
}

static bool save(const char *path, const Graph *g, void *const *vals, const CkptMeta *m,
                 Diag *d)
{
    /* never write a non-finite value: a diverged run's file would only fail
     * later, at --resume or --init-from */
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        const char *what;
        int64_t k;
        if (saved_kind(t, m != NULL) &&
            (k = first_nonfinite(t->s.dtype, vals[i], shape_numel(&t->s), &what)) >= 0) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: not written: %s \"%s\" holds %s at index %lld (expected finite "
                     "values; the run has diverged)",
                     path, t->kind == TK_PARAM ? "param" : rt_model_state(t) ? "state" : "optimizer state", t->name, what,
                     (long long)k);
            return false;
        }
    }
    StTensor *ts = xcalloc((size_t)g->t.n + 1, sizeof *ts);
    int n = 0;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (!saved_kind(t, m != NULL))
            continue;
        StTensor *s = &ts[n++];
        s->name = (char *)t->name;
        s->dtype = t->s.dtype;
        s->rank = t->s.rank;
        memcpy(s->dim, t->s.dim, sizeof s->dim);
        s->data = vals[i];
        s->nbytes = (size_t)shape_numel(&t->s) * (size_t)dtype_size(t->s.dtype);
    }
    char fp[32], step[32], pos[32], seed[32];
    snprintf(fp, sizeof fp, "%016" PRIx64, rt_model_fingerprint(g));
    const char *key[5] = {"kiln.kind", "kiln.fingerprint", "kiln.step", "kiln.data_pos",
                          "kiln.seed"};
    const char *val[5] = {m ? "checkpoint" : "weights", fp, step, pos, seed};
    if (m) {
        snprintf(step, sizeof step, "%" PRId64, m->step);
        snprintf(pos, sizeof pos, "%" PRId64, m->data_pos);
        snprintf(seed, sizeof seed, "%" PRIu64, m->seed);
    }
    bool ok = rt_st_write(path, ts, n, key, val, m ? 5 : 2, d);
    free(ts);
    return ok;
}

bool rt_ckpt_save(const char *path, const Graph *g, void *const *vals, const CkptMeta *m,
                  Diag *d)
{
    return save(path, g, vals, m, d);
}

bool rt_weights_save(const char *path, const Graph *g, void *const *vals, Diag *d)
{
    return save(path, g, vals, NULL, d);
}

/* The real rows of param t when pads name it (padded_rows), else -1. */
static int64_t pad_rows(const Tensor *t, const ModelRowPad *pads, int npads)
{
    for (int i = 0; i < npads; i++)
        if (t->name && strcmp(pads[i].param, t->name) == 0)
            return pads[i].rows;
    return -1;
}

/* Whether file tensor fs fits t as its real rows: t is padded to more rows
 * than its real ones and fs has exactly those, with t's dtype and other
 * dims. */
static bool fits_padded(const Shape *fs, const Tensor *t, int64_t real)
{
    if (real < 0 || fs->dtype != t->s.dtype || fs->rank != t->s.rank || fs->dim[0] != real)
        return false;
    for (int i = 1; i < fs->rank; i++)
        if (fs->dim[i] != t->s.dim[i])
            return false;
    return true;
}

/* Checks that f has every param (and state) of g by name with its dtype and
 * shape (a padded param, pads: its real rows, the rest zeroed); when vals is
 * not NULL, checks that they are finite, then copies them into vals (all
 * or none).
 * With state, accumulators are zeroed (and any in the file ignored). */
static bool restore(const char *path, const StFile *f, const Graph *g, const ModelRowPad *pads,
                    int npads, void **vals, bool with_state, Diag *d)
{
    if (vals && !restore(path, f, g, pads, npads, NULL, with_state, d))
        return false;
    for (int i = 0; vals && i < g->t.n; i++) { /* every value it restores finite */
        const Tensor *t = &g->t.v[i];
        const StTensor *s = saved_kind(t, with_state) ? rt_st_find(f, t->name) : NULL;
        const char *what;
        int64_t k;
        if (s && (k = first_nonfinite(s->dtype, s->data,
                                      (int64_t)s->nbytes / dtype_size(s->dtype), &what)) >= 0) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: tensor \"%s\" holds %s at index %lld (expected finite values)", path,
                     t->name, what, (long long)k);
            return false;
        }
    }
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (vals && with_state && is_accumulator(t))
            memset(vals[i], 0, (size_t)shape_numel(&t->s) * (size_t)dtype_size(t->s.dtype));
        if (!saved_kind(t, with_state))
            continue;
        char want[128], got[128];
        shape_str(g, &t->s, want, sizeof want);
        const StTensor *s = rt_st_find(f, t->name);
        if (!s) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: missing tensor \"%s\" (the model expects %s, the file has none)",
                     path, t->name, want);
            return false;
        }
        Shape fs = shape_make(s->dtype, s->rank, s->dim);
        if (!shape_eq(&fs, &t->s) && fits_padded(&fs, t, pad_rows(t, pads, npads))) {
            if (vals) { /* the real rows, then zeros in the padding */
                memcpy(vals[i], s->data, s->nbytes);
                memset((char *)vals[i] + s->nbytes, 0, (size_t)shape_bytes(&t->s) - s->nbytes);
            }
            continue;
        }
        if (!shape_eq(&fs, &t->s)) {
            char w2[128];
            shape_str(NULL, &t->s, w2, sizeof w2);
            shape_str(NULL, &fs, got, sizeof got);
            snprintf(d->msg, sizeof d->msg,
                     "%s: tensor \"%s\" has the wrong shape (the model expects %s, the file "
                     "has %s)",
                     path, t->name, w2, got);
            return false;
        }
        if (vals)
            memcpy(vals[i], s->data, s->nbytes);
    }
    return true;
}

/* metadata integer: decimal digits only (no sign, space or exponent), in
 * range: signed 0..INT64_MAX, unsigned the full uint64 range (returned
 * bit-cast); a value out of range is refused, never clamped. False with
 * "kiln.step \"VALUE\" (expected ...)" in why. */
static bool parse_int(const StFile *f, const char *key, bool unsig, int64_t *out, char *why,
                      size_t nwhy)
{
    const char *s = rt_st_meta(f, key);
    const char *range = unsig ? "from 0 to 18446744073709551615"
                              : "from 0 to 9223372036854775807";
    if (!s) {
        snprintf(why, nwhy, "no %s (expected an integer %s)", key, range);
        return false;
    }
    bool digits = *s != 0;
    for (const char *p = s; *p && digits; p++)
        digits = *p >= '0' && *p <= '9';
    char *end;
    errno = 0;
    if (digits)
        *out = unsig ? (int64_t)strtoull(s, &end, 10) : strtoll(s, &end, 10);
    if (!digits || errno || *end) {
        snprintf(why, nwhy, "%s \"%.40s%s\" (expected an integer %s)", key, s,
                 strlen(s) > 40 ? "..." : "", range);
        return false;
    }
    return true;
}

bool rt_ckpt_load(const char *path, const Graph *g, void **vals, CkptMeta *m, Diag *d)
{
    StFile f;
    if (!rt_st_read(path, &f, d))
        return false;
    bool ok = false;
    const char *kind = rt_st_meta(&f, "kiln.kind");
    const char *fp = rt_st_meta(&f, "kiln.fingerprint");
    int64_t step, pos, seed;
    if (!kind || strcmp(kind, "checkpoint") != 0 || !fp) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not a kiln checkpoint (expected metadata kiln.kind \"checkpoint\", got "
                 "%s%s%s)%s",
                 path, kind ? "\"" : "", kind ? kind : "none", kind ? "\"" : "",
                 kind && strcmp(kind, "weights") == 0 ? "; load weights with --init-from" : "");
        goto done;
    }
    char mine[32];
    snprintf(mine, sizeof mine, "%016" PRIx64, rt_model_fingerprint(g));
    if (strcmp(fp, mine) != 0) {
        /* name the first difference when we can */
        Diag why;
        why.msg[0] = 0;
        restore(path, &f, g, NULL, 0, NULL, false, &why);
        snprintf(d->msg, sizeof d->msg,
                 "%s: checkpoint is from a different model (fingerprint %s, this model %s)%s%.900s",
                 path, fp, mine, why.msg[0] ? ": " : "", why.msg);
        goto done;
    }
    char why[160];
    if (!parse_int(&f, "kiln.step", false, &step, why, sizeof why) ||
        !parse_int(&f, "kiln.data_pos", false, &pos, why, sizeof why) ||
        !parse_int(&f, "kiln.seed", true, &seed, why, sizeof why)) {
        snprintf(d->msg, sizeof d->msg, "%s: corrupt checkpoint metadata: %s", path, why);
        goto done;
    }
    if (!restore(path, &f, g, NULL, 0, vals, true, d))
        goto done;
    m->step = step;
    m->data_pos = pos;
    m->seed = (uint64_t)seed;
    ok = true;
done:
    rt_st_free(&f);
    return ok;
}

bool rt_weights_import(const char *path, const Graph *g, const ModelRowPad *pads, int npads,
                       void **vals, Diag *d)
{
    StFile f;
    if (!rt_st_read(path, &f, d))
        return false;
    bool ok = restore(path, &f, g, pads, npads, vals, false, d);
    rt_st_free(&f);
    return ok;
}

bool rt_weights_restore(const char *path, const StFile *f, const Graph *g,
                        const ModelRowPad *pads, int npads, void **vals, Diag *d)
{
    return restore(path, f, g, pads, npads, vals, false, d);
}

bool rt_weights_load(const char *path, const Graph *g, void **vals, Diag *d)
{
    StFile f;
    if (!rt_st_read(path, &f, d))
        return false;
    bool ok = restore(path, &f, g, NULL, 0, vals, false, d);
    rt_st_free(&f);
    return ok;
}

int rt_ckpt_sweep_tmp(const char *prefix, const char *weights)
{
    int n = weights ? rt_tmp_sweep(weights, NULL) : 0;
    if (prefix) { /* the names train.c gives: PREFIX.stepN.safetensors */
        const char *ext = ".safetensors";
        size_t l = strlen(prefix), e = strlen(ext);
        if (l > e && strcmp(prefix + l - e, ext) == 0)
            l -= e;
        char *head = xasprintf("%.*s.step", (int)l, prefix);
        n += rt_tmp_sweep(head, ext);
        free(head);
    }
    return n;
}
