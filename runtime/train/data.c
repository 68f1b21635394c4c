/* data.c - training data sources: synthetic addition, byte-level text, llm.c
 * token files, Gaussian blobs, and the user's arrays (tensors, in
 * data_tensors.c). Every batch is a pure function of
 * (seed, split, index), so a run is deterministic and resumes exactly. */
#include "train.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { SRC_ADDITION, SRC_TEXT, SRC_TOKENS, SRC_BLOBS, SRC_TENSORS } SrcKind;

struct DataSource {
    SrcKind kind;
    DataCfg c;
    char *path;
    /* text and tokens: the file, mapped read-only (NULL when empty) */
    void *map;
    size_t maplen;
    const uint8_t *bytes; /* text: the symbols */
    const uint8_t *toks;  /* tokens: the symbols, little-endian uint16 */
    int64_t n;          /* symbols in the file */
    int64_t ntrain;     /* the first ntrain symbols are training data */
    float *centers;     /* blobs: [classes, dim] */
    TensorSource *ts;   /* tensors */
    DataBatch b;
    int64_t *pairs;     /* addition, the whole split (rt_data_examples): its
                           problems a*10^n+b in order; npairs of them */
    int64_t npairs;
    int pairs_split;    /* the split pairs lists (-1: none yet) */
    bool partial;       /* text, tokens: rt_data_examples counted the tail window */
};

/* ---- random numbers: a splitmix64 stream per (seed, split, index) ---- */

typedef struct {
    uint64_t s;
} Rng;

static Rng rng_for(uint64_t seed, int split, int64_t index, int64_t row)
{
    Rng r = {ir_rand_mix(seed ^ ir_rand_mix((uint64_t)split * 0x1000003ull ^
                                            ir_rand_mix((uint64_t)index ^
                                                        ir_rand_mix((uint64_t)row))))};
    return r;
}

static uint64_t rng_next(Rng *r)
{
    r->s += 0x9E3779B97F4A7C15ull;
    return ir_rand_mix(r->s);
}

/* uniform in [0, n) (n > 0), without modulo bias worth caring about at 64 bits */
static int64_t rng_below(Rng *r, int64_t n)
{
    return (int64_t)(rng_next(r) % (uint64_t)n);
}

static double rng_u01(Rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(Rng *r)
{
    double u1 = rng_u01(r), u2 = rng_u01(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- addition ---- */

static int64_t pow10i(int n)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= 10;
    return p;
}

void rt_addition_encode(int digits, int64_t a, int64_t b, int32_t *seq)
{
    int n = digits, k = 0;
    for (int i = n - 1; i >= 0; i--)
        seq[k++] = (int32_t)(a / pow10i(i) % 10);
    seq[k++] = ADD_PLUS;
    for (int i = n - 1; i >= 0; i--)
        seq[k++] = (int32_t)(b / pow10i(i) % 10);
    seq[k++] = ADD_EQ;
    int64_t s = a + b;
    for (int i = 0; i <= n; i++, s /= 10)
        seq[k++] = (int32_t)(s % 10);
    seq[k++] = ADD_END;
}

bool rt_addition_is_val(int digits, int64_t a, int64_t b, double val_fraction)
{
    uint64_t h = ir_rand_mix(0x6164646974696f6eull ^
                             ir_rand_mix((uint64_t)(a * pow10i(digits) + b)));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0) < val_fraction;
}

static void fill_addition(DataSource *s, DataSplit split, int64_t index)
{
    DataBatch *b = &s->b;
    int n = s->c.digits;
    int64_t lim = pow10i(n), T = b->T;
    int32_t seq[3 * 9 + 4];
    int len = 3 * n + 4;
    for (int64_t r = 0; r < b->B; r++) {
        Rng g = rng_for(s->c.seed, (int)split, index, r);
        int64_t x, y;
        do {
            x = rng_below(&g, lim);
            y = rng_below(&g, lim);
        } while (rt_addition_is_val(n, x, y, s->c.val_fraction) != (split == DATA_VAL));
        rt_addition_encode(n, x, y, seq);
        for (int64_t t = 0; t < T; t++) {
            int32_t tok = t < len ? seq[t] : ADD_PAD;
            int32_t tgt = t + 1 < len ? seq[t + 1] : ADD_PAD;
            b->tokens[r * T + t] = tok;
            b->targets[r * T + t] = tgt;
            /* targets 2n+2 .. 3n+3 of seq: answer digits and the end token */
            b->mask[r * T + t] = (t + 1 >= 2 * n + 2 && t + 1 <= 3 * n + 3) ? 1.0f : 0.0f;
        }
    }
}

/* Both splits hold a problem, and the rejection sampler of fill_addition
 * draws one of either in under 10^6 tries per row on average: val_fraction
 * in [1e-6, 1 - 1e-6], and for up to 3 digits (10^6 pairs, counted here)
 * at least one pair on each side. */
static bool addition_splits(const DataCfg *c, Diag *d)
{
    double f = c->val_fraction;
    int n = c->digits;
    if (f < 1e-6 || f > 1 - 1e-6) {
        snprintf(d->msg, sizeof d->msg,
                 "addition: val_fraction %g leaves the %s split almost empty (expected a "
                 "value in [1e-06, 0.999999])",
                 f, f < 1e-6 ? "validation" : "training");
        return false;
    }
    if (n > 3)
        return true;
    int64_t lim = pow10i(n), nval = 0;
    for (int64_t a = 0; a < lim; a++)
        for (int64_t b = 0; b < lim; b++)
            nval += rt_addition_is_val(n, a, b, f);
    if (nval == 0 || nval == lim * lim) {
        snprintf(d->msg, sizeof d->msg,
                 "addition: with %d digits and val_fraction %g the %s split holds none of the "
                 "%lld problems (expected at least 1 in each of the train and validation "
                 "splits)",
                 n, f, nval == 0 ? "validation" : "training", (long long)(lim * lim));
        return false;
    }
    return true;
}

/* ---- text and tokens ---- */

/* Symbol i of a text or tokens file (0 <= i < n). */
static int32_t symbol_at(const DataSource *s, int64_t i)
{
    if (s->bytes)
        return s->bytes[i];
    return (int32_t)(s->toks[2 * i] | s->toks[2 * i + 1] << 8);
}

static void fill_windows(DataSource *s, DataSplit split, int64_t index)
{
    DataBatch *b = &s->b;
    int64_t T = b->T;
    int64_t lo = split == DATA_TRAIN ? 0 : s->ntrain;
    int64_t hi = split == DATA_TRAIN ? s->ntrain : s->n;
    int64_t starts = hi - lo - T; /* window [p, p+T] must fit: p in [lo, hi-T-1] */
    if (starts <= 0)
        die("fill_windows: split of %lld symbols for windows of %lld", (long long)(hi - lo),
            (long long)T + 1);
    int64_t nwin = (hi - lo - 1) / T; /* in_order: consecutive windows */
    for (int64_t r = 0; r < b->B; r++) {
        Rng g = rng_for(s->c.seed, (int)split, index, r);
        int64_t p = s->c.in_order
                        ? lo + (int64_t)(((uint64_t)index * (uint64_t)b->B + (uint64_t)r) %
                                         (uint64_t)nwin) * T
                        : lo + rng_below(&g, starts);
        for (int64_t t = 0; t < T; t++) {
            b->tokens[r * T + t] = symbol_at(s, p + t);
            b->targets[r * T + t] = symbol_at(s, p + t + 1);
            b->mask[r * T + t] = 1.0f;
        }
    }
}

/* Maps the regular file s->path read-only into s->map (NULL when empty),
 * its length into s->maplen; false with d set for anything else (a missing
 * file, a directory, a FIFO, a device, a socket). Never blocks: the file is
 * opened with O_NONBLOCK and checked with fstat before it is read. */
static bool map_file(DataSource *s, Diag *d)
{
    const char *path = s->path;
    struct stat st;
    int fd = -1;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not a data file (expected a regular file, got %s)", path,
                 rt_file_kind(st.st_mode));
        return false;
    }
    fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        char cwd[1024];
        if (path[0] != '/' && getcwd(cwd, sizeof cwd))
            snprintf(d->msg, sizeof d->msg,
                     "%s: cannot open data file: %s (a relative data_path is taken from the "
                     "current directory, %s; pass --set data_path=PATH)",
                     path, strerror(err), cwd);
        else
            snprintf(d->msg, sizeof d->msg, "%s: cannot open data file: %s", path,
                     strerror(err));
        return false;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not a data file (expected a regular file, got %s)", path,
                 rt_file_kind(st.st_mode));
        close(fd);
        return false;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX / 2) {
        snprintf(d->msg, sizeof d->msg, "%s: data file too large to map (%lld bytes)", path,
                 (long long)st.st_size);
        close(fd);
        return false;
    }
    s->maplen = (size_t)st.st_size;
    s->map = NULL;
    if (s->maplen > 0) {
        void *m = mmap(NULL, s->maplen, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            snprintf(d->msg, sizeof d->msg, "%s: cannot read data file: %s", path,
                     strerror(errno));
            close(fd);
            return false;
        }
        s->map = m;
    }
    close(fd);
    return true;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Checks the llm.c header of the mapped file and points s->toks at its
 * tokens. */
static bool open_tokens(DataSource *s, Diag *d)
{
    const uint8_t *raw = s->map;
    int64_t len = (int64_t)s->maplen;
    const char *p = s->path;
    if (len < 1024) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: truncated token file (expected a 1024-byte header, got %lld bytes)", p,
                 (long long)len);
        return false;
    }
    uint32_t magic = le32(raw), version = le32(raw + 4), count = le32(raw + 8);
    if (magic != 20240520u) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: not an llm.c token file (expected magic 20240520, got %u)", p, magic);
        return false;
    }
    if (version != 1) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: unsupported token file version (expected 1 (uint16 tokens), got %u)", p,
                 version);
        return false;
    }
    int64_t want = 1024 + 2 * (int64_t)count;
    if (len != want) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: %s token file (header says %u tokens: expected %lld bytes, got %lld)", p,
                 len < want ? "truncated" : "malformed", count, (long long)want,
                 (long long)len);
        return false;
    }
    s->n = count;
    s->toks = raw + 1024;
    return true;
}

/* Every symbol of a text or tokens file is below the model's limits: the
 * rows of the table the tokens index, and the classes of the targets. */
static bool check_symbols(const DataSource *s, Diag *d)
{
    const char *what = s->kind == SRC_TEXT ? "byte" : "token";
    const char *at = s->kind == SRC_TEXT ? "offset" : "position";
    int64_t rows = s->c.rows, vocab = s->c.vocab;
    if (rows <= 0 && vocab <= 0)
        return true;
    for (int64_t i = 0; i < s->n; i++) {
        int32_t v = symbol_at(s, i);
        if (rows > 0 && v >= rows) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: %s %d at %s %lld is out of range (expected < %lld, the rows of the "
                     "embedding table %s)",
                     s->path, what, v, at, (long long)i, (long long)rows,
                     s->c.rows_name ? s->c.rows_name : "the tokens index");
            return false;
        }
        if (vocab > 0 && v >= vocab) {
            snprintf(d->msg, sizeof d->msg,
                     "%s: %s %d at %s %lld is out of range (expected < %lld, the model's "
                     "vocabulary: the classes of its logits)",
                     s->path, what, v, at, (long long)i, (long long)vocab);
            return false;
        }
    }
    return true;
}

/* Splits s->n symbols into train and validation; both must hold a window. */
static bool split_windows(DataSource *s, Diag *d)
{
    const char *unit = s->kind == SRC_TEXT ? "bytes" : "tokens";
    if (s->n == 0) {
        snprintf(d->msg, sizeof d->msg, "%s: data file is empty", s->path);
        return false;
    }
    int64_t nval = (int64_t)floor((double)s->n * s->c.val_fraction);
    s->ntrain = s->n - nval;
    int64_t need = s->c.seq + 1;
    if (s->ntrain < need || (s->c.val_fraction > 0 && nval < need)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: too little data (expected at least %lld %s, one window of T+1, in "
                 "each of the train and validation splits, got %lld train and %lld "
                 "validation %s of %lld with val_fraction %g)",
                 s->path, (long long)need, unit, (long long)s->ntrain, (long long)nval, unit,
                 (long long)s->n, s->c.val_fraction);
        return false;
    }
    return true;
}

/* ---- blobs ---- */

static void fill_blobs(DataSource *s, DataSplit split, int64_t index)
{
    DataBatch *b = &s->b;
    int D = s->c.dim;
    for (int64_t r = 0; r < b->B; r++) {
        Rng g = rng_for(s->c.seed, (int)split, index, r);
        int c = (int)rng_below(&g, s->c.classes);
        b->y[r] = c;
        for (int k = 0; k < D; k++)
            b->x[r * D + k] = (float)(s->centers[c * D + k] + rng_normal(&g));
    }
}

/* A batch of rows x cols values of `each` bytes fits in this machine's
 * memory; else false with d set, before anything is allocated. */
static bool batch_fits(int64_t rows, int64_t cols, int64_t each, Diag *d)
{
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    double mem = pages > 0 && psize > 0 ? (double)pages * (double)psize : 0;
    double need = (double)rows * (double)cols * (double)each;
    if (need <= 9e18 && (mem <= 0 || need <= mem))
        return true;
    snprintf(d->msg, sizeof d->msg,
             "data: a batch of %lld x %lld needs %.4g bytes, more than this machine's memory "
             "(%.4g bytes)",
             (long long)rows, (long long)cols, need, mem);
    return false;
}

/* ---- the interface ---- */

DataSource *rt_data_open(const DataCfg *c, Diag *d)
{
    static const char *kinds[] = {"addition", "text", "tokens", "blobs", "tensors"};
    int kind = -1;
    for (int i = 0; i < 5; i++)
        if (c->kind && strcmp(c->kind, kinds[i]) == 0)
            kind = i;
    if (kind < 0) {
        snprintf(d->msg, sizeof d->msg,
                 "unknown data source (expected addition, text, tokens, blobs or tensors, got %s)",
                 c->kind ? c->kind : "none");
        return NULL;
    }
    if (c->batch <= 0 || (kind != SRC_BLOBS && kind != SRC_TENSORS && c->seq <= 0)) {
        snprintf(d->msg, sizeof d->msg,
                 "data %s: batch and sequence length must be positive (got B=%lld, T=%lld)",
                 kinds[kind], (long long)c->batch, (long long)c->seq);
        return NULL;
    }
    if (!(c->val_fraction >= 0 && c->val_fraction < 1)) {
        snprintf(d->msg, sizeof d->msg, "val_fraction must be in [0, 1) (got %g)",
                 c->val_fraction);
        return NULL;
    }
    DataSource *s = xcalloc(1, sizeof *s);
    s->kind = (SrcKind)kind;
    s->pairs_split = -1;
    s->c = *c;
    s->path = c->path ? xstrdup(c->path) : NULL;
    s->c.path = s->path;
    DataBatch *b = &s->b;
    b->B = c->batch;
    b->T = kind == SRC_BLOBS ? 0 : c->seq;
    switch (s->kind) {
    case SRC_TENSORS:
        if (!(s->ts = rt_tensors_open(c, b, d)))
            goto fail;
        s->c.want = NULL; /* the caller's: not kept */
        s->c.nwant = 0;
        return s;
    case SRC_ADDITION:
        if (c->digits < 1 || c->digits > 9) {
            snprintf(d->msg, sizeof d->msg, "addition: digits must be in 1..9 (got %d)",
                     c->digits);
            goto fail;
        }
        if (c->seq < 3 * c->digits + 3) {
            snprintf(d->msg, sizeof d->msg,
                     "addition: sequence too short for %d digits (expected T >= %d, got %lld)",
                     c->digits, 3 * c->digits + 3, (long long)c->seq);
            goto fail;
        }
        if (c->val_fraction <= 0) {
            snprintf(d->msg, sizeof d->msg,
                     "addition: val_fraction must be > 0 to hold out problems (got %g)",
                     c->val_fraction);
            goto fail;
        }
        if (!addition_splits(c, d))
            goto fail;
        break;
    case SRC_TEXT:
    case SRC_TOKENS:
        if (!s->path || !*s->path) {
            snprintf(d->msg, sizeof d->msg, "data %s needs a file (set data_path)",
                     kinds[kind]);
            goto fail;
        }
        if (!map_file(s, d))
            goto fail;
        if (s->kind == SRC_TEXT) {
            s->bytes = s->map;
            s->n = (int64_t)s->maplen;
        } else if (!open_tokens(s, d)) {
            goto fail;
        }
        if (!split_windows(s, d) || !check_symbols(s, d))
            goto fail;
        break;
    case SRC_BLOBS:
        if (c->dim <= 0 || c->classes < 2) {
            snprintf(d->msg, sizeof d->msg,
                     "blobs: need dim >= 1 and classes >= 2 (got dim %d, classes %d)", c->dim,
                     c->classes);
            goto fail;
        }
        b->D = c->dim;
        s->centers = xmalloc((size_t)c->classes * (size_t)c->dim * sizeof *s->centers);
        Rng g = rng_for(c->seed, 7, -1, -1);
        for (int64_t i = 0; i < (int64_t)c->classes * c->dim; i++)
            s->centers[i] = (float)(3.0 * rng_normal(&g));
        if (!batch_fits(b->B, b->D + 1, 4, d))
            goto fail;
        if (!(b->x = calloc((size_t)(b->B * b->D), sizeof *b->x)) ||
            !(b->y = calloc((size_t)b->B, sizeof *b->y))) {
            snprintf(d->msg, sizeof d->msg, "blobs: cannot allocate a batch of %lld x %lld features",
                     (long long)b->B, (long long)b->D);
            goto fail;
        }
        return s;
    }
    if (!batch_fits(b->B, b->T, 12, d))
        goto fail;
    if (!(b->tokens = calloc((size_t)(b->B * b->T), sizeof *b->tokens)) ||
        !(b->targets = calloc((size_t)(b->B * b->T), sizeof *b->targets)) ||
        !(b->mask = calloc((size_t)(b->B * b->T), sizeof *b->mask))) {
        snprintf(d->msg, sizeof d->msg,
                 "data %s: cannot allocate a batch of %lld x %lld tokens (12 bytes each)",
                 kinds[kind], (long long)b->B, (long long)b->T);
        goto fail;
    }
    return s;
fail:
    rt_data_close(s);
    return NULL;
}

void rt_data_close(DataSource *s)
{
    if (!s)
        return;
    if (s->kind == SRC_TENSORS)
        rt_tensors_close(s->ts, &s->b);
    free(s->path);
    if (s->map)
        munmap(s->map, s->maplen);
    free(s->centers);
    free(s->pairs);
    free(s->b.tokens);
    free(s->b.targets);
    free(s->b.mask);
    free(s->b.x);
    free(s->b.y);
    free(s);
}

bool rt_data_has_val(const DataSource *s)
{
    return s->kind == SRC_TENSORS ? rt_tensors_has_val(s->ts) : s->c.val_fraction > 0;
}

void rt_data_feed(Exec *e, const Graph *g, const DataBatch *b, int64_t row0)
{
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_INPUT)
            continue;
        const void *src = NULL;
        if (b->narr) {
            for (int k = 0; k < b->narr; k++)
                if (strcmp(b->arr[k].name, t->name) == 0)
                    src = b->arr[k].data + row0 * b->arr[k].row_bytes;
        } else if (strcmp(t->name, "tokens") == 0 && b->tokens) {
            src = b->tokens + row0 * b->T;
        } else if (strcmp(t->name, "targets") == 0 && b->targets) {
            src = b->targets + row0 * b->T;
        } else if (strcmp(t->name, "mask") == 0 && b->mask) {
            src = b->mask + row0 * b->T;
        } else if (strcmp(t->name, "x") == 0 && b->x) {
            src = b->x + row0 * b->D;
        } else if (strcmp(t->name, "y") == 0 && b->y) {
            src = b->y + row0;
        }
        if (src)
            rt_exec_write(e, t->id, src);
    }
}

const DataBatch *rt_data_batch(DataSource *s, DataSplit split, int64_t index)
{
    if (split == DATA_VAL && !rt_data_has_val(s))
        die("rt_data_batch: validation batch requested with val_fraction 0");
    switch (s->kind) {
    case SRC_TENSORS: rt_tensors_fill(s->ts, &s->b, split, index); break;
    case SRC_ADDITION: fill_addition(s, split, index); break;
    case SRC_TEXT:
    case SRC_TOKENS: fill_windows(s, split, index); break;
    case SRC_BLOBS: fill_blobs(s, split, index); break;
    }
    return &s->b;
}

/* ---- the whole of a split, in order (kiln eval, kiln predict) ---- */

/* The symbols [lo, hi) of split in a text or tokens file. */
static void split_span(const DataSource *s, DataSplit split, int64_t *lo, int64_t *hi)
{
    *lo = split == DATA_TRAIN ? 0 : s->ntrain;
    *hi = split == DATA_TRAIN ? s->ntrain : s->n;
}

int64_t rt_data_examples(DataSource *s, DataSplit split, bool partial, int64_t *left_out,
                         Diag *d)
{
    *left_out = 0;
    switch (s->kind) {
    case SRC_TENSORS: return rt_tensors_examples(s->ts, split);
    case SRC_TEXT:
    case SRC_TOKENS: {
        int64_t lo, hi, T = s->b.T;
        split_span(s, split, &lo, &hi);
        int64_t targets = hi - lo - 1, full = targets / T, rest = targets % T;
        s->partial = partial && rest > 0;
        if (!s->partial)
            *left_out = rest;
        return full + s->partial;
    }
    case SRC_ADDITION: {
        if (s->c.digits > 3) {
            snprintf(d->msg, sizeof d->msg,
                     "addition with %d digits: the held-out problems are too many to list "
                     "(expected digits <= 3, at most 10^6 problems, for a whole split; "
                     "evaluate eval_batches random batches with kiln train instead)",
                     s->c.digits);
            return -1;
        }
        if (s->pairs_split != (int)split) {
            int64_t lim = pow10i(s->c.digits);
            free(s->pairs);
            s->pairs = xmalloc((size_t)(lim * lim) * sizeof *s->pairs);
            s->npairs = 0;
            for (int64_t a = 0; a < lim; a++)
                for (int64_t b = 0; b < lim; b++)
                    if (rt_addition_is_val(s->c.digits, a, b, s->c.val_fraction) ==
                        (split == DATA_VAL))
                        s->pairs[s->npairs++] = a * lim + b;
            s->pairs_split = (int)split;
        }
        return s->npairs;
    }
    case SRC_BLOBS:
        snprintf(d->msg, sizeof d->msg,
                 "data blobs draws its points at random and has no whole split to go "
                 "through (expected data addition, text, tokens or tensors)");
        return -1;
    }
    return -1;
}

/* Copies row `from` of every array of b over row `to`. */
static void copy_row(DataBatch *b, int64_t from, int64_t to)
{
    int64_t T = b->T;
    if (b->tokens) {
        memcpy(b->tokens + to * T, b->tokens + from * T, (size_t)T * sizeof *b->tokens);
        memcpy(b->targets + to * T, b->targets + from * T, (size_t)T * sizeof *b->targets);
        memcpy(b->mask + to * T, b->mask + from * T, (size_t)T * sizeof *b->mask);
    }
    if (b->x)
        memcpy(b->x + to * b->D, b->x + from * b->D, (size_t)b->D * sizeof *b->x);
    if (b->y && !b->narr)
        b->y[to] = b->y[from];
    for (int k = 0; k < b->narr; k++) {
        DataArr *a = &b->arr[k];
        memcpy(a->data + to * a->row_bytes, a->data + from * a->row_bytes, (size_t)a->row_bytes);
    }
}

const DataBatch *rt_data_range(DataSource *s, DataSplit split, int64_t first, int64_t n)
{
    DataBatch *b = &s->b;
    if (n < 1 || n > b->B)
        die("rt_data_range: %lld rows in a batch of %lld", (long long)n, (long long)b->B);
    switch (s->kind) {
    case SRC_TENSORS: rt_tensors_range(s->ts, b, split, first, n); break;
    case SRC_TEXT:
    case SRC_TOKENS: {
        int64_t lo, hi, T = b->T;
        split_span(s, split, &lo, &hi);
        for (int64_t r = 0; r < n; r++) {
            int64_t p = lo + (first + r) * T;
            for (int64_t t = 0; t < T; t++) {
                int64_t i = p + t;
                bool in = i + 1 < hi; /* the target exists: a partial window's end is masked */
                b->tokens[r * T + t] = symbol_at(s, in ? i : hi - 2);
                b->targets[r * T + t] = symbol_at(s, in ? i + 1 : hi - 1);
                b->mask[r * T + t] = in ? 1.0f : 0.0f;
            }
        }
        break;
    }
    case SRC_ADDITION: {
        int nd = s->c.digits;
        int64_t lim = pow10i(nd), T = b->T;
        int32_t seq[3 * 9 + 4];
        int len = 3 * nd + 4;
        if (s->pairs_split != (int)split)
            die("rt_data_range: addition split not listed (rt_data_examples first)");
        for (int64_t r = 0; r < n; r++) {
            int64_t pr = s->pairs[first + r];
            rt_addition_encode(nd, pr / lim, pr % lim, seq);
            for (int64_t t = 0; t < T; t++) {
                b->tokens[r * T + t] = t < len ? seq[t] : ADD_PAD;
                b->targets[r * T + t] = t + 1 < len ? seq[t + 1] : ADD_PAD;
                b->mask[r * T + t] = (t + 1 >= 2 * nd + 2 && t + 1 <= 3 * nd + 3) ? 1.0f : 0.0f;
            }
        }
        break;
    }
    case SRC_BLOBS: die("rt_data_range: blobs has no whole split");
    }
    for (int64_t r = n; r < b->B; r++) {
        copy_row(b, 0, r);
        if (b->mask)
            memset(b->mask + r * b->T, 0, (size_t)b->T * sizeof *b->mask);
    }
    return b;
}
