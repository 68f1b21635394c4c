/* data_tensors.c - the tensors data source: a model's inputs from the
 * user's own arrays, in a safetensors file (safetensors.c's reader) or a
 * directory of NAME.npy files (npy.c). The first axis of every array is the
 * example axis; array NAME feeds model input NAME, one example per row.
 *
 * Splits: the training arrays come from c->path; the validation ones from
 * c->val_path when set (checked like the training ones), else from the last
 * floor(N * val_fraction) examples of the training file (none when 0).
 * A batch is a pure function of (seed, split, index): train row i of batch k
 * is position p = k*B + i, epoch p / Ntrain, example perm_epoch[p mod
 * Ntrain], perm_epoch a Fisher-Yates shuffle seeded by (seed, epoch), or the
 * identity when in_order; validation row i of batch k is example
 * (k*B + i) mod Nval, always in order. */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct TensorSource {
    uint64_t seed;
    bool in_order;
    int64_t B;
    int n;                  /* arrays: one per want */
    StFile tf, vf;          /* the training and the validation file (vf empty
                               when validation is the training file's tail) */
    const StTensor **tr;    /* per array: its training tensor */
    const StTensor **va;    /* per array: its validation tensor (NULL: none) */
    int64_t ntrain, nval;   /* examples */
    int64_t val0;           /* validation's first example in va */
    int64_t *perm;          /* [ntrain]: the permutation of perm_epoch */
    int64_t perm_epoch;     /* -1: none computed */
};

/* "f32[100,4]" for a message */
static const char *arr_str(DType dt, int rank, const int64_t *dim, char *buf, size_t n)
{
    Shape s = shape_make(dt, rank, dim);
    return shape_str(NULL, &s, buf, n);
}

/* The arrays of the file or directory at path into f: in a directory only
 * the NAME.npy files of the model's inputs are read (the others' names into
 * skipped); a safetensors file is read and checked whole. */
static bool read_arrays(const char *path, const DataCfg *c, StFile *f, char *skipped,
                        size_t nskipped, bool *dir, Diag *d)
{
    struct stat st;
    skipped[0] = 0;
    *dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (*dir) {
        const char **only = xcalloc((size_t)c->nwant + 1, sizeof *only);
        for (int i = 0; i < c->nwant; i++)
            only[i] = c->want[i].name;
        bool ok = rt_npy_read_dir(path, only, c->nwant, f, skipped, nskipped, d);
        free(only);
        return ok;
    }
    return rt_st_read(path, f, d);
}

/* The list of f's array names and the skipped ones, for a message. */
static const char *names_of(const StFile *f, const char *skipped, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < f->n && k + 1 < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", f->t[i].name);
    if (skipped[0] && k + 1 < n)
        snprintf(buf + k, n - k, "%s%s", k ? ", " : "", skipped);
    return buf;
}

/* Whether element k of a float array t is finite (f32, f16, bf16; integers
 * always are); *v its value as a double for a message. */
static bool finite_at(const StTensor *t, int64_t k, double *v)
{
    uint32_t bits;
    switch (t->dtype) {
    case DT_F32: {
        float f;
        memcpy(&f, (const uint8_t *)t->data + 4 * k, 4);
        *v = f;
        return isfinite(f);
    }
    case DT_F16: {
        uint16_t h;
        memcpy(&h, (const uint8_t *)t->data + 2 * k, 2);
        *v = (h & 0x3ff) ? NAN : (h & 0x8000) ? -INFINITY : INFINITY;
        return (h & 0x7c00) != 0x7c00;
    }
    case DT_BF16: {
        uint16_t h;
        memcpy(&h, (const uint8_t *)t->data + 2 * k, 2);
        bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        *v = f;
        return isfinite(f);
    }
    default:
        return true;
    }
}

/* A float array with NaN or Inf: false with "PATH: array "x" holds NaN at
 * example E, position [i,j] (...)"; PATH/x.npy when path is a directory. */
static bool check_finite(const char *path, bool dir, const StTensor *t, Diag *d)
{
    if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16)
        return true;
    int64_t cnt = (int64_t)(t->nbytes / (size_t)dtype_size(t->dtype));
    for (int64_t k = 0; k < cnt; k++) {
        double v;
        if (finite_at(t, k, &v))
            continue;
        int64_t row = 1; /* elements per example */
        for (int i = 1; i < t->rank; i++)
            row *= t->dim[i];
        char pos[160] = "";
        size_t n = 0;
        int64_t rest = k % row;
        for (int i = 1; i < t->rank && n + 1 < sizeof pos; i++) {
            int64_t inner = 1;
            for (int j = i + 1; j < t->rank; j++)
                inner *= t->dim[j];
            n += (size_t)snprintf(pos + n, sizeof pos - n, "%s%lld", i > 1 ? "," : "",
                                  (long long)(rest / inner));
            rest %= inner;
        }
        snprintf(d->msg, sizeof d->msg,
                 "%s%s%s%s: array \"%s\" holds %s at example %lld%s%s%s (element %lld of the "
                 "array; expected finite values: clean the data, or train on it with "
                 "--allow-nonfinite-data)",
                 path, dir ? "/" : "", dir ? t->name : "", dir ? ".npy" : "", t->name,
                 isnan(v) ? "NaN" : v > 0 ? "Inf" : "-Inf",
                 (long long)(k / row), t->rank > 1 ? ", position [" : "", pos,
                 t->rank > 1 ? "]" : "", (long long)k);
        return false;
    }
    return true;
}

/* Matches each want to an array of f (path names it), checks dtype, shape,
 * a common example count (into *N) and integer ranges; out[i] the array. */
static bool match(const char *path, bool dir, const StFile *f, const char *skipped,
                  const DataCfg *c, const StTensor **out, int64_t *N, Diag *d)
{
    const char *first = NULL;
    for (int i = 0; i < c->nwant; i++) {
        const DataWant *w = &c->want[i];
        const StTensor *t = rt_st_find(f, w->name);
        char a[128], b[128];
        if (!t && w->optional) { /* fed zeros (rt_tensors_range) */
            out[i] = NULL;
            continue;
        }
        if (!t) {
            char names[512];
            size_t k = (size_t)snprintf(a, sizeof a, "%s[N", dtype_name(w->dtype));
            for (int j = 0; j < w->rank && k < sizeof a; j++)
                k += (size_t)snprintf(a + k, sizeof a - k, ",%lld", (long long)w->dim[j]);
            if (k < sizeof a)
                snprintf(a + k, sizeof a - k, "]");
            snprintf(d->msg, sizeof d->msg,
                     "%s: no array \"%s\" for the model input of that name (expected %s %s "
                     "for N examples, got arrays: %s)",
                     path, w->name, w->name, a, names_of(f, skipped, names, sizeof names));
            return false;
        }
        bool ok = t->dtype == w->dtype && t->rank == w->rank + 1;
        for (int k = 0; ok && k < w->rank; k++)
            ok = t->dim[k + 1] == w->dim[k];
        if (!ok) {
            int64_t want[IR_MAX_RANK + 1];
            want[0] = t->rank > 0 ? t->dim[0] : 1;
            memcpy(want + 1, w->dim, (size_t)w->rank * sizeof *want);
            /* a dtype NumPy can convert to: its name for the hint */
            static const char *const np_name[] = {[DT_F32] = "float32", [DT_F16] = "float16",
                                                  [DT_I32] = "int32", [DT_I64] = "int64",
                                                  [DT_U8] = "uint8"};
            char hint[160] = "";
            if (t->dtype != w->dtype && (int)w->dtype < (int)(sizeof np_name / sizeof *np_name) &&
                np_name[w->dtype])
                snprintf(hint, sizeof hint, "; convert it before saving: %s.astype(np.%s)",
                         w->name, np_name[w->dtype]);
            snprintf(d->msg, sizeof d->msg,
                     "%s: array \"%s\" does not fit model input %s (the first axis is the "
                     "examples: expected %s, got %s%s)",
                     path, w->name, w->name, arr_str(w->dtype, w->rank + 1, want, a, sizeof a),
                     arr_str(t->dtype, t->rank, t->dim, b, sizeof b), hint);
            return false;
        }
        if (!first) {
            first = w->name;
            *N = t->dim[0];
        } else if (t->dim[0] != *N) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: arrays \"%s\" and \"%s\" hold different numbers of examples "
                     "(expected %lld in each, got %lld)",
                     path, first, w->name, (long long)*N, (long long)t->dim[0]);
            return false;
        }
        if (w->limit > 0 && (t->dtype == DT_I32 || t->dtype == DT_I64 || t->dtype == DT_U8)) {
            int64_t cnt = (int64_t)(t->nbytes / (size_t)dtype_size(t->dtype));
            for (int64_t k = 0; k < cnt; k++) {
                int64_t v = t->dtype == DT_I32   ? ((const int32_t *)t->data)[k]
                            : t->dtype == DT_I64 ? ((const int64_t *)t->data)[k]
                                                 : ((const uint8_t *)t->data)[k];
                if (v >= 0 && v < w->limit)
                    continue;
                snprintf(d->msg, sizeof d->msg,
                         "%s: array \"%s\" holds %lld at index %lld, out of range (expected "
                         "0 <= value < %lld, %s)",
                         path, w->name, (long long)v, (long long)k, (long long)w->limit,
                         w->limit_what ? w->limit_what : "the model's limit");
                return false;
            }
        }
        if (!c->allow_nonfinite && !check_finite(path, dir, t, d))
            return false;
        out[i] = t;
    }
    if (!first || *N < 1) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: no examples (expected arrays with at least 1 row, got %lld)", path,
                 first ? (long long)*N : 0LL);
        return false;
    }
    return true;
}

TensorSource *rt_tensors_open(const DataCfg *c, DataBatch *b, Diag *d)
{
    if (!c->path || !*c->path) {
        snprintf(d->msg, sizeof d->msg,
                 "data tensors needs a file (set data_path to a .safetensors file or a "
                 "directory of .npy files)");
        return NULL;
    }
    if (c->nwant < 1) {
        snprintf(d->msg, sizeof d->msg, "data tensors: the model has no inputs to feed");
        return NULL;
    }
    TensorSource *s = xcalloc(1, sizeof *s);
    s->seed = c->seed;
    s->in_order = c->in_order;
    s->B = c->batch;
    s->n = c->nwant;
    s->perm_epoch = -1;
    s->tr = xcalloc((size_t)s->n, sizeof *s->tr);
    s->va = xcalloc((size_t)s->n, sizeof *s->va);
    int64_t N = 0;
    char skipped[512];
    bool dir;
    if (!read_arrays(c->path, c, &s->tf, skipped, sizeof skipped, &dir, d) ||
        !match(c->path, dir, &s->tf, skipped, c, s->tr, &N, d))
        goto fail;
    s->ntrain = N;
    if (c->val_path && *c->val_path) {
        if (!read_arrays(c->val_path, c, &s->vf, skipped, sizeof skipped, &dir, d) ||
            !match(c->val_path, dir, &s->vf, skipped, c, s->va, &s->nval, d))
            goto fail;
    } else if (c->val_fraction > 0) {
        s->nval = (int64_t)((double)N * c->val_fraction);
        s->ntrain = N - s->nval;
        s->val0 = s->ntrain;
        if (s->nval < 1 || s->ntrain < 1) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: too few examples to split (expected at least 1 in each of the "
                     "train and validation splits, got %lld train and %lld validation of "
                     "%lld with val_fraction %g; set val_path or val_fraction = 0)",
                     c->path, (long long)s->ntrain, (long long)s->nval, (long long)N,
                     c->val_fraction);
            goto fail;
        }
        for (int i = 0; i < s->n; i++)
            s->va[i] = s->tr[i];
    }
    s->perm = xmalloc((size_t)s->ntrain * sizeof *s->perm);
    b->narr = s->n;
    b->arr = xcalloc((size_t)s->n, sizeof *b->arr);
    b->T = 1;
    for (int i = 0; i < s->n; i++) {
        DataArr *a = &b->arr[i];
        a->name = c->want[i].name;
        a->row_bytes = (int64_t)dtype_size(c->want[i].dtype); /* the want's: tr[i] may be absent */
        for (int k = 0; k < c->want[i].rank; k++)
            a->row_bytes *= c->want[i].dim[k];
        if (!(a->data = calloc((size_t)(s->B * a->row_bytes) + 1, 1))) {
            snprintf(d->msg, sizeof d->msg,
                     "data tensors: cannot allocate a batch of %lld rows of \"%s\" (%lld bytes "
                     "each)",
                     (long long)s->B, a->name, (long long)a->row_bytes);
            goto fail;
        }
        if (strcmp(a->name, "y") == 0 && c->want[i].dtype == DT_I32 && c->want[i].rank == 0)
            b->y = (int32_t *)(void *)a->data;
    }
    return s;
fail:
    rt_tensors_close(s, b);
    return NULL;
}

/* s->perm for epoch e: a Fisher-Yates shuffle seeded by (seed, e). */
static void make_perm(TensorSource *s, int64_t e)
{
    int64_t n = s->ntrain;
    for (int64_t i = 0; i < n; i++)
        s->perm[i] = i;
    uint64_t st = ir_rand_mix(s->seed ^ ir_rand_mix(0x7e5a0u ^ ir_rand_mix((uint64_t)e)));
    for (int64_t i = n - 1; i > 0; i--) {
        st += 0x9E3779B97F4A7C15ull;
        int64_t j = (int64_t)(ir_rand_mix(st) % (uint64_t)(i + 1));
        int64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->perm_epoch = e;
}

void rt_tensors_fill(TensorSource *s, DataBatch *b, DataSplit split, int64_t index)
{
    for (int64_t r = 0; r < s->B; r++) {
        uint64_t p = (uint64_t)index * (uint64_t)s->B + (uint64_t)r;
        int64_t ex;
        const StTensor *const *src;
        if (split == DATA_TRAIN) {
            int64_t e = (int64_t)(p / (uint64_t)s->ntrain);
            ex = (int64_t)(p % (uint64_t)s->ntrain);
            if (!s->in_order) {
                if (e != s->perm_epoch)
                    make_perm(s, e);
                ex = s->perm[ex];
            }
            src = s->tr;
        } else {
            if (!s->nval)
                die("rt_tensors_fill: validation batch requested with no validation split");
            ex = s->val0 + (int64_t)(p % (uint64_t)s->nval);
            src = s->va;
        }
        for (int i = 0; i < s->n; i++) {
            DataArr *a = &b->arr[i];
            if (!src[i]) /* an optional array the file lacks */
                memset(a->data + r * a->row_bytes, 0, (size_t)a->row_bytes);
            else
                memcpy(a->data + r * a->row_bytes,
                       (const uint8_t *)src[i]->data + ex * a->row_bytes, (size_t)a->row_bytes);
        }
    }
}

bool rt_tensors_has_val(const TensorSource *s)
{
    return s->nval > 0;
}

void rt_tensors_close(TensorSource *s, DataBatch *b)
{
    if (b->arr)
        for (int i = 0; i < b->narr; i++)
            free(b->arr[i].data);
    free(b->arr);
    b->arr = NULL;
    b->narr = 0;
    b->y = NULL;
    if (!s)
        return;
    rt_st_free(&s->tf);
    rt_st_free(&s->vf);
    free(s->tr);
    free(s->va);
    free(s->perm);
    free(s);
}

int64_t rt_tensors_examples(const TensorSource *s, DataSplit split)
{
    return split == DATA_TRAIN ? s->ntrain : s->nval;
}

void rt_tensors_range(TensorSource *s, DataBatch *b, DataSplit split, int64_t first, int64_t n)
{
    const StTensor *const *src = split == DATA_TRAIN ? s->tr : s->va;
    int64_t base = split == DATA_TRAIN ? 0 : s->val0;
    for (int64_t r = 0; r < n; r++)
        for (int i = 0; i < s->n; i++) {
            DataArr *a = &b->arr[i];
            if (!src[i]) /* an optional array the file lacks */
                memset(a->data + r * a->row_bytes, 0, (size_t)a->row_bytes);
            else
                memcpy(a->data + r * a->row_bytes,
                       (const uint8_t *)src[i]->data + (base + first + r) * a->row_bytes,
                       (size_t)a->row_bytes);
        }
}
