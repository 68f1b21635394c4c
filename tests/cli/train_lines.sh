#!/bin/bash
# What `kiln train` prints: the model's extra scalar outputs on the step,
# eval and final lines (averaged like the loss over micro-batches and
# ranks, so loss = xent + zloss holds on every line); about 30 step lines
# per run in a log by default (log_every sets it); on a terminal one
# status line rewritten in place, with evaluations on lines of their own.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-lines-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# loss = xent + zloss on every step line, and both on the eval and final lines
check_terms() {
    local log=$1 what=$2
    local n
    n=$(awk -F' [|] ' '/^step / {
            l = x = z = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^loss /) l = substr($i, 6)
                if ($i ~ /^xent /) x = substr($i, 6)
                if ($i ~ /^zloss /) z = substr($i, 7)
            }
            if (l == "" || x == "" || z == "") { print "missing"; exit }
            d = l - x - z; if (d < 0) d = -d
            if (d > 2e-6) { print "sum " l " " x " " z; exit }
            n++
        } END { print n + 0 }' "$log")
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || fail "$what: step lines: $n"
    grep -qE '^eval +20 \| val loss [0-9.]+ \| xent [0-9.]+ \| zloss [0-9.]+' "$log" ||
        fail "$what: no extra outputs on the eval line: $(grep '^eval' "$log")"
    grep -qE '^final: .*train loss [0-9.]+ \| xent [0-9.e-]+ \| zloss [0-9.e-]+ .*val xent' "$log" ||
        fail "$what: no extra outputs on the final line: $(grep '^final' "$log")"
}
"$KILN" train tests/data/aux_loss.lua --set log_every=1 > "$dir/a.log" 2>&1 ||
    fail "aux_loss.lua: $(tail -3 "$dir/a.log")"
check_terms "$dir/a.log" "one rank"
[ "$(grep -c '^step ' "$dir/a.log")" = 40 ] || fail "log_every=1 gave $(grep -c '^step ' "$dir/a.log") lines"
"$KILN" train tests/data/aux_loss.lua --set log_every=1 --set grad_accum=2 > "$dir/b.log" 2>&1 ||
    fail "grad_accum=2: $(tail -3 "$dir/b.log")"
check_terms "$dir/b.log" "grad_accum=2"
if command -v mpirun > /dev/null; then
    "$KILN" train tests/data/aux_loss.lua --nproc 2 --set log_every=1 > "$dir/c.log" 2>&1 ||
        fail "--nproc 2: $(tail -3 "$dir/c.log")"
    check_terms "$dir/c.log" "--nproc 2"
fi

# a log: first, last and about 30 lines in between by default
"$KILN" train models/mlp.lua --steps 1000 --set eval_every=0 > "$dir/d.log" 2>&1 ||
    fail "mlp: $(tail -3 "$dir/d.log")"
n=$(grep -c '^step ' "$dir/d.log")
[ "$n" -ge 20 ] && [ "$n" -le 52 ] || fail "1000 steps printed $n step lines (expected 20-52)"
grep -q '^step     1/1000 ' "$dir/d.log" && grep -q '^step  1000/1000 ' "$dir/d.log" ||
    fail "the first or last step line is missing"

# a terminal: one status line rewritten in place; evaluations on their own lines
if command -v script > /dev/null; then
    COLUMNS=120 script -qec "$KILN train models/mlp.lua --steps 300 --set eval_every=100" \
        /dev/null > "$dir/t.log" 2>&1 < /dev/null || fail "under a terminal: $(tail -c 300 "$dir/t.log")"
    tr -d '\r' < "$dir/t.log" > "$dir/t2.log"
    grep -qF $'\033[Kstep 300/300 | loss ' "$dir/t2.log" || fail "no final status line"
    lines=$(wc -l < "$dir/t2.log")
    [ "$lines" -le 8 ] || fail "a terminal got $lines lines (expected the status line, evals, final)"
    [ "$(grep -c 'eval    100 | val loss' "$dir/t2.log")" = 1 ] || fail "the eval line is missing"
    ! grep -q '^step ' "$dir/t2.log" || fail "step lines printed on a terminal"
    awk '{ if (length($0) > 0) { n = split($0, seg, "\033\\[K"); for (i = 1; i <= n; i++)
         if (seg[i] ~ /^step / && length(seg[i]) > 119) { print "long: " seg[i]; exit 1 } } }' "$dir/t2.log" ||
        fail "a status line is wider than the terminal"
    # a narrow terminal keeps the time left: each status line fits and ends
    # with it (issue 42: the line was cut at the width, losing it)
    for cols in 60 40 25; do
        COLUMNS=$cols script -qec "$KILN train tests/data/aux_loss.lua --steps 40" \
            /dev/null > "$dir/n.log" 2>&1 < /dev/null || fail "COLUMNS=$cols: $(tail -c 300 "$dir/n.log")"
        tr -d '\r' < "$dir/n.log" | awk -v w=$((cols - 1)) '{ n = split($0, seg, "\033\\[K")
            for (i = 1; i <= n; i++) if (seg[i] ~ /^step /) {
                s++
                if (length(seg[i]) > w) { print "long: " seg[i]; exit 1 }
                if (seg[i] !~ /[0-9]+m[0-9][0-9]s left$/) { print "no time left: " seg[i]; exit 1 } } }
            END { if (!s) { print "no status line"; exit 1 } }' ||
            fail "status line at COLUMNS=$cols"
    done
else
    echo "note: script(1) not installed; the terminal case was not run"
fi
echo "ok: extra outputs on every line, log line counts, terminal status line"
