#!/bin/bash
# End to end: gpt.lua (tiny) trained on a text file (byte level) drives the
# validation loss well below the unigram entropy of the text (in nats): at
# least 0.5 nats below, i.e. it learned more than byte frequencies.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-gpttext-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
text=tests/data/tiny.txt

# unigram entropy of the bytes of the text, in nats
H=$(od -An -tu1 -v "$text" | tr -s ' ' '\n' | grep -v '^$' | sort -n | uniq -c |
    awk '{ c[$2] = $1; n += $1 } END { for (k in c) { p = c[k] / n; h -= p * log(p) }; printf "%.4f", h }')
[ -n "$H" ] || fail "could not compute the unigram entropy"

"$KILN" train models/gpt.lua --set data_path="$text" --set eval_every=500 -q \
    > "$dir/log" 2>&1 || fail "training failed: $(tail -20 "$dir/log")"
cat "$dir/log" >&2
val=$(sed -n 's/^final:.*val loss \([0-9.]*\).*/\1/p' "$dir/log")
[ -n "$val" ] || fail "no validation loss in the summary"
echo "gpt tiny on $text: val loss $val nats, unigram entropy $H nats"
awk -v v="$val" -v h="$H" 'BEGIN { exit !(v < h - 0.5) }' || fail "val loss $val is not well below the unigram entropy $H"
