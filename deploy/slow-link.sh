#!/usr/bin/env bash
# Try tern over a slow link on one machine (root only): N "sites", each a network namespace with
# one address on a shared bridge, every link shaped with tc tbf in both directions and, with a
# round trip, delayed in between by tern-delay-line (this is what the project's race does; the
# kernels here have no netem, so the bridge hands what it forwards to NFQUEUE, and the delay line
# holds each packet RTT/2 in user space).
#
#   sudo deploy/slow-link.sh up 4 100mbit          # sites 0..3 at 10.78.0.1 .. 10.78.0.4
#   sudo deploy/slow-link.sh up 4 100mbit 50       # the same, 50 ms round trip between sites
#   sudo deploy/slow-link.sh exec 2 tern worker --id=2 --listen=10.78.0.3:7070 ...
#   sudo deploy/slow-link.sh status                # the sites, their rate, bytes sent
#   sudo deploy/slow-link.sh down
#
# A daemon in site I listens on 10.78.0.(I+1); the host reaches every site at 10.78.0.254 (without
# the delay: only traffic between sites is held); SLOW_LINK_NET=A.B.C moves them to A.B.C.0/24, and
# SLOW_LINK_PREFIX names another set, beside this one. The delay needs iptables and tern-delay-line
# ($TERN_DELAY_LINE, else on PATH, else build/bench/ beside this script's checkout).
set -euo pipefail
PREFIX=${SLOW_LINK_PREFIX:-tsl}  # names: namespaces tsl-0.., bridge tsl-br (<= 15 characters)
BR=$PREFIX-br
STATE=/run/$PREFIX-slow-link  # the delay line's pid and log, the sysctl value to restore
QUEUE=${SLOW_LINK_QUEUE:-7078}  # the NFQUEUE queue number the delay line binds
NET=${SLOW_LINK_NET:-10.78.0}  # the sites' /24: NET.1 .. NET.N, the host NET.254

die() { echo "slow-link: $*" >&2; exit 1; }
need_root() { [[ $(id -u) -eq 0 ]] || die "needs root (namespaces, qdiscs): run it with sudo"; }
sites() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-[0-9]+$" | sort -V || true; }

shape() {  # DEV RATE [NS]: token bucket at RATE, a burst of 32 KiB and at most 50 ms queued
  local run=()
  [[ -n ${3:-} ]] && run=(ip netns exec "$3")
  "${run[@]}" tc qdisc replace dev "$1" root tbf rate "$2" burst 32kbit latency 50ms
}

delay_line() {
  local here
  here=$(cd "$(dirname "$0")" && pwd)
  for p in "${TERN_DELAY_LINE:-}" "$(command -v tern-delay-line || true)" \
           "$here/../build/bench/tern-delay-line"; do
    [[ -n $p && -x $p ]] && { echo "$p"; return; }
  done
  die "no tern-delay-line: build it (apt-get install libnetfilter-queue-dev; cmake --build build)" \
      "or set TERN_DELAY_LINE"
}

delay() {  # RTT_MS: every packet the bridge forwards from one site to another waits RTT_MS/2
  local rtt=$1 bin
  bin=$(delay_line)
  command -v iptables >/dev/null || die "the delay needs iptables (apt-get install iptables)"
  mkdir -p "$STATE"
  cat /proc/sys/net/bridge/bridge-nf-call-iptables > "$STATE/bridge-nf-call-iptables" 2>/dev/null ||
    die "no br_netfilter here (modprobe br_netfilter)"
  sysctl -qw net.bridge.bridge-nf-call-iptables=1
  # It wakes once a tick (RTT/40, at most 2.5 ms; SLOW_LINK_TICK_MS, 0 for every packet), not for
  # each packet: the sites' programs keep their cores, and each packet is held RTT/2 ± tick/2.
  local tick=${SLOW_LINK_TICK_MS:-$(awk "BEGIN{t = $rtt / 40; print (t < 2.5 ? t : 2.5)}")}
  setsid "$bin" --queue="$QUEUE" --delay_ms="$(awk "BEGIN{print $rtt / 2}")" --tick_ms="$tick" \
    > "$STATE/delay-line.log" 2>&1 &
  echo $! > "$STATE/delay-line.pid"
  for _ in $(seq 100); do  # bound before anything is sent to the queue, or it is dropped
    grep -q bound "$STATE/delay-line.log" && break
    kill -0 "$(cat "$STATE/delay-line.pid")" 2>/dev/null || die "tern-delay-line: $(cat "$STATE/delay-line.log")"
    sleep 0.05
  done
  grep -q bound "$STATE/delay-line.log" || die "tern-delay-line did not start"
  iptables -I FORWARD -i "$BR" -o "$BR" -j NFQUEUE --queue-num "$QUEUE"
  echo "$rtt" > "$STATE/rtt_ms"
}

undelay() {
  [[ -d $STATE ]] || return 0
  iptables -D FORWARD -i "$BR" -o "$BR" -j NFQUEUE --queue-num "$QUEUE" 2>/dev/null || true
  if [[ -f $STATE/delay-line.pid ]]; then
    kill "$(cat "$STATE/delay-line.pid")" 2>/dev/null || true
  fi
  if [[ -f $STATE/bridge-nf-call-iptables ]]; then
    sysctl -qw net.bridge.bridge-nf-call-iptables="$(cat "$STATE/bridge-nf-call-iptables")" || true
  fi
  rm -rf "$STATE"
}

up() {
  local n=${1:?usage: up N RATE [RTT_MS]} rate=${2:?usage: up N RATE [RTT_MS]} rtt=${3:-0}
  need_root
  [[ -z $(sites) ]] || die "sites exist already (down first)"
  ip link add "$BR" type bridge
  ip addr add "$NET.254/24" dev "$BR"
  ip link set "$BR" up
  for ((i = 0; i < n; i++)); do
    local ns=$PREFIX-$i host=${PREFIX}h$i peer=${PREFIX}p$i
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip link add "$host" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
    ip link set "$host" master "$BR" up
    ip netns exec "$ns" ip addr add "$NET.$((i + 1))/24" dev "$peer"
    ip netns exec "$ns" ip link set "$peer" up
    shape "$host" "$rate"         # into the site
    shape "$peer" "$rate" "$ns"   # out of the site
  done
  if [[ $rtt != 0 ]]; then
    delay "$rtt" || { down >/dev/null; exit 1; }
  fi
  echo "slow-link: $n sites at $rate, round trip ${rtt} ms between them: $NET.1 .. $NET.$n" \
       "(host: $NET.254)"
}

down() {
  need_root
  undelay
  for ns in $(sites); do
    ip link del "${PREFIX}h${ns##*-}" 2>/dev/null || true
    ip netns del "$ns"
  done
  ip link del "$BR" 2>/dev/null || true
  echo "slow-link: removed"
}

status() {
  [[ -f $STATE/rtt_ms ]] && echo "round trip between sites: $(cat "$STATE/rtt_ms") ms" \
    "($(kill -0 "$(cat "$STATE/delay-line.pid")" 2>/dev/null && echo "delay line running" ||
        echo "DELAY LINE GONE: packets between sites are dropped; down, then up"))"
  for ns in $(sites); do
    local i=${ns##*-}
    local qd tx
    qd=$(ip netns exec "$ns" tc qdisc show dev "${PREFIX}p$i" | grep -o "rate [^ ]*" || echo "rate ?")
    tx=$(ip netns exec "$ns" cat "/sys/class/net/${PREFIX}p$i/statistics/tx_bytes")
    echo "site $i: $NET.$((i + 1)), $qd, sent $((tx / 1048576)) MiB"
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
  *) sed -n '2,/^set -e/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
