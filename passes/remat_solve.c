/* remat_solve.c - the solvers of the remat pass: given the candidate model
 * (remat_internal.h) and a limit M on model memory, choose the keep set of
 * least recompute cost.
 *
 * Exact: a 0-1 integer program (GLPK) for graphs up to REMAT_EXACT_MAX
 * activations, with a branching limit. Otherwise: a greedy heuristic from
 * several starts with local search (re-keep, add-then-repair, exchanges),
 * its effort counted in trial moves, not time, so the same graph always
 * gives the same plan; the LP relaxation gives the lower bound on the cost
 * that the pass reports the heuristic's gap against. */
#include "remat_internal.h"

#include <glpk.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REMAT_EXACT_NODES 2000  /* its branching limit; past it the heuristic's answer stands */
#define REMAT_REKEEP 48         /* large graphs: re-keep candidates tried */
#define REMAT_WORK_SMALL 400000 /* local search per heuristic solve, in trial moves */
#define REMAT_WORK_LARGE 40

/* ---- the heuristic -------------------------------------------------------- */

static int64_t excess(const int64_t *memg, int G, int64_t M)
{
    int64_t e = 0;
    for (int g = 0; g < G; g++)
        if (memg[g] > M)
            e += memg[g] - M;
    return e;
}

typedef struct {
    int *mark, stamp; /* per (group, activation): visited by the current trial */
    int *fmark;       /* per activation: forced keep counted by the current trial */
    int *stack;
    int64_t *memg;    /* trial stage memory */
} Scratch;

/* Stage memory and added seconds if kept activation v were dropped: v and
 * what it needs are recomputed in every group that reads v (its own when it
 * is saved, and each group with a recomputation reading it). */
static double drop_trial(const Prob *P, const Sol *s, int v, Scratch *w, Sol *out)
{
    int nv = P->nv, G = P->ngroups;
    memcpy(w->memg, s->memg, sizeof(int64_t) * (size_t)G);
    w->stamp++;
    for (int g = P->grp[v]; g < G; g++)
        w->memg[g] -= P->bytes[v];
    double dc = 0;
    for (int g = P->grp[v]; g < G; g++) {
        const uint8_t *r = s->r + (size_t)g * (size_t)nv;
        bool needed = g == P->grp[v] && P->saved[v];
        for (int k = P->out_off[v]; k < P->out_off[v + 1] && !needed; k++)
            needed = r[P->out_v[k]];
        if (!needed)
            continue;
        int sp = 0;
        w->stack[sp++] = v;
        w->mark[g * nv + v] = w->stamp;
        while (sp) {
            int u = w->stack[--sp];
            if (u != v && !P->can_r[u]) {
                if (w->fmark[u] != w->stamp) {
                    w->fmark[u] = w->stamp;
                    for (int h = P->grp[u]; h < G; h++)
                        w->memg[h] += P->bytes[u];
                    if (out)
                        out->keep[u] = 1;
                }
                continue;
            }
            dc += P->cost[u];
            w->memg[g] += P->bytes[u];
            if (out) {
                out->r[g * nv + u] = 1;
                out->flops += P->flops[u];
            }
            for (int k = P->in_off[u]; k < P->in_off[u + 1]; k++) {
                int x = P->in_v[k];
                if ((s->keep[x] && x != v) || r[x] || w->mark[g * nv + x] == w->stamp)
                    continue;
                w->mark[g * nv + x] = w->stamp;
                w->stack[sp++] = x;
            }
        }
    }
    if (out) {
        out->keep[v] = 0;
        out->cost += dc;
        memcpy(out->memg, w->memg, sizeof(int64_t) * (size_t)G);
        out->mem = 0;
        for (int g = 0; g < G; g++)
            if (out->memg[g] > out->mem)
                out->mem = out->memg[g];
    }
    return dc;
}

/* Greedy: from keeping every saved activation, drop the kept activation
 * that removes the most stage memory above M per second of recompute, until
 * every stage fits; then re-keep recomputed activations, most expensive per
 * byte first, while the plan still fits and gets cheaper. Returns false
 * (s = the least memory reached) when M is out of reach. */
static bool greedy(const Prob *P, int64_t M, Sol *s, int protect, double alpha)
{
    int nv = P->nv, G = P->ngroups;
    Scratch w = {xcalloc((size_t)nv * (size_t)G + 1, sizeof(int)), 0,
                 xcalloc((size_t)nv + 1, sizeof(int)), xmalloc(sizeof(int) * (size_t)(nv + 1)),
                 xmalloc(sizeof(int64_t) * (size_t)G)};
    int stuck = 0; /* keep moves made (large graphs: at most 2) */
    while (s->mem > M) {
        int64_t ex0 = excess(s->memg, G, M);
        int best = -1;
        double best_score = 0;
        for (int v = 0; v < nv; v++) {
            if (!s->keep[v] || !P->can_r[v] || !P->bytes[v] || v == protect)
                continue;
            double dc = drop_trial(P, s, v, &w, NULL);
            int64_t gain = ex0 - excess(w.memg, G, M);
            if (gain <= 0)
                continue;
            double score = (double)gain / pow(dc + 1e-12, alpha);
            if (best < 0 || score > best_score) {
                best = v;
                best_score = score;
            }
        }
        if (best >= 0) {
            drop_trial(P, s, best, &w, s); /* incremental; pass_remat_derive() at the end */
            continue;
        }
        /* stuck: keep a recomputed activation (typically a small result of
         * an expensive op) if that shrinks the recompute sets enough */
        pass_remat_derive(P, s);
        if (s->mem <= M || (nv > REMAT_EXACT_MAX && ++stuck > 2))
            break;
        Sol t = pass_remat_sol_new(P);
        int64_t best_gain = 0;
        for (int v = 0; v < nv; v++) {
            bool rec = false;
            for (int g = 0; g < G && !rec; g++)
                rec = s->r[g * nv + v];
            if (!rec || !P->can_k[v])
                continue;
            pass_remat_sol_copy(P, &t, s);
            t.keep[v] = 1;
            pass_remat_derive(P, &t);
            int64_t gain = ex0 - excess(t.memg, G, M);
            if (gain > best_gain) {
                best_gain = gain;
                best = v;
            }
        }
        pass_remat_sol_free(&t);
        if (best < 0)
            break;
        s->keep[best] = 1;
        pass_remat_derive(P, s);
    }
    pass_remat_derive(P, s);
    free(w.mark);
    free(w.fmark);
    free(w.stack);
    free(w.memg);
    return s->mem <= M;
}

/* Re-keep recomputed activations, most expensive per byte first, while the
 * plan still fits M and gets cheaper. */
static void rekeep(const Prob *P, int64_t M, Sol *s)
{
    int nv = P->nv, G = P->ngroups;
    double *ratio = xmalloc(sizeof(double) * (size_t)(nv + 1));
    int *cand = xmalloc(sizeof(int) * (size_t)(nv + 1));
    int nc = 0;
    for (int v = 0; v < nv; v++) {
        double c = 0;
        for (int g = 0; g < G; g++)
            c += s->r[g * nv + v] ? P->cost[v] : 0;
        if (c > 0 && P->can_k[v] && P->bytes[v]) {
            ratio[v] = c / (double)P->bytes[v];
            cand[nc++] = v;
        }
    }
    for (int i = 1; i < nc; i++) { /* insertion sort, ratio descending */
        int x = cand[i], j = i - 1;
        while (j >= 0 && ratio[cand[j]] < ratio[x]) {
            cand[j + 1] = cand[j];
            j--;
        }
        cand[j + 1] = x;
    }
    Sol t = pass_remat_sol_new(P);
    if (nv > REMAT_EXACT_MAX && nc > REMAT_REKEEP)
        nc = REMAT_REKEEP; /* large graphs: the most expensive per byte only */
    for (int i = 0; i < nc; i++) {
        int v = cand[i];
        if (s->keep[v])
            continue;
        pass_remat_sol_copy(P, &t, s);
        t.keep[v] = 1;
        pass_remat_derive(P, &t);
        if (t.mem <= M && t.cost < s->cost)
            pass_remat_sol_copy(P, s, &t);
    }
    pass_remat_sol_free(&t);
    free(cand);
    free(ratio);
}

/* Add-then-repair moves: keep one of the most expensive recomputed
 * activations (every one on small graphs, REMAT_SWAPS on large ones),
 * drop others greedily until the plan fits again;
 * accept when cheaper; repeat while something improves. work_left: the
 * local-search effort for this start, in trial moves (a count, not a time,
 * so that the same graph always gives the same plan). */
#define REMAT_SWAPS 4
static void improve(const Prob *P, int64_t M, Sol *s, long work_left)
{
    int nv = P->nv, G = P->ngroups;
    Sol t = pass_remat_sol_new(P);
    int rounds = nv <= REMAT_EXACT_MAX ? 4 : 1;
    for (int round = 0; round < rounds; round++) {
        bool better = false;
        uint8_t *tried = xcalloc((size_t)nv + 1, 1);
        int nswaps = nv <= REMAT_EXACT_MAX ? nv : REMAT_SWAPS;
        for (int k = 0; k < nswaps && work_left-- > 0; k++) {
            int best = -1;
            double bc = 0;
            for (int v = 0; v < nv; v++) {
                if (tried[v] || s->keep[v] || !P->can_k[v])
                    continue;
                double c = 0;
                for (int g = 0; g < G; g++)
                    c += s->r[g * nv + v] ? P->cost[v] : 0;
                if (c > bc) {
                    bc = c;
                    best = v;
                }
            }
            if (best < 0)
                break;
            tried[best] = 1;
            pass_remat_sol_copy(P, &t, s);
            t.keep[best] = 1;
            pass_remat_derive(P, &t);
            if (!greedy(P, M, &t, best, 1.0))
                continue;
            rekeep(P, M, &t);
            if (t.cost < s->cost * (1 - 1e-9)) {
                pass_remat_sol_copy(P, s, &t);
                better = true;
            }
        }
        free(tried);
        /* small graphs: drop-then-refill (drop kept u, re-keep what fits) */
        for (int u = 0; u < nv && nv <= REMAT_EXACT_MAX && work_left-- > 0; u++) {
            if (!s->keep[u] || !P->can_r[u] || !P->bytes[u])
                continue;
            pass_remat_sol_copy(P, &t, s);
            t.keep[u] = 0;
            pass_remat_derive(P, &t);
            if (t.mem > M)
                continue;
            /* refill: prefer re-keeping anything but u */
            t.keep[u] = 0;
            rekeep(P, M, &t);
            if (t.cost < s->cost * (1 - 1e-9)) {
                pass_remat_sol_copy(P, s, &t);
                better = true;
            }
        }
        /* small graphs: every one-for-one exchange (keep v, drop u) */
        for (int v = 0; v < nv && nv <= REMAT_EXACT_MAX; v++) {
            bool rec = false;
            for (int g = 0; g < G && !rec; g++)
                rec = s->r[g * nv + v];
            if (!rec || !P->can_k[v])
                continue;
            for (int u = 0; u < nv && work_left-- > 0; u++) {
                if (!s->keep[u] || !P->can_r[u] || u == v)
                    continue;
                pass_remat_sol_copy(P, &t, s);
                t.keep[v] = 1;
                t.keep[u] = 0;
                pass_remat_derive(P, &t);
                if (t.mem > M)
                    continue;
                rekeep(P, M, &t);
                if (t.cost < s->cost * (1 - 1e-9)) {
                    pass_remat_sol_copy(P, s, &t);
                    better = true;
                    break;
                }
            }
        }
        if (!better)
            break;
    }
    pass_remat_sol_free(&t);
}

static glp_prob *build_lp(const Prob *P, int64_t M, bool integer);

/* Start from the LP relaxation rounded: keep what the LP keeps at least
 * half. False when the LP has no solution. */
static bool lp_start(const Prob *P, int64_t M, Sol *s, double threshold)
{
    glp_term_out(GLP_OFF);
    glp_prob *lp = build_lp(P, M, false);
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.presolve = GLP_ON;
    bool ok = glp_simplex(lp, &parm) == 0 && glp_get_status(lp) == GLP_OPT;
    if (ok) {
        for (int v = 0; v < P->nv; v++)
            s->keep[v] = glp_get_col_prim(lp, v + 1) >= threshold;
        pass_remat_derive(P, s);
    }
    glp_delete_prob(lp);
    return ok;
}

/* The greedy from three starts (keep every saved activation; the full and
 * the selective policies' keep sets), and on small graphs from the rounded
 * LP relaxation; the cheapest plan that fits, else the least memory
 * reached. */
static bool solve_heuristic(const Prob *P, int64_t M, Sol *s)
{
    bool small = P->nv <= REMAT_EXACT_MAX;
    /* local search effort per start (13 starts on small graphs, 2 on large) */
    long per_start = small ? REMAT_WORK_SMALL / 13 : REMAT_WORK_LARGE / 2;
    const int starts[] = {REMAT_NONE, REMAT_FULL, REMAT_SELECTIVE};
    Sol t = pass_remat_sol_new(P), second = pass_remat_sol_new(P);
    bool found = false, have2 = false;
    /* keeps the best plan that fits in s and the runner-up in second */
    #define OFFER()                                                            \
        do {                                                                   \
            if (!found || t.cost < s->cost) {                                  \
                if (found) {                                                   \
                    pass_remat_sol_copy(P, &second, s);                                   \
                    have2 = true;                                              \
                }                                                              \
                pass_remat_sol_copy(P, s, &t);                                            \
            } else if (!have2 || t.cost < second.cost) {                       \
                pass_remat_sol_copy(P, &second, &t);                                      \
                have2 = true;                                                  \
            }                                                                  \
            found = true;                                                      \
        } while (0)
    /* small graphs: also from the LP relaxation, rounded at a few levels */
    const double th[] = {0.5, 0.25, 0.75, 0.999};
    for (int k = 0; k < 4 && small; k++) {
        if (!lp_start(P, M, &t, th[k]))
            break;
        for (int a = 0; a < 8 && t.mem > M; a++)
            greedy(P, (int64_t)((double)M * (1 - 0.04 * a)), &t, -1, 1.0);
        if (t.mem <= M) {
            rekeep(P, M, &t);
            improve(P, M, &t, per_start);
            OFFER();
        }
    }
    /* scores: bytes per second, and leaning towards big or cheap drops */
    const double alphas[] = {1.0, 0.5, 2.0};
    int nalpha = small ? 3 : 1, nstart = small ? 3 : 2;
    for (int k = 0; k < 3 * nalpha; k++) {
        if (k % 3 >= nstart)
            continue;
        /* the greedy can stall above M: aim lower, then spend the slack */
        bool ok = false;
        pass_remat_policy_keep(P, starts[k % 3], &t);
        for (int a = 0; a < 8 && !ok; a++) {
            greedy(P, (int64_t)((double)M * (1 - 0.04 * a)), &t, -1, alphas[k / 3]);
            ok = t.mem <= M;
        }
        if (ok) {
            rekeep(P, M, &t);
            improve(P, M, &t, per_start);
            OFFER();
        } else if (!found && (k == 0 || t.mem < s->mem)) {
            pass_remat_sol_copy(P, s, &t); /* the least memory reached */
        }
    }
    #undef OFFER
    pass_remat_sol_free(&t);
    pass_remat_sol_free(&second);
    return found;
}

/* ---- the integer program -------------------------------------------------- */

typedef VEC(int) IntVec;
typedef VEC(double) DblVec;

static void nz(IntVec *ia, IntVec *ja, DblVec *ar, int row, int col, double val)
{
    vec_push(ia, row);
    vec_push(ja, col);
    vec_push(ar, val);
}

/* min sum cost_v r_vg  s.t.  keep_v + r_v,grp(v) >= 1 per saved v;
 * keep_u + r_ug >= r_vg per activation operand u of v; per stage g:
 * sum over grp(v) <= g of bytes_v keep_v + sum_v bytes_v r_vg <= M.
 * Columns: keep_v = v + 1; r_vg = nv + g * nv + v + 1 (fixed at 0 where
 * g < grp(v) or v cannot be recomputed). Costs in microseconds, bytes in
 * MiB. */
static glp_prob *build_lp(const Prob *P, int64_t M, bool integer)
{
    int nv = P->nv, G = P->ngroups;
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, nv + G * nv);
    for (int v = 0; v < nv; v++) {
        int ck = v + 1;
        if (integer)
            glp_set_col_kind(lp, ck, GLP_BV);
        if (P->can_k[v])
            glp_set_col_bnds(lp, ck, GLP_DB, 0, 1);
        else
            glp_set_col_bnds(lp, ck, GLP_FX, 0, 0);
        /* a vanishing price on memory so that nothing is kept for nothing */
        glp_set_obj_coef(lp, ck, (double)P->bytes[v] * 1e-15);
        for (int g = 0; g < G; g++) {
            int cr = nv + g * nv + v + 1;
            if (integer)
                glp_set_col_kind(lp, cr, GLP_BV);
            if (P->can_r[v] && g >= P->grp[v])
                glp_set_col_bnds(lp, cr, GLP_DB, 0, 1);
            else
                glp_set_col_bnds(lp, cr, GLP_FX, 0, 0);
            glp_set_obj_coef(lp, cr, P->cost[v] * 1e6);
        }
    }
    IntVec ia = {0}, ja = {0};
    DblVec ar = {0};
    nz(&ia, &ja, &ar, 0, 0, 0);
    int row;
    for (int v = 0; v < nv; v++) {
        if (P->saved[v]) {
            row = glp_add_rows(lp, 1);
            glp_set_row_bnds(lp, row, GLP_LO, 1, 0);
            nz(&ia, &ja, &ar, row, v + 1, 1.0);
            nz(&ia, &ja, &ar, row, nv + P->grp[v] * nv + v + 1, 1.0);
        }
        if (!P->can_r[v])
            continue;
        for (int k = P->in_off[v]; k < P->in_off[v + 1]; k++) {
            int u = P->in_v[k];
            bool dup = false;
            for (int q = P->in_off[v]; q < k; q++)
                dup |= P->in_v[q] == u;
            if (dup)
                continue;
            for (int g = P->grp[v]; g < G; g++) {
                row = glp_add_rows(lp, 1);
                glp_set_row_bnds(lp, row, GLP_LO, 0, 0);
                nz(&ia, &ja, &ar, row, u + 1, 1.0);
                nz(&ia, &ja, &ar, row, nv + g * nv + u + 1, 1.0);
                nz(&ia, &ja, &ar, row, nv + g * nv + v + 1, -1.0);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_UP, 0, (double)M / 1048576.0);
        for (int v = 0; v < nv; v++) {
            if (!P->bytes[v])
                continue;
            if (P->grp[v] <= g)
                nz(&ia, &ja, &ar, row, v + 1, (double)P->bytes[v] / 1048576.0);
            if (P->can_r[v] && g >= P->grp[v])
                nz(&ia, &ja, &ar, row, nv + g * nv + v + 1, (double)P->bytes[v] / 1048576.0);
        }
    }
    glp_load_matrix(lp, ia.n - 1, ia.v, ja.v, ar.v);
    vec_free(&ia);
    vec_free(&ja);
    vec_free(&ar);
    return lp;
}

/* Stops branch and bound after REMAT_EXACT_NODES branchings: a count, not
 * a time, so that the same graph always gives the same plan. */
static void count_branches(glp_tree *T, void *info)
{
    long *n = info;
    if (glp_ios_reason(T) == GLP_IBRANCH && ++*n > REMAT_EXACT_NODES)
        glp_ios_terminate(T);
}

/* Exact: returns 1 optimal (s set), 0 infeasible, -1 not solved within the
 * branching limit (limited: false, no limit). */
int pass_remat_solve_exact(const Prob *P, int64_t M, Sol *s, bool limited)
{
    long branches = 0;
    glp_term_out(GLP_OFF);
    glp_prob *lp = build_lp(P, M, true);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    if (limited) {
        parm.cb_func = count_branches;
        parm.cb_info = &branches;
    }
    parm.mip_gap = 0;
    int rc = glp_intopt(lp, &parm), st = glp_mip_status(lp);
    int res;
    if (rc == GLP_ENOPFS || rc == GLP_ENODFS || st == GLP_NOFEAS) {
        res = 0;
    } else if (rc == 0 && st == GLP_OPT) {
        /* the keep set determines the closures; derive recomputes exactly
         * what the program's r columns must contain at the optimum */
        for (int v = 0; v < P->nv; v++)
            s->keep[v] = glp_mip_col_val(lp, v + 1) > 0.5;
        pass_remat_derive(P, s);
        res = s->mem <= M ? 1 : -1;
    } else {
        res = -1;
    }
    glp_delete_prob(lp);
    return res;
}

/* Lower bound on the cost at memory M (LP relaxation); -1 when unknown. */
double pass_remat_lp_bound(const Prob *P, int64_t M)
{
    glp_term_out(GLP_OFF);
    glp_prob *lp = build_lp(P, M, false);
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = GLP_MSG_OFF;
    parm.presolve = GLP_ON;
    double b = -1;
    if (glp_simplex(lp, &parm) == 0 && glp_get_status(lp) == GLP_OPT)
        b = glp_get_obj_val(lp) * 1e-6;
    glp_delete_prob(lp);
    return b;
}

/* Solver choice: REMAT_SOLVER_AUTO runs the exact program for small graphs
 * and falls back to the heuristic. *exact tells which answered. */
bool pass_remat_solve_model(const Prob *P, int64_t M, int solver, Sol *s, bool *exact)
{
    *exact = false;
    if (solver == REMAT_SOLVER_EXACT ||
        (solver == REMAT_SOLVER_AUTO && P->nv <= REMAT_EXACT_MAX)) {
        int r = pass_remat_solve_exact(P, M, s, solver != REMAT_SOLVER_EXACT);
        if (r == 1) {
            *exact = true;
            return true;
        }
        if (r == 0)
            return false;
    }
    return solve_heuristic(P, M, s);
}

/* ---- the selection problem alone (tests, bench) ---------------------------- */

bool pass_remat_solve(const Graph *g, int64_t kept_limit, int solver, double *cost,
                      int64_t *kept, bool *exact)
{
    Prob *P = pass_remat_prob_new(g);
    Sol s = pass_remat_sol_new(P);
    bool ok;
    *exact = false;
    if (solver == REMAT_SOLVER_EXACT) {
        int r = pass_remat_solve_exact(P, kept_limit, &s, false);
        ok = r == 1;
        *exact = ok;
        if (r == -1)
            die("remat: the exact solver did not finish on a test graph");
    } else {
        ok = pass_remat_solve_model(P, kept_limit, solver, &s, exact);
    }
    *cost = s.cost;
    *kept = s.mem;
    pass_remat_sol_free(&s);
    pass_remat_prob_free(P);
    return ok;
}
