#!/bin/bash
# OpenBLAS's kernels (runtime/cpu/blas.c): on a CPU with AVX2 and FMA, kiln
# runs with kernels that use them even where OpenBLAS fell back to older ones
# (it runs itself again with OPENBLAS_CORETYPE set, and the run that follows
# is the whole command: it trains and prints its summary once); a user's
# OPENBLAS_CORETYPE is kept.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-blas-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

run() { # LOG [ENV...]: kiln train -v of a few steps
    local log=$1; shift
    env -u OPENBLAS_CORETYPE "$@" "$KILN" train models/mlp.lua --steps 3 -v > "$log" 2>&1 ||
        fail "kiln train failed: $(cat "$log")"
    [ "$(grep -c '^final:' "$log")" = 1 ] || fail "not one final line in: $(cat "$log")"
    [ "$(grep -c '^kiln: OpenBLAS runs its ' "$log")" = 1 ] ||
        fail "not one 'OpenBLAS runs its' line in: $(cat "$log")"
    sed -n 's/^kiln: OpenBLAS runs its \([^ ]*\) kernels.*/\1/p' "$log"
}

core=$(run "$dir/auto.log")
echo "kernels: $core"
if grep -q 'chose its' "$dir/auto.log"; then
    forced=$(sed -n 's/.*running again with OPENBLAS_CORETYPE=\([^ ]*\)$/\1/p' "$dir/auto.log")
    [ "$core" = "$forced" ] || fail "forced $forced, runs $core: $(cat "$dir/auto.log")"
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo)
if grep -qw avx2 <<<"$flags" && grep -qw fma <<<"$flags"; then
    case "$core" in
    SkylakeX | Cooperlake | SapphireRapids | Haswell | Zen | Excavator) ;;
    *) fail "this CPU has AVX2 and FMA, but kiln runs OpenBLAS's $core kernels" ;;
    esac
fi

user=$(run "$dir/user.log" OPENBLAS_CORETYPE=Prescott)
[ "$user" = Prescott ] || fail "OPENBLAS_CORETYPE=Prescott runs $user: $(cat "$dir/user.log")"
grep -q 'chose its' "$dir/user.log" && fail "restarted despite the user's OPENBLAS_CORETYPE"
echo "PASS"
