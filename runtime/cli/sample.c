/* sample.c - `kiln sample`: its flags onto SampleOpts, and the decode
 * graphs from the model script (runtime/train/sample.c does the work). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_cuda.h"
#include "cli.h"
#include "codegen.h"
#include "cpu.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

static const char usage[] =
    "usage: kiln sample MODEL.lua --init-from W (--prompt TEXT | --prompt-tokens FILE)\n"
    "                   [options]\n"
    "\n"
    "Continues the prompt with a language model (input tokens i32[B,T], output\n"
    "logits [B,T,V]) and the weights W, one token at a time: through a compiled\n"
    "prefill and one-token step with a KV cache when the model's attention is\n"
    "nn.attention (nn.CausalSelfAttention), else by the full forward over the\n"
    "window at every token; it says which on standard error. B samples run\n"
    "together (--set batch=N). See docs/inference.md.\n"
    "\n"
    "options:\n"
    "  --init-from W        the weights (required)\n"
    "  --prompt TEXT        the prompt's bytes (byte-level models, V <= 256)\n"
    "  --prompt-tokens FILE the prompt as token ids (integers separated by white\n"
    "                       space or commas)\n"
    "  --max-new-tokens N   tokens to add per sample (default 100)\n"
    "  --temperature X      softmax temperature, >= 0 (default 1; 0: greedy, the\n"
    "                       argmax)\n"
    "  --top-k K            draw from the K most likely tokens (default 0: all)\n"
    "  --top-p P            draw from the most likely tokens whose probability\n"
    "                       reaches P, in (0, 1] (default 1)\n"
    "  --seed S             the draws' seed (default 1337); sample i draws from\n"
    "                       its own stream of (S, i), whatever the batch\n"
    "  --num-samples N      samples (default 1)\n"
    "  --stream             print each sample's tokens as they come (one sample a\n"
    "                       run)\n"
    "  --tokenizer FILE     print tokens through llm.c's GPT-2 tokenizer file\n"
    "                       (gpt2_tokenizer.bin); without it a byte-level model\n"
    "                       prints bytes, others token ids\n"
    "  --ids                print token ids (\"sample N: ID ID ...\", the new tokens)\n"
    "  --no-kv-cache        the full forward at every token, even where a KV cache\n"
    "                       would serve\n"
    "  --set KEY=VALUE      override a config{} or train{} setting (repeatable)\n"
    "  --device DEV         cpu (default), cuda, auto\n"
    "  --threads N          CPU threads, 1..256 (default: one per core)\n"
    "  --cache-dir DIR      compiled-kernel cache\n"
    "  -v, --verbose        log compilation details\n"
    "  -q, --quiet          print the samples only\n"
    "  -h, --help           this text\n";

static int bad(const char *msg, const char *arg)
{
    fprintf(stderr, "kiln sample: %s: %s\n(see `kiln sample --help`)\n", msg, arg);
    return 2;
}

/* A finite number from s, in [lo, hi] (lo_open: lo excluded). */
static bool number(const char *s, double lo, double hi, bool lo_open, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !isfinite(v) || v < lo || v > hi || (lo_open && v == lo))
        return false;
    *out = v;
    return true;
}

/* The T of m's tokens input (its dim 1), 0 when it has none. */
static int64_t window_of(const Model *m)
{
    const Graph *g = m->eval_g ? m->eval_g : m->g;
    int t = ir_find_tensor(g, "tokens");
    return t >= 0 && g->t.v[t].s.rank == 2 ? g->t.v[t].s.dim[1] : 0;
}

int cli_sample(int argc, char **argv)
{
    SampleOpts o = {.max_new_tokens = 100, .num_samples = 1, .temperature = 1, .top_p = 1,
                    .seed = 1337};
    VEC(const char *) sets = {0};
    const char *model = NULL;
    int rc = 2;
    char why[256];
    for (int i = 2; i < argc; i++) {
        const char *v;
        int64_t n;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            rc = 0;
            goto out;
        } else if ((v = cli_flag_value(argc, argv, &i, "--init-from"))) {
            if (!*v) {
                rc = bad("--init-from expects a weights file, got", "an empty value");
                goto out;
            }
            o.init_from = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--prompt-tokens"))) {
            o.prompt_tokens = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--prompt"))) {
            o.prompt = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tokenizer"))) {
            o.tokenizer = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--max-new-tokens"))) {
            if (!fe_parse_int(v, 1, 1 << 24, &n, why, sizeof why)) {
                rc = bad("--max-new-tokens", why);
                goto out;
            }
            o.max_new_tokens = n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--num-samples"))) {
            if (!fe_parse_int(v, 1, 1 << 24, &n, why, sizeof why)) {
                rc = bad("--num-samples", why);
                goto out;
            }
            o.num_samples = n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--top-k"))) {
            if (!fe_parse_int(v, 0, INT32_MAX, &n, why, sizeof why)) {
                rc = bad("--top-k", why);
                goto out;
            }
            o.top_k = n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--seed"))) {
            if (!fe_parse_int(v, 0, INT64_MAX, &n, why, sizeof why)) {
                rc = bad("--seed", why);
                goto out;
            }
            o.seed = (uint64_t)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--temperature"))) {
            if (!number(v, 0, 1e6, false, &o.temperature)) {
                snprintf(why, sizeof why, "expected a number >= 0 (0: greedy), got '%s'", v);
                rc = bad("--temperature", why);
                goto out;
            }
        } else if ((v = cli_flag_value(argc, argv, &i, "--top-p"))) {
            if (!number(v, 0, 1, true, &o.top_p)) {
                snprintf(why, sizeof why, "expected a number in (0, 1], got '%s'", v);
                rc = bad("--top-p", why);
                goto out;
            }
        } else if ((v = cli_flag_value(argc, argv, &i, "--set"))) {
            vec_push(&sets, v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--device"))) {
            o.device = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads"))) {
            if (!fe_parse_int(v, 1, 256, &n, why, sizeof why)) {
                rc = bad("--threads", why);
                goto out;
            }
            o.threads = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cache-dir"))) {
            o.cache_dir = v;
        } else if (strcmp(argv[i], "--stream") == 0) {
            o.stream = true;
        } else if (strcmp(argv[i], "--ids") == 0) {
            o.ids = true;
        } else if (strcmp(argv[i], "--no-kv-cache") == 0) {
            o.no_kv_cache = true;
        } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0) {
            o.verbose = true;
        } else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            o.quiet = true;
        } else if (argv[i][0] == '-') {
            rc = bad("unknown option", argv[i]);
            goto out;
        } else if (!model) {
            model = argv[i];
        } else {
            rc = bad("more than one model given", argv[i]);
            goto out;
        }
    }
    if (!model) {
        rc = bad("missing argument", "MODEL.lua");
        goto out;
    }
    if (!o.init_from) {
        rc = bad("missing option", "--init-from W (the weights to run)");
        goto out;
    }
    if (!o.prompt == !o.prompt_tokens) {
        rc = bad(o.prompt ? "both given, expected one" : "missing option",
                 "--prompt TEXT or --prompt-tokens FILE");
        goto out;
    }
    char err[2048];
    Model *m = fe_load_model(model, sets.v, sets.n, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        rc = 1;
        goto out;
    }
    cli_print_warnings(m);
    /* the decode graphs: the script again in decode mode, S = T and S = 1 */
    Graph *pre = NULL, *one = NULL;
    char derr[2048] = "";
    int64_t T = window_of(m);
    if (T > 0 && !o.no_kv_cache) {
        int n1 = 0, n2 = 0;
        pre = fe_load_decode(model, sets.v, sets.n, T, &n1, derr, sizeof derr);
        if (pre && T > 1)
            one = fe_load_decode(model, sets.v, sets.n, 1, &n2, derr, sizeof derr);
        o.ncaches = n1 < n2 ? n1 : n2;
        if (T == 1) {
            snprintf(derr, sizeof derr, "the window is one token (T = 1)");
            o.decode_why = derr;
        } else if (!pre || !one) {
            for (char *c = derr; *c; c++) /* one line */
                if (*c == '\n')
                    *c = ' ';
            char msg[2200];
            snprintf(msg, sizeof msg, "the script fails in decode mode: %s", derr);
            snprintf(derr, sizeof derr, "%.2000s", msg);
            o.decode_why = derr;
        }
    }
    o.prefill_g = pre;
    o.step_g = one;
    rt_stop_on_signals();
    rc = rt_sample(m, &o);
    ir_free(pre);
    ir_free(one);
    fe_model_free(m);
out:
    vec_free(&sets);
    return rc;
}

bool cli_print_decode_prediction(const Model *m, const char *path, const char *const *sets,
                                 int nsets, const char *target, int threads,
                                 const char *cache_dir)
{
    int64_t T = window_of(m);
    if (T < 2)
        return true; /* not a language model: nothing to say */
    char err[2048];
    int ncaches = 0;
    Graph *g = fe_load_decode(path, sets, nsets, 1, &ncaches, err, sizeof err);
    if (!g || ncaches == 0) {
        printf("decode step: none (%s): kiln sample reruns the full forward per token\n",
               g ? "the script's attention keeps no KV cache" : "the script fails in decode mode");
        ir_free(g);
        return true;
    }
    Diag d = {{0}};
    PassOpts po;
    rt_pass_opts(&m->train, NULL, &po);
    bool ok = pass_simplify(g, &po, &d) && pass_fuse(g, &po, &d) && pass_schedule(g, &po, &d);
    CgDevice cpu;
    const CgDevice *dev = cg_device_find(target);
    if (ok && !dev) { /* "cpu" */
        ok = rt_cpu_device(threads, cache_dir, false, false, &cpu, &d);
        dev = &cpu;
    }
    CgPlan *p = ok ? cg_plan(g, &d) : NULL;
    if (!p) {
        fprintf(stderr, "kiln: --target %s: the decode step: %s\n", target, d.msg);
        ir_free(g);
        return false;
    }
    CgPredictOpts o = cli_predict_opts(m, dev);
    CgCudaProgram *q = dev->gpu ? cg_cuda_program(p, o.bf16) : NULL;
    CgPrediction *r = cg_predict(p, q, dev, &o);
    int tk = ir_find_tensor(g, "tokens");
    int64_t B = tk >= 0 ? g->t.v[tk].s.dim[0] : 1;
    printf("predicted decode step on %s (kiln sample's one-token step with a KV cache: %lld "
           "row%s, %d cache tensors of %lld positions): %.1f us per step, %.0f tokens/s, "
           "%d launches\n", dev->name, (long long)B, B == 1 ? "" : "s", ncaches, (long long)T,
           r->step_s * 1e6, (double)B / r->step_s, r->launches);
    cg_prediction_free(r);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    ir_free(g);
    return true;
}
