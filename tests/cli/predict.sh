#!/bin/bash
# kiln compile --target DEVICE: the cost model's prediction for a GPU of the
# table (no GPU needed; occupancy from ptxas through NVRTC where the CUDA
# module is built) and for this CPU (measured once into the cache,
# read back the second time); a device it does not know is exit 2.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-predict-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$("$KILN" compile models/gpt.lua --set size=124M --set batch=2 --set precision=bf16 \
      --target h200 2>&1) || fail "--target h200: $out"
echo "$out" | grep -q '^device h200: 132 SMs' || fail "no device line: $out"
echo "$out" | grep -qE '^predicted step on h200 .*: [0-9.]+ (ms|s|us)$' || fail "no step: $out"
echo "$out" | grep -qE '^  MFU [0-9.]+% of 989.4 TFLOP/s \(dense bf16 peak' || fail "no MFU: $out"
echo "$out" | grep -qE '^    gemm [0-9]+x[0-9]+x[0-9]+ ' || fail "no GEMM row: $out"
# occupancy from ptxas' figures where kiln has its CUDA module (NVRTC),
# else from block sizes, and the output says which
if [ -e "$(dirname "$KILN")/libkiln_cuda.so" ]; then
    echo "$out" | grep -qE '^occupancy: ptxas figures \(NVRTC [0-9.]+, sm_90(, cached)?\) for ([0-9]+) of \2 functions' ||
        fail "no ptxas figures for every function: $out"
else
    echo "$out" | grep -q '^occupancy: from block sizes alone' || fail "no occupancy line: $out"
fi
rows=$(echo "$out" | sed -n '/costliest launches/,$p' | tail -n +3 | grep -cE ' (memory|compute|blocks|launch) ')
[ "$rows" -eq 10 ] || fail "expected the 10 costliest launches, got $rows: $out"
# the same model on an older GPU is slower, and a CUDA graph is never slower
t() { echo "$1" | sed -n 's/^predicted step on .*: \([0-9.]*\) ms$/\1/p'; }
a100=$("$KILN" compile models/gpt.lua --set size=124M --set batch=2 --set precision=bf16 --target a100)
graph=$("$KILN" compile models/gpt.lua --set size=124M --set batch=2 --set precision=bf16 \
        --set cuda_graph=true --target h200)
awk -v h="$(t "$out")" -v a="$(t "$a100")" -v g="$(t "$graph")" \
    'BEGIN { exit !(h > 0 && a > h && g > 0 && g <= h) }' ||
    fail "h200 $(t "$out") ms, a100 $(t "$a100") ms, h200 graph $(t "$graph") ms"

"$KILN" compile models/gpt.lua --target h300 >"$dir/err" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "--target h300 exited $rc (expected 2)"
grep -q -- "--target expects cpu, a100, h100, h200 or b200, got: h300" "$dir/err" ||
    fail "message: $(cat "$dir/err")"

# cpu: measured into the cache the first time, read from it after
export KILN_CACHE_DIR=$dir/cache
out=$("$KILN" compile models/gpt.lua --target cpu --threads 1 2>&1) || fail "--target cpu: $out"
echo "$out" | grep -q 'measuring this CPU' || fail "no measurement the first time: $out"
[ -s "$dir/cache/cpu-device-1.txt" ] || fail "no cached measurement"
echo "$out" | grep -qE '^device cpu \(.*1 thread, measured\): FMA peak [0-9.]+ GFLOP/s' ||
    fail "no cpu device line: $out"
echo "$out" | grep -qE '^predicted step on cpu' || fail "no cpu prediction: $out"
out=$("$KILN" compile models/gpt.lua --target cpu --threads 1 2>&1) || fail "second run: $out"
echo "$out" | grep -q 'measuring this CPU' && fail "measured again despite the cache: $out"
# a measurement made through another compiler or other kernel flags is stale
grep -qE '^cc=[0-9a-f]{16}$' "$dir/cache/cpu-device-1.txt" ||
    fail "no compiler key in the measurement: $(cat "$dir/cache/cpu-device-1.txt")"
sed -i 's/^cc=.*/cc=0123456789abcdef/' "$dir/cache/cpu-device-1.txt"
out=$("$KILN" compile models/gpt.lua --target cpu --threads 1 2>&1) || fail "third run: $out"
echo "$out" | grep -q 'measuring this CPU' || fail "a measurement for other kernel flags was used: $out"

# --calibrate: a table measured on this CPU (written here from the
# prediction's ten costliest kernels, each twice its predicted time) shows
# 2.00 for every class it touches; bad tables and flags are refused
out=$("$KILN" compile models/gpt.lua --target cpu --threads 1 2>&1) || fail "cpu: $out"
{
    printf '# kiln kernel table 1\n# source\tmeasured\n# device\tcpu\n# steps\t5\n# later_key\tx\n'
    printf 'kind\tname\tshape\tcalls\tms\tflops\tbytes\top\twhere\n'
    echo "$out" | sed -n '/costliest launches/,$p' | tail -n +3 | grep -v '^    gemm ' |
        awk '{ t = $3; if ($4 == "us") t /= 1e3; else if ($4 == "s") t *= 1e3;
               printf "kernel\t%s\t-\t%d\t%.9g\t0\t0\t-\t-\n", $1, $2, 2 * t }'
    printf 'kernel\tnot_a_kernel_of_this_model\t-\t1\t1.5\t0\t0\t-\t-\n'
} > "$dir/measured.tsv"
out=$("$KILN" compile models/gpt.lua --target cpu --threads 1 --calibrate "$dir/measured.tsv" 2>&1) ||
    fail "--calibrate: $out"
echo "$out" | grep -q "^calibration of cpu against $dir/measured.tsv (measured on cpu, 5 steps)" ||
    fail "no calibration header: $out"
cls=$(echo "$out" | sed -n '/^calibration of/,$p' | grep -E '^  (memory|compute|launch|attention|gemm\.[a-z]+) ')
[ -n "$cls" ] || fail "no class rows: $out"
echo "$cls" | awk '$8 != "2.00" { bad = 1 } END { exit bad }' || fail "ratios not 2.00: $cls"
echo "$out" | grep -q '^  1 measured row (1.50 ms) names no predicted launch' || fail "unmatched row: $out"
"$KILN" compile models/gpt.lua --calibrate "$dir/measured.tsv" >"$dir/err" 2>&1
[ $? -eq 2 ] && grep -q -- '--calibrate needs --target DEVICE' "$dir/err" || fail "no --target: $(cat "$dir/err")"
"$KILN" compile models/gpt.lua --target h100 --calibrate "$dir/none.tsv" >"$dir/err" 2>&1
[ $? -eq 1 ] && grep -q "$dir/none.tsv: cannot open the kernel table" "$dir/err" || fail "missing: $(cat "$dir/err")"
sed -i '6s/^kind\tname/kind\tnme/' "$dir/measured.tsv"
sed -n 6p "$dir/measured.tsv" | grep -q nme || fail "test table line 6 is not the header"
"$KILN" compile models/gpt.lua --target h100 --calibrate "$dir/measured.tsv" >"$dir/err" 2>&1
[ $? -eq 1 ] && grep -q "$dir/measured.tsv:6: expected the header" "$dir/err" ||
    fail "bad header: $(cat "$dir/err")"
# The writers: kiln compile --target D --kernel-table (predicted) and kiln
# train --profile --kernel-table (measured) of the same model name the same
# launches, so every measured GEMM and kernel row joins a predicted one
# (tests/gpu/kernel_table.py, run.sh's table) and --calibrate reads the
# measured file back; each flag without its partner is exit 2
"$KILN" compile models/gpt.lua --target cpu --threads 1 --kernel-table "$dir/p.tsv" >/dev/null 2>&1 ||
    fail "compile --kernel-table failed"
"$KILN" train models/gpt.lua --steps 3 --threads 1 -q --profile --kernel-table "$dir/m.tsv" \
    >"$dir/train.log" 2>&1 || fail "train --kernel-table: $(tail -3 "$dir/train.log")"
head -1 "$dir/p.tsv" | grep -qx '# kiln kernel table 1' || fail "predicted: no first line"
grep -qx $'# source\tpredicted' "$dir/p.tsv" || fail "predicted: no source"
grep -qx $'# source\tmeasured' "$dir/m.tsv" || fail "measured: no source"
grep -qx $'# steps\t3' "$dir/m.tsv" || fail "measured: not over 3 steps"
[ ! -e "$dir/p.tsv.tmp" ] && [ ! -e "$dir/m.tsv.tmp" ] || fail "a .tmp file was left"
np=$(grep -cE $'^(gemm|kernel|copy)\t' "$dir/p.tsv"); nm=$(grep -cE $'^(gemm|kernel|copy)\t' "$dir/m.tsv")
[ "$np" -ge 20 ] && [ "$nm" -ge 20 ] || fail "too few rows: $np predicted, $nm measured"
grep -qE $'^gemm\tgemm_op[0-9]+\t[0-9]+x[0-9]+x[0-9]+(x[0-9]+)?\t1\t' "$dir/m.tsv" ||
    fail "measured: no GEMM row with its shape"
joined=$(python3 tests/gpu/kernel_table.py "$dir/p.tsv" "$dir/m.tsv") || fail "kernel_table.py: $joined"
echo "$joined" | grep -q "^total: predicted [0-9.]* ms, measured [0-9.]* ms" || fail "no total: $joined"
unmatched=$(echo "$joined" | awk '$1 ~ /^(gemm|kernel)$/ && ($5 == "-" || $6 == "-")' | wc -l)
[ "$unmatched" -eq 0 ] || fail "$unmatched rows did not join: $joined"
out=$("$KILN" compile models/gpt.lua --target cpu --threads 1 --calibrate "$dir/m.tsv" 2>&1) ||
    fail "--calibrate on a measured table: $out"
echo "$out" | grep -q "^calibration of cpu against $dir/m.tsv (measured on cpu, 3 steps" ||
    fail "no calibration of the measured table: $out"
echo "$out" | grep -q "names no predicted launch" && fail "measured rows unmatched: $out"
"$KILN" compile models/gpt.lua --kernel-table "$dir/x.tsv" >"$dir/err" 2>&1
[ $? -eq 2 ] && grep -q -- '--kernel-table needs --target' "$dir/err" || fail "compile without --target: $(cat "$dir/err")"
"$KILN" train models/gpt.lua --steps 1 --kernel-table "$dir/x.tsv" >"$dir/err" 2>&1
[ $? -eq 2 ] && grep -q -- '--kernel-table needs --profile' "$dir/err" || fail "train without --profile: $(cat "$dir/err")"
"$KILN" compile models/gpt.lua --target h100 --kernel-table "$dir/no/such/dir/t.tsv" >"$dir/err" 2>&1
[ $? -eq 1 ] && grep -q "cannot write" "$dir/err" || fail "unwritable table: $(cat "$dir/err")"
echo "predict: ok"
