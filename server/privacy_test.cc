// The RDP accountant of the subsampled Gaussian mechanism against published values (TensorFlow
// Privacy's rdp_accountant tests, computed there with multi-precision integration), and the
// central DP-FedAvg release: the noise's spread and the fixed denominator.
#include "server/privacy.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

TEST(SampledGaussianRdp, MatchesPublishedValuesAtIntegerAndFractionalOrders) {
  // compute_rdp(q=0.1, z=2, steps=10, order=5) = 0.07737.
  EXPECT_NEAR(10 * SampledGaussianRdp(0.1, 2, 5), 0.07737, 1e-5);
  // compute_rdp(q=0.01, z=2.5, steps=50, orders) at 1.5, 2.5, 5, 50 and 100.
  const std::vector<double> orders = {1.5, 2.5, 5, 50, 100};
  const std::vector<double> want = {0.00065, 0.001085, 0.00218075, 0.023846, 167.416307};
  for (size_t k = 0; k < orders.size(); ++k) {
    EXPECT_NEAR(50 * SampledGaussianRdp(0.01, 2.5, orders[k]), want[k],
                1e-5 * std::max(1.0, want[k]))
        << "order " << orders[k];
  }
}

TEST(SampledGaussianRdp, NoSamplingIsTheGaussianMechanismAndNoDataCostsNothing) {
  EXPECT_DOUBLE_EQ(SampledGaussianRdp(1, 10, 20), 0.1);  // alpha / (2 z^2)
  EXPECT_DOUBLE_EQ(SampledGaussianRdp(0, 10, 20), 0);
  // More noise or a smaller sample: less privacy spent.
  EXPECT_LT(SampledGaussianRdp(0.01, 2, 8), SampledGaussianRdp(0.01, 1, 8));
  EXPECT_LT(SampledGaussianRdp(0.01, 1, 8), SampledGaussianRdp(0.1, 1, 8));
}

TEST(EpsilonFromRdp, TakesTheBestOrderOfTheImprovedConversion) {
  // Constant RDP (pure DP) over orders 2..32 at delta 1e-5: the largest order, epsilon
  // 1.1 + log(1 - 1/32) - (log 1e-5 + log 32) / 31 = 1.32783806176.
  std::vector<double> orders, rdp;
  for (int a = 2; a <= 32; ++a) {
    orders.push_back(a);
    rdp.push_back(1.1);
  }
  double order = 0;
  EXPECT_NEAR(EpsilonFromRdp(orders, rdp, 1e-5, &order), 1.32783806176, 1e-9);
  EXPECT_EQ(order, 32);
}

TEST(RdpAccountant, EpsilonGrowsWithRoundsAndTheLookAheadIsTheNextRound) {
  RdpAccountant a;
  EXPECT_EQ(a.Epsilon(1e-5), 0);
  const double ahead = a.Epsilon(1e-5, 0.1, 1.0);
  a.Add(0.1, 1.0);
  EXPECT_DOUBLE_EQ(a.Epsilon(1e-5), ahead);
  double last = ahead;
  for (int r = 0; r < 20; ++r) {
    a.Add(0.1, 1.0);
    EXPECT_GT(a.Epsilon(1e-5), last);
    last = a.Epsilon(1e-5);
  }
  // A checkpoint's state comes back; one of another length is refused.
  RdpAccountant b;
  ASSERT_THAT(b.Restore(a.rdp()), IsOk());
  EXPECT_DOUBLE_EQ(b.Epsilon(1e-5), last);
  EXPECT_FALSE(b.Restore(std::vector<double>(3, 0.1)).ok());
}

TEST(DpFedAvg, TheReleaseAddsNoiseOfZTimesTheClipOverTheSampledClients) {
  DpFedAvg dp({.clip = 2.0, .noise = 1.5, .delta = 1e-5});
  EXPECT_TRUE(dp.WithinClip(2.0));
  EXPECT_TRUE(dp.WithinClip(2.001));  // an fp16 payload's rounding
  EXPECT_FALSE(dp.WithinClip(2.01));
  // 50 of 100 sampled clients replied with mean 1: the sum over the fixed denominator is 0.5,
  // plus noise of sd 1.5 * 2 / 100 = 0.03.
  std::vector<float> mean(200000, 1.0f);
  ASSERT_THAT(dp.Release(absl::MakeSpan(mean), 50, 100), IsOk());
  double sum = 0, sq = 0;
  for (float v : mean) {
    sum += v;
    sq += (v - 0.5) * (v - 0.5);
  }
  EXPECT_NEAR(sum / mean.size(), 0.5, 1e-3);
  EXPECT_NEAR(std::sqrt(sq / mean.size()), 0.03, 0.03 * 0.02);
  EXPECT_FALSE(dp.Release(absl::MakeSpan(mean), 0, 0).ok());
}

TEST(DpFedAvg, TheBudgetStopsTheRoundThatWouldPassIt) {
  DpFedAvg dp({.clip = 1.0, .noise = 1.0, .delta = 1e-5, .epsilon_budget = 2.0});
  int rounds = 0;
  double then = 0;
  while (!dp.WouldExceedBudget(0.01, &then) && rounds < 1000) {
    dp.Spend(0.01, 1.0);
    ++rounds;
  }
  EXPECT_GT(rounds, 0);
  EXPECT_LT(rounds, 1000);
  EXPECT_LE(dp.Epsilon(), 2.0);
  EXPECT_GT(then, 2.0);
  internal::DpState state;
  dp.Save(&state);
  DpFedAvg back({.clip = 1.0, .noise = 1.0, .delta = 1e-5, .epsilon_budget = 2.0});
  ASSERT_THAT(back.Restore(state), IsOk());
  EXPECT_DOUBLE_EQ(back.Epsilon(), dp.Epsilon());
}

TEST(AdaptiveClip, TheUpdateKeepsWhatTheCountLeavesOfZ) {
  // Andrew et al. 2021, Theorem 1: z^-2 = z_Delta^-2 + (2 sigma_b)^-2.
  const DpOptions o{.clip = 1, .noise = 1, .clip_quantile = 0.5, .clip_count_noise = 5};
  EXPECT_NEAR(UpdateNoiseMultiplier(o), 1 / std::sqrt(1 - 0.01), 1e-12);
  EXPECT_THAT(CheckDpOptions(o), IsOk());
  DpOptions fixed = o;
  fixed.clip_quantile = 0;
  EXPECT_DOUBLE_EQ(UpdateNoiseMultiplier(fixed), 1);
  // A count noise at or under z / 2 would spend all of z on the count.
  DpOptions loud = o;
  loud.clip_count_noise = 0.5;
  EXPECT_THAT(CheckDpOptions(loud),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("count noise over z / 2")));
  DpOptions bad = o;
  bad.clip_quantile = 1;
  EXPECT_FALSE(CheckDpOptions(bad).ok());
  bad = o;
  bad.clip_lr = 0;
  EXPECT_FALSE(CheckDpOptions(bad).ok());
}

TEST(AdaptiveClip, StepsGeometricallyAndAClientThatNeverRepliedCountsAsNeither) {
  // No noise: the count is exact.
  DpFedAvg dp({.clip = 2, .noise = 0, .clip_quantile = 0.5, .clip_lr = 0.2});
  for (int i = 0; i < 10; ++i) dp.CountWithin(true);
  double b = 0;
  ASSERT_THAT(dp.AdaptClip(10, &b), IsOk());
  EXPECT_DOUBLE_EQ(b, 1);
  EXPECT_NEAR(dp.clip(), 2 * std::exp(-0.1), 1e-12);  // all within: the clip shrinks
  for (int i = 0; i < 5; ++i) dp.CountWithin(true);   // 5 of 10 replied, all within
  ASSERT_THAT(dp.AdaptClip(10, &b), IsOk());
  EXPECT_DOUBLE_EQ(b, 0.75);
  dp.CountWithin(false);
  dp.CountWithin(false);
  dp.CountWithin(false, -1);  // one taken back (its log append failed)
  const double was = dp.clip();
  ASSERT_THAT(dp.AdaptClip(2, &b), IsOk());
  EXPECT_DOUBLE_EQ(b, 0.25);
  EXPECT_NEAR(dp.clip(), was * std::exp(0.05), 1e-12);  // under the quantile: it grows
  EXPECT_TRUE(dp.WithinClip(dp.clip()));
  EXPECT_FALSE(dp.WithinClip(dp.clip() * 1.01));
}

TEST(AdaptiveClip, FindsTheMedianNormUnderNoiseFromAFarStart) {
  // 100 clients a round with norms uniform on [0, 2] (median 1), z = 1 (sigma_b = 5): from a
  // clip 20x too small the clip settles near the median.
  DpFedAvg dp({.clip = 0.05, .noise = 1, .clip_quantile = 0.5, .clip_count_noise = 5});
  uint64_t state = 12345;
  const auto uniform = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) * 0x1.0p-53;
  };
  double late = 0;
  for (int round = 0; round < 200; ++round) {
    for (int c = 0; c < 100; ++c) dp.CountWithin(2 * uniform() <= dp.clip());
    ASSERT_THAT(dp.AdaptClip(100, nullptr), IsOk());
    if (round >= 150) late += dp.clip() / 50;
  }
  EXPECT_NEAR(late, 1.0, 0.15);
  // The clip and the open round's count are the checkpoint's.
  dp.CountWithin(true);
  internal::DpState state_saved;
  dp.Save(&state_saved);
  DpFedAvg back({.clip = 0.05, .noise = 1, .clip_quantile = 0.5, .clip_count_noise = 5});
  ASSERT_THAT(back.Restore(state_saved), IsOk());
  EXPECT_DOUBLE_EQ(back.clip(), dp.clip());
  EXPECT_DOUBLE_EQ(state_saved.round_within(), 0.5);
  state_saved.set_clip(-1);
  EXPECT_THAT(back.Restore(state_saved), StatusIs(absl::StatusCode::kDataLoss));
}

}  // namespace
}  // namespace tern
