#!/usr/bin/env bash
# pp_loop.sh - the training loop's features under pipeline stages
# (runtime/train/train.c, runtime/dist/pp.c), each against one rank at
# grad_accum = m:
#   - sample_every: world rank 0 samples with the whole model's forward,
#     the params gathered from the stages (and the TP group): the same
#     sample lines as one rank at pp 2 and at tp 2 x pp 2 x dp 2;
#   - eval_batches = "all": the whole validation split on world rank 0,
#     the result sent to every rank: one rank's val losses (which differ
#     from one batch's), within 1e-6 relative;
#   - early stopping (val_loss): every rank stops at one rank's step;
#   - keep_best: PREFIX.best.safetensors of the best evaluation, one rank's
#     tensors within 1e-5 (whole, written by stage 0);
#   - early_stop on a metric the stages' evaluation does not give
#     (accuracy without eval_batches = "all", a name not an output): an error
#     naming the key and the metric.
# gpt's key bias: see tests/cli/tp.sh (compared to 1e-3 absolute).
set -u
. tests/cli/lib/train_runs.sh # $KILN, $T, fail, expect, run, losses, same_losses, same_params

GPT="models/gpt.lua --steps 10"
PP2="--nproc 2 --pp 2 --set micro_batches=4"

# lines NAME WHAT: the log's lines beginning with WHAT
lines() { grep "^$2 " "$T/$1.log"; }
# vals NAME: the val losses of the eval lines and the final line
vals() {
    sed -n 's/^eval *\([0-9]*\) | val loss \([0-9.e+-]*\).*/\1 \2/p; s/^final: step \([0-9]*\) .*| val loss \([0-9.e+-]*\) .*/final \2/p' \
        "$T/$1.log"
}
# same_vals A B: the same evaluations, val losses within 1e-6 relative
same_vals() {
    local n
    n=$(vals "$1" | wc -l)
    [ "$n" -ge 2 ] && [ "$n" -eq "$(vals "$2" | wc -l)" ] ||
        fail "$1 / $2: evaluations differ: $(vals "$1" | tr '\n' ' ') / $(vals "$2" | tr '\n' ' ')"
    paste <(vals "$1") <(vals "$2") | awk '
        $1 != $3 { exit 1 }
        { d = $2 - $4; if (d < 0) d = -d; if (d > 1e-6 * $4) exit 1 }' ||
        fail "$1 / $2: val losses differ: $(vals "$1" | tr '\n' ' ') / $(vals "$2" | tr '\n' ' ')"
    echo "$1 vs $2: $n val losses within 1e-6"
}

# --- sample_every and eval_batches = "all" ------------------------------------
ALL="--set eval_every=5 --set sample_every=5 --set eval_batches=all"
run s1 $GPT $ALL --set grad_accum=4
run s2 $GPT $ALL $PP2
run s8 $GPT $ALL --nproc 8 --pp 2 --tp 2 --set micro_batches=2
run b1 $GPT --set eval_every=5 --set grad_accum=4 # one batch per evaluation
[ "$(lines s1 sample | wc -l)" -eq 2 ] || fail "s1: not 2 samples: $(lines s1 sample)"
for f in s2 s8; do
    [ "$(lines $f sample)" = "$(lines s1 sample)" ] ||
        fail "$f: samples differ from one rank's: $(lines $f sample | cut -c1-80)"
    same_vals $f s1
    same_losses $f s1
done
# "all" is not one batch: the test would not see a pp run that ignores it
[ "$(vals b1 | tr '\n' ' ')" != "$(vals s1 | tr '\n' ' ')" ] ||
    fail "eval_batches = all gave one batch's val losses"

# --- early stopping and keep_best ---------------------------------------------
ES="--set eval_every=2 --set early_stop_metric=val_loss --set early_stop_patience=1
    --set early_stop_min_delta=0.15 --set keep_best=true"
run e1 $GPT $ES --set grad_accum=4 --checkpoint "$T/e1"
run e2 $GPT $ES $PP2 --checkpoint "$T/e2"
grep -q "^early stop at step [1-8]:" "$T/e1.log" ||
    fail "e1 did not stop early: $(grep -E '^(eval|early)' "$T/e1.log")"
[ "$(grep '^early stop' "$T/e1.log")" = "$(grep '^early stop' "$T/e2.log")" ] ||
    fail "e2 stopped unlike one rank: $(grep '^early stop' "$T/e2.log") / $(grep '^early stop' "$T/e1.log")"
same_losses e2 e1
[ -f "$T/e2.best.safetensors" ] || fail "keep_best: no e2.best.safetensors: $(ls "$T")"
[ "$(grep '^best checkpoint' "$T/e2.log" | tail -1 | sed 's/.*(//')" = \
  "$(grep '^best checkpoint' "$T/e1.log" | tail -1 | sed 's/.*(//')" ] ||
    fail "keep_best: another best than one rank's: $(grep '^best' "$T/e2.log" | tail -1)"
same_params "$T/e1.best.safetensors" "$T/e2.best.safetensors" 32

# --- errors -------------------------------------------------------------------
expect esacc '--pp 2: early_stop metric "accuracy": evaluation through pipeline stages gives the validation loss alone' \
    train $GPT $PP2 --set eval_every=2 --set early_stop_metric=accuracy
expect esx '--pp 2: early_stop metric "aux"' \
    train $GPT $PP2 --set eval_every=2 --set early_stop_metric=aux
echo "pp_loop.sh: ok"
