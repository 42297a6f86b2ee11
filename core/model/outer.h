// The outer step of the local-SGD / DiLoCo family (ALGORITHMS.md §3 and §5). Every H inner
// steps the workers' models θ_i meet as their mean update ū = (1/n) Σ (θ_i − θ) — the negative of
// the papers' pseudo-gradient Δ, so that a step is added: θ += step — and an outer optimizer
// turns ū into the move of the shared parameters θ:
//   average                    θ += ū                         local SGD
//   heavy-ball:lr=,momentum=   m = μ m + ū;  θ += lr m         SlowMo; FedAvg with server momentum
//   nesterov:lr=,momentum=     m = μ m + ū;  θ += lr (ū + μ m) DiLoCo (lr 0.7, μ 0.9: torch's
//                                                              SGD(nesterov=True) on Δ)
//   sparseloco:lr=,beta=       θ += lr ū                       SparseLoCo: no outer momentum; its
//                              momentum is each sender's error feedback, whose residual decays
//                              by β before the next Δ joins it (e ← β e + Δ_i), which senders
//                              read from residual_decay()
// One kind behind OuterOptimizerRegistry; the aggregator's local-SGD rounds step with it
// (server/server_step.h).
//
// Thread-safety: thread-compatible (one owner at a time); the registry as common/registry.h.
#ifndef TERN_CORE_MODEL_OUTER_H_
#define TERN_CORE_MODEL_OUTER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/registry.h"

namespace tern {

class OuterOptimizer {
 public:
  virtual ~OuterOptimizer() = default;

  // Canonical spec with every parameter, e.g. "nesterov:lr=0.7,momentum=0.9".
  virtual std::string Spec() const = 0;
  // Zeroes the state for a model of `numel` values.
  virtual void Reset(size_t numel) = 0;
  // Writes θ's move for the mean update `mean` into `step` (both of Reset's size) and advances
  // the momentum.
  virtual void Step(absl::Span<const float> mean, absl::Span<float> step) = 0;
  // The move Step would write for `mean`, leaving the momentum as it is (diloco's eager outer
  // step: a stand-in step the group's mean replaces later).
  virtual void Preview(absl::Span<const float> mean, absl::Span<float> step) const = 0;
  // Zeroes the momentum: the step it gave was not taken (it would have overflowed the model).
  virtual void Forget() = 0;
  // What each sender multiplies its error feedback's residual by before adding its next update
  // (1: plain error feedback).
  virtual float residual_decay() const { return 1.0f; }
  // The momentum, for checkpoints (empty when the optimizer keeps none).
  virtual absl::Span<const float> momentum() const = 0;
  // Takes a saved momentum back; DataLoss when it does not fit the model. An empty one, or any
  // one given to an optimizer without momentum, leaves the state as Reset made it.
  virtual absl::Status Restore(absl::Span<const float> momentum) = 0;
};

using OuterOptimizerRegistry = Registry<OuterOptimizer>;
// average, heavy-ball, nesterov, sparseloco (above).
std::unique_ptr<OuterOptimizerRegistry> NewBuiltinOuterOptimizerRegistry();

// Heavy-ball with any learning rate, for callers whose mean is a gradient rather than an update
// (the parameter server: lr = −γ), outside the registry's lr > 0.
std::unique_ptr<OuterOptimizer> NewHeavyBallOuterOptimizer(float lr, float momentum);

}  // namespace tern

#endif  // TERN_CORE_MODEL_OUTER_H_
