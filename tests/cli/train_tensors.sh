#!/bin/bash
# data = "tensors" end to end on tests/data/tensors_mlp.lua (x f32[B,4],
# y i32[B], 3 classes), with arrays written here in shell (lib/arrays.sh: no
# numpy): the loss falls and held-out accuracy is reported from val_path;
# the same arrays as a safetensors file and as a .npy directory (versions 1
# and 2) give identical per-step losses; another seed gives others; with
# shuffle = false step 1 trains on the file's first 16 examples (the same
# loss as a file of just those) and step 2 on the next 16, while the seeded
# shuffle takes others; a checkpoint resumes at the same place in the
# shuffled order.
set -eu
: "${KILN:?}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-tensors-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. tests/cli/lib/arrays.sh

m=tests/data/tensors_mlp.lua
blob_xy 96 1 "$dir/x.raw" "$dir/y.raw"
blob_xy 48 2 "$dir/vx.raw" "$dir/vy.raw"
st_file "$dir/train.safetensors" x F32 '[96,4]' "$dir/x.raw" y I32 '[96]' "$dir/y.raw"
mkdir "$dir/train" "$dir/val"
npy_file "$dir/train/x.npy" 1 '<f4' '(96, 4)' "$dir/x.raw"
npy_file "$dir/train/y.npy" 2 '<i4' '(96,)' "$dir/y.raw"
npy_file "$dir/val/x.npy" 1 '<f4' '(48, 4)' "$dir/vx.raw"
npy_file "$dir/val/y.npy" 1 '<i4' '(48,)' "$dir/vy.raw"
head -c $((16 * 16)) "$dir/x.raw" > "$dir/x16.raw"
head -c $((16 * 4)) "$dir/y.raw" > "$dir/y16.raw"
st_file "$dir/first16.safetensors" x F32 '[16,4]' "$dir/x16.raw" y I32 '[16]' "$dir/y16.raw"

train() { # LOG ARGS...: a run's output in $dir/LOG, its step losses in $dir/LOG.loss
    local log=$1
    shift
    "$KILN" train "$m" --set log_every=1 "$@" > "$dir/$log" 2>&1 ||
        fail "kiln train $*: $(tail -5 "$dir/$log")"
    grep -o '^step .*| loss [^|]*' "$dir/$log" > "$dir/$log.loss"
    [ -s "$dir/$log.loss" ] || fail "no step lines in $log: $(tail -5 "$dir/$log")"
}
loss_at() { sed -n "${2}p" "$dir/$1.loss" | sed 's/.*loss //; s/ *$//'; }

# training on a safetensors file with a .npy validation directory
train st --set data_path="$dir/train.safetensors" --set val_path="$dir/val"
first=$(loss_at st 1) last=$(loss_at st 60)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 10) }' ||
    fail "loss did not fall: step 1 $first, step 60 $last"
grep -q '^eval  *20 | val loss [0-9.]* | accuracy' "$dir/st" || fail "no eval line with accuracy"
acc=$(grep -o 'accuracy [0-9.]*% ([0-9]*/[0-9]* held-out)' "$dir/st") ||
    fail "no held-out accuracy: $(tail -2 "$dir/st")"
pct=$(echo "$acc" | sed 's/accuracy \([0-9.]*\)%.*/\1/')
awk -v p="$pct" 'BEGIN { exit !(p >= 90) }' || fail "held-out $acc"
echo "safetensors: loss $first -> $last, $acc"

# the same arrays as .npy files: the same steps
train npy --set data_path="$dir/train" --set val_path="$dir/val"
diff "$dir/st.loss" "$dir/npy.loss" > /dev/null || fail "safetensors and .npy runs differ"
train seed7 --set data_path="$dir/train" --set seed=7 --steps 10
if diff <(head -10 "$dir/st.loss") "$dir/seed7.loss" > /dev/null; then
    fail "seed 7 gives seed 1337's losses"
fi

# shuffle = false: batches in file order
train ord --set data_path="$dir/train.safetensors" --set shuffle=false --steps 3
train ord16 --set data_path="$dir/first16.safetensors" --set shuffle=false --set val_fraction=0 \
    --steps 3
train shuf --set data_path="$dir/train.safetensors" --steps 3
[ "$(loss_at ord 1)" = "$(loss_at ord16 1)" ] ||
    fail "shuffle=false step 1 is not the first 16 examples: $(loss_at ord 1) vs $(loss_at ord16 1)"
[ "$(loss_at ord 2)" != "$(loss_at ord16 2)" ] ||
    fail "shuffle=false step 2 repeats the first 16 examples"
[ "$(loss_at shuf 1)" != "$(loss_at ord 1)" ] ||
    fail "the seeded shuffle trains step 1 on the first 16 examples too"
train ord2 --set data_path="$dir/train.safetensors" --set shuffle=false --steps 3
diff "$dir/ord.loss" "$dir/ord2.loss" > /dev/null || fail "shuffle=false runs differ"
echo "order: shuffle=false step 1 = first 16 examples ($(loss_at ord 1)), shuffled $(loss_at shuf 1)"

# resume in the middle of an epoch (96 examples: 6 steps an epoch)
train full --set data_path="$dir/train.safetensors" --steps 20 --set checkpoint_every=9 \
    --checkpoint "$dir/ck"
train res --set data_path="$dir/train.safetensors" --steps 20 --resume "$dir/ck.step9.safetensors"
diff <(sed -n '10,20p' "$dir/full.loss") "$dir/res.loss" > /dev/null ||
    fail "the resumed run's steps 10..20 differ"
echo "train_tensors: ok"
