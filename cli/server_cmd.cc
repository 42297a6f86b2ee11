// `tern server`: the aggregator daemon (its flags: cli/aggregator_flags.h).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/aggregator_flags.h"
#include "cli/command_table.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "cli/run_health.h"
#include "clients/cpp/edge_uplink.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/service_flags.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/ops/systemd.h"
#include "core/rpc/address.h"
#include "kernels/builtin.h"
#include "server/service.h"
#include "server/state_store.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, checkpoint, "", "server: checkpoint file (resumed from when present)");
ABSL_FLAG(bool, fresh_start_if_damaged, false,
          "server: when the --checkpoint's files are damaged, or one of the snapshot and its log "
          "is missing, move them aside (FILE.damaged-TIME) and start a new run instead of "
          "refusing to start");
ABSL_FLAG(bool, verify_checkpoint, false,
          "server: read --checkpoint's snapshot and update log, say what they hold or what is "
          "damaged, and exit (0: good, 1: damaged or missing a part)");
ABSL_FLAG(bool, standby, false,
          "server: with a --checkpoint that another tern server (the primary) holds, on a volume "
          "both reach: wait until that one ends, then resume from the checkpoint and serve");
ABSL_FLAG(std::string, parent, "",
          "server: HOST:PORT of a parent aggregator: this server is an edge aggregator, one "
          "client of the parent (--token_file and --tls_* for that call too); each parent task "
          "runs --edge_rounds rounds of this server's clients from the parent's model and sends "
          "the change up, encoded as the parent's task says; the run ends when the parent's does");
ABSL_FLAG(std::string, edge_name, "",
          "server: how the parent's log names this edge (default edge-PORT)");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, linger_s, 10,
          "server: seconds to keep serving after the last round");

namespace tern {

absl::Status CheckServerFlags() {
  TERN_RETURN_IF_ERROR(CheckServingFlags());
  if (const std::string path = absl::GetFlag(FLAGS_checkpoint); !path.empty()) {
    // Its directory must take the snapshot's temporary file and the log: a server that cannot
    // write them would acknowledge nothing.
    const std::string dir = DirectoryOf(path);
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--checkpoint=", path, ": cannot write in ",
                                                     dir, " (", std::strerror(errno), ")"));
    }
  }
  if (const std::string parent = absl::GetFlag(FLAGS_parent); !parent.empty()) {
    if (const HostPort hp = SplitHostPort(parent); hp.host.empty() || hp.port.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--parent=", parent, ": want the parent aggregator's HOST:PORT"));
    }
  }
  if (absl::GetFlag(FLAGS_standby) && absl::GetFlag(FLAGS_checkpoint).empty()) {
    return absl::InvalidArgumentError(
        "--standby takes over a primary's --checkpoint: give the same --checkpoint");
  }
  TERN_ASSIGN_OR_RETURN(ServerOptions so, ServerOptionsFromFlags());
  const ServerRegistries registries = NewBuiltinServerRegistries();
  TERN_RETURN_IF_ERROR(NormalizeAggregatorOptions(so.aggregator, *registries.codecs).status());
  return registries.rules->Create(so.aggregator.rule).status();
}

namespace {

// --verify_checkpoint: what a restart would read, without starting.
int VerifyCheckpoint() {
  const std::string path = absl::GetFlag(FLAGS_checkpoint);
  if (path.empty()) return UsageError("--verify_checkpoint needs --checkpoint=FILE");
  StateStore store(path);
  absl::StatusOr<std::optional<StateStore::Saved>> saved = store.Read();
  if (!saved.ok()) {
    std::printf("%s: damaged: %s\n", path.c_str(), std::string(saved.status().message()).c_str());
    return 1;
  }
  if (!saved->has_value()) {
    std::printf("%s: no checkpoint (a new run would start)\n", path.c_str());
    return 0;
  }
  std::printf("%sgood: a restart resumes from it\n", store.Describe(**saved).c_str());
  return 0;
}

}  // namespace

int ServerMain() {
  if (absl::GetFlag(FLAGS_verify_checkpoint)) return VerifyCheckpoint();
  sigset_t signals = BlockStopSignals();
  if (absl::Status s = CheckServerFlags(); !s.ok()) {
    std::fprintf(stderr, "tern server: %s\n", s.ToString().c_str());
    return 2;
  }
  // One server writes a checkpoint at a time: it holds FILE.lock (flock; released by the kernel
  // when the process ends, however it ends) for its whole life. A --standby waits for it.
  if (const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint); !checkpoint.empty()) {
    const std::string lock_path = checkpoint + ".lock";
    const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0) {
      std::fprintf(stderr, "tern server: %s: %s\n", lock_path.c_str(), std::strerror(errno));
      return 1;
    }
    if (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) {
        std::fprintf(stderr, "tern server: locking %s: %s\n", lock_path.c_str(),
                     std::strerror(errno));
        return 1;
      }
      if (!absl::GetFlag(FLAGS_standby)) {
        std::fprintf(stderr,
                     "tern server: another tern server holds --checkpoint=%s (%s is locked): two "
                     "would write one update log; start this one with --standby to take over "
                     "when that one ends\n",
                     checkpoint.c_str(), lock_path.c_str());
        return 1;
      }
      spdlog::info("server: standby: another server holds {}; taking over when it ends", lock_path);
      const absl::Time since = absl::Now();
      while (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
        if (StopSignalPending(signals)) {
          spdlog::info("server: standby: stopped before taking over");
          return 0;
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
      spdlog::info("server: standby: the primary ended after {:.1f} s of waiting; resuming from {}",
                   absl::ToDoubleSeconds(absl::Now() - since), checkpoint);
    }
    // Held until the process ends.
  }
  absl::StatusOr<ServerOptions> options = ServerOptionsFromFlags();  // good: checked above
  const ServerRegistries registries = NewBuiltinServerRegistries();
  auto server = AggregatorServer::Start(*options, &registries);
  if (!server.ok()) {
    std::fprintf(stderr, "tern server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const v1::ServerStatus st = (*server)->aggregator().Status(absl::Now());
  spdlog::info("server: serving run '{}' ({}, rule {}) on port {}; round {}/{}{}",
               options->aggregator.run_id, options->aggregator.mode, options->aggregator.rule,
               (*server)->port(), st.round(), st.total_rounds(),
               st.restarts() > 0 ? " (resumed from the checkpoint)" : "");
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->port());
  LogMetricsAddress("server", options->metrics_listen, (*server)->metrics_port());
  AggregatorServer* s = server->get();
  // An edge: the uplink to the parent on a thread of its own; its end (the parent's run over)
  // ends this run too, and its failure stops the daemon (rc 1, for systemd to restart it).
  std::atomic<bool> stop_uplink{false};
  std::atomic<bool> uplink_failed{false};
  std::thread uplink;
  if (const std::string parent = absl::GetFlag(FLAGS_parent); !parent.empty()) {
    AggregatorClientOptions co;
    co.run_id = options->aggregator.run_id;
    co.name = absl::GetFlag(FLAGS_edge_name).empty() ? absl::StrCat("edge-", s->port())
                                                     : absl::GetFlag(FLAGS_edge_name);
    co.server = parent;
    uplink = std::thread([&, parent, co] {
      absl::Status u = RunEdgeUplink(&s->aggregator(), parent, options->tls, co, stop_uplink);
      if (!u.ok()) {
        spdlog::error("server: the uplink to the parent {} failed: {}", parent, u.ToString());
        uplink_failed = true;
        kill(getpid(), SIGTERM);
      }
    });
  }
  SystemdNotifier systemd([s] { return RanRecently(s->last_tick(), absl::Seconds(10)); });
  systemd.Ready(absl::StrCat("serving run '", options->aggregator.run_id, "' on port ", s->port()));
  // The last round's close raises SIGUSR1 after the linger (so clients hear DONE and the final
  // model can be fetched), unless a signal came first.
  absl::Notification quit;
  std::thread waiter([&] {
    (*server)->WaitDone();
    if (!quit.WaitForNotificationWithTimeout(absl::Seconds(absl::GetFlag(FLAGS_linger_s).value))) {
      kill(getpid(), SIGUSR1);
    }
  });
  int sig = 0;
  sigwait(&signals, &sig);
  quit.Notify();
  spdlog::info("server: {}, shutting down", sig == SIGUSR1 ? "run finished" : strsignal(sig));
  systemd.Stopping();
  stop_uplink = true;
  if (uplink.joinable()) uplink.join();
  const absl::Time t0 = absl::Now();
  (*server)->Shutdown(absl::Seconds(5));
  waiter.join();
  spdlog::info("server: stopped in {:.2f} s", absl::ToDoubleSeconds(absl::Now() - t0));
  return uplink_failed ? 1 : 0;
}

}  // namespace tern
