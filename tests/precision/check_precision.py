#!/usr/bin/env python3
"""check_precision.py - mixed precision against the fp32 interpreter.

    python3 tests/precision/check_precision.py KILN [-k SUBSTR] [-j JOBS]
                    [--no-onnx] [--rtol 1e-2]

For the examples (examples/*.kl) and the whole ONNX models of
tests/onnx_models (built into a temporary folder), runs

    KILN run MODEL --output-dir REF                     (the fp32 oracle)
    KILN run MODEL --precision=P --device=D --output-dir OUT

for P in fp16, bf16 and D in interp, host, and checks every output against
the oracle: same dtype and shape (outputs keep their declared type), no NaN,
and |out - ref| <= t * (|ref| + max|ref|) elementwise, t = 8u + 3 sqrt(K)
2^-24, u the low type's unit roundoff and K the model's longest reduction
(bound(): an absolute floor scaled to the output's magnitude,
so a logit near zero is judged against the size of the logits, not against
itself).  The examples run with weights at a trained model's scales
(realistic_weights(), given to both runs with --weights).

For every model, in fp32, fp16 and bf16, fused and unfused, `kiln inspect
--memplan` must give an arena at most 1.10 times its lower bound.

For the examples it also compiles (--emit=cu --no-nvrtc) in fp32 and in fp16
with --io-precision=fp16 and checks that the weights and the planned arena
are at most 0.55 of fp32's.  Prints PASS/FAIL per run with the measured
error, then `N passed, N failed`; exits 1 on any failure, when nothing
ran, and (naming it) without numpy, or onnx and onnxruntime for the ONNX
models.
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
import zlib

try:
    import numpy as np
except ImportError:
    print("FAIL: this test needs numpy (scripts/setup.sh installs it)")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
sys.path.insert(0, os.path.join(HERE, "..", "onnx_models"))
from check import compare  # noqa: E402 - the NumPy suite's comparison
from ops_cases import write_safetensors  # noqa: E402

# unit roundoff of the low types: the error a single rounding may make
UNIT = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
PARAM = re.compile(r"^param (\w+): f32\[([^\]]*)\] = (\S*)", re.M)

PRECISIONS = ["fp16", "bf16"]
DEVICES = ["interp", "host"]


def run(cmd, timeout):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    err = p.stderr.decode(errors="replace") + p.stdout.decode(errors="replace")
    if "Sanitizer" in err or "runtime error:" in err:
        return None, "sanitizer report: " + err.strip()[:400]
    if p.returncode != 0:
        return None, "kiln exited %d: %s" % (p.returncode, err.strip()[:400])
    return err, None


def outputs(folder):
    out, k = [], 0
    while os.path.exists(os.path.join(folder, "output_%d.npy" % k)):
        out.append(np.load(os.path.join(folder, "output_%d.npy" % k), allow_pickle=False))
        k += 1
    return out


def realistic_weights(model, path):
    """Weights at the scales a trained model has, so that every block
    changes the output (the examples' own initialisations, such as the
    transformer's randn(0.02), leave the residual stream nearly the input,
    where a wrong attention or norm goes unseen): each matrix or kernel
    N(0, 1/fan_in) with fan_in its first dim (2-D, x @ w) or the product of
    the others (conv), each vector its declared ones (norm scales) or
    zeros plus N(0, 0.2^2).  Seeded by the param's name."""
    with open(model) as f:
        text = f.read()
    dims_of = {n: int(v) for n, v in re.findall(r"^dim (\w+) = (\d+)", text, re.M)}
    tensors = {}
    for name, dims, init in PARAM.findall(text):
        shape = tuple(dims_of[d.strip()] if d.strip() in dims_of else int(d)
                      for d in dims.split(",") if d.strip())
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if len(shape) >= 2:
            fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
            w = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
        else:
            w = (1.0 if init.startswith("ones") else 0.0) + 0.2 * rng.standard_normal(shape)
        tensors[name] = w.astype(np.float32)
    if not tensors:
        return "no f32 params declared in %s" % model
    write_safetensors(path, tensors)
    return None


# the ops whose arithmetic sums over a reduction, and the length of one
# output's sum from the operands' shapes (the IR dump's `# T[dims]` notes)
LET = re.compile(r"^let (\w+) = (\w+)\(([^)]*)\)\s*#\s*\w+\[([^\]]*)\]", re.M)
DECL = re.compile(r"^(?:input|param|const) (\w+): \w+\[([^\]]*)\]", re.M)


def reduction_lengths(kiln, case, precision, tmp, timeout):
    """The longest reduction of the model compiled at `precision` (matmul,
    gemm, the convolutions: elements summed per output), from the IR that
    `kiln compile --emit=ir` prints after the passes; or (None, why)."""
    path = os.path.join(tmp, "%s-%s-ir.kl" % (case["name"], precision))
    shape_args = []
    for flag, value in zip(case["args"], case["args"][1:]):
        if flag in ("--shape", "--dim"):
            shape_args += [flag, value]
    _, why = run([kiln, "compile", case["model"], "--emit=ir", "--precision=" + precision,
                  "-o", path] + shape_args, timeout)
    if why:
        return None, why
    with open(path) as f:
        text = f.read()
    dims = {n: [int(d) for d in s.split(",") if d.strip()] for n, s in DECL.findall(text)}
    longest = 1
    for name, op, operands, shape in LET.findall(text):
        dims[name] = [int(d) for d in shape.split(",") if d.strip()]
        args = [a.strip() for a in operands.split(",")]
        a = dims.get(args[0]) if args else None
        b = dims.get(args[1]) if len(args) > 1 else None
        if op == "matmul" and a:
            longest = max(longest, a[-1])
        elif op == "gemm" and a:
            longest = max(longest, a[0] if "trans_a=1" in operands else a[-1])
        elif op in ("conv2d", "deform_conv2d") and b:
            longest = max(longest, int(np.prod(b[1:])))
        elif op == "conv_transpose2d" and b:
            longest = max(longest, int(np.prod(b)) // max(b[1], 1))
        elif op == "conv2d_weight_grad" and a:
            longest = max(longest, int(np.prod(a)) // max(a[1], 1))
    return longest, None


def bound(precision, scale, longest):
    """The error allowed against the fp32 oracle, derived from the low
    type's unit roundoff u and the model's longest reduction K.  Two
    sources:
      - storage: weights, inputs and each stored activation are rounded to
        the low type, u relative each.  Through a model a few of those
        compound (the worst measured is under 3u of max|ref|: mobilenetv2
        in fp16 2.5u, the detector in bf16 2.8u): allowed 8u;
      - accumulation: kernels accumulate in f32, so a sum of K products
        adds about sqrt(K) f32 roundings (the probabilistic bound of
        Higham and Mary), 3 sqrt(K) 2^-24 of the output's scale.  Had a
        kernel accumulated in the low type, the term would be 3 sqrt(K) u
        and the bound would have to grow with K (0.3 at K = 4608 in fp16);
        in f32 it stays under u/40 for every model here.
    Both relative to |ref| and, as an absolute floor, to max|ref| (the
    scale): fp16 3.9e-3, bf16 3.1e-2 plus the accumulation term.  A
    kernel off by 2% fails it (tests/meta/test_mutation.sh)."""
    tol = 8 * UNIT[precision] + 3 * np.sqrt(longest) * 2.0 ** -24
    return tol, tol * scale


def check_run(kiln, case, ref, precision, device, args, tmp, longest):
    """None when every output is close to ref, else the reason; and a note
    with the measured error."""
    out = os.path.join(tmp, "%s-%s-%s" % (case["name"], precision, device))
    cmd = [kiln, "run", case["model"], "--output-dir", out, "--precision=" + precision,
           "--device=" + device] + case["args"]
    _, why = run(cmd, args.timeout)
    if why:
        return why, ""
    got = outputs(out)
    if len(got) != len(ref):
        return "%d outputs, the oracle gives %d" % (len(got), len(ref)), ""
    worst_max = worst_norm = 0.0
    for k, (g, e) in enumerate(zip(got, ref)):
        if g.dtype.kind == "f" and np.isnan(g).any():
            return "output %d has NaN" % k, ""
        scale = float(np.max(np.abs(e.astype(np.float64)))) if e.size else 0.0
        rtol, atol = bound(precision, scale, longest) if args.rtol is None else (args.rtol, args.rtol * scale)
        why = compare(g, e, rtol, atol)
        if why:
            return "output %d: %s" % (k, why), ""
        if e.dtype.kind == "f" and scale > 0:
            d = g.astype(np.float64) - e.astype(np.float64)
            worst_max = max(worst_max, float(np.max(np.abs(d))) / scale)
            worst_norm = max(worst_norm, float(np.linalg.norm(d) / np.linalg.norm(e)))
    return None, "max err %.2e of max|ref|, norm rel err %.2e; longest reduction %d" % (
        worst_max, worst_norm, longest)


def compiled_bytes(kiln, model, extra, tmp, args):
    """(arena, weights) bytes that `kiln compile --emit=cu` reports."""
    out = tempfile.mkdtemp(dir=tmp)
    err, why = run([kiln, "compile", model, "--emit=cu", "-o", out, "--no-nvrtc"] + extra,
                   args.timeout)
    if why:
        return None, why
    arena = re.search(r"arena (\d+) bytes", err)
    weights = re.search(r"weights (\d+) bytes", err)
    if not arena or not weights:
        return None, "no arena/weights sizes in: " + err.strip()
    return (int(arena.group(1)), int(weights.group(1))), None


def check_bytes(kiln, case, args, tmp):
    fp32, why = compiled_bytes(kiln, case["model"], [], tmp, args)
    if not why:
        fp16, why = compiled_bytes(kiln, case["model"],
                                   ["--precision=fp16", "--io-precision=fp16"], tmp, args)
    if why:
        return why, ""
    note = "arena %d -> %d bytes, weights %d -> %d bytes" % (fp32[0], fp16[0], fp32[1], fp16[1])
    if fp16[0] > 0.55 * fp32[0] or fp16[1] > 0.55 * fp32[1]:
        return "fp16 should about halve them: " + note, ""
    return None, note


def check_plan(kiln, case, precision, args, tmp):
    """The memory plan of every model in every precision, fused and
    unfused: the arena within 1.10 of its lower bound (the issue's target;
    the checker inside kiln has already verified that no two live buffers
    overlap)."""
    notes = []
    # kiln run's arguments but its input files (--inputs-dir FOLDER)
    shape_args = list(case["args"])
    if "--inputs-dir" in shape_args:
        k = shape_args.index("--inputs-dir")
        del shape_args[k:k + 2]
    for fuse in ([], ["--no-fuse"]):
        svg = tempfile.mktemp(suffix=".svg", dir=tmp)
        err, why = run([kiln, "inspect", case["model"], "--memplan", svg,
                        "--precision=" + precision] + fuse + shape_args, args.timeout)
        if why:
            return why, ""
        m = re.search(r"arena (\d+) bytes, lower bound (\d+)", err)
        if not m:
            return "no arena / lower bound in kiln inspect's output", ""
        arena, bound = int(m.group(1)), int(m.group(2))
        notes.append("%s %d / %d" % ("unfused" if fuse else "fused", arena, bound))
        if arena > 1.10 * bound:
            return "arena %d is more than 1.10 x its lower bound %d%s" % (
                arena, bound, " (unfused)" if fuse else ""), ""
    return None, "arena / lower bound: " + ", ".join(notes)


def check_case(kiln, case, args, tmp, ex):
    """(label, why, note) for each check of one model."""
    ref_dir = os.path.join(tmp, case["name"] + "-ref")
    _, why = run([kiln, "run", case["model"], "--output-dir", ref_dir, "--device=interp"] + case["args"],
                 args.timeout)
    if why:
        return [(case["name"] + " fp32 oracle", why, "")]
    ref = outputs(ref_dir)
    for k, e in enumerate(ref):
        if e.dtype.kind == "f" and np.isnan(e).any():
            return [(case["name"] + " fp32 oracle", "output %d has NaN" % k, "")]
    jobs = []
    for p in PRECISIONS:
        longest, why = reduction_lengths(kiln, case, p, tmp, args.timeout)
        if why:
            return [("%s %s reduction lengths" % (case["name"], p), why, "")]
        jobs += [("%s %s %s" % (case["name"], p, d),
                  ex.submit(check_run, kiln, case, ref, p, d, args, tmp, longest))
                 for d in DEVICES]
    if case["kl"]:
        jobs.append((case["name"] + " fp16 bytes", ex.submit(check_bytes, kiln, case, args, tmp)))
    jobs += [("%s %s plan" % (case["name"], p), ex.submit(check_plan, kiln, case, p, args, tmp))
             for p in ["fp32"] + PRECISIONS]
    return [(label, *fu.result()) for label, fu in jobs]


def onnx_cases(tmp, filt):
    try:
        import build_models
    except ImportError as e:  # the ONNX models are half of what this judges
        print("FAIL: the ONNX models need %s (scripts/setup.sh installs it)" % e.name)
        sys.exit(1)
    outdir = os.path.join(tmp, "onnx")
    build_models.build(outdir, filt)
    cases = []
    for folder in sorted(glob.glob(os.path.join(outdir, "*"))):
        model = os.path.join(folder, "model.onnx")
        if not os.path.exists(model):
            continue
        extra = []
        if os.path.exists(os.path.join(folder, "args.json")):
            with open(os.path.join(folder, "args.json")) as f:
                extra = json.load(f)
        cases.append({"name": os.path.basename(folder), "model": model, "kl": False,
                      "args": ["--inputs-dir", os.path.join(folder, "test_data_set_0")] + extra})
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kiln")
    ap.add_argument("-k", dest="filter", default="", help="only models whose name contains this")
    ap.add_argument("-j", dest="jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--no-onnx", action="store_true", help="the examples only")
    ap.add_argument("--rtol", type=float, default=None,
                    help="instead of the bound derived from the low type's unit roundoff")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    kiln = os.path.abspath(args.kiln)
    with tempfile.TemporaryDirectory(prefix="kiln-precision-") as tmp:
        cases = []
        for m in sorted(glob.glob(os.path.join(ROOT, "examples", "*.kl"))):
            name = os.path.splitext(os.path.basename(m))[0]
            if args.filter not in name:
                continue
            weights = os.path.join(tmp, name + "-weights.safetensors")
            why = realistic_weights(m, weights)
            if why:
                print("FAIL %s weights: %s" % (name, why))
                sys.exit(1)
            cases.append({"name": name, "model": m, "kl": True, "args": ["--weights", weights]})
        if not args.no_onnx:
            cases += onnx_cases(tmp, args.filter)
        npass = nfail = 0
        # models one after another, each model's runs side by side
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as ex:
            for case in cases:
                for label, why, note in check_case(kiln, case, args, tmp, ex):
                    if why:
                        nfail += 1
                        print("FAIL %s: %s" % (label, why), flush=True)
                    else:
                        npass += 1
                        print("PASS %s (%s)" % (label, note), flush=True)
    print("%d passed, %d failed" % (npass, nfail))
    if not npass and not nfail:
        print("FAIL: no model ran")
    sys.exit(1 if nfail or not npass else 0)


if __name__ == "__main__":
    main()
