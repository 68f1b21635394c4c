#!/usr/bin/env bash
# dp_report.sh - what data-parallel training shows: the comm dump of
# `kiln compile --nproc 2` (buckets, start and wait points), the end-of-run
# line (communication, exposed, overlap), one trace per rank with a compute
# and a communication track, and the per-rank settings' checks.
set -u
: "${KILN:?KILN must point at the kiln binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-dp-report.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    [ -f "$T/out" ] && cat "$T/out"
    exit 1
}

# the dump: three layers, small buckets -> three buckets, the first starting
# before backward ends
"$KILN" compile models/mlp.lua --nproc 2 --dump-after=comm --set bucket_mb=0.001 >"$T/out" 2>&1 ||
    fail "compile --nproc 2"
grep -q "^> After comm:" "$T/out" || fail "no comm dump header"
[ "$(grep -c ' = allreduce_start ' "$T/out")" -eq 3 ] || fail "expected 3 allreduce_start ops"
[ "$(grep -c ' = allreduce_wait ' "$T/out")" -eq 6 ] || fail "expected 6 allreduce_wait ops"
grep -q "^# comm: 3 buckets; backward ends at op " "$T/out" || fail "no bucket summary"
end=$(sed -n 's/^# comm: .* backward ends at op \([0-9]*\)$/\1/p' "$T/out")
first=$(sed -n 's/^#   .* start: op \([0-9]*\) .*/\1/p' "$T/out" | head -1)
[ -n "$end" ] && [ -n "$first" ] && [ "$first" -lt "$end" ] ||
    fail "first bucket starts at op $first, not before backward ends at op $end"
"$KILN" compile models/mlp.lua --nproc 2 --no-overlap --dump-after=comm \
    --set bucket_mb=0.001 >"$T/out" 2>&1 || fail "compile --no-overlap"
end=$(sed -n 's/^# comm: .* backward ends at op \([0-9]*\)$/\1/p' "$T/out")
for s in $(sed -n 's/^#   .* start: op \([0-9]*\) .*/\1/p' "$T/out"); do
    [ "$s" -gt "$end" ] || fail "--no-overlap: a start at op $s, before backward ends at op $end"
done
# one rank: no collectives
"$KILN" compile models/mlp.lua --dump-after=comm >"$T/out" 2>&1 || fail "compile"
grep -q "allreduce_start" "$T/out" && fail "one rank got collectives"

# training: the summary line and a trace per rank
"$KILN" train models/mlp.lua --nproc 2 --steps 4 --set bucket_mb=0.01 \
    --trace "$T/tr.json" >"$T/out" 2>&1 || fail "train --nproc 2"
grep -Eq "^comm: 2 ranks x 1 micro-batch \| per step \(median of 4, rank 0\): communication [0-9.]+ ms \| exposed [0-9.]+ ms \| overlap [0-9.]+% \| mean exposed [0-9.]+ ms$" "$T/out" ||
    fail "no comm summary line"
[ "$(grep -c '^final:' "$T/out")" -eq 1 ] || fail "expected one final line (rank 0 only)"
# every rank's exposed time; rank 0's is the summary line's
grep -Eq '^comm by rank \(exposed per step, median / mean\): rank 0 [0-9.]+ / [0-9.]+ ms \| rank 1 [0-9.]+ / [0-9.]+ ms$' "$T/out" ||
    fail "no per-rank line: $(grep '^comm' "$T/out")"
awk '/^comm: / { for (i = 1; i <= NF; i++) { if ($i == "exposed" && $(i - 1) == "|") e = $(i + 1);
                                                 if ($i == "mean") m = $(i + 2) } }
     /^comm by rank/ { r = $12; a = $14 }
     END { d1 = e - r; d2 = m - a; exit !(e != "" && r != "" && d1 * d1 < 1e-4 && d2 * d2 < 1e-4) }' "$T/out" ||
    fail "rank 0's per-rank figures are not the summary line's: $(grep '^comm' "$T/out")"
# several ranks: each step line projects the end of the run's own steps
grep -Eq '^step +[0-9]+/4 \|.* \| ends [0-9]{2}:[0-9]{2} UTC \(in [0-9]+m[0-9]{2}s\)$' "$T/out" ||
    fail "no projected end on the step lines: $(grep '^step' "$T/out" | head -2)"
for f in "$T/tr.json" "$T/tr.rank1.json"; do
    [ -f "$f" ] || fail "no trace $f"
    grep -q '"name":"allreduce bucket 0","cat":"comm"' "$f" || fail "$f: no comm events"
    grep -q '"cat":"comm","ph":"X","ts":[0-9.]*,"dur":[0-9.]*,"pid":1,"tid":2' "$f" ||
        fail "$f: no communication track"
    grep -q '"cat":"gemm","ph":"X".*"tid":1' "$f" || fail "$f: no compute track"
done

# bad settings are messages, not crashes
"$KILN" train models/mlp.lua --steps 1 --set grad_accum=0 >"$T/out" 2>&1 &&
    fail "grad_accum=0 accepted"
grep -q "grad_accum: expected an integer from 1 to 1024, got 0" "$T/out" ||
    fail "no grad_accum message"
"$KILN" train models/mlp.lua --nproc 0 >"$T/out" 2>&1 && fail "--nproc 0 accepted"
grep -q -- "--nproc: expected an integer from 1 to 1024, got 0" "$T/out" ||
    fail "no --nproc message"
echo ok
