#!/usr/bin/python3
"""ctest: two real `tern worker --trainer=external` daemons on mutual TLS, each driven by a
PyTorch trainer through the Python client, one over gRPC with a bearer token and one through the
worker's shared memory with a client certificate. Exits 77 (skipped) when Debian's torch/grpcio
or the dataset is missing."""

import os
import subprocess
import sys
import tempfile

import test_support

test_support.require_torch_and_data()

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import train_fashion_mnist as tfm  # noqa: E402
from tern.v1 import worker_pb2  # noqa: E402
from tern.trainer import TernTrainer  # noqa: E402

TERN = sys.argv[1]
STEPS = 150


def main():
    d = tempfile.mkdtemp(prefix="tern-py-")
    certs = d + "/certs"
    subprocess.run([TERN, "certs", "--out=" + certs, "--names=worker-0,worker-1,trainer-1"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([TERN, "tokens", "--out=" + certs, "--names=trainer-0"], check=True,
                   stdout=subprocess.DEVNULL)
    tls = [{"tls_ca": certs + "/ca.crt", "token_file": certs + "/trainer-0.token"},
           {"tls_ca": certs + "/ca.crt", "tls_cert": certs + "/trainer-1.crt",
            "tls_key": certs + "/trainer-1.key"}]
    procs = []
    for i in range(2):
        procs.append(subprocess.Popen(
            [TERN, "worker", "--trainer=external", "--id=%d" % i, "--workers=2",
             "--algorithm=dpsgd", "--codec=none", "--round_timeout=60",
             "--port_file=%s/%d.port" % (d, i), "--peers_file=%s/peers.txt" % d,
             "--tls_cert=%s/worker-%d.crt" % (certs, i), "--tls_key=%s/worker-%d.key" % (certs, i),
             "--tls_ca=%s/ca.crt" % certs, "--tokens=%s/tokens" % certs,
             "--peer_names=worker-*"],
            stdout=open("%s/worker-%d.log" % (d, i), "w"), stderr=subprocess.STDOUT))
    ports = [test_support.wait_for_port("%s/%d.port" % (d, i)) for i in range(2)]
    with open(d + "/peers.tmp", "w") as f:
        f.write("".join("127.0.0.1:%d\n" % p for p in ports))
    os.rename(d + "/peers.tmp", d + "/peers.txt")

    errors = []
    try:
        # Trainer 1 steps through the worker's shared memory, trainer 0 through gRPC.
        results = test_support.run_in_threads(
            lambda i: tfm.train("127.0.0.1:%d" % ports[i], i, 2, STEPS,
                                log=lambda s: print("[trainer %d] %s" % (i, s)),
                                shared=i == 1, tls=tls[i]), 2)
        # A trainer without credentials is refused with the reason.
        try:
            TernTrainer("127.0.0.1:%d" % ports[0], tls={"tls_ca": certs + "/ca.crt"}).stub.Stats(
                worker_pb2.StatsRequest(), timeout=10)
            errors.append("a trainer without credentials got in")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAUTHENTICATED or "no credentials" not in e.details():
                errors.append("no credentials: %s %s" % (e.code(), e.details()))
    finally:
        codes = test_support.stop_workers(procs)
    assert not errors, errors
    assert codes == [0, 0], "workers exited with %s" % codes

    (l0, m0, acc0), (l1, m1, acc1) = results
    # Learning happened through the worker: the loss fell, and the model is good.
    assert np.mean(l0[-30:]) < 0.7 * np.mean(l0[:30]), (np.mean(l0[:30]), np.mean(l0[-30:]))
    assert acc0 > 0.65, acc0
    # D-PSGD on two workers with weights 1/2 gives both the same average every round, so the two
    # PyTorch models are identical: the gossip really ran between the daemons, and the shared
    # memory path gave trainer 1 what the gRPC path gave trainer 0.
    diff = max((a - b).abs().max().item() for a, b in zip(m0.parameters(), m1.parameters()))
    assert diff < 1e-5, diff
    print("OK: test accuracy %.2f%% / %.2f%%, max parameter difference %.2g" %
          (100 * acc0, 100 * acc1, diff))


if __name__ == "__main__":
    main()
