#!/usr/bin/env bash
# run.sh MODEL CASE - one cuda_fake_* test: `kiln train MODEL --device cuda`
# with the real libkiln_cuda.so on the fakes of tests/cudafake (FAKE_LIB on
# LD_LIBRARY_PATH), against the same run on the CPU backend. MODEL names
# models/MODEL.lua, or is a path (with a /) to a script; RUN_SETS, when set,
# adds its words (--set k=v ...) to both runs.
#
# Cases:
#   f32, f32_graph    losses of every step and every parameter at the end
#                     within 1e-4 relative (cmp_weights.py: per tensor,
#                     ||a - b|| / ||b||); _graph: --set cuda_graph=true, and
#                     the log must say the step was captured
#   bf16, bf16_graph  precision=bf16: losses within 1e-2
#   nproc2            --nproc 2 on both devices (the fake NCCL between the
#                     two ranks): losses and parameters within 1e-4
#   profile           --profile (an event after every plan step, read after
#                     the step): within 1e-4, and the per-kernel table printed
#   remat_full        --remat=full (recomputed forwards: more epilogue kinds):
#                     within 1e-4
#   accum             grad_accum=2 (the micro-batches on a second executor):
#                     within 1e-4
#   sgd, lion, adafactor   train{optimizer} other than AdamW (SGD with
#                     Nesterov momentum): within 1e-4. mlp only: on gpt the
#                     key biases' gradient (0 up to rounding) is divided by
#                     its own RMS by Adafactor (eps 1e-30), so those biases
#                     differ by the sign of the noise (losses agree to 2e-7)
#   nccl1             KILN_COMM_ONE_RANK=1 and bucket_mb=0.01: the NCCL path
#                     (communication stream, events, several buckets in
#                     flight during backward) on one rank: within 1e-4
#   neg_wait1, neg_wait2, neg_wait5   negative controls: nccl1 with the
#                     1st / 2nd / 5th cuStreamWaitEvent ignored by the fake
#                     driver: the run must stop with the fake's race report
#   neg_transa        f32 with TRANSA flipped by the fake cuBLASLt on square
#                     A: the comparison must fail
#   neg_lda           f32 with A read with lda + 1: the run must fail (an
#                     out-of-bounds read the fake reports, or the comparison)
#   neg_capture_sync  f32_graph with cublasLtMatmul synchronising its stream:
#                     inside the capture the driver must answer
#                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the run fail
#   neg_hostptr       f32 with a kernel's pointer argument replaced by a host
#                     pointer: the run must stop with the fake's report
# Every run: 3 steps (the graph cases: a warm-up run, the captured run, a
# replay), one evaluation batch at the end, AdamW's eps 1e-6 instead of 1e-8: Adam divides a
# gradient by its own magnitude plus eps, so a gradient that is exactly zero
# in exact arithmetic (a key bias in attention) becomes +-lr from rounding
# noise in either backend; eps 1e-6 leaves such noise small and real
# gradients (1e-4 and up) normalised as before.
# Every positive case also requires: exit 0, no fake-library complaint, no
# epilogue the heuristic refused. Skipped (77) without python3 (the weights
# comparison) or without the fakes.
set -u
: "${KILN:?KILN must point at the kiln binary}"
: "${FAKE_LIB:?FAKE_LIB must point at the fake libraries}"
model=$1 case=$2
script="models/$model.lua"
case $model in */*) script=$model ;; esac
command -v python3 >/dev/null || { echo "no python3 (cmp_weights.py): skipped"; exit 77; }
[ -e "$FAKE_LIB/libcuda.so.1" ] || { echo "no fake driver in $FAKE_LIB: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cudafake.XXXXXX")
trap 'rm -rf "$T"' EXIT
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

steps=3
args=(--steps "$steps" --set log_every=1 --set eval_every=1000000 --set eval_batches=1
      --set eps=1e-6)
[ "$model" = addition ] && args+=(--set batch=8)
if [ "$model" = cnn ]; then # data = "tensors": 8x8 images of oriented bars
    . "$ROOT/tests/cli/lib/arrays.sh"
    bars_xy 160 5 "$T/x.raw" "$T/y.raw"
    mkdir "$T/bars"
    npy_file "$T/bars/x.npy" 1 '<f4' '(160, 1, 8, 8)' "$T/x.raw"
    npy_file "$T/bars/y.npy" 1 '<i4' '(160,)' "$T/y.raw"
    args+=(--set data_path="$T/bars")
fi
read -ra run_sets <<<"${RUN_SETS:-}"
args+=("${run_sets[@]}")
ltol=1e-4 wtol=1e-4 negative="" cuda_env=() both_env=()
case $case in
f32) ;;
f32_graph) args+=(--set cuda_graph=true) ;;
bf16) args+=(--set precision=bf16); ltol=1e-2 wtol="" ;;
bf16_graph) args+=(--set precision=bf16 --set cuda_graph=true); ltol=1e-2 wtol="" ;;
nproc2) args+=(--nproc 2) ;;
profile) args+=(--profile) ;;
remat_full) args+=(--remat=full) ;;
accum) args+=(--set grad_accum=2) ;;
sgd) args+=(--set optimizer=sgd --set momentum=0.9 --set nesterov=true) ;;
lion) args+=(--set optimizer=lion --set lr=1e-3) ;;
adafactor) args+=(--set optimizer=adafactor) ;;
nccl1) both_env=(KILN_COMM_ONE_RANK=1); args+=(--set bucket_mb=0.01) ;;
neg_wait1) both_env=(KILN_COMM_ONE_RANK=1); cuda_env=(FAKE_CUDA_DROP_WAIT=1); negative=race ;;
neg_wait2) both_env=(KILN_COMM_ONE_RANK=1); cuda_env=(FAKE_CUDA_DROP_WAIT=2); negative=race ;;
neg_wait5) both_env=(KILN_COMM_ONE_RANK=1); args+=(--set bucket_mb=0.01)
           cuda_env=(FAKE_CUDA_DROP_WAIT=5); negative=race ;;
neg_transa) cuda_env=(FAKE_CUBLASLT_FLIP_TRANSA=1); negative=mismatch ;;
neg_lda) cuda_env=(FAKE_CUBLASLT_LDA_SKEW=1); negative=any ;;
neg_capture_sync) args+=(--set cuda_graph=true); cuda_env=(FAKE_CUBLASLT_SYNC=1); negative=capture ;;
neg_hostptr) cuda_env=(FAKE_CUDA_HOSTPTR_LAUNCH=5); negative=hostptr ;;
*) echo "unknown case $case"; exit 2 ;;
esac

# the reference
env "${both_env[@]}" timeout 300 "$KILN" train "$script" "${args[@]}" --threads 1 \
    --save-weights "$T/cpu.safetensors" >"$T/cpu.log" 2>&1 ||
    { cat "$T/cpu.log"; echo "FAIL: the CPU run failed"; exit 1; }
# the CUDA module on the fakes
env "${both_env[@]}" "${cuda_env[@]}" LD_LIBRARY_PATH="$FAKE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout 500 "$KILN" train "$script" "${args[@]}" --device cuda -v \
    --save-weights "$T/cuda.safetensors" >"$T/cuda.log" 2>&1
rc=$?

losses() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([^ ]*\) .*/\1/p; s/^final: step [0-9]* | train loss \([^ ]*\) .*/\1/p' "$1"; }
# compares the losses of the two logs; prints a summary; 0 when within $ltol
cmp_losses() {
    paste <(losses "$T/cpu.log") <(losses "$T/cuda.log") | awk -v tol="$ltol" -v want=$((steps + 1)) '
        { n++; if ($2 == "") { bad = 1; next } d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
          r = a > 0 ? d / a : d; if (!(r <= m)) m = r; if (!(r <= tol)) bad = 1 }
        END { printf "%d losses, max rel diff %.2e (tol %s)", n, m, tol; exit (bad || n != want) }'
}

if [ -n "$negative" ]; then
    echo "negative control $case: exit $rc"
    grep -E "^fake |failed" "$T/cuda.log" | head -5
    case $negative in
    race)
        [ $rc -ne 0 ] && grep -q "fake CUDA: race: " "$T/cuda.log" && exit 0
        echo "FAIL: a dropped event wait was not reported as a race"; exit 1 ;;
    hostptr)
        [ $rc -ne 0 ] && grep -q "is not device memory (a host pointer" "$T/cuda.log" && exit 0
        echo "FAIL: a host pointer as a kernel argument was not reported"; exit 1 ;;
    capture)
        [ $rc -ne 0 ] && grep -q "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" "$T/cuda.log" && exit 0
        echo "FAIL: a synchronisation inside the capture did not fail it"; exit 1 ;;
    mismatch)
        [ $rc -eq 0 ] || { tail -5 "$T/cuda.log"; echo "FAIL: the run itself failed (expected a wrong result)"; exit 1; }
        if out=$(cmp_losses); then echo "FAIL: the results still match: $out"; exit 1; fi
        echo "the comparison fails, as it must: $out"; exit 0 ;;
    any)
        if [ $rc -ne 0 ]; then echo "the run fails, as it must"; exit 0; fi
        if out=$(cmp_losses); then echo "FAIL: the results still match: $out"; exit 1; fi
        echo "the comparison fails, as it must: $out"; exit 0 ;;
    esac
fi

fail() { echo "--- cuda log (tail)"; tail -30 "$T/cuda.log"; echo "FAIL: $*"; exit 1; }
[ $rc -eq 0 ] || fail "the CUDA run on the fakes failed (exit $rc)"
grep -q "^fake " "$T/cuda.log" && fail "a fake library complained: $(grep '^fake ' "$T/cuda.log" | head -3)"
grep -q "no cuBLASLt algorithm for epilogue" "$T/cuda.log" && fail "cuBLASLt refused an epilogue"
# MFU's peak from the device (the fake says "fake H200 ...": the table's
# H200 figure for the run's precision)
case $case in
bf16*) peak="MFU against 989400 GFLOP/s: the bf16 dense peak of fake H200" ;;
*) peak="MFU against 66900 GFLOP/s: the f32 (CUDA cores) peak of fake H200" ;;
esac
grep -qF "$peak" "$T/cuda.log" || fail "no device peak line (expected '$peak')"
case $case in
*_graph) grep -q "step captured into a CUDA graph" "$T/cuda.log" || fail "no CUDA graph was captured" ;;
nproc2) grep -q "NCCL all-reduces, rank 0 of 2" "$T/cuda.log" || fail "the run did not use NCCL on 2 ranks" ;;
nccl1) grep -q "NCCL all-reduces, rank 0 of 1" "$T/cuda.log" || fail "the run did not use NCCL" ;;
profile) grep -qi "kernel" "$T/cuda.log" && grep -q "ms" "$T/cuda.log" || fail "no profile table" ;;
esac
out=$(cmp_losses) || fail "losses differ: $out; cpu: $(losses "$T/cpu.log" | tr '\n' ' ') cuda: $(losses "$T/cuda.log" | tr '\n' ' ')"
echo "$model $case: $out"
w=$(python3 "$ROOT/tests/gpu/cmp_weights.py" "$T/cuda.safetensors" "$T/cpu.safetensors" "${wtol:-1}")
wrc=$?
echo "parameters after $steps steps: $w"
[ -n "$wtol" ] && [ $wrc -ne 0 ] && fail "parameters differ by more than $wtol: $w"
exit 0
