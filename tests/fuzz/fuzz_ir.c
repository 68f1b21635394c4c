/* fuzz_ir.c - the IR text parser (ir_parse) and, on what it accepts, the
 * verifier and the printer: any text gives a graph or a message, never a
 * crash. Seed corpus: tests/fuzz/corpus/ir/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    char err[512];
    Graph *g = ir_parse(text, "fuzz.ir", err, sizeof err);
    if (g) {
        if (ir_verify(g, err, sizeof err))
            free(ir_print_str(g));
        ir_free(g);
    }
    free(text);
    return 0;
}
