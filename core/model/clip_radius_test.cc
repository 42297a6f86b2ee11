#include "core/model/clip_radius.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace tern {
namespace {

ClipRadiusOptions Options(double factor) {
  ClipRadiusOptions o;
  o.factor = factor;
  o.window = 8;
  o.min_samples = 4;
  return o;
}

TEST(ClipRadius, ClipsNothingUntilItHasSeenEnough) {
  ClipRadius c(Options(4));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.Scale(1.0), 1.0);
  EXPECT_EQ(c.Radius(), 0.0);
  EXPECT_EQ(c.Scale(1e6), 1.0) << "the fourth is recorded, not judged";
  EXPECT_GT(c.Radius(), 0.0);
}

TEST(ClipRadius, ScalesAContributionPastTheRadiusDownToIt) {
  ClipRadius c(Options(4));
  for (int i = 0; i < 4; ++i) c.Scale(2.0);
  EXPECT_DOUBLE_EQ(c.Radius(), 8.0);
  EXPECT_EQ(c.Scale(7.9), 1.0);
  EXPECT_DOUBLE_EQ(c.Scale(80.0) * 80.0, 8.0) << "what is mixed has the radius's norm";
  EXPECT_EQ(c.clipped(), 1u);
}

TEST(ClipRadius, AnOutsizedNeighbourInHalfTheRoundsCannotRaiseTheRadius) {
  // One of two neighbours sends 1000x every round: the radius stays the honest one's scale.
  ClipRadius c(Options(4));
  for (int i = 0; i < 4; ++i) c.Scale(1.0);
  for (int round = 0; round < 100; ++round) {
    EXPECT_EQ(c.Scale(1.0), 1.0);
    EXPECT_LT(c.Scale(1000.0) * 1000.0, 4.0 + 1e-9);
  }
  EXPECT_DOUBLE_EQ(c.Radius(), 4.0);
}

TEST(ClipRadius, FollowsContributionsThatGrowSlowly) {
  // A run whose distances grow 10 % a round (a learning-rate warm-up) is never clipped.
  ClipRadius c(Options(4));
  double d = 1;
  for (int i = 0; i < 100; ++i, d *= 1.1) EXPECT_EQ(c.Scale(d), 1.0) << i;
}

TEST(ClipRadius, ZeroFactorTurnsItOffAndNonFiniteNormsMixNothing) {
  ClipRadius off(Options(0));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(off.Scale(1.0), 1.0);
  EXPECT_EQ(off.Scale(1e30), 1.0);
  EXPECT_EQ(off.Radius(), 0.0);
  ClipRadius c(Options(4));
  EXPECT_EQ(c.Scale(std::numeric_limits<double>::quiet_NaN()), 0.0);
  EXPECT_EQ(c.Scale(std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(c.Radius(), 0.0) << "not recorded";
}

TEST(ClipRadius, AReferenceOfZeroClipsNothing) {
  ClipRadius c(Options(4));
  for (int i = 0; i < 4; ++i) c.Scale(0.0);
  EXPECT_EQ(c.Scale(5.0), 1.0);
}

}  // namespace
}  // namespace tern
