#!/usr/bin/env bash
# Kernels written for a GPU (issue 16): every generated kernel of the
# examples (and the training examples' steps) and of the ONNX model-shaped
# graphs (ResNet-18, MobileNetV2, BERT and GPT-2 blocks, a detector, SE
# blocks, an FPN neck), in
# fp32, fp16 and bf16, is
# compiled to PTX for sm_90 and assembled by ptxas: no f64 instruction (f32
# and half models compute in f32) and no register spill.  The counts come
# from the toolkit itself (the PTX text, ptxas -v), not from kiln.
# Usage: test_kernel_resources.sh KILN
set -uo pipefail
kiln=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=${NVCC:-$(command -v nvcc || echo "$cuda/bin/nvcc")}
ptxas=$(dirname "$nvcc")/ptxas
if [ ! -x "$nvcc" ] || [ ! -x "$ptxas" ]; then
  echo "FAIL: this test needs nvcc and ptxas (the CUDA toolkit's; CUDA_HOME/bin or PATH)"
  echo "0 passed, 1 failed"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
check() { # NAME PRECISION MODEL FLAGS...
  local name=$1 prec=$2 model=$3
  shift 3
  local out="$tmp/$name-$prec" log
  if ! log=$("$kiln" compile "$model" --emit=cu --no-nvrtc --precision="$prec" -o "$out" "$@" 2>&1); then
    failed=$((failed + 1)); echo "FAIL $name $prec: kiln compile: $log"; return
  fi
  if ! log=$(cd "$out" && "$nvcc" -ptx -arch=sm_90 kernels.cu -o kernels.ptx 2>&1 &&
             "$ptxas" -v -arch=sm_90 kernels.ptx -o kernels.cubin 2>&1); then
    failed=$((failed + 1)); echo "FAIL $name $prec: the toolkit refused it:"; sed 's/^/  /' <<<"$log" | head -10; return
  fi
  # f64 instructions: an opcode with a .f64 type (cvt.f64.f32, mul.f64, ...)
  local f64 kernels spills
  f64=$(grep -cE '^[[:space:]]*(@!?%p[0-9]+[[:space:]]+)?[a-z][a-z0-9_.]*\.f64' "$out/kernels.ptx")
  kernels=$(grep -c '^\.visible \.entry\|^\.entry' "$out/kernels.ptx")
  spills=$(grep -oE '[0-9]+ bytes spill (stores|loads)' <<<"$log" | awk '{ s += $1 } END { print s + 0 }')
  if [ "$kernels" -gt 0 ] && [ "$f64" -eq 0 ] && [ "$spills" -eq 0 ]; then
    passed=$((passed + 1)); echo "PASS $name $prec: $kernels kernels, 0 f64 instructions, 0 spill bytes"
  else
    failed=$((failed + 1))
    echo "FAIL $name $prec: $kernels kernels, $f64 f64 instructions, $spills spill bytes"
    grep -nE '^[[:space:]]*(@!?%p[0-9]+[[:space:]]+)?[a-z][a-z0-9_.]*\.f64' "$out/kernels.ptx" | head -5 | sed 's/^/  /'
  fi
}
# the real-model-shaped ONNX graphs (tests/onnx_models), built here
py=${PYTHON:-python3}
if ! "$py" "$root/tests/onnx_models/build_models.py" "$tmp/onnx" >"$tmp/build.log" 2>&1; then
  echo "FAIL: tests/onnx_models/build_models.py:"; tail -5 "$tmp/build.log"
  failed=$((failed + 1))
fi
want=15
for prec in fp32 fp16 bf16; do
  for ex in mlp cnn transformer; do check "$ex" "$prec" "$root/examples/$ex.kl"; done
  for ex in train_mlp train_cnn; do check "${ex}_step" "$prec" "$root/examples/$ex.kl" --train; done
  for m in resnet18 mobilenetv2 bert_block gpt2_block detector se_net fpn; do
    [ -f "$tmp/onnx/$m/model.onnx" ] || continue
    check "$m" "$prec" "$tmp/onnx/$m/model.onnx"
  done
done
[ -d "$tmp/onnx" ] && want=36
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -eq "$want" ]
