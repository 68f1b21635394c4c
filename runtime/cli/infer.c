/* infer.c - `kiln eval` and `kiln predict`: their flags, onto InferOpts
 * (runtime/train/infer.c does the work). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "frontend.h"
#include "runtime.h"
#include "train.h"

static const char usage_eval[] =
    "usage: kiln eval MODEL.lua --init-from W [options]\n"
    "\n"
    "Runs the model's evaluation step (forward only, dropout off) with the\n"
    "weights W over every example of the validation split of its data, or of\n"
    "--data-path P, in batches; the last batch is padded and masked, never\n"
    "dropped. Prints the loss and every extra scalar output, averaged exactly\n"
    "over the examples (tokens, for token data), and accuracy where training\n"
    "reports it. See docs/inference.md.\n"
    "\n"
    "options:\n"
    "  --init-from W        the weights: a safetensors file of kiln train\n"
    "                       --save-weights or a checkpoint (required)\n"
    "  --data-path P        evaluate every example of P (a text or token file,\n"
    "                       or a .safetensors file / .npy directory for data\n"
    "                       tensors) instead of the validation split\n"
    "  --set KEY=VALUE      override a config{} or train{} setting (repeatable):\n"
    "                       val_path, val_fraction, data_path choose the split\n"
    "  --log-dir DIR        also write DIR/eval.jsonl (one JSON line)\n"
    "  --device DEV         cpu (default), cuda, auto\n"
    "  --threads N          CPU threads, 1..256 (default: one per core)\n"
    "  --cache-dir DIR      compiled-kernel cache\n"
    "  --allow-nonfinite-data  data tensors: accept NaN and Inf in float arrays\n"
    "  -v, --verbose        log compilation details\n"
    "  -q, --quiet          print only the result line\n"
    "  -h, --help           this text\n";

static const char usage_predict[] =
    "usage: kiln predict MODEL.lua --init-from W --data-path P --outputs NAME[,NAME]\n"
    "                    --out FILE\n"
    "\n"
    "Runs the model's evaluation step with the weights W over every example of\n"
    "P, in file order, and writes the named outputs (the script's output(...)\n"
    "tensors, one row per example: logits f32[B,T,V] gives [N,T,V]) with the\n"
    "last batch's padding removed. See docs/inference.md.\n"
    "\n"
    "options:\n"
    "  --init-from W        the weights (required)\n"
    "  --data-path P        the examples (required): a text or token file (one\n"
    "                       example per window of T tokens), or a .safetensors\n"
    "                       file / .npy directory with an array per model input\n"
    "                       its outputs read (labels may be left out)\n"
    "  --outputs A,B        the outputs to write (required)\n"
    "  --out FILE           FILE.safetensors, or DIR/ (ending in '/': a new or\n"
    "                       empty directory) for one NAME.npy per output;\n"
    "                       written whole or not at all (required)\n"
    "  --set KEY=VALUE      override a config{} or train{} setting (repeatable)\n"
    "  --device DEV         cpu (default), cuda, auto\n"
    "  --threads N          CPU threads, 1..256 (default: one per core)\n"
    "  --cache-dir DIR      compiled-kernel cache\n"
    "  --allow-nonfinite-data  data tensors: accept NaN and Inf in float arrays\n"
    "  -v, --verbose        log compilation details\n"
    "  -q, --quiet          print nothing but errors\n"
    "  -h, --help           this text\n";

static int bad(const char *cmd, const char *msg, const char *arg)
{
    fprintf(stderr, "kiln %s: %s: %s\n(see `kiln %s --help`)\n", cmd, msg, arg, cmd);
    return 2;
}

/* Both commands' flags; predict: whether --outputs and --out are theirs. */
static int run(int argc, char **argv, bool predict)
{
    const char *cmd = predict ? "predict" : "eval";
    InferOpts o = {0};
    VEC(const char *) sets = {0};
    VEC(const char *) outs = {0};
    char *outlist = NULL;
    const char *model = NULL;
    int rc = 2;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(predict ? usage_predict : usage_eval, stdout);
            rc = 0;
            goto out;
        } else if ((v = cli_flag_value(argc, argv, &i, "--init-from"))) {
            if (!*v) {
                rc = bad(cmd, "--init-from expects a weights file, got", "an empty value");
                goto out;
            }
            o.init_from = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--data-path"))) {
            o.data_path = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--set"))) {
            vec_push(&sets, v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--device"))) {
            o.device = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads"))) {
            int64_t n;
            char why[256];
            if (!fe_parse_int(v, 1, 256, &n, why, sizeof why)) {
                rc = bad(cmd, "--threads", why);
                goto out;
            }
            o.threads = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cache-dir"))) {
            o.cache_dir = v;
        } else if (!predict && (v = cli_flag_value(argc, argv, &i, "--log-dir"))) {
            if (!*v) {
                rc = bad(cmd, "--log-dir expects a directory, got", "an empty value");
                goto out;
            }
            o.log_dir = v;
        } else if (predict && (v = cli_flag_value(argc, argv, &i, "--outputs"))) {
            free(outlist);
            outlist = xstrdup(v);
            outs.n = 0;
            for (char *p = outlist, *e; p; p = e) {
                if ((e = strchr(p, ',')))
                    *e++ = 0;
                if (!*p) {
                    rc = bad(cmd, "--outputs expects NAME[,NAME...], got", v);
                    goto out;
                }
                vec_push(&outs, p);
            }
        } else if (predict && (v = cli_flag_value(argc, argv, &i, "--out"))) {
            if (!*v) {
                rc = bad(cmd, "--out expects FILE.safetensors or DIR/, got", "an empty value");
                goto out;
            }
            o.out = v;
        } else if (strcmp(argv[i], "--allow-nonfinite-data") == 0) {
            o.allow_nonfinite_data = true;
        } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0) {
            o.verbose = true;
        } else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            o.quiet = true;
        } else if (argv[i][0] == '-') {
            rc = bad(cmd, "unknown option", argv[i]);
            goto out;
        } else if (!model) {
            model = argv[i];
        } else {
            rc = bad(cmd, "more than one model given", argv[i]);
            goto out;
        }
    }
    if (!model) {
        rc = bad(cmd, "missing argument", "MODEL.lua");
        goto out;
    }
    if (!o.init_from) {
        rc = bad(cmd, "missing option", "--init-from W (the weights to run)");
        goto out;
    }
    if (predict && !o.data_path) {
        rc = bad(cmd, "missing option", "--data-path P (the examples)");
        goto out;
    }
    if (predict && !outs.n) {
        rc = bad(cmd, "missing option", "--outputs NAME[,NAME] (e.g. logits)");
        goto out;
    }
    if (predict && !o.out) {
        rc = bad(cmd, "missing option", "--out FILE.safetensors or DIR/");
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
    o.outputs = outs.v;
    o.noutputs = outs.n;
    rt_stop_on_signals();
    rc = predict ? rt_predict(m, &o) : rt_eval(m, &o);
    fe_model_free(m);
out:
    vec_free(&sets);
    vec_free(&outs);
    free(outlist);
    return rc;
}

int cli_eval(int argc, char **argv)
{
    return run(argc, argv, false);
}

int cli_predict(int argc, char **argv)
{
    return run(argc, argv, true);
}
