#!/usr/bin/env python3
"""check_header.py — the public header's house rules (docs/api.md).

Every entry of a public header (a comment block directly followed by a
declaration: function, typedef, struct, macro) has at most MAX lines of
comment, and its first line is a summary. Prints each violation as
FILE:LINE and exits 1 if there is one; --list-experimental prints the
lines marked [experimental] (what is not yet promised).
"""
import argparse
import re
import sys

MAX = 12


def entries(lines):
    """Yields (first_line_number, comment_lines, declaration_line)."""
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if s.startswith("/*") and not s.startswith("/* ===="):
            j = i
            while "*/" not in lines[j]:
                j += 1
            k = j + 1
            if k < len(lines):
                nxt = lines[k].strip()
                if nxt and not nxt.startswith("/*") and not nxt.startswith("//") \
                        and not nxt.startswith("#ifdef") and not nxt.startswith("#if") \
                        and not nxt.startswith("#endif") and not nxt.startswith("}") \
                        and not lines[i].startswith(" "):
                    yield i + 1, lines[i:j + 1], nxt
            i = j + 1
        else:
            i += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("headers", nargs="+")
    ap.add_argument("--list-experimental", action="store_true")
    a = ap.parse_args()
    bad = 0
    for path in a.headers:
        lines = open(path).read().split("\n")
        if a.list_experimental:
            for n, line in enumerate(lines, 1):
                if "[experimental]" in line:
                    print("%s:%d: %s" % (path, n, line.strip()))
            continue
        for first, comment, decl in entries(lines):
            if len(comment) > MAX:
                print("%s:%d: %d comment lines before '%s' (at most %d: "
                      "move the rationale to docs/)" %
                      (path, first, len(comment), decl[:50], MAX))
                bad += 1
    if not a.list_experimental:
        print("%d entries over %d lines" % (bad, MAX))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
