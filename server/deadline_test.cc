#include "server/deadline.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

LearnedDeadlineOptions Options(double k) {
  LearnedDeadlineOptions o;
  o.k = k;
  o.floor = absl::Milliseconds(100);
  o.ceiling = absl::Seconds(60);
  o.window = 100;
  o.min_samples = 8;
  return o;
}

TEST(DeadlineLearner, IsTheMedianPlusKScaledMadOfTheArrivals) {
  DeadlineLearner d(Options(3));
  // Arrivals at 1.0 .. 1.8 s and one straggler at 40 s: median 1.4, MAD 0.2.
  for (int i = 0; i <= 8; ++i) d.Observe(absl::Milliseconds(1000 + 100 * i));
  d.Observe(absl::Seconds(40));
  const DeadlineLearner::Fit f = d.Current();
  EXPECT_EQ(f.samples, 10u);
  EXPECT_NEAR(absl::ToDoubleSeconds(f.median), 1.45, 1e-9);
  EXPECT_NEAR(absl::ToDoubleSeconds(f.spread), 1.4826 * 0.25, 1e-9);
  EXPECT_NEAR(absl::ToDoubleSeconds(d.Deadline()), 1.45 + 3 * 1.4826 * 0.25, 1e-6);
}

TEST(DeadlineLearner, HoldsTheCeilingUntilEnoughArrivalsAndStaysWithinTheBounds) {
  DeadlineLearner d(Options(3));
  for (int i = 0; i < 7; ++i) d.Observe(absl::Milliseconds(10));
  EXPECT_EQ(d.Deadline(), absl::Seconds(60));  // seven of eight
  d.Observe(absl::Milliseconds(10));
  EXPECT_EQ(d.Deadline(), absl::Milliseconds(100));  // 10 ms, raised to the floor
  DeadlineLearner slow(Options(3));
  for (int i = 0; i < 20; ++i) slow.Observe(absl::Seconds(50 + i));
  EXPECT_EQ(slow.Deadline(), absl::Seconds(60));  // capped at the ceiling
  DeadlineLearner off(Options(0));
  for (int i = 0; i < 20; ++i) off.Observe(absl::Seconds(1));
  EXPECT_EQ(off.Deadline(), absl::Seconds(60));
  EXPECT_EQ(off.Current().samples, 0u);
}

TEST(DeadlineLearner, FollowsTheRecentArrivalsOnly) {
  DeadlineLearner d(Options(2));
  for (int i = 0; i < 100; ++i) d.Observe(absl::Seconds(10));
  EXPECT_EQ(d.Deadline(), absl::Seconds(10));
  for (int i = 0; i < 100; ++i) d.Observe(absl::Seconds(2));  // the clients got faster
  EXPECT_EQ(d.Deadline(), absl::Seconds(2));
  d.Observe(absl::Seconds(-1));  // a clock step: not an arrival
  EXPECT_EQ(d.Current().samples, 100u);
}

TEST(DeadlineLearner, ForgetsTheNewestOfTheSampleItTakesBack) {
  LearnedDeadlineOptions o = Options(3);
  o.window = 3;
  DeadlineLearner d(o);
  d.Observe(absl::Seconds(1));
  d.Observe(absl::Seconds(9));
  d.Observe(absl::Seconds(1));
  d.Forget(absl::Seconds(1));  // 1, 9 left, in that order
  EXPECT_EQ(d.Current().samples, 2u);
  d.Forget(absl::Seconds(7));  // never observed: nothing changes
  d.Forget(absl::Seconds(-1));
  EXPECT_EQ(d.Current().samples, 2u);
  d.Observe(absl::Seconds(3));
  d.Observe(absl::Seconds(4));  // the window drops the oldest, the first 1: 9, 3, 4
  EXPECT_EQ(d.Current().median, absl::Seconds(4));
}

TEST(DeadlineLearner, BadOptionsNameTheirFlag) {
  EXPECT_THAT(CheckLearnedDeadline(Options(3)), IsOk());
  EXPECT_THAT(CheckLearnedDeadline(Options(-1)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("k=")));
  LearnedDeadlineOptions o = Options(3);
  o.floor = absl::Seconds(90);
  EXPECT_THAT(CheckLearnedDeadline(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                                ::testing::HasSubstr("--deadline_floor_s")));
}

}  // namespace
}  // namespace tern
