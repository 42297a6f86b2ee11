#!/usr/bin/env python3
"""Secure aggregation's cost and accuracy against plain FedAvg (docs/results.md, issue 42).

Cost: for each K in --clients (every client sampled every round), --cost_rounds rounds of the
built-in --model with K clients, plain FedAvg (the anchor: the same clients, codec none, the
examples-weighted mean) against --secagg at each --bits: the bytes up per round (the masked
updates, and the stages' own messages beside them) and the seconds per round (the mean round
length after the first). Accuracy: --acc_rounds rounds of 10 of 100 clients, plain against
--secagg at 32 and 20 bits, the final test accuracy (the mean of the last 5 evaluations). Rows
run in turn on one machine, --repeats times each; the table gives the range.

  bench/secagg/measure.py [--tern ./build/cli/tern] [--clients 100,1000] [--bits 32,20]
                          [--cost_rounds 6] [--acc_rounds 100] [--repeats 2] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tern", default=os.path.join(ROOT, "build", "cli", "tern"))
    p.add_argument("--model", default="", help="the built-in model (default: tern run's)")
    p.add_argument("--clients", default="100,1000")
    p.add_argument("--bits", default="32,20")
    p.add_argument("--range", type=float, default=0.5)
    p.add_argument("--neighbours", type=int, default=16)
    p.add_argument("--cost_rounds", type=int, default=6)
    p.add_argument("--acc_rounds", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip_cost", action="store_true")
    p.add_argument("--skip_acc", action="store_true")
    p.add_argument("--out", default="")
    return p.parse_args()


def run(a, d, args):
    cmd = [a.tern, "run", "--mode=federated", "--update_codec=none", "--log_level=warn",
           f"--out={d}", *args] + ([f"--model={a.model}"] if a.model else [])
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed; see {d}")
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def secure(a, bits):
    return ["--secagg", f"--secagg_bits={bits}", f"--secagg_range={a.range}",
            f"--secagg_neighbours={a.neighbours}"]


def span(xs, fmt):
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else (fmt.format(lo) + ".." +
                                                                     fmt.format(hi))


def main():
    a = parse()
    out = a.out or tempfile.mkdtemp(prefix="tern-secagg-")
    os.makedirs(out, exist_ok=True)
    results = {"cost": {}, "acc": {}}
    if not a.skip_cost:
        for k in [int(x) for x in a.clients.split(",")]:
            per = min(k, 250)
            base = [f"--clients={k}", f"--clients_per_process={per}", f"--clients_per_round={k}",
                    f"--rounds={a.cost_rounds}", "--round_deadline_s=600"]
            rows = [("plain", [])] + [(f"secagg b={b}", secure(a, b)) for b in a.bits.split(",")]
            for name, extra in rows:
                got = []
                for rep in range(a.repeats):
                    m = run(a, os.path.join(out, f"cost-{k}-{name.replace(' ', '')}-{rep}"),
                            base + extra)
                    n = len(m)
                    up = m[-1]["payload_mb_up"] / n
                    stages = m[-1].get("secagg_mb", 0) / n
                    closes = [r["closed_s"] for r in m]
                    per_round = (closes[-1] - closes[0]) / max(1, n - 1)
                    got.append({"up_mb": up, "stage_mb": stages, "s_per_round": per_round})
                results["cost"][f"{k} {name}"] = got
                print(f"K={k:5d} {name:14s} up {span([g['up_mb'] for g in got], '{:.2f}')} MB/round"
                      f" + stages {span([g['stage_mb'] for g in got], '{:.3f}')} MB/round, "
                      f"{span([g['s_per_round'] for g in got], '{:.2f}')} s/round", flush=True)
    if not a.skip_acc:
        base = ["--clients=100", "--clients_per_process=50", "--clients_per_round=10",
                f"--rounds={a.acc_rounds}"]
        rows = [("plain", [])] + [(f"secagg b={b}", secure(a, b)) for b in a.bits.split(",")]
        for name, extra in rows:
            accs = []
            for rep in range(a.repeats):
                m = run(a, os.path.join(out, f"acc-{name.replace(' ', '')}-{rep}"),
                        base + extra + [f"--seed={rep + 1}"])
                accs.append(100 * sum(r["test_acc"] for r in m[-5:]) / 5)
            results["acc"][name] = accs
            print(f"{a.acc_rounds} rounds, 10 of 100 clients, {name:14s} accuracy "
                  f"{span(accs, '{:.2f}')} %", flush=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"args": vars(a), "results": results}, f, indent=1)
    print(f"results: {out}/results.json")


if __name__ == "__main__":
    main()
