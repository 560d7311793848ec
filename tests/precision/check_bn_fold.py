#!/usr/bin/env python3
"""check_bn_fold.py - batch norms folded before precision, and the numbers
that keep a node in fp32.

    python3 tests/precision/check_bn_fold.py KILN [-k SUBSTR] [--timeout S]

Builds small ONNX models with onnx.helper and NumPy (fixed seeds): a
convolution and its batch norm with a running variance of 1.05e7 (beyond
fp16's 65504) and tiny and huge scales, the same when the convolution's
output has another reader (so the batch norm is not folded and must stay in
fp32), grouped and transposed convolutions, Gemm with transB, a 2-D MatMul,
a training-mode batch norm (never folded), and a batch norm with epsilon
1e-12 before a Mul by 1e5.  For each model it checks

  - kiln run, fp32 / fp16 / bf16, interpreter and host device, against ONNX
    Runtime's fp32 outputs (NumPy's for training mode): within 1e-4 in
    fp32; in fp16 and bf16 |out - ref| <= 1e-2 * (|ref| + max|ref|), the
    rule of check_precision.py;
  - kiln compile --dump-after=bnfold: which batch norms were folded, into
    what, and why the others were not;
  - kiln inspect --precision=fp16: the nodes left in fp32 and the reason.

Prints PASS/FAIL per check, then `N passed, N failed`; exits 1 on any
failure, and without numpy, onnx or onnxruntime (naming it).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:
    print("FAIL: this test needs %s (scripts/setup.sh installs it)" % e.name)
    sys.exit(1)

F32 = TensorProto.FLOAT
BIG_VAR = 1.05e7


class Model:
    """Nodes and initializers of one small graph."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def init(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op, ins, outs, **attrs):
        self.nodes.append(helper.make_node(op, ins, outs, name=outs[0] + "_node", **attrs))

    def batch_norm(self, x, y, act, channels, **attrs):
        """BatchNormalization of x (whose values are `act`) into y: the
        statistics are act's own, but channel 0's variance is 1.05e7 (act
        is made that large) and channels 1 and 2 have a tiny and a huge
        scale."""
        axes = tuple(d for d in range(act.ndim) if d != 1)
        var = act.var(axis=axes)
        var[0] = BIG_VAR
        scale = self.rng.uniform(0.5, 1.5, channels)
        scale[1], scale[2] = 1e-6, 30.0
        self.node("BatchNormalization", [
            x, self.init("bn_scale", scale), self.init("bn_bias", self.rng.uniform(-1, 1, channels)),
            self.init("bn_mean", act.mean(axis=axes)), self.init("bn_var", var)], [y], **attrs)

    def build(self, inputs, outputs, opset=17):
        g = helper.make_graph(self.nodes, "bn", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        # the outputs' shapes, as onnx infers them
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        onnx.checker.check_model(m, full_check=True)
        return m


def vi(name, shape):
    return helper.make_tensor_value_info(name, F32, shape)


def run_ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run([o.name for o in s.get_outputs()], feeds)


def pixels(rng, shape):
    """Raw 0..255 pixels: what makes running variances of 1e7."""
    return rng.uniform(0, 255, shape).astype(np.float32)


def conv_output(x, w, b=None, **attrs):
    """The convolution alone, through ONNX Runtime: the batch norm's statistics."""
    m = Model(0)
    ins = ["x", m.init("w", w)] + ([m.init("b", b)] if b is not None else [])
    m.node("Conv", ins, ["y"], **attrs)
    return run_ort(m.build([vi("x", list(x.shape))], [vi("y", None)]), {"x": x})[0]


def conv_bn(shared=False, group=1, bias=True, stride=1):
    """x -> Conv -> BatchNormalization -> y (and Conv -> Relu -> r when
    shared: a second reader of the convolution's output)."""
    m = Model(1 + group)
    x = pixels(m.rng, (2, 4, 8, 8))
    w = m.rng.standard_normal((6, 4 // group, 3, 3)).astype(np.float32)
    b = m.rng.uniform(-5, 5, 6).astype(np.float32) if bias else None
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride], group=group)
    act = conv_output(x, w, b, **attrs).astype(np.float64)
    m.node("Conv", ["x", m.init("w", w)] + (["b"] if bias else []), ["c"], **attrs)
    if bias:
        m.init("b", b)
    m.batch_norm("c", "y", act, 6, epsilon=1e-5)
    outs = [vi("y", None)]
    if shared:
        m.node("Relu", ["c"], ["r"])
        outs.append(vi("r", None))
    return m.build([vi("x", list(x.shape))], outs), {"x": x}


def conv_transpose_bn():
    m = Model(7)
    x = pixels(m.rng, (1, 4, 5, 5))
    w = m.rng.standard_normal((4, 3, 3, 3)).astype(np.float32)  # [Cin, M/groups, k, k]
    b = m.rng.uniform(-5, 5, 6).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], group=2)
    cm = Model(0)
    cm.node("ConvTranspose", ["x", cm.init("w", w), cm.init("b", b)], ["y"], **attrs)
    act = run_ort(cm.build([vi("x", [1, 4, 5, 5])], [vi("y", None)]), {"x": x})[0]
    m.node("ConvTranspose", ["x", m.init("w", w), m.init("b", b)], ["c"], **attrs)
    m.batch_norm("c", "y", act.astype(np.float64), 6, epsilon=1e-5)
    return m.build([vi("x", [1, 4, 5, 5])], [vi("y", None)]), {"x": x}


def gemm_bn():
    """Gemm with transB, alpha, beta and a C row, then BatchNormalization
    over its columns."""
    m = Model(11)
    x = pixels(m.rng, (16, 12))
    w = m.rng.standard_normal((6, 12)).astype(np.float32)
    c = m.rng.uniform(-5, 5, 6).astype(np.float32)
    act = (0.5 * x.astype(np.float64) @ w.T.astype(np.float64) + 2.0 * c)
    m.node("Gemm", ["x", m.init("w", w), m.init("c", c)], ["g"], transB=1, alpha=0.5, beta=2.0)
    m.batch_norm("g", "y", act, 6, epsilon=1e-5)
    return m.build([vi("x", [16, 12])], [vi("y", None)]), {"x": x}


def matmul_bn():
    m = Model(13)
    x = pixels(m.rng, (16, 12))
    w = m.rng.standard_normal((12, 6)).astype(np.float32)
    act = x.astype(np.float64) @ w.astype(np.float64)
    m.node("MatMul", ["x", m.init("w", w)], ["g"])
    m.batch_norm("g", "y", act, 6, epsilon=1e-5)
    return m.build([vi("x", [16, 12])], [vi("y", None)]), {"x": x}


def training_bn():
    """Training mode: normalised with the batch's own statistics, never
    folded.  The reference is NumPy's (ONNX's formula)."""
    m = Model(17)
    x = m.rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    w = (m.rng.standard_normal((6, 3, 3, 3)) * 0.5).astype(np.float32)
    act = conv_output(x, w, kernel_shape=[3, 3]).astype(np.float64)
    scale, bias = m.rng.uniform(0.5, 1.5, 6), m.rng.uniform(-1, 1, 6)
    m.node("Conv", ["x", m.init("w", w)], ["c"], kernel_shape=[3, 3])
    m.node("BatchNormalization", ["c", m.init("bn_scale", scale), m.init("bn_bias", bias),
                                  m.init("bn_mean", np.zeros(6)), m.init("bn_var", np.ones(6))],
           ["y", "running_mean", "running_var"], epsilon=1e-5, training_mode=1)
    mean, var = act.mean(axis=(0, 2, 3)), act.var(axis=(0, 2, 3))
    ch = (slice(None), None, None)
    want = (act - mean[ch]) / np.sqrt(var[ch] + 1e-5) * scale[ch] + bias[ch]
    return m.build([vi("x", [4, 3, 5, 5])], [vi("y", None)], opset=15), {"x": x}, \
        [want.astype(np.float32)]


def epsilon_mul():
    """A batch norm on the input itself (nothing to fold into) with epsilon
    1e-12, then a Mul by the constant 1e5; and conv -> relu -> Mul by 1e5,
    where the Mul would otherwise follow the fp16 relu and saturate 1e5 to
    65504.  Both batch norm and Muls stay in fp32 under fp16."""
    m = Model(19)
    x = m.rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    m.node("BatchNormalization", ["x", m.init("bn_scale", [1.0, 0.5, 2.0]),
                                  m.init("bn_bias", [0.0, 0.1, -0.1]),
                                  m.init("bn_mean", [0.0, 0.1, -0.1]),
                                  m.init("bn_var", [1.0, 0.8, 1.2])], ["n"], epsilon=1e-12)
    m.node("Mul", ["n", m.init("k", 1e5)], ["y"])
    m.node("Conv", ["x", m.init("w", m.rng.standard_normal((4, 3, 1, 1)))], ["c"],
           kernel_shape=[1, 1])
    m.node("Relu", ["c"], ["r"])
    m.node("Mul", ["r", "k"], ["z"])
    return m.build([vi("x", [2, 3, 4, 4])], [vi("y", None), vi("z", None)]), {"x": x}


# name: (builder, lines --dump-after=bnfold must print, lines kiln inspect
# --precision=fp16 must print)
CASES = {
    "conv_bn": (lambda: conv_bn(), [r"y = batch_norm: folded into c_node \(conv2d\)"],
                [r"c_node +conv2d +f16 +allow"]),
    "conv_bn_nobias": (lambda: conv_bn(bias=False, stride=2),
                       [r"y = batch_norm: folded into c_node \(conv2d\)"], []),
    "conv_bn_groups": (lambda: conv_bn(group=2), [r"folded into c_node \(conv2d\)"], []),
    "conv_bn_shared": (lambda: conv_bn(shared=True),
                       [r"y = batch_norm: not folded: its input has another reader"],
                       [r"y_node +batch_norm +f32 +deny +weight 'bn_var' holds 1\.05e\+07, "
                        r"beyond fp16's 65504", r"c_node +conv2d +f16 +allow"]),
    "conv_transpose_bn": (conv_transpose_bn,
                          [r"y = batch_norm: folded into c_node \(conv_transpose2d\)"], []),
    "gemm_bn": (gemm_bn, [r"y = batch_norm: folded into g_node \(gemm\)"],
                [r"g_node +gemm +f16 +allow"]),
    "matmul_bn": (matmul_bn, [r"y = batch_norm: folded into g_node \(matmul\)"], []),
    "training_bn": (training_bn, [r"not folded: its statistics or affine are computed"], []),
    "epsilon_mul": (epsilon_mul, [r"not folded: its input is not made by a conv2d"],
                    [r"batch_norm +f32 +deny +epsilon 1e-12 flushes to 0 in fp16",
                     r"y_node +mul +f32 +deny +weight 'k' holds 100000, beyond fp16's 65504",
                     r"z_node +mul +f32 +deny +weight 'k' holds 100000, beyond fp16's 65504",
                     r"r_node +relu +f16 +follow"]),
}


class Checker:
    def __init__(self, kiln, timeout):
        self.kiln, self.timeout = kiln, timeout
        self.passed = self.failed = 0

    def result(self, label, why, note=""):
        if why:
            self.failed += 1
            print("FAIL %s: %s" % (label, why), flush=True)
        else:
            self.passed += 1
            print("PASS %s%s" % (label, " (%s)" % note if note else ""), flush=True)

    def kiln_out(self, args):
        p = subprocess.run([self.kiln] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=self.timeout)
        out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
        if p.returncode != 0 or "Sanitizer" in out or "runtime error:" in out:
            return None, "kiln %s exited %d: %s" % (args[0], p.returncode, out.strip()[-600:])
        return out, None

    def run(self, label, model, inputs, ref, precision, device, tmp):
        out_dir = os.path.join(tmp, "%s-%s-%s" % (label, precision, device))
        args = ["run", model, "--output-dir", out_dir, "--device=" + device]
        args += ["--input=%s=%s" % kv for kv in inputs.items()]
        if precision != "fp32":
            args.append("--precision=" + precision)
        _, why = self.kiln_out(args)
        if why:
            return why, ""
        worst = 0.0
        for k, want in enumerate(ref):
            got = np.load(os.path.join(out_dir, "output_%d.npy" % k)).astype(np.float64)
            want = want.astype(np.float64)
            if got.shape != want.shape or np.isnan(got).any():
                return "output %d: shape %s (want %s) or NaN" % (k, got.shape, want.shape), ""
            top = float(np.max(np.abs(want)))
            err = np.abs(got - want)
            if precision == "fp32":
                bad = err > 1e-4 * np.abs(want) + 1e-5 * top
            else:
                bad = err > 1e-2 * (np.abs(want) + top)
            worst = max(worst, float(err.max()) / top if top else 0.0)
            if bad.any():
                i = np.unravel_index(np.argmax(err), err.shape)
                return ("output %d: %d elements off, worst at %s: %g, want %g (max|ref| %g)"
                        % (k, int(bad.sum()), i, got[i], want[i], top)), ""
        return None, "max err %.2e of max|ref|" % worst

    def expect_lines(self, label, args, patterns):
        out, why = self.kiln_out(args)
        if not why:
            missing = [p for p in patterns if not re.search(p, out, re.M)]
            if missing:
                why = "no line matches %r in:\n%s" % (missing[0], out.strip()[-1500:])
        self.result(label, why)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kiln")
    ap.add_argument("-k", dest="filter", default="")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    c = Checker(os.path.abspath(args.kiln), args.timeout)
    with tempfile.TemporaryDirectory(prefix="kiln-bnfold-") as tmp:
        for name, (make, dump, inspect) in CASES.items():
            if args.filter not in name:
                continue
            built = make()
            model, feeds = built[0], built[1]
            ref = built[2] if len(built) > 2 else run_ort(model, feeds)
            path = os.path.join(tmp, name + ".onnx")
            onnx.save(model, path)
            inputs = {}
            for k, v in feeds.items():
                inputs[k] = os.path.join(tmp, "%s_%s.npy" % (name, k))
                np.save(inputs[k], v)
            for precision in ("fp32", "fp16", "bf16"):
                for device in ("interp", "host"):
                    if precision == "bf16" and device == "host":
                        continue  # the host device's bf16 is check_precision.py's
                    label = "%s %s %s" % (name, precision, device)
                    c.result(label, *c.run(label.replace(" ", "-"), path, inputs, ref, precision,
                                           device, tmp))
            c.expect_lines(name + " dump-after bnfold",
                           ["compile", path, "--emit=ir", "-o", os.path.join(tmp, name + ".kl"),
                            "--dump-after=bnfold"], dump)
            if inspect:
                c.expect_lines(name + " inspect fp16", ["inspect", path, "--precision=fp16"],
                               inspect)
    print("%d passed, %d failed" % (c.passed, c.failed))
    sys.exit(1 if c.failed else 0 if c.passed else 77)


if __name__ == "__main__":
    main()
