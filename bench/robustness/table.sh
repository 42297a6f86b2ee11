#!/bin/bash
# The rule x attack table of docs/robustness.md: federated runs of 10 built-in clients, all in
# every round, 2 of them malicious, for every aggregation rule against every attack; the final
# test accuracy of each. Usage: bench/robustness/table.sh [TERN_BINARY] [ROUNDS]
set -u
TERN=${1:-./build/cli/tern}
ROUNDS=${2:-30}
OUT=$(mktemp -d /tmp/tern-robustness-XXXXXX)
RULES=("fedavg" "median" "trimmed-mean:trim=0.2" "krum:f=2" "multi-krum:f=2,m=6")
ATTACKS=("none" "signflip:scale=10" "scale:factor=100" "noise:std=1" "nan")

run() {  # run NAME ARGS... -> prints the final accuracy or "failed"
  local name=$1
  shift
  local line
  # A round closes with 8 replies (and 1 s of grace): refused updates do not hold it up.
  line=$("$TERN" run --mode=federated --clients=10 --clients_per_round=10 --min_replies=8 \
    --rounds="$ROUNDS" \
    --out="$OUT/$name" "$@" 2>/dev/null | grep -E '^(done|run failed):')
  local acc
  acc=$(echo "$line" | grep -o 'test accuracy [0-9.]*%' | head -1)
  acc=${acc#test accuracy }
  case "$line" in
    done:*) echo "$acc" ;;
    *collapsed*) echo "$acc, run failed (collapsed)" ;;
    *) echo "run failed" ;;
  esac
}

printf '| rule |'
for a in "${ATTACKS[@]}"; do printf ' %s |' "$a"; done
printf '\n|---|'
for _ in "${ATTACKS[@]}"; do printf -- '---|'; done
printf '\n'
for r in "${RULES[@]}"; do
  printf '| %s |' "$r"
  for a in "${ATTACKS[@]}"; do
    printf ' %s |' "$(run "${r//[:=,]/-}-${a//[:=,]/-}" --rule="$r" --attack="$a" \
      --attack_fraction=0.2)"
  done
  printf '\n'
done
printf '| fedavg, --norm_guard=0 |'
for a in "${ATTACKS[@]}"; do
  printf ' %s |' "$(run "fedavg-noguard-${a//[:=,]/-}" --rule=fedavg --norm_guard=0 \
    --attack="$a" --attack_fraction=0.2)"
done
printf '\n\nrun folders: %s\n' "$OUT"
