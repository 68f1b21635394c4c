#!/bin/bash
# zero=1 (ZeRO-1) with SGD (momentum, Nesterov, weight decay) and Lion: on 2
# ranks the sharded run's losses and checkpoint (params and the whole
# sgd.buf.P / lion.m.P) equal the unsharded run's within float rounding;
# a sharded run's checkpoint resumes without zero and an unsharded one's
# with it, ending where the straight run ends. Adafactor with zero=1 is
# refused (train_optimizers.sh).
set -u
: "${KILN:?}"
command -v mpirun > /dev/null || { echo "mpirun not installed: skipped"; exit 77; }
command -v python3 > /dev/null || { echo "python3 not installed: skipped"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-zopt-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
m=models/mlp.lua

# cmp_ckpt A B TOL: the same tensors, every element within TOL
cmp_ckpt() {
    python3 - "$@" <<'PY'
import json, struct, sys
def read(p):
    raw = open(p, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n]); d = raw[8 + n:]
    return {k: struct.unpack("<%df" % ((t["data_offsets"][1] - t["data_offsets"][0]) // 4),
                             d[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in h.items() if k != "__metadata__"}
a, b, tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for k in a:
    e = max(abs(x - y) for x, y in zip(a[k], b[k]))
    assert e <= tol, (k, e)
print(" ".join(sorted(k for k in a if "." in k and k.split(".")[0] in ("sgd", "lion"))))
PY
}
val() { grep -o 'val loss [0-9.]*' "$1" | tail -1 | cut -d' ' -f3; }

for opt in "sgd momentum=0.9 nesterov=true weight_decay=0.01" "lion weight_decay=0.01"; do
    set -- $opt
    name=$1
    sets=(--set optimizer=$1)
    shift
    for kv in "$@"; do sets+=(--set "$kv"); done
    for z in 0 1; do
        "$KILN" train $m --steps 20 --nproc 2 --set zero=$z "${sets[@]}" --set checkpoint_every=10 \
            --checkpoint "$dir/$name$z" -q > "$dir/$name$z.log" 2>&1 ||
            fail "$name zero=$z: $(tail -3 "$dir/$name$z.log")"
    done
    state=$(cmp_ckpt "$dir/${name}0.step20.safetensors" "$dir/${name}1.step20.safetensors" 1e-5) ||
        fail "$name: the sharded run's checkpoint differs from the unsharded one's"
    echo "$state" | grep -q "$name\.[a-z.]*fc1.weight" || fail "$name: no whole state in the checkpoint: $state"
    a=$(val "$dir/${name}0.log") b=$(val "$dir/${name}1.log")
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(a != "" && d < 1e-5 && d > -1e-5) }' ||
        fail "$name: val loss $a (zero=0) against $b (zero=1)"
    # a resume each way ends where the straight run ends
    for z in 0 1; do
        other=$((1 - z))
        "$KILN" train $m --steps 20 --nproc 2 --set zero=$other "${sets[@]}" \
            --resume "$dir/$name$z.step10.safetensors" --checkpoint "$dir/r$name$z" -q \
            > "$dir/r$name$z.log" 2>&1 || fail "$name: resume zero=$z -> $other: $(tail -3 "$dir/r$name$z.log")"
        cmp_ckpt "$dir/r$name$z.step20.safetensors" "$dir/${name}$other.step20.safetensors" 1e-5 \
            > /dev/null || fail "$name: resumed zero=$z -> $other differs from the straight run"
    done
    echo "$name: zero=1 matches zero=0 (val loss $a), resumes both ways"
done
