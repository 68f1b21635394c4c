#!/bin/bash
# Weights out and in: --save-weights then --init-from gives the same loss;
# a wrong shape, a missing tensor, a checkpoint of another model and a
# corrupt file are clear errors with a non-zero exit.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh # $dir, fail, expect_error
m=models/mlp.lua

"$KILN" train $m --steps 30 --save-weights "$dir/w.safetensors" --checkpoint "$dir/ck" \
    > "$dir/a.log" || fail "training failed: $(cat "$dir/a.log")"
test -f "$dir/w.safetensors" || fail "no weights file"
val_a=$(grep -o 'val loss [^ ]*' "$dir/a.log" | tail -1)
test -n "$val_a" || fail "no val loss in: $(cat "$dir/a.log")"

# load the weights, train with lr 0: params unchanged, the same val loss
"$KILN" train $m --steps 1 --set lr=0 --set min_lr=0 --init-from "$dir/w.safetensors" \
    --save-weights "$dir/w2.safetensors" > "$dir/b.log" || fail "init-from failed: $(cat "$dir/b.log")"
grep -q "initialised params from" "$dir/b.log" || fail "no init-from note"
val_b=$(grep -o 'val loss [^ ]*' "$dir/b.log" | tail -1)
[ "$val_a" = "$val_b" ] || fail "val loss after --init-from differs: '$val_a' vs '$val_b'"
cmp -s "$dir/w.safetensors" "$dir/w2.safetensors" || fail "params changed with lr 0"

# wrong shape: names the tensor and both shapes
expect_error "w.safetensors" '"fc1.weight"' "has the wrong shape" "[2,64]" "[2,128]" -- \
    "$KILN" train $m --steps 1 --set hidden=64 --init-from "$dir/w.safetensors"
# missing tensor
expect_error "missing tensor" "fc3" -- \
    "$KILN" train $m --steps 1 --set depth=3 --init-from "$dir/w.safetensors"
# a checkpoint from a different model
expect_error "ck.step30.safetensors" "different model" -- \
    "$KILN" train $m --steps 40 --set hidden=64 --resume "$dir/ck.step30.safetensors"
# weights are not a checkpoint
expect_error "not a kiln checkpoint" "--init-from" -- \
    "$KILN" train $m --steps 40 --resume "$dir/w.safetensors"
# corrupt safetensors: a truncated file and garbage
head -c 100 "$dir/w.safetensors" > "$dir/trunc.safetensors"
expect_error "trunc.safetensors" "corrupt" -- \
    "$KILN" train $m --steps 1 --init-from "$dir/trunc.safetensors"
printf 'this is not a safetensors file at all' > "$dir/junk.safetensors"
expect_error "junk.safetensors" "corrupt" -- \
    "$KILN" train $m --steps 1 --init-from "$dir/junk.safetensors"
expect_error "nothere.safetensors" "cannot open" -- \
    "$KILN" train $m --steps 1 --init-from "$dir/nothere.safetensors"
echo "weights ok"
bad_input_done
