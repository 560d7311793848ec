#!/usr/bin/env python3
"""Sum meson test logs into one 'N passed, N failed' line.

A test whose output ends with its own 'N passed, N failed' line (the
reference suites run hundreds of cases in one meson test) counts with its
numbers; any other test counts once by its result.  Exit 1 if any failed."""
import json
import re
import sys

LINE = re.compile(r"^(?:\w+: )?(\d+) passed, (\d+) failed", re.M)


def count(logfile, prefix):
    passed = failed = 0
    with open(logfile) as f:
        for row in f:
            t = json.loads(row)
            ok = t["result"] in ("OK", "EXPECTEDFAIL")
            found = LINE.findall(t.get("stdout") or "")
            if found:
                p, fl = map(int, found[-1])
                if not ok and fl == 0:
                    fl = 1  # crashed or timed out after printing
                passed += p
                failed += fl
            elif t["result"] == "SKIP":
                continue
            elif ok:
                passed += 1
            else:
                failed += 1
                print(f"FAILED: {prefix}{t['name']}")
    return passed, failed


def main():
    args = sys.argv[1:]
    extra = []
    if "--extra" in args:
        i = args.index("--extra")
        extra = args[i + 1:]
        args = args[:i]
    passed = failed = 0
    for n, log in enumerate(args):
        p, f = count(log, "" if n == 0 else f"[{log.split('/')[0]}] ")
        passed += p
        failed += f
    for e in extra:
        name, rc = e.split("=")
        if rc == "0":
            passed += 1
        else:
            failed += 1
            print(f"FAILED: {name}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


main()
