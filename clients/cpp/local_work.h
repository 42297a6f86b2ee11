// A federated client's work for one round, chosen by the task's `work` (server.proto):
//   - LocalSgd (Task.local): SGD with momentum from the round's model for the task's epochs or
//     steps, with the adaptive batch size's norm test; the update is the change of the model;
//   - OverlapLocalSgd (Task.local with anchor_pull > 0, local-sgd mode): the steps for the next
//     round run in the background from the client's own model while the server averages;
//   - GradientStep (Task.gradient, ps mode): one minibatch gradient at the model, or in 1-bit
//     Adam / LAMB's compressed phase the client's momentum.
// Each keeps what it carries between rounds (the adaptive batch size, Overlap-Local-SGD's own
// model and its steps in flight).
//
// Thread-safety: thread-compatible; one client's thread calls it (OverlapLocalSgd's background
// steps touch only their own copies and the shared, immutable data).
#ifndef TERN_CLIENTS_CPP_LOCAL_WORK_H_
#define TERN_CLIENTS_CPP_LOCAL_WORK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/cpp/aggregator_client.h"
#include "core/model/adam.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "tern/v1/server.pb.h"

namespace tern {

// What a client trains on: shared by every client of a process, outliving the work.
struct WorkData {
  const Model* model;
  const Dataset* train;
  const std::vector<uint32_t>* part;  // this client's example indices
};

class LocalWork {
 public:
  virtual ~LocalWork() = default;
  // The update for `task` from the round's model `x0`, its data order drawn from `data_seed`.
  // `adam`: the client's 1-bit Adam / LAMB state (momentum), when it holds one.
  virtual absl::StatusOr<WorkResult> Run(const v1::Task& task, const std::vector<float>& x0,
                                         uint64_t data_seed, const AdamState* adam) = 0;
  // Whether this work serves `task` (else the client makes the one NewLocalWork picks).
  virtual bool Serves(const v1::Task& task) const = 0;
};

// The work `task` asks for; `name` labels log lines. InvalidArgument for a task with no work.
absl::StatusOr<std::unique_ptr<LocalWork>> NewLocalWork(const v1::Task& task, WorkData data,
                                                        std::string name);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_LOCAL_WORK_H_
