/* train.c - `kiln train`: its flags, onto TrainOpts (runtime/train/ does
 * the work); with --nproc N it launches the ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "ir.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"
#include "dist.h"
#include "cli.h"

static const char usage_train[] =
    "usage: kiln train MODEL.lua [options]\n"
    "\n"
    "Compiles the training step to C kernels, runs it on the CPU and trains,\n"
    "printing one line per step and a summary.\n"
    "\n"
    "options:\n"
    "  --steps N            total number of steps, 1..1e9: the same as --set\n"
    "                       steps=N, and wins over it: the script's config key\n"
    "                       steps (its schedule's warmup and cosine end follow)\n"
    "                       or train.steps\n"
    "  --set KEY=VALUE      override a config{} or train{} setting (repeatable)\n"
    "  --device DEV         cpu (default), cuda (an NVIDIA GPU), auto (cuda if present)\n"
    "  --threads N          CPU threads for kernels and BLAS, 1..256 (default: one\n"
    "                       per core)\n"
    "  --resume CKPT        continue from a checkpoint exactly\n"
    "  --checkpoint PREFIX  write PREFIX.stepN.safetensors every\n"
    "                       train.checkpoint_every steps and at the end\n"
    "  --init-from W        load params by name from a safetensors file\n"
    "  --init-map FILE.lua  with --init-from: a Lua table or function mapping the\n"
    "                       file's names to the model's (rename, transpose, drop;\n"
    "                       docs/training.md)\n"
    "  --init-partial       with --init-from: load the params that match by name\n"
    "                       and shape, leave the rest at their init, list both\n"
    "  --save-weights W     write the params to W at the end\n"
    "  --profile            print a per-kernel time table at the end\n"
    "  --kernel-table FILE  with --profile: write the measured per-kernel table to\n"
    "                       FILE (tab-separated; joins with kiln compile --target's\n"
    "                       --kernel-table by name; docs/cost.md)\n"
    "  --trace FILE         write a Chrome trace (chrome://tracing, Perfetto)\n"
    "  --log-dir DIR        write DIR/metrics.jsonl (per step), DIR/eval.jsonl and\n"
    "                       DIR/report.html (plots; one file, no network)\n"
    "  --peak-gflops X      MFU denominator in GFLOP/s (default: the measured CPU\n"
    "                       FMA peak or the GPU's; a faster step raises it)\n"
    "  --memory-budget SIZE recompute activations to fit SIZE (see kiln compile)\n"
    "  --nproc N            train on N local ranks, 1..1024 (processes, through\n"
    "                       mpirun); each reads its own share of the batch\n"
    "                       (global batch = N x the model's); gradients are\n"
    "                       averaged in buckets\n"
    "                       (train.bucket_mb, grad_accum, comm_timeout, zero: --set;\n"
    "                       zero=1 shards the optimizer state over the ranks)\n"
    "  --tp N               tensor parallelism (--set tp=N): N ranks share each\n"
    "                       layer; --nproc is the total, tp x dp\n"
    "  --pp N               pipeline stages (--set pp=N): the model cut into N\n"
    "                       stages, micro_batches (else grad_accum) per step,\n"
    "                       schedule 1f1b or gpipe; --nproc is tp x pp x dp\n"
    "                       (docs/parallel.md; --set sequence_parallel=true)\n"
    "  --pp-balance cost|time  under --pp: cut the stages by the cost model (cost,\n"
    "                       the default) or by each piece's F, B and W timed on\n"
    "                       this machine's CPU first (time)\n"
    "  --no-overlap         start every gradient all-reduce after backward (the\n"
    "                       baseline the comm pass's placement is measured against)\n"
    "  --remat=POLICY       none, full, selective or auto (see kiln compile)\n"
    "  --no-fuse            no fusion: every op its own kernel (same results)\n"
    "  --no-fuse-attention  keep attention as written (no fused attention kernels)\n"
    "  --fuse-attention     fused attention kernels (the default; the later of the\n"
    "                       two flags wins)\n"
    "  --cache-dir DIR      compiled-kernel cache (default: $KILN_CACHE_DIR or\n"
    "                       ~/.cache/kiln)\n"
    "  --dump-ir FILE       write the training step's IR, as the pipeline leaves it,\n"
    "                       to FILE (what kiln compile --dump-after=schedule\n"
    "                       writes for the same model and flags)\n"
    "  --allow-nonfinite-data  data tensors: train on float arrays holding NaN or\n"
    "                       Inf (by default refused before training, naming the\n"
    "                       array, the example and the position)\n"
    "  -v, --verbose        log compilation details\n"
    "  -q, --quiet          print only the summary\n"
    "  -h, --help           this text\n";

/* kiln train with shard=auto: the choice on every rank alike (costed on
 * the run's device, cli_shard_device: every rank reads the figures the
 * launcher cached), before the ranks compile; world rank 0 says what it
 * chose in one line. False after printing the error. */
static bool train_shard_auto(Model *m, const TrainOpts *o)
{
    PassOpts po;
    RtGraphFlags gf = {.memory_budget = -1, .no_fuse_attention = o->no_fuse_attention};
    rt_pass_opts(&m->train, &gf, &po);
    char *text = NULL;
    Diag d = {{0}};
    int before = 0, after = 0;
    for (int i = 0; i < m->g->t.n; i++)
        before += m->g->t.v[i].kind == TK_PARAM && m->g->t.v[i].shard.on;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    CgDevice cpu;
    const CgDevice *dev = NULL;
    if (!cli_shard_device(m, o->device, o->threads, ls ? atoi(ls) : 1, o->cache_dir, &cpu, &dev,
                          &d) ||
        !cli_shard_auto(m, &po, dev, 5e-6, &text, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        return false;
    }
    for (int i = 0; i < m->g->t.n; i++)
        after += m->g->t.v[i].kind == TK_PARAM && m->g->t.v[i].shard.on;
    const char *wr = getenv("OMPI_COMM_WORLD_RANK");
    if (text && (!wr || strcmp(wr, "0") == 0))
        fprintf(stderr, "kiln: note: shard=auto split %d params over tp = %d (and kept %d the "
                        "script marks), costed on %s; `kiln compile --tp %d --set shard=auto` "
                        "shows the choice and its costs\n",
                after - before, po.tp, before, dev ? dev->name : "h100", po.tp);
    free(text);
    return true;
}

int cli_train(int argc, char **argv)
{
    VEC(const char *) sets = {0};
    int tp = 0, pp = 0;
    TrainOpts o = {0};
    int nproc = 1;
    int64_t budget = -1;
    const char *model = NULL, *init_map = NULL, *pp_balance = NULL;
    for (int i = 2; i < argc; i++) {
        const char *v;
        char *end;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage_train, stdout);
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "--set"))) {
            vec_push(&sets, v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--steps"))) {
            int64_t n;
            if (!cli_int_flag("train", "--steps", v, 1, CLI_MAX_STEPS, &n))
                return 2;
            o.steps = n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp"))) {
            int64_t n;
            if (!cli_int_flag("train", "--tp", v, 1, CLI_MAX_NPROC, &n))
                return 2;
            tp = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--pp"))) {
            int64_t n;
            if (!cli_int_flag("train", "--pp", v, 1, CLI_MAX_NPROC, &n))
                return 2;
            pp = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads"))) {
            int64_t n;
            if (!cli_int_flag("train", "--threads", v, 1, CLI_MAX_THREADS, &n))
                return 2;
            o.threads = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--device"))) {
            if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0 && strcmp(v, "auto") != 0)
                return cli_bad_flag("train", "--device expects cpu, cuda or auto, got", v);
            o.device = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--resume"))) {
            o.resume = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--checkpoint"))) {
            o.checkpoint = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--init-from"))) {
            o.init_from = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--init-map"))) {
            if (!*v)
                return cli_bad_flag("train", "--init-map expects a Lua file, got",
                                    "an empty value");
            init_map = v;
        } else if (strcmp(argv[i], "--init-partial") == 0) {
            o.init_partial = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--save-weights"))) {
            o.save_weights = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--trace"))) {
            o.trace = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--log-dir"))) {
            if (!*v)
                return cli_bad_flag("train", "--log-dir expects a directory, got",
                                    "an empty value");
            o.log_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cache-dir"))) {
            o.cache_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-ir"))) {
            o.dump_ir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--peak-gflops"))) {
            o.peak_gflops = strtod(v, &end);
            if (end == v || *end || !(o.peak_gflops > 0) || !isfinite(o.peak_gflops))
                return cli_bad_flag("train", "--peak-gflops expects a positive number, got", v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--pp-balance"))) {
            if (strcmp(v, "cost") != 0 && strcmp(v, "time") != 0)
                return cli_bad_flag("train", "--pp-balance expects cost or time, got", v);
            pp_balance = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--memory-budget"))) {
            if ((budget = cli_parse_budget("train", v)) < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--remat"))) {
            if ((o.remat = pass_remat_parse_policy(v)) < 0)
                return cli_bad_flag("train", "--remat expects none, full, selective or auto, got",
                                    v);
        } else if (strcmp(argv[i], "--profile") == 0) {
            o.profile = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kernel-table"))) {
            if (!*v)
                return cli_bad_flag("train", "--kernel-table expects a file name, got",
                                    "an empty value");
            o.kernel_table = v;
        } else if (strcmp(argv[i], "--allow-nonfinite-data") == 0) {
            o.allow_nonfinite_data = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--nproc"))) {
            int64_t n;
            if (!cli_int_flag("train", "--nproc", v, 1, CLI_MAX_NPROC, &n))
                return 2;
            nproc = (int)n;
        } else if (strcmp(argv[i], "--no-overlap") == 0) {
            o.no_overlap = true;
        } else if (strcmp(argv[i], "--no-fuse") == 0) {
            o.no_fuse = true;
        } else if (strcmp(argv[i], "--no-fuse-attention") == 0) {
            o.no_fuse_attention = true;
        } else if (strcmp(argv[i], "--fuse-attention") == 0) {
            o.no_fuse_attention = false;
        } else if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0) {
            o.verbose = true;
        } else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            o.quiet = true;
        } else if (argv[i][0] == '-') {
            return cli_bad_flag("train", "unknown option", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return cli_bad_flag("train", "more than one model given", argv[i]);
        }
    }
    if (!model)
        return cli_bad_flag("train", "missing argument", "MODEL.lua");
    if (o.kernel_table && !o.profile)
        return cli_bad_flag("train", "--kernel-table needs --profile, got", "no --profile");
    if ((init_map || o.init_partial) && !o.init_from)
        return cli_bad_flag("train", init_map ? "--init-map needs --init-from W, got"
                                              : "--init-partial needs --init-from W, got",
                            "no --init-from");
    /* --steps N is --set steps=N, last (it wins): the script's config key
     * steps, which its schedule reads (warmup, the cosine's end), or
     * train.steps when the config has no such key */
    char steps_set[32], tp_set[32], pp_set[32];
    if (o.steps > 0) {
        snprintf(steps_set, sizeof steps_set, "steps=%lld", (long long)o.steps);
        vec_push(&sets, steps_set);
    }
    if (tp > 0) { /* --tp N is --set tp=N */
        snprintf(tp_set, sizeof tp_set, "tp=%d", tp);
        vec_push(&sets, tp_set);
    }
    if (pp > 0) { /* --pp N is --set pp=N */
        snprintf(pp_set, sizeof pp_set, "pp=%d", pp);
        vec_push(&sets, pp_set);
    }
    char err[2048];
    Model *m = fe_load_model(model, sets.v, sets.n, err, sizeof err);
    vec_free(&sets);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (m->train.pp > 1 && !getenv("OMPI_COMM_WORLD_SIZE")) { /* before the ranks start */
        Diag pd = {{0}};
        int64_t need = m->train.pp * (m->train.tp > 1 ? m->train.tp : 1);
        if (!rt_pp_check(&m->train, &pd))
            fprintf(stderr, "kiln train: %s\n", pd.msg);
        else if (nproc % need != 0)
            fprintf(stderr,
                    "kiln train: --pp %lld: --nproc %d is not a multiple of tp x pp = %lld "
                    "(expected ranks = tp x pp x dp)\n", (long long)m->train.pp, nproc,
                    (long long)need);
        if (pd.msg[0] || nproc % need != 0) {
            fe_model_free(m);
            return 2;
        }

    }
    if (budget >= 0)
        m->train.memory_budget = budget;
    if (pp_balance)
        m->train.pp_balance = pp_balance;
    InitMap *imap = NULL; /* before compiling, and before the ranks start */
    if (init_map && !o.resume && !(imap = cli_init_map(o.init_from, init_map))) {
        fe_model_free(m);
        return 1;
    }
    o.init_map = imap;
    /* --nproc N: this process only launches the ranks (mpirun runs this
     * binary N times; inside them --nproc is gone) */
    if (nproc > 1 && !getenv("OMPI_COMM_WORLD_SIZE")) {
        CgDevice cpu; /* shard=auto: the device's figures cached for the ranks */
        const CgDevice *dev;
        Diag sd = {{0}};
        bool ok = cli_shard_device(m, o.device, o.threads, nproc, o.cache_dir, &cpu, &dev, &sd);
        fe_init_map_free(imap);
        fe_model_free(m);
        if (!ok) {
            fprintf(stderr, "kiln train: %s\n", sd.msg);
            return 1;
        }
        return rt_launch(nproc, argc, argv);
    }
    if (!train_shard_auto(m, &o)) {
        fe_init_map_free(imap);
        fe_model_free(m);
        return 1;
    }
    cli_print_warnings(m);
    rt_stop_on_signals(); /* SIGINT, SIGTERM: stop after the current step */
    int rc = rt_train(m, &o);
    fe_init_map_free(imap);
    fe_model_free(m);
    return rc;
}
