#!/bin/bash
# hostile model scripts, second round (issue 38):
# - metatables: the tensors', initializers', strings' and nn layers' are
#   locked (a __gc set there ran after the script, with Lua's hooks off: a
#   hang no bound stopped); a write caught with pcall leaves no finalizer
# - the default bounds stop, in seconds: a table of string keys without
#   end, a load() reader of 4 GiB of blanks, string.format("%q") of 64 MiB;
#   the clock stops library calls that allocate (at the script's line) and
#   one that does not (the watchdog)
# - config{} keys that are not names, values that are tables (presets too)
# - a script that is Lua bytecode, a syntax error under a long path, and a
#   --set value that the script refuses (sym{}, a shape): each names the
#   file, or the --set that gave the value; other errors list the --set
# Each case runs under a time limit, so a hang fails the test.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

B=tests/data/bad
locked="the metatables of kiln's values (tensors, initializers, strings, nn layers) are locked"

# metatables
expect_error -t 30 "$B/sandbox_gc_tensor_mt.lua:3: $locked" "got a write of '__gc'" -- \
    "$KILN" compile "$B/sandbox_gc_tensor_mt.lua"
expect_error -t 30 "$B/sandbox_gc_tensor_mt.lua:3: $locked" -- \
    "$KILN" train "$B/sandbox_gc_tensor_mt.lua" --steps 1
expect_error -t 30 "$B/sandbox_gc_init_mt.lua:3: bad argument #1 to 'rawset' (table expected, got userdata)" -- \
    "$KILN" compile "$B/sandbox_gc_init_mt.lua"
expect_error -t 30 "$B/sandbox_gc_string_mt.lua:3: $locked" "got a write of '__index'" -- \
    "$KILN" compile "$B/sandbox_gc_string_mt.lua"
expect_error -t 30 "$B/sandbox_gc_layer_mt.lua:4: $locked" "got a write of '__gc'" -- \
    "$KILN" compile "$B/sandbox_gc_layer_mt.lua"
bad_cases=$((bad_cases + 1))
timeout -s KILL 30 "$KILN" compile "$B/sandbox_gc_pcall.lua" > "$dir/out.log" 2>&1 < /dev/null ||
    fail "sandbox_gc_pcall.lua: exit $? (expected the model to build): $(tail -5 "$dir/out.log")"
case_log "$(basename "$0" .sh)" clear "compile $B/sandbox_gc_pcall.lua"

# the default bounds (no KILN_LUA_* set): each stops in seconds
expect_error -t 90 "$B/sandbox_table_keys.lua:5: the script used more than 64 MiB of Lua memory" -- \
    env -u KILN_LUA_MEMORY -u KILN_LUA_SECONDS -u KILN_LUA_INSTRUCTIONS \
    "$KILN" compile "$B/sandbox_table_keys.lua"
expect_error -t 90 "$B/sandbox_load_blanks.lua:6: load: the reader function returned more than 64 MiB of text" \
    "KILN_LUA_MEMORY raises it" -- \
    env -u KILN_LUA_MEMORY -u KILN_LUA_SECONDS -u KILN_LUA_INSTRUCTIONS \
    "$KILN" compile "$B/sandbox_load_blanks.lua"
expect_error -t 90 "$B/sandbox_format_q.lua:4: the script used more than 64 MiB of Lua memory" -- \
    env -u KILN_LUA_MEMORY -u KILN_LUA_SECONDS -u KILN_LUA_INSTRUCTIONS \
    "$KILN" compile "$B/sandbox_format_q.lua"
# the clock, small here: a call that allocates stops at the script's line,
# one that never allocates is ended by the watchdog (the same message)
expect_error -t 60 "$B/sandbox_clock.lua:5: the model script ran for more than 2 s and was stopped" \
    "KILN_LUA_SECONDS raises the limit" -- \
    env KILN_LUA_SECONDS=2 KILN_LUA_INSTRUCTIONS=1000000000000 "$KILN" compile "$B/sandbox_clock.lua"
expect_error -t 60 "$B/sandbox_table_move.lua:4: the model script ran for more than 2 s and was stopped" -- \
    env KILN_LUA_SECONDS=2 "$KILN" compile "$B/sandbox_table_move.lua"
# the reader's bound follows KILN_LUA_MEMORY
expect_error -t 60 "$B/sandbox_load_blanks.lua:6: load: the reader function returned more than 8 MiB of text" -- \
    env KILN_LUA_MEMORY=8MiB "$KILN" compile "$B/sandbox_load_blanks.lua"

# config{}: names and scalar values, what --set can name and give
expect_error "$B/config_key_number.lua:3: config: keys must be names such as config{L = 2} (got the number key [1])" -- \
    "$KILN" compile "$B/config_key_number.lua"
expect_error "$B/config_nested.lua:2: config: 'a' must be a number, string or boolean (got a table)" -- \
    "$KILN" compile "$B/config_nested.lua"
expect_error "$B/config_preset_nested.lua:2: config: 'L' in preset 'big' must be a number, string or boolean (got a table)" -- \
    "$KILN" compile "$B/config_preset_nested.lua"

# a script that is Lua bytecode: the file, not Lua's bare "attempt to load a
# binary chunk (mode is 't')"
printf '\033LuaT\000\031\223\r\n\032\n\004\010\010' > "$dir/bytecode.lua"
expect_error "$dir/bytecode.lua: the model script is Lua bytecode (expected Lua source text" -- \
    "$KILN" compile "$dir/bytecode.lua"
expect_error "$dir/bytecode.lua: the model script is Lua bytecode" -- \
    "$KILN" train "$dir/bytecode.lua" --steps 1
# a syntax error names the whole path (Lua shortens one over 60 characters)
long="$dir/a_directory_with_a_rather_long_name/and_another_one_below_it_too"
mkdir -p "$long"
printf 'local x = input("x", {4})\nlocal y = = 1\n' > "$long/syntax.lua"
expect_error "$long/syntax.lua:2: unexpected symbol near '='" -- "$KILN" compile "$long/syntax.lua"
# a --set value the script refuses names the --set
expect_error "models/gpt.lua:" "sym: B must be a positive integer (got 0, from --set batch=0)" -- \
    "$KILN" compile models/gpt.lua --set batch=0
expect_error "models/mlp.lua:" "sym: D must be a positive integer (got -1, from --set dim=-1)" -- \
    "$KILN" train models/mlp.lua --steps 1 --set dim=-1
expect_error "models/mlp.lua:" "param: dimension 1 must be a positive integer (got 0, from --set hidden=0)" -- \
    "$KILN" compile models/mlp.lua --set hidden=0
# any other error in a script run with --set of config keys lists them
expect_error "models/gpt.lua:" "(the script ran with --set H=0)" -- \
    "$KILN" compile models/gpt.lua --set H=0
expect_error "models/gpt.lua:" "C must be divisible by H (the script ran with --set H=3, --set L=1)" -- \
    "$KILN" compile models/gpt.lua --set H=3 --set L=1
bad_input_done
