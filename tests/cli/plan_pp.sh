#!/usr/bin/env bash
# plan_pp.sh - kiln plan --pp uses the compiler's stage cut (issue 40, part
# 3): per stage, the forward ops and params kiln plan reports are the ones
# `kiln compile --pp` cuts (gpt.lua's own cut, and pp_hint.lua's cut moved
# by a pp_stage hint); the bubble and the micro-batches each stage holds
# follow --schedule (the schedule simulated with the stages' F, B and W);
# where the cut cannot be made (state updates, --pipeline-formulas) or the schedule is too long to
# simulate, the plan says it uses the formulas. --device h100: no machine
# figures are measured, so it is quick.
set -u
: "${KILN:?KILN must point at the kiln binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-plan-pp.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
gpt=(models/gpt.lua --set L=4 --set H=4 --set C=128 --set T=64 --set batch=4)

# cut MODEL ARGS...: "stage ops params" per stage, as kiln compile --pp cuts
cut() {
    "$KILN" compile "$@" >"$T/c.log" 2>&1 || fail "kiln compile $*: $(tail -3 "$T/c.log")"
    sed -n 's/^# stage \([0-9]*\): ops \([0-9.]*\) .*, \([0-9]*\) params.*/\1 \2 \3/p' "$T/c.log"
}
# plan NAME ARGS...: kiln plan ARGS into $T/NAME.log; its stage rows as cut's
plan() {
    local name=$1
    shift
    "$KILN" plan "$@" >"$T/$name.log" 2>&1 || fail "kiln plan $*: $(tail -3 "$T/$name.log")"
    awk '/^    stage +ops/ { on = 1; next } on && /^    [0-9]+ / { print $1, $2, $4; next } { on = 0 }' \
        "$T/$name.log"
}
bubble() { sed -n 's/^  pipeline ([^)]*) .* (\([0-9.]*\)%)$/\1/p' "$T/$1.log"; }
holds() { # the column before the memory (a number and its unit)
    awk '/^    stage +ops/ { on = 1; next }
         on && /^    [0-9]+ / { sub(/ <- .*/, ""); printf "%s ", $(NF - 2) }' "$T/$1.log"
}

# the same cut: gpt.lua at pp 2 and pp 4; pp_hint.lua with its hint (stage
# 1 after layer 1) and without (cut=0: the compiler's choice)
for pp in 2 4; do
    want=$(cut "${gpt[@]}" --pp "$pp")
    got=$(plan gpt$pp "${gpt[@]}" --device h100 --pp "$pp" --micro-batches 8)
    [ "$(echo "$want" | wc -l)" = "$pp" ] || fail "compile --pp $pp: no $pp stage lines: $want"
    [ "$want" = "$got" ] || fail "gpt pp $pp: plan's stages '$got', compile's '$want'"
    grep -q "from the compiler's stage cut" "$T/gpt$pp.log" || fail "gpt pp $pp: not from the cut"
done
for c in 1 0; do
    want=$(cut tests/data/pp_hint.lua --pp 2 --set cut=$c)
    got=$(plan hint$c tests/data/pp_hint.lua --set cut=$c --device h100 --pp 2 --micro-batches 4)
    [ -n "$want" ] && [ "$want" = "$got" ] || fail "pp_hint cut=$c: plan's '$got', compile's '$want'"
done
[ "$(cut tests/data/pp_hint.lua --pp 2 --set cut=1)" != "$(cut tests/data/pp_hint.lua --pp 2 --set cut=0)" ] ||
    fail "pp_hint: the hint does not move the cut (the test would not tell)"

# --json: the model used and one object per stage
"$KILN" plan "${gpt[@]}" --device h100 --pp 2 --micro-batches 4 --json >"$T/j.json" 2>&1 ||
    fail "plan --json: $(tail -3 "$T/j.json")"
grep -Eq '"pipeline_model":[[:space:]]*"cut"' "$T/j.json" || fail "--json: no pipeline_model cut"
[ "$(grep -c '"busy_s"' "$T/j.json")" = 2 ] || fail "--json: not 2 stages"

# the schedule: gpipe holds all m micro-batches on every stage, 1f1b pp - s
# on stage s (gpt.lua, pp 4, m 4)
for s in 1f1b gpipe; do
    plan s-$s "${gpt[@]}" --device h100 --pp 4 --micro-batches 4 --schedule "$s" >/dev/null
done
[ "$(holds s-1f1b)" = "4 3 2 1 " ] || fail "1f1b holds '$(holds s-1f1b)', expected 4 3 2 1"
[ "$(holds s-gpipe)" = "4 4 4 4 " ] || fail "gpipe holds '$(holds s-gpipe)', expected 4 4 4 4"
# the what-if rows come from the cut too (no formula marker)
grep -q 'schedule=zb-h1 .*ideal split' "$T/s-1f1b.log" && fail "zb-h1 what-if row uses the formulas"
# the bubble follows the schedule: pp_hint.lua cut after layer 5 has a
# heavy first stage; under gpipe its last F's wait for all of them, so its
# bubble is larger than 1f1b's (whose simulated bubble is not the formula's)
for s in 1f1b gpipe zb-h1; do
    plan h-$s tests/data/pp_hint.lua --set cut=5 --device h100 --pp 2 --micro-batches 4 \
        --schedule "$s" >/dev/null
done
b1=$(bubble h-1f1b) bg=$(bubble h-gpipe) bz=$(bubble h-zb-h1)
[ -n "$b1" ] && [ -n "$bz" ] && [ -n "$bg" ] || fail "no bubble line: '$b1' '$bg' '$bz'"
awk -v a="$b1" -v g="$bg" 'BEGIN { exit !(g > a + 1) }' ||
    fail "gpipe's bubble $bg% is not above 1f1b's $b1%"
awk -v a="$b1" 'BEGIN { exit !(a < 100 / 5 - 1) }' ||
    fail "1f1b's bubble $b1% is not below the formula's 20%"

# llama.lua at tp 2 x pp 2 with sequence parallelism: every stage program
# compiles (the schedule pass once moved a weight-gradient unit of the B
# program before its own first part: the formulas were used instead)
plan sp models/llama.lua --set sequence_parallel=true --device h100 --pp 2 --tp 2 \
    --micro-batches 4 >/dev/null
grep -q "from the compiler's stage cut" "$T/sp.log" ||
    fail "llama tp 2 x pp 2, sequence parallel: $(grep -A1 'pipeline (' "$T/sp.log")"

# dropout goes with its stage: the cut; --pipeline-formulas: the formulas, said
plan drop "${gpt[@]}" --set dropout=0.1 --device h100 --pp 2 --micro-batches 4 >/dev/null
grep -q "from the compiler's stage cut" "$T/drop.log" ||
    fail "dropout: no cut: $(grep -A1 'pipeline (' "$T/drop.log")"
plan formulas "${gpt[@]}" --device h100 --pp 2 --micro-batches 4 --pipeline-formulas >/dev/null
grep -q "from the ideal split and the formulas.*--pipeline-formulas" "$T/formulas.log" ||
    fail "--pipeline-formulas: no fallback line: $(grep -A1 'pipeline (' "$T/formulas.log")"
# a schedule too long to simulate (m x pp^2 above 2^22): the formulas, said
plan long "${gpt[@]}" --device h100 --pp 4 --micro-batches 262145 >/dev/null
grep -q "the stage cut could not be used: 262145 micro-batches x 4 stages squared" "$T/long.log" ||
    fail "long schedule: $(grep -A1 'pipeline (' "$T/long.log")"
echo "plan_pp: ok"
