/* test_frontend.c - the model DSL: every model in models/ loads to a valid
 * forward graph with a scalar loss; --set overrides config{} and train{};
 * script mistakes (tests/data/bad/) are reported at the right file and line;
 * the nn library computes what it claims (checked with the reference
 * interpreter against plain C). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend.h"

/* Loads and expects failure; returns the message (static). */
static const char *load_err(const char *path, const char *const *sets, int nsets)
{
    static char err[2048];
    err[0] = 0;
    Model *m = fe_load_model(path, sets, nsets, err, sizeof err);
    if (m) {
        fe_model_free(m);
        fail_msg("%s: loaded, but an error was expected", path);
    }
    return err;
}

static void expect_has(const char *msg, const char *what)
{
    if (!strstr(msg, what))
        fail_msg("message lacks '%s': %s", what, msg);
}

static void check_forward_graph(const Model *m)
{
    char err[1024];
    if (!ir_verify(m->g, err, sizeof err))
        fail_msg("%s: %s", m->path, err);
    int loss = ir_find_output(m->g, "loss");
    assert_true(loss >= 0);
    assert_int_equal(m->g->t.v[loss].s.rank, 0);
    assert_true(dtype_is_float(m->g->t.v[loss].s.dtype));
    for (int i = 0; i < m->g->ops.n; i++) {
        const Op *op = &m->g->ops.v[i];
        if (!op->loc.file || strcmp(op->loc.file, m->path) != 0 || op->loc.line <= 0)
            fail_msg("%s: op %d (%s) has location %s:%d", m->path, i,
                     ir_opinfo[op->code].name, op->loc.file ? op->loc.file : "?", op->loc.line);
    }
}

static void test_every_model_loads(void **state)
{
    (void)state;
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++) {
        Model *m = load_model(*pp, NULL, 0);
        check_forward_graph(m);
        /* at least one config{} key: a line between "# config" and "# train" */
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        fe_print_settings(m, f);
        fclose(f);
        assert_true(strncmp(buf, "# config\n", 9) == 0 && strncmp(buf + 9, "# train", 7) != 0);
        free(buf);
        assert_non_null(m->train.data);
        fe_model_free(m);
    }
    free_model_paths(paths);
}

static int64_t param_count(const Graph *g)
{
    int64_t n = 0;
    for (int i = 0; i < g->t.n; i++)
        if (g->t.v[i].kind == TK_PARAM)
            n += shape_numel(&g->t.v[i].s);
    return n;
}

static void test_model_outputs(void **state)
{
    (void)state;
    static const char *with_logits[] = {"models/gpt.lua", "models/addition.lua",
                                        "models/llama.lua", "models/mlp.lua"};
    for (int i = 0; i < 4; i++) {
        Model *m = load_model(with_logits[i], NULL, 0);
        /* logits are evaluation's: the training step does not output them */
        int t = m->eval_g ? ir_find_output(m->eval_g, "logits") : -1;
        if (t < 0)
            fail_msg("%s has no logits output in its evaluation graph", with_logits[i]);
        if (ir_find_output(m->g, "logits") >= 0)
            fail_msg("%s: the training step outputs the logits", with_logits[i]);
        fe_model_free(m);
    }
    /* the addition task's layout: T = 3n + 3, V = 14, a mask input */
    const char *sets[] = {"digits=5"};
    Model *m = load_model("models/addition.lua", sets, 1);
    const Shape *lg = &m->eval_g->t.v[ir_find_output(m->eval_g, "logits")].s;
    assert_int_equal(lg->rank, 3);
    assert_int_equal(lg->dim[1], 18);
    assert_int_equal(lg->dim[2], 14);
    assert_int_equal(m->train.digits, 5);
    assert_string_equal(m->train.data, "addition");
    int mask = ir_find_tensor(m->g, "mask");
    assert_true(mask >= 0);
    assert_int_equal(m->g->t.v[mask].s.dtype, DT_F32);
    fe_model_free(m);
}

/* GPT-2 124M: the forward graph only (shapes, nothing allocated). The load
 * time is printed, not asserted: a test does not judge speed (under the
 * sanitizers on a loaded machine it passed 0.3 s). */
static void test_gpt2_124m(void **state)
{
    (void)state;
    const char *sets[] = {"size=124M"};
    double t0 = ir_now();
    Model *m = load_model("models/gpt.lua", sets, 1);
    print_message("loading GPT-2 124M took %.3f s\n", ir_now() - t0);
    check_forward_graph(m);
    /* GPT-2 small with tied embeddings has 124,439,808 parameters; kiln's
     * pads the vocabulary to 50304 rows (47 x 768 more, never trained) */
    assert_int_equal(param_count(m->g), 124439808 + 47 * 768);
    int wte = ir_find_tensor(m->g, "wte.weight");
    assert_int_equal(m->g->t.v[wte].s.dim[0], 50304);
    assert_int_equal(m->npads, 1);
    assert_string_equal(m->pads[0].param, "wte.weight");
    assert_int_equal(m->pads[0].rows, 50257);
    const Shape *lg = &m->eval_g->t.v[ir_find_output(m->eval_g, "logits")].s;
    assert_int_equal(lg->dim[0], 4);
    assert_int_equal(lg->dim[1], 1024);
    assert_int_equal(lg->dim[2], 50257);
    assert_string_equal(fe_config_get(m, "L"), "12");
    assert_string_equal(fe_config_get(m, "size"), "124M");
    assert_true(ir_find_tensor(m->g, "h.11.attn.c_attn.weight") >= 0);
    fe_model_free(m);

    /* explicit keys win over the preset */
    const char *sets2[] = {"size=124M", "L=2"};
    m = load_model("models/gpt.lua", sets2, 2);
    assert_string_equal(fe_config_get(m, "L"), "2");
    assert_string_equal(fe_config_get(m, "C"), "768");
    assert_true(ir_find_tensor(m->g, "h.2.ln_1.weight") < 0);
    fe_model_free(m);

    const char *bad[] = {"size=1B"};
    const char *msg = load_err("models/gpt.lua", bad, 1);
    expect_has(msg, "--set size:");
    expect_has(msg, "1B");
}

static void test_set_overrides(void **state)
{
    (void)state;
    const char *path = "tests/data/bad/config_set.lua";
    Model *m = load_model(path, NULL, 0);
    assert_string_equal(fe_config_get(m, "width"), "8");
    assert_string_equal(fe_config_get(m, "name"), "tiny");
    assert_string_equal(fe_config_get(m, "flag"), "true");
    assert_int_equal(m->g->t.v[ir_find_tensor(m->g, "x")].s.dim[1], 8);
    fe_model_free(m);

    const char *sets[] = {"width=16", "name=big", "flag=false", "lr=0.25", "steps=7",
                          "memory_budget=512MiB", "data=text", "seed=42"};
    m = load_model(path, sets, 8);
    assert_string_equal(fe_config_get(m, "width"), "16");
    assert_string_equal(fe_config_get(m, "name"), "big");
    assert_string_equal(fe_config_get(m, "flag"), "false");
    assert_int_equal(m->g->t.v[ir_find_tensor(m->g, "x")].s.dim[1], 16);
    assert_true(m->train.lr == 0.25);
    assert_int_equal(m->train.steps, 7);
    assert_int_equal(m->train.memory_budget, 512LL << 20);
    assert_string_equal(m->train.data, "text");
    assert_int_equal(m->train.seed, 42);
    fe_model_free(m);

    /* a --set of a train key beats the script's train{} */
    const char *lr[] = {"lr=0.125", "steps=3"};
    m = load_model("models/gpt.lua", lr, 2);
    assert_true(m->train.lr == 0.125);
    assert_int_equal(m->train.steps, 3); /* a config key of gpt.lua, passed to train{} */
    fe_model_free(m);

    static const struct {
        const char *set, *words[3];
    } bad[] = {
        {"nope=1", {"--set nope:", "unknown key", "width"}},
        /* the closest key, a config key or a train key (issue 42) */
        {"widht=4", {"--set widht:", "did you mean 'width'?", NULL}},
        {"stpes=4", {"--set stpes:", "did you mean 'steps'?", NULL}},
        {"width=abc", {"--set width:", "number", "abc"}},
        {"width=2.5", {"--set width:", "integer", "2.5"}},
        {"flag=maybe", {"--set flag:", "true or false", "maybe"}},
        {"steps=many", {"--set steps:", "integer", "many"}},
        {"memory_budget=lots", {"--set memory_budget:", "512MiB", "lots"}},
        {"widthonly", {"--set widthonly:", "key=value", NULL}},
        {"precision=f8", {"--set precision:", "f32, bf16", "f8"}},
        {"data=mnist", {"--set data:", "addition, text, tokens, blobs, tensors", "mnist"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *msg = load_err(path, &bad[i].set, 1);
        for (int k = 0; k < 3 && bad[i].words[k]; k++)
            expect_has(msg, bad[i].words[k]);
    }
    /* an unknown key lists the config keys sorted (Lua's table order
     * changes from run to run) */
    const char *nope[] = {"nope=1"};
    expect_has(load_err(path, nope, 1), "config_set.lua: flag, name, width;");
    /* a script without config{}: the closest train key */
    const char *lrate[] = {"lrr=0.1"};
    const char *msg = load_err("tests/data/col_max.lua", lrate, 1);
    expect_has(msg, "--set lrr: unknown key (did you mean 'lr'?");
}

/* Line of the first line of path containing "-- ERROR" (0 if none). */
static int marked_line(const char *path)
{
    char *text = read_file(path);
    if (!text)
        fail_msg("cannot read %s", path);
    int line = 1, found = 0;
    for (char *p = text; *p && !found; p++) {
        if (strncmp(p, "-- ERROR", 8) == 0)
            found = line;
        if (*p == '\n')
            line++;
    }
    free(text);
    return found;
}

static void test_bad_scripts(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        const char *words[4];
    } cases[] = {
        {"add_shape", {"add", "broadcast", "f32[4,8]", "f32[4,9]"}},
        {"matmul_inner", {"matmul", "inner dimensions", "f32[4,8]", "f32[9,16]"}},
        {"embed_dtype", {"gather", "indices must be integers", "f32[4,8]", NULL}},
        {"unknown_method", {"no field or method", "frobnicate", NULL}},
        {"reshape_count", {"reshape", "element counts", "f32[4,8]", "[5,7]"}},
        {"bad_axis", {"sum", "axis 2 out of range", "f32[4,8]", NULL}},
        {"train_key", {"train", "unknown key", "stepz", "did you mean 'steps'?"}},
        {"minimize_nonscalar", {"minimize", "scalar", "f32[4,8]", NULL}},
        {"syntax", {"unexpected symbol", NULL}},
        {"runtime", {"'undefined_layer' is not a kiln function", NULL}},
        {"bad_init", {"param 'w'", "init must be", "number", NULL}},
        {"nn_shape", {"matmul", "inner dimensions", "f32[4,8]", "f32[16,4]"}},
        {"ce_float_targets", {"nn.cross_entropy", "expected i32/i64", "got f32[4]", NULL}},
        {"shape_overflow", {"param", "[65536,65536,65536,65536]", "more than 2^62 elements",
                            NULL}},
        {"matmul_overflow", {"matmul", "[2147483648,2147483648]", "more than 2^62 bytes",
                             NULL}},
        {"dtype_mix", {"mul", "dtypes differ", "f32[4,8]", "i32[4,8]"}},
        {"compare_op", {"cannot be compared", "a:lt(b)", NULL}},
        {"user_error", {"C must be divisible by H", NULL}},
        {"bad_dtype", {"unknown dtype", "float32", NULL}},
        {"select_mask", {"select", "u8", "f32[4,8]", NULL}},
        {"train_type", {"train", "lr", "fast", NULL}},
        {"batch_mismatch", {"batch = 8", "'x'", "f32[4,8]", NULL}},
        {"config_key_number", {"config:", "keys must be names", "the number key [1]", NULL}},
        {"config_nested", {"config:", "'a' must be a number, string or boolean", "got a table",
                           NULL}},
        {"config_preset_nested", {"config:", "'L' in preset 'big'", "got a table", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256], prefix[300];
        snprintf(path, sizeof path, "tests/data/bad/%s.lua", cases[i].file);
        int line = marked_line(path);
        assert_true(line > 0);
        const char *msg = load_err(path, NULL, 0);
        snprintf(prefix, sizeof prefix, "%s:%d: ", path, line);
        if (strncmp(msg, prefix, strlen(prefix)) != 0)
            fail_msg("expected the message to start with '%s', got: %s", prefix, msg);
        for (int k = 0; k < 4 && cases[i].words[k]; k++)
            expect_has(msg, cases[i].words[k]);
    }
    const char *msg = load_err("tests/data/bad/no_loss.lua", NULL, 0);
    expect_has(msg, "tests/data/bad/no_loss.lua:");
    expect_has(msg, "minimize");
    msg = load_err("tests/data/bad/does_not_exist.lua", NULL, 0);
    expect_has(msg, "does_not_exist.lua");
}

static void test_settings_printed(void **state)
{
    (void)state;
    const char *sets[] = {"memory_budget=2GiB"};
    Model *m = load_model("models/gpt.lua", sets, 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fe_print_settings(m, f);
    fclose(f);
    expect_has(buf, "# config\n");
    expect_has(buf, "\nL = 2\n");
    expect_has(buf, "\nsize = tiny\n");
    expect_has(buf, "# train\n");
    expect_has(buf, "\nmemory_budget = 2147483648\n");
    expect_has(buf, "\nprecision = f32\n");
    expect_has(buf, "\ndata = text\n");
    free(buf);
    fe_model_free(m);

    TrainCfg t;
    fe_train_defaults(&t);
    assert_string_equal(t.precision, "f32");
    assert_true(t.beta1 == 0.9);
}

/* ---- the sandbox ------------------------------------------------------------
 * Hostile scripts of tests/data/bad/sandbox_*.lua stop at the marked line
 * with a message; the bounds (KILN_LUA_INSTRUCTIONS, KILN_LUA_MEMORY) are
 * small here so that each case runs in well under a second. */
static void expect_at_marked_line(const char *file, const char *const *words, int nwords)
{
    char path[256], prefix[300];
    snprintf(path, sizeof path, "tests/data/bad/%s.lua", file);
    int line = marked_line(path);
    if (line <= 0)
        fail_msg("%s: no -- ERROR mark", path);
    const char *msg = load_err(path, NULL, 0);
    snprintf(prefix, sizeof prefix, "%s:%d: ", path, line);
    if (strncmp(msg, prefix, strlen(prefix)) != 0)
        fail_msg("expected the message to start with '%s', got: %s", prefix, msg);
    for (int k = 0; k < nwords && words[k]; k++)
        expect_has(msg, words[k]);
}

static void test_sandbox(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        const char *words[3];
    } cases[] = {
        {"sandbox_load_binary", {"load:", "text chunks only", "binary chunk"}},
        {"sandbox_load_mode", {"load:", "text chunks only", "got \"b\""}},
        {"sandbox_load_reader", {"load:", "text chunks only", "binary chunk"}},
        {"sandbox_dump", {"string.dump:", "not available", NULL}},
        {"sandbox_dofile", {"dofile:", "no file access", NULL}},
        {"sandbox_loadfile", {"loadfile:", "no file access", NULL}},
        {"sandbox_io", {"io.open:", "no file access", NULL}},
        {"sandbox_os", {"os.execute:", "operating system", NULL}},
        {"sandbox_require", {"require:", "cannot load modules", NULL}},
        {"sandbox_loadlib", {"package.loadlib:", "cannot load modules", NULL}},
        {"sandbox_gc", {"setmetatable:", "__gc", NULL}},
        {"sandbox_loop", {"ran for more than 1000000 Lua instructions", "endless loop",
                          "KILN_LUA_INSTRUCTIONS"}},
        {"sandbox_pcall_loop", {"ran for more than 1000000 Lua instructions", NULL}},
        {"train_wrap", {"grad_accum", "expected an integer from 1 to 1024", "4294967297"}},
        {"train_fraction", {"steps", "expected an integer from 0 to", "2.5"}},
        {"dup_name", {"param:", "'w' is already used", NULL}},
        /* the metatables kiln makes are locked (a __gc set there ran after
         * the script, where no bound holds) */
        {"sandbox_gc_tensor_mt", {"metatables of kiln's values", "are locked",
                                  "got a write of '__gc'"}},
        {"sandbox_gc_init_mt", {"rawset", "table expected, got userdata", NULL}},
        {"sandbox_gc_string_mt", {"are locked", "got a write of '__index'", NULL}},
        {"sandbox_gc_layer_mt", {"are locked", "got a write of '__gc'", NULL}},
    };
    setenv("KILN_LUA_INSTRUCTIONS", "1000000", 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_at_marked_line(cases[i].file, cases[i].words, 3);
    /* a write caught with pcall: the model builds, no finalizer runs */
    fe_model_free(load_model("tests/data/bad/sandbox_gc_pcall.lua", NULL, 0));
    /* a script that is bytecode names its file */
    static const char bytecode[] = "\x1bLuaT\x00\x19\x93\r\n\x1a\n";
    char berr[512];
    assert_null(fe_load_model_text("b.lua", bytecode, sizeof bytecode - 1, NULL, 0, berr,
                                   sizeof berr));
    expect_has(berr, "b.lua: the model script is Lua bytecode (expected Lua source text");
    /* the clock stops library calls that allocate at the script's line
     * (cleanly: the sanitizer build checks that nothing leaks) */
    setenv("KILN_LUA_SECONDS", "1", 1);
    setenv("KILN_LUA_INSTRUCTIONS", "1000000000000", 1);
    static const char *clock_words[] = {"ran for more than 1 s and was stopped",
                                        "KILN_LUA_SECONDS"};
    expect_at_marked_line("sandbox_clock", clock_words, 2);
    unsetenv("KILN_LUA_SECONDS");
    /* the default bounds stop a table of string keys, a reader of blanks
     * and a string of 64 MiB */
    unsetenv("KILN_LUA_INSTRUCTIONS");
    static const char *mem64[] = {"used more than 64 MiB of Lua memory", NULL};
    expect_at_marked_line("sandbox_table_keys", mem64, 1);
    expect_at_marked_line("sandbox_format_q", mem64, 1);
    static const char *reader64[] = {"load: the reader function returned more than 64 MiB",
                                     "KILN_LUA_MEMORY"};
    expect_at_marked_line("sandbox_load_blanks", reader64, 2);
    setenv("KILN_LUA_INSTRUCTIONS", "1000000", 1);
    /* the memory bound; instructions enough to reach it */
    setenv("KILN_LUA_INSTRUCTIONS", "100000000", 1);
    setenv("KILN_LUA_MEMORY", "8MiB", 1);
    static const char *mem_words[] = {"used more than 8 MiB of Lua memory", "KILN_LUA_MEMORY"};
    expect_at_marked_line("sandbox_bomb", mem_words, 2);
    expect_at_marked_line("sandbox_pcall_bomb", mem_words, 2);
    expect_at_marked_line("sandbox_bigstring", mem_words, 2); /* one allocation of 1 GiB */
    unsetenv("KILN_LUA_MEMORY");
    /* the graph bound */
    setenv("KILN_MAX_OPS", "10000", 1);
    static const char *ops_words[] = {"built a graph of more than 10000 ops", "KILN_MAX_OPS"};
    expect_at_marked_line("sandbox_graph", ops_words, 2);
    setenv("KILN_MAX_OPS", "100", 1);
    expect_has(load_err("models/mlp.lua", NULL, 0), "KILN_MAX_OPS: expected an integer from 1000");
    unsetenv("KILN_MAX_OPS");
    setenv("KILN_LUA_MEMORY", "8MiB", 1);

    /* every model, GPT-2 124M included, is far inside the bounds (the
     * defaults are 2e8 instructions, 64 MiB and 2^20 ops: 20x, 8x and 100x
     * these) */
    setenv("KILN_LUA_INSTRUCTIONS", "10000000", 1);
    setenv("KILN_MAX_OPS", "10000", 1);
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++)
        fe_model_free(load_model(*pp, NULL, 0));
    free_model_paths(paths);
    const char *big[] = {"size=124M"};
    fe_model_free(load_model("models/gpt.lua", big, 1));

    unsetenv("KILN_MAX_OPS");
    /* malformed bounds */
    setenv("KILN_LUA_MEMORY", "lots", 1);
    expect_has(load_err("models/mlp.lua", NULL, 0), "KILN_LUA_MEMORY: expected a size");
    setenv("KILN_LUA_MEMORY", "1KiB", 1); /* below 64KiB */
    expect_has(load_err("models/mlp.lua", NULL, 0), "got '1KiB'");
    unsetenv("KILN_LUA_MEMORY");
    setenv("KILN_LUA_INSTRUCTIONS", "4294967297x", 1);
    expect_has(load_err("models/mlp.lua", NULL, 0),
               "KILN_LUA_INSTRUCTIONS: expected an integer from 1000 to");
    unsetenv("KILN_LUA_INSTRUCTIONS");

    /* what scripts may still do: load text, with an environment; pcall */
    static const char ok[] =
        "local f = load('return 1 + ...', 'chunk', 't')\n"
        "assert(f(2) == 3)\n"
        "local g = load('return y', 'chunk', nil, {y = 5})\n"
        "assert(g() == 5)\n"
        "assert(not pcall(error, 'x'))\n"
        "assert(setmetatable({}, {__index = {a = 1}}).a == 1)\n"
        "local x = input('x', {4, 8})\n"
        "minimize(x:sum())\n";
    Model *m = fe_load_model_text("ok.lua", ok, sizeof ok - 1, NULL, 0, (char[512]){0}, 512);
    assert_non_null(m);
    fe_model_free(m);
    /* a first line starting with '#' is skipped, and lines keep their numbers */
    static const char shebang[] = "#!/usr/bin/env kiln\nlocal x = input('x', {4})\nerror('here')\n";
    char err[512];
    assert_null(fe_load_model_text("s.lua", shebang, sizeof shebang - 1, NULL, 0, err, sizeof err));
    expect_has(err, "s.lua:3: here");

    /* the script must be a regular file: a directory or a FIFO is an error,
     * not a hang */
    char *dir = scratch_dir("fe-sandbox");
    expect_has(load_err(dir, NULL, 0), "got a directory");
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/model.lua", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_has(load_err(fifo, NULL, 0), "got a FIFO");
    remove_tree(dir);
    free(dir);
}

/* The memory bound crossed at every point of a real model's run: bounds
 * from 64 KiB (the least; less than models/gpt.lua at size=124M allocates
 * beyond the libraries, which the bound does not count) to 160 KiB (more
 * than it needs), so that the crossing falls in turn inside the script,
 * inside nn.lua and inside the DSL's C functions. Each run builds the model
 * or stops with the memory error at a line of the script; never a crash or
 * a leak (the sanitizer build runs this too). */
static void test_sandbox_memory_sweep(void **state)
{
    (void)state;
    int built = 0, stopped = 0;
    const char *sets[] = {"size=124M"};
    for (int limit = 65536; limit <= 163840; limit += 337) {
        char v[32], err[2048];
        snprintf(v, sizeof v, "%d", limit);
        setenv("KILN_LUA_MEMORY", v, 1);
        Model *m = fe_load_model("models/gpt.lua", sets, 1, err, sizeof err);
        if (m) {
            built++;
            check_forward_graph(m);
            fe_model_free(m);
            continue;
        }
        stopped++;
        if (strncmp(err, "models/gpt.lua:", 15) != 0 || atoi(err + 15) <= 0 ||
            !strstr(err, "KiB of Lua memory"))
            fail_msg("bound %d: expected the memory error at a line of the script, got: %s",
                     limit, err);
    }
    unsetenv("KILN_LUA_MEMORY");
    assert_true(built > 0 && stopped > 0);
}

/* Integer settings never wrap around; numbers are finite and in range. */
static void test_setting_ranges(void **state)
{
    (void)state;
    static const struct {
        const char *set, *want;
    } bad[] = {
        {"grad_accum=4294967297", "--set grad_accum: expected an integer from 1 to 1024, got 4294967297"},
        {"grad_accum=0", "--set grad_accum: expected an integer from 1 to 1024, got 0"},
        {"steps=1e12", "--set steps: expected an integer from 0 to 1000000000, got 1e12"},
        {"steps=-1", "--set steps: expected an integer from 0 to 1000000000, got -1"},
        {"steps=1.5", "--set steps: expected an integer from 0 to 1000000000, got 1.5"},
        {"steps=4x", "got 4x"},
        {"steps=", "got an empty value"},
        {"steps=nan", "got nan"},
        {"steps=0x10", "got 0x10"},
        {"steps=99999999999999999999", "got 99999999999999999999"},
        {"eval_batches=1000000001", "--set eval_batches: expected an integer from 1 to 1000000000"},
        {"eval_every=-5", "--set eval_every: expected an integer from 0 to"},
        {"log_every=1e10", "--set log_every: expected an integer from 0 to"},
        {"checkpoint_every=2.5", "--set checkpoint_every: expected an integer from 0 to"},
        {"warmup=inf", "--set warmup: expected an integer from 0 to"},
        {"digits=4294967299", "--set digits: expected an integer from 1 to 9"},
        {"batch=-4", "--set batch: expected an integer from 0 to"},
        {"seed=-1", "--set seed: expected an integer from 0 to 18446744073709551615, got -1"},
        {"seed=18446744073709551616", "got 18446744073709551616"},
        {"seed=7x", "got 7x"},
        {"lr=nan", "--set lr: expected a finite number >= 0, got nan"},
        {"lr=-1", "--set lr: expected a finite number >= 0, got -1"},
        {"beta1=1", "--set beta1: expected a number in [0, 1), got 1"},
        {"val_fraction=inf", "--set val_fraction: expected a number in [0, 1), got inf"},
        {"bucket_mb=0", "--set bucket_mb: expected a number in (0, 1048576], got 0"},
        {"bucket_mb=nan", "--set bucket_mb: expected a number in (0, 1048576], got nan"},
        {"comm_timeout=1e400", "--set comm_timeout: expected a number in (0, 1000000], got 1e400"},
        {"grad_clip=inf", "--set grad_clip: expected a finite number, got inf"},
        {"memory_budget=-1", "--set memory_budget: expected a byte count"},
    };
    const char *path = "tests/data/bad/config_set.lua";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_has(load_err(path, &bad[i].set, 1), bad[i].want);
    /* config{} numbers: finite, integers within int64 */
    const char *wide[] = {"width=1e30"};
    expect_has(load_err(path, wide, 1), "--set width: expected an integer");

    const char *good[] = {"steps=1e3", "grad_accum=1024", "seed=18446744073709551615",
                          "eval_batches=1000000", "beta2=0", "warmup=1000000000"};
    Model *m = load_model(path, good, 6);
    assert_int_equal(m->train.steps, 1000);
    assert_int_equal(m->train.grad_accum, 1024);
    assert_true(m->train.seed == UINT64_MAX);
    assert_int_equal(m->train.eval_batches, 1000000);
    assert_int_equal(m->train.warmup, 1000000000);
    fe_model_free(m);

    int64_t v;
    char why[256];
    assert_true(fe_parse_int("42", 1, 100, &v, why, sizeof why) && v == 42);
    assert_true(fe_parse_int("-3", -5, 5, &v, why, sizeof why) && v == -3);
    assert_true(fe_parse_int("2e3", 1, 5000, &v, why, sizeof why) && v == 2000);
    assert_false(fe_parse_int("4294967297", 1, 1024, &v, why, sizeof why));
    assert_string_equal(why, "expected an integer from 1 to 1024, got 4294967297");
    static const char *not_ints[] = {"1.5", "4x", "", " 4", "nan", "inf", "-inf", "0x10",
                                     "1e400", "9223372036854775808", "--1"};
    for (size_t i = 0; i < sizeof not_ints / sizeof not_ints[0]; i++)
        if (fe_parse_int(not_ints[i], INT64_MIN, INT64_MAX, &v, why, sizeof why))
            fail_msg("fe_parse_int accepted '%s' as %lld", not_ints[i], (long long)v);
}

/* ---- numerics: nn and the primitives against plain C --------------------- */

static const char *numeric_script =
    "local x = input('x', {2, 3, 4})\n"
    "local t = input('t', {2, 3}, 'i32')\n"
    "local m = input('m', {2, 3})\n"
    "local w = input('w', {4})\n"
    "local b = input('b', {4})\n"
    "local W = input('W', {4, 5})\n"
    "local Y = input('Y', {1, 4, 5})\n"
    "output('softmax', nn.softmax(x, -1))\n"
    "output('lsm1', nn.log_softmax(x, 1))\n"
    "output('ln', nn.layernorm(x, w, b, 1e-5))\n"
    "output('rms', nn.rmsnorm(x, w, 1e-5))\n"
    "output('gelu', nn.gelu(x))\n"
    "output('ce', nn.cross_entropy(x, t))\n"
    "output('lse', x:logsumexp(-1))\n"
    "output('tk', take_along(x, t))\n"
    "output('cem', nn.cross_entropy(x, t, m))\n"
    "output('mm', x:matmul(W))\n"
    "output('mmb', matmul(x, Y))\n"
    "output('mmt', matmul(x, x, {tb = true}))\n"
    "output('tr', x:transpose(0, 2))\n"
    "output('sl', x:slice(-1, 1, 3))\n"
    "output('cat', concat({x, x:slice(2, 0, 1)}, -1))\n"
    "output('mx', x:max({0, -1}))\n"
    "output('mn', x:mean(1, true))\n"
    "output('sel', select(x:gt(0), x, -x))\n"
    "output('arith', 2 - x * 3 / (1 + x * x) ^ 2)\n"
    "local q = x:reshape{1, 2, 3, 4}\n"
    "output('rope', nn.rope(q, 10000))\n"
    "output('att', nn.attention(q, q, q))\n"
    "minimize(x:sum())\n";

static double X(int i, int j, int k) { return sin(1.0 + i * 12 + j * 4 + k) * 1.7; }

static void numeric_expect(const Graph *g, double **val, const char *name, const double *want,
                           int n)
{
    int t = ir_find_output(g, name);
    if (t < 0)
        fail_msg("no output %s", name);
    assert_int_equal(shape_numel(&g->t.v[t].s), n);
    for (int i = 0; i < n; i++)
        if (!(fabs(val[t][i] - want[i]) <= 1e-9 * (1 + fabs(want[i]))))
            fail_msg("%s[%d] = %.12g (expected %.12g)", name, i, val[t][i], want[i]);
}

static void set_input(const Graph *g, double **val, const char *name, const double *v)
{
    int t = ir_find_tensor(g, name);
    assert_true(t >= 0);
    size_t n = (size_t)shape_numel(&g->t.v[t].s);
    free(val[t]);
    val[t] = xmalloc(sizeof(double) * n);
    memcpy(val[t], v, sizeof(double) * n);
}

static void test_numerics(void **state)
{
    (void)state;
    char *dir = scratch_dir("fe");
    char path[512];
    snprintf(path, sizeof path, "%s/numeric.lua", dir);
    write_file(path, numeric_script);
    Model *mod = load_model(path, NULL, 0);
    Graph *g = mod->eval_g; /* the outputs are evaluation's; the step keeps the loss */
    assert_non_null(g);
    assert_true(ir_find_output(mod->g, "softmax") < 0 && ir_find_output(mod->g, "ce") >= 0);
    double **val = ir_interp_alloc(g);
    double x[24], t[6] = {0, 3, 1, 2, 2, 0}, m[6] = {1, 0, 1, 1, 0, 1}, w[4] = {1, 2, -1, 0.5},
           b[4] = {0, 0.1, 0.2, -0.3}, W[20], Y[20];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++)
                x[i * 12 + j * 4 + k] = X(i, j, k);
    for (int i = 0; i < 20; i++)
        W[i] = cos(i * 0.7), Y[i] = sin(i * 0.3) - 0.2;
    set_input(g, val, "x", x);
    set_input(g, val, "t", t);
    set_input(g, val, "m", m);
    set_input(g, val, "w", w);
    set_input(g, val, "b", b);
    set_input(g, val, "W", W);
    set_input(g, val, "Y", Y);
    InterpOpts o = {1, 0};
    ir_interp(g, val, &o);

    double sm[24], lsm1[24], ln[24], rms[24], gelu[24], mm[30], mmb[30], mmt[18], tr[24], sl[12],
        cat[30], mx[3], mn[8], sel[24], arith[24], rope[24], att[24];
    double ce = 0, cem = 0, msum = 0, lse[6], tk[6];
    for (int r = 0; r < 6; r++) { /* rows of the last axis */
        const double *v = x + 4 * r;
        double mxv = -INFINITY, s = 0, mu = 0, var = 0, ms = 0;
        for (int k = 0; k < 4; k++)
            mxv = fmax(mxv, v[k]), mu += v[k] / 4, ms += v[k] * v[k] / 4;
        for (int k = 0; k < 4; k++)
            s += exp(v[k] - mxv), var += (v[k] - mu) * (v[k] - mu) / 4;
        for (int k = 0; k < 4; k++) {
            sm[4 * r + k] = exp(v[k] - mxv) / s;
            ln[4 * r + k] = (v[k] - mu) / sqrt(var + 1e-5) * w[k] + b[k];
            rms[4 * r + k] = v[k] / sqrt(ms + 1e-5) * w[k];
        }
        lse[r] = mxv + log(s);
        tk[r] = v[(int)t[r]];
        double nll = -(v[(int)t[r]] - mxv - log(s));
        ce += nll / 6;
        cem += m[r] * nll;
        msum += m[r];
    }
    cem /= msum;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) {
            double mxv = -INFINITY, s = 0;
            for (int j = 0; j < 3; j++)
                mxv = fmax(mxv, X(i, j, k));
            for (int j = 0; j < 3; j++)
                s += exp(X(i, j, k) - mxv);
            for (int j = 0; j < 3; j++)
                lsm1[i * 12 + j * 4 + k] = X(i, j, k) - mxv - log(s);
        }
    for (int e = 0; e < 24; e++) {
        double v = x[e];
        gelu[e] = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        sel[e] = fabs(v);
        arith[e] = 2 - v * 3 / pow(1 + v * v, 2);
    }
    for (int r = 0; r < 6; r++)
        for (int n = 0; n < 5; n++) {
            double s1 = 0, s2 = 0;
            for (int k = 0; k < 4; k++)
                s1 += x[4 * r + k] * W[k * 5 + n], s2 += x[4 * r + k] * Y[k * 5 + n];
            mm[r * 5 + n] = s1;
            mmb[r * 5 + n] = s2;
        }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int l = 0; l < 3; l++) {
                double s = 0;
                for (int k = 0; k < 4; k++)
                    s += X(i, j, k) * X(i, l, k);
                mmt[i * 9 + j * 3 + l] = s;
            }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                tr[k * 6 + j * 2 + i] = X(i, j, k);
                if (k >= 1 && k < 3)
                    sl[i * 6 + j * 2 + (k - 1)] = X(i, j, k);
                cat[i * 15 + j * 5 + k] = X(i, j, k);
                cat[i * 15 + j * 5 + 4] = X(i, j, 0);
            }
    for (int j = 0; j < 3; j++) {
        mx[j] = -INFINITY;
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 4; k++)
                mx[j] = fmax(mx[j], X(i, j, k));
    }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++)
            mn[i * 4 + k] = (X(i, 0, k) + X(i, 1, k) + X(i, 2, k)) / 3;
    /* q = x as [1, H=2, T=3, D=4] */
    for (int h = 0; h < 2; h++)
        for (int tt = 0; tt < 3; tt++) {
            for (int i = 0; i < 2; i++) {
                double ang = tt * pow(10000, -2.0 * i / 4);
                double x1 = X(h, tt, i), x2 = X(h, tt, i + 2);
                rope[h * 12 + tt * 4 + i] = x1 * cos(ang) - x2 * sin(ang);
                rope[h * 12 + tt * 4 + i + 2] = x1 * sin(ang) + x2 * cos(ang);
            }
            double a[3], mxv = -INFINITY, s = 0;
            for (int u = 0; u <= tt; u++) {
                a[u] = 0;
                for (int k = 0; k < 4; k++)
                    a[u] += X(h, tt, k) * X(h, u, k) / 2.0;
                mxv = fmax(mxv, a[u]);
            }
            for (int u = 0; u <= tt; u++)
                s += exp(a[u] - mxv);
            for (int k = 0; k < 4; k++) {
                double y = 0;
                for (int u = 0; u <= tt; u++)
                    y += exp(a[u] - mxv) / s * X(h, u, k);
                att[h * 12 + tt * 4 + k] = y;
            }
        }
    numeric_expect(g, val, "softmax", sm, 24);
    numeric_expect(g, val, "lsm1", lsm1, 24);
    numeric_expect(g, val, "ln", ln, 24);
    numeric_expect(g, val, "rms", rms, 24);
    numeric_expect(g, val, "gelu", gelu, 24);
    numeric_expect(g, val, "ce", &ce, 1);
    numeric_expect(g, val, "lse", lse, 6);
    numeric_expect(g, val, "tk", tk, 6);
    numeric_expect(g, val, "cem", &cem, 1);
    numeric_expect(g, val, "mm", mm, 30);
    numeric_expect(g, val, "mmb", mmb, 30);
    numeric_expect(g, val, "mmt", mmt, 18);
    numeric_expect(g, val, "tr", tr, 24);
    numeric_expect(g, val, "sl", sl, 12);
    numeric_expect(g, val, "cat", cat, 30);
    numeric_expect(g, val, "mx", mx, 3);
    numeric_expect(g, val, "mn", mn, 8);
    numeric_expect(g, val, "sel", sel, 24);
    numeric_expect(g, val, "arith", arith, 24);
    numeric_expect(g, val, "rope", rope, 24);
    numeric_expect(g, val, "att", att, 24);
    ir_interp_free(g, val);
    fe_model_free(mod);
    free(dir);
}

/* The ops of issue 19 built from the primitives (nn.lua) and the new
 * primitives (erf, floor, pad, // and % on tensors), against values
 * computed here; ties in argmax/topk pick the first index. */
static const char new_ops_script[] =
    "local x = input('x', {2, 6}, 'f32')\n"
    "local n = input('n', {2, 6}, 'i32')\n"
    "local w = param('w', {6}, ones())\n"
    "output('gelu', nn.gelu_exact(x))\n"
    "output('softplus', nn.softplus(x * 30))\n"
    "output('lse', nn.logsumexp(x, -1))\n"
    "output('fdiv', n // 4)\n"
    "output('fmod', n % 4)\n"
    "output('fdivn', n // -4)\n"
    "output('fmodn', n % -4)\n"
    "output('ndivn', n // (n * 0 + 3))\n"
    "output('xf', x // 0.5)\n"
    "output('xm', x % 0.5)\n"
    "output('hot', nn.one_hot(n:slice(1, 0, 1):reshape({2}) % 6, 6))\n"
    "output('am', nn.argmax(x))\n"
    "local v, i = nn.topk(x, 3)\n"
    "output('tv', v)\n"
    "output('ti', i)\n"
    "output('cs', nn.cumsum(x))\n"
    "output('s2', nn.split(x, {2, 4}, -1)[2])\n"
    "output('ch', nn.chunk(x, 4, -1)[3])\n"
    "output('pd', x:pad(1, 1, 2, -1))\n"
    "output('sq', nn.squeeze(nn.unsqueeze(x, 0), 0))\n"
    "minimize((x * w):sum())\n";

static void test_new_ops(void **state)
{
    (void)state;
    char *dir = scratch_dir("fe");
    char path[512];
    snprintf(path, sizeof path, "%s/new_ops.lua", dir);
    write_file(path, new_ops_script);
    Model *mod = load_model(path, NULL, 0);
    Graph *g = mod->eval_g; /* the outputs are evaluation's; the step keeps the loss */
    double **val = ir_interp_alloc(g);
    double x[12] = {0.3, -1.2, 2.5, 2.5, -0.75, 0.1, -2.0, 1.0, 0.0, 3.25, -0.2, 1.0};
    double n[12] = {7, -7, 8, -8, 0, 1, 3, -1, 13, -13, 5, 2};
    set_input(g, val, "x", x);
    set_input(g, val, "n", n);
    set_input(g, val, "w", n);
    InterpOpts o = {1, 0};
    ir_interp(g, val, &o);
    double gelu[12], sp[12], lse[2] = {0, 0}, fdiv[12], fmod_[12], fdivn[12], fmodn[12],
        ndivn[12], xf[12], xm[12], hot[12] = {0}, am[2], tv[6], ti[6], cs[12], s2[8], ch[4],
        pd[18];
    for (int e = 0; e < 12; e++) {
        double v = x[e], z = 30 * v, k = n[e];
        gelu[e] = 0.5 * v * (1 + erf(v / sqrt(2)));
        sp[e] = z > 0 ? z + log1p(exp(-z)) : log1p(exp(z));
        fdiv[e] = floor(k / 4), fmod_[e] = k - 4 * floor(k / 4);
        fdivn[e] = floor(k / -4), fmodn[e] = k + 4 * floor(k / -4);
        ndivn[e] = floor(k / 3);
        xf[e] = floor(v / 0.5), xm[e] = v - 0.5 * floor(v / 0.5);
    }
    for (int r = 0; r < 2; r++) {
        const double *v = x + 6 * r;
        double m = -INFINITY, s = 0, c = 0;
        for (int k = 0; k < 6; k++)
            m = fmax(m, v[k]);
        for (int k = 0; k < 6; k++)
            s += exp(v[k] - m);
        lse[r] = m + log(s);
        int nn0 = (int)n[6 * r];
        hot[6 * r + ((nn0 % 6) + 6) % 6] = 1;
        bool used[6] = {false};
        for (int j = 0; j < 3; j++) { /* topk: the first of equal values first */
            int b = -1;
            for (int k = 0; k < 6; k++)
                if (!used[k] && (b < 0 || v[k] > v[b]))
                    b = k;
            used[b] = true;
            tv[3 * r + j] = v[b], ti[3 * r + j] = b;
        }
        am[r] = ti[3 * r];
        for (int k = 0; k < 6; k++) {
            c += v[k];
            cs[6 * r + k] = c;
        }
        for (int k = 0; k < 4; k++)
            s2[4 * r + k] = v[2 + k];
        ch[2 * r] = v[4], ch[2 * r + 1] = v[5]; /* chunk 4 of 6: pieces of 2, the third */
        pd[9 * r] = -1, pd[9 * r + 7] = -1, pd[9 * r + 8] = -1;
        for (int k = 0; k < 6; k++)
            pd[9 * r + 1 + k] = v[k];
    }
    numeric_expect(g, val, "gelu", gelu, 12);
    numeric_expect(g, val, "softplus", sp, 12);
    numeric_expect(g, val, "lse", lse, 2);
    numeric_expect(g, val, "fdiv", fdiv, 12);
    numeric_expect(g, val, "fmod", fmod_, 12);
    numeric_expect(g, val, "fdivn", fdivn, 12);
    numeric_expect(g, val, "fmodn", fmodn, 12);
    numeric_expect(g, val, "ndivn", ndivn, 12);
    numeric_expect(g, val, "xf", xf, 12);
    numeric_expect(g, val, "xm", xm, 12);
    numeric_expect(g, val, "hot", hot, 12);
    numeric_expect(g, val, "am", am, 2);
    numeric_expect(g, val, "tv", tv, 6);
    numeric_expect(g, val, "ti", ti, 6);
    numeric_expect(g, val, "cs", cs, 12);
    numeric_expect(g, val, "s2", s2, 8);
    numeric_expect(g, val, "pd", pd, 18);
    numeric_expect(g, val, "sq", x, 12);
    numeric_expect(g, val, "ch", ch, 4);
    ir_interp_free(g, val);
    fe_model_free(mod);
    free(dir);
}

/* dropout: p = 0 adds nothing; p > 0 adds one random op per call, each with
 * its own key, and keeps about 1-p of the elements scaled by 1/(1-p). */
static void test_dropout(void **state)
{
    (void)state;
    char *dir = scratch_dir("fe");
    char path[512];
    snprintf(path, sizeof path, "%s/drop.lua", dir);
    write_file(path, "local x = input('x', {64, 64})\n"
                     "assert(nn.dropout(x, 0) == x)\n"
                     "output('a', nn.dropout(x, 0.25), {train = true})\n"
                     "output('b', nn.dropout(x, 0.25), {train = true})\n"
                     "assert(select('#', 1, 2, 3) == 3)\n" /* Lua's own select still works */
                     "minimize(x:sum())\n");
    Model *mod = load_model(path, NULL, 0);
    Graph *g = mod->g;
    int keys[2], nk = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_RANDOM) {
            assert_true(nk < 2);
            keys[nk++] = (int)g->ops.v[i].attr.ia[0];
        }
    assert_int_equal(nk, 2);
    assert_int_not_equal(keys[0], keys[1]);
    double **val = ir_interp_alloc(g);
    double *x = xmalloc(sizeof(double) * 4096);
    for (int i = 0; i < 4096; i++)
        x[i] = 1.0;
    set_input(g, val, "x", x);
    free(x);
    InterpOpts o = {7, 3};
    ir_interp(g, val, &o);
    const double *a = val[ir_find_output(g, "a")], *b = val[ir_find_output(g, "b")];
    int kept = 0, differ = 0;
    for (int i = 0; i < 4096; i++) {
        assert_true(a[i] == 0 || fabs(a[i] - 1 / 0.75) < 1e-12);
        kept += a[i] != 0;
        differ += (a[i] != 0) != (b[i] != 0);
    }
    assert_true(kept > 2900 && kept < 3250);
    assert_true(differ > 500);
    ir_interp_free(g, val);
    fe_model_free(mod);
    free(dir);
}

/* Strict options (issue 42): every nn function and DSL function that takes
 * an options table refuses a misspelled key at the user's line, naming the
 * function, the key, the closest accepted key and the list; a wrong value
 * type, an option documented but not implemented, a non-table and a
 * positional entry are errors too. Every nn function of frontend/nn.lua
 * with an `opts` argument must have a case here. */
static void test_strict_options(void **state)
{
    (void)state;
    static const struct {
        const char *fn, *call, *words[4];
    } cases[] = {
        {"nn.Linear", "nn.Linear('fc', 8, 4, {bais = false, sdt = 0.5})",
         {"nn.Linear: unknown option 'bais'", "did you mean 'bias'?", "bias, std, init"}},
        {"nn.Linear", "nn.Linear('fc', 8, 4, {bias = 0})",
         {"nn.Linear: option 'bias' must be true or false", "got 0"}},
        {"nn.Linear", "nn.Linear('fc', 8, 4, {std = '0.5'})",
         {"option 'std' must be a number", "got the string '0.5'"}},
        {"nn.Linear", "nn.Linear('fc', 8, 4, {init = 0.02})",
         {"option 'init' must be an initializer"}},
        {"nn.Linear", "nn.Linear('fc', 8, 4, false)",
         {"nn.Linear: options must be a table", "got boolean", "bias, std, init"}},
        {"nn.LayerNorm", "nn.LayerNorm('ln', 8, {esp = 1e-6})",
         {"nn.LayerNorm: unknown option 'esp'", "did you mean 'eps'?", "bias, eps"}},
        {"nn.LayerNorm", "nn.LayerNorm('ln', 8, {false})",
         {"nn.LayerNorm: options are named", "number key 1"}},
        {"nn.RMSNorm", "nn.RMSNorm('rn', 8, {epsilon = 1e-6})",
         {"nn.RMSNorm: unknown option 'epsilon'", "did you mean 'eps'?"}},
        {"nn.Embedding", "nn.Embedding('wte', 16, 8, {pda = 64})",
         {"nn.Embedding: unknown option 'pda'", "did you mean 'pad'?", "std, pad, init"}},
        {"nn.Embedding", "nn.Embedding('wte', 16, 8, {pad = 2.5})",
         {"option 'pad' must be an integer", "got 2.5"}},
        {"nn.CausalSelfAttention", "nn.CausalSelfAttention('attn', 8, 2, {dropuot = 0.1})",
         {"nn.CausalSelfAttention: unknown option 'dropuot'", "did you mean 'dropout'?"}},
        {"nn.CausalSelfAttention", "nn.CausalSelfAttention('attn', 8, 2, {mask = 'no'})",
         {"nn.CausalSelfAttention: option 'mask' must be a tensor", "got the string 'no'"}},
        {"nn.CausalSelfAttention", "nn.CausalSelfAttention('attn', 8, 2, {kv_heads = 3})",
         {"nn.CausalSelfAttention: kv_heads must divide the 2 heads", "got kv_heads = 3"}},
        {"nn.MLP", "nn.MLP('mlp', 8, 32, {activation = nn.silu})",
         {"nn.MLP: unknown option 'activation'", "did you mean 'act'?"}},
        {"nn.MLP", "nn.MLP('mlp', 8, 32, {act = 'relu'})",
         {"option 'act' must be a function", "got the string 'relu'"}},
        {"nn.SwiGLU", "nn.SwiGLU('mlp', 8, 32, {proj_sdt = 0.1})",
         {"nn.SwiGLU: unknown option 'proj_sdt'", "did you mean 'proj_std'?"}},
        {"nn.attention", "nn.attention(h, h, h, {casual = false})",
         {"nn.attention: unknown option 'casual'", "did you mean 'causal'?", "causal, dropout"}},
        {"nn.attention", "nn.attention(h, h, h, {causal = true, window = 4, mask = 'nonsense'})",
         {"nn.attention: option 'mask' must be a tensor", "got the string 'nonsense'"}},
        {"nn.attention", "nn.attention(h, h, h, {mask = x})",
         {"nn.attention: mask must be a u8 tensor (1: keep) broadcastable to the scores "
          "[2,2,8,8]", "got f32[4,8]"}},
        {"nn.attention", "nn.attention(h, h, h, {bias = t})",
         {"nn.attention: bias must be a float tensor", "got i32[4]"}},
        {"nn.attention", "nn.attention(h4, h, h, {kv_heads = 1})",
         {"nn.attention: kv_heads = 1 does not match k and v",
          "expected 1 key/value heads", "got k f32[2,2,8,4]"}},
        {"nn.attention", "nn.attention(h, h, h, {kv_heads = 1.5})",
         {"option 'kv_heads' must be an integer", "got 1.5"}},
        {"nn.attention", "nn.attention(h, h, h, {causal = false, window = 4})",
         {"nn.attention: window needs causal attention", "causal = false"}},
        /* more key/value heads than query heads: said plainly, not matmul's
         * broadcast error (fewer that divide q's are grouped-query) */
        {"nn.attention", "nn.attention(h, h4, h4)",
         {"nn.attention: q, k and v must have the same leading dims", "got q f32[2,2,8,4], k f32[2,4,8,4]",
          "fewer key/value heads that divide q's"}},
        {"nn.cross_entropy", "nn.cross_entropy(x, t, nil, {clases = 4})",
         {"nn.cross_entropy: unknown option 'clases'", "did you mean 'classes'?"}},
        {"nn.cross_entropy", "nn.cross_entropy(x, t, {classes = 4})",
         {"nn.cross_entropy: mask", "must be a tensor or nil", "fourth argument"}},
        {"nn.Conv1d", "nn.Conv1d('c', 1, 4, 3, {stirde = 2})",
         {"nn.Conv1d: unknown option 'stirde'", "did you mean 'stride'?",
          "stride, padding, dilation, groups, bias, init"}},
        {"nn.Conv2d", "nn.Conv2d('c', 2, 4, 3, {paddding = 1})",
         {"nn.Conv2d: unknown option 'paddding'", "did you mean 'padding'?"}},
        {"nn.Conv2d", "nn.Conv2d('c', 2, 4, 3, {stride = 'two'})",
         {"nn.Conv2d: option 'stride' must be an integer or a table of integers",
          "the string 'two'"}},
        {"nn.Conv2d", "nn.Conv2d('c', 2, 4, 3, {padding = {1, 0.5}})",
         {"option 'padding' must be an integer or a table of integers"}},
        {"nn.Conv2d", "nn.Conv2d('c', 2, 4, 3, {groups = 3})",
         {"nn.Conv2d: groups must divide in_channels and out_channels", "groups 3"}},
        {"nn.Conv2d", "nn.Conv2d('c', 3, 4, 3)(h)",
         {"nn.Conv2d: x has 2 channels (expected 3", "f32[2,2,8,4]"}},
        {"nn.conv1d", "nn.conv1d(x:reshape{4, 1, 8}, h, nil, {dilaton = 2})",
         {"nn.conv1d: unknown option 'dilaton'", "did you mean 'dilation'?"}},
        {"nn.conv2d", "nn.conv2d(h, h, nil, {group = 2})",
         {"nn.conv2d: unknown option 'group'", "did you mean 'groups'?"}},
        {"nn.max_pool2d", "nn.max_pool2d(h, 2, {strides = 2})",
         {"nn.max_pool2d: unknown option 'strides'", "did you mean 'stride'?"}},
        {"nn.avg_pool2d", "nn.avg_pool2d(h, 2, {pading = 1})",
         {"nn.avg_pool2d: unknown option 'pading'", "did you mean 'padding'?"}},
        {"nn.MaxPool2d", "nn.MaxPool2d(2, {dilation = 2})",
         {"nn.MaxPool2d: unknown option 'dilation'", "accepted keys: stride, padding"}},
        {"nn.MaxPool2d", "nn.MaxPool2d(2, {padding = 2})(h)",
         {"nn.MaxPool2d: padding must be at most half the kernel"}},
        {"nn.AvgPool2d", "nn.AvgPool2d(2, {count_include_pad = false})",
         {"nn.AvgPool2d: unknown option 'count_include_pad'"}},
        {"nn.GroupNorm", "nn.GroupNorm('gn', 2, 8, {esp = 1e-6})",
         {"nn.GroupNorm: unknown option 'esp'", "did you mean 'eps'?", "eps, affine"}},
        {"nn.GroupNorm", "nn.GroupNorm('gn', 2, 4)(h)",
         {"nn.GroupNorm: x must be [N, 4, ...]", "got f32[2,2,8,4]"}},
        {"nn.BatchNorm", "nn.BatchNorm('bn', 8, {momentun = 0.01})",
         {"nn.BatchNorm: unknown option 'momentun'", "did you mean 'momentum'?",
          "eps, momentum, affine"}},
        {"nn.BatchNorm", "nn.BatchNorm('bn', 3)(h)",
         {"nn.BatchNorm: x must be [N, 3], [N, 3, L] or [N, 3, H, W]", "got f32[2,2,8,4]"}},
        {"matmul", "matmul(x, x, {tB = true})",
         {"matmul: unknown option 'tB'", "did you mean 'tb'?", "ta, tb"}},
        {"output", "output('y', x, {trian = true})",
         {"output: unknown option 'trian'", "did you mean 'train'?"}},
        {"output", "output('y', x, {train = 1})", {"option 'train' must be true or false", "got 1"}},
        /* a list argument with a named key would read as shorter */
        {"", "input('y', {B = 4, T = 8})", {"input: the shape must be a list", "the key 'B'"}},
        {"", "x:sum({axis = 1})", {"sum: the axes must be a list", "the key 'axis'"}},
        {"", "concat({x, x, axis = 1})", {"concat: the tensors must be a list", "the key 'axis'"}},
    };
    char *dir = scratch_dir("fe-opts");
    char path[512], prefix[600];
    snprintf(path, sizeof path, "%s/opts.lua", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = xasprintf("local x = input('x', {4, 8})\n"
                               "local h = input('h', {2, 2, 8, 4})\n"
                               "local t = input('t', {4}, 'i32'); local h4 = input('h4', {2, 4, 8, 4})\n"
                               "local r = %s\n"
                               "minimize(x:sum())\n", cases[i].call);
        write_file(path, text);
        free(text);
        const char *msg = load_err(path, NULL, 0);
        snprintf(prefix, sizeof prefix, "%s:4: ", path);
        if (strncmp(msg, prefix, strlen(prefix)) != 0)
            fail_msg("%s: expected the message to start with '%s', got: %s", cases[i].call,
                     prefix, msg);
        for (int k = 0; k < 4 && cases[i].words[k]; k++)
            expect_has(msg, cases[i].words[k]);
    }
    /* every nn function of the library that takes opts has a case above */
    char *lib = read_file("frontend/nn.lua");
    assert_non_null(lib);
    int checked = 0;
    for (char *p = strstr(lib, "\nfunction nn."); p; p = strstr(p + 1, "\nfunction nn.")) {
        char *name = p + 10, *paren = strchr(name, '('), *close = paren ? strchr(paren, ')') : NULL;
        assert_non_null(close);
        char *opts = strstr(paren, "opts");
        if (!opts || opts > close)
            continue;
        bool found = false;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !found; i++)
            found = strlen(cases[i].fn) == (size_t)(paren - name) &&
                    strncmp(cases[i].fn, name, (size_t)(paren - name)) == 0;
        if (!found)
            fail_msg("%.*s takes opts but test_strict_options has no case for it",
                     (int)(paren - name), name);
        checked++;
    }
    assert_true(checked >= 8);
    free(lib);
    /* the valid options still work, and bias = false drops the bias */
    write_file(path, "local x = input('x', {4, 8})\n"
                     "local fc = nn.Linear('fc', 8, 4, {bias = false, std = 0.5, init = zeros()})\n"
                     "local y = nn.MLP('mlp', 4, 8, {act = nn.Linear('a', 8, 8), dropout = 0})(fc(x))\n"
                     "output('y', matmul(y, y, {tb = 1}), {train = false})\n"
                     "minimize(y:sum())\n");
    Model *m = load_model(path, NULL, 0);
    assert_true(ir_find_tensor(m->g, "fc.weight") >= 0);
    assert_true(ir_find_tensor(m->g, "fc.bias") < 0);
    fe_model_free(m);
    remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_model_loads),
        cmocka_unit_test(test_model_outputs),
        cmocka_unit_test(test_gpt2_124m),
        cmocka_unit_test(test_set_overrides),
        cmocka_unit_test(test_bad_scripts),
        cmocka_unit_test(test_settings_printed),
        cmocka_unit_test(test_sandbox),
        cmocka_unit_test(test_sandbox_memory_sweep),
        cmocka_unit_test(test_setting_ranges),
        cmocka_unit_test(test_numerics),
        cmocka_unit_test(test_new_ops),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_strict_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
