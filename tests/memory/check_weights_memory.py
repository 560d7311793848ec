#!/usr/bin/env python3
"""check_weights_memory.py - compiling is bounded by the weights' size.

    python3 tests/memory/check_weights_memory.py KILN [--mb 64] [--slack-mb 100]

Builds with bench/gen_big_weights.py a chain of MatMul+Tanh layers holding
--mb MiB of f32 weights, once as ONNX external data and once embedded in
the .onnx file (the same weights: same seed), and checks:

  - `kiln compile --emit=cu --no-nvrtc --time` peaks (kiln's own max RSS,
    VmHWM) below the weights' size plus --slack-mb MiB, for both
    files and with --precision=fp16; before weights were streamed it took
    four times the weights;
  - weights.bin holds exactly the external data file's bytes (the four
    tensors are contiguous and 256-byte aligned);
  - `kiln run --device=host` (the compiled code) gives NumPy's float64
    result within 1e-4 (|out - ref| <= 1e-4 * (1 + |ref|)).

Exits 1 on any failure, and (naming them) without numpy and onnx.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx  # noqa: F401 - the generator needs it
    from onnx import numpy_helper
except ImportError:
    print("FAIL: this test needs numpy and onnx (scripts/setup.sh installs them)")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
GEN = os.path.normpath(os.path.join(HERE, "..", "..", "bench", "gen_big_weights.py"))


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    out = p.stdout.decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, out))
    return out


def same_bytes(a, b):
    """Compared a few MB at a time: this process's memory is not kiln's, but
    keeping it small keeps the measure honest on a small machine."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 22), fb.read(1 << 22)
            if x != y:
                return False
            if not x:
                return True


def max_rss_mib(log):
    m = re.search(r"time: max RSS ([0-9.]+) MiB", log)
    if not m:
        raise RuntimeError("no max RSS in kiln's --time output:\n" + log)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("--mb", type=int, default=64, help="weights, MiB")
    ap.add_argument("--slack-mb", type=float, default=100)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-wmem-")
    failed = 0

    def check(ok, what):
        nonlocal failed
        print("%s: %s" % ("PASS" if ok else "FAIL", what))
        failed += not ok

    try:
        ext, emb = os.path.join(tmp, "ext"), os.path.join(tmp, "emb")
        run([sys.executable, GEN, ext, "--mb", str(args.mb), "--ref"])
        run([sys.executable, GEN, emb, "--mb", str(args.mb), "--embedded"])
        wfile = os.path.join(ext, "weights.bin")
        wmib = os.path.getsize(wfile) / 2**20
        limit = wmib + args.slack_mb
        cases = (("external data", ext, []), ("embedded", emb, []),
                 ("external data, fp16", ext, ["--precision=fp16"]))
        for k, (name, model, extra) in enumerate(cases):
            out = os.path.join(tmp, "out%d" % k)
            log = run([args.kiln, "compile", os.path.join(model, "model.onnx"), "--emit=cu",
                       "--no-nvrtc", "--time", "-o", out] + extra)
            rss = max_rss_mib(log)
            rate = re.search(r"weights.bin .*, ([0-9]+ MB/s)\)", log)
            check(rss < limit, "compile (%s): max RSS %.1f MiB, limit %.0f (weights %.0f MiB "
                  "+ %.0f); weights.bin at %s" % (name, rss, limit, wmib, args.slack_mb,
                                                 rate.group(1) if rate else "?"))
            if not extra:
                check(same_bytes(os.path.join(out, "weights.bin"), wfile),
                      "compile (%s): weights.bin is the weights, byte for byte" % name)
        data = os.path.join(ext, "test_data_set_0")
        res = os.path.join(tmp, "res")
        run([args.kiln, "run", os.path.join(ext, "model.onnx"), "--device=host",
             "--input", "x=" + os.path.join(data, "input_0.pb"), "--output-dir", res])
        got = np.load(os.path.join(res, "output_0.npy")).astype(np.float64)
        want = numpy_helper.to_array(onnx.load_tensor(os.path.join(data, "output_0.pb")))
        want = want.astype(np.float64)
        err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
        check(got.shape == want.shape and err <= 1e-4,
              "run --device=host: %s, max error %.2g against NumPy" % (got.shape, err))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        check(False, str(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%s" % ("all passed" if not failed else "%d failed" % failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
