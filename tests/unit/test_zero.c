/* test_zero.c - ZeRO-1 (zero=1: AdamW's state sharded over the ranks).
 *
 * - the shard geometry (ir_shard_range): contiguous, covering, aligned,
 *   lengths within one alignment unit;
 * - the sharded step on the reference interpreter with one rank (the shard
 *   is the whole range) gives the params, optimizer step and norm of the
 *   unsharded step, for mlp, gpt and llama, with and without grad_accum;
 * - remat under a budget between the two peaks recomputes with zero=0 and
 *   not with zero=1 (it plans against the smaller persistent region);
 * - the comm pass for 2 ranks: reduce-scatter buckets start where their
 *   last gradient is finished (the first before backward ends), the waits
 *   chain through one shard buffer (memplan), the params' shard_pack
 *   between the last start and the first wait, one scalar all-reduce with
 *   the other shard_pack between its start and wait, the all-gathers after the
 *   new shard; the dump parses back to the same text;
 *   the all-gathers start in the order the forward first reads their
 *   params (gpt's tied wte first);
 * - through the binary (mpirun): `--nproc 2 --set zero=1` against
 *   `--nproc 2` and 1 rank at the combined batch, per step losses and every
 *   final param within 1e-5 relative, for mlp, gpt and llama with
 *   grad_accum 1 and 2 (less gpt's key biases, whose gradient is 0, and
 *   the few elements whose first gradient is at Adam's noise floor, each
 *   named and counted: AdamNoise);
 * - checkpoints: the file of 2 sharded ranks is 1 rank's (moments too), and
 *   resumes on 1 or 2 ranks without zero; 1 rank's resumes on 2 sharded;
 * - the report line per collective and the reduce-scatter and all-gather
 *   tracks of each rank's trace, for mlp and gpt; in the trace, exactly the
 *   plan's early all-gathers (runtime/pieces.c) start ahead of each step's
 *   loss mean, the others after it. */
#include "testutil.h"

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_geometry(void **state)
{
    (void)state;
    const int64_t totals[] = {1, 15, 16, 17, 100, 1000, 17412, 124439808};
    for (size_t k = 0; k < sizeof totals / sizeof totals[0]; k++)
        for (int n = 1; n <= 9; n++) {
            int64_t T = totals[k], S = ir_shard_size(T, n), end = 0, mn = T, mx = 0;
            for (int r = 0; r < n; r++) {
                int64_t off, len;
                ir_shard_range(T, n, r, &off, &len);
                assert_int_equal(off, end); /* contiguous, in rank order */
                assert_true(len >= 0 && len <= S);
                assert_true(off % IR_SHARD_ALIGN == 0 || len == 0);
                end = off + len;
                if (r < n - 1 || T % IR_SHARD_ALIGN == 0) {
                    mn = len < mn ? len : mn;
                    mx = len > mx ? len : mx;
                }
            }
            assert_int_equal(end, T); /* covering */
            if (mx >= mn)
                assert_true(mx - mn <= IR_SHARD_ALIGN); /* balanced */
            assert_true(S * n >= T && S * n < T + (int64_t)n * IR_SHARD_ALIGN);
        }
}

/* The model's step graph through the pipeline up to `last`. */
static Graph *step_graph(const char *model, const char *const *sets, int nsets, int nranks,
                         int zero, int accum, const char *last)
{
    Model *m = load_model(model, sets, nsets);
    Graph *g = ir_clone(m->g);
    PassOpts o;
    rt_pass_opts(&m->train, NULL, &o);
    o.nranks = nranks;
    o.zero = zero;
    o.grad_accum = accum;
    o.bucket_bytes = 4096;
    Diag d = {{0}};
    if (!pass_pipeline(g, &o, last, NULL, NULL, &d))
        fail_msg("%s: %s", model, d.msg);
    fe_model_free(m);
    return g;
}

/* The value an update gives to the param or state `name`, after ir_interp. */
static const double *updated(const Graph *g, double **val, const char *name)
{
    int t = ir_find_tensor(g, name);
    assert_true(t >= 0);
    for (int k = 0; k < g->upd.n; k++)
        if (g->upd.v[k].target == t)
            return val[g->upd.v[k].value];
    fail_msg("no update of %s", name);
    return NULL;
}

static double **run_interp(const Graph *g, void **host)
{
    double **val = ir_interp_alloc(g);
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op >= 0)
            continue;
        int64_t n = shape_numel(&t->s);
        val[i] = xcalloc((size_t)n + 1, sizeof(double));
        if (t->kind == TK_INPUT && strcmp(t->name, "lr") == 0)
            val[i][0] = 1e-3;
        else if (t->kind == TK_INPUT || t->kind == TK_PARAM)
            for (int64_t e = 0; e < n; e++) {
                const void *h = host[i];
                val[i][e] = t->s.dtype == DT_F32   ? ((const float *)h)[e]
                            : t->s.dtype == DT_I32 ? ((const int32_t *)h)[e]
                                                   : 0;
            }
    }
    InterpOpts io = {1, 0};
    ir_interp(g, val, &io);
    return val;
}

/* One rank: the sharded step (through comm) is the unsharded step. Inputs
 * are the same host data by name (random_model_inputs of the plain graph). */
static void check_one_rank(const char *model, int accum)
{
    const char *sets[] = {"batch=2"};
    Graph *a = step_graph(model, sets, 1, 1, 0, accum, "comm");
    Graph *b = step_graph(model, sets, 1, 1, 1, accum, "comm");
    int rs = 0;
    for (int i = 0; i < b->ops.n; i++)
        rs += b->ops.v[i].code == OP_REDUCE_SCATTER_START;
    assert_true(rs >= 1); /* the comm pass bucketed the sharded step */
    void **ha = random_model_inputs(a);
    void **hb = xcalloc((size_t)b->t.n + 1, sizeof(void *));
    for (int i = 0; i < b->t.n; i++)
        if (b->t.v[i].op < 0 && b->t.v[i].name && (b->t.v[i].kind == TK_PARAM ||
                                                   b->t.v[i].kind == TK_INPUT)) {
            int j = ir_find_tensor(a, b->t.v[i].name);
            assert_true(j >= 0);
            hb[i] = ha[j];
        }
    double **va = run_interp(a, ha), **vb = run_interp(b, hb);
    int np = 0;
    for (int i = 0; i < a->t.n; i++) {
        const Tensor *t = &a->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        int64_t n = shape_numel(&t->s);
        double e = rel_err(updated(b, vb, t->name), updated(a, va, t->name), n);
        if (!(e < 1e-9))
            fail_msg("%s accum %d: param %s differs by %.3g", model, accum, t->name, e);
        np++;
    }
    assert_true(np > 0);
    double sa = updated(a, va, "adam.step")[0], sb = updated(b, vb, "adam.step")[0];
    assert_true(sa == 1 && sb == 1);
    int na = ir_find_output(a, "grad_norm"), nb = ir_find_output(b, "grad_norm");
    assert_true(fabs(va[na][0] - vb[nb][0]) <= 1e-9 * fabs(va[na][0]));
    ir_interp_free(a, va);
    ir_interp_free(b, vb);
    for (int i = 0; i < a->t.n; i++)
        free(ha[i]);
    free(ha);
    free(hb);
    ir_free(a);
    ir_free(b);
}

static void test_interp_one_rank(void **state)
{
    (void)state;
    const char *models[] = {"models/mlp.lua", "models/gpt.lua", "models/llama.lua"};
    for (int k = 0; k < 3; k++)
        for (int acc = 1; acc <= 2; acc++)
            check_one_rank(models[k], acc);
}

/* The index of g's last reduce_scatter_start. */
static int nrs_last(const Graph *g)
{
    int last = -1;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_REDUCE_SCATTER_START)
            last = i;
    return last;
}

/* 2 ranks, the final schedule of gpt: placement and the shard buffer. */
static void test_placement(void **state)
{
    (void)state;
    const char *sets[] = {"batch=2"};
    Graph *g = step_graph("models/gpt.lua", sets, 1, 2, 1, 1, "schedule");
    int last_bwd = -1, first_rs = -1, nrs = 0, nar = 0, nag = 0, first_ag = -1, last_rsw = -1;
    int acc = -1, ar_start = -1, ar_wait = -1, last_rss = -1, first_rsw = -1, npack = 0;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->flags & OPF_BACKWARD)
            last_bwd = i;
        if (op->code == OP_REDUCE_SCATTER || op->code == OP_ALL_GATHER ||
            op->code == OP_ALLREDUCE)
            fail_msg("a synchronous %s is left after comm", ir_opinfo[op->code].name);
        if (op->code == OP_REDUCE_SCATTER_START) {
            nrs++;
            if (first_rs < 0)
                first_rs = i;
            /* right after the kernel that finishes its last gradient */
            int ready = -1;
            for (int j = 1; j < op->nin; j++)
                if (g->t.v[op->in[j]].op > ready)
                    ready = g->t.v[op->in[j]].op;
            for (int q = ready + 1; q < i; q++) {
                Opcode c = g->ops.v[q].code;
                bool ok = ir_opinfo[c].cls == OC_COLLECTIVE || c == OP_CONST ||
                          g->ops.v[q].group == g->ops.v[ready].group ||
                          g->ops.v[q].code == OP_RESHAPE;
                if (!ok && g->ops.v[ready].group < 0)
                    fail_msg("reduce_scatter_start at op %d is not right after its last "
                             "gradient (op %d), op %d (%s) comes between",
                             i, ready, q, ir_opinfo[c].name);
            }
            if (acc < 0)
                acc = op->in[0];
            assert_int_equal(op->in[0], acc); /* one shard buffer */
        }
        if (op->code == OP_REDUCE_SCATTER_START)
            last_rss = i;
        if (op->code == OP_REDUCE_SCATTER_WAIT) {
            last_rsw = i;
            if (first_rsw < 0)
                first_rsw = i;
        }
        if (op->code == OP_ALLREDUCE_START)
            nar++, ar_start = i;
        if (op->code == OP_ALLREDUCE_WAIT && ar_start >= 0 && ar_wait < 0)
            ar_wait = i;
        if (op->code == OP_SHARD_PACK) {
            /* the params' (it reads params only) hides the last reduce-scatter
             * buckets: after the last start, before the first wait; the other
             * (zeros for params without decay) hides the norm's all-reduce */
            bool params_only = true;
            for (int j = 0; j < op->nin; j++)
                params_only = params_only && g->t.v[op->in[j]].op < 0;
            npack++;
            if (params_only && (last_rss < 0 || first_rsw >= 0 || last_rss != nrs_last(g)))
                fail_msg("the params' shard_pack at op %d is not between the last "
                         "reduce_scatter_start and the first reduce_scatter_wait", i);
            if (!params_only && (ar_start < 0 || ar_wait >= 0))
                fail_msg("shard_pack at op %d is not between the norm's allreduce_start "
                         "and wait", i);
        }
        if (op->code == OP_ALL_GATHER_START) {
            nag++;
            if (first_ag < 0)
                first_ag = i;
        }
    }
    assert_true(nrs >= 3);
    assert_true(first_rs < last_bwd); /* overlaps backward */
    assert_int_equal(nar, 1);         /* the norm's scalar */
    /* the shard_packs, which neither the waits nor the norm need, run
     * while the last buckets and the norm are reduced (comm's
     * sink_past_start, and schedule leaves them there) */
    assert_int_equal(npack, 2);
    assert_true(ar_start >= 0 && ar_wait > ar_start + 1);
    assert_true(nag >= 3 && first_ag > last_rsw);
    /* every param is updated by the wait of its gather, in place */
    Diag d = {{0}};
    MemPlan *m = pass_memplan(g, &d);
    assert_non_null(m);
    for (int k = 0; k < g->upd.n; k++) {
        const Tensor *t = &g->t.v[g->upd.v[k].target];
        if (t->kind != TK_PARAM)
            continue;
        const Op *w = &g->ops.v[g->t.v[g->upd.v[k].value].op];
        assert_int_equal(w->code, OP_ALL_GATHER_WAIT);
        assert_int_equal(m->root[g->upd.v[k].value], m->root[t->id]);
    }
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_REDUCE_SCATTER_WAIT)
            assert_int_equal(m->root[g->ops.v[i].out], m->root[acc]);
    /* the shard buffer is live (unshared) from before the first start */
    assert_true(m->first[m->root[acc]] <= first_rs);
    pass_memplan_free(m);
    /* the text form round-trips */
    char *t1 = ir_print_str(g), err[512];
    Graph *h = ir_parse(t1, "zero", err, sizeof err);
    if (!h)
        fail_msg("%s", err);
    char *t2 = ir_print_str(h);
    assert_string_equal(t1, t2);
    free(t1);
    free(t2);
    ir_free(h);
    ir_free(g);
}

/* The gathers start in the order the forward first reads their params
 * (the next step's forward reads them in this step's order; checked on the
 * comm pass's output, whose order schedule may permute a little): gpt's
 * tied wte, read first and whose gradient is finished last (so it ends the
 * flat order), is gathered first. */
static void test_gather_order(void **state)
{
    (void)state;
    const char *sets[] = {"batch=2"};
    Graph *g = step_graph("models/gpt.lua", sets, 1, 2, 1, 1, "comm");
    int *first_read = xmalloc(sizeof(int) * (size_t)(g->t.n + 1));
    for (int t = 0; t < g->t.n; t++)
        first_read[t] = g->ops.n;
    for (int i = g->ops.n - 1; i >= 0; i--)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            first_read[g->ops.v[i].in[j]] = i;
    int wte = ir_find_tensor(g, "wte.weight"), prev_key = -1, nth = 0;
    assert_true(wte >= 0);
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        if (op->code != OP_ALL_GATHER_START)
            continue;
        int key = g->ops.n;
        bool has_wte = false;
        for (int j = 1; j < op->nin; j++) {
            key = first_read[op->in[j]] < key ? first_read[op->in[j]] : key;
            has_wte |= op->in[j] == wte;
        }
        if (key < prev_key)
            fail_msg("all_gather_start at op %d (params first read at op %d) comes after one "
                     "whose params are first read at op %d",
                     i, key, prev_key);
        prev_key = key;
        if (nth++ == 0 && !has_wte)
            fail_msg("the first all_gather_start (op %d) does not gather wte.weight", i);
    }
    assert_true(nth >= 3);
    free(first_read);
    ir_free(g);
}

/* remat plans against the sharded step's smaller persistent region: for
 * gpt at batch 8 over 8 ranks, a budget between the two peaks without
 * recomputation (1.80 MiB and 1.64 MiB since the loss's gradient is written
 * over the logits) needs recomputation with zero=0 and none with zero=1. */
static void test_remat(void **state)
{
    (void)state;
    const char *sets[] = {"batch=8"};
    int64_t budget = 1800000;
    int nrec[2];
    for (int z = 0; z < 2; z++) {
        Model *m = load_model("models/gpt.lua", sets, 1);
        Graph *g = ir_clone(m->g);
        PassOpts o;
        rt_pass_opts(&m->train, NULL, &o);
        o.nranks = 8;
        o.zero = z;
        o.memory_budget = budget;
        RematReport rr;
        memset(&rr, 0, sizeof rr);
        o.remat_report = &rr;
        MemPlan *mp = NULL;
        o.memplan = &mp;
        Diag d = {{0}};
        if (!pass_pipeline(g, &o, NULL, NULL, NULL, &d))
            fail_msg("zero=%d: %s", z, d.msg);
        assert_non_null(mp);
        assert_true(mp->arena_bytes <= budget);
        nrec[z] = rr.nrecomputed;
        print_message("zero=%d: persistent %lld bytes, peak %lld, %d activations recomputed\n", z,
                      (long long)mp->persistent_bytes, (long long)mp->arena_bytes,
                      rr.nrecomputed);
        pass_memplan_free(mp);
        ir_free(g);
        fe_model_free(m);
    }
    assert_true(nrec[0] > 0);
    assert_int_equal(nrec[1], 0);
}

/* ---- bf16 params: the f32 master copy of the shard ---- */

static const char bf16_model[] =
    "local cfg = config{batch = 8, dim = 16, hidden = 64, classes = 4, lr = 1e-2}\n"
    "sym{B = cfg.batch, D = cfg.dim, H = cfg.hidden, K = cfg.classes}\n"
    "local x = input(\"x\", {\"B\", \"D\"}, \"f32\")\n"
    "local y = input(\"y\", {\"B\"}, \"i32\")\n"
    "local w1 = param(\"w1\", {\"D\", \"H\"}, normal(0.3), \"bf16\")\n"
    "local b1 = param(\"b1\", {\"H\"}, zeros(), \"bf16\")\n"
    "local w2 = param(\"w2\", {\"H\", \"K\"}, normal(0.3), \"bf16\")\n"
    "local h = relu(matmul(cast(x, \"bf16\"), w1) + b1)\n"
    "minimize(nn.cross_entropy(cast(matmul(h, w2), \"f32\"), y))\n"
    "train{data = \"blobs\", batch = cfg.batch, steps = 10, lr = cfg.lr, "
    "weight_decay = 0.1}\n";

/* zero=1 with bf16 params plans an f32 master copy "adam.master" f32[S]
 * beside adam.m and adam.v, in the persistent region (memplan: exactly
 * 12 S bytes of state against zero=0's bf16 moments, 4 bytes per param);
 * on the interpreter (one rank) the master takes the params at step 0 and
 * keeps the updates that bf16 cannot hold: at a learning rate below bf16's
 * resolution the params stay put while the master moves by lr per step. */
static void test_bf16_master(void **state)
{
    (void)state;
    char *d = scratch_dir("zero-bf16"), *path = xasprintf("%s/bf16.lua", d);
    write_file(path, bf16_model);
    int64_t pers[2], S = 0, N = 0;
    for (int z = 0; z < 2; z++) {
        Model *m = load_model(path, NULL, 0);
        Graph *g = ir_clone(m->g);
        PassOpts o;
        rt_pass_opts(&m->train, NULL, &o);
        o.nranks = 8;
        o.zero = z;
        MemPlan *mp = NULL;
        o.memplan = &mp;
        Diag dg = {{0}};
        if (!pass_pipeline(g, &o, NULL, NULL, NULL, &dg))
            fail_msg("zero=%d: %s", z, dg.msg);
        int ms = ir_find_tensor(g, "adam.master");
        if (z) {
            assert_true(ms >= 0);
            assert_int_equal(g->t.v[ms].s.dtype, DT_F32);
            S = shape_numel(&g->t.v[ms].s);
        } else {
            assert_true(ms < 0);
            for (int i = 0; i < g->t.n; i++)
                if (g->t.v[i].kind == TK_PARAM)
                    N += shape_numel(&g->t.v[i].s);
        }
        pers[z] = mp->persistent_bytes;
        pass_memplan_free(mp);
        ir_free(g);
        fe_model_free(m);
    }
    print_message("bf16 params over 8 ranks: persistent %lld bytes (zero=0), %lld (zero=1)\n",
                  (long long)pers[0], (long long)pers[1]);
    assert_true(S == ir_shard_size(N, 8));
    assert_int_equal(pers[1] - pers[0], 12 * S - 4 * N);
    assert_true(pers[1] < pers[0]);

    /* one rank, two steps at lr 1e-5 */
    Model *m = load_model(path, NULL, 0);
    Graph *g = ir_clone(m->g);
    PassOpts o;
    rt_pass_opts(&m->train, NULL, &o);
    o.nranks = 1;
    o.zero = 1;
    Diag dg = {{0}};
    if (!pass_pipeline(g, &o, "comm", NULL, NULL, &dg))
        fail_msg("%s", dg.msg);
    fe_model_free(m);
    double **val = ir_interp_alloc(g);
    uint64_t rng = 7;
    for (int i = 0; i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->op >= 0)
            continue;
        int64_t n = shape_numel(&t->s);
        val[i] = xcalloc((size_t)n + 1, sizeof(double));
        for (int64_t e = 0; e < n; e++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int r = (int)(rng >> 40) % 64; /* k/64 - 1/2: exact in bf16 */
            if (t->kind == TK_PARAM || (t->kind == TK_INPUT && t->s.dtype == DT_F32))
                val[i][e] = r / 64.0 - 0.5;
            else if (t->kind == TK_INPUT && t->s.dtype == DT_I32)
                val[i][e] = r % 4;
        }
        if (t->kind == TK_INPUT && strcmp(t->name, "lr") == 0)
            val[i][0] = 1e-5;
    }
    int ms = ir_find_tensor(g, "adam.master"), w1 = ir_find_tensor(g, "w1");
    assert_true(ms >= 0 && w1 >= 0);
    int64_t nw = shape_numel(&g->t.v[w1].s), start = -1;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_ALL_GATHER_WAIT && g->ops.v[i].in[2] == w1)
            start = g->ops.v[i].attr.ia[1];
    assert_true(start >= 0);
    double *p0 = xmalloc(sizeof(double) * (size_t)nw);
    memcpy(p0, val[w1], sizeof(double) * (size_t)nw);
    for (int k = 1; k <= 2; k++) {
        InterpOpts io = {1, k - 1};
        ir_interp(g, val, &io);
        ir_interp_apply_updates(g, val);
        int moved = 0;
        for (int64_t e = 0; e < nw; e++) {
            double mv = val[ms][start + e] - p0[e];
            if (fabs(p0[e]) >= 1.0 / 64) /* bf16 cannot hold the step (its half ulp >= 6e-5) */
                assert_true(val[w1][e] == p0[e]);
            /* AdamW moves at most (1 - b1) / sqrt(1 - b2) lr a step, plus decay */
            assert_true(fabs(mv) <= k * 1e-5 * 3.2);
            moved += fabs(mv) > k * 0.6e-5; /* the 2nd step starts from the master */
        }
        print_message("step %d: %d of %lld elements of w1's master moved by more than 0.6 lr a step\n",
                      k, moved, (long long)nw);
        assert_true(moved > nw / 2);
    }
    free(p0);
    ir_interp_free(g, val);
    ir_free(g);
    remove_tree(d);
    free(path);
    free(d);
}

/* ---- through the binary: 2 ranks with zero=1 against the references ---- */

/* The learning rate of every run of train() (warmup 0, so its first step too). */
#define TRAIN_LR 3e-3

static char *dir;

static void train(const char *model, const char *args, const char *name)
{
    const char *bin = getenv("KILN_BIN");
    if (!bin)
        fail_msg("KILN_BIN is not set (run through ctest)");
    char *cmd = xasprintf("%s train %s --steps 6 -q --set bucket_mb=0.02 --set lr=%g "
                          "--set warmup=0 %s --log-dir %s/%s --save-weights %s/%s.safetensors",
                          bin, model, TRAIN_LR, args, dir, name, dir, name);
    run_or_fail(cmd);
    free(cmd);
}

/* Per step losses of run `name` (metrics.jsonl), into v; their count. */
static int losses(const char *name, double *v, int cap)
{
    char *p = xasprintf("%s/%s/metrics.jsonl", dir, name);
    char *text = read_file(p);
    if (!text)
        fail_msg("no %s", p);
    int n = 0;
    for (const char *s = text; (s = strstr(s, "\"loss\":")) && n < cap; s += 7)
        v[n++] = strtod(s + 7, NULL);
    free(text);
    free(p);
    return n;
}

/* The elements at Adam's noise floor: those whose gradient at the first
 * step is within a few eps of zero without being zero (|g| < 9 eps, about
 * 1e-7, where a typical gradient is 1e-4). Adam's first update is
 * lr * g / (|g| + eps), a sign step for any larger gradient; below it the
 * step follows g's own rounding, which the order of the batch's sum (one
 * rank, or two) decides: llama's layers.0.mlp.gate_proj.weight[43, 120] has
 * |g| near 1e-9 and moves by lr/10 in a direction the split picks. Such
 * elements are left out of the param comparison (the losses still cover
 * them); exact zeros (unused embedding rows) are not. mask[i] holds one
 * flag per element of tensor i of `init` (max_rel finds it by name). */
typedef struct {
    StFile init;   /* the params before the first step */
    bool **mask;   /* per tensor of init: true = left out */
    int64_t count; /* elements left out, over all tensors */
} AdamNoise;

/* Runs model at batch b for one step twice (lr 0, and TRAIN_LR without
 * weight decay) and marks the elements whose update r = (w0 - w1) / lr has
 * 0 < |r| < 0.9. Fails if more than 1 in 100 params are marked (mlp has
 * the most, 0.5%, all in fc2.weight): the comparison would no longer be
 * of the params. */
static void adam_noise(const char *model, const char *b, AdamNoise *z)
{
    char args[160];
    snprintf(args, sizeof args, "--set batch=%s --steps 1 --set lr=0 --set min_lr=0", b);
    train(model, args, "init");
    snprintf(args, sizeof args, "--set batch=%s --steps 1 --set weight_decay=0", b);
    train(model, args, "first");
    char *p0 = xasprintf("%s/init.safetensors", dir), *p1 = xasprintf("%s/first.safetensors", dir);
    StFile f1;
    Diag d = {{0}};
    if (!rt_st_read(p0, &z->init, &d) || !rt_st_read(p1, &f1, &d))
        fail_msg("%s", d.msg);
    z->mask = calloc((size_t)z->init.n, sizeof *z->mask);
    assert_non_null(z->mask);
    z->count = 0;
    int64_t total = 0;
    char names[512] = "";
    for (int i = 0; i < z->init.n; i++) {
        const StTensor *x = &z->init.t[i], *y = rt_st_find(&f1, x->name);
        assert_true(y && y->nbytes == x->nbytes && x->dtype == DT_F32);
        int64_t n = (int64_t)(x->nbytes / 4), k = 0;
        const float *w0 = x->data, *w1 = y->data;
        z->mask[i] = calloc((size_t)n, sizeof **z->mask);
        assert_non_null(z->mask[i]);
        for (int64_t e = 0; e < n; e++) {
            double r = fabs(((double)w0[e] - w1[e]) / TRAIN_LR);
            if ((z->mask[i][e] = r > 0 && r < 0.9))
                k++;
        }
        total += n;
        z->count += k;
        if (k)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s %lld",
                     names[0] ? ", " : "", x->name, (long long)k);
    }
    print_message("%s: %lld of %lld elements at Adam's noise floor (first |g| < 9 eps): %s\n",
                  model, (long long)z->count, (long long)total, names[0] ? names : "none");
    if (z->count * 100 > total)
        fail_msg("%s: %lld of %lld elements at Adam's noise floor: too many to leave out", model,
                 (long long)z->count, (long long)total);
    rt_st_free(&f1);
    free(p0);
    free(p1);
}

static void adam_noise_free(AdamNoise *z)
{
    for (int i = 0; i < z->init.n; i++)
        free(z->mask[i]);
    free(z->mask);
    rt_st_free(&z->init);
}

/* Largest per-tensor relative difference of run a from run b, over params
 * not named in skip (NULL-terminated) and elements not in z's mask (z NULL:
 * every element); *worst names the tensor. */
static double max_rel(const char *a, const char *b, const char *const *skip,
                      const AdamNoise *z, char *worst, size_t n)
{
    char *pa = xasprintf("%s/%s.safetensors", dir, a), *pb = xasprintf("%s/%s.safetensors", dir, b);
    StFile fa, fb;
    Diag d = {{0}};
    if (!rt_st_read(pa, &fa, &d) || !rt_st_read(pb, &fb, &d))
        fail_msg("%s", d.msg);
    assert_true(fa.n == fb.n && fa.n > 0);
    double e = 0;
    for (int i = 0; i < fa.n; i++) {
        const StTensor *x = &fa.t[i], *y = rt_st_find(&fb, x->name);
        assert_non_null(y);
        assert_int_equal(x->nbytes, y->nbytes);
        const bool *mask = NULL;
        for (int k = 0; z && k < z->init.n; k++)
            if (strcmp(z->init.t[k].name, x->name) == 0)
                mask = z->mask[k];
        assert_true(mask || !z);
        bool skipped = false;
        for (int k = 0; skip && skip[k]; k++)
            skipped |= strcmp(skip[k], x->name) == 0;
        if (skipped)
            continue;
        const float *u = x->data, *v = y->data;
        double dd = 0, rr = 0;
        for (int64_t k = 0; k < (int64_t)(x->nbytes / 4); k++) {
            if (mask && mask[k])
                continue;
            dd += ((double)u[k] - v[k]) * ((double)u[k] - v[k]);
            rr += (double)v[k] * v[k];
        }
        double r = rr > 0 ? sqrt(dd / rr) : dd == 0 ? 0 : INFINITY;
        if (!(r <= e)) {
            e = r;
            snprintf(worst, n, "%s", x->name);
        }
    }
    rt_st_free(&fa);
    rt_st_free(&fb);
    free(pa);
    free(pb);
    return e;
}

static void compare(const char *model, const char *a, const char *b, const char *const *skip,
                    const AdamNoise *z)
{
    double la[16], lb[16];
    int na = losses(a, la, 16), nb = losses(b, lb, 16);
    assert_true(na == 6 && nb == 6);
    for (int i = 0; i < na; i++)
        if (!(fabs(la[i] - lb[i]) <= 1e-5 * fabs(lb[i])))
            fail_msg("%s: %s vs %s: step %d loss %.9g vs %.9g", model, a, b, i + 1, la[i],
                     lb[i]);
    char worst[256] = "";
    double e = max_rel(a, b, skip, z, worst, sizeof worst);
    char left[512] = "";
    for (int k = 0; skip && skip[k]; k++)
        snprintf(left + strlen(left), sizeof left - strlen(left), "%s%s",
                 k ? ", " : "; left out (true gradient 0): ", skip[k]);
    print_message("%s: %s vs %s: losses equal; largest param difference %.3g (%s)%s%s\n",
                  model, a, b, e, worst, left,
                  z && z->count ? "; less the elements at Adam's noise floor" : "");
    if (!(e < 1e-5))
        fail_msg("%s: %s vs %s: %s differs by %.3g", model, a, b, worst, e);
}

/* Params whose true gradient is zero (in part), left out of the param
 * comparison (the losses still cover them): Adam divides the rounding
 * noise of a zero gradient by its own magnitude, so they move by lr in
 * directions that depend on summation order. gpt: the key third of each
 * c_attn.bias (softmax is unchanged by a constant added to every key's
 * score for one query, so d loss / d key bias is exactly 0). mlp and llama
 * (no biases in attention) have none; single elements near zero are
 * AdamNoise's. */
static const char *const gpt_no_grad[] = {"h.0.attn.c_attn.bias", "h.1.attn.c_attn.bias", NULL};

static void equivalence(const char *model, const char *b, const char *half,
                        const char *const *no_grad)
{
    char one[128], two[128], twoa[128], tw[128];
    snprintf(one, sizeof one, "--set batch=%s", b);
    snprintf(two, sizeof two, "--set batch=%s --nproc 2", half);
    snprintf(tw, sizeof tw, "--set batch=%s --nproc 2 --set zero=1", half);
    AdamNoise z;
    adam_noise(model, b, &z);
    train(model, one, "one");
    train(model, two, "two");
    train(model, tw, "zero");
    compare(model, "zero", "two", no_grad, &z);
    compare(model, "zero", "one", no_grad, &z);
    /* grad_accum 2: 2 ranks x 2 micro-batches of half/2 */
    int q = atoi(half) / 2;
    snprintf(twoa, sizeof twoa, "--set batch=%d --nproc 2 --set grad_accum=2", q);
    train(model, twoa, "two_accum");
    snprintf(tw, sizeof tw, "--set batch=%d --nproc 2 --set grad_accum=2 --set zero=1", q);
    train(model, tw, "zero_accum");
    compare(model, "zero_accum", "two_accum", no_grad, &z);
    compare(model, "zero_accum", "one", no_grad, &z);
    adam_noise_free(&z);
}

static void test_equivalence(void **state)
{
    (void)state;
    if (!have_command("mpirun")) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    dir = scratch_dir("zero");
    equivalence("models/mlp.lua", "64", "32", NULL);
    equivalence("models/gpt.lua", "8", "4", gpt_no_grad);
    equivalence("models/llama.lua", "8", "4", NULL);
    remove_tree(dir);
    free(dir);
}

/* Params whose gradients simplify merged into one tensor, and a gradient
 * computed from another param's (tests/data/merged_grads.lua): 1 rank with
 * grad_accum 2, 2 ranks with and without grad_accum 2, and 2 ranks with
 * zero=1 all end where 1 rank at the combined batch does. The comm pass
 * once made the all-reduce of such a gradient wait for itself (an invalid
 * graph at --nproc 2), and accumulating from another's mean counts it
 * twice. */
static void test_merged_grads(void **state)
{
    (void)state;
    if (!have_command("mpirun")) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    dir = scratch_dir("zero_merged");
    const char *m = "tests/data/merged_grads.lua";
    train(m, "--set batch=64", "one");
    train(m, "--set batch=32 --set grad_accum=2", "one_accum");
    train(m, "--set batch=32 --nproc 2", "two");
    train(m, "--set batch=16 --nproc 2 --set grad_accum=2", "two_accum");
    train(m, "--set batch=32 --nproc 2 --set zero=1", "zero");
    compare(m, "one_accum", "one", NULL, NULL);
    compare(m, "two", "one", NULL, NULL);
    compare(m, "two_accum", "one", NULL, NULL);
    compare(m, "zero", "one", NULL, NULL);
    remove_tree(dir);
    free(dir);
}

static void params_close(const char *a, const char *b)
{
    char worst[256] = "";
    double e = max_rel(a, b, NULL, NULL, worst, sizeof worst);
    print_message("mlp: %s vs %s: largest tensor difference %.3g (%s)\n", a, b, e, worst);
    if (!(e < 1e-5))
        fail_msg("mlp: %s vs %s: %s differs by %.3g", a, b, worst, e);
}

/* Checkpoints hold the full optimizer state in the unsharded form: the
 * file 2 sharded ranks write at step 6 is the one 1 rank writes (every
 * param and adam.m.P / adam.v.P), and a checkpoint at step 3 resumes
 * across rank counts and zero settings to the params of the straight run. */
static void test_checkpoints(void **state)
{
    (void)state;
    if (!have_command("mpirun")) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    dir = scratch_dir("zero_ckpt");
    const char *m = "models/mlp.lua";
    char a[512];
    snprintf(a, sizeof a, "--set batch=64 --set checkpoint_every=3 --checkpoint %s/ock", dir);
    train(m, a, "one");
    snprintf(a, sizeof a,
             "--set batch=32 --nproc 2 --set zero=1 --set checkpoint_every=3 --checkpoint %s/zck",
             dir);
    train(m, a, "zero");
    params_close("zck.step6", "ock.step6"); /* moments included */
    /* sharded -> 1 rank, and -> 2 ranks without zero */
    snprintf(a, sizeof a, "--set batch=64 --resume %s/zck.step3.safetensors", dir);
    train(m, a, "r_one");
    params_close("r_one", "one");
    snprintf(a, sizeof a, "--set batch=32 --nproc 2 --resume %s/zck.step3.safetensors", dir);
    train(m, a, "r_two");
    params_close("r_two", "one");
    /* unsharded (1 rank) -> 2 sharded ranks */
    snprintf(a, sizeof a, "--set batch=32 --nproc 2 --set zero=1 --resume %s/ock.step3.safetensors",
             dir);
    train(m, a, "r_zero");
    params_close("r_zero", "one");
    remove_tree(dir);
    free(dir);
}

/* The trace's collective events in t (a Chrome trace): per event its kind
 * (0 host collective, 1 reduce-scatter, 2 all-gather, 3 the compute
 * thread's wait for the step's mean, -1 other), start and end (ts, ts +
 * dur, us); returns how many, sorted by start. Caller frees *ev. */
typedef struct {
    double ts, end;
    int kind;
} CollEv;

static int cmp_collev(const void *a, const void *b)
{
    const CollEv *x = a, *y = b;
    return x->ts < y->ts ? -1 : x->ts > y->ts;
}

static int coll_events(const char *t, CollEv **ev)
{
    VEC(CollEv) v = {0};
    for (const char *q = t; (q = strstr(q, "{\"name\":\"")); q++) {
        const char *nm = q + 9, *ts = strstr(q, "\"ts\":"), *end = strchr(q, '}');
        if (!ts || !end || ts > end)
            continue;
        const char *dur = strstr(q, "\"dur\":");
        CollEv e = {atof(ts + 5), atof(ts + 5) + (dur && dur < end ? atof(dur + 6) : 0), -1};
        if (strncmp(nm, "allreduce host", 14) == 0)
            e.kind = 0;
        else if (strncmp(nm, "mean over ranks\"", 16) == 0)
            e.kind = 3;
        else if (strncmp(nm, "reduce-scatter bucket", 21) == 0)
            e.kind = 1;
        else if (strncmp(nm, "all-gather bucket", 17) == 0)
            e.kind = 2;
        if (e.kind >= 0)
            vec_push(&v, e);
    }
    if (v.n)
        qsort(v.v, (size_t)v.n, sizeof(CollEv), cmp_collev);
    *ev = v.v;
    return v.n;
}

/* How many all-gather starts the executor of a rank of 2 releases to the
 * communication thread at once (runtime/pieces.c's early buckets, counted
 * as test_zero_pieces.c counts them: the gathers of the rewritten plan up
 * to the release point; 0 when the update stays one kernel), for `model`
 * with `sets` as `kiln train --nproc 2 --set zero=1` plans it. The count is
 * a function of the plan: the same on both ranks. */
static int early_gathers(const char *model, const char *const *sets, int nsets)
{
    int early[2];
    for (int r = 0; r < 2; r++) {
        Model *m = load_model(model, sets, nsets);
        Graph *g = ir_clone(m->g);
        PassOpts o;
        rt_pass_opts(&m->train, NULL, &o);
        o.nranks = 2;
        o.zero = 1;
        Diag d = {{0}};
        if (!pass_pipeline(g, &o, NULL, NULL, NULL, &d))
            fail_msg("%s: %s", model, d.msg);
        fe_model_free(m);
        CgPlan *p = cg_plan(g, &d);
        if (!p)
            fail_msg("%s: %s", model, d.msg);
        int rel = rt_pieces_plan(p, r, 2);
        early[r] = 0;
        for (int s = 0; s <= rel; s++)
            early[r] += p->steps.v[s].kind == CG_STEP_ALLREDUCE_START &&
                        p->steps.v[s].coll == CG_COLL_ALL_GATHER;
        cg_plan_free(p);
        ir_free(g);
    }
    assert_int_equal(early[0], early[1]);
    return early[0];
}

/* The report and the trace per rank of `model` trained 3 steps with
 * `--nproc 2 --set zero=1` and `sets`: reduce-scatter and all-gather
 * tracks (tids 3 and 4) with their buckets, the summary per collective,
 * and the plan's early gathers (early_gathers, at least min_early) ahead
 * of each step's loss mean. */
static void report(const char *model, const char *const *sets, int nsets, int min_early)
{
    const char *all[8] = {"zero=1"};
    char flags[256] = "";
    assert_true(nsets < 8);
    for (int i = 0; i < nsets; i++) {
        all[i + 1] = sets[i];
        snprintf(flags + strlen(flags), sizeof flags - strlen(flags), " --set %s", sets[i]);
    }
    int early = early_gathers(model, all, nsets + 1);
    assert_true(early >= min_early);
    print_message("%s%s: %d all-gather buckets released at once\n", model, flags, early);
    dir = scratch_dir("zero_trace");
    char *cmd = xasprintf("%s train %s --steps 3 -q --nproc 2 --set zero=1%s --trace %s/t.json",
                          getenv("KILN_BIN"), model, flags, dir);
    char *out = NULL;
    int rc = run_cmd(cmd, &out);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, out);
    assert_non_null(strstr(out, "comm by collective (zero=1"));
    assert_non_null(strstr(out, "reduce-scatter "));
    for (int r = 0; r < 2; r++) {
        char *p = xasprintf("%s/t%s.json", dir, r ? ".rank1" : "");
        char *t = read_file(p);
        if (!t)
            fail_msg("no trace %s", p);
        assert_non_null(strstr(t, "\"tid\":3,\"args\":{\"name\":\"reduce-scatter"));
        assert_non_null(strstr(t, "\"tid\":4,\"args\":{\"name\":\"all-gather"));
        int rs = 0, ag = 0, per[64] = {0};
        for (const char *q = t; (q = strstr(q, "\"name\":\"reduce-scatter bucket")); q++)
            rs += strstr(q, "\"tid\":3}") != NULL;
        for (const char *q = t; (q = strstr(q, "\"name\":\"all-gather bucket ")); q++) {
            int b = atoi(q + strlen("\"name\":\"all-gather bucket "));
            assert_true(b >= 0 && b < 64);
            per[b]++;
            ag++;
        }
        /* 3 steps, a bucket or more each, and every step's gathers: each
         * all-gather bucket 3 times (the ones that land after their step's
         * figures were taken go into the next step's, the last step's into
         * its own after the loop: rt_dp_after_last_step) */
        assert_true(rs >= 3 && ag >= 3);
        for (int b = 0; b < 64; b++)
            if (per[b] && per[b] != 3)
                fail_msg("rank %d: all-gather bucket %d is in the trace %d times, not once a "
                         "step (3)", r, b, per[b]);
        /* a step's gathers go to MPI after the loss's mean that follows the
         * step (mpi.c holds them), not before it: each all-gather starts
         * after a host collective with no reduce-scatter in between; but
         * the early ones, which the executor releases at once while the
         * rest of the shard update runs (runtime/pieces.c): after the
         * step's reduce-scatters, exactly `early` gathers start ahead of
         * the loss's mean */
        CollEv *ev;
        int nev = coll_events(t, &ev), last = -1, ahead = 0, steps = 0, means = 0;
        double mean_end = -1;
        for (int i = 0; i < nev; i++) {
            if (ev[i].kind == 3) { /* the compute thread's wait for the step's mean */
                mean_end = ev[i].end;
                means++;
                continue;
            }
            /* and only once that wait is over (mpi.c's host_job releases
             * them after the mean, so that its callers are awake before
             * the comm thread copies the gathers' data) */
            if (ev[i].kind == 2 && last == 0 && ev[i].ts < mean_end)
                fail_msg("rank %d: an all-gather starts at %.1f us, before the compute "
                         "thread's wait for the step's mean ends (%.1f us)",
                         r, ev[i].ts, mean_end);
            if (ev[i].kind == 0 && last == 1) { /* the loss's mean after a step */
                if (ahead != early)
                    fail_msg("rank %d: %d all-gathers start between the step's reduce-scatters "
                             "and the loss's mean at %.1f us, expected the plan's %d early "
                             "buckets",
                             r, ahead, ev[i].ts, early);
                steps++;
            }
            if (ev[i].kind != 2) {
                last = ev[i].kind;
                ahead = 0;
            } else if (last == 1)
                ahead++; /* an early gather, released at once */
            else if (last != 0)
                fail_msg("rank %d: an all-gather starts at %.1f us after the step's start, "
                         "not after the loss's host all-reduce",
                         r, ev[i].ts);
        }
        assert_int_equal(steps, 3);
        assert_int_equal(means, 3);
        free(ev);
        free(t);
        free(p);
    }
    free(out);
    free(cmd);
    remove_tree(dir);
    free(dir);
}

static void test_report(void **state)
{
    (void)state;
    if (!have_command("mpirun")) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    const char *mlp[] = {"batch=32", "bucket_mb=0.02"}, *gpt[] = {"bucket_mb=0.004"};
    report("models/mlp.lua", mlp, 2, 1); /* the first bucket */
    report("models/gpt.lua", gpt, 1, 2); /* wte/wpe/ln_1, h.0's c_attn: 3 (test_zero_pieces) */
}

/* The setting: 0 or 1, from train{} or --set; anything else is refused
 * with the script's file and line (train{}) or the flag (--set). */
static void test_setting(void **state)
{
    (void)state;
    char *d = scratch_dir("zero_set"), *text = read_file("models/mlp.lua");
    assert_non_null(text);
    char *at = strstr(text, "\ntrain{");
    assert_non_null(at);
    int line = 2;
    for (const char *q = text; q < at; q++)
        line += *q == '\n';
    *at = 0;
    char *script = xasprintf("%s\ntrain{zero = 2, %s", text, at + 7);
    char *path = xasprintf("%s/m.lua", d);
    write_file(path, script);
    const char *bin = getenv("KILN_BIN");
    char *cmd = xasprintf("%s compile %s --nproc 2", bin, path), *out = NULL;
    assert_int_not_equal(run_cmd(cmd, &out), 0);
    char *want = xasprintf("%s:%d: train: bad value for 'zero' (expected an integer from 0 to "
                           "1, got 2)", path, line);
    if (!strstr(out, want))
        fail_msg("expected \"%s\" in: %s", want, out);
    free(out);
    free(cmd);
    cmd = xasprintf("%s compile models/mlp.lua --nproc 2 --set zero=yes", bin);
    assert_int_not_equal(run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "--set zero: expected an integer from 0 to 1"));
    free(out);
    free(cmd);
    free(want);
    free(path);
    free(script);
    free(text);
    remove_tree(d);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_setting),
        cmocka_unit_test(test_interp_one_rank),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_gather_order),
        cmocka_unit_test(test_remat),
        cmocka_unit_test(test_bf16_master),
        cmocka_unit_test(test_equivalence),
        cmocka_unit_test(test_merged_grads),
        cmocka_unit_test(test_checkpoints),
        cmocka_unit_test(test_report),
    };
    /* KILN_TEST_FILTER=NAME runs only the tests whose name matches NAME */
    const char *only = getenv("KILN_TEST_FILTER");
    if (only)
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
