#!/bin/bash
# End to end: models/addition.lua (3-digit addition, a small transformer)
# reaches at least 95% exact-match accuracy on held-out problems.
# The default schedule (3000 steps, about 2.5 minutes on 2 cores): shorter
# cosine schedules make the jump to exact answers late and unreliable.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-addition-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$KILN" train models/addition.lua --set log_every=250 --set eval_every=1000 \
    --set eval_batches=16 > "$dir/log" 2>&1 || fail "training failed: $(tail -20 "$dir/log")"
cat "$dir/log" >&2
line=$(grep '^final:' "$dir/log") || fail "no final summary"
acc=$(echo "$line" | sed -n 's/.*accuracy \([0-9.]*\)% (\([0-9]*\)\/\([0-9]*\) held-out).*/\1 \2 \3/p')
[ -n "$acc" ] || fail "no accuracy in: $line"
set -- $acc
[ "$3" -ge 1000 ] || fail "too few held-out problems ($3)"
awk -v a="$1" 'BEGIN { exit !(a >= 95.0) }' || fail "accuracy $1% < 95%"
echo "addition: $1% exact match on $3 held-out problems"
