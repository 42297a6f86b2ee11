"""pytest: every example (examples/pytorch) runs as a user would start it, through launch.py
with real daemons on 127.0.0.1, for a few steps: it finishes, the training loss falls and the
model it ends with classifies. Run by ctest (TERN_BIN names the tern binary)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("grpc")

HERE = os.path.dirname(os.path.abspath(__file__))
TERN = os.environ.get("TERN_BIN", "")
if not TERN or not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
    pytest.skip("needs TERN_BIN and dataset-fashion-mnist", allow_module_level=True)


@pytest.mark.parametrize("mode", ["single", "gossip", "federated", "local-sgd", "ps"])
def test_the_example_trains(mode, tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "launch.py"), "--mode=" + mode, "--procs=2",
         "--epochs=0.2", "--tern=" + TERN, "--dir=%s" % tmp_path],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.split("SUMMARY ", 1)[1])
    assert summary["last_loss"] < 0.85 * summary["first_loss"], summary
    assert summary["accuracy"] > 0.6, summary
