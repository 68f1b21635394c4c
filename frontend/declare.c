/* declare.c - the DSL's declarations, the Lua C functions that add a
 * model's graph inputs and outputs: input, param and state with their
 * initializers (zeros, ones, normal, uniform), assign, sym{}, minimize,
 * output, the param annotations padded_rows and shard, pp_stage, and decode
 * mode's cache state (nn.decode.state, nn.decode.update). frontend.c
 * registers them (open_dsl, load_once); the tensor primitives are in ops.c. */
#include "fe_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>


/* Whether name is in the registry's set `set` (inputs and params, or
 * outputs); with add, puts it there. A set, not a scan of the graph: a
 * script may declare many thousands. */
static bool name_in(lua_State *L, const char *set, const char *name, bool add)
{
    if (lua_getfield(L, LUA_REGISTRYINDEX, set) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, set);
    }
    bool had = lua_getfield(L, -1, name) != LUA_TNIL;
    lua_pop(L, 1);
    if (add) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, name);
    }
    lua_pop(L, 1);
    return had;
}

static void check_name(lua_State *L, int idx, const char *fn)
{
    if (lua_type(L, idx) != LUA_TSTRING || !lua_rawlen(L, idx))
        fe_error(L, "%s: needs a name string first (got %s)", fn, luaL_typename(L, idx));
    const char *name = lua_tostring(L, idx);
    if (strcmp(name, "lr") == 0 || strncmp(name, "adam.", 5) == 0 || strncmp(name, "grad.", 5) == 0 ||
        strncmp(name, "sgd.", 4) == 0 || strncmp(name, "lion.", 5) == 0 ||
        strncmp(name, "adafactor.", 10) == 0)
        fe_error(L, "%s: the name '%s' is reserved for the optimizer (expected another name)", fn,
                 name);
    if (name_in(L, "kiln.names", name, false))
        fe_error(L, "%s: the name '%s' is already used by another input or param", fn,
                 lua_tostring(L, idx));
}

int fe_dsl_input(lua_State *L)
{
    check_name(L, 1, "input");
    int64_t dim[IR_MAX_RANK];
    const char *dn[IR_MAX_RANK];
    int rank = fe_parse_shape(L, 2, dim, dn, "input");
    DType dt = (DType)fe_parse_dtype(L, 3, DT_F32, "input");
    ParamInit none = {0};
    Fe *fe = fe_get(L);
    for (int i = 0; fe->decode_len > 0 && i < rank; i++)
        if (dn[i] && strcmp(dn[i], "T") == 0) /* decode mode: the step's S tokens */
            dim[i] = fe->decode_len, dn[i] = NULL;
    Shape s = fe_checked_shape(L, dt, rank, dim, "input");
    memcpy(s.dname, dn, sizeof(const char *) * (size_t)rank);
    fe_push_tensor(L, ir_add_input(fe->g, TK_INPUT, lua_tostring(L, 1), s, none));
    name_in(L, "kiln.names", lua_tostring(L, 1), true);
    return 1;
}

/* param(name, shape, init [, dtype]) and state(...)'s common part: a
 * float graph input of kind k, named in kiln.names; its tensor id. fn is
 * the function's name, what the plural its errors use. */
static int float_input(lua_State *L, const char *fn, const char *what, TensorKind k)
{
    check_name(L, 1, fn);
    int64_t dim[IR_MAX_RANK];
    const char *dn[IR_MAX_RANK];
    int rank = fe_parse_shape(L, 2, dim, dn, fn);
    if (!luaL_testudata(L, 3, INIT_MT))
        fe_error(L, "%s '%s': init must be zeros(), ones(), normal(std) or uniform(a, b) "
                    "(got %s)", fn, lua_tostring(L, 1), luaL_typename(L, 3));
    ParamInit init = *(ParamInit *)lua_touserdata(L, 3);
    DType dt = (DType)fe_parse_dtype(L, 4, DT_F32, fn);
    if (!dtype_is_float(dt))
        fe_error(L, "%s '%s': %s must be float (expected f32, bf16 or f16, got %s)", fn,
                 lua_tostring(L, 1), what, dtype_name(dt));
    Shape s = fe_checked_shape(L, dt, rank, dim, fn);
    memcpy(s.dname, dn, sizeof(const char *) * (size_t)rank);
    int t = ir_add_input(fe_get(L)->g, k, lua_tostring(L, 1), s, init);
    fe_push_tensor(L, t);
    name_in(L, "kiln.names", lua_tostring(L, 1), true);
    return t;
}

int fe_dsl_param(lua_State *L)
{
    int t = float_input(L, "param", "params", TK_PARAM);
    vec_push(&fe_get(L)->params, ((FeParamLine){t, fe_user_loc(L).line}));
    return 1;
}

/* state(name, shape, init [, dtype]): a float tensor kept from step to
 * step that training does not differentiate (BatchNorm's running
 * statistics); saved in checkpoints and weights; changed only by assign. */
int fe_dsl_state(lua_State *L)
{
    float_input(L, "state", "state", TK_STATE);
    return 1;
}

/* assign(s, v): state s holds v after each training step (v of s's type;
 * once per state). In the evaluation graph (nn.training = false) it does
 * nothing: evaluation never changes state. */
int fe_dsl_assign(lua_State *L)
{
    int s = fe_check_tensor(L, 1, "assign"), v = fe_check_tensor(L, 2, "assign");
    Fe *fe = fe_get(L);
    const Tensor *st = &fe->g->t.v[s];
    if (st->kind != TK_STATE || st->op >= 0)
        fe_error(L, "assign: the first argument must be a tensor made by state() (got a %s)",
                 ir_kind_name(st->kind));
    Shape ss = st->s, vs = fe_tshape(L, v);
    if (!shape_eq(&ss, &vs))
        fe_error(L, "assign: the value does not match state '%s' (expected %s, got %s)",
                 st->name, SSTR(&ss), SSTR(&vs));
    for (int i = 0; i < fe->g->upd.n; i++)
        if (fe->g->upd.v[i].target == s)
            fe_error(L, "assign: state '%s' is assigned twice (expected one assign per state)",
                     st->name);
    if (!fe->evaluating)
        ir_add_update(fe->g, s, v);
    return 0;
}

static double check_num(lua_State *L, int idx, const char *fn, const char *what)
{
    if (lua_type(L, idx) != LUA_TNUMBER)
        fe_error(L, "%s: %s must be a number (got %s)", fn, what, luaL_typename(L, idx));
    return lua_tonumber(L, idx);
}

int fe_dsl_init(lua_State *L)
{
    ParamInit p = {.kind = (InitKind)lua_tointeger(L, lua_upvalueindex(1))};
    if (p.kind == INIT_NORMAL) {
        p.a = check_num(L, 1, "normal", "std");
        if (!(p.a >= 0) || !isfinite(p.a))
            fe_error(L, "normal: std must be a non-negative number (got %g)", p.a);
    } else if (p.kind == INIT_UNIFORM) {
        p.a = check_num(L, 1, "uniform", "low bound a");
        p.b = check_num(L, 2, "uniform", "high bound b");
        if (!(p.a < p.b))
            fe_error(L, "uniform: needs a < b (got a = %g, b = %g)", p.a, p.b);
    } else if (!lua_isnone(L, 1)) {
        fe_error(L, "%s(): takes no arguments (it is an initializer for param(); got %s)",
                 p.kind == INIT_ZEROS ? "zeros" : "ones", luaL_typename(L, 1));
    }
    ParamInit *u = lua_newuserdatauv(L, sizeof p, 0);
    *u = p;
    luaL_setmetatable(L, INIT_MT);
    return 1;
}

int fe_dsl_sym(lua_State *L)
{
    if (!lua_istable(L, 1))
        fe_error(L, "sym: needs a table such as sym{B=4, T=64} (got %s)", luaL_typename(L, 1));
    /* sorted for a deterministic symbol order */
    const char *names[64];
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            fe_error(L, "sym: keys must be names (got %s)", luaL_typename(L, -2));
        int isnum;
        lua_Integer v = lua_tointegerx(L, -1, &isnum);
        if (!isnum || v < 1) {
            char from[300];
            fe_set_origin(L, -1, from, sizeof from);
            const char *name = lua_tostring(L, -2); /* before luaL_tolstring pushes */
            fe_error(L, "sym: %s must be a positive integer (got %s%s)", name,
                     luaL_tolstring(L, -1, NULL), from);
        }
        if (n < 64)
            names[n++] = lua_tostring(L, -2);
        lua_pop(L, 1);
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    Graph *g = fe_get(L)->g;
    for (int i = 0; i < n; i++) {
        lua_getfield(L, 1, names[i]);
        /* dims already named keep their size: a name has one value */
        for (int k = 0; k < g->syms.n; k++)
            if (strcmp(g->syms.v[k].name, names[i]) == 0 &&
                g->syms.v[k].value != lua_tointeger(L, -1))
                fe_error(L, "sym: %s is already declared as %lld (expected that value again, "
                            "got %lld)", names[i], (long long)g->syms.v[k].value,
                         (long long)lua_tointeger(L, -1));
        ir_add_sym(g, names[i], lua_tointeger(L, -1));
        lua_pop(L, 1);
    }
    return 0;
}

int fe_dsl_minimize(lua_State *L)
{
    Fe *fe = fe_get(L);
    int t = fe_check_tensor(L, 1, "minimize");
    Shape s = fe_tshape(L, t);
    if (s.rank != 0 || !dtype_is_float(s.dtype))
        fe_error(L, "minimize: the loss must be a float scalar (expected f32[], got %s); reduce "
                    "it with mean() or sum()", SSTR(&s));
    if (fe->loss >= 0)
        fe_error(L, "minimize: called twice (the loss was already set at line %d)", fe->loss_line);
    fe->loss = t;
    fe->loss_line = fe_user_loc(L).line;
    ir_add_output(fe->g, "loss", t);
    return 0;
}

/* padded_rows(w, n): rows [n, rows of w) of param w are padding (a
 * vocabulary padded to a multiple); the script masks them out of its loss,
 * kiln pads imported weights of n rows. Returns w. */
int fe_dsl_padded_rows(lua_State *L)
{
    Fe *fe = fe_get(L);
    int t = fe_check_tensor(L, 1, "padded_rows");
    const Tensor *x = &fe->g->t.v[t];
    if (x->kind != TK_PARAM || x->s.rank < 1)
        fe_error(L, "padded_rows: needs a param (got a %s %s)", ir_kind_name(x->kind),
                 SSTR(&x->s));
    if (!lua_isinteger(L, 2) || lua_tointeger(L, 2) < 1 || lua_tointeger(L, 2) > x->s.dim[0])
        fe_error(L, "padded_rows: the real rows of %s must be an integer in [1, %lld] (got %s)",
                 x->name, (long long)x->s.dim[0], luaL_tolstring(L, 2, NULL));
    Model *m = fe->m;
    for (int i = 0; i < m->npads; i++)
        if (m->pads[i].param == x->name)
            fe_error(L, "padded_rows: %s is already padded", x->name);
    m->pads = xrealloc(m->pads, sizeof *m->pads * (size_t)(m->npads + 1));
    m->pads[m->npads++] = (ModelRowPad){x->name, (int64_t)lua_tointeger(L, 2)};
    lua_pushvalue(L, 1);
    return 1;
}

/* shard(w, axis [, blocks]): param w is split along axis over the
 * tensor-parallel group when the run has tp > 1 (IrShard; the partition
 * pass); blocks (default 1) cuts the axis into that many equal blocks
 * first, each split over the group (a fused qkv weight: 3). Axes count
 * from 0; a negative axis counts from the end. Returns w. */
int fe_dsl_shard(lua_State *L)
{
    Fe *fe = fe_get(L);
    int t = fe_check_tensor(L, 1, "shard");
    Tensor *x = &fe->g->t.v[t];
    if (x->kind != TK_PARAM)
        fe_error(L, "shard: needs a param (expected param(...), got a %s %s)",
                 ir_kind_name(x->kind), SSTR(&x->s));
    if (!lua_isinteger(L, 2))
        fe_error(L, "shard: the axis must be an integer (got %s)", luaL_tolstring(L, 2, NULL));
    lua_Integer ax = lua_tointeger(L, 2);
    if (ax < -x->s.rank || ax >= x->s.rank)
        fe_error(L, "shard: axis %lld out of range for %s %s (expected %d..%d)", (long long)ax,
                 x->name, SSTR(&x->s), -x->s.rank, x->s.rank - 1);
    if (ax < 0)
        ax += x->s.rank;
    lua_Integer blocks = 1;
    if (!lua_isnoneornil(L, 3)) {
        if (!lua_isinteger(L, 3) || lua_tointeger(L, 3) < 1)
            fe_error(L, "shard: blocks must be a positive integer (got %s)",
                     luaL_tolstring(L, 3, NULL));
        blocks = lua_tointeger(L, 3);
    }
    if (x->s.dim[ax] % blocks != 0)
        fe_error(L, "shard: %s's axis %lld (%lld) does not divide into %lld blocks", x->name,
                 (long long)ax, (long long)x->s.dim[ax], (long long)blocks);
    if (x->shard.on)
        fe_error(L, "shard: %s is already sharded (along axis %d)", x->name, x->shard.axis);
    x->shard = (IrShard){true, (int)ax, (int)blocks, 0, 0};
    lua_pushvalue(L, 1);
    return 1;
}

/* pp_stage(x, i): pipeline stage i begins with x (x is what stage i
 * receives from stage i - 1) when the run has pp > 1; passes/stages.c
 * cuts there instead of choosing. Recorded as the output
 * "pp.stage.I@FILE:LINE" (fe_stage_hints drops it where pp = 1, and from
 * the evaluation graph). Returns x. */
int fe_dsl_pp_stage(lua_State *L)
{
    Fe *fe = fe_get(L);
    int t = fe_check_tensor(L, 1, "pp_stage");
    if (fe->g->t.v[t].op < 0)
        fe_error(L, "pp_stage: needs a value computed by the model (got %s \"%s\")",
                 ir_kind_name(fe->g->t.v[t].kind), fe->g->t.v[t].name);
    if (!lua_isinteger(L, 2) || lua_tointeger(L, 2) < 1 || lua_tointeger(L, 2) > 4096)
        fe_error(L, "pp_stage: the stage must be an integer in [1, 4096] (got %s)",
                 luaL_tolstring(L, 2, NULL));
    SrcLoc at = fe_user_loc(L);
    char name[512];
    snprintf(name, sizeof name, "pp.stage.%lld@%s:%d", (long long)lua_tointeger(L, 2),
             at.file ? at.file : "?", at.line);
    ir_add_output(fe->g, intern(name), t);
    lua_pushvalue(L, 1);
    return 1;
}

int fe_dsl_output(lua_State *L)
{
    Fe *fe = fe_get(L);
    if (lua_type(L, 1) != LUA_TSTRING)
        fe_error(L, "output: needs a name string first (got %s)", luaL_typename(L, 1));
    const char *name = lua_tostring(L, 1);
    int t = fe_check_tensor(L, 2, "output");
    if (strcmp(name, "loss") == 0)
        fe_error(L, "output: the name 'loss' is reserved for minimize(loss)");
    if (name_in(L, "kiln.outputs", name, false))
        fe_error(L, "output: the name '%s' is already used by another output", name);
    bool train = false;
    if (!lua_isnoneornil(L, 3)) {
        fe_check_opts(L, 3, "output", "train:boolean");
        lua_getfield(L, 3, "train");
        train = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    ir_add_output(fe->g, name, t);
    name_in(L, "kiln.outputs", name, true);
    if (train)
        vec_push(&fe->m->priv->train_outs, intern(name));
    return 0;
}

/* nn.decode.state(x) in decode mode: a new state tensor "kv_cache.N"
 * (zeros) of x's shape with axis -2 as long as the symbol T: the cache of x
 * over the whole window. */
int fe_dsl_decode_state(lua_State *L)
{
    Fe *fe = fe_get(L);
    int x = fe_check_tensor(L, 1, "nn.decode.state");
    Shape s = fe->g->t.v[x].s;
    int64_t T = 0;
    for (int i = 0; i < fe->g->syms.n; i++)
        if (strcmp(fe->g->syms.v[i].name, "T") == 0)
            T = fe->g->syms.v[i].value;
    if (T < 1 || s.rank < 2)
        fe_error(L, "nn.attention: decoding with a KV cache needs the time axis declared as "
                    "sym{T = ...} and k, v [..., T, D] (got %s%s)", SSTR(&s),
                 T < 1 ? " and no symbol T" : "");
    s.dim[s.rank - 2] = T;
    for (int i = 0; i < s.rank; i++)
        s.dname[i] = NULL;
    char name[64];
    snprintf(name, sizeof name, "kv_cache.%d", fe->decode_states++);
    ParamInit z = {.kind = INIT_ZEROS};
    fe_push_tensor(L, ir_add_input(fe->g, TK_STATE, name, s, z));
    return 1;
}

/* nn.decode.update(state, value): value replaces state after each run. */
int fe_dsl_decode_update(lua_State *L)
{
    Fe *fe = fe_get(L);
    int t = fe_check_tensor(L, 1, "nn.decode.update"), v = fe_check_tensor(L, 2, "nn.decode.update");
    if (fe->g->t.v[t].kind != TK_STATE || !shape_eq(&fe->g->t.v[t].s, &fe->g->t.v[v].s))
        fe_error(L, "nn.decode.update: expected a cache state and a value of its type");
    ir_add_update(fe->g, t, v);
    return 0;
}
