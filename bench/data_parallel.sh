#!/usr/bin/env bash
# data_parallel.sh - data-parallel training on the host device: each example
# trained on one rank (batch 32) and on two (16 + 16, mpirun -np 2), the
# same global batches, and the split of a step's time each prints: compute,
# all-reduce (how much of it hidden behind the backward pass), input wait.
# Usage: bench/data_parallel.sh [KILN] [STEPS] [BUCKET_MB]   (from the repository root)
set -euo pipefail
kiln=$(realpath "${1:-build/kiln}")
steps=${2:-300}
bucket=${3:-25}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
"$py" "$root/examples/data/digits.py" "$tmp/data" >/dev/null
for model in train_mlp train_cnn; do
  "$kiln" compile "$root/examples/$model.kl" --train --emit=exe --dim B=32 -o "$tmp/one" --no-nvrtc 2>/dev/null
  "$kiln" compile "$root/examples/$model.kl" --train --data-parallel --bucket-mb "$bucket" --emit=exe --dim B=16 -o "$tmp/two" \
    --no-nvrtc 2>/dev/null
  grad=$("$kiln" inspect "$root/examples/$model.kl" | sed -n 's/^params: .* \([0-9]*\) bytes$/\1/p')
  echo "== $model: $grad bytes of gradients, $steps steps of 32 samples, buckets of $bucket MiB"
  "$tmp/one" --data "$tmp/data" --steps "$steps" --device host --log-every "$steps" 2>&1 |
    grep -E "^[0-9.]+ s: |^final" | sed 's/^/  1 rank:  /'
  mpirun -np 2 "$tmp/two" --data "$tmp/data" --steps "$steps" --device host --log-every "$steps" 2>&1 |
    grep -E "^[0-9.]+ s: |^per step|^final" | sed 's/^/  2 ranks: /'
done
