#!/usr/bin/env bash
# symbols_test.sh — libzeroshard exports exactly its public API: the
# functions the public headers declare (and those of 0.1's headers, which
# programs built against 0.1 still call) equal runtime/zeroshard.map's
# list, the shared library's exported symbols and the static library's
# global symbols; the SONAME is libzeroshard.so.MAJOR; no internal (zs__)
# symbol is global in either. A list with one extra or one missing name
# is shown to fail the comparison.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
so="$root/runtime/libzeroshard.so"
a="$root/runtime/libzeroshard.a"
map="$root/runtime/zeroshard.map"
mpi_inc=/usr/lib/x86_64-linux-gnu/openmpi/include

# declared DIR: the functions the headers in DIR declare (GCC's -aux-info
# lists every prototype the compiler saw, with its file), with and
# without ZS_EXPERIMENTAL.
declared() {
  local dir=$1 out=$2
  : >"$out"
  for exp in "" "-DZS_EXPERIMENTAL"; do
    printf '#include "zs_mpi.h"\n' >"$tmp/probe.c"
    gcc -std=c11 $exp -I "$dir" -I "$mpi_inc" -fsyntax-only \
      -aux-info "$tmp/aux.txt" "$tmp/probe.c"
    grep -F "/* $dir/" "$tmp/aux.txt" |
      sed -E 's/.*[ *]([A-Za-z_][A-Za-z_0-9]*) \(.*/\1/' >>"$out"
  done
  sort -u -o "$out" "$out"
  [ -s "$out" ] || { echo "FAIL: no declarations read from $dir"; exit 1; }
}
declared "$root/runtime/include" "$tmp/current.txt"
declared "$root/tests/compat/v0_1" "$tmp/v0_1.txt"
sort -u "$tmp/current.txt" "$tmp/v0_1.txt" >"$tmp/headers.txt"

sed -n '/global:/,/local:/p' "$map" | grep -E '^ +[a-z_0-9]+;$' |
  tr -d ' ;' | sort >"$tmp/map.txt"
nm -D --defined-only "$so" | awk '$2 != "A" {print $3}' | sed 's/@.*//' |
  sort -u >"$tmp/so.txt"
nm -g --defined-only "$a" | awk 'NF == 3 {print $3}' | sort -u >"$tmp/a.txt"

# same A B: the two lists are equal, or say what differs
same() {
  if ! diff -u "$tmp/$1" "$tmp/$2" >"$tmp/diff.txt"; then
    echo "$1 vs $2 (- only in $1, + only in $2):"
    grep -E '^[-+][a-z_]' "$tmp/diff.txt" || true
    return 1
  fi
}
fail=0
for list in map.txt so.txt a.txt; do
  same headers.txt "$list" || { echo "FAIL: $list is not the headers' list"; fail=1; }
done
[ $fail = 0 ] || exit 1
echo "ok: $(wc -l <"$tmp/headers.txt") functions: headers = zeroshard.map = .so exports = .a globals"

# The comparison fails on a list with one name more, and one name less.
{ cat "$tmp/so.txt"; echo zs__leaked_internal; } | sort >"$tmp/more.txt"
sed 1d "$tmp/so.txt" >"$tmp/less.txt"
same headers.txt more.txt >/dev/null && { echo "FAIL: an extra export passed"; exit 1; }
same headers.txt less.txt >/dev/null && { echo "FAIL: a missing export passed"; exit 1; }
echo "ok: an extra and a missing symbol are caught"

if nm -g "$a" | grep -E ' [A-TV-Z] zs__'; then
  echo "FAIL: internal symbols are global in libzeroshard.a"; exit 1
fi
major=$(sed -n 's/^#define ZS_VERSION_MAJOR //p' "$root/runtime/include/zeroshard.h")
soname=$(objdump -p "$so" | sed -n 's/^ *SONAME *//p')
[ "$soname" = "libzeroshard.so.$major" ] ||
  { echo "FAIL: SONAME '$soname', expected libzeroshard.so.$major"; exit 1; }
echo "ok: SONAME $soname; no zs__ symbol global in the archive"
# The CUDA plugin exports its entry point only, and the library needs no
# CUDA library.
if objdump -p "$so" | grep -E "NEEDED.*(libcuda|libnccl)"; then
  echo "FAIL: libzeroshard.so needs a CUDA library"; exit 1
fi
if [ "${ZS_CUDA_BUILT:-1}" = 0 ]; then
  echo "ok: libzeroshard.so needs no CUDA library (no CUDA plugin: this build has no CUDA toolkit)"
else
  plugin="$root/runtime/cuda/libzeroshard_cuda.so"
  got=$(nm -D --defined-only "$plugin" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort -u | tr '\n' ' ')
  [ "$got" = "zs_cuda_plugin_open " ] || { echo "FAIL: libzeroshard_cuda.so exports: $got"; exit 1; }
  got=$(nm -g --defined-only "$root/runtime/cuda/libzeroshard_cuda.a" | awk 'NF == 3 {print $3}' | sort -u | tr '\n' ' ')
  [ "$got" = "zs_cuda_plugin_open " ] || { echo "FAIL: libzeroshard_cuda.a's globals: $got"; exit 1; }
  echo "ok: libzeroshard_cuda.so and .a export zs_cuda_plugin_open only; libzeroshard.so needs no CUDA library"
fi
echo "PASS: the libraries export exactly the public API"
