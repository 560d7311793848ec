"""A small ONNX model for `kiln check` (tests/cli/test_check.sh): a chain of
MatMul, Add, Tanh, Sigmoid, Relu, Mul, Sub with two Relus.  The first Relu
('model/gate/Relu') reads a Sigmoid, so only positive values; the second
('model/block2/Relu') reads values of both signs, deep in the chain.  A Relu
broken for negative inputs therefore changes only the second: `kiln check`
must name that one, not merely the first Relu it meets.
Usage: check_model.py OUT.onnx"""
import sys

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper


def main(path):
    rng = np.random.default_rng(7)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.5
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("W0", f32(16, 24)), ("b0", f32(24)), ("s", np.float32([1.5])),
        ("c", np.float32([0.25])), ("W1", f32(24, 24)), ("b1", f32(24)),
        ("W2", f32(24, 8)), ("b2", f32(8))]]
    N = helper.make_node
    nodes = [
        N("MatMul", ["x", "W0"], ["h0"], name="model/fc0/MatMul"),
        N("Add", ["h0", "b0"], ["h1"], name="model/fc0/Add"),
        N("Tanh", ["h1"], ["h2"], name="model/act0/Tanh"),
        N("Sigmoid", ["h1"], ["g0"], name="model/gate/Sigmoid"),
        N("Relu", ["g0"], ["g1"], name="model/gate/Relu"),
        N("Mul", ["h2", "g1"], ["h3"], name="model/gate/Mul"),
        N("Mul", ["h3", "s"], ["h4"], name="model/scale/Mul"),
        N("Sub", ["h4", "c"], ["h5"], name="model/shift/Sub"),
        N("MatMul", ["h5", "W1"], ["h6"], name="model/fc1/MatMul"),
        N("Add", ["h6", "b1"], ["h7"], name="model/fc1/Add"),
        N("Tanh", ["h7"], ["h8"], name="model/act1/Tanh"),
        N("Sub", ["h8", "c"], ["h9"], name="model/block2/Sub"),
        N("Relu", ["h9"], ["h10"], name="model/block2/Relu"),
        N("Mul", ["h10", "s"], ["h11"], name="model/block2/Mul"),
        N("MatMul", ["h11", "W2"], ["h12"], name="model/fc2/MatMul"),
        N("Add", ["h12", "b2"], ["h13"], name="model/fc2/Add"),
        N("Tanh", ["h13"], ["y"], name="model/out/Tanh"),
    ]
    graph = helper.make_graph(
        nodes, "check_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    checker.check_model(model)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


if __name__ == "__main__":
    main(sys.argv[1])
