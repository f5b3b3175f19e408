#!/bin/sh
echo "coverage is not available in the offline Bazel build" >&2
exit 1
