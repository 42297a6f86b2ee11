#include "worker/steps_tuner.h"

#include <memory>
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/step_schedule.h"

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
  EXPECT_THAT(
      StepsTuner::Create({.min_steps = 1, .max_steps = 4, .lanes = 4, .min_fragments = 5}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--fragments_min=5")));
  EXPECT_THAT(
      StepsTuner::Create({.min_steps = 1, .max_steps = 4, .lanes = 1, .min_fragments = 1}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--fragments > 1")));
}

// Four lanes (fragments) of 1,000 bytes each; a range of fragment counts [1, 4], H [2, 1000],
// one step of overlap.
std::unique_ptr<StepsTuner> FragmentsTuner() {
  absl::StatusOr<std::unique_ptr<StepsTuner>> t = StepsTuner::Create({.min_steps = 2,
                                                                      .max_steps = 1000,
                                                                      .cu_target = 0.9,
                                                                      .exchanges_per_window = 4,
                                                                      .overlap_steps = 1,
                                                                      .lanes = 4,
                                                                      .min_fragments = 1});
  EXPECT_THAT(t, IsOk());
  return t.ok() ? *std::move(t) : nullptr;
}

// A window of 10 steps of 0.1 s of compute and four lane exchanges of 1,000 bytes made at
// `fragments` turns, each taking `push` s; then the proposal.
std::optional<int64_t> FragmentsWindow(StepsTuner& t, int64_t h, int64_t fragments, double push) {
  for (int i = 0; i < 10; ++i) t.ObserveStep(0.1, 0);
  for (int i = 0; i < 4; ++i) t.ObserveExchange(push, 1000, fragments);
  return t.Decide(h, fragments);
}

// Pushes that take 0.3 s whatever they carry: the round trip is what the overlap (0.1 s) cannot
// hide, and each turn pays it. From one count the tuner takes it all as round trip and proposes
// one turn (the waits 9 × 1 × 0.2 / 0.1 = 18 steps' worth, against 72 at four turns); measured
// at one turn as well, the fit agrees (R = 0.3 s, no cost a byte) and it stays.
TEST(StepsTuner, FewerFragmentsWhereTheRoundTripIsWhatTheOverlapCannotHide) {
  std::unique_ptr<StepsTuner> t = FragmentsTuner();
  EXPECT_THAT(FragmentsWindow(*t, 4, 4, 0.3), Optional(18));
  EXPECT_EQ(t->Snapshot().fragments, 1);
  EXPECT_THAT(FragmentsWindow(*t, 18, 1, 0.3), Optional(18));
  const StepsState s = t->Snapshot();
  EXPECT_EQ(s.fragments, 1);
  EXPECT_NEAR(s.round_trip_seconds, 0.3, 1e-9);
  EXPECT_EQ(s.bytes_per_second, 0);
}

// Pushes that take 0.3 ms a byte: from one count the tuner guesses round trip and tries one turn,
// where a turn's 4,000 bytes take 1.2 s; the two counts' points fit R = 0, 3,333 bytes/s, and
// the waits at q turns, 9 × q × (1.2 / q − 0.1) / 0.1, are least at four (72 steps, against 81
// at three and 99 at one): back to four.
TEST(StepsTuner, MoreFragmentsWhereTheBytesAre) {
  std::unique_ptr<StepsTuner> t = FragmentsTuner();
  EXPECT_THAT(FragmentsWindow(*t, 4, 4, 0.3), Optional(18));
  EXPECT_EQ(t->Snapshot().fragments, 1);
  EXPECT_THAT(FragmentsWindow(*t, 18, 1, 1.2), Optional(72));
  StepsState s = t->Snapshot();
  EXPECT_EQ(s.fragments, 4);
  EXPECT_NEAR(s.round_trip_seconds, 0, 1e-9);
  EXPECT_NEAR(s.bytes_per_second, 1000 / 0.3, 1e-6);
  // Measured at four again, as predicted: it stays.
  EXPECT_THAT(FragmentsWindow(*t, 72, 4, 0.3), Optional(72));
  EXPECT_EQ(t->Snapshot().fragments, 4);
  // A window whose exchanges straddle a move is no count's point, and changes nothing.
  for (int i = 0; i < 10; ++i) t->ObserveStep(0.1, 0);
  t->ObserveExchange(0.3, 1000, 4);
  for (int i = 0; i < 3; ++i) t->ObserveExchange(5, 1000, 2);
  EXPECT_THAT(t->Decide(72, 2), Optional(72));
  s = t->Snapshot();
  EXPECT_EQ(s.fragments, 4);
  EXPECT_NEAR(s.bytes_per_second, 1000 / 0.3, 1e-6);
}

// After the probe and its return, a count that moved is held for two windows, then four, ...: a
// window whose fit (pushes at four turns now 0.9 s) prefers one turn waits out the hold.
TEST(StepsTuner, AFragmentCountThatMovedIsHeldLongerEachTime) {
  std::unique_ptr<StepsTuner> t = FragmentsTuner();
  std::vector<int64_t> counts;
  FragmentsWindow(*t, 4, 4, 0.3);  // the one-point guess: one turn
  counts.push_back(t->Snapshot().fragments);
  FragmentsWindow(*t, 18, 1, 1.2);  // the bytes were the cost: back to four
  counts.push_back(t->Snapshot().fragments);
  // Four turns' mean push 0.6 s: R 0.4 s, one turn needs 99 against four's 180, but held.
  EXPECT_THAT(FragmentsWindow(*t, 72, 4, 0.9), Optional(180));
  counts.push_back(t->Snapshot().fragments);
  // Its mean 0.7 s: two windows on, it moves.
  FragmentsWindow(*t, 180, 4, 0.9);
  counts.push_back(t->Snapshot().fragments);
  EXPECT_THAT(counts, ::testing::ElementsAre(1, 4, 4, 1));
}

// Where every count's H is the range's least, the count stays where it is.
TEST(StepsTuner, AFastLinkKeepsTheFragmentCount) {
  std::unique_ptr<StepsTuner> t = FragmentsTuner();
  EXPECT_THAT(FragmentsWindow(*t, 4, 4, 0.001), Optional(2));
  EXPECT_EQ(t->Snapshot().fragments, 4);
}

// Lanes that move to (H, q) take turn k mod q, H·turn/q steps before turn 0, each at the step of
// its turn nearest a period after its last exchange, wherever it was in the old stagger.
TEST(StepSchedule, AlignedLanesTakeTheirTurnNearestAPeriodAfterTheirLast) {
  const auto exchanges = [](const StepSchedule& s, int64_t from, int64_t to) {
    std::vector<int64_t> at;
    for (int64_t step = from; step < to; ++step) {
      if (step >= s.from && (step + 1 - s.from) % s.period == 0) at.push_back(step);
    }
    return at;
  };
  // H = 8 in two turns: lanes 1 and 3 at steps 3, 11, 19, ...; lanes 0 and 2 at 7, 15, 23, ...
  EXPECT_EQ(AlignedSchedule(8, 2, 3, 17), (StepSchedule{.period = 8, .from = 20, .fragments = 2}));
  EXPECT_THAT(exchanges(AlignedSchedule(8, 2, 3, 17), 17, 44), ::testing::ElementsAre(27, 35, 43));
  EXPECT_THAT(exchanges(AlignedSchedule(8, 2, 1, 20), 20, 44), ::testing::ElementsAre(27, 35, 43));
  // Lane 0's last exchange at 16: its turn at 23 is nearest a period on (24); lane 3's at 16,
  // with its turns at 19 and 27, takes 27.
  EXPECT_THAT(exchanges(AlignedSchedule(8, 2, 0, 17), 17, 48),
              ::testing::ElementsAre(23, 31, 39, 47));
  EXPECT_THAT(exchanges(AlignedSchedule(8, 2, 3, 17), 17, 30), ::testing::ElementsAre(27));
  EXPECT_THAT(exchanges(AlignedSchedule(8, 2, 2, 16), 16, 48),
              ::testing::ElementsAre(23, 31, 39, 47));
  // One turn: every lane at once, from the first turn they all take (lanes 0 and 1, whose last
  // exchanges were at 7 and 8, already at 11).
  for (int64_t lane = 0; lane < 4; ++lane) {
    const std::vector<int64_t> at = exchanges(AlignedSchedule(6, 1, lane, 8 + lane), 8, 30);
    if (lane < 2) {
      EXPECT_THAT(at, ::testing::ElementsAre(11, 17, 23, 29)) << lane;
    } else {
      EXPECT_THAT(at, ::testing::ElementsAre(17, 23, 29)) << lane;
    }
  }
}

}  // namespace
}  // namespace tern
