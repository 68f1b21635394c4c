#!/usr/bin/env bash
# pp_zero.sh - ZeRO-1 under pipeline stages (runtime/dist/pp.c): each
# stage's gradients reduce-scattered over its dp group (not all-reduced),
# its AdamW state sharded there, and checkpoints of such runs:
#   - pp 2 x dp 2 with zero = 1 on 4 ranks against one rank at the whole
#     batch: losses within 1e-5 relative at every step, weights within 1e-5
#     relative per tensor; the summary names the reduce-scatter;
#   - its checkpoint holds one rank's tensors (the same names and shapes as
#     one rank's checkpoint at that step: params, adam.step, adam.m.P and
#     adam.v.P whole), values within 1e-5 relative of one rank's;
#   - resume: at the same layout, the unbroken run's weights to the bit; at
#     one rank, at dp 2 with zero = 1 (no pp) and one rank's checkpoint at
#     pp 2 x dp 2 with zero = 1: the unbroken run's losses (1e-5 relative)
#     and weights (1e-5 relative per tensor);
#   - MPI calls in pieces of 1000 (KILN_MPI_CHUNK) give the same weights
#     to the bit.
# gpt's key bias: see tests/cli/tp.sh (compared to 1e-3 absolute).
set -u
. tests/cli/lib/train_runs.sh # $KILN, $T, fail, run, losses, same_losses, same_params

GPT="models/gpt.lua --steps 10 --set eval_every=0 --set checkpoint_every=5"
PPZ="--nproc 4 --pp 2 --set micro_batches=2 --set zero=1"

# tail_losses A B: A's steps (a resumed run's) are B's last ones, losses
# within 1e-5 relative
tail_losses() {
    local n
    n=$(losses "$1" | wc -l)
    [ "$n" -ge 2 ] || fail "$1: $n step lines"
    local e
    e=$(awk -v n="$n" 'FNR == NR { b[$1] = $2; next }
        !($1 in b) { print "missing"; x = 1; exit }
        { d = $2 - b[$1]; if (d < 0) d = -d; r = b[$1] < 0 ? -b[$1] : b[$1]; e = d / r
          if (e > m) m = e; k++ }
        END { if (!x) { if (k != n) print "missing"; else printf "%.3g\n", m } }' \
        <(losses "$2") <(losses "$1"))
    echo "$1 vs $2: $n steps, loss rel diff $e"
    awk -v e="$e" 'BEGIN { exit !(e != "" && e + 0 == e && e < 1e-5) }' ||
        fail "$1 vs $2: losses differ by $e"
}

run one $GPT --set grad_accum=4 --checkpoint "$T/c1.safetensors" \
    --save-weights "$T/one.safetensors"
run ppz $GPT $PPZ --checkpoint "$T/cz.safetensors" --save-weights "$T/ppz.safetensors"
same_losses ppz one
same_params "$T/one.safetensors" "$T/ppz.safetensors" 32
grep -q "^pipeline: dp = 2 | the gradients' mean over dp after the micro-batches (reduce-scatter," \
    "$T/ppz.log" || fail "ppz: no reduce-scatter over dp: $(grep '^pipeline: dp' "$T/ppz.log")"
# MPI calls in pieces (runtime/dist/mpi.c, rt_mpi_chunk: counts over 2^30
# go in pieces; KILN_MPI_CHUNK=1000 makes every reduce-scatter, tied
# all-reduce, stage send and receive and broadcast here go in pieces of
# 1000): the same weights to the bit
KILN_MPI_CHUNK=1000 run ppzc $GPT $PPZ --save-weights "$T/ppzc.safetensors"
cmp -s "$T/ppz.safetensors" "$T/ppzc.safetensors" ||
    fail "ppzc: MPI calls in pieces of 1000 changed the weights"

# the checkpoint: one rank's layout (the same tensors, shapes and dtypes),
# the moments whole
for s in 5 10; do
    [ -f "$T/cz.step$s.safetensors" ] || fail "no checkpoint at step $s: $(ls "$T")"
    same_params "$T/c1.step$s.safetensors" "$T/cz.step$s.safetensors" 32
done
python3 - "$T/cz.step5.safetensors" <<'EOF' || fail "checkpoint lacks whole moments"
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
h = json.loads(b[8:8 + struct.unpack('<Q', b[:8])[0]])
for k in ('adam.m.wte.weight', 'adam.v.h.1.mlp.c_fc.weight', 'adam.step'):
    assert k in h, k
assert h['adam.m.wte.weight']['shape'] == h['wte.weight']['shape']
assert not any(k in ('adam.m', 'adam.v') for k in h), 'a shard in the file'
EOF

# resume at the same layout: the unbroken run to the bit
run rz $GPT $PPZ --resume "$T/cz.step5.safetensors" --save-weights "$T/rz.safetensors"
grep -q "resumed from" "$T/rz.log" || fail "rz did not resume"
tail_losses rz ppz
cmp -s "$T/rz.safetensors" "$T/ppz.safetensors" ||
    fail "pp 2 x dp 2 zero = 1 resumed at its own layout: weights differ from the unbroken run's"
# at one rank, at dp 2 with zero = 1 (no pp); one rank's checkpoint at pp 2 x dp 2 zero = 1
run r1 $GPT --set grad_accum=4 --resume "$T/cz.step5.safetensors" --save-weights "$T/r1.safetensors"
run rd $GPT --nproc 2 --set grad_accum=2 --set zero=1 --resume "$T/cz.step5.safetensors" \
    --save-weights "$T/rd.safetensors"
run r1z $GPT $PPZ --resume "$T/c1.step5.safetensors" --save-weights "$T/r1z.safetensors"
for f in r1 rd r1z; do
    grep -q "resumed from" "$T/$f.log" || fail "$f did not resume"
    tail_losses $f one
    same_params "$T/one.safetensors" "$T/$f.safetensors" 32
done
echo "pp_zero.sh: ok"
