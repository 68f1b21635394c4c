/* remat_internal.h - what the files of the remat pass share (remat.c
 * lists them): the selection model (Prob, Sol), the search state (Evals,
 * Choice) and each file's functions. Included by passes/remat*.c only. */
#ifndef KILN_REMAT_INTERNAL_H
#define KILN_REMAT_INTERNAL_H
#include "passes.h"

#define REMAT_EXACT_MAX 250     /* activations up to which the integer program runs */
#define REMAT_FLOPS 190e9       /* cost model: FLOP/s of the modelled machine (this CPU, 2 cores) */
#define REMAT_BW 20e9           /* cost model: bytes/s */

/* The candidates: activations (forward results that are not outputs or
 * update values), indexed 0..nv-1 in program order. */
typedef struct {
    const Graph *g;
    int nv;
    int *var;             /* per tensor: activation index, or -1 */
    int *vt;              /* per activation: tensor id */
    uint8_t *saved, *can_r, *can_k, *attn;
    int64_t *bytes;       /* aligned; 0 for reshapes */
    double *cost, *flops; /* recompute time (s) and FLOPs */
    int *layer;           /* -1 before the layers, 0..nlayers-1, nlayers: tail */
    int *in_off, *in_v;   /* CSR: activation operands of each activation's op */
    int *out_off, *out_v; /* CSR: activations whose op reads each activation */
    int *grp;             /* layer + 1: 0 before the layers, nlayers + 1 the tail */
    int nlayers, ngroups;
} Prob;

/* ---- solutions ------------------------------------------------------------
 * Stages: backward visits the groups in reverse (tail, last layer, ...,
 * first layer, before the layers). Group of an activation: its layer + 1
 * (0: before the layers; nlayers + 1: the tail). A recomputation serves
 * one group: the clones of group g are made for the saved activations of
 * layer g - 1 and live during stage g only; an activation needed by two
 * groups is recomputed twice. Model memory at stage g: kept activations of
 * groups <= g (still awaiting their backward) plus group g's clones. */

typedef struct {
    uint8_t *keep;       /* [nv] */
    uint8_t *r;          /* [ngroups * nv]: r[g * nv + v] */
    int64_t *memg;       /* [ngroups] */
    int64_t mem;         /* max over stages of memg */
    double cost, flops;
} Sol;

/* ---- remat_model.c ---- */
/* A forward op: none of OPF_BACKWARD, OPF_OPTIM, OPF_RECOMPUTE. */
bool pass_remat_is_fwd(const Op *op);
/* The candidates of g (g must outlive the Prob). */
Prob *pass_remat_prob_new(const Graph *g);
void pass_remat_prob_free(Prob *P);
Sol pass_remat_sol_new(const Prob *P);
void pass_remat_sol_free(Sol *s);
void pass_remat_sol_copy(const Prob *P, Sol *dst, const Sol *src);
/* From s->keep: each group's recompute closure, the activations it forces
 * to be kept, and the totals (see remat_model.c). */
void pass_remat_derive(const Prob *P, Sol *s);
/* The keep set of a fixed policy (REMAT_NONE, REMAT_FULL, REMAT_SELECTIVE),
 * derived. */
void pass_remat_policy_keep(const Prob *P, int policy, Sol *s);

/* ---- remat_rewrite.c ---- */
/* Applies s to g (see the file): clones, redirected reads, dead forward
 * ops dropped; g compacted. */
void pass_remat_apply(Graph *g, const Prob *P, const Sol *s);

/* ---- remat_search.c ---- */
typedef struct {
    Sol s;
    int64_t peak;
    int policy;   /* the fixed policy it came from, or REMAT_AUTO */
    bool exact;
    double gap;   /* heuristic: (cost - LP bound) / cost; 0 when exact; -1 unknown */
    bool found;
} Choice;

/* Real peaks of the fixed policies, computed once per Prob on demand. */
typedef struct {
    const Graph *g;
    const Prob *P;
    const PassOpts *o;
    int64_t fixed[REMAT_AUTO + 1]; /* by policy; 0: not yet known */
    int nreal;                     /* real evaluations run */
    int64_t least, least_mem;      /* the solver's least-memory plan: real peak, model */
} Evals;

/* The real peak (arena bytes) of a fixed policy, -1 when its plan fails;
 * t is scratch (left holding the policy's keep set). */
int64_t pass_remat_fixed_real(Evals *E, int policy, Sol *t);
/* The least real peak among the fixed policies and the solver's
 * least-memory plan: the smallest feasible budget kiln finds. */
int64_t pass_remat_smallest_real(Evals *E);
/* The cheapest candidate whose real peak fits budget, in *best (its s
 * allocated even when none fits: the caller frees it). False when none. */
bool pass_remat_search(Evals *E, int64_t budget, int solver, Choice *best);

/* ---- remat_report.c ---- */
/* "1.50 MiB" (two decimals past bytes) into buf. */
void pass_remat_fmt_bytes(int64_t b, char *buf, size_t n);
/* Fills r (when not NULL) from the chosen solution s. */
void pass_remat_report(RematReport *r, const Prob *P, const Sol *s, int asked, int chosen,
                       int64_t peak, bool exact, double gap);

/* ---- remat_solve.c ---- */
/* The cheapest plan whose model memory fits M: the exact program for
 * REMAT_SOLVER_EXACT, or under REMAT_SOLVER_AUTO for graphs up to
 * REMAT_EXACT_MAX activations, else (or when it runs out of branchings) the
 * heuristic. False when M is out of reach. *exact tells which solver
 * answered. */
bool pass_remat_solve_model(const Prob *P, int64_t M, int solver, Sol *s, bool *exact);
/* Exact: 1 optimal (s set), 0 infeasible, -1 not solved within the
 * branching limit (limited: false, no limit). */
int pass_remat_solve_exact(const Prob *P, int64_t M, Sol *s, bool limited);
/* Lower bound on the cost at memory M (LP relaxation); -1 when unknown. */
double pass_remat_lp_bound(const Prob *P, int64_t M);
#endif
