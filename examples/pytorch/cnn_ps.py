#!/usr/bin/python3
"""cnn.py with a parameter server (`tern server --mode=ps --optimizer=adam`; launch.py starts
one): each round every client sends one minibatch's gradient and the server takes the Adam
step. BatchNorm's running statistics are not gradients: the global model's are re-estimated on
training batches (torch's update_bn) before it is evaluated."""

import argparse

import torch

import common
import tern.federated

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=float, default=2)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--rank", type=int, default=0)   # this process's shard of the data
p.add_argument("--world", type=int, default=1)
p.add_argument("--server", default="127.0.0.1:7060")  # the aggregator
a = p.parse_args()
torch.set_num_threads(1)
x, y = common.load("train")
x, y = x[a.rank::a.world], y[a.rank::a.world]
model = common.make_cnn()
optimizer = tern.federated.NoStep(model)  # Adam runs on the server (tern server --lr)
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


tern.federated.run(tern.federated.TorchClient(model, train), a.server, name="c%d" % a.rank,
                   num_samples=len(x))  # the server's --rounds and --local_steps say how long
tern.federated.load_global_model(model, a.server)
torch.optim.swa_utils.update_bn((next(data)[0] for _ in range(50)), model)
common.report(steps=len(losses), first_loss=sum(losses[:20]) / 20, last_loss=sum(losses[-20:]) / 20,
              accuracy=common.accuracy(model, *common.load("test")))
