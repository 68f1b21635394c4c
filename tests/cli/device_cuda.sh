#!/bin/bash
# --device on a machine without a GPU driver: kiln links no CUDA library
# (it starts anywhere); --device cuda is a clear error with a non-zero exit
# (never a crash); --device auto and cpu train on the CPU. On a machine with a
# driver the cuda checks belong to tests/gpu/run.sh, and this script checks
# only the linking.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-device-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

if ldd "$KILN" | grep -E 'libcuda\.|libcudart|libnvrtc|libcublas'; then
    fail "kiln links a CUDA library (it must load the CUDA module with dlopen)"
fi

train() { "$KILN" train models/addition.lua --steps 1 --set batch=8 -q "$@"; }

if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -e /usr/lib/x86_64-linux-gnu/libcuda.so.1 ]; then
    echo "a CUDA driver is installed here: the no-driver checks do not apply"
    exit 0
fi

train --device cuda > "$dir/err.log" 2>&1 && fail "--device cuda succeeded without a driver: $(cat "$dir/err.log")"
grep -q "internal error\|Segmentation\|Aborted" "$dir/err.log" && fail "crash: $(cat "$dir/err.log")"
grep -qF -- "--device cuda:" "$dir/err.log" || fail "message does not name --device cuda: $(cat "$dir/err.log")"
if [ -e "$(dirname "$KILN")/libkiln_cuda.so" ]; then
    grep -q "no CUDA driver" "$dir/err.log" || fail "message does not say there is no driver: $(cat "$dir/err.log")"
else
    grep -q "without the CUDA backend" "$dir/err.log" || fail "message does not say the backend is missing: $(cat "$dir/err.log")"
fi
echo "--device cuda: $(head -1 "$dir/err.log")"

train --device auto > "$dir/auto.log" 2>&1 || fail "--device auto failed: $(cat "$dir/auto.log")"
train --device cpu > "$dir/cpu.log" 2>&1 || fail "--device cpu failed: $(cat "$dir/cpu.log")"
grep -q "apply to --device cuda" "$dir/cpu.log" && fail "a note without GPU settings: $(cat "$dir/cpu.log")"
# GPU-only settings on the CPU: trained, with a note rather than silence
train --device auto --set precision=bf16 > "$dir/bf16.log" 2>&1 ||
    fail "precision=bf16 on the CPU failed: $(cat "$dir/bf16.log")"
grep -q "precision=bf16, tf32 and cuda_graph apply to --device cuda" "$dir/bf16.log" ||
    fail "no note that precision=bf16 is for the GPU: $(cat "$dir/bf16.log")"
echo "ok"
