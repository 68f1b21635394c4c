#!/bin/bash
# kiln eval and train{eval_batches = "all"} go through every example once,
# the last partial batch padded and its padding not counted:
# - tensors_mlp.lua (batch 16) on 50 held-out examples (3 full batches and
#   one of 2): the loss and accuracy equal an independent forward in Python
#   doubles over all 50 (lib/mlp_ref.py), which differs from the mean over
#   the first 48 (the last batch dropped); the same from --data-path, from
#   the validation split (val_path), from the training loop's final
#   evaluation, and in --log-dir's eval.jsonl;
# - aux_loss.lua's extra scalar outputs xent and zloss over 40 examples
#   (batch 32) equal their references over all 40;
# - gpt.lua on the text split (no mask input: the last batch runs twice) and
#   addition.lua (mask: the padding masked): batch 4, 1 and 7 give the same
#   loss and the same count of examples; text's count is the split's
#   windows, (floor(n * 0.1) - 1) div T for a file of n bytes.
set -u
: "${KILN:?}"
command -v python3 > /dev/null || { echo "python3 not installed: skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-eval-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. tests/cli/lib/arrays.sh

# the loss on kiln eval's result line, and a field of it
loss_of() { sed -n 's/^eval: loss \([^ ]*\).*/\1/p' <<< "$1"; }
field() { sed -n "s/^eval: loss .*| $2 \([0-9]*\).*/\1/p" <<< "$1"; }
# close A B REL: |A - B| <= REL * |B|
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
          m = b < 0 ? -b : b; exit !(a != "" && b != "" && d <= r * m) }'; }

m=tests/data/tensors_mlp.lua
blob_xy 96 1 "$dir/x.raw" "$dir/y.raw"
blob_xy 50 2 "$dir/vx.raw" "$dir/vy.raw"
st_file "$dir/train.safetensors" x F32 '[96,4]' "$dir/x.raw" y I32 '[96]' "$dir/y.raw"
st_file "$dir/val.safetensors" x F32 '[50,4]' "$dir/vx.raw" y I32 '[50]' "$dir/vy.raw"
train=$("$KILN" train "$m" --steps 3 --set data_path="$dir/train.safetensors" \
        --set val_path="$dir/val.safetensors" --set eval_batches=all \
        --save-weights "$dir/w.safetensors" 2>&1) || fail "kiln train: $train"
w="$dir/w.safetensors"

read -r ref right n <<< "$(python3 tests/cli/lib/mlp_ref.py "$w" "$dir/val.safetensors")" ||
    fail "mlp_ref.py"
read -r ref48 _ _ <<< "$(python3 tests/cli/lib/mlp_ref.py "$w" "$dir/val.safetensors" 48)"
[ "$n" = 50 ] || fail "the reference saw $n examples"
# the test can tell: dropping the last 2, or counting 14 padded copies, moves the mean
close "$ref48" "$ref" 1e-3 && fail "the first 48 examples' mean $ref48 is the 50's $ref"

out=$("$KILN" eval "$m" --init-from "$w" --data-path "$dir/val.safetensors" \
      --log-dir "$dir/log" 2>&1) || fail "kiln eval: $out"
echo "$out"
l=$(loss_of "$out")
close "$l" "$ref" 2e-5 || fail "kiln eval's loss $l, the reference over all 50: $ref"
[ "$(field "$out" examples)" = 50 ] || fail "not 50 examples: $out"
echo "$out" | grep -q "accuracy [0-9.]*% ($right/50)" || fail "accuracy: expected $right/50: $out"
echo "$out" | grep -q '4 batches of 16 (the last holds 2, padded' || fail "no batch line: $out"
python3 - "$dir/log/eval.jsonl" "$ref" <<'PY' || fail "eval.jsonl: $(cat "$dir/log/eval.jsonl")"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
assert r["examples"] == 50, r
assert abs(r["val_loss"] - float(sys.argv[2])) <= 2e-5 * float(sys.argv[2]), r
PY

# the validation split (val_path) rather than --data-path: the same
out2=$("$KILN" eval "$m" --init-from "$w" --set data_path="$dir/train.safetensors" \
       --set val_path="$dir/val.safetensors" -q 2>&1) || fail "kiln eval (val_path): $out2"
[ "$(loss_of "$out2")" = "$l" ] || fail "val_path gives $(loss_of "$out2"), --data-path $l"
# the training loop's final evaluation with eval_batches = "all"
tv=$(sed -n 's/^final: .*| val loss \([^ ]*\) .*/\1/p' <<< "$train")
close "$tv" "$ref" 2e-5 || fail "train{eval_batches=all}: val loss $tv, the reference $ref"
echo "tensors: kiln eval $l, train's final $tv, reference $ref (first 48: $ref48)"

# extra scalar outputs: aux_loss.lua (batch 32) on 40 examples of data
# tensors prints xent and zloss, each the mean over all 40 (xent: the
# reference's cross-entropy; zloss: 1e-3 x the mean square of its logits)
python3 - "$dir/ax.raw" "$dir/ay.raw" <<'PY' || fail "writing the aux_loss data"
import struct, sys
xs = [((i * 7) % 11 - 5) / 3.0 for i in range(80)]
open(sys.argv[1], "wb").write(struct.pack("<80f", *xs))
open(sys.argv[2], "wb").write(struct.pack("<40i", *[(i * 5) % 4 for i in range(40)]))
PY
st_file "$dir/aux.safetensors" x F32 '[40,2]' "$dir/ax.raw" y I32 '[40]' "$dir/ay.raw"
"$KILN" train tests/data/aux_loss.lua --steps 40 --set data=tensors -q \
    --set data_path="$dir/aux.safetensors" --set val_fraction=0 \
    --save-weights "$dir/aux-w.safetensors" > /dev/null 2>&1 || fail "kiln train aux_loss.lua"
out=$("$KILN" eval tests/data/aux_loss.lua --set data=tensors --init-from "$dir/aux-w.safetensors" \
      --data-path "$dir/aux.safetensors" 2>&1) || fail "kiln eval aux_loss.lua: $out"
read -r xref _ _ <<< "$(LOGITS="$dir/aux-logits.txt" python3 tests/cli/lib/mlp_ref.py \
    "$dir/aux-w.safetensors" "$dir/aux.safetensors")" || fail "mlp_ref.py on aux_loss"
zref=$(awk '{ for (i = 1; i <= NF; i++) { s += $i * $i; n++ } } END { printf "%.12g", 1e-3 * s / n }' \
       "$dir/aux-logits.txt")
xe=$(sed -n 's/^eval: .*| xent \([^ ]*\).*/\1/p' <<< "$out")
ze=$(sed -n 's/^eval: .*| zloss \([^ ]*\).*/\1/p' <<< "$out")
close "$xe" "$xref" 2e-5 || fail "xent $xe, the reference $xref: $out"
close "$ze" "$zref" 2e-5 || fail "zloss $ze, the reference $zref: $out"
close "$(loss_of "$out")" "$(awk -v a="$xref" -v b="$zref" 'BEGIN { printf "%.12g", a + b }')" 2e-5 ||
    fail "loss $(loss_of "$out") is not xent + zloss ($xref + $zref)"
echo "aux_loss.lua: xent $xe (reference $xref), zloss $ze (reference $zref)"

# token data: gpt.lua (no mask) and addition.lua (mask), whatever the batch
"$KILN" train models/gpt.lua --steps 5 -q --save-weights "$dir/g.safetensors" > /dev/null 2>&1 ||
    fail "kiln train gpt.lua"
bytes=$(stat -c %s tests/data/tiny.txt)
want=$(( (bytes / 10 - 1) / 32 ))  # floor(n * 0.1) validation bytes, windows of T=32
first=
for b in 4 1 7; do
    o=$("$KILN" eval models/gpt.lua --init-from "$dir/g.safetensors" --set batch=$b 2>&1) ||
        fail "kiln eval gpt.lua batch $b: $o"
    [ "$(field "$o" examples)" = "$want" ] || fail "batch $b: expected $want windows: $o"
    [ "$(field "$o" tokens)" = "$((want * 32))" ] || fail "batch $b: tokens: $o"
    x=$(loss_of "$o")
    [ -n "$first" ] || first=$x
    close "$x" "$first" 1e-5 || fail "gpt.lua batch $b: loss $x, batch 4: $first"
done
echo "gpt.lua: $want windows, loss $first at batch 4, 1 and 7"
"$KILN" train models/addition.lua --set digits=2 --steps 3 -q \
    --save-weights "$dir/a.safetensors" > /dev/null 2>&1 || fail "kiln train addition.lua"
first= cnt=
for b in 64 7; do
    o=$("$KILN" eval models/addition.lua --set digits=2 --init-from "$dir/a.safetensors" \
        --set batch=$b 2>&1) || fail "kiln eval addition.lua batch $b: $o"
    x=$(loss_of "$o") c=$(field "$o" examples)
    [ -n "$first" ] || { first=$x; cnt=$c; }
    [ "$c" = "$cnt" ] || fail "addition batch $b: $c examples, batch 64: $cnt"
    close "$x" "$first" 1e-5 || fail "addition.lua batch $b: loss $x, batch 64: $first"
done
[ $((cnt % 64)) -ne 0 ] && [ $((cnt % 7)) -ne 0 ] || fail "$cnt examples fill whole batches"
echo "addition.lua: $cnt held-out problems, loss $first at batch 64 and 7"

# eval_batches = "all" over ranks: 2 ranks at batch 8 (each evaluates every
# other batch) report what 1 rank at batch 16 reports, every example once
ADD="models/addition.lua --set L=1 --set C=32 --set H=2 --set digits=2 --steps 4
--set eval_every=2 --set eval_batches=all"
one=$("$KILN" train $ADD --set batch=16 2>&1) || fail "addition, one rank: $one"
two=$("$KILN" train $ADD --set batch=8 --nproc 2 2>&1) || fail "addition, two ranks: $two"
vl() { sed -n 's/.*val loss \([0-9.e+-]*\).*/\1/p' <<< "$1"; }
acc() { grep -o 'accuracy [0-9.]*% ([0-9]*/[0-9]*' <<< "$1"; }
paste <(vl "$one") <(vl "$two") | while read -r a b; do
    close "$b" "$a" 1e-5 || fail "2 ranks: val loss $b, 1 rank: $a"
done
[ "$(vl "$one" | wc -l)" -eq 2 ] || fail "expected 2 evaluations: $one"
[ "$(acc "$one")" = "$(acc "$two")" ] || fail "accuracy: 1 rank $(acc "$one"), 2 ranks $(acc "$two")"
acc "$one" | grep -q "/$cnt\$" || fail "not every held-out problem ($cnt): $(acc "$one")"
echo "eval_batches=all: 1 rank and 2 ranks agree: $(vl "$two" | tr '\n' ' ')"
echo "ok"
