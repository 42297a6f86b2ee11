"""pytest: tern.embedded, a worker inside the trainer's process (libtern_embedded.so). Two
trainer processes with embedded workers gossip (CHOCO, top-k, overlap) and end bit for bit where
two `tern worker` processes driven through shared memory end, given the same gradients; bad
flags and misuse get clear errors. Run by ctest (TERN_BIN names the tern binary); skipped
without Debian's torch or the library (sanitized builds)."""

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("grpc")

import test_support  # noqa: E402
from tern import embedded  # noqa: E402

TERN = os.environ.get("TERN_BIN", "")
if not TERN or embedded.library() is None:
    pytest.skip("needs TERN_BIN and libtern_embedded.so (%s)" % embedded.where(),
                allow_module_level=True)

FLAGS = ["--algorithm=choco", "--codec=topk:ratio=0.25", "--consensus_step=0.5", "--overlap",
         "--round_timeout=60", "--log_level=warn"]
STEPS = 6


def model():
    torch.manual_seed(5)  # every worker starts from the same values
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def train(shared_step, m, rank):
    """STEPS steps of fixed gradients (different per rank); the final flat parameters."""
    n = sum(p.numel() for p in m.parameters())
    for step in range(STEPS):
        g = (0.1 * np.sin(np.arange(n) * 0.37 + 1.3 * step + rank)).astype(np.float32)
        off = 0
        for p in m.parameters():
            k = p.numel()
            p.grad.copy_(torch.from_numpy(g[off:off + k]).view(p.shape))
            off += k
        shared_step(step, loss=float(step), lr=0.1)
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().copy()


def child(rank, workers, workdir):
    """One trainer process with its embedded worker (run as `embedded_test.py child ...`)."""
    w = embedded.EmbeddedWorker(FLAGS + [
        "--id=%d" % rank, "--workers=%d" % workers, "--listen=127.0.0.1:0",
        "--port_file=%s/%d.port" % (workdir, rank), "--peers_file=%s/peers.txt" % workdir],
        timeout=60)
    m = model()
    shared = w.share(m)
    assert w.start_step == 0
    x = train(shared.step, m, rank)
    w.close()
    np.save("%s/embedded-%d.npy" % (workdir, rank), x)


def test_embedded_workers_end_where_worker_processes_end():
    n = 2
    with tempfile.TemporaryDirectory(prefix="tern-embedded-") as d:
        kids = [subprocess.Popen([sys.executable, __file__, "child", str(r), str(n), d],
                                 env=dict(os.environ), stdout=open("%s/child-%d.log" % (d, r), "w"),
                                 stderr=subprocess.STDOUT) for r in range(n)]
        try:
            ports = [test_support.wait_for_port("%s/%d.port" % (d, r)) for r in range(n)]
            with open(d + "/peers.tmp", "w") as f:
                f.write("".join("127.0.0.1:%d\n" % p for p in ports))
            os.rename(d + "/peers.tmp", d + "/peers.txt")
            codes = [k.wait(timeout=120) for k in kids]
        finally:
            for k in kids:
                if k.poll() is None:
                    k.kill()
        logs = [open("%s/child-%d.log" % (d, r)).read() for r in range(n)]
        assert codes == [0] * n, logs
        got = [np.load("%s/embedded-%d.npy" % (d, r)) for r in range(n)]

        os.mkdir(d + "/procs")
        addresses, procs = test_support.start_workers(TERN, d + "/procs", n, FLAGS)
        try:
            from tern.trainer import TernTrainer

            models = [model() for _ in range(n)]  # here: torch's seed is process-wide

            def drive(rank):
                t = TernTrainer(addresses[rank], timeout=60)
                m = models[rank]
                t.register(m.named_parameters())
                shared = t.share(m)
                try:
                    return train(shared.step, m, rank)
                finally:
                    shared.close()
            want = test_support.run_in_threads(drive, n)
        finally:
            test_support.stop_workers(procs)
    x0 = torch.cat([p.detach().reshape(-1) for p in model().parameters()]).numpy()
    for r in range(n):
        assert not np.array_equal(want[r], x0)  # it trained
        np.testing.assert_array_equal(got[r], want[r])
    assert not np.array_equal(got[0], got[1])  # each its own gradients, mixed


def test_bad_flags_and_misuse_get_clear_errors():
    with pytest.raises(ValueError, match="unknown flag --bogus"):
        embedded.EmbeddedWorker(["--bogus=1"])
    with pytest.raises(ValueError, match="--trainer does not apply"):
        embedded.EmbeddedWorker(["--trainer=builtin"])
    with pytest.raises(ValueError, match="not a --flag"):
        embedded.EmbeddedWorker(["workers=2"])
    w = embedded.EmbeddedWorker(["--workers=1", "--listen=127.0.0.1:0", "--log_level=warn"])
    try:
        assert w.port > 0
        with pytest.raises(RuntimeError, match="share"):
            w.step(0)
        m = model()
        shared = w.share(m)
        before = m[0].weight.detach().clone()
        for p in m.parameters():
            p.grad.fill_(1.0)
        r = shared.step(0, lr=0.5)
        assert r.step == 0
        # One worker, no neighbours: a plain SGD step on the parameters in place.
        assert torch.allclose(m[0].weight.detach(), before - 0.5)
        with pytest.raises(RuntimeError, match="once"):
            w.share(model())
    finally:
        w.close()
    # A parameter off the CPU (a GPU's; here torch's "meta" device, which every build has) or not
    # float32 is refused before the worker takes the model, not moved or cast behind the caller.
    w = embedded.EmbeddedWorker(["--workers=1", "--listen=127.0.0.1:0", "--log_level=warn"])
    try:
        off_cpu = torch.nn.Linear(3, 2, device="meta")
        with pytest.raises(TypeError, match="is on meta.*DistributedOptimizer"):
            w.share(off_cpu)
        assert off_cpu.weight.device.type == "meta"
        with pytest.raises(TypeError, match="float64"):
            w.share(torch.nn.Linear(3, 2).double())
        w.share(model())  # the refusals left the worker unregistered
    finally:
        w.close()


def test_buckets_go_out_during_backward():
    """With --bucket_mb each layer is a bucket, sent (and, alone, stepped) as soon as autograd
    has its gradient: while backward() computes the first layer's input gradient, the last layer
    already holds its step and the first does not; the step ends where plain SGD does."""
    w = embedded.EmbeddedWorker(["--workers=1", "--listen=127.0.0.1:0", "--log_level=warn",
                                 "--algorithm=choco", "--codec=none", "--momentum=0", "--lr=0.5",
                                 "--bucket_mb=0.00005"])
    try:
        m = model()
        shared = w.share(m)
        assert embedded.library().tern_worker_buckets(w._handle) == 2  # Linear(6,5), Linear(5,3)
        during = []
        # The first layer's output gets its gradient after the last layer's parameters got
        # theirs (autograd runs gradient accumulation first) and before the first layer's.
        def watch(module, inputs, out):
            out.register_hook(lambda g: during.append([p.detach().clone()
                                                       for p in m.parameters()]))
        m[0].register_forward_hook(watch)
        before = [p.detach().clone() for p in m.parameters()]
        for step in range(2):
            m.zero_grad(set_to_none=step == 1)  # the hook puts a dropped view back
            during.clear()
            x = torch.linspace(-1, 1, 12).view(2, 6) * (step + 1)
            m(x).square().sum().backward()
            grads = [p.grad.detach().clone() for p in m.parameters()]
            assert len(during) == 1
            for i in (2, 3):
                assert torch.allclose(during[0][i], before[i] - 0.5 * grads[i])
            for i in (0, 1):
                assert torch.equal(during[0][i], before[i])
            r = shared.step(step, loss=1.0)
            assert r.step == step
            for i, p in enumerate(m.parameters()):
                assert torch.allclose(p.detach(), before[i] - 0.5 * grads[i])
            before = [p.detach().clone() for p in m.parameters()]
    finally:
        w.close()


def test_buckets_skip_frozen_parameters():
    """A parameter without a gradient does not hold its bucket back: the last layer, frozen
    bias and all, is still sent during backward(); the frozen bias never moves."""
    w = embedded.EmbeddedWorker(["--workers=1", "--listen=127.0.0.1:0", "--log_level=warn",
                                 "--algorithm=choco", "--codec=none", "--momentum=0", "--lr=0.5",
                                 "--bucket_mb=0.00005"])
    try:
        m = model()
        m[2].bias.requires_grad_(False)
        shared = w.share(m)
        during = []

        def watch(module, inputs, out):
            out.register_hook(lambda g: during.append(m[2].weight.detach().clone()))
        m[0].register_forward_hook(watch)
        before = [p.detach().clone() for p in m.parameters()]
        m.zero_grad(set_to_none=False)
        m(torch.linspace(-1, 1, 12).view(2, 6)).square().sum().backward()
        g = m[2].weight.grad.detach().clone()
        assert torch.allclose(during[0], before[2] - 0.5 * g)
        shared.step(0)
        assert torch.equal(m[2].bias.detach(), before[3])
        assert not torch.equal(m[0].weight.detach(), before[0])
    finally:
        w.close()


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "child":
    child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
