#!/bin/sh
# install.sh — installs ZeroShard from the tree //tools/dist:dist built
# (zeroshard.tar) under PREFIX: tools/zs install runs it, and so do the
# tests, on a temporary prefix.
#
#   tools/dist/install.sh TARBALL PREFIX
#
# Writes PREFIX/{include,lib,lib/pkgconfig,lib/cmake/ZeroShard,bin,
# libexec/zeroshard}; zeroshard.pc gets PREFIX. Files already there are
# replaced; nothing else is touched. Exit 1 on an error, 2 on usage.
set -eu
[ $# -eq 2 ] || { echo "usage: install.sh TARBALL PREFIX" >&2; exit 2; }
tarball=$1
case "$2" in
  /*) prefix=$2 ;;
  *) prefix=$(pwd)/$2 ;;
esac
[ -r "$tarball" ] || { echo "install.sh: cannot read $tarball" >&2; exit 1; }
stage=$(mktemp -d "${TMPDIR:-/tmp}/zs-install-XXXXXX")
trap 'rm -rf "$stage"' EXIT
tar -xf "$tarball" -C "$stage"
pc="$stage/lib/pkgconfig/zeroshard.pc"
sed "s|@PREFIX@|$prefix|" "$pc" >"$pc.tmp" && mv "$pc.tmp" "$pc"
mkdir -p "$prefix"
# cp -a keeps the library's version symlinks; each file lands whole
(cd "$stage" && find . -type d) | while read -r d; do mkdir -p "$prefix/$d"; done
(cd "$stage" && find . ! -type d) | while read -r f; do
  cp -a "$stage/$f" "$prefix/$f.zs-new" && mv -f "$prefix/$f.zs-new" "$prefix/$f"
done
# the dynamic linker's cache, where PREFIX/lib is one of its directories
if [ "$(id -u)" = 0 ] && command -v ldconfig >/dev/null &&
   ldconfig -N -v 2>/dev/null | grep -q "^$prefix/lib:"; then
  ldconfig
fi
echo "zs: installed ZeroShard $(sed -n 's/^Version: //p' "$pc") under $prefix"
