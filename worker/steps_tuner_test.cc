#include "worker/steps_tuner.h"

#include <memory>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Optional;

std::unique_ptr<StepsTuner> Tuner(int overlap_steps = 0) {
  absl::StatusOr<std::unique_ptr<StepsTuner>> t =
      StepsTuner::Create({.min_steps = 2,
                          .max_steps = 64,
                          .cu_target = 0.9,
                          .exchanges_per_window = 2,
                          .overlap_steps = overlap_steps});
  EXPECT_THAT(t, IsOk());
  return t.ok() ? *std::move(t) : nullptr;
}

// A window of 10 steps of `compute` s of compute each plus `wait` s of waiting on one of them,
// and 2 exchanges whose pushes took `push` s; then the proposal while H is `h`.
std::optional<int64_t> Window(StepsTuner& t, int64_t h, double compute, double push,
                              double wait = 0) {
  for (int i = 0; i < 10; ++i) t.ObserveStep(compute + (i == 0 ? wait : 0), i == 0 ? wait : 0);
  for (int i = 0; i < 2; ++i) t.ObserveExchange(push);
  return t.Decide(h);
}

// CU = H c / (H c + p) >= 0.9 needs H >= 9 p / c.
TEST(StepsTuner, ProposesTheLeastHThatKeepsTheTargetOverTheLinkAsMeasured) {
  std::unique_ptr<StepsTuner> t = Tuner();
  EXPECT_THAT(Window(*t, 4, 0.1, 0.2), Optional(18));  // 9 × 0.2 / 0.1
  const StepsState s = t->Snapshot();
  EXPECT_EQ(s.proposed, 18);
  EXPECT_NEAR(s.need, 18, 1e-9);
  EXPECT_NEAR(s.compute_seconds, 0.1, 1e-12);
  EXPECT_NEAR(s.push_seconds, 0.2, 1e-12);
  EXPECT_THAT(Window(*t, 18, 0.1, 0.21), Optional(19)) << "ceil(18.9)";
  EXPECT_THAT(Window(*t, 4, 0.1, 10), Optional(64)) << "the range's top";
}

TEST(StepsTuner, TheOverlapHidesItsStepsOfCompute) {
  std::unique_ptr<StepsTuner> t = Tuner(/*overlap_steps=*/1);
  // 0.2 s of push, 0.1 s of it behind the overlapped step: 9 × 0.1 / 0.1.
  EXPECT_THAT(Window(*t, 4, 0.1, 0.2), Optional(9));
  // All hidden: the need (0.5) comes down by halves, with a quarter to spare: 4.75 → 6, 2.63 → 4,
  // then the range's least.
  EXPECT_THAT(Window(*t, 9, 0.1, 0.05), Optional(6));
  EXPECT_THAT(Window(*t, 6, 0.1, 0.05), Optional(4));
  EXPECT_THAT(Window(*t, 4, 0.1, 0.05), Optional(2));
}

// Four fragments each exchanging once a period: their pushes (0.2 s each, all hidden by the
// overlap) must fit in the period's compute, 4 × 0.2 / 0.25.
TEST(StepsTuner, APeriodMustCarryEveryFragmentsExchange) {
  absl::StatusOr<std::unique_ptr<StepsTuner>> t = StepsTuner::Create(
      {.min_steps = 2, .max_steps = 64, .cu_target = 0.9, .overlap_steps = 1, .lanes = 4});
  ASSERT_THAT(t, IsOk());
  for (int i = 0; i < 10; ++i) (*t)->ObserveStep(0.25, 0);
  for (int i = 0; i < 3; ++i) (*t)->ObserveExchange(0.2);
  EXPECT_THAT((*t)->Decide(10), Optional(4));
}

TEST(StepsTuner, ShrinksOnlyWellUnderItsLastProposalAndWithRoomToSpare) {
  std::unique_ptr<StepsTuner> t = Tuner();
  EXPECT_THAT(Window(*t, 20, 0.1, 0.2), Optional(20)) << "needs 18: stays";
  EXPECT_THAT(Window(*t, 20, 0.1, 0.1), Optional(17)) << "needs 9: 13.5 by halves, x 1.25";
  EXPECT_THAT(Window(*t, 17, 0.1, 0.1), Optional(15)) << "11.25 x 1.25";
  EXPECT_THAT(Window(*t, 15, 0.1, 0.001), Optional(8)) << "5.67 x 1.25";
  EXPECT_THAT(Window(*t, 8, 0.1, 0.2), Optional(18)) << "a slower link at once";
  // A lane that has not moved yet still runs 10: the band is around the proposal, 18.
  EXPECT_THAT(Window(*t, 10, 0.1, 0.16), Optional(18)) << "needs 14.4, 16.2 by halves";
}

// With four fragments every exchange's wait counts four times a period: 0.3 s of push, 0.1 s
// of it past the overlap, 9 × 4 × 0.1 / 0.1.
TEST(StepsTuner, EachFragmentsWaitCounts) {
  absl::StatusOr<std::unique_ptr<StepsTuner>> t = StepsTuner::Create(
      {.min_steps = 2, .max_steps = 64, .cu_target = 0.9, .overlap_steps = 2, .lanes = 4});
  ASSERT_THAT(t, IsOk());
  for (int i = 0; i < 10; ++i) (*t)->ObserveStep(0.1, 0);
  for (int i = 0; i < 3; ++i) (*t)->ObserveExchange(0.3);
  EXPECT_THAT((*t)->Decide(10), Optional(36));
}

TEST(StepsTuner, WaitingForASlowerPeerIsNoReasonToExchangeLessOften) {
  std::unique_ptr<StepsTuner> t = Tuner();
  // Each window waits 5 s (a straggler's compute) but the pushes took 10 ms.
  EXPECT_THAT(Window(*t, 8, 0.1, 0.01, /*wait=*/5), Optional(2));
  EXPECT_LT(t->Snapshot().cu, 0.2);
}

TEST(StepsTuner, DecidesOnlyAfterAFullWindowAndNotWithoutAMeasuredPush) {
  std::unique_ptr<StepsTuner> t = Tuner();
  for (int i = 0; i < 10; ++i) t->ObserveStep(0.1, 0);
  t->ObserveExchange(0.2);
  EXPECT_EQ(t->Decide(4), std::nullopt) << "one exchange of two";
  t->ObserveExchange(0.2);
  EXPECT_THAT(t->Decide(4), Optional(18));
  EXPECT_EQ(t->Decide(18), std::nullopt) << "a new window";
  for (int i = 0; i < 10; ++i) t->ObserveStep(0.1, 0);
  t->ObserveExchange(0);  // failed pushes: not measured
  t->ObserveExchange(0);
  EXPECT_EQ(t->Decide(18), std::nullopt);
}

TEST(StepsTuner, RefusesABadRangeOrTarget) {
  EXPECT_THAT(StepsTuner::Create({.min_steps = 0, .max_steps = 4}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--local_steps_min=0")));
  EXPECT_THAT(StepsTuner::Create({.min_steps = 8, .max_steps = 4}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(StepsTuner::Create({.min_steps = 1, .max_steps = 1 << 21}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(StepsTuner::Create({.min_steps = 1, .max_steps = 4, .cu_target = 1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--cu_target")));
}

}  // namespace
}  // namespace tern
