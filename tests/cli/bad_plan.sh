#!/bin/bash
# kiln plan: layouts the model cannot take and absurd sizes, each refused
# (exit 2) with a message naming the flag, what was expected and what was
# found, before anything is compiled (issue 38, item 5). Before: --tp 3 on
# gpt.lua's 2 heads "fits", --pp 8 planned 8 stages for 2 layers, and
# --pp 1000000 printed "params 0 B ... bubble 100.0%".
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

G=models/gpt.lua
plan=("$KILN" plan)
# tp must divide every attention's heads (gpt.lua: H 2; 124M: H 12)
expect_error -s 2 "--tp 3 does not divide the model's 2 attention heads" "models/gpt.lua:" \
    "expected a --tp that divides 2" -- "${plan[@]}" "$G" --gpus 3 --tp 3
expect_error -s 2 "--tp 4 does not divide the model's 2 attention heads" -- "${plan[@]}" "$G" --tp 4
expect_error -s 2 "--tp 8 does not divide the model's 12 attention heads" -- \
    "${plan[@]}" "$G" --set size=124M --gpus 64 --tp 8
# ... and both dims of every weight matrix: the MLP width (llama's hidden),
# the vocabulary (unpadded)
expect_error -s 2 "--tp 4 does not divide dim 1 (102)" '"layers.0.mlp.gate_proj.weight"' \
    "expected a --tp that divides 102" -- "${plan[@]}" models/llama.lua --set hidden=102 --tp 4
expect_error -s 2 "--tp 2 does not divide dim 0 (255)" '"wte.weight"' "vocab_pad" -- \
    "${plan[@]}" "$G" --set V=255 --tp 2
# the padded vocabulary splits
"${plan[@]}" "$G" --set V=255 --set vocab_pad=2 --tp 2 > "$dir/out" 2>&1 ||
    fail "V=255 padded to 256 at --tp 2: $(cat "$dir/out")"
case_recovered "a padded vocabulary splits"
# a schedule kiln does not know
expect_error -s 2 "--schedule expects 1f1b, gpipe or zb-h1, got 'zb'" -- "${plan[@]}" "$G" --schedule zb
# pp at most the stages kiln compile --pp can cut (each begins between
# layers, where one tensor crosses, and holds a param: gpt.lua 8, the
# embeddings, half-blocks, ln_f and the head; mlp.lua 3), and kiln compile
# refuses the same pp with the same message. Before, plan counted attention
# layers (gpt.lua: 2) and compile the places one tensor crosses, plus one
# (11: a stage of them could hold no param).
expect_error -s 2 "--pp 9: more stages than layers to put in them" \
    "expected --pp from 1 to 8" -- "${plan[@]}" "$G" --gpus 9 --pp 9
expect_error -s 1 "--pp 9: more stages than layers to put in them" "expected pp <= 8" -- \
    "$KILN" compile "$G" --pp 9
"${plan[@]}" "$G" --gpus 8 --pp 8 > "$dir/out" 2>&1 || fail "--pp 8 on gpt.lua: $(cat "$dir/out")"
"$KILN" compile "$G" --pp 8 > "$dir/out" 2>&1 || fail "compile --pp 8 on gpt.lua: $(cat "$dir/out")"
case_recovered "plan and compile cut gpt.lua into 8 stages"
expect_error -s 2 "--pp 1000000: more stages than layers to put in them" -- \
    "${plan[@]}" "$G" --pp 1000000
expect_error -s 2 "--pp 4: more stages than layers to put in them" "expected --pp from 1 to 3" -- \
    "${plan[@]}" models/mlp.lua --pp 4
expect_error -s 1 "--pp 4: more stages than layers to put in them" "expected pp <= 3" -- \
    "$KILN" compile models/mlp.lua --pp 4
# absurd sizes
expect_error -s 2 "--gpus: expected an integer from 1 to 1048576, got 2000000" -- \
    "${plan[@]}" "$G" --gpus 2000000
expect_error -s 2 "--tp: expected an integer from 1 to 1048576, got 0" -- "${plan[@]}" "$G" --tp 0
expect_error -s 2 "--dp: expected an integer from 1 to 1048576" -- "${plan[@]}" "$G" --dp 1e9
expect_error -s 2 "--tp 1024 x --pp 1024 x --dp 2 is 2097152 GPUs: expected at most 1048576" -- \
    "${plan[@]}" "$G" --tp 1024 --pp 1024 --dp 2
expect_error -s 2 "--tp 2 x --pp 1 x --dp 1 must equal --gpus 3" -- "${plan[@]}" "$G" --gpus 3 --tp 2 --dp 1
expect_error -s 2 "--micro-batches: expected an integer from 1 to 1048576" -- \
    "${plan[@]}" "$G" --micro-batches 1e12
expect_error -s 2 "--global-batch (sequences per step): expected an integer from 1 to 16777216" -- \
    "${plan[@]}" "$G" --global-batch 1e15
expect_error -s 2 "the model's batch 4 x --dp 1000 x --micro-batches 100000 is 4e+08 sequences per step" \
    "expected at most 16777216" -- "${plan[@]}" "$G" --dp 1000 --micro-batches 100000
expect_error -s 2 "the model's batch 1000000000 x --dp 1" "--set batch" -- \
    "${plan[@]}" "$G" --set batch=1000000000
expect_error -s 2 "--tokens expects a count" "from 1 to 1E (1e18), got '1e30'" -- \
    "${plan[@]}" "$G" --tokens 1e30
expect_error -s 2 "--tokens expects a count" "got '0.5'" -- "${plan[@]}" "$G" --tokens 0.5
# a layout the model takes still plans
out=$("${plan[@]}" "$G" --gpus 8 --tp 2 --pp 2 2>&1) || fail "tp 2 x pp 2 x dp 2: $out"
echo "$out" | grep -q '^plan: 8 x h200 (8 per node), tp 2 x pp 2 x dp 2' || fail "layout line: $out"
case_recovered "a layout the model takes"
bad_input_done
