"""What every side of the race shares: data, models, snapshots and their evaluation.

Models are torch modules whose parameters, flattened in `parameters()` order, are what a snapshot
file holds (raw little-endian fp32). tern's built-in MLP stores its weights [in, out]; a
snapshot in that layout is turned into torch's [out, in] by `from_tern_layout`.
"""
import gzip
import json
import os
import struct

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # as tern's loader (core/workload/dataset.cc)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\0\0" or data[2] != 8:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(split, data_dir=DATA):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def shard(n, rank, world, seed):
    """An iid shard: a seeded permutation of the training set cut into `world` parts."""
    perm = np.random.default_rng(seed).permutation(n)
    return torch.from_numpy(perm[rank::world].copy())


class Batches:
    """Walks a shard in a new random order each pass, `batch` examples at a time."""

    def __init__(self, x, y, idx, batch, seed):
        self.x, self.y, self.idx, self.batch = x, y, idx, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.order, self.pos = None, len(idx)

    def next(self):
        take, have = [], 0
        while have < self.batch:
            if self.pos == len(self.idx):
                self.order = self.idx[torch.randperm(len(self.idx), generator=self.gen)]
                self.pos = 0
            k = min(self.batch - have, len(self.idx) - self.pos)
            take.append(self.order[self.pos:self.pos + k])
            self.pos += k
            have += k
        i = torch.cat(take)
        return self.x[i], self.y[i]


def mlp(hidden):
    widths = [784] + list(hidden) + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def cnn():
    """A small CNN (two 5x5 conv layers, 1.3 M parameters less than the MLP: ~0.43 M)."""
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def make_model(spec):
    """'mlp:1024x1024' or 'cnn'."""
    if spec == "cnn":
        return cnn()
    name, _, hidden = spec.partition(":")
    if name != "mlp":
        raise ValueError(f"model {spec!r}: mlp:H1xH2 or cnn")
    return mlp(int(h) for h in hidden.split("x"))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def load_flat(model, x):
    off = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(x[off:off + p.numel()]).reshape(p.shape))
            off += p.numel()
    if off != len(x):
        raise ValueError(f"snapshot has {len(x)} values; the model {off}")


def from_tern_layout(x, layout):
    """A built-in model's flat vector ([in, out] weights) in torch's order ([out, in])."""
    parts = []
    for t in layout["tensors"]:
        v = x[t["offset"]:t["offset"] + t["numel"]]
        if len(t["shape"]) == 2:
            v = v.reshape(t["shape"]).T.reshape(-1)
        parts.append(v)
    return np.concatenate(parts).astype(np.float32)


def to_tern_layout(x, model):
    """The inverse: a torch MLP's flat vector in the built-in layout."""
    parts, off = [], 0
    for p in model.parameters():
        v = x[off:off + p.numel()]
        off += p.numel()
        if p.dim() == 2:
            v = v.reshape(tuple(p.shape)).T.reshape(-1)
        parts.append(v)
    return np.concatenate(parts).astype(np.float32)


class Snapshots:
    """Keeps the parameters every `every` steps in memory (a copy, like a checkpoint would take)
    and writes them with their wall-clock times once training is over."""

    def __init__(self, every):
        self.every, self.kept, self.start = every, {}, None

    def begin(self):
        self.start = _now()

    def after(self, steps, model, final=False):
        if steps % self.every == 0 or final:
            self.kept[steps] = (flat(model).copy(), _now())

    def write(self, out_dir):
        os.makedirs(out_dir, exist_ok=True)
        times = {}
        for steps, (x, t) in self.kept.items():
            x.astype("<f4").tofile(os.path.join(out_dir, f"step-{steps}.f32"))
            times[str(steps)] = t
        with open(os.path.join(out_dir, "times.json"), "w") as f:
            json.dump({"start_unix_s": self.start, "end_unix_s": times}, f)


def _now():
    import time
    return time.time()


def accuracy(model, x, y, chunk=1000):
    """Test accuracy, in chunks (a CNN's activations for 10 000 images at once are ~1 GB)."""
    right = 0
    with torch.no_grad():
        for i in range(0, len(x), chunk):
            right += (model(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum().item()
    return right / len(x)
