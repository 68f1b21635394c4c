#!/bin/bash
# Bad data and outputs: a missing data file, a truncated or wrong-magic token
# file, an empty text file, an unwritable output path. Each is a clear
# message naming the file, a non-zero exit, and no half-written output.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh # $dir, fail, expect_error

gpt=("$KILN" train models/gpt.lua --steps 2)

expect_error "$dir/missing.txt" "cannot open" -- "${gpt[@]}" --set data_path="$dir/missing.txt"
: > "$dir/empty.txt"
expect_error "$dir/empty.txt" "empty" -- "${gpt[@]}" --set data_path="$dir/empty.txt"

# a valid token file: header (magic 20240520, version 1, 4096 tokens), then
# uint16 tokens a..z repeated
le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $(($1 >> 8 & 255)))\\$(printf %03o $(($1 >> 16 & 255)))\\$(printf %03o $(($1 >> 24 & 255)))"; }
pattern=$(for c in a b c d e f g h i j k l m n o p q r s t u v w x y z; do printf '%s\\000' "$c"; done)
{
    le32 20240520; le32 1; le32 4096
    head -c $((1024 - 12)) /dev/zero
    for i in $(seq 160); do printf "$pattern"; done | head -c 8192
} > "$dir/good.bin"
[ "$(stat -c %s "$dir/good.bin")" = $((1024 + 8192)) ] || fail "could not build a token file"
"${gpt[@]}" --set data=tokens --set data_path="$dir/good.bin" > "$dir/ok.log" 2>&1 || \
    fail "a valid token file failed: $(cat "$dir/ok.log")"

head -c 5000 "$dir/good.bin" > "$dir/trunc.bin"
expect_error "$dir/trunc.bin" "truncated" -- "${gpt[@]}" --set data=tokens --set data_path="$dir/trunc.bin"
{ le32 12345; tail -c +5 "$dir/good.bin"; } > "$dir/magic.bin"
expect_error "$dir/magic.bin" "magic 20240520" -- \
    "${gpt[@]}" --set data=tokens --set data_path="$dir/magic.bin"
head -c 300 "$dir/good.bin" > "$dir/short.bin"
expect_error "$dir/short.bin" "header" -- "${gpt[@]}" --set data=tokens --set data_path="$dir/short.bin"

# data that does not fit the model: the script and its train{} line
gline=$(grep -n '^train{' models/gpt.lua | cut -d: -f1)
mline=$(grep -n '^train{' models/mlp.lua | cut -d: -f1)
[ -n "$gline" ] && [ -n "$mline" ] || fail "no train{} line in models/gpt.lua or models/mlp.lua"
expect_error "models/gpt.lua:$gline: data addition needs a vocabulary of at least 14" -- \
    "${gpt[@]}" --set V=2 --set data=addition
expect_error "models/mlp.lua:$mline: data blobs needs at least 1 feature and 2 classes" -- \
    "$KILN" train models/mlp.lua --steps 2 --set classes=1

# unwritable output paths: an error, and nothing written there
expect_error "$dir/no/such/dir/w.safetensors" "cannot write" -- \
    "$KILN" train models/mlp.lua --steps 2 --save-weights "$dir/no/such/dir/w.safetensors"
mkdir "$dir/isdir.safetensors"
expect_error "isdir.safetensors" "cannot write" -- \
    "$KILN" train models/mlp.lua --steps 2 --save-weights "$dir/isdir.safetensors"
[ -z "$(ls -A "$dir/isdir.safetensors")" ] || fail "something was written"
ls "$dir" | grep -q '\.tmp\.' && fail "a temp file was left behind"
expect_error "cannot write" -- \
    "$KILN" train models/mlp.lua --steps 2 --trace "$dir/no/such/dir/t.json"
echo "bad data ok"
bad_input_done
