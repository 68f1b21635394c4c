#!/bin/bash
# train{optimizer, param_groups, frozen, lr_schedule} through the binary
# (the update rules themselves: tests/unit/test_optimizers.c):
# - each optimizer's state is in the checkpoint under its names, and
#   N steps + --resume + N steps equal 2N straight, bit for bit;
# - frozen params have no state in the checkpoint and no grad output in
#   the optimizer dump, which names them;
# - zero=1 on 2 ranks with param groups and a frozen param matches zero=0
#   on 2 ranks; zero=1 with sgd, lion or adafactor is a clear error;
# - the schedules' lr in the step lines (constant, linear, wsd);
# - bad param_groups / frozen / nesterov settings: errors at the line;
#   another optimizer's or schedule's settings: a warning.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

MLP=(models/mlp.lua --set hidden=16 --set batch=16)
G='train{param_groups = {{match = "bias$", weight_decay = 0, lr_scale = 0.5}}, frozen = {"^fc1%."}}'
{ cat models/mlp.lua; echo "$G"; } > "$dir/groups.lua"

resume() { # name state-name args...
    local name=$1 st=$2
    shift 2
    "$KILN" train "$@" --steps 8 --set log_every=1 --set checkpoint_every=4 \
        --checkpoint "$dir/$name" --save-weights "$dir/$name.straight.safetensors" \
        > "$dir/$name.straight.log" 2>&1 || fail "$name: straight run: $(tail -3 "$dir/$name.straight.log")"
    grep -aq "\"$st\"" "$dir/$name.step4.safetensors" || fail "$name: no state $st in the checkpoint"
    "$KILN" train "$@" --steps 8 --resume "$dir/$name.step4.safetensors" \
        --save-weights "$dir/$name.resumed.safetensors" > "$dir/$name.resumed.log" 2>&1 ||
        fail "$name: resumed run: $(tail -3 "$dir/$name.resumed.log")"
    grep -q 'resumed from .* at step 4' "$dir/$name.resumed.log" || fail "$name: did not resume"
    cmp -s "$dir/$name.straight.safetensors" "$dir/$name.resumed.safetensors" ||
        fail "$name: 4 + resume + 4 steps differ from 8 straight"
    case_recovered "$name: resume"
}
resume adamw adam.m.fc1.weight "${MLP[@]}"
resume sgd sgd.buf.fc1.weight "${MLP[@]}" --set optimizer=sgd --set momentum=0.9 --set nesterov=true
resume lion lion.m.head.weight "${MLP[@]}" --set optimizer=lion --set lr=1e-3
resume adafactor adafactor.r.fc2.weight "${MLP[@]}" --set optimizer=adafactor
grep -aq '"adafactor.c.fc2.weight"' "$dir/adafactor.step4.safetensors" || fail "no adafactor.c"
grep -aq '"adafactor.v.fc2.bias"' "$dir/adafactor.step4.safetensors" || fail "no adafactor.v"
resume groups adam.m.fc2.weight "$dir/groups.lua" --set hidden=16 --set batch=16
# frozen fc1: no state for it, the same bits as at step 0
if grep -aq '"adam.m.fc1.weight"' "$dir/groups.step4.safetensors"; then
    fail "frozen fc1.weight has optimizer state"
fi

# the optimizer dump: no grad output for the frozen params, and the line naming them
"$KILN" compile "$dir/groups.lua" --dump-after=optimizer --dump-dir "$dir/dump" > /dev/null 2>&1 ||
    fail "compile --dump-after=optimizer"
ir=$(ls "$dir"/dump/*optimizer.ir)
grep -q '^# frozen (no gradient, state or update): fc1.weight, fc1.bias$' "$ir" ||
    fail "optimizer dump: no frozen line: $(grep frozen "$ir")"
if grep -q 'output "grad.fc1' "$ir"; then fail "optimizer dump: a frozen param's gradient"; fi
grep -q 'output "grad.fc2.weight"' "$ir" || fail "optimizer dump: no grad.fc2.weight"
# and no ops for them: fc1's weight gradient and the gradient into fc1's
# output (only fc1's gradients read it) are gone: 2 matmuls fewer
"$KILN" compile models/mlp.lua --dump-after=optimizer --dump-dir "$dir/dump0" > /dev/null 2>&1 ||
    fail "compile mlp --dump-after=optimizer"
m1=$(grep -c '= matmul' "$ir") m0=$(grep -c '= matmul' "$dir"/dump0/*optimizer.ir)
[ "$m1" -eq $((m0 - 2)) ] || fail "optimizer dump: $m1 matmuls with fc1 frozen, $m0 without"
case_recovered "optimizer dump"
# kiln opt replays the optimizer pass of each optimizer from the dump before it
for o in sgd lion adafactor; do
    rm -rf "$dir/od"
    "$KILN" compile "${MLP[@]}" --set optimizer=$o --set momentum=0.5 --dump-after=all \
        --dump-dir "$dir/od" > /dev/null 2>&1 || fail "$o: compile --dump-after=all"
    before=$(ls "$dir"/od/*-attnlayout.ir) after=$(ls "$dir"/od/*-optimizer.ir)
    "$KILN" opt "$before" --passes=optimizer --set optimizer=$o --set momentum=0.5 \
        > "$dir/od/replay.ir" 2>&1 || fail "$o: kiln opt: $(tail -3 "$dir/od/replay.ir")"
    cmp -s "$dir/od/replay.ir" "$after" || fail "$o: kiln opt's optimizer dump differs"
    case_recovered "kiln opt --set optimizer=$o"
done
# --settings lists what the patterns matched
"$KILN" compile "$dir/groups.lua" --settings > "$dir/settings.txt" 2>&1 || fail "--settings"
grep -qx 'fc1.weight = frozen' "$dir/settings.txt" || fail "--settings: no frozen fc1.weight"
grep -qx 'fc2.bias = lr_scale 0.5, weight_decay 0' "$dir/settings.txt" ||
    fail "--settings: no group of fc2.bias"
if grep -q '^fc2.weight = ' "$dir/settings.txt"; then fail "--settings: fc2.weight in no group"; fi
case_recovered "--settings"

# zero=1 on 2 ranks with groups and a frozen param: the losses of zero=0
if command -v mpirun > /dev/null; then
    for z in 0 1; do
        "$KILN" train "$dir/groups.lua" --set hidden=16 --set batch=16 --steps 6 --nproc 2 \
            --set zero=$z --set log_every=1 --save-weights "$dir/z$z.safetensors" \
            > "$dir/z$z.log" 2>&1 || fail "zero=$z: $(tail -3 "$dir/z$z.log")"
    done
    a=$(sed -n 's/^final: .*train loss \([^ ]*\) .*/\1/p' "$dir/z0.log")
    b=$(sed -n 's/^final: .*train loss \([^ ]*\) .*/\1/p' "$dir/z1.log")
    [ -n "$a" ] && [ -n "$b" ] || fail "zero: no final loss"
    echo "$a $b" | awk '{ d = $1 - $2; if (d < 0) d = -d; exit !(d <= 1e-5 * $1) }' ||
        fail "zero=1 loss $b, zero=0 $a"
    case_recovered "zero=1 with param groups and frozen"
    # its checkpoint resumes on 2 sharded ranks bit for bit
    "$KILN" train "$dir/groups.lua" --set hidden=16 --set batch=16 --steps 6 --nproc 2 \
        --set zero=1 --set checkpoint_every=3 --checkpoint "$dir/zc" > "$dir/zc.log" 2>&1 ||
        fail "zero=1 checkpoint: $(tail -3 "$dir/zc.log")"
    "$KILN" train "$dir/groups.lua" --set hidden=16 --set batch=16 --steps 6 --nproc 2 \
        --set zero=1 --resume "$dir/zc.step3.safetensors" --save-weights "$dir/zr.safetensors" \
        > "$dir/zr.log" 2>&1 || fail "zero=1 resume: $(tail -3 "$dir/zr.log")"
    cmp -s "$dir/z1.safetensors" "$dir/zr.safetensors" || fail "zero=1: 3 + resume + 3 differ"
    case_recovered "zero=1 resume with param groups and frozen"
    # zero=1 shards SGD's and Lion's state too (train_zero_optimizers.sh);
    # Adafactor's factored state is refused
    expect_error "zero = 1 shards the state of adamw, sgd and lion, not adafactor's" -- \
        "$KILN" train "${MLP[@]}" --steps 2 --nproc 2 --set zero=1 --set optimizer=adafactor
fi

# schedules: lr in the step lines (steps 10, lr 0.01, min_lr 0)
lr_at() { # step log: the lr printed on that step's line
    sed -n "s/^step  *$1\/10 .*| lr \([^ ]*\) .*/\1/p" "$2"
}
sched() { # schedule extra-args step expected-lr
    local s=$1 args=$2 at=$3 want=$4
    # shellcheck disable=SC2086
    "$KILN" train "${MLP[@]}" --steps 10 --set lr=0.01 --set min_lr=0 --set log_every=1 \
        --set lr_schedule=$s $args > "$dir/s.log" 2>&1 || fail "$s: $(tail -3 "$dir/s.log")"
    [ "$(lr_at "$at" "$dir/s.log")" = "$want" ] ||
        fail "$s $args: lr at step $at $(lr_at "$at" "$dir/s.log"), expected $want"
    case_recovered "schedule $s"
}
sched constant "--set warmup=2" 10 1.000e-02
sched constant "--set warmup=2" 1 5.000e-03
sched linear "--set warmup=2" 10 1.250e-03
sched wsd "--set decay_fraction=0.5 --set warmup=2" 6 1.000e-02
sched wsd "--set decay_fraction=0.5 --set warmup=2" 10 2.000e-03
sched cosine "--set warmup=0" 6 5.000e-03

# a setting of another optimizer or schedule: a warning at the train{} line, exit 0
"$KILN" compile "${MLP[@]}" --set momentum=0.9 --set lion_beta2=0.9 > "$dir/w.log" 2>&1 ||
    fail "momentum with adamw: $(tail -3 "$dir/w.log")"
grep -q 'mlp.lua:[0-9]*: warning: train: momentum applies to optimizer = "sgd" only (ignored with optimizer = "adamw")' \
    "$dir/w.log" || fail "no warning for momentum with adamw: $(cat "$dir/w.log")"
grep -q 'warning: train: lion_beta2 applies to optimizer = "lion" only' "$dir/w.log" ||
    fail "no warning for lion_beta2 with adamw"
"$KILN" compile "${MLP[@]}" --set optimizer=sgd --set beta1=0.8 --set decay_fraction=0.5 \
    > "$dir/w.log" 2>&1 || fail "beta1 with sgd"
grep -q 'warning: train: beta1 applies to optimizer = "adamw" only (ignored with optimizer = "sgd")' \
    "$dir/w.log" || fail "no warning for beta1 with sgd"
grep -q 'warning: train: decay_fraction applies to lr_schedule = "wsd" only' "$dir/w.log" ||
    fail "no warning for decay_fraction with cosine"
if "$KILN" compile "${MLP[@]}" --set optimizer=sgd --set momentum=0.9 2>&1 | grep -q warning; then
    fail "a warning for sgd's own momentum"
fi
case_recovered "warnings for other optimizers' settings"

# bad settings, at their line
bad() { # name train-line patterns...
    local name=$1 line=$2
    shift 2
    { cat models/mlp.lua; echo "$line"; } > "$dir/$name.lua"
    expect_error "$@" -- "$KILN" compile "$dir/$name.lua"
}
n=$(($(wc -l < models/mlp.lua) + 1))
bad unknown 'train{param_groups = {{match = "bias$", lr_scal = 2}}}' \
    "$dir/unknown.lua:$n: train: param_groups[1]: unknown key 'lr_scal'" "expected match, lr_scale or weight_decay"
bad nomatch 'train{param_groups = {{lr_scale = 2}}}' "$dir/nomatch.lua:$n:" 'needs match = "PATTERN"'
bad badpat 'train{frozen = {"fc1%"}}' "$dir/badpat.lua:$n: train: frozen[1]: bad Lua pattern 'fc1%'"
bad nothing 'train{frozen = {"^fc9"}}' "$dir/nothing.lua:$n: train: frozen[1] '^fc9' matches no param" \
    "fc1.weight"
bad gnothing 'train{param_groups = {{match = "wte"}}}' \
    "$dir/gnothing.lua:$n: train: param_groups[1].match 'wte' matches no param"
bad negscale 'train{param_groups = {{match = "fc", lr_scale = -1}}}' \
    "$dir/negscale.lua:$n: train: param_groups[1].lr_scale: expected a finite number >= 0, got -1"
bad notlist 'train{frozen = "fc1"}' "$dir/notlist.lua:$n: train: frozen needs a list of Lua patterns"
bad nesterov 'train{optimizer = "sgd", nesterov = true}' "$dir/nesterov.lua:" \
    "nesterov = true needs momentum > 0"
bad optname 'train{optimizer = "adam"}' "$dir/optname.lua:$n: train: bad value for 'optimizer'" \
    "expected one of adamw, sgd, lion, adafactor, got 'adam'"
bad allfrozen 'train{frozen = {"."}}' "every parameter is frozen"
# a pattern that backtracks is matched under the script's time bound
{ cat models/mlp.lua; echo 'train{frozen = {string.rep(".-", 40) .. "z"}}'; } > "$dir/backtrack.lua"
expect_error -t 60 "backtrack.lua:" "KILN_LUA_SECONDS raises the limit" -- \
    env KILN_LUA_SECONDS=2 "$KILN" compile "$dir/backtrack.lua"
expect_error "--set param_groups: a table, set in the script's train{} only" -- \
    "$KILN" compile models/mlp.lua --set 'param_groups=x'
bad_input_done
