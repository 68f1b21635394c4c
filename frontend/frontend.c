/* frontend.c - runs a model script in an embedded Lua 5.4 state: the DSL's
 * primitives (tensors as userdata, each op appended to the forward graph with
 * the script's file:line), config{} and --set, and train{} (whose key
 * table lives in settings.c). The nn library and the other Lua files of frontend/ are embedded in the
 * binary and loaded as globals named after their files.
 *
 * Axes are 0-based, and negative axes count from the end (NumPy's rule). */
#include "frontend.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

struct fe_embedded {
    const char *name;
    const char *src;
    size_t len;
};
extern const struct fe_embedded fe_embedded_lua[];

#define TENSOR_MT "kiln.tensor"
#define INIT_MT "kiln.init"

/* ---- the Lua state ------------------------------------------------------ */

typedef struct {
    Graph *g;
    Model *m;
    const char *path;  /* interned script path */
    char chunk[1024];  /* "@path": the chunk name of the script */
    const char *const *sets;
    int nsets;
    bool *set_used;    /* consumed by config{} */
    int config_ref;    /* registry ref of config{}'s table, LUA_NOREF if none */
    int loss;          /* tensor id, -1 before minimize() */
    int loss_line;
    int train_line;    /* last train{} call, 0 if none */
    int next_key;      /* random op keys */
} Fe;

static Fe *getfe(lua_State *L) { return *(Fe **)lua_getextraspace(L); }

/* The nearest stack frame that belongs to the user's script. */
static SrcLoc user_loc(lua_State *L)
{
    Fe *fe = getfe(L);
    lua_Debug ar;
    for (int lv = 0; lua_getstack(L, lv, &ar); lv++) {
        lua_getinfo(L, "Sl", &ar);
        if (ar.currentline > 0 && strcmp(ar.source, fe->chunk) == 0)
            return (SrcLoc){fe->path, ar.currentline};
    }
    return (SrcLoc){fe->path, 0};
}

/* Raises "FILE:LINE: msg" at the user's line. */
static int fe_error(lua_State *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fe_error(lua_State *L, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    SrcLoc loc = user_loc(L);
    lua_pushfstring(L, "%s:%d: %s", loc.file, loc.line, msg);
    return lua_error(L);
}

/* Raises "--set KEY: msg". */
static int set_error(lua_State *L, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_error(lua_State *L, const char *key, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lua_pushfstring(L, "--set %s: %s", key, msg);
    return lua_error(L);
}

/* Message handler: every error names the user's file and line. Errors raised
 * by the DSL already do; Lua's own errors in the script carry the chunk's
 * short name, which is replaced by the full path; errors inside embedded
 * library code get the user's line in front. */
static int msgh(lua_State *L)
{
    Fe *fe = getfe(L);
    const char *msg = lua_tostring(L, 1);
    if (!msg)
        msg = lua_pushfstring(L, "error object is a %s value", luaL_typename(L, 1));
    size_t pl = strlen(fe->path);
    if ((strncmp(msg, fe->path, pl) == 0 && msg[pl] == ':') || strncmp(msg, "--set ", 6) == 0) {
        lua_pushstring(L, msg);
        return 1;
    }
    lua_Debug ar;
    for (int lv = 1; lua_getstack(L, lv, &ar); lv++) {
        lua_getinfo(L, "Sl", &ar);
        if (ar.currentline <= 0 || strcmp(ar.source, fe->chunk) != 0)
            continue;
        size_t sl = strlen(ar.short_src);
        if (strncmp(msg, ar.short_src, sl) == 0 && msg[sl] == ':')
            lua_pushfstring(L, "%s%s", fe->path, msg + sl);
        else
            lua_pushfstring(L, "%s:%d: %s", fe->path, ar.currentline, msg);
        return 1;
    }
    lua_pushfstring(L, "%s: %s", fe->path, msg);
    return 1;
}

/* ---- tensors ------------------------------------------------------------ */

typedef struct {
    int id;
} TRef;

static bool is_tensor(lua_State *L, int idx) { return luaL_testudata(L, idx, TENSOR_MT) != NULL; }

static void push_tensor(lua_State *L, int id)
{
    TRef *r = lua_newuserdatauv(L, sizeof(TRef), 0);
    r->id = id;
    luaL_setmetatable(L, TENSOR_MT);
}

static int check_tensor(lua_State *L, int idx, const char *fn)
{
    TRef *r = luaL_testudata(L, idx, TENSOR_MT);
    if (!r)
        fe_error(L, "%s: argument %d must be a tensor (got %s)", fn, idx, luaL_typename(L, idx));
    return r->id;
}

static Shape tshape(lua_State *L, int id) { return getfe(L)->g->t.v[id].s; }

static const char *sstr(lua_State *L, const Shape *s, char *buf, size_t n)
{
    return shape_str(getfe(L)->g, s, buf, n);
}
#define SSTR(s) sstr(L, (s), (char[160]){0}, 160)

static int emit(lua_State *L, Opcode code, const int *in, int nin, const OpAttr *a)
{
    Fe *fe = getfe(L);
    char err[1024];
    SrcLoc loc = user_loc(L);
    int t = ir_op(fe->g, code, in, nin, a, loc, err, sizeof err);
    if (t < 0)
        fe_error(L, "%s", err);
    return t;
}

static int parse_dtype(lua_State *L, int idx, DType def, const char *fn)
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

/* A shape argument: a table of positive integers (or names declared with
 * sym{}). Returns the rank. */
static int parse_shape(lua_State *L, int idx, int64_t *dim, const char *fn)
{
    if (!lua_istable(L, idx))
        fe_error(L, "%s: shape must be a table of positive integers (got %s)", fn,
                 luaL_typename(L, idx));
    int n = (int)lua_rawlen(L, idx);
    if (n > IR_MAX_RANK)
        fe_error(L, "%s: too many dimensions (expected at most %d, got %d)", fn, IR_MAX_RANK, n);
    Graph *g = getfe(L)->g;
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        int isnum;
        lua_Integer v = lua_tointegerx(L, -1, &isnum);
        if (!isnum && lua_type(L, -1) == LUA_TSTRING) {
            const char *name = lua_tostring(L, -1);
            for (int k = 0; k < g->syms.n; k++)
                if (strcmp(g->syms.v[k].name, name) == 0) {
                    v = g->syms.v[k].value;
                    isnum = 1;
                }
            if (!isnum)
                fe_error(L, "%s: dimension %d is '%s', which is not declared with sym{} "
                            "(expected a positive integer)", fn, i, name);
        }
        if (!isnum || v < 1)
            fe_error(L, "%s: dimension %d must be a positive integer (got %s)", fn, i,
                     luaL_tolstring(L, -1, NULL));
        dim[i] = v;
        lua_pop(L, 1);
    }
    return n;
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
        if (da != db && da != 1 && db != 1)
            return false;
        r->dim[i] = da == 1 ? db : da;
    }
    return true;
}

/* id broadcast to dims of target (its own dtype kept). */
static int bcast_to(lua_State *L, int id, const Shape *target)
{
    Shape s = tshape(L, id);
    bool same = s.rank == target->rank;
    for (int i = 0; same && i < s.rank; i++)
        same = s.dim[i] == target->dim[i];
    if (same)
        return id;
    OpAttr a = {.rank = target->rank};
    memcpy(a.shape, target->dim, sizeof a.shape);
    return emit(L, OP_BROADCAST, &id, 1, &a);
}

static int l_unary(lua_State *L)
{
    Opcode code = (Opcode)lua_tointeger(L, lua_upvalueindex(1));
    int x = check_tensor(L, 1, ir_opinfo[code].name);
    push_tensor(L, emit(L, code, &x, 1, NULL));
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
        a = scalar_const(L, ia, tshape(L, b).dtype, fn);
    if (!tb)
        b = scalar_const(L, ib, tshape(L, a).dtype, fn);
    Shape sa = tshape(L, a), sb = tshape(L, b), r;
    if (sa.dtype != sb.dtype)
        fe_error(L, "%s: operand dtypes differ (expected %s, got %s and %s)", fn,
                 dtype_name(sa.dtype), SSTR(&sa), SSTR(&sb));
    if (!bcast_shape(&sa, &sb, &r))
        fe_error(L, "%s: shapes do not broadcast (expected equal or 1 in each dimension, "
                    "got %s and %s)", fn, SSTR(&sa), SSTR(&sb));
    int in[2] = {bcast_to(L, a, &r), bcast_to(L, b, &r)};
    push_tensor(L, emit(L, code, in, 2, NULL));
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
    int m = check_tensor(L, 1, "select");
    Shape sm = tshape(L, m);
    if (sm.dtype != DT_U8)
        fe_error(L, "select: the mask must be u8, from a comparison such as a:lt(b) (expected "
                    "u8, got %s)", SSTR(&sm));
    bool ta = is_tensor(L, 2), tb = is_tensor(L, 3);
    DType dt = ta ? tshape(L, ((TRef *)lua_touserdata(L, 2))->id).dtype
               : tb ? tshape(L, ((TRef *)lua_touserdata(L, 3))->id).dtype
                    : DT_F32;
    int a = ta ? ((TRef *)lua_touserdata(L, 2))->id : scalar_const(L, 2, dt, "select");
    int b = tb ? ((TRef *)lua_touserdata(L, 3))->id : scalar_const(L, 3, dt, "select");
    Shape sa = tshape(L, a), sb = tshape(L, b), r1, r;
    if (sa.dtype != sb.dtype)
        fe_error(L, "select: value dtypes differ (expected %s, got %s and %s)",
                 dtype_name(sa.dtype), SSTR(&sa), SSTR(&sb));
    if (!bcast_shape(&sa, &sb, &r1) || !bcast_shape(&r1, &sm, &r))
        fe_error(L, "select: shapes do not broadcast (got mask %s, values %s and %s)", SSTR(&sm),
                 SSTR(&sa), SSTR(&sb));
    int in[3] = {bcast_to(L, m, &r), bcast_to(L, a, &r), bcast_to(L, b, &r)};
    push_tensor(L, emit(L, OP_SELECT, in, 3, NULL));
    return 1;
}

static int l_cast(lua_State *L)
{
    int x = check_tensor(L, 1, "cast");
    if (lua_isnoneornil(L, 2))
        fe_error(L, "cast: needs a dtype (expected f32, bf16, f16, i32, i64 or u8, got nil)");
    DType dt = (DType)parse_dtype(L, 2, DT_F32, "cast");
    if (tshape(L, x).dtype == dt) {
        lua_settop(L, 1);
        return 1;
    }
    OpAttr a = {.dtype = dt};
    push_tensor(L, emit(L, OP_CAST, &x, 1, &a));
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
    int a = check_tensor(L, 1, "matmul"), b = check_tensor(L, 2, "matmul");
    if (!lua_isnoneornil(L, 3) && !lua_istable(L, 3))
        fe_error(L, "matmul: options must be a table such as {ta=true, tb=false} (got %s)",
                 luaL_typename(L, 3));
    bool ta = opt_flag(L, 3, "ta"), tb = opt_flag(L, 3, "tb");
    Shape sa = tshape(L, a), sb = tshape(L, b);
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
    push_tensor(L, emit(L, OP_MATMUL, in, 2, &at));
    return 1;
}

static int do_reshape(lua_State *L, int x, int rank, const int64_t *dim)
{
    OpAttr a = {.rank = rank};
    memcpy(a.shape, dim, sizeof(int64_t) * (size_t)rank);
    return emit(L, OP_RESHAPE, &x, 1, &a);
}

/* reshape(x, shape): one dimension may be -1 (inferred). */
static int l_reshape(lua_State *L)
{
    int x = check_tensor(L, 1, "reshape");
    Shape s = tshape(L, x);
    if (!lua_istable(L, 2))
        fe_error(L, "reshape: shape must be a table of positive integers (got %s)",
                 luaL_typename(L, 2));
    int n = (int)lua_rawlen(L, 2), infer = -1;
    int64_t dim[IR_MAX_RANK], known = 1;
    if (n > IR_MAX_RANK)
        fe_error(L, "reshape: too many dimensions (expected at most %d, got %d)", IR_MAX_RANK, n);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        int isnum;
        lua_Integer v = lua_tointegerx(L, -1, &isnum);
        if (isnum && v == -1 && infer < 0) {
            infer = i;
            dim[i] = 1;
        } else if (!isnum || v < 1) {
            fe_error(L, "reshape: dimension %d must be a positive integer or one -1 (got %s)", i,
                     luaL_tolstring(L, -1, NULL));
        } else {
            dim[i] = v;
            known *= v;
        }
        lua_pop(L, 1);
    }
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
    push_tensor(L, do_reshape(L, x, n, dim));
    return 1;
}

static int permute_to(lua_State *L, int x, const int *perm)
{
    Shape s = tshape(L, x);
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
    int x = check_tensor(L, 1, "permute");
    Shape s = tshape(L, x);
    if (!lua_istable(L, 2))
        fe_error(L, "permute: needs a table of axes (got %s)", luaL_typename(L, 2));
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
    push_tensor(L, permute_to(L, x, perm));
    return 1;
}

static int l_transpose(lua_State *L)
{
    int x = check_tensor(L, 1, "transpose");
    Shape s = tshape(L, x);
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
    push_tensor(L, permute_to(L, x, perm));
    return 1;
}

/* slice(x, axis, start, stop): [start, stop) along axis; negatives count
 * from the end; stop defaults to the dimension's size. */
static int l_slice(lua_State *L)
{
    int x = check_tensor(L, 1, "slice");
    Shape s = tshape(L, x);
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
    push_tensor(L, emit(L, OP_SLICE, &x, 1, &a));
    return 1;
}

static int l_concat(lua_State *L)
{
    if (!lua_istable(L, 1))
        fe_error(L, "concat: needs a table of tensors (got %s)", luaL_typename(L, 1));
    int n = (int)lua_rawlen(L, 1);
    if (n < 1)
        fe_error(L, "concat: needs at least one tensor (got an empty table)");
    int *in = lua_newuserdatauv(L, sizeof(int) * (size_t)n, 0); /* freed by the GC */
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        in[i] = check_tensor(L, lua_gettop(L), "concat");
        lua_pop(L, 1);
    }
    Shape s = tshape(L, in[0]);
    int ax = norm_axis(L, lua_isnoneornil(L, 2) ? 0 : check_int(L, 2, "concat", "axis"), &s,
                       "concat");
    if (n == 1) {
        push_tensor(L, in[0]);
        return 1;
    }
    OpAttr a = {.nia = 1, .ia = {ax}};
    push_tensor(L, emit(L, OP_CONCAT, in, n, &a));
    return 1;
}

enum { RED_SUM, RED_MAX, RED_MIN, RED_MEAN };

/* sum/max/min/mean(x, axes, keepdims): axes nil (all), a number or a table. */
static int l_reduce(lua_State *L)
{
    static const char *names[] = {"sum", "max", "min", "mean"};
    int kind = (int)lua_tointeger(L, lua_upvalueindex(1));
    const char *fn = names[kind];
    int x = check_tensor(L, 1, fn);
    Shape s = tshape(L, x);
    bool keep = lua_toboolean(L, 3);
    bool red[IR_MAX_RANK] = {0};
    if (lua_isnoneornil(L, 2)) {
        for (int i = 0; i < s.rank; i++)
            red[i] = true;
    } else if (lua_istable(L, 2)) {
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
    if (kind == RED_MEAN && !dtype_is_float(s.dtype))
        fe_error(L, "mean: needs a float tensor (expected f32/bf16/f16, got %s)", SSTR(&s));
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
        r = emit(L, kind == RED_SUM || kind == RED_MEAN ? OP_REDUCE_SUM : OP_REDUCE_MAX, &r, 1,
                 &a);
        if (kind == RED_MIN)
            r = emit(L, OP_NEG, &r, 1, NULL);
        if (kind == RED_MEAN) {
            OpAttr c = {.f = 1.0 / (double)count, .dtype = s.dtype};
            int k = emit(L, OP_CONST, NULL, 0, &c);
            Shape rs = tshape(L, r);
            int in[2] = {r, bcast_to(L, k, &rs)};
            r = emit(L, OP_MUL, in, 2, NULL);
        }
        if (!keep)
            r = do_reshape(L, r, krank, kdim);
    }
    push_tensor(L, r);
    return 1;
}

static int l_iota(lua_State *L)
{
    OpAttr a = {0};
    a.rank = parse_shape(L, 1, a.shape, "iota");
    Shape s = shape_make(DT_I32, a.rank, a.shape);
    a.nia = 1;
    a.ia[0] = norm_axis(L, lua_isnoneornil(L, 2) ? 0 : check_int(L, 2, "iota", "axis"), &s,
                        "iota");
    a.dtype = (DType)parse_dtype(L, 3, DT_I32, "iota");
    push_tensor(L, emit(L, OP_IOTA, NULL, 0, &a));
    return 1;
}

static int l_const(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TNUMBER)
        fe_error(L, "const: value must be a number (got %s)", luaL_typename(L, 1));
    OpAttr a = {.f = lua_tonumber(L, 1)};
    if (!lua_isnoneornil(L, 2))
        a.rank = parse_shape(L, 2, a.shape, "const");
    a.dtype = (DType)parse_dtype(L, 3, DT_F32, "const");
    push_tensor(L, emit(L, OP_CONST, NULL, 0, &a));
    return 1;
}

static int l_random(lua_State *L)
{
    OpAttr a = {.nia = 1};
    a.rank = parse_shape(L, 1, a.shape, "random");
    a.ia[0] = ++getfe(L)->next_key;
    push_tensor(L, emit(L, OP_RANDOM, NULL, 0, &a));
    return 1;
}

static int l_gather(lua_State *L)
{
    int t = check_tensor(L, 1, "gather"), i = check_tensor(L, 2, "gather");
    Shape st = tshape(L, t), si = tshape(L, i);
    if (si.dtype != DT_I32 && si.dtype != DT_I64)
        fe_error(L, "gather: indices must be integers (expected i32 or i64, got %s; table %s)",
                 SSTR(&si), SSTR(&st));
    int in[2] = {t, i};
    push_tensor(L, emit(L, OP_GATHER, in, 2, NULL));
    return 1;
}

static int l_broadcast_to(lua_State *L)
{
    int x = check_tensor(L, 1, "broadcast_to");
    Shape s = tshape(L, x), r = s, chk;
    r.rank = parse_shape(L, 2, r.dim, "broadcast_to");
    if (!bcast_shape(&s, &r, &chk) || chk.rank != r.rank ||
        memcmp(chk.dim, r.dim, sizeof(int64_t) * (size_t)r.rank) != 0)
        fe_error(L, "broadcast_to: cannot broadcast %s to %s", SSTR(&s), SSTR(&r));
    push_tensor(L, bcast_to(L, x, &r));
    return 1;
}

/* ---- graph inputs, params, outputs -------------------------------------- */

static void check_name(lua_State *L, int idx, const char *fn)
{
    if (lua_type(L, idx) != LUA_TSTRING || !lua_rawlen(L, idx))
        fe_error(L, "%s: needs a name string first (got %s)", fn, luaL_typename(L, idx));
    const char *name = lua_tostring(L, idx);
    if (strcmp(name, "lr") == 0 || strncmp(name, "adam.", 5) == 0 || strncmp(name, "grad.", 5) == 0)
        fe_error(L, "%s: the name '%s' is reserved for the optimizer (expected another name)", fn,
                 name);
    if (ir_find_tensor(getfe(L)->g, name) >= 0)
        fe_error(L, "%s: the name '%s' is already used by another input or param", fn,
                 lua_tostring(L, idx));
}

static int l_input(lua_State *L)
{
    check_name(L, 1, "input");
    int64_t dim[IR_MAX_RANK];
    int rank = parse_shape(L, 2, dim, "input");
    DType dt = (DType)parse_dtype(L, 3, DT_F32, "input");
    ParamInit none = {0};
    push_tensor(L, ir_add_input(getfe(L)->g, TK_INPUT, lua_tostring(L, 1),
                                shape_make(dt, rank, dim), none));
    return 1;
}

static int l_param(lua_State *L)
{
    check_name(L, 1, "param");
    int64_t dim[IR_MAX_RANK];
    int rank = parse_shape(L, 2, dim, "param");
    if (!luaL_testudata(L, 3, INIT_MT))
        fe_error(L, "param '%s': init must be zeros(), ones(), normal(std) or uniform(a, b) "
                    "(got %s)", lua_tostring(L, 1), luaL_typename(L, 3));
    ParamInit init = *(ParamInit *)lua_touserdata(L, 3);
    DType dt = (DType)parse_dtype(L, 4, DT_F32, "param");
    if (!dtype_is_float(dt))
        fe_error(L, "param '%s': params must be float (expected f32, bf16 or f16, got %s)",
                 lua_tostring(L, 1), dtype_name(dt));
    push_tensor(L, ir_add_input(getfe(L)->g, TK_PARAM, lua_tostring(L, 1),
                                shape_make(dt, rank, dim), init));
    return 1;
}

static double check_num(lua_State *L, int idx, const char *fn, const char *what)
{
    if (lua_type(L, idx) != LUA_TNUMBER)
        fe_error(L, "%s: %s must be a number (got %s)", fn, what, luaL_typename(L, idx));
    return lua_tonumber(L, idx);
}

static int l_init(lua_State *L)
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

static int l_sym(lua_State *L)
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
        if (!isnum || v < 1)
            fe_error(L, "sym: %s must be a positive integer (got %s)", lua_tostring(L, -2),
                     luaL_tolstring(L, -1, NULL));
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
    for (int i = 0; i < n; i++) {
        lua_getfield(L, 1, names[i]);
        ir_add_sym(getfe(L)->g, names[i], lua_tointeger(L, -1));
        lua_pop(L, 1);
    }
    return 0;
}

static int l_minimize(lua_State *L)
{
    Fe *fe = getfe(L);
    int t = check_tensor(L, 1, "minimize");
    Shape s = tshape(L, t);
    if (s.rank != 0 || !dtype_is_float(s.dtype))
        fe_error(L, "minimize: the loss must be a float scalar (expected f32[], got %s); reduce "
                    "it with mean() or sum()", SSTR(&s));
    if (fe->loss >= 0)
        fe_error(L, "minimize: called twice (the loss was already set at line %d)", fe->loss_line);
    fe->loss = t;
    fe->loss_line = user_loc(L).line;
    ir_add_output(fe->g, "loss", t);
    return 0;
}

static int l_output(lua_State *L)
{
    Fe *fe = getfe(L);
    if (lua_type(L, 1) != LUA_TSTRING)
        fe_error(L, "output: needs a name string first (got %s)", luaL_typename(L, 1));
    const char *name = lua_tostring(L, 1);
    int t = check_tensor(L, 2, "output");
    if (strcmp(name, "loss") == 0)
        fe_error(L, "output: the name 'loss' is reserved for minimize(loss)");
    if (ir_find_output(fe->g, name) >= 0)
        fe_error(L, "output: the name '%s' is already used by another output", name);
    ir_add_output(fe->g, name, t);
    return 0;
}

/* ---- config{} and train{} ------------------------------------------------ */

static const char *set_value(const char *set, char *key, size_t keylen)
{
    const char *eq = strchr(set, '=');
    size_t n = eq ? (size_t)(eq - set) : strlen(set);
    if (n >= keylen)
        n = keylen - 1;
    memcpy(key, set, n);
    key[n] = 0;
    return eq ? eq + 1 : NULL;
}

static const char *config_key_list(lua_State *L, int idx, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) == LUA_TSTRING && k < n)
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", lua_tostring(L, -2));
        lua_pop(L, 1);
    }
    return buf;
}

/* Applies --set number i to the config table at index 1. */
static void apply_set(lua_State *L, Fe *fe, int i)
{
    char key[256];
    const char *val = set_value(fe->sets[i], key, sizeof key);
    lua_getfield(L, 1, key);
    int t = lua_type(L, -1);
    bool isint = lua_isinteger(L, -1);
    lua_pop(L, 1);
    if (t == LUA_TNIL) {
        if (fe_train_key(key))
            return;
        char list[1024];
        set_error(L, key, "unknown key (expected a config key of %s: %s; or a train key: %s)",
                  fe->path, config_key_list(L, 1, list, sizeof list), fe_train_key_list());
    }
    if (t == LUA_TNUMBER) {
        if (!lua_stringtonumber(L, val))
            set_error(L, key, "expected a number (the default is a number), got '%s'", val);
        if (isint && !lua_isinteger(L, -1)) {
            lua_Number d = lua_tonumber(L, -1);
            if (d != floor(d))
                set_error(L, key, "expected an integer (the default is an integer), got '%s'", val);
            lua_pop(L, 1);
            lua_pushinteger(L, (lua_Integer)d);
        }
    } else if (t == LUA_TBOOLEAN) {
        if (strcmp(val, "true") == 0)
            lua_pushboolean(L, 1);
        else if (strcmp(val, "false") == 0)
            lua_pushboolean(L, 0);
        else
            set_error(L, key, "expected true or false (the default is a boolean), got '%s'", val);
    } else if (t == LUA_TSTRING) {
        lua_pushstring(L, val);
    } else {
        set_error(L, key, "the config value is a %s, which --set cannot change (expected a "
                          "number, string or boolean default)", lua_typename(L, t));
    }
    lua_setfield(L, 1, key);
    fe->set_used[i] = true;
}

static bool set_is_key(const char *set, const char *key)
{
    size_t n = strlen(key);
    return strncmp(set, key, n) == 0 && set[n] == '=';
}

/* config(defaults [, presets]): defaults with --set applied. presets maps a
 * selector key to {value = {key = default, ...}}: the selector's final value
 * picks a table merged into the defaults before the other --set keys apply
 * (a selector value with no entry keeps the defaults). */
static int l_config(lua_State *L)
{
    Fe *fe = getfe(L);
    if (!lua_istable(L, 1))
        fe_error(L, "config: needs a table of defaults such as config{L=2, C=64} (got %s)",
                 luaL_typename(L, 1));
    if (!lua_isnoneornil(L, 2) && !lua_istable(L, 2))
        fe_error(L, "config: presets must be a table such as {size = {big = {L=12}}} (got %s)",
                 luaL_typename(L, 2));
    lua_settop(L, 2);
    if (fe->config_ref != LUA_NOREF)
        fe_error(L, "config: called twice (expected one config{} per script)");
    if (lua_istable(L, 2)) {
        lua_pushnil(L);
        while (lua_next(L, 2)) { /* selector key at -2, {value = preset} at -1 */
            const char *sel = lua_tostring(L, -2);
            if (lua_type(L, -2) != LUA_TSTRING || !lua_istable(L, -1))
                fe_error(L, "config: presets must map a key name to a table of presets");
            lua_getfield(L, 1, sel);
            if (lua_type(L, -1) != LUA_TSTRING)
                fe_error(L, "config: preset selector '%s' needs a string default (got %s)", sel,
                         luaL_typename(L, -1));
            lua_pop(L, 1);
            for (int i = 0; i < fe->nsets; i++)
                if (set_is_key(fe->sets[i], sel))
                    apply_set(L, fe, i);
            lua_getfield(L, 1, sel);
            const char *choice = lua_tostring(L, -1);
            lua_getfield(L, -2, choice); /* the preset table */
            if (lua_istable(L, -1)) {
                int p = lua_gettop(L);
                lua_pushnil(L);
                while (lua_next(L, p)) {
                    lua_pushvalue(L, -2);
                    lua_insert(L, -2);
                    lua_settable(L, 1);
                }
            } else if (fe->nsets && strcmp(choice, "") != 0) {
                /* a value with no preset is an error only when --set chose it */
                for (int i = 0; i < fe->nsets; i++)
                    if (set_is_key(fe->sets[i], sel)) {
                        char list[512];
                        config_key_list(L, -3, list, sizeof list);
                        set_error(L, sel, "unknown preset '%s' (expected the default or one of: %s)",
                                  choice, list);
                    }
            }
            lua_pop(L, 3);
        }
    }
    for (int i = 0; i < fe->nsets; i++)
        if (!fe->set_used[i])
            apply_set(L, fe, i);
    lua_pushvalue(L, 1);
    fe->config_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_settop(L, 1);
    return 1;
}

static int l_train(lua_State *L)
{
    Fe *fe = getfe(L);
    if (!lua_istable(L, 1))
        fe_error(L, "train: needs a table such as train{steps=1000, lr=3e-4} (got %s)",
                 luaL_typename(L, 1));
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            fe_error(L, "train: keys must be names (got %s)", luaL_typename(L, -2));
        const char *key = lua_tostring(L, -2);
        const FeTrainKey *k = fe_train_key(key);
        if (!k)
            fe_error(L, "train: unknown key '%s' (expected one of %s)", key, fe_train_key_list());
        char why[512];
        bool ok;
        int t = lua_type(L, -1);
        if (t == LUA_TNUMBER)
            ok = fe_train_store_num(&fe->m->train, k, lua_tonumber(L, -1), why, sizeof why);
        else if (t == LUA_TSTRING)
            ok = fe_train_store_text(fe->m, &fe->m->train, k, lua_tostring(L, -1), false, why,
                                  sizeof why);
        else if (t == LUA_TBOOLEAN && !lua_toboolean(L, -1) && k->type == FE_TT_STR)
            ok = true, *(const char **)((char *)&fe->m->train + k->off) = NULL;
        else
            ok = false, snprintf(why, sizeof why, "expected a %s, got %s",
                                 k->type == FE_TT_STR ? "string" : "number", luaL_typename(L, -1));
        if (!ok)
            fe_error(L, "train: bad value for '%s' (%s)", key, why);
        lua_pop(L, 1);
    }
    fe->train_line = user_loc(L).line;
    return 0;
}

/* ---- the tensor metatable ----------------------------------------------- */

static int l_index(lua_State *L)
{
    int x = ((TRef *)luaL_checkudata(L, 1, TENSOR_MT))->id;
    const char *k = lua_tostring(L, 2);
    Shape s = tshape(L, x);
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
    Shape s = tshape(L, x);
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

static void open_dsl(lua_State *L)
{
    static const struct {
        const char *name;
        Opcode code;
    } unary[] = {{"exp", OP_EXP},         {"log", OP_LOG},   {"sin", OP_SIN},
                 {"cos", OP_COS},         {"tanh", OP_TANH}, {"sqrt", OP_SQRT},
                 {"rsqrt", OP_RSQRT},     {"sigmoid", OP_SIGMOID}, {"relu", OP_RELU},
                 {"abs", OP_ABS},         {"neg", OP_NEG}},
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
    static const char *rnames[] = {"sum", "max", "min", "mean"};
    for (int i = 0; i < 4; i++)
        reg(L, methods, rnames[i], l_reduce, i, true);
    reg(L, methods, "cast", l_cast, -1, true);
    reg(L, methods, "matmul", l_matmul, -1, true);
    reg(L, methods, "reshape", l_reshape, -1, true);
    reg(L, methods, "permute", l_permute, -1, true);
    reg(L, methods, "transpose", l_transpose, -1, true);
    reg(L, methods, "slice", l_slice, -1, true);
    reg(L, methods, "broadcast_to", l_broadcast_to, -1, true);
    reg(L, methods, "gather", l_gather, -1, true);
    reg(L, methods, "embedding", l_gather, -1, false);
    reg(L, methods, "concat", l_concat, -1, false);
    reg(L, methods, "iota", l_iota, -1, false);
    reg(L, methods, "const", l_const, -1, false);
    reg(L, methods, "random", l_random, -1, false);
    reg(L, methods, "input", l_input, -1, false);
    reg(L, methods, "param", l_param, -1, false);
    reg(L, methods, "zeros", l_init, INIT_ZEROS, false);
    reg(L, methods, "ones", l_init, INIT_ONES, false);
    reg(L, methods, "normal", l_init, INIT_NORMAL, false);
    reg(L, methods, "uniform", l_init, INIT_UNIFORM, false);
    reg(L, methods, "sym", l_sym, -1, false);
    reg(L, methods, "minimize", l_minimize, -1, false);
    reg(L, methods, "output", l_output, -1, false);
    reg(L, methods, "config", l_config, -1, false);
    reg(L, methods, "train", l_train, -1, false);
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
    lua_pushcfunction(L, l_no_compare);
    lua_setfield(L, -2, "__lt");
    lua_pushcfunction(L, l_no_compare);
    lua_setfield(L, -2, "__le");
    lua_pop(L, 1);

    luaL_newmetatable(L, INIT_MT);
    lua_pushcfunction(L, l_init_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 2);
}

/* ---- loading a model ------------------------------------------------------ */

static char *value_text(lua_State *L, int idx)
{
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
    case LUA_TSTRING:
        return xstrdup(lua_tostring(L, idx));
    case LUA_TBOOLEAN:
        return xstrdup(lua_toboolean(L, idx) ? "true" : "false");
    default:
        return NULL;
    }
}

static int cmp_item(const void *a, const void *b)
{
    return strcmp(((const FeConfigItem *)a)->key, ((const FeConfigItem *)b)->key);
}

/* Copies the config table's final scalar values into m (sorted by key). */
static void collect_config(lua_State *L, Fe *fe)
{
    if (fe->config_ref == LUA_NOREF)
        return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, fe->config_ref);
    int t = lua_gettop(L);
    int cap = 16;
    fe->m->config = xmalloc(sizeof(FeConfigItem) * (size_t)cap);
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if (lua_type(L, -2) == LUA_TSTRING) {
            char *v = value_text(L, -1);
            if (v) {
                if (fe->m->nconfig == cap)
                    fe->m->config = xrealloc(fe->m->config, sizeof(FeConfigItem) * (size_t)(cap *= 2));
                fe->m->config[fe->m->nconfig++] =
                    (FeConfigItem){xstrdup(lua_tostring(L, -2)), v};
            }
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    qsort(fe->m->config, (size_t)fe->m->nconfig, sizeof(FeConfigItem), cmp_item);
}

/* Checks after the script ran; returns false with err set. */
static bool finish(lua_State *L, Fe *fe, char *err, size_t errlen)
{
    Model *m = fe->m;
    for (int i = 0; i < fe->nsets; i++) {
        if (fe->set_used[i])
            continue;
        char key[256], why[512];
        const char *val = set_value(fe->sets[i], key, sizeof key);
        const FeTrainKey *k = fe_train_key(key);
        if (!k) {
            snprintf(err, errlen, "--set %s: unknown key (%s has no config{} key '%s'; expected "
                     "a config key or a train key: %s)", key, fe->path, key, fe_train_key_list());
            return false;
        }
        if (!fe_train_store_text(m, &m->train, k, val, true, why, sizeof why)) {
            snprintf(err, errlen, "--set %s: %s", key, why);
            return false;
        }
    }
    if (fe->loss < 0) {
        snprintf(err, errlen, "%s: the script never calls minimize(loss) (expected a scalar loss)",
                 fe->path);
        return false;
    }
    Graph *g = fe->g;
    if (m->train.batch > 0)
        for (int i = 0; i < g->t.n; i++) {
            const Tensor *t = &g->t.v[i];
            if (t->kind != TK_INPUT || t->s.rank == 0 || t->s.dim[0] == m->train.batch)
                continue;
            char b[160];
            snprintf(err, errlen, "%s:%d: train: batch = %lld but input '%s' is %s (expected "
                     "leading dimension %lld, got %lld)", fe->path, fe->train_line,
                     (long long)m->train.batch, t->name, shape_str(g, &t->s, b, sizeof b),
                     (long long)m->train.batch, (long long)t->s.dim[0]);
            return false;
        }
    collect_config(L, fe);
    ir_compact(g);
    char verr[1024];
    if (!ir_verify(g, verr, sizeof verr))
        die("frontend built an invalid graph for %s: %s", fe->path, verr);
    return true;
}

/* Runs the script once, with nn.training = training. */
static Model *load_once(const char *path, const char *const *sets, int nsets, bool training,
                        char *err, size_t errlen)
{
    Model *m = xcalloc(1, sizeof *m);
    m->path = intern(path);
    m->g = ir_new();
    fe_train_defaults(&m->train);
    Fe fe = {.g = m->g, .m = m, .path = m->path, .sets = sets, .nsets = nsets,
             .config_ref = LUA_NOREF, .loss = -1};
    snprintf(fe.chunk, sizeof fe.chunk, "@%s", path);
    fe.set_used = xcalloc((size_t)(nsets ? nsets : 1), sizeof(bool));

    lua_State *L = luaL_newstate();
    if (!L)
        die("cannot create a Lua state");
    *(Fe **)lua_getextraspace(L) = &fe;
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
    lua_settop(L, 0);
    open_dsl(L);
    lua_pushcfunction(L, msgh);
    int h = lua_gettop(L);

    bool ok = true;
    for (const struct fe_embedded *e = fe_embedded_lua; ok && e->name; e++) {
        char chunk[128];
        snprintf(chunk, sizeof chunk, "=%s.lua", e->name);
        if (luaL_loadbufferx(L, e->src, e->len, chunk, "t") != LUA_OK ||
            lua_pcall(L, 0, 1, h) != LUA_OK)
            die("embedded %s.lua: %s", e->name, lua_tostring(L, -1));
        if (!lua_isnil(L, -1))
            lua_setglobal(L, e->name);
        else
            lua_pop(L, 1);
    }
    if (lua_getglobal(L, "nn") == LUA_TTABLE) {
        lua_pushboolean(L, training);
        lua_setfield(L, -2, "training");
    }
    lua_pop(L, 1);
    int st = luaL_loadfilex(L, path, "t");
    if (st == LUA_OK)
        st = lua_pcall(L, 0, 0, h);
    if (st != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        snprintf(err, errlen, "%s", msg ? msg : "unknown error");
        ok = false;
    }
    if (ok)
        ok = finish(L, &fe, err, errlen);
    lua_close(L);
    free(fe.set_used);
    if (!ok) {
        fe_model_free(m);
        return NULL;
    }
    return m;
}

static bool has_random(const Graph *g)
{
    for (int i = 0; i < g->ops.n; i++)
        if (g->ops.v[i].code == OP_RANDOM)
            return true;
    return false;
}

static bool interface_tensor(const Tensor *x) { return x->op < 0 && x->kind != TK_CONST; }

/* The evaluation graph must declare the training graph's params, inputs and
 * state, in the same order, with the same shapes (it reads the same
 * buffers): a script whose structure depends on nn.training otherwise is
 * an error. */
static bool same_interface(const Graph *a, const Graph *b, const char *path, char *err,
                           size_t errlen)
{
    int ta = 0, tb = 0;
    for (;; ta++, tb++) {
        while (ta < a->t.n && !interface_tensor(&a->t.v[ta]))
            ta++;
        while (tb < b->t.n && !interface_tensor(&b->t.v[tb]))
            tb++;
        if (ta == a->t.n || tb == b->t.n)
            break;
        const Tensor *x = &a->t.v[ta], *y = &b->t.v[tb];
        const char *xn = x->name ? x->name : "", *yn = y->name ? y->name : "";
        if (x->kind != y->kind || strcmp(xn, yn) != 0 || !shape_eq(&x->s, &y->s)) {
            snprintf(err, errlen,
                     "%s: the evaluation graph (nn.training = false) declares '%s' where the "
                     "training graph declares '%s' (expected the same params, inputs and "
                     "state in the same order)",
                     path, yn, xn);
            return false;
        }
    }
    if (ta != a->t.n || tb != b->t.n) {
        snprintf(err, errlen,
                 "%s: the evaluation graph (nn.training = false) declares %s params, inputs "
                 "and state than the training graph (expected the same)",
                 path, ta == a->t.n ? "more" : "fewer");
        return false;
    }
    return true;
}

Model *fe_load_model(const char *path, const char *const *sets, int nsets, char *err,
                     size_t errlen)
{
    for (int i = 0; i < nsets; i++) {
        char key[256];
        if (!set_value(sets[i], key, sizeof key) || !key[0]) {
            snprintf(err, errlen, "--set %s: expected key=value (got '%s')", key, sets[i]);
            return NULL;
        }
    }
    Model *m = load_once(path, sets, nsets, true, err, errlen);
    if (!m || !has_random(m->g))
        return m;
    /* random numbers (dropout): build the evaluation graph without them */
    Model *e = load_once(path, sets, nsets, false, err, errlen);
    if (!e || !same_interface(m->g, e->g, path, err, errlen)) {
        fe_model_free(e);
        fe_model_free(m);
        return NULL;
    }
    m->eval_g = e->g;
    e->g = NULL;
    fe_model_free(e);
    return m;
}
