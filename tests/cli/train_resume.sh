#!/bin/bash
# Determinism and exact resume: the same seed gives bit-identical losses and
# params; 2N steps straight equal N steps + --resume + N steps, bit for bit
# (params, optimizer state, data position). Runs the MLP (blobs) and a tiny
# addition transformer.
set -eu
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-resume-XXXXXX")
trap 'rm -rf "$dir"' EXIT

check() { # name model args...
    local name=$1 model=$2
    shift 2
    # 2N straight, with a checkpoint after N
    "$KILN" train "$model" --steps 20 "$@" --set log_every=1 --set checkpoint_every=10 \
        --checkpoint "$dir/$name" --save-weights "$dir/$name.straight.safetensors" \
        > "$dir/$name.straight.log"
    test -f "$dir/$name.step10.safetensors"
    # the same run again: identical step lines up to timing
    "$KILN" train "$model" --steps 20 "$@" --set log_every=1 \
        --save-weights "$dir/$name.again.safetensors" > "$dir/$name.again.log"
    cmp "$dir/$name.straight.safetensors" "$dir/$name.again.safetensors"
    diff <(grep -o 'step .*| loss [^|]*' "$dir/$name.straight.log") \
         <(grep -o 'step .*| loss [^|]*' "$dir/$name.again.log")
    # N + resume + N
    "$KILN" train "$model" --steps 20 "$@" --set log_every=1 \
        --resume "$dir/$name.step10.safetensors" \
        --save-weights "$dir/$name.resumed.safetensors" > "$dir/$name.resumed.log"
    grep -q 'resumed from .* at step 10' "$dir/$name.resumed.log"
    cmp "$dir/$name.straight.safetensors" "$dir/$name.resumed.safetensors"
    # the resumed run's steps 11..20 have the straight run's losses
    diff <(grep -o 'step  *1[1-9]/.*| loss [^|]*\|step  *20/.*| loss [^|]*' "$dir/$name.straight.log") \
         <(grep -o 'step  *1[1-9]/.*| loss [^|]*\|step  *20/.*| loss [^|]*' "$dir/$name.resumed.log")
    # a different seed gives different params
    "$KILN" train "$model" --steps 20 "$@" --set seed=7 \
        --save-weights "$dir/$name.seed7.safetensors" > /dev/null
    ! cmp -s "$dir/$name.straight.safetensors" "$dir/$name.seed7.safetensors"
    echo "$name: resume and determinism ok"
}

check mlp models/mlp.lua
check addition models/addition.lua --set L=1 --set C=32 --set H=2 --set batch=8 --set digits=2
