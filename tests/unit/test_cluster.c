/* test_cluster.c - the cluster projection behind `kiln plan`
 * (codegen/cluster.c): the worked example of issue 17 to the printed
 * digit, and the invariants any such model must keep (more bandwidth is
 * never slower, overlap never slower than none, memory per GPU falls as
 * TP, PP and ZeRO grow). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen.h"

/* A model with numbers of the right order for a 500B-class decoder: the
 * figures are inputs, not the subject of the test. */
static const double bucket_bytes[4] = {4e9, 4e9, 4e9, 4e9};
static const double bucket_ready[4] = {30, 60, 90, 118};

static CgClusterModel model(void)
{
    return (CgClusterModel){
        .nparams = 5e11, .seq_len = 8192, .d_model = 16384, .layers = 96, .micro_batch = 1,
        .act_dtype_bytes = 2, .param_bytes = 2e12, .grad_bytes = 2e12, .opt_bytes = 4e12,
        .act_bytes = 6e12, .fwd_bwd_s = 120, .forward_s = 40, .opt_s = 3,
        .backward_end_s = 120, .nbuckets = 4, .bucket_bytes = bucket_bytes,
        .bucket_ready_s = bucket_ready};
}

static CgClusterOpts layout(void)
{
    return (CgClusterOpts){.gpus = 5120, .gpus_per_node = 8, .tp = 8, .pp = 8, .dp = 80,
                           .micro_batches = 24, .intra_bw = 900e9, .inter_bw = 50e9,
                           .alpha_s = 5e-6, .peak = 2250e12, .tokens = 10e12, .goodput = 0.9};
}

static CgClusterPlan project(const CgClusterModel *m, const CgClusterOpts *o)
{
    CgClusterPlan p;
    char why[256];
    if (!cg_cluster_project(m, o, &p, why, sizeof why))
        fail_msg("cg_cluster_project: %s", why);
    return p;
}

static void digits(double got, const char *fmt, const char *want, const char *what)
{
    char buf[64];
    snprintf(buf, sizeof buf, fmt, got);
    if (strcmp(buf, want) != 0)
        fail_msg("%s: %s (expected %s)", what, buf, want);
}

/* 1,920 x 8,192 tokens per step, a 10T budget, goodput 0.9 */
static void test_worked_example(void **state)
{
    (void)state;
    CgClusterModel m = model();
    CgClusterOpts o = layout();
    o.step_time = 12;
    o.target_days = 76;
    CgClusterPlan p = project(&m, &o);
    digits(p.tokens_per_step, "%.0f", "15728640", "tokens per step");
    assert_int_equal(p.steps, 635782);
    digits(p.tokens_per_s, "%.0f", "1310720", "tokens/s at 12 s");
    digits(p.days, "%.2f", "88.30", "days at 12 s");
    digits(p.days_goodput, "%.2f", "98.11", "days at 12 s, goodput 0.9");
    digits(p.step_for_target, "%.2f", "9.30", "step for 76 days");
    o.step_time = 10;
    CgClusterPlan q = project(&m, &o);
    digits(q.tokens_per_s, "%.0f", "1572864", "tokens/s at 10 s");
    digits(100 * (q.tokens_per_s / p.tokens_per_s - 1), "%.0f", "20", "gain, %");
    digits(q.days, "%.2f", "73.59", "days at 10 s");
    digits(q.days_goodput, "%.2f", "81.76", "days at 10 s, goodput 0.9");
}

static void test_layout_checked(void **state)
{
    (void)state;
    CgClusterModel m = model();
    CgClusterOpts o = layout();
    o.dp = 79;
    CgClusterPlan p;
    char why[256] = "";
    assert_false(cg_cluster_project(&m, &o, &p, why, sizeof why));
    assert_non_null(strstr(why, "must equal --gpus 5120"));
}

static void test_bandwidth_never_slower(void **state)
{
    (void)state;
    CgClusterModel m = model();
    CgClusterOpts o = layout();
    double last = INFINITY;
    for (double bw = 12.5e9; bw <= 800e9; bw *= 2) {
        o.inter_bw = bw;
        CgClusterPlan p = project(&m, &o);
        if (!(p.step_predicted <= last))
            fail_msg("inter-node %g B/s: step %g s, slower than %g s at half of it", bw,
                     p.step_predicted, last);
        last = p.step_predicted;
    }
    o = layout();
    last = INFINITY;
    for (double bw = 50e9; bw <= 3200e9; bw *= 2) {
        o.intra_bw = bw;
        CgClusterPlan p = project(&m, &o);
        assert_true(p.step_predicted <= last);
        last = p.step_predicted;
    }
}

static void test_overlap_never_slower(void **state)
{
    (void)state;
    CgClusterModel m = model();
    for (int zero = 0; zero <= 1; zero++)
        for (double bw = 5e9; bw <= 500e9; bw *= 10) {
            CgClusterOpts o = layout();
            o.zero = zero;
            o.inter_bw = bw;
            CgClusterPlan on = project(&m, &o);
            o.no_overlap = true;
            CgClusterPlan off = project(&m, &o);
            if (!(on.step_predicted <= off.step_predicted && on.t_dp_exposed <= off.t_dp_exposed))
                fail_msg("zero %d, %g B/s: overlap %g s, no overlap %g s", zero, bw,
                         on.step_predicted, off.step_predicted);
            /* without overlap every byte waits for backward to end */
            if (!zero)
                assert_true(fabs(off.t_dp_exposed - off.t_dp) <= 1e-12 * off.t_dp);
        }
}

static void test_memory_falls(void **state)
{
    (void)state;
    CgClusterModel m = model();
    CgClusterOpts o = layout();
    o.tp = 1, o.pp = 1, o.dp = 5120;
    double last = project(&m, &o).mem_total;
    const int tp[] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        o.tp = tp[i], o.dp = 5120 / tp[i];
        double now = project(&m, &o).mem_total;
        if (!(now < last))
            fail_msg("tp %d: %g bytes per GPU, not below %g", tp[i], now, last);
        last = now;
    }
    for (int pp = 2; pp <= 8; pp *= 2) {
        o.pp = pp, o.dp = 5120 / (o.tp * pp);
        double now = project(&m, &o).mem_total;
        if (!(now < last))
            fail_msg("pp %d: %g bytes per GPU, not below %g", pp, now, last);
        last = now;
    }
    CgClusterPlan z0 = project(&m, &o);
    o.zero = 1;
    CgClusterPlan z1 = project(&m, &o);
    assert_true(z1.mem_total < z0.mem_total);
    assert_true(fabs(z1.mem_opt * o.dp - z0.mem_opt) <= 1e-9 * z0.mem_opt);
}

/* A step compiled with zero=1 for dp ranks (the comm pass's buckets): the
 * reduce-scatters where the unsharded step's all-reduces are, the norm's
 * scalar all-reduce at the end of backward, the all-gathers of the updated
 * params; its optimizer state is one DP rank's shard. */
static const double zb_bytes[7] = {4e9, 4e9, 4e9, 4e9, 4, 8e9, 8e9};
static const double zb_ready[7] = {30, 60, 90, 118, 120, 120, 120};
static const int zb_coll[7] = {CG_COLL_REDUCE_SCATTER, CG_COLL_REDUCE_SCATTER,
                               CG_COLL_REDUCE_SCATTER, CG_COLL_REDUCE_SCATTER,
                               CG_COLL_ALLREDUCE,      CG_COLL_ALL_GATHER,
                               CG_COLL_ALL_GATHER};

static CgClusterModel sharded(const CgClusterOpts *o)
{
    CgClusterModel m = model();
    m.nbuckets = 7;
    m.bucket_bytes = zb_bytes;
    m.bucket_ready_s = zb_ready;
    m.bucket_coll = zb_coll;
    m.opt_sharded = true;
    m.opt_bytes /= o->dp;
    m.opt_s /= o->dp;
    return m;
}

/* Each bucket costed by its kind (ring: reduce-scatter and all-gather
 * (n-1) alpha + (n-1)/n bytes / bw, all-reduce twice that), placed where
 * the comm pass put it; the all-gathers hidden by the next forward. Under
 * the model zero=1's step is never above zero=0's, nor its exposed DP time
 * by more than the norm's scalar all-reduce (which follows the last
 * gradient, and which zero=0 does not need); without overlap it is below.
 * Its memory per GPU is below. */
static void test_zero_buckets(void **state)
{
    (void)state;
    CgClusterModel m0 = model();
    for (double bw = 5e9; bw <= 500e9; bw *= 10)
        for (int ov = 0; ov < 2; ov++) {
            CgClusterOpts o = layout();
            o.inter_bw = bw;
            o.no_overlap = ov;
            CgClusterPlan z0 = project(&m0, &o);
            o.zero = 1;
            CgClusterModel m1 = sharded(&o);
            CgClusterPlan z1 = project(&m1, &o);
            /* the norm's scalar all-reduce follows the last gradient: zero=0
             * has none, so it may add its latency, never more */
            double norm = cg_ring_allreduce(4.0 / 64, o.dp, bw, o.alpha_s);
            if (!(z1.t_dp_exposed <= z0.t_dp_exposed + norm * (1 + 1e-12) &&
                  z1.step_predicted <= z0.step_predicted))
                fail_msg("%g B/s, overlap %d: zero=1 exposes %g s (step %g), zero=0 %g s (%g)",
                         bw, !ov, z1.t_dp_exposed, z1.step_predicted, z0.t_dp_exposed,
                         z0.step_predicted);
            if (ov) /* every bucket after backward: the reduce-scatters save half */
                assert_true(z1.t_dp_exposed < z0.t_dp_exposed);
            assert_true(z1.mem_total < z0.mem_total);
            /* the state is one rank's shard already: not divided again */
            assert_true(fabs(z1.mem_opt * o.dp - z0.mem_opt) <= 1e-9 * z0.mem_opt);
            assert_true(fabs(z1.t_opt * o.dp - z0.t_opt) <= 1e-9 * z0.t_opt);
            /* the sum, bucket by bucket: split 64, dp 80 between nodes */
            double sc = 1.0 / 64, a = o.alpha_s, n = o.dp, rs = 0, ag = 0;
            for (int i = 0; i < 4; i++)
                rs += (n - 1) * a + (n - 1) / n * zb_bytes[i] * sc / bw;
            double ar = 2 * (n - 1) * a + 2 * (n - 1) / n * 4 * sc / bw;
            for (int i = 5; i < 7; i++)
                ag += (n - 1) * a + (n - 1) / n * zb_bytes[i] * sc / bw;
            if (!(fabs(z1.t_dp - (rs + ar + ag)) <= 1e-9 * z1.t_dp))
                fail_msg("%g B/s: zero=1 DP time %.9g s, expected %.9g", bw, z1.t_dp,
                         rs + ar + ag);
            if (ov) { /* every reduce waits for backward; the gathers hide behind forward */
                double hide = 40 * sc, want = rs + ar + (ag > hide ? ag - hide : 0);
                if (!(fabs(z1.t_dp_exposed - want) <= 1e-9 * want))
                    fail_msg("%g B/s no overlap: exposed %.9g s, expected %.9g", bw,
                             z1.t_dp_exposed, want);
            }
        }
}

static void test_ring(void **state)
{
    (void)state;
    /* 2(n-1) alpha + 2(n-1)/n bytes / bw */
    assert_true(fabs(cg_ring_allreduce(1e9, 4, 1e9, 1e-6) - (6e-6 + 1.5)) < 1e-12);
    assert_true(fabs(cg_ring_half(1e9, 4, 1e9, 1e-6) - (3e-6 + 0.75)) < 1e-12);
    assert_true(cg_ring_allreduce(1e9, 1, 1e9, 1e-6) == 0);
}

/* Two CPU ranks (the CPU transport stages each bucket through host memory):
 * with no overlap every bucket waits for the end of backward, so the
 * exposed time is the sum of the all-reduces, each 2 alpha + bytes / bw
 * (ring of 2) + 6 bytes / stage_bw; no staging without DP. */
static void test_cpu_staging(void **state)
{
    (void)state;
    static const double bytes[2] = {4e6, 8e6}, ready[2] = {0.010, 0.020};
    CgClusterModel m = {.nparams = 3e6, .seq_len = 32, .d_model = 256, .layers = 2,
                        .micro_batch = 2, .act_dtype_bytes = 4, .param_bytes = 12e6,
                        .grad_bytes = 12e6, .opt_bytes = 24e6, .act_bytes = 30e6,
                        .fwd_bwd_s = 0.020, .forward_s = 0.008, .opt_s = 0.005,
                        .backward_end_s = 0.020, .nbuckets = 2, .bucket_bytes = bytes,
                        .bucket_ready_s = ready};
    CgClusterOpts o = {.gpus = 2, .gpus_per_node = 2, .tp = 1, .pp = 1, .dp = 2,
                       .micro_batches = 1, .intra_bw = 1e9, .inter_bw = 1e9, .alpha_s = 1e-4,
                       .stage_bw = 12e9, .goodput = 1, .no_overlap = true};
    CgClusterPlan p = project(&m, &o);
    double want = 2 * 2e-4 + 12e6 / 1e9 + 6 * 12e6 / 12e9;
    assert_true(fabs(p.t_dp_exposed - want) < 1e-12);
    assert_true(fabs(p.step_predicted - (0.020 + want + 0.005)) < 1e-12);
    o.stage_bw = 0;
    assert_true(fabs(project(&m, &o).t_dp_exposed - (want - 6 * 12e6 / 12e9)) < 1e-12);
    o.stage_bw = 12e9, o.no_overlap = false; /* bucket 0 runs before backward ends */
    double b0 = 2e-4 + 4e6 / 1e9 + 6 * 4e6 / 12e9, b1 = 2e-4 + 8e6 / 1e9 + 6 * 8e6 / 12e9;
    assert_true(fabs(project(&m, &o).t_dp_exposed - (fmax(0.010 + b0, 0.020) + b1 - 0.020)) <
                1e-12);
}

/* The memory timeline (one micro-batch on one device): gradients and
 * other temporaries live per op. One micro-batch: the op where grads /
 * (tp pp) + others / tp peaks, split there, so with tp = pp = 1 the rows
 * add up to the timeline's peak, not to all gradients plus the peak again.
 * Several micro-batches: every gradient held all step, beside the other
 * temporaries' peak. */
static void test_memory_timeline(void **state)
{
    (void)state;
    /* forward builds activations, backward frees them as gradients appear */
    const double grad[5] = {0, 0, 40, 80, 100}, act[5] = {30, 60, 50, 20, 5},
                 saved[5] = {30, 60, 40, 10, 0};
    CgClusterModel m = model();
    m.grad_bytes = 100, m.param_bytes = 100, m.opt_bytes = 200;
    m.mem_nops = 5, m.mem_grad = grad, m.mem_act = act, m.mem_saved = saved;
    CgClusterOpts o = layout();
    o.tp = 1, o.pp = 1, o.dp = 5120, o.micro_batches = 1;
    CgClusterPlan p = project(&m, &o);
    /* peak of grad + act: op 4 (105) */
    assert_false(p.grads_resident);
    assert_int_equal(p.mem_op, 4);
    assert_true(p.mem_grads == 100 && p.mem_act == 5 && p.mem_saved == 0);
    assert_true(p.mem_total == 100 + 200 + 105);
    /* tp 2 x pp 2, one micro-batch: the first stage holds that one's half
     * of the saved activations: grads / 4 + (act - saved) / 2 + saved / 4
     * peaks at op 3 (20 + 5 + 2.5 = 27.5; op 4 ties, op 2 has 25) */
    o.tp = 2, o.pp = 2, o.dp = 1280;
    p = project(&m, &o);
    assert_int_equal(p.inflight, 1);
    assert_int_equal(p.mem_op, 3);
    assert_true(p.mem_grads == 20 && p.mem_act == 7.5 && p.mem_saved == 2.5);
    assert_true(p.mem_total == 25 + 50 + 27.5);
    /* the same timeline as a step compiled partitioned for tp 2 (its figures
     * are one TP rank's already): only pp divides, grads / 2 + (act -
     * saved) + saved / 2 peaks at op 3 (40 + 10 + 5 = 55) */
    m.tp_split = 2;
    p = project(&m, &o);
    assert_int_equal(p.mem_op, 3);
    assert_true(p.mem_grads == 40 && p.mem_act == 15 && p.mem_saved == 5);
    assert_true(p.mem_params == 50 && p.mem_opt == 100);
    /* and its own TP collectives replace the four all-reduces per layer */
    const double tpb[2] = {1e6, 2e6};
    const int tpk[2] = {CG_COLL_ALLREDUCE, CG_COLL_ALL_GATHER};
    m.ntp = 2, m.tp_bytes = tpb, m.tp_coll = tpk;
    p = project(&m, &o);
    double bw = o.tp <= o.gpus_per_node ? o.intra_bw : o.inter_bw;
    double want = (cg_ring_allreduce(1e6, 2, bw, o.alpha_s) + cg_ring_half(2e6, 2, bw, o.alpha_s)) / 2;
    assert_true(fabs(p.t_tp_mb - want) <= 1e-12 * want);
    assert_true(fabs(p.t_tp_exposed_mb - want) <= 1e-12 * want); /* nothing hides them */
    /* the compute up to each one's first reader hides that much of it:
     * all of the all-reduce, none of the gather; the step counts both */
    double ar = cg_ring_allreduce(1e6, 2, bw, o.alpha_s), ag = cg_ring_half(2e6, 2, bw, o.alpha_s);
    const double hide[2] = {2 * ar, 0.25 * ag};
    m.tp_hide_s = hide;
    p = project(&m, &o);
    assert_true(fabs(p.t_tp_exposed_mb - 0.75 * ag / 2) <= 1e-12 * ag);
    assert_true(fabs(p.t_tp_mb - want) <= 1e-12 * want);
    /* a TP link of its own (the CPU's, measured apart) inside a node */
    o.tp_alpha_s = 1e-6, o.tp_bw = 3e9;
    p = project(&m, &o);
    want = (cg_ring_allreduce(1e6, 2, 3e9, 1e-6) + cg_ring_half(2e6, 2, 3e9, 1e-6)) / 2;
    assert_true(fabs(p.t_tp_mb - want) <= 1e-12 * want);
    o.tp_alpha_s = 0, o.tp_bw = 0;
    m.tp_hide_s = NULL;
    m.tp_split = 1, m.ntp = 0, m.tp_bytes = NULL, m.tp_coll = NULL;
    /* memory still falls as TP and PP grow */
    double last = 1e300;
    for (int tp = 1; tp <= 8; tp *= 2)
        for (int pp = 1; pp <= 8; pp *= 2) {
            o.tp = tp, o.pp = pp, o.dp = 5120 / (tp * pp);
            double now = project(&m, &o).mem_total;
            if (pp > 1 && !(now < last))
                fail_msg("tp %d pp %d: %g bytes per GPU, not below %g", tp, pp, now, last);
            last = now;
        }
    /* pp 2 with 4 micro-batches (gradients resident): 1F1B and ZB-H1 hold
     * pp = 2 of them on the first stage, each its half: the whole
     * timeline's saved activations (op 1: 60 / tp 2); GPipe holds all 4 */
    o.tp = 2, o.pp = 2, o.dp = 1280, o.micro_batches = 4;
    const double held[CG_PP__N] = {[CG_PP_1F1B] = 2, [CG_PP_GPIPE] = 4, [CG_PP_ZBH1] = 2};
    for (int k = 0; k < CG_PP__N; k++) {
        o.schedule = (CgPipeSchedule)k;
        p = project(&m, &o);
        assert_int_equal(p.inflight, (int)held[k]);
        assert_int_equal(p.mem_op, 1);
        assert_true(p.mem_saved == 30 * held[k] / 2 && p.mem_act == p.mem_saved);
    }
    o.schedule = CG_PP_1F1B;
    /* 24 micro-batches: gradients resident, activations at their own peak */
    o.tp = 1, o.pp = 1, o.dp = 5120, o.micro_batches = 24;
    p = project(&m, &o);
    assert_true(p.grads_resident);
    assert_int_equal(p.mem_op, 1);
    assert_true(p.mem_grads == 100 && p.mem_act == 60 && p.mem_saved == 60);
    assert_true(p.mem_total == 100 + 200 + 160);
}

/* The pipeline's bubble: (pp - 1) / (m + pp - 1) of the pipeline under
 * 1F1B and GPipe (Megatron's formula); ZB-H1 shrinks each of the pp - 1
 * idle slots to F + B - W of one: a third of it when the forward, the
 * input gradients and the weight gradients take a third of the step each
 * (the zero-bubble paper's (p - 1) / 3m regime), and none when W is at
 * least F + B. */
static void test_bubble(void **state)
{
    (void)state;
    CgClusterModel m = model();
    m.fwd_bwd_s = 120, m.forward_s = 40, m.wgrad_s = 40;
    CgClusterOpts o = layout(); /* pp 8, 24 micro-batches */
    CgClusterPlan p1 = project(&m, &o);
    double u = p1.t_mb + p1.t_tp_mb;
    assert_true(fabs(p1.bubble - 7.0 / 31.0) < 1e-12);
    assert_true(fabs(p1.t_bubble - 7 * u) <= 1e-12 * u);
    assert_true(fabs(p1.t_pipeline - 31 * u) <= 1e-12 * u);
    o.schedule = CG_PP_GPIPE;
    CgClusterPlan pg = project(&m, &o);
    assert_true(pg.t_pipeline == p1.t_pipeline); /* its memory: test_memory_timeline */
    o.schedule = CG_PP_ZBH1;
    CgClusterPlan pz = project(&m, &o);
    assert_true(fabs(pz.t_bubble - 7 * u / 3) <= 1e-12 * u);
    assert_true(fabs(pz.t_pipeline - (24 + 7.0 / 3) * u) <= 1e-12 * u);
    assert_true(pz.mem_total == p1.mem_total && pz.step_predicted < p1.step_predicted);
    m.wgrad_s = 70; /* W outweighs F + B: no bubble left */
    assert_true(project(&m, &o).t_bubble == 0);
    o.pp = 1, o.dp = 640; /* no pipeline: no bubble whatever the schedule */
    for (int k = 0; k < CG_PP__N; k++) {
        o.schedule = (CgPipeSchedule)k;
        assert_true(project(&m, &o).t_bubble == 0);
    }
}

/* The stage cut's pipeline (cg_cluster_pipeline): two stages of F = 1,
 * B = 2, W = 3 seconds, nothing crossing, no latency, 4 micro-batches.
 * Under 1f1b the last stage runs without a gap from the first F's end
 * (stage 0 feeds it in time) and, since a B sends its gradient before its
 * W runs, stage 0's last B and W follow the last stage's last B: the step
 * is F + 4 (F + B + W) + B = 27 s, the bubble F + B = 3 s, not 1f1b's
 * formula (p-1)(F+B+W) = 6 s. GPipe takes as long and holds all four
 * micro-batches; 1f1b's first stage holds two, its last one. A stage
 * twice as slow sets the step. */
static void test_stage_pipeline(void **state)
{
    (void)state;
    CgStageModel st[2] = {{.t = {1, 2, 3}, .param_bytes = 1e9, .held_f = 1e6},
                          {.t = {1, 2, 3}, .param_bytes = 1e9, .held_f = 1e6}};
    CgClusterModel m = model();
    m.param_bytes = 2e9, m.grad_bytes = 2e9, m.opt_bytes = 4e9, m.nbuckets = 0;
    m.nstages = 2, m.stages = st, m.tp_split = 8; /* times are one TP rank's */
    CgClusterOpts o = layout();
    o.tp = 1, o.pp = 2, o.dp = 1, o.gpus = 2, o.micro_batches = 4, o.alpha_s = 0;
    CgClusterPlan p = project(&m, &o);
    assert_true(p.cut);
    /* Megatron's 1F1B sends the gradient after W: (m + p - 1)(F + B + W) */
    assert_true(fabs(p.t_pipeline - 30) < 1e-9 && fabs(p.t_bubble - 6) < 1e-9);
    assert_int_equal(p.inflight, 2);
    assert_int_equal(p.crit_stage, 0);
    CgClusterPlan s1;
    memset(&s1, 0, sizeof s1);
    assert_true(fabs(cg_cluster_stage(&m, &o, 1, &s1) - 24) < 1e-9);
    assert_int_equal(s1.inflight, 1);
    assert_true(fabs(s1.mem_params - 1e9) < 1 && fabs(s1.mem_opt - 2e9) < 1);
    o.schedule = CG_PP_GPIPE;
    CgClusterPlan pg = project(&m, &o);
    assert_true(fabs(pg.t_pipeline - 30) < 1e-9);
    assert_int_equal(pg.inflight, 4);
    assert_true(pg.mem_total > p.mem_total);
    o.schedule = CG_PP_ZBH1;
    CgClusterPlan pz = project(&m, &o);
    /* ZB-H1 sends after B and fills the idle slots with W's: 26, against
     * 1F1B's 30 and a floor of 25 (stage 1 starts after F0, then is busy 24) */
    assert_true(fabs(pz.t_pipeline - 26) < 1e-9 && fabs(pz.t_bubble - 2) < 1e-9);
    o.schedule = CG_PP_1F1B;
    /* the CPU runtime's copies around each program: 2 x bytes / stage_bw */
    st[1].copy_bytes[2] = 1e9, o.stage_bw = 2e9;
    assert_true(fabs(cg_cluster_stage_prog(&m, &o, 1, 2) - 4) < 1e-9);
    assert_true(fabs(cg_cluster_stage(&m, &o, 1, &s1) - 28) < 1e-9);
    st[1].copy_bytes[2] = 0, o.stage_bw = 0;
    st[1].t[0] = 2, st[1].t[1] = 4, st[1].t[2] = 6; /* stage 1 twice as slow */
    CgClusterPlan ps = project(&m, &o);
    assert_true(ps.t_pipeline >= 4 * 12 && ps.t_bubble >= 0);
    assert_true(fabs(ps.t_pipeline - ps.t_bubble - 48) < 1e-9);
}

/* ZB-H1's memory cap (cg_cluster_zbh1_caps): four stages of F 1, B 2,
 * W 3, each owning 1e9 bytes of params (4e9 per stage with grads and
 * optimizer state), holding 1e9 per micro-batch, the last (an LM head)
 * 2e9. 1f1b's peak is stage 0's four micro-batches, 8e9; zb-h1's default
 * (stage t keeps t W's waiting, holds 4) would put the last stage at
 * 4e9 + 4 x 2e9 = 12e9. Capped at 1.1 x 8e9, the last stage keeps one W
 * waiting (holds 2: 8e9), the others their default; the step stays
 * shorter than 1f1b's. With no bytes known the caps are the default. */
static void test_zbh1_cap(void **state)
{
    (void)state;
    CgStageModel st[4];
    for (int s = 0; s < 4; s++)
        st[s] = (CgStageModel){.t = {1, 2, 3}, .param_bytes = 1e9, .held_f = s == 3 ? 2e9 : 1e9};
    CgClusterModel m = model();
    m.param_bytes = 4e9, m.grad_bytes = 4e9, m.opt_bytes = 8e9, m.nbuckets = 0;
    m.nstages = 4, m.stages = st, m.tp_split = 8;
    CgClusterOpts o = layout();
    o.tp = 1, o.pp = 4, o.dp = 1, o.gpus = 4, o.micro_batches = 8, o.alpha_s = 0;
    CgClusterPlan p1 = project(&m, &o);
    assert_true(fabs(p1.mem_total - 8e9) < 1);
    assert_int_equal(p1.crit_stage, 0);
    o.schedule = CG_PP_ZBH1;
    int cap[4];
    assert_int_equal(cg_cluster_zbh1_caps(&m, &o, cap), 4);
    assert_int_equal(cap[0], 0);
    assert_int_equal(cap[1], 1);
    assert_int_equal(cap[2], 2);
    assert_int_equal(cap[3], 1);
    CgClusterPlan pz = project(&m, &o), s3;
    assert_true(pz.mem_total <= CG_ZBH1_MEM * p1.mem_total);
    memset(&s3, 0, sizeof s3);
    cg_cluster_stage(&m, &o, 3, &s3);
    assert_int_equal(s3.inflight, 2);
    assert_true(fabs(s3.mem_total - 8e9) < 1);
    /* every stage at once (the orders and caps computed once): the same
     * rows as one stage at a time */
    CgClusterPlan all[4];
    double busy[4];
    cg_cluster_stages(&m, &o, all, busy);
    for (int s = 0; s < 4; s++) {
        CgClusterPlan one;
        memset(&one, 0, sizeof one);
        assert_true(busy[s] == cg_cluster_stage(&m, &o, s, &one));
        assert_int_equal(all[s].inflight, one.inflight);
        assert_true(all[s].mem_total == one.mem_total);
    }
    assert_int_equal(all[3].inflight, 2);
    assert_true(pz.t_pipeline < p1.t_pipeline);
    /* the schedule itself: stage 3 capped at one W waiting holds 2 */
    PassStageAct a[24];
    int most = 0, held = 0;
    assert_int_equal(pass_stage_schedule_capped(PASS_SCHED_ZBH1, 4, 8, 3, cap, a), 24);
    for (int i = 0; i < 24; i++) {
        held += a[i].kind == 'F' ? 1 : a[i].kind == 'W' ? -1 : 0;
        most = held > most ? held : most;
    }
    assert_int_equal(most, 2);
    /* no bytes known: the unit-slot default */
    for (int s = 0; s < 4; s++)
        st[s].held_f = 0;
    cg_cluster_zbh1_caps(&m, &o, cap);
    for (int s = 0; s < 4; s++)
        assert_int_equal(cap[s], s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worked_example),
        cmocka_unit_test(test_layout_checked),
        cmocka_unit_test(test_bandwidth_never_slower),
        cmocka_unit_test(test_overlap_never_slower),
        cmocka_unit_test(test_memory_falls),
        cmocka_unit_test(test_memory_timeline),
        cmocka_unit_test(test_zero_buckets),
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_cpu_staging),
        cmocka_unit_test(test_bubble),
        cmocka_unit_test(test_stage_pipeline),
        cmocka_unit_test(test_zbh1_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
