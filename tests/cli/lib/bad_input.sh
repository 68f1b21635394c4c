# Shared by the bad-input CLI tests (tests/cli/bad_*.sh): source it after
# `set -u` and `: "${KILN:?}"`. It makes a scratch directory $dir (removed at
# exit) and counts the cases each test checks.
#
#   expect_error [-s STATUS] [-t SECONDS] PATTERN... -- COMMAND...
#
# runs COMMAND under a time limit (default 120 s) and fails the test unless
# it exits with STATUS (default 1: a mistake in the model, its data or its
# files; 2 is a bad command line), was not stopped by a signal, did not hang,
# printed no internal error or sanitizer report, left no temp file
# (*.tmp.*) in $dir, and printed every PATTERN (fixed strings).
# `bad_input_done` ends the test with a line giving the number of cases;
# `case_recovered WHAT` counts a case that checks a recovery (a fault the
# run survives) rather than an error. Each case's outcome goes to
# $KILN_CASES_LOG when set (lib/cases.sh, for lib/count_cases.sh).
. tests/cli/lib/cases.sh
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bad-XXXXXX")
trap 'rm -rf "$dir"' EXIT
bad_cases=0
case_test=$(basename "$0" .sh)
fail() { echo "FAIL: $*"; exit 1; }
case_recovered() {
    bad_cases=$((bad_cases + 1))
    case_log "$case_test" clear "$*"
}

expect_error() {
    local want=1 limit=120 pats=() rc
    while :; do
        case "$1" in
        -s) want=$2; shift 2 ;;
        -t) limit=$2; shift 2 ;;
        *) break ;;
        esac
    done
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    bad_cases=$((bad_cases + 1))
    timeout -s KILL "$limit" "$@" > "$dir/err.log" 2>&1 < /dev/null
    rc=$?
    local outcome=clear why=''
    if [ "$rc" -eq 137 ]; then
        outcome=hang why="hang or signal 9 (over ${limit} s): $*"
    elif [ "$rc" -gt 128 ]; then
        outcome=crash why="signal $((rc - 128)): $* ($(tail -5 "$dir/err.log"))"
    elif grep -q "internal error\|Sanitizer\|runtime error:" "$dir/err.log"; then
        outcome=crash why="crash report: $* ($(cat "$dir/err.log"))"
    elif [ "$rc" -ne "$want" ]; then
        outcome=unclear
        [ "$rc" -eq 0 ] && outcome=accepted
        why="exit $rc, expected $want: $* ($(tail -5 "$dir/err.log"))"
    elif find "$dir" -name '*.tmp.*' | grep -q .; then
        outcome=unclear why="a temp file was left behind: $*"
    else
        for p in "${pats[@]}"; do
            grep -qF -- "$p" "$dir/err.log" && continue
            outcome=unclear why="message lacks '$p': $* ($(cat "$dir/err.log"))"
            break
        done
    fi
    case_log "$case_test" "$outcome" "${*#"$KILN" }"
    [ "$outcome" = clear ] || fail "$why"
    return 0
}

bad_input_done() { echo "$(basename "$0" .sh): $bad_cases bad-input cases ok"; }
