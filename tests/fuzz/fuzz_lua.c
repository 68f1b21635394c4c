/* fuzz_lua.c - the model frontend (fe_load_model_text): any bytes run as a
 * model script give a model or a "FILE:LINE: ..." message, never a crash, a
 * leak or a hang. The sandbox's bounds are small here (KILN_LUA_INSTRUCTIONS
 * 200000, KILN_LUA_MEMORY 32MiB, KILN_MAX_OPS 20000) so that every input runs
 * quickly, and the clock (KILN_LUA_SECONDS 10) stops a long library call
 * before libFuzzer's 20 s timeout (tests/fuzz/run.sh); the script reaches no file (it runs from memory, and the sandbox
 * has no file access). Seed corpus: tests/fuzz/corpus/lua/ (the models, the
 * hostile scripts of tests/data/bad/, and what fuzzing found); dictionary:
 * tests/fuzz/lua.dict (the DSL's words). */
#include <stdint.h>
#include <stdlib.h>

#include "frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setenv("KILN_LUA_INSTRUCTIONS", "200000", 1);
    setenv("KILN_LUA_MEMORY", "32MiB", 1);
    setenv("KILN_MAX_OPS", "20000", 1);
    setenv("KILN_LUA_SECONDS", "10", 1);
    char err[2048];
    Model *m = fe_load_model_text("fuzz.lua", (const char *)data, size, NULL, 0, err, sizeof err);
    fe_model_free(m);
    return 0;
}
