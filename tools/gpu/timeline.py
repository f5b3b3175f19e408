#!/usr/bin/env python3
"""timeline.py PATH [STEP_MARKS] — summarizes a device timeline that
ZS_DEVICE_TIMELINE=PATH wrote (PATH.rank<R>.jsonl per rank; docs/cuda.md,
"The device timeline"): for each rank, the last backward pass's units
(from their "backward begin"/"backward end" marks, device milliseconds)
and the reductions (reduce-scatter, or the fixed-order reduce-scatter's
exchange) that ran on the device while another unit's backward ran,
with the overlap in milliseconds. A reduction issued at unit u's gradient
release that overlaps unit u-1's backward was neither waited for by the
host before u-1's kernels were queued nor serialized behind them.
Exit status 0 when some reduction overlapped a backward on every rank,
1 when not, 2 on bad input."""
import glob
import json
import sys


def load(path):
    items = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                items.append(json.loads(line))
    return items


def last_backward(items):
    """(unit, begin_ms, end_ms) of the last pass's backward, in order."""
    marks = [i for i in items if i["kind"] == "mark"]
    spans, open_at = [], {}
    for m in marks:
        if m["label"] == "backward begin":
            open_at[m["unit"]] = m["ms"]
        elif m["label"] == "backward end" and m["unit"] in open_at:
            spans.append((m["unit"], open_at.pop(m["unit"]), m["ms"]))
    if not spans:
        return []
    # the last pass: the last span of each unit
    units = {s[0] for s in spans}
    out = []
    for s in reversed(spans):
        out.append(s)
        if len(out) == len(units):
            break
    return list(reversed(out))


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    files = sorted(glob.glob(argv[1] + ".rank*.jsonl"))
    if not files:
        print("no timeline files %s.rank*.jsonl" % argv[1])
        return 2
    ok_all = True
    for path in files:
        items = load(path)
        spans = last_backward(items)
        if not spans:
            print("%s: no backward marks" % path)
            ok_all = False
            continue
        t0, t1 = spans[0][1], spans[-1][2]
        reds = [i for i in items if i["kind"] == "collective" and
                i["op"] in ("reduce-scatter", "exchange") and
                i["end_ms"] >= t0 and i["start_ms"] <= t1 + 1e3]
        found = 0
        compute = sum(e - b for _, b, e in spans)
        print("%s: last backward %.3f-%.3f ms, %d units, %.3f ms of "
              "backward compute, %d reductions" %
              (path, t0, t1, len(spans), compute, len(reds)))
        for r in reds:
            for unit, b, e in spans:
                ov = min(e, r["end_ms"]) - max(b, r["start_ms"])
                if ov > 0:
                    found += 1
                    if found <= 5:
                        print("  %s of %d bytes at %.3f-%.3f ms overlaps the "
                              "backward of %s (%.3f-%.3f ms) by %.3f ms" %
                              (r["op"], r["bytes"], r["start_ms"],
                               r["end_ms"], unit, b, e, ov))
        print("  %d reduction/backward overlaps" % found)
        ok_all = ok_all and found > 0
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
