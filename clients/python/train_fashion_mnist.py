#!/usr/bin/python3
"""A PyTorch trainer driving a tern worker over gRPC: MLP 784-128-64-10 on Fashion-MNIST.

Start the worker with an external trainer, then this script against it, e.g. for worker 0 of 2:

    tern worker --trainer=external --id=0 --workers=2 --listen=127.0.0.1:7000 \
        --peers=127.0.0.1:7000,127.0.0.1:7001 --algorithm=dpsgd --codec=fp16
    /usr/bin/python3 clients/python/train_fashion_mnist.py --worker=127.0.0.1:7000 \
        --worker_id=0 --num_workers=2 --steps=500

(PYTHONPATH must hold clients/python and the generated build/clients/python.)
"""

import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch

from tern.trainer import TernTrainer

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\0\0" or data[2] != 8:
        raise ValueError("%s is not an unsigned-byte IDX file" % path)
    rank = data[3]
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load(split, data_dir):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def make_model(seed):
    torch.manual_seed(seed)  # every worker must register the same initial values
    return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 10))


def train(address, worker_id, num_workers, steps, batch=32, seed=1, data_dir=DATA, codec="none",
          log=print, shared=False, tls=None):
    """Trains through the worker at `address`; returns (losses, model, test accuracy).
    With `shared`, tensors go through the worker's shared memory (same host only); `tls`:
    tern.trainer.make_channel's TLS arguments for a worker that serves TLS."""
    torch.set_num_threads(1)
    x, y = load("train", data_dir)
    xs, ys = x[worker_id::num_workers], y[worker_id::num_workers]  # an iid shard
    model = make_model(seed)
    client = TernTrainer(address, tls=tls)
    reply = client.register(model.named_parameters())
    log("registered with worker %d of %d (%s)" % (reply.worker_id, reply.num_workers,
                                                  reply.algorithm))
    shm = client.share(model) if shared else None
    gen = torch.Generator().manual_seed(seed * 1000 + worker_id)
    losses = []
    for step in range(reply.step, steps):
        t0 = time.time()
        idx = torch.randint(0, len(xs), (batch,), generator=gen)
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
        loss.backward()
        if shm is not None:
            shm.step(step, loss=loss.item(), compute_seconds=time.time() - t0)
        else:
            grads = [(name, p.grad) for name, p in model.named_parameters()]
            _, params = client.step(step, grads, loss=loss.item(),
                                    compute_seconds=time.time() - t0, codec=codec)
            client.load_into(model, params)
        losses.append(loss.item())
        if (step + 1) % 100 == 0:
            log("step %d loss %.3f" % (step + 1, np.mean(losses[-100:])))
    xt, yt = load("test", data_dir)
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    return losses, model, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", default="127.0.0.1:7000")
    ap.add_argument("--worker_id", type=int, default=0)
    ap.add_argument("--num_workers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--codec", default="none", choices=["none", "fp16"])
    ap.add_argument("--shared_memory", action="store_true",
                    help="same host: tensors through the worker's shared memory")
    for flag in ("tls_ca", "tls_cert", "tls_key", "token_file"):
        ap.add_argument("--" + flag, default=None,
                        help="as the tern command's --%s (a worker serving TLS)" % flag)
    a = ap.parse_args()
    tls = {k: getattr(a, k) for k in ("tls_ca", "tls_cert", "tls_key", "token_file")
           if getattr(a, k)}
    _, _, acc = train(a.worker, a.worker_id, a.num_workers, a.steps, a.batch, a.seed, a.data,
                      a.codec, shared=a.shared_memory, tls=tls)
    print("test accuracy of this worker's model: %.2f%%" % (100 * acc))


if __name__ == "__main__":
    main()
