#!/bin/bash
# The gradient of max/min over tied elements is split evenly (issue 13, item
# 12): training tests/data/max_ties.lua moves w the way the true gradient
# says (max: w rises above 1; min: w falls below 1), read back from the
# weights file (w is its only tensor: its last 4 bytes, an f32).
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-ties-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

final_w() { # min -> prints w after 10 steps
    "$KILN" train tests/data/max_ties.lua --set min="$1" --save-weights "$dir/w$1.safetensors" \
        > "$dir/log$1" 2>&1 || fail "training (min=$1) failed: $(cat "$dir/log$1")"
    tail -c 4 "$dir/w$1.safetensors" | od -An -tf4 | tr -d ' '
}

w=$(final_w 0)
awk -v w="$w" 'BEGIN { exit !(w > 1.2) }' || fail "max: w is $w after 10 steps (expected > 1.2: it must rise from 1)"
w=$(final_w 1)
awk -v w="$w" 'BEGIN { exit !(w < 0.8) }' || fail "min: w is $w after 10 steps (expected < 0.8: it must fall from 1)"
echo "max/min ties ok"
