#!/bin/bash
# Compile time per pass as a model gets deeper: a Llama-style decoder at
# C=16384, T=8192, batch 1 (shapes only, nothing allocated), at L = 12, 24,
# 48 and 96 layers, and the growth factor per doubling of L (2.0: linear;
# 4.0: quadratic); then a chain of n adds (bench/add_chain.lua) at n = 5k,
# 10k and 20k, per pass and with the growth per doubling of n. Issue 17 asks
# for near-linear passes and under 10 s for L=96.
#
# Times are the process's CPU time (bench_compile --cpu), the median of REPS
# compiles per size: steadier than wall time on a machine that other jobs
# load. A stage's growth is printed as "-" where it took under 5 ms at the
# smaller size (noise, not a trend).
#
#   bench/compile_scaling.sh [BUILD] [MAX_L] [MAX_N] [REPS]
#                                         (defaults build, 96, 20000, 3)
set -euo pipefail
build=${1:-build}
max=${2:-96}
maxn=${3:-20000}
reps=${4:-3}
bin=$build/bench/bench_compile
[ -x "$bin" ] || { echo "no $bin: build first (cmake --build $build)"; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln-scaling-XXXXXX")
trap 'rm -rf "$out"' EXIT

# table TITLE LABEL SIZES...: per stage, ms at each size and the growth
table() {
    local title=$1 label=$2
    shift 2
    local sizes=("$@")
    mapfile -t stages < <(awk '/^stage/ { on = 1; next } on && NF == 2 { print $1 }' \
        "$out/${sizes[0]}.txt")
    printf '%s\n' "$title"
    printf '%-12s' "CPU ms"
    for x in "${sizes[@]}"; do printf '%12s' "$label=$x"; done
    printf '%s\n' "   growth per doubling"
    for s in "${stages[@]}"; do
        printf '%-12s' "$s"
        local prev="" growth=""
        for x in "${sizes[@]}"; do
            local v
            v=$(awk -v s="$s" '$1 == s { print $2 }' "$out/$x.txt")
            printf '%12s' "$v"
            if [ -n "$prev" ]; then
                growth="$growth $(awk -v a="$prev" -v b="$v" \
                    'BEGIN { if (a < 5) printf "  -"; else printf "%4.1f", b / a }')"
            fi
            prev=$v
        done
        printf '   %s\n' "$growth"
    done
    for x in "${sizes[@]}"; do
        printf '  %s=%s: %s\n' "$label" "$x" "$(grep -h 'ops in the final graph' "$out/$x.txt")"
    done
    echo
}

Ls=()
for L in 12 24 48 96; do
    [ "$L" -le "$max" ] || break
    Ls+=("$L")
    "$bin" models/llama.lua --set L="$L" --set H=128 --set C=16384 --set T=8192 --set batch=1 \
        --set V=32000 --reps "$reps" --cpu >"$out/$L.txt"
done
table "models/llama.lua, C=16384, T=8192, batch 1, V=32000 (shapes only; median of $reps)" L "${Ls[@]}"

ns=()
for n in 5000 10000 20000; do
    [ "$n" -le "$maxn" ] || break
    ns+=("$n")
    "$bin" bench/add_chain.lua --set n="$n" --reps "$reps" --cpu >"$out/$n.txt"
done
[ "${#ns[@]}" -gt 0 ] && table "bench/add_chain.lua: a chain of n adds (median of $reps)" n "${ns[@]}"
exit 0
