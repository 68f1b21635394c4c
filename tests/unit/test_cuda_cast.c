/* test_cuda_cast.c - the bf16 weight casts of a bf16 CUDA program
 * (codegen/cuda_cast.c): how many launches cast the weights, where they
 * run, and that no GEMM reads a copy that is stale.
 *
 * The staleness check walks the plan's steps as the backend runs them (the
 * cast group due before a GEMM step first, then the step) and keeps, per
 * tensor, whether its bf16 copy holds its current value: a group makes its
 * tensors' copies current; a write to a tensor's storage root (a kernel's
 * output, a GEMM's c, d, aux or bias gradient, a copy step into its bytes)
 * or any collective makes them stale. Every GEMM operand read from a copy
 * (cast_off >= 0) must find it current. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_cuda.h"
#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "train.h"

static void stale_root(const MemPlan *mem, int nt, int r, bool *cur)
{
    for (int t = 0; t < nt; t++)
        if (mem->root[t] == r)
            cur[t] = false;
}

/* Fails the test when a GEMM reads a stale copy; returns the casts. */
static int check_fresh(const CgPlan *p, const CgCudaProgram *q)
{
    const MemPlan *mem = q->mem;
    int nt = p->g->t.n, casts = 0;
    bool *cur = xcalloc((size_t)nt + 1, sizeof(bool));
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        int i = q->cast_group[s];
        if (i >= 0) {
            assert_int_equal(st->kind, CG_STEP_GEMM);
            for (int j = q->cast_first[i]; j < q->cast_first[i + 1]; j++, casts++)
                cur[q->cast_t[j]] = true;
        }
        switch (st->kind) {
        case CG_STEP_GEMM: {
            const CgGemm *m = &st->gemm;
            for (int o = 0; o < 2; o++)
                if (q->cast_off[2 * s + o] >= 0 && !cur[o ? m->b : m->a])
                    fail_msg("GEMM step %d reads a stale bf16 copy of tensor %d", s,
                             o ? m->b : m->a);
            int w[4] = {m->c, m->d, m->aux, m->bgrad};
            for (int k = 0; k < 4; k++)
                if (w[k] >= 0)
                    stale_root(mem, nt, mem->root[w[k]], cur);
            break;
        }
        case CG_STEP_KERNEL: {
            const CgKernel *k = p->kernels.v[st->kernel];
            for (int j = 0; j < k->params.n; j++)
                if (k->params.v[j].out)
                    stale_root(mem, nt, mem->root[st->args[j]], cur);
            break;
        }
        case CG_STEP_COPY:
            for (int t = 0; t < nt; t++)
                if (q->copy[s].dst < mem->offset[t] + mem->bytes[t] &&
                    mem->offset[t] < q->copy[s].dst + q->copy[s].bytes)
                    cur[t] = false;
            break;
        default:
            memset(cur, 0, sizeof(bool) * (size_t)nt);
            break;
        }
    }
    free(cur);
    return casts;
}

static int count_rows(const CgPrediction *r, const char *name)
{
    int n = 0;
    for (int i = 0; i < r->rows.n; i++)
        n += strcmp(r->rows.v[i].name, name) == 0;
    return n;
}

/* gpt 124M, batch 16 x 1024, bf16: every weight goes stale at the optimizer
 * only, so the step casts all 49 GEMM weights (12 layers x 4, and the tied
 * wte) in ONE launch, before the first GEMM; no GEMM casts a weight of its
 * own; the cost model has one cast row. */
static void test_gpt124m_one_cast_launch(void **state)
{
    (void)state;
    const char *sets[] = {"size=124M", "batch=16", "precision=bf16"};
    Model *m = load_model("models/gpt.lua", sets, 3);
    PassOpts po;
    RtGraphFlags gf = {.memory_budget = -1};
    rt_pass_opts(&m->train, &gf, &po);
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
    CgPlan *p = cg_plan(m->g, &d);
    if (!p)
        fail_msg("plan: %s", d.msg);
    CgCudaProgram *q = cg_cuda_program(p, true);
    assert_int_equal(q->ncast_groups, 1);
    assert_int_equal(check_fresh(p, q), 49);
    int first_gemm = -1;
    for (int s = 0; s < p->steps.n && first_gemm < 0; s++)
        if (p->steps.v[s].kind == CG_STEP_GEMM)
            first_gemm = s;
    assert_int_equal(q->cast_group[first_gemm], 0);
    CgPredictOpts o = {.bf16 = true};
    CgPrediction *r = cg_predict(p, q, cg_device_find("h200"), &o);
    assert_int_equal(count_rows(r, "cast_f32_bf16_multi"), 1);
    assert_int_equal(count_rows(r, "cast_f32_bf16"), 0);
    cg_prediction_free(r);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    fe_model_free(m);
}

/* The MLP for 2 ranks with small buckets: the gradient all-reduces run in
 * the backward, so (collectives counting as writes to every copy) the
 * backward's GEMMs after the first all-reduce need their weights cast
 * again, by a later group; no GEMM reads a stale copy. With zero=1 a
 * weight that an all-gather writes is cast at a GEMM that reads it, not
 * earlier (the gather's wait may move to its first reader). */
static void mlp_dp(int zero)
{
    const char *sets[] = {"depth=3"};
    Model *m = load_model("models/mlp.lua", sets, 1);
    PassOpts po;
    pass_opts_default(&po);
    po.nranks = 2;
    po.bucket_bytes = 1024;
    po.zero = zero;
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
    CgPlan *p = cg_plan(m->g, &d);
    if (!p)
        fail_msg("plan: %s", d.msg);
    CgCudaProgram *q = cg_cuda_program(p, true);
    int colls = 0;
    bool *gathered = xcalloc((size_t)p->g->t.n + 1, sizeof(bool));
    for (int s = 0; s < p->steps.n; s++) {
        const CgStep *st = &p->steps.v[s];
        colls += st->kind == CG_STEP_ALLREDUCE_START;
        if (st->kind == CG_STEP_ALLREDUCE_START && st->coll == CG_COLL_ALL_GATHER)
            for (int a = 0; a < st->nargs; a++)
                gathered[q->mem->root[st->args[a]]] = true;
    }
    assert_true(colls > 0);
    int casts = check_fresh(p, q);
    print_message("mlp zero=%d: %d casts in %d groups, %d collectives\n", zero, casts,
                  q->ncast_groups, colls);
    assert_true(q->ncast_groups >= 1 && casts >= q->ncast_groups);
    int ngathered = 0;
    for (int s = 0; s < p->steps.n; s++) {
        int i = q->cast_group[s];
        if (i < 0)
            continue;
        const CgGemm *mm = &p->steps.v[s].gemm;
        for (int j = q->cast_first[i]; j < q->cast_first[i + 1]; j++) {
            int t = q->cast_t[j];
            if (!gathered[q->mem->root[t]])
                continue;
            ngathered++;
            if (!((mm->a == t && q->cast_off[2 * s] >= 0) ||
                  (mm->b == t && q->cast_off[2 * s + 1] >= 0)))
                fail_msg("gathered tensor %d cast before GEMM step %d, which does not read it",
                         t, s);
        }
    }
    if (zero)
        assert_true(ngathered > 0);
    free(gathered);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    fe_model_free(m);
}

static void test_mlp_dp(void **state)
{
    (void)state;
    mlp_dp(0);
}

static void test_mlp_zero(void **state)
{
    (void)state;
    mlp_dp(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt124m_one_cast_launch),
        cmocka_unit_test(test_mlp_dp),
        cmocka_unit_test(test_mlp_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
