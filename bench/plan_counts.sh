#!/usr/bin/env bash
# Static counts of every model the project carries (the examples and the
# real-model-shaped ONNX graphs), fp32 and fp16, fused and unfused: kernels,
# launches, estimated DRAM bytes and arena bytes against their lower bound.
# Prints a markdown table; two tables from two commits, diffed, show that
# a change to the passes kept (or improved) what the compiler decides.
# Usage: bench/plan_counts.sh [KILN]
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${1:-build/kiln}
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" tests/onnx_models/build_models.py "$tmp/onnx" >/dev/null
echo "| model | precision | side | kernels | launches | DRAM bytes | arena | lower bound |"
echo "|---|---|---|---|---|---|---|---|"
for m in examples/mlp.kl examples/cnn.kl examples/transformer.kl \
         "$tmp"/onnx/{resnet18,mobilenetv2,bert_block,gpt2_block,detector,se_net,fpn}/model.onnx; do
  name=$(basename "$m" .kl)
  [ "$name" = model.onnx ] && name=$(basename "$(dirname "$m")")
  for p in fp32 fp16; do
    json=$("$kiln" bench "$m" --json --iters 1 --device=host --precision=$p)
    "$py" - "$name" "$p" "$json" <<'PY'
import json, sys
name, prec, doc = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for side in ("fused", "unfused"):
    s = doc[side]
    print(f"| {name} | {prec} | {side} | {s['kernels']} | {s['launches']} | {s['dram_bytes']} "
          f"| {s['arena_bytes']} | {s['arena_lower_bound']} |")
PY
  done
done
