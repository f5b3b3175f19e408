#!/usr/bin/env bash
# abi_layout_test.sh — the frozen layouts are enforced by the build: the
# configuration code (runtime/core/core_config.c) compiles against this
# release's header, and fails, naming the moved field, against copies with
# a field inserted inside an embedded struct (zs_optimizer_config) or in
# the middle of zs_config. (Appending to zs_config's end compiles:
# config_future_test runs that. A field small enough to fit in alignment
# padding moves nothing, so no offset assertion sees it: that is left to
# an ABI comparison of the built library, docs/api.md.)
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
hdr="$root/runtime/include/zeroshard.h"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
compile() { # header dir -> status, messages in $tmp/out
  gcc -std=c11 -fsyntax-only -I "$1" -I "$root" "$root/runtime/core/core_config.c" \
    >"$tmp/out" 2>&1
}
mkdir -p "$tmp/same" "$tmp/embedded" "$tmp/middle"
cp "$hdr" "$tmp/same/zeroshard.h"
compile "$tmp/same" || { cat "$tmp/out"; echo "FAIL: this release's header does not compile"; exit 1; }
# a field inside zs_optimizer_config (frozen)
sed 's|^  double lr;           /\* param group 0|  double inserted;\n  double lr;           /* param group 0|' \
  "$hdr" >"$tmp/embedded/zeroshard.h"
grep -q "double inserted;" "$tmp/embedded/zeroshard.h" || { echo "FAIL: sed found no zs_optimizer_config.lr"; exit 1; }
if compile "$tmp/embedded"; then echo "FAIL: a field inserted in zs_optimizer_config compiled"; exit 1; fi
grep -q "moved: released fields are frozen" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: no frozen-layout message"; exit 1; }
grep -o "zs_[a-z_]*\.[a-z_]* moved" "$tmp/out" | sort -u | head -3
# a field in the middle of zs_config
sed 's|^  int prefetch_depth;       /\* stage 3|  int inserted;\n  int prefetch_depth;       /* stage 3|' \
  "$hdr" >"$tmp/middle/zeroshard.h"
grep -q "int inserted;" "$tmp/middle/zeroshard.h" || { echo "FAIL: sed found no zs_config.prefetch_depth"; exit 1; }
if compile "$tmp/middle"; then echo "FAIL: a field inserted in zs_config compiled"; exit 1; fi
grep -q "zs_config.prefetch_depth moved" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: the moved field is not named"; exit 1; }
echo "PASS: the frozen layouts are checked at build time"
