#!/usr/bin/env python3
"""gen_chain.py - a chain of pre-norm GPT-style decoder blocks, of any
length, for measuring compile time against graph size.

    python3 bench/gen_chain.py --nodes 10000 -o chain.kl
    python3 bench/gen_chain.py --blocks 20 --format onnx -o chain.onnx

Each block is examples/transformer.kl's: layer norm, fused QKV matmul and
split, head split (reshape + transpose), scaled scores, causal mask
(`where`), softmax, head merge, output projection and residual add, then
layer norm, C -> 4C -> C MLP with GELU and the second residual add.  The
causal mask is made once and read by every block, as exporters do.  Every
block has weights of its own; the widths are small (C = 32 by default) so
that a chain of thousands of blocks keeps its weights in megabytes.

--format kl writes the .kl language (about 29 IR nodes a block).  --format
onnx writes the graph the way PyTorch exports GPT-2 (Shape -> Gather ->
Concat reshape targets, decomposed GELU; about 46 IR nodes a block) and needs
the onnx package (the project's .venv has it).  --nodes N picks the number
of blocks whose graph comes closest to N nodes.
"""
import argparse
import math
import sys

KL_NODES_PER_BLOCK = 29    # IR nodes: the literals are constant nodes
ONNX_NODES_PER_BLOCK = 46  # IR nodes (63 ONNX nodes): the loader folds shape arithmetic
KL_FIXED, ONNX_FIXED = 3, 3


def kl_chain(blocks, b, t, c, heads):
    d = c // heads
    out = ["# chain of %d decoder blocks, written by bench/gen_chain.py" % blocks,
           "model chain",
           "dim B = %d" % b, "dim T = %d" % t, "dim C = %d" % c,
           "dim H = %d" % heads, "dim D = %d" % d,
           "input x: f32[B, T, C]",
           "const causal_ones: f32[T, T] = ones",
           "let causal = trilu(causal_ones, upper=false) > 0.5"]
    h = "x"
    for i in range(blocks):
        s = 10 * i
        p = "b%d_" % i
        out += [
            "param %sln1_g: f32[C] = ones" % p,
            "param %sln1_b: f32[C] = zeros" % p,
            "param %sw_qkv: f32[C, %d] = randn(0.02, seed=%d)" % (p, 3 * c, s + 1),
            "param %sb_qkv: f32[%d] = zeros" % (p, 3 * c),
            "param %sw_o: f32[C, C] = randn(0.02, seed=%d)" % (p, s + 2),
            "param %sb_o: f32[C] = zeros" % p,
            "param %sln2_g: f32[C] = ones" % p,
            "param %sln2_b: f32[C] = zeros" % p,
            "param %sw_fc: f32[C, %d] = randn(0.02, seed=%d)" % (p, 4 * c, s + 3),
            "param %sb_fc: f32[%d] = zeros" % (p, 4 * c),
            "param %sw_proj: f32[%d, C] = randn(0.02, seed=%d)" % (p, 4 * c, s + 4),
            "param %sb_proj: f32[C] = zeros" % p,
            "let {p}h1 = layer_norm({h}, {p}ln1_g, {p}ln1_b)",
            "let {p}qkv = {p}h1 @ {p}w_qkv + {p}b_qkv",
            "let {p}q, {p}k, {p}v = split({p}qkv, axis=-1, sizes=[C, C, C])",
            "let {p}qh = transpose(reshape({p}q, shape=[B, T, H, D]), perm=[0, 2, 1, 3])",
            "let {p}kt = transpose(reshape({p}k, shape=[B, T, H, D]), perm=[0, 2, 3, 1])",
            "let {p}vh = transpose(reshape({p}v, shape=[B, T, H, D]), perm=[0, 2, 1, 3])",
            "let {p}scores = ({p}qh @ {p}kt) * %r" % (1.0 / math.sqrt(d)),
            "let {p}att = softmax(where(causal, {p}scores, -1e9), axis=-1)",
            "let {p}merged = reshape(transpose({p}att @ {p}vh, perm=[0, 2, 1, 3]), "
            "shape=[B, T, C])",
            "let {p}h = {h} + ({p}merged @ {p}w_o + {p}b_o)",
            "let {p}h2 = layer_norm({p}h, {p}ln2_g, {p}ln2_b)",
            "let {p}m = gelu({p}h2 @ {p}w_fc + {p}b_fc) @ {p}w_proj + {p}b_proj",
            "let {p}y = {p}h + {p}m",
        ]
        out[-13:] = [line.format(p=p, h=h) for line in out[-13:]]
        h = p + "y"
    out.append("output %s" % h)
    return "\n".join(out) + "\n"


def onnx_chain(blocks, b, t, c, heads):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, count = [], [], {}

    def name(base):
        k = count.get(base, 0)
        count[base] = k + 1
        return "%s_%d" % (base, k)

    def op(op_type, inputs, nout=1, **attrs):
        outs = [name(op_type.lower()) for _ in range(nout)]
        nodes.append(helper.make_node(op_type, inputs, outs, name=name(op_type), **attrs))
        return outs[0] if nout == 1 else outs

    def init(base, array):
        n = name(base)
        inits.append(numpy_helper.from_array(array, n))
        return n

    def const(value, dtype=np.float32):
        out = name("const")
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype), out + "_value")
        nodes.append(helper.make_node("Constant", [], [out], name=name("Constant"), value=tensor))
        return out

    rng = np.random.default_rng(1)

    def weight(shape):
        return init("w", (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def linear(x, cin, cout):
        return op("Add", [op("MatMul", [x, weight((cin, cout))]),
                          init("b", np.zeros(cout, np.float32))])

    def layer_norm(x):
        return op("LayerNormalization", [x, init("g", np.ones(c, np.float32)),
                                         init("beta", np.zeros(c, np.float32))],
                  axis=-1, epsilon=1e-5)

    def shape_prefix(x, end):
        return op("Slice", [op("Shape", [x]), const([0], np.int64), const([end], np.int64)])

    def gelu_tanh(x):
        cube = op("Mul", [const(0.044715), op("Pow", [x, const(3.0)])])
        inner = op("Mul", [const(math.sqrt(2.0 / math.pi)), op("Add", [x, cube])])
        th = op("Add", [const(1.0), op("Tanh", [inner])])
        return op("Mul", [op("Mul", [const(0.5), x]), th])

    d = c // heads
    ones = op("ConstantOfShape", [const([t, t], np.int64)],
              value=numpy_helper.from_array(np.ones(1, np.float32)))
    causal = op("Cast", [op("Trilu", [ones], upper=0)], to=TensorProto.BOOL)
    neg = const(np.finfo(np.float32).min)
    h = "x"
    for _ in range(blocks):
        q, k, v = op("Split", [linear(layer_norm(h), c, 3 * c), const([c] * 3, np.int64)],
                     nout=3, axis=2)
        hd = const([heads, d], np.int64)
        q, k, v = (op("Reshape", [x, op("Concat", [shape_prefix(x, -1), hd], axis=0)])
                   for x in (q, k, v))
        q = op("Transpose", [q], perm=[0, 2, 1, 3])
        k = op("Transpose", [k], perm=[0, 2, 3, 1])
        v = op("Transpose", [v], perm=[0, 2, 1, 3])
        s = op("Div", [op("MatMul", [q, k]), const(math.sqrt(d))])
        p = op("Softmax", [op("Where", [causal, s, neg])], axis=-1)
        tr = op("Transpose", [op("MatMul", [p, v])], perm=[0, 2, 1, 3])
        ctx = op("Reshape", [tr, op("Concat", [shape_prefix(tr, -2), const([c], np.int64)],
                                    axis=0)])
        h = op("Add", [h, linear(ctx, c, c)])
        h = op("Add", [h, linear(gelu_tanh(linear(layer_norm(h), c, 4 * c)), 4 * c, c)])
    op("Identity", [h])
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, t, c])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, t, c])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                          producer_name="kiln-bench")
    m.ir_version = 8
    return m.SerializeToString()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = ap.add_mutually_exclusive_group(required=True)
    size.add_argument("--blocks", type=int, help="number of decoder blocks")
    size.add_argument("--nodes", type=int, help="about this many graph nodes")
    ap.add_argument("--format", choices=["kl", "onnx"], default="kl")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("-o", dest="out", default="-", help="output file (default: stdout)")
    args = ap.parse_args()
    if args.hidden % args.heads:
        ap.error("--hidden must be a multiple of --heads")
    blocks = args.blocks
    if blocks is None:
        per, fixed = ((KL_NODES_PER_BLOCK, KL_FIXED) if args.format == "kl"
                      else (ONNX_NODES_PER_BLOCK, ONNX_FIXED))
        blocks = round((args.nodes - fixed) / per)
    blocks = max(1, blocks)
    dims = (args.batch, args.seq, args.hidden, args.heads)
    if args.format == "kl":
        data = kl_chain(blocks, *dims).encode()
    else:
        data = onnx_chain(blocks, *dims)
    if args.out == "-":
        sys.stdout.buffer.write(data)
    else:
        with open(args.out, "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
