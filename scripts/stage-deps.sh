#!/usr/bin/env bash
# Copies the build's header-only and static dependencies from this machine's Debian packages into
# .deps/ (ignored by git), for building on a machine without a package registry (the GPU
# machine): send the tree with .deps carried, and CMake finds them there (TCPX_P2P_DEPS_PREFIX).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
out=.deps
arch=x86_64-linux-gnu
rm -rf "$out"
# The layout mirrors /usr, so the packages' CMake files find their files relative to themselves.
mkdir -p "$out/include" "$out/lib/$arch/cmake" "$out/share/cmake"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock "$out/include/"
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$out/share/cmake/"
cp /usr/lib/$arch/libgtest*.a /usr/lib/$arch/libgmock*.a "$out/lib/$arch/"
cp -r /usr/lib/$arch/cmake/GTest "$out/lib/$arch/cmake/"
# libcrypto, static (the build links it into the library, so the other machine needs no package).
mkdir -p "$out/include/$arch"
cp -r /usr/include/openssl "$out/include/"
cp -r /usr/include/$arch/openssl "$out/include/$arch/"
cp /usr/lib/$arch/libcrypto.a "$out/lib/$arch/"
du -sh "$out" >&2
