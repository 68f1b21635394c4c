#!/usr/bin/env bash
# shard_auto.sh - --set shard=auto (passes/shard_auto.c): the compiler chooses
# the params' tensor-parallel splits with an ILP over the partition pass's
# costs (kiln compile: costed on h100; kiln train: on the run's device).
#   - gpt.lua without its own marks (--set tp_marks=false), GPT-2 small's
#     width (C 768, H 12, V 50304) at L 2: Megatron-LM's split by name:
#     c_attn column-parallel in 3 blocks (q, k, v by heads), attention
#     c_proj and mlp c_proj row-parallel, c_fc column-parallel, wte by
#     vocabulary; the same shardings on the params of the partition dump;
#   - the same model at V 256, T 64, L 1 (small enough to train here):
#     the embedding is kept whole (its split does not pay at that vocabulary)
#     and the blocks split as Megatron's; trained at tp = 2 under shard=auto
#     on 2 ranks, its losses match one rank's within 1e-5 relative;
#   - 3 heads at tp = 2: no split by heads (the partition pass refuses it);
#     the layout chosen instead trains as one rank;
#   - llama.lua without its marks (L 1, C 1024): q, k, v, gate and up
#     column-parallel, o and down row-parallel; trained at tp = 2 as one rank;
#   - tiny gpt (C 32): nothing pays, nothing is split, and the report says so;
#     the script's marks are kept under shard=auto; tp = 1: shard=auto does
#     nothing;
#   - an ILP with no solution (params that cannot fit an h100 even split)
#     is an error that says so, exit 1.
set -u
: "${KILN:?KILN must point at the kiln binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-shard.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

# choice LOG PARAM: the auto-sharding report's line for PARAM (its choice)
choice() { sed -n '/^auto-sharding/,/^remat/p' "$1" | grep -E "^  $2 " | head -1; }
# expect LOG PARAM PATTERN
expect() {
    local l
    l=$(choice "$1" "$2")
    echo "$l" | grep -Eq -- "$3" || fail "$2: expected /$3/, got: ${l:-no line} ($1)"
}

losses() { sed -n 's/^step *\([0-9]*\)\/[0-9]* | loss \([0-9.e+-]*\) .*/\1 \2/p' "$1"; }
# same_losses ONE TP NAME: every step's loss within 1e-5 relative
same_losses() {
    local n e
    n=$(losses "$1" | wc -l)
    [ "$n" -ge 2 ] && [ "$n" -eq "$(losses "$2" | wc -l)" ] || fail "$3: step lines differ"
    e=$(paste <(losses "$1") <(losses "$2") | awk '
        $1 != $3 { print "step mismatch"; exit }
        { d = $2 - $4; if (d < 0) d = -d; r = $2 < 0 ? -$2 : $2; e = d / r; if (e > m) m = e }
        END { printf "%.3g\n", m }')
    echo "$3: shard=auto at tp=2 vs 1 rank: $n steps, loss rel diff $e"
    awk -v e="$e" 'BEGIN { exit !(e != "" && e + 0 == e && e < 1e-5) }' || fail "$3: losses differ by $e"
}

# --- Megatron's split at GPT-2 small's width -------------------------------
W="models/gpt.lua --set size=124M --set L=2 --set tp_marks=false --tp 2 --set shard=auto"
"$KILN" compile $W --dump-after=partition --dump-dir "$T/d" >"$T/w.log" 2>&1 ||
    fail "compile: $(tail -5 "$T/w.log")"
sed -n '/^auto-sharding/,/^remat/p' "$T/w.log"
for i in 0 1; do
    expect "$T/w.log" "h.$i.attn.c_attn.weight" 'split axis 1 in 3 blocks, column-parallel'
    expect "$T/w.log" "h.$i.attn.c_attn.bias" 'split axis 0 in 3 blocks \(follows'
    expect "$T/w.log" "h.$i.attn.c_proj.weight" 'split axis 0, row-parallel'
    expect "$T/w.log" "h.$i.mlp.c_fc.weight" 'split axis 1, column-parallel'
    expect "$T/w.log" "h.$i.mlp.c_fc.bias" 'split axis 0 \(follows'
    expect "$T/w.log" "h.$i.mlp.c_proj.weight" 'split axis 0, row-parallel'
    # the row-parallel layers' biases stay whole (added after the all-reduce)
    choice "$T/w.log" "h.$i.mlp.c_proj.bias" | grep -q . && fail "mlp.c_proj.bias split"
done
expect "$T/w.log" wte.weight 'split axis 0, by rows \(vocabulary-parallel\)'
expect "$T/w.log" wpe.weight 'whole'
grep -Eq '^  objective \(rank 0.s step, predicted\): ' "$T/w.log" || fail "no objective line"
grep -Eq '^  round 1: .*ILP objective .*checked' "$T/w.log" || fail "no round line"
# the partition dump: the chosen shardings on rank 0's params
P=$(ls "$T/d/"*partition*)
grep -q 'param "h.0.attn.c_attn.weight" .*shard(axis=1,blocks=3,n=2,rank=0)' "$P" ||
    fail "dump: c_attn.weight not split in 3 blocks: $(grep c_attn.weight "$P")"
grep -q 'param "h.1.mlp.c_proj.weight" .*shard(axis=0,blocks=1,n=2,rank=0)' "$P" ||
    fail "dump: mlp.c_proj.weight not split by rows: $(grep mlp.c_proj.weight "$P")"
grep -q 'param "wte.weight" .*shard(axis=0,blocks=1,n=2,rank=0)' "$P" ||
    fail "dump: wte not split by rows"
if grep -q 'param "wpe.weight" .*shard(' "$P"; then fail "dump: wpe split"; fi

# --- trained at tp = 2 under shard=auto: one rank's losses -----------------
S="models/gpt.lua --set L=1 --set C=768 --set H=12 --set T=64 --set batch=4 --set tp_marks=false --set eval_every=0"
"$KILN" compile $S --tp 2 --set shard=auto >"$T/s.log" 2>&1 || fail "compile small: $(tail -5 "$T/s.log")"
expect "$T/s.log" h.0.attn.c_attn.weight 'split axis 1 in 3 blocks, column-parallel'
expect "$T/s.log" h.0.attn.c_proj.weight 'split axis 0, row-parallel'
expect "$T/s.log" h.0.mlp.c_fc.weight 'split axis 1, column-parallel'
expect "$T/s.log" h.0.mlp.c_proj.weight 'split axis 0, row-parallel'
expect "$T/s.log" wte.weight 'whole'
"$KILN" train $S --steps 4 >"$T/t1.log" 2>&1 || fail "train 1 rank: $(tail -5 "$T/t1.log")"
"$KILN" train $S --steps 4 --nproc 2 --tp 2 --set shard=auto >"$T/t2.log" 2>&1 ||
    fail "train tp=2: $(tail -5 "$T/t2.log")"
# costed on the run's device (the CPU's measured figures), not h100's
grep -Eq 'kiln: note: shard=auto split [1-9][0-9]* params over tp = 2 .*, costed on cpu;' "$T/t2.log" ||
    fail "no shard=auto note costed on cpu: $(grep note "$T/t2.log")"
grep -q 'marks no param for tensor parallelism' "$T/t2.log" && fail "train ran unsplit"
same_losses "$T/t1.log" "$T/t2.log" gpt

# --- 3 heads at tp = 2: the head split is refused, and what is chosen trains right
H3="models/gpt.lua --set L=1 --set C=768 --set H=3 --set T=64 --set batch=4 --set tp_marks=false --set eval_every=0"
"$KILN" compile $H3 --tp 2 --set shard=auto >"$T/h.log" 2>&1 || fail "compile H=3: $(tail -5 "$T/h.log")"
choice "$T/h.log" h.0.attn.c_attn.weight | grep -q 'blocks' && fail "H=3: split by heads"
"$KILN" train $H3 --steps 3 >"$T/h1.log" 2>&1 || fail "H=3 1 rank: $(tail -5 "$T/h1.log")"
"$KILN" train $H3 --steps 3 --nproc 2 --tp 2 --set shard=auto >"$T/h2.log" 2>&1 ||
    fail "H=3 tp=2: $(tail -5 "$T/h2.log")"
same_losses "$T/h1.log" "$T/h2.log" "gpt H=3"

# --- llama.lua (attention written by hand with param and matmul) -----------
LL="models/llama.lua --set L=1 --set C=1024 --set H=16 --set T=128 --set batch=4 --set tp_marks=false --set eval_every=0"
"$KILN" compile $LL --tp 2 --set shard=auto >"$T/l.log" 2>&1 || fail "compile llama: $(tail -5 "$T/l.log")"
for w in q k v; do
    expect "$T/l.log" "layers.0.self_attn.${w}_proj.weight" 'split axis 1, column-parallel'
done
expect "$T/l.log" layers.0.self_attn.o_proj.weight 'split axis 0, row-parallel'
expect "$T/l.log" layers.0.mlp.gate_proj.weight 'split axis 1, column-parallel'
expect "$T/l.log" layers.0.mlp.up_proj.weight 'split axis 1, column-parallel'
expect "$T/l.log" layers.0.mlp.down_proj.weight 'split axis 0, row-parallel'
"$KILN" train $LL --steps 3 >"$T/l1.log" 2>&1 || fail "llama 1 rank: $(tail -5 "$T/l1.log")"
"$KILN" train $LL --steps 3 --nproc 2 --tp 2 --set shard=auto >"$T/l2.log" 2>&1 ||
    fail "llama tp=2: $(tail -5 "$T/l2.log")"
same_losses "$T/l1.log" "$T/l2.log" llama

# --- nothing pays on tiny gpt; the script's marks are kept; tp = 1 ---------
"$KILN" compile models/gpt.lua --set tp_marks=false --tp 2 --set shard=auto >"$T/y.log" 2>&1 ||
    fail "compile tiny: $(tail -5 "$T/y.log")"
grep -q '^  0 of 10 candidates split' "$T/y.log" || fail "tiny: $(grep candidates "$T/y.log")"
"$KILN" compile models/gpt.lua --tp 2 --set shard=auto --dump-after=partition \
    --dump-dir "$T/m" >"$T/m.log" 2>&1 || fail "compile marked: $(tail -5 "$T/m.log")"
grep -q '^  1 candidate params (rank >= 2, not marked by the script), 13 params marked' \
    "$T/m.log" || fail "marks not kept: $(grep candidate "$T/m.log")"
grep -q 'param "h.0.attn.c_attn.weight" .*shard(axis=1,blocks=3,n=2,rank=0)' "$T/m/"*partition* ||
    fail "the script's mark was lost"
"$KILN" compile models/gpt.lua --set shard=auto >"$T/one.log" 2>&1 || fail "tp=1: $(tail -3 "$T/one.log")"
grep -q auto-sharding "$T/one.log" && fail "tp=1: shard=auto ran"

# --- no solution: an error, no crash ------------------------------------------
"$KILN" compile models/gpt.lua --set tp_marks=false --set L=1 --set V=1048576 --set C=16384 \
    --set H=2 --tp 2 --set shard=auto >"$T/big.log" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "too big: exit $rc: $(tail -3 "$T/big.log")"
grep -q "shard=auto: the sharding ILP has no solution (GLPK: infeasible); the params" "$T/big.log" ||
    fail "too big: $(tail -3 "$T/big.log")"
echo "PASS"
