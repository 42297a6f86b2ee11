#include <algorithm>
#include <cmath>
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
using ::testing::HasSubstr;

TEST(TernGrad, IsUnbiasedWithoutClippingInBothPackings) {
  auto registry = NewBuiltinCodecRegistry();
  for (const char* spec : {"terngrad:clip=0", "terngrad:clip=0,pack=base3"}) {
    auto codec = registry->Create(spec);
    ASSERT_THAT(codec, IsOk());
    const auto x = testing::Gaussian(301, 61);
    const int trials = 4000;
    const auto m = testing::DecodeMoments(**codec, x, trials);
    testing::ExpectUnbiased(m, x, trials);
  }
}

TEST(TernGrad, ValuesAreZeroOrPlusMinusTheScaleAndPackingsAgree) {
  auto registry = NewBuiltinCodecRegistry();
  auto two = registry->Create("terngrad");
  auto three = registry->Create("terngrad:pack=base3");
  ASSERT_THAT(two, IsOk());
  ASSERT_THAT(three, IsOk());
  const auto x = testing::Gaussian(10001, 62);
  EncodedTensor a, b;
  EncodeOptions o;
  o.seed = 5;
  ASSERT_THAT((*two)->Encode(x, o, &a), IsOk());
  ASSERT_THAT((*three)->Encode(x, o, &b), IsOk());
  EXPECT_EQ(a.payload.size(), 1 + (x.size() + 3) / 4);  // 2 bits per value
  EXPECT_EQ(b.payload.size(), 1 + (x.size() + 4) / 5);  // 1.6 bits per value
  std::vector<float> ya(x.size()), yb(x.size());
  ASSERT_THAT((*two)->Decode(EncodedView::Of(a), absl::MakeSpan(ya)), IsOk());
  ASSERT_THAT((*three)->Decode(EncodedView::Of(b), absl::MakeSpan(yb)), IsOk());
  EXPECT_EQ(ya, yb);  // same seed, same ternary draws
  const float s = a.scales[0];
  // With clipping at 2.5 sigma the scale is the clip value, below max |x|.
  EXPECT_LT(s, 4.0f);
  for (float v : ya) ASSERT_TRUE(v == 0 || v == s || v == -s);
}

// The SIMD encoders (AVX2, AVX-512) must produce the codes docs/wire-format.md defines: digit 1
// (+s) or 2 (-s) where Uniform01Lo(key, i) < min(|x_i|, s) / s, else 0.
TEST(TernGrad, TwoBitCodesFollowTheDocumentedDraws) {
  auto codec = NewBuiltinCodecRegistry()->Create("terngrad");
  ASSERT_THAT(codec, IsOk());
  auto x = testing::Gaussian(2 * 4000 + 37, 64);  // two full SIMD blocks and a scalar tail
  x[3] = -0.0f;
  x[40] = 100.0f;  // far above the 2.5 sigma clip
  x[41] = -100.0f;
  EncodedTensor e;
  EncodeOptions o;
  o.seed = 77;
  ASSERT_THAT((*codec)->Encode(x, o, &e), IsOk());
  const float s = e.scales[0];
  const float inv = 1.0f / s;
  const RngKey key = MakeRngKey(o.seed);
  for (size_t i = 0; i < x.size(); ++i) {
    const float a = std::min(std::fabs(x[i]), s);
    const int keep = Uniform01Lo(key, static_cast<uint32_t>(i)) < a * inv;
    const int want = keep ? (x[i] < 0 ? 2 : 1) : 0;
    const int got = (e.payload[1 + i / 4] >> (2 * (i % 4))) & 3;
    ASSERT_EQ(got, want) << "element " << i << " x=" << x[i];
  }
}

// The same for base-3 packing: digit i is (byte i / 5) / 3^(i % 5) mod 3. The size ends with a
// block of 167 values: two 80-value SIMD groups and a 7-value scalar tail.
TEST(TernGrad, Base3DigitsFollowTheDocumentedDraws) {
  auto codec = NewBuiltinCodecRegistry()->Create("terngrad:pack=base3");
  ASSERT_THAT(codec, IsOk());
  auto x = testing::Gaussian(2 * 4000 + 167, 65);
  x[3] = -0.0f;
  x[40] = 100.0f;
  x[41] = -100.0f;
  EncodedTensor e;
  EncodeOptions o;
  o.seed = 78;
  ASSERT_THAT((*codec)->Encode(x, o, &e), IsOk());
  const float s = e.scales[0];
  const float inv = 1.0f / s;
  const RngKey key = MakeRngKey(o.seed);
  static constexpr int kPow3[5] = {1, 3, 9, 27, 81};
  for (size_t i = 0; i < x.size(); ++i) {
    const float a = std::min(std::fabs(x[i]), s);
    const int keep = Uniform01Lo(key, static_cast<uint32_t>(i)) < a * inv;
    const int want = keep ? (x[i] < 0 ? 2 : 1) : 0;
    const int byte = static_cast<uint8_t>(e.payload[1 + i / 5]);
    ASSERT_EQ(byte / kPow3[i % 5] % 3, want) << "element " << i << " x=" << x[i];
  }
}

TEST(TernGrad, RejectsInvalidCodesAndPadding) {
  auto codec = NewBuiltinCodecRegistry()->Create("terngrad");
  auto codec3 = NewBuiltinCodecRegistry()->Create("terngrad:pack=base3");
  ASSERT_THAT(codec, IsOk());
  ASSERT_THAT(codec3, IsOk());
  const auto x = testing::Gaussian(10, 63);
  EncodedTensor a, b;
  ASSERT_THAT((*codec)->Encode(x, {}, &a), IsOk());
  ASSERT_THAT((*codec3)->Encode(x, {}, &b), IsOk());
  std::vector<float> y(x.size());
  EncodedTensor bad = a;
  bad.payload[1] = static_cast<char>(0x03);
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("code 3")));
  bad = a;
  bad.payload.back() = static_cast<char>(0x40);  // value 12 of 10: padding
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("padding")));
  bad = b;
  bad.payload[1] = static_cast<char>(243);
  EXPECT_THAT((*codec3)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = a;
  bad.payload[0] = 9;
  EXPECT_THAT((*codec)->Decode(EncodedView::Of(bad), absl::MakeSpan(y)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("packing")));
}

}  // namespace
}  // namespace tern
