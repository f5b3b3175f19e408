#!/usr/bin/env bash
# install_test.sh — ZeroShard as a user outside Bazel gets it
# (docs/install.md): tools/dist/install.sh puts //tools/dist's tree under
# a temporary prefix; examples/minimal builds four ways with the system
# compiler and no Bazel on PATH (its Makefile with pkg-config, shared and
# STATIC=1; its CMakeLists.txt with find_package, shared and static) and
# trains under mpirun at 1 and 2 ranks, for three seeds:
#  - the four builds print the same losses, bitwise, at each world size
#    (one library, one program);
#  - 2 ranks equal 1 rank within 1e-5 relative per step (the gradient sums
#    are ordered differently; docs/install.md);
#  - the static builds need no libzeroshard.so, the shared ones find it.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
prefix="$tmp/prefix"

sh "$root/tools/dist/install.sh" "$root/tools/dist/zeroshard.tar" "$prefix"
for f in include/zeroshard.h include/zs_mpi.h lib/libzeroshard.a \
         lib/libzeroshard.so lib/pkgconfig/zeroshard.pc \
         lib/cmake/ZeroShard/ZeroShardConfig.cmake bin/zs; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $prefix/$f not installed"; exit 1; }
done
if [ "${ZS_CUDA_BUILT:-1}" = 0 ]; then
  # built without the CUDA toolkit: no plugin, and CMake says so
  [ -z "$(find "$prefix/lib" -name 'libzeroshard_cuda*')" ] ||
    { echo "FAIL: a CUDA plugin was installed by a build without the toolkit"; exit 1; }
  plugin_note=" (no CUDA plugin: this build has no CUDA toolkit)"
else
  for f in lib/libzeroshard_cuda.so lib/libzeroshard_cuda.a; do
    [ -e "$prefix/$f" ] || { echo "FAIL: $prefix/$f not installed"; exit 1; }
  done
  plugin_note=" with the CUDA plugin"
fi
echo "ok: installed under $prefix$plugin_note"
[ -n "$(find "$prefix/include/zeroshard.h" -newermt 2001-01-01)" ] ||
  { echo "FAIL: installed files keep the tarball's date (make would not rebuild)"; exit 1; }
# a prefix given with .. and a trailing /: recorded absolute and normalized
mkdir -p "$tmp/a"
sh "$root/tools/dist/install.sh" "$root/tools/dist/zeroshard.tar" "$tmp/a/../rel/" >/dev/null
grep -qx "prefix=$(cd "$tmp/rel" && pwd -P)" "$tmp/rel/lib/pkgconfig/zeroshard.pc" ||
  { grep prefix= "$tmp/rel/lib/pkgconfig/zeroshard.pc"; echo "FAIL: the prefix is not normalized"; exit 1; }
# a directory where a file goes: exit 1 naming it, no temporary file left
mkdir -p "$tmp/blocked/bin/zs"
if sh "$root/tools/dist/install.sh" "$root/tools/dist/zeroshard.tar" "$tmp/blocked" 2>"$tmp/err.txt"; then
  echo "FAIL: an install over a directory named bin/zs succeeded"; exit 1
fi
grep -q "bin/zs is a directory" "$tmp/err.txt" || { cat "$tmp/err.txt"; echo "FAIL: not named"; exit 1; }
[ -z "$(find "$tmp/blocked" -name '*.zs-new')" ] || { echo "FAIL: temporary files left"; exit 1; }
set +e; sh "$root/tools/dist/install.sh" "$root/tools/dist/zeroshard.tar" "$tmp/with space" 2>"$tmp/err.txt"; rc=$?; set -e
[ $rc = 2 ] && grep -q "white space" "$tmp/err.txt" || { cat "$tmp/err.txt"; echo "FAIL: a prefix with a space (exit $rc)"; exit 1; }
echo "ok: today's dates, a normalized prefix, a blocked file and a spaced prefix refused"

# No Bazel from here on: a `bazel` first on PATH that fails if called.
mkdir -p "$tmp/nobazel"
printf '#!/bin/sh\necho "bazel was called: $*" >&2\nexit 99\n' >"$tmp/nobazel/bazel"
chmod +x "$tmp/nobazel/bazel"
export PATH="$tmp/nobazel:/usr/bin:/bin:/usr/sbin:/sbin"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
export HOME="$tmp"   # cmake's package registry stays in here

pkg-config --exists zeroshard || { echo "FAIL: pkg-config does not find zeroshard"; exit 1; }
[ "$(pkg-config --variable=prefix zeroshard)" = "$prefix" ] ||
  { echo "FAIL: zeroshard.pc's prefix is not $prefix"; exit 1; }
echo "ok: pkg-config zeroshard $(pkg-config --modversion zeroshard): $(pkg-config --libs zeroshard)"

build() { # NAME: copies examples/minimal and builds it
  local d="$tmp/$1"
  rm -rf "$d"; mkdir -p "$d"
  cp "$root/examples/minimal/mlp.c" "$root/examples/minimal/Makefile" \
     "$root/examples/minimal/CMakeLists.txt" "$d/"
  case $1 in
    make) make -s -C "$d" CC=gcc ;;
    make_static) make -s -C "$d" CC=gcc STATIC=1 ;;
    cmake|cmake_static)
      local static=OFF; [ "$1" = cmake_static ] && static=ON
      cmake -S "$d" -B "$d/build" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_C_COMPILER=gcc -DZEROSHARD_STATIC=$static >"$d/cmake.log" 2>&1 ||
        { cat "$d/cmake.log"; echo "FAIL: cmake configure ($1)"; exit 1; }
      cmake --build "$d/build" >>"$d/cmake.log" 2>&1 ||
        { cat "$d/cmake.log"; echo "FAIL: cmake build ($1)"; exit 1; }
      cp "$d/build/mlp" "$d/mlp" ;;
  esac
  [ "$1" = make_static ] && mv "$d/mlp-static" "$d/mlp"
  [ -x "$d/mlp" ] || { echo "FAIL: $1 built no mlp"; exit 1; }
}
# find_package's version rules, and a C++-only project (shared)
cmake_finds() { # EXPECT(0|1) LANG VERSION-ARGS
  local d="$tmp/fp"; rm -rf "$d"; mkdir -p "$d"
  printf 'cmake_minimum_required(VERSION 3.19)\nproject(t %s)\nfind_package(ZeroShard %s REQUIRED)\n' "$2" "$3" >"$d/CMakeLists.txt"
  set +e
  cmake -S "$d" -B "$d/b" -DCMAKE_PREFIX_PATH="$prefix" >"$d/log" 2>&1
  local rc=$?
  set -e
  if { [ "$1" = 0 ] && [ $rc != 0 ]; } || { [ "$1" = 1 ] && [ $rc = 0 ]; }; then
    cat "$d/log"; echo "FAIL: find_package(ZeroShard $3) in a $2 project: exit $rc"; exit 1
  fi
}
cmake_finds 0 C 0.4
cmake_finds 0 C 0.3
cmake_finds 0 C 0.2
cmake_finds 0 C 0.1
cmake_finds 0 CXX 0.4
cmake_finds 1 C 0.5
cmake_finds 1 C 1.0
cmake_finds 0 C "0.1...0.9"
cmake_finds 1 C "0.1...0.1.9"
echo "ok: find_package accepts 0.1, 0.2, 0.3, 0.4, 0.1...0.9 and a C++-only project; refuses 0.5, 1.0, 0.1...0.1.9"

builds=(make make_static cmake cmake_static)
for b in "${builds[@]}"; do build "$b"; done
for b in make_static cmake_static; do
  if readelf -d "$tmp/$b/mlp" | grep -q "libzeroshard"; then
    echo "FAIL: the $b build needs libzeroshard.so"; exit 1
  fi
done
for b in make cmake; do
  readelf -d "$tmp/$b/mlp" | grep -q "NEEDED.*libzeroshard.so.0" ||
    { echo "FAIL: the $b build does not link libzeroshard.so.0"; exit 1; }
done
echo "ok: built ${builds[*]}"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
run() { # BUILD RANKS SEED: the losses, one per line
  local ld=""
  case $1 in make) ld="$prefix/lib" ;; esac  # cmake's build has an RPATH
  LD_LIBRARY_PATH="$ld" timeout 120 mpirun --oversubscribe --bind-to none \
    --mca btl self,vader -x LD_LIBRARY_PATH -np "$2" \
    "$tmp/$1/mlp" --steps 30 --seed "$3" >"$tmp/out.txt" 2>"$tmp/err.txt" ||
    { cat "$tmp/out.txt" "$tmp/err.txt"; echo "FAIL: $1 at $2 ranks"; exit 1; }
  awk '$1 == "step" {print $4}' "$tmp/out.txt"
}
for seed in 1 2 3; do
  for np in 1 2; do
    run make $np $seed >"$tmp/ref$np.txt"
    [ "$(wc -l <"$tmp/ref$np.txt")" = 30 ] || { cat "$tmp/ref$np.txt"; echo "FAIL: not 30 losses"; exit 1; }
    for b in make_static cmake cmake_static; do
      run $b $np $seed >"$tmp/got.txt"
      cmp -s "$tmp/ref$np.txt" "$tmp/got.txt" ||
        { paste "$tmp/ref$np.txt" "$tmp/got.txt"; echo "FAIL: $b differs from make at $np ranks"; exit 1; }
    done
  done
  paste "$tmp/ref1.txt" "$tmp/ref2.txt" | awk -v seed=$seed '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : -$1);
      if (r > worst) worst = r }
    NR == 1 { first = $1 } { last = $1 }
    END {
      printf "ok: seed %d: loss %.4f -> %.4f; 2 ranks vs 1: worst relative difference %.2e (bound 1e-5)\n", seed, first, last, worst
      if (worst > 1e-5) { print "FAIL: 2 ranks differ from 1 beyond 1e-5"; exit 1 }
      if (!(last < first / 2)) { print "FAIL: the loss did not halve"; exit 1 } }'
done
# No CUDA reachable (docs/cuda.md, "The plugin"): in a mount namespace
# that hides the CUDA toolkit, the CUDA and NCCL libraries elsewhere
# (copies in /usr/local/lib, the driver) and their loader-cache entries, a
# host-only program built against the install trains at 2 ranks with no
# CUDA or NCCL library in its DT_NEEDED or its memory map, and asking for
# ZS_DEVICE_CUDA gets UNSUPPORTED naming what is missing: the CUDA runtime
# the plugin needs, and with the plugin removed, the plugin.
gcc -std=c11 -Wall -Wextra -o "$tmp/nocuda_probe" "$root/tests/install/nocuda_probe.c" \
  $(pkg-config --cflags --libs zeroshard ompi-c)
for f in "$tmp/nocuda_probe" "$prefix/lib/libzeroshard.so"; do
  if readelf -d "$f" | grep -E "NEEDED.*(libcuda|libnccl)"; then
    echo "FAIL: $f needs a CUDA library"; exit 1
  fi
done
# A static program links the plugin's archive (docs/install.md): the
# library finds the plugin linked in, and without a GPU the refusal comes
# from the CUDA backend itself (cudaGetDeviceCount), not from a loader.
if [ "${ZS_CUDA_BUILT:-1}" = 0 ]; then
  echo "note: no CUDA plugin in this build: its archive's static link is not checked"
else
gcc -std=c11 -Wall -Wextra -o "$tmp/probe_static" "$root/tests/install/nocuda_probe.c" \
  $(pkg-config --cflags zeroshard ompi-c) -L"$prefix/lib" \
  -Wl,-u,zs_cuda_plugin_open -l:libzeroshard_cuda.a \
  $(pkg-config --static --libs zeroshard ompi-c | sed 's/-lzeroshard\b/-l:libzeroshard.a/') \
  -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lstdc++
if readelf -d "$tmp/probe_static" | grep -q "libzeroshard"; then
  echo "FAIL: the static probe needs a libzeroshard shared library"; exit 1
fi
if nvidia-smi -L >/dev/null 2>&1; then
  echo "note: a GPU is here: the static plugin's CUDA context is checked by tests/gpu instead"
else
  timeout 120 mpirun --oversubscribe --bind-to none --mca btl self,vader -np 2 \
    "$tmp/probe_static" --cuda-linked >"$tmp/static.txt" 2>&1 ||
    { cat "$tmp/static.txt"; echo "FAIL: the static program with the plugin's archive"; exit 1; }
  grep -q "ZS_DEVICE_CUDA: unsupported.*cudaGetDeviceCount" "$tmp/static.txt" ||
    { cat "$tmp/static.txt"; echo "FAIL: the linked-in plugin did not answer"; exit 1; }
  echo "ok: static, the plugin's archive linked in: $(grep -o 'ZS_DEVICE_CUDA: .*' "$tmp/static.txt" | head -1 | cut -c1-140)"
fi
fi

if [ "$(id -u)" != 0 ]; then
  echo "SKIPPED: the no-CUDA run needs root (a mount namespace)"
else
  cat >"$tmp/nocuda.sh" <<'NS'
set -eu
tmp=$1 prefix=$2
# the toolkit's directories
for d in /usr/local/cuda /usr/local/cuda-*; do
  [ -d "$d" ] && mount -t tmpfs none "$(readlink -f "$d")"
done
# CUDA and NCCL libraries elsewhere (copies, the driver): hidden by /dev/null
for f in $(find /usr/local/lib /usr/lib/x86_64-linux-gnu /usr/lib /lib -maxdepth 1 \
             \( -name 'libcuda*' -o -name 'libnccl*' -o -name 'libnvidia*' \) 2>/dev/null); do
  [ -e "$f" ] && mount --bind /dev/null "$f"
done
# a loader cache without them
ldconfig -C "$tmp/ld.so.cache" || { echo "FAIL: ldconfig -C could not write a loader cache"; exit 1; }
mount --bind "$tmp/ld.so.cache" /etc/ld.so.cache
if ldconfig -p | grep -E "libcudart|libnccl|libcuda\."; then
  echo "FAIL: the loader cache still names CUDA libraries"; exit 1
fi
run() {
  LD_LIBRARY_PATH="$prefix/lib" timeout 120 mpirun --oversubscribe --bind-to none \
    --mca btl self,vader -x LD_LIBRARY_PATH -np 2 "$tmp/nocuda_probe"
}
if [ -e "$prefix/lib/libzeroshard_cuda.so" ]; then
  run >"$tmp/nocuda1.txt" 2>&1 || { cat "$tmp/nocuda1.txt"; echo "FAIL: the host-only run"; exit 1; }
  grep -q "ZS_DEVICE_CUDA: unsupported.*libzeroshard_cuda.so does not load: libcudart" "$tmp/nocuda1.txt" ||
    { cat "$tmp/nocuda1.txt"; echo "FAIL: the CUDA refusal does not name the missing CUDA runtime"; exit 1; }
  echo "ok: no CUDA reachable: trained at 2 ranks; $(grep -o 'ZS_DEVICE_CUDA: .*' "$tmp/nocuda1.txt" | head -1 | cut -c1-160)"
  mv "$prefix/lib/libzeroshard_cuda.so" "$prefix/lib/libzeroshard_cuda.so.away"
fi
run >"$tmp/nocuda2.txt" 2>&1 || { cat "$tmp/nocuda2.txt"; echo "FAIL: the host-only run without the plugin"; exit 1; }
[ -e "$prefix/lib/libzeroshard_cuda.so.away" ] &&
  mv "$prefix/lib/libzeroshard_cuda.so.away" "$prefix/lib/libzeroshard_cuda.so"
grep -q "ZS_DEVICE_CUDA: unsupported.*plugin libzeroshard_cuda.so was not found" "$tmp/nocuda2.txt" ||
  { cat "$tmp/nocuda2.txt"; echo "FAIL: the CUDA refusal does not name the missing plugin"; exit 1; }
echo "ok: without the plugin: trained at 2 ranks; $(grep -o 'ZS_DEVICE_CUDA: .*' "$tmp/nocuda2.txt" | head -1 | cut -c1-160)"
NS
  unshare -m sh "$tmp/nocuda.sh" "$tmp" "$prefix" || exit 1
fi

echo "PASS: installed, built four ways without Bazel, trained at 1 and 2 ranks, host-only with no CUDA reachable"
