#!/bin/bash
# kiln eval and kiln predict refuse bad input with an error that names the
# flag or file, exit 1 (2 for a malformed command line), never crash, and
# leave no output file (nor a temp file) behind:
# weights of another model or of another shape; an unknown output, or one
# that is not one row per example; an empty text file, an empty tensors
# file; --data-path for a model whose data reads no file; no validation
# split; blobs (no end to go through); --out with another extension, a
# directory that is not empty, a missing parent; missing flags;
# train{eval_batches} neither a count nor "all"; SIGINT during a run.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bad-infer-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. tests/cli/lib/arrays.sh

# expect RC PATTERN CMD...: exit code RC, stderr matching PATTERN, no crash
expect() {
    local rc=$1 pat=$2
    shift 2
    "$@" > "$dir/out" 2> "$dir/err"
    local got=$?
    [ "$got" -eq "$rc" ] || fail "$*: exit $got, expected $rc: $(cat "$dir/err")"
    grep -qE -- "$pat" "$dir/err" || fail "$*: expected /$pat/, got: $(cat "$dir/err")"
    if grep -qE 'AddressSanitizer|runtime error|Segmentation|Aborted|internal error' "$dir/err"; then
        fail "$*: crashed: $(cat "$dir/err")"
    fi
}
m=tests/data/tensors_mlp.lua
blob_xy 40 1 "$dir/x.raw" "$dir/y.raw"
st_file "$dir/d.safetensors" x F32 '[40,4]' "$dir/x.raw" y I32 '[40]' "$dir/y.raw"
: > "$dir/none.raw"
st_file "$dir/empty.safetensors" x F32 '[0,4]' "$dir/none.raw" y I32 '[0]' "$dir/none.raw"
: > "$dir/empty.txt"
"$KILN" train "$m" --steps 2 --set data_path="$dir/d.safetensors" -q \
    --save-weights "$dir/w.safetensors" > /dev/null 2>&1 || fail "kiln train tensors_mlp"
"$KILN" train models/gpt.lua --steps 1 -q --save-weights "$dir/g.safetensors" > /dev/null 2>&1 ||
    fail "kiln train gpt.lua"
w="$dir/w.safetensors"
P() { "$KILN" predict "$m" --init-from "$w" --data-path "$dir/d.safetensors" "$@"; }

# weights that do not match the model
# a flag without its value (the last word of the command line)
expect 2 '^kiln: --data-path needs a value' "$KILN" eval models/mlp.lua --data-path
expect 2 '^kiln: --out needs a value' "$KILN" predict models/mlp.lua --out
expect 1 "^kiln eval: --init-from: $dir/g.safetensors: missing tensor \"fc.weight\"" \
    "$KILN" eval "$m" --init-from "$dir/g.safetensors" --data-path "$dir/d.safetensors"
expect 1 '^kiln eval: --init-from: .*"wte.weight" has the wrong shape \(the model expects f32\[256,64\], the file has f32\[256,32\]\)' \
    "$KILN" eval models/gpt.lua --init-from "$dir/g.safetensors" --set C=64
expect 1 "^kiln predict: --init-from: $dir/missing.safetensors: " \
    "$KILN" predict "$m" --init-from "$dir/missing.safetensors" --data-path "$dir/d.safetensors" \
    --outputs logits --out "$dir/p.safetensors"
# outputs
expect 1 '^kiln predict: --outputs: tests/data/tensors_mlp.lua has no output "nope" \(expected one of: loss, logits\)' \
    P --outputs logits,nope --out "$dir/p.safetensors"
expect 1 '^kiln predict: --outputs: output "loss" is f32\[\], not one row per example' \
    P --outputs loss --out "$dir/p.safetensors"
expect 1 '^kiln predict: --outputs: "logits" is named twice' \
    P --outputs logits,logits --out "$dir/p.safetensors"
# empty data
expect 1 "^kiln eval: --data-path: $dir/empty.txt: data file is empty" \
    "$KILN" eval models/gpt.lua --init-from "$dir/g.safetensors" --data-path "$dir/empty.txt"
expect 1 "^kiln predict: --data-path: .*$dir/empty.safetensors: no examples" \
    "$KILN" predict "$m" --init-from "$w" --data-path "$dir/empty.safetensors" \
    --outputs logits --out "$dir/p.safetensors"
expect 1 "^kiln eval: --data-path $dir/empty.txt: models/addition.lua's data is addition, which reads no file" \
    "$KILN" eval models/addition.lua --init-from "$w" --data-path "$dir/empty.txt"
expect 1 '^kiln eval: models/gpt.lua: the data has no validation split .*expected --data-path P' \
    "$KILN" eval models/gpt.lua --init-from "$dir/g.safetensors" --set val_fraction=0
"$KILN" train models/mlp.lua --steps 1 -q --save-weights "$dir/mlp.safetensors" > /dev/null 2>&1 ||
    fail "kiln train mlp.lua"
expect 1 '^kiln eval: the validation split of data blobs: data blobs draws its points at random and has no whole split' \
    "$KILN" eval models/mlp.lua --init-from "$dir/mlp.safetensors"
expect 1 '^models/mlp.lua:31: train\{eval_batches = "all"\}: data blobs draws its points at random' \
    "$KILN" train models/mlp.lua --steps 1 --set eval_batches=all
expect 1 'eval_batches: expected an integer from 1 to 1000000000 or "all", got most' \
    "$KILN" train models/gpt.lua --steps 1 --set eval_batches=most
# --out
expect 1 "^kiln predict: --out $dir/p.bin: expected FILE.safetensors, or DIR/" \
    P --outputs logits --out "$dir/p.bin"
mkdir "$dir/full" && : > "$dir/full/keep"
expect 1 "^kiln predict: --out $dir/full/: the directory is not empty" \
    P --outputs logits --out "$dir/full/"
expect 1 "^kiln predict: --out $dir/nodir/x/: cannot write \(expected an existing directory $dir/nodir" \
    P --outputs logits --out "$dir/nodir/x/"
expect 1 "^kiln predict: --out $dir/nodir/p.safetensors: " \
    P --outputs logits --out "$dir/nodir/p.safetensors"
# the command line
expect 2 '^kiln eval: missing option: --init-from' "$KILN" eval models/gpt.lua
expect 2 '^kiln predict: missing option: --data-path' \
    "$KILN" predict "$m" --init-from "$w" --outputs logits --out "$dir/p.safetensors"
expect 2 '^kiln predict: missing option: --outputs' \
    "$KILN" predict "$m" --init-from "$w" --data-path "$dir/d.safetensors" --out "$dir/p.safetensors"
expect 2 '^kiln predict: --outputs expects NAME\[,NAME...\], got: logits,' \
    P --outputs logits, --out "$dir/p.safetensors"
expect 2 '^kiln eval: unknown option: --outputs' \
    "$KILN" eval "$m" --init-from "$w" --outputs logits
# SIGINT mid-run (a file of about 26000 windows: seconds of work even on an
# idle machine; 6600 finished within the 1 s wait there): exit 130,
# no output file
for i in $(seq 1 16); do cat tests/data/tiny.txt; done > "$dir/big.txt"
"$KILN" predict models/gpt.lua --init-from "$dir/g.safetensors" --data-path "$dir/big.txt" \
    --outputs logits --out "$dir/p.big.safetensors" > "$dir/out" 2> "$dir/err" &
pid=$!
sleep 1
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "predict stopped by SIGINT: exit $rc, expected 130: $(cat "$dir/err")"
grep -q 'stopped by SIGINT' "$dir/err" || fail "no stop message: $(cat "$dir/err")"
# nothing written by any of them
left=$(ls "$dir" | grep -E '^p\.|\.tmp|^nodir' || true)
[ -z "$left" ] || fail "output files left behind: $left"
[ "$(ls "$dir/full")" = keep ] || fail "the non-empty directory changed: $(ls "$dir/full")"
echo "ok"
