# Sourced by the fake-device scripts that run one model on CPU ranks and on
# the fakes (tp.sh, pp.sh): the losses of $T/cpu.log against $T/cuda.log.

# Every step's loss, then the final train and validation losses, of log $1.
losses() {
    sed -n 's/^step *[0-9]*\/[0-9]* | loss \([^ ]*\) .*/\1/p; s/^final: step [0-9]* | train loss \([^ ]*\) .*/\1/p' "$1"
    sed -n 's/^final: .* | val loss \([^ ]*\) .*/\1/p' "$1"
}
# The two logs' losses within $2 relative (default 1e-5), and exactly $1
# of them; prints the count and the largest relative difference.
cmp_losses() {
    paste <(losses "$T/cpu.log") <(losses "$T/cuda.log") | awk -v want="$1" -v tol="${2:-1e-5}" '
        { n++; if ($2 == "") { bad = 1; next } d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
          r = a > 0 ? d / a : d; if (!(r <= m)) m = r; if (!(r <= tol)) bad = 1 }
        END { printf "%d losses, max rel diff %.2e (tol %s)", n, m, tol; exit (bad || n != want) }'
}
