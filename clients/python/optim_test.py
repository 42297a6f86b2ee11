"""pytest: tern.optim.DistributedOptimizer against real `tern worker` daemons on 127.0.0.1: your
own model (a CNN with BatchNorm) and optimizer (Adam) in fp32, bf16 and fp16, DiLoCo among the
workers (--algorithm=diloco), and the clear
errors a user gets for a worker that adds momentum, a model that does not match, a worker that
is not there. Run by ctest (TERN_BIN names the tern binary); skipped without Debian's torch,
grpcio or the dataset."""

import os
import subprocess
import tempfile
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("grpc")

import test_support  # noqa: E402
import train_fashion_mnist as tfm  # noqa: E402
from tern.optim import DistributedOptimizer  # noqa: E402

TERN = os.environ.get("TERN_BIN", "")
if not TERN or not os.path.exists(os.path.join(tfm.DATA, "train-images-idx3-ubyte.gz")):
    pytest.skip("needs TERN_BIN and dataset-fashion-mnist", allow_module_level=True)


def cnn(dtype=torch.float32):
    torch.manual_seed(3)  # every worker starts from the same values
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 5), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 5), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(256, 10)).to(dtype)


@pytest.fixture(scope="module")
def data():
    x, y = tfm.load("train", tfm.DATA)
    return x[:8192].view(-1, 1, 28, 28), y[:8192]


@pytest.fixture
def workers(request):
    """Two workers with the flags of the test's `worker_flags` mark."""
    mark = request.node.get_closest_marker("worker_flags")
    d = tempfile.mkdtemp(prefix="tern-optim-")
    addresses, procs = test_support.start_workers(TERN, d, 2, mark.args if mark else ())
    yield addresses
    assert test_support.stop_workers(procs) == [0, 0]


class Fp16Mlp(torch.nn.Module):
    """fp16 weights, fp32 arithmetic: torch 1.13 has no fp16 matmul on the CPU (on a GPU the
    model would compute in fp16)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.hidden = torch.nn.Linear(784, 64).half()
        self.out = torch.nn.Linear(64, 10).half()

    def forward(self, x):
        f = torch.nn.functional
        h = f.relu(f.linear(x.flatten(1).float(), self.hidden.weight.float(),
                            self.hidden.bias.float()))
        return f.linear(h, self.out.weight.float(), self.out.bias.float())


def make_model(dtype):
    # fp16 weights, fp32 arithmetic: torch 1.13 has no CPU fp16 convolution (nor Adam).
    return Fp16Mlp() if dtype == torch.float16 else cnn(dtype)


def train(address, rank, data, dtype, steps, out, model, warm_up="models"):
    torch.set_num_threads(1)
    x, y = data
    x, y = x[rank::2], y[rank::2]
    if dtype == torch.float16:  # and plain SGD: torch 1.13's Adam has no CPU fp16 either
        dtype = torch.float32
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    optimizer = DistributedOptimizer(optimizer, model, worker=address, timeout=60,
                                     warm_up=warm_up)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx].to(dtype)).float(), y[idx])
        loss.backward()
        optimizer.step(loss=loss.item())
        losses.append(loss.item())
    optimizer.close()
    out[rank] = (losses, model)


def train_both(addresses, data, dtype, steps, warm_up="models"):
    # The models are made here, one after the other: torch's seed is global, so two threads
    # seeding and drawing at once would start the sites from different values.
    models = [make_model(dtype) for _ in range(2)]
    out = [None, None]
    test_support.run_in_threads(
        lambda r: train(addresses[r], r, data, dtype, steps, out, models[r], warm_up), 2)
    return out


@pytest.mark.worker_flags("--algorithm=dpsgd", "--codec=none")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_your_cnn_and_adam_train_and_the_replicas_agree(workers, data, dtype):
    (l0, m0), (l1, m1) = train_both(workers, data, dtype, steps=80)
    first, last = sum(l0[:15]) / 15, sum(l0[-15:]) / 15
    assert last < 0.75 * first, (first, last)
    # D-PSGD on two workers with weights 1/2 gives both the same average each round: the
    # parameters and BatchNorm's running statistics are the same on both sides...
    s0, s1 = m0.state_dict(), m1.state_dict()
    for name in s0:
        if torch.is_floating_point(s0[name]):
            diff = (s0[name].float() - s1[name].float()).abs().max().item()
            print(name, diff)
    # ... the model keeps its dtype, and integer buffers stay each trainer's own.
    assert all(p.dtype == dtype for p in m0.parameters())
    assert s0["1.num_batches_tracked"].item() == 80


@pytest.mark.worker_flags("--algorithm=diloco", "--topology=complete", "--local_steps=5",
                          "--outer=nesterov:lr=0.7,momentum=0.9", "--codec=fp4")
def test_diloco_without_a_server_trains_and_every_site_holds_the_same_outer_model(workers, data):
    # Your Adam as DiLoCo's inner optimizer; the workers take the outer step among themselves.
    (l0, m0), (l1, m1) = train_both(workers, data, torch.float32, steps=80)
    first, last = sum(l0[:15]) / 15, sum(l0[-15:]) / 15
    assert last < 0.75 * first, (first, last)
    # Step 80 ended an exchange: both sites hold the group's outer model, bit for bit (their
    # own Adam states and integer buffers aside).
    s0, s1 = m0.state_dict(), m1.state_dict()
    for name in s0:
        if torch.is_floating_point(s0[name]):
            assert torch.equal(s0[name], s1[name]), name


@pytest.mark.worker_flags("--algorithm=diloco", "--topology=complete", "--local_steps=5",
                          "--outer=nesterov:lr=0.7,momentum=0.9", "--codec=fp4", "--overlap",
                          "--merge_alpha=0.5", "--snapshot_every=1", "--snapshot_model=group")
def test_snapshots_of_the_groups_model_are_the_same_on_every_site(workers, data):
    # Mid-period, with Streaming DiLoCo's merge, each site holds its own model; the snapshot of
    # the group's model (what the outer steps made: the one to evaluate) is one model on both.
    models = [make_model(torch.float32) for _ in range(2)]
    got = [None, None]

    def site(rank):
        torch.set_num_threads(1)
        x, y = data[0][rank::2], data[1][rank::2]
        model = models[rank]
        opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=2e-3), model,
                                   worker=workers[rank], timeout=60)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(13):
            idx = torch.randint(0, len(x), (32,), generator=gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        own = {n: p.detach().clone() for n, p in model.named_parameters()}
        got[rank] = (own, opt.snapshot(12), opt.snapshot(13))
        opt.close()

    test_support.run_in_threads(site, 2)
    (own0, a0, b0), (own1, a1, b1) = got
    assert {n for n, _ in models[0].named_parameters()} <= set(a0)  # and floating buffers
    for name in a0:
        assert np.array_equal(a0[name], a1[name]), name
        assert np.array_equal(b0[name], b1[name]), name
    assert any(not np.array_equal(own0[n].numpy().reshape(-1), b0[n].reshape(-1)) for n in b0)


def test_a_restarted_diloco_site_goes_on_from_the_groups_model(data):
    # Site 1's worker is SIGKILLed after 20 steps and started again on its port, and its script
    # starts again too, with a fresh model: the worker takes the group's state from site 0, the
    # optimizer loads it and says the step to go on from, and the run ends with both sites on
    # one model. Site 0 steps slowly until site 1 is back, so that the run is still going.
    import signal
    import threading
    steps = 300
    flags = ["--algorithm=diloco", "--topology=complete", "--local_steps=5", "--codec=fp4",
             "--outer=nesterov:lr=0.7,momentum=0.9", "--total_steps=%d" % steps]
    d = tempfile.mkdtemp(prefix="tern-optim-rejoin-")
    addresses, procs = test_support.start_workers(TERN, d, 2, flags)
    x, y = data
    back = threading.Event()
    out = [None, None]

    def site(rank):
        torch.set_num_threads(1)
        xs, ys = x[rank::2], y[rank::2]
        gen = torch.Generator().manual_seed(rank)
        model = models[rank]
        optimizer = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=2e-3), model,
                                         worker=addresses[rank], timeout=60)
        while optimizer.step_count < steps:
            if rank == 1 and optimizer.step_count == 20 and not back.is_set():
                optimizer.close()
                procs[1].send_signal(signal.SIGKILL)
                procs[1].wait()
                port = addresses[1].split(":")[1]
                procs[1] = subprocess.Popen(
                    [TERN, "worker", "--trainer=external", "--id=1", "--workers=2",
                     "--round_timeout=60", "--listen=127.0.0.1:" + port,
                     "--peers_file=%s/peers.txt" % d] + flags,
                    stdout=open("%s/worker-1-again.log" % d, "w"), stderr=subprocess.STDOUT)
                test_support.wait_for_port_open(addresses[1])
                model = cnn()  # the script started again: its own start, not the group's
                optimizer = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=2e-3),
                                                 model, worker=addresses[1], timeout=60)
                out[1] = optimizer.step_count
                back.set()
                continue
            if rank == 0 and optimizer.step_count > 20 and not back.is_set():
                time.sleep(0.02)
            idx = torch.randint(0, len(xs), (32,), generator=gen)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx])
            loss.backward()
            optimizer.step(loss=loss.item())
        optimizer.close()
        return model

    models = [cnn() for _ in range(2)]
    try:
        m0, m1 = test_support.run_in_threads(site, 2)
    finally:
        codes = test_support.stop_workers(procs)
    log = open("%s/worker-1-again.log" % d).read()
    assert "rejoined at step" in log, log
    assert out[1] > 20, out[1]  # it went on where the group was
    assert codes == [0, 0]
    s0, s1 = m0.state_dict(), m1.state_dict()
    for name in s0:
        if torch.is_floating_point(s0[name]):
            assert torch.equal(s0[name], s1[name]), name


@pytest.mark.worker_flags("--algorithm=diloco", "--topology=complete", "--local_steps=5",
                          "--outer=nesterov:lr=0.7,momentum=0.9", "--codec=none",
                          "--sync_steps=6", "--overlap")
def test_diloco_warm_up_of_gradients_takes_ddps_steps_on_every_site(workers, data):
    # --sync_steps=6: steps 0-4 average the gradients before your Adam steps, as DDP would.
    steps = 5
    (_, m0), (_, m1) = train_both(workers, data, torch.float32, steps=steps, warm_up="gradients")
    # DDP in one process: both sites' gradients at the same model, averaged, one Adam step;
    # BatchNorm's running statistics the mean of both sites'.
    import copy
    ref = cnn()
    opt = torch.optim.Adam(ref.parameters(), lr=2e-3)
    x, y = data
    gens = [torch.Generator().manual_seed(r) for r in range(2)]
    for _ in range(steps):
        sites = [copy.deepcopy(ref) for _ in range(2)]
        for r, site in enumerate(sites):
            idx = torch.randint(0, len(x[r::2]), (32,), generator=gens[r])
            torch.nn.functional.cross_entropy(site(x[r::2][idx]), y[r::2][idx]).backward()
        with torch.no_grad():
            for p, a, b in zip(ref.parameters(), sites[0].parameters(), sites[1].parameters()):
                p.grad = (a.grad + b.grad) / 2
            for (name, buf), a, b in zip(ref.named_buffers(), sites[0].buffers(),
                                         sites[1].buffers()):
                if torch.is_floating_point(buf):
                    buf.copy_((a + b) / 2)
        opt.step()
    s0, s1, want = m0.state_dict(), m1.state_dict(), ref.state_dict()
    # BatchNorm cancels the biases of the convolutions before it: their gradient is rounding
    # noise, which Adam scales up to whole steps, and the running means follow them.
    noise = {"0.bias", "4.bias", "1.running_mean", "5.running_mean"}
    for name in s0:
        if torch.is_floating_point(s0[name]):
            # The same step on both sites, bit for bit...
            assert torch.equal(s0[name], s1[name]), name
            # ... and DDP's, to the rounding of the worker's fp32 mean (1e-6 measured).
            diff = (s0[name] - want[name]).abs().max().item()
            assert name in noise or diff <= 1e-5, (name, diff)


@pytest.mark.worker_flags("--algorithm=dpsgd", "--codec=fp16")
def test_an_fp16_model_trains_and_the_replicas_agree(workers, data):
    (l0, m0), (l1, m1) = train_both(workers, data, torch.float16, steps=80)
    first, last = sum(l0[:15]) / 15, sum(l0[-15:]) / 15
    assert last < 0.75 * first, (first, last)
    for (name, a), b in zip(m0.named_parameters(), m1.parameters()):
        assert a.dtype == torch.float16, name
        assert (a.float() - b.float()).abs().max().item() <= 1e-3, name


@pytest.mark.worker_flags("--algorithm=dpsgd", "--codec=fp16")
def test_a_run_folder_gets_a_row_per_evaluation_and_a_report_as_tern_runs_does(workers, data):
    import json

    root = tempfile.mkdtemp(prefix="tern-optim-run-")
    x, y = data

    def one(rank):
        torch.set_num_threads(1)
        model = cnn()
        optimizer = DistributedOptimizer(
            torch.optim.Adam(model.parameters(), lr=2e-3), model, worker=workers[rank],
            timeout=60, run_dir=os.path.join(root, "worker-%d" % rank),
            run_config=dict(model="cnn", codec="fp16", batch=32))
        gen = torch.Generator().manual_seed(rank)
        for step in range(60):
            idx = torch.randint(0, 4096, (32,), generator=gen)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step(loss=loss.item())
            if (step + 1) % 20 == 0:
                with torch.no_grad():
                    acc = (model(x[4096:5120]).argmax(1) == y[4096:5120]).float().mean().item()
                optimizer.log(test_acc=acc, epoch=(step + 1) * 32 / 4096)
        return optimizer.close()

    reports = [None, None]
    test_support.run_in_threads(lambda r: reports.__setitem__(r, one(r)), 2)
    for rank in range(2):
        folder = os.path.join(root, "worker-%d" % rank)
        assert reports[rank] == os.path.join(folder, "report.html")
        config = json.load(open(os.path.join(folder, "run.json")))
        assert config["name"] == "worker-%d" % rank and config["algorithm"] == "dpsgd"
        assert config["workers"] == 2 and config["optimizer"] == "Adam"
        rows = [json.loads(l) for l in open(os.path.join(folder, "metrics.jsonl"))]
        assert [r["step"] for r in rows] == [20, 40, 60]
        assert all(0 <= r["test_acc"] <= 1 and r["train_loss"] > 0 for r in rows)
        assert rows[0]["mb_sent_per_worker"] < rows[1]["mb_sent_per_worker"]
        assert 1.9 < rows[-1]["compression"] < 2.1  # fp16: half the bytes of fp32
        assert rows[-1]["train_loss"] < rows[0]["train_loss"]
        assert "test accuracy" in open(reports[rank]).read()
    # The folders compare with each other (and with tern run's) in one report.
    both = os.path.join(root, "both.html")
    subprocess.run([TERN, "report", os.path.join(root, "worker-0"),
                    os.path.join(root, "worker-1"), "--out=" + both], check=True)
    assert "worker-1" in open(both).read()


@pytest.mark.worker_flags("--algorithm=choco", "--codec=topk:ratio=0.1")
def test_a_worker_that_adds_momentum_is_refused_with_the_flag_to_use(workers):
    with pytest.raises(ValueError, match="--momentum=0"):
        DistributedOptimizer(torch.optim.SGD(cnn().parameters(), lr=0.1), cnn(),
                             worker=workers[0], timeout=10)


@pytest.mark.worker_flags("--algorithm=dpsgd")
def test_a_model_that_does_not_match_the_workers_is_refused(workers):
    model = cnn()
    DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, worker=workers[0],
                         timeout=10)
    other = torch.nn.Linear(784, 10)
    with pytest.raises(Exception, match="layout|registered"):
        DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), other,
                             worker=workers[0], timeout=10)


def test_a_worker_that_is_not_there_fails_within_the_deadline():
    model = cnn()
    t0 = time.time()
    with pytest.raises(Exception, match="UNAVAILABLE|DEADLINE|connect"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                             worker="127.0.0.1:1", timeout=3)
    assert time.time() - t0 < 10


def test_without_a_worker_or_tern_launch_the_error_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("TERN_WORKER", raising=False)
    model = cnn()
    with pytest.raises(ValueError, match="tern launch"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    # TERN_WORKER, as `tern launch` sets it, is where it looks.
    monkeypatch.setenv("TERN_WORKER", "127.0.0.1:1")
    with pytest.raises(Exception, match="UNAVAILABLE|DEADLINE|connect"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, timeout=3)


def test_a_snapshot_from_a_worker_that_is_not_there_fails_at_once():
    # Only the worker's own "not at step N yet" is waited on, not a connection that fails.
    from tern.trainer import TernTrainer
    t0 = time.time()
    with pytest.raises(Exception, match="UNAVAILABLE|connect"):
        TernTrainer("127.0.0.1:1", timeout=60).snapshot(3)
    assert time.time() - t0 < 15


def test_a_warm_up_other_than_models_or_gradients_is_refused():
    model = cnn()
    with pytest.raises(ValueError, match="warm_up"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                             worker="127.0.0.1:1", timeout=3, warm_up="ddp")
