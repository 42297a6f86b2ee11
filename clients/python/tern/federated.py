"""Python client of a tern aggregator (`tern server`, proto/tern/v1/server.proto): federated and
local-SGD rounds with your own model, in the style of Flower's NumPyClient.

    class MyClient(tern.federated.Client):
        def initial_parameters(self):            # {name: numpy array}, sent if the run has none
            return {k: v.numpy() for k, v in model.state_dict().items()}
        def fit(self, parameters, task):         # train from the round's model
            model.load_state_dict({k: torch.from_numpy(v) for k, v in parameters.items()})
            ... task.local.local_steps, task.local.lr, task.local.batch ...
            return {k: v.numpy() for k, v in model.state_dict().items()}, num_examples, loss

    tern.federated.run(MyClient(), "server.example:7060", name="client-3", num_samples=6000)

`run` joins, sends the initial model when the server asks, then long-polls for tasks: each TRAIN
task's model goes to `fit`, and the change it made (new - old) goes back as the update, weighted
by the examples it trained on; in a ps run (`--mode=ps`) `gradient` gives one minibatch's
gradient instead, which goes back as it is; it returns when the run is over. Every call has a
deadline; a server that goes away is retried for `retry_s`, then its error is raised; a server
that restarted without this client joins it again; an update refused as too late or not wanted
is logged and the run goes on.

The client keeps its copy of the global model through tern's C API (tern.native, libtern_c.so:
the code `tern client` runs): it starts from initial_parameters() (every client of a run gives
the same model, in the same names and shapes), catches up from the server's downstream deltas
(any --downstream_codec, checked by the model's CRC-32) and encodes its update with the run's
--update_codec, error feedback and memory (DGC, PowerSGD). Without the library it asks for the
whole model every round (downstream codec none or fp16) and sends fp32, and says so once. A ps
run's optimizer must be plain SGD or Adam/LAMB (the 1-bit ones need optimizer state this client
does not keep).
"""

import time

import grpc
import numpy as np

from tern import native
from tern.runlog import RunFolder
from tern.v1 import secagg_pb2, server_pb2, server_pb2_grpc, tensor_pb2
from tern.wire import (as_numpy, assemble, assemble_bytes, chunk_bundle, decode_dense,
                       make_bundle, make_channel)


class Client:
    """What a participant supplies. Not called concurrently."""

    def initial_parameters(self):
        """{name: array}: the model to start the run from, the same on every client: sent when
        the server has none yet, and the layout (names, shapes) of the client's copy of the
        global model, which catches up from the server's deltas. Without it the client fetches
        the whole model every round."""
        raise NotImplementedError

    def fit(self, parameters, task):
        """Trains from `parameters` ({name: float32 array}) as `task` (server_pb2.Task) says;
        returns (new parameters {name: array}, examples trained on, mean training loss)."""
        raise NotImplementedError

    def gradient(self, parameters, task):
        """ps runs: the gradient of one minibatch of task.gradient.batch at `parameters`;
        returns ({name: array}, examples, loss)."""
        raise NotImplementedError

    def exact_tensors(self):
        """Names of tensors training sets rather than descends (BatchNorm's running statistics):
        their change goes to the server as fp32, outside the run's codec and error feedback,
        which would overshoot a pull towards a target. None by default."""
        return ()

    def evaluate(self, parameters, task):
        """Federated evaluation (tern server --eval_every): the round's model on your held-out
        data, before fit trains from it; returns (loss, accuracy in [0, 1], examples), or None
        when there is nothing to evaluate on (the default). The server logs the
        examples-weighted mean of the reports."""
        return None



def _state(model):
    """A torch module's state_dict as float32 numpy arrays (copies)."""
    return {k: as_numpy(v).copy() for k, v in model.state_dict().items()}


def _load(model, parameters):
    import torch
    model.load_state_dict({k: torch.from_numpy(v) for k, v in parameters.items()})


class TorchClient(Client):
    """A Client for a torch.nn.Module and your training function: `train(steps)` trains `model`
    for `steps` minibatches and returns (examples, mean loss); `evaluate()`, optional, scores
    `model` on your held-out data: (loss, accuracy, examples), for federated evaluation. The
    model (parameters and
    buffers, any floating dtype) goes to the server as float32 and comes back into the module.

    In a ps run (`tern server --mode=ps`) the server takes the optimizer step: each round calls
    train(1) with an optimizer that only keeps the gradient (NoStep), and what backward() left
    in the parameters' .grad is sent (zero for buffers, which are not trained by gradients)."""

    def __init__(self, model, train, evaluate=None):
        self.model, self.train, self._evaluate = model, train, evaluate

    def initial_parameters(self):
        return _state(self.model)

    def exact_tensors(self):
        """The module's buffers (BatchNorm's running statistics and counters)."""
        return [name for name, _ in self.model.named_buffers()]

    def fit(self, parameters, task):
        _load(self.model, parameters)
        examples, loss = self.train(task.local.local_steps)
        return _state(self.model), examples, loss

    def evaluate(self, parameters, task):
        """`evaluate()` (the constructor's) on the round's model: (loss, accuracy, examples)."""
        if self._evaluate is None:
            return None
        _load(self.model, parameters)
        return self._evaluate()

    def gradient(self, parameters, task):
        _load(self.model, parameters)
        examples, loss = self.train(1)
        grads = {k: np.zeros_like(v) for k, v in parameters.items()}
        for name, p in self.model.named_parameters():
            if p.grad is not None:
                grads[name] = as_numpy(p.grad)
        return grads, examples, loss


class NoStep:
    """An optimizer for ps runs, where the server steps: zero_grad() clears the gradients,
    step() leaves them for TorchClient to send."""

    def __init__(self, model):
        self.model = model

    def zero_grad(self, set_to_none=False):
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        return None


def load_global_model(model, address, tls=None, timeout=60.0):
    """Loads the server's current global model into the torch module `model`."""
    _load(model, Aggregator(address, tls=tls, timeout=timeout).global_model())

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
        """(Task, {name: array} or None): the next task and, for TRAIN, the round's whole model
        (downstream codec none or fp16)."""
        task, payload = self.fetch_payload(max_wait_ms)
        if payload is None:
            return task, None
        if task.payload != server_pb2.Task.MODEL:
            raise ValueError("the server sent downstream deltas; this client asks for the model")
        bundle = tensor_pb2.TensorBundle.FromString(payload)
        return task, {n.name: decode_dense(n.tensor) for n in bundle.tensors}

    def fetch_payload(self, max_wait_ms=10000, have_round=-1, have_crc32=0,
                      have_optimizer_state=False):
        """(Task, serialized TensorBundle or None): the next task and, for TRAIN, its payload:
        the model, or the deltas from `have_round` when the server can send them (a copy of
        that round with CRC-32 `have_crc32`; tern.native applies them)."""
        req = server_pb2.FetchRequest(client_id=self.client_id, max_wait_ms=max_wait_ms,
                                      have_round=have_round, have_crc32=have_crc32,
                                      have_optimizer_state=have_optimizer_state)

        def call():
            replies = list(self.stub.Fetch(req, timeout=self.timeout + max_wait_ms / 1000.0))
            if not replies or not replies[0].HasField("task"):
                raise ValueError("a Fetch reply without its task")
            return replies

        replies = self._retrying(call)
        task = replies[0].task
        if task.kind != server_pb2.Task.TRAIN:
            return task, None
        return task, assemble_bytes(r.chunk for r in replies if r.HasField("chunk"))

    def push(self, run_id, round_, update, weight, loss, seconds, evaluation=None):
        """`update`: {name: array} in the order of the round's model (as fetch gave it), sent
        as fp32, or a TensorBundle already encoded (_ModelCopy.encode); `evaluation`: (loss,
        accuracy, examples) of the round's model, or None."""
        if isinstance(update, tensor_pb2.TensorBundle):
            bundle = update
            bundle.round = round_
        else:
            bundle = make_bundle(list(update.items()), round_=round_)
        bundle.run_id = run_id
        info = server_pb2.UpdateInfo(client_id=self.client_id, round=round_, weight=weight,
                                     loss=loss, train_seconds=seconds)
        if evaluation is not None:
            info.eval.loss, info.eval.accuracy, info.eval.examples = evaluation
        chunks = chunk_bundle(bundle)
        reqs = [server_pb2.UpdateRequest(info=info if i == 0 else None, chunk=c)
                for i, c in enumerate(chunks)]
        return self.stub.Push(iter(reqs), timeout=self.timeout)

    def secagg_stage(self, round_, want, wait_s=600.0, max_wait_ms=10000, **message):
        """One stage of a securely aggregated round (Aggregator.SecAgg): `message` (keys=,
        shares= or reveal=: serialized bytes) sent once, then the `want` answer asked for until
        the stage closes (the server holds each ask up to max_wait_ms); the SecAggReply."""
        req = secagg_pb2.SecAggRequest(client_id=self.client_id, round=round_, want=want,
                                       max_wait_ms=max_wait_ms)
        for field, data in message.items():
            getattr(req, field).ParseFromString(data)
        give_up = time.time() + wait_s
        while True:
            reply = self._retrying(
                lambda: self.stub.SecAgg(req, timeout=self.timeout + max_wait_ms / 1000.0))
            if not reply.pending:
                return reply
            if time.time() > give_up:
                raise TimeoutError("round %d's secure-aggregation stage %s did not close in %g s"
                                   % (round_, secagg_pb2.SecAggRequest.Want.Name(want), wait_s))
            sent = req.WhichOneof("message")
            if sent is not None:
                req.ClearField(sent)  # sent: from now on, only asked after
            time.sleep(0.02)

    def global_model(self):
        """{name: float32 array}: the server's current global model (Aggregator.GetModel)."""
        replies = self._retrying(lambda: list(self.stub.GetModel(server_pb2.GetModelRequest(),
                                                                 timeout=self.timeout)))
        bundle = assemble(r.chunk for r in replies if r.HasField("chunk"))
        return {n.name: decode_dense(n.tensor) for n in bundle.tensors}

    def leave(self):
        self.stub.Leave(server_pb2.LeaveRequest(client_id=self.client_id), timeout=self.timeout)


# Push refusals that are part of a run (docs/server.md): too late, not sampled, already sent.
_UPDATE_NOT_TAKEN = (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED,
                     grpc.StatusCode.ALREADY_EXISTS)


def _checked(old, new, what):
    """`new` as float32 arrays, checked against the round's layout `old`."""
    if set(new) != set(old):
        raise ValueError("%s returned tensors %s; the run's model has %s" %
                         (what, sorted(new), sorted(old)))
    out = {}
    for name, before in old.items():
        after = np.asarray(new[name], dtype=np.float32)
        if after.size == 1 and before.size == 1:  # a 0-d tensor travels as [1]
            after = after.reshape(before.shape)
        if after.shape != before.shape:
            raise ValueError("%s returned %s with shape %s; the run's is %s" %
                             (what, name, after.shape, before.shape))
        out[name] = after
    return out


def _update(old, new):
    """new - old per tensor, checked against the round's layout."""
    return {name: v - old[name] for name, v in _checked(old, new, "fit").items()}


def _work(client, params, task):
    """(update, examples, loss) of a TRAIN task: fit's change, or a ps run's gradient."""
    if task.WhichOneof("work") == "gradient":
        if task.gradient.optimizer.startswith("onebit"):
            raise ValueError("the run's optimizer %r keeps state this client does not" %
                             task.gradient.optimizer)
        grads, examples, loss = client.gradient(params, task)
        return _checked(params, grads, "gradient"), examples, loss
    new, examples, loss = client.fit(params, task)
    return _update(params, new), examples, loss


def _evaluation(client, params, task, log):
    """client.evaluate's report as (loss, accuracy, examples), or None; one the server would
    refuse (and with it the update) is logged and left out."""
    r = client.evaluate(params, task)
    if r is None:
        return None
    loss, accuracy, examples = (float(v) for v in r)
    if not (0 < examples <= 1e12 and np.isfinite(loss) and 0 <= accuracy <= 1):
        log("round %d: evaluation (%r) not sent: needs examples in (0, 1e12], a finite loss and "
            "accuracy in [0, 1]" % (task.round, r))
        return None
    return loss, accuracy, examples


def _check_layout(params, layout):
    """Raises ValueError unless the server's model `params` has initial_parameters()' `layout`."""
    def shape(s):  # a 0-d tensor travels as [1]
        return () if int(np.prod(s)) == 1 else tuple(s)
    theirs = sorted((name, shape(np.shape(v))) for name, v in params.items())
    ours = sorted((name, shape(s)) for name, s in layout)
    if theirs != ours:
        raise ValueError("the server's model %s does not fit initial_parameters() %s" %
                         (theirs, ours))


class _ModelCopy:
    """The client's copy of the global model: tern.native's ClientModel when the library is
    found (delta catch-up, the run's update codec and memory), else the whole model each round
    and fp32 updates."""

    def __init__(self, initial, exact, log):
        self.log = log
        self.native = None
        self.warned = False
        self.layout = None
        self.layout_checked = False
        if initial is None:
            return
        self.layout = [(name, np.shape(initial[name])) for name in sorted(initial)]
        if native.library() is None:
            log("libtern_c.so not found (looked in %s): each round fetches the whole model and "
                "updates go as fp32 (see docs/python.md)" % native.where())
            return
        self.native = native.ClientModel(make_bundle([(n, initial[n]) for n, _ in self.layout]))
        unknown = set(exact) - set(initial)
        if unknown:
            raise ValueError("exact_tensors() names %s, which initial_parameters() lacks" %
                             sorted(unknown))
        self.native.set_exact([name in exact for name, _ in self.layout])

    def fetch(self, agg):
        """agg.fetch_payload with what the copy has."""
        if self.native is None:
            return agg.fetch_payload()
        return agg.fetch_payload(have_round=self.native.have_round,
                                 have_crc32=self.native.have_crc32,
                                 have_optimizer_state=self.native.have_optimizer_state)

    def take(self, task, payload):
        """The round's model {name: float32 array} from a TRAIN task's payload, or None when
        the copy cannot be brought to the round (the round is skipped; the model comes next)."""
        if self.native is None:
            if task.payload != server_pb2.Task.MODEL:
                raise ValueError("the server sent downstream deltas; this client asks for the "
                                 "model")
            bundle = tensor_pb2.TensorBundle.FromString(payload)
            params = {n.name: decode_dense(n.tensor) for n in bundle.tensors}
            if self.layout is not None and not self.layout_checked:
                _check_layout(params, self.layout)  # a run's layout never changes
                self.layout_checked = True
            return params
        try:
            usable = self.native.update(task, payload)
        except ValueError as e:
            raise ValueError("round %d: the server's model does not fit this client's "
                             "initial_parameters(): %s" % (task.round, e)) from e
        if not usable:
            self.log("round %d: %s; asking for the model" % (task.round, self.native.why_not()))
            return None
        flat, out, offset = self.native.values(), {}, 0
        for name, shape in self.layout:
            n = int(np.prod(shape))
            out[name] = flat[offset:offset + n].reshape(shape)
            offset += n
        return out

    def encode(self, task, client_id, num_examples, update):
        """The update as the server should get it: a TensorBundle in the task's codec, or
        {name: array} sent as fp32 without the library."""
        if self.native is None:
            if task.update_codec not in ("", "none") and not self.warned:
                self.log("the run's update codec is %r; without libtern_c.so updates go as fp32"
                         % task.update_codec)
                self.warned = True
            return update
        return tensor_pb2.TensorBundle.FromString(
            self.native.encode(task, client_id, num_examples, self.flat(update)))

    def flat(self, update):
        """{name: array} as one float32 vector in the model's order."""
        return np.concatenate([np.ravel(update[name]) for name, _ in self.layout]).astype(
            np.float32, copy=False)


def _bytes(update):
    """An update's bytes as it goes up: the encoded bundle's, or fp32's."""
    if isinstance(update, tensor_pb2.TensorBundle):
        return update.ByteSize()
    return sum(np.asarray(v).size * 4 for v in update.values())


class _ClientRows:
    """A client's run folder (tern.runlog): a metrics.jsonl row for each round it trained: its
    loss, the round's model's evaluation when it made one, and its bytes up and down so far."""

    def __init__(self, run_dir, name, mode, config):
        self.folder = RunFolder(run_dir, **dict(dict(name=name, mode=mode), **(config or {})))
        self.up = self.down = 0
        self.accepted = 0

    def round(self, round_, loss, evaluation, accepted):
        self.accepted += int(accepted)
        row = dict(step=round_, round=round_, train_loss=loss, updates_accepted=self.accepted,
                   payload_mb_up=self.up / 1e6, payload_mb_down=self.down / 1e6,
                   mb_sent_per_worker=(self.up + self.down) / 1e6)
        if evaluation is not None:
            row.update(test_loss=evaluation[0], test_acc=evaluation[1])
        self.folder.row(**row)


# What leaves a client out of one secure round (a stage that closed without it, a refused
# message, shares that do not open): it logs and goes on to the next round, as tern client does.
_SECAGG_LEFT_OUT = (grpc.RpcError, TimeoutError, ValueError, native.NativeError)


def _secagg_setup(agg, task):
    """A secure round's first two stages (keys, then shares): the client's side (tern.native's
    SecAgg) and the serialized SecAggSharesReply its update is masked with."""
    secure = native.SecAgg(task, agg.client_id)
    want = secagg_pb2.SecAggRequest
    reply = agg.secagg_stage(task.round, want.NEIGHBOURS, keys=secure.keys())
    shares = secure.share(reply.neighbours.SerializeToString())
    reply = agg.secagg_stage(task.round, want.SHARES, shares=shares)
    return secure, reply.shares.SerializeToString()


def _secagg_reveal(agg, task, secure):
    """A secure round's last stage: the shares the server asks for to unmask the sum."""
    want = secagg_pb2.SecAggRequest
    reply = agg.secagg_stage(task.round, want.UNMASK)
    agg.secagg_stage(task.round, want.WANT_UNSPECIFIED,
                     reveal=secure.reveal(reply.unmask.SerializeToString()))


def run(client, address, name="python", num_samples=1, run_id="tern", tls=None, timeout=60.0,
        log=lambda s: None, run_dir=None, run_config=None):
    """Takes part in the run at `address` until it is over; returns the rounds trained.
    `run_dir`: a run folder to keep as `tern run` does (tern.runlog), a row per round trained,
    report.html when the run is over; `run_config`: more of its run.json (RunConfig's
    fields)."""
    agg = Aggregator(address, tls=tls, timeout=timeout)
    joined = agg.join(run_id, name, num_samples)
    log("joined as client %d (%s)" % (agg.client_id, joined.mode))
    rows = _ClientRows(run_dir, name, joined.mode, run_config) if run_dir is not None else None
    try:
        initial = client.initial_parameters()
    except NotImplementedError:
        if joined.model_needed:
            raise ValueError("the server has no model yet: the client must give "
                             "initial_parameters()")
        initial = None  # the copy is the server's model, fetched whole every round
        log("no initial_parameters(): each round fetches the whole model")
    if joined.model_needed:
        agg.init_model(initial)
    copy = _ModelCopy(initial, set(client.exact_tensors()), log)
    rounds = 0
    while True:
        try:
            task, payload = copy.fetch(agg)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            log("the server does not know client %d (restarted?): joining again" % agg.client_id)
            agg.join(run_id, name, num_samples)
            continue
        if task.kind == server_pb2.Task.DONE:
            agg.leave()
            if rows is not None:
                rows.folder.close()
            return rounds
        if task.kind != server_pb2.Task.TRAIN:
            continue
        if rows is not None:
            rows.down += len(payload or b"")
        params = copy.take(task, payload)
        if params is None:
            continue
        secure = None
        if task.HasField("secagg"):
            if copy.native is None:
                raise ValueError("the server runs secure aggregation (--secagg): the Python client "
                                 "takes part through libtern_c.so, which was not found (looked in "
                                 "%s)" % native.where())
            try:
                secure, shares = _secagg_setup(agg, task)
            except _SECAGG_LEFT_OUT as e:
                # Left out of the round's masking (a stage closed without it): the next round.
                log("round %d: no part in its secure aggregation: %s" % (task.round, e))
                continue
        t0 = time.time()
        evaluation = _evaluation(client, params, task, log) if task.evaluate else None
        update, examples, loss = _work(client, params, task)
        if secure is not None:
            flat = copy.flat(update)
            encoded = tensor_pb2.TensorBundle()
            t = encoded.tensors.add()
            t.name = "secagg"
            t.tensor.codec = "secagg"
            t.tensor.numel = flat.size
            try:
                t.tensor.payload = secure.mask(shares, flat)
            except (ValueError, native.NativeError) as e:
                # Fewer than t neighbours' shares opened, say: the round goes on without it.
                log("round %d: cannot mask the update: %s" % (task.round, e))
                continue
        else:
            encoded = copy.encode(task, agg.client_id, num_samples, update)
        if rows is not None:
            rows.up += _bytes(encoded)
        try:
            reply = agg.push(run_id, task.round, encoded, float(examples), float(loss),
                             time.time() - t0, evaluation)
        except grpc.RpcError as e:
            # The round closed meanwhile, or the update is not wanted: the run goes on.
            if e.code() not in _UPDATE_NOT_TAKEN:
                raise
            log("round %d: update not taken: %s" % (task.round, e.details()))
            if rows is not None:
                rows.round(task.round, float(loss), evaluation, accepted=False)
            continue
        rounds += 1
        if secure is not None:
            try:
                _secagg_reveal(agg, task, secure)
            except _SECAGG_LEFT_OUT as e:
                log("round %d: did not reveal its shares: %s" % (task.round, e))
        if rows is not None:
            rows.round(task.round, float(loss), evaluation, accepted=True)
        log("round %d: loss %.4f, %s" %
            (task.round, loss, server_pb2.UpdateReply.Verdict.Name(reply.verdict)))
