#!/bin/bash
# Pipeline stages on 2 CPU ranks (issue 40): gpt.lua at pp = 2 with m = 4
# and 8 micro-batches under gpipe, 1f1b and zb-h1. Per run: the step's
# median (the final line) and each stage's time running F, B and W and
# waiting in receives per step (the `pipeline:` line); the measured bubble
# is the waiting share, next to the unit-slot table's idle share (`kiln
# compile --pp 2`, F = B = W) and 1f1b's formula (p-1)/(m+p-1). One rank at
# grad_accum = m is the baseline. Timings on a shared machine are noisy:
# the load average is printed; runs are repeated ROUNDS times (medians).
#
#   bench/pp_cpu.sh [KILN] [STEPS] [ROUNDS]
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-20}
rounds=${3:-2}
cfg=(--set L=4 --set H=4 --set C=128 --set T=64 --set batch=4 --set eval_every=0)
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
printf '%-6s %-3s %10s %12s %12s %10s %10s\n' schedule m "step ms" "stage0 wait" "stage1 wait" "table idle" formula
for m in 4 8; do
    base=()
    for r in $(seq "$rounds"); do
        base+=("$("$kiln" train models/gpt.lua --steps "$steps" "${cfg[@]}" --set grad_accum=$m 2>&1 |
            sed -n 's/.*median \([0-9.]*\) ms\/step.*/\1/p')")
    done
    printf '%-6s %-3s %10s\n' "1 rank" "$m" "$(printf '%s\n' "${base[@]}" | median)"
    for s in gpipe 1f1b zb-h1; do
        step=() w0=() w1=()
        for r in $(seq "$rounds"); do
            out=$("$kiln" train models/gpt.lua --steps "$steps" "${cfg[@]}" --nproc 2 --pp 2 \
                --set micro_batches=$m --set schedule=$s 2>&1)
            step+=("$(sed -n 's/.*median \([0-9.]*\) ms\/step.*/\1/p' <<<"$out")")
            w0+=("$(sed -n 's/^pipeline:.*stage 0 [0-9.]* \/ [0-9.]* ms (\([0-9]*\)% waiting).*/\1/p' <<<"$out")")
            w1+=("$(sed -n 's/^pipeline:.*stage 1 [0-9.]* \/ [0-9.]* ms (\([0-9]*\)% waiting).*/\1/p' <<<"$out")")
        done
        idle=$("$kiln" compile models/gpt.lua "${cfg[@]}" --pp 2 --set micro_batches=$m \
            --set schedule=$s | sed -n 's/^# bubble: \([0-9.]*\)%.*/\1/p')
        printf '%-6s %-3s %10s %11s%% %11s%% %9s%% %9.1f%%\n' "$s" "$m" \
            "$(printf '%s\n' "${step[@]}" | median)" "$(printf '%s\n' "${w0[@]}" | median)" \
            "$(printf '%s\n' "${w1[@]}" | median)" "$idle" "$(echo "100 / ($m + 1)" | bc -l)"
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
