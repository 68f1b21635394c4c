#!/usr/bin/env bash
# count_cases.sh - the table issue 13 (item 16) asks for: over the bad-input
# CLI tests (tests/cli/bad_*.sh), diverge.sh, signals.sh and the fuzz seed
# corpora, how many cases were tried and how each ended: a clear error (or a
# clean stop, or a recovered fault), a crash, a hang, silently accepted, or
# an error that is not clear (wrong status or message, a temp file left).
#
#   KILN=build/kiln tests/cli/lib/count_cases.sh [BUILD_DIR]
#
# Also train_bad_data.sh and train_weights.sh (they use the same
# expect_error). Run from the source root (BUILD_DIR defaults to the directory of $KILN).
# It runs each test with KILN_CASES_LOG set (lib/cases.sh: every case logs
# its outcome), so the counts are what ran, not what the files say; a test
# stops at its first failure, so a failed test's row counts only the cases
# up to it (the test's status says so). Each fuzz corpus file is replayed
# alone (its fuzz_NAME_replay, 60 s limit): a crash or a hang is counted
# as such, anything else as handled; the Lua corpus's bad_*.lua scripts are
# also compiled by kiln, where a clear error is exit 1 with a message that
# names the script. Takes a few minutes; prints the table and the cases
# that did not end clearly.
set -u
: "${KILN:?KILN must point at the kiln binary}"
BUILD=${1:-$(dirname "$KILN")}
[ -d tests/cli ] || { echo "count_cases.sh: run it from the source root"; exit 2; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-count.XXXXXX")
trap 'rm -rf "$T"' EXIT
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$T/cache}
log=$T/cases.tsv
: > "$log"
status=()

for t in tests/cli/bad_*.sh tests/cli/train_bad_data.sh tests/cli/train_weights.sh \
    tests/cli/diverge.sh tests/cli/signals.sh; do
    name=$(basename "$t" .sh)
    if KILN_CASES_LOG=$log bash "$t" > "$T/$name.out" 2>&1; then
        status+=("$name: passed")
    else
        status+=("$name: FAILED ($(grep -m1 FAIL "$T/$name.out" | cut -c1-160))")
    fi
done

# outcome RC OUT [NAMES]: hang, crash, or (RC 0) clear; with NAMES (a
# string a clear error names), clear only for exit 1 naming it, accepted
# for exit 0
outcome() {
    if [ "$1" -eq 137 ]; then
        echo hang
    elif [ "$1" -gt 128 ] || grep -q "internal error\|Sanitizer\|runtime error:" "$2"; then
        echo crash
    elif [ $# -lt 3 ]; then
        if [ "$1" -eq 0 ]; then echo clear; else echo unclear; fi
    elif [ "$1" -eq 0 ]; then
        echo accepted
    elif [ "$1" -eq 1 ] && grep -qF -- "$3" "$2"; then
        echo clear
    else
        echo unclear
    fi
}

# fuzz corpora: one replay per file; bad Lua scripts through kiln compile
for d in tests/fuzz/corpus/*/; do
    name=$(basename "$d")
    replay=$BUILD/tests/fuzz/fuzz_${name}_replay
    if [ ! -x "$replay" ]; then
        status+=("corpus/$name: not run (no $replay)")
        continue
    fi
    for f in "$d"*; do
        timeout -s KILL 60 "$replay" "$f" > "$T/replay.out" 2>&1
        rc=$?
        printf 'corpus/%s (replay)\t%s\t%s\n' "$name" "$(outcome $rc "$T/replay.out")" "$f" \
            >> "$log"
        case "$name/$(basename "$f")" in
        lua/bad_*.lua)
            timeout -s KILL 60 "$KILN" compile "$f" > "$T/compile.out" 2>&1 < /dev/null
            rc=$?
            printf 'kiln compile corpus/lua/bad_*\t%s\t%s: %s\n' \
                "$(outcome $rc "$T/compile.out" "$f:")" "$f" \
                "$(head -1 "$T/compile.out" | cut -c1-200)" >> "$log"
            ;;
        esac
    done
done

echo "cases by surface (clear: a clear error, a clean stop or a recovered fault;"
echo "for a corpus replay: no crash and no hang)"
awk -F'\t' '
    { n[$1]++; c[$1, $2]++; tot[$2]++; all++; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
    END {
        printf "%-32s %6s %6s %6s %6s %9s %8s\n", "surface", "tried", "clear", "crash", "hang", "accepted", "unclear"
        for (i = 1; i <= k; i++) {
            s = order[i]
            printf "%-32s %6d %6d %6d %6d %9d %8d\n", s, n[s], c[s, "clear"], c[s, "crash"], \
                c[s, "hang"], c[s, "accepted"], c[s, "unclear"]
        }
        printf "%-32s %6d %6d %6d %6d %9d %8d\n", "total", all, tot["clear"], tot["crash"], \
            tot["hang"], tot["accepted"], tot["unclear"]
    }' "$log"
echo
echo "tests:"
printf '  %s\n' "${status[@]}"
if awk -F'\t' '$2 != "clear"' "$log" | grep -q .; then
    echo
    echo "cases that did not end clearly:"
    awk -F'\t' '$2 != "clear" { printf "  %s: %s: %s\n", $1, $2, $3 }' "$log"
fi
