#!/bin/bash
# tests/gpu/run.sh - kiln's CUDA backend on a lent GPU machine (one H100 or
# H200), in ONE device call. Device time is scarce (15 minutes per task, all
# tries together, machine start-up included), so the numbers that matter
# come first, every command runs under `timeout`, and every row is appended
# to $OUT/summary.txt the moment it is measured: a run killed at any point
# still returns what it had.
#
# Parts, in order (each part's cap is the sum of its commands' timeouts;
# a command's timeout is also cut to what is left of the budget, so the
# whole run ends inside KILN_GPU_BUDGET whatever hangs):
#   0. preflight: tools (cc c++ make ninja cmake nvcc), where libcublasLt,
#      libnvrtc and nccl.h are, glibc, the GPU and its memory; the device
#      (h100, h200, a100, b200) sets --target and the MFU peak;
#   1. setup: the prebuilt binaries of .gpu/ when carried and they start
#      (tests/gpu/prepare.sh makes them here), else a build on the machine;
#   2. smoke: one step of gpt tiny on cuda;
#   3. kiln GPT-2 124M bf16, 16 x 1024 tokens: un-profiled, CUDA graph, and
#      --profile with the measured per-kernel table, set beside the cost
#      model's (kiln compile --target DEV --kernel-table);
#   4. PyTorch eager, 5. torch.compile (capped), the same model;
#   6. CUDA = CPU: every model (tests/unit/test_cuda_run.c), gpt tiny's
#      100-step loss curve against the CPU's, the NCCL path on one rank.
# Output: $OUT/summary.txt (the table, also printed last), $OUT/kernels.txt
# (the per-kernel table), $OUT/gpu-logs.tar.gz (every log). Exit status:
# non-zero when a check fails.
#
#   tests/gpu/run.sh [--quick] [--plan] [--help]
#     --quick  skip PyTorch (parts 4 and 5)
#     --plan   print the parts, their caps and the files returned; exit 0
#              (needs no GPU; a ctest test runs it)
#
# The one device call (docs/cuda.md, "The first GPU run"): here, first
#     tests/gpu/carry-debs.sh && tests/gpu/prepare.sh
# then run with carry [".debs", ".gpu"], timeout_s 600:
#     tests/gpu/run.sh
#
# Environment:
#   KILN_GPU_BUDGET     seconds the whole script may take (default 490)
#   KILN_GPU_BUILD      build folder when building there (default build-gpu)
#   KILN_GPU_PREBUILT   folder of prebuilt binaries (default .gpu)
#   KILN_GPU_SPEED      the speed runs' settings (default: --set size=124M
#                       --set batch=16 --set precision=bf16)
#   KILN_GPU_VOCAB      the speed runs' token file's vocabulary (50257)
#   KILN_GPU_STEPS      steps of each speed run (default 20)
#   KILN_GPU_TORCH      the PyTorch script (default tests/gpu/torch_gpt2.py,
#                       run when `import torch` finds a GPU; a script named
#                       here runs without that check)
#   KILN_GPU_REHEARSAL  1: a rehearsal over the fake driver (tests/cudafake);
#                       the numbers mean nothing, the script's paths run
#   KILN_GPU_HANG       PART: that part's first command hangs (the
#                       rehearsal's check that later parts still run)
#   KILN_GPU_TIME_SCALE N: every timeout and the budget times N (the
#                       rehearsal: the emulated device is far slower)
#   KILN_GPU_CURVE_STEPS  steps of the loss-curve comparison (default 100)
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
QUICK=0 PLAN=0
usage() { sed -n '2,/^set -u$/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
for a in "$@"; do
    case $a in
    --quick) QUICK=1 ;;
    --plan) PLAN=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "usage: tests/gpu/run.sh [--quick] [--plan] [--help] (got '$a')" >&2; exit 2 ;;
    esac
done
BUDGET=${KILN_GPU_BUDGET:-490}
B=${KILN_GPU_BUILD:-build-gpu}
PRE=${KILN_GPU_PREBUILT:-.gpu}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
case $PRE in /*) ;; *) PRE=$ROOT/$PRE ;; esac
SPEED=(${KILN_GPU_SPEED:---set size=124M --set batch=16 --set precision=bf16})
VOCAB=${KILN_GPU_VOCAB:-50257}
NSTEPS=${KILN_GPU_STEPS:-20}
TORCH=${KILN_GPU_TORCH:-$ROOT/tests/gpu/torch_gpt2.py}
TORCH_CHECK=1; [ -n "${KILN_GPU_TORCH:-}" ] && TORCH_CHECK=0
HANG=${KILN_GPU_HANG:-}
SCALE=${KILN_GPU_TIME_SCALE:-1}
CURVE=${KILN_GPU_CURVE_STEPS:-100}
RESERVE=15 # seconds kept for packing the logs

# The commands' timeouts, in seconds, by part; a part's cap is their sum.
T_PRE=(10 5 5)                  # nvidia-smi, python wheels, find
T_SETUP_PRE=(20)                # the prebuilt kiln starts (kit.sh before)
T_SETUP_BUILD=(40 150)          # cmake configure, build
T_SMOKE=(25)                    # gpt tiny, 1 step (cold NVRTC without a cache)
T_SPEED=(10 25 40 40 40)        # tokens, prediction, plain, graph, profile
T_EAGER=(15 40)                 # import torch (once), eager
T_COMPILE=(70)
T_EQUAL=(60 25 12 12 20 12)     # test_cuda_run; curve cpu, cuda; NCCL cuda, cpu, cuda
sum() { local s=0; for t in "$@"; do s=$((s + t)); done; echo $s; }
PARTS=(
    "0 preflight|$(sum "${T_PRE[@]}")"
    "1 setup: prebuilt binaries (.gpu/), else build|$(sum "${T_SETUP_PRE[@]}")|, a build there: +$(sum "${T_SETUP_BUILD[@]}") s"
    "2 smoke: gpt tiny, one step on cuda|$(sum "${T_SMOKE[@]}")"
    "3 kiln GPT-2 124M bf16 speed (plain, CUDA graph, profile)|$(sum "${T_SPEED[@]}")"
    "4 PyTorch eager GPT-2 124M bf16|$(sum "${T_EAGER[@]}")"
    "5 torch.compile GPT-2 124M bf16 (capped)|$(sum "${T_COMPILE[@]}")"
    "6 CUDA = CPU (every model; gpt tiny curve; NCCL)|$(sum "${T_EQUAL[@]}")"
)

if [ $PLAN -eq 1 ]; then
    echo "tests/gpu/run.sh: budget ${BUDGET} s (KILN_GPU_BUDGET); parts in order, every command under timeout:"
    total=0
    for p in "${PARTS[@]}"; do
        IFS='|' read -r name cap note <<<"$p"
        skip=""
        [ $QUICK -eq 1 ] && case $name in 4*|5*) skip=" (skipped: --quick)"; cap=0 ;; esac
        total=$((total + cap))
        printf '  %-62s <= %4d s%s%s\n' "$name" "$cap" "$note" "$skip"
    done
    echo "  total of the caps with prebuilt binaries: $total s; each command's timeout is also cut"
    echo "  to what is left of the budget, so the run ends within ${BUDGET} s (${RESERVE} s kept to pack)"
    echo "files returned under \$OUT: summary.txt, kernels.txt, gpu-logs.tar.gz"
    exit 0
fi

BUDGET=$((BUDGET * SCALE))
T0=$(date +%s)
OUT=${OUT:-$B/gpu-results}
LOGS=$B/gpu-logs
mkdir -p "$OUT" "$LOGS" || { echo "cannot create $OUT or $LOGS" >&2; exit 1; }
rm -f "$LOGS"/hung-* "$OUT/kernels.txt"
SUM=$OUT/summary.txt
: >"$SUM"
fails=0
left() { echo $((BUDGET - ($(date +%s) - T0))); }
# row NAME VALUE: one line of the table, written at once
row() { printf '%-46s | %s\n' "$1" "$2" | tee -a "$SUM"; }
bad() { fails=$((fails + 1)); row "$1" "FAIL: $2"; }
part_now=""
# part ID NAME: starts a part when at least 20 s are left
part() {
    part_now=$1
    echo "== part $1: $2 ($(left) s left of the budget)" | tee -a "$LOGS/parts.log"
    if [ "$(left)" -lt $((RESERVE + 20)) ]; then
        row "part $1 ($2)" "skipped: $(left) s left of the budget"
        return 1
    fi
}
# t SECONDS CMD...: CMD under timeout, cut to the budget; the hang hook
# replaces the first command of part $HANG with a sleep (a file marks it
# done: t may run in a pipeline's subshell)
t() {
    local want=$(($1 * SCALE)); shift
    local lim=$(($(left) - RESERVE))
    [ "$lim" -gt "$want" ] && lim=$want
    if [ "$lim" -lt 1 ]; then echo "no time left for: $*" >&2; return 124; fi
    if [ -n "$HANG" ] && [ "$HANG" = "$part_now" ] && [ ! -e "$LOGS/hung-$part_now" ]; then
        : >"$LOGS/hung-$part_now"
        echo "KILN_GPU_HANG: part $part_now's first command ($1) hangs instead" >&2
        timeout -k 2 "$lim" sleep 100000
        return $?
    fi
    timeout -k 5 "$lim" "$@"
}
finish() {
    trap - INT TERM
    {
        echo "== $(( $(date +%s) - T0 )) s in all; $fails failed"
        echo "(MFU: model FLOPs per step over the device's dense peak for the run's precision)"
    } | tee -a "$SUM"
    [ -s "$OUT/kernels.txt" ] && head -60 "$OUT/kernels.txt"
    tar czf "$OUT/gpu-logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
    echo
    echo "== summary.txt"
    cat "$SUM"
}
trap 'row "stopped" "by a signal after $(( $(date +%s) - T0 )) s"; finish; exit 1' INT TERM
row "tests/gpu/run.sh" "budget $BUDGET s, started $(date -u +%FT%TZ)$([ "${KILN_GPU_REHEARSAL:-0}" = 1 ] && echo ', REHEARSAL on the fake driver: numbers mean nothing')"

# ---- 0. preflight -------------------------------------------------------
part 0 preflight
gpu=$(t "${T_PRE[0]}" nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
row "GPU, memory, driver" "${gpu:-none (nvidia-smi gave nothing)}"
case ${gpu,,} in
*h200*) DEV=h200 ;; *h100*) DEV=h100 ;; *a100*) DEV=a100 ;; *b200*) DEV=b200 ;; *) DEV="" ;;
esac
# the dense peak for torch's MFU (GFLOP/s, bf16; kiln reads its own from the device)
case $DEV in h100|h200) PEAK=989000 ;; a100) PEAK=312000 ;; b200) PEAK=2250000 ;; *) PEAK=989000 ;; esac
row "device for --target and the MFU peak" "${DEV:-unknown, so the H100 figures are used}"
DEV=${DEV:-h100}
tools=""
for c in cc c++ make ninja cmake nvcc python3; do tools+="$c=$(command -v $c || echo MISSING) "; done
row "tools" "$tools"
row "glibc" "$(ldd --version 2>&1 | head -1 | sed 's/.* //')"
nvcc_v=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([^,]*\).*/\1/p')
row "CUDA toolkit (nvcc)" "${nvcc_v:-not found}"
wheels=$(t "${T_PRE[1]}" python3 -c 'import nvidia, os; print(" ".join(nvidia.__path__))' 2>/dev/null)
find_in() { # file name, dirs...
    local f=$1; shift
    for d in "$@"; do
        [ -d "$d" ] || continue
        local hit; hit=$(t "${T_PRE[2]}" find -L "$d" -maxdepth 6 -name "$f" 2>/dev/null | head -1)
        [ -n "$hit" ] && { echo "$hit"; return 0; }
    done
    return 1
}
CUDA_DIRS=(/usr/local/cuda/lib64 /usr/local/cuda/include /usr/local/cuda /usr/include
           /usr/lib/x86_64-linux-gnu $wheels)
lt=$(find_in 'libcublasLt.so.*' "${CUDA_DIRS[@]}")
rtc=$(find_in 'libnvrtc.so.*' "${CUDA_DIRS[@]}")
nccl_h=$(find_in nccl.h "${CUDA_DIRS[@]}")
nccl_so=$(find_in 'libnccl.so*' "${CUDA_DIRS[@]}")
row "libcublasLt / libnvrtc" "${lt:-NOT FOUND} / ${rtc:-NOT FOUND}"
row "NCCL header / library" "${nccl_h:-not found} / ${nccl_so:-not found}"
# where the loader may not look (wheels): after what the caller set
for f in "$lt" "$rtc" "$nccl_so"; do
    [ -n "$f" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$f")
done
# the build's Debian packages, when carried (.debs/): never exits this script
KIT_CMAKE_ARGS=()
source "$ROOT/tests/gpu/kit.sh" >"$LOGS/kit.log" 2>&1
row "build dependencies (.debs)" "$KIT_STATUS"

# ---- 1. setup: prebuilt, else build ------------------------------------
KILN="" TESTRUN="" MODULE=""
if part 1 setup; then
    if [ -x "$PRE/kiln" ] && [ -e "$PRE/libkiln_cuda.so" ]; then
        missing=$(ldd "$PRE/kiln" "$PRE/libkiln_cuda.so" 2>&1 | grep 'not found' | sort -u | tr -s ' \t\n' ' ')
        if [ -n "$missing" ]; then
            row "prebuilt binaries" "do not start: missing $missing; building instead"
        elif t "${T_SETUP_PRE[0]}" "$PRE/kiln" --help >"$LOGS/prebuilt.log" 2>&1; then
            KILN=$PRE/kiln MODULE=$PRE/libkiln_cuda.so
            [ -x "$PRE/test_cuda_run" ] && TESTRUN=$PRE/test_cuda_run
            cache=""
            if [ -d "$PRE/kiln-cache" ]; then
                export KILN_CACHE_DIR=$PRE/kiln-cache
                cache=", kernel cache carried ($(ls "$PRE/kiln-cache/cuda" 2>/dev/null | grep -c cubin) cubins)"
            fi
            row "prebuilt binaries" "ok: $PRE$cache"
        else
            row "prebuilt binaries" "kiln --help failed: $(tail -2 "$LOGS/prebuilt.log" | tr '\n' ' '); building instead"
        fi
    else
        row "prebuilt binaries" "not carried ($PRE); building"
    fi
    if [ -z "$KILN" ]; then
        if command -v make >/dev/null; then GEN=()
        elif command -v ninja >/dev/null; then GEN=(-G Ninja)
        else GEN=(none); fi
        NCCL_ARGS=()
        [ -n "$nccl_h" ] && NCCL_ARGS=(-DKILN_NCCL_INCLUDE_DIR="$(dirname "$nccl_h")")
        s0=$(date +%s)
        if [ "${GEN[0]:-}" = none ]; then
            bad "build" "neither make nor ninja on this machine"
        elif [ "$KIT_STATUS" = "none carried" ] && ! pkg-config --exists lua5.4 2>/dev/null; then
            bad "build" "Lua 5.4 and the other build dependencies are missing: run tests/gpu/carry-debs.sh here and carry .debs"
        elif ! t "${T_SETUP_BUILD[0]}" cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release "${GEN[@]}" \
                 "${KIT_CMAKE_ARGS[@]}" "${NCCL_ARGS[@]}" >"$LOGS/cmake.log" 2>&1; then
            bad "build: configure" "$(grep -m3 -E 'Error|error' "$LOGS/cmake.log" | tr '\n' ' ') (cmake.log)"
        elif ! t "${T_SETUP_BUILD[1]}" cmake --build "$B" -j"$(nproc)" --target kiln kiln_cuda \
                 test_cuda_run >"$LOGS/build.log" 2>&1; then
            bad "build" "$(grep -m3 -E 'error' "$LOGS/build.log" | tr '\n' ' ') (build.log)"
        elif [ ! -e "$B/libkiln_cuda.so" ]; then
            bad "build" "no libkiln_cuda.so: CMake did not find the CUDA toolkit (cmake.log)"
        else
            KILN=$B/kiln MODULE=$B/libkiln_cuda.so TESTRUN=$B/tests/test_cuda_run
            export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$B/kiln-cache}
            row "build" "ok ($(( $(date +%s) - s0 )) s)"
        fi
    fi
fi
if [ -z "$KILN" ]; then finish; exit 1; fi
export KILN_BIN=$KILN
export KILN_CUDA_MODULE=$MODULE # test_cuda_run does not sit beside it

# ---- 2. smoke ------------------------------------------------------------
if part 2 smoke; then
    t "${T_SMOKE[0]}" "$KILN" train models/gpt.lua --steps 1 --device cuda -v >"$LOGS/smoke.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q '^final:' "$LOGS/smoke.log"; then
        row "smoke: gpt tiny, 1 step on cuda" "ok: $(grep '^final:' "$LOGS/smoke.log" | cut -d'|' -f2)"
    else
        bad "smoke: gpt tiny, 1 step on cuda" "exit $rc (124: timeout): $(grep -v '^ ' "$LOGS/smoke.log" | tail -3 | tr '\n' ' ')"
    fi
fi

# ---- 3. speed ------------------------------------------------------------
TOK=$LOGS/tokens.bin
# speed LABEL FILE TIMEOUT ARGS...: one kiln run; its final line's figures
speed() {
    local label=$1 file=$2 lim=$3; shift 3
    t "$lim" "$KILN" train models/gpt.lua "${SPEED[@]}" --set data_path="$TOK" \
        --steps "$NSTEPS" --device cuda "$@" >"$LOGS/$file.log" 2>&1
    local rc=$?
    local fin; fin=$(grep '^final:' "$LOGS/$file.log")
    if [ $rc -ne 0 ] || [ -z "$fin" ]; then
        bad "$label" "exit $rc (124: timeout): $(grep -v '^ ' "$LOGS/$file.log" | tail -2 | tr '\n' ' ')"
        return 1
    fi
    row "$label" "$(echo "$fin" | sed 's/.*median/median/')"
}
if part 3 "kiln speed"; then
    if t "${T_SPEED[0]}" python3 tests/gpu/make_tokens.py "$TOK" $((NSTEPS * 20 * 1024 + 100000)) "$VOCAB"; then
        if t "${T_SPEED[1]}" "$KILN" compile models/gpt.lua "${SPEED[@]}" --target "$DEV" \
                --kernel-table "$LOGS/kernels_predicted.tsv" >"$LOGS/predict.log" 2>&1; then
            row "predicted (kiln compile --target $DEV)" "$(grep -m1 '^predicted step' "$LOGS/predict.log" | sed 's/.*: //'); $(grep -m1 'MFU' "$LOGS/predict.log" | sed 's/^ *//' | cut -c1-60)"
        else
            bad "predicted (kiln compile --target $DEV)" "exit $?: $(tail -2 "$LOGS/predict.log" | tr '\n' ' ')"
        fi
        speed "kiln 124M bf16 (plain)" speed_plain "${T_SPEED[2]}" -v
        speed "kiln 124M bf16 + CUDA graph" speed_graph "${T_SPEED[3]}" --set cuda_graph=true
        if speed "kiln 124M bf16 --profile" profile "${T_SPEED[4]}" --profile \
                --kernel-table "$LOGS/kernels_measured.tsv"; then
            if [ -s "$LOGS/kernels_predicted.tsv" ] &&
                    python3 tests/gpu/kernel_table.py "$LOGS/kernels_predicted.tsv" \
                        "$LOGS/kernels_measured.tsv" >"$OUT/kernels.txt" 2>"$LOGS/kernel_table.err"; then
                row "per-kernel table (kernels.txt)" "$(grep -m1 '^total:' "$OUT/kernels.txt")"
            else
                bad "per-kernel table" "$(tail -2 "$LOGS/kernel_table.err" | tr '\n' ' ')"
            fi
        fi
    else
        bad "speed" "cannot write the token file $TOK"
    fi
fi

# ---- 4, 5. PyTorch ---------------------------------------------------------
TORCH_OK=""
torch_row() { # label, mode, timeout
    if [ -z "$TORCH_OK" ]; then
        TORCH_OK=yes
        [ $TORCH_CHECK = 1 ] && ! t "${T_EAGER[0]}" python3 -c \
            "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1 && TORCH_OK=no
    fi
    if [ "$TORCH_OK" = no ]; then
        row "$1" "not run: import torch failed or it sees no GPU"
        return
    fi
    t "$3" python3 "$TORCH" --mode "$2" --batch 16 --seq 1024 --steps "$NSTEPS" \
        --peak-gflops "$PEAK" >"$LOGS/torch_$2.log" 2>&1
    local rc=$?
    local last; last=$(grep '^median' "$LOGS/torch_$2.log" | tail -1)
    if [ $rc -eq 0 ] && [ -n "$last" ]; then row "$1" "$last"
    else row "$1" "exit $rc (124: over its cap): $(tail -2 "$LOGS/torch_$2.log" | tr '\n' ' ')"; fi
}
if [ $QUICK -eq 0 ]; then
    part 4 "PyTorch eager" && torch_row "PyTorch eager 124M bf16" eager "${T_EAGER[1]}"
    part 5 "torch.compile" && torch_row "torch.compile 124M bf16" compile "${T_COMPILE[0]}"
fi

# ---- 6. CUDA = CPU ---------------------------------------------------------
if part 6 "CUDA = CPU"; then
    if [ -z "$TESTRUN" ]; then
        bad "CUDA = CPU, every model" "no test_cuda_run binary (carry it in $PRE or build)"
    else
        t "${T_EQUAL[0]}" "$TESTRUN" >"$LOGS/equal.log" 2>&1
        rc=$?
        if [ $rc -eq 0 ] && ! grep -q 'SKIPPED\|skipped' "$LOGS/equal.log"; then
            row "CUDA = CPU, every model (f32, bf16, graph)" "ok: $(grep -c '^\[       OK \]' "$LOGS/equal.log") cases"
        else
            bad "CUDA = CPU, every model (f32, bf16, graph)" "exit $rc (124: timeout): $(grep -E 'FAIL|ERROR|error|skipped' "$LOGS/equal.log" | head -3 | tr '\n' ' ') (equal.log)"
        fi
    fi
    curve() { t "$1" "$KILN" train models/gpt.lua --steps "$CURVE" --device "$2" --set log_every=1 \
                  >"$LOGS/curve_$2.log" 2>&1
              sed -n 's/^step *[0-9]*\/[0-9]* | loss \([^ ]*\) .*/\1/p' "$LOGS/curve_$2.log"; }
    curve "${T_EQUAL[1]}" cpu >"$LOGS/loss_cpu.txt"
    curve "${T_EQUAL[2]}" cuda >"$LOGS/loss_cuda.txt"
    cmp_out=$(paste "$LOGS/loss_cpu.txt" "$LOGS/loss_cuda.txt" | awk '
        { n++; if ($2 == "") { bad = 1; next } d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1)
          if (r > m) { m = r; at = n } last_c = $1; last_g = $2 }
        END { printf "%d steps, max rel diff %.2e (step %d), final cpu %s cuda %s", n, m, at, last_c, last_g
              exit !(n == want && !bad && m < 1e-2) }' want="$CURVE")
    if [ $? -eq 0 ]; then row "gpt tiny $CURVE steps: loss curve vs CPU" "ok: $cmp_out"
    else bad "gpt tiny $CURVE steps: loss curve vs CPU" "$cmp_out"; fi

    # The NCCL path on one rank: ncclAvg over one rank is the identity, so
    # this checks that the path runs (NCCL found and initialised, the comm
    # stream and its events) and leaves the values as the plan computes them.
    nccl_run() { # name, timeout, device, extra args...
        local name=$1 lim=$2 dev=$3; shift 3
        t "$lim" "$KILN" train models/gpt.lua --steps 20 --device "$dev" --set bucket_mb=0.05 -v \
            --save-weights "$LOGS/w_$name.safetensors" "$@" >"$LOGS/nccl_$name.log" 2>&1
    }
    final_loss() { sed -n 's/^final: step [0-9]* | train loss \([^ ]*\) .*/\1/p' "$LOGS/nccl_$1.log"; }
    cmpw() { t 20 python3 tests/gpu/cmp_weights.py "$LOGS/w_$1.safetensors" "$LOGS/w_$2.safetensors" "$3"; }
    if KILN_COMM_ONE_RANK=1 nccl_run cuda_nccl "${T_EQUAL[3]}" cuda &&
            KILN_COMM_ONE_RANK=1 nccl_run cpu_comm "${T_EQUAL[4]}" cpu &&
            nccl_run cuda_plain "${T_EQUAL[5]}" cuda; then
        if ! grep -q "NCCL all-reduces, rank 0 of 1" "$LOGS/nccl_cuda_nccl.log"; then
            bad "NCCL path, 1 rank" "the run did not use NCCL (nccl_cuda_nccl.log)"
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
        bad "NCCL path, 1 rank" "a run failed: $(tail -qn2 "$LOGS"/nccl_*.log | tr '\n' ' ')"
    fi
fi

finish
exit $(( fails > 0 ))
