#!/bin/bash
# shapes whose element or byte count overflows (param, input, matmul and
# broadcast results, reshape, iota/const, a --set config dim), non-positive
# dims, a plan larger than the machine's memory (train refuses it before
# allocating, compile still prints its summary), float targets to
# nn.cross_entropy (the IR parser's overflow: tests/fuzz/corpus/ir/)
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

model() { cat > "$dir/$1.lua"; }

model param <<'L'
local w = param("w", {65536, 65536, 65536, 65536}, zeros())
minimize(w:sum())
L
expect_error 'param.lua:1:' 'the shape f32[65536,65536,65536,65536] has more than 2^62 elements' \
    -- "$KILN" compile "$dir/param.lua"
expect_error 'param.lua:1:' 'more than 2^62 elements' -- "$KILN" train "$dir/param.lua" --steps 2

model input <<'L'
local x = input("x", {4294967296, 4294967296}, "u8")
minimize(x:cast("f32"):sum())
L
expect_error 'input.lua:1:' 'input: the shape u8[4294967296,4294967296] has more than 2^62 elements' \
    -- "$KILN" compile "$dir/input.lua"

model matmul <<'L'
local a = input("a", {2147483648, 4})
local b = input("b", {4, 2147483648})
minimize(a:matmul(b):sum())
L
expect_error 'matmul.lua:3:' 'matmul: the shape f32[2147483648,2147483648] takes more than 2^62 bytes' \
    -- "$KILN" compile "$dir/matmul.lua"

model bcast <<'L'
local a = input("a", {2147483648, 1})
local b = input("b", {1, 2147483648})
minimize((a + b):sum())
L
expect_error 'bcast.lua:3:' 'f32[2147483648,2147483648] takes more than 2^62 bytes' \
    -- "$KILN" compile "$dir/bcast.lua"

model reshape <<'L'
local a = input("a", {4, 4})
minimize(a:reshape({-1, 4294967296, 4294967296}):sum())
L
expect_error 'reshape.lua:2:' 'reshape: the shape' 'more than 2^62 elements' \
    -- "$KILN" compile "$dir/reshape.lua"

model iota <<'L'
local i = iota({1048576, 1048576, 1048576, 1048576})
minimize(i:cast("f32"):sum())
L
expect_error 'iota.lua:1:' 'iota: the shape i32[1048576,1048576,1048576,1048576] has more than 2^62 elements' \
    -- "$KILN" compile "$dir/iota.lua"

model zero <<'L'
local w = param("w", {4, 0}, zeros())
minimize(w:sum())
L
expect_error 'zero.lua:1:' 'dimension 1 must be a positive integer' -- "$KILN" compile "$dir/zero.lua"

expect_error 'models/gpt.lua:' 'has more than 2^62 elements' \
    -- "$KILN" compile models/gpt.lua --set C=4611686018427387904 --set H=1

# a plan far larger than any machine's memory: compile allocates nothing and
# prints its summary; train stops before allocating, naming both sizes
expect_error 'the plan needs' 'PiB but this machine has' 'of memory' \
    -- "$KILN" train models/gpt.lua --set C=16777216 --set H=1 --steps 2
out=$("$KILN" compile models/gpt.lua --set C=16777216 --set H=1 2>&1) ||
    { echo "FAIL: compile of a plan larger than memory: $out"; exit 1; }
case $out in *"planned peak:"*) ;; *) echo "FAIL: no summary: $out"; exit 1 ;; esac

model ce <<'L'
local x = input("x", {4, 8})
local y = input("y", {4}, "f32")
local fc = nn.Linear("fc", 8, 3)
minimize(nn.cross_entropy(fc(x), y))
L
expect_error 'ce.lua:4:' 'nn.cross_entropy: targets must be an integer tensor' 'expected i32/i64, got f32[4]' \
    -- "$KILN" compile "$dir/ce.lua"

bad_input_done
