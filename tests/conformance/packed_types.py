#!/usr/bin/env python3
"""packed_types.py - ONNX models whose weights are ONNX's narrow types:
4- and 2-bit integers and fp4 packed two or four to a byte (raw_data, and
int32_data in a Constant), fp8 and E8M0, cast to float and used.  Written
as node-test folders, with the expected outputs from ONNX's own reference
evaluator, then checked by the conformance runner on the interpreter and
the host device (fused): every test must pass.

    python3 tests/conformance/packed_types.py CONFORMANCE

Exits 1, naming it, without the onnx package."""
import os
import subprocess
import sys
import tempfile

try:
    import ml_dtypes as md
    import numpy as np
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    from onnx.reference import ReferenceEvaluator
except ImportError:
    print("FAIL: this test needs onnx (with ml_dtypes; scripts/setup.sh installs it)")
    sys.exit(1)


def weights():
    """Odd element counts, so the last packed byte is half (or less) used."""
    return [
        nh.from_array(np.array([-8, -1, 0, 3, 7], dtype=md.int4), "w_i4"),
        nh.from_array(np.array([15, 0, 9], dtype=md.uint4), "w_u4"),
        nh.from_array(np.array([0, 1, 2, 3, 3, 1, 2], dtype=md.uint2), "w_u2"),
        nh.from_array(np.array([-2, 1, -1, 0, 1], dtype=md.int2), "w_i2"),
        nh.from_array(np.array([0.5, -6, 1.5], np.float32).astype(md.float4_e2m1fn), "w_f4"),
        nh.from_array(np.array([0.5, -448, 3.25, 0.0078125], np.float32)
                      .astype(md.float8_e4m3fn), "w_e4m3"),
        nh.from_array(np.array([0.5, -57344, 3.5], np.float32).astype(md.float8_e5m2fnuz),
                      "w_e5m2fnuz"),
        nh.from_array(np.array([1, 0.25, 1024], np.float32).astype(md.float8_e8m0fnu), "w_e8m0"),
    ]


def write_case(root, name, model, feeds):
    d = os.path.join(root, "node", "test_" + name)
    os.makedirs(os.path.join(d, "test_data_set_0"))
    onnx.save(model, os.path.join(d, "model.onnx"))
    for k, (n, a) in enumerate(feeds.items()):
        with open(os.path.join(d, "test_data_set_0", "input_%d.pb" % k), "wb") as f:
            f.write(nh.from_array(a, n).SerializeToString())
    outs = ReferenceEvaluator(model).run(None, feeds)
    for k, a in enumerate(outs):
        with open(os.path.join(d, "test_data_set_0", "output_%d.pb" % k), "wb") as f:
            f.write(nh.from_array(a, model.graph.output[k].name).SerializeToString())


def build(root):
    x = np.linspace(-3, 3, 7).astype(np.float32)
    for w in weights():
        n = int(np.prod(w.dims))
        # y = cast(w, float) * x[:n]: the weight used, not only loaded
        nodes = [h.make_node("Cast", [w.name], ["wf"], to=T.FLOAT),
                 h.make_node("Slice", ["x", "st", "en"], ["xs"]),
                 h.make_node("Mul", ["wf", "xs"], ["y"])]
        inits = [w, nh.from_array(np.array([0], np.int64), "st"),
                 nh.from_array(np.array([n], np.int64), "en")]
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [7])],
                         [h.make_tensor_value_info("y", T.FLOAT, [n])], initializer=inits)
        write_case(root, "packed_init_" + w.name[2:],
                   h.make_model(g, opset_imports=[h.make_opsetid("", 25)]), {"x": x})
    # Constant values in int32_data: packed bytes for int4, codes for fp8
    for name, t in [("i4", h.make_tensor("c", T.INT4, [3], [-3, 5, 7])),
                    ("e5m2", h.make_tensor("c", T.FLOAT8E5M2, [2], [1.5, -0.25]))]:
        nodes = [h.make_node("Constant", [], ["c"], value=t),
                 h.make_node("Cast", ["c"], ["y"], to=T.FLOAT)]
        g = h.make_graph(nodes, "g", [], [h.make_tensor_value_info("y", T.FLOAT, list(t.dims))])
        write_case(root, "packed_constant_" + name,
                   h.make_model(g, opset_imports=[h.make_opsetid("", 25)]), {})


def main():
    runner = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="kiln-packed-") as root:
        build(root)
        p = subprocess.run([runner, root, "--suite", "node", "--device", "host", "-v"],
                           capture_output=True, text=True, timeout=600)
        print(p.stdout + p.stderr)
        summary = [l for l in p.stdout.splitlines() if l.startswith("conformance:")]
        ok = p.returncode == 0 and summary and " 0 failed, 0 unsupported" in summary[-1]
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
