# tests/gpu/kit.sh - sourced by tests/gpu/run.sh. The lent GPU machine's image
# has the CUDA toolkit, a C compiler and CMake but not the Debian packages
# kiln builds against, and it reaches no package registry. When the device
# call carries them (`.debs/`, filled here by tests/gpu/carry-debs.sh), unpack
# them into a private prefix and point pkg-config, CMake, Open MPI and the
# dynamic loader at it. Sets KIT_CMAKE_ARGS for the configure step.
KIT_CMAKE_ARGS=()
if compgen -G "$ROOT/.debs/*.deb" >/dev/null; then
    KIT=${KIT:-/tmp/kiln-kit}
    mkdir -p "$KIT/bin"
    for f in "$ROOT"/.debs/*.deb; do dpkg-deb -x "$f" "$KIT" || { echo "cannot unpack $f"; exit 1; }; done
    L=$KIT/usr/lib/x86_64-linux-gnu
    # Debian's alternatives would make these names at install time
    ln -sf "$KIT/usr/bin/mpirun.openmpi" "$KIT/bin/mpirun"
    ln -sf "$KIT/usr/bin/mpicc.openmpi" "$KIT/bin/mpicc"
    ln -sf "$KIT/usr/bin/pkgconf" "$KIT/bin/pkg-config"
    export PATH=$KIT/bin:$PATH
    export LD_LIBRARY_PATH=$L:$L/openblas-pthread:$L/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_LIBDIR=$L/pkgconfig:$L/openblas-pthread/pkgconfig:$KIT/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$KIT
    export OPAL_PREFIX=$KIT/usr # Open MPI, relocated
    export CMAKE_PREFIX_PATH=$KIT/usr
    KIT_CMAKE_ARGS=(-DPKG_CONFIG_EXECUTABLE="$KIT/bin/pkg-config"
                    -DMPI_C_COMPILER="$KIT/usr/bin/mpicc.openmpi")
    echo "== build dependencies from .debs/ unpacked into $KIT"
fi
