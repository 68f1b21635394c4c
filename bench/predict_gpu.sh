#!/bin/bash
# The cost model's GPT-2 124M bf16 step (T = 1024) on the GPUs of the
# device table, at batch 16 and 64: predicted step, MFU, tokens/s,
# launches, and each kernel class's share of the step (GEMMs; fused
# attention; memory-bound, compute-bound and launch-bound kernels, by the
# limit the model gives each launch; docs/cost.md), all from `kiln compile
# --target DEVICE`. No GPU needed: the prediction reads the compiled plan.
# Issue 37's goal to beat: 45% MFU on h100 at 16 x 1024, with kernels that
# earn it (the figures are what kiln's kernels are predicted to do).
#
#   bench/predict_gpu.sh [KILN] [DEVICES...]      (default: h100 h200 a100)
set -euo pipefail
kiln=${1:-build/kiln}
shift || true
devices=("$@")
[ ${#devices[@]} -gt 0 ] || devices=(h100 h200 a100)

# "1.23 ms" / "456.7 us" / "1.2 s" -> milliseconds
to_ms() { awk '{ v = $1; if ($2 == "s") v *= 1e3; else if ($2 == "us") v /= 1e3; printf "%.3f", v }'; }

printf '%-6s %5s %9s %6s %11s %8s  %6s %6s %6s %6s %6s\n' device batch "step ms" MFU tokens/s \
    launches GEMM attn memory comput launch
for batch in 16 64; do
    for dev in "${devices[@]}"; do
        out=$("$kiln" compile models/gpt.lua --set size=124M --set batch="$batch" \
              --set precision=bf16 --target "$dev" --top 100000)
        step=$(sed -n 's/^predicted step on [^:]*: \([0-9.]*\) \(s\|ms\|us\)$/\1 \2/p' <<<"$out" | to_ms)
        launches=$(sed -n 's/.* \([0-9]*\) launches, .*/\1/p' <<<"$out")
        mfu=$(sed -n 's/^  MFU \([0-9.]*%\) .*/\1/p' <<<"$out")
        tps=$(sed -n 's/.*; \([0-9.e+]*\) tokens\/s$/\1/p' <<<"$out")
        # every launch name of the step: its time and limit -> class shares
        shares=$(sed -n '/costliest launches/,$p' <<<"$out" | tail -n +3 | awk -v step="$step" '
            {
                # gemm rows: "gemm MxNxK [batched]"; others: name calls time unit % limit
                if ($1 == "gemm") { i = ($3 == "batched") ? 5 : 4; t = $i; u = $(i + 1); c = "gemm" }
                else { t = $3; u = $4; c = ($1 ~ /attention/) ? "attn" : $6 }
                if (u == "us") t /= 1e3; else if (u == "s") t *= 1e3
                if (c == "blocks") c = "memory"  # few blocks: still bytes at a share of the device
                s[c] += t
            }
            END {
                printf "%5.1f%% %5.1f%% %5.1f%% %5.1f%% %5.1f%%", 100 * s["gemm"] / step,
                    100 * s["attn"] / step, 100 * s["memory"] / step,
                    100 * s["compute"] / step, 100 * s["launch"] / step
            }')
        printf '%-6s %5d %9.2f %6s %11s %8d  %s\n' "$dev" "$batch" "$step" "$mfu" "$tps" \
            "$launches" "$shares"
    done
done
echo "goal (issue 37): MFU >= 45% on h100 at 16 x 1024, from kernels that earn it"
