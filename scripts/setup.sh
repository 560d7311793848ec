#!/usr/bin/env bash
# Install what Kiln needs on a fresh Debian machine (only what is missing),
# then configure and build it in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential meson ninja-build flex bison pkg-config libjansson-dev
      libcmocka-dev clang libclang-rt-14-dev python3)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# NumPy writes the reference data for the tests.  Debian's own python3
# takes it from apt (pip is closed there by PEP 668); any other python3
# (pyenv, a venv) from pip.
if ! python3 -c 'import numpy' 2>/dev/null; then
  if [ "$(command -v python3)" = /usr/bin/python3 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-numpy >/dev/null
  else
    python3 -m pip install --quiet numpy
  fi
fi

[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
echo "setup: built build/kiln"
