#!/usr/bin/env python3
"""testsum.py — counts GoogleTest cases from a Bazel test run.

Reads Bazel's per-target summary lines from the run's log, and for every
target that ran, its GoogleTest XML under bazel-testlogs/. A test case run
at several world sizes (one target per size) counts once per size. A
target that failed without a failed case in its XML (a crash, a timeout, a
hang) counts as one failed case; a target that failed to build or has no
status counts as one failed case; a target Bazel skipped as incompatible
with this build (SKIPPED: the CUDA toolkit's, where it is missing) counts
as one skipped case. Prints a table of failures and the final
line "N passed, N failed, N skipped"; exits 1 if anything failed.
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

LINE = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?"
    r"(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|FLAKY|SKIPPED)\b")


def count_xml(path):
    """Returns (passed, failed, skipped, failed_names) of one test.xml."""
    passed = failed = skipped = 0
    names = []
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # A stale longer file overwritten in place can leave bytes after the
    # document: only the first document counts.
    end = text.find("</testsuites>")
    if end >= 0:
        text = text[:end + len("</testsuites>")]
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return "unreadable"
    for case in root.iter("testcase"):
        # Bazel's own XML for a test that died (a timeout) has no classname
        cls = case.get("classname")
        name = "%s.%s" % (cls, case.get("name", "?")) if cls else case.get("name", "?")
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            names.append(name)
        elif case.get("result") == "skipped" or case.get("status") == "notrun" \
                or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--testlogs", required=True)
    ap.add_argument("--bazel-rc", type=int, default=0)
    ap.add_argument("--extra", action="append", default=[],
                    metavar="NAME=STATUS",
                    help="a check run outside Bazel, counted as one case: "
                         "STATUS is PASSED, FAILED or SKIPPED (and why)")
    args = ap.parse_args()
    targets = {}
    with open(args.log, errors="replace") as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                targets[m.group(1)] = m.group(2)
    passed = failed = skipped = 0
    problems = []
    skipped_targets = []
    for target, status in sorted(targets.items()):
        pkg, name = target[2:].split(":", 1)
        xml = os.path.join(args.testlogs, pkg, name, "test.xml")
        counts = None
        if status == "SKIPPED":
            # incompatible with this build (target_compatible_with: the
            # CUDA toolkit's targets where it is missing): one skip each
            skipped += 1
            skipped_targets.append(target)
            continue
        if status in ("PASSED", "FAILED", "TIMEOUT", "FLAKY"):
            counts = count_xml(xml)
        if counts == "unreadable":
            failed += 1
            problems.append("%s: its test.xml cannot be parsed" % target)
            continue
        if counts is None:
            if status == "PASSED":
                passed += 1
            else:
                failed += 1
                problems.append("%s: %s" % (target, status))
            continue
        p, fl, s, names = counts
        passed, skipped = passed + p, skipped + s
        failed += fl
        problems += ["%s: %s" % (target, n) for n in names]
        if status not in ("PASSED", "FLAKY") and fl == 0:
            failed += 1  # the target failed outside any test case
            problems.append("%s: %s outside a test case (see its test.log)"
                            % (target, status))
    if args.bazel_rc not in (0, 3) and not problems:
        failed += 1  # a build error in a target no test depends on
        problems.append("bazel exited with %d (build error?)" % args.bazel_rc)
    for e in args.extra:
        name, _, status = e.partition("=")
        if status == "PASSED":
            passed += 1
        elif status.startswith("SKIPPED"):
            skipped += 1
            print("\nskipped: %s: %s" % (name, status))
        else:
            failed += 1
            problems.append("%s: %s" % (name, status or "no status"))
    if not targets and args.bazel_rc == 4:
        problems.append("no test targets matched")
        failed += 1
    if skipped_targets:
        print("\n%d test target(s) not built here (incompatible with this "
              "build, e.g. they need the CUDA toolkit), one skip each:"
              % len(skipped_targets))
        for t in skipped_targets:
            print("  " + t)
    if problems:
        print("\nFailures:")
        for p in problems:
            print("  " + p)
    print("\n%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
