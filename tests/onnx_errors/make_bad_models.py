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
