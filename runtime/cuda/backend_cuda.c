/* backend_cuda.c - the step of the CUDA backend (libkiln_cuda.so, loaded
 * by device.c with dlopen): the Backend table (create, write, read, run one
 * plan step, sync, destroy) and its BackendExt (device timing, NCCL
 * all-reduces, tensor parallelism's NCCL collectives).
 *
 * create: the plan's CUDA program (printed by kiln through RtCudaHost)
 * compiled by NVRTC for the device's own architecture (cuda_nvrtc.c),
 * loaded and its functions looked up; one device allocation for the arena
 * (plus 256 bytes for {seed, step}); per step its launch arguments, or its
 * GEMM's form (gemm_plan.c) and cuBLASLt plan (cublaslt.c), an epilogue
 * the library has no algorithm for falling back, with its pair, to the
 * planned kernels. Host writes go through a pinned staging buffer as
 * asynchronous copies on the compute stream, so preparing the next batch
 * overlaps the step; reads wait for the stream. A second (communication)
 * stream and events exist for collectives; with a CUDA graph the first run
 * is captured and later runs replay it.
 *
 * Invariant: every host wait on the device goes through wait_stream or
 * wait_event: with NCCL all-reduces in the step they poll and are bounded
 * (kc_wait_stream, kc_wait_event: a hung peer stops every rank with a
 * message instead of hanging this one); without, they block.
 * test_cuda_nccl counts them against a fake driver.
 *
 * Every driver call goes through CU() (driver.c), which names the call, the
 * file and the line. */
#include "cuda_module.h"

#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const RtCudaHost *host;

enum { STAGE_BYTES = 16 << 20 };

/* One job of kiln_cast_f32_bf16_multi (cg_cuda_cast_multi_kernel): x[0, n)
 * into y as the launch's chunks from c0 on. */
typedef struct {
    CUdeviceptr x, y;
    int64_t n, c0;
} KcCastJob;
_Static_assert(sizeof(KcCastJob) == CG_CUDA_CAST_JOB_BYTES, "the kernel's job layout");

typedef struct {
    CUfunction *fn;     /* the step's functions, in order */
    const CgCudaFn *geo;
    int nfn;
    void ***argv;       /* per function: &ptr[param[j]]..., [&rs] (CgCudaFn) */
    CUdeviceptr *ptr;
    int gemm;           /* GEMM steps: the cuBLASLt plan (kc_lt_plan) */
    KcGemmForm form;    /* GEMM: how it runs with the epilogue it applies */
    bool cast_a, cast_b; /* GEMM: casts that operand into the scratch now
                            (form.cast_* less the weights with a copy kept
                            through the step: CgCudaProgram.cast_off) */
    CUdeviceptr cast_jobs; /* GEMM: the job table of the cast group launched
                              right before it (CgCudaProgram.cast_group), 0: none */
    int cast_njob;
    int64_t cast_nchunk;
    CUdeviceptr bias16;  /* GEMM with a bias epilogue and bf16 D: the bias's bf16 copy,
                            cast from the f32 bias right before the GEMM */
    CUdeviceptr a, b, c; /* GEMM operands as used (c: cuBLASLt's D, the epilogue's d
                            when it writes one) */
    char label[96];      /* NVTX range: the step's kernel name, or the GEMM's shape */
    CgCudaFn rgeo;       /* a piece of a flat kernel (CgStep hi > lo): its range
                            function's geometry, the grid from hi - lo (geo points here) */
    int64_t lo, hi;      /* the piece's elements: the range function's last two args */
} CuStep;

struct BackendCtx {
    const CgPlan *p;
    struct CgCudaProgram *q;
    CUdevice dev;
    CUcontext ctx;
    bool ctx_held;
    char arch[16];
    CUstream s, comm;        /* compute, communication */
    CUevent comm_ready, rs_done;
    CUevent ev_begin, ev_end; /* around a run (timing) */
    CUevent *ev_step;        /* profile: after each plan step */
    double host_begin;       /* CLOCK_MONOTONIC when the last run began */
    bool ran;                /* ev_begin and ev_end recorded */
    struct KcComm *nccl;     /* device collectives (cuda_nccl.c) */
    struct KcComm *tpk;      /* the TP group's collectives (kc_tp_open), NULL: none */
    struct KcPp *pp;         /* pipeline stages' transfers (kc_pp_open), NULL: none */
    CUdeviceptr arena, rs, scratch;
    CUdeviceptr part;        /* the partials scratch of split loops
                                (CgCudaProgram.part_bytes; CgCudaFn.part) */
    int64_t scratch_half;    /* bytes of each of the two bf16 operand areas */
    CUdeviceptr bias16;      /* bf16 copies of biases (CuStep.bias16) */
    CUdeviceptr wcopy;       /* bf16 copies of weights kept through a step
                                (CgCudaProgram.cast_bytes, cast_off) */
    CUdeviceptr cast_jobs;   /* every cast group's job table (KcCastJob) */
    KcCastJob *cast_host;    /* pinned: the same, as uploaded */
    CgEpilogue *epi;         /* per step: the epilogue its GEMM applies: the
                                program's (CgCudaProgram.epi) unless cuBLASLt
                                has no algorithm for it (then its pair's too) */
    bool *skip;              /* per step: computed by an applied epilogue
                                (CgStep.by_epilogue, kc_gemm_settle) */
    unsigned char *stage;    /* pinned host staging */
    size_t stage_cap, stage_used;
    uint64_t *rs_host;       /* pinned {seed, step} */
    CUmodule mod;
    CUfunction *fns, cast_fn, cast_multi_fn;
    CuStep *st;
    KcLt *lt;                /* cuBLASLt (cublaslt.c) */
    bool tf32, bf16, graph_on, capturing, replaying;
    bool warm;               /* a run has completed: the next may be captured */
    CUgraph graph;
    CUgraphExec gexec;
    bool verbose;
};

static bool create_timing(BackendCtx *c, bool profile, Diag *d);
static void destroy_timing(BackendCtx *c);
static bool run_begins(BackendCtx *c, Diag *d);
static bool step_done(BackendCtx *c, int s, Diag *d);

/* Every host wait on the device. With NCCL collectives in the step, or
 * pipeline transfers, they poll and are bounded (kc_wait_stream,
 * kc_pp_wait: a hung peer stops every rank with a message); without, they
 * block. */
static CUresult wait_stream(BackendCtx *c, CUstream s)
{
    struct KcComm *k = c->nccl ? c->nccl : c->tpk; /* each watches the other too */
    return c->pp ? kc_pp_wait(c->pp, k, s, NULL)
           : k   ? kc_wait_stream(k, s)
                 : kc_cu.cuStreamSynchronize(s);
}

static CUresult wait_event(BackendCtx *c, CUevent e)
{
    struct KcComm *k = c->nccl ? c->nccl : c->tpk;
    return c->pp ? kc_pp_wait(c->pp, k, NULL, e)
           : k   ? kc_wait_event(k, e)
                 : kc_cu.cuEventSynchronize(e);
}

static void cuda_destroy(BackendCtx *c)
{
    if (!c)
        return;
    if (c->ctx_held) {
        kc_cu.cuCtxSetCurrent(c->ctx);
        if (c->capturing) { /* a step failed inside the capture: end it first */
            CUgraph g = NULL;
            kc_cu.cuStreamEndCapture(c->s, &g);
            if (g)
                kc_cu.cuGraphDestroy(g);
            c->capturing = false;
        }
        if (c->s)
            wait_stream(c, c->s);
        destroy_timing(c); /* NCCL first: it waits for the communication stream */
        kc_pp_close(c->pp);
        if (c->gexec)
            kc_cu.cuGraphExecDestroy(c->gexec);
        if (c->graph)
            kc_cu.cuGraphDestroy(c->graph);
        kc_lt_destroy(c->lt);
        if (c->mod)
            kc_cu.cuModuleUnload(c->mod);
        if (c->arena)
            kc_cu.cuMemFree(c->arena);
        if (c->scratch)
            kc_cu.cuMemFree(c->scratch);
        if (c->part)
            kc_cu.cuMemFree(c->part);
        if (c->bias16)
            kc_cu.cuMemFree(c->bias16);
        if (c->wcopy)
            kc_cu.cuMemFree(c->wcopy);
        if (c->cast_jobs)
            kc_cu.cuMemFree(c->cast_jobs);
        if (c->cast_host)
            kc_cu.cuMemFreeHost(c->cast_host);
        if (c->stage)
            kc_cu.cuMemFreeHost(c->stage);
        if (c->rs_host)
            kc_cu.cuMemFreeHost(c->rs_host);
        CUevent ev[] = {c->comm_ready, c->rs_done};
        for (int i = 0; i < 2; i++)
            if (ev[i])
                kc_cu.cuEventDestroy(ev[i]);
        if (c->s)
            kc_cu.cuStreamDestroy(c->s);
        if (c->comm)
            kc_cu.cuStreamDestroy(c->comm);
        kc_cu.cuDevicePrimaryCtxRelease(c->dev);
    }
    if (c->st)
        for (int i = 0; i < c->p->steps.n; i++) {
            free(c->st[i].fn);
            for (int f = 0; c->st[i].argv && f < c->st[i].nfn; f++)
                free(c->st[i].argv[f]);
            free(c->st[i].argv);
            free(c->st[i].ptr);
        }
    free(c->st);
    free(c->epi);
    free(c->skip);
    free(c->fns);
    if (c->q)
        host->program_free(c->q);
    free(c);
}

static CUdeviceptr dptr(const BackendCtx *c, int tensor)
{
    return c->arena + (CUdeviceptr)c->q->mem->offset[tensor];
}

static int64_t numel(const Graph *g, int t)
{
    const Shape *s = &g->t.v[t].s;
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++)
        n *= s->dim[i];
    return n;
}

/* Plans GEMM step s with epilogue e (CG_EPI_NONE: plain) in its form
 * (kc_gemm_form) on the pointers it will run with; -2 when cuBLASLt has no
 * algorithm for the epilogue, -1 with d set on an error. */
static int plan_step_gemm(BackendCtx *c, int s, CgEpilogue e, Diag *d)
{
    const CgGemm *m = &c->p->steps.v[s].gemm;
    CuStep *cs = &c->st[s];
    if (!kc_gemm_form(c->q, s, e, &cs->form, d->msg, sizeof d->msg))
        return -1;
    const KcGemmForm *f = &cs->form;
    cs->c = dptr(c, f->out);
    CUdeviceptr bias = 0, aux = f->aux >= 0 ? dptr(c, f->aux) : 0;
    if (f->bgrad >= 0)
        bias = dptr(c, f->bgrad);
    else if (f->bias >= 0)
        bias = f->bias16 ? cs->bias16 : dptr(c, f->bias);
    return kc_lt_plan(c->lt, m, f, e, cs->a, cs->b, cs->c, bias, aux, d);
}

/* The cast groups' job tables (one device buffer, uploaded once: the
 * pointers never change) and each group's GEMM step's share of it. */
static bool setup_cast_groups(BackendCtx *c, Diag *d)
{
    const struct CgCudaProgram *q = c->q;
    int nj = q->cast_first[q->ncast_groups];
    size_t bytes = sizeof(KcCastJob) * (size_t)(nj > 0 ? nj : 1);
    if (!CU(kc_cu.cuMemAllocHost((void **)&c->cast_host, bytes), d) ||
        !CU(kc_cu.cuMemAlloc(&c->cast_jobs, bytes), d))
        return false;
    for (int s = 0; s < c->p->steps.n; s++) {
        int i = q->cast_group[s];
        if (i < 0)
            continue;
        int64_t c0 = 0;
        for (int j = q->cast_first[i]; j < q->cast_first[i + 1]; j++) {
            int64_t n = numel(c->p->g, q->cast_t[j]);
            c->cast_host[j] = (KcCastJob){dptr(c, q->cast_t[j]),
                                          c->wcopy + (CUdeviceptr)q->cast_slot[j], n, c0};
            c0 += (n + CG_CUDA_CAST_CHUNK - 1) / CG_CUDA_CAST_CHUNK;
        }
        CuStep *cs = &c->st[s];
        cs->cast_jobs = c->cast_jobs + sizeof(KcCastJob) * (CUdeviceptr)q->cast_first[i];
        cs->cast_njob = q->cast_first[i + 1] - q->cast_first[i];
        cs->cast_nchunk = c0;
    }
    return CU(kc_cu.cuMemcpyHtoDAsync(c->cast_jobs, c->cast_host, bytes, c->s), d);
}

static bool setup_steps(BackendCtx *c, Diag *d)
{
    const CgPlan *p = c->p;
    const struct CgCudaProgram *q = c->q;
    const Graph *g = p->g;
    c->st = kc_zalloc(sizeof(CuStep) * (size_t)(p->steps.n + 1));
    c->epi = kc_zalloc(sizeof(CgEpilogue) * (size_t)(p->steps.n + 1));
    c->skip = kc_zalloc(sizeof(bool) * (size_t)(p->steps.n + 1));
    /* split loops' partials: written before they are read, never cleared;
     * the ticket counters in front of them start at zero (the launch that
     * counts them sets them back: CG_CUDA_SCRATCH_ZERO) */
    if (q->part_bytes > 0 &&
        (!CU(kc_cu.cuMemAlloc(&c->part, (size_t)q->part_bytes), d) ||
         !CU(kc_cu.cuMemsetD8Async(c->part, 0, CG_CUDA_SCRATCH_ZERO, c->s), d)))
        return false;
    /* each GEMM's form with the program's epilogue: its casts, and the
     * bf16 bias copy a bias epilogue into a bf16 D reads */
    int64_t need = 0, bias16 = 0;
    for (int s = 0; s < p->steps.n; s++) {
        if (p->steps.v[s].kind != CG_STEP_GEMM)
            continue;
        if (!kc_gemm_form(q, s, q->epi[s], &c->st[s].form, d->msg, sizeof d->msg))
            return false;
        if (c->st[s].form.bias16)
            bias16 += (p->steps.v[s].gemm.N * 2 + 255) / 256 * 256;
    }
    if (bias16 > 0 && !CU(kc_cu.cuMemAlloc(&c->bias16, (size_t)bias16), d))
        return false;
    bias16 = 0;
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        CuStep *cs = &c->st[s];
        cs->gemm = -1;
        snprintf(cs->label, sizeof cs->label, "%s", st->name ? st->name : "step");
        if (st->kind == CG_STEP_GEMM)
            snprintf(cs->label, sizeof cs->label, "gemm op%d %lldx%lldx%lld batch %lld", st->op,
                     (long long)st->gemm.M, (long long)st->gemm.N, (long long)st->gemm.K,
                     (long long)st->gemm.batch);
        if (st->kind == CG_STEP_KERNEL) {
            const CgKernel *k = p->kernels.v[st->kernel];
            cs->nfn = q->step_nfn[s];
            cs->fn = kc_zalloc(sizeof(CUfunction) * (size_t)(cs->nfn + 1));
            cs->geo = &q->fn.v[q->step_fn[s]];
            for (int f = 0; f < cs->nfn; f++)
                cs->fn[f] = c->fns[q->step_fn[s] + f];
            if (st->hi > st->lo) { /* a piece of the update (runtime/pieces.c): NAME_range */
                int r = q->step_range[s];
                if (r < 0) {
                    snprintf(d->msg, sizeof d->msg,
                             "cuda: step %d runs elements [%lld, %lld) of kernel %s, which has "
                             "no range function",
                             s, (long long)st->lo, (long long)st->hi, k->name);
                    return false;
                }
                cs->rgeo = q->fn.v[r];
                int64_t blocks = (st->hi - st->lo + cs->rgeo.threads - 1) / cs->rgeo.threads;
                cs->rgeo.blocks = blocks < 1 ? 1 : blocks < (1 << 24) ? blocks : (1 << 24);
                cs->geo = &cs->rgeo;
                cs->nfn = 1;
                cs->fn[0] = c->fns[r];
                cs->lo = st->lo;
                cs->hi = st->hi;
            }
            cs->ptr = kc_zalloc(sizeof(CUdeviceptr) * (size_t)(k->params.n + 1));
            for (int a = 0; a < k->params.n; a++)
                cs->ptr[a] = dptr(c, st->args[a]);
            cs->argv = kc_zalloc(sizeof(void **) * (size_t)(cs->nfn + 1));
            for (int f = 0; f < cs->nfn; f++) {
                const CgCudaFn *fn = &cs->geo[f];
                cs->argv[f] = kc_zalloc(sizeof(void *) * (size_t)(fn->nparam + 3));
                for (int j = 0; j < fn->nparam; j++)
                    cs->argv[f][j] = &cs->ptr[fn->param[j]];
                if (fn->rand)
                    cs->argv[f][fn->nparam] = &c->rs;
                if (fn->part)
                    cs->argv[f][fn->nparam + (fn->rand ? 1 : 0)] = &c->part;
                if (fn->range) {
                    cs->argv[f][fn->nparam] = &cs->lo;
                    cs->argv[f][fn->nparam + 1] = &cs->hi;
                }
            }
        } else if (st->kind == CG_STEP_GEMM) {
            const CgGemm *m = &st->gemm;
            int64_t na = numel(g, m->a) * 2, nb = numel(g, m->b) * 2;
            /* a weight with a copy kept through the step (cuda_cast.c) is
             * cast into its copy by a cast group, not by its GEMM */
            bool ka = q->cast_off[2 * s] >= 0, kb = q->cast_off[2 * s + 1] >= 0;
            cs->cast_a = cs->form.cast_a && !ka;
            cs->cast_b = cs->form.cast_b && !kb;
            if (cs->form.cast_a && !ka && na > need)
                need = na;
            if (cs->form.cast_b && !kb && nb > need)
                need = nb;
            cs->a = dptr(c, m->a);
            cs->b = dptr(c, m->b);
            c->epi[s] = q->epi[s];
            if (cs->form.bias16) {
                cs->bias16 = c->bias16 + (CUdeviceptr)bias16;
                bias16 += (m->N * 2 + 255) / 256 * 256;
            }
        }
    }
    /* scratch before planning: the heuristic sees the pointers it will get */
    if (q->cast_bytes > 0 && !CU(kc_cu.cuMemAlloc(&c->wcopy, (size_t)q->cast_bytes), d))
        return false;
    if (q->ncast_groups > 0 && !setup_cast_groups(c, d))
        return false;
    if (need > 0) {
        c->scratch_half = (need + 255) / 256 * 256;
        if (!CU(kc_cu.cuMemAlloc(&c->scratch, (size_t)(2 * c->scratch_half)), d))
            return false;
    }
    for (int s = 0; s < p->steps.n; s++) {
        CuStep *cs = &c->st[s];
        if (p->steps.v[s].kind != CG_STEP_GEMM)
            continue;
        if (cs->form.cast_a)
            cs->a = q->cast_off[2 * s] >= 0 ? c->wcopy + (CUdeviceptr)q->cast_off[2 * s]
                                            : c->scratch;
        if (cs->form.cast_b)
            cs->b = q->cast_off[2 * s + 1] >= 0
                        ? c->wcopy + (CUdeviceptr)q->cast_off[2 * s + 1]
                        : c->scratch + (CUdeviceptr)c->scratch_half;
    }
    for (int s = 0; s < p->steps.n; s++) {
        if (p->steps.v[s].kind != CG_STEP_GEMM)
            continue;
        int k = plan_step_gemm(c, s, c->epi[s], d);
        if (k == -2) { /* no algorithm for the epilogue: the planned kernels instead */
            c->epi[s] = CG_EPI_NONE;
            k = plan_step_gemm(c, s, CG_EPI_NONE, d);
        }
        if (k < 0)
            return false;
        c->st[s].gemm = k;
    }
    /* a pair whose partner fell back falls back too (kc_gemm_settle):
     * planned again plain */
    CgEpilogue *before = kc_zalloc(sizeof(CgEpilogue) * (size_t)(p->steps.n + 1));
    memcpy(before, c->epi, sizeof(CgEpilogue) * (size_t)p->steps.n);
    kc_gemm_settle(p, c->epi, c->skip);
    for (int s = 0; s < p->steps.n; s++)
        if (before[s] != c->epi[s] && (c->st[s].gemm = plan_step_gemm(c, s, CG_EPI_NONE, d)) < 0) {
            free(before);
            return false;
        }
    free(before);
    for (int s = 0; s < p->steps.n; s++)
        if (c->epi[s] == CG_EPI_NONE)
            c->st[s].bias16 = 0;
    return true;
}

static bool load_module(BackendCtx *c, const ExecOpts *o, Diag *d)
{
    RtCudaBinary bin;
    if (!kiln_cuda_compile(c->q->source, c->arch, o->cache_dir, o->verbose, &bin, d))
        return false;
    bool ok = CU(kc_cu.cuModuleLoadData(&c->mod, bin.cubin), d);
    kiln_cuda_binary_free(&bin);
    if (!ok)
        return false;
    c->fns = kc_zalloc(sizeof(CUfunction) * (size_t)(c->q->fn.n + 1));
    for (int i = 0; i < c->q->fn.n; i++)
        if (!CU(kc_cu.cuModuleGetFunction(&c->fns[i], c->mod, c->q->fn.v[i].name), d))
            return false;
    if (c->q->bf16 && !CU(kc_cu.cuModuleGetFunction(&c->cast_fn, c->mod, "kiln_cast_f32_bf16"), d))
        return false;
    if (c->q->ncast_groups > 0 &&
        !CU(kc_cu.cuModuleGetFunction(&c->cast_multi_fn, c->mod, "kiln_cast_f32_bf16_multi"), d))
        return false;
    return true;
}

static BackendCtx *cuda_create(const CgPlan *p, const ExecOpts *o, Diag *d)
{
    char why[512];
    if (!kc_cu_open(why, sizeof why)) {
        kc_dmsg(d, "--device cuda: %s", why);
        return NULL;
    }
    BackendCtx *c = kc_zalloc(sizeof *c);
    c->p = p;
    c->verbose = o->verbose;
    c->tf32 = o->tf32;
    c->bf16 = o->precision && strcmp(o->precision, "bf16") == 0;
    c->graph_on = o->cuda_graph && !o->profile;
    int ndev = 0, ord = 0;
    if (!CU(kc_cu.cuDeviceGetCount(&ndev), d))
        goto fail;
    ord = kc_device_ordinal(); /* KILN_CUDA_DEVICE, else the local rank */
    if (ndev < 1 || ord < 0 || ord >= ndev) {
        kc_dmsg(d, "--device cuda: no CUDA device %d (the driver sees %d; each rank on a machine "
                "uses the device of its local rank unless KILN_CUDA_DEVICE is set)", ord, ndev);
        goto fail;
    }
    int maj = 0, min = 0;
    if (!CU(kc_cu.cuDeviceGet(&c->dev, ord), d) ||
        !CU(kc_cu.cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev),
            d) ||
        !CU(kc_cu.cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev),
            d))
        goto fail;
    snprintf(c->arch, sizeof c->arch, "sm_%d%d", maj, min);
    if (maj < 8) {
        kc_dmsg(d, "--device cuda: compute capability %d.%d is too old (expected 8.0 or newer)",
                maj, min);
        goto fail;
    }
    if (!CU(kc_cu.cuDevicePrimaryCtxRetain(&c->ctx, c->dev), d))
        goto fail;
    c->ctx_held = true;
    if (!CU(kc_cu.cuCtxSetCurrent(c->ctx), d) ||
        !CU(kc_cu.cuStreamCreate(&c->s, CU_STREAM_NON_BLOCKING), d) ||
        !CU(kc_cu.cuStreamCreate(&c->comm, CU_STREAM_NON_BLOCKING), d) ||
        !CU(kc_cu.cuEventCreate(&c->comm_ready, CU_EVENT_DISABLE_TIMING), d) ||
        !CU(kc_cu.cuEventCreate(&c->rs_done, CU_EVENT_DISABLE_TIMING), d) ||
        !create_timing(c, o->profile, d))
        goto fail;
    if (o->verbose) {
        char name[256] = "?";
        kc_cu.cuDeviceGetName(name, sizeof name, c->dev);
        fprintf(stderr, "kiln: cuda: device %d: %s (%s)%s%s%s\n", ord, name, c->arch,
                c->bf16 ? ", bf16" : "", c->tf32 ? ", tf32" : "",
                c->graph_on ? ", CUDA graph" : "");
    }
    c->q = host->program(p, c->bf16);
    /* one allocation: the arena (bf16 activations at their own size), then
     * {seed, step} */
    size_t arena = (size_t)(c->q->mem->arena_bytes + 255) / 256 * 256;
    /* zeroed on the compute stream, ahead of the parameter upload there (the
     * legacy stream would not be ordered with this non-blocking stream) */
    if (!CU(kc_cu.cuMemAlloc(&c->arena, arena + 256), d) ||
        !CU(kc_cu.cuMemsetD8Async(c->arena, 0, arena + 256, c->s), d))
        goto fail;
    c->rs = c->arena + arena;
    c->stage_cap = STAGE_BYTES;
    if (!CU(kc_cu.cuMemAllocHost((void **)&c->stage, c->stage_cap), d) ||
        !CU(kc_cu.cuMemAllocHost((void **)&c->rs_host, 2 * sizeof(uint64_t)), d))
        goto fail;
    if (!load_module(c, o, d))
        goto fail;
    if (!(c->lt = kc_lt_create(c->tf32, c->verbose, d)))
        goto fail;
    if (!setup_steps(c, d))
        goto fail;
    return c;
fail:
    cuda_destroy(c);
    return NULL;
}

/* The device offset of a host access in plan offsets (kc_host_offset);
 * anything else is a bug. */
static int64_t host_offset(const BackendCtx *c, int64_t off, int64_t bytes)
{
    char why[256];
    int64_t o = kc_host_offset(c->q, off, bytes, why, sizeof why);
    if (o < 0)
        kc_fatal("%s", why);
    return o;
}

/* Host data into the arena: copied into pinned staging, then an
 * asynchronous copy on the compute stream (after the work queued before). */

static void cuda_write(BackendCtx *c, int64_t off, const void *src, int64_t bytes)
{
    off = host_offset(c, off, bytes);
    kc_cu.cuCtxSetCurrent(c->ctx);
    const unsigned char *s = src;
    while (bytes > 0) {
        size_t n = (size_t)bytes < c->stage_cap ? (size_t)bytes : c->stage_cap;
        if (c->stage_used + n > c->stage_cap) {
            (void)CU(wait_stream(c, c->s), NULL);
            c->stage_used = 0;
        }
        memcpy(c->stage + c->stage_used, s, n);
        (void)CU(kc_cu.cuMemcpyHtoDAsync(c->arena + (CUdeviceptr)off, c->stage + c->stage_used, n, c->s),
           NULL);
        c->stage_used += (n + 255) / 256 * 256;
        s += n;
        off += (int64_t)n;
        bytes -= (int64_t)n;
    }
}

static void cuda_read(BackendCtx *c, int64_t off, void *dst, int64_t bytes)
{
    off = host_offset(c, off, bytes);
    kc_cu.cuCtxSetCurrent(c->ctx);
    unsigned char *t = dst;
    (void)CU(wait_stream(c, c->s), NULL);
    c->stage_used = 0;
    while (bytes > 0) {
        size_t n = (size_t)bytes < c->stage_cap ? (size_t)bytes : c->stage_cap;
        (void)CU(kc_cu.cuMemcpyDtoHAsync(c->stage, c->arena + (CUdeviceptr)off, n, c->s), NULL);
        (void)CU(wait_stream(c, c->s), NULL);
        memcpy(t, c->stage, n);
        t += n;
        off += (int64_t)n;
        bytes -= (int64_t)n;
    }
}

static bool launch(BackendCtx *c, CUfunction f, const CgCudaFn *g, void **argv, Diag *d)
{
    return CU(kc_cu.cuLaunchKernel(f, (unsigned)g->blocks, 1, 1, (unsigned)g->threads, 1, 1, 0, c->s,
                                argv, NULL),
              d);
}

static bool cast_bf16(BackendCtx *c, CUdeviceptr x, CUdeviceptr y, int64_t n, Diag *d)
{
    CgCudaFn g = {.threads = 256};
    int64_t blocks = (n + 255) / 256;
    g.blocks = blocks < 1 ? 1 : blocks > (1 << 20) ? (1 << 20) : blocks;
    void *argv[] = {&x, &y, &n};
    return launch(c, c->cast_fn, &g, argv, d);
}

/* The cast group due before the GEMM (weights into their copies), the casts
 * the GEMM's form asks for (f32 operands into scratch as bf16; the bias
 * into its bf16 copy), then the GEMM. */
static bool run_gemm(BackendCtx *c, const CgStep *st, const CuStep *cs, Diag *d)
{
    const CgGemm *m = &st->gemm;
    if (cs->cast_jobs) {
        CgCudaFn g = {.threads = 256};
        g.blocks = cs->cast_nchunk < 1 ? 1 : cs->cast_nchunk > (1 << 20) ? (1 << 20)
                                                                         : cs->cast_nchunk;
        CUdeviceptr jobs = cs->cast_jobs;
        int njob = cs->cast_njob;
        int64_t nchunk = cs->cast_nchunk;
        void *argv[] = {&jobs, &njob, &nchunk};
        if (!launch(c, c->cast_multi_fn, &g, argv, d))
            return false;
    }
    if (cs->cast_a && !cast_bf16(c, dptr(c, m->a), cs->a, numel(c->p->g, m->a), d))
        return false;
    if (cs->cast_b && !cast_bf16(c, dptr(c, m->b), cs->b, numel(c->p->g, m->b), d))
        return false;
    if (cs->bias16 && !cast_bf16(c, dptr(c, m->bias), cs->bias16, m->N, d))
        return false;
    return kc_lt_run(c->lt, cs->gemm, m, cs->a, cs->b, cs->c, c->s, d);
}

static bool enqueue(BackendCtx *c, int s, Diag *d)
{
    const CgStep *st = &c->p->steps.v[s];
    const CuStep *cs = &c->st[s];
    nvtxRangePushA(cs->label);
    bool ok = true;
    switch (st->kind) {
    case CG_STEP_KERNEL:
        for (int f = 0; f < cs->nfn && ok && !c->skip[s]; f++)
            ok = launch(c, cs->fn[f], &cs->geo[f], cs->argv[f], d);
        break;
    case CG_STEP_GEMM:
        ok = run_gemm(c, st, cs, d);
        break;
    case CG_STEP_COPY: {
        const CgCudaCopy *cp = &c->q->copy[s]; /* in the device arena's offsets */
        if (cp->dst != cp->src && cp->bytes > 0) {
            int64_t lo = cp->dst < cp->src ? cp->dst : cp->src;
            int64_t hi = cp->dst < cp->src ? cp->src : cp->dst;
            if (hi - lo < cp->bytes)
                kc_fatal("copy step %d: overlapping regions [%lld,+%lld) and [%lld,+%lld)", s,
                      (long long)cp->src, (long long)cp->bytes, (long long)cp->dst,
                      (long long)cp->bytes);
            ok = CU(kc_cu.cuMemcpyDtoDAsync(c->arena + (CUdeviceptr)cp->dst,
                                         c->arena + (CUdeviceptr)cp->src, (size_t)cp->bytes, c->s),
                    d);
        }
        break;
    }
    case CG_STEP_ALLREDUCE_START:
    case CG_STEP_ALLREDUCE_WAIT:
        break; /* the executor runs these (through cuda_allreduce_*); a wait it
                  carries into the next run comes here for its events only */
    case CG_STEP_SHARD_PACK:
        ok = kc_shard_pack(c->nccl, s, d);
        break;
    case CG_STEP_TP:
        break; /* the executor hands these to cuda_tp_run */
    }
    nvtxRangePop();
    return ok;
}

/* Step 0 sets {seed, step} (read by random kernels from device memory);
 * with a CUDA graph the first run is a plain warm-up (first launches and
 * GEMMs outside any capture), the second is captured and every later run
 * replays it at step 0, the other steps being part of the graph. */
static bool cuda_run_step(BackendCtx *c, int s, uint64_t seed, int64_t step, Diag *d)
{
    int last = c->p->steps.n - 1;
    if (!CU(kc_cu.cuCtxSetCurrent(c->ctx), d))
        return false;
    if (s == 0) {
        if (!CU(wait_event(c, c->rs_done), d))
            return false;
        if (!run_begins(c, d))
            return false;
        c->rs_host[0] = seed;
        c->rs_host[1] = (uint64_t)step;
        if (!CU(kc_cu.cuMemcpyHtoDAsync(c->rs, c->rs_host, 2 * sizeof(uint64_t), c->s), d) ||
            !CU(kc_cu.cuEventRecord(c->rs_done, c->s), d))
            return false;
        if (c->gexec) {
            nvtxRangePushA("kiln step (CUDA graph)");
            bool ok = CU(kc_cu.cuGraphLaunch(c->gexec, c->s), d);
            nvtxRangePop();
            ok = ok && CU(kc_cu.cuEventRecord(c->ev_end, c->s), d);
            c->ran = ok;
            c->replaying = last > 0;
            return ok;
        }
        if (c->graph_on && c->warm) {
            if (!CU(kc_cu.cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), d))
                return false;
            c->capturing = true;
        }
    }
    if (c->replaying) {
        if (s == last)
            c->replaying = false;
        return true;
    }
    if (!enqueue(c, s, d))
        return false;
    if (s == last && c->capturing) {
        c->capturing = false;
        if (!CU(kc_cu.cuStreamEndCapture(c->s, &c->graph), d) ||
            !CU(kc_cu.cuGraphInstantiate(&c->gexec, c->graph, 0), d) ||
            !CU(kc_cu.cuGraphLaunch(c->gexec, c->s), d))
            return false;
        if (c->verbose)
            fprintf(stderr, "kiln: cuda: step captured into a CUDA graph (%d plan steps)\n",
                    c->p->steps.n);
    }
    if (s == last)
        c->warm = true;
    return step_done(c, s, d);
}

static void cuda_sync(BackendCtx *c)
{
    kc_cu.cuCtxSetCurrent(c->ctx);
    (void)CU(wait_stream(c, c->s), NULL);
}

/* ---- device timing and collectives (BackendExt) ------------------------------
 * A run records ev_begin on the compute stream before its first plan step
 * and ev_end after its last (after the graph launch when a CUDA graph
 * replays); with --profile also ev_step[s] after every plan step, outside
 * capture (a profiled run never captures). The all-reduce steps go to
 * cuda_nccl.c. */

static bool create_timing(BackendCtx *c, bool profile, Diag *d)
{
    if (!CU(kc_cu.cuEventCreate(&c->ev_begin, CU_EVENT_DEFAULT), d) ||
        !CU(kc_cu.cuEventCreate(&c->ev_end, CU_EVENT_DEFAULT), d))
        return false;
    if (!profile)
        return true;
    c->ev_step = kc_zalloc(sizeof(CUevent) * (size_t)(c->p->steps.n + 1));
    for (int s = 0; s < c->p->steps.n; s++)
        if (!CU(kc_cu.cuEventCreate(&c->ev_step[s], CU_EVENT_DEFAULT), d))
            return false;
    return true;
}

/* Frees the collectives and the timing events (the context is current). */
static void destroy_timing(BackendCtx *c)
{
    kc_comm_also(c->nccl, NULL);
    kc_comm_also(c->tpk, NULL);
    kc_comm_close(c->nccl);
    c->nccl = NULL;
    kc_comm_close(c->tpk);
    c->tpk = NULL;
    for (int s = 0; c->ev_step && s < c->p->steps.n; s++)
        if (c->ev_step[s])
            kc_cu.cuEventDestroy(c->ev_step[s]);
    free(c->ev_step);
    c->ev_step = NULL;
    if (c->ev_begin)
        kc_cu.cuEventDestroy(c->ev_begin);
    if (c->ev_end)
        kc_cu.cuEventDestroy(c->ev_end);
}

static bool run_begins(BackendCtx *c, Diag *d)
{
    c->ran = false;
    c->host_begin = kc_now();
    kc_comm_run_begins(c->nccl);
    kc_comm_run_begins(c->tpk);
    return CU(kc_cu.cuEventRecord(c->ev_begin, c->s), d);
}

/* After plan step s was enqueued (not while capturing). */
static bool step_done(BackendCtx *c, int s, Diag *d)
{
    if (c->ev_step && !c->capturing && !CU(kc_cu.cuEventRecord(c->ev_step[s], c->s), d))
        return false;
    if (s == c->p->steps.n - 1) {
        /* TP collectives that no step waited for (cuda_tp_wait) end the run */
        if (!kc_tp_join(c->tpk, d) || !CU(kc_cu.cuEventRecord(c->ev_end, c->s), d))
            return false;
        c->ran = true;
    }
    return true;
}

static double cuda_run_seconds(BackendCtx *c)
{
    float ms = 0;
    kc_cu.cuCtxSetCurrent(c->ctx);
    if (!c->ran || wait_event(c, c->ev_end) != CUDA_SUCCESS ||
        kc_cu.cuEventElapsedTime(&ms, c->ev_begin, c->ev_end) != CUDA_SUCCESS)
        return -1;
    return 1e-3 * (double)ms;
}

static bool cuda_step_times(BackendCtx *c, double *start, double *end)
{
    int n = c->p->steps.n;
    kc_cu.cuCtxSetCurrent(c->ctx);
    if (!c->ev_step || !c->ran || n < 1 ||
        wait_event(c, c->ev_step[n - 1]) != CUDA_SUCCESS)
        return false;
    for (int s = 0; s < n; s++) {
        float ms = 0;
        if (kc_cu.cuEventElapsedTime(&ms, c->ev_begin, c->ev_step[s]) != CUDA_SUCCESS)
            return false;
        end[s] = 1e-3 * (double)ms;
        start[s] = s ? end[s - 1] : 0;
    }
    return true;
}

/* NCCL on the communication stream. A CUDA graph is not captured with
 * collectives in the step (their events and the second stream are not part
 * of the capture). */
static bool cuda_comm_setup(BackendCtx *c, const RtCommGroup *g, Diag *d)
{
    if (!CU(kc_cu.cuCtxSetCurrent(c->ctx), d))
        return false;
    c->nccl = kc_comm_open(g, c->p, c->q->storage, c->q->mem->offset, c->arena, c->ctx, c->s,
                           c->comm, d);
    if (!c->nccl)
        return false;
    kc_comm_also(c->nccl, c->tpk);
    kc_comm_also(c->tpk, c->nccl);
    if (c->graph_on && c->verbose)
        fprintf(stderr, "kiln: cuda: no CUDA graph: the step has NCCL all-reduces\n");
    c->graph_on = false;
    bool sharded = false;
    for (int s = 0; s < c->p->steps.n; s++)
        sharded |= c->p->steps.v[s].kind == CG_STEP_SHARD_PACK;
    if (c->verbose)
        fprintf(stderr, "kiln: cuda: NCCL all-reduces, rank %d of %d%s\n", g->rank, g->size,
                sharded ? " (zero=1: reduce-scatters as grouped ncclReduce, all-gathers as "
                          "grouped ncclBroadcast)"
                        : "");
    return true;
}

static bool cuda_allreduce_start(BackendCtx *c, int s, Diag *d)
{
    return CU(kc_cu.cuCtxSetCurrent(c->ctx), d) && kc_allreduce_start(c->nccl, s, d) &&
           step_done(c, s, d);
}

static bool cuda_allreduce_wait(BackendCtx *c, int s, Diag *d)
{
    return CU(kc_cu.cuCtxSetCurrent(c->ctx), d) && kc_allreduce_wait(c->nccl, s, d) &&
           step_done(c, s, d);
}

/* Tensor parallelism: the TP group's own NCCL communicator on the same
 * communication stream (cuda_nccl.c, kc_tp_open); no CUDA graph, as with
 * all-reduces. */
static bool cuda_tp_setup(BackendCtx *c, const RtCommGroup *g, Diag *d)
{
    if (!CU(kc_cu.cuCtxSetCurrent(c->ctx), d))
        return false;
    c->tpk = kc_tp_open(g, c->p, c->q->storage, c->q->mem->offset, c->arena, c->ctx, c->s,
                        c->comm, d);
    if (!c->tpk)
        return false;
    kc_comm_also(c->nccl, c->tpk);
    kc_comm_also(c->tpk, c->nccl);
    if (c->graph_on && c->verbose)
        fprintf(stderr, "kiln: cuda: no CUDA graph: the step has NCCL TP collectives\n");
    c->graph_on = false;
    if (c->verbose)
        fprintf(stderr, "kiln: cuda: NCCL TP collectives, TP rank %d of %d%s\n", g->rank, g->size,
                kc_tp_shared(c->tpk) ? " (the process's TP communicator, shared)" : "");
    return true;
}

/* The compute stream goes on past a TP step; the executor's cuda_tp_wait
 * puts it behind the collective before the first step that reads the
 * result (cuda_tp_operand_copy: the collective reads a copy of an operand whose
 * bytes a step before that reuses; the placement is from the plan's
 * memory plan, so the wait stays right here when the device arena is
 * planned apart: bf16 storage, CgCudaProgram.mem). */
static bool cuda_tp_run(BackendCtx *c, int s, Diag *d)
{
    bool apart = c->q->mem != c->p->mem;
    return CU(kc_cu.cuCtxSetCurrent(c->ctx), d) && kc_tp_run(c->tpk, s, d) &&
           (!apart || kc_tp_wait(c->tpk, s, d)) && step_done(c, s, d);
}

static bool cuda_tp_wait(BackendCtx *c, int s, Diag *d)
{
    return CU(kc_cu.cuCtxSetCurrent(c->ctx), d) && kc_tp_wait(c->tpk, s, d);
}

/* Nothing to copy where the compute stream waits at once (cuda_tp_run). */
static bool cuda_tp_operand_copy(BackendCtx *c, int s, int until, Diag *d)
{
    return c->q->mem != c->p->mem ||
           (CU(kc_cu.cuCtxSetCurrent(c->ctx), d) && kc_tp_operand_copy(c->tpk, s, until, d));
}

static int cuda_tp_events(BackendCtx *c, RtCommEvent *ev, int max)
{
    return c->tpk ? kc_tp_events(c->tpk, c->ev_begin, c->host_begin, ev, max) : 0;
}

static int cuda_comm_events(BackendCtx *c, RtCommEvent *ev, int max, double *exposed_s)
{
    *exposed_s = 0;
    return c->nccl ? kc_comm_events(c->nccl, c->ev_begin, c->host_begin, ev, max, exposed_s)
                   : 0;
}

/* The arena, the bf16 weight copies kept through a step (cuda_cast.c) and
 * the partials scratch (split reductions' partials, the fused attention
 * backward's dQ accumulator). */
static int64_t cuda_arena_bytes(const BackendCtx *c)
{
    return c->q->mem->arena_bytes + c->q->cast_bytes + c->q->part_bytes;
}

static bool cuda_device_info(BackendCtx *c, RtDeviceInfo *out)
{
    int clock_khz = 0;
    Diag d;
    if (kc_cu.cuDeviceGetName(out->name, (int)sizeof out->name, c->dev) != CUDA_SUCCESS ||
        !CU(kc_cu.cuDeviceGetAttribute(&out->cc_major,
                                       CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev), &d) ||
        !CU(kc_cu.cuDeviceGetAttribute(&out->cc_minor,
                                       CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev), &d) ||
        !CU(kc_cu.cuDeviceGetAttribute(&out->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                       c->dev), &d) ||
        !CU(kc_cu.cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, c->dev), &d))
        return false;
    out->clock_hz = 1e3 * clock_khz;
    return true;
}

/* Pipeline stages: the process's transfers over the pipeline group
 * (cuda_pp.c, KcPp); the compute stream waits for each. f32 storage only
 * (host_offset stops on a tensor stored otherwise). */
static bool cuda_pp_setup(BackendCtx *c, const RtCommGroup *g, Diag *d)
{
    if (c->pp)
        return true;
    if (!(c->pp = kc_pp_open(g, c->ctx, d)))
        return false;
    if (c->graph_on && c->verbose)
        fprintf(stderr, "kiln: cuda: no CUDA graph: pipeline stages\n");
    c->graph_on = false;
    if (c->verbose)
        fprintf(stderr, "kiln: cuda: NCCL send/recv between pipeline stages, stage %d of %d\n",
                g->rank, g->size);
    return true;
}

static bool cuda_pp_xfer(BackendCtx *c, bool send, int peer, int64_t off, int64_t bytes,
                         Diag *d)
{
    if (!c->pp) {
        kc_dmsg(d, "pipeline transfer before pp_setup");
        return false;
    }
    CUdeviceptr p = off < 0 ? 0 : c->arena + (CUdeviceptr)host_offset(c, off, bytes);
    return kc_pp_xfer(c->pp, c->s, send, peer, p, (size_t)bytes, d);
}

static const BackendExt backend_cuda_ext = {
    cuda_comm_setup,  cuda_allreduce_start, cuda_allreduce_wait,
    cuda_comm_events, cuda_run_seconds,     cuda_step_times,
    cuda_arena_bytes, cuda_device_info, cuda_tp_setup,
    cuda_tp_run,      cuda_tp_events,   cuda_tp_wait,     cuda_tp_operand_copy,
    cuda_pp_setup,    cuda_pp_xfer,
};

static const Backend backend_cuda = {
    "cuda", cuda_create, cuda_destroy, cuda_write, cuda_read, cuda_run_step, cuda_sync,
    &backend_cuda_ext, false, NULL,
};

const Backend *kiln_cuda_backend(const RtCudaHost *h)
{
    if (!h || h->abi != RT_CUDA_ABI)
        return NULL;
    host = h;
    return &backend_cuda;
}
