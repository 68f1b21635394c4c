#!/bin/bash
# Runs every libFuzzer target of a -DKILN_FUZZ=ON build for a bounded time:
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]   (default 60)
# Each target starts from its seed corpus (tests/fuzz/corpus/NAME/, left
# unchanged: new inputs go to a scratch directory). A crash, a leak, a
# sanitizer report or a timeout fails the run; the input that did it is kept
# as BUILD_DIR/fuzz-artifacts/NAME-crash-*, to add to the seed corpus with
# its fix.
set -u
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS]}
secs=${2:-60}
src=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$build/fuzz-artifacts"
status=0
n=0
for bin in "$build"/tests/fuzz/fuzz_*; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin"); short=${name#fuzz_}
    n=$((n + 1))
    mkdir -p "$scratch/$short"
    dict=() # tests/fuzz/NAME.dict: the reader's tokens, for libFuzzer's mutations
    [ -f "$src/$short.dict" ] && dict=("-dict=$src/$short.dict")
    echo "== $name: ${secs} s"
    if ! KILN_CACHE_DIR="$scratch/cache" "$bin" -max_total_time="$secs" -timeout=20 \
           -rss_limit_mb=3072 -max_len=65536 -print_final_stats=1 \
           -artifact_prefix="$build/fuzz-artifacts/$short-" "${dict[@]}" \
           "$scratch/$short" "$src/corpus/$short" > "$scratch/$short.log" 2>&1; then
        echo "FAIL: $name"; tail -60 "$scratch/$short.log"
        status=1
    else
        grep -E "stat::number_of_executed_units|stat::new_units_added" "$scratch/$short.log"
    fi
done
[ "$n" -gt 0 ] || { echo "no fuzz targets in $build/tests/fuzz"; exit 1; }
exit $status
