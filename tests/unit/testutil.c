/* testutil.c - helpers shared by kiln's unit tests. */
#include "testutil.h"

#include "runtime.h"
#include "cpu.h"
#include "dist.h"
#include "passes.h"
#include "train.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ||a - b||^2 into *d and ||b||^2 into *r; false where a value is not
 * finite. */
static bool err_sums(const double *a, const double *b, int64_t n, double *d, double *r)
{
    *d = *r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return false;
        *d += (a[i] - b[i]) * (a[i] - b[i]);
        *r += b[i] * b[i];
    }
    return true;
}

double rel_err(const double *a, const double *b, int64_t n)
{
    double d, r;
    if (!err_sums(a, b, n, &d, &r))
        return INFINITY;
    if (r == 0)
        return d == 0 ? 0 : INFINITY;
    return sqrt(d / r);
}

double rel_err_f32(const float *a, const float *b, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    if (r == 0)
        return d == 0 ? 0 : INFINITY;
    return sqrt(d / r);
}

char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = xmalloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

Graph *parse_or_fail(const char *text)
{
    char err[1024];
    Graph *g = ir_parse(text, "test", err, sizeof err);
    if (!g)
        fail_msg("parse failed: %s", err);
    return g;
}

int run_cmd(const char *cmd, char **out)
{
    char *s = NULL;
    int rc = rt_run_capture(cmd, &s);
    if (out)
        *out = s;
    else
        free(s);
    return rc;
}

void run_or_fail(const char *cmd)
{
    char *out = NULL;
    int rc = run_cmd(cmd, &out);
    if (rc != 0)
        fail_msg("`%s` failed (%d):\n%s", cmd, rc, out ? out : "");
    free(out);
}

int remove_tree(const char *dir)
{
    char *cmd = xasprintf("rm -rf '%s'", dir);
    int rc = run_cmd(cmd, NULL);
    free(cmd);
    return rc;
}

char *scratch_dir(const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    char *tmpl = xasprintf("%s/kiln-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
    if (!mkdtemp(tmpl))
        fail_msg("mkdtemp failed");
    return tmpl;
}

double test_urand(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*state >> 11) * (1.0 / 9007199254740992.0);
}

uint16_t test_f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float test_bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t model_rng;
static double model_urand(void) { return test_urand(&model_rng); }

/* Host data per graph input: params in [-0.3, 0.3), state zero, "lr" 1e-3,
 * float data in [0, 1), integers in [0, 3] (valid tokens, classes and
 * digits for every model). */
void **random_model_inputs(const Graph *g)
{
    model_rng = 12345;
    void **host = xcalloc((size_t)g->t.n + 1, sizeof(void *));
    for (int t = 0; t < g->t.n; t++) {
        const Tensor *x = &g->t.v[t];
        if (x->op >= 0)
            continue;
        int64_t n = shape_numel(&x->s);
        host[t] = xcalloc((size_t)(n ? n : 1), (size_t)dtype_size(x->s.dtype));
        for (int64_t i = 0; i < n; i++) {
            if (x->s.dtype == DT_F32)
                ((float *)host[t])[i] = x->kind == TK_PARAM           ? (float)(0.6 * model_urand() - 0.3)
                                        : x->kind == TK_STATE         ? 0.0f
                                        : strcmp(x->name, "lr") == 0 ? 1e-3f
                                                                      : (float)model_urand();
            else if (x->s.dtype == DT_I32)
                ((int32_t *)host[t])[i] = (int32_t)(model_urand() * 4);
            else if (x->s.dtype == DT_U8)
                ((uint8_t *)host[t])[i] = model_urand() < 0.5;
            else
                fail_msg("input %s: dtype %s", x->name, dtype_name(x->s.dtype));
        }
    }
    return host;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

char **model_paths(void)
{
    DIR *dir = opendir("models");
    if (!dir)
        fail_msg("no models/ directory (tests run from the source root)");
    VEC(char *) v = {0};
    struct dirent *de;
    while ((de = readdir(dir))) {
        size_t n = strlen(de->d_name);
        if (n > 4 && strcmp(de->d_name + n - 4, ".lua") == 0)
            vec_push(&v, xasprintf("models/%s", de->d_name));
    }
    closedir(dir);
    if (v.n < 4)
        fail_msg("models/ holds %d .lua scripts (expected at least 4: mlp, gpt, llama, "
                 "addition)", v.n);
    qsort(v.v, (size_t)v.n, sizeof *v.v, cmp_str);
    vec_push(&v, NULL);
    return v.v;
}

void free_model_paths(char **paths)
{
    for (char **p = paths; p && *p; p++)
        free(*p);
    free(paths);
}

Model *load_model(const char *path, const char *const *sets, int nsets)
{
    char err[2048];
    Model *m = fe_load_model(path, sets, nsets, err, sizeof err);
    if (!m)
        fail_msg("%s: %s", path, err);
    return m;
}

void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) == EOF || fclose(f) != 0)
        fail_msg("cannot write %s", path);
}

bool have_command(const char *name)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        return false;
    char *dirs = xstrdup(path), *save = NULL;
    bool found = false;
    for (char *dir = strtok_r(dirs, ":", &save); dir && !found;
         dir = strtok_r(NULL, ":", &save)) {
        char *p = xasprintf("%s/%s", *dir ? dir : ".", name);
        found = access(p, X_OK) == 0;
        free(p);
    }
    free(dirs);
    return found;
}

void gather_oor_build(GatherOor *c)
{
    enum { V = OOR_V, R = OOR_R, NI = OOR_NI };
    static const SrcLoc here = {"test", 1};
    Graph *g = ir_new();
    const int64_t dt[2] = {V, R}, dv[1] = {V}, di[2] = {2, 3}, ds[3] = {2, 3, R};
    const Shape sh[4] = {shape_make(DT_F32, 2, dt), shape_make(DT_F32, 1, dv),
                         shape_make(DT_I32, 2, di), shape_make(DT_F32, 3, ds)};
    static const char *const name[4] = {"tab", "vec", "idx", "src"};
    ParamInit none = {0};
    for (int j = 0; j < 4; j++)
        c->in[j] = ir_add_input(g, TK_INPUT, name[j], sh[j], none);
    int gi[2] = {c->in[0], c->in[2]}, gv[2] = {c->in[1], c->in[2]},
        si[2] = {c->in[2], c->in[3]};
    ir_add_output(g, "gather", ir_op_x(g, OP_GATHER, gi, 2, NULL, here));
    ir_add_output(g, "gvec", ir_op_x(g, OP_GATHER, gv, 2, NULL, here));
    OpAttr sa = {.rank = 2, .shape = {V, R}};
    ir_add_output(g, "scatter", ir_op_x(g, OP_SCATTER_ADD, si, 2, &sa, here));
    c->g = g;

    static const int32_t ix[NI] = {-1, V, V + 1000, 2, INT32_MAX, INT32_MIN};
    const int64_t len[4] = {V * R, V, NI, NI * R}, nwant[3] = {NI * R, NI, V * R};
    for (int j = 0; j < 4; j++) {
        c->len[j] = len[j];
        c->host[j] = xmalloc(4 * (size_t)len[j]);
    }
    for (int k = 0; k < 3; k++) {
        c->nwant[k] = nwant[k];
        c->want[k] = xcalloc((size_t)nwant[k], sizeof(float));
    }
    float *tab = c->host[0], *vec = c->host[1], *src = c->host[3];
    memcpy(c->host[2], ix, sizeof ix);
    for (int i = 0; i < V * R; i++)
        tab[i] = 1.0f + (float)i;
    for (int i = 0; i < V; i++)
        vec[i] = 100.0f + (float)i;
    for (int i = 0; i < NI * R; i++)
        src[i] = 0.5f + (float)i;
    /* only index 2 (position 3) is in range */
    for (int k = 0; k < R; k++) {
        c->want[0][3 * R + k] = tab[2 * R + k];
        c->want[2][2 * R + k] = src[3 * R + k];
    }
    c->want[1][3] = vec[2];
}

void gather_oor_free(GatherOor *c)
{
    for (int j = 0; j < 4; j++)
        free(c->host[j]);
    for (int k = 0; k < 3; k++)
        free(c->want[k]);
    ir_free(c->g);
}

int rank_nfail;
static int rank_argc;
static char **rank_argv;

int rank_verdict(RtComm *c)
{
    double f = rank_nfail;
    rt_comm_mean(c, &f, 1);
    int rc = f > 0 ? 1 : 0;
    rt_rank_status("exit %d", rc);
    rt_comm_close(c);
    return rc;
}

int rank_test_launch(int nranks) { return rt_launch(nranks, rank_argc, rank_argv); }

int rank_test_main(int argc, char **argv, const char *name, int (*rank_main)(void),
                   void (*test)(void **state))
{
    if (getenv("OMPI_COMM_WORLD_SIZE"))
        return rank_main();
    if (!have_command("mpirun")) { /* rt_launch runs the ranks under mpirun */
        printf("%s: skipped: no mpirun on PATH\n", name);
        return TEST_SKIPPED;
    }
    rank_argc = argc;
    rank_argv = argv;
    const struct CMUnitTest tests[] = {{.name = name, .test_func = test}};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

int attn_on_off_compare(const Model *m, bool loss, double tol,
                        void (*check)(const Graph *g, int on, void *arg), void *arg,
                        const char *what)
{
    Graph *g[2];
    Exec *e[2];
    void **host = NULL;
    for (int on = 0; on < 2; on++) {
        RtGraphFlags gf = {.memory_budget = -1, .no_fuse_attention = !on};
        PassOpts po;
        rt_pass_opts(&m->train, &gf, &po);
        assert_int_equal(po.attention, on);
        g[on] = ir_clone(m->g);
        Diag d = {{0}};
        if (!pass_pipeline(g[on], &po, NULL, NULL, NULL, &d))
            fail_msg("pipeline: %s", d.msg);
        if (check)
            check(g[on], on, arg);
        ExecOpts eo = {.threads = 2};
        if (!(e[on] = rt_exec_create(g[on], &eo, &d)))
            fail_msg("rt_exec_create: %s", d.msg);
        if (!on)
            host = random_model_inputs(g[0]);
        for (int t = 0; t < g[0]->t.n; t++) { /* the same inputs, by name */
            const Tensor *x = &g[0]->t.v[t];
            if (!host[t] || !x->name)
                continue;
            int u = on ? ir_find_tensor(g[1], x->name) : t;
            assert_true(u >= 0);
            rt_exec_write(e[on], u, host[t]);
        }
        if (!rt_exec_run(e[on], 1, 0, &d))
            fail_msg("rt_exec_run: %s", d.msg);
    }
    int checked = 0;
    for (int k = 0; k < g[0]->outs.n; k++) {
        const char *name = g[0]->outs.v[k].name;
        if (!(loss && strcmp(name, "loss") == 0) && strncmp(name, "grad.", 5) != 0)
            continue;
        int t0 = g[0]->outs.v[k].t, t1 = ir_find_output(g[1], name);
        assert_true(t1 >= 0);
        int64_t n = shape_numel(&g[0]->t.v[t0].s);
        float *a = xmalloc(sizeof(float) * (size_t)n), *b = xmalloc(sizeof(float) * (size_t)n);
        rt_exec_read(e[0], t0, a);
        rt_exec_read(e[1], t1, b);
        double re = rel_err_f32(b, a, n);
        if (!(re <= tol))
            fail_msg("%s: %s differs with the attention pass: relative error %g", what, name, re);
        checked++;
        free(a);
        free(b);
    }
    for (int t = 0; t < g[0]->t.n; t++)
        free(host[t]);
    free(host);
    for (int on = 0; on < 2; on++) {
        rt_exec_destroy(e[on]);
        ir_free(g[on]);
    }
    return checked;
}

double rel_err_min1(const double *a, const double *b, int64_t n)
{
    double d, r;
    if (!err_sums(a, b, n, &d, &r))
        return INFINITY;
    return sqrt(d) / fmax(sqrt(r), 1.0);
}

int count_ops(const Graph *g, Opcode c)
{
    int n = 0;
    for (int i = 0; i < g->ops.n; i++)
        n += g->ops.v[i].code == c;
    return n;
}
