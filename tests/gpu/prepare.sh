#!/bin/bash
# tests/gpu/prepare.sh - run here (the build machine, CUDA 13 toolkit, no GPU)
# before the device call, after tests/gpu/carry-debs.sh: a Release build
# whose kiln, libkiln_cuda.so and test_cuda_run go into .gpu/ (kept out of
# git through .git/info/exclude), with a kernel cache compiled by NVRTC for
# sm_90 (H100 and H200) from the programs run.sh runs first (GPT-2 124M
# bf16; gpt tiny f32 and bf16; every model's default step), so the lent
# machine skips the cold compile of those. Name `.gpu` (and `.debs`, whose
# libraries the binaries load there) in the call's carry; tests/gpu/run.sh
# uses .gpu/ when its kiln starts, and builds there otherwise.
#   KILN_GPU_SPEED   the speed part's settings, as in run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude=$(git rev-parse --git-common-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
B=build-gpu-prep
mkdir -p "$B"
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release >"$B/prepare-cmake.log" 2>&1 ||
    { tail -20 "$B/prepare-cmake.log"; exit 1; }
cmake --build "$B" -j"$(nproc)" --target kiln kiln_cuda test_cuda_run >/dev/null
[ -e "$B/libkiln_cuda.so" ] || { echo "prepare.sh: no libkiln_cuda.so: CMake did not find the CUDA toolkit"; exit 1; }
rm -rf .gpu
mkdir -p .gpu/kiln-cache
cp "$B/kiln" "$B/libkiln_cuda.so" "$B/tests/test_cuda_run" .gpu/
read -r -a speed <<<"${KILN_GPU_SPEED:---set size=124M --set batch=16 --set precision=bf16}"
warm() { .gpu/kiln compile "$@" --target h100 --cache-dir .gpu/kiln-cache >/dev/null ||
         echo "prepare.sh: could not warm the cache for: $*"; }
warm models/gpt.lua "${speed[@]}"
for m in models/*.lua; do
    warm "$m"
    warm "$m" --set precision=bf16
done
n=$(ls .gpu/kiln-cache/cuda | grep -c 'cubin$')
echo "prepare.sh: .gpu/ holds kiln, libkiln_cuda.so, test_cuda_run and $n cubins for sm_90 ($(du -sh .gpu | cut -f1))"
echo "device call: carry [\".debs\", \".gpu\"], command tests/gpu/run.sh, timeout_s 600"
