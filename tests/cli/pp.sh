#!/usr/bin/env bash
# pp.sh - pipeline stages (--pp, passes/stages.c, runtime/dist/pp.c) against
# one rank:
#   - gpt.lua (tied wte: embedding on stage 0, head on stage 1) and
#     llama.lua at pp = 2 on 2 ranks with m micro-batches, against one rank
#     at grad_accum = m (the same global batch): the loss within 1e-5
#     relative at every one of 20 steps, every saved param within 1e-5
#     relative (whole tensors, written by stage 0 in one rank's layout);
#   - pp = 2 x dp = 2 and pp = 2 x tp = 2 on 4 ranks (pp 2 x dp 2 also
#     with zero = 1: each stage's AdamW state sharded over its dp group,
#     half the stage's params per rank), tp 2 x pp 2 x dp 2
#     on 8, against one rank at the whole batch (tp x pp: its checkpoint
#     resumes on one rank with the run's weights);
#   - the final validation loss (F alone through the stages) as one rank's;
#   - dropout = 0.1: the same losses, weights and validation losses as one
#     rank (each stage draws one rank's masks; evaluation without dropout);
#   - remat per stage (--remat full, --memory-budget): the same losses as
#     one rank, stage 0 recomputing activations and stashing fewer bytes
#     per micro-batch, an infeasible budget named per stage;
#   - --log-dir: stage 0 writes metrics.jsonl and report.html, every
#     step's loss, gradient norm and lr as one rank's;
#   - gpipe, 1f1b and zb-h1 give the same losses, to the last printed digit
#     (the same F, B and W programs in another order; gradients summed in
#     micro-batch order by all), zb-h1 and 1f1b the same weights' bytes;
#     the micro-batches each holds at once, and what stage 1 stashes;
#   - the `stages` dump (pp 2 x m 4, pp 4 x m 8): each micro-batch's F, B
#     and W once per stage in that order, W's in micro-batch order, every
#     send paired with a receive on the neighbour, no stage holding more
#     micro-batches than the schedule allows;
#   - checkpoints hold whole tensors (stage 0 writes every stage's): pp = 2
#     resumes at pp = 1 and 1 at 2 as the unbroken run goes on;
#   - --init-from gives each stage its params of whole weights;
#   - pp_stage hints (tests/data/pp_hint.lua) move the cut, and train as
#     one rank does;
#   - --pp-balance time at pp 2 x dp 2 = one rank;
#   - user errors: ranks that tp x pp does not divide, more stages than
#     layers (the cut leaves no stage without params), micro_batches and
#     grad_accum both set, flags pp does not run with yet,
#     hints out of range, out of order or inside a layer (naming the
#     script line).
# gpt's key bias: see tests/cli/tp.sh (compared to 1e-3 absolute).
set -u
. tests/cli/lib/train_runs.sh # $KILN, $T, fail, expect, run, losses, same_losses, same_params

GPT="models/gpt.lua --steps 20 --set eval_every=0"
LLAMA="models/llama.lua --steps 20 --set eval_every=0"

# --- numerics at pp = 2 -------------------------------------------------------
run gpt1 $GPT --set grad_accum=4 --save-weights "$T/gpt1.safetensors" --log-dir "$T/L1"
run gpt2 $GPT --nproc 2 --pp 2 --set micro_batches=4 --save-weights "$T/gpt2.safetensors" \
    --log-dir "$T/L2"
same_losses gpt2 gpt1
same_params "$T/gpt1.safetensors" "$T/gpt2.safetensors" 32
grep -q "^weights: " "$T/gpt2.log" || fail "gpt2 wrote no weights"

# --log-dir: stage 0 writes one rank's files; every step's loss and
# gradient norm (the global one, over both stages) as one rank's
python3 - "$T/L1" "$T/L2" <<'PY' || fail "--log-dir under pp differs from one rank's"
import json, sys
a, b = ([json.loads(l) for l in open(d + '/metrics.jsonl')] for d in sys.argv[1:])
assert len(a) == len(b) == 20, (len(a), len(b))
for x, y in zip(a, b):
    assert x['step'] == y['step'], (x, y)
    for k in ('loss', 'grad_norm', 'lr'):
        assert abs(x[k] - y[k]) <= 1e-5 * abs(x[k]), (k, x, y)
html = open(sys.argv[2] + '/report.html').read()
assert 'data-series="train loss' in html and 'data-series="grad_norm' in html
assert '<h2>Profile' not in html  # the stage's programs are not profiled
print('--log-dir: 20 steps, loss, grad_norm and lr as one rank\'s')
PY

# the validation loss (the forward through both stages) as one rank's
vl() { sed -n 's/^final: .* val loss \([0-9.e+-]*\) .*/\1/p' "$T/$1.log"; }
awk -v a="$(vl gpt2)" -v b="$(vl gpt1)" 'BEGIN { d = a - b; if (d < 0) d = -d;
    exit !(a != "" && b > 0 && d / b < 1e-5) }' || fail "val loss $(vl gpt2) at pp = 2, $(vl gpt1) on one rank"
echo "val loss: $(vl gpt2) at pp = 2, $(vl gpt1) on one rank"

run gpt2g $GPT --nproc 2 --pp 2 --set micro_batches=4 --set schedule=gpipe
[ "$(losses gpt2g)" = "$(losses gpt2)" ] || fail "gpipe and 1f1b losses differ"
run gpt2z $GPT --nproc 2 --pp 2 --set micro_batches=4 --set schedule=zb-h1 \
    --save-weights "$T/gpt2z.safetensors"
[ "$(losses gpt2z)" = "$(losses gpt2)" ] || fail "zb-h1 and 1f1b losses differ"
cmp -s "$T/gpt2z.safetensors" "$T/gpt2.safetensors" || fail "zb-h1 and 1f1b weights differ"
echo "gpipe, 1f1b and zb-h1: the same losses (zb-h1 and 1f1b: the same weights, byte for byte)"
# memory follows the schedule: 1f1b holds p - s micro-batches on stage s;
# zb-h1's table p on each (stage 1's W part only past B), but stage 1's W
# part is most of its stash, so kiln plan's cap (1.10 x 1f1b's peak) keeps
# none of its W's waiting: 1 micro-batch, as 1f1b; stage 1's stash per
# micro-batch leaves out its broadcast constants and elementwise
# intermediates (made again by B and W): 705.5 KiB here, 1.19 MiB when they
# were stashed
grep -q '^pipeline memory: stage 0 holds 2 micro-batches .* stage 1 holds 1 micro-batches' "$T/gpt2.log" ||
    fail "1f1b holds: $(grep '^pipeline memory' "$T/gpt2.log")"
grep -q '^pipeline memory: stage 0 holds 2 micro-batches .* stage 1 holds 1 micro-batches' "$T/gpt2z.log" ||
    fail "zb-h1 holds: $(grep '^pipeline memory' "$T/gpt2z.log")"
held=$(sed -n 's/^pipeline memory: .* stage 1 holds 1 micro-batches (\([0-9.]*\) KiB).*/\1/p' "$T/gpt2.log")
awk -v h="$held" 'BEGIN { exit !(h != "" && h < 900) }' ||
    fail "stage 1 stashes more than 900 KiB per micro-batch: $(grep '^pipeline memory' "$T/gpt2.log")"
echo "memory: $(grep '^pipeline memory' "$T/gpt2z.log")"

# dropout: each stage draws one rank's masks (a random op's numbers depend
# on its key, the seed and the step); evaluation runs the evaluation
# graph's stages (dropout off), cut where training is
run drop1 models/gpt.lua --steps 10 --set eval_every=5 --set dropout=0.1 --set grad_accum=4 \
    --save-weights "$T/drop1.safetensors"
run drop2 models/gpt.lua --steps 10 --set eval_every=5 --set dropout=0.1 --nproc 2 --pp 2 \
    --set micro_batches=4 --save-weights "$T/drop2.safetensors"
same_losses drop2 drop1
same_params "$T/drop1.safetensors" "$T/drop2.safetensors" 32
vls() { sed -n 's/^eval .*val loss \([0-9.e+-]*\).*/\1/p; s/^final: .* val loss \([0-9.e+-]*\) .*/\1/p' "$T/$1.log"; }
[ "$(vls drop2 | wc -l)" -ge 2 ] || fail "drop2: expected 2 validation losses, got: $(vls drop2 | tr '\n' ' ')"
paste <(vls drop2) <(vls drop1) | awk '{ d = $1 - $2; if (d < 0) d = -d; if (!($2 > 0 && d / $2 < 1e-5)) exit 1 }' ||
    fail "dropout: val losses $(vls drop2 | tr '\n' ' ') at pp = 2, $(vls drop1 | tr '\n' ' ') on one rank"
echo "dropout: the same losses, weights and val losses ($(vls drop2 | tr '\n' ' '))"

# remat per stage: on each stage's differentiated graph before the split
# (recomputations go to B and W), a budget checked per stage; the same
# losses, a smaller stash per micro-batch
run rm1 models/gpt.lua --steps 5 --set eval_every=0 --set grad_accum=4
run rm2 models/gpt.lua --steps 5 --set eval_every=0 --nproc 2 --pp 2 --set micro_batches=4 \
    --remat full
same_losses rm2 rm1
run rm2b models/gpt.lua --steps 5 --set eval_every=0 --nproc 2 --pp 2 --set micro_batches=4 \
    --memory-budget 600000
same_losses rm2b rm1
for f in rm2 rm2b; do
    sed -n 's/^pipeline: remat | stage 0 recomputes \([0-9]*\) of .* stashed per micro-batch \([0-9.]*\) KiB (without remat \([0-9.]*\) KiB).*/\1 \2 \3/p' \
        "$T/$f.log" | awk '{ n++; if (!($1 > 0 && $2 < $3)) exit 1 } END { exit n != 1 }' ||
        fail "$f: remat recomputed nothing on stage 0: $(grep '^pipeline: remat' "$T/$f.log")"
    grep '^pipeline: remat' "$T/$f.log"
done
grep -q "planned peak of one micro-batch's F, B and W as one program 5[0-9][0-9]\.[0-9]* KiB" \
    "$T/rm2b.log" || fail "rm2b: no planned peak within the budget: $(grep '^pipeline: remat' "$T/rm2b.log")"

run llama1 $LLAMA --set grad_accum=2 --save-weights "$T/llama1.safetensors"
run llama2 $LLAMA --nproc 2 --set pp=2 --set micro_batches=2 \
    --save-weights "$T/llama2.safetensors"
same_losses llama2 llama1
same_params "$T/llama1.safetensors" "$T/llama2.safetensors"

# pp = 2 x dp = 2 on 4 ranks (oversubscribed) = one rank at the whole batch
run gpt1a8 models/gpt.lua --steps 10 --set eval_every=0 --set grad_accum=4 \
    --save-weights "$T/gpt1a8.safetensors"
run gpt4 models/gpt.lua --steps 10 --set eval_every=0 --nproc 4 --pp 2 --set micro_batches=2 \
    --save-weights "$T/gpt4.safetensors"
same_losses gpt4 gpt1a8
same_params "$T/gpt1a8.safetensors" "$T/gpt4.safetensors" 32
# --pp-balance time: the cut by time measured on world rank 0, broadcast to
# every rank (both pipelines of pp 2 x dp 2 cut alike), = one rank
run gpt4t models/gpt.lua --steps 10 --set eval_every=0 --nproc 4 --pp 2 --set micro_batches=2 \
    --pp-balance time --save-weights "$T/gpt4t.safetensors"
same_losses gpt4t gpt1a8
same_params "$T/gpt1a8.safetensors" "$T/gpt4t.safetensors" 32
grep -q '^pipeline: cut by measured time (--pp-balance time), F, B and W of one micro-batch on one CPU thread: stage 0 [0-9.]* ms | stage 1 [0-9.]* ms$' \
    "$T/gpt4t.log" || fail "gpt4t: no measured cut: $(grep '^pipeline' "$T/gpt4t.log")"
# ... and with zero = 1: each stage's AdamW state sharded over its dp group
run gpt4z models/gpt.lua --steps 10 --set eval_every=0 --nproc 4 --pp 2 --set micro_batches=2 \
    --set zero=1 --save-weights "$T/gpt4z.safetensors"
same_losses gpt4z gpt1a8
same_params "$T/gpt1a8.safetensors" "$T/gpt4z.safetensors" 32
sed -n "s/^pipeline: zero = 1 | stage 0's AdamW state sharded over its 2 dp ranks: adam.m and adam.v f32\[\([0-9]*\)\] per rank (the stage's params: \([0-9]*\))$/\1 \2/p" \
    "$T/gpt4z.log" | awk '{ n++; if (!($1 < $2 && 2 * $1 >= $2)) exit 1 } END { exit n != 1 }' ||
    fail "zero = 1 under pp: no half-size state shard: $(grep '^pipeline: zero' "$T/gpt4z.log")"

# pp = 2 x tp = 2 on 4 ranks: stages cut from rank r's partitioned graph
run gpt1a2 models/gpt.lua --steps 10 --set eval_every=0 --set grad_accum=2 \
    --save-weights "$T/gpt1a2.safetensors"
run gpt22 models/gpt.lua --steps 10 --set eval_every=0 --nproc 4 --pp 2 --tp 2 \
    --set micro_batches=2 --set checkpoint_every=10 --set checkpoint="$T/c22.safetensors" \
    --save-weights "$T/gpt22.safetensors"
same_losses gpt22 gpt1a2
same_params "$T/gpt1a2.safetensors" "$T/gpt22.safetensors" 32
run r22w models/gpt.lua --steps 10 --set eval_every=0 --resume "$T/c22.step10.safetensors" \
    --save-weights "$T/r22w.safetensors"
cmp -s "$T/gpt22.safetensors" "$T/r22w.safetensors" ||
    fail "weights of pp 2 x tp 2 and of its checkpoint at one rank differ"

# tp 2 x pp 2 x dp 2 on 8 ranks (oversubscribed) = one rank at the whole batch
run gpt1a4 models/gpt.lua --steps 6 --set eval_every=0 --set grad_accum=4 \
    --save-weights "$T/gpt1a4.safetensors"
run gpt222 models/gpt.lua --steps 6 --set eval_every=0 --nproc 8 --pp 2 --tp 2 \
    --set micro_batches=2 --save-weights "$T/gpt222.safetensors"
same_losses gpt222 gpt1a4
same_params "$T/gpt1a4.safetensors" "$T/gpt222.safetensors" 32

# checkpoints hold whole tensors: a pp = 2 checkpoint resumes at pp = 1
# and at pp = 2 alike, a pp = 1 one at 2 and 1 alike; a pp = 2 run's
# weights = its checkpoint's resumed at pp = 1 with no step left to run
run c2 $GPT --nproc 2 --pp 2 --set micro_batches=4 --set checkpoint_every=10 \
    --set checkpoint="$T/c2.safetensors" --save-weights "$T/c2w.safetensors" --steps 10
[ -f "$T/c2.step10.safetensors" ] || fail "no checkpoint at step 10: $(ls "$T")"
run r21 $GPT --set grad_accum=4 --resume "$T/c2.step10.safetensors"
run r22 $GPT --nproc 2 --pp 2 --set micro_batches=4 --resume "$T/c2.step10.safetensors"
grep -q "resumed from" "$T/r21.log" || fail "r21 did not resume"
grep -q "resumed from" "$T/r22.log" || fail "r22 did not resume"
same_losses r22 r21
run r21w models/gpt.lua --steps 10 --set eval_every=0 --resume "$T/c2.step10.safetensors" \
    --save-weights "$T/r21w.safetensors"
cmp -s "$T/c2w.safetensors" "$T/r21w.safetensors" ||
    fail "weights of pp = 2 and of its checkpoint at pp = 1 differ"
run c1 $GPT --set grad_accum=4 --set checkpoint_every=10 --set checkpoint="$T/c1.safetensors" \
    --steps 10
run r12 $GPT --nproc 2 --pp 2 --set micro_batches=4 --resume "$T/c1.step10.safetensors"
run r11 $GPT --set grad_accum=4 --resume "$T/c1.step10.safetensors"
grep -q "resumed from" "$T/r12.log" || fail "r12 did not resume"
same_losses r12 r11

# --init-from: each stage takes its params from whole weights
run i1 models/gpt.lua --steps 3 --set eval_every=0 --set grad_accum=2 \
    --init-from "$T/gpt1.safetensors"
run i2 models/gpt.lua --steps 3 --set eval_every=0 --nproc 2 --pp 2 --set micro_batches=2 \
    --init-from "$T/gpt1.safetensors"
same_losses i2 i1

# pp_stage hints fix the cut (tests/data/pp_hint.lua: stage 1 begins after
# fc1 by default; cut=0 leaves the choice to the compiler)
"$KILN" compile tests/data/pp_hint.lua --pp 2 >"$T/h.log" 2>&1 || fail "compile hint: $(tail -3 "$T/h.log")"
grep -q '^# stage 0: .* 2 params' "$T/h.log" || fail "pp_stage did not cut after fc1: $(grep '^# stage' "$T/h.log")"
"$KILN" compile tests/data/pp_hint.lua --pp 2 --set cut=0 >"$T/h0.log" 2>&1 ||
    fail "compile no hint: $(tail -3 "$T/h0.log")"
grep -q '^# stage 0: .* 2 params' "$T/h0.log" && fail "the compiler's own cut is the hint's"
run hint1 tests/data/pp_hint.lua --set grad_accum=2 --save-weights "$T/hint1.safetensors"
run hint2 tests/data/pp_hint.lua --nproc 2 --pp 2 --set micro_batches=2 \
    --save-weights "$T/hint2.safetensors"
same_losses hint2 hint1
same_params "$T/hint1.safetensors" "$T/hint2.safetensors"

# --- the schedule dump --------------------------------------------------------
for s in 1f1b gpipe zb-h1 1f1b:4:8 zb-h1:4:8; do
    IFS=: read -r s n m <<<"$s"
    n=${n:-2} m=${m:-4}
    "$KILN" compile models/gpt.lua --pp $n --set micro_batches=$m --set schedule=$s \
        --dump-after=stages --dump-dir "$T/d$s$n" >"$T/c$s$n.log" 2>&1 ||
        fail "compile --pp $n ($s): $(tail -3 "$T/c$s$n.log")"
    python3 - "$T/d$s$n/stages.txt" $m $n $s <<'PY' || fail "the $s schedule dump is wrong"
import re, sys
text = open(sys.argv[1]).read()
m, n = int(sys.argv[2]), int(sys.argv[3])
progs = dict((int(a), b.split()) for a, b in re.findall(r'^stage (\d+) program:(.*)$', text, re.M))
assert sorted(progs) == list(range(n)), progs.keys()
sends, recvs = [], []
for s, toks in progs.items():
    acts = [t for t in toks if re.fullmatch(r'[FBW]\d+', t)]
    assert sorted(acts) == sorted(['%s%d' % (x, k) for x in 'FBW' for k in range(m)]), (s, acts)
    for k in range(m):  # F, then B, then W of each micro-batch; W's in order
        assert acts.index('F%d' % k) < acts.index('B%d' % k) < acts.index('W%d' % k), (s, k)
    ws = [int(t[1:]) for t in acts if t[0] == 'W']
    assert ws == sorted(ws), (s, ws)
    # micro-batches held (F run, W not yet): 1f1b's n - s at most; zb-h1
    # n on every stage (1f1b's stage 0), F to B n - s as 1f1b
    zb = sys.argv[4] == 'zb-h1'
    held = peak = heldb = peakb = 0
    for t in acts:
        held += {'F': 1, 'B': 0, 'W': -1}[t[0]]
        heldb += {'F': 1, 'B': -1, 'W': 0}[t[0]]
        peak, peakb = max(peak, held), max(peakb, heldb)
    cap = n if zb else n - s
    assert sys.argv[4] == 'gpipe' or (peak <= cap and peakb <= n - s), (s, peak, peakb, cap)
    line = ' '.join(toks)
    # the gradient for s-1 goes after B (zb-h1) or after W (B and W one
    # backward: 1f1b, gpipe)
    for k in range(m):
        want = r'(^| )%s%d send\(grad %d -> %d\)' % ('B' if zb else 'W', k, k, s - 1)
        assert s == 0 or re.search(want, line), (s, k, want)
    for what, k, to in re.findall(r'send\((act|grad) (\d+) -> (\d+)\)', line):
        sends.append((what, int(k), s, int(to)))
    for what, k, frm in re.findall(r'recv\((act|grad) (\d+) <- (\d+)\)', line):
        recvs.append((what, int(k), int(frm), s))
assert sorted(sends) == sorted(recvs), (sends, recvs)
assert len(sends) == 2 * m * (n - 1), len(sends)
grid = re.findall(r'^stage +(\d+):(.*)$', text, re.M)
assert len(grid) == n
bubble = float(re.search(r'^# bubble: ([0-9.]+)%', text, re.M).group(1))
# the unit-slot bubble: 1f1b's and gpipe's (p-1)/(m+p-1), zb-h1's (p-1)/(3m+p-1)
want = 100.0 * (n - 1) / ((3 * m if zb else m) + n - 1)
assert abs(bubble - want) < 0.06, (bubble, want)
print('%s: %d stages, %d sends paired with receives, bubble %.1f%%' % (sys.argv[1], n, len(sends), bubble))
PY
done
grep -q 'tied: "wte.weight" is read by stages 0 1' "$T/c1f1b2.log" || fail "no tied wte in the cut"

# --- errors -------------------------------------------------------------------
expect nproc3 '--pp 2: --nproc 3 is not a multiple of tp x pp = 2' \
    train models/gpt.lua --steps 2 --nproc 3 --pp 2
expect onerank '--pp 2: --nproc 1 is not a multiple' train models/gpt.lua --steps 2 --pp 2
expect stages '--pp 50: more stages than layers to put in them' compile models/gpt.lua --pp 50
expect hint_range 'pp_hint.lua:[0-9]*: pp_stage: stage 2, but pp = 2' \
    compile tests/data/pp_hint.lua --pp 2 --set stage2=3
expect hint_order 'pp_hint.lua:[0-9]*: pp_stage: stage 2 begins before stage 1' \
    compile tests/data/pp_hint.lua --pp 3 --set cut=4 --set stage2=2
expect hint_inner 'pp_hint.lua:[0-9]*: pp_stage: stage 1 would begin inside layer "fc2": "fc2.weight" in stage 0, "fc2.bias" in stage 1' \
    compile tests/data/pp_hint.lua --pp 2 --set cut=0 --set inner=2
expect both '--pp 2: micro_batches = 2 and grad_accum = 2 both set' \
    train models/gpt.lua --steps 2 --nproc 2 --pp 2 --set micro_batches=2 --set grad_accum=2
expect budget '^--pp 2, stage [01]: memory budget 48.83 KiB (50000 bytes) is infeasible' \
    train models/gpt.lua --steps 2 --nproc 2 --pp 2 --memory-budget 50000
expect balance_flag "--pp-balance expects cost or time" train models/gpt.lua --pp-balance fast
expect balance_tp '--pp-balance time: times the stages on one rank.s CPU, without tensor parallelism (expected tp = 1, got tp = 2' \
    train models/gpt.lua --steps 2 --nproc 4 --tp 2 --pp 2 --pp-balance time
# a stage holding no param: the cut takes the boundaries where each stage
# reads one instead (gpt.lua: 8 stages; 9 is more than it makes)
"$KILN" compile models/gpt.lua --pp 8 >"$T/pp8.log" 2>&1 || fail "compile --pp 8: $(tail -3 "$T/pp8.log")"
expect noparam '--pp 9: more stages than layers to put in them (expected pp <= 8' \
    compile models/gpt.lua --pp 9
echo "pp.sh: ok"
