/* fuzz_initmap.c - the --init-map reader (fe_init_map_text): any bytes run
 * as a map file over a fixed list of checkpoint names give a map or a
 * "MAP:LINE: ..." message, never a crash, a leak or a hang. Beside Lua, the
 * reader scans the text itself for the line of each entry (quoted names,
 * bare keys), which is what this target is for. The sandbox's bounds are
 * small, as in fuzz_lua.c. Seed corpus: tests/fuzz/corpus/initmap/. */
#include <stdint.h>
#include <stdlib.h>

#include "frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setenv("KILN_LUA_INSTRUCTIONS", "200000", 1);
    setenv("KILN_LUA_MEMORY", "32MiB", 1);
    setenv("KILN_LUA_SECONDS", "10", 1);
    static const char *const names[] = {"fc1.weight", "fc1.bias", "head.weight", "x", "",
                                        "a b", "\"q\"", "fc1"};
    Shape shapes[8];
    int64_t d2[2] = {3, 5}, d1[1] = {5};
    for (int i = 0; i < 8; i++)
        shapes[i] = i % 2 ? shape_make(DT_F32, 1, d1) : shape_make(DT_F32, 2, d2);
    char err[2048];
    InitMap *m = fe_init_map_text("fuzz.lua", (const char *)data, size, names, shapes, 8, err,
                                  sizeof err);
    fe_init_map_free(m);
    return 0;
}
