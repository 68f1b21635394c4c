#!/bin/bash
# --threads changes no result bit: for gpt, llama, mlp and addition, a short
# run with 1, 2 and 3 threads (3 splits kernels and GEMMs unevenly) prints the
# same step losses and final train/val losses, and --save-weights writes
# byte-identical files (docs/training.md, "Determinism").
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-threads-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for m in gpt llama mlp addition; do
    for t in 1 2 3; do
        "$KILN" train models/$m.lua --steps 10 --threads $t --set log_every=1 \
            --save-weights "$dir/$m.$t.safetensors" > "$dir/$m.$t.log" 2>&1 ||
            fail "$m --threads $t failed: $(cat "$dir/$m.$t.log")"
        # the loss column of every step, and the final losses (more digits)
        grep -o '| loss [^ ]*\|train loss [^ ]*\|val loss [^ ]*' "$dir/$m.$t.log" \
            > "$dir/$m.$t.loss"
        [ "$(grep -c '| loss' "$dir/$m.$t.loss")" -ge 10 ] ||
            fail "$m --threads $t: fewer than 10 step losses in: $(cat "$dir/$m.$t.log")"
        grep -q 'val loss' "$dir/$m.$t.loss" ||
            fail "$m --threads $t: no final val loss in: $(cat "$dir/$m.$t.log")"
    done
    for t in 2 3; do
        diff "$dir/$m.1.loss" "$dir/$m.$t.loss" > "$dir/diff" ||
            fail "$m: losses with --threads $t differ from --threads 1: $(cat "$dir/diff")"
        cmp "$dir/$m.1.safetensors" "$dir/$m.$t.safetensors" ||
            fail "$m: weights with --threads $t differ from --threads 1"
    done
    echo "$m: --threads 1, 2, 3 bit-identical"
done
