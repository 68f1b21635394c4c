#!/usr/bin/env bash
# run.sh - the pass tests: every tests/passes/*.ir (or the CASE files given)
# is run through `kiln opt` and its output compared with the expected text
# the case carries; a difference is shown as a diff. See README.md here.
#
#   tests/passes/run.sh [--update] [CASE.ir ...]     (from the source root)
#
# $KILN is the kiln binary (default build/kiln). --update rewrites each
# case's expected text with what kiln opt prints now (review the git diff).
#
# A case: comment lines "# passes: P1,P2,..." (one or more: each list must
# give the expected text) and optionally "# flags: ..." (kiln opt options),
# then the input IR, then a marker line and the expected text up to the end:
#   "# >>> expected"  kiln opt exits 0 and prints exactly this;
#   "# >>> error"     kiln opt exits 1 and its standard error is exactly this.
set -u
KILN=${KILN:-build/kiln}
case $KILN in /*) ;; */*) KILN=$PWD/$KILN ;; esac # kiln opt runs in each case's directory
update=0
if [ "${1:-}" = --update ]; then update=1; shift; fi
dir=$(dirname "$0")
if [ $# -eq 0 ]; then set -- "$dir"/*.ir; fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-passes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

nfail=0 n=0
for case in "$@"; do
    n=$((n + 1))
    marker=$(grep -m1 -E '^# >>> (expected|error)$' "$case")
    lists=$(sed -n 's/^# passes: *//p' "$case")
    flags=$(sed -n 's/^# flags: *//p' "$case" | head -1)
    if [ -z "$marker" ] || [ -z "$lists" ]; then
        echo "FAIL $case: needs a '# passes: ...' line and a '# >>> expected' or '# >>> error' line"
        nfail=$((nfail + 1))
        continue
    fi
    sed -n "/^$marker\$/,\$p" "$case" | tail -n +2 > "$tmp/want"
    ok=1
    for list in $lists; do
        # shellcheck disable=SC2086 # flags split into words on purpose
        # in the case's directory, so that errors name it as CASE.ir
        (cd "$(dirname "$case")" && "$KILN" opt "$(basename "$case")" --passes="$list" $flags) \
            > "$tmp/out" 2> "$tmp/err"
        rc=$?
        if [ "$marker" = "# >>> expected" ]; then
            got="$tmp/out"
            [ $rc -eq 0 ] || { echo "FAIL $case (--passes=$list): exit $rc: $(cat "$tmp/err")"; ok=0; continue; }
        else
            got="$tmp/err"
            [ $rc -eq 1 ] || { echo "FAIL $case (--passes=$list): exit $rc, expected 1 with an error"; ok=0; continue; }
        fi
        if [ $update -eq 1 ]; then
            { sed -n "1,/^$marker\$/p" "$case"; cat "$got"; } > "$tmp/new" && cat "$tmp/new" > "$case"
            cp "$got" "$tmp/want"
        elif ! cmp -s "$tmp/want" "$got"; then
            echo "FAIL $case (--passes=$list $flags):"
            diff -u --label expected --label got "$tmp/want" "$got" | head -60
            ok=0
        fi
    done
    [ $ok -eq 1 ] || nfail=$((nfail + 1))
done
if [ $nfail -gt 0 ]; then
    echo "$nfail of $n pass tests failed (tests/passes/README.md: how to read and regenerate them)"
    exit 1
fi
[ $update -eq 1 ] && echo "updated $n pass tests" || echo "$n pass tests passed"
