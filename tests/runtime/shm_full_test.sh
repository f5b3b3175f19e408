#!/bin/bash
# shm_full_test.sh SHM_TEST_BIN — /dev/shm full: the segment's file system
# has no room (a 1 MiB tmpfs, mounted in a mount namespace of its own, as
# ZS_SHM_DIR; and a 6 MiB one, where the first lane's segment fits and the
# second's does not). With host_collectives auto the context falls back to MPI's
# collectives and trains; with shm every rank fails naming the path and
# ENOSPC; no file is left behind. Needs root (unshare -m, mount): skipped
# with a message otherwise.
set -u
bin=$1
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "SKIP: needs root and mount namespaces (unshare -m) for a small tmpfs"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# 1 MiB: no lane's segment fits; 6 MiB: the first lane's (4 MiB at 2
# ranks) does and the second's does not (the first must be removed too)
for size in 1m 6m; do
  echo "tmpfs of $size"
  unshare -m bash -c '
    set -u
    dir=$(mktemp -d)
    mount -t tmpfs -o size=$1 tmpfs "$dir" || { echo "SKIP: cannot mount a tmpfs"; exit 0; }
    export ZS_TEST_SHM_FULL_DIR=$dir
    timeout --kill-after=10 120 mpirun --oversubscribe --bind-to none -np 2 \
      --mca mpi_yield_when_idle 1 -x ZS_TEST_SHM_FULL_DIR "$0" \
      --gtest_filter="ShmTest.AFullFileSystemFallsBackOrFails"
    rc=$?
    left=$(ls -A "$dir")
    umount "$dir"; rmdir "$dir"
    [ -z "$left" ] || { echo "FAIL: left in the tmpfs: $left"; exit 1; }
    exit $rc
  ' "$bin" "$size" || exit 1
done
echo PASS
