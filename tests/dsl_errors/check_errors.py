#!/usr/bin/env python3
"""Each tests/dsl_errors/*.kl starts with '# expect: LINE:COL: TEXT'.  kiln
must exit 1 and print 'FILE:LINE:COL: error: ...TEXT...', then the source
line and a caret under column COL."""
import glob
import os
import re
import subprocess
import sys

kiln, folder = sys.argv[1], sys.argv[2]
passed = failed = 0
for path in sorted(glob.glob(os.path.join(folder, "*.kl"))):
    name = os.path.basename(path)
    with open(path, "rb") as f:
        first = f.readline().decode("utf-8", "replace")
    m = re.match(r"# expect: (\d+):(\d+): (.*)", first.strip())
    if not m:
        print(f"FAIL {name}: no '# expect: L:C: text' header")
        failed += 1
        continue
    line, col, text = int(m.group(1)), int(m.group(2)), m.group(3)
    r = subprocess.run([kiln, "compile", path, "--emit=ir"], capture_output=True,
                       timeout=60)
    err = r.stderr.decode("utf-8", "replace")
    lines = err.splitlines()
    want = f"{path}:{line}:{col}: error: "
    problems = []
    if "Sanitizer" in err or "runtime error:" in err:
        problems.append("sanitizer report")
    if r.returncode != 1:
        problems.append(f"exit code {r.returncode}, expected 1")
    if not lines or not lines[0].startswith(want):
        problems.append(f"expected first line to start with {want!r}")
    elif text not in lines[0]:
        problems.append(f"expected {text!r} in the message")
    if len(lines) >= 3:
        caret = lines[2]
        if caret.strip() != "^" or len(caret) - 1 != 2 + col - 1:
            problems.append("caret is not under the column")
    else:
        problems.append("no source line and caret")
    if problems:
        failed += 1
        print(f"FAIL {name}: " + "; ".join(problems))
        print("  stderr: " + err.strip().replace("\n", "\n  "))
    else:
        passed += 1
        print(f"PASS {name}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed or passed == 0 else 0)
