// Whether a finished run may be reported as done (`tern run`, gossip and aggregator modes).
//
// Thread-safety: a pure function.
#ifndef TERN_CLI_RUN_HEALTH_H_
#define TERN_CLI_RUN_HEALTH_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace tern {

// Why a run must not be reported as done: its final evaluation is not finite, or the model
// collapsed (at most 15 % test accuracy at the end, chance being 10 %, after it once reached
// 30 % or after 10 evaluations). "" when healthy.
inline std::string UnhealthyRun(bool finite, double final_acc, double best_acc,
                                int64_t evaluations) {
  if (!finite || !std::isfinite(final_acc)) {
    return "the model is no longer finite (Inf or NaN in the parameters or the loss)";
  }
  if (final_acc <= 0.15 && (best_acc >= 0.30 || evaluations >= 10)) {
    return absl::StrCat("the model collapsed: test accuracy ", 100 * final_acc,
                        "% at the end (best ", 100 * best_acc, "%, chance 10%)");
  }
  return "";
}

}  // namespace tern

#endif  // TERN_CLI_RUN_HEALTH_H_
