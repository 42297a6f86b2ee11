#include "worker/state_share.h"

#include <cmath>
#include <limits>

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

TEST(GroupState, ComesBackAsItWentWithAndWithoutMomentum) {
  auto codecs = NewBuiltinCodecRegistry();
  for (bool momentum : {true, false}) {
    const GroupState sent = AState(momentum);
    auto bundle = GroupStateToBundle(sent, "run", 2);
    ASSERT_THAT(bundle, IsOk());
    EXPECT_EQ(bundle->round(), 41u);
    auto got = GroupStateFromBundle(*bundle, "run", 4, *codecs);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->step, 41);
    EXPECT_EQ(got->theta, sent.theta);
    EXPECT_EQ(got->momentum, sent.momentum);
  }
}

TEST(GroupState, ARunModelOrPartThatDoesNotFitIsRefused) {
  auto codecs = NewBuiltinCodecRegistry();
  auto bundle = GroupStateToBundle(AState(true), "run", 2);
  ASSERT_THAT(bundle, IsOk());
  EXPECT_THAT(GroupStateFromBundle(*bundle, "other", 4, *codecs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("run 'run'")));
  EXPECT_THAT(GroupStateFromBundle(*bundle, "run", 5, *codecs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));  // another model's size
  v1::TensorBundle three = *bundle;
  *three.add_tensors() = bundle->tensors(0);
  EXPECT_THAT(GroupStateFromBundle(three, "run", 4, *codecs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 parts")));
  v1::TensorBundle renamed = *bundle;
  renamed.mutable_tensors(1)->set_name("m");
  EXPECT_THAT(GroupStateFromBundle(renamed, "run", 4, *codecs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  v1::TensorBundle far = *bundle;
  far.set_round(uint64_t{1} << 63);
  EXPECT_THAT(GroupStateFromBundle(far, "run", 4, *codecs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step")));
}

TEST(GroupState, ATruncatedOversizeOrNonFinitePayloadIsRefused) {
  auto codecs = NewBuiltinCodecRegistry();
  auto bundle = GroupStateToBundle(AState(true), "run", 2);
  ASSERT_THAT(bundle, IsOk());
  v1::TensorBundle cut = *bundle;
  std::string* payload = cut.mutable_tensors(0)->mutable_tensor()->mutable_payload();
  payload->resize(payload->size() - 1);
  EXPECT_FALSE(GroupStateFromBundle(cut, "run", 4, *codecs).ok());
  v1::TensorBundle longer = *bundle;
  longer.mutable_tensors(1)->mutable_tensor()->mutable_payload()->append(4, '\0');
  EXPECT_FALSE(GroupStateFromBundle(longer, "run", 4, *codecs).ok());
  GroupState nan = AState(false);
  nan.theta[2] = std::numeric_limits<float>::quiet_NaN();
  auto poisoned = GroupStateToBundle(nan, "run", 2);
  ASSERT_THAT(poisoned, IsOk());
  EXPECT_THAT(GroupStateFromBundle(*poisoned, "run", 4, *codecs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NaN")));
  GroupState odd = AState(true);
  odd.momentum.pop_back();
  EXPECT_FALSE(GroupStateToBundle(odd, "run", 2).ok());
}

// A state is made only when asked for, and answers every ask at or before its step.
TEST(StateShare, PublishesOnlyWhatIsAskedForAndAnswersEveryEarlierAsk) {
  StateShare share;
  EXPECT_FALSE(share.Wanted(100));
  EXPECT_THAT(share.Get(7).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(share.Get(5).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(share.Wanted(4));
  EXPECT_TRUE(share.Wanted(5));
  v1::TensorBundle b;
  b.set_round(6);
  share.Publish(std::make_shared<const v1::TensorBundle>(b));
  EXPECT_FALSE(share.Wanted(6));
  auto got = share.Get(6);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ((*got)->round(), 6u);
  EXPECT_THAT(share.Get(5), IsOk());
  EXPECT_THAT(share.Get(7).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(share.Wanted(7));
}

}  // namespace
}  // namespace tern
