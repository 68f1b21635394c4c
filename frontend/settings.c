/* settings.c - the training settings: one table of TrainCfg keys drives
 * train{}, --set and printing; the Model's owned strings. */
#include "fe_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- TrainCfg: one table drives train{}, --set and printing ------------- */

/* Ranges: integers from lo to hi; numbers from lo to hi, an end excluded
 * where lo_open / hi_open say so (INFINITY: no bound, but always finite). */
#define BIG 1e9 /* steps and step counts: a billion steps is past any real run */
#define TKI(name, def, lo, hi) {#name, FE_TT_INT, offsetof(TrainCfg, name), def, NULL, lo, hi, 0, 0}
#define TKD(name, def, lo, hi, lo_open, hi_open)                                              \
    {#name, FE_TT_DBL, offsetof(TrainCfg, name), def, NULL, lo, hi, lo_open, hi_open}
#define TK(name, type, def) {#name, type, offsetof(TrainCfg, name), def, NULL, 0, 0, 0, 0}
#define TKS(name, def, oneof) {#name, FE_TT_STR, offsetof(TrainCfg, name), def, oneof, 0, 0, 0, 0}
static const FeTrainKey train_keys[] = {
    TKI(steps, "1000", 0, BIG),
    TKD(lr, "0.001", 0, INFINITY, 0, 0),
    TKD(min_lr, "0", 0, INFINITY, 0, 0),
    TKI(warmup, "0", 0, BIG),
    TKS(lr_schedule, "cosine", "cosine, linear, constant, wsd"),
    TKD(decay_fraction, "0.2", 0, 1, 1, 0),
    TKS(optimizer, "adamw", "adamw, sgd, lion, adafactor"),
    TKD(beta1, "0.9", 0, 1, 0, 1),
    TKD(beta2, "0.95", 0, 1, 0, 1),
    TKD(eps, "1e-08", 0, INFINITY, 0, 0),
    TKD(weight_decay, "0", 0, INFINITY, 0, 0),
    TKD(grad_clip, "1", -INFINITY, INFINITY, 0, 0),
    TKD(momentum, "0", 0, 1, 0, 1),
    TKS(nesterov, "false", "true, false"),
    TKD(lion_beta1, "0.9", 0, 1, 0, 1),
    TKD(lion_beta2, "0.99", 0, 1, 0, 1),
    TK(seed, FE_TT_U64, "1337"),
    TKI(batch, "0", 0, BIG),
    TKS(data, NULL, "addition, text, tokens, blobs, tensors"),
    TK(data_path, FE_TT_STR, NULL),
    TK(val_path, FE_TT_STR, NULL),
    TKS(shuffle, "true", "true, false"),
    TKI(digits, "3", 1, 9),
    TKD(val_fraction, "0.1", 0, 1, 0, 1),
    TKI(eval_every, "0", 0, BIG),
    TKI(eval_batches, "10", 1, BIG),
    TKI(log_every, "0", 0, BIG),
    TKI(checkpoint_every, "0", 0, BIG),
    TK(checkpoint, FE_TT_STR, NULL),
    TK(memory_budget, FE_TT_BYTES, "0"),
    TKS(precision, "f32", "f32, bf16"),
    TKS(tf32, "false", "true, false"),
    TKS(cuda_graph, "false", "true, false"),
    TKD(bucket_mb, "4", 0, 1048576, 1, 0),
    TKI(grad_accum, "1", 1, 1024),
    TKI(zero, "0", 0, 1),
    TKI(tp, "1", 1, 4096),
    TKS(sequence_parallel, "false", "true, false"),
    TKS(tp_overlap, "true", "true, false"),
    TKS(shard, "script", "script, auto"),
    TKI(pp, "1", 1, 4096),
    TKI(micro_batches, "0", 0, 1024),
    TKS(schedule, "1f1b", "1f1b, gpipe, zb-h1"),
    TKD(comm_timeout, "60", 0, 1e6, 1, 0),
    TKS(on_nonfinite, "stop", "stop, skip"),
    TKI(sample_every, "0", 0, BIG),
    TK(sample_prompt, FE_TT_STR, NULL),
    TKI(sample_tokens, "64", 1, 1 << 20),
    TK(early_stop_metric, FE_TT_STR, NULL),
    TKI(early_stop_patience, "3", 1, BIG),
    TKD(early_stop_min_delta, "0", 0, INFINITY, 0, 0),
    TKS(early_stop_mode, "auto", "auto, min, max"),
    TKS(keep_best, "false", "true, false"),
};
#undef TK
#undef TKS
#undef TKI
#undef TKD
#undef BIG
#define NTRAIN_KEYS ((int)(sizeof train_keys / sizeof train_keys[0]))

const FeTrainKey *fe_train_key(const char *name)
{
    for (int i = 0; i < NTRAIN_KEYS; i++)
        if (strcmp(train_keys[i].name, name) == 0)
            return &train_keys[i];
    return NULL;
}

const char *fe_train_key_list(void)
{
    /* every key fits: names of at most 32 characters, and the tables' */
    static char buf[(NTRAIN_KEYS + 3) * 34 + 64];
    if (!buf[0]) {
        size_t k = 0;
        for (int i = 0; i < NTRAIN_KEYS && k < sizeof buf; i++)
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", i ? ", " : "",
                                  train_keys[i].name);
        if (k < sizeof buf) /* tables: frontend.c */
            snprintf(buf + k, sizeof buf - k, ", param_groups, frozen, early_stop");
    }
    return buf;
}

typedef struct FeOwned {
    struct FeOwned *next;
    char s[];
} FeOwned;

static const char *own_str(Model *m, const char *s)
{
    size_t n = strlen(s);
    FeOwned *o = xmalloc(sizeof(FeOwned) + n + 1);
    memcpy(o->s, s, n + 1);
    o->next = m->priv->owned;
    m->priv->owned = o;
    return o->s;
}

bool fe_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out, char *why, size_t n)
{
    bool ok = false;
    int64_t v = 0;
    if (s && *s && !isspace((unsigned char)*s)) {
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (!*end) {
            ok = errno == 0; /* ERANGE: beyond int64, so beyond hi or lo */
            v = x;
        } else if (!strpbrk(s, "xXpP")) { /* "1e6", "2.0"; not hex */
            errno = 0;
            double d = strtod(s, &end);
            if (!*end && !errno && isfinite(d) && d == floor(d) && fabs(d) < 9.2e18) {
                ok = true;
                v = (int64_t)d;
            }
        }
    }
    if (ok && v >= lo && v <= hi) {
        *out = v;
        return true;
    }
    if (s && *s)
        snprintf(why, n, "expected an integer from %lld to %lld, got %s", (long long)lo,
                 (long long)hi, s);
    else
        snprintf(why, n, "expected an integer from %lld to %lld, got an empty value",
                 (long long)lo, (long long)hi);
    return false;
}

#define U64_MAX_TEXT "18446744073709551615"

/* What key k accepts, for messages: "an integer from 1 to 1024", "a number
 * in [0, 1)", "a finite number >= 0". */
static const char *range_text(const FeTrainKey *k, char *buf, size_t n)
{
    switch (k->type) {
    case FE_TT_INT:
        snprintf(buf, n, "an integer from %.0f to %.0f", k->lo, k->hi);
        break;
    case FE_TT_U64:
        snprintf(buf, n, "an integer from 0 to " U64_MAX_TEXT);
        break;
    case FE_TT_BYTES:
        snprintf(buf, n, "a byte count such as 512MiB or 2GiB (a whole number >= 0)");
        break;
    case FE_TT_DBL:
        if (isinf(k->lo) && isinf(k->hi))
            snprintf(buf, n, "a finite number");
        else if (isinf(k->hi))
            snprintf(buf, n, "a finite number %s %.10g", k->lo_open ? ">" : ">=", k->lo);
        else
            snprintf(buf, n, "a number in %c%.10g, %.10g%c", k->lo_open ? '(' : '[', k->lo, k->hi,
                     k->hi_open ? ')' : ']');
        break;
    case FE_TT_STR:
        snprintf(buf, n, "a string");
        break;
    }
    return buf;
}

static bool dbl_in_range(const FeTrainKey *k, double d)
{
    return isfinite(d) && (k->lo_open ? d > k->lo : d >= k->lo) &&
           (k->hi_open ? d < k->hi : d <= k->hi);
}

/* Stores a number into key k. Returns false with why set. */
bool fe_train_store_num(TrainCfg *t, const FeTrainKey *k, double d, char *why, size_t n)
{
    char *p = (char *)t + k->off, r[128];
    switch (k->type) {
    case FE_TT_INT:
        if (d != floor(d) || !(d >= k->lo && d <= k->hi))
            break;
        *(int64_t *)p = (int64_t)d;
        return true;
    case FE_TT_BYTES:
        if (d != floor(d) || !(d >= 0 && d <= 9.2e18))
            break;
        *(int64_t *)p = (int64_t)d;
        return true;
    case FE_TT_U64:
        if (d != floor(d) || !(d >= 0 && d < 18446744073709551616.0))
            break;
        *(uint64_t *)p = (uint64_t)d;
        return true;
    case FE_TT_DBL:
        if (!dbl_in_range(k, d))
            break;
        *(double *)p = d;
        return true;
    case FE_TT_STR:
        snprintf(why, n, "expected a string, got the number %.17g", d);
        return false;
    }
    snprintf(why, n, "expected %s, got %.17g", range_text(k, r, sizeof r), d);
    return false;
}

bool fe_train_store_int(TrainCfg *t, const FeTrainKey *k, int64_t v, char *why, size_t n)
{
    char *p = (char *)t + k->off, r[128];
    switch (k->type) {
    case FE_TT_INT:
        if (!((double)v >= k->lo && (double)v <= k->hi))
            break;
        *(int64_t *)p = v;
        return true;
    case FE_TT_BYTES:
        if (v < 0)
            break;
        *(int64_t *)p = v;
        return true;
    case FE_TT_U64:
        if (v < 0)
            break;
        *(uint64_t *)p = (uint64_t)v;
        return true;
    case FE_TT_DBL:
        return fe_train_store_num(t, k, (double)v, why, n);
    case FE_TT_STR:
        snprintf(why, n, "expected a string, got the number %lld", (long long)v);
        return false;
    }
    snprintf(why, n, "expected %s, got %lld", range_text(k, r, sizeof r), (long long)v);
    return false;
}

/* Stores text (from --set, or a Lua string) into key k. from_set: numeric
 * keys parse the text as a number; otherwise only string and byte-size keys
 * take strings. Integers never wrap: a value out of the key's range is an
 * error, as are "1.5", "4x", "", "nan" and "inf" for an integer. */
bool fe_train_store_text(Model *m, TrainCfg *t, const FeTrainKey *k, const char *s, bool from_set,
                             char *why, size_t n)
{
    char *p = (char *)t + k->off, r[128];
    bool eval_batches = strcmp(k->name, "eval_batches") == 0;
    if (eval_batches && strcmp(s, "all") == 0) { /* the whole validation split */
        *(int64_t *)p = TRAIN_EVAL_ALL;
        return true;
    }
    if (k->type == FE_TT_STR) {
        if (k->oneof) {
            size_t len = strlen(s);
            const char *hit = strstr(k->oneof, s);
            while (hit && !(len && (hit == k->oneof || hit[-1] == ' ') &&
                            (hit[len] == ',' || hit[len] == 0)))
                hit = strstr(hit + 1, s);
            if (!hit) {
                snprintf(why, n, "expected one of %s, got '%s'", k->oneof, s);
                return false;
            }
        }
        *(const char **)p = m ? own_str(m, s) : intern(s); /* kiln opt: no Model */
        return true;
    }
    if (k->type == FE_TT_BYTES) {
        int64_t b = ir_parse_bytes(s);
        if (b < 0) {
            snprintf(why, n, "expected a byte count such as 512MiB or 2GiB, got '%s'", s);
            return false;
        }
        *(int64_t *)p = b;
        return true;
    }
    if (!from_set) {
        if (eval_batches) {
            snprintf(why, n,
                     "expected an integer from %.0f to %.0f or \"all\", got the string '%s'",
                     k->lo, k->hi, s);
            return false;
        }
        snprintf(why, n, "expected a number, got the string '%s'", s);
        return false;
    }
    if (k->type == FE_TT_INT) {
        int64_t v;
        if (!fe_parse_int(s, (int64_t)k->lo, (int64_t)k->hi, &v, why, n)) {
            if (eval_batches) /* "expected an integer from 1 to 1000000000 or all, got x" */
                snprintf(why, n, "expected an integer from %.0f to %.0f or \"all\", got %s",
                         k->lo, k->hi, *s ? s : "an empty value");
            return false;
        }
        *(int64_t *)p = v;
        return true;
    }
    char *end;
    if (k->type == FE_TT_U64) {
        int64_t v;
        errno = 0;
        if (isdigit((unsigned char)*s)) {
            unsigned long long u = strtoull(s, &end, 10);
            if (!*end && !errno) {
                *(uint64_t *)p = u;
                return true;
            }
        }
        if (!fe_parse_int(s, 0, INT64_MAX, &v, why, n)) {
            snprintf(why, n, "expected %s, got %s", range_text(k, r, sizeof r),
                     *s ? s : "an empty value");
            return false;
        }
        *(uint64_t *)p = (uint64_t)v;
        return true;
    }
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || isspace((unsigned char)*s)) {
        snprintf(why, n, "expected %s, got %s", range_text(k, r, sizeof r),
                 *s ? s : "an empty value");
        return false;
    }
    if (!dbl_in_range(k, d)) {
        snprintf(why, n, "expected %s, got %s", range_text(k, r, sizeof r), s);
        return false;
    }
    *(double *)p = d;
    return true;
}

void fe_train_defaults(TrainCfg *t)
{
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NTRAIN_KEYS; i++) {
        const FeTrainKey *k = &train_keys[i];
        char *p = (char *)t + k->off;
        if (k->type == FE_TT_STR) {
            *(const char **)p = k->def;
            continue;
        }
        char why[128];
        if (!fe_train_store_text(NULL, t, k, k->def, true, why, sizeof why))
            die("train default %s: %s", k->name, why);
    }
}

static void print_train_value(const TrainCfg *t, const FeTrainKey *k, FILE *f)
{
    const char *p = (const char *)t + k->off;
    switch (k->type) {
    case FE_TT_INT:
    case FE_TT_BYTES:
        if (strcmp(k->name, "eval_batches") == 0 && *(const int64_t *)p == TRAIN_EVAL_ALL) {
            fprintf(f, "all");
            break;
        }
        fprintf(f, "%lld", (long long)*(const int64_t *)p);
        break;
    case FE_TT_U64:
        fprintf(f, "%llu", (unsigned long long)*(const uint64_t *)p);
        break;
    case FE_TT_DBL:
        fprintf(f, "%.10g", *(const double *)p);
        break;
    case FE_TT_STR:
        fprintf(f, "%s", *(const char *const *)p ? *(const char *const *)p : "none");
        break;
    }
}

void fe_print_settings(const Model *m, FILE *f)
{
    fprintf(f, "# config\n");
    for (int i = 0; m->priv && i < m->priv->nconfig; i++)
        fprintf(f, "%s = %s\n", m->priv->config[i].key, m->priv->config[i].value);
    fprintf(f, "# train\n");
    for (int i = 0; i < NTRAIN_KEYS; i++) {
        fprintf(f, "%s = ", train_keys[i].name);
        print_train_value(&m->train, &train_keys[i], f);
        fputc('\n', f);
    }
    /* train{param_groups, frozen} as matched: the params they changed */
    if (m->train.nparam_opts)
        fprintf(f, "# params (param_groups, frozen)\n");
    for (int i = 0; i < m->train.nparam_opts; i++) {
        const PassParamOpt *o = &m->train.param_opts[i];
        if (o->frozen) {
            fprintf(f, "%s = frozen\n", o->name);
            continue;
        }
        fprintf(f, "%s = lr_scale %.10g, weight_decay ", o->name, o->lr_scale);
        if (isnan(o->weight_decay))
            fprintf(f, "default\n");
        else
            fprintf(f, "%.10g\n", o->weight_decay);
    }
}

const char *fe_config_get(const Model *m, const char *key)
{
    for (int i = 0; m->priv && i < m->priv->nconfig; i++)
        if (strcmp(m->priv->config[i].key, key) == 0)
            return m->priv->config[i].value;
    return NULL;
}

void fe_model_free(Model *m)
{
    if (!m)
        return;
    ir_free(m->g);
    ir_free(m->eval_g);
    free(m->warnings);
    free(m->pads);
    struct ModelPriv *p = m->priv;
    if (p) {
        for (int i = 0; i < p->nconfig; i++) {
            free((char *)p->config[i].key);
            free((char *)p->config[i].value);
        }
        free(p->config);
        vec_free(&p->train_outs);
        free(p->param_opts);
        for (FeOwned *o = p->owned, *next; o; o = next) {
            next = o->next;
            free(o);
        }
        free(p);
    }
    free(m);
}

