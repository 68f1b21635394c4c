/* test_conv.c - the nn library's convolution, pooling and group norm layers
 * (frontend/nn.lua, built on im2col + matmul) against direct loops written
 * here, evaluated by the reference interpreter in double precision:
 * conv1d and conv2d with stride, padding, dilation and groups, max pooling
 * with padding (never the max of padding), average pooling, group norm. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Graph *g;
    double **val;
    Model *m;
} Run;

static double value(int64_t i, int salt) { return sin(0.37 * (double)i + salt) * 1.5; }

/* Loads script (forward graph), fills every input and param with value(i,
 * k) (k = its declaration index), interprets it. */
static Run run_script(const char *script)
{
    char err[2048] = "";
    Run r = {0};
    r.m = fe_load_model_text("conv.lua", script, strlen(script), NULL, 0, err, sizeof err);
    if (!r.m)
        fail_msg("%s", err);
    r.g = r.m->eval_g ? r.m->eval_g : r.m->g;
    r.val = ir_interp_alloc(r.g);
    int k = 0;
    for (int t = 0; t < r.g->t.n; t++) {
        const Tensor *x = &r.g->t.v[t];
        if (x->op >= 0)
            continue;
        int64_t n = shape_numel(&x->s);
        r.val[t] = xmalloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++)
            r.val[t][i] = value(i, k);
        k++;
    }
    InterpOpts o = {0};
    ir_interp(r.g, r.val, &o);
    return r;
}

static const double *named(Run *r, const char *name)
{
    int t = ir_find_tensor(r->g, name);
    if (t < 0)
        t = ir_find_output(r->g, name);
    if (t < 0)
        fail_msg("no tensor %s", name);
    return r->val[t];
}

static void finish(Run *r)
{
    ir_interp_free(r->g, r->val);
    fe_model_free(r->m);
}

static void expect_close(const double *got, const double *want, int64_t n, const char *what)
{
    double e = rel_err(got, want, n);
    if (!(e < 1e-12))
        fail_msg("%s: relative error %g", what, e);
}

/* y[n, co, oh, ow] = b[co] + sum over ci of its group, kh, kw of
 * x[n, g*cig + ci, oh*s - p + kh*d, ow*s - p + kw*d] w[co, ci, kh, kw];
 * a 1d convolution is W = KW = 1 with stride 1, padding 0. */
static void conv_ref(const double *x, const double *w, const double *b, double *y, int N, int C,
                     int H, int W, int CO, int G, int KH, int KW, int sh, int sw, int ph,
                     int pw, int dh, int dw, int OH, int OW)
{
    int cig = C / G, cog = CO / G;
    for (int n = 0; n < N; n++)
        for (int co = 0; co < CO; co++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    double s = b ? b[co] : 0;
                    int g = co / cog;
                    for (int ci = 0; ci < cig; ci++)
                        for (int kh = 0; kh < KH; kh++)
                            for (int kw = 0; kw < KW; kw++) {
                                int ih = oh * sh - ph + kh * dh, iw = ow * sw - pw + kw * dw;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                                    continue;
                                s += x[((n * C + g * cig + ci) * H + ih) * W + iw] *
                                     w[((co * cig + ci) * KH + kh) * KW + kw];
                            }
                    y[((n * CO + co) * OH + oh) * OW + ow] = s;
                }
}

static void test_conv2d_groups(void **state)
{
    (void)state;
    /* x [2, 4, 7, 6], 6 out channels in 2 groups, kernel 3x2, stride (2, 1),
     * padding (1, 2), dilation (1, 2): OH = (7+2-2-1)/2+1 = 4, OW =
     * (6+4-2-1)/1+1 = 8 */
    Run r = run_script("local x = input('x', {2, 4, 7, 6})\n"
                       "local c = nn.Conv2d('c', 4, 6, {3, 2}, {stride = {2, 1}, padding = {1, 2},"
                       " dilation = {1, 2}, groups = 2})\n"
                       "local y = c(x)\n"
                       "output('y', y)\n"
                       "minimize(y:sum())\n");
    const Tensor *yt = &r.g->t.v[ir_find_output(r.g, "y")];
    assert_int_equal(yt->s.rank, 4);
    assert_int_equal(yt->s.dim[2], 4);
    assert_int_equal(yt->s.dim[3], 8);
    double *want = xmalloc(sizeof(double) * 2 * 6 * 4 * 8);
    conv_ref(named(&r, "x"), named(&r, "c.weight"), named(&r, "c.bias"), want, 2, 4, 7, 6, 6, 2,
             3, 2, 2, 1, 1, 2, 1, 2, 4, 8);
    expect_close(named(&r, "y"), want, 2 * 6 * 4 * 8, "conv2d groups=2");
    free(want);
    finish(&r);
}

static void test_conv1d(void **state)
{
    (void)state;
    /* x [3, 2, 9], 5 out channels, kernel 3, stride 2, padding 1, no bias:
     * O = (9+2-2-1)/2+1 = 5 */
    Run r = run_script("local x = input('x', {3, 2, 9})\n"
                       "local c = nn.Conv1d('c', 2, 5, 3, {stride = 2, padding = 1, bias = false})\n"
                       "local y = c(x)\n"
                       "output('y', y)\n"
                       "minimize(y:sum())\n");
    assert_true(ir_find_tensor(r.g, "c.bias") < 0);
    double *want = xmalloc(sizeof(double) * 3 * 5 * 5);
    conv_ref(named(&r, "x"), named(&r, "c.weight"), NULL, want, 3, 2, 9, 1, 5, 1, 3, 1, 2, 1, 1,
             0, 1, 1, 5, 1);
    expect_close(named(&r, "y"), want, 3 * 5 * 5, "conv1d");
    free(want);
    finish(&r);
}

/* max and average pooling, kernel 3, stride 2, padding 1, on x [2, 3, 5, 6]
 * (OH 3, OW 3): the max over the window's in-image elements; the average
 * over all 9 (padding as zeros). x is shifted negative so that a max that
 * took padding (0) would show. */
static void test_pools(void **state)
{
    (void)state;
    Run r = run_script("local x = input('x', {2, 3, 5, 6}) - 3\n"
                       "output('mx', nn.MaxPool2d(3, {stride = 2, padding = 1})(x))\n"
                       "output('av', nn.avg_pool2d(x, 3, {stride = 2, padding = 1}))\n"
                       "minimize(x:sum())\n");
    const double *x = named(&r, "x");
    double mx[2 * 3 * 3 * 3], av[2 * 3 * 3 * 3];
    for (int nc = 0; nc < 6; nc++)
        for (int oh = 0; oh < 3; oh++)
            for (int ow = 0; ow < 3; ow++) {
                double m = -INFINITY, s = 0;
                for (int kh = 0; kh < 3; kh++)
                    for (int kw = 0; kw < 3; kw++) {
                        int ih = oh * 2 - 1 + kh, iw = ow * 2 - 1 + kw;
                        if (ih < 0 || ih >= 5 || iw < 0 || iw >= 6)
                            continue;
                        double v = x[(nc * 5 + ih) * 6 + iw] - 3;
                        m = v > m ? v : m;
                        s += v;
                    }
                mx[(nc * 3 + oh) * 3 + ow] = m;
                av[(nc * 3 + oh) * 3 + ow] = s / 9;
            }
    expect_close(named(&r, "mx"), mx, 54, "max_pool2d");
    expect_close(named(&r, "av"), av, 54, "avg_pool2d");
    finish(&r);
}

/* group norm of x [2, 6, 3, 2] in 3 groups of 2 channels: each (n, group)
 * normalised over its 12 elements, then per-channel weight and bias */
static void test_groupnorm(void **state)
{
    (void)state;
    Run r = run_script("local x = input('x', {2, 6, 3, 2})\n"
                       "local gn = nn.GroupNorm('gn', 3, 6, {eps = 1e-3})\n"
                       "output('y', gn(x))\n"
                       "minimize(x:sum())\n");
    const double *x = named(&r, "x"), *w = named(&r, "gn.weight"), *b = named(&r, "gn.bias");
    double want[72];
    for (int n = 0; n < 2; n++)
        for (int g = 0; g < 3; g++) {
            const double *xs = x + (n * 6 + g * 2) * 6;
            double mean = 0, var = 0;
            for (int i = 0; i < 12; i++)
                mean += xs[i] / 12;
            for (int i = 0; i < 12; i++)
                var += (xs[i] - mean) * (xs[i] - mean) / 12;
            for (int i = 0; i < 12; i++) {
                int c = g * 2 + i / 6;
                want[(n * 6 + g * 2) * 6 + i] = (xs[i] - mean) / sqrt(var + 1e-3) * w[c] + b[c];
            }
        }
    expect_close(named(&r, "y"), want, 72, "group norm");
    finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_groups),
        cmocka_unit_test(test_conv1d),
        cmocka_unit_test(test_pools),
        cmocka_unit_test(test_groupnorm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
