#!/usr/bin/env python3
"""build_models.py - write whole-model ONNX tests with ONNX Runtime outputs.

    python3 tests/onnx_models/build_models.py OUTDIR [-k SUBSTR]

Builds, with onnx.helper and NumPy (fixed seeds, nothing downloaded),
graphs shaped like the models people export, written the way exporters write
them (Shape -> Gather -> Unsqueeze -> Concat -> Reshape head splits,
decomposed LayerNorm and Gelu, Clip with min/max inputs, ...):

    resnet18      ResNet-18 at 1x3x64x64 (opset 17)
    detector      Conv+BatchNorm+Relu blocks on raw 0..255 pixels, running
                  variances up to 1e7 (beyond fp16), a sigmoid score head
                  (opset 15)
    mobilenetv2   MobileNetV2, fewer blocks, 1x3x64x64 (opset 13)
    bert_block    BERT embeddings + 2 encoder layers + pooler (opset 17)
    bert_dynamic  the same with symbolic batch/sequence dims, as exported
                  with dynamic axes; args.json binds them with --shape
    gpt2_block    GPT-2 embeddings + 2 pre-norm blocks + LM head (opset 17)
    crnn          a CRNN text recognizer (conv stack, bidirectional LSTM) as
                  torch exports it: a -1 batch dim, INT64_MAX Slice ends,
                  dotted names (opset 13); args.json binds the dim by --dim

Each lands in OUTDIR/<name>/ as model.onnx plus test_data_set_0/input_K.pb
and output_K.pb, the layout of ONNX's backend tests (plus args.json, extra
`kiln run` arguments, where a model needs them); the outputs come from
onnxruntime's CPU provider with graph optimizations off, so the reference
is the graph as written.
"""
import argparse
import json
import math
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


class Graph:
    """Collects nodes and initializers; every helper returns the output
    name, so the model code reads like the forward pass."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], {}

    def name(self, base):
        k = self.count.get(base, 0)
        self.count[base] = k + 1
        return "%s_%d" % (base, k)

    def op(self, op_type, inputs, nout=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(nout)]
        self.nodes.append(helper.make_node(op_type, inputs, outs,
                                           name=self.name(op_type), **attrs))
        return outs[0] if nout == 1 else outs

    def output(self, name):
        """Renames the last node's output to `name`, a graph output."""
        self.nodes[-1].output[0] = name
        return name

    def init(self, base, array):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(array, n))
        return n

    def const(self, value, dtype=np.float32):
        """A Constant node, the way exporters write small literals."""
        out = self.name("const")
        t = numpy_helper.from_array(np.asarray(value, dtype=dtype), out + "_value")
        self.nodes.append(helper.make_node("Constant", [], [out],
                                           name=self.name("Constant"), value=t))
        return out

    def weight(self, base, shape, fan_in, gain=1.0):
        # He-style scaling keeps activations O(1) through deep stacks, so the
        # relative tolerance is tested on values of a sensible size.
        w = self.rng.standard_normal(shape) * (gain * math.sqrt(2.0 / fan_in))
        return self.init(base, w.astype(np.float32))

    def uniform(self, base, shape, lo, hi):
        return self.init(base, self.rng.uniform(lo, hi, shape).astype(np.float32))

    def model(self, name, inputs, outputs, opset):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="kiln-tests")
        m.ir_version = 8  # opset <= 17; keeps older onnxruntime builds happy
        onnx.checker.check_model(m, full_check=True)
        return m

    # -- layers shared by the models ------------------------------------

    def conv_bn(self, x, cin, cout, k, stride=1, group=1, bias=False):
        w = self.weight("conv_w", (cout, cin // group, k, k), cin // group * k * k)
        ins = [x, w]
        if bias:
            ins.append(self.uniform("conv_b", (cout,), -0.1, 0.1))
        p = k // 2
        y = self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                    pads=[p, p, p, p], group=group, dilations=[1, 1])
        return self.op("BatchNormalization", [
            y, self.uniform("bn_scale", (cout,), 0.5, 1.5),
            self.uniform("bn_bias", (cout,), -0.2, 0.2),
            self.uniform("bn_mean", (cout,), -0.2, 0.2),
            self.uniform("bn_var", (cout,), 0.5, 2.0)], epsilon=1e-5)

    def linear(self, x, cin, cout):
        """MatMul + Add, how exporters write nn.Linear on 3-D inputs."""
        w = self.weight("linear_w", (cin, cout), cin, gain=0.5)
        return self.op("Add", [self.op("MatMul", [x, w]),
                               self.uniform("linear_b", (cout,), -0.1, 0.1)])

    def gemm_head(self, x, cin, cout):
        """Flattened features -> Gemm with transB=1, as torch exports Linear."""
        w = self.weight("fc_w", (cout, cin), cin, gain=0.5)
        return self.op("Gemm", [x, w, self.uniform("fc_b", (cout,), -0.1, 0.1)],
                       alpha=1.0, beta=1.0, transB=1)

    def dims(self, x, idx):
        """Shape(x) -> Gather(axis 0, idx) -> Unsqueeze(0): one dim as [1],
        as torch exports x.size(i) feeding a view()."""
        s = self.op("Shape", [x])
        d = self.op("Gather", [s, self.const(idx, np.int64)], axis=0)
        return self.op("Unsqueeze", [d, self.const([0], np.int64)])

    def layer_norm(self, x, dim):
        return self.op("LayerNormalization", [
            x, self.uniform("ln_gamma", (dim,), 0.8, 1.2),
            self.uniform("ln_beta", (dim,), -0.1, 0.1)], axis=-1, epsilon=1e-5)

    def layer_norm_decomposed(self, x, dim):
        """LayerNorm as opset <= 16 exporters wrote it."""
        mean = self.op("ReduceMean", [x], axes=[-1], keepdims=1)
        d = self.op("Sub", [x, mean])
        var = self.op("ReduceMean", [self.op("Pow", [d, self.const(2.0)])],
                      axes=[-1], keepdims=1)
        std = self.op("Sqrt", [self.op("Add", [var, self.const(1e-12)])])
        y = self.op("Div", [d, std])
        y = self.op("Mul", [y, self.uniform("ln_gamma", (dim,), 0.8, 1.2)])
        return self.op("Add", [y, self.uniform("ln_beta", (dim,), -0.1, 0.1)])

    def split_heads(self, x, heads, head_dim, perm):
        """[B,S,H] -> [B,heads,S,hd] (or perm'd) with the exporter's dynamic
        Reshape target Concat(B, S, heads, hd)."""
        shape = self.op("Concat", [self.dims(x, 0), self.dims(x, 1),
                                   self.const([heads], np.int64),
                                   self.const([head_dim], np.int64)], axis=0)
        return self.op("Transpose", [self.op("Reshape", [x, shape])], perm=perm)

    def merge_heads(self, x, ref, hidden):
        """[B,heads,S,hd] -> [B,S,H], the Reshape target again from Shape;
        ref=None uses the [0, 0, -1] target (0 copies the input dim) that
        tf2onnx writes instead."""
        t = self.op("Transpose", [x], perm=[0, 2, 1, 3])
        if ref is None:
            return self.op("Reshape", [t, self.const([0, 0, -1], np.int64)])
        shape = self.op("Concat", [self.dims(ref, 0), self.dims(ref, 1),
                                   self.const([hidden], np.int64)], axis=0)
        return self.op("Reshape", [t, shape])

    def shape_prefix(self, x, end):
        """Shape(x)[:end] via Slice, as torch exports x.size()[:-1]."""
        return self.op("Slice", [self.op("Shape", [x]), self.const([0], np.int64),
                                 self.const([end], np.int64)])


def relu6(g, x):
    # Opset 11+: min and max are inputs, not attributes.
    return g.op("Clip", [x, g.const(0.0), g.const(6.0)])


def gelu_erf(g, x):
    """x * 0.5 * (1 + erf(x / sqrt(2))), in the order torch exports it."""
    e = g.op("Erf", [g.op("Div", [x, g.const(1.4142135381698608)])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [e, g.const(1.0)])]),
                        g.const(0.5)])


def gelu_tanh(g, x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's NewGELU."""
    cube = g.op("Mul", [g.const(0.044715), g.op("Pow", [x, g.const(3.0)])])
    inner = g.op("Mul", [g.const(math.sqrt(2.0 / math.pi)),
                         g.op("Add", [x, cube])])
    t = g.op("Add", [g.const(1.0), g.op("Tanh", [inner])])
    return g.op("Mul", [g.op("Mul", [g.const(0.5), x]), t])


def resnet18():
    g = Graph(18)
    x = "input"
    y = g.op("Relu", [g.conv_bn(x, 3, 64, 7, stride=2)])
    y = g.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1])
    cin = 64
    for i, cout in enumerate([64, 128, 256, 512]):
        for b in range(2):
            stride = 2 if i > 0 and b == 0 else 1
            h = g.op("Relu", [g.conv_bn(y, cin, cout, 3, stride)])
            h = g.conv_bn(h, cout, cout, 3)
            short = y
            if stride != 1 or cin != cout:
                short = g.conv_bn(y, cin, cout, 1, stride)
            y = g.op("Relu", [g.op("Add", [h, short])])
            cin = cout
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y])], axis=1)
    g.gemm_head(y, 512, 1000)
    g.output("logits")
    m = g.model("resnet18", [helper.make_tensor_value_info(x, F32, [1, 3, 64, 64])],
                [helper.make_tensor_value_info("logits", F32, [1, 1000])], 17)
    feeds = {x: np.random.default_rng(1).standard_normal((1, 3, 64, 64))
             .astype(np.float32)}
    return m, feeds


def detector():
    """A detector backbone trained on raw 0..255 pixels: its batch norms'
    running variances reach 1e7, which no fp16 holds (the issue's model).
    Each block's statistics are those of its convolution's real output on
    the input (ONNX Runtime runs the graph so far), so the reference is
    well scaled; one channel has a tiny scale and one a huge one."""
    g = Graph(23)
    x = "image"
    # whole pixel values, as images have: exact in fp16 and bf16
    feeds = {x: np.random.default_rng(9).integers(0, 256, (1, 3, 32, 32)).astype(np.float32)}
    y, size = x, 32
    # (cin, cout, kernel, stride, group, gain): the gains make the variances
    for cin, cout, k, stride, group, gain in [(3, 16, 3, 1, 1, 24.0), (16, 32, 3, 2, 1, 30.0),
                                              (32, 32, 3, 1, 4, 1.0), (32, 32, 1, 1, 1, 20.0)]:
        w = g.weight("conv_w", (cout, cin // group, k, k), cin // group * k * k, gain)
        p = k // 2
        conv = g.op("Conv", [y, w], kernel_shape=[k, k], strides=[stride, stride],
                    pads=[p, p, p, p], group=group)
        size //= stride
        partial = g.model("partial", [helper.make_tensor_value_info(x, F32, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info(conv, F32, [1, cout, size, size])], 15)
        act = reference(partial, feeds)[1][0].astype(np.float64)
        scale = g.rng.uniform(0.5, 1.5, cout)
        scale[1], scale[2] = 1e-6, 30.0
        bn = g.op("BatchNormalization", [
            conv, g.init("bn_scale", scale.astype(np.float32)),
            g.uniform("bn_bias", (cout,), -0.2, 0.2),
            g.init("bn_mean", act.mean(axis=(0, 2, 3)).astype(np.float32)),
            g.init("bn_var", act.var(axis=(0, 2, 3)).astype(np.float32))], epsilon=1e-5)
        y = g.op("Relu", [bn])
    b = g.uniform("head_b", (6,), -0.5, 0.5)
    score = g.op("Conv", [y, g.weight("head_w", (6, 32, 1, 1), 32, 0.1), b],
                 kernel_shape=[1, 1])
    g.op("Sigmoid", [score])
    g.output("scores")
    m = g.model("detector", [helper.make_tensor_value_info(x, F32, [1, 3, 32, 32])],
                [helper.make_tensor_value_info("scores", F32, [1, 6, 16, 16])], 15)
    return m, feeds


def mobilenetv2():
    g = Graph(2)
    x = "input"
    y = relu6(g, g.conv_bn(x, 3, 16, 3, stride=2))
    cin = 16
    # (expansion t, channels c, repeats n, first stride s), torchvision's
    # table cut down to keep the interpreter quick.
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2),
                       (6, 64, 2, 2), (6, 96, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hid = cin * t
            h = y
            if t != 1:
                h = relu6(g, g.conv_bn(h, cin, hid, 1))
            h = relu6(g, g.conv_bn(h, hid, hid, 3, stride, group=hid))
            h = g.conv_bn(h, hid, c, 1)
            y = g.op("Add", [y, h]) if stride == 1 and cin == c else h
            cin = c
    y = relu6(g, g.conv_bn(y, cin, 320, 1))
    # Older torchvision pooled with x.mean([2, 3]); opset 13 ReduceMean takes
    # axes as an attribute.
    y = g.op("ReduceMean", [y], axes=[2, 3], keepdims=0)
    g.gemm_head(y, 320, 1000)
    g.output("logits")
    m = g.model("mobilenetv2", [helper.make_tensor_value_info(x, F32, [1, 3, 64, 64])],
                [helper.make_tensor_value_info("logits", F32, [1, 1000])], 13)
    feeds = {x: np.random.default_rng(3).standard_normal((1, 3, 64, 64))
             .astype(np.float32)}
    return m, feeds


BATCH, SEQ, HIDDEN, HEADS, VOCAB, FFN = 2, 8, 64, 4, 100, 256
HEAD_DIM = HIDDEN // HEADS


def bert_block():
    g = Graph(42)
    ids, mask = "input_ids", "attention_mask"
    # Embeddings: word Gather + position ids (a constant buffer, as HF
    # registers them) + token type zeros, then the decomposed LayerNorm.
    emb = g.op("Gather", [g.uniform("word_emb", (VOCAB, HIDDEN), -1, 1), ids], axis=0)
    pos_ids = g.init("position_ids", np.arange(SEQ, dtype=np.int64)[None, :])
    pos = g.op("Gather", [g.uniform("pos_emb", (SEQ, HIDDEN), -1, 1), pos_ids])
    tok = g.op("Gather", [g.uniform("type_emb", (2, HIDDEN), -1, 1),
                          g.init("token_type_ids", np.zeros((1, SEQ), np.int64))])
    h = g.layer_norm_decomposed(g.op("Add", [g.op("Add", [emb, pos]), tok]), HIDDEN)

    # Extended mask (1 - mask[:, None, None, :]) * -10000, as in HF BERT.
    m4 = g.op("Unsqueeze", [g.op("Unsqueeze", [mask, g.const([1], np.int64)]),
                            g.const([2], np.int64)])
    m4 = g.op("Cast", [m4], to=F32)
    bias = g.op("Mul", [g.op("Sub", [g.const(1.0), m4]), g.const(-10000.0)])

    for layer in range(2):
        q = g.split_heads(g.linear(h, HIDDEN, HIDDEN), HEADS, HEAD_DIM, [0, 2, 1, 3])
        k = g.split_heads(g.linear(h, HIDDEN, HIDDEN), HEADS, HEAD_DIM, [0, 2, 3, 1])
        v = g.split_heads(g.linear(h, HIDDEN, HIDDEN), HEADS, HEAD_DIM, [0, 2, 1, 3])
        s = g.op("Div", [g.op("MatMul", [q, k]), g.const(math.sqrt(HEAD_DIM))])
        p = g.op("Softmax", [g.op("Add", [s, bias])], axis=-1)
        ctx = g.merge_heads(g.op("MatMul", [p, v]), h if layer == 0 else None,
                            HIDDEN)
        h = g.layer_norm(g.op("Add", [g.linear(ctx, HIDDEN, HIDDEN), h]), HIDDEN)
        f = g.linear(gelu_erf(g, g.linear(h, HIDDEN, FFN)), FFN, HIDDEN)
        h = g.layer_norm(g.op("Add", [f, h]), HIDDEN)
    h = g.output("last_hidden_state")

    # Pooler: first token -> dense -> tanh.
    first = g.op("Gather", [h, g.const(0, np.int64)], axis=1)
    w = g.weight("pool_w", (HIDDEN, HIDDEN), HIDDEN, gain=0.5)
    g.op("Tanh", [g.op("Gemm", [first, w, g.uniform("pool_b", (HIDDEN,), -0.1, 0.1)])])
    g.output("pooler_output")
    m = g.model("bert_block",
                [helper.make_tensor_value_info(ids, I64, [BATCH, SEQ]),
                 helper.make_tensor_value_info(mask, I64, [BATCH, SEQ])],
                [helper.make_tensor_value_info("last_hidden_state", F32,
                                               [BATCH, SEQ, HIDDEN]),
                 helper.make_tensor_value_info("pooler_output", F32, [BATCH, HIDDEN])],
                17)
    rng = np.random.default_rng(5)
    am = np.ones((BATCH, SEQ), np.int64)
    am[1, SEQ - 3:] = 0  # padding in the second sequence
    feeds = {ids: rng.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int64), mask: am}
    return m, feeds


def bert_dynamic():
    m, feeds = bert_block()
    for v in [*m.graph.input, *m.graph.output]:
        dims = v.type.tensor_type.shape.dim
        dims[0].dim_param = "batch"
        if dims[1].dim_value == SEQ:
            dims[1].dim_param = "sequence"
    onnx.checker.check_model(m, full_check=True)
    args = []
    for name, a in feeds.items():
        args += ["--shape", "%s=%s" % (name, ",".join(map(str, a.shape)))]
    return m, feeds, args


def gpt2_block():
    g = Graph(124)
    ids = "input_ids"
    wte = g.rng.uniform(-1, 1, (VOCAB, HIDDEN)).astype(np.float32)
    emb = g.op("Gather", [g.init("wte", wte), ids], axis=0)
    # position_ids = arange(seq_len)[None], seq_len from Shape, as HF exports.
    seq = g.op("Gather", [g.op("Shape", [ids]), g.const(1, np.int64)], axis=0)
    pos_ids = g.op("Unsqueeze", [g.op("Range", [g.const(0, np.int64), seq,
                                                g.const(1, np.int64)]),
                                 g.const([0], np.int64)])
    h = g.op("Add", [emb, g.op("Gather", [g.uniform("wpe", (SEQ, HIDDEN), -1, 1),
                                          pos_ids], axis=0)])

    # Causal mask: lower triangle of ones(S, S) -> bool.
    seq1 = g.op("Unsqueeze", [seq, g.const([0], np.int64)])
    ones = g.op("ConstantOfShape", [g.op("Concat", [seq1, seq1], axis=0)],
                value=numpy_helper.from_array(np.ones(1, np.float32)))
    causal = g.op("Cast", [g.op("Trilu", [ones], upper=0)], to=TensorProto.BOOL)
    neg = g.const(np.finfo(np.float32).min)

    for _ in range(2):
        a = g.layer_norm(h, HIDDEN)
        q, k, v = g.op("Split", [g.linear(a, HIDDEN, 3 * HIDDEN),
                                 g.const([HIDDEN] * 3, np.int64)], nout=3, axis=2)
        # HF GPT-2's _split_heads / _merge_heads: x.size()[:-1] + (heads, hd).
        heads = g.const([HEADS, HEAD_DIM], np.int64)
        q, k, v = (g.op("Reshape", [t, g.op("Concat", [g.shape_prefix(t, -1), heads],
                                           axis=0)]) for t in (q, k, v))
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        s = g.op("Div", [g.op("MatMul", [q, k]), g.const(math.sqrt(HEAD_DIM))])
        p = g.op("Softmax", [g.op("Where", [causal, s, neg])], axis=-1)
        t = g.op("Transpose", [g.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [t, g.op("Concat", [g.shape_prefix(t, -2),
                                                  g.const([HIDDEN], np.int64)], axis=0)])
        h = g.op("Add", [h, g.linear(ctx, HIDDEN, HIDDEN)])
        f = g.linear(gelu_tanh(g, g.linear(g.layer_norm(h, HIDDEN), HIDDEN, FFN)),
                     FFN, HIDDEN)
        h = g.op("Add", [h, f])
    h = g.layer_norm(h, HIDDEN)
    # Tied LM head: the exporter folds wte^T into its own initializer.
    g.op("MatMul", [h, g.init("lm_head_w", np.ascontiguousarray(wte.T))])
    g.output("logits")
    m = g.model("gpt2_block", [helper.make_tensor_value_info(ids, I64, [1, SEQ])],
                [helper.make_tensor_value_info("logits", F32, [1, SEQ, VOCAB])], 17)
    feeds = {ids: np.random.default_rng(7).integers(0, VOCAB, (1, SEQ),
                                                    dtype=np.int64)}
    return m, feeds


CRNN_HIDDEN, CRNN_CLASSES = 32, 12
INT64_MAX = np.iinfo(np.int64).max


def crnn():
    """A text-line recognizer as torch.onnx.export writes a CRNN: conv stack
    (Conv+BatchNorm+Relu, MaxPool), the feature map folded into a sequence
    (view from Shape, permute), a bidirectional LSTM, a linear head and
    log_softmax.  The exporter's idioms: the batch dim declared as -1,
    `x[1:]` and `x[:, :, 1:]` as Slices whose ends are INT64_MAX Constants,
    Constant-node Slice/Reshape arguments, output names with dots."""
    g = Graph(31)
    x = "input.1"
    y = g.op("Relu", [g.conv_bn(x, 1, 16, 3)])
    y = g.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])          # 16x16x48
    y = g.op("Relu", [g.conv_bn(y, 16, 32, 3)])
    y = g.op("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])          # 32x8x24
    y = g.op("Relu", [g.conv_bn(y, 32, 32, 3)])
    y = g.op("MaxPool", [y], kernel_shape=[2, 1], strides=[2, 1])          # 32x4x24
    # the width columns from the second on: x[:, :, :, 1:]
    y = g.op("Slice", [y, g.const([1], np.int64), g.const([INT64_MAX], np.int64),
                       g.const([3], np.int64), g.const([1], np.int64)])    # 32x4x23
    # b, c, h, w = y.size(); y.view(b, c * h, w).permute(2, 0, 1)
    b = g.dims(y, 0)
    seq = g.op("Reshape", [y, g.op("Concat", [b, g.const([128, -1], np.int64)], axis=0)])
    seq = g.op("Transpose", [seq], perm=[2, 0, 1])                         # T, B, 128
    h = CRNN_HIDDEN
    w = g.weight("lstm_W", (2, 4 * h, 128), 128, 0.5)
    r = g.weight("lstm_R", (2, 4 * h, h), h, 0.5)
    bias = g.uniform("lstm_B", (2, 8 * h), -0.1, 0.1)
    out = g.op("LSTM", [seq, w, r, bias], nout=3, hidden_size=h, direction="bidirectional")[0]
    out = g.op("Transpose", [out], perm=[0, 2, 1, 3])                      # T, B, 2, h
    out = g.op("Reshape", [out, g.const([0, 0, -1], np.int64)])            # T, B, 2h
    out = g.op("Slice", [out, g.const([1], np.int64), g.const([INT64_MAX], np.int64),
                         g.const([0], np.int64)])                          # x[1:]
    logits = g.linear(out, 2 * h, CRNN_CLASSES)
    g.op("LogSoftmax", [logits], axis=2)
    g.output("log_probs.0")
    batch = 2
    m = g.model("crnn", [helper.make_tensor_value_info(x, F32, [-1, 1, 32, 96])],
                [helper.make_tensor_value_info("log_probs.0", F32, [22, -1, CRNN_CLASSES])], 13)
    feeds = {x: np.random.default_rng(5).standard_normal((batch, 1, 32, 96)).astype(np.float32)}
    # the -1 is a symbolic dim named after the input; bound by name
    return m, feeds, ["--dim", "input.1_dim0=%d" % batch]


def se_net():
    """Squeeze-and-excitation blocks (SE-ResNet's, MobileNetV3's): each
    block's features scaled per channel by a gate computed from their own
    global average: GlobalAveragePool -> 1x1 Conv -> Relu -> 1x1 Conv ->
    Sigmoid (HardSigmoid in the last block, as MobileNetV3) -> Mul, then a
    residual Add and Relu."""
    g = Graph(31)
    x = "input"
    y = g.op("Relu", [g.conv_bn(x, 3, 32, 3, stride=2)])
    c = 32
    for i, (cout, stride) in enumerate([(32, 1), (64, 2), (64, 1)]):
        h = g.op("Relu", [g.conv_bn(y, c, cout, 3, stride)])
        h = g.conv_bn(h, cout, cout, 3)
        pooled = g.op("GlobalAveragePool", [h])
        sq = g.op("Relu", [g.op("Conv", [pooled, g.weight("se_w1", (cout // 4, cout, 1, 1), cout),
                                         g.uniform("se_b1", (cout // 4,), -0.1, 0.1)],
                                kernel_shape=[1, 1])])
        ex = g.op("Conv", [sq, g.weight("se_w2", (cout, cout // 4, 1, 1), cout // 4),
                           g.uniform("se_b2", (cout,), -0.1, 0.1)], kernel_shape=[1, 1])
        gate = g.op("HardSigmoid", [ex], alpha=1.0 / 6, beta=0.5) if i == 2 else g.op("Sigmoid", [ex])
        h = g.op("Mul", [h, gate])
        short = y if stride == 1 and c == cout else g.conv_bn(y, c, cout, 1, stride)
        y = g.op("Relu", [g.op("Add", [h, short])])
        c = cout
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y])], axis=1)
    g.gemm_head(y, c, 10)
    g.output("logits")
    m = g.model("se_net", [helper.make_tensor_value_info(x, F32, [2, 3, 32, 32])],
                [helper.make_tensor_value_info("logits", F32, [2, 10])], 13)
    feeds = {x: np.random.default_rng(31).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    return m, feeds


def fpn():
    """An FPN-style neck, as detectors and OCR text detectors (DBNet) have:
    a backbone of three stride-2 stages, 1x1 lateral convolutions, a
    top-down path adding each level to the nearest-neighbour upsampling
    (Resize) of the one above, and the levels upsampled to the finest and
    concatenated along channels before a 3x3 head and a ConvTranspose
    (with batch norm and relu) back to the input's size, as DBNet's."""
    g = Graph(37)
    x = "image"
    feats, y, c = [], x, 3
    for cout in (16, 32, 64):
        y = g.op("Relu", [g.conv_bn(y, c, cout, 3, stride=2)])
        feats.append((y, cout))
        c = cout
    lat = [g.op("Conv", [f, g.weight("lat_w", (32, cf, 1, 1), cf), g.uniform("lat_b", (32,), -0.1, 0.1)],
                kernel_shape=[1, 1]) for f, cf in feats]
    empty = g.init("roi", np.zeros((0,), np.float32))

    def up(v, k):
        sc = g.init("scales", np.array([1, 1, k, k], np.float32))
        return g.op("Resize", [v, empty, sc], mode="nearest",
                    coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    p3 = lat[2]
    p2 = g.op("Add", [lat[1], up(p3, 2)])
    p1 = g.op("Add", [lat[0], up(p2, 2)])
    cat = g.op("Concat", [p1, up(p2, 2), up(p3, 4)], axis=1)
    head = g.op("Relu", [g.conv_bn(cat, 96, 32, 3)])
    # DBNet's head: a ConvTranspose back to the input's size, with its
    # batch norm and relu
    up2 = g.op("ConvTranspose", [head, g.weight("deconv_w", (32, 16, 2, 2), 32),
                                 g.uniform("deconv_b", (16,), -0.1, 0.1)], kernel_shape=[2, 2],
               strides=[2, 2])
    up2 = g.op("Relu", [g.op("BatchNormalization", [
        up2, g.uniform("bn_scale", (16,), 0.5, 1.5), g.uniform("bn_bias", (16,), -0.2, 0.2),
        g.uniform("bn_mean", (16,), -0.2, 0.2), g.uniform("bn_var", (16,), 0.5, 2.0)], epsilon=1e-5)])
    g.op("Sigmoid", [g.op("Conv", [up2, g.weight("head_w", (2, 16, 1, 1), 16),
                                   g.uniform("head_b", (2,), -0.1, 0.1)], kernel_shape=[1, 1])])
    g.output("maps")
    m = g.model("fpn", [helper.make_tensor_value_info(x, F32, [1, 3, 64, 64])],
                [helper.make_tensor_value_info("maps", F32, [1, 2, 64, 64])], 13)
    feeds = {x: np.random.default_rng(37).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    return m, feeds


MODELS = {"resnet18": resnet18, "mobilenetv2": mobilenetv2,
          "bert_block": bert_block, "bert_dynamic": bert_dynamic,
          "gpt2_block": gpt2_block, "crnn": crnn}


def reference(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, sess.run(names, feeds)


MODELS["detector"] = detector
MODELS["se_net"] = se_net
MODELS["fpn"] = fpn


def write(outdir, name, model, feeds, args=None):
    folder = os.path.join(outdir, name)
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    onnx.save(model, os.path.join(folder, "model.onnx"))
    if args:
        with open(os.path.join(folder, "args.json"), "w") as f:
            json.dump(args, f)
    for k, inp in enumerate(model.graph.input):
        t = numpy_helper.from_array(feeds[inp.name], inp.name)
        with open(os.path.join(data, "input_%d.pb" % k), "wb") as f:
            f.write(t.SerializeToString())
    names, outs = reference(model, feeds)
    for k, (n, y) in enumerate(zip(names, outs)):
        with open(os.path.join(data, "output_%d.pb" % k), "wb") as f:
            f.write(numpy_helper.from_array(y, n).SerializeToString())


def build(outdir, only=""):
    """Build every model whose name contains `only`; returns the names."""
    done = []
    for name, make in MODELS.items():
        if only in name:
            write(outdir, name, *make())
            done.append(name)
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("-k", dest="filter", default="",
                    help="only models whose name contains this")
    args = ap.parse_args()
    for name in build(args.outdir, args.filter):
        print("wrote", os.path.join(args.outdir, name))


if __name__ == "__main__":
    main()
