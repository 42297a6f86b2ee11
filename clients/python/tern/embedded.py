"""A tern worker inside the trainer's own process (libtern_embedded.so, clients/embedded/tern_embedded.h).

    from tern.embedded import EmbeddedWorker
    worker = EmbeddedWorker(["--id=0", "--workers=4", "--peers=h0:7000,h1:7000,...",
                             "--listen=0.0.0.0:7000", "--algorithm=choco",
                             "--codec=stc:ratio=0.015", "--consensus_step=0.1", "--overlap"])
    shared = worker.share(model)       # model's parameters and .grad now live with the worker
    for step in range(worker.start_step, steps):
        model.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        shared.step(step, loss=loss.item())   # gossip; the model holds the new parameters
    worker.close()

`tern worker`'s flags, without a second process: each step runs on the caller's thread (ctypes
releases the GIL), reading the gradient and writing the parameters in this process's memory,
with no doorbell, no copy and no wake-up of another process; the worker serves its peers from
its own gRPC threads meanwhile. With `--bucket_mb` the model is cut into buckets that are
gossiped during backward(): a hook on each parameter's gradient accumulation tells the worker
when the parameters from some point to the end have their gradient, and the worker sends (and
updates) those while autograd computes the rest. That needs one backward() per step (no
gradient accumulation over several) and no parameter that autograd reads again after its own
gradient is in (tied weights); a step's learning rate is then the one given to the step before
(0, the worker's --lr and --lr_schedule, unless step() is given one). One worker per process (its flags are process-wide), and not in
a process that loaded libtern_c.so (tern.native): both carry tern.v1's descriptors.

The library is looked for as tern.native looks for libtern_c.so: $TERN_EMBEDDED_LIBRARY (a
path; "none" turns it off), beside the `tern` on PATH (<prefix>/lib*/, or the build tree's
cli/), then the linker's search path.
"""

import ctypes
import os
import time

from tern import native
from tern.trainer import SharedModel, check_shareable
from tern.wire import make_bundle
from tern.v1 import worker_pb2

_API_VERSION = 2
_ERROR_BYTES = 1024
_RESULT_BYTES = 64 << 10
_loaded = None  # (library or None, where it was looked for)


def _bind(lib):
    c = ctypes
    lib.tern_worker_api_version.restype = c.c_int
    lib.tern_worker_start.argtypes = [c.POINTER(c.c_char_p), c.c_int, c.POINTER(c.c_void_p),
                                      c.c_char_p, c.c_size_t]
    lib.tern_worker_port.argtypes = [c.c_void_p]
    lib.tern_worker_register.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t, c.c_void_p,
                                         c.c_size_t, c.POINTER(c.c_uint64), c.c_char_p,
                                         c.c_size_t]
    lib.tern_worker_step.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t, c.c_void_p,
                                     c.c_size_t, c.c_void_p, c.c_size_t,
                                     c.POINTER(c.c_size_t), c.c_char_p, c.c_size_t]
    lib.tern_worker_buckets.argtypes = [c.c_void_p]
    lib.tern_worker_begin_step.argtypes = [c.c_void_p, c.c_uint64, c.c_float, c.c_void_p,
                                           c.c_size_t, c.c_char_p, c.c_size_t]
    lib.tern_worker_grad_ready.argtypes = [c.c_void_p, c.c_uint64, c.c_char_p, c.c_size_t]
    lib.tern_worker_stop.argtypes = [c.c_void_p]
    lib.tern_worker_stop.restype = None
    return lib


def library():
    """The loaded library, or None when it is not found (where() says where it was looked)."""
    global _loaded
    if _loaded is None:
        tried = native.candidates("TERN_EMBEDDED_LIBRARY", "libtern_embedded.so",
                                  os.path.join("clients", "embedded"))
        if tried:
            native.exclusive("libtern_embedded.so")

        def check(lib, path):
            lib = _bind(lib)
            if lib.tern_worker_api_version() != _API_VERSION:
                raise ImportError("%s has API version %d; this package needs %d" %
                                  (path, lib.tern_worker_api_version(), _API_VERSION))
            return lib
        lib = native.load_first(tried, check)
        if lib is not None:
            native.loaded_one("libtern_embedded.so")
        _loaded = (lib, tried)
    return _loaded[0]


def where():
    library()
    return list(_loaded[1])


class _Memory:
    """The model's two flat regions in this process, as SharedModel takes them; steps go to the
    embedded worker."""

    def __init__(self, worker, grad, params):
        self.grad, self.params, self.num_params = grad, params, params.numel()
        self._worker = worker

    def step(self, step, loss=0.0, lr=0.0, compute_seconds=0.0):
        return self._worker.step(step, loss=loss, lr=lr, compute_seconds=compute_seconds)

    def close(self):
        pass  # the worker's memory stays bound until EmbeddedWorker.close()


class EmbeddedWorker:
    """One tern worker in this process. Not thread-safe: one training loop drives it."""

    def __init__(self, flags, timeout=300.0):
        self._lib = library()
        if self._lib is None:
            raise ImportError("libtern_embedded.so not found (looked in %s)" % where())
        self.timeout = timeout
        argv = (ctypes.c_char_p * len(flags))(*[os.fsencode(f) for f in flags])
        handle, error = ctypes.c_void_p(), ctypes.create_string_buffer(_ERROR_BYTES)
        native._check(self._lib.tern_worker_start(argv, len(flags), ctypes.byref(handle), error,
                                                  _ERROR_BYTES), error)
        self._handle = handle
        self._memory = None
        self._result = ctypes.create_string_buffer(_RESULT_BYTES)
        self._io_seconds = 0.0
        self.start_step = 0
        self._streamer = None

    @property
    def port(self):
        """The port it serves its peers on."""
        return self._lib.tern_worker_port(self._handle)

    def share(self, model):
        """Registers `model` (float32 parameters, in parameters() order) and ties its parameters
        and their .grad to the worker's memory; returns a SharedModel whose step() runs a step.
        `start_step` is then the step to run next (a resumed worker's)."""
        import torch
        if self._memory is not None:
            raise RuntimeError("share() once per worker")
        check_shareable(model)  # before the worker takes the model's layout
        named = list(model.named_parameters())
        n = sum(p.numel() for _, p in named)
        grad = torch.zeros(n, dtype=torch.float32)
        params = torch.empty(n, dtype=torch.float32)
        data = make_bundle(named).SerializeToString()
        step, error = ctypes.c_uint64(0), ctypes.create_string_buffer(_ERROR_BYTES)
        native._check(self._lib.tern_worker_register(
            self._handle, data, len(data), ctypes.c_void_p(params.data_ptr()), n,
            ctypes.byref(step), error, _ERROR_BYTES), error)
        self.start_step = step.value
        self._memory = _Memory(self, grad, params)  # kept: the worker writes into `params`
        shared = SharedModel(self._memory, model)
        if self._lib.tern_worker_buckets(self._handle) > 1:
            self._streamer = _GradStreamer(self, named, grad, self.start_step)
        return shared

    def step(self, step, loss=0.0, lr=0.0, compute_seconds=0.0):
        """Step `step` with the gradient region as written; returns the StepResult. Waits
        (within the timeout) while the worker is not ready (its peers unknown)."""
        if self._memory is None:
            raise RuntimeError("share() the model first")
        # The worker's calls from autograd's hooks are its time, not the trainer's compute.
        during = self._streamer.seconds if self._streamer is not None else 0.0
        info = worker_pb2.StepInfo(step=step, lr=lr, loss=loss,
                                   compute_seconds=max(0.0, compute_seconds - during),
                                   io_seconds=self._io_seconds).SerializeToString()
        grad = ctypes.c_void_p(self._memory.grad.data_ptr())
        size, error = ctypes.c_size_t(0), ctypes.create_string_buffer(_ERROR_BYTES)
        t0 = time.time()
        while True:
            rc = self._lib.tern_worker_step(self._handle, info, len(info), grad,
                                            self._memory.num_params, self._result, _RESULT_BYTES,
                                            ctypes.byref(size), error, _ERROR_BYTES)
            if rc != 14:  # UNAVAILABLE: peers not known yet, nothing done
                break
            if time.time() - t0 > self.timeout:
                raise TimeoutError("worker not ready for step %d within %.0f s: %s"
                                   % (step, self.timeout, error.value.decode(errors="replace")))
            time.sleep(0.05)
        native._check(rc, error)
        if self._streamer is not None:
            self._streamer.next_step(step + 1, lr)
        result = worker_pb2.StepResult.FromString(self._result.raw[:size.value])
        # What reaching the worker cost (a function call, a parse), reported with the next step.
        self._io_seconds = max(0.0, time.time() - t0 + during - result.worker_seconds)
        return result

    def _call(self, fn, *args):
        """Calls fn(handle, *args, error, size); returns (code, message)."""
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        rc = fn(self._handle, *args, error, _ERROR_BYTES)
        return rc, error.value.decode(errors="replace")

    def close(self):
        """Stops the worker (a step in flight returns); the model keeps its last parameters."""
        if self._handle:
            self._lib.tern_worker_stop(self._handle)
            self._handle = None

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()


class _GradStreamer:
    """Tells the worker, during backward(), how much of the gradient is final: after each
    parameter's gradient accumulation (a hook on its AccumulateGrad node), the longest run of
    parameters up to the last one whose gradients are all in. The first hook of a step begins it.
    An error is kept and raised by the step."""

    def __init__(self, worker, named, grad, first_step):
        self._worker, self._grad = worker, grad
        self._offsets, self._views, self._nodes = [], [], []
        self._frozen = [not p.requires_grad for _, p in named]  # never get a gradient
        off = 0
        for i, (_, p) in enumerate(named):
            self._offsets.append(off)
            self._views.append((p, grad[off:off + p.numel()].view(p.shape)))
            if p.requires_grad:
                # The parameter's AccumulateGrad node (autograd keeps one per leaf while alive).
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                node.register_hook(self._hook(i))
                self._nodes.append(node)
            off += p.numel()
        self._step, self._lr = first_step, 0.0
        self._reset()

    def next_step(self, step, lr):
        self._step, self._lr = step, lr
        self._reset()

    def _reset(self):
        self.seconds = 0.0  # in this step's calls so far
        self._done = list(self._frozen)
        self._first_undone = len(self._offsets)  # parameters from here on have their gradient
        self._begun = False

    def _hook(self, i):
        def hook(*_):
            self._ready(i)
        return hook

    def _ready(self, i):
        t0 = time.time()
        self._advance(i)
        self.seconds += time.time() - t0

    def _advance(self, i):
        p, g = self._views[i]
        if p.grad is not None and p.grad.data_ptr() != g.data_ptr():
            g.copy_(p.grad)  # zero_grad(set_to_none=True) dropped the view
            p.grad = g
        if not self._begun:
            self._begun = True
            rc, _ = self._worker._call(self._worker._lib.tern_worker_begin_step, self._step,
                                       self._lr, ctypes.c_void_p(self._grad.data_ptr()),
                                       self._grad.numel())
            if rc != 0:  # not ready (peers unknown), or refused: step() does it whole
                self._first_undone = -1
        self._done[i] = True
        if self._first_undone < 0:
            return
        k = self._first_undone
        while k > 0 and self._done[k - 1]:
            k -= 1
        if k < self._first_undone:
            self._first_undone = k
            rc, _ = self._worker._call(self._worker._lib.tern_worker_grad_ready,
                                       self._offsets[k])
            if rc != 0:  # the step failed; step() reports why
                self._first_undone = -1
