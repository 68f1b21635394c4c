/* backend_cpu.c - the CPU backend: the plan's C source through the host
 * compiler (cached), loaded with dlopen, every kernel called through libffi
 * with its natural signature; GEMMs through OpenBLAS.
 *
 * Threads: kernels run on the calling thread and GEMMs on OpenBLAS's pool,
 * never at the same time, so OpenBLAS gets all ExecOpts.threads threads and
 * the cores are never oversubscribed. */
#include "codegen.h"
#include "runtime.h"

#include <cblas.h>
#include <dlfcn.h>
#include <ffi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    ffi_cif cif;
    ffi_type **types;
    void (*fn)(void);
} CpuKernel;

typedef struct {
    void **ptrs;  /* buffer pointers bound to the kernel's params */
    void **argv;  /* libffi argument array: &ptrs[i]..., &seed, &step */
} CpuStep;

struct BackendCtx {
    const CgPlan *p;
    unsigned char *arena;
    void *so;
    CpuKernel *k;
    CpuStep *s;
    uint64_t seed;
    int64_t step;
};

static void cpu_destroy(BackendCtx *c)
{
    if (!c)
        return;
    if (c->k)
        for (int i = 0; i < c->p->kernels.n; i++)
            free(c->k[i].types);
    if (c->s)
        for (int i = 0; i < c->p->steps.n; i++) {
            free(c->s[i].ptrs);
            free(c->s[i].argv);
        }
    free(c->k);
    free(c->s);
    if (c->so)
        dlclose(c->so);
    free(c->arena);
    free(c);
}

static BackendCtx *cpu_create(const CgPlan *p, const ExecOpts *o, Diag *d)
{
    BackendCtx *c = xcalloc(1, sizeof *c);
    c->p = p;
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    openblas_set_num_threads(threads < 1 ? 1 : threads);

    size_t bytes = (size_t)(p->arena_bytes + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN * MEMPLAN_ALIGN;
    c->arena = aligned_alloc(MEMPLAN_ALIGN, bytes ? bytes : MEMPLAN_ALIGN);
    if (!c->arena) {
        snprintf(d->msg, sizeof d->msg, "cannot allocate the %lld-byte arena",
                 (long long)p->arena_bytes);
        goto fail;
    }
    memset(c->arena, 0, bytes);

    c->k = xcalloc((size_t)p->kernels.n + 1, sizeof(CpuKernel));
    if (p->kernels.n) {
        char *so = rt_cc_compile(p->source, o->cache_dir, o->verbose, d);
        if (!so)
            goto fail;
        c->so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        if (!c->so) {
            snprintf(d->msg, sizeof d->msg, "%s: cannot load compiled kernels: %s", so,
                     dlerror());
            free(so);
            goto fail;
        }
        free(so);
    }
    for (int i = 0; i < p->kernels.n; i++) {
        const CgKernel *k = p->kernels.v[i];
        CpuKernel *ck = &c->k[i];
        int n = k->params.n + (k->rand ? 2 : 0);
        ck->types = xmalloc(sizeof(ffi_type *) * (size_t)(n + 1));
        for (int a = 0; a < k->params.n; a++)
            ck->types[a] = &ffi_type_pointer;
        if (k->rand) {
            ck->types[k->params.n] = &ffi_type_uint64;
            ck->types[k->params.n + 1] = &ffi_type_sint64;
        }
        if (ffi_prep_cif(&ck->cif, FFI_DEFAULT_ABI, (unsigned)n, &ffi_type_void, ck->types) !=
            FFI_OK)
            die("ffi_prep_cif failed for kernel %s", k->name);
        void *sym = dlsym(c->so, k->name);
        if (!sym) {
            snprintf(d->msg, sizeof d->msg, "compiled kernels lack %s: %s", k->name, dlerror());
            goto fail;
        }
        memcpy(&ck->fn, &sym, sizeof sym);
    }
    c->s = xcalloc((size_t)p->steps.n + 1, sizeof(CpuStep));
    for (int i = 0; i < p->steps.n; i++) {
        const CgStep *st = &p->steps.v[i];
        if (st->kind != CG_STEP_KERNEL)
            continue;
        const CgKernel *k = p->kernels.v[st->kernel];
        CpuStep *cs = &c->s[i];
        int n = k->params.n;
        cs->ptrs = xmalloc(sizeof(void *) * (size_t)(n + 1));
        cs->argv = xmalloc(sizeof(void *) * (size_t)(n + 3));
        for (int a = 0; a < n; a++) {
            cs->ptrs[a] = c->arena + cg_offset(p, st->args[a]);
            cs->argv[a] = &cs->ptrs[a];
        }
        cs->argv[n] = &c->seed;
        cs->argv[n + 1] = &c->step;
    }
    return c;
fail:
    cpu_destroy(c);
    return NULL;
}

static void cpu_write(BackendCtx *c, int64_t off, const void *src, int64_t bytes)
{
    memcpy(c->arena + off, src, (size_t)bytes);
}

static void cpu_read(BackendCtx *c, int64_t off, void *dst, int64_t bytes)
{
    memcpy(dst, c->arena + off, (size_t)bytes);
}

static void run_gemm(BackendCtx *c, const CgGemm *m)
{
    const float *A = (const float *)(c->arena + cg_offset(c->p, m->a));
    const float *B = (const float *)(c->arena + cg_offset(c->p, m->b));
    float *C = (float *)(c->arena + cg_offset(c->p, m->c));
    for (int64_t b = 0; b < m->batch; b++)
        cblas_sgemm(CblasRowMajor, m->ta ? CblasTrans : CblasNoTrans,
                    m->tb ? CblasTrans : CblasNoTrans, (blasint)m->M, (blasint)m->N,
                    (blasint)m->K, 1.0f, A + b * m->sa, (blasint)m->lda, B + b * m->sb,
                    (blasint)m->ldb, 0.0f, C + b * m->sc, (blasint)m->ldc);
}

static bool cpu_run_step(BackendCtx *c, int s, uint64_t seed, int64_t step, Diag *d)
{
    (void)d;
    const CgStep *st = &c->p->steps.v[s];
    switch (st->kind) {
    case CG_STEP_KERNEL:
        c->seed = seed;
        c->step = step;
        ffi_call(&c->k[st->kernel].cif, c->k[st->kernel].fn, NULL, c->s[s].argv);
        return true;
    case CG_STEP_GEMM:
        run_gemm(c, &st->gemm);
        return true;
    case CG_STEP_COPY:
        memmove(c->arena + st->dst, c->arena + st->src, (size_t)st->bytes);
        return true;
    }
    die("cpu backend: bad step kind %d", (int)st->kind);
}

static void cpu_sync(BackendCtx *c) { (void)c; }

const Backend rt_backend_cpu = {
    "cpu", cpu_create, cpu_destroy, cpu_write, cpu_read, cpu_run_step, cpu_sync,
};
