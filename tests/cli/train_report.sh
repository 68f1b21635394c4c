#!/bin/bash
# --log-dir DIR: kiln train writes DIR/metrics.jsonl (one JSON object per
# step, with the extra scalar outputs), DIR/eval.jsonl and DIR/report.html
# (well-formed, self-contained, with the loss, every extra scalar output,
# the accuracy, lr, gradient norm, throughput, profile (kernels named with
# their script lines) and memory plots; the communication timeline with several ranks; the remat
# sweep from kiln compile). tests/report/check_report.py checks the page.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh
command -v python3 > /dev/null || { echo "python3 not installed: skipped"; exit 77; }
check=tests/report/check_report.py

"$KILN" train tests/data/aux_loss.lua --remat=full --log-dir "$dir/r1" > "$dir/r1.log" 2>&1 ||
    fail "train --log-dir: $(tail -3 "$dir/r1.log")"
grep -qF "report: $dir/r1/report.html" "$dir/r1.log" || fail "no report line"
python3 - "$dir/r1" <<'PY' || fail "the JSON logs"
import json, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, 41)), [r["step"] for r in rows]
for r in rows:
    for k in ("loss", "xent", "zloss", "lr", "grad_norm", "ms", "examples_per_s", "tokens_per_s", "mfu", "hfu",
              "mem_bytes"):
        assert k in r, (k, r)
    assert abs(r["loss"] - r["xent"] - r["zloss"]) < 2e-6, r
    assert r["grad_norm"] > 0 and r["ms"] > 0 and r["mem_bytes"] > 0, r
    assert r["comm_ms"] is None and r["comm_exposed_ms"] is None, r  # one rank
ev = [json.loads(l) for l in open(d + "/eval.jsonl")]
assert [e["step"] for e in ev] == [20, 40], ev
assert all("val_loss" in e and "xent" in e and 0 <= e["accuracy"] <= 1 for e in ev), ev
PY
# the step lines and the log agree on the last loss
last=$(awk -F' [|] ' '/^step +40\/40/ { print substr($2, 6) }' "$dir/r1.log")
python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; \
assert abs(r['loss'] - float(sys.argv[2])) < 1e-5, (r['loss'], sys.argv[2])" \
    "$dir/r1/metrics.jsonl" "$last" || fail "metrics.jsonl disagrees with the step line"
python3 "$check" "$dir/r1/report.html" "train loss" "val loss" "examples/s" "by kind" \
    "costliest kernels" "live memory" "recomputed ops" "train xent" "val xent" "train zloss" \
    "val zloss" "val accuracy" "lr" "grad_norm" || fail "report.html (one rank)"
# the costliest kernels carry the script lines of their ops
grep -q 'font-family="monospace">[a-z0-9_]* (aux_loss.lua:[0-9][0-9,]*\(,\.\.\.\)\?)<' "$dir/r1/report.html" ||
    fail "no kernel named with its script lines in report.html"
! grep -q '"compute,communication"' "$dir/r1/report.html" || fail "a comm timeline on one rank"

if command -v mpirun > /dev/null; then
    "$KILN" train models/mlp.lua --steps 20 --nproc 2 --log-dir "$dir/r2" > "$dir/r2.log" 2>&1 ||
        fail "--nproc 2 --log-dir: $(tail -3 "$dir/r2.log")"
    python3 "$check" "$dir/r2/report.html" "compute" "communication" "train loss" ||
        fail "report.html (two ranks)"
    [ "$(wc -l < "$dir/r2/metrics.jsonl")" = 20 ] || fail "two ranks wrote metrics twice"
    # each step's communication and exposed time: their medians are the
    # summary's (zero=0: nothing lands after the last step's row)
    python3 - "$dir/r2/metrics.jsonl" "$dir/r2.log" <<'PY' || fail "comm figures in metrics.jsonl"
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
busy = [r["comm_ms"] for r in rows]
exp = [r["comm_exposed_ms"] for r in rows]
assert all(type(v) in (int, float) and v >= 0 for v in busy + exp), rows
assert max(busy) > 0, busy
m = re.search(r"^comm:.*communication ([0-9.]+) ms \| exposed ([0-9.]+) ms", open(sys.argv[2]).read(), re.M)
assert m, "no comm: line"
for got, want in ((statistics.median(busy), m[1]), (statistics.median(exp), m[2])):
    assert abs(got - float(want)) <= 0.0051, (got, want)
PY
    # the ranks start the loop together: a rank 400 ms late before it is
    # not waited for in the first step (it was, as 400 ms exposed)
    KILN_TEST_LATE_RANK=1:400 "$KILN" train models/mlp.lua --steps 3 --nproc 2 \
        --log-dir "$dir/late" > "$dir/late.log" 2>&1 || fail "a late rank: $(tail -3 "$dir/late.log")"
    python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); \
assert r['ms'] < 200 and r['comm_exposed_ms'] < 200, r" "$dir/late/metrics.jsonl" ||
        fail "the first step waited for the late rank"
fi

"$KILN" compile models/gpt.lua --log-dir "$dir/c" > "$dir/c.log" 2>&1 ||
    fail "compile --log-dir: $(tail -3 "$dir/c.log")"
python3 "$check" "$dir/c/report.html" "live memory" "planned peak" "predicted step" ||
    fail "report.html (compile)"
[ ! -e "$dir/c/metrics.jsonl" ] || fail "kiln compile wrote a metrics log"

# a path that is a file, and an empty flag
: > "$dir/afile"
expect_error "$dir/afile" -- "$KILN" train models/mlp.lua --steps 1 --log-dir "$dir/afile"
expect_error -s 2 "--log-dir expects a directory" -- "$KILN" compile models/mlp.lua --log-dir=
bad_input_done
