#include "worker/steps_tuner.h"

#include <algorithm>
#include <cmath>

#include "absl/memory/memory.h"
#include "absl/strings/str_format.h"
#include "worker/step_schedule.h"

namespace tern {

absl::StatusOr<std::unique_ptr<StepsTuner>> StepsTuner::Create(StepsTunerOptions options) {
  if (options.min_steps < 1 || options.min_steps > options.max_steps ||
      options.max_steps > static_cast<int64_t>(kMaxLocalSteps)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--local_steps_min=%d, --local_steps_max=%d: a range within [1, %d]",
                        options.min_steps, options.max_steps, kMaxLocalSteps));
  }
  if (!(options.cu_target > 0 && options.cu_target < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--cu_target=%g: a share of the step's time, in (0, 1)", options.cu_target));
  }
  return absl::WrapUnique(new StepsTuner(options));
}

void StepsTuner::ObserveStep(double step_seconds, double wait_seconds) {
  absl::MutexLock lock(&mu_);
  measured_.AddStep(step_seconds, wait_seconds);
}

void StepsTuner::ObserveExchange(double push_seconds) {
  absl::MutexLock lock(&mu_);
  measured_.AddExchange(0, push_seconds);
}

std::optional<int64_t> StepsTuner::Decide(int64_t current) {
  absl::MutexLock lock(&mu_);
  if (!measured_.Full(std::max(1, options_.exchanges_per_window))) return std::nullopt;
  const LinkWindow w = measured_;
  measured_ = LinkWindow();
  const double compute = w.compute();
  state_.cu = w.cu();
  state_.compute_seconds = compute;
  state_.push_seconds = w.push();
  if (w.exchanges == 0 || compute <= 0) return std::nullopt;
  const double target = options_.cu_target;
  const double exposed = std::max(0.0, state_.push_seconds - options_.overlap_steps * compute);
  const double lanes = std::max(1, options_.lanes);
  const double need =
      lanes * std::max(target / (1 - target) * exposed, state_.push_seconds) / compute;
  // A slower link is taken at once; a faster one by halves, window after window, so one quick
  // window does not undo a long period.
  state_.need = state_.need > 0 && need < state_.need ? 0.5 * (need + state_.need) : need;
  const auto in_range = [&](double h) {
    // Less a hair: 9 × 0.2 / 0.1 is 18.000000000000004 in doubles.
    return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(std::min(h, 1e9) - 1e-9)),
                               options_.min_steps, options_.max_steps);
  };
  // Measured against its own last proposal, not the group's H of the moment (a lane may not
  // have moved yet), so a need that wavers inside the band does not flap.
  int64_t proposal = std::clamp<int64_t>(state_.proposed > 0 ? state_.proposed : current,
                                         options_.min_steps, options_.max_steps);
  if (state_.need > static_cast<double>(proposal)) {
    proposal = in_range(state_.need);
  } else if (4 * state_.need <= 3 * static_cast<double>(proposal)) {
    proposal = std::min(proposal, in_range(1.25 * state_.need));
  }
  state_.proposed = proposal;
  return proposal;
}

StepsState StepsTuner::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

}  // namespace tern
