#!/usr/bin/env bash
# infer.sh - kiln eval and kiln predict with --device cuda, the real
# libkiln_cuda.so on the fakes of tests/cudafake (FAKE_LIB on
# LD_LIBRARY_PATH), against the CPU backend: gpt.lua (attention, layer
# norm, the tied head) over the validation split of tests/data/tiny.txt at
# batch 4 (166 windows: the last batch holds 2, so the unmasked path runs
# it twice) gives the loss within 1e-4 relative and the same count; its
# logits for a 300-byte file (9 windows) agree within 1e-4 (per tensor,
# ||a - b|| / ||b||); addition.lua (the masked path, accuracy) gives the
# loss within 1e-4 and the same accuracy count. Skipped (77) without
# python3 or the fakes.
set -u
: "${KILN:?KILN must point at the kiln binary}"
: "${FAKE_LIB:?FAKE_LIB must point at the fake libraries}"
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
[ -e "$FAKE_LIB/libcuda.so.1" ] || { echo "no fake driver in $FAKE_LIB: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cudafake-infer.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cuda() { LD_LIBRARY_PATH="$FAKE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$KILN" "$@" --device cuda; }
loss_of() { sed -n 's/^eval: loss \([^ ]*\).*/\1/p' <<< "$1"; }
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
          m = b < 0 ? -b : b; exit !(a != "" && b != "" && d <= r * m) }'; }

"$KILN" train models/gpt.lua --steps 5 -q --save-weights "$T/g.safetensors" > /dev/null 2>&1 ||
    fail "kiln train gpt.lua"
cpu=$("$KILN" eval models/gpt.lua --init-from "$T/g.safetensors" 2>&1) || fail "cpu eval: $cpu"
gpu=$(cuda eval models/gpt.lua --init-from "$T/g.safetensors" 2>&1) || fail "cuda eval: $gpu"
grep -qi 'fake.*\(error\|race\|refus\)' <<< "$gpu" && fail "the fakes complained: $gpu"
close "$(loss_of "$gpu")" "$(loss_of "$cpu")" 1e-4 ||
    fail "gpt.lua eval: cuda $(loss_of "$gpu"), cpu $(loss_of "$cpu")"
[ "$(grep -o 'examples [0-9]*' <<< "$gpu")" = "$(grep -o 'examples [0-9]*' <<< "$cpu")" ] ||
    fail "gpt.lua: example counts differ: $gpu / $cpu"
echo "gpt.lua eval: cuda $(loss_of "$gpu"), cpu $(loss_of "$cpu")"

head -c 300 tests/data/tiny.txt > "$T/small.txt"
for dev in cpu cuda; do
    run="$KILN"
    [ $dev = cuda ] && run=cuda
    o=$($run predict models/gpt.lua --init-from "$T/g.safetensors" --data-path "$T/small.txt" \
        --outputs logits --out "$T/$dev.safetensors" 2>&1) || fail "$dev predict: $o"
done
python3 - "$T/cuda.safetensors" "$T/cpu.safetensors" <<'PY' || fail "gpt.lua logits differ"
import json, math, struct, sys
def logits(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    t = json.loads(raw[8:8 + n])["logits"]
    assert t["shape"] == [9, 32, 256], t
    a, b = t["data_offsets"]
    return struct.unpack("<%df" % (9 * 32 * 256), raw[8 + n + a:8 + n + b])
a, b = logits(sys.argv[1]), logits(sys.argv[2])
rel = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(y * y for y in b))
assert rel < 1e-4, rel
print("gpt.lua logits: cuda vs cpu %.3g" % rel)
PY

"$KILN" train models/addition.lua --set digits=2 --set L=1 --set C=32 --set H=2 --steps 5 -q \
    --save-weights "$T/a.safetensors" > /dev/null 2>&1 || fail "kiln train addition.lua"
A=(eval models/addition.lua --set digits=2 --set L=1 --set C=32 --set H=2 --set batch=16
   --init-from "$T/a.safetensors")
cpu=$("$KILN" "${A[@]}" 2>&1) || fail "cpu addition eval: $cpu"
gpu=$(cuda "${A[@]}" 2>&1) || fail "cuda addition eval: $gpu"
close "$(loss_of "$gpu")" "$(loss_of "$cpu")" 1e-4 ||
    fail "addition eval: cuda $(loss_of "$gpu"), cpu $(loss_of "$cpu")"
[ "$(grep -o 'accuracy.*' <<< "$gpu")" = "$(grep -o 'accuracy.*' <<< "$cpu")" ] ||
    fail "addition accuracy: cuda $gpu / cpu $cpu"
echo "addition.lua eval: cuda $(loss_of "$gpu"), cpu $(loss_of "$cpu")"
echo ok
