#!/usr/bin/env python3
"""check_public_names.py - the runtime's public headers declare krt_ and
KRT_ names only: they are included into generated models and users' code,
where any other name may clash.

Usage: check_public_names.py [--cc CC] HEADER...

Each header is run through the C preprocessor (-dD keeps its #defines);
of the text that comes from the header and the headers it includes, system
headers aside, these count as declared: macros, struct/union/enum tags, enumeration
constants, and the names declared at file scope (functions, typedefs,
variables; a function pointer's `(*name)`).  Parameter and member names
do not.  Before the headers, a planted header checks that every kind is
found and that parameters and members are not: the check can fail.
Prints each offending name with its kind; exits 1 when there is one.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

ALLOWED = re.compile(r"^(krt_|KRT_)")
KEYWORDS = set("""
auto break case char const continue default do double else enum extern float
for goto if inline int long register restrict return short signed sizeof static
struct switch typedef union unsigned void volatile while _Alignas _Alignof
_Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert
_Thread_local __attribute__ __extension__ __restrict __restrict__ __inline
__inline__ __asm__ asm __typeof__ typeof __const __volatile__ __signed__
""".split())
TOKEN = re.compile(r"""
    (?P<id>[A-Za-z_]\w*)
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.])*)
  | (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
  | (?P<punct>\.\.\.|->|\S)
""", re.X)
MARKER = re.compile(r'^#\s*(\d+)\s+"([^"]*)"((?:\s+\d)*)')
DEFINE = re.compile(r"^#\s*define\s+([A-Za-z_]\w*)")


def own_text(cc, header):
    """The lines after preprocessing that come from the header or a
    non-system header it includes (a user sees those too): (directives,
    code)."""
    out = subprocess.run(cc + ["-E", "-dD", "-x", "c", "-std=c11", header],
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit("check_public_names: preprocessing %s failed:\n%s" % (header, out.stderr))
    mine, directives, code = False, [], []
    for line in out.stdout.splitlines():
        m = MARKER.match(line)
        if m:  # flag 3: a system header; <built-in>, <command-line>: the compiler's
            mine = "3" not in m.group(3).split() and not m.group(2).startswith("<")
        elif mine and line.lstrip().startswith("#"):
            directives.append(line.strip())
        elif mine:
            code.append(line)
    return directives, "\n".join(code)


def declared(cc, header):
    """{name: kind} of what the header declares."""
    directives, code = own_text(cc, header)
    names = {}
    for d in directives:
        m = DEFINE.match(d)
        if m:
            names[m.group(1)] = "macro"
    toks = [m.group(0) for m in TOKEN.finditer(code)]
    is_id = lambda t: re.match(r"[A-Za-z_]\w*$", t) and t not in KEYWORDS
    braces = []   # one entry per open brace: is it an enum's body?
    parens = 0
    enum_next = False
    for i, t in enumerate(toks):
        prev = toks[i - 1] if i else ""
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if t in ("struct", "union", "enum"):
            enum_next = t == "enum"
            if is_id(nxt):  # tags have file scope even when nested
                names[nxt] = "tag"
        elif t == "{":
            braces.append(enum_next)
            enum_next = False
        elif t == "}":
            braces and braces.pop()
        elif t == "(":
            parens += 1
        elif t == ")":
            parens -= 1
        elif t == ";":
            enum_next = False
        elif is_id(t) and t not in names:
            if braces and braces[-1] and parens == 0 and prev in ("{", ","):
                names[t] = "enum constant"
            elif not braces and parens == 0 and nxt in ("(", ";", ",", "[", "="):
                names[t] = "declaration"
            elif (not braces and parens == 1 and prev == "*" and i >= 2 and toks[i - 2] == "("
                  and nxt == ")"):
                names[t] = "declaration"  # (*name)(...): a function pointer
    return names


PLANTED = """
#include <stddef.h>
#define KRT_OK 1
#define bad_macro 1
typedef struct krt_fine { int bad_member; struct bad_tag *p; } krt_fine;
typedef enum { KRT_A, bad_const = 2, KRT_B } krt_kind;
typedef unsigned bad_typedef;
typedef void (*bad_fnptr)(void **bad_param);
int krt_ok(int bad_param, const char *bad_param2) __attribute__((nonnull));
const krt_fine *bad_fn(krt_kind k, size_t n);
extern int bad_var, krt_var;
extern const char bad_array[];
_Static_assert(sizeof(int) >= 2, "fine");
"""
PLANTED_BAD = {"bad_macro": "macro", "bad_tag": "tag", "bad_const": "enum constant",
               "bad_typedef": "declaration", "bad_fnptr": "declaration",
               "bad_fn": "declaration", "bad_var": "declaration", "bad_array": "declaration"}


def offenders(names):
    return {n: k for n, k in names.items() if not ALLOWED.match(n)}


def main(argv):
    cc = ["cc"]
    if len(argv) > 1 and argv[0] == "--cc":
        cc, argv = shlex.split(argv[1]), argv[2:]
    if not argv:
        sys.exit(__doc__.split("\n\n")[1])
    with tempfile.TemporaryDirectory() as tmp:
        planted = os.path.join(tmp, "planted.h")
        with open(planted, "w") as f:
            f.write(PLANTED)
        got = offenders(declared(cc, planted))
    if got != PLANTED_BAD:
        print("FAIL self-test: found %s, planted %s" % (sorted(got.items()), sorted(PLANTED_BAD.items())))
        return 1
    print("PASS self-test (%d planted names found, parameters and members left alone)" % len(got))
    bad = 0
    for h in argv:
        names = declared(cc, h)
        wrong = offenders(names)
        for n, k in sorted(wrong.items()):
            print("FAIL %s: %s '%s' is not a krt_/KRT_ name" % (h, k, n))
        bad += len(wrong)
        if not wrong:
            print("PASS %s: %d names, all krt_/KRT_" % (h, len(names)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
