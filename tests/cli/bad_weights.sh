#!/bin/bash
# Bad weights and checkpoints (--init-from, --resume, --save-weights, --checkpoint):
# safetensors headers with duplicate keys (tensor, __metadata__, a key inside it),
# header lengths past the file or past the format's cap, trailing bytes after the
# header, offsets out of range, not matching dtype x shape, or overlapping, a dims
# product that overflows, too many dims, an unknown dtype;
# files that do not fit the model (dtype, shape); NaN and Inf in weights and in a
# checkpoint's optimizer state; a directory, a FIFO or a device as the file;
# a directory, a FIFO or a symlink to a device as an output (weights,
# checkpoint, trace) refused, never replaced;
# a diverged run's params are never written (weights or checkpoint);
# stale temp files of a killed writer are removed at start, a live writer's kept.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh
export LC_ALL=C

# the model: mlp with hidden=4, depth=1 has fc1.weight f32[2,4], fc1.bias f32[4],
# head.weight f32[4,4], head.bias f32[4] (128 bytes of data)
mlp=("$KILN" train models/mlp.lua --steps 2 --set hidden=4 --set depth=1)
T1='"fc1.weight":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]}'
T2='"fc1.bias":{"dtype":"F32","shape":[4],"data_offsets":[32,48]}'
T3='"head.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[48,112]}'
T4='"head.bias":{"dtype":"F32","shape":[4],"data_offsets":[112,128]}'
ALL="$T1,$T2,$T3,$T4"

# u64 little-endian
le64() {
    local v=$1 i s=''
    for i in 0 1 2 3 4 5 6 7; do s+=$(printf '\\%03o' $(((v >> (8 * i)) & 255))); done
    printf "$s"
}
# mkst PATH JSON [DATA_BYTES]: a safetensors file, its data DATA_BYTES zero
# bytes (default 128)
mkst() {
    { le64 ${#2}; printf '%s' "$2"; head -c "${3:-128}" /dev/zero; } > "$1"
}
# poke PATH OFFSET BYTES: overwrite bytes (printf escapes) at OFFSET
poke() { printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
NAN='\000\000\300\177' # f32 0x7fc00000
INF='\000\000\200\177' # f32 0x7f800000

# a well-formed file loads (the cases below differ from it in one thing)
mkst "$dir/good.safetensors" "{$ALL}"
"${mlp[@]}" --init-from "$dir/good.safetensors" > "$dir/ok.log" 2>&1 ||
    fail "a well-formed weights file was refused: $(cat "$dir/ok.log")"
grep -q "initialised params from" "$dir/ok.log" || fail "no init-from note: $(cat "$dir/ok.log")"

# duplicate keys: __metadata__ twice with many keys (a heap overflow before),
# a tensor twice, a key twice inside __metadata__
meta=''
for i in $(seq 1 400); do meta+="\"k$i\":\"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\","; done
mkst "$dir/dupmeta.safetensors" "{\"__metadata__\":{${meta%,}},\"__metadata__\":{\"a\":\"b\"},$ALL}"
expect_error "$dir/dupmeta.safetensors" 'key "__metadata__" appears twice' -- \
    "${mlp[@]}" --init-from "$dir/dupmeta.safetensors"
mkst "$dir/duptensor.safetensors" "{$ALL,$T2}"
expect_error "$dir/duptensor.safetensors" 'tensor "fc1.bias" appears twice' -- \
    "${mlp[@]}" --init-from "$dir/duptensor.safetensors"
mkst "$dir/dupkey.safetensors" "{\"__metadata__\":{\"kiln.kind\":\"weights\",\"kiln.kind\":\"checkpoint\"},$ALL}"
expect_error "$dir/dupkey.safetensors" '__metadata__ key "kiln.kind" appears twice' -- \
    "${mlp[@]}" --resume "$dir/dupkey.safetensors"

# header lengths: past the end of the file, and over the 100 MB cap (a sparse
# file, so that the length fits in it)
{ le64 9223372036854775807; printf '{}'; } > "$dir/hugehdr.safetensors"
expect_error "$dir/hugehdr.safetensors" "header length 9223372036854775807 exceeds the file" -- \
    "${mlp[@]}" --init-from "$dir/hugehdr.safetensors"
{ le64 150000000; printf '{}'; } > "$dir/caphdr.safetensors"
truncate -s 200000000 "$dir/caphdr.safetensors"
expect_error "$dir/caphdr.safetensors" "header length 150000000 is too large" \
    "expected at most 100000000 bytes" -- "${mlp[@]}" --init-from "$dir/caphdr.safetensors"
mkst "$dir/trail.safetensors" "{$ALL}xyz"
expect_error "$dir/trail.safetensors" "bytes after its JSON object" -- \
    "${mlp[@]}" --init-from "$dir/trail.safetensors"

# data: truncated (offsets out of range), offsets that do not match the shape,
# overlapping tensors, a dims product past 2^64, too many dims, unknown dtype
mkst "$dir/trunc.safetensors" "{$ALL}" 100
expect_error "$dir/trunc.safetensors" '"head.weight"' "out of range" \
    "expected at most the data section's 100 bytes" -- "${mlp[@]}" --init-from "$dir/trunc.safetensors"
mkst "$dir/offs.safetensors" "{$T1,$T2,$T3,\"head.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[112,120]}}"
expect_error "$dir/offs.safetensors" '"head.bias"' "do not match its dtype and shape" \
    "expected 16 bytes" -- "${mlp[@]}" --init-from "$dir/offs.safetensors"
mkst "$dir/overlap.safetensors" "{$T1,\"fc1.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]},$T3,$T4}"
expect_error "$dir/overlap.safetensors" "overlap" '"fc1.weight"' '"fc1.bias"' -- \
    "${mlp[@]}" --init-from "$dir/overlap.safetensors"
mkst "$dir/overflow.safetensors" "{\"big\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,128]}}"
expect_error "$dir/overflow.safetensors" '"big"' "over 2^64 elements" -- \
    "${mlp[@]}" --init-from "$dir/overflow.safetensors"
mkst "$dir/rank.safetensors" "{\"r\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]},$T2}"
expect_error "$dir/rank.safetensors" "too many dimensions (expected at most 8, got 9)" -- \
    "${mlp[@]}" --init-from "$dir/rank.safetensors"
mkst "$dir/f64.safetensors" "{\"fc1.weight\":{\"dtype\":\"F64\",\"shape\":[2,4],\"data_offsets\":[0,64]},$T3}"
expect_error "$dir/f64.safetensors" "unsupported dtype" "got F64" -- \
    "${mlp[@]}" --init-from "$dir/f64.safetensors"

# well-formed files that do not fit the model: a dtype, a shape
mkst "$dir/i32.safetensors" "{\"fc1.weight\":{\"dtype\":\"I32\",\"shape\":[2,4],\"data_offsets\":[0,32]},$T2,$T3,$T4}"
expect_error "$dir/i32.safetensors" '"fc1.weight"' "has the wrong shape" -- \
    "${mlp[@]}" --init-from "$dir/i32.safetensors"
expect_error "$dir/good.safetensors" '"fc1.weight"' "has the wrong shape" "[2,8]" "[2,4]" -- \
    "${mlp[@]}" --set hidden=8 --init-from "$dir/good.safetensors"

# non-finite values: NaN and Inf in weights (named with the first index), NaN
# in a checkpoint's optimizer state
cp "$dir/good.safetensors" "$dir/nan.safetensors"
hl=$(($(stat -c %s "$dir/good.safetensors") - 128))
poke "$dir/nan.safetensors" $((hl + 32 + 4 * 2)) "$NAN"
poke "$dir/nan.safetensors" $((hl + 32 + 4 * 3)) "$INF"
expect_error "$dir/nan.safetensors" 'tensor "fc1.bias" holds NaN at index 2' -- \
    "${mlp[@]}" --init-from "$dir/nan.safetensors"
cp "$dir/good.safetensors" "$dir/inf.safetensors"
poke "$dir/inf.safetensors" $((hl + 48 + 4 * 7)) '\000\000\200\377'
expect_error "$dir/inf.safetensors" 'tensor "head.weight" holds -Inf at index 7' -- \
    "${mlp[@]}" --init-from "$dir/inf.safetensors"
"${mlp[@]}" --checkpoint "$dir/ck" -q > "$dir/ck.log" 2>&1 || fail "training failed: $(cat "$dir/ck.log")"
ck=$dir/ck.step2.safetensors
hl=$(od -An -tu8 -N8 "$ck" | tr -d ' ')
begin=$(grep -ao '"adam.m.head.weight":{[^}]*}' "$ck" | sed 's/.*data_offsets":\[\([0-9]*\),.*/\1/')
[ -n "$begin" ] || fail "no adam.m.head.weight in $ck"
poke "$ck" $((8 + hl + begin + 4 * 5)) "$NAN"
expect_error "$ck" 'tensor "adam.m.head.weight" holds NaN at index 5' -- "${mlp[@]}" --steps 3 --resume "$ck"

# not a regular file: a directory (--init-from, --resume), a FIFO (no hang),
# a device (no endless read)
mkdir "$dir/adir"
expect_error "$dir/adir" "expected a regular file, got a directory" -- "${mlp[@]}" --init-from "$dir/adir"
expect_error "$dir/adir" "expected a regular file, got a directory" -- "${mlp[@]}" --resume "$dir/adir"
mkfifo "$dir/fifo"
expect_error -t 30 "$dir/fifo" "expected a regular file, got a FIFO" -- "${mlp[@]}" --init-from "$dir/fifo"
expect_error -t 30 "/dev/zero" "expected a regular file, got a character device" -- \
    "${mlp[@]}" --resume /dev/zero

# not a regular file as an output (--save-weights, --checkpoint, --trace): a
# symlink to a device, a FIFO, a directory are refused, never replaced by a
# file (the rename would replace a device node when run as root); weights
# are refused before training
ln -s /dev/full "$dir/wdev"
expect_error "$dir/wdev: cannot write (expected a regular file, got a character device)" -- \
    "${mlp[@]}" --save-weights "$dir/wdev"
grep -q "final:" "$dir/err.log" && fail "--save-weights to a device trained before refusing it"
[ -L "$dir/wdev" ] && [ -c /dev/full ] || fail "--save-weights replaced a symlink to a device"
expect_error -t 30 "$dir/fifo: cannot write (expected a regular file, got a FIFO)" -- \
    "${mlp[@]}" --save-weights "$dir/fifo"
[ -p "$dir/fifo" ] || fail "--save-weights replaced a FIFO"
expect_error "$dir/adir: cannot write (expected a regular file, got a directory)" -- \
    "${mlp[@]}" --save-weights "$dir/adir"
mkdir "$dir/ckd.step1.safetensors"
expect_error "$dir/ckd.step1.safetensors: cannot write (expected a regular file, got a directory)" -- \
    "${mlp[@]}" --checkpoint "$dir/ckd" --set checkpoint_every=1
ln -s /dev/full "$dir/ckl.step2.safetensors"
expect_error "$dir/ckl.step2.safetensors: cannot write (expected a regular file, got a character device)" -- \
    "${mlp[@]}" --checkpoint "$dir/ckl"
[ -L "$dir/ckl.step2.safetensors" ] || fail "--checkpoint replaced a symlink to a device"
expect_error "$dir/adir: cannot write (expected a regular file, got a directory)" -- \
    "${mlp[@]}" --trace "$dir/adir"
[ -d "$dir/adir" ] || fail "--trace replaced a directory"

# a diverged run (lr past f32's range) writes neither weights nor
# checkpoint: the loop stops first (tests/cli/diverge.sh); the writers'
# own refusal of non-finite values is tested in test_checkpoint
expect_error "training diverged at step 1" -- \
    "${mlp[@]}" --steps 1 --set lr=1e41 --save-weights "$dir/inf-w.safetensors"
[ -e "$dir/inf-w.safetensors" ] && fail "a non-finite weights file was written"
expect_error "training diverged at step 1" -- \
    "${mlp[@]}" --set lr=1e41 --checkpoint "$dir/inf-ck" --set checkpoint_every=1
[ -e "$dir/inf-ck.step1.safetensors" ] && fail "a non-finite checkpoint was written"

# stale temp files: a killed writer's (no such pid) are removed at start; a
# live writer's (this shell) and unrelated names are kept
mkdir "$dir/sw"
dead1=$dir/sw/ck.step4.safetensors.tmp.999999999.AbC123
dead2=$dir/sw/w.safetensors.tmp.999999998.x1Y2z3
live=$dir/sw/ck.step2.safetensors.tmp.$$.Qw3rTy
other=$dir/sw/ckx.step2.safetensors.tmp.999999999.AbC123
touch "$dead1" "$dead2" "$live" "$other"
"${mlp[@]}" --checkpoint "$dir/sw/ck" --save-weights "$dir/sw/w.safetensors" > "$dir/sw.log" 2>&1 ||
    fail "training with stale temp files failed: $(cat "$dir/sw.log")"
grep -q "removed 2 stale temp files of an interrupted write" "$dir/sw.log" ||
    fail "no note of the removed temp files: $(cat "$dir/sw.log")"
[ -e "$dead1" ] || [ -e "$dead2" ] && fail "a dead writer's temp file was left"
[ -e "$live" ] && [ -e "$other" ] || fail "a live writer's or an unrelated file was removed"
case_recovered "stale temp files of a killed writer are removed at start"
rm -r "$dir/sw"

# a checkpoint's step, data position or seed out of range or not plain
# digits is refused, never clamped (before: kiln.step "99999999999999999999"
# resumed at step 9223372036854775807)
"${mlp[@]}" --checkpoint "$dir/meta" > "$dir/meta.log" 2>&1 ||
    fail "training for a checkpoint failed: $(cat "$dir/meta.log")"
ck="$dir/meta.step2.safetensors"
hlen=$(od -An -t u8 -N 8 "$ck" | tr -d ' ')
hdr=$(tail -c +9 "$ck" | head -c "$hlen")
case $hdr in *'"kiln.step":"2"'*) ;; *) fail "no kiln.step 2 in $ck: $hdr" ;; esac
# remeta KEY VALUE OUT: the checkpoint with KEY's value replaced
remeta() {
    local h
    h=$(printf '%s' "$hdr" | sed "s/\"$1\":\"[^\"]*\"/\"$1\":\"$2\"/")
    { le64 ${#h}; printf '%s' "$h"; tail -c +$((9 + hlen)) "$ck"; } > "$3"
}
remeta kiln.step 2 "$dir/same.safetensors"
"${mlp[@]}" --steps 3 --resume "$dir/same.safetensors" > "$dir/same.log" 2>&1 ||
    fail "the rewritten checkpoint does not resume: $(cat "$dir/same.log")"
for v in 99999999999999999999 -1 +2 ' 2' 2e3 0x2 ''; do
    remeta kiln.step "$v" "$dir/step.safetensors"
    expect_error "$dir/step.safetensors: corrupt checkpoint metadata: kiln.step \"$v\"" \
        "(expected an integer from 0 to 9223372036854775807)" -- \
        "${mlp[@]}" --steps 3 --resume "$dir/step.safetensors"
done
remeta kiln.data_pos 9223372036854775808 "$dir/pos.safetensors"
expect_error "corrupt checkpoint metadata: kiln.data_pos \"9223372036854775808\"" -- \
    "${mlp[@]}" --steps 3 --resume "$dir/pos.safetensors"
remeta kiln.seed 18446744073709551616 "$dir/seed.safetensors"
expect_error "corrupt checkpoint metadata: kiln.seed \"18446744073709551616\"" \
    "(expected an integer from 0 to 18446744073709551615)" -- \
    "${mlp[@]}" --steps 3 --resume "$dir/seed.safetensors"
remeta kiln.seed -1 "$dir/seed.safetensors"
expect_error "corrupt checkpoint metadata: kiln.seed \"-1\"" -- \
    "${mlp[@]}" --steps 3 --resume "$dir/seed.safetensors"

bad_input_done
