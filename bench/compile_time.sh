#!/usr/bin/env bash
# Compile time per model, each phase apart (front end with the precision
# pass, passes: schedule, folding, fusion and memory plan, codegen, NVRTC
# per architecture), for the examples and the real-model-shaped ONNX graphs;
# then compile time against graph size: chains of decoder blocks
# (bench/gen_chain.py, .kl and ONNX) at about 2.5k, 10k and 40k nodes,
# without NVRTC, with the growth of the total per 4x nodes (4.0 is
# linear).  Prints markdown tables.
# Usage: bench/compile_time.sh [KILN] [--scaling]   (--scaling: only the
# chains).  SCALING_SIZES overrides the node counts; RUNS sets the runs per
# chain (the fastest is shown; default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=build/kiln
only_scaling=false
for a in "$@"; do
  if [ "$a" = --scaling ]; then only_scaling=true; else kiln=$a; fi
done
py=${PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The fastest of RUNS compiles of one chain: "nodes fe passes codegen weights" (ms).
chain_row() {
  local model=$1 nodes best="" log
  nodes=$("$kiln" compile "$model" --emit=ir | grep -c '^let ')
  for _ in $(seq "${RUNS:-1}"); do
    log=$("$kiln" compile "$model" --emit=cu --no-nvrtc -o "$tmp/chain_out" --time 2>&1)
    t() { grep -oP "time: $1 \K[0-9.]+" <<<"$log" || echo 0; }
    best=$(awk -v b="$best" -v r="$(t 'front end') $(t passes) $(t codegen) $(t 'weights.bin')" \
      'BEGIN { split(r, n, " "); split(b, o, " ");
               print (b == "" || n[1] + n[2] + n[3] < o[1] + o[2] + o[3]) ? r : b }')
  done
  echo "$nodes $best"
}

# Scaling: each phase's time, and the whole compile's growth per 4x nodes
# (near-linear is at most 5x); weights.bin (written while the seeded
# weights are made) is apart from the total.
scaling() {
  echo "| chain | nodes | front end ms | passes ms | codegen ms | weights.bin ms | total ms | x the size before |"
  echo "|---|---|---|---|---|---|---|---|"
  local fmt n model prev row
  for fmt in kl onnx; do
    if [ $fmt = onnx ] && ! "$py" -c 'import onnx' 2>/dev/null; then
      echo "| onnx | (no onnx package for $py) | | | | | | |"
      continue
    fi
    prev=""
    for n in ${SCALING_SIZES:-2500 10000 40000}; do
      model="$tmp/chain$n.$fmt"
      "$py" bench/gen_chain.py --nodes "$n" --format $fmt -o "$model"
      row=$(chain_row "$model")
      awk -v fmt=$fmt -v row="$row" -v prev="$prev" 'BEGIN {
        split(row, r, " "); t = r[2] + r[3] + r[4];
        printf "| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n", fmt, r[1], r[2], r[3], r[4],
               r[5], t, prev == "" ? "-" : sprintf("%.2f", t / prev) }'
      prev=$(awk -v row="$row" 'BEGIN { split(row, r, " "); print r[2] + r[3] + r[4] }')
      rm -rf "$model" "$tmp/chain_out"
    done
  done
}

if $only_scaling; then
  scaling
  exit 0
fi
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

echo
scaling
