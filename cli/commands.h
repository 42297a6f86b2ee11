// The `tern` subcommands beyond the benchmark.
#ifndef TERN_CLI_COMMANDS_H_
#define TERN_CLI_COMMANDS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tern {

class SchedulerServer;

// `tern worker`: the peer daemon (flags in worker_cmd.cc and train_flags.cc). Returns the exit
// code.
int WorkerMain();
// A `tern scheduler` inside this process on `listen`, with the run's flags (--run_id, the
// topology, TLS): the rendezvous that rank 0 under torchrun, and `tern launch`, serve.
absl::StatusOr<std::unique_ptr<SchedulerServer>> ServeRendezvous(const std::string& listen);
// `tern launch --rdzv=HOST:PORT --nnodes=N [worker flags] -- COMMAND...`: a worker beside the
// user's training script on this host (launch_cmd.cc).
int LaunchCommand(const std::vector<std::string>& args);
absl::Status CheckLaunchFlags();
// `tern run`: N workers on 127.0.0.1, progress, metrics and report (run_cmd.cc); RunCommand
// finds this executable for RunMain, which starts copies of it.
int RunMain(const std::string& self_exe);
int RunCommand(const std::vector<std::string>& args);
// `tern server`: the aggregator daemon (server_cmd.cc); `tern client`: built-in clients of an
// aggregator (client_cmd.cc); `tern run --mode federated|local-sgd|ps`: a server and N clients on
// 127.0.0.1 (fed_run_cmd.cc). Their flags: aggregator_flags.h.
int ServerMain();
int ClientMain();
int SchedulerMain();
int HealthMain();
int CertsMain();
int TokensMain();
int ExportMain();
int RunFederatedMain(const std::string& self_exe);
// `tern report DIR...`: one HTML report comparing runs (report.cc).
int ReportMain(const std::vector<std::string>& dirs);
// `tern codecs`, `tern bench codecs|transport|model` (bench_cmd.cc).
int CodecsMain(const std::vector<std::string>& args);
int BenchCodecsMain(const std::vector<std::string>& args);
int BenchTransportMain(const std::vector<std::string>& args);
int BenchModelMain(const std::vector<std::string>& args);
// `tern version` (version.cc): VersionString(), printed.
std::string VersionString();
int VersionMain(const std::vector<std::string>& args);

// Each daemon's and run's checks of its flags, the same its Main makes before it starts anything
// (exit 2 when they fail); `--check_flags` runs them and exits.
absl::Status CheckRunFlags();
absl::Status CheckFederatedRunFlags();
absl::Status CheckWorkerFlags();
absl::Status CheckServerFlags();
absl::Status CheckClientFlags();
absl::Status CheckSchedulerFlags();

}  // namespace tern

#endif  // TERN_CLI_COMMANDS_H_
