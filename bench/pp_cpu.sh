#!/bin/bash
# Pipeline stages on 2 CPU ranks (issue 40): gpt.lua at pp = 2 with m = 4
# and 8 micro-batches under gpipe, 1f1b and zb-h1. Per run (medians over
# ROUNDS runs of STEPS steps):
#   - the step's median (the final line);
#   - the measured bubble: each stage's idle share of the pipeline's span
#     per step (the `pipeline bubble:` line: the span from the stages'
#     first action to the last one's end, less the time the stage runs F,
#     B and W; the same timestamps as the --trace pipeline track), and the
#     mean over the stages;
#   - the unit-slot table's idle share (`kiln compile --pp 2`, F = B = W)
#     and the schedule's formula: (p-1)/(m+p-1) for gpipe and 1f1b,
#     (p-1)/(3m+p-1) for zb-h1;
#   - memory per rank (the `pipeline memory:` line): what the schedule
#     holds of the micro-batches' stashed tensors and the process's
#     resident peak.
# One rank at grad_accum = m is the baseline. Timings on a shared machine
# are noisy: the load average is printed. BALANCE: how the stages are cut
# (kiln train --pp-balance: cost, the cost model's; time, each piece timed
# on this machine's CPU first).
#
#   bench/pp_cpu.sh [KILN] [STEPS] [ROUNDS] [BALANCE]
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-20}
rounds=${3:-2}
balance=${4:-cost}
cfg=(--set L=4 --set H=4 --set C=128 --set T=64 --set batch=4 --set eval_every=0)
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
med() { printf '%s\n' "$@" | median; }
# mib "12.5 KiB": in MiB
mib() { awk -v v="$1" 'BEGIN { split(v, a, " "); f = a[2] == "GiB" ? 1024 : a[2] == "MiB" ? 1 : a[2] == "KiB" ? 1 / 1024 : 1 / 1048576; printf "%.2f\n", a[1] * f }'; }
# field RE TEXT: the first group of sed's RE in TEXT
field() { sed -n "s/$1/\\1/p" <<<"$2" | head -1; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores); --pp-balance $balance"
printf '%-6s %-2s %9s | %-27s | %6s %7s | %-31s\n' schedule m "step ms" \
    "bubble: stage 0, 1, mean" table formula "memory: held / peak resident"
for m in 4 8; do
    base=()
    for r in $(seq "$rounds"); do
        base+=("$("$kiln" train models/gpt.lua --steps "$steps" "${cfg[@]}" --set grad_accum=$m 2>&1 |
            sed -n 's/.*median \([0-9.]*\) ms\/step.*/\1/p')")
    done
    printf '%-6s %-2s %9s |\n' "1 rank" "$m" "$(printf '%s\n' "${base[@]}" | median)"
    for s in gpipe 1f1b zb-h1; do
        step=() b0=() b1=() bm=() h0=() h1=() r0=() r1=()
        for r in $(seq "$rounds"); do
            out=$("$kiln" train models/gpt.lua --steps "$steps" "${cfg[@]}" --nproc 2 --pp 2 \
                --pp-balance "$balance" --set micro_batches=$m --set schedule=$s 2>&1)
            step+=("$(field '.*median \([0-9.]*\) ms\/step.*' "$out")")
            bub=$(grep '^pipeline bubble:' <<<"$out")
            b0+=("$(field '.*stage 0 \([0-9.]*\)%.*' "$bub")")
            b1+=("$(field '.*stage 1 \([0-9.]*\)%.*' "$bub")")
            bm+=("$(field '.*mean \([0-9.]*\)%.*' "$bub")")
            mem=$(grep '^pipeline memory:' <<<"$out")
            h0+=("$(mib "$(field '.*stage 0 holds [0-9]* micro-batches (\([0-9.]* [KMG]*i*B\)).*' "$mem")")")
            h1+=("$(mib "$(field '.*stage 1 holds [0-9]* micro-batches (\([0-9.]* [KMG]*i*B\)).*' "$mem")")")
            r0+=("$(mib "$(field '.*stage 0 .*peak resident \([0-9.]* [KMG]*i*B\) |.*' "$mem")")")
            r1+=("$(mib "$(field '.*stage 1 .*peak resident \([0-9.]* [KMG]*i*B\)$' "$mem")")")
        done
        idle=$("$kiln" compile models/gpt.lua "${cfg[@]}" --pp 2 --set micro_batches=$m \
            --set schedule=$s | sed -n 's/^# bubble: \([0-9.]*\)%.*/\1/p')
        if [ "$s" = zb-h1 ]; then f=$(echo "100 / (3 * $m + 1)" | bc -l); else f=$(echo "100 / ($m + 1)" | bc -l); fi
        printf '%-6s %-2s %9s | %7s%% %7s%% %7s%% | %5s%% %6.1f%% | %s, %s / %s, %s MiB\n' "$s" "$m" \
            "$(med "${step[@]}")" "$(med "${b0[@]}")" "$(med "${b1[@]}")" "$(med "${bm[@]}")" \
            "$idle" "$f" "$(med "${h0[@]}")" "$(med "${h1[@]}")" "$(med "${r0[@]}")" \
            "$(med "${r1[@]}")"
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
