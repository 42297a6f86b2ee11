#include "clients/cpp/in_process_trainer_link.h"

#include <algorithm>
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
    TERN_ASSIGN_OR_RETURN(v1::RegisterReply reply, daemon_->trainer().Register(layout, x0));
    return static_cast<int64_t>(reply.step());
  }

  absl::StatusOr<std::vector<float>> Params() override {
    std::vector<float> x;
    // The engine's parameters are read on the trainer's side of the port, as a step would.
    daemon_->trainer().RunExclusive([&] {
      const absl::Span<const float> p = daemon_->engine()->params();
      x.assign(p.begin(), p.end());
    });
    return x;
  }

  void BeginStep(const TrainerStep& s) override {
    const absl::Time t0 = absl::Now();
    StepInput in;
    in.step = s.step;
    in.grad = s.grad;
    begun_ = daemon_->trainer().BeginStep(in);
    during_ = absl::ToDoubleSeconds(absl::Now() - t0);
  }

  void GradReadyFrom(size_t from) override {
    if (!begun_.ok()) return;
    const absl::Time t0 = absl::Now();
    begun_ = daemon_->trainer().GradReady(from);
    during_ += absl::ToDoubleSeconds(absl::Now() - t0);
  }

  absl::StatusOr<absl::Span<const float>> Step(const TrainerStep& s) override {
    if (!begun_.ok()) {
      absl::Status failed = std::move(begun_);
      begun_ = absl::OkStatus();
      return failed;
    }
    StepInput in;
    in.step = s.step;
    in.loss = s.loss;
    // The worker's calls during the backward pass are its time, not the trainer's compute.
    in.compute_seconds = std::max(0.0, s.compute_seconds - during_);
    in.io_seconds = io_seconds_;
    in.grad = s.grad;
    const absl::Time t0 = absl::Now();
    StepOutcome out;
    absl::StatusOr<absl::Span<const float>> params = daemon_->trainer().Step(in, &out);
    io_seconds_ = std::max(0.0, absl::ToDoubleSeconds(absl::Now() - t0) + during_ - out.seconds);
    during_ = 0;
    return params;
  }

 private:
  WorkerDaemon* const daemon_;
  double io_seconds_ = 0;  // the last call's, reported with the next
  absl::Status begun_;     // the step's calls so far
  double during_ = 0;      // seconds in them
};

}  // namespace

std::unique_ptr<TrainerLink> NewInProcessTrainerLink(WorkerDaemon* daemon) {
  return std::make_unique<InProcessTrainerLink>(daemon);
}

}  // namespace tern
