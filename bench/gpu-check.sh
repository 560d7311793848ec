#!/usr/bin/env bash
# The one script to run when a GPU (an H200) is lent: build, check the cuda
# device against the host device and the interpreter, then time.  Meant to
# finish well under eight minutes.  Prints a summary at the end; paste it
# into the issue note and docs/PERFORMANCE.md.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null || exit 1
export PATH="$PWD/.venv/bin:$PATH"
data=/usr/share/libonnx-testdata/data
out=$(mktemp -d)
summary=()

echo "== the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== the runtime's device tests on the real GPU (no fake libcuda)"
if build/tests/test_device >"$out/device.txt" 2>&1; then r=ok; else r=FAILED; fi
tail -3 "$out/device.txt"
summary+=("runtime device tests on cuda: $r")

echo "== ONNX conformance compiled for cuda (host: lines of expected_pass guard it)"
timeout 300 build/tests/conformance "$data" --device cuda \
  --expected tests/conformance/expected_pass.txt >"$out/conf.txt" 2>&1
tail -8 "$out/conf.txt"
summary+=("conformance on cuda: $(grep -E '^conformance:' "$out/conf.txt")")
summary+=("guard: $(tail -1 "$out/conf.txt")")

echo "== examples: cuda vs host vs interpreter, same inputs"
for ex in mlp cnn transformer; do
  for dev in interp host cuda; do
    build/kiln run "examples/$ex.kl" --device=$dev --output-dir "$out/$ex-$dev" >"$out/$ex-$dev.log" 2>&1 ||
      echo "  $ex on $dev failed: $(tail -1 "$out/$ex-$dev.log")"
  done
  line=$(python3 - "$out" "$ex" <<'PY'
import sys, numpy as np, glob, os
out, ex = sys.argv[1], sys.argv[2]
def load(dev):
    return [np.load(f) for f in sorted(glob.glob(os.path.join(out, f"{ex}-{dev}", "output_*.npy")))]
ref, host, cuda = load("interp"), load("host"), load("cuda")
def rel(a, b):
    if not a or len(a) != len(b): return "missing"
    return "%.2e" % max(float(np.max(np.abs(x - y) / (np.abs(y) + 1e-6))) for x, y in zip(a, b))
print(f"{ex}: max rel diff cuda/interp {rel(cuda, ref)}, cuda/host {rel(cuda, host)}, host/interp {rel(host, ref)}")
PY
)
  echo "  $line"
  summary+=("$line")
done

echo "== fused vs unfused, fp32 and fp16, on cuda (kiln bench; run_ms includes the"
echo "   host<->device copies of inputs and outputs that run() makes)"
for ex in transformer cnn; do
  for prec in fp32 fp16; do
    build/kiln bench "examples/$ex.kl" --device=cuda --iters 50 --precision=$prec \
      >"$out/bench-$ex-$prec.txt" 2>&1
    cat "$out/bench-$ex-$prec.txt"
    summary+=("bench $ex $prec: $(grep -E '^(kernels|run ms)' "$out/bench-$ex-$prec.txt" | tr -s ' ' | tr '\n' ';')")
  done
done

echo "== the profiler: each step's bandwidth against the GPU's own device-to-device"
echo "   copy; the issue's aim is 80% or more for steps that move over 64 MB"
build/kiln profile examples/transformer.kl --device=cuda --dim B=32 --dim T=512 --iters 20 \
  >"$out/profile-transformer.txt" 2>&1
build/kiln profile examples/cnn.kl --device=cuda --dim B=512 --iters 20 \
  >"$out/profile-cnn.txt" 2>&1
for f in "$out"/profile-*.txt; do
  cat "$f"
  summary+=("$(head -1 "$f")")
  while read -r line; do summary+=("  over 64 MB: $line"); done < <(
    awk 'NR > 2 && $(NF-3) + 0 > 64 * 1048576 && $1 != "total" { print }' "$f")
done
build/kiln bench examples/transformer.kl --device=cuda --dim B=8 --dim T=128 --iters 50 \
  >"$out/bench-transformer-8x128.txt" 2>&1
cat "$out/bench-transformer-8x128.txt"
summary+=("bench transformer B=8 T=128: $(grep -E '^(kernels|dram|run ms)' "$out/bench-transformer-8x128.txt" | tr -s ' ' | tr '\n' ';')")

echo "== compile time (NVRTC included)"
bench/compile_time.sh build/kiln | tee "$out/compile.md"

echo
echo "== summary ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
printf '%s\n' "${summary[@]}"
