/* graph.c - the opcode table, graph construction, and the one set of typing
 * rules (ir_infer) that builders and the verifier share. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

const OpInfo ir_opinfo[OP__COUNT] = {
#define X(e, s, n, c, a, f) [OP_##e] = {s, n, c, a, f},
    IR_OPCODES(X)
#undef X
};

int ir_opcode_parse(const char *name)
{
    for (int i = 0; i < OP__COUNT; i++)
        if (strcmp(ir_opinfo[i].name, name) == 0)
            return i;
    return -1;
}

const char *ir_class_name(OpClass c)
{
    static const char *n[OC__COUNT] = {"elementwise", "reduce",     "gemm",     "move",
                                       "collective",  "random",     "attention"};
    return (unsigned)c < OC__COUNT ? n[c] : "?";
}

static const char *dtype_names[DT__COUNT] = {"f32", "bf16", "f16", "i32", "i64", "u8"};
static const int dtype_sizes[DT__COUNT] = {4, 2, 2, 4, 8, 1};

const char *dtype_name(DType t) { return (unsigned)t < DT__COUNT ? dtype_names[t] : "?"; }
int dtype_size(DType t) { return (unsigned)t < DT__COUNT ? dtype_sizes[t] : 0; }
bool dtype_is_float(DType t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

int dtype_parse(const char *s)
{
    for (int i = 0; i < DT__COUNT; i++)
        if (strcmp(dtype_names[i], s) == 0)
            return i;
    return -1;
}

const char *ir_kind_name(TensorKind k)
{
    static const char *n[] = {"temp", "input", "param", "state", "const"};
    return (unsigned)k <= TK_CONST ? n[k] : "?";
}

/* ---- shapes --------------------------------------------------------------- */

int64_t shape_numel(const Shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++)
        if (!ir_mul_ok(n, s->dim[i], &n))
            return INT64_MAX;
    return n;
}

int64_t shape_bytes(const Shape *s)
{
    int64_t b;
    return ir_mul_ok(shape_numel(s), dtype_size(s->dtype), &b) ? b : INT64_MAX;
}

bool ir_shape_check(const Graph *g, const Shape *s, char *err, size_t errlen)
{
    (void)g; /* dims print as numbers: the user sees the values, not the names */
    char b0[200];
    int64_t n = 1;
    double approx = 1; /* the true count, for the message */
    bool over = false;
    for (int i = 0; i < s->rank; i++) {
        if (s->dim[i] < 1) {
            if (err)
                snprintf(err, errlen, "dimension %d of the shape %s must be positive "
                         "(expected >= 1, got %lld)", i, shape_str(NULL, s, b0, sizeof b0),
                         (long long)s->dim[i]);
            return false;
        }
        approx *= (double)s->dim[i];
        if (!over && (!ir_mul_ok(n, s->dim[i], &n) || n > IR_MAX_NUMEL))
            over = true;
    }
    if (over) {
        if (err)
            snprintf(err, errlen, "the shape %s has more than 2^62 elements (expected at "
                     "most %lld, got %.4g)", shape_str(NULL, s, b0, sizeof b0),
                     (long long)IR_MAX_NUMEL, approx);
        return false;
    }
    int64_t bytes;
    if (!ir_mul_ok(n, dtype_size(s->dtype), &bytes) || bytes > IR_MAX_NUMEL) {
        if (err)
            snprintf(err, errlen, "the shape %s takes more than 2^62 bytes (expected at "
                     "most %lld, got %lld elements of %d bytes)",
                     shape_str(NULL, s, b0, sizeof b0), (long long)IR_MAX_NUMEL,
                     (long long)n, dtype_size(s->dtype));
        return false;
    }
    return true;
}

bool shape_eq(const Shape *a, const Shape *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dim[i] != b->dim[i])
            return false;
    return true;
}

bool shape_dims_eq(const Shape *a, const Shape *b)
{
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dim[i] != b->dim[i])
            return false;
    return true;
}

Shape shape_make(DType dt, int rank, const int64_t *dim)
{
    Shape s = {.dtype = dt, .rank = rank};
    if (rank < 0 || rank > IR_MAX_RANK)
        die("shape_make: rank %d", rank);
    for (int i = 0; i < rank; i++)
        s.dim[i] = dim[i];
    return s;
}

const char *shape_str(const Graph *g, const Shape *s, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s[", dtype_name(s->dtype));
    for (int i = 0; i < s->rank; i++) {
        const char *sym = g ? s->dname[i] : NULL;
        const char *sep = i ? "," : "";
        if (sym)
            k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%s", sep, sym);
        else
            k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%lld", sep,
                                  (long long)s->dim[i]);
    }
    snprintf(buf + k, k < n ? n - k : 0, "]");
    return buf;
}

void ir_attr_set_shape(OpAttr *a, const Shape *s)
{
    a->rank = s->rank;
    for (int i = 0; i < IR_MAX_RANK; i++) {
        a->shape[i] = i < s->rank ? s->dim[i] : 0;
        a->dname[i] = i < s->rank ? s->dname[i] : NULL;
    }
}

/* ---- graph ---------------------------------------------------------------- */

Graph *ir_new(void) { return xcalloc(1, sizeof(Graph)); }

void ir_free(Graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->ops.n; i++)
        free(g->ops.v[i].in);
    vec_free(&g->t);
    vec_free(&g->ops);
    vec_free(&g->syms);
    vec_free(&g->outs);
    vec_free(&g->upd);
    free(g);
}

#define VEC_COPY(dst, src)                                                     \
    do {                                                                       \
        (dst)->n = (dst)->cap = (src)->n;                                      \
        (dst)->v = xmalloc((size_t)((src)->n ? (src)->n : 1) * sizeof *(src)->v); \
        if ((src)->n)                                                          \
            memcpy((dst)->v, (src)->v, (size_t)(src)->n * sizeof *(src)->v);   \
    } while (0)

Graph *ir_clone(const Graph *g)
{
    Graph *c = ir_new();
    VEC_COPY(&c->t, &g->t);
    VEC_COPY(&c->ops, &g->ops);
    VEC_COPY(&c->syms, &g->syms);
    VEC_COPY(&c->outs, &g->outs);
    VEC_COPY(&c->upd, &g->upd);
    for (int i = 0; i < c->ops.n; i++) {
        Op *op = &c->ops.v[i];
        int *in = xmalloc(sizeof(int) * (size_t)(op->nin ? op->nin : 1));
        memcpy(in, op->in, sizeof(int) * (size_t)op->nin);
        op->in = in;
    }
    return c;
}

static int new_tensor(Graph *g, Shape s, TensorKind kind, const char *name, int op)
{
    Tensor t = {.id = g->t.n, .s = s, .kind = kind, .name = intern(name), .op = op};
    vec_push(&g->t, t);
    return t.id;
}

int ir_add_input(Graph *g, TensorKind kind, const char *name, Shape s, ParamInit init)
{
    if (kind != TK_INPUT && kind != TK_PARAM && kind != TK_STATE)
        die("ir_add_input: kind %s", ir_kind_name(kind));
    ir_check_names(g, &s);
    int id = new_tensor(g, s, kind, name, -1);
    g->t.v[id].init = init;
    return id;
}

void ir_add_output(Graph *g, const char *name, int t)
{
    GraphOutput o = {intern(name), t};
    vec_push(&g->outs, o);
}

int ir_find_output(const Graph *g, const char *name)
{
    for (int i = 0; i < g->outs.n; i++)
        if (strcmp(g->outs.v[i].name, name) == 0)
            return g->outs.v[i].t;
    return -1;
}

int ir_find_tensor(const Graph *g, const char *name)
{
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].name && strcmp(g->t.v[i].name, name) == 0)
            return i;
    return -1;
}

void ir_add_update(Graph *g, int target, int value)
{
    GraphUpdate u = {target, value};
    vec_push(&g->upd, u);
}

void ir_add_sym(Graph *g, const char *name, int64_t value)
{
    for (int i = 0; i < g->syms.n; i++)
        if (strcmp(g->syms.v[i].name, name) == 0) {
            g->syms.v[i].value = value;
            return;
        }
    Sym s = {intern(name), value};
    vec_push(&g->syms, s);
}

int *ir_use_counts(const Graph *g)
{
    int *uses = xcalloc((size_t)g->t.n, sizeof(int));
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            uses[g->ops.v[i].in[j]]++;
    for (int i = 0; i < g->outs.n; i++)
        uses[g->outs.v[i].t]++;
    for (int i = 0; i < g->upd.n; i++)
        uses[g->upd.v[i].value]++;
    return uses;
}

void ir_readers_build(const Graph *g, IrReaders *r)
{
    int nt = g->t.n;
    r->nt = nt;
    r->start = xcalloc((size_t)nt + 2, sizeof(int));
    int total = 0;
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++, total++)
            r->start[g->ops.v[i].in[j] + 1]++;
    for (int t = 0; t < nt; t++)
        r->start[t + 1] += r->start[t];
    r->op = xmalloc(sizeof(int) * (size_t)(total + 1));
    int *fill = xcalloc((size_t)nt + 1, sizeof(int));
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++) {
            int t = g->ops.v[i].in[j];
            r->op[r->start[t] + fill[t]++] = i;
        }
    free(fill);
}

void ir_readers_free(IrReaders *r)
{
    free(r->start);
    free(r->op);
    r->start = r->op = NULL;
    r->nt = 0;
}

void ir_compact(Graph *g) { ir_renumber(g, true); }

void ir_reorder_ops(Graph *g, const int *order, int n)
{
    int n0 = g->ops.n;
    if (n < 0 || n > n0)
        die("ir_reorder_ops: %d ops ordered, the graph has %d", n, n0);
    bool *kept = xcalloc((size_t)n0 + 1, sizeof(bool));
    Op *ops = xmalloc(sizeof(Op) * (size_t)(n + 1));
    for (int k = 0; k < n; k++) {
        int i = order[k];
        if (i < 0 || i >= n0 || kept[i])
            die("ir_reorder_ops: op %d named twice or out of range", i);
        kept[i] = true;
        ops[k] = g->ops.v[i];
    }
    for (int i = 0; i < n0; i++) {
        if (kept[i])
            continue;
        Op *op = &g->ops.v[i];
        free(op->in);
        g->t.v[op->out].op = -1;
        g->t.v[op->out].kind = TK_INPUT;
    }
    for (int k = 0; k < n; k++) {
        g->ops.v[k] = ops[k];
        g->t.v[ops[k].out].op = k;
    }
    g->ops.n = n;
    free(ops);
    free(kept);
}

void ir_drop_ops(Graph *g, const bool *drop)
{
    int *order = xmalloc(sizeof(int) * (size_t)(g->ops.n + 1)), n = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (!drop[i])
            order[n++] = i;
    ir_reorder_ops(g, order, n);
    free(order);
}

void ir_renumber(Graph *g, bool drop_unused_inputs)
{
    int n = g->t.n;
    int *map = xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    bool *used = xcalloc((size_t)(n ? n : 1), sizeof(bool));
    for (int i = 0; i < n; i++)
        map[i] = -1;
    for (int i = 0; i < g->ops.n; i++) {
        for (int j = 0; j < g->ops.v[i].nin; j++)
            used[g->ops.v[i].in[j]] = true;
        used[g->ops.v[i].out] = true;
    }
    for (int i = 0; i < g->outs.n; i++)
        used[g->outs.v[i].t] = true;
    for (int i = 0; i < g->upd.n; i++)
        used[g->upd.v[i].target] = used[g->upd.v[i].value] = true;

    Tensor *nt = xmalloc(sizeof(Tensor) * (size_t)(n ? n : 1));
    int k = 0;
    /* graph inputs keep their declaration order; params and state are kept
     * even when unused, since the runtime saves and loads them by name */
    for (int i = 0; i < n; i++) {
        Tensor *t = &g->t.v[i];
        if (t->op >= 0 || (drop_unused_inputs && !used[i] && t->kind == TK_INPUT))
            continue;
        map[i] = k;
        nt[k] = *t;
        nt[k].id = k;
        k++;
    }
    for (int i = 0; i < g->ops.n; i++) {
        Op *op = &g->ops.v[i];
        int o = op->out;
        map[o] = k;
        nt[k] = g->t.v[o];
        nt[k].id = k;
        nt[k].op = i;
        k++;
    }
    for (int i = 0; i < g->ops.n; i++) {
        Op *op = &g->ops.v[i];
        for (int j = 0; j < op->nin; j++)
            op->in[j] = map[op->in[j]];
        op->out = map[op->out];
    }
    for (int i = 0; i < g->outs.n; i++)
        g->outs.v[i].t = map[g->outs.v[i].t];
    for (int i = 0; i < g->upd.n; i++) {
        g->upd.v[i].target = map[g->upd.v[i].target];
        g->upd.v[i].value = map[g->upd.v[i].value];
    }
    free(g->t.v);
    g->t.v = nt;
    g->t.n = k;
    g->t.cap = n ? n : 1;
    free(map);
    free(used);
}

/* ---- typing rules ------------------------------------------------------------ */

#define FAIL(...)                                    \
    do {                                             \
        if (err)                                     \
            snprintf(err, errlen, __VA_ARGS__);      \
        return false;                                \
    } while (0)

static bool is_int(DType t) { return t == DT_I32 || t == DT_I64; }

/* A backward attention op's dO (the output's type o), lse and delta (row). */
static bool attention_grad_operands(const Graph *g, const char *name, const Shape *const *s,
                                    const Shape *o, const Shape *row, char *err, size_t errlen)
{
    char b0[160], b1[160], b2[160];
    const Shape *dO = s[3], *lse = s[4], *delta = s[5];
    if (!shape_eq(dO, o))
        FAIL("%s: dO must have the output's type (expected %s, got %s)", name,
             shape_str(g, o, b0, sizeof b0), shape_str(g, dO, b1, sizeof b1));
    if (!shape_eq(lse, row) || !shape_eq(delta, row))
        FAIL("%s: lse and delta must be %s (got %s and %s)", name,
             shape_str(g, row, b0, sizeof b0), shape_str(g, lse, b1, sizeof b1),
             shape_str(g, delta, b2, sizeof b2));
    return true;
}

/* attention_dqkv's typing past the head layout's (ir.h): q, k, v of one
 * type [B, T, 3*H*D] whose three head ranges partition the columns. */
static bool infer_attention_dqkv(const Graph *g, const Shape *const *s, const OpAttr *a,
                                 Shape *out, char *err, size_t errlen)
{
    char b0[160], b1[160], b2[160];
    int64_t W = a->ia[1] * a->ia[2], WK = ir_attn_kvh(a) * a->ia[2];
    int64_t w[3] = {W, WK, WK};
    if (!shape_eq(s[1], s[0]) || !shape_eq(s[2], s[0]) || s[0]->dim[2] != W + 2 * WK)
        FAIL("attention_dqkv: q, k and v must be one type [B, T, %lld+2*%lld] (got %s, %s and "
             "%s)",
             (long long)W, (long long)WK, shape_str(g, s[0], b0, sizeof b0),
             shape_str(g, s[1], b1, sizeof b1), shape_str(g, s[2], b2, sizeof b2));
    const int64_t *off = &a->ia[3];
    for (int x = 0; x < 3; x++)
        for (int y = x + 1; y < 3; y++)
            if (off[x] < off[y] + w[y] && off[y] < off[x] + w[x])
                FAIL("attention_dqkv: the q, k and v columns must not overlap (got qoff=%lld, "
                     "koff=%lld, voff=%lld, heads*hd=%lld)",
                     (long long)off[0], (long long)off[1], (long long)off[2], (long long)W);
    *out = *s[0];
    return true;
}

/* The head layout's typing (ir.h): q, k, v rank 3 [B, T, W] of one float
 * dtype and B, each head's columns inside its rows; o, dO and the
 * gradients [B, T, H*D]; lse and delta f32 [B, Tq, H, 1]. */
static bool infer_attention_heads(const Graph *g, Opcode code, const Shape *const *s,
                                  const OpAttr *a, Shape *out, char *err, size_t errlen)
{
    char b0[160];
    const char *name = ir_opinfo[code].name;
    int nqkv = code == OP_ATTENTION_LSE ? 2 : 3;
    int64_t H = a->ia[1], D = a->ia[2], W, K = ir_attn_kvh(a), WK;
    if (H < 1 || D < 1 || !ir_mul_ok(H, D, &W))
        FAIL("%s: heads and hd must be >= 1 (got heads=%lld, hd=%lld)", name, (long long)H,
             (long long)D);
    if (K < 1 || H % K)
        FAIL("%s: kvh must divide heads (got kvh=%lld, heads=%lld)", name, (long long)K,
             (long long)H);
    WK = K * D;
    static const char *const opnd[3] = {"q", "k", "v"};
    for (int x = 0; x < nqkv; x++) {
        int64_t Wx = x ? WK : W, Hx = x ? K : H;
        const Shape *t = s[x];
        if (t->rank != 3 || !dtype_is_float(t->dtype) || t->dtype != s[0]->dtype ||
            t->dim[0] != s[0]->dim[0])
            FAIL("%s: the head layout needs q, k and v [B, T, W] of one float dtype and B "
                 "(got %s %s)", name, opnd[x], shape_str(g, t, b0, sizeof b0));
        int64_t off = a->ia[3 + x], end;
        if (off < 0 || !ir_add_ok(off, Wx, &end) || end > t->dim[2])
            FAIL("%s: %s's heads [%lld, %lld + %lld*%lld) must lie inside its rows (got %s)",
                 name, opnd[x], (long long)off, (long long)off, (long long)Hx, (long long)D,
                 shape_str(g, t, b0, sizeof b0));
    }
    int64_t B = s[0]->dim[0], Tq = s[0]->dim[1], Tk = s[1]->dim[1];
    if (nqkv == 3 && s[2]->dim[1] != Tk)
        FAIL("%s: k and v lengths differ (expected %lld, got %lld)", name, (long long)Tk,
             (long long)s[2]->dim[1]);
    if (a->ia[0] && Tq != Tk)
        FAIL("%s: causal attention needs Tq == Tk (got %lld and %lld)", name, (long long)Tq,
             (long long)Tk);
    Shape row = shape_make(DT_F32, 4, (int64_t[]){B, Tq, H, 1});
    Shape o = shape_make(s[0]->dtype, 3, (int64_t[]){B, Tq, W});
    if (code == OP_ATTENTION_LSE || code == OP_ATTENTION) {
        *out = code == OP_ATTENTION ? o : row;
        return true;
    }
    if (!attention_grad_operands(g, name, s, &o, &row, err, errlen))
        return false;
    if (code == OP_ATTENTION_DQKV)
        return infer_attention_dqkv(g, s, a, out, err, errlen);
    *out = o;
    if (code != OP_ATTENTION_DQ) {
        out->dim[1] = Tk;
        out->dim[2] = WK;
    }
    return true;
}

/* The attention family's typing (ir.h states the semantics): q k v share one
 * float dtype and the batch dims; lse and delta are f32 [..., Tq, 1]. */
static bool infer_attention_ops(const Graph *g, Opcode code, const Shape *const *s,
                                const OpAttr *a, Shape *out, char *err, size_t errlen)
{
    char b0[160], b1[160], b2[160];
    const char *name = ir_opinfo[code].name;
    if ((a->nia != 1 && a->nia != 6 && a->nia != 8) ||
        (a->ia[0] != 0 && a->ia[0] != 1))
        FAIL("%s: needs causal=0 or causal=1 (got %lld)", name,
             (long long)(a->nia ? a->ia[0] : -1));
    if (ir_attn_window(a) < 0 || (ir_attn_window(a) && !a->ia[0]))
        FAIL("%s: window needs causal=1 and window >= 1 (got causal=%lld, window=%lld)", name,
             (long long)a->ia[0], (long long)ir_attn_window(a));
    if (!(a->f > 0) || a->f > 1e30)
        FAIL("%s: scale must be positive and finite (got %g)", name, a->f);
    if (ir_attn_heads(a))
        return infer_attention_heads(g, code, s, a, out, err, errlen);
    if (code == OP_ATTENTION_DQKV)
        FAIL("attention_dqkv: needs the head layout (heads, hd, qoff, koff, voff)");
    const Shape *q = s[0], *k = s[1], *v = code == OP_ATTENTION_LSE ? NULL : s[2];
    int rk = q->rank;
    if (rk < 2 || k->rank != rk || (v && v->rank != rk))
        FAIL("%s: q, k and v need one rank >= 2 (got %s, %s%s%s)", name,
             shape_str(g, q, b0, sizeof b0), shape_str(g, k, b1, sizeof b1), v ? " and " : "",
             v ? shape_str(g, v, b2, sizeof b2) : "");
    if (!dtype_is_float(q->dtype) || k->dtype != q->dtype || (v && v->dtype != q->dtype))
        FAIL("%s: q, k and v need one float dtype (got %s, %s%s%s)", name,
             dtype_name(q->dtype), dtype_name(k->dtype), v ? " and " : "",
             v ? dtype_name(v->dtype) : "");
    /* k and v may have fewer heads (the axis before Tk) than q: grouped */
    for (int i = 0; i < rk - 2; i++)
        if ((i == rk - 3 ? k->dim[i] < 1 || q->dim[i] % k->dim[i] : k->dim[i] != q->dim[i]) ||
            (v && v->dim[i] != k->dim[i]))
            FAIL("%s: batch dimensions differ (got %s, %s%s%s)", name,
                 shape_str(g, q, b0, sizeof b0), shape_str(g, k, b1, sizeof b1),
                 v ? " and " : "", v ? shape_str(g, v, b2, sizeof b2) : "");
    int64_t Tq = q->dim[rk - 2], D = q->dim[rk - 1], Tk = k->dim[rk - 2];
    if (k->dim[rk - 1] != D)
        FAIL("%s: q and k head sizes differ (expected %lld, got %lld)", name, (long long)D,
             (long long)k->dim[rk - 1]);
    if (v && v->dim[rk - 2] != Tk)
        FAIL("%s: k and v lengths differ (expected %lld, got %lld)", name, (long long)Tk,
             (long long)v->dim[rk - 2]);
    if (a->ia[0] && Tq != Tk)
        FAIL("%s: causal attention needs Tq == Tk (got %lld and %lld)", name, (long long)Tq,
             (long long)Tk);
    Shape row = *q; /* f32 [..., Tq, 1] */
    row.dtype = DT_F32;
    row.dim[rk - 1] = 1;
    if (code == OP_ATTENTION_LSE) {
        *out = row;
        return true;
    }
    Shape o = *q;
    o.dim[rk - 1] = v->dim[rk - 1];
    if (code == OP_ATTENTION) {
        *out = o;
        return true;
    }
    if (!attention_grad_operands(g, name, s, &o, &row, err, errlen))
        return false;
    *out = code == OP_ATTENTION_DQ ? *q : code == OP_ATTENTION_DK ? *k : *v;
    return true;
}

/* The attention family with its operand count and the bias or mask
 * (ir.h): nin = ir_attn_nbase(code), one more with {bias} or {mask}. */
static bool infer_attention(const Graph *g, Opcode code, const Shape *const *s, int nin,
                            const OpAttr *a, Shape *out, char *err, size_t errlen)
{
    char b0[160];
    const char *name = ir_opinfo[code].name;
    int base = ir_attn_nbase(code), kind = ir_attn_bias(a);
    if (a->nia == 8 && kind == 3)
        FAIL("%s: needs bias=1 or mask=1, not both", name);
    if (nin != base + (kind != 0))
        FAIL("%s takes %d operands%s (expected %d, got %d)", name, base + (kind != 0),
             kind == IR_ATTN_BIAS ? " with {bias=1}" : kind == IR_ATTN_MASK ? " with {mask=1}" : "",
             base + (kind != 0), nin);
    if (!infer_attention_ops(g, code, s, a, out, err, errlen))
        return false;
    if (!kind)
        return true;
    const Shape *q = s[0], *k = s[1], *b = s[base];
    int64_t lead[IR_MAX_RANK], Tq, Tk;
    int nl;
    if (ir_attn_heads(a)) {
        lead[0] = q->dim[0], lead[1] = a->ia[1], nl = 2;
        Tq = q->dim[1], Tk = k->dim[1];
    } else {
        nl = q->rank - 2;
        for (int x = 0; x < nl; x++)
            lead[x] = q->dim[x];
        Tq = q->dim[nl], Tk = k->dim[nl];
    }
    bool dt_ok = kind == IR_ATTN_MASK ? b->dtype == DT_U8 : dtype_is_float(b->dtype);
    if (!dt_ok || !ir_attn_bias_fits(lead, nl, Tq, Tk, b, NULL)) {
        lead[nl] = Tq, lead[nl + 1] = Tk;
        Shape sc = shape_make(DT_F32, nl + 2, lead);
        char b1[160];
        FAIL("%s: the %s must be %s broadcastable to the scores %s, its leading dims that are "
             "not 1 side by side (got %s)",
             name, kind == IR_ATTN_MASK ? "mask" : "bias",
             kind == IR_ATTN_MASK ? "a u8 tensor" : "a float tensor",
             shape_str(g, &sc, b1, sizeof b1), shape_str(g, b, b0, sizeof b0));
    }
    return true;
}

/* Result type of an AK_SHARD op (see ir.h): attributes in range, shard
 * tensors f32[ir_shard_size], the operands' flat range inside total. */
static bool shard_infer(const Graph *g, Opcode code, const int *in, int nin, const OpAttr *a,
                        Shape *r, char *err, size_t errlen)
{
    const char *nm = ir_opinfo[code].name;
    char b0[128];
    bool async = code == OP_REDUCE_SCATTER_START || code == OP_REDUCE_SCATTER_WAIT ||
                 code == OP_ALL_GATHER_START || code == OP_ALL_GATHER_WAIT;
    if (a->nia != 4 || a->ia[0] < (async ? 0 : -1) || a->ia[1] < 0 || a->ia[2] < 1 ||
        a->ia[3] < 1 || a->ia[1] >= a->ia[2])
        FAIL("%s: needs {bucket=B,start=S,total=T,nranks=N} with %s, 0 <= S < T, N >= 1",
             nm, async ? "B >= 0" : "B >= -1");
    /* operands: [token] [shard] data... (shard_pack and reduce_scatter
     * make their shard; the others read or write one) */
    bool own = code == OP_SHARD_PACK || code == OP_REDUCE_SCATTER;
    int tok = code == OP_REDUCE_SCATTER_WAIT || code == OP_ALL_GATHER_WAIT;
    int data = tok + !own;
    if (nin < data + 1 || (code == OP_ALL_GATHER && nin != 2) ||
        (code == OP_ALL_GATHER_WAIT && nin != 3))
        FAIL("%s: wrong number of operands (expected %s%d, got %d)", nm,
             code == OP_ALL_GATHER || code == OP_ALL_GATHER_WAIT ? "" : "at least ", data + 1,
             nin);
    if (tok) {
        const Shape *t = &g->t.v[in[0]].s;
        if (t->dtype != DT_U8 || t->rank != 0)
            FAIL("%s: operand 0 must be a start token (expected u8[], got %s)", nm,
                 shape_str(g, t, b0, sizeof b0));
    }
    int64_t S = ir_shard_size(a->ia[2], a->ia[3]);
    Shape ss = shape_make(DT_F32, 1, (int64_t[]){S});
    if (!own) {
        const Shape *sh = &g->t.v[in[tok]].s;
        if (!shape_eq(sh, &ss))
            FAIL("%s: operand %d must be a shard (expected f32[%lld], got %s)", nm, tok,
                 (long long)S, shape_str(g, sh, b0, sizeof b0));
    }
    int64_t span = 0;
    for (int i = data; i < nin; i++) {
        const Shape *x = &g->t.v[in[i]].s;
        if (!dtype_is_float(x->dtype)) /* packed as f32; gathered back rounded to its type */
            FAIL("%s: operand %d needs a float tensor (got %s)", nm, i, dtype_name(x->dtype));
        span = ir_add_sat(span, shape_numel(x));
    }
    if (ir_add_sat(a->ia[1], span) > a->ia[2])
        FAIL("%s: the operands' flat range [%lld, %lld) passes the total %lld", nm,
             (long long)a->ia[1], (long long)ir_add_sat(a->ia[1], span), (long long)a->ia[2]);
    if (code == OP_REDUCE_SCATTER_START || code == OP_ALL_GATHER_START)
        *r = shape_make(DT_U8, 0, NULL);
    else if (code == OP_ALL_GATHER || code == OP_ALL_GATHER_WAIT)
        *r = g->t.v[in[nin - 1]].s;
    else
        *r = ss;
    return true;
}

bool ir_infer(const Graph *g, Opcode code, const int *in, int nin, const OpAttr *a,
              Shape *out, char *err, size_t errlen)
{
    char b0[160], b1[160], b2[160];
    if ((unsigned)code >= OP__COUNT)
        FAIL("unknown opcode %d", (int)code);
    const OpInfo *info = &ir_opinfo[code];
    if (info->arity >= 0 && nin != info->arity)
        FAIL("%s takes %d operands (expected %d, got %d)", info->name, info->arity,
             info->arity, nin);
    if (info->arity < 0 && nin < 1)
        FAIL("%s needs at least one operand (expected >= 1, got %d)", info->name, nin);
    const Shape *s[8] = {0};
    for (int i = 0; i < nin && i < 8; i++) {
        if (in[i] < 0 || in[i] >= g->t.n)
            FAIL("%s: operand %d is not a tensor (expected %%0..%%%d, got %%%d)", info->name,
                 i, g->t.n - 1, in[i]);
        s[i] = &g->t.v[in[i]].s;
    }
    bool attr_shape = info->attr == AK_SHAPE || info->attr == AK_VALUE ||
                      info->attr == AK_KEY || info->attr == AK_START ||
                      (code == OP_IOTA);
    if (attr_shape) {
        if (a->rank < 0 || a->rank > IR_MAX_RANK)
            FAIL("%s: rank out of range (expected 0..%d, got %d)", info->name, IR_MAX_RANK,
                 a->rank);
        for (int i = 0; i < a->rank; i++)
            if (a->shape[i] < 1)
                FAIL("%s: dimension %d must be positive (expected >= 1, got %lld)",
                     info->name, i, (long long)a->shape[i]);
    }
    Shape r = {0};
    switch (info->cls) {
    case OC_ELEMWISE:
        if (code == OP_CONST || code == OP_IOTA) {
            r = shape_make(a->dtype, a->rank, a->shape);
            if ((unsigned)a->dtype >= DT__COUNT)
                FAIL("%s: bad dtype %d", info->name, (int)a->dtype);
            if (code == OP_IOTA && (a->nia != 1 || a->ia[0] < 0 || a->ia[0] >= a->rank))
                FAIL("iota: axis out of range (expected 0..%d, got %lld)", a->rank - 1,
                     (long long)(a->nia ? a->ia[0] : -1));
            break;
        }
        if (code == OP_CAST) {
            r = *s[0];
            if ((unsigned)a->dtype >= DT__COUNT)
                FAIL("cast: bad dtype %d", (int)a->dtype);
            r.dtype = a->dtype;
            break;
        }
        if (code == OP_SELECT) {
            if (s[0]->dtype != DT_U8)
                FAIL("select: mask must be a u8 mask (expected u8, got %s)",
                     dtype_name(s[0]->dtype));
            if (!shape_dims_eq(s[0], s[1]) || !shape_eq(s[1], s[2]))
                FAIL("select: operand shapes differ (expected %s, got %s and %s)",
                     shape_str(g, s[0], b0, sizeof b0), shape_str(g, s[1], b1, sizeof b1),
                     shape_str(g, s[2], b2, sizeof b2));
            r = *s[1];
            break;
        }
        if (nin == 1) {
            if (!dtype_is_float(s[0]->dtype) && code != OP_NEG && code != OP_ABS &&
                code != OP_FLOOR &&
                code != OP_RELU && code != OP_STOP_GRADIENT)
                FAIL("%s: needs a float tensor (expected f32/bf16/f16, got %s)", info->name,
                     dtype_name(s[0]->dtype));
            r = *s[0];
            break;
        }
        /* binary */
        if (!shape_eq(s[0], s[1]))
            FAIL("%s: operand types differ (expected %s, got %s)", info->name,
                 shape_str(g, s[0], b0, sizeof b0), shape_str(g, s[1], b1, sizeof b1));
        if (s[0]->dtype == DT_U8 && code != OP_EQ && code != OP_NE && code != OP_MAX &&
            code != OP_MIN && code != OP_MUL)
            FAIL("%s: not defined on u8 masks (expected a numeric type, got u8)",
                 info->name);
        if (code == OP_POW && !dtype_is_float(s[0]->dtype))
            FAIL("pow: needs float operands (expected f32/bf16/f16, got %s)",
                 dtype_name(s[0]->dtype));
        r = *s[0];
        if (code >= OP_LT && code <= OP_NE)
            r.dtype = DT_U8;
        break;
    case OC_RANDOM:
        r = shape_make(DT_F32, a->rank, a->shape);
        if (a->nia != 1)
            FAIL("random: needs a key attribute");
        break;
    case OC_COLLECTIVE:
        if (info->attr == AK_BUCKET && (a->nia != 1 || a->ia[0] < 0))
            FAIL("%s: needs a bucket attribute (expected {bucket=N}, N >= 0)", info->name);
        if (code == OP_ALLREDUCE_START) {
            for (int i = 0; i < nin; i++)
                if (!dtype_is_float(g->t.v[in[i]].s.dtype))
                    FAIL("allreduce_start: operand %d needs a float tensor (got %s)", i,
                         dtype_name(g->t.v[in[i]].s.dtype));
            r = shape_make(DT_U8, 0, NULL);
            break;
        }
        if (code == OP_ALLREDUCE_WAIT) {
            if (s[0]->dtype != DT_U8 || s[0]->rank != 0)
                FAIL("allreduce_wait: operand 0 must be an allreduce_start token (expected "
                     "u8[], got %s)", shape_str(g, s[0], b0, sizeof b0));
            if (!dtype_is_float(s[1]->dtype))
                FAIL("allreduce_wait: needs a float tensor (got %s)", dtype_name(s[1]->dtype));
            r = *s[1];
            break;
        }
        if (info->attr == AK_SHARD) {
            if (!shard_infer(g, code, in, nin, a, &r, err, errlen))
                return false;
            break;
        }
        if (info->attr == AK_TP) {
            if (a->nia < 3 || a->nia > 4 || a->ia[1] < 1 || a->ia[2] < 0 ||
                a->ia[2] >= a->ia[1])
                FAIL("%s: needs {axis=A,n=N,rank=R} with N >= 1 and 0 <= R < N", info->name);
            if (a->nia == 4 && (code != OP_TP_ALL_GATHER || a->ia[3] < 0 || a->ia[3] > 1))
                FAIL("%s: sum= is tp_all_gather's only, 0 or 1 (got %lld)", info->name,
                     (long long)a->ia[3]);
            if (!dtype_is_float(s[0]->dtype))
                FAIL("%s: needs a float tensor (got %s)", info->name, dtype_name(s[0]->dtype));
            r = *s[0];
            if (code == OP_TP_ALL_GATHER || code == OP_TP_REDUCE_SCATTER) {
                int ax = (int)a->ia[0];
                if (ax < 0 || ax >= r.rank)
                    FAIL("%s: axis out of range (expected 0..%d, got %lld)", info->name,
                         r.rank - 1, (long long)a->ia[0]);
                if (code == OP_TP_ALL_GATHER) {
                    if (!ir_mul_ok(r.dim[ax], a->ia[1], &r.dim[ax]))
                        FAIL("tp_all_gather: the gathered dim overflows");
                } else {
                    if (r.dim[ax] % a->ia[1] != 0)
                        FAIL("tp_reduce_scatter: dim %d (%lld) does not divide by n = %lld",
                             ax, (long long)r.dim[ax], (long long)a->ia[1]);
                    r.dim[ax] /= a->ia[1];
                }
            }
            break;
        }
        if (!dtype_is_float(s[0]->dtype))
            FAIL("allreduce: needs a float tensor (got %s)", dtype_name(s[0]->dtype));
        r = *s[0];
        break;
    case OC_REDUCE: {
        r = *s[0];
        if (a->nia < 1)
            FAIL("%s: needs at least one axis", info->name);
        for (int i = 0; i < a->nia; i++) {
            if (a->ia[i] < 0 || a->ia[i] >= r.rank)
                FAIL("%s: axis out of range (expected 0..%d, got %lld)", info->name,
                     r.rank - 1, (long long)a->ia[i]);
            if (i && a->ia[i] <= a->ia[i - 1])
                FAIL("%s: axes must be ascending and distinct", info->name);
            r.dim[a->ia[i]] = 1;
        }
        if (s[0]->dtype == DT_U8)
            FAIL("%s: cannot reduce a u8 mask (expected a numeric type, got u8)", info->name);
        if (code == OP_REDUCE_LOGSUMEXP && !dtype_is_float(s[0]->dtype))
            FAIL("reduce_logsumexp: needs a float tensor (got %s)", dtype_name(s[0]->dtype));
        break;
    }
    case OC_ATTN:
        if (!infer_attention(g, code, s, nin, a, &r, err, errlen))
            return false;
        break;
    case OC_GEMM: {
        const Shape *A = s[0], *B = s[1];
        if (A->rank < 2 || B->rank < 2)
            FAIL("matmul: operands need rank >= 2 (got %s and %s)",
                 shape_str(g, A, b0, sizeof b0), shape_str(g, B, b1, sizeof b1));
        if (A->dtype != B->dtype || !dtype_is_float(A->dtype))
            FAIL("matmul: operand dtypes differ or are not float (got %s and %s)",
                 shape_str(g, A, b0, sizeof b0), shape_str(g, B, b1, sizeof b1));
        if (a->nia != 2)
            FAIL("matmul: needs ta and tb");
        int64_t M = A->dim[A->rank - 2 + (a->ia[0] ? 1 : 0)];
        int64_t KA = A->dim[A->rank - 1 - (a->ia[0] ? 1 : 0)];
        int64_t KB = B->dim[B->rank - 2 + (a->ia[1] ? 1 : 0)];
        int64_t N = B->dim[B->rank - 1 - (a->ia[1] ? 1 : 0)];
        if (KA != KB)
            FAIL("matmul: inner dimensions differ (expected %lld, got %lld; shapes %s and %s)",
                 (long long)KA, (long long)KB, shape_str(g, A, b0, sizeof b0),
                 shape_str(g, B, b1, sizeof b1));
        if (B->rank != 2) {
            if (A->rank != B->rank)
                FAIL("matmul: batch dimensions differ (got %s and %s)",
                     shape_str(g, A, b0, sizeof b0), shape_str(g, B, b1, sizeof b1));
            for (int i = 0; i < A->rank - 2; i++)
                if (A->dim[i] != B->dim[i])
                    FAIL("matmul: batch dimensions differ (got %s and %s)",
                         shape_str(g, A, b0, sizeof b0), shape_str(g, B, b1, sizeof b1));
        }
        r = *A;
        r.dim[r.rank - 2] = M;
        r.dim[r.rank - 1] = N;
        break;
    }
    case OC_MOVE:
        switch (code) {
        case OP_BROADCAST: {
            r = shape_make(s[0]->dtype, a->rank, a->shape);
            if (s[0]->rank > r.rank)
                FAIL("broadcast: cannot broadcast %s to %s (expected rank <= %d)",
                     shape_str(g, s[0], b0, sizeof b0), shape_str(g, &r, b1, sizeof b1),
                     r.rank);
            int off = r.rank - s[0]->rank;
            for (int i = 0; i < s[0]->rank; i++)
                if (s[0]->dim[i] != 1 && s[0]->dim[i] != r.dim[off + i])
                    FAIL("broadcast: cannot broadcast %s to %s",
                         shape_str(g, s[0], b0, sizeof b0), shape_str(g, &r, b1, sizeof b1));
            break;
        }
        case OP_RESHAPE:
            r = shape_make(s[0]->dtype, a->rank, a->shape);
            if (shape_numel(&r) != shape_numel(s[0]))
                FAIL("reshape: element counts differ (expected %lld elements, got %s with %lld)",
                     (long long)shape_numel(s[0]), shape_str(g, &r, b1, sizeof b1),
                     (long long)shape_numel(&r));
            break;
        case OP_PERMUTE: {
            r = *s[0];
            unsigned seen = 0;
            if (a->nia != s[0]->rank)
                FAIL("permute: needs one axis per dimension (expected %d, got %d)",
                     s[0]->rank, a->nia);
            for (int i = 0; i < a->nia; i++) {
                if (a->ia[i] < 0 || a->ia[i] >= s[0]->rank || (seen >> a->ia[i] & 1))
                    FAIL("permute: not a permutation of 0..%d", s[0]->rank - 1);
                seen |= 1u << a->ia[i];
                r.dim[i] = s[0]->dim[a->ia[i]];
            }
            break;
        }
        case OP_SLICE:
        case OP_PAD: {
            r = shape_make(s[0]->dtype, a->rank, a->shape);
            if (a->rank != s[0]->rank || a->nia != s[0]->rank)
                FAIL("%s: needs one start per dimension (expected %d, got %d)", info->name,
                     s[0]->rank, a->nia);
            const Shape *big = code == OP_SLICE ? s[0] : &r;
            const Shape *small = code == OP_SLICE ? &r : s[0];
            for (int i = 0; i < r.rank; i++) {
                int64_t end;
                if (!ir_add_ok(a->ia[i], small->dim[i], &end))
                    end = INT64_MAX;
                if (a->ia[i] < 0 || end > big->dim[i])
                    FAIL("%s: range [%lld, %lld) out of bounds on axis %d (expected within "
                         "0..%lld)",
                         info->name, (long long)a->ia[i], (long long)end, i,
                         (long long)big->dim[i]);
            }
            break;
        }
        case OP_CONCAT: {
            r = *s[0];
            if (a->nia != 1 || a->ia[0] < 0 || a->ia[0] >= r.rank)
                FAIL("concat: axis out of range (expected 0..%d, got %lld)", r.rank - 1,
                     (long long)(a->nia ? a->ia[0] : -1));
            int ax = (int)a->ia[0];
            r.dim[ax] = 0;
            for (int i = 0; i < nin; i++) {
                const Shape *si = &g->t.v[in[i]].s;
                Shape x = *si, y = *s[0];
                x.dim[ax] = y.dim[ax] = 0;
                if (!shape_eq(&x, &y))
                    FAIL("concat: operand %d does not match (expected %s, got %s)", i,
                         shape_str(g, s[0], b0, sizeof b0), shape_str(g, si, b1, sizeof b1));
                if (!ir_add_ok(r.dim[ax], si->dim[ax], &r.dim[ax]))
                    FAIL("concat: the result has more than 2^62 elements along axis %d "
                         "(expected at most %lld)", ax, (long long)IR_MAX_NUMEL);
            }
            break;
        }
        case OP_GATHER: {
            const Shape *T = s[0], *I = s[1];
            if (!is_int(I->dtype))
                FAIL("gather: indices must be integers (expected i32/i64, got %s)",
                     dtype_name(I->dtype));
            if (T->rank < 1 || I->rank + T->rank - 1 > IR_MAX_RANK)
                FAIL("gather: result rank too large");
            r.dtype = T->dtype;
            r.rank = I->rank + T->rank - 1;
            for (int i = 0; i < I->rank; i++)
                r.dim[i] = I->dim[i];
            for (int i = 1; i < T->rank; i++)
                r.dim[I->rank + i - 1] = T->dim[i];
            break;
        }
        case OP_TAKE_ALONG: {
            const Shape *X = s[0], *I = s[1];
            if (!is_int(I->dtype))
                FAIL("take_along: indices must be integers (expected i32/i64, got %s)",
                     dtype_name(I->dtype));
            if (!dtype_is_float(X->dtype))
                FAIL("take_along: needs a float tensor (got %s)", dtype_name(X->dtype));
            if (X->rank != I->rank + 1)
                FAIL("take_along: indices %s do not match %s (expected rank %d)",
                     shape_str(g, I, b0, sizeof b0), shape_str(g, X, b1, sizeof b1),
                     X->rank - 1);
            for (int i = 0; i < I->rank; i++)
                if (I->dim[i] != X->dim[i])
                    FAIL("take_along: indices %s do not match %s (expected its leading dims)",
                         shape_str(g, I, b0, sizeof b0), shape_str(g, X, b1, sizeof b1));
            r = *I;
            r.dtype = X->dtype;
            break;
        }
        case OP_SCATTER_ADD: {
            const Shape *I = s[0], *S = s[1];
            r = shape_make(S->dtype, a->rank, a->shape);
            if (!is_int(I->dtype))
                FAIL("scatter_add: indices must be integers (expected i32/i64, got %s)",
                     dtype_name(I->dtype));
            if (r.rank < 1 || S->rank != I->rank + r.rank - 1)
                FAIL("scatter_add: source %s does not match indices %s and result %s",
                     shape_str(g, S, b0, sizeof b0), shape_str(g, I, b1, sizeof b1),
                     shape_str(g, &r, b2, sizeof b2));
            for (int i = 0; i < I->rank; i++)
                if (S->dim[i] != I->dim[i])
                    FAIL("scatter_add: source %s does not match indices %s",
                         shape_str(g, S, b0, sizeof b0), shape_str(g, I, b1, sizeof b1));
            for (int i = 1; i < r.rank; i++)
                if (S->dim[I->rank + i - 1] != r.dim[i])
                    FAIL("scatter_add: source %s does not match result %s",
                         shape_str(g, S, b0, sizeof b0), shape_str(g, &r, b2, sizeof b2));
            break;
        }
        case OP_IM2COL:
        case OP_COL2IM: {
            /* the image: im2col's operand, col2im's result (attr.shape) */
            IrConv cv;
            char cerr[300];
            if (!dtype_is_float(s[0]->dtype))
                FAIL("%s: needs a float tensor (got %s)", info->name, dtype_name(s[0]->dtype));
            if (code == OP_COL2IM && (a->rank < 0 || a->rank > IR_MAX_RANK))
                FAIL("col2im: rank out of range (expected 3 or 4, got %d)", a->rank);
            for (int i = 0; code == OP_COL2IM && i < a->rank; i++)
                if (a->shape[i] < 1)
                    FAIL("col2im: dimension %d must be positive (expected >= 1, got %lld)", i,
                         (long long)a->shape[i]);
            Shape img = code == OP_IM2COL ? *s[0] : shape_make(s[0]->dtype, a->rank, a->shape);
            if (!ir_conv_geometry(&img, a, &cv, cerr, sizeof cerr))
                FAIL("%s: %s (image %s)", info->name, cerr, shape_str(g, &img, b0, sizeof b0));
            Shape cols = {.dtype = s[0]->dtype, .rank = cv.ns + 2};
            cols.dim[0] = cv.n;
            for (int i = 0; i < cv.ns; i++)
                cols.dim[1 + i] = cv.out[i];
            if (!ir_mul_ok(cv.c, cv.kk, &cols.dim[cv.ns + 1]))
                FAIL("%s: the columns have more than 2^62 elements", info->name);
            if (code == OP_IM2COL) {
                r = cols;
            } else {
                if (!shape_eq(&cols, s[0]))
                    FAIL("col2im: the columns do not match the image (expected %s for image "
                         "%s, got %s)", shape_str(g, &cols, b0, sizeof b0),
                         shape_str(g, &img, b1, sizeof b1), shape_str(g, s[0], b2, sizeof b2));
                r = img;
            }
            break;
        }
        default:
            FAIL("%s: no typing rule", info->name);
        }
        break;
    default:
        FAIL("%s: no typing rule", info->name);
    }
    char serr[400];
    if (!ir_shape_check(g, &r, serr, sizeof serr))
        FAIL("%s: %s", info->name, serr);
    ir_infer_names(g, code, in, nin, a, &r);
    *out = r;
    return true;
}

int ir_op(Graph *g, Opcode code, const int *in, int nin, const OpAttr *a, SrcLoc loc,
          char *err, size_t errlen)
{
    static const OpAttr none;
    if (!a)
        a = &none;
    Shape r;
    if (!ir_infer(g, code, in, nin, a, &r, err, errlen))
        return -1;
    Op op = {.code = code, .nin = nin, .out = -1, .attr = *a, .loc = loc, .group = -1};
    op.in = xmalloc(sizeof(int) * (size_t)(nin ? nin : 1));
    if (nin)
        memcpy(op.in, in, sizeof(int) * (size_t)nin);
    op.out = new_tensor(g, r, code == OP_CONST ? TK_CONST : TK_TEMP, NULL, g->ops.n);
    vec_push(&g->ops, op);
    return op.out;
}

int ir_op_x(Graph *g, Opcode code, const int *in, int nin, const OpAttr *a, SrcLoc loc)
{
    char err[512];
    int t = ir_op(g, code, in, nin, a, loc, err, sizeof err);
    if (t < 0)
        die("%s (at %s:%d)", err, loc.file ? loc.file : "?", loc.line);
    return t;
}

/* ---- param shardings (IrShard) ---------------------------------------- */

Shape ir_shard_whole(const IrShard *sh, const Shape *part)
{
    Shape s = *part;
    if (sh->on && sh->n > 1) {
        s.dim[sh->axis] *= sh->n;
        s.dname[sh->axis] = NULL;
    }
    return s;
}

/* Walks rank r's runs of the whole tensor: for each index before the axis
 * and each block, m x inner contiguous elements. */
static void shard_copy(const IrShard *sh, const Shape *whole, size_t esize, char *w, char *part,
                       bool to_part)
{
    int64_t outer = 1, inner = 1, d = whole->dim[sh->axis];
    for (int i = 0; i < sh->axis; i++)
        outer *= whole->dim[i];
    for (int i = sh->axis + 1; i < whole->rank; i++)
        inner *= whole->dim[i];
    int64_t bs = d / sh->blocks, m = bs / sh->n;
    size_t run = (size_t)(m * inner) * esize;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t b = 0; b < sh->blocks; b++) {
            char *wp = w + (size_t)((o * d + b * bs + sh->rank * m) * inner) * esize;
            char *pp = part + (size_t)(((o * sh->blocks + b) * m) * inner) * esize;
            if (to_part)
                memcpy(pp, wp, run);
            else
                memcpy(wp, pp, run);
        }
}

void ir_shard_extract(const IrShard *sh, const Shape *whole, size_t esize, const void *w,
                      void *part)
{
    shard_copy(sh, whole, esize, (char *)w, part, true);
}

void ir_shard_insert(const IrShard *sh, const Shape *whole, size_t esize, const void *part,
                     void *w)
{
    shard_copy(sh, whole, esize, w, (char *)part, false);
}
