/* ops.c - the DSL's tensor primitives: tensors as Lua userdata, each op
 * appended to the forward graph with the script's file:line (elementwise ops
 * with NumPy broadcasting, select, cast, matmul, reshape, permute, transpose,
 * slice, concat, reductions, iota, const, random, gather, broadcast_to), and
 * the tensor metatable (fields, methods, arithmetic operators). fe_open_ops
 * registers them; the model runner is frontend.c.
 *
 * Axes are 0-based, and negative axes count from the end (NumPy's rule). */
#include "fe_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#define TENSOR_MT "kiln.tensor"

/* ---- tensors ------------------------------------------------------------ */

typedef struct {
    int id;
} TRef;

static bool is_tensor(lua_State *L, int idx) { return luaL_testudata(L, idx, TENSOR_MT) != NULL; }

void fe_push_tensor(lua_State *L, int id)
{
    TRef *r = lua_newuserdatauv(L, sizeof(TRef), 0);
    r->id = id;
    luaL_setmetatable(L, TENSOR_MT);
}

int fe_check_tensor(lua_State *L, int idx, const char *fn)
{
    TRef *r = luaL_testudata(L, idx, TENSOR_MT);
    if (!r)
        fe_error(L, "%s: argument %d must be a tensor (got %s)", fn, idx, luaL_typename(L, idx));
    return r->id;
}

Shape fe_tshape(lua_State *L, int id) { return fe_get(L)->g->t.v[id].s; }

static int emit(lua_State *L, Opcode code, const int *in, int nin, const OpAttr *a)
{
    Fe *fe = fe_get(L);
    char err[1024];
    SrcLoc loc = fe_user_loc(L);
    int t = ir_op(fe->g, code, in, nin, a, loc, err, sizeof err);
    if (t < 0)
        fe_error(L, "%s", err);
    return t;
}

int fe_parse_dtype(lua_State *L, int idx, DType def, const char *fn)
{
    if (lua_isnoneornil(L, idx))
        return def;
    const char *s = lua_tostring(L, idx);
    int d = s && lua_type(L, idx) == LUA_TSTRING ? dtype_parse(s) : -1;
    if (d < 0)
        fe_error(L, "%s: unknown dtype '%s' (expected f32, bf16, f16, i32, i64 or u8)", fn,
                 s ? s : luaL_typename(L, idx));
    return d;
}

/* The symbol sym{} declared as name: its value and interned name; NULL
 * when there is none. */
static const char *sym_lookup(const Graph *g, const char *name, int64_t *v)
{
    for (int k = 0; k < g->syms.n; k++)
        if (strcmp(g->syms.v[k].name, name) == 0) {
            *v = g->syms.v[k].value;
            return g->syms.v[k].name;
        }
    return NULL;
}

/* size(d): d's number, for d a number or a name declared with sym{} (so
 * that a layer given a size as a name can compute with it). */
static int l_size(lua_State *L)
{
    int isnum;
    lua_Integer v = lua_tointegerx(L, 1, &isnum);
    if (isnum && lua_type(L, 1) == LUA_TNUMBER) {
        lua_pushinteger(L, v);
        return 1;
    }
    int64_t sv;
    if (lua_type(L, 1) == LUA_TSTRING && sym_lookup(fe_get(L)->g, lua_tostring(L, 1), &sv)) {
        lua_pushinteger(L, (lua_Integer)sv);
        return 1;
    }
    return fe_error(L, "size: expected an integer or a name declared with sym{} (got %s)",
                    lua_type(L, 1) == LUA_TSTRING ? lua_tostring(L, 1) : luaL_typename(L, 1));
}

/* A list argument (a shape, axes, tensors) with a named key ({B = 4}
 * where {4} or {"B"} was meant) would read as shorter than written: an
 * error naming the key. */
static void check_list(lua_State *L, int idx, const char *fn, const char *what)
{
    idx = lua_absindex(L, idx);
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    const char *named = NULL; /* the first named key in sorted order: a stable message */
    bool other = false;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1 && lua_tointeger(L, -1) <= n)
            continue;
        if (lua_type(L, -1) == LUA_TSTRING) {
            if (!named || strcmp(lua_tostring(L, -1), named) < 0)
                named = lua_tostring(L, -1); /* the table keeps it alive */
        } else {
            other = true;
        }
    }
    if (named)
        fe_error(L, "%s: %s must be a list such as {a, b} (got the key '%s', which a list "
                    "does not have)", fn, what, named);
    if (other)
        fe_error(L, "%s: %s must be a list such as {a, b} with no gaps (got a key past its "
                    "%lld elements)", fn, what, (long long)n);
}

int fe_parse_shape(lua_State *L, int idx, int64_t *dim, const char **names, const char *fn)
{
    if (!lua_istable(L, idx))
        fe_error(L, "%s: shape must be a table of positive integers (got %s)", fn,
                 luaL_typename(L, idx));
    check_list(L, idx, fn, "the shape");
    int n = (int)lua_rawlen(L, idx);
    if (n > IR_MAX_RANK)
        fe_error(L, "%s: too many dimensions (expected at most %d, got %d)", fn, IR_MAX_RANK, n);
    Graph *g = fe_get(L)->g;
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        int isnum;
        lua_Integer v = lua_tointegerx(L, -1, &isnum);
        const char *dn = NULL;
        if (!isnum && lua_type(L, -1) == LUA_TSTRING) {
            const char *name = lua_tostring(L, -1);
            int64_t sv;
            if ((dn = sym_lookup(g, name, &sv)))
                v = (lua_Integer)sv, isnum = 1;
            if (!isnum)
                fe_error(L, "%s: dimension %d is '%s', which is not declared with sym{} "
                            "(expected a positive integer)", fn, i, name);
        }
        if (!isnum || v < 1) {
            char from[300];
            fe_set_origin(L, -1, from, sizeof from);
            fe_error(L, "%s: dimension %d must be a positive integer (got %s%s)", fn, i,
                     luaL_tolstring(L, -1, NULL), from);
        }
        dim[i] = v;
        if (names)
            names[i] = dn;
        lua_pop(L, 1);
    }
    return n;
}

Shape fe_checked_shape(lua_State *L, DType dt, int rank, const int64_t *dim, const char *fn)
{
    Shape s = shape_make(dt, rank, dim);
    char err[400];
    if (!ir_shape_check(fe_get(L)->g, &s, err, sizeof err))
        fe_error(L, "%s: %s", fn, err);
    return s;
}

static int norm_axis(lua_State *L, lua_Integer ax, const Shape *s, const char *fn)
{
    int r = s->rank;
    if (ax < -r || ax >= r)
        fe_error(L, "%s: axis %lld out of range for %s (expected %d..%d)", fn, (long long)ax,
                 SSTR(s), -r, r - 1);
    return (int)(ax < 0 ? ax + r : ax);
}

static lua_Integer check_int(lua_State *L, int idx, const char *fn, const char *what)
{
    int isnum;
    lua_Integer v = lua_tointegerx(L, idx, &isnum);
    if (!isnum)
        fe_error(L, "%s: %s must be an integer (got %s)", fn, what,
                 lua_type(L, idx) == LUA_TNUMBER ? lua_tostring(L, idx) : luaL_typename(L, idx));
    return v;
}

/* A const of dtype dt and shape [] holding the number at idx. */
static int scalar_const(lua_State *L, int idx, DType dt, const char *fn)
{
    if (lua_type(L, idx) != LUA_TNUMBER)
        fe_error(L, "%s: operand must be a tensor or a number (got %s)", fn,
                 luaL_typename(L, idx));
    double v = lua_tonumber(L, idx);
    if (!dtype_is_float(dt) && v != floor(v))
        fe_error(L, "%s: constant %g is not an integer (expected an integer for a %s tensor)",
                 fn, v, dtype_name(dt));
    OpAttr a = {.f = v, .dtype = dt, .rank = 0};
    return emit(L, OP_CONST, NULL, 0, &a);
}

/* NumPy broadcasting of two shapes' dims (dtype from a). */
static bool bcast_shape(const Shape *a, const Shape *b, Shape *r)
{
    int n = a->rank > b->rank ? a->rank : b->rank;
    r->dtype = a->dtype;
    r->rank = n;
    for (int i = 0; i < n; i++) {
        int ia = a->rank - n + i, ib = b->rank - n + i;
        int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
        const char *na = ia >= 0 ? a->dname[ia] : NULL, *nb = ib >= 0 ? b->dname[ib] : NULL;
        if (da != db && da != 1 && db != 1)
            return false;
        r->dim[i] = da == 1 ? db : da;
        /* the name of an operand axis of the result's length, a's first */
        r->dname[i] = na && da == r->dim[i] ? na : nb && db == r->dim[i] ? nb : NULL;
    }
    return true;
}

/* id broadcast to dims of target (its own dtype kept). */
static int bcast_to(lua_State *L, int id, const Shape *target)
{
    Shape s = fe_tshape(L, id);
    bool same = s.rank == target->rank;
    for (int i = 0; same && i < s.rank; i++)
        same = s.dim[i] == target->dim[i];
    if (same)
        return id;
    OpAttr a = {0};
    ir_attr_set_shape(&a, target);
    return emit(L, OP_BROADCAST, &id, 1, &a);
}

static int l_unary(lua_State *L)
{
    Opcode code = (Opcode)lua_tointeger(L, lua_upvalueindex(1));
    int x = fe_check_tensor(L, 1, ir_opinfo[code].name);
    fe_push_tensor(L, emit(L, code, &x, 1, NULL));
    return 1;
}

/* Elementwise binary op with broadcasting; either operand may be a number. */
static int binary(lua_State *L, Opcode code, int ia, int ib)
{
    const char *fn = ir_opinfo[code].name;
    bool ta = is_tensor(L, ia), tb = is_tensor(L, ib);
    if (!ta && !tb)
        fe_error(L, "%s: needs a tensor operand (got %s and %s)", fn, luaL_typename(L, ia),
                 luaL_typename(L, ib));
    int a = ta ? ((TRef *)lua_touserdata(L, ia))->id : -1;
    int b = tb ? ((TRef *)lua_touserdata(L, ib))->id : -1;
    if (!ta)
        a = scalar_const(L, ia, fe_tshape(L, b).dtype, fn);
    if (!tb)
        b = scalar_const(L, ib, fe_tshape(L, a).dtype, fn);
    Shape sa = fe_tshape(L, a), sb = fe_tshape(L, b), r;
    if (sa.dtype != sb.dtype)
        fe_error(L, "%s: operand dtypes differ (expected %s, got %s and %s)", fn,
                 dtype_name(sa.dtype), SSTR(&sa), SSTR(&sb));
    if (!bcast_shape(&sa, &sb, &r))
        fe_error(L, "%s: shapes do not broadcast (expected equal or 1 in each dimension, "
                    "got %s and %s)", fn, SSTR(&sa), SSTR(&sb));
    int in[2] = {bcast_to(L, a, &r), bcast_to(L, b, &r)};
    fe_push_tensor(L, emit(L, code, in, 2, NULL));
    return 1;
}

static int l_binary(lua_State *L)
{
    return binary(L, (Opcode)lua_tointeger(L, lua_upvalueindex(1)), 1, 2);
}

static int l_no_compare(lua_State *L)
{
    return fe_error(L, "tensors cannot be compared with < <= > >= (they make masks, not "
                       "booleans): use a:lt(b), a:le(b), a:gt(b), a:ge(b), a:eq(b), a:ne(b)");
}

/* select(mask, a, b) with broadcasting; select(n, ...) is Lua's own. */
static int l_select(lua_State *L)
{
    if (lua_type(L, 1) == LUA_TNUMBER || lua_type(L, 1) == LUA_TSTRING) {
        int n = lua_gettop(L);
        lua_pushvalue(L, lua_upvalueindex(1));
        lua_insert(L, 1);
        lua_call(L, n, LUA_MULTRET);
        return lua_gettop(L);
    }
    int m = fe_check_tensor(L, 1, "select");
    Shape sm = fe_tshape(L, m);
    if (sm.dtype != DT_U8)
        fe_error(L, "select: the mask must be u8, from a comparison such as a:lt(b) (expected "
                    "u8, got %s)", SSTR(&sm));
    bool ta = is_tensor(L, 2), tb = is_tensor(L, 3);
    DType dt = ta ? fe_tshape(L, ((TRef *)lua_touserdata(L, 2))->id).dtype
               : tb ? fe_tshape(L, ((TRef *)lua_touserdata(L, 3))->id).dtype
                    : DT_F32;
    int a = ta ? ((TRef *)lua_touserdata(L, 2))->id : scalar_const(L, 2, dt, "select");
    int b = tb ? ((TRef *)lua_touserdata(L, 3))->id : scalar_const(L, 3, dt, "select");
    Shape sa = fe_tshape(L, a), sb = fe_tshape(L, b), r1, r;
    if (sa.dtype != sb.dtype)
        fe_error(L, "select: value dtypes differ (expected %s, got %s and %s)",
                 dtype_name(sa.dtype), SSTR(&sa), SSTR(&sb));
    if (!bcast_shape(&sa, &sb, &r1) || !bcast_shape(&r1, &sm, &r))
        fe_error(L, "select: shapes do not broadcast (got mask %s, values %s and %s)", SSTR(&sm),
                 SSTR(&sa), SSTR(&sb));
    int in[3] = {bcast_to(L, m, &r), bcast_to(L, a, &r), bcast_to(L, b, &r)};
    fe_push_tensor(L, emit(L, OP_SELECT, in, 3, NULL));
    return 1;
}

static int l_cast(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "cast");
    if (lua_isnoneornil(L, 2))
        fe_error(L, "cast: needs a dtype (expected f32, bf16, f16, i32, i64 or u8, got nil)");
    DType dt = (DType)fe_parse_dtype(L, 2, DT_F32, "cast");
    if (fe_tshape(L, x).dtype == dt) {
        lua_settop(L, 1);
        return 1;
    }
    OpAttr a = {.dtype = dt};
    fe_push_tensor(L, emit(L, OP_CAST, &x, 1, &a));
    return 1;
}

static bool opt_flag(lua_State *L, int idx, const char *key)
{
    if (!lua_istable(L, idx))
        return false;
    lua_getfield(L, idx, key);
    bool v = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) != 0 : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* matmul(a, b, {ta=, tb=}): batch dims broadcast; a rank-2 b is shared. */
static int l_matmul(lua_State *L)
{
    int a = fe_check_tensor(L, 1, "matmul"), b = fe_check_tensor(L, 2, "matmul");
    fe_check_opts(L, 3, "matmul", "ta:flag tb:flag");
    bool ta = opt_flag(L, 3, "ta"), tb = opt_flag(L, 3, "tb");
    Shape sa = fe_tshape(L, a), sb = fe_tshape(L, b);
    if (sa.rank < 2 || sb.rank < 2)
        fe_error(L, "matmul: operands need rank >= 2 (got %s and %s)", SSTR(&sa), SSTR(&sb));
    if (sa.dtype != sb.dtype || !dtype_is_float(sa.dtype))
        fe_error(L, "matmul: operands need the same float dtype (got %s and %s)", SSTR(&sa),
                 SSTR(&sb));
    int64_t ka = sa.dim[sa.rank - (ta ? 2 : 1)], kb = sb.dim[sb.rank - (tb ? 1 : 2)];
    if (ka != kb)
        fe_error(L, "matmul: inner dimensions differ (expected %lld, got %lld; shapes %s and %s%s)",
                 (long long)ka, (long long)kb, SSTR(&sa), SSTR(&sb),
                 ta || tb ? (ta && tb ? ", ta and tb set" : ta ? ", ta set" : ", tb set") : "");
    if (sb.rank > 2) {
        Shape ba = {.dtype = sa.dtype, .rank = sa.rank - 2}, bb = {.dtype = sb.dtype, .rank = sb.rank - 2}, br;
        memcpy(ba.dim, sa.dim, sizeof(int64_t) * (size_t)ba.rank);
        memcpy(bb.dim, sb.dim, sizeof(int64_t) * (size_t)bb.rank);
        if (!bcast_shape(&ba, &bb, &br))
            fe_error(L, "matmul: batch dimensions do not broadcast (got %s and %s)", SSTR(&sa),
                     SSTR(&sb));
        Shape ta_s = br, tb_s = br;
        ta_s.rank = tb_s.rank = br.rank + 2;
        ta_s.dim[br.rank] = sa.dim[sa.rank - 2], ta_s.dim[br.rank + 1] = sa.dim[sa.rank - 1];
        tb_s.dim[br.rank] = sb.dim[sb.rank - 2], tb_s.dim[br.rank + 1] = sb.dim[sb.rank - 1];
        a = bcast_to(L, a, &ta_s);
        b = bcast_to(L, b, &tb_s);
    }
    OpAttr at = {.nia = 2, .ia = {ta, tb}};
    int in[2] = {a, b};
    fe_push_tensor(L, emit(L, OP_MATMUL, in, 2, &at));
    return 1;
}

/* names: the dims' names (NULL: none, or no names at all) */
static int do_reshape_named(lua_State *L, int x, int rank, const int64_t *dim,
                            const char *const *names)
{
    OpAttr a = {.rank = rank};
    memcpy(a.shape, dim, sizeof(int64_t) * (size_t)rank);
    for (int i = 0; names && i < rank; i++)
        a.dname[i] = names[i];
    return emit(L, OP_RESHAPE, &x, 1, &a);
}

static int do_reshape(lua_State *L, int x, int rank, const int64_t *dim)
{
    return do_reshape_named(L, x, rank, dim, NULL);
}

/* reshape(x, shape): one dimension may be -1 (inferred). */
static int l_reshape(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "reshape");
    Shape s = fe_tshape(L, x);
    if (!lua_istable(L, 2))
        fe_error(L, "reshape: shape must be a table of positive integers (got %s)",
                 luaL_typename(L, 2));
    check_list(L, 2, "reshape", "the shape");
    int n = (int)lua_rawlen(L, 2), infer = -1;
    int64_t dim[IR_MAX_RANK], known = 1;
    const char *dn[IR_MAX_RANK] = {0};
    if (n > IR_MAX_RANK)
        fe_error(L, "reshape: too many dimensions (expected at most %d, got %d)", IR_MAX_RANK, n);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        int isnum;
        lua_Integer v = lua_tointegerx(L, -1, &isnum);
        int64_t sv;
        if (!isnum && lua_type(L, -1) == LUA_TSTRING &&
            (dn[i] = sym_lookup(fe_get(L)->g, lua_tostring(L, -1), &sv)))
            v = (lua_Integer)sv, isnum = 1;
        if (isnum && v == -1 && infer < 0) {
            infer = i;
            dim[i] = 1;
        } else if (!isnum || v < 1) {
            fe_error(L, "reshape: dimension %d must be a positive integer or one -1 (got %s)", i,
                     luaL_tolstring(L, -1, NULL));
        } else {
            dim[i] = v;
            if (!ir_mul_ok(known, v, &known))
                known = INT64_MAX;
        }
        lua_pop(L, 1);
    }
    if (known > IR_MAX_NUMEL)
        fe_checked_shape(L, s.dtype, n, dim, "reshape"); /* raises: too many elements */
    int64_t numel = shape_numel(&s);
    if (infer >= 0 && known > 0 && numel % known == 0)
        dim[infer] = numel / known, known = numel;
    if (known != numel) {
        char want[200];
        size_t k = (size_t)snprintf(want, sizeof want, "[");
        for (int i = 0; i < n; i++)
            k += (size_t)snprintf(want + k, sizeof want - k, "%s%lld", i ? "," : "",
                                  i == infer ? -1LL : (long long)dim[i]);
        snprintf(want + k, sizeof want - k, "]");
        fe_error(L, "reshape: element counts differ (cannot reshape %s with %lld elements to %s)",
                 SSTR(&s), (long long)numel, want);
    }
    fe_push_tensor(L, do_reshape_named(L, x, n, dim, dn));
    return 1;
}

static int permute_to(lua_State *L, int x, const int *perm)
{
    Shape s = fe_tshape(L, x);
    bool ident = true;
    for (int i = 0; i < s.rank; i++)
        ident &= perm[i] == i;
    if (ident)
        return x;
    OpAttr a = {.nia = s.rank};
    for (int i = 0; i < s.rank; i++)
        a.ia[i] = perm[i];
    return emit(L, OP_PERMUTE, &x, 1, &a);
}

static int l_permute(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "permute");
    Shape s = fe_tshape(L, x);
    if (!lua_istable(L, 2))
        fe_error(L, "permute: needs a table of axes (got %s)", luaL_typename(L, 2));
    check_list(L, 2, "permute", "the axes");
    int n = (int)lua_rawlen(L, 2), perm[IR_MAX_RANK];
    if (n != s.rank)
        fe_error(L, "permute: needs one axis per dimension of %s (expected %d, got %d)", SSTR(&s),
                 s.rank, n);
    unsigned seen = 0;
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        perm[i] = norm_axis(L, check_int(L, -1, "permute", "an axis"), &s, "permute");
        if (seen >> perm[i] & 1)
            fe_error(L, "permute: axis %d appears twice (expected a permutation of 0..%d)",
                     perm[i], s.rank - 1);
        seen |= 1u << perm[i];
        lua_pop(L, 1);
    }
    fe_push_tensor(L, permute_to(L, x, perm));
    return 1;
}

static int l_transpose(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "transpose");
    Shape s = fe_tshape(L, x);
    if (s.rank < 2)
        fe_error(L, "transpose: needs rank >= 2 (got %s)", SSTR(&s));
    int d0 = norm_axis(L, lua_isnoneornil(L, 2) ? -2 : check_int(L, 2, "transpose", "axis"), &s,
                       "transpose");
    int d1 = norm_axis(L, lua_isnoneornil(L, 3) ? -1 : check_int(L, 3, "transpose", "axis"), &s,
                       "transpose");
    int perm[IR_MAX_RANK];
    for (int i = 0; i < s.rank; i++)
        perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    fe_push_tensor(L, permute_to(L, x, perm));
    return 1;
}

/* slice(x, axis, start, stop): [start, stop) along axis; negatives count
 * from the end; stop defaults to the dimension's size. */
static int l_slice(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "slice");
    Shape s = fe_tshape(L, x);
    int ax = norm_axis(L, check_int(L, 2, "slice", "axis"), &s, "slice");
    int64_t n = s.dim[ax];
    int64_t lo = lua_isnoneornil(L, 3) ? 0 : check_int(L, 3, "slice", "start");
    int64_t hi = lua_isnoneornil(L, 4) ? n : check_int(L, 4, "slice", "stop");
    if (lo < 0)
        lo += n;
    if (hi < 0)
        hi += n;
    if (lo < 0 || hi > n || lo >= hi)
        fe_error(L, "slice: range [%lld, %lld) is empty or out of bounds on axis %d of %s "
                    "(expected 0 <= start < stop <= %lld)",
                 (long long)lo, (long long)hi, ax, SSTR(&s), (long long)n);
    if (lo == 0 && hi == n) {
        lua_settop(L, 1);
        return 1;
    }
    OpAttr a = {.nia = s.rank, .rank = s.rank};
    memcpy(a.shape, s.dim, sizeof a.shape);
    a.ia[ax] = lo;
    a.shape[ax] = hi - lo;
    fe_push_tensor(L, emit(L, OP_SLICE, &x, 1, &a));
    return 1;
}

/* pad(x, axis, lo, hi, value): lo and hi elements of value (default 0)
 * before and after x along axis. A nonzero value is pad(x - value) + value,
 * so the gradient is the pad op's (a slice). */
static int l_pad(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "pad");
    Shape s = fe_tshape(L, x);
    int ax = norm_axis(L, check_int(L, 2, "pad", "axis"), &s, "pad");
    int64_t lo = check_int(L, 3, "pad", "lo");
    int64_t hi = lua_isnoneornil(L, 4) ? 0 : check_int(L, 4, "pad", "hi");
    if (!lua_isnoneornil(L, 5) && lua_type(L, 5) != LUA_TNUMBER)
        fe_error(L, "pad: value must be a number (got %s)", luaL_typename(L, 5));
    double v = lua_isnoneornil(L, 5) ? 0 : lua_tonumber(L, 5);
    if (lo < 0 || hi < 0 || lo > ((int64_t)1 << 40) || hi > ((int64_t)1 << 40))
        fe_error(L, "pad: lo and hi must be counts of elements (expected 0 .. 2^40, got %lld "
                    "and %lld)", (long long)lo, (long long)hi);
    if (lo == 0 && hi == 0) {
        lua_settop(L, 1);
        return 1;
    }
    if (v != 0 && !dtype_is_float(s.dtype))
        fe_error(L, "pad: a nonzero value needs a float tensor (got %s)", SSTR(&s));
    int src = x;
    if (v != 0) {
        int c = scalar_const(L, 5, s.dtype, "pad");
        int in[2] = {x, bcast_to(L, c, &s)};
        src = emit(L, OP_SUB, in, 2, NULL);
    }
    OpAttr a = {.nia = s.rank, .rank = s.rank};
    memcpy(a.shape, s.dim, sizeof a.shape);
    a.ia[ax] = lo;
    a.shape[ax] = s.dim[ax] + lo + hi;
    Shape r = fe_checked_shape(L, s.dtype, s.rank, a.shape, "pad");
    int y = emit(L, OP_PAD, &src, 1, &a);
    if (v != 0) {
        int c = scalar_const(L, 5, s.dtype, "pad");
        int in[2] = {y, bcast_to(L, c, &r)};
        y = emit(L, OP_ADD, in, 2, NULL);
    }
    fe_push_tensor(L, y);
    return 1;
}

/* The per-spatial-dim sizes at idx (a number for every dim, or a table of
 * ns integers) into v[0..ns); def when absent. */
static void conv_sizes(lua_State *L, int idx, int ns, int64_t def, int64_t lo, const char *what,
                       int64_t *v)
{
    if (lua_isnoneornil(L, idx)) {
        for (int i = 0; i < ns; i++)
            v[i] = def;
        return;
    }
    if (lua_istable(L, idx)) {
        if (luaL_len(L, idx) != ns)
            fe_error(L, "im2col: %s must be an integer or a table of %d integers, one per "
                        "spatial dim (got a table of %lld)", what, ns,
                     (long long)luaL_len(L, idx));
        for (int i = 0; i < ns; i++) {
            lua_geti(L, idx, i + 1);
            v[i] = check_int(L, -1, "im2col", what);
            lua_pop(L, 1);
        }
    } else {
        int64_t x = check_int(L, idx, "im2col", what);
        for (int i = 0; i < ns; i++)
            v[i] = x;
    }
    for (int i = 0; i < ns; i++)
        if (v[i] < lo || v[i] > ((int64_t)1 << 40))
            fe_error(L, "im2col: %s must be %s (expected %lld .. 2^40, got %lld)", what,
                     lo ? "positive" : "zero or more", (long long)lo, (long long)v[i]);
}

/* im2col(x, kernel, stride, padding, dilation): x [N, C, L] or [N, C, H,
 * W] float -> the patches [N, OL, C*k] or [N, OH, OW, C*kh*kw] (ir.h);
 * each size a number or a table of one per spatial dim (stride and
 * dilation default 1, padding 0). */
static int l_im2col(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "im2col");
    Shape s = fe_tshape(L, x);
    if (s.rank != 3 && s.rank != 4)
        fe_error(L, "im2col: x must be [N, C, L] or [N, C, H, W] (expected rank 3 or 4, got %s)",
                 SSTR(&s));
    int ns = s.rank - 2;
    if (lua_isnoneornil(L, 2))
        fe_error(L, "im2col: needs the kernel size (argument 2)");
    OpAttr a = {.nia = 4 * ns};
    conv_sizes(L, 2, ns, 1, 1, "kernel", a.ia);
    conv_sizes(L, 3, ns, 1, 1, "stride", a.ia + ns);
    conv_sizes(L, 4, ns, 0, 0, "padding", a.ia + 2 * ns);
    conv_sizes(L, 5, ns, 1, 1, "dilation", a.ia + 3 * ns);
    fe_push_tensor(L, emit(L, OP_IM2COL, &x, 1, &a));
    return 1;
}

/* a // b and a % b on tensors: Lua's floor division and modulo (the
 * remainder has the divisor's sign), written by nn.floor_div / nn.floor_mod
 * in nn.lua with the primitives (so autodiff needs no rule). */
static int l_floor_op(lua_State *L)
{
    const char *fn = lua_tostring(L, lua_upvalueindex(1));
    if (lua_getglobal(L, "nn") != LUA_TTABLE || lua_getfield(L, -1, fn) != LUA_TFUNCTION)
        fe_error(L, "nn.%s is missing (the nn library was replaced?)", fn);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_call(L, 2, 1);
    return 1;
}

static int l_concat(lua_State *L)
{
    if (!lua_istable(L, 1))
        fe_error(L, "concat: needs a table of tensors (got %s)", luaL_typename(L, 1));
    check_list(L, 1, "concat", "the tensors");
    int n = (int)lua_rawlen(L, 1);
    if (n < 1)
        fe_error(L, "concat: needs at least one tensor (got an empty table)");
    int *in = lua_newuserdatauv(L, sizeof(int) * (size_t)n, 0); /* freed by the GC */
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        in[i] = fe_check_tensor(L, lua_gettop(L), "concat");
        lua_pop(L, 1);
    }
    Shape s = fe_tshape(L, in[0]);
    int ax = norm_axis(L, lua_isnoneornil(L, 2) ? 0 : check_int(L, 2, "concat", "axis"), &s,
                       "concat");
    if (n == 1) {
        fe_push_tensor(L, in[0]);
        return 1;
    }
    OpAttr a = {.nia = 1, .ia = {ax}};
    fe_push_tensor(L, emit(L, OP_CONCAT, in, n, &a));
    return 1;
}

enum { RED_SUM, RED_MAX, RED_MIN, RED_MEAN, RED_LSE };

/* sum/max/min/mean/logsumexp(x, axes, keepdims): axes nil (all), a number
 * or a table. */
static int l_reduce(lua_State *L)
{
    static const char *names[] = {"sum", "max", "min", "mean", "logsumexp"};
    int kind = (int)lua_tointeger(L, lua_upvalueindex(1));
    const char *fn = names[kind];
    int x = fe_check_tensor(L, 1, fn);
    Shape s = fe_tshape(L, x);
    bool keep = lua_toboolean(L, 3);
    bool red[IR_MAX_RANK] = {0};
    if (lua_isnoneornil(L, 2)) {
        for (int i = 0; i < s.rank; i++)
            red[i] = true;
    } else if (lua_istable(L, 2)) {
        check_list(L, 2, fn, "the axes");
        int n = (int)lua_rawlen(L, 2);
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, 2, i + 1);
            int ax = norm_axis(L, check_int(L, -1, fn, "an axis"), &s, fn);
            if (red[ax])
                fe_error(L, "%s: axis %d appears twice", fn, ax);
            red[ax] = true;
            lua_pop(L, 1);
        }
    } else {
        red[norm_axis(L, check_int(L, 2, fn, "axis"), &s, fn)] = true;
    }
    if ((kind == RED_MEAN || kind == RED_LSE) && !dtype_is_float(s.dtype))
        fe_error(L, "%s: needs a float tensor (expected f32/bf16/f16, got %s)", fn, SSTR(&s));
    if (s.dtype == DT_U8)
        fe_error(L, "%s: cannot reduce a u8 mask; cast it first (expected a numeric tensor, got "
                    "%s)", fn, SSTR(&s));
    OpAttr a = {0};
    int64_t count = 1, kdim[IR_MAX_RANK];
    int krank = 0;
    for (int i = 0; i < s.rank; i++) {
        if (red[i]) {
            a.ia[a.nia++] = i;
            count *= s.dim[i];
        } else {
            kdim[krank++] = s.dim[i];
        }
    }
    int r = x;
    if (a.nia) {
        if (kind == RED_MIN)
            r = emit(L, OP_NEG, &r, 1, NULL);
        r = emit(L, kind == RED_SUM || kind == RED_MEAN ? OP_REDUCE_SUM
                    : kind == RED_LSE                   ? OP_REDUCE_LOGSUMEXP
                                                        : OP_REDUCE_MAX,
                 &r, 1, &a);
        if (kind == RED_MIN)
            r = emit(L, OP_NEG, &r, 1, NULL);
        if (kind == RED_MEAN) {
            OpAttr c = {.f = 1.0 / (double)count, .dtype = s.dtype};
            int k = emit(L, OP_CONST, NULL, 0, &c);
            Shape rs = fe_tshape(L, r);
            int in[2] = {r, bcast_to(L, k, &rs)};
            r = emit(L, OP_MUL, in, 2, NULL);
        }
        if (!keep)
            r = do_reshape(L, r, krank, kdim);
    }
    fe_push_tensor(L, r);
    return 1;
}

static int l_iota(lua_State *L)
{
    OpAttr a = {0};
    a.rank = fe_parse_shape(L, 1, a.shape, a.dname, "iota");
    Shape s = shape_make(DT_I32, a.rank, a.shape);
    a.nia = 1;
    a.ia[0] = norm_axis(L, lua_isnoneornil(L, 2) ? 0 : check_int(L, 2, "iota", "axis"), &s,
                        "iota");
    a.dtype = (DType)fe_parse_dtype(L, 3, DT_I32, "iota");
    Fe *fe = fe_get(L);
    int ax = (int)a.ia[0];
    if (fe->decode_len > 0 && a.dname[ax] && strcmp(a.dname[ax], "T") == 0) {
        /* decode mode: the step's S positions pos, pos+1, ... along "T" */
        a.shape[ax] = fe->decode_len;
        a.dname[ax] = NULL;
        int r = emit(L, OP_IOTA, NULL, 0, &a), p = fe->decode_pos;
        if (a.dtype != DT_I32) {
            OpAttr c = {.dtype = a.dtype};
            p = emit(L, OP_CAST, &p, 1, &c);
        }
        Shape rs = fe_tshape(L, r);
        int in[2] = {r, bcast_to(L, p, &rs)};
        fe_push_tensor(L, emit(L, OP_ADD, in, 2, NULL));
        return 1;
    }
    fe_push_tensor(L, emit(L, OP_IOTA, NULL, 0, &a));
    return 1;
}

static int l_const(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TNUMBER)
        fe_error(L, "const: value must be a number (got %s)", luaL_typename(L, 1));
    OpAttr a = {.f = lua_tonumber(L, 1)};
    if (!lua_isnoneornil(L, 2))
        a.rank = fe_parse_shape(L, 2, a.shape, a.dname, "const");
    a.dtype = (DType)fe_parse_dtype(L, 3, DT_F32, "const");
    fe_push_tensor(L, emit(L, OP_CONST, NULL, 0, &a));
    return 1;
}

static int l_random(lua_State *L)
{
    OpAttr a = {.nia = 1};
    a.rank = fe_parse_shape(L, 1, a.shape, a.dname, "random");
    a.ia[0] = ++fe_get(L)->next_key;
    fe_push_tensor(L, emit(L, OP_RANDOM, NULL, 0, &a));
    return 1;
}

static int l_gather(lua_State *L)
{
    int t = fe_check_tensor(L, 1, "gather"), i = fe_check_tensor(L, 2, "gather");
    Shape st = fe_tshape(L, t), si = fe_tshape(L, i);
    if (si.dtype != DT_I32 && si.dtype != DT_I64)
        fe_error(L, "gather: indices must be integers (expected i32 or i64, got %s; table %s)",
                 SSTR(&si), SSTR(&st));
    int in[2] = {t, i};
    fe_push_tensor(L, emit(L, OP_GATHER, in, 2, NULL));
    return 1;
}

/* take_along(x[..., V], idx[...]) -> [...]: x[i, idx[i]] (0 out of range) */
static int l_take_along(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "take_along"), i = fe_check_tensor(L, 2, "take_along");
    Shape si = fe_tshape(L, i);
    if (si.dtype != DT_I32 && si.dtype != DT_I64)
        fe_error(L, "take_along: indices must be integers (expected i32 or i64, got %s)",
                 SSTR(&si));
    int in[2] = {x, i};
    fe_push_tensor(L, emit(L, OP_TAKE_ALONG, in, 2, NULL));
    return 1;
}

static int l_broadcast_to(lua_State *L)
{
    int x = fe_check_tensor(L, 1, "broadcast_to");
    Shape s = fe_tshape(L, x), r = s, chk;
    r.rank = fe_parse_shape(L, 2, r.dim, r.dname, "broadcast_to");
    if (!bcast_shape(&s, &r, &chk) || chk.rank != r.rank ||
        memcmp(chk.dim, r.dim, sizeof(int64_t) * (size_t)r.rank) != 0)
        fe_error(L, "broadcast_to: cannot broadcast %s to %s", SSTR(&s), SSTR(&r));
    fe_push_tensor(L, bcast_to(L, x, &r));
    return 1;
}

/* ---- the tensor metatable ----------------------------------------------- */

static int l_index(lua_State *L)
{
    int x = ((TRef *)luaL_checkudata(L, 1, TENSOR_MT))->id;
    const char *k = lua_tostring(L, 2);
    Shape s = fe_tshape(L, x);
    if (k && strcmp(k, "shape") == 0) {
        lua_createtable(L, s.rank, 0);
        for (int i = 0; i < s.rank; i++) {
            lua_pushinteger(L, s.dim[i]);
            lua_rawseti(L, -2, i + 1);
        }
        return 1;
    }
    if (k && strcmp(k, "dtype") == 0) {
        lua_pushstring(L, dtype_name(s.dtype));
        return 1;
    }
    if (k && strcmp(k, "rank") == 0) {
        lua_pushinteger(L, s.rank);
        return 1;
    }
    if (k && strcmp(k, "id") == 0) {
        lua_pushinteger(L, x);
        return 1;
    }
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL)
        return 1;
    return fe_error(L, "tensor has no field or method '%s' (expected shape, dtype, rank, or a "
                       "method such as exp, sum, reshape, matmul, lt)",
                    k ? k : luaL_tolstring(L, 2, NULL));
}

static int l_newindex(lua_State *L)
{
    return fe_error(L, "tensors are immutable (cannot set field '%s')",
                    luaL_tolstring(L, 2, NULL));
}

static int l_tostring(lua_State *L)
{
    int x = ((TRef *)luaL_checkudata(L, 1, TENSOR_MT))->id;
    Shape s = fe_tshape(L, x);
    lua_pushfstring(L, "tensor %%%d:%s", x, SSTR(&s));
    return 1;
}

static int l_init_tostring(lua_State *L)
{
    ParamInit *p = luaL_checkudata(L, 1, INIT_MT);
    switch (p->kind) {
    case INIT_ZEROS: lua_pushstring(L, "zeros()"); break;
    case INIT_ONES: lua_pushstring(L, "ones()"); break;
    case INIT_NORMAL: lua_pushfstring(L, "normal(%f)", p->a); break;
    default: lua_pushfstring(L, "uniform(%f, %f)", p->a, p->b); break;
    }
    return 1;
}

/* Registers f (with one integer upvalue when up >= 0) as a global and, when
 * method, in the methods table at stack index mt. */
static void reg(lua_State *L, int methods, const char *name, lua_CFunction f, int up, bool method)
{
    if (up >= 0) {
        lua_pushinteger(L, up);
        lua_pushcclosure(L, f, 1);
    } else {
        lua_pushcfunction(L, f);
    }
    if (method) {
        lua_pushvalue(L, -1);
        lua_setfield(L, methods, name);
    }
    lua_setglobal(L, name);
}

void fe_open_ops(lua_State *L, const FeGlobal *extra)
{
    static const struct {
        const char *name;
        Opcode code;
    } unary[] = {{"exp", OP_EXP},         {"log", OP_LOG},   {"sin", OP_SIN},
                 {"cos", OP_COS},         {"tanh", OP_TANH}, {"sqrt", OP_SQRT},
                 {"rsqrt", OP_RSQRT},     {"sigmoid", OP_SIGMOID}, {"relu", OP_RELU},
                 {"abs", OP_ABS},         {"neg", OP_NEG},   {"erf", OP_ERF},
                 {"floor", OP_FLOOR},
                 {"stop_gradient", OP_STOP_GRADIENT}},
      binaryops[] = {{"add", OP_ADD},     {"sub", OP_SUB},  {"mul", OP_MUL},
                     {"div", OP_DIV},     {"pow", OP_POW},  {"maximum", OP_MAX},
                     {"minimum", OP_MIN}, {"lt", OP_LT},    {"le", OP_LE},
                     {"gt", OP_GT},       {"ge", OP_GE},    {"eq", OP_EQ},
                     {"ne", OP_NE}};
    lua_newtable(L); /* methods */
    int methods = lua_gettop(L);
    for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++)
        reg(L, methods, unary[i].name, l_unary, unary[i].code, true);
    for (size_t i = 0; i < sizeof binaryops / sizeof binaryops[0]; i++)
        reg(L, methods, binaryops[i].name, l_binary, binaryops[i].code, true);
    static const char *rnames[] = {"sum", "max", "min", "mean", "logsumexp"};
    for (int i = 0; i < 5; i++)
        reg(L, methods, rnames[i], l_reduce, i, true);
    reg(L, methods, "cast", l_cast, -1, true);
    reg(L, methods, "matmul", l_matmul, -1, true);
    reg(L, methods, "reshape", l_reshape, -1, true);
    reg(L, methods, "permute", l_permute, -1, true);
    reg(L, methods, "transpose", l_transpose, -1, true);
    reg(L, methods, "slice", l_slice, -1, true);
    reg(L, methods, "pad", l_pad, -1, true);
    reg(L, methods, "broadcast_to", l_broadcast_to, -1, true);
    reg(L, methods, "im2col", l_im2col, -1, true);
    reg(L, methods, "gather", l_gather, -1, true);
    reg(L, methods, "embedding", l_gather, -1, false);
    reg(L, methods, "take_along", l_take_along, -1, true);
    reg(L, methods, "concat", l_concat, -1, false);
    reg(L, methods, "iota", l_iota, -1, false);
    reg(L, methods, "const", l_const, -1, false);
    reg(L, methods, "random", l_random, -1, false);
    reg(L, methods, "size", l_size, -1, false);
    for (const FeGlobal *e = extra; e && e->name; e++)
        reg(L, methods, e->name, e->f, e->up, false);
    lua_getglobal(L, "select"); /* Lua's select(n, ...) stays reachable */
    lua_pushcclosure(L, l_select, 1);
    lua_pushvalue(L, -1);
    lua_setglobal(L, "where");
    lua_pushvalue(L, -1);
    lua_setfield(L, methods, "select");
    lua_setglobal(L, "select");

    luaL_newmetatable(L, TENSOR_MT);
    lua_pushvalue(L, methods);
    lua_pushcclosure(L, l_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
    static const struct {
        const char *mm;
        Opcode code;
    } arith[] = {{"__add", OP_ADD}, {"__sub", OP_SUB}, {"__mul", OP_MUL},
                 {"__div", OP_DIV}, {"__pow", OP_POW}};
    for (size_t i = 0; i < sizeof arith / sizeof arith[0]; i++) {
        lua_pushinteger(L, arith[i].code);
        lua_pushcclosure(L, l_binary, 1);
        lua_setfield(L, -2, arith[i].mm);
    }
    lua_pushinteger(L, OP_NEG);
    lua_pushcclosure(L, l_unary, 1);
    lua_setfield(L, -2, "__unm");
    lua_pushstring(L, "floor_div");
    lua_pushcclosure(L, l_floor_op, 1);
    lua_setfield(L, -2, "__idiv");
    lua_pushstring(L, "floor_mod");
    lua_pushcclosure(L, l_floor_op, 1);
    lua_setfield(L, -2, "__mod");
    lua_pushcfunction(L, l_no_compare);
    lua_setfield(L, -2, "__lt");
    lua_pushcfunction(L, l_no_compare);
    lua_setfield(L, -2, "__le");
    /* getmetatable(x) gives a stand-in, never this table: a script that
     * could write it could give every later tensor a __gc finalizer */
    fe_push_locked(L);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);

    luaL_newmetatable(L, INIT_MT);
    lua_pushcfunction(L, l_init_tostring);
    lua_setfield(L, -2, "__tostring");
    fe_push_locked(L);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 2);
}
