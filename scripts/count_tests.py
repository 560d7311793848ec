#!/usr/bin/env python3
"""Sum meson test logs into one 'N passed, N failed, N skipped' line, and
refuse to call a run clean that did not run what it should.

    count_tests.py BUILD_DIR... [--extra NAME=RC ...] [--meson-rc BUILD_DIR=RC ...]
                   [--floors FILE] [--skips FILE]

For each build folder: its meson-logs/testlog.json (the results) and
tests.list (`meson test --list`, written before the run: every test listed
there must have a result, so a run that died part-way is a failure).

A test counts its cases from its own last 'N passed, N failed[, N skipped]'
line (the reference suites run hundreds of cases in one meson test), or
cmocka's '[  PASSED  ] N test(s).' and '[  FAILED  ] N test(s)' lines, or
else once by its result.  It fails the run when:
  - its result is not OK (a meson SKIP, exit 77, is a failure too: a
    required tool or module is missing, and the test says which);
  - it ran (passed + failed) fewer cases than its floor in FLOORS, or it
    reports a count and has no floor there;
  - it skipped cases without a 'SKIP <case>: <reason>' line for each whose
    reason matches one of the reasons in SKIPS;
  - its build's meson run exited non-zero with no failed test to explain
    it (--meson-rc);
  - its output holds a sanitizer report (ASan, LSan, UBSan, TSan) though
    it passed.
Skips with a listed reason are counted, and printed per reason.
Exit 1 if anything failed."""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^(?:\w+: )?(\d+) passed, (\d+) failed(?:, (\d+) skipped)?", re.M)
CMOCKA_PASSED = re.compile(r"^\[  PASSED  \] (\d+) test\(s\)\.", re.M)
CMOCKA_FAILED = re.compile(r"^\[  FAILED  \] (\d+) test\(s\)", re.M)
SKIP_LINE = re.compile(r"^SKIP(?: (.+?))?: (.+)$", re.M)
SANITIZER = re.compile(r"ERROR: (?:Address|Leak|Memory)Sanitizer|WARNING: ThreadSanitizer|"
                       r"^\S+:\d+:\d+: runtime error: ", re.M)


def read_floors(path):
    """'TEST BUILD=N ...' lines: the fewest cases TEST runs in BUILD."""
    floors = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            for field in line[1:]:
                build, _, n = field.partition("=")
                if not n.isdigit():
                    sys.exit(f"{path}:{lineno}: expected BUILD=N, got {field!r}")
                floors[(build, line[0])] = int(n)
    return floors


def read_skips(path):
    """'KEY: REGEX' lines: the reasons a case may be skipped for."""
    reasons = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, pattern = line.partition(": ")
            if not sep:
                sys.exit(f"{path}:{lineno}: expected 'KEY: REGEX'")
            reasons.append((key, re.compile(pattern)))
    return reasons


def short_name(full):
    """'kiln:unit / unit_ir' -> 'unit_ir'"""
    return full.split(" / ")[-1].strip()


class Tally:
    def __init__(self, floors, reasons):
        self.floors, self.reasons = floors, reasons
        self.passed = self.failed = self.skipped = 0
        self.per_reason = {}

    def fail(self, what):
        self.failed += 1
        print(f"FAILED: {what}")

    def test(self, build, t):
        name, out = short_name(t["name"]), t.get("stdout") or ""
        both = out + (t.get("stderr") or "")  # cmocka prints its summary on stderr
        where = f"[{build}] {name}"
        ok = t["result"] in ("OK", "EXPECTEDFAIL")
        if t["result"] == "SKIP":
            why = SKIP_LINE.findall(out)
            self.fail(f"{where} skipped itself (exit 77): "
                      f"{why[-1][1] if why else 'no reason given'}")
            return
        report = SANITIZER.search(both)
        if report and ok:  # a child's report the test did not turn into a failure
            self.fail(f"{where} passed with a sanitizer report in its output: "
                      f"{both[report.start():].splitlines()[0][:200]}")
        found = LINE.findall(out)
        if found:
            p, fl, sk = (int(x or 0) for x in found[-1])
        elif CMOCKA_PASSED.search(both) or CMOCKA_FAILED.search(both):
            p = sum(map(int, CMOCKA_PASSED.findall(both)))
            fl = sum(map(int, CMOCKA_FAILED.findall(both)))
            sk = 0
        else:
            p, fl, sk = (1, 0, 0) if ok else (0, 1, 0)
            if not ok:
                print(f"FAILED: {where} ({t['result']})")
            self.passed += p
            self.failed += fl
            return
        if fl:
            print(f"FAILED: {where}: {fl} of {p + fl} cases failed")
        elif not ok:
            fl = 1  # crashed or timed out after printing its count
            print(f"FAILED: {where} ({t['result']}, after its count)")
        self.passed += p
        self.failed += fl
        floor = self.floors.get((build, name))
        if floor is None:
            self.fail(f"{where} ran {p + fl} cases and declares no floor "
                      f"(add '{name} {build}={p + fl}' to tests/case_floors.txt)")
        elif p + fl < floor:
            self.fail(f"{where} ran {p + fl} cases, fewer than its floor {floor}")
        if sk:
            self.count_skips(where, out, sk)

    def count_skips(self, where, out, sk):
        explained = 0
        for case, why in SKIP_LINE.findall(out):
            key = next((k for k, rx in self.reasons if rx.search(why)), None)
            if key is None:
                self.fail(f"{where} skipped {case or 'a case'} for a reason not in "
                          f"tests/skip_reasons.txt: {why}")
                continue
            self.per_reason[key] = self.per_reason.get(key, 0) + 1
            explained += 1
        self.skipped += sk
        if explained < sk:
            self.fail(f"{where} skipped {sk} cases, {explained} with a 'SKIP case: reason' line")


def take(args, flag):
    """Remove `flag V...` (values up to the next --flag) from args."""
    if flag not in args:
        return []
    i = args.index(flag)
    j = i + 1
    while j < len(args) and not args[j].startswith("--"):
        j += 1
    values = args[i + 1:j]
    del args[i:j]
    return values


def case_count(t):
    """The cases a test reports running (passed + failed), or None."""
    out = t.get("stdout") or ""
    both = out + (t.get("stderr") or "")
    found = LINE.findall(out)
    if found:
        return int(found[-1][0]) + int(found[-1][1])
    if CMOCKA_PASSED.search(both) or CMOCKA_FAILED.search(both):
        return sum(map(int, CMOCKA_PASSED.findall(both) + CMOCKA_FAILED.findall(both)))
    return None


def write_floors(path, build_dirs):
    """Floors from the logs of a clean run: each test's case count, per
    build.  For a maintainer adding cases (or, with a reason in the commit,
    removing some); the diff of the file shows what changed."""
    counts = {}
    for build_dir in build_dirs:
        build = os.path.basename(os.path.normpath(build_dir))
        with open(os.path.join(build_dir, "meson-logs", "testlog.json")) as f:
            for row in f:
                t = json.loads(row)
                n = case_count(t)
                if n is not None and t["result"] == "OK":
                    counts.setdefault(short_name(t["name"]), []).append(f"{build}={n}")
    with open(path, "w") as f:
        f.write("# case_floors.txt - the fewest cases each test must run, per build folder\n"
                "# (scripts/count_tests.py fails a run below them).  Written by\n"
                "# `scripts/count_tests.py --write-floors tests/case_floors.txt build build-asan`\n"
                "# after a clean run; a lower number needs its reason in the commit.\n")
        for name in sorted(counts):
            f.write(f"{name} {' '.join(counts[name])}\n")


def main():
    args = sys.argv[1:]
    out = take(args, "--write-floors")
    if out:  # --write-floors FILE BUILD_DIR...
        write_floors(out[0], out[1:] + args)
        return
    extra = take(args, "--extra")
    meson_rc = dict(v.split("=", 1) for v in take(args, "--meson-rc"))
    floors_path = (take(args, "--floors") or [os.path.join(ROOT, "tests", "case_floors.txt")])[0]
    skips_path = (take(args, "--skips") or [os.path.join(ROOT, "tests", "skip_reasons.txt")])[0]
    tally = Tally(read_floors(floors_path), read_skips(skips_path))
    for build_dir in args:
        build = os.path.basename(os.path.normpath(build_dir))
        log = os.path.join(build_dir, "meson-logs", "testlog.json")
        listed_path = os.path.join(build_dir, "tests.list")
        if not os.path.exists(log):
            tally.fail(f"[{build}] no test log ({log}): the meson run did not start")
            continue
        failed_before = tally.failed
        seen = set()
        with open(log) as f:
            for row in f:
                t = json.loads(row)
                seen.add(short_name(t["name"]))
                tally.test(build, t)
        if os.path.exists(listed_path):
            with open(listed_path) as f:
                listed = [short_name(l) for l in f if " / " in l]
            for name in listed:
                if name not in seen:
                    tally.fail(f"[{build}] {name} has no result: the meson run stopped before it")
        else:
            tally.fail(f"[{build}] no tests.list: cannot tell whether every test ran")
        rc = meson_rc.get(build_dir, meson_rc.get(build))
        if rc not in (None, "0") and tally.failed == failed_before:
            tally.fail(f"[{build}] the meson run exited {rc} with no failed test to explain it")
    for e in extra:
        name, rc = e.rsplit("=", 1)
        if rc == "0":
            tally.passed += 1
        else:
            tally.fail(f"{name} (exit {rc})")
    for key, n in sorted(tally.per_reason.items()):
        print(f"skipped for '{key}': {n}")
    print(f"{tally.passed} passed, {tally.failed} failed, {tally.skipped} skipped")
    sys.exit(1 if tally.failed else 0)


main()
