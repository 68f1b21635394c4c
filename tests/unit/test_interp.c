/* test_interp.c - the reference interpreter against hand-computed values for
 * each opcode's semantics (ir.h), on small graphs written as IR text. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Graph *g;
    double **val;
} Run;

static void set(Run *r, const char *name, const double *v)
{
    int t = ir_find_tensor(r->g, name);
    if (t < 0)
        fail_msg("no input named %s", name);
    size_t n = (size_t)shape_numel(&r->g->t.v[t].s);
    free(r->val[t]);
    r->val[t] = xmalloc(sizeof(double) * (n ? n : 1));
    memcpy(r->val[t], v, sizeof(double) * n);
}

static Run start(const char *text)
{
    Run r = {parse_or_fail(text), NULL};
    r.val = ir_interp_alloc(r.g);
    return r;
}

static void go(Run *r, uint64_t seed, int64_t step)
{
    InterpOpts o = {seed, step};
    ir_interp(r->g, r->val, &o);
}

static const double *out(Run *r, const char *name)
{
    int t = ir_find_output(r->g, name);
    if (t < 0)
        fail_msg("no output named %s", name);
    return r->val[t];
}

/* Output `name` equals want exactly (n values). */
static void expect(Run *r, const char *name, const double *want, int n)
{
    int t = ir_find_output(r->g, name);
    if (t < 0)
        fail_msg("no output named %s", name);
    assert_int_equal(shape_numel(&r->g->t.v[t].s), n);
    for (int i = 0; i < n; i++)
        if (!(r->val[t][i] == want[i] || (isnan(want[i]) && isnan(r->val[t][i]))))
            fail_msg("%s[%d] = %.17g (expected %.17g)", name, i, r->val[t][i], want[i]);
}

static void finish(Run *r)
{
    ir_interp_free(r->g, r->val);
    ir_free(r->g);
}

#define D(...) (const double[]){__VA_ARGS__}
#define EXPECT(r, name, ...)                                                             \
    expect(r, name, D(__VA_ARGS__), (int)(sizeof D(__VA_ARGS__) / sizeof(double)))

static void test_unary(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[4] = input \"x\"\n"
                  "%1:f32[4] = neg %0\n"
                  "%2:f32[4] = abs %0\n"
                  "%3:f32[4] = relu %0\n"
                  "%4:f32[4] = exp %0\n"
                  "%5:f32[4] = input \"p\"\n"
                  "%6:f32[4] = sqrt %5\n"
                  "%7:f32[4] = rsqrt %5\n"
                  "%8:f32[4] = log %5\n"
                  "%9:f32[4] = sigmoid %0\n"
                  "%10:f32[4] = tanh %0\n"
                  "%11:f32[4] = sin %0\n"
                  "%12:f32[4] = cos %0\n"
                  "output \"neg\" %1\noutput \"abs\" %2\noutput \"relu\" %3\n"
                  "output \"exp\" %4\noutput \"sqrt\" %6\noutput \"rsqrt\" %7\n"
                  "output \"log\" %8\noutput \"sigmoid\" %9\noutput \"tanh\" %10\n"
                  "output \"sin\" %11\noutput \"cos\" %12\n");
    set(&r, "x", D(1, -2, 0, 0.5));
    set(&r, "p", D(4, 0.25, 1, 16));
    go(&r, 0, 0);
    EXPECT(&r, "neg", -1, 2, -0.0, -0.5);
    EXPECT(&r, "abs", 1, 2, 0, 0.5);
    EXPECT(&r, "relu", 1, 0, 0, 0.5);
    EXPECT(&r, "exp", exp(1), exp(-2), 1, exp(0.5));
    EXPECT(&r, "sqrt", 2, 0.5, 1, 4);
    EXPECT(&r, "rsqrt", 0.5, 2, 1, 0.25);
    EXPECT(&r, "log", log(4), log(0.25), 0, log(16));
    EXPECT(&r, "sigmoid", 1 / (1 + exp(-1)), 1 / (1 + exp(2)), 0.5, 1 / (1 + exp(-0.5)));
    EXPECT(&r, "tanh", tanh(1), tanh(-2), 0, tanh(0.5));
    EXPECT(&r, "sin", sin(1), sin(-2), 0, sin(0.5));
    EXPECT(&r, "cos", cos(1), cos(-2), 1, cos(0.5));
    finish(&r);
}

static void test_binary_compare_select(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[4] = input \"a\"\n"
                  "%1:f32[4] = input \"b\"\n"
                  "%2:f32[4] = add %0, %1\n"
                  "%3:f32[4] = sub %0, %1\n"
                  "%4:f32[4] = mul %0, %1\n"
                  "%5:f32[4] = div %0, %1\n"
                  "%6:f32[4] = pow %0, %1\n"
                  "%7:f32[4] = max %0, %1\n"
                  "%8:f32[4] = min %0, %1\n"
                  "%9:u8[4] = lt %0, %1\n"
                  "%10:u8[4] = le %0, %1\n"
                  "%11:u8[4] = gt %0, %1\n"
                  "%12:u8[4] = ge %0, %1\n"
                  "%13:u8[4] = eq %0, %1\n"
                  "%14:u8[4] = ne %0, %1\n"
                  "%15:f32[4] = select %9, %0, %1\n"
                  "%16:u8[4] = mul %9, %10\n"
                  "output \"add\" %2\noutput \"sub\" %3\noutput \"mul\" %4\n"
                  "output \"div\" %5\noutput \"pow\" %6\noutput \"max\" %7\n"
                  "output \"min\" %8\noutput \"lt\" %9\noutput \"le\" %10\n"
                  "output \"gt\" %11\noutput \"ge\" %12\noutput \"eq\" %13\n"
                  "output \"ne\" %14\noutput \"select\" %15\noutput \"and\" %16\n");
    set(&r, "a", D(2, 3, -1, 4));
    set(&r, "b", D(3, 3, 2, 0.5));
    go(&r, 0, 0);
    EXPECT(&r, "add", 5, 6, 1, 4.5);
    EXPECT(&r, "sub", -1, 0, -3, 3.5);
    EXPECT(&r, "mul", 6, 9, -2, 2);
    EXPECT(&r, "div", 2.0 / 3, 1, -0.5, 8);
    EXPECT(&r, "pow", 8, 27, 1, 2);
    EXPECT(&r, "max", 3, 3, 2, 4);
    EXPECT(&r, "min", 2, 3, -1, 0.5);
    EXPECT(&r, "lt", 1, 0, 1, 0);
    EXPECT(&r, "le", 1, 1, 1, 0);
    EXPECT(&r, "gt", 0, 0, 0, 1);
    EXPECT(&r, "ge", 0, 1, 0, 1);
    EXPECT(&r, "eq", 0, 1, 0, 0);
    EXPECT(&r, "ne", 1, 0, 1, 1);
    EXPECT(&r, "select", 2, 3, -1, 0.5);
    EXPECT(&r, "and", 1, 0, 1, 0);
    finish(&r);
}

static void test_integers_and_cast(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:i32[4] = input \"a\"\n"
                  "%1:i32[4] = input \"b\"\n"
                  "%2:i32[4] = div %0, %1\n"
                  "%3:i32[4] = add %0, %1\n"
                  "%4:f32[4] = input \"x\"\n"
                  "%5:i32[4] = cast %4\n"
                  "%6:f32[4] = cast %0\n"
                  "%7:u8[4] = cast %4\n"
                  "%8:i64[4] = cast %4\n"
                  "output \"div\" %2\noutput \"add\" %3\noutput \"toint\" %5\n"
                  "output \"tofloat\" %6\noutput \"tou8\" %7\noutput \"toi64\" %8\n");
    set(&r, "a", D(7, -7, 6, 2147483647));
    set(&r, "b", D(2, 2, -4, -1));
    set(&r, "x", D(-1.7, 2.9, 0, -0.5));
    go(&r, 0, 0);
    EXPECT(&r, "div", 3, -3, -1, -2147483647);
    EXPECT(&r, "add", 9, -5, 2, 2147483646);
    EXPECT(&r, "toint", -1, 2, 0, 0);
    EXPECT(&r, "toi64", -1, 2, 0, 0);
    EXPECT(&r, "tofloat", 7, -7, 6, 2147483647);
    EXPECT(&r, "tou8", 1, 1, 0, 1);
    finish(&r);
}

/* bf16 keeps 8 significant bits, f16 11; both round to nearest, ties to even,
 * at every op result. */
static void test_low_precision_rounding(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[6] = input \"x\"\n"
                  "%1:bf16[6] = cast %0\n"
                  "%2:f16[6] = cast %0\n"
                  "%3:bf16[6] = add %1, %1\n"
                  "%4:bf16[6] = input \"y\"\n"
                  "%5:bf16[6] = add %4, %4\n"
                  "%6:bf16[] = const {value=0.1}\n"
                  "%7:f32[6] = cast %1\n"
                  "output \"bf16\" %1\noutput \"f16\" %2\noutput \"sum\" %3\n"
                  "output \"in\" %5\noutput \"const\" %6\noutput \"back\" %7\n");
    double u = ldexp(1, -8);
    set(&r, "x", D(1 + u, 1 + 3 * u, 1 + u + ldexp(1, -20), -(1 + u), 70000, 65519));
    set(&r, "y", D(1, 1 + ldexp(1, -9), ldexp(1, -140), 3, 0, -0.0));
    go(&r, 0, 0);
    EXPECT(&r, "bf16", 1, 1 + 4 * u, 1 + 2 * u, -1, 70144, 65536);
    EXPECT(&r, "back", 1, 1 + 4 * u, 1 + 2 * u, -1, 70144, 65536);
    /* f16: ulp at 1 is 2^-10, so 1 + 2^-8 is exact; 70000 overflows */
    EXPECT(&r, "f16", 1 + u, 1 + 3 * u, 1 + u, -(1 + u), INFINITY, 65504);
    EXPECT(&r, "sum", 2, 2 + 8 * u, 2 + 4 * u, -2, 140288, 131072);
    /* inputs are not rounded, op results are: 2 + 2^-8 is a quarter ulp -> 2;
     * 2^-139 is below half of bf16's smallest subnormal 2^-133 -> 0 */
    EXPECT(&r, "in", 2, 2, 0, 6, 0, -0.0);
    EXPECT(&r, "const", 0.10009765625);
    finish(&r);
}

static void test_const_iota_broadcast(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[2,3] = const {value=1.5}\n"
                  "%1:i32[2,3] = iota {axis=1}\n"
                  "%2:i64[2,3] = iota {axis=0}\n"
                  "%3:f32[3,1] = input \"c\"\n"
                  "%4:f32[3,2] = broadcast %3\n"
                  "%5:f32[2] = input \"r\"\n"
                  "%6:f32[2,3,2] = broadcast %5\n"
                  "%7:f32[] = input \"s\"\n"
                  "%8:f32[2,2] = broadcast %7\n"
                  "%9:i32[] = const {value=-2.7}\n"
                  "%10:f32[2,3,2] = broadcast %4\n"
                  "output \"const\" %0\noutput \"iota1\" %1\noutput \"iota0\" %2\n"
                  "output \"col\" %4\noutput \"row\" %6\noutput \"scalar\" %8\n"
                  "output \"iconst\" %9\noutput \"lead\" %10\n");
    set(&r, "c", D(1, 2, 3));
    set(&r, "r", D(7, 8));
    set(&r, "s", D(4));
    go(&r, 0, 0);
    EXPECT(&r, "const", 1.5, 1.5, 1.5, 1.5, 1.5, 1.5);
    EXPECT(&r, "iota1", 0, 1, 2, 0, 1, 2);
    EXPECT(&r, "iota0", 0, 0, 0, 1, 1, 1);
    EXPECT(&r, "col", 1, 1, 2, 2, 3, 3);
    EXPECT(&r, "row", 7, 8, 7, 8, 7, 8, 7, 8, 7, 8, 7, 8);
    EXPECT(&r, "scalar", 4, 4, 4, 4);
    EXPECT(&r, "iconst", -2);
    EXPECT(&r, "lead", 1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3);
    finish(&r);
}

static void test_movement(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[3,4] = input \"x\"\n"
                  "%1:f32[4,3] = permute %0 {perm=[1,0]}\n"
                  "%2:f32[2,2] = slice %0 {start=[1,1]}\n"
                  "%3:f32[4,4] = pad %2 {lo=[1,2]}\n"
                  "%4:f32[2,6] = reshape %0\n"
                  "%5:f32[3,1] = slice %0 {start=[0,3]}\n"
                  "%6:f32[3,6] = concat %5, %0, %5 {axis=1}\n"
                  "%7:f32[2,3,2] = reshape %0\n"
                  "%8:f32[2,2,3] = permute %7 {perm=[2,0,1]}\n"
                  "%9:f32[2,4] = slice %0 {start=[0,0]}\n"
                  "%10:f32[5,4] = concat %0, %9 {axis=0}\n"
                  "%11:f32[3,4] = allreduce %0\n"
                  "output \"t\" %1\noutput \"slice\" %2\noutput \"pad\" %3\n"
                  "output \"reshape\" %4\noutput \"concat\" %6\noutput \"perm3\" %8\n"
                  "output \"concat0\" %10\noutput \"allreduce\" %11\n");
    set(&r, "x", D(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
    go(&r, 0, 0);
    EXPECT(&r, "t", 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11);
    EXPECT(&r, "slice", 5, 6, 9, 10);
    EXPECT(&r, "pad", 0, 0, 0, 0, 0, 0, 5, 6, 0, 0, 9, 10, 0, 0, 0, 0);
    EXPECT(&r, "reshape", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    EXPECT(&r, "concat", 3, 0, 1, 2, 3, 3, 7, 4, 5, 6, 7, 7, 11, 8, 9, 10, 11, 11);
    EXPECT(&r, "perm3", 0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11);
    EXPECT(&r, "concat0", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7);
    EXPECT(&r, "allreduce", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
    finish(&r);
}

/* gather reads zeros for an out-of-range index; scatter_add accumulates
 * repeated indices and drops out-of-range ones. */
static void test_gather_scatter(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[3,2] = input \"table\"\n"
                  "%1:i32[2,2] = input \"idx\"\n"
                  "%2:f32[2,2,2] = gather %0, %1\n"
                  "%3:i64[5] = input \"sidx\"\n"
                  "%4:f32[5,2] = input \"src\"\n"
                  "%5:f32[4,2] = scatter_add %3, %4\n"
                  "%6:f32[3] = input \"vec\"\n"
                  "%7:f32[2,2] = gather %6, %1\n"
                  "output \"gather\" %2\noutput \"scatter\" %5\noutput \"gvec\" %7\n");
    set(&r, "table", D(1, 2, 3, 4, 5, 6));
    set(&r, "idx", D(2, 0, 5, -1));
    set(&r, "sidx", D(1, 1, 3, 0, 7));
    set(&r, "src", D(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
    set(&r, "vec", D(10, 20, 30));
    go(&r, 0, 0);
    EXPECT(&r, "gather", 5, 6, 1, 2, 0, 0, 0, 0);
    EXPECT(&r, "scatter", 7, 8, 4, 6, 0, 0, 5, 6);
    EXPECT(&r, "gvec", 30, 10, 0, 0);
    finish(&r);
}

/* im2col's patches (c-major, then kernel rows), padding read as 0,
 * strides and dilation; col2im sums each column element back where it was
 * read (of ones: how many windows cover each pixel) */
static void test_im2col(void **state)
{
    (void)state;
    Run r = start("kiln-ir v2\n"
                  "%0:f32[1,1,3,3] = input \"x\"\n"
                  "%1:f32[1,2,5] = input \"x1\"\n"
                  "%2:f32[1,2,2,4] = input \"ones\"\n"
                  "%3:f32[1,2,2,4] = im2col %0 {kernel=[2,2],stride=[1,1],pad=[0,0],"
                  "dilation=[1,1]}\n"
                  "%4:f32[1,2,2,4] = im2col %0 {kernel=[2,2],stride=[2,2],pad=[1,1],"
                  "dilation=[1,1]}\n"
                  "%5:f32[1,3,4] = im2col %1 {kernel=[2],stride=[1],pad=[0],dilation=[2]}\n"
                  "%6:f32[1,1,3,3] = col2im %2 {kernel=[2,2],stride=[1,1],pad=[0,0],"
                  "dilation=[1,1]}\n"
                  "output \"plain\" %3\noutput \"padded\" %4\noutput \"dilated\" %5\n"
                  "output \"count\" %6\nend\n");
    set(&r, "x", D(1, 2, 3, 4, 5, 6, 7, 8, 9));
    set(&r, "x1", D(1, 2, 3, 4, 5, 10, 20, 30, 40, 50));
    set(&r, "ones", D(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));
    go(&r, 0, 0);
    EXPECT(&r, "plain", 1, 2, 4, 5, 2, 3, 5, 6, 4, 5, 7, 8, 5, 6, 8, 9);
    EXPECT(&r, "padded", 0, 0, 0, 1, 0, 0, 2, 3, 0, 4, 0, 7, 5, 6, 8, 9);
    EXPECT(&r, "dilated", 1, 3, 10, 30, 2, 4, 20, 40, 3, 5, 30, 50);
    EXPECT(&r, "count", 1, 2, 1, 2, 4, 2, 1, 2, 1);
    finish(&r);
}

static void test_reduce(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[2,3] = input \"x\"\n"
                  "%1:f32[2,1] = reduce_sum %0 {axes=[1]}\n"
                  "%2:f32[1,3] = reduce_sum %0 {axes=[0]}\n"
                  "%3:f32[1,1] = reduce_sum %0 {axes=[0,1]}\n"
                  "%4:f32[2,1] = reduce_max %0 {axes=[1]}\n"
                  "%5:f32[1,3] = reduce_max %0 {axes=[0]}\n"
                  "%6:f32[2,2,2] = input \"y\"\n"
                  "%7:f32[2,1,2] = reduce_sum %6 {axes=[1]}\n"
                  "%8:f32[2,1,1] = reduce_max %6 {axes=[1,2]}\n"
                  "output \"sum1\" %1\noutput \"sum0\" %2\noutput \"sumall\" %3\n"
                  "output \"max1\" %4\noutput \"max0\" %5\noutput \"mid\" %7\n"
                  "output \"max12\" %8\n");
    set(&r, "x", D(1, 5, 2, -3, 0, 4));
    set(&r, "y", D(0, 1, 2, 3, -4, -5, -6, -7));
    go(&r, 0, 0);
    EXPECT(&r, "sum1", 8, 1);
    EXPECT(&r, "sum0", -2, 5, 6);
    EXPECT(&r, "sumall", 9);
    EXPECT(&r, "max1", 5, 4);
    EXPECT(&r, "max0", 1, 5, 4);
    EXPECT(&r, "mid", 2, 4, -10, -12);
    EXPECT(&r, "max12", 3, -4);
    finish(&r);
}

/* A = [[1,2,3],[4,5,6]], B = [[7,8],[9,10],[11,12]]: AB = [[58,64],[139,154]],
 * with every transpose flag given the transposed operand. */
static void test_matmul(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[2,3] = input \"a\"\n"
                  "%1:f32[3,2] = input \"at\"\n"
                  "%2:f32[3,2] = input \"b\"\n"
                  "%3:f32[2,3] = input \"bt\"\n"
                  "%4:f32[2,2] = matmul %0, %2 {ta=0,tb=0}\n"
                  "%5:f32[2,2] = matmul %1, %2 {ta=1,tb=0}\n"
                  "%6:f32[2,2] = matmul %0, %3 {ta=0,tb=1}\n"
                  "%7:f32[2,2] = matmul %1, %3 {ta=1,tb=1}\n"
                  "%8:f32[2,2,3] = input \"ab\"\n"
                  "%9:f32[2,2,2] = matmul %8, %2 {ta=0,tb=0}\n"
                  "%10:f32[2,3,2] = input \"bb\"\n"
                  "%11:f32[2,2,2] = matmul %8, %10 {ta=0,tb=0}\n"
                  "%12:f32[2,3,2] = permute %8 {perm=[0,2,1]}\n"
                  "%13:f32[2,2,2] = matmul %12, %3 {ta=1,tb=1}\n"
                  "output \"nn\" %4\noutput \"tn\" %5\noutput \"nt\" %6\noutput \"tt\" %7\n"
                  "output \"shared\" %9\noutput \"batched\" %11\noutput \"sharedtt\" %13\n");
    set(&r, "a", D(1, 2, 3, 4, 5, 6));
    set(&r, "at", D(1, 4, 2, 5, 3, 6));
    set(&r, "b", D(7, 8, 9, 10, 11, 12));
    set(&r, "bt", D(7, 9, 11, 8, 10, 12));
    set(&r, "ab", D(1, 2, 3, 4, 5, 6, 2, 4, 6, 8, 10, 12));
    set(&r, "bb", D(7, 8, 9, 10, 11, 12, 1, 0, 0, 1, 0, 0));
    go(&r, 0, 0);
    EXPECT(&r, "nn", 58, 64, 139, 154);
    EXPECT(&r, "tn", 58, 64, 139, 154);
    EXPECT(&r, "nt", 58, 64, 139, 154);
    EXPECT(&r, "tt", 58, 64, 139, 154);
    EXPECT(&r, "shared", 58, 64, 139, 154, 116, 128, 278, 308);
    EXPECT(&r, "batched", 58, 64, 139, 154, 2, 4, 8, 10);
    EXPECT(&r, "sharedtt", 58, 64, 139, 154, 116, 128, 278, 308);
    finish(&r);
}

static void test_random(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[2,3] = random {key=3}\n"
                  "%1:f32[2,3] = random {key=4}\n"
                  "output \"r3\" %0\noutput \"r4\" %1\n");
    double first[6], other[6];
    go(&r, 42, 1);
    memcpy(first, out(&r, "r3"), sizeof first);
    for (int i = 0; i < 6; i++) {
        assert_true(first[i] >= 0 && first[i] < 1);
        assert_true(first[i] == (double)ir_rand_u01(42, 3, 1, (uint64_t)i));
        assert_true(first[i] != out(&r, "r4")[i]); /* the key matters */
    }
    go(&r, 42, 1); /* same seed, key and step: the same numbers */
    assert_memory_equal(first, out(&r, "r3"), sizeof first);
    go(&r, 42, 2); /* the next step: different numbers */
    memcpy(other, out(&r, "r3"), sizeof other);
    int same = 0;
    for (int i = 0; i < 6; i++)
        same += other[i] == first[i];
    assert_int_equal(same, 0);
    go(&r, 43, 1); /* another seed: different numbers */
    same = 0;
    for (int i = 0; i < 6; i++)
        same += out(&r, "r3")[i] == first[i];
    assert_int_equal(same, 0);
    finish(&r);
}

/* Updates copy each value into its target; the next run reads the new value. */
static void test_updates(void **state)
{
    (void)state;
    Run r = start("kiln-ir v1\n"
                  "%0:f32[2] = param \"w\" zeros\n"
                  "%1:f32[2] = state \"m\" zeros\n"
                  "%2:f32[2] = add %0, %1\n"
                  "%3:f32[2] = mul %0, %0\n"
                  "output \"sum\" %2\n"
                  "update %0 <- %2\n"
                  "update %1 <- %3\n");
    set(&r, "w", D(1, 2));
    set(&r, "m", D(10, 20));
    go(&r, 0, 0);
    ir_interp_apply_updates(r.g, r.val);
    EXPECT(&r, "sum", 11, 22);
    int w = ir_find_tensor(r.g, "w"), m = ir_find_tensor(r.g, "m");
    assert_true(r.val[w][0] == 11 && r.val[w][1] == 22);
    assert_true(r.val[m][0] == 1 && r.val[m][1] == 4);
    go(&r, 0, 0);
    EXPECT(&r, "sum", 12, 26);
    finish(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary_compare_select),
        cmocka_unit_test(test_integers_and_cast),
        cmocka_unit_test(test_low_precision_rounding),
        cmocka_unit_test(test_const_iota_broadcast),
        cmocka_unit_test(test_movement),
        cmocka_unit_test(test_gather_scatter),
        cmocka_unit_test(test_im2col),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_updates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
