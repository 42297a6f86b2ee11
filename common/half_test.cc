#include "common/half.h"

#include <cmath>
#include <limits>

#include "common/rng.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

TEST(Half, EveryNonNanHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(Half, RoundsToNearestEvenAndSaturatesToInfinity) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // halfway to the next binade: rounds to inf
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);      // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-26f), 0x0000);             // below half of it
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
}

TEST(Half, MatchesCorrectRoundingOnRandomFloats) {
  const RngKey key = MakeRngKey(3);
  for (uint32_t i = 0; i < 200000; ++i) {
    const float f =
        std::ldexp(Uniform01(key, i) * 2 - 1, static_cast<int>(Random32(key, ~i) % 40) - 25);
    const float back = HalfToFloat(FloatToHalf(f));
    // The nearest half: no other half is closer.
    const uint16_t h = FloatToHalf(f);
    const float up = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float down = HalfToFloat(static_cast<uint16_t>(h - 1));
    if ((h & 0x7fff) != 0 && (h & 0x7fff) < 0x7bff) {
      ASSERT_LE(std::fabs(back - f), std::fabs(up - f)) << f;
      ASSERT_LE(std::fabs(back - f), std::fabs(down - f)) << f;
    }
  }
}

TEST(Bfloat16, RoundsToNearestEvenAndKeepsNan) {
  EXPECT_EQ(FloatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBfloat16(1.0f + 0x1p-8f), 0x3f80);      // tie -> even
  EXPECT_EQ(FloatToBfloat16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(Bfloat16ToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::nanf("")))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bfloat16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBfloat16(f), h);
    }
  }
}

}  // namespace
}  // namespace tern
