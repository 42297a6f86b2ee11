// What `tern run` calls a failed run: not finite, collapsed, fallen far below its own best, or (a
// gossip run) workers that do not hold one model at the end.
#include "cli/run_health.h"

#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(RunHealth, AHealthyRunAndRoundToRoundNoiseAreDone) {
  EXPECT_THAT(UnhealthyRun(true, 0.8675, 0.8690, 20), IsEmpty());
  EXPECT_THAT(UnhealthyRun(true, 0.80, 0.88, 20), IsEmpty());  // 8 points: noise of a non-IID run
  EXPECT_THAT(UnhealthyRun(true, 0.12, 0.12, 3), IsEmpty());   // early: nothing learned yet
  EXPECT_THAT(DivergedRun(3.04e-3, 2.42e-3), IsEmpty());       // DecentLaM: flat near 3e-3
  EXPECT_THAT(DivergedRun(0.5126, 0.5445), IsEmpty());         // CHOCO with STC 1 %: falls all run
  EXPECT_THAT(DivergedRun(0.9, std::numeric_limits<double>::infinity()), IsEmpty());
}

TEST(RunHealth, NotFiniteCollapsedOrFallenFarBelowItsBestIsAFailureSayingWhich) {
  EXPECT_THAT(UnhealthyRun(false, 0.5, 0.8, 5), HasSubstr("no longer finite"));
  EXPECT_THAT(UnhealthyRun(true, 0.10, 0.80, 5), HasSubstr("collapsed"));
  // One poisoned message into a run that reached 85.75 %: 53.25 % at the end.
  EXPECT_THAT(UnhealthyRun(true, 0.5325, 0.8575, 20), HasSubstr("fell from its best 85.75%"));
  // A ring of 8 split by two kills: 0.46, 1.18, 2.06 at the ends of three epochs.
  EXPECT_THAT(DivergedRun(2.06, 0.46), HasSubstr("disagree more and more (consensus 0.46"));
}

}  // namespace
}  // namespace tern
