#!/bin/bash
# Divergence (on_nonfinite): a step whose loss or gradient norm is not finite
# changes nothing. "stop" exits 1 naming the step, and every checkpoint it
# wrote is finite and resumes; "skip" goes on without the step and says so.
# A NaN loss at a known batch (a byte-level model whose loss is NaN when its
# batch holds '~', its gradients finite): one rank, two ranks and two
# micro-batches agree (the NaN loss of one rank or one micro-batch stops
# every rank's update). A non-finite gradient norm with a finite loss
# (gpt, lr 1e6): no NaN checkpoint, as there was before. An update that
# overflows a param is never written.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

# The model and its text: '~' once, at byte 150, in the training split.
cat > "$dir/tilde.lua" <<'EOF'
local cfg = config{batch = 4}
local B, T, C = cfg.batch, 8, 16
local tokens = input("tokens", {B, T}, "i32")
local targets = input("targets", {B, T}, "i32")
local emb = param("emb", {256, C}, normal(0.1))
local head = param("head", {C, 256}, normal(0.1))
local logits = embedding(emb, tokens):matmul(head)
-- log|token - 126| is -inf for '~': a NaN loss whose gradients are finite
local tilde = log(abs(cast(tokens, "f32") - 126)):min()
minimize(nn.cross_entropy(logits, targets) + tilde * 0)
output("logits", logits)
train{data = "text", batch = B, steps = 30, lr = 0.01, val_fraction = 0.2, seed = 3}
EOF
text=$(yes 'the quick brown fox jumps over a lazy dog' | head -c 600)
printf '%s~%s' "${text:0:150}" "${text:151}" > "$dir/tilde.txt"
TILDE=("$KILN" train "$dir/tilde.lua" --set "data_path=$dir/tilde.txt")

# finite FILE: every value of a safetensors file of f32 tensors is finite
finite() {
    local h
    h=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    head -c $((8 + h)) "$1" | tail -c "$h" > "$dir/header"
    grep -q '"dtype":"F32"' "$dir/header" || fail "$1: no f32 tensors"
    if grep -o '"dtype":"[A-Z0-9]*"' "$dir/header" | grep -qv F32; then
        fail "$1: not all tensors are f32"
    fi
    if od -An -v -tf4 -j $((8 + h)) "$1" | grep -qi 'nan\|inf'; then
        fail "$1 holds a non-finite value"
    fi
}
# tensors FILE: the tensor bytes of a safetensors file (no header)
tensors() { tail -c +$((9 + $(od -An -tu8 -N8 "$1" | tr -d ' '))) "$1"; }
# step_of: the step named by the last "training diverged at step N"
step_of() { sed -n 's/.*training diverged at step \([0-9]*\):.*/\1/p' "$dir/err.log"; }

# -- stop (the default), one rank, checkpoint every step
expect_error 'training diverged at step ' ': loss is nan; params are those of step ' \
    -- "${TILDE[@]}" --set checkpoint_every=1 --checkpoint "$dir/stop"
n=$(step_of)
[ -n "$n" ] && [ "$n" -ge 3 ] || fail "the NaN batch is at step '$n' (expected >= 3)"
grep -qF "params are those of step $((n - 1)) (not updated" "$dir/err.log" ||
    fail "$(cat "$dir/err.log")"
[ ! -e "$dir/stop.step$n.safetensors" ] || fail "a checkpoint of the diverged step $n"
for k in $(seq 1 $((n - 1))); do finite "$dir/stop.step$k.safetensors"; done
last="$dir/stop.step$((n - 1)).safetensors"
echo "stop: diverged at step $n, checkpoints 1..$((n - 1)) finite"

# resuming from the last checkpoint works: the same batch stops it again at
# the same step; with skip it trains to the end
expect_error "training diverged at step $n: loss is nan" -- "${TILDE[@]}" --resume "$last"
grep -q "resumed from .* at step $((n - 1))" "$dir/err.log" || fail "$(cat "$dir/err.log")"
"${TILDE[@]}" --resume "$last" --set on_nonfinite=skip \
    --save-weights "$dir/resumed.safetensors" > "$dir/resumed.log" 2>&1 ||
    fail "resume with skip: $(cat "$dir/resumed.log")"
grep -q "^final: step 30 .* | skipped [1-9][0-9]* of $((30 - n + 1)) steps" "$dir/resumed.log" ||
    fail "resume with skip: $(cat "$dir/resumed.log")"
finite "$dir/resumed.safetensors"

# -- skip from the start: step n is reported and changes nothing (its
# checkpoint holds the tensors of step n-1, bit for bit); the run ends where
# stop + resume with skip ends
"${TILDE[@]}" --set on_nonfinite=skip --set checkpoint_every=1 --checkpoint "$dir/skip" \
    --save-weights "$dir/skip.safetensors" > "$dir/skip.log" 2>&1 ||
    fail "skip: $(cat "$dir/skip.log")"
grep -q "^step  *$n/30 | loss -\?nan .* | skipped: loss is nan, update not applied (1 so far)$" \
    "$dir/skip.log" || fail "skip: no skipped step $n: $(cat "$dir/skip.log")"
grep -q '^final: step 30 .* | skipped [1-9][0-9]* of 30 steps (loss or gradient norm not finite)$' \
    "$dir/skip.log" || fail "skip: $(grep final "$dir/skip.log")"
cmp <(tensors "$dir/skip.step$((n - 1)).safetensors") <(tensors "$dir/skip.step$n.safetensors") ||
    fail "skip: step $n changed params or optimizer state"
cmp "$last" "$dir/skip.step$((n - 1)).safetensors" || fail "skip: steps before $n differ from stop's"
cmp "$dir/skip.safetensors" "$dir/resumed.safetensors" || fail "skip: differs from stop + resume"
for f in "$dir"/skip.step*.safetensors "$dir/skip.safetensors"; do finite "$f"; done
echo "skip: step $n skipped, $(grep -o 'skipped [0-9]* of 30' "$dir/skip.log")"

# -- two ranks (batch 2 each) and two micro-batches (batch 2) see the rows
# of one rank at batch 4: the same step stops them, and with skip they end
# with the same val loss (a rank or micro-batch that updated alone would not)
val_loss() { sed -n 's/^final: .* | val loss \([^ ]*\) .*/\1/p' "$1"; }
same_val() { # log log
    local a b
    a=$(val_loss "$1")
    b=$(val_loss "$2")
    [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" \
        'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * (b < 0 ? -b : b)) }' ||
        fail "$1: val loss $a, $2: $b"
}
for how in "--nproc 2" "--set grad_accum=2"; do
    # shellcheck disable=SC2086
    expect_error "training diverged at step $n: loss is nan" \
        -- "${TILDE[@]}" --set batch=2 $how
    # shellcheck disable=SC2086
    "${TILDE[@]}" --set batch=2 $how --set on_nonfinite=skip > "$dir/split.log" 2>&1 ||
        fail "$how, skip: $(cat "$dir/split.log")"
    grep -q "^step  *$n/30 | loss -\?nan .* | skipped: loss is nan" "$dir/split.log" ||
        fail "$how: step $n not skipped: $(cat "$dir/split.log")"
    [ "$(grep -o 'skipped [0-9]* of 30' "$dir/split.log")" = \
      "$(grep -o 'skipped [0-9]* of 30' "$dir/skip.log")" ] || fail "$how: other steps skipped"
    same_val "$dir/split.log" "$dir/skip.log"
    echo "$how: stops at step $n, skips as one rank does"
done

# -- a non-finite gradient norm, the loss finite (gpt at lr 1e6): before,
# the step was applied and its checkpoint was NaN in every value
GPT=("$KILN" train models/gpt.lua --steps 6 --set warmup=0 --set lr=1e6 --set checkpoint_every=1)
expect_error 'training diverged at step ' ': gradient norm is ' 'params are those of step ' \
    -- "${GPT[@]}" --checkpoint "$dir/gpt"
n=$(step_of)
[ -n "$n" ] && [ "$n" -ge 2 ] || fail "gpt: diverged at step '$n'"
for f in "$dir"/gpt.step*.safetensors; do finite "$f"; done
[ ! -e "$dir/gpt.step$n.safetensors" ] || fail "gpt: a checkpoint of the diverged step $n"
"${GPT[@]}" --set on_nonfinite=skip --checkpoint "$dir/gskip" \
    --save-weights "$dir/gskip.safetensors" > "$dir/gskip.log" 2>&1 ||
    fail "gpt, skip: $(cat "$dir/gskip.log")"
grep -q "^step  *$n/6 | .* | skipped: gradient norm is" "$dir/gskip.log" ||
    fail "gpt, skip: $(cat "$dir/gskip.log")"
for f in "$dir"/gskip.step*.safetensors "$dir/gskip.safetensors"; do finite "$f"; done
echo "gpt: gradient norm not finite at step $n: stopped, or skipped"

# -- an update that overflows a param (loss, gradients and lr finite: lr
# 3e38 and weight decay 1 take fc1.weight past the largest f32) is never
# written: no checkpoint, no weights
expect_error 'training diverged by step 1: "fc1.weight" is not finite' 'no checkpoint written' \
    -- "$KILN" train models/mlp.lua --steps 2 --set warmup=0 --set lr=3e38 \
    --set weight_decay=1 --set checkpoint_every=1 --checkpoint "$dir/over"
expect_error 'training diverged by step 2: "fc1.weight" is not finite' 'no weights written' \
    -- "$KILN" train models/mlp.lua --steps 2 --set warmup=0 --set lr=3e38 \
    --set weight_decay=1 --set on_nonfinite=skip --save-weights "$dir/over.safetensors"
! ls "$dir"/over* > /dev/null 2>&1 || fail "an overflowed param was written: $(ls "$dir"/over*)"

# -- the setting's values
expect_error "--set on_nonfinite: expected one of stop, skip, got 'never'" \
    -- "${TILDE[@]}" --set on_nonfinite=never
sed 's/seed = 3}/seed = 3, on_nonfinite = "ignore"}/' "$dir/tilde.lua" > "$dir/bad_key.lua"
expect_error "$dir/bad_key.lua:12:" "on_nonfinite" "expected one of stop, skip, got 'ignore'" \
    -- "$KILN" train "$dir/bad_key.lua" --set "data_path=$dir/tilde.txt"
bad_input_done
