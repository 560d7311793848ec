#!/usr/bin/env python3
"""Every generated kernels.cu must compile under NVRTC for sm_90 with no
warnings: `kiln compile --emit=cu --arch sm_90 --Werror` over the examples
and every NumPy reference case.  A case with run-time arguments or an
expected error is skipped (the reference suites compile and run it); a
model kiln cannot compile, and a machine without NVRTC, are failures.  CI
has NVRTC but no GPU, which is all this needs.

usage: check_nvrtc.py KILN CASES_DIR [-j N]"""
import concurrent.futures
import glob
import os
import subprocess
import sys
import tempfile

kiln, cases = sys.argv[1], sys.argv[2]
jobs = int(sys.argv[sys.argv.index("-j") + 1]) if "-j" in sys.argv else (os.cpu_count() or 1)
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
models = sorted(glob.glob(os.path.join(root, "examples", "*.kl")) +
                glob.glob(os.path.join(cases, "*", "model.kl")))


def check(model):
    case = os.path.dirname(model)
    # cases that need run-time arguments or must fail are checked elsewhere
    elsewhere = [f for f in ("args.json", "expect_error.txt") if os.path.exists(os.path.join(case, f))]
    if elsewhere:
        return None, "checked by the reference suite (%s)" % ", ".join(elsewhere)
    with tempfile.TemporaryDirectory(prefix="kiln-nvrtc-") as out:
        p = subprocess.run([kiln, "compile", model, "--emit=cu", "-o", out, "--arch", "sm_90",
                            "--Werror"], capture_output=True, text=True, timeout=300)
        err = p.stderr
        if "NVRTC not found" in err:
            return False, "NVRTC not found: this test needs the CUDA toolkit's NVRTC (" + err.strip()[:300] + ")"
        if p.returncode != 0 or "warning" in err.lower() or "Sanitizer" in err:
            return False, err.strip()[:600]
        if "(0 kernels)" not in err and not os.path.exists(os.path.join(out, "gpu_images.c")):
            return False, "no gpu_images.c written"
        return True, ""


npass = nfail = nskip = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
    for model, (ok, why) in zip(models, ex.map(check, models)):
        name = os.path.relpath(model, root if model.startswith(root) else cases)
        if ok:
            npass += 1
        elif ok is None:
            nskip += 1
            print(f"SKIP {name}: {why}")
        else:
            nfail += 1
            print(f"FAIL {name}: {why}")
print(f"{npass} passed, {nfail} failed, {nskip} skipped")
sys.exit(1 if nfail else 0)
