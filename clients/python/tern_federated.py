"""Python client of a tern aggregator (`tern server`, proto/tern/v1/server.proto): federated and
local-SGD rounds with your own model, in the style of Flower's NumPyClient.

    class MyClient(tern_federated.Client):
        def initial_parameters(self):            # {name: numpy array}, sent if the run has none
            return {k: v.numpy() for k, v in model.state_dict().items()}
        def fit(self, parameters, task):         # train from the round's model
            model.load_state_dict({k: torch.from_numpy(v) for k, v in parameters.items()})
            ... task.local.local_steps, task.local.lr, task.local.batch ...
            return {k: v.numpy() for k, v in model.state_dict().items()}, num_examples, loss

    tern_federated.run(MyClient(), "server.example:7060", name="client-3", num_samples=6000)

`run` joins, sends the initial model when the server asks, then long-polls for tasks: each TRAIN
task's model goes to `fit`, and the change it made (new - old, fp32) goes back as the update,
weighted by the examples it trained on; it returns when the run is over. Every call has a
deadline; a server that goes away is retried for `retry_s`, then ConnectionError. The server's
downstream codec must be none or fp16 (Python decodes those); ps mode (gradient steps) is not
handled here.
"""

import time

import grpc
import numpy as np

from tern.v1 import server_pb2, server_pb2_grpc
from tern_client import assemble, chunk_bundle, decode_dense, make_bundle, make_channel


class Client:
    """What a participant supplies. Not called concurrently."""

    def initial_parameters(self):
        """{name: array}: the model to start the run from, when the server has none yet."""
        raise NotImplementedError

    def fit(self, parameters, task):
        """Trains from `parameters` ({name: float32 array}) as `task` (server_pb2.Task) says;
        returns (new parameters {name: array}, examples trained on, mean training loss)."""
        raise NotImplementedError


class Aggregator:
    """One client's calls to the aggregator at `address`. `tls`: make_channel's arguments."""

    def __init__(self, address, tls=None, timeout=60.0, retry_s=60.0):
        self.channel = make_channel(address, **(tls or {}))
        self.stub = server_pb2_grpc.AggregatorStub(self.channel)
        self.timeout = timeout
        self.retry_s = retry_s
        self.client_id = None

    def _retrying(self, call):
        """`call()`, retried while the server is unreachable, for up to retry_s."""
        give_up = time.time() + self.retry_s
        while True:
            try:
                return call()
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() > give_up:
                    raise
                time.sleep(0.5)

    def join(self, run_id, name, num_samples):
        req = server_pb2.JoinRequest(run_id=run_id, name=name, num_samples=num_samples,
                                     client_id=-1 if self.client_id is None else self.client_id)
        reply = self._retrying(lambda: self.stub.Join(req, timeout=self.timeout))
        self.client_id = reply.client_id
        return reply

    def init_model(self, parameters):
        bundle = make_bundle(sorted(parameters.items()))
        reqs = [server_pb2.InitModelRequest(client_id=self.client_id, chunk=c)
                for c in chunk_bundle(bundle)]
        return self.stub.InitModel(iter(reqs), timeout=self.timeout)

    def fetch(self, max_wait_ms=10000):
        """(Task, {name: array} or None): the next task and, for TRAIN, the round's model."""
        req = server_pb2.FetchRequest(client_id=self.client_id, max_wait_ms=max_wait_ms,
                                      have_round=-1)

        def call():
            replies = list(self.stub.Fetch(req, timeout=self.timeout + max_wait_ms / 1000.0))
            if not replies or not replies[0].HasField("task"):
                raise ValueError("a Fetch reply without its task")
            return replies

        replies = self._retrying(call)
        task = replies[0].task
        if task.kind != server_pb2.Task.TRAIN:
            return task, None
        if task.payload != server_pb2.Task.MODEL:
            raise ValueError("the server sent downstream deltas; this client asks for the model")
        bundle = assemble(r.chunk for r in replies if r.HasField("chunk"))
        return task, {n.name: decode_dense(n.tensor) for n in bundle.tensors}

    def push(self, run_id, round_, update, weight, loss, seconds):
        bundle = make_bundle(sorted(update.items()), round_=round_)
        bundle.run_id = run_id
        info = server_pb2.UpdateInfo(client_id=self.client_id, round=round_, weight=weight,
                                     loss=loss, train_seconds=seconds)
        chunks = chunk_bundle(bundle)
        reqs = [server_pb2.UpdateRequest(info=info if i == 0 else None, chunk=c)
                for i, c in enumerate(chunks)]
        return self.stub.Push(iter(reqs), timeout=self.timeout)

    def leave(self):
        self.stub.Leave(server_pb2.LeaveRequest(client_id=self.client_id), timeout=self.timeout)


def _update(old, new):
    """new - old per tensor, checked against the round's layout."""
    if set(new) != set(old):
        raise ValueError("fit returned tensors %s; the run's model has %s" %
                         (sorted(new), sorted(old)))
    out = {}
    for name, before in old.items():
        after = np.asarray(new[name], dtype=np.float32)
        if after.shape != before.shape:
            raise ValueError("fit returned %s with shape %s; the run's is %s" %
                             (name, after.shape, before.shape))
        out[name] = after - before
    return out


def run(client, address, name="python", num_samples=1, run_id="tern", tls=None, timeout=60.0,
        log=lambda s: None):
    """Takes part in the run at `address` until it is over; returns the rounds trained."""
    agg = Aggregator(address, tls=tls, timeout=timeout)
    joined = agg.join(run_id, name, num_samples)
    if joined.mode not in ("federated", "local-sgd"):
        raise ValueError("this client trains federated and local-sgd rounds; the run is %r" %
                         joined.mode)
    log("joined as client %d (%s)" % (agg.client_id, joined.mode))
    if joined.model_needed:
        agg.init_model(client.initial_parameters())
    rounds = 0
    while True:
        task, params = agg.fetch()
        if task.kind == server_pb2.Task.DONE:
            agg.leave()
            return rounds
        if task.kind != server_pb2.Task.TRAIN:
            continue
        t0 = time.time()
        new, examples, loss = client.fit(params, task)
        update = _update(params, new)
        reply = agg.push(run_id, task.round, update, float(examples), float(loss),
                         time.time() - t0)
        rounds += 1
        log("round %d: loss %.4f, %s" %
            (task.round, loss, server_pb2.UpdateReply.Verdict.Name(reply.verdict)))
