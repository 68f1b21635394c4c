/* backend_cpu.c - the CPU backend: the plan's C source through the host
 * compiler (cached), loaded with dlopen, every kernel called through libffi
 * with its natural signature; GEMMs through OpenBLAS.
 *
 * Threads: kiln owns them. A pool of ExecOpts.threads - 1 workers (plus the
 * calling thread) runs every large step in parts: a kernel's part p of n
 * takes a share of each loop's outer rows (the generated code splits
 * them); a GEMM is split into independent row, column or batch blocks,
 * each a single-threaded OpenBLAS call.
 *
 * Results do not depend on the thread count, bit for bit. A kernel's parts
 * (one per thread) own whole outer rows, or whole columns of a column
 * loop: every reduction runs inside one part, in an order fixed by its
 * element count (cprint.c), and every element is computed by the same code
 * whichever part owns it, so the split changes no value. A GEMM's blocks
 * are a function of its shape alone (cg_gemm_parts), since OpenBLAS's result
 * for an element depends on the block's size; the threads only choose
 * which blocks they run.
 *
 * OpenBLAS's own pool is held at one thread, so no two pools ever compete
 * for the cores; the parts of a step go to whichever thread of kiln's pool
 * claims them first (pool.c). Small steps run on the calling thread alone:
 * a kernel
 * below CG_MIN_KERNEL_WORK element-operations (cg_kernel_work), a GEMM below
 * CG_MIN_GEMM_FLOPS (codegen/cpu_work.c). */
#include "codegen.h"
#include "cpu.h"

#include <cblas.h>
#include <dlfcn.h>
#include <ffi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    ffi_cif cif;
    ffi_type **types;
    void (*fn)(void);
    int nargs;      /* buffers [+ seed, step] */
    int64_t work;   /* element-operations of a call (cg_kernel_work; decides threading) */
    ffi_cif rcif;   /* a flat kernel's NAME_range (buffers, lo, hi, part, nparts) */
    ffi_type **rtypes;
    void (*rfn)(void);
} CpuKernel;

typedef struct {
    void **ptrs;  /* buffer pointers bound to the kernel's params */
    void **argv;  /* per part: nargs + 2 libffi argument pointers */
    int64_t *part; /* per part: the part index passed to the kernel */
    int nparts;   /* parts this step runs in */
    int na;       /* argument pointers per part */
    int64_t lo, hi; /* a piece of a flat kernel (CgStep.lo, hi): NAME_range's */
    bool folded;  /* attention_dqkv's dq kernel, which its dk/dv kernel runs */
} CpuStep;

struct BackendCtx {
    const CgPlan *p;
    unsigned char *arena;
    bool own_arena; /* false: ExecOpts.host_arena, borrowed */
    void *so;
    CpuKernel *k;
    CpuStep *s;
    uint64_t seed;
    int64_t step;
    int threads;
    int64_t nparts_all; /* passed to kernels as nparts */
    Pool pool;
};


static void cpu_destroy(BackendCtx *c)
{
    if (!c)
        return;
    pool_stop(&c->pool);
    if (c->k)
        for (int i = 0; i < c->p->kernels.n; i++) {
            free(c->k[i].types);
            free(c->k[i].rtypes);
        }
    if (c->s)
        for (int i = 0; i < c->p->steps.n; i++) {
            free(c->s[i].ptrs);
            free(c->s[i].argv);
            free(c->s[i].part);
        }
    free(c->k);
    free(c->s);
    if (c->so)
        dlclose(c->so);
    if (c->own_arena)
        free(c->arena);
    free(c);
}

static BackendCtx *cpu_create(const CgPlan *p, const ExecOpts *o, Diag *d)
{
    BackendCtx *c = xcalloc(1, sizeof *c);
    c->p = p;
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = threads < 1 ? 1 : threads > 256 ? 256 : threads;
    c->nparts_all = c->threads;
    rt_blas_one_thread();

    if (o->host_arena) {
        c->arena = o->host_arena;
    } else {
        size_t bytes =
            (size_t)(p->arena_bytes + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN * MEMPLAN_ALIGN;
        c->arena = aligned_alloc(MEMPLAN_ALIGN, bytes ? bytes : MEMPLAN_ALIGN);
        if (!c->arena) {
            snprintf(d->msg, sizeof d->msg, "cannot allocate the %lld-byte arena",
                     (long long)p->arena_bytes);
            goto fail;
        }
        c->own_arena = true;
        memset(c->arena, 0, bytes);
    }

    c->k = xcalloc((size_t)p->kernels.n + 1, sizeof(CpuKernel));
    if (p->kernels.n) {
        char *so = rt_cc_compile(p->source, o->cache_dir, c->threads, o->verbose, d);
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
        ck->nargs = n;
        ck->work = cg_kernel_work(k);
        ck->types = xmalloc(sizeof(ffi_type *) * (size_t)(n + 3));
        for (int a = 0; a < k->params.n; a++)
            ck->types[a] = &ffi_type_pointer;
        if (k->rand) {
            ck->types[k->params.n] = &ffi_type_uint64;
            ck->types[k->params.n + 1] = &ffi_type_sint64;
        }
        ck->types[n] = &ffi_type_sint64; /* part */
        ck->types[n + 1] = &ffi_type_sint64; /* nparts */
        if (ffi_prep_cif(&ck->cif, FFI_DEFAULT_ABI, (unsigned)(n + 2), &ffi_type_void,
                         ck->types) != FFI_OK)
            die("ffi_prep_cif failed for kernel %s", k->name);
        void *sym = dlsym(c->so, k->name);
        if (!sym) {
            snprintf(d->msg, sizeof d->msg, "compiled kernels lack %s: %s", k->name, dlerror());
            goto fail;
        }
        memcpy(&ck->fn, &sym, sizeof sym);
        if (k->flat > 0) { /* NAME_range: the buffers, lo, hi, part, nparts */
            ck->rtypes = xmalloc(sizeof(ffi_type *) * (size_t)(n + 5));
            for (int a = 0; a < n; a++)
                ck->rtypes[a] = &ffi_type_pointer;
            for (int a = n; a < n + 4; a++)
                ck->rtypes[a] = &ffi_type_sint64;
            if (ffi_prep_cif(&ck->rcif, FFI_DEFAULT_ABI, (unsigned)(n + 4), &ffi_type_void,
                             ck->rtypes) != FFI_OK)
                die("ffi_prep_cif failed for kernel %s_range", k->name);
            char *rname = xasprintf("%s_range", k->name);
            void *rsym = dlsym(c->so, rname);
            free(rname);
            if (!rsym) {
                snprintf(d->msg, sizeof d->msg, "compiled kernels lack %s_range: %s", k->name,
                         dlerror());
                goto fail;
            }
            memcpy(&ck->rfn, &rsym, sizeof rsym);
        }
    }
    c->s = xcalloc((size_t)p->steps.n + 1, sizeof(CpuStep));
    for (int i = 0; i < p->steps.n; i++) {
        const CgStep *st = &p->steps.v[i];
        CpuStep *cs = &c->s[i];
        cs->nparts = 1;
        if (st->kind == CG_STEP_GEMM) {
            cs->nparts = cg_gemm_parts(&st->gemm);
            continue;
        }
        if (st->kind != CG_STEP_KERNEL)
            continue;
        const CgKernel *k = p->kernels.v[st->kernel];
        const CpuKernel *ck = &c->k[st->kernel];
        cs->folded = k->attn.kind == CG_ATTN_DQ && cg_c_attn_folded(&k->attn);
        bool range = st->hi > st->lo;
        if (range && (k->flat <= 0 || k->rand || st->lo < 0 || st->hi > k->flat))
            die("cpu backend: step %d runs elements [%lld, %lld) of kernel %s, which is not "
                "flat over them", i, (long long)st->lo, (long long)st->hi, k->name);
        /* a piece: its share of the work; every piece splits (no outer row of 1) */
        int64_t work = range ? ck->work / k->flat * (st->hi - st->lo) : ck->work;
        if ((k->parallel || range) && work >= CG_MIN_KERNEL_WORK)
            cs->nparts = c->threads;
        int n = k->params.n, na = ck->nargs + (range ? 4 : 2);
        cs->na = na;
        cs->lo = st->lo;
        cs->hi = st->hi;
        cs->ptrs = xmalloc(sizeof(void *) * (size_t)(n + 1));
        cs->argv = xmalloc(sizeof(void *) * (size_t)na * (size_t)cs->nparts);
        cs->part = xmalloc(sizeof(int64_t) * (size_t)cs->nparts);
        for (int a = 0; a < n; a++)
            cs->ptrs[a] = c->arena + cg_offset(p, st->args[a]);
        for (int q = 0; q < cs->nparts; q++) {
            void **av = cs->argv + (size_t)q * (size_t)na;
            cs->part[q] = q;
            for (int a = 0; a < n; a++)
                av[a] = &cs->ptrs[a];
            if (k->rand) {
                av[n] = &c->seed;
                av[n + 1] = &c->step;
            }
            if (range) {
                av[n] = &cs->lo;
                av[n + 1] = &cs->hi;
            }
            av[na - 2] = &cs->part[q];
            av[na - 1] = &c->nparts_all;
        }
    }
    if (c->threads > 1)
        pool_start(&c->pool, c->threads - 1);
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

static void *cpu_host_ptr(BackendCtx *c, int64_t off)
{
    return c->arena + off;
}

/* One block of a GEMM: rows [m0, m1) and columns [n0, n1) of batch entries
 * [b0, b1). */
static void gemm_block(BackendCtx *c, const CgGemm *m, int64_t b0, int64_t b1, int64_t m0,
                       int64_t m1, int64_t n0, int64_t n1)
{
    const float *A = (const float *)(c->arena + cg_offset(c->p, m->a));
    const float *B = (const float *)(c->arena + cg_offset(c->p, m->b));
    float *C = (float *)(c->arena + cg_offset(c->p, m->c));
    if (m1 <= m0 || n1 <= n0)
        return;
    for (int64_t b = b0; b < b1; b++) {
        const float *a = A + b * m->sa + (m->ta ? m0 : m0 * m->lda);
        const float *bb = B + b * m->sb + (m->tb ? n0 * m->ldb : n0);
        cblas_sgemm(CblasRowMajor, m->ta ? CblasTrans : CblasNoTrans,
                    m->tb ? CblasTrans : CblasNoTrans, (blasint)(m1 - m0), (blasint)(n1 - n0),
                    (blasint)m->K, 1.0f, a, (blasint)m->lda, bb, (blasint)m->ldb, 0.0f,
                    C + b * m->sc + m0 * m->ldc + n0, (blasint)m->ldc);
    }
}

typedef struct {
    BackendCtx *c;
    const CgGemm *m;
    int nparts;
} GemmJob;

/* Part p of j->nparts (cg_gemm_parts). */
static void gemm_part(void *ctx, int p)
{
    GemmJob *j = ctx;
    const CgGemm *m = j->m;
    int n = j->nparts;
    int64_t b0, b1, m0, m1, n0, n1;
    cg_gemm_part(m, n, p, &b0, &b1, &m0, &m1, &n0, &n1);
    gemm_block(j->c, m, b0, b1, m0, m1, n0, n1);
}

typedef struct {
    BackendCtx *c;
    int step;
} KernelJob;

static void kernel_part(void *ctx, int p)
{
    KernelJob *j = ctx;
    const CgStep *st = &j->c->p->steps.v[j->step];
    CpuKernel *ck = &j->c->k[st->kernel];
    CpuStep *cs = &j->c->s[j->step];
    if (cs->hi > cs->lo)
        ffi_call(&ck->rcif, ck->rfn, NULL, cs->argv + (size_t)p * (size_t)cs->na);
    else
        ffi_call(&ck->cif, ck->fn, NULL, cs->argv + (size_t)p * (size_t)cs->na);
}

static bool cpu_run_step(BackendCtx *c, int s, uint64_t seed, int64_t step, Diag *d)
{
    (void)d;
    const CgStep *st = &c->p->steps.v[s];
    switch (st->kind) {
    case CG_STEP_KERNEL: {
        if (c->s[s].folded)
            return true;
        c->seed = seed;
        c->step = step;
        c->nparts_all = c->s[s].nparts;
        KernelJob j = {c, s};
        pool_run(&c->pool, c->s[s].nparts, kernel_part, &j);
        return true;
    }
    case CG_STEP_GEMM: {
        GemmJob j = {c, &st->gemm, c->s[s].nparts};
        pool_run(&c->pool, j.nparts, gemm_part, &j);
        return true;
    }
    case CG_STEP_COPY:
        memmove(c->arena + st->dst, c->arena + st->src, (size_t)st->bytes);
        return true;
    case CG_STEP_ALLREDUCE_START:
    case CG_STEP_ALLREDUCE_WAIT:
    case CG_STEP_SHARD_PACK:
    case CG_STEP_TP:
        break; /* the executor runs these (communication thread, shard copies, TP) */
    }
    die("cpu backend: bad step kind %d", (int)st->kind);
}

static void cpu_sync(BackendCtx *c) { (void)c; }

const Backend rt_backend_cpu = {
    "cpu", cpu_create, cpu_destroy, cpu_write, cpu_read, cpu_run_step, cpu_sync, NULL, true,
    cpu_host_ptr,
};
