#!/bin/bash
# The fused attention kernels on the CPU: ms/step of gpt.lua with the
# attention pass on (--fuse-attention, the default) and off, each run
# ROUNDS times alternating, and the ratio of the medians.
#
#   bench/attention_cpu.sh [KILN] [STEPS] [ROUNDS]
#
# Two configurations: tiny (the model's defaults) and small (L=4 C=256
# V=512 T=256 batch=8, f32, --threads 2, the size of issue 16's goal). The
# step time is kiln train's median ms/step. On a busy machine the numbers
# move a lot: compare the ratio, and run again.
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-30}
rounds=${3:-3}
log=$(mktemp "${TMPDIR:-/tmp}/kiln-bench-attn-XXXXXX")
trap 'rm -f "$log"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

run() { # NAME FLAGS...: one kiln train, prints its median ms/step
    "$kiln" train models/gpt.lua --steps "$steps" -q "$@" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
    sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' "$log"
}

echo "gpt.lua, $steps steps per run, $rounds runs each way, CPU (machine load: $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-8s %14s %14s %8s\n' config "fused ms/step" "unfused ms/step" speedup
for cfg in tiny small; do
    flags=(--threads 2)
    [ "$cfg" = small ] && flags+=(--set L=4 --set C=256 --set V=512 --set T=256 --set batch=8)
    on=() off=()
    for ((r = 0; r < rounds; r++)); do
        on+=("$(run "${flags[@]}" --fuse-attention)")
        off+=("$(run "${flags[@]}" --no-fuse-attention)")
    done
    mon=$(printf '%s\n' "${on[@]}" | median)
    moff=$(printf '%s\n' "${off[@]}" | median)
    printf '%-8s %14.2f %14.2f %7.2fx\n' "$cfg" "$mon" "$moff" "$(echo "$moff / $mon" | bc -l)"
done
