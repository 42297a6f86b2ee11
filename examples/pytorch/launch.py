#!/usr/bin/python3
"""Runs an example on this machine: the tern daemons it needs and --procs training processes,
then prints each process's result and a summary line (JSON).

    examples/pytorch/launch.py --mode=single                   # cnn.py, one process
    examples/pytorch/launch.py --mode=gossip --procs=4         # 4 workers + 4 cnn_gossip.py
    examples/pytorch/launch.py --mode=federated --procs=4      # tern server + 4 clients
    examples/pytorch/launch.py --mode=local-sgd --procs=4
    examples/pytorch/launch.py --mode=ps --procs=4

Every mode trains for --epochs passes over the training set in all (each process over its
shard), with the same batch per process. Needs the tern binary (--tern, default
build/cli/tern) and the tern package importable (installed, or PYTHONPATH as docs/python.md
says); run with /usr/bin/python3."""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_SIZE = 60000


def wait_for_port(path, proc, seconds=30):
    for _ in range(int(seconds / 0.05)):
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %d (see its log)" % (proc.args[:2], proc.returncode))
        time.sleep(0.05)
    raise TimeoutError("no port in %s after %ss" % (path, seconds))


def start(cmd, log):
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def daemons(a, d):
    """Starts what the mode needs; returns (processes, extra arguments per rank)."""
    if a.mode == "single":
        return [], [[]]
    if a.mode == "gossip":
        procs = [start([a.tern, "worker", "--trainer=external", "--id=%d" % i,
                        "--workers=%d" % a.procs, "--algorithm=dpsgd", "--codec=" + a.codec,
                        "--momentum=0", "--topology=" + a.topology,
                        "--port_file=%s/w%d.port" % (d, i),
                        "--peers_file=%s/peers.txt" % d], "%s/worker-%d.log" % (d, i))
                 for i in range(a.procs)]
        ports = [wait_for_port("%s/w%d.port" % (d, i), procs[i]) for i in range(a.procs)]
        with open(d + "/peers.tmp", "w") as f:
            f.write("".join("127.0.0.1:%d\n" % p for p in ports))
        os.rename(d + "/peers.tmp", d + "/peers.txt")
        return procs, [["--worker=127.0.0.1:%d" % p] for p in ports]
    steps = math.ceil(a.epochs * TRAIN_SIZE / a.procs / a.batch)  # per process
    local = {"federated": a.fed_local_steps, "local-sgd": a.local_steps, "ps": 1}[a.mode]
    cmd = [a.tern, "server", "--listen=127.0.0.1:0", "--port_file=%s/server.port" % d,
           "--mode=" + a.mode, "--min_clients=%d" % a.procs,
           "--clients_per_round=%d" % a.procs, "--rounds=%d" % math.ceil(steps / local),
           "--local_epochs=0", "--local_steps=%d" % local, "--batch=%d" % a.batch,
           "--linger_s=120"]
    if a.mode == "ps":
        cmd += ["--optimizer=adam", "--lr=%g" % a.lr]
    server = start(cmd + a.server_flag, d + "/server.log")
    port = wait_for_port(d + "/server.port", server)
    return [server], [["--server=127.0.0.1:%d" % port]] * a.procs


def server_traffic(args):
    """Aggregator modes: the run's bytes each way, encoded and as fp32 (the server's Status)."""
    address = [x.split("=", 1)[1] for x in args if x.startswith("--server=")]
    if not address:
        return {}
    from tern.federated import Aggregator, server_pb2
    st = Aggregator(address[0], timeout=10).stub.Status(server_pb2.StatusRequest(), timeout=10)
    return {"mb_up": round(st.payload_bytes_up / 1e6, 2),
            "mb_up_fp32": round(st.dense_bytes_up / 1e6, 2),
            "mb_down": round(st.payload_bytes_down / 1e6, 2),
            "mb_down_fp32": round(st.dense_bytes_down / 1e6, 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["single", "gossip", "federated", "local-sgd", "ps"],
                   required=True)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--codec", default="fp16", help="gossip: the workers' --codec")
    p.add_argument("--topology", default="ring", help="gossip: the workers' --topology")
    p.add_argument("--local_steps", type=int, default=8, help="local-sgd: steps between averages")
    p.add_argument("--fed_local_steps", type=int, default=50,
                   help="federated: local steps per round")
    p.add_argument("--server_flag", action="append", default=[],
                   help="aggregator modes: a flag for tern server, e.g. "
                   "--server_flag=--update_codec=topk:ratio=0.01 (repeat for more)")
    p.add_argument("--tern", default=os.path.join(HERE, "..", "..", "build", "cli", "tern"))
    p.add_argument("--dir", default=None, help="logs (default: a new temporary folder)")
    a = p.parse_args()
    if a.mode == "single":
        a.procs = 1
    d = a.dir or tempfile.mkdtemp(prefix="tern-example-%s-" % a.mode)
    os.makedirs(d, exist_ok=True)
    script = {"single": "cnn.py", "gossip": "cnn_gossip.py", "federated": "cnn_federated.py",
              "local-sgd": "cnn_federated.py", "ps": "cnn_ps.py"}[a.mode]
    t0 = time.time()
    services, extra = daemons(a, d)
    try:
        trainers = [start([sys.executable, os.path.join(HERE, script), "--epochs=%g" % a.epochs,
                           "--batch=%d" % a.batch, "--lr=%g" % a.lr, "--rank=%d" % r,
                           "--world=%d" % a.procs] + extra[r], "%s/trainer-%d.log" % (d, r))
                    for r in range(a.procs)]
        codes = [t.wait() for t in trainers]
        traffic = server_traffic(extra[0])
    finally:
        for s in services:
            s.send_signal(signal.SIGTERM)
        for s in services:
            s.wait(timeout=60)
    results = []
    for r in range(a.procs):
        lines = [l for l in open("%s/trainer-%d.log" % (d, r)) if l.startswith("RESULT ")]
        if codes[r] != 0 or not lines:
            sys.stderr.write(open("%s/trainer-%d.log" % (d, r)).read()[-3000:])
            sys.exit("trainer %d failed (exit %d); logs in %s" % (r, codes[r], d))
        results.append(json.loads(lines[-1][len("RESULT "):]))
        print("rank %d: %s" % (r, json.dumps(results[-1])))
    summary = {"mode": a.mode, "procs": a.procs, "epochs": a.epochs,
               "wall_s": round(time.time() - t0, 1),
               "accuracy": sum(x["accuracy"] for x in results) / len(results),
               "first_loss": results[0]["first_loss"], "last_loss": results[0]["last_loss"],
               "logs": d}
    summary.update(traffic)
    print("SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    main()
