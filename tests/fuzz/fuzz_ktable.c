/* fuzz_ktable.c - the per-kernel table reader (codegen/calibrate.c,
 * cg_kernel_table_parse), which --calibrate runs on a user's file: any
 * bytes give a table or a message naming the file and a line, never a
 * crash; a table's rows have the kinds, counts and finite non-negative
 * figures the format allows. Seed corpus: tests/fuzz/corpus/ktable/. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Diag d = {{0}};
    CgKernelTable *t = cg_kernel_table_parse((const char *)data, size, "fuzz.tsv", &d);
    if (!t) {
        if (strncmp(d.msg, "fuzz.tsv:", 9) != 0)
            abort();
        return 0;
    }
    if (t->steps < 1)
        abort();
    for (int i = 0; i < t->rows.n; i++) {
        const CgKtRow *r = &t->rows.v[i];
        if (r->calls < 0 || !(r->ms >= 0) || !isfinite(r->ms) || !(r->flops >= 0) ||
            !(r->bytes >= 0) || !r->name[0] || r->line < 2)
            abort();
        if (r->kind == CG_KT_GEMM && (r->dims[0] <= 0 || r->dims[1] <= 0 || r->dims[2] <= 0 ||
                                      r->dims[3] <= 0))
            abort();
    }
    cg_kernel_table_free(t);
    return 0;
}
