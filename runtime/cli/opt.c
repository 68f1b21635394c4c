/* opt.c - `kiln opt`: runs passes on an IR file (a dump, a bug report, a
 * pass test) and prints what --dump-after would. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend.h"
#include "ir.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"
#include "cli.h"

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
        cli_bad_flag("opt", "--set expects KEY=VALUE, got", kv);
        return false;
    }
    memcpy(key, kv, n);
    key[n] = 0;
    const FeTrainKey *k = NULL;
    for (size_t i = 0; i < sizeof opt_keys / sizeof opt_keys[0]; i++)
        if (strcmp(key, opt_keys[i]) == 0)
            k = fe_train_key(key);
    if (!k) {
        cli_bad_flag("opt", "--set: not a setting the passes read (expected optimizer, beta1, "
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
            cli_bad_flag("opt", "--passes expects P1,P2,... (attention, autodiff, attnlayout, "
                                "optimizer, simplify, attndqkv, remat, fuse, comm, schedule, "
                                "memplan), got",
                         list);
            return -1;
        }
        memcpy(name, p, len);
        name[len] = 0;
        const Pass *ps = pass_find(name);
        if (!ps) {
            cli_bad_flag("opt", "unknown pass in --passes (expected attention, autodiff, "
                                "attnlayout, optimizer, simplify, attndqkv, remat, fuse, comm, "
                                "schedule or memplan)",
                         name);
            return -1;
        }
        if (n == max) {
            cli_bad_flag("opt", "too many passes in --passes", list);
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

int cli_opt(int argc, char **argv)
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
            if (!cli_int_flag("opt", "--nproc", v, 1, CLI_MAX_NPROC, &n))
                return 2;
            gf.nranks = (int)n;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tp-rank"))) {
            int64_t n;
            if (!cli_int_flag("opt", "--tp-rank", v, 0, CLI_MAX_NPROC - 1, &n))
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
            if ((gf.memory_budget = cli_parse_budget("opt", v)) < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--remat"))) {
            if ((gf.remat = pass_remat_parse_policy(v)) < 0)
                return cli_bad_flag("opt", "--remat expects none, full, selective or auto, got", v);
        } else if ((v = cli_flag_value(argc, argv, &i, "--dump-dir"))) {
            dump_dir = v;
        } else if (argv[i][0] == '-' && argv[i][1] != 0) {
            return cli_bad_flag("opt", "unknown option", argv[i]);
        } else if (!file) {
            file = argv[i];
        } else {
            return cli_bad_flag("opt", "more than one IR file given", argv[i]);
        }
    }
    if (!file)
        return cli_bad_flag("opt", "missing argument", "FILE.ir");
    if (!plist)
        return cli_bad_flag("opt", "missing option", "--passes=P1,P2,...");
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
