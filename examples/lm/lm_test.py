"""pytest: the language-model example (examples/lm) trains as a user would start it: alone, and
as two sites through two tern workers on 127.0.0.1 (the slow-link configuration). A few dozen
steps: it finishes and the validation loss falls well below a random model's 8 bits per byte;
and as two DiLoCo sites through a tern aggregator (tern.optim.OuterOptimizer).
Run by ctest (TERN_BIN names the tern binary)."""

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("grpc")

HERE = os.path.dirname(os.path.abspath(__file__))
TERN = os.environ.get("TERN_BIN", "")
if not TERN or not os.path.isdir("/usr/share/doc/python3.11/html/_sources"):
    pytest.skip("needs TERN_BIN and python3.11-doc", allow_module_level=True)

STEPS = ["--steps=40", "--eval_every=40", "--eval_windows=16", "--lr=3e-3"]


def result(out):
    return json.loads(out.split("RESULT ", 1)[1])


def wait_for_port(path, proc):
    for _ in range(600):
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        assert proc.poll() is None, "the worker exited"
        time.sleep(0.05)
    raise TimeoutError(path)


def test_the_model_trains_alone():
    out = subprocess.run([sys.executable, os.path.join(HERE, "train.py")] + STEPS,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    r = result(out.stdout)
    assert r["first_bpb"] > 7.5, r
    assert r["bpb"] < 5.5, r


def test_two_sites_train_it_through_tern_workers(tmp_path):
    workers = []
    for i in range(2):
        workers.append(subprocess.Popen(
            [TERN, "worker", "--trainer=external", "--momentum=0", f"--id={i}", "--workers=2",
             "--algorithm=choco", "--codec=stc:ratio=0.015", "--consensus_step=0.1",
             f"--port_file={tmp_path}/w{i}.port", f"--peers_file={tmp_path}/peers.txt"],
            stdout=open(f"{tmp_path}/worker-{i}.log", "w"), stderr=subprocess.STDOUT))
    try:
        ports = [wait_for_port(f"{tmp_path}/w{i}.port", w) for i, w in enumerate(workers)]
        with open(f"{tmp_path}/peers.tmp", "w") as f:
            f.write("".join(f"127.0.0.1:{p}\n" for p in ports))
        os.rename(f"{tmp_path}/peers.tmp", f"{tmp_path}/peers.txt")
        ranks = [subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"),
                                   f"--worker=127.0.0.1:{ports[i]}", f"--rank={i}"] + STEPS,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(2)]
        outs = [r.communicate(timeout=300)[0] for r in ranks]
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    for r, out in zip(ranks, outs):
        assert r.returncode == 0, out[-3000:]
        res = result(out)
        assert res["bpb"] < 5.5, res
        assert res["last_loss"] < 0.8 * res["first_loss"], res


def test_two_sites_train_it_as_diloco_through_an_aggregator(tmp_path):
    server = subprocess.Popen(
        [TERN, "server", "--listen=127.0.0.1:0", f"--port_file={tmp_path}/server.port",
         "--mode=local-sgd", "--local_epochs=0", "--local_steps=10", "--rounds=4",
         "--min_clients=2", "--outer=nesterov:lr=0.7,momentum=0.9", "--linger_s=60"],
        stdout=open(f"{tmp_path}/server.log", "w"), stderr=subprocess.STDOUT)
    try:
        port = wait_for_port(f"{tmp_path}/server.port", server)
        ranks = [subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"),
                                   f"--server=127.0.0.1:{port}", f"--rank={i}"] + STEPS,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(2)]
        outs = [r.communicate(timeout=300)[0] for r in ranks]
    finally:
        server.terminate()
        server.wait(timeout=60)
    for r, out in zip(ranks, outs):
        assert r.returncode == 0, out[-3000:]
        res = result(out)
        assert res["bpb"] < 5.5, res
        assert res["last_loss"] < 0.8 * res["first_loss"], res
