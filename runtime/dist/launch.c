/* launch.c - `kiln train --nproc N`: N local ranks under mpirun, and how each
 * rank ended.
 *
 * The launcher makes a status directory (KILN_RANK_STATUS_DIR), runs mpirun
 * with this binary and waits. Each rank writes DIR/rankR: "running PID" when
 * it starts, then "exit CODE", "lost R1, R2" (it stopped the job because it
 * lost those ranks), "stopped" (mpirun terminated it because another rank
 * failed) or "signal NAME" (it crashed: SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGABRT). A rank still "running" after mpirun returned vanished: killed
 * or crashed; the launcher names it. A rank that answers nothing within
 * comm_timeout (stopped or hung) is killed by the rank that found it out,
 * which writes "hung BY TIMEOUT" as its status (rt_rank_kill_hung).
 *
 * The launcher exits by itself: once a rank has failed (any final status
 * but "exit 0"), mpirun gets RT_LAUNCH_GRACE seconds to end the job, then
 * the launcher kills the ranks still running and mpirun. Open MPI's own
 * account of a failure (the MPI_ABORT notice, its daemons' ORTE_ERROR_LOG
 * lines while the job is torn down) is left out: mpirun runs with --quiet,
 * and its stderr passes through the launcher, which drops the
 * ORTE_ERROR_LOG lines and says how many it dropped. KILN_MPI_VERBOSE=1
 * keeps all of it.
 *
 * Stopping on request: SIGINT and SIGTERM only record the signal
 * (rt_stop_signal); the training loop stops after its current step and the
 * compile driver after its compile, so nothing is left half-written. The
 * launcher, when it gets one, creates DIR/stop and sends the signal to
 * every rank itself; a rank's SIGTERM without DIR/stop is mpirun stopping
 * the job because another rank failed, and ends the rank at once. */
#include "dist.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char status_path[4096], stop_path[4096];
static volatile sig_atomic_t status_final;
static volatile sig_atomic_t stop_sig;

int rt_stop_signal(void) { return stop_sig; }

const char *rt_signal_name(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    case SIGQUIT: return "SIGQUIT";
    default: return "a signal";
    }
}

static void write_status(const char *text)
{
    int fd = open(status_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, text, strlen(text));
    (void)w;
    close(fd);
}

/* SIGINT, SIGTERM: records the signal; see the top of this file. */
static void on_stop(int sig)
{
    if (sig == SIGTERM && status_path[0] && access(stop_path, F_OK) != 0) {
        if (!status_final) { /* else this rank has said how it ended (it failed) */
            status_final = 1;
            write_status("stopped\n");
            static const char msg[] = "kiln: stopped by mpirun (another rank failed)\n";
            ssize_t w = write(2, msg, sizeof msg - 1);
            (void)w;
        }
        _exit(143);
    }
    if (!stop_sig)
        stop_sig = sig;
}

void rt_stop_on_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static struct sigaction crash_old[32]; /* the handlers on_crash replaced */

/* A rank's crash: "signal NAME" into its status, then the handler it
 * replaced (MPI's backtrace, a sanitizer's report) or the default action. */
static void on_crash(int sig)
{
    if (!status_final) {
        status_final = 1;
        char buf[32] = "signal ";
        const char *n = rt_signal_name(sig);
        size_t k = strlen(buf), m = strlen(n);
        memcpy(buf + k, n, m);
        buf[k + m] = '\n';
        buf[k + m + 1] = 0;
        write_status(buf);
    }
    sigaction(sig, &crash_old[sig], NULL);
    raise(sig); /* pending until this handler returns; a fault then recurs */
}

void rt_rank_status(const char *fmt, ...)
{
    const char *dir = getenv("KILN_RANK_STATUS_DIR");
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!dir || !rank)
        return;
    if (!status_path[0]) {
        snprintf(stop_path, sizeof stop_path, "%s/stop", dir);
        snprintf(status_path, sizeof status_path, "%s/rank%s", dir, rank);
        rt_stop_on_signals();
        /* crashes by name (then whatever handled them before) */
        static const int crash[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
        for (size_t i = 0; i < sizeof crash / sizeof crash[0]; i++) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_crash;
            sigemptyset(&sa.sa_mask);
            sigaction(crash[i], &sa, &crash_old[crash[i]]);
        }
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

bool rt_rank_stop_requested(void)
{
    return status_path[0] && access(stop_path, F_OK) == 0;
}

static char *read_small(const char *path);

bool rt_rank_kill_hung(int rank, double timeout)
{
    const char *dir = getenv("KILN_RANK_STATUS_DIR");
    if (!dir || !status_path[0])
        return false;
    char *path = xasprintf("%s/rank%d", dir, rank);
    char *st = read_small(path);
    long pid = 0;
    bool ok = st && sscanf(st, "running %ld", &pid) == 1 && pid > 0 &&
              (pid_t)pid != getpid() && kill((pid_t)pid, SIGKILL) == 0;
    if (ok) {
        char *text = xasprintf("hung %s %g\n", getenv("OMPI_COMM_WORLD_RANK"), timeout);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            ssize_t w = write(fd, text, strlen(text));
            (void)w;
            close(fd);
        }
        free(text);
    }
    free(st);
    free(path);
    return ok;
}

static volatile sig_atomic_t interrupted, ninterrupts;

static void on_launcher_signal(int sig)
{
    if (!interrupted)
        interrupted = sig;
    ninterrupts++;
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

/* The launcher got sig: DIR/stop, then sig to every rank that has started
 * (they stop after their current step, together); to mpirun when a rank
 * has not started yet. */
static void stop_ranks(const char *dir, int nproc, pid_t mpirun, int sig)
{
    char *stop = xasprintf("%s/stop", dir);
    int fd = open(stop, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0)
        close(fd);
    free(stop);
    bool all = true;
    for (int r = 0; r < nproc; r++) {
        char *path = xasprintf("%s/rank%d", dir, r);
        char *st = read_small(path);
        long pid = 0;
        if (st && sscanf(st, "running %ld", &pid) == 1 && pid > 0)
            kill((pid_t)pid, sig);
        else
            all = false;
        free(st);
        free(path);
    }
    if (!all)
        kill(mpirun, sig);
}

/* Seconds mpirun gets to end the job after a rank failed, before the
 * launcher kills what is left. */
#define RT_LAUNCH_GRACE 10.0

/* Whether some rank has a final status other than "exit 0" (it failed, or
 * was killed as hung). */
static bool some_rank_failed(const char *dir, int nproc)
{
    bool failed = false;
    for (int r = 0; r < nproc && !failed; r++) {
        char *path = xasprintf("%s/rank%d", dir, r);
        char *st = read_small(path);
        failed = st && strncmp(st, "running", 7) != 0 && strcmp(st, "exit 0") != 0 &&
                 strcmp(st, "stopped") != 0;
        free(st);
        free(path);
    }
    return failed;
}

/* SIGKILL to every rank still "running PID". */
static void kill_ranks(const char *dir, int nproc)
{
    for (int r = 0; r < nproc; r++) {
        char *path = xasprintf("%s/rank%d", dir, r);
        char *st = read_small(path);
        long pid = 0;
        if (st && sscanf(st, "running %ld", &pid) == 1 && pid > 0)
            kill((pid_t)pid, SIGKILL);
        free(st);
        free(path);
    }
}

/* mpirun's stderr, relayed line by line to ours less Open MPI's teardown
 * noise (lines with ORTE_ERROR_LOG), counted in *hidden. Reads what fd has
 * (non-blocking); at_eof flushes a last partial line. Returns false at end
 * of file. */
typedef struct {
    int fd;
    char buf[8192];
    size_t len;
    int hidden;
    bool filter;
} Relay;

static void relay_line(Relay *rl, const char *line, size_t n)
{
    if (rl->filter && memmem(line, n, "ORTE_ERROR_LOG", 14)) {
        rl->hidden++;
        return;
    }
    while (n > 0) {
        ssize_t w = write(2, line, n);
        if (w <= 0 && errno != EINTR)
            return;
        if (w > 0)
            line += w, n -= (size_t)w;
    }
}

static bool relay(Relay *rl)
{
    if (rl->fd < 0)
        return false;
    for (;;) {
        ssize_t got = read(rl->fd, rl->buf + rl->len, sizeof rl->buf - rl->len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got > 0) {
            rl->len += (size_t)got;
            size_t start = 0;
            for (size_t i = 0; i < rl->len; i++)
                if (rl->buf[i] == '\n') {
                    relay_line(rl, rl->buf + start, i + 1 - start);
                    start = i + 1;
                }
            if (start == 0 && rl->len == sizeof rl->buf) /* a line longer than buf */
                relay_line(rl, rl->buf, rl->len), start = rl->len;
            memmove(rl->buf, rl->buf + start, rl->len - start);
            rl->len -= start;
            continue;
        }
        if (got == 0 || errno != EAGAIN) { /* end of file (or an error) */
            if (rl->len)
                relay_line(rl, rl->buf, rl->len);
            rl->len = 0;
            close(rl->fd);
            rl->fd = -1;
            return false;
        }
        return true;
    }
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
    const char *verbose = getenv("KILN_MPI_VERBOSE");
    bool quiet = !(verbose && strcmp(verbose, "1") == 0);
    if (quiet) /* no MPI_ABORT notice: the ranks and the launcher say what failed */
        vec_push(&av, "--quiet");
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
    int pfd[2] = {-1, -1};
    if (quiet && pipe(pfd) != 0)
        pfd[0] = pfd[1] = -1; /* no relay: mpirun writes to our stderr */
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kiln: cannot fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        if (pfd[1] >= 0) {
            dup2(pfd[1], 2);
            close(pfd[0]);
            close(pfd[1]);
        }
        execvp("mpirun", av.v);
        fprintf(stderr, "kiln: cannot run mpirun: %s (--nproc needs Open MPI: install "
                        "openmpi-bin)\n", strerror(errno));
        _exit(127);
    }
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_launcher_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    Relay rl = {.fd = pfd[0], .filter = quiet};
    if (pfd[1] >= 0) {
        close(pfd[1]);
        fcntl(rl.fd, F_SETFL, fcntl(rl.fd, F_GETFL) | O_NONBLOCK);
    }
    int ws = 0, forwarded = 0, polls = 0, overdue = 0;
    double failed_at = -1;
    for (;;) { /* polls: a signal may come at any moment, waitpid included */
        pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR))
            break;
        relay(&rl);
        if (interrupted && forwarded == 0)
            stop_ranks(dir, nproc, pid, interrupted);
        else if (ninterrupts > 1 && forwarded == 1)
            kill(pid, SIGTERM); /* asked twice: mpirun ends the job now */
        if (interrupted)
            forwarded = ninterrupts > 1 ? 2 : 1;
        /* a rank failed: mpirun ends the job, or the launcher does */
        if (++polls % 10 == 0) {
            if (failed_at < 0 && some_rank_failed(dir, nproc))
                failed_at = ir_now();
            double late = failed_at < 0 ? 0 : ir_now() - failed_at - RT_LAUNCH_GRACE;
            if (late > 0 && overdue == 0) {
                fprintf(stderr, "kiln: mpirun did not end the job within %g s of a rank's "
                                "failure; killing the ranks left and mpirun\n",
                        RT_LAUNCH_GRACE);
                kill_ranks(dir, nproc);
                kill(pid, SIGTERM);
                overdue = 1;
            } else if (late > 5 && overdue == 1) {
                kill(pid, SIGKILL);
                overdue = 2;
            }
        }
        usleep(20000);
    }
    /* what mpirun wrote last; a process it left behind may hold the pipe:
     * at most 2 s */
    for (double t0 = ir_now(); relay(&rl) && ir_now() - t0 < 2;)
        usleep(20000);
    if (rl.fd >= 0)
        close(rl.fd);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    vec_free(&av);

    int rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    bool all_ok = true, hung = false;
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
        } else if (strncmp(st, "signal ", 7) == 0) {
            all_ok = false;
            fprintf(stderr, "kiln: lost rank %d: it was killed by %s; the other ranks were "
                            "stopped\n", r, st + 7);
        } else if (strncmp(st, "hung ", 5) == 0) {
            all_ok = false;
            hung = true;
            int by = -1;
            double t = 0;
            sscanf(st + 5, "%d %lg", &by, &t);
            fprintf(stderr,
                    "kiln: lost rank %d: it stopped answering (stopped or hung: rank %d had no "
                    "answer from it within comm_timeout=%g s); it was killed and the other "
                    "ranks were stopped\n",
                    r, by, t);
        } else if (strcmp(st, "exit 0") != 0) {
            all_ok = false;
        }
        free(st);
        unlink(path);
        free(path);
    }
    char *stop = xasprintf("%s/stop", dir);
    unlink(stop);
    free(stop);
    rmdir(dir);
    free(dir);
    vec_push(&vanished, 0);
    if (interrupted) {
        if (vanished.n > 1)
            fprintf(stderr, "kiln: stopped by %s; rank %s ended before it could stop cleanly\n",
                    rt_signal_name(interrupted), vanished.v);
        else
            fprintf(stderr, "kiln: stopped by %s; every rank stopped cleanly\n",
                    rt_signal_name(interrupted));
        rc = 128 + interrupted;
    } else if (vanished.n > 1) {
        fprintf(stderr,
                "kiln: lost rank %s: it ended without finishing (killed or crashed); the "
                "other ranks were stopped\n",
                vanished.v);
    }
    vec_free(&vanished);
    if (rl.hidden)
        fprintf(stderr,
                "kiln: (left out %d line%s of Open MPI's log of tearing the job down "
                "(ORTE_ERROR_LOG); KILN_MPI_VERBOSE=1 shows them)\n",
                rl.hidden, rl.hidden == 1 ? "" : "s");
    if ((hung || overdue) && !interrupted) /* not mpirun's 137 or 143: kiln's side killed */
        rc = 1;
    if (rc == 0 && !all_ok)
        rc = 1;
    return rc;
}
