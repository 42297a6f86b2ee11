#!/usr/bin/python3
"""Checks the race's links: the round trip ping sees, and what one TCP flow carries.

    sudo /usr/bin/python3 bench/race/linkcheck.py --rates 10mbit,100mbit,1gbit --rtts 0,20,100

For each rate and round trip it makes two sites (bench/race/netns.py), pings site 1 from site 0
(20 pings, 0.2 s apart) and sends one TCP flow from site 0 to site 1 for --seconds, counting
what arrives after the first third (slow start excluded). It prints the mean RTT against the
setting (a check fails past 10 % or 1 ms, whichever is more) and the flow's rate against its
bound: the link's rate, or one window per round trip when that is less (the window: the least of
half net.ipv4.tcp_rmem's maximum, which is about what Linux advertises of a receive buffer, and
net.ipv4.tcp_wmem's maximum, the most a sender keeps unacknowledged; the socket's own overhead
takes part of the latter, so a check passes at 70 % of the bound). Exit 0 when every check
passes, 1 otherwise, 77 when it cannot run here (not root).
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PY = "/usr/bin/python3"


def parse():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="10mbit,100mbit,1gbit")
    p.add_argument("--rtts", default="0,20,100", help="round trips, ms")
    p.add_argument("--seconds", type=float, default=6.0, help="the TCP flow's length")
    p.add_argument("--delay_line", default="", help="tern-delay-line (default: build/bench/)")
    p.add_argument("--delay_tick_ms", type=float, default=None,
                   help="the delay line's tick (default: netns.tick_ms of the round trip; 0: "
                        "it wakes for every packet)")
    return p.parse_args()


def sink(port, seconds):
    """Site 1's side: accepts one flow, prints bytes received in each 0.1 s."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    print("listening", flush=True)
    conn, _ = srv.accept()
    conn.settimeout(seconds + 10)
    start, got, marks = time.time(), 0, []
    buf = bytearray(1 << 20)
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        got += n
        marks.append((time.time() - start, got))
    print(" ".join(f"{t:.3f}:{b}" for t, b in marks[::max(1, len(marks) // 2000)] + marks[-1:]))


def source(addr, port, seconds):
    """Site 0's side: one flow for `seconds`."""
    s = socket.create_connection((addr, port), timeout=30)
    data, end = b"\0" * (1 << 20), time.time() + seconds
    while time.time() < end:
        s.sendall(data)
    s.close()


def sysctl_max(net, name):
    out = subprocess.run(["ip", "netns", "exec", net.ns(1), "sysctl", "-n", name],
                         capture_output=True, text=True).stdout.split()
    return int(out[2]) if len(out) == 3 else 4 << 20


def window(net):
    """Bytes one flow can have in flight: the receiver's advertised window or the sender's
    buffer, whichever is less."""
    return min(sysctl_max(net, "net.ipv4.tcp_rmem") / 2, sysctl_max(net, "net.ipv4.tcp_wmem"))


def ping(net, count=20):
    out = subprocess.run(["ip", "netns", "exec", net.ns(0), "ping", "-n", "-q", "-c", str(count),
                          "-i", "0.2", net.addr(1)], capture_output=True, text=True)
    m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", out.stdout)
    lost = re.search(r"(\d+)% packet loss", out.stdout)
    if not m:
        raise RuntimeError(f"ping: {out.stdout} {out.stderr}")
    return float(m.group(2)), float(m.group(4)), int(lost.group(1)) if lost else -1


def flow(net, seconds):
    port = 5201
    sink_p = subprocess.Popen(["ip", "netns", "exec", net.ns(1), PY, __file__, "--_sink",
                               str(port), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert sink_p.stdout.readline().strip() == "listening"
    subprocess.run(["ip", "netns", "exec", net.ns(0), PY, __file__, "--_source", net.addr(1),
                    str(port), str(seconds)], check=True, timeout=seconds + 60)
    marks = [tuple(float(x) for x in m.split(":")) for m in sink_p.communicate(timeout=60)[0].split()]
    t_end, b_end = marks[-1]
    t_from = t_end / 3
    b_from = next(b for t, b in marks if t >= t_from)
    t_at = next(t for t, b in marks if t >= t_from)
    return 8 * (b_end - b_from) / max(1e-9, t_end - t_at)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--_sink":
        return sink(int(sys.argv[2]), float(sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "--_source":
        return source(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    a = parse()
    netns.require_root()
    delay_line = a.delay_line or netns.find_delay_line(os.path.join(ROOT, "build", "cli", "tern"))
    failed = 0
    print(f"{'rate':>8} {'RTT set':>8} {'ping avg':>9} {'mdev':>6} {'loss':>5} {'one flow':>10} "
          f"{'bound':>10} {'of bound':>8}")
    for rate in a.rates.split(","):
        for rtt in (float(r) for r in a.rtts.split(",")):
            with netns.Sites(2, rate, rtt_ms=rtt, delay_line=delay_line,
                             delay_tick_ms=a.delay_tick_ms) as net:
                avg, mdev, loss = ping(net)
                bound = min(netns.rate_bits(rate), 8 * window(net) / (rtt / 1e3) if rtt else 1e18)
                got = flow(net, a.seconds)
                ok_rtt = abs(avg - rtt) <= max(0.1 * rtt, 1.0) and loss == 0
                ok_flow = got >= 0.7 * bound
                failed += not (ok_rtt and ok_flow and net.delay_line_alive())
                print(f"{rate:>8} {rtt:>6.0f}ms {avg:>7.2f}ms {mdev:>6.2f} {loss:>4}% "
                      f"{got / 1e6:>7.1f}Mb/s {bound / 1e6:>7.1f}Mb/s {100 * got / bound:>7.0f}%"
                      + ("" if ok_rtt else "  RTT OFF") + ("" if ok_flow else "  FLOW LOW"),
                      flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
