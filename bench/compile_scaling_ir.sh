#!/bin/bash
# Instructions executed per stage of a compile as the model gets deeper: the
# same Llama-style model as bench/compile_scaling.sh (C=16384, T=8192,
# batch 1, shapes only) at L = 12, 24, 48 and 96, one compile each under
# valgrind's callgrind, with the growth per doubling of L (2.0: linear). An
# instruction count does not change with the load of a shared machine, where
# CPU time does (by 2x and more on a 2-core machine that other jobs load);
# it leaves out cache misses, which make the time grow a little faster.
#
# A stage is the inclusive count of its entry function: fe_load_model (the
# Lua script), each pass's function (without the verifier pass_run calls
# after it: the verify row sums those), cg_plan (codegen, with its own
# memplan), and memplan_all, every pass_memplan_storage call (the memplan
# pass and cg_plan's). Exits 77 when valgrind is absent.
#
#   bench/compile_scaling_ir.sh [BUILD] [MAX_L]       (defaults build, 96)
set -euo pipefail
build=${1:-build}
max=${2:-96}
bin=$build/bench/bench_compile
[ -x "$bin" ] || { echo "no $bin: build first (cmake --build $build)"; exit 1; }
command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null ||
    { echo "valgrind (callgrind) not found"; exit 77; }
out=$(mktemp -d "${TMPDIR:-/tmp}/kiln-scaling-ir-XXXXXX")
trap 'rm -rf "$out"' EXIT

stages="fe_load_model:frontend pass_attention:attention pass_autodiff:autodiff
pass_optimizer:optimizer pass_simplify:simplify pass_remat:remat pass_fuse:fuse
pass_comm:comm pass_schedule:schedule pass_memplan_run:memplan cg_plan:codegen
ir_verify:verify pass_memplan_storage:memplan_all PROGRAM:total"
Ls=()
for L in 12 24 48 96; do
    [ "$L" -le "$max" ] || break
    Ls+=("$L")
    valgrind --tool=callgrind --callgrind-out-file="$out/$L.cg" "$bin" models/llama.lua \
        --set L="$L" --set H=128 --set C=16384 --set T=8192 --set batch=1 --set V=32000 \
        --reps 1 >/dev/null 2>&1
    # "N (P%)  file:function [object]" -> "function N", first (inclusive) line per name
    callgrind_annotate --threshold=100 --inclusive=yes "$out/$L.cg" 2>/dev/null |
        awk '/^ *[0-9,]+ \( *[0-9.]+%\)  / { n = $1; gsub(",", "", n); f = "";
             for (i = 2; i < NF && f == ""; i++) if ($i ~ /%\)$/) f = $(i + 1);
             sub(/.*:/, "", f); if (!(f in seen)) { seen[f] = 1; print f, n } }' >"$out/$L.txt"
done
echo "models/llama.lua, C=16384, T=8192, batch 1, V=32000: millions of instructions (callgrind)"
printf '%-13s' "Minstr"
for L in "${Ls[@]}"; do printf '%10s' "L=$L"; done
printf '%s\n' "   growth per doubling"
for st in $stages; do
    fn=${st%%:*} name=${st##*:}
    printf '%-13s' "$name"
    prev="" growth=""
    for L in "${Ls[@]}"; do
        v=$(awk -v f="$fn" '$1 == f { printf "%.1f", $2 / 1e6 }' "$out/$L.txt")
        v=${v:-0.0}
        printf '%10s' "$v"
        if [ -n "$prev" ]; then
            growth="$growth $(awk -v a="$prev" -v b="$v" \
                'BEGIN { if (a < 1) printf "  -"; else printf "%4.2f", b / a }')"
        fi
        prev=$v
    done
    printf '   %s\n' "$growth"
done
