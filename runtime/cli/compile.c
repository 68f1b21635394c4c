/* compile.c - `kiln compile`: its flags, the pass pipeline with its dumps
 * (--dump-after, --dump-dir), and what it reports (summary.c prints most). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen.h"
#include "frontend.h"
#include "ir.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"
#include "cli.h"

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
    return n > 0 && n <= CLI_MAX_THREADS ? (int)n : 1;
}

int cli_compile(int argc, char **argv)
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
                return cli_bad_flag("compile", "unknown pass for --dump-after", v);
            vec_push(&a.dumps, v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-dir"))) {
            a.dump_dir = v;
        } else if (strcmp(argv[i], "--settings") == 0) {
            a.settings = true;
        } else if (strcmp(argv[i], "--time") == 0) {
            a.timing = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--nproc"))) {
            int64_t n;
            if (!cli_int_flag("compile", "--nproc", v, 1, CLI_MAX_NPROC, &n))
                return 2;
            a.nproc = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp"))) {
            int64_t n;
            if (!cli_int_flag("compile", "--tp", v, 1, CLI_MAX_NPROC, &n))
                return 2;
            a.tp = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--pp"))) {
            int64_t n;
            if (!cli_int_flag("compile", "--pp", v, 1, CLI_MAX_NPROC, &n))
                return 2;
            snprintf(a.pp_set, sizeof a.pp_set, "pp=%d", (int)n);
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp-rank"))) {
            int64_t n;
            if (!cli_int_flag("compile", "--tp-rank", v, 0, CLI_MAX_NPROC - 1, &n))
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
            if ((a.memory_budget = cli_parse_budget("compile", v)) < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--remat"))) {
            if ((a.remat = pass_remat_parse_policy(v)) < 0)
                return cli_bad_flag("compile", "--remat expects none, full, selective or auto, got",
                                    v);
        } else if (strcmp(argv[i], "--remat-sweep") == 0) {
            a.remat_sweep = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--log-dir"))) {
            if (!*v)
                return cli_bad_flag("compile", "--log-dir expects a directory, got",
                                    "an empty value");
            a.log_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dot"))) {
            if (!*v)
                return cli_bad_flag("compile", "--dot expects a file name, got", "an empty value");
            a.dot = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--dot-depth"))) {
            int64_t n;
            if (!cli_int_flag("compile", "--dot-depth", v, 1, 64, &n))
                return 2;
            a.dot_depth = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--target"))) {
            if (strcmp(v, "cpu") != 0 && !cg_device_find(v))
                return cli_bad_flag("compile",
                                    "--target expects cpu, a100, h100, h200 or b200, got", v);
            a.target = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads"))) {
            int64_t n;
            if (!cli_int_flag("compile", "--threads", v, 1, CLI_MAX_THREADS, &n))
                return 2;
            a.threads = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--cache-dir"))) {
            a.cache_dir = v;
        } else if (strcmp(argv[i], "--remeasure") == 0) {
            a.remeasure = true;
        } else if ((v = cli_flag_value(argc, argv, &i, "--calibrate"))) {
            if (!*v)
                return cli_bad_flag("compile", "--calibrate expects a kernel table file, got",
                                    "an empty value");
            a.calibrate = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--top"))) {
            int64_t n;
            if (!cli_int_flag("compile", "--top", v, 1, 100000, &n))
                return 2;
            a.top = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kernel-table"))) {
            if (!*v)
                return cli_bad_flag("compile", "--kernel-table expects a file name, got",
                                    "an empty value");
            a.ktable = v;
        } else if (argv[i][0] == '-') {
            return cli_bad_flag("compile", "unknown option", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return cli_bad_flag("compile", "more than one model given", argv[i]);
        }
    }
    if (!model)
        return cli_bad_flag("compile", "missing argument", "MODEL.lua");
    if (a.ktable && !a.target)
        return cli_bad_flag("compile", "--kernel-table needs --target DEVICE, got",
                            "no --target");
    if (a.calibrate && !a.target)
        return cli_bad_flag("compile", "--calibrate needs --target DEVICE, got", "no --target");
    if (a.dot_depth && !a.dot)
        return cli_bad_flag("compile", "--dot-depth needs --dot FILE, got", "no --dot");
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
