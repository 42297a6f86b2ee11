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

// How far (in accuracy, 0.10 = 10 points) a run's final test accuracy may fall below its own
// best before the run is not done: run-to-run and round-to-round noise of the built-in models
// stays within a few points; a poisoned or diverging run falls further.
inline constexpr double kMaxAccuracyDrop = 0.10;
// A gossip run's final consensus (mean squared distance of the workers' models to their
// average) above this is a split or diverged ring: healthy runs end near 1e-4..1e-2, a ring cut
// in two near 1..3.
inline constexpr double kMaxFinalConsensus = 0.5;

// Why a run must not be reported as done: its final evaluation is not finite, the model
// collapsed (at most 15 % test accuracy at the end, chance being 10 %, after it once reached
// 30 % or after 10 evaluations), or its final accuracy fell more than kMaxAccuracyDrop below its
// own best. "" when healthy.
inline std::string UnhealthyRun(bool finite, double final_acc, double best_acc,
                                int64_t evaluations) {
  if (!finite || !std::isfinite(final_acc)) {
    return "the model is no longer finite (Inf or NaN in the parameters or the loss)";
  }
  if (final_acc <= 0.15 && (best_acc >= 0.30 || evaluations >= 10)) {
    return absl::StrCat("the model collapsed: test accuracy ", 100 * final_acc,
                        "% at the end (best ", 100 * best_acc, "%, chance 10%)");
  }
  if (final_acc < best_acc - kMaxAccuracyDrop) {
    return absl::StrCat("test accuracy fell from its best ", 100 * best_acc, "% to ",
                        100 * final_acc, "% at the end (more than ", 100 * kMaxAccuracyDrop,
                        " points: a poisoned or diverging run)");
  }
  return "";
}

// Why a gossip run's workers do not hold one model at the end ("" when they do).
inline std::string DivergedRun(double final_consensus) {
  if (final_consensus > kMaxFinalConsensus) {
    return absl::StrCat("the workers' models disagree at the end (consensus ", final_consensus,
                        ", above ", kMaxFinalConsensus,
                        "): the ring is split or a worker diverged");
  }
  return "";
}

}  // namespace tern

#endif  // TERN_CLI_RUN_HEALTH_H_
