#!/usr/bin/env bash
# Runs every fuzz target in BUILD_DIR (default build-fuzz) for SECONDS each (default 20), from an
# empty corpus. Exits non-zero on the first crash, leak or sanitizer report.
set -uo pipefail
build=${1:-build-fuzz}
seconds=${2:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for bin in "$build"/tests/fuzz/fuzz_*; do
  name=$(basename "$bin")
  mkdir -p "$work/$name"
  "$bin" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work/$name" >"$work/$name.log" 2>&1
  rc=$?
  runs=$(grep -m1 "stat::number_of_executed_units" "$work/$name.log" | awk '{print $2}')
  printf '%-28s %10s runs in %ss  rc=%d\n' "$name" "${runs:-?}" "$seconds" "$rc"
  if [ "$rc" -ne 0 ] || grep -q "runtime error\|ERROR: AddressSanitizer\|SUMMARY:" "$work/$name.log"; then
    echo "fuzzer $name failed:" >&2
    grep -B5 -A30 "ERROR\|runtime error" "$work/$name.log" | head -80 >&2
    exit 1
  fi
done
echo "all fuzzers ran clean"
