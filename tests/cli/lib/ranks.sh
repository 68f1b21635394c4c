# Shared by the --nproc CLI tests (dp_failure.sh, signals.sh): finding the
# processes of a run and telling whether they still run.

# pid of rank $2 among the children of process $1 (mpirun)
rank_pid() {
    local p
    for p in $(pgrep -P "$1"); do
        if tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"
            return
        fi
    done
}

alive() { # running, not a zombie
    [ -e "/proc/$1" ] && ! awk '{exit $3 != "Z"}' "/proc/$1/stat" 2> /dev/null
}

# kill -9 of process $1 and everything under it (a launcher, its mpirun and
# the ranks), children first: a test that fails half-way must not leave a
# run training in the background.
kill_tree() {
    local c
    for c in $(pgrep -P "$1" 2> /dev/null); do
        kill_tree "$c"
    done
    kill -KILL "$1" 2> /dev/null
}

# Every run a test starts in the background: launched PID... (record with
# `launched $!`); kill_launched (from the test's EXIT trap) ends what still runs.
LAUNCHED=()
launched() { LAUNCHED+=("$@"); }
kill_launched() {
    local p
    for p in "${LAUNCHED[@]}"; do
        alive "$p" && kill_tree "$p"
    done
    return 0
}
