/* expr.c - kernel expressions: builders, the table of op spellings, and the
 * expression printer every target shares. */
#include "codegen.h"
#include "cg_cuda.h" /* cg_target_cuda */

#include <math.h>
#include <stdlib.h>
#include <string.h>

const CgOpInfo cg_opinfo[CG__COUNT] = {
#define X(e, n, f, i) [CG_##e] = {#e, n, f, i},
    CG_OPS(X)
#undef X
};

const char *cg_ctype(DType dt)
{
    switch (dt) {
    case DT_F32: return "float";
    case DT_I32: return "int32_t";
    case DT_I64: return "int64_t";
    case DT_U8: return "uint8_t";
    default: return NULL;
    }
}

/* ---- growable strings --------------------------------------------------- */

void cg_puts(CgBuf *b, const char *s)
{
    size_t n = strlen(s);
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n + 1);
    b->n += n;
}

void cg_printf(CgBuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)n + 1 > b->cap) {
        b->cap = (b->n + (size_t)n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* ---- builders ------------------------------------------------------------ */

static int push(CgKernel *k, CgExpr e)
{
    vec_push(&k->ex, e);
    return k->ex.n - 1;
}

int cg_const_f(CgKernel *k, DType dt, double f)
{
    return push(k, (CgExpr){.kind = CGX_CONST, .dt = dt, .f = f, .i = (int64_t)f});
}

int cg_const_i(CgKernel *k, DType dt, int64_t i)
{
    return push(k, (CgExpr){.kind = CGX_CONST, .dt = dt, .i = i, .f = (double)i});
}

int cg_var(CgKernel *k, int var) { return push(k, (CgExpr){.kind = CGX_VAR, .dt = DT_I64, .var = var}); }

int cg_acc(CgKernel *k, int acc, DType dt)
{
    return push(k, (CgExpr){.kind = CGX_ACC, .dt = dt, .var = acc});
}

int cg_load(CgKernel *k, int param, int index)
{
    return push(k, (CgExpr){.kind = CGX_LOAD, .dt = k->params.v[param].dt, .param = param,
                            .a = {index}});
}

int cg_unop(CgKernel *k, CgOp op, int a)
{
    return push(k, (CgExpr){.kind = CGX_OP, .dt = k->ex.v[a].dt, .op = op, .a = {a}});
}

static bool is_iconst(const CgKernel *k, int e, int64_t *v)
{
    const CgExpr *x = &k->ex.v[e];
    if (x->kind != CGX_CONST || dtype_is_float(x->dt))
        return false;
    *v = x->i;
    return true;
}

int cg_binop(CgKernel *k, CgOp op, int a, int b)
{
    DType dt = k->ex.v[a].dt;
    if (op >= CG_LT && op <= CG_NE)
        dt = DT_U8;
    if (k->ex.v[a].dt == DT_I64 && k->ex.v[b].dt == DT_I64) {
        int64_t x = 0, y = 0;
        bool ca = is_iconst(k, a, &x), cb = is_iconst(k, b, &y);
        if (ca && cb) {
            switch (op) {
            case CG_ADD: return cg_const_i(k, DT_I64, x + y);
            case CG_SUB: return cg_const_i(k, DT_I64, x - y);
            case CG_MUL: return cg_const_i(k, DT_I64, x * y);
            case CG_IDIV: if (y) return cg_const_i(k, DT_I64, x / y); break;
            case CG_IMOD: if (y) return cg_const_i(k, DT_I64, x % y); break;
            default: break;
            }
        }
        if (op == CG_ADD && ca && x == 0)
            return b;
        if ((op == CG_ADD || op == CG_SUB) && cb && y == 0)
            return a;
        if (op == CG_MUL && ca && x == 1)
            return b;
        if ((op == CG_MUL || op == CG_IDIV) && cb && y == 1)
            return a;
        if (op == CG_MUL && ((ca && x == 0) || (cb && y == 0)))
            return cg_const_i(k, DT_I64, 0);
        if (op == CG_IMOD && cb && y == 1)
            return cg_const_i(k, DT_I64, 0);
    }
    return push(k, (CgExpr){.kind = CGX_OP, .dt = dt, .op = op, .a = {a, b}});
}

int cg_select(CgKernel *k, int c, int a, int b)
{
    return push(k, (CgExpr){.kind = CGX_SELECT, .dt = k->ex.v[a].dt, .a = {c, a, b}});
}

int cg_cast(CgKernel *k, DType dt, int a)
{
    if (k->ex.v[a].dt == dt)
        return a;
    return push(k, (CgExpr){.kind = CGX_CAST, .dt = dt, .a = {a}});
}

int cg_rand(CgKernel *k, uint64_t key, int index)
{
    k->rand = true;
    return push(k, (CgExpr){.kind = CGX_RAND, .dt = DT_F32, .key = key, .a = {index}});
}

int cg_new_var(CgKernel *k) { return k->nvars++; }

void cg_kernel_free(CgKernel *k)
{
    if (!k)
        return;
    free(k->name);
    vec_free(&k->params);
    vec_free(&k->ex);
    for (int i = 0; i < k->loops.n; i++) {
        CgLoop *l = &k->loops.v[i];
        for (int j = 0; j < l->ph.n; j++) {
            vec_free(&l->ph.v[j].st);
            vec_free(&l->ph.v[j].lets);
        }
        vec_free(&l->ph);
    }
    vec_free(&k->loops);
    free(k);
}

/* ---- printing ------------------------------------------------------------ */

bool cg_target_lets(const CgTarget *t) { return t == &cg_target_c || t == &cg_target_cuda; }

static void print_const(CgBuf *b, const CgExpr *x)
{
    if (!dtype_is_float(x->dt)) {
        if (x->i < 0)
            cg_printf(b, "(%lld)", (long long)x->i);
        else
            cg_printf(b, "%lld", (long long)x->i);
        return;
    }
    if (isnan(x->f)) {
        cg_puts(b, "KILN_NAN");
        return;
    }
    if (isinf(x->f)) {
        cg_puts(b, x->f > 0 ? "KILN_INF" : "(-KILN_INF)");
        return;
    }
    char s[64];
    snprintf(s, sizeof s, "%.9g", (double)(float)x->f);
    if (!strpbrk(s, ".e"))
        strcat(s, ".0");
    cg_printf(b, x->f < 0 ? "(%sf)" : "%sf", s);
}

static void print_rec(CgBuf *b, const CgKernel *k, int e, const CgTarget *t, bool def);

void cg_print_expr(CgBuf *b, const CgKernel *k, int e, const CgTarget *t)
{
    print_rec(b, k, e, t, false);
}

void cg_print_let(CgBuf *b, const CgKernel *k, int e, const CgTarget *t)
{
    const CgExpr *x = &k->ex.v[e];
    const char *ty = cg_ctype(x->dt);
    cg_printf(b, "const %s x%d = ", ty ? ty : "float", e);
    print_rec(b, k, e, t, true);
    cg_puts(b, ";\n");
}

static void print_rec(CgBuf *b, const CgKernel *k, int e, const CgTarget *t, bool def)
{
    const CgExpr *x = &k->ex.v[e];
    if (x->let && !def && cg_target_lets(t)) {
        cg_printf(b, "x%d", e);
        return;
    }
    switch (x->kind) {
    case CGX_CONST:
        print_const(b, x);
        return;
    case CGX_VAR:
        cg_printf(b, "v%d", x->var);
        return;
    case CGX_ACC:
        cg_printf(b, "a%d", x->var);
        return;
    case CGX_LOAD:
        cg_printf(b, "p%d[", x->param);
        cg_print_expr(b, k, x->a[0], t);
        cg_puts(b, "]");
        return;
    case CGX_SELECT:
        cg_puts(b, "(");
        cg_print_expr(b, k, x->a[0], t);
        cg_puts(b, " ? ");
        cg_print_expr(b, k, x->a[1], t);
        cg_puts(b, " : ");
        cg_print_expr(b, k, x->a[2], t);
        cg_puts(b, ")");
        return;
    case CGX_CAST:
        if (x->dt == DT_U8) { /* to a mask: nonzero is 1 */
            cg_puts(b, "((uint8_t)(");
            cg_print_expr(b, k, x->a[0], t);
            cg_puts(b, " != 0))");
            return;
        }
        cg_printf(b, "((%s)", cg_ctype(x->dt));
        cg_print_expr(b, k, x->a[0], t);
        cg_puts(b, ")");
        return;
    case CGX_RAND:
        cg_printf(b, "kiln_rand_u01(seed, %lluull, (uint64_t)step, (uint64_t)(",
                  (unsigned long long)x->key);
        cg_print_expr(b, k, x->a[0], t);
        cg_puts(b, "))");
        return;
    case CGX_OP: {
        /* the operand type picks the spelling (compares yield u8) */
        bool fl = dtype_is_float(k->ex.v[x->a[0]].dt);
        const char *const *over = fl ? t->fover : t->iover;
        const char *sp = over && over[x->op] ? over[x->op]
                         : fl                ? cg_opinfo[x->op].fspell
                                             : cg_opinfo[x->op].ispell;
        if (!sp)
            die("codegen: op %s has no %s spelling", cg_opinfo[x->op].name,
                fl ? "float" : "integer");
        for (const char *p = sp; *p; p++) {
            if (*p == '$' && p[1] >= '0' && p[1] <= '2') {
                cg_print_expr(b, k, x->a[p[1] - '0'], t);
                p++;
            } else {
                char c[2] = {*p, 0};
                cg_puts(b, c);
            }
        }
        return;
    }
    }
    die("codegen: bad expression kind %d", (int)x->kind);
}

/* ---- loop and reduction scaffolding shared by the C and CUDA printers ---- */

void cg_indent(CgBuf *b, int depth)
{
    for (int i = 0; i < depth; i++)
        cg_puts(b, "    ");
}

void cg_open_loops(CgBuf *b, const CgDim *dim, int n, int *depth)
{
    for (int i = 0; i < n; i++) {
        cg_indent(b, *depth);
        cg_printf(b, "for (int64_t v%d = 0; v%d < %lld; v%d++) {\n", dim[i].var, dim[i].var,
                  (long long)dim[i].n, dim[i].var);
        (*depth)++;
    }
}

void cg_close_loops(CgBuf *b, int n, int *depth)
{
    for (int i = 0; i < n; i++) {
        (*depth)--;
        cg_indent(b, *depth);
        cg_puts(b, "}\n");
    }
}

void cg_print_flat_vars(CgBuf *b, const CgLoop *l, const CgPhase *ph)
{
    const CgDim *dims[2] = {l->dim, ph->dim};
    int nd[2] = {l->ndim, ph->ndim};
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < nd[j]; i++)
            cg_printf(b, "        const int64_t v%d = %s;\n        (void)v%d;\n", dims[j][i].var,
                      dims[j][i].n > 1 ? "f_" : "0", dims[j][i].var);
}

void cg_print_red_init(CgBuf *b, const CgPhase *ph)
{
    if (ph->rop == CG_RED_LSE)
        cg_puts(b, "KILN_LSE_ID");
    else if (ph->rop == CG_RED_SUM)
        cg_puts(b, dtype_is_float(ph->adt) ? "0.0f" : "0");
    else if (dtype_is_float(ph->adt))
        cg_puts(b, "(-KILN_INF)");
    else
        cg_puts(b, ph->adt == DT_I64 ? "INT64_MIN" : ph->adt == DT_I32 ? "INT32_MIN" : "0");
}
