/* plan_internal.h - what kiln plan's two files share (plan.c: the
 * arguments, compiling and measuring each variant; plan_print.c: the
 * table, the remat choice and the JSON). Internal to runtime/cli. */
#ifndef KILN_PLAN_INTERNAL_H
#define KILN_PLAN_INTERNAL_H

#include <cjson/cJSON.h>

#include "codegen.h"
#include "passes.h"

typedef struct {
    VEC(const char *) sets;
    const char *device;
    int gpus, gpus_per_node, tp, pp, dp, zero, micro_batches, threads;
    int64_t global_batch;
    double intra_bw, inter_bw, tokens, goodput, target_days, step_time, memory;
    const char *tokens_text; /* --tokens as given */
    bool no_overlap, json, pp_formulas;
    CgPipeSchedule schedule;
} PlanArgs;

/* A compiled variant's measurements, owning the bucket arrays and the
 * memory timeline. */
typedef struct {
    CgClusterModel m;
    double *bytes, *ready;
    int *coll;
    double *mem;
    double *tpb; /* the TP collectives' bytes and kinds (a partitioned step) */
    int *tpk;
    CgStageModel *stages; /* the stage cut's (measure_stages); NULL: none */
    double stage_scale;   /* what the stage programs' times were scaled by (1: none) */
    double *tph; /* and the compute that may hide each (tp_hide) */
} Variant;

/* The remat choice at the device's memory: the remat pass (auto) compiles
 * the step with the device's memory as its budget, each candidate measured
 * as the projection measures memory per GPU (cg_cluster_memory on the
 * candidate's memory plan), so the plan it chooses is one whose memory per
 * GPU fits, and the least feasible budget it names is memory per GPU. */
typedef struct {
    bool ran;          /* the memory is known and the params, grads and state fit it */
    bool fits;         /* the remat pass found a plan within the memory */
    double budget_act; /* activation bytes per GPU the memory leaves beside the
                          params, grads and optimizer state (the chosen plan's
                          when one fits, else the plan as compiled) */
    double act, total; /* the chosen plan's activations and memory per GPU */
    double step;       /* its predicted step */
    double least;      /* !fits: the least memory per GPU the pass found feasible; 0: unknown */
    RematReport rr;
    char why[256];
} RematChoice;

/* The count suffix c's meaning ("B: billions, 1e9"; plan.c's table of
 * K M G T P B); NULL: not a suffix. */
const char *cli_plan_count_unit(char c);

/* kiln plan's table (stdout), its remat choice as JSON, the whole plan as
 * JSON (plan_print.c). */
void cli_plan_remat_json(cJSON *j, const CgDevice *dev, const RematChoice *c);
void cli_plan_print(const PlanArgs *a, const CgDevice *dev, const CgClusterOpts *o,
                    const Variant *v, const CgClusterPlan *p, bool measured_link,
                    const RematChoice *rc, const char *cut_why);
cJSON *cli_plan_json(const CgDevice *dev, const CgClusterOpts *o, const Variant *v,
                     const CgClusterPlan *p, const char *cut_why);

#endif
