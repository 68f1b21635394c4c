#!/bin/bash
# Runs every libFuzzer target of a -DKILN_FUZZ=ON build for a bounded time:
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET] [JOBS]
# (defaults: 60 s, one target per core). Each target runs for the full
# SECONDS; up to JOBS of them run at once, each in one process with its own
# kernel cache, so the wall time is about ceil(targets / JOBS) * SECONDS.
# Each target starts from its seed corpus (tests/fuzz/corpus/NAME/, left
# unchanged: new inputs go to a scratch directory). A crash, a leak, a
# sanitizer report or a timeout fails the run; the input that did it is kept
# as BUILD_DIR/fuzz-artifacts/NAME-crash-*, to add to the seed corpus with
# its fix.
set -u
build=${1:?usage: tests/fuzz/run.sh BUILD_DIR [SECONDS] [JOBS]}
secs=${2:-60}
jobs=${3:-$(nproc 2>/dev/null || echo 1)}
src=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kiln-fuzz-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$build/fuzz-artifacts"

# fuzz_one SHORT BIN: runs one target; its exit status in $scratch/SHORT.rc
fuzz_one() {
    local short=$1 bin=$2
    local dict=() # tests/fuzz/NAME.dict: the reader's tokens, for libFuzzer's mutations
    [ -f "$src/$short.dict" ] && dict=("-dict=$src/$short.dict")
    mkdir -p "$scratch/$short"
    KILN_CACHE_DIR="$scratch/cache-$short" "$bin" -max_total_time="$secs" -timeout=20 \
        -rss_limit_mb=3072 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$build/fuzz-artifacts/$short-" "${dict[@]}" \
        "$scratch/$short" "$src/corpus/$short" > "$scratch/$short.log" 2>&1
    echo $? > "$scratch/$short.rc"
}

names=()
for bin in "$build"/tests/fuzz/fuzz_*; do
    [ -x "$bin" ] || continue
    short=$(basename "$bin"); short=${short#fuzz_}
    names+=("$short")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    fuzz_one "$short" "$bin" &
done
wait
[ ${#names[@]} -gt 0 ] || { echo "no fuzz targets in $build/tests/fuzz"; exit 1; }

status=0
for short in "${names[@]}"; do
    echo "== fuzz_$short: ${secs} s"
    if [ "$(cat "$scratch/$short.rc" 2>/dev/null)" != 0 ]; then
        echo "FAIL: fuzz_$short"; tail -60 "$scratch/$short.log"
        status=1
    else
        grep -E "stat::number_of_executed_units|stat::new_units_added" "$scratch/$short.log"
    fi
done
exit $status
