/* initmap.c - `kiln train --init-map FILE.lua` (frontend.h): runs a map file
 * in the model scripts' sandbox and turns what it returns into an InitMap,
 * one entry per tensor of the --init-from file.
 *
 * The file returns a table or a function (docs/training.md, Fine-tuning):
 *   table:    FILE_NAME = VALUE; names it does not list keep their name, and
 *             a key that names no tensor of the file is an error (a typo)
 *   function: f(name, shape) -> VALUE, called once per tensor of the file
 *             (shape: a table of its dims); nil keeps the name
 * where VALUE is a model param name (a string), false (ignore the tensor)
 * or {to = NAME, transpose = true} (to: the same name when absent).
 * The file and every call of its function run under the sandbox's bounds;
 * errors name the map file and line. */
#include "fe_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#define MAP_NAME_MAX 1024 /* longest param name a map may give */

/* What the post function reads and fills (the registry holds a pointer). */
typedef struct {
    const char *text; /* the map file's source */
    size_t len;
    const char *const *names;
    const Shape *shapes;
    int n;
    InitMapEntry *v; /* n entries, filled by map_post */
} MapRun;

static const char ctx_key[] = "kiln.initmap";

static MapRun *map_run(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, ctx_key);
    MapRun *r = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return r;
}

/* The first line of the map's text that holds name quoted ("name" or
 * 'name') or as a bare key (name =); 0 when none does. One pass. */
static int line_of(const MapRun *r, const char *name)
{
    size_t nl = strlen(name);
    int line = 1, bare = 0;
    for (size_t i = 0; nl && i + nl <= r->len; i++) {
        char c = r->text[i];
        if (c == '\n') {
            line++;
            continue;
        }
        if (c != name[0] || memcmp(r->text + i, name, nl) != 0)
            continue;
        char before = i ? r->text[i - 1] : ' ', after = i + nl < r->len ? r->text[i + nl] : ' ';
        if ((before == '"' || before == '\'') && after == before)
            return line;
        if (!bare && (before == ' ' || before == '\t' || before == '{' || before == ',' ||
                      before == '\n') && (after == ' ' || after == '='))
            bare = line;
    }
    return bare;
}

/* lines[i]: line_of(names[i]) for every name at once, in one pass over the
 * text: each quoted string (on one line) and each bare key before '=' is
 * looked up in the table at idx (name -> index + 1). */
static void lines_of(lua_State *L, const MapRun *r, int idx, int *lines)
{
    int line = 1;
    for (size_t i = 0; i < r->len; i++) {
        char c = r->text[i];
        if (c == '\n') {
            line++;
            continue;
        }
        size_t b = i, e = i;
        if (c == '"' || c == '\'') {
            for (e = i + 1; e < r->len && r->text[e] != c && r->text[e] != '\n'; e++)
                ;
            if (e >= r->len || r->text[e] != c) {
                i = e - 1; /* unterminated: go on from the line's end */
                continue;
            }
            b = i + 1;
            i = e;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            for (e = i; e < r->len && ((r->text[e] >= 'a' && r->text[e] <= 'z') ||
                                        (r->text[e] >= 'A' && r->text[e] <= 'Z') ||
                                        (r->text[e] >= '0' && r->text[e] <= '9') ||
                                        r->text[e] == '_');
                 e++)
                ;
            size_t k = e;
            while (k < r->len && (r->text[k] == ' ' || r->text[k] == '\t'))
                k++;
            i = e - 1;
            if (k >= r->len || r->text[k] != '=' || (k + 1 < r->len && r->text[k + 1] == '='))
                continue;
        } else {
            continue;
        }
        lua_pushlstring(L, r->text + b, e - b);
        if (lua_rawget(L, idx) == LUA_TNUMBER) {
            lua_Integer k = lua_tointeger(L, -1);
            if (k >= 1 && k <= r->n && !lines[k - 1])
                lines[k - 1] = line;
        }
        lua_pop(L, 1);
    }
}

/* Raises "PATH:LINE: msg" (or "PATH: msg" for line 0). */
static int map_error(lua_State *L, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int map_error(lua_State *L, int line, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Fe *fe = fe_get(L);
    if (line > 0)
        lua_pushfstring(L, "%s:%d: %s", fe->path, line, msg);
    else
        lua_pushfstring(L, "%s: %s", fe->path, msg);
    return lua_error(L);
}

static const char value_forms[] =
    "expected a param name of the model, false to ignore the tensor, or {to = NAME, "
    "transpose = true}";

/* The value at the top of the stack for file tensor i (what), into e;
 * nil keeps the name. Pops it. */
static void read_value(lua_State *L, MapRun *r, int i, int line, const char *what)
{
    InitMapEntry *e = &r->v[i];
    const char *name = r->names[i];
    int ty = lua_type(L, -1);
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    e->line = line;
    if (ty == LUA_TBOOLEAN && !lua_toboolean(L, -1)) {
        e->to = NULL;
        lua_pop(L, 1);
        return;
    }
    const char *to = NULL;
    if (ty == LUA_TSTRING) {
        to = lua_tostring(L, -1);
    } else if (ty == LUA_TTABLE) {
        int t = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, t)) {
            const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
            if (!k || (strcmp(k, "to") != 0 && strcmp(k, "transpose") != 0)) {
                char near[64] = "";
                bool has = k && fe_closest_key(k, "to, transpose", near, sizeof near);
                map_error(L, line, "%s for \"%s\" has the key %s%s%s (expected to, transpose%s%s%s)",
                          what, name, k ? "\"" : "a ", k ? k : luaL_typename(L, -2),
                          k ? "\"" : " value", has ? "; did you mean " : "", has ? near : "",
                          has ? "?" : "");
            }
            lua_pop(L, 1);
        }
        lua_getfield(L, t, "to");
        if (lua_type(L, -1) == LUA_TSTRING)
            to = lua_tostring(L, -1);
        else if (!lua_isnil(L, -1))
            map_error(L, line, "%s for \"%s\": to is a %s (expected a param name)", what, name,
                      luaL_typename(L, -1));
        lua_getfield(L, t, "transpose");
        if (lua_type(L, -1) == LUA_TBOOLEAN)
            e->transpose = lua_toboolean(L, -1);
        else if (!lua_isnil(L, -1))
            map_error(L, line, "%s for \"%s\": transpose is a %s (expected true or false)",
                      what, name, luaL_typename(L, -1));
        if (e->transpose && r->shapes[i].rank < 2)
            map_error(L, line, "%s for \"%s\": transpose = true on a tensor of rank %d "
                      "(expected rank 2 or more: it swaps the last two axes)", what, name,
                      r->shapes[i].rank);
        lua_pop(L, 2);
        if (!to)
            to = name;
    } else {
        map_error(L, line, "%s for \"%s\" is %s%s (%s)", what, name,
                  ty == LUA_TBOOLEAN ? "" : "a ",
                  ty == LUA_TBOOLEAN ? "true" : luaL_typename(L, -1), value_forms);
    }
    size_t tl = strlen(to);
    if (!tl || tl > MAP_NAME_MAX)
        map_error(L, line, "%s for \"%s\" is a name of %zu bytes (expected a param name of "
                  "1 to %d bytes)", what, name, tl, MAP_NAME_MAX);
    e->to = intern(to);
    lua_pop(L, 1);
}

/* Runs after the map file, under its bounds: fills r->v from the table or
 * function the file returned. */
static int map_post(lua_State *L)
{
    Fe *fe = fe_get(L);
    MapRun *r = map_run(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, fe->result_ref);
    int m = lua_gettop(L), ty = lua_type(L, m);
    if (ty == LUA_TFUNCTION) {
        lua_Debug ar;
        lua_pushvalue(L, m);
        lua_getinfo(L, ">S", &ar);
        int line = ar.linedefined > 0 ? ar.linedefined : 0;
        for (int i = 0; i < r->n; i++) {
            lua_pushvalue(L, m);
            lua_pushstring(L, r->names[i]);
            lua_createtable(L, r->shapes[i].rank, 0);
            for (int k = 0; k < r->shapes[i].rank; k++) {
                lua_pushinteger(L, r->shapes[i].dim[k]);
                lua_rawseti(L, -2, k + 1);
            }
            lua_call(L, 2, 1);
            if (lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), r->names[i]) == 0)
                lua_pop(L, 1), lua_pushnil(L); /* the same name: as nil */
            read_value(L, r, i, line, "the map function's result");
        }
    } else if (ty == LUA_TTABLE) {
        lua_createtable(L, 0, r->n); /* name -> index + 1 */
        int set = lua_gettop(L);
        for (int i = 0; i < r->n; i++) {
            lua_pushinteger(L, i + 1);
            lua_setfield(L, set, r->names[i]);
        }
        /* Lua's memory (freed by Lua if an entry raises an error) */
        int *lines = lua_newuserdatauv(L, ((size_t)r->n + 1) * sizeof *lines, 0);
        memset(lines, 0, ((size_t)r->n + 1) * sizeof *lines);
        lines_of(L, r, set, lines);
        for (int i = 0; i < r->n; i++) {
            lua_pushstring(L, r->names[i]);
            lua_rawget(L, m);
            int line = lines[i];
            if (!lua_isnil(L, -1) && !line)
                line = -1;
            read_value(L, r, i, line, "the map's entry");
        }
        /* every key names a tensor of the file */
        lua_pushnil(L);
        while (lua_next(L, m)) {
            lua_pop(L, 1);
            if (lua_type(L, -1) != LUA_TSTRING)
                map_error(L, 0, "the map has a %s key (expected the names of the --init-from "
                          "file's tensors, strings)", luaL_typename(L, -1));
            lua_pushvalue(L, -1);
            bool found = lua_rawget(L, set) != LUA_TNIL;
            lua_pop(L, 1);
            const char *k = lua_tostring(L, -1);
            if (!found) {
                /* the closest name of the file, from a bounded list */
                size_t cap = 0;
                for (int i = 0; i < r->n && cap < 65536; i++)
                    cap += strlen(r->names[i]) + 2;
                char *list = xmalloc(cap + 1), near[256] = "";
                size_t at = 0;
                list[0] = 0;
                for (int i = 0; i < r->n && at + strlen(r->names[i]) + 2 <= cap; i++)
                    at += (size_t)sprintf(list + at, "%s%s", at ? ", " : "", r->names[i]);
                bool has = fe_closest_key(k, list, near, sizeof near);
                free(list);
                char kq[160];
                snprintf(kq, sizeof kq, "%.120s%s", k, strlen(k) > 120 ? "..." : "");
                map_error(L, line_of(r, k), "the map names \"%s\", which the --init-from file "
                          "does not hold (expected one of its %d tensor names%s%s%s)", kq, r->n,
                          has ? "; did you mean \"" : "", has ? near : "", has ? "\"?" : "");
            }
        }
    } else {
        map_error(L, 0, "the map file returned %s (expected `return {CHECKPOINT_NAME = "
                  "MODEL_NAME, ...}` or `return function(name, shape) ... end`)",
                  ty == LUA_TNIL ? "nothing" : lua_pushfstring(L, "a %s", luaL_typename(L, m)));
    }
    lua_settop(L, m - 1);
    return 0;
}

InitMap *fe_init_map_text(const char *path, const char *text, size_t len,
                          const char *const *names, const Shape *shapes, int n, char *err,
                          size_t errlen)
{
    Script sc = {.text = text, .len = len};
    if (!fe_sandbox_limits(&sc, err, errlen))
        return NULL;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        text += 3, len -= 3;
    MapRun r = {.text = text, .len = len, .names = names, .shapes = shapes, .n = n};
    r.v = xcalloc((size_t)n + 1, sizeof *r.v);
    for (int i = 0; i < n; i++)
        r.v[i] = (InitMapEntry){.from = intern(names[i]), .to = intern(names[i])};
    Graph *g = ir_new(); /* the hook bounds a graph; a map builds none */
    Fe fe = {.g = g, .path = intern(path), .config_ref = LUA_NOREF, .groups_ref = LUA_NOREF,
             .frozen_ref = LUA_NOREF, .post = map_post, .keep_result = true,
             .result_ref = LUA_NOREF, .loss = -1, .mem_limit = sc.mem,
             .instr_limit = sc.instr, .ops_limit = sc.ops, .hook_period = FE_HOOK_PERIOD};
    snprintf(fe.chunk, sizeof fe.chunk, "@%s", path);
    lua_State *L = fe_sandbox_new(&fe);
    lua_pushlightuserdata(L, &r);
    lua_setfield(L, LUA_REGISTRYINDEX, ctx_key);
    lua_pushcfunction(L, fe_msgh_where); /* the map file's path and line */
    int h = lua_gettop(L);
    int st = fe_sandbox_run(L, &fe, &sc, text, len, h);
    bool ok = st == LUA_OK && !fe.mem_over && !fe.time_over;
    if (!ok) {
        if (fe.time_over)
            fe_time_message(fe.path, fe.stop_line ? fe.stop_line : fe.last_line, fe.seconds,
                            err, errlen);
        else if (fe.mem_over)
            fe_mem_message(&fe, fe.stop_line ? fe.stop_line : fe.last_line, err, errlen);
        else if (lua_tostring(L, -1))
            snprintf(err, errlen, "%s", lua_tostring(L, -1));
        else
            snprintf(err, errlen, "%s:%d: error in the map file", fe.path, fe.last_line);
    }
    lua_close(L);
    ir_free(g);
    if (!ok) {
        free(r.v);
        return NULL;
    }
    InitMap *m = xcalloc(1, sizeof *m);
    m->path = fe.path;
    m->v = r.v;
    m->n = n;
    return m;
}

InitMap *fe_init_map(const char *path, const char *const *names, const Shape *shapes, int n,
                     char *err, size_t errlen)
{
    Script sc = {0};
    if (!fe_sandbox_limits(&sc, err, errlen))
        return NULL;
    size_t len;
    char *text = fe_read_lua_file("--init-map ", path, "the map file", sc.mem, &len, err, errlen);
    if (!text)
        return NULL;
    InitMap *m = fe_init_map_text(path, text, len, names, shapes, n, err, errlen);
    free(text);
    return m;
}

void fe_init_map_free(InitMap *m)
{
    if (!m)
        return;
    free(m->v);
    free(m);
}
