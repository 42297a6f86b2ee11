#include "worker/state_share.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

GroupState AState(bool momentum) {
  GroupState s;
  s.step = 41;
  s.theta = {1.5f, -2.0f, 0.25f, 3.0f};
  if (momentum) s.momentum = {0.1f, 0.2f, -0.3f, 0.0f};
  return s;
}

PublishedState Published(GroupState s) {
  const uint32_t crc = GroupStateCrc(s);
  return {.state = std::move(s), .crc = crc};
}

absl::StatusOr<v1::TensorBundle> ToBundle(const GroupState& s, uint32_t slice = 0,
                                          uint32_t slices = 1) {
  return GroupStateToBundle(Published(s), "run", 2, slice, slices);
}

absl::StatusOr<StateSlice> FromBundle(const v1::TensorBundle& b, const std::string& run = "run",
                                      uint64_t n = 4, uint32_t slice = 0, uint32_t slices = 1) {
  static const auto* codecs = NewBuiltinCodecRegistry().release();
  return StateSliceFromBundle(b, run, n, slice, slices, *codecs);
}

TEST(GroupState, ComesBackAsItWentWithAndWithoutMomentum) {
  for (bool momentum : {true, false}) {
    const GroupState sent = AState(momentum);
    auto bundle = ToBundle(sent);
    ASSERT_THAT(bundle, IsOk());
    EXPECT_EQ(bundle->round(), 41u);
    auto got = FromBundle(*bundle);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->step, 41);
    EXPECT_EQ(got->theta, sent.theta);
    EXPECT_EQ(got->momentum, sent.momentum);
  }
}

TEST(GroupState, ARunModelOrPartThatDoesNotFitIsRefused) {
  auto bundle = ToBundle(AState(true));
  ASSERT_THAT(bundle, IsOk());
  EXPECT_THAT(FromBundle(*bundle, "other").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("run 'run'")));
  EXPECT_THAT(FromBundle(*bundle, "run", 5).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));  // another model's size
  v1::TensorBundle three = *bundle;
  *three.add_tensors() = bundle->tensors(0);
  EXPECT_THAT(FromBundle(three).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 parts")));
  v1::TensorBundle renamed = *bundle;
  renamed.mutable_tensors(1)->set_name("m");
  EXPECT_THAT(FromBundle(renamed).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::TensorBundle far = *bundle;
  far.set_round(uint64_t{1} << 63);
  EXPECT_THAT(FromBundle(far).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step")));
}

TEST(GroupState, ATruncatedOversizeOrNonFinitePayloadIsRefused) {
  auto bundle = ToBundle(AState(true));
  ASSERT_THAT(bundle, IsOk());
  v1::TensorBundle cut = *bundle;
  std::string* payload = cut.mutable_tensors(0)->mutable_tensor()->mutable_payload();
  payload->resize(payload->size() - 1);
  EXPECT_FALSE(FromBundle(cut).ok());
  v1::TensorBundle longer = *bundle;
  longer.mutable_tensors(1)->mutable_tensor()->mutable_payload()->append(4, '\0');
  EXPECT_FALSE(FromBundle(longer).ok());
  GroupState nan = AState(false);
  nan.theta[2] = std::numeric_limits<float>::quiet_NaN();
  auto poisoned = ToBundle(nan);
  ASSERT_THAT(poisoned, IsOk());
  EXPECT_THAT(FromBundle(*poisoned).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NaN")));
  GroupState odd = AState(true);
  odd.momentum.pop_back();
  EXPECT_FALSE(ToBundle(odd).ok());
}

// Slices cover the vectors in order whatever their count, and come back together as the state,
// CRC and all.
TEST(GroupState, SlicesMakeTheWholeStateBackAndItsCrcChecksThem) {
  GroupState sent;
  sent.step = 9;
  for (int i = 0; i < 10; ++i) {
    sent.theta.push_back(0.5f * static_cast<float>(i));
    sent.momentum.push_back(-0.25f * static_cast<float>(i));
  }
  for (uint32_t count : {1u, 3u, 4u, 10u}) {
    std::vector<StateSlice> slices;
    uint64_t covered = 0;
    for (uint32_t k = 0; k < count; ++k) {
      const SliceRange r = StateSliceRange(10, k, count);
      EXPECT_EQ(r.begin, covered);
      covered = r.end;
      auto bundle = GroupStateToBundle(Published(sent), "run", 2, k, count);
      ASSERT_THAT(bundle, IsOk());
      EXPECT_EQ(bundle->state_crc(), GroupStateCrc(sent));
      auto got = FromBundle(*bundle, "run", 10, k, count);
      ASSERT_THAT(got, IsOk());
      EXPECT_EQ(got->theta.size(), r.end - r.begin);
      slices.push_back(*std::move(got));
    }
    EXPECT_EQ(covered, 10u);
    std::reverse(slices.begin(), slices.end());  // any order
    auto whole = JoinStateSlices(slices, 10, /*one_state=*/true);
    ASSERT_THAT(whole, IsOk());
    EXPECT_EQ(whole->step, 9);
    EXPECT_EQ(whole->theta, sent.theta);
    EXPECT_EQ(whole->momentum, sent.momentum);
    if (count > 1) {
      // A value changed on the way (each slice still saying the state's CRC) is caught...
      slices[0].theta[0] += 1.0f;
      EXPECT_THAT(JoinStateSlices(slices, 10, true).status(),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr("CRC")));
      // ... and a slice of another state, or one missing, is not joined into it.
      slices[0].crc = *slices[0].crc + 1;
      EXPECT_THAT(JoinStateSlices(slices, 10, true).status(),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another state")));
      // Without one state (a gossip joiner's mosaic of its peers' models) they join as they are.
      EXPECT_THAT(JoinStateSlices(slices, 10, false), IsOk());
      slices.pop_back();
      EXPECT_THAT(JoinStateSlices(slices, 10, false).status(),
                  StatusIs(absl::StatusCode::kInvalidArgument));
    }
  }
}

// diloco with a moving H: each lane's schedule (with its fragment count) travels in every slice,
// counts in the CRC, and one out of range or slices that disagree on it are refused.
TEST(GroupState, ExchangeSchedulesComeBackInEverySliceAndBadOnesAreRefused) {
  GroupState sent = AState(true);
  sent.schedules = {{.period = 8, .from = 24, .fragments = 2},
                    {.period = 8, .from = -4, .fragments = 2}};
  GroupState without = sent;
  without.schedules.clear();
  EXPECT_NE(GroupStateCrc(sent), GroupStateCrc(without));
  GroupState other_count = sent;
  other_count.schedules[1].fragments = 1;
  EXPECT_NE(GroupStateCrc(sent), GroupStateCrc(other_count));
  std::vector<StateSlice> slices;
  for (uint32_t k = 0; k < 2; ++k) {
    auto bundle = GroupStateToBundle(Published(sent), "run", 2, k, 2);
    ASSERT_THAT(bundle, IsOk());
    auto got = FromBundle(*bundle, "run", 4, k, 2);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->schedules, sent.schedules);
    slices.push_back(*std::move(got));
  }
  auto whole = JoinStateSlices(slices, 4, /*one_state=*/true);
  ASSERT_THAT(whole, IsOk());
  EXPECT_EQ(whole->schedules, sent.schedules);
  slices[1].schedules[0].period = 4;
  EXPECT_THAT(JoinStateSlices(slices, 4, false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("other exchange schedules")));

  auto bundle = ToBundle(sent);
  ASSERT_THAT(bundle, IsOk());
  for (const auto& [period, from] :
       std::vector<std::pair<uint32_t, int64_t>>{{0, 0},
                                                 {kMaxLocalSteps + 1, 0},
                                                 {8, -int64_t{kMaxLocalSteps} - 1},
                                                 {8, (int64_t{1} << 62) + 1}}) {
    v1::TensorBundle bad = *bundle;
    bad.mutable_schedules(0)->set_period(period);
    bad.mutable_schedules(0)->set_from(from);
    EXPECT_THAT(FromBundle(bad).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("schedule")))
        << period << " from " << from;
  }
  v1::TensorBundle too_cut = *bundle;
  too_cut.mutable_schedules(0)->set_fragments(kMaxFragments + 1);
  EXPECT_THAT(FromBundle(too_cut).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1025 fragments")));
  v1::TensorBundle many = *bundle;
  for (int i = 0; i < kMaxStateSchedules; ++i) *many.add_schedules() = bundle->schedules(0);
  EXPECT_THAT(FromBundle(many).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("schedules")));
}

TEST(GroupState, ASliceOtherThanTheOneAskedForOrNoSliceAtAllIsRefused) {
  auto bundle = ToBundle(AState(true), 1, 2);
  ASSERT_THAT(bundle, IsOk());
  EXPECT_THAT(FromBundle(*bundle, "run", 4, 1, 2), IsOk());
  EXPECT_THAT(FromBundle(*bundle, "run", 4, 0, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("asked for slice 0 of 2")));
  EXPECT_THAT(FromBundle(*bundle, "run", 4, 1, 3).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(FromBundle(*bundle).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::TensorBundle far = *bundle;
  far.set_buckets(1u << 31);
  EXPECT_THAT(FromBundle(far, "run", 4, 1, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Slices that are not slices: past the count, more than 64, more than one a value.
  EXPECT_THAT(ToBundle(AState(true), 2, 2).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ToBundle(AState(true), 0, 65).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ToBundle(AState(true), 0, 5).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ToBundle(AState(true), 0, 0).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  // A truncated slice payload.
  v1::TensorBundle cut = *bundle;
  std::string* payload = cut.mutable_tensors(0)->mutable_tensor()->mutable_payload();
  payload->resize(payload->size() - 3);
  EXPECT_FALSE(FromBundle(cut, "run", 4, 1, 2).ok());
}

// A state is made only when asked for, and answers every ask at or before its step.
TEST(StateShare, PublishesOnlyWhatIsAskedForAndAnswersEveryEarlierAsk) {
  StateShare share;
  EXPECT_FALSE(share.Wanted(100));
  EXPECT_THAT(share.Get(7).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(share.Get(5).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(share.Wanted(4));
  EXPECT_TRUE(share.Wanted(5));
  auto six = std::make_shared<PublishedState>();
  six->state.step = 6;
  share.Publish(six);
  EXPECT_FALSE(share.Wanted(6));
  auto got = share.Get(6);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ((*got)->state.step, 6);
  EXPECT_THAT(share.Get(5), IsOk());
  EXPECT_THAT(share.Get(7).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(share.Wanted(7));
}

// The θ a split group settles on: the one most workers of the round held; between as many, the
// one the lowest id held. Only the workers that did not hold it are told to take it again, from
// its holders.
TEST(GroupMajority, TheWorkersNotHoldingTheMostHeldModelTakeItFromItsHolders) {
  // Three of four hold 7; worker 3 holds 9.
  const std::map<int, uint32_t> three = {{0, 7}, {1, 7}, {2, 7}};
  std::optional<GroupMajority> take = MajorityElsewhere(3, 9, three);
  ASSERT_TRUE(take.has_value());
  EXPECT_EQ(take->holders, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(take->count, 3);
  EXPECT_EQ(take->ours, 1);
  EXPECT_FALSE(MajorityElsewhere(0, 7, {{1, 7}, {2, 7}, {3, 9}}).has_value());
  // Two against two: the side of worker 0 keeps its model, the other takes it.
  EXPECT_FALSE(MajorityElsewhere(0, 7, {{1, 9}, {2, 7}, {3, 9}}).has_value());
  take = MajorityElsewhere(1, 9, {{0, 7}, {2, 7}, {3, 9}});
  ASSERT_TRUE(take.has_value());
  EXPECT_EQ(take->holders, (std::vector<int>{0, 2}));
  EXPECT_EQ(take->ours, 2);
  // Nothing heard, or only agreement: nothing to take. Its own id among the senders is ignored.
  EXPECT_FALSE(MajorityElsewhere(2, 5, {}).has_value());
  EXPECT_FALSE(MajorityElsewhere(2, 5, {{0, 5}, {2, 6}}).has_value());
}

}  // namespace
}  // namespace tern
