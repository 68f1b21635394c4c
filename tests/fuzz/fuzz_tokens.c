/* fuzz_tokens.c - the data file readers of runtime/train/data.c through their
 * normal open path (rt_data_open on a path): the input's bytes are written
 * to a memfd and opened as an llm.c token file, then as a text file. Any
 * bytes give a source or a message naming the file, never a crash; an open
 * source's batches hold only symbols below the limits it was given, inside
 * their split. Seed corpus: tests/fuzz/corpus/tokens/ (valid token files,
 * truncated and odd headers, texts). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime.h"
#include "train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One memfd for the whole run: rewritten for every input. */
static int scratch_fd = -1;
static char scratch_path[64];

static bool put_bytes(const uint8_t *data, size_t size)
{
    if (scratch_fd < 0) {
        scratch_fd = memfd_create("kiln-fuzz-tokens", MFD_CLOEXEC);
        if (scratch_fd < 0)
            return false;
        snprintf(scratch_path, sizeof scratch_path, "/proc/self/fd/%d", scratch_fd);
    }
    if (ftruncate(scratch_fd, 0) != 0)
        return false;
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(scratch_fd, data + done, size - done, (off_t)done);
        if (n <= 0)
            return false;
        done += (size_t)n;
    }
    return true;
}

enum { ROWS = 200, VOCAB = 300 };

static void exercise(const char *kind, size_t size)
{
    /* the window length and split follow the input's size, so the corpus
     * reaches both sides of every split check */
    DataCfg c = {.kind = kind, .path = scratch_path, .seed = size, .batch = 2,
                 .seq = 1 + (int64_t)(size % 13), .val_fraction = (double)(size % 5) * 0.1,
                 .vocab = VOCAB, .rows = ROWS, .rows_name = "\"fuzz\""};
    Diag d = {{0}};
    DataSource *s = rt_data_open(&c, &d);
    if (!s) {
        if (!strstr(d.msg, scratch_path)) {
            fprintf(stderr, "fuzz_tokens: message without the file's path: %s\n", d.msg);
            abort();
        }
        return;
    }
    for (int split = 0; split < 2; split++) {
        if (split == DATA_VAL && !rt_data_has_val(s))
            break;
        for (int64_t k = 0; k < 3; k++) {
            const DataBatch *b = rt_data_batch(s, (DataSplit)split, k);
            for (int64_t i = 0; i < b->B * b->T; i++)
                if (b->tokens[i] < 0 || b->tokens[i] >= ROWS || b->targets[i] < 0 ||
                    b->targets[i] >= ROWS) {
                    fprintf(stderr, "fuzz_tokens: %s symbol out of range in a batch\n", kind);
                    abort();
                }
        }
    }
    rt_data_close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!put_bytes(data, size))
        return 0;
    exercise("tokens", size);
    exercise("text", size);
    return 0;
}
