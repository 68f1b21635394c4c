#!/bin/bash
# tests/gpu/run.sh - the CUDA backend on a lent GPU machine (an H200), in one
# run of a few minutes: builds, then
#   1. CUDA equals CPU for every model in models/ (tests/unit/test_cuda_run.c:
#      loss and gradients after one step, f32 with TF32 off within 1e-4;
#      bf16 loss within 1e-2; CUDA graph replay equals plain launches), and
#      every kernel compiles for this GPU's own architecture;
#   2. gpt.lua (tiny) trains 200 steps on the GPU with the CPU's loss curve;
#   2b. the NCCL path on this GPU: gpt tiny with buckets and all-reduces on
#      one rank (KILN_COMM_ONE_RANK=1: NCCL on the communication stream,
#      gated by events) against the CPU with the same plan and against the
#      GPU without collectives (final params and loss); with 2 or more GPUs,
#      2 ranks against 1 rank at the combined batch; --profile from device
#      events;
#   3. speed: GPT-2 124M, batch 16 x 1024 tokens, bf16: kiln (plain and with
#      a CUDA graph) beside PyTorch eager and torch.compile on the same
#      machine (tests/gpu/torch_gpt2.py), tokens/s and MFU against the
#      H200's dense bf16 peak (989 TFLOP/s, datasheet);
# and prints one table. Exit status: non-zero when a check fails.
#
#   tests/gpu/run.sh [--quick]      (--quick: skip the PyTorch rows)
#
# The lent machine has no package registry: first run tests/gpu/carry-debs.sh
# here (fills .debs/ with the build's Debian packages, ~21 MB) and name
# `.debs` in the device call's carry; tests/gpu/kit.sh unpacks them there.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
B=${KILN_GPU_BUILD:-build-gpu}
OUT=${OUT:-$ROOT/$B/gpu-results}
PEAK_GFLOPS=${PEAK_GFLOPS:-989000}
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
mkdir -p "$OUT"
export KILN_CACHE_DIR=$ROOT/$B/kiln-cache
fails=0
rows=()
row() { rows+=("$(printf '%-44s | %s' "$1" "$2")"); echo "== $1: $2"; }
bad() { fails=$((fails + 1)); row "$1" "FAIL: $2"; }

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc

# the build's Debian packages, when the call carries them (.debs/)
source "$ROOT/tests/gpu/kit.sh"

echo "== build"
t0=$(date +%s)
if ! { cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release "${KIT_CMAKE_ARGS[@]}" >"$OUT/cmake.log" 2>&1 &&
       make -C "$B" -j"$(nproc)" kiln kiln_cuda test_cuda_run test_cuda_compile >"$OUT/make.log" 2>&1; }; then
    tail -30 "$OUT/cmake.log" "$OUT/make.log"
    echo "build failed"; exit 1
fi
[ -e "$B/libkiln_cuda.so" ] || { echo "the CUDA module was not built (CUDA toolkit not found?)"; exit 1; }
row "build" "ok ($(( $(date +%s) - t0 )) s)"
KILN=$ROOT/$B/kiln
export KILN_BIN=$KILN

# 1. equality with the CPU on every model
if timeout 300 "$B/tests/test_cuda_run" >"$OUT/equal.log" 2>&1; then
    row "CUDA = CPU, every model (f32, bf16, graph)" "ok"
else
    bad "CUDA = CPU, every model (f32, bf16, graph)" "see $OUT/equal.log"
fi
grep -E "f32:|bf16:|skipped|ERROR|error" "$OUT/equal.log" | sed 's/^/   /'

# 2. gpt tiny: 200 steps, CPU and GPU loss curves
curve() { "$KILN" train models/gpt.lua --steps 200 --device "$1" --set log_every=1 "${@:2}" 2>&1 |
          awk '/^step/ { for (i = 1; i <= NF; i++) if ($i == "loss") print $(i + 1) }'; }
curve cpu > "$OUT/loss_cpu.txt"
curve cuda > "$OUT/loss_cuda.txt"
cmp_out=$(paste "$OUT/loss_cpu.txt" "$OUT/loss_cuda.txt" | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > m) { m = r; at = n } last_c = $1; last_g = $2 }
    END { printf "%d steps, max rel diff %.2e (step %d), final cpu %s cuda %s\n", n, m, at, last_c, last_g;
          exit !(n == 200 && m < 1e-2) }')
if [ $? -eq 0 ]; then row "gpt tiny 200 steps: loss curve vs CPU" "ok: $cmp_out"
else bad "gpt tiny 200 steps: loss curve vs CPU" "$cmp_out"; fi

# 2b. the NCCL path. One rank: ncclAvg over one rank is an identity, so this
# checks that the path runs (NCCL found and initialised, the unique id, the
# communication stream and its events, device timing) and leaves the values
# as the plan computes them; it cannot see a missing wait (a race) or a
# wrong scale. Those need 2 GPUs (the --nproc 2 row, when there are 2).
nccl_run() { # name, device, extra args...
    local name=$1 dev=$2; shift 2
    "$KILN" train models/gpt.lua --steps 20 --device "$dev" --set bucket_mb=0.05 -v \
        --save-weights "$OUT/w_$name.safetensors" "$@" >"$OUT/nccl_$name.log" 2>&1
}
final_loss() { sed -n 's/^final: step [0-9]* | train loss \([^ ]*\) .*/\1/p' "$OUT/nccl_$1.log"; }
cmpw() { python3 "$ROOT/tests/gpu/cmp_weights.py" "$OUT/w_$1.safetensors" "$OUT/w_$2.safetensors" "$3"; }
if KILN_COMM_ONE_RANK=1 nccl_run cuda_nccl cuda && KILN_COMM_ONE_RANK=1 nccl_run cpu_comm cpu &&
        nccl_run cuda_plain cuda; then
    if ! grep -q "NCCL all-reduces, rank 0 of 1" "$OUT/nccl_cuda_nccl.log"; then
        bad "NCCL path, 1 rank" "the run did not use NCCL (see $OUT/nccl_cuda_nccl.log)"
    else
        l_n=$(final_loss cuda_nccl); l_c=$(final_loss cpu_comm); l_p=$(final_loss cuda_plain)
        c1=$(cmpw cuda_nccl cpu_comm 1e-3); r1=$?
        c2=$(cmpw cuda_nccl cuda_plain 1e-3); r2=$?
        lossok=$(awk -v a="$l_n" -v b="$l_c" 'BEGIN { d = a - b; if (d < 0) d = -d; print (a != "" && d <= 1e-3 * (b < 0 ? -b : b)) }')
        if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ "$lossok" = 1 ]; then
            row "NCCL path, 1 rank, gpt tiny 20 steps" "ok: loss nccl $l_n cpu $l_c plain $l_p; vs cpu $c1; vs plain $c2"
        else
            bad "NCCL path, 1 rank, gpt tiny 20 steps" "loss nccl $l_n cpu $l_c plain $l_p; vs cpu $c1; vs plain $c2"
        fi
    fi
else
    bad "NCCL path, 1 rank" "a run failed: $(tail -2 "$OUT"/nccl_*.log | tr '\n' ' ')"
fi
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${ngpu:-0}" -ge 2 ]; then
    if nccl_run cuda_2ranks cuda --nproc 2 --set batch=4 && nccl_run cpu_1rank8 cpu --set batch=8; then
        c3=$(cmpw cuda_2ranks cpu_1rank8 1e-3); r3=$?
        comm=$(grep '^comm:' "$OUT/nccl_cuda_2ranks.log" | sed 's/.*rank 0): //')
        if [ $r3 -eq 0 ] && [ -n "$comm" ]; then
            row "NCCL, 2 GPUs x batch 4 vs CPU 1 x 8" "ok: $c3; $comm"
        else
            bad "NCCL, 2 GPUs x batch 4 vs CPU 1 x 8" "$c3; comm line: '${comm}'"
        fi
    else
        bad "NCCL, 2 GPUs" "a run failed: $(tail -3 "$OUT/nccl_cuda_2ranks.log" | tr '\n' ' ')"
    fi
else
    row "NCCL, 2 GPUs" "not run (this machine has ${ngpu:-0} GPU)"
fi
# --profile from device events: the per-kernel table, and the step time
if "$KILN" train models/gpt.lua --steps 20 --device cuda --profile >"$OUT/profile_tiny.log" 2>&1 &&
        grep -q "^profile: per kernel over 20 training steps" "$OUT/profile_tiny.log" &&
        grep -q "median [0-9.]* ms/step" "$OUT/profile_tiny.log"; then
    row "--profile (device events), gpt tiny" "ok: $(grep '^final:' "$OUT/profile_tiny.log" | sed 's/.*median/median/' | cut -d'|' -f1)"
else
    bad "--profile (device events), gpt tiny" "see $OUT/profile_tiny.log"
fi

# 3. speed: GPT-2 124M, 16 x 1024 tokens, bf16
TOK=$OUT/tokens.bin
python3 "$ROOT/tests/gpu/make_tokens.py" "$TOK" 2000000 50257 || { echo "cannot write $TOK"; exit 1; }
speed() { # label, extra args...
    local label=$1; shift
    "$KILN" train models/gpt.lua --set size=124M --set batch=16 --set precision=bf16 \
        --set data_path="$TOK" --steps 30 --device cuda --peak-gflops "$PEAK_GFLOPS" "$@" \
        >"$OUT/$label.log" 2>&1
    local rc=$?
    local fin; fin=$(grep '^final:' "$OUT/$label.log")
    if [ $rc -ne 0 ] || [ -z "$fin" ]; then
        bad "$label" "exit $rc: $(tail -3 "$OUT/$label.log" | tr '\n' ' ')"
        return
    fi
    row "$label" "$(echo "$fin" | sed 's/.*median/median/')"
}
speed "kiln GPT-2 124M bf16"
speed "kiln GPT-2 124M bf16 + CUDA graph" --set cuda_graph=true
"$KILN" train models/gpt.lua --set size=124M --set batch=16 --set precision=bf16 \
    --set data_path="$TOK" --steps 6 --device cuda --profile >"$OUT/profile.log" 2>&1 || true

if [ $QUICK -eq 0 ]; then
    if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
        for mode in eager compile; do
            if timeout 400 python3 "$ROOT/tests/gpu/torch_gpt2.py" --mode $mode --batch 16 --seq 1024 \
                    --steps 30 --peak-gflops "$PEAK_GFLOPS" >"$OUT/torch_$mode.log" 2>&1; then
                row "PyTorch $mode GPT-2 124M bf16" "$(tail -1 "$OUT/torch_$mode.log")"
            else
                row "PyTorch $mode GPT-2 124M bf16" "failed: $(tail -2 "$OUT/torch_$mode.log" | tr '\n' ' ')"
            fi
        done
    else
        row "PyTorch" "not available on this machine (import torch failed or no GPU)"
    fi
fi

echo
echo "== results ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
printf '%s\n' "${rows[@]}"
echo "(MFU: model FLOPs per step over ${PEAK_GFLOPS} GFLOP/s; logs in $OUT)"
echo "== top kernels (kiln --profile, 124M bf16)"
sed -n '/^profile: per kernel/,/^$/p' "$OUT/profile.log" | head -25
exit $(( fails > 0 ))
