"""Decentralized training with your own optimizer: `DistributedOptimizer` wraps it.

    model = Net()                                   # the same initial values on every worker
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer = tern.optim.DistributedOptimizer(optimizer, model, worker="127.0.0.1:7000")
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()                            # your step, then tern mixes with neighbours

Each step() runs your optimizer on the local model, then hands the change it made to the
worker (`tern worker --trainer=external`, on this host), which applies it to its copy of the
model and mixes that with the neighbours' as its --algorithm and --codec say, and the model
takes the result. Your optimizer's state, LR schedulers, gradient clipping and AMP (bf16
autocast; a GradScaler too) stay yours. A model on a GPU is copied to and from the host each
step. Every floating dtype trains (fp32, fp16, bf16: the
worker keeps an fp32 copy, so small updates are not lost to rounding); floating buffers
(BatchNorm's running statistics) are mixed with the parameters; integer buffers stay local.

The worker must not add momentum of its own (start it with --momentum=0 for dmsgd, decentlam,
heavy-ball and choco; dpsgd has none): the wrapper refuses one that does. The exchange goes
through the worker's shared memory (docs/trainer-shm.md), so the worker must run on this host.

With `run_dir`, the optimizer keeps a run folder as `tern run` does (tern.runlog): log(test_acc=,
test_loss=, epoch=) at each evaluation adds a metrics.jsonl row with this worker's counters
(training loss since the last row, MB sent, time split), and close() writes report.html. One
folder per trainer process (runs/NAME/worker-0, ...), which `tern report` puts side by side
with `tern run`'s.
"""

import time

import torch

from tern.runlog import RunFolder, WorkerMetrics
from tern.trainer import Segment, TernTrainer
from tern.v1 import worker_pb2


def _named_state(model):
    """(name, tensor) of every parameter and floating buffer: what tern mixes."""
    named = list(model.named_parameters())
    named += [(n, b) for n, b in model.named_buffers() if torch.is_floating_point(b)]
    return named


class DistributedOptimizer:
    """Your `optimizer`, whose step() also mixes `model` with the neighbours' through the tern
    worker at `worker`. Not thread-safe (one training loop). Other attributes (param_groups,
    state, zero_grad, state_dict, ...) are the wrapped optimizer's, so LR schedulers and
    GradScaler take the wrapper as they take your optimizer.

    `tls`: tern.trainer.make_channel's arguments; `timeout`: seconds a step may take (the
    neighbours included) before step() raises TimeoutError. `run_dir`: a run folder to keep
    (see the module's comment); `run_config`: more of its run.json (tern.v1.RunConfig's
    fields: model, codec, lr, ...)."""

    # GradScaler.step(optimizer) then calls step(grad_scaler=...) even when the gradients
    # overflowed, so the round happens (with no local update) and neighbours are not kept
    # waiting for a step that never comes.
    _step_supports_amp_scaling = True

    def __init__(self, optimizer, model, worker, tls=None, timeout=300.0, run_dir=None,
                 run_config=None):
        self.optimizer = optimizer
        self.model = model
        self._trainer = TernTrainer(worker, timeout=timeout, tls=tls)
        self._named = _named_state(model)
        reply = self._trainer.register(self._named)
        if reply.momentum != 0:
            raise ValueError(
                "the worker's %s applies momentum %.3g to what it is given, on top of your "
                "optimizer's: start it with --momentum=0" % (reply.algorithm, reply.momentum))
        self.worker_id, self.num_workers = reply.worker_id, reply.num_workers
        self._step = reply.step
        info = self._trainer.stub.OpenSharedMemory(worker_pb2.OpenSharedMemoryRequest(),
                                                   timeout=timeout)
        self._segment = Segment(self._trainer, info)
        self._views, off = [], 0
        for name, t in self._named:
            k = t.numel()
            if off + k > self._segment.num_params:
                raise ValueError("the worker registered another model (%d values): %s does not "
                                 "fit" % (self._segment.num_params, name))
            self._views.append((t, self._segment.params[off:off + k].view(t.shape),
                                self._segment.grad[off:off + k].view(t.shape)))
            off += k
        if off != self._segment.num_params:
            raise ValueError("the model has %d values; the worker registered %d"
                             % (off, self._segment.num_params))
        self._load()  # a trainer that reconnects continues from the worker's model
        self.last_result = None
        self._folder = self._metrics = None
        if run_dir is not None:
            config = dict(mode="gossip", algorithm=reply.algorithm, workers=reply.num_workers,
                          optimizer=type(optimizer).__name__)
            config.update(run_config or {})
            self._folder = RunFolder(run_dir, **config)
            self._metrics = WorkerMetrics()

    def __getattr__(self, name):
        # Only for attributes not found on the wrapper: the wrapped optimizer's.
        if "optimizer" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["optimizer"], name)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def step_count(self):
        """Steps the worker has done (the next step's number)."""
        return self._step

    def zero_grad(self, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def step(self, closure=None, loss=None, grad_scaler=None):
        """Your optimizer's step, then one tern round; returns the closure's loss, if any.
        `loss` (a float or tensor) is only reported to the worker's metrics."""
        t0 = time.time()
        result = None
        if grad_scaler is None or not self._overflowed(grad_scaler):
            result = self.optimizer.step(closure) if closure is not None else self.optimizer.step()
        if loss is None and result is not None:
            loss = result
        with torch.no_grad():
            for t, x, d in self._views:
                # The worker's model minus yours: your update, in fp32 (a GPU tensor is copied
                # to the host, the worker's memory).
                torch.sub(x, t.detach().to("cpu"), out=d)
        self.last_result = self._segment.step(
            self._step, lr=1.0, loss=float(loss) if loss is not None else 0.0,
            compute_seconds=0.0)
        self._step += 1
        self._load()
        self.step_seconds = time.time() - t0
        return result

    def _overflowed(self, scaler):
        """Unscales (unless the caller did) and says whether the gradients overflowed."""
        from torch.cuda.amp.grad_scaler import OptState
        state = scaler._per_optimizer_states[id(self)]
        if state["stage"] is OptState.READY:
            scaler.unscale_(self)
        return sum(v.item() for v in state["found_inf_per_device"].values()) > 0

    def _load(self):
        with torch.no_grad():
            for t, x, _ in self._views:
                t.copy_(x)

    def log(self, **fields):
        """Adds a row to the run folder (run_dir): this worker's counters from the worker, the
        step, and `fields` (test_acc in [0, 1], test_loss, epoch, ...: tern.v1.MetricsRow's).
        Returns the row."""
        if self._folder is None:
            raise ValueError("log() needs a run folder: DistributedOptimizer(..., run_dir=...)")
        row = dict(step=self._step, workers=self.num_workers)
        row.update(self._metrics.fields(self._trainer.stats()))
        row.update(fields)
        return self._folder.row(**row)

    def close(self):
        """Lets go of the worker; with a run folder, writes its report.html (returns its path,
        or None)."""
        report = self._folder.close() if self._folder is not None else None
        self._segment.close()
        self._trainer.channel.close()
        return report
