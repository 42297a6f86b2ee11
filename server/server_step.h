// What the server does with a round's aggregate at its close, chosen once per run:
//   - OuterServerStep: the run's outer optimizer (core/model/outer.h) on the mean update: FedAvg
//     and local SGD with server_lr and outer momentum (heavy-ball: SlowMo), DiLoCo's Nesterov,
//     SparseLoCo's plain step; ps mode, whose mean is a gradient: heavy-ball with lr = -task.lr;
//   - AdamServerStep: Adam / LAMB from the clients' mean gradient, and the 1-bit ones: dense for
//     the warm-up rounds, then the variance frozen and the clients' mean momentum re-encoded
//     through the delta downstream with the server's error feedback (ALGORITHMS.md §4).
// Each owns its optimizer state and its part of the checkpoint. A learning-rate schedule (ps
// mode's --lr_schedule, over rounds) scales each round's step as torch's schedulers scale lr:
// outside the momentum, so a constant one leaves every step as it was, bit for bit.
//
// Thread-safety: thread-compatible; the aggregator guards it with its own mutex.
#ifndef TERN_SERVER_SERVER_STEP_H_
#define TERN_SERVER_SERVER_STEP_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/adam.h"
#include "core/model/layout.h"
#include "core/model/lr_schedule.h"
#include "core/model/outer.h"
#include "server/downstream.h"
#include "tern/internal/checkpoint.pb.h"
#include "tern/v1/server.pb.h"

namespace tern {

class ServerStep {
 public:
  virtual ~ServerStep() = default;

  // A new model of this layout: the optimizer state starts over.
  virtual void Reset(const std::vector<ParamTensor>& layout) = 0;
  // Closes round `round`: moves `model` by the aggregate `mean` (null: no update came), through
  // `downstream`. A step that would overflow the model is skipped (with a warning).
  virtual absl::Status Close(const std::vector<float>* mean, int64_t round,
                             std::vector<float>* model, Downstream* downstream) = 0;
  // What the task for `round` asks of clients beyond the run's settings (1-bit: dense updates
  // during the warm-up, error feedback after).
  virtual void AdjustTask(int64_t, v1::Task*) const {}
  // Whether catching up from kept updates in `round` needs the optimizer state too.
  virtual bool UpdatesNeedState(int64_t) const { return false; }
  // Adds to the MODEL payload of `round` the state a client needs besides the model.
  virtual absl::Status AppendState(int64_t, v1::TensorBundle*) const { return absl::OkStatus(); }

  virtual void Save(internal::ServerOptimizerState* state) const = 0;
  // `rounds_closed`: the checkpoint's round. DataLoss when `state` does not fit the model.
  virtual absl::Status Restore(const internal::ServerOptimizerState& state,
                               int64_t rounds_closed) = 0;
};

class OuterServerStep final : public ServerStep {
 public:
  // `lr`: round r's step is scaled by lr.Scale(r - 1).
  explicit OuterServerStep(std::unique_ptr<OuterOptimizer> outer, LrSchedule lr = {})
      : outer_(std::move(outer)), lr_(lr) {}

  void Reset(const std::vector<ParamTensor>& layout) override;
  absl::Status Close(const std::vector<float>* mean, int64_t round, std::vector<float>* model,
                     Downstream* downstream) override;
  void Save(internal::ServerOptimizerState* state) const override;
  absl::Status Restore(const internal::ServerOptimizerState& state, int64_t) override;

 private:
  const std::unique_ptr<OuterOptimizer> outer_;
  const LrSchedule lr_;
  size_t numel_ = 0;
};

class AdamServerStep final : public ServerStep {
 public:
  // 1-bit (warmup_rounds > 0): `delta` carries the compressed phase's momenta and must outlive
  // this; dense Adam / LAMB: null, and steps go through the run's downstream. `lr`: round r
  // steps with settings.lr * lr.Scale(r - 1) (dense only: a 1-bit client replays missed rounds
  // at its task's one rate).
  AdamServerStep(AdamSettings settings, int64_t warmup_rounds, DeltaDownstream* delta,
                 LrSchedule lr = {});

  void Reset(const std::vector<ParamTensor>& layout) override;
  absl::Status Close(const std::vector<float>* mean, int64_t round, std::vector<float>* model,
                     Downstream* downstream) override;
  void AdjustTask(int64_t round, v1::Task* task) const override;
  bool UpdatesNeedState(int64_t round) const override { return Compressed(round); }
  absl::Status AppendState(int64_t round, v1::TensorBundle* b) const override;
  void Save(internal::ServerOptimizerState* state) const override;
  absl::Status Restore(const internal::ServerOptimizerState& state, int64_t rounds_closed) override;

 private:
  bool onebit() const { return delta_ != nullptr; }
  bool Compressed(int64_t round) const { return onebit() && round > warmup_rounds_; }
  absl::Status CompressedClose(const std::vector<float>& mean, int64_t round,
                               std::vector<float>* model);
  absl::Status DenseClose(const std::vector<float>& mean, int64_t round, std::vector<float>* model,
                          Downstream* downstream);

  const AdamSettings settings_;
  const int64_t warmup_rounds_;
  const LrSchedule lr_;
  DeltaDownstream* const delta_;
  std::vector<ParamTensor> layout_;
  AdamState state_;
};

}  // namespace tern

#endif  // TERN_SERVER_SERVER_STEP_H_
