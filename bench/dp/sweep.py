#!/usr/bin/env python3
"""DP-FedAvg's accuracy against its privacy (docs/results.md, issue 42).

1,000 built-in clients on Fashion-MNIST (iid, 60 examples each), 100 sampled a round (q = 0.1),
--rounds rounds of FedAvg, each update clipped to --clip; for each noise multiplier z in --noises
the run's final test accuracy (the mean of its last 5 evaluations) and the epsilon its server's
RDP accountant reports at --delta after its last round, beside the same run without DP (the
anchor: no clipping, no noise, examples-weighted, everything else alike) and with clipping alone
(z = 0: what the clip costs). With --adaptive_from S0,...: for each start S0, a run clipped to
S0 throughout and one whose clip adapts from S0 towards the --quantile of the update norms
(Andrew et al. 2021), both at z = --adaptive_noise, with the clip the last round used. With
--secagg, each z's row again under secure aggregation, the noise then added by the clients
(distributed DP, --secagg_range = the clip). Rows run in turn on one machine.

  bench/dp/sweep.py [--tern ./build/cli/tern] [--model softmax] [--clip 0.5] [--noises 0.5,1,2]
                    [--rounds 50] [--delta 1e-5] [--adaptive_from 0.05,5] [--quantile 0.5]
                    [--adaptive_noise 1] [--secagg] [--out DIR]
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
    p.add_argument("--model", default="softmax")
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--noises", default="0.5,1,2")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--server_lr", type=float, default=1.0)
    p.add_argument("--adaptive_from", default="",
                   help="starting clips for the adaptive rows (none: no such rows)")
    p.add_argument("--quantile", type=float, default=0.5)
    p.add_argument("--adaptive_noise", type=float, default=1.0)
    p.add_argument("--only_adaptive", action="store_true",
                   help="skip the no-DP and fixed-clip sweep rows")
    p.add_argument("--secagg", action="store_true",
                   help="each z's row again with the clients' noise under secure aggregation")
    p.add_argument("--out", default="")
    return p.parse_args()


def run(a, out, name, extra):
    d = os.path.join(out, name)
    cmd = [a.tern, "run", "--mode=federated", "--clients=1000", "--clients_per_process=250",
           "--clients_per_round=100", f"--rounds={a.rounds}", f"--model={a.model}",
           f"--server_lr={a.server_lr}", "--log_level=warn", f"--out={d}", *extra]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"{name}: {' '.join(cmd)} failed; see {d}")
    with open(os.path.join(d, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    accs = [r["test_acc"] for r in rows[-5:]]
    return {"acc": 100 * sum(accs) / len(accs), "epsilon": rows[-1].get("dp_epsilon"),
            "wall_s": rows[-1]["wall_s"], "rounds": rows[-1]["round"],
            "clip": rows[-1].get("dp_clip")}


def main():
    a = parse()
    out = a.out or tempfile.mkdtemp(prefix="tern-dp-")
    os.makedirs(out, exist_ok=True)
    rows = []
    if not a.only_adaptive:
        rows.append(("no DP", []))
        rows.append((f"clip {a.clip:g}, z 0", [f"--dp_clip={a.clip}", "--dp_noise=0",
                                               f"--dp_delta={a.delta}"]))
        for z in a.noises.split(","):
            rows.append((f"clip {a.clip:g}, z {z}", [f"--dp_clip={a.clip}", f"--dp_noise={z}",
                                                   f"--dp_delta={a.delta}"]))
            if a.secagg:
                rows.append((f"secagg, clip {a.clip:g}, z {z}",
                             [f"--dp_clip={a.clip}", f"--dp_noise={z}", f"--dp_delta={a.delta}",
                              "--secagg", f"--secagg_range={a.clip}"]))
    for s0 in filter(None, a.adaptive_from.split(",")):
        z = f"{a.adaptive_noise:g}"
        common = [f"--dp_clip={s0}", f"--dp_noise={z}", f"--dp_delta={a.delta}"]
        rows.append((f"clip {s0}, z {z}", common))
        rows.append((f"adaptive {s0}, z {z}", common + [f"--dp_clip_quantile={a.quantile}"]))
    results = {}
    for name, extra in rows:
        r = run(a, out, name.replace(" ", "").replace(",", "-"), extra)
        results[name] = r
        e = r["epsilon"]  # protobuf's JSON writes an infinite one as the string "Infinity"
        eps = "-" if e is None else (e if isinstance(e, str) else f"{e:.3g}")
        clip = "" if r["clip"] is None else f"  last clip {r['clip']:.3g}"
        print(f"{name:20s} accuracy {r['acc']:.2f}%  epsilon {eps} at delta {a.delta:g}  "
              f"({r['rounds']} rounds, {r['wall_s']:.0f} s){clip}", flush=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"args": vars(a), "rows": results}, f, indent=1)
    print(f"results: {out}/results.json")


if __name__ == "__main__":
    main()
