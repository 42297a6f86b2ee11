#!/usr/bin/python3
"""Resident memory of `tern server` under stalled Push streams, against its stream budget.

Starts `tern server` (plaintext, 127.0.0.1) and gives it an initial model of --params fp32
values, so its default budget is 16 updates (--max_buffered_mb=0). Then --streams clients each
open Aggregator.Push, send the first 1 MiB chunk of a whole update and stop. The server's
resident memory (VmRSS) is printed at rest with the model, with the streams parked, and after the
server cancelled them as idle (--stream_idle_s) and they were all refused or cancelled; with the
budget, the streams refused (RESOURCE_EXHAUSTED) and the bytes the open ones hold.

Usage (docs/robustness.md):
  /usr/bin/python3 bench/robustness/stalled_streams.py [--tern ./build/cli/tern] \
      [--params 4194304] [--streams 320] [--repeats 2]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tern", default=os.path.join(ROOT, "build", "cli", "tern"))
    p.add_argument("--params", type=int, default=4 << 20, help="model size in fp32 values")
    p.add_argument("--streams", type=int, default=320)
    p.add_argument("--repeats", type=int, default=2, help="waves of stalled streams")
    p.add_argument("--idle_s", type=int, default=5, help="the server's --stream_idle_s")
    return p.parse_args()


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main():
    a = parse_args()
    build = os.path.dirname(os.path.dirname(os.path.abspath(a.tern)))
    # The stubs generated beside --tern, else the source tree's build (an old binary to compare).
    sys.path.insert(0, os.path.join(ROOT, "build", "clients", "python"))
    sys.path.insert(0, os.path.join(build, "clients", "python"))
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
    import grpc
    import numpy as np
    from tern.v1 import server_pb2, server_pb2_grpc
    from tern.wire import chunk_bundle, make_bundle

    out = tempfile.mkdtemp(prefix="tern-stalled-")
    port_file = os.path.join(out, "server.port")
    server = subprocess.Popen(
        [a.tern, "server", "--plaintext", "--listen=127.0.0.1:0", "--port_file=" + port_file,
         "--min_clients=1", "--clients_per_round=100000", "--round_deadline_s=3600",
         "--client_timeout_s=3600", "--stream_idle_s=%d" % a.idle_s, "--log_level=warn"],
        stdout=open(os.path.join(out, "server.log"), "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not (os.path.exists(port_file) and
                                              open(port_file).read().strip()):
            time.sleep(0.05)
        address = "127.0.0.1:" + open(port_file).read().strip()
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 64 << 20)])
        stub = server_pb2_grpc.AggregatorStub(channel)
        first = stub.Join(server_pb2.JoinRequest(run_id="tern", name="init", num_samples=1,
                                                 client_id=-1), timeout=30)
        model = make_bundle([("w", np.zeros(a.params, dtype=np.float32))])
        chunks = chunk_bundle(model)
        stub.InitModel(iter([server_pb2.InitModelRequest(
            client_id=first.client_id if i == 0 else 0, chunk=c) for i, c in enumerate(chunks)]),
            timeout=60)
        time.sleep(1)
        print("model: %d values (%.0f MiB an update); budget 16 updates = %.0f MiB"
              % (a.params, a.params * 4 / 2**20, 16 * a.params * 4 / 2**20))
        print("| wave | server RSS at rest | with %d streams parked | refused | after idle cancel |"
              % a.streams)
        print("|---|---|---|---|---|")
        update = make_bundle([("w", np.ones(a.params, dtype=np.float32))], round_=1)
        update.run_id = "tern"
        first_chunk = chunk_bundle(update)[0]
        for wave in range(a.repeats):
            rest = rss_mib(server.pid)
            ids = [stub.Join(server_pb2.JoinRequest(run_id="tern", name="s%d-%d" % (wave, i),
                                                    num_samples=1, client_id=-1),
                             timeout=30).client_id for i in range(a.streams)]
            release = threading.Event()
            results = []

            def requests(cid):
                yield server_pb2.UpdateRequest(
                    info=server_pb2.UpdateInfo(client_id=cid, round=1, weight=1),
                    chunk=first_chunk)
                release.wait()  # parked: the rest of the update never comes

            futures = [stub.Push.future(requests(cid), timeout=600) for cid in ids]
            time.sleep(3)
            parked = rss_mib(server.pid)
            refused = sum(1 for f in futures if f.done() and f.code() ==
                          grpc.StatusCode.RESOURCE_EXHAUSTED)
            # The server cancels the silent streams after --stream_idle_s.
            for f in futures:
                try:
                    f.result(timeout=a.idle_s + 30)
                except grpc.RpcError as e:
                    results.append(e.code())
            release.set()
            time.sleep(1)
            after = rss_mib(server.pid)
            print("| %d | %.1f MiB | %.1f MiB | %d | %.1f MiB |" % (wave + 1, rest, parked, refused,
                                                                     after), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
