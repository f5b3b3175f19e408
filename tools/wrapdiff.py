#!/usr/bin/env python3
"""wrapdiff.py — how much wrapping a C trainer with ZeroShard changed it.

Usage: wrapdiff.py PLAIN.c WRAPPED.c [--max N] [--frozen f1,f2,...]

Counts the changed lines of `diff -u PLAIN WRAPPED` (every + and - line)
that hold code: blank lines and lines that are only comment are not
counted. With --frozen, also checks that no changed line lies inside the
body of any of the named functions, in either file (a function's body:
from the line after its definition's opening to its closing brace at
column 0; comment-only lines inside count as changes there too, but blank
ones do not). Prints the count and every violation; exit 0 when the count
is at most --max (default: no limit) and no frozen body changed, 1
otherwise, 2 on a usage error.

Used by tests/examples/stacked_diff_test.sh on examples/stacked.
"""
import re
import subprocess
import sys


def code_of(lines):
    """Each line with comments and surrounding blanks removed ('' for a
    blank or comment-only line); strings are kept."""
    out, in_comment = [], False
    for line in lines:
        code, i, quote = [], 0, None
        while i < len(line):
            c = line[i]
            if in_comment:
                if line.startswith("*/", i):
                    in_comment, i = False, i + 2
                else:
                    i += 1
                continue
            if quote:
                code.append(c)
                if c == "\\":
                    code.append(line[i + 1:i + 2])
                    i += 2
                    continue
                if c == quote:
                    quote = None
                i += 1
                continue
            if line.startswith("/*", i):
                in_comment, i = True, i + 2
                continue
            if line.startswith("//", i):
                break
            if c in "\"'":
                quote = c
            code.append(c)
            i += 1
        out.append("".join(code).strip())
    return out


def bodies(lines, names):
    """{name: (first, last)} 1-based line ranges of the named functions'
    bodies (the lines strictly between the definition's '{' line and the
    closing '}' at column 0)."""
    found = {}
    for i, line in enumerate(lines):
        m = re.match(r"^[A-Za-z_].*?\b([A-Za-z_]\w*)\s*\([^;]*$", line)
        if not m or m.group(1) not in names:
            continue
        j = i
        while j < len(lines) and "{" not in lines[j]:
            j += 1
        k = j + 1
        while k < len(lines) and lines[k] != "}":
            k += 1
        if k < len(lines):
            found[m.group(1)] = (j + 2, k)  # 1-based, body only
    return found


def main(argv):
    args, limit, frozen = [], None, []
    it = iter(argv[1:])
    for a in it:
        if a == "--max":
            limit = int(next(it))
        elif a == "--frozen":
            frozen = [f for f in next(it).split(",") if f]
        else:
            args.append(a)
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    files = [open(p, encoding="utf-8").read().split("\n") for p in args]
    code = [code_of(f) for f in files]
    d = subprocess.run(["diff", "--unchanged-line-format=",
                        "--old-line-format=-%dn\n",
                        "--new-line-format=+%dn\n", args[0], args[1]],
                       capture_output=True, text=True)
    if d.returncode > 1:
        print(d.stderr, file=sys.stderr)
        return 2
    ranges = [bodies(f, set(frozen)) for f in files]
    missing = [n for n in frozen if n not in ranges[0] or n not in ranges[1]]
    count, bad = 0, []
    for tok in d.stdout.split():
        side = 0 if tok[0] == "-" else 1
        line = int(tok[1:])
        text = files[side][line - 1]
        if code[side][line - 1]:
            count += 1
        for name, (a, b) in ranges[side].items():
            if a <= line <= b and text.strip():
                bad.append("%s:%d: inside %s(): %s" %
                           (args[side], line, name, text.strip()))
    print("%d changed lines of code (+/-, without blank and comment-only "
          "lines)%s" % (count, "" if limit is None else ", at most %d" % limit))
    for m in missing:
        print("frozen function %s() not found in both files" % m)
    for b in bad:
        print(b)
    ok = not bad and not missing and (limit is None or count <= limit)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
