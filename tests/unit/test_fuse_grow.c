/* test_fuse_grow.c - the fuse pass's first grouping (pass_fuse_grow, near-
 * linear) against its plain definition: in program order each fusable op
 * starts a group and merges its producers' groups with pass_fuse_try_merge
 * (which checks and copies the whole union each time), then the producers
 * of the broadcasts it pulled in, members sorted after each op. Both must
 * leave the same groups at the same indices with the same members, on
 * every model's step graph, on long chains, and on random graphs of
 * elementwise ops, row reductions, broadcasts, matmuls and consts. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "fuse_internal.h"
#include "passes.h"

/* The plain first grouping. */
static void grow_plain(Fuser *f)
{
    Graph *g = f->g;
    for (int i = 0; i < g->ops.n; i++) {
        const Op *op = &g->ops.v[i];
        f->upto = i + 1;
        if (!pass_fuse_op_fusable(g, op))
            continue;
        int G = pass_fuse_new_group(f, i), k;
        if (op->code == OP_MATMUL || op->code == OP_CONST || op->code == OP_BROADCAST ||
            (pass_fuse_is_reduce(op) && pass_fuse_reduce_pattern(g, op, &k) == FUSE_COL))
            continue;
        for (int j = 0; j < op->nin; j++) {
            int p = g->t.v[op->in[j]].op;
            if (p >= 0 && f->gof[p] >= 0)
                pass_fuse_try_merge(f, G, f->gof[p]);
        }
        for (int q = 0; q < f->gr.v[G].ops.n; q++) {
            const Op *b = &g->ops.v[f->gr.v[G].ops.v[q]];
            if (b->code != OP_BROADCAST)
                continue;
            int p = g->t.v[b->in[0]].op;
            if (p >= 0 && f->gof[p] >= 0 && f->gof[p] != G)
                pass_fuse_try_merge(f, G, f->gof[p]);
        }
        pass_fuse_sort_members(f, G);
    }
}

/* Both groupings of g (after the cheap clones, as pass_fuse runs them);
 * returns the number of groups with more than one member. */
static int check_same(const char *what, Graph *g)
{
    pass_fuse_clone_cheap(g, 0);
    pass_fuse_clone_cheap(g, 1);
    Fuser a, b;
    pass_fuse_fuser_init(&a, g);
    pass_fuse_fuser_init(&b, g);
    pass_fuse_grow(&a);
    grow_plain(&b);
    assert_int_equal(a.gr.n, b.gr.n);
    int multi = 0;
    for (int i = 0; i < g->ops.n; i++)
        if (a.gof[i] != b.gof[i])
            fail_msg("%s: op %d (%s) in group %d, the plain grouping's %d", what, i,
                     ir_opinfo[g->ops.v[i].code].name, a.gof[i], b.gof[i]);
    for (int G = 0; G < a.gr.n; G++) {
        const FGroup *x = &a.gr.v[G], *y = &b.gr.v[G];
        assert_int_equal(x->dead, y->dead);
        assert_int_equal(x->ops.n, y->ops.n);
        if (x->ops.n)
            assert_memory_equal(x->ops.v, y->ops.v, sizeof(int) * (size_t)x->ops.n);
        multi += x->ops.n > 1;
    }
    pass_fuse_fuser_free(&a);
    pass_fuse_fuser_free(&b);
    return multi;
}

static void test_models(void **state)
{
    (void)state;
    char **paths = model_paths();
    for (char **pp = paths; *pp; pp++) {
        for (int remat = 0; remat < 2; remat++) {
            Model *md = load_model(*pp, NULL, 0);
            PassOpts po;
            pass_opts_default(&po);
            po.no_fuse = true; /* the step graph as the fuse pass would get it */
            if (remat)
                po.remat = REMAT_FULL;
            Diag d = {{0}};
            if (!pass_pipeline(md->g, &po, NULL, NULL, NULL, &d))
                fail_msg("%s: %s", *pp, d.msg);
            int multi = check_same(*pp, md->g);
            fprintf(stderr, "%s%s: %d ops, %d fused groups\n", *pp, remat ? " (remat full)" : "",
                    md->g->ops.n, multi);
            assert_true(multi > 0);
            fe_model_free(md);
        }
    }
    free_model_paths(paths);
}

static uint64_t rng = 12345;
static int rnd(int n)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

/* A random graph as IR text: tensors of shapes [N,C] (full), [N,1] (row
 * sums and maxes, broadcast back), [1,C] (column sums), [C] (a broadcast
 * bias); ops read earlier tensors of the right shapes, some marked
 * backward. */
static char *random_ir(int nops)
{
    size_t cap = (size_t)nops * 128 + 1024, len = 0;
    char *s = xmalloc(cap);
    VEC(int) full = {0}, row = {0}, col = {0};
    len += (size_t)snprintf(s + len, cap - len,
                            "kiln-ir v1\nsym N=4 C=8\n"
                            "%%0:f32[N,C] = input \"x\"\n%%1:f32[N,C] = input \"y\"\n"
                            "%%2:f32[C,C] = param \"w\" zeros\n%%3:f32[C] = param \"b\" zeros\n"
                            "%%4:f32[N,1] = input \"r\"\n%%5:f32[1,C] = input \"c\"\n");
    vec_push(&full, 0);
    vec_push(&full, 1);
    vec_push(&row, 4);
    vec_push(&col, 5);
    int id = 6;
    static const char *un[] = {"exp", "neg", "tanh"}, *bin[] = {"add", "mul", "sub"};
    for (int i = 0; i < nops; i++) {
        /* mostly recent operands, sometimes far back */
        int fa = full.v[full.n - 1 - (rnd(4) ? rnd(full.n < 3 ? full.n : 3) : rnd(full.n))];
        int fb = full.v[rnd(full.n)];
        const char *flag = rnd(6) == 0 ? " !backward" : "";
        switch (rnd(12)) {
        case 10:
        case 11: { /* elementwise work on row or column tensors */
            bool r = rnd(2);
            int ln = r ? row.n : col.n, *lv = r ? row.v : col.v;
            if (!ln)
                break;
            int x = lv[ln - 1 - rnd(ln < 2 ? 1 : 2)], y = lv[rnd(ln)];
            const char *shape = r ? "N,1" : "1,C";
            if (rnd(2))
                len += (size_t)snprintf(s + len, cap - len, "%%%d:f32[%s] = %s %%%d%s\n", id,
                                        shape, un[rnd(3)], x, flag);
            else
                len += (size_t)snprintf(s + len, cap - len, "%%%d:f32[%s] = %s %%%d, %%%d%s\n",
                                        id, shape, bin[rnd(3)], x, y, flag);
            if (r)
                vec_push(&row, id++);
            else
                vec_push(&col, id++);
            break;
        }
        case 0:
        case 1:
            len += (size_t)snprintf(s + len, cap - len, "%%%d:f32[N,C] = %s %%%d%s\n", id,
                                    un[rnd(3)], fa, flag);
            vec_push(&full, id++);
            break;
        case 2:
        case 3:
        case 4:
            len += (size_t)snprintf(s + len, cap - len, "%%%d:f32[N,C] = %s %%%d, %%%d%s\n", id,
                                    bin[rnd(3)], fa, fb, flag);
            vec_push(&full, id++);
            break;
        case 5:
            if (rnd(4) == 0) { /* a column reduction */
                len += (size_t)snprintf(s + len, cap - len,
                                        "%%%d:f32[1,C] = reduce_sum %%%d {axes=[0]}%s\n", id, fa,
                                        flag);
                vec_push(&col, id++);
                break;
            }
            len += (size_t)snprintf(s + len, cap - len,
                                    "%%%d:f32[N,1] = %s %%%d {axes=[1]}%s\n", id,
                                    rnd(2) ? "reduce_sum" : "reduce_max", fa, flag);
            vec_push(&row, id++);
            break;
        case 6:
            if (!row.n || (col.n && rnd(3) == 0)) {
                if (!col.n)
                    break;
                len += (size_t)snprintf(s + len, cap - len, "%%%d:f32[N,C] = broadcast %%%d\n",
                                        id, col.v[rnd(col.n)]);
                vec_push(&full, id++);
                break;
            }
            len += (size_t)snprintf(s + len, cap - len, "%%%d:f32[N,C] = broadcast %%%d\n", id,
                                    row.v[rnd(row.n)]);
            vec_push(&full, id++);
            break;
        case 7:
            len += (size_t)snprintf(s + len, cap - len, "%%%d:f32[N,C] = broadcast %%3\n", id);
            vec_push(&full, id++);
            break;
        case 8:
            len += (size_t)snprintf(s + len, cap - len,
                                    "%%%d:f32[N,C] = matmul %%%d, %%2 {ta=0,tb=0}\n", id, fa);
            vec_push(&full, id++);
            break;
        default:
            len += (size_t)snprintf(s + len, cap - len,
                                    "%%%d:f32[N,C] = const {value=0.5}\n%%%d:f32[N,C] = mul "
                                    "%%%d, %%%d\n",
                                    id, id + 1, id, fa);
            id += 2;
            vec_push(&full, id - 1);
            break;
        }
    }
    len += (size_t)snprintf(s + len, cap - len, "output \"o\" %%%d\n", full.v[full.n - 1]);
    if (row.n)
        snprintf(s + len, cap - len, "output \"r\" %%%d\n", row.v[row.n - 1]);
    vec_free(&full);
    vec_free(&row);
    vec_free(&col);
    return s;
}

static void test_random_graphs(void **state)
{
    (void)state;
    int multi = 0;
    for (int k = 0; k < 200; k++) {
        char *text = random_ir(20 + rnd(200));
        Graph *g = parse_or_fail(text);
        char what[32];
        snprintf(what, sizeof what, "random graph %d", k);
        multi += check_same(what, g);
        ir_free(g);
        free(text);
    }
    fprintf(stderr, "random graphs: %d fused groups\n", multi);
    assert_true(multi > 200);
}

/* A chain of adds: one group that every add joins (the case that was
 * quadratic), here long enough to matter and short enough for the plain
 * grouping. */
static void test_add_chain(void **state)
{
    (void)state;
    const char *set[1] = {"n=3000"};
    Model *md = load_model("bench/add_chain.lua", set, 1);
    PassOpts po;
    pass_opts_default(&po);
    po.no_fuse = true;
    Diag d = {{0}};
    if (!pass_pipeline(md->g, &po, NULL, NULL, NULL, &d))
        fail_msg("add_chain: %s", d.msg);
    assert_true(check_same("add_chain", md->g) >= 1);
    fe_model_free(md);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_graphs),
        cmocka_unit_test(test_add_chain),
        cmocka_unit_test(test_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
