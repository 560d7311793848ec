#!/usr/bin/env bash
# Command-line behaviour of kiln: help, exit codes, input/output files and
# the errors a user meets with bad files.  Usage: test_cli.sh KILN
set -uo pipefail
kiln=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
passed=0 failed=0

. "$here/expect.sh"

cat >m.kl <<'KL'
dim B = 2
input x: f32[B, 3]
input i: i64[B]
param w: f32[3, 4] = randn(0.5, seed=1)
output y = relu(x @ w)
output z = i + 1
KL
"${PYTHON:-python3}" - <<'PY'
import numpy as np, json, struct
np.save("x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
np.save("i.npy", np.array([5, -2], dtype=np.int64))
np.save("x_bad_shape.npy", np.zeros((3, 3), np.float32))
np.save("x_f64.npy", np.zeros((2, 3), np.float64))
np.save("x_fortran.npy", np.asfortranarray(np.zeros((2, 3), np.float32)))
open("garbage.npy", "wb").write(b"this is not an npy file at all")
open("truncated.npy", "wb").write(open("x.npy", "rb").read()[:-5])
w = np.ones((3, 4), np.float32)
def st(path, tensors):
    hdr, blobs, off = {}, b"", 0
    for name, a in tensors.items():
        b = a.tobytes(); hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs += b
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blobs)
st("w.safetensors", {"w": w})
st("w_bad.safetensors", {"w": np.ones((4, 3), np.float32)})
st("w_extra.safetensors", {"w": w, "nope": w})
PY
mkdir in && cp x.npy in/input_0.npy && cp i.npy in/input_1.npy

expect help_main 0 "usage: kiln COMMAND" -- "$kiln" --help
for c in run compile inspect; do
  expect "help_$c" 0 "usage: kiln $c" -- "$kiln" $c --help
done
expect no_args 2 "usage" -- "$kiln"
expect unknown_command 2 "unknown command 'frobnicate'" -- "$kiln" frobnicate
expect bad_option 2 "usage: kiln run" -- "$kiln" run --device=interp --bogus m.kl
expect missing_model 1 "cannot open 'nope.kl'" -- "$kiln" run --device=interp nope.kl
expect onnx_missing 1 "cannot open 'model.onnx'" -- "$kiln" run --device=interp model.onnx
printf "not a protobuf" > bad.onnx
expect onnx_garbage 1 "not an ONNX model" -- "$kiln" run --device=interp bad.onnx
t=/usr/share/libonnx-testdata/data/node/test_relu
expect onnx_run_pb 0 "output 0" -- "$kiln" run --device=interp $t/model.onnx --inputs-dir $t/test_data_set_0 --output-dir onnx_out
t2=/usr/share/libonnx-testdata/data/node/test_reshape_negative_dim
expect onnx_frozen_shape_input 0 "input 'shape' decides a shape" -- "$kiln" run --device=interp $t2/model.onnx --inputs-dir $t2/test_data_set_0
expect onnx_shape_unknown_input 1 "no input named" -- "$kiln" run --device=interp $t/model.onnx --shape q=1,2
expect run_random 0 "not given: using seeded random values" -- "$kiln" run m.kl --device=interp
# kiln run defaults to auto: the compiled model, on the host without a GPU
expect run_default_auto 0 "device: (host|cuda)" -- "$kiln" run m.kl
# -o checked before any work: a missing folder, a file where a folder goes
expect compile_out_folder_missing 1 "-o /nonexistent/dir/prog: the folder /nonexistent/dir does not exist" -- \
  "$kiln" compile m.kl --emit=exe -o /nonexistent/dir/prog
expect compile_out_not_folder 1 "-o m.kl: exists and is not a folder" -- "$kiln" compile m.kl --emit=cu -o m.kl
# progress on stderr once a compile has taken KILN_PROGRESS_AFTER seconds
# (default 1): every phase, NVRTC per architecture
expect compile_progress 0 "kiln: \[[0-9.]+ s\] NVRTC: compute_100 of" -- \
  env KILN_PROGRESS_AFTER=0 "$kiln" compile m.kl --emit=exe -o m_progress
# --time: ptxas's report of the kernels NVRTC built, and the PTX's f64 count
expect compile_time_resources 0 "kiln: resources sm_90: 1 kernels, registers at most [0-9]+ \(k0\), 0 spill bytes" -- \
  "$kiln" compile m.kl --emit=cu -o cu_time --time --arch sm_90
printf 'input x: f64[4, 64]\noutput y = softmax(x)\n' > m_f64.kl
expect compile_time_f64_counted 0 "kiln: resources compute_90: [1-9][0-9]* f64 instructions in the PTX" -- \
  "$kiln" compile m_f64.kl --emit=cu -o cu_f64 --time --arch sm_90
expect compile_version 0 "^kiln [0-9]+\.[0-9]+\.[0-9]+ \(CUDA toolkit [0-9]+\.[0-9]+\)" -- "$kiln" --version
expect run_files 0 "output 1 'z': i64\[2\]" -- "$kiln" run --device=interp m.kl --input x=x.npy --input i=i.npy --output-dir out
"${PYTHON:-python3}" -c "
import numpy as np
x = np.arange(6, dtype=np.float32).reshape(2, 3); w = np.ones((3, 4), np.float32)
z = np.load('out/output_1.npy'); assert z.dtype == np.int64 and list(z) == [6, -1], z
y = np.load('out/output_0.npy'); assert y.shape == (2, 4) and y.dtype == np.float32
" && { passed=$((passed + 1)); echo "PASS outputs_readable_by_numpy"; } || { failed=$((failed + 1)); echo "FAIL outputs_readable_by_numpy"; }
expect run_weights 0 "min 3  max 12" -- "$kiln" run --device=interp m.kl --inputs-dir in --weights w.safetensors
expect inputs_dir 0 "output 0 'y'" -- "$kiln" run --device=interp m.kl --inputs-dir in
expect inputs_dir_missing 1 "cannot open|No such file" -- "$kiln" run --device=interp m.kl --inputs-dir nowhere
expect input_missing_file 1 "nope.npy" -- "$kiln" run --device=interp m.kl --input x=nope.npy
expect input_bad_shape 1 "input 'x' must be f32\[2, 3\], the file holds f32\[3, 3\]" -- "$kiln" run --device=interp m.kl --input x=x_bad_shape.npy
expect input_wrong_dtype 1 "input 'x' must be f32\[2, 3\], the file holds f64\[2, 3\]" -- "$kiln" run --device=interp m.kl --input x=x_f64.npy
expect input_fortran 1 "Fortran" -- "$kiln" run --device=interp m.kl --input x=x_fortran.npy
expect input_garbage 1 "garbage.npy" -- "$kiln" run --device=interp m.kl --input x=garbage.npy
expect input_truncated 1 "truncated.npy" -- "$kiln" run --device=interp m.kl --input x=truncated.npy
expect input_unknown_name 1 "no input named 'q'" -- "$kiln" run --device=interp m.kl --input q=x.npy
expect input_no_equals 2 "NAME=FILE" -- "$kiln" run --device=interp m.kl --input x.npy
expect output_dir_unwritable 1 "output-dir" -- "$kiln" run --device=interp m.kl --output-dir /dev/null/sub
expect weights_bad_shape 1 "tensor 'w' is f32\[4, 3\], but the model declares f32\[3, 4\]" -- "$kiln" run --device=interp m.kl --weights w_bad.safetensors
expect weights_unknown_tensor 1 "'nope' is not a param" -- "$kiln" run --device=interp m.kl --weights w_extra.safetensors
expect weights_missing_file 1 "nope.safetensors" -- "$kiln" run --device=interp m.kl --weights nope.safetensors
expect dim_override 0 "x +f32\[5, 3\]" -- "$kiln" inspect m.kl --dim B=5
expect dim_unknown 1 "no dim named 'Q'" -- "$kiln" inspect m.kl --dim Q=5
expect dim_malformed 2 "NAME=VALUE" -- "$kiln" inspect m.kl --dim B
expect device_unknown 2 "choose interp, host, cuda or auto" -- "$kiln" run m.kl --device=tpu
expect device_host 0 "device: host" -- "$kiln" run m.kl --device=host
expect device_auto_falls_back 0 "device: host" -- "$kiln" run m.kl --device=auto
if ! grep -q libcuda.so.1 <<<"$(ldconfig -p 2>/dev/null)"; then
  expect device_cuda_without_driver 1 "no CUDA driver" -- "$kiln" run m.kl --device=cuda
  # no GPU here: cubins for sm_80 (which sm_86/sm_89 cards run too), sm_90
  # and sm_100, and compute_100 PTX
  expect default_archs 0 "^cubin_sm100 cubin_sm80 cubin_sm90 $" -- bash -c \
    "'$kiln' compile m.kl --emit=cu -o cu_default >/dev/null 2>&1 && grep -o 'cubin_sm[0-9]*\\[' cu_default/gpu_images.c | tr -d '[' | sort -u | tr '\\n' ' '"
else
  expect default_archs 0 "" -- true
fi
expect emit_cu 0 "wrote .*kernels.cu" -- "$kiln" compile m.kl --emit=cu -o cu_out
expect emit_cu_needs_o 2 "needs -o" -- "$kiln" compile m.kl --emit=cu
expect inspect_counts 0 "params: 1 tensors, 12 elements, 48 bytes" -- "$kiln" inspect m.kl
expect compile_ir 0 "^let y = relu" -- "$kiln" compile m.kl --emit=ir
expect compile_ir_file 0 "" -- "$kiln" compile m.kl --emit=ir -o m.ir
expect compile_ir_dash_is_stdout 0 "^let y = relu" -- "$kiln" compile m.kl --emit=ir -o -
expect compile_ir_dash_writes_no_file 1 "" -- test -e ./-
expect compile_ir_reparses 0 "^let y = relu" -- "$kiln" compile m.ir --emit=ir
expect compile_no_emit 2 "--emit" -- "$kiln" compile m.kl
expect syntax_error 1 "m_bad.kl:1:9: error" -- bash -c "printf 'input x f32[2]\n' > m_bad.kl; '$kiln' run --device=interp m_bad.kl"
for ex in mlp cnn transformer; do
  expect "example_$ex" 0 "device: interp" -- "$kiln" run --device=interp "$root/examples/$ex.kl"
done

# the memory plan: three numbers, a limit, a picture
tf="$root/examples/transformer.kl"
expect mem_plan_numbers 0 "arena [0-9]+ bytes \(lower bound [0-9]+, naive sum [0-9]+\)" -- \
  "$kiln" compile "$tf" --emit=cu -o tf_out --no-nvrtc
expect mem_limit_fits 0 "wrote .*kernels.cu" -- "$kiln" compile "$tf" --emit=cu -o tf_out --no-nvrtc --mem-limit=1M
expect mem_limit_exceeded 1 "memory limit exceeded: the planned arena takes [0-9]+ bytes.*the limit is 16384 bytes.*at the peak, step [0-9]+ \(node '[^']+'\).*the largest: '[^']+' \([0-9]+ bytes\)" -- \
  "$kiln" compile "$tf" --emit=cu -o tf_out --no-nvrtc --mem-limit=16K
expect mem_limit_run 1 "memory limit exceeded" -- "$kiln" run "$tf" --device=host --mem-limit=16k
expect mem_limit_bad 2 "--mem-limit=12X: give a positive number" -- "$kiln" compile "$tf" --emit=cu -o tf_out --mem-limit=12X
expect mem_limit_zero 2 "--mem-limit=0" -- "$kiln" run "$tf" --device=host --mem-limit=0
expect inspect_memplan 0 "memory plan: arena [0-9]+ bytes, lower bound [0-9]+, naive sum [0-9]+" -- \
  "$kiln" inspect "$tf" --memplan plan.svg
expect inspect_memplan_svg 0 "<title>h1: [0-9]+ bytes at offset" -- cat plan.svg

# fusion: the groups as a picture, and kiln bench's table and JSON
expect inspect_dot 0 "kernels: [0-9]+ \([0-9]+ groups" -- "$kiln" inspect "$root/examples/transformer.kl" --dot t.dot
expect inspect_dot_clusters 0 "subgraph cluster_.*" -- cat t.dot
expect inspect_dot_no_fuse 0 "kernels: " -- "$kiln" inspect "$root/examples/transformer.kl" --dot u.dot --no-fuse
expect dot_no_fuse_no_clusters 1 "" -- grep -q "subgraph" u.dot
expect bench_table 0 "fused/unfused" -- "$kiln" bench "$root/examples/mlp.kl" --iters 2 --device=host
expect bench_json 0 "ok" -- bash -o pipefail -c "'$kiln' bench '$root/examples/mlp.kl' --iters 2 --device=host --json |
  '${PYTHON:-python3}' -c 'import json,sys; d=json.load(sys.stdin); s=d[\"fused\"]
assert set(d) >= {\"model\",\"device\",\"precision\",\"fused\",\"unfused\"}
assert {\"kernels\",\"launches\",\"dram_bytes\",\"arena_bytes\",\"arena_lower_bound\",\"naive_bytes\",\"compile_ms\",\"run_ms\"} <= set(s)
assert s[\"kernels\"] < d[\"unfused\"][\"kernels\"]; print(\"ok\")'"
# the fusion targets, static counts: fused kernels at most a third of
# unfused, estimated DRAM bytes at most half, the arena within 1.10 of its
# lower bound -- on the transformer example and the ResNet-style cnn
for ex in transformer cnn; do
  expect "fusion_targets_$ex" 0 "ok" -- bash -o pipefail -c "'$kiln' bench '$root/examples/$ex.kl' --iters 1 --device=host --json |
    '${PYTHON:-python3}' -c 'import json,sys; d=json.load(sys.stdin); f, u = d[\"fused\"], d[\"unfused\"]
assert 3 * f[\"kernels\"] <= u[\"kernels\"], (f, u)
assert 2 * f[\"dram_bytes\"] <= u[\"dram_bytes\"], (f, u)
assert f[\"arena_bytes\"] <= 1.10 * f[\"arena_lower_bound\"], f; print(\"ok\")'"
done
# attention is one kernel; a short GEMM takes the GELU after it
expect profile_attention 0 "attention: matmul_2 \.\. heads .*fused 3: matmul_5 \.\. gelu_1" -- \
  bash -o pipefail -c "'$kiln' profile '$root/examples/transformer.kl' --iters 1 --device=host | tr '\n' ' '"
expect bench_bad_iters 2 "--iters takes" -- "$kiln" bench "$root/examples/mlp.kl" --iters 0

# the profiler: a step per kernel or GEMM call; their bytes and launches add
# up to what kiln bench counts for the whole model, fused and unfused
for fuse in "" --no-fuse; do
  side=$([ -z "$fuse" ] && echo fused || echo unfused)
  expect "profile_json$fuse" 0 "ok" -- bash -c "'$kiln' profile '$root/examples/transformer.kl' --iters 2 --device=host --json $fuse > prof.json &&
    '$kiln' bench '$root/examples/transformer.kl' --iters 1 --device=host --json > bench.json &&
    '${PYTHON:-python3}' -c 'import json; p=json.load(open(\"prof.json\")); b=json.load(open(\"bench.json\"))[\"$side\"]
assert p[\"copy_gbps\"] > 0 and all(s[\"ms\"] >= 0 for s in p[\"steps\"])
assert sum(s[\"bytes\"] for s in p[\"steps\"]) == b[\"dram_bytes\"], (p[\"total\"], b)
assert sum(s[\"launches\"] for s in p[\"steps\"]) == b[\"launches\"], (p[\"total\"], b); print(\"ok\")'"
done
expect profile_table 0 "of copy" -- "$kiln" profile "$root/examples/cnn.kl" --iters 1 --device=host
expect profile_bad_device 2 "--device takes" -- "$kiln" profile "$root/examples/cnn.kl" --device=tpu

# a kiln moved away from its source tree finds runtime/ through
# KILN_RUNTIME_DIR; when the generated code does not compile, the
# compiler's own first lines are in the error (the folder is removed)
cp -r "$root/runtime" rt_copy
expect runtime_dir_env 0 "output 0 'y'" -- env KILN_RUNTIME_DIR="$tmp/rt_copy" "$kiln" run m.kl --device=host
expect runtime_dir_env_exe 0 "wrote" -- env KILN_RUNTIME_DIR="$tmp/rt_copy" "$kiln" compile m.kl --emit=exe -o m_exe --no-nvrtc
expect runtime_dir_env_relative_lib 0 "wrote" -- env KILN_RUNTIME_DIR=rt_copy "$kiln" compile m.kl --emit=lib -o m_lib_rel --no-nvrtc
expect runtime_dir_missing 1 "the runtime's headers are not in .*/nowhere .*set KILN_RUNTIME_DIR" -- \
  env KILN_RUNTIME_DIR="$tmp/nowhere" "$kiln" run m.kl --device=host
expect runtime_dir_missing_lib 1 "the runtime's headers are not in .*/nowhere .*set KILN_RUNTIME_DIR" -- \
  env KILN_RUNTIME_DIR="$tmp/nowhere" "$kiln" compile m.kl --emit=lib -o m_lib --no-nvrtc

# --dump-after: every pass in the pipeline's order, each what it decided
"$kiln" compile "$root/examples/transformer.kl" --emit=cu -o dump_out --no-nvrtc --dump-after=all \
  >dump_all.txt 2>dump_all.err
order=$(grep -oP '^# ---- after \K\w+' dump_all.txt | tr '\n' ' ')
expect dump_after_all_order 0 "^bnfold precision schedule fold fuse memory $" -- echo "$order"
expect dump_after_fold 0 "causal = gt -> bool\[16, 16\]: folded into the weights" -- cat dump_all.txt
expect dump_after_fuse_attention 0 "attention: heads <- matmul_2" -- cat dump_all.txt
expect dump_after_fuse_epilogue 0 "gemm: h <- matmul_4, bias b_o, residual x" -- cat dump_all.txt
expect dump_after_memory 0 "merged: no kernel, its input transpose_4.s buffer" -- \
  "$kiln" compile "$root/examples/transformer.kl" --emit=cu -o dump_out2 --no-nvrtc --dump-after=memory
expect dump_after_one 0 "^# ---- after fold$" -- \
  "$kiln" compile "$root/examples/transformer.kl" --emit=cu -o dump_out3 --no-nvrtc --dump-after=fold
# bnfold: the cnn example's batch norms fold into their convolutions
expect dump_after_bnfold 0 "batch_norm_1 = batch_norm: folded into s0 \(conv2d\): weight stem_w_bn" -- \
  "$kiln" compile "$root/examples/cnn.kl" --emit=cu -o dump_out4 --no-nvrtc --dump-after=bnfold
expect dump_after_bnfold_none 0 "\(no batch_norm\)" -- \
  "$kiln" compile "$root/examples/transformer.kl" --emit=ir --dump-after=bnfold
expect dump_after_bad 2 "--dump-after=fusion: choose bnfold, precision" -- \
  "$kiln" compile "$root/examples/transformer.kl" --emit=ir --dump-after=fusion

# ONNX models as exporters write them: a -1 input dim, Slice ends of
# INT64_MAX, names with dots, an Identity output, a file not named .onnx
if "${PYTHON:-python3}" -c "import onnx" 2>/dev/null; then
"${PYTHON:-python3}" - <<'PY'
import numpy as np, onnx
from onnx import TensorProto as T, helper, numpy_helper
big = np.iinfo(np.int64).max
c = lambda name, a: helper.make_node("Constant", [], [name], name="const_" + name,
                                     value=numpy_helper.from_array(np.array(a, np.int64)))
nodes = [c("starts", [1]), c("ends", [big]), c("axes", [1]),
         helper.make_node("Slice", ["input.1", "starts", "ends", "axes"], ["s"], name="Slice_7"),
         helper.make_node("MatMul", ["s", "w"], ["h"], name="MatMul_8"),
         helper.make_node("Sigmoid", ["h"], ["sigmoid_0.tmp_0"], name="sigmoid_0"),
         helper.make_node("Identity", ["s"], ["ident.out"], name="Identity_9")]
w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((3, 300)).astype(np.float32), "w")
g = helper.make_graph(nodes, "wild", [helper.make_tensor_value_info("input.1", T.FLOAT, [-1, 4])],
                      [helper.make_tensor_value_info("sigmoid_0.tmp_0", T.FLOAT, [-1, 300]),
                       helper.make_tensor_value_info("ident.out", T.FLOAT, [-1, 3])], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
onnx.checker.check_model(m)
onnx.save(m, "wild.onnx")
onnx.save(m, "wild.bin")
np.save("wild_x.npy", np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32))
PY
cp wild.onnx wild_onnx.kl
expect wild_unbound 1 "input 'input.1' is declared f32\[input.1_dim0, 4\], with symbolic dims: bind them with --shape input.1=d0,d1,... or --dim input.1_dim0=N" -- "$kiln" run --device=interp wild.onnx
expect wild_inspect_unbound 0 "input.1 +f32\[input.1_dim0, 4\].*sigmoid_0.tmp_0 +f32\[\?, 300\].*--shape input.1=1,4.*--dim input.1_dim0=1" -- \
  bash -o pipefail -c "'$kiln' inspect wild.onnx | tr '\n' ' '"
expect wild_inspect_bound 0 "sigmoid_0.tmp_0 +f32\[2, 300\]" -- "$kiln" inspect wild.onnx --dim input.1_dim0=2
expect wild_shape_names_in_summary 0 "output 0 'sigmoid_0.tmp_0': f32\[2, 300\].*output 1 'ident.out': f32\[2, 3\]" -- \
  bash -o pipefail -c "'$kiln' run --device=interp wild.onnx --shape input.1=2,4 --input input.1=wild_x.npy | tr '\n' ' '"
expect wild_dim_host 0 "output 0 'sigmoid_0.tmp_0': f32\[2, 300\]" -- "$kiln" run wild.onnx --dim input.1_dim0=2 --device=host
expect wild_from_inputs 0 "output 1 'ident.out': f32\[2, 3\]" -- "$kiln" run wild.onnx --input input.1=wild_x.npy --device=host
expect wild_bin_detected 0 "output 1 'ident.out'" -- "$kiln" run --device=interp wild.bin --shape input.1=2,4
printf 'input x: f32[2]\x01\noutput y = x\n' > stray.kl
expect stray_control_char_note 1 "not an ONNX model.*note: stray.kl was read as ONNX because" -- \
  bash -o pipefail -c "'$kiln' run --device=interp stray.kl 2>&1 | tr '\n' ' '"
expect wild_onnx_named_kl 0 "output 1 'ident.out'" -- "$kiln" run --device=interp wild_onnx.kl --dim input.1_dim0=2
expect wild_shape_unknown_input 1 "--shape y: the model has no input named 'y'; its inputs: input.1 f32\[input.1_dim0, 4\]" -- \
  "$kiln" run --device=interp wild.onnx --shape y=2,4
expect wild_shape_bad_dim 1 "--shape input.1=2,5: dim 1 is 5, but the model declares input.1 f32\[input.1_dim0, 4\]" -- \
  "$kiln" run --device=interp wild.onnx --shape input.1=2,5
expect wild_shape_bad_rank 1 "--shape input.1=8: rank 1, but the model declares input.1 f32\[input.1_dim0, 4\] \(rank 2\)" -- \
  "$kiln" inspect wild.onnx --shape input.1=8
expect wild_dim_unknown 1 "--dim Q: no input has a symbolic dim named 'Q'; the model's inputs: input.1" -- \
  "$kiln" run --device=interp wild.onnx --dim Q=3
expect wild_model_h 0 "#define wild_OUTPUT_sigmoid_0_tmp_0 0 /\* sigmoid_0.tmp_0 \*/ #define wild_OUTPUT_ident_out 1 /\* ident.out \*/ #define wild_NAMES_OF_OUTPUTS \{\"sigmoid_0.tmp_0\", \"ident.out\"\}" -- \
  bash -c "'$kiln' compile wild.onnx --dim input.1_dim0=2 --emit=cu --no-nvrtc -o wild_cu >/dev/null 2>&1 && tr '\n' ' ' < wild_cu/wild.h"
expect wild_io_table 0 "\{\"sigmoid_0.tmp_0\", \(krt_dtype\)0, 2, \{2, 300\}\}" -- cat wild_cu/model.c
# --emit=ir round trip: the 900-value weight goes to a side file the text loads
expect wild_ir_needs_o 2 "1 constants \(3600 bytes\) are too large to print; give -o FILE.kl" -- \
  "$kiln" compile wild.onnx --dim input.1_dim0=2 --emit=ir
expect wild_ir_file 0 "wrote wild_ir.kl, and 1 constants \(3600 bytes\) to wild_ir.safetensors" -- \
  "$kiln" compile wild.onnx --dim input.1_dim0=2 --emit=ir -o wild_ir.kl
expect wild_ir_loads 0 "param w: f32\[3, 300\] = load\(\"wild_ir.safetensors\", key=\"w\"\)" -- cat wild_ir.kl
expect wild_ir_reparses 0 "wrote wild_ir2.kl, and 1 constants" -- "$kiln" compile wild_ir.kl --emit=ir -o wild_ir2.kl
expect wild_ir_fixpoint 0 "^fixpoint$" -- bash -c "sed s/wild_ir2.safetensors/wild_ir.safetensors/ wild_ir2.kl | cmp - wild_ir.kl && cmp wild_ir.safetensors wild_ir2.safetensors && echo fixpoint"
printf 'input x: f32[2, 3]\nparam w: f32[3, 4] = load("w.safetensors")\noutput y = x @ w\n' > wl.kl
expect kl_ir_small_load_inlined 0 "^param w: f32\[3, 4\] = values\(\[1, 1," -- \
  bash -c "'$kiln' compile wl.kl --emit=ir -o wl_ir.kl && grep '^param' wl_ir.kl"
expect wild_ir_same_outputs 0 "same" -- bash -c "
  '$kiln' run --device=interp wild.onnx --input input.1=wild_x.npy --output-dir wild_out_onnx >/dev/null 2>&1 &&
  (cd /tmp && '$kiln' run --device=interp '$tmp/wild_ir.kl' --input input_1='$tmp/wild_x.npy' --output-dir '$tmp/wild_out_ir') >/dev/null 2>&1 &&
  '${PYTHON:-python3}' -c 'import numpy as np
for k in (0, 1):
    a, b = np.load(f\"wild_out_onnx/output_{k}.npy\"), np.load(f\"wild_out_ir/output_{k}.npy\")
    assert a.shape == b.shape and np.array_equal(a, b), k
print(\"same\")'"
else
  failed=$((failed + 1))
  echo "FAIL wild ONNX models: the python at hand has no onnx (scripts/setup.sh installs it)"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
