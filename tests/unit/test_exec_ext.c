/* test_exec_ext.c - the executor with a backend that has BackendExt hooks
 * (device collectives and device timing), on a stand-in CUDA module: the
 * test compiles a small libkiln_cuda.so whose backend keeps the arena in
 * host memory, runs nothing and logs every call, and loads it through
 * KILN_CUDA_MODULE with --device cuda.
 *
 * Checked: a plan with allreduce steps calls comm_setup once (one rank: rank
 * 0, size 1, no broadcast), hands every allreduce step to the hooks (never
 * to run_step) and every other step to run_step, in plan order; --profile
 * takes the per-step times from step_times without synchronising per step;
 * rt_exec_device_seconds returns run_seconds; a plan without allreduce
 * steps calls no comm_setup; the CPU backend has no extensions (-1);
 * Backend.host decides which backend's code cache the executor prunes. */
#include "codegen.h"
#include "frontend.h"
#include "runtime.h"
#include "train.h"
#include "cpu.h"
#include "testutil.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KILN_C_COMPILER
#define KILN_C_COMPILER "cc"
#endif

static const char fake_module[] =
    "#include \"codegen.h\"\n"
    "#include \"runtime.h\"\n"
    "#include <stdarg.h>\n"
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "#include <string.h>\n"
    "char fake_log[1 << 20];\n"
    "int fake_len;\n"
    "static void say(const char *fmt, ...) {\n"
    "  va_list ap; va_start(ap, fmt);\n"
    "  fake_len += vsnprintf(fake_log + fake_len, sizeof fake_log - (size_t)fake_len, fmt, ap);\n"
    "  va_end(ap);\n"
    "}\n"
    "struct BackendCtx { const CgPlan *p; unsigned char *arena; };\n"
    "static BackendCtx *create(const CgPlan *p, const ExecOpts *o, Diag *d) {\n"
    "  (void)o; (void)d; BackendCtx *c = calloc(1, sizeof *c); c->p = p;\n"
    "  c->arena = calloc(1, (size_t)p->arena_bytes + 1); say(\"create\\n\"); return c;\n"
    "}\n"
    "static void destroy(BackendCtx *c) { free(c->arena); free(c); say(\"destroy\\n\"); }\n"
    "static void wr(BackendCtx *c, int64_t off, const void *s, int64_t n) { memcpy(c->arena + off, s, (size_t)n); }\n"
    "static void rd(BackendCtx *c, int64_t off, void *d, int64_t n) { memcpy(d, c->arena + off, (size_t)n); }\n"
    "static bool run(BackendCtx *c, int s, uint64_t seed, int64_t step, Diag *d) {\n"
    "  (void)c; (void)seed; (void)step; (void)d; say(\"step %d\\n\", s); return true;\n"
    "}\n"
    "static void sync_(BackendCtx *c) { (void)c; say(\"sync\\n\"); }\n"
    "static bool setup(BackendCtx *c, const RtCommGroup *g, Diag *d) {\n"
    "  (void)c; (void)d; say(\"setup rank=%d size=%d bcast=%d\\n\", g->rank, g->size, g->bcast != NULL);\n"
    "  return true;\n"
    "}\n"
    "static bool ar_start(BackendCtx *c, int s, Diag *d) { (void)d; say(\"start %d b%d\\n\", s, c->p->steps.v[s].bucket); return true; }\n"
    "static bool ar_wait(BackendCtx *c, int s, Diag *d) { (void)d; say(\"wait %d b%d\\n\", s, c->p->steps.v[s].bucket); return true; }\n"
    "static int events(BackendCtx *c, RtCommEvent *ev, int max, double *x) { (void)c; (void)ev; (void)max; *x = 0; return 0; }\n"
    "static double secs(BackendCtx *c) { (void)c; return 0.25; }\n"
    "static bool times(BackendCtx *c, double *a, double *b) {\n"
    "  for (int s = 0; s < c->p->steps.n; s++) { a[s] = 1e-3 * s; b[s] = 1e-3 * (s + 1); }\n"
    "  say(\"times\\n\"); return true;\n"
    "}\n"
    "static const BackendExt ext = {setup, ar_start, ar_wait, events, secs, times, NULL, NULL,\n"
    "                              NULL, NULL, NULL, NULL, NULL, NULL, NULL};\n"
    "static const Backend be = {\"fake-cuda\", create, destroy, wr, rd, run, sync_, &ext, false,\n"
    "                           NULL};\n"
    "const Backend *kiln_cuda_backend(const RtCudaHost *h);\n"
    "const Backend *kiln_cuda_backend(const RtCudaHost *h) { (void)h; return &be; }\n"
    "int kiln_cuda_device_count(char *why, size_t n);\n"
    "int kiln_cuda_device_count(char *why, size_t n) {\n"
    "  (void)why; (void)n; const char *e = getenv(\"KILN_FAKE_NDEV\"); return e ? atoi(e) : 1;\n"
    "}\n";

static char *dir;
static char *log_text;
static int *log_len;

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir("exec-ext");
    char *src = xasprintf("%s/fake.c", dir);
    write_file(src, fake_module);
    char *so = xasprintf("%s/libkiln_cuda.so", dir);
    char *cmd = xasprintf("'%s' -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fPIC -shared -Iir "
                          "-Ipasses -Icodegen -Iruntime -o '%s' '%s' 2>&1",
                          KILN_C_COMPILER, so, src);
    run_or_fail(cmd);
    free(cmd);
    setenv("KILN_CUDA_MODULE", so, 1);
    /* the executor's module handle is the one device.c opens: same path,
     * so dlopen returns it and its log is shared */
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    log_text = dlsym(h, "fake_log");
    log_len = dlsym(h, "fake_len");
    assert_non_null(log_text);
    assert_non_null(log_len);
    free(so);
    free(src);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(dir);
    free(dir);
    return 0;
}

static Graph *mlp_graph(int nranks)
{
    const char *sets[] = {"depth=3"};
    Model *m = load_model("models/mlp.lua", sets, 1);
    Graph *g = ir_clone(m->g);
    fe_model_free(m);
    PassOpts o;
    pass_opts_default(&o);
    o.nranks = nranks;
    o.bucket_bytes = 1024;
    Diag d = {{0}};
    if (!pass_pipeline(g, &o, NULL, NULL, NULL, &d))
        fail_msg("%s", d.msg);
    return g;
}

static void test_device_collectives(void **state)
{
    (void)state;
    Graph *g = mlp_graph(2);
    ExecOpts eo = {.device = "cuda", .profile = true};
    Diag d = {{0}};
    int at = *log_len;
    Exec *e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("%s", d.msg);
    const char *l = log_text + at;
    assert_non_null(strstr(l, "create\n"));
    assert_non_null(strstr(l, "setup rank=0 size=1 bcast=0\n"));
    assert_null(strstr(strstr(l, "setup ") + 1, "setup "));
    at = *log_len;
    assert_true(rt_exec_run(e, 1, 0, &d));
    /* the expected log, step by step */
    const CgPlan *p = rt_exec_plan(e);
    CgBuf want = {0};
    int nstart = 0, nwait = 0;
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        char b[64];
        if (st->kind == CG_STEP_ALLREDUCE_START) {
            snprintf(b, sizeof b, "start %d b%d\n", s, st->bucket);
            nstart++;
        } else if (st->kind == CG_STEP_ALLREDUCE_WAIT) {
            snprintf(b, sizeof b, "wait %d b%d\n", s, st->bucket);
            nwait++;
        } else {
            snprintf(b, sizeof b, "step %d\n", s);
        }
        cg_puts(&want, b);
    }
    cg_puts(&want, "times\n");
    assert_true(nstart >= 3 && nwait >= nstart);
    char *got = xasprintf("%.*s", *log_len - at, log_text + at);
    if (strcmp(got, want.s) != 0)
        fail_msg("calls:\n%s\nexpected:\n%s", got, want.s);
    free(got);
    free(want.s);
    /* per-step times from the device: step s took 1 ms */
    const RtProfRow *rows;
    int n = rt_exec_profile(e, &rows);
    double total = 0;
    int64_t calls = 0;
    for (int i = 0; i < n; i++) {
        total += rows[i].seconds;
        calls += rows[i].calls;
    }
    assert_int_equal(calls, p->steps.n);
    assert_true(total > 1e-3 * p->steps.n - 1e-9 && total < 1e-3 * p->steps.n + 1e-9);
    const RtTraceEvent *ev;
    assert_int_equal(rt_exec_trace(e, &ev), p->steps.n);
    assert_true(ev[2].start > 2e-3 - 1e-12 && ev[2].end < 3e-3 + 1e-12);
    assert_true(rt_exec_device_seconds(e) == 0.25);
    rt_exec_destroy(e);
    ir_free(g);
}

static void test_no_collectives(void **state)
{
    (void)state;
    Graph *g = mlp_graph(1);
    ExecOpts eo = {.device = "cuda"};
    Diag d = {{0}};
    int at = *log_len;
    Exec *e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("%s", d.msg);
    assert_true(rt_exec_run(e, 1, 0, &d));
    char *got = xasprintf("%.*s", *log_len - at, log_text + at);
    assert_null(strstr(got, "setup"));
    assert_null(strstr(got, "sync"));
    assert_null(strstr(got, "times"));
    assert_non_null(strstr(got, "step 0\n"));
    free(got);
    rt_exec_destroy(e);
    /* the CPU backend: no extensions */
    eo.device = "cpu";
    e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("%s", d.msg);
    assert_true(rt_exec_run(e, 1, 0, &d));
    assert_true(rt_exec_device_seconds(e) < 0);
    rt_exec_destroy(e);
    ir_free(g);
}

/* Backend.host: after creating a device backend (host false: the fake
 * module, like the CUDA module) the executor prunes the device code cache
 * (CACHE/cuda), whose writer links no kilncore; a host backend (the CPU)
 * caches its own kernels and leaves CACHE/cuda alone. What a prune removes
 * first: a temp file whose writer is gone. */
static void test_host_capability(void **state)
{
    (void)state;
    assert_true(rt_backend_cpu.host);
    Diag d = {{0}};
    const Backend *be = rt_backend_select("cuda", false, &d);
    assert_non_null(be);
    assert_false(be->host);
    char *cache = xasprintf("%s/cache", dir), *cu = xasprintf("%s/cuda", cache);
    assert_true(rt_mkdir_p(cu));
    pid_t pid = fork(); /* a writer that is gone: a child that has exited */
    if (pid == 0)
        _exit(0);
    assert_true(pid > 0 && waitpid(pid, NULL, 0) == pid);
    char *tmp = xasprintf("%s/k.cubin.tmp.%ld", cu, (long)pid);
    write_file(tmp, "half a cubin");
    Graph *g = mlp_graph(1);
    ExecOpts eo = {.device = "cpu", .cache_dir = cache};
    Exec *e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("%s", d.msg);
    rt_exec_destroy(e);
    if (access(tmp, F_OK) != 0)
        fail_msg("the CPU backend's executor pruned %s", tmp);
    eo.device = "cuda";
    e = rt_exec_create(g, &eo, &d);
    if (!e)
        fail_msg("%s", d.msg);
    rt_exec_destroy(e);
    if (access(tmp, F_OK) == 0)
        fail_msg("the device backend's executor left %s", tmp);
    ir_free(g);
    free(tmp);
    free(cu);
    free(cache);
}

/* Every local rank needs a GPU of its own: with 2 ranks on a machine whose
 * driver sees 1 GPU, --device cuda is a clear error and --device auto
 * trains on the CPU (every rank alike); with 2 GPUs both take the GPU. */
static void test_ranks_per_gpu(void **state)
{
    (void)state;
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("KILN_FAKE_NDEV", "1", 1);
    Diag d = {{0}};
    assert_null(rt_backend_select("cuda", false, &d));
    print_message("%s\n", d.msg);
    assert_non_null(strstr(d.msg, "2 ranks on this machine need 2 GPUs, the driver sees 1"));
    assert_ptr_equal(rt_backend_select("auto", false, &d), &rt_backend_cpu);
    setenv("KILN_FAKE_NDEV", "2", 1);
    const Backend *be = rt_backend_select("auto", false, &d);
    assert_non_null(be);
    assert_string_equal(be->name, "fake-cuda");
    setenv("KILN_FAKE_NDEV", "1", 1);
    setenv("KILN_CUDA_DEVICE", "0", 1); /* an explicit device: the user's choice */
    be = rt_backend_select("cuda", false, &d);
    assert_non_null(be);
    assert_string_equal(be->name, "fake-cuda");
    unsetenv("KILN_CUDA_DEVICE");
    unsetenv("KILN_FAKE_NDEV");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_collectives),
        cmocka_unit_test(test_no_collectives),
        cmocka_unit_test(test_host_capability),
        cmocka_unit_test(test_ranks_per_gpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
