"""Python client for a tern worker's Trainer service (proto/tern/v1/worker.proto).

A PyTorch training loop drives its worker like this:

    client = TernTrainer("127.0.0.1:7000")
    client.register(model.named_parameters())          # same initial values on every worker
    for step in range(steps):
        loss = loss_fn(model(x), y); loss.backward()
        params = client.step(step, model.named_parameters(), loss=loss.item())
        client.load_into(model, params)                 # the worker's gossip-averaged model

On the worker's host, `shared = client.share(model)` after register() maps the worker's
shared memory into the model's parameters and gradients; then `shared.step(step, loss=...)`
after each backward() is the whole exchange (no tensor bytes through gRPC, no copies).

Tensors travel as a TensorBundle cut into CRC-checked chunks of at most 1 MiB, exactly as the
C++ side sends them (docs/wire-format.md). Gradients go as raw fp32 ("none.v1") or, with
codec="fp16", as IEEE binary16 ("fp16.v1"); the worker accepts any codec it knows.

Needs Debian's python3-grpcio, python3-protobuf and python3-torch (run with /usr/bin/python3);
the package is installed as docs/python.md says.
"""

import mmap
import socket
import time

import grpc
import numpy as np

from tern.v1 import worker_pb2, worker_pb2_grpc
# The wire helpers live in tern.wire; these names stay importable from here.
from tern.wire import (MAX_CHUNK_BYTES, as_numpy, assemble, assemble_bytes,  # noqa: F401
                       chunk_bundle, decode_dense, make_bundle, make_channel)

class TernTrainer:
    """The Trainer service of one worker. Not thread-safe: one training loop per client.
    `tls`: make_channel's keyword arguments (tls_ca, tls_cert, tls_key, token_file)."""

    def __init__(self, address, timeout=300.0, tls=None):
        self.channel = make_channel(address, **(tls or {}))
        self.stub = worker_pb2_grpc.TrainerStub(self.channel)
        self.timeout = timeout
        self._io_seconds = 0.0  # the last step's I/O, reported with the next

    def register(self, named_params):
        """Declares the model (names, shapes, initial values); returns the RegisterReply."""
        bundle = make_bundle(named_params)
        requests = (worker_pb2.RegisterRequest(chunk=c) for c in chunk_bundle(bundle))
        return self.stub.Register(requests, timeout=self.timeout)

    def step(self, step, named_grads, loss=0.0, lr=0.0, compute_seconds=0.0, codec="none"):
        """Sends step `step`'s gradient; returns (StepResult, {name: numpy params})."""
        t0 = time.time()
        bundle = make_bundle(named_grads, codec=codec, round_=step)
        info = worker_pb2.StepInfo(step=step, lr=lr, loss=loss, compute_seconds=compute_seconds,
                                   io_seconds=self._io_seconds)

        def requests():
            for i, c in enumerate(chunk_bundle(bundle)):
                yield worker_pb2.StepRequest(info=info if i == 0 else None, chunk=c)

        result, chunks = None, []
        for reply in self.stub.Step(requests(), timeout=self.timeout):
            if result is None:
                result = reply.result
            chunks.append(reply.chunk)
        params = assemble(chunks)
        out = {nt.name: decode_dense(nt.tensor) for nt in params.tensors}
        # Encoding, chunking, CRCs and decoding: the I/O reported with the next step.
        self._io_seconds = max(0.0, time.time() - t0 - result.worker_seconds)
        return result, out

    def stats(self):
        return self.stub.Stats(worker_pb2.StatsRequest(), timeout=self.timeout)

    def snapshot(self, step, timeout=None):
        """The model the worker kept after `step` steps (its --snapshot_every; with
        --snapshot_model=group, diloco's outer model): {name: numpy params}. Waits while the
        worker has not got there up to `timeout` (default: the client's); a snapshot never kept
        or evicted raises grpc.RpcError (NOT_FOUND), and so does a worker that is not there
        (UNAVAILABLE), at once."""
        deadline = time.time() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                chunks = [r.chunk for r in self.stub.Snapshot(
                    worker_pb2.SnapshotRequest(round=step),
                    timeout=max(0.1, deadline - time.time()))]
                break
            except grpc.RpcError as e:
                # The worker's own "not at step N yet" (RoundEngine::GetSnapshot), not a
                # connection that failed: a dead worker would otherwise cost the whole timeout.
                not_yet = (e.code() == grpc.StatusCode.UNAVAILABLE
                           and (e.details() or "").startswith("not at step "))
                if not not_yet or time.time() >= deadline:
                    raise
                time.sleep(0.005)
        return {nt.name: decode_dense(nt.tensor) for nt in assemble(chunks).tensors}

    def share(self, model):
        """Same host only, after register(): ties `model`'s parameters and their .grad to views
        of a shared-memory segment the worker made (docs/trainer-shm.md), so a step moves no
        tensor bytes through gRPC and no copies in Python. Returns a SharedModel whose step()
        replaces TernTrainer.step(). The parameters must be float32, in the registered order."""
        info = self.stub.OpenSharedMemory(worker_pb2.OpenSharedMemoryRequest(),
                                          timeout=self.timeout)
        return SharedModel(Segment(self, info), model)

    @staticmethod
    def load_into(model, params):
        """Copies the worker's parameters into a torch module, in place."""
        import torch
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(params[name].reshape(tuple(p.shape))))


SHM_MAGIC = b"TERNSHM1"


class _NotReady(Exception):
    """The worker answered UNAVAILABLE: not ready for a step yet (no peers), nothing done."""


class Segment:
    """The worker's shared-memory segment (docs/trainer-shm.md) and its doorbell: `grad` and
    `params`, flat float32 torch tensors over the two regions, and step(info) -> StepResult.
    Not thread-safe: one step in flight at a time."""

    def __init__(self, trainer, info):
        import torch
        with open(info.path, "r+b") as f:
            self._mm = mmap.mmap(f.fileno(), info.size)
        if self._mm[:8] != SHM_MAGIC:
            raise ValueError("%s is not a tern shared-memory segment" % info.path)
        n = self.num_params = info.num_params
        self.grad = torch.from_numpy(
            np.frombuffer(self._mm, dtype="<f4", count=n, offset=info.grad_offset))
        self.params = torch.from_numpy(
            np.frombuffer(self._mm, dtype="<f4", count=n, offset=info.params_offset))
        self._trainer = trainer
        # The doorbell: a step is one message each way on a Unix socket, two wake-ups in all
        # (Trainer.StepShared over gRPC takes several more); StepShared when there is none.
        self._bell = None
        if info.doorbell_path:
            self._bell = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._bell.connect(info.doorbell_path)
        self._io_seconds = 0.0

    def step(self, step, loss=0.0, lr=0.0, compute_seconds=0.0, mix_now=False):
        """Runs step `step` with the gradient region as written; returns the StepResult.
        `mix_now`: the step's exchange is mixed before the reply, even with --overlap."""
        info = worker_pb2.StepInfo(step=step, lr=lr, loss=loss, compute_seconds=compute_seconds,
                                   io_seconds=self._io_seconds, mix_now=mix_now)
        t0 = time.time()
        while True:
            try:
                if self._bell is None:
                    try:
                        result = self._trainer.stub.StepShared(info,
                                                               timeout=self._trainer.timeout)
                    except grpc.RpcError as e:
                        if e.code() == grpc.StatusCode.UNAVAILABLE:
                            raise _NotReady() from None
                        raise
                else:
                    result = self._ring(info)
                break
            except _NotReady:
                # The worker is still waiting for its peers (a refusal changes nothing): wait
                # with it, within the deadline.
                if time.time() - t0 > self._trainer.timeout:
                    raise TimeoutError("worker not ready for step %d within %.0f s (it does not "
                                       "know its peers)" % (step, self._trainer.timeout))
                time.sleep(0.05)
        # What reaching the worker cost, reported with the next step.
        self._io_seconds = max(0.0, time.time() - t0 - result.worker_seconds)
        return result

    def _ring(self, info):
        self._bell.settimeout(self._trainer.timeout)
        try:
            self._bell.send(b"S" + info.SerializeToString())
            reply = self._bell.recv(1 << 16)
        except socket.timeout:
            raise TimeoutError("worker did not answer step %d within %.0f s"
                               % (info.step, self._trainer.timeout)) from None
        if not reply:
            raise ConnectionError("the worker closed the doorbell socket")
        if reply[0] == 14:  # UNAVAILABLE
            raise _NotReady()
        if reply[0] != 0:
            raise RuntimeError("worker refused step %d (status %d): %s"
                               % (info.step, reply[0], reply[1:].decode("utf-8", "replace")))
        return worker_pb2.StepResult.FromString(reply[1:])

    def close(self):
        if self._bell is not None:
            self._bell.close()
            self._bell = None


def check_shareable(model):
    """Raises TypeError unless every parameter of `model` is float32 in CPU memory: the worker's
    regions are CPU float32, and a parameter tied to them (p.data = a view) would otherwise be
    silently moved off its device or cast."""
    import torch
    for name, p in model.named_parameters():
        if p.device.type != "cpu":
            raise TypeError(
                "parameter %s is on %s: a worker's shared memory holds CPU float32 values, and "
                "tying the parameter to it would move it off its device; keep the model on the "
                "CPU, or use tern.optim.DistributedOptimizer, which copies any device's and any "
                "dtype's values to and from the worker" % (name, p.device))
        if p.dtype != torch.float32:
            raise TypeError("parameter %s is %s: a worker's shared memory holds float32 values; "
                            "tern.optim.DistributedOptimizer takes any dtype" % (name, p.dtype))


class SharedModel:
    """A torch module whose parameters and gradients live where the worker reads and writes
    them: the worker's shared memory (a Segment), or this process's memory for an embedded
    worker (tern.embedded).

    The worker reads the gradient region during a step and writes the parameter region before
    it returns; the model's tensors are views of those regions, so backward() writes the
    gradient where the worker reads it, and the next forward() reads what the worker wrote.
    `segment`: flat float32 torch tensors `grad` and `params` of `num_params` values, step() and
    close().
    """

    def __init__(self, segment, model):
        check_shareable(model)
        self._segment = segment
        self._model, self._views = model, []
        off, n = 0, self._segment.num_params
        for p in model.parameters():
            k = p.numel()
            if off + k > n:
                raise ValueError("the model has more values than the worker registered (%d)" % n)
            g = self._segment.grad[off:off + k].view(p.shape)
            x = self._segment.params[off:off + k].view(p.shape)
            p.data = x  # the worker's current parameters, already in place
            p.grad = g
            self._views.append((p, g, x))
            off += k
        if off != n:
            raise ValueError("the model has %d values; the worker registered %d" % (off, n))

    def step(self, step, loss=0.0, lr=0.0, compute_seconds=0.0):
        """Step `step` with the gradient backward() left in the model; returns the StepResult.
        The model then holds the worker's parameters for the next step."""
        for p, g, x in self._views:
            if p.grad is None:  # zero_grad(set_to_none=True) dropped the view
                g.zero_()
            elif p.grad.data_ptr() != g.data_ptr():
                g.copy_(p.grad)
            p.grad = g
            if p.data.data_ptr() != x.data_ptr():
                raise RuntimeError("a parameter was replaced; SharedModel needs them in place")
        return self._segment.step(step, loss=loss, lr=lr, compute_seconds=compute_seconds)

    def close(self):
        self._segment.close()
