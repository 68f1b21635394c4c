/* test_cuda_compile.c - the CUDA backend without a GPU: every kernel of
 * every model in models/ (their own configs, gpt at size=124M and at T=1;
 * tests/emu/split_reduce.lua's split loops), for the
 * training step and the evaluation graph, printed by the CUDA printer in f32
 * and in bf16 mixed precision, compiled through the CUDA module's own NVRTC
 * path for sm_90 and sm_80. Fails on any compile error, on any warning in
 * the NVRTC log, on any register spill ptxas reports (--ptxas-options=-v),
 * and on a function the cubin lacks or whose registers the log does not
 * report (cg_cuda_ptxas: the cost model's occupancy). Also: a broken kernel reports the
 * NVRTC error; the second compile of the same source is a cache hit; every
 * function's launch geometry is one the backend can use.
 *
 * Model kernels use the shared kernel cache ($KILN_CACHE_DIR; the spill and
 * warning checks read the cached NVRTC log), the error and cache checks a
 * fresh directory.
 *
 * The module (libkiln_cuda.so) is found beside $KILN_BIN. Where no CUDA
 * toolkit is installed the module is not built and the test is skipped
 * (exit 77: ctest reports Skipped); on a machine with the toolkit a missing
 * module fails. */
#include "cg_cuda.h"
#include "frontend.h"
#include "runtime.h"
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const archs[] = {"sm_90", "sm_80"};
static char *cache;
static int nkernels, ncompiles;

static bool have_toolkit(void)
{
    struct stat st;
    const char *p = getenv("CUDA_PATH");
    if (p && *p && stat(p, &st) == 0)
        return true;
    return stat("/usr/local/cuda/include/nvrtc.h", &st) == 0;
}

static int setup(void **state)
{
    (void)state;
    if (!getenv("KILN_CUDA_MODULE")) {
        const char *bin = getenv("KILN_BIN");
        if (!bin)
            bin = "build/kiln";
        char path[4096];
        const char *s = strrchr(bin, '/');
        snprintf(path, sizeof path, "%.*s/libkiln_cuda.so", s ? (int)(s - bin) : 1,
                 s ? bin : ".");
        setenv("KILN_CUDA_MODULE", path, 1);
    }
    struct stat st;
    if (stat(getenv("KILN_CUDA_MODULE"), &st) != 0) {
        if (have_toolkit()) {
            fprintf(stderr, "the CUDA toolkit is installed but %s was not built\n",
                    getenv("KILN_CUDA_MODULE"));
            return -1;
        }
        fprintf(stderr, "no CUDA toolkit: the CUDA module is not built; skipping\n");
        return 0;
    }
    cache = scratch_dir("cuda-cache");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (cache)
        remove_tree(cache);
    return 0;
}

static bool module_built(void) { return cache != NULL; }

/* Total bytes of spill stores and loads ptxas reports in log. */
static long spills(const char *log, char *where, size_t n)
{
    long total = 0;
    for (const char *p = log; (p = strstr(p, "bytes spill stores")); p++) {
        const char *q = p;
        while (q > log && q[-1] == ' ')
            q--;
        while (q > log && q[-1] >= '0' && q[-1] <= '9')
            q--;
        long st = strtol(q, NULL, 10);
        const char *l = strstr(p, "spill stores, ");
        long ld = l ? strtol(l + 14, NULL, 10) : 0;
        if (st + ld > 0 && !where[0]) {
            const char *b = q;
            while (b > log && b[-1] != '\n')
                b--;
            /* the function's name is on the line before */
            const char *fb = b > log ? b - 1 : b;
            while (fb > log && fb[-1] != '\n')
                fb--;
            snprintf(where, n, "%.*s", (int)(p - fb + 20), fb);
        }
        total += st + ld;
    }
    return total;
}

static bool contains(const void *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    const char *h = hay;
    for (size_t i = 0; i + k <= n; i++)
        if (h[i] == needle[0] && memcmp(h + i, needle, k) == 0 && (i + k == n || h[i + k] == 0))
            return true;
    return false;
}

/* Launch geometry the backend can use: every kernel step has its functions,
 * blocks are whole warps (the block reductions need it), column tiles are
 * 256 threads, grids are not empty. */
static void check_geometry(const char *what, const CgPlan *pl, const CgCudaProgram *q)
{
    for (int s = 0; s < pl->steps.n; s++) {
        const CgStep *st = &pl->steps.v[s];
        if (st->kind != CG_STEP_KERNEL) {
            assert_int_equal(q->step_fn[s], -1);
            continue;
        }
        /* every loop in order, one function each, several (a split loop) or
         * one for several (horizontal); an attention kernel (no loops) is
         * one function */
        const CgKernel *kk = pl->kernels.v[st->kernel];
        int nl = kk->attn.kind != CG_ATTN_NONE ? 1 : kk->loops.n, next = 0;
        for (int f = 0; f < q->step_nfn[s]; f++) {
            const CgCudaFn *fn = &q->fn.v[q->step_fn[s] + f];
            if (fn->loop == next)
                next += fn->nloops > 1 ? fn->nloops : 1; /* horizontal: several loops */
            else if (fn->loop != next - 1)
                fail_msg("%s: step %d: function %s computes loop %d after loop %d", what, s,
                         fn->name, fn->loop, next - 1);
            if (fn->split < 1 || (fn->split > 1 && !fn->rows && !fn->cols) ||
                (fn->part && q->part_bytes < fn->part_bytes))
                fail_msg("%s: %s: bad split (%lld blocks per outer index, %lld scratch bytes of "
                         "%lld)", what, fn->name, (long long)fn->split,
                         (long long)fn->part_bytes, (long long)q->part_bytes);
            if (fn->kernel != st->kernel || fn->threads % 32 || fn->threads < 32 ||
                fn->threads > 1024 || fn->blocks < 1 || (fn->cols && fn->threads != 256) ||
                (fn->rows && fn->cols))
                fail_msg("%s: %s: bad launch (kernel %d, %d threads, %lld blocks, rows %d, "
                         "cols %d)",
                         what, fn->name, fn->kernel, fn->threads, (long long)fn->blocks, fn->rows,
                         fn->cols);
        }
        if (next != nl)
            fail_msg("%s: step %d has functions for %d of %d loops", what, s, next, nl);
    }
}

/* The device arena of a program (CgCudaProgram.mem): bf16 buffers take 2
 * bytes per element; storages live at the same time never overlap; the
 * persistent region and every root's live range are the plan's; copies
 * and host offsets agree with it. Returns the device arena's bytes. */
static int64_t check_arena(const char *what, const CgPlan *pl, const CgCudaProgram *q)
{
    const Graph *g = pl->g;
    const MemPlan *m = q->mem, *f = pl->mem;
    if (!q->bf16 && m != f)
        fail_msg("%s: an f32 program re-planned its arena", what);
    if (m->persistent_bytes != f->persistent_bytes)
        fail_msg("%s: persistent region %lld bytes, the plan's %lld", what,
                 (long long)m->persistent_bytes, (long long)f->persistent_bytes);
    for (int t = 0; t < g->t.n; t++) {
        int64_t want = shape_numel(&g->t.v[t].s) * dtype_size(q->storage[t]);
        if (m->bytes[t] != want || m->root[t] != f->root[t])
            fail_msg("%s: tensor %d: %lld bytes (expected %lld), root %d (plan %d)", what, t,
                     (long long)m->bytes[t], (long long)want, m->root[t], f->root[t]);
        if (m->root[t] == t && (m->first[t] != f->first[t] || m->last[t] != f->last[t]))
            fail_msg("%s: tensor %d: live range changed", what, t);
        if (m->root[t] == t && m->offset[t] + m->bytes[t] > m->arena_bytes)
            fail_msg("%s: tensor %d past the arena", what, t);
    }
    bool *mat = pass_fuse_materialised(g); /* the others get no storage */
    for (int a = 0; a < g->t.n; a++) {
        if (m->root[a] != a || m->persistent[a] || m->bytes[a] == 0 || !mat[a])
            continue;
        for (int b = a + 1; b < g->t.n; b++) {
            if (m->root[b] != b || m->persistent[b] || m->bytes[b] == 0 || !mat[b])
                continue;
            bool live = m->first[a] <= m->last[b] && m->first[b] <= m->last[a];
            bool meet = m->offset[a] < m->offset[b] + m->bytes[b] &&
                        m->offset[b] < m->offset[a] + m->bytes[a];
            if (live && meet && m->first[a] >= 0 && m->first[b] >= 0)
                fail_msg("%s: tensors %d and %d are live together and overlap", what, a, b);
        }
    }
    free(mat);
    for (int i = 0; i < g->outs.n; i++) {
        int t = g->outs.v[i].t;
        if (cg_cuda_host_offset(q, f->offset[t], f->bytes[t]) != m->offset[t])
            fail_msg("%s: output %s: host offset does not follow its storage", what,
                     g->outs.v[i].name);
    }
    for (int s = 0; s < pl->steps.n; s++)
        if (pl->steps.v[s].kind == CG_STEP_COPY && pl->steps.v[s].op >= 0) {
            const Op *op = &g->ops.v[pl->steps.v[s].op];
            if (q->copy[s].dst != m->offset[op->out] || q->copy[s].src != m->offset[op->in[0]])
                fail_msg("%s: copy step %d not in the device arena's offsets", what, s);
        }
    return m->arena_bytes;
}

typedef struct {
    const char *src, *arch;
    bool ok;
    RtCudaBinary b;
    Diag d;
} Job;

static void *compile_job(void *arg)
{
    Job *j = arg;
    memset(&j->d, 0, sizeof j->d);
    j->ok = rt_cuda_compile(j->src, j->arch, NULL, false, &j->b, &j->d);
    return NULL;
}

/* Both architectures at once (NVRTC is thread-safe), then every check. */
static void compile_plan(const char *what, const CgPlan *pl)
{
    enum { NA = sizeof archs / sizeof archs[0] };
    double secs[2] = {0, 0};
    int64_t arena[2] = {0, 0};
    for (int bf = 0; bf < 2; bf++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CgCudaProgram *q = cg_cuda_program(pl, bf != 0);
        check_geometry(what, pl, q);
        arena[bf] = check_arena(what, pl, q);
        Job job[NA];
        pthread_t th[NA];
        /* the first compile loads the CUDA module; then the other archs in
         * threads (loading it from two threads at once races) */
        job[0] = (Job){.src = q->source, .arch = archs[0]};
        compile_job(&job[0]);
        for (int a = 1; a < NA; a++) {
            job[a] = (Job){.src = q->source, .arch = archs[a]};
            if (pthread_create(&th[a], NULL, compile_job, &job[a]) != 0)
                compile_job(&job[a]);
        }
        for (int a = 1; a < NA; a++)
            pthread_join(th[a], NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        secs[bf] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        for (int a = 0; a < NA; a++) {
            RtCudaBinary *b = &job[a].b;
            if (!job[a].ok)
                fail_msg("%s (%s, %s): %s", what, bf ? "bf16" : "f32", archs[a], job[a].d.msg);
            if (strstr(b->log, "warning"))
                fail_msg("%s (%s, %s): NVRTC warnings:\n%s", what, bf ? "bf16" : "f32",
                         archs[a], b->log);
            if (!strstr(b->log, "Used ") && q->fn.n > 0)
                fail_msg("%s: the NVRTC log has no ptxas report (expected --ptxas-options=-v)",
                         what);
            char where[512] = "";
            long sp = spills(b->log, where, sizeof where);
            if (sp > 0)
                fail_msg("%s (%s, %s): %ld bytes of register spills, first at:\n%s", what,
                         bf ? "bf16" : "f32", archs[a], sp, where);
            for (int i = 0; i < q->fn.n; i++)
                if (!contains(b->cubin, b->size, q->fn.v[i].name))
                    fail_msg("%s: the cubin lacks %s", what, q->fn.v[i].name);
            /* the cost model's occupancy figures: every function's */
            for (int i = 0; i < q->fn.n; i++)
                q->fn.v[i].regs = 0;
            cg_cuda_ptxas(q, b->log);
            if (q->ptxas_fns != q->fn.n)
                fail_msg("%s (%s): ptxas figures for %d of %d functions", what, archs[a],
                         q->ptxas_fns, q->fn.n);
            if (bf && !contains(b->cubin, b->size, "kiln_cast_f32_bf16"))
                fail_msg("%s: the bf16 cubin lacks kiln_cast_f32_bf16", what);
            if (bf && !contains(b->cubin, b->size, "kiln_cast_f32_bf16_multi"))
                fail_msg("%s: the bf16 cubin lacks kiln_cast_f32_bf16_multi", what);
            ncompiles++;
            rt_cuda_binary_free(b);
        }
        if (!bf)
            nkernels += q->fn.n;
        if (bf) {
            int nhalf = 0;
            for (int t = 0; t < pl->g->t.n; t++)
                nhalf += q->storage[t] == DT_BF16;
            fprintf(stderr,
                    "  %s: %d functions, %d tensors stored as bf16; arena %.2f MiB (f32), "
                    "%.2f MiB (bf16); NVRTC %.1f s (f32), %.1f s (bf16)%s\n",
                    what, q->fn.n, nhalf, (double)arena[0] / 1048576.0,
                    (double)arena[1] / 1048576.0, secs[0], secs[1],
                    NA > 1 ? ", archs in parallel" : "");
            /* bf16 activations must shrink the arena */
            if (nhalf > 0 && arena[1] >= arena[0])
                fail_msg("%s: the bf16 arena (%lld bytes) is not smaller than f32's (%lld)", what,
                         (long long)arena[1], (long long)arena[0]);
        }
        cg_cuda_program_free(q);
    }
}

static void compile_model(const char *path, const char *const *sets, int nsets)
{
    char err[1024], what[600];
    snprintf(what, sizeof what, "%s%s%s", path, nsets ? " --set " : "", nsets ? sets[0] : "");
    Model *m = fe_load_model(path, sets, nsets, err, sizeof err);
    if (!m)
        fail_msg("%s: %s", path, err);
    PassOpts po;
    pass_opts_default(&po);
    po.memory_budget = m->train.memory_budget;
    Diag d = {{0}};
    Graph *eg = ir_clone(m->g);
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("%s: pipeline: %s", what, d.msg);
    CgPlan *pl = cg_plan(m->g, &d);
    if (!pl)
        fail_msg("%s: plan: %s", what, d.msg);
    char w[700];
    snprintf(w, sizeof w, "%s [train step]", what);
    compile_plan(w, pl);
    cg_plan_free(pl);
    if (!pass_simplify(eg, &po, &d) || !pass_schedule(eg, &po, &d))
        fail_msg("%s: evaluation graph: %s", what, d.msg);
    pl = cg_plan(eg, &d);
    if (!pl)
        fail_msg("%s: evaluation plan: %s", what, d.msg);
    snprintf(w, sizeof w, "%s [evaluation]", what);
    compile_plan(w, pl);
    cg_plan_free(pl);
    ir_free(eg);
    fe_model_free(m);
}

static void test_every_model(void **state)
{
    (void)state;
    if (!module_built())
        skip();
    char **models = model_paths();
    int nmodels = 0;
    for (; models[nmodels]; nmodels++)
        compile_model(models[nmodels], NULL, 0);
    free_model_paths(models);
    const char *big[] = {"size=124M"}, *one[] = {"T=1"};
    compile_model("models/gpt.lua", big, 1);
    compile_model("models/gpt.lua", one, 1); /* row kernels with reduced extents of 1 */
    /* split loops in stages (LayerNorm, softmax, full and column reductions;
     * the tiny sizes run in test_emu_plan: their bf16 arena is no smaller) */
    compile_model("tests/emu/split_reduce.lua", NULL, 0);
    fprintf(stderr, "%d models (+ gpt 124M, gpt T=1, split_reduce): %d f32 functions, %d NVRTC "
                    "compiles\n",
            nmodels, nkernels, ncompiles);
}

static void test_error_and_cache(void **state)
{
    (void)state;
    if (!module_built())
        skip();
    char *bad = xasprintf("%s\nextern \"C\" __global__ void broken(float *p)\n{\n"
                          "    p[0] = undefined_name;\n}\n",
                          cg_cuda_prelude);
    RtCudaBinary b;
    Diag d = {{0}};
    assert_false(rt_cuda_compile(bad, "sm_90", cache, false, &b, &d));
    free(bad);
    if (!strstr(d.msg, "NVRTC failed") || !strstr(d.msg, "undefined_name"))
        fail_msg("unexpected diagnostic: %s", d.msg);

    char good[256];
    snprintf(good, sizeof good,
             "extern \"C\" __global__ void ok_%d(float *p) { p[threadIdx.x] *= 2.0f; }\n",
             (int)getpid());
    assert_true(rt_cuda_compile(good, "sm_90", cache, false, &b, &d));
    assert_false(b.cached);
    assert_true(b.size > 0);
    size_t n1 = b.size;
    rt_cuda_binary_free(&b);
    assert_true(rt_cuda_compile(good, "sm_90", cache, false, &b, &d));
    assert_true(b.cached);
    assert_int_equal(b.size, n1);
    assert_non_null(strstr(b.log, "Used "));
    rt_cuda_binary_free(&b);
    /* another architecture is another entry */
    assert_true(rt_cuda_compile(good, "sm_80", cache, false, &b, &d));
    assert_false(b.cached);
    rt_cuda_binary_free(&b);
}

/* The only file ending in .cubin under dir/cuda (malloc'd), or NULL. */
static char *only_cubin(const char *dir)
{
    char *cmd = xasprintf("ls '%s'/cuda/*.cubin", dir), *out = NULL;
    run_cmd(cmd, &out);
    free(cmd);
    char *nl = out ? strchr(out, '\n') : NULL;
    if (!nl || nl[1]) {
        free(out);
        return NULL;
    }
    *nl = 0;
    return out;
}

/* A damaged cached cubin (truncated, overwritten with garbage, one byte
 * changed: its size and checksum trailer no longer match) is compiled
 * again, and the next compile is a hit on the new entry. */
static void test_cubin_damaged(void **state)
{
    (void)state;
    if (!module_built())
        skip();
    char *dir = scratch_dir("cubin-damaged");
    char good[256];
    snprintf(good, sizeof good,
             "extern \"C\" __global__ void dmg_%d(float *p) { p[threadIdx.x] += 1.0f; }\n",
             (int)getpid());
    RtCudaBinary b;
    Diag d = {{0}};
    assert_true(rt_cuda_compile(good, "sm_90", dir, false, &b, &d));
    assert_false(b.cached);
    char *want = xmalloc(b.size);
    size_t n = b.size;
    memcpy(want, b.cubin, n);
    rt_cuda_binary_free(&b);
    char *path = only_cubin(dir);
    assert_non_null(path);
    static const char *damage[] = {"truncate -s %zu '%s'",
                                   "head -c %zu /dev/urandom > '%s'",
                                   "printf X | dd of='%s' bs=1 seek=%zu conv=notrunc 2>/dev/null"};
    for (int k = 0; k < 3; k++) {
        char *cmd = k < 2 ? xasprintf(damage[k], n / 2, path) : xasprintf(damage[k], path, n / 2);
        assert_int_equal(system(cmd), 0);
        free(cmd);
        assert_true(rt_cuda_compile(good, "sm_90", dir, false, &b, &d));
        if (b.cached)
            fail_msg("damage %d: the damaged cubin was used", k);
        assert_int_equal(b.size, n);
        assert_memory_equal(b.cubin, want, n);
        rt_cuda_binary_free(&b);
        assert_true(rt_cuda_compile(good, "sm_90", dir, false, &b, &d));
        assert_true(b.cached);
        assert_int_equal(b.size, n);
        rt_cuda_binary_free(&b);
    }
    free(path);
    free(want);
    remove_tree(dir);
    free(dir);
}

/* The checks of compile_plan and of the attention kernels see what they
 * look for: an NVRTC warning and a kernel that spills registers (96 live
 * floats under a 32-register budget), in the log and per function. */
static void test_checks_bite(void **state)
{
    (void)state;
    if (!module_built())
        skip();
    const char *src =
        "extern \"C\" __global__ void w(float *p) { int unused = 3; p[0] = 1.0f; }\n"
        "extern \"C\" __global__ void __launch_bounds__(1024, 2) sp(float *p)\n"
        "{\n"
        "    float r[96];\n"
        "    for (int i = 0; i < 96; i++) r[i] = p[i * blockDim.x + threadIdx.x];\n"
        "    for (int k = 0; k < 8; k++)\n"
        "        for (int i = 0; i < 96; i++) r[i] = r[i] * r[(i + k) % 96] + 1.0f;\n"
        "    float s = 0;\n"
        "    for (int i = 0; i < 96; i++) s += r[i];\n"
        "    p[threadIdx.x] = s;\n"
        "}\n";
    RtCudaBinary b;
    Diag d = {{0}};
    assert_true(rt_cuda_compile(src, "sm_90", cache, false, &b, &d));
    assert_non_null(strstr(b.log, "warning"));
    char where[512] = "";
    long sp = spills(b.log, where, sizeof where);
    if (sp <= 0 || !strstr(where, "sp"))
        fail_msg("no spill found in:\n%s", b.log);
    /* cg_cuda_ptxas (what the attention check reads per function) sees it */
    CgCudaFn fns[2] = {{.name = "w"}, {.name = "sp"}};
    CgCudaProgram q;
    memset(&q, 0, sizeof q);
    q.fn.v = fns;
    q.fn.n = q.fn.cap = 2;
    cg_cuda_ptxas(&q, b.log);
    if (q.ptxas_fns != 2 || fns[1].spill <= 0 || fns[0].spill != 0 || fns[1].regs > 32)
        fail_msg("cg_cuda_ptxas: %d functions, sp spills %d bytes in %d registers, w %d:\n%s",
                 q.ptxas_fns, fns[1].spill, fns[1].regs, fns[0].spill, b.log);
    rt_cuda_binary_free(&b);
}

/* The fused attention kernels (codegen/cuda_attn.c) on their own: forward
 * (o and lse, o alone, lse alone), dq and dk+dv (both, dv alone), f32 and
 * bf16, causal and not, head sizes 32, 64 and 128 and an odd one (40),
 * and in the head layout (strided q/k/v rows, ir.h), also as attention_dqkv's
 * two kernels and as the fused backward that replaces them (cuda_attn_bwd.c:
 * causal at head sizes 32, 64, 128, full at 64, and attention_dqkv's
 * layout; 56 functions, no two alike), in one program compiled for sm_90 and
 * sm_80 (in parallel): no error, no warning, every function in the cubin,
 * ptxas' figures (registers, shared memory, spills: cg_cuda_ptxas, what the
 * cost model reads) for every function, and no register spill in any of
 * them on either architecture. */
static void test_attention_kernels(void **state)
{
    (void)state;
    if (!module_built())
        skip();
    CgBuf b = {0};
    cg_puts(&b, cg_cuda_prelude);
    cg_puts(&b, cg_cuda_attn_lib);
    cg_puts(&b, cg_cuda_attn_bwd_lib);
    /* causal forward (o and lse), dq, dk+dv at every head size; then the
     * other forms: not causal, o alone, lse alone, dv alone */
    static const struct {
        int kind, d;
        bool causal, o, lse, dk;
    } forms[] = {
        {0, 32, 1, 1, 1, 1},  {1, 32, 1, 1, 1, 1},  {2, 32, 1, 1, 1, 1},  {0, 64, 1, 1, 1, 1},
        {1, 64, 1, 1, 1, 1},  {2, 64, 1, 1, 1, 1},  {0, 128, 1, 1, 1, 1}, {1, 128, 1, 1, 1, 1},
        {2, 128, 1, 1, 1, 1}, {0, 40, 1, 1, 1, 1},  {1, 40, 1, 1, 1, 1},  {2, 40, 1, 1, 1, 1},
        {0, 32, 0, 1, 1, 1},  {0, 64, 0, 1, 1, 1},  {0, 32, 0, 1, 0, 1},  {0, 64, 1, 0, 1, 1},
        {2, 64, 1, 1, 1, 0},
        /* the fused backward (cuda_attn_bwd.c): causal at every head size, full */
        {3, 32, 1, 1, 1, 1},  {3, 64, 1, 1, 1, 1},  {3, 128, 1, 1, 1, 1}, {3, 64, 0, 1, 1, 1},
    };
    /* and the head layout (ir.h) of gpt 124M: 12 heads of 64 read out of
     * [1, 1024, 2304] qkv rows; forward, dq, dk+dv, and a forward at 128;
     * then attention_dqkv's dq and dk+dv kernels, writing the gradients
     * into one [1, 1024, 2304] buffer (dk and dv one param), and its fused
     * backward (dq, dk and dv one param) */
    /* and the variants (docs/fusion.md): 4 key/value heads of the 12, a
     * window of 256 and ALiBi (forward, dq, dk+dv; vr 1); ALiBi alone in
     * attention_dqkv's dq and dk+dv (vr 2; the fused backward takes no
     * variant); a key-padding mask [B,1,1,T] (u8; vr 3) and a bias [H,T,T]
     * (in the kernels' dtype; vr 4; also attention_dqkv's dk+dv) */
    static const struct {
        int kind, d;
        bool dqkv;
        int vr;
    } heads[] = {{0, 64, 0, 0}, {1, 64, 0, 0}, {2, 64, 0, 0}, {0, 128, 0, 0},
                 {1, 64, 1, 0}, {2, 64, 1, 0}, {3, 64, 1, 0}, {0, 64, 0, 1},
                 {1, 64, 0, 1}, {2, 64, 0, 1}, {1, 64, 1, 2}, {2, 64, 1, 2},
                 {0, 64, 0, 3}, {1, 64, 0, 3}, {2, 64, 0, 3}, {0, 64, 0, 4},
                 {1, 64, 0, 4}, {2, 64, 1, 4}};
    enum { NF = sizeof forms / sizeof forms[0], NH = sizeof heads / sizeof heads[0] };
    CgCudaFn fns[2 * (NF + NH)];
    memset(fns, 0, sizeof fns);
    for (int bf = 0; bf < 2; bf++)
        for (int i = 0; i < NF; i++) {
            CgCudaAttn a = {.kind = (CgCudaAttnKind)forms[i].kind, .causal = forms[i].causal,
                            .scale = 0.125, .dt = bf ? DT_BF16 : DT_F32, .bh = 12, .tq = 1024,
                            .tk = 1024, .d = forms[i].d, .dv = forms[i].d, .want_o = forms[i].o,
                            .want_lse = forms[i].lse, .want_dk = forms[i].dk, .want_dv = true};
            CgCudaFn *f = &fns[bf * NF + i];
            f->name = xasprintf("attn_%s_%d", bf ? "bf16" : "f32", i);
            Diag d = {{0}};
            assert_true(cg_print_cuda_attn(&b, &a, f->name, f, &d));
        }
    for (int bf = 0; bf < 2; bf++)
        for (int i = 0; i < NH; i++) {
            int64_t H = 12, D = heads[i].d, T = 1024, K = heads[i].vr == 1 ? 4 : H,
                    W = (H + 2 * K) * D;
            CgCudaAttn a = {.kind = (CgCudaAttnKind)heads[i].kind, .causal = true,
                            .scale = 0.125, .dt = bf ? DT_BF16 : DT_F32, .bh = H, .tq = T,
                            .tk = T, .d = D, .dv = D, .want_o = true, .want_lse = true,
                            .want_dk = true, .want_dv = true};
            a.lay = (IrAttnLayout){.nb = 1, .nh = H, .Tq = T, .Tk = T, .D = D, .Dv = D};
            a.lay.q = (IrAttnStride){T * W, D, W, 0};
            a.lay.k = (IrAttnStride){T * W, D, W, H * D};
            a.lay.v = (IrAttnStride){T * W, D, W, (H + K) * D};
            a.lay.o = a.lay.dq = (IrAttnStride){T * H * D, D, H * D, 0};
            a.lay.dk = a.lay.dv = (IrAttnStride){T * K * D, D, K * D, 0};
            a.lay.st = (IrAttnStride){T * H, 1, H, 0};
            a.lay.g = H / K;
            a.lay.nhk = K;
            a.lay.window = heads[i].vr == 1 ? 256 : 0;
            a.lay.ah = heads[i].vr == 1 || heads[i].vr == 2 ? H : 0;
            a.lay.bdiv = a.lay.bmod = 1;
            if (heads[i].vr == 3) { /* [1,1,1,T]: one row for every item */
                a.lay.bias = IR_ATTN_MASK, a.bdt = DT_U8;
                a.lay.bdiv = H, a.lay.bbs = T, a.lay.bjs = 1;
            } else if (heads[i].vr == 4) { /* [H,T,T] */
                a.lay.bias = IR_ATTN_BIAS, a.bdt = a.dt;
                a.lay.bmod = H, a.lay.bbs = T * T, a.lay.bis = T, a.lay.bjs = 1;
            }
            if (heads[i].dqkv) {
                a.lay.dq = a.lay.q;
                a.lay.dk = a.lay.k;
                a.lay.dv = a.lay.v;
                a.one_dkv = true;
            }
            CgCudaFn *f = &fns[2 * NF + bf * NH + i];
            f->name = xasprintf("attn_heads_%s_%d", bf ? "bf16" : "f32", i);
            Diag d = {{0}};
            assert_true(cg_print_cuda_attn(&b, &a, f->name, f, &d));
        }
    enum { NA = sizeof archs / sizeof archs[0] };
    Job job[NA];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* the first compile loads the module; the others then run in parallel */
    job[0] = (Job){.src = b.s, .arch = archs[0]};
    compile_job(&job[0]);
    pthread_t th[NA];
    for (int a = 1; a < NA; a++) {
        job[a] = (Job){.src = b.s, .arch = archs[a]};
        if (pthread_create(&th[a], NULL, compile_job, &job[a]) != 0)
            compile_job(&job[a]);
    }
    for (int a = 1; a < NA; a++)
        pthread_join(th[a], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* the figures of every function, per architecture */
    CgCudaProgram q;
    memset(&q, 0, sizeof q);
    q.fn.v = fns;
    q.fn.n = q.fn.cap = 2 * (NF + NH);
    for (int a = 0; a < NA; a++) {
        RtCudaBinary bin = job[a].b;
        if (!job[a].ok)
            fail_msg("attention kernels (%s): %s", archs[a], job[a].d.msg);
        if (strstr(bin.log, "warning"))
            fail_msg("attention kernels (%s): NVRTC warnings:\n%s", archs[a], bin.log);
        for (int i = 0; i < q.fn.n; i++)
            if (!contains(bin.cubin, bin.size, fns[i].name))
                fail_msg("attention kernels: the cubin lacks %s", fns[i].name);
        for (int i = 0; i < q.fn.n; i++)
            fns[i].regs = fns[i].smem = fns[i].spill = 0;
        cg_cuda_ptxas(&q, bin.log);
        if (q.ptxas_fns != q.fn.n)
            fail_msg("attention kernels (%s): ptxas figures for %d of %d functions", archs[a],
                     q.ptxas_fns, q.fn.n);
        int maxregs = 0;
        for (int i = 0; i < q.fn.n; i++) {
            if (fns[i].spill > 0)
                fail_msg("attention kernels (%s): %s spills %d bytes (ptxas: %d registers)",
                         archs[a], fns[i].name, fns[i].spill, fns[i].regs);
            if (fns[i].smem > 48 * 1024)
                fail_msg("attention kernels (%s): %s uses %d bytes of static shared memory",
                         archs[a], fns[i].name, fns[i].smem);
            maxregs = fns[i].regs > maxregs ? fns[i].regs : maxregs;
        }
        /* the log's own spill lines agree (the parse above is not blind) */
        char where[512] = "";
        if (spills(bin.log, where, sizeof where) > 0)
            fail_msg("attention kernels (%s): register spills, first at:\n%s", archs[a], where);
        fprintf(stderr, "attention (%s): %d functions, at most %d registers, no spills\n",
                archs[a], q.fn.n, maxregs);
        for (int i = 2 * NF; i < q.fn.n; i++)
            fprintf(stderr, "  %s (kind %d, D %d%s): %d registers\n", fns[i].name,
                    heads[(i - 2 * NF) % NH].kind, heads[(i - 2 * NF) % NH].d,
                    heads[(i - 2 * NF) % NH].dqkv ? ", dqkv" : "", fns[i].regs);
        ncompiles++;
        rt_cuda_binary_free(&bin);
    }
    fprintf(stderr, "attention: NVRTC %.1f s for sm_90 and sm_80%s\n",
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
            job[0].b.cached ? " (cached)" : "");
    for (int i = 0; i < q.fn.n; i++) {
        free(fns[i].name);
        free(fns[i].param);
    }
    free(b.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_and_cache),
        cmocka_unit_test(test_cubin_damaged),
        cmocka_unit_test(test_checks_bite),
        cmocka_unit_test(test_attention_kernels),
        cmocka_unit_test(test_every_model),
    };
    /* KILN_TEST_FILTER=PATTERN runs only the matching tests; ctest runs the
     * file as three tests (tests/CMakeLists.txt), each with its own time
     * limit: KILN_TEST_PART=basic (the first three), attention, models */
    if (getenv("KILN_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KILN_TEST_FILTER"));
    const char *part = getenv("KILN_TEST_PART");
    size_t from = 0, n = sizeof tests / sizeof tests[0];
    if (part && strcmp(part, "basic") == 0)
        n = 3;
    else if (part && strcmp(part, "attention") == 0)
        from = 3, n = 1;
    else if (part && strcmp(part, "models") == 0)
        from = 4, n = 1;
    int failed = _cmocka_run_group_tests("test_cuda_compile", tests + from, n, setup, teardown);
    /* 77: ctest reports the test as skipped (no CUDA toolkit), not as passed */
    return failed == 0 && !module_built() ? 77 : failed;
}
