/* sample.c - kiln sample (train.h's contract): text from a language model
 * with saved weights, one token at a time, through a compiled prefill and
 * one-token step with a KV cache (the decode graphs), or by rerunning the
 * evaluation graph over the window at every token. */
#include "train_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One compiled graph that maps tokens [B,S] (and a position) to logits
 * [B,S,V]. */
typedef struct {
    Graph *g;
    Exec *e;
    int tok, pos, logits; /* tensor ids in g (-1: absent) */
    int64_t S;
    float *out;           /* B*S*Vl floats: the last run's logits */
} Step;

typedef struct {
    const Model *m;
    const SampleOpts *o;
    int64_t B, T, V;      /* batch, window, real vocabulary (logits' last dim) */
    void **vals;          /* host params by m->g's ids */
    Step full;            /* the evaluation graph: tokens [B,T] */
    Step pre, one;        /* decode: prefill (S = T, pos 0) and one-token step */
    bool kv;
    bool checked;         /* the first one-token step was checked */
    int32_t *tokbuf;      /* B*T */
    char why[512];        /* why the KV cache is not used */
} Smp;

static void step_free(Step *s)
{
    if (s->e)
        rt_exec_destroy(s->e);
    if (s->g)
        ir_free(s->g);
    free(s->out);
    *s = (Step){.tok = -1, .pos = -1, .logits = -1};
}

static void smp_free(Smp *f)
{
    if (f->vals) {
        for (int i = 0; i < f->m->g->t.n; i++)
            free(f->vals[i]);
        free(f->vals);
    }
    step_free(&f->full);
    step_free(&f->pre);
    step_free(&f->one);
    free(f->tokbuf);
}

/* Compiles g (owned from here) as kiln eval compiles its graph, writes the
 * params from f->vals by name and zeroes every state (the KV caches).
 * attn: run the attention passes (the evaluation graph; the decode graphs'
 * masked attention over the cache is left to the generic kernels). */
static bool step_build(Smp *f, Step *s, Graph *g, bool attn, Diag *d)
{
    const Model *m = f->m;
    s->g = g;
    PassOpts po;
    rt_pass_opts(&m->train, NULL, &po);
    if ((attn && (!pass_attention(g, &po, d) || !pass_attention_layout(g, &po, d))) ||
        !pass_simplify(g, &po, d) || !pass_fuse(g, &po, d) || !pass_schedule(g, &po, d))
        return false;
    char err[1024];
    if (!ir_verify(g, err, sizeof err))
        die("sample graph invalid after simplify/schedule: %s", err);
    ExecOpts eo = {.device = f->o->device, .threads = f->o->threads,
                   .cache_dir = f->o->cache_dir, .verbose = f->o->verbose,
                   .precision = m->train.precision,
                   .tf32 = m->train.tf32 && strcmp(m->train.tf32, "true") == 0};
    if (!(s->e = rt_exec_create(g, &eo, d)))
        return false;
    s->tok = ir_find_tensor(g, "tokens");
    s->pos = ir_find_tensor(g, "decode.pos");
    s->logits = ir_find_output(g, "logits");
    if (s->tok < 0 || s->logits < 0)
        die("sample: graph lost its tokens input or logits output");
    s->S = g->t.v[s->tok].s.dim[1];
    s->out = xmalloc((size_t)shape_numel(&g->t.v[s->logits].s) * sizeof(float) + 1);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind == TK_PARAM) {
            int src = ir_find_tensor(m->g, t->name);
            if (src < 0 || !f->vals[src])
                die("sample: param %s of a sample graph missing from the model", t->name);
            rt_exec_write(s->e, i, f->vals[src]);
        } else if (t->kind == TK_STATE || (t->kind == TK_INPUT && i != s->tok && i != s->pos)) {
            void *z = xcalloc(1, (size_t)shape_bytes(&t->s) + 1); /* caches; targets */
            rt_exec_write(s->e, i, z);
            free(z);
        }
    }
    return true;
}

/* Runs s on tokens [B, S] (tokbuf, rows of S) at position pos; its logits
 * into s->out. */
static bool step_run(Smp *f, Step *s, int64_t pos, Diag *d)
{
    rt_exec_write(s->e, s->tok, f->tokbuf);
    if (s->pos >= 0) {
        int32_t p = (int32_t)pos;
        rt_exec_write(s->e, s->pos, &p);
    }
    if (!rt_exec_run(s->e, f->o->seed, 0, d))
        return false;
    rt_exec_read_f32(s->e, &s->g->t.v[s->logits], s->out);
    return true;
}

/* After a prefill: its caches (the states kv_cache.N) into the one-token
 * step's executor, which keeps its own. */
static void caches_to_step(Smp *f)
{
    for (int i = 0; i < f->pre.g->t.n; i++) {
        const Tensor *t = &f->pre.g->t.v[i];
        if (t->kind != TK_STATE)
            continue;
        int j = ir_find_tensor(f->one.g, t->name);
        if (j < 0 || !shape_eq(&t->s, &f->one.g->t.v[j].s))
            die("sample: cache %s of the prefill missing from the one-token step", t->name);
        void *buf = xmalloc((size_t)shape_bytes(&t->s));
        rt_exec_read(f->pre.e, i, buf);
        rt_exec_write(f->one.e, j, buf);
        free(buf);
    }
}

/* The window of seq[0..n) that predicts token n: its last min(n, T)
 * tokens into tokbuf row b (padded with 0: causal, the padding is never
 * read by the positions before it); returns the index of its last token. */
static int64_t window(Smp *f, int64_t b, const int32_t *seq, int64_t n, int64_t S)
{
    int64_t w = n < f->T ? n : f->T;
    int32_t *row = f->tokbuf + b * S;
    memset(row, 0, (size_t)S * sizeof *row);
    memcpy(row, seq + (n - w), (size_t)w * sizeof *row);
    return w - 1;
}

/* ---- choosing the next token ---- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double u01(uint64_t *st)
{
    *st = mix64(*st);
    return (double)(*st >> 11) * (1.0 / 9007199254740992.0);
}

/* Largest logit first, then the lower index. ctx: the logits. */
static int by_logit(const void *a, const void *b, void *ctx)
{
    const float *lg = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = lg[i], y = lg[j];
    if (x != y)
        return x > y ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* The next token from a row of V logits: the argmax (the first of ties)
 * at temperature 0 or top_k 1; else a draw from softmax(logits /
 * temperature) over the top_k largest (0: all), then over the smallest
 * prefix of those, largest first, whose probability reaches top_p. */
static int32_t pick(const float *lg, int64_t V, const SampleOpts *o, uint64_t *rng, int32_t *idx,
                    double *p)
{
    if (o->temperature == 0 || o->top_k == 1)
        return (int32_t)rt_argmax(lg, V);
    int64_t n = V;
    for (int64_t i = 0; i < V; i++)
        idx[i] = (int32_t)i;
    if (o->top_k > 0 || o->top_p < 1) {
        qsort_r(idx, (size_t)V, sizeof *idx, by_logit, (void *)lg);
        if (o->top_k > 0 && o->top_k < n)
            n = o->top_k;
    }
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, lg[idx[i]]);
    for (int64_t i = 0; i < n; i++)
        sum += p[i] = exp((lg[idx[i]] - mx) / o->temperature);
    if (o->top_p < 1) {
        double c = 0;
        int64_t k = 0;
        while (k < n && c < o->top_p * sum)
            c += p[k++];
        n = k > 0 ? k : 1;
        sum = c > 0 ? c : p[0];
    }
    double u = u01(rng) * sum, c = 0;
    for (int64_t i = 0; i < n; i++)
        if ((c += p[i]) > u)
            return idx[i];
    return idx[n - 1];
}

/* ---- printing tokens ---- */

/* llm.c's GPT-2 tokenizer file: a header of 256 uint32 (magic 20240328,
 * version 1 or 2, vocabulary size, version 2: the end-of-text token), then
 * per token a uint8 length and that many bytes. */
typedef struct {
    char **tok;
    uint8_t *len;
    int64_t n;
} Tok;

static void tok_free(Tok *t)
{
    for (int64_t i = 0; i < t->n; i++)
        free(t->tok[i]);
    free(t->tok);
    free(t->len);
}

static bool tok_load(const char *path, Tok *t, Diag *d)
{
    FILE *fp = fopen(path, "rb");
    uint32_t h[256];
    if (!fp) {
        snprintf(d->msg, sizeof d->msg, "--tokenizer %s: cannot open: %s", path, strerror(errno));
        return false;
    }
    bool ok = fread(h, 4, 256, fp) == 256 && h[0] == 20240328 && (h[1] == 1 || h[1] == 2) &&
              h[2] >= 1 && h[2] <= (1u << 24);
    if (!ok)
        snprintf(d->msg, sizeof d->msg,
                 "--tokenizer %s: not a GPT-2 tokenizer file of llm.c (expected a header of "
                 "256 uint32 starting 20240328, version 1 or 2, and the vocabulary size)", path);
    if (ok) {
        t->n = h[2];
        t->tok = xcalloc((size_t)t->n, sizeof *t->tok);
        t->len = xcalloc((size_t)t->n, 1);
        for (int64_t i = 0; ok && i < t->n; i++) {
            unsigned char l;
            ok = fread(&l, 1, 1, fp) == 1 && l > 0;
            if (ok) {
                t->len[i] = l;
                t->tok[i] = xmalloc(l + 1u);
                ok = fread(t->tok[i], 1, l, fp) == l;
            }
            if (!ok)
                snprintf(d->msg, sizeof d->msg,
                         "--tokenizer %s: token %lld is cut or empty (the file holds %lld "
                         "tokens by its header)", path, (long long)i, (long long)t->n);
        }
    }
    fclose(fp);
    return ok;
}

typedef enum { PR_BYTES, PR_IDS, PR_TOKENIZER } PrintKind;

static void put_token(PrintKind k, const Tok *tk, int32_t id, bool first)
{
    if (k == PR_BYTES)
        putchar(id);
    else if (k == PR_TOKENIZER && id < tk->n)
        fwrite(tk->tok[id], 1, tk->len[id], stdout);
    else
        printf(first ? "%d" : " %d", id);
}

/* ---- the prompt ---- */

/* --prompt TEXT (bytes) or --prompt-tokens FILE (integers separated by
 * white space or commas) into *out; errors name the flag, the file's line
 * and the token. */
static bool read_prompt(const Smp *f, int32_t **out, int64_t *n, Diag *d)
{
    const SampleOpts *o = f->o;
    VEC(int32_t) v = {0};
    if (o->prompt) {
        if (f->V < 256) {
            for (const unsigned char *c = (const unsigned char *)o->prompt; *c; c++)
                if (*c >= f->V) {
                    snprintf(d->msg, sizeof d->msg,
                             "--prompt: byte %u at offset %lld is out of the vocabulary (the "
                             "model's V = %lld)", *c,
                             (long long)((const char *)c - o->prompt), (long long)f->V);
                    return false;
                }
        } else if (f->V > 256) {
            snprintf(d->msg, sizeof d->msg,
                     "--prompt: TEXT is read as bytes, for byte-level models (V <= 256), but %s "
                     "has V = %lld (expected --prompt-tokens FILE with the token ids)",
                     f->m->path, (long long)f->V);
            return false;
        }
        for (const unsigned char *c = (const unsigned char *)o->prompt; *c; c++)
            vec_push(&v, (int32_t)*c);
    } else {
        FILE *fp = fopen(o->prompt_tokens, "r");
        if (!fp) {
            snprintf(d->msg, sizeof d->msg, "--prompt-tokens %s: cannot open: %s",
                     o->prompt_tokens, strerror(errno));
            return false;
        }
        char word[64];
        int line = 1, c = 0;
        while (c != EOF) {
            size_t k = 0;
            while ((c = fgetc(fp)) != EOF && (c == ' ' || c == '\t' || c == ',' || c == '\r' ||
                                              c == '\n'))
                line += c == '\n';
            while (c != EOF && !(c == ' ' || c == '\t' || c == ',' || c == '\r' || c == '\n')) {
                if (k + 1 < sizeof word)
                    word[k++] = (char)c;
                c = fgetc(fp);
            }
            word[k] = 0;
            if (!k)
                break;
            char *end;
            errno = 0;
            long long x = strtoll(word, &end, 10);
            if (*end || errno || x < 0 || x >= f->V) {
                snprintf(d->msg, sizeof d->msg,
                         "--prompt-tokens %s:%d: token '%s' is %s (expected an integer id from 0 "
                         "to %lld, the model's vocabulary)", o->prompt_tokens, line, word,
                         *end || errno ? "not an integer" : "out of the vocabulary",
                         (long long)f->V - 1);
                fclose(fp);
                vec_free(&v);
                return false;
            }
            vec_push(&v, (int32_t)x);
            if (c == '\n')
                line++;
        }
        fclose(fp);
    }
    const char *flag = o->prompt ? "--prompt" : "--prompt-tokens";
    if (!v.n) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: the prompt is empty (expected at least one token to continue)", flag);
        return false;
    }
    if (v.n > f->T) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: the prompt is %lld tokens, longer than the model's window (expected at "
                 "most T = %lld)", flag, (long long)v.n, (long long)f->T);
        vec_free(&v);
        return false;
    }
    *out = v.v;
    *n = v.n;
    return true;
}

/* ---- setup ---- */

static bool load_weights(Smp *f, Diag *d)
{
    const Graph *g = f->m->g;
    f->vals = xcalloc((size_t)g->t.n + 1, sizeof *f->vals);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind == TK_PARAM || t->kind == TK_STATE)
            f->vals[i] = xcalloc(1, (size_t)shape_bytes(&t->s) + 1);
    }
    if (!rt_weights_import(f->o->init_from, g, f->m->pads, f->m->npads, f->vals, d)) {
        char msg[sizeof d->msg];
        snprintf(msg, sizeof msg, "%s", d->msg);
        snprintf(d->msg, sizeof d->msg, "--init-from: %.1900s", msg);
        return false;
    }
    return true;
}

/* The model must be a language model: input tokens i32[B,T] and an
 * evaluation output logits f32[B,T,V]. */
static bool check_model(Smp *f, Diag *d)
{
    const Graph *g = f->m->eval_g ? f->m->eval_g : f->m->g;
    int t = ir_find_tensor(g, "tokens"), l = ir_find_output(g, "logits");
    const Tensor *tt = t >= 0 ? &g->t.v[t] : NULL, *lt = l >= 0 ? &g->t.v[l] : NULL;
    if (!tt || !lt || tt->s.rank != 2 || (tt->s.dtype != DT_I32 && tt->s.dtype != DT_I64) ||
        lt->s.rank != 3 || lt->s.dim[0] != tt->s.dim[0] || lt->s.dim[1] != tt->s.dim[1]) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: kiln sample needs a language model (expected an input tokens i32[B,T] "
                 "and an output logits f32[B,T,V], as models/gpt.lua; got %s and %s)",
                 f->m->path, tt ? "an input tokens of another shape" : "no input tokens",
                 lt ? "an output logits" : "no output logits");
        return false;
    }
    if (tt->s.dtype != DT_I32) {
        snprintf(d->msg, sizeof d->msg, "%s: kiln sample feeds tokens as i32 (got %s)",
                 f->m->path, dtype_name(tt->s.dtype));
        return false;
    }
    f->B = tt->s.dim[0];
    f->T = tt->s.dim[1];
    f->V = lt->s.dim[2];
    return true;
}

/* Whether decode graph g (S tokens a run) reads what the model's params
 * are and gives logits [B,S,V]: a script whose decode-mode run declares
 * other params or outputs is not decoded with a cache (why says so). */
static bool decode_fits(const Smp *f, const Graph *g, int64_t S, char *why, size_t n)
{
    int t = ir_find_tensor(g, "tokens"), l = ir_find_output(g, "logits");
    const Shape *ts = t >= 0 ? &g->t.v[t].s : NULL, *ls = l >= 0 ? &g->t.v[l].s : NULL;
    if (!ts || !ls || ts->rank != 2 || ts->dim[0] != f->B || ts->dim[1] != S ||
        ts->dtype != DT_I32 || ls->rank != 3 || ls->dim[0] != f->B || ls->dim[1] != S ||
        ls->dim[2] != f->V) {
        snprintf(why, n, "in decode mode (S = %lld) the script does not give tokens i32[%lld,%lld] "
                 "and logits [%lld,%lld,%lld]", (long long)S, (long long)f->B, (long long)S,
                 (long long)f->B, (long long)S, (long long)f->V);
        return false;
    }
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *x = &g->t.v[i];
        if (x->kind != TK_PARAM)
            continue;
        int j = ir_find_tensor(f->m->g, x->name);
        if (j < 0 || f->m->g->t.v[j].kind != TK_PARAM || !shape_eq(&x->s, &f->m->g->t.v[j].s)) {
            snprintf(why, n, "in decode mode the script declares param \"%s\", which the "
                     "training graph %s", x->name, j < 0 ? "has not" : "has with another type");
            return false;
        }
    }
    return true;
}

/* The evaluation graph, compiled when the full forward is the path (at
 * setup, or after a failed check). */
static bool full_build(Smp *f, Diag *d)
{
    if (f->full.e)
        return true;
    step_free(&f->full);
    return step_build(f, &f->full, ir_clone(f->m->eval_g ? f->m->eval_g : f->m->g), true, d);
}

static bool setup(Smp *f, Diag *d)
{
    const SampleOpts *o = f->o;
    if (!load_weights(f, d))
        return false;
    f->kv = false;
    if (o->no_kv_cache)
        snprintf(f->why, sizeof f->why, "--no-kv-cache");
    else if (o->decode_why)
        snprintf(f->why, sizeof f->why, "%s", o->decode_why);
    else if (!o->prefill_g || !o->step_g || o->ncaches == 0)
        snprintf(f->why, sizeof f->why,
                 "the script's attention keeps no cache (only nn.attention and "
                 "nn.CausalSelfAttention do)");
    else if (!decode_fits(f, o->prefill_g, f->T, f->why, sizeof f->why) ||
             !decode_fits(f, o->step_g, 1, f->why, sizeof f->why))
        ;
    else {
        if (!step_build(f, &f->pre, ir_clone(o->prefill_g), false, d) ||
            !step_build(f, &f->one, ir_clone(o->step_g), false, d))
            return false;
        f->kv = true;
    }
    f->tokbuf = xcalloc((size_t)(f->B * f->T), sizeof *f->tokbuf);
    return f->kv || full_build(f, d);
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = (double)a[i] - b[i];
        num += x * x;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- the loop ---- */

typedef struct {
    int32_t *seq;  /* B rows of P + N tokens */
    int64_t P, N, L;
    uint64_t *rng; /* per row */
    int32_t *idx;
    double *p;
    int64_t stream_row; /* -1: none */
    PrintKind pk;
    const Tok *tk;
    int64_t runs_pre, runs_one, runs_full;
    double one_s;  /* seconds in one-token steps */
    int64_t done;  /* samples printed before this round */
} Round;

/* Logits row for row b: out of s at position i (rows of s->S positions). */
static const float *row_of(const Smp *f, const Step *s, int64_t b, int64_t i)
{
    return s->out + (b * s->S + i) * f->V;
}

/* Appends token i (0-based, of N) to every row from the given logits. */
static void choose(Smp *f, Round *r, const Step *s, int64_t at, int64_t i)
{
    for (int64_t b = 0; b < f->B; b++) {
        int32_t t = pick(row_of(f, s, b, at), f->V, f->o, &r->rng[b], r->idx, r->p);
        r->seq[b * r->L + r->P + i] = t;
        if (b == r->stream_row) {
            put_token(r->pk, r->tk, t, i == 0 && r->pk == PR_IDS);
            fflush(stdout);
        }
    }
}

/* One round of B rows: the prompt, then N tokens each. */
/* One one-token step for every row: token seq[pos] at position pos. */
static bool one_step(Smp *f, Round *r, int64_t pos, Diag *d)
{
    for (int64_t b = 0; b < f->B; b++)
        f->tokbuf[b] = r->seq[b * r->L + pos];
    double t0 = ir_now();
    if (!step_run(f, &f->one, pos, d))
        return false;
    r->one_s += ir_now() - t0;
    r->runs_one++;
    return true;
}

/* The first one-token step's logits (the tokens seq[0..n)) against the
 * prefill over the same tokens: a script whose decode graph ignores its
 * cache differs; then f->kv is false and why says so. */
static bool check_step(Smp *f, Round *r, int64_t n, Diag *d)
{
    float *keep = xmalloc((size_t)(f->B * f->V) * sizeof *keep);
    memcpy(keep, f->one.out, (size_t)(f->B * f->V) * sizeof *keep);
    int64_t at = 0;
    for (int64_t b = 0; b < f->B; b++)
        at = window(f, b, r->seq + b * r->L, n, f->T);
    if (!step_run(f, &f->pre, 0, d)) {
        free(keep);
        return false;
    }
    r->runs_pre++;
    caches_to_step(f);
    double worst = 0;
    for (int64_t b = 0; b < f->B; b++)
        worst = fmax(worst, rel_err(keep + b * f->V, row_of(f, &f->pre, b, at), f->V));
    free(keep);
    f->checked = true;
    if (!(worst <= 1e-3)) {
        snprintf(f->why, sizeof f->why,
                 "the one-token step disagreed with the prefill over the same tokens "
                 "(relative error %.3g of the logits): the script mixes positions outside "
                 "nn.attention, which decode mode does not see", worst);
        f->kv = false;
    }
    return true;
}

/* One round of B rows: the prompt, then N tokens each. With the KV cache,
 * a short prompt (P <= T/16) goes through one-token steps, a longer one
 * through the prefill; each new token through a one-token step; past the
 * window, the prefill over the last T tokens. */
static bool round_run(Smp *f, Round *r, Diag *d)
{
    int64_t n = r->P;
    for (int64_t i = 0; i < r->N; i++, n++) {
        if (rt_stop_signal()) {
            snprintf(d->msg, sizeof d->msg, "stopped by %s after %lld of %lld samples",
                     rt_signal_name(rt_stop_signal()), (long long)r->done,
                     (long long)f->o->num_samples);
            return false;
        }
        Step *s = f->kv ? &f->pre : &f->full;
        int64_t at = 0;
        if (f->kv && n <= f->T && (i > 0 || r->P * 16 <= f->T)) {
            for (int64_t pos = i > 0 ? n - 1 : 0; pos < n; pos++)
                if (!one_step(f, r, pos, d))
                    return false;
            if (!f->checked && !f->o->skip_check) {
                if (!check_step(f, r, n, d))
                    return false;
                if (!f->kv)
                    return true; /* the caller reruns the round without the cache */
            }
            s = &f->one;
        } else {
            for (int64_t b = 0; b < f->B; b++)
                at = window(f, b, r->seq + b * r->L, n, f->T);
            if (!step_run(f, s, 0, d))
                return false;
            if (f->kv && n < f->T)
                caches_to_step(f);
            *(f->kv ? &r->runs_pre : &r->runs_full) += 1;
        }
        choose(f, r, s, at, i);
    }
    return true;
}

int rt_sample(const Model *m, const SampleOpts *o)
{
    Smp f = {.m = m, .o = o, .full = {.tok = -1}, .pre = {.tok = -1}, .one = {.tok = -1}};
    Diag d = {{0}};
    int32_t *prompt = NULL;
    int64_t P = 0;
    Tok tk = {0};
    Round r = {0};
    int rc = 1;
    /* the user's input first, then the weights and the compiles */
    if (!check_model(&f, &d) || !read_prompt(&f, &prompt, &P, &d))
        goto out;
    if (o->tokenizer && !tok_load(o->tokenizer, &tk, &d))
        goto out;
    if (o->tokenizer && tk.n < f.V) {
        snprintf(d.msg, sizeof d.msg,
                 "--tokenizer %s: holds %lld tokens, fewer than the model's vocabulary (V = %lld)",
                 o->tokenizer, (long long)tk.n, (long long)f.V);
        goto out;
    }
    if (!setup(&f, &d))
        goto out;
    r.pk = o->ids ? PR_IDS : o->tokenizer ? PR_TOKENIZER : f.V <= 256 ? PR_BYTES : PR_IDS;
    r.tk = &tk;
    r.P = P;
    r.N = o->max_new_tokens;
    r.L = P + r.N;
    r.seq = xcalloc((size_t)(f.B * r.L), sizeof *r.seq);
    r.rng = xcalloc((size_t)f.B, sizeof *r.rng);
    r.idx = xcalloc((size_t)f.V, sizeof *r.idx);
    r.p = xcalloc((size_t)f.V, sizeof *r.p);
    /* --stream: one sample per round (row 0), its tokens printed as chosen */
    int64_t per = o->stream ? 1 : f.B, done = 0;
    double t0 = ir_now(), tokens = 0;
    while (done < o->num_samples) {
        int64_t k = o->num_samples - done < per ? o->num_samples - done : per;
        bool was_kv = f.kv;
        for (int64_t b = 0; b < f.B; b++) {
            memcpy(r.seq + b * r.L, prompt, (size_t)P * sizeof *prompt);
            r.rng[b] = mix64(o->seed ^ mix64((uint64_t)(done + (b < k ? b : 0)) + 1));
        }
        r.stream_row = o->stream && !o->quiet ? 0 : -1;
        if (r.stream_row == 0) {
            printf("--- sample %lld ---\n", (long long)done + 1);
            if (r.pk != PR_IDS)
                for (int64_t i = 0; i < P; i++)
                    put_token(r.pk, &tk, prompt[i], false);
            fflush(stdout);
        }
        if (done == 0 && !o->quiet)
            fprintf(stderr, "sample: %s: %s%s%s%s; %lld row%s a run\n", m->path,
                    f.kv ? "KV cache: a compiled prefill over the window and a one-token step "
                           "writing the cache at the position"
                         : "no KV cache: the full forward over the window at every token",
                    f.kv ? "" : " (", f.kv ? "" : f.why, f.kv ? "" : ")", (long long)f.B,
                    f.B == 1 ? "" : "s");
        r.done = done;
        if (!round_run(&f, &r, &d))
            goto out;
        if (was_kv && !f.kv) { /* the check failed: the round again, without the cache */
            if (!full_build(&f, &d))
                goto out;
            if (!o->quiet)
                fprintf(stderr, "sample: %s: no KV cache: %s; the full forward over the window "
                                "at every token\n", m->path, f.why);
            continue;
        }
        for (int64_t b = 0; b < k; b++) {
            if (r.stream_row == 0) {
                putchar('\n');
                continue;
            }
            const int32_t *s = r.seq + b * r.L;
            if (r.pk == PR_IDS) {
                printf("sample %lld:", (long long)(done + b + 1));
                for (int64_t i = P; i < r.L; i++)
                    printf(" %d", s[i]);
                putchar('\n');
            } else {
                printf("--- sample %lld ---\n", (long long)(done + b + 1));
                for (int64_t i = 0; i < r.L; i++)
                    put_token(r.pk, &tk, s[i], false);
                putchar('\n');
            }
        }
        fflush(stdout);
        done += k;
        tokens += (double)(r.N * k);
        if (rt_stop_signal()) {
            snprintf(d.msg, sizeof d.msg, "stopped by %s after %lld of %lld samples",
                     rt_signal_name(rt_stop_signal()), (long long)done,
                     (long long)o->num_samples);
            goto out;
        }
    }
    double s = ir_now() - t0;
    if (!o->quiet)
        fprintf(stderr,
                "sample: %lld sample%s of %lld tokens in %.3f s: %.1f tokens/s; runs: %lld "
                "prefill, %lld one-token, %lld full forward%s",
                (long long)o->num_samples, o->num_samples == 1 ? "" : "s", (long long)r.N, s,
                tokens / s, (long long)r.runs_pre, (long long)r.runs_one,
                (long long)r.runs_full, r.runs_one ? "" : "\n");
    if (!o->quiet && r.runs_one)
        fprintf(stderr, "; one-token steps %.3f ms each: %.1f tokens/s at batch %lld\n",
                1e3 * r.one_s / (double)r.runs_one, (double)(f.B * r.runs_one) / r.one_s,
                (long long)f.B);
    rc = 0;
out:
    if (rc) {
        fflush(stdout);
        fprintf(stderr, "kiln sample: %s\n", d.msg);
        if (rt_stop_signal())
            rc = 128 + rt_stop_signal();
    }
    free(prompt);
    free(r.seq);
    free(r.rng);
    free(r.idx);
    free(r.p);
    tok_free(&tk);
    smp_free(&f);
    return rc;
}

/* ---- train{sample_every} ---- */

char *rt_train_sample(Exec *e, const Graph *eg, const TrainCfg *c, int64_t step, bool check,
                      Diag *d)
{
    int ti = ir_find_tensor(eg, "tokens"), li = ir_find_output(eg, "logits");
    const Tensor *tt = ti >= 0 ? &eg->t.v[ti] : NULL, *lt = li >= 0 ? &eg->t.v[li] : NULL;
    if (!tt || !lt || tt->s.rank != 2 || tt->s.dtype != DT_I32 || lt->s.rank != 3 ||
        lt->s.dim[1] != tt->s.dim[1]) {
        snprintf(d->msg, sizeof d->msg,
                 "train: sample_every needs a language model (expected an input tokens "
                 "i32[B,T] and an output logits [B,T,V], as models/gpt.lua)");
        return NULL;
    }
    int64_t B = tt->s.dim[0], T = tt->s.dim[1], V = lt->s.dim[2];
    VEC(int32_t) seq = {0};
    const char *pr = c->sample_prompt;
    if (!pr)
        vec_push(&seq, V <= 256 ? 10 : V == 50257 ? 50256 : 0);
    else if (V <= 256)
        for (const unsigned char *u = (const unsigned char *)pr; *u; u++)
            vec_push(&seq, (int32_t)*u);
    else
        for (const char *q = pr; *q;) {
            char *end;
            long long x = strtoll(q, &end, 10);
            if (end == q || x < 0 || x >= V) {
                snprintf(d->msg, sizeof d->msg,
                         "train: sample_prompt: expected token ids from 0 to %lld separated by "
                         "spaces (the model has V = %lld), got '%.200s'", (long long)V - 1,
                         (long long)V, pr);
                vec_free(&seq);
                return NULL;
            }
            vec_push(&seq, (int32_t)x);
            for (q = end; *q == ' ' || *q == ','; q++)
                ;
        }
    bool bad = !seq.n || seq.n > T;
    for (int64_t i = 0; i < seq.n && !bad; i++)
        bad = seq.v[i] >= V;
    if (bad) {
        snprintf(d->msg, sizeof d->msg,
                 "train: sample_prompt: expected 1 to T = %lld tokens of the vocabulary (V = "
                 "%lld), got %lld%s", (long long)T, (long long)V, (long long)seq.n,
                 seq.n && seq.n <= T ? " with a byte out of the vocabulary" : "");
        vec_free(&seq);
        return NULL;
    }
    if (check) {
        vec_free(&seq);
        return xstrdup("");
    }
    int64_t P = seq.n;
    int32_t *tok = xcalloc((size_t)(B * T), sizeof *tok);
    float *out = xmalloc((size_t)shape_numel(&lt->s) * sizeof *out);
    int32_t *idx = xmalloc((size_t)V * sizeof *idx);
    double *p = xmalloc((size_t)V * sizeof *p);
    SampleOpts so = {.temperature = 1, .top_p = 1};
    uint64_t rng = mix64(c->seed ^ mix64((uint64_t)step + 0x5a3d));
    for (int i = 0; i < eg->t.n; i++) /* the other inputs (targets, mask): zeros */
        if (eg->t.v[i].kind == TK_INPUT && i != ti) {
            void *z = xcalloc(1, (size_t)shape_bytes(&eg->t.v[i].s) + 1);
            rt_exec_write(e, i, z);
            free(z);
        }
    bool ok = true;
    for (int64_t i = 0; i < c->sample_tokens && ok; i++) {
        int64_t n = seq.n, w = n < T ? n : T;
        for (int64_t b = 0; b < B; b++) {
            memset(tok + b * T, 0, (size_t)T * sizeof *tok);
            memcpy(tok + b * T, seq.v + (n - w), (size_t)w * sizeof *tok);
        }
        rt_exec_write(e, ti, tok);
        if (!(ok = rt_exec_run(e, c->seed, step, d)))
            break;
        rt_exec_read_f32(e, lt, out);
        vec_push(&seq, pick(out + (w - 1) * V, V, &so, &rng, idx, p));
    }
    char *text = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&text, &len);
    if (!o)
        die("open_memstream: out of memory");
    for (int64_t i = 0; i < seq.n; i++) {
        int32_t t = seq.v[i];
        if (V > 256)
            fprintf(o, i ? " %d" : "%d", t);
        else if (t >= 32 && t < 127 && t != '\\')
            fputc(t, o);
        else if (t == '\n')
            fputs("\\n", o);
        else if (t == '\\')
            fputs("\\\\", o);
        else
            fprintf(o, "\\x%02x", t);
        if (i == P - 1 && V > 256)
            fputs(" |", o);
    }
    if (fclose(o) != 0)
        die("open_memstream: out of memory");
    free(tok);
    free(out);
    free(idx);
    free(p);
    vec_free(&seq);
    if (!ok) {
        free(text);
        return NULL;
    }
    return text;
}
