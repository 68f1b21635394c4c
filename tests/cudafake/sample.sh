#!/usr/bin/env bash
# sample.sh - kiln sample with --device cuda, the real libkiln_cuda.so on
# the fakes of tests/cudafake, against the CPU backend: greedy decoding of
# gpt.lua and llama.lua through the KV cache (prefill, one-token steps,
# past the window of 32 the prefill per token) gives the tokens that the
# CPU gives by rerunning the full forward, and takes the KV path (its
# step-against-prefill check passed on the device). Skipped (77) without
# the fakes.
set -u
: "${KILN:?KILN must point at the kiln binary}"
: "${FAKE_LIB:?FAKE_LIB must point at the fake libraries}"
[ -e "$FAKE_LIB/libcuda.so.1" ] || { echo "no fake driver in $FAKE_LIB: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cudafake-sample.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cuda() { LD_LIBRARY_PATH="$FAKE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$KILN" "$@" --device cuda; }

for m in gpt llama; do
    "$KILN" train models/$m.lua --steps 30 -q --save-weights "$T/$m.st" > /dev/null 2>&1 ||
        fail "kiln train $m.lua"
    a=(sample models/$m.lua --init-from "$T/$m.st" --prompt "The " --max-new-tokens 36
       --temperature 0 --ids --num-samples 2)
    cpu=$("$KILN" "${a[@]}" --no-kv-cache 2>"$T/cpu.err") || fail "$m cpu: $(cat "$T/cpu.err")"
    gpu=$(cuda "${a[@]}" 2>"$T/gpu.err") || fail "$m cuda: $(cat "$T/gpu.err")"
    grep -qi 'fake.*\(error\|race\|refus\)' "$T/gpu.err" && fail "the fakes complained: $(cat "$T/gpu.err")"
    grep -q "^sample: models/$m.lua: KV cache:" "$T/gpu.err" ||
        fail "$m cuda: not the KV path: $(cat "$T/gpu.err")"
    [ "$cpu" = "$gpu" ] || fail "$m: cuda KV cache differs from the cpu full forward:
$gpu
$cpu"
    echo "$m: cuda KV cache = cpu full forward ($(echo "$gpu" | wc -w) words)"
done
echo ok
