/* launch.c - `kiln train --nproc N`: N local ranks under mpirun, and how each
 * rank ended.
 *
 * The launcher makes a status directory (KILN_RANK_STATUS_DIR), runs mpirun
 * with this binary and waits. Each rank writes DIR/rankR: "running PID" when
 * it starts, then "exit CODE", "lost R1, R2" (it stopped the job because it
 * lost those ranks) or "stopped" (mpirun terminated it because another rank
 * failed). A rank still "running" after mpirun returned vanished: killed or
 * crashed; the launcher names it. */
#include "runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char status_path[4096];
static volatile sig_atomic_t status_final;

static void write_status(const char *text)
{
    int fd = open(status_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, text, strlen(text));
    (void)w;
    close(fd);
}

static void on_term(int sig)
{
    (void)sig;
    if (!status_final) {
        status_final = 1;
        write_status("stopped\n");
    }
    static const char msg[] = "kiln: stopped by mpirun (another rank failed)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(143);
}

void rt_rank_status(const char *fmt, ...)
{
    const char *dir = getenv("KILN_RANK_STATUS_DIR");
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!dir || !rank)
        return;
    if (!status_path[0]) {
        snprintf(status_path, sizeof status_path, "%s/rank%s", dir, rank);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
    }
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    strcat(buf, "\n");
    bool final = strncmp(buf, "running", 7) != 0;
    if (final) {
        if (status_final)
            return;
        status_final = 1;
    }
    write_status(buf);
}

static pid_t launched;
static volatile sig_atomic_t interrupted;

static void forward(int sig)
{
    interrupted = 1;
    if (launched > 0)
        kill(launched, sig);
}

static char *read_small(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char buf[512];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = 0;
    return xstrdup(buf);
}

int rt_launch(int nproc, int argc, char **argv)
{
    const char *tmp = getenv("TMPDIR");
    char *dir = xasprintf("%s/kiln-ranks-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "kiln: cannot create a status directory %s: %s\n", dir,
                strerror(errno));
        free(dir);
        return 1;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "kiln: cannot find its own binary (/proc/self/exe)\n");
        rmdir(dir);
        free(dir);
        return 1;
    }
    exe[n] = 0;
    char np[16];
    snprintf(np, sizeof np, "%d", nproc);
    VEC(char *) av = {0};
    const char *pre[] = {"mpirun", "-np", np, "--oversubscribe", "--bind-to", "none",
                         "-x", "KILN_RANK_STATUS_DIR", "-x", "KILN_STDOUT_TTY", NULL};
    for (const char **p = pre; *p; p++)
        vec_push(&av, (char *)*p);
    vec_push(&av, exe);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--nproc") == 0) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--nproc=", 8) == 0)
            continue;
        vec_push(&av, argv[i]);
    }
    vec_push(&av, NULL);
    setenv("KILN_RANK_STATUS_DIR", dir, 1);
    setenv("KILN_STDOUT_TTY", isatty(1) ? "1" : "0", 1);
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kiln: cannot fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        execvp("mpirun", av.v);
        fprintf(stderr, "kiln: cannot run mpirun: %s (--nproc needs Open MPI: install "
                        "openmpi-bin)\n", strerror(errno));
        _exit(127);
    }
    launched = pid;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    vec_free(&av);

    int rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    bool all_ok = true;
    VEC(char) vanished = {0};
    for (int r = 0; r < nproc; r++) {
        char *path = xasprintf("%s/rank%d", dir, r);
        char *st = read_small(path);
        if (!st || strncmp(st, "running", 7) == 0) {
            all_ok = false;
            char b[32];
            snprintf(b, sizeof b, "%s%d", vanished.n ? ", " : "", r);
            for (char *c = b; *c; c++)
                vec_push(&vanished, *c);
        } else if (strcmp(st, "exit 0") != 0) {
            all_ok = false;
        }
        free(st);
        unlink(path);
        free(path);
    }
    rmdir(dir);
    free(dir);
    if (vanished.n && interrupted) {
        fprintf(stderr, "kiln: interrupted; every rank was stopped\n");
    } else if (vanished.n) {
        vec_push(&vanished, 0);
        fprintf(stderr,
                "kiln: lost rank %s: it ended without finishing (killed or crashed); the "
                "other ranks were stopped\n",
                vanished.v);
    }
    vec_free(&vanished);
    if (rc == 0 && !all_ok)
        rc = 1;
    return rc;
}
