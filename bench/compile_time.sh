#!/usr/bin/env bash
# Compile time per model, each phase apart (front end with the precision
# pass, passes: schedule, folding, fusion and memory plan, codegen, NVRTC
# per architecture), for the examples and the real-model-shaped ONNX graphs.
# Prints a markdown table.  Usage: bench/compile_time.sh [KILN]
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${1:-build/kiln}
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" tests/onnx_models/build_models.py "$tmp/onnx" >/dev/null
echo "| model | front end ms | passes ms | codegen ms | nvrtc sm_80 ms | nvrtc sm_90 ms | nvrtc compute_90 ms | kernels | GEMM calls |"
echo "|---|---|---|---|---|---|---|---|---|"
for m in examples/mlp.kl examples/cnn.kl examples/transformer.kl \
         "$tmp"/onnx/{resnet18,mobilenetv2,bert_block,gpt2_block}/model.onnx; do
  name=$(basename "$m" .kl)
  [ "$name" = model.onnx ] && name=$(basename "$(dirname "$m")")
  log=$("$kiln" compile "$m" --emit=cu -o "$tmp/out_$name" --time 2>&1)
  t() { grep -oP "time: $1 \K[0-9.]+" <<<"$log" || echo "-"; }
  k=$(grep -oP '\(\K[0-9]+(?= kernels)' <<<"$log" || echo "-")
  gm=$(grep -oP '\(\K[0-9]+(?= GEMM)' <<<"$log" || echo "-")
  echo "| $name | $(t 'front end') | $(t passes) | $(t codegen) | $(t 'nvrtc sm_80') | $(t 'nvrtc sm_90') | $(t 'nvrtc compute_90') | $k | $gm |"
done

# Scaling: chains of decoder blocks (bench/gen_chain.py) at about 2.5k, 10k
# and 40k nodes; each phase's time, and the whole compile's growth per 4x
# nodes (near-linear is at most 5x).
echo
echo "| nodes (about) | front end ms | passes ms | codegen ms | weights.bin ms | total ms | x the size before |"
echo "|---|---|---|---|---|---|---|"
prev=""
for n in 2500 10000 40000; do
  "$py" bench/gen_chain.py --nodes $n -o "$tmp/chain$n.kl"
  log=$("$kiln" compile "$tmp/chain$n.kl" --emit=cu --no-nvrtc -o "$tmp/chain_out$n" --time 2>&1)
  t() { grep -oP "time: $1 \K[0-9.]+" <<<"$log" || echo 0; }
  fe=$(t 'front end') ps=$(t passes) cg=$(t codegen) wb=$(t 'weights.bin')
  total=$(awk -v a="$fe" -v b="$ps" -v c="$cg" 'BEGIN { printf "%.1f", a + b + c }')
  ratio=$([ -n "$prev" ] && awk -v a="$total" -v b="$prev" 'BEGIN { printf "%.2f", a / b }' || echo "-")
  echo "| $n | $fe | $ps | $cg | $wb | $total | $ratio |"
  prev=$total
done
