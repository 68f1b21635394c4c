#!/bin/bash
# kiln against PyTorch on this machine's CPU (issue 16, part 4, last goal):
# gpt.lua small (L=4, C=256, V=512, T=256, batch 8, f32) in `kiln train` on
# THREADS threads, and the same GPT in PyTorch (tests/gpu/torch_gpt2.py:
# same shapes, AdamW, gradient clipping, random tokens of the same shape),
# tuned: torch.set_num_threads(THREADS) with OMP_NUM_THREADS,
# OPENBLAS_NUM_THREADS = THREADS and GOMP_SPINCOUNT=0, and OpenBLAS's
# kernels those kiln runs (OPENBLAS_CORETYPE: PyTorch's GEMMs go through
# the same OpenBLAS, which falls back to Prescott's SSE3 kernels on CPUs
# newer than itself; kiln then forces better ones, runtime/cpu/blas.c, and
# PyTorch gets the same, or a user's OPENBLAS_CORETYPE). The two run
# interleaved, ROUNDS times each, so that a busy machine slows both alike;
# each run's median ms/step is taken, then the median over rounds, and the
# ratio PyTorch / kiln (the goal: at least 1.6), with the ratio of each
# round's back-to-back pair and their median.
#
#   bench/vs_pytorch.sh [KILN] [THREADS] [STEPS] [ROUNDS]
#
# Needs PyTorch (Debian: apt-get install python3-torch); without it the
# bench says so and exits 0 after kiln's runs.
set -euo pipefail
kiln=${1:-build/kiln}
threads=${2:-2}
steps=${3:-20}
rounds=${4:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
cfg=(--set L=4 --set H=4 --set C=256 --set V=512 --set T=256 --set batch=8)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-vs-torch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

py=
for p in python3 /usr/bin/python3; do # Debian's torch is for the system python
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then
        py=$p
        break
    fi
done
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

core=$("$kiln" train models/gpt.lua --steps 1 -v "${cfg[@]}" 2>&1 |
    sed -n 's/^kiln: OpenBLAS runs its \([^ ]*\) kernels.*/\1/p')
[ -n "$core" ] || { echo "kiln did not say which OpenBLAS kernels it runs" >&2; exit 1; }
echo "OpenBLAS kernels: $core (kiln and PyTorch)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
for r in $(seq "$rounds"); do
    "$kiln" train models/gpt.lua --steps "$steps" --threads "$threads" -q "${cfg[@]}" 2>&1 |
        sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' >>"$tmp/kiln"
    [ -n "$py" ] || continue
    OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads GOMP_SPINCOUNT=0 OPENBLAS_CORETYPE=$core \
        "$py" "$here/tests/gpu/torch_gpt2.py" --device cpu --dtype f32 --L 4 --H 4 --C 256 \
        --V 512 --seq 256 --batch 8 --threads "$threads" --steps "$steps" >"$tmp/out" 2>&1 ||
        { cat "$tmp/out"; exit 1; }
    sed -n 's/^median \([0-9.]*\) ms\/step.*/\1/p' "$tmp/out" >>"$tmp/torch"
    [ "$r" -eq 1 ] && torch_version=$(sed -n 's/.*torch \([^)]*\)).*/\1/p' "$tmp/out")
done
k=$(median <"$tmp/kiln")
printf '%-44s %12s\n' "gpt.lua L4 C256 V512 T256 B8 f32, $threads threads" "ms/step"
printf '%-44s %12.2f   (runs: %s)\n' "kiln" "$k" "$(tr '\n' ' ' <"$tmp/kiln")"
if [ -z "$py" ]; then
    echo "PyTorch: not installed (apt-get install python3-torch); no ratio"
    exit 0
fi
t=$(median <"$tmp/torch")
printf '%-44s %12.2f   (runs: %s)\n' "PyTorch $torch_version (tuned threads)" "$t" "$(tr '\n' ' ' <"$tmp/torch")"
awk -v k="$k" -v t="$t" 'BEGIN { printf "kiln is %.2fx faster than PyTorch (ratio of the medians; goal 1.6x)\n", t / k }'
r=$(paste "$tmp/kiln" "$tmp/torch" | awk '{ if ($1 > 0) print $2 / $1 }' | median)
echo "per round (each pair run back to back): $(paste "$tmp/kiln" "$tmp/torch" |
    awk '{ if ($1 > 0) printf "%.2fx ", $2 / $1 }')median $(printf %.2f "$r")x"
echo "medians of $rounds interleaved runs of $steps steps each; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
