#!/usr/bin/env python3
"""A test whose tool or module is missing fails, naming it (it used to exit
77, which the closing count dropped): the ONNX model suite without onnx,
the precision suite without numpy, and the NVRTC check without NVRTC
(kiln_test_break's KILN_TEST_HIDE_NVRTC).

usage: test_missing_tools.py KILN_TEST_BREAK"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
brk = os.path.abspath(sys.argv[1])
passed = failed = 0


def without(module, script, *args):
    """Run `script` with `module` unimportable (sys.modules[module] = None
    makes `import module` raise ImportError)."""
    code = ("import runpy, sys; sys.modules[%r] = None; sys.argv = %r; sys.path.insert(0, %r); "
            "runpy.run_path(%r, run_name='__main__')"
            % (module, [script] + list(args), os.path.dirname(script), script))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def check(name, p, text):
    global passed, failed
    out = p.stdout + p.stderr
    if p.returncode not in (0, 77) and text in out:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}: exit {p.returncode}, want non-zero (not 77) and {text!r} in:\n{out[-1500:]}")


check("onnx_models_without_onnx",
      without("onnx", os.path.join(TESTS, "onnx_models", "check_models.py"), brk, "--build"),
      "needs the onnx Python package")
check("onnx_models_without_onnxruntime",
      without("onnxruntime", os.path.join(TESTS, "onnx_models", "check_models.py"), brk, "--build"),
      "cannot build the models without onnxruntime")
check("precision_without_numpy",
      without("numpy", os.path.join(TESTS, "precision", "check_precision.py"), brk),
      "needs numpy")
check("bn_fold_without_onnxruntime",
      without("onnxruntime", os.path.join(TESTS, "precision", "check_bn_fold.py"), brk),
      "needs onnxruntime")
with tempfile.TemporaryDirectory(prefix="kiln-missing-") as tmp:
    os.makedirs(os.path.join(tmp, "case"))
    with open(os.path.join(tmp, "case", "model.kl"), "w") as f:
        f.write("input a: f32[4]\noutput y = relu(a)\n")
    env = dict(os.environ, KILN_TEST_HIDE_NVRTC="1")
    check("nvrtc_check_without_nvrtc",
          subprocess.run([sys.executable, os.path.join(TESTS, "codegen", "check_nvrtc.py"), brk, tmp],
                         capture_output=True, text=True, env=env, timeout=600),
          "NVRTC not found: this test needs the CUDA toolkit's NVRTC")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
