#!/usr/bin/env bash
# dp_cuda.sh - the data-parallel GPU path, as far as a machine without a GPU
# can check it:
#  - `--device cuda --nproc 2` without a driver stops with the one-line
#    no-driver message and a non-zero status, never a crash, and leaves no
#    process of the run behind (mpirun, ranks);
#  - KILN_COMM_ONE_RANK=1 puts buckets and all-reduces into a one-rank step
#    (what tests/gpu/run.sh uses to run the NCCL path on one GPU); on the CPU
#    they are identities: the same losses as without.
# The NCCL path itself runs only on a GPU machine (tests/gpu/run.sh).
set -u
: "${KILN:?KILN must point at the kiln binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-dp-cuda.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    [ -f "$T/out" ] && cat "$T/out"
    exit 1
}

# processes whose environment holds KILN_TEST_TAG=$1
tagged() {
    local p
    for p in /proc/[0-9]*; do
        tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qx "KILN_TEST_TAG=$1" && echo "${p#/proc/}"
    done
}

if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -e /usr/lib/x86_64-linux-gnu/libcuda.so.1 ]; then
    echo "a CUDA driver is installed here: the no-driver checks do not apply"
else
    tag="dp-cuda-$$-$RANDOM"
    KILN_TEST_TAG=$tag timeout 120 "$KILN" train models/mlp.lua --steps 2 --device cuda \
        --nproc 2 >"$T/out" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] || fail "--device cuda --nproc 2 succeeded without a driver"
    [ "$rc" -ne 124 ] || fail "--device cuda --nproc 2 did not stop within 120 s"
    grep -q "Segmentation\|Aborted\|internal error\|core dumped" "$T/out" && fail "a crash"
    grep -qF -- "--device cuda:" "$T/out" || fail "no --device cuda message"
    if [ -e "$(dirname "$KILN")/libkiln_cuda.so" ]; then
        grep -q "no CUDA driver" "$T/out" || fail "the message does not say there is no driver"
    else
        grep -q "without the CUDA backend" "$T/out" || fail "the message does not say the backend is missing"
    fi
    sleep 0.5
    left=$(tagged "$tag" 2>/dev/null)
    [ -z "$left" ] || fail "processes left running: $left ($(ps -o pid,args -p "$left" 2>/dev/null | tail -n +2))"
    echo "--device cuda --nproc 2: exit $rc: $(grep -F -- "--device cuda:" "$T/out" | head -1)"
fi

# one rank with collectives: the plan has them, the CPU run is unchanged
"$KILN" train models/gpt.lua --steps 4 -q --trace "$T/one.json" >"$T/base" 2>&1 ||
    { cat "$T/base"; fail "gpt one rank"; }
KILN_COMM_ONE_RANK=1 "$KILN" train models/gpt.lua --steps 4 -q --trace "$T/forced.json" \
    >"$T/out" 2>&1 || fail "gpt one rank with KILN_COMM_ONE_RANK=1"
grep -q '"name":"allreduce_start","cat":"comm"' "$T/forced.json" ||
    fail "KILN_COMM_ONE_RANK=1: no allreduce_start step in the trace"
grep -q '"name":"allreduce_wait","cat":"comm"' "$T/forced.json" ||
    fail "KILN_COMM_ONE_RANK=1: no allreduce_wait step in the trace"
grep -q '"cat":"comm"' "$T/one.json" && fail "one rank without the knob has collectives"
loss() { sed -n 's/^final: step [0-9]* | train loss \([^ ]*\) .*/\1/p' "$1"; }
a=$(loss "$T/base")
b=$(loss "$T/out")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "losses differ with one-rank collectives: '$a' vs '$b'"
echo "one rank with collectives: loss $b (unchanged)"
echo ok
