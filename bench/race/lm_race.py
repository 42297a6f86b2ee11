#!/usr/bin/python3
"""The language-model race: a byte-level GPT with AdamW over links with rate and delay, tern's
rows against DDP, PowerSGD, torch's PostLocalSGD and DiLoCo written in PyTorch (issue 39;
docs/benchmarks.md, "The language-model race").

    sudo /usr/bin/python3 bench/race/lm_race.py --rate 100mbit --rtt 20 [--layout 4shared]

One command runs every row at one rate, round trip and layout: the sites are network namespaces
joined by a bridge (bench/race/netns.py), every link shaped with tbf and every packet between sites
held rtt/2 (± half its tick, --delay_tick_ms) by tern-delay-line. Each row trains
examples/lm/gpt.py (0.88 M parameters, context 128) from the same initial parameters, each worker
on its own random windows of Python's documentation (8 windows a step), inner AdamW with warm-up
and cosine decay, for --steps steps or until --max_seconds. It prints per row: wall time, time to
each validation target (bits per byte of the shared model: DDP's, DiLoCo's outer model, the average
of the workers' models for gossip and PostLocalSGD, the group's outer model θ for
--algorithm=diloco (worker 0's snapshots, --snapshot_model=group), the aggregator's), MB each
worker sent (on its interface), compute utilization (the compute-only floor's seconds per step ×
this row's steps / its wall time), the row's wall time as a multiple of the floor's, the final
loss, the loss at equal time (bpb@T: each row's last snapshot by the time the first row to finish
took its last), a step's time split and where the cores went (CPU ms a step of every site's
trainers, daemons and the delay line, start-up included, against the cores' time); then every tern
row's ratio to every anchor. Curves against time and bytes: curves-*.png.

Layouts: 4shared (4 workers on the machine's cores, as the MLP race) and 2pinned (2 workers,
each site's processes pinned to a core of its own, so no row is judged by 4 processes sharing 2
cores). --grid tunes: every row at each H and learning rate of the grid, the best (earliest to
the last target reached, then lowest final loss) reported.
"""
import argparse
import datetime
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"bench/race needs Debian's python3-torch (run /usr/bin/python3): {e}", file=sys.stderr)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples", "lm"))
import gpt  # noqa: E402
import netns  # noqa: E402
from race import fmt, nans, no_nans, pyplot, speedups, wait_all  # noqa: E402

PY = "/usr/bin/python3"
PORT, SERVER_PORT = 7000, 7060
SLOW_LINK = ["--algorithm=choco", "--codec=stc:ratio=0.015", "--consensus_step=0.1"]
# Streaming DiLoCo's flags with the paper's overlap and merge (τ = 2, α = 0.5).
STREAMING_TAU2 = ["--algorithm=diloco", "--topology=complete",
                  "--outer=nesterov:lr=0.7,momentum=0.9", "--codec=fp4", "--fragments=4",
                  "--overlap", "--overlap_steps=2", "--merge_alpha=0.5", "--round_timeout=600"]
# The whole model's plain average among the workers in int8 with error feedback, the exchange
# overlapping a step that is kept (PostLocalSGD's averaging, docs/worker.md "--keep_overlap").
AVERAGE_INT8_KEEP = ["--algorithm=diloco", "--topology=complete", "--outer=average",
                     "--codec=int8", "--overlap", "--keep_overlap", "--round_timeout=600"]
# The same in fp4 (E3M0, a scale per block of 128): half int8's bytes, for the 10 Mbit/s link.
AVERAGE_FP4_KEEP = ["--codec=fp4" if f == "--codec=int8" else f for f in AVERAGE_INT8_KEEP]
# ... and in signs (a bit a value and one scale, the mean |x|, per 1,024; sign:chunk=1024).
AVERAGE_SIGN_KEEP = ["--codec=sign" if f == "--codec=int8" else f for f in AVERAGE_INT8_KEEP]
# The worker's --recipe=streaming-signs, with the flags the harness reads (diloco, --overlap)
# given too; a flag given after it (--outer) wins over the recipe's.
STREAMING_SIGNS = ["--recipe=streaming-signs", "--algorithm=diloco", "--topology=complete",
                   "--overlap", "--round_timeout=600"]
# SparseLoCo's recipe (error feedback decaying by 0.95 in place of outer momentum, 64 of every
# 4,096 values in 2 bits) with the exchange overlapped and the overlapped step kept.
SPARSELOCO_KEEP = ["--algorithm=diloco", "--topology=complete",
                   "--outer=sparseloco:lr=1,beta=0.95", "--codec=chunk-topk:chunk=4096,k=64,bits=2",
                   "--overlap", "--keep_overlap", "--round_timeout=600"]


def signs_variant(*flags):
    """A variant row of the streaming-signs recipe with `flags` after it (they win over its)."""
    return {"variant": True, "kind": "tern-optim", "uses_h": True,
            "worker": STREAMING_SIGNS + list(flags)}


# name -> kind (lm_rank.py), and for tern rows the worker's or the aggregator's flags (and
# "rank": lm_rank.py's).
ROWS = {
    "compute": {"kind": "compute"},
    "ddp": {"kind": "ddp"},
    "ddp-powersgd": {"kind": "ddp-powersgd"},
    "postlocalsgd": {"kind": "postlocalsgd", "uses_h": True},
    "diloco": {"kind": "diloco", "uses_h": True},
    "diloco-int8": {"kind": "diloco-int8", "uses_h": True},
    # DiLoCo int8 with the gentler outer step tern's streamed signs take (lr 1, momentum 0.3), so
    # the anchor is tuned over the outer step as tern's rows are; "-m5": lr 1, momentum 0.5.
    "diloco-int8-gentle": {"kind": "diloco-int8", "uses_h": True,
                           "rank": ["--outer_lr=1", "--outer_momentum=0.3"]},
    "diloco-int8-m5": {"variant": True, "kind": "diloco-int8", "uses_h": True,
                       "rank": ["--outer_lr=1", "--outer_momentum=0.5"]},
    # DiLoCo's loop with the plain average (outer lr 1, no momentum) in fp32: at H 1 the sites'
    # models averaged exactly after every AdamW step, the outer-step family's best case (no
    # codec, no overlap) against which its final loss is read.
    "diloco-average": {"variant": True, "kind": "diloco", "uses_h": True,
                       "rank": ["--outer_lr=1", "--outer_momentum=0"]},
    "tern-choco-stc": {"kind": "tern-optim", "worker": SLOW_LINK},
    # Round t's exchange overlaps step t+1's compute (docs/worker.md).
    "tern-choco-stc-overlap": {"kind": "tern-optim", "worker": SLOW_LINK + ["--overlap"]},
    "tern-decentlam-fp16": {"kind": "tern-optim",
                            "worker": ["--algorithm=decentlam", "--codec=fp16"]},
    "tern-localsgd": {"kind": "tern-fed", "uses_h": True, "server": ["--mode=local-sgd"]},
    "tern-slowmo": {"kind": "tern-fed", "uses_h": True,
                    "server": ["--mode=local-sgd", "--server_momentum=0.9", "--server_lr=0.7"]},
    # DiLoCo through the aggregator: the anchor's outer step (docs/server.md, --outer).
    "tern-diloco": {"kind": "tern-fed", "uses_h": True,
                    "server": ["--mode=local-sgd", "--outer=nesterov:lr=0.7,momentum=0.9"]},
    # The same with 4-bit outer gradients (E3M0, Streaming DiLoCo's) both ways: the clients' with
    # error feedback, the server's downstream delta with its residual.
    "tern-diloco-fp4": {"kind": "tern-fed", "uses_h": True,
                        "server": ["--mode=local-sgd", "--outer=nesterov:lr=0.7,momentum=0.9",
                                   "--update_codec=fp4", "--error_feedback",
                                   "--downstream=delta", "--downstream_codec=fp4"]},
    # SparseLoCo: 64 of every 4,096 values in 2 bits, the clients' error feedback decaying by 0.95
    # as the momentum.
    "tern-sparseloco": {"kind": "tern-fed", "uses_h": True,
                        "server": ["--mode=local-sgd", "--outer=sparseloco:lr=1,beta=0.95",
                                   "--update_codec=chunk-topk:chunk=4096,k=64,bits=2"]},
    # The same two without a server: the workers send their updates to each other (a complete
    # graph) and take the same outer step (docs/worker.md, --algorithm=diloco). A round may wait
    # for a slow link's exchange: a dropped neighbour would split the shared state.
    "tern-diloco-gossip-fp4": {"kind": "tern-optim", "uses_h": True,
                               "worker": ["--algorithm=diloco", "--topology=complete",
                                          "--outer=nesterov:lr=0.7,momentum=0.9", "--codec=fp4",
                                          "--round_timeout=600"]},
    # Streaming DiLoCo among the workers: four fragments (a transformer block each) take turns
    # through the period, each exchange overlapping the next step (docs/worker.md "Fragments").
    "tern-streaming-diloco-fp4": {"kind": "tern-optim", "uses_h": True,
                                  "worker": ["--algorithm=diloco", "--topology=complete",
                                             "--outer=nesterov:lr=0.7,momentum=0.9",
                                             "--codec=fp4", "--fragments=4", "--overlap",
                                             "--round_timeout=600"]},
    # The same with the paper's longer overlap and merge: each exchange has two steps' compute,
    # and the fragment becomes half the local model, half the group's (τ = 2, α = 0.5).
    "tern-streaming-diloco-fp4-tau2": {"kind": "tern-optim", "uses_h": True,
                                       "worker": STREAMING_TAU2},
    # The same after a synchronous warm-up as long as PostLocalSGD's (10 % of the steps;
    # --sync_steps, docs/worker.md): each step's models averaged after it; "-ddp": the sites'
    # gradients averaged before each AdamW step, as DDP (tern.optim's warm_up="gradients").
    "tern-streaming-diloco-fp4-tau2-sync": {"kind": "tern-optim", "uses_h": True, "sync": True,
                                            "worker": STREAMING_TAU2},
    "tern-streaming-diloco-fp4-tau2-sync-ddp": {"kind": "tern-optim", "uses_h": True,
                                                "sync": True, "worker": STREAMING_TAU2,
                                                "rank": ["--warm_up=gradients"]},
    # The whole model every H steps after the same warm-up (no fragments, the exchange
    # overlapping one step, no merge): where the link carries it, the fewest steps.
    "tern-diloco-gossip-fp4-sync": {"variant": True, "kind": "tern-optim", "uses_h": True, "sync": True,
                                    "worker": ["--algorithm=diloco", "--topology=complete",
                                               "--outer=nesterov:lr=0.7,momentum=0.9",
                                               "--codec=fp4", "--overlap",
                                               "--round_timeout=600"]},
    # The same warmed by DDP's steps (the gradients averaged), with Nesterov's outer step or
    # with plain averaging (PostLocalSGD's, but in fp4 with error feedback).
    "tern-diloco-gossip-fp4-sync-ddp": {"kind": "tern-optim", "uses_h": True, "sync": True,
                                        "rank": ["--warm_up=gradients"],
                                        "worker": ["--algorithm=diloco", "--topology=complete",
                                                   "--outer=nesterov:lr=0.7,momentum=0.9",
                                                   "--codec=fp4", "--overlap",
                                                   "--round_timeout=600"]},
    # PostLocalSGD's recipe among the workers: DDP's steps for the warm-up, then the whole
    # model's plain average every H steps, in int8 with error feedback (a quarter of its bytes).
    # "-keep": the exchange overlaps the next step, which is kept on the new average
    # (--keep_overlap). "-nesterov": an outer Nesterov step (lr 1, momentum 0.5), gentler
    # than DiLoCo's 0.7 / 0.9 at this H.
    "tern-average-int8-sync-ddp": {"variant": True, 
        "kind": "tern-optim", "uses_h": True, "sync": True, "rank": ["--warm_up=gradients"],
        "worker": ["--algorithm=diloco", "--topology=complete", "--outer=average",
                   "--codec=int8", "--round_timeout=600"]},
    "tern-average-int8-sync-ddp-keep": {"variant": True,
        "kind": "tern-optim", "uses_h": True, "sync": True, "rank": ["--warm_up=gradients"],
        "worker": AVERAGE_INT8_KEEP},
    # The models' warm-up (tern.optim's default): each step your AdamW step, then the models'
    # mean, mixed at the next step with that step kept (--overlap --keep_overlap).
    "tern-average-int8-sync-keep": {"variant": True,
        "kind": "tern-optim", "uses_h": True, "sync": True,
        "worker": AVERAGE_INT8_KEEP},
    # No warm-up: the plain average every H steps from the first, in int8 with error feedback,
    # the exchange overlapping a step that is kept. At a short H (3-5) its exchange hides behind
    # the steps between and the group's model moves nearly as one (session 52, docs/benchmarks.md).
    "tern-average-int8-keep": {"kind": "tern-optim", "uses_h": True,
        "worker": AVERAGE_INT8_KEEP},
    # The same in fp4, and with each exchange overlapping four steps, all kept (H > 4): at
    # 10 Mbit/s a whole model's exchange to three peers outruns one step.
    "tern-average-fp4-keep": {"variant": True, "kind": "tern-optim", "uses_h": True,
        "worker": AVERAGE_FP4_KEEP},
    "tern-average-fp4-keep-tau4": {"variant": True, "kind": "tern-optim", "uses_h": True,
        "worker": AVERAGE_FP4_KEEP + ["--overlap_steps=4"]},
    # ... in signs: at 100 Mbit/s, 100 ms run at --grid 'h=3;lr=6e-3' (1.34-1.42x DiLoCo int8's
    # time to 4.0 at 1.07-1.14x the floor; docs/benchmarks.md, session 66).
    "tern-average-sign-keep": {"variant": True, "kind": "tern-optim", "uses_h": True,
        "worker": AVERAGE_SIGN_KEEP},
    # ... streamed: the model in three fragments exchanged in turn (at H 3, one a step), so a
    # step's exchange carries a third of the signs (~113 KB to three peers: at 10 Mbit/s, 100 ms
    # within one overlapped step, where the whole model's 340 KB are not).
    "tern-streaming-average-sign-keep": {"variant": True, "kind": "tern-optim", "uses_h": True,
        "worker": AVERAGE_SIGN_KEEP + ["--fragments=3"]},
    # tern's recipe for a slow link (--recipe=streaming-signs, docs/worker.md "Recipes"): the
    # streamed signs with an outer Nesterov step (lr 1, momentum 0.3: a steady step of 1.4 times
    # the mean update) in place of the plain average. "-m4", "-m5": the recipe with momentum 0.4
    # and 0.5, which overshoot at H 3.
    "tern-streaming-signs": {"kind": "tern-optim", "uses_h": True, "worker": STREAMING_SIGNS},
    # "-calls": the recipe with a Gossip.Push call for each message (--push_streams=false), as
    # every row was sent before session 72: the A/B of the long-lived stream per peer.
    "tern-streaming-signs-calls": signs_variant("--push_streams=false"),
    "tern-streaming-signs-m4": signs_variant("--outer=nesterov:lr=1,momentum=0.4"),
    "tern-streaming-signs-m5": signs_variant("--outer=nesterov:lr=1,momentum=0.5"),
    # The recipe with the whole model's signs every step (H 1, no fragments), where the link
    # carries 340 KB to three peers within a step's compute (100 Mbit/s and up). Its momentum
    # overshoots at H 1 (3.615); the plain average there (tern-average-sign-keep at H 1) takes
    # DDP's steps to 4.0 and 3.75 (docs/benchmarks.md, session 61).
    "tern-signs-every-step": signs_variant("--fragments=1"),
    # Between H 3 and H 1, for 100 Mbit/s (run at --grid 'h=2'): the model in two fragments, one
    # exchanged each step, with the recipe's step ("-f2": overshoots, 3.609), a lighter momentum
    # ("-f2-m15": 59 and 141 steps to 4.0 and 3.75, 3.541), or the plain average
    # ("tern-streaming-average-sign-keep-f2": 57 and 141, 3.576; docs/benchmarks.md, session 63).
    "tern-streaming-signs-f2": signs_variant("--fragments=2"),
    "tern-streaming-signs-f2-m15": signs_variant("--fragments=2",
                                                 "--outer=nesterov:lr=1,momentum=0.15"),
    "tern-streaming-average-sign-keep-f2": {"variant": True, "kind": "tern-optim",
        "uses_h": True, "worker": AVERAGE_SIGN_KEEP + ["--fragments=2"]},
    # "-o15", "-o2", "-o3": a larger outer step (lr 1.5 / momentum 0.3; lr 2 and 3, no momentum),
    # to make up for the four sites' AdamW steps partly cancelling in the mean: each ends higher
    # (docs/benchmarks.md, session 61).
    "tern-streaming-signs-o15": signs_variant("--outer=nesterov:lr=1.5,momentum=0.3"),
    "tern-streaming-signs-o2": signs_variant("--outer=nesterov:lr=2,momentum=0"),
    "tern-streaming-signs-o3": signs_variant("--outer=nesterov:lr=3,momentum=0"),
    # ... with each exchange overlapping two steps, both kept: at 10 Mbit/s, 100 ms a whole
    # model's signs to three peers (340 KB, ~0.3 s with the round trip) outrun one step.
    "tern-average-sign-keep-tau2": {"variant": True, "kind": "tern-optim", "uses_h": True,
        "worker": AVERAGE_SIGN_KEEP + ["--overlap_steps=2"]},
    # "-tau2": each exchange overlaps two steps (--overlap_steps=2), both kept: for a link whose
    # exchange outruns one step (100 Mbit/s, 100 ms).
    "tern-average-int8-sync-ddp-keep-tau2": {"variant": True,
        "kind": "tern-optim", "uses_h": True, "sync": True, "rank": ["--warm_up=gradients"],
        "worker": ["--algorithm=diloco", "--topology=complete", "--outer=average",
                   "--codec=int8", "--overlap", "--overlap_steps=2", "--keep_overlap",
                   "--round_timeout=600"]},
    # The same in fp4 (e2m1, a scale per block): half int8's bytes, warm-up and exchanges alike.
    "tern-average-fp4-sync-ddp-keep": {"variant": True,
        "kind": "tern-optim", "uses_h": True, "sync": True, "rank": ["--warm_up=gradients"],
        "worker": ["--algorithm=diloco", "--topology=complete", "--outer=average",
                   "--codec=fp4", "--overlap", "--keep_overlap", "--round_timeout=600"]},
    "tern-nesterov-int8-sync-ddp-keep": {"variant": True, 
        "kind": "tern-optim", "uses_h": True, "sync": True, "rank": ["--warm_up=gradients"],
        "worker": ["--algorithm=diloco", "--topology=complete",
                   "--outer=nesterov:lr=1,momentum=0.5", "--codec=int8", "--overlap",
                   "--keep_overlap", "--round_timeout=600"]},
    "tern-diloco-gossip-fp4-sync-ddp-average": {"variant": True, 
        "kind": "tern-optim", "uses_h": True, "sync": True, "rank": ["--warm_up=gradients"],
        "worker": ["--algorithm=diloco", "--topology=complete", "--outer=average", "--codec=fp4",
                   "--overlap", "--round_timeout=600"]},
    # The warmed row with plain averaging for its outer step (local SGD after the warm-up, as
    # PostLocalSGD, but streamed in fp4 fragments with the exchange overlapped).
    "tern-streaming-average-tau2-sync": {"variant": True, "kind": "tern-optim", "uses_h": True, "sync": True,
                                         "worker": STREAMING_TAU2 + ["--outer=average"]},
    # The warmed row with its updates' codec chosen from the link (--codec_ladder, from fp4 up to
    # int8 and fp32 where the measured link keeps compute utilization at 90 %; docs/worker.md).
    "tern-streaming-diloco-tau2-sync-ladder": {
        "kind": "tern-optim", "uses_h": True, "sync": True,
        "worker": STREAMING_TAU2 + ["--codec_ladder=none,int8,fp4", "--cu_target=0.9",
                                    "--log_level=info"]},
    # The warmed row with H chosen from the link (--local_steps_max: each worker proposes the least
    # H that keeps its compute utilization at 90 % over its link as measured, and the group takes
    # the largest; docs/worker.md "Choosing H from the link"), from the grid's H, within [3, 40].
    "tern-streaming-diloco-fp4-tau2-sync-hrange": {
        "kind": "tern-optim", "uses_h": True, "sync": True,
        "worker": STREAMING_TAU2 + ["--local_steps_min=3", "--local_steps_max=40",
                                    "--cu_target=0.9", "--log_level=info"]},
    # The same with the fragment count chosen with H, within [1, 4] (--fragments_min; docs/worker.md
    # "Choosing the fragment count from the link").
    "tern-streaming-diloco-fp4-tau2-sync-hfrange": {
        "kind": "tern-optim", "uses_h": True, "sync": True,
        "worker": STREAMING_TAU2 + ["--local_steps_min=3", "--local_steps_max=40",
                                    "--fragments_min=1", "--cu_target=0.9", "--log_level=info"]},
    # Unwarmed, from fp32 down the same ladder: a user who starts too wide for the link.
    "tern-streaming-diloco-tau2-ladder-from-fp32": {
        "kind": "tern-optim", "uses_h": True,
        "worker": STREAMING_TAU2 + ["--codec=none", "--codec_ladder=none,int8,fp4",
                                    "--cu_target=0.9", "--log_level=info"]},
    # The same cut as the paper cuts it: the transformer's blocks dealt out in turn (block l in
    # fragment l mod 4; the embeddings and head to the lightest), each fragment spanning the
    # depth (docs/worker.md "Fragments").
    "tern-streaming-diloco-fp4-tau2-strided": {
        "kind": "tern-optim", "uses_h": True,
        "worker": STREAMING_TAU2 + ["--fragment_cut=strided"]},
    # One-step-delayed outer steps with eager updates: each exchange runs through the next
    # period's H steps, which start from the outer model stepped with the worker's own update as
    # a stand-in for the group's (docs/worker.md "Delayed and eager outer steps"); whole-model,
    # and in four fragments. A round's delay shrinks the outer step that stays stable: DiLoCo's
    # (lr 0.7, μ 0.9, a sum of 7) diverged here (4.97 bpb at H 10, 6.08 at H 25), so momentum 0.3
    # (a sum of 1).
    "tern-diloco-eager-fp4": {"kind": "tern-optim", "uses_h": True,
                              "worker": ["--algorithm=diloco", "--topology=complete",
                                         "--outer=nesterov:lr=0.7,momentum=0.3", "--codec=fp4",
                                         "--overlap", "--outer_delay=eager",
                                         "--round_timeout=600"]},
    "tern-streaming-diloco-fp4-eager": {"kind": "tern-optim", "uses_h": True,
                                        "worker": ["--algorithm=diloco", "--topology=complete",
                                                   "--outer=nesterov:lr=0.7,momentum=0.3",
                                                   "--codec=fp4", "--fragments=4", "--overlap",
                                                   "--outer_delay=eager", "--round_timeout=600"]},
    "tern-sparseloco-gossip": {"kind": "tern-optim", "uses_h": True,
                               "worker": ["--algorithm=diloco", "--topology=complete",
                                          "--outer=sparseloco:lr=1,beta=0.95",
                                          "--codec=chunk-topk:chunk=4096,k=64,bits=2",
                                          "--round_timeout=600"]},
    # SparseLoCo among the workers with the exchange overlapping a step that is kept, as the
    # average rows (--overlap --keep_overlap): 64 of 4,096 (1.6 %) or 128 (3 %, the paper's
    # densest) in 2 bits.
    "tern-sparseloco-keep": {"kind": "tern-optim", "uses_h": True, "worker": SPARSELOCO_KEEP},
    "tern-sparseloco-keep-k128": {"kind": "tern-optim", "uses_h": True,
        "worker": [f.replace("k=64", "k=128") for f in SPARSELOCO_KEEP]},
}
DEFAULT_ROWS = ",".join(ROWS)


def parse():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--rtt", type=float, default=0.0, help="round trip between sites, ms")
    p.add_argument("--layout", default="4shared", choices=["4shared", "2pinned"])
    p.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma-separated, of {','.join(ROWS)}")
    p.add_argument("--skip_variants", action="store_true",
                   help="leave out the rows that only change another row's settings (their "
                        "\"variant\"), as the smoke test does")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3, help="inner AdamW's peak learning rate")
    p.add_argument("--h", type=int, default=50, help="inner steps between synchronizations")
    p.add_argument("--grid", default="",
                   help="tune every row over 'h=25,50,100;lr=1e-3,3e-3' (H only where used; "
                        "'h.ROW=10,25' or 'lr.ROW=3e-3' gives ROW its own)")
    p.add_argument("--targets", default="4.0,3.75,3.6", help="validation bits per byte")
    p.add_argument("--snapshots", type=int, default=20, help="evaluation points per run")
    p.add_argument("--max_seconds", type=float, default=300, help="a row's time limit")
    p.add_argument("--tern", default=os.path.join(ROOT, "build", "cli", "tern"))
    p.add_argument("--delay_line", default="")
    p.add_argument("--delay_tick_ms", type=float, default=None,
                   help="the delay line's tick (default: netns.tick_ms of --rtt; 0: it wakes "
                        "for every packet)")
    p.add_argument("--out", default="")
    p.add_argument("--table", default="", metavar="RESULTS_JSON",
                   help="print a finished run's table again from its results-*.json (no root)")
    p.add_argument("--summary", nargs="+", default=[], metavar="RESULTS_JSON",
                   help="one line per finished run: tern's first row to each target against "
                        "the first anchor's, and the lowest loss at equal time (no root)")
    p.add_argument("--markdown", action="store_true", help="the table's rows in Markdown")
    return p.parse_args()


def env_for(a):
    build = os.path.dirname(os.path.dirname(os.path.abspath(a.tern)))
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "clients", "python"),
                                           os.path.join(build, "clients", "python"), HERE]))
    # The aggregator rows' clients encode their updates (and catch up from deltas) through the C
    # API; without it they would send fp32 whatever the row's --update_codec.
    lib = os.path.join(build, "clients", "c", "libtern_c.so")
    if "TERN_LIBRARY" not in env and os.path.exists(lib):
        env["TERN_LIBRARY"] = lib
    return env


def pin(a, i, cmd):
    """2pinned: site i's processes on core i alone."""
    return ["taskset", "-c", str(i % os.cpu_count())] + cmd if a.layout == "2pinned" else cmd


def overlap_of(row):
    """Steps a diloco row's exchange overlaps (the worker's --overlap, --overlap_steps)."""
    flags = row.get("worker", [])
    if "--overlap" not in flags:
        return 0
    steps = [f.split("=", 1)[1] for f in flags if f.startswith("--overlap_steps=")]
    return int(steps[-1]) if steps else 1


def group_model_rows(row):
    """diloco among the workers: evaluated on the group's outer model θ, as DiLoCo's rows are
    (lm_rank.py fetches the worker's snapshots of it, --snapshot_model=group)."""
    return "--algorithm=diloco" in row.get("worker", [])


def rank_cmd(a, row, i, rdir, every, h, lr):
    group = (["--group_snapshots", f"--eval_offset={overlap_of(row)}"]
             if group_model_rows(row) else [])
    return [PY, os.path.join(HERE, "lm_rank.py"), f"--kind={row['kind']}", f"--rank={i}",
            f"--world={a.workers}", f"--steps={a.steps}", f"--batch={a.batch}", f"--lr={lr}",
            f"--h={h}", f"--snapshot_every={every}", f"--max_seconds={a.max_seconds}",
            f"--out={rdir}/rank-{i}", "--master=10.77.0.1:29500",
            f"--worker=127.0.0.1:{PORT}",
            f"--server=10.77.0.1:{SERVER_PORT}"] + group + row.get("rank", [])


def worker_cmd(a, row, i, rdir, h):
    peers = ",".join(f"10.77.0.{j + 1}:{PORT}" for j in range(a.workers))
    local = [f"--local_steps={h}"] if row.get("uses_h") else []
    if row.get("sync"):  # as long as lm_rank.py's PostLocalSGD runs DDP
        local.append(f"--sync_steps={max(1, int(0.1 * a.steps))}")
    if group_model_rows(row) and i == 0:
        # θ kept on worker 0 alone (only its θ is evaluated), all of them: lm_rank.py fetches
        # those it evaluates after the clock stops. With H fixed, only the steps lm_rank.py
        # evaluates (each exchange's θ as soon as it is mixed); with H moving, every step's.
        if any(f.startswith("--local_steps_max=") for f in row["worker"]):
            local += ["--snapshot_every=1", f"--max_snapshots={a.steps + 2}"]
        else:
            local += [f"--snapshot_every={h}", f"--snapshot_offset={overlap_of(row) % h}",
                      f"--max_snapshots={a.steps // h + 2}"]
        local.append("--snapshot_model=group")
    return [a.tern, "worker", f"--id={i}", f"--workers={a.workers}", f"--peers={peers}",
            f"--listen=0.0.0.0:{PORT}", "--trainer=external", "--momentum=0", "--seed=1",
            "--compute_threads=1", "--plaintext", "--log_level=warn",
            f"--round_log={rdir}/rank-{i}.steps.jsonl"] + local + row["worker"]


def server_cmd(a, row, rdir, h):
    rounds = math.ceil(a.steps / h)
    return [a.tern, "server", f"--listen=10.77.0.1:{SERVER_PORT}", "--plaintext",
            f"--min_clients={a.workers}", f"--clients_per_round={a.workers}",
            f"--rounds={rounds}", "--local_epochs=0", f"--local_steps={h}",
            "--round_deadline_s=600", "--client_timeout_s=600", "--linger_s=30",
            "--log_level=warn"] + row["server"]


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` (all its threads), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RowSampler:
    """While a row runs: each site's interface byte counter every second (bytes against time,
    for the curves against bytes), and the CPU seconds of the row's processes by role (trainers,
    daemons, the delay line) every quarter second, so a process that exits is counted to within
    a quarter second: where the cores went (a row that waits leaves them idle; one whose daemons
    work takes them from its trainers)."""

    def __init__(self, net, n):
        self.net, self.n, self.samples, self._stop = net, n, [], threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._lock = threading.Lock()
        self._watched = []  # [role, pid, first seen, last seen]
        if net.delay_proc is not None:  # it runs through every row: this row's share of it
            self.watch("delay line", net.delay_proc.pid, since_now=True)

    def watch(self, role, pid, since_now=False):
        """Counts process `pid`'s CPU under `role`: all of it (a process the row started) or,
        since_now, what it uses from here on."""
        first = cpu_seconds(pid) if since_now else 0.0
        with self._lock:
            self._watched.append([role, pid, first or 0.0, first or 0.0])

    def sample_cpu(self):
        with self._lock:
            for w in self._watched:
                now = cpu_seconds(w[1])
                if now is not None:
                    w[3] = max(w[3], now)

    def cpu_s(self):
        """{role: CPU seconds this row's processes of that role used}."""
        out = {}
        with self._lock:
            for role, _, first, last in self._watched:
                out[role] = out.get(role, 0.0) + last - first
        return out

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def _tx(self):
        self.samples.append((time.time(), [self.net.tx_bytes(i) for i in range(self.n)]))

    def _loop(self):
        tick = 0
        while True:
            self.sample_cpu()
            if tick % 4 == 0:
                self._tx()
            tick += 1
            if self._stop.wait(0.25):
                self.sample_cpu()
                self._tx()
                return

    def mb_at(self, t):
        """Mean MB per site sent by time t (linear between samples)."""
        s = self.samples
        base = np.mean(s[0][1])
        for (t0, b0), (t1, b1) in zip(s, s[1:]):
            if t <= t1:
                f = 0 if t1 == t0 else max(0.0, (t - t0) / (t1 - t0))
                return (np.mean(b0) + f * (np.mean(b1) - np.mean(b0)) - base) / 1e6
        return (np.mean(s[-1][1]) - base) / 1e6


def run_row(a, net, name, row, rdir, h, lr):
    shutil.rmtree(rdir, ignore_errors=True)
    os.makedirs(rdir)
    every = max(1, a.steps // a.snapshots)
    env = env_for(a)
    mains, daemons = [], []
    with RowSampler(net, a.workers) as tx:
        if row["kind"] == "tern-fed":
            daemons.append(net.popen(0, pin(a, 0, server_cmd(a, row, rdir, h)),
                                     f"{rdir}/server.log", env))
            tx.watch("server", daemons[-1].pid)
        for i in range(a.workers):
            env_i = dict(env, GLOO_SOCKET_IFNAME=f"rv{i}")
            if row["kind"] == "tern-optim":
                daemons.append(net.popen(i, pin(a, i, worker_cmd(a, row, i, rdir, h)),
                                         f"{rdir}/worker-{i}.log", env_i))
                tx.watch("daemons", daemons[-1].pid)
            mains.append(net.popen(i, pin(a, i, rank_cmd(a, row, i, rdir, every, h, lr)),
                                   f"{rdir}/rank-{i}.log", env_i))
            tx.watch("trainers", mains[-1].pid)
        # Rank 0's exit ends these rows: synchronous training (its snapshots are the model), and
        # the aggregator rows, whose site 0 decides the time cut.
        led = row["kind"] in ("ddp", "ddp-powersgd", "diloco", "diloco-int8", "postlocalsgd",
                              "tern-fed")
        ok = wait_all(mains, time.time() + a.max_seconds + 180,
                      leader=mains[0] if led else None)
        tx.sample_cpu()
        for d in daemons:
            d.terminate()
        for d in daemons:
            try:
                d.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        net.kill_all()
    if not net.delay_line_alive():
        raise SystemExit("tern-delay-line died: the links lost their delay (see its log)")
    return {"ok": ok, "tx": tx, "cpu_s": tx.cpu_s()}


def ranks_of(row, workers):
    """Whose snapshots make the row's model: one (the shared one, or what worker 0 holds) or
    every worker's average."""
    # --algorithm=diloco: worker 0's snapshots of the group's outer model θ, the same on every
    # worker (the workers' own models differ mid-period, and their average is a model nobody
    # holds: it would be a free extra all-reduce).
    shared = row["kind"] in ("compute", "ddp", "ddp-powersgd", "diloco", "diloco-int8", "tern-fed")
    return [0] if shared or "--algorithm=diloco" in row.get("worker", []) else list(range(workers))


def evaluate(a, row, rdir, corpus, windows, tx):
    model = gpt.GPT(gpt.GPTConfig(context=128))
    ranks = ranks_of(row, a.workers)
    summaries = [json.load(open(f"{rdir}/rank-{i}/summary.json"))
                 for i in range(a.workers) if os.path.exists(f"{rdir}/rank-{i}/summary.json")]
    t0 = min(s["start_unix_s"] for s in summaries)
    times = {}
    for i in ranks:
        for line in open(f"{rdir}/rank-{i}/times.jsonl"):
            r = json.loads(line)
            times.setdefault(r["step"], []).append(r["t"])
    curve = []
    for step in sorted(times):
        if len(times[step]) < len(ranks):
            continue
        files = [f"{rdir}/rank-{i}/step-{step}.f32" for i in ranks]
        x = np.mean([np.fromfile(f, dtype="<f4") for f in files], axis=0).astype(np.float32)
        off = 0
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.from_numpy(x[off:off + p.numel()]).view_as(p))
                off += p.numel()
        t = max(times[step])
        curve.append({"step": step, "t": t - t0, "mb": tx.mb_at(t),
                      "bpb": corpus.bits_per_byte(model, windows)})
        for f in files:
            os.remove(f)
    return curve, summaries


def thread_cpu(summaries):
    """{part: CPU ms a step of one trainer's own thread}, the mean over ranks (lm_rank.py's
    thread_cpu_s): the same passes cost more here than in the floor's row when the trainers
    share their cores with more (the daemons, the delay line). Rows whose ranks do not count it
    (DDP's, PostLocalSGD's: their step is DDP's wrapper) report zeros and get nothing."""
    per = [{k: 1e3 * v / s["steps"] for k, v in s["thread_cpu_s"].items()}
           for s in summaries if any(s.get("thread_cpu_s", {}).values()) and s.get("steps")]
    return {k: float(np.mean([p[k] for p in per])) for k in per[0]} if per else {}


def time_split(a, rdir, summaries, floor_step):
    """ms per step: tern rows from the workers' round logs; others from their own clocks."""
    steps = np.mean([s["steps"] for s in summaries]) or 1
    wall = np.mean([s["wall_s"] for s in summaries])
    split = {"step": 1e3 * wall / steps}
    logs = [f"{rdir}/rank-{i}.steps.jsonl" for i in range(a.workers)]
    if all(os.path.exists(f) for f in logs):
        parts = ("encode_s", "decode_s", "combine_s", "transfer_s", "wait_s", "trainer_io_s")
        sums, n = dict.fromkeys(parts, 0.0), 0
        for f in logs:
            for line in open(f):
                r = json.loads(line)
                for k in parts:
                    sums[k] += r.get(k, 0.0)
                n += 1
        split.update({k.replace("_s", ""): 1e3 * v / max(1, n) for k, v in sums.items()})
        split["trainer"] = 1e3 * np.mean([s["compute_s"] for s in summaries]) / steps
    elif any(s["compute_s"] for s in summaries):
        split["compute"] = 1e3 * np.mean([s["compute_s"] for s in summaries]) / steps
        split["communicate"] = 1e3 * np.mean([s["comm_s"] for s in summaries]) / steps
    elif floor_step:
        split["compute (floor)"] = 1e3 * floor_step
        split["communicate (rest)"] = split["step"] - 1e3 * floor_step
    # The harness's own cost, in every row's wall time: models kept for evaluation (a row that
    # evaluates every H steps keeps more of them). The slowest rank's: the group waits for it.
    kept = [s.get("snapshot_s", 0.0) for s in summaries]
    if any(kept):
        split["snapshots (slowest rank)"] = 1e3 * max(kept) / steps
    return split


def summarize(a, curve, summaries, tx_mb, floor_step):
    out = {"wall_s": float(np.mean([s["wall_s"] for s in summaries])),
           "steps": float(np.mean([s["steps"] for s in summaries])),
           "final_bpb": curve[-1]["bpb"] if curve else math.nan, "tx_mb": tx_mb}
    for target in a.target_list:
        out[f"t{target}"] = next((c["t"] for c in curve if c["bpb"] <= target), math.nan)
        out[f"mb{target}"] = next((c["mb"] for c in curve if c["bpb"] <= target), math.nan)
    if floor_step:
        cu = [floor_step * s["steps"] / s["wall_s"] for s in summaries if s["wall_s"] > 0]
        out["cu"] = float(np.mean(cu)) if cu else math.nan
    return out


def better(r, best, targets):
    """Earlier to the last target reached; then the lower final loss."""
    if best is None or not best.get("ok"):
        return True
    if not r.get("ok"):
        return False
    for target in reversed(targets):
        tr, tb = r.get(f"t{target}", math.nan), best.get(f"t{target}", math.nan)
        if not (math.isnan(tr) and math.isnan(tb)):
            if math.isnan(tb):
                return True
            if math.isnan(tr):
                return False
            return tr < tb
    return r.get("final_bpb", math.inf) < best.get("final_bpb", math.inf)


def bpb_at(curve, t):
    """The row's loss at time t: its last snapshot at or before t."""
    seen = [c["bpb"] for c in curve if c["t"] <= t]
    return seen[-1] if seen else math.nan


def equal_time(results):
    """When the first row (the floor aside) finished its steps: where bpb@T is read."""
    ends = [r["curve"][-1]["t"] for n, r in results.items()
            if r.get("ok") and r.get("curve") and n != "compute"]
    return min(ends) if ends else math.nan


def print_table(a, results, floor, markdown=False):
    tg = a.target_list
    t_eq = equal_time(results)
    print(f"\n== {a.rate}, RTT {a.rtt:g} ms, {a.layout} ({a.workers} workers) ==")
    head = (["row", "H", "lr", "wall s"] + [f"to {t:g}" for t in tg] +
            ["MB/worker", "CU", "×floor", "final bpb", "bpb@" + fmt(t_eq, ".0f")])
    body = []
    for name, r in results.items():
        if not r.get("ok"):
            body.append([name, "failed (see its logs)"])
            continue
        body.append([name, str(r.get("h", "") or ""), f"{r['lr']:g}", fmt(r["wall_s"])] +
                    [fmt(r[f"t{t}"]) for t in tg] +
                    [fmt(r["tx_mb"]), fmt(100 * r.get("cu", math.nan), ".0f") + "%",
                     fmt(r["wall_s"] / floor if floor else math.nan, ".2f"),
                     fmt(r["final_bpb"], ".3f"), fmt(bpb_at(r["curve"], t_eq), ".3f")])
    if markdown:
        for cells in [head, ["---"] * len(head)] + body:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [22, 4, 6, 7] + [7] * len(tg) + [9, 5, 6, 9, 8]
        for cells in [head] + body:
            print(" ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(cells, widths))))
    for name, r in results.items():
        if r.get("ok"):
            print(f"  {name}: ms per step " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                      r["ms_per_step"].items()))
    cores = getattr(a, "cores", None) or os.cpu_count()
    for name, r in results.items():
        if r.get("ok") and r.get("cpu_ms_per_step"):
            # Every site's processes together, start-up included, against what the cores had.
            print(f"  {name}: CPU ms a step, all sites: " +
                  ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_ms_per_step"].items()) +
                  f" (of {cores} cores × {r['ms_per_step']['step']:.0f} ms = "
                  f"{cores * r['ms_per_step']['step']:.0f})")
    for name, r in results.items():
        if r.get("ok") and r.get("thread_cpu_ms_per_step"):
            print(f"  {name}: CPU ms a step of one trainer's thread: " +
                  ", ".join(f"{k.replace('_', '/')} {v:.1f}"
                            for k, v in r["thread_cpu_ms_per_step"].items()))
    for name, r in results.items():
        if len(r.get("grid", [])) > 1:  # what tuning tried: each setting's times and final loss
            print(f"  {name} grid: " + "; ".join(
                f"H {g['h'] or '-'} lr {g['lr']:g}: " + (
                    "/".join(fmt(g.get(f"t{t}", math.nan)) for t in tg) +
                    f" s, {fmt(g.get('final_bpb', math.nan), '.3f')}" if g.get("ok") else "failed")
                for g in r["grid"]))
    anchors = [n for n in results if not n.startswith("tern") and n != "compute"
               and results[n].get("ok")]
    for name, r in results.items():
        if not name.startswith("tern") or not r.get("ok"):
            continue
        for an in anchors:
            print(f"  {name} vs {an}: " + speedups(r, results[an],
                                                   [(f"t{t}", f"to {t}") for t in tg]))


def plot(a, results, out):
    plt = pyplot()
    if plt is None:
        return
    tag = f"{a.rate}-rtt{a.rtt:g}-{a.layout}"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, r in results.items():
        if r.get("curve") and name != "compute":
            c = r["curve"]
            axes[0].plot([p["t"] for p in c], [p["bpb"] for p in c], label=name, lw=1.5)
            axes[1].plot([max(p["mb"], 1e-3) for p in c], [p["bpb"] for p in c], label=name,
                         lw=1.5)
    for ax, xl in zip(axes, ("seconds since the first step", "MB each worker sent (log)")):
        for t in a.target_list:
            ax.axhline(t, color="grey", lw=0.6, ls=":")
        ax.set_xlabel(xl)
        ax.set_ylabel("validation bits per byte")
        low = min((p["bpb"] for r in results.values() for p in r.get("curve") or []), default=2)
        ax.set_ylim(max(0.0, low - 0.1), 5.0)
        ax.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"byte-level GPT, AdamW: {a.rate} per link, RTT {a.rtt:g} ms, {a.layout}")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"curves-{tag}.{ext}"))
    plt.close(fig)


def settings(a, name):
    """(H, lr) pairs to run: the grid's (`h.ROW=` and `lr.ROW=` give one row its own), or the
    single --h/--lr."""
    row = ROWS[name]
    grid = dict(kv.split("=") for kv in a.grid.split(";") if kv) if a.grid else {}
    h = grid.get("h." + name, grid.get("h", str(a.h)))
    hs = [int(x) for x in h.split(",")] if row.get("uses_h") else [0]
    lrs = [float(x) for x in grid.get("lr." + name, grid.get("lr", str(a.lr))).split(",")]
    if row["kind"] == "compute":  # the floor's time does not depend on the learning rate
        lrs = [a.lr]
    return list(itertools.product(hs, lrs))


def reprint(a):
    """--table: a finished run's table from its results file, as the run printed it."""
    with open(a.table) as f:
        saved = json.load(f)
    results = nans(saved["rows"])
    compute = results.get("compute", {})
    floor = compute.get("wall_s") if compute.get("ok") else None
    print_table(argparse.Namespace(**saved["args"]), results, floor, a.markdown)
    return 0


def first_to(results, target, tern):
    """(row, seconds) of the earliest tern row (tern=True) or anchor to `target`, or None; each
    row at its grid's quickest setting for this target, so every side is tuned per target."""
    times = [(g[f"t{target}"], n) for n, r in results.items()
             if r.get("ok") and n != "compute" and n.startswith("tern") == tern
             for g in [r] + (r.get("grid") or [])
             if g.get("ok") and not math.isnan(g.get(f"t{target}", math.nan))]
    return min(times)[::-1] if times else None


def summary_cell(results, target):
    """Who got to `target` first, tern's best row or the best anchor, and by how much."""
    mine, theirs = first_to(results, target, True), first_to(results, target, False)
    if mine is None and theirs is None:
        return "nobody reaches it"
    if theirs is None:
        return f"{mine[0]} {mine[1]:.1f} s; no anchor"
    if mine is None:
        return f"loses: only {theirs[0]} reaches it ({theirs[1]:.1f} s)"
    ratio = theirs[1] / mine[1]
    verdict = "wins" if ratio > 1.05 else "loses" if ratio < 0.95 else "ties"
    return f"{verdict} {ratio:.2f}×: {mine[0]} {mine[1]:.1f} s, {theirs[0]} {theirs[1]:.1f} s"


def summarize_runs(a):
    """--summary: per finished run, tern's first row to each target against the first anchor's,
    and the row lowest at equal time (what docs/benchmarks.md's summary table prints)."""
    runs = []
    for path in a.summary:
        with open(path) as f:
            saved = json.load(f)
        runs.append((saved["args"], nans(saved["rows"])))
    targets = runs[0][0]["target_list"]  # --summary takes one file or more
    head = (["link", "layout", "H, lr tuned"] + [f"to {t} bpb" for t in targets] +
            ["lowest at equal time"])
    rows = []
    for args, results in runs:
        t_eq = equal_time(results)
        at = [(bpb_at(r["curve"], t_eq), n) for n, r in results.items()
              if r.get("ok") and r.get("curve") and n != "compute"]
        low = min(at) if at else (math.nan, "none")
        # A failed anchor is said: "no anchor" must not read as a win over one that crashed.
        failed = [n for n, r in results.items() if not r.get("ok")]
        failed = f" (failed: {', '.join(failed)})" if failed else ""
        rows.append([f"{args['rate']}, {args['rtt']:g} ms", args["layout"], args["grid"] or "no"] +
                    [summary_cell(results, t) for t in args["target_list"]] +
                    [f"{low[1]} {low[0]:.3f} at {t_eq:.0f} s" + failed])
    if a.markdown:
        for cells in [head, ["---"] * len(head)] + rows:
            print("| " + " | ".join(cells) + " |")
    else:
        for cells in rows:
            print("\n".join([" · ".join(cells[:3])] +
                            [f"  {h}: {c}" for h, c in zip(head[3:], cells[3:])]))
    return 0


def main():
    a = parse()
    if a.table:
        return reprint(a)
    if a.summary:
        return summarize_runs(a)
    netns.require_root()
    if not os.path.isdir(gpt.SOURCES):
        print(f"the language model's text is not here ({gpt.SOURCES}): apt-get install "
              "python3.11-doc", file=sys.stderr)
        return netns.CANNOT_RUN
    delay_line = a.delay_line or netns.find_delay_line(a.tern)
    if a.rtt > 0 and not delay_line:
        print("a round trip needs tern-delay-line: apt-get install libnetfilter-queue-dev, then "
              "cmake --build build (it is build/bench/tern-delay-line)", file=sys.stderr)
        return netns.CANNOT_RUN
    a.workers = 2 if a.layout == "2pinned" else 4
    a.cores = os.cpu_count()
    a.target_list = [float(t) for t in a.targets.split(",")]
    rows = a.rows.split(",")
    for r in rows:
        if r not in ROWS:
            raise SystemExit(f"unknown row {r!r}; rows: {', '.join(ROWS)}")
    if a.skip_variants:
        rows = [r for r in rows if not ROWS[r].get("variant")]
    if "compute" in rows:  # the floor first: every other row's CU and multiple need it
        rows = ["compute"] + [r for r in rows if r != "compute"]
    out = a.out or os.path.join("runs", "lm-race-" +
                                datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(os.cpu_count())
    corpus = gpt.Corpus()
    windows = corpus.validation_windows(128)
    results, floor_wall, floor_step = {}, None, None
    tag = f"{a.rate}-rtt{a.rtt:g}-{a.layout}"
    with netns.Sites(a.workers, a.rate, rtt_ms=a.rtt, delay_line=delay_line,
                     delay_tick_ms=a.delay_tick_ms) as net:
        a.delay_tick_ms = net.delay_tick_ms  # the tick used goes into the results' args
        for name in rows:
            row = ROWS[name]
            best = None
            for h, lr in settings(a, name):
                label = name + (f" H={h}" if h else "") + f" lr={lr:g}"
                print(f"[{tag}] {label} ...", flush=True)
                rdir = os.path.join(out, tag, name, f"h{h}-lr{lr:g}")
                before = [net.tx_bytes(i) for i in range(a.workers)]
                run = run_row(a, net, name, row, rdir, h or a.h, lr)
                after = [net.tx_bytes(i) for i in range(a.workers)]
                r = {"ok": run["ok"], "h": h, "lr": lr,
                     "tx_mb": float(np.mean([(x - y) / 1e6 for x, y in zip(after, before)]))}
                if r["ok"]:
                    curve, summaries = evaluate(a, row, rdir, corpus, windows, run["tx"])
                    if name == "compute":
                        floor_wall = float(np.mean([s["wall_s"] for s in summaries]))
                        floor_step = floor_wall / max(1, np.mean([s["steps"] for s in summaries]))
                    r["curve"] = curve
                    r.update(summarize(a, curve, summaries, r["tx_mb"], floor_step))
                    r["ms_per_step"] = time_split(a, rdir, summaries, floor_step)
                    r["cpu_ms_per_step"] = {k: 1e3 * v / max(1.0, r["steps"])
                                            for k, v in run["cpu_s"].items()}
                    r["thread_cpu_ms_per_step"] = thread_cpu(summaries)
                    print(f"[{tag}] {label}: wall {fmt(r['wall_s'])} s, final "
                          f"{fmt(r['final_bpb'], '.3f')} bpb, {fmt(r['tx_mb'])} MB/worker",
                          flush=True)
                else:
                    print(f"[{tag}] {label}: FAILED (logs in {rdir})", flush=True)
                keys = ["h", "lr", "ok", "final_bpb", "wall_s"] + [f"t{t}" for t in a.target_list]
                r["grid"] = (best or {}).get("grid", []) + [{k: r.get(k) for k in keys}]
                if better(r, best, a.target_list):
                    r["grid"], best = r["grid"], r
                else:
                    best["grid"] = r["grid"]
            results[name] = best
    print_table(a, results, floor_wall, a.markdown)
    plot(a, results, out)
    with open(os.path.join(out, f"results-{tag}.json"), "w") as f:
        json.dump(no_nans({"args": {k: v for k, v in vars(a).items()}, "rows": results}), f,
                  indent=1)
    print(f"\nresults: {out}/results-{tag}.json, curves: {out}/curves-{tag}.png")
    return 1 if any(not r["ok"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
