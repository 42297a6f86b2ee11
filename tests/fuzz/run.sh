#!/usr/bin/env bash
# Runs every fuzz target in BUILD_DIR (default build-fuzz) for SECONDS each (default 20), from an
# empty corpus, JOBS at a time (default: one per core; a target is single-threaded). Exits
# non-zero when any target crashed, leaked or made a sanitizer report, printing its report.
set -uo pipefail
build=${1:-build-fuzz}
seconds=${2:-20}
parallel=${3:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run_one() {
  local bin=$1 name rc runs
  name=$(basename "$bin")
  mkdir -p "$work/$name"
  "$bin" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/$name-" "$work/$name" >"$work/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && grep -q "runtime error\|ERROR: AddressSanitizer\|SUMMARY:" "$work/$name.log"; then
    rc=1
  fi
  runs=$(grep -m1 "stat::number_of_executed_units" "$work/$name.log" | awk '{print $2}')
  printf '%-28s %10s runs in %ss  rc=%d\n' "$name" "${runs:-?}" "$seconds" "$rc"
  echo "$rc" >"$work/$name.rc"
}

for bin in "$build"/tests/fuzz/fuzz_*; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do sleep 0.2; done
  run_one "$bin" &
done
wait

failed=0
for bin in "$build"/tests/fuzz/fuzz_*; do
  name=$(basename "$bin")
  if [ "$(cat "$work/$name.rc" 2>/dev/null || echo 1)" -ne 0 ]; then
    echo "fuzzer $name failed:" >&2
    grep -B5 -A30 "ERROR\|runtime error" "$work/$name.log" | head -80 >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] && echo "all fuzzers ran clean"
exit "$failed"
