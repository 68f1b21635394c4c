/*
 * train_cfg.h - what the training loop trains: its settings (TrainCfg) and
 * the model (Model: the forward and evaluation graphs, the settings, and
 * where they came from). These types belong to runtime/train (train.h
 * includes this header, and rt_train, rt_pass_opts, rt_lr_at and
 * dist/dp.c read them); the frontend fills them (fe_load_model, from a
 * model script's train{} and --set) and includes this header alone of the
 * runtime's, so the frontend depends on the runtime's types and never the
 * other way round. Depends on ir.h and passes.h (PassParamOpt) only.
 */
#ifndef KILN_TRAIN_CFG_H
#define KILN_TRAIN_CFG_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
#include "passes.h" /* PassParamOpt */

/* The training settings. The frontend's key table (frontend/settings.c:
 * name, type, offset, default, range) fills every field from train{} and
 * --set and prints them; a field added here needs its row there. */
typedef struct TrainCfg {
    int64_t steps; double lr, min_lr; int64_t warmup;   /* lr schedule: linear warmup, then lr_schedule */
    const char *lr_schedule;  /* "cosine" (default) to min_lr, "linear" to min_lr,
                                 "constant", "wsd" (stable, then linear to min_lr
                                 over the last decay_fraction of the steps) */
    double decay_fraction;    /* wsd: the decay's share of steps, (0, 1] */
    const char *optimizer;    /* "adamw" (default), "sgd", "lion", "adafactor" */
    double beta1, beta2, eps, weight_decay, grad_clip;
    double momentum;          /* sgd: 0 none */
    const char *nesterov;     /* sgd: "true" or "false" (default) */
    double lion_beta1, lion_beta2; /* lion */
    /* train{param_groups, frozen} resolved to params by name (the frontend
     * matches the Lua patterns; not a key of the table): nparam_opts
     * entries, NULL when none; owned by the Model's producer */
    const PassParamOpt *param_opts;
    int nparam_opts;
    uint64_t seed; int64_t batch;                        /* batch: informative, must equal the inputs' leading dim when given */
    const char *data;      /* "addition", "text", "tokens", "blobs", "tensors" */
    const char *data_path; /* file for text/tokens; file or .npy directory for tensors */
    const char *val_path;  /* tensors: the validation split's file or directory */
    const char *shuffle;   /* "true" (default) or "false": text, tokens and tensors
                              read in order (data.c: in_order) */
    int64_t digits;        /* addition task: digits per operand */
    double val_fraction; int64_t eval_every, eval_batches, log_every, checkpoint_every;
                           /* eval_batches: TRAIN_EVAL_ALL for "all": the whole
                              validation split (eval.c) */
    const char *checkpoint;   /* path prefix for checkpoints, NULL: none */
    int64_t memory_budget;    /* bytes, 0 none; accepts "512MiB", "2GiB" strings too */
    const char *precision;    /* "f32" (default) or "bf16" */
    const char *tf32;         /* "true": f32 GEMMs on TF32 tensor cores (cuda) */
    const char *cuda_graph;   /* "true": replay the step as a CUDA graph (cuda) */
    double bucket_mb;         /* comm: gradient bucket size cap in MiB */
    int64_t grad_accum;       /* micro-batches per step (>= 1); only the last reduces */
    int64_t zero;             /* 1: the optimizer's state (AdamW, SGD, Lion) sharded over the
                                 ranks (ZeRO-1); 0 or 1 */
    double comm_timeout;      /* seconds a collective may take before the ranks stop */
    const char *on_nonfinite; /* "stop" (default) or "skip": a step whose loss or
                                 gradient norm is not finite (never applied) */
    /* train{early_stop = {metric, patience, min_delta, mode}} (earlystop.c):
     * metric NULL: off; "val_loss", "accuracy" or an extra scalar output;
     * stop after `patience` evaluations without an improvement of more than
     * min_delta; mode "auto" (max for accuracy, else min), "min" or "max" */
    const char *early_stop_metric;
    int64_t early_stop_patience;
    double early_stop_min_delta;
    const char *early_stop_mode;
    const char *keep_best;    /* "true": PREFIX.best.safetensors, the checkpoint of the
                                 best evaluation (of early_stop's metric, else val_loss) */
    int64_t tp;               /* tensor-parallel ranks (>= 1): ranks = tp x dp, TP innermost */
    const char *sequence_parallel; /* "true": between the TP blocks, split along T */
    const char *tp_overlap;   /* "false": each TP collective waited for right after its
                                 start (ExecOpts.tp_no_overlap); "true" (default): at
                                 its first reader */
    const char *shard;        /* "auto": the compiler chooses the params' TP splits
                                 (passes/shard_auto.c); "script": the script's marks */
    int64_t pp;               /* pipeline stages (>= 1): ranks = tp x dp x pp, TP innermost, PP outermost (pp.c) */
    int64_t micro_batches;    /* micro-batches per step under pp (0: grad_accum's) */
    const char *schedule;     /* under pp: "1f1b" or "gpipe" (passes/stages.c) */
    const char *pp_balance;   /* under pp: "time" (kiln train --pp-balance, no train key):
                                 the cut balanced by measured time (dist/pp_balance.c);
                                 NULL or "cost": by the cost model */
    int64_t sample_every;     /* print a sample every N steps (0: never; sample.c) */
    const char *sample_prompt; /* its prompt: text (V <= 256) or token ids; NULL: default */
    int64_t sample_tokens;    /* its new tokens */
} TrainCfg;

/* train{eval_batches = "all"} */
#define TRAIN_EVAL_ALL (-1)

/* A param whose rows [rows, dim 0) are padding (padded_rows() in a model
 * script: a vocabulary padded to a multiple, docs/dsl.md): nothing reads
 * them into the loss, and importing weights of `rows` rows fills the real
 * rows and zeroes the rest. */
typedef struct {
    const char *param; /* interned name */
    int64_t rows;      /* real rows */
} ModelRowPad;

/* --init-map: what each tensor of an --init-from file becomes (the
 * frontend runs the map file, fe_init_map; runtime/train/initmap.c loads by
 * it). One entry per tensor of the file, in the file's order. */
typedef struct {
    const char *from; /* the file's tensor name */
    const char *to;   /* the model's param name; NULL: ignored (the map said false) */
    bool transpose;   /* swap the last two axes of the data (rank >= 2) */
    int line;         /* the map file's line that named it; -1: named by the map, line
                         unknown; 0: not in the map (the same name) */
} InitMapEntry;

typedef struct InitMap {
    const char *path; /* the map file, as given */
    InitMapEntry *v;  /* n entries; strings owned by the map */
    int n;
} InitMap;

/* A model to train. Whoever fills it owns it and frees it (the frontend:
 * fe_model_free); the loop only reads it. */
typedef struct Model {
    const char *path;  /* the script, as given: messages name it */
    Graph *g;          /* the forward graph of the training step: output "loss"
                          (a scalar float) and the named scalar outputs */
    Graph *eval_g;     /* the forward graph for evaluation, with every named
                          output (logits): built by a second run of the script
                          with nn.training = false (dropout off) when g draws
                          random numbers, else g before its outputs of more
                          than one element were dropped; NULL when g draws no
                          random numbers and has no such output (g serves);
                          declares exactly g's params, inputs and state */
    ModelRowPad *pads; /* padded params (padded_rows), npads of them */
    int npads;
    TrainCfg train;
    int train_line;    /* the line of path that set train (train{}); 0 if none:
                          the loop's settings errors point there */
    char *warnings;    /* lines for the user ("FILE:LINE: warning: ...\n" each),
                          NULL when none; the command line prints them once */
    struct ModelPriv *priv; /* the producer's own data (the frontend's config{}
                               values and the strings it owns); the runtime
                               never reads it */
} Model;

#endif
