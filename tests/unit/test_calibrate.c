/* test_calibrate.c - the per-kernel table reader (codegen/calibrate.c) and
 * --calibrate's comparison: a valid table with unknown metadata keys
 * reads back; every malformed input is refused with the file, the line and
 * what was expected; a table made from a prediction itself calibrates to
 * 1.00 in every class, and one whose GEMMs took twice as long shows 2.00
 * for them and a gemm_top (or sgemm rate) half the device's, on a GPU and
 * on the CPU model. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_cuda.h"
#include "codegen.h"
#include "passes.h"

static CgKernelTable *parse(const char *text, Diag *d)
{
    return cg_kernel_table_parse(text, strlen(text), "t.tsv", d);
}

static const char good[] =
    "# kiln kernel table 1\n"
    "# source\tmeasured\n"
    "# device\tcuda:NVIDIA H100 80GB HBM3\n"
    "# steps\t30\n"
    "# step_ms\t123.4\n"
    "# a_later_key\tignored\n"
    "kind\tname\tshape\tcalls\tms\tflops\tbytes\top\twhere\n"
    "gemm\tgemm_op12\t768x2304x768\t1\t0.123\t2.7e9\t1.1e7\tmatmul\tmodels/gpt.lua:40\n"
    "gemm\tgemm_op30\t1024x1024x64x192\t1\t0.050\t2.5e10\t1e8\tmatmul\t-\n"
    "kernel\tk_attn_fwd_3\t-\t12\t0.9\t1e11\t1e8\tattention\tmodels/gpt.lua:55\r\n"
    "copy\tcopy\t-\t4\t0.01\t0\t1.2e6\t-\t-\n";

static void test_read(void **state)
{
    (void)state;
    Diag d = {{0}};
    CgKernelTable *t = parse(good, &d);
    if (!t)
        fail_msg("%s", d.msg);
    assert_string_equal(t->source, "measured");
    assert_string_equal(t->device, "cuda:NVIDIA H100 80GB HBM3");
    assert_int_equal(t->steps, 30);
    assert_true(fabs(t->step_ms - 123.4) < 1e-9);
    assert_int_equal(t->rows.n, 4);
    const CgKtRow *g = &t->rows.v[1];
    assert_int_equal(g->kind, CG_KT_GEMM);
    assert_true(g->dims[0] == 1024 && g->dims[1] == 1024 && g->dims[2] == 64 &&
                g->dims[3] == 192);
    assert_int_equal(t->rows.v[0].dims[3], 1);
    assert_int_equal(t->rows.v[2].calls, 12);
    assert_string_equal(t->rows.v[2].where, "models/gpt.lua:55"); /* CRLF dropped */
    assert_int_equal(t->rows.v[3].kind, CG_KT_COPY);
    assert_int_equal(t->rows.v[3].line, 11);
    cg_kernel_table_free(t);
}

/* Malformed tables: each refused, the message naming t.tsv, the line and
 * the expectation. */
static void test_bad(void **state)
{
    (void)state;
    const char *head = "# kiln kernel table 1\nkind\tname\tshape\tcalls\tms\tflops\tbytes\top\twhere\n";
    struct {
        const char *body; /* after head, or the whole file when whole */
        bool whole;
        const char *want;
    } c[] = {
        {"", true, "t.tsv:1: expected the first line '# kiln kernel table 1', found an empty"},
        {"# kiln kernel table 2\n", true, "t.tsv:1: expected the first line"},
        {"kind\tname\n", true, "t.tsv:1: expected the first line"},
        {"# kiln kernel table 1\n# steps\t30\n", true, "t.tsv:2: expected the header line"},
        {"# kiln kernel table 1\nkind\tname\tshape\n", true, "t.tsv:2: expected the header"},
        {"# kiln kernel table 1\nkind\tname\tshape\tcalls\tms\tflops\tbytes\top\twhere\tx\n", true,
         "t.tsv:2: expected the header's 9 columns, found more"},
        {"# kiln kernel table 1\n# steps\t0\n", true, "t.tsv:2: steps: expected a whole"},
        {"# kiln kernel table 1\n# step_ms\tfast\n", true, "t.tsv:2: step_ms: expected"},
        {"gemm\tg\t1x2\t1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: shape: expected MxNxK"},
        {"gemm\tg\t1x2x3x4x5\t1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: shape: expected MxNxK"},
        {"gemm\tg\t0x2x3\t1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: shape: expected MxNxK"},
        {"gemm\tg\t-\t1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: shape: expected MxNxK"},
        {"launch\tg\t-\t1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: kind: expected gemm, kernel or copy"},
        {"kernel\t\t-\t1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: name: expected a kernel name"},
        {"kernel\tk\t-\t-1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: calls: expected a whole number"},
        {"kernel\tk\t-\t1\tnan\t1\t1\t-\t-\n", false, "t.tsv:3: ms: expected a number"},
        {"kernel\tk\t-\t1\t1\t-5\t1\t-\t-\n", false, "t.tsv:3: flops: expected a number"},
        {"kernel\tk\t-\t1\t1\t1\t1e999\t-\t-\n", false, "t.tsv:3: bytes: expected a number"},
        {"kernel\tk\t-\t1\t1\t1\t1\t-\n", false, "t.tsv:3: expected 9 tab-separated fields, found 8"},
        {"kernel\tk\t-\t1\t1\t1\t1\t-\t-\textra\n", false, "t.tsv:3: expected 9 tab-separated fields, found more"},
        {"kernel\tk\t-\t1\t1\t1\t1\t-\t-\n# steps\t3\n", false, "t.tsv:4: metadata after the header"},
        {"kernel\tk\0\t-\t1\t1\t1\t1\t-\t-\n", false, "t.tsv:3: a NUL byte"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char buf[512];
        size_t n;
        if (c[i].whole) {
            n = strlen(c[i].body);
            memcpy(buf, c[i].body, n);
        } else { /* the NUL case: its length is the literal's */
            size_t hb = strlen(head), bl = strlen(c[i].body);
            if (strstr(c[i].want, "NUL"))
                bl = sizeof "kernel\tk\0\t-\t1\t1\t1\t1\t-\t-\n" - 1;
            memcpy(buf, head, hb);
            memcpy(buf + hb, c[i].body, bl);
            n = hb + bl;
        }
        Diag d = {{0}};
        CgKernelTable *t = cg_kernel_table_parse(buf, n, "t.tsv", &d);
        if (t)
            fail_msg("case %zu accepted (expected '%s')", i, c[i].want);
        if (!strstr(d.msg, c[i].want))
            fail_msg("case %zu: '%s' (expected '%s')", i, d.msg, c[i].want);
    }
    /* a file that is not there */
    Diag d = {{0}};
    assert_null(cg_kernel_table_read("/nonexistent/kiln.tsv", &d));
    assert_non_null(strstr(d.msg, "/nonexistent/kiln.tsv: cannot open the kernel table"));
}

static const char model[] =
    "kiln-ir v1\n"
    "%0:f32[2048,1024] = input \"x\"\n"
    "%1:f32[1024,1024] = param \"w\"\n"
    "%2:f32[2048,1024] = matmul %0, %1 {ta=0,tb=0}\n"
    "%3:f32[2048,1024] = tanh %2\n"
    "%4:f32[2048,1024] = matmul %3, %1 {ta=0,tb=1}\n"
    "%5:f32[2048,1024] = neg %4\n"
    "output \"y\" %5\n";

/* The table a prediction would write (predicted ms, GEMMs scaled by
 * gemm_scale), in the format of docs/cost.md. */
static char *table_of(const CgPrediction *r, const CgPlan *p, double gemm_scale)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    fprintf(f, "# kiln kernel table 1\n# source\tpredicted\n# device\t%s\n# steps\t1\n"
               "kind\tname\tshape\tcalls\tms\tflops\tbytes\top\twhere\n", r->dev->name);
    for (int i = 0; i < r->rows.n; i++) {
        const CgPredRow *w = &r->rows.v[i];
        const CgStep *st = &p->steps.v[w->step];
        if (st->kind == CG_STEP_GEMM && strcmp(w->name, "gemm") == 0)
            fprintf(f, "gemm\tgemm_op%d\t%lldx%lldx%lld\t1\t%.9g\t%g\t%g\tmatmul\t-\n", st->op,
                    (long long)st->gemm.M, (long long)st->gemm.N, (long long)st->gemm.K,
                    w->s * 1e3 * gemm_scale, w->flops, w->bytes);
        else
            fprintf(f, "%s\t%s\t-\t1\t%.9g\t%g\t%g\t-\t-\n",
                    strcmp(w->name, "copy") == 0 ? "copy" : "kernel", w->name, w->s * 1e3,
                    w->flops, w->bytes);
    }
    fclose(f);
    return text;
}

static char *calibrated(const CgPrediction *r, const CgPlan *p, double gemm_scale)
{
    char *tab = table_of(r, p, gemm_scale);
    Diag d = {{0}};
    CgKernelTable *t = parse(tab, &d);
    if (!t)
        fail_msg("%s\n%s", d.msg, tab);
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    cg_calibrate(r, p, t, "t.tsv", f);
    fclose(f);
    cg_kernel_table_free(t);
    free(tab);
    return out;
}

/* Every class line's meas/pred column, checked against want (GEMM
 * classes) and 1.00 (the others); returns the number of class lines. */
static int check_ratios(const char *out, const char *gemm_want)
{
    int lines = 0;
    for (const char *l = strstr(out, "\n  "); l; l = strstr(l + 1, "\n  ")) {
        char cls[32], m[32], pr[32], ratio[32];
        int rows;
        long long calls;
        char mu[8], pu[8];
        if (sscanf(l + 1, " %31s %d %lld %31s %7s %31s %7s %31s", cls, &rows, &calls, m, mu,
                   pr, pu, ratio) != 8 || strcmp(cls, "class") == 0)
            continue;
        lines++;
        const char *want = strncmp(cls, "gemm.", 5) == 0 ? gemm_want : "1.00";
        if (strcmp(ratio, want) != 0)
            fail_msg("%s: ratio %s (expected %s):\n%s", cls, ratio, want, out);
    }
    return lines;
}

static void test_calibrate(void **state)
{
    (void)state;
    Graph *g = parse_or_fail(model);
    PassOpts po;
    pass_opts_default(&po);
    Diag d = {{0}};
    if (!pass_simplify(g, &po, &d) || !pass_fuse(g, &po, &d) || !pass_schedule(g, &po, &d))
        fail_msg("passes: %s", d.msg);
    CgPlan *p = cg_plan(g, &d);
    if (!p)
        fail_msg("cg_plan: %s", d.msg);
    /* a GPU: the CUDA program's launches */
    CgCudaProgram *q = cg_cuda_program(p, true);
    const CgDevice *h100 = cg_device_find("h100");
    CgPredictOpts o = {.bf16 = true};
    CgPrediction *r = cg_predict(p, q, h100, &o);
    char *same = calibrated(r, p, 1);
    if (check_ratios(same, "1.00") < 2 || !strstr(same, "gemm_top 0.792 (now 0.792)"))
        fail_msg("the prediction against itself:\n%s", same);
    char *slow = calibrated(r, p, 2);
    check_ratios(slow, "2.00");
    /* twice the time (less the launch): a lower fitted top, under half */
    const char *gt = strstr(slow, "gemm_top ");
    double fitted = gt ? atof(gt + 9) : 0;
    if (!(fitted > 0.3 && fitted < 0.396))
        fail_msg("fitted gemm_top %g:\n%s", fitted, slow);
    free(same);
    free(slow);
    cg_prediction_free(r);
    cg_cuda_program_free(q);
    /* the CPU model (figures given here, no measurement) */
    CgDevice cpu = {.name = "cpu", .title = "test", .units = 2, .f32 = 1e11, .gemm = 5e10,
                    .bw = 1e10, .bw1 = 5e9, .launch_s = 1e-6, .graph_s = 1e-6, .work = 1e9,
                    .gemm1 = {1e10, 2e10, 4e10, 5e10}};
    CgPredictOpts none = {0};
    r = cg_predict(p, NULL, &cpu, &none);
    same = calibrated(r, p, 1);
    if (check_ratios(same, "1.00") < 2 || !strstr(same, "sgemm rates x 1.00"))
        fail_msg("cpu, against itself:\n%s", same);
    slow = calibrated(r, p, 2);
    check_ratios(slow, "2.00");
    free(same);
    free(slow);
    cg_prediction_free(r);
    cg_plan_free(p);
    ir_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_calibrate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
