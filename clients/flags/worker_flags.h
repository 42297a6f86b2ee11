// The flags of `tern worker` and the daemon options they make: shared by the command and by
// libtern_embedded.so, the worker embedded in a trainer's process (embedded_worker.cc).
#ifndef TERN_CLIENTS_FLAGS_WORKER_FLAGS_H_
#define TERN_CLIENTS_FLAGS_WORKER_FLAGS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/flags/flag_types.h"
#include "clients/flags/service_flags.h"
#include "worker/daemon.h"

ABSL_DECLARE_FLAG(tern::Int<tern::In(-1, 255)>, id);
ABSL_DECLARE_FLAG(std::string, cpu_policy);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 256)>, workers);
ABSL_DECLARE_FLAG(tern::Int<tern::In(0, 256)>, min_workers);
ABSL_DECLARE_FLAG(tern::Int<tern::In(0, 256)>, max_workers);
ABSL_DECLARE_FLAG(tern::Int<tern::In(1, 16)>, push_stripes);
ABSL_DECLARE_FLAG(bool, push_streams);
ABSL_DECLARE_FLAG(std::string, peers);
ABSL_DECLARE_FLAG(std::string, peers_file);
ABSL_DECLARE_FLAG(std::string, trainer);
ABSL_DECLARE_FLAG(std::string, final_model);
ABSL_DECLARE_FLAG(std::string, snapshot_dir);
ABSL_DECLARE_FLAG(bool, exit_after_training);
ABSL_DECLARE_FLAG(tern::Double<tern::AtLeast(0)>, peers_timeout);
ABSL_DECLARE_FLAG(std::string, scheduler);
ABSL_DECLARE_FLAG(std::string, advertise);

namespace tern {

// The flags that size a worker's run for a command line that starts one (tern run, tern
// launch): --workers=MAX, or for an elastic run --min_workers=MIN --max_workers=MAX.
std::vector<std::string> WorkerCountFlags(bool elastic, int min_workers, int max_workers);

// The daemon's options from the flags (engine, listen address, limits, metrics, TLS, round
// log); the scheduler's membership callback is left to the caller.
absl::StatusOr<DaemonOptions> WorkerDaemonOptionsFromFlags();

// The peers' addresses: `list` (comma-separated) if given, else the lines of `file`, waited for
// up to `wait`; Cancelled when `stopped` says so while it waits. Empty when neither is given.
absl::StatusOr<std::vector<std::string>> ReadPeers(const std::string& list, const std::string& file,
                                                   absl::Duration wait,
                                                   const std::function<bool()>& stopped);

}  // namespace tern

#endif  // TERN_CLIENTS_FLAGS_WORKER_FLAGS_H_
