"""tern's C API (clients/c/tern_c.h, libtern_c.so) through ctypes: the aggregator client's copy
of the global model and its update codecs, the same code `tern client` runs. With it a Python
client catches up from the server's downstream deltas (any --downstream_codec) and sends its
updates in the run's --update_codec with its error feedback and memory (DGC, PowerSGD's warm
start); without it, it asks for the whole model each round and sends fp32.

Where the library is looked for, first found wins: $TERN_LIBRARY (a path; "none" turns it off),
then beside the `tern` on PATH (<prefix>/lib*/libtern_c.so as `cmake --install` puts it, or the
build tree's clients/c/), then the linker's search path (ldconfig).
"""

import ctypes
import ctypes.util
import glob
import os
import shutil

import numpy as np

_API_VERSION = 1
_ERROR_BYTES = 1024
_loaded = None  # (library or None, where it was looked for)


def candidates(env_var, filename, build_dir):
    """Where to look for one of tern's libraries, in order: $env_var (a path; "none" turns it
    off), beside the `tern` on PATH (<prefix>/lib*/ as `cmake --install` puts it, or the build
    tree's `build_dir`), then the linker's search path."""
    env = os.environ.get(env_var)
    if env is not None:
        return [] if env in ("", "none") else [env]
    out = []
    tern = shutil.which("tern")
    if tern:
        bindir = os.path.dirname(os.path.realpath(tern))
        prefix = os.path.dirname(bindir)
        out += sorted(glob.glob(os.path.join(prefix, "lib*", filename)))
        out += sorted(glob.glob(os.path.join(prefix, "lib", "*-linux-gnu", filename)))
        out.append(os.path.join(prefix, build_dir, filename))  # build/cli/tern
    found = ctypes.util.find_library(filename[3:-3])
    if found:
        out.append(found)
    return out


def load_first(tried, check):
    """The first of `tried` that loads (ctypes.CDLL) and passes `check` (which binds it and
    raises ImportError on a wrong version), or None; failures are noted in `tried`."""
    for i, path in enumerate(tried):
        if os.path.sep in path and not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:  # e.g. a library it needs is not installed: try the next
            tried[i] = "%s (%s)" % (path, e)
            continue
        return check(lib, path)
    return None


def _candidates():
    return candidates("TERN_LIBRARY", "libtern_c.so", os.path.join("clients", "c"))


def _bind(lib):
    c = ctypes
    lib.tern_c_api_version.restype = c.c_int
    lib.tern_client_model_new.argtypes = [c.c_char_p, c.c_size_t, c.POINTER(c.c_void_p),
                                          c.c_char_p, c.c_size_t]
    lib.tern_client_model_free.argtypes = [c.c_void_p]
    lib.tern_client_model_free.restype = None
    lib.tern_client_model_have_round.argtypes = [c.c_void_p]
    lib.tern_client_model_have_round.restype = c.c_int64
    lib.tern_client_model_have_crc32.argtypes = [c.c_void_p]
    lib.tern_client_model_have_crc32.restype = c.c_uint32
    lib.tern_client_model_have_optimizer_state.argtypes = [c.c_void_p]
    lib.tern_client_model_size.argtypes = [c.c_void_p]
    lib.tern_client_model_size.restype = c.c_size_t
    lib.tern_client_model_values.argtypes = [c.c_void_p]
    lib.tern_client_model_values.restype = c.POINTER(c.c_float)
    lib.tern_client_model_update.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t, c.c_char_p,
                                             c.c_size_t, c.POINTER(c.c_int), c.c_char_p,
                                             c.c_size_t]
    lib.tern_client_model_why_not.argtypes = [c.c_void_p]
    lib.tern_client_model_why_not.restype = c.c_char_p
    lib.tern_client_model_encode.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t, c.c_int64,
                                             c.c_uint64, c.POINTER(c.c_float), c.c_size_t,
                                             c.POINTER(c.c_void_p), c.POINTER(c.c_size_t),
                                             c.c_char_p, c.c_size_t]
    lib.tern_client_model_set_exact.argtypes = [c.c_void_p, c.POINTER(c.c_uint8), c.c_size_t,
                                                 c.c_char_p, c.c_size_t]
    out = [c.POINTER(c.c_void_p), c.POINTER(c.c_size_t), c.c_char_p, c.c_size_t]
    lib.tern_secagg_new.argtypes = [c.c_char_p, c.c_size_t, c.c_int64, c.POINTER(c.c_void_p),
                                    c.c_char_p, c.c_size_t]
    lib.tern_secagg_free.argtypes = [c.c_void_p]
    lib.tern_secagg_free.restype = None
    lib.tern_secagg_keys.argtypes = [c.c_void_p] + out
    lib.tern_secagg_share.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t] + out
    lib.tern_secagg_mask.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t, c.POINTER(c.c_float),
                                     c.c_size_t] + out
    lib.tern_secagg_reveal.argtypes = [c.c_void_p, c.c_char_p, c.c_size_t] + out
    lib.tern_free.argtypes = [c.c_void_p]
    lib.tern_free.restype = None
    return lib


def library():
    """The loaded C API, or None when it is not found (where() says where it was looked for).
    A library of another API version raises."""
    global _loaded
    if _loaded is None:
        tried = _candidates()
        if tried:
            exclusive("libtern_c.so")

        def check(lib, path):
            lib = _bind(lib)
            if lib.tern_c_api_version() != _API_VERSION:
                raise ImportError("%s has C API version %d; this package needs %d" %
                                  (path, lib.tern_c_api_version(), _API_VERSION))
            return lib
        lib = load_first(tried, check)
        if lib is not None:
            loaded_one("libtern_c.so")
        _loaded = (lib, tried)
    return _loaded[0]


_one_library = []  # the tern library this process loaded: each registers tern.v1's descriptors


def exclusive(name):
    """Raises ImportError when this process already loaded the other tern library."""
    if _one_library and _one_library[0] != name:
        raise ImportError("%s cannot be loaded into a process that loaded %s (each carries the "
                          "tern.v1 descriptors, which protobuf registers once per process)"
                          % (name, _one_library[0]))


def loaded_one(name):
    if not _one_library:
        _one_library.append(name)


def where():
    """The places library() looked in."""
    library()
    return list(_loaded[1])


class NativeError(RuntimeError):
    """A C API call failed: `code` is the absl::StatusCode (3: invalid argument, ...)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _check(rc, error):
    if rc != 0:
        message = error.value.decode(errors="replace")
        if rc == 3:  # INVALID_ARGUMENT: the caller's data
            raise ValueError(message)
        raise NativeError(rc, message)


class ClientModel:
    """The copy of the global model (C API TernClientModel). Not thread-safe."""

    def __init__(self, initial_bundle):
        """`initial_bundle`: the initial model as a tern.v1.TensorBundle, in the run's order."""
        self._lib = library()
        if self._lib is None:
            raise ImportError("libtern_c.so not found (looked in %s)" % where())
        data = initial_bundle.SerializeToString()
        handle, error = ctypes.c_void_p(), ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.tern_client_model_new(data, len(data), ctypes.byref(handle), error,
                                               _ERROR_BYTES), error)
        self._handle = handle

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.tern_client_model_free(handle)
            self._handle = None

    @property
    def have_round(self):
        return self._lib.tern_client_model_have_round(self._handle)

    @property
    def have_crc32(self):
        return self._lib.tern_client_model_have_crc32(self._handle)

    @property
    def have_optimizer_state(self):
        return bool(self._lib.tern_client_model_have_optimizer_state(self._handle))

    def values(self):
        """The model (a float32 copy, flat, in the bundle's order)."""
        n = self._lib.tern_client_model_size(self._handle)
        ptr = self._lib.tern_client_model_values(self._handle)
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def update(self, task, payload):
        """Brings the copy to `task`'s round from its payload (serialized TensorBundle bytes);
        False when the copy cannot be trusted (why_not() says why): skip the round."""
        t = task.SerializeToString()
        usable, error = ctypes.c_int(0), ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.tern_client_model_update(self._handle, t, len(t), payload, len(payload),
                                                  ctypes.byref(usable), error, _ERROR_BYTES),
               error)
        return bool(usable.value)

    def set_exact(self, flags):
        """One flag per tensor: True sends that tensor as fp32, outside error feedback and
        memory, whatever the run's codec (BatchNorm's running statistics)."""
        a = (ctypes.c_uint8 * len(flags))(*[1 if f else 0 for f in flags])
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.tern_client_model_set_exact(self._handle, a, len(flags), error,
                                                     _ERROR_BYTES), error)

    def why_not(self):
        return self._lib.tern_client_model_why_not(self._handle).decode(errors="replace")

    def encode(self, task, client_id, num_examples, update):
        """`update` (flat float32, the model's size) encoded as `task` says: serialized
        TensorBundle bytes."""
        u = np.ascontiguousarray(update, dtype=np.float32)
        t = task.SerializeToString()
        out, size = ctypes.c_void_p(), ctypes.c_size_t(0)
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.tern_client_model_encode(
            self._handle, t, len(t), client_id, int(num_examples),
            u.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), u.size, ctypes.byref(out),
            ctypes.byref(size), error, _ERROR_BYTES), error)
        try:
            return ctypes.string_at(out, size.value)
        finally:
            self._lib.tern_free(out)


class SecAgg:
    """One client's side of one securely aggregated round (C API TernSecAgg): each stage's
    message as serialized tern.v1 bytes. Not thread-safe."""

    def __init__(self, task, client_id):
        self._lib = library()
        if self._lib is None:
            raise ImportError("libtern_c.so not found (looked in %s)" % where())
        t = task.SerializeToString()
        handle, error = ctypes.c_void_p(), ctypes.create_string_buffer(_ERROR_BYTES)
        _check(self._lib.tern_secagg_new(t, len(t), client_id, ctypes.byref(handle), error,
                                         _ERROR_BYTES), error)
        self._handle = handle

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.tern_secagg_free(handle)
            self._handle = None

    def _call(self, fn, *args):
        out, size = ctypes.c_void_p(), ctypes.c_size_t(0)
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        _check(fn(self._handle, *args, ctypes.byref(out), ctypes.byref(size), error,
                  _ERROR_BYTES), error)
        try:
            return ctypes.string_at(out, size.value)
        finally:
            self._lib.tern_free(out)

    def keys(self):
        """Stage 1: serialized SecAggKeys."""
        return self._call(self._lib.tern_secagg_keys)

    def share(self, neighbours):
        """Stage 2: serialized SecAggShares from the server's SecAggKeysReply bytes."""
        return self._call(self._lib.tern_secagg_share, neighbours, len(neighbours))

    def mask(self, shares, update):
        """Stage 3: the masked vector (bytes) of `update` (flat float32), clipped to the task's
        dp_clip when it has one, from the server's SecAggSharesReply bytes."""
        u = np.ascontiguousarray(update, dtype=np.float32)
        return self._call(self._lib.tern_secagg_mask, shares, len(shares),
                          u.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), u.size)

    def reveal(self, unmask):
        """Stage 4: serialized SecAggReveal from the server's SecAggUnmaskRequest bytes."""
        return self._call(self._lib.tern_secagg_reveal, unmask, len(unmask))
