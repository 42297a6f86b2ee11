#include "common/rng.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(Rng, SameKeyAndCounterGiveSameBitsAndStreamsDiffer) {
  const RngKey a = MakeRngKey(42), b = MakeRngKey(42), c = MakeRngKey(42, 1);
  int same_stream_diff = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(Random32(a, i), Random32(b, i));
    same_stream_diff += Random32(a, i) != Random32(c, i);
  }
  EXPECT_GT(same_stream_diff, 990);
}

TEST(Rng, LowCounterFormMatchesTheGeneralForm) {
  const RngKey key = MakeRngKey(7);
  for (uint32_t i = 0; i < 100000; i += 7) {
    ASSERT_EQ(Random32Lo(key, i), Random32(key, i));
    ASSERT_EQ(Uniform01Lo(key, i), Uniform01(key, i));
  }
}

TEST(Rng, UniformHasTheRightMomentsAndRange) {
  const RngKey key = MakeRngKey(9);
  const int n = 1 << 20;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const float u = Uniform01(key, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sum2 += double(u) * u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.002);
  EXPECT_NEAR(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 0.001);
}

TEST(Rng, NormalHasZeroMeanUnitVariance) {
  const RngKey key = MakeRngKey(11);
  const int n = 1 << 19;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = Normal(key, i);
    sum += z;
    sum2 += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.01);
}

}  // namespace
}  // namespace tern
