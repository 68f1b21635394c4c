/* test_remat.c - the remat pass: every policy gives bit-identical steps on
 * the CPU backend for every model; budgets are honoured by the arena the
 * runtime allocates (equal to the planned peak); auto is never worse than
 * the fixed policies that fit; the heuristic is within 5% of the exact
 * solver; dropout (random ops) is never recomputed and gradients match;
 * an infeasible budget names a budget that is in fact feasible. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "passes.h"
#include "runtime.h"

static void opts_for(const Model *m, PassOpts *po)
{
    pass_opts_default(po);
    po->beta1 = m->train.beta1;
    po->beta2 = m->train.beta2;
    po->eps = m->train.eps;
    po->weight_decay = m->train.weight_decay;
    po->grad_clip = m->train.grad_clip;
}

/* Compiles already done in this process, by (model graph text and train
 * settings, policy, budget): several tests compile the same point (the pass is deterministic,
 * so a memoised result is the result). */
typedef struct {
    uint64_t key;
    int policy;
    int64_t budget;
    Graph *g; /* NULL: the compile failed with d */
    RematReport rr;
    Diag d;
} Memo;
static Memo memo[64];
static int nmemo;

static Graph *compile_uncached(const Model *m, int policy, int64_t budget, RematReport *rr,
                               Diag *d);

/* The full pipeline with a policy and budget; NULL with d set on failure. */
static Graph *compile(const Model *m, int policy, int64_t budget, RematReport *rr, Diag *d)
{
    char *txt = ir_print_str(m->g);
    uint64_t key = hash_bytes(txt, strlen(txt), 7);
    free(txt);
    double tr[] = {m->train.beta1, m->train.beta2, m->train.eps, m->train.weight_decay,
                   m->train.grad_clip};
    key = hash_bytes(tr, sizeof tr, key);
    for (int i = 0; i < nmemo; i++) {
        Memo *e = &memo[i];
        if (e->key == key && e->policy == policy && e->budget == budget) {
            if (rr)
                *rr = e->rr;
            *d = e->d;
            return e->g ? ir_clone(e->g) : NULL;
        }
    }
    RematReport r;
    Graph *g = compile_uncached(m, policy, budget, &r, d);
    if (rr)
        *rr = r;
    if (nmemo < (int)(sizeof memo / sizeof memo[0]))
        memo[nmemo++] = (Memo){key, policy, budget, g ? ir_clone(g) : NULL, r, *d};
    return g;
}

static Graph *compile_uncached(const Model *m, int policy, int64_t budget, RematReport *rr,
                               Diag *d)
{
    PassOpts po;
    opts_for(m, &po);
    po.remat = policy;
    po.memory_budget = budget;
    po.remat_report = rr;
    Graph *g = ir_clone(m->g);
    if (!pass_pipeline(g, &po, NULL, NULL, NULL, d)) {
        ir_free(g);
        return NULL;
    }
    return g;
}

static Graph *compile_ok(const Model *m, int policy, int64_t budget, RematReport *rr)
{
    Diag d = {{0}};
    Graph *g = compile(m, policy, budget, rr, &d);
    if (!g)
        fail_msg("compile (policy %s, budget %lld): %s", pass_remat_policy_name(policy),
                 (long long)budget, d.msg);
    return g;
}

static int64_t arena_of(const Graph *g)
{
    Diag d = {{0}};
    MemPlan *mp = pass_memplan(g, &d);
    assert_non_null(mp);
    int64_t a = mp->arena_bytes;
    pass_memplan_free(mp);
    return a;
}

static int count_recompute(const Graph *g)
{
    int n = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].flags & OPF_RECOMPUTE) {
            n++;
            OpClass c = ir_opinfo[g->ops.v[i].code].cls;
            assert_true(c != OC_RANDOM && c != OC_COLLECTIVE);
        }
    return n;
}

/* ---- running a step on the CPU backend -------------------------------------- */

static uint64_t rng;
static double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

/* Host data per graph input by name: the same bytes for every graph built
 * from one model. Integer inputs are 0 or 1 (valid tokens, labels, digits). */
static void *input_data(const Tensor *x, uint64_t seed)
{
    int64_t n = shape_numel(&x->s);
    void *p = xcalloc((size_t)(n ? n : 1), (size_t)dtype_size(x->s.dtype));
    rng = seed ^ hash_bytes(x->name, strlen(x->name), 1);
    for (int64_t i = 0; i < n; i++) {
        switch (x->s.dtype) {
        case DT_F32:
            ((float *)p)[i] = x->kind == TK_PARAM   ? (float)(0.2 * (2 * urand() - 1))
                              : x->kind == TK_STATE ? 0.0f
                              : strcmp(x->name, "lr") == 0 ? 1e-2f
                                                            : (float)urand();
            break;
        case DT_I32: ((int32_t *)p)[i] = urand() < 0.5; break;
        case DT_U8: ((uint8_t *)p)[i] = urand() < 0.5; break;
        default: fail_msg("input %s: dtype %s", x->name, dtype_name(x->s.dtype));
        }
    }
    return p;
}

typedef struct {
    int n;
    char **name; /* "out:loss", "param:wte", ... */
    void **data;
    int64_t *bytes;
} Snapshot;

static void snap_add(Snapshot *s, const char *name, Exec *e, const Tensor *x)
{
    int64_t b = shape_bytes(&x->s);
    s->name = xrealloc(s->name, sizeof(char *) * (size_t)(s->n + 1));
    s->data = xrealloc(s->data, sizeof(void *) * (size_t)(s->n + 1));
    s->bytes = xrealloc(s->bytes, sizeof(int64_t) * (size_t)(s->n + 1));
    s->name[s->n] = xstrdup(name);
    s->data[s->n] = xmalloc((size_t)(b ? b : 1));
    s->bytes[s->n] = b;
    rt_exec_read(e, x->id, s->data[s->n]);
    s->n++;
}

/* Two steps of g on the CPU backend; snapshot of every output (after each
 * step) and every param and state tensor at the end. Checks that the arena
 * the runtime allocates equals the planned peak. */
static Snapshot run_steps(const Graph *g)
{
    Diag d = {{0}};
    ExecOpts eo = {.threads = 1};
    Exec *e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("rt_exec_create: %s", d.msg);
    assert_int_equal(rt_exec_arena_bytes(e), arena_of(g));
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        void *p = input_data(x, 11);
        rt_exec_write(e, t, p);
        free(p);
    }
    Snapshot s = {0};
    char nm[256];
    for (int step = 0; step < 2; step++) {
        if (!rt_exec_run(e, 5, step, &d))
            fail_msg("rt_exec_run: %s", d.msg);
        for (int k = 0; k < g->outs.n; k++) {
            snprintf(nm, sizeof nm, "step%d:out:%s", step, g->outs.v[k].name);
            snap_add(&s, nm, e, &g->t.v[g->outs.v[k].t]);
        }
    }
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->kind == TK_PARAM || x->kind == TK_STATE) {
            snprintf(nm, sizeof nm, "end:%s", x->name);
            snap_add(&s, nm, e, x);
        }
    }
    rt_exec_destroy(e);
    return s;
}

static void snap_free(Snapshot *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->name[i]);
        free(s->data[i]);
    }
    free(s->name);
    free(s->data);
    free(s->bytes);
}

/* Same names and bit-identical bytes for every tensor (the C printer's
 * reductions sum in an order fixed by the element count alone, so neither
 * recomputation nor the fusion around it may change a bit); on a mismatch
 * the message names the tensor and its relative error. */
static void expect_same(const char *what, const Snapshot *a, const Snapshot *b)
{
    if (a->n != b->n) {
        for (int i = 0; i < a->n || i < b->n; i++)
            fprintf(stderr, "  %-40s %s\n", i < a->n ? a->name[i] : "", i < b->n ? b->name[i] : "");
        fail_msg("%s: %d values checked, %d in the run without remat", what, a->n, b->n);
    }
    for (int i = 0; i < a->n; i++) {
        int j = -1;
        for (int k = 0; k < b->n; k++)
            if (strcmp(a->name[i], b->name[k]) == 0)
                j = k;
        if (j < 0)
            fail_msg("%s: %s missing", what, a->name[i]);
        assert_int_equal(a->bytes[i], b->bytes[j]);
        if (memcmp(a->data[i], b->data[j], (size_t)a->bytes[i]) != 0) {
            /* every snapshot tensor of the models is f32 */
            const float *x = a->data[i], *y = b->data[j];
            double num = 0, den = 0;
            for (int64_t k = 0; k < a->bytes[i] / 4; k++) {
                num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
                den += (double)y[k] * y[k];
            }
            fail_msg("%s: %s is not bit-identical to the run without remat (relative error %g)",
                     what, a->name[i], den > 0 ? sqrt(num / den) : INFINITY);
        }
    }
    fprintf(stderr, "%s: %d of %d values bit-identical\n", what, a->n, a->n);
}

/* ---- tests ---------------------------------------------------------------------- */

/* Every model, every fixed policy and auto at a budget halfway between the
 * smallest plan and no recompute (at the no-recompute peak where the two
 * meet): two training steps on the CPU backend bit-identical to the run
 * without remat (outputs incl. loss and gradients, params, optimizer
 * state). */
static void test_same_numbers(void **state)
{
    (void)state;
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++) {
        const char *path = *pp;
        Model *m = load_model(path, NULL, 0);
        Graph *g0 = compile_ok(m, REMAT_NONE, 0, NULL);
        assert_int_equal(count_recompute(g0), 0);
        Snapshot ref = run_steps(g0);
        int64_t peak0 = arena_of(g0);
        int64_t smallest = peak0;
        const int pol[] = {REMAT_FULL, REMAT_SELECTIVE};
        for (int k = 0; k < 2; k++) {
            RematReport rr;
            Graph *g = compile_ok(m, pol[k], 0, &rr);
            /* fuse may clone cheap recompute ops per consumer: not equal */
            assert_true(rr.nrecompute_ops > 0 || pol[k] == REMAT_SELECTIVE);
            assert_true(count_recompute(g) >= (rr.nrecompute_ops > 0));
            int64_t a = arena_of(g);
            if (a < smallest)
                smallest = a;
            Snapshot s = run_steps(g);
            char what[600];
            snprintf(what, sizeof what, "%s --remat=%s", path, pass_remat_policy_name(pol[k]));
            expect_same(what, &s, &ref);
            snap_free(&s);
            ir_free(g);
        }
        RematReport rr;
        int64_t budget = smallest + (peak0 - smallest) / 2;
        {
            Graph *g = compile_ok(m, REMAT_DEFAULT, budget, &rr);
            assert_true(arena_of(g) <= budget);
            Snapshot s = run_steps(g);
            char what[600];
            snprintf(what, sizeof what, "%s auto at %lld bytes", path, (long long)budget);
            expect_same(what, &s, &ref);
            snap_free(&s);
            ir_free(g);
        }
        fprintf(stderr, "%s: same numbers with every policy (peak %lld, smallest %lld)\n", path,
                (long long)peak0, (long long)smallest);
        snap_free(&ref);
        ir_free(g0);
        fe_model_free(m);
    }
    free_model_paths(paths);
}

/* gpt.lua tiny and a mid config: for a sweep of budgets from the smallest
 * feasible to the no-recompute peak, the final plan fits; the arena the CPU
 * runtime allocates equals it; and auto's extra FLOPs are no more than the
 * best fixed policy that fits the same budget. Somewhere auto finds a point
 * no fixed policy offers. */
static void sweep_model(const char *const *sets, int nsets, int npoints)
{
    Model *m = load_model("models/gpt.lua", sets, nsets);
    const int pol[] = {REMAT_NONE, REMAT_SELECTIVE, REMAT_FULL};
    int64_t fpeak[3];
    double fflops[3];
    for (int k = 0; k < 3; k++) {
        RematReport rr;
        Graph *g = compile_ok(m, pol[k], 0, &rr);
        fpeak[k] = arena_of(g);
        fflops[k] = pass_remat_flops(g);
        ir_free(g);
    }
    /* both recompute policies plan less than none; full is not always below
     * selective (gpt tiny: selective 1461056 bytes, full 1478464, since
     * slice backward stopped padding q, k and v's gradients to [B,T,3C]) */
    assert_true(fpeak[1] < fpeak[0] && fpeak[2] < fpeak[0]);
    assert_true(fflops[0] == 0 && fflops[1] > 0 && fflops[2] > fflops[1]);
    /* the smallest feasible budget, from the infeasible-budget error */
    Diag d = {{0}};
    RematReport rr;
    Graph *bad = compile(m, REMAT_DEFAULT, 4096, &rr, &d);
    assert_null(bad);
    const char *p = strstr(d.msg, "smallest feasible budget kiln found is ");
    assert_non_null(p);
    p = strchr(p, '(');
    assert_non_null(p);
    int64_t smallest = strtoll(p + 1, NULL, 10);
    assert_true(smallest > 0 && smallest <= fpeak[1] && smallest <= fpeak[2]);
    int novel = 0;
    for (int i = 0; i < npoints; i++) {
        int64_t budget = smallest + (fpeak[0] - smallest) * i / (npoints - 1);
        Graph *g = compile_ok(m, REMAT_DEFAULT, budget, &rr);
        int64_t a = arena_of(g);
        assert_true(a <= budget);
        assert_int_equal(a, rr.peak >= 0 ? rr.peak : a);
        double extra = pass_remat_flops(g);
        double best_fixed = INFINITY;
        for (int k = 0; k < 3; k++)
            if (fpeak[k] <= budget && fflops[k] < best_fixed)
                best_fixed = fflops[k];
        fprintf(stderr, "budget %lld: auto peak %lld extra %.4g FLOP (%s); best fixed %.4g\n",
                (long long)budget, (long long)a, extra, pass_remat_policy_name(rr.chosen),
                best_fixed);
        assert_true(extra <= best_fixed * (1 + 1e-12));
        if (extra < best_fixed)
            novel++;
        if (i == npoints / 2) { /* compiling for the runtime costs seconds: one point */
            ExecOpts eo = {.threads = 1};
            Exec *e = rt_exec_create(g, &eo, &d);
            if (!e)
                fail_msg("rt_exec_create: %s", d.msg);
            assert_int_equal(rt_exec_arena_bytes(e), a);
            assert_true(rt_exec_arena_bytes(e) <= budget);
            rt_exec_destroy(e);
        }
        ir_free(g);
    }
    assert_true(novel > 0);
    fe_model_free(m);
}

static void test_budget_sweep_tiny(void **state)
{
    (void)state;
    sweep_model(NULL, 0, 5);
}

static void test_budget_sweep_mid(void **state)
{
    (void)state;
    const char *sets[] = {"L=4", "C=64", "H=4", "T=64", "batch=8"};
    sweep_model(sets, 5, 5);
}

/* The heuristic's cost is within 5% of the exact integer program's on
 * graphs small enough to solve exactly, at kept-bytes limits across the
 * whole range. */
static void test_heuristic_gap(void **state)
{
    (void)state;
    const char *models[] = {"models/gpt.lua", "models/mlp.lua", "models/llama.lua"};
    int checked = 0;
    for (int k = 0; k < 3; k++) {
        Model *m = load_model(models[k], NULL, 0);
        PassOpts po;
        opts_for(m, &po);
        Diag d = {{0}};
        Graph *g = ir_clone(m->g);
        if (!pass_pipeline(g, &po, "simplify", NULL, NULL, &d))
            fail_msg("%s: %s", models[k], d.msg);
        int64_t saved = pass_remat_saved_bytes(g);
        assert_true(saved > 0);
        /* limits from the least memory the heuristic reaches to keeping all */
        double c0;
        int64_t least;
        bool ex0;
        pass_remat_solve(g, 0, REMAT_SOLVER_HEURISTIC, &c0, &least, &ex0);
        if (least >= saved) { /* nothing to trade (mlp: everything is in the tail) */
            ir_free(g);
            fe_model_free(m);
            continue;
        }
        /* denser near the least memory, where the exact program is hardest
         * and the heuristic most likely to be off */
        const int at[] = {0, 1, 2, 4, 6, 9};
        for (int ii = 0; ii < 6; ii++) {
            int i = at[ii];
            int64_t limit = least + (int64_t)((double)(saved - least) * (i * i) / 100.0);
            double ce, ch;
            int64_t ke, kh;
            bool ex;
            bool fe = pass_remat_solve(g, limit, REMAT_SOLVER_EXACT, &ce, &ke, &ex);
            bool fh = pass_remat_solve(g, limit, REMAT_SOLVER_HEURISTIC, &ch, &kh, &ex);
            if (!fe) {
                assert_false(fh);
                continue;
            }
            assert_true(ke <= limit);
            if (!fh)
                fail_msg("%s: limit %lld: heuristic found nothing, exact cost %g", models[k],
                         (long long)limit, ce);
            assert_true(kh <= limit);
            assert_true(ch >= ce * (1 - 1e-9)); /* exact is a lower bound */
            fprintf(stderr, "%s limit at %d%% of the range: exact %.6g s, heuristic %.6g s (+%.2f%%)\n",
                    models[k], i * i, ce, ch, ce > 0 ? 100 * (ch - ce) / ce : 0.0);
            if (ch > ce * 1.05 + 1e-12)
                fail_msg("%s: limit %lld: heuristic %g more than 5%% above exact %g", models[k],
                         (long long)limit, ch, ce);
            checked++;
        }
        ir_free(g);
        fe_model_free(m);
    }
    assert_true(checked >= 12);
}

/* gpt with dropout under the tightest budget: no random op is recomputed,
 * and the gradients (and the step) are bit-identical to no remat. */
static void test_dropout(void **state)
{
    (void)state;
    const char *sets[] = {"dropout=0.2"};
    Model *m = load_model("models/gpt.lua", sets, 1);
    Graph *g0 = compile_ok(m, REMAT_NONE, 0, NULL);
    int nrandom = 0;
    for (int i = 0; i < g0->ops.n; i++)
        nrandom += g0->ops.v[i].code == OP_RANDOM;
    assert_true(nrandom > 0);
    Diag d = {{0}};
    RematReport rr;
    assert_null(compile(m, REMAT_DEFAULT, 4096, &rr, &d));
    const char *p = strchr(strstr(d.msg, "smallest feasible budget"), '(');
    int64_t tight = strtoll(p + 1, NULL, 10);
    Graph *g = compile_ok(m, REMAT_DEFAULT, tight, &rr);
    assert_true(arena_of(g) <= tight);
    assert_true(count_recompute(g) > 0); /* also checks: no random op recomputed */
    int nrandom2 = 0;
    for (int i = 0; i < g->ops.n; i++)
        nrandom2 += g->ops.v[i].code == OP_RANDOM;
    assert_int_equal(nrandom2, nrandom);
    Snapshot a = run_steps(g0), b = run_steps(g);
    expect_same("dropout, tight budget", &b, &a);
    snap_free(&a);
    snap_free(&b);
    ir_free(g);
    ir_free(g0);
    fe_model_free(m);
}

/* An infeasible budget is an error naming the smallest feasible budget
 * found, and that budget compiles; a fixed policy that does not fit is an
 * error too. */
static void test_infeasible(void **state)
{
    (void)state;
    Model *m = load_model("models/gpt.lua", NULL, 0);
    Diag d = {{0}};
    RematReport rr;
    assert_null(compile(m, REMAT_DEFAULT, 1 << 20, &rr, &d));
    assert_non_null(strstr(d.msg, "memory budget 1.00 MiB (1048576 bytes) is infeasible"));
    const char *p = strstr(d.msg, "smallest feasible budget kiln found is ");
    assert_non_null(p);
    int64_t smallest = strtoll(strchr(p, '(') + 1, NULL, 10);
    assert_true(smallest > (1 << 20));
    Graph *g = compile_ok(m, REMAT_DEFAULT, smallest, &rr);
    assert_true(arena_of(g) <= smallest);
    ir_free(g);
    /* one byte less than the smallest plan of --remat=full */
    g = compile_ok(m, REMAT_FULL, 0, NULL);
    int64_t full = arena_of(g);
    ir_free(g);
    assert_null(compile(m, REMAT_NONE, full, &rr, &d));
    assert_non_null(strstr(d.msg, "infeasible with --remat=none"));
    g = compile_ok(m, REMAT_FULL, full, &rr);
    assert_int_equal(arena_of(g), full);
    ir_free(g);
    fe_model_free(m);
}

/* Recomputed ops print as !recompute and the text parses back. */
static void test_dump(void **state)
{
    (void)state;
    Model *m = load_model("models/gpt.lua", NULL, 0);
    Graph *g = compile_ok(m, REMAT_FULL, 0, NULL);
    char *txt = ir_print_str(g);
    assert_non_null(strstr(txt, " !recompute"));
    char err[1024];
    Graph *h = ir_parse(txt, "dump", err, sizeof err);
    if (!h)
        fail_msg("parse: %s", err);
    assert_int_equal(count_recompute(h), count_recompute(g));
    char *txt2 = ir_print_str(h);
    assert_string_equal(txt, txt2);
    free(txt);
    free(txt2);
    ir_free(h);
    ir_free(g);
    fe_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dump),
        cmocka_unit_test(test_infeasible),
        cmocka_unit_test(test_heuristic_gap),
        cmocka_unit_test(test_budget_sweep_tiny),
        cmocka_unit_test(test_budget_sweep_mid),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_same_numbers),
    };
    /* KILN_TEST_FILTER=NAME runs only the tests whose name contains NAME */
    const char *only = getenv("KILN_TEST_FILTER");
    if (only)
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
