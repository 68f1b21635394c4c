/* measure.c - the `cpu` entry of the cost model's device table, measured on
 * this machine once and cached beside the kernel cache
 * (CACHE/cpu-device-T.txt for T threads, keyed by the CPU's model name,
 * the kernel compiler's version and flags, rt_cc_build_id, and OpenBLAS's
 * kernels, rt_blas_core; CACHE/cpu-device-T-rR.txt for one of R ranks of
 * T threads each, below):
 *
 *   f32     FMA peak: T threads each running fmaf chains (8 x 16 floats,
 *           independent) compiled like the kernels (-O3 -march=native,
 *           through rt_cc_compile), 2 FLOPs per fmaf;
 *   gemm    OpenBLAS sgemm (one thread each, as the backend runs it) on T
 *           threads at once, 512 x 512 x 512, the sum of their rates;
 *   bw      T threads copying 64 MiB each (bytes read + bytes written);
 *   bw1     the same on one thread;
 *   gemm1   one thread's sgemm on bands of 16, 64, 256 and 512 rows of a
 *           512 x 512 x 512 product (the backend splits GEMMs into bands);
 *   launch  one plan step's dispatch: the thread pool running an empty
 *           part on every thread (pool_run), per call;
 *   work    a generated kernel (tanh, exp, products over 2M elements)
 *           through the executor: element-operations (cg_kernel_work) per
 *           second per thread.
 *
 * One rank of R on this machine (rt_cpu_device_ranks, R > 1: `kiln train
 * --nproc R` gives each rank T threads and every rank computes at once)
 * is measured in that layout: every figure with the other ranks' R-1 x T
 * threads running the same job at the same time, timed on the rank's own
 * threads (f32, gemm and bw: its T threads, the slowest of them; gemm1 and
 * bw1: one thread of the rank; work: the generated
 * kernel beside the others' threads each running it through their own
 * executor), so that what the ranks share (memory bandwidth, caches, the
 * cores' clock under load) is in the figures. The copies are 64 MiB / R
 * per thread, so that all ranks together touch what one rank alone does:
 * the figure tells the ranks' sharing of the bandwidth apart from the
 * caches' size (two threads copying 64 MiB each spill a cache that one
 * keeps; a rank's kernels touch a few MiB each). launch stays the rank's
 * own pool, alone.
 *
 * Each figure is the best of a few repetitions (the machine is shared:
 * the best is the closest to what it can do; the FMA peak the best of 10),
 * and rt_cpu_fma_remeasure measures the FMA peak again when a training
 * step ran faster than the cached peak. */
#include "cpu.h"

#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* 12 independent accumulators in vector registers (FMA latency 4-5
 * cycles, two ports: at least 10 in flight), the widest FMA the compiler
 * targets with -march=native; returns the FLOPs it did. */
static const char fma_src[] =
    "#include <immintrin.h>\n"
    "#if defined(__AVX512F__)\n"
    "typedef __m512 V;\n"
    "#define SET _mm512_set1_ps\n"
    "#define FMA(a, m, c) _mm512_fmadd_ps(a, m, c)\n"
    "#define STORE _mm512_storeu_ps\n"
    "enum { LANES = 16, OPS = 2 };\n"
    "#elif defined(__FMA__)\n"
    "typedef __m256 V;\n"
    "#define SET _mm256_set1_ps\n"
    "#define FMA(a, m, c) _mm256_fmadd_ps(a, m, c)\n"
    "#define STORE _mm256_storeu_ps\n"
    "enum { LANES = 8, OPS = 2 };\n"
    "#else\n"
    "typedef __m128 V;\n"
    "#define SET _mm_set1_ps\n"
    "#define FMA(a, m, c) _mm_add_ps(_mm_mul_ps(a, m), c)\n"
    "#define STORE _mm_storeu_ps\n"
    "enum { LANES = 4, OPS = 2 };\n"
    "#endif\n"
    "double kiln_measure_fma(long iters, float *out)\n"
    "{\n"
    "    V m = SET(0.999f), c = SET(1e-3f);\n"
    "    V a0 = SET(1), a1 = SET(2), a2 = SET(3), a3 = SET(4), a4 = SET(5), a5 = SET(6);\n"
    "    V a6 = SET(7), a7 = SET(8), a8 = SET(9), a9 = SET(10), a10 = SET(11), a11 = SET(12);\n"
    "    for (long i = 0; i < iters; i++) {\n"
    "        a0 = FMA(a0, m, c); a1 = FMA(a1, m, c); a2 = FMA(a2, m, c);\n"
    "        a3 = FMA(a3, m, c); a4 = FMA(a4, m, c); a5 = FMA(a5, m, c);\n"
    "        a6 = FMA(a6, m, c); a7 = FMA(a7, m, c); a8 = FMA(a8, m, c);\n"
    "        a9 = FMA(a9, m, c); a10 = FMA(a10, m, c); a11 = FMA(a11, m, c);\n"
    "    }\n"
    "    float s[LANES];\n"
    "    STORE(s, a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11);\n"
    "    *out = s[0];\n"
    "    return (double)iters * 12 * LANES * OPS;\n"
    "}\n";

enum { REPS = 5, COPY_BYTES = 64 << 20, GEMM_N = 512 };
static const long FMA_ITERS = 5000000; /* 1.9e9 FLOPs per thread with AVX-512 */

typedef double (*FmaFn)(long, float *);



typedef struct {
    int what; /* 0 fma, 1 gemm (bands of `rows`), 2 copy */
    int rows;
    FmaFn fma;
    float *a, *b, *c;
    char *src, *dst;
    size_t bytes; /* what 2 copies */
    double seconds, flops;
    float sink;
} Job;

static void run_job(Job *j)
{
    double t0 = ir_now();
    if (j->what == 0)
        j->flops = j->fma(FMA_ITERS, &j->sink);
    else if (j->what == 1)
        for (int r = 0; r < GEMM_N / j->rows; r++) /* the same FLOPs for every band */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->rows, GEMM_N, GEMM_N, 1.0f,
                        j->a + (size_t)r * j->rows * GEMM_N, GEMM_N, j->b, GEMM_N, 0.0f,
                        j->c + (size_t)r * j->rows * GEMM_N, GEMM_N);
    else
        memcpy(j->dst, j->src, j->bytes);
    j->seconds = ir_now() - t0;
}

static void *job_thread(void *arg)
{
    run_job(arg);
    return NULL;
}

/* Runs `what` once on n threads at once (the caller is one); the slowest
 * time of the first k threads (each thread's in jobs[i].seconds; -1: not
 * started): k = n for all of them, fewer for one rank's threads while the
 * other ranks' (the rest) run the same job. */
static double timed_once(Job *jobs, int n, int k)
{
    pthread_t *th = xcalloc((size_t)n, sizeof *th);
    for (int i = 1; i < n; i++)
        if (pthread_create(&th[i], NULL, job_thread, &jobs[i]) != 0)
            jobs[i].seconds = -1;
    run_job(&jobs[0]);
    double worst = jobs[0].seconds;
    for (int i = 1; i < n; i++) {
        if (jobs[i].seconds >= 0)
            pthread_join(th[i], NULL);
        if (i < k)
            worst = jobs[i].seconds > worst ? jobs[i].seconds : worst;
    }
    free(th);
    return worst;
}

/* The slowest of the first k threads' time, best of REPS. */
static double timed(Job *jobs, int n, int k)
{
    double best = INFINITY;
    for (int r = 0; r < REPS; r++) {
        double worst = timed_once(jobs, n, k);
        best = worst < best ? worst : best;
    }
    return best;
}

/* The FMA peak of the first k of n threads (jobs[i].what = 0), in FLOP/s:
 * all n threads at once, the best of 2 x REPS tries (the slowest of the k
 * threads' time each). A
 * thread's best run alone would overstate cores shared by two hardware
 * threads; a peak measured while other work ran is raised later by a step
 * that runs faster (rt_cpu_fma_remeasure). */
static double fma_peak(Job *jobs, int n, int k)
{
    double best = INFINITY;
    for (int r = 0; r < 2 * REPS; r++) {
        double t = timed_once(jobs, n, k);
        best = t < best ? t : best;
    }
    return jobs[0].flops * k / best;
}

static void empty_part(void *ctx, int part)
{
    (void)ctx;
    (void)part;
}

char *rt_cpu_model(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && c) {
            fclose(f);
            c += 1 + (c[1] == ' ');
            c[strcspn(c, "\n")] = 0;
            return xstrdup(c);
        }
    }
    if (f)
        fclose(f);
    return xstrdup("unknown CPU");
}

/* One generated kernel of the kind the CPU backend runs (tanh, exp, two
 * products and a sum over 2M elements, fused into one loop), through the
 * executor on `threads` threads: its element-operations (cg_kernel_work)
 * per second per thread. */
static const char work_ir[] =
    "kiln-ir v1\n"
    "%0:f32[2048,1024] = input \"x\"\n"
    "%1:f32[2048,1024] = tanh %0\n"
    "%2:f32[2048,1024] = mul %1, %0\n"
    "%3:f32[] = const {value=0.5}\n"
    "%4:f32[2048,1024] = broadcast %3\n"
    "%5:f32[2048,1024] = mul %0, %4\n"
    "%6:f32[2048,1024] = exp %5\n"
    "%7:f32[2048,1024] = add %2, %6\n"
    "output \"y\" %7\n";

/* A thread of another rank (rt_cpu_device_ranks) running the work
 * kernel through its own one-thread executor until stop is set. */
typedef struct {
    Exec *e;
    _Atomic bool *stop;
    pthread_t th;
    bool started;
} Busy;

static void *busy_thread(void *arg)
{
    Busy *b = arg;
    Diag d = {{0}};
    for (int r = 0; !*b->stop; r++)
        if (!rt_exec_run(b->e, 1, r, &d))
            break;
    return NULL;
}

/* measure_work's executor of the work kernel on `threads` threads. */
static Exec *work_exec(Graph *g, int threads, const char *cache_dir, bool verbose, Diag *d)
{
    ExecOpts eo = {.device = "cpu", .threads = threads, .cache_dir = cache_dir,
                   .verbose = verbose};
    Exec *e = rt_exec_create(g, &eo, d);
    if (!e)
        return NULL;
    int64_t n = 2048 * 1024;
    float *x = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(i % 2001) * 1e-3f - 1.0f;
    rt_exec_write(e, 0, x);
    free(x);
    return e;
}

/* The work rate on `threads` threads, with `others` threads of other
 * ranks running the same kernel meanwhile (0: alone). */
static bool measure_work(int threads, int others, const char *cache_dir, bool verbose,
                         CgDevice *dev, Diag *d)
{
    char err[512];
    Graph *g = ir_parse(work_ir, "cpu measurement", err, sizeof err);
    if (!g)
        die("cpu measurement graph: %s", err);
    PassOpts po;
    pass_opts_default(&po);
    Exec *e = NULL;
    bool ok = pass_simplify(g, &po, d) && pass_fuse(g, &po, d) && pass_schedule(g, &po, d) &&
              (e = work_exec(g, threads, cache_dir, verbose, d));
    if (!ok) {
        ir_free(g);
        return false;
    }
    _Atomic bool stop = false;
    Busy *busy = xcalloc((size_t)others + 1, sizeof *busy);
    for (int i = 0; i < others && ok; i++) {
        busy[i].stop = &stop;
        ok = (busy[i].e = work_exec(g, 1, cache_dir, verbose, d)) != NULL;
    }
    for (int i = 0; i < others && ok; i++)
        busy[i].started = pthread_create(&busy[i].th, NULL, busy_thread, &busy[i]) == 0;
    const CgPlan *p = rt_exec_plan(e);
    double work = 0;
    int split = 1;
    for (int s = 0; s < p->steps.n; s++)
        if (p->steps.v[s].kind == CG_STEP_KERNEL) {
            const CgKernel *k = p->kernels.v[p->steps.v[s].kernel];
            double w = (double)cg_kernel_work(k);
            work += w;
            if (k->parallel && w >= CG_MIN_KERNEL_WORK)
                split = threads;
        }
    double best = INFINITY;
    for (int r = 0; r < 2 * REPS && ok; r++) {
        double t0 = ir_now();
        ok = rt_exec_run(e, 1, r, d);
        double t = ir_now() - t0;
        best = t < best ? t : best;
    }
    stop = true;
    for (int i = 0; i < others; i++) {
        if (busy[i].started)
            pthread_join(busy[i].th, NULL);
        if (busy[i].e)
            rt_exec_destroy(busy[i].e);
    }
    free(busy);
    rt_exec_destroy(e);
    ir_free(g);
    dev->work = work / (best * split);
    return ok;
}

/* The FMA kernel, compiled like the kernels (cached); its handle in *h. */
static FmaFn load_fma(const char *cache_dir, bool verbose, void **h, Diag *d)
{
    char *so = rt_cc_compile(fma_src, cache_dir, 1, verbose, d);
    if (!so)
        return NULL;
    *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    free(so);
    FmaFn fma = *h ? (FmaFn)dlsym(*h, "kiln_measure_fma") : NULL;
    if (!fma) {
        snprintf(d->msg, sizeof d->msg, "cpu measurement: cannot load its kernel: %s", dlerror());
        if (*h)
            dlclose(*h);
    }
    return fma;
}

/* One rank of `ranks` with `threads` threads each: every figure with the
 * other ranks' threads busy on the same job (ranks 1: alone). */
static bool measure(int threads, int ranks, const char *cache_dir, bool verbose, CgDevice *dev,
                    Diag *d)
{
    void *h = NULL;
    FmaFn fma = load_fma(cache_dir, verbose, &h, d);
    if (!fma)
        return false;
    rt_blas_one_thread();
    /* n: every rank's threads; one: a thread of this rank beside the
     * other ranks' threads */
    int n = threads * ranks, others = threads * (ranks - 1), one = 1 + others;
    Job *jobs = xcalloc((size_t)n, sizeof *jobs);
    size_t gn = (size_t)GEMM_N * GEMM_N;
    for (int i = 0; i < n; i++) {
        jobs[i].fma = fma;
        jobs[i].a = xmalloc(3 * gn * sizeof(float));
        jobs[i].b = jobs[i].a + gn;
        jobs[i].c = jobs[i].b + gn;
        for (size_t k = 0; k < 2 * gn; k++)
            jobs[i].a[k] = (float)((k * 2654435761u) % 1000) * 1e-3f - 0.5f;
        jobs[i].bytes = (size_t)COPY_BYTES / (size_t)ranks;
        jobs[i].src = xmalloc(jobs[i].bytes);
        jobs[i].dst = xmalloc(jobs[i].bytes);
        memset(jobs[i].src, 1, jobs[i].bytes);
        memset(jobs[i].dst, 2, jobs[i].bytes);
    }
    for (int i = 0; i < n; i++)
        jobs[i].what = 0;
    dev->f32 = fma_peak(jobs, n, threads);
    for (int i = 0; i < n; i++)
        jobs[i].what = 1, jobs[i].rows = GEMM_N;
    double t_gemm = timed(jobs, n, threads);
    static const int band[4] = {16, 64, 256, 512};
    for (int b = 0; b < 4; b++) {
        for (int i = 0; i < one; i++)
            jobs[i].rows = band[b];
        dev->gemm1[b] = 2.0 * GEMM_N * GEMM_N * (double)GEMM_N / timed(jobs, one, 1);
    }
    for (int i = 0; i < n; i++)
        jobs[i].what = 2;
    double t_bw = timed(jobs, n, threads), t_bw1 = timed(jobs, one, 1);
    Pool pool;
    pool_start(&pool, threads - 1);
    double t_launch = INFINITY;
    for (int r = 0; r < REPS; r++) {
        enum { CALLS = 2000 };
        double t0 = ir_now();
        for (int i = 0; i < CALLS; i++)
            pool_run(&pool, threads, empty_part, NULL);
        double t = (ir_now() - t0) / CALLS;
        t_launch = t < t_launch ? t : t_launch;
    }
    pool_stop(&pool);
    for (int i = 0; i < n; i++) {
        free(jobs[i].a);
        free(jobs[i].src);
        free(jobs[i].dst);
    }
    free(jobs);
    dlclose(h);
    dev->gemm = 2.0 * GEMM_N * GEMM_N * (double)GEMM_N * threads / t_gemm;
    double copied = 2.0 * (double)COPY_BYTES / ranks; /* read and written, per thread */
    dev->bw = copied * threads / t_bw;
    dev->bw1 = copied / t_bw1;
    dev->launch_s = t_launch;
    return measure_work(threads, others, cache_dir, verbose, dev, d);
}

static bool read_cached(const char *path, const char *model, CgDevice *dev)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[600];
    bool same_model = false, same_cc = false, same_blas = false;
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        double v;
        if (strncmp(line, "model=", 6) == 0)
            same_model = strcmp(line + 6, model) == 0;
        else if (strncmp(line, "cc=", 3) == 0)
            same_cc = strcmp(line + 3, rt_cc_build_id()) == 0;
        else if (strncmp(line, "blas=", 5) == 0)
            same_blas = strcmp(line + 5, rt_blas_core()) == 0;
        else if (sscanf(line, "f32=%lf", &v) == 1 && v > 0)
            dev->f32 = v, got |= 1;
        else if (sscanf(line, "gemm=%lf", &v) == 1 && v > 0)
            dev->gemm = v, got |= 2;
        else if (sscanf(line, "bw=%lf", &v) == 1 && v > 0)
            dev->bw = v, got |= 4;
        else if (sscanf(line, "bw1=%lf", &v) == 1 && v > 0)
            dev->bw1 = v, got |= 8;
        else if (sscanf(line, "launch=%lf", &v) == 1 && v > 0)
            dev->launch_s = v, got |= 16;
        else if (sscanf(line, "work=%lf", &v) == 1 && v > 0)
            dev->work = v, got |= 32;
        else if (sscanf(line, "gemm1=%lf,%lf,%lf,%lf", &dev->gemm1[0], &dev->gemm1[1],
                        &dev->gemm1[2], &dev->gemm1[3]) == 4 && dev->gemm1[0] > 0)
            got |= 64;
    }
    fclose(f);
    return same_model && same_cc && same_blas && got == 127;
}

/* Caches dev's figures at path (not cached on failure: measured again
 * next time). */
static void write_cached(const char *path, const char *model, int threads, int ranks,
                         const CgDevice *dev, bool verbose)
{
    char *text = xasprintf("model=%s\ncc=%s\nblas=%s\nthreads=%d\nranks=%d\nf32=%.6g\n"
                           "gemm=%.6g\nbw=%.6g\nbw1=%.6g\nlaunch=%.6g\nwork=%.6g\n"
                           "gemm1=%.6g,%.6g,%.6g,%.6g\n", model, rt_cc_build_id(),
                           rt_blas_core(), threads, ranks, dev->f32,
                           dev->gemm, dev->bw, dev->bw1, dev->launch_s, dev->work,
                           dev->gemm1[0], dev->gemm1[1], dev->gemm1[2], dev->gemm1[3]);
    const void *chunk[1] = {text};
    size_t len[1] = {strlen(text)};
    Diag wd = {{0}};
    if (!rt_write_atomic(path, chunk, len, 1, &wd) && verbose)
        fprintf(stderr, "kiln: %s\n", wd.msg);
    free(text);
}

bool rt_cpu_fma_remeasure(int threads, const char *cache_dir, double at_least, bool again,
                          bool verbose, double *f32, Diag *d)
{
    double peak = 0;
    if (again) {
        void *h = NULL;
        FmaFn fma = load_fma(cache_dir, verbose, &h, d);
        if (!fma)
            return false;
        Job *jobs = xcalloc((size_t)threads, sizeof *jobs);
        for (int i = 0; i < threads; i++)
            jobs[i].fma = fma, jobs[i].what = 0;
        peak = fma_peak(jobs, threads, threads);
        free(jobs);
        dlclose(h);
    }
    if (peak < at_least)
        peak = at_least;
    /* the cached figures keep the higher peak */
    char *model = rt_cpu_model();
    char *dir = rt_cache_path(cache_dir);
    char *path = xasprintf("%s/cpu-device-%d.txt", dir, threads);
    CgDevice dev;
    memset(&dev, 0, sizeof dev);
    if (read_cached(path, model, &dev)) {
        if (dev.f32 >= peak) {
            peak = dev.f32;
        } else {
            dev.f32 = peak;
            write_cached(path, model, threads, 1, &dev, verbose);
        }
    }
    free(path);
    free(dir);
    free(model);
    *f32 = peak;
    return true;
}

bool rt_cpu_device(int threads, const char *cache_dir, bool remeasure, bool verbose,
                   CgDevice *dev, Diag *d)
{
    return rt_cpu_device_ranks(threads, 1, cache_dir, remeasure, verbose, dev, d);
}

bool rt_cpu_device_ranks(int threads, int ranks, const char *cache_dir, bool remeasure,
                         bool verbose, CgDevice *dev, Diag *d)
{
    static char title[300];
    char *model = rt_cpu_model();
    memset(dev, 0, sizeof *dev);
    dev->name = "cpu";
    ranks = ranks > 1 ? ranks : 1;
    char busy[64] = "";
    if (ranks > 1)
        snprintf(busy, sizeof busy, ", one of %d ranks at once", ranks);
    snprintf(title, sizeof title, "%s, %d thread%s%s, measured", model, threads,
             threads == 1 ? "" : "s", busy);
    dev->title = title;
    dev->gpu = false;
    dev->units = threads;
    char *dir = rt_cache_path(cache_dir);
    char *path = ranks > 1 ? xasprintf("%s/cpu-device-%d-r%d.txt", dir, threads, ranks)
                           : xasprintf("%s/cpu-device-%d.txt", dir, threads);
    bool ok = !remeasure && read_cached(path, model, dev);
    if (!ok) {
        fprintf(stderr, "kiln: measuring this CPU for the cost model (%d threads%s, once; "
                        "cached in %s)\n", threads, busy, path);
        ok = measure(threads, ranks, cache_dir, verbose, dev, d);
        if (ok && rt_mkdir_p(dir))
            write_cached(path, model, threads, ranks, dev, verbose);
    }
    dev->bf16 = dev->tf32 = 0;
    dev->graph_s = dev->launch_s;
    free(path);
    free(dir);
    free(model);
    return ok;
}
