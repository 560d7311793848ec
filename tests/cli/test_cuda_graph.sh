#!/usr/bin/env bash
# CUDA Graphs through a compiled program (issue 17), on the fake driver and
# cuBLAS of tests/unit (FAKE_DIR: where meson built them).  A model of
# GEMMs only (no kernels the fake cannot run): cuBLASLt with its bias and
# relu epilogue, then plain cuBLAS.  On the cuda device the program runs
# once plainly (which makes the cuBLAS handles: the fake, like a driver,
# refuses that during a capture), then captures its run and replays it (the
# fake records the GEMMs while capturing and computes them at each
# replay), and its outputs match the host device's; --no-graph and KILN_NO_GRAPH=1 launch one by one, with the same
# outputs.  Usage: test_cuda_graph.sh KILN FAKE_DIR
set -uo pipefail
kiln=$(realpath "$1")
fake=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
passed=0 failed=0
. "$here/expect.sh"

# close NAME A.npy B.npy: the same values to f32 rounding (the fake sums in
# double, OpenBLAS in f32)
close() {
  if "$py" -c 'import numpy as np, sys
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
sys.exit(0 if a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-6) else 1)' "$2" "$3"; then
    passed=$((passed + 1)); echo "PASS $1"
  else failed=$((failed + 1)); echo "FAIL $1: $2 and $3 differ"; fi
}
# count NAME PATTERN FILE N: N lines of FILE match PATTERN
count() {
  local n; n=$(grep -c -- "$2" "$3" 2>/dev/null); n=${n:-0}
  if [ "$n" -eq "$4" ]; then passed=$((passed + 1)); echo "PASS $1"
  else failed=$((failed + 1)); echo "FAIL $1: $n lines match '$2' in $3, want $4"; fi
}

cat > g.kl <<'KL'
input x: f32[4, 8]
param w: f32[8, 16] = randn(0.5, seed=1)
param b: f32[16] = randn(0.5, seed=2)
param w2: f32[16, 3] = randn(0.5, seed=3)
output y = relu(x @ w + b)
output z = y @ w2
KL
expect compiles 0 "0 kernels, 2 GEMM calls" -- "$kiln" compile g.kl --emit=exe -o g --no-nvrtc
expect host_runs 0 "device: host" -- ./g --device=host --seed 2 --output-dir host
gpu=(env LD_LIBRARY_PATH="$fake" FAKE_GPU_LOG="$tmp/graph.log")
expect graph_replayed 0 "launches: the run captured once as a CUDA graph and replayed" -- \
  "${gpu[@]}" ./g --device=cuda --seed 2 --iters 3 --output-dir graph
count one_capture "cuStreamBeginCapture" graph.log 1
count two_gemms_recorded "capture stream=[0-9]* library call" graph.log 2
count a_replay_a_run "cuGraphLaunch" graph.log 3 # four runs: the first plain, then captured and replayed
close graph_y_matches_host host/output_0.npy graph/output_0.npy
close graph_z_matches_host host/output_1.npy graph/output_1.npy

gpu=(env LD_LIBRARY_PATH="$fake" FAKE_GPU_LOG="$tmp/plain.log")
expect no_graph_plain 0 "launches: kernel by kernel" -- "${gpu[@]}" ./g --device=cuda --seed 2 --iters 3 --no-graph --output-dir plain
count no_graph_no_capture "cuStreamBeginCapture\|cuGraphLaunch" plain.log 0
close plain_y_matches_host host/output_0.npy plain/output_0.npy
close plain_z_matches_host host/output_1.npy plain/output_1.npy
expect env_no_graph 0 "launches: kernel by kernel" -- env KILN_NO_GRAPH=1 LD_LIBRARY_PATH="$fake" ./g --device=cuda --seed 2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
