#!/usr/bin/env bash
# nocuda_check.sh — the build on a machine without the CUDA toolkit
# (docs/building.md, "Without the CUDA toolkit"), checked on this one.
#
#   tools/nocuda_check.sh [--full]
#
# A copy of the working tree's files (tracked and untracked-not-ignored)
# is built by its own Bazel server and output base with the toolkit hidden:
# in a mount namespace where the toolkit's directories are empty (as root),
# else with CUDA_HOME pointing at an empty directory. Checks, always:
#  - third_party/cuda_configure.bzl found no toolkit and said so;
#  - every target of //... analyses (loading and analysis, nothing built);
#  - the targets skipped are exactly CUDA's: the plugin and its parts, the
#    kernels, the GPU and stand-in tests, the call-graph check (which reads
#    CUDA objects); the library, the installable tree, the trainers, the
#    tools and every other test stay.
# With --full, also: //... builds; the install, symbol and CLI tests pass;
# the sharded trainer trains 2 steps at 2 ranks and refuses --device cuda
# naming the missing toolkit.
# Exit status 0 when all hold, 1 when one does not (it is named), 2 on a
# usage error. Prints one line per check. The copy and its output base
# stay under ${XDG_CACHE_HOME:-~/.cache}/zeroshard (later runs rebuild
# only what changed); the Bazel server is shut down at the end.
set -euo pipefail

full=0
case "${1:-}" in
  "") ;;
  --full) full=1 ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "nocuda_check.sh: unknown argument '$1' (--full or nothing)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "nocuda_check.sh: one argument at most" >&2; exit 2; }

root="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/zeroshard"
tree="$cache/nocuda-tree"
base="$cache/nocuda-base"
mkdir -p "$cache"
# The copy: exactly the files a clean clone plus the uncommitted work has.
rm -rf "$tree"
mkdir -p "$tree"
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
   xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
   tar --null -T - -cf -) | tar -xf - -C "$tree"

log="$cache/nocuda.log"
: >"$log"
fail() { echo "FAIL: $*"; echo "(the Bazel output is in $log)"; finish; exit 1; }
finish() { (cd "$tree" && bazel --output_base="$base" shutdown >/dev/null 2>&1) || true; }

# Runs "$@" in $tree with the toolkit hidden.
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  how="a mount namespace that empties the toolkit's directories"
  hidden() {
    unshare -m bash -c '
      for d in "${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda /usr/local/cuda-*; do
        [ -d "$d" ] && mount -t tmpfs none "$(readlink -f "$d")"
      done
      cd "$0" && exec "$@"' "$tree" "$@"
  }
else
  how="CUDA_HOME set to an empty directory (not root: no mount namespace)"
  mkdir -p "$cache/empty"
  hidden() { (cd "$tree" && CUDA_HOME="$cache/empty" "$@"); }
fi
echo "nocuda_check: building a copy of the tree with the CUDA toolkit hidden ($how)"
# A server started elsewhere would see the toolkit: always a fresh one.
finish
bz() { hidden bazel --output_base="$base" "$@"; }

# 1. The toolkit is not found, and the build says so.
bz sync --configure >>"$log" 2>&1 || fail "bazel sync --configure"
grep -q "ZeroShard: no CUDA toolkit at" "$log" ||
  fail "the build did not say that it found no CUDA toolkit"
grep -qx "CUDA_FOUND = False" "$base/external/cuda/defs.bzl" ||
  fail "third_party/cuda_configure.bzl found a toolkit that is hidden"
echo "ok: $(grep -o 'ZeroShard: no CUDA toolkit at [^:]*' "$log" | head -1)"

# 2. Everything analyses, and exactly what needs CUDA is skipped: the
# targets Bazel finds incompatible (cquery: IncompatiblePlatformProvider)
# are the plugin, its parts, the kernels, the GPU tests and the checks
# that read CUDA objects; any other is a target that lost its host build.
bz build --nobuild //... >>"$log" 2>&1 || fail "bazel build --nobuild //... (analysis)"
skipped=$(bz cquery 'kind(rule, //...)' --output=starlark \
  --starlark:expr='str(target.label) if "IncompatiblePlatformProvider" in providers(target) else ""' \
  2>>"$log" | grep . | sort) || fail "bazel cquery of the incompatible targets"
allowed='^//(runtime/cuda|tests/gpu|tests/fakecuda):|^//optim:optim_cuda(_obj)?$|^//examples/gpt2:layers_cuda(_obj)?$|^//runtime/comm:comm_nccl$|^//runtime/device:device_cuda$|^//tests/layers:(callgraph_test|symbols)$|^//tests/install:cuda_archs_test$'
extra=$(echo "$skipped" | grep -Ev "$allowed" || true)
[ -z "$extra" ] || fail "needs no CUDA, yet skipped without the toolkit: $(echo $extra)"
for t in //runtime/cuda:libzeroshard_cuda //optim:optim_cuda_obj \
         //examples/gpt2:layers_cuda_obj //tests/install:cuda_archs_test \
         //tests/fakecuda:engine_cuda_fake_test_np2; do
  echo "$skipped" | grep -qx "$t" || fail "$t needs CUDA but is not skipped without the toolkit"
done
total=$(bz cquery 'kind(rule, //...)' 2>>"$log" | wc -l)
echo "ok: //... analyses; $(echo "$skipped" | wc -l) of $total rules skipped, all CUDA's (plugin, kernels, GPU and stand-in tests, the call-graph check)"

if [ $full = 1 ]; then
  bz build //... >>"$log" 2>&1 || fail "bazel build //... without the toolkit"
  echo "ok: bazel build //... builds without the toolkit"
  bz test //tests/install:install_test //tests/install:symbols_test \
    //tests/install:cli_test >>"$log" 2>&1 ||
    fail "the install, symbol or CLI tests without the toolkit"
  echo "ok: the install, symbol and CLI tests pass without the toolkit"
  out=$(hidden env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe --bind-to none --mca btl self,vader -np 2 \
    bazel-bin/examples/gpt2/train_sharded --steps 2 --eval-every 0 \
    --sample-bytes 0 2>&1) || fail "the sharded trainer at 2 ranks: $out"
  echo "ok: the sharded trainer trains 2 steps at 2 ranks"
  if out=$(hidden bazel-bin/examples/gpt2/train_sharded --device cuda --steps 1 2>&1); then
    fail "--device cuda was accepted by a trainer built without CUDA"
  fi
  echo "$out" | grep -q "built without the CUDA toolkit" ||
    fail "--device cuda's refusal does not say why: $out"
  echo "ok: --device cuda is refused: ${out#train_sharded: }"
fi
finish
echo "PASS: the build without the CUDA toolkit"
