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
                helper.make_node("TfIdfVectorizer", ["b"], ["y"], name="second_bad")],
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
print("wrote", len(os.listdir(out)), "models to", out)
