"""tern's wire format in Python (docs/wire-format.md): tensors as a TensorBundle of "none.v1"
(fp32) or "fp16.v1" payloads, cut into CRC-checked BundleChunks of at most 1 MiB and reassembled
with every check the C++ side makes; and the one way this package opens a channel to a daemon
(plaintext, TLS, mutual TLS, bearer tokens). Used by tern.trainer, tern.federated and
tern.embedded.

Needs Debian's python3-grpcio, python3-protobuf and python3-numpy; torch tensors are taken where
arrays are, without importing torch here.
"""

import itertools
import zlib
from typing import Any, Iterable, List, Optional, Tuple

import grpc
import numpy as np

from tern.v1 import tensor_pb2

MAX_CHUNK_BYTES = 1 << 20  # as the C++ side cuts them (common/chunking.h)
_stream_ids = itertools.count(1)


def as_numpy(t: Any) -> np.ndarray:
    """A CPU float32 numpy view of a torch tensor or array-like."""
    if hasattr(t, "detach"):  # torch: any dtype (numpy has no bfloat16, so convert first)
        return t.detach().to("cpu").float().numpy()
    return np.asarray(t, dtype=np.float32)


def make_bundle(named_arrays: Iterable[Tuple[str, Any]], codec: str = "none",
                round_: int = 0) -> tensor_pb2.TensorBundle:
    """A TensorBundle of (name, array) pairs, encoded with codec "none" (fp32) or "fp16"."""
    bundle = tensor_pb2.TensorBundle(round=round_)
    for name, value in named_arrays:
        a = np.ascontiguousarray(as_numpy(value))
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


def chunk_bundle(bundle: tensor_pb2.TensorBundle,
                 max_chunk: int = MAX_CHUNK_BYTES) -> List[tensor_pb2.BundleChunk]:
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


def assemble(chunks: Iterable[tensor_pb2.BundleChunk]) -> tensor_pb2.TensorBundle:
    """Reassembles BundleChunks (checking order, sizes and CRCs) into a TensorBundle."""
    return tensor_pb2.TensorBundle.FromString(assemble_bytes(chunks))


def assemble_bytes(chunks: Iterable[tensor_pb2.BundleChunk]) -> bytes:
    """Reassembles BundleChunks (checking order, sizes and CRCs): the serialized bundle."""
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
            return bytes(buf)
    raise ValueError("stream ended before the last chunk")


def decode_dense(t: tensor_pb2.EncodedTensor) -> np.ndarray:
    """A numpy array from a "none.v1" or "fp16.v1" EncodedTensor (what the worker returns)."""
    dtype = {"none.v1": "<f4", "fp16.v1": "<f2"}.get(t.codec)
    if dtype is None:
        raise ValueError("cannot decode codec %r in Python" % t.codec)
    a = np.frombuffer(t.payload, dtype=dtype).astype(np.float32)
    if a.size != t.numel:
        raise ValueError("payload holds %d values, numel is %d" % (a.size, t.numel))
    # A 0-d tensor (BatchNorm's num_batches_tracked) has no dimensions and one value.
    return a.reshape(tuple(t.shape)) if len(t.shape) or a.size == 1 else a


def channel_target(address: str) -> str:
    """gRPC's target for `address`: itself, or for a list "hostA:7000,hostB:7000" (an aggregator
    and its standby) their addresses as one ipv4: (or ipv6:) target, resolved now; make_channel
    keeps a connection to each that answers (round_robin), as the C++ side's MakeChannel
    (core/rpc/channel.h)."""
    if "," not in address or "://" in address or address.startswith(("ipv4:", "ipv6:")):
        return address
    import socket
    family, found = None, []
    for each in (a.strip() for a in address.split(",") if a.strip()):
        host, _, port = each.rpartition(":")
        try:
            info = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
        except (OSError, ValueError):
            continue  # does not resolve: left out
        if family is not None and info[0] != family:
            continue
        family = info[0]
        ip = info[4][0]
        found.append("[%s]:%s" % (ip, port) if family == socket.AF_INET6 else "%s:%s" % (ip, port))
    if not found:
        return address
    return ("ipv6:" if family == socket.AF_INET6 else "ipv4:") + ",".join(found)


def make_channel(address: str, tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, token_file: Optional[str] = None) -> grpc.Channel:
    """A channel to a tern daemon at `address` ("host:port", or a list of them: channel_target):
    plaintext without `tls_ca`; TLS checking the daemon against that CA file otherwise,
    presenting `tls_cert`/`tls_key` (mutual TLS) and the bearer token in `token_file` (tern
    tokens) when given, as the C++ side's --tls_* and --token_file do."""
    target = channel_target(address)
    options = [] if target == address else [("grpc.default_authority", address.split(",")[0]),
                                            ("grpc.lb_policy_name", "round_robin")]
    if tls_ca is None:
        if tls_cert or token_file:
            raise ValueError("a certificate or a token needs tls_ca: tokens never go in plaintext")
        return grpc.insecure_channel(target, options=options)

    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(
        root_certificates=read(tls_ca),
        private_key=read(tls_key) if tls_key else None,
        certificate_chain=read(tls_cert) if tls_cert else None)
    if token_file:
        token = read(token_file).decode().strip()
        creds = grpc.composite_channel_credentials(creds,
                                                   grpc.access_token_call_credentials(token))
    return grpc.secure_channel(target, creds, options=options)
