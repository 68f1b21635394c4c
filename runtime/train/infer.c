/* infer.c - kiln eval and kiln predict (train.h's contract): the model's
 * evaluation graph with saved weights over every example of a data set,
 * the exact means of its scalar outputs, or its outputs per example. */
#include "train_internal.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const Model *m;
    const InferOpts *o;
    const char *cmd;   /* "eval", "predict": messages start "kiln CMD: " */
    TrainOpts to;      /* what the data settings read of the loop's options */
    Run r;             /* the loop's data part: ds, B, T, the source's kind */
    DataSplit split;   /* DATA_TRAIN: all of --data-path (val_fraction 0) */
    Graph *eg;
    Exec *ee;
    void **vals;       /* host params by m->g's ids */
    bool *optional;    /* predict: by m->g's ids, the inputs its outputs do not read */
} Inf;

static void inf_free(Inf *f)
{
    if (f->vals) {
        for (int i = 0; i < f->m->g->t.n; i++)
            free(f->vals[i]);
        free(f->vals);
    }
    free(f->optional);
    if (f->ee)
        rt_exec_destroy(f->ee);
    if (f->eg)
        ir_free(f->eg);
    rt_data_close(f->r.ds);
}

/* "--data-path P" or "the validation split of data KIND (PATH)". */
static void data_what(const Inf *f, char *buf, size_t n)
{
    const TrainCfg *c = &f->r.c;
    if (f->o->data_path)
        snprintf(buf, n, "every example of %s", f->o->data_path);
    else if (c->val_path && f->r.tensors)
        snprintf(buf, n, "the validation split of data tensors (%s)", c->val_path);
    else
        snprintf(buf, n, "the validation split of data %s%s%s%s", c->data ? c->data : "blobs",
                 c->data_path ? " (" : "", c->data_path ? c->data_path : "",
                 c->data_path ? ")" : "");
}

/* The data source (the training loop's, one rank), for the split to go
 * through; errors name --data-path where it was given. */
static bool open_data(Inf *f, Diag *d)
{
    const Model *m = f->m;
    const InferOpts *o = f->o;
    f->to.allow_nonfinite_data = o->allow_nonfinite_data;
    f->r = (Run){.m = m, .o = &f->to, .c = m->train};
    const char *kind = m->train.data ? m->train.data
                                     : rt_train_input(m->g, "x") ? "blobs" : "(none)";
    f->split = DATA_VAL;
    if (o->data_path) {
        if (!*o->data_path) {
            snprintf(d->msg, sizeof d->msg, "--data-path: expected a file or directory, got an "
                                            "empty value");
            return false;
        }
        if (strcmp(kind, "addition") == 0 || strcmp(kind, "blobs") == 0) {
            snprintf(d->msg, sizeof d->msg,
                     "--data-path %s: %s's data is %s, which reads no file (expected a model "
                     "with data text, tokens or tensors; without --data-path kiln %s goes "
                     "through the validation split)",
                     o->data_path, m->path, kind, f->cmd);
            return false;
        }
        f->r.c.data_path = o->data_path;
        f->r.c.val_fraction = 0;
        f->r.c.val_path = NULL;
        f->split = DATA_TRAIN;
    }
    f->r.optional_input = f->optional;
    if (!rt_train_open_data(&f->r, d)) {
        if (o->data_path) {
            char msg[sizeof d->msg];
            snprintf(msg, sizeof msg, "%s", d->msg);
            snprintf(d->msg, sizeof d->msg, "--data-path: %.1900s", msg);
        }
        return false;
    }
    if (!o->data_path && !rt_data_has_val(f->r.ds)) {
        snprintf(d->msg, sizeof d->msg,
                 "%s: the data has no validation split (val_fraction is 0 and no val_path; "
                 "expected --data-path P, or --set val_fraction=F)",
                 m->path);
        return false;
    }
    return true;
}

/* The evaluation graph, compiled as the training loop compiles its own,
 * and its executor. */
static bool build(Inf *f, Diag *d)
{
    const Model *m = f->m;
    PassOpts po;
    rt_pass_opts(&m->train, NULL, &po);
    f->eg = ir_clone(m->eval_g ? m->eval_g : m->g);
    if (!pass_attention(f->eg, &po, d) || !pass_attention_layout(f->eg, &po, d) ||
        !pass_simplify(f->eg, &po, d) || !pass_fuse(f->eg, &po, d) ||
        !pass_schedule(f->eg, &po, d))
        return false;
    char err[1024];
    if (!ir_verify(f->eg, err, sizeof err))
        die("evaluation graph invalid after simplify/schedule: %s", err);
    ExecOpts eo = {.device = f->o->device, .threads = f->o->threads,
                   .cache_dir = f->o->cache_dir, .verbose = f->o->verbose,
                   .precision = m->train.precision,
                   .tf32 = m->train.tf32 && strcmp(m->train.tf32, "true") == 0};
    return (f->ee = rt_exec_create(f->eg, &eo, d)) != NULL;
}

/* --init-from: every param of the model from the file, into the
 * evaluation graph's params. */
static bool load_weights(Inf *f, Diag *d)
{
    const Graph *g = f->m->g;
    f->vals = xcalloc((size_t)g->t.n + 1, sizeof *f->vals);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind == TK_PARAM || t->kind == TK_STATE)
            f->vals[i] =
                xcalloc(1, (size_t)shape_numel(&t->s) * (size_t)dtype_size(t->s.dtype) + 1);
    }
    if (!rt_weights_import(f->o->init_from, g, f->m->pads, f->m->npads, f->vals, d)) {
        char msg[sizeof d->msg];
        snprintf(msg, sizeof msg, "%s", d->msg);
        snprintf(d->msg, sizeof d->msg, "--init-from: %.1900s", msg);
        return false;
    }
    for (int i = 0; i < f->eg->t.n; i++) {
        const Tensor *t = &f->eg->t.v[i];
        if (t->kind != TK_PARAM && !rt_model_state(t))
            continue;
        int src = ir_find_tensor(g, t->name);
        if (src < 0 || !f->vals[src])
            die("infer: param %s of the evaluation graph missing from the model", t->name);
        rt_exec_write(f->ee, i, f->vals[src]);
    }
    return true;
}

static bool setup(Inf *f, Diag *d)
{
    return open_data(f, d) && build(f, d) && load_weights(f, d);
}

/* Prints d's message and frees f: exit code 1, or 128 + the signal that
 * stopped the run (SIGINT, SIGTERM: nothing written). */
static int fail(Inf *f, const Diag *d)
{
    fflush(stdout);
    fprintf(stderr, "kiln %s: %s\n", f->cmd, d->msg);
    inf_free(f);
    return rt_stop_signal() ? 128 + rt_stop_signal() : 1;
}

/* A name or string as JSON. */
static void json_str(FILE *o, const char *s)
{
    fputc('"', o);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c < 0x20)
            fprintf(o, "\\u%04x", c);
        else
            fputc(c, o);
    }
    fputc('"', o);
}

static void json_num(FILE *o, double v)
{
    if (isfinite(v))
        fprintf(o, "%.9g", v);
    else
        fputs("null", o);
}

/* --log-dir DIR: DIR/eval.jsonl, one line (training's eval.jsonl keys,
 * with "step" null, and the examples and tokens it went through). */
static bool write_log(const Inf *f, const RtEvalResult *res, const char *const *names, int nx,
                      bool acc, Diag *d)
{
    const char *dir = f->o->log_dir;
    if (!rt_mkdir_p(dir)) {
        snprintf(d->msg, sizeof d->msg, "--log-dir %s: cannot create the directory: %s", dir,
                 strerror(errno));
        return false;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    if (!o)
        die("open_memstream: out of memory");
    fputs("{\"step\":null,\"val_loss\":", o);
    json_num(o, res->loss);
    for (int i = 0; i < nx; i++) {
        fputc(',', o);
        json_str(o, names[i]);
        fputc(':', o);
        json_num(o, res->x[i]);
    }
    if (acc) {
        fputs(",\"accuracy\":", o);
        json_num(o, (double)res->right / (double)res->total);
    }
    fprintf(o, ",\"examples\":%lld,\"weight\":", (long long)res->examples);
    json_num(o, res->weight);
    fputs(",\"weights\":", o);
    json_str(o, f->o->init_from);
    fputs(",\"data\":", o);
    char what[1200];
    data_what(f, what, sizeof what);
    json_str(o, what);
    fputs("}\n", o);
    if (fclose(o) != 0)
        die("open_memstream: out of memory");
    char *path = xasprintf("%s/eval.jsonl", dir);
    const void *chunk[1] = {buf};
    bool ok = rt_write_atomic(path, chunk, &len, 1, d);
    free(path);
    free(buf);
    return ok;
}

int rt_eval(const Model *m, const InferOpts *o)
{
    Inf f = {.m = m, .o = o, .cmd = "eval"};
    Diag d = {{0}};
    if (!setup(&f, &d))
        return fail(&f, &d);
    const Graph *g = f.eg;
    if (ir_find_output(g, "loss") < 0) {
        snprintf(d.msg, sizeof d.msg, "%s: the model has no output \"loss\" to evaluate",
                 m->path);
        return fail(&f, &d);
    }
    /* the extra scalar outputs, as the training loop shows them */
    const char **names = xcalloc((size_t)g->outs.n + 1, sizeof *names);
    int *ids = xcalloc((size_t)g->outs.n + 1, sizeof *ids), nx = 0;
    for (int i = 0; i < g->outs.n; i++) {
        const Shape *s = &g->t.v[g->outs.v[i].t].s;
        if (strcmp(g->outs.v[i].name, "loss") == 0 || shape_numel(s) != 1 ||
            (s->dtype != DT_F32 && s->dtype != DT_BF16))
            continue;
        names[nx] = g->outs.v[i].name;
        ids[nx++] = g->outs.v[i].t;
    }
    int lid = ir_find_output(g, "logits");
    const Tensor *lt = lid >= 0 ? &g->t.v[lid] : NULL;
    bool acc = lt && (f.r.addition || f.r.rowy);
    double *xv = xcalloc((size_t)nx + 1, sizeof *xv);
    RtEvalSpec sp = {.g = g, .e = f.ee, .ds = f.r.ds, .split = f.split, .B = f.r.B,
                     .T = f.r.T, .masked = rt_train_input(g, "mask") && !f.r.tensors, .nx = nx,
                     .x_ids = ids, .logits = acc ? lt : NULL, .rowy = f.r.rowy, .nranks = 1,
                     .seed = m->train.seed};
    RtEvalResult res = {.x = xv};
    int rc = 1;
    if (!rt_eval_whole(&sp, &res, &d)) {
        char msg[sizeof d.msg], what[1200];
        snprintf(msg, sizeof msg, "%s", d.msg);
        data_what(&f, what, sizeof what);
        snprintf(d.msg, sizeof d.msg, "%.1000s: %.1000s", what, msg);
        goto out;
    }
    if (!o->quiet) {
        char what[1200];
        data_what(&f, what, sizeof what);
        int64_t nb = (res.examples + f.r.B - 1) / f.r.B, last = res.examples - (nb - 1) * f.r.B;
        printf("eval: %s: %lld example%s", what, (long long)res.examples,
               res.examples == 1 ? "" : "s");
        if (f.r.T > 1)
            printf(" of %lld tokens", (long long)f.r.T);
        printf(", %lld batch%s of %lld", (long long)nb, nb == 1 ? "" : "es", (long long)f.r.B);
        if (last < f.r.B)
            printf(" (the last holds %lld, padded; the padding not counted)", (long long)last);
        if (res.left_out)
            printf("; the last %lld target%s fill no window of T=%lld and the model has no mask "
                   "input: not scored",
                   (long long)res.left_out, res.left_out == 1 ? "" : "s", (long long)f.r.T);
        printf("\n");
    }
    printf("eval: loss %.9g", res.loss);
    for (int i = 0; i < nx; i++)
        printf(" | %s %.9g", names[i], xv[i]);
    if (acc && res.total > 0)
        printf(" | accuracy %.2f%% (%lld/%lld)", 100.0 * (double)res.right / (double)res.total,
               (long long)res.right, (long long)res.total);
    printf(" | examples %lld", (long long)res.examples);
    if (sp.masked || f.r.T > 1)
        printf(" | tokens %.0f", res.weight);
    printf("\n");
    if (o->log_dir) {
        if (!write_log(&f, &res, names, nx, acc && res.total > 0, &d))
            goto out;
        if (!o->quiet)
            printf("log: %s/eval.jsonl\n", o->log_dir);
    }
    rc = 0;
out:
    free(names);
    free(ids);
    free(xv);
    if (rc)
        return fail(&f, &d);
    inf_free(&f);
    return 0;
}

/* ---- predict ---- */

/* The .npy dtype string of t (bf16 is written as f32: numpy has no bf16). */
static const char *npy_descr(DType t)
{
    switch (t) {
    case DT_F32:
    case DT_BF16: return "<f4";
    case DT_F16: return "<f2";
    case DT_I32: return "<i4";
    case DT_I64: return "<i8";
    case DT_U8: return "|u1";
    default: break;
    }
    return NULL;
}

/* Writes the tensors as DIR/NAME.npy (version 1.0) into a fresh temp
 * directory beside DIR, then renames it to DIR: DIR holds all of them or is
 * left as it was. dir has no trailing '/'. */
static bool write_npy_dir(const char *dir, const StTensor *t, int n, Diag *d)
{
    char *tmp = xasprintf("%s.tmp.%ld", dir, (long)getpid());
    bool ok = mkdir(tmp, 0777) == 0;
    if (!ok)
        snprintf(d->msg, sizeof d->msg, "--out %s/: cannot create %s: %s", dir, tmp,
                 strerror(errno));
    for (int i = 0; i < n && ok; i++) {
        char hdr[256];
        int k = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                         npy_descr(t[i].dtype));
        for (int j = 0; j < t[i].rank; j++)
            k += snprintf(hdr + k, sizeof hdr - (size_t)k, "%lld%s", (long long)t[i].dim[j],
                          t[i].rank == 1 ? "," : j + 1 < t[i].rank ? ", " : "");
        k += snprintf(hdr + k, sizeof hdr - (size_t)k, "), }");
        int total = 10 + k + 1, pad = (64 - total % 64) % 64;
        uint8_t pre[10 + 256 + 64];
        memcpy(pre, "\x93NUMPY\x01\x00", 8);
        int hl = k + pad + 1;
        pre[8] = (uint8_t)(hl & 255);
        pre[9] = (uint8_t)(hl >> 8);
        memcpy(pre + 10, hdr, (size_t)k);
        memset(pre + 10 + k, ' ', (size_t)pad);
        pre[10 + k + pad] = '\n';
        size_t plen = (size_t)(10 + hl);
        void *data = t[i].data;
        size_t dlen = t[i].nbytes;
        float *conv = NULL;
        if (t[i].dtype == DT_BF16) { /* widened to f32 */
            size_t cnt = t[i].nbytes / 2;
            conv = xmalloc(cnt * 4 + 1);
            for (size_t e = 0; e < cnt; e++) {
                uint32_t u = (uint32_t)((const uint16_t *)t[i].data)[e] << 16;
                memcpy(&conv[e], &u, 4);
            }
            data = conv;
            dlen = cnt * 4;
        }
        char *path = xasprintf("%s/%s.npy", tmp, t[i].name);
        const void *chunk[2] = {pre, data};
        size_t len[2] = {plen, dlen};
        ok = rt_write_atomic(path, chunk, len, 2, d);
        free(path);
        free(conv);
    }
    if (ok && rename(tmp, dir) != 0) {
        snprintf(d->msg, sizeof d->msg, "--out %s/: cannot rename %s to it: %s", dir, tmp,
                 strerror(errno));
        ok = false;
    }
    if (!ok) { /* remove what the temp directory holds */
        for (int i = 0; i < n; i++) {
            char *path = xasprintf("%s/%s.npy", tmp, t[i].name);
            unlink(path);
            free(path);
        }
        rmdir(tmp);
    }
    free(tmp);
    return ok;
}

static bool dir_empty(const char *dir)
{
    DIR *h = opendir(dir);
    if (!h)
        return false;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(h)))
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(h);
    return empty;
}

/* --out: FILE.safetensors, or DIR/ that is missing or an empty directory;
 * false with d set otherwise, before anything is computed. */
static bool check_out(const char *out, bool *npy, Diag *d)
{
    size_t n = strlen(out);
    const char *ext = ".safetensors";
    *npy = n > 1 && out[n - 1] == '/';
    if (*npy) {
        char *dir = xasprintf("%.*s", (int)(n - 1), out);
        struct stat st;
        bool ok = true;
        if (stat(dir, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                snprintf(d->msg, sizeof d->msg,
                         "--out %s: cannot write (expected a new or empty directory, got %s)",
                         out, rt_file_kind(st.st_mode));
                ok = false;
            } else if (!dir_empty(dir)) {
                snprintf(d->msg, sizeof d->msg,
                         "--out %s: the directory is not empty (expected a new or empty "
                         "directory: kiln predict never mixes its files with others)",
                         out);
                ok = false;
            }
        }
        char *slash = strrchr(dir, '/');
        char *parent = slash ? xasprintf("%.*s", slash == dir ? 1 : (int)(slash - dir), dir)
                             : xstrdup(".");
        if (ok && (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))) {
            snprintf(d->msg, sizeof d->msg,
                     "--out %s: cannot write (expected an existing directory %s to hold it)",
                     out, parent);
            ok = false;
        }
        free(parent);
        free(dir);
        return ok;
    }
    if (n <= strlen(ext) || strcmp(out + n - strlen(ext), ext) != 0) {
        snprintf(d->msg, sizeof d->msg,
                 "--out %s: expected FILE.safetensors, or DIR/ for a directory of NAME.npy "
                 "files",
                 out);
        return false;
    }
    return rt_output_path_check("--out", out, false, d);
}

/* The model inputs (by m->g's ids) that none of the outputs reads, in the
 * evaluation graph as the script built it: data tensors may leave them out
 * of the file (the labels, for a model's logits). */
static bool *unread_inputs(const Model *m, const char *const *outs, int n)
{
    const Graph *g = m->eval_g ? m->eval_g : m->g;
    bool *need = xcalloc((size_t)g->t.n + 1, sizeof *need);
    for (int i = 0; i < n; i++) {
        int id = ir_find_output(g, outs[i]);
        if (id >= 0)
            need[id] = true;
    }
    for (int k = g->ops.n - 1; k >= 0; k--) {
        const Op *op = &g->ops.v[k];
        for (int j = 0; need[op->out] && j < op->nin; j++)
            need[op->in[j]] = true;
    }
    bool *opt = xcalloc((size_t)m->g->t.n + 1, sizeof *opt);
    for (int i = 0; i < m->g->t.n; i++) {
        const Tensor *t = &m->g->t.v[i];
        int id = t->kind == TK_INPUT ? ir_find_tensor(g, t->name) : -1;
        opt[i] = id >= 0 && !need[id];
    }
    free(need);
    return opt;
}

int rt_predict(const Model *m, const InferOpts *o)
{
    Inf f = {.m = m, .o = o, .cmd = "predict"};
    Diag d = {{0}};
    bool npy;
    f.optional = unread_inputs(m, o->outputs, o->noutputs);
    if (!check_out(o->out, &npy, &d) || !setup(&f, &d))
        return fail(&f, &d);
    const Graph *g = f.eg;
    int n = o->noutputs;
    StTensor *st = xcalloc((size_t)n + 1, sizeof *st);
    int *ids = xcalloc((size_t)n + 1, sizeof *ids);
    int64_t *row = xcalloc((size_t)n + 1, sizeof *row);
    void **tmp = xcalloc((size_t)n + 1, sizeof *tmp);
    int rc = 1;
    int64_t B = f.r.B, N = 0, left = 0;
    for (int i = 0; i < n; i++) {
        const char *name = o->outputs[i];
        int id = ir_find_output(g, name);
        for (int j = 0; j < i && id >= 0; j++)
            if (strcmp(o->outputs[j], name) == 0) {
                snprintf(d.msg, sizeof d.msg, "--outputs: \"%s\" is named twice", name);
                goto out;
            }
        if (id < 0) {
            char list[1024];
            size_t k = 0;
            list[0] = 0;
            for (int j = 0; j < g->outs.n && k < sizeof list; j++)
                k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", j ? ", " : "",
                                      g->outs.v[j].name);
            snprintf(d.msg, sizeof d.msg,
                     "--outputs: %s has no output \"%s\" (expected one of: %s)", m->path, name,
                     list);
            goto out;
        }
        const Tensor *t = &g->t.v[id];
        if (t->s.rank < 1 || t->s.dim[0] != B) {
            char a[128];
            snprintf(d.msg, sizeof d.msg,
                     "--outputs: output \"%s\" is %s, not one row per example (expected a "
                     "leading dimension of %lld, the batch)",
                     name, shape_str(NULL, &t->s, a, sizeof a), (long long)B);
            goto out;
        }
        if (!npy_descr(t->s.dtype))
            die("predict: output %s has dtype %s", name, dtype_name(t->s.dtype));
        ids[i] = id;
        row[i] = shape_numel(&t->s) / B * dtype_size(t->s.dtype);
    }
    if ((N = rt_data_examples(f.r.ds, f.split, false, &left, &d)) < 0)
        goto out;
    if (N == 0) {
        snprintf(d.msg, sizeof d.msg, "no examples (expected at least 1, got 0)");
        goto out;
    }
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    double mem = pages > 0 && psize > 0 ? (double)pages * (double)psize : 0, all = 0;
    for (int i = 0; i < n; i++)
        all += (double)N * (double)row[i];
    if (mem > 0 && all > mem) { /* held whole until written: refused before any run */
        snprintf(d.msg, sizeof d.msg,
                 "--outputs: %lld examples of them need %.4g bytes, more than this machine's "
                 "memory (%.4g bytes; kiln predict holds them until it writes --out): predict "
                 "fewer examples at a time",
                 (long long)N, all, mem);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const Tensor *t = &g->t.v[ids[i]];
        double bytes = (double)N * (double)row[i];
        st[i].name = (char *)o->outputs[i];
        st[i].dtype = t->s.dtype;
        st[i].rank = t->s.rank;
        memcpy(st[i].dim, t->s.dim, sizeof st[i].dim);
        st[i].dim[0] = N;
        st[i].nbytes = (size_t)bytes;
        if (bytes > 9e18 || !(st[i].data = malloc(st[i].nbytes + 1))) {
            snprintf(d.msg, sizeof d.msg,
                     "--outputs: \"%s\" for %lld examples needs %.4g bytes, more than this "
                     "machine can allocate",
                     o->outputs[i], (long long)N, bytes);
            goto out;
        }
        tmp[i] = xmalloc((size_t)(row[i] * B) + 1);
    }
    for (int64_t first = 0; first < N; first += B) {
        int64_t k = N - first < B ? N - first : B;
        if (rt_stop_signal()) {
            snprintf(d.msg, sizeof d.msg, "stopped by %s after %lld of %lld examples; nothing "
                     "written", rt_signal_name(rt_stop_signal()), (long long)first, (long long)N);
            goto out;
        }
        const DataBatch *b = rt_data_range(f.r.ds, f.split, first, k);
        rt_data_feed(f.ee, g, b, 0);
        if (!rt_exec_run(f.ee, m->train.seed, 0, &d))
            goto out;
        for (int i = 0; i < n; i++) {
            rt_exec_read(f.ee, ids[i], tmp[i]);
            memcpy((uint8_t *)st[i].data + first * row[i], tmp[i], (size_t)(k * row[i]));
        }
    }
    if (npy) {
        char *dir = xasprintf("%.*s", (int)(strlen(o->out) - 1), o->out);
        bool ok = write_npy_dir(dir, st, n, &d);
        free(dir);
        if (!ok)
            goto out;
    } else {
        char nbuf[32], what[1200];
        snprintf(nbuf, sizeof nbuf, "%lld", (long long)N);
        data_what(&f, what, sizeof what);
        const char *key[] = {"model", "weights", "data", "examples"};
        const char *val[] = {m->path, o->init_from, what, nbuf};
        if (!rt_st_write(o->out, st, n, key, val, 4, &d)) {
            char msg[sizeof d.msg];
            snprintf(msg, sizeof msg, "%s", d.msg);
            snprintf(d.msg, sizeof d.msg, "--out: %.1900s", msg);
            goto out;
        }
    }
    if (!o->quiet) {
        char what[1200];
        data_what(&f, what, sizeof what);
        printf("predict: %s: %lld example%s, %lld batch%s of %lld", what, (long long)N,
               N == 1 ? "" : "s", (long long)((N + B - 1) / B), (N + B - 1) / B == 1 ? "" : "es",
               (long long)B);
        if (left)
            printf("; the last %lld symbol%s fill no window of T=%lld: left out", (long long)left,
                   left == 1 ? "" : "s", (long long)f.r.T);
        printf("\n");
        for (int i = 0; i < n; i++) {
            Shape s = shape_make(st[i].dtype, st[i].rank, st[i].dim);
            char a[128];
            printf("  %s %s\n", st[i].name, shape_str(NULL, &s, a, sizeof a));
        }
        printf("wrote %s\n", o->out);
    }
    rc = 0;
out:
    for (int i = 0; i < n; i++) {
        free(st[i].data);
        free(tmp[i]);
    }
    free(st);
    free(ids);
    free(row);
    free(tmp);
    if (rc)
        return fail(&f, &d);
    inf_free(&f);
    return 0;
}
