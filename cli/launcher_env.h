// What a launcher's environment says of a worker, for `tern worker` run under torchrun,
// Kubeflow's PyTorchJob, Slurm or mpirun without tern's own flags: its rank, the run's size and
// where the rendezvous (a `tern scheduler`) is.
//
//   RANK | SLURM_PROCID | OMPI_COMM_WORLD_RANK        -> --id
//   WORLD_SIZE | SLURM_NTASKS | OMPI_COMM_WORLD_SIZE  -> --workers
//   TERN_SCHEDULER=HOST:PORT                         -> --scheduler
//   MASTER_ADDR, MASTER_PORT (without TERN_SCHEDULER) -> --scheduler=MASTER_ADDR:MASTER_PORT+1,
//       served by the worker of rank 0 (MASTER_PORT itself stays free for a script's own
//       torch.distributed store)
//
// Thread-safety: pure functions.
#ifndef TERN_CLI_LAUNCHER_ENV_H_
#define TERN_CLI_LAUNCHER_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace tern {

struct LauncherEnv {
  std::optional<int> rank;
  std::optional<int> world;
  std::string scheduler;  // HOST:PORT, or empty
  // Where this worker is to serve the scheduler (rank 0 under MASTER_ADDR/PORT: MASTER_ADDR and
  // the port above MASTER_PORT), or empty.
  std::string serve_scheduler;
  std::string said;  // the variables read, for the log ("RANK=1 WORLD_SIZE=3 ...")
};

// `getenv` returns a variable's value or null. InvalidArgument, naming the variable, for a rank
// or size that is not a number in range, a rank not below the size, or a MASTER_PORT with no
// room for the one above it.
absl::StatusOr<LauncherEnv> ReadLauncherEnv(const std::function<const char*(const char*)>& getenv);

}  // namespace tern

#endif  // TERN_CLI_LAUNCHER_ENV_H_
