#!/usr/bin/env bash
# header_test.sh — tools/check_header.py on the public headers: every entry
# at most 12 comment lines; prints what is marked [experimental].
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE:-__main__}"
h=("$root/runtime/include/zeroshard.h" "$root/runtime/include/zs_mpi.h")
python3 "$root/tools/check_header.py" "${h[@]}"
python3 "$root/tools/check_header.py" --list-experimental "${h[@]}"
