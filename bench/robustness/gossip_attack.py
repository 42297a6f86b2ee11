#!/usr/bin/python3
"""One outsized gossip message into a live `tern run`: the final accuracy with and without it.

For each scale, a fresh `tern run` (4 workers, the static ring, plaintext on 127.0.0.1) is
started; once its first evaluation after step 0 is written, worker 1's model of that step is read from its
Trainer service (loopback) and `scale` x that model is pushed into worker 0 as worker 1's message
of a round a little ahead of worker 0 (with --algorithm=choco: a q of `scale` x the recent q's
norm, which the norm guard's refusal of a bigger one names), as a faulty or malicious neighbour would send it. The
first round that takes it gets it, and the push stops: one message accepted. The run then goes on
to the end; its last line (done / run failed) and final accuracy are printed, with the clean
run's, so the difference is the message's cost.

Usage (docs/robustness.md):
  /usr/bin/python3 bench/robustness/gossip_attack.py [--tern ./build/cli/tern] \
      [--scales 5,9,20] [--repeats 2] [-- extra tern run flags, e.g. --gossip_clip=0]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tern", default=os.path.join(ROOT, "build", "cli", "tern"))
    p.add_argument("--scales", default="5,9,20", help="comma-separated multiples of the model")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--out", default="", help="folder for the runs (default: a temporary one)")
    p.add_argument("extra", nargs="*", help="more tern run flags (after --)")
    return p.parse_args()


def import_stubs(tern):
    build = os.path.dirname(os.path.dirname(os.path.abspath(tern)))
    sys.path.insert(0, os.path.join(build, "clients", "python"))
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))


def wait_for(predicate, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError("timed out waiting for " + what)


def evaluations(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def port(run_dir, i):
    try:
        with open(os.path.join(run_dir, "worker-%d.port" % i)) as f:
            text = f.read().strip()
            return int(text) if text else 0
    except FileNotFoundError:
        return 0


def inject(run_dir, scale, run_id, choco):
    """Pushes scale x worker 1's model (CHOCO: scale x the recent q) into worker 0 as worker 1;
    returns the round taken (None: refused by the norm guard) and the model's norm."""
    import grpc
    import numpy as np
    from tern.v1 import tensor_pb2, worker_pb2, worker_pb2_grpc
    from tern.wire import assemble, chunk_bundle, decode_dense, make_bundle

    rows = wait_for(lambda: [r for r in evaluations(run_dir) if int(r.get("step", 0)) > 0],
                    120, "the first evaluation after step 0")
    step = int(rows[0]["step"])
    w0 = worker_pb2_grpc.TrainerStub(grpc.insecure_channel("127.0.0.1:%d" % port(run_dir, 0)))
    w1 = worker_pb2_grpc.TrainerStub(grpc.insecure_channel("127.0.0.1:%d" % port(run_dir, 1)))
    gossip0 = worker_pb2_grpc.GossipStub(grpc.insecure_channel("127.0.0.1:%d" % port(run_dir, 0)))
    replies = list(w1.Snapshot(worker_pb2.SnapshotRequest(round=step), timeout=30))
    model = assemble(r.chunk for r in replies)
    flat = np.concatenate([decode_dense(t.tensor).ravel() for t in model.tensors])
    part, forged = "x", (scale * flat).astype(np.float32)
    if choco:
        # CHOCO sends q, a compressed difference far smaller than the model. The guard's refusal
        # of a model-sized q names the recent median of q's norms; the forged q is `scale` x
        # that, along the model.
        median = None
        for ahead in range(2, 30):
            now = w0.Stats(worker_pb2.StatsRequest(), timeout=10).steps
            probe = make_bundle([("q", flat)], codec="fp16", round_=now + ahead)
            probe.run_id, probe.sender = run_id, "1"
            try:
                gossip0.Push(iter(chunk_bundle(probe)), timeout=30)
                raise RuntimeError("a model-sized q was taken: is the norm guard off?")
            except grpc.RpcError as e:
                m = re.search(r"recent median ([0-9.e+-]+)", e.details() or "")
                if m:
                    median = float(m.group(1))
                    break
        if median is None:
            raise RuntimeError("the guard named no median")
        part = "q"
        forged = (scale * median * flat / np.linalg.norm(flat)).astype(np.float32)
    for ahead in range(2, 30):
        now = w0.Stats(worker_pb2.StatsRequest(), timeout=10).steps
        bundle = make_bundle([(part, forged)], codec="fp16", round_=now + ahead)
        bundle.run_id = run_id
        bundle.sender = "1"
        try:
            gossip0.Push(iter(chunk_bundle(bundle)), timeout=30)
            return now + ahead, float(np.linalg.norm(flat))
        except grpc.RpcError as e:
            if "norm_guard" in (e.details() or ""):
                return None, float(np.linalg.norm(flat))  # refused whole: nothing to clip
            last = e
    raise RuntimeError("no round took the message: %s" % last)


def run(a, name, scale, out):
    run_dir = os.path.join(out, name)
    args = [a.tern, "run", "--workers=%d" % a.workers, "--topology=ring", "--log_level=warn",
            "--out=" + run_dir] + a.extra
    with open(run_dir + ".log", "w") as log:
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        taken = None
        try:
            if scale > 0:
                taken = inject(run_dir, scale, "tern", "--algorithm=choco" in a.extra)
        finally:
            p.wait(timeout=600)
    with open(run_dir + ".log") as f:
        lines = [l for l in f.read().splitlines() if re.match(r"^(done|run failed)", l)]
    last = lines[-1] if lines else "(no verdict)"
    rows = evaluations(run_dir)
    acc = 100 * float(rows[-1]["test_acc"]) if rows else float("nan")
    clipped = rows[-1].get("contributions_clipped", 0) if rows else 0
    return acc, p.returncode, last, taken, clipped


def main():
    a = parse_args()
    import_stubs(a.tern)
    out = a.out or tempfile.mkdtemp(prefix="tern-gossip-attack-")
    os.makedirs(out, exist_ok=True)
    print("tern run --workers=%d --topology=ring %s; runs in %s" % (a.workers, " ".join(a.extra),
                                                                    out))
    print("| message | repeat | final accuracy | exit | clipped | round taken | verdict |")
    print("|---|---|---|---|---|---|---|")
    for scale in [0.0] + [float(s) for s in a.scales.split(",")]:
        for rep in range(a.repeats):
            name = "clean-%d" % rep if scale == 0 else "x%g-%d" % (scale, rep)
            acc, rc, last, taken, clipped = run(a, name, scale, out)
            thing = "the recent q" if "--algorithm=choco" in a.extra else "the model"
            what = "none" if scale == 0 else "%g x %s" % (scale, thing)
            if taken is None:
                round_ = "-"
            elif taken[0] is None:
                round_ = "refused by the norm guard"
            else:
                round_ = "%d (model norm %.1f)" % taken
            print("| %s | %d | %.2f %% | %d | %s | %s | %s |" % (what, rep, acc, rc, clipped, round_,
                                                              last[:90]), flush=True)


if __name__ == "__main__":
    main()
