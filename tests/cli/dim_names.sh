#!/bin/bash
# Dims print as a sym name only where they came from it (issue 19): an
# MLP-Mixer block (tests/data/mixer_dims.lua) with patches P = channels D =
# 16 and a token-mixing hidden size given as the number 16.
#  1. kiln compile's parameter list names each axis by its source: P and D
#     apart although equal, the literal 16 as 16;
#  2. the IR dumps name the carried axes (transposes, matmuls, gradients);
#  3. the dumps up to the optimizer's are the same, numbers aside, as those
#     of a run where every size differs: no name comes from a value (from
#     simplify on, equal shapes let CSE merge ops, so the graphs differ);
#  4. each dump parses back to the same text (kiln opt, comm on one rank
#     changes nothing);
#  5. names written in other ops' shapes (reshape, random, const, iota,
#     broadcast_to) are kept;
#  6. a sym name keeps one value, and size() reads only declared names.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-dims-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
model=tests/data/mixer_dims.lua

"$KILN" compile "$model" --dump-after=all --dump-dir "$dir/eq" > "$dir/eq.out" 2>&1 ||
    fail "compile failed: $(cat "$dir/eq.out")"
# 1. the parameter list
for want in 'tok1.weight f32[P,16]' 'tok2.weight f32[16,P]' 'ln1.weight f32[D]' \
            'ch.c_fc.weight f32[D,32]' 'ch.c_fc.bias f32[32]' 'ch.c_proj.weight f32[32,D]' \
            'head.weight f32[D,K]' 'head.bias f32[K]'; do
    sed -E 's/^ +//; s/ +/ /g' "$dir/eq.out" | grep -qxF "$want" ||
        fail "the parameter list lacks '$want':
$(sed -n '/^params:/,/tensors,/p' "$dir/eq.out")"
done

# 2. names carried through ops: the transposed activations, token mixing,
# the pooled features, and the weight gradients in the autodiff dump
ir() { sed 's/ *#.*//' "$dir"/eq/*-"$1".ir; }
for want in ':f32[B,P,D] = input "x"' ':f32[B,D,P] = permute ' \
            ':f32[B,D,16] = matmul ' ':f32[B,D,P] = matmul ' ':f32[B,1,D] = reduce_sum ' \
            ':f32[B,K] = matmul '; do
    ir frontend | grep -qF "$want" || fail "the frontend dump lacks '$want'"
done
for want in ':f32[P,16] = matmul ' ':f32[16,P] = matmul ' ':f32[D,32] = matmul ' \
            ':f32[32,D] = matmul ' ':f32[D,K] = matmul '; do
    ir autodiff | grep -F "$want" | grep -qF '!backward' ||
        fail "the autodiff dump lacks the weight gradient '$want ... !backward'"
done
# no D where P is meant and the other way round: the two weights of tok
! ir autodiff | grep -qE ':f32\[(D,16|16,D)\] = ' || fail "a token-mixing gradient is named D"

# 3. the same dumps with every size distinct: identical but for numbers
"$KILN" compile "$model" --set P=8 --set D=12 --set tok=20 --dump-after=all \
    --dump-dir "$dir/ne" > "$dir/ne.out" 2>&1 || fail "compile (distinct sizes) failed"
norm() { grep -v '^sym ' "$1" | sed -E 's/[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?/N/g'; }
n=0
for f in "$dir"/eq/*-{frontend,autodiff,optimizer}.ir; do
    g="$dir/ne/$(basename "$f")"
    [ -f "$g" ] || fail "no $(basename "$f") for the distinct sizes"
    if ! diff <(norm "$f") <(norm "$g") > "$dir/diff"; then
        fail "$(basename "$f"): names differ when P = D = tok (<) and when not (>):
$(head -20 "$dir/diff")"
    fi
    n=$((n + 1))
done
[ "$n" = 3 ] || fail "expected 3 dumps, got $n"

# 4. round trip: print(parse(dump)) == dump, comments aside
for f in "$dir"/eq/*.ir; do
    "$KILN" opt "$f" --passes=comm > "$dir/rt.ir" 2> "$dir/rt.err" ||
        fail "kiln opt cannot read $(basename "$f"): $(cat "$dir/rt.err")"
    cmp -s <(grep -v '^# ' "$f") <(grep -v '^# ' "$dir/rt.ir") ||
        fail "$(basename "$f") does not print back the same:
$(diff <(grep -v '^# ' "$f") <(grep -v '^# ' "$dir/rt.ir") | head -10)"
done
# 5. names written in reshape, random, const, iota and broadcast_to shapes;
# a literal 4 (C's value) in a const prints as 4
cat > "$dir/ops.lua" <<'LUA'
sym{B = 2, T = 3, C = 4}
local x = input("x", {"B", "T", "C"})
local w = param("w", {"C"}, ones())
local y = x:reshape{"B", 12}
local z = y:reshape{"B", "T", "C"}
local r = random({"B", 3, "C"})
local c = const(1, {"B", "T", 4})
local b = broadcast_to(iota({"T", "C"}, 0, "f32"), {"B", "T", "C"})
minimize((z * r * c * w + b):sum())
LUA
"$KILN" compile "$dir/ops.lua" --dump-after=frontend --dump-dir "$dir/ops" > "$dir/ops.out" 2>&1 ||
    fail "compile of ops.lua failed: $(cat "$dir/ops.out")"
for want in ':f32[B,12] = reshape ' ':f32[B,T,C] = reshape ' ':f32[B,3,C] = random ' \
            ':f32[B,T,4] = const ' ':f32[T,C] = iota ' ':f32[B,T,C] = broadcast '; do
    sed 's/ *#.*//' "$dir"/ops/*-frontend.ir | grep -qF "$want" ||
        fail "the ops.lua dump lacks '$want'"
done

# 6. a name has one value; size() reads a declared name only
printf 'sym{C = 4}\nsym{C = 4, D = 2}\nsym{C = 5}\n' > "$dir/redecl.lua"
"$KILN" compile "$dir/redecl.lua" > "$dir/err" 2>&1 && fail "sym{} redeclared with another value was accepted"
grep -qF "$dir/redecl.lua:3: sym: C is already declared as 4 (expected that value again, got 5)" \
    "$dir/err" || fail "unexpected error for a redeclared sym: $(cat "$dir/err")"
printf 'sym{C = 4}\nlocal n = size("C") + size(3)\nlocal x = size("Q")\n' > "$dir/size.lua"
"$KILN" compile "$dir/size.lua" > "$dir/err" 2>&1 && fail "size() of an undeclared name was accepted"
grep -qF "$dir/size.lua:3: size: expected an integer or a name declared with sym{} (got Q)" \
    "$dir/err" || fail "unexpected error for size(\"Q\"): $(cat "$dir/err")"
echo "dim names: parameter list, IR names, $n dumps by provenance, round trip of $(ls "$dir"/eq/*.ir | wc -l) dumps ok"
