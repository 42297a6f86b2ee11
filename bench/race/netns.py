"""Network namespaces joined by a bridge, every link shaped with tbf and, with a round trip,
delayed in between: the sites of the race.

    with Sites(4, "100mbit", rtt_ms=20, delay_line="build/bench/tern-delay-line") as net:
        net.popen(0, ["tern", "worker", ...])      # runs inside site 0's namespace
        net.tx_bytes(0)                             # bytes site 0 sent on its link

Site i is namespace `tern-race-i` with address 10.77.0.(i+1)/24 on veth `rv{i}`; the other end,
`rb{i}`, sits on bridge `br0` in namespace `tern-race-hub`. Both directions of every link are
shaped to the rate (tbf: one token bucket), so a site has `rate` up and `rate` down, as a site
behind one commodity link does. With `rtt_ms`, every packet the bridge forwards waits rtt_ms / 2
in tern-delay-line (this kernel has no netem: br_netfilter hands the hub's FORWARD chain to
NFQUEUE, and the delay line holds each packet in user space), so any two sites are rtt_ms apart.
The packets are held in between, as a real path holds them, not on the sender's own egress (where
TCP small queues would count them against the socket and throttle the flow). The delay line
wakes once a tick (`delay_tick_ms`; by default rtt_ms / 40, at most 2.5 ms), not for every
packet, and holds each rtt_ms / 2 ± tick / 2: a real path's delay costs the sites' cores
nothing, and waking for each packet took a core from the programs under test some 1,600 times a
second at 10 Mbit/s between four sites (docs/benchmarks.md, "The delay line's wake-ups"). Needs
root (CAP_NET_ADMIN). Everything is torn down on exit, on Ctrl-C and on SIGTERM.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

# TERN_RACE_PREFIX: a second run beside another (a CI smoke, say) in namespaces of its own.
PREFIX = os.environ.get("TERN_RACE_PREFIX", "tern-race")
QUEUE = 7077  # the NFQUEUE queue of the hub's delay line (its own namespace: no clash)


def tick_ms(rtt_ms):
    """The delay line's default tick for a round trip: a packet's hold is off by at most half of
    it, ±1.25 % of the round trip and never more than ±1.25 ms."""
    return min(2.5, rtt_ms / 40)


def _run(*cmd, check=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def rate_bits(rate):
    """'100mbit' -> 1e8."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for u, m in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * m
    raise ValueError(f"rate {rate!r}: a number with gbit, mbit or kbit")


CANNOT_RUN = 77  # exit code: not root, or no network namespaces here (ctest's "skipped")


def require_root():
    """Exits with CANNOT_RUN and says why unless this process can make namespaces and qdiscs."""
    if os.geteuid() != 0:
        print("bench/race needs root (network namespaces and tc): run it with sudo, or as root "
              "in a container with CAP_NET_ADMIN", file=sys.stderr)
        raise SystemExit(CANNOT_RUN)
    probe = f"{PREFIX}-probe"
    r = _run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        print(f"bench/race cannot create a network namespace here ({r.stderr.strip()}); it "
              "needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN", file=sys.stderr)
        raise SystemExit(CANNOT_RUN)
    _run("ip", "netns", "del", probe, check=False)


def cleanup_leftovers():
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            # A namespace outlives nothing it runs: a delay line or worker left by a run killed
            # with SIGKILL goes with it.
            for pid in _run("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", name, check=False)


def find_delay_line(tern=None):
    """tern-delay-line beside the tern binary's build (build/bench/), or on PATH; None if neither."""
    if tern:
        build = os.path.dirname(os.path.dirname(os.path.abspath(tern)))
        for p in (os.path.join(build, "bench", "tern-delay-line"),
                  os.path.join(os.path.dirname(os.path.abspath(tern)), "tern-delay-line")):
            if os.access(p, os.X_OK):
                return p
    return shutil.which("tern-delay-line")


class Sites:
    def __init__(self, n, rate, rtt_ms=0.0, delay_line=None, uplink=None, site_rates=None,
                 lan=None, delay_tick_ms=None):
        self.n, self.rate, self.rtt_ms = n, rate, float(rtt_ms)
        # 0: the delay line wakes for every packet and holds each exactly rtt_ms / 2.
        self.delay_tick_ms = tick_ms(self.rtt_ms) if delay_tick_ms is None else delay_tick_ms
        # A site's own egress (what it sends) at `uplink` when given, as commodity links are
        # slower up than down; what it receives at `rate` either way.
        self.uplink = uplink or rate
        # {site: (rate, uplink)}: sites whose link differs (a data centre's beside the others).
        self.site_rates = site_rates or {}
        # Traffic inside a site (its loopback: processes of one site talking) shaped to `lan`.
        self.lan = lan
        self.delay_line = delay_line
        if self.rtt_ms > 0 and not delay_line:
            raise SystemExit("a round trip needs tern-delay-line (build it: apt-get install "
                             "libnetfilter-queue-dev, then cmake --build build)")
        self.procs = []
        self.delay_proc = None
        self._old = {}

    @property
    def hub(self):
        return f"{PREFIX}-hub"

    def ns(self, i):
        return f"{PREFIX}-{i}"

    def addr(self, i):
        return f"10.77.0.{i + 1}"

    def __enter__(self):
        require_root()
        cleanup_leftovers()
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._on_signal)
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc):
        self.down()
        for sig, h in self._old.items():
            signal.signal(sig, h)
        return False

    def _on_signal(self, sig, frame):
        # Only unwind here: cleaning up inside the handler could re-enter a Popen the main code
        # is polling (its wait lock is not reentrant). __exit__ tears everything down.
        raise SystemExit(f"interrupted (signal {sig}); namespaces removed")

    def _up(self):
        hub = self.hub
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        # A bucket of 10 ms at the rate, at least 64 KiB so one TSO segment fits.
        def burst(rate):
            return max(65536, int(rate_bits(rate) / 8 / 100))
        for i in range(self.n):
            ns = self.ns(i)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", f"rv{i}", "netns", ns, "type", "veth", "peer", "name",
                 f"rb{i}", "netns", hub)
            _run("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", f"rv{i}")
            down, up = self.site_rates.get(i, (self.rate, self.uplink))
            for where, dev, rate in ((ns, f"rv{i}", up), (hub, f"rb{i}", down)):
                _run("ip", "-n", where, "link", "set", dev, "up")
                _run("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                     rate, "burst", str(burst(rate)), "latency", "100ms")
            _run("ip", "-n", hub, "link", "set", f"rb{i}", "master", "br0")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            if self.lan:
                # Loopback's 64 KiB segments need a bucket at least that deep.
                _run("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", self.lan,
                     "burst", str(max(4 * 65536, burst(self.lan))), "latency", "100ms")
        if self.rtt_ms > 0:
            self._delay(hub)

    def _delay(self, hub):
        """Every packet the bridge forwards waits rtt_ms / 2 (it crosses once each way)."""
        _run("ip", "netns", "exec", hub, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
        log = open(os.path.join("/tmp", f"{PREFIX}-delay-line.log"), "w+")
        self.delay_proc = subprocess.Popen(
            ["ip", "netns", "exec", hub, self.delay_line, f"--queue={QUEUE}",
             f"--delay_ms={self.rtt_ms / 2}", f"--tick_ms={self.delay_tick_ms}"], stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.time() + 10
        while True:  # the queue must be bound before packets go to it, or they are dropped
            log.seek(0)
            if "bound" in log.read():
                break
            if self.delay_proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                raise RuntimeError(f"tern-delay-line did not start: {log.read().strip()}")
            time.sleep(0.05)
        _run("ip", "netns", "exec", hub, "iptables", "-A", "FORWARD", "-j", "NFQUEUE",
             "--queue-num", str(QUEUE))

    def popen(self, i, cmd, log_path, env=None):
        """Starts `cmd` in site i's namespace, output to `log_path`."""
        log = open(log_path, "w")
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(i)] + list(cmd), stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def tx_bytes(self, i):
        path = f"/sys/class/net/rv{i}/statistics/tx_bytes"
        return int(_run("ip", "netns", "exec", self.ns(i), "cat", path).stdout)

    def rx_bytes(self, i):
        path = f"/sys/class/net/rv{i}/statistics/rx_bytes"
        return int(_run("ip", "netns", "exec", self.ns(i), "cat", path).stdout)

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()
        self.procs = []

    def down(self):
        self.kill_all()
        if self.delay_proc is not None:
            if self.delay_proc.poll() is None:
                self.delay_proc.terminate()
                try:
                    self.delay_proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.delay_proc.kill()
                    self.delay_proc.wait()
            self.delay_proc = None
        cleanup_leftovers()

    def delay_line_alive(self):
        return self.delay_proc is None or self.delay_proc.poll() is None
