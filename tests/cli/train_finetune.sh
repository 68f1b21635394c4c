#!/bin/bash
# Fine-tuning (docs/training.md, Fine-tuning): a model with other names and
# a new head (tests/data/finetune/ft.lua, 10 classes) loads the body of
# models/mlp.lua's weights (4 classes) through a rename map (a table with a
# transpose and dropped tensors; a function) with --init-partial. With lr 0
# the saved params are the loaded bits: checked against the file (plain
# Python), the transposed one transposed; the new head keeps its init and
# the run lists it, and the dropped tensors, by name. A fine-tuning run
# from the loaded body beats the same run from scratch.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-ft-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
d=tests/data/finetune

"$KILN" train models/mlp.lua --steps 150 --save-weights "$dir/w.safetensors" -q \
    > "$dir/a.log" 2>&1 || fail "training the source model: $(cat "$dir/a.log")"

# the table map, lr 0: the saved params are the loaded ones
"$KILN" train $d/ft.lua --steps 1 --set lr=0 --set min_lr=0 --init-from "$dir/w.safetensors" \
    --init-map $d/map.lua --init-partial --save-weights "$dir/o.safetensors" \
    > "$dir/b.log" 2>&1 || fail "--init-map table: $(cat "$dir/b.log")"
for want in "loaded 4 of 6 params" "left at their init (2):" "cls.weight f32[128,10] (not in the file)" \
            "ignored from the file (2):" "head.weight f32[128,4] ($d/map.lua:7 says false)"; do
    grep -qF "$want" "$dir/b.log" || fail "no '$want' in: $(cat "$dir/b.log")"
done
python3 - "$dir/w.safetensors" "$dir/o.safetensors" <<'PY' || fail "loaded bits differ"
import json, struct, sys
def read(p):
    raw = open(p, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    out = {}
    for k, t in head.items():
        if k == "__metadata__": continue
        b, e = t["data_offsets"]
        out[k] = (t["shape"], struct.unpack("<%df" % ((e - b) // 4), data[b:e]))
    return out
w, o = read(sys.argv[1]), read(sys.argv[2])
for a, b in [("fc1.weight", "body.0.weight"), ("fc1.bias", "body.0.bias"), ("fc2.bias", "body.1.bias")]:
    assert w[a] == o[b], (a, b)
(r, c), x = w["fc2.weight"]
(r2, c2), y = o["body.1.weight"]
assert (r2, c2) == (c, r)
assert all(y[j * r + i] == x[i * c + j] for i in range(r) for j in range(c)), "transpose"
assert x != y, "the transpose changed nothing: the test would not see a missing one"
PY

# the function map: the same load, the head's tensors ignored as not params
"$KILN" train $d/ft.lua --steps 1 --set lr=0 --set min_lr=0 --init-from "$dir/w.safetensors" \
    --init-map $d/fmap.lua --init-partial > "$dir/c.log" 2>&1 || fail "--init-map function: $(cat "$dir/c.log")"
grep -qF "loaded 4 of 6 params" "$dir/c.log" || fail "function map: $(cat "$dir/c.log")"
grep -qF "head.bias f32[4] (no param of that name in the model)" "$dir/c.log" ||
    fail "function map: $(cat "$dir/c.log")"

# --init-partial alone: mlp.lua with 10 classes takes the body, not the head
"$KILN" train models/mlp.lua --set classes=10 --steps 1 --init-from "$dir/w.safetensors" \
    --init-partial > "$dir/e.log" 2>&1 || fail "--init-partial: $(cat "$dir/e.log")"
grep -qF 'head.weight f32[128,10] (the file'"'"'s "head.weight" is f32[128,4])' "$dir/e.log" ||
    fail "--init-partial: $(cat "$dir/e.log")"

# fine-tuning from the loaded body beats the same steps from scratch
"$KILN" train $d/ft.lua --set classes=4 --steps 20 -q --init-from "$dir/w.safetensors" \
    --init-map $d/map.lua --init-partial > "$dir/f.log" 2>&1 || fail "fine-tune: $(cat "$dir/f.log")"
"$KILN" train $d/ft.lua --set classes=4 --steps 20 -q > "$dir/g.log" 2>&1 || fail "scratch: $(cat "$dir/g.log")"
ft=$(grep -o 'val loss [0-9.]*' "$dir/f.log" | tail -1 | cut -d' ' -f3)
sc=$(grep -o 'val loss [0-9.]*' "$dir/g.log" | tail -1 | cut -d' ' -f3)
awk -v a="$ft" -v b="$sc" 'BEGIN { exit !(a != "" && b != "" && a < b) }' ||
    fail "fine-tuned val loss $ft not below the from-scratch $sc"
echo "finetune ok: val loss after 20 steps $ft (from scratch $sc)"
