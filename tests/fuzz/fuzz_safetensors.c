/* fuzz_safetensors.c - the safetensors reader (rt_st_read) through the path
 * every --init-from and --resume takes: the bytes go to a memfd, read by
 * its /proc/self/fd path. Any input gives a file or a message naming the
 * path, never a crash. On what the reader accepts: rt_st_find finds every
 * tensor as itself (names are unique), rt_st_meta every key, every tensor's
 * bytes are read, and the file is loaded as weights and as a checkpoint
 * into a small model (shape checks, the non-finite check).
 *
 * Seed corpus (tests/fuzz/corpus/safetensors/): files of that model written
 * by kiln's own writers (weights, a checkpoint, one holding a NaN), a file
 * with every dtype, the crash inputs (repeated __metadata__), and a
 * checkpoint whose kiln.step is past int64 (refused, not clamped). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime.h"
#include "train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Built once, kept for the process (reachable: no leak report). */
static int fd = -1;
static char path[64];
static Graph *g;
static void **vals;
static volatile uint8_t sink; /* the tensors' bytes, read */

/* The model the seeds were written for: params w f32[2,3], b bf16[4], and
 * the optimizer's state adam.m.w f32[2,3]. */
static void setup(void)
{
    fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0)
        abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    g = ir_new();
    ParamInit z = {INIT_ZEROS, 0, 0};
    ir_add_input(g, TK_PARAM, "w", shape_make(DT_F32, 2, (int64_t[]){2, 3}), z);
    ir_add_input(g, TK_PARAM, "b", shape_make(DT_BF16, 1, (int64_t[]){4}), z);
    ir_add_input(g, TK_STATE, "adam.m.w", shape_make(DT_F32, 2, (int64_t[]){2, 3}), z);
    vals = xcalloc((size_t)g->t.n, sizeof *vals);
    for (int i = 0; i < g->t.n; i++)
        vals[i] = xcalloc(1, (size_t)shape_numel(&g->t.v[i].s) * 4 + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0)
        setup();
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size))
        abort();
    StFile f;
    Diag d;
    d.msg[0] = 0;
    if (!rt_st_read(path, &f, &d)) {
        if (!strstr(d.msg, path) || f.n != 0 || f.nmeta != 0)
            abort(); /* every refusal names the file and leaves f empty */
        return 0;
    }
    uint8_t sum = 0;
    for (int i = 0; i < f.n; i++) {
        if (rt_st_find(&f, f.t[i].name) != &f.t[i])
            abort();
        const uint8_t *b = f.t[i].data;
        for (size_t k = 0; k < f.t[i].nbytes; k++)
            sum ^= b[k];
    }
    sink = sum;
    for (int i = 0; i < f.nmeta; i++)
        if (rt_st_meta(&f, f.key[i]) != f.val[i])
            abort();
    rt_st_free(&f);
    rt_weights_load(path, g, vals, &d);
    CkptMeta m;
    rt_ckpt_load(path, g, vals, &m, &d);
    return 0;
}
