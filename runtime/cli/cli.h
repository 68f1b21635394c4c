/*
 * cli.h - the `kiln` command (runtime/cli/): main.c picks the command and
 * holds the flag parsing the commands share; one file per command
 * (compile.c, train.c, opt.c, infer.c, sample.c, plan.c) parses its flags
 * and drives the compiler or the training loop; summary.c prints what
 * `kiln compile` reports.
 */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stddef.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"

/* "--flag VALUE" or "--flag=VALUE" at argv[*i]: the value, with *i past
 * it; NULL when argv[*i] is another flag. A flag without its value prints
 * so and exits 2. */
const char *cli_flag_value(int argc, char **argv, int *i, const char *flag);
/* Prints "kiln CMD: MSG: ARG" and the pointer to `kiln CMD --help` to
 * stderr; returns 2 (a bad command line). */
int cli_bad_flag(const char *cmd, const char *msg, const char *arg);

/* The ranges of the integer flags (docs/cli.md). */
#define CLI_MAX_STEPS 1000000000 /* as train.steps */
#define CLI_MAX_THREADS 256      /* the CPU backend's thread pool */
#define CLI_MAX_NPROC 1024

/* An integer flag's value from lo to hi into *out; false after printing
 * "kiln CMD: FLAG: expected an integer from LO to HI, got V" (no
 * wrap-around: 4294967297 is not 1). */
bool cli_int_flag(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi,
                  int64_t *out);
/* --memory-budget SIZE: bytes, or -1 after printing the error. */
int64_t cli_parse_budget(const char *cmd, const char *v);

/* `kiln compile`, `kiln train` and `kiln opt` (compile.c, train.c, opt.c):
 * the exit code. */
int cli_compile(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_opt(int argc, char **argv);
/* "12.000 M", "32.057 MFLOP" (byte counts: ir_fmt_bytes with 2 decimals) */
void cli_human_count(double x, char *buf, size_t n);
void cli_human_flops(double x, char *buf, size_t n);
/* The recompute set remat chose (r), against the step's FLOPs (g). */
void cli_print_remat(const RematReport *r, const Graph *g, int64_t budget);
/* Params, ops per class (forward, backward, optimizer, recompute), FLOPs
 * per step and of the forward graph, bytes moved, the planned peak (mp may
 * be NULL). */
void cli_print_summary(const Model *m, const Graph *fwd_g, const Graph *g, const MemPlan *mp);
/* Under tensor parallelism (a param split over more than one rank): this
 * rank's params, gradients and optimizer state against tp = 1's, and the
 * step's TP collectives by kind; nothing otherwise. */
void cli_print_tp(const Graph *g);
/* Kernel launches and bytes moved per step, unfused (the same pipeline
 * with --no-fuse) and fused (g); false after printing a pipeline error. */
bool cli_print_fusion(const Model *m, const Graph *g, const PassOpts *po);

/* --target DEVICE (a GPU of cg_devices, or "cpu": this machine, measured
 * once on `threads` threads): the cost model's prediction of the step g
 * (after every pass), with the model's precision, tf32 and cuda_graph
 * settings; false after printing why it cannot. */
/* The cost model's options from the model's train settings (precision,
 * tf32, cuda_graph; all off on the CPU). */
CgPredictOpts cli_predict_opts(const Model *m, const CgDevice *dev);
/* With cal (read from cal_path), then the calibration against it
 * (cg_calibrate); ktable: also write the predicted per-kernel table there
 * (NULL: none). */
bool cli_print_prediction(const Model *m, const Graph *g, const char *target, int threads,
                          const char *cache_dir, bool remeasure, int top,
                          const CgKernelTable *cal, const char *cal_path, const char *ktable);

/* shard.c: with the train key shard = "auto" and po->tp > 1, the params'
 * TP splits chosen by pass_shard_auto on m->g (and copied to m->eval_g),
 * costed on dev (NULL: h100; kiln train: cli_shard_device's) with alpha_s
 * per ring hop; *text: the report (the caller frees it;
 * NULL when nothing ran). False with d set where no choice is found. */
bool cli_shard_auto(Model *m, const PassOpts *po, const CgDevice *dev, double alpha_s,
                    char **text, Diag *d);
/* The device kiln train's shard=auto costs on, *dev: the run's. --device
 * cpu (or auto without a GPU): this CPU's figures (into cpu) for the
 * threads each of `local` ranks on the machine gets (threads > 0: those),
 * measured once and cached; cuda: NULL (cli_shard_auto's h100: the GPU is
 * known only once its backend opens). Nothing unless shard=auto and tp > 1.
 * The launcher calls it before the ranks start, so that the figures are in
 * the cache and every rank reads the same ones (the ranks must choose
 * alike). False with d set where the CPU cannot be measured. */
bool cli_shard_device(const Model *m, const char *device, int threads, int local,
                      const char *cache_dir, CgDevice *cpu, const CgDevice **dev, Diag *d);

/* The frontend's warnings about m (unused params, ...) on stderr: once per
 * run, so not in --nproc ranks other than rank 0. */
void cli_print_warnings(const Model *m);

/* --init-map (initmap.c): the map file run over the tensors of the weights
 * file (fe_init_map); NULL after printing the error. */
InitMap *cli_init_map(const char *weights, const char *map_path);

/* `kiln eval` and `kiln predict` (infer.c): the exit code. */
int cli_eval(int argc, char **argv);
int cli_predict(int argc, char **argv);
/* `kiln sample` (sample.c): the exit code. */
int cli_sample(int argc, char **argv);
/* kiln compile --target: the cost model's time of the one-token decode step
 * (the script at path in decode mode, S = 1) of a language model m, one
 * line; nothing for other models. false after printing an error. */
bool cli_print_decode_prediction(const Model *m, const char *path, const char *const *sets,
                                 int nsets, const char *target, int threads,
                                 const char *cache_dir);

/* `kiln plan MODEL.lua [options]` (plan.c): the exit code. */
int cli_plan(int argc, char **argv);

#endif
