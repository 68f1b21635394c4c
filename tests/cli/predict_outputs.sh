#!/bin/bash
# kiln predict writes the named outputs for every example, in file order,
# the last batch's padding removed:
# - tensors_mlp.lua (batch 16) on 50 examples: logits f32[50,3] in a
#   .safetensors file and in DIR/logits.npy, both equal to an independent
#   forward in Python doubles (lib/mlp_ref.py), example by example; a file
#   of the features alone (no labels y, which logits do not read) gives the
#   same logits, while kiln eval (its loss reads y) asks for y;
# - gpt.lua on a 300-byte text file (9 windows of T=32, batch 4: the last
#   batch holds 1): logits f32[9,32,256]; the cross-entropy computed from
#   them against the file's next bytes equals kiln eval's loss on the same
#   file, and batch 1 writes the same logits.
set -u
: "${KILN:?}"
command -v python3 > /dev/null || { echo "python3 not installed: skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-predict-out-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. tests/cli/lib/arrays.sh

m=tests/data/tensors_mlp.lua
blob_xy 96 1 "$dir/x.raw" "$dir/y.raw"
blob_xy 50 2 "$dir/vx.raw" "$dir/vy.raw"
st_file "$dir/train.safetensors" x F32 '[96,4]' "$dir/x.raw" y I32 '[96]' "$dir/y.raw"
st_file "$dir/val.safetensors" x F32 '[50,4]' "$dir/vx.raw" y I32 '[50]' "$dir/vy.raw"
"$KILN" train "$m" --steps 3 --set data_path="$dir/train.safetensors" -q \
    --save-weights "$dir/w.safetensors" > /dev/null 2>&1 || fail "kiln train"
LOGITS="$dir/ref.txt" python3 tests/cli/lib/mlp_ref.py "$dir/w.safetensors" \
    "$dir/val.safetensors" > /dev/null || fail "mlp_ref.py"
for out in "$dir/p.safetensors" "$dir/npy/"; do
    o=$("$KILN" predict "$m" --init-from "$dir/w.safetensors" --data-path "$dir/val.safetensors" \
        --outputs logits --out "$out" 2>&1) || fail "kiln predict --out $out: $o"
    echo "$o" | grep -q '^  logits f32\[50,3\]$' || fail "no logits line: $o"
done
python3 - "$dir/p.safetensors" "$dir/npy/logits.npy" "$dir/ref.txt" <<'PY' || fail "logits differ"
import ast, json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n])
t = h["logits"]
assert t["dtype"] == "F32" and t["shape"] == [50, 3], t
assert h["__metadata__"]["examples"] == "50", h["__metadata__"]
a, b = t["data_offsets"]
st = struct.unpack("<150f", raw[8 + n + a:8 + n + b])
raw = open(sys.argv[2], "rb").read()
assert raw[:8] == b"\x93NUMPY\x01\x00", raw[:8]
(hl,) = struct.unpack("<H", raw[8:10])
hd = ast.literal_eval(raw[10:10 + hl].decode())
assert hd == {"descr": "<f4", "fortran_order": False, "shape": (50, 3)}, hd
assert (10 + hl) % 64 == 0
npy = struct.unpack("<150f", raw[10 + hl:])
ref = [float(v) for line in open(sys.argv[3]) for v in line.split()]
assert len(ref) == 150
worst = max(abs(s - r) / (1 + abs(r)) for s, r in zip(st, ref))
assert worst < 1e-5, worst
assert list(st) == list(npy)
print("mlp logits: 50 examples, worst difference %.2g against the reference" % worst)
PY

# the features alone (no labels: logits do not read y): the same logits;
# kiln eval, whose loss reads y, still asks for them
st_file "$dir/xonly.safetensors" x F32 '[50,4]' "$dir/vx.raw"
o=$("$KILN" predict "$m" --init-from "$dir/w.safetensors" --data-path "$dir/xonly.safetensors" \
    --outputs logits --out "$dir/xonly-p.safetensors" 2>&1) || fail "predict without y: $o"
python3 - "$dir/p.safetensors" "$dir/xonly-p.safetensors" <<'PY' || fail "logits without y differ"
import json, struct, sys
def data(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    a, b = json.loads(raw[8:8 + n])["logits"]["data_offsets"]
    return raw[8 + n + a:8 + n + b]
assert data(sys.argv[1]) == data(sys.argv[2])
PY
o=$("$KILN" eval "$m" --init-from "$dir/w.safetensors" --data-path "$dir/xonly.safetensors" 2>&1) &&
    fail "kiln eval without y: $o"
echo "$o" | grep -q 'no array "y" for the model input' || fail "kiln eval without y: $o"

# gpt.lua: the logits of every window agree with kiln eval's loss
head -c 300 tests/data/tiny.txt > "$dir/small.txt"
"$KILN" train models/gpt.lua --steps 5 -q --save-weights "$dir/g.safetensors" > /dev/null 2>&1 ||
    fail "kiln train gpt.lua"
for b in 4 1; do
    o=$("$KILN" predict models/gpt.lua --init-from "$dir/g.safetensors" --set batch=$b \
        --data-path "$dir/small.txt" --outputs logits --out "$dir/g$b.safetensors" 2>&1) ||
        fail "kiln predict gpt.lua batch $b: $o"
    echo "$o" | grep -q '^  logits f32\[9,32,256\]$' || fail "batch $b: no logits line: $o"
done
e=$("$KILN" eval models/gpt.lua --init-from "$dir/g.safetensors" --data-path "$dir/small.txt" \
    -q 2>&1) || fail "kiln eval gpt.lua: $e"
loss=$(sed -n 's/^eval: loss \([^ ]*\).*/\1/p' <<< "$e")
python3 - "$dir/g4.safetensors" "$dir/g1.safetensors" "$dir/small.txt" "$loss" <<'PY' ||
import json, math, struct, sys
def logits(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    t = json.loads(raw[8:8 + n])["logits"]
    assert t["shape"] == [9, 32, 256], t
    a, b = t["data_offsets"]
    return struct.unpack("<%df" % (9 * 32 * 256), raw[8 + n + a:8 + n + b])
l4, l1 = logits(sys.argv[1]), logits(sys.argv[2])
worst = max(abs(x - y) / (1 + abs(y)) for x, y in zip(l4, l1))
assert worst < 1e-5, "batch 4 and batch 1 differ by %g" % worst
text = open(sys.argv[3], "rb").read()
total = 0.0
for w in range(9):
    for t in range(32):
        row = l4[(w * 32 + t) * 256:(w * 32 + t + 1) * 256]
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        total += lse - row[text[w * 32 + t + 1]]
mean = total / (9 * 32)
want = float(sys.argv[4])
assert abs(mean - want) <= 1e-5 * want, "cross-entropy of the logits %r, kiln eval %r" % (mean, want)
print("gpt.lua logits: 9 windows; their cross-entropy %.7g, kiln eval %.7g" % (mean, want))
PY
    fail "gpt.lua logits"
echo "ok"
