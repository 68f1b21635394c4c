#!/bin/bash
# The docs against the binary (issue 42): every flag that `kiln --help` and
# each command's --help name is described in docs/cli.md; every pass the
# pipeline dumps is in compile --help's --dump-after list, kiln opt's
# --passes list and docs/cli.md; the README's commands run (in a scratch
# directory, cheap variants: train for 2 steps, a resume from that step's
# checkpoint, eval on a small held-out split; --device cuda may say there is no GPU, never that a flag is
# wrong); the README's test command is the one .ci/run runs, and .ci/run
# runs the slow tests too.
set -u
: "${KILN:?}"
src=$(pwd)
case "$KILN" in /*) ;; *) KILN=$src/$KILN ;; esac
dir=$(mktemp -d "${TMPDIR:-/tmp}/kiln-docs-XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. flags
cmds=$("$KILN" --help | sed -n '/^commands:/,/^$/p' | awk 'NF > 1 && $1 != "commands:" {print $1}')
[ -n "$cmds" ] || fail "no commands in kiln --help"
nflags=0
for c in "" $cmds; do
    "$KILN" $c --help > "$dir/help.txt" 2>&1 || fail "kiln $c --help exits non-zero"
    for f in $(grep -o -- '--[a-z][a-z0-9-]*' "$dir/help.txt" | sort -u); do
        nflags=$((nflags + 1))
        grep -q -- "$f\([^a-z0-9-]\|$\)" docs/cli.md || fail "kiln $c --help names $f, docs/cli.md does not"
    done
done
[ "$nflags" -gt 50 ] || fail "only $nflags flags found in the help texts"

# 2. the passes
"$KILN" compile models/gpt.lua --dump-after=all --dump-dir "$dir/d" > /dev/null || fail "dumps"
passes=$(ls "$dir/d" | sed -n 's/^[0-9]*-\(.*\)\.ir$/\1/p')
[ "$(echo $passes | wc -w)" -ge 10 ] || fail "dumps: $(ls "$dir/d")"
"$KILN" compile --help | tr -s ' \n' ' ' > "$dir/compile.txt"
"$KILN" opt --help | tr -s ' \n' ' ' > "$dir/opt.txt"
dump_row=$(grep -- '^| `--dump-after=PASS`' docs/cli.md)
for p in $passes; do
    grep -q "PASS is one of.*[ ,]$p," "$dir/compile.txt" || fail "compile --help: --dump-after lacks $p"
    echo "$dump_row" | grep -q "\`$p\`" || fail "docs/cli.md: --dump-after lacks $p"
    [ "$p" = frontend ] && continue
    grep -q -- "--passes=P1,P2,\.\.\. [a-z, ]*\b$p\b" "$dir/opt.txt" || fail "opt --help: --passes lacks $p"
done

# 3. the README's commands
sed -n '/^## Commands/,/^## /p' README.md | sed -n '/^```sh/,/^```/p' | grep '^kiln ' |
    sed 's/ *#.*//' > "$dir/commands.txt"
[ "$(wc -l < "$dir/commands.txt")" -ge 10 ] || fail "README commands: $(cat "$dir/commands.txt")"
mkdir -p "$dir/run/tests"
ln -s "$src/models" "$dir/run/models"
ln -s "$src/tests/data" "$dir/run/tests/data"
n=0
while read -r line; do
    cmd=${line#kiln }
    case "$cmd" in
    train*--resume*) cmd="$(echo "$cmd" | sed 's/\.step[0-9]*\./.step2./') --steps 3" ;;
    train*) cmd="$cmd --steps 2" ;;
    eval*) cmd="$cmd --set val_fraction=0.002" ;; # a small held-out set
    esac
    if echo "$cmd" | grep -q -- '--nproc' && ! command -v mpirun > /dev/null; then
        echo "note: mpirun not installed: skipped kiln $cmd"
        continue
    fi
    n=$((n + 1))
    t0=$(date +%s.%N)
    # eval: the README quotes some arguments (--prompt "The ")
    (cd "$dir/run" && eval "timeout -s KILL 300 \"\$KILN\" $cmd" > "$dir/out.txt" 2>&1 < /dev/null)
    rc=$?
    [ -n "${DOCS_TIMES:-}" ] && echo "$(echo "$(date +%s.%N) - $t0" | bc) s: $cmd"
    if [ $rc -ne 0 ] && echo "$cmd" | grep -q -- '--device cuda' && [ $rc -eq 1 ] &&
        grep -qi "cuda\|gpu\|driver" "$dir/out.txt"; then
        continue # no GPU here: a clear error, not a bad flag
    fi
    [ $rc -eq 0 ] || fail "README: kiln $cmd: exit $rc: $(tail -5 "$dir/out.txt")"
done < "$dir/commands.txt"

# 4. the test commands
readme_test=$(grep -o 'cmake -S \. -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && .*ctest .*' README.md | head -1)
echo "$readme_test" | grep -q -- '-LE slow' || fail "the README's test command does not leave out the slow tests"
grep -qF -- "$readme_test" .ci/run || fail ".ci/run does not run the README's test command: $readme_test"
grep -q -- 'ctest --test-dir build .*-L slow' .ci/run || fail ".ci/run does not run the slow tests"
grep -q -- 'ctest --test-dir build .*-L slow' README.md || fail "the README does not say how to run the slow tests"
echo "docs ok: $nflags flags, $(echo $passes | wc -w) passes, $n README commands"
