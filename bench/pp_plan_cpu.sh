#!/bin/bash
# kiln plan's pipeline against the clock (issue 40, "Prediction"): for
# gpt.lua at pp = 2 on 2 CPU ranks, m = 4 and 8 micro-batches, under gpipe,
# 1f1b and zb-h1 (bench/pp_cpu.sh's runs), the step `kiln plan --device cpu
# --pp 2` predicts from the compiler's stage cut (each stage's F, B and W
# timed by the cost model, the schedule simulated with those times), next
# to the median step `kiln train --nproc 2 --pp 2` measures, and their
# ratio (the goal: within 25%). The plan's bubble (its idle share of the
# step) is printed beside it, and per stage the ratio of the plan's busy
# time (m x its F, B and W) to the measured time running F, B and W (the
# `pipeline:` line), which tells the cost model's error apart from the
# schedule's. The cpu device's figures are measured once
# and cached; the runs are repeated ROUNDS times (medians). Timings on a
# shared machine are noisy: the load average is printed.
#
#   bench/pp_plan_cpu.sh [KILN] [STEPS] [ROUNDS]
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-20}
rounds=${3:-2}
cfg=(--set L=4 --set H=4 --set C=128 --set T=64 --set batch=4 --set eval_every=0)
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-pp-plan.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
json() { sed -n "s/^[[:space:]]*\"$1\":[[:space:]]*\([-0-9.e+]*\),\?$/\1/p" | head -1; }
jsons() { sed -n "s/^[[:space:]]*\"$1\":[[:space:]]*\"\([^\"]*\)\",\?$/\1/p" | head -1; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
printf '%-6s %-3s %13s %12s %7s %12s %8s %12s %12s\n' schedule m "predicted ms" "measured ms" ratio \
    "plan bubble" model "busy0 ratio" "busy1 ratio"
for m in 4 8; do
    for s in gpipe 1f1b zb-h1; do
        "$kiln" plan models/gpt.lua "${cfg[@]}" --device cpu --pp 2 --micro-batches "$m" \
            --schedule "$s" --json >"$tmp/plan" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
        pred=$(json predicted_s <"$tmp/plan")
        bub=$(json bubble_fraction <"$tmp/plan")
        model=$(jsons pipeline_model <"$tmp/plan")
        p0=$(sed -n 's/^[[:space:]]*"busy_s":[[:space:]]*\([-0-9.e+]*\),\?$/\1/p' "$tmp/plan" | sed -n 1p)
        p1=$(sed -n 's/^[[:space:]]*"busy_s":[[:space:]]*\([-0-9.e+]*\),\?$/\1/p' "$tmp/plan" | sed -n 2p)
        : >"$tmp/steps" >"$tmp/b0" >"$tmp/b1"
        for r in $(seq "$rounds"); do
            "$kiln" train models/gpt.lua --steps "$steps" "${cfg[@]}" --nproc 2 --pp 2 \
                --set micro_batches="$m" --set schedule="$s" >"$tmp/out" 2>&1 ||
                { cat "$tmp/out"; exit 1; }
            sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' "$tmp/out" >>"$tmp/steps"
            sed -n 's/^pipeline:.*stage 0 \([0-9.]*\) \/ .*/\1/p' "$tmp/out" >>"$tmp/b0"
            sed -n 's/^pipeline:.*stage 1 \([0-9.]*\) \/ .*/\1/p' "$tmp/out" >>"$tmp/b1"
        done
        meas=$(median <"$tmp/steps")
        awk -v s="$s" -v m="$m" -v p="$pred" -v x="$meas" -v b="$bub" -v k="$model" \
            -v p0="$p0" -v p1="$p1" -v m0="$(median <"$tmp/b0")" -v m1="$(median <"$tmp/b1")" \
            'BEGIN { printf "%-6s %-3s %13.2f %12.2f %7.2f %11.1f%% %8s %12.2f %12.2f\n", s, m,
                     1e3 * p, x, (x > 0 ? 1e3 * p / x : 0), 100 * b, k,
                     (m0 > 0 ? 1e3 * p0 / m0 : 0), (m1 > 0 ? 1e3 * p1 / m1 : 0) }'
    done
done
echo "medians of $rounds runs of $steps steps each; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
