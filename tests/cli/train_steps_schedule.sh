#!/bin/bash
# --steps N and --set steps=N mean the same to the schedule (issue 38, item
# 9): gpt.lua and llama.lua compute warmup and the cosine's end from their
# config key steps, and --steps sets it (before: --steps 20 trained inside a
# 100-step warmup, lr 3e-5 at step 1). The lr of every step, from
# metrics.jsonl, is the same either way and follows warmup = min(100,
# steps // 10); --steps wins over an earlier or later --set steps; a script
# without a config key steps still gets train.steps from --steps.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-steps-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

lrs() { # NAME ARGS...: the lr column of metrics.jsonl, one per line
    local name=$1
    shift
    "$KILN" train "$@" -q --set eval_every=0 --peak-gflops 100 --log-dir "$dir/$name" \
        > "$dir/$name.out" 2>&1 || fail "$name: $(cat "$dir/$name.out")"
    sed 's/.*"lr":\([^,]*\),.*/\1/' "$dir/$name/metrics.jsonl" > "$dir/$name.lr"
    [ "$(wc -l < "$dir/$name.lr")" -gt 0 ] || fail "$name: no lr in metrics.jsonl"
}
for m in gpt llama; do
    lrs "$m-flag" "models/$m.lua" --steps 20
    lrs "$m-set" "models/$m.lua" --set steps=20
    lrs "$m-both" "models/$m.lua" --set steps=2000 --steps 20
    cmp -s "$dir/$m-flag.lr" "$dir/$m-set.lr" ||
        fail "$m: --steps 20 and --set steps=20 give different schedules: $(paste "$dir/$m-flag.lr" "$dir/$m-set.lr" | head -5)"
    cmp -s "$dir/$m-flag.lr" "$dir/$m-both.lr" || fail "$m: --steps 20 does not win over --set steps=2000"
    [ "$(wc -l < "$dir/$m-flag.lr")" -eq 20 ] || fail "$m: not 20 steps"
    # warmup min(100, 20 // 10) = 2: step 1 at lr/2, step 2 at the peak
    peak=$(sed -n 's/^lr = //p' < <("$KILN" compile "models/$m.lua" --settings 2>/dev/null) | head -1)
    [ -n "$peak" ] || peak=$(grep -o 'steps = [0-9]*, lr = [0-9.e-]*' "models/$m.lua" | sed 's/.*lr = //')
    awk -v p="$peak" 'NR == 1 { ok1 = ($1 > 0.49 * p && $1 < 0.51 * p) }
                      NR == 2 { ok2 = ($1 > 0.99 * p && $1 < 1.01 * p) }
                      END { exit !(ok1 && ok2) }' "$dir/$m-flag.lr" ||
        fail "$m --steps 20: expected a 2-step warmup to lr $peak, got $(head -3 "$dir/$m-flag.lr" | tr '\n' ' ')"
done
# a script whose config has no key steps (mlp.lua with train{steps = 500}
# written out): --steps is train.steps
sed -e 's/ steps = 500,//' -e 's/steps = cfg.steps/steps = 500/' models/mlp.lua > "$dir/nosteps.lua"
grep -q 'config{.*steps' "$dir/nosteps.lua" && fail "nosteps.lua still has a config key steps"
out=$("$KILN" train "$dir/nosteps.lua" --steps 3 -q 2>&1) || fail "nosteps.lua --steps 3: $out"
echo "$out" | grep -q '^final: step 3 ' || fail "nosteps.lua --steps 3: $out"
echo "train_steps_schedule: ok"
