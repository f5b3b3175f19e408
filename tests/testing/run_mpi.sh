#!/bin/bash
# run_mpi.sh NP BINARY [ARGS...] — runs a test binary under mpirun with NP
# ranks, oversubscribing the cores, one OpenMP thread per rank, under a
# timeout so that a hang fails the test with a clear message instead of
# waiting for Bazel's limit.
set -u
np=$1
bin=$2
shift 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Under --config=asan, LeakSanitizer cannot tell Open MPI's own allocations
# (made by plugins it dlclose()s at MPI_Finalize, so their frames are
# anonymous) from ours: leak checking of multi-rank tests is done by the
# runtime's accounting (tests assert zero live allocations after destroy)
# and by valgrind (docs/testing.md); ASan still checks every access.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
limit=${ZS_MPI_TIMEOUT:-240}
timeout --kill-after=10 "$limit" \
  mpirun --oversubscribe --bind-to none -np "$np" \
  --mca mpi_yield_when_idle 1 --mca btl self,vader \
  "$bin" "$@"
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "run_mpi.sh: TIMEOUT after ${limit}s with $np ranks: a rank hangs" >&2
fi
exit "$rc"
