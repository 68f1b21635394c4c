#!/bin/bash
# Hostile --init-map files (docs/training.md, Fine-tuning): each gives a
# clear error naming the map file and its line (or the flag), exit 1 (2
# for a bad command line), no crash, no hang; the map runs in the model
# scripts' sandbox (no files, no OS, bounded instructions, memory, time).
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh # $dir, fail, expect_error
d=tests/data/finetune
"$KILN" train models/mlp.lua --steps 5 -q --save-weights "$dir/w.safetensors" > "$dir/w.log" 2>&1 ||
    fail "training the source model: $(cat "$dir/w.log")"
w="$dir/w.safetensors"
run=("$KILN" train $d/ft.lua --steps 1 --init-from "$w" --init-map)
map() { printf '%s\n' "$@" > "$dir/m.lua"; }
m="$dir/m.lua"

map 'return {' '  ["fc1.weight"] = "body.0.weight"' '  ["fc1.bias"] = "body.0.bias",' '}'
expect_error "$m:3:" "'}' expected" -- "${run[@]}" "$m" --init-partial
map 'return 42'
expect_error "$m:" "returned a number" "return function(name, shape)" -- "${run[@]}" "$m" --init-partial
map '-- nothing'
expect_error "$m:" "returned nothing" -- "${run[@]}" "$m"
map 'return {' '  ["fc1.weight"] = 7,' '}'
expect_error "$m:2:" '"fc1.weight" is a number' "false to ignore" -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc1.weight"] = true,' '}'
expect_error "$m:2:" '"fc1.weight" is true' -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc1.weight"] = {too = "body.0.weight"},' '}'
expect_error "$m:2:" 'the key "too"' "did you mean to?" -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc1.weight"] = {to = 3},' '}'
expect_error "$m:2:" "to is a number" -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc1.weight"] = {to = "body.0.weight", transpose = "yes"},' '}'
expect_error "$m:2:" "transpose is a string" -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc1.bias"] = {to = "body.0.bias", transpose = true},' '}'
expect_error "$m:2:" "rank 1" -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc1.weight"] = "",' '}'
expect_error "$m:2:" "a name of 0 bytes" -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc9.weight"] = "body.0.weight",' '}'
expect_error "$m:2:" '"fc9.weight", which the --init-from file does not hold' 'did you mean "fc1.weight"?' -- \
    "${run[@]}" "$m" --init-partial
map 'return {[1] = "body.0.weight"}'
expect_error "$m:" "a number key" -- "${run[@]}" "$m" --init-partial
map 'return {' '  ["fc1.weight"] = "body.0.weigth",' '}'
expect_error "$m:2:" '"fc1.weight" maps to "body.0.weigth", which is not a param of the model' -- "${run[@]}" "$m"
map 'return {' '  ["fc1.bias"] = "body.1.bias",' '  ["fc2.bias"] = "body.1.bias",' '}'
expect_error "$m:3:" '"fc1.bias" and "fc2.bias" both map to "body.1.bias"' "$m:2" -- "${run[@]}" "$m" --init-partial
# strict (no --init-partial): the new head is missing; a shape that does not fit
expect_error "w.safetensors" 'missing tensor "cls.weight"' "--init-partial" -- "${run[@]}" $d/map.lua
map 'return {' '  ["fc1.weight"] = {to = "body.0.weight", transpose = true},' '}'
expect_error '(mapped to "body.0.weight" by' "$m:2)" "after its transpose" "wrong shape" -- "${run[@]}" "$m"
# the function form: an error in it, a bad result
map 'return function(name, shape)' '  return name .. nil' 'end'
expect_error "$m:2:" "concatenate" -- "${run[@]}" "$m" --init-partial
map '' 'return function(name, shape)' '  return 12' 'end'
expect_error "$m:2:" "the map function's result" '"fc1.weight" is a number' -- "${run[@]}" "$m" --init-partial
# the sandbox: no files, no OS, bounded
map 'local f = io.open("/etc/passwd")' 'return {}'
expect_error "$m:1:" "no file access" -- "${run[@]}" "$m"
map 'setmetatable({}, {__gc = function() end})' 'return {}'
expect_error "$m:1:" "__gc" -- "${run[@]}" "$m"
map 'os.execute("true")' 'return {}'
expect_error "$m:1:" "os" -- "${run[@]}" "$m"
map 'while true do end'
expect_error "$m:1:" "Lua instructions" -- env KILN_LUA_INSTRUCTIONS=100000 "$KILN" train $d/ft.lua \
    --steps 1 --init-from "$w" --init-map "$m"
map 'local t = {}' 'for i = 1, 1e9 do t[i] = ("x"):rep(100) .. i end'
expect_error "$m:2:" "Lua memory" -- env KILN_LUA_MEMORY=8MiB "$KILN" train $d/ft.lua \
    --steps 1 --init-from "$w" --init-map "$m"
map 'return function(name, shape) while true do end end'
expect_error "$m:1:" "Lua instructions" -- env KILN_LUA_INSTRUCTIONS=100000 "$KILN" train $d/ft.lua \
    --steps 1 --init-from "$w" --init-map "$m"
map 'local s = ("a"):rep(40000) .. "b"' 'return s:find(("a*"):rep(40) .. "c")'
expect_error "$m:" "ran for more than 1 s" -- env KILN_LUA_SECONDS=1 "$KILN" train $d/ft.lua \
    --steps 1 --init-from "$w" --init-map "$m"
printf '\033Lua\x54\x00garbage' > "$m"
expect_error "$m:" "bytecode" -- "${run[@]}" "$m"
# the files and flags
expect_error "nothere.lua" "cannot open the map file" -- "${run[@]}" "$dir/nothere.lua"
expect_error "$dir" "a directory" -- "${run[@]}" "$dir"
# a FIFO: refused without blocking, named as one (the model script's reader,
# fe_read_lua_file, which the map file shares)
mkfifo "$dir/fifo.lua"
expect_error -t 20 "--init-map $dir/fifo.lua: cannot read the map file (expected a Lua file, got a FIFO)" \
    -- "${run[@]}" "$dir/fifo.lua"
expect_error -s 2 "--init-map needs --init-from" -- "$KILN" train $d/ft.lua --init-map $d/map.lua
expect_error -s 2 "--init-partial needs --init-from" -- "$KILN" train $d/ft.lua --init-partial
expect_error -s 2 "--init-map expects a Lua file" -- "$KILN" train $d/ft.lua --init-from "$w" --init-map=
bad_input_done
