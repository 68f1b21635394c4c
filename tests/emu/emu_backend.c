/* emu_backend.c - the CUDA backend's plan on the emulated device: the same
 * program (cg_cuda_program: same kernels, same variants, same launch
 * geometry), the same arena layout (plan offsets, {seed, step} after the
 * arena), the same copies; cuBLASLt's GEMMs replaced by a host GEMM with the
 * same operand types (bf16 operands: stored bf16, or f32 cast by the
 * program's own kiln_cast_f32_bf16 kernel first) and f32 or bf16 results
 * rounded to nearest even. Allreduce steps are identities (one rank). */
#include "emu_backend.h"

#include "codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* AddressSanitizer's manual poisoning (the runtime is loaded: emu_init). */
void __asan_poison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
void __asan_unpoison_memory_region(void const volatile *addr, size_t size)
    __attribute__((weak));

static EmuBackendCfg cfg;
static bool cfg_set;

void emu_backend_configure(const EmuBackendCfg *c)
{
    cfg = *c;
    cfg_set = true;
}

typedef struct {
    void **argv; /* &ptr[i]..., &rs */
    unsigned char **ptr;
    int64_t *bytes; /* per param: bytes of its buffer (storage dtype) */
    bool cast_a, cast_b;
    bool epi;  /* GEMM: applies its bias epilogue (writes d = C + bias) */
    bool skip; /* kernel: computed by the previous GEMM's epilogue */
} EStep;

struct BackendCtx {
    const CgPlan *p;
    CgCudaProgram *q;
    EmuModule *m;
    unsigned char *arena, *rs; /* rs: {seed, step} */
    size_t arena_bytes;
    EStep *st;
    bool bf16;
    int nepi; /* GEMM steps that apply their bias epilogue */
    char *src; /* the source actually compiled (after cfg.edit) */
};

static void emu_destroy(BackendCtx *c)
{
    if (!c)
        return;
    if (c->st)
        for (int s = 0; s < c->p->steps.n; s++) {
            free(c->st[s].argv);
            free(c->st[s].ptr);
            free(c->st[s].bytes);
        }
    free(c->st);
    emu_free(c->m);
    if (c->q)
        cg_cuda_program_free(c->q);
    free(c->arena);
    free(c->src);
    free(c);
}

static int64_t numel(const Graph *g, int t) { return shape_numel(&g->t.v[t].s); }

static unsigned char *tptr(const BackendCtx *c, int tensor)
{
    return c->arena + cg_offset(c->p, tensor);
}

static BackendCtx *emu_create(const CgPlan *p, const ExecOpts *o, Diag *d)
{
    if (!cfg_set)
        emu_opts_default(&cfg.opts);
    BackendCtx *c = xcalloc(1, sizeof *c);
    c->p = p;
    c->bf16 = o && o->precision && strcmp(o->precision, "bf16") == 0;
    c->arena_bytes = (size_t)(p->arena_bytes + 255) / 256 * 256;
    c->arena = malloc(c->arena_bytes + 16);
    if (!c->arena) {
        snprintf(d->msg, sizeof d->msg, "emu: cannot allocate the arena");
        goto fail;
    }
    memset(c->arena, 0, c->arena_bytes + 16);
    c->rs = c->arena + c->arena_bytes;
    c->q = cg_cuda_program(p, c->bf16);
    c->src = cfg.edit ? cfg.edit(c->q->source, cfg.edit_ctx) : xstrdup(c->q->source);
    if (!c->src) {
        snprintf(d->msg, sizeof d->msg, "emu: the source edit did not apply");
        goto fail;
    }
    const char *dump = getenv("KILN_EMU_DUMP"); /* debugging: the compiled source */
    if (dump && *dump) {
        FILE *f = fopen(dump, "w");
        if (f) {
            fputs(c->src, f);
            fclose(f);
        }
    }
    c->m = emu_compile(c->src, &cfg.opts, d);
    if (!c->m)
        goto fail;
    c->st = xcalloc((size_t)p->steps.n + 1, sizeof(EStep));
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        EStep *es = &c->st[s];
        if (st->kind == CG_STEP_KERNEL) {
            const CgKernel *k = p->kernels.v[st->kernel];
            es->ptr = xcalloc((size_t)k->params.n + 1, sizeof(unsigned char *));
            es->argv = xcalloc((size_t)k->params.n + 2, sizeof(void *));
            es->bytes = xcalloc((size_t)k->params.n + 1, sizeof(int64_t));
            for (int a = 0; a < k->params.n; a++) {
                es->ptr[a] = tptr(c, st->args[a]);
                es->argv[a] = &es->ptr[a];
                es->bytes[a] = numel(p->g, st->args[a]) * dtype_size(c->q->storage[st->args[a]]);
            }
            es->argv[k->params.n] = &c->rs;
            for (int f = 0; f < c->q->step_nfn[s]; f++) {
                const CgCudaFn *fn = &c->q->fn.v[c->q->step_fn[s] + f];
                int np = emu_kernel_nparams(c->m, fn->name);
                if (np < k->params.n || np > k->params.n + 1) {
                    snprintf(d->msg, sizeof d->msg,
                             "emu: step %d: function %s takes %d parameters (kernel %s has %d "
                             "buffers)",
                             s, fn->name, np, k->name, k->params.n);
                    goto fail;
                }
            }
        } else if (st->kind == CG_STEP_GEMM) {
            const CgGemm *m = &st->gemm;
            DType sa = c->q->storage[m->a], sb = c->q->storage[m->b];
            if (c->bf16 || sa == DT_BF16 || sb == DT_BF16) {
                es->cast_a = sa != DT_BF16;
                es->cast_b = sb != DT_BF16;
            }
            /* as the CUDA backend: the epilogue only on f32 operands and storage */
            if (m->epilogue == CG_EPI_BIAS && s + 1 < p->steps.n && !c->bf16 && sa == DT_F32 &&
                sb == DT_F32 &&
                p->steps.v[s + 1].by_epilogue && c->q->storage[m->c] == DT_F32 &&
                c->q->storage[m->d] == DT_F32 && c->q->storage[m->bias] == DT_F32) {
                es->epi = true;
                c->st[s + 1].skip = true;
                c->nepi++;
            }
        }
    }
    return c;
fail:
    emu_destroy(c);
    return NULL;
}

static void emu_write(BackendCtx *c, int64_t off, const void *src, int64_t bytes)
{
    memcpy(c->arena + off, src, (size_t)bytes);
}

static void emu_read(BackendCtx *c, int64_t off, void *dst, int64_t bytes)
{
    memcpy(dst, c->arena + off, (size_t)bytes);
}

static float bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The program's kiln_cast_f32_bf16 on n elements of x into a fresh buffer of
 * exactly n bf16 values (so the sanitizer sees its bounds). */
static uint16_t *cast_bf16(BackendCtx *c, const float *x, int64_t n, Diag *d)
{
    uint16_t *y = malloc((size_t)(n ? n : 1) * 2);
    int64_t blocks = (n + 255) / 256;
    unsigned grid[3] = {(unsigned)(blocks < 1 ? 1 : blocks > (1 << 20) ? (1 << 20) : blocks), 1,
                        1};
    unsigned block[3] = {256, 1, 1};
    void *argv[] = {&x, &y, &n};
    if (!emu_launch(c->m, "kiln_cast_f32_bf16", grid, block, 0, argv, d)) {
        free(y);
        return NULL;
    }
    return y;
}

/* C = op(A) op(B), row-major, batched; products and sums in double, the
 * result rounded to C's storage type. */
static bool run_gemm(BackendCtx *c, int s, Diag *d)
{
    const CgStep *st = &c->p->steps.v[s];
    const EStep *es = &c->st[s];
    const CgGemm *m = &st->gemm;
    const Graph *g = c->p->g;
    DType sa = c->q->storage[m->a], sb = c->q->storage[m->b], sc = c->q->storage[m->c];
    if ((sa != DT_F32 && sa != DT_BF16) || (sb != DT_F32 && sb != DT_BF16) ||
        (sc != DT_F32 && sc != DT_BF16)) {
        snprintf(d->msg, sizeof d->msg, "emu: gemm of op %d: only f32 and bf16 matrices", st->op);
        return false;
    }
    const void *A = tptr(c, m->a), *B = tptr(c, m->b);
    uint16_t *ca = NULL, *cb = NULL;
    bool abf = sa == DT_BF16, bbf = sb == DT_BF16;
    if (es->cast_a) {
        if (!(ca = cast_bf16(c, A, numel(g, m->a), d)))
            return false;
        A = ca;
        abf = true;
    }
    if (es->cast_b) {
        if (!(cb = cast_bf16(c, B, numel(g, m->b), d))) {
            free(ca);
            return false;
        }
        B = cb;
        bbf = true;
    }
    unsigned char *C = tptr(c, es->epi ? m->d : m->c);
    const float *bias = es->epi ? (const float *)tptr(c, m->bias) : NULL;
    for (int64_t b = 0; b < m->batch; b++)
        for (int64_t i = 0; i < m->M; i++)
            for (int64_t j = 0; j < m->N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < m->K; k++) {
                    int64_t ia = b * m->sa + (m->ta ? k * m->lda + i : i * m->lda + k);
                    int64_t ib = b * m->sb + (m->tb ? j * m->ldb + k : k * m->ldb + j);
                    double x = abf ? bf2f(((const uint16_t *)A)[ia]) : ((const float *)A)[ia];
                    double y = bbf ? bf2f(((const uint16_t *)B)[ib]) : ((const float *)B)[ib];
                    acc += x * y;
                }
                int64_t ic = b * m->sc + i * m->ldc + j;
                if (bias) /* the product rounded to f32 first, as the kernel reads C */
                    acc = (double)(float)acc + (double)bias[j];
                if (sc == DT_BF16)
                    ((uint16_t *)C)[ic] = f2bf((float)acc);
                else
                    ((float *)C)[ic] = (float)acc;
            }
    free(ca);
    free(cb);
    return true;
}

static bool emu_run_step(BackendCtx *c, int s, uint64_t seed, int64_t step, Diag *d)
{
    const CgStep *st = &c->p->steps.v[s];
    if (s == 0) {
        uint64_t rs[2] = {seed, (uint64_t)step};
        memcpy(c->rs, rs, sizeof rs);
    }
    switch (st->kind) {
    case CG_STEP_KERNEL: {
        if (c->st[s].skip)
            return true;
        /* While the step runs, only its own buffers (and {seed, step}) are
         * addressable: a kernel that strays into a neighbour in the arena
         * is an AddressSanitizer error, as a stray past a lone allocation. */
        const CgKernel *k = c->p->kernels.v[st->kernel];
        bool poison = cfg.opts.sanitize && __asan_poison_memory_region;
        if (poison) {
            __asan_poison_memory_region(c->arena, c->arena_bytes + 16);
            for (int a = 0; a < k->params.n; a++)
                __asan_unpoison_memory_region(c->st[s].ptr[a], (size_t)c->st[s].bytes[a]);
            __asan_unpoison_memory_region(c->rs, 16);
        }
        bool ok = true;
        for (int f = 0; f < c->q->step_nfn[s] && ok; f++) {
            const CgCudaFn *fn = &c->q->fn.v[c->q->step_fn[s] + f];
            unsigned grid[3] = {(unsigned)fn->blocks, 1, 1}, block[3] = {(unsigned)fn->threads, 1, 1};
            ok = emu_launch(c->m, fn->name, grid, block, 0, c->st[s].argv, d);
        }
        if (poison)
            __asan_unpoison_memory_region(c->arena, c->arena_bytes + 16);
        return ok;
    }
    case CG_STEP_GEMM: return run_gemm(c, s, d);
    case CG_STEP_COPY:
        if (st->dst != st->src && st->bytes > 0) {
            int64_t lo = st->dst < st->src ? st->dst : st->src;
            int64_t hi = st->dst < st->src ? st->src : st->dst;
            if (hi - lo < st->bytes) {
                snprintf(d->msg, sizeof d->msg, "emu: copy step %d: overlapping regions", s);
                return false;
            }
            memcpy(c->arena + st->dst, c->arena + st->src, (size_t)st->bytes);
        }
        return true;
    case CG_STEP_ALLREDUCE_START:
    case CG_STEP_ALLREDUCE_WAIT: return true;
    }
    return true;
}

static void emu_sync(BackendCtx *c) { (void)c; }

const Backend emu_backend_cuda = {
    "cuda-emu", emu_create, emu_destroy, emu_write, emu_read, emu_run_step, emu_sync,
};

const CgCudaProgram *emu_backend_program(const BackendCtx *c) { return c->q; }

int emu_backend_epilogues(const BackendCtx *c) { return c->nepi; }
