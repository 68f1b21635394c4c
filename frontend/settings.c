/* settings.c - the training settings: one table of TrainCfg keys drives
 * train{}, --set and printing; byte sizes; the Model's owned strings. */
#include "frontend.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- TrainCfg: one table drives train{}, --set and printing ------------- */

#define TK(name, type, def) {#name, type, offsetof(TrainCfg, name), def, NULL}
#define TKS(name, def, oneof) {#name, FE_TT_STR, offsetof(TrainCfg, name), def, oneof}
static const FeTrainKey train_keys[] = {
    TK(steps, FE_TT_INT, "1000"),
    TK(lr, FE_TT_DBL, "0.001"),
    TK(min_lr, FE_TT_DBL, "0"),
    TK(warmup, FE_TT_INT, "0"),
    TK(beta1, FE_TT_DBL, "0.9"),
    TK(beta2, FE_TT_DBL, "0.95"),
    TK(eps, FE_TT_DBL, "1e-08"),
    TK(weight_decay, FE_TT_DBL, "0"),
    TK(grad_clip, FE_TT_DBL, "1"),
    TK(seed, FE_TT_U64, "1337"),
    TK(batch, FE_TT_INT, "0"),
    TKS(data, NULL, "addition, text, tokens, blobs"),
    TK(data_path, FE_TT_STR, NULL),
    TK(digits, FE_TT_INT, "3"),
    TK(val_fraction, FE_TT_DBL, "0.1"),
    TK(eval_every, FE_TT_INT, "0"),
    TK(eval_batches, FE_TT_INT, "10"),
    TK(log_every, FE_TT_INT, "1"),
    TK(checkpoint_every, FE_TT_INT, "0"),
    TK(checkpoint, FE_TT_STR, NULL),
    TK(memory_budget, FE_TT_BYTES, "0"),
    TKS(precision, "f32", "f32, bf16"),
    TKS(tf32, "false", "true, false"),
    TKS(cuda_graph, "false", "true, false"),
    TK(bucket_mb, FE_TT_DBL, "4"),
    TK(grad_accum, FE_TT_INT, "1"),
    TK(comm_timeout, FE_TT_DBL, "60"),
    TKS(on_nonfinite, "stop", "stop, skip"),
};
#undef TK
#undef TKS
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
    static char buf[512];
    if (!buf[0]) {
        size_t k = 0;
        for (int i = 0; i < NTRAIN_KEYS; i++)
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", i ? ", " : "",
                                  train_keys[i].name);
    }
    return buf;
}

int64_t fe_parse_bytes(const char *s)
{
    if (!s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0 || !isfinite(v))
        return -1;
    while (*end == ' ')
        end++;
    static const struct {
        const char *suf;
        double mul;
    } sufs[] = {{"", 1},
                {"B", 1},
                {"K", 1e3},
                {"KB", 1e3},
                {"M", 1e6},
                {"MB", 1e6},
                {"G", 1e9},
                {"GB", 1e9},
                {"T", 1e12},
                {"TB", 1e12},
                {"KiB", 1024.0},
                {"MiB", 1024.0 * 1024},
                {"GiB", 1024.0 * 1024 * 1024},
                {"TiB", 1024.0 * 1024 * 1024 * 1024}};
    for (size_t i = 0; i < sizeof sufs / sizeof sufs[0]; i++)
        if (strcmp(end, sufs[i].suf) == 0) {
            double b = v * sufs[i].mul;
            if (b > 9.2e18)
                return -1;
            return (int64_t)llround(b);
        }
    return -1;
}

typedef struct Owned {
    struct Owned *next;
    char s[];
} Owned;

static const char *own_str(Model *m, const char *s)
{
    size_t n = strlen(s);
    Owned *o = xmalloc(sizeof(Owned) + n + 1);
    memcpy(o->s, s, n + 1);
    o->next = m->owned_;
    m->owned_ = o;
    return o->s;
}

/* Stores a number into key k. Returns false with why set. */
bool fe_train_store_num(TrainCfg *t, const FeTrainKey *k, double d, char *why, size_t n)
{
    char *p = (char *)t + k->off;
    switch (k->type) {
    case FE_TT_INT:
    case FE_TT_BYTES:
        if (d != floor(d) || fabs(d) > 9e18) {
            snprintf(why, n, "expected an integer, got %g", d);
            return false;
        }
        if (d < 0) {
            snprintf(why, n, "expected a non-negative integer, got %g", d);
            return false;
        }
        *(int64_t *)p = (int64_t)d;
        return true;
    case FE_TT_U64:
        if (d != floor(d) || d < 0 || d > 1.8e19) {
            snprintf(why, n, "expected a non-negative integer, got %g", d);
            return false;
        }
        *(uint64_t *)p = (uint64_t)d;
        return true;
    case FE_TT_DBL:
        *(double *)p = d;
        return true;
    case FE_TT_STR:
        snprintf(why, n, "expected a string, got the number %g", d);
        return false;
    }
    return false;
}

/* Stores text (from --set, or a Lua string) into key k. from_set: numeric
 * keys parse the text as a number; otherwise only string and byte-size keys
 * take strings. */
bool fe_train_store_text(Model *m, TrainCfg *t, const FeTrainKey *k, const char *s, bool from_set,
                             char *why, size_t n)
{
    char *p = (char *)t + k->off;
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
        *(const char **)p = own_str(m, s);
        return true;
    }
    if (k->type == FE_TT_BYTES) {
        int64_t b = fe_parse_bytes(s);
        if (b < 0) {
            snprintf(why, n, "expected a byte count such as 512MiB or 2GiB, got '%s'", s);
            return false;
        }
        *(int64_t *)p = b;
        return true;
    }
    if (!from_set) {
        snprintf(why, n, "expected a number, got the string '%s'", s);
        return false;
    }
    char *end;
    errno = 0;
    double d;
    if (k->type == FE_TT_U64 || k->type == FE_TT_INT) {
        long long v = strtoll(s, &end, 0);
        d = (double)v;
        if (k->type == FE_TT_U64 && *s != '-' && end != s && !*end) {
            *(uint64_t *)p = strtoull(s, NULL, 0);
            return true;
        }
    } else {
        d = strtod(s, &end);
    }
    if (end == s || *end || errno) {
        snprintf(why, n, "expected %s, got '%s'", k->type == FE_TT_DBL ? "a number" : "an integer",
                 s);
        return false;
    }
    return fe_train_store_num(t, k, d, why, n);
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
    for (int i = 0; i < m->nconfig; i++)
        fprintf(f, "%s = %s\n", m->config[i].key, m->config[i].value);
    fprintf(f, "# train\n");
    for (int i = 0; i < NTRAIN_KEYS; i++) {
        fprintf(f, "%s = ", train_keys[i].name);
        print_train_value(&m->train, &train_keys[i], f);
        fputc('\n', f);
    }
}

const char *fe_config_get(const Model *m, const char *key)
{
    for (int i = 0; i < m->nconfig; i++)
        if (strcmp(m->config[i].key, key) == 0)
            return m->config[i].value;
    return NULL;
}

void fe_model_free(Model *m)
{
    if (!m)
        return;
    ir_free(m->g);
    ir_free(m->eval_g);
    for (int i = 0; i < m->nconfig; i++) {
        free((char *)m->config[i].key);
        free((char *)m->config[i].value);
    }
    free(m->config);
    for (Owned *o = m->owned_, *next; o; o = next) {
        next = o->next;
        free(o);
    }
    free(m);
}

