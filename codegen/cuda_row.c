/* cuda_row.c - 16-byte loads and stores in the CUDA printer's row loops
 * (one block per outer index, cuda_print.c): which params of a phase are
 * accessed a vector at a time, and the code around the phase's scalar body
 * that loads and stores those vectors (cg_cuda.h, CgCudaVec).
 *
 * A thread takes `vec` consecutive elements of the phase's innermost dim
 * (4 f32 or 8 bf16 per 16 bytes; 8 when any vector param is bf16, an f32
 * one then taking two 16-byte accesses). A param is a vector param when
 * every access of it the phase prints is at index base + v (v the
 * innermost var, coefficient 1) with base a multiple of vec whatever the
 * other vars are, its buffer starts 16-byte aligned, and every param
 * sharing its buffer qualifies too; stores must be plain (no guard, not
 * accumulating), and at most one param of a buffer is stored. The scalar
 * body is printed unchanged inside `for (u = 0; u < vec; u++)` (unrolled),
 * where a local named like the param stands for element u of its vector:
 * the printed p<i>[index] then reads or writes a register, whatever the
 * index (the analysis proved it is element u). Loads happen before the
 * element loop, stores after it, so the phase still reads everything
 * before it writes (a buffer loaded and stored keeps separate vectors).
 * Other params keep scalar accesses.
 *
 * Invariant: a phase is vectorised only when the innermost extent is a
 * multiple of vec (no vector straddles a row), so the threads cover the
 * phase as vec-element groups with no tail. */
#include "cg_cuda.h"

#include <stdlib.h>
#include <string.h>

/* An index expression as a function of the innermost var: coef * v + base,
 * base a multiple of g (g = 0: base is 0). dep: it depends on v at all;
 * lin: that dependence is coef * v. */
typedef struct {
    bool dep, lin;
    int64_t coef, g;
} Aff;

static int64_t gcd64(int64_t a, int64_t b)
{
    a = a < 0 ? -a : a;
    b = b < 0 ? -b : b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static Aff aff(const CgKernel *k, int e, int var)
{
    const CgExpr *x = &k->ex.v[e];
    switch (x->kind) {
    case CGX_CONST:
        if (dtype_is_float(x->dt))
            return (Aff){false, true, 0, 1};
        return (Aff){false, true, 0, x->i < 0 ? -x->i : x->i};
    case CGX_VAR: return x->var == var ? (Aff){true, true, 1, 0} : (Aff){false, true, 0, 1};
    case CGX_CAST:
        if (!dtype_is_float(x->dt) && !dtype_is_float(k->ex.v[x->a[0]].dt))
            return aff(k, x->a[0], var);
        break;
    case CGX_OP:
        if (x->op == CG_ADD || x->op == CG_SUB) {
            Aff a = aff(k, x->a[0], var), b = aff(k, x->a[1], var);
            return (Aff){a.dep || b.dep, a.lin && b.lin,
                         x->op == CG_ADD ? a.coef + b.coef : a.coef - b.coef, gcd64(a.g, b.g)};
        }
        if (x->op == CG_MUL) {
            Aff a = aff(k, x->a[0], var), b = aff(k, x->a[1], var);
            int64_t c;
            if (!a.dep && !b.dep)
                return (Aff){false, true, 0, a.g && b.g && a.g < (1 << 20) && b.g < (1 << 20)
                                                 ? a.g * b.g
                                                 : (a.g && b.g ? 1 : 0)};
            const CgExpr *cb = &k->ex.v[x->a[1]], *ca = &k->ex.v[x->a[0]];
            if (!b.dep && cb->kind == CGX_CONST && !dtype_is_float(cb->dt)) {
                c = cb->i;
                return (Aff){true, a.lin, a.coef * c, gcd64(a.g * c, 0)};
            }
            if (!a.dep && ca->kind == CGX_CONST && !dtype_is_float(ca->dt)) {
                c = ca->i;
                return (Aff){true, b.lin, b.coef * c, gcd64(b.g * c, 0)};
            }
            return (Aff){true, false, 0, 1};
        }
        if (x->op == CG_NEG) {
            Aff a = aff(k, x->a[0], var);
            a.coef = -a.coef;
            return a;
        }
        break;
    default: break;
    }
    /* anything else: fine when it does not depend on var (base unknown) */
    int n = x->kind == CGX_OP ? cg_opinfo[x->op].arity
            : x->kind == CGX_SELECT ? 3
            : (x->kind == CGX_LOAD || x->kind == CGX_CAST || x->kind == CGX_RAND) ? 1
                                                                                  : 0;
    for (int i = 0; i < n; i++)
        if (aff(k, x->a[i], var).dep)
            return (Aff){true, false, 0, 1};
    return (Aff){false, true, 0, 1};
}

/* Per param while planning: its accesses in the phase. */
typedef struct {
    bool ld, st, bad;
    int64_t g;  /* gcd of the bases of its accesses */
    int index;  /* an index expression of one access */
} Use;

/* Visits the loads of expression e the phase prints (a let-bound node
 * other than the root is a local already: not entered). */
static void visit_loads(const CgKernel *k, int e, bool root, int var, Use *u)
{
    if (e < 0)
        return;
    const CgExpr *x = &k->ex.v[e];
    if (x->let && !root)
        return;
    if (x->kind == CGX_LOAD) {
        Use *p = &u[x->param];
        Aff a = aff(k, x->a[0], var);
        p->ld = true;
        if (!a.dep || !a.lin || a.coef != 1)
            p->bad = true;
        p->g = gcd64(p->g, a.g);
        p->index = x->a[0];
    }
    int n = x->kind == CGX_OP ? cg_opinfo[x->op].arity
            : x->kind == CGX_SELECT ? 3
            : (x->kind == CGX_LOAD || x->kind == CGX_CAST || x->kind == CGX_RAND) ? 1
                                                                                  : 0;
    for (int i = 0; i < n; i++)
        visit_loads(k, x->a[i], false, var, u);
}

bool cg_cuda_vec_plan(const CgKernel *k, const CgPhase *ph, const DType *storage,
                      const CgCudaAlias *al, CgCudaVec *v)
{
    memset(v, 0, sizeof *v);
    if (!al || !al->a16 || al->all || ph->ndim == 0)
        return false;
    int var = ph->dim[ph->ndim - 1].var;
    int64_t last = ph->dim[ph->ndim - 1].n;
    int np = k->params.n;
    Use *u = xcalloc((size_t)np + 1, sizeof(Use));
    for (int i = 0; i < ph->lets.n; i++)
        visit_loads(k, ph->lets.v[i], true, var, u);
    if (ph->acc >= 0)
        visit_loads(k, ph->value, true, var, u);
    for (int i = 0; i < ph->st.n; i++) {
        const CgStore *s = &ph->st.v[i];
        visit_loads(k, s->index, true, var, u);
        visit_loads(k, s->value, true, var, u);
        visit_loads(k, s->guard, true, var, u);
        Use *p = &u[s->param];
        Aff a = aff(k, s->index, var);
        if (p->st || s->accumulate || s->guard >= 0 || !a.dep || !a.lin || a.coef != 1)
            p->bad = true;
        p->st = true;
        p->g = gcd64(p->g, a.g);
        p->index = s->index;
    }
    /* candidates: float params of 16-byte aligned buffers */
    bool any16 = false;
    for (int i = 0; i < np; i++) {
        Use *p = &u[i];
        if (!(p->ld || p->st))
            continue;
        if (!al->a16[i] || (storage[i] != DT_F32 && storage[i] != DT_BF16))
            p->bad = true;
        if (!p->bad && storage[i] == DT_BF16)
            any16 = true;
    }
    int vec = any16 ? 8 : 4;
    if (last % vec != 0) {
        free(u);
        return false;
    }
    for (int i = 0; i < np; i++)
        if ((u[i].ld || u[i].st) && u[i].g % vec != 0)
            u[i].bad = true;
    /* a buffer is vectorised as a whole, with at most one stored param */
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < np; i++) {
            if (!(u[i].ld || u[i].st) || u[i].bad)
                continue;
            int stores = 0;
            for (int j = 0; j < np; j++) {
                if (al->cls[j] != al->cls[i] || !(u[j].ld || u[j].st))
                    continue;
                stores += u[j].st;
                if (u[j].bad || stores > 1) {
                    u[i].bad = true;
                    changed = true;
                    break;
                }
            }
        }
    }
    v->vec = vec;
    v->var = var;
    v->param = xmalloc(sizeof(int) * (size_t)(np + 1));
    v->ld = xmalloc(sizeof(bool) * (size_t)(np + 1));
    v->st = xmalloc(sizeof(bool) * (size_t)(np + 1));
    v->index = xmalloc(sizeof(int) * (size_t)(np + 1));
    for (int i = 0; i < np; i++)
        if ((u[i].ld || u[i].st) && !u[i].bad) {
            v->param[v->n] = i;
            v->ld[v->n] = u[i].ld;
            v->st[v->n] = u[i].st;
            v->index[v->n] = u[i].index;
            v->n++;
        }
    free(u);
    if (!v->n) {
        cg_cuda_vec_free(v);
        return false;
    }
    return true;
}

void cg_cuda_vec_free(CgCudaVec *v)
{
    free(v->param);
    free(v->ld);
    free(v->st);
    free(v->index);
    free(v->cache);
    memset(v, 0, sizeof *v);
}

/* uint4 accesses of one vector of param p's storage type */
static int words(const CgCudaVec *v, const DType *storage, int p)
{
    return v->vec * (storage[p] == DT_BF16 ? 2 : 4) / 16;
}

void cg_cuda_vec_open(CgBuf *b, const CgKernel *k, const CgCudaVec *v, const DType *storage,
                      int depth)
{
    const CgTarget *t = &cg_target_cuda;
    for (int i = 0; i < v->n; i++) {
        int p = v->param[i];
        bool bf = storage[p] == DT_BF16;
        cg_indent(b, depth);
        cg_printf(b, "const int64_t kiln_o%d = ", p);
        cg_print_expr(b, k, v->index[i], t);
        cg_puts(b, ";\n");
        if (v->ld[i]) {
            int role = v->cache ? v->cache[i] : 0;
            cg_indent(b, depth);
            cg_printf(b, "kiln_vec%d w%d;\n", v->vec, p);
            for (int w = 0; w < words(v, storage, p); w++) {
                cg_indent(b, depth);
                if (role == 2) /* the row cache (cuda_rowcache.c) */
                    cg_printf(b, "w%d.u[%d] = kiln_c%d[kiln_t][%d]; (void)kiln_o%d;\n", p, w, p,
                              w, p);
                else
                    cg_printf(b, "w%d.u[%d] = ((const uint4 *)(p%d%s + kiln_o%d))[%d];\n", p, w,
                              p, bf ? ".p" : "", p, w);
                if (role == 1) {
                    cg_indent(b, depth);
                    cg_printf(b, "kiln_c%d[kiln_t][%d] = w%d.u[%d];\n", p, w, p, w);
                }
            }
        }
        if (v->st[i] && (bf || !v->ld[i])) {
            cg_indent(b, depth);
            cg_printf(b, "kiln_vec%d s%d;\n", v->vec, p);
        }
    }
    cg_indent(b, depth);
    cg_printf(b, "const int64_t kiln_vb = v%d;\n", v->var);
    cg_indent(b, depth);
    cg_puts(b, "#pragma unroll\n");
    cg_indent(b, depth);
    cg_printf(b, "for (int kiln_u = 0; kiln_u < %d; kiln_u++) {\n", v->vec);
    cg_indent(b, depth + 1);
    cg_printf(b, "const int64_t v%d = kiln_vb + kiln_u;\n", v->var);
    for (int i = 0; i < v->n; i++) {
        int p = v->param[i];
        cg_indent(b, depth + 1);
        if (storage[p] == DT_BF16) {
            /* loads read w, stores write s (separate when both) */
            const char *l = v->ld[i] ? "w" : "s", *s = v->st[i] ? "s" : "w";
            cg_printf(b, "const kiln_vbf p%d = {&%s%d.h[kiln_u], {&%s%d.h[kiln_u]}};\n", p, l, p, s, p);
        } else {
            const char *w = v->ld[i] ? "w" : "s";
            cg_printf(b, "const kiln_vf p%d = {&%s%d.f[kiln_u]};\n", p, w, p);
        }
        cg_indent(b, depth + 1);
        cg_printf(b, "(void)p%d;\n", p);
    }
}

void cg_cuda_vec_close(CgBuf *b, const CgCudaVec *v, const DType *storage, int depth)
{
    cg_indent(b, depth);
    cg_puts(b, "}\n");
    for (int i = 0; i < v->n; i++) {
        int p = v->param[i];
        if (!v->st[i])
            continue;
        bool bf = storage[p] == DT_BF16;
        const char *s = bf || !v->ld[i] ? "s" : "w";
        for (int w = 0; w < words(v, storage, p); w++) {
            cg_indent(b, depth);
            cg_printf(b, "((uint4 *)(p%d%s + kiln_o%d))[%d] = kiln_pack_%c(&%s%d.%c[%d]);\n", p,
                      bf ? ".p" : "", p, w, bf ? 'h' : 'f', s, p, bf ? 'h' : 'f', bf ? 8 * w : 4 * w);
        }
    }
}
