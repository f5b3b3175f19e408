#!/bin/bash
# prefetch_bench_test.sh BENCH — tools/zs bench prefetch's binary end to
# end at 2 ranks, one short repetition without sleeps: it exits 0 and its
# last line is the JSON object with every figure; the deterministic ones
# hold (off prefetches nothing; under the live limit the gathered peak is
# off's and some all-gathers are prefetched; each configuration issues
# off's all-gathers). Timing is printed, not asserted.
set -u
bench=$1
run_mpi=tests/testing/run_mpi.sh
out=$("$run_mpi" 2 "$bench" --reps 1 --steps 4 --sleep-us 0 2>&1)
rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "FAIL: prefetch_bench exited $rc"; exit 1; }
echo "$out" | tail -1 > "${TEST_TMPDIR:-/tmp}/prefetch_bench.json"
python3 - "${TEST_TMPDIR:-/tmp}/prefetch_bench.json" <<'PY' || exit 1
import json, sys
j = json.load(open(sys.argv[1]))
bad = []
off = j["off"]
for k in ("off", "depth2", "limit"):
    c = j[k]
    for f in ("all_gather_wait_ms", "all_gathers", "prefetched", "gathered_peak_bytes"):
        if not isinstance(c.get(f), (int, float)) or c[f] < 0:
            bad.append("%s.%s = %r" % (k, f, c.get(f)))
    if c["all_gathers"] != off["all_gathers"]:
        bad.append("%s issued %s all-gathers, off %s" % (k, c["all_gathers"], off["all_gathers"]))
if off["prefetched"] != 0: bad.append("off prefetched")
if j["limit"]["prefetched"] <= 0: bad.append("nothing prefetched under the limit")
if j["limit"]["ratio_peak_to_off"] != 1.0:
    bad.append("limit peak ratio %s" % j["limit"]["ratio_peak_to_off"])
if j["depth2"]["ratio_peak_to_off"] <= 1.0:
    bad.append("depth 2 without the limit held no more than off")
if j["ranks"] != 2 or j["reps"] != 1: bad.append("ranks/reps")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
# Bad arguments are refused with the usage.
msg=$("$run_mpi" 1 "$bench" --reps 0 2>&1)
rc=$?
[ "$rc" = 2 ] && echo "$msg" | grep -q "bad argument '--reps' 0" ||
  { echo "FAIL: --reps 0: exit $rc: $msg"; exit 1; }
echo PASS
