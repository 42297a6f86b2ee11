"""torchrun (Debian's python3-torch) starts three `tern worker` processes with --no_python and
the same command line: each takes its id, the run's size and the rendezvous from the variables
torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 serves a scheduler on the port
above MASTER_PORT), and the three train diloco to one model, byte for byte.

Usage: torchrun_test.py TERN_BINARY. Exit 77 (skipped) without torch.distributed.run."""
import hashlib
import os
import socket
import subprocess
import sys
import tempfile


def two_free_ports():
    """A port p with p + 1 free too (MASTER_PORT, and tern's rendezvous above it)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    raise RuntimeError("no two free ports in a row")


def main():
    tern = sys.argv[1]
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError as e:
        print("skipped: no torch.distributed.run (%s)" % e)
        return 77
    with tempfile.TemporaryDirectory(prefix="tern-torchrun-") as d:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3",
               "--no_python", "--master_port=%d" % two_free_ports(),
               # torch 1.13 under Python 3.11 parses the default --redirects/--tee of "0" to None
               # (Std.NONE is skipped when an IntFlag is iterated) and fails in start_processes;
               # any other value works: stderr to files under --log_dir, and to the console.
               "--redirects=2", "--tee=2", "--log_dir=" + d + "/logs",
               tern, "worker", "--algorithm=diloco", "--local_steps=20", "--epochs=40",
               "--batch=64", "--max_steps=400", "--total_steps=400", "--round_timeout=5",
               "--peers_timeout=60", "--exit_after_training", "--log_level=info",
               # torchrun substitutes ${local_rank} in an executable's arguments.
               "--final_model=" + d + "/final-${local_rank}.bin"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        if r.returncode != 0:
            print(out)
            print("FAILED: torchrun exited %d" % r.returncode)
            return 1
        for rank in range(3):
            want = "--id=%d --workers=3 --scheduler=127.0.0.1:" % rank
            if want not in out:
                print(out)
                print("FAILED: rank %d did not take its flags from torchrun's variables" % rank)
                return 1
        models = [open("%s/final-%d.bin" % (d, rank), "rb").read() for rank in range(3)]
        if len(models[0]) < 100000 or any(m != models[0] for m in models):
            print("FAILED: the final models differ: %s" %
                  [hashlib.sha256(m).hexdigest()[:12] for m in models])
            return 1
        print("torchrun: 3 workers, one model (%d bytes, sha256 %s)" %
              (len(models[0]), hashlib.sha256(models[0]).hexdigest()[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
