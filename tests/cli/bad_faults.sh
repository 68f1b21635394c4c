#!/bin/bash
# kiln compile --dump-dir: every dump kind (pass IR, memplan.txt, epilogues.txt, kernel sources) on a full disk (/dev/full)
# kiln compile --dump-after to standard output on a full disk
# kiln train --trace FILE on a full disk (the device itself and a symlink to it); --profile output on a full disk
# kiln train --cache-dir: a regular file, an unwritable directory
# the kernel cache: a cached object truncated, overwritten with garbage, one byte changed: rebuilt, the run succeeds
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

M=models/mlp.lua
train=("$KILN" train "$M" --steps 2 -q)
cache="$dir/cache"

# Dumps: every file a good run writes, one at a time a symlink to /dev/full
# (a full disk without privileges): the error names it, exit 1, and no other
# dump is cut short silently.
"$KILN" compile "$M" --dump-dir "$dir/good" > /dev/null || fail "compile with --dump-dir failed"
dumps=$(cd "$dir/good" && ls -- *.ir *.txt)
kernel_c=$(cd "$dir/good" && ls kernels/*.c | head -1)
kernel_cu=$(cd "$dir/good" && ls kernels/*.cu | head -1)
[ -n "$dumps" ] && [ -n "$kernel_c" ] && [ -n "$kernel_cu" ] || fail "no dumps in $dir/good"
for f in $dumps $kernel_c $kernel_cu; do
    rm -rf "$dir/full"
    mkdir -p "$dir/full/kernels"
    ln -s /dev/full "$dir/full/$f"
    expect_error "$dir/full/$f: cannot write: No space left on device" -- \
        "$KILN" compile "$M" --dump-dir "$dir/full"
done
rm -rf "$dir/full" "$dir/good"
# --dump-after without --dump-dir writes to standard output
expect_error "cannot write standard output: No space left on device" -- \
    bash -c '"$0" compile "$1" --dump-after=all > /dev/full' "$KILN" "$M"

# Traces: /dev/full itself is written in place (never replaced by a file),
# and so is what a symlink points at
expect_error "/dev/full: cannot write: No space left on device" -- \
    "${train[@]}" --trace /dev/full --cache-dir "$cache"
[ -c /dev/full ] || fail "/dev/full is no longer a character device"
ln -s /dev/full "$dir/trace.json"
expect_error "$dir/trace.json: cannot write: No space left on device" -- \
    "${train[@]}" --trace "$dir/trace.json" --cache-dir "$cache"
[ -L "$dir/trace.json" ] || fail "the trace symlink was replaced"
rm -f "$dir/trace.json"
# the profile table (standard output)
expect_error "cannot write standard output: No space left on device" -- \
    bash -c '"$0" train "$1" --steps 2 --profile --cache-dir "$2" > /dev/full' "$KILN" "$M" "$cache"

# The cache directory: a regular file; a directory that cannot be written
touch "$dir/cachefile"
expect_error "$dir/cachefile: cannot create the kernel cache directory" -- \
    "${train[@]}" --cache-dir "$dir/cachefile"
expect_error "$dir/cachefile/sub: cannot create the kernel cache directory" -- \
    "${train[@]}" --cache-dir "$dir/cachefile/sub"
if [ "$(id -u)" -ne 0 ]; then # root writes anywhere
    mkdir "$dir/ro"
    chmod 555 "$dir/ro"
    expect_error "cannot" -- "${train[@]}" --cache-dir "$dir/ro"
    chmod 755 "$dir/ro"
fi

# A damaged cache entry is compiled again (a -v line says why) and the run
# succeeds; before: SIGBUS in dlopen (truncated) or an error on every run.
# (--peak-gflops: no CPU measurement, whose kernels a later run never loads,
# so the cache holds the model's objects only)
rm -rf "$cache"
"${train[@]}" --peak-gflops 100 --cache-dir "$cache" > /dev/null || fail "the first run failed"
objs=$(ls "$cache"/kiln-*.so)
[ -n "$objs" ] || fail "no cached object in $cache"
damage() { # how, file
    local size
    size=$(stat -c %s "$2")
    case "$1" in
    truncate) truncate -s $((size / 2)) "$2" ;;
    garbage) head -c "$size" /dev/urandom > "$2" ;;
    byte) printf '\xff' | dd of="$2" bs=1 seek=$((size / 3)) conv=notrunc 2> /dev/null ;;
    empty) : > "$2" ;;
    esac
}
for how in truncate garbage byte empty; do
    for so in $objs; do
        cp "$so" "$dir/before.so"
        damage "$how" "$so"
        cmp -s "$so" "$dir/before.so" && fail "$how: the object did not change"
        timeout -s KILL 120 "$KILN" train "$M" --steps 2 -v --peak-gflops 100 --cache-dir "$cache" \
            > "$dir/run.log" 2>&1
        rc=$?
        [ "$rc" -eq 0 ] || fail "$how: exit $rc after damaging $so ($(tail -3 "$dir/run.log"))"
        grep -q "cache entry $so is damaged" "$dir/run.log" || \
            fail "$how: no -v line saying $so was rebuilt ($(grep 'cc:' "$dir/run.log"))"
        # the next run is a hit
        "$KILN" train "$M" --steps 2 -v --peak-gflops 100 --cache-dir "$cache" > "$dir/run.log" 2>&1 || \
            fail "$how: the run after the rebuild failed"
        grep -q "cache hit $so" "$dir/run.log" || fail "$how: no cache hit after the rebuild"
        case_recovered "a damaged cache entry ($how) is rebuilt"
    done
done
find "$cache" -name '*.tmp*' | grep -q . && fail "temp files left in the cache"

bad_input_done
