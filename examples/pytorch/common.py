"""What the example scripts share: Fashion-MNIST as tensors, the CNN, batches and evaluation.
Nothing tern-specific: the single-process script cnn.py uses it as the tern ones do."""

import gzip
import json
import os
import struct

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = struct.unpack(">" + "I" * data[3], data[4:4 + 4 * data[3]])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * data[3]).reshape(dims)


def load(split, data_dir=DATA):
    """(images [N, 1, 28, 28] normalized, labels [N])."""
    prefix = "train" if split == "train" else "t10k"
    x = _idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    y = _idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x).view(-1, 1, 28, 28), torch.from_numpy(y.astype(np.int64))


def make_cnn(seed=0):
    """Two 5x5 convolutions with BatchNorm, one linear layer (about 18 k parameters)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(512, 10))


def batches(x, y, batch, seed):
    """Minibatches of (x, y), reshuffled every epoch, without end."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x) - batch + 1, batch):
            idx = order[i:i + batch]
            yield x[idx], y[idx]


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        right = sum((model(x[i:i + 2000]).argmax(1) == y[i:i + 2000]).sum().item()
                    for i in range(0, len(x), 2000))
    model.train()
    return right / len(x)


def report(**fields):
    """The script's result, one JSON line (launch.py collects them)."""
    print("RESULT " + json.dumps(fields), flush=True)
