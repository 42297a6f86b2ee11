// How a trainer reaches its worker: through the Trainer gRPC service (any process, any host;
// part of the C++ client library), or straight into a worker daemon in the same process
// (in_process_trainer_link.h, the built-in trainer's way).
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
  // The worker's parameters as they are now: after a Register that answered a step past 0 (a
  // worker that rejoined a running run), where training goes on from. Unimplemented where the
  // link cannot read them.
  virtual absl::StatusOr<std::vector<float>> Params() {
    return absl::UnimplementedError("this link cannot read the worker's parameters");
  }
  // A step whose gradient is handed over as the backward pass makes it (a worker cutting the
  // model into buckets sends each as soon as it is final): BeginStep with `s.step` and `s.grad`
  // (the buffer the backward pass writes), then GradReadyFrom(from) each time grad[from, end) is
  // final, then Step as usual. A link that cannot do better does nothing until Step; an error is
  // kept and returned by Step.
  virtual void BeginStep(const TrainerStep& s) {}
  virtual void GradReadyFrom(size_t from) {}
};

// Through Trainer.Register / Trainer.Step on `channel`, each call with `timeout`.
std::unique_ptr<TrainerLink> NewGrpcTrainerLink(std::shared_ptr<grpc::Channel> channel,
                                                absl::Duration timeout);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_TRAINER_LINK_H_
