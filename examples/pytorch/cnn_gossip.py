#!/usr/bin/python3
"""cnn.py trained decentralized: each process beside its own `tern worker --trainer=external`
(launch.py starts them), mixing models with its neighbours after every step."""

import argparse

import torch

import common
import tern.optim

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=float, default=2)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--rank", type=int, default=0)   # this process's shard of the data
p.add_argument("--world", type=int, default=1)
p.add_argument("--worker", default="127.0.0.1:7000")  # this process's tern worker
a = p.parse_args()
torch.set_num_threads(1)
x, y = common.load("train")
x, y = x[a.rank::a.world], y[a.rank::a.world]
model = common.make_cnn()
optimizer = torch.optim.Adam(model.parameters(), lr=a.lr)
optimizer = tern.optim.DistributedOptimizer(optimizer, model, worker=a.worker)
data = common.batches(x, y, a.batch, seed=a.rank)
losses = []


def train(steps):
    for step in range(steps):
        xb, yb = next(data)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return steps * a.batch, sum(losses[-steps:]) / steps


train(int(a.epochs * len(x) / a.batch))
common.report(steps=len(losses), first_loss=sum(losses[:20]) / 20, last_loss=sum(losses[-20:]) / 20,
              accuracy=common.accuracy(model, *common.load("test")))
