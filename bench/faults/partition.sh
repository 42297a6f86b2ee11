#!/usr/bin/env bash
# A network partition that heals, made with namespaces (root only): 4 gossip workers in a ring,
# 0 and 1 in one network namespace, 2 and 3 in another, joined by a bridge in this one (where
# `tern run` watches them). After CUT_AT evaluations (8 an epoch) the bridge stops forwarding
# between the two halves (port isolation: frames are dropped silently, as on a broken link, so
# pushes across hang to their deadline); after HEAL_AT it forwards again. Cut and heal follow the
# run's progress, not the clock, so a faster machine cuts as many rounds apart and leaves as many
# to meet again. Prints the consensus distance before, during and after, and exits non-zero
# unless the run re-converged.
#
# The launcher's evaluations trail the workers (it reads each worker's snapshot of a step, and a
# worker keeps only its newest 16): on a 2-core machine one half ran ~2,000 rounds while the
# launcher waited on the other half's snapshot of the round the cut began in, and the rows it
# wrote next held only that half (consensus within one half: tiny). So the phases come from the
# workers' own step logs (the round each worker was in when the bridge was cut and when it was
# mended), and the consensus is judged only on rows that hold every worker.
#
#   bench/faults/partition.sh [BUILD] [EPOCHS]        (defaults: build 8)
#   CUT_AT=8 HEAL_AT=16 bench/faults/partition.sh     (evaluations: after epochs 1 and 2)
#
# Exit codes: 0 re-converged, 1 did not, 77 namespaces unavailable (not root, no CAP_NET_ADMIN).
set -euo pipefail
BUILD=${1:-build}
EPOCHS=${2:-8}
CUT_AT=${CUT_AT:-8}
HEAL_AT=${HEAL_AT:-16}
TERN=$(realpath "$BUILD/cli/tern")
OUT=${OUT:-$(mktemp -d /tmp/tern-partition.XXXXXX)}
TAG=tp$$  # names unique to this run (interfaces: at most 15 characters)
NS_A=$TAG-a NS_B=$TAG-b BR=$TAG-br

run=
cleanup() {
  [[ -n $run ]] && kill "$run" 2>/dev/null
  ip link del "$BR" 2>/dev/null || true
  ip link del "${TAG}a0" 2>/dev/null || true
  ip link del "${TAG}b0" 2>/dev/null || true
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
}
trap cleanup EXIT

# One namespace with its end of a veth on the bridge at 10.77.0.$2 (every step checked: `set -e`
# does not apply inside the `if` that runs setup).
half() {
  local ns=$1 host=$2 side=$3
  ip netns add "$ns" &&
    ip netns exec "$ns" ip link set lo up &&
    ip link add "${TAG}${side}0" type veth peer name "${TAG}${side}1" &&
    ip link set "${TAG}${side}1" netns "$ns" &&
    ip link set "${TAG}${side}0" master "$BR" up &&
    ip netns exec "$ns" ip addr add "10.77.0.$host/24" dev "${TAG}${side}1" &&
    ip netns exec "$ns" ip link set "${TAG}${side}1" up
}

isolate() {  # on | off
  bridge link set dev "${TAG}a0" isolated "$1" && bridge link set dev "${TAG}b0" isolated "$1"
}

setup() {
  ip link add "$BR" type bridge &&
    ip addr add 10.77.0.254/24 dev "$BR" &&
    ip link set "$BR" up &&
    half "$NS_A" 1 a &&
    half "$NS_B" 2 b &&
    isolate on && isolate off  # port isolation: Linux 4.18 and later
}

if ! setup > "$OUT/setup.log" 2>&1; then
  echo "partition: cannot build the namespaces (needs root, CAP_NET_ADMIN and bridge port" \
    "isolation): skipped"
  sed 's/^/  /' "$OUT/setup.log"
  exit 77
fi

"$TERN" run --workers=4 --epochs="$EPOCHS" --evals_per_epoch=8 --round_timeout=2 \
  --worker_netns="$NS_A,$NS_A,$NS_B,$NS_B" \
  --worker_hosts=10.77.0.1,10.77.0.1,10.77.0.2,10.77.0.2 \
  --log_level=warn --out="$OUT" > "$OUT/run.out" 2>&1 &
run=$!

# Waits until the run has written $1 evaluations (or ended).
rows() { [[ -s $OUT/metrics.jsonl ]] && wc -l < "$OUT/metrics.jsonl" || echo 0; }
wait_rows() {
  while (($(rows) < $1)) && kill -0 "$run" 2>/dev/null; do sleep 0.1; done
}

wait_rows "$CUT_AT"
isolate on
cut_t=$(date +%s.%N)
echo "partition: cut after $(rows) evaluations"
wait_rows "$HEAL_AT"
isolate off
heal_t=$(date +%s.%N)
echo "partition: healed after $(rows) evaluations"
status=0
wait "$run" || status=$?
run=
tail -2 "$OUT/run.out"
if ((status != 0)); then
  echo "partition: tern run exited $status (run folder $OUT)"
  exit 1
fi

/usr/bin/python3 - "$OUT" 4 "$cut_t" "$heal_t" <<'PY'
import json, sys
out, n, cut_t, heal_t = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
def lines(path):
    return [json.loads(l) for l in open(path) if l.strip()]
def round_at(steps, t):  # the round a worker was in at unix time t
    return max((s["step"] for s in steps if s["start_unix_s"] <= t), default=0)
logs = [lines(f"{out}/worker-{i}.steps.jsonl") for i in range(n)]
at_cut = [round_at(s, cut_t) for s in logs]
at_heal = [round_at(s, heal_t) for s in logs]
print(f"partition: rounds of workers 0-{n - 1} at the cut {at_cut}, at the heal {at_heal}")
cut, heal = min(at_cut), max(at_heal)
rows = lines(f"{out}/metrics.jsonl")
def phase(r):
    return "before" if r["step"] <= cut else ("cut" if r["step"] <= heal else "healed")
for r in rows:
    some = "" if r["workers"] == n else f"  ({r['workers']} of {n} workers: not judged)"
    print(f"{phase(r):7s} step {r['step']:5d}  wall {r['wall_s']:6.1f} s  "
          f"acc {100 * r['test_acc']:5.2f} %  consensus {r.get('consensus', 0):.3g}{some}")
full = [r for r in rows if r["workers"] == n]
worst = max((r.get("consensus", 0) for r in full if r["step"] > cut), default=0)
last = rows[-1]
end = last.get("consensus", 1)
ok = last["workers"] == n and end < 0.1 and worst > 10 * end
print(f"partition: peak consensus after the cut {worst:.3g}, at the end {end:.3g}"
      f" ({'re-converged' if ok else 'NOT re-converged'}), accuracy {100 * last['test_acc']:.2f} %")
sys.exit(0 if ok else 1)
PY
