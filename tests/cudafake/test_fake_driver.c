/* test_fake_driver.c - the fake CUDA driver's own checks (fake_cuda.c),
 * without kiln: each case runs in a child process and must either finish
 * (status 0) or be stopped by the fake (status 86) with its message on
 * stderr. Cases: a host pointer as a device pointer, a copy past the end of
 * its allocation, freed memory, a host access into an allocation's guard
 * page, pageable memory in an asynchronous copy; two streams writing the
 * same bytes (a race), the same ordered by an event (none), the legacy
 * stream against a non-blocking stream (a race) and against a blocking one
 * (none); a wait applied one op late (FAKE_CUDA_LATE_WAIT) letting that
 * op race, and not the next one; inside a capture: synchronising the capturing stream, allocating
 * and legacy-stream work fail with the capture error codes and the capture
 * ends invalidated; a replayed graph re-runs its copies reading the host
 * memory of the moment; a device-to-host copy's destination reads NaN
 * before the synchronisation; a pinned source changed before its copy ran.
 * Run by ctest as cuda_fake_driver. */
#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "check failed at line %d: %s\n", __LINE__, #c);       \
            _exit(1);                                                             \
        }                                                                         \
    } while (0)

static CUstream s1, s2, sb;

static void setup(void)
{
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUcontext c;
    CHECK(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(c) == CUDA_SUCCESS);
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuStreamCreate(&sb, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
}

static CUdeviceptr dalloc(size_t n)
{
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, n) == CUDA_SUCCESS);
    return p;
}

static unsigned char *pinned(size_t n)
{
    void *h;
    CHECK(cuMemAllocHost(&h, n) == CUDA_SUCCESS);
    return h;
}

static int run_case(const char *name)
{
    if (!strncmp(name, "late_wait", 9))
        setenv("FAKE_CUDA_LATE_WAIT", "1", 1);
    setup();
    CUdeviceptr p = dalloc(1000);
    unsigned char *h = pinned(4096);
    if (!strcmp(name, "hostptr")) {
        cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)h, h, 16, s1);
    } else if (!strcmp(name, "past_end")) {
        cuMemcpyHtoDAsync(p, h, 1001, s1);
    } else if (!strcmp(name, "freed")) {
        CHECK(cuMemFree(p) == CUDA_SUCCESS);
        cuMemsetD8Async(p, 0, 8, s1);
    } else if (!strcmp(name, "guard_page")) {
        ((volatile unsigned char *)(uintptr_t)p)[1024] = 1; /* 1000 rounds to 1024: the guard */
    } else if (!strcmp(name, "pageable")) {
        static unsigned char buf[64];
        cuMemcpyHtoDAsync(p, buf, 64, s1);
    } else if (!strcmp(name, "race")) {
        cuMemsetD8Async(p, 1, 64, s1);
        cuMemsetD8Async(p + 32, 2, 64, s2);
        cuStreamSynchronize(s2);
    } else if (!strcmp(name, "event_orders")) {
        CUevent e;
        CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
        cuMemsetD8Async(p, 1, 64, s1);
        CHECK(cuEventRecord(e, s1) == CUDA_SUCCESS);
        CHECK(cuStreamWaitEvent(s2, e, 0) == CUDA_SUCCESS);
        cuMemsetD8Async(p + 32, 2, 64, s2);
        CHECK(cuStreamSynchronize(s2) == CUDA_SUCCESS);
        CHECK(cuMemcpyDtoHAsync(h, p, 96, s2) == CUDA_SUCCESS);
        CHECK(cuStreamSynchronize(s2) == CUDA_SUCCESS);
        CHECK(h[0] == 1 && h[31] == 1 && h[32] == 2 && h[95] == 2);
    } else if (!strcmp(name, "late_wait") || !strcmp(name, "late_wait_next")) {
        /* the first wait applies only after s2's next op (not an event
         * record): that op races with s1's memset, the one after does not */
        CUevent e;
        CUdeviceptr q = dalloc(64);
        CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
        cuMemsetD8Async(p, 1, 64, s1);
        CHECK(cuEventRecord(e, s1) == CUDA_SUCCESS);
        CHECK(cuStreamWaitEvent(s2, e, 0) == CUDA_SUCCESS);
        if (!strcmp(name, "late_wait_next"))
            CHECK(cuMemsetD8Async(q, 3, 64, s2) == CUDA_SUCCESS); /* other bytes */
        cuMemsetD8Async(p + 32, 2, 64, s2);
        cuStreamSynchronize(s2);
        cuStreamSynchronize(s1);
    } else if (!strcmp(name, "legacy_nonblocking")) {
        cuMemsetD8(p, 1, 64);
        cuMemsetD8Async(p, 2, 64, s1);
        cuStreamSynchronize(s1);
        cuStreamSynchronize(NULL);
    } else if (!strcmp(name, "legacy_blocking")) {
        CHECK(cuMemsetD8(p, 1, 64) == CUDA_SUCCESS);
        CHECK(cuMemsetD8Async(p, 2, 64, sb) == CUDA_SUCCESS);
        CHECK(cuMemcpyDtoHAsync(h, p, 64, sb) == CUDA_SUCCESS);
        CHECK(cuStreamSynchronize(sb) == CUDA_SUCCESS);
        CHECK(h[0] == 2 && h[63] == 2);
    } else if (!strcmp(name, "capture_rules")) {
        CUgraph g = NULL;
        CUdeviceptr q;
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
        CHECK(cuStreamSynchronize(s1) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g);
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
        CHECK(cuMemAlloc(&q, 64) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g);
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
        CHECK(cuMemsetD8(p, 0, 8) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        CHECK(cuStreamEndCapture(s1, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !g);
        CHECK(cuStreamSynchronize(s1) == CUDA_SUCCESS); /* no capture any more */
    } else if (!strcmp(name, "graph_replay")) {
        CUgraph g;
        CUgraphExec x;
        h[0] = 5;
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
        CHECK(cuMemsetD8Async(p, 9, 16, s1) == CUDA_SUCCESS);
        CHECK(cuMemcpyHtoDAsync(p + 1, h, 1, s1) == CUDA_SUCCESS);
        CHECK(cuStreamEndCapture(s1, &g) == CUDA_SUCCESS && g);
        CHECK(cuGraphInstantiate(&x, g, 0) == CUDA_SUCCESS);
        unsigned char *r = pinned(16);
        for (int k = 0; k < 2; k++) {
            h[0] = (unsigned char)(20 + k); /* a replay's copy reads it as it is then */
            CHECK(cuGraphLaunch(x, s1) == CUDA_SUCCESS);
            CHECK(cuMemcpyDtoHAsync(r, p, 16, s1) == CUDA_SUCCESS);
            CHECK(cuStreamSynchronize(s1) == CUDA_SUCCESS);
            CHECK(r[0] == 9 && r[1] == 20 + k && r[2] == 9);
        }
    } else if (!strcmp(name, "dtoh_poison")) {
        CHECK(cuMemsetD8Async(p, 3, 16, s1) == CUDA_SUCCESS);
        CHECK(cuMemcpyDtoHAsync(h, p, 16, s1) == CUDA_SUCCESS);
        CHECK(h[0] == 0xff && h[15] == 0xff); /* not synchronised yet */
        CHECK(cuStreamSynchronize(s1) == CUDA_SUCCESS);
        CHECK(h[0] == 3 && h[15] == 3);
    } else if (!strcmp(name, "source_changed")) {
        h[0] = 1;
        CHECK(cuMemcpyHtoDAsync(p, h, 16, s1) == CUDA_SUCCESS);
        h[0] = 2; /* before the stream ran the copy */
        cuStreamSynchronize(s1);
    } else {
        return 2;
    }
    return 0;
}

typedef struct {
    const char *name;
    int status;       /* 0 or 86 (stopped by the fake) */
    const char *msg;  /* in stderr when stopped */
} Case;

static const Case cases[] = {
    {"hostptr", 86, "is not device memory (a host pointer"},
    {"past_end", 86, "past the end of its allocation"},
    {"freed", 86, "freed device memory"},
    {"guard_page", 86, "inaccessible device memory"},
    {"pageable", 86, "pageable host memory"},
    {"race", 86, "race: cuMemsetD8Async"},
    {"event_orders", 0, NULL},
    {"legacy_nonblocking", 86, "race: "},
    {"late_wait", 86, "race: cuMemsetD8Async"},
    {"late_wait_next", 0, NULL},
    {"legacy_blocking", 0, NULL},
    {"capture_rules", 0, NULL},
    {"graph_replay", 0, NULL},
    {"dtoh_poison", 0, NULL},
    {"source_changed", 86, "changed the pinned source"},
};

int main(int argc, char **argv)
{
    if (argc == 2)
        return run_case(argv[1]);
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const Case *c = &cases[i];
        char err[] = "/tmp/kiln-fake-driver-XXXXXX";
        int fd = mkstemp(err);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(fd, 2);
            execl("/proc/self/exe", argv[0], c->name, (char *)NULL);
            _exit(3);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        char text[4096] = "";
        ssize_t n = pread(fd, text, sizeof text - 1, 0);
        text[n > 0 ? n : 0] = 0;
        close(fd);
        unlink(err);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        bool ok = code == c->status && (!c->msg || strstr(text, c->msg));
        printf("%-20s %s (status %d)%s%s", c->name, ok ? "ok" : "FAILED", code,
               text[0] ? ": " : "\n", text);
        bad += !ok;
    }
    return bad ? 1 : 0;
}
