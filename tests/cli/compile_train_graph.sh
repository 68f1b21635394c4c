#!/usr/bin/env bash
# kiln compile and kiln train build the same training graph: for the same
# model and flags (--nproc, --no-overlap, --remat, --memory-budget,
# --no-fuse, grad_accum), the IR kiln train runs (--dump-ir, written by
# rank 0 after the pipeline) is byte-identical to kiln compile's dump after
# the last pass that changes the graph (schedule). Both map their settings
# through rt_pass_opts; this checks that nothing else differs on the way.
set -u
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-ctgraph.XXXXXX")
trap 'rm -rf "$dir"' EXIT

peak() { sed -n 's/^planned peak: .*(\([0-9]*\) bytes.*/\1/p' "$1"; }
# a budget between the full-recompute and no-recompute peaks, so that remat
# recomputes something of its own choosing
$KILN compile models/gpt.lua --nproc 2 > "$dir/none.txt" 2>&1 || fail "compile: $(cat "$dir/none.txt")"
$KILN compile models/gpt.lua --nproc 2 --remat=full > "$dir/full.txt" 2>&1 || fail "compile --remat=full"
none=$(peak "$dir/none.txt"); full=$(peak "$dir/full.txt")
[ -n "$none" ] && [ -n "$full" ] && [ "$full" -lt "$none" ] || fail "peaks: full $full, none $none"
budget=$(( (full + none) / 2 ))

n=0
check() { # MODEL FLAGS...: compile's schedule dump == train's --dump-ir
    local model=$1; shift
    n=$((n + 1))
    local d="$dir/$n"
    $KILN compile "$model" "$@" --dump-after=schedule --dump-dir "$d" > "$d.compile" 2>&1 ||
        fail "compile $model $*: $(cat "$d.compile")"
    $KILN train "$model" "$@" --steps 1 -q --dump-ir "$d.train.ir" > "$d.train" 2>&1 ||
        fail "train $model $*: $(cat "$d.train")"
    cmp -s "$d"/00-schedule.ir "$d.train.ir" || {
        diff "$d"/00-schedule.ir "$d.train.ir" | head -20
        fail "compile and train build different graphs for $model $*"
    }
    echo "same graph: $model $*"
}

check models/gpt.lua --nproc 2 --memory-budget "$budget"
grep -q ' !recompute' "$dir/1.train.ir" || fail "the budget recomputed nothing (test too weak)"
grep -q '= allreduce_start ' "$dir/1.train.ir" || fail "no all-reduce with --nproc 2 (test too weak)"
check models/gpt.lua --nproc 2 --no-overlap --remat=full --set grad_accum=2
grep -q '"accum\.' "$dir/2.train.ir" || fail "grad_accum=2 added no accum state (test too weak)"
check models/mlp.lua --no-fuse --remat=selective
grep -q '!group=' "$dir/3.train.ir" && fail "--no-fuse left groups"
# and the check itself fails when the flags differ
$KILN compile models/gpt.lua --nproc 2 --dump-after=schedule --dump-dir "$dir/x" > /dev/null 2>&1 ||
    fail "compile"
cmp -s "$dir/x/00-schedule.ir" "$dir/2.train.ir" && fail "different flags gave the same graph"
exit 0
