#!/bin/bash
# hostile model scripts: bytecode through load (string, mode "b", reader), string.dump
# no file or OS access: dofile, loadfile, io, os, require, package.loadlib; a FIFO as script
# bounds: an endless loop (KILN_LUA_INSTRUCTIONS), a pattern that backtracks (KILN_LUA_SECONDS), a table bomb (KILN_LUA_MEMORY), a graph
#   without end (KILN_MAX_OPS), bad bounds; a name declared twice after a caught failure
# integer flags: --threads, --nproc (train, compile), --steps out of range or not integers
# integer settings: --set grad_accum, steps, eval_batches, seed; train{} values at their line
# a model without params (the minimize line)
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

B=tests/data/bad
fast=(env KILN_LUA_INSTRUCTIONS=1000000 KILN_LUA_MEMORY=8MiB)

# the sandbox: each error at the script's line
expect_error "$B/sandbox_load_binary.lua:4: load: model scripts may load text chunks only" \
    "binary chunk" -- "$KILN" train "$B/sandbox_load_binary.lua" --steps 1
expect_error "$B/sandbox_load_mode.lua:3: load:" 'expected mode "t", got "b"' -- \
    "$KILN" compile "$B/sandbox_load_mode.lua"
expect_error "$B/sandbox_load_reader.lua:5: load:" "binary chunk" -- \
    "$KILN" compile "$B/sandbox_load_reader.lua"
expect_error "$B/sandbox_dump.lua:3: string.dump: not available" -- \
    "$KILN" compile "$B/sandbox_dump.lua"
expect_error "$B/sandbox_dofile.lua:3: dofile: model scripts have no file access" -- \
    "$KILN" train "$B/sandbox_dofile.lua"
expect_error "$B/sandbox_loadfile.lua:3: loadfile: model scripts have no file access" -- \
    "$KILN" compile "$B/sandbox_loadfile.lua"
expect_error "$B/sandbox_io.lua:3: io.open: model scripts have no file access" -- \
    "$KILN" compile "$B/sandbox_io.lua"
expect_error "$B/sandbox_os.lua:3: os.execute: model scripts have no access to the operating" -- \
    "$KILN" compile "$B/sandbox_os.lua"
[ -e /tmp/kiln-sandbox-escaped ] && fail "os.execute ran"
expect_error "$B/sandbox_require.lua:3: require: model scripts cannot load modules" -- \
    "$KILN" compile "$B/sandbox_require.lua"
expect_error "$B/sandbox_loadlib.lua:3: package.loadlib: model scripts cannot load" -- \
    "$KILN" compile "$B/sandbox_loadlib.lua"
expect_error "$B/sandbox_gc.lua:3: setmetatable: __gc finalizers are not available" -- \
    "$KILN" compile "$B/sandbox_gc.lua"
mkfifo "$dir/model.lua"
expect_error -t 20 "$dir/model.lua: cannot read the model script (expected a Lua file, got a FIFO)" \
    -- "$KILN" train "$dir/model.lua"

# the bounds, small here so that the cases are fast
expect_error -t 60 "$B/sandbox_loop.lua:4: the script ran for more than 1000000 Lua instructions" \
    "endless loop" -- "${fast[@]}" "$KILN" train "$B/sandbox_loop.lua"
expect_error -t 60 "$B/sandbox_pcall_loop.lua:3: the script ran for more than 1000000 Lua" -- \
    "${fast[@]}" "$KILN" compile "$B/sandbox_pcall_loop.lua"
expect_error -t 60 "$B/sandbox_bomb.lua:6: the script used more than 8 MiB of Lua memory" -- \
    env KILN_LUA_MEMORY=8MiB "$KILN" train "$B/sandbox_bomb.lua"
expect_error -t 60 "$B/sandbox_bigstring.lua:3: the script used more than 8 MiB of Lua memory" -- \
    "${fast[@]}" "$KILN" compile "$B/sandbox_bigstring.lua"
expect_error -t 60 "$B/sandbox_graph.lua:5: the script built a graph of more than 10000 ops" -- \
    env KILN_MAX_OPS=10000 "$KILN" compile "$B/sandbox_graph.lua"
expect_error "$B/dup_name.lua:5: param: the name 'w' is already used" -- \
    "$KILN" compile "$B/dup_name.lua"
expect_error "KILN_LUA_MEMORY: expected a size of at least 64KiB" "got 'lots'" -- \
    env KILN_LUA_MEMORY=lots "$KILN" compile models/mlp.lua
expect_error "KILN_LUA_INSTRUCTIONS: expected an integer from 1000 to" "got 1e99" -- \
    env KILN_LUA_INSTRUCTIONS=1e99 "$KILN" compile models/mlp.lua

# integer flags: a bad command line (status 2), never a wrap-around
expect_error -s 2 "kiln train: --threads: expected an integer from 1 to 256, got 4294967297" -- \
    "$KILN" train models/mlp.lua --steps 1 --threads 4294967297
expect_error -s 2 "--threads: expected an integer from 1 to 256, got 1.5" -- \
    "$KILN" train models/mlp.lua --steps 1 --threads=1.5
expect_error -s 2 "kiln train: --nproc: expected an integer from 1 to 1024, got 4294967297" -- \
    "$KILN" train models/mlp.lua --steps 1 --nproc 4294967297
expect_error -s 2 "kiln compile: --nproc: expected an integer from 1 to 1024, got 4294967298" -- \
    "$KILN" compile models/mlp.lua --nproc 4294967298
expect_error -s 2 "kiln train: --steps: expected an integer from 1 to 1000000000, got 1e12" -- \
    "$KILN" train models/mlp.lua --steps 1e12
expect_error -s 2 "--steps: expected an integer from 1 to 1000000000, got -1" -- \
    "$KILN" train models/mlp.lua --steps -1
expect_error -s 2 "--steps: expected an integer from 1 to 1000000000, got 4x" -- \
    "$KILN" train models/mlp.lua --steps 4x
expect_error -s 2 "--steps: expected an integer from 1 to 1000000000, got an empty value" -- \
    "$KILN" train models/mlp.lua --steps=
expect_error -s 2 "--peak-gflops expects a positive number, got: inf" -- \
    "$KILN" train models/mlp.lua --steps 1 --peak-gflops inf

# integer settings: --set, and train{} values at the train{} line
expect_error "--set grad_accum: expected an integer from 1 to 1024, got 4294967297" -- \
    "$KILN" train models/mlp.lua --steps 1 --set grad_accum=4294967297
expect_error "--set eval_batches: expected an integer from 1 to 1000000000 or \"all\", got 1000000001" -- \
    "$KILN" train models/mlp.lua --steps 1 --set eval_batches=1000000001
expect_error "--set seed: expected an integer from 0 to 18446744073709551615, got 7x" -- \
    "$KILN" train models/mlp.lua --steps 1 --set seed=7x
expect_error "--set warmup: expected an integer from 0 to 1000000000, got nan" -- \
    "$KILN" train models/mlp.lua --steps 1 --set warmup=nan
expect_error "models/mlp.lua:31: train: bad value for 'steps' (expected an integer from 0 to" \
    "got -1" -- "$KILN" train models/mlp.lua --set steps=-1
expect_error "$B/train_wrap.lua:3: train: bad value for 'grad_accum' (expected an integer from 1" \
    "got 4294967297" -- "$KILN" train "$B/train_wrap.lua"
expect_error "$B/train_fraction.lua:3: train: bad value for 'steps'" "got 2.5" -- \
    "$KILN" compile "$B/train_fraction.lua"
# one library call that never returns (a backtracking pattern): the
# wall-clock bound stops it, naming the script's line
expect_error -t 30 "$B/pattern_hang.lua:4: the model script ran for more than 2 s and was stopped" -- \
    env KILN_LUA_SECONDS=2 "$KILN" compile "$B/pattern_hang.lua"
expect_error "KILN_LUA_SECONDS: " -- env KILN_LUA_SECONDS=0 "$KILN" compile models/mlp.lua
# a model with no param at all: the loss's line, not the optimizer pass
expect_error "$B/no_params.lua:3: the loss depends on no parameter, so there is nothing to train" -- \
    "$KILN" compile "$B/no_params.lua"
# a function kiln does not have: said plainly, with the closest names
expect_error "$B/missing_function.lua:3: 'cosh' is not a kiln function or a global of this script; closest: cos" -- \
    "$KILN" compile "$B/missing_function.lua"
expect_error "$B/missing_nn_function.lua:4: 'softmx' is nil where it is called (nn has no such function); closest in nn: softmax" -- \
    "$KILN" compile "$B/missing_nn_function.lua"
# nn.attention checks its arguments and reports at the caller's line
expect_error "$B/attention_rank.lua:3: nn.attention: q must be a tensor [..., T, D] of rank >= 2 (expected e.g. [B, H, T, D], got f32[8])" -- \
    "$KILN" compile "$B/attention_rank.lua"
expect_error "$B/attention_causal_lengths.lua:5: nn.attention: causal attention needs as many keys as queries (expected Tk = 4, got k f32[2,5,8])" -- \
    "$KILN" compile "$B/attention_causal_lengths.lua"
# params the loss never reaches are warnings at their param() line, once
"$KILN" compile tests/data/unused_params.lua > "$dir/out.log" 2> "$dir/warn.log" ||
    fail "unused_params.lua: compile failed: $(cat "$dir/warn.log")"
grep -qF "tests/data/unused_params.lua:4: warning: param 'unused' is never used" "$dir/warn.log" ||
    fail "no warning for the unused param: $(cat "$dir/warn.log")"
grep -qF "tests/data/unused_params.lua:5: warning: param 'side' does not affect the loss" "$dir/warn.log" ||
    fail "no warning for the param outside the loss: $(cat "$dir/warn.log")"
[ "$(grep -c warning "$dir/warn.log")" = 2 ] || fail "expected two warnings: $(cat "$dir/warn.log")"
"$KILN" compile models/gpt.lua > /dev/null 2> "$dir/warn.log" || fail "gpt.lua failed"
[ ! -s "$dir/warn.log" ] || fail "gpt.lua warns: $(cat "$dir/warn.log")"
bad_input_done
