/* main.c - the kiln command line: picks the command (compile.c, train.c,
 * opt.c, infer.c, sample.c, plan.c) and the flag parsing they share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend.h"
#include "ir.h"
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

int cli_bad_flag(const char *cmd, const char *msg, const char *arg)
{
    fprintf(stderr, "kiln %s: %s: %s\n(see `kiln %s --help`)\n", cmd, msg, arg, cmd);
    return 2;
}

bool cli_int_flag(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi,
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

int64_t cli_parse_budget(const char *cmd, const char *v)
{
    int64_t b = ir_parse_bytes(v);
    if (b <= 0) {
        cli_bad_flag(cmd, "--memory-budget expects a size like 512MiB, 2GiB or 1000000, got", v);
        return -1;
    }
    return b;
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
        return check_stdout(cli_compile(argc, argv));
    if (strcmp(argv[1], "train") == 0)
        return check_stdout(cli_train(argc, argv));
    if (strcmp(argv[1], "plan") == 0)
        return check_stdout(cli_plan(argc, argv));
    if (strcmp(argv[1], "eval") == 0)
        return check_stdout(cli_eval(argc, argv));
    if (strcmp(argv[1], "predict") == 0)
        return check_stdout(cli_predict(argc, argv));
    if (strcmp(argv[1], "sample") == 0)
        return check_stdout(cli_sample(argc, argv));
    if (strcmp(argv[1], "opt") == 0)
        return check_stdout(cli_opt(argc, argv));
    if (strcmp(argv[1], "__measure-mpi") == 0) /* kiln plan's MPI measurement, one rank */
        return rt_mpi_measure_main(argc, argv);
    fprintf(stderr,
            "kiln: unknown command '%s' (expected compile, train, eval, predict, sample, plan or "
            "opt; see kiln --help)\n",
            argv[1]);
    return 2;
}
