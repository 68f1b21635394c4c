#!/bin/bash
# The issue-16 goal on the cost model: for gpt 124M (batch 16 x 1024, bf16)
# on each GPU of the device table, the predicted step, the step's GEMM
# time, their ratio (goal: at most 1.3), predicted MFU (goal: at least 45%)
# and the launches of one step, all from `kiln compile --target DEVICE`
# (docs/cost.md); then, for the first device, the ten costliest kernels
# that are not GEMMs (launches of one kernel summed), with what limits
# each. No GPU needed: the prediction reads the compiled plan.
#
#   bench/predict_gpu.sh [KILN] [DEVICES...]      (default: h200 h100 a100 b200)
set -euo pipefail
kiln=${1:-build/kiln}
shift || true
devices=("$@")
[ ${#devices[@]} -gt 0 ] || devices=(h200 h100 a100 b200)
flags=(--set size=124M --set batch=16 --set precision=bf16)

# "1.23 ms" / "456.7 us" / "1.2 s" -> milliseconds
to_ms() { awk '{ v = $1; if ($2 == "s") v *= 1e3; else if ($2 == "us") v /= 1e3; printf "%.3f", v }'; }

printf '%-6s %10s %10s %8s %7s %9s\n' device "step ms" "GEMM ms" ratio MFU launches
first=""
for dev in "${devices[@]}"; do
    out=$("$kiln" compile models/gpt.lua "${flags[@]}" --target "$dev" --top 60)
    step=$(sed -n 's/^predicted step on [^:]*: \([0-9.]*\) \(s\|ms\|us\)$/\1 \2/p' <<<"$out" | to_ms)
    gemm=$(sed -n 's/^  GEMMs \([0-9.]*\) \(s\|ms\|us\), .*/\1 \2/p' <<<"$out" | to_ms)
    launches=$(sed -n 's/.* \([0-9]*\) launches, .*/\1/p' <<<"$out")
    mfu=$(sed -n 's/^  MFU \([0-9.]*%\) .*/\1/p' <<<"$out")
    awk -v d="$dev" -v s="$step" -v g="$gemm" -v m="$mfu" -v l="$launches" \
        'BEGIN { printf "%-6s %10.2f %10.2f %8.2f %7s %9d\n", d, s, g, (g > 0 ? s / g : 0), m, l }'
    [ -n "$first" ] || first=$out
done
echo "goal (issue 16, section 4): step <= 1.3 x GEMM time, MFU >= 45%"
echo
echo "ten costliest non-GEMM kernels on ${devices[0]} (time over the step):"
sed -n '/costliest launches/,$p' <<<"$first" | sed -n '2p'
sed -n '/costliest launches/,$p' <<<"$first" | sed -n '3,$p' | grep -v '^    gemm ' | head -10
