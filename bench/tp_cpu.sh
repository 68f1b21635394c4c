#!/bin/bash
# `kiln plan` against the clock for tensor parallelism (issue 39): gpt.lua at
# tp = 2 on 2 CPU ranks of this machine. kiln plan compiles the step
# partitioned (rank 0's graph, docs/parallel.md) and costs its compute with
# the cpu device's measured figures and its TP collectives with the measured
# TP link (alpha-beta ring fitted to MPI's non-blocking all-reduce on a TP
# group, runtime/dist/measure_mpi.c); `kiln train --nproc 2 --tp 2`
# measures the step (its final line's median) and, from its
# `tensor-parallel comm:` line, the TP collectives' time per step:
#   - with `--set tp_overlap=false` each collective is waited for right
#     after its start, so its start-to-completion time is its whole time:
#     compared with kiln plan's TP collectives; and without the wait for
#     the other rank (its skew: each collective at the later-arriving
#     rank's time, from both ranks' --trace files), which the link's
#     measurement (every rank starting together) leaves out;
#   - overlapped (the default), the exposed part (the waits at the first
#     readers): compared with kiln plan's TP exposed (what the compute up
#     to each first reader does not hide). The overlapped run's
#     start-to-completion time is printed too, for reference only: the
#     executor sees a collective complete only when it polls between
#     steps, so it includes compute.
# Goal: within 25%.
# The config is wide in activations (B x T x C) so that the all-reduces are
# a visible share of the step.
#
# The cpu device's figures are measured once and cached; the training runs
# are repeated ROUNDS times and the medians compared. One more row puts the
# one-rank step (no MPI) beside the cost model's compute. Timings on a
# shared machine are noisy: the load average is printed.
#
#   bench/tp_cpu.sh [KILN] [STEPS] [ROUNDS]
set -euo pipefail
kiln=${1:-build/kiln}
steps=${2:-30}
rounds=${3:-3}
cfg=(--set L=2 --set H=4 --set C=256 --set T=64 --set batch=8)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tp-cpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
json() { sed -n "s/^[[:space:]]*\"$1\":[[:space:]]*\([-0-9.e+]*\),\?$/\1/p" | head -1; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
"$kiln" plan models/gpt.lua --device cpu --tp 2 --gpus 2 "${cfg[@]}" | grep -E '^plan|TP' || true
"$kiln" plan models/gpt.lua --device cpu --tp 2 --gpus 2 "${cfg[@]}" --json >"$tmp/plan"
"$kiln" compile models/gpt.lua --target cpu --threads 1 "${cfg[@]}" >"$tmp/one-pred"

# late RANK0.json RANK1.json N: per step (N TP collectives), their time
# without the wait for the other rank: each collective of a
# tp_overlap=false run counted at the later-arriving rank's time (the
# smaller of the two ranks' waits, from the traces' TP track, which holds
# the first 20 steps), and rank 0's own time over the same steps; the
# medians over the traced steps but the first 2
late() {
    python3 - "$1" "$2" "$3" <<'EOF'
import json, statistics, sys
def tp(p):
    d = json.load(open(p))
    ev = d['traceEvents'] if isinstance(d, dict) else d
    return sorted((e for e in ev if e.get('tid') == 5 and e.get('ph') == 'X'),
                  key=lambda e: e['ts'])
a, b, per = tp(sys.argv[1]), tp(sys.argv[2]), int(sys.argv[3])
n = min(len(a), len(b))
late = [sum(min(a[i]['dur'], b[i]['dur']) for i in range(s, s + per)) / 1e3
        for s in range(2 * per, n - per + 1, per)]
whole = [sum(a[i]['dur'] for i in range(s, s + per)) / 1e3
         for s in range(2 * per, n - per + 1, per)]
print('%.3f %.3f' % (statistics.median(late), statistics.median(whole)) if late else 'nan nan')
EOF
}
for r in $(seq "$rounds"); do
    "$kiln" train models/gpt.lua --nproc 2 --tp 2 --steps "$steps" -q "${cfg[@]}" \
        >"$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
    sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' "$tmp/out" >>"$tmp/step"
    sed -n 's/^tensor-parallel comm:.*, \([0-9.]*\) ms, [0-9.]* ms exposed$/\1/p' "$tmp/out" >>"$tmp/tp"
    sed -n 's/^tensor-parallel comm:.*, \([0-9.]*\) ms exposed$/\1/p' "$tmp/out" >>"$tmp/tpx"
    "$kiln" train models/gpt.lua --nproc 2 --tp 2 --steps "$steps" -q "${cfg[@]}" \
        --set tp_overlap=false --trace "$tmp/tr.json" >"$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
    late "$tmp/tr.json" "$tmp/tr.rank1.json" \
        "$(sed -n 's/^tensor-parallel comm:.*this rank): \([0-9]*\) collectives.*/\1/p' "$tmp/out")" \
        >>"$tmp/tp-late"
    sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' "$tmp/out" >>"$tmp/step-serial"
    sed -n 's/^tensor-parallel comm:.*, \([0-9.]*\) ms, [0-9.]* ms exposed$/\1/p' "$tmp/out" >>"$tmp/tp-serial"
    "$kiln" train models/gpt.lua --threads 1 --steps "$steps" -q "${cfg[@]}" 2>&1 |
        sed -n 's/^final:.*median \([0-9.]*\) ms\/step.*/\1/p' >>"$tmp/step-one"
done

row() { # name predicted_ms measured_ms
    awk -v n="$1" -v p="$2" -v m="$3" \
        'BEGIN { printf "%-36s %12.2f %12.2f %7.2f\n", n, p, m, (m > 0 ? p / m : 0) }'
}
printf '%-36s %12s %12s %7s\n' "gpt.lua L2 H4 C256 T64 B8, tp 2" "predicted ms" "measured ms" "ratio"
ps=$(json predicted_s <"$tmp/plan")
pt=$(json tp_per_microbatch_s <"$tmp/plan")
px=$(json tp_exposed_per_microbatch_s <"$tmp/plan")
ms() { awk -v x="$1" 'BEGIN { print 1e3 * x }'; }
row "2 ranks: step (TP overlapped)" "$(ms "$ps")" "$(median <"$tmp/step")"
row "2 ranks: TP comm, tp_overlap=false" "$(ms "$pt")" "$(median <"$tmp/tp-serial")"
row "  without the wait for the peer" "$(ms "$pt")" "$(cut -d' ' -f1 "$tmp/tp-late" | median)"
echo "  (that over traced steps 3-20; rank 0's whole time over them:" \
     "$(cut -d' ' -f2 "$tmp/tp-late" | median) ms)"
row "2 ranks: TP exposed, overlapped" "$(ms "$px")" "$(median <"$tmp/tpx")"
echo "  (step with tp_overlap=false: $(median <"$tmp/step-serial") ms; overlapped TP start to" \
     "completion: $(median <"$tmp/tp") ms)"
p1=$(sed -n 's/^predicted step on cpu .*: \([0-9.]*\) \(s\|ms\|us\)$/\1 \2/p' "$tmp/one-pred" |
     awk '{ v = $1; if ($2 == "s") v *= 1e3; if ($2 == "us") v /= 1e3; print v }')
row "1 rank, 1 thread: step (no MPI)" "$p1" "$(median <"$tmp/step-one")"
echo "medians of $rounds runs of $steps steps each; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
