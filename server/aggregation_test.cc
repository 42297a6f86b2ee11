#include "server/aggregation.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

std::vector<ClientUpdate> Spans(const std::vector<std::vector<float>>& v,
                                std::vector<double> w = {}) {
  std::vector<ClientUpdate> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back({v[i], w.empty() ? 1.0 : w[i]});
  return out;
}

std::vector<float> Aggregate(const std::string& spec, const std::vector<std::vector<float>>& v,
                             std::vector<double> w = {}) {
  auto rule = NewBuiltinAggregationRuleRegistry()->Create(spec);
  EXPECT_THAT(rule, IsOk());
  std::vector<float> out(v[0].size());
  if (!rule.ok()) return out;
  EXPECT_THAT((*rule)->Aggregate(Spans(v, w), absl::MakeSpan(out)), IsOk()) << spec;
  return out;
}

// Every registered rule: its default spec names it and recreates it, and the aggregate of
// identical updates is that update (majority vote's: its signs).
TEST(AggregationCoverage, EveryRegisteredRuleKeepsIdenticalUpdatesAndItsSpec) {
  auto rules = NewBuiltinAggregationRuleRegistry();
  ASSERT_FALSE(rules->Names().empty());
  const std::vector<float> u = testing::Gaussian(16, 3);
  for (const std::string& name : rules->Names()) {
    auto rule = rules->Create(name);
    ASSERT_THAT(rule, IsOk()) << name;
    const std::string spec = (*rule)->Spec();
    EXPECT_EQ(spec.substr(0, spec.find(':')), name);
    auto again = rules->Create(spec);
    ASSERT_THAT(again, IsOk()) << spec;
    EXPECT_EQ((*again)->Spec(), spec);
    std::vector<float> out(u.size());
    ASSERT_THAT(
        (*rule)->Aggregate(Spans(std::vector<std::vector<float>>(9, u)), absl::MakeSpan(out)),
        IsOk())
        << name;
    for (size_t k = 0; k < u.size(); ++k) {
      const float want = name == "majority-vote" ? std::copysign(1.0f, u[k]) : u[k];
      EXPECT_FLOAT_EQ(out[k], want) << name << " " << k;
    }
  }
  EXPECT_THAT(rules->Create("mean"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Aggregation, FedAvgIsTheSampleWeightedMean) {
  auto out = Aggregate("fedavg", {{1, 10}, {4, 40}}, {1, 3});
  EXPECT_FLOAT_EQ(out[0], (1 * 1 + 3 * 4) / 4.0f);
  EXPECT_FLOAT_EQ(out[1], (1 * 10 + 3 * 40) / 4.0f);
}

// 7 honest clients near `center`, 2 Byzantine ones sending huge values: the robust rules stay
// within the honest clients' range; FedAvg does not.
TEST(Aggregation, RobustRulesIgnoreAMinorityOfByzantineUpdates) {
  const size_t d = 64;
  std::vector<std::vector<float>> v;
  std::vector<float> lo(d, 1e9f), hi(d, -1e9f);
  for (int i = 0; i < 7; ++i) {
    v.push_back(testing::Gaussian(d, 10 + i));
    for (size_t k = 0; k < d; ++k) {
      lo[k] = std::min(lo[k], v.back()[k]);
      hi[k] = std::max(hi[k], v.back()[k]);
    }
  }
  v.push_back(std::vector<float>(d, 1e6f));
  v.push_back(std::vector<float>(d, -3e6f));
  for (const std::string spec :
       {"median", "trimmed-mean:trim=0.25", "krum:f=2", "multi-krum:f=2,m=3"}) {
    auto out = Aggregate(spec, v);
    for (size_t k = 0; k < d; ++k) {
      EXPECT_GE(out[k], lo[k] - 1e-5f) << spec << " coordinate " << k;
      EXPECT_LE(out[k], hi[k] + 1e-5f) << spec << " coordinate " << k;
    }
  }
  auto avg = Aggregate("fedavg", v);
  EXPECT_LT(avg[0], -1e5f);
}

TEST(Aggregation, KrumPicksAnUpdateOfTheHonestCluster) {
  std::vector<std::vector<float>> v = {{0, 0},         {0.1f, 0}, {0, 0.1f}, {0.1f, 0.1f},
                                       {0.05f, 0.05f}, {50, 50},  {-40, 60}};
  auto out = Aggregate("krum:f=2", v);
  EXPECT_LT(std::abs(out[0]) + std::abs(out[1]), 0.3f);
}

TEST(Aggregation, MedianOfOddAndEvenCounts) {
  EXPECT_FLOAT_EQ(Aggregate("median", {{1}, {9}, {3}})[0], 3.0f);
  EXPECT_FLOAT_EQ(Aggregate("median", {{1}, {9}, {3}, {5}})[0], 4.0f);
}

TEST(Aggregation, ClippingBoundsEveryUpdatesNorm) {
  // Two updates of norm 5 and 50 clipped to 5: FedAvg of (3,4) and (30,40)*0.1 = (3,4).
  auto out = Aggregate("fedavg:clip=5", {{3, 4}, {30, 40}});
  EXPECT_NEAR(out[0], 3.0f, 1e-5);
  EXPECT_NEAR(out[1], 4.0f, 1e-5);
  std::vector<float> v = {30, 40};
  EXPECT_NEAR(ClipToNorm(absl::MakeSpan(v), 5), 0.1, 1e-12);
  std::vector<float> small = {0.3f, 0.4f};
  EXPECT_EQ(ClipToNorm(absl::MakeSpan(small), 5), 1.0);
}

TEST(Aggregation, MajorityVoteCountsSignsNotMagnitudes) {
  // Two small positives outvote one large negative; each coordinate on its own.
  auto out = Aggregate("majority-vote", {{0.01f, -1, 3}, {0.02f, -2, -1}, {-100, 5, -2}});
  EXPECT_THAT(out, ::testing::ElementsAre(1.0f, -1.0f, -1.0f));
}

TEST(Aggregation, MajorityVoteBreaksATiedCountByTheSumAndGivesZeroOnlyForAllZeros) {
  auto out = Aggregate("majority-vote", {{1, -1, 0, 0}, {-3, 2, 0, 4}, {0, 0, 0, -4}});
  // 1 vs 3 (sum -2), -1 vs 2 (sum 1), nothing, 4 vs -4 (sum 0: no side).
  EXPECT_THAT(out, ::testing::ElementsAre(-1.0f, 1.0f, 0.0f, 0.0f));
  // Weights (sample counts) do not buy votes.
  EXPECT_THAT(Aggregate("majority-vote", {{1}, {-1}, {-1}}, {100, 1, 1}),
              ::testing::ElementsAre(-1.0f));
}

TEST(Aggregation, MajorityVoteHoldsAgainstAMinorityThatFlipsItsSigns) {
  // Ten workers whose gradients agree in sign on 80% of each coordinate's draws; two of them
  // send every sign flipped. The vote still matches the honest sign almost everywhere, where
  // the mean of the honest and flipped updates loses it far more often.
  const size_t d = 4000;
  const std::vector<float> truth = testing::Gaussian(d, 7);
  std::vector<std::vector<float>> honest, attacked;
  for (int w = 0; w < 10; ++w) {
    std::vector<float> noise = testing::Gaussian(d, 100 + w);
    std::vector<float> g(d);
    for (size_t k = 0; k < d; ++k) g[k] = truth[k] + 0.8f * noise[k];
    honest.push_back(g);
    if (w < 2) {
      for (float& v : g) v = -5 * v;  // flipped, and louder
    }
    attacked.push_back(g);
  }
  const auto agree = [&](const std::vector<float>& out) {
    size_t n = 0;
    for (size_t k = 0; k < d; ++k) n += (out[k] > 0) == (truth[k] > 0) ? 1 : 0;
    return static_cast<double>(n) / d;
  };
  const double clean = agree(Aggregate("majority-vote", honest));
  const double voted = agree(Aggregate("majority-vote", attacked));
  const double mean = agree(Aggregate("fedavg", attacked));
  EXPECT_GT(clean, 0.87);
  EXPECT_GT(voted, 0.8);
  EXPECT_LT(mean, 0.5);
}

TEST(Aggregation, BadSpecsAndInputsAreErrors) {
  EXPECT_FALSE(NewBuiltinAggregationRuleRegistry()->Create("mean").ok());
  EXPECT_FALSE(NewBuiltinAggregationRuleRegistry()->Create("trimmed-mean:trim=0.6").ok());
  EXPECT_FALSE(NewBuiltinAggregationRuleRegistry()->Create("krum:f=-1").ok());
  EXPECT_FALSE(NewBuiltinAggregationRuleRegistry()->Create("median:bogus=1").ok());
  EXPECT_EQ((*NewBuiltinAggregationRuleRegistry()->Create("multi-krum:f=1,m=4,clip=2"))->Spec(),
            "multi-krum:f=1,m=4,clip=2");
  auto krum = NewBuiltinAggregationRuleRegistry()->Create("krum:f=2");
  std::vector<float> out(2);
  std::vector<std::vector<float>> six(6, std::vector<float>(2, 1.0f));
  EXPECT_THAT((*krum)->Aggregate(Spans(six), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument));  // needs 2f + 3 = 7
  auto avg = NewBuiltinAggregationRuleRegistry()->Create("fedavg");
  EXPECT_THAT((*avg)->Aggregate({}, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<std::vector<float>> wrong = {{1, 2, 3}};
  EXPECT_THAT((*avg)->Aggregate(Spans(wrong), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<std::vector<float>> two = {{1, 2}, {3, 4}};
  EXPECT_THAT((*avg)->Aggregate(Spans(two, {0, 0}), absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
