#!/bin/bash
# Compile time per pass as a model gets deeper: a Llama-style decoder at
# C=16384, T=8192, batch 1 (shapes only, nothing allocated), at L = 12, 24,
# 48 and 96 layers, and the growth factor per doubling of L (2.0: linear;
# 4.0: quadratic). Issue 17 asks for near-linear passes and under 10 s for
# L=96.
#
#   bench/compile_scaling.sh [BUILD] [MAX_L]     (MAX_L default 96)
set -euo pipefail
build=${1:-build}
max=${2:-96}
bin=$build/bench/bench_compile
[ -x "$bin" ] || { echo "no $bin: build first (cmake --build $build)"; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln-scaling-XXXXXX")
trap 'rm -rf "$out"' EXIT
Ls=()
for L in 12 24 48 96; do
    [ "$L" -le "$max" ] || break
    Ls+=("$L")
    "$bin" models/llama.lua --set L="$L" --set H=128 --set C=16384 --set T=8192 --set batch=1 \
        --set V=32000 --reps 1 >"$out/$L.txt"
done
# stage names from the first run, in its order
mapfile -t stages < <(awk '/^stage/ { on = 1; next } on && NF == 2 { print $1 }' "$out/${Ls[0]}.txt")
printf '%-12s' "ms"
for L in "${Ls[@]}"; do printf '%12s' "L=$L"; done
printf '%s\n' "   growth per doubling"
for s in "${stages[@]}"; do
    printf '%-12s' "$s"
    prev=""
    growth=""
    for L in "${Ls[@]}"; do
        v=$(awk -v s="$s" '$1 == s { print $2 }' "$out/$L.txt")
        printf '%12s' "$v"
        if [ -n "$prev" ]; then
            growth="$growth $(awk -v a="$prev" -v b="$v" 'BEGIN { printf "%.1f", (a > 0 ? b / a : 0) }')"
        fi
        prev=$v
    done
    printf '   %s\n' "$growth"
done
grep -h 'ops in the final graph' "$out"/*.txt | sed 's/^/  /'
