"""pytest: tern.federated.TorchClient against a real `tern server`: a bf16 CNN with BatchNorm and
Adam and an fp16-weight model train in a federated run, keep their dtypes, and the server's
global model is what load_global_model gives back. Run by ctest (TERN_BIN)."""

import os
import signal
import subprocess
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("grpc")

import optim_test  # noqa: E402 (its models; skips as it does)
import tern.federated  # noqa: E402
import test_support  # noqa: E402

ROUNDS, LOCAL_STEPS = 4, 15


def run_federated(make_model, make_optimizer, data, dtype, flags=(), logs=None, run_dirs=None):
    """A federated run of two TorchClients against a real server with extra `flags`; each
    client's log lines go to logs[rank] when given, its run folder to run_dirs[rank]. Returns ([(rounds, losses, model)] per
    client, the global model, the server's status)."""
    d = tempfile.mkdtemp(prefix="tern-fedtorch-")
    server = subprocess.Popen(
        [optim_test.TERN, "server", "--listen=127.0.0.1:0", "--port_file=%s/port" % d,
         "--mode=federated", "--rounds=%d" % ROUNDS, "--min_clients=2", "--clients_per_round=2",
         "--local_epochs=0", "--local_steps=%d" % LOCAL_STEPS, "--linger_s=60", "--eval_every=2"]
        + list(flags),
        stdout=open(d + "/server.log", "w"), stderr=subprocess.STDOUT)
    address = "127.0.0.1:%d" % test_support.wait_for_port(d + "/port")

    def one(rank):
        x, y = data[0][:4096][rank::2], data[1][:4096][rank::2]
        model = make_model()
        optimizer = make_optimizer(model)
        gen = torch.Generator().manual_seed(rank)
        losses = []

        def train(steps):
            for _ in range(steps):
                idx = torch.randint(0, len(x), (32,), generator=gen)
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x[idx].to(dtype)).float(),
                                                         y[idx])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            return steps * 32, sum(losses[-steps:]) / steps

        xe, ye = data[0][4096 + rank:4096 + 1000:2], data[1][4096 + rank:4096 + 1000:2]

        def evaluate():  # held-out: examples this client does not train on
            with torch.no_grad():
                model.eval()
                out = model(xe.to(dtype)).float()
                model.train()
                return (torch.nn.functional.cross_entropy(out, ye).item(),
                        (out.argmax(1) == ye).float().mean().item(), len(ye))

        rounds = tern.federated.run(tern.federated.TorchClient(model, train, evaluate),
                                    address, name="c%d" % rank, num_samples=len(x),
                                    timeout=30,
                                    log=(logs[rank].append if logs else lambda s: None),
                                    run_dir=run_dirs[rank] if run_dirs else None)
        return rounds, losses, model

    try:
        out = test_support.run_in_threads(one, 2)
        final = make_model()
        tern.federated.load_global_model(final, address)
        status = tern.federated.Aggregator(address).stub.Status(
            tern.federated.server_pb2.StatusRequest(), timeout=10)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    # Federated evaluation (--eval_every=2): the last round's, of both clients' 500 examples.
    assert status.eval_round == ROUNDS and status.eval_clients == 2, status
    assert status.eval_examples == 1000 and 0 < status.eval_accuracy <= 1, status
    return out, final, status


def test_a_bf16_cnn_with_batchnorm_and_adam_trains_federated():
    data = optim_test.tfm.load("train", optim_test.tfm.DATA)
    data = (data[0][:8192].view(-1, 1, 28, 28), data[1][:8192])
    out, final, _ = run_federated(lambda: optim_test.cnn(torch.bfloat16),
                               lambda m: torch.optim.Adam(m.parameters(), lr=2e-3), data,
                               torch.bfloat16)
    for rounds, losses, model in out:
        assert rounds == ROUNDS
        assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:10]) / 10
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    # The global model came back whole: BatchNorm statistics moved off their initial values.
    assert final[1].running_mean.abs().sum().item() > 0
    assert final[1].weight.dtype == torch.bfloat16


def test_an_fp16_model_trains_federated_and_each_client_keeps_a_run_folder():
    import json

    data = optim_test.tfm.load("train", optim_test.tfm.DATA)
    data = (data[0][:8192], data[1][:8192])
    root = tempfile.mkdtemp(prefix="tern-fedtorch-runs-")
    dirs = [os.path.join(root, "c%d" % rank) for rank in range(2)]
    out, final, _ = run_federated(optim_test.Fp16Mlp,
                               lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                               data, torch.float32, run_dirs=dirs)
    for rounds, losses, model in out:
        assert rounds == ROUNDS
        assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:10]) / 10
        assert all(p.dtype == torch.float16 for p in model.parameters())
    assert final.hidden.weight.dtype == torch.float16
    # Each client's folder: its rounds, the evaluations it made (--eval_every=2), its bytes up
    # and down so far, and the report tern report renders from them.
    for d in dirs:
        config = json.load(open(os.path.join(d, "run.json")))
        assert config["mode"] == "federated" and config["name"] == os.path.basename(d)
        rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
        assert len(rows) == ROUNDS and rows[-1]["updates_accepted"] == ROUNDS, rows
        assert all(r["train_loss"] > 0 and r["payload_mb_down"] > 0 for r in rows)
        assert [r["round"] for r in rows if "test_acc" in r] == [2, 4], rows
        assert all(a["mb_sent_per_worker"] < b["mb_sent_per_worker"]
                   for a, b in zip(rows, rows[1:]))
        assert os.path.exists(os.path.join(d, "report.html"))


def mnist_flat():
    data = optim_test.tfm.load("train", optim_test.tfm.DATA)
    return data[0][:8192], data[1][:8192]


def test_updates_go_in_the_runs_codec_and_the_model_comes_back_as_deltas():
    """Through tern.native: top-k 5 % updates with error feedback up, top-k 10 % deltas down;
    both clients' copies pass the server's CRC every round (never asking for the model)."""
    if os.environ.get("TERN_LIBRARY") == "none":
        pytest.skip("a sanitized build's libtern_c.so cannot load into Debian's Python")
    assert tern.native.library() is not None, "libtern_c.so: %s" % tern.native.where()
    logs = [[], []]
    out, final, status = run_federated(
        optim_test.Fp16Mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        mnist_flat(), torch.float32, logs=logs,
        flags=["--update_codec=topk:ratio=0.05", "--error_feedback", "--downstream=delta",
               "--downstream_codec=topk:ratio=0.1"])
    for rounds, losses, _ in out:
        assert rounds == ROUNDS
        assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:10]) / 10
    # Top-k 5 % sends values and positions: about a tenth of fp32.
    assert status.payload_bytes_up < 0.15 * status.dense_bytes_up, status
    assert status.payload_bytes_down < 0.5 * status.dense_bytes_down, status
    for lines in logs:
        assert not [s for s in lines if "asking for the model" in s or "fp32" in s], lines


def test_without_the_library_updates_go_as_fp32_and_the_model_whole(monkeypatch):
    monkeypatch.setattr(tern.native, "_loaded", (None, ["(none, for the test)"]))
    logs = [[], []]
    out, final, status = run_federated(
        optim_test.Fp16Mlp, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        mnist_flat(), torch.float32, logs=logs, flags=["--update_codec=topk:ratio=0.05"])
    for rounds, losses, _ in out:
        assert rounds == ROUNDS
        assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:10]) / 10
    assert status.payload_bytes_up == status.dense_bytes_up, status
    for lines in logs:
        assert any("libtern_c.so not found" in s for s in lines), lines
        assert any("updates go as fp32" in s for s in lines), lines


@pytest.mark.parametrize("library", ["native", "none"])
def test_a_model_that_does_not_match_the_servers_raises_within_the_deadline(monkeypatch,
                                                                            library):
    if library == "none":
        monkeypatch.setattr(tern.native, "_loaded", (None, ["(none, for the test)"]))
    d = tempfile.mkdtemp(prefix="tern-fedtorch-")
    server = subprocess.Popen(
        [optim_test.TERN, "server", "--listen=127.0.0.1:0", "--port_file=%s/port" % d,
         "--mode=federated", "--rounds=2", "--min_clients=2", "--clients_per_round=2",
         "--local_epochs=0", "--local_steps=1", "--linger_s=5"],
        stdout=open(d + "/server.log", "w"), stderr=subprocess.STDOUT)
    try:
        address = "127.0.0.1:%d" % test_support.wait_for_port(d + "/port")
        # Another participant gave the server its model: an MLP.
        other = tern.federated.Aggregator(address, timeout=10)
        other.join("tern", "mlp", 1)
        other.init_model(tern.federated._state(optim_test.Fp16Mlp()))
        # This one brings a CNN.
        started = time.time()
        with pytest.raises(ValueError, match="initial_parameters"):
            tern.federated.run(
                tern.federated.TorchClient(optim_test.cnn(torch.float32), lambda steps: (1, 0.0)),
                address, name="cnn", timeout=10)
        assert time.time() - started < 20
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def test_an_address_list_is_one_target_the_channel_walks_in_order():
    # An aggregator and its standby (tern server --standby): the channel reaches the first that
    # answers, as the C++ clients' --server=A,B does (core/rpc/channel.h).
    from tern.wire import channel_target
    assert channel_target("127.0.0.1:7000") == "127.0.0.1:7000"
    assert channel_target("localhost:7000, 127.0.0.1:7001") == "ipv4:127.0.0.1:7000,127.0.0.1:7001"
    assert channel_target("[::1]:7000,[::1]:7001") == "ipv6:[::1]:7000,[::1]:7001"
    assert channel_target("127.0.0.1:7000,no-such-host.invalid:1") == "ipv4:127.0.0.1:7000"
