#!/bin/bash
# --log-dir DIR (issue 42): kiln train and kiln compile create DIR and its
# missing parents (mkdir -p), and check DIR before compiling: a DIR that
# cannot be a directory fails at once, with nothing compiled or printed on
# stdout (the compile's summary, the train's MFU line come after the
# compile), and exit 1.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-logdir-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$KILN" train models/mlp.lua --steps 2 -q --log-dir "$dir/a/b/c" > "$dir/t.log" 2>&1 ||
    fail "train with missing parents: $(tail -3 "$dir/t.log")"
for f in metrics.jsonl eval.jsonl report.html; do
    [ -s "$dir/a/b/c/$f" ] || fail "train: no $dir/a/b/c/$f"
done
"$KILN" compile models/mlp.lua --log-dir "$dir/x/y" > "$dir/c.log" 2>&1 ||
    fail "compile with missing parents: $(tail -3 "$dir/c.log")"
[ -s "$dir/x/y/report.html" ] || fail "compile: no $dir/x/y/report.html"

# a regular file on the path: an error before compiling
: > "$dir/file"
for cmd in "train --steps 2" compile; do
    for ld in "$dir/file" "$dir/file/sub"; do
        "$KILN" $cmd models/mlp.lua --log-dir "$ld" > "$dir/out" 2> "$dir/err"
        rc=$?
        [ $rc = 1 ] || fail "$cmd --log-dir $ld: exit $rc (expected 1)"
        grep -q -- "--log-dir $ld: " "$dir/err" || fail "$cmd --log-dir $ld: $(cat "$dir/err")"
        [ ! -s "$dir/out" ] || fail "$cmd --log-dir $ld: compiled first: $(head -3 "$dir/out")"
    done
done
grep -q "cannot create the directory: $dir/file is a regular file" "$dir/err" ||
    fail "message: $(cat "$dir/err")"
"$KILN" compile models/mlp.lua --log-dir "$dir/file" 2>&1 >/dev/null |
    grep -q 'not a directory (expected a directory, got a regular file)' ||
    fail "message for $dir/file"
echo "ok"
