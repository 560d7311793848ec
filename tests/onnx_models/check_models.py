#!/usr/bin/env python3
"""check_models.py - run kiln on whole ONNX models, compare with ONNX Runtime.

    python3 tests/onnx_models/check_models.py KILN [OUTDIR] [--build]
                    [--rtol 1e-4] [--atol 1e-5] [-k SUBSTR] [-j JOBS]
                    [--timeout S] [--unsupported-ok]
                    [--against-interp [--interp-rtol 1e-5]]

OUTDIR holds one folder per model (written by build_models.py): model.onnx,
test_data_set_N/input_K.pb and output_K.pb, and optionally args.json (a
list of extra `kiln run` arguments, e.g. --shape for symbolic dims).  With
--build the models are built into OUTDIR first (into a temporary folder
when OUTDIR is omitted).
For each data set it runs

    KILN run model.onnx --inputs-dir test_data_set_N --output-dir TMP [ARGS]

and compares every TMP/output_K.npy with output_K.pb.  Prints `PASS name`
or `FAIL name: reason` per model (for unsupported nodes, the distinct ONNX
ops kiln named), then `N passed, N failed`; exits 1 if any model failed,
or when onnx or onnxruntime is not installed (naming it).  With
--unsupported-ok a model kiln rejects only for unsupported nodes prints
`UNSUPPORTED name: ...` and does not count as failed (for while converters
are still being added; wrong numbers always fail).
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
from check import compare  # noqa: E402 - the NumPy suite's comparison

try:
    import onnx
    from onnx import numpy_helper
except ImportError:
    print("FAIL: this test needs the onnx Python package (scripts/setup.sh installs it)")
    sys.exit(1)

UNSUPPORTED = re.compile(r"^\s+(\S+) \(opset \d+\), node ")


def read_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def count_files(folder, prefix):
    k = 0
    while os.path.exists(os.path.join(folder, "%s_%d.pb" % (prefix, k))):
        k += 1
    return k


def why_failed(code, msg):
    """kiln's error, with an unsupported-node list cut to its distinct ops."""
    lines = msg.splitlines()
    ops = {}
    for line in lines:
        m = UNSUPPORTED.match(line)
        if m:
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    if ops and code == 1:
        more = [ln.strip() for ln in lines if ln.strip().startswith("... and")]
        return "kiln exited %d: unsupported %s%s" % (
            code, ", ".join("%s x%d" % kv for kv in ops.items()),
            " (%s)" % more[0] if more else "")
    return "kiln exited %d: %s" % (code, lines[0] if lines else "")


def run_set(kiln, model, data, extra, args):
    nout = count_files(data, "output")
    if nout == 0:
        return "no output_0.pb in %s" % data
    with tempfile.TemporaryDirectory(prefix="kiln-onnx-") as tmp:
        cmd = [kiln, "run", model, "--inputs-dir", data, "--output-dir", tmp] + extra + args.kiln_arg
        if not any(a.startswith("--device") for a in args.kiln_arg):
            cmd.append("--device=interp")  # the interpreter, unless a device is asked for
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return "timed out after %gs" % args.timeout
        err = p.stderr.decode(errors="replace")
        if "Sanitizer" in err or "runtime error:" in err:
            return "sanitizer report: " + err.strip()[:400]
        if p.returncode != 0:
            return why_failed(p.returncode, err.strip() or
                              p.stdout.decode(errors="replace").strip())
        ref = None
        if args.against_interp:  # also the interpreter, on the same inputs
            ref = os.path.join(tmp, "interp")
            q = subprocess.run([kiln, "run", model, "--inputs-dir", data, "--output-dir", ref,
                                "--device=interp"] + extra, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=args.timeout)
            if q.returncode != 0:
                return "the interpreter failed: " + q.stderr.decode(errors="replace").strip()[:400]
        for k in range(nout):
            got_path = os.path.join(tmp, "output_%d.npy" % k)
            if not os.path.exists(got_path):
                return "output_%d.npy not written" % k
            got = np.load(got_path, allow_pickle=False)
            why = compare(got, read_pb(os.path.join(data, "output_%d.pb" % k)),
                          args.rtol, args.atol)
            if why:
                return "output %d: %s" % (k, why)
            if ref is not None:
                want = np.load(os.path.join(ref, "output_%d.npy" % k), allow_pickle=False)
                why = compare(got, want, args.interp_rtol,
                              args.interp_rtol * float(np.max(np.abs(want), initial=0)))
                if why:
                    return "output %d against the interpreter: %s" % (k, why)
        if os.path.exists(os.path.join(tmp, "output_%d.npy" % nout)):
            return "more outputs than the %d expected" % nout
    return None


def run_model(kiln, folder, args):
    model = os.path.join(folder, "model.onnx")
    sets = sorted(glob.glob(os.path.join(folder, "test_data_set_*")))
    if not sets:
        return "no test_data_set_* folder"
    extra = []
    ap = os.path.join(folder, "args.json")
    if os.path.exists(ap):
        with open(ap) as f:
            extra = json.load(f)
    for data in sets:
        why = run_set(kiln, model, data, extra, args)
        if why:
            return "%s: %s" % (os.path.basename(data), why) if len(sets) > 1 else why
    return None


def check(kiln, outdir, args):
    models = sorted(d for d in glob.glob(os.path.join(outdir, "*"))
                    if os.path.exists(os.path.join(d, "model.onnx"))
                    and args.filter in os.path.basename(d))
    if not models:
        print("no model folders (NAME/model.onnx) in %s" % outdir)
        return 1
    npass = nfail = nskip = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as ex:
        futs = [ex.submit(run_model, kiln, m, args) for m in models]
        for m, fu in zip(models, futs):
            why = fu.result()
            if why is None:
                npass += 1
                print("PASS %s" % os.path.basename(m), flush=True)
            elif args.unsupported_ok and ": unsupported " in why:
                nskip += 1
                print("UNSUPPORTED %s: %s" % (os.path.basename(m), why), flush=True)
            else:
                nfail += 1
                print("FAIL %s: %s" % (os.path.basename(m), why), flush=True)
    print("%d passed, %d failed" % (npass, nfail) +
          (", %d unsupported" % nskip if args.unsupported_ok else ""))
    if nfail:
        return 1
    return 0 if npass else 77  # nothing ran: a skip, not a pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kiln")
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--build", action="store_true",
                    help="build the models into OUTDIR (or a temporary folder) first")
    # The interpreter computes each op in double and rounds to float32;
    # ONNX Runtime accumulates in float32, so the two differ by a few
    # float32 ulps per op, compounded over 20-60 layers.  rtol 1e-4 covers
    # that for outputs of normal size.  atol is for outputs near zero (a
    # logit summing hundreds of O(1) terms that cancel), where float32
    # rounding of the terms leaves 1e-6..1e-5 absolute error that no rtol
    # covers.  Measured: ONNX Runtime against a float64 evaluation of
    # resnet18 uses at most 0.3 of this tolerance, kiln against ONNX
    # Runtime about the same.
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    # Compiled against the interpreter: relative to each element and to the
    # output's largest magnitude (a sum of many terms near zero has error
    # relative to its terms, not to itself).
    ap.add_argument("--against-interp", action="store_true",
                    help="also compare with `kiln run --device=interp`")
    ap.add_argument("--interp-rtol", type=float, default=1e-5)
    ap.add_argument("-k", dest="filter", default="",
                    help="only models whose name contains this")
    ap.add_argument("-j", dest="jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--unsupported-ok", action="store_true",
                    help="models with unsupported nodes are not failures")
    ap.add_argument("--kiln-arg", action="append", default=[],
                    help="extra argument for `kiln run` (repeatable), e.g. --device=host")
    args = ap.parse_args()
    if args.outdir is None and not args.build:
        ap.error("give OUTDIR, --build, or both")
    kiln = os.path.abspath(args.kiln) if os.sep in args.kiln else args.kiln
    if os.sep in kiln and not os.access(kiln, os.X_OK):
        ap.error("%s is not an executable" % kiln)
    if not args.build:
        sys.exit(check(kiln, args.outdir, args))
    try:
        import build_models
    except ImportError as ex:  # onnxruntime missing: nothing to compare with
        print("FAIL: cannot build the models without %s (scripts/setup.sh installs it)" % ex.name)
        sys.exit(1)
    with tempfile.TemporaryDirectory(prefix="kiln-onnx-models-") as tmp:
        outdir = args.outdir or tmp
        build_models.build(outdir, args.filter)
        sys.exit(check(kiln, outdir, args))


if __name__ == "__main__":
    main()
