#!/bin/bash
# stacked_diff_test.sh — wrapping the stacked-layout trainer is a small
# edit: `diff -u train_plain.c train_sharded.c` changes at most 60 lines of
# code, none inside the forward and backward functions (tools/wrapdiff.py).
# Also checks that wrapdiff.py would catch a change in a frozen body and a
# count over the limit (copies of the trainer, altered).
set -u
wrapdiff=$1 plain=$2 sharded=$3
frozen=embed_forward,block_forward,head_forward,head_backward,block_backward,embed_backward
fail=0
out=$(python3 "$wrapdiff" "$plain" "$sharded" --max 60 --frozen "$frozen")
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then echo "FAIL: the wrap is larger than allowed"; fail=1; fi

tmp=${TEST_TMPDIR:-/tmp}/stacked_diff.$$
mkdir -p "$tmp"
# a changed line inside block_forward's body
sed 's/gpt2_gelu_forward(l_fch_gelu, l_fch,/gpt2_gelu_forward(l_fch_gelu, l_fch + 0,/' \
  "$sharded" > "$tmp/body.c"
out=$(python3 "$wrapdiff" "$plain" "$tmp/body.c" --max 60 --frozen "$frozen")
if [ $? -ne 1 ] || ! grep -q "inside block_forward()" <<<"$out"; then
  echo "FAIL: a change inside block_forward was not reported: $out"; fail=1
fi
# comment-only and blank lines do not count; code lines do
{ cat "$sharded"; printf '\n/* a comment */\n// another\n'; } > "$tmp/comment.c"
n0=$(python3 "$wrapdiff" "$plain" "$sharded" | cut -d' ' -f1)
n1=$(python3 "$wrapdiff" "$plain" "$tmp/comment.c" | cut -d' ' -f1)
[ "$n0" = "$n1" ] || { echo "FAIL: comments counted ($n0 vs $n1)"; fail=1; }
{ cat "$sharded"; printf 'static int extra1;\nstatic int extra2;\n'; } > "$tmp/code.c"
n2=$(python3 "$wrapdiff" "$plain" "$tmp/code.c" | cut -d' ' -f1)
[ "$n2" = "$((n0 + 2))" ] || { echo "FAIL: code lines miscounted ($n0 then $n2)"; fail=1; }
python3 "$wrapdiff" "$plain" "$tmp/code.c" --max "$n0" >/dev/null
[ $? -eq 1 ] || { echo "FAIL: a count over --max passed"; fail=1; }
rm -rf "$tmp"
[ $fail -eq 0 ] && echo PASS
exit $fail
