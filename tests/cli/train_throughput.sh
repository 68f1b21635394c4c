#!/bin/bash
# Throughput (issue 42) is tokens/s only where the data has a token axis,
# otherwise examples/s: on the step lines, the final line, the report's plot
# and in metrics.jsonl (examples_per_s always; tokens_per_s, null without a
# token axis). Runs blobs (no token axis), addition (tokens [B,T]), tensors
# with only x and y (no token axis) and tensors feeding a language model its
# tokens [B,T] (a token axis: 328 "tok/s" for a model running ~10k tokens/s
# was the bug).
set -u
: "${KILN:?}"
command -v python3 > /dev/null || { echo "python3 not installed: skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tput-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. tests/cli/lib/arrays.sh

# run NAME UNIT PER_EXAMPLE BATCH KILN-ARGS...: the run's lines say UNIT,
# never the other unit; metrics.jsonl's examples_per_s * ms = BATCH and
# tokens_per_s = PER_EXAMPLE * examples_per_s (null for PER_EXAMPLE 0);
# the report plots UNIT's long name
run() {
    local name=$1 unit=$2 per=$3 batch=$4
    shift 4
    "$KILN" train "$@" --set log_every=1 --log-dir "$dir/$name" > "$dir/$name.log" 2>&1 ||
        fail "$name: $(tail -3 "$dir/$name.log")"
    local other=tok/s long=examples/s
    [ "$unit" = tok/s ] && other=ex/s long=tokens/s
    grep -qE "^step .* \| +[0-9]+ $unit \|" "$dir/$name.log" || fail "$name: no $unit on the step lines"
    grep -qE "^final: .* \| [0-9]+ $unit \|" "$dir/$name.log" || fail "$name: no $unit on the final line"
    ! grep -q " $other " "$dir/$name.log" || fail "$name: $other in $(grep " $other " "$dir/$name.log" | head -1)"
    python3 - "$dir/$name/metrics.jsonl" "$per" "$batch" <<'PY' || fail "$name: metrics.jsonl"
import json, sys
per, batch = int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows
for r in rows:
    ex = r["examples_per_s"]
    assert abs(ex * r["ms"] / 1e3 - batch) < 1e-3 * batch, (ex, r["ms"], batch)
    if per == 0:
        assert r["tokens_per_s"] is None, r
    else:
        assert abs(r["tokens_per_s"] - per * ex) < 1e-6 * per * ex, (r, per)
PY
    grep -q "$long" "$dir/$name/report.html" || fail "$name: report.html has no $long plot"
}

run blobs ex/s 0 32 tests/data/aux_loss.lua --steps 3
run addition tok/s 12 64 models/addition.lua --steps 2

blob_xy 96 1 "$dir/x.raw" "$dir/y.raw"
mkdir "$dir/xy"
npy_file "$dir/xy/x.npy" 1 '<f4' '(96, 4)' "$dir/x.raw"
npy_file "$dir/xy/y.npy" 1 '<i4' '(96,)' "$dir/y.raw"
run tensors_xy ex/s 0 16 tests/data/tensors_mlp.lua --steps 3 --set data_path="$dir/xy"

# a language model on tensors data: tokens and targets i32[N, 12]
python3 -c "
import struct, sys
open(sys.argv[1], 'wb').write(struct.pack('<%di' % (64 * 12), *[(i * 7) % 16 for i in range(64 * 12)]))
" "$dir/tok.raw"
mkdir "$dir/lm"
npy_file "$dir/lm/tokens.npy" 1 '<i4' '(64, 12)' "$dir/tok.raw"
npy_file "$dir/lm/targets.npy" 1 '<i4' '(64, 12)' "$dir/tok.raw"
cat > "$dir/lm.lua" <<'LUA'
local tokens = input("tokens", {8, 12}, "i32")
local targets = input("targets", {8, 12}, "i32")
local emb = nn.Embedding("wte", 16, 8)
local head = nn.Linear("head", 8, 16)
minimize(nn.cross_entropy(head(emb(tokens)), targets))
train{data = "tensors", batch = 8, steps = 3, lr = 1e-2}
LUA
run tensors_lm tok/s 12 8 "$dir/lm.lua" --set data_path="$dir/lm"
echo "ok"
