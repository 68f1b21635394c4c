/* test_ir_text.c - the IR text form: print -> parse -> print round trips over
 * every opcode and attribute kind (dim names included), hand-written text,
 * malformed text, and dims named by provenance (ir/dimnames.c). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const SrcLoc noloc = {NULL, 0};

static int op(Graph *g, Opcode c, const int *in, int nin, OpAttr a)
{
    return ir_op_x(g, c, in, nin, &a, noloc);
}
#define OP(g, c, attr, ...) \
    op(g, c, (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), attr)
#define OP0(g, c, attr) op(g, c, NULL, 0, attr)

#define SH(dt, ...) \
    shape_make(dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static Op *last_op(Graph *g) { return &g->ops.v[g->ops.n - 1]; }

/* s with its dims named n0, n1, ... (NULL: unnamed), as the frontend names
 * a shape written with symbols */
static Shape named(Shape s, const char *n0, const char *n1)
{
    s.dname[0] = n0 ? intern(n0) : NULL;
    if (s.rank > 1)
        s.dname[1] = n1 ? intern(n1) : NULL;
    return s;
}

/* A graph that uses every opcode and attribute kind, symbols, flags, groups,
 * source locations, outputs and updates. B=2 T=3 C=4 V=5. */
static Graph *build_all(void)
{
    Graph *g = ir_new();
    ir_add_sym(g, "B", 2);
    ir_add_sym(g, "T", 3);
    ir_add_sym(g, "C", 4);
    ir_add_sym(g, "V", 5);
    int wte = ir_add_input(g, TK_PARAM, "wte", named(SH(DT_F32, 5, 4), "V", "C"),
                           (ParamInit){INIT_NORMAL, 0.02, 0});
    int tok = ir_add_input(g, TK_INPUT, "tokens", named(SH(DT_I32, 2, 3), "B", "T"),
                           (ParamInit){0});
    g->t.v[wte].shard = (IrShard){true, 1, 2, 0, 0}; /* shard(axis=1,blocks=2) */
    int m = ir_add_input(g, TK_STATE, "adam.m.wte", named(SH(DT_F32, 5, 4), "V", "C"),
                         (ParamInit){INIT_ZEROS, 0, 0});
    int u = ir_add_input(g, TK_PARAM, "u \"q\"", named(SH(DT_F32, 4), "C", NULL),
                         (ParamInit){INIT_UNIFORM, -0.1, 0.1});
    int o1 = ir_add_input(g, TK_PARAM, "ones", named(SH(DT_F32, 4), "C", NULL),
                          (ParamInit){INIT_ONES, 0, 0});
    ir_add_input(g, TK_PARAM, "nothing", SH(DT_BF16, 7), (ParamInit){INIT_NONE, 0, 0});
    (void)u;
    (void)o1;

    int x = OP(g, OP_GATHER, (OpAttr){0}, wte, tok);
    last_op(g)->loc = (SrcLoc){intern("models/gpt.lua"), 28};
    int c0 = OP0(g, OP_CONST, ((OpAttr){.f = 0.1, .dtype = DT_F32}));
    double vals[] = {-0.0, 3.0, 1e-8, INFINITY, -INFINITY, NAN, 1.0 / 3.0, 6.02214076e23};
    for (int i = 0; i < (int)(sizeof vals / sizeof vals[0]); i++)
        OP0(g, OP_CONST, ((OpAttr){.f = vals[i], .dtype = DT_F32, .rank = 1, .shape = {3}}));
    int y = OP0(g, OP_CONST,
                ((OpAttr){.f = 2.5, .dtype = DT_F32, .rank = 3, .shape = {2, 3, 4}}));
    OP0(g, OP_IOTA, ((OpAttr){.ia = {1}, .nia = 1, .dtype = DT_I32, .rank = 2, .shape = {2, 3}}));
    Opcode un[] = {OP_NEG, OP_EXP, OP_LOG, OP_SIN, OP_COS, OP_TANH,
                   OP_SQRT, OP_RSQRT, OP_SIGMOID, OP_RELU, OP_ABS, OP_ERF, OP_FLOOR,
                   OP_STOP_GRADIENT,
                   OP_ALLREDUCE};
    for (int i = 0; i < (int)(sizeof un / sizeof un[0]); i++)
        OP(g, un[i], (OpAttr){0}, x);
    last_op(g)->flags = OPF_BACKWARD | OPF_RECOMPUTE;
    last_op(g)->group = 3;
    OP(g, OP_CAST, ((OpAttr){.dtype = DT_BF16}), x);
    last_op(g)->flags = OPF_OPTIM;
    Opcode bin[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_MAX, OP_MIN,
                    OP_LT, OP_LE, OP_GT, OP_GE, OP_EQ, OP_NE};
    int mask = -1;
    for (int i = 0; i < (int)(sizeof bin / sizeof bin[0]); i++)
        mask = OP(g, bin[i], (OpAttr){0}, x, y);
    last_op(g)->group = 0;
    OP(g, OP_SELECT, (OpAttr){0}, mask, x, y);
    OP(g, OP_BROADCAST, ((OpAttr){.rank = 3, .shape = {2, 3, 4}}), c0);
    OP(g, OP_RESHAPE, ((OpAttr){.rank = 2, .shape = {6, 4}}), x);
    int xp = OP(g, OP_PERMUTE, ((OpAttr){.ia = {0, 2, 1}, .nia = 3}), x);
    OP(g, OP_SLICE, ((OpAttr){.ia = {0, 1, 0}, .nia = 3, .rank = 3, .shape = {2, 2, 4}}), x);
    OP(g, OP_PAD, ((OpAttr){.ia = {0, 1, 2}, .nia = 3, .rank = 3, .shape = {2, 5, 7}}), x);
    int qkv = OP(g, OP_CONCAT, ((OpAttr){.ia = {2}, .nia = 1}), x, x, y);
    int sc = OP(g, OP_SCATTER_ADD, ((OpAttr){.rank = 2, .shape = {5, 4}, .dname = {intern("V")}}),
                tok, x);
    last_op(g)->flags = OPF_BACKWARD;
    last_op(g)->loc = (SrcLoc){intern("dir with space/f:x.lua"), 7};
    OP(g, OP_REDUCE_MAX, ((OpAttr){.ia = {2}, .nia = 1}), x);
    OP(g, OP_REDUCE_LOGSUMEXP, ((OpAttr){.ia = {1, 2}, .nia = 2}), x);
    OP(g, OP_TAKE_ALONG, (OpAttr){0}, x, tok);
    int loss = OP(g, OP_REDUCE_SUM, ((OpAttr){.ia = {0, 1, 2}, .nia = 3}), x);
    OP(g, OP_MATMUL, ((OpAttr){.ia = {0, 0}, .nia = 2}), x, xp);
    OP(g, OP_MATMUL, ((OpAttr){.ia = {0, 1}, .nia = 2}), x, wte);
    OP(g, OP_MATMUL, ((OpAttr){.ia = {1, 0}, .nia = 2}), x, x);
    OP0(g, OP_RANDOM, ((OpAttr){.ia = {7}, .nia = 1, .rank = 2, .shape = {2, 3},
                                .dname = {intern("B"), intern("T")}}));
    int m2 = OP(g, OP_ADD, (OpAttr){0}, m, sc);
    last_op(g)->flags = OPF_OPTIM;
    /* the attention family: causal with a scale that needs all its digits */
    OpAttr at = {.ia = {1}, .nia = 1, .f = 1.0 / 3.0};
    OP(g, OP_ATTENTION, at, x, x, x);
    int lse = OP(g, OP_ATTENTION_LSE, ((OpAttr){.ia = {0}, .nia = 1, .f = 0.125}), x, x);
    OP(g, OP_ATTENTION_DQ, at, x, x, x, x, lse, lse);
    OP(g, OP_ATTENTION_DK, at, x, x, x, x, lse, lse);
    OP(g, OP_ATTENTION_DV, at, x, x, x, x, lse, lse);
    /* the head layout: 2 heads of size 1 read out of x's rows of C = 4 */
    OpAttr ah = {.ia = {1, 2, 1, 0, 1, 2}, .nia = 6, .f = 0.5};
    int oh = OP(g, OP_ATTENTION, ah, x, x, x);
    int lh = OP(g, OP_ATTENTION_LSE, ah, x, x);
    OP(g, OP_ATTENTION_DQ, ah, x, x, x, oh, lh, lh);
    OP(g, OP_ATTENTION_DK, ah, x, x, x, oh, lh, lh);
    OP(g, OP_ATTENTION_DV, ah, x, x, x, oh, lh, lh);
    int tok_ar = OP(g, OP_ALLREDUCE_START, ((OpAttr){.ia = {3}, .nia = 1}), sc, x);
    OP(g, OP_ALLREDUCE_WAIT, ((OpAttr){.ia = {3}, .nia = 1}), tok_ar, sc);
    /* ZeRO-1: wte and sc as one flat range of 40 over 2 ranks (shard f32[32]) */
#define SHA(b, s) ((OpAttr){.ia = {b, s, 40, 2}, .nia = 4})
    int sh = OP(g, OP_SHARD_PACK, SHA(-1, 0), wte, sc);
    OP(g, OP_REDUCE_SCATTER, SHA(-1, 20), sc);
    int tok_rs = OP(g, OP_REDUCE_SCATTER_START, SHA(4, 0), sh, wte, sc);
    OP(g, OP_REDUCE_SCATTER_WAIT, SHA(4, 0), tok_rs, sh, wte, sc);
    OP(g, OP_ALL_GATHER, SHA(-1, 0), sh, wte);
    int tok_ag = OP(g, OP_ALL_GATHER_START, SHA(5, 0), sh, wte, sc);
    OP(g, OP_ALL_GATHER_WAIT, SHA(5, 20), tok_ag, sh, sc);
#undef SHA
    /* attention_dqkv (last: the ids printed above stay): 2 heads of size 2,
     * q, k, v at columns 8, 0, 4 of qkv's 12 */
    OpAttr ad = {.ia = {1, 2, 2, 8, 0, 4}, .nia = 6, .f = 0.5};
    OP(g, OP_ATTENTION_DQKV, ad, qkv, qkv, qkv, x, lh, lh);
    /* tensor parallelism over 2 ranks, as rank 1 */
    OP(g, OP_TP_ALLREDUCE, ((OpAttr){.ia = {0, 2, 1}, .nia = 3}), x);
    OP(g, OP_TP_COPY, ((OpAttr){.ia = {0, 2, 1}, .nia = 3}), x);
    OP(g, OP_TP_ALL_GATHER, ((OpAttr){.ia = {1, 2, 1}, .nia = 3}), x);
    OP(g, OP_TP_ALL_GATHER, ((OpAttr){.ia = {2, 2, 1, 1}, .nia = 4}), x);
    OP(g, OP_TP_REDUCE_SCATTER, ((OpAttr){.ia = {2, 2, 1}, .nia = 3}), x);
    /* im2col and col2im, 1d and 2d (after every id printed above) */
    int cols = OP(g, OP_IM2COL, ((OpAttr){.ia = {2, 1, 1, 2}, .nia = 4}), x);
    OP(g, OP_COL2IM, ((OpAttr){.ia = {2, 1, 1, 2}, .nia = 4, .rank = 3, .shape = {2, 3, 4}}), cols);
    int x4 = OP(g, OP_RESHAPE, ((OpAttr){.rank = 4, .shape = {2, 3, 2, 2}}), x);
    OP(g, OP_IM2COL, ((OpAttr){.ia = {2, 1, 2, 1, 0, 1, 1, 1}, .nia = 8}), x4);
    ir_add_output(g, "loss", loss);
    ir_add_output(g, "grad.wte", sc);
    ir_add_update(g, wte, sc);
    ir_add_update(g, m, m2);
    return g;
}

static bool attr_eq(const OpAttr *a, const OpAttr *b)
{
    if (a->nia != b->nia || a->dtype != b->dtype || a->rank != b->rank)
        return false;
    if (memcmp(&a->f, &b->f, sizeof a->f) != 0 && !(isnan(a->f) && isnan(b->f)))
        return false;
    for (int i = 0; i < a->nia; i++)
        if (a->ia[i] != b->ia[i])
            return false;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

/* Structural equality (same ids, since both are dense). */
static void assert_graph_eq(const Graph *a, const Graph *b)
{
    assert_int_equal(a->t.n, b->t.n);
    assert_int_equal(a->ops.n, b->ops.n);
    assert_int_equal(a->syms.n, b->syms.n);
    for (int i = 0; i < a->t.n; i++) {
        const Tensor *x = &a->t.v[i], *y = &b->t.v[i];
        assert_true(shape_eq(&x->s, &y->s));
        for (int k = 0; k < x->s.rank; k++) /* names are interned: the same pointer */
            assert_ptr_equal(x->s.dname[k], y->s.dname[k]);
        assert_int_equal(x->kind, y->kind);
        assert_int_equal(x->op, y->op);
        assert_ptr_equal(x->name, y->name); /* interned */
        assert_int_equal(x->init.kind, y->init.kind);
        assert_memory_equal(&x->shard, &y->shard, sizeof x->shard);
        if (x->op < 0 && x->init.kind != INIT_NONE) {
            assert_memory_equal(&x->init.a, &y->init.a, sizeof(double));
            assert_memory_equal(&x->init.b, &y->init.b, sizeof(double));
        }
    }
    for (int i = 0; i < a->ops.n; i++) {
        const Op *x = &a->ops.v[i], *y = &b->ops.v[i];
        assert_int_equal(x->code, y->code);
        assert_int_equal(x->nin, y->nin);
        for (int j = 0; j < x->nin; j++)
            assert_int_equal(x->in[j], y->in[j]);
        assert_int_equal(x->out, y->out);
        assert_true(attr_eq(&x->attr, &y->attr));
        assert_int_equal(x->flags, y->flags);
        assert_int_equal(x->group, y->group);
        assert_ptr_equal(x->loc.file, y->loc.file);
        assert_int_equal(x->loc.line, y->loc.line);
    }
    assert_int_equal(a->outs.n, b->outs.n);
    for (int i = 0; i < a->outs.n; i++) {
        assert_string_equal(a->outs.v[i].name, b->outs.v[i].name);
        assert_int_equal(a->outs.v[i].t, b->outs.v[i].t);
    }
    assert_int_equal(a->upd.n, b->upd.n);
    for (int i = 0; i < a->upd.n; i++) {
        assert_int_equal(a->upd.v[i].target, b->upd.v[i].target);
        assert_int_equal(a->upd.v[i].value, b->upd.v[i].value);
    }
}

static void test_round_trip_all_opcodes(void **state)
{
    (void)state;
    Graph *g = build_all();
    char err[512];
    assert_true(ir_verify(g, err, sizeof err));

    bool seen_op[OP__COUNT] = {0}, seen_attr[AK__COUNT] = {0};
    for (int i = 0; i < g->ops.n; i++) {
        seen_op[g->ops.v[i].code] = true;
        seen_attr[ir_opinfo[g->ops.v[i].code].attr] = true;
    }
    for (int i = 0; i < OP__COUNT; i++)
        if (!seen_op[i])
            fail_msg("opcode %s is not covered by the round-trip graph", ir_opinfo[i].name);
    for (int i = 0; i < AK__COUNT; i++)
        assert_true(seen_attr[i]);

    char *p1 = ir_print_str(g);
    Graph *g2 = parse_or_fail(p1);
    char *p2 = ir_print_str(g2);
    assert_string_equal(p1, p2);
    assert_graph_eq(g, g2);
    /* the special doubles survived bit for bit */
    assert_true(signbit(g2->ops.v[2].attr.f) && g2->ops.v[2].attr.f == 0);
    assert_true(g2->ops.v[1].attr.f == 0.1);
    assert_true(g2->ops.v[4].attr.f == 1e-8);
    assert_true(isnan(g2->ops.v[7].attr.f));
    assert_true(g2->ops.v[8].attr.f == 1.0 / 3.0);
    assert_true(g2->t.v[3].init.a == -0.1 && g2->t.v[3].init.b == 0.1);
    free(p1);
    free(p2);
    ir_free(g);
    ir_free(g2);
}

/* Exact lines for a few forms, so the format itself is pinned down. */
static void test_print_format(void **state)
{
    (void)state;
    Graph *g = build_all();
    char *p = ir_print_str(g);
    const char *want[] = {
        "kiln-ir v2\nsym B=2 T=3 C=4 V=5\n",
        "\n%0:f32[V,C] = param \"wte\" normal(0.02) shard(axis=1,blocks=2)\n",
        "\n%1:i32[B,T] = input \"tokens\"\n",
        "\n%2:f32[V,C] = state \"adam.m.wte\" zeros\n",
        "\n%3:f32[C] = param \"u \\\"q\\\"\" uniform(-0.1,0.1)\n",
        "\n%4:f32[C] = param \"ones\" ones\n",
        "\n%5:bf16[7] = param \"nothing\" none\n",
        "\n%6:f32[B,T,C] = gather %0, %1   # models/gpt.lua:28\n",
        "\n%7:f32[] = const {value=0.1}\n",
        /* a literal 3 prints as 3 although T=3: it did not come from T */
        "\n%8:f32[3] = const {value=-0}\n",
        "\n%9:f32[3] = const {value=3}\n",
        "\n%10:f32[3] = const {value=1e-08}\n",
        "{value=inf}\n",
        "{value=-inf}\n",
        "{value=nan}\n",
        "{value=0.3333333333333333}\n",
        "{value=6.02214076e+23}\n",
        "= iota {axis=1}\n",
        "= allreduce %6 !backward !recompute !group=3\n",
        ":bf16[B,T,C] = cast %6 !optim\n",
        ":f32[B,T,C] = select %46, %6, %16\n", /* %16 is f32[2,3,4]: names from %6 */
        "%48:f32[2,3,4] = broadcast %7\n",     /* numbers given as numbers */
        ":f32[6,C] = reshape %6\n",            /* B,T merged: the trailing C kept */
        ":f32[B,C,T] = permute %6 {perm=[0,2,1]}\n",
        ":f32[B,2,C] = slice %6 {start=[0,1,0]}\n",
        ":f32[B,T,1] = reduce_max %6 {axes=[2]}\n",
        ":f32[B,T] = take_along %6, %1\n",
        ":f32[B,T,T] = matmul %6, %50 {ta=0,tb=0}\n",
        ":f32[B,C,C] = matmul %6, %6 {ta=1,tb=0}\n",
        ":f32[B,T,1] = attention_lse %6, %6",
        ":f32[B,T,2,1] = attention_lse %6, %6 {causal=1,scale=0.5,heads=2,hd=1,qoff=0,koff=1,"
        "voff=2}",
        ":f32[V,C] = allreduce_wait %74, %54 {bucket=3}\n",
        "= ne %6, %16 !group=0\n",
        "= permute %6 {perm=[0,2,1]}\n",
        "= slice %6 {start=[0,1,0]}\n",
        ":f32[B,5,7] = pad %6 {lo=[0,1,2]}\n", /* 5 == V, but the axis is not V's */
        ":f32[B,T,12] = concat %6, %6, %16 {axis=2}\n",
        ":f32[V,C] = scatter_add %1, %6 !backward   # dir with space/f:x.lua:7\n",
        ":f32[1,1,1] = reduce_sum %6 {axes=[0,1,2]}\n",
        ":f32[B,T,V] = matmul %6, %0 {ta=0,tb=1}\n",
        ":f32[B,T] = random {key=7}\n",
        "= tp_allreduce %6 {axis=0,n=2,rank=1}\n",
        "= tp_copy %6 {axis=0,n=2,rank=1}\n",
        ":f32[B,6,C] = tp_all_gather %6 {axis=1,n=2,rank=1}\n",
        ":f32[B,T,8] = tp_all_gather %6 {axis=2,n=2,rank=1,sum=1}\n",
        ":f32[B,T,2] = tp_reduce_scatter %6 {axis=2,n=2,rank=1}\n",
        ":f32[B,4,6] = im2col %6 {kernel=[2],stride=[1],pad=[1],dilation=[2]}\n",
        ":f32[B,3,4] = col2im %",
        ":f32[B,1,4,6] = im2col %",
        " {kernel=[2,1],stride=[2,1],pad=[0,1],dilation=[1,1]}\n",
        "output \"loss\" %",
        "update %0 <- %",
        "update %2 <- %",
        "\nend\n",
    };
    for (int i = 0; i < (int)(sizeof want / sizeof want[0]); i++)
        if (!strstr(p, want[i]))
            fail_msg("printed IR lacks \"%s\"; got:\n%s", want[i], p);
    free(p);
    ir_free(g);
}

static void expect_error(const char *text, const char *prefix, const char *needle);

/* v2 text (what ir_print writes) ends with `end`: the text cut short at any
 * line, or in the middle of one, is an error naming the file and the line,
 * never a smaller graph; v1 text (written before the marker) parses
 * without it. */
static void test_end_marker(void **state)
{
    (void)state;
    Graph *g = build_all();
    char *p = ir_print_str(g);
    size_t n = strlen(p);
    assert_true(n > 6 && strcmp(p + n - 5, "\nend\n") == 0);
    char err[512];
    int cuts = 0;
    for (size_t k = 0; k + 4 < n; k += 7) { /* every 7th byte: mid-line and at line ends */
        char *cut = xmalloc(k + 1);
        memcpy(cut, p, k);
        cut[k] = 0;
        err[0] = 0;
        Graph *h = ir_parse(cut, "t.ir", err, sizeof err);
        if (h)
            fail_msg("text cut at byte %zu of %zu parsed:\n%s", k, n, cut);
        if (strncmp(err, "t.ir:", 5) != 0)
            fail_msg("cut at %zu: the error names no file and line: %s", k, err);
        cuts++;
        free(cut);
    }
    assert_true(cuts > 100);
    /* cut right before the end line */
    p[n - 4] = 0;
    expect_error(p, "t.ir:", "the IR ends without its 'end' line");
    /* text after the end line: only comments */
    char *more = xasprintf("kiln-ir v2\n%%a:f32[2] = input \"a\"\noutput \"y\" %%a\nend\n"
                           "# group 1: ...\n\n%s",
                           "%b:f32[2] = neg %a\n");
    expect_error(more, "t.ir:7: ", "text after the 'end' line");
    more[strlen(more) - strlen("%b:f32[2] = neg %a\n")] = 0;
    Graph *h = ir_parse(more, "t.ir", err, sizeof err);
    if (!h)
        fail_msg("%s", err);
    ir_free(h);
    free(more);
    /* v1: no end line needed (and one is allowed) */
    static const char *const v1[] = {
        "kiln-ir v1\n%a:f32[2] = input \"a\"\noutput \"y\" %a\n",
        "kiln-ir v1\n%a:f32[2] = input \"a\"\noutput \"y\" %a\nend\n",
    };
    for (int i = 0; i < 2; i++) {
        h = ir_parse(v1[i], "t.ir", err, sizeof err);
        if (!h)
            fail_msg("%s", err);
        ir_free(h);
    }
    expect_error("kiln-ir v2\n%a:f32[2] = input \"a\"\noutput \"y\" %a\n", "t.ir:3: ",
                 "the IR ends without its 'end' line (expected 'end' as the last line of "
                 "kiln-ir v2 text, got end of input): the file is cut short");
    expect_error("kiln-ir v2\nend extra\n", "t.ir:2: ", "expected end of line");
    free(p);
    ir_free(g);
}

static void test_round_trip_after_compact(void **state)
{
    (void)state;
    Graph *g = build_all();
    /* an input added after the ops (as the optimizer does), then compacted */
    int lr = ir_add_input(g, TK_INPUT, "lr", SH(DT_F32, 1), (ParamInit){0});
    int r = OP(g, OP_MUL, (OpAttr){0}, lr, lr);
    ir_add_output(g, "lr2", r);
    char *p0 = ir_print_str(g); /* not compacted: still parses */
    Graph *g0 = parse_or_fail(p0);
    ir_compact(g);
    char *p1 = ir_print_str(g);
    char *p0b = ir_print_str(g0);
    assert_string_equal(p0b, p1); /* parsing renumbers as compaction does */
    Graph *g2 = parse_or_fail(p1);
    char *p2 = ir_print_str(g2);
    assert_string_equal(p1, p2);
    free(p0);
    free(p0b);
    free(p1);
    free(p2);
    ir_free(g);
    ir_free(g0);
    ir_free(g2);
}

static void test_hand_written(void **state)
{
    (void)state;
    const char *text = "# a hand-written graph\n"
                       "kiln-ir v1\n"
                       "\n"
                       "sym B=2 C=4\n"
                       "%x:f32[B,C] = input \"x\"   # not a location\n"
                       "%w:f32[C,C] = param \"w\" normal(0.02)\n"
                       "%y:f32[B,C] = matmul %x, %w {tb=1, ta=0}   # m.lua:3\n"
                       "%loss:f32[1,1] = reduce_sum %y {axes=[0,1]} !backward\n"
                       "%w2:f32[4,4] = mul %w, %w\n"
                       "%late:f32[] = input \"late\"\n"
                       "output \"loss\" %loss\n"
                       "update %w <- %w2\n";
    Graph *g = parse_or_fail(text);
    assert_int_equal(g->t.n, 6);
    assert_int_equal(g->ops.n, 3);
    /* inputs first in order of appearance, then op results */
    assert_int_equal(ir_find_tensor(g, "x"), 0);
    assert_int_equal(ir_find_tensor(g, "w"), 1);
    assert_int_equal(ir_find_tensor(g, "late"), 2);
    assert_int_equal(g->ops.v[0].out, 3);
    assert_int_equal(g->ops.v[0].in[1], 1);
    assert_int_equal(g->ops.v[0].attr.ia[1], 1);
    assert_string_equal(g->ops.v[0].loc.file, "m.lua");
    assert_int_equal(g->ops.v[0].loc.line, 3);
    assert_null(g->ops.v[1].loc.file);
    assert_int_equal(g->ops.v[1].flags, OPF_BACKWARD);
    assert_int_equal(ir_find_output(g, "loss"), 4);
    assert_int_equal(g->upd.v[0].target, 1);
    assert_int_equal(g->upd.v[0].value, 5);
    char *p = ir_print_str(g);
    const char *want = "kiln-ir v2\n"
                       "sym B=2 C=4\n"
                       "%0:f32[B,C] = input \"x\"\n"
                       "%1:f32[C,C] = param \"w\" normal(0.02)\n"
                       "%2:f32[] = input \"late\"\n"
                       "%3:f32[B,C] = matmul %0, %1 {ta=0,tb=1}   # m.lua:3\n"
                       "%4:f32[1,1] = reduce_sum %3 {axes=[0,1]} !backward\n"
                       "%5:f32[4,4] = mul %1, %1\n" /* the text's own numbers */
                       "output \"loss\" %4\n"
                       "update %1 <- %5\n"
                       "end\n";
    assert_string_equal(p, want);
    free(p);
    ir_free(g);
}

static void expect_error(const char *text, const char *prefix, const char *needle)
{
    char err[512] = "";
    Graph *g = ir_parse(text, "t.ir", err, sizeof err);
    if (g)
        fail_msg("parsed bad text without error:\n%s", text);
    if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, needle))
        fail_msg("expected an error starting \"%s\" containing \"%s\", got \"%s\"", prefix,
                 needle, err);
}

#define HDR "kiln-ir v1\nsym N=4\n%a:f32[N] = input \"a\"\n"

static void test_malformed(void **state)
{
    (void)state;
    expect_error("", "t.ir:1: ", "expected the header 'kiln-ir v2' (or v1)");
    expect_error("%a:f32[4] = input \"a\"\n", "t.ir:1: ", "expected the header");
    expect_error("kiln-ir v3\n", "t.ir:1: ", "unsupported IR version");
    expect_error(HDR "%b:f32[N] = add %a, %zz\n", "t.ir:4: ", "undefined value %zz");
    expect_error(HDR "%b:f32[N] = neg %a\n%b:f32[N] = neg %a\n", "t.ir:5: ",
                 "redefinition of %b (first defined on line 4)");
    expect_error(HDR "%b:f33[N] = neg %a\n", "t.ir:4: ", "unknown dtype 'f33'");
    expect_error(HDR "%b:f32[M] = neg %a\n", "t.ir:4: ", "unknown dimension 'M'");
    expect_error(HDR "%b:f32[N,] = neg %a\n", "t.ir:4: ", "expected a dimension");
    expect_error(HDR "%b:f32[0] = neg %a\n", "t.ir:4: ", "must be positive");
    expect_error(HDR "%b:f32[N = neg %a\n", "t.ir:4: ", "expected ',' or ']'");
    expect_error(HDR "%b:f32[N] = negate %a\n", "t.ir:4: ", "unknown opcode 'negate'");
    expect_error(HDR "%b:f32[8] = neg %a\n", "t.ir:4: ",
                 "declared type of %b disagrees with neg's result (expected f32[N], got "
                 "f32[8])");
    expect_error(HDR "%b:f32[3] = input \"b\"\n%c:f32[N] = add %a, %b\n", "t.ir:5: ",
                 "add: operand types differ");
    expect_error(HDR "%b:f32[1] = reduce_sum %a\n", "t.ir:4: ",
                 "reduce_sum: missing attribute 'axes'");
    expect_error(HDR "%b:f32[1] = reduce_sum %a {axis=0}\n", "t.ir:4: ",
                 "unknown attribute 'axis'");
    expect_error(HDR "%b:f32[1] = reduce_sum %a {axes=[3]}\n", "t.ir:4: ",
                 "axis out of range");
    /* the head layout: all five attributes or none; heads inside the rows */
    expect_error("kiln-ir v1\n%q:f32[2,5,12] = input \"q\"\n"
                 "%o:f32[2,5,8] = attention %q, %q, %q {causal=1,scale=0.5,heads=2,hd=4}\n",
                 "t.ir:3: ", "attention: missing attribute 'qoff'");
    expect_error("kiln-ir v1\n%q:f32[2,5,12] = input \"q\"\n"
                 "%o:f32[2,5,8] = attention %q, %q, %q "
                 "{causal=1,scale=0.5,heads=2,hd=4,qoff=0,koff=4,voff=8}\n",
                 "t.ir:3: ", "attention: v's heads [8, 8 + 2*4) must lie inside its rows");
    /* attention_dqkv: the head layout only, q/k/v ranges partitioning the row */
#define DQKV_IN                                                                            \
    "kiln-ir v1\n%q:f32[2,5,12] = input \"q\"\n%g:f32[2,5,4] = input \"g\"\n"             \
    "%l:f32[2,5,2,1] = input \"l\"\n"
    expect_error(DQKV_IN "%d:f32[2,5,12] = attention_dqkv %q, %q, %q, %g, %l, %l "
                         "{causal=1,scale=0.5}\n",
                 "t.ir:5: ", "attention_dqkv: needs the head layout");
    expect_error(DQKV_IN "%d:f32[2,5,12] = attention_dqkv %q, %q, %q, %g, %l, %l "
                         "{causal=1,scale=0.5,heads=2,hd=2,qoff=0,koff=2,voff=8}\n",
                 "t.ir:5: ",
                 "attention_dqkv: the q, k and v columns must not overlap (got qoff=0, "
                 "koff=2, voff=8, heads*hd=4)");
#undef DQKV_IN
    expect_error(HDR "%b:f32[N] = neg %a {value=1}\n", "t.ir:4: ", "neg takes no attributes");
    expect_error(HDR "%b:f32[N] = neg %a !fast\n", "t.ir:4: ", "unknown flag '!fast'");
    expect_error(HDR "%b:f32[N] = neg %a %a\n", "t.ir:4: ", "expected end of line");
    expect_error(HDR "%b:f32[N] = param \"b\n", "t.ir:4: ", "unterminated string");
    expect_error(HDR "%b:f32[N] = param \"b\" gaussian(1)\n", "t.ir:4: ",
                 "unknown initialiser 'gaussian'");
    expect_error(HDR "%b:f32[N] = neg %a\nupdate %a <- %b\n", "t.ir:5: ",
                 "update target must be a param or state tensor (expected param or state, "
                 "got input)");
    expect_error(HDR "%p:f32[N] = param \"p\"\n%b:f32[N] = neg %a\nupdate %p <- %b\n"
                     "update %p <- %a\n",
                 "t.ir:7: ", "\"p\" is updated twice (first on line 6)");
    expect_error(HDR "%p:f32[2] = param \"p\"\nupdate %p <- %a\n", "t.ir:5: ",
                 "types differ (expected f32[2], got f32[N])");
    expect_error(HDR "output \"x\" %a\noutput \"x\" %a\n", "t.ir:5: ", "declared twice");
    expect_error(HDR "banana\n", "t.ir:4: ", "expected a definition");
    expect_error(HDR "sym N=5\n", "t.ir:4: ", "symbol N redeclared (expected 4, got 5)");
    expect_error(HDR "%c:f32[] = const {value=abc}\n", "t.ir:4: ", "expected value (a number)");
    expect_error(HDR "%b:f32[N] = matmul %a, %a {ta=0,tb=0}\n", "t.ir:4: ",
                 "matmul: operands need rank >= 2");
}

/* Two symbols of one value: the text's names are kept as written (a
 * number stays a number), and ops built on the parsed graph name each dim
 * after the axis it carries, never after its value. */
static void test_dim_names_by_provenance(void **state)
{
    (void)state;
    const char *text = "kiln-ir v1\n"
                       "sym P=4 D=4\n"
                       "%x:f32[P,D] = input \"x\"\n"
                       "%w:f32[D,4] = param \"w\" zeros\n"
                       "%t:f32[D,P] = permute %x {perm=[1,0]}\n"
                       "%u:f32[4,4] = permute %x {perm=[1,0]}\n"
                       "output \"t\" %t\n"
                       "output \"u\" %u\n";
    Graph *g = parse_or_fail(text);
    char *p = ir_print_str(g);
    assert_non_null(strstr(p, "%0:f32[P,D] = input \"x\"\n"));
    assert_non_null(strstr(p, "%1:f32[D,4] = param \"w\" zeros\n"));
    assert_non_null(strstr(p, "%2:f32[D,P] = permute %0 {perm=[1,0]}\n"));
    assert_non_null(strstr(p, "%3:f32[4,4] = permute %0 {perm=[1,0]}\n"));
    free(p);
    int x = 0, w = 1, t = 2;
    int y = OP(g, OP_MATMUL, ((OpAttr){.ia = {0, 0}, .nia = 2}), x, w); /* [P,D]x[D,4] */
    int z = OP(g, OP_MATMUL, ((OpAttr){.ia = {1, 0}, .nia = 2}), t, t); /* [D,P]^T[D,P] */
    int s = OP(g, OP_ADD, (OpAttr){0}, t, x);                           /* first operand */
    int r = OP(g, OP_RESHAPE, ((OpAttr){.rank = 3, .shape = {2, 2, 4}}), x);
    int c = OP0(g, OP_CONST, ((OpAttr){.f = 1, .dtype = DT_F32, .rank = 2, .shape = {4, 4}}));
    char b[64];
    assert_string_equal(shape_str(g, &g->t.v[y].s, b, sizeof b), "f32[P,4]");
    assert_string_equal(shape_str(g, &g->t.v[z].s, b, sizeof b), "f32[P,P]");
    assert_string_equal(shape_str(g, &g->t.v[s].s, b, sizeof b), "f32[D,P]");
    assert_string_equal(shape_str(g, &g->t.v[r].s, b, sizeof b), "f32[2,2,D]");
    assert_string_equal(shape_str(g, &g->t.v[c].s, b, sizeof b), "f32[4,4]");
    assert_string_equal(shape_str(NULL, &g->t.v[y].s, b, sizeof b), "f32[4,4]");
    ir_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_all_opcodes),
        cmocka_unit_test(test_print_format),
        cmocka_unit_test(test_end_marker),
        cmocka_unit_test(test_round_trip_after_compact),
        cmocka_unit_test(test_hand_written),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_dim_names_by_provenance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
