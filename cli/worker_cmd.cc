// tern worker: the long-running peer daemon, with the built-in trainer or waiting for an
// external one (PyTorch through the Trainer service).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/limit_flags.h"
#include "cli/process.h"
#include "cli/service_flags.h"
#include "cli/train_flags.h"
#include "clients/cpp/in_process_trainer_link.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/ops/systemd.h"
#include "core/rpc/channel.h"
#include "kernels/builtin.h"
#include "spdlog/spdlog.h"
#include "worker/daemon.h"
#include "worker/scheduler_client.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "worker: address to serve on (port 0: any)");
ABSL_FLAG(int, id, 0, "worker: this worker's id in [0, workers)");
ABSL_FLAG(std::string, peer_names, "",
          "worker: who may gossip into it, comma-separated names its callers authenticate as "
          "(certificate common name or token holder), a trailing * a prefix (worker-*); empty: "
          "anyone with a certificate from --tls_ca or a token in --tokens");
ABSL_FLAG(int, workers, 8, "worker/run: number of workers");
ABSL_FLAG(std::string, peers, "",
          "worker: comma-separated host:port of every worker, in id order (own entry ignored)");
ABSL_FLAG(std::string, peers_file, "",
          "worker: file with one host:port per line in id order; waited for if absent");
ABSL_FLAG(std::string, port_file, "", "worker: write the bound port here once listening");
ABSL_FLAG(std::string, trainer, "builtin",
          "worker: builtin (train the embedded model) | external (wait for a trainer's "
          "Register)");
ABSL_FLAG(int64_t, snapshot_every, 0, "worker: keep the parameters every N steps (0: step 0)");
ABSL_FLAG(int64_t, total_steps, 0, "worker: steps of the whole run (cosine schedule)");
ABSL_FLAG(bool, exit_after_training, false,
          "worker: exit when the built-in trainer finishes instead of serving until signalled");
ABSL_FLAG(std::string, final_model, "",
          "worker: with the built-in trainer, write the final parameters here (a "
          "tern.v1.TensorBundle, fp32 tensors by name, written atomically) before the worker "
          "exits or goes on serving");
ABSL_FLAG(int, max_snapshots, 16, "worker: how many kept snapshots (--snapshot_every) to hold");
ABSL_FLAG(std::string, snapshot_dir, "",
          "worker: with the built-in trainer, write every kept snapshot here when training ends "
          "(step-S.f32: raw little-endian fp32 in layout order; layout.json)");
ABSL_FLAG(std::string, round_log, "",
          "worker: write one JSON line per step (bytes sent and received, time split) here");
ABSL_FLAG(double, peers_timeout, 60, "worker: seconds to wait for --peers_file");
ABSL_FLAG(std::string, scheduler, "",
          "worker: a `tern scheduler` HOST:PORT: register, heartbeat, and take the gossip graph "
          "over the live workers from it once one dies (else the static --peers config only); "
          "run: the same for its workers, or 'local' to start one for them");
ABSL_FLAG(std::string, advertise, "",
          "worker: the host:port peers reach this worker at, told to the scheduler "
          "(default: --listen's host with the bound port)");

namespace tern {
namespace {

// Cancelled when a stop signal arrives while it waits for the file.
absl::StatusOr<std::vector<std::string>> ReadPeers(const std::string& list, const std::string& file,
                                                   absl::Duration wait, const sigset_t& signals) {
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
    if (StopSignalPending(signals)) {
      return absl::CancelledError(absl::StrCat("stopped while waiting for the peers file ", file));
    }
    if (first) {
      spdlog::info("waiting for the peers file {} (up to {})", file, absl::FormatDuration(wait));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// Writes the engine's parameters to `path` from the round-loop thread (the one that steps it),
// once the trainer is done: a TensorBundle of fp32 tensors named as the trainer registered them.
absl::Status WriteFinalModel(WorkerDaemon& d, const std::string& path) {
  absl::Notification done;
  absl::Status status;
  d.Post([&](bool cancelled) {
    RoundEngine* e = d.engine();
    if (cancelled || !e->initialized()) {
      status = absl::FailedPreconditionError("no model: the trainer never registered one");
    } else {
      absl::StatusOr<v1::TensorBundle> b = FlatToBundle(e->layout(), e->params());
      status = b.ok() ? WriteFileAtomically(path, b->SerializeAsString()) : b.status();
    }
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// The kept snapshots as DIR/step-S.f32 and their layout as DIR/layout.json (docs/worker.md).
absl::Status WriteSnapshots(WorkerDaemon& d, const std::string& dir) {
  TERN_RETURN_IF_ERROR(MakeDirectory(dir));
  RoundEngine* e = d.engine();
  std::string layout = "{\"tensors\":[";
  for (const ParamTensor& t : e->layout()) {
    absl::StrAppend(&layout, t.offset == 0 ? "" : ",", "{\"name\":\"", t.name, "\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"offset\":", t.offset, ",\"numel\":", t.numel,
                    "}");
  }
  const std::vector<int64_t> steps = e->SnapshotSteps();
  absl::StrAppend(&layout, "],\"steps\":[", absl::StrJoin(steps, ","), "]}\n");
  for (int64_t step : steps) {
    TERN_ASSIGN_OR_RETURN(std::vector<float> x, e->GetSnapshot(step));
    TERN_RETURN_IF_ERROR(WriteFileAtomically(
        absl::StrCat(dir, "/step-", step, ".f32"),
        std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float))));
  }
  return WriteFileAtomically(dir + "/layout.json", layout);
}

}  // namespace

int WorkerMain() {
  // Signals go to the waiting main thread only; every thread started later inherits the mask.
  sigset_t signals = BlockStopSignals();

  const int id = absl::GetFlag(FLAGS_id);
  const int workers = absl::GetFlag(FLAGS_workers);
  auto engine = EngineOptionsFromFlags(id, workers, absl::GetFlag(FLAGS_snapshot_every),
                                       absl::GetFlag(FLAGS_total_steps));
  if (!engine.ok()) {
    std::fprintf(stderr, "tern worker: %s\n", engine.status().ToString().c_str());
    return 2;
  }
  const std::string trainer_kind = absl::GetFlag(FLAGS_trainer);
  if (trainer_kind != "builtin" && trainer_kind != "external") {
    std::fprintf(stderr, "tern worker: --trainer=%s: must be builtin or external\n",
                 trainer_kind.c_str());
    return 2;
  }
  if (!absl::GetFlag(FLAGS_final_model).empty() && trainer_kind != "builtin") {
    std::fprintf(stderr, "tern worker: --final_model needs --trainer=builtin\n");
    return 2;
  }
  DaemonOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.engine = *engine;
  // The scheduler client is made once the port is known; the engine asks it through this.
  auto sched = std::make_shared<std::atomic<SchedulerClient*>>(nullptr);
  if (!absl::GetFlag(FLAGS_scheduler).empty()) {
    options.engine.members = [sched](int64_t round) -> std::optional<std::vector<int>> {
      SchedulerClient* c = sched->load();
      return c == nullptr ? std::nullopt : c->MembersFor(round);
    };
  }
  options.round_log = absl::GetFlag(FLAGS_round_log);
  options.limits = StreamLimitsFromFlags(options.limits);
  options.engine.max_snapshots = std::max(1, absl::GetFlag(FLAGS_max_snapshots));
  options.metrics_listen = MetricsListenFromFlags();
  options.tls = TlsFromFlags();
  options.peer_names = absl::StrSplit(absl::GetFlag(FLAGS_peer_names), ',', absl::SkipEmpty());
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  auto daemon = WorkerDaemon::Start(options, &registries);
  if (!daemon.ok()) {
    std::fprintf(stderr, "tern worker: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  const int port = (*daemon)->port();
  spdlog::info("worker {}/{}: serving on port {} ({}, {}, codec {})", id, workers, port,
               options.engine.algorithm, options.engine.topology,
               options.engine.algorithm_options.codec);
  WritePortFile(absl::GetFlag(FLAGS_port_file), port);
  LogMetricsAddress(absl::StrCat("worker ", id), options.metrics_listen, (*daemon)->metrics_port());
  // Alive while the round loop runs its jobs: each check queues a no-op that stamps the time.
  auto loop_ran = std::make_shared<std::atomic<int64_t>>(absl::ToUnixNanos(absl::Now()));
  SystemdNotifier systemd([d = daemon->get(), loop_ran] {
    d->Post([loop_ran](bool cancelled) {
      if (!cancelled) *loop_ran = absl::ToUnixNanos(absl::Now());
    });
    return RanRecently(absl::FromUnixNanos(loop_ran->load()), absl::Seconds(30));
  });
  systemd.Ready(absl::StrCat("worker ", id, "/", workers, " on port ", port));
  std::unique_ptr<SchedulerClient> scheduler;
  if (!absl::GetFlag(FLAGS_scheduler).empty()) {
    SchedulerClientOptions so;
    so.run_id = options.engine.run_id;
    so.name = absl::StrCat("worker-", id);
    so.worker_id = id;
    so.expected_members = workers;
    so.address = absl::GetFlag(FLAGS_advertise);
    if (so.address.empty()) so.address = ListenWithPort(absl::GetFlag(FLAGS_listen), port);
    WorkerDaemon* d = daemon->get();
    so.progress = [d] { return d->engine()->next_step(); };
    auto credentials = ChannelCredentialsFromFlags();
    if (!credentials.ok()) {
      spdlog::error("worker {}: {}", id, credentials.status().ToString());
      return 2;
    }
    auto c = SchedulerClient::Start(
        MakeChannel(absl::GetFlag(FLAGS_scheduler), ChannelKind::kDefault, *credentials), so);
    if (!c.ok()) {
      spdlog::error("worker {}: scheduler {}: {}", id, absl::GetFlag(FLAGS_scheduler),
                    c.status().ToString());
      return 1;
    }
    scheduler = std::move(*c);
    sched->store(scheduler.get());
  }
  auto peers = ReadPeers(absl::GetFlag(FLAGS_peers), absl::GetFlag(FLAGS_peers_file),
                         absl::Seconds(absl::GetFlag(FLAGS_peers_timeout)), signals);
  if (absl::IsCancelled(peers.status())) {
    spdlog::info("worker {}: {}", id, std::string(peers.status().message()));
    (*daemon)->Shutdown(absl::Seconds(5));
    return 0;
  }
  if (!peers.ok()) {
    spdlog::error("worker {}: {}", id, peers.status().ToString());
    return 1;
  }
  if (workers > 1) {
    if (static_cast<int>(peers->size()) != workers) {
      spdlog::error("worker {}: {} peer addresses for {} workers", id, peers->size(), workers);
      return 2;
    }
    if (auto s = (*daemon)->SetPeers(*peers); !s.ok()) {
      spdlog::error("worker {}: {}", id, s.ToString());
      return 2;
    }
  }

  if (trainer_kind == "external") {
    spdlog::info(
        "worker {}: waiting for a trainer to register its model (Trainer.Register on "
        "port {}); health says NOT_SERVING until then",
        id, port);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> trainer_exit{0};
  std::thread trainer;
  if (absl::GetFlag(FLAGS_trainer) == "builtin") {
    trainer = std::thread([&] {
      std::unique_ptr<TrainerLink> link = NewInProcessTrainerLink(daemon->get());
      absl::Status s = RunBuiltinTrainer(*link, TrainerOptionsFromFlags(id, workers), stop);
      if (!s.ok() && !stop.load()) {
        spdlog::error("worker {}: trainer: {}", id, s.ToString());
        trainer_exit = 1;
      } else {
        spdlog::info("worker {}: training {}", id, stop.load() ? "stopped" : "done");
      }
      if (s.ok() && !stop.load() && !absl::GetFlag(FLAGS_final_model).empty()) {
        const std::string path = absl::GetFlag(FLAGS_final_model);
        if (absl::Status w = WriteFinalModel(**daemon, path); !w.ok()) {
          spdlog::error("worker {}: final model: {}", id, w.ToString());
          trainer_exit = 1;
        } else {
          spdlog::info("worker {}: final model written to {}", id, path);
        }
      }
      if (s.ok() && !stop.load() && !absl::GetFlag(FLAGS_snapshot_dir).empty()) {
        if (absl::Status w = WriteSnapshots(**daemon, absl::GetFlag(FLAGS_snapshot_dir)); !w.ok()) {
          spdlog::error("worker {}: snapshots: {}", id, w.ToString());
          trainer_exit = 1;
        }
      }
      if (!s.ok() || absl::GetFlag(FLAGS_exit_after_training)) kill(getpid(), SIGUSR1);
    });
  }
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("worker {}: {}, shutting down", id,
               sig == SIGUSR1 ? "trainer finished" : strsignal(sig));
  systemd.Stopping();
  stop = true;
  // The trainer goes first: it calls into the daemon. A step waiting for neighbours returns at
  // once once the engine is shut down.
  (*daemon)->engine()->Shutdown();
  if (trainer.joinable()) trainer.join();
  (*daemon)->Shutdown(absl::Seconds(5));
  // After the daemon: no gossip call can be asking it for members any more.
  if (scheduler != nullptr) {
    sched->store(nullptr);
    scheduler->Stop(/*leave=*/true);
  }
  return trainer_exit.load();
}

}  // namespace tern
