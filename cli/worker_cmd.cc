// tern worker: the long-running peer daemon, with the built-in trainer or waiting for an
// external one (PyTorch through the Trainer service).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/launcher_env.h"
#include "cli/process.h"
#include "clients/cpp/in_process_trainer_link.h"
#include "clients/flags/service_flags.h"
#include "clients/flags/train_flags.h"
#include "clients/flags/worker_flags.h"
#include "common/cpu_policy.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/ops/systemd.h"
#include "core/rpc/channel.h"
#include "core/topology/topology.h"
#include "kernels/builtin.h"
#include "server/scheduler_service.h"
#include "spdlog/spdlog.h"
#include "worker/daemon.h"
#include "worker/engine.h"
#include "worker/scheduler_client.h"

namespace tern {
namespace {

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

// A flag left as it was defined (so the launcher's environment may say it).
bool AtDefault(absl::string_view name) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  return f != nullptr && f->CurrentValue() == f->DefaultValue();
}

// Takes --id, --workers and --scheduler from the launcher's environment where the command line
// left them (cli/launcher_env.h); returns what it read. A worker given --id is configured by its
// command line alone: `tern run`, or a script, starting workers inside a Slurm job or under
// torchrun must not have them read the job's ranks.
absl::StatusOr<LauncherEnv> ApplyLauncherEnv() {
  if (!AtDefault("id")) return LauncherEnv();
  TERN_ASSIGN_OR_RETURN(LauncherEnv env,
                        ReadLauncherEnv([](const char* name) { return std::getenv(name); }));
  std::string error;
  if (env.rank.has_value() && AtDefault("id") &&
      !absl::FindCommandLineFlag("id")->ParseFrom(absl::StrCat(*env.rank), &error)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", *env.rank, ": ", error));
  }
  if (env.world.has_value() && AtDefault("workers") &&
      !absl::FindCommandLineFlag("workers")->ParseFrom(absl::StrCat(*env.world), &error)) {
    return absl::InvalidArgumentError(absl::StrCat("size ", *env.world, ": ", error));
  }
  if (!env.scheduler.empty() && AtDefault("scheduler")) {
    absl::SetFlag(&FLAGS_scheduler, env.scheduler);
  } else {
    env.serve_scheduler.clear();  // the command line named the rendezvous
  }
  return env;
}

// An elastic run's flags: --max_workers becomes the run's size (--workers: ids below it, the
// engine's id space), of which the members are those there; checked against the rest.
absl::Status ApplyElasticFlags() {
  const int min = absl::GetFlag(FLAGS_min_workers).value;
  const int max = absl::GetFlag(FLAGS_max_workers).value;
  if (max > 0) {
    if (!AtDefault("workers") && absl::GetFlag(FLAGS_workers).value != max) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers=", absl::GetFlag(FLAGS_workers).value, " and --max_workers=", max,
                       ": an elastic run's size is its --max_workers; give one of them"));
    }
    if (min == 0) return absl::InvalidArgumentError("--max_workers needs --min_workers");
    auto size = absl::GetFlag(FLAGS_workers);
    size.value = max;
    absl::SetFlag(&FLAGS_workers, size);
  }
  if (min == 0) return absl::OkStatus();
  if (min > absl::GetFlag(FLAGS_workers).value) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min_workers=", min, " is above the run's most workers (--max_workers=",
                     absl::GetFlag(FLAGS_workers).value, ")"));
  }
  if (absl::GetFlag(FLAGS_scheduler).empty() || !absl::GetFlag(FLAGS_peers).empty() ||
      !absl::GetFlag(FLAGS_peers_file).empty()) {
    return absl::InvalidArgumentError(
        "--min_workers: an elastic run's members come and go through --scheduler; give it, and "
        "no --peers or --peers_file");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerServer>> ServeRendezvous(const std::string& listen) {
  SchedulerServerOptions so;
  so.listen = listen;
  so.scheduler.run_id = absl::GetFlag(FLAGS_run_id);
  so.scheduler.topology = EffectiveTopology();
  so.tls = TlsFromFlags();
  return SchedulerServer::Start(so, *NewBuiltinTopologyRegistry());
}

absl::Status CheckWorkerFlags() {
  const std::string trainer_kind = absl::GetFlag(FLAGS_trainer);
  if (trainer_kind != "builtin" && trainer_kind != "external") {
    return absl::InvalidArgumentError(
        absl::StrCat("--trainer=", trainer_kind, ": must be builtin or external"));
  }
  if (!absl::GetFlag(FLAGS_final_model).empty() && trainer_kind != "builtin") {
    return absl::InvalidArgumentError("--final_model needs --trainer=builtin");
  }
  if (const std::string p = absl::GetFlag(FLAGS_cpu_policy);
      p != "auto" && !ParseCpuPolicy(p).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu_policy=", p, ": must be auto, batch or normal"));
  }
  TERN_RETURN_IF_ERROR(CheckServingFlags());
  if (trainer_kind == "builtin") TERN_RETURN_IF_ERROR(CheckDataFlags());
  TERN_RETURN_IF_ERROR(ApplyElasticFlags());
  const int id = absl::GetFlag(FLAGS_id).value, workers = absl::GetFlag(FLAGS_workers).value;
  if (id >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--id=", id, " is not below --workers=", workers, " (ids are 0-based)"));
  }
  if (!absl::GetFlag(FLAGS_scheduler).empty() && absl::GetFlag(FLAGS_peers).empty() &&
      absl::GetFlag(FLAGS_peers_file).empty() && absl::GetFlag(FLAGS_advertise).empty()) {
    const std::string listen = absl::GetFlag(FLAGS_listen);
    const std::string host = listen.substr(0, listen.rfind(':'));
    if (host.empty() || host == "0.0.0.0" || host == "[::]") {
      return absl::InvalidArgumentError(
          absl::StrCat("--listen=", listen,
                       " with peers from --scheduler: say where peers reach this worker "
                       "(--advertise=HOST:PORT, or --listen on a reachable address)"));
    }
  }
  if (const std::string peers = absl::GetFlag(FLAGS_peers); !peers.empty()) {
    const std::vector<std::string> list = absl::StrSplit(peers, ',', absl::SkipEmpty());
    if (static_cast<int>(list.size()) != workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers lists ", list.size(), " addresses for --workers=", workers,
                       ": one per worker, in id order, its own included"));
    }
    for (const std::string& p : list) TERN_RETURN_IF_ERROR(CheckHostPort("peers", p));
  }
  TERN_ASSIGN_OR_RETURN(DaemonOptions options, WorkerDaemonOptionsFromFlags());
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  return RoundEngine::Create(options.engine, &registries, nullptr).status();
}

int WorkerMain() {
  // Signals go to the waiting main thread only; every thread started later inherits the mask.
  sigset_t signals = BlockStopSignals();

  absl::StatusOr<LauncherEnv> launcher = ApplyLauncherEnv();
  if (!launcher.ok()) {
    std::fprintf(stderr, "tern worker: the launcher's environment: %s\n",
                 launcher.status().ToString().c_str());
    return 2;
  }
  int id = absl::GetFlag(FLAGS_id).value;
  const std::string trainer_kind = absl::GetFlag(FLAGS_trainer);
  if (absl::Status s = CheckWorkerFlags(); !s.ok()) {
    std::fprintf(stderr, "tern worker: %s\n", s.ToString().c_str());
    return 2;
  }
  // Before the daemon starts a thread (the rendezvous's, gRPC's, the engine's), so each inherits
  // it; only the BLAS library's pool, made at load and idle with an external trainer, keeps
  // the default.
  const std::string policy_flag = absl::GetFlag(FLAGS_cpu_policy);
  const CpuPolicy policy =
      policy_flag == "auto" ? (trainer_kind == "external" ? CpuPolicy::kBatch : CpuPolicy::kNormal)
                            : *ParseCpuPolicy(policy_flag);  // checked just above
  if (absl::Status s = SetThreadCpuPolicy(policy); !s.ok()) {
    spdlog::warn("worker: {} (--cpu_policy); the threads keep the default policy",
                 std::string(s.message()));
  }
  const int workers = absl::GetFlag(FLAGS_workers).value;  // an elastic run's most
  const int min_workers = absl::GetFlag(FLAGS_min_workers).value;
  const std::string scheduler_address = absl::GetFlag(FLAGS_scheduler);
  const absl::Duration peers_timeout = absl::Seconds(absl::GetFlag(FLAGS_peers_timeout).value);
  // Without a peer list, the scheduler is the rendezvous: it hands out ids and addresses.
  const bool peers_from_scheduler = !scheduler_address.empty() &&
                                    absl::GetFlag(FLAGS_peers).empty() &&
                                    absl::GetFlag(FLAGS_peers_file).empty();
  if (!launcher->said.empty()) {
    spdlog::info("worker: from the launcher's environment ({}): --id={} --workers={}{}",
                 launcher->said, id, workers,
                 absl::GetFlag(FLAGS_scheduler).empty()
                     ? ""
                     : absl::StrCat(" --scheduler=", absl::GetFlag(FLAGS_scheduler)));
  }
  // Rank 0 under MASTER_ADDR/MASTER_PORT serves the rendezvous itself; it goes last.
  std::unique_ptr<SchedulerServer> rendezvous;
  if (!launcher->serve_scheduler.empty()) {
    auto server = ServeRendezvous(launcher->serve_scheduler);
    if (!server.ok()) {
      spdlog::error("worker: the rendezvous at {}: {}", launcher->serve_scheduler,
                    server.status().ToString());
      return 1;
    }
    rendezvous = std::move(*server);
    spdlog::info("worker: serving the rendezvous (a tern scheduler) on port {}",
                 rendezvous->port());
  }
  DaemonOptions options = *WorkerDaemonOptionsFromFlags();  // checked above
  // The scheduler client is made before the daemon when it assigns the id, and after it
  // otherwise (it registers with the bound port); the engine asks it through this.
  auto sched = std::make_shared<std::atomic<SchedulerClient*>>(nullptr);
  auto daemon_seen = std::make_shared<std::atomic<WorkerDaemon*>>(nullptr);
  std::unique_ptr<SchedulerClient> scheduler;
  auto start_scheduler = [&](const std::string& address) -> absl::Status {
    SchedulerClientOptions so;
    so.run_id = options.engine.run_id;
    so.name = id < 0 ? "worker" : absl::StrCat("worker-", id);
    so.worker_id = id;
    so.ids_below = static_cast<uint32_t>(workers);
    so.expected_members = workers;
    so.start_with = static_cast<uint32_t>(min_workers);
    so.address = address;
    so.progress = [daemon_seen]() -> int64_t {
      WorkerDaemon* d = daemon_seen->load();
      return d == nullptr ? 0 : d->engine()->next_step();
    };
    if (peers_from_scheduler) {
      so.on_members = [daemon_seen](const std::vector<v1::Member>& members) {
        WorkerDaemon* d = daemon_seen->load();
        if (d == nullptr) return;
        for (const v1::Member& m : members) {
          if (m.address().empty()) continue;
          // Nothing done for the peer's own address, or before the rendezvous set them all.
          if (absl::Status s = d->SetPeer(static_cast<int>(m.id()), m.address()); !s.ok()) {
            spdlog::debug("scheduler: peer {} at {}: {}", m.id(), m.address(), s.ToString());
          }
        }
      };
    }
    TERN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                          ChannelCredentialsFromFlags());
    TERN_ASSIGN_OR_RETURN(
        scheduler,
        SchedulerClient::Start(MakeChannel(scheduler_address, ChannelKind::kDefault, credentials),
                               so, peers_timeout));
    sched->store(scheduler.get());
    return absl::OkStatus();
  };
  if (!scheduler_address.empty()) {
    options.engine.members = [sched](int64_t round) -> std::optional<std::vector<int>> {
      SchedulerClient* c = sched->load();
      return c == nullptr ? std::nullopt : c->MembersFor(round);
    };
  }
  if (min_workers > 0) {
    options.engine.member_from = [sched]() -> std::optional<int64_t> {
      SchedulerClient* c = sched->load();
      return c == nullptr ? std::nullopt : c->MemberFrom();
    };
  }
  if (id < 0 && !scheduler_address.empty()) {
    // The address follows once the daemon listens (Advertise).
    if (absl::Status s = start_scheduler(absl::GetFlag(FLAGS_advertise)); !s.ok()) {
      spdlog::error("worker: scheduler {}: {}", scheduler_address, s.ToString());
      return 1;
    }
    id = static_cast<int>(scheduler->id());
    spdlog::info("worker {}: the id the scheduler assigned", id);
  }
  id = std::max(id, 0);
  options.engine.worker_id = id;
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
  daemon_seen->store(daemon->get());
  // Before the daemon goes (on every way out): the heartbeat thread calls into it.
  absl::Cleanup stop_scheduler = [&] {
    if (scheduler != nullptr) scheduler->Stop(/*leave=*/true);
  };
  if (!scheduler_address.empty()) {
    std::string address = absl::GetFlag(FLAGS_advertise);
    if (address.empty()) address = ListenWithPort(absl::GetFlag(FLAGS_listen), port);
    const absl::Status s =
        scheduler == nullptr ? start_scheduler(address) : scheduler->Advertise(address);
    if (!s.ok()) {
      spdlog::error("worker {}: scheduler {}: {}", id, scheduler_address, s.ToString());
      (*daemon)->Shutdown(absl::Seconds(5));
      return 1;
    }
  }
  const auto stopped = [&signals] { return StopSignalPending(signals); };
  absl::StatusOr<std::vector<std::string>> peers =
      peers_from_scheduler && workers > 1
          ? scheduler->WaitForPeers(workers, peers_timeout, stopped)
          : ReadPeers(absl::GetFlag(FLAGS_peers), absl::GetFlag(FLAGS_peers_file), peers_timeout,
                      stopped);
  if (absl::IsCancelled(peers.status())) {
    spdlog::info("worker {}: {}", id, std::string(peers.status().message()));
    (*daemon)->Shutdown(absl::Seconds(5));
    if (scheduler != nullptr) scheduler->Stop(/*leave=*/true);
    return 0;
  }
  if (!peers.ok()) {
    spdlog::error("worker {}: {}", id, peers.status().ToString());
    (*daemon)->Shutdown(absl::Seconds(5));
    if (scheduler != nullptr) scheduler->Stop(/*leave=*/true);
    return 1;
  }
  if (workers > 1) {
    if (static_cast<int>(peers->size()) != workers) {
      spdlog::error("worker {}: {} peer addresses for {} workers", id, peers->size(), workers);
      return 2;
    }
    if (auto s = (*daemon)->SetPeers(*peers, /*absent_ok=*/min_workers > 0); !s.ok()) {
      spdlog::error("worker {}: {}", id, s.ToString());
      return 2;
    }
    if (peers_from_scheduler) {
      spdlog::info("worker {}: peers from the scheduler: {}", id, absl::StrJoin(*peers, ","));
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
    daemon_seen->store(nullptr);
    scheduler->Stop(/*leave=*/true);
  }
  if (rendezvous != nullptr) rendezvous->Shutdown(absl::Seconds(1));
  return trainer_exit.load();
}

}  // namespace tern
