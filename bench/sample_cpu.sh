#!/bin/bash
# kiln sample's decode speed on this machine's CPU (issue 41): tokens/s of
# greedy decoding (--temperature 0), batch 1 and 8, of gpt.lua small (L=4,
# C=256, H=4, V=256, T=256, f32, random weights), one prompt token and
# T-1 new ones (all within the window), on THREADS threads: the one-token
# steps' rate through the KV cache (the prompt's token and every new one;
# the startup check's prefill not counted) and the whole run's rate by the
# full forward at every token (--no-kv-cache). Beside it PyTorch eager with a KV cache
# (bench/sample_torch.py, same shapes) when torch is installed; without it
# the bench says so and prints kiln's numbers only. ROUNDS runs each,
# interleaved; the median tokens/s is printed.
#
#   bench/sample_cpu.sh [KILN] [THREADS] [ROUNDS]
set -euo pipefail
kiln=${1:-build/kiln}
threads=${2:-2}
rounds=${3:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
cfg=(--set L=4 --set H=4 --set C=256 --set V=256 --set T=256)
N=255
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiln-sample-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

"$kiln" train "$here/models/gpt.lua" "${cfg[@]}" --steps 1 --save-weights "$tmp/w.st" -q \
    >/dev/null 2>&1
py=
command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null && py=python3
[ -n "$py" ] || echo "PyTorch is not installed here (python3 -c 'import torch' fails): kiln's numbers only"

run() { # B [kiln flags]: tokens/s of one run: its one-token steps (KV cache), or all
    local b=$1
    shift
    "$kiln" sample "$here/models/gpt.lua" --init-from "$tmp/w.st" "${cfg[@]}" --set batch="$b" \
        --num-samples "$b" --prompt T --max-new-tokens $N --temperature 0 --threads "$threads" \
        "$@" 2>&1 >/dev/null | sed -n -e 's/.*one-token steps .* each: \([0-9.]*\) tokens\/s.*/\1/p' \
        -e 's/.*, 0 one-token, .* s: \([0-9.]*\) tokens\/s.*/\1/p' \
        -e '/one-token steps/!s/.* s: \([0-9.]*\) tokens\/s; runs: 0 prefill.*/\1/p' | head -1
}
for b in 1 8; do
    : >"$tmp/kv"; : >"$tmp/full"; : >"$tmp/torch"
    for _ in $(seq "$rounds"); do
        run "$b" >>"$tmp/kv"
        [ "$b" -eq 1 ] && run "$b" --no-kv-cache >>"$tmp/full"
        if [ -n "$py" ]; then
            $py "$here/bench/sample_torch.py" 4 256 4 256 256 "$b" $N "$threads" |
                sed -n 's/.* s: \([0-9.]*\) tokens\/s/\1/p' >>"$tmp/torch"
        fi
    done
    kv=$(median <"$tmp/kv")
    line="batch $b, $threads threads: kiln KV cache $kv tokens/s"
    [ "$b" -eq 1 ] && line="$line | kiln full forward $(median <"$tmp/full") tokens/s"
    if [ -n "$py" ]; then
        t=$(median <"$tmp/torch")
        line="$line | PyTorch eager KV cache $t tokens/s | kiln/PyTorch $(awk -v a="$kv" -v b="$t" 'BEGIN { printf "%.2f", a / b }')"
    fi
    echo "$line"
done
