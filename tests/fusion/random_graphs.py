#!/usr/bin/env python3
"""random_graphs.py - the fusion property test: random graphs, compiled
fused and unfused for the host device, must both equal the interpreter.

    random_graphs.py KILN [--count N] [--seed S] [-j JOBS] [--nvrtc]

Each graph mixes elementwise ops (the ones fusion groups), broadcasts of
row and column operands, casts through f16 and i32, comparisons feeding
`where`, reductions over rows (alone, and spelled-out softmax and layer
norm: row groups; rows of two axes too), GEMMs with a bias, residual and relu after them (the
GEMM's epilogue), splits and transposes GEMMs read in place, batched
head-style products with a transposed result, attention (softmax between
two GEMMs, with masks, scales and casts around it), direct convolutions with
sibling convolutions and an epilogue, concats (written in place by their
pieces' kernels when contiguous), and nodes fusion cannot take, so
groups must form around them without cycles.  Several values are outputs,
some from inside would-be groups.  Prints PASS/FAIL per graph and ends
with `N passed, N failed`."""
import argparse
import concurrent.futures
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

UNARY = ["relu", "tanh", "sigmoid", "neg", "abs", "gelu", "silu"]
BINARY = ["+", "-", "*", "maximum", "minimum"]


def make_graph(seed):
    rnd = random.Random(seed)
    rows, cols = rnd.randint(1, 9), rnd.randint(1, 40)
    lines = [f"model g{seed}", f"dim R = {rows}", f"dim C = {cols}",
             "input x: f32[R, C]", "input y: f32[R, C]", "input col: f32[C]",
             "input row: f32[R, 1]", "param w: f32[C, C] = randn(0.3, seed=2)",
             "param wk: f32[1, 1, 3, 3] = randn(0.4, seed=3)",
             "param wk1: f32[1, 1, 1, 1] = randn(0.6, seed=4)", "param bk: f32[1] = randn(0.2, seed=5)"]
    full = ["x", "y"]          # [R, C] values
    side = ["col", "row"]      # values that broadcast into [R, C]
    n = 0

    def fresh():
        nonlocal n
        n += 1
        return f"t{n}"

    for _ in range(rnd.randint(3, 24)):
        kind = rnd.random()
        a = rnd.choice(full)
        t = fresh()
        if rnd.random() < 0.15:  # GEMMs and convolutions with what fuses into them
            b = rnd.choice(full)
            pick = rnd.randrange(6)
            if pick == 0:  # bias, residual, relu: the GEMM's epilogue
                lines.append(f"let {t} = relu({a} @ w + col + {b})")
            elif pick == 1:  # a split read in place, one operand transposed
                h = rnd.randint(1, cols)
                p, q = fresh(), fresh()
                if h == cols:
                    lines.append(f"let {t} = {a} + ({a} @ transpose({a}, perm=[1, 0])) @ {b} * 0.1")
                else:
                    lines.append(f"let {p}, {q} = split({a}, axis=1, sizes=[{h}, {cols - h}])")
                    lines.append(f"let {t} = {a} + ({p} @ transpose({p}, perm=[1, 0])) @ {b} * 0.1")
            elif pick == 2 and cols % 2 == 0:  # heads: batched views, a transposed result
                hh, s_ = fresh(), fresh()
                lines.append(f"let {hh} = transpose(reshape({a}, shape=[R, 2, {cols // 2}]), perm=[1, 0, 2])")
                lines.append(f"let {s_} = {hh} @ transpose({hh}, perm=[0, 2, 1])")
                lines.append(f"let {t} = reshape(transpose(tanh({s_}) @ {hh}, perm=[1, 0, 2]), shape=[R, C])")
            elif pick >= 4:  # attention: softmax(pre(Q @ K)) -> post -> @ V, one kernel
                pre = rnd.choice(["{s} * 0.3", "{s} * 0.3 + row", "cast(cast({s}, to=f16), to=f32)",
                                  "where(trilu(ones_rr, upper=false) > 0.5, {s} * 0.5, -1e9)",
                                  "{s} + transpose(row, perm=[1, 0]) * 2", "{s}"])
                post = rnd.choice(["{p}", "{p}", "cast(cast({p}, to=f16), to=f32)", "{p} * 0.9"])
                if "ones_rr" in pre and "const ones_rr: f32[R, R] = ones" not in lines:
                    lines.append("const ones_rr: f32[R, R] = ones")
                if pick == 4 and cols % 2 == 0:  # two heads, read through views
                    q, k, s_, p_ = fresh(), fresh(), fresh(), fresh()
                    lines.append(f"let {q} = transpose(reshape({a}, shape=[R, 2, {cols // 2}]), perm=[1, 0, 2])")
                    lines.append(f"let {k} = transpose(reshape({b}, shape=[R, 2, {cols // 2}]), perm=[1, 2, 0])")
                    lines.append(f"let {s_} = " + pre.format(s=f"({q} @ {k})"))
                    lines.append(f"let {p_} = " + post.format(p=f"softmax({s_}, axis=-1)"))
                    lines.append(f"let {t} = reshape(transpose({p_} @ {q}, perm=[1, 0, 2]), shape=[R, C])")
                else:  # one head: [R, C] operands, V another value
                    s_, p_ = fresh(), fresh()
                    lines.append(f"let {s_} = " + pre.format(s=f"({a} @ transpose({b}, perm=[1, 0]))"))
                    lines.append(f"let {p_} = " + post.format(p=f"softmax({s_}, axis=-1)"))
                    lines.append(f"let {t} = {p_} @ {rnd.choice(full)}")
            else:  # direct convolutions: siblings, their epilogue, a residual
                X = fresh()
                lines.append(f"let {X} = reshape({a}, shape=[1, 1, R, C])")
                lines.append(f"let {t} = reshape(relu(conv2d({X}, wk, pads=[1, 1, 1, 1]) * 0.5 + "
                             f"conv2d({X}, wk1, bk)) + reshape({b}, shape=[1, 1, R, C]), shape=[R, C])")
        elif kind < 0.30:
            lines.append(f"let {t} = {rnd.choice(UNARY)}({a})")
        elif kind < 0.62:
            b = rnd.choice(full + side)
            op = rnd.choice(BINARY)
            expr = f"{a} {op} {b}" if len(op) == 1 else f"{op}({a}, {b})"
            lines.append(f"let {t} = {expr}")
        elif kind < 0.70:
            lines.append(f"let {t} = {a} / (abs({rnd.choice(full + side)}) + 1)")
        elif kind < 0.76:
            lines.append(f"let {t} = cast(cast({a}, to=f16), to=f32)")
        elif kind < 0.80:
            lines.append(f"let {t} = cast(cast({a} * 4, to=i32), to=f32)")
        elif kind < 0.86:
            b, c = rnd.choice(full), rnd.choice(full + side)
            lines.append(f"let {t} = where({a} > {b}, {a}, {c})")
        elif kind < 0.87:  # a reduction, broadcast back: a row group
            red = rnd.choice(["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"])
            if cols % 2 == 0 and rnd.random() < 0.5:  # a row of two axes, mixed with one
                X = fresh()
                lines.append(f"let {X} = reshape({a}, shape=[R, 2, {cols // 2}])")
                inner = rnd.choice([f"{X} - {red}({X}, axes=[1, 2], keepdims=1) * 0.5 + "
                                    f"reduce_mean({X}, axes=[2], keepdims=1)",
                                    f"layer_norm({X} * 2.0, axis=1) + {X}",
                                    f"rms_norm({X}, axis=-2) * {red}({X}, axes=[-1, -2], keepdims=1)"])
                lines.append(f"let {t} = reshape({inner}, shape=[R, C])")
            else:
                lines.append(f"let {t} = {rnd.choice(full)} + {red}({a}, axes=[1], keepdims=1)")
        elif kind < 0.89:  # softmax spelled out, as exporters do
            e = fresh()
            lines.append(f"let {e} = exp({a} - reduce_max({a}, axes=[1], keepdims=1))")
            lines.append(f"let {t} = {e} / reduce_sum({e}, axes=[1], keepdims=1)")
        elif kind < 0.91:  # layer norm spelled out
            d, v = fresh(), fresh()
            lines.append(f"let {d} = {a} - reduce_mean({a}, axes=[1], keepdims=1)")
            lines.append(f"let {v} = reduce_mean({d} * {d}, axes=[1], keepdims=1)")
            lines.append(f"let {t} = {d} / sqrt({v} + 0.00001) * col + row")
        elif kind < 0.93:  # norms and softmax with elementwise work before and after
            op = rnd.choice(["layer_norm({x}, col, col)", "rms_norm({x}, col)",
                             "batch_norm({x}, col, col * 0.5, col, abs(col) + 1)",
                             "softmax({x}, axis=-1)", "log_softmax({x}, axis=-1)"])
            lines.append(f"let {t} = " + op.format(x=f"{a} + {rnd.choice(full + side)}") +
                         f" * {rnd.choice(full + side)}")
        elif kind < 0.95:  # a concat (written in place by its pieces' kernels where the
            # dims before its axis are 1), summed back to [R, C]; a piece is read again later
            p1, p2, P = fresh(), fresh(), fresh()
            b = rnd.choice(full)
            lines.append(f"let {p1} = {rnd.choice(UNARY)}({a})")
            lines.append(f"let {p2} = " + rnd.choice([f"{a} * {b}", b, f"{b} @ w"]))
            if rnd.random() < 0.5:
                lines.append(f"let {P} = concat({p1}, {p2}, {p1} * 2, axis=0)")
                lines.append(f"let {t} = reshape(reduce_sum(reshape({P}, shape=[3, R, C]), axes=[0], "
                             f"keepdims=0), shape=[R, C]) + {p1}")
            else:
                lines.append(f"let {P} = concat({p2}, {p1}, axis=1)")
                lines.append(f"let {t} = reduce_max(reshape({P}, shape=[R, 2, C]), axes=[1], keepdims=0)")
            full.append(p1)
        elif kind < 0.955 and rows == cols:  # transpose: a different index order
            lines.append(f"let {t} = transpose({a}, perm=[1, 0])")
        elif kind < 0.98:
            lines.append(f"let {t} = tanh({a} @ transpose({rnd.choice(full)}, perm=[1, 0])) @ {a}")
        else:
            lines.append(f"let {t} = softmax({a}, axis=-1) * {rnd.choice(full)}")
        full.append(t)
    outs = set(rnd.sample(full[2:], min(len(full) - 2, rnd.randint(1, 3))))
    outs.add(full[-1])
    for i, v in enumerate(sorted(outs)):
        lines.append(f"output o{i} = {v}")
    return "\n".join(lines) + "\n"


def run(kiln, model, out, *args):
    p = subprocess.run([kiln, "run", model, "--seed", "3", "--output-dir", out, *args],
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise RuntimeError(f"kiln run {' '.join(args)} failed:\n{p.stderr.strip()[:800]}")


def check(kiln, seed, nvrtc):
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "g.kl")
        with open(model, "w") as f:
            f.write(make_graph(seed))
        sides = {"interp": ["--device=interp"], "fused": ["--device=host"],
                 "unfused": ["--device=host", "--no-fuse"]}
        try:
            for name, args in sides.items():
                run(kiln, model, os.path.join(tmp, name), *args)
            if nvrtc:  # the fused kernels also compile for a GPU, warning-free
                p = subprocess.run([kiln, "compile", model, "--emit=cu", "-o",
                                    os.path.join(tmp, "cu"), "--arch", "sm_90", "--Werror"],
                                   capture_output=True, text=True, timeout=300)
                if p.returncode:
                    raise RuntimeError(f"NVRTC:\n{p.stderr.strip()[:800]}")
            # every output the graph declares, on every side, and no other
            nout = sum(line.startswith("output ") for line in make_graph(seed).splitlines())
            for name in sides:
                have = sorted(f for f in os.listdir(os.path.join(tmp, name)) if f.startswith("output_"))
                if have != sorted(f"output_{k}.npy" for k in range(nout)):
                    raise RuntimeError(f"{name} wrote {have}, the graph has {nout} outputs")
            for k in range(nout):
                want = np.load(os.path.join(tmp, "interp", f"output_{k}.npy"))
                for name in ("fused", "unfused"):
                    got = np.load(os.path.join(tmp, name, f"output_{k}.npy"))
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True,
                                               err_msg=f"{name} output {k}")
        except Exception as e:  # report the graph with the failure
            return f"FAIL graph {seed}: {e}\n{make_graph(seed)}"
    return f"PASS graph {seed}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--nvrtc", action="store_true",
                    help="also compile each graph's kernels with NVRTC (sm_90, --Werror)")
    a = ap.parse_args()
    seeds = range(a.seed, a.seed + a.count)
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda s: check(a.kiln, s, a.nvrtc), seeds))
    failed = sum(r.startswith("FAIL") for r in results)
    for r in results:
        print(r)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
