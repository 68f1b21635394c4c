# tests/gpu/kit.sh - sourced by tests/gpu/run.sh. The lent GPU machine's image
# has the CUDA toolkit, a C compiler and CMake but not the Debian packages
# kiln builds against and runs with, and it reaches no package registry.
# When the device call carries them (`.debs/`, filled here by
# tests/gpu/carry-debs.sh), unpack them into a private prefix and point
# pkg-config, CMake, Open MPI and the dynamic loader at it. Sets
# KIT_STATUS (one line for the table) and KIT_CMAKE_ARGS. Never exits: a
# failure is reported in KIT_STATUS and run.sh goes on to its table.
KIT_CMAKE_ARGS=()
KIT_STATUS="none carried"
kit_unpack() {
    local kit=${KIT:-/tmp/kiln-kit} f n=0
    command -v dpkg-deb >/dev/null || { KIT_STATUS="FAILED: no dpkg-deb on this machine"; return 1; }
    mkdir -p "$kit/bin" || { KIT_STATUS="FAILED: cannot create $kit"; return 1; }
    for f in "$ROOT"/.debs/*.deb; do
        if ! dpkg-deb -x "$f" "$kit"; then
            KIT_STATUS="FAILED: cannot unpack $(basename "$f")"
            return 1
        fi
        n=$((n + 1))
    done
    local L=$kit/usr/lib/x86_64-linux-gnu
    # Debian's alternatives would make these names at install time
    ln -sf "$kit/usr/bin/mpirun.openmpi" "$kit/bin/mpirun"
    ln -sf "$kit/usr/bin/mpicc.openmpi" "$kit/bin/mpicc"
    ln -sf "$kit/usr/bin/pkgconf" "$kit/bin/pkg-config"
    export PATH=$kit/bin:$PATH
    export LD_LIBRARY_PATH=$L:$L/openblas-pthread:$L/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_LIBDIR=$L/pkgconfig:$L/openblas-pthread/pkgconfig:$kit/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$kit
    export OPAL_PREFIX=$kit/usr # Open MPI, relocated
    export CMAKE_PREFIX_PATH=$kit/usr
    KIT_CMAKE_ARGS=(-DPKG_CONFIG_EXECUTABLE="$kit/bin/pkg-config"
                    -DMPI_C_COMPILER="$kit/usr/bin/mpicc.openmpi")
    KIT_STATUS="$n packages unpacked into $kit"
}
if compgen -G "$ROOT/.debs/*.deb" >/dev/null; then
    kit_unpack
    echo "== kit.sh: $KIT_STATUS"
fi
