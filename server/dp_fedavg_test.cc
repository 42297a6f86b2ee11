// DP-FedAvg through the aggregator: an update over the clip is refused while the round goes on,
// every accepted one weighs the same and the mean is over the sampled clients, the privacy
// spent survives a restart, and the budget ends the run before the round that would pass it.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/aggregator.h"
#include "server/aggregator_fixture.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using testing_fixture::AggregatorTest;
using testing_fixture::TempPath;

const absl::Time kDpT0 = testing_fixture::kT0;

class DpFedAvgTest : public AggregatorTest {
 protected:
  DpFedAvgTest() {
    options_.dp.clip = 1.0;
    options_.dp.noise = 1e-4;  // small enough to check the mean to 1e-3
  }
};

TEST_F(DpFedAvgTest, AnUpdateOverTheClipIsRefusedAndTheMeanIsOverTheSampledClients) {
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  EXPECT_FLOAT_EQ(ValueOrFailure(a->Fetch(0, kDpT0)).task.dp_clip(), 1.0f);
  // Norm 3: refused, saying why; its client's turn is spent.
  EXPECT_THAT(Push(*a, 0, 1, 10, std::vector<float>(9, 1.0f)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("over the clip norm 1")));
  // Within the clip (norm 0.3 and 0.6), whatever weights they state: each counts once.
  EXPECT_THAT(Push(*a, 1, 1, 10, std::vector<float>(9, 0.1f)), IsOk());
  EXPECT_THAT(Push(*a, 2, 1, 1000, std::vector<float>(9, 0.2f)), IsOk());
  ASSERT_THAT(a->Tick(kDpT0 + absl::Seconds(11)), IsOk());  // the deadline: client 0 never will
  const v1::ServerStatus st = a->Status(kDpT0);
  ASSERT_EQ(st.round(), 1u);
  EXPECT_EQ(st.updates_refused(), 1u);
  // (0.1 + 0.2) / 3 sampled clients, not / 2 replies nor weighted by 10 and 1000.
  std::vector<float> want = x0_;
  for (float& v : want) v += 0.1f;
  EXPECT_THAT(ModelOf(*a), Pointwise(FloatNear(1e-3), want));
  EXPECT_GT(st.dp_epsilon(), 0);
  EXPECT_DOUBLE_EQ(st.dp_delta(), 1e-5);
}

TEST_F(DpFedAvgTest, ThePrivacySpentSurvivesARestart) {
  options_.dp.noise = 1.0;
  options_.checkpoint_path = TempPath("dp.ckpt");
  double spent = 0;
  {
    auto a = Start(3);
    ASSERT_NE(a, nullptr);
    for (uint32_t c = 0; c < 3; ++c) {
      EXPECT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, 0.1f)), IsOk());
    }
    ASSERT_THAT(a->Tick(kDpT0 + absl::Seconds(2)), IsOk());
    spent = a->Status(kDpT0).dp_epsilon();
    ASSERT_GT(spent, 0);
  }
  auto b = Aggregator::Create(options_, &registries_, kDpT0 + absl::Seconds(3));
  ASSERT_THAT(b, IsOk());
  EXPECT_DOUBLE_EQ((*b)->Status(kDpT0).dp_epsilon(), spent);
}

TEST_F(DpFedAvgTest, TheBudgetEndsTheRunBeforeTheRoundThatWouldPassIt) {
  // Every client every round (q = 1), z = 1: about 4.7 after one round and 7.1 after two.
  options_.dp.noise = 1.0;
  options_.dp.epsilon_budget = 6;
  auto a = Start(3);
  ASSERT_NE(a, nullptr);
  for (uint32_t c = 0; c < 3; ++c) {
    EXPECT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, 0.1f)), IsOk());
  }
  ASSERT_THAT(a->Tick(kDpT0 + absl::Seconds(2)), IsOk());
  const v1::ServerStatus st = a->Status(kDpT0);
  EXPECT_EQ(st.round(), 1u);
  EXPECT_TRUE(st.done());
  EXPECT_FALSE(st.round_open());
  EXPECT_LE(st.dp_epsilon(), 6);
  EXPECT_THAT(st.stop_reason(), HasSubstr("privacy budget"));
  EXPECT_EQ(ValueOrFailure(a->Fetch(0, kDpT0 + absl::Seconds(2))).task.kind(), v1::Task::DONE);
}

TEST_F(DpFedAvgTest, AnAdaptiveClipMovesWithTheClientsCountAndSurvivesARestart) {
  options_.dp.noise = 0;  // an exact count, to check the step
  options_.dp.clip_quantile = 0.5;
  options_.checkpoint_path = TempPath("dp-adaptive.ckpt");
  const auto push = [&](Aggregator& a, uint32_t client, int64_t round, std::optional<bool> within,
                        float value) {
    v1::UpdateInfo info;
    info.set_client_id(client);
    info.set_round(static_cast<uint64_t>(round));
    info.set_weight(1);
    v1::TensorBundle b = Update(std::vector<float>(9, value), round);
    if (within.has_value()) b.set_dp_within_clip(*within);
    return a.Push(info, b, 100, kDpT0);
  };
  double clip = 0;
  {
    auto a = Start(3);
    ASSERT_NE(a, nullptr);
    // An update that does not say is refused: the count needs every client's say.
    EXPECT_THAT(push(*a, 0, 1, std::nullopt, 0.1f),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("dp_within_clip")));
    EXPECT_THAT(push(*a, 1, 1, true, 0.1f), IsOk());
    EXPECT_THAT(push(*a, 2, 1, true, 0.1f), IsOk());
    ASSERT_THAT(a->Tick(kDpT0 + absl::Seconds(11)), IsOk());
    // (2 within - 0 out) / 3 sampled, centred: b = 0.5 + 1 / 3; clip 1 * exp(-0.2 / 3).
    clip = std::exp(-0.2 / 3);
    EXPECT_NEAR(a->Status(kDpT0).dp_clip(), clip, 1e-9);
    EXPECT_NEAR(ValueOrFailure(a->Fetch(1, kDpT0 + absl::Seconds(12))).task.dp_clip(), clip, 1e-6);
    // Round 2: one within so far when the server stops.
    EXPECT_THAT(push(*a, 1, 2, false, 0.1f), IsOk());
  }
  auto b = Aggregator::Create(options_, &registries_, kDpT0 + absl::Seconds(13));
  ASSERT_THAT(b, IsOk());
  EXPECT_NEAR((*b)->Status(kDpT0).dp_clip(), clip, 1e-9);
  EXPECT_THAT(push(**b, 2, 2, false, 0.1f), IsOk());
  EXPECT_THAT(push(**b, 0, 2, false, 0.1f), IsOk());
  ASSERT_THAT((*b)->Tick(kDpT0 + absl::Seconds(14)), IsOk());
  // The replayed update's "not within" counts with the two after the restart: b = 0.
  EXPECT_NEAR((*b)->Status(kDpT0).dp_clip(), clip * std::exp(0.1), 1e-9);
}

TEST_F(DpFedAvgTest, DpIsForFedAvgRoundsWithoutClientMemory) {
  const auto refused = [](const char* why) {
    return StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why));
  };
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.mode = "fedbuff"; }),
              refused("federated or local-sgd"));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.rule = "median"; }),
              refused("--rule=fedavg"));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.task.set_error_feedback(true); }),
              refused("--error_feedback"));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.dp.delta = 0; }), refused("--dp_delta"));
  // Adaptive clipping under noise with 3 clients a round: K / 20 is too little count noise.
  EXPECT_THAT(Normalized([](AggregatorOptions& o) {
                o.dp.noise = 1;
                o.dp.clip_quantile = 0.5;
              }),
              refused("count noise over z / 2"));
}

}  // namespace
}  // namespace tern
