#!/usr/bin/env bash
# The one script to run when a GPU (an H200) is lent: build, check the cuda
# device against the host device and the interpreter, then time.  Meant to
# finish well under eight minutes.  Prints a summary at the end; paste it
# into the issue note and docs/PERFORMANCE.md.
#
# On a machine that can fetch nothing (the device machine sessions are
# lent), run bench/gpu-pack.sh here first and carry .gpu: the script then
# unpacks kiln, the test programs, their libraries and ONNX's test data
# from it instead of building.  KILN_GPU_CHECK_DEVICE=host runs the whole
# script on the host device (small sizes), to try it without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
dev=${KILN_GPU_CHECK_DEVICE:-cuda}
# KILN_GPU_CHECK_ONLY=cutoffs,bench,...: only those parts (device, conformance,
# examples, long, models, bench, cutoffs, tensor, split, profile, train, arch), to spend a short lease
only=${KILN_GPU_CHECK_ONLY:-}
want() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }
out=$(mktemp -d)
summary=()
if [ -f .gpu/kiln-gpu.tar.gz ]; then
  pack=$(mktemp -d)
  tar xzf .gpu/kiln-gpu.tar.gz -C "$pack" || exit 1
  bin=$pack/bin data=$pack/onnx-testdata
  export KILN_RUNTIME_DIR=$PWD/runtime
  export LD_LIBRARY_PATH=$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # the project's venv where there is one (a dry run here), else the
  # machine's python3 (numpy and onnx are in the GPU machine's image)
  [ -x .venv/bin/python ] && export PYTHON=${PYTHON:-$PWD/.venv/bin/python}
  export PYTHON=${PYTHON:-python3}
  # a pack built from other sources would measure other code (the copy of
  # the tree on the GPU machine may have no .git: compare the sources)
  if [ "$(bench/gpu-pack.sh --sources-sum)" != "$(cat "$pack/sources.sum" 2>/dev/null)" ]; then
    echo "gpu-check: the pack was built from other sources; run bench/gpu-pack.sh again" >&2
    [ "${KILN_GPU_CHECK_ANY_PACK:-}" = 1 ] || exit 1
  fi
  summary+=("pack built at commit $(cat "$pack/commit")")
else
  scripts/setup.sh >/dev/null || exit 1
  export PATH="$PWD/.venv/bin:$PATH"
  bin=build bin_tests=build/tests data=/usr/share/libonnx-testdata/data
fi
tests=${bin_tests:-$bin}
# cuBLAS, cuBLASLt, NVRTC, NCCL and libcuda (dlopen'ed) where the loader may not look
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done
pysite=$("${PYTHON:-python3}" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
for lib in cublas/lib cuda_nvrtc/lib cu13/lib nccl/lib; do
  [ -n "$pysite" ] && [ -d "$pysite/nvidia/$lib" ] &&
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$pysite/nvidia/$lib
done
kiln=$bin/kiln
# sizes: the GPU's, or the examples' own (and a slice of the conformance
# tests) on the host device
if [ "$dev" = cuda ]; then big_t=(--dim B=128 --dim T=512); big_c=(--dim B=2048); iters=50; conf=()
else big_t=(); big_c=(); iters=2; conf=(--filter test_softmax); fi

echo "== [${SECONDS}s] the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# each step is bounded: one hang must not spend the whole lease
t() { local s=$1; shift; timeout "$s" "$@"; }

if want device; then
if [ "$dev" = cuda ]; then
  echo "== [${SECONDS}s] the runtime's device tests on the GPU (no fake libcuda)"
  # test_gpu_module_launch: device_kernels.cu through NVRTC, cubin then PTX
  # alone, launched and timed by events on the GPU (skipped where no GPU)
  if KILN_TEST_KERNELS_CU=$PWD/tests/unit/device_kernels.cu KILN_RUNTIME_DIR=$PWD/runtime \
     t 120 "$tests/test_device" >"$out/device.txt" 2>&1; then r=ok; else r=FAILED; fi
  grep -q 'OK \] test_gpu_module_launch' "$out/device.txt" || r="$r (the GPU launch test did not pass)"
  grep -E '^\[  (FAILED|SKIPPED|PASSED)|^\[  ERROR' "$out/device.txt" | head -20
  summary+=("runtime device tests on cuda: $r")
fi
fi

if want conformance; then
echo "== [${SECONDS}s] ONNX conformance compiled for $dev, in the background (shards side by side;"
echo "   each test compiles with cc and NVRTC; collected at the end)"
shards=$(( $(nproc) > 4 ? $(nproc) / 4 : 1 ))
for k in $(seq 0 $((shards - 1))); do
  t 240 "$tests/conformance" "$data" --device "$dev" "${conf[@]}" --shard "$k/$shards" \
    --expected tests/conformance/expected_pass.txt \
    --known-failures tests/conformance/known_failures.txt >"$out/conf-$k.txt" 2>&1 &
done
fi

if want examples; then
echo "== [${SECONDS}s] examples: $dev vs host vs interpreter, same inputs, fp32, fp16 and bf16"
# a check passes when |a - b| <= t * max|b| everywhere, t = 2 (8u + 3 sqrt(K) 2^-24):
# u the precision's unit roundoff, K = 1024 a bound on the examples' longest
# reduction (both sides carry that error, hence the 2; as check_precision.py)
for prec in fp32 fp16 bf16; do
  for ex in mlp cnn transformer; do
    devs=(interp host)
    [ "$dev" = host ] || devs+=("$dev")
    for d in "${devs[@]}"; do
      t 120 "$kiln" run "examples/$ex.kl" --device="$d" --precision=$prec --output-dir "$out/$ex-$prec-$d" \
        >"$out/$ex-$prec-$d.log" 2>&1 || echo "  $ex $prec on $d failed: $(tail -1 "$out/$ex-$prec-$d.log")"
    done
    line=$("${PYTHON:-python3}" - "$out" "$ex" "$prec" "$dev" <<'PY'
import sys, numpy as np, glob, os
out, ex, prec, dev = sys.argv[1:5]
u = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}[prec]
t = 2 * (8 * u + 3 * 1024 ** 0.5 * 2.0 ** -24)
def load(d):
    return [np.load(f).astype(np.float64) for f in sorted(glob.glob(os.path.join(out, f"{ex}-{prec}-{d}", "output_*.npy")))]
ref, host, gpu = load("interp"), load("host"), load(dev)
def check(a, b):
    if not a or len(a) != len(b): return "missing", False
    worst = max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(y))), 1e-30)) for x, y in zip(a, b))
    return "%.1e" % worst, worst <= t
parts, ok = [], True
for name, a, b in ((dev + "/interp", gpu, ref), (dev + "/host", gpu, host), ("host/interp", host, ref)):
    d, good = check(a, b)
    parts.append(f"{name} {d}")
    ok &= good
print(("PASS" if ok else "FAIL") + f" {ex} {prec}: " + ", ".join(parts) + f" (bound {t:.1e} of max|ref|)")
PY
)
    echo "  $line"
    summary+=("$line")
  done
done
fi

if want long; then
echo "== [${SECONDS}s] attention at T = 4096 (the tiled kernel): $dev vs the interpreter"
if [ "$dev" = cuda ]; then t4=(--dim B=1 --dim T=4096); else t4=(--dim B=1 --dim T=1100); fi
for d in interp "$dev"; do
  t 300 "$kiln" run examples/transformer.kl --device="$d" "${t4[@]}" --output-dir "$out/t4k-$d" \
    >"$out/t4k-$d.log" 2>&1 || echo "  transformer T=4096 on $d failed: $(tail -1 "$out/t4k-$d.log")"
done
line=$("${PYTHON:-python3}" - "$out" "$dev" <<'PY'
import sys, glob, os, numpy as np
out, dev = sys.argv[1:3]
a = [np.load(f).astype(np.float64) for f in sorted(glob.glob(os.path.join(out, f"t4k-{dev}", "output_*.npy")))]
b = [np.load(f).astype(np.float64) for f in sorted(glob.glob(os.path.join(out, "t4k-interp", "output_*.npy")))]
t = 2 * (8 * 2.0 ** -24 + 3 * 4096 ** 0.5 * 2.0 ** -24)
if not a or len(a) != len(b): print("FAIL transformer long rows: missing outputs"); sys.exit()
w = max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(y))), 1e-30)) for x, y in zip(a, b))
print(("PASS" if w <= t else "FAIL") + f" transformer long rows fp32: {dev}/interp {w:.1e} (bound {t:.1e})")
PY
)
echo "  $line"
summary+=("$line")
fi

if want models; then
echo "== [${SECONDS}s] the ONNX model-shaped graphs on $dev against ONNX Runtime, then each"
echo "   fused: launches and run time, with the tables' convolution cut-off and with every"
echo "   convolution direct (K up to 4608)"
t 300 "${PYTHON:-python3}" tests/onnx_models/check_models.py "$kiln" "$out/onnx" --build \
  --kiln-arg=--device="$dev" -j 4 >"$out/models.txt" 2>&1
grep -E '^(FAIL|UNSUPPORTED)' "$out/models.txt" | head -10
summary+=("ONNX models on $dev vs ONNX Runtime: $(tail -1 "$out/models.txt")")
for m in resnet18 mobilenetv2 bert_block gpt2_block; do
  for spec in "" direct_conv_max_k=4608; do
    case $m in bert*|gpt2*) [ -n "$spec" ] && continue ;; esac
    KILN_CUTOFFS=$spec t 120 "$kiln" bench "$out/onnx/$m/model.onnx" --device="$dev" --iters "$iters" --json \
      >"$out/bench-$m${spec:+-all-direct}.json" 2>>"$out/models.txt"
    line=$("${PYTHON:-python3}" - "$out/bench-$m${spec:+-all-direct}.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no result ({e})"); sys.exit()
f, u = d["fused"], d["unfused"]
def ms(s, k): return "%.3f" % s[k] if isinstance(s.get(k), (int, float)) else "-"
print(f"launches {f['launches']} (unfused {u['launches']}), run ms {ms(f, 'run_ms')} (unfused {ms(u, 'run_ms')}), "
      f"no graph {ms(f, 'plain_run_ms')} (unfused {ms(u, 'plain_run_ms')})")
PY
)
    echo "  $m ${spec:-(table)}: $line"
    summary+=("bench $m on $dev, ${spec:-table cut-offs}: $line")
  done
done
fi

if want bench; then
echo "== [${SECONDS}s] fused vs unfused, fp32 and fp16, on $dev (kiln bench; run_ms includes the"
echo "   host<->device copies of inputs and outputs that run() makes; on a GPU each side is"
echo "   timed replaying a CUDA graph, then kernel by kernel: the \"run ms, no graph\" row)"
for ex in transformer cnn; do
  for prec in fp32 fp16; do
    t 180 "$kiln" bench "examples/$ex.kl" --device="$dev" --iters "$iters" --precision=$prec \
      >"$out/bench-$ex-$prec.txt" 2>&1
    cat "$out/bench-$ex-$prec.txt"
    summary+=("bench $ex $prec: $(grep -E '^(kernels|dram|run ms|CUDA graph)' "$out/bench-$ex-$prec.txt" | tr -s ' ' | tr '\n' ';')")
  done
done
fi

# total device ms of one model under KILN_CUTOFFS=$1, the rest kiln profile's arguments
if [ "$dev" = cuda ]; then prof_iters=20; else prof_iters=2; fi
device_ms() {
  local spec=$1; shift
  KILN_CUTOFFS=$spec t 120 "$kiln" profile "$@" --device="$dev" --iters "$prof_iters" 2>>"$out/cutoffs.log" |
    tee -a "$out/cutoffs.log" | awk '/^total \(steps summed\)/ { print $(NF-1) }'
}
if want cutoffs; then
echo "== [${SECONDS}s] cut-offs: each choice between a direct kernel and the library, both sides"
echo "   timed on $dev (kiln profile: the steps' device time summed, inputs resident)"
# sweep KNOB LABEL MODEL VALUE_DIM FACTOR "VALUES" FIXED_DIMS...: for each value
# of the swept dim, the model's time with the knob at 0 (library side) and
# at "everything" (direct side); prints a line per value and sets $crossover
# to the threshold on the length (value x FACTOR) that makes the swept
# models' summed time least: 0 (always the library), a measured length, or
# with OPEN=1 set, -1 when the largest wins (no bound: the knob's default)
sweep() {
  local knob=$1 label=$2 model=$3 vdim=$4 factor=$5 values=$6; shift 6
  local v lib direct points=""
  for v in $values; do
    lib=$(device_ms "$knob=0" "$model" --dim "$vdim=$v" "$@")
    direct=$(device_ms "$knob=1000000000000000000" "$model" --dim "$vdim=$v" "$@")
    local len=$((v * factor)) verdict
    verdict=$(awk -v a="$direct" -v b="$lib" 'BEGIN { if (a == "" || b == "") print "?"; else if (a <= b) print "direct"; else print "library" }')
    printf '  %-28s %6s = %-6d direct %10s ms   library %10s ms   %s\n' "$label" "$vdim" "$v" "$direct" "$lib" "$verdict"
    summary+=("cut-off $label $vdim=$v (length $len): direct ${direct:-?} ms, library ${lib:-?} ms")
    points+="$len ${direct:-1e9} ${lib:-1e9}"$'\n'
  done
  crossover=$(printf '%s' "$points" | awk -v open="${OPEN:-0}" '
    { len[NR] = $1; d[NR] = $2; l[NR] = $3 }
    END { best = 0; bestc = 0; for (i = 1; i <= NR; i++) bestc += l[i]
          for (j = 1; j <= NR; j++) { c = 0; for (i = 1; i <= NR; i++) c += len[i] <= len[j] ? d[i] : l[i]
                                      if (c < bestc) { bestc = c; best = len[j] } }
          if (open == 1 && NR > 0 && best == len[NR]) best = -1
          print best }')
}
if [ "$dev" = cuda ]; then
  # the dot product's length at a small layer's size (the cnn example's),
  # then the size at a fixed length (batches), then large layers
  ck_c="16 32 64 128 256"; ck_dims=(--dim B=8 --dim O=16 --dim S=16)
  cm_b="1 2 4 8 16 32"; cm_dims=(--dim C=64 --dim O=64 --dim S=32)
  big_c="16 128 512"; big_dims=(--dim B=32 --dim O=128 --dim S=32)
  mk_k="32 64 128 256"; mk_dims=(--dim M=1024 --dim N=256)
  mm_m="256 1024 4096 16384"; mm_dims=(--dim K=64 --dim N=256)
  att_t="128 256 512 1024 2048 4096"; att_dims=(--dim B=4 --dim H=16)
else
  ck_c="4 8"; ck_dims=(--dim B=1 --dim O=8 --dim S=4)
  cm_b="1 2"; cm_dims=(--dim C=4 --dim O=8 --dim S=4)
  big_c="4"; big_dims=(--dim B=1 --dim O=8 --dim S=8)
  mk_k="16 32"; mk_dims=(--dim M=64 --dim N=32)
  mm_m="16 64"; mm_dims=(--dim K=16 --dim N=32)
  att_t="16 32"; att_dims=(--dim B=1 --dim H=2)
fi
sweep direct_conv_max_k "conv3x3+bn+relu, small" bench/models/conv_block.kl C 9 "$ck_c" "${ck_dims[@]}"
conv_k=$crossover
# multiply-adds per batch image: 64 channels x 32 x 32 pixels x K (9 x C)
OPEN=1 sweep direct_conv_max_macs "conv3x3+bn+relu, ${cm_dims[1]}" bench/models/conv_block.kl B $((64 * 1024 * 9 * ${cm_dims[1]#C=})) \
  "$cm_b" "${cm_dims[@]}"
conv_macs=$crossover
sweep direct_conv_max_k "conv3x3+bn+relu, large" bench/models/conv_block.kl C 9 "$big_c" "${big_dims[@]}"
sweep direct_matmul_max_k "gemm+bias+gelu, M=1024" bench/models/matmul_block.kl K 1 "$mk_k" "${mk_dims[@]}"
mm_k_best=$crossover
OPEN=1 sweep direct_matmul_max_macs "gemm+bias+gelu, ${mm_dims[1]}" bench/models/matmul_block.kl M $((${mm_dims[1]#K=} * ${mm_dims[3]#N=})) \
  "$mm_m" "${mm_dims[@]}"
mm_macs=$crossover
sweep attention_max_keys "causal attention, D=64" bench/models/attention.kl T 1 "$att_t" "${att_dims[@]}"
att_best=$crossover
# attention in halves: the tensor-core kernel against cuBLAS + softmax
sweep attention_mma_max_keys "fp16 causal attention, D=64" bench/models/attention.kl T 1 "$att_t" "${att_dims[@]}" --precision=fp16
att_mma_best=$crossover
fi

if want tensor; then
echo "== [${SECONDS}s] tensor cores (f16/bf16 attention and convolutions as warp matrix multiply-adds):"
echo "   the reference cases in halves on $dev against NumPy, then each kernel against its scalar"
echo "   form (tensor_cores=0) and the library, device ms (kiln profile)"
"${PYTHON:-python3}" tests/ref/ops_cases.py "$out/ops" >/dev/null 2>&1
t 300 "${PYTHON:-python3}" tests/ref/check.py "$kiln" "$out/ops" \
  -k attention_f16,attention_bf16,conv2d_mma,conv2d_f16,attn_op_f16,matmul_f16 \
  --kiln-arg=--device="$dev" >"$out/tensor-ops.txt" 2>&1 && r=PASS || r=FAIL
grep -E '^FAIL' "$out/tensor-ops.txt" | head -5
line="$r reference cases in halves on $dev (tensor cores): $(tail -1 "$out/tensor-ops.txt")"
echo "  $line"; summary+=("$line")
for prec in fp16 bf16; do
  for ex in transformer cnn; do
    t 120 "$kiln" check "examples/$ex.kl" --device="$dev" --precision=$prec >"$out/tensor-check-$ex-$prec.txt" 2>&1 &&
      r=PASS || r=FAIL
    line="$r kiln check $ex $prec on $dev: $(grep -E 'max abs err' "$out/tensor-check-$ex-$prec.txt" | head -1 | tr -s ' ')"
    echo "  $line"; summary+=("$line")
  done
done
if [ "$dev" = cuda ]; then tc_conv=(--dim B=32 --dim C=64 --dim O=128 --dim S=32); tc_att=(--dim B=4 --dim H=16 --dim T=1024)
else tc_conv=(--dim B=1 --dim C=4 --dim O=8 --dim S=8); tc_att=(--dim B=1 --dim H=2 --dim T=40); fi
for prec in fp16 bf16; do
  for side in "tensor_cores=1" "tensor_cores=0" "direct_conv_max_k=0"; do
    ms=$(device_ms "$side" bench/models/conv_block.kl --precision=$prec "${tc_conv[@]}")
    line="conv3x3+bn+relu $prec ${tc_conv[*]}: $side ${ms:-?} ms"
    echo "  $line"; summary+=("$line")
  done
  for side in "tensor_cores=1" "tensor_cores=0" "attention_mma_max_keys=0"; do
    ms=$(device_ms "$side" bench/models/attention.kl --precision=$prec "${tc_att[@]}")
    line="causal attention $prec ${tc_att[*]}: $side ${ms:-?} ms"
    echo "  $line"; summary+=("$line")
  done
done
fi

if want cutoffs; then
sm_here=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# direct_conv_min_outputs_per_k and direct_conv_split_below come from the
# split section (-1 here: the default's)
row="    {${sm_here:-0}, $conv_k, $mm_k_best, $att_best, $conv_macs, $mm_macs, -1, -1, $att_mma_best, \"${gpu_name:-$dev}, $(date -u +%Y-%m-%d), bench/gpu-check.sh\"},"
echo "  the row for codegen/cutoffs.c: $row"
echo "$row" >"$out/cutoffs-row.txt"
summary+=("cut-off row for codegen/cutoffs.c (sm, conv K, matmul K, attention keys, conv MACs, matmul MACs, min outputs/K, split below, fp16 attention keys): $row")
fi

if want split; then
echo "== [${SECONDS}s] convolutions a warp an output (few outputs, long dot products): every direct"
echo "   convolution split, checked against NumPy and ONNX Runtime on $dev; then the split"
echo "   threshold (outputs per unit of K) swept on the model-shaped graphs (device ms, kiln profile)"
all_split=direct_conv_min_outputs_per_k=0,direct_conv_split_below=1000000000
"${PYTHON:-python3}" tests/ref/ops_cases.py "$out/ops" >/dev/null 2>&1
KILN_CUTOFFS=$all_split t 300 "${PYTHON:-python3}" tests/ref/check.py "$kiln" "$out/ops" -k conv2d \
  --kiln-arg=--device="$dev" >"$out/split-ops.txt" 2>&1 && r=PASS || r=FAIL
grep -E '^FAIL' "$out/split-ops.txt" | head -5
line="$r conv2d reference cases, every convolution split, on $dev: $(tail -1 "$out/split-ops.txt")"
echo "  $line"; summary+=("$line")
KILN_CUTOFFS=$all_split t 300 "${PYTHON:-python3}" tests/onnx_models/check_models.py "$kiln" "$out/onnx-split" --build \
  --kiln-arg=--device="$dev" -j 4 >"$out/split-models.txt" 2>&1 && r=PASS || r=FAIL
grep -E '^(FAIL|UNSUPPORTED)' "$out/split-models.txt" | head -5
line="$r ONNX models, every direct convolution split, on $dev vs ONNX Runtime: $(tail -1 "$out/split-models.txt")"
echo "  $line"; summary+=("$line")
if [ "$dev" = cuda ]; then split_values="0 2 8 32 128"; else split_values="0 32"; fi
split_points=""
for m in resnet18 mobilenetv2 se_net fpn; do
  [ -f "$out/onnx-split/$m/model.onnx" ] || continue
  for n in $split_values; do
    KILN_CUTOFFS=direct_conv_min_outputs_per_k=0,direct_conv_split_below=$n t 120 "$kiln" profile \
      "$out/onnx-split/$m/model.onnx" --device="$dev" --iters 20 >"$out/split-$m-$n.txt" 2>&1
    ms=$(awk '/^total \(steps summed\)/ { print $(NF-1) }' "$out/split-$m-$n.txt")
    launches=$(awk '/^total \(steps summed\)/ { print $(NF-3) }' "$out/split-$m-$n.txt")
    printf '  %-12s split below %4s outputs/K: %10s ms, %s launches\n' "$m" "$n" "${ms:-?}" "${launches:-?}"
    summary+=("split $m below $n: ${ms:-?} ms device, ${launches:-?} launches")
    split_points+="$n ${ms:-1e9}"$'\n'
  done
  KILN_CUTOFFS= t 120 "$kiln" profile "$out/onnx-split/$m/model.onnx" --device="$dev" --iters 20 >"$out/split-$m-table.txt" 2>&1
  ms=$(awk '/^total \(steps summed\)/ { print $(NF-1) }' "$out/split-$m-table.txt")
  summary+=("split $m with the committed row: ${ms:-?} ms device")
  echo "  $m with the committed row: ${ms:-?} ms"
done
best=$(printf '%s' "$split_points" | awk '{ s[$1] += $2; if (!($1 in seen)) { seen[$1] = 1; o[++n] = $1 } }
  END { b = o[1]; for (i = 2; i <= n; i++) if (s[o[i]] < s[b]) b = o[i]; print b }')
line="split threshold with the least summed device time: direct_conv_split_below=$best (direct_conv_min_outputs_per_k=0)"
echo "  $line"; summary+=("$line")
for m in resnet18 mobilenetv2; do
  [ -f "$out/onnx-split/$m/model.onnx" ] || continue
  KILN_CUTOFFS=direct_conv_min_outputs_per_k=0,direct_conv_split_below=$best t 180 "$kiln" bench \
    "$out/onnx-split/$m/model.onnx" --device="$dev" --iters "$iters" >"$out/split-bench-$m.txt" 2>&1
  line="bench $m, split below $best: $(grep -E '^(launches|run ms)' "$out/split-bench-$m.txt" | tr -s ' ' | tr '\n' ';')"
  echo "  $line"; summary+=("$line")
done
fi

if want profile; then
echo "== [${SECONDS}s] the profiler: each step's bandwidth against the device's own device-to-device"
echo "   copy; the issue's aim is 80% or more for steps that move over 64 MB"
t 180 "$kiln" profile examples/transformer.kl --device="$dev" "${big_t[@]}" --iters 20 \
  >"$out/profile-transformer.txt" 2>&1
t 180 "$kiln" profile examples/cnn.kl --device="$dev" "${big_c[@]}" --iters 20 \
  >"$out/profile-cnn.txt" 2>&1
for f in "$out"/profile-*.txt; do
  cat "$f"
  summary+=("$(head -1 "$f")")
  # columns from the right: of copy, GB/s, ms, est. bytes
  while read -r line; do summary+=("  over 64 MB: $line"); done < <(
    awk 'NR > 2 && $(NF-3) + 0 > 64 * 1048576 && $1 != "total" { print }' "$f")
done
if [ "$dev" = cuda ]; then
  t 180 "$kiln" bench examples/transformer.kl --device=cuda --dim B=8 --dim T=128 --iters 50 \
    >"$out/bench-transformer-8x128.txt" 2>&1
  cat "$out/bench-transformer-8x128.txt"
  summary+=("bench transformer B=8 T=128: $(grep -E '^(kernels|dram|run ms|CUDA graph)' "$out/bench-transformer-8x128.txt" | tr -s ' ' | tr '\n' ';')")
fi
fi

if want train; then
echo "== [${SECONDS}s] training: a step on $dev against the host device, then fp32 vs fp16"
# the same 40 steps on both devices (same seed, same data order): the losses
# agree to f32 rounding; then the step's time and arena, fp32 against fp16
"${PYTHON:-python3}" examples/data/digits.py "$out/digits" >/dev/null 2>&1 || true
if [ -f "$out/digits/train_x.npy" ]; then
  for d in host "$dev"; do
    t 300 "$kiln" train examples/train_cnn.kl --data "$out/digits" --steps 40 --device "$d" \
      --losses "$out/train-losses-$d.txt" >"$out/train-$d.txt" 2>&1
  done
  agree=$(paste "$out/train-losses-host.txt" "$out/train-losses-$dev.txt" 2>/dev/null |
    awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / (($1 < 0 ? -$1 : $1) + 1e-3); if (r > m) m = r } END { printf "%.2e", m }')
  summary+=("train_cnn 40 steps, $dev vs host: largest relative loss difference $agree")
  for p in fp32 fp16; do
    t 300 "$kiln" bench examples/train_cnn.kl --train --device "$dev" --precision=$p --dim B=256 \
      --iters 50 >"$out/bench-train-$p.txt" 2>&1
    summary+=("train_cnn B=256 $p: $(grep -E '^(kernels|arena bytes|run ms)' "$out/bench-train-$p.txt" | tr -s ' ' | tr '\n' ';')")
  done
  f32=$(awk '/^run ms/ { print $4 }' "$out/bench-train-fp32.txt"); f16=$(awk '/^run ms/ { print $4 }' "$out/bench-train-fp16.txt")
  a32=$(awk '/^arena bytes/ { print $3 }' "$out/bench-train-fp32.txt"); a16=$(awk '/^arena bytes/ { print $3 }' "$out/bench-train-fp16.txt")
  summary+=("train_cnn B=256 fp16 vs fp32: speedup $(awk -v a="$f32" -v b="$f16" 'BEGIN { if (b > 0) printf "%.2f", a / b }'), arena saved $(awk -v a="$a32" -v b="$a16" 'BEGIN { if (a > 0) printf "%.0f%%", 100 * (a - b) / a }')")
fi

echo "== [${SECONDS}s] data-parallel: a 1-GPU NCCL smoke test (issue 15)"
# one rank that still exchanges (KILN_EXCHANGE_ONE_RANK=1, no mpirun needed):
# NCCL loaded, its communicator made, every bucket summed on its own stream
# and ordered by events; the losses must equal the plain step's on this
# device (a one-rank sum is the value itself)
if [ -f "$out/digits/train_x.npy" ]; then
  t 300 "$kiln" train examples/train_cnn.kl --data "$out/digits" --steps 40 --device "$dev" \
    --losses "$out/nccl-plain.txt" >"$out/nccl-plain.log" 2>&1
  KILN_EXCHANGE_ONE_RANK=1 t 300 "$kiln" train examples/train_cnn.kl --data-parallel --bucket-mb 0.01 \
    --data "$out/digits" --steps 40 --device "$dev" --losses "$out/nccl-one.txt" >"$out/nccl-one.log" 2>&1
  if [ -s "$out/nccl-one.txt" ] && cmp -s "$out/nccl-plain.txt" "$out/nccl-one.txt"; then
    summary+=("NCCL smoke test on $dev: PASS (40 steps through a one-rank NCCL exchange, losses equal to the plain step's)")
  else
    summary+=("NCCL smoke test on $dev: FAIL ($(tail -1 "$out/nccl-one.log"))")
  fi
fi
fi

if want arch; then
if [ "$dev" = cuda ]; then
  echo "== [${SECONDS}s] kiln compile without --arch: the GPU here's cubin and PTX (issue 17)"
  sm_here=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
  t 120 "$kiln" compile examples/mlp.kl --emit=cu -o "$out/arch-default" >"$out/arch-default.log" 2>&1
  got=$(grep -o 'cubin_sm[0-9]*\[' "$out/arch-default/gpu_images.c" 2>/dev/null | tr -d '[' | sort -u | tr '\n' ' ')
  if [ -n "$sm_here" ] && [ "$got" = "cubin_sm$sm_here " ]; then
    summary+=("default --arch on $dev: PASS (cubin_sm$sm_here only)")
  else
    summary+=("default --arch on $dev: FAIL (GPU sm_$sm_here, images: $got)")
  fi
fi
fi

if want conformance; then
echo "== [${SECONDS}s] ONNX conformance on $dev (host: lines of expected_pass guard it)"
wait
cat "$out"/conf-*.txt >"$out/conf.txt"
grep -hE '^(REGRESSION|FAIL|host FAIL)' "$out/conf.txt" | head -20
# the shards' counts added up: passed, failed, unsupported, guarded, regressions
# (the runner's own error lines also start "conformance:", without counts)
line=$(grep -hE '^conformance: [0-9]+ passed' "$out"/conf-*.txt |
  awk '{ gsub(/[^0-9]+/, " "); n = split($0, a, " "); for (i = 1; i <= n; i++) s[i] += a[i] }
       END { printf "%d passed, %d failed, %d unsupported; %d guarded, %d regressions", s[1], s[2], s[3], s[4], s[5] }')
done_shards=$(grep -cE '^conformance: [0-9]+ passed' "$out/conf.txt")
echo "  $line ($done_shards of $shards shards finished)"
summary+=("conformance on $dev: $line ($done_shards of $shards shards finished in 240 s)")
fi

echo
echo "== [${SECONDS}s] summary ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
# the device tool brings back what is under $OUT: every log, in one file
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/gpu-check-logs.tar.gz" -C "$out" --exclude='*.npy' . && cp "$out/summary.txt" "$out/cutoffs-row.txt" "$OUT/" 2>/dev/null
fi
