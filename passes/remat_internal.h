/* remat_internal.h - the selection model shared by the remat pass
 * (remat.c: the candidate model, rewriting, evaluation on the real plan)
 * and its solvers (remat_solve.c: the 0-1 integer program and LP bound with
 * GLPK, the greedy heuristic with local search). Included by those two
 * files only. */
#ifndef KILN_REMAT_INTERNAL_H
#define KILN_REMAT_INTERNAL_H
#include "passes.h"

#define REMAT_EXACT_MAX 250     /* activations up to which the integer program runs */

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

/* ---- remat.c ---- */
Sol pass_remat_sol_new(const Prob *P);
void pass_remat_sol_free(Sol *s);
void pass_remat_sol_copy(const Prob *P, Sol *dst, const Sol *src);
/* From s->keep: each group's recompute closure, the activations it forces
 * to be kept, and the totals (see remat.c). */
void pass_remat_derive(const Prob *P, Sol *s);
/* The keep set of a fixed policy (REMAT_NONE, REMAT_FULL, REMAT_SELECTIVE),
 * derived. */
void pass_remat_policy_keep(const Prob *P, int policy, Sol *s);

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
