#!/bin/bash
# The communication thread's priority (runtime/dist/mpi.c, start_comm_thread):
# in each rank of `kiln train --nproc 2`, the thread named kiln-comm runs 5
# nice levels above the rank's main (compute) thread. Where the process may
# raise a thread's priority (root, CAP_SYS_NICE) the comm thread is raised
# and the main thread keeps the level it started at; where it may not, the
# comm thread keeps that level and the main thread is lowered. Both cases
# are run when the test runs as root (the second without CAP_SYS_NICE,
# through setpriv); otherwise the one this user gets.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-comm-prio-XXXXXX")
bg=""
trap '[ -n "$bg" ] && kill "$bg" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 0; }

nice_of() { awk '{ print $19 }' "$1/stat"; } # TASKDIR: its nice (field 19 of stat)

check() { # LABEL WANT_COMM WANT_MAIN CMD...: runs CMD (a kiln train --nproc 2), checks its ranks
    local label=$1 want_comm=$2 want_main=$3; shift 3
    "$@" >"$dir/log" 2>&1 &
    bg=$!
    local ranks="" seen=0
    for _ in $(seq 600); do # up to 30 s (a loaded machine) for both ranks to start their comm threads
        sleep 0.05
        # the ranks: children of mpirun, which the launcher (setpriv execs
        # it) forks; children of the launcher itself, should it exec mpirun
        ranks=$(pgrep -P "$bg" -x kiln; for p in $(pgrep -P "$bg"); do pgrep -P "$p" -x kiln; done)
        seen=0
        for r in $ranks; do
            grep -qx kiln-comm /proc/"$r"/task/*/comm 2>/dev/null && seen=$((seen + 1))
        done
        [ "$seen" -ge 2 ] && break
    done
    [ "$seen" -ge 2 ] || fail "$label: no two ranks with a kiln-comm thread: $(cat "$dir/log")"
    for r in $ranks; do
        local main comm="" t
        main=$(nice_of /proc/"$r")
        for t in /proc/"$r"/task/*; do
            [ "$(cat "$t/comm" 2>/dev/null)" = kiln-comm ] && comm=$(nice_of "$t")
        done
        echo "$label: rank pid $r: main thread nice $main, kiln-comm nice $comm"
        [ "$comm" = "$want_comm" ] && [ "$main" = "$want_main" ] ||
            fail "$label: expected kiln-comm at $want_comm and the main thread at $want_main"
    done
    wait "$bg" || fail "$label: kiln train failed: $(cat "$dir/log")"
    bg=""
    grep -q '^final:' "$dir/log" || fail "$label: no final line: $(cat "$dir/log")"
}

run=("$KILN" train models/mlp.lua --nproc 2 --steps 3000 -q)
base=$(nice)
if [ "$(nice -n -1 nice 2>/dev/null)" -lt "$base" ]; then
    check raised $((base - 5)) "$base" "${run[@]}"
    if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
        check lowered "$base" $((base + 5)) \
            setpriv --bounding-set=-sys_nice --inh-caps=-sys_nice "${run[@]}"
    fi
else
    check lowered "$base" $((base + 5)) "${run[@]}"
fi
echo "PASS"
