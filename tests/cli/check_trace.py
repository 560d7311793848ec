#!/usr/bin/env python3
"""check_trace.py TRACE.json MODEL_C RUNS - a compiled program's --profile
trace is what Perfetto reads, and its kernel events are the generated
code's kernel launches and library calls one to one: for each of RUNS
runs, one complete event per entry of model.c's steps[] table, in order,
with that name, as many as compute() has krt_launch and krt_gemm calls;
their launches add up to the krt_launch and krt_gemm calls of compute(), what
run() enqueues (and a GPU captures as a CUDA graph).  Prints PASS or
FAIL lines and `N passed, N failed`."""
import json
import re
import sys

trace_path, model_c, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
passed = failed = 0


def report(ok, what, detail=""):
    global passed, failed
    ok = bool(ok)
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what + ("" if ok or not detail else ": " + detail))


with open(model_c) as f:
    src = f.read()
table = re.search(r"static const krt_step_info steps\[\] = \{\n(.*?)\n\};", src, re.S)
steps = [(m.group(1), int(m.group(2))) for m in re.finditer(r'\{"([^"]*)", (\d+), \d+\}', table.group(1))]
run_body = src[src.index("static int compute("):src.index("static int run(")]
calls = run_body.count("krt_launch(") + run_body.count("krt_gemm(")
try:
    with open(trace_path) as f:
        trace = json.load(f)
    report(True, "the trace parses as JSON")
except (OSError, ValueError) as e:
    report(False, "the trace parses as JSON", str(e))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1)
events = trace.get("traceEvents")
report(isinstance(events, list) and events, "a traceEvents list")
complete = [e for e in events if e.get("ph") == "X"]
fields = all(isinstance(e.get("name"), str) and isinstance(e.get("ts"), (int, float)) and
             isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0 and "pid" in e and "tid" in e
             for e in complete)
report(complete and fields, "complete events with name, ts, dur (us), pid, tid (%d)" % len(complete))
kernels = [e for e in complete if e.get("cat") == "kernel"]
report(len(kernels) == runs * len(steps), "%d runs x %d steps = %d kernel events" % (runs, len(steps), len(kernels)),
       "got %d" % len(kernels))
for r in range(runs):
    mine = kernels[r * len(steps):(r + 1) * len(steps)]
    names = [e["name"] for e in mine]
    report(names == [s[0] for s in steps], "run %d: the events are steps[] in order" % r,
           "%s against %s" % (names[:4], [s[0] for s in steps][:4]))
    launches = sum(e.get("args", {}).get("launches", 0) for e in mine)
    report(launches == calls, "run %d: their launches add up to compute()'s %d kernel and library calls" % (r, calls),
           "got %d" % launches)
    report(len(mine) == calls, "run %d: one event per kernel or library call (%d)" % (r, calls),
           "%d events" % len(mine))
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
