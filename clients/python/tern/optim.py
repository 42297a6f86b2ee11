"""Training with your own optimizer: `DistributedOptimizer` wraps it for decentralized training
(gossip through a tern worker), `OuterOptimizer` for outer-step training (DiLoCo, SlowMo,
SparseLoCo, local SGD) through a tern aggregator (at the end of this file).

    model = Net()                                   # the same initial values on every worker
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer = tern.optim.DistributedOptimizer(optimizer, model, worker="127.0.0.1:7000")
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()                            # your step, then tern mixes with neighbours

Started by `tern launch --rdzv=HOST:PORT --nnodes=N -- python3 train.py` (the same command on
every host; it starts the worker beside the script), `worker` can be left out: the launcher
says where its worker is in TERN_WORKER, and optimizer.worker_id / num_workers say which of how
many this script is.

Each step() runs your optimizer on the local model, then hands the change it made to the
worker (`tern worker --trainer=external`, on this host), which applies it to its copy of the
model and mixes that with the neighbours' as its --algorithm and --codec say, and the model
takes the result. Your optimizer's state, LR schedulers, gradient clipping and AMP (bf16
autocast; a GradScaler too) stay yours. A model on a GPU is copied to and from the host each
step. Every floating dtype trains (fp32, fp16, bf16: the
worker keeps an fp32 copy, so small updates are not lost to rounding); floating buffers
(BatchNorm's running statistics) are mixed with the parameters; integer buffers stay local.

With a diloco worker's synchronous warm-up (`--sync_steps=N`), every warm-up step averages the
sites' models after your optimizer's step; with warm_up="gradients" the steps before the N-th
average the sites' gradients before it instead, as DDP does (the worker mixes each of them at
once, --overlap or not), so every site takes the same step from the same state, and the N-th
averages the models, which starts the outer loop from the group's model.

The worker must not add momentum of its own (start it with --momentum=0 for dmsgd, decentlam,
heavy-ball and choco; dpsgd has none): the wrapper refuses one that does. The exchange goes
through the worker's shared memory (docs/trainer-shm.md), so the worker must run on this host.

With `run_dir`, the optimizer keeps a run folder as `tern run` does (tern.runlog): log(test_acc=,
test_loss=, epoch=) at each evaluation adds a metrics.jsonl row with this worker's counters
(training loss since the last row, MB sent, time split), and close() writes report.html. One
folder per trainer process (runs/NAME/worker-0, ...), which `tern report` puts side by side
with `tern run`'s.
"""

import os
import time

import numpy as np
import torch

from tern.runlog import RunFolder, WorkerMetrics
from tern.trainer import Segment, TernTrainer
from tern.v1 import worker_pb2


def _named_state(model):
    """(name, tensor) of every parameter and floating buffer: what tern mixes."""
    named = list(model.named_parameters())
    named += [(n, b) for n, b in model.named_buffers() if torch.is_floating_point(b)]
    return named


class _Wrapper:
    """What both wrappers share: everything not found on the wrapper is the wrapped optimizer's
    (param_groups, state, zero_grad, state_dict, ...), so LR schedulers and GradScaler take the
    wrapper as they take your optimizer."""

    # GradScaler.step(optimizer) then calls step(grad_scaler=...) even when the gradients
    # overflowed, so the exchange happens (with no local update) and nobody is kept waiting for
    # a step that never comes.
    _step_supports_amp_scaling = True

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

    def zero_grad(self, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def _inner_step(self, closure, grad_scaler):
        """Your optimizer's step, unless the GradScaler found the gradients overflowed."""
        if grad_scaler is not None and self._overflowed(grad_scaler):
            return None
        return self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def _overflowed(self, scaler):
        """Unscales (unless the caller did) and says whether the gradients overflowed."""
        from torch.cuda.amp.grad_scaler import OptState
        state = scaler._per_optimizer_states[id(self)]
        if state["stage"] is OptState.READY:
            scaler.unscale_(self)
        return sum(v.item() for v in state["found_inf_per_device"].values()) > 0


class DistributedOptimizer(_Wrapper):
    """Your `optimizer`, whose step() also mixes `model` with the neighbours' through the tern
    worker at `worker` ("HOST:PORT"; by default the TERN_WORKER variable, which `tern launch`
    sets for the script it starts). Not thread-safe (one training loop). Other attributes
    (param_groups, state, zero_grad, state_dict, ...) are the wrapped optimizer's (_Wrapper).
    worker_id and num_workers say which worker of how many this is (a script's data shard).

    `tls`: tern.trainer.make_channel's arguments; `timeout`: seconds a step may take (the
    neighbours included) before step() raises TimeoutError. `warm_up`: how the steps of a diloco
    worker's --sync_steps go: "models" (your step, then the sites' models averaged) or
    "gradients" (the sites' gradients averaged before your step, as DDP; docs/worker.md says
    which was quicker where). `run_dir`: a run folder to keep
    (see the module's comment); `run_config`: more of its run.json (tern.v1.RunConfig's
    fields: model, codec, lr, ...)."""

    def __init__(self, optimizer, model, worker=None, tls=None, timeout=300.0, run_dir=None,
                 run_config=None, warm_up="models"):
        worker = worker or os.environ.get("TERN_WORKER")
        if not worker:
            raise ValueError("no worker: give DistributedOptimizer worker='HOST:PORT', or start "
                             "the script under `tern launch`, which sets TERN_WORKER")
        if warm_up not in ("gradients", "models"):
            raise ValueError("warm_up is 'gradients' or 'models', not %r" % (warm_up,))
        self._warm_up = warm_up
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
        self._sync_steps = reply.sync_steps
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

    @property
    def warm_up_steps(self):
        """The worker's --sync_steps: diloco's synchronous warm-up (0: none)."""
        return self._sync_steps

    @property
    def step_count(self):
        """Steps the worker has done (the next step's number)."""
        return self._step

    def step(self, closure=None, loss=None, grad_scaler=None):
        """Your optimizer's step, then one tern round; returns the closure's loss, if any.
        `loss` (a float or tensor) is only reported to the worker's metrics."""
        t0 = time.time()
        if self._warm_up == "gradients" and self._step + 1 < self._sync_steps:
            result = self._averaged_step(closure, grad_scaler, loss)
        else:
            result = self._inner_step(closure, grad_scaler)
            self._write_update()
            self._send(loss if loss is not None else result)
            self._load()
        self.step_seconds = time.time() - t0
        return result

    def _averaged_step(self, closure, grad_scaler, loss):
        """A step of diloco's warm-up (the worker's --sync_steps) as DDP takes it: the group's
        mean gradient, then your optimizer's step with it, so every site takes the same step.
        The worker's model becomes yours minus your gradient, the group's mean of those is
        the mean model minus the mean gradient, and yours minus that is the mean gradient
        (the sites' models are the same). Parameters that are not trained and floating buffers
        take the group's mean. With a GradScaler that found an overflow, this site adds no
        gradient and still steps with the others' mean."""
        result = None
        if closure is not None:
            with torch.enable_grad():
                result = closure()
        overflowed = grad_scaler is not None and self._overflowed(grad_scaler)
        self._write_update(with_gradients=not overflowed)
        self._send(loss if loss is not None else result, mix_now=True)
        with torch.no_grad():
            for t, x, _ in self._views:
                if t.requires_grad:
                    mean = t.detach().to("cpu", torch.float32) - x
                    if t.grad is None:
                        t.grad = torch.zeros_like(t)
                    t.grad.copy_(mean)
                else:
                    t.copy_(x)
        self.optimizer.step()
        return result

    def _write_update(self, with_gradients=False):
        """Writes the worker's model minus yours, your update, into the worker's memory in fp32
        (a GPU tensor is copied to the host); with_gradients adds your gradients to it."""
        with torch.no_grad():
            for t, x, d in self._views:
                torch.sub(x, t.detach().to("cpu"), out=d)
                if with_gradients and t.grad is not None:
                    d.add_(t.grad.detach().to("cpu", torch.float32))

    def _send(self, loss, mix_now=False):
        self.last_result = self._segment.step(
            self._step, lr=1.0, loss=float(loss) if loss is not None else 0.0,
            compute_seconds=0.0, mix_now=mix_now)
        self._step += 1

    def _load(self):
        with torch.no_grad():
            for t, x, _ in self._views:
                t.copy_(x)

    def snapshot(self, step, timeout=None):
        """The model the worker kept after `step` steps ({name: numpy array}): start it with
        --snapshot_every (and, diloco, --snapshot_model=group for the group's outer model θ, the
        same on every worker: the model to evaluate, as DiLoCo evaluates its outer model).
        Waits for the worker to get there (TernTrainer.snapshot)."""
        return self._trainer.snapshot(step, timeout=timeout)

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


class OuterOptimizer(_Wrapper):
    """Your `optimizer` as the inner optimizer of an outer-step run (DiLoCo, SlowMo, SparseLoCo,
    local SGD) through the tern aggregator at `server`:

        optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4)
        optimizer = tern.optim.OuterOptimizer(optimizer, model, server="host:7060")
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()           # your step; every H-th one, the outer step
            if optimizer.done:
                break

    The server says what the outer step is and how often (`tern server --mode=local-sgd
    --local_epochs=0 --local_steps=H --outer=nesterov`, docs/server.md): every H steps the change
    your steps made since the last global model goes to it (in the run's --update_codec, with
    its error feedback, through libtern_c.so as tern.federated's clients do), the server steps
    the global model with every site's, and the model continues from the new one. Your
    optimizer's state carries across rounds, as DiLoCo's inner AdamW's does; LR schedulers,
    gradient clipping and AMP (a GradScaler too) stay yours. Parameters and floating buffers
    travel (as fp32; a bf16 or fp16 model's change is taken in fp32 against the fp32 global
    model); buffers go exactly, outside the codec. Construction joins the run (the first site
    to join gives its model as the run's initial one), waits for its first round (the server's
    --min_clients sites) and loads that round's global model into `model`. `done`: the run is
    over, and `model` holds the run's final global model (step() then only steps your
    optimizer). Not thread-safe (one training loop)."""

    def __init__(self, optimizer, model, server, name="python", run_id="tern", num_samples=1,
                 tls=None, timeout=60.0, log=lambda s: None):
        from tern import federated
        self._fed = federated
        self.optimizer = optimizer
        self.model = model
        self._log = log
        self._name = name
        self._run_id = run_id
        self._num_samples = num_samples
        self._named = _named_state(model)
        self._agg = federated.Aggregator(server, tls=tls, timeout=timeout)
        joined = self._agg.join(run_id, name, num_samples)
        if joined.mode != "local-sgd":
            raise ValueError("an outer-step run is tern server --mode=local-sgd; %s runs %r"
                             % (server, joined.mode))
        initial = {n: t.detach().to("cpu", torch.float32).numpy().copy() for n, t in self._named}
        if joined.model_needed:
            self._agg.init_model(initial)
        buffers = {n for n, _ in model.named_buffers()}
        self._copy = federated._ModelCopy(initial, {n for n, _ in self._named if n in buffers},
                                          log)
        self.done = False
        self.rounds = 0  # outer steps this site took part in
        self._task = self._global = None
        self._steps = 0
        self._t0 = time.time()
        self._next_round()

    @property
    def round(self):
        """The round the local steps are for (0 once the run is over)."""
        return 0 if self.done else self._task.round

    def step(self, closure=None, loss=None, grad_scaler=None):
        """Your optimizer's step, and every H-th one the outer step; returns the closure's loss,
        if any. `loss` is reported to the server with the round's update."""
        result = self._inner_step(closure, grad_scaler)
        if loss is None and result is not None:
            loss = result
        if self.done:
            return result
        self._steps += 1
        self._loss = float(loss) if loss is not None else 0.0
        if self._steps >= max(1, self._task.local.local_steps):
            self._exchange()
        return result

    def _exchange(self):
        """Sends the change since the round's global model and moves to the next round's."""
        fed, task = self._fed, self._task
        local = {n: t.detach().to("cpu", torch.float32).numpy() for n, t in self._named}
        # In the order (and shapes) of the server's model: without libtern_c.so the dict goes as
        # it is, and the server checks each tensor's name in its layout's order.
        update = {n: local[n].reshape(np.shape(g)) - g for n, g in self._global.items()}
        encoded = self._copy.encode(task, self._agg.client_id, self._num_samples, update)
        try:
            self._agg.push(self._run_id, task.round, encoded, float(self._num_samples),
                           self._loss, time.time() - self._t0)
            self.rounds += 1
        except fed.grpc.RpcError as e:
            if e.code() not in fed._UPDATE_NOT_TAKEN:
                raise
            self._log("round %d: update not taken: %s" % (task.round, e.details()))
        self._next_round()

    def _next_round(self):
        """Waits for the next TRAIN task and loads its global model into the model."""
        fed = self._fed
        while True:
            try:
                task, payload = self._copy.fetch(self._agg)
            except fed.grpc.RpcError as e:
                if e.code() != fed.grpc.StatusCode.NOT_FOUND:
                    raise
                self._log("the server does not know client %d (restarted?): joining again"
                          % self._agg.client_id)
                self._agg.join(self._run_id, self._name, self._num_samples)
                continue
            if task.kind == fed.server_pb2.Task.DONE:
                # The run's last outer step is in the server's model: the site ends with it.
                self._load(self._agg.global_model())
                self.done = True
                self._agg.leave()
                return
            if task.kind != fed.server_pb2.Task.TRAIN:
                continue
            params = self._copy.take(task, payload)
            if params is None:
                continue
            break
        self._task, self._global, self._steps = task, params, 0
        self._t0 = time.time()
        self._load(params)

    def _load(self, params):
        with torch.no_grad():
            for n, t in self._named:
                t.copy_(torch.from_numpy(params[n]).reshape(t.shape).to(t.device, t.dtype))

    def close(self):
        """Leaves the run (if it is not over) and closes the channel."""
        if not self.done:
            try:
                self._agg.leave()
            except self._fed.grpc.RpcError:
                pass
        self._agg.channel.close()
