#!/bin/sh
# multihost_agent.sh — "ssh" into one fake host of tools/multihost.sh.
#
# usage: multihost_agent.sh HOST CMD...     (as Open MPI's plm_rsh_agent)
#        multihost_agent.sh --argv HOST PROGRAM ARGS...
#
# HOST is zsmh-h<i>. The command runs in that host's network namespace
# ($ZS_MH_PREFIX-h<i>), under `unshare -u` with hostname HOST, with
# $ZS_MH_HOSTS_FILE bind-mounted over /etc/hosts in the private mount
# namespace that `ip netns exec` makes (the real /etc/hosts is untouched).
# Like ssh, the first form joins CMD's words and runs them with sh -c (Open
# MPI sends a shell command line); --argv runs PROGRAM with ARGS as given.
# Both variables come from tools/multihost.sh (mpirun's environment).
set -eu
argv=0
if [ "${1:-}" = --argv ]; then argv=1; shift; fi
host=${1:?multihost_agent: no host}; shift
: "${ZS_MH_PREFIX:?multihost_agent: ZS_MH_PREFIX unset (run by tools/multihost.sh)}"
: "${ZS_MH_HOSTS_FILE:?multihost_agent: ZS_MH_HOSTS_FILE unset}"
case "$host" in
  zsmh-h[0-9]|zsmh-h[0-9][0-9]|zsmh-h[0-9][0-9][0-9]) ;;
  *) echo "multihost_agent: unknown host '$host' (expected zsmh-h<i>)" >&2; exit 255 ;;
esac
ns="$ZS_MH_PREFIX-${host#zsmh-}"
enter='hostname "$1" && mount --bind "$2" /etc/hosts || exit 255; shift 2'
if [ $argv = 1 ]; then
  exec ip netns exec "$ns" unshare -u sh -c "$enter; exec \"\$@\"" sh \
    "$host" "$ZS_MH_HOSTS_FILE" "$@"
else
  exec ip netns exec "$ns" unshare -u sh -c "$enter; exec sh -c \"\$*\"" sh \
    "$host" "$ZS_MH_HOSTS_FILE" "$@"
fi
