#!/bin/bash
# kiln compile --dot FILE: the compiled graph for Graphviz. Checks that the
# file holds one cluster per fused kernel, one dashed node per recomputed op
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
# an unwritable target: an error naming it, no temp file left
mkdir "$dir/adir"
expect_error "$dir/adir: cannot write" -- "$KILN" compile models/mlp.lua --dot "$dir/adir"
expect_error -s 2 "--dot expects a file name" -- "$KILN" compile models/mlp.lua --dot=
bad_input_done
