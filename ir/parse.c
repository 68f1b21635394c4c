/* parse.c - reads the IR's text form (see the top of ir.h and docs/ir.md).
 *
 * Accepts what ir_print writes and hand-written text: value names are `%`
 * followed by a number or an identifier; dims are numbers or symbols from a
 * `sym` line; `# file:line` comments give an op's source location, other
 * comments and blank lines are ignored. Tensors get fresh dense ids: graph
 * inputs first in the order they appear, then op results in program order.
 * Ops are built with ir_op, so the typing rules are ir_infer's, and each
 * declared result type must equal the inferred one; the dim names it writes
 * are kept (the text is where a dim's name came from).
 *
 * Versions: "kiln-ir v2" text (what ir_print writes) must end with the line
 * `end` (then only comments), so that a truncated file is an error rather
 * than a smaller graph; "kiln-ir v1" text (written before the marker, and
 * hand-written pass tests) needs none, and may carry one.
 *
 * Errors are "NAME:LINE: what is wrong (expected ..., got ...)"; the parser
 * never dies on bad input.
 */
#include "ir.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *key; /* value name without '%' */
    int id;
    int line;
} Slot;

typedef struct {
    const char *name; /* for messages */
    int line;
    const char *p;    /* cursor in the current line (NUL-terminated copy) */
    char *err;
    size_t errlen;
    Graph *g;
    Slot *slot;       /* value names -> tensor ids (open addressing) */
    size_t cap, n;
    int *upd_line;    /* per tensor id: line of its update, 0 if none */
    int nupd_line;
    bool saw_op;
    bool input_after_op;
} P;

static bool perr(P *P_, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool perr(P *P_, const char *fmt, ...)
{
    if (!P_->err || !P_->errlen)
        return false;
    int k = snprintf(P_->err, P_->errlen, "%s:%d: ", P_->name, P_->line);
    if (k < 0 || (size_t)k >= P_->errlen)
        return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P_->err + k, P_->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return false;
}

/* ---- value table ------------------------------------------------------- */

static Slot *lookup(P *ps, const char *key)
{
    if (!ps->cap)
        return NULL;
    size_t j = hash_bytes(key, strlen(key), 0) & (ps->cap - 1);
    while (ps->slot[j].key) {
        if (strcmp(ps->slot[j].key, key) == 0)
            return &ps->slot[j];
        j = (j + 1) & (ps->cap - 1);
    }
    return NULL;
}

static void insert(P *ps, const char *key, int id, int line)
{
    if (2 * (ps->n + 1) > ps->cap) {
        size_t cap = ps->cap ? 2 * ps->cap : 64;
        Slot *s = xcalloc(cap, sizeof *s);
        for (size_t i = 0; i < ps->cap; i++) {
            if (!ps->slot[i].key)
                continue;
            size_t j = hash_bytes(ps->slot[i].key, strlen(ps->slot[i].key), 0) & (cap - 1);
            while (s[j].key)
                j = (j + 1) & (cap - 1);
            s[j] = ps->slot[i];
        }
        free(ps->slot);
        ps->slot = s;
        ps->cap = cap;
    }
    size_t j = hash_bytes(key, strlen(key), 0) & (ps->cap - 1);
    while (ps->slot[j].key)
        j = (j + 1) & (ps->cap - 1);
    ps->slot[j] = (Slot){xstrdup(key), id, line};
    ps->n++;
}

/* ---- lexing within one line ------------------------------------------------ */

static void skip_ws(P *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t')
        ps->p++;
}

static bool at_end(P *ps)
{
    skip_ws(ps);
    return *ps->p == 0;
}

/* The next token as text for "got ..." parts of messages. */
static const char *got(P *ps, char *buf, size_t n)
{
    skip_ws(ps);
    if (!*ps->p)
        return "end of line";
    size_t k = 0;
    buf[k++] = '\'';
    const char *q = ps->p;
    if (!isalnum((unsigned char)*q) && *q != '%' && *q != '_' && *q != '-' && *q != '.')
        buf[k++] = *q++;
    else
        while (*q && (isalnum((unsigned char)*q) || strchr("%_.-+", *q)) && k < n - 6)
            buf[k++] = *q++;
    buf[k++] = '\'';
    buf[k] = 0;
    return buf;
}

static bool accept(P *ps, char c)
{
    skip_ws(ps);
    if (*ps->p != c)
        return false;
    ps->p++;
    return true;
}

static bool expect(P *ps, char c, const char *what)
{
    char b[64];
    if (accept(ps, c))
        return true;
    return perr(ps, "expected %s, got %s", what, got(ps, b, sizeof b));
}

static bool is_ident_start(int c) { return isalpha(c) || c == '_'; }
static bool is_ident_char(int c) { return isalnum(c) || c == '_' || c == '.'; }

/* identifier [A-Za-z_][A-Za-z0-9_.]* into buf; false (no message) if none */
static bool ident(P *ps, char *buf, size_t n)
{
    skip_ws(ps);
    if (!is_ident_start((unsigned char)*ps->p))
        return false;
    size_t k = 0;
    while (is_ident_char((unsigned char)*ps->p)) {
        if (k + 1 < n)
            buf[k++] = *ps->p;
        ps->p++;
    }
    buf[k] = 0;
    return true;
}

static bool parse_int(P *ps, int64_t *v, const char *what)
{
    char b[64];
    skip_ws(ps);
    const char *s = ps->p;
    if (*s == '-' || *s == '+')
        s++;
    if (!isdigit((unsigned char)*s))
        return perr(ps, "expected %s (an integer), got %s", what, got(ps, b, sizeof b));
    char *end;
    errno = 0;
    long long x = strtoll(ps->p, &end, 10);
    if (errno == ERANGE)
        return perr(ps, "%s out of range (expected a 64-bit integer, got %s)", what,
                    got(ps, b, sizeof b));
    if (is_ident_char((unsigned char)*end))
        return perr(ps, "expected %s (an integer), got %s", what, got(ps, b, sizeof b));
    ps->p = end;
    *v = x;
    return true;
}

static bool parse_double(P *ps, double *v, const char *what)
{
    char b[64];
    skip_ws(ps);
    const char *s = ps->p;
    bool neg = false;
    if (*s == '-' || *s == '+')
        neg = *s++ == '-';
    if (strncmp(s, "inf", 3) == 0 && !is_ident_char((unsigned char)s[3])) {
        *v = neg ? -INFINITY : INFINITY;
        ps->p = s + 3;
        return true;
    }
    if (strncmp(s, "nan", 3) == 0 && !is_ident_char((unsigned char)s[3])) {
        *v = neg ? -NAN : NAN;
        ps->p = s + 3;
        return true;
    }
    if (!isdigit((unsigned char)*s) && !(*s == '.' && isdigit((unsigned char)s[1])))
        return perr(ps, "expected %s (a number), got %s", what, got(ps, b, sizeof b));
    char *end;
    double x = strtod(ps->p, &end);
    if (end == ps->p || isalpha((unsigned char)*end) || *end == '_')
        return perr(ps, "expected %s (a number), got %s", what, got(ps, b, sizeof b));
    ps->p = end;
    *v = x;
    return true;
}

/* "..." with \" \\ \n \t \xHH escapes; result interned */
static bool parse_quoted(P *ps, const char **out, const char *what)
{
    char b[64];
    skip_ws(ps);
    if (*ps->p != '"')
        return perr(ps, "expected %s (a quoted string), got %s", what, got(ps, b, sizeof b));
    ps->p++;
    size_t n = 0, cap = 32;
    char *s = xmalloc(cap);
    for (;;) {
        char c = *ps->p;
        if (!c) {
            free(s);
            return perr(ps, "unterminated string (expected a closing '\"', got end of line)");
        }
        ps->p++;
        if (c == '"')
            break;
        if (c == '\\') {
            char e = *ps->p++;
            if (e == 'n')
                c = '\n';
            else if (e == 't')
                c = '\t';
            else if (e == '"' || e == '\\')
                c = e;
            else if (e == 'x' && isxdigit((unsigned char)ps->p[0]) &&
                     isxdigit((unsigned char)ps->p[1])) {
                char hex[3] = {ps->p[0], ps->p[1], 0};
                c = (char)strtol(hex, NULL, 16);
                ps->p += 2;
            } else {
                free(s);
                ps->p--;
                return perr(ps, "bad escape in string (expected \\\" \\\\ \\n \\t or \\xHH, "
                                "got '\\%c')",
                            e ? e : ' ');
            }
        }
        if (n + 2 > cap)
            s = xrealloc(s, cap *= 2);
        s[n++] = c;
    }
    s[n] = 0;
    if (!n) {
        free(s);
        return perr(ps, "empty %s (expected a non-empty name)", what);
    }
    *out = intern(s);
    free(s);
    return true;
}

/* %name (number or identifier) into buf without the '%' */
static bool value_name(P *ps, char *buf, size_t n, const char *what)
{
    char b[64];
    skip_ws(ps);
    if (*ps->p != '%' || !is_ident_char((unsigned char)ps->p[1]))
        return perr(ps, "expected %s (a value like %%3 or %%x), got %s", what,
                    got(ps, b, sizeof b));
    ps->p++;
    size_t k = 0;
    while (is_ident_char((unsigned char)*ps->p)) {
        if (k + 1 < n)
            buf[k++] = *ps->p;
        ps->p++;
    }
    buf[k] = 0;
    return true;
}

static bool use_value(P *ps, int *id, const char *what)
{
    char nm[128];
    if (!value_name(ps, nm, sizeof nm, what))
        return false;
    Slot *s = lookup(ps, nm);
    if (!s)
        return perr(ps, "undefined value %%%s (expected a value defined on an earlier line)",
                    nm);
    *id = s->id;
    return true;
}

/* DTYPE[d0,d1,...]; dims are positive numbers or declared symbols */
static bool parse_type(P *ps, Shape *s)
{
    char b[64], w[64];
    const char *at = (skip_ws(ps), ps->p);
    if (!ident(ps, w, sizeof w)) {
        ps->p = at;
        return perr(ps, "expected a type like f32[4,8], got %s", got(ps, b, sizeof b));
    }
    int dt = dtype_parse(w);
    if (dt < 0) {
        ps->p = at;
        return perr(ps, "unknown dtype '%s' (expected f32, bf16, f16, i32, i64 or u8)", w);
    }
    memset(s, 0, sizeof *s);
    s->dtype = (DType)dt;
    if (*ps->p != '[')
        return perr(ps, "expected '[' after dtype %s, got %s", w, got(ps, b, sizeof b));
    ps->p++;
    if (accept(ps, ']'))
        return true;
    for (;;) {
        int64_t d;
        const char *dn = NULL; /* the dim's name, when written as one */
        skip_ws(ps);
        if (is_ident_start((unsigned char)*ps->p)) {
            ident(ps, w, sizeof w);
            int k = -1;
            for (int i = 0; i < ps->g->syms.n; i++)
                if (strcmp(ps->g->syms.v[i].name, w) == 0)
                    k = i;
            if (k < 0)
                return perr(ps, "unknown dimension '%s' (expected a number or a symbol "
                                "declared on the sym line)",
                            w);
            d = ps->g->syms.v[k].value;
            dn = ps->g->syms.v[k].name;
        } else if (!parse_int(ps, &d, "a dimension")) {
            return false;
        }
        if (d < 1)
            return perr(ps, "dimension %d must be positive (expected >= 1, got %lld)",
                        s->rank, (long long)d);
        if (s->rank == IR_MAX_RANK)
            return perr(ps, "too many dimensions (expected at most %d)", IR_MAX_RANK);
        s->dname[s->rank] = dn;
        s->dim[s->rank++] = d;
        if (accept(ps, ']')) {
            char serr[400];
            if (!ir_shape_check(ps->g, s, serr, sizeof serr))
                return perr(ps, "%s", serr);
            return true;
        }
        if (!expect(ps, ',', "',' or ']' in a type"))
            return false;
    }
}

/* ---- attributes ------------------------------------------------------------- */

typedef struct {
    char key[16];
    bool list;
    int64_t ia[IR_MAX_RANK];
    int nia;
    const char *text; /* scalar: start of its text in the line */
} RawAttr;

/* {key=scalar|[ints], ...} */
static bool parse_attrs(P *ps, RawAttr *ra, int *nra, int max)
{
    char b[64];
    *nra = 0;
    if (accept(ps, '}'))
        return true;
    for (;;) {
        if (*nra == max)
            return perr(ps, "too many attributes (expected at most %d)", max);
        RawAttr *r = &ra[(*nra)++];
        memset(r, 0, sizeof *r);
        if (!ident(ps, r->key, sizeof r->key))
            return perr(ps, "expected an attribute name, got %s", got(ps, b, sizeof b));
        for (int i = 0; i < *nra - 1; i++)
            if (strcmp(ra[i].key, r->key) == 0)
                return perr(ps, "attribute '%s' given twice", r->key);
        if (!expect(ps, '=', "'=' after the attribute name"))
            return false;
        if (accept(ps, '[')) {
            r->list = true;
            if (!accept(ps, ']'))
                for (;;) {
                    if (r->nia == IR_MAX_RANK)
                        return perr(ps, "attribute '%s' has too many entries (expected at "
                                        "most %d)",
                                    r->key, IR_MAX_RANK);
                    if (!parse_int(ps, &r->ia[r->nia++], "a list entry"))
                        return false;
                    if (accept(ps, ']'))
                        break;
                    if (!expect(ps, ',', "',' or ']' in a list"))
                        return false;
                }
        } else {
            skip_ws(ps);
            r->text = ps->p;
            while (*ps->p && *ps->p != ',' && *ps->p != '}' && *ps->p != ' ' &&
                   *ps->p != '\t')
                ps->p++;
            if (ps->p == r->text)
                return perr(ps, "expected a value for attribute '%s', got %s", r->key,
                            got(ps, b, sizeof b));
        }
        if (accept(ps, '}'))
            return true;
        if (!expect(ps, ',', "',' or '}' in attributes"))
            return false;
    }
}

/* Reads a scalar attribute's text as an int or double (re-lexed in place). */
static bool attr_int(P *ps, const RawAttr *r, int64_t *v)
{
    if (r->list)
        return perr(ps, "attribute '%s' must be a number (expected %s=N, got a list)", r->key,
                    r->key);
    const char *save = ps->p;
    ps->p = r->text;
    bool ok = parse_int(ps, v, r->key);
    ps->p = save;
    return ok;
}

static bool attr_double(P *ps, const RawAttr *r, double *v)
{
    if (r->list)
        return perr(ps, "attribute '%s' must be a number (expected %s=N, got a list)", r->key,
                    r->key);
    const char *save = ps->p;
    ps->p = r->text;
    bool ok = parse_double(ps, v, r->key);
    ps->p = save;
    return ok;
}

/* Fills a from the raw attributes for opcode code with declared result type res. */
static bool build_attr(P *ps, Opcode code, const RawAttr *ra, int nra, const Shape *res,
                       OpAttr *a)
{
    const OpInfo *info = &ir_opinfo[code];
    /* keys[nreq..] are optional: AK_ATTN's head layout, all or none */
    const char *keys[12] = {NULL};
    int nreq = 4;
    switch (info->attr) {
    case AK_VALUE: keys[0] = "value"; break;
    case AK_AXIS: keys[0] = "axis"; break;
    case AK_AXES: keys[0] = "axes"; break;
    case AK_PERM: keys[0] = "perm"; break;
    case AK_START: keys[0] = code == OP_PAD ? "lo" : "start"; break;
    case AK_GEMM: keys[0] = "ta", keys[1] = "tb"; break;
    case AK_KEY: keys[0] = "key"; break;
    case AK_BUCKET: keys[0] = "bucket"; break;
    case AK_ATTN:
        keys[0] = "causal", keys[1] = "scale", keys[2] = "heads", keys[3] = "hd";
        keys[4] = "qoff", keys[5] = "koff", keys[6] = "voff", nreq = 2;
        keys[7] = "kvh", keys[8] = "window", keys[9] = "alibi"; /* optional each */
        keys[10] = "bias", keys[11] = "mask";
        break;
    case AK_SHARD:
        keys[0] = "bucket", keys[1] = "start", keys[2] = "total", keys[3] = "nranks";
        break;
    case AK_TP: keys[0] = "axis", keys[1] = "n", keys[2] = "rank", keys[3] = "sum", nreq = 3;
        break;
    case AK_CONV:
        keys[0] = "kernel", keys[1] = "stride", keys[2] = "pad", keys[3] = "dilation";
        break;
    default: break;
    }
    const RawAttr *found[12] = {NULL};
    for (int i = 0; i < nra; i++) {
        int k = -1;
        for (int j = 0; j < 12; j++)
            if (keys[j] && strcmp(keys[j], ra[i].key) == 0)
                k = j;
        if (k < 0) {
            if (!keys[0])
                return perr(ps, "%s takes no attributes (got '%s')", info->name, ra[i].key);
            return perr(ps, "%s: unknown attribute '%s' (expected %s%s%s)", info->name,
                        ra[i].key, keys[0], keys[1] ? " and " : "", keys[1] ? keys[1] : "");
        }
        found[k] = &ra[i];
    }
    for (int j = 0; j < 7; j++)
        if (keys[j] && !found[j] &&
            (j < nreq || (info->attr == AK_ATTN && (found[2] || found[3] || found[4] ||
                                                    found[5] || found[6]))))
            return perr(ps, "%s: missing attribute '%s' (expected {%s=...})", info->name,
                        keys[j], keys[j]);
    memset(a, 0, sizeof *a);
    switch (info->attr) {
    case AK_VALUE:
        if (!attr_double(ps, found[0], &a->f))
            return false;
        break;
    case AK_AXIS:
    case AK_KEY:
    case AK_BUCKET:
        a->nia = 1;
        if (!attr_int(ps, found[0], &a->ia[0]))
            return false;
        break;
    case AK_AXES:
    case AK_PERM:
    case AK_START:
        if (!found[0]->list)
            return perr(ps, "attribute '%s' must be a list (expected %s=[...])", keys[0],
                        keys[0]);
        a->nia = found[0]->nia;
        memcpy(a->ia, found[0]->ia, sizeof a->ia);
        break;
    case AK_GEMM:
        a->nia = 2;
        if (!attr_int(ps, found[0], &a->ia[0]) || !attr_int(ps, found[1], &a->ia[1]))
            return false;
        break;
    case AK_ATTN:
        a->nia = found[2] ? 6 : 1;
        if (!attr_int(ps, found[0], &a->ia[0]) || !attr_double(ps, found[1], &a->f))
            return false;
        for (int j = 1; j < a->nia; j++)
            if (!attr_int(ps, found[j + 1], &a->ia[j]))
                return false;
        {
            int64_t v[5] = {0, 0, 0, 0, 0}; /* kvh, window, alibi, bias, mask */
            for (int j = 0; j < 5; j++)
                if (found[7 + j] && !attr_int(ps, found[7 + j], &v[j]))
                    return false;
            if ((v[3] != 0 && v[3] != 1) || (v[4] != 0 && v[4] != 1) || (v[3] && v[4]))
                return perr(ps, "%s: needs bias and mask 0 or 1, not both (got bias=%lld, "
                                "mask=%lld)",
                            info->name, (long long)v[3], (long long)v[4]);
            if (found[7] && !found[2])
                return perr(ps, "%s: kvh needs the head layout (heads, hd, qoff, koff, voff)",
                            info->name);
            if ((found[7] && v[0] < 1) || v[1] < 0 || (v[2] != 0 && v[2] != 1))
                return perr(ps, "%s: needs kvh >= 1, window >= 0 and alibi 0 or 1 (got kvh=%lld, "
                                "window=%lld, alibi=%lld)",
                            info->name, (long long)v[0], (long long)v[1], (long long)v[2]);
            ir_attn_set_variant(a, v[1], v[2] != 0, found[7] ? v[0] : a->ia[1],
                                v[3] ? IR_ATTN_BIAS : v[4] ? IR_ATTN_MASK : 0);
        }
        break;
    case AK_SHARD:
        a->nia = 4;
        for (int j = 0; j < 4; j++)
            if (!attr_int(ps, found[j], &a->ia[j]))
                return false;
        break;
    case AK_TP:
        a->nia = found[3] ? 4 : 3;
        for (int j = 0; j < a->nia; j++)
            if (!attr_int(ps, found[j], &a->ia[j]))
                return false;
        break;
    case AK_CONV: {
        /* four lists of one length ns (1 or 2): ia = kernel, stride, pad,
         * dilation, each ns entries */
        int ns = found[0]->list ? found[0]->nia : 0;
        if (ns < 1 || ns > 2)
            return perr(ps, "%s: attribute 'kernel' must be a list of 1 or 2 sizes (expected "
                            "kernel=[k] or kernel=[kh,kw])", info->name);
        for (int j = 0; j < 4; j++) {
            if (!found[j]->list || found[j]->nia != ns)
                return perr(ps, "%s: attribute '%s' must be a list of %d entries like "
                                "'kernel' (expected %s=[...])", info->name, keys[j], ns,
                            keys[j]);
            memcpy(a->ia + j * ns, found[j]->ia, sizeof(int64_t) * (size_t)ns);
        }
        a->nia = 4 * ns;
        break;
    }
    default: break;
    }
    /* the result type carries attr.shape and attr.dtype where the op has them */
    bool has_shape = info->attr == AK_SHAPE || info->attr == AK_VALUE ||
                     info->attr == AK_KEY || info->attr == AK_START || code == OP_IOTA ||
                     code == OP_COL2IM;
    if (has_shape) {
        ir_attr_set_shape(a, res);
    }
    if (code == OP_CONST || code == OP_IOTA || code == OP_CAST)
        a->dtype = res->dtype;
    return true;
}

/* ---- lines ---------------------------------------------------------------------- */

static bool parse_init(P *ps, ParamInit *in)
{
    char w[32], b[64];
    memset(in, 0, sizeof *in);
    if (at_end(ps))
        return true;
    const char *at = ps->p;
    if (!ident(ps, w, sizeof w))
        return perr(ps, "expected an initialiser (zeros, ones, normal(STD), uniform(A,B) or "
                        "none), got %s",
                    got(ps, b, sizeof b));
    if (strcmp(w, "none") == 0)
        in->kind = INIT_NONE;
    else if (strcmp(w, "zeros") == 0)
        in->kind = INIT_ZEROS;
    else if (strcmp(w, "ones") == 0)
        in->kind = INIT_ONES;
    else if (strcmp(w, "normal") == 0) {
        in->kind = INIT_NORMAL;
        if (!expect(ps, '(', "'(' after normal") || !parse_double(ps, &in->a, "a std") ||
            !expect(ps, ')', "')'"))
            return false;
    } else if (strcmp(w, "uniform") == 0) {
        in->kind = INIT_UNIFORM;
        if (!expect(ps, '(', "'(' after uniform") || !parse_double(ps, &in->a, "a bound") ||
            !expect(ps, ',', "','") || !parse_double(ps, &in->b, "a bound") ||
            !expect(ps, ')', "')'"))
            return false;
    } else {
        ps->p = at;
        return perr(ps, "unknown initialiser '%s' (expected zeros, ones, normal(STD), "
                        "uniform(A,B) or none)",
                    w);
    }
    return true;
}

/* An optional ` shard(axis=A,blocks=K[,n=N,rank=R])` after a param's
 * initialiser (IrShard). */
static bool parse_shard(P *ps, TensorKind kind, int rank, IrShard *sh)
{
    char w[32], b[64];
    memset(sh, 0, sizeof *sh);
    skip_ws(ps);
    if (at_end(ps) || strncmp(ps->p, "shard", 5) != 0)
        return true;
    if (!ident(ps, w, sizeof w) || strcmp(w, "shard") != 0)
        return perr(ps, "expected shard(...) or the end of the line, got %s", got(ps, b, sizeof b));
    if (kind != TK_PARAM)
        return perr(ps, "shard(...) is for params only (got it on a %s)", ir_kind_name(kind));
    if (!expect(ps, '(', "'(' after shard"))
        return false;
    static const char *const keys[4] = {"axis", "blocks", "n", "rank"};
    int64_t v[4] = {-1, -1, 0, 0};
    bool seen[4] = {false, false, false, false};
    for (int k = 0;; k++) {
        if (k >= 4 || !ident(ps, w, sizeof w))
            return perr(ps, "expected axis=, blocks=, n= or rank= in shard(...), got %s",
                        got(ps, b, sizeof b));
        int j = 0;
        while (j < 4 && strcmp(keys[j], w) != 0)
            j++;
        if (j == 4 || seen[j])
            return perr(ps, "shard(...): %s key '%s' (expected axis, blocks, n, rank, each once)",
                        j == 4 ? "unknown" : "repeated", w);
        seen[j] = true;
        if (!expect(ps, '=', "'='") || !parse_int(ps, &v[j], keys[j]))
            return false;
        skip_ws(ps);
        if (*ps->p == ')')
            break;
        if (!expect(ps, ',', "',' or ')'"))
            return false;
    }
    if (!expect(ps, ')', "')'"))
        return false;
    if (!seen[0] || !seen[1] || seen[2] != seen[3])
        return perr(ps, "shard(...) needs axis and blocks, and n with rank (got %s%s%s)",
                    seen[0] ? "" : "no axis ", seen[1] ? "" : "no blocks ",
                    seen[2] != seen[3] ? "n without rank" : "");
    if (v[0] < 0 || v[0] >= rank || v[1] < 1 || v[1] > 1 << 20 || v[2] < 0 || v[2] > 1 << 20 ||
        v[3] < 0 || (v[2] > 0 && v[3] >= v[2]) || (v[2] == 0 && v[3] != 0))
        return perr(ps, "shard(axis=%lld,blocks=%lld,n=%lld,rank=%lld) out of range (expected "
                        "0 <= axis < %d, blocks >= 1, 0 <= rank < n)",
                    (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3], rank);
    *sh = (IrShard){true, (int)v[0], (int)v[1], (int)v[2], (int)v[3]};
    return true;
}

static bool end_of_line(P *ps)
{
    char b[64];
    if (at_end(ps))
        return true;
    return perr(ps, "unexpected %s (expected end of line)", got(ps, b, sizeof b));
}

static bool parse_sym(P *ps)
{
    char w[64], b[64];
    do {
        int64_t v;
        if (!ident(ps, w, sizeof w))
            return perr(ps, "expected NAME=VALUE on the sym line, got %s", got(ps, b, sizeof b));
        if (dtype_parse(w) >= 0)
            return perr(ps, "symbol '%s' is a dtype name (expected another name)", w);
        if (!expect(ps, '=', "'=' after the symbol name") || !parse_int(ps, &v, "a size"))
            return false;
        if (v < 1)
            return perr(ps, "symbol %s must be positive (expected >= 1, got %lld)", w,
                        (long long)v);
        for (int i = 0; i < ps->g->syms.n; i++)
            if (strcmp(ps->g->syms.v[i].name, w) == 0 && ps->g->syms.v[i].value != v)
                return perr(ps, "symbol %s redeclared (expected %lld, got %lld)", w,
                            (long long)ps->g->syms.v[i].value, (long long)v);
        ir_add_sym(ps->g, w, v);
    } while (!at_end(ps));
    return true;
}

static bool parse_output(P *ps)
{
    const char *nm;
    int t;
    if (!parse_quoted(ps, &nm, "an output name") || !use_value(ps, &t, "the output's value") ||
        !end_of_line(ps))
        return false;
    if (ir_find_output(ps->g, nm) >= 0)
        return perr(ps, "output \"%s\" declared twice", nm);
    ir_add_output(ps->g, nm, t);
    return true;
}

static bool parse_update(P *ps)
{
    char b0[160], b1[160];
    int tg, v;
    if (!use_value(ps, &tg, "the update target") || !expect(ps, '<', "'<-'") ||
        !expect(ps, '-', "'<-'") || !use_value(ps, &v, "the update value") ||
        !end_of_line(ps))
        return false;
    const Tensor *T = &ps->g->t.v[tg], *V = &ps->g->t.v[v];
    if (T->kind != TK_PARAM && T->kind != TK_STATE)
        return perr(ps, "update target must be a param or state tensor (expected param or "
                        "state, got %s)",
                    ir_kind_name(T->kind));
    if (!shape_eq(&T->s, &V->s))
        return perr(ps, "update of \"%s\": types differ (expected %s, got %s)", T->name,
                    shape_str(ps->g, &T->s, b0, sizeof b0), shape_str(ps->g, &V->s, b1, sizeof b1));
    if (tg < ps->nupd_line && ps->upd_line[tg])
        return perr(ps, "\"%s\" is updated twice (first on line %d)", T->name,
                    ps->upd_line[tg]);
    if (tg >= ps->nupd_line) {
        int n = ps->g->t.n;
        ps->upd_line = xrealloc(ps->upd_line, sizeof(int) * (size_t)n);
        for (int i = ps->nupd_line; i < n; i++)
            ps->upd_line[i] = 0;
        ps->nupd_line = n;
    }
    ps->upd_line[tg] = ps->line;
    ir_add_update(ps->g, tg, v);
    return true;
}

/* %name:TYPE = (input|param|state) "name" [init]  |  %name:TYPE = opcode ... */
static bool parse_def(P *ps, SrcLoc loc)
{
    char nm[128], w[64], b[64], b0[160], b1[160];
    if (!value_name(ps, nm, sizeof nm, "a value name"))
        return false;
    Slot *prev = lookup(ps, nm);
    if (prev)
        return perr(ps, "redefinition of %%%s (first defined on line %d)", nm, prev->line);
    Shape s;
    if (!expect(ps, ':', "':' and a type after the value name") || !parse_type(ps, &s) ||
        !expect(ps, '=', "'='"))
        return false;
    const char *at = (skip_ws(ps), ps->p);
    if (!ident(ps, w, sizeof w))
        return perr(ps, "expected an opcode or input/param/state, got %s", got(ps, b, sizeof b));

    TensorKind kind = TK_TEMP;
    if (strcmp(w, "input") == 0)
        kind = TK_INPUT;
    else if (strcmp(w, "param") == 0)
        kind = TK_PARAM;
    else if (strcmp(w, "state") == 0)
        kind = TK_STATE;
    if (kind != TK_TEMP) {
        const char *tname;
        ParamInit init;
        IrShard sh = {0};
        if (!parse_quoted(ps, &tname, "a tensor name") || !parse_init(ps, &init) ||
            !parse_shard(ps, kind, s.rank, &sh) || !end_of_line(ps))
            return false;
        if (ir_find_tensor(ps->g, tname) >= 0)
            return perr(ps, "graph input \"%s\" declared twice", tname);
        if (ps->saw_op)
            ps->input_after_op = true;
        int id = ir_add_input(ps->g, kind, tname, s, init);
        ps->g->t.v[id].shard = sh;
        insert(ps, nm, id, ps->line);
        return true;
    }

    int code = ir_opcode_parse(w);
    if (code < 0) {
        ps->p = at;
        return perr(ps, "unknown opcode '%s'", w);
    }
    VEC(int) in = {0};
    bool ok = false;
    RawAttr ra[12]; /* at most 12 keys: AK_ATTN with its head layout and variants */
    int nra = 0;
    skip_ws(ps);
    if (*ps->p == '%') {
        for (;;) {
            int id;
            if (!use_value(ps, &id, "an operand"))
                goto out;
            vec_push(&in, id);
            if (!accept(ps, ','))
                break;
        }
    }
    if (accept(ps, '{') && !parse_attrs(ps, ra, &nra, 12))
        goto out;
    unsigned flags = 0;
    int group = -1;
    while (accept(ps, '!')) {
        if (!ident(ps, w, sizeof w)) {
            perr(ps, "expected a flag after '!' (backward, optim, recompute or group=N), got %s",
                 got(ps, b, sizeof b));
            goto out;
        }
        if (strcmp(w, "backward") == 0)
            flags |= OPF_BACKWARD;
        else if (strcmp(w, "optim") == 0)
            flags |= OPF_OPTIM;
        else if (strcmp(w, "recompute") == 0)
            flags |= OPF_RECOMPUTE;
        else if (strcmp(w, "group") == 0) {
            int64_t gv;
            if (!expect(ps, '=', "'=' after !group") || !parse_int(ps, &gv, "a group id"))
                goto out;
            if (gv < 0 || gv > 1000000000) {
                perr(ps, "bad group id (expected 0..1000000000, got %lld)", (long long)gv);
                goto out;
            }
            group = (int)gv;
        } else {
            perr(ps, "unknown flag '!%s' (expected backward, optim, recompute or group=N)", w);
            goto out;
        }
    }
    if (!end_of_line(ps))
        goto out;
    OpAttr a;
    if (!build_attr(ps, (Opcode)code, ra, nra, &s, &a))
        goto out;
    char ierr[512];
    int id = ir_op(ps->g, (Opcode)code, in.v, in.n, &a, loc, ierr, sizeof ierr);
    if (id < 0) {
        perr(ps, "%s", ierr);
        goto out;
    }
    const Shape *inf = &ps->g->t.v[id].s;
    if (!shape_eq(inf, &s)) {
        perr(ps, "declared type of %%%s disagrees with %s's result (expected %s, got %s)", nm,
             w, shape_str(ps->g, inf, b0, sizeof b0), shape_str(ps->g, &s, b1, sizeof b1));
        goto out;
    }
    /* the text says where each dim's name came from: keep its names */
    memcpy(ps->g->t.v[id].s.dname, s.dname, sizeof s.dname);
    Op *op = &ps->g->ops.v[ps->g->ops.n - 1];
    op->flags = flags;
    op->group = group;
    insert(ps, nm, id, ps->line);
    ps->saw_op = true;
    ok = true;
out:
    vec_free(&in);
    return ok;
}

/* "# file:line" -> loc; anything else leaves loc unknown */
static SrcLoc parse_loc(const char *c)
{
    SrcLoc loc = {NULL, 0};
    while (*c == ' ' || *c == '\t')
        c++;
    size_t n = strlen(c);
    while (n && (c[n - 1] == ' ' || c[n - 1] == '\t'))
        n--;
    size_t colon = n;
    while (colon > 0 && c[colon - 1] != ':')
        colon--;
    if (colon < 2 || colon == n)
        return loc;
    for (size_t i = colon; i < n; i++)
        if (!isdigit((unsigned char)c[i]) || i - colon > 9)
            return loc;
    char *file = xmalloc(colon);
    memcpy(file, c, colon - 1);
    file[colon - 1] = 0;
    loc.file = intern(file);
    loc.line = atoi(c + colon);
    free(file);
    return loc;
}


Graph *ir_parse(const char *text, const char *name, char *err, size_t errlen)
{
    P ps = {.name = name ? name : "<ir>", .err = err, .errlen = errlen, .g = ir_new()};
    bool ok = true, header = false, ended = false;
    int version = 0;
    char *line = NULL;
    size_t linecap = 0;
    const char *s = text ? text : "";
    while (ok && *s) {
        const char *e = strchr(s, '\n');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        ps.line++;
        if (n + 1 > linecap) {
            linecap = 2 * (n + 1);
            line = xrealloc(line, linecap);
        }
        memcpy(line, s, n);
        line[n] = 0;
        s += n + (e ? 1 : 0);
        if (n && line[n - 1] == '\r')
            line[--n] = 0;

        /* cut the comment (a '#' outside quotes) */
        const char *comment = NULL;
        bool inq = false;
        for (char *c = line; *c; c++) {
            if (inq && *c == '\\' && c[1]) {
                c++;
                continue;
            }
            if (*c == '"')
                inq = !inq;
            else if (*c == '#' && !inq) {
                *c = 0;
                comment = c + 1;
                break;
            }
        }
        ps.p = line;
        if (at_end(&ps))
            continue;
        char w[32], b[64];
        if (!header) {
            if (strncmp(ps.p, "kiln-ir", 7) != 0) {
                ok = perr(&ps, "expected the header 'kiln-ir v2' (or v1), got %s",
                          got(&ps, b, sizeof b));
                break;
            }
            ps.p += 7;
            if (!ident(&ps, w, sizeof w) || (strcmp(w, "v1") != 0 && strcmp(w, "v2") != 0) ||
                !at_end(&ps)) {
                ok = perr(&ps, "unsupported IR version (expected 'kiln-ir v2' or 'kiln-ir v1', "
                               "got '%s')",
                          line);
                break;
            }
            version = w[1] - '0';
            header = true;
            continue;
        }
        if (ended) {
            ok = perr(&ps, "text after the 'end' line (expected only comments or blank lines, "
                           "got %s)",
                      got(&ps, b, sizeof b));
            break;
        }
        skip_ws(&ps);
        if (*ps.p == '%') {
            SrcLoc loc = comment ? parse_loc(comment) : (SrcLoc){NULL, 0};
            ok = parse_def(&ps, loc);
            continue;
        }
        const char *at = ps.p;
        if (!ident(&ps, w, sizeof w)) {
            ok = perr(&ps, "expected a definition (%%x:TYPE = ...), output, update or sym line, "
                           "got %s",
                      got(&ps, b, sizeof b));
        } else if (strcmp(w, "sym") == 0) {
            ok = parse_sym(&ps);
        } else if (strcmp(w, "output") == 0) {
            ok = parse_output(&ps);
        } else if (strcmp(w, "update") == 0) {
            ok = parse_update(&ps);
        } else if (strcmp(w, "end") == 0) {
            ok = end_of_line(&ps);
            ended = true;
        } else {
            ps.p = at;
            ok = perr(&ps, "expected a definition (%%x:TYPE = ...), output, update or sym line, "
                           "got %s",
                      got(&ps, b, sizeof b));
        }
    }
    if (ok && !header) {
        ps.line = ps.line ? ps.line : 1;
        ok = perr(&ps, "expected the header 'kiln-ir v2' (or v1), got end of input");
    }
    /* v2 text ends with "end": without it the text was cut short (a
     * truncated file parses as a smaller graph otherwise) */
    if (ok && version >= 2 && !ended)
        ok = perr(&ps, "the IR ends without its 'end' line (expected 'end' as the last line "
                       "of kiln-ir v2 text, got end of input): the file is cut short");
    if (ok && ps.input_after_op)
        ir_renumber(ps.g, false);
    if (ok) {
        char verr[512];
        if (!ir_verify(ps.g, verr, sizeof verr)) {
            if (err && errlen)
                snprintf(err, errlen, "%s: invalid graph: %s", ps.name, verr);
            ok = false;
        }
    }
    for (size_t i = 0; i < ps.cap; i++)
        free(ps.slot[i].key);
    free(ps.slot);
    free(ps.upd_line);
    free(line);
    if (!ok) {
        ir_free(ps.g);
        return NULL;
    }
    return ps.g;
}
