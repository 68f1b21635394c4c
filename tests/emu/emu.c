/* emu.c - the emulated CUDA device's launcher (see emu.h): compiles a CUDA
 * source with the host C++ compiler under cuda_emu.h, loads it with dlopen
 * and calls its kernels through libffi inside the emulator's threads. */
#include "emu.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <ffi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef KILN_EMU_DIR
#error "KILN_EMU_DIR (the directory of cuda_emu.h) must be defined by the build"
#endif
#ifndef KILN_EMU_CXX
#define KILN_EMU_CXX "g++"
#endif

typedef struct {
    char *name;
    int nparams;
    ffi_type **types;
    ffi_cif cif;
    void (*fn)(void);
    uint64_t launches; /* how often it was launched (its thread orders' seeds) */
} EmuKernel;

struct EmuModule {
    void *so;
    KilnEmuLaunchFn launch;
    EmuKernel *k;
    int nk;
    uint64_t seed;
    int order;
    KilnEmuStats last; /* of the last launch */
};

void emu_opts_default(EmuOpts *o)
{
    memset(o, 0, sizeof *o);
    o->sanitize = true;
    o->order = KILN_EMU_ORDER_RANDOM;
    o->seed = 0x6b696c6e656d75ull;
}

void emu_init(char **argv)
{
#ifdef KILN_EMU_LIBASAN
    if (!dlsym(RTLD_DEFAULT, "__asan_init") && !getenv("KILN_EMU_REEXEC")) {
        setenv("KILN_EMU_REEXEC", "1", 1);
        setenv("LD_PRELOAD", KILN_EMU_LIBASAN, 1);
        if (!getenv("ASAN_OPTIONS"))
            setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "emu: cannot re-execute with %s: %s\n", KILN_EMU_LIBASAN,
                strerror(errno));
        exit(1);
    }
#endif
    (void)argv;
    unsetenv("LD_PRELOAD");
    /* the tool every emulated kernel needs: without it the test is skipped
     * (77: ctest's SKIP_RETURN_CODE), not passed */
    if (system("'" KILN_EMU_CXX "' --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: the host C++ compiler %s does not run\n", KILN_EMU_CXX);
        exit(77);
    }
}

/* ---- source scanning ---------------------------------------------------- */

/* A copy of src with comments and string literals blanked. */
static char *strip_comments(const char *src)
{
    char *s = xstrdup(src);
    for (char *p = s; *p; p++) {
        if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n')
                *p++ = ' ';
            if (!*p)
                break;
        } else if (p[0] == '/' && p[1] == '*') {
            while (*p && !(p[0] == '*' && p[1] == '/'))
                *p++ = ' ';
            if (!*p)
                break;
            p[0] = p[1] = ' ';
            p++;
        } else if (*p == '"') {
            p++;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1])
                    *p++ = ' ';
                *p++ = ' ';
            }
            if (!*p)
                break;
        }
    }
    return s;
}

static bool is_ident(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The word at p if it is exactly w (not part of a longer identifier). */
static bool word_at(const char *start, const char *p, const char *w)
{
    size_t n = strlen(w);
    return strncmp(p, w, n) == 0 && !is_ident(p[n]) && (p == start || !is_ident(p[-1]));
}

/* A struct of one pointer, passed by value. */
static ffi_type *ptr_struct_elems[] = {&ffi_type_pointer, NULL};
static ffi_type ptr_struct_type = {0, 0, FFI_TYPE_STRUCT, ptr_struct_elems};

static ffi_type *param_type(const char *decl, const char *const *ptr_structs, Diag *d)
{
    if (strchr(decl, '*'))
        return &ffi_type_pointer;
    /* words of the declaration, minus qualifiers and the parameter's name */
    char words[8][32];
    int nw = 0;
    for (const char *p = decl; *p;) {
        if (!is_ident(*p)) {
            p++;
            continue;
        }
        const char *b = p;
        while (is_ident(*p))
            p++;
        size_t n = (size_t)(p - b);
        if (n >= sizeof words[0] || nw == 8)
            goto bad;
        char w[32];
        memcpy(w, b, n);
        w[n] = 0;
        if (!strcmp(w, "const") || !strcmp(w, "volatile") || !strcmp(w, "__restrict__") ||
            !strcmp(w, "__restrict"))
            continue;
        strcpy(words[nw++], w);
    }
    if (nw >= 2)
        nw--; /* the name */
    char ty[128] = "";
    for (int i = 0; i < nw; i++) {
        if (i)
            strcat(ty, " ");
        strcat(ty, words[i]);
    }
    static const struct {
        const char *name;
        ffi_type *t;
    } map[] = {
        {"float", &ffi_type_float},
        {"double", &ffi_type_double},
        {"int", &ffi_type_sint32},
        {"signed", &ffi_type_sint32},
        {"signed int", &ffi_type_sint32},
        {"int32_t", &ffi_type_sint32},
        {"unsigned", &ffi_type_uint32},
        {"unsigned int", &ffi_type_uint32},
        {"uint32_t", &ffi_type_uint32},
        {"long", &ffi_type_sint64},
        {"long int", &ffi_type_sint64},
        {"long long", &ffi_type_sint64},
        {"long long int", &ffi_type_sint64},
        {"int64_t", &ffi_type_sint64},
        {"ptrdiff_t", &ffi_type_sint64},
        {"unsigned long", &ffi_type_uint64},
        {"unsigned long long", &ffi_type_uint64},
        {"unsigned long long int", &ffi_type_uint64},
        {"uint64_t", &ffi_type_uint64},
        {"size_t", &ffi_type_uint64},
        {"short", &ffi_type_sint16},
        {"int16_t", &ffi_type_sint16},
        {"unsigned short", &ffi_type_uint16},
        {"uint16_t", &ffi_type_uint16},
        {"char", &ffi_type_sint8},
        {"signed char", &ffi_type_sint8},
        {"int8_t", &ffi_type_sint8},
        {"unsigned char", &ffi_type_uint8},
        {"uint8_t", &ffi_type_uint8},
        {"bool", &ffi_type_uint8},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].name, ty))
            return map[i].t;
    for (int i = 0; ptr_structs && ptr_structs[i]; i++)
        if (!strcmp(ptr_structs[i], ty))
            return &ptr_struct_type;
bad:
    snprintf(d->msg, sizeof d->msg, "emu: kernel parameter `%s`: unsupported type (expected a "
                                    "pointer or a scalar integer or float type)",
             decl);
    return NULL;
}

/* Parses every `__global__` function's parameter list. */
static bool scan_kernels(EmuModule *m, const char *src, const char *const *ptr_structs,
                         Diag *d)
{
    for (const char *p = src; (p = strstr(p, "__global__")); p++) {
        if (!word_at(src, p, "__global__"))
            continue;
        const char *q = p + strlen("__global__");
        const char *paren = strchr(q, '(');
        /* skip __launch_bounds__(...) */
        while (paren) {
            const char *lb = strstr(q, "__launch_bounds__");
            if (!lb || lb > paren)
                break;
            int depth = 0;
            const char *r = paren;
            for (; *r; r++) {
                if (*r == '(')
                    depth++;
                else if (*r == ')' && --depth == 0)
                    break;
            }
            q = *r ? r + 1 : r;
            paren = strchr(q, '(');
        }
        if (!paren)
            break;
        const char *e = paren;
        while (e > q && isspace((unsigned char)e[-1]))
            e--;
        const char *b = e;
        while (b > q && is_ident(b[-1]))
            b--;
        if (b == e)
            continue;
        EmuKernel k = {0};
        k.name = xasprintf("%.*s", (int)(e - b), b);
        /* parameters up to the matching ')' */
        VEC(ffi_type *) types = {0};
        const char *r = paren + 1;
        int depth = 0;
        const char *pstart = r;
        for (; *r; r++) {
            if (*r == '(' || *r == '[' || *r == '<')
                depth++;
            else if ((*r == ')' || *r == ']' || *r == '>') && depth > 0)
                depth--;
            else if ((*r == ',' || *r == ')') && depth == 0) {
                char *decl = xasprintf("%.*s", (int)(r - pstart), pstart);
                bool blank = true;
                for (char *c = decl; *c; c++)
                    blank &= isspace((unsigned char)*c) != 0;
                if (!blank && strcmp(decl, "void") != 0) {
                    ffi_type *t = param_type(decl, ptr_structs, d);
                    if (!t) {
                        char *msg = xasprintf("%s (kernel %s)", d->msg, k.name);
                        snprintf(d->msg, sizeof d->msg, "%s", msg);
                        free(msg);
                        free(decl);
                        free(types.v);
                        free(k.name);
                        return false;
                    }
                    vec_push(&types, t);
                }
                free(decl);
                pstart = r + 1;
                if (*r == ')')
                    break;
            }
        }
        k.nparams = types.n;
        k.types = types.v;
        m->k = xrealloc(m->k, sizeof(EmuKernel) * (size_t)(m->nk + 1));
        m->k[m->nk++] = k;
        p = r;
        if (!*p)
            break;
    }
    return true;
}

/* Names declared `extern __shared__ T NAME[]`; returned as one string of
 * alias definitions for the generated unit. */
static char *dyn_shared_aliases(const char *src)
{
    VEC(char) out = {0};
    VEC(char *) seen = {0};
    for (const char *p = src; (p = strstr(p, "extern")); p++) {
        if (!word_at(src, p, "extern"))
            continue;
        const char *q = p + 6;
        while (isspace((unsigned char)*q))
            q++;
        if (!word_at(src, q, "__shared__"))
            continue;
        const char *semi = strchr(q, ';');
        const char *br = strchr(q, '[');
        if (!semi || !br || br > semi)
            continue;
        const char *e = br;
        while (e > q && isspace((unsigned char)e[-1]))
            e--;
        const char *b = e;
        while (b > q && is_ident(b[-1]))
            b--;
        char *name = xasprintf("%.*s", (int)(e - b), b);
        bool dup = false;
        for (int i = 0; i < seen.n; i++)
            dup |= !strcmp(seen.v[i], name);
        if (dup || !*name) {
            free(name);
            continue;
        }
        vec_push(&seen, name);
        char *line = xasprintf("extern thread_local unsigned char %s[] "
                               "__attribute__((alias(\"kiln_emu_dyn_smem\")));\n",
                               name);
        for (char *c = line; *c; c++)
            vec_push(&out, *c);
        free(line);
    }
    vec_push(&out, '\0');
    for (int i = 0; i < seen.n; i++)
        free(seen.v[i]);
    free(seen.v);
    return out.v;
}

/* ---- compiling ---------------------------------------------------------- */

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    VEC(char) b = {0};
    int c;
    while ((c = fgetc(f)) != EOF)
        vec_push(&b, (char)c);
    vec_push(&b, '\0');
    fclose(f);
    return b.v;
}

static bool run(const char *cmd, Diag *d)
{
    char *full = xasprintf("%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    free(full);
    if (!p) {
        snprintf(d->msg, sizeof d->msg, "emu: cannot run the compiler");
        return false;
    }
    VEC(char) out = {0};
    int c;
    while ((c = fgetc(p)) != EOF)
        vec_push(&out, (char)c);
    vec_push(&out, '\0');
    int st = pclose(p);
    if (st != 0) {
        size_t n = strlen(out.v);
        /* keep the first errors: they name the construct that is not modelled */
        snprintf(d->msg, sizeof d->msg, "emu: compiling for the emulator failed:\n%.*s",
                 (int)(n < 1900 ? n : 1900), out.v);
    }
    free(out.v);
    return st == 0;
}

static const char *cache_root(void)
{
    static char buf[1024];
    const char *c = getenv("KILN_CACHE_DIR");
    snprintf(buf, sizeof buf, "%s/emu", c && *c ? c : "/tmp/kiln-emu");
    return buf;
}

static void mkdirs(const char *path)
{
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0777);
            *s = '/';
        }
    mkdir(p, 0777);
    free(p);
}

EmuModule *emu_compile(const char *source, const EmuOpts *o, Diag *d)
{
    const char *san = o->sanitize ? "-fsanitize=address,bounds,alignment "
                                    "-fno-sanitize-recover=all -fno-omit-frame-pointer"
                                  : "";
    /* -fno-extern-tls-init: `extern __shared__` arrays (extern thread_local)
     * are accessed directly, not through TLS wrapper functions */
    char *flags = xasprintf("-std=gnu++17 -O1 -g -fPIC -ffp-contract=off -fno-extern-tls-init "
                            "-w %s %s",
                            san, o->cflags ? o->cflags : "");
    /* cache key: the source, the flags and the emulator's own files */
    static const char *const own[] = {"cuda_emu.h", "emu_runtime.cpp", "emu_abi.h"};
    uint64_t h = hash_bytes(flags, strlen(flags), 0x656d75ull);
    h = hash_bytes(KILN_EMU_CXX, strlen(KILN_EMU_CXX), h);
    for (int i = 0; i < 3; i++) {
        char *path = xasprintf("%s/%s", KILN_EMU_DIR, own[i]);
        char *text = slurp(path);
        if (!text) {
            snprintf(d->msg, sizeof d->msg, "emu: cannot read %s", path);
            free(path);
            free(flags);
            return NULL;
        }
        h = hash_bytes(text, strlen(text), h);
        free(text);
        free(path);
    }
    uint64_t h_own = h; /* the runtime's key: flags, compiler, emulator files */
    h = hash_bytes(source, strlen(source), h);
    const char *root = cache_root();
    mkdirs(root);
    /* the runtime: one object per set of flags, shared by every module */
    char *rt = xasprintf("%s/runtime-%016llx.o", root, (unsigned long long)h_own);
    if (access(rt, R_OK) != 0) {
        char *tmp = xasprintf("%s.tmp%d", rt, (int)getpid());
        char *cmd = xasprintf("%s %s -c -I%s -o %s -x c++ %s/emu_runtime.cpp", KILN_EMU_CXX,
                              flags, KILN_EMU_DIR, tmp, KILN_EMU_DIR);
        bool ok = run(cmd, d);
        if (ok && rename(tmp, rt) != 0) {
            snprintf(d->msg, sizeof d->msg, "emu: cannot rename %s: %s", tmp, strerror(errno));
            ok = false;
        }
        if (!ok)
            unlink(tmp);
        free(cmd);
        free(tmp);
        if (!ok) {
            free(rt);
            free(flags);
            return NULL;
        }
    }
    char *so = xasprintf("%s/%016llx.so", root, (unsigned long long)h);
    EmuModule *m = xcalloc(1, sizeof *m);
    m->seed = o->seed;
    m->order = o->order;
    char *stripped = strip_comments(source);
    bool ok = scan_kernels(m, stripped, o->ptr_structs, d);
    if (ok && access(so, R_OK) != 0) {
        char *dir = xasprintf("%s/tmp-%016llx-%d", root, (unsigned long long)h, (int)getpid());
        mkdirs(dir);
        char *cu = xasprintf("%s/kernels.cu", dir);
        char *dyn = xasprintf("%s/dyn.cpp", dir);
        char *aliases = dyn_shared_aliases(stripped);
        char *dyntext = xasprintf(
            "thread_local __attribute__((aligned(256))) unsigned char "
            "kiln_emu_dyn_smem[%d];\n%s"
            "extern \"C\" unsigned char *kiln_emu_dyn_smem_base(void) { return "
            "kiln_emu_dyn_smem; }\n",
            KILN_EMU_MAX_DYN_SMEM, aliases);
        char *tmp = xasprintf("%s/k.so", dir);
        ok = write_file(cu, source) && write_file(dyn, dyntext);
        if (!ok)
            snprintf(d->msg, sizeof d->msg, "emu: cannot write %s", cu);
        char *cmd = xasprintf("%s %s -fmacro-prefix-map=%s/= -shared -I%s -o %s -x c++ "
                              "-include cuda_emu.h %s %s -x none %s",
                              KILN_EMU_CXX, flags, dir, KILN_EMU_DIR, tmp, cu, dyn, rt);
        ok = ok && run(cmd, d);
        if (ok && rename(tmp, so) != 0) {
            snprintf(d->msg, sizeof d->msg, "emu: cannot rename %s: %s", tmp, strerror(errno));
            ok = false;
        }
        if (ok) {
            unlink(cu);
            unlink(dyn);
            rmdir(dir);
        }
        free(cmd);
        free(tmp);
        free(dyntext);
        free(aliases);
        free(cu);
        free(dyn);
        free(dir);
    }
    free(stripped);
    free(flags);
    if (ok) {
        m->so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        if (!m->so) {
            snprintf(d->msg, sizeof d->msg, "emu: dlopen %s: %s", so, dlerror());
            ok = false;
        }
    }
    if (ok) {
        m->launch = (KilnEmuLaunchFn)dlsym(m->so, "kiln_emu_launch");
        for (int i = 0; i < m->nk && ok; i++) {
            EmuKernel *k = &m->k[i];
            k->fn = (void (*)(void))dlsym(m->so, k->name);
            if (!k->fn) {
                snprintf(d->msg, sizeof d->msg,
                         "emu: kernel %s is not exported (declare it extern \"C\" __global__)",
                         k->name);
                ok = false;
            } else if (ffi_prep_cif(&k->cif, FFI_DEFAULT_ABI, (unsigned)k->nparams,
                                    &ffi_type_void, k->types) != FFI_OK) {
                snprintf(d->msg, sizeof d->msg, "emu: ffi_prep_cif failed for %s", k->name);
                ok = false;
            }
        }
        if (ok && !m->launch) {
            snprintf(d->msg, sizeof d->msg, "emu: %s lacks kiln_emu_launch", so);
            ok = false;
        }
    }
    free(so);
    free(rt);
    if (!ok) {
        emu_free(m);
        return NULL;
    }
    return m;
}

void emu_free(EmuModule *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nk; i++) {
        free(m->k[i].name);
        free(m->k[i].types);
    }
    free(m->k);
    if (m->so)
        dlclose(m->so);
    free(m);
}

static EmuKernel *find_kernel(const EmuModule *m, const char *name)
{
    for (int i = 0; i < m->nk; i++)
        if (!strcmp(m->k[i].name, name))
            return &m->k[i];
    return NULL;
}

int emu_kernel_nparams(const EmuModule *m, const char *name)
{
    EmuKernel *k = find_kernel(m, name);
    return k ? k->nparams : -1;
}

size_t emu_kernel_param(const EmuModule *m, const char *name, int i, bool *is_ptr)
{
    EmuKernel *k = find_kernel(m, name);
    *is_ptr = false;
    if (!k || i < 0 || i >= k->nparams)
        return 0;
    *is_ptr = k->types[i] == &ffi_type_pointer || k->types[i] == &ptr_struct_type;
    return k->types[i]->size;
}

typedef struct {
    EmuKernel *k;
    void **args;
} Call;

static void call_kernel(void *ctx)
{
    Call *c = ctx;
    ffi_call(&c->k->cif, c->k->fn, NULL, c->args);
}

bool emu_launch(EmuModule *m, const char *name, const unsigned grid[3], const unsigned block[3],
                size_t shmem, void **args, Diag *d)
{
    EmuKernel *k = find_kernel(m, name);
    if (!k) {
        snprintf(d->msg, sizeof d->msg, "emu: no kernel named %s", name);
        return false;
    }
    Call c = {k, args};
    /* the launch's seed: the module's, the kernel's name and how often this
     * kernel ran before, nothing else, so that launches of other kernels
     * (more of them, or fewer) leave this kernel's n-th thread order as it
     * was: a float atomicAdd's sum depends on that order (emu.h) */
    uint64_t seed = hash_bytes(name, strlen(name), m->seed) ^
                    (k->launches++ + 1) * 0x9E3779B97F4A7C15ull;
    seed = (seed ^ (seed >> 31)) * 0xBF58476D1CE4E5B9ull;
    KilnEmuLaunch l = {{grid[0], grid[1], grid[2]},
                       {block[0], block[1], block[2]},
                       shmem,
                       call_kernel,
                       &c,
                       seed ^ (seed >> 29),
                       m->order,
                       &m->last};
    m->last = (KilnEmuStats){0, 0};
    char err[sizeof d->msg - 64];
    if (m->launch(&l, err, sizeof err) != 0) {
        snprintf(d->msg, sizeof d->msg, "emu: %s: %s", name, err);
        return false;
    }
    return true;
}

void emu_last_stats(const EmuModule *m, KilnEmuStats *s) { *s = m->last; }
