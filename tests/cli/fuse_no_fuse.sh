#!/bin/bash
# --no-fuse gives the same training run as the fused default (losses within
# 1e-5 relative over 20 steps of gpt.lua), and `kiln compile` reports fewer
# kernels and fewer bytes moved after fusion, with every kernel's C and CUDA
# C source in the dump directory.
set -u
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuse-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export KILN_CACHE_DIR="$dir/cache"

for mode in fused unfused; do
  flag=; [ $mode = unfused ] && flag=--no-fuse
  "$KILN" train models/gpt.lua --steps 20 --set log_every=1 --set eval_every=0 $flag \
      > "$dir/$mode.log" 2>&1 || fail "$mode training failed: $(tail -5 "$dir/$mode.log")"
  sed -n 's/^step *\([0-9]*\)\/.*| loss \([0-9.]*\) .*/\1 \2/p' "$dir/$mode.log" > "$dir/$mode.loss"
done
[ "$(wc -l < "$dir/fused.loss")" -ge 20 ] || fail "no per-step losses: $(tail -3 "$dir/fused.log")"
paste "$dir/fused.loss" "$dir/unfused.loss" | awk '{
  d = $2 - $4; if (d < 0) d = -d
  if (d > 1e-5 * $4) { printf "step %d: fused %s, unfused %s\n", $1, $2, $4; bad = 1 } }
  END { exit bad }' || fail "fused and unfused losses differ"

"$KILN" compile models/gpt.lua --dump-after=fuse --dump-dir "$dir/d" > "$dir/compile.log" 2>&1 ||
  fail "compile failed: $(tail -5 "$dir/compile.log")"
line=$(grep '^fusion: kernels' "$dir/compile.log") || fail "no fusion summary"
set -- $(echo "$line" | sed -n 's/fusion: kernels \([0-9]*\) -> \([0-9]*\) .*/\1 \2/p')
[ "${2:-0}" -gt 0 ] && [ "$2" -lt "$1" ] || fail "fusion did not reduce kernels: $line"
grep -q '!group=' "$dir/d/"*-fuse.ir || fail "the fuse dump shows no groups"
nc=$(ls "$dir/d/kernels/"*.c 2>/dev/null | wc -l)
ncu=$(ls "$dir/d/kernels/"*.cu 2>/dev/null | wc -l)
[ "$nc" -gt 0 ] && [ "$nc" -eq "$ncu" ] || fail "kernel dumps: $nc .c, $ncu .cu"
"$KILN" compile models/gpt.lua --no-fuse | grep -q '^fusion: off' || fail "--no-fuse not reported"
echo "fuse: same losses fused and unfused; $line"
