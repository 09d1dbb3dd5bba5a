#!/usr/bin/env bash
# Installs what the build needs from Debian's archive, if it is missing (Debian 12 / Ubuntu).
# Idempotent: does nothing when everything is there. Needs root or sudo to install.
set -euo pipefail

# libssl-dev: libcrypto (HMAC-SHA-256 and random nonces for peer authentication).
# clang + libclang-rt-dev: libFuzzer for the fuzz targets (scripts/run-fuzz).
# pkg-config: scripts/check-install.sh builds a consumer through the installed .pc files.
# iproute2: `ip netns` for the two-host tests in network namespaces (label netns) and
# scripts/netns-bench.
packages=(cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
          libcli11-dev libssl-dev clang libclang-rt-dev pkg-config iproute2)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
