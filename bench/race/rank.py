#!/usr/bin/python3
"""One rank of a race row that trains in PyTorch: DDP (dense or PowerSGD) or a PyTorch trainer
driving its tern worker (a process of its own, or inside this one: tern-embedded). race.py
starts one per network namespace; see race.py."""
import argparse
import os
import sys
import time

import numpy as np
import torch

import common


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=["ddp", "ddp-powersgd", "tern-torch", "tern-embedded"],
                   required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", default="10.77.0.1:29500")
    p.add_argument("--worker", default="127.0.0.1:7000", help="tern-torch: this rank's worker")
    p.add_argument("--model", default="mlp:1024x1024")
    p.add_argument("--init", default="", help="raw fp32 initial parameters in torch order")
    p.add_argument("--steps", type=int, default=470)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--rank_approx", type=int, default=4, help="PowerSGD's rank")
    p.add_argument("--powersgd_start", type=int, default=2,
                   help="PowerSGD's dense warm-up steps (torch's least with error feedback: 2)")
    p.add_argument("--snapshot_every", type=int, default=10)
    p.add_argument("--worker_flag", action="append", default=[],
                   help="tern-embedded: a flag of the worker inside this process (repeated)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=common.DATA)
    return p.parse_args()


def setup(a):
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)  # the same initial model on every rank
    model = common.make_model(a.model)
    if a.init:
        common.load_flat(model, np.fromfile(a.init, dtype="<f4"))
    x, y = common.load("train", a.data)
    idx = common.shard(len(x), a.rank, a.world, a.seed)
    return model, common.Batches(x, y, idx, a.batch, a.seed * 1000003 + a.rank)


def run_ddp(a, model, batches):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    host, port = a.master.split(":")
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=a.rank,
                            world_size=a.world)
    # torch 1.13 + gloo: one bucket, or "op.preamble.length <= op.nbytes" with PowerSGD.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
    ddp = DDP(model, bucket_cap_mb=1024)
    if a.kind == "ddp-powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank_approx,
                                 start_powerSGD_iter=a.powersgd_start, min_compression_rate=2,
                                 use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, ps.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)
    snaps = common.Snapshots(a.snapshot_every)
    dist.barrier()
    snaps.begin()
    snaps.after(0, model)
    for step in range(a.steps):
        x, y = batches.next()
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if a.rank == 0:
            snaps.after(step + 1, model, final=step + 1 == a.steps)
    dist.barrier()
    if a.rank == 0:
        snaps.write(a.out)
    # Tearing gloo down can spin forever in one rank once the others have gone (seen in CI):
    # every rank is done and rank 0 has written, so leave without it.
    sys.stdout.flush()
    os._exit(0)


def run_tern_torch(a, model, batches):
    from tern.trainer import TernTrainer
    client = TernTrainer(a.worker)
    for _ in range(600):  # the worker may still be starting
        try:
            client.register(model.named_parameters())
            break
        except Exception:  # noqa: BLE001 - grpc.RpcError while it starts
            time.sleep(0.1)
    else:
        sys.exit(f"rank {a.rank}: worker {a.worker} never answered")
    shared = client.share(model)  # same host: tensors through the worker's shared memory
    train_shared(a, model, batches, shared)


def run_tern_embedded(a, model, batches):
    from tern.embedded import EmbeddedWorker
    worker = EmbeddedWorker(a.worker_flag)  # in this process: steps on this thread
    shared = worker.share(model)
    train_shared(a, model, batches, shared)
    worker.close()


def train_shared(a, model, batches, shared):
    snaps = common.Snapshots(a.snapshot_every)
    snaps.begin()
    snaps.after(0, model)
    for step in range(a.steps):
        t0 = time.time()
        x, y = batches.next()
        model.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        shared.step(step, loss=loss.item(), compute_seconds=time.time() - t0)
        snaps.after(step + 1, model, final=step + 1 == a.steps)
    snaps.write(a.out)


def main():
    a = parse()
    model, batches = setup(a)
    if a.kind == "tern-torch":
        run_tern_torch(a, model, batches)
    elif a.kind == "tern-embedded":
        run_tern_embedded(a, model, batches)
    else:
        run_ddp(a, model, batches)


if __name__ == "__main__":
    main()
