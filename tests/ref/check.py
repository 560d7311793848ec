#!/usr/bin/env python3
"""check.py - run Kiln on reference cases and compare with expected outputs.

    python3 tests/ref/check.py KILN CASESDIR [--rtol 1e-5] [--atol 1e-6]
                               [-k SUBSTR] [-j JOBS] [--timeout S]
                               [--kiln-arg ARG]...

CASESDIR holds one folder per case (written by ops_cases.py or
examples_ref.py).  A case folder has the model as model.kl (or a file
model_path.txt naming it, relative to the case folder or absolute),
input_K.npy, expected_K.npy, and optionally weights.safetensors, tol.json
({"rtol": r, "atol": a}: the case's tolerance, used where looser than the
command line's), args.json (a list of extra `kiln run` arguments) and
expect_error.txt (the run must exit with status 1, its message containing
the file's text).  For each case it runs

    KILN run MODEL --inputs-dir CASE --output-dir TMP [--weights W] [ARGS]

and compares every TMP/output_K.npy with CASE/expected_K.npy: same shape,
same dtype, and values equal (bool and integers) or allclose (floats; NaN
passes only where NaN is expected, inf only where the same inf is expected).
Prints `PASS name` or `FAIL name: reason` per case, then `N passed, N failed`;
exits 1 if any case failed.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def model_of(case):
    p = os.path.join(case, "model.kl")
    if os.path.exists(p):
        return p
    q = os.path.join(case, "model_path.txt")
    if os.path.exists(q):
        with open(q) as f:
            path = f.read().strip()
        return path if os.path.isabs(path) else os.path.join(case, path)
    return None


def compare(got, exp, rtol, atol):
    """None when equal enough, else a reason."""
    if got.shape != exp.shape:
        return "shape %s, expected %s" % (list(got.shape), list(exp.shape))
    if got.dtype != exp.dtype:
        return "dtype %s, expected %s" % (got.dtype, exp.dtype)
    if got.size == 0:
        return None
    if exp.dtype.kind in "biu":
        bad = got != exp
        if not bad.any():
            return None
        i = np.unravel_index(np.argmax(bad), bad.shape)
        return "%d of %d elements differ; first at %s: got %s, expected %s" % (
            int(bad.sum()), bad.size, [int(t) for t in i], got[i], exp[i])
    g = got.astype(np.float64)
    e = exp.astype(np.float64)
    nan_g, nan_e = np.isnan(g), np.isnan(e)
    finite = ~nan_g & ~nan_e
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    bad = ~close
    if not bad.any():
        return None
    with np.errstate(invalid="ignore"):
        err = np.where(finite, np.abs(g - e), np.inf)
    err = np.where(bad, err, -1.0)
    i = np.unravel_index(np.argmax(err), err.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(g[i] - e[i]) / np.abs(e[i]) if e[i] != 0 else np.inf
    return ("%d of %d elements differ (rtol %g, atol %g); worst at %s: "
            "got %r, expected %r (abs err %.3g, rel err %.3g)" % (
                int(bad.sum()), bad.size, rtol, atol, [int(t) for t in i], g[i].item(),
                e[i].item(), abs(g[i] - e[i]), rel))


def run_case(kiln, case, args):
    name = os.path.basename(case.rstrip("/"))
    model = model_of(case)
    if model is None:
        return False, "no model.kl or model_path.txt"
    rtol, atol = args.rtol, args.atol
    tp = os.path.join(case, "tol.json")
    if os.path.exists(tp):
        with open(tp) as f:
            t = json.load(f)
        rtol = max(rtol, t.get("rtol", rtol))
        atol = max(atol, t.get("atol", atol))
    expect_error = None
    ep = os.path.join(case, "expect_error.txt")
    if os.path.exists(ep):
        with open(ep) as f:
            expect_error = f.read().strip()
    nexp = 0
    while os.path.exists(os.path.join(case, "expected_%d.npy" % nexp)):
        nexp += 1
    with tempfile.TemporaryDirectory(prefix="kiln-check-") as tmp:
        cmd = [kiln, "run", model, "--inputs-dir", case, "--output-dir", tmp]
        if not any(a.startswith("--device") for a in args.kiln_arg):
            cmd.append("--device=interp")  # the interpreter, unless a device is asked for
        w = os.path.join(case, "weights.safetensors")
        if os.path.exists(w):
            cmd += ["--weights", w]
        ap = os.path.join(case, "args.json")
        if os.path.exists(ap):
            with open(ap) as f:
                cmd += json.load(f)
        cmd += args.kiln_arg
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return False, "timed out after %gs" % args.timeout
        msg = (p.stderr or p.stdout).decode(errors="replace").strip()
        err_text = p.stderr.decode(errors="replace")
        if "Sanitizer" in err_text or "runtime error:" in err_text:
            return False, "sanitizer report: " + err_text.strip()[:400]
        if args.unsupported_ok and p.returncode == 1 and "cannot be compiled yet" in msg:
            return None, "not compiled yet"
        if expect_error is not None:
            if p.returncode != 1:
                return False, "expected exit status 1 (an error%s), got %d" % (
                    " mentioning '%s'" % expect_error if expect_error else "",
                    p.returncode)
            if expect_error not in msg:
                return False, "error message lacks '%s': %s" % (
                    expect_error, msg.splitlines()[0] if msg else "")
            return True, ""
        if p.returncode != 0:
            msg = msg.splitlines()[0] if msg else ""
            return False, "kiln exited %d: %s" % (p.returncode, msg)
        for k in range(nexp):
            op = os.path.join(tmp, "output_%d.npy" % k)
            if not os.path.exists(op):
                return False, "output_%d.npy not written" % k
            try:
                got = np.load(op, allow_pickle=False)
            except Exception as ex:  # noqa: BLE001 - any unreadable file
                return False, "output_%d.npy unreadable: %s" % (k, ex)
            exp = np.load(os.path.join(case, "expected_%d.npy" % k))
            why = compare(got, exp, rtol, atol)
            if why:
                return False, "output %d: %s" % (k, why)
        if os.path.exists(os.path.join(tmp, "output_%d.npy" % nexp)):
            return False, "more outputs than the %d expected" % nexp
    return True, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kiln")
    ap.add_argument("cases")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--atol", type=float, default=1e-6)
    ap.add_argument("-k", dest="filter", default="",
                    help="only cases whose name contains this (or any of A,B,...)")
    ap.add_argument("-j", dest="jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--kiln-arg", action="append", default=[],
                    help="extra argument for `kiln run` (repeatable)")
    ap.add_argument("--unsupported-ok", action="store_true",
                    help="a case kiln cannot compile yet counts as skipped")
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln) if os.sep in args.kiln else args.kiln
    cases = sorted(os.path.join(args.cases, d) for d in os.listdir(args.cases)
                   if os.path.isdir(os.path.join(args.cases, d))
                   and any(k in d for k in args.filter.split(",")))
    npass = nfail = nskip = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as ex:
        futs = [ex.submit(run_case, kiln, c, args) for c in cases]
        for c, fu in zip(cases, futs):
            ok, why = fu.result()
            name = os.path.basename(c)
            if ok:
                npass += 1
                print("PASS %s" % name, flush=True)
            elif ok is None:
                nskip += 1
                print("SKIP %s: %s" % (name, why), flush=True)
            else:
                nfail += 1
                print("FAIL %s: %s" % (name, why), flush=True)
    print("%d passed, %d failed%s" % (npass, nfail,
                                       ", %d skipped" % nskip if nskip else ""))
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
