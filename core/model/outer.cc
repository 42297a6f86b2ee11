#include "core/model/outer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/simd.h"
#include "common/status_macros.h"

namespace tern {
namespace {

// The per-value loops on plain pointers, each branch its own loop, so GCC vectorises them
// (through the members it left them scalar). Element-wise: every version gives the same bits.

// m = μ m + mean, then the step lr (mean + μ m) (Nesterov) or lr m (heavy-ball).
TERN_MULTIVERSION void MomentumStep(size_t n, float lr, float mu, bool nesterov,
                                    const float* __restrict mean, float* __restrict m,
                                    float* __restrict step) {
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) {
      m[i] = mu * m[i] + mean[i];
      step[i] = lr * (mean[i] + mu * m[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      m[i] = mu * m[i] + mean[i];
      step[i] = lr * m[i];
    }
  }
}

// The same step with m left as it is.
TERN_MULTIVERSION void MomentumPreview(size_t n, float lr, float mu, bool nesterov,
                                       const float* __restrict mean, const float* __restrict m,
                                       float* __restrict step) {
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) step[i] = lr * (mean[i] + mu * (mu * m[i] + mean[i]));
  } else {
    for (size_t i = 0; i < n; ++i) step[i] = lr * (mu * m[i] + mean[i]);
  }
}

TERN_MULTIVERSION void Scale(size_t n, float lr, const float* __restrict mean,
                             float* __restrict step) {
  for (size_t i = 0; i < n; ++i) step[i] = lr * mean[i];
}

// Every built-in is this loop with its own constants: momentum 0 keeps no state.
class MomentumOuterOptimizer final : public OuterOptimizer {
 public:
  MomentumOuterOptimizer(std::string spec, float lr, float momentum, bool nesterov, float decay)
      : spec_(std::move(spec)), lr_(lr), mu_(momentum), nesterov_(nesterov), decay_(decay) {}

  std::string Spec() const override { return spec_; }

  void Reset(size_t numel) override {
    numel_ = numel;
    m_.assign(mu_ != 0 ? numel : 0, 0.0f);
  }

  void Step(absl::Span<const float> mean, absl::Span<float> step) override {
    if (mu_ == 0) return Preview(mean, step);
    MomentumStep(numel_, lr_, mu_, nesterov_, mean.data(), m_.data(), step.data());
  }

  void Preview(absl::Span<const float> mean, absl::Span<float> step) const override {
    if (mu_ == 0) {
      Scale(numel_, lr_, mean.data(), step.data());
      return;
    }
    MomentumPreview(numel_, lr_, mu_, nesterov_, mean.data(), m_.data(), step.data());
  }

  void Forget() override { std::fill(m_.begin(), m_.end(), 0.0f); }
  float residual_decay() const override { return decay_; }
  absl::Span<const float> momentum() const override { return m_; }

  absl::Status Restore(absl::Span<const float> momentum) override {
    // A stateless one ignores what it is given: servers before outer optimizers were a kind
    // saved a zero momentum for every run.
    if (momentum.empty() || mu_ == 0) return absl::OkStatus();
    if (momentum.size() != m_.size()) {
      return absl::DataLossError(absl::StrCat("the saved outer momentum has ", momentum.size(),
                                              " values; ", spec_, " on this model keeps ",
                                              m_.size()));
    }
    m_.assign(momentum.begin(), momentum.end());
    return absl::OkStatus();
  }

 private:
  const std::string spec_;
  const float lr_;
  const float mu_;
  const bool nesterov_;
  const float decay_;
  size_t numel_ = 0;
  std::vector<float> m_;
};

// Upper bounds that catch a typo without ruling out a paper's setting.
constexpr double kMaxOuterLr = 100;
constexpr double kMaxMomentum = 0.9999;

absl::StatusOr<std::unique_ptr<OuterOptimizer>> MakeMomentum(SpecParams& p, bool nesterov,
                                                             double default_lr,
                                                             double default_momentum) {
  TERN_ASSIGN_OR_RETURN(double lr, p.Double("lr", default_lr, 1e-6, kMaxOuterLr));
  TERN_ASSIGN_OR_RETURN(double mu, p.Double("momentum", default_momentum, 0, kMaxMomentum));
  std::string spec =
      absl::StrFormat("%s:lr=%g,momentum=%g", nesterov ? "nesterov" : "heavy-ball", lr, mu);
  return std::make_unique<MomentumOuterOptimizer>(std::move(spec), static_cast<float>(lr),
                                                  static_cast<float>(mu), nesterov, 1.0f);
}

}  // namespace

std::unique_ptr<OuterOptimizer> NewHeavyBallOuterOptimizer(float lr, float momentum) {
  return std::make_unique<MomentumOuterOptimizer>(
      absl::StrFormat("heavy-ball:lr=%g,momentum=%g", lr, momentum), lr, momentum, false, 1.0f);
}

std::unique_ptr<OuterOptimizerRegistry> NewBuiltinOuterOptimizerRegistry() {
  auto r = std::make_unique<OuterOptimizerRegistry>("outer optimizer");
  (void)r->Register("average", [](SpecParams&) -> absl::StatusOr<std::unique_ptr<OuterOptimizer>> {
    return std::make_unique<MomentumOuterOptimizer>("average", 1.0f, 0.0f, false, 1.0f);
  });
  // heavy-ball's defaults are docs/results.md's SlowMo row (lr 1, β 0.5); nesterov's DiLoCo's.
  (void)r->Register("heavy-ball", [](SpecParams& p) { return MakeMomentum(p, false, 1.0, 0.5); });
  (void)r->Register("nesterov", [](SpecParams& p) { return MakeMomentum(p, true, 0.7, 0.9); });
  (void)r->Register("sparseloco",
                    [](SpecParams& p) -> absl::StatusOr<std::unique_ptr<OuterOptimizer>> {
                      TERN_ASSIGN_OR_RETURN(double lr, p.Double("lr", 1.0, 1e-6, kMaxOuterLr));
                      TERN_ASSIGN_OR_RETURN(double beta, p.Double("beta", 0.95, 0, 1));
                      return std::make_unique<MomentumOuterOptimizer>(
                          absl::StrFormat("sparseloco:lr=%g,beta=%g", lr, beta),
                          static_cast<float>(lr), 0.0f, false, static_cast<float>(beta));
                    });
  return r;
}

}  // namespace tern
