#!/usr/bin/env python3
"""examples_ref.py - NumPy reference runs of the example models.

    python3 tests/ref/examples_ref.py OUTDIR

For each of examples/{mlp,cnn,transformer}.kl writes OUTDIR/<example>/ with

    model.kl              a copy of the example
    args.json             (the *_B<N>... cases) ["--dim", "B=N", ...]:
                          the same model at other sizes
    weights.safetensors   every param and const, random, of the declared
                          shape (variances positive)
    input_K.npy           the K-th `input` of the model
    expected_K.npy        the K-th `output`, from the NumPy model below
    tol.json              the tolerance for check.py (a whole network in f32
                          against a float64 reference)

The forward passes below are written from what each model means (see the
comments at the top of each example); only the names, dtypes and shapes of
the declarations are read from the .kl files, to fill the weights file, and
they are checked against what the NumPy model uses.  Seeds are fixed.
"""
import json
import os
import re
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops_cases import (batch_norm, conv2d, gelu, layer_norm,  # noqa: E402
                       pool2d, softmax, write_safetensors)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TOL = {"rtol": 1e-5, "atol": 1e-6}  # the bar for f32: 1e-5 relative

NP_DT = {"f32": np.float32, "f64": np.float64, "f16": np.float16,
         "i8": np.int8, "i32": np.int32, "i64": np.int64, "bool": np.bool_}
def declarations(path, overrides=None):
    """(inputs, weights): lists of (name, dtype, shape) in source order;
    weights are the params and consts.  overrides: {dim: value}."""
    src = re.sub(r"#[^\n]*", "", open(path).read())
    dims = {m.group(1): int(m.group(2))
            for m in re.finditer(r"\bdim\s+(\w+)\s*=\s*(\d+)", src)}
    dims.update(overrides or {})
    ins, ws = [], []
    for m in re.finditer(r"\b(input|param|const)\s+(\w+)\s*:\s*(\w+)\s*"
                         r"\[([^\]]*)\]", src):
        shape = tuple(dims[d] if d in dims else int(d)
                      for d in (t.strip() for t in m.group(4).split(","))
                      if d)
        (ins if m.group(1) == "input" else ws).append(
            (m.group(2), m.group(3), shape))
    return ins, ws


def relu(x):
    return np.maximum(x, 0.0)


def f32(x):
    return np.asarray(x, np.float64).astype(np.float32)


# --------------------------------------------------------------------------
# the models

def mlp_inputs(r, B=32):
    x = r.uniform(0.0, 1.0, (B, 784)).astype(np.float32)
    labels = r.integers(0, 10, (B,)).astype(np.int64)
    return [("x", x), ("labels", labels)]


def mlp_forward(w, inp):
    x = inp["x"].astype(np.float64)
    h1 = relu(x @ w["w1"] + w["b1"])
    h2 = relu(h1 @ w["w2"] + w["b2"])
    logits = h2 @ w["w3"] + w["b3"]
    return [f32(softmax(logits, axis=-1))]


def cnn_inputs(r, B=8):
    return [("x", r.standard_normal((B, 3, 32, 32)).astype(np.float32))]


def cnn_forward(w, inp):
    x = inp["x"].astype(np.float64)
    p1 = (1, 1, 1, 1)

    def bn(t, p):
        return batch_norm(t, w[p + "_g"], w[p + "_b"], w[p + "_m"],
                          w[p + "_v"])

    s = relu(bn(conv2d(x, w["stem_w"], pads=p1), "stem"))
    s = pool2d(s, "max", (3, 3), (2, 2), p1)
    # block 1: identity shortcut
    a = relu(bn(conv2d(s, w["b1c1_w"], pads=p1), "b1n1"))
    a = bn(conv2d(a, w["b1c2_w"], pads=p1), "b1n2")
    r1 = relu(a + s)
    # block 2: stride 2 with a 1x1 projection
    a = relu(bn(conv2d(r1, w["b2c1_w"], strides=(2, 2), pads=p1), "b2n1"))
    a = bn(conv2d(a, w["b2c2_w"], pads=p1), "b2n2")
    sc = conv2d(r1, w["b2sc_w"], w["b2sc_b"], strides=(2, 2))
    r2 = relu(a + sc)
    pooled = r2.mean(axis=(2, 3))
    return [f32(pooled @ w["fc_w"] + w["fc_b"])]


def transformer_inputs(r, B=2, T=16):
    return [("x", r.standard_normal((B, T, 64)).astype(np.float32))]


def transformer_forward(w, inp):
    x = inp["x"].astype(np.float64)
    B, T, C = x.shape
    H = 4
    D = C // H
    h1 = layer_norm(x, w["ln1_g"], w["ln1_b"])
    qkv = h1 @ w["w_qkv"] + w["b_qkv"]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]

    def heads(t):  # [B,T,C] -> [B,H,T,D]
        return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    scores = np.einsum("bhtd,bhsd->bhts", heads(q), heads(k)) / np.sqrt(D)
    keep = np.tril(w["causal_ones"]) > 0.5          # [T, T]
    att = softmax(np.where(keep, scores, -1e9), axis=-1)
    o = np.einsum("bhts,bhsd->bhtd", att, heads(v))
    o = o.transpose(0, 2, 1, 3).reshape(B, T, C)
    h = x + o @ w["w_o"] + w["b_o"]
    h2 = layer_norm(h, w["ln2_g"], w["ln2_b"])
    m = gelu(h2 @ w["w_fc"] + w["b_fc"]) @ w["w_proj"] + w["b_proj"]
    return [f32(h + m)]


def random_weight(r, name, shape, dt):
    if dt != "f32":
        raise SystemExit("examples_ref: %s: unexpected dtype %s" % (name, dt))
    if re.search(r"(_v|var)$", name):              # batch_norm variance
        a = r.uniform(0.5, 1.5, shape)
    elif re.search(r"(_g|gamma)$", name):          # norm scales
        a = r.uniform(0.5, 1.5, shape)
    elif name == "causal_ones":                    # any values: > 0.5 masks
        a = r.uniform(0.0, 1.0, shape)
    elif len(shape) >= 2:                          # matrices, conv kernels
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        a = r.standard_normal(shape) * (1.5 / np.sqrt(fan_in))
    else:                                          # biases, means
        a = r.standard_normal(shape) * 0.2
    return a.astype(np.float32)


# (case, example, inputs, forward, seed, {dim: override})
EXAMPLES = [("mlp", "mlp", mlp_inputs, mlp_forward, 11, {}),
            ("cnn", "cnn", cnn_inputs, cnn_forward, 12, {}),
            ("transformer", "transformer", transformer_inputs,
             transformer_forward, 13, {}),
            # the same models at other sizes, via --dim NAME=N
            ("cnn_B2", "cnn", cnn_inputs, cnn_forward, 22, {"B": 2}),
            ("transformer_B3_T8", "transformer", transformer_inputs,
             transformer_forward, 23, {"B": 3, "T": 8})]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: examples_ref.py OUTDIR")
    out = sys.argv[1]
    for name, example, mk_inputs, forward, seed, dims in EXAMPLES:
        kl = os.path.join(ROOT, "examples", example + ".kl")
        decl_in, decl_w = declarations(kl, dims)
        r = np.random.default_rng(seed)
        weights = {n: random_weight(r, n, s, dt) for n, dt, s in decl_w}
        inputs = mk_inputs(r, **dims)
        got = [(n, dt_name(a), a.shape) for n, a in inputs]
        want = [(n, dt, s) for n, dt, s in decl_in]
        if got != want:
            sys.exit("examples_ref: %s: inputs %s do not match the model's "
                     "%s" % (name, got, want))
        w64 = {n: a.astype(np.float64) for n, a in weights.items()}
        used = set()

        class Tracker(dict):
            def __getitem__(self, k):
                used.add(k)
                return dict.__getitem__(self, k)

        outs = forward(Tracker(w64), dict(inputs))
        if used != set(weights):
            sys.exit("examples_ref: %s: weights declared but unused by the "
                     "reference: %s; used but undeclared: %s" % (
                         name, sorted(set(weights) - used),
                         sorted(used - set(weights))))
        d = os.path.join(out, name)
        if os.path.isdir(d):
            shutil.rmtree(d)
        os.makedirs(d)
        shutil.copy(kl, os.path.join(d, "model.kl"))
        write_safetensors(os.path.join(d, "weights.safetensors"), weights)
        for k, (_, a) in enumerate(inputs):
            np.save(os.path.join(d, "input_%d.npy" % k), a)
        for k, a in enumerate(outs):
            np.save(os.path.join(d, "expected_%d.npy" % k), a)
        with open(os.path.join(d, "tol.json"), "w") as f:
            json.dump(TOL, f)
        if dims:
            with open(os.path.join(d, "args.json"), "w") as f:
                json.dump([a for k, v in sorted(dims.items())
                           for a in ("--dim", "%s=%d" % (k, v))], f)
        print("%s: %d weights, outputs %s" % (
            name, len(weights), [list(a.shape) for a in outs]))


def dt_name(a):
    return {v: k for k, v in NP_DT.items()}[a.dtype.type]


if __name__ == "__main__":
    main()
