#!/usr/bin/env bash
# zero.sh MODEL CASE - one cuda_fake_zero_* test: ZeRO-1 (--set zero=1) on
# two GPU ranks, the real libkiln_cuda.so on the fakes of tests/cudafake
# (FAKE_LIB on LD_LIBRARY_PATH; the fake NCCL between the two processes).
#
# Cases:
#   accum1, accum2  grad_accum 1 or 2, bucket_mb=0.01 (several reduce-scatter
#                   and all-gather buckets, params split across the ranks):
#                   `--nproc 2 --set zero=1 --device cuda` against
#                   `--nproc 2 --device cuda` (zero=0, NCCL all-reduces) and
#                   against `--nproc 2 --set zero=1` on the CPU (MPI): every
#                   step's loss and every final param within 1e-5 relative
#                   (per tensor, ||a - b|| / ||b||). Every tensor is
#                   compared; those with a true gradient of 0 are named with
#                   their difference (gpt's h.*.attn.c_attn.bias: softmax
#                   ignores a constant added to every key, so the key third
#                   of it gets only rounding noise, which Adam turns into
#                   steps; tests/unit/test_zero.c leaves them out, here eps
#                   1e-6 keeps them within the tolerance). accum1 also
#                   asks for the trace's reduce-scatter and all-gather
#                   tracks (tids 3, 4) on both ranks and the report's line
#                   per collective, from the device's events.
#   ckpt            checkpoints: the step-6 file of 2 sharded GPU ranks
#                   (batch 32 each) equals the one 1 GPU rank writes at
#                   batch 64, moments included, within 1e-5; 2 sharded GPU
#                   ranks resumed from the 1-rank step-3 file, and 1 GPU rank
#                   resumed from the sharded one, end at the straight run's
#                   params within 1e-5.
#   neg_wait1, neg_wait8  negative controls (mlp, bucket_mb=0.01): the fake
#                   driver ignores the 1st / 8th cuStreamWaitEvent of the run
#                   (FAKE_CUDA_DROP_WAIT): the communication stream no longer
#                   waits for the work before the first reduce-scatter
#                   (1st) or for the second all-gather bucket's snapshot copy
#                   (8th); the run must stop with the fake's race report
#                   naming ncclReduce / ncclBroadcast. (Dropping a carried
#                   gather's wait, the 9th or 10th, is not noticed on the
#                   fakes: the host's wait for the loss at the end of a run
#                   also polls every started bucket's done event (the hang
#                   detection of cuda_nccl.c), and a query that succeeds
#                   orders the next run's ops after the gather. The 2nd,
#                   the second reduce-scatter's, was reported in only 7 of 8
#                   runs (the fake's stream choice is random), so it is not
#                   a test.)
#   pieces          the update in pieces (runtime/pieces.c): each rank's part
#                   of the early all-gather buckets updated by the flat
#                   kernel's range function right before the bucket's start,
#                   the rest after (the -v line "runs the update in N
#                   pieces", N > 0, on both ranks), against the one-launch
#                   update (KILN_ZERO_ONE_PIECE=1, no such line): every
#                   step's loss and the final params bit for bit (the
#                   weight files byte for byte). A range function that
#                   leaves out an element, or a piece launched over the
#                   wrong elements, makes them differ. (gpt's wte gradient
#                   is a scatter-add of float atomics: equal bits need the
#                   emulator's per-kernel thread orders, docs/emulator.md.)
#   neg_bcast       negative control: accum1 with the fake NCCL's 3rd
#                   ncclBroadcast writing nothing (FAKE_NCCL_DROP_BCAST=3, a
#                   lost param gather): the comparison must fail.
# AdamW's eps is 1e-6 as in run.sh. Skipped (77) without python3, mpirun or
# the fakes.
model=$1 case=$2
. "$(dirname "$0")/mpi_setup.sh" zero
tol=1e-5
zgrad=""
[ "$model" = gpt ] && zgrad="h.0.attn.c_attn.bias h.1.attn.c_attn.bias"

# run NAME DEVICE ARGS...: kiln train MODEL into $T/NAME.log and
# $T/NAME.safetensors; stops the test when it fails
run() {
    local name=$1 dev=$2
    shift 2
    local env=()
    [ "$dev" = cuda ] && env=(LD_LIBRARY_PATH="$FAKE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    env "${env[@]}" ${extra_env:-} timeout 500 "$KILN" train "models/$model.lua" "$@" \
        --device "$dev" -v --save-weights "$T/$name.safetensors" >"$T/$name.log" 2>&1 ||
        { tail -30 "$T/$name.log"; echo "FAIL: the $name run failed"; exit 1; }
    if grep -q "^fake " "$T/$name.log"; then
        grep "^fake " "$T/$name.log" | head -3
        echo "FAIL: a fake library complained in the $name run"
        exit 1
    fi
}

losses() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([^ ]*\) .*/\1/p' "$T/$1.log"; }
# cmp_losses A B: every step's loss within $tol; prints a summary
cmp_losses() {
    paste <(losses "$1") <(losses "$2") | awk -v tol="$tol" -v a="$1" -v b="$2" '
        { n++; if ($2 == "") { bad = 1; next } d = $1 - $2; if (d < 0) d = -d; x = $1 < 0 ? -$1 : $1
          r = x > 0 ? d / x : d; if (!(r <= m)) m = r; if (!(r <= tol)) bad = 1 }
        END { printf "losses %s vs %s: %d steps, max rel diff %.2e (tol %s)\n", a, b, n, m, tol
              exit (bad || n < 3) }'
}
# cmp_params A B: every tensor of the two files within $tol; names those in
# $zgrad with their difference
cmp_params() {
    python3 - "$T/$1.safetensors" "$T/$2.safetensors" "$tol" $zgrad <<'EOF'
import math, os, sys
sys.path.insert(0, os.environ["ROOT"] + "/tests/gpu")
from cmp_weights import load
a, b, tol, zero = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3]), set(sys.argv[4:])
if sorted(a) != sorted(b):
    sys.exit(f"different tensors: {sorted(set(a) ^ set(b))}")
worst, at, out = 0.0, "", []
for k in sorted(a):
    x, y = a[k][1], b[k][1]
    d = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
    n = math.sqrt(sum(q * q for q in y))
    r = d / n if n > 0 else d
    if k in zero:
        out.append(f"{k} {r:.1e}")
    if not r <= worst:  # NaN stays
        worst, at = r, k
note = f"; of them with a true gradient of 0: {', '.join(out)}" if out else ""
print(f"params {sys.argv[1].split('/')[-1]} vs {sys.argv[2].split('/')[-1]}: "
      f"{len(a)} tensors, max rel diff {worst:.2e} ({at}){note}")
sys.exit(0 if worst <= tol else 1)
EOF
}
export ROOT

base=(--set log_every=1 --set eval_every=1000000 --set eval_batches=1 --set eps=1e-6)
case $case in
accum1 | accum2 | neg_bcast)
    accum=${case#accum}
    [ "$case" = neg_bcast ] && accum=1
    args=("${base[@]}" --steps 3 --nproc 2 --set bucket_mb=0.01 --set grad_accum="$accum")
    run cpu_z1 cpu "${args[@]}" --set zero=1 --threads 1
    run gpu_z0 cuda "${args[@]}"
    [ "$case" = neg_bcast ] && extra_env=FAKE_NCCL_DROP_BCAST=3
    trace=()
    [ "$case" = accum1 ] && trace=(--trace "$T/t.json")
    run gpu_z1 cuda "${args[@]}" --set zero=1 "${trace[@]}"
    if [ "$case" = neg_bcast ]; then
        out=$(cmp_losses gpu_z1 gpu_z0; cmp_params gpu_z1 gpu_z0)
        rc=$?
        echo "$out"
        [ $rc -ne 0 ] && { echo "the comparison fails, as it must"; exit 0; }
        echo "FAIL: a lost all-gather piece went unnoticed"
        exit 1
    fi
    grep -q "rank 0 of 2 (zero=1: reduce-scatters as grouped ncclReduce" "$T/gpu_z1.log" ||
        { echo "FAIL: the GPU run did not take the NCCL zero=1 path"; exit 1; }
    if [ "$case" = accum1 ]; then # the device's events on the per-collective tracks
        for r in "" .rank1; do
            for k in "3:reduce-scatter" "4:all-gather"; do
                grep -q "\"name\":\"${k#*:} bucket [0-9]*\"[^}]*\"tid\":${k%%:*}}" "$T/t$r.json" ||
                    { echo "FAIL: no ${k#*:} bucket on track ${k%%:*} of t$r.json"; exit 1; }
            done
        done
        grep -q "^comm by collective (zero=1" "$T/gpu_z1.log" ||
            { echo "FAIL: no per-collective report"; exit 1; }
        grep "^comm by collective" "$T/gpu_z1.log"
    fi
    ok=0
    cmp_losses gpu_z1 gpu_z0 || ok=1
    cmp_losses gpu_z1 cpu_z1 || ok=1
    cmp_params gpu_z1 gpu_z0 || ok=1
    cmp_params gpu_z1 cpu_z1 || ok=1
    [ $ok -eq 0 ] || { echo "FAIL: zero=1 on GPU ranks differs"; exit 1; }
    ;;
pieces)
    args=("${base[@]}" --steps 3 --nproc 2 --set bucket_mb=0.01 --set zero=1)
    extra_env=KILN_ZERO_ONE_PIECE=1
    run gpu_one cuda "${args[@]}"
    extra_env=""
    run gpu_pcs cuda "${args[@]}"
    for r in 0 1; do
        grep -q "zero=1: rank $r runs the update in [1-9][0-9]* piece" "$T/gpu_pcs.log" ||
            { echo "FAIL: rank $r did not run the update in pieces"; exit 1; }
    done
    grep "runs the update in" "$T/gpu_pcs.log"
    ! grep -q "runs the update in" "$T/gpu_one.log" ||
        { echo "FAIL: KILN_ZERO_ONE_PIECE=1 still ran the update in pieces"; exit 1; }
    ok=0
    [ "$(losses gpu_pcs | wc -l)" -ge 3 ] && [ "$(losses gpu_pcs)" = "$(losses gpu_one)" ] ||
        { echo "losses differ:"; paste <(losses gpu_pcs) <(losses gpu_one); ok=1; }
    tol=0 cmp_params gpu_pcs gpu_one
    cmp -s "$T/gpu_pcs.safetensors" "$T/gpu_one.safetensors" || ok=1
    [ $ok -eq 0 ] || { echo "FAIL: the update in pieces differs from the one launch"; exit 1; }
    echo "losses and params bit for bit those of the one-launch update"
    ;;
ckpt)
    c=(--set log_every=1 --set eps=1e-6 --steps 6 --set checkpoint_every=3)
    run one cuda "${c[@]}" --set batch=64 --checkpoint "$T/ock"
    run zero cuda "${c[@]}" --set batch=32 --nproc 2 --set zero=1 --checkpoint "$T/zck"
    ok=0
    cp "$T/ock.step6.safetensors" "$T/ock6.safetensors"
    cp "$T/zck.step6.safetensors" "$T/zck6.safetensors"
    cmp_params zck6 ock6 || ok=1 # moments included
    # 1 rank -> 2 sharded GPU ranks; 2 sharded -> 1 GPU rank
    run r_zero cuda "${c[@]}" --set batch=32 --nproc 2 --set zero=1 \
        --resume "$T/ock.step3.safetensors"
    cmp_params r_zero one || ok=1
    run r_one cuda "${c[@]}" --set batch=64 --resume "$T/zck.step3.safetensors"
    cmp_params r_one one || ok=1
    [ $ok -eq 0 ] || { echo "FAIL: checkpoints of sharded GPU ranks differ"; exit 1; }
    ;;
neg_wait1 | neg_wait8)
    n=${case#neg_wait}
    want=ncclReduce
    [ "$n" = 8 ] && want=ncclBroadcast
    env LD_LIBRARY_PATH="$FAKE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FAKE_CUDA_DROP_WAIT="$n" \
        timeout 500 "$KILN" train "models/$model.lua" "${base[@]}" --steps 3 --nproc 2 \
        --set bucket_mb=0.01 --set zero=1 --device cuda >"$T/neg.log" 2>&1
    rc=$?
    grep -m1 "fake CUDA: race: " "$T/neg.log"
    [ $rc -ne 0 ] && grep -q "fake CUDA: race: .*$want" "$T/neg.log" && exit 0
    echo "FAIL: a dropped event wait of a $want bucket was not reported as a race"
    exit 1
    ;;
*) echo "unknown case $case"; exit 2 ;;
esac
exit 0
