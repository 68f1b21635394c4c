#!/bin/bash
# Bad training data (runtime/train/data.c, checked before the first step):
# splits shorter than one window (validation of 0 bytes, a tiny training split),
# data_path that is not a regular file (directory, FIFO, /dev/zero, socket),
# token files with a token past the embedding, a huge count, a wrong version,
# text with bytes past a small vocabulary, an empty file per file source,
# a data file for the wrong source, addition splits with no problem,
# and eval_batches too large to allocate.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

gpt=("$KILN" train models/gpt.lua --steps 2) # expect_error runs commands, not functions
gline=$(grep -n '^train{' models/gpt.lua | cut -d: -f1)
[ -n "$gline" ] || fail "no train{} line in models/gpt.lua"

# little-endian int32 and uint16 as bytes
le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $(($1 >> 8 & 255)))\\$(printf %03o $(($1 >> 16 & 255)))\\$(printf %03o $(($1 >> 24 & 255)))"; }
le16() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $(($1 >> 8 & 255)))"; }
# token_file PATH COUNT VERSION TOKEN...: an llm.c header, then the tokens
token_file() {
    local path=$1 count=$2 version=$3
    shift 3
    {
        le32 20240520; le32 "$version"; le32 "$count"
        head -c $((1024 - 12)) /dev/zero
        for t in "$@"; do le16 "$t"; done
    } > "$path"
}
toks=$(for i in $(seq 0 199); do echo $((i % 97)); done)

# 1. a validation split of 0 bytes (used to train, then SIGSEGV in the final evaluation)
head -c 50 tests/data/tiny.txt > "$dir/t50.txt"
expect_error "$dir/t50.txt: too little data" "at least 9 bytes" "50 train and 0 validation" -- \
    "${gpt[@]}" --set T=8 --set data_path="$dir/t50.txt" --set val_fraction=0.01
# 2. a training split shorter than a window of T+1 = 33 bytes
head -c 30 tests/data/tiny.txt > "$dir/t30.txt"
expect_error "$dir/t30.txt: too little data" "30 train and 0 validation" -- \
    "${gpt[@]}" --set data_path="$dir/t30.txt" --set val_fraction=0
# 3. a directory (used to abort in xmalloc asking for 2^63 bytes)
mkdir "$dir/adir"
expect_error "$dir/adir: not a data file (expected a regular file, got a directory)" -- \
    "${gpt[@]}" --set data_path="$dir/adir"
# 4. a FIFO with no writer (used to hang)
mkfifo "$dir/fifo"
expect_error -t 20 "$dir/fifo: not a data file (expected a regular file, got a FIFO)" -- \
    "${gpt[@]}" --set data_path="$dir/fifo"
# 5. /dev/zero, as text and as tokens
expect_error -t 20 "/dev/zero: not a data file" "got a character device" -- \
    "${gpt[@]}" --set data_path=/dev/zero
expect_error -t 20 "/dev/zero: not a data file" -- "${gpt[@]}" --set data=tokens --set data_path=/dev/zero
# 6. a socket, where python3 can make one
if command -v python3 > /dev/null; then
    python3 -c "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$dir/sock"
    expect_error -t 20 "$dir/sock: not a data file" "got a socket" -- \
        "${gpt[@]}" --set data_path="$dir/sock"
fi
# 7. a token at or past the embedding's rows (V = 256): named with its position
# shellcheck disable=SC2086
token_file "$dir/big.bin" 201 1 $toks 300
expect_error "$dir/big.bin: token 300 at position 200 is out of range" \
    'expected < 256, the rows of the embedding table "wte.weight"' -- \
    "${gpt[@]}" --set data=tokens --set data_path="$dir/big.bin" --set T=8
# 8. a header that claims 2^31-1 tokens: an error, nothing allocated
# shellcheck disable=SC2086
token_file "$dir/huge.bin" 2147483647 1 $toks
expect_error "$dir/huge.bin: truncated token file (header says 2147483647 tokens" -- \
    "${gpt[@]}" --set data=tokens --set data_path="$dir/huge.bin" --set T=8
# 9. a wrong version
# shellcheck disable=SC2086
token_file "$dir/v2.bin" 200 2 $toks
expect_error "$dir/v2.bin: unsupported token file version (expected 1 (uint16 tokens), got 2)" -- \
    "${gpt[@]}" --set data=tokens --set data_path="$dir/v2.bin" --set T=8
# 10. text with a byte the model's vocabulary (V = 128) cannot hold
{ head -c 100 tests/data/tiny.txt; printf '\303\251'; head -c 100 tests/data/tiny.txt; } > "$dir/utf8.txt"
expect_error "$dir/utf8.txt: byte 195 at offset 100 is out of range (expected < 128" -- \
    "${gpt[@]}" --set V=128 --set T=8 --set data_path="$dir/utf8.txt"
# 11. an empty file, as text and as tokens, and a token file of 0 tokens
: > "$dir/empty"
expect_error "$dir/empty: data file is empty" -- "${gpt[@]}" --set data_path="$dir/empty"
expect_error "$dir/empty: truncated token file (expected a 1024-byte header, got 0 bytes)" -- \
    "${gpt[@]}" --set data=tokens --set data_path="$dir/empty"
token_file "$dir/zero.bin" 0 1
expect_error "$dir/zero.bin: data file is empty" -- \
    "${gpt[@]}" --set data=tokens --set data_path="$dir/zero.bin"
# 12. a data file for the wrong source: text given as tokens, tokens given
# as text to a model whose vocabulary is under 256 (the header's bytes)
expect_error "tests/data/tiny.txt: not an llm.c token file (expected magic 20240520" -- \
    "${gpt[@]}" --set data=tokens --set data_path=tests/data/tiny.txt
# shellcheck disable=SC2086
token_file "$dir/ok.bin" 200 1 $toks
expect_error "$dir/ok.bin: byte 136 at offset 0 is out of range (expected < 128" -- \
    "${gpt[@]}" --set V=128 --set T=8 --set data_path="$dir/ok.bin"
# 13. addition whose validation split holds no problem (1 digit: 100 pairs)
expect_error "addition: with 1 digits and val_fraction 0.001 the validation split holds none" -- \
    "$KILN" train models/addition.lua --steps 2 --set digits=1 --set val_fraction=0.001
# 14. eval_batches past the limit (used to abort allocating 16 GB; now
# evaluation streams its batches, so the limit is the settings' 10^9); past
# one chunk of 4096 batches every held-out row is counted
expect_error "--set eval_batches: expected an integer from 1 to 1000000000 or \"all\", got 1000000001" \
    -- "${gpt[@]}" --set eval_batches=1000000001
"$KILN" train models/mlp.lua --steps 1 -q --set eval_batches=8197 > "$dir/eval.log" 2>&1 ||
    fail "eval_batches=8197: $(cat "$dir/eval.log")"
grep -q "(.*/$((8197 * 64)) held-out)" "$dir/eval.log" ||
    fail "eval_batches=8197 does not count 8197 batches of 64: $(cat "$dir/eval.log")"
bad_input_done
