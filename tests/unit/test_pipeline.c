/* test_pipeline.c - the whole compiler front half on every model in models/:
 * print -> parse -> print is identical after the frontend and after every
 * pass; and the training step of gpt.lua (tiny), evaluated by the reference
 * interpreter, lowers the loss over 20 AdamW steps on a fixed batch; an
 * invalid graph is written as a bug report that kiln opt replays; the
 * pipeline split (pass_stage_split) of a tp 2, sequence-parallel llama
 * stage leaves every weight-gradient matmul to W. */
#include "testutil.h"

#include <math.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend.h"
#include "passes.h"

static void check_round_trip(const char *what, const Graph *g)
{
    char err[1024];
    char *p1 = ir_print_str(g);
    Graph *g2 = ir_parse(p1, what, err, sizeof err);
    if (!g2)
        fail_msg("%s: the printed IR does not parse back: %s", what, err);
    char *p2 = ir_print_str(g2);
    if (strcmp(p1, p2) != 0) {
        size_t i = 0;
        while (p1[i] && p1[i] == p2[i])
            i++;
        fail_msg("%s: print -> parse -> print differs at byte %zu:\n%.200s\n---\n%.200s", what,
                 i, p1 + (i > 80 ? i - 80 : 0), p2 + (i > 80 ? i - 80 : 0));
    }
    free(p1);
    free(p2);
    ir_free(g2);
}

static int npasses_seen;
static void round_trip_hook(const char *pass, const Graph *g, double seconds, void *ctx)
{
    (void)seconds;
    char what[256];
    snprintf(what, sizeof what, "%s after %s", (const char *)ctx, pass);
    check_round_trip(what, g);
    npasses_seen++;
}

static void round_trip_model(const char *path, const char *const *sets, int nsets)
{
    Model *m = load_model(path, sets, nsets);
    char what[256];
    snprintf(what, sizeof what, "%s after frontend", path);
    check_round_trip(what, m->g);
    PassOpts o;
    pass_opts_default(&o);
    Diag d;
    Graph *g = ir_clone(m->g);
    npasses_seen = 0;
    if (!pass_pipeline(g, &o, NULL, round_trip_hook, (void *)path, &d))
        fail_msg("%s: %s", path, d.msg);
    assert_int_equal(npasses_seen, pass_count);
    ir_free(g);
    fe_model_free(m);
}

static void test_round_trip_every_model(void **state)
{
    (void)state;
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++)
        round_trip_model(*pp, NULL, 0);
    free_model_paths(paths);
}

static void test_round_trip_gpt2_124m(void **state)
{
    (void)state;
    const char *sets[] = {"size=124M"};
    round_trip_model("models/gpt.lua", sets, 1);
}

/* Deterministic normal numbers (Box-Muller over a 64-bit LCG). */
static uint64_t rng = 99;
static double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double nrand(void) { return sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()); }

static void fill_init(const Tensor *t, double *v)
{
    int64_t n = shape_numel(&t->s);
    for (int64_t i = 0; i < n; i++) {
        switch (t->init.kind) {
        case INIT_ONES: v[i] = 1; break;
        case INIT_NORMAL: v[i] = t->init.a * nrand(); break;
        case INIT_UNIFORM: v[i] = t->init.a + (t->init.b - t->init.a) * urand(); break;
        default: v[i] = 0; break;
        }
    }
}

static void test_gpt_tiny_trains_under_interpreter(void **state)
{
    (void)state;
    Model *m = load_model("models/gpt.lua", NULL, 0);
    Graph *g = ir_clone(m->g);
    PassOpts o;
    pass_opts_default(&o);
    o.weight_decay = 0;
    Diag d;
    if (!pass_pipeline(g, &o, NULL, NULL, NULL, &d))
        fail_msg("%s", d.msg);
    double **val = ir_interp_alloc(g);
    int loss = ir_find_output(g, "loss");
    assert_true(loss >= 0);
    int64_t V = 0;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op >= 0)
            continue;
        int64_t n = shape_numel(&t->s);
        val[i] = xcalloc((size_t)n, sizeof(double));
        if (t->kind == TK_PARAM || t->kind == TK_STATE)
            fill_init(t, val[i]);
        if (t->kind == TK_PARAM && strcmp(t->name, "wte.weight") == 0)
            V = t->s.dim[0];
    }
    assert_true(V > 0);
    /* a fixed batch: a repeating pattern the model can learn */
    int tok = ir_find_tensor(g, "tokens"), tgt = ir_find_tensor(g, "targets");
    int lr = ir_find_tensor(g, "lr");
    assert_true(tok >= 0 && tgt >= 0 && lr >= 0);
    int64_t n = shape_numel(&g->t.v[tok].s);
    for (int64_t i = 0; i < n; i++) {
        val[tok][i] = (double)((i * 7) % 13);
        val[tgt][i] = (double)(((i + 1) * 7) % 13);
    }
    val[lr][0] = 1e-2;
    InterpOpts io = {.seed = 1, .step = 0};
    double first = 0, last = 0;
    for (int step = 0; step < 20; step++) {
        io.step = step;
        ir_interp(g, val, &io);
        double l = val[loss][0];
        assert_true(isfinite(l));
        if (step == 0)
            first = l;
        last = l;
        ir_interp_apply_updates(g, val);
    }
    print_message("gpt tiny, interpreter: loss %.4f -> %.4f over 20 steps\n", first, last);
    /* initial loss is near ln(V); 20 steps on one batch must cut it by half */
    assert_true(fabs(first - log((double)V)) < 0.5);
    assert_true(last < 0.5 * first);
    ir_interp_free(g, val);
    ir_free(g);
    fe_model_free(m);
}

/* A graph the verifier rejects stops the pipeline with "internal error",
 * the pass (here: the frontend's graph) and where its IR was written: into
 * the dump directory when there is one, else nowhere (issue 38: never a
 * file the user did not ask for, such as one under $TMPDIR). */
static void test_invalid_graph_written(void **state)
{
    (void)state;
    char *dir = scratch_dir("invalid");
    const char *tmp0 = getenv("TMPDIR");
    char *saved = tmp0 ? strdup(tmp0) : NULL;
    for (int with_dir = 1; with_dir >= 0; with_dir--) {
        Graph *g = parse_or_fail("kiln-ir v1\n"
                                 "%0:f32[4] = param \"w\" zeros\n"
                                 "%1:f32[4] = exp %0\n"
                                 "%2:f32[1] = reduce_sum %1 {axes=[0]}\n"
                                 "%3:f32[] = reshape %2\n"
                                 "output \"loss\" %3\n");
        g->t.v[1].s.dim[0] = 5; /* exp's result no longer matches its operand */
        PassOpts o;
        pass_opts_default(&o);
        if (with_dir)
            o.dump_dir = dir;
        else
            setenv("TMPDIR", dir, 1);
        Diag d = {{0}};
        assert_false(pass_pipeline(g, &o, NULL, NULL, NULL, &d));
        assert_non_null(strstr(d.msg, "internal error: the frontend's graph is invalid: "));
        const char *at = strstr(d.msg, "(its IR is in ");
        if (!with_dir) {
            /* nothing written: the message says how to keep it */
            if (at)
                fail_msg("an IR file was written without a dump directory: %s", d.msg);
            assert_non_null(strstr(d.msg, "--dump-dir DIR writes "
                                          "DIR/invalid-after-frontend.ir)"));
            DIR *dd = opendir(dir);
            assert_non_null(dd);
            for (struct dirent *e; (e = readdir(dd));)
                if (e->d_name[0] != '.')
                    fail_msg("%s left behind in $TMPDIR", e->d_name);
            closedir(dd);
            ir_free(g);
            continue;
        }
        if (!at)
            fail_msg("no IR path in: %s", d.msg);
        char path[1024];
        snprintf(path, sizeof path, "%s", at + strlen("(its IR is in "));
        path[strlen(path) - 1] = 0; /* the closing parenthesis */
        assert_int_equal(strncmp(path, dir, strlen(dir)), 0);
        assert_non_null(strstr(path, "/invalid-after-frontend.ir"));
        char *text = read_file(path);
        assert_non_null(text);
        assert_non_null(strstr(text, "kiln-ir v2\n"));
        assert_non_null(strstr(text, "%1:f32[5] = exp %0"));
        free(text);
        unlink(path);
        ir_free(g);
    }
    if (saved)
        setenv("TMPDIR", saved, 1);
    else
        unsetenv("TMPDIR");
    free(saved);
    rmdir(dir);
    free(dir);
}

/* A pass that leaves the graph invalid (a stand-in for a bug in a pass). */
static bool break_graph(Graph *g, const PassOpts *o, Diag *d)
{
    (void)o;
    (void)d;
    g->t.v[g->t.n - 1].s.dim[0] += 1;
    return true;
}

/* The invalid-after-PASS.ir file is a bug report that replays: it opens
 * with the complaint, the pass options as kiln opt flags and the command
 * that replays the pass; those flags, given to `kiln opt`, reproduce the
 * options: comm run in process with them and comm run by kiln opt with the
 * flags print the same dump. */
static void test_invalid_report_replays(void **state)
{
    (void)state;
    const char *kiln = getenv("KILN_BIN");
    if (!kiln)
        skip();
    char *dir = scratch_dir("report");
    static const char in[] = "kiln-ir v1\n"
                             "%0:f32[4] = param \"a\" zeros\n"
                             "%1:f32[4] = param \"b\" zeros\n"
                             "%2:f32[4] = input \"x\"\n"
                             "%3:f32[4] = mul %2, %1 !backward\n"
                             "%4:f32[4] = exp %2 !backward\n"
                             "%5:f32[4] = mul %4, %0 !backward\n"
                             "%6:f32[4] = sub %1, %3 !optim\n"
                             "%7:f32[4] = sub %0, %5 !optim\n"
                             "output \"grad.b\" %3\n"
                             "output \"grad.a\" %5\n"
                             "update %1 <- %6\n"
                             "update %0 <- %7\n";
    PassOpts o;
    pass_opts_default(&o);
    o.nranks = 3;
    o.bucket_bytes = 16;
    o.no_overlap = true;
    o.grad_accum = 2;
    o.weight_decay = 0.25;
    o.remat = REMAT_SELECTIVE;
    o.memory_budget = 1 << 20;
    o.dump_dir = dir;
    /* the report */
    const Pass breaker = {"breaker", break_graph};
    const Pass *list[] = {pass_find("comm"), &breaker};
    Graph *g = parse_or_fail(in);
    Diag d = {{0}};
    assert_false(pass_run(g, list, 2, &o, NULL, NULL, &d));
    assert_non_null(strstr(d.msg, "internal error: the graph is invalid after pass breaker: "));
    char *path = xasprintf("%s/invalid-after-breaker.ir", dir);
    char *text = read_file(path);
    assert_non_null(text);
    assert_non_null(strstr(text, "# kiln: the graph is invalid after breaker: "));
    const char *flags = strstr(text, "\n# pass options: ");
    assert_non_null(flags);
    flags += strlen("\n# pass options: ");
    char opts[1024];
    snprintf(opts, sizeof opts, "%.*s", (int)(strchr(flags, '\n') - flags), flags);
    char *replay = xasprintf("# replay: kiln opt BEFORE.ir --passes=breaker %s\n", opts);
    assert_non_null(strstr(text, replay));
    assert_non_null(strstr(text, "kiln compile MODEL --dump-after=comm"));
    assert_non_null(strstr(text, "\nkiln-ir v2\n"));
    /* the flags reproduce the options */
    Graph *h = parse_or_fail(in);
    assert_true(pass_comm(h, &o, &d));
    char *want = xasprintf("%s/want.ir", dir), *input = xasprintf("%s/in.ir", dir);
    FILE *f = fopen(want, "w");
    pass_dump("comm", h, NULL, f);
    fclose(f);
    f = fopen(input, "w");
    fputs(in, f);
    fclose(f);
    char *cmd = xasprintf("'%s' opt '%s' --passes=comm %s", kiln, input, opts);
    char *out = NULL;
    int rc = run_cmd(cmd, &out);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, out);
    char *w = read_file(want);
    if (strcmp(out, w) != 0)
        fail_msg("kiln opt with the report's flags (%s) printed\n%s\nexpected\n%s", opts, out, w);
    assert_non_null(strstr(w, "allreduce_start")); /* the options did something */
    assert_non_null(strstr(w, "\"accum.a\""));
    unlink(path);
    unlink(want);
    unlink(input);
    rmdir(dir);
    free(w);
    free(out);
    free(cmd);
    free(want);
    free(input);
    free(replay);
    free(text);
    free(path);
    free(dir);
    ir_free(h);
    ir_free(g);
}

static void test_stage_split_tp_sp(void **state)
{
    (void)state;
    const char *sets[] = {"L=4", "sequence_parallel=true"};
    Model *m = load_model("models/llama.lua", sets, 2);
    PassOpts o;
    pass_opts_default(&o);
    o.tp = 2, o.tp_rank = 0, o.sequence_parallel = true;
    Diag d;
    Graph *fwd = ir_clone(m->g);
    PassStageCut cut = {0};
    if (!pass_attention(fwd, &o, &d) || !pass_partition(fwd, &o, &d) ||
        !pass_stage_cut(fwd, 2, &cut, &d))
        fail_msg("%s", d.msg);
    Graph *full = pass_stage_graph(fwd, &cut, 1, true);
    if (!pass_autodiff(full, &o, &d))
        fail_msg("%s", d.msg);
    Graph *pr[3];
    pass_stage_split(full, true, &pr[0], &pr[1], &pr[2]);
    int nmm[3];
    for (int k = 0; k < 3; k++)
        nmm[k] = count_ops(pr[k], OP_MATMUL);
    printf("# stage 1 matmuls: F %d, B %d, W %d\n", nmm[0], nmm[1], nmm[2]);
    assert_int_equal(nmm[0], 19);
    assert_int_equal(nmm[1], 23);
    assert_int_equal(nmm[2], 15);
    for (int k = 0; k < 3; k++)
        ir_free(pr[k]);
    ir_free(full);
    pass_stage_cut_free(&cut);
    ir_free(fwd);
    fe_model_free(m);
}

/* The cut by measured time (pass_stage_pieces, pass_stage_cut_timed) and
 * the most stages (pass_stage_max) on gpt.lua at L 4: 12 stages (the two
 * embeddings, 8 half-blocks, ln_f, the head), 13 refused as kiln plan
 * refuses it. Pieces of 1 ms each but the last (the head, 6 ms): the timed
 * cut at pp 2 moves blocks to stage 0 until the stages are within a
 * piece's time of each other, where the cost model's cut leaves stage 1
 * the slower by 4 ms; each stage's cost is its measured time. */
static void test_stage_cut_timed(void **state)
{
    (void)state;
    const char *sets[] = {"L=4"};
    Model *m = load_model("models/gpt.lua", sets, 1);
    PassOpts o;
    pass_opts_default(&o);
    Diag d;
    Graph *fwd = ir_clone(m->g);
    if (!pass_attention(fwd, &o, &d))
        fail_msg("%s", d.msg);
    assert_int_equal(pass_stage_max(fwd), 12);
    PassStageCut c = {0}, pc = {0}, tc = {0};
    assert_true(pass_stage_cut(fwd, 12, &c, &d));
    pass_stage_cut_free(&c);
    assert_false(pass_stage_cut(fwd, 13, &c, &d));
    assert_non_null(strstr(d.msg, "--pp 13: more stages than layers to put in them (expected "
                                  "pp <= 12"));
    assert_true(pass_stage_pieces(fwd, &pc, &d));
    double *secs = xcalloc((size_t)pc.n + 1, sizeof(double)), total = 0;
    for (int j = 0; j < pc.n; j++) /* a piece of constants only (iota) runs nothing */
        total += secs[j] = pc.cost[j] <= 0 ? 0 : j == pc.n - 1 ? 6e-3 : 1e-3;
    assert_true(pass_stage_cut(fwd, 2, &c, &d));
    assert_true(pass_stage_cut_timed(fwd, 2, &pc, secs, secs, &tc, &d));
    double t0 = 0; /* the cost model's cut under these times */
    for (int j = 0; j < pc.n; j++)
        if (pc.first[j] < c.first[1])
            t0 += secs[j];
    printf("# %d pieces; cost-model cut at op %d: %.1f / %.1f ms; timed cut at op %d: %.1f / "
           "%.1f ms\n", pc.n, c.first[1], 1e3 * t0, 1e3 * (total - t0), tc.first[1],
           1e3 * tc.cost[0], 1e3 * tc.cost[1]);
    assert_true(total - t0 - t0 > 3e-3);
    assert_true(fabs(tc.cost[0] + tc.cost[1] - total) < 1e-9);
    assert_true(fabs(tc.cost[0] - tc.cost[1]) <= 1e-3 + 1e-9);
    assert_true(tc.first[1] > c.first[1]);
    free(secs);
    pass_stage_cut_free(&c);
    pass_stage_cut_free(&pc);
    pass_stage_cut_free(&tc);
    ir_free(fwd);
    fe_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage_split_tp_sp),
        cmocka_unit_test(test_stage_cut_timed),
        cmocka_unit_test(test_invalid_graph_written),
        cmocka_unit_test(test_invalid_report_replays),
        cmocka_unit_test(test_round_trip_every_model),
        cmocka_unit_test(test_round_trip_gpt2_124m),
        cmocka_unit_test(test_gpt_tiny_trains_under_interpreter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
