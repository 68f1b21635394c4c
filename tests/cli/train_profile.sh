#!/bin/bash
# Reporting: step lines with MFU against the stated peak (or the CPU's measured one), peak
# memory, the final summary, the --profile per-kernel table and a --trace
# file in Chrome's trace-event JSON.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-profile-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$KILN" train models/mlp.lua --steps 6 --set log_every=1 > "$dir/plain.log" 2>&1 ||
    fail "train failed: $(cat "$dir/plain.log")"
[ "$(grep -c '^step ' "$dir/plain.log")" = 6 ] || fail "expected 6 step lines: $(cat "$dir/plain.log")"
# no --peak-gflops: MFU against this CPU's measured FMA peak, named once
grep -Eq '^MFU against [0-9]+ GFLOP/s: the measured FMA peak of [0-9]+ threads? \(--peak-gflops overrides\)$' \
    "$dir/plain.log" || fail "MFU without --peak-gflops does not name the measured peak"
grep -Eq '^step +1/6 .*\| MFU [0-9.]+% of [0-9]+ GFLOP/s, HFU [0-9.]+%' "$dir/plain.log" ||
    fail "no MFU against the measured peak on the step lines"
grep -q '| mem [0-9.]* [KMG]iB' "$dir/plain.log" || fail "no peak memory"
grep -q '^final: step 6 | train loss .* | val loss .* | accuracy .* | median .* ms/step' \
    "$dir/plain.log" || fail "no final summary: $(cat "$dir/plain.log")"
grep -q $'\r' "$dir/plain.log" && fail "progress bar written to a non-terminal"

"$KILN" train models/mlp.lua --steps 6 --profile --trace "$dir/t.json" --peak-gflops 100 \
    > "$dir/prof.log" 2>&1 || fail "train --profile failed: $(cat "$dir/prof.log")"
grep -q 'MFU [0-9.]*% of 100 GFLOP/s' "$dir/prof.log" || fail "MFU does not name its peak"
grep -q 'kernel  *calls  *total ms  *% step  *GFLOP/s  *GB/s' "$dir/prof.log" ||
    fail "no profile table: $(cat "$dir/prof.log")"
grep -q '^gemm\|^k[0-9]' "$dir/prof.log" || fail "no kernel rows: $(cat "$dir/prof.log")"
test -s "$dir/t.json" || fail "no trace file"
if command -v python3 > /dev/null; then
    python3 - "$dir/t.json" <<'PY' || fail "trace is not valid trace-event JSON"
import json, sys
d = json.load(open(sys.argv[1]))
ev = [e for e in d["traceEvents"] if e["ph"] == "X"]
assert ev, "no complete events"
for e in ev:
    assert {"name", "ts", "dur", "pid", "tid"} <= e.keys(), e
    assert e["dur"] >= 0
assert any(e["name"] == "step (exec)" for e in ev)
assert any(e["tid"] == 1 for e in ev), "no kernel events"
PY
else
    grep -q '"traceEvents"' "$dir/t.json" && grep -q '"ph":"X"' "$dir/t.json" ||
        fail "trace lacks events"
fi
echo "profile ok"
