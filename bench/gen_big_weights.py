#!/usr/bin/env python3
"""gen_big_weights.py - a model whose weights dwarf everything else, for
measuring compile memory and time against weight size.

    python3 bench/gen_big_weights.py [--mb 256] [--layers 4] [--batch 8]
                                     [--embedded] [--dtype f32|f16] [--ref]
                                     [OUTDIR]

Writes OUTDIR/model.onnx (default: a new temporary folder, printed on
stdout): a chain of `layers` MatMuls, x[batch, n] @ W_k[n, n], each
followed by a Tanh so values stay O(1), with about `mb` MiB of weights in
all (n chosen to fit).  The weights go to OUTDIR/weights.bin as ONNX
external data (what exporters write for models over 2 GB), or inside the
.onnx file with --embedded.  --ref also writes test_data_set_0/input_0.pb
and output_0.pb with the output NumPy computes (float64, then rounded), so
`kiln run` can be checked without onnxruntime.

Weights are drawn in slices and written as they are made, so a multi-GB
model does not need its size in the generator's memory either.
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def side_for(mb, layers, itemsize):
    """Largest n (a multiple of 64) with layers * n * n * itemsize <= mb MB."""
    n = int(math.sqrt(mb * 2**20 / (layers * itemsize)))
    return max(64, n // 64 * 64)


def weight_slices(rng, n, dtype, rows=256):
    """W[n, n] in slices of `rows` rows, scaled by 1/sqrt(n)."""
    for r in range(0, n, rows):
        k = min(rows, n - r)
        yield (rng.standard_normal((k, n)) / math.sqrt(n)).astype(dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--mb", type=float, default=256, help="weights, in MiB")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    ap.add_argument("--embedded", action="store_true",
                    help="weights inside model.onnx instead of external data")
    ap.add_argument("--ref", action="store_true", help="write test_data_set_0 with NumPy's output")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = args.outdir or tempfile.mkdtemp(prefix="kiln-bigw-")
    os.makedirs(out, exist_ok=True)
    np_dtype = np.float32 if args.dtype == "f32" else np.float16
    onnx_dtype = TensorProto.FLOAT if args.dtype == "f32" else TensorProto.FLOAT16
    itemsize = np.dtype(np_dtype).itemsize
    n = side_for(args.mb, args.layers, itemsize)
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.batch, n)).astype(np_dtype)
    y = x.astype(np.float64)

    inits, nodes, cur = [], [], "x"
    data_path = os.path.join(out, "weights.bin")
    offset = 0
    with open(data_path, "wb") if not args.embedded else open(os.devnull, "wb") as data:
        for k in range(args.layers):
            name = "w%d" % k
            parts = []
            acc = np.zeros((args.batch, n))
            r = 0
            for s in weight_slices(rng, n, np_dtype):
                if args.embedded:
                    parts.append(s)
                else:
                    data.write(s.tobytes())
                if args.ref:  # y @ W, one slice of W's rows at a time
                    acc += y[:, r:r + s.shape[0]] @ s.astype(np.float64)
                r += s.shape[0]
            if args.embedded:
                inits.append(numpy_helper.from_array(np.concatenate(parts), name))
            else:
                t = TensorProto(name=name, data_type=onnx_dtype, dims=[n, n])
                t.data_location = TensorProto.EXTERNAL
                nbytes = n * n * itemsize
                for key, val in (("location", "weights.bin"), ("offset", str(offset)),
                                 ("length", str(nbytes))):
                    e = t.external_data.add()
                    e.key, e.value = key, val
                offset += nbytes
                inits.append(t)
            y = np.tanh(acc.astype(np_dtype).astype(np.float64))
            mm, th = "mm%d" % k, "y" if k == args.layers - 1 else "h%d" % k
            nodes.append(helper.make_node("MatMul", [cur, name], [mm], name="MatMul_%d" % k))
            nodes.append(helper.make_node("Tanh", [mm], [th], name="Tanh_%d" % k))
            cur = th
    graph = helper.make_graph(
        nodes, "bigw", [helper.make_tensor_value_info("x", onnx_dtype, [args.batch, n])],
        [helper.make_tensor_value_info("y", onnx_dtype, [args.batch, n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    # save_model would check (and load) the external data; the proto alone
    # is small
    with open(os.path.join(out, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    if args.ref:
        d = os.path.join(out, "test_data_set_0")
        os.makedirs(d, exist_ok=True)
        for fname, arr in (("input_0.pb", x), ("output_0.pb", y.astype(np_dtype))):
            with open(os.path.join(d, fname), "wb") as f:
                f.write(numpy_helper.from_array(arr).SerializeToString())
    wbytes = args.layers * n * n * itemsize
    print(out)
    print("%d layers of %dx%d %s: %.1f MiB of weights (%s)" %
          (args.layers, n, n, args.dtype, wbytes / 2**20,
           "embedded" if args.embedded else "external data"), file=sys.stderr)


if __name__ == "__main__":
    main()
