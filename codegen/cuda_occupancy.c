/* cuda_occupancy.c - blocks of a CUDA function resident on one SM, and
 * ptxas' figures they come from (cg_cuda.h). The cost model (predict.c)
 * asks cg_cuda_blocks_per_unit; the figures (registers per thread, static
 * shared memory per block, spill bytes) are read from the NVRTC log of a
 * compile with --ptxas-options=-v (cuda_nvrtc.c caches that log beside the
 * cubin, so a second read costs no compile). Without them occupancy comes
 * from the block size alone (docs/cost.md, Occupancy).
 *
 * Invariant: a function's figures are set only from the log's report of an
 * entry function of the same name; a log that names no function of the
 * program changes nothing. */
#include "cg_cuda.h"

#include <stdlib.h>
#include <string.h>

/* Every device in the table (sm_80 to sm_100): 64K 32-bit registers per
 * SM, allocated per warp in units of 256; 1 KB of shared memory reserved
 * per resident block. */
enum { REGS_UNIT = 65536, REG_ALLOC = 256, SMEM_RESERVED = 1024 };

int cg_cuda_blocks_per_unit(const CgDevice *dev, int threads, int regs, int smem)
{
    if (threads < 1)
        threads = 1;
    int per = dev->max_threads_unit / threads;
    if (per > dev->max_blocks_unit)
        per = dev->max_blocks_unit;
    if (regs > 0) {
        int warps = (threads + 31) / 32;
        int per_warp = (regs * 32 + REG_ALLOC - 1) / REG_ALLOC * REG_ALLOC;
        int by_regs = REGS_UNIT / per_warp / warps;
        per = by_regs < per ? by_regs : per;
    }
    if (smem > 0 && dev->smem_unit > 0) {
        int by_smem = dev->smem_unit / (smem + SMEM_RESERVED);
        per = by_smem < per ? by_smem : per;
    }
    return per < 1 ? 1 : per;
}

/* The integer right before `unit` in line [s, e) ("Used 32 registers":
 * unit "registers"); -1 when the line has none. */
static long figure_before(const char *s, const char *e, const char *unit)
{
    size_t n = strlen(unit);
    for (const char *p = s; p + n <= e; p++) {
        if (memcmp(p, unit, n) != 0)
            continue;
        const char *q = p;
        while (q > s && q[-1] == ' ')
            q--;
        const char *d = q;
        while (d > s && d[-1] >= '0' && d[-1] <= '9')
            d--;
        if (d < q)
            return strtol(d, NULL, 10);
    }
    return -1;
}

int cg_cuda_ptxas(CgCudaProgram *q, const char *log)
{
    static const char entry[] = "Compiling entry function '";
    CgCudaFn *cur = NULL;
    int found = 0;
    for (const char *s = log; s && *s;) {
        const char *e = strchr(s, '\n');
        if (!e)
            e = s + strlen(s);
        const char *c = strstr(s, entry);
        if (c && c < e) {
            const char *nm = c + sizeof entry - 1, *ne = memchr(nm, '\'', (size_t)(e - nm));
            cur = NULL;
            for (int i = 0; ne && i < q->fn.n && !cur; i++)
                if (strlen(q->fn.v[i].name) == (size_t)(ne - nm) &&
                    memcmp(q->fn.v[i].name, nm, (size_t)(ne - nm)) == 0)
                    cur = &q->fn.v[i];
        } else if (cur) {
            long regs = figure_before(s, e, " registers");
            long st = figure_before(s, e, " bytes spill stores");
            long ld = figure_before(s, e, " bytes spill loads");
            if (st >= 0 || ld >= 0)
                cur->spill = (int)((st > 0 ? st : 0) + (ld > 0 ? ld : 0));
            if (regs > 0) {
                long sm = figure_before(s, e, " bytes smem");
                if (!cur->regs)
                    found++;
                cur->regs = (int)regs;
                cur->smem = sm > 0 ? (int)sm : 0;
            }
        }
        s = *e ? e + 1 : e;
    }
    q->ptxas_fns = 0;
    for (int i = 0; i < q->fn.n; i++)
        q->ptxas_fns += q->fn.v[i].regs > 0;
    return found;
}
