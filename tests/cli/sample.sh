#!/bin/bash
# kiln sample: greedy decoding through the KV-cache decode step equals
# greedy decoding by rerunning the full forward (gpt.lua, llama.lua); a
# seeded sample is reproducible and does not depend on the batch; top-k 1
# is greedy; --stream and --tokenizer print the same text; a model without
# nn.attention takes the full-forward path, and one that mixes over time
# outside attention is caught by the step-against-prefill check; kiln
# compile --target predicts the decode step; a gpt.lua trained
# 300 steps on tiny.txt samples bytes closer to the data's than to uniform.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-sample-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$KILN" train models/gpt.lua --steps 300 --save-weights "$dir/gpt.st" -q >/dev/null 2>&1 ||
    fail "training gpt.lua"
"$KILN" train models/llama.lua --steps 40 --save-weights "$dir/llama.st" -q >/dev/null 2>&1 ||
    fail "training llama.lua"

# greedy: KV cache == full forward; prompt + 40 tokens crosses T = 32, so
# the slide past the window (a prefill per token) is covered too
# prompt "T" (1 token <= T/16) goes in by one-token steps, "The " by the prefill
for m in gpt llama gpt:T llama:T; do
    p="The "
    case $m in *:T) m=${m%:T}; p=T ;; esac
    kv=$("$KILN" sample models/$m.lua --init-from "$dir/$m.st" --prompt "$p" \
         --max-new-tokens 40 --temperature 0 --ids --num-samples 2 2>"$dir/kv.err") ||
        fail "$m kv: $(cat "$dir/kv.err")"
    grep -q "^sample: models/$m.lua: KV cache:" "$dir/kv.err" || fail "$m: no KV path: $(cat "$dir/kv.err")"
    grep -qE "runs: [0-9]+ prefill, [1-9][0-9]* one-token, 0 full forward" "$dir/kv.err" ||
        fail "$m: no one-token steps: $(cat "$dir/kv.err")"
    full=$("$KILN" sample models/$m.lua --init-from "$dir/$m.st" --prompt "$p" \
           --max-new-tokens 40 --temperature 0 --ids --num-samples 2 --no-kv-cache 2>"$dir/full.err") ||
        fail "$m full: $(cat "$dir/full.err")"
    grep -q "no KV cache: the full forward over the window at every token (--no-kv-cache)" \
        "$dir/full.err" || fail "$m: no full-forward line: $(cat "$dir/full.err")"
    [ "$kv" = "$full" ] || fail "$m: greedy with the KV cache differs from the full forward:
$kv
$full"
    [ "$(echo "$kv" | wc -l)" -eq 2 ] || fail "$m: expected 2 samples: $kv"
done

s() { "$KILN" sample models/gpt.lua --init-from "$dir/gpt.st" --prompt "The " -q "$@"; }
a=$(s --ids --seed 7 --num-samples 3 --max-new-tokens 30 --top-p 0.9) || fail "seed 7"
b=$(s --ids --seed 7 --num-samples 3 --max-new-tokens 30 --top-p 0.9 --set batch=1) ||
    fail "seed 7 batch 1"
c=$(s --ids --seed 8 --num-samples 3 --max-new-tokens 30 --top-p 0.9) || fail "seed 8"
[ "$a" = "$b" ] || fail "seed 7 differs between batch 4 and batch 1:
$a
$b"
[ "$a" != "$c" ] || fail "seeds 7 and 8 gave the same samples"
g=$(s --ids --temperature 0 --max-new-tokens 30 --num-samples 2) || fail "greedy"
k=$(s --ids --top-k 1 --seed 3 --max-new-tokens 30 --num-samples 2) || fail "top-k 1"
[ "$g" = "$k" ] || fail "top-k 1 differs from greedy:
$g
$k"

# --stream prints the same text; llm.c's tokenizer file of the 256 bytes too
t=$(s --seed 5 --max-new-tokens 30) || fail "text"
st=$(s --seed 5 --max-new-tokens 30 --stream) || fail "stream"
[ "$t" = "$st" ] || fail "--stream differs: [$t] [$st]"
python3 - "$dir/tok.bin" <<'PY' || fail "writing the tokenizer"
import struct, sys
h = [0] * 256
h[0], h[1], h[2] = 20240328, 1, 256
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256I", *h))
    for i in range(256):
        f.write(bytes([1, i]))
PY
tk=$(s --seed 5 --max-new-tokens 30 --tokenizer "$dir/tok.bin") || fail "tokenizer"
[ "$t" = "$tk" ] || fail "--tokenizer differs: [$t] [$tk]"

# no nn.attention: the full forward, said so
cat >"$dir/bigram.lua" <<'LUA'
sym{B = 4, T = 16, V = 256}
local tokens = input("tokens", {"B", "T"}, "i32")
local targets = input("targets", {"B", "T"}, "i32")
local w = param("w", {"V", "V"}, normal(0.02))
local logits = gather(w, tokens)
minimize(nn.cross_entropy(logits, targets))
output("logits", logits)
train{data = "text", data_path = "tests/data/tiny.txt", batch = 4, steps = 20, lr = 0.1}
LUA
"$KILN" train "$dir/bigram.lua" --save-weights "$dir/bigram.st" -q >/dev/null 2>&1 ||
    fail "training bigram"
"$KILN" sample "$dir/bigram.lua" --init-from "$dir/bigram.st" --prompt "a" --max-new-tokens 5 \
    >/dev/null 2>"$dir/bg.err" || fail "bigram: $(cat "$dir/bg.err")"
grep -q "no KV cache: the full forward over the window at every token (the script's attention keeps no cache" \
    "$dir/bg.err" || fail "bigram path: $(cat "$dir/bg.err")"

# a mixing over time that is not attention (a running sum over T): in
# decode mode it sees the step's token only; the first step disagrees with
# the prefill and the full forward serves
sed 's/^x = nn.dropout(x, cfg.dropout)$/x = nn.dropout(x, cfg.dropout) + 0.5 * nn.cumsum(x, 1)/' \
    models/gpt.lua >"$dir/gptsum.lua"
grep -q 'nn.cumsum(x, 1)' "$dir/gptsum.lua" || fail "sed did not change gpt.lua"
x=$("$KILN" sample "$dir/gptsum.lua" --init-from "$dir/gpt.st" --prompt "The " --ids \
    --temperature 0 --max-new-tokens 20 2>"$dir/sum.err") || fail "gptsum: $(cat "$dir/sum.err")"
grep -q "no KV cache: the one-token step disagreed with the prefill" "$dir/sum.err" ||
    fail "no check: $(cat "$dir/sum.err")"
z=$("$KILN" sample "$dir/gptsum.lua" --init-from "$dir/gpt.st" --prompt "The " --ids \
    --temperature 0 --max-new-tokens 20 --no-kv-cache 2>/dev/null) || fail "gptsum full"
[ "$x" = "$z" ] || fail "the fallback after the check differs: $x / $z"
y=$(s --ids --temperature 0 --max-new-tokens 20) || fail "greedy 20"

# a script whose decode-mode run declares a param of its own: no cache, said so
sed 's/^minimize(/if nn.decode then logits = logits + param("extra", {"V"}, zeros()) end\nminimize(/' \
    models/gpt.lua >"$dir/gptx.lua"
grep -q '"extra"' "$dir/gptx.lua" || fail "sed did not change gpt.lua"
x=$("$KILN" sample "$dir/gptx.lua" --init-from "$dir/gpt.st" --prompt "The " --ids \
    --temperature 0 --max-new-tokens 20 2>"$dir/x.err") || fail "gptx: $(cat "$dir/x.err")"
grep -q 'no KV cache: .*(in decode mode the script declares param "extra", which the training graph has not)' \
    "$dir/x.err" || fail "gptx path: $(cat "$dir/x.err")"
[ "$x" = "$y" ] || fail "gptx differs from greedy: $x / $y"
"$KILN" sample --help | grep -q -- '--top-p P' || fail "kiln sample --help"

# kiln compile --target: the decode step's predicted time, for language
# models only
"$KILN" compile models/gpt.lua --target h100 >"$dir/c.out" 2>&1 || fail "compile --target"
grep -qE '^predicted decode step on h100 \(kiln sample.s one-token step with a KV cache: 4 rows, 4 cache tensors of 32 positions\): [0-9.]+ us per step, [0-9]+ tokens/s' \
    "$dir/c.out" || fail "no decode prediction: $(grep decode "$dir/c.out")"
"$KILN" compile models/mlp.lua --target h100 2>&1 | grep -q 'decode' && fail "mlp.lua: a decode line"

# train{sample_every}: a sample line at steps 50 and 100 (the last), the
# same in two runs, and in the report
for i in 1 2; do
    "$KILN" train models/gpt.lua --steps 100 --set sample_every=50 --set sample_tokens=20 \
        --set 'sample_prompt=The ' --log-dir "$dir/log$i" 2>&1 | grep '^sample' >"$dir/ts$i" ||
        fail "train sample_every"
done
[ "$(cut -c1-14 "$dir/ts1" | tr '\n' /)" = "sample    50 |/sample   100 |/" ] ||
    fail "sample lines: $(cat "$dir/ts1")"
grep -qE '^sample    50 \| The .{20}$' "$dir/ts1" || fail "not prompt + 20 bytes: $(cat "$dir/ts1")"
cmp -s "$dir/ts1" "$dir/ts2" || fail "samples differ between two runs: $(cat "$dir/ts1" "$dir/ts2")"
[ "$(grep -c '<h2>Sample at step' "$dir/log1/report.html")" -eq 2 ] || fail "no samples in the report"

# the trained model's bytes: total variation distance of 1600 sampled bytes
# to the data's byte distribution, against the distance to uniform
s --ids --seed 11 --num-samples 8 --max-new-tokens 200 >"$dir/ids" || fail "long sample"
python3 - "$dir/ids" tests/data/tiny.txt <<'PY' || fail "byte distribution"
import collections, math, sys
ids = [int(t) for l in open(sys.argv[1]) for t in l.split(":")[1].split()]
data = open(sys.argv[2], "rb").read()
n = len(ids)
emp = collections.Counter(ids)
ref = collections.Counter(data)
p = [ref[i] / len(data) for i in range(256)]
q = [emp[i] / n for i in range(256)]
tv_data = 0.5 * sum(abs(a - b) for a, b in zip(q, p))
tv_unif = 0.5 * sum(abs(a - 1 / 256) for a in q)
tv_pu = 0.5 * sum(abs(a - 1 / 256) for a in p)
# an exact draw from the data's distribution has E[TV] <= 0.5 sum
# sqrt(p(1-p)/n) (about 0.07 here); a model trained 300 steps is allowed
# twice that plus 0.1 (its unigram distribution is not exact; it measured
# 0.075), and it must be nearer the data than uniform by half the data's
# own distance to uniform (an untrained model is near uniform: TV ~0.8)
noise = 0.5 * sum(math.sqrt(a * (1 - a) / n) for a in p)
bound = 2 * noise + 0.1
print(f"{n} bytes: TV to data {tv_data:.3f} (bound {bound:.3f}), to uniform {tv_unif:.3f}; "
      f"data to uniform {tv_pu:.3f}")
assert n == 1600, n
assert tv_data < bound, (tv_data, bound)
assert tv_unif - tv_data > 0.5 * tv_pu, (tv_unif, tv_data, tv_pu)
PY
echo "ok"
