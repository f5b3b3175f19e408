#!/usr/bin/env bash
# callgraph_test.sh — the calls between the library's files, read from its
# per-layer archives (symbols.txt: nm -A), have no cycle and go down the
# layer table; a call added from core to the engine's step is caught both
# as an upward call and as the cycle it closes.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
tool="$root/tools/callgraph.py"
symbols="$root/tests/layers/symbols.txt"

python3 "$tool" --root "$root" --nm "$symbols" ||
  { echo "FAIL: the call graph has a cycle or an upward call"; exit 1; }

# core_mem.c calls zs_step (engine_step.c), which reaches core through
# every layer: the graph now has a cycle through core and the step.
grep -q "engine_step.pic.o:[0-9a-f]* T zs_step$" "$symbols" ||
  { echo "FAIL: zs_step is not defined in engine_step's object"; exit 1; }
{ cat "$symbols"
  echo "libcore.a:core_mem.pic.o:                 U zs_step"; } >"$tmp/bad.txt"
if python3 "$tool" --root "$root" --nm "$tmp/bad.txt" >"$tmp/out" 2>&1; then
  cat "$tmp/out"; echo "FAIL: an upward call passed"; exit 1
fi
grep -F "runtime/core/core_mem.c (level core) calls runtime/engine/engine_step.c (level engine-features): zs_step" "$tmp/out" ||
  { cat "$tmp/out"; echo "FAIL: the upward call is not named"; exit 1; }
grep -E "call cycle among [0-9]+ files: .*runtime/core/core_mem.c.*runtime/engine/engine_step.c" "$tmp/out" ||
  { cat "$tmp/out"; echo "FAIL: the cycle is not named"; exit 1; }
echo "PASS: no call cycle, every call down the layers; a bad call is caught"
