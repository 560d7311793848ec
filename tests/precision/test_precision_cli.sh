#!/usr/bin/env bash
# The precision options on the command line: kiln inspect --precision, the
# lists, --io-precision through run and compile, and bad values.
# Usage: test_precision_cli.sh KILN
set -uo pipefail
kiln=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$(cd "$(dirname "$0")/../cli" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
passed=0 failed=0

. "$here/expect.sh"

mlp=$root/examples/mlp.kl
tf=$root/examples/transformer.kl

# one line per node: name, op, type, class
expect inspect_allow 0 "matmul_1 +matmul +f16 +allow" -- "$kiln" inspect "$mlp" --precision=fp16
expect inspect_deny 0 "probs +softmax +f32 +deny" -- "$kiln" inspect "$mlp" --precision=fp16
expect inspect_follow 0 "h1 +relu +bf16 +follow" -- "$kiln" inspect "$mlp" --precision=bf16
expect inspect_cast 0 "x_to_f16 +cast +f16 +keep" -- "$kiln" inspect "$mlp" --precision=fp16
expect inspect_header 0 "precision f16, inputs and outputs as declared" -- \
  "$kiln" inspect "$mlp" --precision=fp16
expect inspect_weights_halved 0 "params: 6 tensors, 235146 elements, 470292 bytes" -- \
  "$kiln" inspect "$mlp" --precision=fp16
expect inspect_io 0 "x +f16\[32, 784\]" -- "$kiln" inspect "$mlp" --precision=fp16 --io-precision=fp16
expect inspect_plain 0 "nodes: 10" -- "$kiln" inspect "$mlp"
# why a node stays in fp32: its op's class, the lists, its numbers, its input
expect inspect_why_class 0 "probs +softmax +f32 +deny +its op is in the deny class \(fp32\)" -- \
  "$kiln" inspect "$mlp" --precision=fp16
expect inspect_why_nodes 0 "h1 +relu +f32 +deny +--fp32-nodes names it" -- \
  "$kiln" inspect "$mlp" --precision=fp16 --fp32-nodes=h1
expect inspect_why_follows 0 "pooled +flatten +f32 +follow +follows its fp32 inputs" -- \
  "$kiln" inspect "$root/examples/cnn.kl" --precision=fp16
expect inspect_why_number 0 "where_1 +where +f32 +deny +constant 'constant_3' holds -1e\+09, beyond fp16's 65504" -- \
  "$kiln" inspect "$tf" --precision=fp16
expect inspect_why_bf16 0 "where_1 +where +bf16 +follow$" -- "$kiln" inspect "$tf" --precision=bf16
# the lists
expect fp32_nodes 0 "h1 +relu +f32 +deny" -- "$kiln" inspect "$mlp" --precision=fp16 --fp32-nodes=h1
expect fp32_nodes_list 0 "gelu_1 +gelu +f32 +deny" -- \
  "$kiln" inspect "$tf" --precision=fp16 --fp32-nodes=scores --fp32-nodes=gelu_1,h
expect fp32_ops 0 "matmul_1 +matmul +f32 +deny" -- \
  "$kiln" inspect "$mlp" --precision=fp16 --fp32-ops=add,matmul
# bad values
expect bad_precision 2 "--precision=fp8: choose fp32, fp16 or bf16" -- \
  "$kiln" inspect "$mlp" --precision=fp8
expect bad_io_precision 2 "--io-precision=half: choose fp32, fp16 or bf16" -- \
  "$kiln" run --device=interp "$mlp" --io-precision=half
expect bad_fp32_ops 2 "--fp32-ops: no op is named 'softmaxx'" -- \
  "$kiln" compile "$mlp" --emit=ir --fp32-ops=relu,softmaxx
for c in inspect run; do
  expect bad_fp32_nodes_$c 1 "--fp32-nodes: the model has no node or node output named 'nowhere'" -- \
    "$kiln" $c "$mlp" --precision=fp16 --fp32-nodes=nowhere
done
for c in run compile inspect; do
  expect help_$c 0 "--precision=P" -- "$kiln" $c --help
done

# the rewritten IR parses back and runs
"$kiln" compile "$mlp" --emit=ir --precision=bf16 -o mlp_bf16.kl 2>/dev/null
expect ir_parses_back 0 "output 0 'probs': f32\[32, 10\]" -- "$kiln" run --device=interp mlp_bf16.kl
# --io-precision: an f32 file feeds the f16 input, the output is f16
"${PYTHON:-python3}" -c "
import numpy as np
np.save('x.npy', np.linspace(-1, 1, 32 * 784, dtype=np.float32).reshape(32, 784))
np.save('x16.npy', np.linspace(-1, 1, 32 * 784, dtype=np.float16).reshape(32, 784))"
for dev in interp host; do
  expect io_f32_file_$dev 0 "output 0 'probs': f16\[32, 10\]" -- \
    "$kiln" run "$mlp" --device=$dev --precision=fp16 --io-precision=fp16 --input x=x.npy
  expect io_f16_file_$dev 0 "output 0 'probs': f16\[32, 10\]" -- \
    "$kiln" run "$mlp" --device=$dev --precision=fp16 --io-precision=fp16 --input x=x16.npy
done
expect io_only 0 "output 0 'y': bf16\[2, 16, 64\]" -- "$kiln" run --device=interp "$tf" --io-precision=bf16
expect f16_file_for_f32_input 1 "input 'x' must be f32" -- "$kiln" run --device=interp "$mlp" --input x=x16.npy

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
