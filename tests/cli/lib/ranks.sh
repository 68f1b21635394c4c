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
