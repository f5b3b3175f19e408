#!/usr/bin/env bash
# cuda_archs_test.sh ARCH... — every CUDA binary carries SASS for each
# compute capability of runtime/defs.bzl's CUDA_ARCHS (the args) and PTX
# for the newest: the CUDA plugin (its kernels: optim_cuda.cu) and the
# GPT-2 example (layers_cuda.cu too), as cuobjdump --list-elf/--list-ptx
# list them; the library itself has no GPU code; zs env names the list. cuobjdump: the toolkit's, or
# $ZS_CUOBJDUMP (tools/zs test installs PyPI's nvidia-cuda-cuobjdump when
# the toolkit lacks it).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
cuobjdump=${ZS_CUOBJDUMP:-/usr/local/cuda/bin/cuobjdump}
for c in /opt/zeroshard-tools/nvidia/cu13/bin/cuobjdump \
         "${HOME:-/nonexistent}/.cache/zeroshard-tools/nvidia/cu13/bin/cuobjdump"; do
  [ -x "$cuobjdump" ] || cuobjdump=$c  # where tools/zs test puts PyPI's
done
[ -x "$cuobjdump" ] || {
  echo "FAIL: no cuobjdump at $cuobjdump: run through tools/zs test, which"
  echo "  installs it from PyPI (nvidia-cuda-cuobjdump), or set ZS_CUOBJDUMP"
  exit 1; }
[ $# -gt 0 ] || { echo "FAIL: no architectures given"; exit 1; }
newest=${*: -1}
if "$cuobjdump" --list-elf "$root/runtime/libzeroshard.so" 2>/dev/null | grep -q cubin; then
  echo "FAIL: libzeroshard.so has GPU code (it belongs in the CUDA plugin)"; exit 1
fi
for bin in runtime/cuda/libzeroshard_cuda.so examples/gpt2/train_sharded; do
  elf=$("$cuobjdump" --list-elf "$root/$bin")
  ptx=$("$cuobjdump" --list-ptx "$root/$bin")
  for a in "$@"; do
    grep -q "\.sm_$a\.cubin$" <<<"$elf" ||
      { echo "$elf"; echo "FAIL: $bin has no SASS for sm_$a"; exit 1; }
  done
  grep -q "\.sm_$newest\.ptx$" <<<"$ptx" ||
    { echo "$ptx"; echo "FAIL: $bin has no PTX for compute_$newest"; exit 1; }
  extra=$(grep -o "sm_[0-9]*" <<<"$elf" | sort -u | grep -vxF -f <(printf 'sm_%s\n' "$@") || true)
  [ -z "$extra" ] || { echo "FAIL: $bin has SASS for $extra, not in CUDA_ARCHS"; exit 1; }
  echo "ok: $bin: SASS $(grep -o "sm_[0-9]*" <<<"$elf" | sort -u -V | tr '\n' ' ')PTX compute_$newest"
done
want="$(printf 'sm_%s ' "$@")(SASS), compute_$newest (PTX)"
"$root/tools/zs_env" | grep -qF "CUDA code        $want" ||
  { "$root/tools/zs_env" | grep -i "cuda code"; echo "FAIL: zs env does not list: $want"; exit 1; }
echo "ok: zs env lists $want"
echo "PASS: SASS for every listed architecture and PTX for the newest"
