#!/bin/bash
# Bad arrays for data = "tensors" (runtime/train/data_tensors.c and npy.c,
# checked before the first step), each a clear message at the script's
# train{} line naming the file: a missing array, the wrong dtype or shape,
# arrays of different lengths, class ids past the logits, too few examples
# to split; .npy files in Fortran order, big-endian, object arrays, float64,
# int64 labels (with the .astype(np.int32) to write),
# truncated data, a header that claims less than the file holds, a huge
# shape, a bad magic; an empty directory, a missing path, no data_path; a
# bad val_path; shuffle = false and val_path where they do not apply.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh
. tests/cli/lib/arrays.sh

m=tests/data/tensors_mlp.lua
line=$(grep -n '^train{' "$m" | cut -d: -f1)
[ -n "$line" ] || fail "no train{} line in $m"
at="$m:$line:"
run=("$KILN" train "$m" --steps 2)

blob_xy 96 1 "$dir/x.raw" "$dir/y.raw"
head -c $((96 * 3 * 4)) /dev/zero > "$dir/x3.raw"
head -c $((90 * 4)) /dev/zero > "$dir/y90.raw"
printf '\003\000\000\000' > "$dir/three.raw"
cat "$dir/three.raw" "$dir/y.raw" | head -c 384 > "$dir/ybad.raw"

# a valid pair first: the cases below differ from it in one thing
st_file "$dir/ok.safetensors" x F32 '[96,4]' "$dir/x.raw" y I32 '[96]' "$dir/y.raw"
"${run[@]}" --set data_path="$dir/ok.safetensors" > "$dir/ok.log" 2>&1 ||
    fail "valid arrays failed: $(cat "$dir/ok.log")"

# 1. an array missing
st_file "$dir/noy.safetensors" x F32 '[96,4]' "$dir/x.raw"
expect_error "$at $dir/noy.safetensors: no array \"y\"" "expected y i32[N] for N examples" \
    "got arrays: x" -- "${run[@]}" --set data_path="$dir/noy.safetensors"
# 2. the wrong dtype
st_file "$dir/xi.safetensors" x I32 '[96,4]' "$dir/x.raw" y I32 '[96]' "$dir/y.raw"
expect_error "$at $dir/xi.safetensors: array \"x\" does not fit model input x" \
    "expected f32[96,4], got i32[96,4]" -- "${run[@]}" --set data_path="$dir/xi.safetensors"
# 3. the wrong shape after the example axis
st_file "$dir/x3.safetensors" x F32 '[96,3]' "$dir/x3.raw" y I32 '[96]' "$dir/y.raw"
expect_error "$at" "expected f32[96,4], got f32[96,3]" -- \
    "${run[@]}" --set data_path="$dir/x3.safetensors"
# 4. arrays of different lengths
st_file "$dir/len.safetensors" x F32 '[96,4]' "$dir/x.raw" y I32 '[90]' "$dir/y90.raw"
expect_error "$at" "arrays \"x\" and \"y\" hold different numbers of examples" \
    "(expected 96 in each, got 90)" -- "${run[@]}" --set data_path="$dir/len.safetensors"
# 5. a class id past the logits (3 classes)
st_file "$dir/ybad.safetensors" x F32 '[96,4]' "$dir/x.raw" y I32 '[96]' "$dir/ybad.raw"
expect_error "$at" "array \"y\" holds 3 at index 0, out of range" \
    "expected 0 <= value < 3, the classes of the model's logits" -- \
    "${run[@]}" --set data_path="$dir/ybad.safetensors"
# 6. too few examples to split off val_fraction
head -c 16 "$dir/x.raw" > "$dir/x1.raw"; head -c 4 "$dir/y.raw" > "$dir/y1.raw"
st_file "$dir/one.safetensors" x F32 '[1,4]' "$dir/x1.raw" y I32 '[1]' "$dir/y1.raw"
expect_error "$at" "too few examples to split" "1 train and 0 validation" -- \
    "${run[@]}" --set data_path="$dir/one.safetensors"

# .npy directories: y is good, x is the case
npy_case() { # NAME MAJOR DESCR SHAPE RAW [FORTRAN]: a directory $dir/NAME
    mkdir -p "$dir/$1"
    npy_file "$dir/$1/y.npy" 1 '<i4' '(96,)' "$dir/y.raw"
    npy_file "$dir/$1/x.npy" "$2" "$3" "$4" "$5" "${6:-False}"
}
# 7. Fortran order
npy_case fortran 1 '<f4' '(96, 4)' "$dir/x.raw" True
expect_error "$at $dir/fortran/x.npy: Fortran order (expected C order" -- \
    "${run[@]}" --set data_path="$dir/fortran"
# 8. big-endian
npy_case big 2 '>f4' '(96, 4)' "$dir/x.raw"
expect_error "$at $dir/big/x.npy: big-endian data (expected little-endian '<f4', got '>f4'" -- \
    "${run[@]}" --set data_path="$dir/big"
# 9. an object array
npy_case obj 1 '|O' '(96, 4)' "$dir/x.raw"
expect_error "$dir/obj/x.npy: an object array" -- "${run[@]}" --set data_path="$dir/obj"
# 10. float64, with the conversion to make
cat "$dir/x.raw" "$dir/x.raw" > "$dir/x8.raw"
npy_case f8 3 '<f8' '(96, 4)' "$dir/x8.raw"
expect_error "$dir/f8/x.npy: a dtype kiln does not have" "got '<f8'" ".astype(np.float32)" -- \
    "${run[@]}" --set data_path="$dir/f8"
# 10b. int64 labels (NumPy's default integer), with the conversion to make
mkdir "$dir/y64"
for _ in $(seq 96); do printf '\001\000\000\000\000\000\000\000'; done > "$dir/y64.raw"
npy_file "$dir/y64/x.npy" 1 '<f4' '(96, 4)' "$dir/x.raw"
npy_file "$dir/y64/y.npy" 1 '<i8' '(96,)' "$dir/y64.raw"
expect_error "$at $dir/y64: array \"y\" does not fit model input y" "expected i32[96], got i64[96]" \
    "y.astype(np.int32)" -- "${run[@]}" --set data_path="$dir/y64"
# 11. truncated data: the header says 97 rows
npy_case trunc 1 '<f4' '(97, 4)' "$dir/x.raw"
expect_error "$dir/trunc/x.npy: truncated .npy data" "needs 1552 bytes, got 1536" -- \
    "${run[@]}" --set data_path="$dir/trunc"
# 12. the header claims less than the file holds
npy_case lies 1 '<f4' '(95, 4)' "$dir/x.raw"
expect_error "$dir/lies/x.npy: oversized .npy data" "needs 1520 bytes, got 1536" -- \
    "${run[@]}" --set data_path="$dir/lies"
# 13. a shape whose bytes overflow (never allocated)
npy_case huge 1 '<f4' '(4611686018427387904, 4611686018427387904)' "$dir/x.raw"
expect_error "$dir/huge/x.npy: truncated .npy data" "needs over 2^64 bytes" -- \
    "${run[@]}" --set data_path="$dir/huge"
# 14. not a .npy file at all
mkdir "$dir/magic" && cp "$dir/x.raw" "$dir/magic/x.npy"
expect_error "$dir/magic/x.npy: not a .npy file" -- "${run[@]}" --set data_path="$dir/magic"
# 15. an empty directory, a path that does not exist, no data_path
mkdir "$dir/empty"
expect_error "$at $dir/empty: no arrays (expected NAME.npy files" -- \
    "${run[@]}" --set data_path="$dir/empty"
expect_error "$at $dir/nope.safetensors" "No such file" -- \
    "${run[@]}" --set data_path="$dir/nope.safetensors"
expect_error "$at data tensors needs a file (set data_path" -- "${run[@]}"
# 16. a validation file that does not fit
expect_error "$at $dir/x3.safetensors: array \"x\" does not fit" -- \
    "${run[@]}" --set data_path="$dir/ok.safetensors" --set val_path="$dir/x3.safetensors"
# 17. shuffle = false and val_path where they do not apply
mline=$(grep -n '^train{' models/mlp.lua | cut -d: -f1)
expect_error "models/mlp.lua:$mline: train{shuffle=false} does not apply to data blobs" -- \
    "$KILN" train models/mlp.lua --steps 2 --set shuffle=false
gline=$(grep -n '^train{' models/gpt.lua | cut -d: -f1)
expect_error "models/gpt.lua:$gline: train{val_path} does not apply to data text" -- \
    "$KILN" train models/gpt.lua --steps 2 --set val_path="$dir/ok.safetensors"
# 18. a bad shuffle value
expect_error "--set shuffle:" "true, false" "maybe" -- \
    "${run[@]}" --set data_path="$dir/ok.safetensors" --set shuffle=maybe
# 19. NaN and Inf in float data: named before training, with the array, the
# example and the position (before: "training diverged at step 1: gradient
# norm is nan"); --allow-nonfinite-data trains on them
poke() { printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
cp "$dir/x.raw" "$dir/xnan.raw"
poke "$dir/xnan.raw" $(((5 * 4 + 2) * 4)) '\000\000\300\177' # x[5,2] = NaN
st_file "$dir/nan.safetensors" x F32 '[96,4]' "$dir/xnan.raw" y I32 '[96]' "$dir/y.raw"
expect_error "$at $dir/nan.safetensors: array \"x\" holds NaN at example 5, position [2]" \
    "(element 22 of the array; expected finite values" "--allow-nonfinite-data" -- \
    "${run[@]}" --set data_path="$dir/nan.safetensors"
cp "$dir/x.raw" "$dir/xinf.raw"
poke "$dir/xinf.raw" $(((95 * 4 + 3) * 4)) '\000\000\200\377' # x[95,3] = -Inf
npy_case inf 1 '<f4' '(96, 4)' "$dir/xinf.raw"
expect_error "$at $dir/inf/x.npy: array \"x\" holds -Inf at example 95, position [3]" -- \
    "${run[@]}" --set data_path="$dir/inf"
# Inf in a validation file
cp "$dir/x.raw" "$dir/xpinf.raw"
poke "$dir/xpinf.raw" $(((1 * 4) * 4)) '\000\000\200\177' # x[1,0] = Inf
npy_case vinf 1 '<f4' '(96, 4)' "$dir/xpinf.raw"
expect_error "$dir/vinf/x.npy: array \"x\" holds Inf at example 1, position [0]" -- \
    "${run[@]}" --set data_path="$dir/ok.safetensors" --set val_path="$dir/vinf"
# with --allow-nonfinite-data the data is taken: the run trains (a step that
# reads the NaN is skipped here, on_nonfinite=skip)
"${run[@]}" --set data_path="$dir/nan.safetensors" --allow-nonfinite-data \
    --set on_nonfinite=skip > "$dir/allow.log" 2>&1 ||
    fail "--allow-nonfinite-data: $(cat "$dir/allow.log")"
grep -q "holds NaN" "$dir/allow.log" && fail "--allow-nonfinite-data still refused the data"
case_recovered "--allow-nonfinite-data trains on NaN data"
# 20. an array no input reads is ignored, never parsed (docs/training.md):
# an invalid z.npy beside good x.npy and y.npy (before: "z.npy: not a .npy file")
npy_case extra 1 '<f4' '(96, 4)' "$dir/x.raw"
printf 'garbage' > "$dir/extra/z.npy"
"${run[@]}" --set data_path="$dir/extra" > "$dir/extra.log" 2>&1 ||
    fail "an unread invalid z.npy was an error: $(cat "$dir/extra.log")"
case_recovered "an invalid array no input reads is ignored"
# ... and is still named among the arrays when one is missing
rm "$dir/extra/y.npy"
expect_error "$dir/extra: no array \"y\"" "got arrays: x, z" -- "${run[@]}" --set data_path="$dir/extra"
bad_input_done
