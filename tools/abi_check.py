#!/usr/bin/env python3
"""abi_check.py — libzeroshard's ABI against a baseline, by ZeroShard's rules.

Usage: abi_check.py BASELINE.abi LIB.so HEADERS_DIR

Reads LIB's ABI with libabigail's abidw as the baseline was read (public
types only; BASELINE: abidw's XML of the release the promise starts from;
HEADERS_DIR: the public headers LIB was built with), compares the two
with abidiff, and accepts its report only if every change is one the rules of
docs/api.md, "Versions and compatibility", allow (docs/install.md, "The
ABI promise"):
  - functions added;
  - members appended to a versioned struct (one whose first member is
    `size_t struct_size`, read from HEADERS_DIR/zeroshard.h): its size
    grows and each inserted member lies at or past its old end;
  - enumerators appended to an enum that ends in a `..._COUNT` sentinel:
    the sentinel's value grows, and each new enumerator takes a value from
    its old value on (no existing enumerator changes value; arrays sized by
    a sentinel in the public structs use their ..._CAP, so they stay),
    also where the enum is a struct member's type.
Anything else in the report (a function removed or changed, a member
moved, removed, retyped or inserted before the end, a change to a struct
that is not versioned, a line this script does not know) is a break: exit
1, with the report and the lines that broke it. Exit 0 otherwise, 2 on a
usage error or when abidiff cannot run.

libabigail's own suppression for this (`has_data_member_inserted_at =
end`) is not enough: in libabigail 2.2 it also hides a change that moves
two members without inserting any (tests/install/abi_test shows it), so
the report is read here instead.
"""
import os
import re
import subprocess
import sys
import tempfile

# Lines of an abidiff report that carry no change by themselves.
NEUTRAL = [
    r"Functions changes summary: 0 Removed, \d+ Changed(?: \(\d+ filtered out\))?, \d+ Added functions?",
    r"Variables changes summary: 0 Removed, \d+ Changed(?: \(\d+ filtered out\))?, \d+ Added variables?",
    r"Function symbols changes summary: 0 Removed, \d+ Added .*",
    r"Variable symbols changes summary: 0 Removed, \d+ Added .*",
    r"\d+ functions? with some indirect sub-type changes?:",
    r"\d+ Added functions?:",
    r"\[A\] 'function .*",
    r"\[C\] 'function .*' (?:at \S+ )?has some indirect sub-type changes:",
    r"parameter \d+ of type '.*' has sub-type changes:",
    r"return type changed:",
    r"in pointed to type '.*'(?: at \S+)?:",
    r"in unqualified underlying type '.*'(?: at \S+)?:",
    r"in referenced type '.*'(?: at \S+)?:",
    r"\d+ data member insertions?:",
    r"type size hasn't changed",
    r"\d+ enumerator (?:insertions?|changes?):",
    # a member whose type changed: what changed follows (an enum judged
    # below; anything else is a line this script does not know: a break)
    r"\d+ data member changes?:",
    r"type of '.*' changed:",
]
UNDERLYING = re.compile(r"underlying type 'struct (\w+)'(?: at \S+)? changed:")
SIZE = re.compile(r"type size changed from (\d+) to (\d+) \(in bits\)")
INSERTED = re.compile(r"'.*', at offset (\d+) \(in bits\)(?: at \S+)?")
ENUM = re.compile(r"underlying type 'enum (\w+)'(?: at \S+)? changed:")
ENUM_INSERTED = re.compile(r"'(\w+)::(\w+)' value '(-?\d+)'")
ENUM_CHANGED = re.compile(
    r"'(\w+)::(\w+)' from value '(-?\d+)' to '(-?\d+)'(?: at \S+)?")


def versioned_structs(header):
    """Names of the typedef'd structs whose first member is struct_size."""
    text = open(header).read()
    return set(re.findall(
        r"typedef struct (\w+) \{\s*size_t struct_size;", text))


def judge(report, versioned):
    """The report's lines that break the rules (empty: compatible)."""
    bad = []
    struct, old_size = None, None
    inserted = {}  # enum -> [(line, value)], judged against its sentinel
    sentinel = {}  # enum -> (old, new) value of its ..._COUNT
    for raw in report.splitlines():
        line = raw.strip()
        if not line or any(re.fullmatch(p, line) for p in NEUTRAL):
            continue
        m = ENUM.fullmatch(line)
        if m:
            struct = None
            continue
        m = ENUM_INSERTED.fullmatch(line)
        if m:
            inserted.setdefault(m.group(1), []).append((line, int(m.group(3))))
            continue
        m = ENUM_CHANGED.fullmatch(line)
        if m:
            old, new = int(m.group(3)), int(m.group(4))
            if m.group(2).endswith("_COUNT") and new > old:
                sentinel[m.group(1)] = (old, new)
            else:
                bad.append(line + "  <- an existing enumerator changed value")
            continue
        m = UNDERLYING.fullmatch(line)
        if m:
            struct, old_size = m.group(1), None
            if struct not in versioned:
                bad.append(line + "  <- not a versioned struct (frozen)")
            continue
        m = SIZE.fullmatch(line)
        if m and struct is not None:
            old, new = int(m.group(1)), int(m.group(2))
            old_size = old
            if new < old:
                bad.append(line + "  <- a versioned struct only grows")
            continue
        m = INSERTED.fullmatch(line)
        if m and struct is not None:
            if old_size is None or int(m.group(1)) < old_size:
                bad.append(line + "  <- inserted before the end of %s" % struct)
            continue
        bad.append(line)
    for enum, lines in inserted.items():
        old, new = sentinel.get(enum, (None, None))
        for line, value in lines:
            if old is None or not old <= value < new:
                bad.append(line + "  <- not appended before %s's _COUNT" % enum)
    return bad


def main(argv):
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    baseline, lib, headers = argv[1:]
    try:
        versioned = versioned_structs(headers + "/zeroshard.h")
        # The library's ABI read the way the baseline was (abidw, public
        # types only), then the two compared: comparing the XML with the
        # binary itself lets libabigail call a change "harmless" and hide
        # it (the opaque handles are declarations in one, definitions in
        # the other), so a field retyped to one of the same size passed.
        with tempfile.TemporaryDirectory() as tmp:
            current = os.path.join(tmp, "current.abi")
            w = subprocess.run(["abidw", "--headers-dir", headers,
                                "--drop-private-types", "--out-file",
                                current, lib], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            if w.returncode != 0:
                print(w.stdout + "abi_check: abidw failed (exit %d)"
                      % w.returncode, file=sys.stderr)
                return 2
            r = subprocess.run(["abidiff", baseline, current],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        print("abi_check: %s (abidiff is Debian's abigail-tools)" % e,
              file=sys.stderr)
        return 2
    if r.returncode & 1:  # ABIDIFF_ERROR
        print(r.stdout + "abi_check: abidiff failed (exit %d)" % r.returncode,
              file=sys.stderr)
        return 2
    if r.returncode == 0:
        print("abi_check: no ABI change from %s" % baseline)
        return 0
    bad = judge(r.stdout, versioned)
    sys.stdout.write(r.stdout)
    if bad:
        print("abi_check: BREAK: changes the rules do not allow:")
        for b in bad:
            print("  " + b)
        return 1
    print("abi_check: compatible: only additions (functions, members "
          "appended to versioned structs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
