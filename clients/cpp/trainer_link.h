// How a trainer reaches its worker: through the Trainer gRPC service (any process, any host), or
// straight into a worker daemon in the same process (the built-in trainer's way: no
// serialization and no copy of the gradient or the parameters).
//
// Thread-safety: a link is used by one trainer thread at a time.
#ifndef TERN_CLIENTS_CPP_TRAINER_LINK_H_
#define TERN_CLIENTS_CPP_TRAINER_LINK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/model/layout.h"
#include "grpcpp/grpcpp.h"

namespace tern {

class WorkerDaemon;

struct TrainerStep {
  int64_t step = 0;
  float loss = 0;
  double compute_seconds = 0;
  absl::Span<const float> grad;
};

class TrainerLink {
 public:
  virtual ~TrainerLink() = default;
  // Registers the model; returns the step the worker is at (0 for a fresh run).
  virtual absl::StatusOr<int64_t> Register(const std::vector<ParamTensor>& layout,
                                           absl::Span<const float> x0) = 0;
  // One step with `s.grad`; returns the parameters to compute the next gradient at, a view valid
  // until the next call.
  virtual absl::StatusOr<absl::Span<const float>> Step(const TrainerStep& s) = 0;
};

// Through Trainer.Register / Trainer.Step on `channel`, each call with `timeout`.
std::unique_ptr<TrainerLink> NewGrpcTrainerLink(std::shared_ptr<grpc::Channel> channel,
                                                absl::Duration timeout);
// Into `daemon` (which must outlive the link) without leaving the process.
std::unique_ptr<TrainerLink> NewInProcessTrainerLink(WorkerDaemon* daemon);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_TRAINER_LINK_H_
