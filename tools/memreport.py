#!/usr/bin/env python3
"""tools/zs memreport DIR: merge the per-rank profiles ZeroShard wrote
(ZS_PROFILE=DIR or zs_config.profile_dir; docs/profiling.md) into

  - a table: peak bytes per rank x memory category, from the last peak
    reset on (zs_model_init and, before the first step, zs_tensor_set end
    with one, so that initialization's staging is not a training peak;
    zs_memory_reset_peak too), as zs_memory_stats.peak counts,
  - a picture: each rank's memory over time, stacked by category (SVG),
    the time before the last peak reset shaded ("before the peak reset"),
  - the peak of every step's forward, backward and optimizer phases,
  - the communication summary: per collective calls, bytes (the full size
    per rank, as nccl-tests counts it), time, algbw and busbw, per step;
    with hybrid sharding the shard and replica groups' collectives apart
    ("all_gather [shard]", busbw at the group's size).

Every series of the picture is one <path class="series"> with
data-rank, data-category and data-max-bytes (its maximum from the last peak
reset on, as the table) attributes, so tools (and the
tests) can read the numbers behind it.

Exit status 2 with a message naming the file for a missing directory, no
profiles, a truncated or foreign file, missing ranks or files of different
runs.
"""
import argparse
import glob
import json
import os
import re
import sys

CATEGORIES = ["params", "params_gathered", "grads", "master_weights",
              "optimizer_states", "comm_buffers", "activations",
              "offload_host", "nvme_staging", "other", "stacked_views",
              "comm_segment"]
COLORS = ["#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f",
          "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#bab0ac", "#9c755f",
          "#ff9da7"]
BUSBW = {"all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n,
         "all_reduce": lambda n: 2 * (n - 1) / n,
         "broadcast": lambda n: 1.0,
         # a unit's shards to the ranks that use it (zs_unit_mark_unused):
         # counted as an all-gather's
         "gather": lambda n: (n - 1) / n}
# Files of one run start within this many seconds of each other.
SAME_RUN_S = 120.0


def fail(msg, status=1):
    """Says what is wrong and exits: 1 for the profiles (a runtime error),
    2 for the command line (a usage error)."""
    print("zs memreport: " + msg, file=sys.stderr)
    sys.exit(status)


def refuse_repeats(argv):
    """A flag given twice is a usage error (every flag is one setting)."""
    seen = set()
    for a in argv:
        if a.startswith("--") and a != "--help":
            name = a.split("=", 1)[0]
            if name in seen:
                fail("%s given twice (give each flag once)" % name, 2)
            seen.add(name)


def load(directory, context=None):
    if not os.path.isdir(directory):
        fail("%s: not a directory" % directory)
    # A process's first context writes zs_profile_rank<R>.json, its later
    # ones zs_profile_rank<R>.ctx<K>.json: one context's files are merged,
    # the first's unless --context K names another.
    groups = {}
    for p in glob.glob(os.path.join(directory, "zs_profile_rank*.json")):
        m = re.search(r"zs_profile_rank\d+(?:\.ctx(\d+))?\.json$", p)
        if m:
            groups.setdefault(int(m.group(1) or 0), []).append(p)
    if not groups:
        fail("%s: no zs_profile_rank<R>.json files (run with ZS_PROFILE=%s)"
             % (directory, directory))
    if context is None:
        context = 0 if 0 in groups or len(groups) > 1 else min(groups)
        if context not in groups:
            fail("%s: profiles of several contexts (.ctx%s files) and none of "
                 "a first one: choose one with --context K"
                 % (directory, ", .ctx".join(str(k) for k in sorted(groups))))
        others = sorted(k for k in groups if k != context)
        if others:
            print("memreport: merging the first context's files; this "
                  "directory also has other contexts' (--context %s)"
                  % " or ".join(str(k) for k in others), file=sys.stderr)
    elif context not in groups:
        fail("%s: no profiles of context %d (found: %s)"
             % (directory, context, ", ".join(str(k) for k in sorted(groups))))
    paths = sorted(groups[context])
    profiles = []
    for p in paths:
        try:
            with open(p) as f:
                d = json.load(f)
        except (ValueError, OSError) as e:
            fail("%s: truncated or not JSON (%s)" % (p, e))
        meta = d.get("otherData", {}) if isinstance(d, dict) else {}
        events = d.get("traceEvents") if isinstance(d, dict) else None
        if meta.get("format") != "zeroshard-profile" or \
                not isinstance(events, list) or \
                not all(isinstance(e, dict) for e in events) or \
                not isinstance(meta.get("world"), int) or \
                not isinstance(meta.get("rank"), int) or \
                not isinstance(meta.get("start_unix_s"), (int, float)):
            fail("%s: not a ZeroShard profile" % p)
        m = re.search(r"rank(\d+)(?:\.ctx\d+)?\.json$", p)
        if m is None or int(m.group(1)) != meta.get("rank"):
            fail("%s: the file name and its rank (%s) disagree"
                 % (p, meta.get("rank")))
        profiles.append((p, meta, d["traceEvents"]))
    worlds = {meta["world"] for _, meta, _ in profiles}
    runs = {meta.get("run_id") for _, meta, _ in profiles}
    starts = [meta["start_unix_s"] for _, meta, _ in profiles]
    if len(worlds) != 1 or len(runs) != 1 or \
            max(starts) - min(starts) > SAME_RUN_S:
        fail("%s: files of different runs (run ids %s, world sizes %s); keep "
             "one run per directory" % (directory, sorted(map(str, runs)),
                                        sorted(worlds)))
    world = worlds.pop()
    ranks = sorted(meta["rank"] for _, meta, _ in profiles)
    missing = sorted(set(range(world)) - set(ranks))
    if missing or len(ranks) != world:
        fail("%s: world size %d but ranks %s are missing" %
             (directory, world, ", ".join(map(str, missing)) or
              "(some rank has two files)"))
    return world, sorted(profiles, key=lambda x: x[1]["rank"])


def memory_series(events):
    """[(t_seconds, {category: bytes})] from the counter samples."""
    out = []
    for e in events:
        if e.get("ph") == "C" and e.get("name") == "memory":
            out.append((e["ts"] / 1e6, e["args"]))
    return out


def peak_reset_time(events):
    """When the accounting's peaks last restarted (a "peak reset" mark),
    or None."""
    marks = [e["ts"] / 1e6 for e in events
             if e.get("ph") == "X" and e.get("name") == "peak reset"]
    return max(marks) if marks else None


def since_reset(series, t_reset):
    """The samples the peaks count: from the value current at the reset
    (the last sample at or before it) on."""
    if t_reset is None:
        return series
    first = 0
    for j, (t, _) in enumerate(series):
        if t <= t_reset:
            first = j
    return series[first:]


def phase_peaks(events):
    """Per completed step: the peak total bytes of its forward, backward and
    step phases (the phase spans of the timeline; each phase counts what
    was allocated when it began, as zs_memory_stats.phase_peak does)."""
    samples = memory_series(events)
    times = [t for t, _ in samples]
    totals = [sum(s.get(c, 0) for c in CATEGORIES) for _, s in samples]
    spans = sorted((e for e in events
                    if e.get("ph") == "X" and e.get("cat") == "phase"),
                   key=lambda e: e["ts"])
    steps, cur = [], {}
    import bisect
    for e in spans:
        t0, t1 = e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6
        i = bisect.bisect_right(times, t0) - 1  # the value when it began
        j = bisect.bisect_right(times, t1)
        window = totals[max(i, 0):j] if totals else [0]
        cur[e["name"]] = max(window) if window else 0
        if e["name"] == "step":  # a step ends with its optimizer phase
            steps.append({p: cur.get(p, 0) for p in ("forward", "backward", "step")})
            cur = {}
    return steps


def comm_summary(profiles, world):
    ops, steps = {}, 0
    for _, meta, events in profiles[:1]:  # every rank issues the same
        for e in events:
            if e.get("ph") != "X":
                continue
            if e.get("cat") == "step" and e.get("name") == "zs_step":
                steps += 1
            if e.get("cat") != "comm":
                continue
            op = e["name"].split(" ")[0]
            # hybrid sharding: "all_gather (param gather; shard group of 2)"
            g = re.search(r"; (\w+) group of (\d+)\)$", e["name"])
            n = world
            if g:
                op, n = "%s [%s]" % (op, g.group(1)), int(g.group(2))
            s = ops.setdefault(op, {"calls": 0, "bytes": 0, "seconds": 0.0,
                                    "ranks": n})
            s["calls"] += 1
            s["bytes"] += e["args"].get("bytes", 0)
            s["seconds"] += e["dur"] / 1e6
    for op, s in ops.items():
        s["algbw_GBps"] = s["bytes"] / s["seconds"] / 1e9 if s["seconds"] > 0 else 0.0
        s["busbw_GBps"] = s["algbw_GBps"] * BUSBW.get(op.split(" ")[0],
                                                      lambda n: 0.0)(s["ranks"])
        s["calls_per_step"] = s["calls"] / steps if steps else 0.0
        s["bytes_per_step"] = s["bytes"] / steps if steps else 0.0
    return {"ranks": world, "steps": steps, "ops": ops}


def svg(profiles, width=900, panel=150):
    left, right, top, gap = 90, 200, 30, 40
    plot_w = width - left - right
    height = top + len(profiles) * (panel + gap)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="11">' % (width, height),
           '<title>ZeroShard memory per rank, stacked by category</title>']
    for i, (_, meta, events) in enumerate(profiles):
        series = memory_series(events)
        if not series:
            continue
        rank = meta["rank"]
        y0 = top + i * (panel + gap)
        t_end = max(series[-1][0], 1e-9)
        totals = [sum(v for k, v in s.items() if k in CATEGORIES) for _, s in series]
        ymax = max(max(totals), 1)
        used = [c for c in CATEGORIES if any(s.get(c, 0) for _, s in series)]
        out.append('<text x="%d" y="%d" font-weight="bold">rank %d</text>'
                   % (left, y0 - 8, rank))
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" '
                   'stroke="#999"/>' % (left, y0, plot_w, panel))
        out.append('<text x="%d" y="%d" text-anchor="end">%.1f MiB</text>'
                   % (left - 4, y0 + 10, ymax / 2**20))
        out.append('<text x="%d" y="%d" text-anchor="end">0</text>'
                   % (left - 4, y0 + panel))
        out.append('<text x="%d" y="%d" text-anchor="end">%.3f s</text>'
                   % (left + plot_w, y0 + panel + 14, t_end))

        def xy(t, b):
            return (left + plot_w * t / t_end, y0 + panel - panel * b / ymax)
        t_reset = peak_reset_time(events)
        counted = since_reset(series, t_reset)
        if t_reset is not None:  # what the peaks leave out
            out.append('<rect class="before-reset" x="%d" y="%d" width="%.2f" '
                       'height="%d" fill="#eee"/><text x="%d" y="%d" '
                       'fill="#777">before the peak reset</text>'
                       % (left, y0, plot_w * t_reset / t_end, panel, left + 4,
                          y0 + 12))
        below = [0] * len(series)
        for c in used:
            vals = [s.get(c, 0) for _, s in series]
            upper = [b + v for b, v in zip(below, vals)]
            pts = []
            for j, (t, _) in enumerate(series):  # a step function
                t_next = series[j + 1][0] if j + 1 < len(series) else t_end
                pts.append(xy(t, upper[j]))
                pts.append(xy(t_next, upper[j]))
            for j in range(len(series) - 1, -1, -1):
                t = series[j][0]
                t_next = series[j + 1][0] if j + 1 < len(series) else t_end
                pts.append(xy(t_next, below[j]))
                pts.append(xy(t, below[j]))
            d = "M" + " L".join("%.2f,%.2f" % p for p in pts) + " Z"
            # its maximum as the peaks count it (from the last reset on)
            peak = max(s.get(c, 0) for _, s in counted)
            out.append('<path class="series" data-rank="%d" data-category="%s" '
                       'data-max-bytes="%d" fill="%s" stroke="none" d="%s"/>'
                       % (rank, c, peak, COLORS[CATEGORIES.index(c)], d))
            below = upper
    for k, c in enumerate(CATEGORIES):  # legend
        out.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>'
                   '<text x="%d" y="%d">%s</text>'
                   % (width - right + 20, top + 16 * k, COLORS[k],
                      width - right + 36, top + 16 * k + 9, c))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(prog="zs memreport", allow_abbrev=False,
                                 description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--svg", help="where to write the picture [DIR/memreport.svg]")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object instead of tables")
    ap.add_argument("--context", type=int, metavar="K",
                    help="merge the zs_profile_rank<R>.ctx<K>.json files "
                    "(a process's later contexts; 0: the first context's "
                    "zs_profile_rank<R>.json) [the first context's]")
    refuse_repeats(sys.argv[1:])
    a = ap.parse_args()
    if a.context is not None and a.context < 0:
        fail("--context: expected a context number >= 0, got %d" % a.context, 2)
    world, profiles = load(a.dir, a.context)
    peaks = []
    for _, meta, events in profiles:
        row = {c: 0 for c in CATEGORIES}
        total = 0
        for _, s in since_reset(memory_series(events), peak_reset_time(events)):
            for c in CATEGORIES:
                row[c] = max(row[c], s.get(c, 0))
            total = max(total, sum(s.get(c, 0) for c in CATEGORIES))
        row["total"] = total
        peaks.append(row)
    comm = comm_summary(profiles, world)
    phases = [phase_peaks(events) for _, _, events in profiles]
    path = a.svg or os.path.join(a.dir, "memreport.svg")
    svg_error = None
    try:
        with open(path + ".tmp", "w") as f:
            f.write(svg(profiles))
        os.replace(path + ".tmp", path)
    except OSError as e:
        svg_error = "%s: cannot write the picture (%s)" % (path, e)
        try:
            os.unlink(path + ".tmp")
        except OSError:
            pass
        path = None
    if a.json:
        print(json.dumps({"ranks": world, "peak_bytes": peaks, "comm": comm,
                          "phase_peak_total_bytes": phases, "svg": path}))
        if svg_error:
            print("zs memreport: " + svg_error, file=sys.stderr)
            sys.exit(1)
        return
    used = [c for c in CATEGORIES if any(r[c] for r in peaks)] + ["total"]
    print("peak MiB per rank and category (%d ranks)" % world)
    print("%-6s" % "rank" + "".join("%17s" % c for c in used))
    for rank, r in enumerate(peaks):
        print("%-6d" % rank + "".join("%17.3f" % (r[c] / 2**20) for c in used))
    print("\npeak MiB per phase of each zs_step call (with gradient "
          "accumulation: each micro-batch), rank 0 (%d calls%s)" % (
        len(phases[0]), ", the last 10" if len(phases[0]) > 10 else ""))
    print("%-6s %12s %12s %12s" % ("step", "forward", "backward", "step"))
    first = max(0, len(phases[0]) - 10)
    for k, s in enumerate(phases[0][first:], start=first + 1):
        print("%-6d %12.3f %12.3f %12.3f" % (k, s["forward"] / 2**20,
                                             s["backward"] / 2**20, s["step"] / 2**20))
    print("\ncommunication, rank 0, %d zs_step calls, %d ranks (bytes: full "
          "size per rank, as nccl-tests; per step = per zs_step call)"
          % (comm["steps"], world))
    print("%-25s %8s %14s %10s %11s %11s %10s" % (
        "op", "calls", "bytes", "seconds", "algbw GB/s", "busbw GB/s",
        "calls/step"))
    for op, s in sorted(comm["ops"].items()):
        print("%-25s %8d %14d %10.4f %11.3f %11.3f %10.1f" % (
            op, s["calls"], s["bytes"], s["seconds"], s["algbw_GBps"],
            s["busbw_GBps"], s["calls_per_step"]))
    if svg_error:
        print("zs memreport: " + svg_error, file=sys.stderr)
        sys.exit(1)
    print("\npicture: %s" % path)


if __name__ == "__main__":
    main()
