/* test_memplan.c - the memory plan and the schedule: a hand-computed
 * example, in-place updates, a large random set of lifetimes, and
 * invariants on every model after the full pipeline (no two simultaneously live temps overlap; the peak is the max
 * over time of live bytes; the persistent region holds inputs, params and
 * state). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "passes.h"

static const SrcLoc here = {"test", 1};

static int op1(Graph *g, Opcode c, int a) { return ir_op_x(g, c, &a, 1, NULL, here); }
static int op2(Graph *g, Opcode c, int a, int b)
{
    int in[2] = {a, b};
    return ir_op_x(g, c, in, 2, NULL, here);
}

static int64_t al(int64_t b) { return (b + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN * MEMPLAN_ALIGN; }

/* Checks the plan's invariants against an independent recomputation. */
/* storage: per tensor, the dtype its buffer holds (NULL: its own). */
static void check_storage_invariants(const Graph *g, const MemPlan *m, const DType *storage)
{
    int nt = g->t.n, n = g->ops.n;
    int64_t pers = 0;
    for (int t = 0; t < nt; t++) {
        const Tensor *x = &g->t.v[t];
        assert_true(m->offset[t] % MEMPLAN_ALIGN == 0);
        assert_true(m->offset[t] + m->bytes[t] <= m->arena_bytes);
        assert_int_equal(m->bytes[t],
                         shape_numel(&x->s) * dtype_size(storage ? storage[t] : x->s.dtype));
        if (x->op < 0) {
            assert_true(m->offset[t] + m->bytes[t] <= m->persistent_bytes);
            pers += al(m->bytes[t] ? m->bytes[t] : 1);
        }
    }
    assert_int_equal(pers, m->persistent_bytes);
    /* live ranges recomputed from the graph: a root is live from its first
     * definition to the last read of it or of any tensor sharing it; the ops
     * of a fuse group run as one kernel over their range of op indices, and
     * a result that never leaves its group has no storage */
    int *first = xmalloc(sizeof(int) * (size_t)nt), *last = xmalloc(sizeof(int) * (size_t)nt);
    int *glo = xmalloc(sizeof(int) * (size_t)(n + 1)), *ghi = xmalloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        glo[i] = ghi[i] = -1;
    for (int i = 0; i < n; i++) {
        int gr = g->ops.v[i].group;
        if (gr >= 0 && glo[gr] < 0)
            glo[gr] = i;
        if (gr >= 0)
            ghi[gr] = i;
    }
    bool *mat = pass_fuse_materialised(g);
    for (int t = 0; t < nt; t++)
        first[t] = last[t] = -1;
    for (int i = 0; i < n; i++) {
        const Op *op = &g->ops.v[i];
        int lo = op->group >= 0 ? glo[op->group] : i, hi = op->group >= 0 ? ghi[op->group] : i;
        int r = m->root[op->out];
        if (first[r] < 0 || first[r] > lo)
            first[r] = lo;
        if (last[r] < hi)
            last[r] = hi;
        for (int j = 0; j < op->nin; j++)
            if (last[m->root[op->in[j]]] < hi)
                last[m->root[op->in[j]]] = hi;
    }
    for (int k = 0; k < g->outs.n; k++)
        last[m->root[g->outs.v[k].t]] = n;
    for (int k = 0; k < g->upd.n; k++)
        last[m->root[g->upd.v[k].value]] = n;
    /* no two temps live at once share bytes */
    for (int a = 0; a < nt; a++) {
        if (m->root[a] != a || m->persistent[a] || !mat[a])
            continue;
        for (int b = a + 1; b < nt; b++) {
            if (m->root[b] != b || m->persistent[b] || !mat[b])
                continue;
            bool time = first[a] <= last[b] && first[b] <= last[a];
            bool space = m->offset[a] < m->offset[b] + al(m->bytes[b]) &&
                         m->offset[b] < m->offset[a] + al(m->bytes[a]);
            if (time && space)
                fail_msg("tensors %%%d [%d,%d] and %%%d [%d,%d] overlap at offsets %lld, %lld", a,
                         first[a], last[a], b, first[b], last[b], (long long)m->offset[a],
                         (long long)m->offset[b]);
        }
    }
    /* the split of live bytes, classified plainly: a gradient is the
     * storage of an output "grad.P" of a param P; a saved activation a
     * storage some forward op writes and some backward or optimizer op
     * reads */
    bool *grad = xcalloc((size_t)nt + 1, sizeof(bool)), *saved = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int k = 0; k < g->outs.n; k++) {
        const char *nm = g->outs.v[k].name;
        int p = nm && strncmp(nm, "grad.", 5) == 0 ? ir_find_tensor(g, nm + 5) : -1;
        if (p >= 0 && g->t.v[p].kind == TK_PARAM)
            grad[m->root[g->outs.v[k].t]] = true;
    }
    for (int t = 0; t < nt; t++) {
        bool w = false, r = false;
        for (int i = 0; i < n; i++) {
            const Op *op = &g->ops.v[i];
            if (m->root[op->out] == t &&
                !(op->flags & (OPF_BACKWARD | OPF_OPTIM | OPF_RECOMPUTE)))
                w = true;
            for (int j = 0; j < op->nin; j++)
                if (m->root[op->in[j]] == t && (op->flags & (OPF_BACKWARD | OPF_OPTIM)))
                    r = true;
        }
        saved[t] = w && r && !grad[t];
    }
    int64_t grads = 0;
    for (int t = 0; t < nt; t++)
        if (m->root[t] == t && !m->persistent[t] && mat[t] && grad[t])
            grads += al(m->bytes[t] ? m->bytes[t] : 1);
    assert_int_equal(grads, m->grad_bytes);
    /* the peak is the max over ops of live bytes */
    int64_t peak = m->persistent_bytes;
    for (int i = 0; i < n; i++) {
        int64_t live = m->persistent_bytes, lg = 0, ls = 0;
        for (int t = 0; t < nt; t++)
            if (m->root[t] == t && !m->persistent[t] && mat[t] && first[t] <= i &&
                i <= (last[t] < first[t] ? first[t] : last[t])) {
                int64_t b = al(m->bytes[t] ? m->bytes[t] : 1);
                live += b;
                lg += grad[t] ? b : 0;
                ls += saved[t] ? b : 0;
            }
        assert_int_equal(live, m->live[i]);
        assert_int_equal(lg, m->live_grad[i]);
        assert_int_equal(ls, m->live_saved[i]);
        assert_true(lg + ls <= live - m->persistent_bytes);
        if (live > peak)
            peak = live;
    }
    free(grad);
    free(saved);
    assert_int_equal(peak, m->peak_live);
    assert_true(m->arena_bytes >= m->peak_live);
    free(first);
    free(last);
    free(glo);
    free(ghi);
    free(mat);
}

/* The greedy best fit of pass_memplan written plainly: temps largest
 * first (ties by first use, then id), each at the smallest gap (the lowest
 * one among equal gaps) between the placed temps whose live ranges meet
 * its own, found by a scan of every placed temp and a sort by offset; else
 * above them. The plan's offsets must be these (its overlap index and
 * offset-ordered walk only make the search cheaper). */
static int ref_by_size(const void *a, const void *b, void *ctx)
{
    const MemPlan *m = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    int64_t sx = al(m->bytes[x] ? m->bytes[x] : 1), sy = al(m->bytes[y] ? m->bytes[y] : 1);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    if (m->first[x] != m->first[y])
        return m->first[x] < m->first[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int ref_by_off(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void check_best_fit(const Graph *g, const MemPlan *m)
{
    int nt = g->t.n, nn = 0;
    bool *mat = pass_fuse_materialised(g);
    int *temps = xmalloc(sizeof(int) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        if (m->root[t] == t && !m->persistent[t] && mat[t])
            temps[nn++] = t;
    qsort_r(temps, (size_t)nn, sizeof(int), ref_by_size, (void *)m);
    int64_t *off = xmalloc(sizeof(int64_t) * (size_t)(nt + 1));
    int64_t(*conf)[2] = xmalloc(sizeof *conf * (size_t)(nn + 1));
    for (int k = 0; k < nn; k++) {
        int t = temps[k], nc = 0;
        int64_t size = al(m->bytes[t] ? m->bytes[t] : 1);
        for (int q = 0; q < k; q++) {
            int u = temps[q];
            if (m->first[u] <= m->last[t] && m->first[t] <= m->last[u]) {
                conf[nc][0] = off[u];
                conf[nc++][1] = off[u] + al(m->bytes[u] ? m->bytes[u] : 1);
            }
        }
        qsort(conf, (size_t)nc, sizeof *conf, ref_by_off);
        int64_t best = -1, best_gap = INT64_MAX, pos = 0;
        for (int q = 0; q < nc; q++) {
            if (conf[q][0] - pos >= size && conf[q][0] - pos < best_gap) {
                best = pos;
                best_gap = conf[q][0] - pos;
            }
            if (conf[q][1] > pos)
                pos = conf[q][1];
        }
        off[t] = best < 0 ? pos : best;
        if (m->persistent_bytes + off[t] != m->offset[t])
            fail_msg("temp %%%d: offset %lld, the plain best fit gives %lld", t,
                     (long long)m->offset[t], (long long)(m->persistent_bytes + off[t]));
    }
    free(conf);
    free(off);
    free(temps);
    free(mat);
}

static void check_invariants(const Graph *g, const MemPlan *m)
{
    check_storage_invariants(g, m, NULL);
    check_best_fit(g, m);
}

/* pass_memplan_storage with every float temporary stored as bf16 (as the
 * CUDA backend's mixed precision does): the same storages and live ranges,
 * the plan's invariants at 2 bytes per element, a smaller arena. */
static void check_bf16_storage(const char *path, const Graph *g, const MemPlan *m)
{
    int nt = g->t.n;
    bool *half = xmalloc(sizeof(bool) * (size_t)(nt + 1));
    for (int t = 0; t < nt; t++)
        half[t] = !m->persistent[m->root[t]];
    for (int t = 0; t < nt; t++)
        if (g->t.v[t].s.dtype != DT_F32)
            half[m->root[t]] = false; /* a storage holds one dtype */
    DType *st = xmalloc(sizeof(DType) * (size_t)(nt + 1));
    int n = 0;
    for (int t = 0; t < nt; t++) {
        st[t] = half[m->root[t]] ? DT_BF16 : g->t.v[t].s.dtype;
        n += st[t] == DT_BF16;
    }
    Diag d = {{0}};
    MemPlan *h = pass_memplan_storage(g, st, &d);
    check_storage_invariants(g, h, st);
    assert_int_equal(h->persistent_bytes, m->persistent_bytes);
    for (int t = 0; t < nt; t++) {
        assert_int_equal(h->root[t], m->root[t]);
        if (m->root[t] == t)
            assert_true(h->first[t] == m->first[t] && h->last[t] == m->last[t]);
    }
    fprintf(stderr, "%s: %d tensors as bf16, arena %lld -> %lld bytes\n", path, n,
            (long long)m->arena_bytes, (long long)h->arena_bytes);
    assert_true(n > 0);
    assert_true(h->arena_bytes < m->arena_bytes);
    /* counted without placing: the same sizes and timeline */
    for (int pass = 0; pass < 2; pass++) {
        const MemPlan *want = pass ? h : m;
        MemPlan *c = pass_memplan_counted(g, m, pass ? st : NULL);
        assert_int_equal(c->nops, want->nops);
        assert_int_equal(c->persistent_bytes, want->persistent_bytes);
        assert_int_equal(c->grad_bytes, want->grad_bytes);
        assert_int_equal(c->peak_live, want->peak_live);
        assert_int_equal(c->peak_op, want->peak_op);
        for (int t = 0; t < nt; t++)
            assert_int_equal(c->bytes[t], want->bytes[t]);
        for (int i = 0; i < m->nops; i++) {
            assert_int_equal(c->live[i], want->live[i]);
            assert_int_equal(c->live_grad[i], want->live_grad[i]);
            assert_int_equal(c->live_saved[i], want->live_saved[i]);
        }
        pass_memplan_free(c);
    }
    pass_memplan_free(h);
    free(st);
    free(half);
}

static void test_hand_example(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[1] = {16}; /* 64 bytes */
    int x = ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 1, d), (ParamInit){0});
    int a = op1(g, OP_EXP, x);    /* op 0: a            live 64+64   */
    int b = op1(g, OP_NEG, a);    /* op 1: a b          live 64+128  */
    int c = op2(g, OP_ADD, a, b); /* op 2: a b c        live 64+192  */
    int e = op1(g, OP_EXP, c);    /* op 3: c e          live 64+128  */
    ir_add_output(g, "e", e);
    Diag dg = {{0}};
    MemPlan *m = pass_memplan(g, &dg);
    assert_int_equal(m->persistent_bytes, 64);
    assert_int_equal(m->live[0], 128);
    assert_int_equal(m->live[1], 192);
    assert_int_equal(m->live[2], 256);
    assert_int_equal(m->live[3], 192);
    assert_int_equal(m->peak_live, 256);
    assert_int_equal(m->peak_op, 2);
    /* a, b, c need three slots; e reuses a's or b's */
    assert_int_equal(m->arena_bytes, 256);
    assert_true(m->offset[e] != m->offset[c]);
    check_invariants(g, m);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    pass_memplan_print(g, m, f);
    fclose(f);
    assert_non_null(strstr(buf, "peak 256 bytes"));
    assert_non_null(strstr(buf, "<- peak"));
    free(buf);
    pass_memplan_free(m);
    ir_free(g);
}

static void test_views_and_inplace(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[2] = {4, 16}, f[1] = {64};
    int p = ir_add_input(g, TK_PARAM, "p", shape_make(DT_F32, 2, d), (ParamInit){0});
    int q = ir_add_input(g, TK_PARAM, "q", shape_make(DT_F32, 2, d), (ParamInit){0});
    int x = ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 2, d), (ParamInit){0});
    OpAttr rs = {.rank = 1, .shape = {64}};
    int v = ir_op_x(g, OP_RESHAPE, &x, 1, &rs, here); /* a view of x */
    (void)f;
    int np = op2(g, OP_SUB, p, x);  /* p's last reader: in place */
    int nq = op2(g, OP_ADD, q, x);
    int late = op1(g, OP_NEG, q);   /* q read after nq exists: not in place */
    ir_add_update(g, p, np);
    ir_add_update(g, q, nq);
    ir_add_output(g, "late", late);
    ir_add_output(g, "v", v);
    Diag dg = {{0}};
    MemPlan *m = pass_memplan(g, &dg);
    assert_int_equal(m->offset[v], m->offset[x]);
    assert_true(m->inplace[0]);
    assert_int_equal(m->offset[np], m->offset[p]);
    assert_false(m->inplace[1]);
    assert_true(m->offset[nq] >= m->persistent_bytes);
    check_invariants(g, m);
    pass_memplan_free(m);
    ir_free(g);
}

static void test_schedule_sinks(void **state)
{
    (void)state;
    Graph *g = ir_new();
    int64_t d[1] = {256};
    int x = ir_add_input(g, TK_INPUT, "x", shape_make(DT_F32, 1, d), (ParamInit){0});
    OpAttr c = {.dtype = DT_F32, .f = 2.0, .rank = 1, .shape = {256}};
    int k = ir_op_x(g, OP_CONST, NULL, 0, &c, here); /* op 0: only needed at the end */
    int a = op1(g, OP_EXP, x);
    int b = op1(g, OP_NEG, a);
    int c2 = op2(g, OP_ADD, a, b); /* a, b, c2 (and k, before scheduling) live */
    int e = op2(g, OP_MUL, c2, k);
    ir_add_output(g, "e", e);
    Diag dg = {{0}};
    MemPlan *m0 = pass_memplan(g, &dg);
    int64_t before = m0->peak_live;
    pass_memplan_free(m0);
    assert_true(pass_schedule(g, NULL, &dg));
    char err[512];
    if (!ir_verify(g, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(g->ops.v[3].code, OP_CONST); /* just before its consumer */
    assert_int_equal(g->ops.v[4].code, OP_MUL);
    MemPlan *m = pass_memplan(g, &dg);
    assert_true(m->peak_live < before);
    check_invariants(g, m);
    pass_memplan_free(m);
    ir_free(g);
}

static void test_models(void **state)
{
    (void)state;
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++) {
        const char *path = *pp;
        Model *md = load_model(path, NULL, 0);
        PassOpts po;
        pass_opts_default(&po);
        Diag d = {{0}};
        if (!pass_pipeline(md->g, &po, NULL, NULL, NULL, &d))
            fail_msg("%s: %s", path, d.msg);
        MemPlan *m = pass_memplan(md->g, &d);
        int inplace = 0;
        for (int k = 0; k < md->g->upd.n; k++)
            inplace += m->inplace[k];
        fprintf(stderr, "%s: %d ops, persistent %lld, peak live %lld, arena %lld, %d/%d updates in place\n",
                path, md->g->ops.n, (long long)m->persistent_bytes, (long long)m->peak_live,
                (long long)m->arena_bytes, inplace, md->g->upd.n);
        check_invariants(md->g, m);
        /* a training step: at its last op every gradient is live, and
         * forward results are saved for backward */
        int64_t most_saved = 0;
        for (int i = 0; i < m->nops; i++)
            most_saved = m->live_saved[i] > most_saved ? m->live_saved[i] : most_saved;
        assert_true(m->grad_bytes > 0 && most_saved > 0);
        assert_int_equal(m->live_grad[m->nops - 1], m->grad_bytes);
        check_bf16_storage(path, md->g, m);
        pass_memplan_free(m);
        fe_model_free(md);
    }
    free_model_paths(paths);
}

/* Deeper models: some temps meet many placed ones (the offset-ordered
 * walk), others few (the sorted overlap query); both must give the plain
 * best fit's offsets. */
static void test_deep(void **state)
{
    (void)state;
    const char *cases[][2] = {{"models/gpt.lua", "L=12"}, {"models/llama.lua", "L=8"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *set[1] = {cases[c][1]};
        Model *md = load_model(cases[c][0], set, 1);
        PassOpts po;
        pass_opts_default(&po);
        Diag d = {{0}};
        if (!pass_pipeline(md->g, &po, NULL, NULL, NULL, &d))
            fail_msg("%s: %s", cases[c][0], d.msg);
        MemPlan *m = pass_memplan(md->g, &d);
        check_best_fit(md->g, m);
        pass_memplan_free(m);
        fe_model_free(md);
    }
}

/* The best fit's work per temp barely grows with depth: the spans its
 * queries merge per temp at L=16 are within 1.3x of those at L=8, and under
 * 25 (12.6 and 15.6 with the blocks; without them, a stack of saved
 * activations walked span by span, 34.4 and 49.1: 1.43x per doubling). */
static void test_fit_spans_flat(void **state)
{
    (void)state;
    double per[2];
    for (int k = 0; k < 2; k++) {
        const char *set[1] = {k ? "L=16" : "L=8"};
        Model *md = load_model("models/llama.lua", set, 1);
        PassOpts po;
        pass_opts_default(&po);
        Diag d = {{0}};
        if (!pass_pipeline(md->g, &po, NULL, NULL, NULL, &d))
            fail_msg("llama %s: %s", set[0], d.msg);
        MemPlan *m = pass_memplan(md->g, &d);
        bool *mat = pass_fuse_materialised(md->g);
        int temps = 0;
        for (int t = 0; t < md->g->t.n; t++)
            temps += m->root[t] == t && !m->persistent[t] && mat[t];
        per[k] = (double)m->fit_spans / temps;
        fprintf(stderr, "llama %s: %d temps, %.2f spans merged per temp\n", set[0], temps, per[k]);
        free(mat);
        pass_memplan_free(m);
        fe_model_free(md);
    }
    assert_true(per[0] > 0);
    assert_true(per[1] <= 1.3 * per[0] && per[1] < 25);
}

/* A large random set of lifetimes: 4000 elementwise ops over 8 sizes (64
 * B to 8 KiB), each reading one or two earlier results of its size, most
 * recent, some far back (long lives that many later temps meet), and 40
 * results kept to the end. The plan must be valid (no two live temps share
 * bytes, the timeline adds up) and be the plain best fit (so its arena is
 * what the placement was before its overlap index changed). */
static void test_random_lifetimes(void **state)
{
    (void)state;
    enum { FAM = 8, NOPS = 4000 };
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    Graph *g = ir_new();
    VEC(int) fam[FAM] = {{0}};
    for (int f = 0; f < FAM; f++) {
        int64_t d[1] = {16ll << f};
        char name[16];
        snprintf(name, sizeof name, "x%d", f);
        int x = ir_add_input(g, TK_INPUT, name, shape_make(DT_F32, 1, d), (ParamInit){0});
        vec_push(&fam[f], x);
    }
    for (int i = 0; i < NOPS; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int f = (int)(rng % FAM), nf = fam[f].n;
        int back = (rng >> 8) % 8 == 0 ? (int)((rng >> 16) % (uint64_t)nf) : (int)((rng >> 16) % 3);
        int a = fam[f].v[nf - 1 - (back < nf ? back : nf - 1)];
        int b = fam[f].v[nf - 1];
        int t;
        switch ((rng >> 32) % 4) {
        case 0: t = op1(g, OP_EXP, a); break;
        case 1: t = op1(g, OP_NEG, a); break;
        case 2: t = op2(g, OP_ADD, a, b); break;
        default: t = op2(g, OP_MUL, a, b); break;
        }
        vec_push(&fam[f], t);
        if (i % 100 == 99) {
            char name[16];
            snprintf(name, sizeof name, "y%d", i);
            ir_add_output(g, name, t);
        }
    }
    Diag dg = {{0}};
    MemPlan *m = pass_memplan(g, &dg);
    int64_t sum = 0;
    for (int t = 0; t < g->t.n; t++)
        if (g->t.v[t].op >= 0)
            sum += al(m->bytes[t]);
    fprintf(stderr, "random lifetimes: %d ops, peak live %lld, arena %lld (temps %lld)\n",
            g->ops.n, (long long)m->peak_live, (long long)m->arena_bytes, (long long)sum);
    assert_true(m->arena_bytes - m->persistent_bytes < sum / 4); /* temps share bytes */
    check_invariants(g, m);
    pass_memplan_free(m);
    for (int f = 0; f < FAM; f++)
        vec_free(&fam[f]);
    ir_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_lifetimes),
        cmocka_unit_test(test_deep),
        cmocka_unit_test(test_fit_spans_flat),
        cmocka_unit_test(test_hand_example),
        cmocka_unit_test(test_views_and_inplace),
        cmocka_unit_test(test_schedule_sinks),
        cmocka_unit_test(test_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
