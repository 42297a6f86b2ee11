#!/usr/bin/env bash
# Try tern over a slow link on one machine (root only): N "sites", each a network namespace with
# one address on a shared bridge, every link shaped with tc tbf in both directions (this is what
# the project's race and fault benchmarks do; the kernels here have no netem, so no added delay).
#
#   sudo deploy/slow-link.sh up 4 100mbit          # sites 0..3 at 10.78.0.1 .. 10.78.0.4
#   sudo deploy/slow-link.sh exec 2 tern worker --id=2 --listen=10.78.0.3:7070 ...
#   sudo deploy/slow-link.sh status                # the sites, their rate, bytes sent
#   sudo deploy/slow-link.sh down
#
# A daemon in site I listens on 10.78.0.(I+1); the host reaches every site at 10.78.0.254.
set -euo pipefail
PREFIX=${SLOW_LINK_PREFIX:-tsl}  # names: namespaces tsl-0.., bridge tsl-br (<= 15 characters)
BR=$PREFIX-br

die() { echo "slow-link: $*" >&2; exit 1; }
need_root() { [[ $(id -u) -eq 0 ]] || die "needs root (namespaces, qdiscs): run it with sudo"; }
sites() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-[0-9]+$" | sort -V || true; }

shape() {  # DEV RATE [NS]: token bucket at RATE, a burst of 32 KiB and at most 50 ms queued
  local run=()
  [[ -n ${3:-} ]] && run=(ip netns exec "$3")
  "${run[@]}" tc qdisc replace dev "$1" root tbf rate "$2" burst 32kbit latency 50ms
}

up() {
  local n=${1:?usage: up N RATE} rate=${2:?usage: up N RATE}
  need_root
  [[ -z $(sites) ]] || die "sites exist already (down first)"
  ip link add "$BR" type bridge
  ip addr add 10.78.0.254/24 dev "$BR"
  ip link set "$BR" up
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX-$i host=${PREFIX}h$i peer=${PREFIX}p$i
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip link add "$host" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
    ip link set "$host" master "$BR" up
    ip netns exec "$ns" ip addr add "10.78.0.$((i + 1))/24" dev "$peer"
    ip netns exec "$ns" ip link set "$peer" up
    shape "$host" "$rate"         # into the site
    shape "$peer" "$rate" "$ns"   # out of the site
  done
  echo "slow-link: $n sites at $rate: 10.78.0.1 .. 10.78.0.$n (host: 10.78.0.254)"
}

down() {
  need_root
  for ns in $(sites); do
    ip link del "${PREFIX}h${ns##*-}" 2>/dev/null || true
    ip netns del "$ns"
  done
  ip link del "$BR" 2>/dev/null || true
  echo "slow-link: removed"
}

status() {
  for ns in $(sites); do
    local i=${ns##*-}
    local qd tx
    qd=$(ip netns exec "$ns" tc qdisc show dev "${PREFIX}p$i" | grep -o "rate [^ ]*" || echo "rate ?")
    tx=$(ip netns exec "$ns" cat "/sys/class/net/${PREFIX}p$i/statistics/tx_bytes")
    echo "site $i: 10.78.0.$((i + 1)), $qd, sent $((tx / 1048576)) MiB"
  done
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  exec)
    shift
    i=${1:?usage: exec I COMMAND...}
    shift
    need_root
    exec ip netns exec "$PREFIX-$i" "$@" ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
