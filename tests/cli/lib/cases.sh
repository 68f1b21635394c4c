# Case outcomes for tests/cli/lib/count_cases.sh. With KILN_CASES_LOG=FILE
# set, `case_log TEST OUTCOME WHAT` appends "TEST<TAB>OUTCOME<TAB>WHAT" to
# FILE; without it, it does nothing. OUTCOME is one of
#   clear     a clear error (the expected status, the message, nothing left
#             behind), a clean stop (signals), or a fault recovered from
#   crash     a signal or a sanitizer / internal-error report
#   hang      over its time limit
#   accepted  exit 0 where an error was expected (silently accepted)
#   unclear   an error, but the wrong status or message, or a temp file left
case_log() {
    [ -n "${KILN_CASES_LOG:-}" ] || return 0
    printf '%s\t%s\t%s\n' "$1" "$2" "$(printf '%s' "$3" | tr '\t\n' '  ' | cut -c1-300)" \
        >> "$KILN_CASES_LOG"
}
