"""A run folder as `tern run` writes one, for runs driven from Python, so they compare with
`tern run`'s in one report (`tern report runs/a runs/b`):

    run.json       what ran (tern.v1.RunConfig)
    metrics.jsonl  one line per evaluation (tern.v1.MetricsRow: step, wall_s, train_loss,
                   test_acc, MB sent, ...)
    report.html    `tern report` of the folder, written by close()

DistributedOptimizer(..., run_dir=...) and tern.federated.run(..., run_dir=...) keep one for
you; RunFolder is the piece they share, for a loop of your own:

    folder = tern.runlog.RunFolder("runs/adam-ring", mode="gossip", algorithm="decentlam")
    folder.row(step=100, test_acc=0.85, train_loss=0.41)
    folder.close()                      # writes runs/adam-ring/report.html
"""

import os
import shutil
import subprocess
import sys
import time

from google.protobuf import json_format

from tern.v1 import records_pb2


def _json(message):
    """One line of protobuf's JSON mapping, field names as in the .proto (as tern writes them)."""
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None,
                                     sort_keys=False).replace("\n", "")


def tern_binary():
    """The `tern` executable: $TERN_BIN, else the first on PATH, else None."""
    return os.environ.get("TERN_BIN") or shutil.which("tern")


class RunFolder:
    """Writes run.json now and a metrics.jsonl line per row(); close() renders report.html.
    `config`: RunConfig's fields (mode, algorithm, codec, model, workers, lr, ...); a name it
    lacks raises ValueError at once. Not thread-safe (one training loop)."""

    def __init__(self, path, name=None, **config):
        os.makedirs(path, exist_ok=True)
        self.path = path
        run = records_pb2.RunConfig(name=name or os.path.basename(os.path.normpath(path)),
                                    **config)
        with open(os.path.join(path, "run.json"), "w") as f:
            f.write(_json(run) + "\n")
        # A new run: the folder's rows are this run's only (as `tern run --out` starts afresh).
        self._metrics = open(os.path.join(path, "metrics.jsonl"), "w")
        self._start = time.time()

    def row(self, **fields):
        """Appends one evaluation: MetricsRow's fields (step, test_acc in [0, 1], train_loss,
        mb_sent_per_worker, ...); wall_s, when not given, is the seconds since the folder was
        made. Returns the row."""
        fields.setdefault("wall_s", time.time() - self._start)
        r = records_pb2.MetricsRow(**fields)
        self._metrics.write(_json(r) + "\n")
        self._metrics.flush()  # a run that dies keeps every row it wrote
        return r

    def close(self, report=True):
        """Closes metrics.jsonl and, with `report`, writes report.html with `tern report`.
        Returns the report's path, or None when there is none (no `tern` found: set TERN_BIN
        or put it on PATH; the folder stays, for `tern report` later)."""
        if not self._metrics.closed:
            self._metrics.close()
        if not report:
            return None
        exe = tern_binary()
        if exe is None:
            print("tern.runlog: no `tern` on PATH (nor $TERN_BIN): %s has no report.html; "
                  "`tern report %s` writes one" % (self.path, self.path), file=sys.stderr)
            return None
        out = os.path.join(self.path, "report.html")
        subprocess.run([exe, "report", self.path, "--out=" + out], check=True,
                       stdout=subprocess.DEVNULL)
        return out


class WorkerMetrics:
    """Rows of one gossip worker's counters (tern.v1.WorkerStats, cumulative) as `tern run`
    measures them: the training loss since the previous row, MB sent, compression and the time
    split, each per worker. Not thread-safe."""

    def __init__(self):
        self._last_steps, self._last_loss = 0, 0.0

    def fields(self, stats):
        """MetricsRow fields from `stats` (WorkerStats), the loss since the previous call."""
        f = {
            "mb_sent_per_worker": stats.payload_bytes_sent / 1e6,
            "wire_mb_sent_per_worker": stats.wire_bytes_sent / 1e6,
            "wire_mb_received_per_worker": stats.wire_bytes_received / 1e6,
            "dense_mb_per_worker": stats.dense_bytes_sent / 1e6,
            "compression": (stats.dense_bytes_sent / stats.payload_bytes_sent
                            if stats.payload_bytes_sent else 1.0),
            "compute_s": stats.compute_seconds,
            "encode_s": stats.encode_seconds,
            "wait_s": stats.wait_seconds,
            "transfer_s": stats.transfer_seconds,
            "combine_s": stats.combine_seconds,
            "decode_s": stats.decode_seconds,
            "step_s": stats.step_seconds,
            "trainer_io_s": stats.trainer_io_seconds,
            "contributions_clipped": stats.contributions_clipped,
        }
        steps = stats.steps - self._last_steps
        if steps > 0:
            f["train_loss"] = (stats.loss_sum - self._last_loss) / steps
        self._last_steps, self._last_loss = stats.steps, stats.loss_sum
        return f
