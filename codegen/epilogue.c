/* epilogue.c - which GEMM steps of a plan carry a cuBLASLt epilogue (see
 * CgEpilogue in codegen.h): bias, GELU (with the pre-activation kept for
 * backward), GELU backward, bias gradients. Recognition is structural: the
 * GELU forms are small S-expression patterns matched against the IR's
 * definitions; the plan conditions (what a skipped step writes, who reads
 * the GEMM's result, when a bias gradient is read) are checked on the plan
 * and the memory plan. */
#include "codegen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- patterns ----------------------------------------------------------------
 * pattern := NUMBER            a constant (const op, or a broadcast of one)
 *          | ?v                any tensor; every ?v of a match is one tensor
 *          | (= ?v pattern)    pattern, and ?v names its tensor
 *          | (opcode pattern...) an op of that IR opcode; add and mul match
 *                              their operands in either order */

enum { PAT_MAXN = 96, PAT_MAXV = 12 };
typedef enum { PN_CONST, PN_VAR, PN_BIND, PN_OP } PKind;
typedef struct {
    PKind k;
    int code;   /* PN_OP: Opcode */
    double f;   /* PN_CONST */
    int var;    /* PN_VAR, PN_BIND */
    int n;      /* PN_OP: operands; PN_BIND: 1 */
    int a[3];   /* operand nodes */
} PNode;
typedef struct {
    PNode node[PAT_MAXN];
    int n, root;
    char var[PAT_MAXV][8];
    int nvar;
} Pattern;

/* nn.gelu(x) */
static const char gelu_src[] =
    "(mul (mul 0.5 ?x)"
    "     (add 1 (tanh (mul 0.7978845608028654"
    "                       (add ?x (mul (mul (mul 0.044715 ?x) ?x) ?x))))))";

/* d(nn.gelu(x)) with incoming gradient ?g, as autodiff + simplify write it:
 * t = tanh(k (x + c x^3)); s = g (0.5 x) (1 - t^2) k (through tanh);
 * the cube's terms s, s (c x x), (s x)(c x), (s x x) c; the outer product's
 * g (1 + t) 0.5. */
static const char dgelu_src[] =
    "(add (add (add (add (= ?s (mul (mul (mul ?g (mul 0.5 ?x))"
    "                                    (sub 1 (mul (= ?t (tanh (mul 0.7978845608028654"
    "                                         (add ?x (mul (= ?xx (mul (= ?cx (mul 0.044715 ?x)) ?x))"
    "                                                      ?x)))))"
    "                                                ?t)))"
    "                               0.7978845608028654))"
    "                    (mul ?s ?xx))"
    "               (mul (= ?sx (mul ?s ?x)) ?cx))"
    "          (mul (mul ?sx ?x) 0.044715))"
    "     (mul (mul ?g (add 1 ?t)) 0.5))";

static void skip_ws(const char **s)
{
    while (**s == ' ' || **s == '\n' || **s == '\t')
        (*s)++;
}

static int pat_var(Pattern *p, const char **s)
{
    char name[8];
    int n = 0;
    (*s)++; /* '?' */
    while (**s && **s != ' ' && **s != ')' && **s != '(' && n < 7)
        name[n++] = *(*s)++;
    name[n] = 0;
    for (int v = 0; v < p->nvar; v++)
        if (strcmp(p->var[v], name) == 0)
            return v;
    if (p->nvar == PAT_MAXV)
        die("epilogue pattern: too many variables");
    memcpy(p->var[p->nvar], name, (size_t)n + 1);
    return p->nvar++;
}

static int pat_node(Pattern *p, PNode nd)
{
    if (p->n == PAT_MAXN)
        die("epilogue pattern: too many nodes");
    p->node[p->n] = nd;
    return p->n++;
}

static int pat_parse(Pattern *p, const char **s)
{
    skip_ws(s);
    PNode nd = {0};
    if (**s == '?') {
        nd.k = PN_VAR;
        nd.var = pat_var(p, s);
        return pat_node(p, nd);
    }
    if (**s != '(') {
        char *end;
        nd.k = PN_CONST;
        nd.f = strtod(*s, &end);
        if (end == *s)
            die("epilogue pattern: bad token at \"%.20s\"", *s);
        *s = end;
        return pat_node(p, nd);
    }
    (*s)++;
    skip_ws(s);
    char word[16];
    int n = 0;
    while (**s && **s != ' ' && **s != '(' && **s != ')' && n < 15)
        word[n++] = *(*s)++;
    word[n] = 0;
    if (strcmp(word, "=") == 0) {
        nd.k = PN_BIND;
        skip_ws(s);
        if (**s != '?')
            die("epilogue pattern: (= needs a variable");
        nd.var = pat_var(p, s);
        nd.n = 1;
        nd.a[0] = pat_parse(p, s);
    } else {
        nd.k = PN_OP;
        nd.code = ir_opcode_parse(word);
        if (nd.code < 0)
            die("epilogue pattern: unknown opcode %s", word);
        for (skip_ws(s); **s != ')'; skip_ws(s)) {
            if (!**s || nd.n == 3)
                die("epilogue pattern: unbalanced or too many operands");
            nd.a[nd.n++] = pat_parse(p, s);
        }
    }
    skip_ws(s);
    if (**s != ')')
        die("epilogue pattern: expected ')' at \"%.20s\"", *s);
    (*s)++;
    return pat_node(p, nd);
}

/* Parses src into *p (a few microseconds: patterns are parsed per use, so
 * the matchers keep no state). */
static void pattern(Pattern *p, const char *src)
{
    memset(p, 0, sizeof *p);
    const char *s = src;
    p->root = pat_parse(p, &s);
    skip_ws(&s);
    if (*s)
        die("epilogue pattern: trailing text \"%.20s\"", s);
}

static bool const_value(const Graph *g, int t, double *v)
{
    int o = g->t.v[t].op;
    if (o >= 0 && g->ops.v[o].code == OP_BROADCAST)
        o = g->t.v[g->ops.v[o].in[0]].op;
    if (o < 0 || g->ops.v[o].code != OP_CONST)
        return false;
    *v = g->ops.v[o].attr.f;
    return true;
}

static bool match(const Graph *g, const Pattern *p, int n, int t, int *bind)
{
    const PNode *nd = &p->node[n];
    switch (nd->k) {
    case PN_CONST: {
        double v;
        return const_value(g, t, &v) && fabs(v - nd->f) <= 1e-6 * fabs(nd->f);
    }
    case PN_VAR:
        if (bind[nd->var] < 0)
            bind[nd->var] = t;
        return bind[nd->var] == t;
    case PN_BIND:
        if (bind[nd->var] >= 0 && bind[nd->var] != t)
            return false;
        if (!match(g, p, nd->a[0], t, bind))
            return false;
        bind[nd->var] = t;
        return true;
    case PN_OP: break;
    }
    int o = g->t.v[t].op;
    if (o < 0)
        return false;
    const Op *op = &g->ops.v[o];
    if ((int)op->code != nd->code || op->nin != nd->n)
        return false;
    int save[PAT_MAXV];
    memcpy(save, bind, sizeof save);
    bool ok = true;
    for (int i = 0; i < nd->n && ok; i++)
        ok = match(g, p, nd->a[i], op->in[i], bind);
    if (ok)
        return true;
    memcpy(bind, save, sizeof save);
    if (nd->n == 2 && (op->code == OP_ADD || op->code == OP_MUL)) {
        if (match(g, p, nd->a[0], op->in[1], bind) && match(g, p, nd->a[1], op->in[0], bind))
            return true;
        memcpy(bind, save, sizeof save);
    }
    return false;
}

static int var_of(const Pattern *p, const char *name)
{
    for (int v = 0; v < p->nvar; v++)
        if (strcmp(p->var[v], name) == 0)
            return v;
    die("epilogue pattern: no variable ?%s", name);
}

static bool match_root(const Graph *g, const Pattern *p, int t, int *bind)
{
    for (int v = 0; v < PAT_MAXV; v++)
        bind[v] = -1;
    return t >= 0 && t < g->t.n && match(g, p, p->root, t, bind);
}

bool cg_match_gelu(const Graph *g, int t, int *x)
{
    Pattern p;
    pattern(&p, gelu_src);
    int bind[PAT_MAXV];
    if (!match_root(g, &p, t, bind))
        return false;
    *x = bind[var_of(&p, "x")];
    return true;
}

bool cg_match_dgelu(const Graph *g, int t, int *x, int *grad)
{
    Pattern p;
    pattern(&p, dgelu_src);
    int bind[PAT_MAXV];
    if (!match_root(g, &p, t, bind))
        return false;
    *x = bind[var_of(&p, "x")];
    *grad = bind[var_of(&p, "g")];
    return true;
}

/* ---- the plan ------------------------------------------------------------- */

typedef struct {
    CgPlan *p;
    const Graph *g;
    const bool *mat;
    int *rstart, *rlist; /* ops reading tensor t: rlist[rstart[t] .. rstart[t+1]) */
    int *gstart, *glist; /* ops of group gid, program order */
    int ngroups;
    int *kstep;          /* group -> its kernel step; -1 */
    int *opstep;         /* op -> the kernel step computing it alone; -1 */
} Ctx;

static const char *const epi_names[CG_EPI__COUNT] = {
    "none", "bias", "gelu_bias", "gelu_aux_bias", "dgelu", "dgelu_bgrad", "bgrad_a", "bgrad_b",
};

const char *cg_epilogue_name(CgEpilogue e)
{
    return (unsigned)e < CG_EPI__COUNT ? epi_names[e] : "?";
}

static bool is_output(const Graph *g, int t)
{
    for (int k = 0; k < g->outs.n; k++)
        if (g->outs.v[k].t == t)
            return true;
    for (int u = 0; u < g->upd.n; u++)
        if (g->upd.v[u].value == t)
            return true;
    return false;
}

static int nmatmul(const Ctx *c, int gid)
{
    int n = 0;
    for (int q = c->gstart[gid]; q < c->gstart[gid + 1]; q++)
        n += c->g->ops.v[c->glist[q]].code == OP_MATMUL;
    return n;
}

/* The one tensor group gid's kernel writes (its only materialised non-matmul
 * member), or -1. */
static int group_result(const Ctx *c, int gid)
{
    int d = -1;
    for (int q = c->gstart[gid]; q < c->gstart[gid + 1]; q++) {
        const Op *o = &c->g->ops.v[c->glist[q]];
        if (o->code == OP_MATMUL || !c->mat[o->out])
            continue;
        if (d >= 0)
            return -1;
        d = o->out;
    }
    return d;
}

/* Whether every reader of tensor t is an op of group gid, and t is no graph
 * output or update value. */
static bool read_only_in(const Ctx *c, int t, int gid)
{
    for (int r = c->rstart[t]; r < c->rstart[t + 1]; r++)
        if (c->g->ops.v[c->rlist[r]].group != gid || gid < 0)
            return false;
    return !is_output(c->g, t);
}

/* If tensor t is add(x, broadcast(bias)) (either order) with bias f32[N], N
 * the last dim of x, and t, x f32 of one shape: the bias; else -1. */
static int bias_add(const Graph *g, int t, int x)
{
    int o = g->t.v[t].op;
    if (o < 0 || g->ops.v[o].code != OP_ADD)
        return -1;
    const Op *add = &g->ops.v[o];
    int other = add->in[0] == x ? add->in[1] : add->in[1] == x ? add->in[0] : -1;
    if (other < 0 || other == x)
        return -1;
    int bo = g->t.v[other].op;
    if (bo < 0 || g->ops.v[bo].code != OP_BROADCAST)
        return -1;
    int bias = g->ops.v[bo].in[0];
    const Shape *bs = &g->t.v[bias].s, *xs = &g->t.v[x].s, *ts = &g->t.v[t].s;
    if (bs->rank != 1 || bs->dtype != DT_F32 || xs->dtype != DT_F32 || !shape_eq(ts, xs) ||
        bs->dim[0] != xs->dim[xs->rank - 1])
        return -1;
    return bias;
}

/* GEMM step s heads a group with no other matmul whose kernel is step s+1:
 * that group, else -1. */
static int headed_group(const Ctx *c, int s)
{
    const CgStep *st = &c->p->steps.v[s];
    if (st->kind != CG_STEP_GEMM || st->group < 0 || nmatmul(c, st->group) != 1 ||
        c->kstep[st->group] != s + 1)
        return -1;
    return st->group;
}

/* Whether every use of tensor t (and of views of it sharing its buffer) is
 * by an op after op q. */
static bool read_after(const Ctx *c, int t, int q, int depth)
{
    if (depth > 8)
        return false;
    for (int r = c->rstart[t]; r < c->rstart[t + 1]; r++) {
        const Op *o = &c->g->ops.v[c->rlist[r]];
        if (o->code == OP_RESHAPE && c->p->mem->root[o->out] == c->p->mem->root[t]) {
            if (!read_after(c, o->out, q, depth + 1))
                return false;
        } else if (c->rlist[r] <= q) {
            return false;
        }
    }
    return true; /* graph outputs are read after every step */
}

/* Whether a GEMM at op q may write tensor t's storage although the plan
 * writes it at t's own op: no other temporary storage sharing those bytes is
 * live between the two (memplan reuses bytes only between storages whose
 * live ranges do not meet). */
static bool safe_write_in(const MemPlan *mp, int t, int q)
{
    int r = mp->root[t];
    if (mp->persistent[r])
        return true;
    int lo = mp->first[r] < q ? mp->first[r] : q, hi = mp->first[r] < q ? q : mp->first[r];
    int64_t a0 = mp->offset[r], a1 = a0 + mp->bytes[r];
    for (int u = 0; u < mp->nt; u++) {
        if (u == r || mp->root[u] != u || mp->persistent[u] || mp->first[u] < 0 ||
            mp->last[u] < lo || mp->first[u] > hi)
            continue;
        int64_t b0 = mp->offset[u], b1 = b0 + mp->bytes[u];
        if (a0 < b1 && b0 < a1)
            return false;
    }
    return true;
}

static bool safe_write(const Ctx *c, int t, int q) { return safe_write_in(c->p->mem, t, q); }

bool cg_epilogue_safe(const CgPlan *p, const MemPlan *m, int s, bool bgrad)
{
    const CgStep *st = &p->steps.v[s];
    const CgGemm *g = &st->gemm;
    if (g->d >= 0 && !safe_write_in(m, g->d, st->op))
        return false;
    return !bgrad || g->bgrad < 0 || safe_write_in(m, g->bgrad, st->op);
}

/* A bias-gradient reduction of tensor y: a reduce_sum over every axis but
 * the last, of numel n, computed by a kernel step that computes nothing else
 * and that no epilogue claims yet; its step, *r = its result; else -1. */
static int bgrad_step(const Ctx *c, int y, int64_t n, int *r)
{
    const Graph *g = c->g;
    const Shape *ys = &g->t.v[y].s;
    if (ys->dtype != DT_F32 || ys->rank < 2 || ys->dim[ys->rank - 1] != n)
        return -1;
    for (int k = c->rstart[y]; k < c->rstart[y + 1]; k++) {
        int q = c->rlist[k];
        const Op *o = &g->ops.v[q];
        if (o->code != OP_REDUCE_SUM || o->attr.nia != ys->rank - 1)
            continue;
        bool lead = true;
        for (int a = 0; a < o->attr.nia; a++)
            lead = lead && o->attr.ia[a] == a;
        if (!lead || shape_numel(&g->t.v[o->out].s) != n)
            continue;
        int s = o->group >= 0 ? (c->gstart[o->group + 1] - c->gstart[o->group] == 1
                                     ? c->kstep[o->group]
                                     : -1)
                              : c->opstep[q];
        if (s < 0 || c->p->steps.v[s].kind != CG_STEP_KERNEL || c->p->steps.v[s].by_epilogue >= 0)
            continue;
        *r = o->out;
        return s;
    }
    return -1;
}

static void set_bias(Ctx *c, int s)
{
    CgGemm *m = &c->p->steps.v[s].gemm;
    int gid = headed_group(c, s);
    if (gid < 0 || m->epilogue != CG_EPI_NONE)
        return;
    int d = group_result(c, gid);
    if (d < 0)
        return;
    int bias = bias_add(c->g, d, m->c);
    if (bias < 0 || !read_only_in(c, m->c, gid) || !safe_write(c, d, c->p->steps.v[s].op))
        return;
    /* c is read by the add alone */
    if (c->rstart[m->c + 1] - c->rstart[m->c] != 1 || c->rlist[c->rstart[m->c]] != c->g->t.v[d].op)
        return;
    m->epilogue = CG_EPI_BIAS;
    m->bias = bias;
    m->d = d;
    c->p->steps.v[s + 1].by_epilogue = s;
}

/* The backward GEMM step of a GELU_AUX_BIAS pair: step sb heads group gb,
 * whose one result is dgelu(pre, its product) with pre = c + broadcast(bias);
 * returns that result, else -1. */
static int dgelu_result(const Ctx *c, int sb, int cf, int bias)
{
    int gb = headed_group(c, sb);
    if (gb < 0)
        return -1;
    const CgGemm *m = &c->p->steps.v[sb].gemm;
    const Shape *fs = &c->g->t.v[cf].s, *bs = &c->g->t.v[m->c].s;
    if (m->epilogue != CG_EPI_NONE || m->batch != 1 || bs->dtype != DT_F32 ||
        !shape_eq(fs, bs) || !read_only_in(c, m->c, gb))
        return -1;
    int d = group_result(c, gb), x, grad;
    if (d < 0 || !shape_eq(&c->g->t.v[d].s, bs) || !cg_match_dgelu(c->g, d, &x, &grad) ||
        grad != m->c || bias_add(c->g, x, cf) != bias ||
        !safe_write(c, d, c->p->steps.v[sb].op))
        return -1;
    return d;
}

static void set_gelu(Ctx *c, int s)
{
    CgGemm *m = &c->p->steps.v[s].gemm;
    int gid = headed_group(c, s), x;
    if (gid < 0 || m->epilogue != CG_EPI_NONE || m->batch != 1)
        return;
    int d = group_result(c, gid);
    if (d < 0 || !cg_match_gelu(c->g, d, &x) || !shape_eq(&c->g->t.v[d].s, &c->g->t.v[m->c].s))
        return;
    int bias = bias_add(c->g, x, m->c);
    if (bias < 0 || is_output(c->g, m->c) || !safe_write(c, d, c->p->steps.v[s].op))
        return;
    /* every reader of c adds the same bias: this group's x, or the
     * recomputations pre = c + broadcast(bias) of one other group */
    int other = -1;
    for (int r = c->rstart[m->c]; r < c->rstart[m->c + 1]; r++) {
        const Op *o = &c->g->ops.v[c->rlist[r]];
        if (bias_add(c->g, o->out, m->c) != bias)
            return;
        if (o->group == gid)
            continue;
        if (o->group < 0 || (other >= 0 && o->group != other))
            return;
        other = o->group;
    }
    if (other < 0) {
        m->epilogue = CG_EPI_GELU_BIAS;
        m->bias = bias;
        m->d = d;
        c->p->steps.v[s + 1].by_epilogue = s;
        return;
    }
    int sb = c->kstep[other] - 1;
    if (sb <= s + 1)
        return;
    int db = dgelu_result(c, sb, m->c, bias);
    if (db < 0)
        return;
    m->epilogue = CG_EPI_GELU_AUX_BIAS;
    m->bias = bias;
    m->d = d;
    m->aux = m->c;
    m->pair = sb;
    c->p->steps.v[s + 1].by_epilogue = s;
    CgGemm *mb = &c->p->steps.v[sb].gemm;
    mb->epilogue = CG_EPI_DGELU;
    mb->d = db;
    mb->aux = m->c;
    mb->pair = s;
    c->p->steps.v[sb + 1].by_epilogue = sb;
    int r, rs = bgrad_step(c, db, c->g->t.v[db].s.dim[c->g->t.v[db].s.rank - 1], &r);
    if (rs >= 0 && read_after(c, r, c->p->steps.v[sb].op, 0) &&
        safe_write(c, r, c->p->steps.v[sb].op)) {
        mb->epilogue = CG_EPI_DGELU_BGRAD;
        mb->bgrad = r;
        c->p->steps.v[rs].by_epilogue = sb;
    }
}

/* Tensor t, or the tensor t is a reshape (view) of. */
static int unview(const Ctx *c, int t)
{
    int o = c->g->t.v[t].op;
    if (o >= 0 && c->g->ops.v[o].code == OP_RESHAPE &&
        c->p->mem->root[t] == c->p->mem->root[c->g->ops.v[o].in[0]])
        return c->g->ops.v[o].in[0];
    return t;
}

static void set_bgrad(Ctx *c, int s)
{
    CgStep *st = &c->p->steps.v[s];
    CgGemm *m = &st->gemm;
    if (m->epilogue != CG_EPI_NONE || m->batch != 1 || c->g->t.v[m->c].s.dtype != DT_F32)
        return;
    for (int side = 0; side < 2; side++) {
        /* B stored [K, N] (tb = 0), then A stored [K, M] (ta = 1) */
        int op = side == 0 ? m->b : m->a;
        int64_t n = side == 0 ? m->N : m->M;
        if ((side == 0 ? m->tb : !m->ta) || c->g->t.v[op].s.dtype != DT_F32)
            continue;
        int cand[2] = {op, unview(c, op)};
        for (int k = 0; k < 2; k++) {
            int r, rs = bgrad_step(c, cand[k], n, &r);
            if (rs < 0 || shape_numel(&c->g->t.v[cand[k]].s) != m->K * n ||
                !read_after(c, r, st->op, 0) || !safe_write(c, r, st->op))
                continue;
            m->epilogue = side == 0 ? CG_EPI_BGRAD_B : CG_EPI_BGRAD_A;
            m->bgrad = r;
            c->p->steps.v[rs].by_epilogue = s;
            return;
        }
    }
}

void cg_plan_epilogues(CgPlan *p, const bool *mat)
{
    const Graph *g = p->g;
    Ctx c = {.p = p, .g = g, .mat = mat};
    int nt = g->t.n, no = g->ops.n;
    c.rstart = xcalloc((size_t)nt + 2, sizeof(int));
    for (int i = 0; i < no; i++)
        for (int a = 0; a < g->ops.v[i].nin; a++)
            c.rstart[g->ops.v[i].in[a] + 1]++;
    for (int t = 0; t < nt; t++)
        c.rstart[t + 1] += c.rstart[t];
    c.rlist = xmalloc(sizeof(int) * (size_t)(c.rstart[nt] + 1));
    int *fill = xcalloc((size_t)nt + 1, sizeof(int));
    for (int i = 0; i < no; i++)
        for (int a = 0; a < g->ops.v[i].nin; a++) {
            int t = g->ops.v[i].in[a];
            bool dup = false; /* one entry per reading op */
            for (int b = 0; b < a; b++)
                dup = dup || g->ops.v[i].in[b] == t;
            if (!dup)
                c.rlist[c.rstart[t] + fill[t]++] = i;
        }
    /* compact away the duplicate slots */
    int w = 0;
    for (int t = 0; t < nt; t++) {
        int s0 = c.rstart[t];
        c.rstart[t] = w;
        for (int k = 0; k < fill[t]; k++)
            c.rlist[w++] = c.rlist[s0 + k];
    }
    c.rstart[nt] = w;
    free(fill);
    for (int i = 0; i < no; i++)
        if (g->ops.v[i].group >= c.ngroups)
            c.ngroups = g->ops.v[i].group + 1;
    c.gstart = xcalloc((size_t)c.ngroups + 2, sizeof(int));
    for (int i = 0; i < no; i++)
        if (g->ops.v[i].group >= 0)
            c.gstart[g->ops.v[i].group + 1]++;
    for (int k = 0; k < c.ngroups; k++)
        c.gstart[k + 1] += c.gstart[k];
    c.glist = xmalloc(sizeof(int) * (size_t)(no + 1));
    int *gf = xcalloc((size_t)c.ngroups + 1, sizeof(int));
    for (int i = 0; i < no; i++) {
        int gid = g->ops.v[i].group;
        if (gid >= 0)
            c.glist[c.gstart[gid] + gf[gid]++] = i;
    }
    free(gf);
    c.kstep = xmalloc(sizeof(int) * (size_t)(c.ngroups + 1));
    for (int k = 0; k <= c.ngroups; k++)
        c.kstep[k] = -1;
    c.opstep = xmalloc(sizeof(int) * (size_t)(no + 1));
    for (int i = 0; i < no; i++)
        c.opstep[i] = -1;
    for (int s = 0; s < p->steps.n; s++) {
        CgStep *st = &p->steps.v[s];
        st->by_epilogue = -1;
        if (st->kind == CG_STEP_KERNEL && st->group >= 0)
            c.kstep[st->group] = s;
        else if (st->kind == CG_STEP_KERNEL && st->op >= 0)
            c.opstep[st->op] = s;
    }
    for (int s = 0; s < p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_GEMM) {
            set_gelu(&c, s);
            set_bias(&c, s);
        }
    for (int s = 0; s < p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_GEMM)
            set_bgrad(&c, s);
    free(c.rstart);
    free(c.rlist);
    free(c.gstart);
    free(c.glist);
    free(c.kstep);
    free(c.opstep);
}

void cg_plan_print_epilogues(const CgPlan *p, FILE *f, bool each)
{
    int n[CG_EPI__COUNT] = {0}, skipped = 0;
    for (int s = 0; s < p->steps.n; s++) {
        if (p->steps.v[s].kind == CG_STEP_GEMM)
            n[p->steps.v[s].gemm.epilogue]++;
        skipped += p->steps.v[s].by_epilogue >= 0;
    }
    fprintf(f, "gemm epilogues (cuBLASLt, f32):");
    bool any = false;
    for (int e = 1; e < CG_EPI__COUNT; e++)
        if (n[e]) {
            fprintf(f, "%s %d %s", any ? "," : "", n[e], epi_names[e]);
            any = true;
        }
    if (any)
        fprintf(f, "; %d kernel steps they replace\n", skipped);
    else
        fprintf(f, " none\n");
    if (!each)
        return;
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        const CgGemm *m = &st->gemm;
        if (st->kind != CG_STEP_GEMM || m->epilogue == CG_EPI_NONE)
            continue;
        fprintf(f, "  step %d gemm op%d %lldx%lldx%lld: %s", s, st->op, (long long)m->M,
                (long long)m->N, (long long)m->K, epi_names[m->epilogue]);
        if (m->bias >= 0)
            fprintf(f, " bias=%%%d", m->bias);
        if (m->d >= 0)
            fprintf(f, " d=%%%d", m->d);
        if (m->aux >= 0)
            fprintf(f, " aux=%%%d", m->aux);
        if (m->bgrad >= 0)
            fprintf(f, " bgrad=%%%d", m->bgrad);
        if (m->pair >= 0)
            fprintf(f, " pair=step %d", m->pair);
        fprintf(f, "; replaces step");
        for (int k = 0; k < p->steps.n; k++)
            if (p->steps.v[k].by_epilogue == s)
                fprintf(f, " %d", k);
        fprintf(f, "\n");
    }
}
