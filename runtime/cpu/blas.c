/* blas.c - which OpenBLAS kernels this process runs, and a better choice
 * when OpenBLAS fell back to old ones.
 *
 * OpenBLAS built with DYNAMIC_ARCH (Debian's is) picks its kernels when the
 * library loads, from the CPU's family and model. A CPU newer than the
 * library is not in its table and gets the fallback: OpenBLAS 0.3.21 runs
 * Prescott's SSE3 kernels on an Emerald Rapids Xeon (family 6, model 207),
 * and kiln's GEMMs there are 4x slower than with its AVX-512 kernels (gpt
 * at L=4 C=256 T=64 batch 8: 323 ms a step against 77). The choice cannot
 * change once the library is loaded; OPENBLAS_CORETYPE, read at load,
 * forces it. So the command line asks rt_blas_better_core at startup and,
 * when it names a core, sets OPENBLAS_CORETYPE and runs itself again
 * (runtime/cli/main.c). A user's own OPENBLAS_CORETYPE is left alone. */
#include "cpu.h"

#include <cblas.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <strings.h>

/* The widest vector ISA of an OpenBLAS core, by the names of 0.3.21's
 * corename table (and SapphireRapids, added in 0.3.22). Names not listed
 * count as SSE: a core too old or too unusual to compare. */
static RtIsa core_isa(const char *core)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen", "Excavator"};
    static const char *const avx[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"};
    for (size_t i = 0; i < sizeof avx512 / sizeof *avx512; i++)
        if (strcasecmp(core, avx512[i]) == 0)
            return RT_ISA_AVX512;
    for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
        if (strcasecmp(core, avx2[i]) == 0)
            return RT_ISA_AVX2;
    for (size_t i = 0; i < sizeof avx / sizeof *avx; i++)
        if (strcasecmp(core, avx[i]) == 0)
            return RT_ISA_AVX;
    return RT_ISA_SSE;
}

RtIsa rt_cpu_isa(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return RT_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return RT_ISA_AVX2;
    if (__builtin_cpu_supports("avx"))
        return RT_ISA_AVX;
    return RT_ISA_SSE;
}

/* Only a fallback below AVX2 on a CPU with AVX2 or more is replaced: a core
 * OpenBLAS chose for what it recognised (Zen on a Zen 4, say) stays, since
 * the one it would be replaced with was not measured against it. */
const char *rt_blas_core_for(const char *core, RtIsa cpu)
{
    if (core_isa(core) >= RT_ISA_AVX2 || cpu < RT_ISA_AVX2)
        return NULL;
    return cpu == RT_ISA_AVX512 ? "SkylakeX" : "Haswell";
}

const char *rt_blas_core(void)
{
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

const char *rt_blas_better_core(void)
{
    if (getenv("OPENBLAS_CORETYPE"))
        return NULL;
    return rt_blas_core_for(rt_blas_core(), rt_cpu_isa());
}

/* kiln never runs OpenBLAS's threads: its own pool splits each GEMM and
 * calls OpenBLAS on one thread (backend_cpu.c). But a threaded OpenBLAS
 * starts a server thread per further core when it loads, and they spin
 * before they sleep (one took 60 ms of CPU in the first half second of a
 * gpt tiny run here), on the cores kiln's pool needs. gpt tiny's median step over 20 steps on 2 threads was 0.70 to
 * 7.71 ms from one run to the next (the worker losing its core to the
 * spinning thread, so that every parallel step waited out the pool's grace
 * for it), against 0.62 to 0.82 ms with OPENBLAS_NUM_THREADS=1, where no
 * server thread starts. So the threads are stopped at startup with
 * blas_thread_shutdown_, the function OpenBLAS's own fork handler calls;
 * it is not in cblas.h, so it is looked up, and a build without it (a
 * serial OpenBLAS) is left as it is. With one thread set, OpenBLAS runs
 * every call on the caller and does not start them again. The backend and
 * the cpu measurement call this too (idempotent), for the tests' processes,
 * which do not start in kiln's main. */
void rt_blas_one_thread(void)
{
    /* openblas_set_num_threads starts the server threads again when they
     * are stopped, even for 1: called only while the count is not 1 */
    if (openblas_get_num_threads() != 1)
        openblas_set_num_threads(1);
    int (*shutdown)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "blas_thread_shutdown_");
    if (shutdown)
        shutdown();
}
