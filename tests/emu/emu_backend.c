/* emu_backend.c - the CUDA backend's plan on the emulated device: the same
 * program (cg_cuda_program: same kernels, same variants, same launch
 * geometry), the same arena layout (plan offsets, {seed, step} after the
 * arena), the same copies; cuBLASLt's GEMMs replaced by a host GEMM with the
 * same operand types (bf16 operands: stored bf16, or f32 cast by the
 * program's own kiln_cast_f32_bf16 kernel first) and f32 or bf16 results
 * rounded to nearest even, and the GEMM epilogues the CUDA backend applies
 * (same rules; computed as cuBLASLt defines them, see CgEpilogue).
 * Allreduce steps are identities (one rank).
 *
 * What the backend decides is not restated here: the GEMM's operand and
 * result types, the casts, the tensor each epilogue writes and reads, which
 * epilogues apply (with their pairs and the steps they replace) and where a
 * host access lands come from runtime/cuda/gemm_plan.c, the file the CUDA
 * module links; only cuBLASLt's refusals are the emulator's own
 * (EmuBackendCfg.refuse_epilogues). */
#include "emu_backend.h"

#include "cg_cuda.h"
#include "gemm_plan.h"

#include <math.h>
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
    unsigned char **ptr; /* per kernel param: its buffer */
    int64_t *bytes; /* per param: bytes of its buffer (storage dtype) */
    KcGemmForm form; /* GEMM: how it runs with the epilogue it applies */
} EStep;

struct BackendCtx {
    const CgPlan *p;
    CgCudaProgram *q;
    EmuModule *m;
    unsigned char *arena, *rs; /* rs: {seed, step} */
    unsigned char *part;       /* the partials scratch (CgCudaProgram.part_bytes) */
    unsigned char *wcopy;      /* bf16 weight copies kept through a step
                                  (CgCudaProgram.cast_bytes; NaN until cast) */
    size_t arena_bytes;
    EStep *st;
    bool bf16;
    int nepi[CG_EPI__COUNT]; /* GEMM steps applying each epilogue */
    CgEpilogue *epi;         /* per step: the epilogue its GEMM applies */
    bool *skip;              /* per step: computed by an applied epilogue */
    char *src; /* the source actually compiled (after cfg.edit) */
};

static void emu_destroy(BackendCtx *c)
{
    if (!c)
        return;
    if (c->st)
        for (int s = 0; s < c->p->steps.n; s++) {
            free(c->st[s].ptr);
            free(c->st[s].bytes);
        }
    free(c->st);
    free(c->epi);
    free(c->skip);
    emu_free(c->m);
    if (c->q)
        cg_cuda_program_free(c->q);
    free(c->arena);
    free(c->part);
    free(c->wcopy);
    free(c->src);
    free(c);
}

static int64_t numel(const Graph *g, int t) { return shape_numel(&g->t.v[t].s); }

static unsigned char *tptr(const BackendCtx *c, int tensor)
{
    return c->arena + c->q->mem->offset[tensor]; /* the device arena (CgCudaProgram.mem) */
}

/* Which epilogue each GEMM step applies, as the CUDA backend decides
 * (kc_gemm_settle): the program's (CgCudaProgram.epi), unless the
 * (emulated) heuristic has no algorithm for it
 * (EmuBackendCfg.refuse_epilogues), then neither it nor its pair; marks the
 * steps they replace. Then each GEMM's form with it (kc_gemm_form). */
static bool plan_gemms(BackendCtx *c, Diag *d)
{
    const CgPlan *p = c->p;
    for (int s = 0; s < p->steps.n; s++) {
        c->epi[s] = c->q->epi[s];
        if ((cfg.refuse_epilogues >> c->epi[s]) & 1u)
            c->epi[s] = CG_EPI_NONE;
    }
    kc_gemm_settle(p, c->epi, c->skip);
    for (int s = 0; s < p->steps.n; s++) {
        if (p->steps.v[s].kind != CG_STEP_GEMM)
            continue;
        if (!kc_gemm_form(c->q, s, c->epi[s], &c->st[s].form, d->msg, sizeof d->msg))
            return false;
        if (c->epi[s] != CG_EPI_NONE)
            c->nepi[c->epi[s]]++;
    }
    return true;
}

static BackendCtx *emu_create(const CgPlan *p, const ExecOpts *o, Diag *d)
{
    if (!cfg_set)
        emu_opts_default(&cfg.opts);
    BackendCtx *c = xcalloc(1, sizeof *c);
    c->p = p;
    c->bf16 = o && o->precision && strcmp(o->precision, "bf16") == 0;
    c->q = cg_cuda_program(p, c->bf16);
    c->arena_bytes = (size_t)(c->q->mem->arena_bytes + 255) / 256 * 256;
    c->arena = malloc(c->arena_bytes + 16);
    if (!c->arena) {
        snprintf(d->msg, sizeof d->msg, "emu: cannot allocate the arena");
        goto fail;
    }
    memset(c->arena, 0, c->arena_bytes + 16);
    c->rs = c->arena + c->arena_bytes;
    /* the partials scratch: filled with NaN (0xff bytes), so a stage that
     * reads partials nothing wrote gives NaN instead of a plausible sum */
    c->part = malloc((size_t)c->q->part_bytes + 16);
    if (!c->part) {
        snprintf(d->msg, sizeof d->msg, "emu: cannot allocate the partials scratch");
        goto fail;
    }
    memset(c->part, 0xff, (size_t)c->q->part_bytes + 16);
    if (c->q->part_bytes > 0) /* the tickets start at zero, as the CUDA backend sets them */
        memset(c->part, 0, CG_CUDA_SCRATCH_ZERO);
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
    c->epi = xcalloc((size_t)p->steps.n + 1, sizeof(CgEpilogue));
    c->skip = xcalloc((size_t)p->steps.n + 1, sizeof(bool));
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        EStep *es = &c->st[s];
        if (st->kind == CG_STEP_KERNEL) {
            const CgKernel *k = p->kernels.v[st->kernel];
            es->ptr = xcalloc((size_t)k->params.n + 1, sizeof(unsigned char *));
            es->bytes = xcalloc((size_t)k->params.n + 1, sizeof(int64_t));
            for (int a = 0; a < k->params.n; a++) {
                es->ptr[a] = tptr(c, st->args[a]);
                es->bytes[a] = numel(p->g, st->args[a]) * dtype_size(c->q->storage[st->args[a]]);
            }
            for (int f = 0; f < c->q->step_nfn[s]; f++) {
                const CgCudaFn *fn = &c->q->fn.v[c->q->step_fn[s] + f];
                int np = emu_kernel_nparams(c->m, fn->name);
                if (np != fn->nparam + (fn->rand ? 1 : 0) + (fn->part ? 1 : 0)) {
                    snprintf(d->msg, sizeof d->msg,
                             "emu: step %d: function %s takes %d parameters (the program says "
                             "%d buffers%s%s)",
                             s, fn->name, np, fn->nparam, fn->rand ? " and {seed, step}" : "",
                             fn->part ? " and the partials scratch" : "");
                    goto fail;
                }
            }
        }
    }
    if (!plan_gemms(c, d))
        goto fail;
    return c;
fail:
    emu_destroy(c);
    return NULL;
}

/* Host accesses name plan offsets; as the CUDA backend, they are moved to the
 * device arena's (kc_host_offset) and anything else is a bug. */
static int64_t host_offset(const BackendCtx *c, int64_t off, int64_t bytes)
{
    char why[256];
    int64_t o = kc_host_offset(c->q, off, bytes, why, sizeof why);
    if (o < 0)
        die("emu: %s", why);
    return o;
}

static void emu_write(BackendCtx *c, int64_t off, const void *src, int64_t bytes)
{
    memcpy(c->arena + host_offset(c, off, bytes), src, (size_t)bytes);
}

static void emu_read(BackendCtx *c, int64_t off, void *dst, int64_t bytes)
{
    memcpy(dst, c->arena + host_offset(c, off, bytes), (size_t)bytes);
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

/* cuBLASLt's GELU, the tanh form, and its derivative (the exact erf GELU
 * under the EMU_EPI_ERF_GELU fault). */
static double gelu(double x)
{
    if (cfg.epi_fault == EMU_EPI_ERF_GELU)
        return 0.5 * x * (1.0 + erf(x * 0.70710678118654752));
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double dgelu(double x)
{
    if (cfg.epi_fault == EMU_EPI_ERF_GELU)
        return 0.5 * (1.0 + erf(x * 0.70710678118654752)) +
               x * exp(-0.5 * x * x) * 0.39894228040143268;
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

/* The weight-copy buffer, allocated on first use and filled with bf16 NaNs
 * (0xffff), so a GEMM that reads a copy no cast wrote computes NaNs. */
static bool wcopy_ready(BackendCtx *c, Diag *d)
{
    if (c->wcopy || c->q->cast_bytes <= 0)
        return true;
    c->wcopy = malloc((size_t)c->q->cast_bytes);
    if (!c->wcopy) {
        snprintf(d->msg, sizeof d->msg, "emu: no memory for %lld bytes of weight copies",
                 (long long)c->q->cast_bytes);
        return false;
    }
    memset(c->wcopy, 0xff, (size_t)c->q->cast_bytes);
    return true;
}

/* The cast group due before GEMM step s (CgCudaProgram.cast_group): one
 * launch of the program's kiln_cast_f32_bf16_multi over its job table
 * (the layout cg_cuda_cast_multi_kernel states), as the CUDA backend. */
static bool cast_group(BackendCtx *c, int s, Diag *d)
{
    const CgCudaProgram *q = c->q;
    int i = q->cast_group[s];
    if (i < 0)
        return true;
    struct {
        const void *x;
        void *y;
        int64_t n, c0;
    } *job = malloc(sizeof *job * (size_t)(q->cast_first[i + 1] - q->cast_first[i] + 1));
    int njob = 0;
    int64_t nchunk = 0;
    for (int j = q->cast_first[i]; j < q->cast_first[i + 1]; j++, njob++) {
        int64_t n = numel(c->p->g, q->cast_t[j]);
        job[njob].x = tptr(c, q->cast_t[j]);
        job[njob].y = c->wcopy + q->cast_slot[j];
        job[njob].n = n;
        job[njob].c0 = nchunk;
        nchunk += (n + CG_CUDA_CAST_CHUNK - 1) / CG_CUDA_CAST_CHUNK;
    }
    unsigned grid[3] = {(unsigned)(nchunk < 1 ? 1 : nchunk > (1 << 20) ? (1 << 20) : nchunk), 1,
                        1};
    unsigned block[3] = {256, 1, 1};
    void *argv[] = {&job, &njob, &nchunk};
    bool ok = emu_launch(c->m, "kiln_cast_f32_bf16_multi", grid, block, 0, argv, d);
    free(job);
    return ok;
}

/* C = op(A) op(B), row-major, batched; products and sums in double, the
 * result rounded to D's storage type; an applied epilogue as cuBLASLt
 * defines it (see CgEpilogue), on the product rounded to f32. The form
 * (types, casts, the tensors written and read) is the backend's
 * (kc_gemm_form). */
static bool run_gemm(BackendCtx *c, int s, Diag *d)
{
    const CgStep *st = &c->p->steps.v[s];
    const KcGemmForm *f = &c->st[s].form;
    const CgGemm *m = &st->gemm;
    const Graph *g = c->p->g;
    const void *A = tptr(c, m->a), *B = tptr(c, m->b);
    uint16_t *ca = NULL, *cb = NULL;
    bool abf = f->bf16_in, bbf = f->bf16_in;
    /* a weight with a copy kept through the step (cuda_cast.c): cast into
     * it by a cast group (the one due before this GEMM, or an earlier one),
     * read by every GEMM */
    if (!wcopy_ready(c, d) || !cast_group(c, s, d))
        return false;
    for (int o = 0; o < 2; o++) {
        if (!(o ? f->cast_b : f->cast_a))
            continue;
        int t = o ? m->b : m->a;
        int64_t off = c->q->cast_off[2 * s + o], n = numel(g, t);
        uint16_t *y = NULL;
        if (off < 0 && !(y = cast_bf16(c, o ? B : A, n, d))) {
            free(ca);
            return false;
        }
        const void *use = off >= 0 ? (const void *)(c->wcopy + off) : (const void *)y;
        if (o) {
            cb = y;
            B = use;
        } else {
            ca = y;
            A = use;
        }
    }
    CgEpilogue e = c->epi[s];
    bool gelu_e = e == CG_EPI_GELU_BIAS || e == CG_EPI_GELU_AUX_BIAS;
    bool dgelu_e = e == CG_EPI_DGELU || e == CG_EPI_DGELU_BGRAD;
    unsigned char *C = tptr(c, f->out);
    /* D's type (c, d and aux share it, CgCudaProgram.epi); a bf16 D reads
     * the f32 bias rounded to bf16, as the backend's copy (bias16) */
    DType sd = f->out_bf16 ? DT_BF16 : DT_F32;
    float *bias = NULL;
    if (f->bias >= 0) {
        bias = xmalloc(sizeof(float) * (size_t)(m->N + 1));
        const float *b32 = (const float *)tptr(c, f->bias);
        for (int64_t j = 0; j < m->N; j++)
            bias[j] = f->bias16 ? bf2f(f2bf(b32[j])) : b32[j];
    }
    unsigned char *aux = e == CG_EPI_GELU_AUX_BIAS ? tptr(c, f->aux) : NULL;
    const unsigned char *pre = dgelu_e ? tptr(c, f->aux) : NULL;
    int64_t nbg = e == CG_EPI_BGRAD_A ? m->M : m->N;
    double *bg = f->bgrad >= 0 ? xcalloc((size_t)nbg + 1, sizeof(double)) : NULL;
    /* bias gradients: every row (k, or m), but the last one under the fault */
    int64_t lastrow = cfg.epi_fault == EMU_EPI_BGRAD_SHORT ? 1 : 0;
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
                /* epilogues act on the f32 accumulator; aux is stored in D's
                 * type and read back from it */
                if (e == CG_EPI_BIAS) {
                    acc = (double)(float)acc + (double)bias[j];
                } else if (gelu_e) {
                    float x = (float)((double)(float)acc +
                                      (cfg.epi_fault == EMU_EPI_NO_BIAS ? 0.0 : (double)bias[j]));
                    if (aux && sd == DT_BF16)
                        ((uint16_t *)aux)[ic] = f2bf(x);
                    else if (aux)
                        ((float *)aux)[ic] = x;
                    acc = gelu(x);
                } else if (dgelu_e) {
                    double x = sd == DT_BF16 ? bf2f(((const uint16_t *)pre)[ic])
                                             : ((const float *)pre)[ic];
                    acc = (double)(float)acc * dgelu(x);
                }
                if (sd == DT_BF16)
                    ((uint16_t *)C)[ic] = f2bf((float)acc);
                else
                    ((float *)C)[ic] = (float)acc;
                if (e == CG_EPI_DGELU_BGRAD && i < m->M - lastrow)
                    bg[j] += (double)(float)acc;
            }
    /* BGRAD_B: op(B) = B stored [K, N]; BGRAD_A: op(A) = A^T, A stored [K, M];
     * the operand as the GEMM reads it (bf16 in mixed precision) */
    if (e == CG_EPI_BGRAD_B || e == CG_EPI_BGRAD_A) {
        const void *X = e == CG_EPI_BGRAD_B ? B : A;
        bool xbf = e == CG_EPI_BGRAD_B ? bbf : abf;
        int64_t ld = e == CG_EPI_BGRAD_B ? m->ldb : m->lda;
        for (int64_t k = 0; k < m->K - lastrow; k++)
            for (int64_t j = 0; j < nbg; j++)
                bg[j] += xbf ? (double)bf2f(((const uint16_t *)X)[k * ld + j])
                             : (double)((const float *)X)[k * ld + j];
    }
    if (bg) {
        float *out = (float *)tptr(c, f->bgrad);
        for (int64_t j = 0; j < nbg; j++)
            out[j] = (float)bg[j];
        free(bg);
    }
    free(bias);
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
        if (c->skip[s])
            return true;
        /* While a function runs, only the buffers it takes (and {seed,
         * step}) are addressable: a kernel that strays into a neighbour in
         * the arena, or into a param its function does not declare, is an
         * AddressSanitizer error, as a stray past a lone allocation. */
        bool poison = cfg.opts.sanitize && __asan_poison_memory_region;
        bool ok = true;
        for (int f = 0; f < c->q->step_nfn[s] && ok; f++) {
            const CgCudaFn *fn = &c->q->fn.v[c->q->step_fn[s] + f];
            void **argv = xcalloc((size_t)fn->nparam + 3, sizeof(void *));
            for (int j = 0; j < fn->nparam; j++)
                argv[j] = &c->st[s].ptr[fn->param[j]];
            if (fn->rand)
                argv[fn->nparam] = &c->rs;
            if (fn->part)
                argv[fn->nparam + (fn->rand ? 1 : 0)] = &c->part;
            if (poison) {
                __asan_poison_memory_region(c->arena, c->arena_bytes + 16);
                for (int j = 0; j < fn->nparam; j++)
                    __asan_unpoison_memory_region(c->st[s].ptr[fn->param[j]],
                                                  (size_t)c->st[s].bytes[fn->param[j]]);
                __asan_unpoison_memory_region(c->rs, 16);
            }
            unsigned grid[3] = {(unsigned)fn->blocks, 1, 1}, block[3] = {(unsigned)fn->threads, 1, 1};
            ok = emu_launch(c->m, fn->name, grid, block, 0, argv, d);
            if (poison)
                __asan_unpoison_memory_region(c->arena, c->arena_bytes + 16);
            free(argv);
        }
        return ok;
    }
    case CG_STEP_GEMM: return run_gemm(c, s, d);
    case CG_STEP_COPY: {
        const CgCudaCopy *cp = &c->q->copy[s]; /* in the device arena's offsets */
        if (cp->dst != cp->src && cp->bytes > 0) {
            int64_t lo = cp->dst < cp->src ? cp->dst : cp->src;
            int64_t hi = cp->dst < cp->src ? cp->src : cp->dst;
            if (hi - lo < cp->bytes) {
                snprintf(d->msg, sizeof d->msg, "emu: copy step %d: overlapping regions", s);
                return false;
            }
            memcpy(c->arena + cp->dst, c->arena + cp->src, (size_t)cp->bytes);
        }
        return true;
    }
    case CG_STEP_ALLREDUCE_START:
    case CG_STEP_ALLREDUCE_WAIT:
    case CG_STEP_SHARD_PACK:
    case CG_STEP_TP: return true;
    }
    return true;
}

static void emu_sync(BackendCtx *c) { (void)c; }

const Backend emu_backend_cuda = {
    "cuda-emu", emu_create, emu_destroy, emu_write, emu_read, emu_run_step, emu_sync, NULL, false,
    NULL,
};

const CgCudaProgram *emu_backend_program(const BackendCtx *c) { return c->q; }

int emu_backend_epilogues(const BackendCtx *c, int *per_kind)
{
    int n = 0;
    for (int e = 0; e < CG_EPI__COUNT; e++) {
        n += c->nepi[e];
        if (per_kind)
            per_kind[e] = c->nepi[e];
    }
    return n;
}
