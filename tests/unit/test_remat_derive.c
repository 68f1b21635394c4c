/* test_remat_derive.c - the remat model's derive step (pass_remat_derive)
 * against a plain recomputation of what it promises, on every model's step
 * graph and on keep sets from every fixed policy and random ones: each
 * stage's memory (kept activations of the groups up to it plus its own
 * recomputations), the cost and FLOPs summed over the recompute sets in
 * activation order, then group order (bit for bit), the peak, and that a
 * kept activation that is not saved is read by some recomputation. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "passes.h"
#include "remat_internal.h"

static void check_sol(const char *what, const Prob *P, const Sol *s)
{
    int nv = P->nv, G = P->ngroups;
    int64_t *memg = xcalloc((size_t)G + 1, sizeof(int64_t));
    double cost = 0, flops = 0;
    uint8_t *read = xcalloc((size_t)nv + 1, 1);
    for (int v = 0; v < nv; v++) {
        if (s->keep[v])
            for (int g = P->grp[v]; g < G; g++)
                memg[g] += P->bytes[v];
        for (int g = 0; g < G; g++)
            if (s->r[g * nv + v]) {
                memg[g] += P->bytes[v];
                cost += P->cost[v];
                flops += P->flops[v];
                for (int k = P->in_off[v]; k < P->in_off[v + 1]; k++)
                    read[P->in_v[k]] = 1;
            }
    }
    int64_t mem = 0;
    for (int g = 0; g < G; g++) {
        if (memg[g] != s->memg[g])
            fail_msg("%s: stage %d holds %lld bytes (expected %lld)", what, g,
                     (long long)s->memg[g], (long long)memg[g]);
        if (memg[g] > mem)
            mem = memg[g];
    }
    assert_int_equal(s->mem, mem);
    if (cost != s->cost || flops != s->flops)
        fail_msg("%s: cost %.17g flops %.17g (expected %.17g, %.17g)", what, s->cost, s->flops,
                 cost, flops);
    for (int v = 0; v < nv; v++)
        if (s->keep[v] && !P->saved[v] && !read[v])
            fail_msg("%s: activation %d is kept, neither saved nor read by a recomputation",
                     what, v);
    free(read);
    free(memg);
}

static void test_derive(void **state)
{
    (void)state;
    char **paths = model_paths();
    srand(17);
    int checked = 0, recomputed = 0;
    for (char **pp = paths; *pp; pp++) {
        Model *md = load_model(*pp, NULL, 0);
        PassOpts po;
        pass_opts_default(&po);
        Diag d = {{0}};
        if (!pass_pipeline(md->g, &po, "simplify", NULL, NULL, &d)) /* the graph remat gets */
            fail_msg("%s: %s", *pp, d.msg);
        Prob *P = pass_remat_prob_new(md->g);
        Sol s = pass_remat_sol_new(P);
        for (int policy = REMAT_NONE; policy <= REMAT_SELECTIVE; policy++) {
            pass_remat_policy_keep(P, policy, &s);
            check_sol(*pp, P, &s);
            checked++;
        }
        for (int round = 0; round < 20; round++) {
            for (int v = 0; v < P->nv; v++)
                s.keep[v] = P->saved[v] && rand() % 4 != 0 ? 1 : (uint8_t)(rand() % 8 == 0);
            pass_remat_derive(P, &s);
            check_sol(*pp, P, &s);
            recomputed += s.cost > 0;
            checked++;
        }
        pass_remat_sol_free(&s);
        pass_remat_prob_free(P);
        fe_model_free(md);
    }
    free_model_paths(paths);
    assert_true(checked > 40);
    assert_true(recomputed > 20); /* the recompute sets are exercised */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_derive),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
