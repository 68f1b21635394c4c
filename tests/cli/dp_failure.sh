#!/usr/bin/env bash
# dp_failure.sh - a lost rank stops the others, with a message naming it,
# within the bound; nothing is left running. Two ways to lose rank 1 of 2
# mid-run: it is killed (SIGKILL: mpirun notices at once), and it hangs
# (SIGSTOP: the survivor's collective times out after comm_timeout; the
# launcher says it stopped answering and was killed, and none of Open MPI's
# abort notice shows). Then the launcher against an mpirun that never ends
# the job (a stand-in on PATH): it still exits by itself, kills the rank
# left, and drops the ORTE_ERROR_LOG lines, saying so.
set -u
: "${KILN:?KILN must point at the kiln binary}"
OUT=/dev/null
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-dp-failure.XXXXXX")
. tests/cli/lib/ranks.sh # rank_pid, alive, launched, kill_launched
trap 'kill_launched; rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    echo "--- output:"
    cat "$OUT"
    exit 1
}


lose_rank() { # signal, bound in seconds, extra args
    local sig=$1 bound=$2
    shift 2
    # one output file per run: nothing the earlier run left behind (a
    # late write, the shell's report of its end) can be read as this one's
    OUT="$T/out.$sig"
    "$KILN" train models/mlp.lua --steps 100000000 --nproc 2 --set log_every=1 "$@" \
        >"$OUT" 2>&1 &
    local L=$! M="" R0="" R1="" i
    launched "$L"
    for i in $(seq 1200); do
        grep -q "step  *3/" "$OUT" && break
        sleep 0.1
    done
    grep -q "step  *3/" "$OUT" || fail "$sig: training did not start"
    M=$(pgrep -P "$L" mpirun)
    [ -n "$M" ] || fail "$sig: no mpirun under the launcher"
    R0=$(rank_pid "$M" 0)
    R1=$(rank_pid "$M" 1)
    [ -n "$R0" ] && [ -n "$R1" ] || fail "$sig: ranks not found under mpirun $M"
    local t0 t1 rc
    t0=$(date +%s.%N)
    kill "-$sig" "$R1"
    wait "$L"
    rc=$?
    t1=$(date +%s.%N)
    local dt
    dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}')
    echo "$sig: exit $rc after ${dt} s"
    [ "$rc" -ne 0 ] || fail "$sig: exit status 0 after losing a rank"
    grep -q "lost rank 1" "$OUT" || fail "$sig: no message naming rank 1"
    awk -v d="$dt" -v b="$bound" 'BEGIN{exit !(d < b)}' || fail "$sig: took ${dt} s (bound $bound s)"
    # gone within 5 s of the launcher's exit (a busy machine can take more
    # than the 0.5 s this waited before for mpirun to reap a stopped rank)
    for i in "$M" "$R0" "$R1"; do
        for _ in $(seq 50); do alive "$i" || break; sleep 0.1; done
        alive "$i" && fail "$sig: process $i is still running 5 s after the launcher exited"
    done
    # the messages
    grep "lost rank" "$OUT"
}

lose_rank KILL 15
# hang: comm_timeout=3 s, plus up to 2 s to ask the other ranks, plus slack
lose_rank STOP 15 --set comm_timeout=3
grep -q "comm_timeout=3" "$T/out.STOP" || fail "STOP: the message does not state the bound"
OUT="$T/out.STOP"
grep -q "kiln: lost rank 1: it stopped answering.*it was killed" "$OUT" ||
    fail "STOP: the launcher does not say that rank 1 stopped answering and was killed"
grep -q "MPI_ABORT\|ORTE_ERROR_LOG" "$OUT" && fail "STOP: Open MPI's abort notice shows"
grep -q "stopped by mpirun" "$OUT" && fail "STOP: a rank blames another rank's failure for its end"

# an mpirun that leaves the job hanging after rank 0 reported rank 1 lost
mkdir "$T/bin"
cat > "$T/bin/mpirun" <<'EOS'
#!/usr/bin/env bash
sleep 300 &
echo "running $!" > "$KILN_RANK_STATUS_DIR/rank1"
echo "$!" > "$KILN_RANK_STATUS_DIR/../fake-rank1"
echo "lost 1" > "$KILN_RANK_STATUS_DIR/rank0"
echo "kiln: rank 0: lost rank 1 (a stand-in)" >&2
echo "[host:00042] [[1,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer in file grpcomm_direct.c at line 355" >&2
exec sleep 300
EOS
chmod +x "$T/bin/mpirun"
OUT="$T/out.fake"
t0=$(date +%s)
TMPDIR="$T" PATH="$T/bin:$PATH" timeout 60 "$KILN" train models/mlp.lua --nproc 2 >"$OUT" 2>&1
rc=$?
dt=$(($(date +%s) - t0))
echo "mpirun that never ends: exit $rc after $dt s"
[ "$rc" -ne 124 ] || fail "fake: the launcher did not exit by itself (60 s)"
[ "$rc" -eq 1 ] || fail "fake: exit status $rc (expected 1)"
[ "$dt" -le 30 ] || fail "fake: took $dt s"
grep -q "lost rank 1 (a stand-in)" "$OUT" || fail "fake: mpirun's stderr was not relayed"
grep -q "did not end the job" "$OUT" || fail "fake: no message that the launcher ended the job"
grep -q "ORTE_ERROR_LOG:" "$OUT" && fail "fake: the ORTE_ERROR_LOG line shows"
grep -q "left out 1 line of Open MPI" "$OUT" || fail "fake: no word of the line left out"
R1=$(cat "$T/fake-rank1")
for _ in $(seq 50); do alive "$R1" || break; sleep 0.1; done
alive "$R1" && fail "fake: the hung rank $R1 still runs"
echo "ok"
