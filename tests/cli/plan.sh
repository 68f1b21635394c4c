#!/bin/bash
# kiln plan: issue 17's worked example through the command line (1,920 x
# 8,192 tokens per step, a 10T budget, goodput 0.9, --step-time 12 and 10,
# --target-days 76), --json, the what-if rows, and a layout that does not
# add up (exit 2, a message naming the flags); --tokens 300B (billions) as
# 300G, with the count it read printed; the pipeline schedules (1f1b,
# gpipe, zb-h1: --schedule and the what-if rows); zero=1's gradients
# counted as gradients.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-plan-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(models/gpt.lua --set L=8 --set H=8 --set T=8192 --set batch=1 --device b200 --gpus 5120 --tp 8 --pp 8
        --global-batch 1920 --tokens 10T --goodput 0.9 --target-days 76)

out=$("$KILN" plan "${common[@]}" --step-time 12 2>&1) || fail "plan: $out"
echo "$out"
echo "$out" | grep -q '^plan: 5120 x b200 (8 per node), tp 8 x pp 8 x dp 80, zero 0, 24 micro-batches' ||
    fail "layout line"
echo "$out" | grep -q '^throughput: 15728640 tokens per step, 1310720 tokens/s' || fail "throughput at 12 s"
echo "$out" | grep -q '^end date: 635782 steps to 1e+13 tokens; 88.30 days of steps, 98.11 days at goodput 0.90' ||
    fail "end date at 12 s"
echo "$out" | grep -q '^  to finish in 76.00 days: 9.30 s per step' || fail "target days"
echo "$out" | grep -q '^  step 12.000 s (--step-time; replaces the prediction)' || fail "step line"
for w in "no overlap" "bucket_mb=1 " "bucket_mb=16 " "remat=none" "remat=selective" "remat=full"; do
    echo "$out" | grep -q "^  $w *step [0-9.]* \(ms\|s\|us\) (exposed DP" || fail "what-if row '$w'"
done
# the pipeline schedules: 1F1B by default; the what-if rows give the other
# two. From the compiler's stage cut (tests/cli/plan_pp.sh has more): zb-h1
# no slower, gpipe holding every micro-batch. From the formulas (--pipeline-formulas:
# no cut): the bubble (p-1)/(m+p-1), zb-h1 (weight gradients in the
# bubble) a shorter step at 1F1B's memory, gpipe the same step holding
# every micro-batch
# seconds and bytes from "12.3 ms" and "4.5 GiB"
num() { awk -v v="$1" -v u="$2" 'BEGIN { f["s"] = 1; f["ms"] = 1e-3; f["us"] = 1e-6; f["B"] = 1
    f["KiB"] = 2^10; f["MiB"] = 2^20; f["GiB"] = 2^30; if (!(u in f)) exit 1; print v * f[u] }'; }
row() { echo "$out" | sed -n "s/^  $1 *step \([0-9.]*\) \([mu]*s\) (exposed DP [^)]*), \([0-9.]*\) \([KMG]*i*B\) per GPU.*$/\1 \2 \3 \4/p"; }
for mode in cut formula; do
    extra=()
    [ $mode = formula ] && extra=(--pipeline-formulas)
    out=$("$KILN" plan "${common[@]}" "${extra[@]}" 2>&1) || fail "plan $mode: $out"
    if [ $mode = cut ]; then
        echo "$out" | grep -q "^    from the compiler's stage cut" || fail "cut: $(echo "$out" | grep -A1 'pipeline (')"
        echo "$out" | grep -Eq '^    per micro-batch: forward [0-9]+%, input gradients [0-9]+%, weight gradients [1-9][0-9]*% \(W\); stage [0-9], with the most memory, holds [1-8] micro-batch' ||
            fail "F/B/W line: $(echo "$out" | grep 'per micro-batch')"
    else
        echo "$out" | grep -q '^  pipeline (1f1b) .*, of which bubble .* (22.6%)$' || fail "1f1b bubble"
        echo "$out" | grep -q '^    from the ideal split and the formulas .*--pipeline-formulas' || fail "formula: no reason"
        echo "$out" | grep -Eq '^    per micro-batch: forward [0-9]+%, input gradients [0-9]+%, weight gradients [1-9][0-9]*% \(W\); the first stage holds 8 micro-batches of activations$' ||
            fail "F/B/W line: $(echo "$out" | grep 'per micro-batch')"
    fi
    base=$(echo "$out" | sed -n 's/^  optimizer .*; predicted step \([0-9.]*\) \([mu]*s\)$/\1 \2/p')
    mem=$(echo "$out" | sed -n 's/^  total \([0-9.]*\) \([KMG]*i*B\) of .*/\1 \2/p')
    read -r a1 a2 a3 a4 <<<"$(row schedule=zb-h1)"
    read -r g1 g2 g3 g4 <<<"$(row schedule=gpipe)"
    b=$(num $base) m=$(num $mem) zs=$(num "$a1" "$a2") zm=$(num "$a3" "$a4") gs=$(num "$g1" "$g2") \
        gm=$(num "$g3" "$g4") || fail "schedule rows: $(echo "$out" | grep -E 'schedule=|predicted|total')"
    if [ $mode = cut ]; then
        awk -v b="$b" -v m="$m" -v zs="$zs" -v gm="$gm" 'BEGIN { exit !(zs <= b && gm > m) }' ||
            fail "cut schedules: 1f1b $base $mem, zb-h1 $a1 $a2 $a3 $a4, gpipe $g1 $g2 $g3 $g4"
    else
        awk -v b="$b" -v m="$m" -v zs="$zs" -v zm="$zm" -v gs="$gs" -v gm="$gm" \
            'BEGIN { exit !(zs < b && zm == m && gs == b && gm > m) }' ||
            fail "schedules: 1f1b $base $mem, zb-h1 $a1 $a2 $a3 $a4, gpipe $g1 $g2 $g3 $g4"
    fi
done
out=$("$KILN" plan "${common[@]}" --schedule zb-h1 2>&1) || fail "plan --schedule zb-h1: $out"
echo "$out" | grep -q '^  pipeline (zb-h1) ' || fail "--schedule zb-h1: $(echo "$out" | grep pipeline)"
echo "$out" | grep -q '^  schedule=1f1b ' || fail "--schedule zb-h1: no 1f1b row"

# zero=1: the gradients a reduce-scatter reads (and the shard it writes)
# count as gradients, not as other temporaries: with 2 micro-batches all of
# them are held, at least the params' size (before: "grads 0 B")
out=$("$KILN" plan models/gpt.lua --gpus 2 --dp 2 --zero 1 --micro-batches 2 2>&1) ||
    fail "plan --zero 1: $out"
line=$(echo "$out" | grep '^  params .*, grads ')
read -r p1 p2 g1 g2 <<<"$(echo "$line" | sed -n 's/^  params \([0-9.]*\) \([KMG]*i*B\), grads \([0-9.]*\) \([KMG]*i*B\),.*/\1 \2 \3 \4/p')"
awk -v p="$(num "$p1" "$p2")" -v g="$(num "$g1" "$g2")" 'BEGIN { exit !(p > 0 && g >= p) }' ||
    fail "zero=1 grads below the params: $line"

out=$("$KILN" plan "${common[@]}" --step-time 10 2>&1) || fail "plan at 10 s: $out"
echo "$out" | grep -q '1572864 tokens/s' || fail "tokens/s at 10 s"
echo "$out" | grep -q '73.59 days of steps, 81.76 days at goodput 0.90' || fail "end date at 10 s"

"$KILN" plan "${common[@]}" --step-time 12 --json >"$dir/plan.json" 2>&1 || fail "--json: $(cat "$dir/plan.json")"
for kv in '"steps":	635782' '"tokens_per_step":	15728640' '"tp":	8' '"dp":	80' '"what_if":'; do
    grep -qF "$kv" "$dir/plan.json" || fail "--json lacks $kv: $(head -c 800 "$dir/plan.json")"
done
if command -v python3 >/dev/null; then
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert abs(d['days']-88.3031)<1e-3, d['days']" \
        "$dir/plan.json" || fail "--json is not valid JSON with the right days"
fi

"$KILN" plan models/gpt.lua --gpus 64 --tp 8 --pp 8 --dp 2 >"$dir/err" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "a layout that does not add up exited $rc (expected 2)"
grep -q -- '--tp 8 x --pp 8 x --dp 2 must equal --gpus 64' "$dir/err" || fail "message: $(cat "$dir/err")"
"$KILN" plan models/gpt.lua --set batch=1 --dp 8 --global-batch 12 >"$dir/err" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "--global-batch 12 over dp 8 exited $rc (expected 2)"
grep -q 'expected a multiple of 8' "$dir/err" || fail "message: $(cat "$dir/err")"
"$KILN" plan models/gpt.lua --tokens lots >"$dir/err" 2>&1
[ $? -eq 2 ] && grep -q -- "--tokens expects a count such as 10T" "$dir/err" || fail "--tokens lots: $(cat "$dir/err")"
# B (billions, as papers write budgets) beside G: the same plan, and the
# line after the end date says which count it read
b=$("$KILN" plan "${common[@]}" --step-time 12 --tokens 300B 2>&1) || fail "--tokens 300B: $b"
g=$("$KILN" plan "${common[@]}" --step-time 12 --tokens 300G 2>&1) || fail "--tokens 300G: $g"
echo "$b" | grep -q '^end date: 19073 steps to 3e+11 tokens;' || fail "end date at 300B: $b"
[ "$(echo "$b" | grep '^end date')" = "$(echo "$g" | grep '^end date')" ] || fail "300B and 300G differ"
echo "$b" | grep -q '^  --tokens 300B read as 3e+11 tokens (B: billions, 1e9)$' || fail "300B read line: $b"
echo "$g" | grep -q '^  --tokens 300G read as 3e+11 tokens (G: giga, billions, 1e9)$' || fail "300G read line"
echo "$out" | grep -q '^  --tokens 10T read as 1e+13 tokens (T: trillions, 1e12)$' || fail "10T read line"
# the remat choice at the device's memory (--memory): more memory never
# recomputes more; a chosen plan fits the memory; too little memory names the
# least that fits, and that much fits. The memories swept lie between that
# least and remat none's memory per GPU (the what-if row), where auto must
# recompute.
small=(models/gpt.lua --set L=4 --set C=128 --set T=128 --set batch=8)
"$KILN" plan "${small[@]}" --memory lots >"$dir/err" 2>&1
[ $? -eq 2 ] && grep -q -- "--memory expects a size" "$dir/err" || fail "--memory lots: $(cat "$dir/err")"
out=$("$KILN" plan "${small[@]}" --memory 1GiB 2>&1) || fail "plan --memory 1GiB: $out"
echo "$out" | grep -q '^  remat at 1.00 GiB .*: auto keeps all [0-9]* saved activations (remat none)' ||
    fail "1 GiB should keep every activation: $out"
if command -v python3 >/dev/null; then
    "$KILN" plan "${small[@]}" --memory 20MiB --json >"$dir/m-low.json" 2>&1 ||
        fail "--memory 20MiB --json: $(cat "$dir/m-low.json")"
    read -r least none < <(python3 -c "
import json, sys, math
d = json.load(open(sys.argv[1]))
r = d['remat_at_memory']
assert not r['fits'] and r['least_memory'] > r['memory'], r
none = [w for w in d['what_if'] if w['name'] == 'remat=none'][0]['memory_per_gpu']
assert r['least_memory'] < none, (r, none)
print(math.ceil(r['least_memory']), math.floor(none))" "$dir/m-low.json") ||
        fail "20 MiB: no least memory below remat none's"
    mems="$least $(( (3 * least + none) / 4 )) $(( (least + none) / 2 )) $(( (least + 3 * none) / 4 )) $none 1073741824"
    out=$("$KILN" plan "${small[@]}" --memory $(( (least + none) / 2 )) 2>&1) || fail "plan: $out"
    echo "$out" | grep -Eq '^  remat at [0-9.]+ MiB \(room for [0-9.]+ MiB of activations per GPU\): auto recomputes [0-9]+ of [0-9]+ saved activations' ||
        fail "no remat line between the least memory and remat none's: $out"
    for mem in $mems; do
        "$KILN" plan "${small[@]}" --memory "$mem" --json >"$dir/m-$mem.json" 2>&1 ||
            fail "--memory $mem --json: $(cat "$dir/m-$mem.json")"
    done
    python3 - "$dir" $mems <<'PY' || fail "remat at memory invariants"
import json, sys
d, mems = sys.argv[1], sys.argv[2:]
rows = [json.load(open(f"{d}/m-{m}.json")) for m in mems]
prev = None
for m, j in zip(mems, rows):
    r, mem = j["remat_at_memory"], j["memory_per_gpu"]
    print(m, r)
    assert r["fits"], f"{m}: no plan fits at or above the least memory named"
    assert r["total"] <= r["memory"] * (1 + 1e-9), f"{m}: chosen plan {r['total']} > memory"
    assert r["activations"] <= r["activation_budget"] * (1 + 1e-9), f"{m}: activations over budget"
    if prev is not None:
        assert r["extra_flops"] <= prev["extra_flops"], f"{m}: more memory recomputes more"
    prev = r
assert rows[-1]["remat_at_memory"]["chosen"] == "none" and rows[-1]["remat_at_memory"]["recomputed"] == 0, "1 GiB recomputes"
assert rows[-2]["remat_at_memory"]["recomputed"] == 0, "remat none's own memory recomputes"
assert any(j["remat_at_memory"]["recomputed"] > 0 for j in rows), "no row recomputes"
PY
fi
# memory per GPU counts each byte once: a model whose gradients dominate
# (an MLP of 4 x 1024 hidden units, 4 examples) on one GPU, one
# micro-batch: grads + activations are the temporaries at the memory
# plan's peak (peak live - persistent, `kiln compile --dump-after=memplan`)
# and params + optimizer state lie in its persistent region; with two
# micro-batches every gradient is held beside the activations' own peak
mlp=(models/mlp.lua --set hidden=1024 --set depth=4 --set batch=4)
"$KILN" compile "${mlp[@]}" --target h200 --dump-after=memplan --dump-dir "$dir/mlp" >/dev/null 2>&1 ||
    fail "compile mlp"
read -r pers peak < <(sed -n 's/^memplan: persistent \([0-9]*\) bytes, peak live \([0-9]*\) bytes.*/\1 \2/p' "$dir"/mlp/*memplan.txt)
[ -n "$peak" ] || fail "no memplan peak: $(head -1 "$dir"/mlp/*memplan.txt)"
if command -v python3 >/dev/null; then
    "$KILN" plan "${mlp[@]}" --json >"$dir/mlp1.json" 2>&1 || fail "plan mlp: $(cat "$dir/mlp1.json")"
    "$KILN" plan "${mlp[@]}" --micro-batches 2 --json >"$dir/mlp2.json" 2>&1 ||
        fail "plan mlp, 2 micro-batches: $(cat "$dir/mlp2.json")"
    python3 - "$dir/mlp1.json" "$dir/mlp2.json" "$pers" "$peak" <<'PY' || fail "mlp memory rows"
import json, sys
m1, m2 = (json.load(open(p))["memory_per_gpu"] for p in sys.argv[1:3])
pers, peak = int(sys.argv[3]), int(sys.argv[4])
print("persistent", pers, "peak live", peak, m1, m2)
temps = peak - pers
assert m1["grads"] > 4 * m1["activations"], m1  # the gradients dominate
assert not m1["grads_resident"] and m2["grads_resident"], (m1, m2)
assert m1["grads"] + m1["activations"] == temps, (m1, temps)
assert m1["params"] + m1["optimizer"] <= pers, (m1, pers)
assert m1["total"] <= peak, (m1, peak)
assert 0 <= m1["activations_saved"] <= m1["activations"], m1
assert m2["grads"] + m2["activations"] >= temps and m2["grads"] <= temps, (m2, temps)
assert m2["total"] <= peak + m2["activations"], (m2, peak)
PY
fi
# mixed precision (precision=bf16 on a GPU): the activations are counted as
# the CUDA backend stores them, as bf16 (half the f32 plan's saved bytes, a
# few f32 buffers such as attention's lse aside), and the remat choice at the
# device's memory measures each candidate the same way: at remat none's bf16
# memory it recomputes nothing (counted at f32 it would have to)
if command -v python3 >/dev/null; then
    half=(models/gpt.lua --set L=4 --set C=256 --set T=256 --set batch=4 --device h100)
    "$KILN" plan "${half[@]}" --json >"$dir/h32.json" 2>&1 || fail "f32: $(cat "$dir/h32.json")"
    "$KILN" plan "${half[@]}" --set precision=bf16 --json >"$dir/h16.json" 2>&1 ||
        fail "bf16: $(cat "$dir/h16.json")"
    mem=$(python3 -c "
import json, sys
f, h = (json.load(open(p)) for p in sys.argv[1:3])
a, b = f['memory_per_gpu'], h['memory_per_gpu']
print('saved activations f32', a['activations_saved'], 'bf16', b['activations_saved'], file=sys.stderr)
assert 0.45 * a['activations_saved'] <= b['activations_saved'] <= 0.55 * a['activations_saved'], (a, b)
assert b['activations'] <= 0.55 * a['activations'], (a, b)
none = [w for w in h['what_if'] if w['name'] == 'remat=none'][0]['memory_per_gpu']
none32 = [w for w in f['what_if'] if w['name'] == 'remat=none'][0]['memory_per_gpu']
assert none < 0.8 * none32, (none, none32)
print(int(none * 1.01))" "$dir/h32.json" "$dir/h16.json") || fail "bf16 activations counted at f32 sizes"
    "$KILN" plan "${half[@]}" --set precision=bf16 --memory "$mem" --json >"$dir/h16m.json" 2>&1 ||
        fail "bf16 --memory $mem: $(cat "$dir/h16m.json")"
    python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['remat_at_memory']
assert r['fits'] and r['recomputed'] == 0 and r['total'] <= r['memory'], r" "$dir/h16m.json" ||
        fail "bf16 at remat none's memory: $(cat "$dir/h16m.json")"
fi
# --device cpu with 2 ranks: the MPI link between them is measured once
# through kiln's own transport (under mpirun), cached, and is the plan's link
if command -v mpirun >/dev/null; then
    mkdir -p "$dir/cache"
    cp "${KILN_CACHE_DIR:-/nonexistent}"/cpu-device-*.txt "$dir/cache/" 2>/dev/null
    cpu=(models/gpt.lua --device cpu --dp 2)
    KILN_CACHE_DIR="$dir/cache" "$KILN" plan "${cpu[@]}" >"$dir/out" 2>"$dir/err" ||
        fail "plan --device cpu --dp 2: $(cat "$dir/err")"
    grep -q "measuring MPI between 2 local ranks" "$dir/err" || fail "no MPI measurement: $(cat "$dir/err")"
    f="$dir/cache/cpu-mpi-2.txt"
    [ -f "$f" ] || fail "no $f"
    grep -q '^ranks=2$' "$f" || fail "$f: $(cat "$f")"
    bw=$(sed -n 's/^bw=//p' "$f")
    alpha=$(sed -n 's/^alpha=//p' "$f")
    awk -v b="$bw" -v a="$alpha" 'BEGIN { exit !(b > 1e6 && a > 0 && a < 1) }' ||
        fail "$f: implausible bw $bw, alpha $alpha"
    want=$(awk -v b="$bw" -v a="$alpha" 'BEGIN { printf "links: %.3g GB/s inside a node, 1.25 GB/s between nodes (inside: MPI between local ranks, measured); alpha %.3g us per hop", b / 1e9, a * 1e6 }')
    grep -qF "  $want" "$dir/out" || fail "links line is not the measured link ($want): $(grep links "$dir/out")"
    KILN_CACHE_DIR="$dir/cache" "$KILN" plan "${cpu[@]}" >"$dir/out" 2>"$dir/err" || fail "plan again"
    grep -q "measuring MPI" "$dir/err" && fail "measured again although cached"
    grep -qF "  $want" "$dir/out" || fail "cached link not used: $(grep links "$dir/out")"
    sed -i 's/^model=.*/model=another CPU/' "$f"
    KILN_CACHE_DIR="$dir/cache" "$KILN" plan "${cpu[@]}" >"$dir/out" 2>"$dir/err" || fail "plan, other CPU"
    grep -q "measuring MPI" "$dir/err" || fail "a cache for another CPU was used"
    [ -f "$dir/cache/cpu-mpi-tp-2.txt" ] && fail "the TP link was measured for a plan without tp"
    # each rank's figures are measured as 2 ranks run, both at once
    # (cpu-device-T-r2.txt, measure.c), and are the ones the plan costs with:
    # halving their rates there doubles the predicted compute
    rf=$(ls "$dir"/cache/cpu-device-*-r2.txt 2>/dev/null | head -1)
    [ -n "$rf" ] || fail "no cpu-device-T-r2.txt: $(ls "$dir/cache")"
    grep -q '^ranks=2$' "$rf" || fail "$rf: $(cat "$rf")"
    KILN_CACHE_DIR="$dir/cache" "$KILN" plan "${cpu[@]}" --json >"$dir/r2a.json" 2>"$dir/err" ||
        fail "plan --json: $(cat "$dir/err")"
    python3 - "$rf" <<'PY' || fail "cannot rewrite $rf"
import sys
p = sys.argv[1]
out = []
for line in open(p):
    k, _, v = line.rstrip('\n').partition('=')
    if k in ('f32', 'gemm', 'bw', 'bw1', 'work'):
        v = '%.6g' % (float(v) / 2)
    elif k == 'gemm1':
        v = ','.join('%.6g' % (float(x) / 2) for x in v.split(','))
    out.append(k + '=' + v)
open(p, 'w').write('\n'.join(out) + '\n')
PY
    KILN_CACHE_DIR="$dir/cache" "$KILN" plan "${cpu[@]}" --json >"$dir/r2b.json" 2>"$dir/err" ||
        fail "plan --json, halved rates: $(cat "$dir/err")"
    grep -q "measuring this CPU" "$dir/err" && fail "the rank figures measured again although cached"
    python3 - "$dir/r2a.json" "$dir/r2b.json" <<'PY' || fail "the plan does not cost with the rank figures"
import json, sys
a, b = (json.load(open(p))['step']['compute_per_microbatch_s'] for p in sys.argv[1:])
assert abs(b / a - 2) < 0.01, (a, b)
PY
    # with --tp 2 the TP collectives' own path (no communication thread) too
    KILN_CACHE_DIR="$dir/cache" "$KILN" plan models/gpt.lua --device cpu --tp 2 >"$dir/out" \
        2>"$dir/err" || fail "plan --device cpu --tp 2: $(cat "$dir/err")"
    grep -q "measuring MPI (the TP collectives' path) between 2 local ranks" "$dir/err" ||
        fail "no TP link measurement: $(cat "$dir/err")"
    f="$dir/cache/cpu-mpi-tp-2.txt"
    bw=$(sed -n 's/^bw=//p' "$f")
    alpha=$(sed -n 's/^alpha=//p' "$f")
    # the TP fit takes alpha and bw together: on a loaded machine alpha may
    # come out 0 (measure_mpi.c keeps it so), never negative
    awk -v b="$bw" -v a="$alpha" 'BEGIN { exit !(b > 1e6 && a >= 0 && a < 1) }' ||
        fail "$f: implausible bw $bw, alpha $alpha"
    want=$(awk -v b="$bw" -v a="$alpha" 'BEGIN { printf "TP link inside a node: %.3g GB/s, alpha %.3g us per hop", b / 1e9, a * 1e6 }')
    grep -qF "  $want" "$dir/out" || fail "TP link line is not the measured one ($want): $(grep -i 'tp link' "$dir/out")"
else
    echo "plan: no mpirun; the cpu MPI link is not checked"
fi
echo "plan: ok"
# --zero 1: the step compiled sharded for --dp ranks; its reduce-scatter,
# all-reduce (the norm) and all-gather buckets, each costed by its kind:
# memory per GPU falls, the step does not grow, nor the exposed DP time by
# more than the norm's scalar all-reduce
zargs=(models/gpt.lua --set L=4 --set C=256 --set T=256 --set batch=4 --device h100 --gpus 8)
"$KILN" plan "${zargs[@]}" --json >"$dir/z0.json" 2>&1 || fail "zero 0: $(cat "$dir/z0.json")"
"$KILN" plan "${zargs[@]}" --zero 1 --json >"$dir/z1.json" 2>&1 || fail "zero 1: $(cat "$dir/z1.json")"
out=$("$KILN" plan "${zargs[@]}" --zero 1 2>&1) || fail "zero 1: $out"
echo "$out" | grep -Eq '^    zero=1: [1-9][0-9]* reduce-scatter, 1 all-reduce \(the norm\), [1-9][0-9]* all-gather buckets' ||
    fail "no zero=1 bucket line: $out"
if command -v python3 >/dev/null; then
    python3 - "$dir/z0.json" "$dir/z1.json" <<'PY' || fail "zero=1 against zero=0"
import json, sys
z0, z1 = (json.load(open(p)) for p in sys.argv[1:3])
assert z0["zero"] == 0 and z1["zero"] == 1
assert z0["step"]["dp_reduce_scatter_buckets"] == 0 and z0["step"]["dp_all_gather_buckets"] == 0
assert z1["step"]["dp_reduce_scatter_buckets"] >= 1 and z1["step"]["dp_all_gather_buckets"] >= 1
assert z1["step"]["dp_allreduce_buckets"] == 1, z1["step"]
m0, m1 = z0["memory_per_gpu"], z1["memory_per_gpu"]
assert m1["total"] < m0["total"] and abs(m1["optimizer"] * 8 - m0["optimizer"]) < 0.01 * m0["optimizer"], (m0, m1)
# the norm's scalar all-reduce (2 (dp-1) alpha, ring of 8, 5 us a hop) may add its latency
assert z1["step"]["dp_exposed_s"] <= z0["step"]["dp_exposed_s"] + 2 * 7 * 5e-6 + 1e-9, (z0["step"], z1["step"])
assert z1["step"]["predicted_s"] <= z0["step"]["predicted_s"] * (1 + 1e-9), (z0["step"], z1["step"])
print("zero=1 vs 0: memory %.4g -> %.4g B, exposed DP %.4g -> %.4g s, step %.4g -> %.4g s" % (
    m0["total"], m1["total"], z0["step"]["dp_exposed_s"], z1["step"]["dp_exposed_s"],
    z0["step"]["predicted_s"], z1["step"]["predicted_s"]))
PY
fi
