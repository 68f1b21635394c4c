# Shared by the CLI tests that train a model several ways and compare the
# runs (tp.sh, pp.sh, pp_loop.sh, pp_zero.sh, dp_eval.sh): source it after
# `set -u`. It needs $KILN (the kiln binary), makes the scratch directory
# $T (removed on exit) and defines `fail MESSAGE` (prints it, exit 1).
#
# gpt's key bias (c_attn.bias, columns C..2C) gets a gradient that is zero
# in exact arithmetic (see tests/cli/tp.sh), so same_params compares those
# columns to 1e-3 absolute when given gpt's width.

: "${KILN:?KILN must point at the kiln binary}"
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

# expect NAME PATTERN ARGS...: kiln ARGS fails (not by a signal) saying
# PATTERN; its output in $T/NAME.log
expect() {
    local name=$1 pat=$2
    shift 2
    "$KILN" "$@" >"$T/$name.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "$name: exit $rc: $(tail -3 "$T/$name.log")"
    grep -q -- "$pat" "$T/$name.log" || fail "$name: expected '$pat', got: $(tail -3 "$T/$name.log")"
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
# columns of c_attn.bias to 1e-3 absolute (see above)
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
