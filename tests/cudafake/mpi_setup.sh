# Sourced first by the fake-device scripts that run kiln on MPI ranks
# (tp.sh, pp.sh, zero.sh) as `. mpi_setup.sh NAME`: KILN and FAKE_LIB must
# be set; without python3, mpirun or the fake driver the script is skipped
# (exit 77). Sets T, a scratch directory (kiln-cudafake-NAME.*) removed at
# exit, and ROOT, the source root.
set -u
: "${KILN:?KILN must point at the kiln binary}"
: "${FAKE_LIB:?FAKE_LIB must point at the fake libraries}"
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
command -v mpirun >/dev/null || { echo "no mpirun: skipped"; exit 77; }
[ -e "$FAKE_LIB/libcuda.so.1" ] || { echo "no fake driver in $FAKE_LIB: skipped"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-cudafake-$1.XXXXXX")
trap 'rm -rf "$T"' EXIT
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
