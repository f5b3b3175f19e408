#!/usr/bin/env bash
# tools/gpu/bundle.sh [DIR] — everything the GPU checks need on a bare GPU
# machine (no Bazel, no apt, maybe another glibc), in DIR (.gpu-bundle):
#   bin/   the GPU tests, the GPT-2 trainer, the estimator, Open MPI's
#          launcher (orterun: run.sh's multi-rank phase), timeline.py
#   lib/   every shared library they load, this machine's dynamic loader
#          and glibc included, so they run whatever the machine has
#   ompi.tar  Open MPI's and PMIx's run-time trees (components, help
#          files, config) at their Debian paths, for MPI singletons
#   data/  Tiny Shakespeare
#   run.sh the checks (tools/gpu/run.sh)
#   base/train_sharded  with BASE_BIN=FILE: the GPT-2 trainer of another
#          build (it links the layers statically), which run.sh's bench
#          runs as a baseline beside this build's (its libraries join
#          lib/; it must write per-step "seconds" in its report, as builds
#          from 8cf3129 on do, for the ratio)
# Not carried: the NVIDIA driver (the machine's), cuBLAS and NCCL (hundreds
# of MiB; run.sh takes them from the machine's nvidia-* Python wheels).
# The bundle must stay under the device tool's 64 MiB; this prints its size.
set -euo pipefail
# BASE_BIN as given, from where this was started
[ -z "${BASE_BIN:-}" ] || BASE_BIN=$(realpath "$BASE_BIN")
cd "$(dirname "$0")/../.."
out=${1:-.gpu-bundle}
bazel build //tests/gpu:all //examples/gpt2:train_sharded //tools:zs_estimate \
  >/dev/null
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data"
bins=(tests/gpu/cuda_test tests/gpu/engine_cuda_test_bin
      tests/gpu/gpt2_cuda_layers_test tests/gpu/gpt2_parity_test
      examples/gpt2/train_sharded tools/zs_estimate)
for b in "${bins[@]}"; do cp -L "bazel-bin/$b" "$out/bin/"; done
# Open MPI's launcher, for several ranks on the GPU (run.sh's multi phase)
orterun=$(readlink -f "$(command -v mpirun)")
cp -L "$orterun" "$out/bin/orterun"
cp tools/gpu/timeline.py "$out/bin/"
cp data/tinyshakespeare.txt "$out/data/"
# Open MPI's run time, at its Debian paths (run.sh unpacks it at /).
ompi=(/usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2
      /usr/share/openmpi /usr/share/pmix /etc/openmpi)
present=()
for p in "${ompi[@]}"; do [ -e "$p" ] && present+=("${p#/}"); done
tar -C / -cf "$out/ompi.tar" "${present[@]}"
# Shared libraries of the binaries and of Open MPI's components.
# (ldd on Bazel's copies: their run paths find Bazel's own libraries)
objs=("$orterun")
for b in "${bins[@]}"; do objs+=("bazel-bin/$b"); done
[ -z "${BASE_BIN:-}" ] || objs+=("$BASE_BIN")
while IFS= read -r so; do objs+=("$so"); done < <(
  find /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
    -name '*.so*' -type f 2>/dev/null)
for o in "${objs[@]}"; do
  ldd "$o" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | while IFS= read -r lib; do
  case "$(basename "$lib")" in
    libcuda.so*|libnvidia*) continue ;;  # the driver: the machine's own
  esac
  cp -L "$lib" "$out/lib/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$out/lib/"
if [ -n "${BASE_BIN:-}" ]; then
  mkdir -p "$out/base"
  cp -L "$BASE_BIN" "$out/base/train_sharded"
fi
cp tools/gpu/run.sh "$out/run.sh"
chmod +x "$out/run.sh"
du -sh "$out"
echo "bundle ready: run it on the GPU machine with"
echo "  device run: carry [\"$out\"], command \"$out/run.sh\""
