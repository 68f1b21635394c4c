#!/bin/bash
# models/cnn.lua (two 3x3 convolutions, batch norm, max pooling, group
# norm, global average pooling) trained with `kiln train` on 8x8 images of
# oriented bars written here (lib/arrays.sh bars_xy: a horizontal, vertical
# or diagonal bar of 3 bright pixels anywhere over noise): held-out
# accuracy >= 95% on 256 images it never saw. The convolutions are im2col +
# GEMM in the graph (no slice or concat), their gradients GEMMs and col2im.
# BatchNorm's running statistics are state: assigned in the training step
# only, saved in the weights file (moved away from their init of 0 and 1),
# and `kiln eval` of those weights (the evaluation graph reads them) gives
# training's final held-out accuracy.
set -eu
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cnn-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. tests/cli/lib/arrays.sh

bars_xy 640 11 "$dir/x.raw" "$dir/y.raw"
bars_xy 256 12 "$dir/vx.raw" "$dir/vy.raw"
mkdir "$dir/train" "$dir/val"
npy_file "$dir/train/x.npy" 1 '<f4' '(640, 1, 8, 8)' "$dir/x.raw"
npy_file "$dir/train/y.npy" 1 '<i4' '(640,)' "$dir/y.raw"
npy_file "$dir/val/x.npy" 1 '<f4' '(256, 1, 8, 8)' "$dir/vx.raw"
npy_file "$dir/val/y.npy" 1 '<i4' '(256,)' "$dir/vy.raw"

# the step graph: convolutions as im2col feeding a GEMM, col2im in backward
"$KILN" compile models/cnn.lua --dump-after=autodiff --dump-dir "$dir/dump" > "$dir/compile" 2>&1 ||
    fail "kiln compile: $(tail -3 "$dir/compile")"
ir="$dir/dump/00-autodiff.ir"
[ "$(grep -c '= im2col ' "$ir")" -ge 3 ] || fail "expected im2col ops (2 convolutions, 1 pool)"
grep -q '= col2im ' "$ir" || fail "no col2im in backward"
grep -q 'matmul %[0-9]*, %[0-9]* {ta=0,tb=1}.*cnn.lua:3[01]' "$ir" ||
    fail "no GEMM of the patches and the weight at the convolutions' lines"
! grep -qE '= (concat|slice) ' "$ir" || fail "a convolution made slices or a concat"

"$KILN" train models/cnn.lua --set data_path="$dir/train" --set val_path="$dir/val" \
    --set eval_batches=all --set log_every=50 --save-weights "$dir/w.safetensors" \
    > "$dir/log" 2>&1 ||
    fail "kiln train: $(tail -5 "$dir/log")"
line=$(grep '^final:' "$dir/log") || fail "no final line: $(tail -3 "$dir/log")"
acc=$(echo "$line" | grep -o 'accuracy [0-9.]*% ([0-9]*/256 held-out)') ||
    fail "no held-out accuracy over the 256 images: $line"
pct=$(echo "$acc" | sed 's/accuracy \([0-9.]*\)%.*/\1/')
awk -v p="$pct" 'BEGIN { exit !(p >= 95) }' || fail "held-out $acc (expected >= 95%)"
echo "cnn: $acc; $(grep -o 'train loss [0-9.e-]*' <<< "$line")"

# the running statistics: updates of the training step, not of evaluation
upd=$(grep -c '^update %[0-9]* <- ' "$dir/dump/00-autodiff.ir")
[ "$upd" -eq 2 ] || fail "expected 2 updates (bn1's running mean and variance), got $upd"
"$KILN" compile models/cnn.lua --dump-after=optimizer --dump-dir "$dir/dump2" > /dev/null 2>&1 ||
    fail "compile to optimizer"
grep -q '^state (not trained; saved with the params):' "$dir/compile" &&
    grep -q '^  bn1.running_var  *f32\[8\]' "$dir/compile" || fail "the summary lists no state"
grep -q 'state "bn1.running_mean" zeros' "$dir/dump2/"*optimizer.ir || fail "no running_mean state"
grep -q 'state "bn1.running_var" ones' "$dir/dump2/"*optimizer.ir || fail "no running_var state"

# in the weights file, moved from their init
hdr=$(head -c 4096 "$dir/w.safetensors" | tr -c '[:print:]' ' ')
for t in bn1.running_mean bn1.running_var bn1.weight conv1.weight; do
    grep -q "\"$t\"" <<< "$hdr" || fail "weights lack $t"
done

# kiln eval of the saved weights: the final held-out numbers
"$KILN" eval models/cnn.lua --init-from "$dir/w.safetensors" --set val_path="$dir/val" \
    --set data_path="$dir/train" > "$dir/eval" 2>&1 || fail "kiln eval: $(tail -3 "$dir/eval")"
eacc=$(grep -o 'accuracy [0-9.]*% ([0-9]*/256' "$dir/eval") || fail "no eval accuracy: $(cat "$dir/eval")"
grep -q "$eacc" <<< "$acc" || fail "kiln eval: $eacc, training's final: $acc"
echo "kiln eval of the weights: $eacc"
