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
// A gossip run's consensus (mean squared distance of the workers' models to their average) that
// ends over kMaxConsensusGrowth x its lowest since the first quarter of the run, and over
// kMinDivergedConsensus, is a split or diverged ring. Its level alone says little: healthy
// DecentLaM ends near 3e-3 and falls or holds, CHOCO with STC at 1 % ends near 0.5 and falls all
// run, and a ring of 8 cut in two by kills rises 0.46, 1.18, 2.06 over three epochs.
inline constexpr double kMaxConsensusGrowth = 2;
inline constexpr double kMinDivergedConsensus = 0.05;

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

// Why a gossip run's workers do not hold one model at the end ("" when they do): its final
// consensus against `lowest`, the lowest at an evaluation past the first quarter of the run and
// before the last (infinity when there was none: nothing to judge by).
inline std::string DivergedRun(double final_consensus, double lowest) {
  if (final_consensus > kMinDivergedConsensus && final_consensus > kMaxConsensusGrowth * lowest) {
    return absl::StrCat("the workers' models disagree more and more (consensus ", lowest,
                        " at its lowest after the first quarter of the run, ", final_consensus,
                        " at the end): the ring is split or a worker diverged");
  }
  return "";
}

}  // namespace tern

#endif  // TERN_CLI_RUN_HEALTH_H_
