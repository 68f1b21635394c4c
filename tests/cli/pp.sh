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
#   - the `stages` dump (pp 2 x m 4, pp 4 x m 8): each micro-batch's F, B
#     and W once per stage in that order, W's in micro-batch order, every
#     send paired with a receive on the neighbour, no stage holding more
#     micro-batches than the schedule allows;
#   - checkpoints hold whole tensors (stage 0 writes every stage's): pp = 2
#     resumes at pp = 1 and 1 at 2 as the unbroken run goes on;
#   - --init-from gives each stage its params of whole weights;
#   - pp_stage hints (tests/data/pp_hint.lua) move the cut, and train as
#     one rank does;
#   - user errors: ranks that tp x pp does not divide, more stages than
#     places to cut, a stage without params, flags pp does not run with
#     yet, hints out of range or out of order (naming the script line).
# gpt's key bias: see tests/cli/tp.sh (compared to 1e-3 absolute).
set -u
: "${KILN:?KILN must point at the kiln binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-pp.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

# run NAME ARGS...: kiln train ARGS, its output in $T/NAME.log
run() {
    local name=$1
    shift
    "$KILN" train "$@" >"$T/$name.log" 2>&1 || {
        tail -20 "$T/$name.log"
        fail "$name: kiln train $*"
    }
}

# losses NAME: the step losses, one per line
losses() { sed -n 's/^step *\([0-9]*\)\/[0-9]* | loss \([0-9.e+-]*\) .*/\1 \2/p' "$T/$1.log"; }

# same_losses A B: every step's loss within 1e-5 relative
same_losses() {
    local n
    n=$(losses "$1" | wc -l)
    [ "$n" -ge 2 ] && [ "$n" -eq "$(losses "$2" | wc -l)" ] ||
        fail "$1 / $2: step lines differ ($n / $(losses "$2" | wc -l))"
    local e
    e=$(paste <(losses "$1") <(losses "$2") | awk '
        $1 != $3 { print "step mismatch"; exit }
        { d = $2 - $4; if (d < 0) d = -d; r = $4 < 0 ? -$4 : $4; e = d / r; if (e > m) m = e }
        END { printf "%.3g\n", m }')
    echo "$1 vs $2: $n steps, loss rel diff $e"
    awk -v e="$e" 'BEGIN { exit !(e != "" && e + 0 == e && e < 1e-5) }' ||
        fail "$1 vs $2: losses differ by $e"
}

# same_params A.safetensors B.safetensors [C]: the same tensors and shapes;
# per tensor |a - b| / |a| < 1e-5 (L2); with C (gpt's width), the key bias
# columns of c_attn.bias to 1e-3 absolute (see the top)
same_params() {
    python3 - "$@" <<'EOF' || fail "params differ: $*"
import array, json, math, struct, sys
def rd(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
def vals(h, b, k):
    o = h[k]['data_offsets']
    a = array.array('f')
    a.frombytes(b[o[0]:o[1]])
    return a
h1, b1 = rd(sys.argv[1])
h2, b2 = rd(sys.argv[2])
C = int(sys.argv[3]) if len(sys.argv) > 3 else 0
k1 = sorted(k for k in h1 if k != '__metadata__')
assert k1 == sorted(k for k in h2 if k != '__metadata__'), 'different tensors'
worst, ok = (0, ''), True
for k in k1:
    assert h1[k]['shape'] == h2[k]['shape'] and h1[k]['dtype'] == h2[k]['dtype'], k
    a, c = vals(h1, b1, k), vals(h2, b2, k)
    idx = range(len(a))
    if C and k.endswith('c_attn.bias'):
        kd = max(abs(a[i] - c[i]) for i in range(C, 2 * C))
        if not kd < 1e-3:
            print('%s: key bias differs by %g' % (k, kd)); ok = False
        idx = [i for i in idx if not C <= i < 2 * C]
    d = math.sqrt(sum((a[i] - c[i]) ** 2 for i in idx))
    n = math.sqrt(sum(a[i] ** 2 for i in idx))
    r = d / n if n > 0 else d
    worst = max(worst, (r, k))
    if not r < 1e-5:
        print('%s: rel diff %g' % (k, r)); ok = False
print('%d tensors, worst rel diff %.3g (%s)' % (len(k1), worst[0], worst[1]))
sys.exit(0 if ok else 1)
EOF
}

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
    # keeps up to n - 1 - s more W's waiting
    held = peak = 0
    for t in acts:
        held += {'F': 1, 'B': 0, 'W': -1}[t[0]]
        peak = max(peak, held)
    cap = n - s + (n - 1 - s if sys.argv[4] == 'zb-h1' else 0)
    assert sys.argv[4] == 'gpipe' or peak <= cap, (s, peak, cap)
    line = ' '.join(toks)
    for what, k, to in re.findall(r'send\((act|grad) (\d+) -> (\d+)\)', line):
        sends.append((what, int(k), s, int(to)))
    for what, k, frm in re.findall(r'recv\((act|grad) (\d+) <- (\d+)\)', line):
        recvs.append((what, int(k), int(frm), s))
assert sorted(sends) == sorted(recvs), (sends, recvs)
assert len(sends) == 2 * m * (n - 1), len(sends)
grid = re.findall(r'^stage +(\d+):(.*)$', text, re.M)
assert len(grid) == n
print('%s: %d stages, %d sends paired with receives' % (sys.argv[1], n, len(sends)))
PY
done
grep -q 'tied: "wte.weight" is read by stages 0 1' "$T/c1f1b2.log" || fail "no tied wte in the cut"

# --- errors -------------------------------------------------------------------
# expect NAME PATTERN ARGS...: kiln fails (not by a signal) saying PATTERN
expect() {
    local name=$1 pat=$2
    shift 2
    "$KILN" "$@" >"$T/$name.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "$name: exit $rc: $(tail -3 "$T/$name.log")"
    grep -q -- "$pat" "$T/$name.log" || fail "$name: expected '$pat', got: $(tail -3 "$T/$name.log")"
}
expect nproc3 '--pp 2: --nproc 3 is not a multiple of tp x pp = 2' \
    train models/gpt.lua --steps 2 --nproc 3 --pp 2
expect onerank '--pp 2: --nproc 1 is not a multiple' train models/gpt.lua --steps 2 --pp 2
expect stages '--pp 50: more stages than places to cut' compile models/gpt.lua --pp 50
expect hint_range 'pp_hint.lua:[0-9]*: pp_stage: stage 2, but pp = 2' \
    compile tests/data/pp_hint.lua --pp 2 --set stage2=3
expect hint_order 'pp_hint.lua:[0-9]*: pp_stage: stage 2 begins before stage 1' \
    compile tests/data/pp_hint.lua --pp 3 --set cut=4 --set stage2=2
expect both '--pp 2: micro_batches = 2 and grad_accum = 2 both set' \
    train models/gpt.lua --steps 2 --nproc 2 --pp 2 --set micro_batches=2 --set grad_accum=2
expect zerockpt '--pp 2: pipeline stages do not run with zero = 1 and checkpoints' \
    train models/gpt.lua --steps 2 --nproc 4 --pp 2 --set zero=1 --checkpoint "$T/zc"
expect budget '^--pp 2, stage [01]: memory budget 48.83 KiB (50000 bytes) is infeasible' \
    train models/gpt.lua --steps 2 --nproc 2 --pp 2 --memory-budget 50000
expect noparam '--pp 12: stage 1 would hold no param' compile models/gpt.lua --pp 12
echo "pp.sh: ok"
