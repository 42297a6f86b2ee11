#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "common/rng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cpu/stochastic_test_util.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

std::vector<float> WideRangeInput() {
  auto x = testing::Gaussian(400, 91);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 60) - 30);
  x[0] = 0x1p-140f;  // subnormal
  x[1] = -0x1p-149f;
  x[2] = 0.0f;
  x[3] = 1.5f * 0x1p100f;
  return x;
}

TEST(NaturalCodec, IsUnbiasedAndRoundsToANeighbouringPowerOfTwo) {
  auto codec = NewBuiltinCodecRegistry()->Create("natural");
  ASSERT_THAT(codec, IsOk());
  const auto x = WideRangeInput();
  const int trials = 4000;
  const auto m = testing::DecodeMoments(**codec, x, trials);
  testing::ExpectUnbiased(m, x, trials);
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(x, {}, &enc), IsOk());
  EXPECT_EQ(enc.payload.size(), x.size() + (x.size() + 7) / 8);  // 9 bits per value
  std::vector<float> y(x.size());
  ASSERT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)), IsOk());
  for (size_t i = 3; i < x.size(); ++i) {
    if (x[i] == 0) continue;
    int e;
    std::frexp(y[i], &e);
    ASSERT_EQ(std::fabs(y[i]), std::ldexp(1.0f, e - 1)) << "not a power of two";
    const float lo = std::ldexp(1.0f, std::ilogb(x[i]));
    ASSERT_TRUE(std::fabs(y[i]) == lo || std::fabs(y[i]) == 2 * lo) << x[i] << " -> " << y[i];
    ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i]));
  }
}

// Every code and sign bit is the documented draw (docs/wire-format.md), whichever path made it:
// ctest reruns this under TERN_SIMD=avx2 and none. Sizes end in a 16-multiple block (SIMD) and in
// a ragged one (scalar).
TEST(NaturalCodec, CodesFollowTheDocumentedDraws) {
  auto codec = NewBuiltinCodecRegistry()->Create("natural");
  ASSERT_THAT(codec, IsOk());
  for (size_t n : {size_t{4096 + 32}, size_t{2 * 4096 + 53}}) {
    auto x = testing::Gaussian(n, 74);
    x[1] = 0.0f;
    x[2] = -0.0f;
    x[3] = std::numeric_limits<float>::denorm_min() * 77;
    x[4] = -std::numeric_limits<float>::max();
    x[5] = 1.0f;  // mantissa 0: never rounds up
    EncodedTensor e;
    EncodeOptions o;
    o.seed = 91;
    ASSERT_THAT((*codec)->Encode(x, o, &e), IsOk());
    const RngKey key = MakeRngKey(o.seed);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = std::bit_cast<uint32_t>(x[i]);
      const uint32_t ex = (bits >> 23) & 0xff, mant = bits & 0x7fffff;
      const uint32_t up = ((Random32Lo(key, static_cast<uint32_t>(i)) >> 9) < mant) & (ex < 254);
      ASSERT_EQ(static_cast<uint8_t>(e.payload[i]), ex + up) << "element " << i;
      const int sign = (static_cast<uint8_t>(e.payload[n + i / 8]) >> (i % 8)) & 1;
      ASSERT_EQ(sign, static_cast<int>(bits >> 31)) << "element " << i;
    }
  }
}

TEST(NaturalCodec, SecondMomentGrowsByAtMostNineEighths) {
  auto codec = NewBuiltinCodecRegistry()->Create("natural");
  ASSERT_THAT(codec, IsOk());
  // 1.5 * 2^e is where the ratio peaks at exactly 9/8.
  std::vector<float> x = testing::Gaussian(200, 92);
  x[0] = 1.5f;
  x[1] = -1.5f * 0x1p-10f;
  const int trials = 20000;
  const auto m = testing::DecodeMoments(**codec, x, trials);
  for (size_t i = 0; i < x.size(); ++i) {
    // C(x) is lo or 2lo (lo = 2^floor(log2|x|)) with P(2lo) = p = |x|/lo - 1, so
    // E[C^2] = lo^2 (1 + 3p) <= (9/8) x^2 (equality at p = 1/2). Check the measured second moment
    // against that value (5 standard errors of the two-point distribution) and the bound itself.
    const double ax = std::fabs(double(x[i]));
    const double lo = std::ldexp(1.0, std::ilogb(ax));
    const double p = ax / lo - 1;
    const double expected = lo * lo * (1 + 3 * p);
    const double se = 3 * lo * lo * std::sqrt(p * (1 - p) / trials);
    ASSERT_NEAR(m.second[i], expected, 5 * se + 1e-9 * expected) << "x = " << x[i];
    ASSERT_LE(expected, 9.0 / 8 * ax * ax * (1 + 1e-6)) << "x = " << x[i];
  }
}

TEST(NaturalCodec, RejectsNonFiniteInputAndCode255) {
  auto codec = NewBuiltinCodecRegistry()->Create("natural");
  ASSERT_THAT(codec, IsOk());
  EncodedTensor enc;
  EXPECT_THAT((*codec)->Encode(std::vector<float>{1.0f, INFINITY}, {}, &enc),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT((*codec)->Encode(std::vector<float>{1.0f, 2.0f}, {}, &enc), IsOk());
  enc.payload[1] = static_cast<char>(0xff);
  std::vector<float> y(2);
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(NaturalDither, IsUnbiasedAndCostsBitWidthPlusOneBits) {
  auto codec = NewBuiltinCodecRegistry()->Create("natural-dither:levels=6");
  ASSERT_THAT(codec, IsOk());
  const auto x = testing::Gaussian(300, 93);
  const int trials = 4000;
  const auto m = testing::DecodeMoments(**codec, x, trials);
  testing::ExpectUnbiased(m, x, trials);
  // 6 levels -> 3-bit code + sign = 4 bits, plus the 1-byte header and one scale.
  EXPECT_NEAR(m.mean_bits, 4.0 * x.size() + 8 + 32, 8);
}

TEST(NaturalDither, RejectsLevelsAboveS) {
  auto codec = NewBuiltinCodecRegistry()->Create("natural-dither:levels=5");
  ASSERT_THAT(codec, IsOk());
  EncodedTensor enc;
  ASSERT_THAT((*codec)->Encode(std::vector<float>{1.0f, 0.5f}, {}, &enc), IsOk());
  enc.payload[1] = static_cast<char>(0x07);  // code 7 > 5 in the first 3-bit field
  std::vector<float> y(2);
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(enc), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern
