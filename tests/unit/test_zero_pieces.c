/* test_zero_pieces.c - zero=1's shard update in pieces (runtime/pieces.c).
 *
 * - the plan, per rank of 2 (mlp and gpt): the update kernel is flat over
 *   the shard; rt_pieces_plan puts this rank's part of the first
 *   all-gather bucket first, then that bucket's start, then the rest of
 *   the update, then the other starts in their order; the pieces cover
 *   the shard exactly once; the gathers keep their order (the same on
 *   both ranks); KILN_ZERO_ONE_PIECE=1 leaves the plan alone;
 * - through the binary (mpirun, mlp and gpt): in each rank's trace, every
 *   step runs the first all_gather_start before (part of) the update, and
 *   the communication thread starts the early gather buckets (gpt at
 *   bucket_mb=0.004: 3) before the loss's host all-reduce that follows the
 *   step (released at once), the other buckets after it (held, mpi.c); the
 *   losses and final params are bit for bit those of the one-kernel update
 *   (KILN_ZERO_ONE_PIECE=1). */
#include "testutil.h"

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CgPlan *step_plan(const char *model, Graph **gout)
{
    Model *m = load_model(model, NULL, 0);
    Graph *g = ir_clone(m->g);
    PassOpts o;
    rt_pass_opts(&m->train, NULL, &o);
    o.nranks = 2;
    o.zero = 1;
    o.bucket_bytes = 4096;
    Diag d = {{0}};
    if (!pass_pipeline(g, &o, NULL, NULL, NULL, &d))
        fail_msg("%s: %s", model, d.msg);
    fe_model_free(m);
    CgPlan *p = cg_plan(g, &d);
    if (!p)
        fail_msg("%s: %s", model, d.msg);
    *gout = g;
    return p;
}

/* The flat range [*b0, *b1) of all-gather start step st. */
static void gather_range(const CgPlan *p, const CgStep *st, int64_t *b0, int64_t *b1)
{
    *b0 = *b1 = st->sh_start;
    for (int a = 0; a < st->nargs; a++)
        *b1 += shape_numel(&p->g->t.v[st->args[a]].s);
}

static bool is_gather(const CgStep *st)
{
    return st->kind == CG_STEP_ALLREDUCE_START && st->coll == CG_COLL_ALL_GATHER;
}

static void check_plan(const char *model, int want_early)
{
    unsetenv("KILN_ZERO_ONE_PIECE");
    int order[2][64], nord[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        Graph *g;
        CgPlan *p = step_plan(model, &g);
        int g0 = -1, n0 = p->steps.n;
        for (int s = 0; s < p->steps.n && g0 < 0; s++)
            if (is_gather(&p->steps.v[s]))
                g0 = s;
        assert_true(g0 > 0);
        const CgStep *first = &p->steps.v[g0];
        int upk = p->steps.v[g0 - 1].kernel;
        int64_t S = shape_numel(&g->t.v[first->sh_buf].s), b0, b1, off, len;
        assert_int_equal(p->kernels.v[upk]->flat, S);
        gather_range(p, first, &b0, &b1);
        ir_shard_range(first->sh_total, 2, r, &off, &len);
        int64_t lo = (b0 > off ? b0 : off) - off, hi = (b1 < off + len ? b1 : off + len) - off;
        if (hi <= lo)
            lo = hi = 0;
        int rel = rt_pieces_plan(p, r, 2);
        assert_true(rel > 0 && is_gather(&p->steps.v[rel]));
        /* up to rel: per early bucket, this rank's part of it (if any) right
         * before its start; the first bucket's part is [lo, hi) */
        int early = 0, ngather = 0, npieces = 0;
        char *cover = calloc((size_t)S, 1);
        for (int s = g0 - 1; s <= rel; s++) {
            const CgStep *st = &p->steps.v[s];
            if (!is_gather(st))
                continue;
            int64_t c0, c1, l0, l1;
            gather_range(p, st, &c0, &c1);
            l0 = (c0 > off ? c0 : off) - off, l1 = (c1 < off + len ? c1 : off + len) - off;
            const CgStep *before = &p->steps.v[s - 1];
            if (l1 > l0) {
                assert_int_equal(before->kernel, upk);
                assert_true(before->lo == l0 && before->hi == l1);
            }
            if (early == 0 && l1 > l0)
                assert_true(l0 == lo && l1 == hi);
            early++;
        }
        /* the pieces cover [0, S) once; the rest after the early starts,
         * before the next one */
        for (int s = 0; s < p->steps.n; s++) {
            const CgStep *st = &p->steps.v[s];
            if (is_gather(st)) {
                assert_true(ngather < 64);
                order[r][ngather++] = st->bucket;
            }
            if (st->kind != CG_STEP_KERNEL || st->kernel != upk)
                continue;
            assert_true(st->hi > st->lo && st->lo >= 0 && st->hi <= S);
            npieces++;
            if (s > rel)
                assert_int_equal(ngather, early);
            for (int64_t i = st->lo; i < st->hi; i++) {
                assert_int_equal(cover[i], 0);
                cover[i] = 1;
            }
        }
        for (int64_t i = 0; i < S; i++)
            assert_int_equal(cover[i], 1);
        assert_int_equal(p->steps.n, n0 - 1 + npieces);
        assert_true(early >= want_early && early < ngather);
        nord[r] = ngather;
        print_message("%s rank %d: the first gather's part [%lld, %lld) of %lld; %d pieces, %d "
                      "gathers, the first %d released at once\n",
                      model, r, (long long)lo, (long long)hi, (long long)S, npieces, ngather,
                      early);
        free(cover);
        /* the one-kernel switch */
        cg_plan_free(p);
        p = cg_plan(g, &(Diag){{0}});
        setenv("KILN_ZERO_ONE_PIECE", "1", 1);
        assert_int_equal(rt_pieces_plan(p, r, 2), -1);
        assert_int_equal(p->steps.n, n0);
        unsetenv("KILN_ZERO_ONE_PIECE");
        cg_plan_free(p);
        ir_free(g);
    }
    /* one order of gathers on both ranks */
    assert_int_equal(nord[0], nord[1]);
    assert_true(nord[0] >= 2);
    for (int i = 0; i < nord[0]; i++)
        assert_int_equal(order[0][i], order[1][i]);
}

static void test_plan(void **state)
{
    (void)state;
    check_plan("models/mlp.lua", 1);
    check_plan("models/gpt.lua", 2); /* wte/wpe/ln_1, then h.0's c_attn for the first GEMM */
}

typedef struct {
    const char *name, *cat;
    double ts;
    int tid;
} Ev;

static int cmp_ev(const void *a, const void *b)
{
    const Ev *x = a, *y = b;
    return x->ts < y->ts ? -1 : x->ts > y->ts;
}

/* The trace's events (name and cat point into t, not terminated: compare
 * with strncmp), sorted by start. */
static int events(char *t, Ev **out)
{
    VEC(Ev) v = {0};
    for (char *q = t; (q = strstr(q, "{\"name\":\"")); q++) {
        char *end = strchr(q, '}'), *ts = strstr(q, "\"ts\":"), *tid = strstr(q, "\"tid\":");
        char *cat = strstr(q, "\"cat\":\"");
        if (!end || !ts || !tid || !cat || ts > end || tid > end || cat > end)
            continue;
        Ev e = {q + 9, cat + 7, atof(ts + 5), atoi(tid + 6)};
        vec_push(&v, e);
    }
    if (v.n)
        qsort(v.v, (size_t)v.n, sizeof(Ev), cmp_ev);
    *out = v.v;
    return v.n;
}

static bool named(const Ev *e, const char *s) { return strncmp(e->name, s, strlen(s)) == 0; }

/* One rank's trace of `steps` steps: per step, the first all_gather_start
 * runs before a kernel of the step (the update's rest), and its bucket's
 * gather starts on the communication thread before the loss's host
 * all-reduce, the step's other gather buckets after it. */
static void check_trace(const char *path, int steps, int more)
{
    char *t = read_file(path);
    if (!t)
        fail_msg("no trace %s", path);
    Ev *ev;
    int n = events(t, &ev), early = 0, ahead = 0, after = 0, released = 0;
    bool seen_start = true, seen_host = false, first = false;
    for (int i = 0; i < n; i++) {
        const Ev *e = &ev[i];
        if (named(e, "step (exec)\"")) {
            seen_start = false;
            continue;
        }
        if (e->tid == 1 && named(e, "all_gather_start\"") && !seen_start) {
            /* the step's first: a kernel of the update follows it */
            seen_start = first = true;
            seen_host = false;
            for (int j = i + 1; j < n; j++) {
                if (ev[j].tid != 1)
                    continue;
                if (strncmp(ev[j].cat, "kernel\"", 7) == 0) {
                    early++;
                    break;
                }
                if (!named(&ev[j], "all_gather_start\""))
                    break;
            }
        }
        /* the communication thread's starts (mpi.c, run_job), in its queue's
         * order: the released first buckets ahead of the loss's mean, the
         * held ones behind it */
        if (e->tid == 2 && named(e, "allreduce host\""))
            seen_host = true;
        if (e->tid == 4 && named(e, "all-gather bucket ")) {
            if (first)
                ahead += !seen_host;
            else if (seen_host)
                after++;
            else
                released++;
            first = false;
        }
    }
    print_message("%s: %d steps with the first gather started before the update's rest; "
                  "the first bucket ahead of the loss mean %d times, %d more released ahead, "
                  "%d held behind it\n",
                  path, early, ahead, released, after);
    if (early != steps)
        fail_msg("%s: the first all_gather_start runs before (part of) the update in %d of %d "
                 "steps", path, early, steps);
    if (ahead != steps)
        fail_msg("%s: the first gather bucket starts before the loss's host all-reduce in "
                 "%d of %d steps", path, ahead, steps);
    if (released != more * steps)
        fail_msg("%s: %d gather buckets released ahead of the loss's mean besides the first, "
                 "expected %d a step", path, released, more);
    assert_true(after >= steps);
    free(ev);
    free(t);
}

static void run_model(const char *dir, const char *model, const char *bucket_mb, const char *name,
                      bool one_piece)
{
    const char *bin = getenv("KILN_BIN");
    if (!bin)
        fail_msg("KILN_BIN is not set (run through ctest)");
    char *cmd = xasprintf("%s%s train %s --steps 3 -q --nproc 2 --set zero=1 --set "
                          "bucket_mb=%s --log-dir %s/%s --save-weights %s/%s.safetensors "
                          "--trace %s/%s.json",
                          one_piece ? "KILN_ZERO_ONE_PIECE=1 " : "", bin, model, bucket_mb, dir, name, dir,
                          name, dir, name);
    run_or_fail(cmd);
    free(cmd);
}

/* more: early buckets besides the first (step 5's rule, test_plan) */
static void check_model(const char *dir, const char *model, const char *bucket_mb, int more)
{
    run_model(dir, model, bucket_mb, "pieces", false);
    run_model(dir, model, bucket_mb, "one", true);
    for (int r = 0; r < 2; r++) {
        char *p = xasprintf("%s/pieces%s.json", dir, r ? ".rank1" : "");
        check_trace(p, 3, more);
        free(p);
    }
    char *a = xasprintf("%s/pieces.safetensors", dir), *b = xasprintf("%s/one.safetensors", dir);
    char *ta = read_file(a), *tb = read_file(b);
    assert_non_null(ta);
    assert_non_null(tb);
    StFile fa, fb;
    Diag d = {{0}};
    if (!rt_st_read(a, &fa, &d) || !rt_st_read(b, &fb, &d))
        fail_msg("%s", d.msg);
    assert_true(fa.n == fb.n && fa.n > 0);
    for (int i = 0; i < fa.n; i++) {
        const StTensor *y = rt_st_find(&fb, fa.t[i].name);
        assert_non_null(y);
        assert_int_equal(fa.t[i].nbytes, y->nbytes);
        if (memcmp(fa.t[i].data, y->data, (size_t)y->nbytes) != 0)
            fail_msg("%s: %s differs between the update in pieces and in one kernel", model,
                     fa.t[i].name);
    }
    int nparams = fa.n;
    rt_st_free(&fa);
    rt_st_free(&fb);
    char *ma = xasprintf("%s/pieces/metrics.jsonl", dir), *mb = xasprintf("%s/one/metrics.jsonl", dir);
    char *la = read_file(ma), *lb = read_file(mb);
    assert_non_null(la);
    assert_non_null(lb);
    const char *x = strstr(la, "\"loss\":"), *y = strstr(lb, "\"loss\":");
    int k = 0;
    for (; x && y; x = strstr(x + 7, "\"loss\":"), y = strstr(y + 7, "\"loss\":"), k++)
        assert_true(strtod(x + 7, NULL) == strtod(y + 7, NULL));
    assert_true(!x && !y && k == 3);
    print_message("%s: %d params and %d losses bit for bit those of the one-kernel update\n",
                  model, nparams, k);
    free(la);
    free(lb);
    free(ma);
    free(mb);
    free(ta);
    free(tb);
    free(a);
    free(b);
}

static void test_runs(void **state)
{
    (void)state;
    if (!have_command("mpirun")) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    char *dir = scratch_dir("zero_pieces");
    check_model(dir, "models/mlp.lua", "0.02", 0);
    check_model(dir, "models/gpt.lua", "0.004", 2); /* 3 early buckets, as in test_plan */
    remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
