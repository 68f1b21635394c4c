/* frontend.c - the model runner: runs a model script in an embedded Lua 5.4
 * state (every error names the script's file:line); config{}, --set and
 * train{} are in config.c (train{}'s key table in settings.c).
 * fe_load_model runs the script, and runs it again with nn.training = false
 * for the evaluation graph when it draws random numbers. The graph inputs,
 * params and outputs (input, param and its initializers, sym{}, minimize,
 * output, ...) are in declare.c, the tensor primitives in ops.c, the
 * sandbox (the Lua state's libraries and bounds) in sandbox.c. The nn library and the other Lua
 * files of frontend/ are embedded in the binary and loaded as globals named
 * after their files. */
#include "fe_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

struct fe_embedded {
    const char *name;
    const char *src;
    size_t len;
};
extern const struct fe_embedded fe_embedded_lua[];

/* ---- the Lua state ------------------------------------------------------ */

SrcLoc fe_user_loc(lua_State *L)
{
    Fe *fe = fe_get(L);
    lua_Debug ar;
    for (int lv = 0; lua_getstack(L, lv, &ar); lv++) {
        lua_getinfo(L, "Sl", &ar);
        if (ar.currentline > 0 && strcmp(ar.source, fe->chunk) == 0)
            return (SrcLoc){fe->path, ar.currentline};
    }
    return (SrcLoc){fe->path, 0};
}

int fe_error(lua_State *L, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    SrcLoc loc = fe_user_loc(L);
    lua_pushfstring(L, "%s:%d: %s", loc.file, loc.line, msg);
    return lua_error(L);
}

/* Edit distance between a and b (optimal string alignment: insertions,
 * deletions, substitutions and swaps of neighbours cost 1), capped at 9. */
static int name_distance(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na > 30 || nb > 30)
        return 9;
    int d[32][32];
    for (size_t i = 0; i <= na; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c)
                c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c)
                c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[na][nb] < 9 ? d[na][nb] : 9;
}

int fe_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether key is near name: the same but for case (distance 0), within a
 * third of name's length in edits (at least 2; 1 for names of up to 3
 * characters), or one starts with the other (3 characters or more). */
static bool near_name(const char *name, const char *key, int *dist)
{
    size_t nl = strlen(name), kl = strlen(key);
    int limit = nl <= 3 ? 1 : nl / 3 > 2 ? (int)(nl / 3) : 2;
    int d = strcasecmp(name, key) == 0 ? 0 : name_distance(name, key);
    if (d > limit && nl >= 3 && kl >= 3 && strncmp(key, name, nl < kl ? nl : kl) == 0)
        d = limit;
    *dist = d;
    return d <= limit;
}

bool fe_closest_key(const char *name, const char *list, char *out, size_t n)
{
    int best = 99;
    out[0] = 0;
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t len = strcspn(p, ", ");
        if (!len)
            break;
        char key[64];
        if (len < sizeof key) {
            memcpy(key, p, len);
            key[len] = 0;
            int d;
            if (strcmp(key, name) != 0 && near_name(name, key, &d) && d < best) {
                best = d;
                snprintf(out, n, "%s", key);
            }
        }
        p += len;
    }
    return out[0] != 0;
}

/* ---- options tables -------------------------------------------------------- */

/* The string keys of the table at idx, sorted, in a new userdata on the
 * stack (a NULL-terminated array; the table keeps the strings alive). */
static const char **sorted_keys(lua_State *L, int idx, int *nkeys)
{
    idx = lua_absindex(L, idx);
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        n++;
        lua_pop(L, 1);
    }
    const char **keys = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
    int k = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) == LUA_TSTRING && k < n)
            keys[k++] = lua_tostring(L, -2);
        lua_pop(L, 1);
    }
    keys[k] = NULL;
    qsort(keys, (size_t)k, sizeof *keys, fe_cmp_str);
    *nkeys = k;
    return keys;
}

/* Whether the value at idx is what type (a word of fe_check_opts' spec)
 * asks for; *what is the type in words. */
static bool opt_type_ok(lua_State *L, int idx, const char *type, size_t tl, const char **what)
{
#define IS(w) (tl == strlen(w) && strncmp(type, w, tl) == 0)
    int t = lua_type(L, idx);
    if (IS("boolean"))
        return *what = "true or false", t == LUA_TBOOLEAN;
    if (IS("flag"))
        return *what = "true or false", t == LUA_TBOOLEAN || t == LUA_TNUMBER;
    if (IS("number"))
        return *what = "a number", t == LUA_TNUMBER;
    if (IS("integer")) {
        *what = "an integer";
        return lua_isinteger(L, idx) ||
               (t == LUA_TNUMBER && lua_tonumber(L, idx) == floor(lua_tonumber(L, idx)) &&
                fabs(lua_tonumber(L, idx)) < 9e15);
    }
    if (IS("ints")) { /* a size per spatial dim, or one for all (nn.Conv2d's stride) */
        *what = "an integer or a table of integers";
        if (t == LUA_TNUMBER)
            return lua_tonumber(L, idx) == floor(lua_tonumber(L, idx));
        if (t != LUA_TTABLE)
            return false;
        idx = lua_absindex(L, idx);
        for (lua_Integer i = 1, n = luaL_len(L, idx); i <= n; i++) {
            bool ok = lua_geti(L, idx, i) == LUA_TNUMBER &&
                      lua_tonumber(L, -1) == floor(lua_tonumber(L, -1));
            lua_pop(L, 1);
            if (!ok)
                return false;
        }
        return true;
    }
    if (IS("string"))
        return *what = "a string", t == LUA_TSTRING;
    if (IS("init"))
        return *what = "an initializer such as normal(0.02)", luaL_testudata(L, idx, INIT_MT);
    if (IS("tensor"))
        return *what = "a tensor", luaL_testudata(L, idx, "kiln.tensor");
    if (IS("function")) {
        *what = "a function";
        if (t == LUA_TFUNCTION)
            return true;
        bool callable = luaL_getmetafield(L, idx, "__call") != LUA_TNIL;
        if (callable)
            lua_pop(L, 1);
        return callable;
    }
#undef IS
    die("fe_check_opts: unknown option type '%.*s'", (int)tl, type);
}

/* The accepted keys of spec, ", "-joined, into buf; the unsupported ones
 * ("-") are left out. */
static const char *opt_keys(const char *spec, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (const char *p = spec; *p;) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, " ");
        const char *colon = memchr(p, ':', len);
        if (colon && !(colon[1] == '-' && colon + 2 == p + len) && k < n)
            k += (size_t)snprintf(buf + k, n - k, "%s%.*s", k ? ", " : "", (int)(colon - p), p);
        p += len;
    }
    return buf;
}

void fe_check_opts(lua_State *L, int idx, const char *fn, const char *spec)
{
    char accepted[512];
    if (lua_isnoneornil(L, idx))
        return;
    if (!lua_istable(L, idx))
        fe_error(L, "%s: options must be a table of named values (got %s; accepted keys: %s)", fn,
                 luaL_typename(L, idx), opt_keys(spec, accepted, sizeof accepted));
    idx = lua_absindex(L, idx);
    int top = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            const char *kt = luaL_typename(L, -2), *ks = luaL_tolstring(L, -2, NULL);
            fe_error(L, "%s: options are named (expected {key = value}, got a %s key %s; "
                        "accepted keys: %s)", fn, kt, ks, opt_keys(spec, accepted, sizeof accepted));
        }
        lua_pop(L, 1);
    }
    int nkeys;
    const char **keys = sorted_keys(L, idx, &nkeys);
    for (int i = 0; i < nkeys; i++) {
        const char *key = keys[i], *type = NULL;
        size_t kl = strlen(key), tl = 0;
        for (const char *p = spec; *p && !type;) {
            while (*p == ' ')
                p++;
            size_t len = strcspn(p, " ");
            if (len > kl && strncmp(p, key, kl) == 0 && p[kl] == ':')
                type = p + kl + 1, tl = len - kl - 1;
            p += len;
        }
        opt_keys(spec, accepted, sizeof accepted);
        if (!type) {
            char near[64];
            if (fe_closest_key(key, accepted, near, sizeof near))
                fe_error(L, "%s: unknown option '%s' (did you mean '%s'? accepted keys: %s)", fn,
                         key, near, accepted);
            fe_error(L, "%s: unknown option '%s' (accepted keys: %s)", fn, key, accepted);
        }
        if (tl == 1 && type[0] == '-')
            fe_error(L, "%s: option '%s' is not supported (kiln does not implement it yet; "
                        "accepted keys: %s)", fn, key, accepted);
        lua_getfield(L, idx, key);
        const char *what;
        if (!opt_type_ok(L, -1, type, tl, &what)) {
            int vt = lua_type(L, -1);
            const char *got = vt == LUA_TNUMBER || vt == LUA_TBOOLEAN ? luaL_tolstring(L, -1, NULL)
                              : vt == LUA_TSTRING ? lua_pushfstring(L, "the string '%s'",
                                                                    lua_tostring(L, -1))
                                                  : luaL_typename(L, -1);
            fe_error(L, "%s: option '%s' must be %s (got %s)", fn, key, what, got);
        }
        lua_pop(L, 1);
    }
    lua_settop(L, top);
}

/* check_opts(fn, opts, spec), the Lua face of fe_check_opts for the
 * embedded nn library (passed to its chunk, never a global). */
static int l_check_opts(lua_State *L)
{
    const char *fn = luaL_checkstring(L, 1), *spec = luaL_checkstring(L, 3);
    fe_check_opts(L, 2, fn, spec);
    return 0;
}

/* Appends to buf the (up to three) function names in the table at the top of
 * the stack (nn's when kd_nn) closest to name: those within a third of its length (at least
 * 2 edits), or that start with it or it with them. The table is left. */
static void closest_names(lua_State *L, const char *name, bool kd_nn, char *buf, size_t n)
{
    const char *best[3] = {NULL, NULL, NULL};
    int bd[3] = {99, 99, 99};
    size_t nl = strlen(name);
    int limit = nl / 3 > 2 ? (int)(nl / 3) : 2;
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_isfunction(L, -1)) {
            const char *k = lua_tostring(L, -2);
            size_t kl = strlen(k);
            int dist = name_distance(name, k);
            if (dist > limit && nl >= 3 && kl >= 3 &&
                (strncmp(k, name, nl < kl ? nl : kl) == 0))
                dist = limit; /* a prefix: softmax for soft, log for log_softmax */
            /* keep the three nearest, ties in name order so the message is stable */
            for (int i = 0; i < 3 && dist <= limit; i++)
                if (dist < bd[i] || (dist == bd[i] && best[i] && strcmp(k, best[i]) < 0)) {
                    for (int j = 2; j > i; j--)
                        best[j] = best[j - 1], bd[j] = bd[j - 1];
                    best[i] = k, bd[i] = dist;
                    break;
                }
        }
        lua_pop(L, 1);
    }
    size_t k = strlen(buf);
    for (int i = 0; i < 3 && best[i]; i++)
        k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%s", i ? ", " : (kd_nn ? "; closest in nn: " : "; closest: "),
                              best[i]);
}

/* Lua's "attempt to call a nil value (global 'erf')" for a function kiln does
 * not have, said plainly with the closest names kiln has: globals for a
 * global, nn's functions for nn.NAME, tensor methods for x:NAME(). The
 * message stays as Lua wrote it for anything else. Pushes the message. */
static const char *explain_missing(lua_State *L, const char *msg)
{
    static const char *const kinds[] = {"global", "field", "method"};
    for (int kd = 0; kd < 3; kd++) {
        char pat[48];
        snprintf(pat, sizeof pat, "attempt to call a nil value (%s '", kinds[kd]);
        const char *at = strstr(msg, pat);
        if (!at)
            continue;
        const char *nm = at + strlen(pat), *end = strchr(nm, '\'');
        if (!end || end == nm || end - nm > 60 || strcmp(end, "')") != 0)
            return msg;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(end - nm), nm);
        char hint[256] = "";
        bool found = true;
        if (kd == 0)
            lua_pushglobaltable(L);
        else if (kd == 1)
            found = lua_getglobal(L, "nn") == LUA_TTABLE;
        else {
            found = luaL_getmetatable(L, "kiln.tensor") == LUA_TTABLE &&
                    lua_getfield(L, -1, "__index") == LUA_TFUNCTION &&
                    lua_getupvalue(L, -1, 1) && lua_istable(L, -1);
        }
        if (found)
            closest_names(L, name, kd == 1, hint, sizeof hint);
        lua_settop(L, 1);
        const char *what = kd == 0 ? "is not a kiln function or a global of this script"
                           : kd == 1 ? "is nil where it is called (nn has no such function)"
                                     : "is not a tensor method";
        return lua_pushfstring(L, "%s'%s' %s%s", lua_pushlstring(L, msg, (size_t)(at - msg)) ?
                               lua_tostring(L, -1) : "", name, what, hint);
    }
    return msg;
}

/* Message handler: every error names the user's file and line. Errors raised
 * by the DSL already do; Lua's own errors in the script carry the chunk's
 * short name, which is replaced by the full path; errors inside embedded
 * library code get the user's line in front. */
int fe_msgh_where(lua_State *L)
{
    Fe *fe = fe_get(L);
    fe->mem_armed = false; /* the run is over: the message must not fail */
    const char *msg = lua_tostring(L, 1);
    if (!msg)
        msg = lua_pushfstring(L, "error object is a %s value", luaL_typename(L, 1));
    else
        msg = explain_missing(L, msg);
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
/* fe_msgh_where's message, and when --set changed config keys and the message
 * does not name a --set already, those --set (the usual cause of an error
 * in a script that builds without them: `--set H=0` in C % H). */
static int msgh(lua_State *L)
{
    Fe *fe = fe_get(L);
    fe_msgh_where(L);
    const char *msg = lua_tostring(L, -1);
    int used = 0;
    for (int i = 0; i < fe->nsets; i++)
        used += fe->set_used[i];
    if (!msg || !used || strstr(msg, "--set "))
        return 1;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0, k = 0; i < fe->nsets; i++) {
        if (!fe->set_used[i])
            continue;
        luaL_addstring(&b, k++ ? ", --set " : " (the script ran with --set ");
        luaL_addstring(&b, fe->sets[i]);
    }
    luaL_addchar(&b, ')');
    luaL_pushresult(&b);
    lua_concat(L, 2);
    return 1;
}

/* ---- the DSL's globals ---------------------------------------------------- */

/* The runner's globals, registered after the tensor primitives (same order
 * as before the split, so _G is built identically). */
static void open_dsl(lua_State *L)
{
    static const FeGlobal runner[] = {
        {"input", fe_dsl_input, -1},
        {"param", fe_dsl_param, -1},
        {"state", fe_dsl_state, -1},
        {"assign", fe_dsl_assign, -1},
        {"zeros", fe_dsl_init, INIT_ZEROS},
        {"ones", fe_dsl_init, INIT_ONES},
        {"normal", fe_dsl_init, INIT_NORMAL},
        {"uniform", fe_dsl_init, INIT_UNIFORM},
        {"sym", fe_dsl_sym, -1},
        {"minimize", fe_dsl_minimize, -1},
        {"output", fe_dsl_output, -1},
        {"padded_rows", fe_dsl_padded_rows, -1},
        {"shard", fe_dsl_shard, -1},
        {"pp_stage", fe_dsl_pp_stage, -1},
        {"config", fe_dsl_config, -1},
        {"train", fe_dsl_train, -1},
        {NULL, NULL, 0},
    };
    fe_open_ops(L, runner);
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
    fe->m->priv->config = xmalloc(sizeof(FeConfigItem) * (size_t)cap);
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if (lua_type(L, -2) == LUA_TSTRING) {
            char *v = value_text(L, -1);
            if (v) {
                if (fe->m->priv->nconfig == cap)
                    fe->m->priv->config = xrealloc(fe->m->priv->config, sizeof(FeConfigItem) * (size_t)(cap *= 2));
                fe->m->priv->config[fe->m->priv->nconfig++] =
                    (FeConfigItem){xstrdup(lua_tostring(L, -2)), v};
            }
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    qsort(fe->m->priv->config, (size_t)fe->m->priv->nconfig, sizeof(FeConfigItem), cmp_item);
}

/* Checks after the script ran; returns false with err set. */
/* A param that no op reads, or that the loss does not depend on, trains to
 * nothing (its gradient is zero: weight decay alone moves it): most often a
 * layer built and never called. Each becomes a warning at its param() line
 * in m->warnings. Runs before ir_compact: fe->params holds tensor ids. */
static void warn_unused_params(Fe *fe)
{
    const Graph *g = fe->g;
    if (!fe->params.n || fe->loss < 0)
        return;
    uint8_t *read = xcalloc((size_t)g->t.n, 1), *live = xcalloc((size_t)g->t.n, 1);
    for (int i = 0; i < g->ops.n; i++)
        for (int j = 0; j < g->ops.v[i].nin; j++)
            read[g->ops.v[i].in[j]] = 1;
    /* ops are in creation order, so one backward sweep finds what the loss reads */
    live[fe->loss] = 1;
    for (int i = g->ops.n - 1; i >= 0; i--) {
        const Op *op = &g->ops.v[i];
        if (live[op->out])
            for (int j = 0; j < op->nin; j++)
                live[op->in[j]] = 1;
    }
    size_t len = 0, cap = 0;
    char *w = NULL;
    for (int i = 0; i < fe->params.n; i++) {
        int t = fe->params.v[i].t;
        if (live[t])
            continue;
        char line[512];
        int n = snprintf(line, sizeof line, "%s:%d: warning: param '%s' %s (its gradient is "
                         "zero; check that the layer it belongs to is called)\n", fe->path,
                         fe->params.v[i].line, g->t.v[t].name,
                         read[t] ? "does not affect the loss" : "is never used");
        if (n < 0)
            continue;
        if (len + (size_t)n + 1 > cap) {
            cap = 2 * cap + (size_t)n + 1;
            w = xrealloc(w, cap);
        }
        memcpy(w + len, line, (size_t)n + 1);
        len += (size_t)n;
    }
    fe->m->warnings = w;
    free(read);
    free(live);
}

/* Appends "PATH:LINE: warning: ...\n" to m->warnings. */
static void add_warning(Model *m, const char *path, int line, const char *msg)
{
    size_t len = m->warnings ? strlen(m->warnings) : 0;
    char *w = xasprintf("%s:%d: warning: %s\n", path, line, msg);
    m->warnings = xrealloc(m->warnings, len + strlen(w) + 1);
    memcpy(m->warnings + len, w, strlen(w) + 1);
    free(w);
}

/* Settings of one optimizer or schedule set while another is chosen do
 * nothing: a warning each (a --set sweep must not stop on them). */
static void warn_unused_settings(Fe *fe)
{
    const TrainCfg *c = &fe->m->train;
    const char *opt = c->optimizer ? c->optimizer : "adamw";
    const char *sch = c->lr_schedule ? c->lr_schedule : "cosine";
    const struct {
        const char *key, *owner, *chosen;
        bool set;
    } w[] = {
        {"momentum", "sgd", opt, c->momentum != 0},
        {"nesterov", "sgd", opt, c->nesterov && strcmp(c->nesterov, "true") == 0},
        {"lion_beta1", "lion", opt, c->lion_beta1 != 0.9},
        {"lion_beta2", "lion", opt, c->lion_beta2 != 0.99},
        {"beta1", "adamw", opt, c->beta1 != 0.9},
        {"beta2", "adamw", opt, c->beta2 != 0.95},
        {"eps", "adamw", opt, c->eps != 1e-8},
        {"decay_fraction", "wsd", sch, c->decay_fraction != 0.2},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        if (!w[i].set || strcmp(w[i].owner, w[i].chosen) == 0)
            continue;
        bool schedule = strcmp(w[i].owner, "wsd") == 0;
        char msg[256];
        snprintf(msg, sizeof msg, "train: %s applies to %s = \"%s\" only (ignored with %s = \"%s\")",
                 w[i].key, schedule ? "lr_schedule" : "optimizer", w[i].owner,
                 schedule ? "lr_schedule" : "optimizer", w[i].chosen);
        add_warning(fe->m, fe->path, fe->train_line, msg);
    }
}

static bool finish(lua_State *L, Fe *fe, char *err, size_t errlen)
{
    Model *m = fe->m;
    for (int i = 0; i < fe->nsets; i++) {
        if (fe->set_used[i])
            continue;
        char key[256], why[512];
        const char *val = fe_set_value(fe->sets[i], key, sizeof key);
        const FeTrainKey *k = fe_train_key(key);
        if (!k && (strcmp(key, "param_groups") == 0 || strcmp(key, "frozen") == 0)) {
            snprintf(err, errlen, "--set %s: a table, set in the script's train{} only (expected "
                     "a key with one value, got %s)", key, key);
            return false;
        }
        if (!k) {
            char near[64], mean[96] = "";
            if (fe_closest_key(key, fe_train_key_list(), near, sizeof near))
                snprintf(mean, sizeof mean, "did you mean '%s'? ", near);
            snprintf(err, errlen, "--set %s: unknown key (%s%s has no config{} key '%s'; expected "
                     "a config key or a train key: %s)", key, mean, fe->path, key,
                     fe_train_key_list());
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
    if (m->train.nesterov && strcmp(m->train.nesterov, "true") == 0 && !(m->train.momentum > 0)) {
        snprintf(err, errlen, "%s:%d: train: nesterov = true needs momentum > 0 (expected "
                 "momentum in (0, 1), got 0)", fe->path, fe->train_line);
        return false;
    }
    collect_config(L, fe);
    m->train_line = fe->train_line;
    warn_unused_params(fe);
    warn_unused_settings(fe);
    ir_compact(g);
    char verr[1024];
    if (!ir_verify(g, verr, sizeof verr))
        die("frontend built an invalid graph for %s: %s", fe->path, verr);
    return true;
}

/* Lua's syntax errors name the script by its short form, "...ry/model.lua:3:"
 * when the path is longer than LUA_IDSIZE: writes msg with the full path. */
static void syntax_message(const char *path, const char *msg, char *err, size_t errlen)
{
    size_t pl = strlen(path);
    if (strncmp(msg, "...", 3) == 0)
        for (const char *c = strchr(msg + 3, ':'); c; c = strchr(c + 1, ':')) {
            size_t n = (size_t)(c - (msg + 3));
            if (n <= pl && memcmp(path + pl - n, msg + 3, n) == 0 && c[1] >= '0' && c[1] <= '9') {
                snprintf(err, errlen, "%s%s", path, c);
                return;
            }
        }
    snprintf(err, errlen, "%s", msg);
}

/* Runs the script once, with nn.training = training; decode_len > 0:
 * decode mode (fe_load_decode). */
static Model *load_once(const char *path, const Script *sc, const char *const *sets, int nsets,
                        bool training, int64_t decode_len, char *err, size_t errlen)
{
    Model *m = xcalloc(1, sizeof *m);
    m->priv = xcalloc(1, sizeof *m->priv);
    m->path = intern(path);
    m->g = ir_new();
    fe_train_defaults(&m->train);
    Fe fe = {.g = m->g, .m = m, .path = m->path, .sets = sets, .nsets = nsets,
             .config_ref = LUA_NOREF, .groups_ref = LUA_NOREF, .frozen_ref = LUA_NOREF,
             .post = fe_resolve_groups, .loss = -1, .mem_limit = sc->mem,
             .instr_limit = sc->instr, .ops_limit = sc->ops, .hook_period = FE_HOOK_PERIOD,
             .evaluating = !training};
    snprintf(fe.chunk, sizeof fe.chunk, "@%s", path);
    fe.set_used = xcalloc((size_t)(nsets ? nsets : 1), sizeof(bool));

    lua_State *L = fe_sandbox_new(&fe);
    open_dsl(L);
    lua_pushcfunction(L, msgh);
    int h = lua_gettop(L);

    bool ok = true;
    for (const struct fe_embedded *e = fe_embedded_lua; ok && e->name; e++) {
        char chunk[128];
        snprintf(chunk, sizeof chunk, "=%s.lua", e->name);
        /* each file gets the options checker as its chunk argument (...) */
        if (luaL_loadbufferx(L, e->src, e->len, chunk, "t") != LUA_OK ||
            (lua_pushcfunction(L, l_check_opts), lua_pcall(L, 1, 1, h)) != LUA_OK)
            die("embedded %s.lua: %s", e->name, lua_tostring(L, -1));
        if (!lua_isnil(L, -1))
            lua_setglobal(L, e->name);
        else
            lua_pop(L, 1);
    }
    if (lua_getglobal(L, "nn") == LUA_TTABLE) {
        lua_pushboolean(L, training);
        lua_setfield(L, -2, "training");
        if (decode_len > 0) { /* nn.decode = {len = S, pos = i32[], state, update} */
            fe.decode_len = decode_len;
            fe.decode_pos = ir_add_input(m->g, TK_INPUT, "decode.pos",
                                         shape_make(DT_I32, 0, NULL), (ParamInit){0});
            lua_createtable(L, 0, 4);
            lua_pushinteger(L, decode_len);
            lua_setfield(L, -2, "len");
            fe_push_tensor(L, fe.decode_pos);
            lua_setfield(L, -2, "pos");
            lua_pushcfunction(L, fe_dsl_decode_state);
            lua_setfield(L, -2, "state");
            lua_pushcfunction(L, fe_dsl_decode_update);
            lua_setfield(L, -2, "update");
            lua_setfield(L, -2, "decode");
        }
    }
    lua_pop(L, 1);
    /* the script: a text chunk, with its first line skipped when it starts
     * with '#' (as lua does; its newline stays, so lines keep their numbers) */
    const char *text = sc->text;
    size_t len = sc->len;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        text += 3, len -= 3;
    if (len && text[0] == '#') {
        const char *nl = memchr(text, '\n', len);
        len = nl ? len - (size_t)(nl - text) : 0;
        text = nl ? nl : text + len;
    }
    int st = fe_sandbox_run(L, &fe, sc, text, len, h);
    if (st != LUA_OK || fe.mem_over || fe.time_over) {
        char b[32];
        ir_fmt_bytes((double)fe.mem_limit, -1, b, sizeof b);
        if (fe.time_over) /* whatever the script made of the failed allocation */
            fe_time_message(fe.path, fe.stop_line ? fe.stop_line : fe.last_line, fe.seconds,
                            err, errlen);
        else if (st == LUA_ERRSYNTAX && lua_tostring(L, -1))
            syntax_message(fe.path, lua_tostring(L, -1), err, errlen);
        else if (st == LUA_ERRRUN || st == LUA_ERRSYNTAX)
            snprintf(err, errlen, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "unknown error");
        else if (fe.mem_over)
            fe_mem_message(&fe, fe.stop_line ? fe.stop_line : fe.last_line, err, errlen);
        else if (st == LUA_ERRMEM)
            snprintf(err, errlen, "%s:%d: out of memory in Lua (the machine could not give the "
                     "script more; it held %s)", fe.path, fe.last_line,
                     ir_fmt_bytes((double)fe.mem_used, -1, b, sizeof b));
        else
            snprintf(err, errlen, "%s:%d: %s", fe.path, fe.last_line,
                     lua_tostring(L, -1) ? lua_tostring(L, -1) : "error in error handling");
        ok = false;
    }
    if (ok)
        ok = finish(L, &fe, err, errlen);
    lua_close(L);
    free(fe.set_used);
    vec_free(&fe.params);
    if (!ok) {
        fe_model_free(m);
        return NULL;
    }
    return m;
}

/* Whether the evaluation graph differs from the training graph's forward:
 * random numbers (dropout) or state the script assigns (BatchNorm's
 * running statistics), both of which evaluation leaves out. */
static bool has_random(const Graph *g)
{
    if (g->upd.n > 0)
        return true;
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

/* Whether the training step keeps output o: "loss", scalars (grad_norm)
 * and outputs declared with {train = true}. */
static bool train_output(const Model *m, const GraphOutput *o)
{
    if (strcmp(o->name, "loss") == 0 || shape_numel(&m->g->t.v[o->t].s) == 1 ||
        strncmp(o->name, "pp.stage.", 9) == 0)
        return true;
    for (int i = 0; i < m->priv->train_outs.n; i++)
        if (m->priv->train_outs.v[i] == intern(o->name))
            return true;
    return false;
}

/* pp_stage's outputs: the training graph keeps them only where pp > 1
 * (passes/stages.c reads them), the evaluation graph never. */
static void drop_stage_outputs(Graph *g)
{
    int k = 0;
    for (int i = 0; g && i < g->outs.n; i++)
        if (strncmp(g->outs.v[i].name, "pp.stage.", 9) != 0)
            g->outs.v[k++] = g->outs.v[i];
    if (g)
        g->outs.n = k;
}

static void stage_hints(Model *m)
{
    if (m->train.pp <= 1)
        drop_stage_outputs(m->g);
    drop_stage_outputs(m->eval_g);
}

/* Other named outputs (logits) belong to evaluation: the evaluation graph
 * keeps them (m->g's copy when the script drew no second graph) and the
 * training step drops them, so it stores no logits (they stay temporaries:
 * freed after their last reader, bf16 under mixed precision). */
static void eval_only_outputs(Model *m)
{
    Graph *g = m->g;
    int k = 0;
    for (int i = 0; i < g->outs.n; i++)
        k += train_output(m, &g->outs.v[i]);
    if (k == g->outs.n)
        return;
    if (!m->eval_g)
        m->eval_g = ir_clone(g);
    k = 0;
    for (int i = 0; i < g->outs.n; i++)
        if (train_output(m, &g->outs.v[i]))
            g->outs.v[k++] = g->outs.v[i];
    g->outs.n = k;
}

/* Runs the script text (read from path, or given) once, or twice with an
 * evaluation graph. */
static Model *load_script(const char *path, const Script *sc, const char *const *sets,
                          int nsets, char *err, size_t errlen)
{
    for (int i = 0; i < nsets; i++) {
        char key[256];
        if (!fe_set_value(sets[i], key, sizeof key) || !key[0]) {
            snprintf(err, errlen, "--set %s: expected key=value (got '%s')", key, sets[i]);
            return NULL;
        }
    }
    Model *m = load_once(path, sc, sets, nsets, true, 0, err, errlen);
    if (m && !has_random(m->g)) {
        eval_only_outputs(m);
        stage_hints(m);
    }
    if (!m || !has_random(m->g))
        return m;
    /* random numbers (dropout), assigned state: build the evaluation graph
     * without them */
    Model *e = load_once(path, sc, sets, nsets, false, 0, err, errlen);
    if (!e || !same_interface(m->g, e->g, path, err, errlen)) {
        fe_model_free(e);
        fe_model_free(m);
        return NULL;
    }
    m->eval_g = e->g;
    e->g = NULL;
    fe_model_free(e);
    eval_only_outputs(m);
    stage_hints(m);
    return m;
}

Model *fe_load_model_text(const char *path, const char *text, size_t len,
                          const char *const *sets, int nsets, char *err, size_t errlen)
{
    Script sc = {.text = text, .len = len};
    if (!fe_sandbox_limits(&sc, err, errlen))
        return NULL;
    return load_script(path, &sc, sets, nsets, err, errlen);
}

char *fe_read_lua_file(const char *flag, const char *path, const char *noun, size_t max,
                       size_t *len, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s%s: cannot open %s: %s", flag, path, noun, strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        if (!S_ISREG(st.st_mode))
            snprintf(err, errlen, "%s%s: cannot read %s (expected a Lua file, got %s)", flag,
                     path, noun, S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ?
                     "a FIFO" : "a file that is not a regular file");
        else
            snprintf(err, errlen, "%s%s: %s is %lld bytes (expected at most %zu, the Lua memory "
                     "limit; KILN_LUA_MEMORY raises it)", flag, path, noun,
                     (long long)st.st_size, max);
        close(fd);
        return NULL;
    }
    char *buf = xmalloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s%s: cannot read %s: %s", flag, path, noun,
                     r < 0 ? strerror(errno) : "it became shorter while being read");
            free(buf);
            close(fd);
            return NULL;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[got] = 0;
    *len = got;
    return buf;
}

/* The sandbox's bounds and the model script at path in *sc (sc->text is
 * the returned buffer, the caller's to free); NULL with err set. */
static char *read_model(const char *path, Script *sc, char *err, size_t errlen)
{
    *sc = (Script){0};
    if (!fe_sandbox_limits(sc, err, errlen))
        return NULL;
    char *text = fe_read_lua_file("", path, "the model script", sc->mem, &sc->len, err, errlen);
    sc->text = text;
    return text;
}

Model *fe_load_model(const char *path, const char *const *sets, int nsets, char *err,
                     size_t errlen)
{
    Script sc;
    char *text = read_model(path, &sc, err, errlen);
    if (!text)
        return NULL;
    Model *m = load_script(path, &sc, sets, nsets, err, errlen);
    free(text);
    return m;
}

Graph *fe_load_decode(const char *path, const char *const *sets, int nsets, int64_t len,
                      int *ncaches, char *err, size_t errlen)
{
    Script sc;
    char *text = read_model(path, &sc, err, errlen);
    if (!text)
        return NULL;
    Model *m = load_once(path, &sc, sets, nsets, false, len, err, errlen);
    free(text);
    if (!m)
        return NULL;
    Graph *g = m->g;
    m->g = NULL;
    fe_model_free(m);
    int k = 0, logits = -1;
    for (int i = 0; i < g->outs.n; i++)
        if (strcmp(g->outs.v[i].name, "logits") == 0)
            logits = g->outs.v[i].t;
    if (logits >= 0)
        g->outs.v[k++] = (GraphOutput){.name = intern("logits"), .t = logits};
    g->outs.n = k;
    *ncaches = 0;
    for (int i = 0; i < g->t.n; i++)
        *ncaches += g->t.v[i].kind == TK_STATE;
    return g;
}
