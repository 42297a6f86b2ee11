"""What the Python client tests share: skip (exit 77, ctest's SKIP_RETURN_CODE) on a machine
without Debian's torch / grpcio / protobuf or the Fashion-MNIST package, and wait for a
daemon's --port_file."""

import os
import sys
import time

DATA = "/usr/share/datasets/fashion-mnist"


def require_torch_and_data():
    try:
        import grpc  # noqa: F401
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP: %s (install python3-torch python3-grpcio python3-protobuf)" % e)
        sys.exit(77)
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print("SKIP: %s not installed (dataset-fashion-mnist)" % DATA)
        sys.exit(77)


def wait_for_port(path, seconds=30):
    """The port a daemon wrote to `path` (its --port_file)."""
    for _ in range(int(seconds / 0.05)):
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        time.sleep(0.05)
    raise TimeoutError("no port in %s after %ss" % (path, seconds))
