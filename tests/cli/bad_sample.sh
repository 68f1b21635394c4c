#!/bin/bash
# kiln sample refuses bad input with an error that names the flag (and the
# file's line), exit 1 (2 for a malformed command line), never crashing:
# weights of another model; a prompt longer than T; an empty prompt; a
# token out of the vocabulary (--prompt-tokens, and a byte of --prompt for
# a model of fewer than 256 tokens); text for a token model; --top-p
# outside (0, 1]; a negative temperature; a bad tokenizer file; a model
# that is not a language model; missing or conflicting flags; train{}'s
# sample_every for a model that is not a language model, a sample_prompt
# that does not fit; SIGINT mid-sample (exit 130).
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bad-sample-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

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

"$KILN" train models/gpt.lua --steps 2 --save-weights "$dir/gpt.st" -q >/dev/null 2>&1 ||
    fail "training gpt.lua"
"$KILN" train models/llama.lua --steps 2 --save-weights "$dir/llama.st" -q >/dev/null 2>&1 ||
    fail "training llama.lua"
G="models/gpt.lua --init-from $dir/gpt.st"
# a flag without its value (the last word of the command line)
expect 2 '^kiln: --prompt needs a value' "$KILN" sample $G --prompt

expect 1 'kiln sample: --init-from: .*llama.st: missing tensor "wte.weight"' \
    "$KILN" sample models/gpt.lua --init-from "$dir/llama.st" --prompt hi
expect 1 'kiln sample: --init-from: .*wrong shape' \
    "$KILN" sample $G --prompt hi --set C=64
expect 1 "kiln sample: --prompt: the prompt is 33 tokens, longer than the model's window \(expected at most T = 32\)" \
    "$KILN" sample $G --prompt "$(printf 'a%.0s' $(seq 33))"
expect 1 'kiln sample: --prompt: the prompt is empty' "$KILN" sample $G --prompt ""
printf '1 2\n3, 300\n' >"$dir/toks"
expect 1 "kiln sample: --prompt-tokens $dir/toks:2: token '300' is out of the vocabulary \(expected an integer id from 0 to 255" \
    "$KILN" sample $G --prompt-tokens "$dir/toks"
printf '1 x2\n' >"$dir/toks2"
expect 1 "toks2:1: token 'x2' is not an integer" "$KILN" sample $G --prompt-tokens "$dir/toks2"
printf '  \n\n' >"$dir/empty"
expect 1 'kiln sample: --prompt-tokens: the prompt is empty' \
    "$KILN" sample $G --prompt-tokens "$dir/empty"
expect 1 "kiln sample: --prompt-tokens $dir/none: cannot open" \
    "$KILN" sample $G --prompt-tokens "$dir/none"
expect 1 "kiln sample: --prompt: byte 200 at offset 1 is out of the vocabulary \(the model's V = 128\)" \
    "$KILN" sample models/gpt.lua --init-from "$dir/gpt.st" --set V=128 --prompt "a$(printf '\310')"
expect 1 'kiln sample: --prompt: TEXT is read as bytes, for byte-level models .* V = 300 \(expected --prompt-tokens' \
    "$KILN" sample models/gpt.lua --init-from "$dir/gpt.st" --set V=300 --prompt "a"
for p in 0 1.5 -0.1 nan x ""; do
    expect 2 "kiln sample: --top-p: expected a number in \(0, 1\], got '$p'" \
        "$KILN" sample $G --prompt hi --top-p "$p"
done
expect 2 'kiln sample: --temperature: expected a number >= 0' "$KILN" sample $G --prompt hi --temperature -1
expect 2 'kiln sample: --max-new-tokens: expected an integer from 1' \
    "$KILN" sample $G --prompt hi --max-new-tokens 0
expect 2 'kiln sample: missing option: --prompt TEXT or --prompt-tokens FILE' "$KILN" sample $G
expect 2 'kiln sample: both given, expected one: --prompt TEXT or --prompt-tokens FILE' \
    "$KILN" sample $G --prompt hi --prompt-tokens "$dir/toks"
expect 2 'kiln sample: missing option: --init-from' "$KILN" sample models/gpt.lua --prompt hi
printf 'junk' >"$dir/tok.bin"
expect 1 "kiln sample: --tokenizer $dir/tok.bin: not a GPT-2 tokenizer file of llm.c" \
    "$KILN" sample $G --prompt hi --tokenizer "$dir/tok.bin"
"$KILN" train models/mlp.lua --steps 1 --save-weights "$dir/mlp.st" -q >/dev/null 2>&1 ||
    fail "training mlp.lua"
expect 1 'kiln sample: models/mlp.lua: kiln sample needs a language model' \
    "$KILN" sample models/mlp.lua --init-from "$dir/mlp.st" --prompt hi
expect 1 'models/mlp.lua:[0-9]+: train: sample_every needs a language model' \
    "$KILN" train models/mlp.lua --steps 2 --set sample_every=1
expect 1 'models/gpt.lua:[0-9]+: train: sample_prompt: expected 1 to T = 32 tokens of the vocabulary \(V = 256\), got 40' \
    "$KILN" train models/gpt.lua --steps 2 --set sample_every=1 --set sample_prompt="$(printf 'a%.0s' $(seq 40))"
expect 1 'train: sample_prompt: expected token ids from 0 to 299' \
    "$KILN" train models/gpt.lua --steps 2 --set V=300 --set sample_every=1 --set sample_prompt=abc
# SIGINT mid-sample (one sample of 2^24 tokens: past the window of 32 each
# is a prefill; minutes of work): exit 130, a stop message
"$KILN" sample $G --prompt hi --max-new-tokens 16777216 >"$dir/out" 2>"$dir/err" &
pid=$!
# once it samples (its path line), not while it still compiles (a loaded
# machine, the sanitizer build): then the stop message names the samples
for _ in $(seq 600); do
    grep -q '^sample: .*: KV cache' "$dir/err" 2>/dev/null && break
    sleep 0.1
done
sleep 0.5
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "sample stopped by SIGINT: exit $rc, expected 130: $(cat "$dir/err")"
grep -q 'kiln sample: stopped by SIGINT after 0 of 1 samples' "$dir/err" ||
    fail "no stop message: $(cat "$dir/err")"
echo ok
