#!/usr/bin/env bash
# layers_test.sh — the tree passes the include, header and file-name checks
# of tools/check_layers.py against tools/layers.txt, and each check fails,
# naming the file, on a copy of the tree with one deliberate violation.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
check="$root/tools/check_layers.py"

python3 "$check" --root "$root" || { echo "FAIL: the tree breaks its layers"; exit 1; }

# A copy of the tree (real files, so they can be edited).
fresh() {
  rm -rf "$tmp/tree"
  mkdir -p "$tmp/tree"
  (cd "$root" && tar -chf - runtime optim offload tools/layers.txt) |
    (cd "$tmp/tree" && tar -xf -)
}
# expect_fail DESCRIPTION PATTERN: the check fails and says PATTERN
expect_fail() {
  if python3 "$check" --root "$tmp/tree" >"$tmp/out" 2>&1; then
    cat "$tmp/out"; echo "FAIL: $1 passed the check"; exit 1
  fi
  grep -qF -- "$2" "$tmp/out" || {
    cat "$tmp/out"; echo "FAIL: $1: no '$2' in the output"; exit 1; }
  echo "ok: $1 -> $(grep -F -- "$2" "$tmp/out" | head -1)"
}
add_include() { # file header: inserts the include after the file's first one
  sed -i "0,/^#include/s|^#include.*|&\n#include \"$2\"|" "$tmp/tree/$1"
  grep -q "#include \"$2\"" "$tmp/tree/$1" || { echo "FAIL: sed missed $1"; exit 1; }
}

fresh
add_include runtime/core/core_mem.c runtime/engine/engine.h
expect_fail "core including the engine" \
  "runtime/core/core_mem.c (level core) includes runtime/engine/engine.h (level engine): a higher level"

fresh
add_include runtime/engine/engine_grad.c runtime/engine/engine_model.h
expect_fail "one engine feature including another's header" \
  "runtime/engine/engine_grad.c (level engine-features) includes runtime/engine/engine_model.h (level engine-features): a sibling"

fresh
add_include runtime/engine/engine_grad.c engine_model.h
expect_fail "a sibling's header spelled from the same folder" \
  "runtime/engine/engine_grad.c (level engine-features) includes runtime/engine/engine_model.h (level engine-features): a sibling"

fresh
add_include runtime/core/core_mem.c ../engine/engine.h
expect_fail "the engine spelled relative to core" \
  "runtime/core/core_mem.c (level core) includes runtime/engine/engine.h (level engine): a higher level"

fresh
add_include runtime/layout/layout.c runtime/context/context.h
expect_fail "layout including the context" \
  "runtime/layout/layout.c (level layout) includes runtime/context/context.h"

fresh
cp "$tmp/tree/runtime/layout/layout.c" "$tmp/tree/runtime/ckpt/layout.c"
expect_fail "two files of one name" "layout.c: the name is used 2 times"

fresh
printf '/* nothing implements it */\n' >"$tmp/tree/runtime/engine/engine_extra.h"
expect_fail "a header without its implementation" \
  "runtime/engine/engine_extra.h: no engine_extra.c or .cu beside it"

fresh
printf 'int zs__stray;\n' >"$tmp/tree/runtime/core/stray.c"
sed -i 's|^core            peers  runtime/core/\*$|core            peers  runtime/core/core*|' "$tmp/tree/tools/layers.txt"
expect_fail "a file in no level" "runtime/core/stray.c: in no level"

echo "PASS: the layer checks hold on the tree and fail on each violation"
