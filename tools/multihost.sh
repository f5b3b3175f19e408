#!/usr/bin/env bash
# multihost.sh — emulate several hosts on this one machine and run an MPI
# program across them over TCP (Open MPI 4.x).
#
# usage: tools/multihost.sh --hosts H --ranks-per-host P [--keep]
#                           [--json FILE] -- PROGRAM ARGS...
#
# What it makes (names unique per run: zsmh<pid>-...):
#   - one network namespace per host, zsmh<pid>-h0 .. -h<H-1>, each with lo
#     up and one veth end "eth0" holding 10.213.X.(i+1)/24 (X from the pid);
#   - one namespace zsmh<pid>-br holding a bridge and the other veth ends,
#     so nothing is added to or changed in the root namespace's interfaces;
#   - a hosts file (zsmh-h<i> -> its address) bind-mounted over /etc/hosts
#     in each host's private mount namespace only (ip netns exec makes one),
#     so the host names resolve there and /etc/hosts itself is untouched.
# Every process of host i runs under `unshare -u` with hostname zsmh-h<i>:
# Open MPI runs one daemon (orted) per host, so ranks on different fake
# hosts are different nodes to it (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)
# splits them), and gethostname() differs (ZeroShard's heartbeat publishes
# the address its host name resolves to: the namespace's). /dev/shm is shared
# by all of them (one mount of it); nothing relies on it being private.
#
# mpirun runs on host 0 (its namespace and name); it starts the other hosts'
# orted through tools/multihost_agent.sh (--mca plm_rsh_agent), which enters
# the host's namespace. Open MPI options used and why:
#   --hostfile (zsmh-h<i> slots=P)   the fake hosts; ranks fill h0 first
#   --mca plm_rsh_agent AGENT        "ssh" into a namespace
#   --mca plm_rsh_no_tree_spawn 1    mpirun starts every orted itself
#   --mca btl tcp,vader,self         TCP between hosts; vader (shared memory)
#                                    only between ranks of one fake host
#   --mca btl_tcp_if_include, oob_tcp_if_include <the /24>
#                                    MPI and the runtime only on the veths
#   --oversubscribe --bind-to none   2 cores, more ranks; no pinning
#   --mca mpi_yield_when_idle 1      waiting ranks give up the CPU
#   -x OMP_NUM_THREADS, LD_LIBRARY_PATH, PATH, CI and every ZS_* variable
#   OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 is set (the harness needs root).
#
# Bytes: each host's eth0 rx/tx bytes are read before and after the mpirun;
# the last line on stdout is one JSON object with the differences:
#   {"hosts":2,"ranks_per_host":2,"mtu":1500,
#    "veth":[{"host":0,"tx_bytes":N,"rx_bytes":N,"tcp_retrans_segs":N},...]}
# (also written to FILE with --json FILE). Traffic between ranks of one fake
# host does not pass a veth. tcp_retrans_segs is the host's TCP segments
# sent again (RetransSegs of its namespace's /proc/net/snmp); their bytes
# are in tx_bytes, at most mtu + 14 (the Ethernet header) per segment.
#
# Exit status: the program's (mpirun's); 77 when the hosts cannot be
# emulated here (not root, no `ip netns`, no veth or bridge, no unshare),
# with the reason on stderr; 2 for bad usage. Everything made is removed on
# exit (also on Ctrl-C), leftover processes in the namespaces killed;
# --keep leaves the namespaces for debugging (remove them with
# `ip netns del NAME`; `ip netns list` shows them).
set -uo pipefail
# (Bazel tests get PATH=/bin:/usr/bin:/usr/local/bin; ip may be in sbin)
PATH="$PATH:/usr/sbin:/sbin"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
AGENT="$HERE/multihost_agent.sh"

log() { echo "multihost: $*" >&2; }
cannot() { log "cannot emulate hosts: $*"; exit 77; }
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

hosts="" per_host="" keep=0 json_out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="${2:-}"; shift 2 || { log "--hosts needs a value"; exit 2; } ;;
    --ranks-per-host) per_host="${2:-}"; shift 2 || { log "--ranks-per-host needs a value"; exit 2; } ;;
    --keep) keep=1; shift ;;
    --json) json_out="${2:-}"; shift 2 || { log "--json needs a file"; exit 2; } ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) log "unknown argument '$1' (tools/multihost.sh --help)"; exit 2 ;;
  esac
done
[[ "$hosts" =~ ^[1-9][0-9]*$ ]] && [ "$hosts" -le 200 ] ||
  { log "--hosts: expected 1..200, got '$hosts'"; exit 2; }
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] ||
  { log "--ranks-per-host: expected a positive integer, got '$per_host'"; exit 2; }
[ $# -gt 0 ] || { log "no program after --"; exit 2; }

# ---- Can this machine emulate hosts? ---------------------------------------
[ "$(id -u)" = 0 ] || cannot "needs root (network namespaces), running as uid $(id -u)"
for t in ip unshare mpirun hostname mount; do
  command -v "$t" >/dev/null 2>&1 || cannot "'$t' not found"
done
[ -x "$AGENT" ] || cannot "$AGENT is missing or not executable"

PREFIX="zsmh$$"
NET="10.213.$(( $$ % 250 + 1 ))"
SUBNET="$NET.0/24"
BR="$PREFIX-br"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/$PREFIX.XXXXXX")" || cannot "no temporary directory"
made=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ $keep = 1 ]; then
    log "kept: namespaces ${made[*]:-none}; files $WORK"
    exit $rc
  fi
  local ns pid
  for ns in "${made[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
  done
  for ns in "${made[@]}"; do
    if [ -n "$(ip netns pids "$ns" 2>/dev/null)" ]; then
      sleep 1
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    fi
  done
  # Deleting a namespace deletes its veth ends and the peers with them.
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkns() {
  local err
  err=$(ip netns add "$1" 2>&1) || cannot "ip netns add $1: $err"
  made+=("$1")
  err=$(ip -n "$1" link set lo up 2>&1) || cannot "lo up in $1: $err"
}

# ---- The hosts -----------------------------------------------------------
mkns "$BR"
err=$(ip -n "$BR" link add br0 type bridge 2>&1) || cannot "bridge: $err"
ip -n "$BR" link set br0 up || cannot "bridge up failed"
{
  echo "127.0.0.1 localhost"
  for ((i = 0; i < hosts; i++)); do echo "$NET.$((i + 1)) zsmh-h$i"; done
} > "$WORK/hosts"
: > "$WORK/hostfile"
for ((i = 0; i < hosts; i++)); do
  ns="$PREFIX-h$i"
  mkns "$ns"
  err=$(ip -n "$BR" link add "vh$i" type veth peer name eth0 netns "$ns" 2>&1) ||
    cannot "veth for host $i: $err"
  ip -n "$BR" link set "vh$i" master br0 up || cannot "veth vh$i on the bridge"
  ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0 || cannot "address for host $i"
  ip -n "$ns" link set eth0 up || cannot "eth0 up in $ns"
  echo "zsmh-h$i slots=$per_host" >> "$WORK/hostfile"
done

# Bytes of host i's eth0 (tx rx) and its TCP segments retransmitted
# (RetransSegs of the namespace's /proc/net/snmp), read inside its namespace.
veth_bytes() {
  ip netns exec "$PREFIX-h$1" sh -c \
    'echo $(cat /sys/class/net/eth0/statistics/tx_bytes) $(cat /sys/class/net/eth0/statistics/rx_bytes) $(awk "/^Tcp:/ { if (n++) print \$13 }" /proc/net/snmp)'
}
# The agent needs these (it is started by mpirun, with mpirun's environment).
export ZS_MH_PREFIX="$PREFIX" ZS_MH_HOSTS_FILE="$WORK/hosts"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Environment for the ranks: what the program needs, passed by name.
xenv=()
for v in OMP_NUM_THREADS LD_LIBRARY_PATH PATH CI ASAN_OPTIONS $(compgen -e | grep '^ZS_' | grep -v '^ZS_MH_'); do
  [ -n "${!v+x}" ] && xenv+=(-x "$v")
done

# One check before the run: every host's link is up (no ping here).
for ((i = 0; i < hosts; i++)); do
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    st=$(ip netns exec "$PREFIX-h$i" cat /sys/class/net/eth0/operstate 2>/dev/null)
    [ "$st" = up ] && break
    sleep 0.2
  done
  [ "$st" = up ] || cannot "host $i's link is '$st', not up"
done

declare -a before after
for ((i = 0; i < hosts; i++)); do before[$i]=$(veth_bytes "$i"); done

rc=0
"$AGENT" --argv zsmh-h0 mpirun --hostfile "$WORK/hostfile" -np $((hosts * per_host)) \
  --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1 \
  --mca btl tcp,vader,self \
  --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" \
  --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
  "${xenv[@]}" "$@" || rc=$?

for ((i = 0; i < hosts; i++)); do after[$i]=$(veth_bytes "$i"); done
mtu=$(ip netns exec "$PREFIX-h0" cat /sys/class/net/eth0/mtu)
line="{\"hosts\":$hosts,\"ranks_per_host\":$per_host,\"mtu\":$mtu,\"veth\":["
for ((i = 0; i < hosts; i++)); do
  read -r tx0 rx0 re0 <<< "${before[$i]}"
  read -r tx1 rx1 re1 <<< "${after[$i]}"
  [ $i -gt 0 ] && line+=","
  line+="{\"host\":$i,\"tx_bytes\":$((tx1 - tx0)),\"rx_bytes\":$((rx1 - rx0)),\"tcp_retrans_segs\":$((re1 - re0))}"
done
line+="],\"exit\":$rc}"
echo "$line"
[ -n "$json_out" ] && echo "$line" > "$json_out"
exit $rc
