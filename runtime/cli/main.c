/* main.c - the kiln command line: `kiln compile`, `kiln train` and `kiln opt`. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codegen.h"
#include "frontend.h"
#include "ir.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"
#include "dist.h"
#include "cli.h"
#include "cpu.h"

static const char usage_main[] =
    "usage: kiln COMMAND MODEL.lua [options]\n"
    "       kiln opt FILE.ir --passes=P1,P2,... [options]\n"
    "\n"
    "kiln compiles a model's whole training step (forward, backward, optimizer\n"
    "update) into one graph and runs it.\n"
    "\n"
    "commands:\n"
    "  compile   compile only: print a summary, write pass dumps\n"
    "  train     compile and train on the CPU\n"
    "  eval      evaluate saved weights on a whole data set (loss, extra outputs)\n"
    "  predict   write a model's outputs for every example (safetensors, .npy)\n"
    "  sample    sample text from a language model (KV-cache decode step)\n"
    "  plan      project a run at cluster scale: memory per GPU, step, end date\n"
    "  opt       run passes on an IR file (a dump, a bug report, a pass test)\n"
    "\n"
    "`kiln COMMAND --help` lists the command's options. Documentation: README.md,\n"
    "docs/cli.md, docs/dsl.md, docs/ir.md, docs/inference.md.\n";

static const char usage_compile[] =
    "usage: kiln compile MODEL.lua [options]\n"
    "\n"
    "Builds the training step and runs every pass; prints the params, ops per\n"
    "class, FLOPs per step and the planned peak memory.\n"
    "\n"
    "options:\n"
    "  --set KEY=VALUE      override a config{} or train{} setting (repeatable)\n"
    "  --dump-after=PASS    print (or write, with --dump-dir) the IR after PASS;\n"
    "                       PASS is one of frontend, attention, partition (tp >\n"
    "                       1), autodiff, attnlayout, optimizer, simplify,\n"
    "                       attndqkv, remat, fuse, comm, schedule, memplan,\n"
    "                       stages (pp > 1: the cut and the schedule), or all\n"
    "                       (repeatable)\n"
    "  --dump-dir DIR       write dumps into DIR (NN-PASS.ir, memplan.txt)\n"
    "                       instead of standard output\n"
    "  --settings           also print every config and train setting\n"
    "  --time               print the time each pass took\n"
    "  --memory-budget SIZE recompute activations so that the planned peak fits\n"
    "                       SIZE (512MiB, 2GiB, 1.5GB, bytes); overrides\n"
    "                       train.memory_budget\n"
    "  --remat=POLICY       none, full, selective or auto (default: auto with a\n"
    "                       budget, else none)\n"
    "  --nproc N            compile for N ranks, tp x dp (the comm pass places the\n"
    "                       dp gradient all-reduces; see --dump-after=comm)\n"
    "  --tp N               tensor parallelism over N ranks (--set tp=N): the\n"
    "                       partition pass splits the params the model marks\n"
    "                       (shard(), nn's parallel options); prints the rank's\n"
    "                       params, gradients, optimizer state and TP collectives;\n"
    "                       with --set shard=auto the compiler chooses the splits\n"
    "                       of the unmarked params and prints its choice\n"
    "  --tp-rank R          whose graph to compile and dump (default 0)\n"
    "  --pp N               pipeline stages (--set pp=N): prints the stage cut and\n"
    "                       the schedule of micro_batches (else grad_accum) as a\n"
    "                       table (--dump-after=stages: DIR/stages.txt)\n"
    "  --no-overlap         every all-reduce starts after backward\n"
    "  --remat-sweep        print the remat table: budgets from the smallest\n"
    "                       feasible to the no-recompute peak, auto and each\n"
    "                       fixed policy\n"
    "  --no-fuse            no fusion: every op its own kernel (same results)\n"
    "  --no-fuse-attention  keep attention as written (no fused attention op)\n"
    "  --fuse-attention     the fused attention op (the default; the later of the\n"
    "                       two flags wins)\n"
    "  --target DEVICE      predict the step on DEVICE: a100, h100, h200, b200 (with\n"
    "                       the model's precision, tf32, cuda_graph), or cpu (this\n"
    "                       machine, measured once and cached); see docs/cost.md\n"
    "  --threads N          --target cpu: threads (default: one per core)\n"
    "  --remeasure          --target cpu: measure this machine again\n"
    "  --top N              --target: list the N costliest kernels (default 10)\n"
    "  --kernel-table FILE  --target: write the predicted per-kernel table to FILE\n"
    "                       (tab-separated; docs/cost.md)\n"
    "  --calibrate FILE     --target: set the per-kernel table FILE of a measured run\n"
    "                       against the prediction, per kernel class; see docs/cost.md\n"
    "  --cache-dir DIR      kernel cache, where the cpu measurement is kept\n"
    "  --log-dir DIR        write DIR/report.html: memory timeline, remat sweep\n"
    "  --dot FILE           write the compiled graph for Graphviz: ops grouped by\n"
    "                       layer, fused kernels as clusters, recomputed ops\n"
    "                       dashed, comm buckets red (`dot -Tsvg FILE -o g.svg`)\n"
    "  --dot-depth N        with --dot: draw each layer N names deep (h.0: 2) as\n"
    "                       one node, 1..64 (default: every op)\n"
    "  -h, --help           this text\n";

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

typedef struct {
    VEC(const char *) sets;
    VEC(const char *) dumps;
    const char *dump_dir;
    bool settings, timing;
    int64_t memory_budget; /* --memory-budget; -1: not given */
    int remat;             /* --remat; REMAT_DEFAULT: not given */
    bool remat_sweep;
    int nproc;             /* --nproc: compile for N ranks (tp x dp) */
    int tp, tp_rank;       /* --tp: tensor-parallel ranks (train.tp); --tp-rank: whose graph */
    int tp_on;             /* the model's tp (train.tp after --set and --tp) */
    char pp_set[32];       /* --pp N: "pp=N" (a --set, last) */
    bool no_overlap;       /* --no-overlap */
    bool no_fuse;          /* --no-fuse */
    bool no_fuse_attention; /* --no-fuse-attention (--fuse-attention: false) */
    const char *target;    /* --target DEVICE: the cost model's prediction */
    int threads;           /* --threads (--target cpu; 0: one per core) */
    const char *cache_dir; /* --cache-dir */
    bool remeasure;        /* --remeasure: measure the CPU again */
    const char *dot;       /* --dot FILE: the compiled graph for Graphviz */
    int dot_depth;         /* --dot-depth N (0: every op) */
    const char *log_dir;   /* --log-dir DIR: report.html */
    int top;               /* --top N: costliest kernels listed (0: 10) */
    const char *ktable;    /* --kernel-table FILE: the predicted per-kernel table */
    const char *calibrate; /* --calibrate FILE: a measured per-kernel table */
    int ndump_written;
    bool dump_error;
    MemPlan *mp;           /* the memplan pass's plan (its dump reads it) */
} CompileArgs;

static int bad_flag(const char *cmd, const char *msg, const char *arg)
{
    fprintf(stderr, "kiln %s: %s: %s\n(see `kiln %s --help`)\n", cmd, msg, arg, cmd);
    return 2;
}

/* The ranges of the integer flags (docs/cli.md). */
#define MAX_STEPS 1000000000 /* as train.steps */
#define MAX_THREADS 256      /* the CPU backend's thread pool */
#define MAX_NPROC 1024

/* An integer flag's value from lo to hi into *out; false after printing
 * "kiln CMD: FLAG: expected an integer from LO to HI, got V" (no
 * wrap-around: 4294967297 is not 1). */
static bool int_flag(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi,
                     int64_t *out)
{
    char why[256];
    if (fe_parse_int(v, lo, hi, out, why, sizeof why))
        return true;
    fprintf(stderr, "kiln %s: %s: %s\n(see `kiln %s --help`)\n", cmd, flag, why, cmd);
    return false;
}

const char *cli_flag_value(int argc, char **argv, int *i, const char *flag)
{
    size_t n = strlen(flag);
    const char *a = argv[*i];
    if (strncmp(a, flag, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != 0)
        return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kiln: %s needs a value\n", flag);
        exit(2);
    }
    return argv[++*i];
}

static bool wants_dump(const CompileArgs *a, const char *pass)
{
    for (int i = 0; i < a->dumps.n; i++)
        if (strcmp(a->dumps.v[i], "all") == 0 || strcmp(a->dumps.v[i], pass) == 0)
            return true;
    return false;
}

static bool known_dump(const char *name)
{
    return strcmp(name, "all") == 0 || strcmp(name, "frontend") == 0 ||
           strcmp(name, "memplan") == 0 || strcmp(name, "stages") == 0 ||
           pass_find(name) != NULL;
}

/* pp > 1: the stage cut of the forward graph and the schedule (the
 * `stages` dump): to standard output, and to DIR/stages.txt when
 * --dump-after=stages (or all) with --dump-dir. False on a user error. */
static bool print_stages(const Model *m, const PassOpts *po, const char *dir, bool dump)
{
    Graph *g = ir_clone(m->g);
    PassStageCut c;
    Diag d = {{0}};
    int sched = pass_stage_schedule_parse(m->train.schedule);
    int mb = (int)(m->train.micro_batches > 0 ? m->train.micro_batches : m->train.grad_accum);
    bool ok = pass_attention(g, po, &d) && pass_partition(g, po, &d) &&
              pass_stage_cut(g, (int)m->train.pp, &c, &d);
    if (!ok) {
        fprintf(stderr, "kiln compile: %s\n", d.msg);
        ir_free(g);
        return false;
    }
    printf("pipeline stages (pp = %lld; each stage's own graphs are compiled by kiln train):\n",
           (long long)m->train.pp);
    pass_stage_cut_print(g, &c, stdout);
    pass_stage_schedule_print(sched, c.n, mb, stdout);
    if (dir && dump) {
        char *path = xasprintf("%s/stages.txt", dir);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "> After stages:\n");
            pass_stage_cut_print(g, &c, f);
            pass_stage_schedule_print(sched, c.n, mb, f);
            ok = fclose(f) == 0;
        } else {
            ok = false;
        }
        if (!ok)
            fprintf(stderr, "kiln compile: cannot write %s\n", path);
        free(path);
    }
    pass_stage_cut_free(&c);
    ir_free(g);
    return ok;
}

static FILE *dump_fopen(const char *path, bool *error);

/* Opens the dump file for `pass` (or stdout); prints the fixed header. */
static FILE *dump_open(CompileArgs *a, const char *pass, const char *ext, char **path)
{
    *path = NULL;
    if (!a->dump_dir) {
        printf("> After %s:\n", pass);
        return stdout;
    }
    *path = xasprintf("%s/%02d-%s.%s", a->dump_dir, a->ndump_written++, pass, ext);
    return dump_fopen(*path, &a->dump_error);
}

/* Opens the dump file path; on failure says so and sets *error. */
static FILE *dump_fopen(const char *path, bool *error)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kiln: %s: cannot write: %s\n", path, strerror(errno));
        *error = true;
    }
    errno = 0;
    return f;
}

/* Closes a dump file (stdout: nothing to do) and frees path. A write error
 * (a full disk) is reported, sets *error, and removes the truncated file
 * (a regular one: never what a symlink points at). */
static void dump_fclose(FILE *f, char *path, bool *error)
{
    if (f && f != stdout) {
        int err = ferror(f) ? (errno ? errno : EIO) : 0;
        if (fclose(f) != 0 && !err)
            err = errno ? errno : EIO;
        if (err) {
            fprintf(stderr, "kiln: %s: cannot write: %s\n", path, strerror(err));
            *error = true;
            struct stat st;
            if (lstat(path, &st) == 0 && S_ISREG(st.st_mode))
                unlink(path);
        }
    }
    free(path);
}

static void dump_close(CompileArgs *a, FILE *f, char *path)
{
    dump_fclose(f, path, &a->dump_error);
}

static void dump_graph(CompileArgs *a, const char *pass, const Graph *g)
{
    if (!wants_dump(a, pass))
        return;
    char *path;
    FILE *f = dump_open(a, pass, pass_dump_ext(pass), &path);
    if (!f)
        return;
    pass_dump(pass, g, a->mp, f);
    dump_close(a, f, path);
}

static void pass_hook(const char *pass, const Graph *g, double seconds, void *ctx)
{
    CompileArgs *a = ctx;
    if (a->timing)
        printf("pass %-10s %8.2f ms  %6d ops\n", pass, seconds * 1e3, g->ops.n);
    /* partition does nothing at tp = 1: no dump, so the others keep their
     * numbers (00-frontend, 01-attention, 02-autodiff, ...) */
    if (strcmp(pass, "partition") == 0 && a->tp_on <= 1)
        return;
    dump_graph(a, pass, g);
}

/* --memory-budget SIZE: bytes, or -1 after printing the error. */
static int64_t parse_budget(const char *cmd, const char *v)
{
    int64_t b = ir_parse_bytes(v);
    if (b <= 0) {
        bad_flag(cmd, "--memory-budget expects a size like 512MiB, 2GiB or 1000000, got", v);
        return -1;
    }
    return b;
}

/* The cuBLASLt epilogues the plan records for its GEMMs (codegen/
 * epilogue.c): one summary line; with --dump-dir, one line per GEMM that
 * carries one in DIR/epilogues.txt (a write error sets *error). */
static void print_epilogues(const Graph *g, const char *dump_dir, bool *error)
{
    Diag d = {{0}};
    CgPlan *p = cg_plan(g, &d);
    if (!p) {
        printf("gemm epilogues: no plan (%s)\n", d.msg);
        return;
    }
    cg_plan_print_epilogues(p, stdout, false);
    if (dump_dir) {
        char *path = xasprintf("%s/epilogues.txt", dump_dir);
        FILE *f = dump_fopen(path, error);
        if (f)
            cg_plan_print_epilogues(p, f, true);
        dump_fclose(f, path, error);
    }
    cg_plan_free(p);
}

/* --dot FILE: the compiled graph g for Graphviz, written atomically (no
 * half-written file on a full disk); false after saying why not. */
static bool write_dot(const Graph *g, const char *path, int depth)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        die("open_memstream: out of memory");
    pass_dot_print(g, depth, f);
    if (fclose(f) != 0)
        die("open_memstream: out of memory");
    Diag d = {{0}};
    const void *chunk[1] = {buf};
    bool ok = rt_write_atomic(path, chunk, &len, 1, &d);
    if (!ok)
        fprintf(stderr, "kiln: %s\n", d.msg);
    else
        printf("graph written to %s (Graphviz: dot -Tsvg %s -o graph.svg)\n", path, path);
    free(buf);
    return ok;
}

/* --log-dir DIR for kiln compile: report.html with the memory timeline of
 * the compiled step g and the remat sweep of the model (8 budgets; the
 * pipeline up to simplify run again on a copy, as --remat-sweep does). */
static bool write_compile_report(const Model *m, const PassOpts *po, const Graph *g,
                                 const MemPlan *mp, const char *dir)
{
    Diag d = {{0}};
    char title[512];
    snprintf(title, sizeof title, "kiln compile %s", m->path);
    RunLog *l = rt_runlog_open(dir, title, false, &d);
    bool ok = l != NULL;
    if (ok) {
        rt_runlog_memory(l, g, mp);
        Graph *sg = ir_clone(m->g);
        PassOpts so = *po;
        so.memplan = NULL;
        so.remat_report = NULL;
        pass_opts_after(&so, "remat");
        RematSweepPoint pts[8];
        if (pass_pipeline(sg, po, "simplify", NULL, NULL, &d) &&
            pass_remat_sweep(sg, &so, 8, NULL, pts, &d))
            rt_runlog_sweep(l, pts, 8);
        else
            fprintf(stderr, "kiln: note: no remat sweep in the report (%s)\n", d.msg);
        ir_free(sg);
        d.msg[0] = 0;
        ok = rt_runlog_close(l, &d);
        rt_runlog_free(l);
    }
    if (!ok)
        fprintf(stderr, "kiln: %s\n", d.msg);
    else
        printf("report: %s/report.html\n", dir);
    return ok;
}

static int online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && n <= MAX_THREADS ? (int)n : 1;
}

static int cmd_compile(int argc, char **argv)
{
    CompileArgs a = {0};
    a.memory_budget = -1;
    const char *model = NULL;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage_compile, stdout);
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "--set"))) {
            vec_push(&a.sets, v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-after"))) {
            if (!known_dump(v))
                return bad_flag("compile", "unknown pass for --dump-after", v);
            vec_push(&a.dumps, v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-dir"))) {
            a.dump_dir = v;
        } else if (strcmp(argv[i], "--settings") == 0) {
            a.settings = true;
        } else if (strcmp(argv[i], "--time") == 0) {
            a.timing = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--nproc"))) {
            int64_t n;
            if (!int_flag("compile", "--nproc", v, 1, MAX_NPROC, &n))
                return 2;
            a.nproc = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp"))) {
            int64_t n;
            if (!int_flag("compile", "--tp", v, 1, MAX_NPROC, &n))
                return 2;
            a.tp = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--pp"))) {
            int64_t n;
            if (!int_flag("compile", "--pp", v, 1, MAX_NPROC, &n))
                return 2;
            snprintf(a.pp_set, sizeof a.pp_set, "pp=%d", (int)n);
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp-rank"))) {
            int64_t n;
            if (!int_flag("compile", "--tp-rank", v, 0, MAX_NPROC - 1, &n))
                return 2;
            a.tp_rank = (int)n;
        } else if (strcmp(argv[i], "--no-overlap") == 0) {
            a.no_overlap = true;
        } else if (strcmp(argv[i], "--no-fuse") == 0) {
            a.no_fuse = true;
        } else if (strcmp(argv[i], "--no-fuse-attention") == 0) {
            a.no_fuse_attention = true;
        } else if (strcmp(argv[i], "--fuse-attention") == 0) {
            a.no_fuse_attention = false;
        } else if ((v = cli_flag_value(argc, argv, &i, "--memory-budget"))) {
            if ((a.memory_budget = parse_budget("compile", v)) < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--remat"))) {
            if ((a.remat = pass_remat_parse_policy(v)) < 0)
                return bad_flag("compile", "--remat expects none, full, selective or auto, got",
                                v);
        } else if (strcmp(argv[i], "--remat-sweep") == 0) {
            a.remat_sweep = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--log-dir"))) {
            if (!*v)
                return bad_flag("compile", "--log-dir expects a directory, got",
                                "an empty value");
            a.log_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dot"))) {
            if (!*v)
                return bad_flag("compile", "--dot expects a file name, got", "an empty value");
            a.dot = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dot-depth"))) {
            int64_t n;
            if (!int_flag("compile", "--dot-depth", v, 1, 64, &n))
                return 2;
            a.dot_depth = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--target"))) {
            if (strcmp(v, "cpu") != 0 && !cg_device_find(v))
                return bad_flag("compile", "--target expects cpu, a100, h100, h200 or b200, got",
                                v);
            a.target = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads"))) {
            int64_t n;
            if (!int_flag("compile", "--threads", v, 1, MAX_THREADS, &n))
                return 2;
            a.threads = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cache-dir"))) {
            a.cache_dir = v;
        } else if (strcmp(argv[i], "--remeasure") == 0) {
            a.remeasure = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--calibrate"))) {
            if (!*v)
                return bad_flag("compile", "--calibrate expects a kernel table file, got",
                                "an empty value");
            a.calibrate = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--top"))) {
            int64_t n;
            if (!int_flag("compile", "--top", v, 1, 100000, &n))
                return 2;
            a.top = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kernel-table"))) {
            if (!*v)
                return bad_flag("compile", "--kernel-table expects a file name, got",
                                "an empty value");
            a.ktable = v;
        } else if (argv[i][0] == '-') {
            return bad_flag("compile", "unknown option", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return bad_flag("compile", "more than one model given", argv[i]);
        }
    }
    if (!model)
        return bad_flag("compile", "missing argument", "MODEL.lua");
    if (a.ktable && !a.target)
        return bad_flag("compile", "--kernel-table needs --target DEVICE, got",
                        "no --target");
    if (a.calibrate && !a.target)
        return bad_flag("compile", "--calibrate needs --target DEVICE, got", "no --target");
    if (a.dot_depth && !a.dot)
        return bad_flag("compile", "--dot-depth needs --dot FILE, got", "no --dot");
    CgKernelTable *cal = NULL;
    if (a.calibrate) { /* read first: a bad table fails before the compile */
        Diag cd = {{0}};
        if (!(cal = cg_kernel_table_read(a.calibrate, &cd))) {
            fprintf(stderr, "kiln: %s\n", cd.msg);
            vec_free(&a.sets);
            vec_free(&a.dumps);
            return 1;
        }
    }
    if (a.dump_dir && !a.dumps.n)
        vec_push(&a.dumps, "all");
    if (a.dump_dir && mkdir(a.dump_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "kiln: %s: cannot create the dump directory: %s\n", a.dump_dir,
                strerror(errno));
        cg_kernel_table_free(cal);
        return 1;
    }

    Diag ld = {{0}};
    if (a.log_dir && !rt_runlog_dir(a.log_dir, &ld)) { /* before compiling */
        fprintf(stderr, "kiln: %s\n", ld.msg);
        cg_kernel_table_free(cal);
        vec_free(&a.sets);
        vec_free(&a.dumps);
        return 1;
    }
    char err[2048], tp_set[32];
    if (a.pp_set[0])
        vec_push(&a.sets, a.pp_set);
    if (a.tp > 0) { /* --tp N is --set tp=N, last (it wins) */
        snprintf(tp_set, sizeof tp_set, "tp=%d", a.tp);
        vec_push(&a.sets, tp_set);
    }
    Model *m = fe_load_model(model, a.sets.v, a.sets.n, err, sizeof err);
    const char *bad = NULL;
    if (m && m->train.tp > 1 && a.tp_rank >= m->train.tp)
        bad = "--tp-rank is not a rank of the TP group (expected 0..tp-1)";
    else if (m && m->train.tp <= 1 && a.tp_rank > 0)
        bad = "--tp-rank needs --tp N with N > 1";
    else if (m && a.nproc > 1 && a.nproc % (m->train.tp > 1 ? m->train.tp : 1) != 0)
        bad = "--nproc is not a multiple of tp (expected ranks = tp x dp)";
    if (bad) {
        snprintf(err, sizeof err, "kiln compile: %s (got --nproc %d, tp = %lld, --tp-rank %d)", bad,
                 a.nproc, (long long)m->train.tp, a.tp_rank);
        fe_model_free(m);
        m = NULL;
    }
    if (!m) {
        fprintf(stderr, "%s\n", err);
        cg_kernel_table_free(cal);
        vec_free(&a.sets);
        vec_free(&a.dumps);
        return 1;
    }
    cli_print_warnings(m);
    dump_graph(&a, "frontend", m->g);
    if (a.settings)
        fe_print_settings(m, stdout);

    PassOpts po;
    RtGraphFlags gf = {.memory_budget = a.memory_budget, .remat = a.remat,
                       .nranks = a.nproc > 1 ? a.nproc : (int)m->train.tp,
                       .tp_rank = a.tp_rank,
                       .no_overlap = a.no_overlap, .no_fuse = a.no_fuse,
                       .no_fuse_attention = a.no_fuse_attention};
    rt_pass_opts(&m->train, &gf, &po);
    a.tp_on = po.tp;
    po.dump_dir = a.dump_dir;
    RematReport rr;
    memset(&rr, 0, sizeof rr);
    po.remat_report = &rr;
    po.memplan = &a.mp;

    Diag d = {{0}};
    char *shard_text = NULL; /* shard=auto's report */
    if (!cli_shard_auto(m, &po, a.target ? cg_device_find(a.target) : NULL, 5e-6, &shard_text,
                        &d)) {
        fprintf(stderr, "%s\n", d.msg);
        cg_kernel_table_free(cal);
        fe_model_free(m);
        vec_free(&a.sets);
        vec_free(&a.dumps);
        return 1;
    }
    Graph *g = ir_clone(m->g);
    int rc = 0;
    if (a.remat_sweep) {
        PassOpts so = po;
        pass_opts_after(&so, "remat");
        if (!pass_pipeline(g, &po, "simplify", NULL, NULL, &d) ||
            !pass_remat_sweep(g, &so, 8, stdout, NULL, &d)) {
            fprintf(stderr, "%s\n", d.msg);
            rc = 1;
        }
        goto out;
    }
    if (!pass_pipeline(g, &po, NULL, pass_hook, &a, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        rc = 1;
        goto out;
    }
    const MemPlan *mp = a.mp; /* the memplan pass ends the pipeline */
    if (!mp)
        die("kiln compile: the pipeline left no memory plan");
    cli_print_summary(m, m->g, g, mp);
    cli_print_tp(g);
    if (shard_text)
        fputs(shard_text, stdout);
    if (m->train.pp > 1 && !print_stages(m, &po, a.dump_dir, wants_dump(&a, "stages")))
        rc = 1;
    cli_print_remat(&rr, g, po.memory_budget);
    if (!cli_print_fusion(m, g, &po))
        rc = 1;
    print_epilogues(g, a.dump_dir, &a.dump_error);
    /* the decode step's line first: the step's table ends the output */
    if (a.target &&
        (!cli_print_decode_prediction(m, model, a.sets.v, a.sets.n, a.target,
                                      a.threads > 0 ? a.threads : online_cores(), a.cache_dir) ||
         !cli_print_prediction(m, g, a.target, a.threads > 0 ? a.threads : online_cores(),
                               a.cache_dir, a.remeasure, a.top > 0 ? a.top : 10, cal,
                               a.calibrate, a.ktable)))
        rc = 1;
    if (a.dump_dir && (wants_dump(&a, "fuse") || wants_dump(&a, "kernels")) &&
        !rt_dump_kernels(g, a.dump_dir, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        a.dump_error = true;
    }
    if (a.dot && !write_dot(g, a.dot, a.dot_depth))
        rc = 1;
    if (a.log_dir && !write_compile_report(m, &po, g, mp, a.log_dir))
        rc = 1;
    if (a.dump_dir && !a.dump_error)
        printf("dumps written to %s/\n", a.dump_dir);
    if (a.dump_error)
        rc = 1;
out:
    free(shard_text);
    cg_kernel_table_free(cal);
    pass_memplan_free(a.mp);
    ir_free(g);
    fe_model_free(m);
    vec_free(&a.sets);
    vec_free(&a.dumps);
    return rc;
}

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

static int cmd_train(int argc, char **argv)
{
    VEC(const char *) sets = {0};
    int tp = 0, pp = 0;
    TrainOpts o = {0};
    int nproc = 1;
    int64_t budget = -1;
    const char *model = NULL, *init_map = NULL;
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
            if (!int_flag("train", "--steps", v, 1, MAX_STEPS, &n))
                return 2;
            o.steps = n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp"))) {
            int64_t n;
            if (!int_flag("train", "--tp", v, 1, MAX_NPROC, &n))
                return 2;
            tp = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--pp"))) {
            int64_t n;
            if (!int_flag("train", "--pp", v, 1, MAX_NPROC, &n))
                return 2;
            pp = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads"))) {
            int64_t n;
            if (!int_flag("train", "--threads", v, 1, MAX_THREADS, &n))
                return 2;
            o.threads = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--device"))) {
            if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0 && strcmp(v, "auto") != 0)
                return bad_flag("train", "--device expects cpu, cuda or auto, got", v);
            o.device = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--resume"))) {
            o.resume = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--checkpoint"))) {
            o.checkpoint = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--init-from"))) {
            o.init_from = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--init-map"))) {
            if (!*v)
                return bad_flag("train", "--init-map expects a Lua file, got", "an empty value");
            init_map = v;
        } else if (strcmp(argv[i], "--init-partial") == 0) {
            o.init_partial = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--save-weights"))) {
            o.save_weights = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--trace"))) {
            o.trace = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--log-dir"))) {
            if (!*v)
                return bad_flag("train", "--log-dir expects a directory, got", "an empty value");
            o.log_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cache-dir"))) {
            o.cache_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-ir"))) {
            o.dump_ir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--peak-gflops"))) {
            o.peak_gflops = strtod(v, &end);
            if (end == v || *end || !(o.peak_gflops > 0) || !isfinite(o.peak_gflops))
                return bad_flag("train", "--peak-gflops expects a positive number, got", v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--memory-budget"))) {
            if ((budget = parse_budget("train", v)) < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--remat"))) {
            if ((o.remat = pass_remat_parse_policy(v)) < 0)
                return bad_flag("train", "--remat expects none, full, selective or auto, got", v);
        } else if (strcmp(argv[i], "--profile") == 0) {
            o.profile = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kernel-table"))) {
            if (!*v)
                return bad_flag("train", "--kernel-table expects a file name, got",
                                "an empty value");
            o.kernel_table = v;
        } else if (strcmp(argv[i], "--allow-nonfinite-data") == 0) {
            o.allow_nonfinite_data = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--nproc"))) {
            int64_t n;
            if (!int_flag("train", "--nproc", v, 1, MAX_NPROC, &n))
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
            return bad_flag("train", "unknown option", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return bad_flag("train", "more than one model given", argv[i]);
        }
    }
    if (!model)
        return bad_flag("train", "missing argument", "MODEL.lua");
    if (o.kernel_table && !o.profile)
        return bad_flag("train", "--kernel-table needs --profile, got", "no --profile");
    if ((init_map || o.init_partial) && !o.init_from)
        return bad_flag("train", init_map ? "--init-map needs --init-from W, got"
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
        if (!rt_pp_check(&m->train, &o, &pd))
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

static const char usage_opt[] =
    "usage: kiln opt FILE.ir --passes=P1,P2,... [options]\n"
    "\n"
    "Reads IR text (a --dump-after dump, an invalid-after-PASS.ir report, or a\n"
    "pass test, whose input ends at the line \"# >>> ...\"; - reads standard\n"
    "input), runs the named passes in order with the verifier after each, and\n"
    "prints what --dump-after prints after the last one: the IR (with fuse's\n"
    "group and comm's bucket lines as comments), or memplan's memory timeline.\n"
    "A pass does not run on a graph a later pass of the pipeline has marked\n"
    "(gradients, updates, !recompute, !group, placed collectives, the head\n"
    "layout of attention), and autodiff, optimizer, remat, fuse and comm run\n"
    "once: such a graph or list is refused before any pass runs.\n"
    "\n"
    "options:\n"
    "  --passes=P1,P2,...   attention, partition, autodiff, attnlayout, optimizer,\n"
    "                       simplify, attndqkv, remat, fuse, comm, schedule, memplan\n"
    "                       (required)\n"
    "  --memory-budget SIZE remat's budget (as kiln compile)\n"
    "  --remat=POLICY       none, full, selective or auto (as kiln compile)\n"
    "  --nproc N            comm: N ranks, tp x dp (as kiln compile)\n"
    "  --tp-rank R          partition: rank R of tp (--set tp=N) (as kiln compile)\n"
    "  --no-overlap         comm: every all-reduce starts after backward\n"
    "  --no-fuse            fuse: every op its own kernel\n"
    "  --no-fuse-attention  attention: off (keep attention as written)\n"
    "  --fuse-attention     attention: on (the default, as in kiln compile)\n"
    "  --dump-dir DIR       where an internal error writes invalid-after-PASS.ir\n"
    "                       (without it, nowhere)\n"
    "  --set KEY=VALUE      a train{} setting the passes read: optimizer, beta1,\n"
    "                       beta2, eps, weight_decay, grad_clip, momentum, nesterov,\n"
    "                       lion_beta1, lion_beta2 (optimizer), grad_accum,\n"
    "                       bucket_mb, zero (comm), memory_budget (remat), tp,\n"
    "                       sequence_parallel (partition);\n"
    "                       repeatable\n"
    "  -h, --help           this text\n"
    "\n"
    "remat plans through the passes the pipeline runs after it (fuse, comm,\n"
    "schedule, memplan), whatever --passes lists, so that a replay matches\n"
    "kiln compile.\n";

/* The train{} keys kiln opt's --set accepts: those rt_pass_opts reads. */
static const char *const opt_keys[] = {"optimizer", "beta1",     "beta2",      "eps",
                                       "weight_decay", "grad_clip", "momentum",
                                       "nesterov",  "lion_beta1", "lion_beta2",
                                       "grad_accum", "bucket_mb", "memory_budget", "zero",
                                       "tp", "sequence_parallel"};

/* --set KEY=VALUE into c; false after printing the error. */
static bool opt_set(TrainCfg *c, const char *kv)
{
    const char *eq = strchr(kv, '=');
    char key[64];
    size_t n = eq ? (size_t)(eq - kv) : 0;
    if (!eq || n == 0 || n >= sizeof key) {
        bad_flag("opt", "--set expects KEY=VALUE, got", kv);
        return false;
    }
    memcpy(key, kv, n);
    key[n] = 0;
    const FeTrainKey *k = NULL;
    for (size_t i = 0; i < sizeof opt_keys / sizeof opt_keys[0]; i++)
        if (strcmp(key, opt_keys[i]) == 0)
            k = fe_train_key(key);
    if (!k) {
        bad_flag("opt", "--set: not a setting the passes read (expected optimizer, beta1, "
                        "beta2, eps, weight_decay, grad_clip, momentum, nesterov, lion_beta1, "
                        "lion_beta2, grad_accum, bucket_mb, memory_budget, zero, tp or "
                        "sequence_parallel), got",
                 key);
        return false;
    }
    char why[256];
    if (!fe_train_store_text(NULL, c, k, eq + 1, true, why, sizeof why)) {
        fprintf(stderr, "kiln opt: --set %s: %s\n(see `kiln opt --help`)\n", key, why);
        return false;
    }
    return true;
}

/* The most IR text kiln opt reads: a dump of models/gpt.lua (2 layers) is
 * 100 KB, one of a 12-layer GPT-2 about 600 KB. */
#define OPT_IR_MAX ((size_t)256 << 20)

/* The whole of path ("-": standard input), NUL-terminated; NULL after
 * printing why. Like the script and data readers it reads only a regular
 * file (opened without blocking: a FIFO or a device is refused before any
 * read), and at most OPT_IR_MAX bytes of text without a NUL byte; standard
 * input, whatever it is, stops at the first NUL byte or past the bound. */
static char *opt_read(const char *path)
{
    bool in = strcmp(path, "-") == 0;
    const char *name = in ? "<stdin>" : path;
    int fd = in ? STDIN_FILENO : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "kiln opt: %s: cannot read: %s\n", name, strerror(errno));
        if (fd >= 0 && !in)
            close(fd);
        return NULL;
    }
    if (!in && !S_ISREG(st.st_mode)) {
        fprintf(stderr, "kiln opt: %s: not an IR file (expected a regular file, got %s)\n", name,
                rt_file_kind(st.st_mode));
        close(fd);
        return NULL;
    }
    if (!in && (uint64_t)st.st_size > OPT_IR_MAX) {
        fprintf(stderr, "kiln opt: %s: the IR file is %lld bytes (expected at most %zu)\n", name,
                (long long)st.st_size, OPT_IR_MAX);
        close(fd);
        return NULL;
    }
    size_t n = 0, cap = 1 << 16;
    char *buf = xmalloc(cap);
    const char *why = NULL;
    for (;;) {
        if (cap - n < 2)
            buf = xrealloc(buf, cap *= 2);
        size_t want = cap - n - 1; /* one byte past the bound tells it was passed */
        if (want > OPT_IR_MAX + 1 - n)
            want = OPT_IR_MAX + 1 - n;
        ssize_t got = read(fd, buf + n, want);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            why = strerror(errno);
            break;
        }
        if (got == 0)
            break;
        const char *nul = memchr(buf + n, 0, (size_t)got);
        if (nul) {
            fprintf(stderr, "kiln opt: %s: not IR text (expected kiln-ir text, got a NUL byte at "
                            "offset %zu)\n", name, (size_t)(nul - buf));
            goto fail;
        }
        n += (size_t)got;
        if (n > OPT_IR_MAX) {
            fprintf(stderr, "kiln opt: %s: more than %zu bytes of IR text (expected at most "
                            "%zu)\n", name, OPT_IR_MAX, OPT_IR_MAX);
            goto fail;
        }
    }
    if (why) {
        fprintf(stderr, "kiln opt: %s: cannot read: %s\n", name, why);
        goto fail;
    }
    if (!in)
        close(fd);
    buf[n] = 0;
    /* a pass test (tests/passes) is its own input: the IR ends at the line
     * "# >>> ..." that starts the expected output */
    for (char *l = buf; *l; l++) {
        if (strncmp(l, "# >>>", 5) == 0) {
            *l = 0;
            break;
        }
        if (!(l = strchr(l, '\n')))
            break;
    }
    return buf;
fail:
    if (!in)
        close(fd);
    free(buf);
    return NULL;
}

/* --passes=P1,P2,...: the passes into out (at most max); the count, or -1
 * after printing the error. */
static int opt_passes(const char *list, const Pass **out, int max)
{
    int n = 0;
    const char *p = list;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char name[64];
        if (len == 0 || len >= sizeof name) {
            bad_flag("opt", "--passes expects P1,P2,... (attention, autodiff, attnlayout, "
                            "optimizer, simplify, attndqkv, remat, fuse, comm, schedule, "
                            "memplan), got",
                     list);
            return -1;
        }
        memcpy(name, p, len);
        name[len] = 0;
        const Pass *ps = pass_find(name);
        if (!ps) {
            bad_flag("opt", "unknown pass in --passes (expected attention, autodiff, attnlayout, "
                            "optimizer, simplify, attndqkv, remat, fuse, comm, schedule or "
                            "memplan)",
                     name);
            return -1;
        }
        if (n == max) {
            bad_flag("opt", "too many passes in --passes", list);
            return -1;
        }
        out[n++] = ps;
        if (!e)
            return n;
        p = e + 1;
    }
}

/* kiln opt's hook: how many passes have finished (the next one is the one
 * that failed, when pass_run fails after the first) */
static void opt_count(const char *pass, const Graph *g, double seconds, void *ctx)
{
    (void)pass, (void)g, (void)seconds;
    ++*(int *)ctx;
}

static int cmd_opt(int argc, char **argv)
{
    const char *file = NULL, *plist = NULL, *dump_dir = NULL;
    RtGraphFlags gf = {.memory_budget = -1};
    TrainCfg c;
    fe_train_defaults(&c);
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage_opt, stdout);
            return 0;
        } else if ((v = cli_flag_value(argc, argv, &i, "--passes"))) {
            plist = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--set"))) {
            if (!opt_set(&c, v))
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--nproc"))) {
            int64_t n;
            if (!int_flag("opt", "--nproc", v, 1, MAX_NPROC, &n))
                return 2;
            gf.nranks = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp-rank"))) {
            int64_t n;
            if (!int_flag("opt", "--tp-rank", v, 0, MAX_NPROC - 1, &n))
                return 2;
            gf.tp_rank = (int)n;
        } else if (strcmp(argv[i], "--no-overlap") == 0) {
            gf.no_overlap = true;
        } else if (strcmp(argv[i], "--no-fuse") == 0) {
            gf.no_fuse = true;
        } else if (strcmp(argv[i], "--no-fuse-attention") == 0) {
            gf.no_fuse_attention = true;
        } else if (strcmp(argv[i], "--fuse-attention") == 0) {
            gf.no_fuse_attention = false;
        } else if ((v = cli_flag_value(argc, argv, &i, "--memory-budget"))) {
            if ((gf.memory_budget = parse_budget("opt", v)) < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--remat"))) {
            if ((gf.remat = pass_remat_parse_policy(v)) < 0)
                return bad_flag("opt", "--remat expects none, full, selective or auto, got", v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-dir"))) {
            dump_dir = v;
        } else if (argv[i][0] == '-' && argv[i][1] != 0) {
            return bad_flag("opt", "unknown option", argv[i]);
        } else if (!file) {
            file = argv[i];
        } else {
            return bad_flag("opt", "more than one IR file given", argv[i]);
        }
    }
    if (!file)
        return bad_flag("opt", "missing argument", "FILE.ir");
    if (!plist)
        return bad_flag("opt", "missing option", "--passes=P1,P2,...");
    const Pass *passes[64];
    int np = opt_passes(plist, passes, 64);
    if (np < 0)
        return 2;
    char *text = opt_read(file);
    if (!text)
        return 1;
    const char *name = strcmp(file, "-") == 0 ? "<stdin>" : file;
    char err[2048];
    Graph *g = ir_parse(text, name, err, sizeof err);
    free(text);
    if (!g) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (!ir_verify(g, err, sizeof err)) {
        fprintf(stderr, "%s: invalid IR: %s\n", name, err);
        ir_free(g);
        return 1;
    }
    /* the passes must accept the graph (no autodiff on gradients, no
     * simplify after fuse): refused before any of them runs */
    if (!pass_check(g, passes, np, err, sizeof err)) {
        fprintf(stderr, "kiln opt: %s: %s\n", name, err);
        ir_free(g);
        return 1;
    }
    if (dump_dir && mkdir(dump_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "kiln opt: %s: cannot create the dump directory: %s\n", dump_dir,
                strerror(errno));
        ir_free(g);
        return 1;
    }
    PassOpts po;
    rt_pass_opts(&c, &gf, &po);
    po.dump_dir = dump_dir;
    MemPlan *mp = NULL;
    po.memplan = &mp;
    Diag d = {{0}};
    int rc = 0, done = 0;
    if (pass_run(g, passes, np, &po, opt_count, &done, &d))
        pass_dump(passes[np - 1]->name, g, mp, stdout);
    else {
        /* the file and the pass that failed, then the pass's message */
        const char *pass = passes[done < np ? done : np - 1]->name;
        size_t pl = strlen(pass);
        bool named = strncmp(d.msg, pass, pl) == 0 && d.msg[pl] == ':'; /* "optimizer: ..." */
        fprintf(stderr, "kiln opt: %s: %s%s%s\n", name, named ? "" : pass, named ? "" : ": ",
                d.msg);
        rc = 1;
    }
    pass_memplan_free(mp);
    ir_free(g);
    return rc;
}

/* rc, or 1 when standard output could not be written (a full disk, a
 * closed pipe): a summary or dump cut short must not exit 0. */
static int check_stdout(int rc)
{
    int err = errno; /* an earlier failed write's reason, most likely */
    if (fflush(stdout) != 0)
        err = errno;
    else if (!ferror(stdout))
        return rc;
    if (err != ENOSPC && err != EDQUOT && err != EFBIG && err != EPIPE && err != EBADF)
        err = EIO;
    fprintf(stderr, "kiln: cannot write standard output: %s\n", strerror(err));
    return rc ? rc : 1;
}

/* OpenBLAS picks its kernels when it loads; on a CPU newer than the library
 * it falls back to old ones (runtime/cpu/blas.c). Then kiln runs itself
 * again with OPENBLAS_CORETYPE set, before doing anything else; ranks that
 * `--nproc` starts inherit the setting. */
static void blas_kernels(int argc, char **argv)
{
    bool verbose = false;
    for (int i = 2; i < argc; i++)
        verbose |= strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--verbose") == 0;
    const char *better = rt_blas_better_core();
    if (!better) {
        if (verbose)
            fprintf(stderr, "kiln: OpenBLAS runs its %s kernels%s\n", rt_blas_core(),
                    getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "");
        return;
    }
    if (verbose)
        fprintf(stderr, "kiln: OpenBLAS chose its %s kernels, older than this CPU; running again "
                        "with OPENBLAS_CORETYPE=%s\n", rt_blas_core(), better);
    fflush(stderr);
    if (setenv("OPENBLAS_CORETYPE", better, 1) == 0)
        execv("/proc/self/exe", argv);
    fprintf(stderr, "kiln: cannot run again with OPENBLAS_CORETYPE=%s (%s): GEMMs run OpenBLAS's "
                    "%s kernels, slower than this CPU allows\n", better, strerror(errno),
            rt_blas_core());
}

int main(int argc, char **argv)
{
    blas_kernels(argc, argv);
    rt_blas_one_thread();
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(usage_main, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "compile") == 0)
        return check_stdout(cmd_compile(argc, argv));
    if (strcmp(argv[1], "train") == 0)
        return check_stdout(cmd_train(argc, argv));
    if (strcmp(argv[1], "plan") == 0)
        return check_stdout(cli_plan(argc, argv));
    if (strcmp(argv[1], "eval") == 0)
        return check_stdout(cli_eval(argc, argv));
    if (strcmp(argv[1], "predict") == 0)
        return check_stdout(cli_predict(argc, argv));
    if (strcmp(argv[1], "sample") == 0)
        return check_stdout(cli_sample(argc, argv));
    if (strcmp(argv[1], "opt") == 0)
        return check_stdout(cmd_opt(argc, argv));
    if (strcmp(argv[1], "__measure-mpi") == 0) /* kiln plan's MPI measurement, one rank */
        return rt_mpi_measure_main(argc, argv);
    fprintf(stderr,
            "kiln: unknown command '%s' (expected compile, train, eval, predict, sample, plan or "
            "opt; see kiln --help)\n",
            argv[1]);
    return 2;
}
