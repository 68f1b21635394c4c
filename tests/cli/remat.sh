#!/usr/bin/env bash
# remat from the command line: a budget is honoured and reported, recomputed
# ops are marked in the remat dump, an infeasible budget names a budget that
# then compiles, bad flags are rejected, and training under a budget reports
# MFU and HFU.
set -u
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-remat.XXXXXX")
trap 'rm -rf "$dir"' EXIT

$KILN compile models/gpt.lua --remat=full > "$dir/full.txt" 2>&1 || fail "--remat=full: $(cat "$dir/full.txt")"
grep -q '^remat: policy full' "$dir/full.txt" || fail "no remat summary line"
grep -q 'recomputed [1-9]' "$dir/full.txt" || fail "full recomputes nothing"
full=$(sed -n 's/^planned peak: .*(\([0-9]*\) bytes.*/\1/p' "$dir/full.txt")
none=$($KILN compile models/gpt.lua | sed -n 's/^planned peak: .*(\([0-9]*\) bytes.*/\1/p')
[ -n "$full" ] && [ -n "$none" ] && [ "$full" -lt "$none" ] || fail "full peak $full not below none $none"

# a budget between the two: honoured, and reported as such
budget=$(( (full + none) / 2 ))
$KILN compile models/gpt.lua --memory-budget "$budget" > "$dir/auto.txt" 2>&1 || fail "budget $budget: $(cat "$dir/auto.txt")"
peak=$(sed -n 's/^planned peak: .*(\([0-9]*\) bytes.*/\1/p' "$dir/auto.txt")
[ "$peak" -le "$budget" ] || fail "planned peak $peak above budget $budget"
grep -q '^remat: policy auto' "$dir/auto.txt" || fail "auto not reported"
grep -q 'extra .*FLOP per step' "$dir/auto.txt" || fail "extra FLOPs not reported"

$KILN compile models/gpt.lua --remat=full --dump-after=remat > "$dir/dump.txt" 2>&1 || fail "dump"
grep -q '^> After remat:' "$dir/dump.txt" || fail "no remat dump header"
grep -q ' !recompute' "$dir/dump.txt" || fail "no !recompute mark in the dump"

# infeasible: exit 1, names the smallest feasible budget, which compiles
$KILN compile models/gpt.lua --memory-budget 1KiB > "$dir/bad.txt" 2>&1
[ $? -eq 1 ] || fail "infeasible budget must exit 1"
grep -q 'infeasible: the smallest feasible budget kiln found is' "$dir/bad.txt" || fail "message: $(cat "$dir/bad.txt")"
least=$(sed -n 's/.*expected --memory-budget >= \([0-9]*\),.*/\1/p' "$dir/bad.txt")
$KILN compile models/gpt.lua --memory-budget "$least" > /dev/null 2>&1 || fail "the named budget $least does not compile"

$KILN compile models/gpt.lua --remat=some > /dev/null 2>&1
[ $? -eq 2 ] || fail "--remat=some must be rejected"
$KILN compile models/gpt.lua --memory-budget lots > /dev/null 2>&1
[ $? -eq 2 ] || fail "--memory-budget lots must be rejected"

$KILN train models/addition.lua --steps 2 --remat=full --peak-gflops 100 > "$dir/train.txt" 2>&1 || fail "train: $(tail -5 "$dir/train.txt")"
grep -q 'MFU [0-9.]*% of 100 GFLOP/s, HFU [0-9.]*%' "$dir/train.txt" || fail "no MFU/HFU in the step line"
echo ok
