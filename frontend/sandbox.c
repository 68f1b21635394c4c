/* sandbox.c - the model script's sandbox (fe_internal.h): the Lua state a
 * script runs in, its libraries and its bounds. */
#include "fe_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* ---- the sandbox ----------------------------------------------------------
 * A model script only builds a graph. It gets the base, math, string, table
 * and utf8 libraries and the DSL, and nothing that reaches outside the Lua
 * state: no io, os, package or debug library, no dofile, loadfile or require
 * (kiln opens data, weights and checkpoints itself), load of text chunks
 * only (bytecode is never loaded: mutated bytecode is not checked by Lua),
 * no string.dump, no __gc finalizers (they would run after the script,
 * where Lua runs them with hooks off and no bound holds): setmetatable
 * refuses a metatable with __gc, and every metatable kiln makes (tensors,
 * initializers, strings, the denied libraries, nn's layers) is locked
 * (getmetatable gives a read-only stand-in, fe_push_locked), so none can
 * gain __gc later.
 * Its Lua memory, its instructions and the size of the graph it builds are
 * bounded; past a bound the script stops with an error at its line. A
 * library call (a string pattern that backtracks, string.format of a long
 * string, the parser reading what a load() reader returns) runs no Lua
 * instruction the count hook could stop, so a watchdog thread also bounds
 * the script's wall-clock time (KILN_LUA_SECONDS): at the bound it marks
 * the run late, and the hook (at the next instruction) and the allocator
 * (at the next allocation that grows Lua's memory, which fails) stop the
 * script with an error at its line; a call that neither runs an
 * instruction nor allocates for WATCHDOG_GRACE seconds more is stopped by
 * the watchdog itself: the process exits 1 with the same message. */

void fe_time_message(const char *path, int line, int64_t seconds, char *buf, size_t n)
{
    snprintf(buf, n, "%s:%d: the model script ran for more than %lld s and was stopped "
             "(expected it to build its graph in time; an endless loop, a string pattern that "
             "backtracks or a long library call? KILN_LUA_SECONDS raises the limit)", path, line,
             (long long)seconds);
}

void fe_mem_message(const Fe *fe, int line, char *buf, size_t n)
{
    char b[32];
    ir_fmt_bytes((double)fe->mem_limit, -1, b, sizeof b);
    snprintf(buf, n, "%s:%d: the script used more than %s of Lua memory (expected a model "
             "script that builds its graph in less; a table that grows without end? "
             "KILN_LUA_MEMORY raises the limit)", fe->path, line, b);
}

/* The hook (count and call events): the instruction bound, the memory bound
 * (reported at the first instruction after the allocation that crossed it),
 * and the user's line for a memory error that Lua raises itself (one
 * allocation far past the bound). Once a bound is crossed it runs at every
 * instruction and raises the same error, naming the line where the bound was
 * crossed, so that a script catching the error with pcall stops at its next
 * instruction outside the pcall. */
static void sandbox_hook(lua_State *L, lua_Debug *ar)
{
    Fe *fe = fe_get(L);
    if (ar->event == LUA_HOOKCALL) {
        /* a C function may make one allocation past the bound (string.rep)
         * that Lua reports without a line: remember the caller's */
        lua_Debug caller;
        if (lua_getstack(L, 1, &caller) && lua_getinfo(L, "Sl", &caller) &&
            caller.currentline > 0 && strcmp(caller.source, fe->chunk) == 0)
            fe->last_line = caller.currentline;
        return;
    }
    bool over_graph = false;
    if (!fe->mem_over && !fe->time_over) {
        fe->time_over = atomic_load_explicit(&fe->late, memory_order_relaxed);
        fe->instr += fe->hook_period;
        over_graph = fe->g->ops.n > fe->ops_limit || fe->g->t.n > 2 * fe->ops_limit;
        if (!fe->time_over && fe->instr <= fe->instr_limit && !over_graph) {
            fe->last_line = fe_user_loc(L).line;
            return;
        }
    }
    if (fe->hook_period != 1) {
        fe->hook_period = 1;
        lua_sethook(L, sandbox_hook, LUA_MASKCOUNT, 1);
    }
    if (!fe->stop_line)
        fe->stop_line = fe_user_loc(L).line;
    char msg[512];
    if (fe->mem_over)
        fe_mem_message(fe, fe->stop_line, msg, sizeof msg);
    else if (fe->time_over)
        fe_time_message(fe->path, fe->stop_line, fe->seconds, msg, sizeof msg);
    else if (over_graph)
        snprintf(msg, sizeof msg, "%s:%d: the script built a graph of more than %d ops or %d "
                 "tensors (expected a model of at most that many forward ops; a loop that "
                 "never ends? KILN_MAX_OPS raises the limit)", fe->path, fe->stop_line,
                 fe->ops_limit, 2 * fe->ops_limit);
    else
        snprintf(msg, sizeof msg, "%s:%d: the script ran for more than %lld Lua instructions "
                 "(expected a model script that finishes; an endless loop? "
                 "KILN_LUA_INSTRUCTIONS raises the limit)", fe->path, fe->stop_line,
                 (long long)fe->instr_limit);
    lua_pushstring(L, msg);
    lua_error(L);
}

/* Lua's allocator: counts the bytes Lua holds. Past mem_limit (beyond
 * mem_base, what the state held before the script: the libraries) it marks the
 * run (the hook raises the error at the script's line) and still allows a
 * quarter more, so the error can be built; beyond that it fails and Lua
 * raises its own memory error. Once the run is late (past KILN_LUA_SECONDS)
 * every growth fails, which stops a library call that allocates as it
 * goes. Shrinking never fails. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    Fe *fe = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        fe->mem_used -= old;
        return NULL;
    }
    if (nsize > old && fe->mem_armed && atomic_load_explicit(&fe->late, memory_order_relaxed)) {
        if (!fe->time_over && !fe->mem_over) {
            fe->time_over = true;
            fe->hook_period = 1;
            lua_sethook(fe->L, sandbox_hook, LUA_MASKCOUNT, 1);
        }
        return NULL;
    }
    if (nsize > old && fe->mem_armed) {
        size_t lim = fe->mem_limit + fe->mem_base, hard = lim + fe->mem_limit / 4;
        size_t grow = nsize - old;
        if (grow > lim - fe->mem_used || fe->mem_used > lim) {
            if (!fe->mem_over) {
                fe->mem_over = true;
                fe->hook_period = 1;
                lua_sethook(fe->L, sandbox_hook, LUA_MASKCOUNT, 1);
            }
            if (fe->mem_used > hard || grow > hard - fe->mem_used)
                return NULL;
        }
    }
    void *p = realloc(ptr, nsize);
    if (p)
        fe->mem_used = fe->mem_used - old + nsize;
    return p;
}

static int l_denied(lua_State *L)
{
    return fe_error(L, "%s: %s", lua_tostring(L, lua_upvalueindex(1)),
                    lua_tostring(L, lua_upvalueindex(2)));
}

static const char no_files[] =
    "model scripts have no file access (expected a script that builds its model with the "
    "DSL; kiln opens the data (train.data_path), weights and checkpoints itself)";
static const char no_os[] =
    "model scripts have no access to the operating system (no programs, environment, clock "
    "or files: a script builds the same model on every run)";

#define LOCKED_KEY "kiln.locked"

static int l_locked_index(lua_State *L)
{
    lua_pushnil(L);
    return 1;
}

static int l_locked_newindex(lua_State *L)
{
    return fe_error(L, "the metatables of kiln's values (tensors, initializers, strings, nn "
                       "layers) are locked: getmetatable gives a read-only stand-in (expected "
                       "no write to it, got a write of '%s')", luaL_tolstring(L, 2, NULL));
}

static int l_locked_tostring(lua_State *L)
{
    lua_pushliteral(L, "locked metatable");
    return 1;
}

void fe_push_locked(lua_State *L)
{
    if (lua_getfield(L, LUA_REGISTRYINDEX, LOCKED_KEY) != LUA_TNIL)
        return;
    lua_pop(L, 1);
    lua_newuserdatauv(L, 0, 0);
    lua_createtable(L, 0, 4);
    lua_pushcfunction(L, l_locked_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_locked_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, l_locked_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "__metatable"); /* the stand-in stands in for itself */
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, LOCKED_KEY);
}

static void push_denied(lua_State *L, const char *name, const char *why)
{
    lua_pushstring(L, name);
    lua_pushstring(L, why);
    lua_pushcclosure(L, l_denied, 2);
}

/* __index of the stand-ins for io, os and package: every field is a function
 * that raises the library's reason ("io.open: model scripts have no ..."). */
static int l_denied_index(lua_State *L)
{
    lua_pushfstring(L, "%s.%s", lua_tostring(L, lua_upvalueindex(1)), luaL_tolstring(L, 2, NULL));
    push_denied(L, lua_tostring(L, -1), lua_tostring(L, lua_upvalueindex(2)));
    return 1;
}

static void set_denied_lib(lua_State *L, const char *name, const char *why)
{
    lua_newtable(L);
    lua_newtable(L);
    lua_pushstring(L, name);
    lua_pushstring(L, why);
    lua_pushcclosure(L, l_denied_index, 2);
    lua_setfield(L, -2, "__index");
    fe_push_locked(L);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_setglobal(L, name);
}

/* The reader load() gets in place of the script's (upvalue 1): passes its
 * pieces on and counts their bytes (upvalue 2); past the memory bound it
 * raises, which ends the parse (l_load then reports it). */
static int l_load_reader(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_call(L, 0, 1);
    if (lua_type(L, -1) == LUA_TSTRING) {
        lua_Integer got = lua_tointeger(L, lua_upvalueindex(2));
        size_t len = lua_rawlen(L, -1);
        if (len > fe_get(L)->mem_limit - (size_t)got) {
            lua_pushinteger(L, -1); /* the mark l_load looks for */
            lua_replace(L, lua_upvalueindex(2));
            return luaL_error(L, "the reader went past the memory bound");
        }
        lua_pushinteger(L, got + (lua_Integer)len);
        lua_replace(L, lua_upvalueindex(2));
    }
    return 1;
}

/* load(chunk [, name [, mode [, env]]]) with mode "t" always: a binary chunk
 * (or a mode other than "t") is an error at the script's line, and so is a
 * reader function that returns more text than the Lua memory bound (the
 * parser skips blanks and comments without allocating: only the clock would
 * stop it). */
static int l_load(lua_State *L)
{
    int n = lua_gettop(L);
    if (n >= 3 && !lua_isnil(L, 3) &&
        (lua_type(L, 3) != LUA_TSTRING || strcmp(lua_tostring(L, 3), "t") != 0))
        return fe_error(L, "load: model scripts may load text chunks only (expected mode \"t\", "
                           "got \"%s\")", luaL_tolstring(L, 3, NULL));
    bool reader = lua_type(L, 1) == LUA_TFUNCTION;
    if (reader) {
        lua_pushvalue(L, 1);
        lua_pushinteger(L, 0);
        lua_pushcclosure(L, l_load_reader, 2);
        lua_replace(L, 1);
    }
    int nargs = n > 3 ? n : 3; /* an env argument, even nil, stays: it means _ENV = nil */
    lua_settop(L, nargs);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    if (reader) { /* the counting reader stays below the call, for its mark */
        lua_pushvalue(L, 2);
        lua_insert(L, 1);
    }
    lua_call(L, nargs, 2);
    bool past = false;
    if (reader && lua_isnil(L, -2)) {
        lua_getupvalue(L, 1, 2);
        past = lua_tointeger(L, -1) < 0;
        lua_pop(L, 1);
    }
    if (past) {
        char b[32];
        ir_fmt_bytes((double)fe_get(L)->mem_limit, -1, b, sizeof b);
        return fe_error(L, "load: the reader function returned more than %s of text (expected "
                           "a chunk no larger than the Lua memory bound; KILN_LUA_MEMORY raises "
                           "it)", b);
    }
    if (lua_isnil(L, -2) && lua_type(L, -1) == LUA_TSTRING &&
        strstr(lua_tostring(L, -1), "attempt to load a binary chunk"))
        return fe_error(L, "load: model scripts may load text chunks only (expected Lua "
                           "source, got a binary chunk)");
    return 2;
}

/* setmetatable without __gc: a finalizer would run Lua code after the
 * script, while kiln reads or frees its graph. */
static int l_setmetatable(lua_State *L)
{
    if (lua_istable(L, 2)) {
        lua_pushliteral(L, "__gc");
        bool gc = lua_rawget(L, 2) != LUA_TNIL;
        lua_pop(L, 1);
        if (gc)
            return fe_error(L, "setmetatable: __gc finalizers are not available to model "
                               "scripts (expected a metatable without __gc)");
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* Replaces the global (or string.) function name with f, which gets the
 * original as its upvalue. */
static void wrap_global(lua_State *L, const char *name, lua_CFunction f)
{
    lua_getglobal(L, name);
    lua_pushcclosure(L, f, 1);
    lua_setglobal(L, name);
}

static void open_sandbox(lua_State *L)
{
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
    lua_settop(L, 0);
    /* the same random numbers on every run (Lua seeds math.random from the
     * clock): a script builds the same model each time, and its evaluation
     * graph's run matches the training graph's */
    lua_getglobal(L, "math");
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, 1337);
    lua_call(L, 1, 0);
    lua_pop(L, 1);
    wrap_global(L, "load", l_load);
    wrap_global(L, "setmetatable", l_setmetatable);
    push_denied(L, "dofile", no_files);
    lua_setglobal(L, "dofile");
    push_denied(L, "loadfile", no_files);
    lua_setglobal(L, "loadfile");
    push_denied(L, "require", "model scripts cannot load modules (no file access; the nn "
                              "library is built in as the global nn)");
    lua_setglobal(L, "require");
    lua_getglobal(L, "string");
    push_denied(L, "string.dump", "not available to model scripts (kiln loads text chunks "
                                  "only, never bytecode)");
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    set_denied_lib(L, "io", no_files);
    set_denied_lib(L, "os", no_os);
    set_denied_lib(L, "package", "model scripts cannot load modules or C libraries (no file "
                                 "access)");
    set_denied_lib(L, "debug", "not available to model scripts");
    /* the strings' metatable is shared with kiln's own Lua (nn.lua): locked */
    lua_pushliteral(L, "");
    lua_getmetatable(L, -1);
    fe_push_locked(L);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 2);
}

/* The bounds from the environment: KILN_LUA_INSTRUCTIONS (default 2e8),
 * KILN_LUA_SECONDS (default 20 s of wall clock), KILN_LUA_MEMORY (default
 * 64 MiB) and KILN_MAX_OPS (default 2^20 forward ops, about 0.5 GiB of
 * graph). The slowest script of models/ and tests/ (models/llama.lua at its
 * 500B preset) runs in 0.05 s, 1.5e5 instructions and 0.3 MiB of Lua
 * memory (docs/dsl.md, Sandbox): the defaults are 400x, 1000x and 200x
 * that. False with err set when one is malformed. */
bool fe_sandbox_limits(Script *sc, char *err, size_t errlen)
{
    int64_t *instr = &sc->instr, ops = 1 << 20;
    size_t *mem = &sc->mem;
    *instr = 200000000;
    *mem = (size_t)64 << 20;
    sc->seconds = 20;
    const char *v = getenv("KILN_MAX_OPS");
    char why[256];
    if (v && !fe_parse_int(v, 1000, 1 << 28, &ops, why, sizeof why)) {
        snprintf(err, errlen, "KILN_MAX_OPS: %s", why);
        return false;
    }
    sc->ops = (int)ops;
    v = getenv("KILN_LUA_INSTRUCTIONS");
    if (v && !fe_parse_int(v, 1000, (int64_t)1 << 50, instr, why, sizeof why)) {
        snprintf(err, errlen, "KILN_LUA_INSTRUCTIONS: %s", why);
        return false;
    }
    v = getenv("KILN_LUA_SECONDS");
    if (v && !fe_parse_int(v, 1, 1000000, &sc->seconds, why, sizeof why)) {
        snprintf(err, errlen, "KILN_LUA_SECONDS: %s", why);
        return false;
    }
    v = getenv("KILN_LUA_MEMORY");
    if (v) {
        int64_t b = ir_parse_bytes(v);
        if (b < (1 << 16) || (uint64_t)b > (uint64_t)(SIZE_MAX / 4)) {
            snprintf(err, errlen, "KILN_LUA_MEMORY: expected a size of at least 64KiB such as "
                     "512MiB or 4GiB, got '%s'", v);
            return false;
        }
        *mem = (size_t)b;
    }
    return true;
}

/* The wall-clock bound: a thread that waits for the script to finish; at
 * the bound it marks the run late (the hook and the allocator stop the
 * script), and when the script is still running WATCHDOG_GRACE seconds
 * later (one library call that neither runs Lua code nor allocates) it
 * ends the process (see the top of the sandbox). */
#define WATCHDOG_GRACE 1

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int64_t seconds;
    const char *path;
    volatile int *last_line;
    _Atomic bool *late;
} Watchdog;

/* Waits until the script is done or the clock reaches until; whether done. */
static bool watchdog_wait(Watchdog *w, const struct timespec *until)
{
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (!w->done && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&w->cv, &w->mu, until);
    bool done = w->done;
    pthread_mutex_unlock(&w->mu);
    return done;
}

static void *watchdog_main(void *arg)
{
    Watchdog *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)w->seconds;
    if (watchdog_wait(w, &until))
        return NULL;
    atomic_store(w->late, true);
    until.tv_sec += WATCHDOG_GRACE;
    if (watchdog_wait(w, &until))
        return NULL;
    char msg[512];
    fe_time_message(w->path, *w->last_line, w->seconds, msg, sizeof msg);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
    _exit(1);
}

static int panic(lua_State *L)
{
    die("Lua panic: %s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(no message)");
}

lua_State *fe_sandbox_new(Fe *fe)
{
    lua_State *L = lua_newstate(sandbox_alloc, fe);
    if (!L)
        die("cannot create a Lua state");
    fe->L = L;
    lua_atpanic(L, panic);
    *(Fe **)lua_getextraspace(L) = fe;
    open_sandbox(L);
    return L;
}

int fe_sandbox_run(lua_State *L, Fe *fe, const Script *sc, const char *text, size_t len, int h)
{
    fe->mem_base = fe->mem_used; /* the bound is the script's own memory */
    fe->mem_armed = true;
    fe->seconds = sc->seconds;
    Watchdog wd = {.seconds = sc->seconds, .path = fe->path, .last_line = &fe->last_line,
                   .late = &fe->late};
    pthread_mutex_init(&wd.mu, NULL);
    pthread_cond_init(&wd.cv, NULL);
    pthread_t wt;
    bool watched = pthread_create(&wt, NULL, watchdog_main, &wd) == 0;
    lua_sethook(L, sandbox_hook, LUA_MASKCOUNT | LUA_MASKCALL, FE_HOOK_PERIOD);
    int st;
    if (len && text[0] == LUA_SIGNATURE[0]) { /* what Lua takes for a binary chunk */
        lua_pushfstring(L, "%s: the model script is Lua bytecode (expected Lua source text; "
                        "kiln runs text scripts only, as Lua does not check bytecode)", fe->path);
        st = LUA_ERRSYNTAX;
    } else {
        st = luaL_loadbufferx(L, text, len, fe->chunk, "t");
    }
    if (st == LUA_OK)
        st = lua_pcall(L, 0, fe->keep_result ? 1 : 0, h);
    if (st == LUA_OK && fe->keep_result)
        fe->result_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (st == LUA_OK && fe->post) { /* under the same bounds as the script */
        lua_pushcfunction(L, fe->post);
        st = lua_pcall(L, 0, 0, h);
    }
    lua_sethook(L, NULL, 0, 0);
    if (watched) {
        pthread_mutex_lock(&wd.mu);
        wd.done = true;
        pthread_cond_signal(&wd.cv);
        pthread_mutex_unlock(&wd.mu);
        pthread_join(wt, NULL);
    }
    pthread_cond_destroy(&wd.cv);
    pthread_mutex_destroy(&wd.mu);
    fe->mem_armed = false;
    return st;
}
