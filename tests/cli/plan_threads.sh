#!/bin/bash
# kiln train --nproc N gives each rank cores / N threads whatever the
# layout, tp x pp x dp (rt_dp_exec_opts), as kiln plan --device cpu costs
# each rank (docs/plan.md, "The cpu device"). The final line's MFU peak is
# the FMA peak of the threads the rank runs, so the runs at dp 2, tp 2 and
# pp 2 on 2 ranks print the same one. (Before, a tp = 2 or pp = 2 job on 2
# ranks gave each rank every core: twice the threads the machine has, and
# the peak of all of them.) On a 1-core machine every layout gets 1 thread
# either way and this checks nothing more than that the runs agree.
set -u
: "${KILN:?}"
command -v mpirun >/dev/null || { echo "plan_threads: no mpirun; skipped"; exit 0; }
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-plan-threads-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cfg=(models/gpt.lua --steps 2 -q --set L=2 --set H=2 --set C=32 --set T=16 --set batch=4
     --set eval_every=0)
# the figures of one rank's threads measured first, alone: two ranks that
# find no cached figures measure them both at once and may cache different ones
th=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
"$KILN" compile models/gpt.lua --target cpu --threads "$th" >"$dir/measure" 2>&1 ||
    fail "compile --target cpu --threads $th: $(cat "$dir/measure")"
peak() { sed -n 's/^final:.* MFU [0-9.]*% of \([0-9.]* [GT]FLOP\/s\).*/\1/p' "$1"; }
for lay in "dp" "tp --tp 2" "pp --pp 2"; do
    name=${lay%% *}
    # shellcheck disable=SC2086
    "$KILN" train "${cfg[@]}" --nproc 2 ${lay#"$name"} >"$dir/$name" 2>&1 ||
        fail "--nproc 2 $lay: $(cat "$dir/$name")"
    [ -n "$(peak "$dir/$name")" ] || fail "no MFU peak in the $name run: $(cat "$dir/$name")"
done
[ "$(peak "$dir/tp")" = "$(peak "$dir/dp")" ] ||
    fail "tp 2 ranks run on other threads than dp 2: peak $(peak "$dir/tp"), dp's $(peak "$dir/dp")"
[ "$(peak "$dir/pp")" = "$(peak "$dir/dp")" ] ||
    fail "pp 2 ranks run on other threads than dp 2: peak $(peak "$dir/pp"), dp's $(peak "$dir/dp")"
# and one rank alone runs on every core: its peak is another figure where
# the machine has 2 cores or more
one=$("$KILN" train "${cfg[@]}" 2>&1) || fail "one rank: $one"
echo "plan_threads: ok (2 ranks: $(peak "$dir/dp") each; 1 rank: $(echo "$one" | peak /dev/stdin))"
