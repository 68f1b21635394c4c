#!/bin/bash
# Bad IR for `kiln opt` (issue 38): each a clear error naming the file, never
# an abort, a hang or a file left behind.
# - Graphs the passes cannot take: autodiff on a graph that has gradients
#   (twice, or after attnlayout, fuse, schedule: an abort in attention_dq
#   before), the whole list on a fused graph, simplify after fuse, a pass
#   list out of order, an op without a gradient rule; and every dump of
#   models/gpt.lua through every single pass and the whole list, none of
#   which may abort or leave a file under $TMPDIR.
# - Files that are not IR files: /dev/zero (read forever before), a FIFO
#   (blocked before), a directory, standard input that never ends or holds
#   NUL bytes, a file past the size bound.
# - Cut IR: v2 text cut at a line end or inside a line is an error naming
#   FILE:LINE (parsed as a smaller graph before, ending in `the graph has
#   no output named "loss"` with no file); v1 text, written before the end
#   line, still parses; the pass errors on it name the file.
set -u
: "${KILN:?}"
. tests/cli/lib/bad_input.sh

D=$dir/dumps
"$KILN" compile models/gpt.lua --dump-after=all --dump-dir "$D" > "$dir/compile.log" 2>&1 ||
    fail "compile: $(cat "$dir/compile.log")"
# internal errors used to write $TMPDIR/kiln-invalid-after-*.ir: a private
# TMPDIR that must stay empty
export TMPDIR=$dir/tmp
mkdir -p "$TMPDIR"
no_tmp_files() {
    [ -z "$(ls -A "$TMPDIR")" ] || fail "files left in TMPDIR after $*: $(ls "$TMPDIR")"
}
all=attention,autodiff,attnlayout,optimizer,simplify,attndqkv,remat,fuse,comm,schedule,memplan

# 1. graphs the passes cannot take, refused before any pass runs
expect_error "kiln opt: $D/08-fuse.ir: autodiff cannot run on this graph: autodiff has already run on it" \
    "expected a graph autodiff has not run on" "found a gradient: output \"grad." \
    -- "$KILN" opt "$D/08-fuse.ir" --passes=autodiff
expect_error "kiln opt: $D/08-fuse.ir: attention cannot run on this graph: fuse has run on it" \
    "expected a graph before fuse" -- "$KILN" opt "$D/08-fuse.ir" --passes=$all
expect_error "kiln opt: $D/02-autodiff.ir: autodiff cannot run on this graph" \
    -- "$KILN" opt "$D/02-autodiff.ir" --passes=autodiff
no_tmp_files "autodiff twice"
expect_error "kiln opt: $D/10-schedule.ir: simplify cannot run on this graph: fuse has run on it" \
    "found a fusion group (!group)" -- "$KILN" opt "$D/10-schedule.ir" --passes=simplify
expect_error "kiln opt: $D/05-simplify.ir: --passes: simplify cannot run after fuse" \
    "expected simplify before it" -- "$KILN" opt "$D/05-simplify.ir" --passes=fuse,simplify
expect_error "kiln opt: $D/00-frontend.ir: --passes: autodiff cannot run after autodiff" \
    -- "$KILN" opt "$D/00-frontend.ir" --passes=autodiff,autodiff
# attnlayout's head layout in a forward graph: autodiff has no rule for it
cat > "$dir/heads.ir" <<'EOF'
kiln-ir v1
%q:f32[2,4,12] = input "q"
%w:f32[2,4,12] = param "w" zeros
%x:f32[2,4,12] = mul %q, %w
%o:f32[2,4,4] = attention %x, %x, %x {causal=1,scale=0.5,heads=2,hd=2,qoff=0,koff=4,voff=8}
%s:f32[1,1,1] = reduce_sum %o {axes=[0,1,2]}
%loss:f32[] = reshape %s
output "loss" %loss
EOF
expect_error "kiln opt: $dir/heads.ir: autodiff cannot run on this graph: attnlayout has run on it" \
    "found attention in the head layout" -- "$KILN" opt "$dir/heads.ir" --passes=autodiff
# an op without a gradient rule (autodiff died here before)
cat > "$dir/norule.ir" <<'EOF'
kiln-ir v1
%q:f32[2,4,3] = input "q"
%w:f32[2,4,3] = param "w" zeros
%x:f32[2,4,3] = mul %q, %w
%l:f32[2,4,1] = attention_lse %x, %x {causal=1,scale=0.5}   # m.lua:7
%s:f32[1,1,1] = reduce_sum %l {axes=[0,1,2]}
%loss:f32[] = reshape %s
output "loss" %loss
EOF
expect_error "kiln opt: $dir/norule.ir: autodiff: m.lua:7: autodiff has no gradient rule for %3 = attention_lse" \
    -- "$KILN" opt "$dir/norule.ir" --passes=autodiff
# every dump through every pass alone and through the whole list: exit 0 or
# 1 (an error naming the file), never a signal or an internal error
runs=0
for f in "$D"/*.ir; do
    for p in ${all//,/ } $all; do
        timeout -s KILL 120 "$KILN" opt "$f" --passes=$p > /dev/null 2> "$dir/loop.err"
        rc=$?
        runs=$((runs + 1))
        [ $rc -le 1 ] || fail "kiln opt $f --passes=$p: exit $rc: $(tail -3 "$dir/loop.err")"
        ! grep -q "internal error\|Sanitizer\|runtime error:" "$dir/loop.err" ||
            fail "kiln opt $f --passes=$p: $(cat "$dir/loop.err")"
        [ $rc -eq 0 ] || grep -qF "kiln opt: $f: " "$dir/loop.err" ||
            fail "kiln opt $f --passes=$p: the error names no file: $(cat "$dir/loop.err")"
    done
done
[ $runs -ge 100 ] || fail "only $runs pass runs (test too weak)"
no_tmp_files "the pass-order runs"
echo "every dump through every pass: $runs runs, none aborted"

# 2. not IR files: refused before reading (no hang)
expect_error -t 20 "kiln opt: /dev/zero: not an IR file (expected a regular file, got a character device)" \
    -- "$KILN" opt /dev/zero --passes=autodiff
mkfifo "$dir/fifo"
expect_error -t 20 "kiln opt: $dir/fifo: not an IR file (expected a regular file, got a FIFO)" \
    -- "$KILN" opt "$dir/fifo" --passes=autodiff
expect_error -t 20 "kiln opt: $dir: not an IR file (expected a regular file, got a directory)" \
    -- "$KILN" opt "$dir" --passes=autodiff
expect_error -t 20 "kiln opt: <stdin>: not IR text (expected kiln-ir text, got a NUL byte at offset 0)" \
    -- bash -c '"$0" opt - --passes=autodiff < /dev/zero' "$KILN"
expect_error -t 60 "kiln opt: <stdin>: more than 268435456 bytes of IR text (expected at most 268435456)" \
    -- bash -c 'yes | "$0" opt - --passes=autodiff' "$KILN"
truncate -s 300M "$dir/huge.ir"
expect_error -t 20 "kiln opt: $dir/huge.ir: the IR file is 314572800 bytes (expected at most 268435456)" \
    -- "$KILN" opt "$dir/huge.ir" --passes=autodiff
rm -f "$dir/huge.ir"

# 3. cut IR: an error naming FILE:LINE
f=$D/00-frontend.ir
head -1 "$f" | grep -qx 'kiln-ir v2' || fail "dumps are not kiln-ir v2: $(head -1 "$f")"
tail -1 "$f" | grep -qx 'end' || fail "a dump does not end with 'end'"
n=$(wc -l < "$f")
head -n $((n - 3)) "$f" > "$dir/cut.ir" # without the end line and the last outputs
expect_error "$dir/cut.ir:$((n - 3)): the IR ends without its 'end' line" "the file is cut short" \
    -- "$KILN" opt "$dir/cut.ir" --passes=autodiff
head -c $(( $(stat -c %s "$f") / 2 )) "$f" > "$dir/half.ir" # inside a line
expect_error "$dir/half.ir:" -- "$KILN" opt "$dir/half.ir" --passes=autodiff
# text after the end line
{ cat "$f"; echo 'output "more" %0'; } > "$dir/after.ir"
expect_error "$dir/after.ir:$((n + 1)): text after the 'end' line" \
    -- "$KILN" opt "$dir/after.ir" --passes=autodiff
# v1 (before the end line): parses, and runs
{ echo 'kiln-ir v1'; sed '1d;$d' "$f"; } > "$dir/v1.ir"
"$KILN" opt "$dir/v1.ir" --passes=autodiff > "$dir/v1.out" 2>&1 ||
    fail "v1 text without an end line: $(cat "$dir/v1.out")"
# a cut v1 file cannot be told from a whole one; the pass's error names it
grep -v '^output "loss"' "$dir/v1.ir" > "$dir/v1-noloss.ir"
expect_error "kiln opt: $dir/v1-noloss.ir: autodiff: the graph has no output named \"loss\"" \
    -- "$KILN" opt "$dir/v1-noloss.ir" --passes=autodiff
no_tmp_files "the cut files"
bad_input_done
