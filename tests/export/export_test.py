#!/usr/bin/python3
"""ctest: models out of tern. `tern run` (gossip, then federated) keeps the model it reports on
in its run folder; `tern export` writes it as .npz and as a PyTorch state_dict; numpy.load and
torch.load read them, and the model they hold scores on the Fashion-MNIST test set exactly the
accuracy the run printed. An aggregator checkpoint and a worker's snapshots export too. Exits 77 (skipped) without Debian's torch or the dataset."""

import gzip
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: %s (install python3-torch)" % e)
    sys.exit(77)

DATA = "/usr/share/datasets/fashion-mnist"
if not os.path.exists(DATA + "/t10k-images-idx3-ubyte.gz"):
    print("SKIP: %s not installed (dataset-fashion-mnist)" % DATA)
    sys.exit(77)

TERN = sys.argv[1]


def test_set():
    with gzip.open(DATA + "/t10k-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(DATA + "/t10k-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    # The built-in models' input normalization (core/workload/dataset.cc).
    return (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530, y


class Mlp(torch.nn.Module):
    """The built-in MLP as PyTorch writes it: fc1..fcN, ReLU between."""

    def __init__(self, state):
        super().__init__()
        self.names = sorted({k.split(".")[0] for k in state}, key=lambda n: int(n[2:]))
        for n in self.names:
            out_features, in_features = state[n + ".weight"].shape
            setattr(self, n, torch.nn.Linear(in_features, out_features))

    def forward(self, x):
        for i, n in enumerate(self.names):
            x = getattr(self, n)(x)
            if i + 1 < len(self.names):
                x = torch.relu(x)
        return x


def run(args, out):
    p = subprocess.run([TERN] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, "%s: exit %d\n%s" % (args, p.returncode, p.stdout[-3000:])
    return p.stdout


def check(folder, reported, x, y):
    run(["export", "--from=" + folder, "--out=" + folder + "/model.pt"], folder)
    run(["export", "--from=" + folder, "--out=" + folder + "/model.npz"], folder)
    state = torch.load(folder + "/model.pt")
    net = Mlp(state)
    net.load_state_dict(state)  # names and shapes exactly torch.nn.Linear's
    with torch.no_grad():
        acc_torch = (net(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    arrays = np.load(folder + "/model.npz")
    h = x
    for i, n in enumerate(net.names):
        h = h @ arrays[n + ".weight"].T + arrays[n + ".bias"]
        if i + 1 < len(net.names):
            h = np.maximum(h, 0)
    acc_numpy = (h.argmax(1) == y).mean()
    print("%s: reported %.2f%%, torch %.2f%%, numpy %.2f%%" %
          (folder, reported, 100 * acc_torch, 100 * acc_numpy))
    assert abs(100 * acc_torch - reported) < 0.011, (acc_torch, reported)
    assert abs(100 * acc_numpy - reported) < 0.011, (acc_numpy, reported)


def main():
    d = tempfile.mkdtemp(prefix="tern-export-")
    x, y = test_set()
    said = run(["run", "--workers=2", "--epochs=1", "--evals_per_epoch=1", "--log_level=warn",
                "--out=%s/gossip" % d], d)
    check(d + "/gossip", float(re.search(r"done: test accuracy ([0-9.]+)%", said).group(1)), x, y)
    said = run(["run", "--mode=federated", "--clients=4", "--clients_per_round=4", "--rounds=3",
                "--log_level=warn", "--out=%s/fed" % d], d)
    check(d + "/fed", float(re.search(r"done: test accuracy ([0-9.]+)%", said).group(1)), x, y)
    # The aggregator's checkpoint holds the same model.
    run(["export", "--from=%s/fed/server.ckpt" % d, "--out=%s/ckpt.npz" % d], d)
    a, b = np.load("%s/ckpt.npz" % d), np.load("%s/fed/model.npz" % d)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
    # A worker's snapshot folder: the latest snapshot is its final model; --step picks another.
    run(["worker", "--id=0", "--workers=1", "--listen=127.0.0.1:0", "--max_steps=30",
         "--snapshot_every=10", "--snapshot_dir=%s/snap" % d, "--final_model=%s/final.pb" % d,
         "--exit_after_training", "--log_level=warn"], d)
    run(["export", "--from=%s/snap" % d, "--out=%s/snap.npz" % d], d)
    run(["export", "--from=%s/snap" % d, "--step=10", "--out=%s/snap10.npz" % d], d)
    run(["export", "--from=%s/final.pb" % d, "--out=%s/final.npz" % d], d)
    latest, step10, final = (np.load("%s/%s.npz" % (d, n)) for n in ("snap", "snap10", "final"))
    assert all(np.array_equal(latest[k], final[k]) for k in final.files)
    assert any(not np.array_equal(step10[k], final[k]) for k in final.files)
    # Anything else is refused with a reason.
    with open(d + "/junk", "wb") as f:
        f.write(b"\x00\x01 not a model")
    p = subprocess.run([TERN, "export", "--from=" + d + "/junk", "--out=" + d + "/j.npz"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 1 and "neither a model file nor" in p.stdout, p.stdout
    print("OK")


if __name__ == "__main__":
    main()
