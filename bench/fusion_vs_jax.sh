#!/usr/bin/env bash
# fusion_vs_jax.sh - the CPU training step of models/gpt.lua at a small
# config, kiln fused vs kiln --no-fuse vs the same model in JAX (jit, AdamW),
# side by side in one run, both on 2 threads. Prints ms/step, the ratios,
# and the share of kiln's fused step spent outside GEMMs. A benchmark, not a
# test: it asserts nothing.
#
# Usage: bench/fusion_vs_jax.sh [KILN]   (default: build/kiln; run from the
# repository root). The JAX side runs in a virtual environment this script
# creates from PyPI ($KILN_BENCH_VENV, default ~/.cache/kiln/venv-jax).
# Config: L=4 C=256 H=4 T=128 batch=8 V=256 (override with env L, C, ...).
set -euo pipefail
KILN=${1:-build/kiln}
L=${L:-4} C=${C:-256} H=${H:-4} T=${T:-128} B=${B:-8} V=${V:-256}
STEPS=${STEPS:-10} ROUNDS=${ROUNDS:-5} THREADS=2
VENV=${KILN_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/venv-jax}
here=$(cd "$(dirname "$0")" && pwd)

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV (jax from PyPI) ..." >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2
  "$VENV/bin/pip" install --quiet "jax[cpu]" >&2
fi

export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d)}
sets=(--set L=$L --set C=$C --set H=$H --set T=$T --set batch=$B --set V=$V)

kiln_ms() { # extra flags...; prints the median ms/step
  "$KILN" train models/gpt.lua "${sets[@]}" --steps "$STEPS" --threads $THREADS -q "$@" |
    sed -n 's/.*median \([0-9.]*\) ms\/step.*/\1/p'
}
jax_ms() {
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=$THREADS" \
    OMP_NUM_THREADS=$THREADS \
    "$VENV/bin/python" "$here/fusion_jax_gpt.py" $L $C $H $T $B $V "$STEPS" |
    sed -n 's/.*median_ms \([0-9.]*\).*/\1/p'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
best() { sort -g | head -1; }

# warm the kernel cache, then alternate the three so load changes hit all
kiln_ms >/dev/null
kiln_ms --no-fuse >/dev/null
F=() U=() J=()
for r in $(seq "$ROUNDS"); do
  F+=("$(kiln_ms)")
  U+=("$(kiln_ms --no-fuse)")
  J+=("$(jax_ms)")
  echo "round $r: kiln fused ${F[-1]} ms, kiln unfused ${U[-1]} ms, jax ${J[-1]} ms" >&2
done
f=$(printf '%s\n' "${F[@]}" | median)
u=$(printf '%s\n' "${U[@]}" | median)
j=$(printf '%s\n' "${J[@]}" | median)
fb=$(printf '%s\n' "${F[@]}" | best)
ub=$(printf '%s\n' "${U[@]}" | best)
jb=$(printf '%s\n' "${J[@]}" | best)

# kiln's time by kind (fused), from --profile
prof=$("$KILN" train models/gpt.lua "${sets[@]}" --steps "$STEPS" --threads $THREADS -q --profile)
gemm=$(echo "$prof" | awk '/^profile: by kind/ {on=1} on && $1=="gemm" {print $3; exit}')
total=$(echo "$prof" | awk '/^profile: by kind/ {on=1} on && $1=="total" {print $2; exit}')

echo "gpt.lua L=$L C=$C H=$H T=$T batch=$B V=$V, f32, $THREADS threads, $ROUNDS rounds x $STEPS steps"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (on $(nproc) cores)"
printf '%-22s %12s %12s\n' "ms/step" "median" "best round"
printf '%-22s %12.2f %12.2f\n' "kiln (fused)" "$f" "$fb"
printf '%-22s %12.2f %12.2f\n' "kiln (--no-fuse)" "$u" "$ub"
printf '%-22s %12.2f %12.2f\n' "jax (jit)" "$j" "$jb"
awk -v f="$f" -v u="$u" -v j="$j" -v fb="$fb" -v ub="$ub" -v jb="$jb" 'BEGIN {
  printf "fusion speedup (unfused / fused): %.2fx median, %.2fx best\n", u / f, ub / fb
  printf "kiln fused vs jax (jax / kiln):   %.2fx median, %.2fx best  (>1: kiln faster)\n", j / f, jb / fb }'
awk -v g="$gemm" -v t="$total" 'BEGIN {
  if (t > 0) printf "kiln fused: %.1f%% of step time outside GEMMs (profiled)\n", 100 * (t - g) / t }'
