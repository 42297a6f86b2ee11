#!/usr/bin/python3
"""The race: tern against PyTorch DDP over shaped links (issue 16; docs/benchmarks.md).

    sudo /usr/bin/python3 bench/race/race.py --rates 100mbit,10mbit [--rtts 0,20,100] [--rows ...]

For each rate and round trip it builds one network namespace per worker joined by a bridge, every
link shaped with tbf and every packet between sites held rtt/2 by tern-delay-line
(bench/race/netns.py), and runs each row there, one after another, on the same model,
data (Fashion-MNIST, iid shards), initial parameters, batch, learning-rate schedule and steps,
every worker with one compute thread on the same cores. It prints wall time, time to 84 % and
86 % test accuracy, MB each worker sent (counted on its interface), final accuracy, and every
tern row's speed-up over every anchor; it writes results.json and time-to-accuracy curves
(curves-RATE.png / .svg) under --out. Accuracy is that of the workers' average model, evaluated
after the run from snapshots kept in memory during it.
"""
import argparse
import datetime
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time

try:
    import numpy as np
    import torch  # noqa: F401 - every row evaluates with it
except ImportError as e:
    print(f"bench/race needs Debian's python3-torch (run /usr/bin/python3): {e}", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import blas_kernels  # noqa: E402
import common  # noqa: E402
import netns  # noqa: E402

PY = "/usr/bin/python3"
PORT = 7000
TARGETS = (0.84, 0.86)

# The README's configuration for a slow link (docs/benchmarks.md, session 14).
SLOW_LINK = ["--algorithm=choco", "--codec=stc:ratio=0.015", "--consensus_step=0.1"]
# name -> how it runs. "builtin": tern's own C++ trainer; "torch": rank.py drives the worker.
ROWS = {
    "ddp": {"kind": "ddp"},
    "ddp-powersgd": {"kind": "ddp-powersgd"},
    "tern-decentlam-fp16": {"kind": "tern", "trainer": "builtin",
                            "flags": ["--algorithm=decentlam", "--codec=fp16"]},
    "tern-choco-stc": {"kind": "tern", "trainer": "builtin", "flags": SLOW_LINK},
    "tern-choco-stc-torch": {"kind": "tern", "trainer": "torch", "flags": SLOW_LINK},
    "tern-choco-topk-torch": {"kind": "tern", "trainer": "torch",
                              "flags": ["--algorithm=choco", "--codec=topk:ratio=0.01",
                                        "--consensus_step=0.05"]},
}
# The same rows with --overlap: round t's transfer overlaps step t+1's compute (docs/worker.md).
for _name in ("tern-choco-stc", "tern-choco-stc-torch"):
    ROWS[_name + "-overlap"] = dict(ROWS[_name], flags=ROWS[_name]["flags"] + ["--overlap"])
# Buckets of one layer each (--bucket_mb=0.01: 2,621 values, below every layer's weights and
# bias together): each layer's message goes out as soon as the backward pass has its gradient.
for _name in ("tern-choco-stc", "tern-choco-stc-overlap"):
    ROWS[_name.replace("-stc", "-stc-bucketed")] = dict(
        ROWS[_name], flags=ROWS[_name]["flags"] + ["--bucket_mb=0.01"])
# The PyTorch trainer with the worker inside its process (tern.embedded): no second process.
ROWS["tern-choco-stc-embedded-overlap"] = dict(ROWS["tern-choco-stc-torch-overlap"],
                                               trainer="embedded")
# Two buckets (--bucket_mb=1: the first layer; the others): fewer, larger messages.
ROWS["tern-choco-stc-2buckets-overlap"] = dict(
    ROWS["tern-choco-stc-overlap"], flags=ROWS["tern-choco-stc-overlap"]["flags"] + ["--bucket_mb=1"])
# The same through PyTorch: each layer is sent from autograd's gradient hooks (tern.embedded).
ROWS["tern-choco-stc-embedded-bucketed-overlap"] = dict(
    ROWS["tern-choco-stc-embedded-overlap"],
    flags=ROWS["tern-choco-stc-embedded-overlap"]["flags"] + ["--bucket_mb=0.01"])
# Streaming DiLoCo among the workers with the built-in trainer (four fragments in 4-bit floats,
# each exchange behind the next step), H chosen from the link within [2, 100] from 5
# (docs/worker.md "Choosing H from the link"); "-fragments": the fragment count too, within
# [1, 4] (--fragments_min): one turn a period where the round trip, not the bytes, is the cost.
STREAMING = ["--algorithm=diloco", "--topology=complete", "--outer=nesterov:lr=0.7,momentum=0.9",
             "--codec=fp4", "--fragments=4", "--overlap", "--local_steps=5",
             "--local_steps_min=2", "--local_steps_max=100", "--cu_target=0.9",
             "--round_timeout=600", "--log_level=info"]
ROWS["tern-streaming-diloco-hrange"] = {"kind": "tern", "trainer": "builtin", "flags": STREAMING}
ROWS["tern-streaming-diloco-hrange-fragments"] = {
    "kind": "tern", "trainer": "builtin", "flags": STREAMING + ["--fragments_min=1"]}
DEFAULT_ROWS = "ddp,ddp-powersgd,tern-choco-stc,tern-choco-stc-torch"


def parse():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="100mbit", help="comma-separated tbf rates")
    p.add_argument("--rtts", default="0", help="comma-separated round trips between sites, ms")
    p.add_argument("--delay_line", default="", help="tern-delay-line (default: beside --tern)")
    p.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma-separated, of {','.join(ROWS)}")
    p.add_argument("--model", default="mlp:1024x1024", help="mlp:H1xH2 or cnn (torch rows only)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=470)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--snapshots", type=int, default=40, help="evaluation points per run")
    p.add_argument("--tern", default=os.path.join(ROOT, "build", "cli", "tern"))
    p.add_argument("--timeout", type=float, default=3600, help="seconds per row")
    p.add_argument("--tern_flags", default="",
                   help="space-separated flags appended to every tern row's worker (tuning: "
                        "'--codec=stc:ratio=0.01 --consensus_step=0.05' overrides the row's)")
    p.add_argument("--out", default="")
    p.add_argument("--keep_snapshots", action="store_true",
                   help="keep every row's parameter snapshots (7.45 MB each, ~1.2 GB a tern row) "
                        "after they are scored; by default only logs and results stay")
    p.add_argument("--data", default=common.DATA)
    return p.parse_args()


def env_for_ranks(a):
    """One compute thread everywhere; the Python client and the stubs generated beside --tern."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(a.tern)))
    env = dict(os.environ)
    # Every row on the OpenBLAS kernels the tern binary runs (bench/blas_kernels.py).
    env.update(a.blas_env)
    embedded = (os.environ.get("TERN_EMBEDDED_LIBRARY") or
                os.path.join(build, "clients", "embedded", "libtern_embedded.so"))
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TERN_EMBEDDED_LIBRARY=embedded,
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "clients", "python"),
                                           os.path.join(build, "clients", "python"), HERE]))
    return env


def tern_model_spec(model):
    return "mlp:hidden=" + model.split(":", 1)[1]


def prepare_init(a, out):
    """The built-in model's initial parameters, in tern's layout and in torch's order."""
    d = os.path.join(out, "init")
    subprocess.run([a.tern, "worker", "--workers=1", "--listen=127.0.0.1:0", "--max_steps=1",
                    f"--model={tern_model_spec(a.model)}", f"--batch={a.batch}", "--seed=1",
                    f"--snapshot_dir={d}", "--exit_after_training", "--log_level=warn"],
                   check=True)
    layout = json.load(open(os.path.join(d, "layout.json")))
    x = np.fromfile(os.path.join(d, "step-0.f32"), dtype="<f4")
    path = os.path.join(out, "init-torch.f32")
    common.from_tern_layout(x, layout).tofile(path)
    return path


def tern_worker_cmd(a, row, i, rdir, every):
    peers = ",".join(f"10.77.0.{j + 1}:{PORT}" for j in range(a.workers))
    cmd = [a.tern, "worker", f"--id={i}", f"--workers={a.workers}", f"--peers={peers}",
           f"--batch={a.batch}", f"--round_log={rdir}/rank-{i}.steps.jsonl", "--log_level=warn",
           "--seed=1", "--compute_threads=1",
           # The race's namespaces are a private network, and DDP's gloo is plaintext too.
           "--plaintext"] + row["flags"] + a.tern_flags.split()
    if row["trainer"] == "builtin":
        cmd += [f"--listen=10.77.0.{i + 1}:{PORT}", f"--model={tern_model_spec(a.model)}",
                f"--max_steps={a.steps}", "--epochs=1000", f"--snapshot_every={every}",
                "--max_snapshots=100000", f"--snapshot_dir={rdir}/rank-{i}",
                "--exit_after_training"]
    elif row["trainer"] == "embedded":  # rank.py passes these to tern.embedded
        cmd = cmd[2:] + [f"--listen=0.0.0.0:{PORT}"]
    else:
        cmd += [f"--listen=0.0.0.0:{PORT}", "--trainer=external"]
    return cmd


def rank_cmd(a, kind, i, rdir, every, init):
    cmd = [PY, os.path.join(HERE, "rank.py"), f"--kind={kind}", f"--rank={i}",
           f"--world={a.workers}", f"--model={a.model}", f"--steps={a.steps}",
           f"--batch={a.batch}", f"--snapshot_every={every}", f"--out={rdir}/rank-{i}",
           f"--data={a.data}", f"--master=10.77.0.1:29500", f"--worker=127.0.0.1:{PORT}"]
    return cmd + ([f"--init={init}"] if init else [])


def run_row(a, net, name, row, rdir, init):
    """Runs one row to the end; returns {ok, tx_mb, log}."""
    os.makedirs(rdir, exist_ok=True)
    every = max(1, a.steps // a.snapshots)
    before = [net.tx_bytes(i) for i in range(a.workers)]
    mains, daemons = [], []
    for i in range(a.workers):
        env = dict(env_for_ranks(a), GLOO_SOCKET_IFNAME=f"rv{i}")
        if row["kind"] == "tern":
            if row["trainer"] == "embedded":
                flags = [f"--worker_flag={f}" for f in tern_worker_cmd(a, row, i, rdir, every)]
                mains.append(net.popen(i, rank_cmd(a, "tern-embedded", i, rdir, every, init) +
                                       flags, f"{rdir}/rank-{i}.log", env))
                continue
            w = net.popen(i, tern_worker_cmd(a, row, i, rdir, every), f"{rdir}/worker-{i}.log",
                          env)
            (mains if row["trainer"] == "builtin" else daemons).append(w)
            if row["trainer"] == "torch":
                mains.append(net.popen(i, rank_cmd(a, "tern-torch", i, rdir, every, init),
                                       f"{rdir}/rank-{i}.log", env))
        else:
            mains.append(net.popen(i, rank_cmd(a, row["kind"], i, rdir, every, init),
                                   f"{rdir}/rank-{i}.log", env))
    ok = wait_all(mains, time.time() + a.timeout,
                  leader=mains[0] if row["kind"].startswith("ddp") else None)
    for d in daemons:
        d.terminate()
    for d in daemons:
        try:
            d.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    net.kill_all()
    after = [net.tx_bytes(i) for i in range(a.workers)]
    return {"ok": ok, "tx_mb": float(np.mean([(b - c) / 1e6 for b, c in zip(after, before)]))}


def wait_all(procs, deadline, leader=None):
    """True when every process exits 0; at the first failure or the deadline, False. With a
    `leader` (DDP's rank 0: training is synchronous, and it holds the snapshots), its exit 0
    is the row's: the others get 15 s more to exit 0, and lingering after that is not failing
    (the caller kills them)."""
    leader_done = False
    while time.time() < deadline:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            return False
        if all(c == 0 for c in codes):
            return True
        if leader is not None and not leader_done and leader.poll() == 0:
            leader_done = True
            deadline = min(deadline, time.time() + 15)
        time.sleep(0.2)
    return leader_done and all(p.poll() in (None, 0) for p in procs)


def snapshot_series(a, row, rdir):
    """[(steps, seconds since the start, average flat params in torch order)]."""
    ranks = [0] if row["kind"] != "tern" else list(range(a.workers))
    if row["kind"] == "tern" and row["trainer"] == "builtin":
        layout = json.load(open(f"{rdir}/rank-0/layout.json"))
        ends, starts = {}, []
        for i in ranks:
            for line in open(f"{rdir}/rank-{i}.steps.jsonl"):
                r = json.loads(line)
                s = r.get("step", 0) + 1
                ends[s] = max(ends.get(s, 0), r["end_unix_s"])
                if r.get("step", 0) == 0:
                    starts.append(r["start_unix_s"])
        t0 = min(starts)
        ends[0] = t0
        steps = sorted(set(layout["steps"]))
        convert = lambda x: common.from_tern_layout(x, layout)  # noqa: E731
    else:
        times = [json.load(open(f"{rdir}/rank-{i}/times.json")) for i in ranks]
        t0 = min(t["start_unix_s"] for t in times)
        ends = {}
        for t in times:
            for s, v in t["end_unix_s"].items():
                ends[int(s)] = max(ends.get(int(s), 0), v)
        steps = sorted(ends)
        convert = lambda x: x  # noqa: E731
    series = []
    for s in steps:
        files = [f"{rdir}/rank-{i}/step-{s}.f32" for i in ranks]
        if not all(os.path.exists(f) for f in files) or s not in ends:
            continue
        x = np.mean([np.fromfile(f, dtype="<f4") for f in files], axis=0).astype(np.float32)
        series.append((s, ends[s] - t0, convert(x)))
    return series


def time_split(a, rdir):
    """A tern row's mean ms per step by part, over every worker's round log."""
    parts = ("compute_s", "encode_s", "decode_s", "combine_s", "transfer_s", "wait_s",
             "trainer_io_s")
    sums, n = dict.fromkeys(parts + ("step", "other"), 0.0), 0
    for i in range(a.workers):
        for line in open(f"{rdir}/rank-{i}.steps.jsonl"):
            r = json.loads(line)
            step = r["end_unix_s"] - r["start_unix_s"]
            known = sum(r.get(k, 0.0) for k in parts)
            for k in parts:
                sums[k] += r.get(k, 0.0)
            sums["step"] += step
            sums["other"] += max(0.0, step - known)
            n += 1
    return {k: 1e3 * v / max(1, n) for k, v in sums.items()}


def evaluate(a, row, rdir, test):
    import torch
    torch.set_num_threads(2)
    model = common.make_model(a.model)
    curve = []
    for s, t, x in snapshot_series(a, row, rdir):
        common.load_flat(model, x)
        curve.append({"step": s, "t": t, "acc": common.accuracy(model, *test)})
    return curve


def drop_snapshots(rdir):
    """Scored snapshots go: a row keeps ~1.2 GB of them, and repeated races fill a disk."""
    for f in glob.glob(os.path.join(rdir, "rank-*", "step-*.f32")):
        os.remove(f)


def summarize(curve):
    out = {"wall_s": curve[-1]["t"] if curve else math.nan,
           "final_acc": curve[-1]["acc"] if curve else math.nan}
    for target in TARGETS:
        hit = next((c["t"] for c in curve if c["acc"] >= target), math.nan)
        out[f"t{int(target * 100)}_s"] = hit
    return out


def no_nans(v):
    """NaN (a target never reached) as JSON null."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: no_nans(x) for k, x in v.items()}
    if isinstance(v, list):
        return [no_nans(x) for x in v]
    return v


def nans(v):
    """JSON null (a target never reached) as NaN again: no_nans undone."""
    if v is None:
        return math.nan
    if isinstance(v, dict):
        return {k: nans(x) for k, x in v.items()}
    if isinstance(v, list):
        return [nans(x) for x in v]
    return v


def fmt(v, spec=".1f"):
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def print_table(rate, results):
    print(f"\n== {rate} ==")
    print(f"{'row':<24} {'wall s':>8} {'to 84 %':>8} {'to 86 %':>8} {'MB/worker':>10} "
          f"{'final acc':>9}")
    for name, r in results.items():
        if not r.get("ok"):
            print(f"{name:<24} failed (see its logs)")
            continue
        print(f"{name:<24} {fmt(r['wall_s']):>8} {fmt(r['t84_s']):>8} {fmt(r['t86_s']):>8} "
              f"{fmt(r['tx_mb']):>10} {fmt(100 * r['final_acc'], '.2f'):>8}%")
    for name, r in results.items():
        if "ms_per_step" in r:
            m = r["ms_per_step"]
            print(f"  {name}: ms per step " + ", ".join(
                f"{k.replace('_s', '')} {m[k]:.1f}" for k in
                ("step", "compute_s", "encode_s", "decode_s", "combine_s", "transfer_s", "wait_s",
                 "trainer_io_s", "other")) +
                f" (trainer I/O {100 * m['trainer_io_s'] / max(m['step'], 1e-9):.1f} %,"
                f" with other {100 * (m['trainer_io_s'] + m['other']) / max(m['step'], 1e-9):.1f} %)")
    anchors = [n for n in results if not n.startswith("tern") and results[n].get("ok")]
    for name, r in results.items():
        if not name.startswith("tern") or not r.get("ok"):
            continue
        for an in anchors:
            print(f"  {name} vs {an}: " + speedups(
                r, results[an], (("t84_s", "to 84 %"), ("t86_s", "to 86 %"), ("wall_s", "wall"))))


def speedups(mine, anchor, keys):
    """'to 84 % 1.52x, ...': how many times sooner `mine` got to each (key, label) than
    `anchor` (— where either never did)."""
    parts = []
    for key, label in keys:
        ratio = anchor[key] / mine[key] if mine[key] > 0 else math.nan
        parts.append(f"{label} " + ("—" if math.isnan(ratio) else f"{ratio:.2f}x"))
    return ", ".join(parts) + " sooner"


def pyplot():
    """matplotlib's pyplot drawing to files, or None (and why) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("(no matplotlib: apt-get install python3-matplotlib for the curves)")
        return None


def plot(rate, results, out):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, r in results.items():
        if r.get("curve"):
            pts = [(c["t"], 100 * c["acc"]) for c in r["curve"] if c["t"] > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, lw=1.6)
    for target in TARGETS:
        ax.axhline(100 * target, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("seconds since the first step (log scale)")
    ax.set_ylabel("test accuracy of the average model, %")
    ax.set_ylim(60, 90)
    ax.set_title(f"time to accuracy at {rate} per link")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"curves-{rate}.{ext}"))
    plt.close(fig)


def main():
    a = parse()
    netns.require_root()
    rows = a.rows.split(",")
    for r in rows:
        if r not in ROWS:
            raise SystemExit(f"unknown row {r!r}; rows: {', '.join(ROWS)}")
        if a.model == "cnn" and ROWS[r].get("trainer") == "builtin":
            raise SystemExit(f"row {r}: the built-in trainer has no CNN")
    out = a.out or os.path.join(
        "runs", "race-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    a.blas_env = blas_kernels.same_kernels_env(a.tern)
    print(f"OpenBLAS kernels on every row: {a.blas_env.get('OPENBLAS_CORETYPE', 'as detected')}",
          flush=True)
    init = prepare_init(a, out) if a.model.startswith("mlp") else ""
    test = common.load("test", a.data)
    everything = {"args": vars(a), "rates": {}}
    delay_line = a.delay_line or netns.find_delay_line(a.tern)
    links = [(r, float(t)) for r in a.rates.split(",") for t in a.rtts.split(",")]
    for rate_only, rtt in links:
        # A link's name: its rate, and its round trip when there is one ("100mbit-rtt20").
        rate = rate_only + (f"-rtt{rtt:g}" if rtt else "")
        results = {}
        with netns.Sites(a.workers, rate_only, rtt_ms=rtt, delay_line=delay_line) as net:
            for name in rows:
                rdir = os.path.join(out, rate, name)
                shutil.rmtree(rdir, ignore_errors=True)
                print(f"[{rate}] {name} ...", flush=True)
                r = run_row(a, net, name, ROWS[name], rdir, init)
                if r["ok"]:
                    r["curve"] = evaluate(a, ROWS[name], rdir, test)
                    r.update(summarize(r["curve"]))
                    if ROWS[name]["kind"] == "tern":
                        r["ms_per_step"] = time_split(a, rdir)
                    if not a.keep_snapshots:
                        drop_snapshots(rdir)
                results[name] = r
                print(f"[{rate}] {name}: " + ("ok" if r["ok"] else "FAILED") +
                      (f", wall {fmt(r['wall_s'])} s, final {fmt(100 * r['final_acc'], '.2f')} %"
                       if r["ok"] else f" (logs in {rdir})"), flush=True)
        print_table(rate, results)
        plot(rate, results, out)
        everything["rates"][rate] = results
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(no_nans(everything), f, indent=1)
    print(f"\nresults: {out}/results.json, curves: {out}/curves-*.png")
    failed = [n for r in everything["rates"].values() for n, v in r.items() if not v["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
