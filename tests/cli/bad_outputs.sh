#!/bin/bash
# Outputs kiln train writes, on hostile paths and a full disk (issue 38):
# - --checkpoint / --save-weights / train.checkpoint naming a device, a
#   directory name, a missing directory, a file as directory, the /dev tree:
#   refused before compiling, naming the flag (before: --checkpoint /dev/full
#   wrote /dev/full.step1.safetensors into /dev);
# - --log-dir on a full disk (KILN_TEST_LOG_FULL=BYTES: the JSON lines' disk
#   holds BYTES; and a real 8 KiB tmpfs where mount works): the first failed
#   write of metrics.jsonl or eval.jsonl is reported when it happens, naming
#   the file and "No space left on device", the run stops (exit 1) with its
#   checkpoint kept, and every line left in the files is whole (before: the
#   only message came at the end, about report.html, and metrics.jsonl
#   ended in a cut line).
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

M=models/mlp.lua
cache="$dir/cache"
train=("$KILN" train "$M" --steps 4 -q --cache-dir "$cache" --peak-gflops 100)

# ---- checkpoint and weights paths (an older kiln wrote these into /dev:
# removed whatever happens)
devclean() { rm -f /dev/full.step*.safetensors /dev/kiln-ckpt.step*.safetensors 2> /dev/null; }
devclean
trap 'devclean; rm -rf "$dir"' EXIT
expect_error "--checkpoint /dev/full: cannot write (expected a prefix for PREFIX.stepN.safetensors files, got a character device)" \
    -- "${train[@]}" --checkpoint /dev/full
ls /dev/full.step* > /dev/null 2>&1 && fail "a checkpoint was written into /dev"
expect_error "--checkpoint /dev/kiln-ckpt: cannot write: directory /dev is the system's device tree" -- \
    "${train[@]}" --checkpoint /dev/kiln-ckpt
ls /dev/kiln-ckpt* > /dev/null 2>&1 && fail "a checkpoint was written into /dev"
expect_error "--checkpoint '$dir/': cannot write: expected a file name prefix" -- "${train[@]}" --checkpoint "$dir/"
expect_error "--checkpoint $dir/none/ck: cannot write: directory $dir/none: No such file or directory" -- \
    "${train[@]}" --checkpoint "$dir/none/ck"
touch "$dir/afile"
expect_error "--checkpoint $dir/afile/ck: cannot write: $dir/afile is a regular file (expected a writable directory)" -- \
    "${train[@]}" --checkpoint "$dir/afile/ck"
expect_error "train.checkpoint /dev/full: cannot write (expected a prefix" -- \
    "${train[@]}" --set checkpoint=/dev/full
expect_error "--save-weights /dev/full: cannot write (expected a regular file, got a character device)" -- \
    "${train[@]}" --save-weights /dev/full
expect_error "--save-weights /proc/kiln.safetensors: cannot write: directory /proc is the system's /proc tree" -- \
    "${train[@]}" --save-weights /proc/kiln.safetensors
mkfifo "$dir/fifo"
expect_error "--save-weights $dir/fifo: cannot write (expected a regular file, got a FIFO)" -- \
    "${train[@]}" --save-weights "$dir/fifo"
# none of these compiled anything: the refusals come before the compiler
[ ! -d "$cache" ] || [ -z "$(ls "$cache")" ] || fail "a refused run compiled kernels into $cache"

# ---- a full disk under --log-dir
# whole_lines FILE: every line ends in a newline and (python3) is a JSON object
whole_lines() {
    [ -f "$1" ] || fail "$1 is missing"
    if [ -s "$1" ] && [ "$(tail -c 1 "$1" | od -An -c | tr -d ' ')" != '\n' ]; then
        fail "$1 ends in a cut line: $(tail -c 80 "$1")"
    fi
    if command -v python3 > /dev/null; then
        python3 -c "
import json, sys
for i, line in enumerate(open(sys.argv[1])):
    assert isinstance(json.loads(line), dict), (i, line)" "$1" || fail "$1 has a line that is not JSON"
    fi
}
log_train=("$KILN" train "$M" --steps 30 -q --cache-dir "$cache" --peak-gflops 100
           --set eval_every=1 --set checkpoint_every=5 --checkpoint "$dir/ck")
saw_metrics=0 saw_eval=0 saw_ckpt=0
for room in 0 150 300 700 1500 2600 4000; do
    rm -rf "$dir/log" "$dir"/ck.step*
    expect_error "cannot write: No space left on device; the run stops at step" -- \
        env KILN_TEST_LOG_FULL=$room "${log_train[@]}" --log-dir "$dir/log"
    grep -q "/metrics.jsonl: cannot write" "$dir/err.log" && saw_metrics=1
    grep -q "/eval.jsonl: cannot write" "$dir/err.log" && saw_eval=1
    whole_lines "$dir/log/metrics.jsonl"
    whole_lines "$dir/log/eval.jsonl"
    [ ! -e "$dir/log/report.html" ] || fail "room $room: a report was written after the failure"
    # the step it names is the last one run: the lines before it are there
    at=$(sed -n 's/.*the run stops at step \([0-9]*\).*/\1/p' "$dir/err.log")
    lines=$(wc -l < "$dir/log/metrics.jsonl")
    [ "$lines" -eq "$at" ] || [ "$lines" -eq $((at - 1)) ] ||
        fail "room $room: stopped at step $at with $lines lines in metrics.jsonl"
    # the last checkpoint: step 5k before the step that failed (its line is
    # written before its checkpoint)
    k=$(( (at - 1) / 5 * 5 ))
    if [ "$k" -gt 0 ]; then
        grep -q "last checkpoint $dir/ck.step$k.safetensors, kept" "$dir/err.log" ||
            fail "room $room: the kept checkpoint is not named: $(cat "$dir/err.log")"
        [ -f "$dir/ck.step$k.safetensors" ] || fail "room $room: the checkpoint is gone"
        saw_ckpt=$k
    else
        grep -q "(no checkpoint written yet)" "$dir/err.log" ||
            fail "room $room: $(cat "$dir/err.log")"
    fi
done
[ $saw_metrics = 1 ] && [ $saw_eval = 1 ] && [ $saw_ckpt -gt 0 ] ||
    fail "the rooms tried did not fail on both files and after a checkpoint ($saw_metrics $saw_eval $saw_ckpt)"
# the run resumes from the kept checkpoint (the last room's)
rm -rf "$dir/log"
"${log_train[@]}" --resume "$dir/ck.step$saw_ckpt.safetensors" --log-dir "$dir/log" > "$dir/out" 2>&1 ||
    fail "resume from the kept checkpoint: $(cat "$dir/out")"
case_recovered "resume after a full disk"

# a real full file system: an 8 KiB tmpfs (needs root; skipped elsewhere)
mkdir -p "$dir/mnt"
if mount -t tmpfs -o size=8k tmpfs "$dir/mnt" 2> /dev/null; then
    trap 'umount "$dir/mnt" 2>/dev/null; devclean; rm -rf "$dir"' EXIT
    expect_error "$dir/mnt/log/" "cannot write: No space left on device; the run stops at step" -- \
        "$KILN" train "$M" --steps 300 -q --cache-dir "$cache" --peak-gflops 100 \
        --set eval_every=10 --log-dir "$dir/mnt/log"
    whole_lines "$dir/mnt/log/metrics.jsonl"
    whole_lines "$dir/mnt/log/eval.jsonl"
    umount "$dir/mnt"
else
    echo "bad_outputs: no tmpfs mount here (not root); the real full disk is not checked"
fi
bad_input_done
