#include "clients/flags/worker_flags.h"

#include <algorithm>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/limit_flags.h"
#include "clients/flags/service_flags.h"
#include "clients/flags/train_flags.h"
#include "spdlog/spdlog.h"
#include "worker/stripe_join.h"

ABSL_FLAG(tern::Int<tern::In(-1, 255)>, id, -1,
          "worker: this worker's id in [0, workers); -1: the lowest id --scheduler has free (a "
          "worker waits up to --peers_timeout for one), or 0 without a scheduler");
ABSL_FLAG(std::string, peer_names, "",
          "worker: who may gossip into it, comma-separated names its callers authenticate as "
          "(certificate common name or token holder), a trailing * a prefix (worker-*); empty: "
          "anyone with a certificate from --tls_ca or a token in --tokens");
ABSL_FLAG(std::string, trainer_names, "",
          "worker: who may call its Trainer service (register and step a model, read its snapshots "
          "and counters), comma-separated names as --peer_names, '*' anyone; empty: callers on "
          "this host's loopback or Unix socket alone");
ABSL_FLAG(tern::Int<tern::In(1, 16)>, push_stripes, 2,
          "worker: a gossip message of 8 MiB or more goes to a peer over this many streams at "
          "once, each on a connection of its own (1: one stream); one connection moves bytes "
          "at well under a socket's speed");
ABSL_FLAG(bool, push_streams, true,
          "worker: gossip messages to a peer go one after another on one long-lived stream, "
          "each answered on it, instead of a call each (a large, striped one always has calls "
          "of its own); false: a call each, as before this flag");
ABSL_FLAG(tern::Int<tern::In(1, 256)>, workers, 8, "worker/run: number of workers");
ABSL_FLAG(tern::Int<tern::In(0, 256)>, min_workers, 0,
          "worker: an elastic run (with --scheduler and no peer list): it starts once this many "
          "workers are there, and more join while it runs, up to --max_workers, each with the "
          "group's state; 0: a run of --workers");
ABSL_FLAG(tern::Int<tern::In(0, 256)>, max_workers, 0,
          "worker: with --min_workers, the most workers the run admits (ids below it); 0: "
          "--workers");
ABSL_FLAG(std::string, peers, "",
          "worker: comma-separated host:port of every worker, in id order (own entry ignored)");
ABSL_FLAG(std::string, peers_file, "",
          "worker: file with one host:port per line in id order; waited for if absent");
ABSL_FLAG(std::string, trainer, "builtin",
          "worker: builtin (train the embedded model) | external (wait for a trainer's "
          "Register)");
ABSL_FLAG(std::string, cpu_policy, "auto",
          "worker: how the kernel schedules the daemon's threads against the host's others: "
          "batch (SCHED_BATCH: a waking network thread does not preempt a running trainer; "
          "docs/worker.md), normal, or auto (batch with --trainer=external, normal with the "
          "built-in trainer)");
ABSL_FLAG(tern::Int64<tern::AtLeast(0)>, snapshot_every, 0,
          "worker: keep the parameters every N steps (0: step 0)");
ABSL_FLAG(tern::Int64<tern::AtLeast(0)>, snapshot_offset, 0,
          "worker: keep the steps s with s mod --snapshot_every = this (diloco with --overlap: "
          "the steps the exchange overlaps, so each exchange's θ is kept as soon as it is mixed)");
ABSL_FLAG(std::string, snapshot_model, "own",
          "worker: what a snapshot keeps: own (this worker's parameters) | group (diloco: the "
          "group's outer model θ, the same on every worker, the one to evaluate; docs/worker.md)");
ABSL_FLAG(tern::Int64<tern::AtLeast(0)>, total_steps, 0,
          "worker: steps of the whole run (cosine schedule)");
ABSL_FLAG(bool, exit_after_training, false,
          "worker: exit when the built-in trainer finishes instead of serving until signalled");
ABSL_FLAG(std::string, final_model, "",
          "worker: with the built-in trainer, write the final parameters here (a "
          "tern.v1.TensorBundle, fp32 tensors by name, written atomically) before the worker "
          "exits or goes on serving");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, max_snapshots, 16,
          "worker: how many kept snapshots (--snapshot_every) to hold");
ABSL_FLAG(std::string, snapshot_dir, "",
          "worker: with the built-in trainer, write every kept snapshot here when training ends "
          "(step-S.f32: raw little-endian fp32 in layout order; layout.json)");
ABSL_FLAG(std::string, round_log, "",
          "worker: write one JSON line per step (bytes sent and received, time split) here");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, peers_timeout, 60,
          "worker: seconds to wait for --peers_file, or with --scheduler and no --peers for a "
          "free id and every worker's address");
ABSL_FLAG(std::string, scheduler, "",
          "worker: a `tern scheduler` HOST:PORT: register, heartbeat, and take the gossip graph "
          "over the live workers from it once one dies (else the static --peers config only); "
          "without --peers and --peers_file, the peers' addresses (and the id, without --id) "
          "come from it too; "
          "run: the same for its workers, or 'local' to start one for them");
ABSL_FLAG(std::string, advertise, "",
          "worker: the host:port peers reach this worker at, told to the scheduler "
          "(default: --listen's host with the bound port)");

namespace tern {

std::vector<std::string> WorkerCountFlags(bool elastic, int min_workers, int max_workers) {
  if (!elastic) return {absl::StrCat("--workers=", max_workers)};
  return {absl::StrCat("--min_workers=", min_workers), absl::StrCat("--max_workers=", max_workers)};
}

absl::StatusOr<DaemonOptions> WorkerDaemonOptionsFromFlags() {
  const int id = std::max(0, absl::GetFlag(FLAGS_id).value);  // WorkerMain sets one assigned
  const int workers = absl::GetFlag(FLAGS_workers).value;
  auto engine = EngineOptionsFromFlags(id, workers, absl::GetFlag(FLAGS_snapshot_every).value,
                                       absl::GetFlag(FLAGS_total_steps).value);
  if (!engine.ok()) return engine.status();
  DaemonOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.engine = *engine;
  options.round_log = absl::GetFlag(FLAGS_round_log);
  options.limits = StreamLimitsFromFlags(options.limits);
  options.engine.max_snapshots = std::max(1, absl::GetFlag(FLAGS_max_snapshots).value);
  options.engine.snapshot_offset = absl::GetFlag(FLAGS_snapshot_offset).value;
  if (const std::string kept = absl::GetFlag(FLAGS_snapshot_model); kept == "group") {
    options.engine.snapshot_group = true;
  } else if (kept != "own") {
    return absl::InvalidArgumentError(
        absl::StrCat("--snapshot_model is own or group, not '", kept, "'"));
  }
  options.metrics_listen = MetricsListenFromFlags();
  options.tls = TlsFromFlags();
  options.peer_names = absl::StrSplit(absl::GetFlag(FLAGS_peer_names), ',', absl::SkipEmpty());
  options.trainer_names =
      absl::StrSplit(absl::GetFlag(FLAGS_trainer_names), ',', absl::SkipEmpty());
  options.striping.stripes =
      std::clamp(absl::GetFlag(FLAGS_push_stripes).value, 1, static_cast<int>(kMaxStripes));
  options.striping.streams = absl::GetFlag(FLAGS_push_streams);
  return options;
}

absl::StatusOr<std::vector<std::string>> ReadPeers(const std::string& list, const std::string& file,
                                                   absl::Duration wait,
                                                   const std::function<bool()>& stopped) {
  if (!list.empty()) return absl::StrSplit(list, ',', absl::SkipEmpty());
  if (file.empty()) return std::vector<std::string>{};
  const absl::Time deadline = absl::Now() + wait;
  for (bool first = true;; first = false) {
    std::ifstream in(file);
    if (in) {
      std::vector<std::string> out;
      std::string line;
      while (std::getline(in, line)) {
        absl::string_view v = absl::StripAsciiWhitespace(line);
        if (!v.empty()) out.emplace_back(v);
      }
      return out;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no peers file ", file, " after ", absl::FormatDuration(wait)));
    }
    if (stopped()) {
      return absl::CancelledError(absl::StrCat("stopped while waiting for the peers file ", file));
    }
    if (first) {
      spdlog::info("waiting for the peers file {} (up to {})", file, absl::FormatDuration(wait));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace tern
