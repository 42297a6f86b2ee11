"""pytest: tern.optim.OuterOptimizer (DiLoCo and its family around your own optimizer) against a
real `tern server --mode=local-sgd`: with plain averaging it is synchronous data-parallel SGD at
H = 1 and one site's own training at any H; DiLoCo's Nesterov step trains, and the update goes
in the run's codec; a server that is not an outer-step run is refused. Run by ctest (TERN_BIN);
skipped without Debian's torch or grpcio. Synthetic data: no dataset needed."""

import os
import signal
import subprocess
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("grpc")

import tern.federated  # noqa: E402
import test_support  # noqa: E402
from tern.optim import OuterOptimizer  # noqa: E402

TERN = os.environ.get("TERN_BIN", "")
if not TERN:
    pytest.skip("needs TERN_BIN", allow_module_level=True)

torch.manual_seed(0)
X = torch.randn(512, 8)
Y = X @ torch.randn(8, 1) + 0.1 * torch.randn(512, 1)


def model():
    torch.manual_seed(5)  # every site starts from the same values
    return torch.nn.Linear(8, 1)


def mlp():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def batch(rank, step):
    idx = torch.randint(0, len(X), (16,), generator=torch.Generator().manual_seed(rank * 1000 + step))
    return X[idx], Y[idx]


def start_server(flags, sites):
    d = tempfile.mkdtemp(prefix="tern-outer-")
    server = subprocess.Popen(
        [TERN, "server", "--listen=127.0.0.1:0", "--port_file=%s/port" % d,
         "--min_clients=%d" % sites, "--local_epochs=0", "--linger_s=60"] + list(flags),
        stdout=open(d + "/server.log", "w"), stderr=subprocess.STDOUT)
    return server, "127.0.0.1:%d" % test_support.wait_for_port(d + "/port")


def stop(server):
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)


def train_sites(address, sites, make_optimizer, steps, make_model=model, **kw):
    """Each site's loop, on its own thread: (its model, its losses)."""
    models = [make_model() for _ in range(sites)]  # here: seeding is not per thread

    def one(rank):
        m = models[rank]
        opt = OuterOptimizer(make_optimizer(m), m, address, name="s%d" % rank, timeout=30, **kw)
        losses = []
        for step in range(steps):
            x, y = batch(rank, step)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step(loss=loss.item())
            losses.append(loss.item())
            if opt.done:
                break
        assert opt.done, "the run should be over after its rounds"
        opt.close()
        return m, losses

    return test_support.run_in_threads(one, sites)


def global_model(address):
    m = model()
    g = tern.federated.Aggregator(address).global_model()
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(g["weight"]).reshape(m.weight.shape))
        m.bias.copy_(torch.from_numpy(g["bias"]).reshape(m.bias.shape))
    return m


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.05)


def test_average_at_h1_is_synchronous_data_parallel_sgd():
    """H = 1, outer lr 1, no momentum, an exact codec: x <- x - lr * mean of the sites' grads."""
    server, address = start_server(["--mode=local-sgd", "--rounds=4", "--local_steps=1",
                                    "--outer=average"], 2)
    try:
        train_sites(address, 2, sgd, 4)
        got = global_model(address)
    finally:
        stop(server)
    want = model()
    for step in range(4):
        want.zero_grad()
        sum(torch.nn.functional.mse_loss(want(x), y) / 2
            for x, y in (batch(0, step), batch(1, step))).backward()
        with torch.no_grad():
            for p in want.parameters():
                p -= 0.05 * p.grad
    for a, b in zip(got.parameters(), want.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_one_site_averaging_every_h_steps_trains_as_it_would_alone():
    server, address = start_server(["--mode=local-sgd", "--rounds=3", "--local_steps=5",
                                    "--outer=average"], 1)
    try:
        [(m, _)] = train_sites(address, 1, lambda m: torch.optim.Adam(m.parameters(), lr=0.01), 15)
        got = global_model(address)
    finally:
        stop(server)
    alone = model()
    opt = torch.optim.Adam(alone.parameters(), lr=0.01)
    for step in range(15):
        x, y = batch(0, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(alone(x), y).backward()
        opt.step()
    for a, b, c in zip(got.parameters(), alone.parameters(), m.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # Adam's state carried over rounds
        torch.testing.assert_close(c, b, rtol=0, atol=1e-5)


def test_diloco_with_4bit_outer_gradients_trains_and_sends_about_an_eighth():
    server, address = start_server(
        ["--mode=local-sgd", "--rounds=6", "--local_steps=10",
         "--outer=nesterov:lr=0.7,momentum=0.9", "--update_codec=fp4", "--error_feedback"], 2)
    try:
        out = train_sites(address, 2, lambda m: torch.optim.AdamW(m.parameters(), lr=0.02), 60,
                          make_model=mlp)
        status = tern.federated.Aggregator(address).stub.Status(
            tern.federated.server_pb2.StatusRequest(), timeout=10)
    finally:
        stop(server)
    for _, losses in out:
        assert len(losses) == 60
        assert sum(losses[-10:]) < 0.5 * sum(losses[:10]), losses
    if tern.native.library() is not None:  # without it updates go as fp32 (and say so)
        # 4.25 bits a value and each tensor's header: 0.14 of fp32 for this model.
        assert status.payload_bytes_up < 0.2 * status.dense_bytes_up, status


def test_a_server_that_is_not_an_outer_step_run_is_refused():
    server, address = start_server(["--mode=federated", "--rounds=1", "--clients_per_round=1",
                                    "--local_steps=1"], 1)
    try:
        m = model()
        with pytest.raises(ValueError, match="local-sgd"):
            OuterOptimizer(sgd(m), m, address, timeout=10)
    finally:
        stop(server)
