#!/usr/bin/python3
"""Trains the byte-level GPT of gpt.py on Python's documentation with AdamW (warm-up, cosine
decay, gradient norm clipped at 1), alone, with others through a tern worker (gossip), or as
one site of a DiLoCo run through a tern aggregator.

    examples/lm/train.py --steps=300                               # alone
    tern worker --trainer=external --momentum=0 --id=0 --workers=2 --peers=... &
    examples/lm/train.py --worker=127.0.0.1:7000 --rank=0          # one of several sites
    tern server --mode=local-sgd --local_epochs=0 --local_steps=50 --rounds=6 --min_clients=2 \
        --outer=nesterov:lr=0.7,momentum=0.9 &
    examples/lm/train.py --server=127.0.0.1:7060 --rank=0          # DiLoCo, H = 50

With --worker, tern.optim.DistributedOptimizer wraps the AdamW: each step's update is mixed with
the neighbours' models by the worker (its --algorithm and --codec say how; the slow-link
configuration is --algorithm=choco --codec=stc:ratio=0.015 --consensus_step=0.1). With --server,
tern.optim.OuterOptimizer does: every H steps (the server's --local_steps) the change since the
last global model goes to the aggregator, which takes the outer step (--outer), and training
goes on from the new global model; the run ends after the server's rounds. Every rank
starts from the same initial model (--seed) and draws its own windows of the text (--rank).
It prints the validation loss in bits per byte every --eval_every steps and a last line
RESULT {json}. Needs python3.11-doc (the text) and Debian's python3-torch: run /usr/bin/python3.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8, help="windows of --context bytes a step")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d_model", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW's peak learning rate")
    p.add_argument("--worker", default="", help="this site's tern worker (none: train alone)")
    p.add_argument("--server", default="", help="a tern aggregator in local-sgd mode (DiLoCo)")
    p.add_argument("--rank", type=int, default=0, help="which windows this process draws")
    p.add_argument("--seed", type=int, default=1, help="the initial model (the same everywhere)")
    p.add_argument("--eval_every", type=int, default=50)
    p.add_argument("--eval_windows", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = gpt.GPT(gpt.GPTConfig(layers=a.layers, d_model=a.d_model, context=a.context))
    corpus = gpt.Corpus()
    batches = corpus.batches(a.batch, a.context, seed=a.seed * 1000003 + a.rank)
    windows = corpus.validation_windows(a.context, count=a.eval_windows)
    optimizer = gpt.adamw(model, a.lr)
    if a.worker:
        import tern.optim
        optimizer = tern.optim.DistributedOptimizer(optimizer, model, worker=a.worker)
    if a.server:
        import tern.optim
        optimizer = tern.optim.OuterOptimizer(optimizer, model, server=a.server,
                                              name=f"site-{a.rank}")
    print(f"{sum(p.numel() for p in model.parameters())} parameters; "
          f"{len(corpus.train)} training bytes, {len(corpus.val)} validation", flush=True)
    losses, start = [], time.time()
    first_bpb = corpus.bits_per_byte(model, windows)
    bpb = first_bpb
    for step in range(a.steps):
        for g in optimizer.param_groups:
            g["lr"] = gpt.lr_at(step, a.steps, a.lr)
        x, y = batches.next()
        optimizer.zero_grad()
        loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        done = a.server and optimizer.done  # the aggregator's rounds are over
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps or done:
            bpb = corpus.bits_per_byte(model, windows)
            print(f"step {step + 1}: {time.time() - start:.1f} s, validation {bpb:.3f} bits/byte",
                  flush=True)
        if done:
            break
    if a.worker or a.server:
        optimizer.close()
    k = max(1, min(10, len(losses) // 2))
    print("RESULT " + json.dumps({"steps": a.steps, "first_bpb": first_bpb, "bpb": bpb,
                                  "first_loss": sum(losses[:k]) / k,
                                  "last_loss": sum(losses[-k:]) / k,
                                  "seconds": round(time.time() - start, 1)}))


if __name__ == "__main__":
    main()
