#include "server/accumulator.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;

std::unique_ptr<AggregationRule> Rule(const std::string& spec) {
  return ValueOrFailure(NewBuiltinAggregationRuleRegistry()->Create(spec));
}

// Every registered rule: what the accumulator gives at the close is what the rule gives over
// the same updates, also after the state went through a checkpoint halfway.
TEST(RoundAccumulator, EveryRuleAggregatesAsTheRuleDoesAcrossACheckpoint) {
  const size_t d = 64;
  std::vector<std::vector<float>> v;
  std::vector<double> w;
  for (int i = 0; i < 7; ++i) {
    v.push_back(testing::Gaussian(d, 40 + i));
    w.push_back(10.0 * (i + 1));
  }
  for (const std::string& name : NewBuiltinAggregationRuleRegistry()->Names()) {
    auto rule = Rule(name);
    RoundAccumulator acc(rule.get(), d);
    for (int i = 0; i < 4; ++i) ASSERT_THAT(acc.Add(i, v[i], w[i], 0.5, 32), IsOk()) << name;
    internal::RoundState saved;
    acc.Save(&saved);
    RoundAccumulator resumed(rule.get(), d);
    ASSERT_THAT(resumed.Restore(saved), IsOk()) << name;
    for (int i = 4; i < 7; ++i) ASSERT_THAT(resumed.Add(i, v[i], w[i], 0.5, 32), IsOk()) << name;
    EXPECT_EQ(resumed.count(), 7u);
    std::vector<float> got(d), want(d);
    ASSERT_TRUE(ValueOrFailure(resumed.Aggregate(absl::MakeSpan(got)))) << name;
    std::vector<ClientUpdate> updates;
    for (int i = 0; i < 7; ++i) updates.push_back({v[i], w[i]});
    ASSERT_THAT(rule->Aggregate(updates, absl::MakeSpan(want)), IsOk()) << name;
    for (size_t k = 0; k < d; ++k) EXPECT_NEAR(got[k], want[k], 1e-5f) << name << " " << k;
  }
}

TEST(RoundAccumulator, BadUpdatesChangeNothingAndAnEmptyRoundHasNoAggregate) {
  auto rule = Rule("fedavg");
  RoundAccumulator acc(rule.get(), 4);
  std::vector<float> out(4);
  EXPECT_FALSE(ValueOrFailure(acc.Aggregate(absl::MakeSpan(out))));
  EXPECT_THAT(acc.Add(0, std::vector<float>(3), 1, 0, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(acc.Add(0, std::vector<float>(4), 0, 0, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(acc.Add(0, std::vector<float>(4), std::nan(""), 0, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(acc.count(), 0u);
  ASSERT_THAT(acc.Add(0, std::vector<float>{1, 2, 3, 4}, 1, 2.0, 16), IsOk());
  ASSERT_THAT(acc.Add(1, std::vector<float>{3, 4, 5, 6}, 3, 4.0, 48), IsOk());
  ASSERT_TRUE(ValueOrFailure(acc.Aggregate(absl::MakeSpan(out))));
  EXPECT_THAT(out, ::testing::ElementsAre(2.5f, 3.5f, 4.5f, 5.5f));
  EXPECT_DOUBLE_EQ(acc.mean_loss(), 3.5);
  EXPECT_DOUBLE_EQ(acc.mean_batch(), 32);
  acc.Reset();
  EXPECT_EQ(acc.count(), 0u);
  EXPECT_FALSE(ValueOrFailure(acc.Aggregate(absl::MakeSpan(out))));
}

TEST(RoundAccumulator, TooFewUpdatesForKrumIsNoAggregateNotAnError) {
  auto rule = Rule("krum:f=2");
  RoundAccumulator acc(rule.get(), 3);
  ASSERT_THAT(acc.Add(0, std::vector<float>(3, 1.0f), 1, 0, 0), IsOk());
  std::vector<float> out(3);
  EXPECT_FALSE(ValueOrFailure(acc.Aggregate(absl::MakeSpan(out))));
}

TEST(RoundAccumulator, AStateThatDoesNotFitTheModelOrRuleIsDataLoss) {
  auto fedavg = Rule("fedavg");
  auto median = Rule("median");
  RoundAccumulator streaming(fedavg.get(), 4);
  ASSERT_THAT(streaming.Add(0, std::vector<float>(4, 1.0f), 1, 0, 0), IsOk());
  internal::RoundState sum;
  streaming.Save(&sum);
  RoundAccumulator smaller(fedavg.get(), 3);
  EXPECT_THAT(smaller.Restore(sum), StatusIs(absl::StatusCode::kDataLoss));
  RoundAccumulator keeper(median.get(), 4);
  EXPECT_THAT(keeper.Restore(sum), StatusIs(absl::StatusCode::kDataLoss));
  internal::RoundState bad_weight = sum;
  bad_weight.set_total_weight(0);
  EXPECT_THAT(streaming.Restore(bad_weight), StatusIs(absl::StatusCode::kDataLoss));
}

}  // namespace
}  // namespace tern
