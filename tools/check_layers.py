#!/usr/bin/env python3
"""check_layers.py — the tree against its layer table (tools/layers.txt).

Usage: check_layers.py [--root DIR] [--table FILE]

Reads every #include "..." of the .c, .cu and .h files under runtime/,
optim/ and offload/ (spelled from the root, "runtime/engine/engine.h", or
from the including file's folder, "engine.h", "../engine/engine.h", as the
compiler resolves a quoted include) and fails (exit 1, one line per finding) when
  - a file includes a header of a higher level, or of its own level where
    that level is `apart` (a sibling feature) and the header is not its own;
  - an included header of the tree does not exist;
  - a file is in no level, or in two;
  - a header has no implementation beside it (x.h without x.c or x.cu)
    and is not listed `header-only`;
  - two files share a name (C and CUDA sources and headers anywhere in the
    repository outside third_party/ and the frozen old headers,
    tests/compat/v0_1/ and tests/compat/v0_3/).
Prints "layers: OK (...)" otherwise.
"""
import argparse
import fnmatch
import os
import re
import sys

SCOPES = ("runtime", "optim", "offload")
EXTS = (".c", ".cu", ".h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_table(path):
    """([(name, kind, [patterns])] lowest level first, {header-only})."""
    levels, header_only = [], set()
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if parts[0] == "header-only":
                header_only.update(parts[1:])
                continue
            if len(parts) < 3 or parts[1] not in ("peers", "apart"):
                sys.exit("%s:%d: expected '<name> <peers|apart> <files...>'"
                         % (path, n))
            levels.append((parts[0], parts[1], parts[2:]))
    return levels, header_only


def match(path, pattern):
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern


def tree_files(root, scopes):
    out = []
    for scope in scopes:
        for d, _, names in os.walk(os.path.join(root, scope)):
            for name in names:
                if name.endswith(EXTS):
                    out.append(os.path.relpath(os.path.join(d, name), root))
    return sorted(out)


def stem(path):
    return os.path.splitext(path)[0]


def level_of(files, levels, problems):
    where = {}
    for f in files:
        hits = [i for i, (_, _, pats) in enumerate(levels)
                if any(match(f, p) for p in pats)]
        if not hits:
            problems.append("%s: in no level of the layer table" % f)
        elif len(hits) > 1:
            problems.append("%s: in more than one level (%s)" % (
                f, ", ".join(levels[i][0] for i in hits)))
        else:
            where[f] = hits[0]
    return where


def allowed(src, dst, where, levels):
    """Whether src may use dst (include its header, call it)."""
    a, b = where[src], where[dst]
    if b < a:
        return True
    if b > a:
        return False
    return levels[a][1] == "peers" or stem(src) == stem(dst)


def resolve(root, src, spelled):
    """The tree path an include of src names, or None outside the tree.
    A quoted include is looked up beside the including file first (as cc
    and nvcc do), then from the root (the build's -iquote)."""
    beside = os.path.normpath(os.path.join(os.path.dirname(src), spelled))
    if os.path.exists(os.path.join(root, beside)):
        path = beside
    else:
        path = os.path.normpath(spelled)
    if path.startswith(tuple(s + "/" for s in SCOPES)):
        return path
    return None


def check_includes(root, files, where, levels, problems):
    count = 0
    for f in files:
        if f not in where:
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            text = fh.read()
        for spelled in INCLUDE.findall(text):
            inc = resolve(root, f, spelled)
            if inc is None:
                continue  # outside the tree: third_party/, generated files
            count += 1
            if not os.path.exists(os.path.join(root, inc)):
                problems.append("%s: includes %s, which does not exist" % (
                    f, inc))
                continue
            if inc not in where:
                continue  # reported as "in no level"
            if not allowed(f, inc, where, levels):
                a, b = levels[where[f]], levels[where[inc]]
                why = ("a higher level" if where[inc] > where[f] else
                       "a sibling of the apart level")
                problems.append("%s (level %s) includes %s (level %s): %s" % (
                    f, a[0], inc, b[0], why))
    return count


def check_headers(root, files, header_only, problems):
    for f in files:
        if not f.endswith(".h") or f in header_only:
            continue
        if not any(os.path.exists(os.path.join(root, stem(f) + e))
                   for e in (".c", ".cu")):
            problems.append("%s: no %s.c or .cu beside it (a header is named "
                            "after its implementation; header-only ones are "
                            "listed in the table)" % (f, os.path.basename(
                                stem(f))))


def check_names(root, problems):
    seen = {}
    for d, dirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = [x for x in dirs if not x.startswith((".", "bazel-"))
                   and os.path.join(rel, x) not in (
                       "third_party", os.path.join("tests", "compat", "v0_1"),
                       os.path.join("tests", "compat", "v0_3"))]
        for name in names:
            if name.endswith((".c", ".cc", ".cu", ".h")):
                seen.setdefault(name, []).append(os.path.normpath(
                    os.path.join(rel, name)))
    for name, paths in sorted(seen.items()):
        if len(paths) > 1:
            problems.append("%s: the name is used %d times (%s); file names "
                            "are unique across the tree" % (
                                name, len(paths), ", ".join(sorted(paths))))
    return sum(len(p) for p in seen.values())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(here))
    ap.add_argument("--table", default=None)
    args = ap.parse_args()
    table = args.table or os.path.join(args.root, "tools", "layers.txt")
    levels, header_only = read_table(table)
    problems = []
    files = tree_files(args.root, SCOPES)
    where = level_of(files, levels, problems)
    n = check_includes(args.root, files, where, levels, problems)
    check_headers(args.root, files, header_only, problems)
    names = check_names(args.root, problems)
    for p in problems:
        print("layers: " + p)
    if problems:
        print("layers: FAIL (%d problems; the table: %s)" % (
            len(problems), os.path.relpath(table, args.root)))
        return 1
    print("layers: OK (%d files in %d levels, %d includes, %d unique file "
          "names)" % (len(files), len(levels), n, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
