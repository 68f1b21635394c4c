/* test_cuda_grid.c - the launch grids of the CUDA program for GPT-2 124M
 * (models/gpt.lua --set size=124M, batch 16 x 1024, bf16, no remat): no
 * kernel launch that moves more than 1 MB may run fewer blocks than twice
 * the H200's SMs (issue 16: full reductions run in two stages over many
 * blocks, column reductions split their rows). The launches and their
 * bytes are the cost model's rows (cg_predict on the h200 device: every
 * CUDA function of the program, with the bytes of the buffers it reads or
 * writes at their storage dtypes); GEMMs are cuBLASLt's and are left out.
 * Also: the full reductions and column reductions of the step are split
 * (their stages and scratch are there), so the check cannot pass by a
 * model that lost them; no launch of one block only combines a full
 * reduction's partials (the last block to finish does: CgCudaFn.ticket),
 * and the AdamW
 * update of all 148 parameter tensors (one horizontal function,
 * codegen/cuda_multi.c), the cost model counting each as one launch. */
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

static void test_gpt124m_grids(void **state)
{
    (void)state;
    const char *sets[] = {"size=124M", "batch=16", "precision=bf16"};
    Model *m = load_model("models/gpt.lua", sets, 3);
    PassOpts po;
    RtGraphFlags gf = {.memory_budget = -1}; /* the training graph, attention fused */
    rt_pass_opts(&m->train, &gf, &po);
    Diag d = {{0}};
    if (!pass_pipeline(m->g, &po, NULL, NULL, NULL, &d))
        fail_msg("pipeline: %s", d.msg);
    CgPlan *p = cg_plan(m->g, &d);
    if (!p)
        fail_msg("plan: %s", d.msg);
    CgCudaProgram *q = cg_cuda_program(p, true);
    const CgDevice *h200 = cg_device_find("h200");
    assert_non_null(h200);
    CgPredictOpts o = {.bf16 = true};
    CgPrediction *r = cg_predict(p, q, h200, &o);
    int64_t need = 2 * (int64_t)h200->units;
    int checked = 0, bad = 0, kernels = 0;
    double kbytes = 0;
    for (int i = 0; i < r->rows.n; i++) {
        const CgPredRow *w = &r->rows.v[i];
        if (strcmp(w->name, "gemm") != 0 && strcmp(w->name, "copy") != 0) {
            kernels++;
            kbytes += w->bytes;
        }
        if (strcmp(w->name, "gemm") == 0 || w->bytes <= 1e6)
            continue;
        checked++;
        if (w->blocks < need) {
            print_message("  %s (step %d): %lld blocks of %d threads, %.1f MB\n", w->name,
                          w->step, (long long)w->blocks, w->threads, w->bytes / 1e6);
            bad++;
        }
    }
    /* split loops are there: full reductions (rows) and column reductions */
    int split_rows = 0, split_cols = 0, one_launch = 0, staged = 0, update = 0;
    const char *update_fn = "";
    for (int i = 0; i < q->fn.n; i++) {
        const CgCudaFn *f = &q->fn.v[i];
        split_rows += f->rows && f->split > 1 && f->n < 2;
        split_cols += f->cols && f->split > 1;
        one_launch += f->rows && f->split > 1 && f->n < 2 && f->ticket;
        /* a launch of one block that only combines a full reduction's
         * partials (its last block does that now) */
        staged += f->n < 2 && f->split == 1 && f->part && !f->nloops;
        if (f->nloops > update) {
            update = f->nloops;
            update_fn = f->name;
        }
        if (f->part && (f->part_bytes <= 0 || f->part_bytes > q->part_bytes))
            fail_msg("%s: partials of %lld bytes in a scratch of %lld", f->name,
                     (long long)f->part_bytes, (long long)q->part_bytes);
    }
    print_message("gpt 124M bf16 on h200: %d kernel launches moving %.2f GB; %d move more "
                  "than 1 MB, %d of them with fewer than %lld blocks; %d split full "
                  "reductions, %d split column reductions; partials scratch %lld bytes; "
                  "predicted step %.2f ms\n",
                  kernels, kbytes / 1e9, checked, bad, (long long)need, split_rows, split_cols,
                  (long long)q->part_bytes, 1e3 * r->step_s);
    assert_true(checked > 100);
    assert_int_equal(bad, 0);
    assert_true(split_rows > 0 && split_cols > 0 && q->part_bytes > 0);
    print_message("full reductions in one launch (last block combines): %d; launches that only "
                  "combine: %d; the largest horizontal function: %d loops; %d launches\n",
                  one_launch, staged, update, r->launches);
    assert_true(one_launch > 0);
    assert_int_equal(staged, 0);
    assert_int_equal(update, 148); /* gpt 124M's parameter tensors */
    int update_rows = 0; /* the cost model: the update is one launch */
    for (int i = 0; i < r->rows.n; i++)
        update_rows += strcmp(r->rows.v[i].name, update_fn) == 0;
    assert_int_equal(update_rows, 1);
    assert_int_equal(r->rows.n, r->launches);
    cg_prediction_free(r);
    cg_cuda_program_free(q);
    cg_plan_free(p);
    fe_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt124m_grids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
