#!/usr/bin/env bash
# cli_test.sh — the command line (docs/install.md, "Command-line tools"):
# tools/zs from a copy of the repository whose `bazel` is a stand-in (it
# builds nothing: the programs it would build are this test's, already
# built), and the installed zs, with no Bazel at all:
#  - `help` and `--version` work from any directory;
#  - `--help` on every command prints usage on stdout and exits 0;
#  - every command refuses a flag given twice (exit 2, naming it);
#  - usage errors exit 2, runtime errors 1;
#  - the installed programs need neither Bazel nor the CUDA libraries (no
#    CUDA library among their DT_NEEDED, resolved with the CUDA names
#    shadowed by empty files).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# A repository copy: tools/zs and what it reads, the built programs where
# bazel-bin would have them, and a bazel that only records its calls.
repo="$tmp/repo"
rm -rf "$repo"; mkdir -p "$repo/tools" "$repo/runtime/include" \
  "$repo/bazel-bin/tools" "$repo/bazel-bin/examples/gpt2" "$tmp/bin"
cp "$root/tools/zs" "$root/tools/memreport.py" "$repo/tools/"
cp "$root/runtime/include/zeroshard.h" "$repo/runtime/include/"
for p in zs_estimate zs_ckpt zs_env; do ln -s "$root/tools/$p" "$repo/bazel-bin/tools/$p"; done
ln -s "$root/examples/gpt2/train_sharded" "$repo/bazel-bin/examples/gpt2/train_sharded"
printf '#!/bin/sh\necho "$*" >>"%s/bazel_calls"\n' "$tmp" >"$tmp/bin/bazel"
chmod +x "$tmp/bin/bazel"
export PATH="$tmp/bin:/usr/bin:/bin"
zs="$repo/tools/zs"
version=$(printf '%s.%s.%s' \
  "$(sed -n 's/^#define ZS_VERSION_MAJOR //p' "$root/runtime/include/zeroshard.h")" \
  "$(sed -n 's/^#define ZS_VERSION_MINOR //p' "$root/runtime/include/zeroshard.h")" \
  "$(sed -n 's/^#define ZS_VERSION_PATCH //p' "$root/runtime/include/zeroshard.h")")

# expect RC PATTERN CMD...: CMD (run in an unrelated directory) exits RC
# and its output (stdout for 0, stderr otherwise) says PATTERN
expect() {
  local rc=$1 pat=$2 got; shift 2
  set +e
  (cd "$tmp" && "$@") >"$tmp/out" 2>"$tmp/err"
  got=$?
  set -e
  local where="$tmp/err"; [ "$rc" = 0 ] && where="$tmp/out"
  if [ "$got" != "$rc" ]; then
    fail "$* exited $got, expected $rc"; sed 's/^/    /' "$tmp/out" "$tmp/err" | head -5
  elif ! grep -qiE -- "$pat" "$where"; then
    fail "$*: no '$pat' in its $( [ "$rc" = 0 ] && echo stdout || echo stderr)"
    sed 's/^/    /' "$tmp/out" "$tmp/err" | head -5
  else
    echo "ok: $(basename "$1") ${*:2} -> $got: $(grep -iE -m1 -- "$pat" "$where" | cut -c1-90)"
  fi
}

echo "== tools/zs"
expect 0 "tools/zs demo" "$zs" help
expect 0 "^zs \(ZeroShard\) $version$" "$zs" --version
expect 2 "unknown command" "$zs" frobnicate
expect 0 "tools/zs estimate" "$zs" help estimate
expect 2 "unknown command" "$zs" help frobnicate
expect 0 "tools/zs test" "$zs" test --help --help
for c in test demo bench estimate memreport consolidate inspect env install setup; do
  expect 0 "usage|tools/zs $c" "$zs" $c --help
done
expect 0 "--ranks N" "$zs" demo --help
expect 0 "--params" "$zs" estimate --help
expect 2 "--long given twice" "$zs" test --long --long
expect 2 "--ranks given twice" "$zs" demo --ranks 2 --ranks 4
expect 2 "--steps given twice" "$zs" demo --steps 2 --steps 4
expect 2 "--reps given twice" "$zs" bench optimizer --reps 1 --reps 2
expect 2 "--ranks given twice" "$zs" estimate --params 1e6 --ranks 2 --ranks 4
expect 2 "--json given twice" "$zs" memreport "$tmp" --json --json
expect 2 "--dtype given twice" "$zs" consolidate ck out.st --dtype bf16 --dtype fp32
expect 2 "--json given twice" "$zs" inspect ck --json --json
expect 2 "--prefix given twice" "$zs" install --prefix a --prefix b
expect 2 "given twice" "$zs" env --x --x
expect 2 "given twice" "$zs" setup --x --x
expect 2 "unknown option" "$zs" test --frob
expect 2 "unexpected argument" "$zs" env extra
expect 2 "expected a directory" "$zs" install --prefix
expect 1 "cannot|no such|not" "$zs" inspect "$tmp/no-such-checkpoint"
expect 1 "no profiles|not a directory|no such" "$zs" memreport "$tmp/no-such-dir"
expect 0 "ZeroShard +$version" "$zs" env
expect 0 "per rank|rank" "$zs" estimate --params 1e6 --ranks 2
[ ! -e "$tmp/bazel_calls" ] || grep -vE '^build //tools:(zs_estimate|zs_ckpt|zs_env)$|^build //examples/gpt2:train_sharded //examples/gpt2:train_plain$|^info output_base$' "$tmp/bazel_calls" &&
  fail "tools/zs ran bazel for something else: $(sort -u "$tmp/bazel_calls" | tr '\n' ';')"

echo "== the installed zs (no bazel on PATH)"
prefix="$tmp/prefix"
sh "$root/tools/dist/install.sh" "$root/tools/dist/zeroshard.tar" "$prefix" >/dev/null
rm -f "$tmp/bin/bazel"
# a library path holding empty stand-ins named like the CUDA libraries:
# a program that needed them would fail to load
mkdir -p "$tmp/nocuda"
for l in libcudart.so.13 libnccl.so.2 libcuda.so.1; do : >"$tmp/nocuda/$l"; done
for p in "$prefix"/libexec/zeroshard/zs-{estimate,ckpt,env}; do
  if LD_LIBRARY_PATH="$tmp/nocuda" ldd "$p" | grep -E "libcudart|libnccl|libcuda|not found"; then
    fail "$(basename "$p") needs CUDA libraries or something missing"
  fi
done
izs="$prefix/bin/zs"
expect 0 "zs estimate" "$izs" help
expect 0 "^zs \(ZeroShard\) $version$" "$izs" --version
expect 2 "unknown command" "$izs" frobnicate
expect 0 "usage: zs estimate" "$izs" help estimate
expect 2 "unknown command" "$izs" help frobnicate
expect 0 "usage: zs memreport" "$izs" memreport --help --help
for c in estimate memreport consolidate inspect env; do
  expect 0 "usage" "$izs" $c --help
done
expect 2 "--ranks given twice" "$izs" estimate --params 1e6 --ranks 2 --ranks 4
expect 2 "--json given twice" "$izs" memreport "$tmp" --json --json
expect 2 "--dtype given twice" "$izs" consolidate ck out.st --dtype bf16 --dtype fp32
expect 2 "--verify given twice" "$izs" inspect ck --verify --verify
expect 2 "unexpected argument" "$izs" env extra
expect 1 "cannot|no such|not" "$izs" inspect "$tmp/no-such-checkpoint"
expect 0 "ZeroShard +$version" env LD_LIBRARY_PATH="$tmp/nocuda" "$izs" env
expect 0 "installed +$version \\(.*/lib/libzeroshard.so.$version\\)" "$izs" env
expect 0 "rank" env LD_LIBRARY_PATH="$tmp/nocuda" "$izs" estimate --params 1e6 --ranks 2

[ $fails = 0 ] || { echo "FAIL: $fails check(s) failed"; exit 1; }
echo "PASS: help, --version, usage, repeated flags and exit codes, with and without the repository"
