#!/usr/bin/env bash
# The artifacts of `kiln compile`: the standalone program (--emit=exe) and
# the static library (--emit=lib), checked against the interpreter, and the
# run-time errors a user meets with bad inputs.  Usage: test_artifacts.sh KILN
set -uo pipefail
kiln=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
passed=0 failed=0
onnx_data=/usr/share/libonnx-testdata/data/node

ok() { passed=$((passed + 1)); echo "PASS $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/  /' <<<"$2" | head -12; }

. "$here/expect.sh"

# same NAME A.npy B.npy: equal at 1e-5 relative (NumPy decides)
same() {
  local out
  if out=$("$py" -c '
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
' "$2" "$3" 2>&1); then ok "$1"; else bad "$1" "$out"; fi
}

"$py" - <<'PY'
import numpy as np
rng = np.random.default_rng(7)
np.save("x.npy", rng.standard_normal((32, 784), dtype=np.float32))
np.save("labels.npy", rng.integers(0, 10, 32))
np.save("x_short.npy", rng.standard_normal((32, 783), dtype=np.float32))
np.save("x_f64.npy", rng.standard_normal((32, 784)))
open("garbage.npy", "wb").write(b"\x93NUMPY\x01\x00garbage")
open("garbage.pb", "wb").write(b"\xff\xff\xff\xff")
# a TensorProto by hand (no onnx needed): dims 2, FLOAT, raw_data 1.5, -2
open("pair.pb", "wb").write(b"\x08\x02\x10\x01\x4a\x08" + np.array([1.5, -2], "<f4").tobytes())
import os
os.makedirs("npy_and_pb", exist_ok=True)  # an inputs dir with both kinds
np.save("npy_and_pb/input_0.npy", np.load("x.npy"))
np.save("npy_and_pb/input_1.npy", np.load("labels.npy"))
open("npy_and_pb/input_0.pb", "wb").write(b"\xff\xff\xff\xff")
os.makedirs("pb_only", exist_ok=True)
open("pb_only/input_0.pb", "wb").write(b"\xff\xff\xff\xff")
PY

# needs_protobuf NAME FILE yes|no: whether FILE (a program or a shared
# object) loads libprotobuf-c; only a program that reads .pb files should.
needs_protobuf() {
  local deps
  deps=$(readelf -d "$2" 2>&1 | grep NEEDED)
  if grep -q "libprotobuf-c" <<<"$deps"; then [ "$3" = yes ]; else [ "$3" = no ]; fi &&
    ok "$1" || bad "$1" "$deps"
}

# ---- the standalone program -----------------------------------------------
expect exe_builds 0 "wrote .*mlp_exe" -- "$kiln" compile "$root/examples/mlp.kl" --emit=exe -o mlp_exe
expect exe_needs_o 2 "needs -o PROGRAM" -- "$kiln" compile "$root/examples/mlp.kl" --emit=exe
expect exe_help 0 "0 x: f32\[32,784\]" -- ./mlp_exe --help
expect exe_runs 0 "median: [0-9.]+ ms per run \(3 runs\)" -- \
  ./mlp_exe --input x=x.npy --input labels=labels.npy --iters 3
expect exe_summary 0 "probs: f32\[32,10\]  min" -- ./mlp_exe --input x=x.npy --input labels=labels.npy
expect exe_writes 0 "device: " -- ./mlp_exe --input x=x.npy --input labels=labels.npy --output-dir out
expect interp_writes 0 "device: interp" -- \
  "$kiln" run "$root/examples/mlp.kl" --device=interp --input x=x.npy --input labels=labels.npy --output-dir ref
same exe_matches_interpreter out/output_0.npy ref/output_0.npy

# No driver needed to start: libcuda is loaded at run time, never linked.
if grep -qE "libcuda|libcudart|libcublas" <<<"$(ldd ./mlp_exe)"; then
  bad exe_links_no_cuda "$(ldd ./mlp_exe)"
else
  ok exe_links_no_cuda
fi
if ! grep -q "libcuda.so.1" <<<"$(ldconfig -p 2>/dev/null)"; then
  expect exe_auto_without_driver 0 "device: host" -- ./mlp_exe --input x=x.npy --input labels=labels.npy
  expect exe_cuda_without_driver 1 "no CUDA driver" -- \
    ./mlp_exe --input x=x.npy --input labels=labels.npy --device cuda
  expect exe_env_device 1 "no CUDA driver" -- \
    env KILN_DEVICE=cuda ./mlp_exe --input x=x.npy --input labels=labels.npy
fi
expect exe_host_device 0 "device: host" -- ./mlp_exe --input x=x.npy --input labels=labels.npy --device host

# The profiler's Chrome trace: --profile of a program, KILN_PROFILE of the
# generated create/run/destroy (a library's); its kernel events are the
# generated code's kernel launches and library calls one to one
# (check_trace.py, against model.c)
"$kiln" compile "$root/examples/mlp.kl" --emit=cu --no-nvrtc -o mlp_cu >/dev/null 2>&1
expect exe_profile 0 "wrote the trace mlp_trace.json" -- ./mlp_exe --device host --iters 2 --profile mlp_trace.json
if out=$("$py" "$here/check_trace.py" mlp_trace.json mlp_cu/model.c 2 2>&1); then ok trace_matches_steps
else bad trace_matches_steps "$out"; fi
expect lib_profile_env 0 "profile of 'mlp'" -- env KILN_PROFILE=lib_trace.json ./mlp_exe --device host
if out=$("$py" "$here/check_trace.py" lib_trace.json mlp_cu/model.c 1 2>&1); then ok trace_from_kiln_profile_env
else bad trace_from_kiln_profile_env "$out"; fi

# a node of two kernels (cross_entropy: the per-item losses, then their
# mean) is two events, one per kernel
printf 'input x: f32[8, 10]\ninput t: i64[8]\noutput loss = cross_entropy(x, t)\n' > ce.kl
"$kiln" compile ce.kl --emit=cu --no-nvrtc -o ce_cu >/dev/null 2>&1
expect ce_exe 0 "wrote ce_exe" -- "$kiln" compile ce.kl --emit=exe --no-nvrtc -o ce_exe
expect ce_profile 0 "wrote the trace ce_trace.json" -- ./ce_exe --device host --profile ce_trace.json
if out=$("$py" "$here/check_trace.py" ce_trace.json ce_cu/model.c 1 2>&1) && grep -q "one event per kernel or library call (2)" <<<"$out"
then ok trace_two_kernels_two_events
else bad trace_two_kernels_two_events "$out"; fi

# Bad input at run time: a clear message and a non-zero exit.
expect exe_missing_file 1 "input 'x': nothere.npy: No such file" -- \
  ./mlp_exe --input x=nothere.npy --input labels=labels.npy
# an input not given: seeded random values, said on stderr, the same as kiln
# run draws for the same seed (input K from seed S + K)
expect exe_random_input 0 "input 'labels' not given: using seeded random values \(i64\[32\], seed 8\)" -- \
  ./mlp_exe --input x=x.npy --seed 7 --device host
expect exe_bad_seed 2 "--seed takes a non-negative integer" -- ./mlp_exe --seed -1
if ./mlp_exe --seed 5 --device host --output-dir rnd_exe >/dev/null 2>&1 &&
   "$kiln" run "$root/examples/mlp.kl" --seed 5 --device=interp --output-dir rnd_run >/dev/null 2>&1 &&
   "$py" -c 'import numpy as np, sys
a, b = np.load("rnd_exe/output_0.npy"), np.load("rnd_run/output_0.npy")
sys.exit(0 if a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-6) else 1)'; then
  passed=$((passed + 1)); echo "PASS exe_random_matches_kiln_run"
else bad exe_random_matches_kiln_run "the program's random inputs differ from kiln run's"; fi
expect exe_misshapen 1 "input 'x' must be f32\[32,784\], the file holds f32\[32,783\]" -- \
  ./mlp_exe --input x=x_short.npy --input labels=labels.npy
expect exe_wrong_dtype 1 "input 'x' must be f32\[32,784\], the file holds f64\[32,784\]" -- \
  ./mlp_exe --input x=x_f64.npy --input labels=labels.npy
expect exe_garbage_npy 1 "input 'x': garbage.npy: " -- ./mlp_exe --input x=garbage.npy --input labels=labels.npy

# .pb inputs: libkilnrt_pb's, linked only with --pb-inputs; without it a .pb
# input is refused with the ways to read it.
needs_protobuf exe_links_no_protobuf mlp_exe no
expect exe_pb_refused 1 "input 'x': garbage.pb: this program reads .npy inputs only; .*--pb-inputs" -- \
  ./mlp_exe --input x=garbage.pb --input labels=labels.npy
expect exe_pb_dir_refused 1 "pb_only/input_0.pb: this program reads .npy inputs only" -- \
  ./mlp_exe --inputs-dir pb_only
expect exe_dir_takes_npy 0 "device: " -- ./mlp_exe --inputs-dir npy_and_pb
expect exe_help_says_pb 0 "ONNX .pb inputs are not read by this program" -- ./mlp_exe --help
expect exe_pb_builds 0 "wrote .*mlp_pb" -- \
  "$kiln" compile "$root/examples/mlp.kl" --emit=exe --pb-inputs -o mlp_pb
needs_protobuf exe_pb_links_protobuf mlp_pb yes
expect exe_garbage_pb 1 "input 'x': garbage.pb: not an ONNX TensorProto" -- \
  ./mlp_pb --input x=garbage.pb --input labels=labels.npy
expect exe_pb_dir_takes_pb 1 "npy_and_pb/input_0.pb: not an ONNX TensorProto" -- \
  ./mlp_pb --inputs-dir npy_and_pb
expect exe_pb_reads_npy 0 "device: " -- ./mlp_pb --input x=x.npy --input labels=labels.npy
expect exe_pb_only_exe 2 "--pb-inputs is for --emit=exe" -- \
  "$kiln" compile "$root/examples/mlp.kl" --emit=lib --pb-inputs -o lib_bad
# kiln run's shared object takes the runtime from kiln itself: no protobuf-c
kept=$(KILN_KEEP_BUILD=1 "$kiln" run "$root/examples/mlp.kl" --device=host --input x=x.npy \
  --input labels=labels.npy 2>&1 | sed -n 's/^kiln: build folder kept: //p')
if [ -f "$kept/model.so" ]; then needs_protobuf run_so_links_no_protobuf "$kept/model.so" no
else bad run_so_links_no_protobuf "no model.so kept ($kept)"; fi
[ -n "$kept" ] && rm -rf "$kept"
expect exe_unwritable_output 1 "--output-dir x.npy/out: Not a directory" -- \
  ./mlp_exe --input x=x.npy --input labels=labels.npy --output-dir x.npy/out
expect exe_output_is_file 1 "--output-dir x.npy: not a directory" -- \
  ./mlp_exe --input x=x.npy --input labels=labels.npy --output-dir x.npy
expect exe_unknown_input 2 "no input named 'y'" -- ./mlp_exe --input y=x.npy
expect exe_bad_iters 2 "--iters takes a count" -- ./mlp_exe --iters 0
expect exe_bad_device 2 "--device takes auto, host or cuda" -- ./mlp_exe --device tpu
expect exe_stray_argument 2 "unexpected argument" -- ./mlp_exe extra

# An ONNX model fed the .pb files of its own test data.
if [ -d "$onnx_data/test_conv_with_strides_padding" ]; then
  t=$onnx_data/test_conv_with_strides_padding
  expect exe_onnx_builds 0 "wrote" -- "$kiln" compile "$t/model.onnx" --emit=exe --pb-inputs -o conv_exe
  expect exe_onnx_runs 0 "device: " -- ./conv_exe --inputs-dir "$t/test_data_set_0" --output-dir conv_out
  if out=$("$py" -c '
import sys, numpy as np, onnx.numpy_helper as nh, onnx
want = nh.to_array(onnx.load_tensor(sys.argv[1]))
np.testing.assert_allclose(np.load(sys.argv[2]), want, rtol=1e-5, atol=1e-6)
' "$t/test_data_set_0/output_0.pb" conv_out/output_0.npy 2>&1); then ok exe_onnx_matches_test_data
  else bad exe_onnx_matches_test_data "$out"; fi
fi

# ---- the static library ------------------------------------------------------
# Two models in one program: each library keeps its kernels to itself.
expect lib_builds 0 "wrote lib_mlp/" -- "$kiln" compile "$root/examples/mlp.kl" --emit=lib -o lib_mlp
expect lib_builds_second 0 "wrote lib_cnn/" -- "$kiln" compile "$root/examples/cnn.kl" --emit=lib -o lib_cnn
cat >use.c <<'C'
/* A user's program: run mlp on x.npy and labels.npy, write out.npy; run cnn
 * too, to show that two compiled models link side by side. */
#include <stdio.h>
#include <stdlib.h>
#include "mlp.h" /* each model's header is named for it: cnn.h beside it */
#include "cnn.h"

static int run(const krt_model_api *m, krt_device *dev, const void **in, void **out) {
  void *model;
  char err[1024];
  if (m->create(dev, &model, err, sizeof err) || m->run(model, in, out, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", m->model_name, err);
    return 1;
  }
  m->destroy(model);
  return 0;
}

int main(void) {
  char err[1024];
  krt_device *dev;
  krt_tensor x, labels;
  if (krt_device_open(KRT_DEVICE_HOST, &dev, err, sizeof err) ||
      krt_npy_read("x.npy", &x, err, sizeof err) || krt_npy_read("labels.npy", &labels, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const krt_model_api *mlp = kiln_model_mlp(), *cnn = kiln_model_cnn();
  krt_tensor y = {mlp->outputs[0].dtype, mlp->outputs[0].rank, {0}, NULL};
  for (int d = 0; d < y.rank; d++) y.dims[d] = mlp->outputs[0].dims[d];
  y.data = malloc((size_t)krt_tensor_numel(&y) * krt_dtype_size(y.dtype));
  /* labels feed only the loss: inference may pass NULL for it, not for x */
  const void *in[] = {x.data, NULL}, *no_x[] = {NULL, labels.data};
  void *out[] = {y.data}, *model;
  if (run(mlp, dev, in, out) || krt_npy_write("lib_out.npy", &y, err, sizeof err)) return 1;
  if (mlp->create(dev, &model, err, sizeof err)) return 1;
  if (!mlp->run(model, no_x, out, err, sizeof err)) return 1;
  printf("NULL x: %s\n", err);
  mlp->destroy(model);
  /* cnn on zeros: it only has to run */
  void *cin[8], *cout[8];
  for (int i = 0; i < cnn->ninputs; i++) cin[i] = calloc(1, 64 << 20);
  for (int i = 0; i < cnn->noutputs; i++) cout[i] = calloc(1, 64 << 20);
  if (run(cnn, dev, (const void **)cin, cout)) return 1;
  printf("ran %s and %s with %d + %d bytes of arena\n", mlp->model_name, cnn->model_name,
         (int)mlp_ARENA_BYTES, (int)cnn->arena_bytes);
  for (int i = 0; i < cnn->ninputs; i++) free(cin[i]);
  for (int i = 0; i < cnn->noutputs; i++) free(cout[i]);
  krt_tensor_free(&x);
  krt_tensor_free(&labels);
  krt_tensor_free(&y);
  krt_device_close(dev);
  return 0;
}
C
export PKG_CONFIG_PATH=$tmp/lib_mlp:$tmp/lib_cnn
expect lib_pkg_config 0 "-lkiln_mlp" -- pkg-config --libs kiln_mlp
if grep -q protobuf <<<"$(pkg-config --libs kiln_mlp)"; then
  bad lib_pkg_config_no_protobuf "$(pkg-config --libs kiln_mlp)"
else
  ok lib_pkg_config_no_protobuf
fi
expect lib_links_two_models 0 "" -- bash -c \
  "cc -std=c11 -Wall -Werror use.c \$(pkg-config --cflags kiln_mlp kiln_cnn) \$(pkg-config --libs kiln_mlp kiln_cnn) -o use"
expect lib_runs 0 "ran mlp and cnn" -- ./use
# the folder moves: its .pc names no absolute path (${pcfiledir})
mkdir -p moved && cp -r lib_mlp moved/lib_mlp
expect lib_pc_relocatable 0 "^-I$tmp/moved/lib_mlp" -- env PKG_CONFIG_PATH="$tmp/moved/lib_mlp" pkg-config --cflags kiln_mlp
expect lib_moved_builds 0 "" -- bash -c \
  "cc -std=c11 -Wall -Werror use.c \$(PKG_CONFIG_PATH=moved/lib_mlp:lib_cnn pkg-config --cflags --libs kiln_mlp kiln_cnn) -o use_moved"
expect lib_null_read_input 0 "NULL x: run: input 0 'x' is NULL, and the model reads it" -- ./use
same lib_matches_interpreter lib_out.npy ref/output_0.npy
needs_protobuf lib_links_no_protobuf use no

# A user's program that reads .pb files links kiln_mlp_pb: krt_pb_read.
cat >use_pb.c <<'C'
#include <stdio.h>
#include "kilnrt_pb.h"

int main(int argc, char **argv) {
  char err[1024];
  for (int i = 1; i < argc; i++) {
    krt_tensor t;
    if (krt_pb_read(argv[i], &t, err, sizeof err)) {
      printf("error: %s\n", err);
      continue;
    }
    printf("%s[%lld]: %g %g\n", krt_dtype_name(t.dtype), (long long)t.dims[0],
           ((float *)t.data)[0], ((float *)t.data)[1]);
    krt_tensor_free(&t);
  }
  return 0;
}
C
expect lib_pb_pkg_config 0 "-lkilnrt_pb .*-lprotobuf-c.*-lkiln_mlp -lkilnrt" -- pkg-config --libs kiln_mlp_pb
expect lib_pb_links 0 "" -- bash -c \
  "cc -std=c11 -Wall -Werror use_pb.c \$(pkg-config --cflags --libs kiln_mlp_pb) -o use_pb"
expect lib_pb_reads 0 "f32\[2\]: 1.5 -2" -- ./use_pb pair.pb
expect lib_pb_garbage 0 "error: garbage.pb: not an ONNX TensorProto" -- ./use_pb garbage.pb
needs_protobuf lib_pb_links_protobuf use_pb yes

# ---- a training step as a library -------------------------------------------
# krt_trainer over kiln_model_train_mlp(): steps on a fixed batch lower its
# loss, a checkpoint loaded into a second trainer gives back the params and
# the step count, and that trainer's next step equals the first's.
expect lib_train_builds 0 "wrote lib_train/" -- \
  "$kiln" compile "$root/examples/train_mlp.kl" --train --emit=lib -o lib_train --no-nvrtc
cat >train.c <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "train_mlp.h"

int main(void) {
  char err[1024];
  krt_device *dev;
  krt_trainer *a, *b;
  const krt_model_api *api = kiln_model_train_mlp();
  float x[32 * 64], loss0 = 0, loss = 0, la, lb;
  int64_t y[32];
  for (int i = 0; i < 32 * 64; i++) x[i] = (float)((i * 37) % 101) / 101.0f;
  for (int i = 0; i < 32; i++) y[i] = i % 10;
  if (krt_device_open(KRT_DEVICE_HOST, &dev, err, sizeof err) ||
      krt_trainer_create(api, dev, 100, &a, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  for (int s = 0; s < 30; s++) {
    int applied;
    if (krt_trainer_step(a, x, y, 0, &loss, &applied, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    if (s == 0) loss0 = loss;
  }
  float w1[64 * 128], w1b[64 * 128];
  if (krt_trainer_save(a, "lib_ck.safetensors", 0, 0, 7, err, sizeof err) ||
      krt_trainer_create(api, dev, 100, &b, err, sizeof err) ||
      krt_trainer_load(b, "lib_ck.safetensors", NULL, NULL, NULL, err, sizeof err) ||
      krt_trainer_read(a, "w1", w1, err, sizeof err) || krt_trainer_read(b, "w1", w1b, err, sizeof err) ||
      krt_trainer_step(a, x, y, 0, &la, NULL, err, sizeof err) ||
      krt_trainer_step(b, x, y, 0, &lb, NULL, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int same = !memcmp(w1, w1b, sizeof w1) && la == lb &&
             krt_trainer_step_count(a) == 31 && krt_trainer_step_count(b) == 31;
  printf("loss %.4f -> %.4f, restored %s\n", loss0, loss, same ? "exactly" : "WRONG");
  if (krt_trainer_read(a, "nope", w1, err, sizeof err) == 0) return 1;
  printf("%s\n", err);
  krt_trainer_destroy(a);
  krt_trainer_destroy(b);
  krt_device_close(dev);
  return !(same && loss < loss0 * 0.75f);
}
C
export PKG_CONFIG_PATH=$tmp/lib_train:$PKG_CONFIG_PATH
expect lib_train_links 0 "" -- bash -c \
  "cc -std=c11 -Wall -Werror train.c \$(pkg-config --cflags --libs kiln_train_mlp) -o train_lib"
expect lib_train_runs 0 "restored exactly" -- ./train_lib
expect lib_train_names_missing 0 "no param or state 'nope'" -- ./train_lib

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
