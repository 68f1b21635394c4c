/* fe_internal.h - what frontend.c (the model runner), declare.c (the graph
 * inputs, params and outputs), ops.c (the tensor primitives) and settings.c
 * (the train{} keys) share; not for other layers (their header is
 * frontend.h). */
#ifndef KILN_FE_INTERNAL_H
#define KILN_FE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lua.h>

#include "frontend.h"

/* The frontend's part of a Model (Model.priv): the config{} values and the
 * strings the model owns (TrainCfg's text values). */
typedef struct {
    const char *key;   /* config{} key */
    const char *value; /* its final value, as text ("2", "0.1", "tiny", "true") */
} FeConfigItem;
struct ModelPriv {
    FeConfigItem *config; /* sorted by key */
    int nconfig;
    struct FeOwned *owned; /* settings.c */
    VEC(const char *) train_outs; /* output(name, t, {train = true}): interned names
                                     the training step keeps however large */
    PassParamOpt *param_opts; /* train.param_opts (frontend.c: resolve_groups) */
};

/* Metatable of param initializers: userdata holding a ParamInit. */
#define INIT_MT "kiln.init"

/* A param's tensor id (before ir_compact) and its param() line. */
typedef struct {
    int t, line;
} FeParamLine;

/* One run of a script; the Lua state's extra space points at it. */
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
    /* train{param_groups, frozen}: registry refs of the checked tables
     * (LUA_NOREF: none) and the lines that set them */
    int groups_ref, frozen_ref, groups_line, frozen_line;
    /* run by fe_sandbox_run after the script, under its bounds (a Lua
     * pattern of train{param_groups, frozen} may backtrack): NULL none */
    lua_CFunction post;
    /* keep_result: the chunk's first result goes to the registry as
     * result_ref before post runs (an --init-map file returns its map) */
    bool keep_result;
    int result_ref;
    int next_key;      /* random op keys */
    /* the sandbox (frontend.c): Lua's own allocations and instructions are
     * bounded; kiln's graph memory is not Lua's and is not counted */
    lua_State *L;
    size_t mem_used;       /* bytes Lua's allocator holds */
    size_t mem_limit;      /* bytes allowed once mem_armed (the script runs) */
    size_t mem_base;       /* bytes held when armed (Lua's libraries, nn): not counted */
    bool mem_armed, mem_over; /* mem_over: the script went past mem_limit */
    _Atomic bool late;     /* set by the watchdog thread at KILN_LUA_SECONDS */
    bool time_over;        /* the hook or the allocator saw late: the run stops */
    int64_t seconds;       /* the wall-clock bound, for the message */
    int64_t instr_limit;   /* Lua instructions the script may run */
    int ops_limit;         /* ops the graph may hold (tensors: twice as many) */
    int64_t instr;         /* instructions run, counted per hook period */
    int hook_period;       /* instructions between two calls of the count hook */
    int last_line;         /* the user's line at the last call of the hook */
    int stop_line;         /* the user's line where a bound was crossed; 0: none yet */
    VEC(FeParamLine) params; /* each param's tensor and script line */
    /* decode mode (fe_load_decode, docs/inference.md): > 0 is the step's
     * length S, the time axis "T" of inputs and of iota is S long, iota
     * along it counts from the input decode_pos (i32[]) */
    int64_t decode_len;
    int decode_pos;
    int decode_states; /* kv_cache.N state tensors made so far */
    bool evaluating;   /* the evaluation graph's run (nn.training = false): assign is a no-op */
} Fe;

static inline Fe *fe_get(lua_State *L) { return *(Fe **)lua_getextraspace(L); }

/* A shape as text for messages, e.g. "f32[4,64]"; needs lua_State *L in scope. */
#define SSTR(s) shape_str(fe_get(L)->g, (s), (char[160]){0}, 160)

/* ---- frontend.c ----------------------------------------------------------- */

/* The nearest stack frame that belongs to the user's script. */
SrcLoc fe_user_loc(lua_State *L);
/* Raises "FILE:LINE: msg" at the user's line. */
int fe_error(lua_State *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A message handler (lua_pcall's): the error names fe->path and the line
 * in its chunk (fe->chunk) where it was raised; a DSL error that already
 * names the path is kept, a missing function gets its hint. */
int fe_msgh_where(lua_State *L);

/* The name in list (names separated by ", ") nearest to name, written into
 * out (n bytes): the same but for case, within a third of name's length in
 * edits (at least 2; 1 for names of up to 3 characters), or a prefix either
 * way; false (out empty) when none is that near. */
bool fe_closest_key(const char *name, const char *list, char *out, size_t n);

/* Checks an options table at idx (none or nil: nothing to check) against
 * spec, words "key:type" separated by spaces, where type is boolean, flag
 * (boolean or number), number, integer, string, init, tensor or function
 * (anything callable), or "-" for an option kiln documents but does not
 * implement. Raises an error at the user's line, naming fn, for a value
 * that is not a table, a key that is not a string, an unknown key (with
 * the closest accepted key and the list), an unsupported key and a value
 * of the wrong type. nil values are absent options. */
void fe_check_opts(lua_State *L, int idx, const char *fn, const char *spec);

/* The text of the Lua file at path (NUL-terminated, *len bytes), a regular
 * file of at most max bytes (the Lua memory limit), read without blocking
 * on a FIFO. NULL with err set otherwise: "FLAGPATH: ... NOUN ..." (flag
 * "" for the model script, "--init-map " for a map file; noun "the model
 * script", "the map file"). */
char *fe_read_lua_file(const char *flag, const char *path, const char *noun, size_t max,
                       size_t *len, char *err, size_t errlen);
/* qsort's comparison of two const char * (strcmp order). */
int fe_cmp_str(const void *a, const void *b);

/* ---- config.c: config{}, --set and train{} -------------------------------- */

/* config{defaults} and train{keys} (the DSL globals of those names). */
int fe_dsl_config(lua_State *L);
int fe_dsl_train(lua_State *L);
/* fe->post: matches train{}'s frozen params and param groups against the
 * graph's params after the script ran, in the sandbox's bounds; an error
 * is raised as the message (it names the script's line). */
int fe_resolve_groups(lua_State *L);
/* The KEY of a --set "KEY=VALUE" into key (keylen bytes, cut to fit); its
 * VALUE, or NULL when set has no '='. */
const char *fe_set_value(const char *set, char *key, size_t keylen);
/* For a message about a bad value (at idx) that a --set may have given:
 * ", from --set KEY=VALUE" when config key KEY, changed by that --set, holds
 * that very value, else "". Written into buf (n bytes), which it returns. */
const char *fe_set_origin(lua_State *L, int idx, char *buf, size_t n);

/* ---- declare.c: the DSL's declarations ------------------------------------ */

/* The Lua C functions of the DSL's globals input(name, shape [, dtype]),
 * param(name, shape, init [, dtype]), state(...), assign(s, v), the
 * initializers zeros(), ones(), normal(std) and uniform(a, b) (fe_dsl_init:
 * its InitKind in upvalue 1), sym{...}, minimize(loss), output(name, t
 * [, {train}]), padded_rows(w, n), shard(w, axis [, blocks]) and
 * pp_stage(x, i); in decode mode, nn.decode.state(x) and
 * nn.decode.update(state, value). frontend.c registers them. */
int fe_dsl_input(lua_State *L);
int fe_dsl_param(lua_State *L);
int fe_dsl_state(lua_State *L);
int fe_dsl_assign(lua_State *L);
int fe_dsl_init(lua_State *L);
int fe_dsl_sym(lua_State *L);
int fe_dsl_minimize(lua_State *L);
int fe_dsl_output(lua_State *L);
int fe_dsl_padded_rows(lua_State *L);
int fe_dsl_shard(lua_State *L);
int fe_dsl_pp_stage(lua_State *L);
int fe_dsl_decode_state(lua_State *L);
int fe_dsl_decode_update(lua_State *L);

/* ---- ops.c ---------------------------------------------------------------- */

/* Pushes a tensor userdata for tensor id of the graph. */
void fe_push_tensor(lua_State *L, int id);
/* The tensor id at idx; raises "fn: argument idx must be a tensor (got ...)"
 * when it is not a tensor. */
int fe_check_tensor(lua_State *L, int idx, const char *fn);
Shape fe_tshape(lua_State *L, int id);
/* The dtype named at idx; def when idx is none or nil. */
int fe_parse_dtype(lua_State *L, int idx, DType def, const char *fn);
/* A shape argument: a table of positive integers (or names declared with
 * sym{}). Returns the rank; names[i] (when names is not NULL) is the
 * interned sym name dim i was written as, or NULL for a number. */
int fe_parse_shape(lua_State *L, int idx, int64_t *dim, const char **names, const char *fn);
/* shape_make(dt, rank, dim), or an error at the script's line when the
 * shape is too large (ir_shape_check). */
Shape fe_checked_shape(lua_State *L, DType dt, int rank, const int64_t *dim, const char *fn);

/* A global fe_open_ops registers for the runner: f, with one integer upvalue
 * when up >= 0. */
typedef struct {
    const char *name;
    lua_CFunction f;
    int up;
} FeGlobal;
/* Registers the tensor primitives as globals (and as tensor methods), then
 * extra's globals in order (up to a NULL name), then select/where and the
 * tensor and init metatables. Leaves the stack as it found it. */
void fe_open_ops(lua_State *L, const FeGlobal *extra);


/* ---- sandbox.c: the Lua state a model script runs in ---------------------- */

/* A script and its bounds (fe_sandbox_limits). */
typedef struct {
    const char *text; /* the script's source, len bytes */
    size_t len;
    int64_t instr;    /* the bounds */
    size_t mem;
    int ops;
    int64_t seconds;  /* wall clock: KILN_LUA_SECONDS */
} Script;

#define FE_HOOK_PERIOD 100 /* instructions between two calls of the count hook */

/* The bounds from the environment (KILN_LUA_INSTRUCTIONS, KILN_LUA_SECONDS,
 * KILN_LUA_MEMORY, KILN_MAX_OPS); false with err set when one is malformed. */
bool fe_sandbox_limits(Script *sc, char *err, size_t errlen);
/* A new Lua state for fe (fe->L): the sandbox's allocator, panic handler
 * and libraries, fe in its extra space. Dies when Lua cannot make one. */
lua_State *fe_sandbox_new(Fe *fe);
/* Runs the script text[0..len) under the sandbox's bounds (instructions,
 * memory, graph size, wall clock) with message handler h; Lua's status. */
int fe_sandbox_run(lua_State *L, Fe *fe, const Script *sc, const char *text, size_t len, int h);
/* Pushes the stand-in that getmetatable() returns for every value whose
 * metatable kiln made (put it in the metatable's __metatable field): a
 * userdata that reads as empty and raises an error on any write, so a
 * script never sees, and never writes, those tables. */
void fe_push_locked(lua_State *L);
/* The error for a script past its memory bound at line. */
void fe_mem_message(const Fe *fe, int line, char *buf, size_t n);
/* The error for a script past its wall-clock bound at line. */
void fe_time_message(const char *path, int line, int64_t seconds, char *buf, size_t n);

#endif
