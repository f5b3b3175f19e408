#!/bin/sh
# install.sh — installs ZeroShard from the tree //tools/dist:dist built
# (zeroshard.tar) under PREFIX: tools/zs install runs it, and so do the
# tests, on a temporary prefix.
#
#   tools/dist/install.sh TARBALL PREFIX
#
# Writes PREFIX/{include,lib,lib/pkgconfig,lib/cmake/ZeroShard,bin,
# libexec/zeroshard,share/doc/zeroshard}; zeroshard.pc gets PREFIX
# (absolute, normalized). Each file lands whole (copied beside, then
# renamed over the old one), regular files before the symbolic links that
# name them, with today's date (so that make and CMake see an upgrade);
# nothing else under PREFIX is touched. The first file that cannot be
# installed stops it: exit 1, naming it, leaving no temporary file. Exit
# 2 on a usage error.
set -eu
[ $# -eq 2 ] || { echo "usage: install.sh TARBALL PREFIX" >&2; exit 2; }
tarball=$1
[ -n "$2" ] || { echo "install.sh: PREFIX is empty" >&2; exit 2; }
case "$2" in
  *[[:space:]]*)
    echo "install.sh: PREFIX '$2' has white space, which zeroshard.pc (pkg-config) cannot carry" >&2
    exit 2 ;;
esac
[ -r "$tarball" ] || { echo "install.sh: cannot read $tarball" >&2; exit 1; }
mkdir -p "$2" || { echo "install.sh: cannot create $2" >&2; exit 1; }
prefix=$(cd "$2" && pwd -P)  # absolute, no .. or trailing /
stage=$(mktemp -d "${TMPDIR:-/tmp}/zs-install-XXXXXX")
trap 'rm -rf "$stage"' EXIT
tar -m -xf "$tarball" -C "$stage"
pc="$stage/lib/pkgconfig/zeroshard.pc"
# the prefix as a sed replacement: \, | and & taken literally
esc=$(printf '%s' "$prefix" | sed 's/[\\|&]/\\&/g')
sed "s|@PREFIX@|$esc|" "$pc" >"$pc.tmp"
grep -q '@PREFIX@' "$pc.tmp" && { echo "install.sh: could not write the prefix into zeroshard.pc" >&2; exit 1; }
mv "$pc.tmp" "$pc"

fail() { echo "install.sh: $*" >&2; exit 1; }
# put SRC DST: DST replaced whole by SRC (a file, or a symbolic link)
put() {
  if [ -d "$2" ] && [ ! -L "$2" ]; then
    fail "$2 is a directory; remove it or choose another prefix"
  fi
  if ! cp -P --preserve=mode "$1" "$2.zs-new" 2>/dev/null ||
     ! mv -f "$2.zs-new" "$2" 2>/dev/null; then
    rm -f "$2.zs-new"
    fail "cannot write $2 (permissions? $(id -un) installs)"
  fi
}
(cd "$stage" && find . -type d) >"$stage.dirs"
(cd "$stage" && find . -type f) >"$stage.files"
(cd "$stage" && find . -type l) >"$stage.links"
trap 'rm -rf "$stage" "$stage.dirs" "$stage.files" "$stage.links"' EXIT
while read -r d; do
  mkdir -p "$prefix/$d" 2>/dev/null || fail "cannot create $prefix/${d#./}"
done <"$stage.dirs"
while read -r f; do put "$stage/$f" "$prefix/${f#./}"; done <"$stage.files"
while read -r f; do put "$stage/$f" "$prefix/${f#./}"; done <"$stage.links"

# the dynamic linker's cache, where PREFIX/lib is one of its directories
if [ "$(id -u)" = 0 ] && command -v ldconfig >/dev/null &&
   ldconfig -N -v 2>/dev/null | grep -q "^$prefix/lib:"; then
  ldconfig
fi
echo "zs: installed ZeroShard $(sed -n 's/^Version: //p' "$pc") under $prefix"
