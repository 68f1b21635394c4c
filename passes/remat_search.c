/* remat_search.c - the remat search on the real plan.
 *
 * The budget is checked against the real plan: a candidate is applied to a
 * copy of the graph (pass_remat_apply), the passes the driver says run
 * after remat (o->after: fuse, comm, schedule, memplan in the pipeline) run
 * on it, and the final plan's arena_bytes (what the runtime allocates) is
 * compared with the budget. The auto policy
 * bisects the model's memory limit M over such real plans, and also
 * considers the fixed policies, taking the cheapest candidate that fits:
 * its plan is exactly the final one because the later passes are
 * deterministic. Real peaks of the fixed policies and of the solver's
 * least-memory plan are computed once per Evals. */
#include "remat_internal.h"

#include <stdlib.h>
#include <string.h>

#define REMAT_LP_MAX 4000       /* activations up to which the LP bound (stated gap) runs */
#define REMAT_BISECT_LARGE 8    /* bisection steps on large graphs (each a real plan) */
#define REMAT_BISECT_SMALL 10   /* bisection steps where the integer program runs */

/* The arena the runtime would allocate with solution s (or what
 * o->remat_measure makes of its plan): s applied to a copy of g, the later
 * passes (o->after) run, and the plan the memplan pass among them hands
 * back (pass_memplan when none does); -1 on failure. */
static int64_t eval_peak(const Graph *g, const Prob *P, const Sol *s, const PassOpts *o)
{
    Graph *c = ir_clone(g);
    pass_remat_apply(c, P, s);
    Diag d = {{0}};
    int64_t peak = -1;
    MemPlan *m = NULL;
    PassOpts po = *o;
    po.remat_report = NULL;
    po.memplan = &m;
    bool ok = true;
    for (int i = 0; ok && i < o->nafter; i++) {
        po.after = o->after + i + 1;
        po.nafter = o->nafter - i - 1;
        ok = o->after[i].run(c, &po, &d);
    }
    if (ok && !m)
        m = pass_memplan(c, &d);
    if (ok && m)
        peak = o->remat_measure ? o->remat_measure(c, m, o->remat_measure_ctx) : m->arena_bytes;
    pass_memplan_free(m);
    ir_free(c);
    return peak;
}

int64_t pass_remat_fixed_real(Evals *E, int policy, Sol *t)
{
    if (!E->fixed[policy]) {
        pass_remat_policy_keep(E->P, policy, t);
        E->fixed[policy] = eval_peak(E->g, E->P, t, E->o);
        E->nreal++;
    }
    return E->fixed[policy];
}

static void take(Choice *best, const Prob *P, const Sol *s, int64_t peak, int policy, bool exact)
{
    pass_remat_sol_copy(P, &best->s, s);
    best->peak = peak;
    best->policy = policy;
    best->exact = exact;
    best->gap = exact || policy != REMAT_AUTO ? 0 : -1;
    best->found = true;
}

/* The least real peak among the fixed policies and the solver's
 * least-memory plan: the smallest feasible budget kiln finds. */
int64_t pass_remat_smallest_real(Evals *E)
{
    Sol t = pass_remat_sol_new(E->P);
    int64_t sm = INT64_MAX;
    const int fixed[] = {REMAT_NONE, REMAT_SELECTIVE, REMAT_FULL};
    for (int k = 0; k < 3; k++) {
        int64_t pk = pass_remat_fixed_real(E, fixed[k], &t);
        if (pk >= 0 && pk < sm)
            sm = pk;
    }
    if (!E->least) {
        bool ex;
        pass_remat_solve_model(E->P, 0, REMAT_SOLVER_HEURISTIC, &t, &ex);
        E->least = eval_peak(E->g, E->P, &t, E->o);
        E->least_mem = t.mem;
        E->nreal++;
    }
    if (E->least >= 0 && E->least < sm)
        sm = E->least;
    pass_remat_sol_free(&t);
    return sm;
}

/* The cheapest candidate whose real peak fits `budget`: no recompute when
 * that fits; else the solver's plan for the largest kept-bytes limit M
 * whose real plan fits (bisection between the least memory the solver
 * reaches and keeping everything; each step runs the later passes and
 * memplan); a fixed policy instead when it fits and is cheaper. */
bool pass_remat_search(Evals *E, int64_t budget, int solver, Choice *best)
{
    const Prob *P = E->P;
    best->found = false;
    best->s = pass_remat_sol_new(P);
    Sol t = pass_remat_sol_new(P);
    bool ex;
    int64_t pk = pass_remat_fixed_real(E, REMAT_NONE, &t);
    if (pk >= 0 && pk <= budget) {
        pass_remat_policy_keep(P, REMAT_NONE, &t);
        take(best, P, &t, pk, REMAT_NONE, false);
        pass_remat_sol_free(&t);
        return true;
    }
    pass_remat_policy_keep(P, REMAT_NONE, &t);
    int64_t hi = t.mem;
    pass_remat_smallest_real(E);
    int64_t lo = E->least_mem;
    if (E->least >= 0 && E->least <= budget) {
        pass_remat_solve_model(P, 0, REMAT_SOLVER_HEURISTIC, &t, &ex);
        take(best, P, &t, E->least, REMAT_AUTO, false);
        int iters = P->nv <= REMAT_EXACT_MAX ? REMAT_BISECT_SMALL : REMAT_BISECT_LARGE;
        /* exact answers so far: the optimum at limit M keeping s.mem bytes
         * is the optimum at every limit in [s.mem, M] too, so a later probe
         * in that range reuses it (and its real peak) instead of solving */
        enum { NMEMO = 16 };
        Sol memo[NMEMO];
        int64_t memo_m[NMEMO], memo_pk[NMEMO];
        int nmemo = 0;
        for (int it = 0; it < iters && hi - lo > MEMPLAN_ALIGN; it++) {
            int64_t mid = lo + (hi - lo) / 2;
            int hit = -1;
            for (int j = 0; j < nmemo && hit < 0; j++)
                if (memo[j].mem <= mid && mid <= memo_m[j])
                    hit = j;
            if (hit >= 0) {
                pass_remat_sol_copy(P, &t, &memo[hit]);
                ex = true;
                pk = memo_pk[hit];
            } else {
                if (!pass_remat_solve_model(P, mid, solver, &t, &ex)) {
                    lo = mid;
                    continue;
                }
                pk = eval_peak(E->g, P, &t, E->o);
                E->nreal++;
                if (ex && nmemo < NMEMO) {
                    memo[nmemo] = pass_remat_sol_new(P);
                    pass_remat_sol_copy(P, &memo[nmemo], &t);
                    memo_m[nmemo] = mid;
                    memo_pk[nmemo++] = pk;
                }
            }
            if (pk >= 0 && pk <= budget) {
                lo = mid;
                if (t.cost <= best->s.cost)
                    take(best, P, &t, pk, REMAT_AUTO, ex);
            } else {
                hi = mid;
            }
        }
        for (int j = 0; j < nmemo; j++)
            pass_remat_sol_free(&memo[j]);
    }
    /* fixed policies that could be cheaper */
    const int fixed[] = {REMAT_SELECTIVE, REMAT_FULL};
    for (int k = 0; k < 2; k++) {
        pass_remat_policy_keep(P, fixed[k], &t);
        if (best->found && t.cost >= best->s.cost)
            continue;
        pk = pass_remat_fixed_real(E, fixed[k], &t);
        pass_remat_policy_keep(P, fixed[k], &t);
        if (pk >= 0 && pk <= budget)
            take(best, P, &t, pk, fixed[k], false);
    }
    pass_remat_sol_free(&t);
    if (best->found && best->policy == REMAT_AUTO && !best->exact && best->s.cost > 0 &&
        P->nv <= REMAT_LP_MAX) {
        double b = pass_remat_lp_bound(P, best->s.mem);
        best->gap = b >= 0 ? (best->s.cost - b) / best->s.cost : -1;
    }
    return best->found;
}
