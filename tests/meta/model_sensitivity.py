#!/usr/bin/env python3
"""The precision suite's weights make the model's blocks count: with them
(check_precision.realistic_weights), the transformer example with its
attention scale 0.25 -> 1.0, or without its second layer norm, gives an
output farther from the original than the precision suite allows even in
bf16 (8 units of roundoff of max|ref|), so a kernel with such a bug fails
the suite.  (With the example's own randn(0.02) weights both changes stay
under 1% and went unseen.)  Runs the fp32 interpreter only.

usage: model_sensitivity.py KILN"""
import importlib.util
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
spec = importlib.util.spec_from_file_location(
    "check_precision", os.path.join(ROOT, "tests", "precision", "check_precision.py"))
cp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cp)

kiln = os.path.abspath(sys.argv[1])
model = os.path.join(ROOT, "examples", "transformer.kl")
src = open(model).read()
variants = {"attention_scale_1": ("* 0.25", "* 1.0"),
            "no_second_layer_norm": ("let h2 = layer_norm(h, ln2_g, ln2_b)", "let h2 = h")}
passed = failed = 0
with tempfile.TemporaryDirectory(prefix="kiln-sensitivity-") as tmp:
    weights = os.path.join(tmp, "w.safetensors")
    why = cp.realistic_weights(model, weights)
    if why:
        sys.exit("FAIL weights: " + why)

    def output(path, name):
        out = os.path.join(tmp, name)
        subprocess.run([kiln, "run", path, "--weights", weights, "--output-dir", out, "--device=interp"],
                       check=True, capture_output=True)
        return np.load(os.path.join(out, "output_0.npy")).astype(np.float64)

    ref = output(model, "ref")
    case = {"name": "transformer", "model": model, "args": []}
    longest, why = cp.reduction_lengths(kiln, case, "bf16", tmp, 300)
    if why:
        sys.exit("FAIL reduction lengths: " + why)
    _, allowed = cp.bound("bf16", float(np.abs(ref).max()), longest)
    for name, (old, new) in variants.items():
        if old not in src:
            sys.exit(f"FAIL {name}: '{old}' is no longer in {model}")
        path = os.path.join(tmp, name + ".kl")
        with open(path, "w") as f:
            f.write(src.replace(old, new))
        diff = float(np.abs(output(path, name) - ref).max())
        ok = diff > 4 * allowed
        passed, failed = passed + ok, failed + (not ok)
        print(f"{'PASS' if ok else 'FAIL'} {name}: max difference {diff:.3g}, "
              f"the bf16 bound {allowed:.3g} (want more than 4x)")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
