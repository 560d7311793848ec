#!/usr/bin/env python3
"""scripts/count_tests.py, the closing line of every test run, on logs made
up to break it: each fault must fail the run with a message naming its
cause, and a clean log must pass with the right counts.

usage: test_count_tests.py"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COUNT = os.path.join(HERE, "..", "..", "scripts", "count_tests.py")

FLOORS = "numpy_ops build=950\nnvrtc build=20\nunit_ir build=3\n"
SKIPS = "checked-elsewhere: ^checked by the reference suite \\(\n"

passed = failed = 0


def row(name, result="OK", stdout="", stderr=""):
    return {"name": "kiln:suite / " + name, "result": result, "stdout": stdout,
            "stderr": stderr, "returncode": 0 if result == "OK" else 1}


CLEAN = [
    row("numpy_ops", stdout="PASS a\n950 passed, 0 failed\n"),
    row("nvrtc", stdout="SKIP x/model.kl: checked by the reference suite (args.json)\n"
                       "20 passed, 0 failed, 1 skipped\n"),
    row("unit_ir", stdout="[==========] 3 test(s) run.\n", stderr="[  PASSED  ] 3 test(s).\n"),
    row("public_names", stdout="PASS names\n"),
]


def run(tmp, rows, listed=None, extra=(), rc="0"):
    """Write a build folder holding `rows` and `listed`, count it."""
    build = os.path.join(tmp, "build")
    os.makedirs(os.path.join(build, "meson-logs"), exist_ok=True)
    with open(os.path.join(build, "meson-logs", "testlog.json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(os.path.join(build, "tests.list"), "w") as f:
        for r in (listed if listed is not None else rows):
            f.write(r["name"] + "\n")
    floors, skips = os.path.join(tmp, "floors.txt"), os.path.join(tmp, "skips.txt")
    with open(floors, "w") as f:
        f.write(FLOORS)
    with open(skips, "w") as f:
        f.write(SKIPS)
    p = subprocess.run([sys.executable, COUNT, build, "--floors", floors, "--skips", skips,
                        "--meson-rc", "build=" + rc] + (["--extra"] + list(extra) if extra else []),
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def check(name, rows, want_rc, want_text, **kw):
    global passed, failed
    with tempfile.TemporaryDirectory(prefix="kiln-count-") as tmp:
        rc, out = run(tmp, rows, **kw)
    if rc == want_rc and want_text in out:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}: exit {rc} (want {want_rc}), want {want_text!r} in:\n{out}")


def replace(name, new):
    return [new if r["name"].endswith("/ " + name) else r for r in CLEAN]


check("clean", CLEAN, 0, "974 passed, 0 failed, 1 skipped")
check("clean_reason_total", CLEAN, 0, "skipped for 'checked-elsewhere': 1")
# a suite that skipped itself (exit 77: a missing module)
check("suite_skipped", replace("numpy_ops", row("numpy_ops", "SKIP", "SKIP: numpy is not installed\n")),
      1, "numpy_ops skipped itself (exit 77): numpy is not installed")
# the log of the issue: a suite of 0 passed and 790 skipped
check("all_skipped", replace("numpy_ops", row("numpy_ops", stdout="0 passed, 0 failed, 790 skipped\n")),
      1, "numpy_ops ran 0 cases, fewer than its floor 950")
check("skips_without_reason", replace("nvrtc", row("nvrtc", stdout="20 passed, 0 failed, 3 skipped\n")),
      1, "nvrtc skipped 3 cases, 0 with a 'SKIP case: reason' line")
check("skip_reason_not_listed",
      replace("nvrtc", row("nvrtc", stdout="SKIP y: no NVRTC\n20 passed, 0 failed, 1 skipped\n")),
      1, "skipped y for a reason not in tests/skip_reasons.txt: no NVRTC")
check("below_floor", replace("numpy_ops", row("numpy_ops", stdout="940 passed, 0 failed\n")),
      1, "numpy_ops ran 940 cases, fewer than its floor 950")
check("no_floor", CLEAN + [row("new_suite", stdout="5 passed, 0 failed\n")],
      1, "new_suite ran 5 cases and declares no floor")
# a meson run killed mid-way: listed tests without a result
check("run_killed", CLEAN[:2], 1, "unit_ir has no result: the meson run stopped before it",
      listed=CLEAN)
check("meson_exit_unexplained", CLEAN, 1, "the meson run exited 137 with no failed test", rc="137")
check("crash_after_count", replace("numpy_ops", row("numpy_ops", "TIMEOUT", "950 passed, 0 failed\n")),
      1, "numpy_ops (TIMEOUT, after its count)")
check("cmocka_failure",
      replace("unit_ir", row("unit_ir", "FAIL", stderr="[  PASSED  ] 2 test(s).\n[  FAILED  ] 1 test(s), listed below:\n")),
      1, "unit_ir: 1 of 3 cases failed")
check("fuzzing_failed", CLEAN, 1, "FAILED: fuzzing (exit 1)", extra=["fuzzing=1"])
check("sanitizer_report_in_passing_test",
      replace("public_names", row("public_names", stdout="PASS names\n",
                                  stderr="../ir/graph.c:12:5: runtime error: signed integer overflow\n")),
      1, "public_names passed with a sanitizer report in its output: ../ir/graph.c:12:5: runtime error")
check("leak_report_in_passing_suite",
      replace("numpy_ops", row("numpy_ops", stdout="==1==ERROR: LeakSanitizer: detected memory leaks\n"
                                                   "950 passed, 0 failed\n")),
      1, "numpy_ops passed with a sanitizer report in its output: ERROR: LeakSanitizer")
with tempfile.TemporaryDirectory(prefix="kiln-count-") as tmp:
    p = subprocess.run([sys.executable, COUNT, os.path.join(tmp, "nothing")], capture_output=True, text=True)
    ok = p.returncode == 1 and "no test log" in p.stdout
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS" if ok else "FAIL") + " no_log" + ("" if ok else ": " + p.stdout + p.stderr))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
