// Learning-rate schedules: the worker's when its trainer leaves the rate to it (in steps), and the
// aggregator's (in rounds: the parameter server's step, or the clients' local rate).
//
// Thread-safety: immutable after construction.
#ifndef TERN_CORE_MODEL_LR_SCHEDULE_H_
#define TERN_CORE_MODEL_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

struct LrSchedule {
  enum class Kind { kConstant, kCosine, kStep };
  Kind kind = Kind::kConstant;
  double base = 0.1;
  int64_t warmup_steps = 0;  // linear ramp from base/warmup to base
  int64_t total_steps = 0;   // cosine: decays to `min_lr` at total_steps
  double min_lr = 0;
  int64_t every = 0;  // step: multiply by gamma every `every` steps
  double gamma = 0.1;

  double At(int64_t step) const;
  // At(step) as a multiple of base: what a step made at the base rate is scaled by.
  double Scale(int64_t step) const { return At(step) / base; }
};

// "constant" | "cosine[:min=M]" | "step:every=N[,gamma=G]", with optional ",warmup=W" on any.
// `base` and `total_steps` come from their own flags.
absl::StatusOr<LrSchedule> ParseLrSchedule(absl::string_view spec, double base,
                                           int64_t total_steps);

}  // namespace tern

#endif  // TERN_CORE_MODEL_LR_SCHEDULE_H_
