// The aggregator in FedBuff mode (server/buffered_rounds.h): updates of any version join one
// buffer, scaled by their staleness, and every K of them make one step; the buffer and the
// slots survive a restart.
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/aggregator_fixture.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;
using ::testing::ElementsAre;
using ::testing::Pointwise;
using testing_fixture::AggregatorTest;
const absl::Time kAt = testing_fixture::kT0;
const std::vector<float>& kFbX0 = testing_fixture::kX0;
using testing_fixture::TempPath;

std::vector<float> Filled(float v) { return std::vector<float>(kFbX0.size(), v); }

std::vector<float> Shifted(float by) {
  std::vector<float> x = kFbX0;
  for (float& v : x) v += by;
  return x;
}

class FedBuffTest : public AggregatorTest {
 protected:
  FedBuffTest() {
    options_.mode = "fedbuff";
    options_.policy.buffer = 2;
    options_.policy.concurrency = 0;
    options_.total_rounds = 10;
  }

  // Client `c`'s fetch: the version it trains on, -1 for WAIT.
  int64_t Version(Aggregator& a, uint32_t c) {
    const FetchResult f = ValueOrFailure(a.Fetch(c, kAt));
    return f.task.kind() == v1::Task::TRAIN ? static_cast<int64_t>(f.task.round()) : -1;
  }
};

TEST_F(FedBuffTest, EveryKUpdatesOfAnyVersionStepScaledByOneOverSqrtOnePlusStaleness) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  for (uint32_t c = 0; c < 3; ++c) ASSERT_EQ(Version(*a, c), 1);
  ASSERT_EQ(ValueOrFailure(Push(*a, 0, 1, 1.0, Filled(1))).verdict(), v1::UpdateReply::ACCEPTED);
  ASSERT_EQ(ValueOrFailure(Push(*a, 1, 1, 3.0, Filled(3))).verdict(), v1::UpdateReply::ACCEPTED);
  ASSERT_THAT(a->Tick(kAt), IsOk());
  // Version 1: the weighted mean (1 + 9) / 4.
  EXPECT_THAT(ModelOf(*a), Pointwise(::testing::FloatEq(), Shifted(2.5f)));
  ASSERT_EQ(Version(*a, 0), 2);
  // Client 2 still trains on version 1: its update joins version 2's buffer as 2 / sqrt(2).
  ASSERT_EQ(ValueOrFailure(Push(*a, 2, 1, 1.0, Filled(2))).verdict(),
            v1::UpdateReply::ACCEPTED_STALE);
  ASSERT_EQ(ValueOrFailure(Push(*a, 0, 2, 1.0, Filled(0))).verdict(), v1::UpdateReply::ACCEPTED);
  ASSERT_THAT(a->Tick(kAt), IsOk());
  EXPECT_THAT(ModelOf(*a),
              Pointwise(::testing::FloatNear(1e-5), Shifted(2.5f + std::sqrt(2.0f) / 2)));
  const v1::ServerStatus s = a->Status(kAt);
  EXPECT_EQ(s.round(), 2u);
  EXPECT_EQ(s.updates_accepted(), 3u);
  EXPECT_EQ(s.updates_stale(), 1u);
  EXPECT_THAT(s.staleness(), ElementsAre(3u, 1u));
}

TEST_F(FedBuffTest, AFastClientTrainsOnOneVersionAgainWithAnotherAttempt) {
  options_.policy.buffer = 3;
  options_.policy.concurrency = 1;
  auto a = Start(2);
  ASSERT_NE(a, nullptr);
  const FetchResult first = ValueOrFailure(a->Fetch(0, kAt));
  ASSERT_EQ(first.task.kind(), v1::Task::TRAIN);
  EXPECT_EQ(first.task.attempt(), 0u);
  ASSERT_THAT(Push(*a, 0, 1, 1.0, Filled(1)), IsOk());
  // Nobody else asked for the slot: client 0 trains on version 1 again.
  const FetchResult again = ValueOrFailure(a->Fetch(0, kAt));
  ASSERT_EQ(again.task.kind(), v1::Task::TRAIN);
  EXPECT_EQ(again.task.round(), 1u);
  EXPECT_EQ(again.task.attempt(), 1u);
  EXPECT_EQ(Version(*a, 1), -1);  // the one slot is taken
  EXPECT_THAT(Push(*a, 1, 1, 1.0, Filled(1)), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(FedBuffTest, ARestartKeepsTheBufferWithItsStalenessScalesAndTakesTheWorkInFlight) {
  options_.checkpoint_path = TempPath("fedbuff.ckpt");
  std::vector<float> expected;
  {
    auto a = Start(3);
    ASSERT_NE(a, nullptr);
    for (uint32_t c = 0; c < 3; ++c) ASSERT_EQ(Version(*a, c), 1);
    ASSERT_THAT(Push(*a, 0, 1, 1.0, Filled(1)), IsOk());
    ASSERT_THAT(Push(*a, 1, 1, 1.0, Filled(3)), IsOk());
    ASSERT_THAT(a->Tick(kAt), IsOk());
    ASSERT_EQ(Version(*a, 0), 2);
    // Logged, not in a snapshot yet: client 2's stale update (scaled by 1/sqrt(2)).
    ASSERT_EQ(ValueOrFailure(Push(*a, 2, 1, 1.0, Filled(4))).verdict(),
              v1::UpdateReply::ACCEPTED_STALE);
  }  // killed
  auto b = Aggregator::Create(options_, &registries_, kAt + absl::Minutes(1));
  ASSERT_THAT(b, IsOk());
  // Client 0 took its slot on version 2 after the last snapshot: its update is still taken;
  // client 2's is not taken twice.
  EXPECT_THAT(Push(**b, 2, 1, 1.0, Filled(4)), StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_EQ(ValueOrFailure(Push(**b, 0, 2, 1.0, Filled(0))).verdict(), v1::UpdateReply::ACCEPTED);
  ASSERT_THAT((*b)->Tick(kAt), IsOk());
  EXPECT_EQ((*b)->Status(kAt).round(), 2u);
  EXPECT_THAT(ModelOf(**b), Pointwise(::testing::FloatNear(1e-5), Shifted(2 + std::sqrt(2.0f))));
  EXPECT_THAT((*b)->Status(kAt).staleness(), ElementsAre(3u, 1u));
}

TEST_F(FedBuffTest, ARobustRuleTakesTheBufferAsItsUpdatesAndACompressedOneDecodes) {
  options_.rule = "median";
  options_.policy.buffer = 3;
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  for (uint32_t c = 0; c < 3; ++c) ASSERT_EQ(Version(*a, c), 1);
  v1::UpdateInfo info;
  info.set_client_id(2);
  info.set_round(1);
  info.set_weight(1.0);
  ASSERT_THAT(a->Push(info, Update(Filled(2), 1, "fp16"), 100, kAt), IsOk());
  ASSERT_THAT(Push(*a, 0, 1, 1.0, Filled(1)), IsOk());
  ASSERT_THAT(Push(*a, 1, 1, 1.0, Filled(1000)), IsOk());  // a liar, outvoted
  ASSERT_THAT(a->Tick(kAt), IsOk());
  EXPECT_THAT(ModelOf(*a), Pointwise(::testing::FloatEq(), Shifted(2)));
}

TEST_F(FedBuffTest, RefusesABufferOfNoneAndAnUnknownStalenessFunction) {
  options_.policy.buffer = 0;
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kAt),
              StatusIs(absl::StatusCode::kInvalidArgument));
  options_.policy.buffer = 2;
  options_.staleness = "sqrt";
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kAt),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
