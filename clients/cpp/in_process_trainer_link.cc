#include "clients/cpp/in_process_trainer_link.h"

#include <memory>

#include "common/status_macros.h"
#include "worker/daemon.h"

namespace tern {
namespace {

class InProcessTrainerLink final : public TrainerLink {
 public:
  explicit InProcessTrainerLink(WorkerDaemon* daemon) : daemon_(daemon) {}

  absl::StatusOr<int64_t> Register(const std::vector<ParamTensor>& layout,
                                   absl::Span<const float> x0) override {
    TERN_ASSIGN_OR_RETURN(v1::RegisterReply reply, daemon_->RegisterInProcess(layout, x0));
    return static_cast<int64_t>(reply.step());
  }

  absl::StatusOr<absl::Span<const float>> Step(const TrainerStep& s) override {
    StepInput in;
    in.step = s.step;
    in.loss = s.loss;
    in.compute_seconds = s.compute_seconds;
    in.io_seconds = io_seconds_;
    in.grad = s.grad;
    const absl::Time t0 = absl::Now();
    StepOutcome out;
    absl::StatusOr<absl::Span<const float>> params = daemon_->StepInProcess(in, &out);
    io_seconds_ = absl::ToDoubleSeconds(absl::Now() - t0) - out.seconds;
    return params;
  }

 private:
  WorkerDaemon* const daemon_;
  double io_seconds_ = 0;  // the last call's, reported with the next
};

}  // namespace

std::unique_ptr<TrainerLink> NewInProcessTrainerLink(WorkerDaemon* daemon) {
  return std::make_unique<InProcessTrainerLink>(daemon);
}

}  // namespace tern
