#!/usr/bin/env python3
"""Edge aggregators against a flat federated run over emulated sites (docs/results.md, issue 42).

Two sites of 8 built-in clients each and the server in a third network namespace
(bench/race/netns.py): each site's link 10 Mbit/s up and down, the server's 1 Gbit/s, every
packet between namespaces held RTT / 2 (--rtt, default 40 ms) by tern-delay-line, and traffic
inside a site (its loopback) shaped to 1 Gbit/s, the site's LAN.
  flat   every client trains with the server, across its site's link;
  edges  each site's clients train with an edge aggregator on the site (tern server --parent,
         tern run --edges=2), which is one client of the server (the parent).
Both run FedAvg with every client every round, --rounds rounds (one edge round a parent round),
the same data, seed and update codec (--codec, the uplinks' in the edge row; the edges' clients
send theirs uncompressed over the LAN). Each row reports its final test accuracy (the mean of the
last 5 evaluations: one evaluation swings by a few tenths), wall time, the updates the server
received, and the bytes the two sites' links sent and received (their interfaces' counters, so
every byte: updates, models, HTTP/2 and TCP), and the flat row's over the edge row's. Rows run in
turn, --repeats times. Needs root (namespaces, tc).

  sudo /usr/bin/python3 bench/edges/race.py [--tern ./build/cli/tern] [--rounds 30] [--rtt 40]
                                            [--codec none] [--flags=--error_feedback]
                                            [--repeats 1] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "race"))
import netns  # noqa: E402

ROWS = [("flat", []), ("edges", ["--edges=2"])]
SITES = 2
CLIENTS = 16


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tern", default=os.path.join(ROOT, "build", "cli", "tern"))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--rtt", type=float, default=40, help="round trip between namespaces, ms")
    p.add_argument("--site_rate", default="10mbit", help="each site's link, both ways")
    p.add_argument("--server_rate", default="1gbit")
    p.add_argument("--lan", default="1gbit", help="inside a site")
    p.add_argument("--codec", default="none", help="--update_codec (the uplinks' with edges)")
    p.add_argument("--flags", default="", help="more tern run flags for both rows, e.g. "
                   "--flags=--error_feedback")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default="")
    return p.parse_args()


def run_row(a, net, name, extra, out):
    d = os.path.join(out, name)
    sites = range(1, SITES + 1)
    cmd = ["ip", "netns", "exec", net.ns(0), os.path.abspath(a.tern), "run", "--mode=federated",
           f"--clients={CLIENTS}", f"--clients_per_process={CLIENTS // SITES}",
           f"--clients_per_round={CLIENTS}", f"--rounds={a.rounds}",
           f"--site_netns={','.join(net.ns(i) for i in sites)}",
           f"--site_hosts={','.join(net.addr(i) for i in sites)}",
           f"--server_host={net.addr(0)}", f"--update_codec={a.codec}", "--log_level=warn",
           f"--out={d}", *a.flags.split(), *extra]
    os.makedirs(out, exist_ok=True)
    tx0 = [net.tx_bytes(i) for i in sites]
    rx0 = [net.rx_bytes(i) for i in sites]
    with open(d + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    tx = sum(net.tx_bytes(i) for i in sites) - sum(tx0)
    rx = sum(net.rx_bytes(i) for i in sites) - sum(rx0)
    metrics = os.path.join(d, "metrics.jsonl")
    if rc != 0 or not os.path.exists(metrics):
        sys.exit(f"{name}: exit code {rc}; see {d}.log and {d}/*.log")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    last = rows[-1]
    accs = [r["test_acc"] for r in rows[-5:]]
    return {"acc": 100 * sum(accs) / len(accs), "wall_s": last["wall_s"],
            "server_updates": int(last["updates_accepted"]),
            "server_payload_mb_up": last["payload_mb_up"],
            "sites_tx_mb": tx / 1e6, "sites_rx_mb": rx / 1e6,
            "edge_mb_up": last.get("edge_mb_up", 0.0)}


def main():
    a = parse()
    out = a.out or tempfile.mkdtemp(prefix="tern-edges-")
    os.makedirs(out, exist_ok=True)
    delay = netns.find_delay_line(a.tern) if a.rtt > 0 else None
    results = []
    with netns.Sites(SITES + 1, a.site_rate, rtt_ms=a.rtt, delay_line=delay,
                     site_rates={0: (a.server_rate, a.server_rate)}, lan=a.lan) as net:
        for rep in range(a.repeats):
            res = {}
            for name, extra in ROWS:
                res[name] = run_row(a, net, name, extra, os.path.join(out, f"r{rep}"))
                r = res[name]
                print(f"repeat {rep} {name:6s}: acc {r['acc']:.2f}% in {r['wall_s']:.0f} s; "
                      f"server got {r['server_updates']} updates ({r['server_payload_mb_up']:.1f} "
                      f"MB); sites' links sent {r['sites_tx_mb']:.1f} MB, received "
                      f"{r['sites_rx_mb']:.1f} MB; edges' LAN {r['edge_mb_up']:.1f} MB up",
                      flush=True)
            f, e = res["flat"], res["edges"]
            ratios = {"accuracy_pt": e["acc"] - f["acc"],
                      "updates": f["server_updates"] / max(1, e["server_updates"]),
                      "uplink_bytes": f["sites_tx_mb"] / max(1e-9, e["sites_tx_mb"]),
                      "downlink_bytes": f["sites_rx_mb"] / max(1e-9, e["sites_rx_mb"]),
                      "time": f["wall_s"] / max(1e-9, e["wall_s"])}
            print(f"repeat {rep}: edges - flat accuracy {ratios['accuracy_pt']:+.2f} pt; server "
                  f"updates {ratios['updates']:.2f}x fewer; sites' links sent "
                  f"{ratios['uplink_bytes']:.2f}x fewer bytes, received "
                  f"{ratios['downlink_bytes']:.2f}x fewer; {ratios['time']:.1f}x sooner", flush=True)
            results.append({"rows": res, "ratios": ratios})
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"args": vars(a), "repeats": results}, f, indent=1)
    print(f"results: {out}/results.json")


if __name__ == "__main__":
    main()
