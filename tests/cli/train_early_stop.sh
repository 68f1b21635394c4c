#!/bin/bash
# train{early_stop, keep_best} (docs/training.md, Early stopping): the run
# stops after `patience` evaluations without an improvement of more than
# min_delta, PREFIX.best.safetensors holds the best evaluation's state (a
# resume from it evaluates to the best value), a metric may be an output
# or the accuracy (mode max), and mistakes are errors at the train{} line.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh # $dir, fail, expect_error
m=tests/data/early_stop.lua

"$KILN" train $m --checkpoint "$dir/es" > "$dir/a.log" 2>&1 || fail "run: $(cat "$dir/a.log")"
grep -q "^early stop at step [0-9]*: val_loss has not improved by more than 0.001 for 2 evaluations" \
    "$dir/a.log" || fail "no early stop: $(cat "$dir/a.log")"
final=$(grep -o '^final: step [0-9]*' "$dir/a.log" | grep -o '[0-9]*$')
[ -n "$final" ] && [ "$final" -lt 2000 ] || fail "the run did not stop early: $(tail -2 "$dir/a.log")"
best=$(grep -o 'best val_loss [0-9.]* at step [0-9]*' "$dir/a.log" | tail -1)
bstep=${best##* }
bval=$(echo "$best" | cut -d' ' -f3)
[ -n "$bstep" ] && [ "$bstep" -lt "$final" ] || fail "best step '$bstep' (final $final)"
test -f "$dir/es.best.safetensors" || fail "no best checkpoint"
test -f "$dir/es.step$final.safetensors" || fail "no latest checkpoint beside the best"
# the best checkpoint holds the best evaluation's state: resumed at its step,
# the run only evaluates, and gets the best value
"$KILN" train $m --resume "$dir/es.best.safetensors" --steps "$bstep" --set early_stop_metric= \
    --set keep_best=false > "$dir/b.log" 2>&1 || fail "resume from best: $(cat "$dir/b.log")"
grep -q "resumed from .* at step $bstep" "$dir/b.log" || fail "best checkpoint's step: $(cat "$dir/b.log")"
rval=$(grep -o 'val loss [0-9.]*' "$dir/b.log" | tail -1 | cut -d' ' -f3)
awk -v a="$rval" -v b="$bval" 'BEGIN { d = a - b; exit !(a != "" && d < 1e-6 && d > -1e-6) }' ||
    fail "best checkpoint evaluates to $rval, the run's best was $bval"

# min_delta past any gain: the first evaluation is the best, then `patience` more
"$KILN" train $m --set early_stop_min_delta=10 --set early_stop_patience=3 --set keep_best=false \
    > "$dir/c.log" 2>&1 || fail "min_delta: $(cat "$dir/c.log")"
grep -q "^early stop at step 80: val_loss has not improved by more than 10 for 3 evaluations (best [0-9.]* at step 20)" \
    "$dir/c.log" || fail "min_delta 10, patience 3: $(grep -i 'early\|final' "$dir/c.log")"
# an output as the metric; the accuracy (maximised)
"$KILN" train $m --set early_stop_metric=xent --set early_stop_min_delta=10 --set keep_best=false \
    > "$dir/d.log" 2>&1 || fail "metric xent: $(cat "$dir/d.log")"
grep -q "^early stop at step 60: xent has not improved" "$dir/d.log" || fail "metric xent: $(cat "$dir/d.log")"
"$KILN" train $m --set early_stop_metric=accuracy --set early_stop_min_delta=2 --set keep_best=false \
    > "$dir/e.log" 2>&1 || fail "metric accuracy: $(cat "$dir/e.log")"
grep -q "^early stop at step 60: accuracy has not improved" "$dir/e.log" || fail "accuracy: $(cat "$dir/e.log")"
# no early stop: every step runs
"$KILN" train $m --steps 100 --set early_stop_metric= --set keep_best=false -q > "$dir/f.log" 2>&1 ||
    fail "off: $(cat "$dir/f.log")"
grep -q "^final: step 100 " "$dir/f.log" || fail "off: $(cat "$dir/f.log")"

# mistakes
expect_error "$m:14:" 'metric "nope" is not a scalar output' "val_loss, accuracy, xent" -- \
    "$KILN" train $m --set early_stop_metric=nope --checkpoint "$dir/x"
expect_error "$m:14:" "keep_best needs a checkpoint prefix" -- "$KILN" train $m
expect_error "$m:14:" "early_stop needs evaluations during the run" -- \
    "$KILN" train $m --set eval_every=0 --checkpoint "$dir/x"
expect_error "$m:14:" "early_stop needs a validation split" -- \
    "$KILN" train $m --set val_fraction=0 --checkpoint "$dir/x"
expect_error "early_stop_patience" "expected an integer from 1" -- \
    "$KILN" train $m --set early_stop_patience=0 --checkpoint "$dir/x"
expect_error "--set early_stop" "early_stop_metric" -- "$KILN" train $m --set early_stop=3
expect_error "early_stop_mode" "auto, min, max" -- "$KILN" train $m --set early_stop_mode=up
sed 's/patience = 2/patiense = 2/' $m > "$dir/t.lua"
expect_error "$dir/t.lua:14:" "patiense" "patience" -- "$KILN" train "$dir/t.lua"
sed 's/metric = "val_loss", //' $m > "$dir/t.lua"
expect_error "$dir/t.lua:14:" "early_stop needs metric" -- "$KILN" train "$dir/t.lua"
sed 's/early_stop = {[^}]*}/early_stop = "val_loss"/' $m > "$dir/t.lua"
expect_error "$dir/t.lua:14:" "early_stop needs a table" -- "$KILN" train "$dir/t.lua"
bad_input_done
