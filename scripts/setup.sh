#!/usr/bin/env bash
# Install what Kiln needs on a fresh Debian machine (only what is missing),
# then configure and build it in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential meson ninja-build flex bison pkg-config libjansson-dev
      libcmocka-dev clang libclang-rt-14-dev python3 protobuf-c-compiler
      libprotobuf-c-dev libonnx-dev libonnx-testdata libopenblas-dev zlib1g-dev libopenmpi-dev openmpi-bin cmake)
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

# Test tooling (NumPy for reference data; onnx and onnxruntime to build and
# check real-model-shaped ONNX graphs) lives in a virtual environment of the
# project's own, so Debian's python (closed to pip by PEP 668) and any other
# python3 are treated alike.
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# onnx is pinned: the newer conformance suite is generated from the node
# test cases this release defines (tests/conformance/gen_node_suite.py), and
# its expected-pass list is for them.
onnx_version=1.23.2
# scikit-learn: its bundled digits data set, for the training examples
# (examples/data/digits.py)
if ! .venv/bin/python -c "import numpy, onnxruntime, onnx, sklearn; assert onnx.__version__ == '$onnx_version'" 2>/dev/null; then
  echo "setup: installing numpy, onnx $onnx_version, onnxruntime and scikit-learn into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check numpy "onnx==$onnx_version" onnxruntime scikit-learn
fi
export PATH="$PWD/.venv/bin:$PATH"

[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
echo "setup: built build/kiln"
