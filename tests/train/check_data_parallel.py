#!/usr/bin/env python3
"""check_data_parallel.py - data-parallel training over MPI on the host
device (issue 15): real ranks, started by mpirun, on one machine.

    python3 tests/train/check_data_parallel.py KILN [CASE...]

Cases (all by default):
  match      2 ranks of 16 samples against 1 rank of 32 (the same global
             batch, the same samples): every param and optimizer state
             within 1e-5 after 10 steps, fp32, and the same losses; the
             data-parallel program on 1 rank without mpirun (and with
             KILN_EXCHANGE_ONE_RANK=1) equal to the plain step; a step
             compiled without --data-parallel refused on 2 ranks
  inf        fp16: an inf injected on rank 1 alone at step 3: both ranks
             skip that step and halve the loss scale (the checkpoint's)
  resume     a checkpoint at step 5 resumed on 2 ranks ends where the
             uninterrupted run does; resumed on 1 rank it is refused
  timing     the per-step split: compute, all-reduce, hidden, input wait
  kill       rank 1 killed mid-run: mpirun exits non-zero within 60 s,
             naming rank 1
  stall      rank 1 stopped (SIGSTOP): rank 0's --timeout 5 ends the run
             within 60 s with a message naming the step
  accuracy   train_cnn on 2 ranks (16 + 16 samples a step, 20 epochs)
             reaches the 1-rank bound, >= 95% on digits

Prints PASS/FAIL per check, then `N passed, N failed`; exits 1 on any
failure, and (naming it) without mpirun or numpy.
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:
    print("FAIL: this test needs numpy (scripts/setup.sh installs it)")
    sys.exit(1)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
MPIRUN = shutil.which("mpirun")
# root in CI containers; no CMA between ranks (ptrace may be barred there)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")

# A constant schedule, so that 10 steps are a valid run; momentum and clip
# so that the update reads the averaged gradient and its global norm.
MODEL = """model dp_mlp
dim B = 32
input x: f32[B, 64]
input labels: i64[B]
param w1: f32[64, 48] = randn(0.125, seed=1)
param b1: f32[48] = zeros
param w2: f32[48, 10] = randn(0.14, seed=2)
param b2: f32[10] = zeros
let h = relu(x @ w1 + b1)
let logits = h @ w2 + b2
output probs = softmax(logits, axis=-1)
train {
  loss = cross_entropy(logits, labels)
  optimizer = %s
  clip = 1.0
}
"""

passed = failed = 0


def report(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("PASS " + what, flush=True)
    else:
        failed += 1
        print("FAIL " + what + (": " + detail.strip()[-1500:] if detail else ""), flush=True)


def run(cmd, timeout=600, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr[-3000:]))
    return p


def mpirun(n, cmd, **kw):
    return run([MPIRUN, "-np", str(n)] + cmd, **kw)


def load(path):
    """A .safetensors file as {name: array}."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    head, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    types = {"F32": np.float32, "F64": np.float64}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], types[v["dtype"]]).reshape(v["shape"])
            for k, v in head.items() if k != "__metadata__"}


def compile_step(kiln, tmp, name, batch, *flags, model=None):
    out = os.path.join(tmp, name)
    if os.path.exists(out):  # compiled by an earlier case
        return out
    run([kiln, "compile", model or os.path.join(tmp, "dp_mlp.kl"), "--train", "--emit=exe",
         "--dim", "B=%d" % batch, "-o", out, "--no-nvrtc"] + list(flags))
    return out


def states_close(a, b, tol):
    """The largest difference over the states both hold (params, optimizer
    state), or a reason when they do not hold the same ones."""
    names = sorted(k for k in a if not k.startswith("kiln."))
    if names != sorted(k for k in b if not k.startswith("kiln.")) or not names:
        return None, "the checkpoints hold different tensors"
    worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in names)
    return worst, "" if worst <= tol else "max difference %.3g > %g" % (worst, tol)


def losses(path):
    with open(path) as f:
        return [float(x) for x in f.read().split()]


def check_match(kiln, tmp, data):
    one = compile_step(kiln, tmp, "one32", 32)
    dp16 = compile_step(kiln, tmp, "dp16", 16, "--data-parallel", "--bucket-mb", "0.002")
    dp32 = compile_step(kiln, tmp, "dp32", 32, "--data-parallel")
    common = ["--data", data, "--steps", "10", "--device", "host", "--seed", "7"]
    c1, c2, c3 = (os.path.join(tmp, n + ".safetensors") for n in ("c1", "c2", "c3"))
    l1, l2 = os.path.join(tmp, "l1.txt"), os.path.join(tmp, "l2.txt")
    run([one] + common + ["--checkpoint", c1, "--losses", l1])
    p = mpirun(2, [dp16] + common + ["--checkpoint", c2, "--losses", l2])
    buckets = re.search(r"2 ranks of 16 samples each, (\d+) gradient buckets", p.stderr)
    report(buckets is not None and int(buckets.group(1)) > 1,
           "match: 2 ranks of 16 samples, several gradient buckets (--bucket-mb 0.002)", p.stderr[-800:])
    worst, why = states_close(load(c1), load(c2), 1e-5)
    report(worst is not None and not why, "match: 2 ranks x 16 against 1 rank x 32 after 10 steps, "
           "params and state within 1e-5 (max %s)" % ("%.2e" % worst if worst is not None else "-"), why)
    a, b = losses(l1), losses(l2)
    report(len(a) == len(b) == 10 and max(abs(x - y) for x, y in zip(a, b)) <= 1e-5,
           "match: the global batch's loss each step, 2 ranks against 1", "%s\n%s" % (a, b))
    report(load(c2)["kiln.ranks"][0] == 2, "match: the checkpoint records 2 ranks")
    # the data-parallel program, started without mpirun, is one rank
    run([dp32] + common + ["--checkpoint", c3])
    worst, why = states_close(load(c1), load(c3), 0)
    report(worst == 0, "match: the data-parallel step on one rank (no mpirun) equals the plain one bit "
           "for bit", why)
    # ... and with KILN_EXCHANGE_ONE_RANK=1 (the GPU check's NCCL smoke
    # test) the exchange runs on one rank: the same
    c4 = os.path.join(tmp, "c4.safetensors")
    subprocess.run([dp32] + common + ["--checkpoint", c4], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   env=dict(ENV, KILN_EXCHANGE_ONE_RANK="1"), check=True, timeout=600)
    worst, why = states_close(load(c1), load(c4), 0)
    report(worst == 0, "match: one rank exchanging with itself (KILN_EXCHANGE_ONE_RANK=1) equals the plain "
           "step bit for bit", why)
    for flags, want in ((["--data-parallel"], "--data-parallel is for a training step (--train)"),
                        (["--train", "--bucket-mb", "0"], "--bucket-mb takes a size in MiB > 0, got '0'")):
        q = run([kiln, "compile", os.path.join(tmp, "dp_mlp.kl"), "--emit=ir"] + flags, check=False)
        report(q.returncode != 0 and want in q.stderr, "match: %s is refused: %s" % (" ".join(flags), want),
               q.stderr)
    q = mpirun(2, [one] + common, check=False)
    report(q.returncode != 0 and "compiled without --data-parallel" in q.stderr,
           "match: a step without --data-parallel is refused on 2 ranks", q.stderr[-600:])


def check_inf(kiln, tmp, data):
    dp16 = compile_step(kiln, tmp, "dph16", 16, "--data-parallel", "--precision=fp16")
    ck = os.path.join(tmp, "inf.safetensors")
    p = mpirun(2, [dp16, "--data", data, "--steps", "6", "--device", "host", "--inject-inf", "3",
                   "--inject-inf-rank", "1", "--checkpoint", ck])
    for r in (0, 1):
        report("rank %d: step 3: gradients not finite: update skipped, loss scale now 32768" % r in p.stderr,
               "inf: rank %d skips step 3 (the inf was on rank 1) and halves the scale" % r, p.stderr[-1500:])
    skipped = re.findall(r"rank \d: step (\d+): gradients not finite", p.stderr)
    report(sorted(skipped) == ["3", "3"], "inf: no other step skipped (%s)" % skipped)
    report(load(ck)["kiln.loss_scale"][0] == 32768.0, "inf: the checkpoint's loss scale is 2^15")


def check_resume(kiln, tmp, data):
    dp16 = compile_step(kiln, tmp, "dp16", 16, "--data-parallel", "--bucket-mb", "0.002")
    common = ["--data", data, "--steps", "10", "--device", "host", "--seed", "3"]
    whole, part = os.path.join(tmp, "whole.safetensors"), os.path.join(tmp, "part.safetensors")
    mpirun(2, [dp16] + common + ["--checkpoint", whole])
    mpirun(2, [dp16] + common + ["--checkpoint", part, "--checkpoint-every", "5", "--stop-after", "5"])
    mpirun(2, [dp16] + common + ["--checkpoint", part, "--resume", part])
    worst, why = states_close(load(whole), load(part), 0)
    report(worst == 0, "resume: stopped at step 5 and resumed on 2 ranks, the same as uninterrupted", why)
    q = run([dp16] + common + ["--resume", part], check=False)
    report(q.returncode == 1 and "made by a run of 2 ranks" in q.stderr,
           "resume: a 2-rank checkpoint is refused on 1 rank", q.stderr[-600:])


def check_timing(kiln, tmp, data):
    dp16 = compile_step(kiln, tmp, "dp16", 16, "--data-parallel", "--bucket-mb", "0.002")
    p = mpirun(2, [dp16, "--data", data, "--steps", "20", "--device", "host"])
    m = re.search(r"per step over 2 ranks: compute (\S+) ms, all-reduce (\S+) ms of which (\S+) ms \((\d+)%\) "
                  r"hidden behind the backward pass and (\S+) ms exposed, input wait (\S+) ms", p.stderr)
    report(m is not None and float(m.group(2)) > 0 and float(m.group(3)) <= float(m.group(2)),
           "timing: compute, all-reduce, hidden and input wait per step%s" % (
               " (%s)" % m.group(0)[len("per step over 2 ranks: "):] if m else ""), p.stderr[-800:])


def started(proc, path, pattern, limit=60):
    """Wait until the run's log shows `pattern`; False after `limit` s."""
    t0 = time.time()
    while time.time() - t0 < limit and proc.poll() is None:
        with open(path) as f:
            if re.search(pattern, f.read(), re.M):
                return True
        time.sleep(0.2)
    return False


def rank_pid(exe, rank):
    """The pid of rank `rank` of a run of exe (mpirun's environment)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if not f.read().startswith(exe.encode()):
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            if env.get(b"OMPI_COMM_WORLD_RANK") == str(rank).encode():
                return int(pid)
        except OSError:
            continue
    return None


def check_fault(kiln, tmp, data, sig, name, want, desc):
    exe = compile_step(kiln, tmp, "dp16", 16, "--data-parallel", "--bucket-mb", "0.002")
    log = os.path.join(tmp, name + ".log")
    with open(log, "w") as out:
        proc = subprocess.Popen([MPIRUN, "-np", "2", exe, "--data", data, "--steps", "1000000", "--device",
                                 "host", "--timeout", "5", "--log-every", "50"],
                                stdout=out, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    try:
        ok = started(proc, log, r"^step \d+/")
        pid = rank_pid(exe, 1)
        if not ok or not pid:
            report(False, "%s: the run started and rank 1 was found" % name, open(log).read())
            return
        os.kill(pid, sig)
        t0 = time.time()
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.time() - t0
        text = open(log).read()
        report(rc not in (None, 0) and re.search(want, text) is not None,
               "%s: every rank ends, exit %s after %.1f s, %s" % (name, rc, took, desc), text[-1500:])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        pid = rank_pid(exe, 1)
        if pid:
            os.kill(pid, signal.SIGKILL)
        proc.wait()


def check_accuracy(kiln, tmp, data):
    exe = compile_step(kiln, tmp, "cnn16", 16, "--data-parallel",
                       model=os.path.join(ROOT, "examples", "train_cnn.kl"))
    p = mpirun(2, [exe, "--data", data, "--epochs", "20", "--device", "host", "--log-every", "200"], timeout=900)
    m = re.search(r"^final: step=(\d+) loss=(\S+) accuracy=(\S+)$", p.stdout, re.M)
    acc = float(m.group(3)) if m else 0
    report(m is not None and acc >= 0.95, "accuracy: train_cnn on 2 ranks x 16, 20 epochs: test accuracy "
           "%.4f >= 0.95" % acc, p.stdout + p.stderr[-800:])


def main():
    kiln = os.path.abspath(sys.argv[1])
    cases = sys.argv[2:] or ["match", "inf", "resume", "timing", "kill", "stall", "accuracy"]
    if not MPIRUN:
        print("FAIL: this test needs mpirun (Debian: openmpi-bin; scripts/setup.sh installs it)")
        sys.exit(1)
    with tempfile.TemporaryDirectory(prefix="kiln-dp-") as tmp:
        data = os.path.join(tmp, "digits")
        run([sys.executable, os.path.join(ROOT, "examples", "data", "digits.py"), data])
        with open(os.path.join(tmp, "dp_mlp.kl"), "w") as f:
            f.write(MODEL % "sgd(lr=0.1, momentum=0.9)")
        for case in cases:
            try:
                if case == "match": check_match(kiln, tmp, data)
                elif case == "inf": check_inf(kiln, tmp, data)
                elif case == "resume": check_resume(kiln, tmp, data)
                elif case == "timing": check_timing(kiln, tmp, data)
                elif case == "kill":
                    check_fault(kiln, tmp, data, signal.SIGKILL, "kill", r"rank 1\b", "the message naming rank 1")
                elif case == "stall":
                    check_fault(kiln, tmp, data, signal.SIGSTOP, "stall",
                                r"rank 0 of 2: step \d+: .* did not complete within 5 s",
                                "rank 0 naming the step whose collective did not complete")
                elif case == "accuracy": check_accuracy(kiln, tmp, data)
                else: report(False, "unknown case " + case)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                report(False, case, str(e))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed or not passed else 0)


if __name__ == "__main__":
    main()
