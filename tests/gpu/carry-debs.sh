#!/bin/bash
# tests/gpu/carry-debs.sh - run on the build machine (Debian 12, packages
# reachable) before a device call: downloads the Debian packages kiln builds
# against, with the libraries they need that a CUDA image lacks, into .debs/
# (about 21 MB, kept out of git through .git/info/exclude). Name `.debs` in
# the call's `carry`; tests/gpu/run.sh unpacks them there (tests/gpu/kit.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.debs/' .git/info/exclude 2>/dev/null || echo '/.debs/' >>.git/info/exclude
mkdir -p .debs
cd .debs
rm -f ./*.deb
pkgs=(
    liblua5.4-0 liblua5.4-dev libffi8 libffi-dev libcjson1 libcjson-dev libcmocka0 libcmocka-dev
    libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5
    libglpk40 libglpk-dev libamd2 libcolamd2 libsuitesparseconfig5 libltdl7
    pkgconf pkgconf-bin libpkgconf3
    openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libhwloc15 libhwloc-plugins
    libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libfabric1 libucx0
    libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libnuma1
    libmunge2 libxnvctrl0 libpciaccess0
)
apt-get -qq download "${pkgs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
n=$(ls ./*.deb | wc -l)
[ "$n" -eq "${#pkgs[@]}" ] || { echo "expected ${#pkgs[@]} packages, got $n"; exit 1; }
echo "$n packages, $(du -sh . | cut -f1) in .debs/"
