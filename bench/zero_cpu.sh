#!/bin/bash
# ZeRO-1 on 2 CPU ranks: exposed communication per step with zero=0 and
# zero=1 (issue 18's goal: zero=1 at most 1.2x zero=0), each run ROUNDS
# times alternating, and the ratio of the medians.
#
#   bench/zero_cpu.sh [KILN] [STEPS] [ROUNDS] [GRAD_ACCUM] [BATCH]
#
# gpt.lua at L=4 C=256 H=4 T=64 batch=BATCH bucket_mb=1 (3.2 M params, 13
# buckets: the config docs/distributed.md measures overlap on), --nproc 2,
# grad_accum GRAD_ACCUM (default 1). BATCH defaults to 1, where the
# communication is the largest share of the step (15-18 ms of a 40-45 ms
# step busy with zero=0); at batch 4 both settings hide it all in the
# median step. STEPS defaults to 100 and ROUNDS to 5: the exposed times are
# tenths of a millisecond, and a run of 20 steps moves its median by more.
# Per run: kiln train's summary line (median over its steps of exposed and
# busy communication ms, step ms; and the mean of the steps' exposed ms,
# which counts the few steps that stall where most wait for nothing and
# the median is 0); zero=1 also prints the split per
# collective, and the last line gives the all-gathers' exposed ms per step
# (they should hide behind the next forward: with GRAD_ACCUM > 1, the first
# micro-batch's). The last column is the median time of the loss's mean
# over the ranks that `kiln train` runs after each step (rank 0's trace,
# --trace): a wait no exposed figure counts, so a collective that delays it
# (zero=1's all-gathers did, docs/distributed.md step 9) shows there. The
# figures above are rank 0's; the "worst rank" lines take, per run, the
# largest over the ranks of the median and of the mean (kiln train's
# "comm by rank" line): with zero=1 a rank waits for the buckets of its
# own shard, and the ranks' shards end the backward differently. On a
# busy machine the numbers move a lot: compare the ratio, and run again.
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-100}
rounds=${3:-5}
accum=${4:-1}
batch=${5:-1}
log=$(mktemp "${TMPDIR:-/tmp}/kiln-bench-zero-XXXXXX")
tdir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-bench-zero-trace-XXXXXX")
trap 'rm -rf "$log" "$tdir"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

run() { # ZERO: one kiln train; prints "exposed busy step all-gather-exposed loss-mean mean-exposed
    #   worst-rank-exposed worst-rank-mean-exposed" (ms; - for zero=0)
    "$kiln" train models/gpt.lua --steps "$steps" -q --nproc 2 --set L=4 --set C=256 \
        --set H=4 --set T=64 --set batch="$batch" --set bucket_mb=1 --set grad_accum="$accum" \
        --set zero="$1" --trace "$tdir/t.json" >"$log" 2>&1 ||
        { cat "$log" >&2; exit 1; }
    local ex busy st ag mx
    ex=$(sed -n 's/^comm:.*| exposed \([0-9.]*\) ms.*/\1/p' "$log")
    mx=$(sed -n 's/^comm:.*| mean exposed \([0-9.]*\) ms.*/\1/p' "$log")
    busy=$(sed -n 's/^comm:.*communication \([0-9.]*\) ms.*/\1/p' "$log")
    st=$(sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' "$log")
    ag=$(sed -n 's/^comm by collective.*all-gather [0-9.]* ms, exposed \([0-9.]*\) ms.*/\1/p' "$log")
    lm=$(grep '"name":"allreduce host"' "$tdir/t.json" |
        sed -n 's/.*"dur":\([0-9.]*\).*/\1/p' | awk '{ print $1 / 1000 }' | median)
    # the largest over the ranks of the median and of the mean
    wx=$(sed -n 's/^comm by rank[^:]*://p' "$log" | tr '|' '\n' |
        awk '{ if ($3 > m) m = $3; if ($5 > a) a = $5 } END { print m + 0, a + 0 }')
    grep '^comm by collective' "$log" >&2 || true
    echo "$ex $busy $st ${ag:--} ${lm:--} $mx $wx"
}

echo "gpt.lua L=4 C=256 T=64 batch=$batch grad_accum=$accum, 2 CPU ranks, $steps steps per run, $rounds runs each (load: $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-7s %22s %22s %18s %22s\n' zero "exposed ms (runs)" "comm busy ms (runs)" "step ms (runs)" \
    "loss mean ms (runs)"
declare -A ex busy st lm mx wm wa
ags=""
for ((r = 0; r < rounds; r++)); do
    for z in 0 1; do
        read -r e b s a l m w1 w2 < <(run "$z")
        ex[$z]+="$e " busy[$z]+="$b " st[$z]+="$s " lm[$z]+="$l " mx[$z]+="$m " wm[$z]+="$w1 " wa[$z]+="$w2 "
        [ "$z" = 1 ] && ags+="$a "
    done
done
for z in 0 1; do
    printf '%-7s %22s %22s %18s %22s\n' "$z" "${ex[$z]}" "${busy[$z]}" "${st[$z]}" "${lm[$z]}"
done
m0=$(printf '%s\n' ${ex[0]} | median)
m1=$(printf '%s\n' ${ex[1]} | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3fx", a / b; else if (a > 0) print "inf"; else print "- (both 0)" }'; }
echo "median exposed: zero=0 $m0 ms, zero=1 $m1 ms; zero=1 / zero=0 = $(ratio "$m1" "$m0") (goal: <= 1.2x)"
for z in 0 1; do
    printf 'mean exposed per step, zero=%s (runs): %s\n' "$z" "${mx[$z]}"
done
a0=$(printf '%s\n' ${mx[0]} | median)
a1=$(printf '%s\n' ${mx[1]} | median)
echo "median of the runs' mean exposed: zero=0 $a0 ms, zero=1 $a1 ms; zero=1 / zero=0 = $(ratio "$a1" "$a0")"
for z in 0 1; do
    printf 'worst rank, zero=%s (runs): median exposed %s| mean exposed %s\n' "$z" "${wm[$z]}" "${wa[$z]}"
done
w0=$(printf '%s\n' ${wm[0]} | median)
w1=$(printf '%s\n' ${wm[1]} | median)
v0=$(printf '%s\n' ${wa[0]} | median)
v1=$(printf '%s\n' ${wa[1]} | median)
echo "worst rank, median of the runs: median exposed zero=0 $w0 ms, zero=1 $w1 ms ($(ratio "$w1" "$w0")); mean exposed zero=0 $v0 ms, zero=1 $v1 ms ($(ratio "$v1" "$v0"))"
echo "zero=1 all-gather exposed per step (runs): $ags(median $(printf '%s\n' $ags | median) ms)"
s0=$(printf '%s\n' ${st[0]} | median)
s1=$(printf '%s\n' ${st[1]} | median)
l0=$(printf '%s\n' ${lm[0]} | median)
l1=$(printf '%s\n' ${lm[1]} | median)
echo "median step: zero=0 $s0 ms, zero=1 $s1 ms; median loss mean: zero=0 $l0 ms, zero=1 $l1 ms"
