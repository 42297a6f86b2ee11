"""`tern launch`, the same command three times, each starting a worker beside a user's PyTorch
script that leaves DistributedOptimizer's worker out (TERN_WORKER says where it is): one launcher
serves the rendezvous (the one that bound its port), the workers take ids 0, 1 and 2 from it, and
the three scripts train DiLoCo to one model, byte for byte. First as three "hosts" on 127.0.0.1,
then, as root, as three hosts in network namespaces with their own addresses
(deploy/slow-link.sh): only the host the rendezvous names can serve it, and each worker listens
on its own host's address. Then an elastic run on 127.0.0.1 (--nnodes=2:3): two launchers
start it, a third started while it runs joins with the group's state (its script goes on from
the group's step and model), and the three end on one model.

Usage: launch_test.py TERN_BINARY. Exit 77 (skipped) without torch or grpc."""
import json
import os
import socket
import subprocess
import sys
import tempfile

SCRIPT = r'''
import json, sys, torch
from tern.optim import DistributedOptimizer

out = sys.argv[1]
torch.manual_seed(3)  # one initial model everywhere
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model)
target = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
data = torch.Generator().manual_seed(100 + opt.worker_id)  # each worker its own samples
losses = []
for step in range(40):
    x = torch.randn(64, 32, generator=data)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), x @ target)
    loss.backward()
    opt.step()
    losses.append(loss.item())
torch.save(model.state_dict(), "%s/final-%d.pt" % (out, opt.worker_id))
with open("%s/losses-%d.json" % (out, opt.worker_id), "w") as f:
    json.dump({"workers": opt.num_workers, "losses": losses}, f)
'''

ELASTIC_SCRIPT = r'''
import json, os, sys, time, torch
from tern.optim import DistributedOptimizer

out, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), model)
first = opt.step_count  # a joiner's: the group's step
target = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
data = torch.Generator().manual_seed(100 + opt.worker_id)
while opt.step_count < steps:
    x = torch.randn(64, 32, generator=data)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x @ target).backward()
    opt.step()
    with open("%s/progress-%d" % (out, opt.worker_id), "w") as f:
        f.write(str(opt.step_count))
    # Past step 60 the first two go slowly until the joiner has stepped: a joiner's script that
    # starts slowly (torch's import on a loaded machine) must find the group still running.
    joined = os.path.exists("%s/progress-2" % out)
    time.sleep(0.02 if joined or opt.step_count < 60 else 0.2)
torch.save(model.state_dict(), "%s/final-%d.pt" % (out, opt.worker_id))
with open("%s/first-%d.json" % (out, opt.worker_id), "w") as f:
    json.dump({"first": first, "workers": opt.num_workers}, f)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish(procs):
    """The launchers' outputs once they all ended, or None (having said so, and killed them)
    when one did not within 240 s."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("FAILED: a launcher did not finish in 240 s")
            return None
    return outs


def launch_three(tern, d, rdzv, wrap):
    """Runs the same `tern launch` three times, the i-th under wrap(i) (a command prefix); the
    launchers' outputs, or None (having said why) when one failed."""
    script = os.path.join(d, "train.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    cmd = [tern, "launch", "--rdzv=" + rdzv, "--nnodes=3", "--plaintext",
           "--algorithm=diloco", "--topology=complete", "--local_steps=5",
           "--outer=nesterov:lr=0.7,momentum=0.9", "--codec=fp4", "--round_timeout=60",
           "--peers_timeout=60", "--log_level=info", "--", "/usr/bin/python3", script, d]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(wrap(i) + cmd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(3)]
    outs = finish(procs)
    if outs is None:
        return None
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            print("\n----\n".join(outs))
            print("FAILED: a launcher exited %d" % p.returncode)
            return None
    serving = sum("serving the rendezvous on" in out for out in outs)
    if serving != 1:
        print("\n----\n".join(outs))
        print("FAILED: %d launchers served the rendezvous, not 1" % serving)
        return None
    return outs


def one_model(torch, d):
    """Whether the three scripts ended on one model, each with its loss down by half."""
    models = [torch.load("%s/final-%d.pt" % (d, i)) for i in range(3)]
    for name, value in models[0].items():
        if any(not torch.equal(value, m[name]) for m in models[1:]):
            print("FAILED: the final models differ in %s" % name)
            return False
    for i in range(3):
        with open("%s/losses-%d.json" % (d, i)) as f:
            run = json.load(f)
        first, last = sum(run["losses"][:5]) / 5, sum(run["losses"][-5:]) / 5
        if run["workers"] != 3 or not last < 0.5 * first:
            print("FAILED: worker %d: %d workers, loss %.4f -> %.4f" %
                  (i, run["workers"], first, last))
            return False
        print("worker %d of 3: loss %.4f -> %.4f" % (i, first, last))
    return True


def launch_elastic(tern, torch, d, rdzv):
    """--nnodes=2:3: two launchers start the run; a third joins it while it runs. Whether the
    joiner went on from the group's step and the three ended on one model."""
    import time
    script = os.path.join(d, "elastic.py")
    with open(script, "w") as f:
        f.write(ELASTIC_SCRIPT)
    steps = 200
    cmd = [tern, "launch", "--rdzv=" + rdzv, "--nnodes=2:3", "--plaintext",
           "--algorithm=diloco", "--topology=complete", "--local_steps=5",
           "--outer=nesterov:lr=0.7,momentum=0.9", "--codec=fp4", "--round_timeout=60",
           "--peers_timeout=60", "--log_level=info", "--", "/usr/bin/python3", script, d,
           str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = lambda: subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
    procs = [start(), start()]

    def progress():
        try:
            with open(os.path.join(d, "progress-0")) as f:
                return int(f.read() or 0)
        except (OSError, ValueError):
            return 0
    until = time.time() + 120
    while progress() < 40 and time.time() < until:
        time.sleep(0.05)
    if progress() < 40:
        for p in procs:
            p.kill()
        print("\n----\n".join(p.communicate()[0] for p in procs))
        print("FAILED: the elastic run did not start with two launchers")
        return False
    procs.append(start())
    outs = finish(procs)
    if outs is None:
        return False
    if any(p.returncode != 0 for p in procs):
        print("\n----\n".join(outs))
        print("FAILED: an elastic launcher exited %s" % [p.returncode for p in procs])
        return False
    with open(os.path.join(d, "first-2.json")) as f:
        joiner = json.load(f)
    if joiner["first"] < 40 or joiner["workers"] != 3:
        print(outs[2])
        print("FAILED: the joiner (worker 2) began at step %d of %d workers, not at the group's"
              % (joiner["first"], joiner["workers"]))
        return False
    models = [torch.load("%s/final-%d.pt" % (d, i)) for i in range(3)]
    for name, value in models[0].items():
        if any(not torch.equal(value, m[name]) for m in models[1:]):
            print("\n----\n".join(outs))
            print("FAILED: the elastic run's final models differ in %s" % name)
            return False
    print("tern launch --nnodes=2:3: worker 2 joined at step %d of %d, one model" %
          (joiner["first"], steps))
    return True


def main():
    tern = sys.argv[1]
    try:
        import grpc  # noqa: F401
        import torch
    except ImportError as e:
        print("skipped: %s" % e)
        return 77
    with tempfile.TemporaryDirectory(prefix="tern-launch-test-") as d:
        outs = launch_three(tern, d, "127.0.0.1:%d" % free_port(), lambda i: [])
        if outs is None or not one_model(torch, d):
            return 1
        print("tern launch on 127.0.0.1: 3 launchers, one rendezvous, one model")
    with tempfile.TemporaryDirectory(prefix="tern-launch-test-") as d:
        if not launch_elastic(tern, torch, d, "127.0.0.1:%d" % free_port()):
            return 1
    if os.geteuid() != 0:
        print("not root: the three hosts in network namespaces are not tried")
        return 0
    slow_link = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                             "slow-link.sh")
    env = dict(os.environ, SLOW_LINK_PREFIX="tlt", SLOW_LINK_NET="10.79.41")
    up = subprocess.run(["bash", slow_link, "up", "3", "1gbit"], env=env, capture_output=True,
                        text=True)
    try:
        if up.returncode != 0:
            print("no network namespaces here (%s): the three hosts are not tried" %
                  (up.stderr.strip() or up.stdout.strip()))
            return 0
        os.environ.update(SLOW_LINK_PREFIX="tlt", SLOW_LINK_NET="10.79.41")
        with tempfile.TemporaryDirectory(prefix="tern-launch-test-") as d:
            outs = launch_three(tern, d, "10.79.41.1:29400",
                                lambda i: ["bash", slow_link, "exec", str(i)])
            if outs is None or not one_model(torch, d):
                return 1
            for i, out in enumerate(outs):
                if "--listen=10.79.41.%d:0" % (i + 1) not in out:
                    print(out)
                    print("FAILED: host %d's worker does not listen on its own address" % i)
                    return 1
            print("tern launch on 3 hosts (network namespaces 10.79.41.1-3): one rendezvous, "
                  "one model")
    finally:
        subprocess.run(["bash", slow_link, "down"], env=env, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
