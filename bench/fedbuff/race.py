#!/usr/bin/env python3
"""FedBuff against synchronous FedAvg with the same clients (docs/results.md, issue 42).

100 built-in clients whose speeds differ tenfold: client i of n waits 0.3 + 2.7 i/(n - 1) s after
its local epoch (--client_delay_s=0.3:3), in 4 processes. The anchor is synchronous FedAvg, every
sampled client awaited, 40 rounds, tuned over K (10 or all 100 clients a round) and its server
learning rate ({1, 1.5}, as FedBuff's is): the target is the best row's final test accuracy, its
time that row's wall time. Each FedBuff row (no rounds: every client may train at once, 10 updates a
server step, s(tau) = 1/sqrt(1 + tau)) reports when its global model first reaches the target,
and the ratio. Accuracy is the mean of the last --window (5) evaluations, the target included:
one evaluation swings by a point. Every row of one partition and repeat runs in turn on the
same machine.

  bench/fedbuff/race.py [--tern ./build/cli/tern] [--repeats 1] [--partitions iid,dirichlet:alpha=0.5]
                        [--out DIR [--reuse]] [--window 5]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CLIENTS = ["--clients=100", "--clients_per_process=25", "--client_delay_s=0.3:3"]
ANCHORS = [(f"fedavg K {k} lr {lr}", ["--mode=federated", f"--clients_per_round={k}", "--rounds=40",
                                        f"--server_lr={lr}"])
           for k in (10, 100) for lr in (1, 1.5)]
ROWS = [("fedbuff lr 1", ["--mode=fedbuff", "--concurrency=0", "--buffer=10", "--rounds=300"]),
        ("fedbuff lr 1.5", ["--mode=fedbuff", "--concurrency=0", "--buffer=10", "--rounds=300",
                            "--server_lr=1.5"]),
        ("fedbuff C 40 lr 1", ["--mode=fedbuff", "--concurrency=40", "--buffer=10",
                               "--rounds=200"])]


def run(tern, out, name, args, reuse):
    """Runs one `tern run` (or, with reuse, takes the one already in its folder); returns its
    metrics rows."""
    d = os.path.join(out, name.replace(" ", "-").replace(".", ""))
    metrics = os.path.join(d, "metrics.jsonl")
    if not (reuse and os.path.exists(metrics)):
        cmd = [tern, "run", *CLIENTS, *args, f"--out={d}", "--log_level=warn"]
        # A run that ends far below its best is "failed" (collapsed): its rows still count.
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            print(f"(exit code not 0: {' '.join(cmd)}; see {d})", file=sys.stderr)
    if not os.path.exists(metrics):
        sys.exit(f"no metrics in {d}")
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]


def smoothed(rows, window):
    """(wall_s, round, mean test accuracy of the last `window` evaluations) for each row."""
    accs = [r["test_acc"] for r in rows]
    return [(r["wall_s"], r["round"], sum(accs[max(0, i - window + 1):i + 1]) /
             len(accs[max(0, i - window + 1):i + 1])) for i, r in enumerate(rows)]


def staleness(rows):
    """Mean, median and 90th percentile of the accepted updates' staleness (last row)."""
    hist = [int(v) for v in rows[-1].get("staleness", [])]
    total = sum(hist)
    if total == 0:
        return "-"
    mean = sum(t * n for t, n in enumerate(hist)) / total
    cum, p50, p90 = 0, None, None
    for t, n in enumerate(hist):
        cum += n
        if p50 is None and cum >= total / 2:
            p50 = t
        if p90 is None and cum >= 0.9 * total:
            p90 = t
    return f"mean {mean:.2f}, median {p50}, p90 {p90}, max {len(hist) - 1}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tern", default="./build/cli/tern")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--partitions", default="iid,dirichlet:alpha=0.5")
    p.add_argument("--out", default="")
    p.add_argument("--window", type=int, default=5,
                   help="accuracy is the mean of this many last evaluations (one is noisy)")
    p.add_argument("--reuse", action="store_true", help="take runs already in --out")
    a = p.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="tern-fedbuff-")
    os.makedirs(out, exist_ok=True)
    print("| partition | repeat | row | final acc (last 5) | wall s | reaches the anchor's target at | "
          "sooner | staleness |")
    print("|---|---|---|---|---|---|---|---|")
    for part in a.partitions.split(","):
        for rep in range(a.repeats):
            tag = f"{part.split(':')[0]}-{rep}"
            anchors = [(n, run(a.tern, out, f"{tag} {n}", [f"--partition={part}", *args],
                               a.reuse)) for n, args in ANCHORS]
            name, best = max(anchors, key=lambda x: smoothed(x[1], a.window)[-1][2])
            _, _, target = smoothed(best, a.window)[-1]
            t_anchor = best[-1]["wall_s"]
            for n, rows in anchors:
                mark = " (the target)" if n == name else ""
                print(f"| {part} | {rep} | {n}{mark} | "
                      f"{100 * smoothed(rows, a.window)[-1][2]:.2f} % | "
                      f"{rows[-1]['wall_s']:.1f} | — | — | — |")
            for n, args in ROWS:
                rows = run(a.tern, out, f"{tag} {n}", [f"--partition={part}", *args], a.reuse)
                curve = smoothed(rows, a.window)
                hit = next((c for c in curve if c[2] >= target), None)
                at = f"{hit[0]:.1f} s (version {hit[1]})" if hit else "never"
                ratio = f"{t_anchor / hit[0]:.2f}x" if hit else "—"
                print(f"| {part} | {rep} | {n} | {100 * curve[-1][2]:.2f} % | "
                      f"{rows[-1]['wall_s']:.1f} | {at} | {ratio} | {staleness(rows)} |")
            sys.stdout.flush()
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
