#!/usr/bin/env bash
# Installs a built tree into a scratch prefix and builds and runs a small program against it the
# two ways users do (tests/install/consumer): CMake's find_package(tcpx_p2p) with the exported
# target, and pkg-config (tcpx_p2p for C++, tcpx_p2p_c for C), each with no extra flags.
#   scripts/check-install.sh [BUILD_DIR]      (default: build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
[ -f "$build/CMakeCache.txt" ] || { echo "check-install: $build is not a build tree" >&2; exit 2; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tcpx-install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
prefix=$scratch/prefix
src=tests/install/consumer

echo "=== install: $build -> scratch prefix" >&2
cmake --install "$build" --prefix "$prefix" >/dev/null
pcdir=$(dirname "$(find "$prefix" -name tcpx_p2p.pc | head -1)")
libdir=$(dirname "$pcdir")

echo "=== install: find_package(tcpx_p2p)" >&2
cmake -S "$src" -B "$scratch/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/cmake" >/dev/null
"$scratch/cmake/consumer_cxx"
"$scratch/cmake/consumer_c"

echo "=== install: pkg-config" >&2
export PKG_CONFIG_PATH=$pcdir
# -Wl,-rpath: the scratch prefix is not on the loader's path (a system install would be).
c++ "$src/main.cc" -o "$scratch/pc_cxx" $(pkg-config --cflags --libs tcpx_p2p) -Wl,-rpath,"$libdir"
cc "$src/main.c" -o "$scratch/pc_c" $(pkg-config --cflags --libs tcpx_p2p_c) -Wl,-rpath,"$libdir"
"$scratch/pc_cxx"
"$scratch/pc_c"
echo "check-install: the installed package works through find_package and pkg-config" >&2
