#!/usr/bin/python3
"""How soon a worker that (re)joins a running run is back: the state from several peers at once
against all of it from one (issue 41; docs/benchmarks.md, "A joiner's recovery").

    sudo /usr/bin/python3 bench/race/join_bench.py --rate 100mbit --rtts 0,100 --sources 1,3

For each round trip it builds the race's sites (bench/race/netns.py: a namespace per worker,
every link shaped with tbf both ways, every packet between sites held rtt/2 by tern-delay-line),
starts a diloco run of --workers built-in workers, SIGKILLs the last one once it has done
--kill_at steps, and starts it again with --state_sources=S: it asks its peers where they are
and takes the group's state (θ and the outer momentum) in S slices from S peers at once. Per
trial it prints the state's size, the time the rejoin took (from its first call to the state in
hand and every peer told: the worker's "rejoined" line), the part of it on the wire, the time to
its first mixed step (the round log's first step with a peer's update in it), and the link's
time for those bytes at --rate (bytes * 8 / rate), with the ratios, and what its link brought it
in all by the rejoin (the state, and the run's own exchanges meanwhile). With --uplink, each
site sends slower than it receives (commodity links). Every setting runs in the same network,
one after the other, --repeats times, and the table gives each one's range.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import common  # noqa: E402
import netns  # noqa: E402

PORT = 7000
REJOINED = re.compile(
    r"^(\S+) I .*rejoined at step (\d+) with the state of workers ([\d,]+) \(([\d.]+) MB in "
    r"([\d.]+) s, ([\d.]+) s of it on the wire\)")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="100mbit", help="tbf rate of every link")
    p.add_argument("--uplink", default="",
                   help="each site's upload rate, when slower than --rate (its download)")
    p.add_argument("--rtts", default="0,100", help="comma-separated round trips, ms")
    p.add_argument("--sources", default="1,3", help="comma-separated --state_sources to compare")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--model", default="mlp:hidden=1024x1024")
    p.add_argument("--local_steps", type=int, default=50)
    p.add_argument("--codec", default="fp4", help="the exchange's codec (Streaming DiLoCo's)")
    p.add_argument("--kill_at", type=int, default=120, help="steps the last worker does first")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tern", default=os.path.join(ROOT, "build", "cli", "tern"))
    p.add_argument("--delay_line", default="")
    p.add_argument("--data", default=common.DATA)
    p.add_argument("--out", default="")
    p.add_argument("--timeout", type=float, default=180, help="seconds a trial may take")
    return p.parse_args()


def worker_cmd(a, i, rdir, tag, extra=()):
    peers = ",".join(f"10.77.0.{j + 1}:{PORT}" for j in range(a.workers))
    return [a.tern, "worker", f"--id={i}", f"--workers={a.workers}", f"--peers={peers}",
            f"--listen=10.77.0.{i + 1}:{PORT}", f"--model={a.model}", f"--data={a.data}",
            "--algorithm=diloco", f"--local_steps={a.local_steps}", f"--codec={a.codec}",
            "--batch=64",
            "--max_steps=1000000", "--epochs=1000", "--compute_threads=1", "--seed=1",
            "--round_timeout=5", "--plaintext", "--log_level=info",
            f"--round_log={rdir}/{tag}.steps.jsonl"] + list(extra)


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip().endswith("}")]
    except (OSError, ValueError):
        return []


def unix(stamp):
    """The log's local time stamp (2026-11-30T23:37:00.392) as Unix seconds."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def trial(a, net, rdir, sources):
    """One run, one kill, one rejoin with `sources`; returns the rejoin's figures or None."""
    os.makedirs(rdir, exist_ok=True)
    last = a.workers - 1
    procs = [net.popen(i, worker_cmd(a, i, rdir, str(i)), f"{rdir}/{i}.log")
             for i in range(a.workers)]
    deadline = time.time() + a.timeout
    try:
        while len(lines(f"{rdir}/{last}.steps.jsonl")) < a.kill_at:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                print(f"  the run did not get to step {a.kill_at}: see {rdir}", file=sys.stderr)
                return None
            time.sleep(0.1)
        procs[last].kill()
        procs[last].wait()
        time.sleep(1)
        log = f"{rdir}/again.log"
        started, rx = time.time(), net.rx_bytes(last)
        procs[last] = net.popen(last, worker_cmd(a, last, rdir, "again",
                                                 [f"--state_sources={sources}"]), log)
        got = None
        while time.time() < deadline:
            if got is None:
                with open(log) as f:
                    for line in f:
                        m = REJOINED.match(line)
                        if m:
                            got = m
                            rx = net.rx_bytes(last) - rx
            if got is not None:
                mixed = [r for r in lines(f"{rdir}/again.steps.jsonl") if r.get("mixed", 0) > 0]
                if mixed:
                    break
            if procs[last].poll() is not None:
                print(f"  the restarted worker ended: see {log}", file=sys.stderr)
                return None
            time.sleep(0.1)
        else:
            print(f"  no rejoin or no mixed step in time: see {log}", file=sys.stderr)
            return None
        rejoined = unix(got.group(1))
        took = float(got.group(5))
        first_call = rejoined - took
        mb = float(got.group(4))
        link = mb * 8e6 / netns.rate_bits(a.rate)
        return {"sources": sources, "from": got.group(3), "mb": mb, "rejoin_s": took,
                "wire_s": float(got.group(6)), "link_s": link,
                "first_mixed_s": mixed[0]["end_unix_s"] - first_call,
                "start_to_call_s": first_call - started,
                # Everything its link brought it from its start to the rejoin: the state, and
                # the run's own exchanges, which go on meanwhile.
                "rx_mb": rx / 1e6,
                # Peers' messages it waited for in vain by its first mixed step: pushes of the
                # rounds under way that the transfer crowded out (it could not mix those rounds
                # as its peers did).
                "missed": sum(1 for line in open(log)
                              if "no message from" in line and "dropped this round" in line)}
    finally:
        net.kill_all()


def span(xs):
    return f"{min(xs):.2f}" if min(xs) == max(xs) else f"{min(xs):.2f}–{max(xs):.2f}"


def main():
    a = parse_args()
    if a.kill_at <= a.local_steps:
        # Before the first exchange the group's state is everyone's start: no rejoin to time.
        raise SystemExit(f"--kill_at={a.kill_at}: past the first exchange (--local_steps="
                         f"{a.local_steps}) or the worker starts again from x0")
    netns.require_root()
    delay_line = a.delay_line or netns.find_delay_line(a.tern)
    out = a.out or os.path.join("/tmp", "tern-join-bench-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    settings = [int(s) for s in a.sources.split(",")]
    results = []
    for rtt in [float(r) for r in a.rtts.split(",")]:
        with netns.Sites(a.workers, a.rate, rtt_ms=rtt, delay_line=delay_line if rtt > 0 else None,
                         uplink=a.uplink or None) as net:
            for rep in range(a.repeats):
                for s in settings:  # in turn, so drift on this shared machine hits both
                    r = trial(a, net, os.path.join(out, f"rtt{rtt:g}-s{s}-{rep}"), s)
                    if r is None:
                        continue
                    r["rtt_ms"] = rtt
                    results.append(r)
                    print(f"rtt {rtt:g} ms, {s} source(s) (workers {r['from']}): "
                          f"{r['mb']:.1f} MB, rejoin {r['rejoin_s']:.2f} s (wire "
                          f"{r['wire_s']:.2f} s), first mixed step {r['first_mixed_s']:.2f} s; "
                          f"the link's time {r['link_s']:.2f} s; {r['rx_mb']:.1f} MB came in "
                          f"by the rejoin; {r['missed']} message(s) missed", flush=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    up = f" down, {a.uplink} up" if a.uplink else ""
    print(f"\n{a.workers} diloco workers ({a.model}, H {a.local_steps}, {a.codec}) at "
          f"{a.rate}{up}; ranges over {a.repeats} runs:")
    print("| RTT | sources | state | rejoin | on the wire | first mixed step | link time | "
          "rejoin / link | first mixed / link | MB in by the rejoin | messages missed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for rtt in sorted({r["rtt_ms"] for r in results}):
        for s in settings:
            rs = [r for r in results if r["rtt_ms"] == rtt and r["sources"] == s]
            if not rs:
                continue
            print(f"| {rtt:g} ms | {s} | {span([r['mb'] for r in rs])} MB | "
                  f"{span([r['rejoin_s'] for r in rs])} s | {span([r['wire_s'] for r in rs])} s | "
                  f"{span([r['first_mixed_s'] for r in rs])} s | "
                  f"{span([r['link_s'] for r in rs])} s | "
                  f"{span([r['rejoin_s'] / r['link_s'] for r in rs])} | "
                  f"{span([r['first_mixed_s'] / r['link_s'] for r in rs])} | "
                  f"{span([r['rx_mb'] for r in rs])} | {sum(r['missed'] for r in rs)} |")
    print(f"\nlogs and results.json under {out}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
