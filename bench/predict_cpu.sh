#!/bin/bash
# The cost model against the clock: for gpt.lua at three sizes, the step
# `kiln compile --target cpu` predicts and the median step `kiln train`
# measures on this machine, and their ratio (the model's goal: within 1.5x
# either way). Run it on a quiet machine: the measurement of the CPU (cached
# after the first run, --remeasure to redo it) and the training runs both
# read the clock. Each size trains for STEPS steps, or more where the
# predicted step is short, so that a run lasts about a second: tiny's 20
# steps are 12 ms in all, and one hiccup of the machine moves their median
# (OpenBLAS's spinning server threads did, 0.66 to 8.26 ms, before kiln
# stopped them at startup: docs/fusion.md, "Threads on the CPU").
#
#   bench/predict_cpu.sh [KILN] [THREADS] [STEPS]
set -euo pipefail
kiln=${1:-build/kiln}
threads=${2:-2}
steps=${3:-20}
sizes=(
    "tiny|"
    "L4 C128 T128 B8|--set L=4 --set H=4 --set C=128 --set T=128 --set batch=8"
    "L4 C256 T256 B8|--set L=4 --set H=4 --set C=256 --set T=256 --set batch=8"
)
"$kiln" compile models/gpt.lua --target cpu --threads "$threads" | grep '^device cpu'
printf '%-18s %14s %14s %8s %7s\n' "gpt.lua" "predicted ms" "measured ms" "ratio" "steps"
for s in "${sizes[@]}"; do
    name=${s%%|*}
    read -r -a flags <<<"${s#*|}"
    pred=$("$kiln" compile models/gpt.lua --target cpu --threads "$threads" "${flags[@]}" |
           sed -n 's/^predicted step on cpu .*: \([0-9.]*\) \(s\|ms\|us\)$/\1 \2/p')
    pred_ms=$(echo "$pred" | awk '{ v = $1; if ($2 == "s") v *= 1e3; if ($2 == "us") v /= 1e3; print v }')
    n=$(awk -v s="$steps" -v p="$pred_ms" 'BEGIN { n = (p > 0 ? int(1000 / p) : s); print (n > s ? n : s) }')
    meas_ms=$("$kiln" train models/gpt.lua --steps "$n" --threads "$threads" -q "${flags[@]}" |
              sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p')
    awk -v n="$name" -v p="$pred_ms" -v m="$meas_ms" -v k="$n" \
        'BEGIN { printf "%-18s %14.2f %14.2f %8.2f %7d\n", n, p, m, (m > 0 ? p / m : 0), k }'
done
