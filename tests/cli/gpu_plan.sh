#!/bin/bash
# tests/gpu/run.sh --plan: the GPU run's dry run works on a machine with no
# GPU (exit 0, within seconds, touching no GPU and building nothing), names
# every part in order with its time cap, and the two files a device call
# brings back; a wrong flag is exit 2. The script itself parses (bash -n).
set -u
fail() { echo "FAIL: $*"; exit 1; }
bash -n tests/gpu/run.sh || fail "tests/gpu/run.sh does not parse"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-gpuplan-XXXXXX")
trap 'rm -rf "$dir"' EXIT
out=$(KILN_GPU_BUILD="$dir/b" timeout 20 bash tests/gpu/run.sh --plan 2>&1) ||
    fail "--plan exited $?: $out"
echo "$out"
[ ! -e "$dir/b" ] || fail "--plan created the build folder"
prev=-1
for p in 0 1 2 3 4 5 6; do
    line=$(echo "$out" | grep -E "^  $p [a-zA-Z]") || fail "part $p not listed"
    echo "$line" | grep -qE '<= +[0-9]+ s' || fail "part $p has no time cap: $line"
    n=$(echo "$out" | grep -nE "^  $p [a-zA-Z]" | cut -d: -f1)
    [ "$n" -gt "$prev" ] || fail "part $p out of order"
    prev=$n
done
echo "$out" | grep -q "build" || fail "no build part"
echo "$out" | grep -q "CUDA = CPU" || fail "no CUDA = CPU part"
echo "$out" | grep -q "summary.txt, kernels.txt, gpu-logs.tar.gz" || fail "the returned files are not named"
# the caps (prebuilt binaries) sum to at most the budget, which leaves a
# margin under the device call's 600 s command limit
total=$(echo "$out" | sed -n 's/.*total of the caps with prebuilt binaries: \([0-9]*\) s.*/\1/p')
budget=$(echo "$out" | sed -n 's/.*budget \([0-9]*\) s (KILN_GPU_BUDGET).*/\1/p')
[ -n "$total" ] && [ -n "$budget" ] || fail "no total of the caps or budget in the plan"
[ "$total" -le "$budget" ] || fail "the caps sum to $total s, over the budget $budget s"
[ "$budget" -le 540 ] || fail "the default budget $budget s leaves too little margin under 600 s"
sum=0
for p in 0 1 2 3 4 5 6; do
    c=$(echo "$out" | grep -E "^  $p [a-zA-Z]" | sed -n 's/.*<= *\([0-9]*\).*/\1/p')
    sum=$((sum + c))
done
[ "$sum" -eq "$total" ] || fail "the parts' caps sum to $sum s, the plan says $total s"
bash tests/gpu/run.sh --help | grep -q "carry \[\".debs\", \".gpu\"\]" ||
    fail "--help does not give the device call's carry list"
q=$(bash tests/gpu/run.sh --plan --quick) || fail "--plan --quick failed"
echo "$q" | grep -E '^  4 ' | grep -q 'skipped: --quick' || fail "--quick does not skip PyTorch: $q"
bash tests/gpu/run.sh --bogus >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "an unknown flag exited $rc, expected 2"
echo "gpu_plan: ok"
