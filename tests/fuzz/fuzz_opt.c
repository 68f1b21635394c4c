/* fuzz_opt.c - `kiln opt`'s path: the IR text parser, then the passes on
 * what it accepts (pass_run: pass_check, each pass, the verifier after
 * each). Any text and any pass list give a graph or a message, never a
 * crash, an abort (die) or a file written.
 *
 * An input is IR text (kiln-ir v1 or v2). Its comment lines
 *   # passes: P1,P2,...   the passes, as --passes (default: the pipeline)
 *   # nproc: N            comm's ranks, 1..8 (default 1)
 *   # zero: 1             comm/optimizer: shard the optimizer state
 * anywhere in it choose what runs, so seeds read like pass tests. Seed
 * corpus: tests/fuzz/corpus/opt/ (small dumps of models/ with pass lists,
 * and the inputs of issue 38's aborts). FUZZ_OPT_VERBOSE=1 prints each
 * input's outcome (to see what a seed reaches). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "passes.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The value after "# KEY:" on a line of text, copied into buf (at most n-1
 * bytes, up to the end of its line); false when no line has it. */
static bool header(const char *text, const char *key, char *buf, size_t n)
{
    size_t kl = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        if (strncmp(l, "# ", 2) != 0 || strncmp(l + 2, key, kl) != 0 || l[2 + kl] != ':')
            continue;
        const char *v = l + 3 + kl;
        while (*v == ' ')
            v++;
        size_t k = 0;
        while (v[k] && v[k] != '\n' && v[k] != '\r' && k + 1 < n) {
            buf[k] = v[k];
            k++;
        }
        buf[k] = 0;
        return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;

    const Pass *passes[16];
    int np = 0;
    char list[256], v[32];
    if (header(text, "passes", list, sizeof list)) {
        for (char *save = NULL, *p = strtok_r(list, ",", &save); p && np < 16;
             p = strtok_r(NULL, ",", &save)) {
            const Pass *ps = pass_find(p);
            if (ps)
                passes[np++] = ps;
        }
    }
    if (np == 0)
        for (int i = 0; i < pass_count && np < 16; i++)
            passes[np++] = &pass_list[i];
    PassOpts o;
    pass_opts_default(&o);
    o.attention = true; /* kiln opt's default */
    if (header(text, "nproc", v, sizeof v)) {
        int n = atoi(v);
        o.nranks = n >= 1 && n <= 8 ? n : 1;
    }
    if (header(text, "zero", v, sizeof v) && o.nranks > 1)
        o.zero = atoi(v) == 1;

    char err[512];
    bool verbose = getenv("FUZZ_OPT_VERBOSE") != NULL;
    Graph *g = ir_parse(text, "fuzz.ir", err, sizeof err);
    if (!g && verbose)
        fprintf(stderr, "fuzz_opt: %s\n", err);
    if (g) {
        MemPlan *mp = NULL;
        o.memplan = &mp;
        Diag d = {{0}};
        bool ran = pass_run(g, passes, np, &o, NULL, NULL, &d);
        if (verbose)
            fprintf(stderr, "fuzz_opt: %d passes through %s: %s\n", np, passes[np - 1]->name,
                    ran ? "ran" : d.msg);
        if (ran) {
            /* what kiln opt prints; it parses back unless it is memplan's */
            char *s = NULL;
            size_t n = 0;
            FILE *f = open_memstream(&s, &n);
            if (f) {
                pass_dump(passes[np - 1]->name, g, mp, f);
                fclose(f);
                if (strcmp(passes[np - 1]->name, "memplan") != 0) {
                    Graph *h = ir_parse(s, "fuzz-out.ir", err, sizeof err);
                    if (!h) {
                        fprintf(stderr, "the passes' output does not parse back: %s\n", err);
                        abort();
                    }
                    ir_free(h);
                }
            }
            free(s);
        }
        pass_memplan_free(mp);
        ir_free(g);
    }
    free(text);
    return 0;
}
