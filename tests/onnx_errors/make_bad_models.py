#!/usr/bin/env python3
"""Write malformed ONNX models, one folder each, with the text that kiln's
error must contain in expect.txt.  Usage: make_bad_models.py OUTDIR"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, check=False):
    g = helper.make_graph(nodes, "bad", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if check:
        onnx.checker.check_model(m)
    return m


def raw_tensor(name, dims, raw):
    """A TensorProto built by hand: onnx.helper refuses inconsistent ones."""
    t = TensorProto()
    t.name, t.data_type = name, F
    t.dims.extend(dims)
    t.raw_data = raw
    return t


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def write(name, expect, data=None, m=None, extra=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    if m is not None:
        data = m.SerializeToString()
    with open(os.path.join(d, "model.onnx"), "wb") as f:
        f.write(data)
    with open(os.path.join(d, "expect.txt"), "w") as f:
        f.write(expect)
    for fname, blob in (extra or {}).items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(blob)


relu = lambda i, o: helper.make_node("Relu", [i], [o], name="r_" + o)
good = model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
             [vi("x", [1000])], [vi("y", [1000])],
             [numpy_helper.from_array(np.ones(1000, np.float32), "w")], check=True)
blob = good.SerializeToString()

write("truncated", "not an ONNX model", data=blob[: len(blob) // 2])
write("not_protobuf", "not an ONNX model", data=b"\xff\xff\xff\xff this is not protobuf")
write("empty_file", "no graph", data=b"")
# an exporter's -1 is a symbolic dim, named after the input and its place
write("negative_dim", "input 'x' is declared f32[2, x_dim1], with symbolic dims: bind them with "
      "--shape x=d0,d1,... or --dim x_dim1=N",
      m=model([relu("x", "y")], [vi("x", [2, -3])], [vi("y", [2, -3])]))
big = raw_tensor("w", [1 << 40, 1 << 40], b"")
write("overflowing_dims", "more than 2147483647 elements",
      m=model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [1])], [vi("y", [1])], [big]))
write("two_gb_input", "more than 2147483647 elements",
      m=model([relu("x", "y")], [vi("x", [65536, 65536])], [vi("y", [65536, 65536])]))
bad_raw = raw_tensor("w", [4], b"\0" * 12)
write("raw_data_wrong_size", "raw_data has 12 bytes",
      m=model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [4])], [vi("y", [4])], [bad_raw]))
short = raw_tensor("w", [4], b"")
short.ClearField("raw_data")
short.float_data.extend([1.0, 2.0])
write("typed_data_wrong_count", "holds 2 values",
      m=model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [4])], [vi("y", [4])], [short]))
write("cycle", "cycle",
      m=model([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                helper.make_node("Relu", ["a"], ["b"], name="n2")], [vi("x", [2])], [vi("b", [2])]))
write("dangling_input", "'ghost' is not produced",
      m=model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [vi("x", [2])],
              [vi("y", [2])]))
write("duplicate_outputs", "listed twice",
      m=model([relu("x", "y")], [vi("x", [2])], [vi("y", [2]), vi("y", [2])]))
write("output_produced_twice", "produced twice",
      m=model([relu("x", "y"), relu("x", "y")], [vi("x", [2])], [vi("y", [2])]))
write("no_outputs", "no outputs", m=model([relu("x", "y")], [vi("x", [2])], []))
write("no_opset", "imports no opset",
      m=helper.make_model(helper.make_graph([relu("x", "y")], "g", [vi("x", [2])], [vi("y", [2])]),
                          opset_imports=[helper.make_opsetid("com.example", 1)]))
write("opset_too_new", "imports opset 99 of domain 'ai.onnx'; Kiln reads opsets up to",
      m=model([relu("x", "y")], [vi("x", [2])], [vi("y", [2])], opset=99))
write("ml_opset_too_new", "imports opset 7 of domain 'ai.onnx.ml'",
      m=helper.make_model(helper.make_graph([relu("x", "y")], "g", [vi("x", [2])], [vi("y", [2])]),
                          opset_imports=[helper.make_opsetid("", 17),
                                         helper.make_opsetid("ai.onnx.ml", 7)]))
I64 = TensorProto.INT64
i64max = np.iinfo(np.int64).max
# a 64-bit constant a node reads must be exact as a double: named at that node
write("i64_constant_beyond_2p53",
      "node 'add_big' (Add): i64 constant 'big' holds 9223372036854775807 at element 1, beyond 2^53",
      m=model([helper.make_node("Add", ["x", "big"], ["y"], name="add_big")],
              [vi("x", [2], I64)], [vi("y", [2], I64)],
              [numpy_helper.from_array(np.array([1, i64max], np.int64), "big")]))
# ... but a Slice bound of INT64_MAX (PyTorch's x[:, 1:]) is "to the end": it runs
write("slice_int64_max_ends", "",
      m=model([helper.make_node("Constant", [], ["ends"], name="const_25",
                                value=numpy_helper.from_array(np.array([i64max], np.int64))),
               helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"], name="Slice_7")],
              [vi("x", [2, 5])], [vi("y", [2, 4])],
              [numpy_helper.from_array(np.array([1], np.int64), "starts"),
               numpy_helper.from_array(np.array([1], np.int64), "axes")], check=True))
# ... and so is Clip's max of INT64_MAX on an i64 tensor (no bound)
write("clip_int64_max_bound", "",
      m=model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clamp_long")],
              [vi("x", [3], I64)], [vi("y", [3], I64)],
              [numpy_helper.from_array(np.array(0, np.int64), "lo"),
               numpy_helper.from_array(np.array(i64max, np.int64), "hi")], check=True))
write("unsupported_listed_at_once", "2 unsupported nodes",
      m=model([helper.make_node("StringNormalizer", ["x"], ["a"], name="first_bad"),
                helper.make_node("Relu", ["a"], ["b"], name="fine"),
                helper.make_node("RegexFullMatch", ["b"], ["y"], name="second_bad")],
               [vi("x", [2])], [vi("y", [2])]))
write("symbolic_dim_unbound", "--shape x=",
      m=model([relu("x", "y")], [vi("x", ["batch", 3])], [vi("y", ["batch", 3])]))
write("sequence_input", "not a tensor",
      m=model([relu("x", "y")],
              [helper.make_tensor_sequence_value_info("x", F, [2])], [vi("y", [2])]))
write("declared_output_mismatch", "declared f32[3] but computes to f32[2]",
      m=model([relu("x", "y")], [vi("x", [2])], [vi("y", [3])]))

vi_model = model([relu("x", "h"), relu("h", "y")], [vi("x", [2, 3])], [vi("y", [2, 3])])
vi_model.graph.value_info.append(vi("h", [2, 4]))
write("value_info_mismatch", "value 'h' has rank 2 or dims in value_info that differ",
      m=vi_model)

# Attention and RotaryEmbedding: inputs that do not fit name the node
def attention(ins, attrs, shapes, opset=23):
    return model([helper.make_node("Attention", ins, ["y"], name="attn", **attrs)],
                 [vi(n, sh) for n, sh in zip(ins, shapes) if n], [vi("y", [1])], opset=opset)


write("attention_heads_not_dividing", "do not fit",
      m=attention(["q", "k", "v"], {}, [[1, 3, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8]]))
write("attention_3d_no_heads", "Q's hidden size 8 is not a multiple of its head count 0",
      m=attention(["q", "k", "v"], {}, [[1, 4, 8], [1, 4, 8], [1, 4, 8]]))
write("attention_past_key_alone", "past_key and past_value must be given together",
      m=attention(["q", "k", "v", "", "pk"], {}, [[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8],
                                                 None, [1, 2, 3, 8]]))
write("attention_mask_too_long", "at most 4 keys",
      m=attention(["q", "k", "v", "m"], {}, [[1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], [4, 6]]))
write("rotary_bad_cache", "must be x's dtype and [2, 3, 4]",
      m=model([helper.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"], name="rope")],
              [vi("x", [2, 4, 3, 8]), vi("c", [2, 3, 3]), vi("s", [2, 3, 3])], [vi("y", [1])],
              opset=23))


# LpNormalization and GroupNormalization: bad attributes, and good ones
lp = lambda p: model([helper.make_node("LpNormalization", ["x"], ["y"], name="lp", p=p)],
                     [vi("x", [2, 3])], [vi("y", [2, 3])], opset=22)
write("lp_norm_p3", "node 'lp' (LpNormalization): p must be 1 or 2, got 3", m=lp(3))
write("lp_norm_good", "", m=lp(1))
gn = lambda groups, c, opset: model(
    [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn",
                      num_groups=groups)],
    [vi("x", [1, 6, 2]), vi("s", [c]), vi("b", [c])], [vi("y", [1, 6, 2])], opset=opset)
write("group_norm_groups", "node 'gn' (GroupNormalization): num_groups 4 does not divide the 6 channels",
      m=gn(4, 6, 21))
write("group_norm_scale", "scale and bias must have 6 elements (one per channel)", m=gn(3, 3, 21))
write("group_norm_good_18", "", m=gn(3, 3, 18))
write("group_norm_good_21", "", m=gn(3, 6, 21))

# TensorScatter, MaxUnpool, MaxPool's indices
I64 = TensorProto.INT64
ts = lambda mode, upd: model(
    [helper.make_node("TensorScatter", ["p", "u", "w"], ["y"], name="ts", mode=mode)],
    [vi("p", [2, 1, 4, 3]), vi("u", upd), vi("w", [2], I64)], [vi("y", [2, 1, 4, 3])], opset=24)
write("tensor_scatter_mode", "node 'ts' (TensorScatter): mode must be linear or circular",
      m=ts("ring", [2, 1, 2, 3]))
write("tensor_scatter_long", "update has 5 rows along axis 2, the cache 4", m=ts("linear", [2, 1, 5, 3]))
write("tensor_scatter_good", "", m=ts("circular", [2, 1, 2, 3]))
mu = lambda ishape, tshape: model(
    [helper.make_node("MaxUnpool", ["x", "i"], ["y"], name="mu", kernel_shape=[2, 2],
                      strides=[2, 2])],
    [vi("x", [1, 1, 2, 2]), vi("i", ishape, tshape)], [vi("y", [1, 1, 4, 4])], opset=22)
write("max_unpool_indices", "node 'mu' (MaxUnpool): indices must be i64 of x's shape",
      m=mu([1, 1, 2, 2], TensorProto.INT32))
write("max_unpool_good", "", m=mu([1, 1, 2, 2], I64))
mp = lambda order: model(
    [helper.make_node("MaxPool", ["x"], ["y", "i"], name="mp", kernel_shape=[2, 2],
                      storage_order=order)],
    [vi("x", [1, 2, 4, 4])], [vi("y", [1, 2, 3, 3]), vi("i", [1, 2, 3, 3], I64)], opset=12)
write("max_pool_storage_order", "node 'mp' (MaxPool): storage_order must be 0 or 1, got 2", m=mp(2))
write("max_pool_indices_good", "", m=mp(1))
tf = lambda idx: model(
    [helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="tf", mode="TF", min_gram_length=1,
                      max_gram_length=2, max_skip_count=1, pool_int64s=[1, 2, 3, 1, 2],
                      ngram_counts=[0, 3], ngram_indexes=idx)],
    [vi("x", [2, 6], I64)], [vi("y", [2, 4])], opset=9)
write("tfidf_indexes", "node 'tf' (TfIdfVectorizer): tfidf (node 'tf'): ngram_indexes has 3 entries for 4 n-grams",
      m=tf([0, 1, 2]))
write("tfidf_good", "", m=tf([0, 1, 2, 3]))

# 4- and 2-bit tensors are packed in the file (two or four a byte)
def packed(name, dtype, dims, raw=None, int32=None):
    t = TensorProto()
    t.name, t.data_type = name, dtype
    t.dims.extend(dims)
    if raw is not None:
        t.raw_data = raw
    else:
        t.int32_data.extend(int32)
    return t


cast_w = lambda: helper.make_node("Cast", ["w"], ["y"], to=F)
write("int4_raw_wrong_size", "raw_data has 2 bytes, but i4[5] packed 2 a byte needs 3",
      m=model([cast_w()], [], [vi("y", [5])], [packed("w", TensorProto.INT4, [5], b"\x12\x34")],
              opset=21))
write("uint2_int32_data_wrong_size", "int32_data holds 1 packed bytes, but u2[5] packed 4 a byte needs 2",
      m=model([cast_w()], [], [vi("y", [5])], [packed("w", TensorProto.UINT2, [5], int32=[7])],
              opset=25))
write("bitcast_width", "bitcast needs types of one width: f32 has 32 bits, i16 16",
      m=model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT16)],
              [vi("x", [2])], [vi("y", [2], TensorProto.INT16)], opset=26))
write("cast_round_mode", "round_mode must be \"up\", \"down\" or \"nearest\"",
      m=model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0,
                                round_mode="sideways")],
              [vi("x", [2])], [vi("y", [2], TensorProto.FLOAT8E8M0)], opset=24))


def external(name, location, offset, length, expect, fbytes=b"\0" * 16):
    t = raw_tensor("w", [4], b"")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [4])], [vi("y", [4])], [t])
    write(name, expect, m=m, extra={"weights.bin": fbytes})


external("external_escapes_folder", "../weights.bin", 0, 16, "leaves the model's folder")
external("external_absolute_path", "/etc/passwd", 0, 16, "absolute path")
external("external_past_end", "weights.bin", 8, 16, "past its end")
external("external_missing_file", "nope.bin", 0, 16, "cannot open external data")
external("external_good", "weights.bin", 0, 16, "")  # must load and run


# spatial ops: attributes and constant inputs that do not fit the input
I64 = TensorProto.INT64


def ints(name, vals):
    return numpy_helper.from_array(np.array(vals, np.int64), name)


def one_node(op, ins, attrs, x_shape, inits, opset, y_shape=None):
    node = helper.make_node(op, ["x"] + ins, ["y"], name="n_" + op.lower(), **attrs)
    return model([node], [vi("x", x_shape)], [vi("y", y_shape or x_shape)], inits, opset=opset)


write("resize_axes_out_of_range", "axes[1] = 4 is out of range",
      m=one_node("Resize", ["", "", "sizes"], {"axes": [2, 4]}, [1, 1, 4, 4],
                 [ints("sizes", [2, 2])], 18))
write("resize_axes_sizes_count", "one entry (roi: two) per axis in axes",
      m=one_node("Resize", ["", "", "sizes"], {"axes": [2, 3]}, [1, 1, 4, 4],
                 [ints("sizes", [1, 1, 2, 2])], 18))
write("resize_bad_aspect_policy", "keep_aspect_ratio_policy must be",
      m=one_node("Resize", ["", "", "sizes"], {"keep_aspect_ratio_policy": "fit"},
                 [1, 1, 4, 4], [ints("sizes", [1, 1, 2, 2])], 18))
write("center_crop_pad_shape_count", "shape has 3 entries for 2 axes",
      m=one_node("CenterCropPad", ["s"], {"axes": [0, 1]}, [4, 4, 3],
                 [ints("s", [2, 2, 2])], 18))
write("col2im_shape_counts", "one entry per spatial axis",
      m=one_node("Col2Im", ["img", "blk"], {}, [1, 4, 9],
                 [ints("img", [4, 4]), ints("blk", [2])], 18))
write("affine_grid_bad_theta", "theta must be float [1, 2, 3]",
      m=one_node("AffineGrid", ["size"], {}, [1, 3, 3],
                 [ints("size", [1, 1, 4, 4])], 20))
write("deform_conv_3d", "only 2-D DeformConv",
      m=model([helper.make_node("DeformConv", ["x", "w", "o"], ["y"], name="dc")],
              [vi("x", [1, 1, 3, 3, 3]), vi("w", [1, 1, 1, 1, 1]), vi("o", [1, 3, 3, 3, 3])],
              [vi("y", [1, 1, 3, 3, 3])], opset=19))
write("roi_align_bad_mode", "mode must be one of",
      m=model([helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], name="ra", mode="median")],
              [vi("x", [1, 1, 4, 4]), vi("r", [2, 4]), vi("b", [2], I64)],
              [vi("y", [2, 1, 1, 1])], opset=16))
print("wrote", len(os.listdir(out)), "models to", out)

# signal: DFT and CausalConvWithState
def floats(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


write("dft_bad_length", "dft_length must be positive, got 0",
      m=one_node("DFT", ["len"], {}, [1, 8, 1], [ints("len", 0)], 20, [1, 8, 2]))
write("dft_last_axis", "other than the last",
      m=one_node("DFT", ["", "ax"], {}, [1, 8, 1], [ints("ax", -1)], 20, [1, 8, 2]))
write("causal_conv_bad_activation", 'activation must be "none", "silu" or "swish", got "relu"',
      m=one_node("CausalConvWithState", ["w"], {"activation": "relu"}, [1, 2, 4],
                 [floats("w", np.ones((2, 1, 3)))], 27))
write("causal_conv_bad_past_state", "(CausalConvWithState): past_state must be [1, 2, 2]",
      m=one_node("CausalConvWithState", ["w", "", "p"], {}, [1, 2, 4],
                 [floats("w", np.ones((2, 1, 3))), floats("p", np.zeros((1, 2, 1)))], 27))
write("stft_frame_too_long", "frame_length 16 must be within [1, 8]",
      m=model([helper.make_node("STFT", ["x", "st", "", "fl"], ["y"], name="stft")],
              [vi("x", [1, 8, 1])], [vi("y", [1, 1, 9, 2])], [ints("st", 4), ints("fl", 16)]))
write("mel_edges_reversed", "0 <= lower_edge_hertz < upper_edge_hertz",
      m=model([helper.make_node("MelWeightMatrix", ["nm", "dl", "sr", "lo", "hi"], ["y"],
                                name="mel")], [], [vi("y", [9, 8])],
              [ints("nm", 8), ints("dl", 16), ints("sr", 8192), floats("lo", 1000.0),
               floats("hi", 10.0)]))
