#!/bin/bash
# tests/gpu/rehearse.sh CASE - tests/gpu/run.sh rehearsed end to end on a
# machine without a GPU: the CI build's kiln, libkiln_cuda.so and
# test_cuda_run as the "prebuilt binaries", over the fake driver, NVRTC,
# cuBLASLt and NCCL of tests/cudafake (FAKE_LIB), with tests/gpu/fake's
# nvidia-smi (an H100) and PyTorch stand-in. The numbers mean nothing; every
# part, the per-kernel table, the timeouts and the files under $OUT run.
#
# Cases:
#   full  every part: exit 0, every row of the table present and parsed
#         (no FAIL, the speed rows' medians, the predicted step, the
#         per-kernel table with predicted and measured figures), and the
#         three files returned
#   hang  KILN_GPU_HANG=3: the speed part's first command hangs; its
#         timeout ends it, the parts after it still run and the table and
#         the logs still come back (exit 1: the part failed)
#   kill  the run is killed (SIGKILL, as a device call's limit does) during
#         the smoke part: summary.txt already holds every row measured
#         before it
# Needs KILN (the kiln binary; its folder holds libkiln_cuda.so and
# tests/test_cuda_run) and FAKE_LIB; skipped (77) without the fakes.
set -u
: "${KILN:?KILN must point at the kiln binary}"
: "${FAKE_LIB:?FAKE_LIB must point at the fake libraries}"
case=${1:-full}
[ -e "$FAKE_LIB/libcuda.so.1" ] || { echo "no fake driver in $FAKE_LIB: skipped"; exit 77; }
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$(dirname "$KILN")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-rehearse.XXXXXX")
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/pre"
ln -s "$BUILD/kiln" "$T/pre/kiln"
ln -s "$BUILD/libkiln_cuda.so" "$T/pre/libkiln_cuda.so"
ln -s "$BUILD/tests/test_cuda_run" "$T/pre/test_cuda_run"
fail() { echo "--- summary.txt"; cat "$T/out/summary.txt" 2>/dev/null; echo "FAIL: $*"; exit 1; }

# tiny gpt in bf16 stands in for GPT-2 124M on the emulated device, the
# timeouts are 10 times longer, the loss curve 10 steps and test_cuda_run
# checks mlp.lua alone
env PATH="$ROOT/tests/gpu/fake:$PATH" \
    LD_LIBRARY_PATH="$FAKE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    OUT="$T/out" KILN_GPU_BUILD="$T/b" KILN_GPU_PREBUILT="$T/pre" KILN_GPU_REHEARSAL=1 \
    KILN_GPU_SPEED="--set precision=bf16" KILN_GPU_VOCAB=256 KILN_GPU_STEPS=3 \
    KILN_GPU_TORCH="$ROOT/tests/gpu/fake/torch_gpt2.py" KILN_GPU_TIME_SCALE=10 \
    KILN_GPU_CURVE_STEPS=10 KILN_CUDA_RUN_MODELS=mlp \
    KILN_GPU_HANG="$([ "$case" = hang ] && echo 3; [ "$case" = kill ] && echo 2)" \
    setsid bash "$ROOT/tests/gpu/run.sh" >"$T/run.log" 2>&1 &
pid=$!
if [ "$case" = kill ]; then
    for _ in $(seq 1 600); do
        grep -q '^prebuilt binaries' "$T/out/summary.txt" 2>/dev/null && [ -e "$T/b/gpu-logs/hung-2" ] && break
        sleep 0.2
    done
    sleep 1
    pkill -9 -s "$pid"
    wait "$pid" 2>/dev/null
    rows=$(grep -c ' | ' "$T/out/summary.txt")
    for r in "GPU, memory, driver" "device for --target" "tools" "glibc" "libcublasLt / libnvrtc" \
             "prebuilt binaries"; do
        grep -q "^$r" "$T/out/summary.txt" || fail "killed run: no '$r' row in summary.txt"
    done
    echo "killed during the smoke part: summary.txt holds $rows rows"
    exit 0
fi
wait "$pid"
rc=$?
cat "$T/run.log"
S=$T/out/summary.txt
[ -s "$S" ] || fail "no summary.txt"
[ -s "$T/out/gpu-logs.tar.gz" ] || fail "no gpu-logs.tar.gz"
# has NAME VALUE-REGEX: the row NAME (a fixed string) holds VALUE-REGEX
has() { grep -F "$1" "$S" | grep -qE "^[^|]*\| $2" ||
        fail "row '$1' missing or not '$2': $(grep -F "$1" "$S")"; }
has "GPU, memory, driver" "NVIDIA H100 80GB HBM3 \(fake\)"
has "device for --target and the MFU peak" "h100"
has "libcublasLt / libnvrtc" "/"
has "prebuilt binaries" "ok"
has "smoke: gpt tiny, 1 step on cuda" "ok"
has "PyTorch eager 124M bf16" "median [0-9.]* ms/step"
has "torch.compile 124M bf16" "median [0-9.]* ms/step"
has "CUDA = CPU, every model (f32, bf16, graph)" "ok"
has "gpt tiny 10 steps: loss curve vs CPU" "ok: 10 steps"
has "NCCL path, 1 rank, gpt tiny 20 steps" "ok"
if [ "$case" = hang ]; then
    [ $rc -eq 1 ] || fail "run.sh exited $rc with a hung part, expected 1"
    has "speed" "FAIL: cannot write the token file"
    grep -q "KILN_GPU_HANG: part 3" "$T/run.log" || fail "the hang hook did not fire"
    grep -q "^== .* 1 failed" "$S" || fail "the last line does not count the one failure"
    echo "hang: part 3 timed out; parts 4, 5 and 6 ran; the table and logs came back"
    exit 0
fi
[ $rc -eq 0 ] || fail "run.sh exited $rc"
grep -q "FAIL" "$S" && fail "a row failed"
has "predicted (kiln compile --target h100)" "[0-9.]* [mu]s"
has "kiln 124M bf16 (plain)" "median [0-9.]* ms/step"
has "kiln 124M bf16 + CUDA graph" "median [0-9.]* ms/step"
has "kiln 124M bf16 --profile" "median [0-9.]* ms/step"
has "per-kernel table (kernels.txt)" "total: predicted [0-9.]* ms, measured [0-9.]* ms"
K=$T/out/kernels.txt
# rows with both figures and a ratio, GEMMs among them, and the kinds' totals
both=$(awk '$1 ~ /^(gemm|kernel|copy)$/ && $5 ~ /^[0-9.]+$/ && $6 ~ /^[0-9.]+$/ && $7 ~ /^[0-9.]+$/' "$K" | wc -l)
gemms=$(awk '$1 == "gemm" && $3 ~ /^[0-9]+x[0-9]+x[0-9]+/ && $6 ~ /^[0-9.]+$/' "$K" | wc -l)
[ "$both" -ge 10 ] || fail "kernels.txt: $both rows with predicted, measured and ratio (expected >= 10)"
[ "$gemms" -ge 4 ] || fail "kernels.txt: $gemms GEMM rows with a shape and a measured time"
grep -qE '^  gemm .* predicted +[0-9.]+ ms +measured +[0-9.]+ ms' "$K" || fail "kernels.txt: no GEMM total"
grep -q "^== .* 0 failed" "$S" || fail "no closing line"
echo "full rehearsal: every row present; kernels.txt has $both joined rows ($gemms GEMMs)"
