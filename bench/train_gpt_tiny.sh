#!/bin/bash
# Trains gpt.lua (tiny) on the CPU and prints ms/step, tokens/s, MFU and the
# share of the step spent in GEMMs versus generated kernels (from --profile).
#
#   bench/train_gpt_tiny.sh [KILN] [STEPS] [extra kiln train flags...]
#
# MFU divides by --peak-gflops: by default 230 GFLOP/s, the fp32 FMA peak of
# the 2-core build machine (2 cores x 32 FLOP/cycle x 3.6 GHz, see
# shared/TOOLCHAIN.md); pass your machine's with KILN_PEAK_GFLOPS.
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-300}
shift $(( $# > 2 ? 2 : $# ))
peak=${KILN_PEAK_GFLOPS:-230}
log=$(mktemp "${TMPDIR:-/tmp}/kiln-bench-XXXXXX")
trap 'rm -f "$log"' EXIT

"$kiln" train models/gpt.lua --steps "$steps" --profile --peak-gflops "$peak" -q "$@" >"$log" 2>&1 ||
    { cat "$log"; exit 1; }
echo "gpt.lua (tiny), $steps steps, CPU, peak $peak GFLOP/s"
grep '^final:' "$log"
awk '/^profile: by kind/ { on = 1; next } on && NF == 0 { exit } on { print }' "$log"
