/* remat.c - the remat pass: recomputation under a memory budget. The entry
 * point and the policies; one file per job:
 *   remat_model.c    the selection model (candidates, layers, attention,
 *                    solutions, fixed policies) and its cost model
 *   remat_solve.c    the solvers: 0-1 integer program and LP bound (GLPK),
 *                    greedy heuristic with local search
 *   remat_search.c   the search on the real plan (later passes + memplan)
 *   remat_rewrite.c  applying a solution: clones flagged OPF_RECOMPUTE
 *   remat_report.c   the RematReport, the budget sweep, formatting
 * They share remat_internal.h.
 *
 * An activation is a tensor computed by a forward op (no OPF_BACKWARD,
 * OPF_OPTIM or OPF_RECOMPUTE flag) that is neither a graph output nor an
 * update value; it is *saved* when a backward or optimizer op reads it. For
 * each activation the pass decides: keep (live from forward to its last
 * backward use) or recompute (a clone of its op, flagged OPF_RECOMPUTE, is
 * inserted just before the first backward op that needs it, reading kept
 * tensors or other clones). Random and collective ops are never recomputed:
 * when a recomputation needs one's result, that result is kept. Reshapes are
 * views and are never "kept" on their own: recomputing one is free.
 *
 * Minimise the recompute cost subject to every backward stage's memory <= M
 * (the model: remat_model.c). Exact: a 0-1 integer program (GLPK) for graphs
 * up to REMAT_EXACT_MAX activations; otherwise a greedy heuristic with local
 * search, whose gap to the LP relaxation's bound is reported. A budget is
 * checked against the real plan (remat_search.c): the final plan's arena is
 * within it, or the pass fails naming the smallest feasible budget found. */
#include "remat_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const policy_names[] = {"default", "none", "full", "selective", "auto"};

int pass_remat_parse_policy(const char *s)
{
    for (int i = REMAT_NONE; i <= REMAT_AUTO; i++)
        if (strcmp(s, policy_names[i]) == 0)
            return i;
    return -1;
}

const char *pass_remat_policy_name(int policy)
{
    return policy >= 0 && policy <= REMAT_AUTO ? policy_names[policy] : "?";
}

bool pass_remat(Graph *g, const PassOpts *o, Diag *d)
{
    int policy = o->remat;
    int64_t budget = o->memory_budget;
    if (policy == REMAT_DEFAULT)
        policy = budget > 0 ? REMAT_AUTO : REMAT_NONE;
    if (policy == REMAT_NONE && budget <= 0) {
        if (o->remat_report) {
            memset(o->remat_report, 0, sizeof *o->remat_report);
            o->remat_report->policy = o->remat_report->chosen = REMAT_NONE;
            o->remat_report->peak = -1;
        }
        return true;
    }
    Prob *P = pass_remat_prob_new(g);
    Sol s = pass_remat_sol_new(P);
    Evals E = {g, P, o, {0}, 0, 0, 0};
    char b0[32], b1[32], b2[32];
    bool ok = true;
    if (policy == REMAT_AUTO && budget <= 0) {
        /* auto without a budget: nothing to fit */
        pass_remat_policy_keep(P, REMAT_NONE, &s);
        pass_remat_report(o->remat_report, P, &s, REMAT_AUTO, REMAT_NONE, -1, false, 0);
    } else if (policy == REMAT_AUTO) {
        Choice c;
        if (pass_remat_search(&E, budget, o->remat_solver, &c)) {
            pass_remat_sol_copy(P, &s, &c.s);
            pass_remat_report(o->remat_report, P, &s, REMAT_AUTO, c.policy, c.peak, c.exact, c.gap);
        } else {
            int64_t smallest = pass_remat_smallest_real(&E);
            pass_remat_fmt_bytes(budget, b0, sizeof b0);
            pass_remat_fmt_bytes(smallest, b1, sizeof b1);
            snprintf(d->msg, sizeof d->msg,
                     "memory budget %s (%lld bytes) is infeasible: the smallest feasible "
                     "budget kiln found is %s (%lld bytes) (expected --memory-budget >= "
                     "%lld, got %lld)",
                     b0, (long long)budget, b1, (long long)smallest, (long long)smallest,
                     (long long)budget);
            ok = false;
        }
        pass_remat_sol_free(&c.s);
    } else {
        int64_t peak = -1;
        if (budget > 0) {
            peak = pass_remat_fixed_real(&E, policy, &s);
            if (peak < 0 || peak > budget) {
                Choice c;
                bool any = pass_remat_search(&E, budget, o->remat_solver, &c);
                pass_remat_sol_free(&c.s);
                int64_t smallest = any ? 0 : pass_remat_smallest_real(&E);
                pass_remat_fmt_bytes(budget, b0, sizeof b0);
                pass_remat_fmt_bytes(peak, b1, sizeof b1);
                pass_remat_fmt_bytes(smallest, b2, sizeof b2);
                snprintf(d->msg, sizeof d->msg,
                         "memory budget %s (%lld bytes) is infeasible with --remat=%s, whose "
                         "planned peak is %s (%lld bytes); %s%s",
                         b0, (long long)budget, pass_remat_policy_name(policy), b1,
                         (long long)peak,
                         any ? "--remat=auto fits it" : "the smallest feasible budget kiln "
                                                        "found is ",
                         any ? "" : b2);
                ok = false;
            }
        }
        pass_remat_policy_keep(P, policy, &s);
        if (ok)
            pass_remat_report(o->remat_report, P, &s, policy, policy, peak, false, 0);
    }
    if (ok)
        pass_remat_apply(g, P, &s);
    pass_remat_sol_free(&s);
    pass_remat_prob_free(P);
    return ok;
}
