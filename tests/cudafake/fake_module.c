/* fake_module.c - the fake driver's modules and kernels (part of
 * libcuda.so.1, beside fake_cuda.c, which queues and orders the launches).
 *
 * Contract: cuModuleLoadData takes a cubin made by the fake NVRTC
 * (fake_nvrtc.c): the real sm_90 ELF, then FAKE_SRC_MAGIC and the CUDA C
 * source. The kernel names are the ELF's global function symbols; the
 * source is compiled by the host C++ compiler under tests/emu/cuda_emu.h
 * (emu_compile, cached under $KILN_CACHE_DIR/emu). cuModuleGetFunction
 * finds names that are in both and knows each parameter's size and whether
 * it is a pointer (Func, fake_ops.h). fake_run_kernel runs a queued launch
 * on the emulator and records as its writes the bytes that changed in the
 * allocations its pointer arguments point into (the race detector's input,
 * fake_race.c). A module is never freed: graphs may still hold its
 * functions. */
#include "fake_ops.h"

#include "emu.h"

#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_SRC_MAGIC "KILN-FAKE-CUDA-SOURCE:" /* fake_nvrtc.c's */

struct FModule {
    EmuModule *emu;
    char **names;
    int nnames;
};

/* ---- kernels -------------------------------------------------------------- */

/* The ranges of alloc a that differ from snapshot s: writes of o. */
static void diff_writes(FOp *o, const Alloc *a, const unsigned char *s)
{
    const unsigned char *p = (const unsigned char *)(uintptr_t)a->lo;
    uint64_t n = a->hi - a->lo, i = 0;
    while (i < n) {
        if (i + 8 <= n && memcmp(p + i, s + i, 8) == 0) {
            i += 8;
            continue;
        }
        if (p[i] == s[i]) {
            i++;
            continue;
        }
        uint64_t j = i;
        while (j < n && p[j] != s[j])
            j++;
        /* changed bytes at most 8 apart are one range (an f32 store whose
         * high byte did not change; no buffer fits in such a gap) */
        if (o->nacc && o->acc[o->nacc - 1].write && o->acc[o->nacc - 1].hi + 8 >= a->lo + i &&
            o->acc[o->nacc - 1].lo >= a->lo)
            o->acc[o->nacc - 1].hi = a->lo + j;
        else
            fake_add_acc(o, a->lo + i, a->lo + j, true);
        i = j;
    }
}

void fake_run_kernel(FOp *o)
{
    Func *f = o->f;
    /* as many as the function takes (a horizontal function: hundreds) */
    void **argv = calloc((size_t)f->nparams + 1, sizeof(void *));
    Alloc **al = calloc((size_t)f->nparams + 1, sizeof(Alloc *));
    unsigned char **snap = calloc((size_t)f->nparams + 1, sizeof(unsigned char *));
    if (!argv || !al || !snap)
        fakecu_die("out of memory");
    int nal = 0;
    size_t off = 0;
    for (int i = 0; i < f->nparams; i++) {
        argv[i] = o->argbuf + off;
        if (f->isptr[i]) {
            uint64_t p;
            memcpy(&p, o->argbuf + off, 8);
            Alloc *a = fake_find_alloc(p);
            if (!a || !a->live)
                fakecu_die("%s: argument %d (0x%llx) is no longer live device memory", o->desc,
                           i, (unsigned long long)p);
            bool seen = false;
            for (int k = 0; k < nal; k++)
                seen |= al[k] == a;
            if (!seen) {
                al[nal] = a;
                snap[nal] = malloc(a->hi - a->lo);
                if (!snap[nal])
                    fakecu_die("out of memory");
                memcpy(snap[nal], (void *)(uintptr_t)a->lo, a->hi - a->lo);
                nal++;
            }
        }
        off += (f->psize[i] + 7) / 8 * 8;
    }
    Diag d = {{0}};
    if (!emu_launch(f->m->emu, f->name, o->grid, o->block, o->shmem, argv, &d))
        fakecu_die("%s: the emulated kernel failed: %s", o->desc, d.msg);
    for (int k = 0; k < nal; k++) {
        diff_writes(o, al[k], snap[k]);
        free(snap[k]);
    }
    free(argv);
    free(al);
    free(snap);
}

/* ---- modules ------------------------------------------------------------------ */

/* The ELF's size, and its global function symbols into m; false when the
 * image is not an ELF64 cubin. */
static bool read_elf(const unsigned char *img, FModule *m, size_t *size)
{
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)img;
    if (memcmp(h->e_ident, ELFMAG, SELFMAG) != 0 || h->e_ident[EI_CLASS] != ELFCLASS64)
        return false;
    size_t end = h->e_shoff + (size_t)h->e_shnum * h->e_shentsize;
    if (h->e_phoff + (size_t)h->e_phnum * h->e_phentsize > end)
        end = h->e_phoff + (size_t)h->e_phnum * h->e_phentsize;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + h->e_shoff);
    for (int i = 0; i < h->e_shnum; i++) {
        if (sh[i].sh_type != SHT_NOBITS && sh[i].sh_offset + sh[i].sh_size > end)
            end = sh[i].sh_offset + sh[i].sh_size;
        if (sh[i].sh_type != SHT_SYMTAB)
            continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh[i].sh_offset);
        const char *str = (const char *)(img + sh[sh[i].sh_link].sh_offset);
        size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t k = 0; k < n; k++)
            if (ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC &&
                ELF64_ST_BIND(sym[k].st_info) == STB_GLOBAL && sym[k].st_shndx != SHN_UNDEF) {
                m->names = realloc(m->names, sizeof(char *) * (size_t)(m->nnames + 1));
                m->names[m->nnames++] = strdup(str + sym[k].st_name);
            }
    }
    *size = end;
    return true;
}

CUresult cuModuleLoadData(CUmodule *mod, const void *image)
{
    CUresult r = fake_in_capture("cuModuleLoadData");
    if (r)
        return r;
    FModule *m = calloc(1, sizeof *m);
    size_t n = 0;
    if (!m || !read_elf(image, m, &n))
        fakecu_die("cuModuleLoadData: the image is not an ELF64 cubin");
    const char *src = (const char *)image + n;
    size_t ml = strlen(FAKE_SRC_MAGIC);
    if (strncmp(src, FAKE_SRC_MAGIC, ml) != 0)
        fakecu_die("cuModuleLoadData: the cubin carries no CUDA C source after its ELF (made by "
                   "the real NVRTC, or cached by a run without the fakes? give the fake runs "
                   "their own KILN_CACHE_DIR)");
    static const char *const ptr_structs[] = {"kiln_bf16p", NULL};
    EmuOpts o;
    emu_opts_default(&o);
    o.sanitize = false;
    o.ptr_structs = ptr_structs;
    o.seed = fakecu_random();
    Diag d = {{0}};
    m->emu = emu_compile(src + ml, &o, &d);
    if (!m->emu)
        fakecu_die("cuModuleLoadData: the emulator cannot build the source: %s", d.msg);
    *mod = (CUmodule)m;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule mod)
{
    fake_drain();
    FModule *m = (FModule *)mod;
    (void)m; /* functions may still be referenced by graphs: kept */
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name)
{
    FModule *m = (FModule *)mod;
    bool in_elf = false;
    for (int i = 0; i < m->nnames; i++)
        in_elf |= strcmp(m->names[i], name) == 0;
    int np = emu_kernel_nparams(m->emu, name);
    if (!in_elf || np < 0) {
        fprintf(stderr, "fake CUDA: cuModuleGetFunction(%s): %s\n", name,
                !in_elf ? "not a function of the cubin" : "not a kernel of the source");
        return CUDA_ERROR_NOT_FOUND;
    }
    Func *fn = calloc(1, sizeof *fn);
    fn->m = m;
    fn->name = strdup(name);
    fn->nparams = np;
    fn->psize = calloc((size_t)np + 1, sizeof(size_t));
    size_t total = 0;
    fn->isptr = calloc((size_t)np + 1, sizeof(bool));
    for (int i = 0; i < np; i++) {
        fn->psize[i] = emu_kernel_param(m->emu, name, i, &fn->isptr[i]);
        if (fn->psize[i] == 0 || fn->psize[i] > 8)
            fakecu_die("cuModuleGetFunction(%s): parameter %d of %zu bytes is not modelled",
                       name, i, fn->psize[i]);
        total += (fn->psize[i] + 7) / 8 * 8;
    }
    /* the kernel parameter space: 32764 bytes since CUDA 12.1 (sm_70 and
     * later; kiln builds for sm_80 and sm_90), 4096 before */
    if (total > 32764)
        fakecu_die("cuModuleGetFunction(%s): %zu bytes of parameters (at most 32764)", name,
                   total);
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}
