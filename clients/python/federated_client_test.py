#!/usr/bin/python3
"""ctest: two PyTorch clients of a real `tern server` through tern.federated, in a federated run
(each round trains the round's model on the client's shard and pushes the change) and in a ps
run (each round one minibatch gradient): they join, one sends the initial model, the run closes
every round with both updates, the training loss falls and the global model classifies
Fashion-MNIST; and in a securely aggregated federated run (three clients through libtern_c.so's
SecAgg+ stages: the server only ever unmasks their sum). A fit that returns the wrong shapes gets
a clear ValueError. Exits 77 (skipped) without Debian's torch/grpcio or the dataset."""

import signal
import subprocess
import sys
import tempfile

import test_support

test_support.require_torch_and_data()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tern.federated as tern_federated  # noqa: E402
import tern.native as tern_native  # noqa: E402
import train_fashion_mnist as tfm  # noqa: E402
from tern.v1 import server_pb2  # noqa: E402
from tern.wire import assemble, decode_dense  # noqa: E402

TERN = sys.argv[1]
ROUNDS = {"federated": 6, "ps": 60, "secagg": 4}
CLIENTS = {"federated": 2, "ps": 2, "secagg": 3}  # a secure round needs three at least
FLAGS = {"federated": ["--mode=federated"], "ps": ["--mode=ps"],
         "secagg": ["--mode=federated", "--secagg", "--secagg_range=0.5"]}


class TorchClient(tern_federated.Client):
    def __init__(self, shard, seed):
        self.x, self.y = shard
        self.model = tfm.make_model(1)  # the same initial values everywhere
        self.gen = torch.Generator().manual_seed(seed)
        self.losses = []

    def initial_parameters(self):
        return {k: v.numpy() for k, v in self.model.state_dict().items()}

    def fit(self, parameters, task):
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in parameters.items()})
        opt = torch.optim.SGD(self.model.parameters(), lr=task.local.lr)
        losses = []
        for _ in range(task.local.local_steps):
            idx = torch.randint(0, len(self.x), (task.local.batch,), generator=self.gen)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.losses.append(float(np.mean(losses)))
        state = {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        return state, task.local.local_steps * task.local.batch, self.losses[-1]

    def gradient(self, parameters, task):
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in parameters.items()})
        self.model.zero_grad()
        idx = torch.randint(0, len(self.x), (task.gradient.batch,), generator=self.gen)
        loss = torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
        loss.backward()
        self.losses.append(loss.item())
        grads = {k: p.grad.numpy().copy() for k, p in self.model.named_parameters()}
        return grads, task.gradient.batch, loss.item()


def take_part(mode, d, x, y):
    """A run of `mode` with CLIENTS[mode] clients; returns them and the global model's test
    accuracy."""
    n = CLIENTS[mode]
    server = subprocess.Popen(
        [TERN, "server", "--listen=127.0.0.1:0", "--port_file=%s/%s.port" % (d, mode),
         "--run_id=py", *FLAGS[mode], "--rounds=%d" % ROUNDS[mode], "--min_clients=%d" % n,
         "--clients_per_round=%d" % n, "--local_epochs=0", "--local_steps=40", "--lr=0.1",
         "--batch=32", "--linger_s=60", "--log_level=info"],
        stdout=open("%s/%s.log" % (d, mode), "w"), stderr=subprocess.STDOUT)
    try:
        address = "127.0.0.1:%d" % test_support.wait_for_port("%s/%s.port" % (d, mode))
        clients = [TorchClient((x[i::n], y[i::n]), seed=i) for i in range(n)]
        rounds = test_support.run_in_threads(
            lambda i: tern_federated.run(clients[i], address, name="py-%d" % i,
                                         num_samples=len(clients[i].x), run_id="py",
                                         log=lambda s: print("[%s %d] %s" % (mode, i, s))), n)
        assert rounds == [ROUNDS[mode]] * n, rounds
        agg = tern_federated.Aggregator(address)
        st = agg.stub.Status(server_pb2.StatusRequest(), timeout=10)
        assert st.done and st.round == ROUNDS[mode], st
        if mode == "secagg":
            assert st.last_round_updates == n and st.secagg_failed_rounds == 0, st
        else:
            assert st.updates_accepted == n * ROUNDS[mode], st
        bundle = assemble(r.chunk for r in agg.stub.GetModel(server_pb2.GetModelRequest(),
                                                             timeout=10) if r.HasField("chunk"))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    model = tfm.make_model(1)
    model.load_state_dict({n.name: torch.from_numpy(decode_dense(n.tensor).copy())
                           for n in bundle.tensors})
    xt, yt = tfm.load("test", tfm.DATA)
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    return clients, acc


def main():
    torch.set_num_threads(1)
    d = tempfile.mkdtemp(prefix="tern-pyfed-")
    x, y = tfm.load("train", tfm.DATA)
    for mode, floor in (("federated", 0.65), ("ps", 0.55), ("secagg", 0.6)):
        if mode == "secagg" and tern_native.library() is None:
            # Without libtern_c.so (the ASan build turns it off) a Python client cannot mask:
            # each stops, saying why.
            try:
                take_part(mode, d, x, y)
                raise AssertionError("a client without libtern_c.so took part in secure rounds")
            except RuntimeError as e:
                assert isinstance(e.__cause__, ValueError), e
                assert "--secagg" in str(e.__cause__), e
            print("OK secagg: without libtern_c.so a client stops, naming --secagg")
            continue
        clients, acc = take_part(mode, d, x, y)
        # The loss falls (ps: first and last ten minibatches), the model learned.
        k = 10 if mode == "ps" else 1
        for c in clients:
            assert np.mean(c.losses[-k:]) < 0.8 * np.mean(c.losses[:k]), (mode, c.losses)
        assert acc > floor, (mode, acc)
        if mode == "secagg":
            log = open("%s/%s.log" % (d, mode)).read()
            for r in range(1, ROUNDS[mode] + 1):
                assert "round %d: unmasked the sum of 3 clients' masked updates" % r in log, log
        print("OK %s: %d rounds, client losses %.3f -> %.3f / %.3f -> %.3f, global model %.2f%%" %
              (mode, ROUNDS[mode], np.mean(clients[0].losses[:k]), np.mean(clients[0].losses[-k:]),
               np.mean(clients[1].losses[:k]), np.mean(clients[1].losses[-k:]), 100 * acc))
    # A fit that returns other shapes is told so, before anything is pushed.
    try:
        tern_federated._update({"0.weight": np.zeros((128, 784), np.float32)},
                               {"0.weight": np.zeros((128, 10), np.float32)})
        raise AssertionError("wrong shapes were taken")
    except ValueError as e:
        assert "shape" in str(e), e


if __name__ == "__main__":
    main()
