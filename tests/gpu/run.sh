#!/bin/bash
# tests/gpu/run.sh - the CUDA backend on a lent GPU machine (an H200), in one
# call of about ten minutes. Device time is scarce (15 minutes per task, all
# tries together), so every part runs under `timeout`, the parts run in order
# of value, and a part is skipped (and says so) when the time left in the
# budget is below its cap:
#   0. preflight: GPU, driver, toolkit, NCCL and NVTX (headers and libraries,
#      also from Python wheels), make or ninja;
#   1. build (Release, the machine's own architecture);
#   2. CUDA equals CPU for every model in models/ (tests/unit/test_cuda_run.c:
#      loss and gradients after one step, f32 with TF32 off within 1e-4; bf16
#      loss within 1e-2; CUDA graph replay equals plain launches); gpt tiny's
#      200-step loss curve against the CPU's; the NCCL path on one rank (and
#      2 ranks against 1 where there are 2 GPUs); --profile from device events;
#   3. speed: GPT-2 124M, batch 16 x 1024 tokens, bf16, with --profile: kiln
#      plain and with a CUDA graph, tokens/s and MFU against the H200's dense
#      bf16 peak (989 TFLOP/s, datasheet);
#   4. PyTorch eager on the same model (tests/gpu/torch_gpt2.py);
#   5. torch.compile, capped (its compile alone can take minutes).
# Output: $OUT/summary.txt (the table, also printed last) and
# $OUT/gpu-logs.tar.gz (every log), two files whose names a device call
# brings back. Exit status: non-zero when a check fails.
#
#   tests/gpu/run.sh [--quick] [--plan]
#     --quick  skip PyTorch (parts 4 and 5)
#     --plan   print the parts, their time caps and the files returned, then
#              exit 0; needs no GPU (a ctest test runs it)
#   KILN_GPU_BUDGET   seconds this script may take in all (default 540)
#
# The lent machine has no package registry: first run tests/gpu/carry-debs.sh
# here (fills .debs/ with the build's Debian packages, ~21 MB) and name
# `.debs` in the device call's carry; tests/gpu/kit.sh unpacks them there.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
B=${KILN_GPU_BUILD:-build-gpu}
OUT=${OUT:-$ROOT/$B/gpu-results}
LOGS=$ROOT/$B/gpu-logs
PEAK_GFLOPS=${PEAK_GFLOPS:-989000}
BUDGET=${KILN_GPU_BUDGET:-540}
QUICK=0 PLAN=0
for a in "$@"; do
    case $a in
    --quick) QUICK=1 ;;
    --plan) PLAN=1 ;;
    *) echo "usage: tests/gpu/run.sh [--quick] [--plan] (got '$a')" >&2; exit 2 ;;
    esac
done

# The parts: name, time cap in seconds. A part starts only when the budget
# still holds its cap; every command in it runs under `timeout`.
PARTS=(
    "0 preflight|60"
    "1 build|240"
    "2 CUDA = CPU (every model; gpt tiny curve; NCCL; profile)|240"
    "3 kiln GPT-2 124M bf16 speed (+ CUDA graph, --profile)|150"
    "4 PyTorch eager GPT-2 124M bf16|90"
    "5 torch.compile GPT-2 124M bf16 (capped)|150"
)
cap_of() { for p in "${PARTS[@]}"; do [ "${p%% *}" = "$1" ] && echo "${p##*|}"; done; }

if [ $PLAN -eq 1 ]; then
    echo "tests/gpu/run.sh: budget ${BUDGET} s (KILN_GPU_BUDGET); parts in order, each under timeout:"
    total=0
    for p in "${PARTS[@]}"; do
        name=${p%%|*} cap=${p##*|}
        skip=""
        [ $QUICK -eq 1 ] && case $name in 4*|5*) skip=" (skipped: --quick)"; cap=0 ;; esac
        total=$((total + cap))
        printf '  %-62s <= %4d s%s\n' "$name" "$cap" "$skip"
    done
    echo "  total of the caps: $total s; parts past the budget are skipped, not cut"
    echo "files returned under \$OUT: summary.txt, gpu-logs.tar.gz"
    exit 0
fi

T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
mkdir -p "$OUT" "$LOGS"
export KILN_CACHE_DIR=$ROOT/$B/kiln-cache
fails=0
rows=()
row() { rows+=("$(printf '%-44s | %s' "$1" "$2")"); echo "== $1: $2"; }
bad() { fails=$((fails + 1)); row "$1" "FAIL: $2"; }
# part NAME-PREFIX: true when the part's cap fits in what is left
part() {
    local cap; cap=$(cap_of "$1")
    if [ "$(left)" -lt "$cap" ]; then
        row "part $1" "skipped: $(left) s left of the budget, cap $cap s"
        return 1
    fi
    echo "== part $1 (cap $cap s, $(left) s left)"
}
# Packs the logs and the table into $OUT (also when stopped by a signal).
finish() {
    {
        echo "== results ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(( $(date +%s) - T0 )) s)"
        printf '%s\n' "${rows[@]}"
        echo "(MFU: model FLOPs per step over ${PEAK_GFLOPS} GFLOP/s)"
        if [ -s "$LOGS/profile.log" ]; then
            echo "== top kernels (kiln --profile, 124M bf16)"
            sed -n '/^profile: per kernel/,/^$/p' "$LOGS/profile.log" | head -25
        fi
        if [ -s "$LOGS/predict.log" ] && [ -s "$LOGS/profile.log" ]; then
            echo "== predicted (cost model, h200) vs measured per step, the predicted top 10"
            steps=$(sed -n 's/^profile: per kernel over \([0-9]*\) training steps.*/\1/p' "$LOGS/profile.log")
            awk -v steps="${steps:-1}" '
                FNR == NR { if ($1 != "" && $2 ~ /^[0-9]+$/) meas[$1] = $3 / steps; next }
                /costliest launches/ { on = 1; next }
                on && $1 == "kernel" { next }
                on && NF >= 6 { n = $1; sub(/_l[0-9]+$/, "", n); t = $3; u = $4
                    ms = (u == "ms") ? t : (u == "us") ? t / 1e3 : t * 1e3
                    m = (n in meas) ? sprintf("%.3f", meas[n]) : "?"
                    printf "  %-30s predicted %9.3f ms  measured %9s ms\n", $1, ms, m }
            ' "$LOGS/profile.log" "$LOGS/predict.log" | head -10
        fi
    } >"$OUT/summary.txt"
    tar czf "$OUT/gpu-logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
    echo
    cat "$OUT/summary.txt"
}
trap 'row "stopped" "by a signal after $(( $(date +%s) - T0 )) s"; finish; exit 1' INT TERM

# 0. preflight
part 0 || { finish; exit 1; }
gpu=$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
row "GPU, memory, driver" "${gpu:-none}"
nvcc_v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([^,]*\).*/\1/p')
row "CUDA toolkit (nvcc)" "${nvcc_v:-not found}"
# NCCL and NVTX: the toolkit's folders, the system's, then Python wheels
# (the H200 image ships nvidia-nccl-cu13 and nvidia-nvtx as wheels)
wheels=$(timeout 20 python3 -c 'import nvidia, os; print(" ".join(nvidia.__path__))' 2>/dev/null)
find_in() { # file name, dirs...
    local f=$1; shift
    for d in "$@"; do
        [ -d "$d" ] || continue
        local hit; hit=$(find "$d" -maxdepth 6 -name "$f" 2>/dev/null | head -1)
        [ -n "$hit" ] && { echo "$hit"; return 0; }
    done
    return 1
}
CUDA_DIRS=(/usr/local/cuda /usr/include /usr/lib/x86_64-linux-gnu $wheels)
nccl_h=$(find_in nccl.h "${CUDA_DIRS[@]}")
nccl_so=$(find_in 'libnccl.so*' "${CUDA_DIRS[@]}")
nvtx_h=$(find_in nvToolsExt.h "${CUDA_DIRS[@]}")
NCCL_ARGS=()
if [ -n "$nccl_h" ] && [ -n "$nccl_so" ]; then
    row "NCCL" "header $nccl_h, library $nccl_so"
    NCCL_ARGS=(-DKILN_NCCL_INCLUDE_DIR="$(dirname "$nccl_h")")
    export LD_LIBRARY_PATH=$(dirname "$nccl_so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    row "NCCL" "not found (header: ${nccl_h:-none}, library: ${nccl_so:-none}): the module is built without it, the NCCL rows fail"
fi
row "NVTX" "${nvtx_h:-not found} (kiln does not use NVTX yet)"
if command -v make >/dev/null; then GEN=(); row "build tool" "make"
elif command -v ninja >/dev/null; then GEN=(-G Ninja); row "build tool" "ninja (no make)"
else row "build tool" "neither make nor ninja"; finish; exit 1; fi
nproc >"$LOGS/nproc.txt"

# the build's Debian packages, when the call carries them (.debs/)
source "$ROOT/tests/gpu/kit.sh" >"$LOGS/kit.log" 2>&1

# 1. build
part 1 || { finish; exit 1; }
t0=$(date +%s)
if ! { timeout 60 cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release "${GEN[@]}" "${KIT_CMAKE_ARGS[@]}" \
           "${NCCL_ARGS[@]}" >"$LOGS/cmake.log" 2>&1 &&
       timeout 180 cmake --build "$B" -j"$(nproc)" --target kiln kiln_cuda test_cuda_run \
           test_cuda_compile >"$LOGS/build.log" 2>&1; }; then
    tail -30 "$LOGS/cmake.log" "$LOGS/build.log"
    bad "build" "see cmake.log, build.log"; finish; exit 1
fi
[ -e "$B/libkiln_cuda.so" ] || { bad "build" "the CUDA module was not built (CUDA toolkit not found?)"; finish; exit 1; }
row "build" "ok ($(( $(date +%s) - t0 )) s)"
KILN=$ROOT/$B/kiln
export KILN_BIN=$KILN

# 2. equality with the CPU
if part 2; then
    if timeout 120 "$B/tests/test_cuda_run" >"$LOGS/equal.log" 2>&1; then
        row "CUDA = CPU, every model (f32, bf16, graph)" "ok"
    else
        bad "CUDA = CPU, every model (f32, bf16, graph)" "exit $? (124: timeout), see equal.log"
    fi
    grep -E "f32:|bf16:|skipped|ERROR|error" "$LOGS/equal.log" | head -40 | sed 's/^/   /'

    # gpt tiny: 200 steps, CPU and GPU loss curves
    curve() { timeout 40 "$KILN" train models/gpt.lua --steps 200 --device "$1" --set log_every=1 "${@:2}" 2>&1 |
              awk '/^step/ { for (i = 1; i <= NF; i++) if ($i == "loss") print $(i + 1) }'; }
    curve cpu >"$LOGS/loss_cpu.txt"
    curve cuda >"$LOGS/loss_cuda.txt"
    cmp_out=$(paste "$LOGS/loss_cpu.txt" "$LOGS/loss_cuda.txt" | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > m) { m = r; at = n } last_c = $1; last_g = $2 }
        END { printf "%d steps, max rel diff %.2e (step %d), final cpu %s cuda %s\n", n, m, at, last_c, last_g;
              exit !(n == 200 && m < 1e-2) }')
    if [ $? -eq 0 ]; then row "gpt tiny 200 steps: loss curve vs CPU" "ok: $cmp_out"
    else bad "gpt tiny 200 steps: loss curve vs CPU" "$cmp_out"; fi

    # The NCCL path. One rank: ncclAvg over one rank is an identity, so this
    # checks that the path runs (NCCL found and initialised, the unique id,
    # the communication stream and its events, device timing) and leaves the
    # values as the plan computes them; it cannot see a missing wait (a race)
    # or a wrong scale. Those need 2 GPUs (the --nproc 2 row).
    nccl_run() { # name, device, extra args...
        local name=$1 dev=$2; shift 2
        timeout 30 "$KILN" train models/gpt.lua --steps 20 --device "$dev" --set bucket_mb=0.05 -v \
            --save-weights "$LOGS/w_$name.safetensors" "$@" >"$LOGS/nccl_$name.log" 2>&1
    }
    final_loss() { sed -n 's/^final: step [0-9]* | train loss \([^ ]*\) .*/\1/p' "$LOGS/nccl_$1.log"; }
    cmpw() { timeout 30 python3 "$ROOT/tests/gpu/cmp_weights.py" "$LOGS/w_$1.safetensors" "$LOGS/w_$2.safetensors" "$3"; }
    if KILN_COMM_ONE_RANK=1 nccl_run cuda_nccl cuda && KILN_COMM_ONE_RANK=1 nccl_run cpu_comm cpu &&
            nccl_run cuda_plain cuda; then
        if ! grep -q "NCCL all-reduces, rank 0 of 1" "$LOGS/nccl_cuda_nccl.log"; then
            bad "NCCL path, 1 rank" "the run did not use NCCL (see nccl_cuda_nccl.log)"
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
        bad "NCCL path, 1 rank" "a run failed: $(tail -2 "$LOGS"/nccl_*.log | tr '\n' ' ')"
    fi
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "${ngpu:-0}" -ge 2 ]; then
        if nccl_run cuda_2ranks cuda --nproc 2 --set batch=4 && nccl_run cpu_1rank8 cpu --set batch=8; then
            c3=$(cmpw cuda_2ranks cpu_1rank8 1e-3); r3=$?
            comm=$(grep '^comm:' "$LOGS/nccl_cuda_2ranks.log" | sed 's/.*rank 0): //')
            if [ $r3 -eq 0 ] && [ -n "$comm" ]; then
                row "NCCL, 2 GPUs x batch 4 vs CPU 1 x 8" "ok: $c3; $comm"
            else
                bad "NCCL, 2 GPUs x batch 4 vs CPU 1 x 8" "$c3; comm line: '${comm}'"
            fi
        else
            bad "NCCL, 2 GPUs" "a run failed: $(tail -3 "$LOGS/nccl_cuda_2ranks.log" | tr '\n' ' ')"
        fi
    else
        row "NCCL, 2 GPUs" "not run (this machine has ${ngpu:-0} GPU)"
    fi
    # --profile from device events: the per-kernel table, and the step time
    if timeout 30 "$KILN" train models/gpt.lua --steps 20 --device cuda --profile >"$LOGS/profile_tiny.log" 2>&1 &&
            grep -q "^profile: per kernel over 20 training steps" "$LOGS/profile_tiny.log" &&
            grep -q "median [0-9.]* ms/step" "$LOGS/profile_tiny.log"; then
        row "--profile (device events), gpt tiny" "ok: $(grep '^final:' "$LOGS/profile_tiny.log" | sed 's/.*median/median/' | cut -d'|' -f1)"
    else
        bad "--profile (device events), gpt tiny" "see profile_tiny.log"
    fi
fi

# 3. speed: GPT-2 124M, 16 x 1024 tokens, bf16
TOK=$LOGS/tokens.bin
speed() { # label, file, extra args...
    local label=$1 file=$2; shift 2
    timeout 60 "$KILN" train models/gpt.lua --set size=124M --set batch=16 --set precision=bf16 \
        --set data_path="$TOK" --steps 30 --device cuda --peak-gflops "$PEAK_GFLOPS" "$@" \
        >"$LOGS/$file.log" 2>&1
    local rc=$?
    local fin; fin=$(grep '^final:' "$LOGS/$file.log")
    if [ $rc -ne 0 ] || [ -z "$fin" ]; then
        bad "$label" "exit $rc (124: timeout): $(tail -3 "$LOGS/$file.log" | tr '\n' ' ')"
        return
    fi
    row "$label" "$(echo "$fin" | sed 's/.*median/median/')"
}
if part 3; then
    if timeout 30 python3 "$ROOT/tests/gpu/make_tokens.py" "$TOK" 2000000 50257; then
        # the cost model's prediction, to set beside the measured profile
        timeout 60 "$KILN" compile models/gpt.lua --set size=124M --set batch=16 --set precision=bf16 \
            --target h200 >"$LOGS/predict.log" 2>&1
        row "predicted (kiln compile --target h200)" "$(grep '^predicted step' "$LOGS/predict.log" | sed 's/.*: //')"
        speed "kiln GPT-2 124M bf16 (--profile)" profile --profile
        speed "kiln GPT-2 124M bf16 + CUDA graph" speed_graph --set cuda_graph=true
    else
        bad "GPT-2 124M" "cannot write $TOK"
    fi
fi

if [ $QUICK -eq 0 ]; then
    torch_row() { # part, mode, cap
        if ! timeout 30 python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
            row "PyTorch $2" "not available on this machine (import torch failed or no GPU)"
            return
        fi
        timeout "$3" python3 "$ROOT/tests/gpu/torch_gpt2.py" --mode "$2" --batch 16 --seq 1024 \
            --steps 30 --peak-gflops "$PEAK_GFLOPS" >"$LOGS/torch_$2.log" 2>&1
        local rc=$?
        if [ $rc -eq 0 ]; then row "PyTorch $2 GPT-2 124M bf16" "$(tail -1 "$LOGS/torch_$2.log")"
        else row "PyTorch $2 GPT-2 124M bf16" "exit $rc (124: over its ${3} s cap): $(tail -2 "$LOGS/torch_$2.log" | tr '\n' ' ')"; fi
    }
    part 4 && torch_row 4 eager "$(($(cap_of 4) - 10))"
    part 5 && torch_row 5 compile "$(($(cap_of 5) - 10))"
fi

finish
exit $(( fails > 0 ))
