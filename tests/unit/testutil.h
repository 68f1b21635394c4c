/* testutil.h - helpers shared by kiln's unit tests (which use cmocka). */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "frontend.h"
#include "ir.h"

/* ||a - b|| / ||b|| over n values; NaN or Inf anywhere gives INFINITY. */
double rel_err(const double *a, const double *b, int64_t n);
double rel_err_f32(const float *a, const float *b, int64_t n);
/* A uniform double in [0, 1) from *state, a 64-bit LCG (Knuth's MMIX
 * constants, the top 53 bits): the tests' reproducible random inputs. */
double test_urand(uint64_t *state);
/* f32 to bf16 rounded to nearest even (a NaN to 0x7fff), and bf16 to f32:
 * the tests' host-side conversions (test_emu_kernels keeps its own
 * reference rounding to check the device's). */
uint16_t test_f2bf(float f);
float test_bf2f(uint16_t h);
/* Whole file into a malloc'd NUL-terminated string; NULL if unreadable. */
char *read_file(const char *path);
/* Parse IR text; fails the test with the parser's message on error. */
Graph *parse_or_fail(const char *text);
/* Writes text to path; fails the test when it cannot. */
void write_file(const char *path, const char *text);
/* Runs `cmd` through the shell, capturing stdout+stderr into a malloc'd
 * string (*out), returning the exit status (or -1). */
int run_cmd(const char *cmd, char **out);
/* run_cmd; fails the test, with the output, unless the exit status is 0. */
void run_or_fail(const char *cmd);
/* rm -rf dir (a scratch directory); its exit status. */
int remove_tree(const char *dir);
/* Fresh scratch directory under $TMPDIR (or /tmp); caller frees. */
char *scratch_dir(const char *tag);
/* Host data for every graph input of a model's step graph, indexed by tensor
 * id (NULL for op results): params in [-0.3, 0.3), state zero, "lr" 1e-3,
 * float data in [0, 1), integers in [0, 3] (valid tokens, classes and digits
 * for every model); deterministic. */
void **random_model_inputs(const Graph *g);
/* The model scripts: "models/NAME.lua" for every .lua file in models/
 * (tests run from the source root), sorted by name, NULL-terminated. Fails
 * the test when there are fewer than 4 (mlp, gpt, llama, addition): no
 * models/ directory, or a partial checkout. Free with free_model_paths. */
char **model_paths(void);
void free_model_paths(char **paths);
/* Runs a model script (fe_load_model); fails the test with the frontend's
 * message on error. */
Model *load_model(const char *path, const char *const *sets, int nsets);
/* Model m's step graph through the pass pipeline (rt_pass_opts, no memory
 * budget) with the attention pass off (g[0]) and on (g[1]); check(g, on,
 * arg), when given, looks at each graph after its pipeline. Both run one
 * step on the CPU backend (2 threads) from the same random inputs
 * (random_model_inputs, matched by name); every output named "grad.*", and
 * "loss" when loss, must agree within relative error tol, else the test
 * fails naming what and the output. Returns how many outputs it compared. */
int attn_on_off_compare(const Model *m, bool loss, double tol,
                        void (*check)(const Graph *g, int on, void *arg), void *arg,
                        const char *what);
/* ||a - b|| / max(||b||, 1): relative, absolute near zero; NaN or Inf
 * anywhere gives INFINITY. */
double rel_err_min1(const double *a, const double *b, int64_t n);
/* How many ops of g have code c. */
int count_ops(const Graph *g, Opcode c);
/* What main returns when a tool the test needs is absent: ctest reports the
 * test Skipped, not Passed (SKIP_RETURN_CODE, tests/CMakeLists.txt). */
#define TEST_SKIPPED 77
/* True when name is an executable file in a directory of $PATH. */
bool have_command(const char *name);

/* Tests whose binary also runs as MPI ranks. main returns
 * rank_test_main(argc, argv, "name", rank_main, test): under mpirun that
 * runs rank_main, whose return is the rank's exit status; else the cmocka
 * test `test` (the test Skipped without mpirun on PATH), which starts the
 * ranks with rank_test_launch. In rank_main, RANK_CHECK reports a failed
 * check and carries on (counting it in rank_nfail), and rank_verdict
 * gives every rank the number of failures on all of them, closes the
 * communicator and returns the exit status, so all close together. */
extern int rank_nfail;
#define RANK_CHECK(c, ...)                                                      \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "rank check failed at line %d: %s: ", __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            rank_nfail++;                                                       \
        }                                                                       \
    } while (0)
struct RtComm;
int rank_verdict(struct RtComm *c);
int rank_test_launch(int nranks); /* this binary as nranks ranks: mpirun's exit status */
int rank_test_main(int argc, char **argv, const char *name, int (*rank_main)(void),
                   void (*test)(void **state));

/* Out-of-range gather indices (docs/dsl.md: an index outside the table
 * reads zeros; scatter_add drops it), for every backend's test: inputs
 * tab f32[5,3], vec f32[5], idx i32[2,3] = {-1, 5, 1005, 2, INT32_MAX,
 * INT32_MIN} (only position 3, index 2, is in range), src f32[2,3,3];
 * outputs gather = tab[idx] f32[2,3,3], gvec = vec[idx] f32[2,3] and
 * scatter = scatter_add(idx, src) f32[5,3], in that order. */
enum { OOR_V = 5, OOR_R = 3, OOR_NI = 6 };
typedef struct {
    Graph *g;
    int in[4];       /* tab, vec, idx, src: tensor ids */
    void *host[4];   /* their data (f32, f32, i32, f32; malloc'd) */
    int64_t len[4];  /* their element counts */
    float *want[3];  /* the outputs' expected values (malloc'd) */
    int64_t nwant[3];
} GatherOor;
void gather_oor_build(GatherOor *c);
void gather_oor_free(GatherOor *c); /* the graph, host and want */
#endif
