/*
 * frontend.h - the model DSL: an embedded Lua 5.4 state runs a model script
 * (a file of models/) whose primitives build the FORWARD graph; the nn library
 * (frontend/nn.lua, global `nn`) builds layers from those primitives. The
 * public header of frontend/. The DSL itself is described in docs/dsl.md.
 *
 * The forward graph has an output "loss" (a scalar float, from minimize())
 * plus any outputs the script names with output(name, t). Every op carries
 * the file:line of the script line that created it (frames of embedded
 * library code are skipped).
 */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir.h"
#include "train_cfg.h"

/* ---- frontend.c: running a model script ----------------------------------
 * The result is a Model with its TrainCfg: types of runtime/train
 * (train_cfg.h), which the training loop owns and the frontend fills. Every
 * TrainCfg key is one row of a table (name, type, offset, default) that
 * train{} parsing, --set and printing all read (settings.c). */

/* Runs the model script in a sandbox (docs/dsl.md#sandbox): no file or OS
 * access, text chunks only, its Lua memory and instructions bounded by
 * KILN_LUA_MEMORY (default 1GiB) and KILN_LUA_INSTRUCTIONS (default 1e9).
 * sets are "key=value" strings from --set: a config{}
 * key overrides the script's default (typed: number, string, boolean as in
 * the default); otherwise a TrainCfg key overrides train{}; anything else is
 * an error. NULL on error with err = "FILE:LINE: what is wrong (expected ...,
 * got ...)" (or "--set KEY: ..." for a bad --set). */
Model *fe_load_model(const char *path, const char *const *sets, int nsets, char *err,
                     size_t errlen);
/* The same for a script given as text (len bytes; path names it in
 * messages and op locations). */
Model *fe_load_model_text(const char *path, const char *text, size_t len,
                          const char *const *sets, int nsets, char *err, size_t errlen);
void fe_model_free(Model *m);
/* Decode mode (kiln sample's KV cache, docs/inference.md): runs the script
 * a third time with nn.training = false and nn.decode = {len = len, pos =
 * the i32[] input "decode.pos", state, update}. Inputs' axes declared as
 * the symbol "T" are len long, iota along an axis declared "T" counts from
 * decode.pos, and nn.attention (causal) keeps k and v in state tensors
 * "kv_cache.N" [..., T, D] (zeros) updated at pos..pos+len-1 (len 1, or len
 * T at pos 0). The graph keeps the output "logits" only; *ncaches is its
 * number of cache tensors (0: the script's attention has no cache). NULL
 * with err set when the script fails in that mode. */
Graph *fe_load_decode(const char *path, const char *const *sets, int nsets, int64_t len,
                      int *ncaches, char *err, size_t errlen);
void fe_train_defaults(TrainCfg *t);
/* Print the config and train settings, one "key = value" per line, for
 * `kiln compile`: a "# config" section then a "# train" section. */
void fe_print_settings(const Model *m, FILE *f);
/* The final value of a config{} key as text, NULL if the script has none. */
const char *fe_config_get(const Model *m, const char *key);
/* An integer flag or setting: decimal digits with an optional sign ("12",
 * "-3"), or a number in exponent form that is an exact integer ("1e6").
 * True with *out set when s is such an integer from lo to hi; otherwise false
 * with why = "expected an integer from LO to HI, got 'S'" (no wrap-around:
 * "4294967297" is out of range, not 1; "1.5", "4x", "", "nan", "inf" are
 * not integers). */
bool fe_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out, char *why, size_t n);

/* ---- initmap.c: --init-map FILE.lua -----------------------------------
 * Runs the map file in the model scripts' sandbox (the same bounds; no DSL)
 * and returns one entry per tensor of the --init-from file (names[i] of
 * shape shapes[i], i < n): what it becomes in the model (docs/training.md,
 * Fine-tuning). The file returns a table {FILE_NAME = VALUE} (a key that
 * names no tensor of the file is an error) or a function(name, shape) ->
 * VALUE (nil: the same name), VALUE a param name, false (ignored) or
 * {to = NAME, transpose = true}. NULL on error with err = "MAP:LINE: what
 * is wrong (expected ...)". Whether the names exist in the model is the
 * loader's check (rt_init_from). */
InitMap *fe_init_map(const char *path, const char *const *names, const Shape *shapes, int n,
                     char *err, size_t errlen);
/* The same for a map given as text (len bytes; path names it). */
InitMap *fe_init_map_text(const char *path, const char *text, size_t len,
                          const char *const *names, const Shape *shapes, int n, char *err,
                          size_t errlen);
void fe_init_map_free(InitMap *m);

/* ---- settings.c: the TrainCfg key table, shared by train{}, --set and
 * printing (frontend.c reads it; not for other layers) ------------------- */
typedef enum { FE_TT_INT, FE_TT_U64, FE_TT_DBL, FE_TT_STR, FE_TT_BYTES } FeKeyType;

typedef struct {
    const char *name;
    FeKeyType type;
    size_t off;
    const char *def; /* default as text; NULL: none (strings only) */
    const char *oneof; /* strings: the allowed values, comma-separated; NULL: any */
    double lo, hi;   /* FE_TT_INT: the integers lo..hi; FE_TT_DBL: finite numbers from
                        lo to hi (+-INFINITY: unbounded), an end excluded where */
    bool lo_open, hi_open; /* lo_open / hi_open say so */
} FeTrainKey;
const FeTrainKey *fe_train_key(const char *name); /* NULL if unknown */
const char *fe_train_key_list(void);             /* "steps, lr, ..." */
/* Store a number / a text value ("512MiB", "true", ...) into key k of t;
 * false with `why` set when it does not fit the key's type. Text values are
 * copied into storage m owns. */
bool fe_train_store_num(TrainCfg *t, const FeTrainKey *k, double d, char *why, size_t n);
/* The same for an exact integer (a Lua integer). */
bool fe_train_store_int(TrainCfg *t, const FeTrainKey *k, int64_t v, char *why, size_t n);
bool fe_train_store_text(Model *m, TrainCfg *t, const FeTrainKey *k, const char *s,
                         bool from_set, char *why, size_t n);

#endif
