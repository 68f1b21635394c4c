#!/usr/bin/env bash
# signals.sh - SIGINT and SIGTERM stop `kiln train` cleanly: after the
# current step, a "stopped by SIG... at step N" summary line, exit 130 or
# 143, no temp file left in the checkpoint directory or the kernel cache
# (a checkpoint is written every step, so the signal often lands in one).
# The same with --nproc 2: SIGTERM or SIGINT to the launcher (it forwards
# the signal), SIGINT to the process group (Ctrl-C): every rank stops after
# the same step, none is killed mid-write, the launcher names the signal;
# and a rank that crashes is named with its signal. A signal during the kernel
# compile stops when the compile ends. kill -9 during a compile leaves temp
# files in the cache; the next run removes them.
set -u
: "${KILN:?KILN must point at the kiln binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-signals.XXXXXX")
. tests/cli/lib/ranks.sh # rank_pid, alive, launched, kill_launched
trap 'kill_launched; rm -rf "$T"' EXIT
. tests/cli/lib/cases.sh # case_log, for lib/count_cases.sh
fail() {
    case "$*" in
    *"still running"*) case_log signals hang "$*" ;;
    *) case_log signals unclear "$*" ;;
    esac
    echo "FAIL: $*"
    echo "--- output:"
    cat "$T/out" 2> /dev/null
    exit 1
}

wait_for() { # pattern file: up to 120 s
    local i
    for i in $(seq 1200); do
        grep -q "$1" "$2" 2> /dev/null && return 0
        sleep 0.1
    done
    return 1
}

no_temps() { # what, dirs...
    local what=$1
    shift
    local left
    left=$(find "$@" -name '*.tmp*' -o -name 'kiln-*.[0-9]*.[co]' 2> /dev/null)
    [ -z "$left" ] || fail "$what: temp files left: $left"
}

# waits for background job $1 to exit (up to 60 s, else kill -9 and fail);
# sets rc to its exit status
wait_exit() {
    local i
    for i in $(seq 600); do
        alive "$1" || break
        sleep 0.1
    done
    if alive "$1"; then
        kill -KILL "$1"
        wait "$1"
        fail "$2: still running 60 s after the signal"
    fi
    wait "$1"
    rc=$?
}


# stop SIG CODE [extra args]: one process, signalled after its third step
stop() {
    local sig=$1 code=$2
    shift 2
    rm -rf "$T/ck" && mkdir "$T/ck"
    rm -f "$T/out" # wait_for must not see the last case's output
    "$KILN" train models/mlp.lua --steps 100000000 --set log_every=1 --set checkpoint_every=1 \
        --checkpoint "$T/ck/run" --cache-dir "$T/cache" "$@" > "$T/out" 2>&1 &
    local pid=$!
    wait_for "step  *3/" "$T/out" || fail "$sig: training did not start"
    kill "-$sig" "$pid"
    wait_exit "$pid" "$sig"
    [ "$rc" -eq "$code" ] || fail "$sig: exit $rc, expected $code"
    grep -q "stopped by SIG$sig at step [0-9]*/100000000: train loss [0-9.]* | median" "$T/out" ||
        fail "$sig: no summary line"
    no_temps "$sig" "$T/ck" "$T/cache"
    # the last checkpoint it names is whole: it resumes
    local ck
    ck=$(sed -n 's/.*last checkpoint \([^ ]*\).*/\1/p' "$T/out")
    [ -f "$ck" ] || fail "$sig: the last checkpoint '$ck' is missing"
    "$KILN" train models/mlp.lua --steps 1000000000 --resume "$ck" --cache-dir "$T/cache" \
        --steps "$(($(sed 's/.*step\([0-9]*\)\.safetensors/\1/' <<< "$ck") + 1))" -q \
        > "$T/resume.log" 2>&1 || { cat "$T/resume.log"; fail "$sig: cannot resume from $ck"; }
    echo "$sig: exit $rc; $(grep -o 'stopped by.*' "$T/out" | cut -c1-80)"
    case_log signals clear "SIG$sig to one process: exit $rc, summary, no temp file, resumes"
}

stop INT 130
stop TERM 143

# stop_nproc SIG CODE launcher|group: --nproc 2 with checkpoints of 25 MB
# (rank 0 is still writing one when rank 1 has stopped), the signal to the
# launcher (it forwards it) or to the whole process group as Ctrl-C sends
# it (the launcher, mpirun and both ranks get it). Every rank stops after
# the same step, rank 0 prints its summary (mpirun did not end the job
# early: no "mpirun detected" banner), the launcher names the signal.
stop_nproc() {
    local sig=$1 code=$2 how=$3 what="nproc 2, SIG$1 to the $3"
    rm -rf "$T/ck" && mkdir "$T/ck"
    rm -f "$T/out" # wait_for must not see the last case's output
    setsid "$KILN" train models/mlp.lua --steps 100000000 --nproc 2 --set hidden=1024 \
        --set depth=3 --set log_every=1 --set checkpoint_every=1 --checkpoint "$T/ck/run" \
        --cache-dir "$T/cache" > "$T/out" 2>&1 &
    L=$!
    launched "$L"
    wait_for "checkpoint: .*step2\." "$T/out" || fail "$what: training did not start"
    M=$(pgrep -P "$L" mpirun)
    [ -n "$M" ] || fail "$what: no mpirun under the launcher"
    R0=$(rank_pid "$M" 0)
    R1=$(rank_pid "$M" 1)
    [ -n "$R0" ] && [ -n "$R1" ] || fail "$what: ranks not found under mpirun $M"
    if [ "$how" = group ]; then kill "-$sig" -- "-$L"; else kill "-$sig" "$L"; fi
    wait_exit "$L" "$what"
    [ "$rc" -eq "$code" ] || fail "$what: exit $rc, expected $code"
    grep -q "stopped by SIG$sig at step [0-9]*/100000000: train loss" "$T/out" ||
        fail "$what: no summary line from rank 0"
    grep -q "kiln: stopped by SIG$sig; every rank stopped cleanly" "$T/out" ||
        fail "$what: the launcher does not name the signal"
    grep -q "another rank failed\|lost rank\|mpirun detected\|exiting improperly" "$T/out" &&
        fail "$what: a rank is said to have failed"
    no_temps "$what" "$T/ck" "$T/cache"
    sleep 0.5
    for p in "$M" "$R0" "$R1"; do
        alive "$p" && fail "$what: process $p is still running"
    done
    echo "$what: exit $rc; $(grep -o "kiln: stopped by SIG$sig;.*" "$T/out")"
    case_log signals clear "$what: exit $rc, every rank stopped, none left running"
}
stop_nproc TERM 143 launcher
stop_nproc INT 130 launcher
stop_nproc INT 130 group

# a rank that crashes is named with its signal
rm -f "$T/out" # wait_for must not see the last case's output
"$KILN" train models/mlp.lua --steps 100000000 --nproc 2 --set log_every=1 \
    --cache-dir "$T/cache" > "$T/out" 2>&1 &
L=$!
launched "$L"
wait_for "step  *3/" "$T/out" || fail "crash: training did not start"
M=$(pgrep -P "$L" mpirun)
R1=$(rank_pid "$M" 1)
[ -n "$R1" ] || fail "crash: rank 1 not found"
kill -SEGV "$R1"
wait_exit "$L" "crash"
[ "$rc" -ne 0 ] || fail "crash: exit 0"
grep -q "lost rank 1: it was killed by SIGSEGV" "$T/out" || fail "crash: rank 1's signal not named"
echo "rank 1 SIGSEGV: exit $rc; $(grep -o 'lost rank 1.*' "$T/out")"
case_log signals clear "rank 1 of 2 killed by SIGSEGV: named with its signal"

# SIGINT during the kernel compile (fresh cache): stops when it ends
GPT=(models/gpt.lua --set L=1 --set C=16 --set T=8 --set batch=2)
rm -rf "$T/cache2"
rm -f "$T/out" # wait_for must not see the last case's output
"$KILN" train "${GPT[@]}" --steps 100000000 --cache-dir "$T/cache2" > "$T/out" 2>&1 &
pid=$!
launched "$pid"
for i in $(seq 1200); do
    ls "$T/cache2" 2> /dev/null | grep -q '\.[0-9]*\.c$\|\.[0-9]*\.0\.c$' && break
    sleep 0.01
done
kill -INT "$pid"
wait_exit "$pid" "compile INT"
[ "$rc" -eq 130 ] || fail "compile INT: exit $rc, expected 130"
grep -q "stopped by SIGINT" "$T/out" || fail "compile INT: no message"
no_temps "compile INT" "$T/cache2"
echo "SIGINT while compiling: exit $rc; $(grep -o 'stopped by SIGINT.*' "$T/out" | head -1)"
case_log signals clear "SIGINT during the kernel compile: exit $rc, nothing left in the cache"

# kill -9 of the whole process group during the compile: temp files stay,
# the next run removes them (their writer is gone) and succeeds
rm -rf "$T/cache3"
setsid "$KILN" train "${GPT[@]}" --steps 1 --cache-dir "$T/cache3" > "$T/out" 2>&1 &
pid=$!
launched "$pid"
found=
for i in $(seq 3000); do
    if ls "$T/cache3" 2> /dev/null | grep -q '\.[0-9]*\.c$\|\.[0-9]*\.0\.c$'; then
        found=1
        break
    fi
    sleep 0.01
done
[ -n "$found" ] || fail "kill -9: no compile seen"
kill -KILL -- "-$pid"
wait "$pid" 2> /dev/null
for i in $(seq 100); do # the group's compilers are gone too
    pgrep -g "$pid" > /dev/null || break
    sleep 0.1
done
left=$(find "$T/cache3" -name '*.tmp*' -o -name 'kiln-*.[0-9]*.[co]' | wc -l)
[ "$left" -gt 0 ] || fail "kill -9: no temp file to clean up (the test saw nothing)"
"$KILN" train "${GPT[@]}" --steps 1 -q --cache-dir "$T/cache3" > "$T/out" 2>&1 ||
    fail "kill -9: the rerun failed"
no_temps "kill -9 rerun" "$T/cache3"
echo "kill -9 while compiling: $left temp files, none after the rerun"
case_log signals clear "kill -9 during the compile: the next run removes the temp files"
echo "ok"
