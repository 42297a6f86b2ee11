#include "core/model/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace tern {

double LrSchedule::At(int64_t step) const {
  double lr = base;
  switch (kind) {
    case Kind::kConstant:
      break;
    case Kind::kCosine:
      if (total_steps > 0) {
        const double t =
            std::clamp(static_cast<double>(step) / static_cast<double>(total_steps), 0.0, 1.0);
        lr = min_lr + 0.5 * (base - min_lr) * (1 + std::cos(M_PI * t));
      }
      break;
    case Kind::kStep:
      if (every > 0) lr = base * std::pow(gamma, static_cast<double>(step / every));
      break;
  }
  if (warmup_steps > 0 && step < warmup_steps) {
    lr *= static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  return lr;
}

absl::StatusOr<LrSchedule> ParseLrSchedule(absl::string_view spec, double base,
                                           int64_t total_steps) {
  if (!(base > 0) || !std::isfinite(base)) {
    return absl::InvalidArgumentError(absl::StrCat("learning rate must be > 0, got ", base));
  }
  TERN_ASSIGN_OR_RETURN(auto parsed, SpecParams::ParseSpec(spec));
  const std::string& name = parsed.first;
  SpecParams& params = parsed.second;
  LrSchedule s;
  s.base = base;
  s.total_steps = total_steps;
  TERN_ASSIGN_OR_RETURN(int64_t warmup, params.Int("warmup", 0, 0, int64_t{1} << 40));
  s.warmup_steps = warmup;
  if (name == "constant") {
    s.kind = LrSchedule::Kind::kConstant;
  } else if (name == "cosine") {
    s.kind = LrSchedule::Kind::kCosine;
    TERN_ASSIGN_OR_RETURN(s.min_lr, params.Double("min", 0.0, 0.0, base));
  } else if (name == "step") {
    s.kind = LrSchedule::Kind::kStep;
    TERN_ASSIGN_OR_RETURN(int64_t every, params.Int("every", 0, 0, int64_t{1} << 40));
    if (every == 0) return absl::InvalidArgumentError("lr schedule 'step' needs every=N (N >= 1)");
    s.every = every;
    TERN_ASSIGN_OR_RETURN(s.gamma, params.Double("gamma", 0.1, 0.0, 1.0));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown learning-rate schedule '", name, "' (constant, cosine, step)"));
  }
  TERN_RETURN_IF_ERROR(params.CheckAllUsed(absl::StrCat("learning-rate schedule '", name, "'")));
  return s;
}

}  // namespace tern
