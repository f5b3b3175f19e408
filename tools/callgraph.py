#!/usr/bin/env python3
"""callgraph.py — calls between the library's files, from its archives.

Usage:
  callgraph.py [--table FILE] [--edges] [--dot] ARCHIVE...   (lib*.a)
  callgraph.py [--table FILE] [--edges] [--dot] --nm FILE    (nm -A output)

Reads the symbols of every object in the archives (nm -A: what each
object defines, what it calls), maps each object to its source file by
name (file names are unique across the tree: tools/check_layers.py) and
builds the graph "file A calls a function defined in file B". Fails (exit
1) when the graph has a cycle (naming the files of each) or a call breaks
the layer table (tools/layers.txt: a call into a higher level, or between
two files of an `apart` level). Calls through function pointers (backend
vtables, teardown hooks) are not edges: they are how a lower layer calls
what registered with it. --edges prints every edge with the functions
called, --dot the graph in Graphviz form.
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layers  # noqa: E402  (the table's reader and rules)

LINE = re.compile(r"^(?P<ar>[^:]+):(?P<obj>[^:]+):\s*(?:[0-9a-fA-F]+)?\s+"
                  r"(?P<type>[A-Za-z])\s+(?P<sym>\S+)$")
DEFINED = set("TDBRWVG")


def read_nm(text):
    """{object: (defined set, undefined set)}"""
    objs = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        d, u = objs.setdefault(m["obj"], (set(), set()))
        if m["type"] == "U":
            u.add(m["sym"])
        elif m["type"] in DEFINED:
            d.add(m["sym"])
    return objs


def source_of(obj, files):
    """The table's source file an object was compiled from (by name)."""
    base = obj.split(".")[0]
    hits = [f for f in files if f.endswith((".c", ".cu")) and
            os.path.basename(check_layers.stem(f)) == base]
    return hits[0] if len(hits) == 1 else None


def graph(objs, files):
    """({file: {callee file: {symbols}}}, [unmapped objects])."""
    owner, unmapped, src = {}, [], {}
    for obj, (defined, _) in objs.items():
        f = source_of(obj, files)
        if f is None:
            unmapped.append(obj)
            continue
        src[obj] = f
        for s in defined:
            owner.setdefault(s, set()).add(f)
    edges = {f: {} for f in src.values()}
    for obj, (_, undefined) in objs.items():
        if obj not in src:
            continue
        a = src[obj]
        for s in undefined:
            for b in owner.get(s, ()):
                if b != a:
                    edges[a].setdefault(b, set()).add(s)
    return edges, unmapped


def cycles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archives", nargs="*")
    ap.add_argument("--nm", help="nm -A output to read instead of archives")
    ap.add_argument("--root", default=os.path.dirname(here))
    ap.add_argument("--table", default=None)
    ap.add_argument("--edges", action="store_true")
    ap.add_argument("--dot", action="store_true")
    args = ap.parse_args()
    table = args.table or os.path.join(args.root, "tools", "layers.txt")
    levels, _ = check_layers.read_table(table)
    files = check_layers.tree_files(args.root, check_layers.SCOPES)
    problems = []
    where = check_layers.level_of(files, levels, problems)
    if args.nm:
        with open(args.nm) as f:
            text = f.read()
    elif args.archives:
        text = subprocess.run(["nm", "-A"] + args.archives, check=True,
                              capture_output=True, text=True).stdout
    else:
        ap.error("give archives (lib*.a) or --nm FILE")
    objs = read_nm(text)
    edges, unmapped = graph(objs, files)
    for obj in sorted(unmapped):
        problems.append("%s: no source file of that name in the table" % obj)
    n = 0
    for a in sorted(edges):
        for b in sorted(edges[a]):
            n += 1
            syms = ", ".join(sorted(edges[a][b]))
            if args.edges:
                print("%s -> %s: %s" % (a, b, syms))
            if a in where and b in where and not check_layers.allowed(
                    a, b, where, levels):
                problems.append("%s (level %s) calls %s (level %s): %s" % (
                    a, levels[where[a]][0], b, levels[where[b]][0], syms))
    for comp in cycles(edges):
        problems.append("call cycle among %d files: %s" % (
            len(comp), ", ".join(comp)))
    if args.dot:
        print("digraph calls {")
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print('  "%s" -> "%s";' % (a, b))
        print("}")
    for p in problems:
        print("callgraph: " + p)
    if problems:
        print("callgraph: FAIL (%d problems)" % len(problems))
        return 1
    print("callgraph: OK (%d files, %d calling edges, no cycle, every call "
          "down the layer table)" % (len(edges), n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
