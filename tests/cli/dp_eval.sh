#!/usr/bin/env bash
# dp_eval.sh - evaluation with several ranks covers the whole global
# validation batch: N ranks at batch b (and grad_accum K) report the
# validation loss and accuracy of one rank at batch N*K*b, at every eval
# line and at the end. Runs the MLP (blobs: no mask, accuracy) and a tiny
# addition transformer (masked loss).
set -u
. tests/cli/lib/train_runs.sh # $KILN, $T, fail, run, losses, same_losses, same_params

# run_eval NAME ARGS...: run, then keeps the eval and final lines in $T/NAME
run_eval() {
    run "$@"
    grep -E '^(eval|final)' "$T/$1.log" >"$T/$1" || fail "$1: no eval or final line"
}

# val losses of a run, one per line (eval lines, then the final line)
val_losses() { sed -n 's/.*val loss \([0-9.e+-]*\).*/\1/p' "$T/$1"; }
accuracies() { grep -o 'accuracy [0-9.]*% ([0-9]*/[0-9]*' "$T/$1"; }

# max relative difference of two runs' val losses, line by line
maxrel() {
    paste <(val_losses "$1") <(val_losses "$2") | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; r = $2 < 0 ? -$2 : $2
          e = r > 0 ? d / r : d; if (e > m) m = e }
        END { if (n < 2) print "none"; else printf "%.3g\n", m }'
}

# same NAME REF: the val losses agree to 1e-5 relative, the accuracies exactly
same() {
    [ "$(val_losses "$1" | wc -l)" -eq "$(val_losses "$2" | wc -l)" ] ||
        fail "$1 and $2 evaluate a different number of times"
    local e
    e=$(maxrel "$1" "$2")
    echo "$1 vs $2: val loss rel diff $e"
    awk -v e="$e" 'BEGIN { exit !(e != "none" && e < 1e-5) }' ||
        fail "$1 vs $2: val losses differ by $e: $(cat "$T/$1") / $(cat "$T/$2")"
    [ "$(accuracies "$1")" = "$(accuracies "$2")" ] ||
        fail "$1 vs $2: accuracies differ: $(accuracies "$1") / $(accuracies "$2")"
}

# differ NAME REF: the val losses differ by more than 1e-4 (the checks can fail)
differ() {
    local e
    e=$(maxrel "$1" "$2")
    awk -v e="$e" 'BEGIN { exit !(e != "none" && e > 1e-4) }' ||
        fail "$1 vs $2: expected different val losses, rel diff $e"
}

MLP="models/mlp.lua --steps 10 --set eval_every=5 --set eval_batches=3"
run_eval mlp_one $MLP --set batch=64
run_eval mlp_two $MLP --set batch=32 --nproc 2
run_eval mlp_half $MLP --set batch=32
same mlp_two mlp_one
differ mlp_half mlp_one
grep -q 'accuracy [0-9.]*% ([0-9]*/192 held-out)' "$T/mlp_two" ||
    fail "mlp_two: expected 3 x 64 = 192 held-out points: $(cat "$T/mlp_two")"

ADD="models/addition.lua --set L=1 --set C=32 --set H=2 --set digits=2 --steps 10 \
--set eval_every=5 --set eval_batches=3"
run_eval add_one $ADD --set batch=16
run_eval add_two $ADD --set batch=8 --nproc 2
run_eval add_accum $ADD --set batch=8 --set grad_accum=2
run_eval add_two_accum $ADD --set batch=4 --nproc 2 --set grad_accum=2
run_eval add_half $ADD --set batch=8
same add_two add_one
same add_accum add_one
same add_two_accum add_one
differ add_half add_one
grep -q 'accuracy [0-9.]*% ([0-9]*/48 held-out)' "$T/add_two" ||
    fail "add_two: expected 3 x 16 = 48 held-out problems: $(cat "$T/add_two")"
echo ok
