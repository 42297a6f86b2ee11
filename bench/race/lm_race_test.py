"""Tests of lm_race.py's --summary, which reads finished runs, of its grid and of its count of
where the cores went: no root, no network."""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm_race  # noqa: E402


def row(times, final=3.7, h=0, grid=None, ok=True, end=120.0):
    """A results row: t<target> for each target (None: never reached), one curve to `end`."""
    r = {"ok": ok, "h": h, "lr": 3e-3, "final_bpb": final, "wall_s": end, "tx_mb": 1.0,
         "cu": 0.9, "ms_per_step": {"step": 400},
         "curve": [{"t": 0.0, "mb": 0, "bpb": 8.0}, {"t": end / 2, "mb": 0, "bpb": final + 0.2},
                   {"t": end, "mb": 0, "bpb": final}]}
    for target, t in times.items():
        r[f"t{target}"] = t
    r["grid"] = grid if grid is not None else [dict(r)]
    return r


def run(rows, rate="10mbit", rtt=100.0, grid="h=10,50"):
    return {"args": {"rate": rate, "rtt": rtt, "layout": "4shared", "grid": grid,
                     "target_list": [4.0, 3.75]}, "rows": rows}


def summary(*runs, markdown=False):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, r in enumerate(runs):
            paths.append(os.path.join(d, f"results-{i}.json"))
            with open(paths[-1], "w") as f:
                json.dump(r, f)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = lm_race.summarize_runs(types.SimpleNamespace(summary=paths, markdown=markdown))
        assert rc == 0
        return out.getvalue()


class SummaryTest(unittest.TestCase):
    def test_an_anchor_counts_at_its_quickest_setting_for_each_target(self):
        # DiLoCo's best by the last target is H 50, but H 10 got to 4.0 sooner: that one counts.
        h10 = {"ok": True, "h": 10, "lr": 3e-3, "t4.0": 50.0, "t3.75": 140.0, "final_bpb": 3.72}
        h50 = {"ok": True, "h": 50, "lr": 3e-3, "t4.0": 60.0, "t3.75": 100.0, "final_bpb": 3.73}
        out = summary(run({
            "compute": row({4.0: 50.0, 3.75: None}),
            "diloco": row({4.0: 60.0, 3.75: 100.0}, h=50, grid=[h10, h50]),
            "tern-choco-stc": row({4.0: 25.0, 3.75: 80.0}),
        }))
        self.assertIn("to 4.0 bpb: wins 2.00×: tern-choco-stc 25.0 s, diloco 50.0 s", out)
        self.assertIn("to 3.75 bpb: wins 1.25×: tern-choco-stc 80.0 s, diloco 100.0 s", out)

    def test_a_target_only_an_anchor_reaches_is_a_loss_and_close_times_a_tie(self):
        out = summary(run({
            "ddp": row({4.0: 40.0, 3.75: 90.0}, final=3.3, end=170.0),
            "tern-localsgd": row({4.0: 39.0, 3.75: None}, final=3.76),
        }))
        self.assertIn("to 4.0 bpb: ties 1.03×", out)
        self.assertIn("to 3.75 bpb: loses: only ddp reaches it (90.0 s)", out)

    def test_lowest_at_equal_time_reads_every_row_when_the_first_finished(self):
        # tern finishes first (120 s) at 3.70; DDP's loss at 120 s is its 85 s snapshot, 3.50.
        out = summary(run({
            "ddp": row({4.0: 40.0, 3.75: 90.0}, final=3.3, end=170.0),
            "tern-localsgd": row({4.0: 30.0, 3.75: 80.0}, final=3.7, end=120.0),
        }))
        self.assertIn("lowest at equal time: ddp 3.500 at 120 s", out)

    def test_failed_rows_and_unreached_targets_are_said_not_dropped(self):
        out = summary(run({
            "ddp": row({4.0: None, 3.75: None}, ok=False),
            "tern-choco-stc": row({4.0: 30.0, 3.75: None}),
        }), markdown=True)
        lines = out.splitlines()
        self.assertEqual(lines[0], "| link | layout | H, lr tuned | to 4.0 bpb | to 3.75 bpb | "
                                   "lowest at equal time |")
        self.assertEqual(lines[2], "| 10mbit, 100 ms | 4shared | h=10,50 | tern-choco-stc 30.0 s; "
                                   "no anchor | nobody reaches it | tern-choco-stc 3.700 at 120 s "
                                   "(failed: ddp) |")


class SettingsTest(unittest.TestCase):
    def test_a_row_of_its_own_in_the_grid_takes_its_h_and_the_others_the_grids(self):
        a = types.SimpleNamespace(grid="h=5;h.diloco-int8=10,25;lr=1e-3,3e-3", h=50, lr=3e-3)
        self.assertEqual(lm_race.settings(a, "diloco-int8"),
                         [(10, 1e-3), (10, 3e-3), (25, 1e-3), (25, 3e-3)])
        self.assertEqual(lm_race.settings(a, "postlocalsgd"), [(5, 1e-3), (5, 3e-3)])
        self.assertEqual(lm_race.settings(a, "ddp"), [(0, 1e-3), (0, 3e-3)])  # no H
        self.assertEqual(lm_race.settings(a, "compute"), [(0, 3e-3)])  # nor an lr


class CpuTest(unittest.TestCase):
    class Net:  # no namespaces, no delay line: the sampler's byte counters read 0
        delay_proc = None

        def tx_bytes(self, i):
            return 0

    def test_a_rows_processes_cpu_is_counted_by_role_after_they_exit(self):
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
        with lm_race.RowSampler(self.Net(), 1) as s:
            busy = subprocess.Popen([sys.executable, "-c", burn])
            idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
            s.watch("trainers", busy.pid)
            s.watch("daemons", idle.pid)
            busy.wait()
            idle.wait()
            time.sleep(0.1)
        cpu = s.cpu_s()
        self.assertGreater(cpu["trainers"], 0.4)  # to within a quarter second of its 0.6
        self.assertLess(cpu["trainers"], 1.0)
        self.assertLess(cpu["daemons"], 0.2)
        self.assertIsNone(lm_race.cpu_seconds(busy.pid))  # gone: what was seen is kept

    @staticmethod
    def printed(r):
        """The table of one row `tern-x` (targets 4.0 and 3.75, four sites on two cores)."""
        a = types.SimpleNamespace(target_list=[4.0, 3.75], rate="10mbit", rtt=100.0,
                                  layout="4shared", workers=4, cores=2)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            lm_race.print_table(a, {"tern-x": r}, 100.0)
        return out.getvalue()

    def test_the_table_says_where_the_cores_went(self):
        r = row({4.0: 50.0, 3.75: None})
        r["cpu_ms_per_step"] = {"trainers": 700.0, "daemons": 90.0}
        self.assertIn("tern-x: CPU ms a step, all sites: trainers 700, daemons 90 "
                      "(of 2 cores × 400 ms = 800)", self.printed(r))

    def test_a_trainers_own_cpu_a_step_is_the_mean_over_ranks_and_printed(self):
        summaries = [{"steps": 100, "thread_cpu_s": {"forward_backward": 9.0, "optimizer": 0.6}},
                     {"steps": 100, "thread_cpu_s": {"forward_backward": 9.4, "optimizer": 0.4}}]
        cpu = lm_race.thread_cpu(summaries)
        self.assertAlmostEqual(cpu["forward_backward"], 92.0)
        self.assertAlmostEqual(cpu["optimizer"], 5.0)
        self.assertEqual(lm_race.thread_cpu([{"steps": 100}]), {})  # a run from before it
        zeros = {"forward_backward": 0.0, "optimizer": 0.0}  # a DDP rank's: not counted
        self.assertEqual(lm_race.thread_cpu([{"steps": 100, "thread_cpu_s": zeros}]), {})
        r = row({4.0: 50.0, 3.75: None})
        r["thread_cpu_ms_per_step"] = cpu
        self.assertIn("tern-x: CPU ms a step of one trainer's thread: forward/backward 92.0, "
                      "optimizer 5.0", self.printed(r))


if __name__ == "__main__":
    unittest.main()
