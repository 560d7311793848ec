#!/usr/bin/env bash
# An --emit=cu folder compiles on its own: `nvcc -c kernels.cu` there, with
# no -I and every warning an error, for each example (and the training
# examples' steps).  Usage: test_nvcc_standalone.sh KILN
set -uo pipefail
kiln=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$nvcc" ]; then
  echo "FAIL: this test needs nvcc (the CUDA toolkit's; CUDA_HOME/bin or PATH)"
  echo "0 passed, 1 failed"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
check() { # NAME MODEL FLAGS...
  local name=$1 model=$2
  shift 2
  local out="$tmp/$name" log
  if ! log=$("$kiln" compile "$model" --emit=cu --no-nvrtc -o "$out" "$@" 2>&1); then
    failed=$((failed + 1)); echo "FAIL $name: kiln compile: $log"; return
  fi
  if log=$(cd "$out" && "$nvcc" -c kernels.cu -o kernels.o -Werror all-warnings 2>&1) && [ -z "$log" ]; then
    passed=$((passed + 1)); echo "PASS $name: nvcc -c kernels.cu, no -I, no warning"
  else
    failed=$((failed + 1)); echo "FAIL $name:"; sed 's/^/  /' <<<"$log" | head -20
  fi
}
for ex in mlp cnn transformer train_mlp train_cnn; do check "$ex" "$root/examples/$ex.kl"; done
for ex in train_mlp train_cnn; do check "${ex}_step" "$root/examples/$ex.kl" --train; done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -eq 7 ]
