#!/bin/bash
# kiln compile --dot FILE: the compiled graph for Graphviz. Checks that the
# file holds one cluster per layer (nested: h > h.0 > h.0.attn) and per fused kernel, one dashed node per recomputed op
# and one red hexagon per all-reduce op of the same compile's IR dump; that
# Graphviz reads it (when `dot` is installed); and that an unwritable path
# is an error that leaves nothing behind.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

args=(models/mlp.lua --nproc 2 --remat=full)
"$KILN" compile "${args[@]}" --dot "$dir/g.dot" > "$dir/out.log" 2>&1 ||
    fail "compile --dot failed: $(cat "$dir/out.log")"
grep -qF "graph written to $dir/g.dot" "$dir/out.log" || fail "no 'graph written' line"
"$KILN" compile "${args[@]}" --dump-after=schedule --dump-dir "$dir/d" > /dev/null 2>&1 ||
    fail "compile --dump-dir failed"
ir=$(ls "$dir"/d/*-schedule.ir)
groups=$(grep -o '!group=[0-9]*' "$ir" | sort -u | wc -l)
recompute=$(grep -c '!recompute' "$ir")
collectives=$(grep -cE '= allreduce_(start|wait) ' "$ir")
[ "$groups" -gt 0 ] && [ "$recompute" -gt 0 ] && [ "$collectives" -gt 0 ] ||
    fail "the IR dump lacks groups ($groups), recompute ($recompute) or collectives ($collectives)"
[ "$(grep -c '^  subgraph cluster_k' "$dir/g.dot")" = "$groups" ] ||
    fail "expected $groups kernel clusters, got $(grep -c '^  subgraph cluster_k' "$dir/g.dot")"
[ "$(grep -c 'color=darkorange' "$dir/g.dot")" = "$recompute" ] ||
    fail "expected $recompute recomputed ops, got $(grep -c 'color=darkorange' "$dir/g.dot")"
[ "$(grep -c 'shape=hexagon' "$dir/g.dot")" = "$collectives" ] ||
    fail "expected $collectives collective ops, got $(grep -c 'shape=hexagon' "$dir/g.dot")"
grep -q '^  subgraph cluster_b0 {' "$dir/g.dot" || fail "no cluster for bucket 0"
# every op and graph input is a node, every operand an edge
ops=$(grep -E '^%[0-9]+:[^=]*= [a-z_]+' "$ir" | grep -cvE '= (input|param|state) ')
[ "$(grep -cE '^ *o[0-9]+ \[label=' "$dir/g.dot")" = "$ops" ] ||
    fail "expected $ops op nodes, got $(grep -cE '^ *o[0-9]+ \[label=' "$dir/g.dot")"
# the same compile writes the same file
"$KILN" compile "${args[@]}" --dot "$dir/g2.dot" > /dev/null 2>&1 || fail "second compile failed"
cmp -s "$dir/g.dot" "$dir/g2.dot" || fail "two compiles wrote different graphs"
if command -v dot > /dev/null; then
    timeout 120 dot -Tsvg "$dir/g.dot" -o "$dir/g.svg" 2> "$dir/dot.log" ||
        fail "Graphviz rejects the file: $(cat "$dir/dot.log")"
    grep -q '<svg' "$dir/g.svg" || fail "Graphviz wrote no SVG"
else
    echo "note: Graphviz (dot) not installed; the file was not rendered"
fi
# ops grouped by layer: nested clusters named after the params' prefixes
for l in fc1 fc2 head; do
    grep -q "subgraph cluster_l[0-9]* {" "$dir/g.dot" && grep -q "label=\"$l\"; style=solid" "$dir/g.dot" ||
        fail "no layer cluster $l"
done
"$KILN" compile models/gpt.lua --dot "$dir/gpt.dot" > /dev/null 2>&1 || fail "compile gpt --dot"
for l in h h.0 h.0.attn h.1.mlp.c_fc wte ln_f; do
    grep -qF "label=\"$l\"; style=solid" "$dir/gpt.dot" || fail "gpt: no layer cluster $l"
done
# --dot-depth N: each layer N names deep (and each shallower leaf) is one
# node; no op is drawn by itself, the gradients go with their layers
"$KILN" compile models/gpt.lua --dot "$dir/gpt1.dot" --dot-depth 1 > /dev/null 2>&1 ||
    fail "compile gpt --dot-depth 1"
for l in wte wpe h ln_f; do
    grep -q "shape=folder.*label=\"$l\\\\n[0-9]* ops\"" "$dir/gpt1.dot" || fail "--dot-depth 1: no node for $l"
done
! grep -qE '^ *o[0-9]+ \[label=' "$dir/gpt1.dot" || fail "--dot-depth 1 drew single ops"
! grep -q 'output grad\.' "$dir/gpt1.dot" || fail "--dot-depth 1 drew gradient outputs"
grep -q 'output loss' "$dir/gpt1.dot" || fail "--dot-depth 1 lost the loss output"
"$KILN" compile models/gpt.lua --dot "$dir/gpt2.dot" --dot-depth 2 > /dev/null 2>&1 ||
    fail "compile gpt --dot-depth 2"
grep -q 'label="h"; style=solid' "$dir/gpt2.dot" && grep -q 'label="h.1\\n[0-9]* ops"' "$dir/gpt2.dot" ||
    fail "--dot-depth 2: no cluster h holding a node h.1"
if command -v dot > /dev/null; then
    timeout 120 dot -Tsvg "$dir/gpt1.dot" -o "$dir/gpt1.svg" || fail "Graphviz rejects --dot-depth 1"
    w=$(grep -o '<svg width="[0-9]*pt"' "$dir/gpt1.svg" | grep -o '[0-9]*')
    [ -n "$w" ] && [ "$w" -lt 1500 ] || fail "--dot-depth 1 of gpt is ${w}pt wide (expected under 1500)"
fi
expect_error -s 2 "--dot-depth needs --dot FILE" -- "$KILN" compile models/mlp.lua --dot-depth 2
expect_error -s 2 "--dot-depth: expected an integer from 1 to 64" -- \
    "$KILN" compile models/mlp.lua --dot "$dir/x.dot" --dot-depth 0
# an unwritable target: an error naming it, no temp file left
mkdir "$dir/adir"
expect_error "$dir/adir: cannot write" -- "$KILN" compile models/mlp.lua --dot "$dir/adir"
expect_error -s 2 "--dot expects a file name" -- "$KILN" compile models/mlp.lua --dot=
bad_input_done
