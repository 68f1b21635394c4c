/* config.c - config{}, --set and train{}: config{} returns the script's
 * config table with the --set values applied (a --set of a train key goes
 * to train{}; an unknown key, a value of the wrong type or a preset that
 * does not exist is an error that names the --set), train{} stores its
 * keys into the model's TrainConfig through settings.c's key table and
 * records frozen params, param groups and early stopping, which
 * fe_resolve_groups matches against the graph's params after the script
 * ran. frontend.c registers config and train as DSL globals and loads the
 * model; this file keeps no state of its own (all of it is in Fe). */
#include "fe_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

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

const char *fe_set_value(const char *set, char *key, size_t keylen)
{
    const char *eq = strchr(set, '=');
    size_t n = eq ? (size_t)(eq - set) : strlen(set);
    if (n >= keylen)
        n = keylen - 1;
    memcpy(key, set, n);
    key[n] = 0;
    return eq ? eq + 1 : NULL;
}

/* The string keys of the table at idx, sorted (Lua's traversal order changes
 * from run to run), joined with ", " into buf. */
static const char *config_key_list(lua_State *L, int idx, char *buf, size_t n)
{
    VEC(const char *) keys = {0};
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) == LUA_TSTRING)
            vec_push(&keys, lua_tostring(L, -2)); /* the table keeps the strings alive */
        lua_pop(L, 1);
    }
    if (keys.n)
        qsort(keys.v, (size_t)keys.n, sizeof *keys.v, fe_cmp_str);
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < keys.n && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", keys.v[i]);
    vec_free(&keys);
    return buf;
}

/* Applies --set number i to the config table at index 1. */
static void apply_set(lua_State *L, Fe *fe, int i)
{
    char key[256];
    const char *val = fe_set_value(fe->sets[i], key, sizeof key);
    lua_getfield(L, 1, key);
    int t = lua_type(L, -1);
    bool isint = lua_isinteger(L, -1);
    lua_pop(L, 1);
    if (t == LUA_TNIL) {
        if (fe_train_key(key))
            return;
        if (strcmp(key, "param_groups") == 0 || strcmp(key, "frozen") == 0)
            set_error(L, key, "a table, set in the script's train{} only (expected a key with "
                      "one value, got %s)", key);
        if (strcmp(key, "early_stop") == 0)
            set_error(L, key, "a table: --set its fields as early_stop_metric, "
                      "early_stop_patience, early_stop_min_delta, early_stop_mode");
        char list[1024], all[2048], near[64], mean[96] = "";
        config_key_list(L, 1, list, sizeof list);
        snprintf(all, sizeof all, "%s, %s", list, fe_train_key_list());
        if (fe_closest_key(key, all, near, sizeof near))
            snprintf(mean, sizeof mean, "did you mean '%s'? ", near);
        set_error(L, key, "unknown key (%sexpected a config key of %s: %s; or a train key: %s)",
                  mean, fe->path, list, fe_train_key_list());
    }
    if (t == LUA_TNUMBER) {
        if (!lua_stringtonumber(L, val))
            set_error(L, key, "expected a number (the default is a number), got '%s'", val);
        if (!lua_isinteger(L, -1) && !isfinite(lua_tonumber(L, -1)))
            set_error(L, key, "expected a finite number, got '%s'", val);
        if (isint && !lua_isinteger(L, -1)) {
            lua_Number d = lua_tonumber(L, -1);
            /* -2^63 <= d < 2^63: d fits a Lua integer (no wrap-around) */
            if (d != floor(d) || !(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
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

/* A table key for a message: "'name'", "the number key [1]", "a table key".
 * Does not change the key (lua_next reads it). */
static const char *config_key_str(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    int t = lua_type(L, idx);
    if (t == LUA_TSTRING)
        return lua_pushfstring(L, "'%s'", lua_tostring(L, idx));
    if (t == LUA_TNUMBER || t == LUA_TBOOLEAN)
        return lua_pushfstring(L, "the %s key [%s]", lua_typename(L, t),
                               luaL_tolstring(L, idx, NULL));
    return lua_pushfstring(L, "a %s key", lua_typename(L, t));
}

/* config{}'s defaults (or the preset named preset): every key a name and
 * every value a number, string or boolean, the types --set can give. */
static void check_config_values(lua_State *L, int idx, const char *preset)
{
    idx = lua_absindex(L, idx);
    const char *in = preset ? lua_pushfstring(L, " in preset '%s'", preset) : "";
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            fe_error(L, "config: keys must be names such as config{L = 2} (got %s%s)",
                     config_key_str(L, -2), in);
        int t = lua_type(L, -1);
        if (t != LUA_TNUMBER && t != LUA_TSTRING && t != LUA_TBOOLEAN)
            fe_error(L, "config: '%s'%s must be a number, string or boolean (got a %s)",
                     lua_tostring(L, -2), in, luaL_typename(L, -1));
        lua_pop(L, 1);
    }
    if (preset)
        lua_pop(L, 1);
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
int fe_dsl_config(lua_State *L)
{
    Fe *fe = fe_get(L);
    if (!lua_istable(L, 1))
        fe_error(L, "config: needs a table of defaults such as config{L=2, C=64} (got %s)",
                 luaL_typename(L, 1));
    if (!lua_isnoneornil(L, 2) && !lua_istable(L, 2))
        fe_error(L, "config: presets must be a table such as {size = {big = {L=12}}} (got %s)",
                 luaL_typename(L, 2));
    lua_settop(L, 2);
    if (fe->config_ref != LUA_NOREF)
        fe_error(L, "config: called twice (expected one config{} per script)");
    check_config_values(L, 1, NULL);
    if (lua_istable(L, 2)) {
        lua_pushnil(L);
        while (lua_next(L, 2)) { /* selector key at -2, {value = preset} at -1 */
            if (lua_type(L, -2) != LUA_TSTRING || !lua_istable(L, -1))
                fe_error(L, "config: presets must map a key name to a table of presets such as "
                            "{size = {big = {L = 12}}} (got %s with a %s value)",
                         config_key_str(L, -2), luaL_typename(L, -1));
            const char *sel = lua_tostring(L, -2);
            lua_pushnil(L);
            while (lua_next(L, -2)) { /* preset name at -2, its table at -1 */
                if (lua_type(L, -2) != LUA_TSTRING || !lua_istable(L, -1))
                    fe_error(L, "config: the presets of '%s' must map a value to a table such as "
                                "{big = {L = 12}} (got %s with a %s value)", sel,
                             config_key_str(L, -2), luaL_typename(L, -1));
                check_config_values(L, -1, lua_tostring(L, -2));
                lua_pop(L, 1);
            }
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

/* string.find as the string library defines it (the registry's copy, not
 * the script's global), pushed. */
static void push_find(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_getfield(L, -1, LUA_STRLIBNAME);
    lua_getfield(L, -1, "find");
    lua_replace(L, -3);
    lua_pop(L, 1);
}

/* Whether Lua pattern pat matches somewhere in s; false with why set when
 * pat is malformed. */
static bool pattern_find(lua_State *L, const char *s, const char *pat, bool *hit, char *why,
                         size_t n)
{
    push_find(L);
    lua_pushstring(L, s);
    lua_pushstring(L, pat);
    if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
        snprintf(why, n, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "bad pattern");
        lua_pop(L, 1);
        return false;
    }
    *hit = !lua_isnil(L, -1);
    lua_pop(L, 1);
    return true;
}

/* train{frozen = {"PATTERN", ...}} at the top of the stack: checked (an
 * array of well-formed Lua patterns) and kept in the registry. */
static void train_frozen(lua_State *L, Fe *fe)
{
    if (!lua_istable(L, -1))
        fe_error(L, "train: frozen needs a list of Lua patterns such as {\"^wte$\", \"^h%%.0%%.\"} "
                    "(got %s)", luaL_typename(L, -1));
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1 || lua_tointeger(L, -2) > n)
            fe_error(L, "train: frozen must be a list (expected keys 1 to %lld, got %s)",
                     (long long)n, luaL_tolstring(L, -2, NULL));
        lua_pop(L, 1);
    }
    lua_newtable(L);
    for (lua_Integer i = 1; i <= n; i++) {
        char why[256];
        bool hit;
        if (lua_rawgeti(L, -2, i) != LUA_TSTRING)
            fe_error(L, "train: frozen[%lld]: expected a Lua pattern string, got %s",
                     (long long)i, luaL_typename(L, -1));
        if (!pattern_find(L, "", lua_tostring(L, -1), &hit, why, sizeof why))
            fe_error(L, "train: frozen[%lld]: bad Lua pattern '%s' (%s)", (long long)i,
                     lua_tostring(L, -1), why);
        lua_rawseti(L, -2, i);
    }
    if (fe->frozen_ref != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, fe->frozen_ref);
    fe->frozen_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    fe->frozen_line = fe_user_loc(L).line;
}

/* train{early_stop = {metric = M, patience = n, min_delta = d, mode = M}}
 * at the top of the stack (false: off): each field into its flat key
 * early_stop_FIELD (which --set also reaches); metric is required. */
static void train_early_stop(lua_State *L, Fe *fe)
{
    if (lua_isboolean(L, -1) && !lua_toboolean(L, -1)) {
        fe->m->train.early_stop_metric = NULL;
        return;
    }
    if (!lua_istable(L, -1))
        fe_error(L, "train: early_stop needs a table such as {metric = \"val_loss\", patience = "
                    "3, min_delta = 0.001} (got %s)", luaL_typename(L, -1));
    fe_check_opts(L, -1, "train: early_stop",
                  "metric:string patience:integer min_delta:number mode:string");
    lua_getfield(L, -1, "metric");
    bool has_metric = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (!has_metric)
        fe_error(L, "train: early_stop needs metric = \"val_loss\", \"accuracy\" or the name of "
                    "a scalar output (got none)");
    static const char *const fields[] = {"metric", "patience", "min_delta", "mode"};
    for (int i = 0; i < 4; i++) {
        if (lua_getfield(L, -1, fields[i]) == LUA_TNIL) {
            lua_pop(L, 1);
            continue;
        }
        char key[64], why[512];
        snprintf(key, sizeof key, "early_stop_%s", fields[i]);
        const FeTrainKey *k = fe_train_key(key);
        bool ok = lua_isinteger(L, -1)
                      ? fe_train_store_int(&fe->m->train, k, lua_tointeger(L, -1), why, sizeof why)
                  : lua_type(L, -1) == LUA_TNUMBER
                      ? fe_train_store_num(&fe->m->train, k, lua_tonumber(L, -1), why, sizeof why)
                      : fe_train_store_text(fe->m, &fe->m->train, k, lua_tostring(L, -1), false,
                                            why, sizeof why);
        if (!ok)
            fe_error(L, "train: early_stop: bad value for '%s' (%s)", fields[i], why);
        lua_pop(L, 1);
    }
}

/* train{param_groups = {{match = "PATTERN", lr_scale = x, weight_decay =
 * y}, ...}} at the top of the stack: checked and kept in the registry as a
 * list of {match, lr_scale, weight_decay (nil: the default)}. */
static void train_groups(lua_State *L, Fe *fe)
{
    if (!lua_istable(L, -1))
        fe_error(L, "train: param_groups needs a list of groups such as {{match = \"bias$\", "
                    "weight_decay = 0}} (got %s)", luaL_typename(L, -1));
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1 || lua_tointeger(L, -2) > n)
            fe_error(L, "train: param_groups must be a list (expected keys 1 to %lld, got %s)",
                     (long long)n, luaL_tolstring(L, -2, NULL));
        lua_pop(L, 1);
    }
    lua_newtable(L);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, -2, i) != LUA_TTABLE)
            fe_error(L, "train: param_groups[%lld]: expected a table such as {match = \"bias$\", "
                        "lr_scale = 0.1, weight_decay = 0}, got %s",
                     (long long)i, luaL_typename(L, -1));
        int grp = lua_gettop(L);
        lua_newtable(L);
        int out = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, grp)) {
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
            if (!k || (strcmp(k, "match") && strcmp(k, "lr_scale") && strcmp(k, "weight_decay")))
                fe_error(L, "train: param_groups[%lld]: unknown key '%s' (expected match, "
                            "lr_scale or weight_decay)",
                         (long long)i, k ? k : luaL_tolstring(L, -2, NULL));
            if (strcmp(k, "match") == 0) {
                char why[256];
                bool hit;
                if (lua_type(L, -1) != LUA_TSTRING)
                    fe_error(L, "train: param_groups[%lld].match: expected a Lua pattern string, "
                                "got %s", (long long)i, luaL_typename(L, -1));
                if (!pattern_find(L, "", lua_tostring(L, -1), &hit, why, sizeof why))
                    fe_error(L, "train: param_groups[%lld].match: bad Lua pattern '%s' (%s)",
                             (long long)i, lua_tostring(L, -1), why);
            } else {
                double v = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : NAN;
                if (!(isfinite(v) && v >= 0))
                    fe_error(L, "train: param_groups[%lld].%s: expected a finite number >= 0, "
                                "got %s", (long long)i, k, luaL_tolstring(L, -1, NULL));
            }
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, out);
        }
        if (lua_getfield(L, out, "match") != LUA_TSTRING)
            fe_error(L, "train: param_groups[%lld]: needs match = \"PATTERN\" (a Lua pattern "
                        "on param names), got none", (long long)i);
        lua_pop(L, 1);
        lua_rawseti(L, -3, i);
        lua_pop(L, 1);
    }
    if (fe->groups_ref != LUA_NOREF)
        luaL_unref(L, LUA_REGISTRYINDEX, fe->groups_ref);
    fe->groups_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    fe->groups_line = fe_user_loc(L).line;
}

/* The param names as "a, b, c" (at most n bytes), for messages. */
static void param_names(const Graph *g, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < g->t.n && k < n; i++)
        if (g->t.v[i].kind == TK_PARAM)
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", g->t.v[i].name);
    if (k >= n && n > 4)
        memcpy(buf + n - 4, "...", 4);
}

/* train{param_groups, frozen} matched to the params (first group that
 * matches wins; frozen when any frozen pattern matches): m->train's
 * param_opts. A pattern that matches no param is an error. */
static bool resolve_groups(lua_State *L, Fe *fe, char *err, size_t errlen)
{
    Graph *g = fe->g;
    Model *m = fe->m;
    int ng = 0, nf = 0;
    if (fe->groups_ref != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, fe->groups_ref);
        ng = (int)lua_rawlen(L, -1);
    } else
        lua_pushnil(L);
    if (fe->frozen_ref != LUA_NOREF) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, fe->frozen_ref);
        nf = (int)lua_rawlen(L, -1);
    } else
        lua_pushnil(L);
    int gt = lua_gettop(L) - 1, ft = gt + 1;
    if (ng + nf == 0) {
        lua_pop(L, 2);
        return true;
    }
    int *hits = xcalloc((size_t)(ng + nf + 1), sizeof(int));
    PassParamOpt *po = xcalloc((size_t)g->t.n + 1, sizeof *po);
    int npo = 0;
    bool ok = true;
    char why[256], bad[320] = "";
    for (int i = 0; ok && i < g->t.n; i++) {
        const Tensor *t = &g->t.v[i];
        if (t->kind != TK_PARAM)
            continue;
        PassParamOpt o = {t->name, 1.0, NAN, false};
        bool any = false, hit = false;
        for (int k = 0; ok && k < ng; k++) {
            lua_rawgeti(L, gt, k + 1);
            lua_getfield(L, -1, "match");
            ok = pattern_find(L, t->name, lua_tostring(L, -1), &hit, why, sizeof why);
            if (!ok)
                snprintf(bad, sizeof bad, "param_groups[%d].match: bad Lua pattern '%s'", k + 1,
                         lua_tostring(L, -1));
            lua_pop(L, 1);
            if (ok && hit) {
                hits[k]++;
                if (!any) {
                    any = true;
                    if (lua_getfield(L, -1, "lr_scale") == LUA_TNUMBER)
                        o.lr_scale = lua_tonumber(L, -1);
                    lua_pop(L, 1);
                    if (lua_getfield(L, -1, "weight_decay") == LUA_TNUMBER)
                        o.weight_decay = lua_tonumber(L, -1);
                    lua_pop(L, 1);
                }
            }
            lua_pop(L, 1);
        }
        for (int k = 0; ok && k < nf; k++) {
            lua_rawgeti(L, ft, k + 1);
            ok = pattern_find(L, t->name, lua_tostring(L, -1), &hit, why, sizeof why);
            if (!ok)
                snprintf(bad, sizeof bad, "frozen[%d]: bad Lua pattern '%s'", k + 1,
                         lua_tostring(L, -1));
            lua_pop(L, 1);
            if (ok && hit) {
                hits[ng + k]++;
                o.frozen = true;
            }
        }
        if (any || o.frozen)
            po[npo++] = o;
    }
    if (!ok)
        snprintf(err, errlen, "%s:%d: train: %s (%s)", fe->path,
                 bad[0] == 'f' ? fe->frozen_line : fe->groups_line, bad, why);
    for (int k = 0; ok && k < ng + nf; k++) {
        if (hits[k])
            continue;
        char names[400];
        param_names(g, names, sizeof names);
        if (k < ng) {
            lua_rawgeti(L, gt, k + 1);
            lua_getfield(L, -1, "match");
            snprintf(err, errlen, "%s:%d: train: param_groups[%d].match '%s' matches no param "
                     "(expected a Lua pattern matching one of: %s)", fe->path, fe->groups_line,
                     k + 1, lua_tostring(L, -1), names);
            lua_pop(L, 2);
        } else {
            lua_rawgeti(L, ft, k - ng + 1);
            snprintf(err, errlen, "%s:%d: train: frozen[%d] '%s' matches no param (expected a "
                     "Lua pattern matching one of: %s)", fe->path, fe->frozen_line, k - ng + 1,
                     lua_tostring(L, -1), names);
            lua_pop(L, 1);
        }
        ok = false;
    }
    lua_pop(L, 2);
    free(hits);
    if (!ok) {
        free(po);
        return false;
    }
    free(m->priv->param_opts);
    m->priv->param_opts = po;
    m->train.param_opts = po;
    m->train.nparam_opts = npo;
    return true;
}

int fe_resolve_groups(lua_State *L)
{
    Fe *fe = fe_get(L);
    char err[2048];
    if (!resolve_groups(L, fe, err, sizeof err)) {
        lua_pushstring(L, err);
        return lua_error(L);
    }
    return 0;
}

int fe_dsl_train(lua_State *L)
{
    Fe *fe = fe_get(L);
    if (!lua_istable(L, 1))
        fe_error(L, "train: needs a table such as train{steps=1000, lr=3e-4} (got %s)",
                 luaL_typename(L, 1));
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            fe_error(L, "train: keys must be names (got %s)", luaL_typename(L, -2));
        const char *key = lua_tostring(L, -2);
        if (strcmp(key, "param_groups") == 0 || strcmp(key, "frozen") == 0) {
            (key[0] == 'f' ? train_frozen : train_groups)(L, fe);
            lua_pop(L, 1);
            continue;
        }
        if (strcmp(key, "early_stop") == 0) {
            train_early_stop(L, fe);
            lua_pop(L, 1);
            continue;
        }
        const FeTrainKey *k = fe_train_key(key);
        char near[64];
        if (!k && fe_closest_key(key, fe_train_key_list(), near, sizeof near))
            fe_error(L, "train: unknown key '%s' (did you mean '%s'? expected one of %s)", key,
                     near, fe_train_key_list());
        if (!k)
            fe_error(L, "train: unknown key '%s' (expected one of %s)", key, fe_train_key_list());
        char why[512];
        bool ok;
        int t = lua_type(L, -1);
        if (lua_isinteger(L, -1))
            ok = fe_train_store_int(&fe->m->train, k, lua_tointeger(L, -1), why, sizeof why);
        else if (t == LUA_TNUMBER)
            ok = fe_train_store_num(&fe->m->train, k, lua_tonumber(L, -1), why, sizeof why);
        else if (t == LUA_TSTRING)
            ok = fe_train_store_text(fe->m, &fe->m->train, k, lua_tostring(L, -1), false, why,
                                  sizeof why);
        else if (t == LUA_TBOOLEAN && k->oneof && strcmp(k->oneof, "true, false") == 0)
            ok = fe_train_store_text(fe->m, &fe->m->train, k,
                                     lua_toboolean(L, -1) ? "true" : "false", false, why,
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
    fe->train_line = fe_user_loc(L).line;
    return 0;
}

const char *fe_set_origin(lua_State *L, int idx, char *buf, size_t n)
{
    Fe *fe = fe_get(L);
    buf[0] = 0;
    if (fe->config_ref == LUA_NOREF)
        return buf;
    idx = lua_absindex(L, idx);
    lua_rawgeti(L, LUA_REGISTRYINDEX, fe->config_ref);
    for (int i = 0; i < fe->nsets && !buf[0]; i++) {
        char key[256];
        if (!fe->set_used[i] || !fe_set_value(fe->sets[i], key, sizeof key))
            continue;
        lua_pushstring(L, key);
        lua_rawget(L, -2);
        if (lua_rawequal(L, -1, idx))
            snprintf(buf, n, ", from --set %s", fe->sets[i]);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return buf;
}
