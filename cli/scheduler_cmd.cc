// tern scheduler: the optional membership service (server/membership.h). Workers started with
// --scheduler=HOST:PORT register, heartbeat, and take their gossip neighbours from it once a
// worker dies.
#include <signal.h>

#include <cstdio>
#include <cstring>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/service_flags.h"
#include "clients/flags/train_flags.h"
#include "common/status_macros.h"
#include "core/ops/systemd.h"
#include "server/membership.h"
#include "server/scheduler_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, member_names, "",
          "scheduler: who may register, comma-separated names as a worker's --peer_names "
          "(worker-*); each caller's name binds it to the member id it ends in (worker-3: 3); "
          "needs --tls_ca or --tokens; empty: anyone authenticated, ids first come first served");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, heartbeat_interval_ms, 1000,
          "scheduler: how often workers heartbeat");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, heartbeat_timeout_ms, 5000,
          "scheduler: a worker silent this long is declared dead (a new membership epoch)");
ABSL_FLAG(tern::Int<tern::AtLeast(0)>, switch_lag_rounds, 2,
          "scheduler: a new epoch's graph applies this many rounds past the furthest worker");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, max_members, 4096,
          "scheduler: the most workers a run may have");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, max_waiting_calls, 1024,
          "scheduler: long polls (GetView, Barrier) waiting at once; more are refused with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, max_waiting_per_worker, 4,
          "scheduler: long polls waiting at once for one worker id; more are refused");

namespace tern {

namespace {

absl::StatusOr<SchedulerServerOptions> SchedulerOptionsFromFlags() {
  SchedulerServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.scheduler.run_id = absl::GetFlag(FLAGS_run_id);
  o.scheduler.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms).value);
  o.scheduler.heartbeat_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms).value);
  o.scheduler.switch_lag_rounds = absl::GetFlag(FLAGS_switch_lag_rounds).value;
  o.scheduler.max_members = absl::GetFlag(FLAGS_max_members).value;
  o.max_waiting_calls = absl::GetFlag(FLAGS_max_waiting_calls).value;
  o.max_waiting_per_worker = absl::GetFlag(FLAGS_max_waiting_per_worker).value;
  o.metrics_listen = MetricsListenFromFlags();
  o.tls = TlsFromFlags();
  o.scheduler.topology = absl::GetFlag(FLAGS_topology);
  TERN_ASSIGN_OR_RETURN(o.scheduler.weights, ParseWeightRule(absl::GetFlag(FLAGS_weights)));
  o.scheduler.member_names =
      absl::StrSplit(absl::GetFlag(FLAGS_member_names), ',', absl::SkipEmpty());
  if (!o.scheduler.member_names.empty() && o.tls.ca.empty() && o.tls.tokens.empty()) {
    return absl::InvalidArgumentError(
        "--member_names needs --tls_ca or --tokens: without them no caller has a name to check");
  }
  return o;
}

}  // namespace

absl::Status CheckSchedulerFlags() {
  TERN_RETURN_IF_ERROR(CheckServingFlags());
  TERN_ASSIGN_OR_RETURN(SchedulerServerOptions o, SchedulerOptionsFromFlags());
  return Membership::Create(o.scheduler, *NewBuiltinTopologyRegistry()).status();
}

int SchedulerMain() {
  sigset_t signals = BlockStopSignals();
  if (absl::Status s = CheckSchedulerFlags(); !s.ok()) {
    std::fprintf(stderr, "tern scheduler: %s\n", s.ToString().c_str());
    return 2;
  }
  const SchedulerServerOptions o = *SchedulerOptionsFromFlags();  // checked above
  auto topologies = NewBuiltinTopologyRegistry();
  auto server = SchedulerServer::Start(o, *topologies);
  if (!server.ok()) {
    std::fprintf(stderr, "tern scheduler: %s\n", server.status().ToString().c_str());
    return absl::IsInvalidArgument(server.status()) ? 2 : 1;
  }
  spdlog::info("scheduler: run '{}' on port {} ({}; heartbeat {} ms, timeout {} ms)",
               o.scheduler.run_id, (*server)->port(), o.scheduler.topology,
               absl::GetFlag(FLAGS_heartbeat_interval_ms).value,
               absl::GetFlag(FLAGS_heartbeat_timeout_ms).value);
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->port());
  LogMetricsAddress("scheduler", o.metrics_listen, (*server)->metrics_port());
  SchedulerServer* s = server->get();
  SystemdNotifier systemd([s] { return RanRecently(s->last_tick(), absl::Seconds(10)); });
  systemd.Ready(absl::StrCat("run '", o.scheduler.run_id, "' on port ", s->port()));
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("scheduler: {}, shutting down", strsignal(sig));
  systemd.Stopping();
  (*server)->Shutdown(absl::Seconds(2));
  return 0;
}

}  // namespace tern
