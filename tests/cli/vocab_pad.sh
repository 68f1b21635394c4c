#!/bin/bash
# Vocabulary padding (gpt.lua vocab_pad, docs/dsl.md): V = 200 padded to 256
# trains to the same losses as unpadded, bit for bit in the printed digits
# (the padding is masked out of the loss, its rows get no gradient, the
# init of the real rows is the same); unpadded weights (200 rows) import
# into the padded model (the padding zeroed) and give the same val loss;
# the padded model saves wte.weight with its padded shape [256,C]; weights
# of the padded shape are refused by the unpadded model.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh # $dir, fail, expect_error
m=models/gpt.lua
run() { # name, extra args...
    local n=$1
    shift
    "$KILN" train $m --set V=200 --set steps=4 --set eval_every=4 "$@" > "$dir/$n.log" 2>&1 ||
        fail "training ($n) failed: $(tail -5 "$dir/$n.log")"
    sed -n 's/^final: .*train loss \([^ ]*\) | val loss \([^ ]*\) .*/\1 \2/p' "$dir/$n.log"
}
a=$(run plain --set vocab_pad=1 --save-weights "$dir/plain.safetensors")
b=$(run padded --set vocab_pad=64 --save-weights "$dir/padded.safetensors")
[ -n "$a" ] || fail "no final losses in: $(cat "$dir/plain.log")"
echo "unpadded: $a; padded to 256: $b"
[ "$a" = "$b" ] || fail "padded losses '$b' differ from unpadded '$a'"

# the padded model saves the padded table
grep -a -o '"wte.weight":{[^}]*}' "$dir/padded.safetensors" | grep -q '"shape":\[256,32\]' ||
    fail "padded weights do not hold wte.weight [256,32]"

# unpadded weights into the padded model: lr 0, the val loss of the first run
c=$(run import --set vocab_pad=64 --set lr=0 --set min_lr=0 --init-from "$dir/plain.safetensors")
d=$(run reload --set vocab_pad=1 --set lr=0 --set min_lr=0 --init-from "$dir/plain.safetensors")
echo "imported into padded: $c; reloaded unpadded: $d"
[ "${c#* }" = "${d#* }" ] || fail "val loss of imported weights '${c#* }' differs from '${d#* }'"

# padded weights do not load into the unpadded model (256 rows, it has 200)
expect_error "padded.safetensors" '"wte.weight"' "has the wrong shape" "[256,32]" "[200,32]" -- \
    "$KILN" train $m --set V=200 --set vocab_pad=1 --set steps=1 --init-from "$dir/padded.safetensors"
echo "ok"
