"""Python client for a tern worker's Trainer service (proto/tern/v1/worker.proto).

A PyTorch training loop drives its worker like this:

    client = TernTrainer("127.0.0.1:7000")
    client.register(model.named_parameters())          # same initial values on every worker
    for step in range(steps):
        loss = loss_fn(model(x), y); loss.backward()
        params = client.step(step, model.named_parameters(), loss=loss.item())
        client.load_into(model, params)                 # the worker's gossip-averaged model

Tensors travel as a TensorBundle cut into CRC-checked chunks of at most 1 MiB, exactly as the
C++ side sends them (docs/wire-format.md). Gradients go as raw fp32 ("none.v1") or, with
codec="fp16", as IEEE binary16 ("fp16.v1"); the worker accepts any codec it knows.

Needs Debian's python3-grpcio, python3-protobuf and python3-torch (run with /usr/bin/python3),
and the generated tern/v1 modules on sys.path (the build puts them in build/clients/python).
"""

import itertools
import time
import zlib

import grpc
import numpy as np

from tern.v1 import tensor_pb2, worker_pb2, worker_pb2_grpc

MAX_CHUNK_BYTES = 1 << 20
_stream_ids = itertools.count(1)


def _as_numpy(t):
    """A CPU float32 numpy view of a torch tensor or array-like."""
    if hasattr(t, "detach"):
        t = t.detach().to("cpu")
        return t.numpy().astype(np.float32, copy=False)
    return np.asarray(t, dtype=np.float32)


def make_bundle(named_arrays, codec="none", round_=0):
    """A TensorBundle of (name, array) pairs, encoded with codec "none" (fp32) or "fp16"."""
    bundle = tensor_pb2.TensorBundle(round=round_)
    for name, value in named_arrays:
        a = np.ascontiguousarray(_as_numpy(value))
        t = bundle.tensors.add(name=name).tensor
        t.numel = a.size
        t.shape.extend(a.shape)
        t.dtype = tensor_pb2.DTYPE_FLOAT32
        if codec == "none":
            t.codec = "none.v1"
            t.payload = a.astype("<f4").tobytes()
        elif codec == "fp16":
            t.codec = "fp16.v1"
            t.payload = a.astype("<f2").tobytes()
        else:
            raise ValueError("codec must be 'none' or 'fp16', got %r" % codec)
    return bundle


def chunk_bundle(bundle, max_chunk=MAX_CHUNK_BYTES):
    """The BundleChunk messages of a bundle: offsets, per-chunk and whole-bundle CRC-32."""
    data = bundle.SerializeToString()
    stream_id = next(_stream_ids)
    chunks, offset, running = [], 0, 0
    while True:
        piece = data[offset:offset + max_chunk]
        running = zlib.crc32(piece, running)
        last = offset + len(piece) >= len(data)
        c = tensor_pb2.BundleChunk(stream_id=stream_id, offset=offset, total_size=len(data),
                                   data=piece, data_crc32=zlib.crc32(piece), last=last)
        if last:
            c.bundle_crc32 = running
        chunks.append(c)
        offset += len(piece)
        if last:
            return chunks


def assemble(chunks):
    """Reassembles BundleChunks (checking order, sizes and CRCs) into a TensorBundle."""
    buf, running, total = bytearray(), 0, None
    for c in chunks:
        if total is None:
            total = c.total_size
        if c.offset != len(buf) or c.total_size != total:
            raise ValueError("chunk out of order or size changed")
        if zlib.crc32(c.data) != c.data_crc32:
            raise ValueError("chunk fails its CRC-32")
        buf += c.data
        running = zlib.crc32(c.data, running)
        if c.last:
            if len(buf) != total or running != c.bundle_crc32:
                raise ValueError("bundle incomplete or fails its CRC-32")
            return tensor_pb2.TensorBundle.FromString(bytes(buf))
    raise ValueError("stream ended before the last chunk")


def decode_dense(t):
    """A numpy array from a "none.v1" or "fp16.v1" EncodedTensor (what the worker returns)."""
    dtype = {"none.v1": "<f4", "fp16.v1": "<f2"}.get(t.codec)
    if dtype is None:
        raise ValueError("cannot decode codec %r in Python" % t.codec)
    a = np.frombuffer(t.payload, dtype=dtype).astype(np.float32)
    if a.size != t.numel:
        raise ValueError("payload holds %d values, numel is %d" % (a.size, t.numel))
    return a.reshape(tuple(t.shape)) if len(t.shape) else a


class TernTrainer:
    """The Trainer service of one worker. Not thread-safe: one training loop per client."""

    def __init__(self, address, timeout=300.0):
        self.channel = grpc.insecure_channel(address)
        self.stub = worker_pb2_grpc.TrainerStub(self.channel)
        self.timeout = timeout

    def register(self, named_params):
        """Declares the model (names, shapes, initial values); returns the RegisterReply."""
        bundle = make_bundle(named_params)
        requests = (worker_pb2.RegisterRequest(chunk=c) for c in chunk_bundle(bundle))
        return self.stub.Register(requests, timeout=self.timeout)

    def step(self, step, named_grads, loss=0.0, lr=0.0, compute_seconds=0.0, codec="none"):
        """Sends step `step`'s gradient; returns (StepResult, {name: numpy params})."""
        bundle = make_bundle(named_grads, codec=codec, round_=step)
        info = worker_pb2.StepInfo(step=step, lr=lr, loss=loss, compute_seconds=compute_seconds)

        def requests():
            for i, c in enumerate(chunk_bundle(bundle)):
                yield worker_pb2.StepRequest(info=info if i == 0 else None, chunk=c)

        result, chunks = None, []
        for reply in self.stub.Step(requests(), timeout=self.timeout):
            if result is None:
                result = reply.result
            chunks.append(reply.chunk)
        params = assemble(chunks)
        return result, {nt.name: decode_dense(nt.tensor) for nt in params.tensors}

    def stats(self):
        return self.stub.Stats(worker_pb2.StatsRequest(), timeout=self.timeout)

    @staticmethod
    def load_into(model, params):
        """Copies the worker's parameters into a torch module, in place."""
        import torch
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(params[name].reshape(tuple(p.shape))))
