#!/usr/bin/env python3
"""Write the node test cases that the installed onnx package defines (as
Python, in onnx.backend.test.case.node) as test directories in the layout
of ONNX's backend test data: OUT/node/test_NAME/model.onnx and
test_data_set_K/{input,output}_J.pb.  The expected outputs are what those
cases computed with ONNX's reference implementation.

usage: gen_node_suite.py OUT [--stamp FILE]

--stamp FILE is touched when OUT is ready (a build system's output).  The
cases are written into a stamp-checked cache: when OUT/STAMP names the
same onnx version, nothing is redone.  Only tensor-typed inputs and
outputs are written; a case with a sequence, map or optional is written
without data sets (the runner reports it as out of scope)."""
import os
import shutil
import sys
import warnings

import numpy as np

# The expected-pass list (tests/conformance/expected_pass_onnx_node.txt)
# is for the cases of this release; scripts/setup.sh pins it.
PINNED = "1.23.2"


def write_value(path, value, name):
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        data = value.SerializeToString()
    else:
        data = numpy_helper.from_array(np.asarray(value), name).SerializeToString()
    with open(path, "wb") as f:
        f.write(data)


def is_tensor(value_info):
    return value_info.type.HasField("tensor_type")


def main():
    args = sys.argv[1:]
    touch = None
    if len(args) == 3 and args[1] == "--stamp":
        touch = args[2]
    elif len(args) != 1:
        sys.exit("usage: gen_node_suite.py OUT [--stamp FILE]")
    out = args[0]
    generate(out)
    if touch:
        open(touch, "w").close()


def generate(out):
    try:
        import onnx
        from onnx.backend.test.case import node
    except ImportError as e:
        sys.exit(f"gen_node_suite: {e}; scripts/setup.sh installs onnx into .venv")
    if onnx.__version__ != PINNED:
        sys.exit(f"gen_node_suite: onnx {onnx.__version__} is installed; the suite and its "
                 f"expected-pass list are for onnx {PINNED} (scripts/setup.sh installs it)")

    stamp_path = os.path.join(out, "STAMP")
    stamp = f"onnx {onnx.__version__}\n"
    if os.path.exists(stamp_path) and open(stamp_path).read() == stamp:
        print(f"gen_node_suite: {out} is up to date ({stamp.strip()})")
        return
    if os.path.exists(out):
        shutil.rmtree(out)
    warnings.simplefilter("ignore")
    with np.errstate(all="ignore"):
        cases = node.collect_testcases(None)
    written = 0
    for case in cases:
        model = case.model
        test_dir = os.path.join(out, "node", case.name)
        os.makedirs(test_dir)
        with open(os.path.join(test_dir, "model.onnx"), "wb") as f:
            f.write(model.SerializeToString())
        graph = model.graph
        if not all(is_tensor(v) for v in list(graph.input) + list(graph.output)):
            continue  # sequences, maps, optionals: no tensor data to write
        for k, (inputs, outputs) in enumerate(case.data_sets):
            set_dir = os.path.join(test_dir, f"test_data_set_{k}")
            os.makedirs(set_dir)
            for j, value in enumerate(inputs):
                write_value(os.path.join(set_dir, f"input_{j}.pb"), value, graph.input[j].name)
            for j, value in enumerate(outputs):
                write_value(os.path.join(set_dir, f"output_{j}.pb"), value, graph.output[j].name)
        written += 1
    with open(stamp_path, "w") as f:
        f.write(stamp)
    print(f"gen_node_suite: {len(cases)} cases ({written} with tensor data) into {out}")


if __name__ == "__main__":
    main()
