/* train_data.c - the training loop's data: the train{} data settings
 * checked against the model's inputs (names, dtypes, shapes; errors at the
 * train{} line), and the data source opened for this rank (data.c,
 * data_tensors.c). */
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>

const Tensor *rt_train_input(const Graph *g, const char *name)
{
    int id = ir_find_tensor(g, name);
    return id >= 0 && g->t.v[id].kind == TK_INPUT ? &g->t.v[id] : NULL;
}

static bool check_input(const Graph *g, const char *name, DType dt, int rank,
                        const int64_t *dims, Diag *d)
{
    const Tensor *t = rt_train_input(g, name);
    if (!t)
        return true;
    Shape want = shape_make(dt, rank, dims);
    if (!shape_eq(&t->s, &want)) {
        char a[96], b[96];
        snprintf(d->msg, sizeof d->msg,
                 "model input \"%s\" has the wrong type for the data (expected %s, got %s)",
                 name, shape_str(NULL, &want, a, sizeof a), shape_str(NULL, &t->s, b, sizeof b));
        return false;
    }
    return true;
}

/* The fewest rows of a table that input `tok` (or a reshape, cast, permute,
 * slice or broadcast of it) indexes with gather, naming that table and the
 * gather's line into name[n]; 0 when no gather reads it. */
static int64_t gather_rows(const Graph *g, int tok, char *name, size_t n)
{
    bool *from = xcalloc((size_t)g->t.n + 1, sizeof *from);
    from[tok] = true;
    int64_t rows = 0;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        switch (op->code) {
        case OP_RESHAPE:
        case OP_CAST:
        case OP_PERMUTE:
        case OP_SLICE:
        case OP_BROADCAST:
            from[op->out] |= from[op->in[0]];
            break;
        case OP_GATHER: {
            const Tensor *t = &g->t.v[op->in[0]];
            if (!from[op->in[1]] || (rows > 0 && t->s.dim[0] >= rows))
                break;
            rows = t->s.dim[0];
            snprintf(name, n, "%s%s%s (gather at %s:%d)", t->name ? "\"" : "",
                     t->name ? t->name : "", t->name ? "\"" : "",
                     op->loc.file ? op->loc.file : "?", op->loc.line);
            break;
        }
        default: break;
        }
    }
    free(from);
    return rows;
}

static void free_want(DataWant *w, int n)
{
    for (int i = 0; i < n; i++)
        free((void *)w[i].limit_what);
    free(w);
}

/* data tensors: every input of the model is an array of the file, one
 * example per row of its batch dimension (the first, the same B for all);
 * integer inputs a gather indexes stay below its table's rows, and y or
 * targets below the classes of logits. Accuracy is reported (r->rowy) for
 * logits [B,classes] and y i32[B]. dc->want is allocated (open_data frees
 * it); its names are the graph's. */

static bool tensors_cfg(Run *r, const Tensor *logits, DataCfg *dc, Diag *d)
{
    const Graph *g = r->m->g;
    DataWant *w = xcalloc((size_t)g->t.n + 1, sizeof *w);
    int n = 0;
    r->B = -1;
    r->T = 1;
    r->tok_per_row = 0;
    bool named_tokens = false;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_INPUT)
            continue;
        if (t->s.rank < 1 || (r->B >= 0 && t->s.dim[0] != r->B)) {
            char a[96];
            snprintf(d->msg, sizeof d->msg,
                     "data tensors needs every model input batched along its first "
                     "dimension (expected %s[%lld,...], got input %s %s)",
                     dtype_name(t->s.dtype), (long long)(r->B >= 0 ? r->B : 1), t->name,
                     shape_str(NULL, &t->s, a, sizeof a));
            free_want(w, n);
            return false;
        }
        r->B = t->s.dim[0];
        DataWant *x = &w[n++];
        x->name = t->name;
        x->dtype = t->s.dtype;
        x->rank = t->s.rank - 1;
        memcpy(x->dim, t->s.dim + 1, (size_t)x->rank * sizeof *x->dim);
        x->optional = r->optional_input && r->optional_input[t->id];
        if (x->dtype == DT_I32 || x->dtype == DT_I64 || x->dtype == DT_U8) {
            char nm[512], what[600];
            int64_t rows = gather_rows(g, t->id, nm, sizeof nm);
            /* a token axis: an integer input [B, T...] an embedding
             * indexes, or named tokens (which wins) */
            bool named = strcmp(t->name, "tokens") == 0;
            if (t->s.rank >= 2 && (named || (rows > 0 && !named_tokens))) {
                r->tok_per_row = 1;
                for (int k = 1; k < t->s.rank; k++)
                    r->tok_per_row *= t->s.dim[k];
                named_tokens = named_tokens || named;
            }
            if (rows > 0) {
                snprintf(what, sizeof what, "the rows of the table %s", nm);
                x->limit = rows;
                x->limit_what = xstrdup(what);
            }
            bool target = strcmp(t->name, "y") == 0 || strcmp(t->name, "targets") == 0;
            int64_t V = logits ? logits->s.dim[logits->s.rank - 1] : 0;
            if (target && V > 0 && (x->limit == 0 || V < x->limit)) {
                x->limit = V;
                free((void *)x->limit_what);
                x->limit_what = xstrdup("the classes of the model's logits");
            }
        }
    }
    if (n == 0) {
        snprintf(d->msg, sizeof d->msg, "data tensors needs a model input to feed (got none)");
        free_want(w, n);
        return false;
    }
    const Tensor *y = rt_train_input(g, "y");
    r->rowy = logits && logits->s.rank == 2 && logits->s.dim[0] == r->B && y &&
              y->s.dtype == DT_I32 && y->s.rank == 1;
    dc->batch = r->B * rt_dp_rows_factor(r->dp);
    dc->want = w;
    dc->nwant = n;
    return true;
}

/* Works out the data source from the graph's inputs and the train config
 * into *dc, and checks every input of g is one the source (or the loop)
 * provides. */
static bool data_cfg(Run *r, DataCfg *dcp, Diag *d)
{
    static char rows_name[512];
    const Graph *g = r->m->g;
    const char *kind = r->c.data;
    const Tensor *tok = rt_train_input(g, "tokens"), *x = rt_train_input(g, "x");
    if (!kind)
        kind = x ? "blobs" : NULL;
    if (!kind) {
        snprintf(d->msg, sizeof d->msg,
                 "train{data=...} is not set (expected addition, text, tokens, blobs or "
                 "tensors)");
        return false;
    }
    r->blobs = strcmp(kind, "blobs") == 0;
    r->addition = strcmp(kind, "addition") == 0;
    r->tensors = strcmp(kind, "tensors") == 0;
    r->rowy = r->blobs;
    const Graph *eg = r->m->eval_g ? r->m->eval_g : g; /* logits are evaluation's */
    int lid = ir_find_output(eg, "logits");
    const Tensor *logits = lid >= 0 ? &eg->t.v[lid] : NULL;
    bool in_order = r->c.shuffle && strcmp(r->c.shuffle, "false") == 0;
    DataCfg dc = {.kind = kind, .path = r->c.data_path, .seed = r->c.seed,
                  .digits = (int)r->c.digits, .val_fraction = r->c.val_fraction,
                  .in_order = in_order, .val_path = r->c.val_path,
                  .allow_nonfinite = r->o && r->o->allow_nonfinite_data};
    if (in_order && (r->blobs || r->addition)) {
        snprintf(d->msg, sizeof d->msg,
                 "train{shuffle=false} does not apply to data %s (expected data text, tokens "
                 "or tensors, whose examples have an order; %s draws every batch at random)",
                 kind, kind);
        return false;
    }
    if (r->c.val_path && !r->tensors) {
        snprintf(d->msg, sizeof d->msg,
                 "train{val_path} does not apply to data %s (expected data tensors; %s "
                 "splits off val_fraction)",
                 kind, kind);
        return false;
    }
    if (r->tensors) {
        if (!tensors_cfg(r, logits, &dc, d))
            return false;
    } else if (r->blobs) {
        const Tensor *y = rt_train_input(g, "y");
        if (!x || !y || x->s.rank != 2 || !logits) {
            snprintf(d->msg, sizeof d->msg,
                     "data blobs needs model inputs x f32[B,D] and y i32[B] and an output "
                     "\"logits\" [B,classes]");
            return false;
        }
        r->B = x->s.dim[0];
        r->T = 1;
        r->tok_per_row = 0;
        dc.batch = r->B * rt_dp_rows_factor(r->dp);
        dc.dim = (int)x->s.dim[1];
        dc.classes = (int)logits->s.dim[logits->s.rank - 1];
        if (!check_input(g, "x", DT_F32, 2, x->s.dim, d) ||
            !check_input(g, "y", DT_I32, 1, &r->B, d))
            return false;
    } else {
        if (!tok || tok->s.rank != 2) {
            snprintf(d->msg, sizeof d->msg,
                     "data %s needs a model input tokens i32[B,T] (and targets i32[B,T])", kind);
            return false;
        }
        r->B = tok->s.dim[0];
        r->T = tok->s.dim[1];
        r->tok_per_row = r->T;
        dc.batch = r->B * rt_dp_rows_factor(r->dp);
        dc.seq = r->T;
        if (logits)
            dc.vocab = (int)logits->s.dim[logits->s.rank - 1];
        dc.rows = gather_rows(g, tok->id, rows_name, sizeof rows_name);
        dc.rows_name = rows_name;
        if (!check_input(g, "tokens", DT_I32, 2, tok->s.dim, d) ||
            !check_input(g, "targets", DT_I32, 2, tok->s.dim, d) ||
            !check_input(g, "mask", DT_F32, 2, tok->s.dim, d))
            return false;
        /* text and tokens files are checked symbol by symbol when opened */
        if (r->addition && logits && dc.vocab < ADD_VOCAB) {
            snprintf(d->msg, sizeof d->msg,
                     "data %s needs a vocabulary of at least %d (the model's logits have %d)",
                     kind, ADD_VOCAB, dc.vocab);
            return false;
        }
        if (r->addition && dc.rows > 0 && dc.rows < ADD_VOCAB) {
            snprintf(d->msg, sizeof d->msg,
                     "data %s needs an embedding table of at least %d rows (the tokens index "
                     "%s with %lld)",
                     kind, ADD_VOCAB, rows_name, (long long)dc.rows);
            return false;
        }
    }
    if (r->c.eval_batches > MAX_EVAL_BATCHES) {
        snprintf(d->msg, sizeof d->msg,
                 "train{eval_batches=%lld} is too large (expected at most %d validation "
                 "batches per evaluation)",
                 (long long)r->c.eval_batches, MAX_EVAL_BATCHES);
        goto fail;
    }
    if (r->c.batch > 0 && r->c.batch != r->B) {
        snprintf(d->msg, sizeof d->msg,
                 "train{batch=%lld} does not match the model's inputs (batch %lld)",
                 (long long)r->c.batch, (long long)r->B);
        goto fail;
    }
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_INPUT)
            continue;
        static const char *ok_tok[] = {"tokens", "targets", "mask", NULL};
        static const char *ok_blob[] = {"x", "y", NULL};
        bool found = false;
        for (const char **n = r->blobs ? ok_blob : ok_tok; *n; n++)
            found |= strcmp(*n, t->name) == 0;
        found |= r->tensors; /* every input is an array of the file */
        if (!found) {
            snprintf(d->msg, sizeof d->msg,
                     "model input \"%s\" is not provided by data %s (expected %s)", t->name,
                     kind, r->blobs ? "x, y" : "tokens, targets, mask");
            goto fail;
        }
    }
    if (r->blobs && (dc.dim < 1 || dc.classes < 2)) {
        snprintf(d->msg, sizeof d->msg,
                 "data blobs needs at least 1 feature and 2 classes (got x with %d, logits "
                 "with %d)",
                 dc.dim, dc.classes);
        goto fail;
    }
    *dcp = dc;
    return true;
fail:
    free_want((DataWant *)dc.want, dc.nwant);
    return false;
}

/* The data source; a mismatch between the model and its data names the
 * script and its train{} line. */
/* d's message prefixed with the script and its train{} line (or the path). */
static void at_train_line(const Run *r, Diag *d)
{
    char msg[sizeof d->msg];
    snprintf(msg, sizeof msg, "%s", d->msg);
    if (r->m->train_line > 0)
        snprintf(d->msg, sizeof d->msg, "%s:%d: %.1900s", r->m->path, r->m->train_line, msg);
    else
        snprintf(d->msg, sizeof d->msg, "%s: %.1900s", r->m->path, msg);
}

bool rt_train_open_data(Run *r, Diag *d)
{
    DataCfg dc;
    if (!data_cfg(r, &dc, d)) {
        at_train_line(r, d);
        return false;
    }
    r->ds = rt_data_open(&dc, d);
    free_want((DataWant *)dc.want, dc.nwant);
    if (!r->ds && r->tensors) /* the arrays do not fit the model: at train{} too */
        at_train_line(r, d);
    return r->ds != NULL;
}

/* Writes rows [row0, row0 + the model's batch) of batch b into the data
 * inputs of graph g on exec e. */
