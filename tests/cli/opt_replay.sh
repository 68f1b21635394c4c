#!/usr/bin/env bash
# Every pass replays: kiln compile's dump after pass k, run through pass k+1
# with `kiln opt FILE --passes=P(k+1)` and the same settings, is
# byte-identical to the pipeline's own dump after pass k+1, for every pass
# (attention .. memplan, attnlayout and attndqkv among them) and for four sets of flags in which remat
# recomputes, comm places buckets and fuse groups. Then kiln opt's errors:
# a parse error names FILE:LINE, a bad --passes or --set is refused.
set -u
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-replay.XXXXXX")
trap 'rm -rf "$dir"' EXIT

passes=(frontend attention autodiff attnlayout optimizer simplify attndqkv remat fuse comm schedule memplan)
peak() { sed -n 's/^planned peak: .*(\([0-9]*\) bytes.*/\1/p' "$1"; }
$KILN compile models/gpt.lua --nproc 2 > "$dir/none.txt" 2>&1 || fail "compile: $(cat "$dir/none.txt")"
$KILN compile models/gpt.lua --nproc 2 --remat=full > "$dir/full.txt" 2>&1 || fail "compile --remat=full"
none=$(peak "$dir/none.txt"); full=$(peak "$dir/full.txt")
[ -n "$none" ] && [ -n "$full" ] && [ "$full" -lt "$none" ] || fail "peaks: full $full, none $none"
budget=$(( (full + none) / 2 ))

n=0
replay() { # FLAGS...: compile with them, replay every pass with kiln opt
    n=$((n + 1))
    local d="$dir/$n"
    # gpt.lua's train{} sets weight_decay 0.1 (kiln opt starts from the
    # train{} defaults): say it to both
    $KILN compile models/gpt.lua --set weight_decay=0.1 "$@" --dump-dir "$d" > "$d.out" 2>&1 ||
        fail "compile $*: $(cat "$d.out")"
    for k in $(seq 0 $((${#passes[@]} - 2))); do
        local p=${passes[$((k + 1))]}
        local in=$(ls "$d"/$(printf %02d $k)-${passes[$k]}.*)
        local want=$(ls "$d"/$(printf %02d $((k + 1)))-$p.*)
        $KILN opt "$in" --passes="$p" --set weight_decay=0.1 "$@" > "$d.$p" 2> "$d.err" ||
            fail "kiln opt --passes=$p $*: $(cat "$d.err")"
        cmp -s "$d.$p" "$want" || {
            diff "$want" "$d.$p" | head -20
            fail "$p replayed with kiln opt differs from the pipeline's dump ($*)"
        }
    done
    echo "every pass replays: $*"
}

replay --nproc 2 --memory-budget "$budget"
grep -q ' !recompute' "$dir/1/07-remat.ir" || fail "remat recomputed nothing (test too weak)"
grep -q '= allreduce_start ' "$dir/1/09-comm.ir" || fail "comm placed no all-reduce (test too weak)"
grep -q '^# group ' "$dir/1/08-fuse.ir" || fail "fuse made no group (test too weak)"
replay --nproc 2 --no-overlap --remat=selective --set grad_accum=2 --set bucket_mb=0.05
replay --no-fuse --remat=full
# fused attention (on by default): attnlayout and attndqkv rewrite; off, none
grep -q '= attention_dqkv ' "$dir/1/06-attndqkv.ir" ||
    fail "attndqkv made no attention_dqkv (test too weak)"
replay --no-fuse-attention
[ -s "$dir/4/10-schedule.ir" ] || fail "no schedule dump for --no-fuse-attention"
grep -q '= attention' "$dir/4/10-schedule.ir" && fail "--no-fuse-attention left an attention op"

# several passes in one run equal the pipeline too
$KILN opt "$dir/1/06-attndqkv.ir" --passes=remat,fuse,comm,schedule --set weight_decay=0.1 \
    --nproc 2 --memory-budget "$budget" > "$dir/chain" 2>&1 || fail "chain: $(cat "$dir/chain")"
cmp -s "$dir/chain" "$dir/1/10-schedule.ir" || fail "remat..schedule in one kiln opt run differs"

# errors: file:line, unknown pass, missing --passes, a bad --set, no file
printf 'kiln-ir v1\n%%x:f32[4] = input "x"\n%%y:f32[4] = neg %%zz\noutput "loss" %%y\n' > "$dir/bad.ir"
$KILN opt "$dir/bad.ir" --passes=simplify > "$dir/e1" 2>&1 && fail "a parse error exited 0"
grep -q "^$dir/bad.ir:3: undefined value %zz" "$dir/e1" || fail "parse error: $(cat "$dir/e1")"
$KILN opt "$dir/1/00-frontend.ir" --passes=autodiff,nosuch > "$dir/e2" 2>&1
[ $? -eq 2 ] && grep -q "unknown pass in --passes.*: nosuch" "$dir/e2" || fail "unknown pass: $(cat "$dir/e2")"
$KILN opt "$dir/1/00-frontend.ir" > "$dir/e3" 2>&1
[ $? -eq 2 ] && grep -q "missing option: --passes" "$dir/e3" || fail "no --passes: $(cat "$dir/e3")"
$KILN opt "$dir/1/00-frontend.ir" --passes=autodiff --set lr=1 > "$dir/e4" 2>&1
[ $? -eq 2 ] && grep -q "not a setting the passes read" "$dir/e4" || fail "--set lr: $(cat "$dir/e4")"
$KILN opt "$dir/1/00-frontend.ir" --passes=autodiff --set grad_accum=0 > "$dir/e5" 2>&1
[ $? -eq 2 ] && grep -q "^kiln opt: --set grad_accum: " "$dir/e5" || fail "--set grad_accum=0: $(cat "$dir/e5")"
$KILN opt "$dir/nosuch.ir" --passes=autodiff > "$dir/e6" 2>&1
[ $? -eq 1 ] && grep -q "nosuch.ir: cannot read" "$dir/e6" || fail "missing file: $(cat "$dir/e6")"
# standard input
$KILN opt - --passes=attention,autodiff --set weight_decay=0.1 < "$dir/1/00-frontend.ir" > "$dir/stdin" 2>&1 ||
    fail "stdin: $(cat "$dir/stdin")"
cmp -s "$dir/stdin" "$dir/1/02-autodiff.ir" || fail "kiln opt - differs"
exit 0
