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
write("negative_dim", "negative", m=model([relu("x", "y")], [vi("x", [2, -3])], [vi("y", [2, -3])]))
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
print("wrote", len(os.listdir(out)), "models to", out)
