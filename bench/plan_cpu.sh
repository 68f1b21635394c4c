#!/bin/bash
# `kiln plan` against the clock (issue 17, part 4): for gpt.lua on 2 CPU
# ranks of this machine, the step and the exposed DP communication that
# `kiln plan --device cpu --dp 2` predicts, next to what `kiln train --nproc
# 2` measures (its final line's median step, its comm line's median exposed
# time), with overlap and with --no-overlap, and their ratio (the goal:
# within 25%). The config is small in compute and large in parameters so
# that the gradient all-reduce is a visible share of the step.
#
# The cpu device's figures are measured once and cached (CACHE/cpu-device-T.txt,
# CACHE/cpu-mpi-2.txt); the training runs are repeated ROUNDS times, overlap
# and no-overlap interleaved, and the medians compared. One more row puts
# the one-rank step (no MPI) beside the cost model's compute, so that an
# error of the compute part is seen apart from the communication's.
# Timings on a shared machine are noisy: the load average is printed.
#
#   bench/plan_cpu.sh [KILN] [STEPS] [ROUNDS]
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-30}
rounds=${3:-3}
cfg=(--set L=2 --set H=2 --set C=256 --set T=32 --set batch=2 --set V=8192)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-plan-cpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
json() { sed -n "s/^[[:space:]]*\"$1\":[[:space:]]*\([-0-9.e+]*\),\?$/\1/p" | head -1; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
"$kiln" plan models/gpt.lua --device cpu --dp 2 "${cfg[@]}" | sed -n '1,3p'
for mode in overlap no-overlap; do
    flag=()
    [ "$mode" = no-overlap ] && flag=(--no-overlap)
    "$kiln" plan models/gpt.lua --device cpu --dp 2 "${cfg[@]}" "${flag[@]}" --json >"$tmp/plan-$mode"
done
"$kiln" compile models/gpt.lua --target cpu --threads 1 "${cfg[@]}" >"$tmp/one-pred"

for r in $(seq "$rounds"); do
    for mode in overlap no-overlap; do
        flag=()
        [ "$mode" = no-overlap ] && flag=(--no-overlap)
        "$kiln" train models/gpt.lua --nproc 2 --steps "$steps" -q "${cfg[@]}" "${flag[@]}" \
            >"$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
        sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' "$tmp/out" >>"$tmp/step-$mode"
        sed -n 's/^comm:.* exposed \([0-9.]*\) ms .*/\1/p' "$tmp/out" >>"$tmp/exp-$mode"
    done
    "$kiln" train models/gpt.lua --threads 1 --steps "$steps" -q "${cfg[@]}" 2>&1 |
        sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' >>"$tmp/step-one"
done

row() { # name predicted_ms measured_ms
    awk -v n="$1" -v p="$2" -v m="$3" \
        'BEGIN { printf "%-34s %12.2f %12.2f %7.2f\n", n, p, m, (m > 0 ? p / m : 0) }'
}
printf '%-34s %12s %12s %7s\n' "gpt.lua L2 C256 T32 B2 V8192" "predicted ms" "measured ms" "ratio"
for mode in overlap no-overlap; do
    ps=$(json predicted_s <"$tmp/plan-$mode")
    pe=$(json dp_exposed_s <"$tmp/plan-$mode")
    row "2 ranks, $mode: step" "$(awk -v x="$ps" 'BEGIN { print 1e3 * x }')" \
        "$(median <"$tmp/step-$mode")"
    row "2 ranks, $mode: exposed DP comm" "$(awk -v x="$pe" 'BEGIN { print 1e3 * x }')" \
        "$(median <"$tmp/exp-$mode")"
done
p1=$(sed -n 's/^predicted step on cpu .*: \([0-9.]*\) \(s\|ms\|us\)$/\1 \2/p' "$tmp/one-pred" |
     awk '{ v = $1; if ($2 == "s") v *= 1e3; if ($2 == "us") v /= 1e3; print v }')
row "1 rank, 1 thread: step (no MPI)" "$p1" "$(median <"$tmp/step-one")"
echo "medians of $rounds runs of $steps steps each; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
