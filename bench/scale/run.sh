#!/bin/bash
# The aggregator under load (issue 17, docs/benchmarks.md): for each client count, a fresh
# `tern server` (federated, 10 % of the clients per round, a round closing as soon as all of
# them replied, a checkpoint on local disk) and one tern_swarm process simulating every client.
# Prints one line per client count: round time, Push latency, failed calls, the server's CPU
# seconds and resident memory.
# Usage: bench/scale/run.sh [BUILD_DIR] [CLIENT_COUNTS] [ROUNDS]
#   e.g. bench/scale/run.sh build "100 1000 10000" 10
set -u
BUILD=${1:-build}
COUNTS=${2:-"100 1000 10000"}
ROUNDS=${3:-10}
TERN=$BUILD/cli/tern
SWARM=$BUILD/bench/tern_swarm
OUT=$(mktemp -d /tmp/tern-scale-XXXXXX)
SERVER_PID=
FAILED=0
trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null' EXIT

# Thousands of streams: make sure the file-descriptor limit is not what fails.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

for n in $COUNTS; do
  k=$((n / 10))
  "$TERN" server --listen=127.0.0.1:0 --port_file="$OUT/port-$n" --rounds=100000 \
    --min_clients="$n" --clients_per_round="$k" --grace_s=0 --round_deadline_s=60 \
    ${CHECKPOINT-"--checkpoint=$OUT/ckpt-$n"} > "$OUT/server-$n.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 100); do [ -s "$OUT/port-$n" ] && break; sleep 0.1; done
  if [ ! -s "$OUT/port-$n" ]; then
    echo "clients $n: the server did not start (log: $OUT/server-$n.log)"
    exit 1
  fi
  "$SWARM" --server="127.0.0.1:$(cat "$OUT/port-$n")" --clients="$n" --rounds="$ROUNDS" \
    --server_pid="$SERVER_PID" 2> "$OUT/swarm-$n.log"
  rc=$?
  echo "  (k = $k per round; server log $OUT/server-$n.log)"
  if [ "$rc" != 0 ]; then
    echo "clients $n: the swarm failed (rc $rc; $OUT/swarm-$n.log)"
    FAILED=1
  fi
  kill "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
done
exit $FAILED
