#!/usr/bin/python3
"""One rank of a language-model race row (bench/race/lm_race.py starts one per site).

Every kind trains the same byte-level GPT (examples/lm/gpt.py) from the same initial parameters
on its own random windows of the same text, with inner AdamW (β 0.9/0.95, weight decay 0.1,
gradient norm clipped at 1), the same warm-up and cosine schedule and the same tokens per step:

  compute       no communication at all: the floor every row's time is a multiple of
  ddp           DDP, dense fp32 gradients all-reduced every step (gloo)
  ddp-powersgd  DDP with torch's PowerSGD hook (rank 4, error feedback, warm start)
  postlocalsgd  torch's PostLocalSGDOptimizer + PeriodicModelAverager: DDP for the warm-up,
                then the models averaged every H steps
  diloco        DiLoCo: H inner steps, the fp32 pseudo-gradient all-reduced, outer SGD with
                Nesterov momentum (lr 0.7, μ 0.9), ../shared/ALGORITHMS.md §5
  diloco-int8   the same, the pseudo-gradient all-reduced in int8 (a ring: reduce-scatter with
                fp32 sums re-quantized at each hop, then an all-gather), as INTELLECT-1 does
  tern-optim    tern.optim.DistributedOptimizer around the AdamW: each step's update mixed with
                the neighbours' by this site's tern worker (its flags say how)
  tern-fed      an aggregator client (tern.federated.TorchClient): each round, H AdamW steps
                from the round's model; the aggregator averages (local SGD) or takes an outer
                momentum step (SlowMo), as its flags say

Snapshots (raw fp32, parameters() order) are written as they are taken, with their times in
times.jsonl, so a row stopped at its time limit keeps what it had; summary.json has the steps,
the wall time and the seconds spent computing and communicating.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "lm"))
import gpt  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--kind", required=True, choices=["compute", "ddp", "ddp-powersgd",
                                                     "postlocalsgd", "diloco", "diloco-int8",
                                                     "tern-optim", "tern-fed"])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", default="10.77.0.1:29500")
    p.add_argument("--worker", default="127.0.0.1:7000", help="tern-optim: this site's worker")
    p.add_argument("--server", default="10.77.0.1:7060", help="tern-fed: the aggregator")
    p.add_argument("--steps", type=int, default=300, help="inner steps per worker")
    p.add_argument("--batch", type=int, default=8, help="windows per step per worker")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d_model", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3, help="inner AdamW's peak learning rate")
    p.add_argument("--h", type=int, default=50, help="inner steps between synchronizations")
    p.add_argument("--outer_lr", type=float, default=0.7)
    p.add_argument("--outer_momentum", type=float, default=0.9)
    p.add_argument("--rank_approx", type=int, default=4, help="PowerSGD's rank")
    p.add_argument("--snapshot_every", type=int, default=15)
    p.add_argument("--eval_offset", type=int, default=0,
                   help="tern-optim with h: evaluate after steps k*h + this (the steps an "
                        "exchange overlaps: the first step whose θ holds round k*h's outer step)")
    p.add_argument("--group_snapshots", action="store_true",
                   help="tern-optim, diloco: evaluate the group's outer model θ (the worker's "
                        "--snapshot_model=group) rather than this site's own")
    p.add_argument("--max_seconds", type=float, default=1e9,
                   help="stop training after this long (the row's time limit)")
    p.add_argument("--warm_up", default="models",
                   help="tern-optim: how a diloco worker's --sync_steps go (tern.optim)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--sources", default=gpt.SOURCES)
    return p.parse_args()


class Run:
    """This rank's model, data, inner optimizer, snapshots and clocks."""

    def __init__(self, a):
        torch.set_num_threads(1)
        torch.manual_seed(a.seed)  # the same initial model on every rank
        self.a = a
        self.model = gpt.GPT(gpt.GPTConfig(layers=a.layers, d_model=a.d_model,
                                           context=a.context))
        self.corpus = gpt.Corpus(a.sources)
        self.batches = self.corpus.batches(a.batch, a.context, a.seed * 1000003 + a.rank)
        self.compute_s = self.comm_s = 0.0
        self.snapshot_s = 0.0  # the harness's own cost: models kept for evaluation
        # This thread's CPU seconds (not wall: a core shared with others' processes stretches
        # wall time, not these) in the forward and backward passes and in the optimizer's step
        # (tern-optim: the wrapper's too), over the timed steps; zeros for DDP's rows, whose
        # step is DDP's wrapper around both.
        self.thread_cpu = {"forward_backward": 0.0, "optimizer": 0.0}
        self.kept = []  # (step, time, model or a function that fetches it): snapshot()
        self.steps_done = 0
        self.losses = []
        os.makedirs(a.out, exist_ok=True)
        self.times = open(os.path.join(a.out, "times.jsonl"), "w")
        self.start = None

    def begin(self):
        """Starts the clock once every rank of the row is ready, so no row pays for a rank
        that set up slower than the others: gloo's rows are ready after init_process_group (a
        rendezvous of all ranks), tern's once DistributedOptimizer is registered with its worker
        (worker 0 faults in the memory for the run's snapshots of θ first, a second or more).
        Ready files in the row's folder (the parent of --out); a rank that never gets ready
        holds the others max_seconds at most."""
        row_dir = os.path.dirname(os.path.abspath(self.a.out))
        open(os.path.join(row_dir, f"ready-{self.a.rank}"), "w").close()
        deadline = time.time() + self.a.max_seconds
        while time.time() < deadline and not all(
                os.path.exists(os.path.join(row_dir, f"ready-{i}")) for i in range(self.a.world)):
            time.sleep(0.005)
        self.start = time.time()

    def expired(self):
        return time.time() - self.start > self.a.max_seconds

    def set_lr(self, opt, step):
        for g in opt.param_groups:
            g["lr"] = gpt.lr_at(step, self.a.steps, self.a.lr)

    def forward_backward(self, model, step, opt):
        """One step's loss and gradients (through `model`: DDP's wrapper communicates here)."""
        self.set_lr(opt, step)
        x, y = self.batches.next()
        opt.zero_grad(set_to_none=False)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.losses.append(loss.item())
        return loss

    def inner_step(self, step, opt):
        """One step of this rank's own (no communication), timed as compute."""
        t0, c0 = time.time(), time.thread_time()
        self.forward_backward(self.model, step, opt)
        c1 = time.thread_time()
        opt.step()
        self.count_cpu(c0, c1)
        self.compute_s += time.time() - t0
        self.steps_done = step + 1

    def count_cpu(self, c0, c1):
        """Forward and backward from thread_time() c0 to c1, the optimizer from c1 to now."""
        self.thread_cpu["forward_backward"] += c1 - c0
        self.thread_cpu["optimizer"] += time.thread_time() - c1

    def snapshot(self, step, params=None, force=False):
        """Keeps the model after `step` steps (or `params`) for evaluation, with the time. Kept
        in memory and written by finish(), after the clock stops: the files cost every row's
        trainer a disk write a snapshot, which tern's rows, evaluated every H steps, paid most."""
        if step % self.a.snapshot_every and not force:
            return
        t0 = time.time()
        params = params if params is not None else list(self.model.parameters())
        x = torch.cat([p.detach().reshape(-1) for p in params])  # a copy
        self.kept.append((step, t0, x))
        self.snapshot_s += time.time() - t0

    def snapshot_later(self, step, fetch):
        """As snapshot(), but the model is fetch() called by finish(): the group's θ, which the
        worker keeps (--snapshot_every=1), fetched after the clock stops rather than each time."""
        self.kept.append((step, time.time(), fetch))

    def finish(self, **extra):
        end = time.time()
        summary = dict(steps=self.steps_done, start_unix_s=self.start, end_unix_s=end,
                       wall_s=end - self.start, compute_s=self.compute_s, comm_s=self.comm_s,
                       snapshot_s=self.snapshot_s, thread_cpu_s=self.thread_cpu,
                       first_loss=float(np.mean(self.losses[:10])) if self.losses else None,
                       last_loss=float(np.mean(self.losses[-10:])) if self.losses else None)
        summary.update(extra)
        for step, t, x in self.kept:
            if callable(x):
                try:
                    x = x()
                except Exception as e:  # noqa: BLE001 - the worker gone: the others still count
                    print(f"rank {self.a.rank}: no snapshot of step {step}: {e}", flush=True)
                    continue
            x.numpy().astype("<f4").tofile(os.path.join(self.a.out, f"step-{step}.f32"))
            self.times.write(json.dumps({"step": step, "t": t}) + "\n")
        self.kept = []
        with open(os.path.join(self.a.out, "summary.json"), "w") as f:
            json.dump(summary, f)
        self.times.close()


def init_gloo(a):
    import torch.distributed as dist
    host, port = a.master.split(":")
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=a.rank,
                            world_size=a.world)
    return dist


def run_synchronous(a, r, dist, step_fn):
    """step_fn(step) for each step until the steps or the row's time are up, for the rows whose
    ranks meet in collectives. Each rank decides the time cut on its own clock, so at the cut one
    rank may be a collective ahead of the others: it sees them leave (a gloo error) and stops
    there too, and a rank that stopped at the cut leaves without waiting for the others (a
    barrier there met the other rank's all-reduce and hung until the harness gave up)."""
    cut = False
    try:
        for step in range(a.steps):
            if r.expired():
                cut = True
                break
            step_fn(step)
    except RuntimeError:
        if time.time() - r.start < 0.9 * a.max_seconds:  # not the cut: a real failure
            raise
        cut = True
    r.finish()
    if not cut:
        dist.barrier()
    leave()


def leave():
    # Tearing gloo down can spin forever in one rank once the others have gone (race.py saw it
    # in CI): this rank is done and has written, so leave without it.
    sys.stdout.flush()
    os._exit(0)


def run_compute(a, r):
    opt = gpt.adamw(r.model, a.lr)
    r.begin()
    r.snapshot(0)
    for step in range(a.steps):
        if r.expired():
            break
        r.inner_step(step, opt)
        r.snapshot(step + 1, force=step + 1 == a.steps)
    r.finish()


def run_ddp(a, r):
    dist = init_gloo(a)
    from torch.nn.parallel import DistributedDataParallel as DDP
    # torch 1.13 + gloo: one bucket, or "op.preamble.length <= op.nbytes" with PowerSGD.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
    ddp = DDP(r.model, bucket_cap_mb=1024)
    averager = None
    if a.kind == "ddp-powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank_approx,
                                 start_powerSGD_iter=2, min_compression_rate=2,
                                 use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, ps.powerSGD_hook)
    opt = gpt.adamw(r.model, a.lr)
    if a.kind == "postlocalsgd":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl
        from torch.distributed.algorithms.model_averaging import averagers
        from torch.distributed.optim import PostLocalSGDOptimizer
        warmup = max(1, int(0.1 * a.steps))  # the learning rate's warm-up: DDP until then
        # Every site its own "node": after the warm-up, no gradient all-reduce at all (torch's
        # default, an all-reduce within each machine, needs CUDA to find the machines).
        ddp.register_comm_hook(pl.PostLocalSGDState(process_group=None, subgroup=None,
                                                    start_localSGD_iter=warmup,
                                                    post_local_gradient_allreduce=False),
                               pl.post_localSGD_hook)
        averager = averagers.PeriodicModelAverager(period=a.h, warmup_steps=warmup)
        opt = PostLocalSGDOptimizer(optim=opt, averager=averager)
    dist.barrier()
    r.begin()
    r.snapshot(0)

    def step_fn(step):
        r.forward_backward(ddp, step, opt.optim if averager else opt)
        opt.step()
        r.steps_done = step + 1
        # DDP: one model, rank 0's. PostLocalSGD: each rank's, averaged by the evaluation; after
        # the warm-up the sites hold one model only right after an average (torch's averager
        # averages after loop steps warmup, warmup + H, ...), so only those are evaluated, as
        # DiLoCo's outer model is; and the last (the sites' average: one all-reduce at the end).
        if a.kind == "postlocalsgd" and step >= warmup:
            if (step - warmup) % a.h == 0 or step + 1 == a.steps:
                r.snapshot(step + 1, force=True)
        elif a.rank == 0 or a.kind == "postlocalsgd":
            r.snapshot(step + 1, force=step + 1 == a.steps)

    run_synchronous(a, r, dist, step_fn)


QUANT_BLOCK = 1024  # values per int8 scale: 0.4 % more bytes, and an outlier costs one block


def quantize_int8(x):
    """Blockwise absmax int8: (values, one fp32 scale per QUANT_BLOCK values)."""
    n = x.numel()
    pad = (-n) % QUANT_BLOCK
    blocks = torch.nn.functional.pad(x, (0, pad)).view(-1, QUANT_BLOCK)
    scale = blocks.abs().amax(dim=1).clamp(min=1e-30) / 127.0
    return torch.round(blocks / scale[:, None]).to(torch.int8).view(-1)[:n], scale


def dequantize_int8(v, scale):
    n = v.numel()
    pad = (-n) % QUANT_BLOCK
    blocks = torch.nn.functional.pad(v.float(), (0, pad)).view(-1, QUANT_BLOCK)
    return (blocks * scale[:, None]).view(-1)[:n]


def ring_allreduce_int8(dist, flat, rank, world):
    """Sum of `flat` over the ranks, moved as int8 (blockwise scales): reduce-scatter around the
    ring, each hop's partial sum de-quantized, added in fp32 and re-quantized, then the reduced
    chunks passed around once more. 2 (n-1)/n bytes a value, where a ring all-reduce of fp32
    moves 8 (n-1)/n."""
    chunks = list(flat.chunk(world))
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def swap(send_i, recv_i):
        v, s = quantize_int8(chunks[send_i])
        n = chunks[recv_i].numel()
        rv = torch.empty(n, dtype=torch.int8)
        rs = torch.empty((n + QUANT_BLOCK - 1) // QUANT_BLOCK)
        reqs = [dist.isend(v, nxt), dist.isend(s, nxt), dist.irecv(rv, prv), dist.irecv(rs, prv)]
        for req in reqs:
            req.wait()
        return dequantize_int8(rv, rs)

    for k in range(world - 1):  # reduce-scatter: chunk (rank - k - 1) takes one more term
        i = (rank - k - 1) % world
        chunks[i] = chunks[i] + swap((rank - k) % world, i)
    own = (rank + 1) % world  # fully reduced here; its quantized form goes round
    chunks[own] = dequantize_int8(*quantize_int8(chunks[own]))  # every rank ends the same
    for k in range(world - 1):  # all-gather (re-quantizing a de-quantized chunk is exact)
        recv_i = (rank - k) % world
        chunks[recv_i] = swap((rank + 1 - k) % world, recv_i)
    return torch.cat(chunks)


def run_diloco(a, r):
    dist = init_gloo(a)
    params = list(r.model.parameters())
    outer = [p.detach().clone() for p in params]  # θ, the shared parameters
    for p in outer:
        p.grad = torch.zeros_like(p)
    # Momentum 0 is the plain average (torch refuses Nesterov without momentum).
    outer_opt = torch.optim.SGD(outer, lr=a.outer_lr, momentum=a.outer_momentum,
                                nesterov=a.outer_momentum > 0)
    inner = gpt.adamw(r.model, a.lr)
    dist.barrier()
    r.begin()
    r.snapshot(0, outer)

    def step_fn(step):
        r.inner_step(step, inner)
        if (step + 1) % a.h and step + 1 != a.steps:
            return
        t0 = time.time()
        with torch.no_grad():
            delta = torch.cat([(o - p).reshape(-1) for o, p in zip(outer, params)])
            if a.kind == "diloco-int8":
                delta = ring_allreduce_int8(dist, delta, a.rank, a.world)
            else:
                dist.all_reduce(delta)
            delta /= a.world
            off = 0
            for o in outer:
                o.grad.copy_(delta[off:off + o.numel()].view_as(o))
                off += o.numel()
            outer_opt.step()
            for o, p in zip(outer, params):
                p.copy_(o)
        r.comm_s += time.time() - t0
        if a.rank == 0:
            r.snapshot(step + 1, outer, force=True)

    run_synchronous(a, r, dist, step_fn)


def run_tern_optim(a, r):
    import tern.optim
    opt = gpt.adamw(r.model, a.lr)
    for _ in range(600):  # the worker may still be starting
        try:
            opt = tern.optim.DistributedOptimizer(opt, r.model, worker=a.worker,
                                                  warm_up=a.warm_up)
            break
        except Exception:  # noqa: BLE001 - grpc.RpcError while it starts
            time.sleep(0.1)
    else:
        sys.exit(f"rank {a.rank}: worker {a.worker} never answered")
    r.begin()
    r.snapshot(0)
    for step in range(a.steps):
        if r.expired():
            break
        t0, c0 = time.time(), time.thread_time()
        loss = r.forward_backward(r.model, step, opt)
        c1 = time.thread_time()
        r.compute_s += time.time() - t0
        t1 = time.time()
        opt.step(loss=loss.item())  # AdamW's step, then the round with the neighbours
        r.count_cpu(c0, c1)
        r.comm_s += time.time() - t1
        r.steps_done = step + 1
        if a.h > 0:
            # An outer-step row (--algorithm=diloco): evaluated after each exchange is mixed, on
            # the group's outer model θ (--group_snapshots), as DiLoCo's rows are; the last step
            # on worker 0's own model. θ is the same on every worker and only worker 0's is
            # evaluated (lm_race.py ranks_of): the others keep none, as DiLoCo's other ranks.
            if a.group_snapshots and a.rank != 0:
                pass
            elif step + 1 == a.steps:
                r.snapshot(step + 1, force=True)
            elif (step + 1) % a.h == a.eval_offset % a.h:
                # θ, but in a warm-up of averaged gradients, where the worker's model carries
                # the gradients and every site holds the model DDP would.
                if a.group_snapshots and step + 1 > opt.warm_up_steps:
                    r.snapshot_later(step + 1, lambda s=step + 1: group_model(opt, r, s))
                else:
                    r.snapshot(step + 1, force=True)
        else:
            r.snapshot(step + 1, force=step + 1 == a.steps)
    r.finish()
    opt.close()


def group_model(opt, r, step):
    """The group's θ after `step` steps as the worker kept it, as one tensor."""
    theta = opt.snapshot(step)
    return torch.cat([torch.from_numpy(theta[n]).reshape(-1)
                      for n, _ in r.model.named_parameters()])


def run_tern_fed(a, r):
    import tern.federated
    inner = gpt.adamw(r.model, a.lr)
    step = [0]

    def train(steps):
        n = 0
        for _ in range(steps):
            if step[0] >= a.steps:
                break
            r.inner_step(step[0], inner)
            step[0] += 1
            n += 1
        return n * a.batch, float(np.mean(r.losses[-max(1, n):]))

    class Cut(Exception):
        """--max_seconds passed: the row stops here, as every other row's ranks do."""

    class Client(tern.federated.TorchClient):
        def fit(self, parameters, task):
            if a.rank == 0:  # the round's global model, as the aggregator published it
                r.snapshot(step[0], [torch.from_numpy(np.asarray(parameters[n], dtype=np.float32))
                                     for n, _ in r.model.named_parameters()], force=True)
            # Site 0 alone decides the cut, so no round waits for a site that stopped on its own
            # clock (the round then waited for its deadline and the row ran past the harness's):
            # that model is the row's last, and the harness stops the others when site 0 exits.
            if a.rank == 0 and r.expired():
                raise Cut()
            return super().fit(parameters, task)

    r.begin()
    try:
        tern.federated.run(Client(r.model, train), a.server, name=f"site{a.rank}",
                           num_samples=1, log=lambda s: print(f"site{a.rank}: {s}", flush=True))
        if a.rank == 0:
            tern.federated.load_global_model(r.model, a.server)  # the run's last model
            r.snapshot(step[0], force=True)
    except Cut:
        pass
    r.comm_s = time.time() - r.start - r.compute_s
    r.finish()


def main():
    a = parse()
    r = Run(a)
    {"compute": run_compute, "ddp": run_ddp, "ddp-powersgd": run_ddp, "postlocalsgd": run_ddp,
     "diloco": run_diloco, "diloco-int8": run_diloco, "tern-optim": run_tern_optim,
     "tern-fed": run_tern_fed}[a.kind](a, r)


if __name__ == "__main__":
    main()
