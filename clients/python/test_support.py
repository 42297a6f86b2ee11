"""What the Python client tests share: skip (exit 77, ctest's SKIP_RETURN_CODE) on a machine
without Debian's torch / grpcio / protobuf or the Fashion-MNIST package, and wait for a
daemon's --port_file."""

import os
import sys
import time

DATA = "/usr/share/datasets/fashion-mnist"


def require_torch_and_data():
    try:
        import grpc  # noqa: F401
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP: %s (install python3-torch python3-grpcio python3-protobuf)" % e)
        sys.exit(77)
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print("SKIP: %s not installed (dataset-fashion-mnist)" % DATA)
        sys.exit(77)


def wait_for_port(path, seconds=30):
    """The port a daemon wrote to `path` (its --port_file)."""
    for _ in range(int(seconds / 0.05)):
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        time.sleep(0.05)
    raise TimeoutError("no port in %s after %ss" % (path, seconds))


def wait_for_port_open(address, seconds=30):
    """Waits until something listens on `address` ("host:port")."""
    import socket
    host, port = address.rsplit(":", 1)
    for _ in range(int(seconds / 0.05)):
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError("nothing listens on %s after %ss" % (address, seconds))


def start_workers(tern, workdir, n, flags):
    """Starts `n` `tern worker --trainer=external` daemons on 127.0.0.1 (port 0) that gossip with
    each other, with extra `flags`; returns (addresses, processes). stop_workers ends them."""
    import subprocess
    procs = []
    for i in range(n):
        procs.append(subprocess.Popen(
            [tern, "worker", "--trainer=external", "--id=%d" % i, "--workers=%d" % n,
             "--round_timeout=60", "--port_file=%s/%d.port" % (workdir, i),
             "--peers_file=%s/peers.txt" % workdir] + list(flags),
            stdout=open("%s/worker-%d.log" % (workdir, i), "w"), stderr=subprocess.STDOUT))
    ports = [wait_for_port("%s/%d.port" % (workdir, i)) for i in range(n)]
    with open(workdir + "/peers.tmp", "w") as f:
        f.write("".join("127.0.0.1:%d\n" % p for p in ports))
    os.rename(workdir + "/peers.tmp", workdir + "/peers.txt")
    return ["127.0.0.1:%d" % p for p in ports], procs


def stop_workers(procs):
    """SIGTERM, then the exit codes (0 for a clean stop)."""
    import signal
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    return [p.wait(timeout=30) for p in procs]


def run_in_threads(fn, n):
    """fn(0) ... fn(n - 1), each on its own thread; their results in order once all are done,
    or the first exception any of them raised (with its rank)."""
    import threading
    results, errors = [None] * n, []

    def one(rank):
        try:
            results[rank] = fn(rank)
        except Exception as e:  # noqa: BLE001 (raised below)
            errors.append((rank, e))

    # Daemon threads, and the first failure raised at once: the others may be waiting on a peer
    # the failed one was (a step blocks up to its timeout), and the caller's cleanup (stopping
    # the workers) is what ends their wait.
    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and not errors:
        for t in threads:
            t.join(timeout=0.1)
    if errors:
        rank, e = errors[0]
        raise RuntimeError("thread %d of %d failed: %r" % (rank, n, e)) from e
    return results
