#!/bin/bash
# heartbeat_test.sh VICTIM_BIN — a dead or hung rank is named, on every
# other rank, within the heartbeat timeout + 10 s (heartbeat_timeout_s 5,
# collective_timeout_s 600, 3 ranks, rank 1 the victim: the news of it
# goes round the ring past the victim); a rank that only computes long is
# not (tests/runtime/heartbeat_victim.c):
#   stop:    the victim stops itself (SIGSTOP) under plain mpirun
#   kill:    the victim kills itself (SIGKILL) under mpirun
#            --enable-recovery, which does not end the job for it
#   leave:   the victim destroys its context early: named as having left
#            (3 s after the news, within the same bound)
#   kill with shard groups of 2 at 4 ranks, heartbeats off: rank 3's
#            death, seen in its group's collective, reaches the other
#            group's ranks at once through the context's failure notice
#   compute: the victim computes 6 x the timeout (2 s) between calls:
#            every rank finishes
# kill and leave run again with heartbeats off (0): the shared-memory host
# collectives (the default on one host) name the rank themselves, within
# 10 s.
# The stopped victim is killed at the end.
set -u
bin=$1
tmp=$(mktemp -d)
victims=()
cleanup() {
  for p in "${victims[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
np=3
victim=1
fail() { echo "FAIL: $*"; cat "$tmp"/*.out; exit 1; }

run() { # MODE HEARTBEAT_S [mpirun flags...]
  local mode=$1 hb=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=10 180 mpirun --oversubscribe --bind-to none -np $np \
    --mca mpi_yield_when_idle 1 "$@" "$bin" "$mode" $victim "$hb" \
    >"$tmp/$mode.out" 2>&1
  local rc=$?
  local pid
  pid=$(sed -n "s/^rank $victim: pid //p" "$tmp/$mode.out")
  [ -n "$pid" ] && victims+=("$pid")
  echo "$mode: mpirun exit $rc after $((SECONDS - t0)) s"
  grep -E "^rank [0-9]+: (OK|FAILED)" "$tmp/$mode.out" | cut -c1-400
}

# every rank but the victim failed with ZS_ERR_REMOTE naming it in time
expect_named() { # MODE HEARTBEAT_S WHAT
  local mode=$1 hb=$2 what=$3
  local vpid
  vpid=$(sed -n "s/^rank $victim: pid //p" "$tmp/$mode.out")
  for r in $(seq 0 $((np - 1))); do
    [ "$r" = "$victim" ] && continue
    local line
    line=$(grep "^rank $r: FAILED after" "$tmp/$mode.out" | head -1)
    [ -n "$line" ] || fail "$mode: rank $r did not fail"
    case "$line" in
      *"another rank failed"*"rank $victim (host "*"pid $vpid) $what"*) ;;
      *) fail "$mode: rank $r's error does not name rank $victim ($what): $line" ;;
    esac
    local s
    s=$(echo "$line" | sed -n 's/^rank [0-9]*: FAILED after \([0-9.]*\) s.*/\1/p')
    awk -v s="$s" -v lim=$((hb + 10)) 'BEGIN { exit !(s >= 0 && s <= lim) }' ||
      fail "$mode: rank $r failed after $s s, more than $((hb + 10)) s"
    echo "ok: $mode: rank $r named rank $victim after $s s"
  done
}

run stop 5
expect_named stop 5 "sent no heartbeat"
grep -q "last heard .* ago, when it was in its own code for .* s since zs_step returned" "$tmp/stop.out" ||
  fail "stop: the error does not say what the silent rank was last doing"

run kill 5 --enable-recovery
expect_named kill 5 "is gone"

# a rank that ends early (zs_context_destroy) while the others wait on it
run leave 5
expect_named leave 5 "left the context"

# heartbeats off: the shared-memory collectives see the process end (the
# pid is gone) and name it, long before the 600 s collective timeout; and
# a rank that leaves, at once
run kill 0 --enable-recovery
expect_named kill 0 "is gone: its process ended"
run leave 0
expect_named leave 0 "left the context"
# ... and a rank dead before the others' first collective (its pid gone
# before they look)
run kill_early 0 --enable-recovery
expect_named kill_early 0 "is gone: its process ended"

run compute 2
for r in $(seq 0 $((np - 1))); do
  grep -q "^rank $r: OK" "$tmp/compute.out" ||
    fail "compute: rank $r did not finish (a rank computing 12 s with a 2 s heartbeat timeout was flagged?)"
done
echo "ok: compute: a rank computing 6 x the heartbeat timeout is not flagged"

# Shard groups (hybrid sharding, groups {0,1} and {2,3}), heartbeats off:
# the dead rank's group partner sees it in a shared-memory collective of
# its group; it fails the context and tells the ranks of the other group,
# which wait in other collectives, so they name it as soon (not at the
# collective timeout, nor only when the partner's process ends)
np=4
victim=3
export ZS_TEST_SHARD_GROUP=2
run kill 0 --enable-recovery -x ZS_TEST_SHARD_GROUP
expect_named kill 0 "is gone"
unset ZS_TEST_SHARD_GROUP
echo "PASS"
