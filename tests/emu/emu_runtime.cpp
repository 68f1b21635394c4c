/*
 * emu_runtime.cpp - the scheduler of the emulated CUDA device, compiled into
 * every kernel module (see cuda_emu.h for the model and emu_abi.h for the
 * entry point). One CUDA thread = one user-level context with its own
 * stack (a hand-written switch of the callee-saved registers on x86-64,
 * ucontext elsewhere); the threads of a block run one at a time on the
 * calling OS thread and switch only at barriers and warp operations. Stack
 * switches are announced to AddressSanitizer (its fiber interface).
 */
#include "cuda_emu.h"
#include "emu_abi.h"

#include <link.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

extern "C" {
/* AddressSanitizer's fiber and poisoning interface, present only when the
 * module is built with it. */
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size)
    __attribute__((weak));
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old) __attribute__((weak));
void __asan_poison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
void __asan_unpoison_memory_region(void const volatile *addr, size_t size)
    __attribute__((weak));
/* Defined in the unit the launcher generates for each module. */
unsigned char *kiln_emu_dyn_smem_base(void);

KilnEmuThread *kiln_emu_cur;
uint3 kiln_emu_block_idx;
dim3 kiln_emu_block_dim, kiln_emu_grid_dim;
int kiln_emu_launch(const KilnEmuLaunch *l, char *err, unsigned long errlen);
}

#if defined(__x86_64__)
/* Saves the callee-saved registers, MXCSR and the x87 control word on the
 * current stack, stores the stack pointer in *from and resumes the context
 * whose stack pointer is to. */
extern "C" void kiln_emu_switch(void **from, void *to);
__asm__(".pushsection .text\n"
        ".globl kiln_emu_switch\n"
        ".hidden kiln_emu_switch\n"
        ".type kiln_emu_switch,@function\n"
        "kiln_emu_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size kiln_emu_switch, .-kiln_emu_switch\n"
        ".popsection\n");
struct Ctx {
    void *sp;
};
static void ctx_switch(Ctx *from, Ctx *to) { kiln_emu_switch(&from->sp, to->sp); }
/* A fresh context that starts in entry() on the given stack. */
static void ctx_make(Ctx *c, unsigned char *stack, size_t size, void (*entry)())
{
    uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
    unsigned long long *p = (unsigned long long *)top;
    *--p = 0;                    /* entry's return address (never used) */
    *--p = (uintptr_t)entry;     /* kiln_emu_switch's ret */
    for (int i = 0; i < 6; i++)  /* rbp rbx r12..r15 */
        *--p = 0;
    *--p = 0x037f00001f80ull;    /* MXCSR default, x87 control word default */
    c->sp = p;
}
#else
struct Ctx {
    ucontext_t uc;
};
static void ctx_switch(Ctx *from, Ctx *to) { swapcontext(&from->uc, &to->uc); }
static void ctx_make(Ctx *c, unsigned char *stack, size_t size, void (*entry)())
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
#endif

namespace {

enum State { RUNNABLE, AT_BARRIER, AT_WARP, DONE };

const size_t STACK_BYTES = 256 * 1024;

struct Fiber {
    KilnEmuThread t; /* first: kiln_emu_cur points here */
    int linear, lane, warp;
    State state;
    Ctx ctx;
    unsigned char *stack;
    bool abandoned; /* started and not returned */
    void *fake_stack;
    /* barrier / warp operation the thread waits at */
    const char *file;
    int line;
    int wkind, warg, wwidth;
    unsigned int wmask;
    unsigned long long wval, wres;
};

struct Sched {
    const KilnEmuLaunch *l;
    Fiber *f;
    int nthreads, nfibers_alloc;
    int *perm;
    int nlive, nbarrier;
    const Fiber *bar; /* first thread at the current barrier */
    Fiber *straggler; /* see new_order */
    Ctx main_ctx;
    const void *main_bottom;
    size_t main_size;
    Fiber *running;
    bool failed;
    char *err;
    unsigned long errlen;
    unsigned long long rng;
    /* the vote of the current barrier (see barrier()) */
    int vor, vand, vcount;
    /* barriers and votes completed in this launch (KilnEmuStats) */
    unsigned long long nbarriers, nvotes;
};

Sched S;

/* The fibers live as long as the module: freed when it is unloaded
 * (dlclose), so a test that loads many modules leaks nothing. */
__attribute__((destructor)) void free_fibers()
{
    for (int i = 0; i < S.nfibers_alloc; i++)
        munmap(S.f[i].stack, STACK_BYTES);
    free(S.f);
    free(S.perm);
    S.f = nullptr;
    S.perm = nullptr;
    S.nfibers_alloc = 0;
}

unsigned long long next_rand()
{
    unsigned long long z = (S.rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A new order of the threads, and (random order) a new straggler: one
 * thread that runs only when no other can, until the next barrier, so that
 * a slow writer or a slow reader of shared memory shows up. */
void new_order()
{
    int n = S.nthreads;
    S.straggler = S.l->order == KILN_EMU_ORDER_RANDOM
                      ? &S.f[next_rand() % (unsigned long long)n]
                      : nullptr;
    for (int i = 0; i < n; i++)
        S.perm[i] = S.l->order == KILN_EMU_ORDER_REVERSE ? n - 1 - i : i;
    if (S.l->order == KILN_EMU_ORDER_RANDOM)
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(next_rand() % (unsigned long long)(i + 1));
            int t = S.perm[i];
            S.perm[i] = S.perm[j];
            S.perm[j] = t;
        }
}

const char *bar_name(int kind)
{
    return kind == KILN_EMU_BAR_OR      ? "__syncthreads_or()"
           : kind == KILN_EMU_BAR_AND   ? "__syncthreads_and()"
           : kind == KILN_EMU_BAR_COUNT ? "__syncthreads_count()"
                                        : "__syncthreads()";
}

void where(char *buf, size_t n, const Fiber *f)
{
    snprintf(buf, n, "thread (%u,%u,%u) of block (%u,%u,%u)", f->t.tid.x, f->t.tid.y, f->t.tid.z,
             kiln_emu_block_idx.x, kiln_emu_block_idx.y, kiln_emu_block_idx.z);
}

void to_main(Fiber *f, bool finished)
{
    if (__sanitizer_start_switch_fiber)
        __sanitizer_start_switch_fiber(finished ? nullptr : &f->fake_stack, S.main_bottom,
                                       S.main_size);
    ctx_switch(&f->ctx, &S.main_ctx);
    if (__sanitizer_finish_switch_fiber)
        __sanitizer_finish_switch_fiber(f->fake_stack, &S.main_bottom, &S.main_size);
    kiln_emu_cur = &f->t;
}

/* Records the first error, "thread (x,y,z) of block (x,y,z): ...", and
 * leaves the thread for good. */
__attribute__((format(printf, 2, 3))) void fail(Fiber *f, const char *fmt, ...)
{
    if (!S.failed) {
        S.failed = true;
        where(S.err, S.errlen, f);
        size_t n = strlen(S.err);
        if (n + 2 < S.errlen) {
            memcpy(S.err + n, ": ", 3);
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(S.err + n + 2, S.errlen - n - 2, fmt, ap);
            va_end(ap);
        }
    }
    for (;;)
        to_main(f, false);
}

void fiber_entry()
{
    Fiber *f = S.running;
    if (__sanitizer_finish_switch_fiber)
        __sanitizer_finish_switch_fiber(nullptr, &S.main_bottom, &S.main_size);
    kiln_emu_cur = &f->t;
    S.l->body(S.l->ctx);
    f->state = DONE;
    f->abandoned = false;
    S.nlive--;
    if (S.nbarrier > 0)
        for (int i = 0; i < S.nthreads; i++)
            if (S.f[i].state == AT_BARRIER)
                fail(f, "returned while thread (%u,%u,%u) waits at %s (%s:%d)", S.f[i].t.tid.x,
                     S.f[i].t.tid.y, S.f[i].t.tid.z, bar_name(S.f[i].wkind), S.f[i].file,
                     S.f[i].line);
    int w0 = f->warp * 32, w1 = w0 + 32 < S.nthreads ? w0 + 32 : S.nthreads;
    for (int i = w0; i < w1; i++)
        if (S.f[i].state == AT_WARP && ((S.f[i].wmask >> f->lane) & 1u))
            fail(f, "returned while lane %d waits for it in a warp operation (%s:%d)",
                 S.f[i].lane, S.f[i].file, S.f[i].line);
    to_main(f, true);
    abort(); /* a finished thread is never resumed */
}

Fiber *self()
{
    return reinterpret_cast<Fiber *>(kiln_emu_cur);
}

} /* namespace */

/* __trap(): a launch error; the thread never runs again. */
extern "C" void kiln_emu_trap(const char *file, int line)
{
    fail(self(), "__trap() at %s:%d", file, line);
}

/* The block-wide barrier, kind 0 (__syncthreads) or a vote
 * (KILN_EMU_BAR_*) of pred: every live thread must wait at the same one
 * (kind, file and line); the last to arrive releases all and hands each
 * the vote's result. */
static int barrier(int kind, int pred, const char *file, int line)
{
    Fiber *f = self();
    f->state = AT_BARRIER;
    f->file = file;
    f->line = line;
    f->wkind = kind;
    if (S.nbarrier == 0) {
        S.bar = f;
        S.vor = 0;
        S.vand = 1;
        S.vcount = 0;
    } else {
        const Fiber *o = S.bar; /* the first thread waiting at this barrier */
        if (o->line != line || o->wkind != kind || (o->file != file && strcmp(o->file, file) != 0))
            fail(f, "waits at %s at %s:%d while thread (%u,%u,%u) waits at %s at %s:%d",
                 bar_name(kind), file, line, o->t.tid.x, o->t.tid.y, o->t.tid.z,
                 bar_name(o->wkind), o->file, o->line);
    }
    S.vor |= pred != 0;
    S.vand &= pred != 0;
    S.vcount += pred != 0;
    S.nbarrier++;
    if (S.nbarrier == S.nlive) {
        int res = kind == KILN_EMU_BAR_OR    ? S.vor
                  : kind == KILN_EMU_BAR_AND ? S.vand
                                             : S.vcount;
        for (int i = 0; i < S.nthreads; i++)
            if (S.f[i].state == AT_BARRIER) {
                S.f[i].state = RUNNABLE;
                S.f[i].wres = (unsigned long long)res;
            }
        S.nbarrier = 0;
        if (kind)
            S.nvotes++;
        else
            S.nbarriers++;
        new_order();
    }
    to_main(f, false);
    return (int)f->wres;
}

extern "C" void kiln_emu_syncthreads(const char *file, int line) { barrier(0, 0, file, line); }

extern "C" int kiln_emu_syncthreads_vote(int kind, int pred, const char *file, int line)
{
    return barrier(kind, pred, file, line);
}

static const char *warp_op_name(int kind)
{
    static const char *const names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                        "__shfl_xor_sync", "__ballot_sync", "__any_sync",
                                        "__all_sync", "__syncwarp"};
    return kind >= 0 && kind < 8 ? names[kind] : "?";
}

/* All lanes of mask wait at the same operation: computes every result. */
static void resolve_warp(Fiber *f)
{
    Fiber *base = &S.f[f->warp * 32];
    unsigned int mask = f->wmask;
    unsigned long long vote = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l) & 1u)
            vote |= (base[l].wval ? 1ull : 0ull) << l;
    for (int l = 0; l < 32; l++) {
        if (!((mask >> l) & 1u))
            continue;
        Fiber *g = &base[l];
        int w = g->wwidth, seg = l & ~(w - 1), src = l;
        switch (g->wkind) {
        case KILN_EMU_SHFL_IDX: src = seg + (g->warg & (w - 1)); break;
        case KILN_EMU_SHFL_UP: src = l - g->warg < seg ? l : l - g->warg; break;
        case KILN_EMU_SHFL_DOWN: src = l + g->warg >= seg + w ? l : l + g->warg; break;
        case KILN_EMU_SHFL_XOR: src = (l ^ g->warg) >= seg + w ? l : (l ^ g->warg); break;
        default: break;
        }
        switch (g->wkind) {
        case KILN_EMU_BALLOT: g->wres = vote; break;
        case KILN_EMU_ANY: g->wres = vote != 0; break;
        case KILN_EMU_ALL: g->wres = vote == (unsigned long long)mask; break;
        case KILN_EMU_SYNCWARP: g->wres = 0; break;
        default:
            if (src < 0 || src > 31 || !((mask >> src) & 1u))
                fail(f, "lane %d: %s (%s:%d) reads lane %d, which is not in the mask 0x%08x", l,
                     warp_op_name(g->wkind), g->file, g->line, src, mask);
            g->wres = base[src].wval;
        }
        g->state = RUNNABLE;
    }
}

extern "C" unsigned long long kiln_emu_warp(int kind, unsigned int mask, unsigned long long v,
                                            int arg, int width, const char *file, int line)
{
    Fiber *f = self();
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail(f, "%s (%s:%d) with width %d (expected a power of two up to 32)",
             warp_op_name(kind), file, line, width);
    if (!((mask >> f->lane) & 1u))
        fail(f, "%s (%s:%d) with mask 0x%08x, which does not name the calling lane %d",
             warp_op_name(kind), file, line, mask, f->lane);
    f->state = AT_WARP;
    f->wkind = kind;
    f->wmask = mask;
    f->wval = v;
    f->warg = arg;
    f->wwidth = width;
    f->file = file;
    f->line = line;
    bool ready = true;
    for (int l = 0; l < 32; l++) {
        if (!((mask >> l) & 1u))
            continue;
        int t = f->warp * 32 + l;
        if (t >= S.nthreads)
            fail(f, "%s (%s:%d) with mask 0x%08x names lane %d, which does not exist (the "
                    "block has %d threads)",
                 warp_op_name(kind), file, line, mask, l, S.nthreads);
        Fiber *g = &S.f[t];
        if (g->state == DONE)
            fail(f, "%s (%s:%d) with mask 0x%08x names lane %d, which has returned",
                 warp_op_name(kind), file, line, mask, l);
        if (g->state != AT_WARP || g->wmask != mask) {
            ready = false;
            continue;
        }
        if (g->wkind != kind || g->wwidth != width || g->line != line ||
            (g->file != file && strcmp(g->file, file) != 0))
            fail(f, "lanes %d and %d of a warp meet at different warp operations: %s at "
                    "%s:%d and %s at %s:%d",
                 f->lane, l, warp_op_name(kind), file, line, warp_op_name(g->wkind), g->file,
                 g->line);
    }
    if (ready)
        resolve_warp(f);
    to_main(f, false);
    return f->wres;
}

namespace {

/* The calling thread's TLS block of this module: the static __shared__
 * variables and the dynamic shared array (the runtime has no other
 * thread_local). */
thread_local unsigned char tls_anchor;

struct TlsFind {
    unsigned char *base;
    size_t size;
};

int find_tls(struct dl_phdr_info *info, size_t, void *data)
{
    TlsFind *t = static_cast<TlsFind *>(data);
    if (!info->dlpi_tls_data)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS) {
            unsigned char *b = static_cast<unsigned char *>(info->dlpi_tls_data);
            size_t n = info->dlpi_phdr[i].p_memsz;
            if (&tls_anchor >= b && &tls_anchor < b + n) {
                t->base = b;
                t->size = n;
                return 1;
            }
        }
    return 0;
}

__attribute__((no_sanitize_address, noinline)) void fill_nan(unsigned char *p, size_t n)
{
    volatile unsigned char *q = p;
    static const unsigned char pat[4] = {0xc0, 0x7f, 0xc0, 0x7f}; /* 0x7fc07fc0 */
    for (size_t i = 0; i < n; i++)
        q[i] = pat[((uintptr_t)(p + i)) & 3];
}

bool run_block()
{
    int n = S.nthreads;
    S.nlive = n;
    S.nbarrier = 0;
    for (int i = 0; i < n; i++) {
        Fiber *f = &S.f[i];
        unsigned bx = kiln_emu_block_dim.x, by = kiln_emu_block_dim.y;
        f->t.tid = uint3{(unsigned)i % bx, (unsigned)i / bx % by, (unsigned)i / (bx * by)};
        f->linear = i;
        f->lane = i % 32;
        f->warp = i / 32;
        f->state = RUNNABLE;
        f->fake_stack = nullptr;
        f->file = "";
        f->line = 0;
        /* a thread that returned left its stack's shadow clean except for
         * the frames of fiber_entry, which never return; one abandoned
         * after an error may have left any of it poisoned */
        if (__asan_unpoison_memory_region) {
            size_t n = f->abandoned ? STACK_BYTES : 16384;
            __asan_unpoison_memory_region(f->stack + STACK_BYTES - n, n);
        }
        f->abandoned = true;
        ctx_make(&f->ctx, f->stack, STACK_BYTES, fiber_entry);
    }
    new_order();
    for (;;) {
        bool ran = false;
        for (int j = 0; j <= n; j++) {
            /* the straggler runs only when no other thread can */
            Fiber *f = j < n ? &S.f[S.perm[j]] : S.straggler;
            if (!f || f->state != RUNNABLE || (j < n && f == S.straggler) || (j == n && ran))
                continue;
            ran = true;
            S.running = f;
            void *fake = nullptr;
            if (__sanitizer_start_switch_fiber)
                __sanitizer_start_switch_fiber(&fake, f->stack, STACK_BYTES);
            ctx_switch(&S.main_ctx, &f->ctx);
            if (__sanitizer_finish_switch_fiber)
                __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
            if (S.failed)
                return false;
        }
        if (S.nlive == 0)
            return true;
        if (!ran) {
            /* nothing can run: describe the first stuck thread of each kind */
            for (int i = 0; i < n; i++) {
                Fiber *f = &S.f[i];
                char w[96];
                where(w, sizeof w, f);
                if (f->state == AT_BARRIER) {
                    snprintf(S.err, S.errlen,
                             "deadlock: %s waits at %s (%s:%d), which %d other "
                             "thread(s) never reach",
                             w, bar_name(f->wkind), f->file, f->line, S.nlive - S.nbarrier);
                    break;
                }
                if (f->state == AT_WARP) {
                    snprintf(S.err, S.errlen,
                             "deadlock: %s waits at %s (%s:%d) with mask 0x%08x for lanes that "
                             "never reach it",
                             w, warp_op_name(f->wkind), f->file, f->line, f->wmask);
                    break;
                }
            }
            return false;
        }
    }
}

} /* namespace */

extern "C" int kiln_emu_launch(const KilnEmuLaunch *l, char *err, unsigned long errlen)
{
    S.l = l;
    S.err = err;
    S.errlen = errlen;
    S.failed = false;
    S.rng = l->seed;
    S.nbarriers = S.nvotes = 0;
    err[0] = 0;
    unsigned long long nt = (unsigned long long)l->block[0] * l->block[1] * l->block[2];
    if (nt == 0 || nt > 1024 || l->block[2] > 64 || !l->grid[0] || !l->grid[1] || !l->grid[2] ||
        l->grid[1] > 65535 || l->grid[2] > 65535) {
        snprintf(err, errlen, "invalid launch configuration: grid (%u,%u,%u), block (%u,%u,%u)",
                 l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2]);
        return -1;
    }
    if (l->shmem > KILN_EMU_MAX_DYN_SMEM) {
        snprintf(err, errlen, "dynamic shared memory of %llu bytes (at most %d)", l->shmem,
                 KILN_EMU_MAX_DYN_SMEM);
        return -1;
    }
    if ((int)nt > S.nfibers_alloc) {
        for (int i = 0; i < S.nfibers_alloc; i++)
            munmap(S.f[i].stack, STACK_BYTES);
        free(S.f);
        free(S.perm);
        S.f = static_cast<Fiber *>(calloc(nt, sizeof(Fiber)));
        S.perm = static_cast<int *>(calloc(nt, sizeof(int)));
        for (unsigned long long i = 0; i < nt; i++) {
            void *p = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) {
                snprintf(err, errlen, "cannot map thread stacks");
                S.nfibers_alloc = (int)i;
                return -1;
            }
            S.f[i].stack = static_cast<unsigned char *>(p);
            S.f[i].abandoned = true; /* the mapping may reuse poisoned shadow */
        }
        S.nfibers_alloc = (int)nt;
    }
    S.nthreads = (int)nt;
    kiln_emu_block_dim = dim3(l->block[0], l->block[1], l->block[2]);
    kiln_emu_grid_dim = dim3(l->grid[0], l->grid[1], l->grid[2]);

    tls_anchor = 1; /* allocates this thread's TLS block of the module */
    TlsFind tls = {nullptr, 0};
    dl_iterate_phdr(find_tls, &tls);
    if (!tls.base) {
        snprintf(err, errlen, "cannot find the module's shared memory (TLS block)");
        return -1;
    }
    unsigned char *dyn = kiln_emu_dyn_smem_base();
    size_t dyn_bytes = (l->shmem + 7) / 8 * 8;
    if (dyn < tls.base || dyn + KILN_EMU_MAX_DYN_SMEM > tls.base + tls.size) {
        snprintf(err, errlen, "the dynamic shared memory is not in the module's TLS block");
        return -1;
    }
    /* the dynamic array past the launch's size is poisoned for the launch */
    if (__asan_unpoison_memory_region)
        __asan_unpoison_memory_region(tls.base, tls.size);
    if (__asan_poison_memory_region)
        __asan_poison_memory_region(dyn + dyn_bytes, KILN_EMU_MAX_DYN_SMEM - dyn_bytes);
    unsigned char *dyn_end = dyn + KILN_EMU_MAX_DYN_SMEM, *tls_end = tls.base + tls.size;
    int rc = 0;
    for (unsigned z = 0; z < l->grid[2] && !rc; z++)
        for (unsigned y = 0; y < l->grid[1] && !rc; y++)
            for (unsigned x = 0; x < l->grid[0] && !rc; x++) {
                kiln_emu_block_idx = uint3{x, y, z};
                /* static shared variables, then the launch's dynamic bytes */
                fill_nan(tls.base, (size_t)(dyn - tls.base));
                fill_nan(dyn_end, (size_t)(tls_end - dyn_end));
                fill_nan(dyn, dyn_bytes);
                if (!run_block())
                    rc = -1;
            }
    if (__asan_unpoison_memory_region)
        __asan_unpoison_memory_region(tls.base, tls.size);
    kiln_emu_cur = nullptr;
    if (l->stats) {
        l->stats->barriers = S.nbarriers;
        l->stats->votes = S.nvotes;
    }
    return rc;
}
