#!/usr/bin/env python3
"""check_train.py - training steps compiled by kiln, run on the host device,
against independent references.

    python3 tests/train/check_train.py KILN CHECK [ARGS]

CHECK is one of

  accuracy MODEL PRECISION MIN EPOCHS
      kiln train examples/MODEL.kl on scikit-learn's digits (written by
      examples/data/digits.py) with --precision=PRECISION; the test accuracy
      on the last line must be >= MIN.  fp16 must run with dynamic loss
      scaling, fp32 and bf16 without (loss scale 1 throughout).
  optimizers
      A linear softmax classifier trained 20 steps by each optimizer,
      schedule and clip setting of docs/DSL.md, against the same formulas
      in NumPy (float64): every step's loss, and the final params and
      optimizer state from the checkpoint, within 1e-6 (f32 arithmetic).
  scaler
      fp16: an injected Inf (--inject-inf) skips that step and halves the
      scale; the scale survives a checkpoint; bf16 never scales or skips.
  resume MODEL PRECISION
      A run stopped right after a checkpoint (--stop-after) and resumed
      (--resume) gives the uninterrupted run's losses bit for bit.
  errors
      Bad training runs are exit 1 or 2 with a message naming the cause:
      data that does not fit the step, a wrong --batch, a model without a
      train block, a file that is no checkpoint, a missing data folder.
  onnx
      An ONNX MLP (built with onnx.helper, symbolic batch) trained with
      --loss=cross_entropy --logits --labels on digits reaches >= 0.93; an
      mse loss lowers; bad flags are clear errors.

Prints PASS/FAIL per check and `N passed, N failed`; exit 1 on failure.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
results = {"passed": 0, "failed": 0}


def report(ok, what, detail=""):
    results["passed" if ok else "failed"] += 1
    print("%s: %s%s" % ("PASS" if ok else "FAIL", what, ("\n  " + detail) if detail and not ok else ""))
    sys.stdout.flush()


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr[-3000:]))
    return p


def digits(tmp):
    out = os.path.join(tmp, "digits")
    run([sys.executable, os.path.join(ROOT, "examples/data/digits.py"), out])
    return out


def compile_exe(kiln, model, out, *flags):
    run([kiln, "compile", model, "--train", "--emit=exe", "-o", out] + list(flags))
    return out


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    types = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = d["data_offsets"]
        out[name] = np.frombuffer(data[a:b], types[d["dtype"]]).reshape(d["shape"])
    return out


def step_lines(stderr):
    """(step, loss_scale) of each progress line."""
    return [(int(m.group(1)), float(m.group(2)))
            for m in re.finditer(r"^step (\d+)/\d+ .*loss_scale (\S+)$", stderr, re.M)]


# ---- accuracy ---------------------------------------------------------------
def check_accuracy(kiln, model, precision, minimum, epochs):
    with tempfile.TemporaryDirectory() as tmp:
        data = digits(tmp)
        p = run([kiln, "train", os.path.join(ROOT, "examples", model + ".kl"), "--data", data,
                 "--epochs", str(epochs), "--device", "host", "--precision=" + precision,
                 "--log-every", "50"])
        m = re.search(r"^final: step=(\d+) loss=(\S+) accuracy=(\S+)$", p.stdout, re.M)
        report(m is not None, "%s %s: a final line with the accuracy" % (model, precision), p.stdout)
        if not m:
            return
        acc = float(m.group(3))
        report(acc >= minimum, "%s %s: test accuracy %.4f >= %.2f" % (model, precision, acc, minimum))
        scales = [s for _, s in step_lines(p.stderr)]
        if precision == "fp16":
            report("dynamic loss scaling" in p.stderr and any(s > 1 for s in scales),
                   "%s fp16: dynamic loss scaling active (scales %s)" % (model, sorted(set(scales))[:4]),
                   p.stderr[-2000:])
        else:
            report(scales and all(s == 1 for s in scales) and "dynamic loss scaling" not in p.stderr,
                   "%s %s: no loss scaling" % (model, precision), p.stderr[-2000:])


# ---- optimizers against NumPy ---------------------------------------------------
N, F, C, STEPS = 16, 5, 3, 20

MODEL = """model lin
input x: f32[%d, %d]
input labels: i64[%d]
param w: f32[%d, %d] = zeros
param b: f32[%d] = zeros
let logits = x @ w + b
output probs = softmax(logits, axis=-1)
train {
  loss = cross_entropy(logits, labels)
  optimizer = %s
%s}
""" % (N, F, N, F, C, C, "%s", "%s")

CASES = [
    ("sgd(lr=0.5)", "", 0),
    ("sgd(lr=0.3, momentum=0.9)", "", 0),
    ("sgd(lr=0.3, momentum=0.8, nesterov=1, weight_decay=0.05)", "schedule = step(step_size=6, gamma=0.5)", 0),
    ("adam(lr=0.05)", "", 0),
    ("adam(lr=0.05, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)", "schedule = cosine(warmup=4)", 0),
    ("adamw(lr=0.05, weight_decay=0.2)", "schedule = cosine(warmup=3, total=15, min_lr=0.001)", 0.5),
    ("adamw(lr=0.02)", "schedule = constant(warmup=5)", 0.05),
]


def parse_call(text):
    name, args = re.match(r"(\w+)\((.*)\)", text).groups()
    kw = {}
    for part in filter(None, [a.strip() for a in args.split(",")]):
        k, v = part.split("=")
        kw[k.strip()] = float(v)
    return name, kw


def lr_at(s, lr, sched):
    """docs/DSL.md, Schedules."""
    if not sched:
        return lr
    name, kw = parse_call(sched.split("=", 1)[1].strip())
    w = kw.get("warmup", 0)
    if w >= 1 and s < w:
        return lr * (s + 1) / w
    if name == "step":
        return lr * kw.get("gamma", 0.1) ** np.floor((s - w) / kw["step_size"])
    if name == "cosine":
        t, mn = kw.get("total", STEPS), kw.get("min_lr", 0.0)
        if s >= t:
            return mn
        return mn + (lr - mn) * (1 + np.cos(np.pi * (s - w) / (t - w))) / 2
    return lr


def reference(x, y, opt, sched, clip):
    """The optimizer's update, docs/DSL.md, in float64."""
    name, kw = parse_call(opt)
    lr = kw["lr"]
    wd = kw.get("weight_decay", 0.01 if name == "adamw" else 0.0)
    b1, b2, eps = kw.get("beta1", 0.9), kw.get("beta2", 0.999), kw.get("eps", 1e-8)
    mu, nesterov = kw.get("momentum", 0.0), kw.get("nesterov", 0) == 1
    params = {"w": np.zeros((F, C)), "b": np.zeros(C)}
    state = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in params.items()}
    onehot = np.eye(C)[y]
    losses = []
    for s in range(STEPS):
        logits = x @ params["w"] + params["b"]
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        losses.append(float(np.mean(-np.log(p[np.arange(N), y]))))
        dl = (p - onehot) / N
        grads = {"w": x.T @ dl, "b": dl.sum(axis=0)}
        if clip:
            norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            grads = {k: g * min(1.0, clip / (norm + 1e-6)) for k, g in grads.items()}
        eta, t = lr_at(s, lr, sched), s + 1
        for k in params:
            th, g, st = params[k], grads[k], state[k]
            if name == "sgd":
                g = g + wd * th
                if mu > 0:
                    st[0] = mu * st[0] + g
                    d = g + mu * st[0] if nesterov else st[0]
                else:
                    d = g
                params[k] = th - eta * d
                continue
            if name == "adamw":
                th = th * (1 - eta * wd)
            else:
                g = g + wd * th
            st[0] = b1 * st[0] + (1 - b1) * g
            st[1] = b2 * st[1] + (1 - b2) * g * g
            mh, vh = st[0] / (1 - b1 ** t), st[1] / (1 - b2 ** t)
            params[k] = th - eta * mh / (np.sqrt(vh) + eps)
    return losses, params, state, name, mu


def check_optimizers(kiln):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N, F)).astype(np.float32)
    y = rng.integers(0, C, N).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "train_x.npy"), x)
        np.save(os.path.join(tmp, "train_y.npy"), y)
        for i, (opt, sched, clip) in enumerate(CASES):
            extra = ("  %s\n" % sched if sched else "") + ("  clip = %g\n" % clip if clip else "")
            src = os.path.join(tmp, "lin%d.kl" % i)
            with open(src, "w") as f:
                f.write(MODEL % (opt, extra))
            what = "%s %s%s" % (opt, sched.replace("schedule = ", ""), " clip=%g" % clip if clip else "")
            try:
                exe = compile_exe(kiln, src, os.path.join(tmp, "lin%d" % i))
                ck, lf = os.path.join(tmp, "ck%d.safetensors" % i), os.path.join(tmp, "l%d.txt" % i)
                run([exe, "--data", tmp, "--steps", str(STEPS), "--device", "host", "--checkpoint", ck,
                     "--losses", lf])
            except RuntimeError as e:
                report(False, what, str(e))
                continue
            losses, params, state, name, mu = reference(x.astype(np.float64), y, opt, sched, clip)
            got = [float(v) for v in open(lf).read().split()]
            ck = read_safetensors(ck)
            worst = max(abs(a - b) for a, b in zip(got, losses))
            ok = len(got) == STEPS and worst <= 1e-6
            for k in params:
                worst = max(worst, float(np.abs(ck[k] - params[k]).max()))
                names = [k + "_momentum"] if name == "sgd" and mu > 0 else [] if name == "sgd" else [k + "_m", k + "_v"]
                for j, sn in enumerate(names):
                    worst = max(worst, float(np.abs(ck[sn] - state[k][j]).max()))
            ok = ok and worst <= 1e-6
            report(ok, "%s: 20 steps, losses, params and state within 1e-6 of NumPy (worst %.2e)"
                   % (what, worst), "losses %s\nNumPy  %s" % (got[:5], losses[:5]))


# ---- the loss scaler end to end ---------------------------------------------------
def check_scaler(kiln):
    with tempfile.TemporaryDirectory() as tmp:
        data = digits(tmp)
        model = os.path.join(ROOT, "examples/train_mlp.kl")
        fp16 = compile_exe(kiln, model, os.path.join(tmp, "fp16"), "--precision=fp16")
        bf16 = compile_exe(kiln, model, os.path.join(tmp, "bf16"), "--precision=bf16")
        ck = os.path.join(tmp, "ck.safetensors")
        common = ["--data", data, "--steps", "60", "--device", "host", "--log-every", "1"]
        # a first run finds the scale settled by the 40th step (the first
        # steps overflow while it falls from 2^16)
        p = run([fp16] + common + ["--inject-inf", "40", "--checkpoint", ck, "--checkpoint-every", "45",
                                   "--stop-after", "45"])
        scales = dict(step_lines(p.stderr))
        before, after = scales.get(40), scales.get(41)
        m = re.search(r"^step 40: gradients not finite: update skipped, loss scale now (\S+)$", p.stderr, re.M)
        report(m is not None and before is not None and after == max(1.0, before / 2),
               "fp16: an injected Inf at step 40 skips it and halves the scale (%s -> %s)" % (before, after),
               p.stderr[-3000:])
        saved = read_safetensors(ck)["kiln.loss_scale"][0]
        report(saved == scales.get(45), "fp16: the checkpoint holds the scale (%s)" % saved)
        q = run([fp16] + common + ["--resume", ck])
        resumed = step_lines(q.stderr)
        report(resumed and resumed[0][0] == 46 and resumed[0][1] == saved,
               "fp16: the scale survives the checkpoint (%s at step 46)" % (resumed[0][1] if resumed else None),
               q.stderr[-2000:])
        r = run([bf16] + common + ["--inject-inf", "10"])
        scales = [s for _, s in step_lines(r.stderr)]
        report(scales and all(s == 1 for s in scales) and "update skipped" not in r.stderr,
               "bf16: no loss scaling, nothing skipped even at an Inf", r.stderr[-2000:])


# ---- resume bit for bit -------------------------------------------------------------
def check_resume(kiln, model, precision):
    with tempfile.TemporaryDirectory() as tmp:
        data = digits(tmp)
        exe = compile_exe(kiln, os.path.join(ROOT, "examples", model + ".kl"), os.path.join(tmp, "t"),
                          "--precision=" + precision)
        a, b, ck = (os.path.join(tmp, n) for n in ("a.txt", "b.txt", "ck.safetensors"))
        common = [exe, "--data", data, "--steps", "60", "--device", "host", "--seed", "3"]
        run(common + ["--losses", a])
        run(common + ["--losses", b, "--checkpoint", ck, "--checkpoint-every", "25", "--stop-after", "25"])
        run(common + ["--losses", b, "--resume", ck])
        la, lb = open(a).read(), open(b).read()
        report(la == lb and len(la.split()) == 60,
               "%s %s: killed after the checkpoint at step 25 and resumed: 60 losses bit for bit"
               % (model, precision), "uninterrupted %s\nresumed       %s" % (la.split()[24:28], lb.split()[24:28]))


# ---- ONNX models ----------------------------------------------------------------------
def onnx_mlp(path):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * sd).astype(np.float32), n)
             for n, s, sd in (("w1", (64, 64), 0.125), ("w2", (64, 10), 0.125))]
    inits += [numpy_helper.from_array(np.zeros(n, np.float32), b) for b, n in (("b1", 64), ("b2", 10))]
    nodes = [helper.make_node("MatMul", ["pixels", "w1"], ["m1"], name="fc1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="bias1"),
             helper.make_node("Relu", ["a1"], ["h1"], name="act1"),
             helper.make_node("MatMul", ["h1", "w2"], ["m2"], name="fc2"),
             helper.make_node("Add", ["m2", "b2"], ["scores"], name="bias2")]
    graph = helper.make_graph(nodes, "onnx_mlp",
                              [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 10])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def check_onnx(kiln):
    with tempfile.TemporaryDirectory() as tmp:
        data = digits(tmp)
        model = os.path.join(tmp, "mlp.onnx")
        onnx_mlp(model)
        base = [kiln, "train", model, "--dim", "batch=32", "--data", data, "--device", "host", "--train"]
        p = run(base + ["--epochs", "25", "--loss=cross_entropy", "--logits", "scores", "--labels", "digit",
                        "--optimizer", "adamw(lr=3e-3, weight_decay=0.01)", "--schedule", "cosine(warmup=20)"])
        m = re.search(r"accuracy=(\S+)", p.stdout)
        acc = float(m.group(1)) if m else 0
        report(acc >= 0.93, "onnx mlp, cross_entropy: test accuracy %.4f >= 0.93" % acc, p.stdout + p.stderr[-1500:])
        # mse against one-hot targets: the loss falls
        np.save(os.path.join(tmp, "onehot_y.npy"), np.eye(10, dtype=np.float32)[np.load(os.path.join(data, "train_y.npy"))])
        os.makedirs(os.path.join(tmp, "mse"))
        os.symlink(os.path.join(data, "train_x.npy"), os.path.join(tmp, "mse", "train_x.npy"))
        os.rename(os.path.join(tmp, "onehot_y.npy"), os.path.join(tmp, "mse", "train_y.npy"))
        lf = os.path.join(tmp, "mse.txt")
        run([kiln, "train", model, "--dim", "batch=32", "--data", os.path.join(tmp, "mse"), "--device", "host",
             "--steps", "200", "--loss=mse", "--logits", "scores", "--labels", "target", "--losses", lf,
             "--optimizer", "sgd(lr=0.5, momentum=0.9)"])
        losses = [float(v) for v in open(lf).read().split()]
        report(len(losses) == 200 and np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20]),
               "onnx mlp, mse: the loss falls (%.4f -> %.4f)" % (np.mean(losses[:20]), np.mean(losses[-20:])))
        for flags, want in ((["--loss=hinge", "--logits", "scores", "--labels", "y"], "expected cross_entropy or mse"),
                            (["--loss=mse", "--logits", "nope", "--labels", "y"], "--logits nope: no value"),
                            (["--loss=mse"], "needs --loss=cross_entropy|mse, --logits NAME"),
                            (["--loss=mse", "--logits", "scores", "--labels", "y", "--optimizer", "adam(beta9=1)"],
                             "adam has no setting 'beta9'"),
                            (["--loss=mse", "--logits", "scores", "--labels", "y", "--optimizer", "adam()"],
                             "needs lr > 0")):
            q = subprocess.run(base + ["--steps", "1"] + flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
            report(q.returncode == 1 and want in q.stderr, "onnx: %s is refused: %s" % (" ".join(flags), want),
                   "exit %d: %s" % (q.returncode, q.stderr[-500:]))


# ---- errors -------------------------------------------------------------------------
def write_safetensors(path, tensors):
    header, blobs, at = {}, b"", 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs += raw
        at += len(raw)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blobs)


def check_errors(kiln):
    with tempfile.TemporaryDirectory() as tmp:
        data = digits(tmp)
        mlp = os.path.join(ROOT, "examples/train_mlp.kl")
        plain = os.path.join(tmp, "plain.kl")
        with open(plain, "w") as f:
            f.write("model plain\ninput x: f32[2, 3]\nparam w: f32[3, 2] = zeros\noutput y = x @ w\n")
        notck = os.path.join(tmp, "w.safetensors")
        write_safetensors(notck, {"w1": np.zeros((64, 128))})
        cases = [
            ([os.path.join(ROOT, "examples/mlp.kl"), "--data", data, "--steps", "3"], 1,
             "holds samples of shape [64], but input 'x' takes [784] per sample"),
            ([mlp, "--data", data, "--steps", "3", "--batch", "64"], 2,
             "compiled for batches of 32 (recompile with --dim B=64)"),
            ([mlp, "--data", data], 2, "give one of --epochs N and --steps N"),
            ([mlp, "--data", os.path.join(tmp, "nowhere"), "--steps", "3"], 1, "nowhere/train_x.npy"),
            ([mlp, "--data", data, "--steps", "30", "--resume", notck], 1, "not a kiln training checkpoint"),
            ([plain, "--data", data, "--steps", "3"], 1, "has no train block"),
            ([mlp, "--steps", "3"], 2, "--data DIR is required"),
        ]
        for args, code, want in cases:
            p = subprocess.run([kiln, "train"] + args + ["--device", "host"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            report(p.returncode == code and want in p.stderr,
                   "kiln train %s: exit %d, '%s'" % (" ".join(os.path.basename(a) for a in args), code, want),
                   "exit %d: %s" % (p.returncode, p.stderr[-600:]))


def main():
    kiln, check, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    try:
        if check == "accuracy":
            check_accuracy(kiln, args[0], args[1], float(args[2]), int(args[3]))
        elif check == "optimizers":
            check_optimizers(kiln)
        elif check == "scaler":
            check_scaler(kiln)
        elif check == "errors":
            check_errors(kiln)
        elif check == "onnx":
            check_onnx(kiln)
        elif check == "resume":
            check_resume(kiln, args[0], args[1])
        else:
            sys.exit("unknown check %s" % check)
    except RuntimeError as e:
        report(False, check + " " + " ".join(args), str(e))
    print("%d passed, %d failed" % (results["passed"], results["failed"]))
    sys.exit(1 if results["failed"] or not results["passed"] else 0)


if __name__ == "__main__":
    main()
