#!/usr/bin/env bash
# pp.sh CASE - one cuda_fake_pp_* test: pipeline stages (--pp 2 on 2 ranks,
# micro_batches = 4, 1f1b unless the case says) on the GPU, the real
# libkiln_cuda.so on the fakes of tests/cudafake (FAKE_LIB on
# LD_LIBRARY_PATH; the fake NCCL's ncclSend/ncclRecv between the
# processes), against the same run on CPU ranks (MPI), which
# tests/cli/pp.sh checks against one rank. A tiny gpt.lua (C 16, T 8,
# batch 2) so that the emulated kernels take seconds.
#
# Cases:
#   f32        every step's loss, the final train and validation loss within
#              1e-5 relative, every saved param within 1e-4 relative; both
#              stages say (-v) that their activations and gradients go by
#              NCCL send/recv; no fake library complains.
#   gpipe8     as f32 with schedule gpipe, micro_batches 8: stage 0 sends 8
#              activations before it receives a gradient, more than the fake
#              NCCL's channel holds, while its receive of the first gradient
#              is queued on the other stream (the fake driver's worker must
#              not start that receive before its peer sends: it deadlocked
#              before fakecu_enqueue_when).
#   tp2        as f32, pp 2 x tp 2 on 4 ranks (4 fake GPUs), micro_batches 2:
#              the TP group's NCCL communicator beside the pipeline's two.
#   neg_drop   negative control: the fake NCCL's first ncclRecv on each rank
#              takes the data but writes nothing (FAKE_NCCL_DROP_RECV=1:
#              stage 1's first activation, stage 0's first gradient lost):
#              the comparison must fail.
#   timeout    a peer that never sends: the fake NCCL drops each rank's
#              first ncclSend (FAKE_NCCL_DROP_SEND=1: stage 0's first
#              activation, stage 1's first gradient), its receives waiting
#              up to FAKE_NCCL_TIMEOUT=100 s; with comm_timeout = 20 the run
#              must stop, non-zero and within 150 s, saying which NCCL
#              receive did not finish within the comm_timeout (the host's
#              waits on the device poll the pipeline's transfers,
#              cuda_nccl.c's kc_pp_wait); it hung before.
#   neg_wait   negative control: the fake driver ignores the 1st
#              cuStreamWaitEvent (FAKE_CUDA_DROP_WAIT=1: the transfer stream
#              no longer waits for the compute stream's work queued before
#              the first transfer, so the ncclRecv writes arena bytes the
#              compute stream is still clearing); the run must stop with the
#              fake's race report naming ncclRecv or ncclSend. (The 2nd wait,
#              the compute stream's on the transfer, was dropped here
#              before; since the host's waits poll the transfers
#              (kc_pp_wait), a poll that sees the transfer done may order
#              the two itself, so that control was reported 2 times in 4.)
# 2 steps, AdamW's eps 1e-6 (run.sh says why). Skipped (77) without python3,
# mpirun or the fakes.
case=$1
. "$(dirname "$0")/mpi_setup.sh" pp

nproc=2 m=4 tp=() sched=1f1b
[ "$case" = tp2 ] && nproc=4 m=2 tp=(--tp 2)
[ "$case" = gpipe8 ] && m=8 sched=gpipe
args=(models/gpt.lua --steps 2 --nproc $nproc --pp 2 "${tp[@]}" --set micro_batches=$m
      --set schedule=$sched --set C=16 --set T=8 --set batch=2 --set log_every=1 --set eval_every=1000000
      --set eval_batches=1 --set eps=1e-6)
cuda_env=() negative=""
case $case in
f32|gpipe8) ;;
tp2) cuda_env=(FAKE_CUDA_DEVICES=4) ;;
neg_drop) cuda_env=(FAKE_NCCL_DROP_RECV=1); negative=mismatch ;;
neg_wait) cuda_env=(FAKE_CUDA_DROP_WAIT=1); negative=race ;;
timeout) cuda_env=(FAKE_NCCL_DROP_SEND=1 FAKE_NCCL_TIMEOUT=100); negative=timeout
    args+=(--set comm_timeout=20) ;;
*) echo "unknown case $case"; exit 2 ;;
esac

[ "$negative" = timeout ] || timeout 120 "$KILN" train "${args[@]}" --threads 1 \
    --save-weights "$T/cpu.safetensors" >"$T/cpu.log" 2>&1 ||
    { tail -30 "$T/cpu.log"; echo "FAIL: the CPU run failed"; exit 1; }
lim=300
[ "$negative" = timeout ] && lim=150
t0=$(date +%s)
env "${cuda_env[@]}" LD_LIBRARY_PATH="$FAKE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout $lim "$KILN" train "${args[@]}" --device cuda -v \
    --save-weights "$T/cuda.safetensors" >"$T/cuda.log" 2>&1
rc=$?

. "$(dirname "$0")/cmp_losses.sh"
# 4 losses: 2 steps, final train and validation loss
nlosses=4

case $negative in
timeout)
    grep -m2 "did not finish" "$T/cuda.log"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -lt 128 ] &&
        grep -q "the NCCL receive from stage [01] (pipeline stages) on the GPU did not finish within 20 s (comm_timeout)" "$T/cuda.log" &&
        exit 0
    tail -8 "$T/cuda.log"
    echo "FAIL: a peer that never sends did not end the run with a comm_timeout error (exit $rc after $(($(date +%s) - t0)) s)"
    exit 1 ;;
mismatch)
    [ $rc -eq 0 ] || { tail -5 "$T/cuda.log"; echo "FAIL: the run itself failed (expected a wrong result)"; exit 1; }
    if out=$(cmp_losses $nlosses); then echo "FAIL: a lost pipeline transfer went unnoticed: $out"; exit 1; fi
    echo "the comparison fails, as it must: $out"
    exit 0 ;;
race)
    grep -m1 "fake CUDA: race: " "$T/cuda.log"
    [ $rc -ne 0 ] && grep -q "fake CUDA: race: .*nccl\(Send\|Recv\)" "$T/cuda.log" && exit 0
    tail -5 "$T/cuda.log"
    echo "FAIL: a dropped event wait around a pipeline transfer was not reported as a race (exit $rc)"
    exit 1 ;;
esac

fail() { echo "--- cuda log (tail)"; tail -30 "$T/cuda.log"; echo "FAIL: $*"; exit 1; }
[ $rc -eq 0 ] || fail "the CUDA run on the fakes failed (exit $rc)"
grep -q "^fake " "$T/cuda.log" && fail "a fake library complained: $(grep '^fake ' "$T/cuda.log" | head -3)"
for s in 0 1; do
    grep -q "NCCL send/recv between pipeline stages, stage $s of 2" "$T/cuda.log" ||
        fail "stage $s did not send through NCCL"
done
[ "$case" != tp2 ] || grep -q "NCCL TP collectives, TP rank 1 of 2" "$T/cuda.log" ||
    fail "no TP communicator beside the pipeline's"
out=$(cmp_losses $nlosses) || fail "losses differ: $out; cpu: $(losses "$T/cpu.log" | tr '\n' ' ') cuda: $(losses "$T/cuda.log" | tr '\n' ' ')"
echo "pp $case: $out"
w=$(python3 "$ROOT/tests/gpu/cmp_weights.py" "$T/cuda.safetensors" "$T/cpu.safetensors" 1e-4)
wrc=$?
echo "parameters after 2 steps: $w"
[ $wrc -eq 0 ] || fail "parameters differ by more than 1e-4: $w"
exit 0
