#!/usr/bin/python3
"""One training step of the MLP, tern's built-in model against PyTorch, in the same run.

Times forward + cross-entropy + backward of 784-H1-...-10 on a batch of random pixels with the
same threads on both sides, a few repeats each, interleaved, and prints the ratio
tern / torch (issue 16's target: <= 1.25).

    /usr/bin/python3 bench/model_step.py [--tern build/cli/tern] [--hidden 1024x1024]
        [--batch 64] [--threads 1,2] [--repeats 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import blas_kernels


def torch_ms_per_step(hidden, batch, threads, min_time):
    import torch
    torch.set_num_threads(threads)
    widths = [784] + hidden + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    x = torch.rand(batch, 784)
    y = torch.arange(batch) % 10
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        model.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()

    step()
    steps, start = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - start < min_time:
        step()
        steps += 1
    return (time.perf_counter() - start) * 1e3 / steps


def tern_ms_per_step(tern, hidden, batch, threads, min_time):
    out = subprocess.run(
        [tern, "bench", "model", f"--model=mlp:hidden={'x'.join(map(str, hidden))}",
         f"--batch={batch}", f"--compute_threads={threads}", f"--min_time={min_time}",
         "--log_level=warn"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["ms_per_step"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--tern", default=os.path.join(here, "..", "build", "cli", "tern"))
    p.add_argument("--hidden", default="1024x1024")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min_time", type=float, default=1.0)
    a = p.parse_args()
    hidden = [int(h) for h in a.hidden.split("x")]
    # Before torch loads OpenBLAS: the kernels the tern binary runs (blas_kernels.py).
    os.environ.update(blas_kernels.same_kernels_env(a.tern))
    print(f"MLP 784-{a.hidden.replace('x', '-')}-10, batch {a.batch}, {a.repeats} repeats "
          f"(interleaved), ms per step (forward + loss + backward), OpenBLAS kernels "
          f"{os.environ.get('OPENBLAS_CORETYPE', 'as detected')} on both sides")
    print(f"{'threads':>7} {'tern ms':>16} {'torch ms':>16} {'tern/torch':>16}")
    for threads in [int(t) for t in a.threads.split(",")]:
        ts, ps = [], []
        for _ in range(a.repeats):
            ts.append(tern_ms_per_step(a.tern, hidden, a.batch, threads, a.min_time))
            ps.append(torch_ms_per_step(hidden, a.batch, threads, a.min_time))
        ratios = sorted(t / q for t, q in zip(ts, ps))
        print(f"{threads:>7} {min(ts):7.2f}–{max(ts):<7.2f} {min(ps):7.2f}–{max(ps):<7.2f} "
              f"{ratios[0]:.2f}–{ratios[-1]:.2f} (median {statistics.median(ratios):.2f})")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
