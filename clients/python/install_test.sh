#!/usr/bin/env bash
# ctest: the tern Python package installs as docs/python.md says: its install block is run as
# written (all but the apt-get line; `~` a fresh folder, pip's index off, the python3 first on PATH
# whatever it is), and the package's modules, the generated tern.v1 ones included, import from the
# venv's interpreter outside the source tree. Exit 77 (skip) without python3-venv/pip.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
/usr/bin/python3 -c "import venv, ensurepip" 2>/dev/null || { echo "SKIP: python3-venv"; exit 77; }
/usr/bin/python3 -m pip --version > /dev/null 2>&1 || { echo "SKIP: python3-pip"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/home"
# A copy of the two folders the package is built from, so the build leaves the checkout alone.
mkdir -p "$work/tree/clients"
cp -r "$src/proto" "$work/tree/proto"
cp -r "$src/clients/python" "$work/tree/clients/python"
rm -rf "$work/tree/clients/python/build" "$work/tree/clients/python/"*.egg-info
# The docs' first sh block after "## Installing it", less its apt-get command (and that
# command's continuation lines).
awk '/^## Installing it/ {on = 1} on && /^```sh/ {inb = 1; next} inb && /^```/ {exit}
     inb && /^sudo apt-get/ {skip = 1} inb && !skip {print} skip && !/\\$/ {skip = 0}' \
  "$src/docs/python.md" > "$work/block.sh"
grep -q "pip install" "$work/block.sh" || { echo "no install block in docs/python.md"; exit 1; }
echo "--- docs/python.md's block:"; cat "$work/block.sh"
(cd "$work/tree" && HOME="$work/home" PIP_NO_INDEX=1 PIP_QUIET=1 bash -euo pipefail "$work/block.sh")
cd "$work"
"$work/home/tern-venv/bin/python" - <<'PY'
import os
import tern
import tern.federated
import tern.trainer
from tern.v1 import scheduler_pb2_grpc, server_pb2_grpc, tensor_pb2, worker_pb2_grpc
assert "site-packages" in tern.__file__, tern.__file__
assert worker_pb2_grpc.TrainerStub and server_pb2_grpc.AggregatorStub
try:
    import torch  # noqa: F401
    import tern.optim
    print("tern.optim:", tern.optim.DistributedOptimizer.__name__)
except ImportError:
    print("no torch: tern.optim not checked")
print("OK: tern", tern.__version__, "from", os.path.dirname(tern.__file__))
PY
